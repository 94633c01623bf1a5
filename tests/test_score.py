"""score.py: record a reference, judge a candidate, on a real model of Qwen3.8's architecture
(tests/make_model.py: random weights from a config, on the CPU) and the miniature build."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import score
from scoring import compare
from scoring import record as recording
from scoring.engines import top_k
from scoring.engines.transformers import Transformers, torch_top
from scoring.trace import (
    TOP_K,
    TRACE_SCHEMA,
    Prompt,
    Schedule,
    Scores,
    Trace,
    Writing,
    prompt_tables,
    read_trace,
    slice_scores,
    trace_tables,
    write_parquet,
    write_trace,
)

REPO = Path(__file__).resolve().parents[1]
# A model this small runs fastest on one thread, and a second one only waits on a busy machine.
torch.set_num_threads(1)
ROWS = ("--sources", "gsm8k,humaneval")  # the shortest rows: prompts of a few hundred tokens


def record(*argv):
    return score.main(["record", *map(str, argv), "--quiet"])


@pytest.fixture(scope="session")
def ref(out, model, tmp_path_factory):
    """A reference of three smoke rows, 12 tokens each."""
    path = tmp_path_factory.mktemp("ref") / "ref.parquet"
    assert record("--rows", out, "--split", "smoke", "--model", model, "--out", path, *ROWS,
                  "--length", 12) == 0  # fmt: skip
    return path


def failing(capsys, argv, words):
    """`argv` fails with one `error:` line holding `words`, and no traceback."""
    code = score.main(list(map(str, argv)) + (["--quiet"] if argv[0] == "record" else []))
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1 and "Traceback" not in err, err
    assert words in errors[0], errors[0]
    return errors[0]


# ---- the file: kern's schema and schedule ----------------------------------------------------


def test_a_record_is_kerns_trace_table_with_its_schedule(ref, out):
    pf = pq.ParquetFile(ref)
    assert pf.schema_arrow.remove_metadata().equals(TRACE_SCHEMA)
    assert [str(f.type) for f in pf.schema_arrow] == [
        "int32", "int32", "int32", "string", "float", "list<item: int32>", "list<item: float>"
    ]  # fmt: skip
    assert [f.nullable for f in pf.schema_arrow] == [False, False, False, True, True, True, True]
    assert pf.schema_arrow.metadata[b"decode"] == b"11"
    table = pf.read()
    tokens = table.filter(pc_is_null(table["producer"]))
    assert tokens["ref_logprob"].null_count == tokens["top_ids"].null_count == len(tokens)
    trace = read_trace(ref)
    rows = {r["index"]: r for r in read_manifest(out) if r["split"] == "smoke"}
    for i, p in enumerate(trace.prompts):
        assert rows[p.index]["source"] == p.source and rows[p.index]["name"] == p.name
        assert len(p.tokens) == p.rendered + 12
        s = slice_scores(trace.producers["reference"], i)
        # prefill ends where the rendered prompt ends; every continuation token goes through decode
        assert list(s.pos) == list(range(p.rendered - 1, p.rendered + 11))
        assert s.ids.shape[1] == TOP_K


def pc_is_null(col):
    return pa.compute.is_null(col)


def read_manifest(out):
    import orjson

    return orjson.loads((out / "manifest.json").read_bytes())["rows"]


@pytest.mark.parametrize("n", range(2, 9))
@pytest.mark.parametrize("decode", range(0, 9))
def test_the_schedule_is_kerns(n, decode):
    """Scored: the last min(decode, n - 2) + 1 positions; prefill is everything before them."""
    s = Schedule.of(n, decode)
    steps = min(decode, n - 2)
    assert list(s.positions) == list(range(n - 1 - steps - 1, n - 1))
    assert s.ctx >= 1 and s.ctx + s.steps == n - 1


def test_a_corpus_of_short_prompts_is_scored_where_kern_scores_it(model, tmp_path):
    """Prompts of n = 2 and n = 3 tokens, and decode >= n - 2: the decode tail shrinks to fit."""
    corpus = tmp_path / "corpus.parquet"
    prompts = [Prompt(np.array(t, np.int32)) for t in ([5, 6], [7, 8, 9], list(range(10, 20)))]
    write_trace(corpus, 4, {}, (t for i, p in enumerate(prompts) for t in prompt_tables(i, p, {})))
    assert record("--corpus", corpus, "--model", model, "--producer", "p", "--out", corpus) == 0
    s = read_trace(corpus).producers["p"]
    assert list(zip(s.prompt, s.pos)) == [(0, 0), (1, 0), (1, 1)] + [(2, q) for q in range(4, 9)]


# ---- the reference continuation ---------------------------------------------------------------


def test_the_same_seed_gives_the_same_continuation_whatever_rows_are_in_the_run(
    out, model, ref, tmp_path
):
    alone = tmp_path / "alone.parquet"
    torch.set_num_threads(2)  # and whatever the threads
    try:
        assert record("--rows", out, "--split", "smoke", "--model", model, "--out", alone,
                      "--sources", "humaneval", "--length", 12) == 0  # fmt: skip
    finally:
        torch.set_num_threads(1)
    both, one = read_trace(ref), read_trace(alone)
    (p,) = one.prompts
    (same,) = [q for q in both.prompts if q.source == p.source]
    assert np.array_equal(p.tokens, same.tokens)
    other = tmp_path / "seed1.parquet"
    assert record("--rows", out, "--split", "smoke", "--model", model, "--out", other,
                  "--sources", "humaneval", "--length", 12, "--seed", 1) == 0  # fmt: skip
    assert not np.array_equal(read_trace(other).prompts[0].tokens, p.tokens)


def test_stop_tokens_are_never_sampled_and_the_distribution_is_the_models_own(ref, model):
    trace = read_trace(ref)
    never = trace.meta["sampler"]["never"]
    assert never and trace.meta["seed"] == 0
    for p in trace.prompts:
        assert not np.isin(p.tokens[p.rendered :], never).any()
    s = trace.producers["reference"]
    # the recorded log-probabilities are normalised over the whole vocabulary, stops included
    assert (np.exp(s.logprob).sum(1) <= 1 + 1e-5).all()


def test_uniforms_depend_on_seed_and_row_only():
    a = recording.uniforms(3, "repo@rev#1", 10)
    assert np.array_equal(a, recording.uniforms(3, "repo@rev#1", 10))
    assert np.array_equal(a[:4], recording.uniforms(3, "repo@rev#1", 4))
    assert not np.array_equal(a, recording.uniforms(3, "repo@rev#2", 10))


def test_top_k_breaks_ties_to_the_lower_id_and_normalises_in_float64():
    row = torch.tensor([1.0, 3.0, 3.0, 0.5, 3.0, 2.0], dtype=torch.float32)
    ids, lps, fed = torch_top(row, 3, next_id=5)
    assert list(ids) == [1, 2, 4]
    want = torch.log_softmax(row.double(), -1)
    assert np.allclose(lps, want[[1, 2, 4]].numpy(), rtol=0, atol=1e-15)
    assert fed == pytest.approx(float(want[5]), abs=1e-15)


@pytest.mark.parametrize("seed", range(6))
def test_the_top_k_on_the_device_is_the_plain_one(seed):
    """Transformers' top-k in torch is scoring.engines.top_k, the definition other engines use:
    the same ids (ties included) and log-probabilities, on rows with many exact ties."""
    rng = np.random.default_rng(seed)
    row = rng.integers(-4, 4, 300).astype(np.float32) / 2  # few values: ties everywhere
    for k in (1, 2, 20, 300):
        got = torch_top(torch.from_numpy(row), k, next_id=7)
        want = top_k(row, k, next_id=7)
        assert np.array_equal(got[0], want[0])
        assert np.allclose(got[1], want[1], rtol=0, atol=1e-12)
        assert got[2] == pytest.approx(want[2], abs=1e-12)


# ---- the engine ---------------------------------------------------------------------------------


def test_decode_through_the_cache_gives_what_one_full_forward_gives(model):
    engine = Transformers(str(model), chunk=16)
    ids = list(np.random.default_rng(0).integers(0, 256, 70))
    rows = [engine.prefill(ids[:40])] + [engine.step(t) for t in ids[40:]]
    with torch.no_grad():
        full = engine.model(torch.tensor([ids])).logits[0, 39:]
    got = torch.log_softmax(torch.stack(rows).double(), -1)
    want = torch.log_softmax(full.double(), -1)
    assert (got - want).abs().max().item() < 1e-4  # float32 rounding, not a different path
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_teacher_forcing_reproduces_a_producer_exactly(ref, model, tmp_path):
    again = tmp_path / "again.parquet"
    assert record("--corpus", ref, "--model", model, "--producer", "again", "--out", again) == 0
    t = read_trace(again)
    a, b = t.producers["reference"], t.producers["again"]
    for f in Scores.__slots__:
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert t.meta["producers"]["again"]["chunk"] == 512


def test_two_prefill_chunkings_differ_only_at_rounding_level(ref, model, tmp_path):
    path = tmp_path / "chunks.parquet"
    assert record("--corpus", ref, "--model", model, "--producer", "c7", "--chunk", 7,
                  "--out", path) == 0  # fmt: skip
    t = read_trace(path)
    a, b = t.producers["reference"], t.producers["c7"]
    assert np.abs(a.logprob - b.logprob).max() < 1e-4
    assert np.array_equal(a.ids[:, 0], b.ids[:, 0])


def states(engine):
    out = []
    for layer in engine.cache.layers:
        if hasattr(layer, "recurrent_states"):
            out += [layer.conv_states[0], layer.recurrent_states[0]]
    return out


def keys(engine):
    return [layer.keys for layer in engine.cache.layers if not hasattr(layer, "recurrent_states")]


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_lower_precision_storage_really_stores_the_state_that_way(model, dtype):
    ids = list(np.random.default_rng(1).integers(0, 256, 30))
    plain = Transformers(str(model), chunk=8)
    same = Transformers(str(model), chunk=8, kv_dtype="float32", state_dtype="float32")
    low = Transformers(str(model), chunk=8, kv_dtype=dtype, state_dtype=dtype)
    for e in (plain, same, low):
        e.prefill(ids[:20])
        for t in ids[20:]:
            e.step(t)
    d = getattr(torch, dtype)
    for a, b, c in zip(states(plain) + keys(plain), states(same) + keys(same),
                       states(low) + keys(low)):  # fmt: skip
        assert torch.equal(a, b)  # float32 changes nothing
        assert torch.equal(c, c.to(d).to(c.dtype))  # every stored value is representable in d
        assert not torch.equal(a, c)


# ---- long runs: a killed record resumes --------------------------------------------------------


def test_a_killed_record_resumes_at_the_first_unfinished_prompt(out, model, tmp_path, monkeypatch):
    argv = [
        "--rows",
        out,
        "--split",
        "standard",
        "--model",
        model,
        *ROWS,
        "--first",
        3,
        "--length",
        40,
    ]
    whole = tmp_path / "whole.parquet"
    assert record(*argv, "--out", whole) == 0
    target = tmp_path / "ref.parquet"
    staging = tmp_path / ".ref.parquet.record"
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "score.py"), "record", *map(str, argv), "--out", str(target),
         "--quiet"], stderr=subprocess.DEVNULL, env=os.environ | {"OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not list(staging.glob("000000.parquet")) and time.monotonic() < deadline:
        assert proc.poll() is None, "the record ended before its first prompt was staged"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list(staging.glob("000000.parquet")), "no prompt staged in 120 s: killed before one"
    assert not target.exists()  # never a half-written trace where it should be
    done = sorted(p.name for p in staging.glob("0*.parquet"))
    n = len(read_trace(whole).prompts)
    assert done and len(done) < n
    prefills = []
    real = Transformers.prefill
    monkeypatch.setattr(Transformers, "prefill", lambda e, ids: prefills.append(1) or real(e, ids))
    assert record(*argv, "--out", target) == 0
    assert len(prefills) == n - len(done)  # nothing done twice
    assert target.read_bytes() == whole.read_bytes()
    assert not staging.exists()


def test_a_second_record_into_the_same_output_is_refused(out, model, tmp_path, capsys):
    """The lock every command writing a trace takes (trace.Writing), held here as a record
    holds it; tests/test_score_failures.py races a merge against a record for real."""
    target = tmp_path / "t.parquet"
    lock = Writing(target)
    try:
        failing(capsys, ["record", "--rows", out, "--split", "smoke", "--model", model, *ROWS,
                         "--out", target], "another record or merge is writing")  # fmt: skip
    finally:
        lock.release()
    assert list(tmp_path.iterdir()) == []


# ---- more than one device: merge -------------------------------------------------------------


def test_shards_merge_into_the_file_one_run_writes(out, model, ref, tmp_path, capsys):
    argv = ["--rows", out, "--split", "smoke", "--model", model, *ROWS, "--length", 12]
    parts = [tmp_path / f"s{i}.parquet" for i in range(2)]
    for i, p in enumerate(parts):
        assert record(*argv, "--shard", f"{i}/2", "--out", p) == 0
    merged = tmp_path / "merged.parquet"
    assert score.main(["merge", *map(str, reversed(parts)), "--out", str(merged)]) == 0
    assert merged.read_bytes() == ref.read_bytes()
    other = tmp_path / "seed.parquet"
    assert record(*argv, "--shard", "1/2", "--seed", 5, "--out", other) == 0
    failing(capsys, ["merge", parts[0], other, "--out", tmp_path / "m2.parquet"], "settings differ")
    failing(capsys, ["merge", parts[0], parts[0], "--out", tmp_path / "m3.parquet"], "not disjoint")


# ---- bad input: one clear line, nothing written ------------------------------------------------


def test_bad_rows_and_models_each_give_one_line(out, model, tmp_path, capsys):
    target = tmp_path / "never.parquet"
    base = ["record", "--split", "smoke", "--model", model, "--out", target]
    failing(capsys, [*base, "--rows", tmp_path / "nothing"], "not a build's output directory")
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "manifest.json").write_bytes((out / "manifest.json").read_bytes())
    failing(capsys, [*base, "--rows", partial], "no smoke.parquet")
    edited = tmp_path / "edited"
    edited.mkdir()
    for f in ("manifest.json", "smoke.parquet"):
        (edited / f).write_bytes((out / f).read_bytes())
    with open(edited / "smoke.parquet", "ab") as f:
        f.write(b"\0")
    failing(capsys, [*base, "--rows", edited], "is not the")
    failing(capsys, ["record", "--rows", out, "--split", "smoke", "--model", tmp_path,
                     "--out", target], "--model")  # fmt: skip
    failing(capsys, [*base, "--rows", out, "--context", 20], "no chosen row fits a context of 20")
    assert not target.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edited", "partial"]


def test_a_template_that_cannot_render_a_row_names_the_row(out, model, tmp_path, capsys):
    broken = tmp_path / "broken"
    import shutil

    shutil.copytree(model, broken)
    (broken / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m.role == 'user' %}{{ raise_exception('no users') }}"
        "{% endif %}{% endfor %}"
    )
    line = failing(capsys, ["record", "--rows", out, "--split", "smoke", "--model", broken, *ROWS,
                            "--out", tmp_path / "t.parquet"], "cannot render row")  # fmt: skip
    assert "openai/gsm8k@" in line and "no users" in line


def corrupt(ref, tmp_path, change, name="bad.parquet"):
    t = pq.read_table(ref)
    path = tmp_path / name
    pq.write_table(change(t), path, use_compliant_nested_type=False)
    return path


def with_meta(t, meta):
    return t.replace_schema_metadata(meta)


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda t: t.drop_columns(["top_ids"]), "no column `top_ids`"),
        (lambda t: t.set_column(1, "pos", t["pos"].cast(pa.int64())), "column `pos` is int64"),
        (lambda t: with_meta(t, {}), "no `decode`"),
        (lambda t: with_meta(t, {b"decode": b"x"}), "not a count"),
        (lambda t: t.filter(pa.compute.not_equal(t["pos"], 3)), "gap"),
        (
            lambda t: t.set_column(0, "prompt", pa.compute.add(t["prompt"], 1).cast(pa.int32())),
            "numbered 0..",
        ),
        (
            lambda t: t.set_column(
                2,
                "token",
                pa.compute.if_else(
                    pa.compute.is_valid(t["producer"]), pa.compute.add(t["token"], 1), t["token"]
                ).cast(pa.int32()),
            ),
            "has token",
        ),
    ],
)
def test_a_corpus_that_is_not_a_trace_is_refused(ref, model, tmp_path, capsys, change, words):
    bad = corrupt(ref, tmp_path, lambda t: with_meta(change(t), t.schema.metadata)
                  if words not in ("no `decode`", "not a count") else change(t))  # fmt: skip
    target = tmp_path / "t.parquet"
    failing(capsys, ["record", "--corpus", bad, "--model", model, "--producer", "x",
                     "--out", target], words)  # fmt: skip
    assert not target.exists()


def test_a_producer_already_there_needs_replace(ref, model, tmp_path, capsys):
    target = tmp_path / "t.parquet"
    again = ["--corpus", ref, "--model", model, "--producer", "reference", "--out", target]
    failing(capsys, ["record", *again], "already has producer 'reference'")
    assert record(*again, "--replace") == 0
    assert list(read_trace(target).producers) == ["reference"]


@pytest.fixture(scope="session")
def nan_model(model, tmp_path_factory):
    """The tiny model with one output row of NaN: every logits row it gives holds a NaN."""
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp("nan") / "nan"
    m = AutoModelForCausalLM.from_pretrained(model)
    with torch.no_grad():
        m.lm_head.weight[3] = float("nan")
    m.save_pretrained(path)
    for f in Path(model).glob("*"):
        if "token" in f.name or f.name == "chat_template.jinja":
            (path / f.name).write_bytes(f.read_bytes())
    return path


def test_nan_logits_are_refused_at_the_engine_boundary_never_a_crash(ref, nan_model, tmp_path,
                                                                    capsys):  # fmt: skip
    """An engine whose logits are NaN gives no trace: one line names the first prompt and
    position, nothing is written (a trace of another tool's holding NaN is judged FAIL)."""
    target = tmp_path / "nan.parquet"
    line = failing(capsys, ["record", "--corpus", ref, "--model", nan_model, "--producer", "nan",
                            "--out", target], "gave log-probabilities that are not finite")  # fmt: skip
    first = read_trace(ref).schedule(0).ctx - 1
    assert f"at prompt 0 position {first}," in line and "nothing was written" in line
    assert not target.exists()
    failing(
        capsys, ["judge", ref, "--model", nan_model], "not finite (NaN or infinite) at prompt 0"
    )


# ---- the judge: the estimator ------------------------------------------------------------------


def stored(lp):
    """Log-probabilities as a trace stores them (float32; the judge computes on those), each
    rounded down: the little mass that rounding takes is a token outside the vocabulary that no
    table keeps, so the exact KL over the vocabulary and that token is still a KL."""
    lp32 = lp.astype(np.float32)
    return np.where(lp32 > lp, np.nextafter(lp32, np.float32(-np.inf)), lp32).astype(np.float64)


def random_lp(rng, n, v):
    logits = rng.normal(0, rng.uniform(0.5, 4), (n, v))
    return stored(logits - np.logaddexp.reduce(logits, 1, keepdims=True))


def table(lp, k):
    ids = np.argsort(-lp, 1, kind="stable")[:, :k].astype(np.int32)
    n = len(lp)
    return Scores(np.zeros(n, np.int32), np.arange(n, dtype=np.int32), np.zeros(n),
                        ids, np.take_along_axis(lp, ids, 1))  # fmt: skip


def exact_kl(p, q):
    """Over the vocabulary and the token that holds what rounding took (see `stored`)."""
    rest_p, rest_q = 1 - np.exp(p).sum(1), 1 - np.exp(q).sum(1)
    return (np.exp(p) * (p - q)).sum(1) + rest_p * np.log(rest_p / rest_q)


@pytest.mark.parametrize("seed", range(6))
def test_every_estimate_is_a_lower_bound_exact_at_full_k_and_closer_as_k_grows(seed):
    rng = np.random.default_rng(seed)
    v = int(rng.integers(3, 60))
    p = random_lp(rng, 40, v)
    q = p + rng.normal(0, rng.uniform(0.01, 1.5), p.shape)
    q = stored(q - np.logaddexp.reduce(q, 1, keepdims=True))
    exact, reverse = exact_kl(p, q), exact_kl(q, p)
    prev_shared = prev_against = np.zeros(len(p))
    for k in range(2, v + 1):
        a, b = table(p, k), table(q, k)
        shared = compare.compare(a, b)
        against = compare.compare(a, b, np.take_along_axis(q, a.ids, 1))
        for est in (shared, against):
            assert (est.kl <= exact + 1e-9).all() and (est.kl_reverse <= reverse + 1e-9).all()
        assert (against.kl >= shared.kl - 1e-9).all()  # the finer partition is tighter
        assert (shared.kl >= prev_shared - 1e-9).all() and (against.kl >= prev_against - 1e-9).all()
        prev_shared, prev_against = shared.kl, against.kl
    assert np.allclose(shared.kl, exact, atol=1e-9) and np.allclose(against.kl, exact, atol=1e-9)
    assert np.allclose(shared.kl_reverse, reverse, atol=1e-9)


def test_kl_of_a_table_with_itself_is_zero_and_a_non_finite_value_is_infinite():
    rng = np.random.default_rng(0)
    a = table(random_lp(rng, 5, 30), 20)
    assert (compare.compare(a, a).kl == 0).all()
    b = table(random_lp(rng, 5, 30), 20)
    b.logprob[2, 0] = np.nan
    b.logprob[3, np.flatnonzero(~np.isin(b.ids[3], a.ids[3]))[0]] = -np.inf  # a token a lacks
    kl = compare.compare(a, b).kl
    assert np.isinf(kl[[2, 3]]).all() and np.isfinite(kl[[0, 1, 4]]).all()


def all_pairs(a, b):
    """The plain definition of what `measure` finds by sorting: every id of a against every id
    of b, then the estimator over a's tokens in a's order."""
    la, lb = (compare.float32(x.logprob).astype(np.float64) for x in (a, b))
    eq = a.ids[:, :, None] == b.ids[:, None, :]
    kept = eq.any(2)
    lb_at_a = np.where(kept, np.take_along_axis(lb, eq.argmax(2), 1), 0.0)
    kl, kl_rev = compare.coarse_kl(np.where(kept, la, 0.0), lb_at_a, kept)
    bad = ~(np.isfinite(la).all(1) & np.isfinite(lb).all(1))
    rank = np.where(eq[:, 0].any(1), eq[:, 0].argmax(1) + 1, 0)
    return np.where(bad, np.inf, kl), np.where(bad, np.inf, kl_rev), rank, kept.mean(1)


@pytest.mark.parametrize("seed", range(8))
def test_the_sorted_match_is_the_all_pairs_definition(seed):
    """Tables of other lengths, sharing anything from every token to none, in any order."""
    rng = np.random.default_rng(seed)
    v, n = int(rng.integers(4, 300)), 3000
    ka, kb = (int(rng.integers(2, min(v, 40) + 1)) for _ in range(2))
    p = random_lp(rng, n, v)
    q = stored(nudged(p, rng.uniform(0, 2), rng))
    a, b = table(p, ka), table(q, kb)
    a.logprob[rng.random(a.logprob.shape) < 1e-3] = rng.choice([np.nan, -np.inf, np.inf])
    c = compare.compare(a, b)
    kl, kl_rev, rank, overlap = all_pairs(a, b)
    assert np.allclose(c.kl, kl, rtol=1e-12, atol=1e-15) and np.array_equal(
        np.isinf(c.kl), np.isinf(kl)
    )
    assert np.allclose(c.kl_reverse, kl_rev, rtol=1e-12, atol=1e-15)
    assert np.array_equal(c.rank, rank) and np.allclose(c.overlap, overlap)


def test_the_judges_numbers_do_not_depend_on_the_number_of_threads():
    rng = np.random.default_rng(7)
    p = random_lp(rng, 3 * compare.CHUNK_ROWS + 5, 60)
    a, b = table(p, 20), table(stored(nudged(p, 0.3, rng)), 20)
    one, three = compare.compare(a, b, threads=1), compare.compare(a, b, threads=3)
    for f in compare.Compared.__slots__:
        assert np.array_equal(getattr(one, f), getattr(three, f)), f


def test_a_top_k_list_that_names_a_token_twice_or_a_negative_id_is_refused(tmp_path, capsys):
    rng = np.random.default_rng(8)
    lp = sharp(rng)
    ref = write(tmp_path / "ref.parquet", data_trace({"a": producer(lp)}))
    twice = producer(nudged(lp, 1e-3, rng))
    twice.ids[13, 2] = twice.ids[13, 0]
    cand = write(tmp_path / "cand.parquet", data_trace({"c": twice}))
    failing(capsys, ["judge", ref, "--candidate", cand],
            f"producer 'c' lists id {twice.ids[13, 0]} twice at prompt 1 position 13")  # fmt: skip
    negative = producer(nudged(lp, 1e-3, rng))
    negative.ids[4, 3] = -7
    cand = write(tmp_path / "negative.parquet", data_trace({"c": negative}))
    failing(capsys, ["judge", ref, "--candidate", cand], "prompt 0 position 14 lists a negative")


# ---- the judge: every verdict through tables that are data -------------------------------------


def producer(lp, k=5):
    """A producer's table of two prompts of 10 scored positions each, from log-probs [20, v]."""
    s = table(lp, k)
    s.prompt = np.repeat(np.arange(2, dtype=np.int32), 10)
    s.pos = np.tile(np.arange(10, 20, dtype=np.int32), 2)
    s.ref_logprob = s.logprob[:, 1]
    return s


def data_trace(producers):
    prompts = [Prompt(np.arange(21, dtype=np.int32), f"r#{i}", "gsm8k", i, 11)
               for i in range(2)]  # fmt: skip
    return Trace(prompts, 9, producers)


def nudged(lp, scale, rng):
    q = lp + rng.normal(0, scale, lp.shape)
    return q - np.logaddexp.reduce(q, 1, keepdims=True)


def sharp(rng):
    """Confident distributions: top-1/top-2 margins of about 2 nats."""
    lp = np.log(np.full((20, 30), 0.3 / 29))
    lp[np.arange(20), rng.integers(0, 30, 20)] = np.log(0.7)
    return lp


def judged(producers, cand, limit=compare.LIMIT_KL):
    return compare.judge(data_trace(producers), cand, limit=limit)


def test_band_verdicts():
    rng = np.random.default_rng(0)
    lp = sharp(rng)
    refs = {"a": producer(lp), "b": producer(nudged(lp, 1e-4, rng))}
    assert judged(refs, producer(nudged(lp, 1e-4, rng)))["verdict"].word == "PASS"
    assert judged(refs, refs["a"])["verdict"].code == 0
    flipped = lp.copy()
    flipped[5] = np.roll(lp[5], 1)  # a confident token moved
    v = judged(refs, producer(flipped))["verdict"]
    assert (v.code, v.word) == (1, "FAIL") and "confident argmax flip at prompt 0 pos 15" in v.why
    v = judged(refs, producer(nudged(lp, 0.05, rng)))["verdict"]
    assert v.word == "FAIL" and "beyond the band" in v.why and "KL p50" in v.why


def test_a_flip_rate_above_the_band_fails_even_below_its_margin():
    rng = np.random.default_rng(1)
    lp = sharp(rng)
    tied = lp.copy()
    top2 = np.argsort(-lp, 1)[:, :2]
    tied[np.arange(20), top2[:, 1]] = lp[np.arange(20), top2[:, 0]] - 1e-3  # margins of 1e-3
    tied -= np.logaddexp.reduce(tied, 1, keepdims=True)  # log-probabilities again: sum 1
    b = tied.copy()
    b[0, top2[0]] = b[0, top2[0][::-1]]  # producers flip once, at margin 1e-3
    refs = {"a": producer(tied), "b": producer(b)}
    cand = tied.copy()
    for i in range(6):
        cand[i, top2[i]] = cand[i, top2[i][::-1]]
    j = judged(refs, producer(cand))
    assert j["band"].flip_rate == pytest.approx(1 / 20) and j["verdict"].word == "FAIL"
    assert "flip rate 30.00%" in j["verdict"].why and "confident" not in j["verdict"].why


def test_one_producer_verdicts_use_the_kl_limit():
    rng = np.random.default_rng(2)
    lp = sharp(rng)
    refs = {"a": producer(lp)}
    close = producer(nudged(lp, 1e-3, rng))
    assert judged(refs, close)["verdict"].code == 0
    v = judged(refs, close, limit=1e-12)["verdict"]  # no flip, KL beyond a tiny limit
    assert (v.code, v.word) == (2, "INCONCLUSIVE")
    far = nudged(lp, 0.3, rng)
    far[np.arange(20), np.argmax(lp, 1)] -= 5  # every argmax moves, KL far beyond the limit
    full = {"a": np.take_along_axis(far, refs["a"].ids, 1)}  # the candidate's full logits
    j = compare.judge(data_trace(refs), producer(far), full)
    assert j["estimator"] == "against"
    assert (j["verdict"].code, j["verdict"].word) == (1, "FAIL")
    assert "confident argmax flip at prompt 0 pos 10" in j["verdict"].why


def test_drift_is_the_first_step_the_trailing_kl_stays_above():
    kl = np.r_[np.full(40, 1e-8), np.full(30, 1e-3), np.full(100, 1e-2)]
    assert compare.left_at(kl, 1e-6) == 41
    assert compare.left_at(np.full(50, 1e-8), 1e-6) is None
    assert compare.left_at(np.full(50, 1.0), 1e-6) == 1
    bump = np.r_[np.full(40, 1e-8), np.full(5, 1.0), np.full(100, 1e-8)]
    assert compare.left_at(bump, 1e-6) is None  # it came back: not drift


# ---- the judge on files: bad input ---------------------------------------------------------------


def write(path, trace):
    """A trace as data written as this tool writes one, unchecked: damaged ones too."""
    write_parquet(path, trace.decode, trace.meta, trace_tables(trace))
    return path


def test_judge_refuses_what_it_cannot_judge(tmp_path, capsys):
    rng = np.random.default_rng(3)
    lp = sharp(rng)
    ref = write(tmp_path / "ref.parquet", data_trace({"a": producer(lp)}))
    cand = write(tmp_path / "cand.parquet", data_trace({"c": producer(nudged(lp, 1e-3, rng))}))
    other = data_trace({"c": producer(lp)})
    other.prompts[1].tokens = other.prompts[1].tokens.copy()
    other.prompts[1].tokens[17] += 1
    # a producer row's token follows the corpus, so only the corpus differs
    differ = write(tmp_path / "differ.parquet", other)
    failing(capsys, ["judge", ref, "--candidate", differ], "prompt 1 position 17")
    fewer = data_trace({"c": producer(lp).take(producer(lp).prompt == 0)})
    fewer.prompts = fewer.prompts[:1]
    fewer = write(tmp_path / "fewer.parquet", fewer)
    failing(capsys, ["judge", ref, "--candidate", fewer], "has 1 prompts, ")
    failing(capsys, ["judge", ref, "--candidate", cand, "--producer", "zz"], "no producer 'zz'")
    empty = write(tmp_path / "empty.parquet", data_trace({}))
    failing(capsys, ["judge", empty, "--candidate", cand], "has no producer")
    short = producer(lp, k=2)
    short.ids, short.logprob = short.ids[:, :1], short.logprob[:, :1]
    failing_file = write(tmp_path / "k1.parquet", data_trace({"c": short}))
    failing(capsys, ["judge", ref, "--candidate", failing_file], "at least 2")
    elsewhere = producer(lp)
    keep = elsewhere.prompt == 0
    a_only = write(tmp_path / "a0.parquet", data_trace({"a": elsewhere.take(keep)}))
    c_only = write(tmp_path / "c1.parquet", data_trace({"c": elsewhere.take(~keep)}))
    failing(capsys, ["judge", a_only, "--candidate", c_only], "share no scored position")
    lengths = {}
    for n, trace in ((16, data_trace({"a": producer(lp)})), (512, data_trace({"c": producer(lp)}))):
        trace.meta = {"length": n}
        lengths[n] = write(tmp_path / f"length{n}.parquet", trace)
    failing(capsys, ["judge", lengths[512], "--candidate", lengths[16]],
            f"{lengths[16]} was recorded with length 16, {lengths[512]} with 512")  # fmt: skip


def same_trace(x, y):
    assert (x.decode, x.meta, list(x.producers)) == (y.decode, y.meta, list(y.producers))
    assert [p.tokens.tolist() for p in x.prompts] == [p.tokens.tolist() for p in y.prompts]
    for name in x.producers:
        for f in Scores.__slots__:
            a, b = getattr(x.producers[name], f), getattr(y.producers[name], f)
            assert a.dtype == b.dtype and np.array_equal(a, b), (name, f)


@pytest.mark.parametrize("seed", range(6))
def test_a_trace_reads_and_judges_the_same_whatever_its_row_order_and_groups(
    tmp_path, capsys, seed
):
    """This tool's layout streams prompt by prompt; row groups that cut a prompt anywhere, kern's
    corpus-then-producers order and rows in no order at all give the same trace and verdict."""
    rng = np.random.default_rng(seed)
    lp = sharp(rng)
    refs = {"a": producer(lp), "b": producer(nudged(lp, 1e-4, rng))}
    ref = write(tmp_path / "ref.parquet", data_trace(refs))
    cand = write(tmp_path / "cand.parquet", data_trace({"c": producer(nudged(lp, 0.02, rng))}))
    t = pq.read_table(ref)
    groups = int(rng.integers(1, 40))
    orders = {
        "groups": t,
        "kern": t.sort_by(
            [("producer", "ascending", "at_start"), ("prompt", "ascending"), ("pos", "ascending")]
        ),
        "shuffled": t.take(rng.permutation(t.num_rows)),
    }
    assert score.main(["judge", str(ref), "--candidate", str(cand)]) == 1
    report = capsys.readouterr().out
    for label, table in orders.items():
        other = tmp_path / f"{label}.parquet"
        pq.write_table(table, other, row_group_size=groups, use_compliant_nested_type=False)
        same_trace(read_trace(other), read_trace(ref))
        assert score.main(["judge", str(other), "--candidate", str(cand)]) == 1
        assert capsys.readouterr().out == report.replace(str(ref), str(other)), label


def test_a_judge_that_stops_early_leaves_no_thread_reading_behind(tmp_path, capsys):
    lp = np.tile(sharp(np.random.default_rng(9)), (4, 1))
    s = table(lp, 5)
    s.prompt, s.pos = np.repeat(np.arange(8, dtype=np.int32), 10), np.tile(np.arange(10, 20), 8)
    s.ref_logprob = s.logprob[:, 1]
    prompts = [Prompt(np.arange(21, dtype=np.int32)) for _ in range(8)]
    ref = write(tmp_path / "ref.parquet", Trace(prompts, 9, {"a": s}))
    prompts[0] = Prompt(np.arange(1, 22, dtype=np.int32))  # differs at once
    cand = write(tmp_path / "cand.parquet", Trace(prompts, 9, {"c": s}))
    before = threading.active_count()
    failing(capsys, ["judge", ref, "--candidate", cand], "prompt 0 position 0")
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    # both readers ended, seven prompts unread
    assert threading.active_count() == before, f"threads left 10 s on: {threading.enumerate()}"


def test_a_damaged_trace_is_one_line(tmp_path, capsys):
    rng = np.random.default_rng(10)
    ref = write(tmp_path / "ref.parquet", data_trace({"a": producer(sharp(rng))}))
    (tmp_path / "text.parquet").write_text("not parquet")
    failing(capsys, ["judge", tmp_path / "text.parquet", "--candidate", ref],
            "cannot read it as parquet")  # fmt: skip
    data = bytearray(ref.read_bytes())
    data[4:400] = bytes(396)  # the first row group's pages, zeroed; the footer intact
    (tmp_path / "zeroed.parquet").write_bytes(data)
    # against another producer: a file is never judged against the candidate's own producer
    other = write(tmp_path / "other.parquet", data_trace({"b": producer(sharp(rng))}))
    failing(capsys, ["judge", other, "--candidate", tmp_path / "zeroed.parquet"],
            "cannot read it as parquet")  # fmt: skip


def test_unequal_top_k_lengths_are_refused(tmp_path, capsys):
    rng = np.random.default_rng(4)
    ref = write(tmp_path / "ref.parquet", data_trace({"a": producer(sharp(rng))}))
    t = pq.read_table(ref)
    ids = t["top_ids"].to_pylist()
    j = next(i for i, x in enumerate(ids) if x is not None)
    ids[j] = ids[j][:3]
    bad = corrupt(
        ref,
        tmp_path,
        lambda t: t.set_column(5, t.schema.field(5), pa.array(ids, t.schema.field(5).type)),
    )
    # a candidate of another name: a file is never judged against the candidate's own producer
    cand = write(tmp_path / "cand.parquet", data_trace({"c": producer(sharp(rng))}))
    failing(capsys, ["judge", bad, "--candidate", cand], "differ in length")


def test_a_candidate_missing_positions_is_judged_on_what_both_have(tmp_path, capsys):
    rng = np.random.default_rng(5)
    lp = sharp(rng)
    ref = write(tmp_path / "ref.parquet", data_trace({"a": producer(lp)}))
    part = producer(nudged(lp, 1e-4, rng))
    cand = write(tmp_path / "cand.parquet", data_trace({"c": part.take(part.pos < 15)}))
    assert score.main(["judge", str(ref), "--candidate", str(cand)]) == 0
    report = capsys.readouterr().out
    assert "judged on 10 positions (10 the candidate lacks)" in report


def test_json_out_and_plot(tmp_path, capsys):
    import orjson

    rng = np.random.default_rng(6)
    lp = sharp(rng)
    ref = write(tmp_path / "ref.parquet", data_trace({"a": producer(lp), "b": producer(lp)}))
    cand = write(tmp_path / "cand.parquet", data_trace({"c": producer(nudged(lp, 0.05, rng))}))
    argv = ["judge", str(ref), "--candidate", str(cand), "--json", "--out",
            str(tmp_path / "pos.parquet"), "--plot", str(tmp_path / "p.png")]  # fmt: skip
    code = score.main(argv)
    text = capsys.readouterr().out
    body, last = text.rsplit("\n", 2)[0], text.strip().splitlines()[-1]
    j = orjson.loads(body)
    assert code == 1 == j["verdict"]["code"] and last.startswith("FAIL")
    assert set(j) == {"summary", "band", "strata", "drift", "flips", "verdict"}
    assert j["strata"]["a"]["phase decode"]["positions"] == 18
    positions = pq.read_table(tmp_path / "pos.parquet")
    assert positions.num_rows == 40 and set(positions["producer"].to_pylist()) == {"a", "b"}
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- the demonstration the card promises ---------------------------------------------------------


class OffByOne(Transformers):
    """A deliberate bug: decode positions one past where they are."""

    def forward(self, ids):
        if self.cache is None or self.cache.get_seq_length() == 0 or len(ids) > 1:
            return super().forward(ids)
        at = self.cache.get_seq_length() + 1
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([ids]), cache=self.cache, use_cache=True,
                             position_ids=torch.tensor([[at]]))  # fmt: skip
            return out.logits[0, -1]


@pytest.fixture(scope="module")
def demo(out, model, tmp_path_factory):
    """Two float32 references that differ in prefill chunking, over 512 decode steps of two
    standard rows; a candidate that stores its recurrent state in bf16."""
    d = tmp_path_factory.mktemp("demo")
    ref, cand = d / "ref.parquet", d / "bf16.parquet"
    assert record("--rows", out, "--split", "standard", "--model", model, "--out", ref, *ROWS,
                  "--first", 2) == 0  # fmt: skip
    assert record("--corpus", ref, "--model", model, "--producer", "chunk64", "--chunk", 64,
                  "--out", ref) == 0  # fmt: skip
    assert record("--corpus", ref, "--model", model, "--producer", "bf16-state",
                  "--state-dtype", "bfloat16", "--out", cand) == 0  # fmt: skip
    return ref, cand


def test_a_bf16_state_stays_in_the_band_at_first_and_leaves_it_as_decode_goes_on(demo, capsys):
    ref, cand = demo
    plot = ref.parent / "drift.png"
    code = score.main(["judge", str(ref), "--candidate", str(cand), "--producer", "bf16-state",
                       "--plot", str(plot)])  # fmt: skip
    report = capsys.readouterr().out.splitlines()
    assert code == 1 and report[-1].startswith("FAIL")
    j = compare.judge(read_trace(ref), read_trace(cand).producers["bf16-state"])
    left = j["drift"]["overall"]
    assert left is not None and left > 32  # not at once: the error builds up
    early = j["strata"]["chunk64"]["decode steps 1-64"]
    late = j["strata"]["chunk64"]["decode steps 65-512"]
    assert early["kl_p50"] <= j["band"].kl_p50 and late["kl_p50"] > j["band"].kl_p50
    assert early["confident"] == 0
    assert any(line.startswith(f"drift against chunk64: left at decode step {left}")
               for line in report)  # fmt: skip
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_the_reference_judged_against_itself_passes(demo, capsys):
    """Against its own file's other producer alone: the candidate is never in its own band."""
    ref, _ = demo
    assert score.main(["judge", str(ref), "--candidate", str(ref), "--producer", "reference"]) == 0
    report = capsys.readouterr().out.splitlines()
    assert "producers chunk64 (reference, the candidate's, left out)" in report[0]
    assert report[-1].startswith("PASS within KL 1e-02 of chunk64")


def test_decode_positions_off_by_one_fail_with_a_confident_flip_where_decode_starts(demo, model):
    ref = read_trace(demo[0])
    cand, full, _ = recording.candidate(recording.fed(OffByOne(str(model)), "OffByOne", ref, model))
    j = compare.judge(ref, cand, full)
    assert j["estimator"] == "shared"  # the band's estimator, also with full logits at hand
    assert j["verdict"].word == "FAIL" and "confident argmax flip" in j["verdict"].why
    c = j["results"]["chunk64"]
    # it leaves the reference where the bug starts: at the first decode step, in every prompt
    assert set(j["drift"]["per_prompt"].values()) == {1}
    prefill = c.pos == np.array([ref.schedule(int(i)).ctx - 1 for i in c.prompt])
    assert not c.flip[prefill].any()  # prefill is untouched by the bug


def test_the_published_cards_score_commands_are_score_pys(out):
    """The card names record and judge as the way to score an engine: its commands parse."""
    import shlex

    card = (out / "README.md").read_text(encoding="utf-8").replace("\\\n", " ")
    commands = [line for line in card.splitlines() if line.startswith("python score.py ")]
    assert {shlex.split(c)[2] for c in commands} == {"record", "judge"}
    for c in commands:
        score.parse_args(shlex.split(c)[2:])
