#!/usr/bin/env python3
"""Build the kern-prompts splits (smoke, standard, full) from pinned source files.

    python build.py SRC TOKENIZER OUT [--rev FILE] [--books FILE] [--check SUMS] [--no-verify]
                    [--any-tokenizer] [--jobs N] [--quiet] [--only NAME[,NAME...]]

The file reads like the dataset card (README.md; docs/DESIGN.md maps it section by section and
says what to change to add a source). What defines the rows comes first: the splits,
the sources and their slots (the card's Composition table as data), the records, one small reader
per source, the views, the one selection engine and the plain token count. Then the exact
accelerations that make a full build take a minute instead of twenty (each marked as one and
checked against the definition in tests/), the outputs, the safe replacement of OUT, and the
command line. There is no randomness: candidates are ordered by the sha256 of their id, and the
first that fit a slot are taken.
"""

import os
import signal
import sys


def interrupted_at_start(signum, frame):
    os.write(2, b"error: interrupted while starting; nothing was written\n")
    os._exit(130)


if __name__ == "__main__":  # first of all: a signal while the imports run still ends in one line
    for _s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(_s, interrupted_at_start)

# ruff: noqa: E402 (the imports come after those handlers)
import argparse
import bisect
import ctypes
import errno
import fcntl
import hashlib
import heapq
import re
import stat
import tempfile
import textwrap
import threading
import time
import tomllib
import unicodedata
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

HERE = Path(__file__).resolve().parent
PACKAGES = ("tokenizers", "pyarrow", "orjson", "tqdm")  # the runtime pins of pyproject.toml
INF = float("inf")


# ================================================================================================
# The splits, and the sources with their slots: the card's tables as data (README "Splits",
# "Composition", "How rows are chosen").


@dataclass(frozen=True, slots=True)
class Split:
    name: str
    decode_cap: int  # the suggested decode cap of the card's Splits table
    use: str


SPLITS = (
    Split("smoke", 64, "after every change, about a minute"),
    Split("standard", 512, "the gate for a kernel swap"),
    Split("full", 16384, "precision or state-storage changes, releases"),
)
SPLIT_NAMES = tuple(s.name for s in SPLITS)

STANDARD_MAX = 180_000  # the largest standard prompt: standard runs on a 180k context
FULL_MAX = 1_000_000  # the largest full prompt


@dataclass(frozen=True, slots=True)
class Slot:
    """Takes `count` candidates whose fields equal `where` and whose view has prompt tokens in
    [lo, hi] (inclusive), for one split."""

    split: str
    count: int
    lo: int
    hi: int
    view: str = "whole"  # "whole", "before-last", "cut" or "book": see the views below
    T: int | None = None  # the token budget of a cut or book view
    longest: bool = False  # takes the candidates with the most tokens, not the first in order
    where: tuple[tuple[str, str], ...] = ()  # (candidate field, value) pairs

    @property
    def label(self):
        """How the manifest and the error messages name the slot."""
        where = " ".join(f"{k}={v}" for k, v in self.where)
        view = self.view + (f"({self.T})" if self.T else "")
        kind = "longest " if self.longest else ""
        text = f"{self.split} {kind}{self.count} {where} {view} [{self.lo}, {self.hi}]"
        return text.replace("  ", " ")


def slot(split, count, lo, hi, view="whole", T=None, longest=False, **where):
    return Slot(split, count, lo, hi, view, T, longest, tuple(where.items()))


# What a reader reads from a record, and of what kind. A kind is str, int or bool; [kind], a list
# of it; {name: kind, ...}, an object (a struct) with those fields; a tuple, any of its kinds
# (None: null or absent); Json(kind), text holding JSON of that kind; ANY, anything. Every record
# is checked against its source's declaration before it is used, and every parquet file's schema
# too; of a struct column, only the fields declared are read.
ANY = object()


@dataclass(frozen=True, slots=True)
class Json:
    kind: object


# An OpenAI content part: `text` is in a part of type "text" only, where it must be text.
PART = {"type": str, "text": (str, None)}
CONTENT = (str, None, {}, [PART])  # text, null, a structured object, or a list of content parts
TOOL_CALL = {
    "id": (str, None),
    "type": (str, None),
    "function": {"name": str, "arguments": (str, None, {}, [ANY])},
}
MESSAGE = {  # an OpenAI chat message as the sources hold it
    "role": str,
    "content": CONTENT,
    "name": (str, None),
    "tool_calls": ([TOOL_CALL], None),
    "tool_call_id": (str, None),
}
MESSAGES = [MESSAGE]


@dataclass(frozen=True, slots=True)
class Source:
    """A row of the card's Composition table, with the slots that make its rows."""

    name: str  # the --only name
    repo: str | None  # None: one repository per book, pinned in BOOKS
    title: str  # the Composition table's source column
    covers: str  # what it covers
    short: str  # the name in the license table
    license: str
    slots: tuple[Slot, ...]
    groups: tuple[str, ...] = ()  # smoke takes the shortest standard row of each group
    fields: dict = field(default_factory=dict)  # what its reader reads (see the kinds above)
    file_fields: dict = field(default_factory=dict)  # pinned path -> more fields read there
    # Its reading holds much at once (a whole file, a 1.3 GB row group): not read beside another
    # source's selection (see ReadAhead), so that the peaks do not add up.
    read_alone: bool = False

    def fields_of(self, pin):
        return self.fields | self.file_fields.get(pin.path, {})


LONGBENCH_STANDARD = (("8k", 3, 2), ("16k", 2, 3), ("32k", 3, 2), ("64k", 2, 3), ("128k", 3, 2))
MRCR_FULL = ((180_001, 262_144), (262_145, 393_216), (393_217, 524_288), (524_289, 655_360),
             (655_361, 786_432), (786_433, FULL_MAX))  # fmt: skip
MRCR_STANDARD = ((8_192, 16_384), (16_385, 32_768), (32_769, 65_536), (65_537, 131_072),
                 (131_073, STANDARD_MAX))  # fmt: skip
SWE_CUT_T = (131_072, 65_536, 32_768, 16_384)  # a cut(T) slot takes [3T/4, T]
BOOK_FULL = (393_216, 294_912)  # (T, lo)
BOOK_STANDARD = ((2_048, 1_536), (16_384, 12_288), (131_072, 98_304))
LONGBENCH_JOINER = "\n\n\n\n"  # between context and question, as the LongBench-Pro authors send it
GUTENBERG_LICENSE = (
    "public domain in the USA; the Project Gutenberg header and footer were removed, so no "
    "Project Gutenberg trademark is used"
)

SOURCES = {s.name: s for s in (
    Source(
        "longbench-pro", "caskcsg/LongBench-Pro", "caskcsg/LongBench-Pro",
        "natural long documents, English and Chinese; `question_thinking`, so the model reasons "
        "over the deep context", "LongBench-Pro", "Apache-2.0",
        slots=tuple(
            [slot("full", 6, 1, FULL_MAX, bucket="256k", group=g) for g in ("English", "Chinese")]
            + [slot("standard", n, 1, STANDARD_MAX, bucket=bucket, group=group)
               for bucket, en, zh in LONGBENCH_STANDARD
               for group, n in (("English", en), ("Chinese", zh))]
        ),
        groups=("English", "Chinese"),
        fields={"context": str, "question_thinking": str, "language": str, "token_length": str},
        read_alone=True,
    ),
    Source(
        "mrcr", "openai/mrcr", "openai/mrcr (2needle)",
        "multi-turn conversations up to 1M tokens", "MRCR", "MIT",
        slots=tuple(slot("full", 1, lo, hi) for lo, hi in MRCR_FULL)
        + tuple(slot("standard", 1, lo, hi) for lo, hi in MRCR_STANDARD),
        fields={"prompt": Json(MESSAGES)},
        read_alone=True,
    ),
    Source(
        "swe-smith", "SWE-bench/SWE-smith-trajectories", "SWE-bench/SWE-smith-trajectories (xml)",
        "coding-agent trajectories cut before an assistant turn at 16k / 32k / 64k / 128k; the "
        "four longest whole in full", "SWE-smith-trajectories", "MIT",
        slots=(slot("full", 4, 1, FULL_MAX, view="before-last", longest=True),)
        + tuple(slot("standard", 3, T * 3 // 4, T, view="cut", T=T) for T in SWE_CUT_T),
        # messages: JSON text of the messages, or in some rows JSON text of that text (two layers)
        fields={"messages": Json((MESSAGES, Json(MESSAGES))), "traj_id": str},
    ),
    Source(
        "nemotron-agentic", "nvidia/Nemotron-Agentic-v1",
        "nvidia/Nemotron-Agentic-v1 (interactive_agent)", "tool calling with tool schemas",
        "Nemotron-Agentic-v1", "CC-BY-4.0",
        slots=tuple(slot("standard", 3, 3_000, 12_000, view="before-last", ends=role)
                    for role in ("tool", "user")),
        fields={"messages": MESSAGES, "tools": ([{}], None)},
    ),
    Source(
        "wildchat", "allenai/WildChat-4.8M", "allenai/WildChat-4.8M",
        "real multi-turn chats: 6 English, 9 Chinese, 1 Russian, 1 Japanese; not toxic, not "
        "redacted", "WildChat-4.8M", "ODC-BY",
        slots=tuple(slot("standard", n, 64, 4_096, view="before-last", group=g)
                    for g, n in (("English", 6), ("Chinese", 9), ("Russian", 1), ("Japanese", 1))),
        groups=("English", "Chinese"),
        fields={"conversation": [{"role": str, "content": (str, None)}], "language": str,
                "toxic": bool, "redacted": bool, "turn": int},
    ),
    Source(
        "gsm8k", "openai/gsm8k", "openai/gsm8k", "grade-school math", "GSM8K", "MIT",
        slots=(slot("standard", 4, 1, STANDARD_MAX),),
        fields={"question": str},
    ),
    Source(
        "numinamath", "AI-MO/NuminaMath-1.5", "AI-MO/NuminaMath-1.5 (olympiads)",
        "competition math, long reasoning", "NuminaMath-1.5", "Apache-2.0",
        slots=(slot("full", 4, 32, 200), slot("standard", 4, 32, 200)),
        fields={"problem": str, "source": str, "synthetic": bool},
    ),
    Source(
        "humaneval", "openai/openai_humaneval", "openai/openai_humaneval",
        "function completion", "HumanEval", "MIT",
        slots=(slot("standard", 3, 1, STANDARD_MAX),),
        fields={"prompt": str},
    ),
    Source(
        "mbpp", "google-research-datasets/mbpp", "google-research-datasets/mbpp (sanitized)",
        "short programs with tests", "MBPP", "CC-BY-4.0",
        slots=(slot("standard", 3, 1, STANDARD_MAX),),
        fields={"prompt": str, "test_list": [str]},
    ),
    Source(
        "mimo", "XiaomiMiMo/MiMo-V2.6-RL-oss", "XiaomiMiMo/MiMo-V2.6-RL-oss (webdev, music)",
        "whole static websites (long code output); ABC music notation from Chinese and English "
        "briefs", "MiMo-V2.6-RL-oss", "Apache-2.0",
        slots=(
            slot("full", 3, 1, 700, group="webdev"),
            slot("full", 2, 1, 700, group="music", lang="en"),
            slot("full", 1, 1, 700, group="music", lang="zh"),
            slot("standard", 4, 1, 700, group="webdev"),
            slot("standard", 2, 1, 700, group="music", lang="zh"),
            slot("standard", 1, 1, 700, group="music", lang="en"),
        ),
        groups=("webdev", "music"),  # the file a row is in
        fields={"prompt": MESSAGES},
        file_fields={"music.parquet": {"extra_info": {"lang": str}}},
    ),
    Source(
        "longwriter", "zai-org/LongWriter-6k", "zai-org/LongWriter-6k",
        "requests for very long writing, English and Chinese (prompts only)", "LongWriter-6k",
        "Apache-2.0",
        slots=tuple(slot(split, n, 1, 750, group=g)
                    for split, n in (("full", 3), ("standard", 2)) for g in ("en", "zh")),
        groups=("en", "zh"),
        fields={"messages": MESSAGES},
    ),
    Source(
        "gutenberg", None, "Project Gutenberg",
        "continue a book: English (Eliot, Darwin, Dickens, Smith) and Chinese (水滸傳, 三國志演義, "
        "西遊記, 紅樓夢)", "Project Gutenberg texts", GUTENBERG_LICENSE,
        slots=tuple(slot("full", 1, BOOK_FULL[1], BOOK_FULL[0], view="book", T=BOOK_FULL[0],
                         group=g) for g in ("en", "zh"))
        + tuple(slot("standard", 1, lo, T, view="book", T=T, group=g)
                for T, lo in BOOK_STANDARD for g in ("en", "zh")),
        groups=("en", "zh"),
    ),
)}  # fmt: skip

BOOK_INSTRUCTION = {
    "en": "Continue the following text from where it stops.",
    "zh": "請從這段文字停下的地方接著寫下去。",
}


class BuildError(Exception):
    """A problem with the user's inputs or environment: printed as one line, no traceback."""


class Unusable(Exception):
    """A well-formed row that holds no prompt this dataset can use: its candidate is dropped and
    counted under the reason (the exception's text) for the message of a slot left short."""


# ================================================================================================
# Records


@dataclass(slots=True, eq=False)
class Pin:
    """A line of REV or BOOKS, and what verification found of its file."""

    where: str  # "FILE:LINE"
    kind: str  # "dataset" or "model"; books: "book"
    repo: str
    revision: str  # a book's commit
    path: str
    bytes: int | None  # None: pinned "-"
    sha256: str | None
    lang: str | None = None  # books
    title: str = ""  # books
    file: Path | None = None  # SRC/<repo>/<path>, set by verify
    size: int = 0  # its size on disk
    actual_sha256: str | None = None  # computed by verify unless --no-verify


@dataclass(slots=True, eq=False)
class Book:
    """A book's text without the Project Gutenberg boilerplate, for the book view."""

    lang: str
    text: str
    start: int  # where the body starts
    ends: list  # the paragraph ends of the body, its end last
    # Counting state of the book view (an acceleration, see book_end):
    prompt: str | None = None  # instruction + the whole body
    cuts: list = field(default_factory=list)  # safe cut positions in prompt
    cum: list = field(default_factory=list)  # tokens of prompt up to each counted cut
    pends: list = field(default_factory=list)  # paragraph ends as positions in prompt
    plain: list | None = None  # tokens of prompt at each of pends (book_view_plain)


@dataclass(slots=True, eq=False)
class Candidate:
    """A row of a source, or a book, that a slot may take."""

    id: str  # "<repo>@<revision>#<row>"; a book: "<repo>@<commit>"
    messages: list | None = None  # OpenAI messages (README "Schema"); None until loaded
    tools: str | None = None  # the row's OpenAI tool schemas as compact JSON
    turns: int | None = None  # messages of the source conversation, when more than `messages`
    unique: object = None  # the uniqueness rule's key: a second candidate with it is skipped
    unusable: str | None = None  # why its row holds no prompt, found when it was loaded
    group: str | None = None  # language, file or kind: slots and smoke groups filter on it
    bucket: str | None = None  # LongBench-Pro `token_length`
    ends: str | None = None  # Nemotron: the role of the turn the before-last view ends with
    lang: str | None = None  # MiMo music `extra_info.lang`
    row: int = 0  # its index in the source's files, for `load`
    load: Callable | None = None  # fills in `messages` (and `tools`) of a list of candidates
    at: tuple = ()  # where `load` finds it: (file, byte offset, length) for JSON sources
    size: int = 0  # bytes `load` reads for it
    book: Book | None = None
    # Counting state (accelerations, see below):
    bound: float = INF  # an upper bound on the prompt tokens of any view
    counts: dict = field(default_factory=dict)  # message index -> its exact tokens
    runs: dict = field(default_factory=dict)  # message index -> its runs of non-whitespace
    mbytes: list | None = None  # the byte bound of each message before the last assistant turn
    key: str = field(init=False)  # sha256 of the id: the order candidates are looked at in

    def __post_init__(self):
        self.key = sha256_hex(self.id)


@dataclass(slots=True, eq=False)
class View:
    """A slot's view of a candidate: the messages of the row, and its prompt tokens (exact
    when at most the limit asked for; otherwise some number above it)."""

    messages: list
    tokens: int
    suffix: str = ""  # appended to the id in `source`: ":<k>", or a book's "#<start>-<end>"


@dataclass(slots=True, eq=False)
class Row:
    """A chosen row: a candidate's view in a slot."""

    name: str  # the source
    slot: Slot
    candidate: Candidate
    messages: list
    tokens: int
    source: str  # the `source` column

    @property
    def order(self):
        return (self.tokens, self.candidate.key)


@dataclass(slots=True, eq=False)
class Fill:
    """A slot being filled: the rows it took and how many candidates failed each test."""

    slot: Slot
    rows: list = field(default_factory=list)
    rejected: Counter = field(default_factory=Counter)

    @property
    def open(self):
        return len(self.rows) < self.slot.count


def sha256_hex(text):
    return hashlib.sha256(text.encode()).hexdigest()


# ================================================================================================
# Pin files: the grammar is written down once, in docs/building.md "The pin files"; fetch.sh follows
# the same one, and tests/pin_lines.py is the table of lines both are tested on.

PIN_COLUMNS = {
    "rev": ("kind", "repo", "revision", "path", "bytes", "sha256"),
    "books": ("ebook", "lang", "repo", "revision", "path", "bytes", "sha256", "title"),
}
# Nowhere in a line, comments included: a control character but tab, or a space other than space
# and tab (Python's \s is what str.isspace calls white space).
PIN_FORBIDDEN = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]|[^\S \t]")


PIN_CAP = (
    64 << 10
)  # REV and BOOKS: the pin grammar's limit (docs/building.md "The pin files"), as in fetch.sh
SUMS_CAP = 64 << 20  # SHA256SUMS: a line per row
TOKENIZER_CAP = 1 << 30  # the pinned tokenizer.json is 12 MB


def file_kind(mode):
    """What a path that is not a regular file is, in the words of the error messages."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"))  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def read_named(path, what, cap):
    """The bytes of a file a user named: a regular file of at most `cap` bytes, else one error
    saying what the path is. Opened without blocking (a FIFO) and checked once open (the name
    may change in between); never read past the cap (/dev/zero)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise BuildError(f"cannot read {what}{path}: it does not exist") from None
    except OSError as e:
        raise BuildError(f"cannot read {what}{path}: {e.strerror or e}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise BuildError(f"cannot read {what}{path}: it is {file_kind(mode)}, not a file")
        chunks, size = [], 0
        while size <= cap and (chunk := os.read(fd, min(1 << 24, cap + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    except OSError as e:
        raise BuildError(f"cannot read {what}{path}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > cap:
        size = next(
            f"{cap >> b} {u}" for b, u in ((30, "GiB"), (20, "MiB"), (10, "KiB")) if cap >> b
        )
        raise BuildError(f"cannot read {what}{path}: it is larger than {size}")
    return data


def unsafe_reason(value):
    """Why a pinned repo, revision or path may not become a path under SRC (None if it may)."""
    parts = value.split("/")
    if value.startswith("/"):
        return "is absolute"
    if ".." in parts:
        return "has a '..' component"
    if "" in parts or "." in parts:
        return "has an empty or '.' component"
    return None


def pin_line(where, raw, kind):
    """A line of a pin file, as bytes without its LF -> a Pin, or None for a blank or comment line.
    A line the grammar refuses is a BuildError naming it."""
    raw = raw.removesuffix(b"\r")  # a CRLF line end
    if b"\0" in raw:  # before the UTF-8, in the order fetch.sh finds them
        raise BuildError(f"{where}: {pin_char_problem(chr(0))}")
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BuildError(
            f"{where}: not valid UTF-8 (byte {raw[e.start]:#04x} at byte {e.start + 1} of the line);"
            " a pin file is UTF-8 text"
        ) from None
    if bad := PIN_FORBIDDEN.search(line):
        raise BuildError(f"{where}: {pin_char_problem(bad.group())}")
    fields = line.split("#", 1)[0].split()  # only space and tab are left to split on
    if not fields:
        return None
    columns = PIN_COLUMNS[kind]
    if len(fields) < len(columns) or (kind == "rev" and len(fields) != len(columns)):
        more = " (the title is the rest of the line)" if kind == "books" else ""
        raise BuildError(
            f"{where}: expected columns {' '.join(columns)}{more}, found {len(fields)}"
        )
    value = dict(zip(columns, fields))
    if kind == "rev" and value["kind"] not in ("dataset", "model"):
        raise BuildError(f"{where}: kind must be dataset or model, not {value['kind']!r}")
    if kind == "books" and not re.fullmatch(r"[0-9]+", value["ebook"]):
        raise BuildError(f"{where}: ebook must be a number, not {value['ebook']!r}")
    if kind == "books" and value["lang"] not in BOOK_INSTRUCTION:
        raise BuildError(
            f"{where}: lang must be {' or '.join(BOOK_INSTRUCTION)}, not {value['lang']!r}"
        )
    if not re.fullmatch(r"-|[0-9]{1,18}", value["bytes"]):
        raise BuildError(f"{where}: bytes must be a number or -, not {value['bytes']!r}")
    if not re.fullmatch(r"-|[0-9a-f]{64}", value["sha256"]):
        raise BuildError(f"{where}: sha256 must be 64 lowercase hex digits or -")
    for name in ("repo", "revision", "path"):
        if why := unsafe_reason(value[name]):
            raise BuildError(f"{where}: {name} {value[name]!r} {why}")
        try:
            os.fsencode(value[name])
        except UnicodeEncodeError:  # a C locale without UTF-8 mode: file names are ASCII
            raise BuildError(
                f"{where}: {name} {value[name]!r} cannot be a file name in this locale (file "
                f"names are {sys.getfilesystemencoding()}); run under a UTF-8 locale "
                "(LC_ALL=C.UTF-8) or with PYTHONUTF8=1"
            ) from None
    return Pin(
        where=where,
        kind=value.get("kind", "book"),
        repo=value["repo"],
        revision=value["revision"],
        path=value["path"],
        bytes=None if value["bytes"] == "-" else int(value["bytes"]),
        sha256=None if value["sha256"] == "-" else value["sha256"],
        lang=value.get("lang"),
        title=" ".join(fields[len(columns) - 1 :]) if kind == "books" else "",
    )


def pin_char_problem(char):
    """What is wrong with a character PIN_FORBIDDEN found (fetch.sh says the same)."""
    code = f"U+{ord(char):04X}"
    if char == "\r":
        return f"{code}, a carriage return, inside the line (a CRLF line end is the only place for one)"
    if char.isspace():
        return f"{code}, a space other than space and tab (the only column separators)"
    return f"{code}, a control character (a pin line holds none but tab)"


def claim_names(pins, claimed):
    """Refuse a pin that needs a name on disk another pin needs: fetch.sh writes SRC/<repo>/<path>
    by way of <that>.part, so one pinned file may not be another's .part or a directory on its way.
    `claimed` maps each name taken to (its role, the pin), and is filled in."""
    roles = {"file": "a pinned file", "part": "a partial download", "directory": "a directory"}
    for pin in pins:
        rel = f"{pin.repo}/{pin.path}"
        parts = rel.split("/")
        names = [(rel, "file"), (rel + ".part", "part")]
        names += [("/".join(parts[:i]), "directory") for i in range(1, len(parts))]
        for name, role in names:
            old_role, old = claimed.get(name, (None, None))
            if old is None or role == old_role == "directory":
                continue
            old_rel = f"{old.repo}/{old.path}"
            if role == old_role == "file":
                raise BuildError(f"{pin.where}: destination {rel} is already pinned at {old.where}")
            raise BuildError(
                f"{pin.where}: destination {rel} collides on disk with {old_rel}, pinned at "
                f"{old.where} ({name} would be both {roles[role]} and {roles[old_role]})"
            )
        for name, role in names:
            claimed.setdefault(name, (role, pin))


def read_pins(path, kind, claimed=None):
    """REV or BOOKS -> Pins in file order. A line the grammar refuses, or one needing a name on
    disk that an earlier pin needs (here, or in the pin file read before with the same `claimed`),
    is an error."""
    lines = read_named(path, "pin file ", PIN_CAP).split(b"\n")
    pins = [p for n, raw in enumerate(lines, 1) if (p := pin_line(f"{path}:{n}", raw, kind))]
    claim_names(pins, {} if claimed is None else claimed)
    return pins


def source_files(source, rev_pins, book_pins):
    """The pins a source reads, in pin-file order (its rows are numbered in this order)."""
    if source.repo is None:
        files = book_pins
    else:
        files = [p for p in rev_pins if p.kind == "dataset" and p.repo == source.repo]
    if not files:
        where = "BOOKS" if source.repo is None else "REV"
        raise BuildError(f"no pinned files for source {source.name} in {where}")
    if source.repo is not None and len({p.revision for p in files}) != 1:
        raise BuildError(f"REV pins {source.repo} at more than one revision")
    return files


def verify(pins, src, hash_files, quiet):
    """Check every pinned file is present with its size now, and (unless --no-verify) its sha256
    in a thread while the sources are read: hashlib lets go of the GIL, so the hashing costs
    little wall time. Returns `verified(wait=True)`, which raises the first mismatch found."""
    for pin in pins:
        pin.file = Path(src) / pin.repo / pin.path
        try:
            st = pin.file.stat()
        except (FileNotFoundError, NotADirectoryError):
            st = None
        except OSError as e:
            raise BuildError(f"cannot read {pin.file}: {e.strerror or e}") from None
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise BuildError(
                f"source file {pin.file} is {file_kind(st.st_mode)}, not a file; move it away "
                "and fetch it again with fetch.sh"
            )
        if st is None:
            raise BuildError(
                f"missing source file {pin.file}; download the sources with "
                f"`mkdir -p {src} && (cd {src} && bash {HERE / 'fetch.sh'})`"
            )
        pin.size = st.st_size
        if pin.bytes is not None and pin.size != pin.bytes:
            state = "truncated" if pin.size < pin.bytes else "too long"
            raise BuildError(
                f"{pin.file}: {pin.size} bytes, expected {pin.bytes} ({state}); "
                "fetch it again with fetch.sh"
            )
    todo = pins if hash_files else []
    failed = []

    def hash_files_in_order():
        with tqdm(total=sum(p.size for p in todo), unit="B", unit_scale=True, desc="verify",
                  disable=quiet, file=sys.stderr) as bar:  # fmt: skip
            for pin in todo:
                try:
                    pin.actual_sha256 = sha256_file(pin.file, bar.update)
                except OSError as e:
                    failed.append(BuildError(f"cannot read {pin.file}: {e.strerror or e}"))
                    return
                if pin.sha256 is not None and pin.actual_sha256 != pin.sha256:
                    failed.append(BuildError(
                        f"{pin.file}: sha256 {pin.actual_sha256}, expected {pin.sha256}; "
                        "fetch it again with fetch.sh"
                    ))  # fmt: skip
                    return

    hashing = threading.Thread(target=hash_files_in_order, name="verify", daemon=True)
    hashing.start()

    def verified(wait=True):
        if wait:
            hashing.join()
        if failed:
            raise failed[0]

    return verified


def sha256_file(path, progress=lambda n: None):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
            progress(len(block))
    return h.hexdigest()


# ================================================================================================
# Reading: checking what a record holds, and the three formats the sources come in.


NAMES = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "text",
         list: "a list", dict: "an object"}  # fmt: skip


def describe(value):
    """What a value is, in the words of the error messages."""
    return NAMES.get(type(value), type(value).__name__)


def kind_name(kind):
    """What a kind expects, in the same words."""
    if kind is ANY:
        return "anything"
    if isinstance(kind, tuple):
        return " or ".join(dict.fromkeys(kind_name(k) for k in kind))
    if isinstance(kind, Json):
        return "text holding JSON"
    if kind is None:
        return "null"
    # str, int or bool; else an instance: [kind] is a list, {...} an object
    return NAMES[kind if isinstance(kind, type) else type(kind)]


def fits(value, kind):
    """Whether `value` (parsed JSON, or an Arrow value as Python) is of `kind`: the fast test,
    run on every record (mismatch says what is wrong when it is not)."""
    return checker(kind)(value)


CHECKERS = {}  # id of a kind -> (the kind, a function testing a value against it)


def checker(kind):
    """A kind compiled into one function, once: the declarations are tested millions of times."""
    if (known := CHECKERS.get(id(kind))) is not None and known[0] is kind:
        return known[1]
    form = kind.__class__
    if kind is ANY:
        test = lambda v: True
    elif kind in (str, int, bool):  # type(True) is bool, not int
        test = lambda v, t=kind: type(v) is t
    elif form is tuple:
        # Alternatives that a type decides (str, an object, a list of anything) are one set.
        types = {k if k in (str, int, bool) else dict if k == {} else list for k in kind
                 if k in (str, int, bool) or k == {} or k == [ANY]}  # fmt: skip
        tests = [checker(k) for k in kind if k is not None and k not in (str, int, bool, {}, [ANY])]
        nullable = None in kind

        def test(v):
            if v is None:
                return nullable
            if type(v) in types:
                return True
            for t in tests:
                if t(v):
                    return True
            return False

    elif form is list:
        item = checker(kind[0])
        test = lambda v: type(v) is list and all(map(item, v))
    elif form is dict:
        fields = [(key, checker(sub)) for key, sub in kind.items()]

        def test(v):
            if type(v) is not dict:
                return False
            for key, t in fields:
                if not t(v.get(key)):
                    return False
            return True

    elif form is Json:
        test = lambda v: type(v) is str
    else:
        raise AssertionError(kind)
    CHECKERS[id(kind)] = (kind, test)
    return test


MESSAGE_FITS = checker(MESSAGE)
NONE = type(None)
TEXT_OR_NULL = (str, NONE)


def mismatch(value, kind, name):
    """None if `value` is of `kind`; else what is wrong, naming the field ("no field 'x'",
    "field 'x[2].role' is a number, expected text")."""
    if fits(value, kind):
        return None
    if isinstance(kind, tuple):
        if value is None:
            return f"no field {name!r}"
        alternatives = [k for k in kind if k is not None]
        # A list or an object is of the one alternative of its form, if there is one: what is
        # wrong is inside it ("field 'x.content[0].type' is a number, expected text").
        same = [k for k in alternatives if type(k) in (list, dict) and type(k) is type(value)]
        if len(alternatives) == 1 or len(same) == 1:
            return mismatch(value, (same or alternatives)[0], name)
        return wrong(value, kind, name)
    if value is None:
        return f"no field {name!r}"
    if isinstance(kind, list) and isinstance(value, list):
        return next(p for i, v in enumerate(value) if (p := mismatch(v, kind[0], f"{name}[{i}]")))
    if isinstance(kind, dict) and isinstance(value, dict):
        return next(
            p for key, sub in kind.items() if (p := mismatch(value.get(key), sub, f"{name}.{key}"))
        )
    return wrong(value, kind, name)


def wrong(value, kind, name):
    return f"field {name!r} is {describe(value)}, expected {kind_name(kind)}"


RECORDS = {}  # id of a reader's fields -> (the fields, the kind of its records)


def record_kind(fields):
    """The kind of a reader's records, made once per `fields`: it is tested on every row."""
    if (known := RECORDS.get(id(fields))) is None or known[0] is not fields:
        kind = {n: [ANY] if k is MESSAGES else k for n, k in fields.items()}
        known = RECORDS[id(fields)] = (fields, kind)
    return known[1]


def check_record(record, fields, where):
    """Every declared field of the record is there, of its kind; else one clear error.
    Messages are checked one by one where they are read, by openai_message."""
    if type(record) is not dict:
        raise BuildError(f"{where}: the row is {describe(record)}, not an object")
    kind = record_kind(fields)
    if not fits(record, kind):
        name, sub = next((n, k) for n, k in kind.items() if not fits(record.get(n), k))
        raise BuildError(f"{where}: {mismatch(record.get(name), sub, name)}")


def arrow_mismatch(t, kind, name):
    """None if Arrow type `t` can hold values of `kind`; else what cannot, naming the field
    ("'conversation.role' is int64, expected text")."""
    if kind is ANY:
        return None
    if isinstance(kind, tuple):
        alternatives = [k for k in kind if k is not None]
        if any(arrow_mismatch(t, k, name) is None for k in alternatives):
            return None
        if len(alternatives) == 1:
            return arrow_mismatch(t, alternatives[0], name)
    elif isinstance(kind, Json) or kind is str:
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return None
    elif (kind is int and pa.types.is_integer(t)) or (kind is bool and pa.types.is_boolean(t)):
        return None
    elif isinstance(kind, list) and (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return None if kind[0] is ANY else arrow_mismatch(t.value_type, kind[0], name)
    elif isinstance(kind, dict) and pa.types.is_struct(t):
        for key, sub in kind.items():
            index = t.get_field_index(key)
            if index < 0 and not (isinstance(sub, tuple) and None in sub):
                return f"{name!r} has no field {key!r}"
            if index >= 0 and (
                problem := arrow_mismatch(t.field(index).type, sub, f"{name}.{key}")
            ):
                return problem
        return None
    return f"{name!r} is {t}, expected {kind_name(kind)}"


def kind_below(kind, parts):
    """The kind that `kind` declares at a path of field names below it (list levels passed
    through): ANY below a kind that is not an object (all of it is read), None where an object
    does not declare the name. Of a struct or list-of-struct column, only the leaves declared
    are read."""
    for part in parts:
        while isinstance(kind, (tuple, list)):
            kind = (
                next((k for k in kind if isinstance(k, (list, dict))), ANY)
                if isinstance(kind, tuple)
                else kind[0]
            )
        if not isinstance(kind, dict):
            return ANY
        if part not in kind:
            return None
        kind = kind[part]
    return kind


def parquet_columns(pf, fields, path):
    """The leaf columns to read for `fields`, after checking the file's schema against them: of
    a struct or list-of-struct column, just the leaves its kind declares."""
    schema = pf.schema_arrow
    leaves = [pf.schema.column(i).path.split(".") for i in range(len(pf.schema))]
    wanted = []
    for name, kind in fields.items():
        if name not in schema.names:
            raise BuildError(
                f"{path}: no column {name!r}; the file is not the pinned one, fetch it again"
            )
        if problem := arrow_mismatch(schema.field(name).type, kind, name):
            raise BuildError(
                f"{path}: column {problem}; the file is not the pinned one, fetch it again"
            )
        mine = [leaf for leaf in leaves if leaf[0] == name]
        declared = [
            ".".join(leaf) for leaf in mine if kind_below(kind, list_free(leaf[1:])) is not None
        ]
        wanted += declared or [name]
    return wanted


def list_free(parts):
    """A leaf's path without the levels parquet adds for a list ("list", then "element" or "item")."""
    out, i = [], 0
    while i < len(parts):
        if parts[i] == "list" and i + 1 < len(parts) and parts[i + 1] in ("element", "item"):
            i += 2
            continue
        out.append(parts[i])
        i += 1
    return out


# Rows per Arrow batch: records that become Python; rows a filter decides in Arrow first; MRCR
# prompts of up to 5M characters each; rows read again when looked at.
RECORD_BATCH_ROWS, FILTERED_BATCH_ROWS, MRCR_BATCH_ROWS, LOAD_BATCH_ROWS = 256, 4096, 16, 64


def arrow_path(path):
    """The path as pyarrow takes it: text that encodes to its bytes as UTF-8 (a name checked to
    be UTF-8 by parse_args, whatever the locale's encoding of file names)."""
    return os.fsencode(path).decode("utf-8")


def parquet_batches(files, fields, batch_size, rows=None, keep=None):
    """The one loop over a source's parquet files, in pin order: yields (pin, row, local, batch)
    where `row` is the source-wide index of the batch's first row and `local` its index in the
    file. Reads only the columns of `fields` (a dict, or a function of the pin giving one),
    checked against each file's schema; with `rows`, only the row groups that hold those rows;
    with `keep` (a batch -> boolean mask), drops rows before they become Python (then the batch
    comes with the offsets kept: (pin, row, local, batch, offsets)). Any Arrow or I/O failure
    becomes one error naming the file and row."""
    first = 0
    for pin in files:
        local = 0
        try:
            pf = pq.ParquetFile(arrow_path(pin.file))
            columns = parquet_columns(pf, fields(pin) if callable(fields) else fields, pin.file)
            for g in range(pf.num_row_groups):
                n = pf.metadata.row_group(g).num_rows
                if rows is not None and not any(
                    first + local <= r < first + local + n for r in rows
                ):
                    local += n
                    continue
                for batch in pf.iter_batches(
                    columns=columns, batch_size=batch_size, row_groups=[g]
                ):
                    if keep is None:
                        yield pin, first + local, local, batch
                    else:
                        mask = keep(batch)
                        if mask.null_count:  # a null where the filter looks
                            i = pc.indices_nonzero(pc.is_null(mask))[0].as_py()
                            null = [
                                n for n in batch.column_names if not batch.column(n)[i].is_valid
                            ]
                            raise BuildError(f"{pin.file} row {local + i}: no field {null[0]!r}")
                        offsets = pc.indices_nonzero(mask).to_pylist()
                        yield pin, first + local, local, batch.filter(mask), offsets
                    local += batch.num_rows
            first += pf.metadata.num_rows
        except (pa.ArrowException, OSError, MemoryError) as e:
            raise BuildError(
                f"{pin.file}: unreadable parquet near row {local} ({e}); fetch it again"
            ) from None
        del pf
        pa.default_memory_pool().release_unused()


def parquet_records(files, fields, keep=None):
    """Yield (row, record, where, pin) for the rows of parquet files, each checked against
    `fields`."""
    batch_rows = FILTERED_BATCH_ROWS if keep else RECORD_BATCH_ROWS
    declared = {}  # pin path -> its fields, one object per file
    for pin, row, local, batch, *kept in parquet_batches(files, fields, batch_rows, keep=keep):
        offsets = kept[0] if kept else range(batch.num_rows)
        if pin.path not in declared:
            declared[pin.path] = fields(pin) if callable(fields) else fields
        checked = batch_fits(batch, record_kind(declared[pin.path]))
        for i, record in zip(offsets, python_records(batch, pin.file, local, offsets)):
            where = f"{pin.file} row {local + i}"
            if not checked:
                check_record(record, declared[pin.path], where)
            yield row + i, record, where, pin


def batch_fits(batch, kind):
    """True when every row of the batch, as Python, is of `kind` (a record's kind): decided in
    Arrow from the columns' types and nulls; False when that is not certain (then each record is
    checked, and the first that is not of its kind is the error)."""
    return all(name in batch.column_names and array_fits(batch.column(name), sub)
               for name, sub in kind.items())  # fmt: skip


def array_fits(array, kind):
    """True when every value of the Arrow array, as Python, is of `kind` (see fits); False when
    not certain. Only nulls decide it once the type was checked by parquet_columns, but the type
    is tested again here: a False costs a slower check, a wrong True would skip an error."""
    if kind is ANY:
        return True
    if isinstance(kind, tuple):
        alternatives = [k for k in kind if k is not None]
        if len(alternatives) != 1 or (None not in kind and array.null_count):
            return False
        kind = alternatives[0]  # of its values that are not null
    elif array.null_count:
        return False
    t = array.type
    if kind is str or isinstance(kind, Json):
        return pa.types.is_string(t) or pa.types.is_large_string(t)
    if kind is int:
        return pa.types.is_integer(t)
    if kind is bool:
        return pa.types.is_boolean(t)
    if type(kind) is list and (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return array_fits(array.flatten(), kind[0])  # the items of the lists that are not null
    if type(kind) is dict and pa.types.is_struct(t):
        # flatten: each field's values, null where the struct is null
        children = dict(zip((t.field(i).name for i in range(t.num_fields)), array.flatten()))
        return all(
            array_fits(children[key], sub) if key in children else fits(None, sub)
            for key, sub in kind.items()
        )
    return False


def python_records(batch, path, local, offsets):
    """The batch as Python dicts; a text column holding invalid UTF-8 is an error that names
    the row and the column."""
    try:
        return batch.to_pylist()
    except UnicodeDecodeError:
        for j, i in enumerate(offsets):
            for name in batch.column_names:
                arrow_text(
                    batch.column(name).slice(j, 1).to_pylist, f"{path} row {local + i}", name
                )
        raise AssertionError("to_pylist failed on no row") from None


def arrow_text(get, where, name):
    try:
        return get()
    except UnicodeDecodeError:
        raise BuildError(f"{where}: {name} is not valid UTF-8; fetch it again") from None


def json_lines(pin):
    """Yield (line number from 0, (byte offset, length), parsed object) of a JSONL file."""
    try:
        with open(pin.file, "rb") as f:
            offset = 0
            for number, line in enumerate(f):
                try:
                    yield number, (offset, len(line)), orjson.loads(line)
                except orjson.JSONDecodeError as e:
                    raise BuildError(
                        f"{pin.file} line {number + 1}: not JSON ({e}); fetch it again"
                    ) from None
                offset += len(line)
    except OSError as e:
        raise BuildError(f"cannot read {pin.file}: {e.strerror or e}") from None


JSON_SCALAR = re.compile(rb'[^,\s\[\]{}"]+')  # a number, true, false or null, between rows


def json_array_elements(data, path):
    """(start, end) byte spans of the rows of a JSON array, without parsing it whole (rows that
    are not objects too, for the reader to refuse).

    Strings are skipped with bytes.find (a quote ends one unless an odd run of backslashes
    precedes it), so only the few bytes between strings are looked at one by one."""
    if not data.lstrip().startswith(b"["):
        raise BuildError(f"{path}: not a JSON array of rows; fetch it again")
    depth, start, spans, i, scalar_end = 0, 0, [], 0, 0
    while True:
        q = data.find(b'"', i)
        end = q if q >= 0 else len(data)
        between = data[i:end]
        if any(b in between for b in (b"[", b"]", b"{", b"}")):
            for k, byte in enumerate(between, i):
                if byte in b"[{":
                    depth += 1
                    start = k if depth == 2 else start
                elif byte in b"]}":
                    depth -= 1
                    if depth == 1:
                        spans.append((start, k + 1))
                elif depth == 1 and k >= scalar_end and (m := JSON_SCALAR.match(data, k, end)):
                    spans.append(m.span())  # a row that is a number, true, false or null
                    scalar_end = m.end()
        elif depth == 1:
            spans += [m.span() for m in JSON_SCALAR.finditer(data, i, end)]
        if q < 0:
            break
        i = q + 1
        while True:  # to the quote that closes the string
            i = data.find(b'"', i)
            if i < 0:
                raise BuildError(f"{path}: not JSON (a string is not closed); fetch it again")
            b = i - 1
            while data[b] == 0x5C:  # backslash
                b -= 1
            i += 1
            if (i - 2 - b) % 2 == 0:
                break
        if depth == 1:
            spans.append((q, i))  # a row that is a string
    if depth != 0:
        raise BuildError(f"{path}: not JSON (truncated or unbalanced); fetch it again")
    return spans


def parse_json(data, where, name="the row"):
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise BuildError(f"{where}: {name} is not JSON ({e}); fetch it again") from None


def compact_json(value, where, name):
    """Compact JSON text of a parsed value (structured content, arguments, tool schemas)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError as e:  # nested deeper than orjson writes
        raise BuildError(f"{where}: {name} cannot be written as JSON ({e})") from None


def user(content):
    return [{"role": "user", "content": content}]


def plain_message(m):
    """Most messages, of MESSAGE without testing it field by field: a role and text, perhaps
    answering a tool call."""
    return (
        type(m) is dict
        and type(m.get("role")) is type(m.get("content")) is str
        and m.get("tool_calls") is None
        and m.get("name") is None
        and type(m.get("tool_call_id")) in (str, NONE)
    )


def openai_message(m, where, name="message"):
    """Keep the OpenAI chat fields of a message, in the order of README "Schema": role, content,
    then where present name, tool_calls, tool_call_id."""
    if plain_message(m):
        tool_call_id = m.get("tool_call_id")
        if tool_call_id is None:
            return {"role": m["role"], "content": m["content"]}
        return {"role": m["role"], "content": m["content"], "tool_call_id": tool_call_id}
    if not MESSAGE_FITS(m):
        raise BuildError(f"{where}: {mismatch(m, MESSAGE, name)}")
    content = m.get("content")
    if type(content) is list:
        content = parts_text(content, where, f"{name}.content")
    elif content is not None and not isinstance(content, str):
        content = compact_json(content, where, "a structured content")
    out = {"role": m["role"], "content": content}
    if m.get("name") is not None:
        out["name"] = m["name"]
    if m.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": call.get("id"),
                "type": call.get("type") or "function",
                "function": {
                    "name": call["function"]["name"],
                    "arguments": arguments
                    if isinstance(arguments := call["function"].get("arguments"), str)
                    else compact_json(arguments, where, "tool-call arguments"),
                },
            }
            for call in m["tool_calls"]
        ]
    elif content is None:
        out["content"] = ""  # null only on an assistant turn that calls tools
    if m.get("tool_call_id") is not None:
        out["tool_call_id"] = m["tool_call_id"]
    return out


NOT_TEXT = "content part not text"  # the reason a row with such a message is dropped


def parts_text(parts, where, name):
    """A content that is a list of OpenAI content parts, as chat templates render it: the text of
    its parts in order (other keys, such as cache_control, are dropped), so the row is the one the
    source would give holding that string. A part of another type (an image, a tool-use block)
    makes the row unusable (README "How rows are chosen")."""
    if any(part["type"] != "text" for part in parts):
        raise Unusable(NOT_TEXT)
    for i, part in enumerate(parts):
        if type(text := part.get("text")) is not str:
            raise BuildError(f"{where}: {mismatch(text, str, f'{name}[{i}].text')}")
    return "".join(part["text"] for part in parts)


def openai_messages(messages, where, name="messages"):
    check_messages(messages, where, name, each=False)
    return [openai_message(m, where, f"{name}[{i}]") for i, m in enumerate(messages)]


def usable_messages(messages, where, name="messages"):
    """What openai_messages(messages, ...) raises (an error, or Unusable for a content part that
    is not text), without making the messages of the plain ones, which cannot raise: for a
    reader that keeps none of them (its rows are made into messages again when loaded)."""
    check_messages(messages, where, name, each=False)
    for i, m in enumerate(messages):
        if not plain_message(m) and not calls_tools(m):
            openai_message(m, where, f"{name}[{i}]")
    return messages


def calls_tools(m):
    """Most other messages (a third of Nemotron's), of MESSAGE without testing it field by
    field: a turn calling tools with text arguments, which openai_message cannot fail on."""
    if type(m) is not dict or type(m.get("role")) is not str:
        return False
    if type(m.get("content")) not in TEXT_OR_NULL or type(m.get("name")) not in TEXT_OR_NULL:
        return False
    if type(m.get("tool_call_id")) not in TEXT_OR_NULL:
        return False
    if type(calls := m.get("tool_calls")) is not list:
        return False
    for call in calls:
        if type(call) is not dict or type(f := call.get("function")) is not dict:
            return False
        if type(f.get("name")) is not str or type(f.get("arguments")) not in TEXT_OR_NULL:
            return False
        if type(call.get("id")) not in TEXT_OR_NULL or type(call.get("type")) not in TEXT_OR_NULL:
            return False
    return True


def check_messages(messages, where, name="messages", each=True):
    """That `messages` is a non-empty list and (with `each`) that every message is of the
    declared kind, without making the messages."""
    if not isinstance(messages, list) or not messages:
        raise BuildError(f"{where}: {name} is not a non-empty list of messages")
    for i, m in enumerate(messages if each else ()):
        if not plain_message(m) and not MESSAGE_FITS(m):
            raise BuildError(f"{where}: {mismatch(m, MESSAGE, f'{name}[{i}]')}")


def usable(drop, convert, *args):
    """convert(*args), or None for a row it finds unusable, counted in `drop` under the reason."""
    try:
        return convert(*args)
    except Unusable as e:
        drop[str(e)] += 1
        return None


def convert_into(c, convert, *args):
    """c.messages = convert(*args) for a candidate read before its messages (a lazy one); a row
    found unusable gets no messages and its reason, for the selection to count."""
    try:
        c.messages = convert(*args)
    except Unusable as e:
        c.messages, c.unusable = [], str(e)


# ================================================================================================
# One reader per source. A reader yields Candidates; `drop` counts the rows it rejects for the
# source-level filters of the table, for the message of a slot left short.


def read_longbench(source, files, drop):
    """One JSON array of 1,500 rows (532 MB): each row is parsed on its own and only its fields'
    sizes are kept, so the file's texts are never all in memory at once."""
    (pin,) = files
    try:
        data = pin.file.read_bytes()
    except OSError as e:
        raise BuildError(f"cannot read {pin.file}: {e.strerror or e}") from None
    for row, (start, end) in enumerate(json_array_elements(data, pin.file)):
        where = f"{pin.file} row {row}"
        r = parse_json(data[start:end], where)
        check_record(r, source.fields, where)
        context, question = r["context"], r["question_thinking"]
        encoded = context.encode()  # once, for the uniqueness key and the bound
        c = Candidate(
            f"{pin.repo}@{pin.revision}#{row}", row=row, group=r["language"],
            bucket=r["token_length"], load=longbench_load, at=(pin.file, start, end - start),
            size=end - start, unique=hashlib.sha256(encoded).digest(),
        )  # fmt: skip
        c.bound = text_bytes(context, encoded) + text_bytes(LONGBENCH_JOINER) + text_bytes(question)
        yield c


def longbench_load(cands):
    with open(cands[0].at[0], "rb") as f:
        for c in cands:
            f.seek(c.at[1])
            r = orjson.loads(f.read(c.at[2]))
            c.messages = user(r["context"] + LONGBENCH_JOINER + r["question_thinking"])


def read_mrcr(source, files, drop):
    """Prompts of up to 5M characters, read in one pass: every prompt's length, and the text of
    the first rows in sha256 order, a loading window's worth (usually all the slots look at).
    Other rows are read again if they are looked at."""
    pin0 = files[0]
    load = parquet_load(files, source.fields, "prompt", mrcr_messages)
    # first: a heap of the rows kept so far, the last of them in sha256 order on top
    cands, first, size = [], [], 0
    for pin, row, local, batch in parquet_batches(files, source.fields, MRCR_BATCH_ROWS):
        values = batch.column(0)
        for i, n in enumerate(pc.binary_length(values).to_pylist()):
            where = f"{pin.file} row {local + i}"
            if n is None:
                raise BuildError(f"{where}: no field 'prompt'")
            c = Candidate(f"{pin0.repo}@{pin0.revision}#{row + i}", row=row + i, load=load, size=n)
            c.bound = NFC_GROWTH * n  # the JSON is at least as long as its texts
            cands.append(c)
            order = -int(c.key, 16)
            if size + n <= WINDOW_BYTES or not first or order > first[0][0]:
                text = arrow_text(values[i].as_py, where, "prompt")
                heapq.heappush(first, (order, row + i, text, where))
                size += n
                while size > WINDOW_BYTES and len(first) > 1:
                    size -= cands[heapq.heappop(first)[1]].size
    for _, row, prompt, where in first:
        c = cands[row]
        convert_into(c, mrcr_messages, prompt, where)
        tighten_bound(c)
    yield from cands


def mrcr_messages(prompt, where):
    return openai_messages(parse_json(prompt, where, "prompt"), where, "prompt")


def swe_messages(value, where):
    """SWE-smith messages: a JSON string, sometimes a JSON string of a JSON string."""
    messages = parse_json(value, where, "messages")
    if isinstance(messages, str):
        messages = parse_json(messages, where, "messages")
    return openai_messages(messages, where)


def read_swe_smith(source, files, drop):
    pin0 = files[0]
    load = parquet_load(files, {"messages": source.fields["messages"]}, "messages", swe_messages)
    for row, r, where, _ in parquet_records(files, source.fields):
        if (messages := usable(drop, swe_messages, r["messages"], where)) is None:
            continue
        k = last_assistant(messages)
        if k is None:
            drop["no assistant turn after a user turn"] += 1
            continue
        # Only the trajectory's sizes are kept; its messages are read again when looked at.
        c = Candidate(f"{pin0.repo}@{pin0.revision}#{row}", row=row, unique=r["traj_id"], load=load)
        c.mbytes = [text_bytes(m["content"]) for m in messages[:k]]
        c.bound = sum(c.mbytes)
        yield c


def read_nemotron(source, files, drop):
    (pin,) = files
    for row, (offset, size), r in json_lines(pin):
        where = f"{pin.file} line {row + 1}"
        check_record(r, source.fields, where)
        # The row's messages as the source holds them (checked, usable): only roles and tool-call
        # ids are looked at here, and they are the same in the OpenAI messages made when loaded.
        if (messages := usable(drop, usable_messages, r["messages"], where)) is None:
            continue
        k = last_assistant(messages)
        if k is None or not answered_tool_calls(messages[:k]):
            drop["no usable assistant turn" if k is None else "tool message without a call"] += 1
            continue
        # No bound yet: sizing every row's text costs more than the few rows looked at need.
        yield Candidate(
            f"{pin.repo}@{pin.revision}#{row}", row=row, ends=messages[k - 1]["role"],
            load=nemotron_load, at=(pin.file, offset, size), size=size,
        )  # fmt: skip


def nemotron_load(cands):
    for c in cands:
        with open(c.at[0], "rb") as f:
            f.seek(c.at[1])
            r = orjson.loads(f.read(c.at[2]))
        where = f"{c.at[0]} line {c.row + 1}"
        convert_into(c, openai_messages, r["messages"], where)
        c.tools = compact_json(r["tools"], where, "tools") if r.get("tools") else None


def answered_tool_calls(messages):
    """Every tool message answers a tool call made earlier in the conversation (of the source's
    messages or of the OpenAI ones made of them, where a call without an id has id None)."""
    calls = set()
    for m in messages:
        calls.update(call.get("id") for call in m.get("tool_calls") or ())
        if m["role"] == "tool" and m.get("tool_call_id") not in calls:
            return False
    return True


def read_wildchat(source, files, drop):
    pin0 = files[0]
    for row, r, _, _ in parquet_records(files, source.fields):
        if r["toxic"] or r["redacted"]:
            drop["toxic or redacted"] += 1
            continue
        if r["turn"] < 2:
            drop["turn < 2"] += 1
            continue
        messages = [{"role": m["role"], "content": m["content"] or ""} for m in r["conversation"]]
        k = last_assistant(messages)
        if k is None:
            drop["no assistant turn after a user turn"] += 1
            continue
        c = Candidate(
            f"{pin0.repo}@{pin0.revision}#{row}", messages, row=row, group=r["language"],
            unique=messages[0]["content"],
        )  # fmt: skip
        c.bound = messages_bytes(messages[:k])
        yield c


def read_gsm8k(source, files, drop):
    for row, r, _, pin in parquet_records(files, source.fields):
        yield Candidate(f"{pin.repo}@{pin.revision}#{row}", user(r["question"]), row=row)


def read_numinamath(source, files, drop):
    def olympiads(batch):  # source == "olympiads" and not synthetic, decided in Arrow
        return pc.and_(pc.equal(batch["source"], "olympiads"), pc.equal(batch["synthetic"], False))

    kept = 0
    for row, r, _, pin in parquet_records(files, source.fields, keep=olympiads):
        kept += 1
        yield Candidate(f"{pin.repo}@{pin.revision}#{row}", user(r["problem"]), row=row)
    total = sum(pq.ParquetFile(arrow_path(pin.file)).metadata.num_rows for pin in files)
    drop["source is not olympiads, or synthetic"] += total - kept


def read_humaneval(source, files, drop):
    for row, r, _, pin in parquet_records(files, source.fields):
        prompt = r["prompt"] + ("" if r["prompt"].endswith("\n") else "\n")
        content = "Complete the following Python function.\n\n```python\n" + prompt + "```"
        yield Candidate(f"{pin.repo}@{pin.revision}#{row}", user(content), row=row)


def read_mbpp(source, files, drop):
    for row, r, _, pin in parquet_records(files, source.fields):
        content = (
            "You are an expert Python programmer, and here is your task: "
            + r["prompt"]
            + " Your code should pass these tests:\n\n"
            + "\n".join(r["test_list"])
        )
        yield Candidate(f"{pin.repo}@{pin.revision}#{row}", user(content), row=row)


def read_mimo(source, files, drop):
    for row, r, where, pin in parquet_records(files, source.fields_of):  # webdev, then music
        group = Path(pin.path).stem
        lang = r["extra_info"]["lang"] if group == "music" else None
        if (messages := usable(drop, openai_messages, r["prompt"], where, "prompt")) is None:
            continue
        yield Candidate(
            f"{pin.repo}@{pin.revision}#{row}", messages, row=row, group=group, lang=lang
        )


def cjk_share(text):
    cjk = sum(1 for ch in text if "\u3400" <= ch <= "\u4dbf" or "\u4e00" <= ch <= "\u9fff")
    return cjk / max(len(text), 1)


def read_longwriter(source, files, drop):
    (pin,) = files
    for row, _, r in json_lines(pin):
        where = f"{pin.file} line {row + 1}"
        check_record(r, source.fields, where)
        if (messages := usable(drop, openai_messages, r["messages"], where)) is None:
            continue
        first = messages[0]
        if first["role"] != "user":
            drop["first message is not a user turn"] += 1
            continue
        group = "zh" if cjk_share(first["content"]) >= 0.1 else "en"
        turns = len(r["messages"])  # the source names the cut: ":1" of a longer conversation
        yield Candidate(
            f"{pin.repo}@{pin.revision}#{row}", [first], turns=turns, row=row, group=group
        )


# Project Gutenberg boilerplate (README "How rows are chosen").
START_MARKER = re.compile(
    r"\*\*\*\s*START\s+OF\s+(?:THE|THIS)\s+PROJECT\s+GUTENBERG\s+E-?BOOK\b[^*]*\*\*\*",
    re.IGNORECASE,
)
END_MARKER = re.compile(
    r"^[^\n]*\*\*\*\s*END\s+OF\s+(?:THE|THIS)\s+PROJECT\s+GUTENBERG", re.IGNORECASE | re.MULTILINE
)
LEGACY_END = re.compile(
    r"^End of (?:the Project Gutenberg|Project Gutenberg's)", re.IGNORECASE | re.MULTILINE
)
PARAGRAPH_END = re.compile(r"(?<=[^\n])\n\n")


def book_body(text):
    """(start, end) of a book's text without the Project Gutenberg header and footer."""
    start = 0
    if m := START_MARKER.search(text):
        line_end = text.find("\n", m.end())
        start = len(text) if line_end < 0 else line_end + 1
    while start < len(text) and text[start].isspace():
        start += 1
    end = len(text)
    for marker in (END_MARKER, LEGACY_END):
        if m := marker.search(text, start):
            end = min(end, m.start())
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def read_book(text, lang):
    start, end = book_body(text)
    ends = [m.start() for m in PARAGRAPH_END.finditer(text, start + 1, end)] + [end]
    return Book(lang, text, start, ends)


def read_gutenberg(source, files, drop):
    for pin in files:
        try:
            text = pin.file.read_bytes().decode("utf-8").replace("\r\n", "\n")
        except UnicodeDecodeError as e:
            raise BuildError(f"{pin.file}: not UTF-8 ({e}); fetch it again") from None
        except OSError as e:
            raise BuildError(f"cannot read {pin.file}: {e.strerror or e}") from None
        book = read_book(text, pin.lang)
        if book.ends[-1] <= book.start:
            raise BuildError(f"{pin.file}: no text between the Project Gutenberg markers")
        book_id = f"{pin.repo}@{pin.revision}"
        yield Candidate(book_id, unique=book_id, group=pin.lang, book=book)


READERS = {
    "longbench-pro": read_longbench,
    "mrcr": read_mrcr,
    "swe-smith": read_swe_smith,
    "nemotron-agentic": read_nemotron,
    "wildchat": read_wildchat,
    "gsm8k": read_gsm8k,
    "numinamath": read_numinamath,
    "humaneval": read_humaneval,
    "mbpp": read_mbpp,
    "mimo": read_mimo,
    "longwriter": read_longwriter,
    "gutenberg": read_gutenberg,
}


# ================================================================================================
# Views: how a slot turns a candidate into the messages of a row (README "How rows are chosen").


def last_assistant(messages):
    """Index of the last assistant message, the end of a before-last view (None if unusable:
    it must follow a user or tool turn)."""
    for k in range(len(messages) - 1, 0, -1):
        if messages[k]["role"] == "assistant":
            return k if messages[k - 1]["role"] in ("user", "tool") else None
    return None


def cut_points(messages):
    """The k of the cut view: messages[k] is an assistant turn after a user or tool turn, k >= 2."""
    return [
        k
        for k in range(2, len(messages))
        if messages[k]["role"] == "assistant" and messages[k - 1]["role"] in ("user", "tool")
    ]


def view(s, c, limit, tok):
    """The slot's view of a candidate (None when it has none); tokens exact up to `limit`."""
    messages = c.messages
    if s.view == "whole":
        return first_messages(c, len(messages), tok.prompt(c, len(messages), limit))
    if s.view == "before-last":
        k = last_assistant(messages)
        return None if k is None else first_messages(c, k, tok.prompt(c, k, limit))
    if s.view == "cut":  # the longest prefix within T that stops before an assistant turn
        best = None
        for k in cut_points(messages):
            tokens = tok.prompt(c, k, s.T)
            if tokens > s.T:
                break
            best = first_messages(c, k, tokens)
        return best
    if s.view == "book":  # instruction + the book up to its last paragraph end within T tokens
        return book_view(c, s.T, tok)
    raise AssertionError(s.view)


def first_messages(c, k, tokens):
    """The view of the first k messages; its source names k when the conversation is longer."""
    longer = k < (c.turns or len(c.messages))
    return View(c.messages[:k], tokens, f":{k}" if longer else "")


# ================================================================================================
# Selection (README "How rows are chosen"): candidates in ascending sha256 of their id; each goes
# to the first open slot whose filter it passes and whose view is within the slot's token range.
# A longest slot is filled first with the candidates of most tokens. Smoke is derived.


def matches(s, c):
    return all(getattr(c, k) == v for k, v in s.where)


def place(f, c, v, used, name):
    f.rows.append(Row(name, f.slot, c, v.messages, v.tokens, c.id + v.suffix))
    used.add(used_key(c))


def used_key(c):
    """What makes a candidate used once placed: its uniqueness key, else the candidate itself
    (so that a row the longest slot took is not taken again by the scan)."""
    return c if c.unique is None else c.unique


def select(source, cands, drop, tok, quiet=True):
    """Fill the source's slots from its candidates; returns the chosen rows."""
    fills = [Fill(s) for s in source.slots]
    cands.sort(key=lambda c: c.key)
    used = set()
    seen = 0
    with tqdm(desc=source.name, unit=" candidates", disable=quiet, file=sys.stderr) as bar:
        for f in fills:
            if f.slot.longest:
                seen += fill_longest(f, cands, used, bar.update, tok, source.name)
        scan = [f for f in fills if not f.slot.longest]
        for i, c in enumerate(cands):
            open_fills = [f for f in scan if f.open]
            if not open_fills:
                break
            seen += 1
            bar.update(1)
            if used_key(c) in used:
                drop["uniqueness rule (already used)"] += 1
                continue
            fitting = []
            for f in open_fills:
                if not matches(f.slot, c):
                    f.rejected["filter"] += 1
                elif tok.bounded and c.bound < f.slot.lo:  # acceleration: too short anyway
                    f.rejected["tokens out of range"] += 1
                else:
                    fitting.append(f)
            if not fitting:
                continue
            if c.messages is None and c.load is not None:
                load(cands, i, scan, used)  # loading tightens the bound
            if c.unusable is not None:
                drop[c.unusable] += 1
                continue
            for f in [f for f in fitting if not may_fit(tok, c, f.slot)]:
                f.rejected["tokens out of range"] += 1
                fitting.remove(f)
            if not fitting:
                if c.load is not None:
                    c.messages = None
                continue
            limit = max(f.slot.hi for f in fitting)
            for f in fitting:
                v = view(f.slot, c, limit, tok)
                if v and f.slot.lo <= v.tokens <= f.slot.hi:
                    place(f, c, v, used, source.name)
                    break
                f.rejected["tokens out of range" if v else "no view"] += 1
            else:
                if c.load is not None:
                    c.messages = None  # free what was loaded
    for f in fills:
        if f.open:
            reasons = ", ".join(f"{n} {r}" for r, n in sorted((f.rejected + drop).items()))
            raise BuildError(
                f"{source.name}: slot '{f.slot.label}' has {len(f.rows)} of {f.slot.count} rows "
                f"after looking at {seen} of {len(cands)} candidates; rejected: {reasons or 'none'}"
            )
    return [row for f in fills for row in f.rows]


def may_fit(tok, c, s):
    """Acceleration: False when the bounds alone put every view of c outside the slot's range."""
    return (not tok.bounded or c.bound >= s.lo) and least_tokens(tok, c, s.view) <= s.hi


def derive_smoke(source, standard):
    """smoke: the shortest standard row of the source, or of each of its groups."""
    groups = source.groups or (None,)
    return [
        min((r for r in standard if g is None or r.candidate.group == g), key=lambda r: r.order)
        for g in groups
    ]


def select_splits(source, cands, drop, tok, quiet=True):
    """The source's rows of every split, each split in output order (tokens, then sha256)."""
    rows = select(source, cands, drop, tok, quiet)
    standard = [r for r in rows if r.slot.split == "standard"]
    by_split = {
        "smoke": sorted(derive_smoke(source, standard) if standard else [], key=lambda r: r.order)
    }
    for split in ("standard", "full"):
        by_split[split] = sorted((r for r in rows if r.slot.split == split), key=lambda r: r.order)
    return by_split


# ================================================================================================
# The token count (README "How rows are chosen"): the prompt tokens of messages are the sum over
# their string contents of len(tokenizer.encode(content, add_special_tokens=False)). No chat
# template, no tool schemas, no tool-call arguments.


def prompt_tokens_plain(tok, messages):
    """The definition, for tests and the benchmark's naive builder."""
    return sum(tok.plain(m["content"]) for m in messages if isinstance(m["content"], str))


@dataclass
class SourceStats:
    read_s: float = 0.0  # reading the files into candidates
    select_s: float = 0.0  # filling the slots, loading and counting included
    encode_s: float = 0.0  # inside the tokenizer
    tokens: int = 0  # tokens counted
    chars: int = 0  # characters given to the tokenizer
    texts: int = 0
    calls: int = 0


@dataclass
class Stats:
    """What a build measures of itself, for bench/bench.py: pass one to build(). `watch`, when
    set, is called as watch(source name, "start" | "read" | "done") at a source's milestones."""

    sources: dict = field(default_factory=dict)
    phases: dict = field(default_factory=dict)
    watch: Callable | None = None
    current: str = "(outside a source)"

    def source(self, name=None):
        return self.sources.setdefault(name or self.current, SourceStats())

    @contextmanager
    def phase(self, name):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t0

    def mark(self, name, event):
        self.current = name
        if self.watch:
            self.watch(name, event)


class Tokens:
    """The tokenizer, and what has been counted with it: the counts belong to this tokenizer."""

    def __init__(self, path, jobs, stats=None, data=None):
        os.environ["RAYON_NUM_THREADS"] = str(jobs)  # read when tokenizers first runs in parallel
        os.environ["TOKENIZERS_PARALLELISM"] = "true"
        from tokenizers import Tokenizer

        if data is None:
            data = read_named(path, "tokenizer ", TOKENIZER_CAP)
        try:  # from the bytes read, not the name: any path, in any locale
            self.tokenizer = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as e:  # tokenizers raises its own Exception type for a bad file
            first = (str(e).splitlines() or [type(e).__name__])[0][:200]
            raise BuildError(f"{path} is not a tokenizer.json ({first})") from None
        # Which exact accelerations hold for this tokenizer (decided from its description):
        self.chunkable = chunk_safe(self.tokenizer)  # counting in pieces, the lower bound
        self.bounded = bytes_bound_safe(self.tokenizer)  # the byte bound
        self.ends_add_up = ends_add_up(self.tokenizer, self.chunkable)  # the book view's search
        self.counted = {}  # sha256 of a message content -> its tokens
        self.stats = stats
        self.jobs = jobs

    def plain(self, text):
        """The definition: len(tokenizer.encode(text, add_special_tokens=False))."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode(self, texts):
        """Tokens of each text (the definition, on all threads)."""
        t0 = time.perf_counter()
        counts = [len(e) for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
        if self.stats is not None:
            s = self.stats.source()
            s.encode_s += time.perf_counter() - t0
            s.tokens += sum(counts)
            s.chars += sum(map(len, texts))
            s.texts += len(texts)
            s.calls += 1
        return counts

    # The exact accelerations of counting, below, are methods too: see the next section.
    def cuts(self, text, every=None):
        return safe_cuts(text, self.chunkable, every or CHUNK_CHARS)

    def count(self, text, limit=INF):
        return count_text(self, text, limit)

    def prompt(self, c, k, limit=INF):
        return prompt_tokens(self, c, k, limit)


# ================================================================================================
# Exact accelerations. None changes a row: each gives the definition's count, or rejects only
# candidates the definition rejects, and tests/ check each against the definition.
#
# 1. Counting in pieces. Long texts are cut where the Qwen pre-tokenizer always splits, so the
#    pieces are counted together on all threads and counting can stop once a limit is passed.

CHUNK_CHARS = 32_768  # the size of a piece
BATCH_CHUNKS = 8  # pieces encoded in one call
PIECES_PER_THREAD, MIN_PIECE_CHARS = 4, 4_096  # how finely a call's texts are cut at least
WINDOW_BYTES = 96 << 20  # how much text lazy candidates may load at once
WINDOW_ROWS = 512  # and how many of them
NFC_GROWTH = 3  # NFC makes a text at most three times longer (a bound on tokens from bytes)
CHARS_PER_TOKEN = 4  # more characters than a token holds in most text (how far a book is read)
# The Qwen pre-tokenizer split. Its pieces never run across a line start that is followed, before
# any other line break, by a non-whitespace character; NFC never composes across a line break.
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
WHITE_SPACE = set(
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)  # fmt: skip  (regex \s: Unicode White_Space)
NON_SPACE = re.compile("[^" + "".join(sorted(WHITE_SPACE)) + "]+")


def described(tokenizer):
    """The tokenizer's own description: its normalizer steps, its pre-tokenizer steps (each a
    dict of tokenizer.json), its model's type and whether the model falls back to bytes."""
    part = lambda p: orjson.loads(p.__getstate__()) if p is not None else {}
    normalizer, pre = part(tokenizer.normalizer), part(tokenizer.pre_tokenizer)
    norms = (
        normalizer.get("normalizers", []) if normalizer.get("type") == "Sequence" else [normalizer]
    )
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    model = type(tokenizer.model).__name__
    if model == "Unigram":  # no attribute for it; the state is the vocabulary, read once
        fallback = bool(orjson.loads(tokenizer.model.__getstate__()).get("byte_fallback"))
    else:
        fallback = bool(getattr(tokenizer.model, "byte_fallback", False))
    return [n for n in norms if n], [s for s in steps if s], model, fallback


def no_whitespace_added(tokenizer):
    """No added token holds or strips whitespace (so none reaches across a line break)."""
    return all(
        not any(ch in WHITE_SPACE for ch in t.content) and not t.lstrip and not t.rstrip
        for t in tokenizer.get_added_tokens_decoder().values()
    )


def chunk_safe(tokenizer):
    """Whether counting in pieces cut by safe_cuts is exact for this tokenizer: the Qwen
    normalizer and pre-tokenizer, and no added token that holds or strips whitespace."""
    norms, steps, _, _ = described(tokenizer)
    split = steps[0] if steps else {}
    split_ok = (
        split.get("type") == "Split"
        and split.get("pattern", {}).get("Regex") == QWEN_SPLIT
        and split.get("behavior") == "Isolated"
        and not split.get("invert")
    )
    rest_ok = all(s.get("type") == "ByteLevel" and s.get("use_regex") is False for s in steps[1:])
    normalizer_ok = all(n.get("type") == "NFC" for n in norms)
    return normalizer_ok and split_ok and rest_ok and no_whitespace_added(tokenizer)


# Pre-tokenizers that only cut text, or drop some of it: none adds a character.
CUTTING = {"Split", "Whitespace", "WhitespaceSplit", "BertPreTokenizer", "Punctuation", "Digits",
           "UnicodeScripts", "CharDelimiterSplit"}  # fmt: skip


def bytes_bound_safe(tokenizer):
    """Whether a text's NFC UTF-8 length bounds its tokens from above (the bound of 3 and 5
    below): the normalizer adds nothing (none or NFC: a Prepend, a Replace, NFKC may), the
    pre-tokenizer only cuts, or maps a byte to one character (ByteLevel without a prefix space),
    or a space to one character (Metaspace that prepends nothing), and every token of the model
    holds a character at least (a byte, with byte fallback; then no step may map a byte to a
    longer character)."""
    norms, steps, model, fallback = described(tokenizer)
    mapping = False
    for step in steps:
        kind = step.get("type")
        if kind == "ByteLevel" and step.get("add_prefix_space") is False:
            mapping = True
        elif kind == "Metaspace" and step.get("prepend_scheme") == "never":
            mapping = True
        elif kind not in CUTTING:
            return False
    models_ok = model in ("BPE", "WordPiece", "WordLevel", "Unigram") and not (fallback and mapping)
    return models_ok and all(n.get("type") == "NFC" for n in norms)


# Normalizers that change a character on its own, never across a line break; the prompt's
# start is the same for every end of a book, so a Prepend is local too.
LOCAL_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "BertNormalizer", "Prepend",
                     "StripAccents", "Replace"}  # fmt: skip
# Pre-tokenizers that always cut at a line break and drop it with the whitespace around it.
WHITESPACE_CUTTING = {"Whitespace", "WhitespaceSplit", "BertPreTokenizer"}


def ends_add_up(tokenizer, chunkable):
    """Whether the prompt tokens at a paragraph end are those of the text before it plus those
    after it, so that they grow with the end (the book view's binary search): the Qwen kind, or
    a local normalizer, a first pre-tokenizer that cuts at whitespace and drops it, and no
    added token that holds whitespace (a Replace: of a text without a line break)."""
    if chunkable:
        return True
    norms, steps, _, _ = described(tokenizer)
    local = all(
        n.get("type") in LOCAL_NORMALIZERS
        and (n.get("type") != "Replace" or not set("\r\n") & set(n["pattern"].get("String", "\n")))
        for n in norms
    )
    cut = bool(steps) and steps[0].get("type") in WHITESPACE_CUTTING
    return local and cut and no_whitespace_added(tokenizer)


def safe_cuts(text, chunkable=True, every=CHUNK_CHARS):
    """Positions, about `every` characters apart, where counting text in pieces is exact."""
    cuts = [0]
    if not chunkable:
        return cuts + [len(text)]
    n = len(text)
    pos = every
    while pos < n:
        nl = text.find("\n", pos - 1)
        if nl < 0 or nl + 1 >= n:
            break
        q = j = nl + 1
        while j < n and text[j] in WHITE_SPACE and text[j] not in "\r\n":
            j += 1
        if j < n and text[j] not in WHITE_SPACE:
            cuts.append(q)
            pos = q + every
        else:
            pos = j + 1
    return cuts + [n]


def count_text(tok, text, limit=INF):
    """Tokens of one text: exact when at most `limit`, else some number above it."""
    cuts = tok.cuts(text)
    pieces = [text[a:b] for a, b in zip(cuts, cuts[1:])]
    total = 0
    for i in range(0, len(pieces), BATCH_CHUNKS):
        total += sum(tok.encode(pieces[i : i + BATCH_CHUNKS]))
        if total > limit:
            break
    return total


def content_text(message):
    return message["content"] if isinstance(message["content"], str) else ""


# 2. Counting messages once. Counts are kept per message of a candidate, so views of the same
#    candidate share the work, and per content for the build, so a content counted before (a
#    system prompt, a trajectory stored twice) is not counted again.


def next_batch(c, i, k):
    """Uncounted messages from i (before k), about BATCH_CHUNKS pieces of text in all."""
    batch, chars = [], 0
    while i < k and i not in c.counts and (not batch or chars < CHUNK_CHARS * BATCH_CHUNKS):
        batch.append(i)
        chars += len(content_text(c.messages[i]))
        i += 1
    return batch, chars


def count_messages(tok, c, batch):
    """Count these messages in one call on all threads, long contents in pieces."""
    texts, digests = {}, {}
    for j in batch:
        text = content_text(c.messages[j])
        digests[j] = digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
        if digest in tok.counted:
            c.counts[j] = tok.counted[digest]
        else:
            texts[j] = text
    # A call lasts as long as its thread with the most text: a few long pieces would leave a
    # thread idle, so the batch is cut into at least PIECES_PER_THREAD pieces per thread.
    every = sum(map(len, texts.values())) // (PIECES_PER_THREAD * tok.jobs)
    every = min(CHUNK_CHARS, max(MIN_PIECE_CHARS, every))
    pieces, owners = [], []
    for j, text in texts.items():
        cuts = tok.cuts(text, every)
        pieces += [text[a:b] for a, b in zip(cuts, cuts[1:])]
        owners += [j] * (len(cuts) - 1)
        c.counts[j] = 0
    for j, n in zip(owners, tok.encode(pieces)):
        c.counts[j] += n
    for j in set(owners):
        tok.counted[digests[j]] = c.counts[j]


def prompt_tokens(tok, c, k, limit=INF):
    """Prompt tokens of the candidate's first k messages: exact when at most `limit`; counting
    stops once the total is above it (a count that stopped early is not kept)."""
    total, i = 0, 0
    while i < k:
        if i in c.counts:
            total += c.counts[i]
            i += 1
            continue
        if total > limit:
            return total
        batch, chars = next_batch(c, i, k)
        if len(batch) == 1 and chars > CHUNK_CHARS * BATCH_CHUNKS:
            n = count_text(tok, content_text(c.messages[i]), limit - total)
            if n > limit - total:
                return total + n  # stopped early: not kept
            c.counts[i] = n
        else:
            count_messages(tok, c, batch)
    return total


# 3. Bounds. A text's NFC UTF-8 length bounds its tokens from above (a byte-level BPE token holds
#    at least one byte); its runs of non-whitespace bound them from below (a piece of the Qwen
#    pre-tokenizer never holds non-whitespace of two runs). Slots skip candidates that cannot fit.


def text_bytes(text, encoded=None):
    """An upper bound on the token count of a text: its UTF-8 length after NFC normalization
    (`encoded`: the text's UTF-8 when the caller has it)."""
    if not isinstance(text, str):
        return 0
    if text.isascii():
        return len(text)
    if not unicodedata.is_normalized("NFC", text):
        return len(unicodedata.normalize("NFC", text).encode())
    return len(text.encode() if encoded is None else encoded)


def messages_bytes(messages):
    return sum(text_bytes(m["content"]) for m in messages)


def tighten_bound(c):
    """A loaded candidate's texts bound its tokens more tightly than its file did (an unusable
    one keeps its bound, so that the selection meets it and counts its reason)."""
    # With mbytes (the bytes of the view's messages, set by the reader or the longest slot), the
    # bound is already of these texts, at most messages_bytes(c.messages).
    if c.unusable is None and c.mbytes is None:
        c.bound = min(c.bound, messages_bytes(c.messages))


def least_tokens(tok, c, view_name):
    """A lower bound on a whole or before-last view's prompt tokens (0 for other views, and
    for tokenizers that are not the Qwen kind)."""
    if view_name not in ("whole", "before-last") or not tok.chunkable:
        return 0
    k = len(c.messages) if view_name == "whole" else last_assistant(c.messages) or 0
    for j in range(k):
        if j not in c.runs:
            text = content_text(c.messages[j])
            # str.split() splits at str.isspace(), which is regex whitespace plus U+001C-U+001F.
            fast = not any(ch in text for ch in "\x1c\x1d\x1e\x1f")
            c.runs[j] = len(text.split()) if fast else sum(1 for _ in NON_SPACE.finditer(text))
    return sum(c.runs[j] for j in range(k))


# 4. Loading rows when looked at. Heavy rows (trajectories, long documents) are read when a slot
#    first looks at them, together with the next ones likely to be looked at, a window at a time.


def loading_bytes(c):
    return c.size or (0 if c.bound == INF else c.bound)


def load(cands, start, fills, used):
    """Load the lazy candidate at `start` together with the next ones likely to be looked at."""
    window, size = [cands[start]], loading_bytes(cands[start])
    for c in cands[start + 1 :]:
        if c.messages is not None or used_key(c) in used:
            continue
        if not any(f.open and matches(f.slot, c) and c.bound >= f.slot.lo for f in fills):
            continue
        window.append(c)
        size += loading_bytes(c)
        if size > WINDOW_BYTES or len(window) >= WINDOW_ROWS:
            break
    loaders = {}
    for c in window:
        loaders.setdefault(c.load, []).append(c)
    for loader, group in loaders.items():
        loader(group)
    for c in window:
        tighten_bound(c)


def parquet_load(files, fields, column, convert):
    """A loader for lazy candidates: reads `column` of the row groups that hold the rows asked
    for, and converts those rows with convert(value, where)."""

    def load_rows(cands):
        wanted = {c.row: c for c in cands}
        for pin, row, local, batch in parquet_batches(files, fields, LOAD_BATCH_ROWS, rows=wanted):
            values = batch.column(0)
            for i in range(len(values)):
                if (c := wanted.get(row + i)) is not None:
                    where = f"{pin.file} row {local + i}"
                    convert_into(c, convert, arrow_text(values[i].as_py, where, column), where)

    return load_rows


# 5. The longest slot, best first. A candidate's bound is the tokens of its messages counted so
#    far plus the bytes of the rest; the candidate of highest bound is counted a batch of
#    messages at a time, and one fully counted at the top has at least as many tokens as any
#    other can: the slot takes it without counting the others in full.


def fill_longest(f, cands, used, progress, tok, name):
    """The `count` candidates with the most prompt tokens in range (ties: lower sha256)."""
    if not tok.bounded:
        return fill_longest_plain(f, cands, used, progress, tok, name)
    s = f.slot
    pool = sorted((c for c in cands if matches(s, c)), key=lambda c: (-c.bound, c.key))
    heap = [(-c.bound, c.key, i) for i, c in enumerate(pool)]  # sorted: a heap
    looked = set()
    while heap and f.open:
        _, _, i = heapq.heappop(heap)
        c = pool[i]
        if used_key(c) in used:
            continue  # a longer candidate with the same key was taken
        if c.messages is None:
            load(pool, i, [f], used)
        if i not in looked:
            looked.add(i)
            progress(1)
        if c.unusable is not None:
            f.rejected[c.unusable] += 1
            continue
        k = last_assistant(c.messages)
        if k is None:
            f.rejected["no view"] += 1
            continue
        if c.mbytes is None:
            c.mbytes = [text_bytes(m["content"]) for m in c.messages[:k]]
        uncounted = [j for j in range(k) if j not in c.counts]
        bound = sum(c.counts[j] for j in range(k) if j in c.counts)
        bound += sum(c.mbytes[j] for j in uncounted)
        if heap and (-bound, c.key) > heap[0][:2]:
            heapq.heappush(heap, (-bound, c.key, i))  # no longer on top: look at another first
            continue
        if uncounted:
            # Count about what the bound must lose to fall below the runner-up's, largest
            # messages first: a candidate that cannot win is left after a little counting.
            gap = bound + heap[0][0] if heap else INF
            budget = min(CHUNK_CHARS * BATCH_CHUNKS, max(2 * CHUNK_CHARS, 2 * gap))
            batch, size = [], 0
            for j in sorted(uncounted, key=lambda j: -c.mbytes[j]):
                if batch and size >= budget:
                    break
                batch.append(j)
                size += c.mbytes[j]
            count_messages(tok, c, batch)
            heapq.heappush(heap, (-bound, c.key, i))
            continue
        if bound > c.bound:
            raise AssertionError(f"{c.id}: {bound} tokens above its bound {c.bound}")
        if s.lo <= bound <= s.hi:
            place(f, c, first_messages(c, k, bound), used, name)
        else:
            f.rejected["tokens out of range"] += 1
    return len(looked)


def fill_longest_plain(f, cands, used, progress, tok, name):
    """The longest slot without the byte bound (a tokenizer it does not hold for): every
    candidate's view is counted in full, then those of most tokens in range are taken."""
    s = f.slot
    ranked, looked = [], 0
    for i, c in enumerate(cands):
        if not matches(s, c) or used_key(c) in used:
            continue
        if c.messages is None:
            load(cands, i, [f], used)
        looked += 1
        progress(1)
        k = last_assistant(c.messages)
        tokens = None if k is None else tok.prompt(c, k)
        if k is None:
            f.rejected["no view"] += 1
        elif s.lo <= tokens <= s.hi:
            ranked.append((-tokens, c.key, i, k))
        else:
            f.rejected["tokens out of range"] += 1
        if c.load is not None:
            c.messages = None  # read again if taken
    for minus, _, i, k in sorted(ranked):
        c = cands[i]
        if not f.open:
            break
        if used_key(c) in used:
            continue  # a longer candidate with the same key was taken
        if c.messages is None:
            c.load([c])
        place(f, c, first_messages(c, k, -minus), used, name)
    return looked


# 6. The book view, found by counting the book about once: the pieces of the prompt are counted
#    only as far as T needs, then the paragraph end is found by a binary search inside one piece.


def book_view(c, T, tok):
    """Instruction + the book up to its last paragraph end whose prompt tokens are <= T."""
    b = c.book
    prefix = BOOK_INSTRUCTION[b.lang] + "\n\n"
    if b.prompt is None:
        b.prompt = prefix + b.text[b.start : b.ends[-1]]
        b.cuts = tok.cuts(b.prompt)
        b.cum = [0]
        b.pends = [len(prefix) + e - b.start for e in b.ends]
    if not tok.ends_add_up:
        return book_view_plain(c, T, tok)
    prompt, cuts, cum, pends = b.prompt, b.cuts, b.cum, b.pends
    while cum[-1] <= T and len(cum) < len(cuts):
        n = len(cum) - 1
        # As many pieces as T still needs (a piece holds at least CHUNK_CHARS // CHARS_PER_TOKEN
        # tokens of most text), so that a short view does not count far into the book.
        ahead = min(BATCH_CHUNKS, 1 + (T - cum[-1]) // (CHUNK_CHARS // CHARS_PER_TOKEN))
        pieces = [prompt[a:b] for a, b in zip(cuts[n : n + ahead], cuts[n + 1 : n + 1 + ahead])]
        for count in tok.encode(pieces):
            cum.append(cum[-1] + count)

    def tokens_at(p):  # exact prompt tokens of prompt[:p]
        j = bisect.bisect_left(cuts, p) - 1
        # A paragraph end is a cut only at the end of the book, looked at only once it is counted.
        if p != cuts[j + 1]:
            return cum[j] + count_text(tok, prompt[cuts[j] : p])
        return cum[j + 1]

    # The last counted cut whose tokens are within T; the answer lies in the piece after it.
    m = bisect.bisect_right(cum, T) - 1
    hi_pos = cuts[min(m + 1, len(cuts) - 1)]
    lo_i = bisect.bisect_right(pends, cuts[m])
    hi_i = bisect.bisect_right(pends, hi_pos)
    best = None
    a, z = lo_i, hi_i - 1  # binary search in pends[a..z]: tokens grow with the end
    while a <= z:
        mid = (a + z) // 2
        t = tokens_at(pends[mid])
        if t <= T:
            best, a = (mid, t), mid + 1
        else:
            z = mid - 1
    if best is None and lo_i > 0:
        best = (lo_i - 1, tokens_at(pends[lo_i - 1]))
    if best is None or best[1] > T:
        return None
    return View(user(prompt[: pends[best[0]]]), best[1], f"#{b.start}-{b.ends[best[0]]}")


def book_view_plain(c, T, tok):
    """The book view counted plainly, for a tokenizer whose counts are not known to grow with
    the end: the prompt at every paragraph end is counted once (for every T), the last within T
    is taken. Exact, and slow on long books."""
    b = c.book
    if b.plain is None:
        b.plain = []
        for i in range(0, len(b.pends), BATCH_CHUNKS):
            b.plain += tok.encode([b.prompt[:p] for p in b.pends[i : i + BATCH_CHUNKS]])
    within = [i for i, n in enumerate(b.plain) if n <= T]
    if not within:
        return None
    i = within[-1]
    return View(user(b.prompt[: b.pends[i]]), b.plain[i], f"#{b.start}-{b.ends[i]}")


# ================================================================================================
# Output (docs/building.md "What a build writes"): three parquet files with fixed writer options,
# manifest.json, the dataset card and SHA256SUMS, written elsewhere and moved into OUT together.

SCHEMA = pa.schema([("messages", pa.string()), ("tools", pa.string()), ("source", pa.string())])
OUT_FILES = (
    "smoke.parquet",
    "standard.parquet",
    "full.parquet",
    "manifest.json",
    "README.md",
    "SHA256SUMS",
)


def row_record(r):
    messages = orjson.dumps(r.messages).decode()
    return {"messages": messages, "tools": r.candidate.tools, "source": r.source}


def canonical_line(record):
    """One row of the content hash: compact JSON with keys messages, tools, source
    (docs/building.md, "What a build writes")."""
    return (
        orjson.dumps(
            {"messages": record["messages"], "tools": record["tools"], "source": record["source"]}
        )
        + b"\n"
    )


def write_parquet(records, path):
    table = pa.Table.from_pylist(records, schema=SCHEMA).combine_chunks()
    pq.write_table(
        table,
        arrow_path(path),
        row_group_size=max(len(records), 1),
        compression="zstd",
        compression_level=9,
        use_dictionary=False,
        write_statistics=True,
        write_page_index=False,
        data_page_size=1 << 20,
        data_page_version="2.0",
        version="2.6",
        store_schema=True,
        write_batch_size=1024,
    )


def package_versions():
    return {p: version(p) for p in PACKAGES}


def build_outputs(splits, names, pins, tokenizer_sha, staging):
    """Write every OUT file into `staging`; return the manifest."""
    manifest_rows, split_info = [], {}
    for split in SPLIT_NAMES:
        rows = splits[split]
        records = [row_record(r) for r in rows]
        path = staging / f"{split}.parquet"
        write_parquet(records, path)
        lines = [canonical_line(rec) for rec in records]
        split_info[split] = dict(
            rows=len(rows),
            file_sha256=sha256_file(path),
            content_sha256=hashlib.sha256(b"".join(lines)).hexdigest(),
            prompt_tokens=[
                min((r.tokens for r in rows), default=0),
                max((r.tokens for r in rows), default=0),
            ],
        )
        for index, (r, line) in enumerate(zip(rows, lines)):
            manifest_rows.append(dict(
                split=split, index=index, source=r.source, name=r.name, group=r.candidate.group,
                slot=r.slot.label, prompt_tokens=r.tokens, row_sha256=hashlib.sha256(line).hexdigest(),
            ))  # fmt: skip
    manifest = dict(
        builder="kern-prompts build.py",
        builder_version=builder_version(),
        build_py_sha256=sha256_file(Path(__file__)),
        only=None if names == list(SOURCES) else names,
        tokenizer_sha256=tokenizer_sha,
        packages=package_versions(),
        inputs=[
            dict(
                repo=p.repo,
                revision=p.revision,
                path=p.path,
                bytes=p.size,
                sha256=p.actual_sha256 or p.sha256,
            )
            for p in pins
        ],
        splits=split_info,
        rows=manifest_rows,
    )
    (staging / "manifest.json").write_bytes(
        orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n"
    )
    (staging / "README.md").write_text(dataset_card(manifest), encoding="utf-8")
    (staging / "SHA256SUMS").write_text(sums_text(manifest, staging), encoding="utf-8")
    return manifest


def sums_text(manifest, out):
    """SHA256SUMS of the build in directory `out`: sha256sum lines for the five other files,
    then, as comments, each split's content sha256, the package versions and every row."""
    sums = [f"{sha256_file(out / f)}  {f}\n" for f in OUT_FILES[:-1]]
    sums += [
        f"# content {manifest['splits'][s]['content_sha256']}  {s}.parquet\n" for s in SPLIT_NAMES
    ]
    sums.append(
        "# packages " + " ".join(f"{p}=={v}" for p, v in manifest["packages"].items()) + "\n"
    )
    sums += [
        f"# row {r['split']} {r['index']} {r['row_sha256']} {r['source']}\n"
        for r in manifest["rows"]
    ]
    return "".join(sums)


REPO_ID = "Pegainfer/kern-prompts"  # the dataset on the Hugging Face Hub
MODEL_REPO = "Qwen/Qwen3.8-27B"  # whose tokenizer counts the prompt tokens
CARD_TAGS = ("long-context", "evaluation", "numerics", "inference", "kv-cache", "tool-use",
             "agents", "multi-turn")  # fmt: skip
CARD_LANGUAGES = ("en", "zh", "ru", "ja")
CARD_USAGE = f"""\
import json

from datasets import load_dataset
from transformers import AutoTokenizer

rows = load_dataset("{REPO_ID}", split="smoke")
tokenizer = AutoTokenizer.from_pretrained("{MODEL_REPO}")
for row in rows:
    messages = json.loads(row["messages"])
    tools = json.loads(row["tools"]) if row["tools"] else None
    text = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )
    # Prefill `text` in the reference and the candidate engine, then decode the reference's
    # continuation token by token in both, up to the split's decode cap.
"""


CARD_SCHEMA = (
    ("messages", "string", "OpenAI chat messages as compact JSON. The last turn is user or tool; "
     "the model writes the next assistant turn. Tool calls keep their OpenAI fields."),
    ("tools", "string or null", "OpenAI tool schemas as JSON, for rows whose conversation calls tools"),
    ("source", "string", "`<repo>@<revision>#<row>`. A suffix `:<k>` means the conversation was cut "
     "before message k. Gutenberg rows give the character range of the book."),
)  # fmt: skip


def builder_version():
    """The version in pyproject.toml beside build.py (docs/building.md "Publishing a release")."""
    try:
        with open(HERE / "pyproject.toml", "rb") as f:
            return tomllib.load(f)["project"]["version"]
    except (OSError, tomllib.TOMLDecodeError, KeyError):
        try:
            return version("kern-prompts")
        except PackageNotFoundError:
            return "unknown"


def card_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows]


def token_range(tokens):
    return f"{min(tokens):,} – {max(tokens):,}" if tokens else "–"


def dataset_card(manifest):
    """The dataset card published with the splits: its tables and provenance computed from the
    manifest, its prose the card's (README.md); no timestamps."""
    splits, rows = manifest["splits"], manifest["rows"]
    built = [s for s in SOURCES.values() if any(r["name"] == s.name for r in rows)]
    total = sum(splits[s]["rows"] for s in SPLIT_NAMES)

    def tokens_of(name=None, split=None):
        return [r["prompt_tokens"] for r in rows
                if (name is None or r["name"] == name) and (split is None or r["split"] == split)]  # fmt: skip

    def count(name, split):
        return sum(r["split"] == split and r["name"] == name for r in rows) or "–"

    split_rows = [
        (s.name, splits[s.name]["rows"], token_range(tokens_of(split=s.name)), s.decode_cap, s.use)
        for s in SPLITS
    ]
    composition = [
        (
            s.title,
            *(count(s.name, n) for n in SPLIT_NAMES),
            token_range(tokens_of(s.name)),
            s.covers,
        )
        for s in built
    ] + [("**total**", *(f"**{splits[n]['rows']}**" for n in SPLIT_NAMES), "", "")]
    licenses = {}
    for s in built:
        licenses.setdefault(s.license, []).append(s.short)
    inputs = [
        (f"`{i['repo']}@{i['revision']}/{i['path']}`", f"{i['bytes']:,}", f"`{i['sha256']}`")
        for i in manifest["inputs"]
    ]
    front = [
        "---",
        "license: other",
        "license_name: per-source",
        "pretty_name: kern prompts",
        "task_categories:",
        "- text-generation",
        "tags:",
        *(f"- {t}" for t in CARD_TAGS),
        "language:",
        *(f"- {lang}" for lang in CARD_LANGUAGES),
        "size_categories:",
        "- n<1K" if total < 1_000 else "- 1K<n<10K",
        "configs:",
        "- config_name: default",
        "  data_files:",
        *(f"  - split: {s}\n    path: {s}.parquet" for s in SPLIT_NAMES),
        "---",
    ]
    lines = [
        *front,
        "",
        "# kern prompts",
        "",
        "Chat prompts for checking the numerics of an LLM inference engine against a reference",
        "implementation of the same model. The reference samples a continuation of each prompt and",
        "records its next-token distribution at every step; a candidate engine (a new kernel, a lower",
        "precision) is fed the same tokens and scored position by position. The prompt fills the KV",
        "cache and recurrent state through prefill; the continuation runs token by token through",
        "decode. The prompts are chosen so that both are deep: long documents, long agent",
        "trajectories, real conversations, and tasks that make the model write for a long time.",
        "",
        "## Splits",
        "",
        *card_table(("split", "rows", "prompt tokens", "suggested decode cap", "use"), split_rows),
        "",
        "smoke is the shortest standard row of every source (of each group where a source has two:",
        "a language, or MiMo's file), so it repeats rows of standard. Prompt tokens are counted with",
        f"the Qwen3.8 tokenizer (`{MODEL_REPO}`) over the message contents, without a chat",
        "template. A run skips rows longer than the target model's context. Errors that build up step",
        "by step (a recurrent state stored in bf16, for example) stay close to normal for the first",
        "few hundred decode steps and grow over thousands, so only full shows them clearly.",
        "",
        "## Composition",
        "",
        *card_table(("source", *SPLIT_NAMES, "prompt tokens", "what it covers"), composition),
        "",
        "## Schema",
        "",
        *card_table(("column", "type", "meaning"), CARD_SCHEMA),
        "",
        "## Usage",
        "",
        "Turn a row into model input with the model's chat template (`tools` where present):",
        "",
        "```python",
        *CARD_USAGE.rstrip("\n").split("\n"),
        "```",
        "",
        "Score the candidate against the reference at every decode position: the KL divergence of",
        "the two next-token distributions, whether the top-1 token flips, and at each flip the",
        "reference's margin between its top-1 and top-2 tokens (a flip at a near tie is noise; a flip",
        "at a wide margin is a bug). Decode up to the split's suggested cap ("
        + ", ".join(f"{s.name} {s.decode_cap:,}" for s in SPLITS)
        + " tokens); only long decodes show errors that accumulate.",
        "",
        "`score.py` in the builder's repository does all of this on these rows, in the trace format",
        "of the kern engine (`kern test --reference` reads its files): `score.py record` renders",
        "each row with the model's chat template, samples the reference continuation and records",
        "the top-k distribution at every position; `score.py judge` feeds a candidate the same",
        "tokens, prefill then decode, and answers PASS, FAIL or INCONCLUSIVE, with where it drifts:",
        "",
        "```",
        f"python score.py record --rows hub:{REPO_ID} --split standard --model {MODEL_REPO} \\",
        "    --out ref.parquet",
        f"python score.py record --corpus ref.parquet --model {MODEL_REPO} --producer chunk64 \\",
        "    --chunk 64 --out ref.parquet",
        "python score.py judge ref.parquet --model CANDIDATE --plot drift.png",
        "```",
        "",
        "## How rows are chosen",
        "",
        "There is no randomness. For every source, in the order of the Composition table, the",
        "candidates (rows of the pinned files, or books) are taken in ascending sha256 of their id,",
        "and each goes into the first slot that is not full, whose filter it passes and whose prompt",
        "tokens are within the slot's range; the four whole SWE-smith trajectories of full are the",
        "longest ones. Conversations are cut before an assistant turn. Rebuilding from the pinned",
        "inputs below gives the same bytes.",
        "",
        "## Licenses",
        "",
        "Each row keeps the license of its source; `source` names it. Using a row means following",
        "that license, including attribution.",
        "",
        *card_table(
            ("source", "license"), [(", ".join(names), lic) for lic, names in licenses.items()]
        ),
        "",
        "The selection, the cuts and the builder are released under Apache-2.0.",
        "",
        "WildChat rows are real user conversations, filtered by WildChat's own toxic and redacted",
        "flags. SWE-smith trajectories were generated by Claude 3.7 Sonnet through SWE-agent. Some",
        "sources are public benchmarks; do not train on this set if you evaluate on them.",
        "",
        "## Provenance",
        "",
        f"Built by kern-prompts {manifest['builder_version']}, build.py sha256",
        f"`{manifest['build_py_sha256']}`, with the tokenizer of sha256",
        f"`{manifest['tokenizer_sha256']}` and "
        + ", ".join(f"{p} {v}" for p, v in manifest["packages"].items())
        + ".",
        *(
            [f"Sources built: {', '.join(manifest['only'])} (a partial build)."]
            if manifest["only"]
            else []
        ),
        "",
        "Inputs:",
        "",
        *card_table(("input", "bytes", "sha256"), inputs),
        "",
    ]
    return "\n".join(lines)


# ================================================================================================
# OUT (docs/building.md "What a build writes"): replaced as a whole, never touched otherwise. OUT
# may be absent, an empty directory or a previous build (exactly the six files, as its SHA256SUMS
# lists them); anything else is refused before the build starts. A lock beside OUT keeps two builds
# apart; what a killed build left beside OUT is restored or removed when the next one starts.

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
FS_IOC_GETFLAGS = 0x80086601  # Linux: the inode flags that chattr sets
FS_IMMUTABLE_FL, FS_APPEND_FL = 0x10, 0x20
HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def renameat2(a, b, flags):
    """Linux renameat2(2); OSError(ENOSYS) where the C library or the OS has none."""
    try:
        call = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        raise OSError(errno.ENOSYS, "renameat2 is not available") from None
    at_fdcwd = -100
    if call(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(b))


def cannot_swap(e):
    """renameat2 is missing, or this file system cannot exchange: use two renames instead."""
    return e.errno in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP)


def inode_flags(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return 0
    try:
        buf = bytearray(8)
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf)
        return int.from_bytes(buf[:4], sys.byteorder)
    except OSError:
        return 0  # not Linux, or a file system without flags
    finally:
        os.close(fd)


# A build's own directories beside OUT (its staging, or the previous OUT it moved) hold this
# file, which only build.py writes: a directory is a leftover of a build by it, never by its name.
MARKER = ".kern-prompts-staging"
MARKER_TEXT = b"kern-prompts build.py staged a build here; the next build into OUT removes it\n"
NAME_MAX = 255  # bytes of a file name (Linux and most file systems)
BESIDE = len(".") + len(".tmp-") + 8  # what .OUT.tmp-XXXXXXXX adds to OUT's name (tempfile)


def marked(path):
    """Whether directory `path` holds the marker (a regular file, not a link, of its text)."""
    try:
        fd = os.open(path / MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, 256) == MARKER_TEXT
    finally:
        os.close(fd)


def mark(path):
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path / MARKER, flags, 0o644)
    try:
        os.write(fd, MARKER_TEXT)
        os.fsync(fd)
    finally:
        os.close(fd)


def unmark(path):
    if marked(path):
        os.unlink(path / MARKER)


def stem(name, room=BESIDE):
    """How the names beside OUT (.STEM.lock, .STEM.tmp-*, .STEM.old-*) hold OUT's name: whole,
    or for a name too long to take `room` more bytes, its start and a hash of all of it (also
    what score.py keeps beside its outputs, scoring/trace.py)."""
    raw = os.fsencode(name)
    if len(raw) + room <= NAME_MAX:
        return name
    cut = NAME_MAX - room - 17
    while cut and raw[cut] & 0xC0 == 0x80:  # never inside a UTF-8 character: its start is kept
        cut -= 1  # whole or not at all, so the names beside OUT are UTF-8 as OUT's own name is
    return os.fsdecode(raw[:cut]) + "-" + hashlib.sha256(raw).hexdigest()[:16]


def identity(path):
    """What is at `path` now (None: nothing), to tell whether it was replaced: its type and inode."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return stat.S_IFMT(st.st_mode), st.st_dev, st.st_ino


def regular_files(path):
    """The names in directory `path` (the marker aside), and those that are not regular files of
    a build."""
    names = sorted(n for n in os.listdir(path) if n != MARKER or not marked(path))
    other = [n for n in names if n not in OUT_FILES or not stat.S_ISREG(os.lstat(path / n).st_mode)]
    return names, other


def not_a_build(path):
    """Why directory `path` may not be replaced (None: it is empty, or a build of build.py whose
    files are as its SHA256SUMS says)."""
    names, other = regular_files(path)
    if not names:
        return None
    if other:
        return f"holds files that are not a build ({', '.join(other[:3])})"
    if missing := [n for n in OUT_FILES if n not in names]:
        return f"holds part of a build only (no {', '.join(missing)})"
    try:  # the manifest is as SHA256SUMS lists it, and SHA256SUMS as the manifest makes it
        manifest = orjson.loads((path / "manifest.json").read_bytes())
        same = sums_text(manifest, path).encode() == (path / "SHA256SUMS").read_bytes()
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, UnicodeError):
        same = False
    if not same:
        return "holds files that are not, or no longer, those of one build (SHA256SUMS and the files disagree)"
    return None


def remove_build(path):
    """Remove a directory of build files that a build made; anything else in it stays."""
    names, other = regular_files(path)
    for name in names:
        if name not in other:
            os.unlink(path / name)
    unmark(path)  # last: a build killed while removing leaves a leftover still known as one
    try:
        os.rmdir(path)
    except OSError:
        note(f"kept {path}: it holds files a build does not write ({', '.join(other[:3])})")


def note(text):
    print(f"note: {text}", file=sys.stderr)


@contextmanager
def held_signals():
    """SIGINT, SIGTERM and SIGHUP wait until the block is done. They are held, not blocked: the
    tokenizer's threads would receive a blocked signal and Python would still run its handler in
    this thread, inside the block."""
    held = []
    handlers = {
        s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in HELD_SIGNALS
    }
    try:
        yield
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    if held:
        raise KeyboardInterrupt


class Out:
    """The output directory: checked, locked and staged before the build, replaced at its end."""

    def __init__(self, given):
        self.given = given  # as the user wrote it, for messages
        # A symbolic link is followed, even a dangling one: the build goes where it points.
        self.path = Path(os.path.realpath(given))
        self.parent, self.name = self.path.parent, self.path.name
        self.stem = stem(self.name)
        self.lock_path = self.parent / f".{self.stem}.lock"
        self.found = None  # identity() of OUT when the build started
        self.lock_fd = None
        self.staging = None
        self.published = False

    def prepare(self):
        """Everything that can be found wrong with OUT, before the build; then lock and stage."""
        try:
            self.check_lock_and_stage()
        except OSError as e:  # OUT or a leftover beside it that cannot be read, or moved
            where = f" ({e.filename})" if e.filename else ""
            raise BuildError(f"cannot use OUT {self.given}: {e.strerror or e}{where}") from None

    def check_lock_and_stage(self):
        given = self.given
        if (size := len(os.fsencode(self.name))) > NAME_MAX:  # else an OSError of any test below
            raise BuildError(
                f"OUT {given}: its name is {size} bytes, more than the {NAME_MAX} a file name may "
                "have; choose a shorter name"
            )
        if self.path.is_symlink():
            raise BuildError(
                f"OUT {given} is a symbolic link that leads nowhere; choose another path"
            )
        if self.path.exists() and not self.path.is_dir():
            raise BuildError(f"OUT {given} exists and is not a directory; choose another path")
        here = Path(os.path.realpath(os.getcwd()))
        if self.path == here or self.path in here.parents:
            raise BuildError(
                f"OUT {given} is the current directory or holds it, and OUT is replaced as a "
                "whole; choose a directory in it, such as out"
            )
        if not self.parent.is_dir() or not os.access(self.parent, os.W_OK | os.X_OK):
            raise BuildError(f"cannot write OUT {given}: {self.parent} is not a writable directory")
        self.lock()
        self.recover()
        self.found = identity(self.path)
        if self.path.is_dir():
            if os.path.ismount(self.path):
                raise BuildError(
                    f"OUT {given} is a mount point and cannot be replaced; choose a directory in it"
                )
            if problem := not_a_build(self.path):
                raise BuildError(f"OUT {given} {problem}; choose an empty or new directory")
            stuck = [p for p in [self.path, *(self.path / n for n in os.listdir(self.path))]
                     if inode_flags(p) & (FS_IMMUTABLE_FL | FS_APPEND_FL)]  # fmt: skip
            if stuck:
                raise BuildError(
                    f"OUT {given} cannot be replaced: {stuck[0]} is immutable or append-only "
                    "(chattr); choose another OUT"
                )
        try:
            self.staging = Path(tempfile.mkdtemp(prefix=f".{self.stem}.tmp-", dir=self.parent))
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(self.staging, 0o777 & ~umask)  # a normal new directory, not mkdtemp's 0700
        except OSError as e:
            raise write_failed(self.parent, e, given) from None
        try:
            mark(self.staging)
        except OSError as e:  # the marker is not whole: the directory is known as ours here only
            if os.path.lexists(self.staging / MARKER):
                os.unlink(self.staging / MARKER)
            os.rmdir(self.staging)
            self.staging = None
            raise write_failed(self.parent, e, given) from None

    def lock(self):
        """An exclusive lock on a file beside OUT, for as long as the build runs."""
        for _ in range(10):
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o644)  # fmt: skip
            except OSError as e:
                raise BuildError(
                    f"cannot write OUT {self.given}: {self.lock_path}: {e.strerror}"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise BuildError(
                    f"another build is writing OUT {self.given} (it holds {self.lock_path}); "
                    "wait for it to end, or choose another OUT"
                ) from None
            try:  # the lock holder before us may have removed the file we locked
                if os.fstat(fd).st_ino == os.lstat(self.lock_path).st_ino:
                    self.lock_fd = fd
                    return
            except FileNotFoundError:
                pass
            os.close(fd)
        raise BuildError(f"cannot lock OUT {self.given}: {self.lock_path} keeps changing")

    def recover(self):
        """Restore or remove what a killed build left beside OUT (its staging and old
        directories, named .OUT.tmp-* and .OUT.old-* and holding the marker); anything else
        there is not ours, whatever its name. A link is never followed."""
        if self.path.is_dir() and not self.path.is_symlink():
            unmark(self.path)  # a build killed just before or after its exchange
        pattern = re.compile(re.escape(f".{self.stem}.") + r"(tmp|old)-[A-Za-z0-9_]+")
        for entry in sorted(os.listdir(self.parent)):
            path = self.parent / entry
            if not (m := pattern.fullmatch(entry)) or not stat.S_ISDIR(os.lstat(path).st_mode):
                continue
            if not marked(path):
                continue  # a person's directory named like a leftover
            names, other = regular_files(path)
            if other:
                note(f"left {path} alone: it holds files a build does not write")
            elif (
                m[1] == "old" and names and not os.path.lexists(self.path) and not not_a_build(path)
            ):
                os.rename(path, self.path)
                unmark(self.path)
                note(
                    f"restored OUT {self.given} from {path}, where an interrupted build had moved it"
                )
            else:
                remove_build(path)
                note(f"removed {path}, left by an interrupted build")

    def publish(self):
        """Move the staged build into OUT at once: at every instant OUT holds the old build or
        the new one (Linux exchanges the two directories; elsewhere two renames, which a killed
        build leaves for the next one to recover)."""
        with held_signals():
            self.check_unchanged()
            for name in (*OUT_FILES, MARKER):
                fsync(self.staging / name)
            fsync(self.staging)
            old = None
            if self.found is None:
                try:
                    renameat2(self.staging, self.path, RENAME_NOREPLACE)
                except OSError as e:
                    if not cannot_swap(e):
                        raise
                    os.rename(self.staging, self.path)
            else:
                mark(self.path)  # the previous build: known as ours wherever a kill leaves it
                try:
                    old = self.exchange()
                except BaseException:
                    unmark(self.path)
                    raise
            self.published, self.staging = True, None
            unmark(self.path)
            fsync(self.parent)
            if old is not None:
                remove_build(old)

    def exchange(self):
        """Put the staged build at OUT and the previous one where it was; returns where that is."""
        try:
            renameat2(self.staging, self.path, RENAME_EXCHANGE)
            return self.staging
        except OSError as e:
            if not cannot_swap(e):
                raise
        suffix = self.staging.name[len(f".{self.stem}.tmp-") :]
        old = self.parent / f".{self.stem}.old-{suffix}"
        os.rename(self.path, old)
        try:
            os.rename(self.staging, self.path)
        except OSError:
            os.rename(old, self.path)
            raise
        return old

    def check_unchanged(self):
        """OUT is what it was when the build started (the same directory, or still nothing),
        and holds nothing new: else the build is not published and OUT is left as it is."""
        now = identity(self.path)
        if now != self.found:
            if now is None:
                what = "it was moved away or removed"
            elif self.found is None:
                links = "a symbolic link" if stat.S_ISLNK(now[0]) else file_kind(now[0])
                what = f"{'a file' if stat.S_ISREG(now[0]) else links} was put there"
            else:
                what = "it was moved away and something else put in its place"
            raise BuildError(
                f"OUT {self.given} changed during the build: {what}; the new build is not "
                "published, and what is at OUT is left as it is"
            )
        if self.found is not None and (problem := not_a_build(self.path)):
            raise BuildError(f"OUT {self.given} changed during the build: it {problem}")

    def release(self):
        """Remove the staging directory of a build that did not publish, and the lock."""
        with held_signals():
            if self.staging is not None and self.staging.is_dir():
                remove_build(self.staging)
            self.staging = None
            if self.lock_fd is not None:
                try:
                    if os.fstat(self.lock_fd).st_ino == os.lstat(self.lock_path).st_ino:
                        os.unlink(self.lock_path)
                except OSError:
                    pass
                os.close(self.lock_fd)
                self.lock_fd = None


def write_failed(parent, e, given):
    return BuildError(
        f"cannot write the outputs in {parent} ({e.strerror or e}); free some space there or "
        f"choose another OUT; OUT {given} is unchanged"
    )


def fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot sync a directory
    finally:
        os.close(fd)


# ================================================================================================
# --check (docs/building.md "What a build writes"): compare the outputs with published SHA256SUMS.


# The sha256 lines --check reads, as sha256sum writes them: "HASH  NAME" (text mode), "HASH *NAME"
# (-b) and, with --tag, the BSD form "SHA256 (NAME) = HASH". A name holding a backslash or a line
# break is written escaped, after a backslash that starts the line. ./NAME is NAME.
SUMS_FORMATS = "sha256sum's 'HASH  NAME' and sha256sum --tag's 'SHA256 (NAME) = HASH'"
PLAIN_SUM = re.compile(r"(\\?)([0-9a-fA-F]{64}) [ *](.+)")
TAGGED_SUM = re.compile(r"(\\?)SHA256 ?\((.+)\) ?= ?([0-9a-fA-F]{64})")


def sums_name(name, escaped):
    if escaped:
        name = re.sub(r"\\(.)", lambda m: {"n": "\n", "r": "\r"}.get(m[1], m[1]), name)
    return name.removeprefix("./")


def read_sums(sums_path):
    """Parse published SHA256SUMS. Read before building: it may be OUT's own, which the build
    replaces."""
    try:
        text = read_named(sums_path, "", SUMS_CAP).decode("utf-8")
    except UnicodeDecodeError as e:
        raise BuildError(f"cannot read {sums_path}: {e}") from None
    files, content, rows, packages = {}, {}, [], ""

    def listed(sums, name, digest, number):
        # Which of two sums of one file would count is no choice to make: they contradict each
        # other, and the check would pass or fail by their order. The same sum twice is only said
        # twice (`cat` of two copies, or of both formats), as sha256sum -c also accepts.
        first = sums.setdefault(name, (digest.lower(), number))
        if first[0] != digest.lower():
            raise BuildError(
                f"{sums_path}:{number}: {name} is listed again with another sha256 than at line "
                f"{first[1]}; a file has one sum: remove the wrong line, or fetch SUMS again"
            )

    # split("\n"), not splitlines(): a file name may hold any other line separator
    for number, line in enumerate(text.removesuffix("\n").split("\n"), 1):
        line = line.removesuffix("\r")
        if m := PLAIN_SUM.fullmatch(line):
            listed(files, sums_name(m[3], m[1]), m[2], number)
        elif m := TAGGED_SUM.fullmatch(line):
            listed(files, sums_name(m[2], m[1]), m[3], number)
        elif m := re.fullmatch(r"# content ([0-9a-f]{64})  (\S+)", line):
            listed(content, m[2], m[1], number)
        elif m := re.fullmatch(r"# row (\S+) ([0-9]+) ([0-9a-f]{64}) (.*)", line):
            rows.append((m[1], int(m[2]), m[3], m[4]))
        elif line.startswith("# packages "):
            packages = line[len("# packages ") :]
        elif line.strip() and not line.startswith("#"):  # a sum misread would go unchecked
            raise BuildError(
                f"{sums_path}:{number}: not a sha256 line; --check reads {SUMS_FORMATS}"
            )
    if not files:
        raise BuildError(f"{sums_path}: no sha256 lines; --check reads {SUMS_FORMATS}")
    files = {name: digest for name, (digest, _) in files.items()}
    content = {name: digest for name, (digest, _) in content.items()}
    return dict(files=files, content=content, rows=rows, packages=packages)


def check_sums(published_sums, out, manifest):
    """Compare OUT with published sums (read_sums); return the problems found (empty when all
    match)."""
    files, content = published_sums["files"], published_sums["content"]
    rows, packages = published_sums["rows"], published_sums["packages"]
    problems = []
    ours = " ".join(f"{p}=={v}" for p, v in manifest["packages"].items())
    for split in SPLIT_NAMES:
        name = f"{split}.parquet"
        info = manifest["splits"][split]
        if name not in files:
            problems.append(f"{name}: not listed in the published sums")
            continue
        if files[name] == info["file_sha256"]:
            continue
        if content.get(name) == info["content_sha256"]:
            if packages == ours:
                cause = (
                    f"with the same package versions ({ours}), so the file was written "
                    "otherwise: by another build.py, or changed after the build"
                )
            else:
                cause = f"a toolchain difference (this build: {ours}; published: "
                cause += f"{packages or 'not recorded'})"
            problems.append(f"{name}: same rows, different file bytes: {cause}")
            continue
        published = [r for r in rows if r[0] == split]
        built = [r for r in manifest["rows"] if r["split"] == split]
        first = next(
            (i for i in range(max(len(published), len(built)))
             if i >= len(published) or i >= len(built) or published[i][2] != built[i]["row_sha256"]),
            None,
        )  # fmt: skip
        where = ""
        if first is not None:
            source = built[first]["source"] if first < len(built) else published[first][3]
            where = f"; first differing row: {split} index {first} source {source}"
        problems.append(f"{name}: content differs{where}")
    for name in ("manifest.json", "README.md"):
        if problems:
            break
        if name not in files:
            problems.append(f"{name}: not listed in the published sums")
        elif files[name] != sha256_file(out / name):
            problems.append(f"{name}: differs from the published file")
    if "SHA256SUMS" in files and files["SHA256SUMS"] != sha256_file(out / "SHA256SUMS"):
        problems.append("SHA256SUMS: differs from the published file")
    for name in files:
        if name not in OUT_FILES:  # sha256sum -c in OUT would fail on it
            problems.append(f"{name}: listed in the published sums, but a build does not write it")
    return problems


# ================================================================================================
# Command line


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, but a line is never broken inside a name at its hyphen (`swe-` `smith`)."""

    def _split_lines(self, text, width):
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Build the kern-prompts splits from pinned sources.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("src", type=Path, help="directory holding the fetched sources (fetch.sh)")
    p.add_argument("tokenizer", type=Path, help="the Qwen3.8 tokenizer.json")
    p.add_argument("out", type=Path, help="output directory (replaced as a whole)")
    p.add_argument(
        "--rev",
        type=Path,
        default=HERE / "REV",
        help="Hugging Face pins (default: beside build.py)",
    )
    p.add_argument(
        "--books", type=Path, default=HERE / "BOOKS", help="book pins (default: beside build.py)"
    )
    p.add_argument(
        "--check", type=Path, metavar="SUMS", help="compare the outputs with published SHA256SUMS"
    )
    p.add_argument(
        "--no-verify", action="store_true", help="skip the sha256 of the inputs (sizes are checked)"
    )
    p.add_argument(
        "--any-tokenizer", action="store_true", help="allow a tokenizer that is not the pinned one"
    )
    p.add_argument(
        "--jobs", type=int, default=available_cpus(),
        help="tokenizer threads, at most the CPUs available (more are cut to them; the output "
        "never depends on it)",
    )  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--only", help="build just these sources (NAME,NAME...): " + ", ".join(SOURCES))
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error("--jobs must be at least 1")
    cpus = available_cpus()
    if args.jobs > cpus:  # more threads than CPUs only costs memory: clamped
        args.jobs = cpus
    args.names = list(SOURCES)
    if args.only is not None:
        if not args.only.strip(","):
            p.error(f"--only needs a source name; sources: {', '.join(SOURCES)}")
        unknown = [n for n in args.only.split(",") if n not in SOURCES]
        if unknown:
            p.error(f"unknown source {unknown[0]!r}; sources: {', '.join(SOURCES)}")
        args.names = [n for n in SOURCES if n in args.only.split(",")]
    return args


def available_cpus():
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def not_utf8(path):
    """`path` with the bytes that are not UTF-8 shown escaped, if it has any; else None."""
    raw = os.fsencode(path)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("utf-8", "backslashreplace")
    return None


def check_paths(args):
    """Every path given is a name pyarrow, tokenizers and the messages can hold: valid UTF-8
    (a file name in another encoding, or one that the C locale cannot decode, is either)."""
    named = [("SRC", args.src), ("tokenizer", args.tokenizer), ("OUT", args.out),
             ("--rev", args.rev), ("--books", args.books), ("--check", args.check)]  # fmt: skip
    for what, path in named:
        if path is None:
            continue
        shown = not_utf8(path)
        if shown is not None:
            raise BuildError(
                f"{what} {shown} is not a valid UTF-8 file name; rename it, or give another path"
            )


def load_tokens(args, pinned, stats):
    """The tokenizer: the pinned one unless --any-tokenizer."""
    if not os.path.lexists(args.tokenizer):
        raise BuildError(
            f"tokenizer {args.tokenizer} not found; fetch.sh downloads it to "
            "SRC/Qwen/Qwen3.8-27B/tokenizer.json"
        )
    data = read_named(args.tokenizer, "tokenizer ", TOKENIZER_CAP)
    tokenizer_sha = hashlib.sha256(data).hexdigest()
    if not args.any_tokenizer and (not pinned or pinned[0].sha256 != tokenizer_sha):
        raise BuildError(
            f"tokenizer {args.tokenizer} has sha256 {tokenizer_sha}, not the pinned "
            f"{pinned[0].sha256 if pinned else '(no model line in REV)'}; pass --any-tokenizer "
            "to build with it anyway (the rows will differ from the published ones)"
        )
    with stats.phase("load tokenizer"):
        return Tokens(args.tokenizer, args.jobs, stats, data), tokenizer_sha


def read_and_select(args, files, tok, verified, stats):
    """Read each source and fill its slots: the rows of every split."""
    splits = {s: [] for s in SPLIT_NAMES}
    ahead = ReadAhead(args.names, files)
    try:
        for name in args.names:
            source = SOURCES[name]
            stats.mark(name, "start")
            cands, drop, seconds = ahead.take(name)
            stats.source(name).read_s += seconds
            stats.mark(name, "read")
            t0 = time.perf_counter()
            for split, rows in select_splits(source, cands, drop, tok, args.quiet).items():
                splits[split] += rows
            stats.source(name).select_s += time.perf_counter() - t0
            del cands
            release_memory()
            stats.mark(name, "done")
            verified(wait=False)  # stop at a mismatch found so far
    finally:
        ahead.close()
    return splits


def read_source(name, files, stop=None):
    """A source's candidates, the rows its reader dropped, and the seconds reading took; None
    when `stop` was set before the end."""
    source, drop, cands = SOURCES[name], Counter(), []
    t0 = time.perf_counter()
    for c in READERS[name](source, files[name], drop):
        if stop is not None and stop.is_set():
            return None
        cands.append(c)
    return cands, drop, time.perf_counter() - t0


READ_AHEAD_SWITCH_S = 0.0005  # the GIL's switch interval while a thread reads ahead
READ_AHEAD_NICE = 10  # and its priority


class ReadAhead:
    """Sources read in a thread while the slots of an earlier one are filled: filling is mostly
    the tokenizer's threads, which leave a core partly idle. After a source is read in the main
    thread, the sources after it are read ahead, up to one that is read alone. Each is taken in
    order, so a reader's error is raised where reading in order would raise it. The switch
    interval is shortened meanwhile: the main thread, back from the tokenizer, would otherwise
    wait up to 5 ms for the interpreter lock at every call."""

    def __init__(self, names, files):
        self.names, self.files = names, files
        self.results = {}  # name -> (cands, drop, seconds), or the exception its reader raised
        self.ready = {}  # name -> an Event set when its result is there
        self.stop = threading.Event()
        self.switch = None

    def take(self, name):
        if name not in self.ready:
            result = read_source(name, self.files)
            self.start(self.names[self.names.index(name) + 1 :])
            return result
        self.ready.pop(name).wait()  # the thread sets it through its own reference
        result = self.results.pop(name, None)
        if isinstance(result, BaseException):
            raise result
        return result or read_source(name, self.files)  # None: not read ahead after all

    def start(self, later):
        ahead = []
        for name in later:
            if SOURCES[name].read_alone:
                break
            ahead.append(name)
        if not ahead:
            return
        ready = {name: threading.Event() for name in ahead}
        self.ready |= ready
        if self.switch is None:
            self.switch = sys.getswitchinterval()
            sys.setswitchinterval(READ_AHEAD_SWITCH_S)
        threading.Thread(target=self.run, args=(ready,), name="read ahead", daemon=True).start()

    def run(self, ready):
        try:  # below the tokenizer's threads (Linux: a thread's own nice value), so that it
            # takes the cores they leave idle rather than a share of their work
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), READ_AHEAD_NICE)
        except (OSError, AttributeError):
            pass
        try:
            for name, event in ready.items():
                try:
                    result = read_source(name, self.files, self.stop)
                except BaseException as e:  # for take() to raise in the main thread
                    result = e
                self.results[name] = result
                event.set()  # from here on, take() may have popped both
                if self.stop.is_set() or isinstance(result, BaseException):
                    return  # the build stops at this one: the later ones are never taken
        finally:
            for event in ready.values():
                event.set()  # nothing waits for a source that will not be read

    def close(self):
        """Stop reading ahead (the build ends, or fails), and give back the switch interval."""
        self.stop.set()
        if self.switch is not None:
            sys.setswitchinterval(self.switch)
            self.switch = None


def build(args, out, stats):
    out.prepare()
    published_sums = read_sums(args.check) if args.check else None
    if not args.src.is_dir():
        raise BuildError(
            f"SRC {args.src} is not a directory; download the sources with "
            f"`mkdir -p {args.src} && (cd {args.src} && bash {HERE / 'fetch.sh'})`"
        )
    claimed = {}  # REV and BOOKS together name each file once (docs/building.md)
    rev_pins, book_pins = (
        read_pins(args.rev, "rev", claimed),
        read_pins(args.books, "books", claimed),
    )
    files = {name: source_files(SOURCES[name], rev_pins, book_pins) for name in args.names}
    inputs = [p for name in args.names for p in files[name]]
    with stats.phase("verify sizes"):
        verified = verify(inputs, args.src, not args.no_verify, args.quiet)
    try:
        tok, tokenizer_sha = load_tokens(args, [p for p in rev_pins if p.kind == "model"], stats)
        splits = read_and_select(args, files, tok, verified, stats)
    except BuildError:
        verified()  # a file that is not the pinned one explains a reader's error best
        raise
    except AssertionError:  # a bug of build.py: reported as it is, once the verify bar has ended
        with suppress(BuildError):  # its line (else the error line is glued to it)
            verified()
        raise
    with stats.phase("verify sha256 (waiting for the thread)"):
        verified()
    try:
        with stats.phase("write outputs"):
            manifest = build_outputs(splits, args.names, inputs, tokenizer_sha, out.staging)
        out.publish()
    except OSError as e:
        raise write_failed(out.parent, e, args.out) from None

    if not args.quiet:
        print_summary(manifest)
    if args.check:
        problems = check_sums(published_sums, out.path, manifest)
        for problem in problems:
            print(f"check: {problem}", file=sys.stderr)
        if problems:
            return 1
        print(f"check: every file matches {args.check}", file=sys.stderr)
    return 0


def release_memory():
    """Give freed memory back to the system between sources, so that their peaks do not add up."""
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: the memory is reused by the next source instead


def print_summary(manifest):
    print(f"{'source':18} {'smoke':>5} {'standard':>8} {'full':>5}  prompt tokens", file=sys.stderr)
    for name in SOURCES:
        rows = [r for r in manifest["rows"] if r["name"] == name]
        if rows:
            counts = [sum(r["split"] == s for r in rows) for s in SPLIT_NAMES]
            tokens = [r["prompt_tokens"] for r in rows]
            print(
                f"{name:18} {counts[0]:5} {counts[1]:8} {counts[2]:5}  {min(tokens):,} – {max(tokens):,}",
                file=sys.stderr,
            )


def main(argv=None, stats=None):
    args = parse_args(argv)

    def terminate(signum, frame):
        raise KeyboardInterrupt

    out = None
    try:
        try:
            for s in HELD_SIGNALS:  # from here on, a signal ends the build through `finally`
                signal.signal(s, terminate)
            check_paths(args)
            out = Out(args.out)
            return build(args, out, stats or Stats())
        finally:
            if out is not None:
                out.release()
    except BuildError as e:
        return fail(f"error: {e}", 1)
    except KeyboardInterrupt:
        state = "holds the new build" if out is not None and out.published else "is unchanged"
        return fail(f"error: interrupted; OUT {args.out} {state}", 130)
    except UnicodeEncodeError as e:  # a name this locale's file names cannot hold
        return fail(f"error: {e.object!r} cannot be a file name in this locale (file names are "
                    f"{sys.getfilesystemencoding()}); run with PYTHONUTF8=1", 1)  # fmt: skip
    except AssertionError as e:  # a bug of build.py, not the user's: still one line
        return fail(f"error: internal error in build.py ({e or 'an assertion failed'}); "
                    f"please report it with the command line", 70)  # fmt: skip


def fail(message, code):
    """One line on stderr, whatever the message holds (a library's message may span lines). A
    progress bar still open is ended first, so that the line is a line of its own: a signal that
    comes while a bar is being made (its first line written, its `with` not yet entered) leaves it
    open, and the message would follow it on the same line."""
    try:
        for bar in list(getattr(tqdm, "_instances", ())):
            bar.close()
        print(re.sub(r"\s*[\r\n]\s*", " ", message.strip()), file=sys.stderr)
    except OSError:
        pass  # stderr is gone (a closed terminal): the exit status still tells
    return code


if __name__ == "__main__":
    sys.exit(main())
