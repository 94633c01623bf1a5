"""Plausible one-line bugs of the scoring package, each caught by behaviour (issue 34, "Tests that
catch real bugs in the scoring package"): the band read from every ordered pair of reference
producers, a KL limit and the band's edges as limits that pass at equality, the strata's bucket
edges, the drift window of 16 decode steps read against the band's p99, the shards and scored
positions a trace may hold, the sampler renormalised after the stop ids leave, a token id at the
vocabulary's size, and an in-process transformers candidate judged against an exact KL computed
here from full distributions. Each is compared with a plain definition written in the test, on
tables that are data (docs/testing.md "Mutation score of the scoring package")."""

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_score import data_trace, nudged, producer, record, sharp, table

import score
from scoring import compare
from scoring.boundary import in_vocabulary, same_vocabulary
from scoring.engines import normalised, sample, scores_of, top_k, uniforms, vocabulary_id
from scoring.record import reference_k, whole_run
from scoring.trace import (
    Prompt,
    Schedule,
    ScoreError,
    Scores,
    Trace,
    concat_scores,
    corpus_sha256,
    meta_error,
    prompt_tables,
    read_trace,
    slice_scores,
    trace_tables,
    write_parquet,
    write_trace,
)

WINDOW = 16  # docs/scoring.md: drift is read from the trailing mean of 16 decode steps


# ---- plain definitions -------------------------------------------------------------------------


def plain_quantile(v, q):
    """kern's quantile: the sorted values at index round((n - 1) q)."""
    v = np.sort(np.asarray(v, np.float64))
    return float(v[round((len(v) - 1) * q)]) if len(v) else 0.0


def plain_band(producers):
    """Over every ordered pair (x, y) of reference producers, x's argmax flipped by y: the
    largest margin of x where it flipped, the flip rate, and KL(x || y)'s p50 and p99 (at least
    1e-6), each the widest of all pairs."""
    margin, rate, p50, p99 = 0.0, 0.0, 1e-6, 1e-6
    for x in producers:
        for y in producers:
            if x == y:
                continue
            c = compare.compare(producers[x], producers[y])
            margin = max([margin, *c.margin[c.flip]])
            rate = max(rate, c.flip.mean())
            p50, p99 = max(p50, plain_quantile(c.kl, 0.5)), max(p99, plain_quantile(c.kl, 0.99))
    return margin, rate, p50, p99


def lopsided(rng, n=20, v=30):
    """A producer and another that is sharp where it is broad: KL one way is far from the
    other way, and margins differ on the two sides."""
    a = nudged(rng.normal(0, 0.3, (n, v)), 0, rng)
    b = a.copy()
    top = rng.integers(0, v, n)
    b[np.arange(n), top] += rng.uniform(1, 4, n)
    return a, nudged(b, 0, rng)


def judged(producers, cand, limit=compare.LIMIT_KL, full=None, trace=None):
    return compare.judge(trace or data_trace(producers), cand, full, limit=limit)


# ---- the band: every ordered pair --------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_the_band_is_the_widest_of_every_ordered_pair_of_producers(seed):
    rng = np.random.default_rng(seed)
    n_refs = 2 + seed % 2
    a, b = lopsided(rng)
    lps = [a, b, nudged(a, 0.5, rng)][:n_refs]
    order = rng.permutation(n_refs)  # which producer gets which name: the lopsided side moves
    refs = {"abc"[i]: producer(lps[j], 10) for i, j in enumerate(order)}
    j = judged(refs, producer(nudged(a, 0.01, rng), 10))
    got = j["band"]
    want = plain_band(refs)
    assert (got.margin, got.flip_rate) == pytest.approx(want[:2], rel=1e-12, abs=0)
    assert (got.kl_p50, got.kl_p99) == pytest.approx(want[2:], rel=1e-12, abs=0)


def test_a_lopsided_pair_widens_the_band_from_its_reverse_side():
    """b is sharp where a is broad: KL(b || a) is above KL(a || b) and only the reverse side
    holds the band's p99; the pair is compared once, in name order."""
    rng = np.random.default_rng(0)
    a, b = lopsided(rng)
    broad, sharp_ = producer(a, 30), producer(b, 30)
    wide = plain_quantile(compare.compare(sharp_, broad).kl, 0.99)
    assert wide > 1.5 * plain_quantile(compare.compare(broad, sharp_).kl, 0.99)
    for names in ("ab", "ba"):  # the sharp producer first in name order, then second
        refs = dict(zip(names, (sharp_, broad)))
        assert judged(refs, broad)["band"].kl_p99 == pytest.approx(wide, rel=1e-12)


# ---- limits are limits: equality passes --------------------------------------------------------


def test_a_kl_exactly_at_the_limit_passes_and_just_above_is_inconclusive():
    rng = np.random.default_rng(1)
    lp = sharp(rng)
    refs = {"a": producer(lp)}
    cand = producer(nudged(lp, 1e-2, rng))
    kl = judged(refs, cand)["results"]["a"].kl
    top = float(kl.max())
    v = judged(refs, cand, limit=top)["verdict"]
    assert (v.code, v.word) == (0, "PASS")
    below = float(np.nextafter(top, 0))
    v = judged(refs, cand, limit=below)["verdict"]
    assert (v.code, v.word) == (2, "INCONCLUSIVE")
    assert v.why == (f"KL up to {top:.1e} (limit {below:.0e}) against a with no confident flip "
                     "on 20 positions; record a second reference producer to make a band"
                     )  # fmt: skip


def test_a_flip_at_exactly_the_limit_is_not_confident_one_just_below_is():
    """One producer: a flip fails when its KL is beyond the limit, not at it."""
    rng = np.random.default_rng(2)
    lp = sharp(rng)
    flipped = lp.copy()
    flipped[3] = np.roll(lp[3], 1)  # the confident token moved: KL far above 0 there
    refs, cand = {"a": producer(lp, 30)}, producer(flipped, 30)
    kl = judged(refs, cand)["results"]["a"].kl
    at = float(kl[3])
    assert at == kl.max() and at > 0.1
    v = judged(refs, cand, limit=at)["verdict"]
    assert v.word == "PASS"
    v = judged(refs, cand, limit=float(np.nextafter(at, 0)))["verdict"]
    assert v.word == "FAIL" and "confident argmax flip at prompt 0 pos 13" in v.why


def test_a_candidate_equal_to_a_reference_producer_is_inside_the_band_at_its_edges():
    """The candidate is producer b itself: its flip rate, KL p50 and p99 against a are the
    band's own (equal, not beyond), and its flips are at margins the band holds."""
    rng = np.random.default_rng(3)
    lp = sharp(rng)
    b = lp.copy()
    top2 = np.argsort(-lp, 1)[:, :2]
    for i in (2, 7, 15):  # b flips a's argmax at three positions
        b[i, top2[i]] = b[i, top2[i][::-1]]
    refs = {"a": producer(lp), "b": producer(nudged(b, 0.02, rng))}
    j = judged(refs, refs["b"])
    c = j["results"]["a"]
    assert c.flip.sum() == 3 and c.margin[c.flip].max() == j["band"].margin
    assert c.flip.mean() == j["band"].flip_rate
    assert plain_quantile(c.kl, 0.99) <= j["band"].kl_p99
    assert j["verdict"].word == "PASS", j["verdict"].why


def test_one_flip_more_than_the_band_or_a_kl_quantile_above_it_fails():
    rng = np.random.default_rng(4)
    lp = sharp(rng)
    refs = {"a": producer(lp), "b": producer(nudged(lp, 0.01, rng))}
    band = judged(refs, refs["a"])["band"]
    assert band.flip_rate == 0 and band.margin == 0
    tied = lp.copy()
    top2 = np.argsort(-lp, 1)[:, :2]
    tied[5, top2[5, 1]] = tied[5, top2[5, 0]] + 1e-9  # a flip at a margin the band does not hold
    v = judged(refs, producer(nudged(tied, 0, rng)))["verdict"]
    assert v.word == "FAIL" and "confident argmax flip at prompt 0 pos 15" in v.why


# ---- strata: every bucket from its first step to its last --------------------------------------


def long_trace(rng, lengths, decode, k=4, v=12, scale=None):
    """A trace of prompts of `lengths` tokens, one producer scoring every position, and a
    candidate: (trace, candidate)."""
    prompts = [Prompt(rng.integers(0, v, n).astype(np.int32), f"r#{i}", "abc"[i % 3], i, 0)
               for i, n in enumerate(lengths)]  # fmt: skip
    parts = {"ref": [], "cand": []}
    for i, p in enumerate(prompts):
        pos = np.asarray(Schedule.of(len(p.tokens), decode).positions, np.int32)
        lp = nudged(rng.normal(0, 2, (len(pos), v)), 0, rng)
        far = rng.uniform(0, 0.3) if scale is None else scale
        for name, x in (("ref", lp), ("cand", nudged(lp, far, rng))):
            s = table(x, k)
            s.prompt, s.pos = np.full(len(pos), i, np.int32), pos
            parts[name].append(s)
    ref, cand = (concat_scores(parts[n]) for n in ("ref", "cand"))
    return Trace(prompts, decode, {"ref": ref}), cand


def plain_steps(trace, c):
    """Each compared position's decode step, by counting the prompt's scored positions."""
    first = {i: trace.schedule(i).positions[0] for i in range(len(trace.prompts))}
    return np.array([p - first[i] for i, p in zip(c.prompt, c.pos)])


def test_every_decode_step_and_depth_bucket_holds_exactly_its_positions():
    """Decode steps 1 to 600 and depths across 2,048: each bucket's first and last step are in
    it, the steps beside them are not; the statistics are those of exactly its positions."""
    rng = np.random.default_rng(5)
    trace, cand = long_trace(rng, [610, 20, 2_100, 3], decode=600)
    j = compare.judge(trace, cand)
    c = j["results"]["ref"]
    strata = j["strata"]["ref"]
    step = plain_steps(trace, c)
    depth = c.pos.astype(np.int64) + 1
    assert depth.max() > 2_049 and step.max() == 600
    want = {"all": np.ones(len(step), bool), "phase prefill": step == 0, "phase decode": step > 0}
    for lo, hi in ((1, 64), (65, 512), (513, 4_096), (4_097, 16_384)):
        want[f"decode steps {lo:,}-{hi:,}"] = (step >= lo) & (step <= hi)
    for lo, hi in ((1, 2_048), (2_049, 16_384), (16_385, 131_072), (131_073, 1_048_576)):
        want[f"depth {lo:,}-{hi:,}"] = (depth >= lo) & (depth <= hi)
    for i, name in enumerate("abc"):
        want[f"source {name}"] = np.isin(c.prompt, np.arange(i, 4, 3))
    want = {k: sel for k, sel in want.items() if sel.any()}
    assert sorted(strata) == sorted(want)
    for key, sel in want.items():
        got = strata[key]
        assert got["positions"] == sel.sum(), key
        assert got["flips"] == c.flip[sel].sum(), key
        assert got["kl_p50"] == plain_quantile(c.kl[sel], 0.5), key
        assert got["kl_p99"] == plain_quantile(c.kl[sel], 0.99), key
        assert got["kl_max"] == c.kl[sel].max(), key
        assert got["kl_mean"] == pytest.approx(c.kl[sel].mean(), rel=1e-12), key
        assert got["kl_reverse_p99"] == plain_quantile(c.kl_reverse[sel], 0.99), key
        assert got["overlap_mean"] == pytest.approx(c.overlap[sel].mean(), rel=1e-6), key
    for lo in (1, 64, 65, 512, 513, 600):  # each bucket's edges hold a position
        assert (step == lo).any()


# ---- drift: 16 decode steps, against the band's p99 -------------------------------------------


def plain_drift_step(kl, threshold):
    """The first step (1-based) from which the mean of the last 16 steps' KL (fewer at the
    start) stays above the threshold; None when it ends within it."""
    means = [np.mean(kl[max(0, s - WINDOW) : s]) for s in range(1, len(kl) + 1)]
    over = [m > threshold for m in means]
    if not over[-1]:
        return None
    s = len(over)
    while s > 1 and over[s - 2]:
        s -= 1
    return s


@pytest.mark.parametrize("seed", range(8))
def test_drift_reads_the_mean_of_exactly_16_steps(seed):
    """A run of high KL as long as the window, or one step shorter or longer, after low KL:
    the trailing mean of 16 steps decides; 15 or 17 would not agree."""
    rng = np.random.default_rng(seed)
    run = WINDOW + int(rng.integers(-1, 2))
    low, high = 1e-8, 1e-5
    kl = np.r_[np.full(int(rng.integers(20, 40)), low), np.full(run, high),
               np.full(int(rng.integers(0, 3)), low)]  # fmt: skip
    threshold = high * (WINDOW - 1.5) / WINDOW  # above only when 15 of the last 16 are high
    got = compare.left_at(kl, threshold)
    assert got == plain_drift_step(kl, threshold)
    means = compare.trailing_mean(kl, WINDOW)
    plain = [np.mean(kl[max(0, s - WINDOW) : s]) for s in range(1, len(kl) + 1)]
    assert np.allclose(means, plain, rtol=1e-12, atol=0)


def test_a_window_of_16_steps_is_not_17():
    kl = np.r_[np.full(30, 0.0), np.full(16, 1.0)]
    assert compare.left_at(kl, 15.5 / 16) == 46  # the 16 steps' mean: 1; with 17 steps 16/17
    assert compare.left_at(np.r_[np.full(30, 0.0), np.full(15, 1.0)], 15.5 / 16) is None
    assert compare.trailing_mean(np.arange(1.0, 41.0), WINDOW)[-1] == np.mean(np.arange(25, 41))


def test_drift_is_read_against_the_bands_p99_not_its_p50():
    """References that agree at most positions and disagree at a few: the band's p50 is far
    below its p99. A candidate whose KL sits between them has not left the band; against the
    p50 it would have, from its first decode step."""
    rng = np.random.default_rng(6)
    n, v = 200, 20
    decode = n - 1  # one prompt of n + 1 tokens: positions 0 (prefill) to n - 1
    lp = nudged(rng.normal(0, 2, (n, v)), 0, rng)
    b = lp.copy()
    few = rng.choice(n, 6, replace=False)
    b[few] = nudged(lp[few], 1.0, rng)  # 3% of positions apart: above p50, inside p99
    tokens = rng.integers(0, v, n + 1).astype(np.int32)
    refs = {}
    for name, x in (("a", lp), ("b", nudged(b, 1e-4, rng))):
        refs[name] = table(x, v)
    cand = table(nudged(lp, 0.03, rng), v)
    trace = Trace([Prompt(tokens)], decode, refs)
    j = compare.judge(trace, cand)
    band = j["band"]
    kl = j["results"]["a"].kl
    assert band.kl_p50 < 10 * band.kl_p50 < plain_quantile(kl, 0.5) < band.kl_p99 / 10
    assert j["drift"]["threshold"] == band.kl_p99
    assert j["drift"]["per_prompt"] == {0: None} and j["drift"]["overall"] is None
    assert compare.left_at(kl[1:], band.kl_p50) == 1  # against the p50: drift from step 1


# ---- what a trace may hold ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "shard,ok",
    [([0, 1], True), ([2, 3], True), ([1, 1], False), ([3, 3], False), ([3, 2], False),
     ([-1, 2], False), ([0, 0], False), ([0, 1, 2], False), ([True, 2], False), ((0, 1), False)],
)  # fmt: skip
def test_a_shard_is_i_of_n_with_i_below_n(shard, ok, tmp_path):
    err = meta_error({"choice": {"shard": shard}})
    assert (err is None) == ok, err
    if not ok and isinstance(shard, list):
        assert err.startswith("`choice.shard` is")
        path = tmp_path / "t.parquet"
        trace = data_trace({})
        write_parquet(path, trace.decode, {"choice": {"shard": shard}}, trace_tables(trace))
        with pytest.raises(ScoreError, match="not \\[I, N\\] with 0 <= I < N"):
            read_trace(path)


@pytest.mark.parametrize(
    "shards,words",
    [([[0, 2], [1, 2]], None), ([[1, 2], [0, 2]], None), ([[0, 1]], None),
     ([[0, 3], [2, 3]], "shard 1/3 missing"), ([[0, 2], [0, 2]], "are both shard 0/2"),
     ([[0, 2], [1, 3]], "shards of one run have one N"), ([[1, 2]], "shard 0/2 missing"),
     ([[0, 3]], "shards 1/3, 2/3 missing")],
)  # fmt: skip
def test_merge_takes_every_shard_of_one_run_once(shards, words):
    files = [f"f{i}" for i in range(len(shards))]
    if words is None:
        whole_run(files, shards)
    else:
        with pytest.raises(ScoreError, match=words):
            whole_run(files, shards)


def scores_at(positions, prompt=0, k=3, v=8, rng=None):
    rng = rng or np.random.default_rng(0)
    lp = nudged(rng.normal(0, 1, (len(positions), v)), 0, rng)
    s = table(lp, k)
    s.prompt = np.full(len(positions), prompt, np.int32)
    s.pos = np.asarray(positions, np.int32)
    return s


@pytest.mark.parametrize("n,decode", [(12, 4), (12, 0), (5, 9), (2, 3)])
def test_a_producer_row_is_read_only_at_a_scored_position(n, decode, tmp_path):
    """Rows at the prefill position through the last decode step are read; one before the
    prefill position or after the last step is refused, naming it."""
    tokens = np.arange(n, dtype=np.int32) % 8
    sched = Schedule.of(n, decode)
    first, last = sched.positions[0], sched.positions[-1]
    assert (first, last) == (n - 2 - min(decode, n - 2), n - 2)
    ok = tmp_path / "ok.parquet"
    write_trace(
        ok, decode, {}, prompt_tables(0, Prompt(tokens), {"p": scores_at(range(first, last + 1))})
    )
    assert read_trace(ok).producers["p"].pos.tolist() == list(range(first, last + 1))
    for pos in (first - 1, last + 1):
        if not 0 <= pos < n:
            continue
        bad = tmp_path / f"bad{pos}.parquet"
        write_parquet(bad, decode, {}, prompt_tables(0, Prompt(tokens), {"p": scores_at([pos])}))
        with pytest.raises(ScoreError, match=f"position {pos} is not a scored position "
                                             f"\\(they are {first} to {last}\\)"):  # fmt: skip
            read_trace(bad)


def test_a_corpus_token_at_the_vocabulary_size_is_outside_it_one_below_is_inside():
    trace = data_trace({"a": producer(sharp(np.random.default_rng(7)))})
    trace.prompts[1].tokens = trace.prompts[1].tokens.copy()
    top = int(trace.prompts[1].tokens.max())
    in_vocabulary(top + 1, trace, "c.parquet")
    with pytest.raises(ScoreError, match=f"prompt 0 position {top} holds token {top}, outside "
                                         f"the model's vocabulary of {top} ids"):  # fmt: skip
        in_vocabulary(top, trace, "c.parquet")
    ids = int(trace.producers["a"].ids.max())
    vocab = max(ids, top) + 1
    in_vocabulary(vocab, trace, "c.parquet", ids=True)
    if ids >= top:
        with pytest.raises(ScoreError, match=f"lists a token id of {ids}"):
            in_vocabulary(ids, Trace(trace.prompts, 9, trace.producers), "c", ids=True)


def test_a_model_vocabulary_is_the_corpus_one_by_its_strings():
    words = [f"t{i}" for i in range(50)]
    trace = Trace([], 1, {}, {"vocabulary": vocabulary_id(words)})
    assert vocabulary_id(words) == vocabulary_id(list(words)) and vocabulary_id(words)["size"] == 50
    same_vocabulary(words, trace, "c", "m")
    same_vocabulary(words + ["extra"], trace, "c", "m")  # more ids past the corpus's
    for other, why in (
        (words[:49], r"\(49 tokens\) is not"),
        (words[:7] + ["x"] + words[8:], "strings differ"),
    ):
        with pytest.raises(ScoreError, match=why):
            same_vocabulary(other, trace, "c", "m")
    same_vocabulary(None, trace, "c", "m")
    same_vocabulary(["other"], Trace([], 1, {}, {}), "c", "m")


def test_the_candidate_keeps_the_longest_top_k_of_the_references():
    trace = data_trace({"a": producer(sharp(np.random.default_rng(8)), 3),
                        "b": producer(sharp(np.random.default_rng(9)), 7)})  # fmt: skip
    assert reference_k(trace) == 7


def test_the_corpus_hash_covers_every_token_and_the_decode():
    prompts = [Prompt(np.array([1, 2, 3], np.int32)), Prompt(np.array([4, 5], np.int32))]
    h = corpus_sha256(Trace(prompts, 2))
    assert h == corpus_sha256(Trace([Prompt(p.tokens.copy()) for p in prompts], 2))
    assert h != corpus_sha256(Trace(prompts, 3))
    moved = [Prompt(np.array([1, 2], np.int32)), Prompt(np.array([3, 4, 5], np.int32))]
    assert h != corpus_sha256(Trace(moved, 2))  # the same tokens cut elsewhere
    changed = [Prompt(np.array([1, 2, 3], np.int32)), Prompt(np.array([4, 6], np.int32))]
    assert h != corpus_sha256(Trace(changed, 2))


# ---- the sampler: stop ids out, the rest renormalised -----------------------------------------


def plain_sample(row, u, never):
    p = np.exp(np.asarray(row, np.float64) - np.max(row))
    p[list(never)] = 0.0
    p /= p.sum()
    return int(np.flatnonzero(np.cumsum(p) >= u)[0])


@pytest.mark.parametrize("seed", range(6))
def test_the_sampler_draws_from_the_distribution_without_the_stop_ids(seed):
    """Stop ids holding most of the mass: the draw at u is the inverse of the renormalised
    CDF, so every u reaches a token, none a stop id."""
    rng = np.random.default_rng(seed)
    v = int(rng.integers(3, 50))
    row = rng.normal(0, 2, v)
    never = sorted(rng.choice(v, int(rng.integers(1, v)), replace=False).tolist())
    row[never] += 5  # the stop ids hold most of the mass
    for u in np.r_[rng.random(300), 1 - 1e-12]:
        got = sample(row, u, never)
        assert got == plain_sample(row, u, never) and got not in never


def test_the_sampler_with_nothing_left_draws_the_lowest_allowed_id():
    row = np.array([np.nan, -np.inf, 3.0, -np.inf, np.nan])
    assert sample(row, 0.5, [2]) == 0
    assert sample(row, 0.9, [0, 2]) == 1
    row = np.array([1.0, np.nan, 2.0])
    assert sample(row, 0.99, [2]) == 0  # NaN is no mass


def test_uniforms_are_the_rows_own_and_in_0_1():
    u = uniforms(0, "a#1", 1000)
    assert u.shape == (1000,) and (u >= 0).all() and (u < 1).all() and 0.45 < u.mean() < 0.55
    assert not np.array_equal(u, uniforms(1, "a#1", 1000))
    assert not np.array_equal(u[:5], uniforms(0, "a#1 ", 5))


def test_top_k_is_the_plain_sort_with_ties_to_the_lower_id():
    rng = np.random.default_rng(10)
    for _ in range(20):
        row = rng.integers(-3, 3, int(rng.integers(2, 40))) / 2.0
        lp = row - np.log(np.exp(row).sum())
        for k in (1, 2, 5, len(row) + 3):
            ids, lps, fed = top_k(row, k, next_id=1)
            want = sorted(range(len(row)), key=lambda i: (-row[i], i))[: min(k, len(row))]
            assert ids.tolist() == want and ids.dtype == np.int32
            assert np.allclose(lps, lp[want], rtol=0, atol=1e-12) and fed == pytest.approx(lp[1])
    assert np.allclose(normalised([0.0, 0.0]), np.log([0.5, 0.5]))
    assert np.isnan(top_k([1.0, np.nan, 0.0], 2, next_id=0)[2])


def test_scores_of_a_schedule_are_its_positions_in_order():
    sched = Schedule.of(10, 3)
    got = [(np.array([i, i + 1]), np.array([-0.1 * i, -1.0]), -0.5 * i) for i in range(4)]
    s = scores_of(sched, got)
    assert s.pos.tolist() == [5, 6, 7, 8] and s.ids.dtype == np.int32 and s.pos.dtype == np.int32
    assert s.ids[:, 0].tolist() == [0, 1, 2, 3] and s.ref_logprob.tolist() == [0, -0.5, -1, -1.5]
    assert s.logprob[2].tolist() == [-0.2, -1.0]


def test_a_prompts_rows_are_sliced_by_prompt():
    s = concat_scores([scores_at([1, 2], 0), scores_at([3], 2), scores_at([0, 1, 2], 3)])
    assert slice_scores(s, 0).pos.tolist() == [1, 2] and len(slice_scores(s, 1).pos) == 0
    assert slice_scores(s, 3).pos.tolist() == [0, 1, 2] and slice_scores(s, 2).pos.tolist() == [3]
    assert isinstance(s, Scores)


# ---- an in-process candidate, judged against the exact KL -------------------------------------


def perturbed_copy(model, dest):
    """The model's files, with its final norm's weights moved by a tenth: logits ten percent
    sharper, a candidate that differs from the reference at every position."""
    from safetensors.torch import load_file, save_file

    dest.mkdir()
    for f in model.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    (weights,) = dest.glob("*.safetensors")
    tensors = load_file(weights)
    (norm,) = [n for n in tensors if n.endswith("model.norm.weight")]
    tensors[norm] = tensors[norm] * 1.1 + 0.1  # (1 + w) in Qwen3.5's norm, w itself in others
    save_file(tensors, weights, metadata={"format": "pt"})
    return dest


def full_log_softmax(model_dir, tokens):
    """Every position's log-probabilities from one forward of the whole prompt, in float64."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return [torch.log_softmax(m(torch.tensor([t.tolist()])).logits[0].double(), -1).numpy()
                for t in tokens]  # fmt: skip


def test_an_in_process_candidate_is_judged_on_its_log_probabilities_at_the_exact_kl(
    model, tmp_path
):
    """judge --model runs transformers here (the `against` estimator: its log-probabilities of
    the reference's kept ids). With the reference keeping the whole vocabulary the estimate is
    the exact KL, which this test computes from one full forward of each model: every position,
    the fed token's log-probability on both sides, and the verdict."""
    import orjson

    rng = np.random.default_rng(11)
    vocab = orjson.loads((model / "config.json").read_bytes())["vocab_size"]
    prompts = [Prompt(rng.integers(0, 250, n).astype(np.int32)) for n in (14, 9, 20)]
    corpus, ref = tmp_path / "corpus.parquet", tmp_path / "ref.parquet"
    write_trace(corpus, 6, {}, (t for i, p in enumerate(prompts) for t in prompt_tables(i, p, {})))
    assert record("--corpus", corpus, "--model", model, "--producer", "full", "--top-k", vocab,
                  "--out", ref) == 0  # fmt: skip
    cand = perturbed_copy(model, tmp_path / "cand")
    positions = tmp_path / "positions.parquet"
    code = score.main(["judge", str(ref), "--model", str(cand), "--out", str(positions)])
    got = pq.read_table(positions).to_pylist()
    tokens = [p.tokens for p in prompts]
    p_ref, p_cand = full_log_softmax(model, tokens), full_log_softmax(cand, tokens)
    want = []
    for i, t in enumerate(tokens):
        sched = Schedule.of(len(t), 6)
        for step, pos in enumerate(sched.positions):
            a, b = p_ref[i][pos], p_cand[i][pos]
            want.append(dict(prompt=i, pos=pos, step=step, kl=float(np.exp(a) @ (a - b)),
                             ref_logprob=a[t[pos + 1]], cand_logprob=b[t[pos + 1]]))  # fmt: skip
    assert [(r["prompt"], r["pos"], r["step"]) for r in got] == [
        (w["prompt"], w["pos"], w["step"]) for w in want
    ]
    kl = np.array([r["kl"] for r in got])
    exact = np.array([w["kl"] for w in want])
    assert exact.min() > 1e-3  # the candidate differs everywhere
    assert np.allclose(kl, exact, rtol=1e-4, atol=1e-7), np.abs(kl - exact).max()
    for side in ("ref_logprob", "cand_logprob"):
        assert np.allclose([r[side] for r in got], [w[side] for w in want], rtol=0, atol=1e-5)
    flips = np.array([p_ref[w["prompt"]][w["pos"]].argmax()
                      != p_cand[w["prompt"]][w["pos"]].argmax() for w in want])  # fmt: skip
    confident = (flips & (exact > compare.LIMIT_KL)).any()
    assert code == (1 if confident else 0 if exact.max() <= compare.LIMIT_KL else 2)
    assert code == 2 and exact.max() > compare.LIMIT_KL  # sharper, no flip: INCONCLUSIVE, not PASS


def test_the_sampler_at_its_edges():
    """NaN is no mass, and a row whose only mass is its last id draws it; float64 throughout
    (a float32 row keeps mass float32 would lose); large logits do not overflow; no stop ids."""
    assert sample(np.array([np.nan, 1.0, 2.0]), 0.99, []) == 2
    assert sample(np.array([np.nan, -np.inf, -np.inf]), 0.9, ()) == 0  # nothing: the lowest id
    assert sample(np.array([-np.inf, -np.inf, 1.0]), 0.5, ()) == 2
    row = np.array([0.0, -120.0, -110.0], np.float32)  # e^-110 is 0 in float32, not in float64
    assert sample(row, 0.5, [0]) == 2
    big = np.array([400.0, 401.0, 399.0])  # e^800 would overflow
    for u in (0.1, 0.5, 0.9):
        assert sample(big, u, ()) == plain_sample(big, u, ())


def test_the_sampler_and_top_k_warn_of_nothing():
    """Rows with NaN and infinities: no RuntimeWarning reaches the user's stderr."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for row in ([np.nan, -np.inf, -np.inf], [-np.inf, -np.inf], [1.0, np.inf, 2.0]):
            sample(np.array(row), 0.5, ())
            top_k(np.array(row), 2, next_id=0)
            normalised(np.array(row))
    assert np.isnan(top_k(np.array([1.0, 2.0]), 2)[2])  # no next id: no fed value


def test_uniforms_are_pcg64_seeded_by_the_seed_and_the_rows_sha256():
    """The plain definition: PCG64 from SeedSequence([seed, the first 8 bytes of the sha256 of
    the row's source id, big-endian]); a reference's continuation depends on it."""
    import hashlib

    for seed, source in ((0, "a#1"), (7, "owner/repo@rev#12")):
        key = int.from_bytes(hashlib.sha256(source.encode()).digest()[:8], "big")
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, key])))
        assert np.array_equal(uniforms(seed, source, 5), rng.random(5))


def test_what_the_vocabulary_and_shard_checks_say_names_the_right_row_and_file():
    trace = data_trace({"a": producer(sharp(np.random.default_rng(12)))})
    trace.producers["a"].ids[13, 2] = 40  # prompt 1 position 13, not the first row
    with pytest.raises(ScoreError) as e:
        in_vocabulary(40, trace, "r.parquet", ids=True)
    assert str(e.value) == (
        "r.parquet: producer 'a' lists a token id of 40 at prompt 1 position 13, outside the "
        "model's vocabulary of 40 ids: the reference was recorded with another model"
    )
    trace.prompts[1].tokens = trace.prompts[1].tokens.copy()
    trace.prompts[1].tokens[4] = 41
    with pytest.raises(ScoreError) as e:
        in_vocabulary(40, trace, "r.parquet")
    assert str(e.value) == (
        "r.parquet: prompt 1 position 4 holds token 41, outside the model's vocabulary of 40 ids: "
        "the corpus was tokenized for another model; record this model's own reference (record "
        "--rows), or run the model the corpus was made with"
    )
    files = ["a.parquet", "b.parquet", "c.parquet"]
    for shards, want in (
        ([[0, 3], [1, 3], None],
         "c.parquet: has no record of its shard; only files record wrote merge"),
        ([[1, 3], [0, 3], [2, 4]],
         "c.parquet is shard 2/4, a.parquet shard 1/3: shards of one run have one N"),
        ([[1, 3], [0, 3], [1, 3]], "a.parquet and c.parquet are both shard 1/3"),
    ):  # fmt: skip
        with pytest.raises(ScoreError) as e:
            whole_run(files, shards)
        assert str(e.value) == want


def test_quantiles_of_one_value_and_of_none():
    assert compare.quantiles(np.array([0.25]), 0.5, 0.99, 1.0) == [0.25, 0.25, 0.25]
    assert compare.quantiles(np.array([]), 0.5, 0.99) == [0.0, 0.0]
    v = np.array([5.0, 1.0, 4.0, 2.0, 3.0])
    assert compare.quantiles(v, 0.0, 0.5, 0.74, 0.76, 1.0) == [1.0, 3.0, 4.0, 4.0, 5.0]


def test_a_band_of_one_position_and_pairs_with_none():
    """band() on its own: a pair sharing one position is that position's numbers; a pair
    with none adds nothing, wherever it comes among the pairs."""
    rng = np.random.default_rng(13)
    a, b = lopsided(rng)
    x, y = producer(a, 30).take(np.arange(1)), producer(b, 30).take(np.arange(1))
    one = compare.compare(x, y)
    none = compare.compare(x.take(np.arange(0)), y.take(np.arange(0)))
    want = compare.band({("x", "y"): one})
    assert want.kl_p99 == max(one.kl[0], one.kl_reverse[0]) > 1e-3
    assert want.kl_p50 == want.kl_p99
    for pairs in ({("e", "f"): none, ("x", "y"): one}, {("x", "y"): one, ("e", "f"): none}):
        assert compare.band(pairs) == want
    assert compare.band({("e", "f"): none}) == compare.Band()
    assert compare.band({}) is None


def test_a_candidate_at_exactly_the_bands_kl_quantiles_passes():
    """The candidate is the broad producer b; the band's KL comes from a (sharp) against b, so
    its p50 and p99 against a are exactly the band's."""
    rng = np.random.default_rng(14)
    a, b = lopsided(rng)
    refs = {"a": producer(b, 30), "b": producer(a, 30)}  # a sharp, b broad
    j = judged(refs, refs["b"])
    c = j["results"]["a"]
    assert compare.quantile(c.kl, 0.99) == j["band"].kl_p99
    assert compare.quantile(c.kl, 0.5) == j["band"].kl_p50
    assert j["verdict"].why == "within the band of 2 producers on all 20 positions"


def test_a_non_finite_value_fails_first_and_says_where():
    rng = np.random.default_rng(15)
    lp = sharp(rng)
    cand = producer(nudged(lp, 1e-3, rng))
    cand.logprob = cand.logprob.copy()
    cand.logprob[13, 0] = np.nan
    cand.logprob[16, 1] = -np.inf
    for refs in ({"a": producer(lp)}, {"a": producer(lp), "b": producer(nudged(lp, 0.1, rng))}):
        v = judged(refs, cand)["verdict"]
        assert (v.code, v.word) == (1, "FAIL")
        assert v.why == ("non-finite log-probabilities at prompt 1 pos 13 (infinite KL at 2 "
                         "positions) against a")  # fmt: skip
    v = judged({"a": producer(lp)}, producer(lp))["verdict"]
    assert v.why == "within KL 1e-02 of a on all 20 positions"


def test_beyond_the_band_names_every_number_against_every_producer():
    rng = np.random.default_rng(16)
    lp = sharp(rng)
    refs = {"a": producer(lp), "b": producer(nudged(lp, 1e-4, rng))}
    j = judged(refs, producer(nudged(lp, 0.05, rng)))
    parts = []
    for name in "ab":
        c = j["results"][name]
        assert not c.flip.any()
        p50, p99 = plain_quantile(c.kl, 0.5), plain_quantile(c.kl, 0.99)
        parts.append(f"against {name}: KL p50 {p50:.1e}, KL p99 {p99:.1e}")
    assert j["verdict"].why == "beyond the band: " + "; ".join(parts)


@pytest.mark.parametrize(
    "ours,want",
    [
        ({}, None),
        ({"other": 5, "choice": {}}, None),
        ({"prompts": [{}], "skipped": [], "producers": {"p": {}}}, None),
        ({"prompts": [{"source": "s", "name": "n", "index": 1, "rendered": 2}]}, None),
        ([], "a JSON list, not an object"),
        ({"prompts": {}}, "`prompts` is a dict, not a list"),
        ({"skipped": "x"}, "`skipped` is a str, not a list"),
        ({"producers": []}, "`producers` is a list, not a dict"),
        ({"prompts": [{}, 1]}, "`prompts[1]` is a int, not an object"),
        ({"skipped": [{"index": 1}, [2]]}, "`skipped[1]` is a list, not an object"),
        ({"skipped": [{"index": "3"}]}, "`skipped[0].index` is '3', not a int"),
        ({"prompts": [{"index": True}]}, "`prompts[0].index` is True, not a int"),
        ({"prompts": [{"rendered": 1.5}]}, "`prompts[0].rendered` is 1.5, not a int"),
        ({"prompts": [{"source": 4}]}, "`prompts[0].source` is 4, not a str"),
        ({"producers": {"p": {}, "q": [1]}}, "`producers.q` is a list, not an object"),
        ({"choice": {"first": 3}}, None),
        ({"choice": {"shard": None}}, "`choice.shard` is None, not [I, N] with 0 <= I < N"),
    ],
)  # fmt: skip
def test_this_tools_metadata_is_read_back_only_as_it_writes_it(ours, want):
    assert meta_error(ours) == want


def test_drift_at_its_edges():
    """One step, none, a mean exactly at the threshold (not above it), an infinite KL (above
    any), and steps missing from the window (its mean is over the steps there are)."""
    assert compare.left_at(np.array([1.0]), 0.1) == 1
    assert compare.left_at(np.array([]), 0.1) is None
    assert compare.left_at(np.full(20, 0.5), 0.5) is None
    kl = np.r_[np.full(30, 1e-9), np.inf, np.nan, np.full(3, 1e-9)]
    assert compare.left_at(kl, 1e-6) == 31
    assert np.array_equal(compare.trailing_mean(np.array([1.0, 0.0]), WINDOW, np.array([1, 20])),
                          [1.0, 0.0])  # fmt: skip
    assert compare.left_at(np.array([1.0, 0.0]), 0.1, np.array([1, 20])) is None
    assert compare.left_at(np.array([0.0, 1.0]), 0.1, np.array([1, 20])) == 20


def test_drift_per_prompt_and_over_prompts_is_the_plain_mean_by_decode_step():
    """Prompts of other lengths (so a step has one prompt, or several, or none once rows are
    left out): the overall KL at each decode step is the mean over the prompts that have it,
    and each prompt's own drift is read from its own steps in order."""
    rng = np.random.default_rng(17)
    trace, far = long_trace(rng, [40, 25, 60, 12], decode=45, scale=0.5)
    ref = trace.producers["ref"]
    first = np.array([trace.schedule(i).positions[0] for i in range(4)])[ref.prompt]
    # the reference's own rows, then from a step on (never, in the last prompt) far from them
    late = (ref.pos - first > np.array([10, 30, 5, 100])[ref.prompt])[:, None]
    cand = Scores(ref.prompt, ref.pos, ref.ref_logprob, np.where(late, far.ids, ref.ids),
                  np.where(late, far.logprob, ref.logprob))  # fmt: skip
    keep = rng.random(len(cand.pos)) < 0.85
    j = compare.judge(trace, cand.take(keep))
    c = j["results"]["ref"]
    step = plain_steps(trace, c)
    n = step.max()
    want = np.zeros(n)
    for s in range(1, n + 1):
        if (step == s).any():
            want[s - 1] = c.kl[step == s].mean()
    assert np.allclose(j["drift"]["mean_by_step"], want, rtol=1e-12, atol=0)
    assert [(step == s).sum() for s in (1, n)] != [1, 1] and (np.bincount(step)[1:] == 1).any()
    threshold = j["drift"]["threshold"]
    for i in range(4):
        sel = (c.prompt == i) & (step > 0)
        order = np.argsort(step[sel])
        ks, steps = c.kl[sel][order], step[sel][order]
        means = np.array([ks[(steps > s - WINDOW) & (steps <= s)].mean() for s in steps])
        over = means > threshold
        first = None
        if over[-1]:
            within = np.flatnonzero(~over)
            first = int(steps[within[-1] + 1] if len(within) else steps[0])
        assert j["drift"]["per_prompt"][i] == first, i
    per = j["drift"]["per_prompt"]
    assert per[3] is None and sum(per[i] is not None and per[i] > 5 for i in range(3)) >= 2, per


def test_a_trace_without_decode_steps_has_no_drift():
    rng = np.random.default_rng(18)
    trace, cand = long_trace(rng, [10, 7], decode=0)
    d = compare.judge(trace, cand)["drift"]
    assert d["per_prompt"] == {} and d["overall"] is None and d["mean_by_step"].shape == (0,)


def test_the_strata_count_the_confident_flips_by_the_band():
    """Flips within the band's margin are not confident, whatever their KL: the strata count
    what the verdict counts."""
    rng = np.random.default_rng(19)
    lp = sharp(rng)
    b = lp.copy()
    top2 = np.argsort(-lp, 1)[:, :2]
    for i in (2, 7, 15):
        b[i, top2[i]] = b[i, top2[i][::-1]]
    refs = {"a": producer(lp), "b": producer(nudged(b, 0.02, rng))}
    j = judged(refs, refs["b"])
    c = j["results"]["a"]
    assert c.flip.sum() == 3 and (c.kl[c.flip] > compare.LIMIT_KL).all()
    assert j["strata"]["a"]["all"]["confident"] == 0
    cand = lp.copy()
    cand[5, top2[5, 1]] = cand[5, top2[5, 0]] + 1e-9  # a flip at KL ~0, beyond a band of none
    j = judged(
        {"a": producer(lp), "b": producer(nudged(lp, 0.01, rng))}, producer(nudged(cand, 0, rng))
    )
    assert (
        j["strata"]["a"]["all"]["confident"] == 1 == j["strata"]["a"]["phase decode"]["confident"]
    )
