#!/usr/bin/env python3
"""Miniature copies of the twelve kern-prompts sources, in their real formats.

- ``make_tokenizer(path)``: a tokenizer.json with Qwen's normalizer and pre-tokenizer, a vocabulary
  of the 256 byte symbols and no merges: a text's token count is the UTF-8 byte length of its NFC
  form. It needs no download.
- ``make_sources(src, tokenizer, books_dir=None, realdata=None)``: every file that REV and BOOKS
  pin, written to ``src/<repo>/<path>`` with the real columns, Arrow types, nesting and JSON layers,
  and sized under ``tokenizer`` so that every slot of DESIGN.md 4.3 fills with candidates to spare,
  with decoys that must not be chosen placed early in candidate order.
- ``write_pins(src, rev_out, books_out, tokenizer_path=None)``: REV and BOOKS for that tree.
- ``census(src, tokenizer)``: for each source and slot, how many candidates fit and whether the
  slots fill when candidates are taken in the build's order.

``python tests/make_sources.py DEST [--tokenizer PATH] [--realdata DIR] [--census]`` writes
DEST/src, DEST/REV, DEST/BOOKS (and DEST/tokenizer.json when no tokenizer is given).

Everything is deterministic: the same arguments give the same bytes.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import hashlib
import io
import json
import random
import re
import shutil
import sys
import time
import unicodedata
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

__all__ = [
    "QWEN_REGEX",
    "SCHEMAS",
    "census",
    "make_sources",
    "make_tokenizer",
    "read_books",
    "read_rev",
    "write_pins",
]

REPO_ROOT = Path(__file__).resolve().parents[1]

QWEN_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

INSTR = {
    "en": "Continue the following text from where it stops.",
    "zh": "請從這段文字停下的地方接著寫下去。",
}

MILLION = 1_000_000


# --------------------------------------------------------------------------- tokenizer


def _byte_tokenizer() -> Tokenizer:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    assert len(alphabet) == 256
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    return tok


def make_tokenizer(path) -> Path:
    """Write the byte-level test tokenizer to ``path`` and return the path."""
    path = Path(path)
    data = (_byte_tokenizer().to_str(pretty=True) + "\n").encode("utf-8")
    assert data == (_byte_tokenizer().to_str(pretty=True) + "\n").encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    check = Tokenizer.from_file(str(path))
    sample = [
        "Hello, world! It's 2024.\r\n\r\n  Tabs\tand  spaces   ",
        "\u3000\u3000話說天下大勢，分久必合，合久必分。「你好」",
        "Cafe\u0301 na\u0308ive \u212b \U0001f600 — “quoted” Привет こんにちは",
        "<function=bash>\n<parameter=command>ls -la</parameter>\n</function>",
    ]
    for text in sample:
        got = len(check.encode(text, add_special_tokens=False).ids)
        want = len(unicodedata.normalize("NFC", text).encode("utf-8"))
        assert got == want, (text, got, want)
    return path


class Tokens:
    """Exact prompt-token counts under one tokenizer (DESIGN 4.1), cached per text. Under the
    byte-level test tokenizer a count is the UTF-8 length of the NFC text, which is checked on a
    sample and then used instead of encoding."""

    def __init__(self, tokenizer_path):
        self.tok = Tokenizer.from_file(str(tokenizer_path))
        self._cache: dict[str, int] = {}
        self.bytes_only = _is_byte_tokenizer(Path(tokenizer_path))
        if self.bytes_only:
            sample = ["It's 2024.\r\n  x", "\u3000話說天下，e\u0301 \U0001f600", "a\n\n\tb  "]
            encs = self.tok.encode_batch(sample, add_special_tokens=False)
            assert [len(e.ids) for e in encs] == [self._nbytes(t) for t in sample]

    @staticmethod
    def _nbytes(text: str) -> int:
        return len(unicodedata.normalize("NFC", text).encode("utf-8"))

    def _encode(self, texts: list[str]) -> list[int]:
        if self.bytes_only:
            return [
                self._nbytes(t)
                if "<|endoftext|>" not in t
                else len(self.tok.encode(t, add_special_tokens=False).ids)
                for t in texts
            ]
        return [len(e.ids) for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def many(self, texts) -> list[int]:
        texts = list(texts)
        todo = [t for t in dict.fromkeys(texts) if t not in self._cache]
        for i in range(0, len(todo), 2048):
            chunk = todo[i : i + 2048]
            for text, n in zip(chunk, self._encode(chunk)):
                self._cache[text] = n
        return [self._cache[t] for t in texts]

    def __call__(self, text: str) -> int:
        return self.many([text])[0]

    def uncached(self, texts) -> list[int]:
        return self._encode(list(texts))


def _is_byte_tokenizer(path: Path) -> bool:
    """Whether path is a tokenizer that make_tokenizer would write."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    model = data.get("model") or {}
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    return (
        model.get("type") == "BPE"
        and not model.get("merges")
        and model.get("vocab") == {ch: i for i, ch in enumerate(alphabet)}
        and data.get("normalizer") == {"type": "NFC"}
        and json.dumps(data.get("pre_tokenizer")) == json.dumps(_BYTE_PRE_TOKENIZER)
        and [t["content"] for t in data.get("added_tokens", [])] == ["<|endoftext|>"]
    )


_BYTE_PRE_TOKENIZER = {
    "type": "Sequence",
    "pretokenizers": [
        {
            "type": "Split",
            "pattern": {"Regex": QWEN_REGEX},
            "behavior": "Isolated",
            "invert": False,
        },
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ],
}


# --------------------------------------------------------------------------- pins


def read_rev(path=None) -> list[dict]:
    """The data lines of a REV file, as dicts (kind, repo, revision, path, bytes, sha256)."""
    path = Path(path) if path else REPO_ROOT / "REV"
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        kind, repo, revision, fpath, nbytes, sha = line.split()[:6]
        out.append(
            {
                "kind": kind,
                "repo": repo,
                "revision": revision,
                "path": fpath,
                "bytes": nbytes,
                "sha256": sha,
            }
        )
    return out


def read_books(path=None) -> list[dict]:
    """The data lines of a BOOKS file, as dicts (ebook, lang, repo, commit, path, bytes, sha256,
    title)."""
    path = Path(path) if path else REPO_ROOT / "BOOKS"
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split(None, 7)
        ebook, lang, repo, commit, fpath, nbytes, sha = parts[:7]
        out.append(
            {
                "ebook": ebook,
                "lang": lang,
                "repo": repo,
                "commit": commit,
                "path": fpath,
                "bytes": nbytes,
                "sha256": sha,
                "title": parts[7].strip() if len(parts) > 7 else "",
            }
        )
    return out


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _replace_fields(line: str, first: int, values: list[str]) -> str:
    """Replace whitespace-separated fields first, first+1, ... of line, keeping the column layout
    where the new values fit."""
    parts = re.split(r"(\s+)", line)
    if parts and parts[0] == "":
        parts = parts[2:]
    for k, value in enumerate(values):
        idx = 2 * (first + k)
        old = parts[idx]
        parts[idx] = value
        if idx + 1 < len(parts):
            width = len(old) + len(parts[idx + 1])
            parts[idx + 1] = " " * max(2, width - len(value))
    return "".join(parts)


def write_pins(src, rev_out, books_out, tokenizer_path=None, rev_in=None, books_in=None) -> None:
    """Write REV and BOOKS for the tree under ``src``: the template files' comments, kinds, repos,
    revisions, paths and titles, with the generated files' sizes and sha256. With
    ``tokenizer_path`` the tokenizer is copied to ``src/<model repo>/<path>`` and pinned; without,
    the model line is kept as it is."""
    src = Path(src)
    rev_in = Path(rev_in) if rev_in else REPO_ROOT / "REV"
    books_in = Path(books_in) if books_in else REPO_ROOT / "BOOKS"
    lines = []
    for line in rev_in.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            lines.append(line)
            continue
        kind, repo, _rev, fpath = line.split()[:4]
        target = src / repo / fpath
        if kind == "model":
            if tokenizer_path is None:
                lines.append(line)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if Path(tokenizer_path).resolve() != target.resolve():
                shutil.copyfile(tokenizer_path, target)
        if not target.is_file():
            raise FileNotFoundError(f"{target} is pinned in {rev_in} but was not generated")
        lines.append(_replace_fields(line, 4, [str(target.stat().st_size), _sha256_file(target)]))
    Path(rev_out).write_text("\n".join(lines) + "\n", encoding="utf-8")

    lines = []
    for line in books_in.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            lines.append(line)
            continue
        repo, fpath = line.split()[2], line.split()[4]
        target = src / repo / fpath
        if not target.is_file():
            raise FileNotFoundError(f"{target} is pinned in {books_in} but was not generated")
        lines.append(_replace_fields(line, 5, [str(target.stat().st_size), _sha256_file(target)]))
    Path(books_out).write_text("\n".join(lines) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- helpers


def _rng(name: str) -> random.Random:
    seed = int.from_bytes(hashlib.sha256(f"kern-prompts/{name}".encode()).digest()[:8], "big")
    return random.Random(seed)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _hex(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def _alnum(rng: random.Random, n: int) -> str:
    chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return "".join(rng.choice(chars) for _ in range(n))


def _place(units, repo: str, revision: str, first: int = 0) -> list:
    """Lay out rows so that the build's candidate order (ascending sha256 of
    "<repo>@<revision>#<row>") visits them in the order given. ``units`` is a list of lists of
    rows; ``first`` is the global number of the first row."""
    rows = [row for unit in units for row in unit]
    ids = sorted(range(first, first + len(rows)), key=lambda i: _sha(f"{repo}@{revision}#{i}"))
    out = [None] * len(rows)
    for row, i in zip(rows, ids):
        out[i - first] = row
    return out


def _weave(valid: list, decoys: list, rng: random.Random, spread: float = 0.5) -> list:
    """Shuffle the valid units and spread the decoy units, shuffled too, over the first part of
    them, so that a build meets the decoys while the slots are still open."""
    valid = list(valid)
    rng.shuffle(valid)
    decoys = list(decoys)
    rng.shuffle(decoys)
    at: dict[int, list] = {}
    for j, d in enumerate(decoys):
        pos = int((j + 0.5) * spread * len(valid) / max(len(decoys), 1))
        at.setdefault(pos, []).append(d)
    out = []
    for i, v in enumerate(valid):
        out.extend(at.pop(i, []))
        out.append(v)
    for pos in sorted(at):
        out.extend(at[pos])
    return out


def _parquet(table: pa.Table, row_group_size: int | None = None) -> bytes:
    sink = io.BytesIO()
    pq.write_table(
        table.combine_chunks(),
        sink,
        compression="zstd",
        row_group_size=row_group_size,
        use_dictionary=True,
        write_statistics=True,
    )
    return sink.getvalue()


def _table(rows: list[dict], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema)


def _compact(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


# --------------------------------------------------------------------------- pseudo text

EN_FUNCTION = (
    "the of and to a in that it was he for on is with as his at by be had not are but from or "
    "have an they which one you were her all she there would their we him been has when who will "
    "more no if out so said what up its about into than them can only other some could these "
    "may then do any my now such like our over me even most after also did many before must "
    "through back where much your way well down should because each just those how too very "
    "still own here between both being under never same another while last might us off since "
    "against upon without again always nothing something every however therefore rather almost"
).split()
EN_CONTENT = (
    "time years people state world life day man men house river morning letter garden window "
    "village money question answer mind heart hand eyes voice friend mother father family country "
    "light water road door church town night story reason nature doctor lady gentleman young "
    "thought looked seemed felt went knew told asked turned began found gave left kept brought "
    "heard spoke wished believed certain whole small large strange quiet kind poor dear true "
    "public common general particular present early late better different important possible "
    "perhaps indeed course matter power labour trade price value species variety animals plants "
    "conditions circumstances work place side part case point number fact government company "
    "system program problem school business service market interest reading evening winter summer "
    "island forest mountain valley field stone bridge wall table chair paper book pen clock "
    "silence memory promise journey purpose feeling opinion character manner interest society "
    "wealth nation produce quantity capital stock rent wages profit land corn silver gold "
    "instinct selection descent structure habit climate islands birds insects seeds organs "
    "court chancery suit lawyer fog street carriage fire candle ghost shadow bell servant"
).split()
EN_NAMES = (
    "Dorothea Casaubon Lydgate Rosamond Fred Mary Celia Brooke Bulstrode Ladislaw Esther Richard "
    "Ada Jarndyce Dedlock Tulkinghorn Guppy Skimpole Bucket Woodcourt Darwin Smith"
).split()

ZH_CHARS = "".join(
    dict.fromkeys(
        "的一是不了人我在有他這中大來上國個到說們為子和你地出道也時年得就那要下以生會自著去之過家學"
        "對可她裏後小麼心多天而能好都然沒日於起還發成事只作當想看文無開手十用主行方又如前所本見經頭面"
        "公同三已老從動兩長知民樣現分將外但身些與高意進把法此實回二理美點月明其種聲全工己話兒者向情部"
        "正名定女問力機給等幾很業最間新什打便位因重被走電四第門相次東政海口使教西再平真聽世氣信北少關"
        "並內加化由卻代軍產入先山五太水萬市眼體別處總才場師書比住員九笑性通目華報立馬命張活難神數件安"
        "表原車白應路期叫死常提感金何更反合放做系計或司利受光王果親界及今京務制解各任至清物臺象記邊共"
        "風戰乾接它許八特覺望直服毛林題建南度統色字請交愛讓認算論百吧某誰連六空完結言取思深往夜江達七"
        "離強片語觀半早城快英義近候青緊熱樂錢雨雪花草春秋冬夏樹雲星河湖石田園村莊街房屋窗桌椅畫詩詞歌"
        "曲琴棋茶酒飯菜米衣帽刀劍弓箭牛羊狗雞魚蟲鳥獸將軍丞相皇帝太尉寨兵馬官府縣州城門寺廟僧道仙妖"
        "怪猴豬沙唐僧行者師父徒弟寶玉黛玉寶釵夫人老爺太太姑娘丫鬟"
    )
)
ZH_PUNCT_MID = "，，，，、；："
ZH_PUNCT_END = "。。。。！？"

RU_WORDS = (
    "я ты он она мы это не что как в на с и но для очень можно нужно помочь написать текст "
    "вопрос ответ пожалуйста спасибо программа код работа время день город книга история человек "
    "жизнь мир дом друг говорить думать знать хотеть сделать объяснить почему когда где который "
    "новый большой хороший первый последний русский язык перевести статья задача решение пример"
).split()
JA_WORDS = (
    "今日は 天気が いいですね 私は 東京に 住んでいます 仕事の 後で 友達と 一緒に 映画を 見ました "
    "この 問題について 教えてください どうすれば よいでしょうか 日本語の 勉強を 続けています 説明して "
    "ありがとうございます プログラムの コードを 書きたいです 小説の 続きを 考えて ください 例えば "
    "しかし そして とても 難しい 簡単な 方法 時間が かかります 明日 会議 資料を 準備する 必要が あります"
).split()
ES_WORDS = (
    "el la de que y en un una por para con no es muy como pero más texto pregunta ayuda "
    "escribir programa ciudad tiempo historia libro trabajo necesito quiero puedes explicar "
    "ejemplo gracias"
).split()
FR_WORDS = (
    "le la les de des et en un une pour avec pas est très comme mais plus texte question aide "
    "écrire programme ville temps histoire livre travail besoin veux peux expliquer exemple merci"
).split()


def _en_sentence(rng: random.Random, lo: int = 5, hi: int = 22) -> str:
    n = rng.randint(lo, hi)
    words = []
    for i in range(n):
        r = rng.random()
        if r < 0.5:
            words.append(rng.choice(EN_FUNCTION))
        elif r < 0.97:
            words.append(rng.choice(EN_CONTENT))
        else:
            words.append(rng.choice(EN_NAMES))
        if i not in (0, n - 1) and rng.random() < 0.08:
            words[-1] += ","
    text = " ".join(words)
    text = text[0].upper() + text[1:]
    end = rng.choice("....?!;")
    if end == ";":
        end = "."
    text += end
    if rng.random() < 0.12:
        text = f"\u201c{text}\u201d said {rng.choice(EN_NAMES)}."
    return text


def _en_paragraph(rng: random.Random, lo: int = 1, hi: int = 7) -> str:
    return " ".join(_en_sentence(rng) for _ in range(rng.randint(lo, hi)))


def _zh_sentence(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 4)):
        parts.append("".join(rng.choice(ZH_CHARS) for _ in range(rng.randint(3, 11))))
    text = "".join(p + rng.choice(ZH_PUNCT_MID) for p in parts[:-1]) + parts[-1]
    text += rng.choice(ZH_PUNCT_END)
    if rng.random() < 0.15:
        name = "".join(rng.choice(ZH_CHARS) for _ in range(2))
        text = f"{name}道：「{text}」"
    return text


def _zh_paragraph(rng: random.Random, lo: int = 1, hi: int = 8) -> str:
    return "".join(_zh_sentence(rng) for _ in range(rng.randint(lo, hi)))


def _words_paragraph(rng: random.Random, words: list[str], sep: str, end: str) -> str:
    out = []
    for _ in range(rng.randint(1, 4)):
        s = sep.join(rng.choice(words) for _ in range(rng.randint(4, 12)))
        out.append(s[0].upper() + s[1:] + end)
    return (" " if sep else "").join(out)


def _wrap_en(text: str, width: int = 70) -> str:
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return "\n".join(lines)


def _wrap_zh(text: str, width: int = 37) -> str:
    return "\n".join(text[i : i + width] for i in range(0, len(text), width))


PY_VERBS = "get set load parse build check make read write update find compute apply merge".split()
PY_NOUNS = (
    "config value items path token node frame record header buffer index schema cache entry"
).split()
PY_ARGS = "data key value path items size name default options other".split()


def _py_function(rng: random.Random) -> str:
    name = f"{rng.choice(PY_VERBS)}_{rng.choice(PY_NOUNS)}"
    args = rng.sample(PY_ARGS, rng.randint(1, 3))
    out = [f"def {name}({', '.join(args)}):", f'    """{_en_sentence(rng, 4, 12)}"""']
    local = list(args)
    for _ in range(rng.randint(2, 9)):
        a, b = rng.choice(local), rng.choice(local)
        v = rng.choice(["result", "out", "tmp", "count", "parts", "seen"])
        kind = rng.randrange(7)
        if kind == 0:
            out.append(f"    {v} = {a} + {b}")
        elif kind == 1:
            out.append(f"    if {a} is None:\n        return {b}")
        elif kind == 2:
            out.append(f"    for item in {a}:\n        {v}.append(item)")
        elif kind == 3:
            out.append(f"    {v} = [x for x in {a} if x != {b}]")
        elif kind == 4:
            out.append(f"    {v} = {rng.choice(PY_VERBS)}_{rng.choice(PY_NOUNS)}({a}, {b})")
        elif kind == 5:
            out.append(f'    raise ValueError(f"invalid {a}: {{{a}!r}}")')
        else:
            out.append(f"    # {_en_sentence(rng, 3, 10)}")
        local.append(v)
    out.append(f"    return {rng.choice(local)}")
    return "\n".join(out)


def _py_module(rng: random.Random, nfunc: int) -> str:
    head = rng.sample(
        ["import os", "import re", "import sys", "import json", "from typing import Any"],
        rng.randint(1, 4),
    )
    body = [_py_function(rng) for _ in range(nfunc)]
    if rng.random() < 0.4:
        cls = f"class {rng.choice(PY_NOUNS).title()}{rng.choice(PY_NOUNS).title()}:\n"
        cls += "\n\n".join("    " + f.replace("\n", "\n    ") for f in body[:2])
        body = [cls] + body[2:]
    return "\n".join(sorted(head)) + "\n\n\n" + "\n\n\n".join(body) + "\n"


# --------------------------------------------------------------------------- pools


@dataclass
class Pool:
    """Texts with their token counts, picked at random within a token range."""

    texts: list[str]
    ntok: list[int]

    def __post_init__(self):
        self._order = sorted(range(len(self.texts)), key=lambda i: (self.ntok[i], i))
        self._keys = [self.ntok[i] for i in self._order]

    def pick(self, rng: random.Random, lo: int = 0, hi: int = 10**12) -> tuple[str, int]:
        a = bisect.bisect_left(self._keys, lo)
        b = bisect.bisect_right(self._keys, hi)
        if a >= b:
            raise ValueError(f"no text of {lo}..{hi} tokens in the pool")
        i = self._order[rng.randrange(a, b)]
        return self.texts[i], self.ntok[i]

    def fill(self, rng, target: int, sep: str, sep_tokens: int, hi: int = 10**12):
        """Texts whose estimated joined size reaches target tokens."""
        parts, est = [], 0
        while est < target:
            text, n = self.pick(rng, 0, hi)
            parts.append(text)
            est += n + sep_tokens
        return parts, est


def _split_paragraphs(text: str) -> list[str]:
    out = []
    for chunk in re.split(r"\n[ \t]*\n", text):
        pieces = [chunk]
        if len(chunk) > 1200:
            pieces = re.split(r"\n(?=[ \u3000])", chunk)
        for p in pieces:
            p = p.strip(" \t\r\n\u3000")
            if 30 <= len(p) <= 2500 and "gutenberg" not in p.lower() and "*" not in p:
                out.append(p)
    return out


class Gen:
    """Everything the source writers share: the tokenizer, the pins and the text pools."""

    def __init__(self, tokenizer_path, realdata=None, rev=None, books=None):
        self.tokens = Tokens(tokenizer_path)
        self.realdata = Path(realdata) if realdata else None
        self.rev = read_rev(rev)
        self.books = read_books(books)
        self._pools: dict[str, Pool] = {}
        self.sep2 = max(0, self.tokens("a\n\nb") - self.tokens("a") - self.tokens("b"))

    def files(self, repo: str) -> list[dict]:
        return [e for e in self.rev if e["repo"] == repo and e["kind"] == "dataset"]

    def pool(self, name: str) -> Pool:
        if name not in self._pools:
            texts = getattr(self, f"_pool_{name}")()
            self._pools[name] = Pool(texts, self.tokens.many(texts))
        return self._pools[name]

    def _book_paragraphs(self, lang: str, per_book: int) -> list[str]:
        out = []
        for b in self.books:
            path = self.realdata / "books" / b["path"]
            if b["lang"] != lang or not path.is_file():
                continue
            text = path.read_bytes().decode("utf-8").replace("\r\n", "\n")
            paras = _split_paragraphs(text)
            paras = paras[len(paras) // 50 : len(paras) - len(paras) // 30]
            step = max(1, len(paras) // per_book)
            out.extend(paras[::step][:per_book])
        return out

    def _pool_en(self) -> list[str]:
        if self.realdata:
            paras = self._book_paragraphs("en", 400)
            if paras:
                return paras
        rng = _rng("pool/en")
        return [_en_paragraph(rng) for _ in range(1500)]

    def _pool_zh(self) -> list[str]:
        if self.realdata:
            paras = self._book_paragraphs("zh", 400)
            if paras:
                return paras
        rng = _rng("pool/zh")
        return [_zh_paragraph(rng) for _ in range(1500)]

    def _pool_code(self) -> list[str]:
        rng = _rng("pool/code")
        out = [_py_module(rng, rng.randint(1, 6)) for _ in range(300)]
        out += [_py_function(rng) + "\n" for _ in range(300)]
        if self.realdata and (self.realdata / "HumanEval.jsonl.gz").is_file():
            for row in _humaneval_rows(self.realdata):
                out.append(row["prompt"] + row["canonical_solution"])
        return out

    def text(self, lang: str, rng: random.Random, target: int, hi: int = 10**12) -> str:
        """Paragraphs of one language joined by blank lines, about target tokens."""
        parts, _ = self.pool(lang).fill(rng, target, "\n\n", self.sep2, hi)
        return "\n\n".join(parts)


def _humaneval_rows(realdata: Path) -> list[dict]:
    with gzip.open(realdata / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _gsm8k_rows(realdata: Path) -> list[dict]:
    with open(realdata / "gsm8k-test.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# --------------------------------------------------------------------------- schemas

_S = pa.string()
_I64 = pa.int64()
_F64 = pa.float64()
_B = pa.bool_()
_TS = pa.timestamp("us")

_WC_HEADER = pa.struct([("accept-language", _S), ("user-agent", _S)])
_WC_USAGE = pa.struct(
    [
        ("completion_tokens", _I64),
        (
            "completion_tokens_details",
            pa.struct(
                [
                    ("reasoning_tokens", _I64),
                    ("text_tokens", _I64),
                    ("audio_tokens", _I64),
                    ("accepted_prediction_tokens", _I64),
                    ("rejected_prediction_tokens", _I64),
                ]
            ),
        ),
        ("prompt_tokens", _I64),
        ("total_tokens", _I64),
        ("prompt_tokens_details", pa.struct([("cached_tokens", _I64), ("audio_tokens", _I64)])),
    ]
)
_WC_TURN = pa.struct(
    [
        ("content", _S),
        ("created", _I64),
        ("header", _WC_HEADER),
        ("hashed_ip", _S),
        ("country", _S),
        ("toxic", _B),
        ("redacted", _B),
        ("state", _S),
        ("language", _S),
        ("openai_id", _S),
        ("role", _S),
        ("temperature", _F64),
        ("timestamp", _TS),
        ("token_counter", _I64),
        ("top_p", _F64),
        ("turn_identifier", _I64),
        ("system_fingerprint", _S),
        ("usage", _WC_USAGE),
    ]
)
_MOD_NAMES = [
    "harassment",
    "harassment/threatening",
    "harassment_threatening",
    "hate",
    "hate/threatening",
    "hate_threatening",
    "illicit",
    "illicit/violent",
    "illicit_violent",
    "self-harm",
    "self-harm/instructions",
    "self-harm/intent",
    "self_harm",
    "self_harm_instructions",
    "self_harm_intent",
    "sexual",
    "sexual/minors",
    "sexual_minors",
    "violence",
    "violence/graphic",
    "violence_graphic",
]
_DETOX_NAMES = [
    "identity_attack",
    "insult",
    "obscene",
    "severe_toxicity",
    "sexual_explicit",
    "threat",
    "toxicity",
]
_WC_MOD = pa.struct(
    [
        ("categories", pa.struct([(n, _B) for n in _MOD_NAMES])),
        ("category_scores", pa.struct([(n, _F64) for n in _MOD_NAMES])),
        ("flagged", _B),
    ]
)
_WC_DETOX = pa.struct([(n, _F64) for n in _DETOX_NAMES])

SCHEMAS: dict[str, pa.Schema] = {
    "openai/mrcr": pa.schema(
        [
            ("prompt", _S),
            ("answer", _S),
            ("random_string_to_prepend", _S),
            ("n_needles", _I64),
            ("desired_msg_index", _I64),
            ("total_messages", _I64),
            ("n_chars", _I64),
            ("date_added", _S),
        ]
    ),
    "SWE-bench/SWE-smith-trajectories": pa.schema(
        [
            ("messages", _S),
            ("instance_id", _S),
            ("resolved", _B),
            ("model", _S),
            ("traj_id", _S),
            ("patch", _S),
        ]
    ),
    "allenai/WildChat-4.8M": pa.schema(
        [
            ("conversation_hash", _S),
            ("model", _S),
            ("timestamp", _TS),
            ("conversation", pa.list_(_WC_TURN)),
            ("turn", _I64),
            ("language", _S),
            ("openai_moderation", pa.list_(_WC_MOD)),
            ("detoxify_moderation", pa.list_(_WC_DETOX)),
            ("toxic", _B),
            ("redacted", _B),
            ("state", _S),
            ("country", _S),
            ("hashed_ip", _S),
            ("header", _WC_HEADER),
        ]
    ),
    "openai/gsm8k": pa.schema([("question", _S), ("answer", _S)]),
    "AI-MO/NuminaMath-1.5": pa.schema(
        [
            ("problem", _S),
            ("solution", _S),
            ("answer", _S),
            ("problem_type", _S),
            ("question_type", _S),
            ("problem_is_valid", _S),
            ("solution_is_valid", _S),
            ("source", _S),
            ("synthetic", _B),
        ]
    ),
    "openai/openai_humaneval": pa.schema(
        [
            ("task_id", _S),
            ("prompt", _S),
            ("canonical_solution", _S),
            ("test", _S),
            ("entry_point", _S),
        ]
    ),
    "google-research-datasets/mbpp": pa.schema(
        [
            ("source_file", _S),
            ("task_id", pa.int32()),
            ("prompt", _S),
            ("code", _S),
            ("test_imports", pa.list_(_S)),
            ("test_list", pa.list_(_S)),
        ]
    ),
    "XiaomiMiMo/MiMo-V2.6-RL-oss/webdev.parquet": pa.schema(
        [
            ("data_source", _S),
            ("prompt", pa.list_(pa.struct([("role", _S), ("content", _S)]))),
            ("ability", _S),
            ("reward_model", pa.struct([("ground_truth", _S), ("style", _S)])),
            ("extra_info", pa.struct([("index", _I64), ("instance_json", _S)])),
            ("agent_name", _S),
        ]
    ),
    "XiaomiMiMo/MiMo-V2.6-RL-oss/music.parquet": pa.schema(
        [
            ("data_source", _S),
            ("prompt", pa.list_(pa.struct([("role", _S), ("content", _S)]))),
            ("ability", _S),
            ("reward_model", pa.struct([("ground_truth", _S), ("style", _S)])),
            (
                "extra_info",
                pa.struct(
                    [
                        ("src_id", _S),
                        ("lang", _S),
                        ("length", _I64),
                        ("meter", _S),
                        ("bpm", _I64),
                        ("tag", _S),
                        ("index", _I64),
                    ]
                ),
            ),
            ("agent_name", _S),
        ]
    ),
}


def schema_for(repo: str, path: str) -> pa.Schema:
    """The Arrow schema of a generated parquet file."""
    return SCHEMAS.get(f"{repo}/{path}") or SCHEMAS[repo]


# --------------------------------------------------------------------------- LongBench-Pro

LB_NEED = {
    ("256k", "English"): 6,
    ("256k", "Chinese"): 6,
    ("8k", "English"): 3,
    ("8k", "Chinese"): 2,
    ("16k", "English"): 2,
    ("16k", "Chinese"): 3,
    ("32k", "English"): 3,
    ("32k", "Chinese"): 2,
    ("64k", "English"): 2,
    ("64k", "Chinese"): 3,
    ("128k", "English"): 3,
    ("128k", "Chinese"): 2,
}
LB_TASKS = [
    ("T1. Retrieval & Ranking", "T1.1 Global Cohesive Retrieval"),
    ("T2. Sequencing & Structure Reconstruction", "T2.1 Global Timeline Reconstruction"),
    ("T3. Evidence-Grounded QA", "T3.2 Multi-Hop Fact QA"),
    ("T4. Summarization & Synthesis", "T4.1 Global-Coverage Constrained Summary"),
    ("T5. Attribution & Citation Alignment", "T5.1 Full-Sentence Citation Alignment"),
    ("T6. Aggregation & Clustering", "T6.3 Quantitative Aggregation"),
    ("T7. Consistency & Compliance Checking", "T7.2 Logical Inconsistency Detection"),
]


def _lb_question(g: Gen, rng: random.Random, lang: str) -> tuple[str, str, list[str]]:
    if lang == "English":
        q = _en_sentence(rng, 8, 20).rstrip(".!?") + "?"
        answer = [_en_sentence(rng, 2, 6)]
        nonthinking = (
            "Please answer the question based on the long document above. "
            f"Output only the final answer.\n\nQuestion: {q}"
        )
        thinking = (
            "Please answer the question based on the long document above. First think step by "
            "step, quoting the passages that support each step, then give the final answer on "
            f'the last line in the form "[Answer]: ...".\n\nQuestion: {q}'
        )
    else:
        q = _zh_sentence(rng).rstrip("。！？") + "？"
        answer = [_zh_sentence(rng)]
        nonthinking = f"請根據上面的長文檔回答問題，只輸出最終答案。\n\n問題：{q}"
        thinking = (
            "請根據上面的長文檔回答問題。請先逐步思考，引用支持每一步的原文，"
            f"最後一行以「[答案]：……」的格式給出最終答案。\n\n問題：{q}"
        )
    return nonthinking, thinking, answer


def gen_longbench(g: Gen) -> dict[str, bytes]:
    (entry,) = g.files("caskcsg/LongBench-Pro")
    rng = _rng("longbench-pro")
    counter = [0]

    def row(bucket, lang, context=None, ctx_tokens=(150, 900)):
        lg = "en" if lang == "English" else "zh"
        if context is None:
            counter[0] += 1
            head = f"Document {counter[0]}\n\n" if lang == "English" else f"文檔{counter[0]}\n\n"
            context = head + g.text(lg, rng, rng.randint(*ctx_tokens), hi=400)
        nonthinking, thinking, answer = _lb_question(g, rng, lang)
        primary, secondary = rng.choice(LB_TASKS)
        return {
            "id": _hex(rng, 24),
            "context": context,
            "language": lang,
            "token_length": bucket,
            "primary_task": primary,
            "secondary_task": secondary,
            "contextual_requirement": rng.choice(["Full", "Partial"]),
            "question_nonthinking": nonthinking,
            "question_thinking": thinking,
            "answer": answer,
            "difficulty": rng.choice(["Easy", "Moderate", "Hard", "Extreme"]),
        }

    valid, decoys = [], []
    for (bucket, lang), need in LB_NEED.items():
        for k in range(2 * need):
            first = row(bucket, lang)
            unit = [first]
            if k == 0 and bucket in ("8k", "32k", "128k", "256k"):
                # The same document again with another question: a context is used once.
                unit.append(row(bucket, lang, context=first["context"]))
            (decoys if len(unit) > 1 else valid).append(unit)
    # A 128k row over the standard range: it fits no slot.
    big = row("128k", "English", ctx_tokens=(1, 1))
    body = g.text("en", rng, 184_000, hi=400)
    big["context"] = "Document 0\n\n" + body
    while g.tokens.uncached([big["context"] + "\n\n\n\n" + big["question_thinking"]])[0] <= 181_000:
        big["context"] += "\n\n" + g.text("en", rng, 2_000, hi=400)
    decoys.append([big])
    units = _weave(valid, decoys, rng)
    rows = _place(units, entry["repo"], entry["revision"])
    data = json.dumps(rows, ensure_ascii=False, indent=4) + "\n"
    return {entry["path"]: data.encode("utf-8")}


# --------------------------------------------------------------------------- MRCR

MRCR_FORMS = (
    "poem|short story|essay|riddle|blog post|social media post|play|letter|speech|sonnet|"
    "limerick|news article|dialogue|song|travel guide"
).split("|")
MRCR_TOPICS = (
    "tapirs|lighthouses|glaciers|bakeries|comets|libraries|owls|harbors|violins|deserts|"
    "trains|gardens|bridges|volcanoes|chess|tea|rivers|clocks|foxes|lanterns|maps|orchards|"
    "storms|bicycles|museums|penguins|islands|markets|kites|telescopes"
).split("|")
MRCR_ORD = {1: "1st", 2: "2nd", 3: "3rd"}


def _mrcr_row(g: Gen, rng: random.Random, replies: Pool, target: int) -> dict:
    asks = {(f, t): f"write a {f} about {t}" for f in MRCR_FORMS for t in MRCR_TOPICS}
    ask_tok = dict(zip(asks, g.tokens.many(list(asks.values()))))
    needle = (rng.choice(MRCR_FORMS), rng.choice(MRCR_TOPICS))
    others = [k for k in asks if k != needle]
    turns, total = [], 0
    while total < target or len(turns) < 4:
        key = rng.choice(others)
        text, n = replies.pick(rng)
        turns.append([key, text])
        total += ask_tok[key] + n
    i, j = sorted(rng.sample(range(len(turns)), 2))
    for k in (i, j):
        total += ask_tok[needle] - ask_tok[turns[k][0]]
        turns[k][0] = needle
    which = rng.choice([1, 2])
    prepend = _alnum(rng, 10)
    msgs = []
    for key, text in turns:
        msgs.append({"role": "user", "content": asks[key]})
        msgs.append({"role": "assistant", "content": text})
    final = (
        f"Prepend {prepend} to the {MRCR_ORD[which]} (1 indexed) {needle[0]} about {needle[1]}. "
        "Do not include any other text in your response."
    )
    msgs.append({"role": "user", "content": final})
    desired = 2 * (i if which == 1 else j) + 1
    return {
        "prompt": json.dumps(msgs),
        "answer": prepend + msgs[desired]["content"],
        "random_string_to_prepend": prepend,
        "n_needles": 2,
        "desired_msg_index": desired,
        "total_messages": len(msgs),
        "n_chars": sum(len(m["content"]) for m in msgs),
        "date_added": "04-12-2025",
        "_tokens": total + g.tokens(final),
    }


MRCR_FULL = [
    (180_001, 262_144),
    (262_145, 393_216),
    (393_217, 524_288),
    (524_289, 655_360),
    (655_361, 786_432),
    (786_433, 1_000_000),
]
MRCR_STANDARD = [
    (8_192, 16_384),
    (16_385, 32_768),
    (32_769, 65_536),
    (65_537, 131_072),
    (131_073, 180_000),
]


def gen_mrcr(g: Gen) -> dict[str, bytes]:
    entries = g.files("openai/mrcr")
    rng = _rng("mrcr")
    src = g.pool("en")
    reply_rng = _rng("mrcr/replies")
    texts = []
    for _ in range(400):
        parts = [src.pick(reply_rng, 0, 500)[0] for _ in range(reply_rng.randint(1, 4))]
        if reply_rng.random() < 0.5:
            parts.insert(0, f"**{_en_sentence(reply_rng, 2, 6).rstrip('.!?')}**")
        texts.append("\n\n".join(parts))
    replies = Pool(texts, g.tokens.many(texts))

    valid, decoys = [], []
    for lo, hi in MRCR_FULL:
        valid.append([(lo, hi, lo + (hi - lo) // 5)])
    for lo, hi in MRCR_STANDARD:
        for frac in (0.3, 0.6):
            valid.append([(lo, hi, lo + int((hi - lo) * frac))])
    for target in (1_500, 4_000, 6_500):
        decoys.append([(0, 8_191, target)])
    order = _weave(valid, decoys, rng)
    rows = []
    for lo, hi, target in [u[0] for u in order]:
        r = _mrcr_row(g, rng, replies, target)
        assert lo <= r.pop("_tokens") <= hi, (lo, hi)
        rows.append([r])
    rows = _place(rows, entries[0]["repo"], entries[0]["revision"])
    out, start = {}, 0
    per = -(-len(rows) // len(entries))
    schema = SCHEMAS["openai/mrcr"]
    for e in entries:
        part = rows[start : start + per]
        start += per
        out[e["path"]] = _parquet(_table(part, schema), row_group_size=4)
    return out


# --------------------------------------------------------------------------- SWE-smith

SWE_SYSTEM = """You are a helpful assistant that can interact with a computer to solve tasks.
<IMPORTANT>
* If user provides a path, you should NOT assume it's relative to the current working directory. Instead, you should explore the file system to find the file before working on it.
</IMPORTANT>

You have access to the following functions:

---- BEGIN FUNCTION #1: bash ----
Description: Execute a bash command in the terminal.

Parameters:
  (1) command (string, required): The bash command to execute. Can be empty to view additional logs when previous exit code is `-1`. Can be `ctrl+c` to interrupt the currently running process.
---- END FUNCTION #1 ----

---- BEGIN FUNCTION #2: submit ----
Description: Finish the interaction when the task is complete OR if the assistant cannot proceed further with the task.
No parameters are required for this function.
---- END FUNCTION #2 ----

---- BEGIN FUNCTION #3: str_replace_editor ----
Description: Custom editing tool for viewing, creating and editing files
* State is persistent across command calls and discussions with the user
* If `path` is a file, `view` displays the result of applying `cat -n`. If `path` is a directory, `view` lists non-hidden files and directories up to 2 levels deep
* The `create` command cannot be used if the specified `path` already exists as a file
* If a `command` generates a long output, it will be truncated and marked with `<response clipped>`
* The `undo_edit` command will revert the last edit made to the file at `path`

Notes for using the `str_replace` command:
* The `old_str` parameter should match EXACTLY one or more consecutive lines from the original file. Be mindful of whitespaces!
* If the `old_str` parameter is not unique in the file, the replacement will not be performed. Make sure to include enough context in `old_str` to make it unique
* The `new_str` parameter should contain the edited lines that should replace the `old_str`

Parameters:
  (1) command (string, required): The commands to run. Allowed options are: `view`, `create`, `str_replace`, `insert`, `undo_edit`.
  (2) path (string, required): Absolute path to file or directory, e.g. `/testbed/file.py` or `/testbed`.
  (3) file_text (string, optional): Required parameter of `create` command, with the content of the file to be created.
  (4) old_str (string, optional): Required parameter of `str_replace` command containing the string in `path` to replace.
  (5) new_str (string, optional): Optional parameter of `str_replace` command containing the new string (if not given, no string will be added).
  (6) insert_line (integer, optional): Required parameter of `insert` command. The `new_str` will be inserted AFTER the line `insert_line` of `path`.
  (7) view_range (array, optional): Optional parameter of `view` command when `path` points to a file.
---- END FUNCTION #3 ----


If you choose to call a function ONLY reply in the following format with NO suffix:

Provide any reasoning for the function call here.
<function=example_function_name>
<parameter=example_parameter_1>value_1</parameter>
<parameter=example_parameter_2>
This is the value for the second parameter
that can span
multiple lines
</parameter>
</function>

<IMPORTANT>
Reminder:
- Function calls MUST follow the specified format, start with <function= and end with </function>
- Required parameters MUST be specified
- Only call one function at a time
- Always provide reasoning for your function call in natural language BEFORE the function call (not after)
</IMPORTANT>"""

SWE_REPOS = [
    ("pandas-dev", "pandas"),
    ("python-attrs", "attrs"),
    ("pallets", "click"),
    ("marshmallow-code", "marshmallow"),
    ("oauthlib", "oauthlib"),
    ("pygments", "pygments"),
    ("tkrajina", "gpxpy"),
    ("getmoto", "moto"),
]
SWE_MUTATIONS = [
    "func_pm_remove_assign",
    "combine_file",
    "func_basic__",
    "lm_rewrite",
    "func_pm_ctrl_invert_if",
    "pr_1234",
]


def _swe_paths(rng: random.Random, pkg: str) -> str:
    return f"/testbed/{pkg}/{rng.choice(PY_NOUNS)}/{rng.choice(PY_VERBS)}_{rng.choice(PY_NOUNS)}.py"


def _swe_assistant(g: Gen, rng: random.Random) -> str:
    thought = _en_paragraph(rng, 1, 3)
    pkg = rng.choice(SWE_REPOS)[1]
    kind = rng.randrange(5)
    if kind == 0:
        call = (
            "<function=bash>\n<parameter=command>"
            f'grep -rn "{rng.choice(PY_VERBS)}_{rng.choice(PY_NOUNS)}" /testbed/{pkg}'
            "</parameter>\n</function>"
        )
    elif kind == 1:
        call = (
            "<function=str_replace_editor>\n<parameter=command>view</parameter>\n"
            f"<parameter=path>{_swe_paths(rng, pkg)}</parameter>\n</function>"
        )
    elif kind == 2:
        code = g.pool("code").pick(rng, 0, 250)[0]
        lines = code.splitlines()
        a = rng.randrange(max(1, len(lines) - 6))
        old = "\n".join(lines[a : a + rng.randint(2, 6)])
        new = old.replace("return", "return  # fixed", 1) if "return" in old else old + "\n"
        call = (
            "<function=str_replace_editor>\n<parameter=command>str_replace</parameter>\n"
            f"<parameter=path>{_swe_paths(rng, pkg)}</parameter>\n"
            f"<parameter=old_str>{old}</parameter>\n<parameter=new_str>{new}</parameter>\n"
            "</function>"
        )
    elif kind == 3:
        code = g.pool("code").pick(rng, 0, 400)[0]
        call = (
            "<function=str_replace_editor>\n<parameter=command>create</parameter>\n"
            "<parameter=path>/testbed/reproduce.py</parameter>\n"
            f"<parameter=file_text>{code}</parameter>\n</function>"
        )
    else:
        call = (
            "<function=bash>\n<parameter=command>cd /testbed && python reproduce.py"
            "</parameter>\n</function>"
        )
    return f"{thought}\n\n{call}"


def _swe_observation(g: Gen, rng: random.Random, hi: int) -> str:
    kind = rng.randrange(4)
    code = g.pool("code")
    pkg = rng.choice(SWE_REPOS)[1]
    if kind == 0:
        parts, _ = code.fill(rng, rng.randint(50, hi), "\n\n", g.sep2, hi=max(hi // 2, 300))
        lines = "\n\n".join(parts).splitlines()
        numbered = "\n".join(f"{i + 1:6}\t{line}" for i, line in enumerate(lines))
        path = _swe_paths(rng, pkg)
        return f"OBSERVATION:\nHere's the result of running `cat -n` on {path}:\n{numbered}\n"
    if kind == 1:
        out = []
        for _ in range(rng.randint(2, 25)):
            out.append(
                f"{_swe_paths(rng, pkg)[9:]}:{rng.randint(1, 900)}:    "
                f"{rng.choice(PY_VERBS)}_{rng.choice(PY_NOUNS)}({rng.choice(PY_ARGS)})"
            )
        return "OBSERVATION:\n" + "\n".join(out)
    if kind == 2:
        fails = [
            f"FAILED tests/test_{rng.choice(PY_NOUNS)}.py::test_{rng.choice(PY_VERBS)}_"
            f"{rng.choice(PY_NOUNS)} - AssertionError: {_en_sentence(rng, 3, 8)}"
            for _ in range(rng.randint(1, 12))
        ]
        return (
            "OBSERVATION:\n============================= test session starts "
            "==============================\nplatform linux -- Python 3.10.16, pytest-8.3.4, "
            f"pluggy-1.5.0\nrootdir: /testbed\ncollected {rng.randint(10, 400)} items\n\n"
            + "\n".join(fails)
            + f"\n========================= {len(fails)} failed in {rng.randint(1, 90)}.12s "
            "=========================\n"
        )
    text, _ = code.pick(rng, 0, hi)
    lines = text.splitlines()[: rng.randint(3, 30)]
    numbered = "\n".join(f"{i + 1:6}\t{line}" for i, line in enumerate(lines))
    return (
        f"OBSERVATION:\nThe file {_swe_paths(rng, pkg)} has been edited. Here's the result of "
        f"running `cat -n` on a snippet of the edited file:\n{numbered}\nReview the changes and "
        "make sure they are as expected. Edit the file again if necessary."
    )


def gen_swe(g: Gen) -> dict[str, bytes]:
    (entry,) = g.files("SWE-bench/SWE-smith-trajectories")
    rng = _rng("swe-smith")
    prng = _rng("swe-smith/pools")
    atexts = [_swe_assistant(g, prng) for _ in range(240)]
    otexts = [_swe_observation(g, prng, prng.choice([300, 700, 1200])) for _ in range(300)]
    apool = Pool(atexts, g.tokens.many(atexts))
    opool = Pool(otexts, g.tokens.many(otexts))
    sys_tok = g.tokens(SWE_SYSTEM)
    submit = (
        "I have made the necessary changes; submitting them now.\n\n<function=submit>\n</function>"
    )

    def trajectory(target: int):
        owner, name = rng.choice(SWE_REPOS)
        instance = (
            f"{owner}__{name}.{_hex(rng, 8)}.{rng.choice(SWE_MUTATIONS)}__{_alnum(rng, 8).lower()}"
        )
        desc = g.text("en", rng, rng.randint(120, 500), hi=250)
        user = (
            "<uploaded_files>\n/testbed\n</uploaded_files>\nI've uploaded a python code "
            "repository in the directory /testbed. Consider the following PR description:\n\n"
            f"<pr_description>\n{desc}\n</pr_description>\n\nCan you help me implement the "
            "necessary changes to the repository so that the requirements specified in the "
            "<pr_description> are met?\nI've already taken care of all changes to any of the test "
            "files described in the <pr_description>. This means you DON'T have to modify the "
            "testing logic or any of the tests in any way!\nYour task is to make the minimal "
            "changes to non-tests files in the /testbed directory to ensure the "
            "<pr_description> is satisfied."
        )
        msgs = [{"role": "system", "content": SWE_SYSTEM}, {"role": "user", "content": user}]
        total = sys_tok + g.tokens(user)
        while total < target or len(msgs) < 6:
            a, na = apool.pick(rng, 0, 700)
            o, no = opool.pick(rng, 0, 1500)
            msgs.append({"role": "assistant", "content": a})
            msgs.append({"role": "user", "content": o})
            total += na + no
        msgs.append({"role": "assistant", "content": submit})
        patch = (
            f"diff --git a/{name}/core.py b/{name}/core.py\nindex {_hex(rng, 7)}..{_hex(rng, 7)}"
            f" 100644\n--- a/{name}/core.py\n+++ b/{name}/core.py\n@@ -{rng.randint(1, 400)},7 "
            f"+{rng.randint(1, 400)},7 @@\n-    return value\n+    return value or default\n"
        )
        return {
            "messages": msgs,
            "instance_id": instance,
            "resolved": rng.random() < 0.6,
            "model": "claude-3-7-sonnet-20250219",
            "traj_id": f"{instance}.{_alnum(rng, 8).lower()}",
            "patch": patch,
            "_tokens": total,
        }

    def finish(row: dict, layers: int) -> dict:
        row = dict(row)
        row.pop("_tokens", None)
        text = json.dumps(row["messages"])
        row["messages"] = json.dumps(text) if layers == 2 else text
        return row

    valid, decoys = [], []
    # The four longest whole trajectories (full), the third one duplicated under its traj_id.
    longest = [trajectory(t) for t in (174_000, 166_000, 158_000, 150_000)]
    for k, t in enumerate(longest):
        unit = [finish(t, 2 if k in (0, 3) else 1)]
        if k == 2:
            unit.append(finish(t, 2))
        (decoys if len(unit) > 1 else valid).append(unit)
    groups = [
        (5, 134_000, 146_000),
        (6, 67_000, 75_000),
        (6, 34_000, 38_000),
        (6, 17_000, 19_500),
    ]
    for gi, (n, lo, hi) in enumerate(groups):
        for k in range(n):
            t = trajectory(rng.randint(lo, hi))
            unit = [finish(t, 2 if k % 3 == 1 else 1)]
            if gi in (1, 2) and k == 0:
                unit.append(finish(t, 1 if k % 3 == 1 else 2))
            (decoys if len(unit) > 1 else valid).append(unit)
    for target in (5_000, 8_000, 10_500):  # too short for every cut
        decoys.append([finish(trajectory(target), 1)])
    units = _weave(valid, decoys, rng)
    rows = _place(units, entry["repo"], entry["revision"])
    table = _table(rows, SCHEMAS["SWE-bench/SWE-smith-trajectories"])
    return {entry["path"]: _parquet(table, row_group_size=8)}


# --------------------------------------------------------------------------- Nemotron

NEMO_TOOLS = [
    {
        "name": "get_order_details",
        "description": "Get the status and details of an order.",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {
                    "type": "string",
                    "description": "The order id, such as '#W0000000'. Be careful there is a "
                    "'#' symbol at the beginning of the order id.",
                }
            },
            "required": ["order_id"],
        },
    },
    {
        "name": "cancel_pending_order",
        "description": "Cancel a pending order. The agent must obtain explicit confirmation.",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {"type": "string", "description": "The order id."},
                "reason": {
                    "type": "string",
                    "enum": ["no longer needed", "ordered by mistake"],
                    "description": "The reason for cancellation.",
                },
            },
            "required": ["order_id", "reason"],
        },
    },
    {
        "name": "search_direct_flight",
        "description": "Search direct flights between two cities on a specific date.",
        "parameters": {
            "type": "object",
            "properties": {
                "origin": {"type": "string", "description": "IATA code, such as 'JFK'."},
                "destination": {"type": "string", "description": "IATA code, such as 'LAX'."},
                "date": {"type": "string", "description": "The date in 'YYYY-MM-DD' format."},
            },
            "required": ["origin", "destination", "date"],
        },
    },
    {
        "name": "update_reservation_passengers",
        "description": "Update the passenger information of a reservation.",
        "parameters": {
            "type": "object",
            "properties": {
                "reservation_id": {"type": "string"},
                "passengers": {
                    "type": "array",
                    "description": "The passengers.",
                    "items": {
                        "type": "object",
                        "properties": {
                            "first_name": {"type": "string"},
                            "last_name": {"type": "string"},
                            "dob": {"type": "string", "description": "YYYY-MM-DD"},
                        },
                        "required": ["first_name", "last_name", "dob"],
                    },
                },
            },
            "required": ["reservation_id", "passengers"],
            "additionalProperties": False,
        },
    },
    {
        "name": "calculate",
        "description": "Calculate the result of a mathematical expression.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "description": "The expression, with numbers and + - * / ( ) only.",
                }
            },
        },
    },
    {
        "name": "transfer_to_human_agents",
        "description": "Transfer the user to a human agent, with a summary of the issue.",
        "parameters": {
            "type": "object",
            "properties": {"summary": {"type": "string"}},
            "required": ["summary"],
        },
    },
    {
        "name": "list_all_product_types",
        "description": "List the name and product id of all product types.",
        "parameters": {"type": "object", "properties": {}, "required": []},
    },
    {
        "name": "modify_user_address",
        "description": "Modify the default address of a user.",
        "parameters": {
            "type": "object",
            "properties": {
                "user_id": {"type": "string"},
                "address": {
                    "type": "object",
                    "properties": {
                        "address1": {"type": "string"},
                        "address2": {"type": "string"},
                        "city": {"type": "string"},
                        "state": {"type": "string"},
                        "country": {"type": "string"},
                        "zip": {"type": "string"},
                    },
                    "required": ["address1", "city", "country", "zip"],
                },
            },
            "required": ["user_id", "address"],
        },
    },
    {
        "name": "get_available_slots",
        "description": "Get the available appointment slots for a service.",
        "parameters": {
            "type": "object",
            "properties": {
                "service_id": {"type": "integer", "minimum": 1},
                "days_ahead": {"type": "integer", "default": 7, "maximum": 60},
                "include_weekends": {"type": "boolean"},
            },
            "required": ["service_id"],
        },
    },
    {
        "name": "search_knowledge_base",
        "description": "Search the help center articles.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "top_k": {"type": "number"},
                "filters": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["billing", "shipping", "returns"]},
                },
            },
            "required": ["query"],
        },
    },
]


def _json_value(rng: random.Random, schema: dict):
    """A value that fits a JSON schema of the kinds the tool catalogue uses."""
    kind = schema.get("type")
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if kind == "string":
        return rng.choice(
            [
                f"#W{rng.randint(10**6, 10**7 - 1)}",
                _en_sentence(rng, 2, 6).rstrip(".!?"),
                f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                rng.choice(["JFK", "LAX", "SFO", "ORD"]),
            ]
        )
    if kind == "integer":
        return rng.randint(1, 30)
    if kind == "number":
        return rng.randint(1, 10)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        item = schema.get("items", {"type": "string"})
        return [_json_value(rng, item) for _ in range(rng.randint(1, 2))]
    if kind == "object":
        required = schema.get("required", [])
        return {
            k: _json_value(rng, v)
            for k, v in schema.get("properties", {}).items()
            if k in required or rng.random() < 0.5
        }
    return None


def _nemo_result(g: Gen, rng: random.Random, structured: bool, most: int = 8):
    if structured:
        obj = {
            "status": rng.choice(["ok", "pending", "delivered", "cancelled"]),
            "id": f"#W{rng.randint(1000000, 9999999)}",
            "items": [
                {"item_id": str(rng.randint(10**9, 10**10)), "price": rng.randint(5, 900) + 0.5}
                for _ in range(rng.randint(1, 3))
            ],
        }
        return obj if rng.random() < 0.7 else obj["items"]
    records = []
    for _ in range(rng.randint(1, most)):
        records.append(
            {
                "name": _en_sentence(rng, 2, 5).rstrip(".!?"),
                "item_id": str(rng.randint(10**9, 10**10)),
                "price": round(rng.uniform(5, 900), 2),
                "available": rng.random() < 0.8,
                "options": {
                    "color": rng.choice(["red", "blue", "black"]),
                    "size": rng.choice("SML"),
                },
                "note": _en_sentence(rng, 6, 18),
            }
        )
    obj = {"result": records, "count": len(records)}
    return json.dumps(obj, indent=rng.choice([None, 2]))


def _nemotron_row(g: Gen, rng: random.Random, target: int, end: str) -> dict:
    reasoning = rng.choice(["on", "off"])
    tools = [{"type": "function", "function": t} for t in rng.sample(NEMO_TOOLS, rng.randint(3, 7))]
    null_content = rng.random() < 0.5
    system = (
        f"# Policy\n\nYou are a customer service agent for {rng.choice(EN_NAMES)} & Co. "
        "Follow the policy below.\n\n"
        + g.text("en", rng, rng.randint(min(400, target // 8), min(1200, target // 4)), hi=300)
    )
    msgs = [{"role": "system", "content": system}]

    def assistant(content, calls=None):
        m = {"role": "assistant", "content": content}
        m["reasoning_content"] = g.text("en", rng, 60, hi=150) if reasoning == "on" else ""
        m["tool_calls"] = calls
        return m

    def view_tokens():
        k = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        texts = []
        for m in msgs[:k]:
            c = m["content"]
            if isinstance(c, str):
                texts.append(c)
            elif c is not None:
                texts.append(_compact(c))
        return sum(g.tokens.many(texts)), k

    while True:
        user = g.text("en", rng, rng.randint(20, 150), hi=150)
        msgs.append({"role": "user", "content": user})
        for _ in range(rng.randint(1, 1 if target < 3_000 else 2)):
            calls = []
            for _ in range(1 if rng.random() < 0.8 else 2):
                fn = rng.choice(tools)["function"]
                args = _json_value(rng, fn["parameters"])
                calls.append(
                    {
                        "id": f"call_{_alnum(rng, 24)}",
                        "type": "function",
                        "function": {"name": fn["name"], "arguments": json.dumps(args)},
                    }
                )
            msgs.append(assistant(None if null_content else "", calls))
            for c in calls:
                structured = rng.random() < 0.2
                msgs.append(
                    {
                        "role": "tool",
                        "content": _nemo_result(g, rng, structured, 2 if target < 3_000 else 4),
                        "tool_call_id": c["id"],
                    }
                )
        msgs.append(assistant(g.text("en", rng, rng.randint(40, 250), hi=250)))
        if view_tokens()[0] >= target:
            break
    if end == "user":
        msgs.append({"role": "user", "content": g.text("en", rng, rng.randint(20, 120), hi=120)})
        msgs.append(assistant(g.text("en", rng, rng.randint(40, 250), hi=250)))
    tokens, k = view_tokens()
    assert msgs[k - 1]["role"] == end
    return {
        "uuid": f"{_hex(rng, 8)}-{_hex(rng, 4)}-{_hex(rng, 4)}-{_hex(rng, 4)}-{_hex(rng, 12)}",
        "messages": msgs,
        "tools": tools,
        "license": "cc-by-4.0",
        "used_in": ["nano_v3"] if rng.random() < 0.7 else ["nano_v3", "super_v1"],
        "reasoning": reasoning,
        "_tokens": tokens,
    }


def gen_nemotron(g: Gen) -> dict[str, bytes]:
    (entry,) = g.files("nvidia/Nemotron-Agentic-v1")
    rng = _rng("nemotron-agentic")
    valid, decoys = [], []
    for end in ("tool", "user"):
        for _ in range(7):
            r = _nemotron_row(g, rng, rng.randint(4_000, 8_000), end)
            assert 3_500 <= r["_tokens"] <= 11_000, r["_tokens"]
            valid.append([r])
        for target in (900, 1_500):
            r = _nemotron_row(g, rng, target, end)
            assert r["_tokens"] < 2_900, r["_tokens"]
            decoys.append([r])
        r = _nemotron_row(g, rng, 13_500, end)
        assert r["_tokens"] > 12_500
        decoys.append([r])
    units = _weave(valid, decoys, rng, spread=0.6)
    rows = _place(units, entry["repo"], entry["revision"])
    lines = []
    for r in rows:
        r = dict(r)
        r.pop("_tokens")
        lines.append(json.dumps(r, ensure_ascii=False) + "\n")
    return {entry["path"]: "".join(lines).encode("utf-8")}


# --------------------------------------------------------------------------- WildChat

WC_PLACES = {
    "English": [("United States", "California"), ("United Kingdom", "England"), ("Canada", None)],
    "Chinese": [("China", "Beijing"), ("Hong Kong", None), ("Taiwan", "Taipei")],
    "Russian": [("Russia", "Moscow"), ("Russia", None)],
    "Japanese": [("Japan", "Tokyo")],
    "Spanish": [("Mexico", "Jalisco")],
    "French": [("France", "Île-de-France")],
}
WC_ACCEPT = {
    "English": "en-US,en;q=0.9",
    "Chinese": "zh-CN,zh;q=0.9,en;q=0.8",
    "Russian": "ru-RU,ru;q=0.9,en-US;q=0.8",
    "Japanese": "ja,en-US;q=0.9,en;q=0.8",
    "Spanish": "es-MX,es;q=0.9",
    "French": "fr-FR,fr;q=0.9,en;q=0.8",
}
WC_UA = [
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/124.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) "
    "Version/17.4 Safari/605.1.15",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like "
    "Gecko) Mobile/15E148",
]
WC_MODELS = [
    "gpt-4o-mini-2024-07-18",
    "gpt-4-0125-preview",
    "gpt-3.5-turbo-0125",
    "gpt-4o-2024-08-06",
    "o1-mini-2024-09-12",
]
WC_ASK = {
    "English": [
        "Can you rewrite this paragraph so it reads better: ",
        "Summarize the following text in three sentences: ",
        "What do you think the author means here? ",
        "Continue this story: ",
    ],
    "Chinese": [
        "請幫我潤色這段話：",
        "總結一下下面的內容：",
        "把這段翻譯成英文：",
        "你怎麼看這段話？",
    ],
    "Russian": ["Помоги, пожалуйста: ", "Переведи на английский: ", "Объясни: "],
    "Japanese": ["次の文章を要約してください：", "これを英語に翻訳してください：", "説明して："],
    "Spanish": ["Ayúdame con esto: ", "Traduce al inglés: "],
    "French": ["Aide-moi avec ceci : ", "Traduis en anglais : "],
}


def _wc_text(g: Gen, rng: random.Random, lang: str, target: int, hi: int) -> str:
    if lang == "English":
        return g.text("en", rng, target, hi)
    if lang == "Chinese":
        return g.text("zh", rng, target, hi)
    words, sep, end = {
        "Russian": (RU_WORDS, " ", "."),
        "Japanese": (JA_WORDS, "", "。"),
        "Spanish": (ES_WORDS, " ", "."),
        "French": (FR_WORDS, " ", "."),
    }[lang]
    parts, n = [], 0
    while n < target:
        p = _words_paragraph(rng, words, sep, end)
        parts.append(p)
        n += g.tokens(p) + g.sep2
    return "\n\n".join(parts)


def _wc_conversation(g, rng, lang, turns, user_tok, reply_tok, first_user=None):
    convo = []
    for t in range(turns):
        if t == 0 and first_user is not None:
            user = first_user
        else:
            user = rng.choice(WC_ASK[lang]) + _wc_text(g, rng, lang, rng.randint(*user_tok), 200)
        convo.append(("user", user))
        convo.append(("assistant", _wc_text(g, rng, lang, rng.randint(*reply_tok), 300)))
    return convo


def _wc_row(g: Gen, rng: random.Random, lang: str, convo, toxic=False, redacted=False) -> dict:
    country, state = rng.choice(WC_PLACES[lang])
    header = {"accept-language": WC_ACCEPT[lang], "user-agent": rng.choice(WC_UA)}
    ip = _hex(rng, 64)
    start = datetime(2024, 4, 1) + timedelta(seconds=rng.randrange(200 * 86400))
    model = rng.choice(WC_MODELS)
    turns, mods, detox = [], [], []
    clock = start
    turn_id = rng.randrange(10**9, 4 * 10**9)
    user_turns = sum(1 for role, _ in convo if role == "user")
    toxic_at = rng.randrange(user_turns) if toxic else -1
    u = -1
    for role, content in convo:
        clock += timedelta(seconds=rng.randrange(5, 300))
        if role == "user":
            u += 1
            turn_id += rng.randrange(1, 5000)
        is_toxic = role == "user" and u == toxic_at
        if redacted and role == "user" and u == 0:
            content = content + " My name is <PRESIDIO_ANONYMIZED_PERSON>."
        if role == "user":
            turns.append(
                {
                    "content": content,
                    "created": None,
                    "header": header,
                    "hashed_ip": ip,
                    "country": country,
                    "toxic": is_toxic,
                    "redacted": redacted and u == 0,
                    "state": state,
                    "language": lang,
                    "openai_id": None,
                    "role": "user",
                    "temperature": None,
                    "timestamp": clock,
                    "token_counter": None,
                    "top_p": None,
                    "turn_identifier": turn_id,
                    "system_fingerprint": None,
                    "usage": None,
                }
            )
        else:
            completion = rng.randrange(50, 1500)
            prompt_tokens = rng.randrange(20, 3000)
            turns.append(
                {
                    "content": content,
                    "created": int((clock - datetime(1970, 1, 1)).total_seconds()),
                    "header": None,
                    "hashed_ip": None,
                    "country": None,
                    "toxic": False,
                    "redacted": False,
                    "state": None,
                    "language": lang,
                    "openai_id": f"chatcmpl-{_alnum(rng, 29)}",
                    "role": "assistant",
                    "temperature": 1.0,
                    "timestamp": clock,
                    "token_counter": completion,
                    "top_p": 1.0,
                    "turn_identifier": turn_id,
                    "system_fingerprint": f"fp_{_hex(rng, 10)}" if rng.random() < 0.7 else None,
                    "usage": {
                        "completion_tokens": completion,
                        "completion_tokens_details": {
                            "reasoning_tokens": 0,
                            "text_tokens": None,
                            "audio_tokens": 0,
                            "accepted_prediction_tokens": 0,
                            "rejected_prediction_tokens": 0,
                        },
                        "prompt_tokens": prompt_tokens,
                        "total_tokens": prompt_tokens + completion,
                        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                    },
                }
            )
        flagged = is_toxic
        mods.append(
            {
                "categories": {n: flagged and n == "harassment" for n in _MOD_NAMES},
                "category_scores": {
                    n: round(rng.random() * (0.9 if flagged else 0.001), 9) for n in _MOD_NAMES
                },
                "flagged": flagged,
            }
        )
        detox.append({n: round(rng.random() * (0.9 if flagged else 0.01), 9) for n in _DETOX_NAMES})
    return {
        "conversation_hash": _hex(rng, 32),
        "model": model,
        "timestamp": clock,
        "conversation": turns,
        "turn": user_turns,
        "language": lang,
        "openai_moderation": mods,
        "detoxify_moderation": detox,
        "toxic": toxic,
        "redacted": redacted,
        "state": state,
        "country": country,
        "hashed_ip": ip,
        "header": header,
    }


def _wc_view_tokens(g: Gen, convo) -> int:
    k = max(i for i, (role, _) in enumerate(convo) if role == "assistant")
    return sum(g.tokens.many([c for _, c in convo[:k]]))


def gen_wildchat(g: Gen) -> dict[str, bytes]:
    (entry,) = g.files("allenai/WildChat-4.8M")
    rng = _rng("wildchat")

    def fitting(lang, turns=None):
        for _ in range(50):
            n = turns or rng.randint(2, 4)
            convo = _wc_conversation(g, rng, lang, n, (10, 120), (60, 500))
            if 120 <= _wc_view_tokens(g, convo) <= 3_500:
                return convo
        raise AssertionError("no WildChat conversation of the wanted size")

    valid, decoys = [], []
    for lang, n in (("English", 12), ("Chinese", 18), ("Russian", 3), ("Japanese", 3)):
        for k in range(n):
            convo = fitting(lang)
            unit = [_wc_row(g, rng, lang, convo)]
            if k == 0 and lang in ("English", "Chinese"):
                # Another conversation opening with the same first user message.
                again = fitting(lang)
                again = [convo[0]] + again[1:]
                unit.append(_wc_row(g, rng, lang, again))
            (decoys if len(unit) > 1 else valid).append(unit)
    for lang in ("Spanish", "French"):
        for _ in range(2):
            valid.append([_wc_row(g, rng, lang, fitting(lang))])
    for lang in ("English", "Chinese"):
        decoys.append([_wc_row(g, rng, lang, fitting(lang), toxic=True)])
        decoys.append([_wc_row(g, rng, lang, fitting(lang), toxic=True)])
        decoys.append([_wc_row(g, rng, lang, fitting(lang), redacted=True)])
        for _ in range(2):
            one = _wc_conversation(g, rng, lang, 1, (40, 200), (60, 500))
            decoys.append([_wc_row(g, rng, lang, one)])
        long = _wc_conversation(g, rng, lang, 2, (2_600, 3_000), (200, 400))
        assert _wc_view_tokens(g, long) > 4_300
        decoys.append([_wc_row(g, rng, lang, long)])
        short = (
            [("user", "hi"), ("assistant", "Hello! How can I help you today?"), ("user", "thanks")]
            if lang == "English"
            else [("user", "你好"), ("assistant", "你好！有什麼可以幫你的嗎？"), ("user", "謝謝")]
        )
        short.append(("assistant", "You're welcome!" if lang == "English" else "不客氣！"))
        assert _wc_view_tokens(g, short) < 64
        decoys.append([_wc_row(g, rng, lang, short)])
    decoys.append([_wc_row(g, rng, "Russian", fitting("Russian", 1))])
    units = _weave(valid, decoys, rng)
    rows = _place(units, entry["repo"], entry["revision"])
    table = _table(rows, SCHEMAS["allenai/WildChat-4.8M"])
    return {entry["path"]: _parquet(table, row_group_size=16)}


# --------------------------------------------------------------------------- GSM8K

GSM_NAMES = "Natalia Weng Betty Julie James Albert Ken Alexis Tina Mark".split()
GSM_THINGS = "clips apples stickers marbles cookies books pencils eggs shells cards".split()


def gen_gsm8k(g: Gen) -> dict[str, bytes]:
    (entry,) = g.files("openai/gsm8k")
    rng = _rng("gsm8k")
    rows = []
    if g.realdata and (g.realdata / "gsm8k-test.jsonl").is_file():
        real = _gsm8k_rows(g.realdata)
        rows = [{"question": r["question"], "answer": r["answer"]} for r in real[::55][:24]]
    else:
        for _ in range(24):
            name, thing = rng.choice(GSM_NAMES), rng.choice(GSM_THINGS)
            a, b, c = rng.randint(2, 60), rng.randint(2, 60), rng.randint(2, 6)
            part = {2: "half", 3: "third", 4: "quarter", 5: "fifth", 6: "sixth"}[c]
            q = (
                f"{name} had {a} {thing}. She bought {b} more {thing} and then gave away a "
                f"{part} of what she had, rounded down. How many {thing} does {name} have now?"
            )
            total = a + b
            given = total // c
            ans = (
                f"{name} had {a} + {b} = <<{a}+{b}={total}>>{total} {thing}.\n"
                f"She gave away {total} / {c} = <<{total}//{c}={given}>>{given} {thing}.\n"
                f"She has {total} - {given} = <<{total}-{given}={total - given}>>"
                f"{total - given} {thing} left.\n#### {total - given}"
            )
            rows.append({"question": q, "answer": ans})
    table = _table(rows, SCHEMAS["openai/gsm8k"])
    return {entry["path"]: _parquet(table)}


# --------------------------------------------------------------------------- NuminaMath

NM_PIECES = [
    "Let $a$, $b$ and $c$ be positive real numbers such that $a+b+c={A}$.",
    "Find all positive integers $n$ such that $n^{{2}}+{A}n+{B}$ is a perfect square.",
    "Let $ABC$ be a triangle with $AB={A}$, $BC={B}$ and $CA={C}$.",
    "Prove that for every integer $k \\geq {A}$ the number $k^{{3}}-k$ is divisible by ${C}$.",
    "The sequence $(a_n)$ is defined by $a_{{1}}={A}$ and $a_{{n+1}}=a_n^{{2}}-{B}$ "
    "for $n \\geq 1$.",
    "Determine the largest real number $\\lambda$ such that the inequality holds for all "
    "such triples.",
    "Points $D$ and $E$ lie on the sides $AB$ and $AC$ respectively, and $DE \\parallel BC$.",
    "How many ways are there to colour the cells of a ${A} \\times {B}$ board so that no two "
    "adjacent cells have the same colour?",
    "Compute the remainder when $\\sum_{{k=1}}^{{{B}}} k^{{{C}}}$ is divided by ${A}$.",
    "已知函數 $f(x)=x^{{2}}-{A}x+{B}$，求 $f(x)$ 在區間 $[0,{C}]$ 上的最小值。",
    "Show that the equation $x^{{2}}-{A}y^{{2}}=1$ has infinitely many integer solutions.",
]
NM_TYPES = ["Algebra", "Number Theory", "Geometry", "Combinatorics", "Inequalities", "Calculus"]


def _nm_problem(g: Gen, rng: random.Random, lo: int, hi: int) -> str:
    for _ in range(200):
        parts, text = [], ""
        target = rng.randint(lo, hi)
        pieces = rng.sample(NM_PIECES, len(NM_PIECES)) * 3
        while True:
            piece = pieces[len(parts)].format(
                A=rng.randint(2, 99), B=rng.randint(2, 99), C=rng.randint(2, 9)
            )
            parts.append(piece)
            text = " ".join(parts)
            if g.tokens(text) >= target:
                break
        if lo <= g.tokens(text) <= hi:
            return text
    raise AssertionError(f"no NuminaMath problem of {lo}..{hi} tokens")


def gen_numinamath(g: Gen) -> dict[str, bytes]:
    entries = g.files("AI-MO/NuminaMath-1.5")
    rng = _rng("numinamath")

    def row(problem, source, synthetic):
        ans = str(rng.randint(1, 500))
        return {
            "problem": problem,
            "solution": " ".join(_en_sentence(rng, 6, 16) for _ in range(rng.randint(2, 6)))
            + f" Hence the answer is $\\boxed{{{ans}}}$.",
            "answer": ans,
            "problem_type": rng.choice(NM_TYPES),
            "question_type": rng.choice(["math-word-problem", "proof", "MCQ"]),
            "problem_is_valid": "Yes",
            "solution_is_valid": "Yes",
            "source": source,
            "synthetic": synthetic,
        }

    valid = [[row(_nm_problem(g, rng, 45, 175), "olympiads", False)] for _ in range(20)]
    decoys = []
    for _ in range(5):
        decoys.append([row(_nm_problem(g, rng, 45, 175), "olympiads", True)])
    for src in ["cn_k12"] * 4 + ["aops_forum"] * 3 + ["amc_aime", "olympiads_ref", "number_theory"]:
        decoys.append([row(_nm_problem(g, rng, 45, 175), src, False)])
    for text in ("Solve $x^2-5x+6=0$.", "Find $\\gcd(84, 36)$.", "Is $2^{11}-1$ prime?"):
        assert g.tokens(text) < 32
        decoys.append([row(text, "olympiads", False)])
    for _ in range(3):
        decoys.append([row(_nm_problem(g, rng, 215, 300), "olympiads", False)])
    units = _weave(valid, decoys, rng, spread=0.7)
    rows = _place(units, entries[0]["repo"], entries[0]["revision"])
    out, start = {}, 0
    per = -(-len(rows) // len(entries))
    for e in entries:
        table = _table(rows[start : start + per], SCHEMAS["AI-MO/NuminaMath-1.5"])
        out[e["path"]] = _parquet(table, row_group_size=8)
        start += per
    return out


# --------------------------------------------------------------------------- HumanEval, MBPP


def gen_humaneval(g: Gen) -> dict[str, bytes]:
    (entry,) = g.files("openai/openai_humaneval")
    rng = _rng("humaneval")
    rows = []
    if g.realdata and (g.realdata / "HumanEval.jsonl.gz").is_file():
        real = _humaneval_rows(g.realdata)
        rows = [dict(r) for r in real[::14][:12]]
    else:
        for i in range(12):
            name = f"{rng.choice(PY_VERBS)}_{rng.choice(PY_NOUNS)}"
            doc = _en_sentence(rng, 8, 20)
            prompt = (
                "from typing import List\n\n\n"
                f"def {name}(values: List[int], k: int) -> List[int]:\n"
                f'    """ {doc}\n    >>> {name}([1, 2, 3], {i})\n    [1, 2, 3]\n    """\n'
            )
            rows.append(
                {
                    "task_id": f"HumanEval/{i * 13}",
                    "prompt": prompt,
                    "canonical_solution": "    return [v for v in values if v != k]\n",
                    "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n"
                    f"    assert candidate([1, 2, 3], {i}) == [1, 2, 3]\n",
                    "entry_point": name,
                }
            )
    rows[1]["prompt"] = rows[1]["prompt"].rstrip("\n")  # a prompt without a final newline
    table = _table(rows, SCHEMAS["openai/openai_humaneval"])
    return {entry["path"]: _parquet(table)}


MBPP_TASKS = [
    ("find the shared elements from the given two lists", "similar_elements", "((3, 4, 5, 6), (5, 7, 4, 10))", "(4, 5)"),
    ("identify non-prime numbers", "is_not_prime", "(2,)", "False"),
    ("find the n largest integers from a given list of numbers, returned in descending order", "heap_queue_largest", "([25, 35, 22, 85, 14, 65, 75, 22, 58], 3)", "[85, 75, 65]"),
    ("check whether the two numbers differ at one bit position only", "differ_at_one_bit_pos", "(13, 9)", "True"),
    ("find all words which are at least 4 characters long in a string", "find_char_long", "('Please move back to stream',)", "['Please', 'move', 'back', 'stream']"),
    ("find squares of individual elements in a list", "square_nums", "([1, 2, 3],)", "[1, 4, 9]"),
    ("find the minimum number of rotations required to get the same string", "find_rotations", "('aaaa',)", "1"),
    ("remove first and last occurrence of a given character from the string", "remove_occ", "('hello', 'l')", "'heo'"),
    ("sort a given matrix in ascending order according to the sum of its rows", "sort_matrix", "([[1, 2, 3], [2, 4, 5], [1, 1, 1]],)", "[[1, 1, 1], [1, 2, 3], [2, 4, 5]]"),
    ("find the volume of a triangular prism", "find_volume", "(10, 8, 6)", "240"),
    ("check if a string contains lowercase letters joined with an underscore", "text_lowercase_underscore", "('aab_cbbbc',)", "True"),
    ("return the perimeter of a square given its side length as input", "square_perimeter", "(10,)", "40"),
]  # fmt: skip


def gen_mbpp(g: Gen) -> dict[str, bytes]:
    (entry,) = g.files("google-research-datasets/mbpp")
    rng = _rng("mbpp")
    rows = []
    task_id = 2
    for desc, name, args, result in MBPP_TASKS:
        task_id += rng.randint(1, 9)
        tests = [
            f"assert {name}{args} == {result}",
            f"assert {name}{args} is not None",
            f"assert str({name}{args}) == str({result})",
        ]
        imports = ["import math"] if rng.random() < 0.25 else []
        rows.append(
            {
                "source_file": "Benchmark Questions Verification V2.ipynb",
                "task_id": task_id,
                "prompt": f"Write a python function to {desc}.",
                "code": f"def {name}(*args):\n    return {result}\n",
                "test_imports": imports,
                "test_list": tests,
            }
        )
    table = _table(rows, SCHEMAS["google-research-datasets/mbpp"])
    return {entry["path"]: _parquet(table)}


# --------------------------------------------------------------------------- MiMo

WEB_KINDS = [
    "portfolio",
    "landing page",
    "restaurant",
    "weather dashboard",
    "photography gallery",
    "online bookstore",
    "fitness tracker",
    "conference",
]
WEB_REQS = [
    "Use a responsive layout that works on phones and desktops.",
    "Add a sticky navigation bar with smooth scrolling to each section.",
    "Include a dark mode toggle that remembers the choice in localStorage.",
    "Animate the hero section with CSS keyframes.",
    "Add a contact form with client-side validation and friendly error messages.",
    "Render a sortable table of sample data with JavaScript.",
    "Use only HTML, CSS and vanilla JavaScript in a single file, with no external libraries.",
    "Show an interactive chart drawn on a canvas element.",
]
MUSIC_STYLES_ZH = ["流行", "民謠", "搖滾", "古風", "爵士", "兒歌"]
MUSIC_STYLES_EN = ["pop", "folk", "rock", "ballad", "jazz", "lullaby"]


def _webdev_prompt(g: Gen, rng: random.Random, lo: int, hi: int) -> str:
    for _ in range(100):
        kind = rng.choice(WEB_KINDS)
        text = f"Create a complete, self-contained {kind} website. Requirements:\n"
        reqs = rng.sample(WEB_REQS, rng.randint(2, 6))
        text += "\n".join(f"{i + 1}. {r}" for i, r in enumerate(reqs))
        target = rng.randint(lo, hi)
        while g.tokens(text) < target:
            text += "\n\n" + g.text("en", rng, min(200, target // 3 + 1), hi=200)
        if lo <= g.tokens(text) <= hi:
            return text
    raise AssertionError(f"no webdev prompt of {lo}..{hi} tokens")


def gen_mimo(g: Gen) -> dict[str, bytes]:
    entries = {Path(e["path"]).name: e for e in g.files("XiaomiMiMo/MiMo-V2.6-RL-oss")}
    web, music = entries["webdev.parquet"], entries["music.parquet"]
    rng = _rng("mimo")

    def webrow(prompt):
        inst = {
            "instance_id": f"webdev_{_hex(rng, 12)}",
            "category": rng.choice(WEB_KINDS),
            "checklist": rng.sample(WEB_REQS, 2),
        }
        return {
            "data_source": "blackbox/webdev",
            "prompt": [{"role": "user", "content": prompt}],
            "ability": "webdev",
            "reward_model": {"ground_truth": "", "style": "model"},
            "extra_info": {"index": 0, "instance_json": json.dumps(inst, ensure_ascii=False)},
            "agent_name": "tool_agent",
        }

    valid = [[webrow(_webdev_prompt(g, rng, 40, 560))] for _ in range(16)]
    decoys = [[webrow(_webdev_prompt(g, rng, 820, 2_400))] for _ in range(6)]
    web_rows = _place(_weave(valid, decoys, rng), web["repo"], web["revision"])
    for i, r in enumerate(web_rows):
        r["extra_info"]["index"] = i

    def musicrow(lang, k):
        meter = rng.choice(["4/4", "3/4", "6/8", "2/4"])
        bpm, bars = rng.randint(60, 160), rng.choice([16, 24, 32, 48])
        if lang == "zh":
            style = rng.choice(MUSIC_STYLES_ZH)
            theme = _zh_sentence(rng)
            prompt = (
                f"請根據以下描述創作一首{style}風格的歌曲，用ABC記譜法寫出完整的樂譜，"
                f"包含X、T、M、L、Q、K等頭部字段。\n主題：{theme}\n拍號：{meter}\n"
                f"速度：{bpm} BPM\n長度：{bars}小節"
            )
            tag = f"{style}, 抒情"
        else:
            style = rng.choice(MUSIC_STYLES_EN)
            theme = _en_sentence(rng, 6, 16)
            prompt = (
                f"Compose a {style} song in ABC notation from the following brief, with the X, T, "
                f"M, L, Q and K header fields.\nBrief: {theme}\nMeter: {meter}\nTempo: {bpm} BPM\n"
                f"Length: {bars} bars"
            )
            tag = f"{style}, lyrical"
        assert g.tokens(prompt) <= 650
        return {
            "data_source": "music",
            "prompt": [{"role": "user", "content": prompt}],
            "ability": "music",
            "reward_model": {
                "ground_truth": json.dumps({"meter": meter, "bpm": bpm}),
                "style": "rule",
            },
            "extra_info": {
                "src_id": f"m{_hex(rng, 10)}",
                "lang": lang,
                "length": bars,
                "meter": meter,
                "bpm": bpm,
                "tag": tag,
                "index": k,
            },
            "agent_name": "single_turn_agent",
        }

    units = [[musicrow(lang, 0)] for lang in ["en", "zh"] * 8]
    rng.shuffle(units)
    music_rows = _place(units, music["repo"], music["revision"], first=len(web_rows))
    for i, r in enumerate(music_rows):
        r["extra_info"]["index"] = i
    return {
        web["path"]: _parquet(_table(web_rows, schema_for(web["repo"], web["path"]))),
        music["path"]: _parquet(_table(music_rows, schema_for(music["repo"], music["path"]))),
    }


# --------------------------------------------------------------------------- LongWriter

LW_EN = [
    "Write a {n}-word short story about {t}.",
    "Write a {n}-word essay on {t}, with an introduction, several sections and a conclusion.",
    "Write a detailed travel guide of about {n} words about {t}.",
    "Write a {n}-word report analysing {t}.",
]
LW_ZH = [
    "寫一篇{n}字的小說，主題是{t}。",
    "請以「{t}」為題，寫一篇{n}字左右的議論文。",
    "寫一份{n}字的研究報告，分析{t}。",
    "請寫一篇關於{t}的散文，不少於{n}字。",
]
LW_TOPICS_EN = ["a lighthouse keeper", "urban gardening", "the history of tea", "a lost letter"]
LW_TOPICS_ZH = ["城市裏的夜晚", "人工智能與教育", "故鄉的河", "一封遲到的信"]


def gen_longwriter(g: Gen) -> dict[str, bytes]:
    (entry,) = g.files("zai-org/LongWriter-6k")
    rng = _rng("longwriter")

    def row(lang, lo, hi, text=None):
        for _ in range(100):
            if text is None:
                n = rng.choice([2000, 5000, 10000, 20000])
                if lang == "en":
                    t = rng.choice(LW_TOPICS_EN)
                    user = rng.choice(LW_EN).format(n=n, t=t)
                else:
                    t = rng.choice(LW_TOPICS_ZH)
                    user = rng.choice(LW_ZH).format(n=n, t=t)
                target = rng.randint(lo, hi)
                while g.tokens(user) < target:
                    material = g.text(lang, rng, min(300, target), hi=300)
                    user += "\n\nReference material:\n" if lang == "en" else "\n\n參考資料：\n"
                    user += material
            else:
                user = text
            if lo <= g.tokens(user) <= hi:
                break
            text = None
        else:
            raise AssertionError("no LongWriter prompt of the wanted size")
        reply = g.text(lang, rng, rng.randint(600, 2_000), hi=400)
        return {
            "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        }

    valid, decoys = [], []
    for _ in range(11):
        valid.append([row("en", 10, 600)])
        valid.append([row("zh", 10, 600)])
    # Mixed scripts: under 10% CJK ideographs is English, 10% or more is Chinese.
    valid.append(
        [
            row(
                "en",
                1,
                750,
                "Write a 5000-word essay about the Chinese idiom 塞翁失馬 and what it can teach "
                "modern business leaders about risk, luck and long-term planning.",
            )
        ]
    )
    valid.append(
        [
            row(
                "zh",
                1,
                750,
                "Please write a 10000-word story in Chinese about a programmer. 主題是程序員的"
                "一天，要求情節完整。",
            )
        ]
    )
    for lang in ("en", "zh"):
        for _ in range(2):
            decoys.append([row(lang, 800, 1_400)])
    units = _weave(valid, decoys, rng)
    rows = _place(units, entry["repo"], entry["revision"])
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    return {entry["path"]: data.encode("utf-8")}


# --------------------------------------------------------------------------- Gutenberg

BOOK_META = {
    "145": ("Middlemarch", "George Eliot", "MIDDLEMARCH"),
    "1228": (
        "On the Origin of Species",
        "Charles Darwin",
        "ON THE ORIGIN OF SPECIES",
    ),
    "1023": ("Bleak House", "Charles Dickens", "BLEAK HOUSE"),
    "3300": ("The Wealth of Nations", "Adam Smith", "THE WEALTH OF NATIONS"),
    "23863": ("Shui Hu Zhuan", "Nai an Shi", "SHUI HU ZHUAN"),
    "23950": ("Romance of the Three Kingdoms", "Guanzhong Luo", "ROMANCE OF THE THREE KINGDOMS"),
    "23962": ("Journey to the West", "Cheng'en Wu", "JOURNEY TO THE WEST"),
    "24264": ("Hong Lou Meng", "Xueqin Cao", "HONG LOU MENG"),
}

PG_LICENSE = """*** START: FULL LICENSE ***

THE FULL PROJECT GUTENBERG LICENSE
PLEASE READ THIS BEFORE YOU DISTRIBUTE OR USE THIS WORK

To protect the Project Gutenberg-tm mission of promoting the free
distribution of electronic works, by using or distributing this work
(or any other work associated in any way with the phrase "Project
Gutenberg"), you agree to comply with all the terms of the Full Project
Gutenberg-tm License available with this file or online at
www.gutenberg.org/license.

Section 1. General Terms of Use and Redistributing Project Gutenberg-tm
electronic works

1.A. By reading or using any part of this Project Gutenberg-tm
electronic work, you indicate that you have read, understand, agree to
and accept all the terms of this license and intellectual property
(trademark/copyright) agreement. If you do not agree to abide by all
the terms of this agreement, you must cease using and return or destroy
all copies of Project Gutenberg-tm electronic works in your possession.

Section 5. General Information About Project Gutenberg-tm electronic works.

Most people start at our Web site which has the main PG search facility:

     www.gutenberg.org

This Web site includes information about Project Gutenberg-tm,
including how to make donations to the Project Gutenberg Literary
Archive Foundation, how to help produce our new eBooks, and how to
subscribe to our email newsletter to hear about new eBooks.
"""

# Per ebook: (start marker or None, legacy end line or None, end marker or None, CRLF)
BOOK_QUIRKS = {
    "145": (
        "*** START OF THE PROJECT GUTENBERG EBOOK {T} ***",
        None,
        "*** END OF THE PROJECT GUTENBERG EBOOK {T} ***",
        False,
    ),
    "1228": (
        "*** START OF THIS PROJECT GUTENBERG EBOOK {T} ***",
        "End of the Project Gutenberg EBook of {t}, by {a}",
        "*** END OF THIS PROJECT GUTENBERG EBOOK {T} ***",
        True,
    ),
    "1023": (
        "*** START OF THE PROJECT GUTENBERG EBOOK BLEAK\nHOUSE ***",
        None,
        "*** END OF THE PROJECT GUTENBERG EBOOK {T} ***",
        False,
    ),
    "3300": (None, None, None, False),
    "23863": (
        "*** START OF THIS PROJECT GUTENBERG E-BOOK {T} ***",
        "End of the Project Gutenberg EBook of {t}, by {a}",
        None,
        False,
    ),
    "23950": (
        "*** start of the project gutenberg ebook {t_lower} ***",
        "End of Project Gutenberg's {t}, by {a}",
        None,
        False,
    ),
    "23962": (
        "*** START OF THE PROJECT GUTENBERG E-BOOK {T} ***",
        None,
        "*** END OF THE PROJECT GUTENBERG E-BOOK {T} ***",
        False,
    ),
    "24264": (
        "*** START OF THIS PROJECT\nGUTENBERG EBOOK {T} ***",
        None,
        "*** END OF THIS PROJECT GUTENBERG EBOOK {T} ***",
        False,
    ),
}

_ROMAN = [(100, "C"), (90, "XC"), (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V")]
_ROMAN += [(4, "IV"), (1, "I")]
_ZH_DIGITS = "零一二三四五六七八九"


def _roman(n: int) -> str:
    out = ""
    for v, sym in _ROMAN:
        while n >= v:
            out += sym
            n -= v
    return out


def _zh_number(n: int) -> str:
    if n < 10:
        return _ZH_DIGITS[n]
    if n < 20:
        return "十" + (_ZH_DIGITS[n - 10] if n % 10 else "")
    if n < 100:
        tens, ones = divmod(n, 10)
        return _ZH_DIGITS[tens] + "十" + (_ZH_DIGITS[ones] if ones else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        head = _ZH_DIGITS[hundreds] + "百"
        if rest == 0:
            return head
        if rest < 10:
            return head + "零" + _ZH_DIGITS[rest]
        return head + ("一" + _zh_number(rest) if rest < 20 else _zh_number(rest))
    return str(n)


def _book_body(
    g: Gen, rng: random.Random, lang: str, title: str, author: str, target: int
) -> tuple[str, int]:
    """A book body of about target tokens (prompt tokens of its whole view minus INSTR)."""
    pool = g.pool(lang)
    segs = []
    if lang == "en":
        segs.append(f"{title.upper()}\n\n")
        segs.append(f"by {author}\n\n\n\n")
    else:
        segs.append(f"{title}\n\n\n")
    chapter = 0
    est = 0
    since = 99
    while est < target:
        if since >= rng.randint(18, 40):
            chapter += 1
            since = 0
            if lang == "en":
                if chapter == 6:
                    segs.append("End of the First Book.\n\n\n")  # not a Gutenberg end line
                segs.append(f"CHAPTER {_roman(chapter)}.\n\n")
            else:
                name = "".join(rng.choice(ZH_CHARS) for _ in range(7))
                segs.append(f"第{_zh_number(chapter)}回\u3000{name}\n\n")
        text, _ = pool.pick(rng, 0, 260)
        if "\n" not in text:
            text = _wrap_en(text) if lang == "en" else _wrap_zh(text)
        if lang == "zh":
            text = "\u3000\u3000" + text
        r = rng.random()
        if r < 0.04:
            sep = "\n    \n"  # a line of spaces: not a paragraph end
        elif r < 0.08:
            sep = "\n\n\n"
        elif r < 0.10:
            sep = "   \n\n  \n"
        else:
            sep = "\n\n"
        segs.append(text + sep)
        est += g.tokens(text + sep)
        since += 1
    body = "".join(segs).rstrip() + "\n"
    return body, est


def _book_text(g: Gen, book: dict, target: int) -> str:
    ebook = book["ebook"]
    rng = _rng(f"gutenberg/{ebook}")
    meta = BOOK_META.get(ebook)
    m = re.search(r"《(.+?)》", book["title"])
    local_title = m.group(1) if m else book["title"].split(",")[-1].strip()
    if meta is None:
        meta = (local_title, book["title"].split(",")[0], local_title.upper())
    t, a, T = meta
    start, legacy, end, crlf = BOOK_QUIRKS.get(ebook, (None, None, None, False))
    fmt = {"t": t, "a": a, "T": T, "t_lower": t.lower()}
    body, _ = _book_body(g, rng, book["lang"], local_title, a, target)
    out = ""
    if start:
        lang_name = "English" if book["lang"] == "en" else "Chinese"
        out += (
            f"The Project Gutenberg EBook of {t}, by {a}\n\n"
            "This eBook is for the use of anyone anywhere at no cost and with\n"
            "almost no restrictions whatsoever.  You may copy it, give it away or\n"
            "re-use it under the terms of the Project Gutenberg License included\n"
            "with this eBook or online at www.gutenberg.org\n\n\n"
            f"Title: {t}\n\nAuthor: {a}\n\nRelease Date: {rng.choice(['May', 'June'])} 2008 "
            f"[EBook #{ebook}]\n\nLanguage: {lang_name}\n\nCharacter set encoding: UTF-8\n\n"
        )
        out += start.format(**fmt) + "\n\n\n\n"
        if rng.random() < 0.6:
            out += "Produced by Distributed Proofreaders\n\n  \n\n\n"
    out += body
    if legacy or end:
        out += "\n\n\n   \n\n"
        if legacy:
            out += legacy.format(**fmt) + "\n\n"
        if end:
            out += end.format(**fmt) + "\n\n" + PG_LICENSE
    else:
        out += "\n\n\n"
    if crlf:
        out = out.replace("\n", "\r\n")
    return out


def gen_books(g: Gen, books_dir=None) -> dict[str, bytes]:
    """The eight books: copies of the real files when books_dir holds them, else synthetic."""
    if books_dir is not None:
        paths = [Path(books_dir) / b["path"] for b in g.books]
        if all(p.is_file() for p in paths):
            return {f"{b['repo']}/{b['path']}": p.read_bytes() for b, p in zip(g.books, paths)}
    out = {}
    first = {}
    for b in sorted(g.books, key=lambda b: _sha(f"{b['repo']}@{b['commit']}")):
        first.setdefault(b["lang"], b["ebook"])
    for b in g.books:
        # The first book of each language in candidate order fills the full slot.
        target = 338_000 if first[b["lang"]] == b["ebook"] else 114_000
        out[f"{b['repo']}/{b['path']}"] = _book_text(g, b, target).encode("utf-8")
    return out


# --------------------------------------------------------------------------- make_sources

GENERATORS = {
    "caskcsg/LongBench-Pro": gen_longbench,
    "openai/mrcr": gen_mrcr,
    "SWE-bench/SWE-smith-trajectories": gen_swe,
    "nvidia/Nemotron-Agentic-v1": gen_nemotron,
    "allenai/WildChat-4.8M": gen_wildchat,
    "openai/gsm8k": gen_gsm8k,
    "AI-MO/NuminaMath-1.5": gen_numinamath,
    "openai/openai_humaneval": gen_humaneval,
    "google-research-datasets/mbpp": gen_mbpp,
    "XiaomiMiMo/MiMo-V2.6-RL-oss": gen_mimo,
    "zai-org/LongWriter-6k": gen_longwriter,
}


def make_sources(src, tokenizer_path, books_dir=None, realdata=None, rev=None, books=None) -> None:
    """Write miniature copies of every file pinned in REV (datasets) and BOOKS under src."""
    src = Path(src)
    g = Gen(tokenizer_path, realdata=realdata, rev=rev, books=books)
    files: dict[str, bytes] = {}
    repos = list(dict.fromkeys(e["repo"] for e in g.rev if e["kind"] == "dataset"))
    for repo in repos:
        if repo not in GENERATORS:
            raise KeyError(f"no generator for {repo}")
        made = GENERATORS[repo](g)
        want = {e["path"] for e in g.files(repo)}
        if set(made) != want:
            raise AssertionError(f"{repo}: generated {sorted(made)}, pinned {sorted(want)}")
        for path, data in made.items():
            files[f"{repo}/{path}"] = data
    files.update(gen_books(g, books_dir))
    for rel, data in files.items():
        target = src / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


# --------------------------------------------------------------------------- census


def _slot_fill(cands, slots, unique=True):
    """cands: (sha, key, tokens_per_slot: list[int|None]) in any order, None meaning the filter
    fails; slots: dicts with count, lo, hi, longest. Returns per slot (fitting, filled) and the
    scan's counts: candidates looked at, and skipped for uniqueness, filter or range."""
    cands = sorted(cands, key=lambda c: c[0])
    used = set()
    filled = [0] * len(slots)
    fitting = [0] * len(slots)
    stats = {"looked": 0, "unique": 0, "filter": 0, "range": 0}
    for j, s in enumerate(slots):
        for c in cands:
            n = c[2][j]
            if n is not None and s["lo"] <= n <= s["hi"]:
                fitting[j] += 1
    for j, s in enumerate(slots):
        if not s.get("longest"):
            continue
        ok = [c for c in cands if c[2][j] is not None and s["lo"] <= c[2][j] <= s["hi"]]
        for c in sorted(ok, key=lambda c: (-c[2][j], c[0])):
            if filled[j] == s["count"]:
                break
            if unique and c[1] in used:
                stats["unique"] += 1
                continue
            used.add(c[1])
            filled[j] += 1
    for c in cands:
        if all(filled[j] == s["count"] for j, s in enumerate(slots)):
            break
        stats["looked"] += 1
        if unique and c[1] in used:
            stats["unique"] += 1
            continue
        open_slots = [
            j for j, s in enumerate(slots) if not s.get("longest") and filled[j] < s["count"]
        ]
        for j in open_slots:
            n = c[2][j]
            if n is not None and slots[j]["lo"] <= n <= slots[j]["hi"]:
                filled[j] += 1
                used.add(c[1])
                break
        else:
            if all(c[2][j] is None for j in open_slots):
                stats["filter"] += 1
            else:
                stats["range"] += 1
    return list(zip(fitting, filled)), stats


def _slot(name, count, lo, hi, longest=False):
    return {"name": name, "count": count, "lo": lo, "hi": hi, "longest": longest}


def _msg_tokens(tok: Tokens, msgs) -> int:
    texts = []
    for m in msgs:
        c = m.get("content")
        if isinstance(c, str):
            texts.append(c)
        elif c is not None:
            texts.append(_compact(c))
    return sum(tok.uncached(texts)) if texts else 0


def _cut(tok: Tokens, msgs, limit: int):
    counts = tok.uncached([m["content"] for m in msgs])
    best, total = None, 0
    for k, m in enumerate(msgs):
        if k >= 2 and m["role"] == "assistant":
            if total <= limit:
                best = total
            else:
                break
        total += counts[k]
    return best


def _before_last(msgs):
    k = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    return msgs[:k]


def _book_views(tok: Tokens, raw: bytes, lang: str, limits):
    text = raw.decode("utf-8").replace("\r\n", "\n")
    m = re.search(
        r"\*\*\*\s*START\s+OF\s+(?:THE|THIS)\s+PROJECT\s+GUTENBERG\s+E-?BOOK\b[^*]*\*\*\*",
        text,
        re.I,
    )
    start = 0
    if m:
        eol = text.find("\n", m.end())
        start = len(text) if eol < 0 else eol + 1
    while start < len(text) and text[start].isspace():
        start += 1
    ends = [len(text)]
    for pat in (
        r"^\*\*\*\s*END\s+OF\s+(?:THE|THIS)\s+PROJECT\s+GUTENBERG",
        r"^End of (?:the Project Gutenberg|Project Gutenberg's)",
    ):
        e = re.compile(pat, re.I | re.M).search(text, start)
        if e:
            ends.append(e.start())
    end = min(ends)
    while end > start and text[end - 1].isspace():
        end -= 1
    stops = [p for p in range(start + 1, end) if text[p : p + 2] == "\n\n" and text[p - 1] != "\n"]
    stops.append(end)
    segs = [INSTR[lang] + "\n\n" + text[start : stops[0]]]
    segs += [text[a:b] for a, b in zip(stops, stops[1:])]
    cum, total = [], 0
    for n in tok.uncached(segs):
        total += n
        cum.append(total)
    out = []
    for limit in limits:
        i = bisect.bisect_right(cum, limit)
        out.append(cum[i - 1] if i else None)
    return out, cum[-1]


def census(src, tokenizer_path, rev=None, books=None, only=None) -> dict:
    """For each source: rows, prompt-token range of its views, and per slot (split, name, count,
    fitting candidates, filled) when candidates are taken in ascending sha256 order as in
    DESIGN 4.2. Book views sum per-paragraph counts (exact for the byte tokenizer). ``only``
    limits it to some source names."""
    src = Path(src)
    tok = Tokens(tokenizer_path)
    rev_entries = read_rev(rev)
    out = {}

    def want(name):
        return only is None or name in only

    def files(repo):
        return [e for e in rev_entries if e["repo"] == repo and e["kind"] == "dataset"]

    def rows_of(repo, columns=None):
        n = 0
        for e in files(repo):
            path = src / repo / e["path"]
            if path.suffix == ".parquet":
                for r in pq.read_table(path, columns=columns).to_pylist():
                    yield n, e, r
                    n += 1
            elif path.suffix == ".jsonl":
                for line in path.read_text(encoding="utf-8").splitlines():
                    yield n, e, json.loads(line)
                    n += 1
            else:
                for r in json.loads(path.read_text(encoding="utf-8")):
                    yield n, e, r
                    n += 1

    def cid(e, n):
        return _sha(f"{e['repo']}@{e['revision']}#{n}")

    def report(name, slots, cands, tokens, unique=True):
        res, stats = _slot_fill(cands, slots, unique)
        out[name] = {
            "scan": stats,
            "rows": len(cands),
            "tokens": (min(tokens), max(tokens)) if tokens else (0, 0),
            "slots": [(s["name"], s["count"], fit, filled) for s, (fit, filled) in zip(slots, res)],
        }

    # LongBench-Pro
    if want("longbench-pro"):
        slots, keys = [], []
        for (bucket, lang), need in LB_NEED.items():
            split = "full" if bucket == "256k" else "standard"
            hi = MILLION if split == "full" else 180_000
            slots.append(_slot(f"{split} {bucket} {lang}", need, 1, hi))
            keys.append((bucket, lang))
        order = sorted(range(len(slots)), key=lambda j: slots[j]["name"].split()[0] != "full")
        slots = [slots[j] for j in order]
        keys = [keys[j] for j in order]
        cands, toks = [], []
        repo = "caskcsg/LongBench-Pro"
        for n, e, r in rows_of(repo):
            t = tok.uncached([r["context"] + "\n\n\n\n" + r["question_thinking"]])[0]
            toks.append(t)
            per = [t if (r["token_length"], r["language"]) == k else None for k in keys]
            cands.append((cid(e, n), r["context"], per))
        report("longbench-pro", slots, cands, toks)

    # MRCR
    if want("mrcr"):
        slots = [_slot(f"full {lo}-{hi}", 1, lo, hi) for lo, hi in MRCR_FULL]
        slots += [_slot(f"standard {lo}-{hi}", 1, lo, hi) for lo, hi in MRCR_STANDARD]
        cands, toks = [], []
        for n, e, r in rows_of("openai/mrcr", ["prompt"]):
            t = _msg_tokens(tok, json.loads(r["prompt"]))
            toks.append(t)
            cands.append((cid(e, n), n, [t] * len(slots)))
        report("mrcr", slots, cands, toks)

    # SWE-smith
    if want("swe-smith"):
        slots = [_slot("full longest", 4, 1, MILLION, longest=True)]
        for limit in (131_072, 65_536, 32_768, 16_384):
            slots.append(_slot(f"standard cut({limit})", 3, limit * 3 // 4, limit))
        cands, toks = [], []
        for n, e, r in rows_of("SWE-bench/SWE-smith-trajectories", ["messages", "traj_id"]):
            msgs = json.loads(r["messages"])
            if isinstance(msgs, str):
                msgs = json.loads(msgs)
            whole = _msg_tokens(tok, _before_last(msgs))
            toks.append(whole)
            per = [whole] + [_cut(tok, msgs, lim) for lim in (131_072, 65_536, 32_768, 16_384)]
            cands.append((cid(e, n), r["traj_id"], per))
        report("swe-smith", slots, cands, toks)

    # Nemotron
    if want("nemotron-agentic"):
        slots = [_slot("standard ends tool", 3, 3_000, 12_000)]
        slots.append(_slot("standard ends user", 3, 3_000, 12_000))
        cands, toks = [], []
        for n, e, r in rows_of("nvidia/Nemotron-Agentic-v1"):
            view = _before_last(r["messages"])
            t = _msg_tokens(tok, view)
            toks.append(t)
            last = view[-1]["role"]
            cands.append(
                (cid(e, n), n, [t if last == "tool" else None, t if last == "user" else None])
            )
        report("nemotron-agentic", slots, cands, toks)

    # WildChat
    if want("wildchat"):
        langs = [("English", 6), ("Chinese", 9), ("Russian", 1), ("Japanese", 1)]
        slots = [_slot(f"standard {lang}", c, 64, 4_096) for lang, c in langs]
        cands, toks = [], []
        cols = ["conversation", "turn", "language", "toxic", "redacted"]
        for n, e, r in rows_of("allenai/WildChat-4.8M", cols):
            msgs = [{"role": m["role"], "content": m["content"]} for m in r["conversation"]]
            t = _msg_tokens(tok, _before_last(msgs))
            toks.append(t)
            ok = not r["toxic"] and not r["redacted"] and r["turn"] >= 2
            per = [t if ok and r["language"] == lang else None for lang, _ in langs]
            cands.append((cid(e, n), msgs[0]["content"], per))
        report("wildchat", slots, cands, toks)

    # GSM8K, HumanEval, MBPP: one user message each
    for name, repo, count, view in (
        ("gsm8k", "openai/gsm8k", 4, lambda r: r["question"]),
        (
            "humaneval",
            "openai/openai_humaneval",
            3,
            lambda r: (
                "Complete the following Python function.\n\n```python\n"
                + r["prompt"]
                + ("" if r["prompt"].endswith("\n") else "\n")
                + "```"
            ),
        ),
        (
            "mbpp",
            "google-research-datasets/mbpp",
            3,
            lambda r: (
                "You are an expert Python programmer, and here is your task: "
                + r["prompt"]
                + " Your code should pass these tests:\n\n"
                + "\n".join(r["test_list"])
            ),
        ),
    ):
        if not want(name):
            continue
        cands, toks = [], []
        for n, e, r in rows_of(repo):
            t = tok.uncached([view(r)])[0]
            toks.append(t)
            cands.append((cid(e, n), n, [t]))
        report(name, [_slot("standard", count, 1, 180_000)], cands, toks)

    # NuminaMath
    if want("numinamath"):
        slots = [_slot("full", 4, 32, 200), _slot("standard", 4, 32, 200)]
        cands, toks = [], []
        for n, e, r in rows_of("AI-MO/NuminaMath-1.5", ["problem", "source", "synthetic"]):
            t = tok.uncached([r["problem"]])[0]
            toks.append(t)
            ok = r["source"] == "olympiads" and not r["synthetic"]
            cands.append((cid(e, n), n, [t if ok else None] * 2))
        report("numinamath", slots, cands, toks)

    # MiMo
    if want("mimo"):
        groups = [
            ("full webdev", 3, ("webdev", None)),
            ("full music en", 2, ("music", "en")),
            ("full music zh", 1, ("music", "zh")),
            ("standard webdev", 4, ("webdev", None)),
            ("standard music zh", 2, ("music", "zh")),
            ("standard music en", 1, ("music", "en")),
        ]
        slots = [_slot(name, c, 1, 700) for name, c, _ in groups]
        cands, toks = [], []
        for n, e, r in rows_of("XiaomiMiMo/MiMo-V2.6-RL-oss"):
            t = _msg_tokens(tok, r["prompt"])
            toks.append(t)
            kind = "webdev" if e["path"].startswith("webdev") else "music"
            lang = (r["extra_info"] or {}).get("lang") if kind == "music" else None
            per = [t if (kind, lang) == k else None for _, _, k in groups]
            cands.append((cid(e, n), n, per))
        report("mimo", slots, cands, toks)

    # LongWriter
    if want("longwriter"):
        groups = [("full en", 3, "en"), ("full zh", 3, "zh"), ("standard en", 2, "en")]
        groups.append(("standard zh", 2, "zh"))
        slots = [_slot(name, c, 1, 750) for name, c, _ in groups]
        cands, toks = [], []
        for n, e, r in rows_of("zai-org/LongWriter-6k"):
            user = r["messages"][0]["content"]
            t = tok.uncached([user])[0]
            toks.append(t)
            cjk = sum(1 for ch in user if "\u3400" <= ch <= "\u4dbf" or "\u4e00" <= ch <= "\u9fff")
            lang = "zh" if user and cjk / len(user) >= 0.1 else "en"
            cands.append((cid(e, n), n, [t if lang == k else None for _, _, k in groups]))
        report("longwriter", slots, cands, toks)

    # Gutenberg
    if want("gutenberg"):
        limits = [393_216, 2_048, 16_384, 131_072]
        slots = [_slot("full en", 1, 294_912, 393_216), _slot("full zh", 1, 294_912, 393_216)]
        for lang in ("en", "zh"):
            for limit in limits[1:]:
                slots.append(_slot(f"standard {lang} {limit}", 1, limit * 3 // 4, limit))
        cands, toks = [], []
        for b in read_books(books):
            raw = (src / b["repo"] / b["path"]).read_bytes()
            views, whole = _book_views(tok, raw, b["lang"], limits)
            toks.append(whole)
            per = []
            for s in slots:
                lang = s["name"].split()[1]
                limit = s["hi"]
                per.append(views[limits.index(limit)] if lang == b["lang"] else None)
            cands.append((_sha(f"{b['repo']}@{b['commit']}"), b["ebook"], per))
        report("gutenberg", slots, cands, toks)
    return out


def format_census(result: dict) -> str:
    lines = []
    for name, info in result.items():
        lo, hi = info["tokens"]
        lines.append(f"{name}: {info['rows']} candidates, view tokens {lo:,} .. {hi:,}")
        st = info["scan"]
        lines.append(
            f"    scan looked at {st['looked']}, skipped {st['filter']} by filter, "
            f"{st['range']} by range, {st['unique']} as used"
        )
        for slot, count, fit, filled in info["slots"]:
            flag = "" if filled == count else "  <-- SHORT"
            lines.append(f"    {slot:<28} need {count:>2}  fitting {fit:>3}  filled {filled}{flag}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dest", type=Path)
    ap.add_argument("--tokenizer", type=Path, help="tokenizer.json to size the sources with")
    ap.add_argument("--realdata", type=Path, help="directory of real texts (books, GSM8K, ...)")
    ap.add_argument(
        "--synthetic-books",
        action="store_true",
        help="generate the books even when --realdata holds the real ones",
    )
    ap.add_argument("--census", action="store_true", help="print how every slot fills")
    args = ap.parse_args(argv)
    dest: Path = args.dest
    dest.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tokenizer = args.tokenizer or make_tokenizer(dest / "tokenizer.json")
    books_dir = None
    if args.realdata and not args.synthetic_books:
        books_dir = args.realdata / "books"
    make_sources(dest / "src", tokenizer, books_dir=books_dir, realdata=args.realdata)
    write_pins(dest / "src", dest / "REV", dest / "BOOKS", tokenizer_path=tokenizer)
    print(f"wrote {dest / 'src'} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if args.census:
        print(
            format_census(census(dest / "src", tokenizer, rev=dest / "REV", books=dest / "BOOKS"))
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
