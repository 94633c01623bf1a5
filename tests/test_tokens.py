"""Prompt tokens are exactly len(tokenizer.encode(content, add_special_tokens=False)) (README "How rows are chosen").

build.py counts long texts in pieces, on several threads, and stops once a bound is passed; every
test here compares that fast path with the plain definition."""

import json
import random

import pytest

import build

FRAGMENTS = [
    "The quick brown fox jumps over the lazy dog. ",
    "It's 3.14159 -- isn't it? They'll say we'd've known.\n",
    "滾滾長江東逝水，浪花淘盡英雄。是非成敗轉頭空：青山依舊在，幾度夕陽紅。",
    "\n\n\u3000\u3000話說天下大勢，分久必合，合久必分。\n",
    "Привет, как дела? Всё хорошо.\n",
    "こんにちは、世界。カタカナとひらがな。\n",
    "한국어 문장입니다. \u1100\u1161\u11a8 조합.\n",
    "e\u0301 cafe\u0301 n\u0303 \u0958 \u2126 Å\n",  # NFC changes these
    "\n\u0301 a combining mark right after a line break\n",
    "    indented code():\n        return {'a': [1, 2, 3]}\n",
    "\r\n\r\nwindows line\r\n",
    "   \n\t \n",  # lines holding only whitespace
    "emoji 😀👍🏽 and symbols ∑∫ — “quotes” «guillemets»\n",
    "\n123 numbers after a break 4567890\n",
    "\n<|endoftext|> a special token in the text\n",
    "\n\n\n\nmany blank lines\n",
    "\x1c\x1d\x1e\x1f separators\n\x85next line\u2028line sep\n",
    "\n  \u00a0\u3000 mixed spaces then text\n",
]


def mixed_text(seed, size):
    rng = random.Random(seed)
    parts, n = [], 0
    while n < size:
        part = rng.choice(FRAGMENTS)
        parts.append(part)
        n += len(part)
    return "".join(parts)


@pytest.fixture(params=["byte", "qwen"])
def tokenizer(request, mini):
    """The tokenizer of the miniature sources (always there) and the realistic one (when shared/ is)."""
    path = request.getfixturevalue("qwen_tokenizer") if request.param == "qwen" else mini.tokenizer
    tok = build.Tokens(path, jobs=2)
    assert tok.chunkable, "both tokenizers have the Qwen pre-tokenizer, so the fast path applies"
    return tok


@pytest.mark.parametrize("seed", range(4))
def test_long_multilingual_text_counts_exactly(tokenizer, seed):
    text = mixed_text(seed, 400_000)
    assert len(tokenizer.cuts(text)) > 10, "the text is long enough to be counted in pieces"
    assert tokenizer.count(text) == tokenizer.plain(text)


def test_every_real_book_counts_exactly(tokenizer, realdata):
    for path in sorted((realdata / "books").iterdir()):
        text = path.read_bytes().decode("utf-8").replace("\r\n", "\n")
        assert tokenizer.count(text) == tokenizer.plain(text), path.name


def test_every_piece_boundary_is_exact_on_its_own(tokenizer):
    # Stronger than the sum: a prefix ending at any cut counts the same in pieces and whole.
    text = mixed_text(7, 200_000)
    cuts = tokenizer.cuts(text, every=997)
    assert len(cuts) > 50
    for cut in cuts[1:-1:7]:
        prefix = text[:cut]
        assert tokenizer.count(prefix) == tokenizer.plain(prefix)


def test_counting_stops_above_the_limit_and_is_exact_below_it(tokenizer):
    text = mixed_text(11, 300_000)
    exact = tokenizer.plain(text)
    assert tokenizer.count(text, limit=exact) == exact
    early = tokenizer.count(text, limit=exact // 10)
    assert exact // 10 < early < exact, "counting stopped early, above the limit"


def test_prompt_tokens_sum_message_contents_only(tokenizer):
    messages = [
        {"role": "system", "content": mixed_text(1, 3_000)},
        {"role": "user", "content": mixed_text(2, 90_000)},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                                "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "content": "{\"result\": \"ok\"}", "tool_call_id": "c1"},
        {"role": "assistant", "content": mixed_text(3, 500)},
        {"role": "user", "content": ""},
    ]  # fmt: skip
    plain = [tokenizer.plain(m["content"]) if m["content"] else 0 for m in messages]
    cand = build.Candidate("r@v#0", messages)
    for k in range(len(messages) + 1):
        assert tokenizer.prompt(cand, k) == sum(plain[:k])
    fresh = build.Candidate("r@v#0", messages)
    assert tokenizer.prompt(fresh, len(messages), limit=100) > 100


def test_a_content_counted_before_is_taken_from_memory_for_this_tokenizer_only(mini, tmp_path):
    """Two candidates sharing a content (a system prompt, a trajectory stored twice) count it
    once; another tokenizer has its own memory, since the counts belong to the tokenizer."""
    raw = json.loads(mini.tokenizer.read_text())
    raw["normalizer"] = None  # this one counts "e" + U+0301 as three bytes, not as NFC's two
    other = tmp_path / "no-nfc.json"
    other.write_text(json.dumps(raw))
    shared = mixed_text(7, 5_000) + "e\u0301" * 50
    counts = {}
    for path in (mini.tokenizer, other, mini.tokenizer):
        tok = build.Tokens(path, jobs=2)
        first = build.Candidate("r@v#1", [{"role": "user", "content": shared}])
        second = build.Candidate(
            "r@v#2", [{"role": "system", "content": "s"}, {"role": "user", "content": shared}]
        )
        assert tok.prompt(first, 1) == tok.plain(shared)
        assert len(tok.counted) == 1, "the content is remembered"
        assert tok.prompt(second, 2) == tok.plain("s") + tok.plain(shared)
        counts[path] = tok.plain(shared)
    assert counts[mini.tokenizer] != counts[other], "the two tokenizers disagree on it"


def test_a_tokenizer_of_another_shape_is_counted_plainly(mini, tmp_path):
    raw = json.loads(mini.tokenizer.read_text())
    raw["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\S+|\s+"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(raw))
    tok = build.Tokens(other, jobs=2)
    assert not tok.chunkable
    text = mixed_text(5, 100_000)
    assert tok.cuts(text) == [0, len(text)]
    assert tok.count(text) == tok.plain(text)


def test_an_added_token_with_a_space_turns_the_fast_path_off(mini, tmp_path):
    raw = json.loads(mini.tokenizer.read_text())
    raw["added_tokens"].append(dict(raw["added_tokens"][0], id=999, content="<a b>"))
    other = tmp_path / "other.json"
    other.write_text(json.dumps(raw))
    assert not build.Tokens(other, jobs=2).chunkable


@pytest.mark.parametrize("seed", range(3))
def test_the_lower_bound_from_non_whitespace_runs_holds(tokenizer, seed):
    # build.py skips a slot whose hi is below this bound without counting; it must never exceed
    # the count, and its fast form (str.split) must equal the regex form.
    for text in (mixed_text(seed, 50_000), mixed_text(seed, 50_000).replace("\x1c", "")):
        for separators in ("", "\x1c\x1d\x1e\x1f"):
            text = text.replace("\x1c\x1d\x1e\x1f", separators)
            c = build.Candidate("r@v#0", [{"role": "user", "content": text}])
            runs = sum(1 for _ in build.NON_SPACE.finditer(text))
            assert build.least_tokens(tokenizer, c, "whole") == runs <= tokenizer.plain(text)
