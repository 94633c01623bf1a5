"""The selection engine, the views and the token count on in-memory candidates (README "How rows
are chosen"), each checked against a plain reference written here from the definitions.

The fast layer of the suite: no files are read and no build is run. The tokenizer is the
byte-level one of tests/make_sources.py, whose count of a text is the UTF-8 length of its NFC form
("x" * n has n tokens) and whose one added token, <|endoftext|>, is 13 bytes and 1 token (so byte
bounds can be loose). Counting in pieces is made to happen on short texts by shrinking the piece
size (`pieces` fixture)."""

import hashlib
import random
import sys
import unicodedata
from collections import Counter
from dataclasses import replace

import pytest
from make_sources import make_tokenizer

import build

INF = build.INF
SPECIAL = "<|endoftext|>"


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("engine") / "tokenizer.json")


@pytest.fixture
def tok(tokenizer_path):
    """A fresh Tokens (its memory of counted contents starts empty), recording every call to the
    tokenizer in `tok.calls`."""
    t = build.Tokens(tokenizer_path, jobs=1)
    encode = t.encode
    t.calls = []

    def recorded(texts):
        t.calls.append(list(texts))
        return encode(texts)

    t.encode = recorded
    return t


@pytest.fixture
def pieces(monkeypatch):
    """Pieces of 8 characters, 2 to a batch: a text over 16 characters is counted in pieces."""
    monkeypatch.setattr(build, "CHUNK_CHARS", 8)
    monkeypatch.setattr(build, "BATCH_CHUNKS", 2)


def plain(tok, text):
    return tok.plain(text) if isinstance(text, str) else 0


def tokens_of(tok, messages):
    """The definition: the sum over string contents of len(encode(content))."""
    return sum(plain(tok, m["content"]) for m in messages)


def msg(role, content):
    return {"role": role, "content": content}


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def source(*slots, groups=()):
    return build.Source("test-source", "r", "r", "", "", "", slots=slots, groups=groups)


def ids_in_inverted_order(n=2):
    """n ids whose sha256 order is the reverse of their list order and of their string order."""
    ids = [f"r@v#{i}" for i in range(100)]
    for i in range(len(ids)):
        group = [ids[i]]
        for other in ids[i + 1 :]:
            if sha(other) < sha(group[-1]):
                group.append(other)
                if len(group) == n:
                    return group
    raise AssertionError("no such ids")


# ------------------------------------------------------------------------------------------------
# References, from README "How rows are chosen"


def ref_last_assistant(messages):
    """The end of the before-last view: the last assistant turn, when a user or tool turn comes
    right before it; None otherwise (also when nothing comes before it)."""
    assistants = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    if not assistants or assistants[-1] == 0:
        return None
    k = assistants[-1]
    return k if messages[k - 1]["role"] in ("user", "tool") else None


def ref_cut_points(messages):
    """Assistant turns after a user or tool turn, from k = 2 (cut_points in build.py)."""
    return [
        k
        for k, m in enumerate(messages)
        if k >= 2 and m["role"] == "assistant" and messages[k - 1]["role"] in ("user", "tool")
    ]


def ref_book(tok, c, T, counts=None):
    """Instruction + the book up to its last paragraph end whose prompt tokens are <= T
    (`counts`: the prompt tokens at each paragraph end, when known)."""
    b = c.book
    prompts = [build.BOOK_INSTRUCTION[b.lang] + "\n\n" + b.text[b.start : e] for e in b.ends]
    counts = counts or [tok.plain(p) for p in prompts]
    within = [i for i, n in enumerate(counts) if n <= T]
    if not within:
        return None
    i = within[-1]
    return [msg("user", prompts[i])], counts[i], f"#{b.start}-{b.ends[i]}"


def ref_view(tok, s, c, messages):
    """(messages, tokens, source suffix) of the slot's view, or None."""
    if s.view == "book":
        return ref_book(tok, c, s.T)
    if s.view == "whole":
        k = len(messages)
    elif s.view == "before-last":
        k = ref_last_assistant(messages)
    else:
        within = [k for k in ref_cut_points(messages) if tokens_of(tok, messages[:k]) <= s.T]
        k = max(within, default=None)
    if k is None:
        return None
    suffix = f":{k}" if k < len(messages) else ""
    return messages[:k], tokens_of(tok, messages[:k]), suffix


def ref_select(tok, src, cands, messages_of):
    """Rows as (slot index, id, tokens, source, messages): longest slots first, each taking the
    candidates of most tokens in range (ties: lower sha256), then every candidate in ascending
    sha256 of its id into the first open slot it fits; a used uniqueness key is skipped. Returns
    (rows per slot, index of the first short slot or None)."""
    order = sorted(cands, key=lambda c: sha(c.id))
    taken = {i: [] for i in range(len(src.slots))}
    used = set()  # uniqueness keys, and the ids of rows without one: a row is taken once
    key = lambda c: ("id", c.id) if c.unique is None else c.unique

    def fits(s, c):
        if not all(getattr(c, k) == v for k, v in s.where):
            return None
        v = ref_view(tok, s, c, messages_of(c))
        return v if v and s.lo <= v[1] <= s.hi else None

    for i, s in enumerate(src.slots):
        if not s.longest:
            continue
        ranked = [(v, c) for c in order if (v := fits(s, c))]
        for v, c in sorted(ranked, key=lambda vc: (-vc[0][1], sha(vc[1].id))):
            if len(taken[i]) < s.count and key(c) not in used:
                taken[i].append((i, c.id, v[1], c.id + v[2], v[0]))
                used.add(key(c))
    scan = [i for i, s in enumerate(src.slots) if not s.longest]
    for c in order:
        if all(len(taken[i]) == src.slots[i].count for i in scan):
            break
        if key(c) in used:
            continue
        for i in scan:
            s = src.slots[i]
            if len(taken[i]) < s.count and (v := fits(s, c)):
                taken[i].append((i, c.id, v[1], c.id + v[2], v[0]))
                used.add(key(c))
                break
    short = next((i for i, s in enumerate(src.slots) if len(taken[i]) < s.count), None)
    return taken, short


def ref_rejections(tok, src, cands):
    """For eager candidates in scan slots only: what the shortfall message reports, candidate by
    candidate as the scan meets them (docs/failures.md, a slot left short)."""
    order = sorted(cands, key=lambda c: sha(c.id))
    rows = {i: 0 for i in range(len(src.slots))}
    rejected = {i: Counter() for i in range(len(src.slots))}
    drop, used, seen = Counter(), set(), 0
    for c in order:
        open_slots = [i for i, s in enumerate(src.slots) if rows[i] < s.count]
        if not open_slots:
            break
        seen += 1
        if c.unique is not None and c.unique in used:
            drop["uniqueness rule (already used)"] += 1
            continue
        fitting = []
        for i in open_slots:
            s = src.slots[i]
            if not all(getattr(c, k) == v for k, v in s.where):
                rejected[i]["filter"] += 1
            elif c.bound < s.lo or ref_least(c.messages, s.view) > s.hi:
                rejected[i]["tokens out of range"] += 1
            else:
                fitting.append(i)
        for i in fitting:
            s = src.slots[i]
            v = ref_view(tok, s, c, c.messages)
            if v and s.lo <= v[1] <= s.hi:
                rows[i] += 1
                used.add(c.unique)
                break
            rejected[i]["tokens out of range" if v else "no view"] += 1
    return rows, rejected, drop, seen


def ref_least(messages, view_name):
    """Runs of non-whitespace of the view's messages: no byte-level token holds two."""
    if view_name == "whole":
        k = len(messages)
    elif view_name == "before-last":
        k = ref_last_assistant(messages) or 0
    else:
        return 0
    return sum(len(build.NON_SPACE.findall(build.content_text(m))) for m in messages[:k])


# ------------------------------------------------------------------------------------------------
# Random candidates


def random_content(rng):
    n = rng.randrange(0, 8)
    return rng.choice(
        [
            lambda: "x" * n,
            lambda: " ".join("x" * rng.randrange(1, 3) for _ in range(n)),
            lambda: "é" * n,  # 2 bytes each
            lambda: "e\u0301" * n,  # NFC makes it é: 2 bytes, not 3
            lambda: SPECIAL * (n // 3) + "x",  # 13 bytes, 1 token
            lambda: "x\x1cx" * (n // 2),  # not whitespace for the Qwen split, but for str.split
            lambda: "a\nb\n\n c" * (n // 3),
            lambda: None,  # an assistant turn that only calls tools
        ]
    )()


def random_conversation(rng):
    roles = [rng.choice(["system", "user"])]
    for _ in range(rng.randrange(0, 6)):
        roles.append(rng.choice(["user", "assistant", "assistant", "tool", "system"]))
    return [msg(r, random_content(rng)) for r in roles]


def view_ends(messages):
    """Every k a view of these messages can end at."""
    return [len(messages), *ref_cut_points(messages), ref_last_assistant(messages) or 0]


def random_candidates(rng, n, lazy, unique_always):
    """Candidates with tight, loose or no bounds; some lazy (loaded by one of two loaders)."""
    store, loads = {}, Counter()

    def loader(group):
        for c in group:
            loads[c.id] += 1
            c.messages = [dict(m) for m in store[c.id]]

    def other_loader(group):
        loader(group)

    cands = []
    for i in range(n):
        messages = random_conversation(rng)
        unique = rng.choice([None, "a", "b", "c"]) if not unique_always else rng.choice("abcdefg")
        c = build.Candidate(f"r@v#{i}", messages, unique=unique, group=rng.choice(["en", "zh"]))
        c.lang = rng.choice(["en", "zh", None])
        widest = build.messages_bytes(messages[: max(view_ends(messages))])
        c.bound = rng.choice([INF, widest, widest + rng.randrange(0, 4)])
        store[c.id] = messages
        if lazy and rng.random() < 0.4:
            c.messages, c.load = None, rng.choice([loader, other_loader])
            c.size = rng.randrange(0, 3)
        cands.append(c)
    return cands, store, loads


def random_slots(rng, cands, store, longest):
    """Slots whose ranges start or end at, or next to, the token count of some view."""
    counts = sorted(
        {tokens_of_plain(store[c.id][:k]) for c in cands for k in view_ends(store[c.id])}
    )
    slots = []
    for _ in range(rng.randrange(1, 4)):
        view = rng.choice(["whole", "before-last", "cut"])
        a, b = sorted(rng.choice(counts) for _ in range(2))
        lo = max(0, a + rng.choice([-1, 0, 0, 1]))
        hi = max(lo, b + rng.choice([-1, 0, 0, 1]))
        T = hi if rng.random() < 0.7 else hi + rng.choice([-1, 1])
        where = rng.choice([{}, {}, {"group": "en"}, {"group": "zh", "lang": "zh"}])
        split = rng.choice(["standard", "full"])
        count = rng.randrange(1, 3)
        slots.append(build.slot(split, count, lo, hi, view, T if view == "cut" else None, **where))
    if longest:
        lo = max(0, rng.choice(counts) - 1)
        slot = build.slot("full", rng.randrange(1, 3), lo, INF, "before-last", longest=True)
        slots.insert(rng.randrange(len(slots) + 1), slot)
    return tuple(slots)


def tokens_of_plain(messages):
    """The byte-level count, without the tokenizer: for choosing slot ranges only."""
    return sum(
        len(unicodedata.normalize("NFC", m["content"]).encode()) - 12 * m["content"].count(SPECIAL)
        for m in messages
        if isinstance(m["content"], str)
    )


# ------------------------------------------------------------------------------------------------
# Selection


def fillable(tok, src, cands, store, want, short):
    """The source with each short slot asking only for what the definition gave it (a slot
    given nothing is left out), until no slot is short; lowering one slot's count can change
    what the others get, hence the repetition."""
    for _ in range(8):
        if short is None:
            break
        slots = [replace(s, count=len(want[i])) for i, s in enumerate(src.slots) if want[i]]
        if not slots:
            break
        src = source(*slots)
        want, short = ref_select(tok, src, cands, lambda c, store=store: store[c.id])
    return src, want, short


def test_select_agrees_with_the_definition_on_random_sources(tok):
    for seed in range(400):
        rng = random.Random(seed)
        lazy, longest = rng.random() < 0.5, rng.random() < 0.3
        # Longest slots meet rows without a uniqueness key too: each is taken once.
        cands, store, loads = random_candidates(rng, rng.randrange(1, 12), lazy, False)
        src = source(*random_slots(rng, cands, store, longest))
        want, short = ref_select(tok, src, cands, lambda c, store=store: store[c.id])
        if rng.random() < 0.5:  # half the sources: slots the candidates can fill
            src, want, short = fillable(tok, src, cands, store, want, short)
        drop = Counter()
        if short is not None:
            with pytest.raises(build.BuildError) as e:
                build.select(src, list(cands), drop, tok)
            s = src.slots[short]
            prefix = f"test-source: slot '{s.label}' has {len(want[short])} of {s.count} rows "
            assert str(e.value).startswith(prefix), (seed, str(e.value), prefix)
            continue
        rows = build.select(src, list(cands), drop, tok)
        got = [
            (src.slots.index(r.slot), r.candidate.id, r.tokens, r.source, r.messages) for r in rows
        ]
        assert got == [row for i in range(len(src.slots)) for row in want[i]], seed
        assert all(r.name == "test-source" and r.candidate.id == r.source.split(":")[0]
                   for r in rows)  # fmt: skip
        assert max(loads.values(), default=0) <= 1, "a lazy candidate is loaded once at most"


def test_the_shortfall_message_counts_every_rejection(tok):
    """Eager candidates, scan slots: the message reports what was looked at and why each slot
    said no, to the count."""
    checked = 0
    for seed in range(300):
        rng = random.Random(1000 + seed)
        cands, store, _ = random_candidates(rng, rng.randrange(1, 10), False, False)
        src = source(*random_slots(rng, cands, store, False))
        rows, rejected, drop, seen = ref_rejections(tok, src, cands)
        short = next((i for i, s in enumerate(src.slots) if rows[i] < s.count), None)
        if short is None:
            build.select(src, list(cands), Counter(), tok)
            continue
        checked += 1
        given = Counter({"synthetic": seed % 3})  # a reader's own drops are reported too
        s = src.slots[short]
        reasons = rejected[short] + drop + given
        text = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items())) or "none"
        with pytest.raises(build.BuildError) as e:
            build.select(src, list(cands), given, tok)
        assert str(e.value) == (
            f"test-source: slot '{s.label}' has {rows[short]} of {s.count} rows after looking at "
            f"{seen} of {len(cands)} candidates; rejected: {text}"
        ), seed
    assert checked > 100


@pytest.mark.parametrize("bound", ["tight", "none"])
@pytest.mark.parametrize("shape", ["one run", "many runs"])
@pytest.mark.parametrize(
    "view, where",
    [("whole", "first-fit"), ("before-last", "first-fit"), ("before-last", "longest")],
)
def test_a_slot_range_is_inclusive_at_both_ends(tok, view, where, bound, shape):
    """Prompt tokens lo - 1, lo, hi, hi + 1: only the two inside fit, in the first-fit scan, in a
    longest slot, and in the quick rejections (the bound equal to lo; the non-whitespace runs,
    a lower bound on the tokens, equal to hi)."""
    lo, hi = 10, 20
    for n in (lo - 1, lo, hi, hi + 1):
        content = "x" * n if shape == "one run" else ["x"] * n
        prompt = (
            [msg("user", c) for c in content] if shape == "many runs" else [msg("user", content)]
        )
        messages = prompt + ([msg("assistant", "done")] if view == "before-last" else [])
        c = build.Candidate("r@v#0", messages, unique="u")
        assert build.least_tokens(tok, c, view) == (1 if shape == "one run" else n)
        if bound == "tight":
            c.bound = n
        s = build.slot("full", 1, lo, hi, view, longest=where == "longest")
        if lo <= n <= hi:
            (row,) = build.select(source(s), [c], Counter(), tok)
            assert (row.tokens, row.messages) == (n, prompt)
            assert row.source == "r@v#0" + (f":{len(prompt)}" if view == "before-last" else "")
        else:
            with pytest.raises(build.BuildError, match=r"1 tokens out of range$"):
                build.select(source(s), [c], Counter(), tok)


@pytest.mark.parametrize("T", [14, 15, 16])
def test_cut_takes_a_prefix_of_exactly_T_tokens(tok, T):
    # Prefixes before the assistant turns: 10 (k=2) and 15 (k=4) tokens; 21 for the last.
    messages = [msg("system", "s" * 5), msg("user", "u" * 5), msg("assistant", "a" * 3),
                msg("user", "u" * 2), msg("assistant", "a" * 4), msg("user", "u" * 2),
                msg("assistant", "a")]  # fmt: skip
    c = build.Candidate("r@v#0", messages)
    s = build.slot("standard", 1, 10, T, view="cut", T=T)
    v = build.view(s, c, T, tok)
    k = 4 if T >= 15 else 2
    assert (v.messages, v.tokens, v.suffix) == (messages[:k], tokens_of(tok, messages[:k]), f":{k}")
    (row,) = build.select(source(s), [build.Candidate("r@v#0", messages)], Counter(), tok)
    assert row.tokens == (15 if T >= 15 else 10)


def test_cut_at_its_smallest_k_and_never_at_1(tok):
    s = build.slot("standard", 1, 1, 100, view="cut", T=100)
    for messages, k in [
        ([msg("system", "s"), msg("user", "u"), msg("assistant", "a")], 2),
        ([msg("user", "u"), msg("tool", "t"), msg("assistant", "a")], 2),
        ([msg("user", "u"), msg("assistant", "a"), msg("user", "uu"), msg("assistant", "a")], 3),
        ([msg("user", "u"), msg("assistant", "a")], None),
        ([msg("system", "s"), msg("assistant", "a"), msg("assistant", "a")], None),
    ]:
        assert build.cut_points(messages) == ref_cut_points(messages) == ([k] if k else [])
        v = build.view(s, build.Candidate("r@v#0", messages), 100, tok)
        assert (v and (v.messages, v.suffix)) == ((messages[:k], f":{k}") if k else None)


def test_cut_keeps_the_last_prefix_within_T_when_a_later_one_is_over(tok):
    messages = [msg("user", "u" * 4), msg("tool", "t"), msg("assistant", "a"),
                msg("user", "u" * 50), msg("assistant", "a")]  # fmt: skip
    s = build.slot("standard", 1, 1, 10, view="cut", T=10)
    v = build.view(s, build.Candidate("r@v#0", messages), 10, tok)
    assert (v.messages, v.tokens, v.suffix) == (messages[:2], 5, ":2")


@pytest.mark.parametrize(
    "roles, k",
    [
        (["user", "assistant"], 1),
        (["tool", "assistant"], 1),
        (["system", "assistant"], None),
        (["assistant"], None),
        (["assistant", "assistant"], None),
        (["user"], None),
        (["user", "assistant", "system", "assistant"], None),  # the last assistant turn decides
        (["user", "assistant", "tool"], 1),
        (["system", "user", "assistant", "user", "assistant", "user"], 4),
        (["user", "assistant", "user", "assistant", "user", "assistant", "tool"], 5),
    ],
)
def test_before_last_index_edges(tok, roles, k):
    messages = [msg(r, r[0] * (i + 1)) for i, r in enumerate(roles)]
    assert build.last_assistant(messages) == ref_last_assistant(messages) == k
    c = build.Candidate("r@v#0", messages)
    v = build.view(build.slot("standard", 1, 1, 100, view="before-last"), c, 100, tok)
    if k is None:
        assert v is None
        assert build.least_tokens(tok, c, "before-last") == 0
    else:
        assert (v.messages, v.tokens, v.suffix) == (messages[:k], tokens_of(tok, messages[:k]),
                                                    f":{k}")  # fmt: skip


def test_views_on_random_conversations(tok):
    for seed in range(300):
        rng = random.Random(seed)
        messages = random_conversation(rng)
        c = build.Candidate(f"r@v#{seed}", messages)
        assert build.last_assistant(messages) == ref_last_assistant(messages)
        assert build.cut_points(messages) == ref_cut_points(messages)
        for name in ("whole", "before-last", "cut"):
            T = rng.randrange(0, 40)
            s = build.slot("standard", 1, 0, T, view=name, T=T if name == "cut" else None)
            v = build.view(s, c, INF, tok)
            want = ref_view(tok, s, c, messages)
            assert (v and (v.messages, v.tokens, v.suffix)) == want, (seed, name)


@pytest.mark.parametrize("name", ["whole", "before-last", "cut"])
def test_a_view_is_counted_only_as_far_as_its_limit(tok, pieces, name):
    """Three messages of 16 characters, each a batch of its own: past a limit of 10, the first
    is counted and the others are not."""
    messages = [msg("user", t * 16) for t in "xyz"] + [msg("assistant", "a")]
    c = build.Candidate("r@v#0", messages if name != "whole" else messages[:3])
    s = build.slot("standard", 1, 1, 10, view=name, T=10 if name == "cut" else None)
    v = build.view(s, c, 10, tok)
    assert v is None if name == "cut" else v.tokens > 10
    assert c.counts == {0: 16}


def test_an_unknown_view_is_a_programming_error(tok):
    with pytest.raises(AssertionError, match="sideways"):
        build.view(build.slot("standard", 1, 1, 9, view="sideways"), build.Candidate("r@v#0", []),
                   9, tok)  # fmt: skip


def test_whole_view_source_names_k_only_when_the_conversation_is_longer(tok):
    messages = [msg("user", "u"), msg("assistant", "a")]
    c = build.Candidate("r@v#0", messages)
    assert build.first_messages(c, 2, 5).suffix == ""
    assert build.first_messages(c, 1, 5).suffix == ":1"
    c.turns = 3  # the source conversation was longer than the messages kept
    v = build.first_messages(c, 2, 5)
    assert (v.messages, v.tokens, v.suffix) == (messages, 5, ":2")
    c.turns = 1
    assert build.first_messages(c, 1, 5).suffix == ""


def test_slot_and_filters():
    s = build.slot("standard", 3, 10, 20, view="cut", T=20, longest=False, group="en", lang="zh")
    assert s == build.Slot(
        "standard", 3, 10, 20, "cut", 20, False, (("group", "en"), ("lang", "zh"))
    )
    assert s.label == "standard 3 group=en lang=zh cut(20) [10, 20]"
    assert build.slot("full", 4, 1, 9, "before-last", longest=True).label == (
        "full longest 4 before-last [1, 9]"
    )
    c = build.Candidate("r@v#0", [], group="en", lang="zh")
    assert build.matches(s, c)
    c.lang = "en"
    assert not build.matches(s, c)
    assert build.matches(build.slot("standard", 1, 1, 2), c), "no filter: every candidate"
    fill = build.Fill(build.slot("standard", 2, 1, 9))
    assert fill.open
    fill.rows += [None, None]
    assert not fill.open


def test_place_makes_the_row_and_uses_the_key(tok):
    s = build.slot("standard", 1, 1, 9)
    f = build.Fill(s)
    c = build.Candidate("r@v#7", [msg("user", "abc"), msg("assistant", "d")], unique="k")
    used = set()
    build.place(f, c, build.View(c.messages[:1], 3, ":1"), used, "name")
    (row,) = f.rows
    assert (row.name, row.slot, row.candidate, row.messages, row.tokens, row.source) == (
        "name",
        s,
        c,
        [msg("user", "abc")],
        3,
        "r@v#7:1",
    )
    assert used == {"k"}


def test_first_fit_skips_a_used_key_and_goes_on(tok):
    third, second, first = ids_in_inverted_order(3)  # in ascending sha256: first, second, third
    x = build.Candidate(first, [msg("user", "x" * 5)], unique="same")
    y = build.Candidate(second, [msg("user", "y" * 5)], unique="same")
    z = build.Candidate(third, [msg("user", "z" * 5)], unique=None)
    drop = Counter()
    rows = build.select(source(build.slot("standard", 2, 1, 9)), [z, y, x], drop, tok)
    assert [r.candidate for r in rows] == [x, z]
    assert drop == Counter({"uniqueness rule (already used)": 1})


def test_the_scan_stops_when_every_slot_is_full(tok):
    cands = [build.Candidate(f"r@v#{i}", [msg("user", "x" * 3)]) for i in range(6)]
    order = sorted(cands, key=lambda c: c.key)
    order[2].messages = None  # looked at, it would fail: the scan must stop before it
    rows = build.select(source(build.slot("standard", 2, 1, 9)), cands, Counter(), tok)
    assert [r.candidate for r in rows] == order[:2]


def test_progress_counts_the_candidates_looked_at(tok, capsys):
    cands = [build.Candidate(f"r@v#{i}", [msg("user", "x" * (i + 1))]) for i in range(5)]
    build.select(source(build.slot("standard", 2, 1, 100)), cands, Counter(), tok)
    assert capsys.readouterr().err == "", "quiet by default"
    build.select(source(build.slot("standard", 2, 1, 100)), cands, Counter(), tok, quiet=False)
    err = capsys.readouterr().err
    assert err.rstrip().split("\r")[-1].startswith("test-source: 2 candidates [")


def lazy_candidates(contents):
    """Lazy candidates given their contents in ascending sha256 of their ids."""
    store = {}

    def loader(group):
        for c in group:
            c.messages = [msg("user", store[c.id])]

    cands = sorted((build.Candidate(f"r@v#{i}", load=loader, size=1) for i in range(len(contents))),
                   key=lambda c: c.key)  # fmt: skip
    for c, content in zip(cands, contents):
        store[c.id] = content
    return cands


@pytest.mark.parametrize(
    "contents, s, reason",
    [
        (["x" * 50] * 4 + ["x" * 5], build.slot("standard", 1, 1, 9), "by its count"),
        (["a " * 20] * 4 + ["x" * 5], build.slot("standard", 1, 1, 9), "by its runs"),
    ],
)
def test_a_lazy_candidate_looked_at_and_rejected_is_freed(tok, contents, s, reason):
    cands = lazy_candidates(contents)
    (row,) = build.select(source(s), list(cands), Counter(), tok)
    assert row.candidate is cands[-1]
    assert [c.messages is None for c in cands] == [True] * 4 + [False], reason


def test_a_lazy_candidate_without_a_view_is_freed(tok):
    cands = lazy_candidates(["x" * 50] * 5)
    with pytest.raises(build.BuildError, match=r"rejected: 5 no view$"):
        build.select(source(build.slot("standard", 1, 1, 99, view="before-last")), cands,
                     Counter(), tok)  # fmt: skip
    assert all(c.messages is None for c in cands)


# ------------------------------------------------------------------------------------------------
# Longest slots


def ref_longest(tok, s, cands, messages_of, used=()):
    taken, used = [], set(used)
    ranked = []
    for c in cands:
        k = ref_last_assistant(messages_of(c))
        if k is not None and all(getattr(c, f) == v for f, v in s.where):
            ranked.append((-tokens_of(tok, messages_of(c)[:k]), sha(c.id), c, k))
    for minus, _, c, k in sorted(ranked, key=lambda r: r[:2]):
        if len(taken) < s.count and c.unique not in used and s.lo <= -minus <= s.hi:
            taken.append((c.id, -minus, k))
            used.add(c.unique)
    return taken


def test_longest_agrees_with_the_definition(tok, pieces):
    """Loose bounds (the added token), lazy rows, equal counts, keys shared and already used."""
    for seed in range(150):
        rng = random.Random(seed)
        cands, store, loads = random_candidates(rng, rng.randrange(1, 30), True, True)
        for c in cands:  # long enough messages to be counted a batch at a time
            if rng.random() < 0.3:
                store[c.id] = [msg(m["role"], (m["content"] or "") * 7) for m in store[c.id]]
                if c.messages is not None:
                    c.messages = [dict(m) for m in store[c.id]]
            if c.bound != INF:  # bounds of the file, loose as they come
                c.bound = build.messages_bytes(store[c.id]) + rng.randrange(0, 30)
        lo = rng.randrange(0, 30)
        s = build.slot("full", rng.randrange(1, 4), lo, lo + rng.randrange(0, 60), "before-last",
                       longest=True, **rng.choice([{}, {"group": "en"}]))  # fmt: skip
        used = {rng.choice("abcdefg")} if rng.random() < 0.3 else set()
        want = ref_longest(tok, s, cands, lambda c, store=store: store[c.id], used)
        f, progress = build.Fill(s), []
        looked = build.fill_longest(f, cands, set(used), progress.append, tok, "name")
        got = [(r.candidate.id, r.tokens, len(r.messages)) for r in f.rows]
        assert got == want, seed
        assert [r.source for r in f.rows] == [f"{i}:{k}" for i, _, k in want]
        assert all(r.name == "name" and r.slot == s for r in f.rows)
        assert [r.messages for r in f.rows] == [store[i][:k] for i, _, k in want]
        assert progress == [1] * looked and len(f.rows) <= looked <= len(cands)
        assert max(loads.values(), default=0) <= 1


def test_longest_ties_go_to_the_lower_sha256(tok):
    """Equal prompt tokens: the lower sha256 of the id wins, whichever comes first in the list,
    has the smaller id or row number, or has the looser bound (and so is counted first)."""
    high, low = ids_in_inverted_order(2)
    assert high < low and sha(low) < sha(high)
    assert tok.plain("x" * 8) == tok.plain("y" * 7 + SPECIAL) == 8  # 8 bytes; 20 bytes
    for loose in (high, low):
        for order in ((high, low), (low, high)):
            cands = []
            for row, cid in enumerate(order):
                text = "y" * 7 + SPECIAL if cid == loose else "x" * 8
                c = build.Candidate(cid, [msg("user", text), msg("assistant", "a")], row=row)
                c.unique, c.bound = cid, build.messages_bytes(c.messages)
                cands.append(c)
            f = build.Fill(build.slot("full", 1, 1, 100, "before-last", longest=True))
            build.fill_longest(f, cands, set(), lambda n: None, tok, "name")
            assert [r.candidate.id for r in f.rows] == [low], (loose, order)


@pytest.mark.parametrize("count", [1, 2])
def test_a_tie_for_the_last_place_goes_to_the_lower_sha256_when_the_higher_is_counted_first(
    tok, count
):
    """The higher sha256 has the looser bound, so it is counted first and reaches the top with
    its exact count, while the lower sha256 is still uncounted with a bound equal to that count:
    the lower sha256 must still be looked at before the higher one is taken (with count 2, a
    clear winner takes the first place)."""
    high, low = ids_in_inverted_order(2)
    cands = [
        build.Candidate(high, [msg("user", "y" * 7 + SPECIAL), msg("assistant", "")], unique=1),
        build.Candidate(low, [msg("user", "x" * 8), msg("assistant", "")], unique=2),
        build.Candidate("r@v#winner", [msg("user", "w" * 30), msg("assistant", "")], unique=3),
    ][: count + 1]
    for c in cands:
        c.bound = build.messages_bytes(c.messages)
    assert [c.bound for c in cands[:2]] == [20, 8] == [20, tok.plain("y" * 7 + SPECIAL)]
    f = build.Fill(build.slot("full", count, 1, 100, "before-last", longest=True))
    build.fill_longest(f, cands, set(), lambda n: None, tok, "name")
    assert [r.candidate.id for r in f.rows] == ["r@v#winner", low][2 - count :]


def test_a_longest_slot_left_short_says_why(tok):
    cands = [
        build.Candidate("r@v#0", [msg("user", "x" * 30), msg("assistant", "a")], unique=0),
        build.Candidate("r@v#1", [msg("system", "x" * 40), msg("assistant", "a")], unique=1),
        build.Candidate("r@v#2", [msg("user", "x" * 20), msg("assistant", "a")], unique=2),
        build.Candidate("r@v#3", [msg("user", "x" * 26), msg("assistant", "a")], unique=3),
        build.Candidate("r@v#4", [msg("assistant", "x" * 9)], unique=4),
    ]
    s = build.slot("full", 2, 1, 25, "before-last", longest=True)
    scan = build.slot("standard", 1, 1, 100)
    # the scan skips the row the longest slot took, and takes the first other one
    order = [c.id for c in sorted(cands, key=lambda c: c.key)]
    skipped = int(order[0] == "r@v#2")
    unique = ", 1 uniqueness rule (already used)" if skipped else ""
    with pytest.raises(build.BuildError) as e:
        build.select(source(s, scan), cands, Counter(), tok)
    assert str(e.value) == (
        f"test-source: slot '{s.label}' has 1 of 2 rows after looking at {5 + 1 + skipped} of 5 "
        f"candidates; rejected: 2 no view, 2 tokens out of range{unique}"
    )


def test_two_longest_slots_count_what_each_looked_at(tok):
    cands = [
        build.Candidate(f"r@v#{n}", [msg("user", "x" * n), msg("assistant", "a")], unique=n)
        for n in (30, 20, 10)
    ]
    for c in cands:
        c.bound = len(c.messages[0]["content"])
    slots = (build.slot("full", 1, 1, 99, "before-last", longest=True),
             build.slot("full", 1, 1, 99, "before-last", longest=True),
             build.slot("standard", 5, 1, 100))  # fmt: skip
    with pytest.raises(build.BuildError) as e:
        build.select(source(*slots), cands, Counter(), tok)
    # each longest slot looked at one (the first at 30, the second at 20); the scan at all three
    assert str(e.value) == (
        f"test-source: slot '{slots[2].label}' has 1 of 5 rows after looking at 5 of 3 candidates; "
        "rejected: 2 uniqueness rule (already used)"
    )


def test_a_bound_below_the_count_is_a_programming_error(tok):
    c = build.Candidate("r@v#0", [msg("user", "x" * 8), msg("assistant", "a")])
    c.bound = 5
    f = build.Fill(build.slot("full", 1, 1, 99, "before-last", longest=True))
    with pytest.raises(AssertionError, match=r"^r@v#0: 8 tokens above its bound 5$"):
        build.fill_longest(f, [c], set(), lambda n: None, tok, "name")


@pytest.mark.parametrize(
    "sizes, gap, counted",
    [
        # a gap of 90,000 to the runner-up: a batch takes the largest messages up to twice it
        ((20_000, 20_000, 20_000, 20_000, -20_000), 90_000, {4}),
        # a gap of 2,000: a batch still holds two pieces of text, 65,536 characters
        ((13_535, 13_535, -4_000), 2_000, {0, 1, 2}),
        ((13_536, 13_536, -4_000), 2_000, {0, 2}),
    ],
    ids=["twice the gap", "under two pieces", "two pieces"],
)
def test_a_longest_candidate_that_cannot_win_is_left_after_a_little_counting(
    tok, sizes, gap, counted
):
    """The loser's bound is loose (-n: n added tokens, 13 bytes and 1 token each); counting its
    largest messages first, about what its bound must lose to fall below the winner's, shows
    that it cannot win, and the rest of it is never counted."""
    contents = [SPECIAL * -n if n < 0 else "x" * n for n in sizes]
    loser = build.Candidate(
        "r@v#loser", [msg("user", t) for t in contents] + [msg("assistant", "")]
    )
    loser.bound = build.messages_bytes(loser.messages)
    winner = build.Candidate(
        "r@v#winner", [msg("user", "y" * (loser.bound - gap)), msg("assistant", "")]
    )
    winner.bound = loser.bound - gap
    f = build.Fill(build.slot("full", 1, 1, 10**6, "before-last", longest=True))
    build.fill_longest(f, [loser, winner], set(), lambda n: None, tok, "name")
    assert [r.candidate for r in f.rows] == [winner]
    assert set(loser.counts) == counted


# ------------------------------------------------------------------------------------------------
# Smoke and the order of the splits


def test_smoke_is_the_shortest_standard_row_of_each_group_ties_by_sha256():
    high, low = ids_in_inverted_order(2)
    s1, s2 = build.slot("standard", 1, 1, 9, group="en"), build.slot("standard", 1, 1, 9)

    def row(cid, tokens, group, s=s1):
        return build.Row("n", s, build.Candidate(cid, group=group), [], tokens, cid)

    rows = [row(high, 5, "en"), row(low, 5, "en", s2), row("r@v#x", 4, "zh"), row("r@v#y", 6, "en")]
    src = source(groups=("en", "zh"))
    assert [r.source for r in build.derive_smoke(src, rows)] == [low, "r@v#x"]
    assert [r.source for r in build.derive_smoke(source(), rows)] == ["r@v#x"]
    assert [r.source for r in build.derive_smoke(source(), rows[:2])] == [low]


def test_smoke_on_random_rows():
    for seed in range(200):
        rng = random.Random(seed)
        groups = rng.choice([(), ("en", "zh")])
        rows = []
        for i in range(rng.randrange(2, 9)):
            c = build.Candidate(f"r@v#{i}", group=rng.choice(["en", "zh"]))
            rows.append(build.Row("n", None, c, [], rng.randrange(3), c.id))
        if groups and {r.candidate.group for r in rows} != set(groups):
            continue
        want = [
            min((r for r in rows if g is None or r.candidate.group == g),
                key=lambda r: (r.tokens, sha(r.candidate.id)))
            for g in groups or (None,)
        ]  # fmt: skip
        assert build.derive_smoke(source(groups=groups), rows) == want, seed


def test_select_splits_orders_each_split_by_tokens_then_sha256(tok):
    high, low = ids_in_inverted_order(2)
    cands = [
        build.Candidate(high, [msg("user", "x" * 4)], group="en"),
        build.Candidate(low, [msg("user", "y" * 4)], group="en"),
        build.Candidate("r@v#s", [msg("user", "s" * 2)], group="zh"),
        build.Candidate("r@v#f", [msg("user", "f" * 7)], group="zh"),
        build.Candidate("r@v#g", [msg("user", "g" * 3)], group="zh"),
    ]
    slots = (  # the high sha256 fills the first slot, the low one the second
        build.slot("standard", 1, 4, 4, group="en"),
        build.slot("standard", 1, 1, 4, group="en"),
        build.slot("standard", 1, 1, 2, group="zh"),
        build.slot("full", 1, 7, 7),
        build.slot("full", 1, 3, 3),
    )
    assert sha(cands[0].id) > sha(cands[1].id)
    splits = build.select_splits(source(*slots, groups=("en", "zh")), cands, Counter(), tok)
    assert list(splits) == ["smoke", "standard", "full"]
    ids = {k: [r.candidate.id for r in rows] for k, rows in splits.items()}
    order = sorted([high, low], key=sha)
    assert ids == {"smoke": ["r@v#s", order[0]], "standard": ["r@v#s", *order],
                   "full": ["r@v#g", "r@v#f"]}  # fmt: skip
    only_full = build.select_splits(source(slots[3]), cands, Counter(), tok)
    assert {k: len(v) for k, v in only_full.items()} == {"smoke": 0, "standard": 0, "full": 1}


def test_select_splits_passes_on_the_drops_and_the_progress(tok, capsys):
    cands = [build.Candidate(f"r@v#{i}", [msg("user", "x")], unique="same") for i in range(3)]
    drop = Counter({"synthetic": 1})
    with pytest.raises(build.BuildError) as e:
        build.select_splits(source(build.slot("standard", 2, 1, 9)), cands, drop, tok)
    assert str(e.value).endswith("rejected: 1 synthetic, 2 uniqueness rule (already used)")
    assert drop == Counter({"synthetic": 1, "uniqueness rule (already used)": 2})
    assert capsys.readouterr().err == "", "quiet by default"
    build.select_splits(source(build.slot("standard", 1, 1, 9)), cands, Counter(), tok, False)
    assert "test-source: 1 candidates" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# Loading a window of lazy candidates


def test_load_takes_the_next_candidates_a_slot_may_take_up_to_the_window(monkeypatch):
    for seed in range(300):
        rng = random.Random(seed)
        max_bytes, max_rows = rng.randrange(1, 12), rng.randrange(1, 6)
        monkeypatch.setattr(build, "WINDOW_BYTES", max_bytes)
        monkeypatch.setattr(build, "WINDOW_ROWS", max_rows)
        calls = []

        def loader(group, name="a", calls=calls):
            calls.append((name, [c.id for c in group]))
            for c in group:
                c.messages = [msg("user", "x" * int(c.id.split("#")[1]))]

        loaders = [loader, lambda g: loader(g, "b")]
        cands = []
        for i in range(rng.randrange(1, 12)):
            c = build.Candidate(f"r@v#{i}", load=rng.choice(loaders), group=rng.choice("ab"))
            c.size, c.bound = rng.choice([0, rng.randrange(1, 4)]), rng.choice([INF, i + 2, i])
            c.unique = rng.choice([None, 1, 2])
            if rng.random() < 0.2:
                c.messages = [msg("user", "loaded")]
            cands.append(c)
        start = rng.randrange(len(cands))
        cands[start].messages = None
        fills = [build.Fill(build.slot("standard", 1, rng.randrange(0, 8), 99,
                                       **rng.choice([{}, {"group": "a"}]))) for _ in range(2)]  # fmt: skip
        if rng.random() < 0.3:
            fills[0].rows.append(None)  # full
        used = {rng.choice([1, 2, 3])}
        before = {c.id: (c.messages, c.bound) for c in cands}
        weight = {c.id: c.size or (0 if c.bound == INF else c.bound) for c in cands}
        build.load(cands, start, fills, used)

        window = [cands[start]]
        size = weight[cands[start].id]
        for c in cands[start + 1 :]:
            if before[c.id][0] is not None or (c.unique is not None and c.unique in used):
                continue
            if not any(f.open and all(getattr(c, k) == v for k, v in f.slot.where)
                       and before[c.id][1] >= f.slot.lo for f in fills):  # fmt: skip
                continue
            window.append(c)
            size += weight[c.id]
            if size > max_bytes or len(window) >= max_rows:
                break
        names = {loader: "a", loaders[1]: "b"}
        want = {}
        for c in window:
            want.setdefault(names[c.load], []).append(c.id)
        assert sorted(calls) == sorted(want.items()), seed
        assert [n for n, _ in calls] == list(dict.fromkeys(names[c.load] for c in window))
        for c in cands:
            if c in window:
                n = int(c.id.split("#")[1])
                assert c.bound == min(before[c.id][1], n), seed
            else:
                assert (c.messages, c.bound) == before[c.id], seed


def test_tighten_bound_keeps_the_smaller():
    c = build.Candidate("r@v#0", [msg("user", "é" * 3), msg("assistant", None)])
    c.bound = 100
    build.tighten_bound(c)
    assert c.bound == 6
    c.bound = 4
    build.tighten_bound(c)
    assert c.bound == 4


# ------------------------------------------------------------------------------------------------
# Bounds


def test_text_bytes_is_the_nfc_utf8_length_and_bounds_the_tokens(tok):
    for text in ["", "abc", "é", "e\u0301", "e\u0301" * 3 + "x", "\u212b", "水滸傳", "😀", SPECIAL,
                 "Å\u030a", "a\u0301\u0302"]:  # fmt: skip
        want = len(unicodedata.normalize("NFC", text).encode())
        assert build.text_bytes(text) == want, text
        assert tok.plain(text) <= want
    for value in (None, {"a": "bcdef"}, ["xyz"], 12345):
        assert build.text_bytes(value) == 0
    messages = [msg("user", "e\u0301"), msg("assistant", None), msg("tool", "abc")]
    assert build.messages_bytes(messages) == 5
    assert build.messages_bytes([]) == 0


def test_may_fit_at_the_edges_of_its_bounds(tok):
    """A bound equal to lo may fit, one below may not; non-whitespace runs (a lower bound on the
    tokens) equal to hi may fit, one above may not."""
    c = build.Candidate("r@v#0", [msg("user", "a b c")])  # 3 runs, 5 tokens
    for bound, lo, hi, fits in [(10, 10, 20, True), (9, 10, 20, False), (INF, 0, 3, True),
                                (INF, 0, 2, False), (10, 10, 3, True), (9, 10, 3, False)]:  # fmt: skip
        c.bound = bound
        assert build.may_fit(tok, c, build.slot("standard", 1, lo, hi)) is fits, (bound, lo, hi)


def test_least_tokens_is_the_runs_of_the_view(tok):
    for seed in range(200):
        rng = random.Random(seed)
        messages = random_conversation(rng)
        for name in ("whole", "before-last", "cut", "book"):
            c = build.Candidate("r@v#0", messages)
            least = build.least_tokens(tok, c, name)
            assert least == ref_least(messages, name), (seed, name)
            k = len(messages) if name == "whole" else ref_last_assistant(messages) or 0
            if name in ("whole", "before-last"):
                assert least <= tokens_of(tok, messages[:k])
                assert c.runs == {j: ref_least([m], "whole") for j, m in enumerate(messages[:k])}
            assert build.least_tokens(tok, c, name) == least, "the runs are remembered"
    tok.chunkable = False  # a tokenizer of another kind: runs bound nothing
    assert build.least_tokens(tok, build.Candidate("r@v#0", [msg("user", "a b")]), "whole") == 0


def test_least_tokens_separators_split_only_for_str_split(tok):
    c = build.Candidate("r@v#0", [msg("user", "a\x1cb c"), msg("user", "a b\x1f"),
                                  msg("user", "a\x1cb\x1dc\x1ed\x1fe")])  # fmt: skip
    assert build.least_tokens(tok, c, "whole") == 5
    assert c.runs == {0: 2, 1: 2, 2: 1}


# ------------------------------------------------------------------------------------------------
# Counting


def test_count_text_stops_at_the_first_batch_over_the_limit(tok, pieces):
    """Exact at the limit and under it; one token over, some count above the limit, found at the
    first batch of pieces whose running total passes it."""
    for seed in range(200):
        rng = random.Random(seed)
        text = "".join(rng.choice(["abc\n", "defgh\n", "  i\n", "\n", "xyz", "é\n"])
                       for _ in range(rng.randrange(0, 30)))  # fmt: skip
        cuts = tok.cuts(text)
        counts = [tok.plain(text[a:b]) for a, b in zip(cuts, cuts[1:])]
        batches = [sum(counts[i : i + 2]) for i in range(0, len(counts), 2)]
        exact = tok.plain(text)
        assert sum(batches) == exact
        running = [sum(batches[: i + 1]) for i in range(len(batches))]
        for limit in {exact - 1, exact, exact + 1, *running, *(r - 1 for r in running), 0, INF}:
            want = next((r for r in running if r > limit), exact)
            assert build.count_text(tok, text, limit) == want, (seed, limit)
            assert tok.count(text, limit) == want


def test_count_text_of_a_limit_exactly_at_a_batch_end(tok, pieces):
    text = "abcdefg\n" * 6  # 6 pieces of 8 tokens, 16 to a batch
    assert tok.cuts(text) == [0, 8, 16, 24, 32, 40, 48]
    assert [build.count_text(tok, text, limit) for limit in (15, 16, 17, 32, 47, 48)] == [
        16, 32, 32, 48, 48, 48,
    ]  # fmt: skip
    assert len(tok.calls) == 1 + 2 + 2 + 3 + 3 + 3


def ref_next_batch(c, i, k):
    batch, chars = [], 0
    for j in range(i, k):
        if j in c.counts or (batch and chars >= build.CHUNK_CHARS * build.BATCH_CHUNKS):
            break
        batch.append(j)
        chars += len(build.content_text(c.messages[j]))
    return batch, chars


def test_next_batch_takes_uncounted_messages_about_a_batch_of_text(pieces):
    for seed in range(300):
        rng = random.Random(seed)
        messages = [msg("user", rng.choice([None, "x" * rng.randrange(0, 20)]))
                    for _ in range(rng.randrange(1, 8))]  # fmt: skip
        c = build.Candidate("r@v#0", messages)
        c.counts = {j: 0 for j in range(len(messages)) if rng.random() < 0.3}
        i, k = sorted(rng.randrange(len(messages) + 1) for _ in range(2))
        assert build.next_batch(c, i, k) == ref_next_batch(c, i, k), seed


def test_count_messages_counts_a_batch_in_one_call_and_remembers_each_content(tok, pieces):
    messages = [msg("system", "shared\nsystem\nprompt\n"), msg("user", "a" * 30),
                msg("assistant", None), msg("user", ""), msg("tool", "é\nx")]  # fmt: skip
    exact = [plain(tok, m["content"]) for m in messages]
    c = build.Candidate("r@v#0", messages)
    build.count_messages(tok, c, [0, 1, 2, 3, 4])
    assert c.counts == dict(enumerate(exact))
    assert len(tok.calls) == 1 and len(tok.calls[0]) > 5, "one call, long contents in pieces"
    digest = lambda t: hashlib.sha256(t.encode()).digest()
    contents = [build.content_text(m) for m in messages]
    assert tok.counted == {digest(t): n for t, n in zip(contents, exact)}
    # another candidate: the shared contents are taken from memory, the new one counted
    d = build.Candidate("r@v#1", [msg("user", "new"), messages[0], msg("user", "a" * 30)])
    build.count_messages(tok, d, [0, 1, 2])
    assert d.counts == {0: 3, 1: exact[0], 2: 30}
    assert tok.calls[1:] == [["new"]]
    assert tok.counted[digest("new")] == 3


def test_count_messages_cuts_a_few_long_contents_finer_for_every_thread(tok):
    """Three long contents on two threads: at least PIECES_PER_THREAD pieces each, counted
    exactly (a call lasts as long as its thread with the most text)."""
    rng = random.Random(37)
    words = ["def", "return", "self", "中文", "é", "(x)", "  ", "\t", "42"]
    lines = lambda n: "".join(" ".join(rng.choices(words, k=8)) + "\n" for _ in range(n))
    messages = [msg("user", lines(600)), msg("tool", lines(900)), msg("assistant", lines(300))]
    tok.jobs = 2
    c = build.Candidate("r@v#0", messages)
    build.count_messages(tok, c, [0, 1, 2])
    assert c.counts == {j: plain(tok, m["content"]) for j, m in enumerate(messages)}
    assert len(tok.calls) == 1 and len(tok.calls[0]) >= build.PIECES_PER_THREAD * 2


def test_prompt_tokens_on_random_candidates_keeps_only_exact_counts(tok, pieces):
    known = {}  # sha256 of every content -> its tokens
    for seed in range(300):
        rng = random.Random(seed)
        messages = [msg(rng.choice(["user", "assistant"]),
                        rng.choice([None, "x" * rng.randrange(0, 40), "ab\n" * rng.randrange(0, 12)]))
                    for _ in range(rng.randrange(1, 7))]  # fmt: skip
        exact = [plain(tok, m["content"]) for m in messages]
        c = build.Candidate("r@v#0", messages)
        c.counts = {j: exact[j] for j in range(len(messages)) if rng.random() < 0.3}
        k = rng.randrange(len(messages) + 1)
        total = sum(exact[:k])
        known.update((hashlib.sha256(build.content_text(m).encode()).digest(), n)
                     for m, n in zip(messages, exact))  # fmt: skip
        for limit in rng.sample([total - 1, total, total + 1, 0, INF, rng.randrange(60)], 3):
            got = build.prompt_tokens(tok, c, k, limit)
            assert (got == total) if total <= limit else (got > limit), (seed, limit)
            assert c.counts == {j: exact[j] for j in c.counts}, "only exact counts are kept"
            assert all(known[d] == n for d, n in tok.counted.items()), "only exact counts"
        assert build.prompt_tokens(tok, c, k) == total
        assert sorted(c.counts) == list(range(k)) + sorted(j for j in c.counts if j >= k)


@pytest.mark.parametrize("n, limit", [(20, 21), (21, 21), (22, 21)])
def test_prompt_tokens_of_a_long_message_at_the_limit(tok, pieces, n, limit):
    """One message over a batch of text is counted alone, and stops at the limit: exactly the
    limit, one under, one over. A count that stopped early is not kept, nor remembered."""
    c = build.Candidate("r@v#0", [msg("user", "x" * n)])
    got = build.prompt_tokens(tok, c, 1, limit)
    if n <= limit:
        assert got == n
        assert c.counts == {0: n}
    else:
        assert got > limit
        assert c.counts == {} and tok.counted == {}
    assert build.prompt_tokens(tok, c, 1) == n and c.counts == {0: n}


def test_prompt_tokens_stops_early_and_forgets_the_partial_count(tok, pieces):
    text = "abcdefg\n" * 6  # 48 tokens, a batch of pieces is 16
    c = build.Candidate("r@v#0", [msg("user", "y" * 5), msg("user", text)])
    c.counts = {0: 5}
    assert build.prompt_tokens(tok, c, 2, 15) == 5 + 16, "stopped after the first batch"
    assert c.counts == {0: 5}
    assert build.prompt_tokens(tok, c, 2, 11) == 5 + 16
    assert build.prompt_tokens(tok, c, 2, 21) == 5 + 32
    assert build.prompt_tokens(tok, c, 2, 53) == 53 and c.counts == {0: 5, 1: 48}


def test_prompt_tokens_checks_the_limit_between_batches(tok, pieces):
    c = build.Candidate("r@v#0", [msg("user", "x" * 10) for _ in range(3)])
    assert build.next_batch(c, 0, 3) == ([0, 1], 20), "a batch ends once it holds 16 characters"
    c = build.Candidate("r@v#0", [msg("user", "x" * 16), msg("user", "y" * 16), msg("user", "z")])
    assert build.prompt_tokens(tok, c, 3, 15) == 16, "over the limit after the first: stop"
    assert c.counts == {0: 16}
    assert build.prompt_tokens(tok, c, 3, 16) == 32, "at the limit: go on"
    assert c.counts == {0: 16, 1: 16}
    assert build.prompt_tokens(tok, c, 3, 32) == 33
    assert c.counts == {0: 16, 1: 16, 2: 1}
    c = build.Candidate("r@v#0", [msg("user", "x" * 16), msg("user", "y" * 16), msg("user", "z")])
    c.counts = {1: 16}
    assert build.prompt_tokens(tok, c, 2, 5) == 32 and c.counts == {0: 16, 1: 16}


def test_a_message_of_exactly_a_batch_of_text_is_counted_whole_and_kept(tok, pieces):
    c = build.Candidate("r@v#0", [msg("user", "x" * 16)])
    assert build.prompt_tokens(tok, c, 1, 15) == 16
    assert c.counts == {0: 16}
    assert tok.counted == {hashlib.sha256(b"x" * 16).digest(): 16}


def test_prompt_tokens_uses_counts_given_directly():
    class NoTokenizer:
        def __getattr__(self, name):
            raise AssertionError("nothing to count")

    c = build.Candidate("r@v#0", [msg("user", "abc")] * 4)
    c.counts = {0: 7, 1: 0, 2: 5, 3: 9}
    assert [build.prompt_tokens(NoTokenizer(), c, k) for k in range(5)] == [0, 7, 7, 12, 21]
    assert build.prompt_tokens(NoTokenizer(), c, 4, limit=3) == 21


# ------------------------------------------------------------------------------------------------
# Safe cuts


def ref_safe_cuts(text, every):
    """Greedy: the first line start at least `every` characters after the previous cut that is
    followed, before any line break, by a non-whitespace character."""
    spaces = build.WHITE_SPACE - {"\r", "\n"}
    cuts = [0]
    for q in range(1, len(text)):
        if text[q - 1] != "\n" or q < cuts[-1] + every:
            continue
        j = q
        while j < len(text) and text[j] in spaces:
            j += 1
        if j < len(text) and text[j] not in build.WHITE_SPACE:
            cuts.append(q)
    return cuts + [len(text)]


def test_safe_cuts_are_the_first_safe_line_starts_every_so_often():
    parts = ["ab", "\n", "\n", "  ", "\t", "\r\n", "\u3000", "\x85", "\u2028", "c", "é", " \n",
             "\x1c", "\f"]  # fmt: skip
    for seed in range(500):
        rng = random.Random(seed)
        text = "".join(rng.choice(parts) for _ in range(rng.randrange(0, 40)))
        every = rng.randrange(1, 12)
        assert build.safe_cuts(text, True, every) == ref_safe_cuts(text, every), (seed, text)
        assert build.safe_cuts(text, False, every) == [0, len(text)]
    assert build.safe_cuts("a\nb", every=1) == [0, 2, 3]
    assert build.safe_cuts("a\n", every=1) == [0, 2]
    assert build.safe_cuts("\nb\nc", every=1) == [0, 1, 3, 4]


def test_counting_in_pieces_is_exact_on_random_texts(tok, pieces):
    for seed in range(100):
        rng = random.Random(seed)
        text = "".join(rng.choice(["a b", "\n", "\n\n", "  x", "e\u0301", "\u0301", SPECIAL, "\t"])
                       for _ in range(rng.randrange(0, 60)))  # fmt: skip
        assert tok.count(text) == tok.plain(text), seed


# ------------------------------------------------------------------------------------------------
# The book view


def random_book(rng, lang):
    words = ["alpha", "beta", "gamma", "水滸", "傳", "x"] if lang == "zh" else ["a", "bb", "ccc"]
    paragraphs = []
    for _ in range(rng.randrange(1, 25)):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randrange(1, 8)))
                 for _ in range(rng.randrange(1, 4))]  # fmt: skip
        paragraphs.append("\n".join(("  " if rng.random() < 0.2 else "") + ln for ln in lines))
    body = "".join(p + rng.choice(["\n\n", "\n\n\n", "\n\n"]) for p in paragraphs).rstrip()
    head = "Title\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\n" if rng.random() < 0.5 else ""
    tail = "\n\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\nlicense\n" if head else ""
    book = build.read_book(head + body + tail, lang)
    return build.Candidate(f"gutenbergbooks/{rng.randrange(99)}@c", group=lang, book=book)


def test_book_view_agrees_with_the_definition(tok, pieces):
    """Every T at, and next to, the tokens of a paragraph end and of a counted piece; several
    views of the same book in any order, each counted as far as it needs."""
    for seed in range(60):
        rng = random.Random(seed)
        lang = rng.choice(["en", "zh"])
        c = random_book(rng, lang)
        b = c.book
        prompt = build.BOOK_INSTRUCTION[lang] + "\n\n" + b.text[b.start : b.ends[-1]]
        at_ends = [tok.plain(build.BOOK_INSTRUCTION[lang] + "\n\n" + b.text[b.start : e])
                   for e in b.ends]  # fmt: skip
        cuts = tok.cuts(prompt)
        at_cuts = [tok.plain(prompt[:q]) for q in cuts]
        Ts = sorted({max(0, t + d) for t in at_ends + at_cuts for d in (-1, 0, 1)} | {10**6})
        rng.shuffle(Ts)
        for T in Ts[:25]:
            v = build.book_view(c, T, tok)
            want = ref_book(tok, c, T, at_ends)
            assert (v and (v.messages, v.tokens, v.suffix)) == want, (seed, T)
            fresh = build.Candidate(c.id, book=build.read_book(b.text, lang))
            v = build.book_view(fresh, T, tok)
            assert (v and (v.messages, v.tokens, v.suffix)) == want, (seed, T, "fresh")
        assert b.cum == at_cuts[: len(b.cum)], "the counted pieces are exact"


def test_book_view_counts_only_as_far_as_T_needs(tok, pieces):
    rng = random.Random(5)
    c = random_book(rng, "en")
    while len(c.book.ends) < 20:
        c = random_book(rng, "en")
    build.book_view(c, 30, tok)
    assert len(c.book.cum) < len(c.book.cuts) / 2
    build.book_view(c, 10**6, tok)
    assert len(c.book.cum) == len(c.book.cuts)


def test_book_view_at_exactly_T(tok):
    text = "one two\n\nthree\n\nfour five six"
    c = build.Candidate("g@c", group="en", book=build.read_book(text, "en"))
    prefix = len(build.BOOK_INSTRUCTION["en"]) + 2
    for T, end in [(prefix + 6, None), (prefix + 7, 7), (prefix + 13, 7), (prefix + 14, 14),
                   (prefix + 28, 14), (prefix + 29, 29), (prefix + 99, 29)]:  # fmt: skip
        v = build.book_view(c, T, tok)
        if end is None:
            assert v is None
        else:
            assert (v.messages, v.tokens, v.suffix) == (
                build.user(build.BOOK_INSTRUCTION["en"] + "\n\n" + text[:end]), prefix + end,
                f"#0-{end}",
            )  # fmt: skip


def test_books_in_select(tok):
    cands = [
        build.Candidate(f"g{i}@c", group=lang, book=build.read_book("a\n\nbb\n\n" * (i + 1), lang),
                        unique=f"g{i}")
        for i, lang in enumerate(["en", "zh", "en", "zh", "en"])
    ]  # fmt: skip
    slots = tuple(build.slot("standard", 1, lo, T, view="book", T=T, group=g)
                  for T, lo in ((60, 40), (80, 60)) for g in ("en", "zh"))  # fmt: skip
    want, short = ref_select(tok, source(*slots), cands, lambda c: None)
    assert short is None
    rows = build.select(source(*slots), list(cands), Counter(), tok)
    assert [(r.candidate.id, r.tokens, r.source, r.messages) for r in rows] == [
        w[1:] for i in range(len(slots)) for w in want[i]
    ]


def test_a_row_without_a_uniqueness_key_taken_by_the_longest_slot_is_not_taken_again(tok):
    """Rows are used once: the longest slot takes the one long conversation, and the scan that
    follows does not take the same row, uniqueness key or not."""
    long = build.Candidate("r@v#0", [msg("user", "x" * 50), msg("assistant", "a")])
    short = build.Candidate("r@v#1", [msg("user", "y" * 5), msg("assistant", "b")])
    longest = build.slot("full", 1, 1, 100, "before-last", longest=True)
    scan = build.slot("standard", 1, 1, 100, "before-last")
    rows = build.select(source(longest, scan), [long, short], Counter(), tok)
    assert [(r.slot.split, r.candidate.id) for r in rows] == [
        ("full", "r@v#0"),
        ("standard", "r@v#1"),
    ]


# ------------------------------------------------------------------------------------------------
# Reading ahead


def test_read_ahead_gives_each_source_in_order_and_raises_a_readers_error_at_its_turn(
    monkeypatch,
):
    """Sources after a source read alone are read in a thread; each is taken in order, a
    reader's error is raised when its source is taken (not before an earlier source is done),
    and closing stops the reading and gives back the switch interval."""
    import threading

    names = list(build.SOURCES)
    alone = [n for n in names if build.SOURCES[n].read_alone]
    assert alone == ["longbench-pro", "mrcr"], "the two readers that hold a file or row group"
    read_in = {}
    bad = names[5]

    def reader(name):
        def read(source, files, drop):
            read_in[name] = threading.current_thread().name
            if name == bad:
                raise build.BuildError(f"{name}: bad row")
            drop["dropped"] += 1
            yield build.Candidate(f"{name}@v#0")

        return read

    monkeypatch.setattr(build, "READERS", {n: reader(n) for n in names})
    interval = sys.getswitchinterval()
    ahead = build.ReadAhead(names, {n: [] for n in names})
    for name in names[:5]:
        cands, drop, seconds = ahead.take(name)
        assert [c.id for c in cands] == [f"{name}@v#0"] and drop == {"dropped": 1}
        assert seconds >= 0
    assert sys.getswitchinterval() == build.READ_AHEAD_SWITCH_S
    with pytest.raises(build.BuildError, match=f"{bad}: bad row"):
        ahead.take(bad)
    ahead.close()
    assert sys.getswitchinterval() == interval
    assert {n: t == "read ahead" for n, t in read_in.items()} == {
        n: n not in alone for n in names[:6]
    }, "read ahead after the second source read alone, and stopped at the error"


def test_read_ahead_stops_when_closed(monkeypatch):
    import threading

    names = list(build.SOURCES)
    gate, read = threading.Event(), []

    def slow(source, files, drop):
        for i in range(1000):
            if threading.current_thread().name == "read ahead":
                gate.wait()
                read.append(i)
            yield build.Candidate(f"r@v#{i}")

    monkeypatch.setattr(build, "READERS", dict.fromkeys(names, slow))
    ahead = build.ReadAhead(names, {n: [] for n in names})
    ahead.take(names[0])
    ahead.take(names[1])  # mrcr, read alone: the sources after it are read ahead from here
    ahead.close()
    gate.set()
    for thread in threading.enumerate():
        if thread.name == "read ahead":
            thread.join(10)
            assert not thread.is_alive()
    assert len(read) <= 2, "stopped at the first candidate after close"


def test_read_ahead_sources_taken_while_they_are_still_being_read(monkeypatch):
    """The main thread waits for a source the thread has not finished (it once waited forever
    when it took a source before the thread had set it ready)."""
    import threading
    import time

    names = list(build.SOURCES)

    def slow(source, files, drop):
        if threading.current_thread().name == "read ahead":
            time.sleep(0.02)
        yield build.Candidate("r@v#0")

    monkeypatch.setattr(build, "READERS", dict.fromkeys(names, slow))
    for _ in range(3):
        ahead = build.ReadAhead(names, {n: [] for n in names})
        taken = []
        take_all = lambda ahead=ahead, taken=taken: taken.extend(ahead.take(n) for n in names)
        taker = threading.Thread(target=take_all, daemon=True)
        taker.start()
        taker.join(30)
        ahead.close()
        assert not taker.is_alive() and len(taken) == len(names)
