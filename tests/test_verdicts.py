"""The judge's verdicts cannot be fooled (issue 30, "Wrong verdicts"): the candidate is never in
its own band, values that are not log-probabilities are refused, the order of a top-k list means
nothing, no verdict comes from an empty comparison, the band is measured where the candidate was,
drift counts decode steps and a KL limit is a limit. Every verdict is reached through tables that
are data (scoring.compare), a few through score.main on files written with write_parquet."""

import math

import numpy as np
import orjson
import pytest
from test_score import data_trace, producer, table

import score
from scoring import compare
from scoring.report import report_lines
from scoring.trace import Prompt, ScoreError, Scores, Trace, trace_tables, write_parquet

# ---- tables as data: tests/test_score.py's builders --------------------------------------------


def normalised(x):
    return x - np.logaddexp.reduce(x, 1, keepdims=True)


def nudged(lp, scale, rng):
    return normalised(lp + rng.normal(0, scale, lp.shape))


def sharp(rng):
    """Confident distributions: top-1/top-2 margins of about 2 nats."""
    lp = np.log(np.full((20, 30), 0.3 / 29))
    lp[np.arange(20), rng.integers(0, 30, 20)] = np.log(0.7)
    return lp


def judged(producers, cand, limit=compare.LIMIT_KL, candidate=None):
    return compare.judge(data_trace(producers), cand, limit=limit, candidate=candidate)


def write(path, trace):
    """A trace as data written as this tool writes one, unchecked: damaged ones too."""
    write_parquet(path, trace.decode, trace.meta, trace_tables(trace))
    return path


def run(capsys, *argv):
    """score.main on `argv`: its exit code and what it printed."""
    code = score.main(list(map(str, argv)))
    return code, capsys.readouterr().out


def failing(capsys, argv, words):
    """`argv` fails with one `error:` line holding `words`, and no traceback."""
    code = score.main(list(map(str, argv)))
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1 and "Traceback" not in err, err
    assert words in errors[0], errors[0]
    return errors[0]


# ---- the candidate is never in its own band --------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_a_reference_that_holds_the_candidate_judges_it_as_one_that_does_not(seed):
    """Whatever the data: the candidate's producer in the reference changes nothing; the band
    and every comparison are of the other producers."""
    rng = np.random.default_rng(seed)
    lp = sharp(rng) if seed % 2 else nudged(rng.normal(0, 2, (20, 30)), 0, rng)
    refs = {n: producer(nudged(lp, rng.uniform(0, 1e-3), rng)) for n in "ab"[: 1 + seed % 2]}
    cand = producer(nudged(lp, rng.uniform(1e-3, 0.3), rng))
    alone = judged(refs, cand)
    inside = judged(refs | {"c": cand}, cand, candidate="c")
    assert sorted(inside["results"]) == sorted(refs) and inside["left_out"] == "c"
    assert inside["band"] == alone["band"] and inside["verdict"] == alone["verdict"]
    assert inside["drift"]["per_prompt"] == alone["drift"]["per_prompt"]


def test_a_candidate_that_fails_the_references_fails_inside_a_file_that_holds_it():
    rng = np.random.default_rng(0)
    lp = sharp(rng)
    refs = {"a": producer(lp), "b": producer(nudged(lp, 1e-4, rng))}
    cand = producer(nudged(lp, 0.05, rng))
    v = judged(refs | {"c": cand}, cand, candidate="c")["verdict"]
    assert v.word == "FAIL" and "beyond the band" in v.why  # it passed in a band of 3 producers
    # the reference judged against its own file: against the other producer alone
    v = judged(refs, refs["a"], candidate="a")["verdict"]
    assert v.word == "PASS" and "within KL 1e-02 of b" in v.why
    with pytest.raises(ScoreError, match="no producer but the candidate's"):
        judged({"c": cand}, cand, candidate="c")


def test_judging_a_record_corpus_file_against_itself_compares_the_candidate_with_the_others_only(
    tmp_path, capsys
):
    """`record --corpus REF --out CAND` copies REF's producers into CAND: judging CAND against
    itself, or against REF, is one judgment; a name meaning different rows is refused."""
    rng = np.random.default_rng(1)
    lp = sharp(rng)
    refs = {"a": producer(lp), "b": producer(nudged(lp, 1e-4, rng))}
    cand = producer(nudged(lp, 0.05, rng))
    ref = write(tmp_path / "ref.parquet", data_trace(refs))
    both = write(tmp_path / "cand.parquet", data_trace(refs | {"c": cand}))
    code, against_ref = run(capsys, "judge", ref, "--candidate", both, "--producer", "c")
    assert code == 1 and against_ref.splitlines()[-1].startswith("FAIL beyond the band")
    code, itself = run(capsys, "judge", both, "--candidate", both, "--producer", "c")
    assert code == 1 and itself.splitlines()[1:] == against_ref.splitlines()[1:]
    assert "producers a, b (c, the candidate's, left out)" in itself.splitlines()[0]
    other = cand.take(np.arange(20))
    other.logprob = other.logprob.copy()
    other.logprob[13, 1] -= 0.25  # another candidate under the same name
    clash = write(tmp_path / "clash.parquet", data_trace(refs | {"c": other}))
    failing(capsys, ["judge", clash, "--candidate", both, "--producer", "c"],
            "producer 'c' means different rows in")  # fmt: skip
    moved = refs["b"].take(np.arange(20))
    moved.ids = moved.ids.copy()
    moved.ids[4] = moved.ids[4, ::-1]  # a reference copied with another table
    line = failing(capsys, ["judge", write(tmp_path / "b.parquet", data_trace(
        {"a": refs["a"], "b": moved})), "--candidate", both, "--producer", "c"],
        "producer 'b' means different rows")  # fmt: skip
    assert "(prompt 0 position 14)" in line
    only = write(tmp_path / "only.parquet", data_trace({"c": cand}))
    failing(capsys, ["judge", only, "--candidate", only], "has no producer but the candidate's")


# ---- log-probabilities, not logits -------------------------------------------------------------


def broken(s, row, rng):
    """`s` with row `row` no longer log-probabilities: a value above 0, or values all at most 0
    whose probabilities sum above 1."""
    s = Scores(s.prompt, s.pos, s.ref_logprob, s.ids, s.logprob.copy())
    if rng.random() < 0.5:
        s.logprob[row, int(rng.integers(s.logprob.shape[1]))] = rng.uniform(3e-5, 30)
    else:
        s.logprob[row] = np.log(rng.dirichlet(np.ones(s.logprob.shape[1])) * rng.uniform(1.001, 3))
        s.logprob[row] = np.minimum(s.logprob[row], 0)
        if np.exp(s.logprob[row]).sum() <= 1.001:  # a share that reached 1: spread it
            s.logprob[row] = np.log(np.full(s.logprob.shape[1], 1.5 / s.logprob.shape[1]))
    return s


@pytest.mark.parametrize("seed", range(8))
def test_values_that_are_not_log_probabilities_are_refused_where_they_are(seed):
    rng = np.random.default_rng(seed)
    lp = nudged(rng.normal(0, 2, (20, 30)), 0, rng)
    k = int(rng.integers(2, 31))
    refs = {"a": producer(lp, k), "b": producer(nudged(lp, 1e-3, rng), k)}
    cand = producer(nudged(lp, 0.01, rng), k)
    judged(refs, cand)  # normalised tables, rounded to float32, k up to the whole vocabulary
    row = int(rng.integers(20))
    where = f"prompt {cand.prompt[row]} position {cand.pos[row]} lists"
    with pytest.raises(ScoreError, match=f"^the candidate \\('c'\\): {where}"):
        judged(refs, broken(cand, row, rng), candidate="c")
    with pytest.raises(ScoreError, match=f"^reference producer 'b': {where}"):
        judged(refs | {"b": broken(refs["b"], row, rng)}, cand)


@pytest.mark.parametrize("shift", [0.5, 2.0])
def test_the_tolerance_is_float32_rounding(shift):
    """A whole distribution (k = the vocabulary) lifted by `shift` x LOGPROB_SLACK: within it
    passes, beyond it is refused."""
    rng = np.random.default_rng(3)
    lp = nudged(rng.normal(0, 1, (20, 8)), 0, rng)
    refs = {"a": producer(lp, 8)}
    lifted = producer(lp + shift * compare.LOGPROB_SLACK, 8)
    if shift < 1:
        assert judged(refs, lifted)["verdict"].word == "PASS"
    else:
        with pytest.raises(ScoreError, match=r"kept probabilities summing to 1\.00002"):
            judged(refs, lifted)


def test_raw_logits_as_a_candidate_are_one_line_not_a_pass(tmp_path, capsys):
    """Logits written as log-probabilities once made every KL negative, clipped to 0: PASS."""
    rng = np.random.default_rng(4)
    lp = sharp(rng)
    ref = write(tmp_path / "ref.parquet", data_trace({"a": producer(lp)}))
    logits = write(tmp_path / "logits.parquet", data_trace({"c": producer(lp + 3.0)}))
    failing(capsys, ["judge", ref, "--candidate", logits],
            "the candidate ('c'): prompt 0 position 10 lists log-probability 2.643 above 0")  # fmt: skip


@pytest.mark.parametrize("same", [True, False])
def test_an_id_listed_twice_is_refused_as_that_before_any_sum(same, tmp_path, capsys):
    """A list naming one id twice, with its own value again (`same`: it sums to at most 1, a
    merge of the two would pass) or another one (the sum passes 1): refused as a duplicate, by
    its id, position and side, in every form: tables in memory (either side) and a file."""
    rng = np.random.default_rng(6)
    lp = sharp(rng)
    refs = {"a": producer(lp)}
    cand = producer(nudged(lp, 1e-3, rng))
    cand.ids[12, 4] = cand.ids[12, 1]
    cand.logprob[12, 4] = cand.logprob[12, 1] if same else cand.logprob[12, 0]
    assert (np.exp(cand.logprob[12]).sum() <= 1) == same
    v = cand.ids[12, 1]
    where = f"prompt {cand.prompt[12]} position {cand.pos[12]} lists id {v} twice"
    with pytest.raises(ScoreError, match=f"^the candidate \\('c'\\): {where}$"):
        judged(refs, cand, candidate="c")
    with pytest.raises(ScoreError, match=f"^reference producer 'b': {where}$"):
        judged(refs | {"b": cand}, producer(lp))
    ref = write(tmp_path / "ref.parquet", data_trace(refs))
    twice = write(tmp_path / "twice.parquet", data_trace({"c": cand}))
    failing(capsys, ["judge", ref, "--candidate", twice],
            f"{twice}: producer 'c' lists id {v} twice at prompt {cand.prompt[12]} position "
            f"{cand.pos[12]}")  # fmt: skip


# ---- order is not meaning ----------------------------------------------------------------------


def shuffled(s, rng):
    """`s` with each list in an order of its own, ids and values together; the permutation too."""
    order = np.argsort(rng.random(s.ids.shape), 1)
    s = Scores(s.prompt, s.pos, s.ref_logprob, np.take_along_axis(s.ids, order, 1),
               np.take_along_axis(s.logprob, order, 1))  # fmt: skip
    return s, order


@pytest.mark.parametrize("seed", range(8))
def test_the_argmax_margin_and_rank_come_from_the_values_whatever_the_order(seed):
    """Distributions with exact ties everywhere (few distinct logits), listed in any order:
    every number the judge gives is that of the lists in descending order, ties to the lower
    id; with the candidate's full logits too."""
    rng = np.random.default_rng(seed)
    v, n = int(rng.integers(3, 40)), 500
    ka, kb = (int(rng.integers(2, v + 1)) for _ in range(2))
    p = normalised(rng.integers(-3, 3, (n, v)) / 2.0).astype(np.float32).astype(np.float64)
    q = normalised(rng.integers(-3, 3, (n, v)) / 2.0).astype(np.float32).astype(np.float64)
    a, b = table(p, ka), table(q, kb)
    full = np.take_along_axis(q, a.ids, 1)
    want = compare.compare(a, b), compare.compare(a, b, full)
    (a2, order), (b2, _) = shuffled(a, rng), shuffled(b, rng)
    got = compare.compare(a2, b2), compare.compare(a2, b2, np.take_along_axis(full, order, 1))
    for w, g in zip(want, got):
        for f in compare.Compared.__slots__:
            assert np.array_equal(getattr(w, f), getattr(g, f)), f
    assert (want[0].argmax_a == np.argmax(p, 1)).all()  # numpy's argmax: the first, lower id


def test_exact_ties_in_another_order_and_an_ascending_list_are_no_flip():
    rng = np.random.default_rng(5)
    lp = sharp(rng)
    tied = lp.copy()
    top = np.argmax(lp, 1)
    other = (top + 1 + rng.integers(0, 29, 20)) % 30
    tied[np.arange(20), other] = tied[np.arange(20), top] = np.log(0.35)  # two tokens at 0.35
    refs = {"a": producer(tied)}
    swapped = producer(tied)
    swapped.ids, swapped.logprob = swapped.ids.copy(), swapped.logprob.copy()
    swapped.ids[:, :2] = swapped.ids[:, 1::-1].copy()
    swapped.logprob[:, :2] = swapped.logprob[:, 1::-1].copy()
    j = judged(refs, swapped)  # once a 100% flip rate at KL 0
    c = j["results"]["a"]
    assert not c.flip.any() and (c.kl == 0).all() and j["verdict"].word == "PASS"
    assert (c.argmax_b == np.minimum(top, other)).all()  # ties to the lower id
    ascending = producer(lp)
    ascending.ids, ascending.logprob = ascending.ids[:, ::-1], ascending.logprob[:, ::-1]
    for r, cand in (({"a": producer(lp)}, ascending), ({"a": ascending}, producer(lp))):
        j = judged(r, cand)  # once a confident flip at KL 0
        c = j["results"]["a"]
        assert not c.flip.any() and (c.margin > 1).all() and j["verdict"].word == "PASS"


def test_a_file_listing_tokens_in_ascending_order_judges_as_the_descending_one(tmp_path, capsys):
    rng = np.random.default_rng(6)
    lp = sharp(rng)
    ref = write(tmp_path / "ref.parquet", data_trace({"a": producer(lp)}))
    c = producer(nudged(lp, 1e-3, rng))
    down = write(tmp_path / "down.parquet", data_trace({"c": c}))
    c.ids, c.logprob = c.ids[:, ::-1].copy(), c.logprob[:, ::-1].copy()
    up = write(tmp_path / "up.parquet", data_trace({"c": c}))
    code, report = run(capsys, "judge", ref, "--candidate", down)
    assert code == 0 and "20/20 argmax agree" in report
    assert run(capsys, "judge", ref, "--candidate", up) == (0, report.replace("down", "up"))


# ---- no verdict from an empty comparison -----------------------------------------------------------


def test_a_producer_or_a_pair_with_no_position_in_common_is_refused_not_judged_on_nothing():
    rng = np.random.default_rng(7)
    lp = sharp(rng)
    a, b, c = producer(lp), producer(nudged(lp, 1e-4, rng)), producer(nudged(lp, 1e-4, rng))
    first = a.prompt == 0
    with pytest.raises(ScoreError, match="reference producer 'b' shares no scored position with"):
        judged({"a": a, "b": b.take(~first)}, c.take(first))  # once: PASS on all 0 positions
    with pytest.raises(ScoreError, match="producers 'a' and 'b' share no scored position"):
        judged({"a": a.take(first), "b": b.take(~first)}, c)  # once: a band at its floor
    with pytest.raises(ScoreError, match="the reference and the candidate share no scored"):
        judged({"a": a.take(first)}, c.take(~first))


@pytest.mark.parametrize("seed", range(8))
def test_the_report_says_which_side_lacks_the_positions(seed):
    """Any two sets of positions: judged on those both have; each side's others counted and
    named as the side that lacks them."""
    rng = np.random.default_rng(seed)
    lp = sharp(rng)
    a, c = producer(lp), producer(nudged(lp, 1e-4, rng))
    in_a, in_c = rng.random(20) < rng.uniform(0.3, 1), rng.random(20) < rng.uniform(0.3, 1)
    in_a[0] = in_c[0] = True
    trace = data_trace({"a": a.take(in_a)})
    j = compare.judge(trace, c.take(in_c))
    (line,) = [x for x in report_lines(trace, "ref", "cand", 0, j) if x.startswith("against a")]
    lacks = [f"{m} {who} lacks" for m, who in
             (((in_a & ~in_c).sum(), "the candidate"), ((in_c & ~in_a).sum(), "a")) if m]  # fmt: skip
    assert line == f"against a: judged on {(in_a & in_c).sum()} positions" + (
        f" ({', '.join(lacks)})" if lacks else ""
    )


def test_a_reference_lacking_positions_is_named_as_the_side_that_lacks_them(tmp_path, capsys):
    rng = np.random.default_rng(8)
    lp = sharp(rng)
    part = producer(lp)
    ref = write(tmp_path / "ref.parquet", data_trace({"a": part.take(part.pos < 15)}))
    cand = write(tmp_path / "cand.parquet", data_trace({"c": producer(nudged(lp, 1e-4, rng))}))
    code, report = run(capsys, "judge", ref, "--candidate", cand)
    assert code == 0 and "against a: judged on 10 positions (10 a lacks)" in report


# ---- like with like: the band where the candidate was --------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_the_band_is_measured_on_the_positions_the_candidate_has(seed):
    rng = np.random.default_rng(seed)
    lp = sharp(rng)
    refs = {n: producer(nudged(lp, rng.uniform(0, 0.5), rng)) for n in "abc"}
    keep = rng.random(20) < rng.uniform(0.2, 0.9)
    keep[int(rng.integers(20))] = True
    cand = producer(nudged(lp, 0.05, rng)).take(keep)
    j = judged(refs, cand)
    there = judged({n: s.take(keep) for n, s in refs.items()}, cand)
    assert j["band"] == there["band"] and j["verdict"] == there["verdict"]


def test_references_that_differ_only_where_the_candidate_is_missing_do_not_excuse_it():
    rng = np.random.default_rng(9)
    lp = sharp(rng)
    late = np.tile(np.arange(10, 20) >= 15, 2)
    b = lp.copy()
    b[late] = nudged(lp[late], 1.0, rng)  # the references disagree on positions 15 to 19 alone
    refs = {"a": producer(lp), "b": producer(b)}
    cand = producer(nudged(lp, 0.05, rng)).take(~late)
    j = judged(refs, cand)
    assert j["band"].kl_p99 == compare.KL_FLOOR  # where the candidate is, they agree
    assert j["verdict"].word == "FAIL"  # once: a band widened elsewhere passed it


# ---- drift counts decode steps -------------------------------------------------------------------


def plain_left_at(kl, steps, threshold):
    """The definition: the trailing mean at each step over the values of the last 16 decode
    steps that are there; the first step from which it stays above the threshold."""
    kl = np.where(np.isfinite(kl), kl, 1e300)
    means = np.array([kl[(steps > s - compare.DRIFT_WINDOW) & (steps <= s)].mean() for s in steps])
    over = means > threshold
    if not over[-1]:
        return None
    within = np.flatnonzero(~over)
    return int(steps[within[-1] + 1]) if len(within) else int(steps[0])


@pytest.mark.parametrize("seed", range(12))
def test_drift_is_read_at_decode_steps_whatever_steps_are_missing(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 200))
    steps = np.arange(1, n + 1)
    kl = np.exp(rng.normal(-12, 3, n)) * np.where(steps > rng.integers(0, n + 1), 1e4, 1)
    have = np.sort(rng.choice(steps, int(rng.integers(1, n + 1)), replace=False))
    got = compare.left_at(kl[have - 1], 1e-6, have)
    assert got == plain_left_at(kl[have - 1], have, 1e-6)
    assert compare.left_at(kl, 1e-6) == plain_left_at(kl, steps, 1e-6)  # no step missing


def test_a_candidate_missing_steps_1_to_20_leaves_at_step_21():
    rng = np.random.default_rng(10)
    decode, length = 40, 60  # scored positions 18 (prefill) and 19 to 58 (decode steps 1 to 40)
    lp = nudged(rng.normal(0, 2, (41, 30)), 0, rng)
    ref = table(lp, 10)
    ref.pos = np.arange(18, 59, dtype=np.int32)
    cand = table(nudged(lp, 2.0, rng), 10)  # far from the reference at every step
    cand.pos = ref.pos
    cand = cand.take((cand.pos == 18) | (cand.pos >= 39))  # steps 1 to 20 missing
    trace = Trace([Prompt(np.arange(length, dtype=np.int32))], decode, {"a": ref})
    j = compare.judge(trace, cand)
    assert j["drift"]["per_prompt"] == {0: 21} and j["drift"]["overall"] == 21  # once: step 1


# ---- a KL limit and a KL floor are numbers of nats above 0 -----------------------------------------


@pytest.mark.parametrize("word", ["limit", "floor"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-0.0", "-0.01", "1e400", "x"])
def test_a_kl_limit_or_floor_that_is_not_one_is_refused(value, word, capsys):
    flag = {"limit": "--limit-kl", "floor": "--kl-floor"}[word]
    with pytest.raises(SystemExit) as e:
        score.parse_args(["judge", "r.parquet", "--candidate", "c.parquet", f"{flag}={value}"])
    errors = [x for x in capsys.readouterr().err.splitlines() if "error:" in x]
    assert e.value.code == 2 and len(errors) == 1
    assert (
        f"argument {flag}: {value!r} is not a KL {word}: a number of nats, 0 < {word}"
        in (errors[0])
    )


@pytest.mark.parametrize("value", ["1e-12", "0.01", "5"])
def test_a_kl_limit_above_0_is_taken(value):
    args = score.parse_args(["judge", "r.parquet", "--candidate", "c", "--limit-kl", value])
    assert args.limit_kl == float(value) and 0 < args.limit_kl < math.inf


# ---- the band's KL floor: kern's by default, lower to judge exactly --------------------------------


def exact_pair(rng):
    """Two reference producers that agree to float32 rounding (KL about 1e-14), and a candidate
    whose top token is lifted by 2e-4 to 2e-3 nat at every position, then normalised: every KL
    between 1e-9 and 1e-6."""
    lp = sharp(rng)
    refs = {"a": producer(lp), "b": producer(nudged(lp, 1e-7, rng))}
    lifted = lp.copy()
    lifted[np.arange(len(lp)), lp.argmax(1)] += rng.uniform(2e-4, 2e-3)
    return refs, producer(normalised(lifted))


@pytest.mark.parametrize("seed", range(6))
def test_a_kl_under_kerns_floor_passes_by_default_and_fails_at_a_lower_floor(seed):
    rng = np.random.default_rng(seed)
    refs, cand = exact_pair(rng)
    default = judged(refs, cand)
    kl = np.concatenate([c.kl for c in default["results"].values()])
    assert 1e-9 < kl.min() and kl.max() < 1e-6 and default["band"].measured_p99 < 1e-10
    assert default["verdict"].word == "PASS" and default["kl_floor"] == compare.KL_FLOOR
    exact = compare.judge(data_trace(refs), cand, floor=1e-10)
    assert exact["verdict"].word == "FAIL" and "beyond the band" in exact["verdict"].why
    assert exact["band"].kl_p99 == exact["kl_seen"] == 1e-10 and exact["band"].floor == 1e-10
    assert exact["drift"]["threshold"] == 1e-10 and exact["drift"]["overall"] == 1
    assert (
        compare.judge(data_trace(refs), refs["a"], candidate="a", floor=1e-10)["verdict"].word
        == "PASS"
    )  # a reference judged against the other at the same floor


@pytest.mark.parametrize("seed", range(12))
def test_the_smallest_kl_seen_is_what_the_verdict_sees(seed):
    """kl_seen is max(floor, the producers' largest KL p50): a candidate whose KL is at most it
    at every position, with no flip, passes; one whose KL p50 is above it fails."""
    rng = np.random.default_rng(seed)
    lp = sharp(rng)
    refs = {n: producer(nudged(lp, 10 ** rng.uniform(-6, -2), rng)) for n in "ab"}
    floor = 10 ** rng.uniform(-12, -3)
    cand = producer(nudged(lp, 10 ** rng.uniform(-6, -1), rng))
    j = compare.judge(data_trace(refs), cand, floor=floor)
    b = j["band"]
    assert j["kl_seen"] == b.kl_p50 == max(floor, b.measured_p50) <= b.kl_p99
    results = j["results"].values()
    if all((c.kl <= j["kl_seen"]).all() and not c.flip.any() for c in results):
        assert j["verdict"].word == "PASS"
    if any(compare.quantile(c.kl, 0.5) > j["kl_seen"] for c in results):
        assert j["verdict"].word == "FAIL"


def test_the_report_names_the_floor_that_judged_and_the_smallest_kl_seen(tmp_path, capsys):
    rng = np.random.default_rng(11)
    refs, cand = exact_pair(rng)
    ref = write(tmp_path / "ref.parquet", data_trace(refs))
    c = write(tmp_path / "cand.parquet", data_trace({"c": cand}))
    code, out = run(capsys, "judge", ref, "--candidate", c)
    (line,) = [x for x in out.splitlines() if x.startswith("KL floor")]
    assert code == 0 and line.startswith("KL floor 1e-06 (kern's, the default) · ")
    assert "smallest KL seen 1.0e-06, the band's KL p50 = max(floor, their p50)" in line
    code, out = run(capsys, "judge", ref, "--candidate", c, "--kl-floor", "1e-10")
    (line,) = [x for x in out.splitlines() if x.startswith("KL floor")]
    assert code == 1 and line.startswith("KL floor 1e-10 (--kl-floor) · ")
    assert "smallest KL seen 1.0e-10" in line and out.splitlines()[-1].startswith("FAIL beyond")
    code, out = run(capsys, "judge", ref, "--candidate", c, "--kl-floor", "1e-10", "--json")
    summary = orjson.loads(out[: out.rindex("\n", 0, -1)])["summary"]
    assert code == 1 and summary["kl_floor"] == summary["kl_seen"] == 1e-10
    one = write(tmp_path / "one.parquet", data_trace({"a": refs["a"]}))
    code, out = run(capsys, "judge", one, "--candidate", c, "--kl-floor", "1e-10")
    assert code == 0 and "KL floor 1e-10 (--kl-floor) unused: no band (one producer) · the " \
        "smallest KL seen is the limit, 1.0e-02" in out  # fmt: skip
