"""MLX as a candidate and as a reference, run for real on this machine's CPU (mlx with mlx-cpu,
mlx-lm; docs/scoring.md "MLX").

The models are tests/make_model.py's dense Qwen3, Qwen3-Next and Qwen3.5 (`qwen3_5_text`), as
transformers writes them, with Qwen's vocabulary where ../shared has it (else the byte-level test
tokenizer); the dense one quantized by mlx_lm.convert (4-bit affine at group sizes 64 and 32,
mxfp4). The reference is transformers float32 on the same weights, on two short smoke rows.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
from killing import kill_after_first_prompt
from make_model import make_model
from test_score import failing, record

import score
from scoring.trace import read_trace

REPO = Path(__file__).resolve().parents[1]
ROWS = ("--sources", "gsm8k,humaneval", "--length", 16)  # two short smoke rows
ARCHS = ("qwen3", "qwen3_next", "qwen3_5")
# |MLX float32 - transformers float32|, in every top-k log-probability and the fed token's, at every
# position: measured up to 2.4e-5 nat on these models and rows.
TOLERANCE = 1e-4
STEP = 5  # a prefill in pieces of 5 tokens (the last one shorter)
# What each architecture's config, as transformers 5 writes it, needs mapped for mlx-lm.
MAPPED = {
    "qwen3": ["rope_scaling", "rope_theta"],
    "qwen3_next": ["partial_rotary_factor", "rope_scaling", "rope_theta"],
    "qwen3_5": ["model_type", "partial_rotary_factor", "rope_scaling", "rope_theta"],
}
# mlx_lm.convert(quantize=True, ...) of the dense model: its mode, bits and group size.
QUANTIZED = {"q4": ("affine", 4, 64), "mxfp4": ("mxfp4", 4, 32)}


def mlx(corpus, model, producer, out, *options):
    return ["--corpus", corpus, "--engine", "mlx", "--model", model, "--producer", producer,
            "--out", out, *options]  # fmt: skip


@pytest.fixture(scope="module")
def vocabulary(request):
    """Qwen's tokenizer.json beside the repository, else None: the byte-level test tokenizer."""
    if importlib.util.find_spec("mlx_lm") is None:
        why = "mlx-lm not installed: pip install -e '.[mlx]'"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    try:
        return request.getfixturevalue("qwen_tokenizer")
    except pytest.skip.Exception:
        return None


@pytest.fixture(scope="module")
def models(vocabulary, tmp_path_factory):
    d = tmp_path_factory.mktemp("mlx-models")
    return {arch: make_model(d / arch, arch, vocabulary) for arch in ARCHS}


@pytest.fixture(scope="module")
def references(out, models, tmp_path_factory):
    """Per architecture: the transformers float32 reference, with MLX's forced decode of its
    tokens as producer "mlx" and, for the hybrid ones (a recurrent state carried from piece to
    piece), again with a prefill in pieces of STEP as "mlx-step"."""
    d = tmp_path_factory.mktemp("mlx-refs")
    paths = {}
    for arch, model in models.items():
        path = paths[arch] = d / f"{arch}.parquet"
        assert record("--rows", out, "--split", "smoke", "--model", model, "--out", path,
                      *ROWS) == 0  # fmt: skip
        assert record(*mlx(path, model, "mlx", path)) == 0
        if arch != "qwen3":
            assert record(*mlx(path, model, "mlx-step", path, "--set",
                               f"prefill_step_size={STEP}")) == 0  # fmt: skip
    return paths


@pytest.fixture(scope="module")
def quantized(models, tmp_path_factory):
    """The dense model as mlx_lm.convert quantizes it: {name: directory}."""
    from mlx_lm import convert

    d = tmp_path_factory.mktemp("mlx-quantized")
    dirs = {}
    for name, (mode, bits, group) in QUANTIZED.items():
        dirs[name] = d / name
        convert(str(models["qwen3"]), mlx_path=str(dirs[name]), quantize=True, q_bits=bits,
                q_group_size=group, q_mode=mode)  # fmt: skip
    return dirs


@pytest.fixture(scope="module")
def candidates(references, quantized, tmp_path_factory):
    """The 4-bit affine and mxfp4 models recorded on the dense reference: {name: file}."""
    d = tmp_path_factory.mktemp("mlx-candidates")
    files = {}
    for name in ("q4", "mxfp4"):
        files[name] = d / f"{name}.parquet"
        assert record(*mlx(references["qwen3"], quantized[name], f"mlx-{name}", files[name])) == 0
    return files


@pytest.mark.parametrize("arch", ARCHS)
def test_mlx_float32_is_transformers_float32_at_every_position(references, arch):
    """At every scored position (the prefill's, the first decode row, every forced token) MLX's
    top-k and the fed token's log-probability are transformers' on the same weights, with the
    prompt in one piece and in pieces of STEP: a token fed to the wrong step, a cache not carried
    from piece to piece or a recurrent state lost shows as another position's distribution."""
    trace = read_trace(references[arch])
    ours = trace.producers["reference"]
    for name in ("mlx", "mlx-step") if arch != "qwen3" else ("mlx",):
        theirs = trace.producers[name]
        assert np.array_equal(ours.prompt, theirs.prompt) and np.array_equal(ours.pos, theirs.pos)
        assert np.array_equal(ours.ids, theirs.ids), name  # the same top-k, in the same order
        gap = np.maximum(np.abs(ours.logprob - theirs.logprob).max(1),
                         np.abs(ours.ref_logprob - theirs.ref_logprob))  # fmt: skip
        print(f"{arch} {name}: max {gap.max():.1e} median {np.median(gap):.1e} nat over "
              f"{len(gap)} positions", file=sys.stderr)  # fmt: skip
        assert gap.max() < TOLERANCE, name
    assert [p.rendered % STEP for p in trace.prompts] != [1, 1]  # a last piece shorter than STEP
    settings = trace.meta["producers"]
    one = settings["mlx"]
    assert one["engine"] == "mlx" and one["mlx"] == "0.32.4" and one["mlx_lm"] == "0.32.2"
    assert one["device"] == "cpu" and one["dtype"] == "float32" and one["quantization"] is None
    assert one["prefill_step_size"] == 2048
    assert settings.get("mlx-step", {"prefill_step_size": STEP})["prefill_step_size"] == STEP
    assert one["config_mapped"] == MAPPED[arch] and one["packages"]["mlx-cpu"] == "0.32.4"
    # the files mlx-lm reads, hashed once for every engine (record.model_identity)
    assert {"config.json", "model.safetensors"} <= set(one["run"]["model"]["sha256"])


def test_a_reference_sampled_through_mlx_is_the_transformers_one(out, models, references,
                                                                 tmp_path):  # fmt: skip
    """The project's sampler on MLX's own rows of the tiny Qwen3.5 draws the transformers float32
    reference token for token, and its scores are MLX's forced decode of those tokens: the same
    forwards in the same order, so the same bytes."""
    arch = "qwen3_5"
    path = tmp_path / "sampled.parquet"
    assert record("--rows", out, "--split", "smoke", "--engine", "mlx", "--model", models[arch],
                  "--out", path, *ROWS) == 0  # fmt: skip
    hf, got = read_trace(references[arch]), read_trace(path)
    assert [p.tokens.tolist() for p in got.prompts] == [p.tokens.tolist() for p in hf.prompts]
    ours, forced = got.producers["reference"], hf.producers["mlx"]
    for field in ("prompt", "pos", "ids", "ref_logprob", "logprob"):
        assert np.array_equal(getattr(ours, field), getattr(forced, field)), field
    for key in ("vocabulary", "tokenizer_sha256", "chat_template_sha256", "sampler", "seed"):
        assert got.meta[key] == hf.meta[key], key
    assert got.meta["producers"]["reference"]["engine"] == "mlx"


def test_float32_engines_draw_apart_only_where_a_uniform_falls_between_their_cdfs(
    vocabulary, models
):
    """What "token for token" promises (docs/scoring.md "Recording"): on one prompt of the tiny
    dense Qwen3 the two float32 engines' cumulative sums, in id order, are a few 1e-7 apart, so
    they draw apart exactly for the uniforms between them: u there draws two tokens, u in the
    likeliest token's interval one. Those uniforms measure the mass of the ids narrower than the
    offset, here near 1e-3 a step; a sampler that ordered, truncated or summed the rows
    otherwise in one engine would part them at most uniforms."""
    from scoring.engines.mlx import MLX
    from scoring.engines.transformers import Transformers, plain

    if vocabulary is None:
        pytest.skip("the chance is Qwen's vocabulary's: ../shared/tokenizers not found")
    hf, ours = Transformers(str(models["qwen3"])), MLX(models["qwen3"])
    ids = [i * 7919 % hf.vocab_size() for i in range(1, 41)]
    a, b = hf.prefill(ids), np.array(ours.prefill(ids))
    fa, fb = (np.cumsum(np.exp(np.float64(r) - r.max())) for r in (plain(a), b))
    fa, fb = fa / fa[-1], fb / fb[-1]
    lo = np.maximum(np.r_[0, fa[:-1]], np.r_[0, fb[:-1]])
    apart = 1 - np.clip(np.minimum(fa, fb) - lo, 0, None).sum()  # the uniforms drawing apart
    assert 1e-5 < apart < 1e-2, apart
    edge = int(np.argmax(np.abs(fa - fb)))  # u between the two sums at an id's edge
    u = (fa[edge] + fb[edge]) / 2
    assert hf.draw(a, 1, u, ())[0] != ours.draw(b, 1, u, ())[0]
    top = int(np.argmax(b))  # u in the middle of the likeliest token's interval
    u = (fa[top] + (fa[top - 1] if top else 0)) / 2
    assert hf.draw(a, 1, u, ())[0] == ours.draw(b, 1, u, ())[0] == top


def test_quantized_mlx_candidates_are_recorded_and_judged(references, candidates, capsys):
    """4-bit affine and mxfp4, as mlx_lm.convert writes them: the quantization recorded as the
    model's config says it, and judged against the float32 band (transformers and MLX float32)
    with a KL decades above MLX float32's own."""
    kl = {}
    for name, path in [("f32", None), *candidates.items()]:
        if path is None:
            argv = [references["qwen3"], "--candidate", references["qwen3"], "--producer", "mlx"]
        else:
            argv = [references["qwen3"], "--candidate", path]
        code = score.main(["judge", *map(str, argv)])
        lines = capsys.readouterr().out.splitlines()
        print("\n".join(lines), file=sys.stderr)
        assert lines[-1].split()[0] == ("PASS", "FAIL", "INCONCLUSIVE")[code], lines
        kl[name] = float(next(x for x in lines if x.startswith("  all:")).split("KL p50 ")[1]
                         .split()[0])  # fmt: skip
    assert kl["f32"] < 1e-9 and kl["q4"] > 1e-5 and kl["mxfp4"] > 1e-5, kl
    for name, path in candidates.items():
        settings = read_trace(path).meta["producers"][f"mlx-{name}"]
        mode, bits, group = QUANTIZED[name]
        assert settings["quantization"] == {"mode": mode, "bits": bits, "group_size": group}
        assert settings["weights_dtypes"] == ["float32"] and settings["dtype"] == "float32"
        assert 4 < settings["bits_per_weight"] < 6


def test_mlx_quantizes_the_kv_cache_as_mlx_lms_generation_does(references, models, tmp_path):
    """--set kv_bits=8 from the first token: the KV cache stored in 8 bits after every forward,
    recorded, and its rows near float32's but not float32's."""
    path = tmp_path / "kv8.parquet"
    assert record(*mlx(references["qwen3"], models["qwen3"], "kv8", path, "--set", "kv_bits=8",
                       "--set", "quantized_kv_start=0", "--device", "cpu")) == 0  # fmt: skip
    trace = read_trace(path)
    settings = trace.meta["producers"]["kv8"]
    assert settings["kv_cache"] == {"bits": 8, "group_size": 64, "start": 0}
    assert settings["device"] == "cpu" and settings["run"]["flags"] == {"device": "cpu"}
    assert trace.meta["producers"]["mlx"]["kv_cache"] == {"bits": None, "group_size": 64,
                                                          "start": 5000}  # fmt: skip
    f32, kv8 = trace.producers["mlx"], trace.producers["kv8"]
    gap = np.abs(f32.ref_logprob - kv8.ref_logprob)
    assert gap.max() > 1e-4 and np.median(gap) < 0.1, gap


def test_the_judge_runs_mlx_as_a_candidate(references, models, capsys):
    """judge --engine mlx drives it a step at a time on the hybrid Qwen3-Next: its top-k, and its
    log-probabilities of every reference producer's ids (the `against` estimator)."""
    code = score.main(["judge", str(references["qwen3_next"]), "--engine", "mlx", "--model",
                       str(models["qwen3_next"])])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    print("\n".join(lines), file=sys.stderr)
    assert code == 0 and lines[-1].startswith("PASS"), lines
    assert lines[1] == f"candidate --model {models['qwen3_next']} · 32 positions"
    alls = [x for x in lines if x.startswith("  all:")]
    assert len(alls) == 3 and all("32/32 argmax agree" in x for x in alls), lines


def test_a_killed_mlx_record_resumes_to_the_same_bytes_and_nothing_else(references, quantized,
                                                                        candidates, tmp_path,
                                                                        capsys):  # fmt: skip
    """Killed after its first prompt, the 4-bit record resumes to the bytes of one run; the
    staged prompts are refused to another quantization (mxfp4: another mode and group size) of
    the same weights."""
    target = tmp_path / "q4.parquet"
    argv = mlx(references["qwen3"], quantized["q4"], "mlx-q4", target)
    staged = kill_after_first_prompt(sys.executable, ["score.py", "record", *argv, "--quiet"],
                                     target, seconds=120)  # fmt: skip
    assert len(staged) == 1 and not target.exists()
    other = mlx(references["qwen3"], quantized["mxfp4"], "mlx-q4", target)
    failing(capsys, ["record", *other], "holds an unfinished record with other settings")
    assert record(*argv) == 0
    assert target.read_bytes() == candidates["q4"].read_bytes()


def test_what_mlx_refuses_is_one_line_each(references, models, tmp_path, capsys):
    import mlx.core as mx

    x = tmp_path / "x.parquet"
    ref, dense = references["qwen3_next"], models["qwen3_next"]
    swapped = tmp_path / "swapped"
    shutil.copytree(dense, swapped)
    config = orjson.loads((swapped / "config.json").read_bytes())
    config["layer_types"] = ["full_attention"] + ["linear_attention"] * 3
    (swapped / "config.json").write_bytes(orjson.dumps(config))
    broken = tmp_path / "broken"
    shutil.copytree(dense, broken)
    (broken / "config.json").write_text("{ not json")
    listed = tmp_path / "listed"
    listed.mkdir()
    (listed / "config.json").write_text("[]")
    cases = [
        (tmp_path, (), "not a model directory (no config.json in it)"),
        (broken, (), f"--model {broken}: mlx-lm 0.32.2 cannot load it"),
        (listed, (), "cannot load it (its config.json holds a list, not an object)"),
        (swapped, (), "are not the layout mlx-lm builds from full_attention_interval 4"),
        (dense, ("--set", "prefill_step_size=0"), "must be an integer of at least 1"),
        (dense, ("--set", "quantized_kv_start=-1"), "must be an integer of at least 0"),
        (dense, ("--set", "kv_bits=7"), "--set kv_bits=7: MLX quantizes to 2, 3, 4, 5, 6, 8 bits"),
        # the tiny Qwen3.5's attention heads are 16 wide: no group of 64 fits (at its first forward)
        (models["qwen3_5"], ("--set", "kv_bits=4", "--set", "quantized_kv_start=0"),
         "--set kv_bits=4: MLX cannot quantize qwen3_5's KV cache in groups of 64"),
        (dense, ("--set", "prefill_step=8"), "unexpected keyword argument 'prefill_step'"),
        (dense, ("--device", "cuda"), "--device cuda: MLX's devices are cpu and gpu"),
    ] + [(dense, flag, f"--engine mlx does not use {flag[0]}")
         for flag in (("--dtype", "float32"), ("--batch", "2"), ("--chunk", "8"),
                      ("--kv-dtype", "bfloat16"), ("--state-dtype", "bfloat16"))]  # fmt: skip
    if not mx.is_available(mx.gpu):
        cases.append((dense, ("--device", "gpu"), "--device gpu: not available to MLX 0.32.4"))
    for model, options, words in cases:
        failing(capsys, ["record", *mlx(ref, model, "m", x, *options)], words)
        assert not x.exists()


# MLX missing, and MLX there without its backend (on Linux `pip install mlx` alone: its core
# module's library, libmlx.so, is in the backend package)
MISSING = {
    "sys.modules['mlx'] = None": "cannot import mlx.core (pip install -e '.[mlx]')",
    "import importlib.abc\n"
    "class NoBackend(importlib.abc.MetaPathFinder):\n"
    "    def find_spec(self, name, path, target=None):\n"
    "        if name == 'mlx.core':\n"
    "            raise ImportError('libmlx.so: cannot open shared object file: No such file or "
    "directory')\n"
    "sys.meta_path.insert(0, NoBackend())": "its package does not import (libmlx.so: cannot open "
    "shared object file: No such file or directory; pip install -e '.[mlx]')",
}


@pytest.mark.parametrize("how", MISSING)
def test_mlx_missing_is_one_line(references, tmp_path, how):
    code = f"import sys\n{how}\nimport score\nsys.exit(score.main(sys.argv[1:]))"
    argv = ["record", *mlx(references["qwen3"], tmp_path, "m", tmp_path / "x.parquet")]
    got = subprocess.run([sys.executable, "-c", code, *map(str, argv)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    errors = [line for line in got.stderr.splitlines() if line.startswith("error:")]
    assert got.returncode == 1 and "Traceback" not in got.stderr, got.stderr
    assert errors == [f"error: --engine mlx: {MISSING[how]}"]
