"""llama.cpp as a candidate, run for real on the CPU (docs/scoring.md "llama.cpp").

The model is tests/make_model.py's "qwen3_5_gguf" (the Qwen tokenizer from ../shared, the geometry
llama.cpp's qwen35 runs), turned into GGUF files (f32, q8_0) once per module by llama.cpp's own
converter, run from llama-cpp-python's source package (tests/make_gguf.py; the README's test
command downloads it to .venv/llama-sdist). The reference is transformers float32 on the same
weights, on two short smoke rows; llama.cpp runs on one thread.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from killing import kill_after_first_prompt
from make_gguf import SDIST, make_gguf
from test_score import failing, record, ref  # noqa: F401  (ref: a fixture)

import score
from scoring.trace import read_trace, trace_tables, write_trace

REPO = Path(__file__).resolve().parents[1]
ROWS = ("--sources", "gsm8k,humaneval", "--length", 16)  # two short smoke rows
# |llama.cpp f32 GGUF, f32 KV cache - transformers float32|, in every top-k log-probability and
# the fed token's, at every position: measured up to 2e-5 nat on these rows (1.8e-5 on others).
TOLERANCE = 1e-4
F32_KV = ("--set", "type_k=f32", "--set", "type_v=f32")
ONE = ("--set", "n_threads=1")


def missing(why):
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def gguf(qwen_tokenizer, tmp_path_factory):
    """{"hf": the transformers model, "f32": its GGUF file, "q8_0": its q8_0 GGUF file}."""
    if importlib.util.find_spec("llama_cpp") is None:
        missing("llama_cpp not installed: bash tests/setup_engines.sh builds and installs it")
    if not SDIST.is_file():
        missing(f"{SDIST} not found (the README's test command downloads it)")
    hf, files = make_gguf(tmp_path_factory.mktemp("gguf"), qwen_tokenizer)
    return {"hf": hf, **files}


@pytest.fixture(scope="module")
def reference(out, gguf, tmp_path_factory):
    path = tmp_path_factory.mktemp("llama-ref") / "ref.parquet"
    assert record("--rows", out, "--split", "smoke", "--model", gguf["hf"], "--out", path,
                  *ROWS) == 0  # fmt: skip
    return path


def llama(reference, model, producer, out, *options):
    return ["--corpus", reference, "--engine", "llama.cpp", "--model", model,
            "--producer", producer, "--out", out, *ONE, *options]  # fmt: skip


@pytest.fixture(scope="module")
def f32(reference, gguf, tmp_path_factory):
    path = tmp_path_factory.mktemp("llama-f32") / "f32.parquet"
    assert record(*llama(reference, gguf["f32"], "llama-f32", path, *F32_KV)) == 0
    return path


@pytest.fixture(scope="module")
def q8(reference, gguf, tmp_path_factory):
    path = tmp_path_factory.mktemp("llama-q8") / "q8.parquet"
    assert record(*llama(reference, gguf["q8_0"], "llama-q8_0", path)) == 0
    return path


@pytest.fixture(scope="module")
def sampled(out, gguf, tmp_path_factory):
    """A reference sampled through llama.cpp: the rows, seed and length of `reference`, rendered
    with the tokenizer of the model the GGUF was converted from."""
    path = tmp_path_factory.mktemp("llama-sampled") / "sampled.parquet"
    assert record("--rows", out, "--split", "smoke", "--engine", "llama.cpp", "--model",
                  gguf["f32"], "--tokenizer", gguf["hf"], "--out", path, *ROWS, *ONE,
                  *F32_KV) == 0  # fmt: skip
    return path


def test_a_reference_sampled_through_llamacpp_is_the_transformers_one(sampled, f32, reference,
                                                                       gguf):  # fmt: skip
    """The same sampler on llama.cpp's own rows draws the transformers float32 reference token
    for token, and its scores are llama.cpp's forced decode of those tokens (`f32`): the same
    decodes in the same order, so the same bytes."""
    hf, got, forced = read_trace(reference), read_trace(sampled), read_trace(f32)
    assert [p.tokens.tolist() for p in got.prompts] == [p.tokens.tolist() for p in hf.prompts]
    assert [p.rendered for p in got.prompts] == [p.rendered for p in hf.prompts]
    ours, theirs = got.producers["reference"], forced.producers["llama-f32"]
    for field in ("prompt", "pos", "ids", "ref_logprob", "logprob"):
        assert np.array_equal(getattr(ours, field), getattr(theirs, field)), field
    meta = got.meta
    assert meta["tokenizer"] == str(gguf["hf"]) and meta["model"] == str(gguf["f32"])
    for key in ("vocabulary", "tokenizer_sha256", "chat_template_sha256", "sampler", "seed"):
        assert meta[key] == hf.meta[key], key
    settings = meta["producers"]["reference"]
    assert settings["engine"] == "llama.cpp" and settings["settings"]["type_k"] == "f32"


def test_the_f32_gguf_follows_transformers_float32(f32, reference, capsys):
    hf, got = read_trace(reference), read_trace(f32)
    assert [p.tokens.tolist() for p in got.prompts] == [p.tokens.tolist() for p in hf.prompts]
    theirs, ours = hf.producers["reference"], got.producers["llama-f32"]
    assert np.array_equal(theirs.prompt, ours.prompt) and np.array_equal(theirs.pos, ours.pos)
    assert np.array_equal(theirs.ids, ours.ids)  # the same top-k, in the same order
    assert np.abs(theirs.ref_logprob - ours.ref_logprob).max() < TOLERANCE
    assert np.abs(theirs.logprob - ours.logprob).max() < TOLERANCE
    settings = got.meta["producers"]["llama-f32"]
    assert settings["engine"] == "llama.cpp" and settings["quantization"] == "F32"
    assert settings["file_type"] == 0 and len(settings["sha256"]) == 64
    assert settings["llama_cpp_python"] == "0.3.36" and settings["llama_cpp"].startswith("ggml ")
    assert settings["settings"] | {"n_ctx": None} == dict(
        n_threads=1, n_threads_batch=1, n_batch=512, n_ubatch=512, type_k="f32", type_v="f32",
        flash_attn=False, n_gpu_layers=0, n_ctx=None,
    )  # fmt: skip
    code = score.main(["judge", str(reference), "--candidate", str(f32)])
    lines = capsys.readouterr().out.splitlines()
    print("\n".join(lines), file=sys.stderr)
    assert code == 0 and lines[-1].startswith("PASS"), lines


def test_the_judge_tells_q8_0_from_f32(f32, q8, reference, capsys):
    """q8_0 is within the default KL limit (1e-2) on these 32 positions, but its KL is six orders
    of magnitude above f32's and one argmax flips: at a limit of 1e-3 the judge fails it."""
    settings = read_trace(q8).meta["producers"]["llama-q8_0"]
    assert settings["quantization"] == "Q8_0" and settings["file_type"] == 7
    assert settings["settings"]["type_k"] == settings["settings"]["type_v"] == "f16"
    code, out = {}, {}
    for name, path in (("f32", f32), ("q8_0", q8)):
        code[name] = score.main(["judge", str(reference), "--candidate", str(path),
                                 "--limit-kl", "1e-3"])  # fmt: skip
        out[name] = capsys.readouterr().out.splitlines()
        print("\n".join(out[name]), file=sys.stderr)
    kl = {n: float(next(x for x in out[n] if x.startswith("  all:")).split("KL p50 ")[1].split()[0])
          for n in out}  # fmt: skip
    assert kl["f32"] < 1e-9 and kl["q8_0"] > 1e-4
    assert code["f32"] == 0 and out["f32"][-1].startswith("PASS")
    assert code["q8_0"] == 1 and out["q8_0"][-1].startswith("FAIL")


def test_a_killed_llamacpp_record_resumes_to_the_same_bytes(f32, reference, gguf, tmp_path):
    target = tmp_path / "f32.parquet"
    staging = tmp_path / ".f32.parquet.record"
    argv = [
        "score.py",
        "record",
        *llama(reference, gguf["f32"], "llama-f32", target, *F32_KV),
        "--quiet",
    ]
    staged = kill_after_first_prompt(sys.executable, argv, target, seconds=120)
    assert not target.exists()
    assert len(staged) == 1
    got = subprocess.run([sys.executable, *map(str, argv)], cwd=REPO, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert target.read_bytes() == f32.read_bytes()
    assert not staging.exists()


def test_what_llamacpp_refuses_is_one_line_each(reference, gguf, tmp_path, capsys):
    x = tmp_path / "x.parquet"
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"not a model")
    trace = read_trace(reference)
    trace.prompts[1].tokens = trace.prompts[1].tokens.copy()
    trace.prompts[1].tokens[3] = 248_320  # one past the tiny model's vocabulary
    foreign = tmp_path / "foreign.parquet"
    write_trace(foreign, trace.decode, trace.meta, trace_tables(trace))
    cases = [
        (reference, not_gguf, (), "not a GGUF file"),
        (reference, tmp_path / "none.gguf", (), "no such GGUF file"),
        (foreign, gguf["f32"], (), "prompt 1 position 3 holds token 248320, outside the model's "
                                   "vocabulary of 248320 ids"),
        (reference, gguf["f32"], ("--set", "n_ctx=8"), "--set n_ctx=8: prompt 0 needs a context"),
        (reference, gguf["f32"], ("--set", "type_k=f7"), "not a llama.cpp cache type"),
        (reference, gguf["f32"], ("--set", "threads=1"), "unexpected keyword argument 'threads'"),
        # 1 == True in Python: taken, it would be recorded as 1; refused instead
        (reference, gguf["f32"], ("--set", "flash_attn=1"), "must be false, true or \"auto\""),
    ] + [(reference, gguf["f32"], flag, f"--engine llama.cpp does not use {flag[0]}")
         for flag in (("--dtype", "float32"), ("--batch", "2"), ("--chunk", "8"),
                      ("--kv-dtype", "bfloat16"), ("--state-dtype", "bfloat16"),
                      ("--device", "cpu"))]  # fmt: skip
    for corpus, model, options, words in cases:
        failing(capsys, ["record", *llama(corpus, model, "llama", x, *options)], words)
        assert not x.exists()


def test_llama_cpp_python_missing_is_one_line(reference, tmp_path):
    code = ("import sys; sys.modules['llama_cpp'] = None; import score; "
            "sys.exit(score.main(sys.argv[1:]))")  # fmt: skip
    argv = ["record", *llama(reference, tmp_path / "m.gguf", "llama", tmp_path / "x.parquet")]
    got = subprocess.run([sys.executable, "-c", code, *map(str, argv)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    errors = [line for line in got.stderr.splitlines() if line.startswith("error:")]
    assert got.returncode == 1 and "Traceback" not in got.stderr, got.stderr
    assert errors == ["error: --engine llama.cpp: cannot import llama_cpp "
                      "(pip install -e '.[llamacpp]')"]  # fmt: skip


def test_what_a_llamacpp_reference_refuses_is_one_line_each(out, gguf, model, tmp_path, capsys):
    x = tmp_path / "x.parquet"
    rows = ("record", "--rows", out, "--split", "smoke", "--out", x, *ROWS)
    cases = [
        (("--engine", "llama.cpp", "--model", gguf["f32"]),
         f"--model {gguf['f32']} is a file: the rows are rendered with a Hugging Face tokenizer"),
        (("--engine", "llama.cpp", "--model", gguf["f32"], "--tokenizer", tmp_path / "none"),
         f"--tokenizer {tmp_path / 'none'}: no tokenizer transformers can load"),
        (("--engine", "llama.cpp", "--model", gguf["f32"], "--tokenizer", model),
         f"--tokenizer {model}: its "),
        (("--engine", "plugin_engine:FullForward", "--model", model),
         "--engine plugin_engine:FullForward cannot sample a reference"),
    ]  # fmt: skip
    for argv, words in cases:
        failing(capsys, [*rows, *argv], words)
        assert not x.exists()
    with pytest.raises(SystemExit) as e:
        score.main(["record", "--corpus", str(x), "--model", str(gguf["f32"]), "--tokenizer",
                    str(model), "--out", str(x)])  # fmt: skip
    assert e.value.code == 2
    assert "--tokenizer chooses rows (--rows)" in capsys.readouterr().err


def test_the_judge_runs_llamacpp_as_a_candidate(reference, gguf, capsys):
    """judge --engine llama.cpp drives it a step at a time (the context made for the longest
    prompt first), its top-k and its log-probabilities of the reference's ids."""
    code = score.main(["judge", str(reference), "--engine", "llama.cpp", "--model",
                       str(gguf["f32"]), *ONE, *F32_KV])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    print("\n".join(lines), file=sys.stderr)
    assert code == 0 and lines[-1].startswith("PASS"), lines
    assert any("KL p50" in x and "32/32 argmax agree" in x for x in lines), lines


def test_llamacpp_records_the_settings_it_ran(reference, gguf, tmp_path):
    """n_ubatch above n_batch runs as n_batch in llama.cpp: recorded so."""
    x = tmp_path / "x.parquet"
    assert record(*llama(reference, gguf["f32"], "b16", x, "--set", "n_batch=16", "--set",
                         "n_ubatch=1024")) == 0  # fmt: skip
    settings = read_trace(x).meta["producers"]["b16"]
    assert settings["settings"]["n_batch"] == 16 and settings["settings"]["n_ubatch"] == 16
    assert settings["run"]["options"] == {"n_threads": 1, "n_batch": 16, "n_ubatch": 1024}
    assert settings["run"]["model"]["sha256"] == {gguf["f32"].name: settings["sha256"]}


def test_a_gguf_of_another_vocabulary_is_refused(ref, gguf, tmp_path, capsys):  # noqa: F811
    """The byte tokenizer's corpus (its ids are all inside Qwen's vocabulary) on the Qwen GGUF:
    refused before any forward, not judged into flips."""
    failing(capsys, ["record", *llama(ref, gguf["f32"], "llama", tmp_path / "x.parquet")],
            "is not the tokenizer")  # fmt: skip


def test_a_prefill_in_pieces_is_the_prefill_in_one(f32, reference, gguf, tmp_path):
    """n_batch of 5: each prompt's prefill runs in pieces of 5 tokens (the last one shorter),
    and every position is still transformers' own, the prefill position and the first decode
    row included."""
    path = tmp_path / "pieces.parquet"
    assert record(*llama(reference, gguf["f32"], "llama-f32", path, *F32_KV, "--set",
                         "n_batch=5")) == 0  # fmt: skip
    trace = read_trace(path)
    assert trace.meta["producers"]["llama-f32"]["settings"]["n_batch"] == 5
    assert [p.rendered % 5 for p in trace.prompts] != [0, 0]  # a last piece shorter than 5
    theirs, ours = trace.producers["reference"], trace.producers["llama-f32"]
    assert np.array_equal(theirs.pos, ours.pos) and np.array_equal(theirs.ids, ours.ids)
    assert np.abs(theirs.ref_logprob - ours.ref_logprob).max() < TOLERANCE
    assert np.abs(theirs.logprob - ours.logprob).max() < TOLERANCE
