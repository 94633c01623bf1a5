"""vLLM at the engine boundary, for real in its own environment (.venv-vllm, as tests/test_vllm.py):
settings that contradict this engine's, or that vLLM would take and then run otherwise, are one
line each before anything is written; a prompt that does not fit vLLM's max_model_len is one line
that blames the length (vLLM would stop the request early, not refuse it); with --quiet, stderr
holds that line alone (docs/failures.md)."""

import subprocess
from pathlib import Path

import orjson
import pytest
from make_model import make_model
from test_score import ref  # noqa: F401  (a fixture: the byte tokenizer's corpus)
from test_vllm import python  # noqa: F401  (a fixture: vLLM's environment)

REPO = Path(__file__).resolve().parents[1]

# score.main on each argv in one process of vLLM's environment (vLLM imports once): the exit
# code and stderr of each, as JSON
MANY = """
import contextlib, io, sys, orjson
import score
out = []
for argv in orjson.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = score.main(argv)
    out.append([code, err.getvalue()])
print(orjson.dumps(out).decode())
"""


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """The tiny dense Qwen3 (float32 on vLLM's CPU backend), of the corpus's byte tokenizer."""
    return make_model(tmp_path_factory.mktemp("dense") / "model", "qwen3")


def many(python, argvs, timeout=600):  # noqa: F811
    argvs = [[str(a) for a in argv] for argv in argvs]
    got = subprocess.run([str(python), "-c", MANY, orjson.dumps(argvs).decode()], cwd=REPO,
                         capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert got.returncode == 0, got.stderr
    return orjson.loads(got.stdout.splitlines()[-1])


def test_settings_that_contradict_the_engine_are_one_line_each(python, dense, ref, tmp_path):  # noqa: F811
    out = tmp_path / "v.parquet"
    base = ["record", "--corpus", ref, "--engine", "vllm", "--model", dense, "--producer", "v",
            "--out", out, "--quiet"]  # fmt: skip
    cases = {
        ("--batch", "4", "--set", "max_num_seqs=1"): "--set max_num_seqs: set by --batch",
        ("--set", "max_logprobs=5"): "--set max_logprobs=5: this engine asks vLLM for 28 entries",
        ("--set", "dtype=float32"): "--set dtype: --engine vllm takes it as --dtype",
        ("--set", "batch=2"): "--set batch: --engine vllm takes it as --batch",
        ("--set", "k=3"): "--set k: set by the command",
        ("--chunk", "8"): "--engine vllm does not use --chunk",
        ("--kv-dtype", "bfloat16"): "--engine vllm does not use --kv-dtype",
        ("--set", "logprobs_mode=processed_logprobs"): "set by this engine, not by --set",
    }
    got = many(python, [base + list(extra) for extra in cases])
    for (extra, words), (code, err) in zip(cases.items(), got):
        lines = err.splitlines()
        assert code == 1 and len(lines) == 1 and words in lines[0], (extra, err)
    assert not out.exists()
    plot = many(python, [["judge", ref, "--candidate", ref, "--producer", "reference",
                          "--plot", tmp_path / "p.png"]])  # fmt: skip
    ((code, err),) = plot
    assert code == 1 and err.count("\n") == 1 and "--plot" in err and "needs matplotlib" in err


def test_a_prompt_longer_than_max_model_len_blames_the_length_and_stderr_holds_only_it(
    python,  # noqa: F811
    dense,
    ref,  # noqa: F811
    tmp_path,
):
    """vLLM started for real with a max_model_len shorter than the corpus's prompts: one line
    naming the prompt and the length (not "did not follow the forced tokens"), nothing else on
    stderr with --quiet (vLLM's notes, warnings and bars are not the user's business)."""
    out = tmp_path / "v.parquet"
    argv = ["record", "--corpus", ref, "--engine", "vllm", "--model", dense, "--producer", "v",
            "--out", out, "--dtype", "float32", "--set", "enforce_eager=true", "--set",
            "max_model_len=64", "--quiet"]  # fmt: skip
    got = subprocess.run([str(python), "score.py", *map(str, argv)], cwd=REPO,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert got.returncode == 1, got.stderr
    assert got.stderr.count("\n") == 1, got.stderr
    assert "prompt 0 needs" in got.stderr and "max_model_len of 64" in got.stderr
    assert got.stdout == "" and not out.exists()
