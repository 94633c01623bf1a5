#!/usr/bin/env python3
"""The twelve kern-prompts sources in their real formats, generated at two scales.

Every source is declared once, in its section below: its files in pin order with their kind, Arrow
schema (parquet) or record layout (JSON), JSON layers, fields whose kind varies, and real row counts
(``FORMATS``), next to the one row builder that writes its records. Two plans drive each builder:

- the miniature (``scale="mini"``, the tests): a few dozen rows per source sized under a given
  tokenizer so that every slot of the README's slot table fills with candidates to spare, with
  decoys that must not be chosen (toxic and redacted chats, synthetic problems, contexts and first
  messages seen twice, rows just outside a range) placed early in candidate order;
- the full size (``scale="full"``, bench/bench.py): the real row counts and sizes within 10% of the
  pinned ones, built from real text recombined (the books, GSM8K and HumanEval of
  ``--realdata``), sized by an estimate of the tokens instead of the tokenizer.

API: ``make_tokenizer(path)`` (a tokenizer.json with Qwen's normalizer and pre-tokenizer whose
token count is the UTF-8 length of the NFC text); ``make_sources(src, tokenizer, ...)``;
``write_pins(src, rev_out, books_out, tokenizer_path=None)`` (REV and BOOKS for that tree);
``check_file(file, path)`` (how a written file departs from its declaration); ``census(src,
tokenizer)`` (per slot, how many candidates fit and whether the slots fill in the build's order).

``python tests/make_sources.py DEST [--tokenizer PATH] [--realdata DIR] [--census] [--full]``
writes DEST/src, DEST/REV, DEST/BOOKS (and DEST/tokenizer.json when no tokenizer is given).
Everything is deterministic: the same arguments give the same bytes.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import hashlib
import json
import math
import random
import re
import shutil
import sys
import time
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from itertools import islice
from pathlib import Path
from types import MappingProxyType

import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

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
    """Exact prompt-token counts under one tokenizer (the README's definition), cached per text.
    Under the byte-level test tokenizer a count is the UTF-8 length of the NFC text, which is
    checked on a sample and then used instead of encoding."""

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


# ASCII bytes that are neither letters, digits nor spaces: each is about a token of its own.
_NOT_PUNCT = bytes(range(ord("0"), ord("9") + 1)) + bytes(range(65, 91)) + bytes(range(97, 123))
_NOT_PUNCT += b" " + bytes(range(128, 256))


class Estimate:
    """Token counts estimated from the characters, for the full size (gigabytes of text, too many
    to count): about 4.8 letters a token, a token a punctuation mark, 1.17 CJK characters a token.
    Within about 15% of the Qwen count on the generated prose, code and tool output."""

    @staticmethod
    @lru_cache(maxsize=1024)  # a builder asks again for the texts it is adding up
    def __call__(text: str) -> int:
        data = text.encode()
        wide = (len(data) - len(text)) / 2  # characters outside ASCII, most of them 3 bytes long
        punct = len(data.translate(None, _NOT_PUNCT))
        return int((len(text) - wide - punct) / 4.8 + 0.8 * punct + wide / 1.17)

    def many(self, texts) -> list[int]:
        return [self(t) for t in texts]


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
        and data.get("pre_tokenizer") == json.loads(_byte_tokenizer().pre_tokenizer.__getstate__())
        and [t["content"] for t in data.get("added_tokens", [])] == ["<|endoftext|>"]
    )


# --------------------------------------------------------------------------- pins


def read_rev(path=None) -> list[dict]:
    """The data lines of a REV file, as dicts (kind, repo, revision, path, bytes, sha256)."""
    return _pin_lines(path or REPO_ROOT / "REV", ("kind", "repo", "revision", "path"))


def read_books(path=None) -> list[dict]:
    """The data lines of a BOOKS file, as dicts (ebook, lang, repo, commit, path, bytes, sha256,
    title)."""
    return _pin_lines(path or REPO_ROOT / "BOOKS", ("ebook", "lang", "repo", "commit", "path"))


def _pin_lines(path, names) -> list[dict]:
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.split(None, 7)
        pin = dict(zip((*names, "bytes", "sha256"), fields))
        if "ebook" in pin:
            pin["title"] = fields[7].strip() if len(fields) > 7 else ""
        out.append(pin)
    return out


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
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
    for template, out, repo, path, first in (
        (Path(rev_in or REPO_ROOT / "REV"), rev_out, 1, 3, 4),
        (Path(books_in or REPO_ROOT / "BOOKS"), books_out, 2, 4, 5),
    ):
        lines = []
        for line in template.read_text(encoding="utf-8").splitlines():
            fields = line.split()
            if not line.strip() or line.lstrip().startswith("#"):
                lines.append(line)
                continue
            target = src / fields[repo] / fields[path]
            if fields[0] == "model":
                if tokenizer_path is None:
                    lines.append(line)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                if Path(tokenizer_path).resolve() != target.resolve():
                    shutil.copyfile(tokenizer_path, target)
            if not target.is_file():
                raise FileNotFoundError(f"{target} is pinned in {template} but was not generated")
            size = str(target.stat().st_size)
            lines.append(_replace_fields(line, first, [size, sha256_file(target)]))
        Path(out).write_text("\n".join(lines) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- declarations

S, I64, F64, B = pa.string(), pa.int64(), pa.float64(), pa.bool_()
OBJECT = pa.struct([])  # a JSON object whose fields differ from row to row (JSON schemas, results)


def struct(**fields) -> pa.DataType:
    return pa.struct(list(fields.items()))


def schema(**fields) -> pa.Schema:
    return pa.schema(list(fields.items()))


MESSAGES = pa.list_(struct(role=S, content=S))


@dataclass(frozen=True)
class File:
    """One pinned file. ``schema``: for parquet the file's Arrow schema, field order included; for
    JSON the fields of one record (JSON kinds as Arrow types: string, int64, float64, bool, list,
    struct; ``OBJECT`` where the fields vary); None for books. ``json_layers``: dotted path of a
    string field holding JSON text -> the type of the decoded value. ``varies``: dotted path -> the
    types it takes across rows; for a JSON-layer path, the types of the decoded value, where a
    string is one more layer of the same JSON. Paths go through lists as if they were not there."""

    path: str
    kind: str  # "parquet" | "json-array" | "jsonl" | "text"
    schema: pa.Schema | None = None
    json_layers: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    varies: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    rows: int | None = None

    def __post_init__(self):
        for name in ("json_layers", "varies"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))


@dataclass(frozen=True)
class Source:
    """A source: build.py's name, its repository (None for the books, one repository each), its
    files in pin order and the rows of all of them together (by default the sum of the files'
    rows, None when one is unknown)."""

    name: str
    repo: str | None
    files: tuple[File, ...]
    rows: int | None = None

    def __post_init__(self):
        counts = [f.rows for f in self.files]
        if self.rows is None and None not in counts:
            object.__setattr__(self, "rows", sum(counts))


# --------------------------------------------------------------------------- writing


def _write_file(file: File, path: Path, rows, full: bool, row_group: int | None) -> None:
    """Write one file of records (or, for text, one str) in its kind's format. The miniature is
    compressed with zstd, the full size as the Hub's parquet writers do (snappy; one row group
    unless the plan says otherwise)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    if file.kind == "parquet":
        codec = "snappy" if full else "zstd"
        with pq.ParquetWriter(tmp, file.schema, compression=codec, use_dictionary=True) as w:
            batch = list(islice(rows, row_group)) if row_group else list(rows)
            while batch:
                w.write_table(pa.Table.from_pylist(batch, schema=file.schema))
                batch = list(islice(rows, row_group)) if row_group else []
    elif file.kind == "text":
        tmp.write_bytes(rows)
    else:
        with open(tmp, "w", encoding="utf-8") as f:
            if file.kind == "jsonl":
                for r in rows:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
            else:  # one JSON array, indented as json.dumps(rows, indent=4) would, row by row
                f.write("[")
                for i, r in enumerate(rows):
                    text = json.dumps(r, ensure_ascii=False, indent=4).replace("\n", "\n    ")
                    f.write(("," if i else "") + "\n    " + text)
                f.write("\n]\n")
    tmp.replace(path)


# --------------------------------------------------------------------------- checking

_KINDS = ((bool, "bool"), (int, "int64"), (float, "float64"), (str, "string"), (list, "list"))
_KINDS += ((dict, "struct"),)


def _kind(value) -> str:
    return next(name for t, name in _KINDS if isinstance(value, t))


def _type_kind(t: pa.DataType) -> str:
    return "list" if pa.types.is_list(t) else "struct" if pa.types.is_struct(t) else str(t)


def check_file(file: File, path, limit: int | None = None) -> list[str]:
    """How the file at ``path`` departs from its declaration (an empty list when it does not): a
    parquet schema other than the declared one, a JSON record whose fields, order or kinds differ,
    a JSON layer that does not decode to its type, and (when all rows are looked at, no ``limit``)
    a declared field or kind that no row has."""
    path, problems, seen = Path(path), [], set()
    if file.kind == "text":
        return []
    if file.kind == "parquet":
        actual = pq.read_schema(path).remove_metadata()
        if not actual.equals(file.schema):
            return [f"{path}: schema\n{actual}\nis not the declared\n{file.schema}"]
        columns = sorted({p.split(".")[0] for p in file.json_layers})
        records = []
        for batch in pq.ParquetFile(path).iter_batches(limit or 4096, columns=columns or None):
            records += batch.to_pylist() if columns else []
            if limit or not columns:
                break
        for p in file.json_layers:
            for value in _values_at(records, p.split(".")):
                _check_value(file, value, S, p, seen, problems)
        declared = {p: S for p in file.json_layers}
    else:
        names = file.schema.names
        top = pa.struct(list(zip(names, file.schema.types)))
        with open(path, encoding="utf-8") as f:
            records = _array_items(f.read()) if file.kind == "json-array" else map(json.loads, f)
            for n, record in enumerate(islice(records, limit)):
                if list(record) != names:
                    problems.append(f"{path} row {n}: fields {list(record)}, declared {names}")
                _check_value(file, record, top, "", seen, problems)
        declared = dict(zip(names, file.schema.types))
    for p, t in declared.items() if limit is None else ():
        for sub, kind in _declared_kinds(file, p, t):
            if (sub, kind) not in seen:
                problems.append(f"{path}: {sub} is declared {kind} but no row has one")
    return [f"{path}: {p}" if not p.startswith(str(path)) else p for p in problems[:20]]


def _array_items(text: str):
    """The items of a JSON array one at a time, so that a limit need not parse all of it."""
    decoder, between = json.JSONDecoder(), re.compile(r"[\s,]*")
    i = between.match(text, text.index("[") + 1).end()
    while text[i] != "]":
        item, i = decoder.raw_decode(text, i)
        yield item
        i = between.match(text, i).end()


def _values_at(values, parts):
    """The values at a dotted path below a list of records, through lists and structs."""
    for v in values:
        if isinstance(v, list):
            yield from _values_at(v, parts)
        elif not parts:
            yield v
        elif isinstance(v, dict) and v.get(parts[0]) is not None:
            yield from _values_at([v[parts[0]]], parts[1:])


def _check_value(file, value, t, p, seen, problems, top=True):
    """Check one value against type t at path p, recording the (path, kind) pairs seen. The
    elements of a list have the list's path (top=False: its JSON layer is already decoded)."""
    if value is None:
        return
    if top and p in file.json_layers:
        if not isinstance(value, str):
            problems.append(f"{p}: {_kind(value)}, not JSON text")
            return
        value = json.loads(value)
        if isinstance(value, str) and S in file.varies.get(p, ()):
            seen.add((p, "string"))
            value = json.loads(value)
        t = file.json_layers[p]
    elif top and p in file.varies:
        t = next((v for v in file.varies[p] if _type_kind(v) == _kind(value)), t)
    kind = _kind(value)
    if kind != _type_kind(t):
        problems.append(f"{p or 'record'}: {kind}, declared {_type_kind(t)}")
        return
    seen.add((p, kind))
    if kind == "list":
        for v in value:
            _check_value(file, v, t.value_type, p, seen, problems, top=False)
    elif kind == "struct" and t.num_fields:
        names = [f.name for f in t]
        if set(value) - set(names):
            problems.append(f"{p or 'record'}: fields {sorted(set(value) - set(names))} undeclared")
        for f in t:
            if f.name in value:
                sub = f"{p}.{f.name}" if p else f.name
                _check_value(file, value[f.name], f.type, sub, seen, problems)


def _declared_kinds(file, p, t):
    """Every (path, kind) that the declaration of path p with type t says some row has."""
    if p in file.json_layers and t == S:
        t = file.json_layers[p]
    for v in file.varies.get(p, (t,)):
        yield p, _type_kind(v)
        while pa.types.is_list(v):
            v = v.value_type
        if pa.types.is_struct(v):
            for f in v:
                yield from _declared_kinds(file, f"{p}.{f.name}" if p else f.name, f.type)


# --------------------------------------------------------------------------- helpers


def _rng(name: str) -> random.Random:
    seed = int.from_bytes(hashlib.sha256(f"kern-prompts/{name}".encode()).digest()[:8], "big")
    return random.Random(seed)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _hex(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def _alnum(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALNUM) for _ in range(n))


def _lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return min(hi, max(lo, int(median * math.exp(rng.gauss(0, sigma)))))


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


WORDS = {"Russian": (RU_WORDS, " ", "."), "Japanese": (JA_WORDS, "", "。"),
         "Spanish": (ES_WORDS, " ", "."), "French": (FR_WORDS, " ", ".")}  # fmt: skip


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
    fast: bool = False  # the full size's picks: other draws, several times quicker

    def __post_init__(self):
        self._order = sorted(range(len(self.texts)), key=lambda i: (self.ntok[i], i))
        self._keys = [self.ntok[i] for i in self._order]
        self._ranges: dict[tuple[int, int], tuple[int, int]] = {}

    def pick(self, rng: random.Random, lo: int = 0, hi: int = 10**12) -> tuple[str, int]:
        if (lo, hi) not in self._ranges:
            self._ranges[lo, hi] = (
                bisect.bisect_left(self._keys, lo),
                bisect.bisect_right(self._keys, hi),
            )
        a, b = self._ranges[lo, hi]
        if a >= b:
            raise ValueError(f"no text of {lo}..{hi} tokens in the pool")
        i = self._order[a + int(rng.random() * (b - a)) if self.fast else rng.randrange(a, b)]
        return self.texts[i], self.ntok[i]

    def fill(self, rng, target: int, sep: str, sep_tokens: int, hi: int = 10**12):
        """Texts whose estimated joined size reaches target tokens."""
        parts, est = [], 0
        while est < target:
            text, n = self.pick(rng, 0, hi)
            parts.append(text)
            est += n + sep_tokens
        return parts, est


@dataclass
class Fresh:
    """Stands in for a Pool at the full size: every pick is a new text (a real source repeats no
    message, and the build counts a message seen before only once)."""

    make: object  # rng -> text
    tokens: object

    def pick(self, rng: random.Random, lo: int = 0, hi: int = 10**12) -> tuple[str, int]:
        while True:
            text = self.make(rng)
            if lo <= (n := self.tokens(text)) <= hi:
                return text, n


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
    """What the row builders share: the scale, the token counts, the pins and the text pools.

    The miniature counts tokens with the tokenizer and draws on small pools (400 paragraphs a
    book); the full size estimates tokens (``Estimate``), draws on every paragraph of the books and
    makes every reply, observation and tool result afresh (``texts``)."""

    def __init__(self, tokenizer_path=None, realdata=None, rev=None, books=None, full=False):
        self.full = full
        self.tokens = Estimate() if full else Tokens(tokenizer_path)
        self.realdata = Path(realdata) if realdata else None
        self.rev = read_rev(rev)
        self.books = read_books(books)
        self._pools: dict[str, Pool] = {}
        self.sep2 = max(0, self.tokens("a\n\nb") - self.tokens("a") - self.tokens("b"))

    def files(self, repo: str) -> list[dict]:
        return [e for e in self.rev if e["repo"] == repo and e["kind"] == "dataset"]

    def real(self, name: str) -> bool:
        return bool(self.realdata) and (self.realdata / name).exists()

    def pool(self, name: str) -> Pool:
        if name not in self._pools:
            if name in WORDS:  # made-up paragraphs of a language the real texts do not have
                rng = _rng(f"pool/{name}")
                texts = [_words_paragraph(rng, *WORDS[name]) for _ in range(5_000)]
            else:
                texts = getattr(self, f"_pool_{name}")()
            self._pools[name] = Pool(texts, self.tokens.many(texts), fast=self.full)
        return self._pools[name]

    def texts(self, n: int, make, rng: random.Random):
        """n texts made by make(rng) in the miniature; at the full size, a new one every pick."""
        if self.full:
            return Fresh(make, self.tokens)
        texts = [make(rng) for _ in range(n)]
        return Pool(texts, self.tokens.many(texts))

    def _book_paragraphs(self, lang: str) -> list[str]:
        out, per_book = [], 10**9 if self.full else 400
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
        if paras := self.real("books") and self._book_paragraphs("en"):
            return paras
        rng = _rng("pool/en")
        return [_en_paragraph(rng) for _ in range(20_000 if self.full else 1500)]

    def _pool_zh(self) -> list[str]:
        if paras := self.real("books") and self._book_paragraphs("zh"):
            return paras
        rng = _rng("pool/zh")
        return [_zh_paragraph(rng) for _ in range(20_000 if self.full else 1500)]

    def _pool_code(self) -> list[str]:
        rng = _rng("pool/code")
        out = [_py_module(rng, rng.randint(1, 6)) for _ in range(300)]
        out += [_py_function(rng) + "\n" for _ in range(300)]
        return out + [r["prompt"] + r["canonical_solution"] for r in self.humaneval_rows()]

    def _pool_sentences(self) -> list[str]:
        """Sentences of the books and of GSM8K, for the full size's many short texts."""
        text = " ".join(self.pool("en").texts[:20_000])
        text += " " + " ".join(r["question"] for r in self.gsm8k_rows())
        return [s for s in re.split(r"(?<=[.!?])\s+", text) if 20 <= len(s) <= 300]

    def text(self, lang: str, rng: random.Random, target: int, hi: int = 10**12) -> str:
        """Paragraphs of one language joined by blank lines, about target tokens."""
        parts, _ = self.pool(lang).fill(rng, target, "\n\n", self.sep2, hi)
        return "\n\n".join(parts)

    def sentence(self, rng: random.Random, lo: int = 6, hi: int = 16) -> str:
        """A made-up sentence of lo to hi words in the miniature, a real one at the full size."""
        return rng.choice(self.pool("sentences").texts) if self.full else _en_sentence(rng, lo, hi)

    def zh_sentence(self, rng: random.Random) -> str:
        if not self.full:
            return _zh_sentence(rng)
        sentences = re.findall(r"[^。！？]+[。！？]", rng.choice(self.pool("zh").texts))
        return rng.choice(sentences or ["話說天下大勢，分久必合，合久必分。"])

    def hex(self, rng: random.Random, n: int) -> str:
        return f"{rng.getrandbits(4 * n):0{n}x}" if self.full else _hex(rng, n)

    def alnum(self, rng: random.Random, n: int) -> str:
        return "".join(rng.choices(ALNUM, k=n)) if self.full else _alnum(rng, n)

    def paragraph(self, rng: random.Random, lo: int, hi: int) -> str:
        """A made-up paragraph of lo to hi sentences in the miniature, a real one at full size."""
        return rng.choice(self.pool("en").texts) if self.full else _en_paragraph(rng, lo, hi)

    def humaneval_rows(self) -> list[dict]:
        if not self.real("HumanEval.jsonl.gz"):
            return []
        with gzip.open(self.realdata / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    def gsm8k_rows(self) -> list[dict]:
        if not self.real("gsm8k-test.jsonl"):
            return []
        with open(self.realdata / "gsm8k-test.jsonl", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]


# --------------------------------------------------------------------------- LongBench-Pro

# One JSON array of flat objects; the authors send f"{context}\n\n\n\n{question}" as one user turn.
_LB_RECORD = schema(
    id=S, context=S, language=S, token_length=S, primary_task=S, secondary_task=S,
    contextual_requirement=S, question_nonthinking=S, question_thinking=S, answer=pa.list_(S),
    difficulty=S,
)  # fmt: skip
LONGBENCH = Source(
    "longbench-pro",
    "caskcsg/LongBench-Pro",
    (File("longbench_pro.json", "json-array", _LB_RECORD, rows=1_500),),
)
LB_NEED = {
    ("256k", "English"): 6, ("256k", "Chinese"): 6, ("8k", "English"): 3, ("8k", "Chinese"): 2,
    ("16k", "English"): 2, ("16k", "Chinese"): 3, ("32k", "English"): 3, ("32k", "Chinese"): 2,
    ("64k", "English"): 2, ("64k", "Chinese"): 3, ("128k", "English"): 3, ("128k", "Chinese"): 2,
}  # fmt: skip
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


def _lb_context(g: Gen, rng: random.Random, lang: str, tokens: int, number: int) -> str:
    head = f"Document {number}\n\n" if lang == "English" else f"文檔{number}\n\n"
    return head + g.text("en" if lang == "English" else "zh", rng, tokens, hi=400)


def _lb_row(g: Gen, rng: random.Random, bucket: str, lang: str, context: str) -> dict:
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


def _mini_longbench(g: Gen) -> dict[str, list]:
    (entry,) = g.files(LONGBENCH.repo)
    rng = _rng("longbench-pro")
    counter = iter(range(1, 10**6))
    valid, decoys = [], []
    for (bucket, lang), need in LB_NEED.items():
        for k in range(2 * need):
            context = _lb_context(g, rng, lang, rng.randint(150, 900), next(counter))
            unit = [_lb_row(g, rng, bucket, lang, context)]
            if k == 0 and bucket in ("8k", "32k", "128k", "256k"):
                # The same document again with another question: a context is used once.
                unit.append(_lb_row(g, rng, bucket, lang, context))
            (decoys if len(unit) > 1 else valid).append(unit)
    # A 128k row over the standard range: it fits no slot.
    big = _lb_row(g, rng, "128k", "English", _lb_context(g, rng, "English", rng.randint(1, 1), 0))
    big["context"] = "Document 0\n\n" + g.text("en", rng, 184_000, hi=400)
    while g.tokens(big["context"] + "\n\n\n\n" + big["question_thinking"]) <= 181_000:
        big["context"] += "\n\n" + g.text("en", rng, 2_000, hi=400)
    decoys.append([big])
    return {entry["path"]: _place(_weave(valid, decoys, rng), entry["repo"], entry["revision"])}


def _full_longbench(g: Gen, index: int):
    """250 rows a length bucket, half of them in each language; 92 documents for each bucket and
    language, some used by more than one row (about 1,100 distinct documents)."""
    rng = _rng("full/longbench-pro")
    specs = []
    for bucket in ("8k", "16k", "32k", "64k", "128k", "256k"):
        for lang in ("English", "Chinese"):
            tokens = [int(int(bucket[:-1]) * 1000 * rng.uniform(0.9, 1.28)) for _ in range(92)]
            again = [rng.randrange(92) for _ in range(125 - 92)]
            specs += [(bucket, lang, k, tokens[k]) for k in [*range(92), *again]]
    rng.shuffle(specs)
    for bucket, lang, k, tokens in specs:
        # A document is made again from its own seed when a second row uses it.
        context = _lb_context(g, _rng(f"full/longbench-pro/{bucket}/{lang}/{k}"), lang, tokens, k)
        yield _lb_row(g, rng, bucket, lang, context)


# --------------------------------------------------------------------------- MRCR

# `date_added` came with the 2025-12-05 fix; its type is not published (a script at this revision
# counts its values with JSON sort_keys, so not a timestamp): a string here is a guess.
_MRCR_COLUMNS = schema(
    prompt=S, answer=S, random_string_to_prepend=S, n_needles=I64, desired_msg_index=I64,
    total_messages=I64, n_chars=I64, date_added=S,
)  # fmt: skip
MRCR = Source(
    "mrcr",
    "openai/mrcr",
    tuple(
        File(f"2needle/2needle_{i}.parquet", "parquet", _MRCR_COLUMNS, {"prompt": MESSAGES})
        for i in (0, 1)
    ),
    rows=800,
)
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
MRCR_FULL = [(180_001, 262_144), (262_145, 393_216), (393_217, 524_288), (524_289, 655_360),
             (655_361, 786_432), (786_433, 1_000_000)]  # fmt: skip
MRCR_STANDARD = [(8_192, 16_384), (16_385, 32_768), (32_769, 65_536), (65_537, 131_072),
                 (131_073, 180_000)]  # fmt: skip


def _mrcr_reply(g: Gen, rng: random.Random) -> str:
    """1 to 4 paragraphs (4 to 16 at the full size: about the 2,000 characters of a gpt-4o text),
    sometimes under a bold title."""
    n = rng.randint(4, 16) if g.full else rng.randint(1, 4)
    parts = [g.pool("en").pick(rng, 0, 500)[0] for _ in range(n)]
    if rng.random() < 0.5:
        parts.insert(0, f"**{g.sentence(rng, 2, 6).rstrip('.!?')}**")
    return "\n\n".join(parts)


def _mrcr_ask(rng: random.Random) -> tuple[str, str]:
    return rng.choice(MRCR_FORMS), rng.choice(MRCR_TOPICS)


def _mrcr_final(prepend: str, which: int, needle: tuple[str, str]) -> str:
    return (
        f"Prepend {prepend} to the {MRCR_ORD[which]} (1 indexed) {needle[0]} about {needle[1]}. "
        "Do not include any other text in your response."
    )


def _mrcr_preamble(rng: random.Random, replies, examples: int, pairs: int) -> str:
    """The few-shot user turn that opens every prompt: whole example conversations, each with its
    follow-up question and the right answer."""
    out = ["Here are some examples of conversations succeeded by a follow-up question answered "
           "correctly:\n"]  # fmt: skip
    for _ in range(examples):
        asked = [(_mrcr_ask(rng), replies.pick(rng)[0]) for _ in range(pairs)]
        lines = [f"User: write a {f} about {t}\nAssistant: {text}" for (f, t), text in asked]
        prepend, (needle, text) = _alnum(rng, 10), asked[-1]
        lines.append(f"User: {_mrcr_final(prepend, 1, needle)}\nAssistant: {prepend}{text}")
        out.append("======EXAMPLE======\n" + "\n".join(lines) + "\n")
    return "\n".join(out)


def _mrcr_row(g: Gen, rng: random.Random, replies, target: int, preamble=(1, 1)) -> dict:
    """A 2-needle conversation of about target tokens: the few-shot user turn, then pairs of a user
    ask and an assistant text in which one ask comes twice, then the question about it."""
    asks = {(f, t): f"write a {f} about {t}" for f in MRCR_FORMS for t in MRCR_TOPICS}
    ask_tok = dict(zip(asks, g.tokens.many(list(asks.values()))))
    needle = _mrcr_ask(rng)
    others = [k for k in asks if k != needle]
    first = _mrcr_preamble(rng, replies, *preamble)
    turns, total = [], g.tokens(first)
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
    msgs = [{"role": "user", "content": first}]
    for key, text in turns:
        msgs.append({"role": "user", "content": asks[key]})
        msgs.append({"role": "assistant", "content": text})
    final = _mrcr_final(prepend, which, needle)
    msgs.append({"role": "user", "content": final})
    desired = 2 * (i if which == 1 else j) + 2
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


def _mini_mrcr(g: Gen) -> dict[str, list]:
    entries = g.files(MRCR.repo)
    rng = _rng("mrcr")
    replies = g.texts(400, lambda r: _mrcr_reply(g, r), _rng("mrcr/replies"))
    valid = [[(lo, hi, lo + (hi - lo) // 5)] for lo, hi in MRCR_FULL]
    for lo, hi in MRCR_STANDARD:
        valid += [[(lo, hi, lo + int((hi - lo) * frac))] for frac in (0.3, 0.6)]
    decoys = [[(0, 8_191, target)] for target in (1_500, 4_000, 6_500)]
    rows = []
    for lo, hi, target in [u[0] for u in _weave(valid, decoys, rng)]:
        r = _mrcr_row(g, rng, replies, target)
        assert lo <= r.pop("_tokens") <= hi, (lo, hi)
        rows.append([r])
    rows = _place(rows, entries[0]["repo"], entries[0]["revision"])
    per = -(-len(rows) // len(entries))
    return {e["path"]: rows[i * per : (i + 1) * per] for i, e in enumerate(entries)}


def _full_mrcr(g: Gen, index: int):
    """Eight length bins of 100 rows, 15.5k to 5.1M characters; the second file has more of the
    longest rows (it is the larger). The lengths by row are those the benchmark has always had
    (its old generator's seed): which rows come first in sha256 order decides how many the build
    looks at, so its numbers stay comparable."""
    rng = random.Random("kern-prompts bench:mrcr")
    specs = []
    for b in range(8):
        lo, hi = 15_500 * 2**b, (15_500 * 2 ** (b + 1) if b < 7 else 5_100_000)
        to_first = 35 if b == 7 else 50
        specs += [(lo + (hi - lo) * rng.random() ** 0.75, j >= to_first) for j in range(100)]
    rng.shuffle(specs)
    replies = g.texts(0, lambda r: _mrcr_reply(g, r), rng)
    for i, (chars, second) in enumerate(specs):
        if second == index:
            row = _mrcr_row(g, _rng(f"full/mrcr/{i}"), replies, int(chars / 4.3), (3, 2))
            del row["_tokens"]
            yield row


# --------------------------------------------------------------------------- SWE-smith

# The xml split: messages are {role, content} JSON text, in some rows JSON text of JSON text; tool
# output comes back as user turns, calls are <function=...> blocks in the assistant's text. Some
# rows are as SWE-agent writes them for Claude models: a message_type on every message, the last
# two user turns' contents OpenAI content parts with cache_control (``_agent_shaped``).
SWE_PARTS = pa.list_(struct(type=S, text=S, cache_control=struct(type=S), image_url=struct(url=S)))
SWE_MESSAGES = pa.list_(struct(role=S, content=S, message_type=S))
SWE_SMITH = Source(
    "swe-smith",
    "SWE-bench/SWE-smith-trajectories",
    (
        File(
            "data/xml-00000-of-00008.parquet",
            "parquet",
            schema(messages=S, instance_id=S, resolved=B, model=S, traj_id=S, patch=S),
            json_layers={"messages": SWE_MESSAGES},
            varies={"messages": (SWE_MESSAGES, S), "messages.content": (S, SWE_PARTS)},
        ),
    ),
)
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
    thought = g.paragraph(rng, 1, 3)
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
            f"{rng.choice(PY_NOUNS)} - AssertionError: {g.sentence(rng, 3, 8)}"
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


SWE_USER = (
    "<uploaded_files>\n/testbed\n</uploaded_files>\nI've uploaded a python code repository in "
    "the directory /testbed. Consider the following PR description:\n\n<pr_description>\n{}\n"
    "</pr_description>\n\nCan you help me implement the necessary changes to the repository so "
    "that the requirements specified in the <pr_description> are met?\nI've already taken care of "
    "all changes to any of the test files described in the <pr_description>. This means you DON'T "
    "have to modify the testing logic or any of the tests in any way!\nYour task is to make the "
    "minimal changes to non-tests files in the /testbed directory to ensure the <pr_description> "
    "is satisfied."
)
SWE_SUBMIT = (
    "I have made the necessary changes; submitting them now.\n\n<function=submit>\n</function>"
)


# The largest observations, in tokens: the full size's are as long as the files viewed in real
# trajectories (a few thousand characters on average, up to about 50,000).
SWE_VIEWS = {False: (300, 700, 1200), True: (1_000, 2_500, 5_000, 10_000, 16_000)}


def _swe_pools(g: Gen):
    """Assistant actions and the observations that answer them."""
    prng, views = _rng("swe-smith/pools"), SWE_VIEWS[g.full]
    actions = g.texts(240, lambda r: _swe_assistant(g, r), prng)
    return actions, g.texts(300, lambda r: _swe_observation(g, r, r.choice(views)), prng)


def _swe_trajectory(g: Gen, rng: random.Random, pools, target: int) -> dict:
    """A trajectory of about target tokens before its last turn, the assistant's submit call."""
    actions, observations = pools
    owner, name = rng.choice(SWE_REPOS)
    instance = (
        f"{owner}__{name}.{_hex(rng, 8)}.{rng.choice(SWE_MUTATIONS)}__{_alnum(rng, 8).lower()}"
    )
    user = SWE_USER.format(g.text("en", rng, rng.randint(120, 500), hi=250))
    msgs = [{"role": "system", "content": SWE_SYSTEM}, {"role": "user", "content": user}]
    total = g.tokens(SWE_SYSTEM) + g.tokens(user)
    while total < target or len(msgs) < 6:
        a, na = actions.pick(rng, 0, 700)
        o, no = observations.pick(rng, 0, 10**9 if g.full else 1500)
        msgs.append({"role": "assistant", "content": a})
        msgs.append({"role": "user", "content": o})
        total += na + no
    msgs.append({"role": "assistant", "content": SWE_SUBMIT})
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
    }


def _swe_record(trajectory: dict, layers: int) -> dict:
    text = json.dumps(trajectory["messages"])
    return dict(trajectory, messages=json.dumps(text) if layers == 2 else text)


SWE_MESSAGE_TYPES = {"system": "system_prompt", "user": "observation", "assistant": "action"}
SWE_IMAGE = (  # a PNG of one pixel
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2O"
    "UAAAAABJRU5ErkJggg=="
)


def _agent_shaped(record: dict, rng: random.Random, image: bool = False) -> dict:
    """The record as SWE-agent writes it for Claude models, its texts unchanged: a message_type on
    every message, the last two user turns' contents a text part with cache_control, the problem
    statement two text parts; with ``image``, an image part after them (a decoy: the build drops
    the row)."""
    value = json.loads(record["messages"])
    layers = 2 if isinstance(value, str) else 1
    msgs = [dict(m, message_type=SWE_MESSAGE_TYPES[m["role"]]) for m in _twice(record["messages"])]
    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    for i in users[-2:]:
        msgs[i]["content"] = [
            {"type": "text", "text": msgs[i]["content"], "cache_control": {"type": "ephemeral"}}
        ]
    problem = msgs[users[0]]["content"]  # not one of the last two: a trajectory has 3 user turns
    cut = rng.randrange(1, len(problem))
    msgs[users[0]]["content"] = [{"type": "text", "text": problem[:cut]},
                                 {"type": "text", "text": problem[cut:]}]  # fmt: skip
    if image:
        msgs[users[0]]["content"].append({"type": "image_url", "image_url": {"url": SWE_IMAGE}})
    return _swe_record(dict(record, messages=msgs), layers)


def _mini_swe(g: Gen) -> dict[str, list]:
    (entry,) = g.files(SWE_SMITH.repo)
    rng = _rng("swe-smith")
    pools = _swe_pools(g)
    valid, decoys = [], []
    # The four longest whole trajectories (full), the third one duplicated under its traj_id.
    longest = [_swe_trajectory(g, rng, pools, t) for t in (174_000, 166_000, 158_000, 150_000)]
    for k, t in enumerate(longest):
        unit = [_swe_record(t, 2 if k in (0, 3) else 1)]
        if k == 2:
            unit.append(_swe_record(t, 2))
        (decoys if len(unit) > 1 else valid).append(unit)
    groups = [(5, 134_000, 146_000), (6, 67_000, 75_000), (6, 34_000, 38_000), (6, 17_000, 19_500)]
    for gi, (n, lo, hi) in enumerate(groups):
        for k in range(n):
            t = _swe_trajectory(g, rng, pools, rng.randint(lo, hi))
            unit = [_swe_record(t, 2 if k % 3 == 1 else 1)]
            if gi in (1, 2) and k == 0:
                unit.append(_swe_record(t, 1 if k % 3 == 1 else 2))
            (decoys if len(unit) > 1 else valid).append(unit)
    for target in (5_000, 8_000, 10_500):  # too short for every cut
        decoys.append([_swe_record(_swe_trajectory(g, rng, pools, target), 1)])
    units = _weave(valid, decoys, rng)
    # The agent's shape has a random stream of its own, so the rows above are as they were. A
    # decoy first in candidate order and longer than every other trajectory, with an image in its
    # problem statement: taken by a slot unless the build drops it.
    prng = _rng("swe-smith/agent")
    image = _agent_shaped(_swe_record(_swe_trajectory(g, prng, pools, 178_000), 1), prng, True)
    # Every other unit in candidate order is in the agent's shape, and so is row 0 (the row that
    # tests/test_damage.py damages).
    units = [[image]] + [[_agent_shaped(r, prng) for r in u] if k % 2 else u
                         for k, u in enumerate(units)]  # fmt: skip
    rows = _place(units, entry["repo"], entry["revision"])
    if "message_type" not in _twice(rows[0]["messages"])[0]:
        rows[0] = _agent_shaped(rows[0], prng)
    return {entry["path"]: rows}


def _full_swe(g: Gen, index: int):
    """3,300 rows (the shard's count is not published: about 26k rows over 8 shards), trajectories
    of 2k to 120k estimated tokens (3k to 140k counted), 8.5% of traj_ids stored twice, 1% of the
    rows in two JSON layers, 30% as SWE-agent writes them for Claude models, 0.3% with an image
    (decoys)."""
    rng, prng = _rng("full/swe-smith"), _rng("full/swe-smith/agent")
    pools, recent = _swe_pools(g), []
    for _ in range(3_300):
        if recent and rng.random() < 0.085:  # a trajectory stored twice under one traj_id
            yield dict(rng.choice(recent), resolved=rng.random() < 0.5)
            continue
        t = _swe_trajectory(g, rng, pools, _lognormal(rng, 16_000, 0.8, 2_200, 120_000))
        record = _swe_record(t, 2 if rng.random() < 0.01 else 1)
        if prng.random() < 0.3:
            record = _agent_shaped(record, prng, image=prng.random() < 0.01)
        recent = (recent + [record])[-40:]
        yield recent[-1]


# --------------------------------------------------------------------------- Nemotron

_NEMO_CALL = struct(id=S, type=S, function=struct(name=S, arguments=S))
# A public discussion reports no reasoning_content in this subset, even where reasoning is "on".
NEMOTRON = Source(
    "nemotron-agentic",
    "nvidia/Nemotron-Agentic-v1",
    (
        File(
            "data/interactive_agent.jsonl",
            "jsonl",
            schema(
                uuid=S,
                messages=pa.list_(
                    struct(role=S, content=S, tool_calls=pa.list_(_NEMO_CALL), tool_call_id=S)
                ),
                tools=pa.list_(
                    struct(type=S, function=struct(name=S, description=S, parameters=OBJECT))
                ),
                license=S,
                used_in=pa.list_(S),
                reasoning=S,
            ),
            json_layers={"messages.tool_calls.function.arguments": OBJECT},
            varies={"messages.content": (S, OBJECT)},  # structured tool results
            rows=19_028,
        ),
    ),
)
# fmt: off
NEMO_TOOLS = (
[{'name': 'get_order_details',
  'description': 'Get the status and details of an order.',
  'parameters': {'type': 'object',
                 'properties': {'order_id': {'type': 'string',
                                             'description': "The order id, such as '#W0000000'. "
                                                            "Be careful there is a '#' symbol at "
                                                            'the beginning of the order id.'}},
                 'required': ['order_id']}},
 {'name': 'cancel_pending_order',
  'description': 'Cancel a pending order. The agent must obtain explicit confirmation.',
  'parameters': {'type': 'object',
                 'properties': {'order_id': {'type': 'string', 'description': 'The order id.'},
                                'reason': {'type': 'string',
                                           'enum': ['no longer needed', 'ordered by mistake'],
                                           'description': 'The reason for cancellation.'}},
                 'required': ['order_id', 'reason']}},
 {'name': 'search_direct_flight',
  'description': 'Search direct flights between two cities on a specific date.',
  'parameters': {'type': 'object',
                 'properties': {'origin': {'type': 'string',
                                           'description': "IATA code, such as 'JFK'."},
                                'destination': {'type': 'string',
                                                'description': "IATA code, such as 'LAX'."},
                                'date': {'type': 'string',
                                         'description': "The date in 'YYYY-MM-DD' format."}},
                 'required': ['origin', 'destination', 'date']}},
 {'name': 'update_reservation_passengers',
  'description': 'Update the passenger information of a reservation.',
  'parameters': {'type': 'object',
                 'properties': {'reservation_id': {'type': 'string'},
                                'passengers': {'type': 'array',
                                               'description': 'The passengers.',
                                               'items': {'type': 'object',
                                                         'properties': {'first_name': {'type': 'string'},
                                                                        'last_name': {'type': 'string'},
                                                                        'dob': {'type': 'string',
                                                                                'description': 'YYYY-MM-DD'}},
                                                         'required': ['first_name', 'last_name',
                                                                      'dob']}}},
                 'required': ['reservation_id', 'passengers'],
                 'additionalProperties': False}},
 {'name': 'calculate',
  'description': 'Calculate the result of a mathematical expression.',
  'parameters': {'type': 'object',
                 'properties': {'expression': {'type': 'string',
                                               'description': 'The expression, with numbers and + '
                                                              '- * / ( ) only.'}}}},
 {'name': 'transfer_to_human_agents',
  'description': 'Transfer the user to a human agent, with a summary of the issue.',
  'parameters': {'type': 'object',
                 'properties': {'summary': {'type': 'string'}},
                 'required': ['summary']}},
 {'name': 'list_all_product_types',
  'description': 'List the name and product id of all product types.',
  'parameters': {'type': 'object', 'properties': {}, 'required': []}},
 {'name': 'modify_user_address',
  'description': 'Modify the default address of a user.',
  'parameters': {'type': 'object',
                 'properties': {'user_id': {'type': 'string'},
                                'address': {'type': 'object',
                                            'properties': {'address1': {'type': 'string'},
                                                           'address2': {'type': 'string'},
                                                           'city': {'type': 'string'},
                                                           'state': {'type': 'string'},
                                                           'country': {'type': 'string'},
                                                           'zip': {'type': 'string'}},
                                            'required': ['address1', 'city', 'country', 'zip']}},
                 'required': ['user_id', 'address']}},
 {'name': 'get_available_slots',
  'description': 'Get the available appointment slots for a service.',
  'parameters': {'type': 'object',
                 'properties': {'service_id': {'type': 'integer', 'minimum': 1},
                                'days_ahead': {'type': 'integer', 'default': 7, 'maximum': 60},
                                'include_weekends': {'type': 'boolean'}},
                 'required': ['service_id']}},
 {'name': 'search_knowledge_base',
  'description': 'Search the help center articles.',
  'parameters': {'type': 'object',
                 'properties': {'query': {'type': 'string'},
                                'top_k': {'type': 'number'},
                                'filters': {'type': 'array',
                                            'items': {'type': 'string',
                                                      'enum': ['billing', 'shipping',
                                                               'returns']}}},
                 'required': ['query']}}]
)
# fmt: on
def _json_value(g: Gen, rng: random.Random, spec: dict):
    """A value that fits a JSON schema of the kinds the tool catalogue uses."""
    kind = spec.get("type")
    if "enum" in spec:
        return rng.choice(spec["enum"])
    if kind == "string":
        return [
            lambda: f"#W{rng.randint(10**6, 10**7 - 1)}",
            lambda: " ".join(g.sentence(rng, 2, 6).split()[:5]).rstrip(".!?,;"),
            lambda: f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            lambda: rng.choice(["JFK", "LAX", "SFO", "ORD"]),
        ][rng.randrange(4)]()
    if kind == "integer":
        return rng.randint(1, 30)
    if kind == "number":
        return rng.randint(1, 10)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        item = spec.get("items", {"type": "string"})
        return [_json_value(g, rng, item) for _ in range(rng.randint(1, 2))]
    if kind == "object":
        required = spec.get("required", [])
        return {
            k: _json_value(g, rng, v)
            for k, v in spec.get("properties", {}).items()
            if k in required or rng.random() < 0.5
        }
    return None


def _nemo_result(g: Gen, rng: random.Random, structured: bool, most: int = 8):
    if structured:  # an object, not the JSON text of one
        return {
            "status": rng.choice(["ok", "pending", "delivered", "cancelled"]),
            "id": f"#W{rng.randint(1000000, 9999999)}",
            "items": [
                {"item_id": str(rng.randint(10**9, 10**10)), "price": rng.randint(5, 900) + 0.5}
                for _ in range(rng.randint(1, 3))
            ],
        }
    records = []
    for _ in range(rng.randint(1, most)):
        records.append(
            {
                "name": " ".join(g.sentence(rng).split()[:4]).rstrip(".!?,;"),
                "item_id": str(rng.randint(10**9, 10**10)),
                "price": round(rng.uniform(5, 900), 2),
                "available": rng.random() < 0.8,
                "options": {
                    "color": rng.choice(["red", "blue", "black"]),
                    "size": rng.choice("SML"),
                },
                "note": g.sentence(rng),
            }
        )
    obj = {"result": records, "count": len(records)}
    return json.dumps(obj, indent=rng.choice([None, 2]))


def _nemotron_row(g: Gen, rng: random.Random, target: int, end: str) -> dict:
    """A tool-calling conversation whose view before the last assistant turn has about target
    tokens and ends with a turn of role `end`."""
    reasoning = rng.choice(["on", "off"])
    tools = [{"type": "function", "function": t} for t in rng.sample(NEMO_TOOLS, rng.randint(3, 7))]
    null_content = rng.random() < 0.5
    system = (
        f"# Policy\n\nYou are a customer service agent for {rng.choice(EN_NAMES)} & Co. "
        "Follow the policy below.\n\n"
        + g.text("en", rng, rng.randint(min(400, target // 8), min(1200, target // 4)), hi=300)
    )
    msgs = [{"role": "system", "content": system}]

    def view_tokens():
        k = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        texts = [c if isinstance(c, str) else _compact(c) for m in msgs[:k] if (c := m["content"])]
        return sum(g.tokens.many(texts)), k

    while True:
        user = g.text("en", rng, rng.randint(20, 150), hi=150)
        msgs.append({"role": "user", "content": user})
        for _ in range(rng.randint(1, 1 if target < 3_000 else 2)):
            calls = []
            for _ in range(1 if rng.random() < 0.8 else 2):
                fn = rng.choice(tools)["function"]
                args = json.dumps(_json_value(g, rng, fn["parameters"]))
                call = {"name": fn["name"], "arguments": args}
                calls.append(
                    {"id": f"call_{g.alnum(rng, 24)}", "type": "function", "function": call}
                )
            msgs.append(
                {"role": "assistant", "content": None if null_content else "", "tool_calls": calls}
            )
            for c in calls:
                result = _nemo_result(g, rng, rng.random() < 0.2, 2 if target < 3_000 else 4)
                msgs.append({"role": "tool", "content": result, "tool_call_id": c["id"]})
        text = g.text("en", rng, rng.randint(40, 250), hi=250)
        msgs.append({"role": "assistant", "content": text, "tool_calls": None})
        if view_tokens()[0] >= target:
            break
    if end == "user":
        msgs.append({"role": "user", "content": g.text("en", rng, rng.randint(20, 120), hi=120)})
        text = g.text("en", rng, rng.randint(40, 250), hi=250)
        msgs.append({"role": "assistant", "content": text, "tool_calls": None})
    tokens, k = view_tokens()
    assert msgs[k - 1]["role"] == end
    return {
        "uuid": f"{g.hex(rng, 8)}-{g.hex(rng, 4)}-{g.hex(rng, 4)}-{g.hex(rng, 4)}-{g.hex(rng, 12)}",
        "messages": msgs,
        "tools": tools,
        "license": "cc-by-4.0",
        "used_in": ["nano_v3"] if rng.random() < 0.7 else ["nano_v3", "super_v1"],
        "reasoning": reasoning,
        "_tokens": tokens,
    }


def _mini_nemotron(g: Gen) -> dict[str, list]:
    (entry,) = g.files(NEMOTRON.repo)
    rng = _rng("nemotron-agentic")

    def sized(target, end, lo, hi):  # a conversation whose view has lo..hi tokens
        for _ in range(20):
            if lo <= (r := _nemotron_row(g, rng, target, end)).pop("_tokens") <= hi:
                return [r]
        raise AssertionError(f"no Nemotron conversation of {lo}..{hi} tokens")

    valid, decoys = [], []
    for end in ("tool", "user"):
        valid += [sized(rng.randint(4_000, 8_000), end, 3_500, 11_000) for _ in range(7)]
        decoys += [sized(target, end, 0, 2_900) for target in (900, 1_500)]
        decoys.append(sized(13_500, end, 12_500, 10**6))
    units = _weave(valid, decoys, rng, spread=0.6)
    return {entry["path"]: _place(units, entry["repo"], entry["revision"])}


def _full_nemotron(g: Gen, index: int):
    rng = _rng("full/nemotron-agentic")
    for _ in range(NEMOTRON.rows):
        target = _lognormal(rng, 3_300, 0.6, 600, 30_000)
        row = _nemotron_row(g, rng, target, rng.choice(["tool", "user"]))
        del row["_tokens"]
        yield row


# --------------------------------------------------------------------------- WildChat

# The dataset card's features at the pinned revision give every column and the conversation
# struct field by field: timestamps in microseconds without a time zone; `created` an int64 (on
# assistant turns: OpenAI's `created`, Unix seconds); `usage` with the token details structs;
# 21 moderation categories with the `illicit` ones. The card is cut before the detoxify scores:
# their float64 type is a guess.
_MOD_NAMES = (
    "harassment harassment/threatening harassment_threatening hate hate/threatening "
    "hate_threatening illicit illicit/violent illicit_violent self-harm self-harm/instructions "
    "self-harm/intent self_harm self_harm_instructions self_harm_intent sexual sexual/minors "
    "sexual_minors violence violence/graphic violence_graphic"
).split()
_DETOX_NAMES = (
    "identity_attack insult obscene severe_toxicity sexual_explicit threat toxicity".split()
)
_TS = pa.timestamp("us")
_WC_HEADER = pa.struct([("accept-language", S), ("user-agent", S)])
_WC_TURN = struct(
    content=S, created=I64, header=_WC_HEADER, hashed_ip=S, country=S, toxic=B, redacted=B,
    state=S, language=S, openai_id=S, role=S, temperature=F64, timestamp=_TS, token_counter=I64,
    top_p=F64, turn_identifier=I64, system_fingerprint=S,
    usage=struct(
        completion_tokens=I64,
        completion_tokens_details=struct(
            reasoning_tokens=I64, text_tokens=I64, audio_tokens=I64,
            accepted_prediction_tokens=I64, rejected_prediction_tokens=I64,
        ),
        prompt_tokens=I64, total_tokens=I64,
        prompt_tokens_details=struct(cached_tokens=I64, audio_tokens=I64),
    ),
)  # fmt: skip
_WC_MOD = pa.struct(
    [
        ("categories", pa.struct([(n, B) for n in _MOD_NAMES])),
        ("category_scores", pa.struct([(n, F64) for n in _MOD_NAMES])),
        ("flagged", B),
    ]
)
_WC_COLUMNS = schema(
    conversation_hash=S, model=S, timestamp=_TS, conversation=pa.list_(_WC_TURN), turn=I64,
    language=S, openai_moderation=pa.list_(_WC_MOD),
    detoxify_moderation=pa.list_(pa.struct([(n, F64) for n in _DETOX_NAMES])), toxic=B,
    redacted=B, state=S, country=S, hashed_ip=S, header=_WC_HEADER,
)  # fmt: skip
WILDCHAT = Source(
    "wildchat",
    "allenai/WildChat-4.8M",
    (File("data/train-00000-of-00086.parquet", "parquet", _WC_COLUMNS, rows=37_208),),
)
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
    if g.full:
        return g.text(lang, rng, target, hi)
    parts, n = [], 0
    while n < target:
        p = _words_paragraph(rng, *WORDS[lang])
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
    ip = g.hex(rng, 64)
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
                    "openai_id": f"chatcmpl-{g.alnum(rng, 29)}",
                    "role": "assistant",
                    "temperature": 1.0,
                    "timestamp": clock,
                    "token_counter": completion,
                    "top_p": 1.0,
                    "turn_identifier": turn_id,
                    "system_fingerprint": f"fp_{g.hex(rng, 10)}" if rng.random() < 0.7 else None,
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
        "conversation_hash": g.hex(rng, 32),
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


def _mini_wildchat(g: Gen) -> dict[str, list]:
    (entry,) = g.files(WILDCHAT.repo)
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
                unit.append(_wc_row(g, rng, lang, [convo[0]] + fitting(lang)[1:]))
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
    return {entry["path"]: _place(_weave(valid, decoys, rng), entry["repo"], entry["revision"])}


def _full_wildchat(g: Gen, index: int):
    """Languages in about the shard's shares, 45% of the chats longer than one turn, 8% toxic
    and 4% redacted, now and then a first message seen before."""
    rng = _rng("full/wildchat")
    langs, weights = zip(("English", 50), ("Chinese", 24), ("Russian", 16), ("French", 4),
                         ("Spanish", 4), ("Japanese", 2))  # fmt: skip
    firsts = []
    for _ in range(WILDCHAT.rows):
        lang = rng.choices(langs, weights)[0]
        turns = min(30, int(rng.paretovariate(1.3))) if rng.random() < 0.45 else 1
        first = rng.choice(firsts) if firsts and rng.random() < 0.02 else None
        convo = _wc_conversation(g, rng, lang, turns, (5, 150), (20, 500), first_user=first)
        firsts = (firsts + [convo[0][1]])[-200:]
        yield _wc_row(g, rng, lang, convo, rng.random() < 0.08, rng.random() < 0.04)


# --------------------------------------------------------------------------- GSM8K, HumanEval, MBPP

GSM8K = Source(
    "gsm8k",
    "openai/gsm8k",
    (
        File(
            "main/test-00000-of-00001.parquet", "parquet", schema(question=S, answer=S), rows=1_319
        ),
    ),
)
HUMANEVAL = Source(
    "humaneval",
    "openai/openai_humaneval",
    (
        File(
            "openai_humaneval/test-00000-of-00001.parquet",
            "parquet",
            schema(task_id=S, prompt=S, canonical_solution=S, test=S, entry_point=S),
            rows=164,
        ),
    ),
)
_MBPP_COLUMNS = schema(
    source_file=S, task_id=pa.int32(), prompt=S, code=S, test_imports=pa.list_(S),
    test_list=pa.list_(S),
)  # fmt: skip
MBPP = Source(
    "mbpp",
    "google-research-datasets/mbpp",
    (File("sanitized/test-00000-of-00001.parquet", "parquet", _MBPP_COLUMNS, rows=257),),
)
GSM_NAMES = "Natalia Weng Betty Julie James Albert Ken Alexis Tina Mark".split()
GSM_THINGS = "clips apples stickers marbles cookies books pencils eggs shells cards".split()


def _gsm8k(g: Gen, count: int, step: int) -> list[dict]:
    """Every step-th real row, or made-up problems of the same form."""
    if real := g.gsm8k_rows():
        return [{"question": r["question"], "answer": r["answer"]} for r in real[::step][:count]]
    rng, rows = _rng("gsm8k"), []
    for _ in range(count):
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
    return rows


def _humaneval(g: Gen, count: int, step: int) -> list[dict]:
    if real := g.humaneval_rows():
        return [dict(r) for r in real[::step][:count]]
    rng, rows = _rng("humaneval"), []
    for i in range(count):
        name = f"{rng.choice(PY_VERBS)}_{rng.choice(PY_NOUNS)}"
        doc = _en_sentence(rng, 8, 20)
        prompt = (
            "from typing import List\n\n\n"
            f"def {name}(values: List[int], k: int) -> List[int]:\n"
            f'    """ {doc}\n    >>> {name}([1, 2, 3], {i})\n    [1, 2, 3]\n    """\n'
        )
        rows.append(
            {
                "task_id": f"HumanEval/{i * step}",
                "prompt": prompt,
                "canonical_solution": "    return [v for v in values if v != k]\n",
                "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n"
                f"    assert candidate([1, 2, 3], {i}) == [1, 2, 3]\n",
                "entry_point": name,
            }
        )
    return rows


def _mini_gsm8k(g: Gen) -> dict[str, list]:
    return {GSM8K.files[0].path: _gsm8k(g, 24, 55)}


def _mini_humaneval(g: Gen) -> dict[str, list]:
    rows = _humaneval(g, 12, 14)
    rows[1]["prompt"] = rows[1]["prompt"].rstrip("\n")  # a prompt without a final newline
    return {HUMANEVAL.files[0].path: rows}


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


def _mbpp_rows(rng: random.Random, tasks) -> list[dict]:
    """tasks: (description, function name, arguments, result, code or None)."""
    rows, task_id = [], 2
    for desc, name, args, result, code in tasks:
        task_id += rng.randint(1, 9)
        tests = [
            f"assert {name}{args} == {result}",
            f"assert {name}{args} is not None",
            f"assert str({name}{args}) == str({result})",
        ]
        rows.append(
            {
                "source_file": "Benchmark Questions Verification V2.ipynb",
                "task_id": task_id,
                "prompt": f"Write a python function to {desc}.",
                "code": code or f"def {name}(*args):\n    return {result}\n",
                "test_imports": ["import math"] if rng.random() < 0.25 else [],
                "test_list": tests,
            }
        )
    return rows


def _mini_mbpp(g: Gen) -> dict[str, list]:
    return {MBPP.files[0].path: _mbpp_rows(_rng("mbpp"), [(*t, None) for t in MBPP_TASKS])}


def _full_mbpp(g: Gen, index: int) -> list[dict]:
    """257 tasks made of HumanEval's functions."""
    rng, tasks, functions = _rng("full/mbpp"), [], _humaneval(g, 164, 1)
    for i in range(MBPP.rows):
        h = functions[i % len(functions)]
        doc = re.search(r'"""(.*?)(>>>|""")', h["prompt"], re.S)
        desc = re.split(r"(?<=\.)\s", " ".join((doc.group(1) if doc else h["entry_point"]).split()))
        code = re.sub(r'\n\s*""".*?"""', "", h["prompt"], flags=re.S) + h["canonical_solution"]
        args = str(([rng.randrange(100) for _ in range(rng.randint(2, 12))], rng.randrange(100)))
        result = str([rng.randrange(100) for _ in range(rng.randint(1, 8))])
        tasks.append((" ".join(desc[:2])[:300].rstrip("."), h["entry_point"], args, result, code))
    return _mbpp_rows(rng, tasks)


# --------------------------------------------------------------------------- NuminaMath

_NM_COLUMNS = schema(
    problem=S, solution=S, answer=S, problem_type=S, question_type=S, problem_is_valid=S,
    solution_is_valid=S, source=S, synthetic=B,
)  # fmt: skip
NUMINAMATH = Source(
    "numinamath",
    "AI-MO/NuminaMath-1.5",
    tuple(File(f"data/train-0000{i}-of-00003.parquet", "parquet", _NM_COLUMNS) for i in range(3)),
    rows=896_215,
)
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
    """A problem of lo to hi tokens made of the pieces above; at the full size (900k rows, sized
    by its plan) real sentences and one piece, without sizing."""
    if g.full:
        parts = [g.sentence(rng) for _ in range(rng.randint(1, 3))]
        return " ".join(parts + [rng.choice(NM_PIECES).format(A=7, B=12, C=3)])
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


def _nm_row(g: Gen, rng: random.Random, problem: str, source: str, synthetic: bool, steps=(2, 6)):
    ans = str(rng.randint(1, 500))
    return {
        "problem": problem,
        "solution": " ".join(g.sentence(rng) for _ in range(rng.randint(*steps)))
        + f" Hence the answer is $\\boxed{{{ans}}}$.",
        "answer": ans,
        "problem_type": rng.choice(NM_TYPES),
        "question_type": rng.choice(["math-word-problem", "proof", "MCQ"]),
        "problem_is_valid": "Yes",
        "solution_is_valid": "Yes",
        "source": source,
        "synthetic": synthetic,
    }


def _mini_numinamath(g: Gen) -> dict[str, list]:
    entries = g.files(NUMINAMATH.repo)
    rng = _rng("numinamath")
    valid = [[_nm_row(g, rng, _nm_problem(g, rng, 45, 175), "olympiads", False)] for _ in range(20)]
    decoys = []
    for _ in range(5):
        decoys.append([_nm_row(g, rng, _nm_problem(g, rng, 45, 175), "olympiads", True)])
    for src in ["cn_k12"] * 4 + ["aops_forum"] * 3 + ["amc_aime", "olympiads_ref", "number_theory"]:
        decoys.append([_nm_row(g, rng, _nm_problem(g, rng, 45, 175), src, False)])
    for text in ("Solve $x^2-5x+6=0$.", "Find $\\gcd(84, 36)$.", "Is $2^{11}-1$ prime?"):
        assert g.tokens(text) < 32
        decoys.append([_nm_row(g, rng, text, "olympiads", False)])
    for _ in range(3):
        decoys.append([_nm_row(g, rng, _nm_problem(g, rng, 215, 300), "olympiads", False)])
    units = _weave(valid, decoys, rng, spread=0.7)
    rows = _place(units, entries[0]["repo"], entries[0]["revision"])
    per = -(-len(rows) // len(entries))
    return {e["path"]: rows[i * per : (i + 1) * per] for i, e in enumerate(entries)}


# The sources of the problems, their shares of the rows and whether they are synthetic.
NM_SOURCES = [("cn_k12", 29, False), ("olympiads", 20, False), ("orca_math", 16, False),
              ("synthetic_math", 18, True), ("synthetic_amc", 5, True), ("aops_forum", 3.5, False),
              ("cn_contest", 3, False), ("amc_aime", 0.5, False), ("inequalities", 1, False),
              ("number_theory", 0.5, False), ("olympiads_ref", 0.5, False), ("metamath", 3, False)]  # fmt: skip


def _full_numinamath(g: Gen, index: int):
    rng = _rng(f"full/numinamath/{index}")
    names, weights, synthetic = zip(*NM_SOURCES)
    for _ in range(NUMINAMATH.rows // 3 + (index < NUMINAMATH.rows % 3)):
        k = rng.choices(range(len(names)), weights)[0]
        problem = _nm_problem(g, rng, 0, 0)
        # The three real files shrink from the first to the last: shorter solutions.
        yield _nm_row(
            g, rng, problem, names[k], synthetic[k] or rng.random() < 0.02, (2, 10 - index)
        )


# --------------------------------------------------------------------------- MiMo


# verl-style RL rows, one file a task. Not published: the order of the columns (here as the
# dataset's page lists them), of the prompt struct's fields (role before content, as verl's
# preprocessing scripts write it), webdev's extra_info besides instance_json, and the types of
# music's length and nvoice_want.
def _mimo_columns(**extra_info) -> pa.Schema:
    """webdev.parquet and music.parquet differ in the fields of extra_info only."""
    return schema(
        prompt=pa.list_(struct(role=S, content=S)), data_source=S, ability=S, agent_name=S,
        reward_model=struct(ground_truth=S, style=S), extra_info=struct(**extra_info),
    )  # fmt: skip


# Of instance_json only instance_id is known; the other fields give the file its real size.
_INSTANCE = struct(instance_id=S, category=S, checklist=pa.list_(S), query=S, rubric=pa.list_(S))
MIMO = Source(
    "mimo",
    "XiaomiMiMo/MiMo-V2.6-RL-oss",
    (
        File(
            "webdev.parquet",
            "parquet",
            _mimo_columns(index=I64, instance_json=S),
            {"extra_info.instance_json": _INSTANCE},
            rows=2_093,
        ),
        File(
            "music.parquet",
            "parquet",
            _mimo_columns(src_id=S, lang=S, length=I64, meter=S, bpm=I64, tag=S, nvoice_want=I64),
            rows=1_000,
        ),
    ),
)
WEB_KINDS = ["portfolio", "landing page", "restaurant", "weather dashboard", "photography gallery",
             "online bookstore", "fitness tracker", "conference"]  # fmt: skip
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


def _webdev_row(g: Gen, rng: random.Random, prompt: str, index: int = 0) -> dict:
    inst = {
        "instance_id": f"webdev_{_hex(rng, 12)}",
        "category": rng.choice(WEB_KINDS),
        "checklist": rng.sample(WEB_REQS, 2),
        "query": prompt,
    }
    # Drawn from the row's id, as nvoice_want below: the rows' other draws stay as they were.
    own = random.Random(inst["instance_id"])
    inst["rubric"] = [g.sentence(own, 6, 16) for _ in range(own.randint(3, 12))]
    return {
        "prompt": [{"role": "user", "content": prompt}],
        "data_source": "blackbox/webdev",
        "ability": "webdev",
        "agent_name": "tool_agent",
        "reward_model": {"ground_truth": "", "style": "model"},
        "extra_info": {"index": index, "instance_json": json.dumps(inst, ensure_ascii=False)},
    }


def _music_row(g: Gen, rng: random.Random, lang: str) -> dict:
    """A brief for a song in ABC notation; its style tag is in Chinese whatever the language."""
    meter = rng.choice(["4/4", "3/4", "6/8", "2/4"])
    bpm, bars = rng.randint(60, 160), rng.choice([16, 24, 32, 48])
    if lang == "zh":
        style = rng.choice(MUSIC_STYLES_ZH)
        theme = g.zh_sentence(rng)
        prompt = (
            f"請根據以下描述創作一首{style}風格的歌曲，用ABC記譜法寫出完整的樂譜，"
            f"包含X、T、M、L、Q、K等頭部字段。\n主題：{theme}\n拍號：{meter}\n"
            f"速度：{bpm} BPM\n長度：{bars}小節"
        )
        tag = style
    else:
        style = rng.choice(MUSIC_STYLES_EN)
        theme = g.sentence(rng, 6, 16)
        prompt = (
            f"Compose a {style} song in ABC notation from the following brief, with the X, T, "
            f"M, L, Q and K header fields.\nBrief: {theme}\nMeter: {meter}\nTempo: {bpm} BPM\n"
            f"Length: {bars} bars"
        )
        tag = MUSIC_STYLES_ZH[MUSIC_STYLES_EN.index(style)]
    assert g.tokens(prompt) <= 650
    src_id = f"m{_hex(rng, 10)}"
    return {
        "prompt": [{"role": "user", "content": prompt}],
        "data_source": "music",
        "ability": "music",
        "agent_name": "single_turn_agent",
        "reward_model": {"ground_truth": json.dumps({"meter": meter, "bpm": bpm}), "style": "rule"},
        "extra_info": {
            "src_id": src_id,
            "lang": lang,
            "length": bars,
            "meter": meter,
            "bpm": bpm,
            "tag": f"{tag}, 抒情",
            # Drawn from the row's id: the other rows' draws stay as they were without it.
            "nvoice_want": random.Random(src_id).choice([1, 1, 2]),
        },
    }


def _mini_mimo(g: Gen) -> dict[str, list]:
    entries = {Path(e["path"]).name: e for e in g.files(MIMO.repo)}
    web, music = entries["webdev.parquet"], entries["music.parquet"]
    rng = _rng("mimo")
    valid = [[_webdev_row(g, rng, _webdev_prompt(g, rng, 40, 560))] for _ in range(16)]
    decoys = [[_webdev_row(g, rng, _webdev_prompt(g, rng, 820, 2_400))] for _ in range(6)]
    web_rows = _place(_weave(valid, decoys, rng), web["repo"], web["revision"])
    for i, r in enumerate(web_rows):
        r["extra_info"]["index"] = i
    units = [[_music_row(g, rng, lang)] for lang in ["en", "zh"] * 8]
    rng.shuffle(units)
    music_rows = _place(units, music["repo"], music["revision"], first=len(web_rows))
    return {web["path"]: web_rows, music["path"]: music_rows}


def _full_mimo(g: Gen, index: int):
    """Webdev prompts of 49 to 12,173 characters (median 825); music in Chinese (504 rows) and
    English (496)."""
    rng = _rng(f"full/mimo/{index}")
    if index == 0:
        for i in range(MIMO.files[0].rows):
            tokens = _lognormal(rng, 190, 0.9, 60, 2_800)
            yield _webdev_row(g, rng, _webdev_prompt(g, rng, tokens * 4 // 5, tokens * 5 // 4), i)
        return
    langs = ["zh"] * 504 + ["en"] * 496
    rng.shuffle(langs)
    yield from (_music_row(g, rng, lang) for lang in langs)


# --------------------------------------------------------------------------- LongWriter

LONGWRITER = Source(
    "longwriter",
    "zai-org/LongWriter-6k",
    (File("long.jsonl", "jsonl", schema(messages=MESSAGES), rows=6_000),),
)
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


def _lw_row(g: Gen, rng: random.Random, lang: str, lo: int, hi: int, text=None, reply=(600, 2_000)):
    """A request for long writing of lo to hi tokens (``text`` if it fits) and the long answer."""
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
    answer = g.text(lang, rng, rng.randint(*reply), hi=400)
    return {
        "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    }


def _mini_longwriter(g: Gen) -> dict[str, list]:
    (entry,) = g.files(LONGWRITER.repo)
    rng = _rng("longwriter")
    valid, decoys = [], []
    for _ in range(11):
        valid.append([_lw_row(g, rng, "en", 10, 600)])
        valid.append([_lw_row(g, rng, "zh", 10, 600)])
    # Mixed scripts: under 10% CJK ideographs is English, 10% or more is Chinese.
    mixed = (
        ("en", "Write a 5000-word essay about the Chinese idiom 塞翁失馬 and what it can teach "
               "modern business leaders about risk, luck and long-term planning."),
        ("zh", "Please write a 10000-word story in Chinese about a programmer. 主題是程序員的"
               "一天，要求情節完整。"),
    )  # fmt: skip
    valid += [[_lw_row(g, rng, lang, 1, 750, text)] for lang, text in mixed]
    for lang in ("en", "zh"):
        for _ in range(2):
            decoys.append([_lw_row(g, rng, lang, 800, 1_400)])
    return {entry["path"]: _place(_weave(valid, decoys, rng), entry["repo"], entry["revision"])}


def _full_longwriter(g: Gen, index: int):
    rng = _rng("full/longwriter")
    for _ in range(LONGWRITER.rows):
        lang = rng.choice(["en", "zh"])
        yield _lw_row(g, rng, lang, 10, 500, reply=(2_800, 9_200))


# --------------------------------------------------------------------------- Gutenberg

# The eight books of BOOKS, in its order; each book is in a repository of its own.
GUTENBERG = Source(
    "gutenberg",
    None,
    tuple(
        File(path, "text")
        for path in "145-0.txt 1228.txt 1023-0.txt 3300-0.txt 23863-0.txt 23950-0.txt 23962-0.txt "
        "24264-0.txt".split()
    ),
)
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


def _books(g: Gen, books_dir=None, full=False) -> dict[str, bytes]:
    """The eight books: copies of the real files when books_dir holds them, else made up: the
    first book of each language in candidate order long enough for the full slot, or at the full
    size each as long as the real one."""
    paths = [Path(books_dir) / b["path"] for b in g.books] if books_dir else []
    if paths and all(p.is_file() for p in paths):
        return {b["path"]: p.read_bytes() for b, p in zip(g.books, paths)}
    first = {}
    for b in sorted(g.books, key=lambda b: _sha(f"{b['repo']}@{b['commit']}")):
        first.setdefault(b["lang"], b["ebook"])
    out = {}
    for b in g.books:
        target = 338_000 if first[b["lang"]] == b["ebook"] else 114_000
        if full:
            target = int(b["bytes"]) // (4 if b["lang"] == "en" else 3)
        out[b["path"]] = _book_text(g, b, target).encode("utf-8")
    return out


# --------------------------------------------------------------------------- make_sources

_ALL = (LONGBENCH, MRCR, SWE_SMITH, NEMOTRON, WILDCHAT, GSM8K, NUMINAMATH, HUMANEVAL, MBPP, MIMO,
        LONGWRITER, GUTENBERG)  # fmt: skip
FORMATS = MappingProxyType({s.name: s for s in _ALL})
# Per source: the miniature's plan (rows of every file), the full size's (rows of one file), and
# the rows in a parquet row group at each scale (None: one group).
PLANS = {
    "longbench-pro": (_mini_longbench, _full_longbench, None, None),
    "mrcr": (_mini_mrcr, _full_mrcr, 4, None),  # the full size as pandas writes it: one group
    "swe-smith": (_mini_swe, _full_swe, 8, 100),
    "nemotron-agentic": (_mini_nemotron, _full_nemotron, None, None),
    "wildchat": (_mini_wildchat, _full_wildchat, 16, 1_000),
    "gsm8k": (_mini_gsm8k, lambda g, i: _gsm8k(g, 1_319, 1), None, None),
    "numinamath": (_mini_numinamath, _full_numinamath, 8, 10_000),
    "humaneval": (_mini_humaneval, lambda g, i: _humaneval(g, 164, 1), None, None),
    "mbpp": (_mini_mbpp, _full_mbpp, None, None),
    "mimo": (_mini_mimo, _full_mimo, None, None),
    "longwriter": (_mini_longwriter, _full_longwriter, None, None),
}
_GEN: Gen | None = None  # the full size's, shared with the worker processes


def make_sources(
    src, tokenizer_path=None, books_dir=None, realdata=None, rev=None, books=None, scale="mini",
    jobs=1, only=None, limit=None,
) -> dict[str, float]:  # fmt: skip
    """Write every file pinned in REV (datasets) and BOOKS under src, at the given scale: "mini"
    (sized under tokenizer_path; books copied from books_dir when it holds them) or "full" (the
    real books of realdata; ``jobs`` processes). ``only`` limits it to some sources, ``limit`` to
    that many rows a file. Returns the seconds each file took."""
    global _GEN
    src, full = Path(src), scale == "full"
    g = Gen(tokenizer_path, realdata=realdata, rev=rev, books=books, full=full)
    names = [n for n in FORMATS if only is None or n in only]
    for name in names[:-1] if names[-1:] == ["gutenberg"] else names:
        pinned = [e["path"] for e in g.files(FORMATS[name].repo)]
        if pinned != [f.path for f in FORMATS[name].files]:
            raise AssertionError(f"{name}: REV pins {pinned}, FORMATS declares the files otherwise")
    times = {}
    if not full:
        for name in names:
            t0 = time.perf_counter()
            if name == "gutenberg":
                _write_books(g, src, _books(g, books_dir))
            else:
                plan, _, group, _ = PLANS[name]
                rows = plan(g)
                for file in FORMATS[name].files:
                    path = src / FORMATS[name].repo / file.path
                    _write_file(file, path, islice(rows[file.path], limit), False, group)
            times[name] = time.perf_counter() - t0
        return times
    for pool in ("en", "zh", "code", "sentences"):
        g.pool(pool)  # made once, before the workers fork
    _GEN = g
    work = [(n, i) for n in names for i in range(len(FORMATS[n].files) if n != "gutenberg" else 1)]
    work.sort(key=lambda job: -_FULL_WEIGHT.get(job[0], 0))
    args = [(str(src), name, i, limit) for name, i in work]
    if jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as ex:
            results = list(ex.map(_full_job, args))
    else:
        results = [_full_job(a) for a in args]
    return dict(results)


# About how long each source takes at the full size: the longest start first.
_FULL_WEIGHT = {"nemotron-agentic": 9, "longbench-pro": 8, "swe-smith": 7, "mrcr": 6,
                "numinamath": 5, "wildchat": 5, "longwriter": 3, "mimo": 1}  # fmt: skip


def _full_job(args) -> tuple[str, float]:
    src, name, index, limit = args
    t0, g, src = time.perf_counter(), _GEN, Path(src)
    if name == "gutenberg":
        _write_books(g, src, _books(g, g.realdata / "books" if g.real("books") else None, True))
        return name, time.perf_counter() - t0
    file, (_, plan, _, group) = FORMATS[name].files[index], PLANS[name]
    _write_file(
        file, src / FORMATS[name].repo / file.path, islice(plan(g, index), limit), True, group
    )
    return f"{name} {file.path}", time.perf_counter() - t0


def _write_books(g: Gen, src: Path, texts: dict[str, bytes]) -> None:
    for b in g.books:
        _write_file(
            File(b["path"], "text"), src / b["repo"] / b["path"], texts[b["path"]], False, None
        )


# --------------------------------------------------------------------------- census

# The README's slot table as the census counts it: (split, count, lo, hi, view, T, group);
# "longest" takes the candidates with the most tokens, the other views are build.py's.
_LB_STANDARD = (("8k", 3, 2), ("16k", 2, 3), ("32k", 3, 2), ("64k", 2, 3), ("128k", 3, 2))
SLOTS = {
    "longbench-pro": [("full", 6, 1, MILLION, "whole", 0, ("256k", g)) for g in ("English", "Chinese")]
    + [("standard", n, 1, 180_000, "whole", 0, (b, g))
       for b, en, zh in _LB_STANDARD for g, n in (("English", en), ("Chinese", zh))],
    "mrcr": [("full", 1, lo, hi, "whole", 0, None) for lo, hi in MRCR_FULL]
    + [("standard", 1, lo, hi, "whole", 0, None) for lo, hi in MRCR_STANDARD],
    "swe-smith": [("full", 4, 1, MILLION, "longest", 0, None)]
    + [("standard", 3, T * 3 // 4, T, "cut", T, None) for T in (131_072, 65_536, 32_768, 16_384)],
    "nemotron-agentic": [("standard", 3, 3_000, 12_000, "before-last", 0, e) for e in ("tool", "user")],
    "wildchat": [("standard", n, 64, 4_096, "before-last", 0, g)
                 for g, n in (("English", 6), ("Chinese", 9), ("Russian", 1), ("Japanese", 1))],
    "gsm8k": [("standard", 4, 1, 180_000, "whole", 0, None)],
    "numinamath": [("full", 4, 32, 200, "whole", 0, None), ("standard", 4, 32, 200, "whole", 0, None)],
    "humaneval": [("standard", 3, 1, 180_000, "whole", 0, None)],
    "mbpp": [("standard", 3, 1, 180_000, "whole", 0, None)],
    "mimo": [(split, n, 1, 700, "whole", 0, group) for split, n, group in (
        ("full", 3, ("webdev", None)), ("full", 2, ("music", "en")), ("full", 1, ("music", "zh")),
        ("standard", 4, ("webdev", None)), ("standard", 2, ("music", "zh")),
        ("standard", 1, ("music", "en")))],
    "longwriter": [(split, n, 1, 750, "whole", 0, g)
                   for split, n in (("full", 3), ("standard", 2)) for g in ("en", "zh")],
    "gutenberg": [("full", 1, 294_912, 393_216, "book", 393_216, g) for g in ("en", "zh")]
    + [("standard", 1, T * 3 // 4, T, "book", T, g) for T in (2_048, 16_384, 131_072)
       for g in ("en", "zh")],
}  # fmt: skip


def _user(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def _cjk_lang(text: str) -> str:
    cjk = sum(1 for ch in text if "\u3400" <= ch <= "\u4dbf" or "\u4e00" <= ch <= "\u9fff")
    return "zh" if text and cjk / len(text) >= 0.1 else "en"


def _twice(text: str):
    value = json.loads(text)
    return json.loads(value) if isinstance(value, str) else value


# Per source, a row as the build sees it: (group the slots filter on, uniqueness key, messages),
# or None for a row the build drops (toxic or redacted chats, other problem sources, ...).
_CANDIDATES = {
    "longbench-pro": lambda r, f: ((r["token_length"], r["language"]), r["context"],
                                   _user(r["context"] + "\n\n\n\n" + r["question_thinking"])),
    "mrcr": lambda r, f: (None, None, json.loads(r["prompt"])),
    "swe-smith": lambda r, f: (None, r["traj_id"], _twice(r["messages"])),
    "nemotron-agentic": lambda r, f: ((_before_last(r["messages"]) or [{}])[-1].get("role"), None,
                                      r["messages"]),
    "wildchat": lambda r, f: None if r["toxic"] or r["redacted"] or r["turn"] < 2 else (
        r["language"], r["conversation"][0]["content"], r["conversation"]),
    "gsm8k": lambda r, f: (None, None, _user(r["question"])),
    "numinamath": lambda r, f: (None, None, _user(r["problem"]))
    if r["source"] == "olympiads" and not r["synthetic"] else None,
    "humaneval": lambda r, f: (None, None, _user(
        "Complete the following Python function.\n\n```python\n" + r["prompt"]
        + ("" if r["prompt"].endswith("\n") else "\n") + "```")),
    "mbpp": lambda r, f: (None, None, _user(
        "You are an expert Python programmer, and here is your task: " + r["prompt"]
        + " Your code should pass these tests:\n\n" + "\n".join(r["test_list"]))),
    "mimo": lambda r, f: ((Path(f).stem, r["extra_info"].get("lang")), None, r["prompt"]),
    "longwriter": lambda r, f: (_cjk_lang(r["messages"][0]["content"]), None, r["messages"][:1]),
}  # fmt: skip


def _as_built(msgs: list) -> list | None:
    """The messages with each content of text parts as the build makes it, their texts joined;
    None when a part of another type makes the build drop the row."""
    out = []
    for m in msgs:
        if isinstance(parts := m.get("content"), list):
            if any(p.get("type") != "text" for p in parts):
                return None
            m = dict(m, content="".join(p["text"] for p in parts))
        out.append(m)
    return out


def _before_last(msgs: list) -> list:
    k = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    return msgs[:k] if k and msgs[k - 1]["role"] in ("user", "tool") else []


def census(src, tokenizer_path, rev=None, books=None, only=None) -> dict:
    """For each source: candidates, their view tokens, and per slot (label, count, fitting
    candidates, filled) when candidates are taken as the build takes them: the longest slot
    first, then in ascending sha256 of their id, each into the first open slot whose group and
    range it fits, a uniqueness key used once. Book views add up per-paragraph counts (exact for
    the byte tokenizer). ``only`` limits it to some source names."""
    tok, src, out = Tokens(tokenizer_path), Path(src), {}
    for name, slots in SLOTS.items():
        if only is not None and name not in only:
            continue
        cands, dropped = [], 0
        if name == "gutenberg":
            for b in read_books(books):
                ends = _book_ends(tok, (src / b["repo"] / b["path"]).read_bytes(), b["lang"])
                cands.append((_sha(f"{b['repo']}@{b['commit']}"), b["ebook"], b["lang"], ends))
        for n, e, record in () if name == "gutenberg" else _records(src, FORMATS[name], rev):
            if (c := _CANDIDATES[name](record, e["path"])) is None:
                dropped += 1
                continue
            group, unique, msgs = c
            if (msgs := _as_built(msgs)) is None:
                dropped += 1
                continue
            texts = [c if isinstance(c, str) else _compact(c) for m in msgs if (c := m["content"])]
            it = iter(tok.many(texts))
            counts = [next(it) if m["content"] else 0 for m in msgs]
            cands.append((_sha(f"{e['repo']}@{e['revision']}#{n}"), unique, group, (msgs, counts)))
        cands.sort(key=lambda c: c[0])
        tokens = [[_view(s, c[3]) if s[6] in (None, c[2]) else None for s in slots] for c in cands]
        out[name] = _fill(slots, cands, tokens, dropped)
    return out


def _records(src: Path, source: Source, rev):
    """(row number in the source, pin, record) over the source's files in pin order."""
    n = 0
    for e in (e for e in read_rev(rev) if e["repo"] == source.repo and e["kind"] == "dataset"):
        path = src / e["repo"] / e["path"]
        if path.suffix == ".parquet":
            records = pq.read_table(path).to_pylist()
        elif path.suffix == ".jsonl":
            records = map(json.loads, path.read_text(encoding="utf-8").splitlines())
        else:
            records = json.loads(path.read_text(encoding="utf-8"))
        for r in records:
            yield n, e, r
            n += 1


def _book_ends(tok, raw: bytes, lang: str) -> list[int]:
    """A book view's tokens at each paragraph end (instruction + text from the start marker)."""
    text = raw.decode("utf-8").replace("\r\n", "\n")
    marker = r"\*\*\*\s*START\s+OF\s+(?:THE|THIS)\s+PROJECT\s+GUTENBERG\s+E-?BOOK\b[^*]*\*\*\*"
    start = 0
    if m := re.search(marker, text, re.I):
        eol = text.find("\n", m.end())
        start = len(text) if eol < 0 else eol + 1
    while start < len(text) and text[start].isspace():
        start += 1
    end = len(text)
    for pat in (r"^[^\n]*\*\*\*\s*END\s+OF\s+(?:THE|THIS)\s+PROJECT\s+GUTENBERG",
                r"^End of (?:the Project Gutenberg|Project Gutenberg's)"):  # fmt: skip
        if e := re.compile(pat, re.I | re.M).search(text, start):
            end = min(end, e.start())
    while end > start and text[end - 1].isspace():
        end -= 1
    stops = [m.start() for m in re.finditer(r"(?<=[^\n])\n\n", text[:end])] + [end]
    stops = [p for p in stops if p > start]
    segs = [INSTR[lang] + "\n\n" + text[start : stops[0]]]
    segs += [text[a:b] for a, b in zip(stops, stops[1:])]
    cum, total = [], 0
    for n in tok.many(segs):
        cum.append(total := total + n)
    return cum


def _view(slot, data):
    """A slot's view tokens of a candidate, None when it has no such view."""
    view, T = slot[4], slot[5]
    if view == "book":
        return data[bisect.bisect_right(data, T) - 1] if data[0] <= T else None
    msgs, counts = data
    if view == "whole":
        return sum(counts)
    if view in ("before-last", "longest"):
        return sum(counts[: len(_before_last(msgs))]) if _before_last(msgs) else None
    best, total = None, 0
    for k, m in enumerate(msgs):  # cut(T): the longest prefix before an assistant turn within T
        if k >= 2 and m["role"] == "assistant" and msgs[k - 1]["role"] in ("user", "tool"):
            if total > T:
                break
            best = total
        total += counts[k]
    return best


def _fill(slots, cands, tokens, dropped) -> dict:
    fits = [[n is not None and s[2] <= n <= s[3] for n, s in zip(t, slots)] for t in tokens]
    filled, used = [0] * len(slots), set()
    scan = {"looked": 0, "unique": 0, "filter": 0, "range": 0, "dropped": dropped}
    for j, s in enumerate(slots):
        if s[4] == "longest":
            ranked = [(-t[j], c[0], i) for i, (c, t) in enumerate(zip(cands, tokens))]
            for _, _, i in sorted(r for r in ranked if fits[r[2]][j]):
                if filled[j] < s[1] and cands[i][1] not in used:
                    filled[j] += 1
                    used.add(cands[i][1])
    for i, c in enumerate(cands):
        open_slots = [j for j, s in enumerate(slots) if s[4] != "longest" and filled[j] < s[1]]
        if not open_slots:
            break
        scan["looked"] += 1
        if c[1] is not None and c[1] in used:
            scan["unique"] += 1
        elif (j := next((j for j in open_slots if fits[i][j]), None)) is not None:
            filled[j] += 1
            used.add(c[1])
        else:
            scan["filter" if all(tokens[i][j] is None for j in open_slots) else "range"] += 1
    views = [n for t in tokens for n in t if n is not None]
    rows = []
    for j, (split, count, lo, hi, view, T, group) in enumerate(slots):
        label = " ".join(str(x) for x in (split, *(group if isinstance(group, tuple) else [group]),
                                          f"{view}{f'({T})' if T else ''}", f"[{lo}, {hi}]") if x)  # fmt: skip
        rows.append((label, count, sum(f[j] for f in fits), filled[j]))
    return {
        "rows": len(cands) + dropped,
        "tokens": (min(views, default=0), max(views, default=0)),
        "scan": scan,
        "slots": rows,
    }


def format_census(result: dict) -> str:
    lines = []
    for name, info in result.items():
        lo, hi = info["tokens"]
        lines.append(f"{name}: {info['rows']} rows, view tokens {lo:,} .. {hi:,}")
        lines.append("    scan: " + ", ".join(f"{k} {v}" for k, v in info["scan"].items()))
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
    ap.add_argument("--full", action="store_true", help="the full size instead of the miniature")
    ap.add_argument("--jobs", type=int, default=2, help="processes for the full size")
    args = ap.parse_args(argv)
    dest: Path = args.dest
    dest.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tokenizer = args.tokenizer or make_tokenizer(dest / "tokenizer.json")
    books_dir = None
    if args.realdata and not args.synthetic_books:
        books_dir = args.realdata / "books"
    scale = "full" if args.full else "mini"
    make_sources(dest / "src", tokenizer, books_dir, args.realdata, scale=scale, jobs=args.jobs)
    write_pins(dest / "src", dest / "REV", dest / "BOOKS", tokenizer_path=tokenizer)
    print(f"wrote {dest / 'src'} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if args.census:
        print(format_census(census(dest / "src", tokenizer, dest / "REV", dest / "BOOKS")))
    return 0


if __name__ == "__main__":
    sys.exit(main())


def miniature(root):
    """The miniature build at ROOT/out, made once (with its sources, pins and tokenizer beside
    it) for the benchmarks in bench/ that score on it."""
    import build

    root = Path(root)
    out = root / "out"
    if not (out / "manifest.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        tok = make_tokenizer(root / "tokenizer.json")
        make_sources(root / "src", tok)
        write_pins(root / "src", root / "REV", root / "BOOKS", tokenizer_path=tok)
        argv = [str(root / "src"), str(tok), str(out), "--rev", str(root / "REV")]
        assert build.main([*argv, "--books", str(root / "BOOKS"), "--quiet"]) == 0
    return out
