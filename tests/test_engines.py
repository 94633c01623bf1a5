"""The engine interface (scoring/engines/__init__.py): an engine from outside the package, loaded
as `--engine module:Class`, records and is judged like the package's own; what is not an engine
is one line."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_engine import ASKED
from test_score import ROWS, failing, record, ref  # noqa: F401  (ref: a fixture)

import score
from scoring.trace import read_trace

REPO = Path(__file__).resolve().parents[1]


def test_a_plug_in_engine_records_and_is_judged(ref, model, tmp_path, capsys):  # noqa: F811
    path = tmp_path / "full.parquet"
    plugin = ("--engine", "plugin_engine:FullForward", "--model", model)
    assert record("--corpus", ref, *plugin, "--producer", "full", "--out", path) == 0
    trace = read_trace(path)
    settings = trace.meta["producers"]["full"]
    assert {k: settings[k] for k in ("engine", "dtype")} == {
        "engine": "full-forward",
        "dtype": "float32",
    }
    assert settings["run"]["engine"] == "plugin_engine:FullForward"
    assert set(trace.producers) == {"reference", "full"}
    capsys.readouterr()
    # one forward without a cache gives what prefill and decode through the cache give
    assert score.main(["judge", str(ref), "--candidate", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("PASS within KL")
    # the same engine run by the judge itself, its options through --set
    argv = ["judge", str(ref), *map(str, plugin), "--set", "dtype=float32"]
    assert score.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith(f"candidate --model {model}") and lines[-1].startswith("PASS")


def test_a_command_asks_the_engine_each_thing_once_before_any_forward(out, ref, model, tmp_path):  # noqa: F811
    """Its count of ids, its vocabulary, its context and describe(): however many checks read
    each (the top-k, the rows' tokenizer or the corpus's tokens against the model, every prompt
    the engine gives), record and judge ask it once, before the first forward (record.resolve).
    The context is asked by a record on rows without --context alone."""
    plugin = ["--engine", "plugin_engine:Counted", "--model", model]
    rows = ["--rows", out, "--split", "smoke", *ROWS, "--length", 4, "--tokenizer", model]
    commands = {
        "record --rows": (["record", *rows, "--out", tmp_path / "r.parquet", "--quiet"],
                          ["vocab_size", "vocabulary", "context", "describe"]),
        "record --corpus": (["record", "--corpus", ref, "--producer", "counted", "--out",
                             tmp_path / "c.parquet", "--quiet"],
                            ["vocab_size", "vocabulary", "describe"]),
        "judge --model": (["judge", ref], ["vocab_size", "vocabulary", "describe"]),
    }  # fmt: skip
    for command, (argv, asked) in commands.items():
        ASKED.clear()
        assert score.main([*map(str, argv), *map(str, plugin)]) == 0, command
        assert ASKED == [*asked, "forward"], command


@pytest.mark.parametrize(
    "engine, words",
    [
        ("warp", "--engine warp: not an engine (transformers, vllm, llama.cpp, openai, mlx,"),
        ("no_such_module:Engine", "cannot import no_such_module (is no_such_module on the"),
        ("plugin_engine:Nope", "plugin_engine has no Nope"),
        ("plugin_engine:NotAnEngine", "NotAnEngine is not an Engine"),
        ("json:loads", "loads is not an Engine"),
    ],
)
def test_what_is_not_an_engine_is_one_line(engine, words, ref, model, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "x.parquet"
    argv = ["--corpus", ref, "--engine", engine, "--model", model, "--producer", "x", "--out", out]
    failing(capsys, ["record", *argv], words)
    assert not out.exists()


def test_an_option_a_plug_in_does_not_take_is_one_line(ref, model, tmp_path, capsys):  # noqa: F811
    argv = ["--corpus", ref, "--engine", "plugin_engine:FullForward", "--model", model,
            "--set", "flavour=1", "--producer", "x", "--out", tmp_path / "x.parquet"]  # fmt: skip
    failing(capsys, ["record", *argv], "unexpected keyword argument 'flavour'")


def test_the_package_imports_with_the_base_install_alone():
    """score.py and every module but an engine's own need none of the score extra's packages (a
    vLLM environment has its own torch and transformers): blocked here, the imports still work."""
    code = (
        "import sys\n"
        "for name in ('torch', 'transformers', 'matplotlib', 'huggingface_hub', 'vllm',"
        " 'llama_cpp'):\n"
        "    sys.modules[name] = None\n"
        "import score, scoring.trace, scoring.rows, scoring.engines, scoring.engines.transformers\n"
        "import scoring.record, scoring.compare, scoring.report, scoring.judge\n"
    )
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert got.returncode == 0, got.stderr


def test_the_package_imports_from_a_wheel_installed_elsewhere(tmp_path):
    """`pip install .` (not editable) gives a package that imports from any directory: the
    builder's helpers it uses travel inside it (scoring/builder.py, a link to build.py, is
    written into the wheel as the file itself), and nothing of the checkout is needed."""
    import zipfile

    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "build.py"):
        (src / name).write_bytes((REPO / name).read_bytes())
    shutil.copytree(REPO / "scoring", src / "scoring", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    assert (src / "scoring" / "builder.py").is_symlink()
    got = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                          "-q", str(src), "-w", str(tmp_path / "wheel")],
                         capture_output=True, text=True)  # fmt: skip
    assert got.returncode == 0, got.stderr
    (wheel,) = (tmp_path / "wheel").glob("kern_prompts-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    assert (site / "scoring" / "builder.py").read_bytes() == (REPO / "build.py").read_bytes()
    code = (
        "import scoring, scoring.record, scoring.judge, scoring.paths, scoring.engines\n"
        f"assert scoring.__file__.startswith({str(site)!r}), scoring.__file__\n"
        "assert 'build' not in __import__('sys').modules\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(site)}
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=elsewhere, env=env)  # fmt: skip
    assert got.returncode == 0, got.stderr


def test_a_missing_optional_package_is_one_line_naming_its_extra(tmp_path):
    """`record --rows` where transformers is not installed (an environment with the llamacpp extra
    alone): the engine starts, the rows' tokenizer needs transformers, and that is one line naming
    the extra that installs it, not a traceback."""
    (tmp_path / "null_engine.py").write_text(
        "from scoring.engines import Engine\n"
        "class Null(Engine):\n"
        "    def __init__(self, model): pass\n"
        "    def describe(self): return {}\n"
        "    def sample(self, jobs, k, progress=lambda n: None): return iter(())\n"
    )
    code = ("import sys; sys.modules['transformers'] = None; import score; "
            "sys.exit(score.main(sys.argv[1:]))")  # fmt: skip
    (tmp_path / "rows").mkdir()
    argv = ["record", "--rows", tmp_path / "rows", "--engine", "null_engine:Null", "--model", "m",
            "--out", tmp_path / "x.parquet"]  # fmt: skip
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    got = subprocess.run([sys.executable, "-c", code, *map(str, argv)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert got.returncode == 1 and "Traceback" not in got.stderr, got.stderr
    assert got.stderr.splitlines() == ["error: cannot import transformers, which this command "
                                       "needs (pip install -e '.[score]')"]  # fmt: skip
