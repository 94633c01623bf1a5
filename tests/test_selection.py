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
    return build.Tokens(path, jobs=2)


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
        c = build.Candidate(f"r@v#{i}", trajectory(rng, i), unique=f"traj-{i % 40}")
        c.bound = build.messages_bytes(c.messages[: build.last_assistant(c.messages)])
        out.append(c)
    return out


def brute_force_longest(tok, cands, count, lo, hi):
    best = {}
    for c in cands:
        k = build.last_assistant(c.messages)
        n = build.prompt_tokens_plain(tok, c.messages[:k])
        if lo <= n <= hi:
            entry = (-n, c.key, c.id)
            if c.unique not in best or entry < best[c.unique]:
                best[c.unique] = entry
    return [e[2] for e in sorted(best.values())[:count]]


@pytest.mark.parametrize("lo, hi", [(1, 10**6), (1, 9_000), (3_000, 6_000)])
def test_longest_agrees_with_brute_force_including_ties_and_duplicates(tokenizer, lo, hi):
    cands = candidates(120)
    fill = build.Fill(build.slot("full", 5, lo, hi, view="before-last", longest=True))
    looked = build.fill_longest(fill, cands, set(), lambda n: None, tokenizer, "test")
    want = brute_force_longest(tokenizer, candidates(120), 5, lo, hi)
    assert [r.candidate.id for r in fill.rows] == want
    for r in fill.rows:
        assert r.tokens == build.prompt_tokens_plain(tokenizer, r.messages)
    if (lo, hi) == (1, 10**6):
        assert looked < len(cands), "bounds spared some candidates from being counted at all"


def source(*slots, groups=()):
    return build.Source("test-source", "r", "r", "", "", "", slots=slots, groups=groups)


def test_first_fit_in_sha256_order_and_uniqueness(mini):
    tok = build.Tokens(mini.tokenizer, jobs=1)
    cands = [
        build.Candidate(f"r@v#{i}", [{"role": "user", "content": "x" * (10 + i)}], unique=i % 5)
        for i in range(30)
    ]
    order = sorted(cands, key=lambda c: c.key)
    slots = (build.slot("standard", 2, 1, 100), build.slot("full", 2, 1, 100))
    rows = build.select(source(*slots), cands, Counter(), tok)
    seen, want = set(), []
    for c in order:
        if c.unique not in seen and len(want) < 4:
            want.append(c.id)
            seen.add(c.unique)
    assert [r.candidate.id for r in rows] == want
    assert [r.slot.split for r in rows] == ["standard", "standard", "full", "full"]


def test_a_short_slot_names_source_slot_candidates_and_reasons(mini):
    tok = build.Tokens(mini.tokenizer, jobs=1)
    cands = [
        build.Candidate(
            f"r@v#{i}", [{"role": "user", "content": "y" * 50}], group="en" if i < 3 else "zh"
        )
        for i in range(6)
    ]
    with pytest.raises(build.BuildError) as e:
        build.select(
            source(build.slot("standard", 4, 1, 100, group="en")),
            cands,
            Counter({"synthetic": 7}),
            tok,
        )
    message = str(e.value)
    assert message.startswith(
        "test-source: slot 'standard 4 group=en whole [1, 100]' has 3 of 4 rows"
    )
    assert "looking at 6 of 6 candidates" in message
    assert "3 filter" in message and "7 synthetic" in message
