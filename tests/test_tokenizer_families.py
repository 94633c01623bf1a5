"""Exact with any tokenizer (README "How rows are chosen"): for tokenizers of several families,
built here, the selection equals the plain reference's (tests/test_engine.py) row for row on the
miniature sources, and the book view equals its definition. Each acceleration holds for the
tokenizer in use or is switched off for it, as build.py decides from the tokenizer's description;
the families include ones whose normalizer or pre-tokenizer adds characters, for which the byte
bound is false."""

import random
from collections import Counter

import pytest
from make_sources import make_tokenizer
from test_engine import random_book, ref_book, ref_select
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

import build

BYTES = sorted(pre_tokenizers.ByteLevel.alphabet())
FALLBACK = [f"<0x{b:02X}>" for b in range(256)]


def corpus(mini):
    """Text to train on: the miniature books."""
    return [p.file.read_text(encoding="utf-8") for p in pins(mini, "gutenberg")]


def byte_level(pre):
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(BYTES)}, merges=[]))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    return tok


def trained_qwen(mini):
    tok = byte_level(
        pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(build.QWEN_SPLIT), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    )
    tok.normalizer = normalizers.NFC()
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=BYTES, show_progress=False)
    tok.train_from_iterator(corpus(mini), trainer)
    return tok


def gpt2_prefix_space(mini):
    return byte_level(pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True))


def llama2_prepend(mini):
    """Llama-2 style: a Prepend and a Replace in the normalizer, no pre-tokenizer, bytes as the
    fallback: more tokens than the text has bytes."""
    vocab = {"<unk>": 0} | {t: i + 1 for i, t in enumerate(FALLBACK)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    return tok


def unigram_metaspace(mini):
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=6000, special_tokens=["<unk>"], unk_token="<unk>", show_progress=False
    )
    tok.train_from_iterator([text[:20_000] for text in corpus(mini)], trainer)  # it is slow
    return tok


def wordpiece(mini):
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=800, special_tokens=["[UNK]"], show_progress=False
    )
    tok.train_from_iterator(corpus(mini), trainer)
    return tok


FAMILIES = {
    "byte-level BPE, Qwen": None,  # tests/make_sources.py's tokenizer
    "trained BPE, Qwen": trained_qwen,
    "byte-level BPE, GPT-2 prefix space": gpt2_prefix_space,
    "Llama-2 Prepend, byte fallback": llama2_prepend,
    "Unigram, Metaspace": unigram_metaspace,
    "WordPiece, BERT": wordpiece,
}
# What build.py must decide for each: (counting in pieces, the byte bound, the book search).
DECIDED = {
    "byte-level BPE, Qwen": (True, True, True),
    "trained BPE, Qwen": (True, True, True),
    "byte-level BPE, GPT-2 prefix space": (False, False, False),
    "Llama-2 Prepend, byte fallback": (False, False, False),
    "Unigram, Metaspace": (False, False, False),
    "WordPiece, BERT": (False, False, True),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, mini, tmp_path_factory):
    path = tmp_path_factory.mktemp("family") / "tokenizer.json"
    make = FAMILIES[request.param]
    if make is None:
        make_tokenizer(path)
    else:
        path.write_text(make(mini).to_str())
    return request.param, path


def pins(mini, name):
    rev, books = build.read_pins(mini.rev, "rev"), build.read_pins(mini.books, "books")
    files = build.source_files(build.SOURCES[name], rev, books)
    build.verify(files, mini.src, False, True)
    return files


def candidates(mini, name):
    source = build.SOURCES[name]
    return list(build.READERS[name](source, pins(mini, name), Counter()))


def test_the_accelerations_are_decided_from_the_description(family):
    name, path = family
    tok = build.Tokens(path, 1)
    assert (tok.chunkable, tok.bounded, tok.ends_add_up) == DECIDED[name]


def test_the_byte_bound_holds_where_it_is_used_and_is_false_where_it_is_not(family):
    name, path = family
    tok = build.Tokens(path, 1)
    texts = ["a", "x y z", "中文", "a\n\nb", "e\u0301", "  two  spaces  "]
    over = [t for t in texts if tok.plain(t) > build.text_bytes(t)]
    if tok.bounded:
        assert over == []
    if name in ("byte-level BPE, GPT-2 prefix space", "Llama-2 Prepend, byte fallback"):
        assert over, "the families whose normalizer or pre-tokenizer adds characters"


@pytest.mark.parametrize("name", [n for n in build.SOURCES if n != "gutenberg"])
def test_the_selection_is_the_plain_references(family, mini, name, monkeypatch):
    """Row for row, slot for slot; a slot the reference leaves short is the one the build names.
    (Gutenberg: the book view below, on books small enough for the reference.)"""
    _, path = family
    source = build.SOURCES[name]
    fills = []

    class Recorded(build.Fill):
        def __init__(self, slot):
            super().__init__(slot)
            fills.append(self)

    monkeypatch.setattr(build, "Fill", Recorded)
    tok = build.Tokens(path, 1)
    try:
        build.select(source, candidates(mini, name), Counter(), tok)
        error = None
    except build.BuildError as e:
        error = str(e)

    ref_tok = build.Tokens(path, 1)
    counted, plain = {}, ref_tok.plain
    ref_tok.plain = lambda text: (
        counted[text] if text in counted else counted.setdefault(text, plain(text))
    )

    def messages_of(c):
        if c.messages is None:
            c.load([c])
        return c.messages

    ref_cands = candidates(mini, name)
    want, short = ref_select(ref_tok, source, ref_cands, messages_of)
    # A reader that keeps the first messages only (LongWriter) names the cut by the turns the
    # conversation had: the reference sees only the messages kept.
    turns = {c.id: c.turns for c in ref_cands if c.turns}
    want = {
        i: [(j, cid, n, f"{cid}:{len(m)}" if len(m) < turns.get(cid, 0) else src, m)
            for j, cid, n, src, m in rows]
        for i, rows in want.items()
    }  # fmt: skip
    got = {
        i: [(i, r.candidate.id, r.tokens, r.source, r.messages) for r in f.rows]
        for i, f in enumerate(fills)
    }
    assert got == want
    if short is None:
        assert error is None, error
    else:
        assert error is not None and f"slot '{source.slots[short].label}'" in error, error


def test_the_book_view_is_its_definition(family):
    _, path = family
    tok = build.Tokens(path, 1)
    for seed in range(25):
        rng = random.Random(seed)
        lang = rng.choice(["en", "zh"])
        c = random_book(rng, lang)
        b = c.book
        at_ends = [tok.plain(build.BOOK_INSTRUCTION[lang] + "\n\n" + b.text[b.start : e])
                   for e in b.ends]  # fmt: skip
        Ts = sorted({max(0, t + d) for t in at_ends for d in (-1, 0, 1)} | {10**6})
        rng.shuffle(Ts)
        for T in Ts[:20]:
            v = build.book_view(c, T, tok)
            want = ref_book(tok, c, T, at_ends)
            assert (v and (v.messages, v.tokens, v.suffix)) == want, (seed, T)
