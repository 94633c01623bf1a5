"""The judge's arithmetic: plain functions from arrays to numbers (docs/scoring.md "Judging a
candidate"). The estimators, the band between reference producers, kern's verdicts, the strata
and the drift; nothing here reads a file or runs a model, so the tests reach every verdict
through tables that are data.
"""

import math
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from scoring import builder as build
from scoring.trace import ScoreError, Scores, concat_scores, listed_twice

KL_FLOOR = 1e-6  # the band's KL statistics are at least this by default (kern's floor)
LIMIT_KL = 0.01  # nat: with one reference producer, a flip beyond it fails
REST_FLOOR = 1e-12  # a rest bucket's mass is at least this: float32 sums can leave it at 0 or below
DECODE_BUCKETS = ((1, 64), (65, 512), (513, 4_096), (4_097, 16_384))  # the splits' decode caps
DEPTH_BUCKETS = ((1, 2_048), (2_049, 16_384), (16_385, 131_072), (131_073, 1_048_576))
DRIFT_WINDOW = 16  # decode steps in the trailing mean that drift is read from

LOW = 0 if sys.byteorder == "little" else 1  # where a uint64's low 32 bits are, as two uint32s
CHUNK_ROWS = 8192  # positions compared at once: large enough for two threads to share the work


def coarse_sums(kept, p, q, d):
    """KL(a || b) and KL(b || a) over the vocabulary coarsened into the `kept` tokens (each its own
    bucket) plus one rest bucket, from the tokens' probabilities `p`, `q` on the two sides and
    log-ratios `d` ([n, w] in any order; entries not kept are left out). By the data-processing
    inequality each is at most the true KL: a lower bound, exact when the kept tokens cover the
    vocabulary. A non-finite value anywhere in a row gives an infinite KL."""
    w = kept.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        p_rest = np.maximum(1.0 - np.einsum("ij,ij->i", w, p), REST_FLOOR)
        q_rest = np.maximum(1.0 - np.einsum("ij,ij->i", w, q), REST_FLOOR)
        rest = np.log(p_rest / q_rest)
        kl = np.einsum("ij,ij,ij->i", w, p, d) + p_rest * rest
        kl_rev = -np.einsum("ij,ij,ij->i", w, q, d) - q_rest * rest
    return tuple(np.where(np.isfinite(x), np.maximum(x, 0.0), np.inf) for x in (kl, kl_rev))


def coarse_kl(lp_a, lp_b, kept):
    """coarse_sums from the log-probabilities of the same tokens on both sides."""
    with np.errstate(invalid="ignore", over="ignore"):
        return coarse_sums(kept, np.exp(lp_a), np.exp(lp_b), lp_a - lp_b)


def float32(x):
    """Log-probabilities as a trace stores them: the judge computes on what a file would hold."""
    return np.asarray(x, np.float32)


def sorted_tables(ids_a, lp_a, ids_b, lp_b):
    """Both tables of each position in one row sorted by token id, a's entry of a token just
    before b's: [n, ka + kb] uint64 keys, as [n, ka + kb, 2] uint32 halves: the high half the id
    and the side (id * 2 for a, id * 2 + 1 for b), the low half the float32 log-probability's
    bits. A token both kept is then two neighbours, found in O(k log k) rather than by comparing
    every id with every id."""
    n, ka = ids_a.shape
    width = ka + ids_b.shape[1]
    key = np.empty((n, width), np.uint64)
    half = key.view(np.uint32).reshape(n, width, 2)
    for ids, side in ((ids_a, half[:, :ka, 1 - LOW]), (ids_b, half[:, ka:, 1 - LOW])):
        np.left_shift(np.asarray(ids, np.int32).view(np.uint32), 1, out=side)  # ids are >= 0
    half[:, ka:, 1 - LOW] |= 1
    half[:, :ka, LOW] = float32(lp_a).view(np.uint32)
    half[:, ka:, LOW] = float32(lp_b).view(np.uint32)
    key.sort(1)
    return half


def measure(ids_a, lp_a, ids_b, lp_b, full_b=None):
    """One chunk of positions: KL both ways (`shared`; with `full_b`, b's log-probabilities of a's
    kept ids from a full logits row, `against`), the rank of a's argmax in b, the top-k overlap,
    and whether a table lists a token twice."""
    half = sorted_tables(ids_a, lp_a, ids_b, lp_b)
    high = half[:, :, 1 - LOW]
    link = high[:, :-1] ^ high[:, 1:]  # 1: a's and b's entries of one token; 0: a token twice
    kept = link == 1
    if full_b is None:
        v = half[:, :, LOW].view(np.float32).astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.exp(v)
            kl, kl_rev = coarse_sums(kept, e[:, :-1], e[:, 1:], v[:, :-1] - v[:, 1:])
    else:
        kl, kl_rev = coarse_kl(float32(lp_a).astype(np.float64), full_b, np.ones(lp_a.shape, bool))
    top = ids_b == ids_a[:, :1]
    rank = np.where(top.any(1), top.argmax(1) + 1, 0).astype(np.int32)
    overlap = (np.count_nonzero(kept, 1) / ids_a.shape[1]).astype(np.float32)
    return kl, kl_rev, rank, overlap, (link == 0).any(1)


@dataclass(slots=True)
class Compared:
    """A reference side `a` against a candidate `b` at the positions both scored."""

    prompt: np.ndarray
    pos: np.ndarray
    kl: np.ndarray  # KL(a || b), the estimator's lower bound
    kl_reverse: np.ndarray  # KL(b || a), the same estimator with the roles swapped
    flip: np.ndarray  # argmax of b differs from a's (both tie to the lower id)
    margin: np.ndarray  # a's top-1 minus top-2 log-probability
    margin_b: np.ndarray  # b's
    rank: np.ndarray  # a's argmax in b, 1-based; 0 when b did not keep it
    overlap: np.ndarray  # share of a's kept tokens that b kept too
    lp_a: np.ndarray  # a's log-probability of the fed token
    lp_b: np.ndarray
    argmax_a: np.ndarray
    argmax_b: np.ndarray


def concat_compared(parts):
    return Compared(*(np.concatenate([getattr(c, f) for c in parts]) for f in Compared.__slots__))


def keys(s):
    """One int64 per row: its (prompt, pos)."""
    return s.prompt.astype(np.int64) << 32 | s.pos.astype(np.int64)


def join(a, b):
    """Indices of the positions both a and b scored, in (prompt, pos) order."""
    _, ia, ib = np.intersect1d(keys(a), keys(b), assume_unique=True, return_indices=True)
    return ia, ib


def chunks(n):
    return [slice(i, i + CHUNK_ROWS) for i in range(0, n, CHUNK_ROWS)] or [slice(0, 0)]


def in_order(s, full=None):
    """`s` with each top-k list in the order its values give: the float32 log-probabilities (what
    the judge computes on) descending, ties to the lower id, so the argmax, the margin (top-1
    minus top-2) and the rank never depend on the order a producer listed its tokens in. A list
    holding a non-finite value is left as it is: its position has an infinite KL and fails
    first. `full` (the candidate's full log-probabilities at `s`'s ids) follows its rows."""
    v = float32(s.logprob)
    if v.shape[1] < 2:
        return s, full
    ahead_, after = v[:, :-1], v[:, 1:]
    tie_ok = (ahead_ == after) & (s.ids[:, :-1] < s.ids[:, 1:])
    finite = np.isfinite(v).all(1)
    bad = np.flatnonzero(finite & ~((ahead_ > after) | tie_ok).all(1))
    if not len(bad):
        return s, full
    order = np.lexsort((s.ids[bad], -v[bad]))  # each row: by value descending, then id
    s = Scores(s.prompt, s.pos, s.ref_logprob, s.ids.copy(), s.logprob.copy())
    s.ids[bad] = np.take_along_axis(s.ids[bad], order, 1)
    s.logprob[bad] = np.take_along_axis(s.logprob[bad], order, 1)
    if full is not None:
        full = full.copy()
        full[bad] = np.take_along_axis(full[bad], order, 1)
    return s, full


def compare(a, b, full_b=None, threads=None):
    """Compare two producers' tables position by position, with the shared estimator (the tokens
    both kept, plus a rest bucket); with `full_b` (b's log-probabilities of a's kept ids, from a
    full logits row), the `against` estimator (a's kept tokens, plus a rest bucket: tighter).
    Each list is taken in the order of its values (`in_order`). Chunks are measured on every
    core; each chunk's numbers do not depend on how many."""
    if not (np.array_equal(a.prompt, b.prompt) and np.array_equal(a.pos, b.pos)):
        ia, ib = join(a, b)
        a, b = a.take(ia), b.take(ib)
        full_b = None if full_b is None else full_b[ib]
    a, full_b = in_order(a, full_b)
    b, _ = in_order(b)

    def one(c):
        return measure(a.ids[c], a.logprob[c], b.ids[c], b.logprob[c],
                       None if full_b is None else full_b[c])  # fmt: skip

    cs = chunks(len(a.pos))
    with ThreadPoolExecutor(min(threads or build.available_cpus(), len(cs))) as pool:
        parts = list(pool.map(one, cs))
    kl, kl_rev, rank, overlap, twice = (np.concatenate([p[i] for p in parts]) for i in range(5))
    if twice.any():
        j = int(np.flatnonzero(twice)[0])
        raise ScoreError(f"a top-k list names a token twice at prompt {a.prompt[j]} position "
                         f"{a.pos[j]}")  # fmt: skip
    lp_a, lp_b = (float32(x.logprob[:, :2]).astype(np.float64) for x in (a, b))
    with np.errstate(invalid="ignore"):  # inf - inf: a NaN margin; the report says where
        margin_a, margin_b = lp_a[:, 0] - lp_a[:, 1], lp_b[:, 0] - lp_b[:, 1]
    return Compared(
        a.prompt, a.pos, kl, kl_rev,
        a.ids[:, 0] != b.ids[:, 0],
        margin_a, margin_b,
        rank, overlap,
        float32(a.ref_logprob), float32(b.ref_logprob),
        a.ids[:, 0], b.ids[:, 0],
    )  # fmt: skip


def quantiles(v, *qs):
    """kern's quantiles: the sorted values at index round((n - 1) q), from one partition."""
    if len(v) == 0:
        return [0.0] * len(qs)
    at = [round((len(v) - 1) * q) for q in qs]
    part = np.partition(v, at)
    return [float(part[i]) for i in at]


def quantile(v, q):
    return quantiles(v, q)[0]


@dataclass(slots=True)
class Band:
    """The widest disagreement between reference producers, over every ordered pair: the largest
    margin at which one flipped another's argmax, flip rate, KL p50 and p99 (at least `floor`);
    `measured_p50` and `measured_p99` are the producers' own largest KL quantiles, before the
    floor."""

    margin: float = 0.0
    flip_rate: float = 0.0
    kl_p50: float = KL_FLOOR
    kl_p99: float = KL_FLOOR
    floor: float = KL_FLOOR
    measured_p50: float = 0.0
    measured_p99: float = 0.0


def band(between, floor=KL_FLOOR):
    """The band from each unordered pair of producers compared once: with the shared estimator
    KL(y || x) is the reverse KL of x against y, and y's margin is measured beside x's. Its KL
    p50 and p99 are the measured ones, at least `floor`."""
    if not between:
        return None
    b = Band()
    for c in between.values():
        if len(c.kl) == 0:
            continue
        for margin, kl in ((c.margin, c.kl), (c.margin_b, c.kl_reverse)):
            b.margin = max(b.margin, float(margin[c.flip].max(initial=0.0)))
            b.flip_rate = max(b.flip_rate, float(c.flip.mean()))
            p50, p99 = quantiles(kl, 0.5, 0.99)
            b.measured_p50, b.measured_p99 = max(b.measured_p50, p50), max(b.measured_p99, p99)
    b.floor = floor
    b.kl_p50, b.kl_p99 = max(floor, b.measured_p50), max(floor, b.measured_p99)
    return b


def smallest_seen(band_, limit):
    """The smallest KL the verdict can see: with a band, its KL p50, max(floor, the producers'
    largest KL p50); a candidate whose KL is at most that at every position has a KL p50 and
    p99 within the band's (p50 <= p99 in each pair, so in the band too) and fails only on a
    flip. With one producer, the KL limit: a larger KL anywhere keeps a PASS from being given."""
    return band_.kl_p50 if band_ else limit


def confident(c, band_, limit):
    """The flips that fail: above the band's margin, or (one producer) beyond the KL limit."""
    return c.flip & ((c.margin > band_.margin) if band_ else (c.kl > limit))


def stats(c, sel, conf):
    """One stratum's numbers; `conf` marks the confident flips."""
    kl = c.kl[sel]
    n = len(kl)
    if n == 0:
        return None
    flips = c.flip[sel]
    p50, p99, top = quantiles(kl, 0.5, 0.99, 1.0)
    finite = kl[np.isfinite(kl)]
    return dict(
        positions=n, flips=int(flips.sum()), flip_rate=float(flips.mean()),
        confident=int(conf[sel].sum()), kl_p50=p50, kl_p99=p99, kl_max=top,
        kl_mean=float(finite.mean()) if len(finite) else math.inf,
        kl_reverse_p99=quantile(c.kl_reverse[sel], 0.99),
        overlap_mean=float(c.overlap[sel].mean()),
    )  # fmt: skip


def steps_and_phases(trace, c):
    """The decode step of each compared position (0 at the prefill position) and its depth."""
    ctx = np.array([trace.schedule(i).ctx for i in range(len(trace.prompts))], np.int64)
    step = c.pos.astype(np.int64) - (ctx[c.prompt] - 1)
    return step, c.pos.astype(np.int64) + 1


def strata(trace, c, band_, limit):
    """Every statistic per source name, phase, decode-step bucket and context-depth bucket."""
    step, depth = steps_and_phases(trace, c)
    names = sorted({p.name for p in trace.prompts})
    code = np.array([names.index(p.name) for p in trace.prompts], np.int32)[c.prompt]
    conf = confident(c, band_, limit)
    out = {"all": stats(c, slice(None), conf)}
    for phase, sel in (("prefill", step == 0), ("decode", step > 0)):
        out[f"phase {phase}"] = stats(c, sel, conf)
    for lo, hi in DECODE_BUCKETS:
        out[f"decode steps {lo:,}-{hi:,}"] = stats(c, (step >= lo) & (step <= hi), conf)
    for lo, hi in DEPTH_BUCKETS:
        out[f"depth {lo:,}-{hi:,}"] = stats(c, (depth >= lo) & (depth <= hi), conf)
    for j, name in enumerate(names):
        out[f"source {name}"] = stats(c, code == j, conf)
    return {k: v for k, v in out.items() if v is not None}


def trailing_mean(x, w, steps=None):
    """The mean of the values of the last w decode steps at each index (fewer at the start, and
    where steps are missing): `steps` (ascending) are the values' decode steps, 1, 2, 3, ...
    when not given."""
    x = np.where(np.isfinite(x), x, 1e300)
    s = np.cumsum(np.r_[0.0, x])
    i = np.arange(1, len(x) + 1)
    lo = np.maximum(i - w, 0) if steps is None else np.searchsorted(steps, steps - w + 1)
    return (s[i] - s[lo]) / (i - lo)


def left_at(kl_by_step, threshold, steps=None):
    """The first decode step from which the trailing mean KL stays above the threshold (None: it
    ends within it). `kl_by_step[j]` is the KL at decode step `steps[j]` (ascending; a step may
    be missing), or at step j + 1 when `steps` is not given."""
    if len(kl_by_step) == 0:
        return None
    steps = np.arange(1, len(kl_by_step) + 1) if steps is None else np.asarray(steps, np.int64)
    over = trailing_mean(kl_by_step, DRIFT_WINDOW, steps) > threshold
    if not over[-1]:
        return None
    within = np.flatnonzero(~over)
    return int(steps[within[-1] + 1] if len(within) else steps[0])


def drift(trace, c, threshold):
    """Per prompt and overall (the mean KL over prompts at each decode step), the step the
    candidate left the band at. Steps are decode steps: one a prompt lacks is not counted, and
    a step no prompt has is left out of the overall mean (`mean_by_step` holds 0 there)."""
    step, _ = steps_and_phases(trace, c)
    dec = step > 0
    per = {}
    for i in np.unique(c.prompt[dec]):
        sel = dec & (c.prompt == i)
        order = np.argsort(step[sel])
        per[int(i)] = left_at(c.kl[sel][order], threshold, step[sel][order])
    if not dec.any():
        return per, None, np.zeros(0)
    n = int(step[dec].max())
    total = np.bincount(step[dec] - 1, weights=np.minimum(c.kl[dec], 1e300), minlength=n)
    count = np.bincount(step[dec] - 1, minlength=n)
    mean = total / np.maximum(count, 1)
    has = np.flatnonzero(count)
    return per, left_at(mean[has], threshold, has + 1), mean


@dataclass(slots=True)
class Verdict:
    code: int  # 0 pass, 1 fail, 2 inconclusive
    word: str
    why: str


def verdict(results, band_, limit):
    """kern's rules, on one estimator (docs/scoring.md "Judging a candidate"). `results` maps each
    reference producer to the candidate compared against it. An infinite KL (non-finite
    log-probabilities on either side) fails first: no band excuses it."""
    at_once = (
        (lambda c: ~np.isfinite(c.kl), lambda c, j, n: (
            f"non-finite log-probabilities at prompt {c.prompt[j]} pos {c.pos[j]} (infinite KL "
            f"at {n} positions)")),
        (lambda c: confident(c, band_, limit), lambda c, j, n: (
            f"confident argmax flip at prompt {c.prompt[j]} pos {c.pos[j]} ({c.argmax_a[j]} -> "
            f"{c.argmax_b[j]}, margin {c.margin[j]:.3f}, KL {c.kl[j]:.1e})")),
    )  # fmt: skip
    for failing, why in at_once:
        for name, c in results.items():
            bad = np.flatnonzero(failing(c))
            if len(bad):
                return Verdict(1, "FAIL", f"{why(c, bad[0], len(bad))} against {name}")
    n = min(len(c.kl) for c in results.values())
    if band_:
        over = []
        for name, c in results.items():
            rate, p50, p99 = float(c.flip.mean()), quantile(c.kl, 0.5), quantile(c.kl, 0.99)
            what = [w for o, w in (
                (rate > band_.flip_rate, f"flip rate {rate:.2%}"),
                (p50 > band_.kl_p50, f"KL p50 {p50:.1e}"),
                (p99 > band_.kl_p99, f"KL p99 {p99:.1e}"),
            ) if o]  # fmt: skip
            if what:
                over.append(f"against {name}: {', '.join(what)}")
        if over:
            return Verdict(1, "FAIL", "beyond the band: " + "; ".join(over))
        return Verdict(
            0, "PASS", f"within the band of {len(results)} producers on all {n} positions"
        )
    ((name, c),) = results.items()
    kl_max = float(c.kl.max(initial=0.0))
    if kl_max <= limit:
        return Verdict(0, "PASS", f"within KL {limit:.0e} of {name} on all {n} positions")
    return Verdict(2, "INCONCLUSIVE", (
        f"KL up to {kl_max:.1e} (limit {limit:.0e}) against {name} with no confident flip on "
        f"{n} positions; record a second reference producer to make a band"
    ))  # fmt: skip


BATCH_ROWS = 1 << 13  # scored positions judged together, at least: a stream's memory is bounded


def batch(names, parts):
    """One batch from the parts of several prompts: each reference producer's scores and the
    candidate's."""
    refs = {n: concat_scores([r[n] for r, _ in parts if n in r]) for n in names}
    return refs, concat_scores([c for _, c in parts]), None


LOGPROB_SLACK = 1e-5  # float32 rounding of a normalised top-k table stays far within it


def logprobs(s, who):
    """Refuse a table whose finite values are not log-probabilities: one above 0, or kept
    probabilities summing above 1, by more than LOGPROB_SLACK (raw logits written as
    log-probabilities make the KL negative). A list naming an id twice is refused as that first
    (its probability would count twice). Non-finite values are left to the verdict, which fails
    on them."""
    twice = listed_twice(s.ids)
    if twice is not None:
        j, v = twice
        raise ScoreError(f"{who}: prompt {s.prompt[j]} position {s.pos[j]} lists id {v} twice")
    v = float32(s.logprob).astype(np.float64)
    finite = np.isfinite(v)
    with np.errstate(over="ignore"):
        top = np.where(finite, v, -np.inf).max(1, initial=-np.inf)
        mass = np.where(finite, np.exp(np.minimum(v, 700.0)), 0.0).sum(1)
    bad = np.flatnonzero((top > LOGPROB_SLACK) | (mass > 1 + LOGPROB_SLACK))
    if len(bad):
        j = bad[0]
        what = (f"log-probability {top[j]:.4g} above 0" if top[j] > LOGPROB_SLACK else
                f"kept probabilities summing to {mass[j]:.6g}, above 1")  # fmt: skip
        raise ScoreError(
            f"{who}: prompt {s.prompt[j]} position {s.pos[j]} lists {what}: a top-k table "
            "holds log-probabilities (the log-softmax of the logits), not logits"
        )


def at(s, other):
    """The rows of `s` at the positions `other` scored too."""
    keep = np.isin(keys(s), keys(other), assume_unique=True)
    return s if keep.all() else s.take(keep)


def judge_batches(ref, batches, limit=LIMIT_KL, estimator="shared", candidate=None,
                  floor=KL_FLOOR):  # fmt: skip
    """Everything the report says, as data: the band, the candidate against every reference
    producer, the strata, the drift and the verdict. `batches` gives (each reference producer's
    scores, the candidate's, the candidate's full log-probabilities at each producer's ids or
    None) for whole prompts; `ref.prompts` is whole once they are given. `candidate`, the
    candidate's producer name, is never a reference producer: a file that holds it too is
    judged against its other producers alone. The band is measured on the positions the
    candidate scored, like with like; a reference producer or a pair of them that shares no
    such position is refused, never judged on nothing. `floor` is the least the band's KL p50
    and p99 are (kern's KL_FLOOR by default; lower to judge float32 engines exactly)."""
    names = sorted(n for n in ref.producers if n != candidate)
    if not names:
        raise ScoreError(f"the reference has no producer but the candidate's ({candidate!r}): "
                         "nothing to judge against")  # fmt: skip
    who = "the candidate" + (f" ({candidate!r})" if candidate else "")
    pairs = [(x, y) for i, x in enumerate(names) for y in names[i + 1 :]]
    between, got = {p: [] for p in pairs}, {n: [] for n in names}
    rows, cand_rows = dict.fromkeys(names, 0), 0  # each side's scored positions
    widths = {}  # each side's top-k length (a trace keeps one per producer)
    for refs, cand, full in batches:
        logprobs(cand, who)
        cand_rows += len(cand.pos)
        if len(cand.pos):
            widths[None] = cand.ids.shape[1]
        here = {}
        for n in names:
            logprobs(refs[n], f"reference producer {n!r}")
            rows[n] += len(refs[n].pos)
            if len(refs[n].pos):
                widths[n] = refs[n].ids.shape[1]
            here[n] = at(refs[n], cand)
        for x, y in pairs:
            between[x, y].append(compare(here[x], here[y]))
        for n in names:
            fb = full[n] if estimator == "against" else None
            got[n].append(compare(refs[n], cand, fb))
    between = {p: concat_compared(v) for p, v in between.items()}
    results = {n: concat_compared(v) for n, v in got.items()}
    if all(len(c.kl) == 0 for c in results.values()):
        raise ScoreError("the reference and the candidate share no scored position")
    for n, c in results.items():
        if len(c.kl) == 0:
            raise ScoreError(f"reference producer {n!r} shares no scored position with "
                             f"{who}: nothing to judge against it")  # fmt: skip
    for (x, y), c in between.items():
        if len(c.kl) == 0:
            raise ScoreError(f"reference producers {x!r} and {y!r} share no scored position "
                             f"that {who} has: no band between them")  # fmt: skip
    band_ = band(between, floor)
    v = verdict(results, band_, limit)
    first = names[0]
    threshold = band_.kl_p99 if band_ else limit
    per, overall, mean = drift(ref, results[first], threshold)
    return dict(
        band=band_, estimator=estimator, results=results, between=between, verdict=v,
        limit=limit, kl_floor=floor, kl_seen=smallest_seen(band_, limit),
        strata={n: strata(ref, c, band_, limit) for n, c in results.items()},
        drift=dict(against=first, threshold=threshold, overall=overall, per_prompt=per,
                   mean_by_step=mean),
        rows=rows, candidate_rows=cand_rows, left_out=candidate if candidate in ref.producers else None,
        top_k=dict(candidate=widths.get(None), **{n: widths.get(n) for n in names}),
    )  # fmt: skip


def judge(ref, cand, full=None, limit=LIMIT_KL, estimator=None, candidate=None, floor=KL_FLOOR):
    """judge_batches on a whole reference (a Trace) and candidate (Scores) in memory."""
    others = [n for n in ref.producers if n != candidate]
    estimator = estimator or ("against" if full is not None and len(others) < 2
                              else "shared")  # fmt: skip
    return judge_batches(ref, [(ref.producers, cand, full)], limit, estimator, candidate, floor)
