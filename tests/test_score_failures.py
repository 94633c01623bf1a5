"""score.py's failure matrix (docs/failures.md, the score.py rows): nothing of the user's is lost,
one line for every mistake, and a reference that is finite. Each class is tested generically:
every output flag against every input, every bad path kind against every path flag."""

# ruff: noqa: F811  (test_score's fixtures, imported, are this file's parameters)

import json
import os
import resource
import shutil
import signal
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from plugin_engine import RAN
from test_score import (  # noqa: F401  (its fixtures: ref, nan_model)
    ROWS,
    data_trace,
    failing,
    nan_model,
    nudged,
    producer,
    record,
    ref,
    sharp,
    write,
)

import build
import score
from scoring import boundary, paths
from scoring import judge as judging
from scoring import record as recording
from scoring.boundary import SETTING_TEXT
from scoring.engines.transformers import Transformers
from scoring.rows import is_hub
from scoring.trace import Prompt, ScoreError, Trace, beside, read_trace, trace_tables, write_trace


def listing(d):
    return sorted(p.name for p in Path(d).iterdir())


def judged_pair(tmp_path, ref_lp=None, cand_lp=None, bands=1):
    """A reference (of `bands` producers) and a candidate, as data."""
    rng = np.random.default_rng(0)
    lp = sharp(rng)
    refs = {n: producer(lp) for n in "ab"[:bands]}
    c = producer(nudged(lp, 1e-3, rng))
    return write(tmp_path / "ref.parquet", data_trace(refs)), write(
        tmp_path / "cand.parquet", data_trace({"c": c})
    )


# ---- 2. nothing of the user's is lost -----------------------------------------------------------


def linked(kind, target, where):
    """A name for `target`: itself, a symbolic link to it, or a hard link."""
    if kind == "same":
        return target
    name = where / f"{kind}-{target.name}"
    (os.symlink if kind == "symlink" else os.link)(target, name)
    return name


def judge_argv(ref, cand, flag, path, other):
    argv = ["judge", ref, "--candidate", cand, flag, path]
    return argv + (["--plot", other / "p.png"] if flag == "--out" else ["--out", other / "o.pq"])


@pytest.mark.parametrize("kind", ["same", "symlink", "hardlink"])
@pytest.mark.parametrize("which", ["reference", "candidate"])
@pytest.mark.parametrize("flag", ["--out", "--plot"])
def test_no_judge_output_is_an_input(tmp_path, capsys, kind, which, flag):
    ref, cand = judged_pair(tmp_path)
    before = {p: p.read_bytes() for p in (ref, cand)}
    target = linked(kind, ref if which == "reference" else cand, tmp_path)
    failing(capsys, judge_argv(ref, cand, flag, target, tmp_path), "(the same file)")
    assert {p: p.read_bytes() for p in (ref, cand)} == before
    assert not (tmp_path / "p.png").exists() and not (tmp_path / "o.pq").exists()


@pytest.mark.parametrize("kind", ["same", "symlink", "hardlink"])
def test_two_outputs_are_never_one_file(tmp_path, capsys, kind):
    ref, cand = judged_pair(tmp_path)
    first = tmp_path / "x.parquet"
    first.write_bytes(b"mine")
    second = linked(kind, first, tmp_path)
    failing(capsys, ["judge", ref, "--candidate", cand, "--out", first, "--plot", second],
            "are one file")  # fmt: skip
    assert first.read_bytes() == b"mine"


def test_no_output_is_a_model_file(tmp_path, capsys):
    ref, _ = judged_pair(tmp_path)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    failing(capsys, ["judge", ref, "--model", gguf, "--out", gguf], "is --model")
    assert gguf.read_bytes() == b"GGUF"


def shard_file(path, i, n, k=5, seed=0, rows=None):
    """A record of shard i of n, as data: two prompts, rows i and i + n."""
    s = producer(sharp(np.random.default_rng(0)), k)
    rows = rows or [i, i + n]
    prompts = [Prompt(np.arange(21, dtype=np.int32), f"r#{r}", "gsm8k", r, 11) for r in rows]
    meta = dict(split="smoke", seed=seed, choice=dict(sources=None, first=None, shard=[i, n]),
                prompts=[dict(index=r, source=f"r#{r}", name="gsm8k", rendered=11) for r in rows],
                skipped=[], producers={"a": dict(engine="data")})  # fmt: skip
    return write(path, Trace(prompts, 9, {"a": s}, meta))


@pytest.mark.parametrize("kind", ["same", "symlink", "hardlink"])
@pytest.mark.parametrize("which", [0, 1])
def test_no_merge_output_is_a_file_it_merges(tmp_path, capsys, kind, which):
    files = [shard_file(tmp_path / f"s{i}.parquet", i, 2) for i in range(2)]
    before = [f.read_bytes() for f in files]
    target = linked(kind, files[which], tmp_path)
    failing(capsys, ["merge", *files, "--out", target], "(the same file)")
    assert [f.read_bytes() for f in files] == before


@pytest.mark.parametrize("name", ["smoke.parquet", "manifest.json", "SHA256SUMS", "new.parquet"])
def test_a_record_never_writes_into_the_build_it_reads(out, tmp_path, capsys, monkeypatch, name):
    """Nor through a link to the build; refused before the model is loaded."""
    monkeypatch.setattr(recording, "engine_of", lambda *a: pytest.fail("work was done"))
    link = tmp_path / "link"
    link.symlink_to(out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    for target in (out / name, link / name):
        failing(capsys, ["record", "--rows", out, "--split", "smoke", "--model", "m",
                         "--out", target], "the build --rows reads")  # fmt: skip
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_record_into_its_own_corpus_is_still_allowed(tmp_path):
    """`record --corpus F --out F` adds a producer in place (the trace is written beside F and
    moved into place): the documented way, through a link too."""
    ref, _ = judged_pair(tmp_path)
    link = tmp_path / "link.parquet"
    link.symlink_to(ref)
    for target in (ref, link):
        args = score.parse_args(["record", "--corpus", str(ref), "--model", "m", "--producer",
                                 "p", "--out", str(target)])  # fmt: skip
        paths.check_paths(args)


@pytest.mark.parametrize("fails", ["plot", "out"])
def test_a_failing_judge_writes_no_output(tmp_path, capsys, monkeypatch, fails):
    ref, cand = judged_pair(tmp_path)
    kept = tmp_path / "o.parquet"
    kept.write_bytes(b"mine")

    def broken(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(judging, "plot" if fails == "plot" else "positions_table", broken)
    failing(capsys, ["judge", ref, "--candidate", cand, "--out", kept, "--plot",
                     tmp_path / "p.png"], "nothing was written")  # fmt: skip
    assert kept.read_bytes() == b"mine" and not (tmp_path / "p.png").exists()
    assert listing(tmp_path) == ["cand.parquet", "o.parquet", "ref.parquet"]


def test_a_move_that_fails_says_which_outputs_exist(tmp_path, capsys, monkeypatch):
    ref, cand = judged_pair(tmp_path)
    real = os.replace

    def replace(a, b):
        if str(b).endswith(".png"):
            raise OSError(5, "Input/output error")
        return real(a, b)

    monkeypatch.setattr(judging.os, "replace", replace)
    line = failing(capsys, ["judge", ref, "--candidate", cand, "--out", tmp_path / "o.parquet",
                            "--plot", tmp_path / "p.png"], "cannot move it into place")  # fmt: skip
    assert f"written: --out {tmp_path / 'o.parquet'}" in line
    assert listing(tmp_path) == ["cand.parquet", "o.parquet", "ref.parquet"]


@pytest.mark.parametrize("text, hub", [("hub", True), ("hub:me/data@v1", True),
                                       ("hub:me/data", True), ("hubdir", False),
                                       ("hub/", False), ("./hub", False),
                                       ("hubs:x", False)])  # fmt: skip
def test_only_hub_and_hub_colon_mean_the_hub(text, hub):
    assert is_hub(text) is hub


def test_a_local_directory_named_hub_something_is_read_locally(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("scoring.rows.hub_rows", lambda *a: pytest.fail("went to the Hub"))
    monkeypatch.setattr(recording, "engine_of", lambda args, k: FakeEngine())
    monkeypatch.setattr(recording, "load_tokenizer", lambda *a: None)
    Path("hubdir").mkdir()
    failing(capsys, ["record", "--rows", "hubdir", "--split", "smoke", "--model", "m", "--out",
                     "t.parquet"], "--rows hubdir: no smoke.parquet")  # fmt: skip


class FakeEngine(recording.Stepwise):
    def describe(self):
        return {}


def test_run_key_holds_every_setting_that_changes_the_bytes():
    corpus = dict(seed=0, length=12, producers={"x": 1})
    key = recording.run_key(corpus, "reference", {"chunk": 512}, 20)
    assert key != recording.run_key(corpus, "reference", {"chunk": 512}, 5)
    assert key != recording.run_key(corpus | {"seed": 1}, "reference", {"chunk": 512}, 20)
    assert key != recording.run_key(corpus, "reference", {"chunk": 7}, 20)
    assert key != recording.run_key(corpus, "other", {"chunk": 512}, 20)


@pytest.fixture(scope="module")
def interrupted(out, model, tmp_path_factory):
    """A record stopped after its first prompt: its staging holds that prompt."""
    d = tmp_path_factory.mktemp("interrupted")
    argv = ["--rows", out, "--split", "smoke", "--model", model, *ROWS, "--length", 12,
            "--out", d / "t.parquet"]  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        real = recording.Staging.keep

        def keep(self, *a):
            real(self, *a)
            raise KeyboardInterrupt

        mp.setattr(recording.Staging, "keep", keep)
        assert record(*argv) == 130
    staging = d / ".t.parquet.record"
    assert (staging / "000000.parquet").is_file()
    return argv, staging


@pytest.mark.parametrize("change", [("--top-k", 5), ("--seed", 1), ("--chunk", 7),
                                    ("--length", 11), ("--state-dtype", "bfloat16")])  # fmt: skip
def test_a_resume_with_other_settings_is_refused(interrupted, capsys, change):
    argv, staging = interrupted
    before = listing(staging)
    failing(capsys, ["record", *argv, *change], "holds an unfinished record with other settings")
    assert listing(staging) == before


@pytest.mark.parametrize(
    "shards, words",
    [
        ([(0, 2)], "shard 1/2 missing"),
        ([(1, 3)], "shards 0/3, 2/3 missing"),
        ([(0, 3), (2, 3)], "shard 1/3 missing"),
        ([(0, 2), (1, 3)], "shards of one run have one N"),
        ([(0, 2, dict(k=3)), (1, 2)], "keeps 5 ids per position"),
        ([(0, 2, dict(k=5)), (1, 2, dict(k=3))], "keeps 3 ids per position"),
        ([(0, 2), (1, 2, dict(seed=4))], "settings differ"),
        ([(0, 2, dict(rows=[0, 2])), (0, 2, dict(rows=[4, 6])), (1, 2)], "are both shard 0/2"),
    ],
)
def test_merge_writes_only_a_whole_run_of_files_that_agree(tmp_path, capsys, shards, words):
    files = [shard_file(tmp_path / f"s{j}.parquet", *s[:2], **(s[2] if len(s) > 2 else {}))
             for j, s in enumerate(shards)]  # fmt: skip
    target = tmp_path / "m.parquet"
    failing(capsys, ["merge", *files, "--out", target], words)
    assert not target.exists()


def test_a_whole_run_merges(tmp_path):
    files = [shard_file(tmp_path / f"s{i}.parquet", i, 3) for i in (2, 0, 1)]
    target = tmp_path / "m.parquet"
    assert score.main(["merge", *map(str, files), "--out", str(target)]) == 0
    t = read_trace(target)
    assert [p.index for p in t.prompts] == list(range(6)) and t.meta["choice"]["shard"] == [0, 1]


def test_merge_of_shards_that_all_got_no_rows_is_one_line(tmp_path, capsys):
    """Every shard empty (each one's rows too long for the context, say): nothing to merge, as
    the unsharded run has no row to record."""
    files = [tmp_path / f"e{i}.parquet" for i in range(2)]
    for i, f in enumerate(files):
        meta = dict(split="smoke", seed=0, choice=dict(sources=None, first=None, shard=[i, 2]),
                    prompts=[], skipped=[], producers={"a": dict(engine="data")})  # fmt: skip
        write_trace(f, 9, meta, [])
    failing(capsys, ["merge", *files, "--out", tmp_path / "m.parquet"],
            "none of the files holds a prompt (every shard got no rows): nothing to merge")  # fmt: skip
    assert listing(tmp_path) == ["e0.parquet", "e1.parquet"]


# ---- 3. one line for every mistake --------------------------------------------------------------


def refuses(d):
    try:
        (d / "kern-prompts-probe").touch()
    except OSError:
        return True
    (d / "kern-prompts-probe").unlink()
    return False


def read_only_dir(tmp_path):
    """A directory that refuses a new file: one made read-only, or (root writes anywhere) a
    file system that refuses even root."""
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    if refuses(d):
        return d
    d.chmod(0o755)
    d.rmdir()
    for d in (Path("/sys"), Path("/proc")):
        if d.is_dir() and refuses(d):
            return d
    pytest.skip("no read-only directory here")


BAD_OUTPUTS = {
    "missing directory": (lambda t: t / "nowhere" / "x.png", "does not exist"),
    "a file for directory": (lambda t: t / "ref.parquet" / "x.png", "is not a directory"),
    "read-only directory": (lambda t: read_only_dir(t) / "x.png", "cannot write in"),
    "a directory": (lambda t: t, "is a directory"),
    "a name too long": (lambda t: t / ("é" * 130 + ".png"), "longer than the"),
    "a device": (lambda t: Path("/dev/null"), "not a file"),
}


def output_argv(flag, path, ref, cand, model):
    return {
        "record --rows --out": ["record", "--rows", ref.parent, "--model", model, "--out", path],
        "record --corpus --out": ["record", "--corpus", ref, "--model", model, "--producer", "p",
                                  "--out", path],
        "merge --out": ["merge", ref, "--out", path],
        "judge --out": ["judge", ref, "--candidate", cand, "--out", path],
        "judge --plot": ["judge", ref, "--candidate", cand, "--plot", path],
        "judge --model --out": ["judge", ref, "--model", model, "--out", path],
    }[flag]  # fmt: skip


@pytest.mark.parametrize("kind", BAD_OUTPUTS)
@pytest.mark.parametrize("flag", ["record --rows --out", "record --corpus --out", "merge --out",
                                  "judge --out", "judge --plot", "judge --model --out"])  # fmt: skip
def test_an_output_that_cannot_be_written_is_one_line_before_any_work(
    tmp_path, capsys, monkeypatch, kind, flag
):
    ref, cand = judged_pair(tmp_path)
    monkeypatch.setattr(recording, "engine_of", lambda *a: pytest.fail("work was done"))
    make, words = BAD_OUTPUTS[kind]
    path = make(tmp_path)
    before = listing(tmp_path)
    failing(capsys, output_argv(flag, path, ref, cand, tmp_path / "model"), words)
    assert listing(tmp_path) == before


@pytest.mark.parametrize("name", ["p.xyz", "p.parquet", "p.PNG2"])
def test_a_plot_matplotlib_cannot_write_is_one_line(tmp_path, capsys, name):
    ref, cand = judged_pair(tmp_path)
    failing(capsys, ["judge", ref, "--candidate", cand, "--plot", tmp_path / name],
            "matplotlib cannot write")  # fmt: skip
    assert not (tmp_path / name).exists()


def test_a_name_of_the_longest_length_writes_and_its_neighbours_fit(tmp_path, capsys):
    ref, cand = judged_pair(tmp_path)
    name = "語" * 82 + ".parquet"  # 254 bytes: the temporary beside it is cut inside a character
    assert len(name.encode()) <= build.NAME_MAX
    code = score.main(["judge", str(ref), "--candidate", str(cand), "--out", str(tmp_path / name)])
    assert code in (0, 1, 2) and pq.read_table(tmp_path / name).num_rows == 20
    for tag, room in (("record", 0), ("tmp-", 8), ("tmp-", 16)):
        got = beside(tmp_path / name, tag, room)
        assert len(got.encode()) + room <= build.NAME_MAX and got.endswith(tag)
        assert got == beside(tmp_path / name, tag, room)  # the same name resumes
    staging = recording.Staging(tmp_path / name, {"k": 1})
    assert staging.dir.is_dir()
    staging.remove()


ENGINE_MISTAKES = [
    (["--device", "foo"], "--device foo: not a torch device"),
    (["--device", "meta"], "--device meta: a device that holds no values"),
    (["--dtype", "foo"], "--dtype foo: not a dtype"),
    (["--dtype", "int32"], "--dtype int32: not a dtype"),
]


@pytest.mark.parametrize("mistake, words", ENGINE_MISTAKES + [
    (["--device", "cuda"], "--device cuda: not available"),
    (["--model-file"], "is a file; transformers loads a model directory"),
])  # fmt: skip
@pytest.mark.parametrize("command", ["record --rows", "record --corpus", "judge --model"])
def test_engine_settings_that_cannot_work_are_one_line(
    out, model, tmp_path, capsys, mistake, words, command
):
    import torch

    if mistake == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("this torch has cuda")
    ref, _ = judged_pair(tmp_path)
    m = model
    if mistake == ["--model-file"]:
        mistake, m = [], ref
    argv = {
        "record --rows": ["record", "--rows", out, "--split", "smoke", *ROWS],
        "record --corpus": ["record", "--corpus", ref, "--producer", "p"],
        "judge --model": ["judge", ref],
    }[command]
    before = listing(tmp_path)
    failing(capsys, [*argv, "--model", m, *mistake, "--out", tmp_path / "t.parquet"], words)
    assert listing(tmp_path) == before


def bad_utf8(d, name):
    return d / os.fsdecode(b"x\xff-" + name.encode())


@pytest.mark.parametrize("flag", ["reference", "--candidate", "judge --out", "--plot",
                                  "--rows", "record --out", "--corpus", "merged file",
                                  "merge --out"])  # fmt: skip
def test_a_file_name_that_is_not_utf8_is_one_line(tmp_path, capsys, flag):
    ref, cand = judged_pair(tmp_path)
    bad = bad_utf8(tmp_path, "f.parquet")
    argv = {
        "reference": ["judge", bad, "--candidate", cand],
        "--candidate": ["judge", ref, "--candidate", bad],
        "judge --out": ["judge", ref, "--candidate", cand, "--out", bad],
        "--plot": ["judge", ref, "--candidate", cand, "--plot", bad_utf8(tmp_path, "p.png")],
        "--rows": ["record", "--rows", bad, "--model", "m", "--out", tmp_path / "t.parquet"],
        "record --out": ["record", "--corpus", ref, "--model", "m", "--producer", "p",
                         "--out", bad],
        "--corpus": ["record", "--corpus", bad, "--model", "m", "--producer", "p",
                     "--out", tmp_path / "t.parquet"],
        "merged file": ["merge", ref, bad, "--out", tmp_path / "m.parquet"],
        "merge --out": ["merge", ref, "--out", bad],
    }[flag]  # fmt: skip
    before = listing(tmp_path)
    line = failing(capsys, argv, "is not a valid UTF-8 file name")
    assert "x\\xff-" in line
    assert listing(tmp_path) == before


def with_schema_meta(path, key, value):
    t = pq.read_table(path)
    meta = dict(t.schema.metadata) | {key: value}
    pq.write_table(t.replace_schema_metadata(meta), path, use_compliant_nested_type=False)
    return path


BAD_META = [b"[]", b"1", b'"x"', b"null", b'{"prompts": {}}', b'{"prompts": [1]}',
            b'{"prompts": [{"index": "0"}]}', b'{"prompts": [{"source": 3}]}',
            b'{"prompts": [{"index": true}]}', b'{"skipped": "x"}', b'{"producers": []}',
            b'{"producers": {"a": 1}}', b'{"choice": []}', b'{"choice": {"shard": [2, 1]}}',
            b'{"choice": {"shard": "0/1"}}']  # fmt: skip


@pytest.mark.parametrize("meta", BAD_META)
@pytest.mark.parametrize("where", ["judge reference", "judge candidate", "record --corpus",
                                   "merge"])  # fmt: skip
def test_metadata_that_is_not_this_tools_is_one_line(tmp_path, capsys, meta, where):
    ref, cand = judged_pair(tmp_path)
    bad = with_schema_meta(tmp_path / ("cand.parquet" if where == "judge candidate" else
                                       "ref.parquet"), b"kern_prompts", meta)  # fmt: skip
    argv = {
        "judge reference": ["judge", bad, "--candidate", cand],
        "judge candidate": ["judge", ref, "--candidate", bad],
        "record --corpus": ["record", "--corpus", bad, "--model", "m", "--producer", "p",
                            "--out", tmp_path / "t.parquet"],
        "merge": ["merge", bad, "--out", tmp_path / "m.parquet"],
    }[where]  # fmt: skip
    failing(capsys, argv, "kern_prompts metadata is not this tool's")


@pytest.mark.parametrize("raw", [b"0_8", b" 8", b"8 ", b"+8", b"-1", b"8.0", b"1e3", b"0x8",
                                 b"", "٨".encode(), b"9" * 30, str(2**63).encode()])  # fmt: skip
@pytest.mark.parametrize("where", ["reference", "candidate"])
def test_a_decode_kern_would_not_read_is_one_line(tmp_path, capsys, raw, where):
    ref, cand = judged_pair(tmp_path)
    with_schema_meta(ref if where == "reference" else cand, b"decode", raw)
    failing(capsys, ["judge", ref, "--candidate", cand], "is not a count (ASCII digits")


def test_the_largest_decode_judges_every_position(tmp_path, capsys):
    ref, cand = judged_pair(tmp_path)
    for p in (ref, cand):
        with_schema_meta(p, b"decode", str(2**63 - 1).encode())
    code = score.main(["judge", str(ref), "--candidate", str(cand), "--plot",
                       str(tmp_path / "p.png")])  # fmt: skip
    assert code in (0, 1, 2) and (tmp_path / "p.png").is_file()


@pytest.mark.parametrize("command", ["record --corpus", "judge --model"])
@pytest.mark.parametrize("where", ["token", "top id"])
def test_a_corpus_from_another_models_vocabulary_is_one_line(model, tmp_path, capsys, command,
                                                             where):  # fmt: skip
    lp = sharp(np.random.default_rng(0))
    s = producer(lp)
    trace = data_trace({"a": s})
    if where == "token":
        trace.prompts[1].tokens = trace.prompts[1].tokens.copy()
        trace.prompts[1].tokens[4] = 151_643  # a Qwen id; the tiny model has 261
        words = "prompt 1 position 4 holds token 151643, outside the model's vocabulary of 261"
    else:
        s.ids[13, 2] = 300
        words = "lists a token id of 300 at prompt 1 position 13, outside the model's vocabulary"
        if command == "record --corpus":
            pytest.skip("record --corpus feeds the tokens only: other producers' ids are data")
    path = write(tmp_path / "other.parquet", trace)
    argv = {
        "record --corpus": ["record", "--corpus", path, "--model", model, "--producer", "p",
                            "--out", tmp_path / "t.parquet"],
        "judge --model": ["judge", path, "--model", model, "--out", tmp_path / "t.parquet"],
    }[command]  # fmt: skip
    failing(capsys, argv, words)
    assert listing(tmp_path) == ["other.parquet"]


def test_a_plot_of_no_decode_step_is_one_line_and_writes_nothing(tmp_path, capsys):
    s = producer(sharp(np.random.default_rng(0)))
    s = s.take(s.pos == 10)
    s.prompt, s.pos = np.arange(2, dtype=np.int32), np.full(2, 19, np.int32)
    prompts = [Prompt(np.arange(21, dtype=np.int32)) for _ in range(2)]
    ref = write(tmp_path / "ref.parquet", Trace(prompts, 0, {"a": s}))
    cand = write(tmp_path / "cand.parquet", Trace(prompts, 0, {"c": s}))
    failing(capsys, ["judge", ref, "--candidate", cand, "--out", tmp_path / "o.parquet",
                     "--plot", tmp_path / "p.png"], "no decode step was judged")  # fmt: skip
    assert listing(tmp_path) == ["cand.parquet", "ref.parquet"]


@pytest.mark.parametrize("side", ["ids", "logprob"])
def test_top_lists_of_unequal_lengths_name_the_prompt_and_position(tmp_path, capsys, side):
    ref, cand = judged_pair(tmp_path)
    t = pq.read_table(cand)
    col = "top_ids" if side == "ids" else "top_logprob"
    values = t[col].to_pylist()
    rows = [j for j, v in enumerate(values) if v is not None]
    j = rows[13]  # prompt 1, position 13
    values[j] = values[j][:3]
    i = t.schema.get_field_index(col)
    t = t.set_column(i, t.schema.field(col), pa.array(values, t.schema.field(col).type))
    pq.write_table(t, cand, use_compliant_nested_type=False)
    failing(capsys, ["judge", ref, "--candidate", cand], "prompt 1 position 13: top_ids holds")


def nonfinite(s, value, where):
    if where == "one entry":
        s.logprob[3, 2] = value
    elif where == "top two":
        s.logprob[3, :2] = value
    else:
        s.ref_logprob[3] = value
    return s


@pytest.mark.parametrize("bands", [1, 2])
@pytest.mark.parametrize("where", ["one entry", "top two", "fed token"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("side", ["reference", "candidate"])
def test_non_finite_values_warn_nowhere_but_in_the_report(tmp_path, capsys, side, value, where,
                                                          bands):  # fmt: skip
    rng = np.random.default_rng(0)
    lp = sharp(rng)
    refs = {n: producer(lp) for n in "ab"[:bands]}
    c = producer(nudged(lp, 1e-3, rng))
    nonfinite(refs["a"] if side == "reference" else c, value, where)
    ref = write(tmp_path / "ref.parquet", data_trace(refs))
    cand = write(tmp_path / "cand.parquet", data_trace({"c": c}))
    for extra in (["--out", str(tmp_path / "o.parquet"), "--plot", str(tmp_path / "p.png")],
                  ["--json"]):  # fmt: skip
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            code = score.main(["judge", str(ref), "--candidate", str(cand), *extra])
        captured = capsys.readouterr()
        assert not seen, [str(w.message) for w in seen]
        errors = captured.err.splitlines()
        assert all(line.startswith("error:") for line in errors) and len(errors) <= 1, errors
        if side == "candidate" and where != "fed token":
            assert code == 1 and captured.out.splitlines()[-1].startswith("FAIL")


def test_skipped_rows_are_listed_on_stderr_by_their_source_ids(out, model, ref, tmp_path, capsys):
    target = tmp_path / "t.parquet"
    assert record("--rows", out, "--split", "smoke", "--model", model, "--out", target, *ROWS,
                  "--length", 12, "--context", 200) == 0  # fmt: skip
    err = capsys.readouterr().err
    skipped = read_trace(target).meta["skipped"]
    assert len(skipped) == 1 and skipped[0]["source"] in err
    assert "1 rows skipped (too long for the context of 200 tokens)" in err


# ---- 4. the reference must be finite ------------------------------------------------------------


@pytest.mark.parametrize("at", ["prefill", "decode"])
def test_a_reference_that_is_not_finite_stops_and_resumes_once_fixed(
    out, model, ref, tmp_path, capsys, monkeypatch, at
):
    target = tmp_path / "ref.parquet"
    argv = ["record", "--rows", out, "--split", "smoke", "--model", model, *ROWS, "--length", 12,
            "--out", target]  # fmt: skip
    calls = {"prefill": 0, "step": 0}
    real_prefill, real_step = Transformers.prefill, Transformers.step

    def prefill(e, ids):
        calls["prefill"] += 1
        row = real_prefill(e, ids)
        return row * np.nan if at == "prefill" and calls["prefill"] == 2 else row

    def step(e, token):
        row = real_step(e, token)
        if calls["prefill"] == 2:
            calls["step"] += 1
            if at == "decode" and calls["step"] == 5:
                return row * np.nan
        return row

    monkeypatch.setattr(Transformers, "prefill", prefill)
    monkeypatch.setattr(Transformers, "step", step)
    line = failing(capsys, argv, "--engine transformers gave log-probabilities that are not finite")
    trace = read_trace(ref)
    p = trace.prompts[1]
    pos = p.rendered - 1 + (5 if at == "decode" else 0)
    assert f"at prompt 1 position {pos}, and 1 of its 12 positions ({p.source})" in line
    assert "flash-linear-attention" in line and "the same command resumes" in line
    assert not target.exists()
    staging = tmp_path / ".ref.parquet.record"
    assert listing(staging) == ["000000.parquet", "kern-prompts-record.json"]
    monkeypatch.setattr(Transformers, "step", real_step)
    prefills = []
    monkeypatch.setattr(Transformers, "prefill", lambda e, ids: prefills.append(1)
                        or real_prefill(e, ids))  # fmt: skip
    assert score.main([*map(str, argv), "--quiet"]) == 0
    assert len(prefills) == 1  # only the prompt that was not finished
    assert target.read_bytes() == ref.read_bytes() and not staging.exists()


def test_a_reference_not_finite_from_its_first_prompt_leaves_nothing(
    out, nan_model, tmp_path, capsys
):
    failing(capsys, ["record", "--rows", out, "--split", "smoke", "--model", nan_model, *ROWS,
                     "--length", 4, "--out", tmp_path / "r.parquet"],
            "at prompt 0")  # fmt: skip
    assert listing(tmp_path) == []


# A candidate's non-finite values (record --corpus) are refused at the engine boundary too:
# tests/test_score.py, test_nan_logits_are_refused_at_the_engine_boundary_never_a_crash.


def test_write_trace_beside_a_long_name(tmp_path):
    path = tmp_path / ("é" * 126 + ".pq")  # 255 bytes
    write_trace(path, 1, {}, [])
    assert path.is_file() and listing(tmp_path) == [path.name]


# ---- 5. nothing an engine says makes a file unreadable; nothing is lost to a race ---------------


def copied(ref, tmp_path):
    r = tmp_path / "ref.parquet"
    shutil.copy(ref, r)
    return r, r.read_bytes()


def test_what_an_engine_says_of_itself_is_bounded_and_the_file_reads_back(ref, model, tmp_path,
                                                                          capsys):  # fmt: skip
    """record --corpus R --out R with a plug-in whose describe() holds 80 MB (as a server's
    /version answering that would): the text is cut in the file, saying so, and R stays a trace
    every command reads (uncut, it would pass pyarrow's footer limit: no command would read R)."""
    r, _ = copied(ref, tmp_path)
    assert record("--corpus", r, "--engine", "plugin_engine:Unruly", "--model", model,
                  "--set", "fault=huge describe()", "--set", "size=80000000", "--producer", "p2",
                  "--out", r) == 0  # fmt: skip
    said = read_trace(r).meta["producers"]["p2"]
    assert (
        said["version"]
        == "v" * SETTING_TEXT + " [cut by kern-prompts: 80,000,000 characters in all]"
    )
    assert said["fault"] == "huge describe()"  # what was not too long is kept as it is
    capsys.readouterr()
    score.main(["judge", str(r), "--candidate", str(r), "--producer", "p2"])
    assert "error" not in capsys.readouterr().err
    assert r.stat().st_size < 1 << 20


def test_settings_too_large_even_cut_are_one_line():
    """Many short texts (each under the cut) past SETTINGS_BYTES: refused, nothing recorded."""

    class Chatty:
        def describe(self):
            return {"ids": list(range(300_000))}

    with pytest.raises(ScoreError, match=r"^e: describe\(\) is 1,988,899 bytes as JSON"):
        boundary.settings(Chatty(), "e")


def test_a_trace_that_would_not_read_back_never_replaces_a_file(tmp_path):
    """The general rule under the bound: write_trace reads what it wrote with the reader every
    command uses before it moves it into place; a file the reader refuses (here metadata that is
    not this tool's) leaves the file it would replace, and nothing beside it."""
    ref, _ = judged_pair(tmp_path)
    before = ref.read_bytes()
    t = read_trace(ref)
    with pytest.raises(ScoreError) as e:
        write_trace(ref, t.decode, t.meta | {"prompts": "all"}, trace_tables(t))
    assert str(e.value) == (f"{ref}: the trace written does not read back (its kern_prompts "
                            "metadata is not this tool's: `prompts` is a str, not a list); "
                            f"{ref} is left as it is")  # fmt: skip
    assert ref.read_bytes() == before and listing(tmp_path) == ["cand.parquet", "ref.parquet"]


def test_a_merge_while_a_record_of_the_same_file_runs_is_refused(ref, model, tmp_path, capsys):
    """merge --out R run while record --corpus R --out R is in progress (the plug-in runs it
    between its two prompts): the merge is refused by the lock the record holds, the record
    finishes, and R holds both producers."""
    r, _ = copied(ref, tmp_path)
    shards = [shard_file(tmp_path / f"s{i}.parquet", i, 2) for i in range(2)]
    merge = ["merge", *map(str, shards), "--out", str(r)]
    RAN.clear()
    capsys.readouterr()
    assert score.main(["record", "--corpus", str(r), "--engine", "plugin_engine:Meanwhile",
                       "--model", str(model), "--set", f"run={json.dumps(merge)}",
                       "--producer", "p2", "--out", str(r)]) == 0  # fmt: skip
    assert RAN == [1]
    assert f"error: another record or merge is writing {r}; wait for it to end" in (
        capsys.readouterr().err
    )
    assert set(read_trace(r).producers) == {"reference", "p2"}
    assert listing(tmp_path) == ["ref.parquet", "s0.parquet", "s1.parquet"]


def test_a_record_never_replaces_a_file_that_changed_under_it(ref, model, tmp_path, capsys):
    """A writer that takes no lock (a copy) puts another trace at R while record --corpus R
    --out R runs: the record refuses to replace it, keeps what it finished, and R is what that
    writer put there."""
    r, _ = copied(ref, tmp_path)
    other = shard_file(tmp_path / "other.parquet", 0, 1)
    line = failing(capsys, ["record", "--corpus", r, "--engine", "plugin_engine:Meanwhile",
                            "--model", model, "--set", f"put={json.dumps([str(other), str(r)])}",
                            "--producer", "p2", "--out", r],
                   f"{r} changed while this command ran (another command wrote it): it is left "
                   "as it is, not replaced; the 2 finished prompts are kept in")  # fmt: skip
    assert line.endswith("and the same command resumes from them")
    assert r.read_bytes() == other.read_bytes()


@pytest.mark.parametrize("at", [0, 1])
def test_a_disk_that_fills_while_a_prompt_is_staged_is_one_line(ref, model, tmp_path, capsys,
                                                                monkeypatch, at):  # fmt: skip
    """The write of staged prompt `at` fails as on a full disk: under RLIMIT_FSIZE 0 (a write
    past the limit is EFBIG, SIGXFSZ ignored) any write fails, for root too, who ignores
    permissions (a full file system of its own would need privileges to mount). One line, like
    the final write's; the prompts staged before are kept."""
    r, before = copied(ref, tmp_path)
    real = recording.Staging.keep

    def keep(self, i, *rest):
        if i != at:
            return real(self, i, *rest)
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)
        handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, limit[1]))
        try:
            return real(self, i, *rest)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, limit)
            signal.signal(signal.SIGXFSZ, handler)

    monkeypatch.setattr(recording.Staging, "keep", keep)
    staging = tmp_path / ".ref.parquet.record"
    line = failing(capsys, ["record", "--corpus", r, "--engine", "plugin_engine:FullForward",
                            "--model", model, "--producer", "p2", "--out", r],
                   f"error: cannot stage prompt {at} in {staging} (")  # fmt: skip
    assert "File too large" in line
    assert line.endswith(f"the 1 finished prompts are kept in {staging}, and the same command "
                         "resumes from them" if at else "nothing was written")  # fmt: skip
    assert r.read_bytes() == before
    assert listing(tmp_path) == ([".ref.parquet.record"] if at else []) + ["ref.parquet"]


# ---- 6. a plug-in is untrusted code -------------------------------------------------------------

# Each way a plug-in's own code goes wrong (tests/plugin_engine.py `Unruly`), and the words of the
# one line that says so.
UNRULY = {
    "force() gives None": "force() gave None (NoneType), not an iterator of its prompts",
    "vocab_size() a string": "vocab_size() gave '261' (str), not a count of token ids",
    "vocab_size() raises": "vocab_size() failed: KeyError: 'vocab_size'",
    "exit in vocab_size()": "vocab_size() failed: SystemExit: 3",
    "vocabulary() a number": "vocabulary() gave 261 (int), not a list of token strings",
    "a tensor that needs its gradient": "gave prompt 0 with arrays that are not numbers (Can't "
    "call numpy() on Tensor that requires grad",
    "complex log-probabilities": "gave prompt 0 complex log-probabilities: a log-probability is "
    "a real number",
    "exit in force()": "--engine plugin_engine:Unruly failed: SystemExit: 0",
    "exit in describe()": "describe() failed: SystemExit: 0",
    "exit in the constructor": "--engine plugin_engine:Unruly could not start: SystemExit: 0",
}


@pytest.mark.parametrize("fault", UNRULY)
def test_a_plug_in_that_misbehaves_is_one_line_and_writes_nothing(fault, ref, model, tmp_path,
                                                                  capsys):  # fmt: skip
    """record --corpus R --out R: one line naming the engine, exit 1 (never 0 from a sys.exit
    inside the plug-in), R's bytes unchanged and nothing beside it."""
    r, before = copied(ref, tmp_path)
    line = failing(capsys, ["record", "--corpus", r, "--engine", "plugin_engine:Unruly",
                            "--model", model, "--set", f"fault={fault}", "--producer", "p2",
                            "--out", r], UNRULY[fault])  # fmt: skip
    assert line.startswith("error: --engine plugin_engine:Unruly")
    assert r.read_bytes() == before and listing(tmp_path) == ["ref.parquet"]


# ---- 7. a shard that gets no rows is a shard ----------------------------------------------------


@pytest.mark.parametrize("why", ["--first 1", "rows too long for the context"])
def test_a_shard_that_gets_no_rows_records_and_the_shards_merge_to_the_whole_run(out, model, ref,
                                                                                 tmp_path, capsys,
                                                                                 why):  # fmt: skip
    """`--first 1 --shard 1/2` chooses no row; with a context that the longer row does not fit,
    its shard has none that fits. Each shard records (the empty one a trace of no prompts, its
    skipped rows listed), judge says what the empty one is, and merge of both is the unsharded
    run byte for byte."""
    longest = max(p["rendered"] for p in read_trace(ref).meta["prompts"])
    choice = ["--first", 1] if why == "--first 1" else ["--context", longest + 2]
    argv = ["--rows", out, "--split", "smoke", "--model", model, *ROWS, "--length", 4, *choice]
    whole = tmp_path / "whole.parquet"
    assert record(*argv, "--out", whole) == 0
    parts = [tmp_path / f"s{i}.parquet" for i in range(2)]
    for i, p in enumerate(parts):
        assert record(*argv, "--shard", f"{i}/2", "--out", p) == 0
    (empty,) = [p for p in parts if not read_trace(p, empty=True).prompts]
    i = parts.index(empty)
    assert len(read_trace(empty, empty=True).meta["skipped"]) == (i if why != "--first 1" else 0)
    failing(capsys, ["judge", empty, "--candidate", whole],
            f"{empty}: the corpus has no prompts (shard {i}/2, which got no rows: merge it with "
            "the other shards)")  # fmt: skip
    merged = tmp_path / "merged.parquet"
    for order in (parts, parts[::-1]):
        assert score.main(["merge", *map(str, order), "--out", str(merged)]) == 0
        assert merged.read_bytes() == whole.read_bytes()
