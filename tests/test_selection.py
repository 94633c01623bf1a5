"""The selection engine on hand-made candidates: longest slots against brute force, first fit in
sha256 order, and the shortfall message."""

import random
from collections import Counter

import pytest
from test_tokens import mixed_text

import build


@pytest.fixture(params=["byte", "qwen"])
def tokenizer(request, mini):
    path = request.getfixturevalue("qwen_tokenizer") if request.param == "qwen" else mini.tokenizer
    build.load_tokenizer(path, jobs=2)
    return path


def trajectory(rng, i):
    """A conversation of a random length; some share content so that token counts tie."""
    turns = rng.randrange(2, 12)
    messages = [{"role": "system", "content": "You are a coding agent."}]
    for t in range(turns):
        seed = (i % 7) * 100 + t if i % 3 == 0 else i * 100 + t
        messages.append({"role": "user", "content": mixed_text(seed, rng.randrange(10, 4_000))})
        messages.append(
            {"role": "assistant", "content": mixed_text(seed + 50, rng.randrange(10, 400))}
        )
    return messages


def candidates(n, seed=0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        c = build.candidate("r", "v", i, trajectory(rng, i), unique=f"traj-{i % 40}")
        c["bound"] = build.messages_bytes(c["messages"][: build.last_assistant(c["messages"])])
        out.append(c)
    return out


def brute_force_longest(cands, count, lo, hi):
    best = {}
    for c in cands:
        k = build.last_assistant(c["messages"])
        n = sum(build.count_plain(m["content"]) for m in c["messages"][:k])
        if lo <= n <= hi:
            entry = (-n, c["key"], c["id"])
            if c["unique"] not in best or entry < best[c["unique"]]:
                best[c["unique"]] = entry
    return [e[2] for e in sorted(best.values())[:count]]


@pytest.mark.parametrize("lo, hi", [(1, 10**6), (1, 9_000), (3_000, 6_000)])
def test_longest_agrees_with_brute_force_including_ties_and_duplicates(tokenizer, lo, hi):
    cands = candidates(120)
    s = dict(
        build.slot("full", 5, lo, hi, view="before-last", longest=True), rows=[], rejected=Counter()
    )
    looked = build.fill_longest(s, cands, set(), lambda n: None)
    assert [r["id"] for r in s["rows"]] == brute_force_longest(candidates(120), 5, lo, hi)
    for r in s["rows"]:
        assert r["tokens"] == sum(build.count_plain(m["content"]) for m in r["messages"])
    if (lo, hi) == (1, 10**6):
        assert looked < len(cands), "bounds spared some candidates from being counted at all"


def test_first_fit_in_sha256_order_and_uniqueness(mini):
    build.load_tokenizer(mini.tokenizer, jobs=1)
    cands = [
        build.candidate("r", "v", i, [{"role": "user", "content": "x" * (10 + i)}], unique=i % 5)
        for i in range(30)
    ]
    order = sorted(cands, key=lambda c: c["key"])
    build.SOURCES["test-source"] = dict(
        repo="r", slots=[build.slot("standard", 2, 1, 100), build.slot("full", 2, 1, 100)]
    )
    try:
        rows = build.select("test-source", cands, Counter(), quiet=True)
    finally:
        del build.SOURCES["test-source"]
    seen, want = set(), []
    for c in order:
        if c["unique"] not in seen and len(want) < 4:
            want.append(c["id"])
            seen.add(c["unique"])
    assert [r["id"] for r in rows] == want
    assert [r["slot"]["split"] for r in rows] == ["standard", "standard", "full", "full"]


def test_a_short_slot_names_source_slot_candidates_and_reasons(mini):
    build.load_tokenizer(mini.tokenizer, jobs=1)
    cands = [
        build.candidate(
            "r", "v", i, [{"role": "user", "content": "y" * 50}], group="en" if i < 3 else "zh"
        )
        for i in range(6)
    ]
    build.SOURCES["test-source"] = dict(
        repo="r", slots=[build.slot("standard", 4, 1, 100, group="en")]
    )
    try:
        with pytest.raises(build.BuildError) as e:
            build.select("test-source", cands, Counter({"synthetic": 7}), quiet=True)
    finally:
        del build.SOURCES["test-source"]
    message = str(e.value)
    assert message.startswith(
        "test-source: slot 'standard 4 group=en whole [1, 100]' has 3 of 4 rows"
    )
    assert "looking at 6 of 6 candidates" in message
    assert "3 filter" in message and "7 synthetic" in message
