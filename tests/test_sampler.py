"""The shared sampler's fast paths against their plain definitions (scoring/engines/__init__.py):
`top_k` selects before it sorts and `sample` and `normalised` compute in reused buffers; each must
give the bytes of the definition written plainly here, on rows full of ties, NaNs and infinities,
across top_k's block boundaries."""

import math

import numpy as np

from scoring.engines import normalised, sample, sampled_top_k, top_k


def plain_normalised(row):
    row = np.asarray(row, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        m = row.max()
        return row - (m + np.log(np.exp(row - m).sum()))


def plain_top_k(row, k, next_id=None):
    """Sort the whole row: by value, NaN below every number, exact ties to the lower id."""
    lp = plain_normalised(row)
    key = np.where(np.isnan(lp), -np.inf, lp)
    k = min(k, len(key))
    order = np.lexsort((np.arange(len(key)), -key))[:k]
    fed = float(lp[next_id]) if next_id is not None else math.nan
    return order.astype(np.int32), lp[order], fed


def plain_sample(row, u, never, size=1024):
    """The softmax with NaN as -inf and the never ids out, inverted in blocks of `size` ids."""
    x = np.asarray(row, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        x = np.where(np.isnan(x), -np.inf, x)
        p = np.nan_to_num(np.exp(x - x.max()), nan=0.0)
    p[np.asarray(never, np.int64)] = 0.0
    blocks = [p[a : a + size] for a in range(0, len(p), size)]
    running = np.cumsum([b.sum() for b in blocks])
    if not running[-1] > 0:
        return min(set(range(len(p))) - set(never))
    at = u * running[-1] if u > 0 else np.nextafter(0.0, 1.0)
    j = next((j for j, r in enumerate(running) if r >= at), len(blocks) - 1)
    cdf = (running[j - 1] if j else 0.0) + np.cumsum(blocks[j])
    return j * size + next(i for i, c in enumerate(cdf) if c >= min(at, cdf[-1]))


def rows(seed):
    """Rows of every kind top_k and sample meet: few distinct values (ties everywhere, also at
    the k-th), some -inf, sometimes a NaN or +inf, values that only their log-probabilities'
    rounding ties, float32 like an engine's or float64."""
    rng = np.random.default_rng(seed)
    for n in (1, 2, 7, 1023, 1024, 1025, 3000, 5000):
        for case in range(14):
            values = rng.choice([-np.inf, -3.0, -1.5, 0.0, 0.25, 2.0, 2.0 + 2**-20, 7.0],
                                size=int(rng.integers(1, 9)), replace=False)  # fmt: skip
            row = rng.choice(values, size=n)
            if case % 4 == 1:
                row = row + rng.standard_normal(n) * (case % 3 == 0)
            if case == 5:
                row[rng.integers(n)] = np.nan
            if case == 6:
                row[rng.integers(n)] = np.inf
            if case == 7:
                row[:] = -np.inf
            if case == 8:  # apart by less than float64 rounds at their log-probability: ties
                row = 1.0 - rng.integers(0, 4, n) * 2.0**-53
            yield row.astype(np.float32 if case % 2 and case != 8 else np.float64)
    big = np.repeat(np.float32(1.5), 248_320)  # Qwen's vocabulary, one value, then a few above
    big[rng.integers(248_320, size=40)] = rng.choice([2.0, 3.0], size=40)
    yield big


def same(a, b):
    return np.array_equal(a, b, equal_nan=True) and np.asarray(a).dtype == np.asarray(b).dtype


def same_top(got, want):
    """Two top_k results: the same ids, log-probabilities and fed log-probability, bit for bit."""
    fed = got[2] == want[2] or (math.isnan(got[2]) and math.isnan(want[2]))
    return same(got[0], want[0]) and same(got[1], want[1]) and fed


def test_top_k_sample_and_normalised_are_their_plain_definitions():
    rng = np.random.default_rng(7)
    checked = 0
    for row in rows(36):
        n = len(row)
        assert same(normalised(row), plain_normalised(row))
        for k in {1, 2, 3, 20, n - 1, n, n + 3} - {0}:
            nxt = int(rng.integers(n))
            got, want = top_k(row, k, nxt), plain_top_k(row, k, nxt)
            assert same(got[0], want[0]) and same(got[1], want[1]), (n, k, row[:8])
            assert got[2] == want[2] or (math.isnan(got[2]) and math.isnan(want[2]))
            checked += 1
        for u in (0.0, rng.random(), rng.random(), 1 - 2**-53):
            never = tuple(rng.choice(n, size=min(n - 1, int(rng.integers(0, 3))), replace=False))
            token = plain_sample(row, u, never)
            assert sample(row, u, never) == token, (n, u, never)
            k = int(rng.choice([1, 20, n + 3]))  # a reference's position: both from one exp
            got = sampled_top_k(row, k, u, never)
            assert got[0] == token and same_top(got[1], plain_top_k(row, k, token))
        assert sample(row, 0.5, tuple(range(n - 1))) == plain_sample(row, 0.5, tuple(range(n - 1)))
        if not np.isnan(row).any() and np.isfinite(row.max()) and (row > -np.inf).sum() > 1:
            drawn = sample(row, 0.0, (int(np.argmax(row > -np.inf)),))  # never one of p = 0
            assert row[drawn] > -np.inf and drawn != int(np.argmax(row > -np.inf))
    assert checked > 500


def test_transformers_reads_rows_of_every_dtype_as_torch_does():
    """On the CPU the transformers engine reduces its row with these functions: a bfloat16 or
    float16 row (numpy has neither bfloat16 nor torch's view of it) gives what torch's own
    reduction (`torch_top`, float64) and the float64 row give."""
    import torch

    from scoring.engines.transformers import Transformers, torch_top

    rng = np.random.default_rng(3)
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
        row = torch.from_numpy(rng.standard_normal(5000) * 4).to(dtype)
        ids, lp, fed = Transformers.top(None, row, 20, 7)
        want = torch_top(row, 20, 7)
        assert np.array_equal(ids, want[0]) and np.allclose(lp, want[1], rtol=0, atol=1e-12)
        assert abs(fed - want[2]) < 1e-12
        for u in (0.1, 0.5, 0.9):
            token, top = Transformers.draw(None, row, 20, u, (1,))
            assert token == sample(row.double().numpy(), u, (1,))
            assert same_top(top, top_k(row.double().numpy(), 20, token))


def test_a_float32_row_is_computed_in_float64_and_no_row_warns():
    """An engine's float32 row gives the float64 row's numbers, bit for bit, and float64 out;
    rows with NaN, infinities or nothing but -inf give no numpy warning (warnings are errors
    here: an engine's output reaches the user's stderr through them)."""
    import warnings

    rng = np.random.default_rng(7)
    row32 = (rng.normal(0, 3, 3000)).astype(np.float32)
    row64 = row32.astype(np.float64)
    assert normalised(row32).dtype == np.float64
    assert np.array_equal(normalised(row32), normalised(row64))
    ids32, lp32, fed32 = top_k(row32, 20, 5)
    ids64, lp64, fed64 = top_k(row64, 20, 5)
    assert lp32.dtype == np.float64 and np.array_equal(lp32, lp64) and fed32 == fed64
    assert np.array_equal(ids32, ids64)
    for u in (0.0, 0.3, 0.999):
        assert sample(row32, u, [1, 2]) == sample(row64, u, [1, 2])
    nan32 = row32.copy()
    nan32[10] = np.nan
    assert sample(nan32, 0.4, []) == sample(nan32.astype(np.float64), 0.4, [])
    odd = [np.full(3000, -np.inf), np.r_[row64[:-1], np.nan], np.r_[row64[:-1], np.inf],
           np.full(3000, np.inf), np.r_[row64[:-2], -np.inf, np.nan]]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for row in odd:
            for r in (row, row.astype(np.float32)):
                normalised(r)
                top_k(r, 20, 3)
                sample(r, 0.5, [0])
