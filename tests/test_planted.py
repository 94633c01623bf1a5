"""What the judge catches, on a real engine (docs/scoring.md "What the judge catches"): bugs
planted in a plug-in engine (tests/planted_engine.py) from a known decode step are failed at that
step, and the correct engine passes, at kern's floor and at an exact one; so are the project's
own precision settings. A tiny dense Qwen3 in float32 (tests/make_model.py) with a band of two
reference producers that differ in their prefill chunking, judged as a user judges: `score.py
judge REF --engine ... --json --out POS`."""

import orjson
import pyarrow.parquet as pq
import pytest
from make_model import make_model

import score

PLANTED = ("--engine", "planted_engine:Planted")
FROM = 8  # the decode step each bug starts at
EXACT = "1e-10"  # an exact floor: the correct engine's KL is about 1e-12 here


@pytest.fixture(scope="module")
def dense(out, tmp_path_factory):
    """The dense model and its reference: two gsm8k rows of 40 positions each, recorded by the
    transformers engine, and the same tokens prefilled in chunks of 3 (the band). One torch
    thread while the module runs: on a model this small a second one only waits."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        root = tmp_path_factory.mktemp("planted")
        model = make_model(root / "dense", "qwen3")
        ref = root / "ref.parquet"
        common = ["--model", model, "--out", ref, "--quiet"]
        rows = ["--rows", out, "--sources", "gsm8k", "--first", "2", "--length", "40"]
        assert score.main(list(map(str, ["record", *rows, *common]))) == 0
        corpus = ["--corpus", ref, "--producer", "chunk3", "--chunk", "3"]
        assert score.main(list(map(str, ["record", *corpus, *common]))) == 0
        yield model, ref, root
    finally:
        torch.set_num_threads(threads)


def judged(dense, capsys, *flags, floor=None):
    """The judge's JSON, and per judged position (both producers) its decode step, KL and flip."""
    model, ref, root = dense
    pos = root / "pos.parquet"
    argv = ["judge", ref, "--model", model, "--quiet", "--json", "--out", pos, *flags]
    code = score.main(list(map(str, argv + (["--kl-floor", floor] if floor else []))))
    out = capsys.readouterr().out
    j = orjson.loads(out[: out.rindex("\n", 0, -1)])
    assert code == j["verdict"]["code"] and out.splitlines()[-1].startswith(j["verdict"]["word"])
    t = pq.read_table(pos)
    return j, {k: t[k].to_numpy() for k in ("step", "kl", "flip")}


def planted(bug, size=None):
    return [*PLANTED, "--set", f"bug={bug}", "--set", f"from_step={FROM}"] + (
        [] if size is None else ["--set", f"size={size}"]
    )


@pytest.mark.parametrize("floor", [None, EXACT])
def test_the_correct_engine_passes_at_kerns_floor_and_at_an_exact_one(dense, capsys, floor):
    j, p = judged(dense, capsys, *PLANTED, "--set", "bug=none", floor=floor)
    assert j["verdict"]["word"] == "PASS" and j["summary"]["kl_floor"] == float(floor or 1e-6)
    assert p["kl"].max() < 1e-10 and not p["flip"].any() and j["drift"]["overall"] is None


def found_at(j, p, step):
    """FAIL, the drift at `step` in every prompt, and nothing wrong before it."""
    assert j["verdict"]["word"] == "FAIL", j["verdict"]
    assert j["drift"]["overall"] == step, j["drift"]
    assert set(j["drift"]["per_prompt"].values()) == {step}, j["drift"]
    before = p["step"] < step
    assert p["kl"][before].max() < 1e-10 and not p["flip"][before].any()
    assert (p["kl"][p["step"] == step] > 1e-10).all()


@pytest.mark.parametrize(
    "bug, size",
    [("noise", 0.1), ("scale", 0.05), ("rotary", 1), ("mask", None), ("unfed", 1),
     ("reset", None)],
)  # fmt: skip
def test_a_planted_bug_fails_at_the_step_it_starts_at(dense, capsys, bug, size):
    j, p = judged(dense, capsys, *planted(bug, size))
    found_at(j, p, FROM)
    flips = p["step"][p["flip"]]
    if len(flips):  # the first flip, when there is one, is where the bug is
        assert flips.min() >= FROM


@pytest.mark.parametrize("setting", [planted("scale", 1e-4), ["--kv-dtype", "float16"]])
def test_an_error_under_kerns_floor_passes_by_default_and_fails_exactly_where_it_starts(
    dense, capsys, setting
):
    """A logit scale of 1.0001 (KL about 1e-8) from step 8, a float16 KV cache (the prefill
    exact, its keys and values stored lower from then on: step 1): PASS at kern's 1e-6, FAIL at
    1e-10 where they start."""
    j, p = judged(dense, capsys, *setting)
    assert j["verdict"]["word"] == "PASS" and 1e-10 < p["kl"].max() < 1e-6
    j, p = judged(dense, capsys, *setting, floor=EXACT)
    found_at(j, p, FROM if setting[0] == PLANTED[0] else 1)
    assert "beyond the band" in j["verdict"]["why"] and j["summary"]["kl_seen"] == 1e-10


def test_the_projects_precision_settings_fail_where_their_error_starts(dense, capsys):
    """A bf16 KV cache is exact through prefill and fails from decode step 1; bf16 weights fail
    from the prefill (step 0); a recurrent state stored in bf16 changes nothing in a model that
    has none, and passes exactly."""
    j, p = judged(dense, capsys, "--kv-dtype", "bfloat16")
    found_at(j, p, 1)
    j, p = judged(dense, capsys, "--dtype", "bfloat16")
    assert j["verdict"]["word"] == "FAIL" and j["drift"]["overall"] == 1
    assert (p["kl"][p["step"] == 0] > 1e-6).all()
    j, p = judged(dense, capsys, "--state-dtype", "bfloat16", floor=EXACT)
    assert j["verdict"]["word"] == "PASS" and p["kl"].max() < 1e-10
