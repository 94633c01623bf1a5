#!/usr/bin/env python3
"""Build the kern-prompts splits (smoke, standard, full) from pinned source files.

    python build.py SRC TOKENIZER OUT [--rev FILE] [--books FILE] [--check SUMS] [--no-verify]
                    [--any-tokenizer] [--jobs N] [--quiet] [--only NAME[,NAME...]]

The file reads like the dataset card: the source and slot tables, one reader per source, the one
selection engine, token counting, writing, and the command line. There is no randomness: candidates
are ordered by the sha256 of their id, and the first that fit a slot are taken.
"""

import argparse
import bisect
import hashlib
import heapq
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import unicodedata
from collections import Counter
from importlib.metadata import version
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

HERE = Path(__file__).resolve().parent
SPLITS = ("smoke", "standard", "full")
PACKAGES = ("tokenizers", "pyarrow", "orjson", "tqdm")
INF = float("inf")


# ------------------------------------------------------------------------------------------------
# Sources and slots: the card's Composition table as data (DESIGN.md 4.3).
#
# A slot takes `count` candidates of one split whose fields match `where` and whose view has
# prompt tokens in [lo, hi]. Views: "whole" (the candidate's messages), "before-last" (up to the
# last assistant turn), "cut" (the longest prefix within T tokens that stops before an assistant
# turn), "book" (instruction + a book's text up to the last paragraph end within T tokens).
# A "longest" slot takes the candidates with the most prompt tokens instead of the first in order.


def slot(split, count, lo, hi, view="whole", T=None, longest=False, **where):
    return dict(
        split=split, count=count, lo=lo, hi=hi, view=view, T=T, longest=longest, where=where
    )


def longbench_slots():
    full = [slot("full", 6, 1, 1_000_000, bucket="256k", group=g) for g in ("English", "Chinese")]
    standard = [
        slot("standard", n, 1, 180_000, bucket=bucket, group=group)
        for bucket, en, zh in (
            ("8k", 3, 2),
            ("16k", 2, 3),
            ("32k", 3, 2),
            ("64k", 2, 3),
            ("128k", 3, 2),
        )
        for group, n in (("English", en), ("Chinese", zh))
    ]
    return full + standard


MRCR_FULL = [(180_001, 262_144), (262_145, 393_216), (393_217, 524_288), (524_289, 655_360),
             (655_361, 786_432), (786_433, 1_000_000)]  # fmt: skip
MRCR_STANDARD = [(8_192, 16_384), (16_385, 32_768), (32_769, 65_536), (65_537, 131_072),
                 (131_073, 180_000)]  # fmt: skip
BOOK_STANDARD_T = ((2_048, 1_536), (16_384, 12_288), (131_072, 98_304))  # (T, lo)

SOURCES = {
    "longbench-pro": dict(
        repo="caskcsg/LongBench-Pro", groups=("English", "Chinese"), slots=longbench_slots()
    ),
    "mrcr": dict(
        repo="openai/mrcr",
        slots=[slot("full", 1, lo, hi) for lo, hi in MRCR_FULL]
        + [slot("standard", 1, lo, hi) for lo, hi in MRCR_STANDARD],
    ),
    "swe-smith": dict(
        repo="SWE-bench/SWE-smith-trajectories",
        slots=[slot("full", 4, 1, 1_000_000, view="before-last", longest=True)]
        + [
            slot("standard", 3, T * 3 // 4, T, view="cut", T=T)
            for T in (131_072, 65_536, 32_768, 16_384)
        ],
    ),
    "nemotron-agentic": dict(
        repo="nvidia/Nemotron-Agentic-v1",
        slots=[
            slot("standard", 3, 3_000, 12_000, view="before-last", ends=r) for r in ("tool", "user")
        ],
    ),
    "wildchat": dict(
        repo="allenai/WildChat-4.8M",
        groups=("English", "Chinese"),
        slots=[
            slot("standard", n, 64, 4_096, view="before-last", group=g)
            for g, n in (("English", 6), ("Chinese", 9), ("Russian", 1), ("Japanese", 1))
        ],
    ),
    "gsm8k": dict(repo="openai/gsm8k", slots=[slot("standard", 4, 1, 180_000)]),
    "numinamath": dict(
        repo="AI-MO/NuminaMath-1.5", slots=[slot("full", 4, 32, 200), slot("standard", 4, 32, 200)]
    ),
    "humaneval": dict(repo="openai/openai_humaneval", slots=[slot("standard", 3, 1, 180_000)]),
    "mbpp": dict(repo="google-research-datasets/mbpp", slots=[slot("standard", 3, 1, 180_000)]),
    "mimo": dict(
        repo="XiaomiMiMo/MiMo-V2.6-RL-oss",
        groups=("webdev", "music"),
        slots=[
            slot("full", 3, 1, 700, group="webdev"),
            slot("full", 2, 1, 700, group="music", lang="en"),
            slot("full", 1, 1, 700, group="music", lang="zh"),
            slot("standard", 4, 1, 700, group="webdev"),
            slot("standard", 2, 1, 700, group="music", lang="zh"),
            slot("standard", 1, 1, 700, group="music", lang="en"),
        ],
    ),
    "longwriter": dict(
        repo="zai-org/LongWriter-6k",
        groups=("en", "zh"),
        slots=[
            slot(split, n, 1, 750, group=g)
            for split, n in (("full", 3), ("standard", 2))
            for g in ("en", "zh")
        ],
    ),
    "gutenberg": dict(
        repo=None,  # one repo per book, pinned in BOOKS
        groups=("en", "zh"),
        slots=[
            slot("full", 1, 294_912, 393_216, view="book", T=393_216, group=g) for g in ("en", "zh")
        ]
        + [
            slot("standard", 1, lo, T, view="book", T=T, group=g)
            for T, lo in BOOK_STANDARD_T
            for g in ("en", "zh")
        ],
    ),
}

BOOK_INSTRUCTION = {
    "en": "Continue the following text from where it stops.",
    "zh": "請從這段文字停下的地方接著寫下去。",
}


class BuildError(Exception):
    """A problem with the user's inputs or environment: printed as one line, no traceback."""


# ------------------------------------------------------------------------------------------------
# Pin files (DESIGN.md 2): plain text, columns separated by runs of spaces, `#` starts a comment.


def read_pins(path, kind):
    """REV lines -> dicts; BOOKS lines -> dicts. Malformed or duplicated lines are errors."""
    columns = {
        "rev": ("kind", "repo", "revision", "path", "bytes", "sha256"),
        "books": ("ebook", "lang", "repo", "revision", "path", "bytes", "sha256"),
    }[kind]
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise BuildError(f"cannot read pin file {path}: {e}") from None
    pins, seen = [], {}
    for number, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        where = f"{path}:{number}"
        if len(fields) < len(columns) or (kind == "rev" and len(fields) != len(columns)):
            raise BuildError(
                f"{where}: expected columns {' '.join(columns)}{' title' if kind == 'books' else ''}"
            )
        pin = dict(zip(columns, fields))
        pin["title"] = " ".join(fields[len(columns) :])
        if kind == "rev" and pin["kind"] not in ("dataset", "model"):
            raise BuildError(f"{where}: kind must be dataset or model, not {pin['kind']!r}")
        if kind == "books" and pin["lang"] not in BOOK_INSTRUCTION:
            raise BuildError(f"{where}: lang must be en or zh, not {pin['lang']!r}")
        if not (pin["bytes"] == "-" or pin["bytes"].isdigit()):
            raise BuildError(f"{where}: bytes must be a number or -, not {pin['bytes']!r}")
        if not (pin["sha256"] == "-" or re.fullmatch(r"[0-9a-f]{64}", pin["sha256"])):
            raise BuildError(f"{where}: sha256 must be 64 lowercase hex digits or -")
        if pin["path"].startswith("/") or ".." in pin["path"].split("/"):
            raise BuildError(f"{where}: path {pin['path']!r} must be relative without ..")
        pin["bytes"] = None if pin["bytes"] == "-" else int(pin["bytes"])
        pin["sha256"] = None if pin["sha256"] == "-" else pin["sha256"]
        dest = (pin["repo"], pin["path"])
        if dest in seen:
            raise BuildError(f"{where}: duplicates line {seen[dest]} ({pin['repo']}/{pin['path']})")
        seen[dest] = number
        pins.append(pin)
    return pins


def source_files(name, rev_pins, book_pins):
    """The pins a source reads, in pin-file order (its rows are numbered in this order)."""
    if name == "gutenberg":
        files = book_pins
    else:
        files = [
            p for p in rev_pins if p["kind"] == "dataset" and p["repo"] == SOURCES[name]["repo"]
        ]
    if not files:
        raise BuildError(
            f"no pinned files for source {name} in {'BOOKS' if name == 'gutenberg' else 'REV'}"
        )
    if name != "gutenberg" and len({p["revision"] for p in files}) != 1:
        raise BuildError(f"REV pins {SOURCES[name]['repo']} at more than one revision")
    return files


def verify(pins, src, hash_files, quiet):
    """Check every pinned file is present with its size now, and (unless --no-verify) its sha256
    in a thread while the sources are read: hashlib lets go of the GIL, so the hashing costs
    little wall time. Returns `verified(wait=True)`, which raises the first mismatch found."""
    for pin in pins:
        pin["file"] = Path(src) / pin["repo"] / pin["path"]
        if not pin["file"].is_file():
            raise BuildError(
                f"missing source file {pin['file']}; download the sources with "
                f"`mkdir -p {src} && (cd {src} && bash {HERE / 'fetch.sh'})`"
            )
        size = pin["file"].stat().st_size
        if pin["bytes"] is not None and size != pin["bytes"]:
            raise BuildError(
                f"{pin['file']}: {size} bytes, expected {pin['bytes']} "
                f"({'truncated' if size < pin['bytes'] else 'too long'}); fetch it again with fetch.sh"
            )
        pin["size"] = size
    todo = [p for p in pins if hash_files]
    failed = []

    def hash_files_in_order():
        with tqdm(total=sum(p["size"] for p in todo), unit="B", unit_scale=True, desc="verify",
                  disable=quiet, file=sys.stderr) as bar:  # fmt: skip
            for pin in todo:
                try:
                    pin["actual_sha256"] = sha256_file(pin["file"], bar.update)
                except OSError as e:
                    failed.append(BuildError(f"cannot read {pin['file']}: {e.strerror or e}"))
                    return
                if pin["sha256"] is not None and pin["actual_sha256"] != pin["sha256"]:
                    failed.append(BuildError(
                        f"{pin['file']}: sha256 {pin['actual_sha256']}, expected {pin['sha256']}; "
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


# ------------------------------------------------------------------------------------------------
# Readers: one per source. Each yields candidates: dicts with `id` ("<repo>@<revision>#<row>"),
# `key` (sha256 of the id), `messages` (OpenAI format of DESIGN.md 4.1) or a `fetch` to load them
# later, `tools`, `unique` (the uniqueness rule's key) and the fields that slots filter on.
# `drop` counts rows a reader rejects for the source-level filters of the table.


def candidate(repo, revision, row, messages=None, **fields):
    cid = f"{repo}@{revision}#{row}"
    defaults = {"messages": messages, "tools": None, "unique": None}
    return {"id": cid, "key": sha256_hex(cid), "row": row, **defaults, **fields}


def sha256_hex(text):
    return hashlib.sha256(text.encode()).hexdigest()


def user(content):
    return [{"role": "user", "content": content}]


def openai_message(m, where):
    """Keep the OpenAI chat fields of a message, in the order of DESIGN.md 4.1."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise BuildError(f"{where}: a message without a role")
    content = m.get("content")
    if content is not None and not isinstance(content, str):
        content = orjson.dumps(content).decode()  # structured content: its compact JSON
    out = {"role": m["role"], "content": content}
    if m.get("name") is not None:
        out["name"] = m["name"]
    if m.get("tool_calls"):
        calls = m["tool_calls"]
        if not isinstance(calls, list) or not all(
            isinstance(c, dict) and isinstance(c.get("function"), dict) and "name" in c["function"]
            for c in calls
        ):
            raise BuildError(f"{where}: a tool call without function.name")
        out["tool_calls"] = [
            {
                "id": call.get("id"),
                "type": call.get("type") or "function",
                "function": {
                    "name": call["function"]["name"],
                    "arguments": arguments
                    if isinstance(arguments := call["function"].get("arguments"), str)
                    else orjson.dumps(arguments).decode(),
                },
            }
            for call in m["tool_calls"]
        ]
    elif content is None:
        out["content"] = ""  # null only on an assistant turn that calls tools
    if m.get("tool_call_id") is not None:
        out["tool_call_id"] = m["tool_call_id"]
    return out


def openai_messages(messages, where):
    if not isinstance(messages, list) or not messages:
        raise BuildError(f"{where}: messages is not a non-empty list")
    return [openai_message(m, where) for m in messages]


def last_assistant(messages):
    """Index of the last assistant message, the end of a before-last view (None if unusable)."""
    for k in range(len(messages) - 1, 0, -1):
        if messages[k]["role"] == "assistant":
            return k if messages[k - 1]["role"] in ("user", "tool") else None
    return None


def text_bytes(text):
    """An upper bound on the token count of a text: its UTF-8 length after NFC normalization."""
    if not isinstance(text, str):
        return 0
    if text.isascii():
        return len(text)
    if not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
    return len(text.encode())


def messages_bytes(messages):
    return sum(text_bytes(m["content"]) for m in messages)


def parquet_rows(files, columns, keep=None):
    """Yield (row, record, where) over parquet files in pin order, reading only `columns`.

    A column "a.b" reads just the leaf b of a struct or list-of-struct column a. `keep`, a
    function of a record batch giving a boolean mask, drops rows before they become Python."""
    row = 0
    for pin in files:
        path, local = pin["file"], 0
        try:
            pf = pq.ParquetFile(path)
            leaves = [pf.schema.column(i).path for i in range(len(pf.schema))]
            wanted = []
            for col in columns:
                head, _, leaf = col.partition(".")
                found = [
                    p
                    for p in leaves
                    if p == col
                    or (p.startswith(head + ".") and (not leaf or p.endswith("." + leaf)))
                ]
                if not found:
                    raise BuildError(
                        f"{path}: no column {col!r}; the file is not the pinned one, fetch it again"
                    )
                wanted += found if leaf else [col]
            for batch in pf.iter_batches(columns=wanted, batch_size=4096 if keep else 256):
                n, offsets = batch.num_rows, range(batch.num_rows)
                if keep is not None:
                    mask = keep(batch).fill_null(False)
                    offsets = pc.indices_nonzero(mask).to_pylist()
                    batch = batch.filter(mask)
                for i, record in zip(offsets, batch.to_pylist()):
                    yield row + i, record, f"{path} row {local + i}"
                row, local = row + n, local + n
        except (pa.ArrowException, OSError) as e:
            raise BuildError(
                f"{path}: unreadable parquet near row {local} ({e}); fetch it again"
            ) from None


def parquet_lengths(files, column):
    """Yield (row, UTF-8 length of `column`, its Arrow value, where) without making Python strings
    of the values: the caller may ask one for its string with .as_py()."""
    row = 0
    for pin in files:
        first = row  # messages give the row within the file
        try:
            pf = pq.ParquetFile(pin["file"])
            if column not in pf.schema_arrow.names:
                raise BuildError(
                    f"{pin['file']}: no column {column!r}; the file is not the pinned one, fetch it again"
                )
            for batch in pf.iter_batches(columns=[column], batch_size=16):
                values = batch.column(0)
                for i, n in enumerate(pc.binary_length(values).to_pylist()):
                    if n is None:
                        raise BuildError(f"{pin['file']} row {row - first}: no field {column!r}")
                    yield row, n, values[i], f"{pin['file']} row {row - first}"
                    row += 1
            del pf
            pa.default_memory_pool().release_unused()
        except (pa.ArrowException, OSError) as e:
            raise BuildError(
                f"{pin['file']}: unreadable parquet near row {row - first} ({e}); fetch it again"
            ) from None


def parquet_fetch(files, column, convert):
    """A loader for lazy candidates: reads `column` of the row groups that hold the rows asked
    for, and converts those rows."""

    def fetch(cands):
        wanted = {c["row"]: c for c in cands}
        first = 0  # the file's first row in the source's numbering
        for pin in files:
            row = first
            try:
                pf = pq.ParquetFile(pin["file"])
                for g in range(pf.num_row_groups):
                    n = pf.metadata.row_group(g).num_rows
                    if not any(row <= r < row + n for r in wanted):
                        row += n
                        continue
                    for batch in pf.iter_batches(columns=[column], batch_size=64, row_groups=[g]):
                        values = batch.column(0)
                        for i in range(len(values)):
                            if (c := wanted.get(row + i)) is not None:
                                where = f"{pin['file']} row {c['row'] - first}"
                                c["messages"] = convert(values[i].as_py(), where)
                        row += len(values)
                first += pf.metadata.num_rows
                del pf
                pa.default_memory_pool().release_unused()
            except (pa.ArrowException, OSError) as e:
                raise BuildError(
                    f"{pin['file']}: unreadable parquet near row {row - first} ({e}); fetch it again"
                ) from None

    return fetch


def json_lines(pin):
    """Yield (line number from 0, (byte offset, length), parsed object) of a JSONL file."""
    with open(pin["file"], "rb") as f:
        offset = 0
        for number, line in enumerate(f):
            try:
                yield number, (offset, len(line)), orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise BuildError(
                    f"{pin['file']} line {number + 1}: not JSON ({e}); fetch it again"
                ) from None
            offset += len(line)


def field(record, name, where):
    if not isinstance(record, dict) or record.get(name) is None:
        raise BuildError(f"{where}: no field {name!r}")
    return record[name]


def json_array_elements(data, path):
    """(start, end) byte spans of the objects of a JSON array, without parsing it whole.

    Strings are skipped with bytes.find (a quote ends one unless an odd run of backslashes
    precedes it), so only the few bytes between strings are looked at one by one."""
    if not data.lstrip().startswith(b"["):
        raise BuildError(f"{path}: not a JSON array of rows; fetch it again")
    depth, start, spans, i = 0, 0, [], 0
    while True:
        q = data.find(b'"', i)
        between = data[i : q if q >= 0 else len(data)]
        if any(b in between for b in (b"[", b"]", b"{", b"}")):
            for k, byte in enumerate(between, i):
                if byte in b"[{":
                    depth += 1
                    start = k if depth == 2 else start
                elif byte in b"]}":
                    depth -= 1
                    if depth == 1:
                        spans.append((start, k + 1))
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
    if depth != 0:
        raise BuildError(f"{path}: not JSON (truncated or unbalanced); fetch it again")
    return spans


def read_longbench(files, drop):
    """One JSON array of 1,500 rows (532 MB): each row is parsed on its own and only its fields'
    sizes are kept, so the file's texts are never all in memory at once."""
    (pin,) = files
    data = pin["file"].read_bytes()
    for row, (start, end) in enumerate(json_array_elements(data, pin["file"])):
        where = f"{pin['file']} row {row}"
        try:
            r = orjson.loads(data[start:end])
        except orjson.JSONDecodeError as e:
            raise BuildError(f"{where}: not JSON ({e}); fetch it again") from None
        context, question = field(r, "context", where), field(r, "question_thinking", where)
        c = candidate(pin["repo"], pin["revision"], row, group=field(r, "language", where),
                      bucket=field(r, "token_length", where), fetch=longbench_fetch,
                      unique=hashlib.sha256(context.encode()).digest())  # fmt: skip
        c["bound"] = text_bytes(context) + 4 + text_bytes(question)
        c["file"], c["span"], c["size"] = pin["file"], (start, end), end - start
        yield c


def longbench_fetch(cands):
    with open(cands[0]["file"], "rb") as f:
        for c in cands:
            f.seek(c["span"][0])
            r = orjson.loads(f.read(c["span"][1] - c["span"][0]))
            c["messages"] = user(r["context"] + "\n\n\n\n" + r["question_thinking"])


def read_mrcr(files, drop):
    """Prompts of up to 5M characters, read in one pass: every prompt's length, and the text of
    the first rows in sha256 order, a loading window's worth (usually all the slots look at).
    Other rows are read again if they are looked at."""

    def convert(prompt, where):
        try:
            return openai_messages(orjson.loads(prompt), where)
        except (orjson.JSONDecodeError, TypeError):
            raise BuildError(f"{where}: prompt is not a JSON list of messages") from None

    repo, revision = files[0]["repo"], files[0]["revision"]
    fetch = parquet_fetch(files, "prompt", convert)
    # first: a heap of the rows kept so far, the last of them in sha256 order on top
    cands, first, size = [], [], 0
    for row, n, value, where in parquet_lengths(files, "prompt"):
        c = candidate(repo, revision, row, fetch=fetch, size=n)
        c["bound"] = 3 * n  # the JSON is at least as long as its texts; NFC at most triples a text
        cands.append(c)
        order = -int(c["key"], 16)
        if size + n <= WINDOW_BYTES or not first or order > first[0][0]:
            heapq.heappush(first, (order, row, value.as_py(), where))
            size += n
            while size > WINDOW_BYTES and len(first) > 1:
                size -= cands[heapq.heappop(first)[1]]["size"]
    for _, row, prompt, where in first:
        c = cands[row]
        c["messages"] = convert(prompt, where)
        tighten_bound(c)
    yield from cands


def swe_messages(value, where):
    """SWE-smith messages: a JSON string, sometimes a JSON string of a JSON string."""
    try:
        messages = orjson.loads(value)
        if isinstance(messages, str):
            messages = orjson.loads(messages)
    except (orjson.JSONDecodeError, TypeError):
        raise BuildError(f"{where}: messages is not JSON") from None
    return openai_messages(messages, where)


def read_swe_smith(files, drop):
    repo, revision = files[0]["repo"], files[0]["revision"]
    fetch = parquet_fetch(files, "messages", swe_messages)
    for row, r, where in parquet_rows(files, ["messages", "traj_id"]):
        messages = swe_messages(field(r, "messages", where), where)
        k = last_assistant(messages)
        if k is None:
            drop["no assistant turn after a user turn"] += 1
            continue
        # Only the trajectory's size is kept; its messages are read again when looked at.
        c = candidate(repo, revision, row, unique=field(r, "traj_id", where), fetch=fetch)
        c["bound"] = messages_bytes(messages[:k])
        yield c


def read_nemotron(files, drop):
    (pin,) = files
    for row, (offset, size), r in json_lines(pin):
        where = f"{pin['file']} line {row + 1}"
        messages = openai_messages(field(r, "messages", where), where)
        k = last_assistant(messages)
        if k is None or not answered_tool_calls(messages[:k]):
            drop["no usable assistant turn" if k is None else "tool message without a call"] += 1
            continue
        # No bound yet: sizing every row's text costs more than the few rows looked at need.
        c = candidate(
            pin["repo"], pin["revision"], row, ends=messages[k - 1]["role"], fetch=nemotron_fetch
        )
        c["offset"], c["size"], c["file"] = offset, size, pin["file"]
        yield c


def nemotron_fetch(cands):
    for c in cands:
        with open(c["file"], "rb") as f:
            f.seek(c["offset"])
            r = orjson.loads(f.readline())
        c["messages"] = openai_messages(r["messages"], c["id"])
        tools = r.get("tools")
        c["tools"] = orjson.dumps(tools).decode() if tools else None


def answered_tool_calls(messages):
    """Every tool message answers a tool call made earlier in the conversation."""
    calls = set()
    for m in messages:
        calls.update(call["id"] for call in m.get("tool_calls", ()))
        if m["role"] == "tool" and m.get("tool_call_id") not in calls:
            return False
    return True


def read_wildchat(files, drop):
    repo, revision = files[0]["repo"], files[0]["revision"]
    columns = ["conversation.role", "conversation.content", "language", "toxic", "redacted", "turn"]
    for row, r, where in parquet_rows(files, columns):
        for name in ("conversation", "language", "toxic", "redacted", "turn"):
            field(r, name, where)
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
        c = candidate(
            repo, revision, row, messages, group=r["language"], unique=messages[0]["content"]
        )
        c["bound"] = messages_bytes(messages[:k])
        yield c


def read_gsm8k(files, drop):
    for row, r, where in parquet_rows(files, ["question"]):
        yield candidate(
            files[0]["repo"], files[0]["revision"], row, user(field(r, "question", where))
        )


def read_numinamath(files, drop):
    def olympiads(batch):  # source == "olympiads" and not synthetic, decided in Arrow
        return pc.and_(pc.equal(batch["source"], "olympiads"), pc.equal(batch["synthetic"], False))

    kept = 0
    for row, r, where in parquet_rows(files, ["problem", "source", "synthetic"], keep=olympiads):
        kept += 1
        yield candidate(
            files[0]["repo"], files[0]["revision"], row, user(field(r, "problem", where))
        )
    total = sum(pq.ParquetFile(pin["file"]).metadata.num_rows for pin in files)
    drop["source is not olympiads, or synthetic"] += total - kept


def read_humaneval(files, drop):
    for row, r, where in parquet_rows(files, ["prompt"]):
        prompt = field(r, "prompt", where)
        prompt += "" if prompt.endswith("\n") else "\n"
        content = "Complete the following Python function.\n\n```python\n" + prompt + "```"
        yield candidate(files[0]["repo"], files[0]["revision"], row, user(content))


def read_mbpp(files, drop):
    for row, r, where in parquet_rows(files, ["prompt", "test_list"]):
        content = (
            "You are an expert Python programmer, and here is your task: "
            + field(r, "prompt", where)
            + " Your code should pass these tests:\n\n"
            + "\n".join(field(r, "test_list", where))
        )
        yield candidate(files[0]["repo"], files[0]["revision"], row, user(content))


def read_mimo(files, drop):
    row = 0
    for pin in files:  # webdev.parquet, then music.parquet
        group = Path(pin["path"]).stem
        columns = ["prompt"] + (["extra_info.lang"] if group == "music" else [])
        for _, r, where in parquet_rows([pin], columns):
            lang = field(field(r, "extra_info", where), "lang", where) if group == "music" else None
            messages = openai_messages(field(r, "prompt", where), where)
            yield candidate(pin["repo"], pin["revision"], row, messages, group=group, lang=lang)
            row += 1


def cjk_share(text):
    cjk = sum(1 for ch in text if "\u3400" <= ch <= "\u4dbf" or "\u4e00" <= ch <= "\u9fff")
    return cjk / max(len(text), 1)


def read_longwriter(files, drop):
    (pin,) = files
    for row, _, r in json_lines(pin):
        where = f"{pin['file']} line {row + 1}"
        first = openai_messages(field(r, "messages", where), where)[0]
        if first["role"] != "user":
            drop["first message is not a user turn"] += 1
            continue
        group = "zh" if cjk_share(first["content"]) >= 0.1 else "en"
        yield candidate(pin["repo"], pin["revision"], row, [first], group=group)


# Project Gutenberg boilerplate (DESIGN.md 4.3, "Books, precisely").
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


def read_gutenberg(files, drop):
    for pin in files:
        try:
            text = pin["file"].read_bytes().decode("utf-8").replace("\r\n", "\n")
        except UnicodeDecodeError as e:
            raise BuildError(f"{pin['file']}: not UTF-8 ({e}); fetch it again") from None
        start, end = book_body(text)
        if end <= start:
            raise BuildError(f"{pin['file']}: no text between the Project Gutenberg markers")
        ends = [m.start() for m in PARAGRAPH_END.finditer(text, start + 1, end)] + [end]
        book_id = f"{pin['repo']}@{pin['revision']}"
        yield dict(id=book_id, key=sha256_hex(book_id), messages=None, tools=None, unique=book_id,
                   group=pin["lang"], text=text, start=start, ends=ends)  # fmt: skip


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


# ------------------------------------------------------------------------------------------------
# Selection (DESIGN.md 4.2): candidates in ascending sha256 of their id; each goes to the first
# open slot whose filter it passes and whose view is within the slot's token range.

WINDOW_BYTES = 96 << 20  # how much text lazy candidates may load at once


def matches(s, c):
    return all(c.get(k) == v for k, v in s["where"].items())


def view(s, c, limit):
    """The slot's view of a candidate: (messages, k or None, prompt tokens) or None.

    Tokens are exact when they are at most `limit`; otherwise some number above it."""
    messages = c["messages"]
    if s["view"] == "whole":
        return messages, None, prompt_tokens(c, len(messages), limit)
    if s["view"] == "before-last":
        k = last_assistant(messages)
        return None if k is None else (messages[:k], k, prompt_tokens(c, k, limit))
    if s["view"] == "cut":
        best = None
        for k in range(2, len(messages)):
            if messages[k]["role"] != "assistant" or messages[k - 1]["role"] not in (
                "user",
                "tool",
            ):
                continue
            tokens = prompt_tokens(c, k, s["T"])
            if tokens > s["T"]:
                break
            best = (messages[:k], k, tokens)
        return best
    if s["view"] == "book":
        return book_view(c, s["T"])
    raise AssertionError(s["view"])


def slot_label(s):
    where = " ".join(f"{k}={v}" for k, v in s["where"].items())
    view_name = s["view"] + (f"({s['T']})" if s["T"] else "")
    kind = "longest " if s["longest"] else ""
    return f"{s['split']} {kind}{s['count']} {where} {view_name} [{s['lo']}, {s['hi']}]".replace(
        "  ", " "
    )


def load(cands, start, slots, used):
    """Load the lazy candidate at `start` together with the next ones likely to be looked at."""
    window, size = [cands[start]], cands[start].get("size") or cands[start].get("bound", 0)
    for c in cands[start + 1 :]:
        if c["messages"] is not None or (c["unique"] is not None and c["unique"] in used):
            continue
        if not any(
            len(s["rows"]) < s["count"] and matches(s, c) and c.get("bound", INF) >= s["lo"]
            for s in slots
        ):
            continue
        window.append(c)
        size += c.get("size") or c.get("bound", 0)
        if size > WINDOW_BYTES or len(window) >= 512:
            break
    groups = {}
    for c in window:
        groups.setdefault(c["fetch"], []).append(c)
    for fetch, group in groups.items():
        fetch(group)
    for c in window:
        tighten_bound(c)


def tighten_bound(c):
    """A loaded candidate's texts bound its tokens more tightly than its file did."""
    c["bound"] = min(c.get("bound", INF), messages_bytes(c["messages"]))


def place(s, c, result, used):
    messages, k, tokens = result
    s["rows"].append(dict(c, messages=messages, k=k, tokens=tokens, slot=s))
    used.add(c["unique"])


def fill_longest(s, cands, used, progress):
    """The `count` candidates with the most prompt tokens in range (ties: lower sha256).

    Exact without counting every candidate in full: a text's NFC UTF-8 length bounds its tokens,
    so a candidate's bound is the tokens of its messages counted so far plus the bytes of the
    rest. Candidates are counted a batch of messages at a time, always the one with the highest
    bound; a fully counted candidate at the top has at least as many tokens as any other can."""
    pool = sorted(
        (c for c in cands if matches(s, c)), key=lambda c: (-c.get("bound", INF), c["key"])
    )
    heap = [(-c.get("bound", INF), c["key"], i) for i, c in enumerate(pool)]  # sorted: a heap
    looked = set()
    while heap and len(s["rows"]) < s["count"]:
        _, _, i = heapq.heappop(heap)
        c = pool[i]
        if c["unique"] is not None and c["unique"] in used:
            continue  # a longer candidate with the same key was taken
        if c["messages"] is None:
            load(pool, i, [s], used)
        if i not in looked:
            looked.add(i)
            progress(1)
        k = last_assistant(c["messages"])
        if k is None:
            s["rejected"]["no view"] += 1
            continue
        counts = c.setdefault("counts", {})
        if "mbytes" not in c:
            c["mbytes"] = [text_bytes(m["content"]) for m in c["messages"][:k]]
        uncounted = [j for j in range(k) if j not in counts]
        bound = sum(counts[j] for j in range(k) if j in counts)
        bound += sum(c["mbytes"][j] for j in uncounted)
        if heap and (-bound, c["key"]) > heap[0][:2]:
            heapq.heappush(heap, (-bound, c["key"], i))  # no longer on top: look at another first
            continue
        if uncounted:
            # Count about what the bound must lose to fall below the runner-up's, largest
            # messages first: a candidate that cannot win is left after a little counting.
            gap = bound + heap[0][0] if heap else INF
            budget = min(CHUNK_CHARS * BATCH_CHUNKS, max(2 * CHUNK_CHARS, 2 * gap))
            batch, size = [], 0
            for j in sorted(uncounted, key=lambda j: -c["mbytes"][j]):
                if batch and size >= budget:
                    break
                batch.append(j)
                size += c["mbytes"][j]
            count_messages(c, batch)
            heapq.heappush(heap, (-bound, c["key"], i))
            continue
        if bound > c.get("bound", INF):
            raise AssertionError(f"{c['id']}: {bound} tokens above its bound {c['bound']}")
        if s["lo"] <= bound <= s["hi"]:
            place(s, c, (c["messages"][:k], k, bound), used)
        else:
            s["rejected"]["tokens out of range"] += 1
    return len(looked)


def select(name, cands, drop, quiet):
    """Fill the source's slots from its candidates; returns the chosen rows."""
    slots = [dict(s, rows=[], rejected=Counter()) for s in SOURCES[name]["slots"]]
    cands.sort(key=lambda c: c["key"])
    used = set()
    seen = 0
    with tqdm(desc=name, unit=" candidates", disable=quiet, file=sys.stderr) as bar:
        for s in slots:
            if s["longest"]:
                seen += fill_longest(s, cands, used, bar.update)
        scan = [s for s in slots if not s["longest"]]
        for i, c in enumerate(cands):
            open_slots = [s for s in scan if len(s["rows"]) < s["count"]]
            if not open_slots:
                break
            seen += 1
            bar.update(1)
            if c["unique"] is not None and c["unique"] in used:
                drop["uniqueness rule (already used)"] += 1
                continue
            fitting = []
            for s in open_slots:
                if not matches(s, c):
                    s["rejected"]["filter"] += 1
                elif c.get("bound", INF) < s["lo"]:
                    s["rejected"]["tokens out of range"] += 1
                else:
                    fitting.append(s)
            if not fitting:
                continue
            if c["messages"] is None and "fetch" in c:
                load(cands, i, scan, used)  # loading tightens the bound
            for s in [
                s
                for s in fitting
                if c.get("bound", INF) < s["lo"] or least_tokens(c, s["view"]) > s["hi"]
            ]:
                s["rejected"]["tokens out of range"] += 1
                fitting.remove(s)
            if not fitting:
                if "fetch" in c:
                    c["messages"] = None
                continue
            limit = max(s["hi"] for s in fitting)
            for s in fitting:
                result = view(s, c, limit)
                if result and s["lo"] <= result[2] <= s["hi"]:
                    place(s, c, result, used)
                    break
                s["rejected"]["tokens out of range" if result else "no view"] += 1
            else:
                if "fetch" in c:
                    c["messages"] = None  # free what was loaded
    for s in slots:
        if len(s["rows"]) < s["count"]:
            reasons = (
                ", ".join(f"{n} {r}" for r, n in sorted((s["rejected"] + drop).items())) or "none"
            )
            raise BuildError(
                f"{name}: slot '{slot_label(s)}' has {len(s['rows'])} of {s['count']} rows after "
                f"looking at {seen} of {len(cands)} candidates; rejected: {reasons}"
            )
    return [row for s in slots for row in s["rows"]]


def derive_smoke(name, standard):
    """smoke: the shortest standard row of the source, or of each of its two groups."""
    groups = SOURCES[name].get("groups") or (None,)
    rows = []
    for g in groups:
        members = [r for r in standard if g is None or r.get("group") == g]
        rows.append(min(members, key=lambda r: (r["tokens"], r["key"])))
    return rows


# ------------------------------------------------------------------------------------------------
# Token counting (DESIGN.md 4.1): the sum over messages of len(encode(content)) without special
# tokens. Long texts are cut at places where the tokenizer's pre-tokenizer always splits, so that
# the pieces can be counted on both cores and counting can stop early; the result is the same.

TOKENIZER = None
CHUNKABLE = False
COUNTED = {}  # sha256 of a message's content -> its tokens, for the tokenizer loaded
CHUNK_CHARS = 32_768
BATCH_CHUNKS = 8
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


def load_tokenizer(path, jobs):
    """Load tokenizer.json; decide whether the exact chunked count applies to it."""
    global TOKENIZER, CHUNKABLE
    COUNTED.clear()
    os.environ["RAYON_NUM_THREADS"] = str(jobs)  # read when tokenizers first runs in parallel
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    from tokenizers import Tokenizer

    try:
        TOKENIZER = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises its own Exception type for a bad file
        raise BuildError(
            f"{path} is not a tokenizer.json ({str(e).splitlines()[0][:200]})"
        ) from None
    part = lambda p: orjson.loads(p.__getstate__()) if p is not None else None
    added = TOKENIZER.get_added_tokens_decoder().values()
    CHUNKABLE = chunk_safe(
        {
            "normalizer": part(TOKENIZER.normalizer),
            "pre_tokenizer": part(TOKENIZER.pre_tokenizer),
            "added_tokens": [
                {"content": t.content, "lstrip": t.lstrip, "rstrip": t.rstrip} for t in added
            ],
        }
    )


def chunk_safe(raw):
    normalizer = raw.get("normalizer")
    pre = raw.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    split_ok = (
        bool(steps)
        and steps[0].get("type") == "Split"
        and steps[0].get("pattern", {}).get("Regex") == QWEN_SPLIT
    )
    split_ok = split_ok and steps[0].get("behavior") == "Isolated" and not steps[0].get("invert")
    rest_ok = all(s.get("type") == "ByteLevel" and s.get("use_regex") is False for s in steps[1:])
    added_ok = all(
        not any(ch in WHITE_SPACE for ch in t["content"])
        and not t.get("lstrip")
        and not t.get("rstrip")
        for t in raw.get("added_tokens", ())
    )
    return (
        (normalizer is None or normalizer.get("type") == "NFC")
        and split_ok
        and rest_ok
        and added_ok
    )


def safe_cuts(text, every=CHUNK_CHARS):
    """Positions, about `every` characters apart, where counting text in pieces is exact."""
    cuts = [0]
    if not CHUNKABLE:
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


def least_tokens(c, view_name):
    """A lower bound on a whole or before-last view's prompt tokens: its contents' runs of
    non-whitespace (a Qwen pre-tokenizer piece never holds non-whitespace of two runs)."""
    if view_name not in ("whole", "before-last") or not CHUNKABLE:
        return 0
    k = len(c["messages"]) if view_name == "whole" else last_assistant(c["messages"]) or 0
    runs = c.setdefault("runs", {})
    for j in range(k):
        if j not in runs:
            text = content_text(c["messages"][j])
            # str.split() splits at str.isspace(), which is regex whitespace plus U+001C-U+001F.
            fast = not any(ch in text for ch in "\x1c\x1d\x1e\x1f")
            runs[j] = len(text.split()) if fast else sum(1 for _ in NON_SPACE.finditer(text))
    return sum(runs[j] for j in range(k))


def encode_count(texts):
    return [len(e) for e in TOKENIZER.encode_batch_fast(texts, add_special_tokens=False)]


def count_plain(text):
    """The definition: len(tokenizer.encode(text, add_special_tokens=False)). For tests."""
    return len(TOKENIZER.encode(text, add_special_tokens=False).ids)


def count_text(text, limit=INF):
    """Tokens of one text: exact when at most `limit`, else some number above it."""
    cuts = safe_cuts(text)
    pieces = [text[a:b] for a, b in zip(cuts, cuts[1:])]
    total = 0
    for i in range(0, len(pieces), BATCH_CHUNKS):
        total += sum(encode_count(pieces[i : i + BATCH_CHUNKS]))
        if total > limit:
            break
    return total


def content_text(message):
    return message["content"] if isinstance(message["content"], str) else ""


def next_batch(c, i, k):
    """Uncounted messages from i (before k), about BATCH_CHUNKS chunks of text in all."""
    counts, messages = c.setdefault("counts", {}), c["messages"]
    batch, chars = [], 0
    while i < k and i not in counts and (not batch or chars < CHUNK_CHARS * BATCH_CHUNKS):
        batch.append(i)
        chars += len(content_text(messages[i]))
        i += 1
    return batch, chars


def count_messages(c, batch):
    """Count these messages in one call on all threads, long contents in pieces. A content
    counted before (a system prompt, a trajectory stored twice) is not counted again."""
    counts, pieces, owners, digests = c["counts"], [], [], {}
    for j in batch:
        text = content_text(c["messages"][j])
        digests[j] = digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
        if digest in COUNTED:
            counts[j] = COUNTED[digest]
            continue
        cuts = safe_cuts(text)
        pieces += [text[a:b] for a, b in zip(cuts, cuts[1:])]
        owners += [j] * (len(cuts) - 1)
        counts[j] = 0
    for j, n in zip(owners, encode_count(pieces)):
        counts[j] += n
    for j in set(owners):
        COUNTED[digests[j]] = counts[j]


def prompt_tokens(c, k, limit=INF):
    """Prompt tokens of the candidate's first k messages: exact when at most `limit`.

    Counts are kept per message, so views of the same candidate share the work."""
    counts = c.setdefault("counts", {})
    total, i = 0, 0
    while i < k:
        if i in counts:
            total += counts[i]
            i += 1
            continue
        if total > limit:
            return total
        batch, chars = next_batch(c, i, k)
        if len(batch) == 1 and chars > CHUNK_CHARS * BATCH_CHUNKS:
            n = count_text(content_text(c["messages"][i]), limit - total)
            if n > limit - total:
                return total + n  # stopped early: not cached
            counts[i] = n
        else:
            count_messages(c, batch)
    return total


def book_view(c, T):
    """One user message: instruction + the book up to its last paragraph end within T tokens."""
    lang = c["group"]
    prefix = BOOK_INSTRUCTION[lang] + "\n\n"
    if "prompt" not in c:
        c["prompt"] = prefix + c["text"][c["start"] : c["ends"][-1]]
        c["cuts"] = safe_cuts(c["prompt"])
        c["cum"] = [0]  # tokens of the prompt up to each counted cut
        c["pends"] = [len(prefix) + e - c["start"] for e in c["ends"]]
    prompt, cuts, cum, pends = c["prompt"], c["cuts"], c["cum"], c["pends"]
    while cum[-1] <= T and len(cum) < len(cuts):
        n = len(cum) - 1
        # As many chunks as T still needs (a chunk holds at least CHUNK_CHARS // 4 tokens of
        # most text), so that a short view does not count far into the book.
        ahead = min(BATCH_CHUNKS, 1 + (T - cum[-1]) // (CHUNK_CHARS // 4))
        pieces = [prompt[a:b] for a, b in zip(cuts[n : n + ahead], cuts[n + 1 : n + 1 + ahead])]
        for count in encode_count(pieces):
            cum.append(cum[-1] + count)

    def tokens_at(p):  # exact prompt tokens of prompt[:p]
        j = bisect.bisect_left(cuts, p) - 1
        return (
            cum[j] + count_text(prompt[cuts[j] : p])
            if p != cuts[j + 1] or j + 1 >= len(cum)
            else cum[j + 1]
        )

    # The last counted cut whose tokens are within T; the answer lies in the chunk after it.
    m = bisect.bisect_right(cum, T) - 1
    hi_pos = cuts[min(m + 1, len(cuts) - 1)]
    lo_i = bisect.bisect_right(pends, cuts[m])
    hi_i = bisect.bisect_right(pends, hi_pos)
    best = None
    a, b = lo_i, hi_i - 1  # binary search in pends[a..b]: tokens grow with the end
    while a <= b:
        mid = (a + b) // 2
        t = tokens_at(pends[mid])
        if t <= T:
            best, a = (mid, t), mid + 1
        else:
            b = mid - 1
    if best is None and lo_i > 0:
        best = (lo_i - 1, tokens_at(pends[lo_i - 1]))
    if best is None or best[1] > T:
        return None
    end = c["ends"][best[0]]
    c["source"] = f"{c['id']}#{c['start']}-{end}"
    return user(prompt[: pends[best[0]]]), None, best[1]


# ------------------------------------------------------------------------------------------------
# Output (DESIGN.md 4.4): three parquet files with fixed writer options, SHA256SUMS,
# manifest.json and the dataset card, written elsewhere and moved into OUT together.

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
    source = r.get("source") or r["id"] + (f":{r['k']}" if r["k"] is not None else "")
    return {"messages": orjson.dumps(r["messages"]).decode(), "tools": r["tools"], "source": source}


def canonical_line(record):
    """One row of the content hash: compact JSON with keys messages, tools, source (README)."""
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
        path,
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
    for split in SPLITS:
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
                min((r["tokens"] for r in rows), default=0),
                max((r["tokens"] for r in rows), default=0),
            ],
        )
        for index, (r, rec, line) in enumerate(zip(rows, records, lines)):
            manifest_rows.append(dict(
                split=split, index=index, source=rec["source"], name=r["name"], group=r.get("group"),
                slot=slot_label(r["slot"]), prompt_tokens=r["tokens"], row_sha256=hashlib.sha256(line).hexdigest(),
            ))  # fmt: skip
    manifest = dict(
        builder="kern-prompts build.py",
        only=None if names == list(SOURCES) else names,
        tokenizer_sha256=tokenizer_sha,
        packages=package_versions(),
        inputs=[
            dict(
                repo=p["repo"],
                revision=p["revision"],
                path=p["path"],
                bytes=p["size"],
                sha256=p.get("actual_sha256") or p["sha256"],
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
    sums = [f"{sha256_file(staging / f)}  {f}\n" for f in OUT_FILES[:-1]]
    sums += [f"# content {split_info[s]['content_sha256']}  {s}.parquet\n" for s in SPLITS]
    sums.append(
        "# packages " + " ".join(f"{p}=={v}" for p, v in manifest["packages"].items()) + "\n"
    )
    sums += [
        f"# row {r['split']} {r['index']} {r['row_sha256']} {r['source']}\n" for r in manifest_rows
    ]
    (staging / "SHA256SUMS").write_text("".join(sums), encoding="utf-8")
    return manifest


CARD_USES = {"smoke": ("64", "after every change, about a minute"), "standard": ("512", "the gate for a kernel swap"),
             "full": ("16384", "precision or state-storage changes, releases")}  # fmt: skip


def dataset_card(manifest):
    """The dataset card to publish, with its tables computed from the manifest."""
    splits = manifest["splits"]
    lines = [
        "---",
        "license: other",
        "language:\n- en\n- zh\n- ru\n- ja",
        "size_categories:\n- n<1K",
        "configs:\n- config_name: default\n  data_files:",
        *(f"  - split: {s}\n    path: {s}.parquet" for s in SPLITS),
        "---",
        "",
        "# kern prompts",
        "",
        "Chat prompts for checking the numerics of an LLM inference engine against a reference",
        "implementation of the same model: deep prefill, long decode, real conversations.",
        "",
        "## Splits",
        "",
        "| split | rows | prompt tokens | suggested decode cap | use |",
        "|---|---|---|---|---|",
    ]
    for s in SPLITS:
        lo, hi = splits[s]["prompt_tokens"]
        lines.append(
            f"| {s} | {splits[s]['rows']} | {lo:,} – {hi:,} | {CARD_USES[s][0]} | {CARD_USES[s][1]} |"
        )
    lines += [
        "",
        "## Composition",
        "",
        "| source | smoke | standard | full | prompt tokens |",
        "|---|---|---|---|---|",
    ]
    for name in SOURCES:
        rows = [r for r in manifest["rows"] if r["name"] == name]
        if not rows:
            continue
        counts = [sum(r["split"] == s for r in rows) or "–" for s in SPLITS]
        tokens = [r["prompt_tokens"] for r in rows]
        lines.append(
            f"| {name} | {' | '.join(map(str, counts))} | {min(tokens):,} – {max(tokens):,} |"
        )
    lines += [
        "",
        "Token counts use the Qwen3.8 tokenizer over message contents, without a chat template.",
        f"Tokenizer sha256: `{manifest['tokenizer_sha256']}`.",
        "",
        "## Schema",
        "",
        "| column | type | meaning |",
        "|---|---|---|",
        "| messages | string | OpenAI chat messages as JSON; the last turn is user or tool |",
        "| tools | string or null | OpenAI tool schemas as JSON |",
        "| source | string | `<repo>@<revision>#<row>`; `:<k>` = cut before message k; books give a character range |",
        "",
        "## Licenses",
        "",
        "Each row keeps the license of its source, which `source` names: LongBench-Pro, MiMo-V2.6-RL-oss,",
        "NuminaMath-1.5 and LongWriter-6k Apache-2.0; MRCR, SWE-smith-trajectories, GSM8K and HumanEval MIT;",
        "Nemotron-Agentic-v1 and MBPP CC-BY-4.0; WildChat-4.8M ODC-BY; Project Gutenberg texts public domain",
        "in the USA (header and footer removed). The selection and the cuts are Apache-2.0.",
        "",
    ]
    return "\n".join(lines)


# Set once OUT holds the new build: an interrupt after that must not say OUT is unchanged.
PUBLISHED = False


def publish(staging, out):
    """Move the staged files into OUT together; OUT is untouched until this point.

    SIGINT and SIGTERM are held, not blocked: the tokenizer's threads would receive a blocked signal
    and Python would still run its handler in this thread, between the two renames."""
    global PUBLISHED
    held = []
    hold = lambda signum, frame: held.append(signum)
    handlers = {s: signal.signal(s, hold) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.rename(out, old / "out")
        try:
            os.rename(staging, out)
            PUBLISHED = True
        except OSError:
            if old:
                os.rename(old / "out", out)
            raise
        finally:
            if old:
                shutil.rmtree(old, ignore_errors=True)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    if held:
        raise KeyboardInterrupt


def check_out(out):
    """OUT must be a directory we may replace: absent, or holding only a previous build."""
    if out.exists() and not out.is_dir():
        raise BuildError(f"OUT {out} exists and is not a directory; choose another path")
    if out.is_dir():
        foreign = sorted(p.name for p in out.iterdir() if p.name not in OUT_FILES)
        if foreign:
            raise BuildError(
                f"OUT {out} holds files that are not a build ({', '.join(foreign[:3])}); choose an empty directory"
            )
    parent = out.parent if out.parent != Path("") else Path(".")
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise BuildError(f"cannot write OUT {out}: {parent} is not a writable directory")


def read_sums(sums_path):
    """Parse published SHA256SUMS. Read before building: it may be OUT's own, which the build replaces."""
    try:
        text = Path(sums_path).read_text(encoding="utf-8")
    except OSError as e:
        raise BuildError(f"cannot read {sums_path}: {e}") from None
    files, content, rows, packages = {}, {}, [], ""
    for line in text.splitlines():
        if m := re.fullmatch(r"([0-9a-f]{64})  (\S+)", line):
            files[m[2]] = m[1]
        elif m := re.fullmatch(r"# content ([0-9a-f]{64})  (\S+)", line):
            content[m[2]] = m[1]
        elif m := re.fullmatch(r"# row (\S+) (\d+) ([0-9a-f]{64}) (.*)", line):
            rows.append((m[1], int(m[2]), m[3], m[4]))
        elif line.startswith("# packages "):
            packages = line[len("# packages ") :]
    if not files:
        raise BuildError(f"{sums_path}: no sha256 lines")
    return dict(files=files, content=content, rows=rows, packages=packages)


def check_sums(published_sums, out, manifest):
    """Compare OUT with published sums (read_sums); return the problems found (empty when all match)."""
    files, content = published_sums["files"], published_sums["content"]
    rows, packages = published_sums["rows"], published_sums["packages"]
    problems = []
    ours = " ".join(f"{p}=={v}" for p, v in manifest["packages"].items())
    for split in SPLITS:
        name = f"{split}.parquet"
        info = manifest["splits"][split]
        if name not in files:
            problems.append(f"{name}: not listed in the published sums")
            continue
        if files[name] == info["file_sha256"]:
            continue
        if content.get(name) == info["content_sha256"]:
            problems.append(
                f"{name}: same rows, different file bytes: a toolchain difference (this build: {ours}; "
                f"published: {packages or 'not recorded'})"
            )
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
    return problems


# ------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv):
    p = argparse.ArgumentParser(description="Build the kern-prompts splits from pinned sources.")
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
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="tokenizer threads (output never depends on it)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--only", help="build just these sources: " + ",".join(SOURCES))
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error("--jobs must be at least 1")
    args.names = list(SOURCES)
    if args.only:
        unknown = [n for n in args.only.split(",") if n not in SOURCES]
        if unknown:
            p.error(f"unknown source {unknown[0]!r}; sources: {', '.join(SOURCES)}")
        args.names = [n for n in SOURCES if n in args.only.split(",")]
    return args


def read_and_select(args, files, pinned, verified):
    """Load the tokenizer, then read each source and fill its slots: the rows of every split."""
    if not args.tokenizer.is_file():
        raise BuildError(
            f"tokenizer {args.tokenizer} not found; fetch.sh downloads it to SRC/Qwen/Qwen3.8-27B/tokenizer.json"
        )
    tokenizer_sha = sha256_file(args.tokenizer)
    if not args.any_tokenizer and (not pinned or pinned[0]["sha256"] != tokenizer_sha):
        raise BuildError(
            f"tokenizer {args.tokenizer} has sha256 {tokenizer_sha}, not the pinned "
            f"{pinned[0]['sha256'] if pinned else '(no model line in REV)'}; "
            "pass --any-tokenizer to build with it anyway (the rows will differ from the published ones)"
        )
    load_tokenizer(args.tokenizer, args.jobs)

    splits = {s: [] for s in SPLITS}
    for name in args.names:
        drop = Counter()
        cands = list(READERS[name](files[name], drop))
        rows = select(name, cands, drop, args.quiet)
        del cands
        release_memory()
        for r in rows:
            r["name"] = name
        standard = [r for r in rows if r["slot"]["split"] == "standard"]
        by_tokens = lambda r: (r["tokens"], r["key"])
        splits["smoke"] += sorted(derive_smoke(name, standard) if standard else [], key=by_tokens)
        for split in ("standard", "full"):
            splits[split] += sorted((r for r in rows if r["slot"]["split"] == split), key=by_tokens)
        verified(wait=False)  # stop at a mismatch found so far
    return tokenizer_sha, splits


def build(args):
    out = args.out
    check_out(out)
    published_sums = read_sums(args.check) if args.check else None
    if not args.src.is_dir():
        raise BuildError(
            f"SRC {args.src} is not a directory; download the sources with "
            f"`mkdir -p {args.src} && (cd {args.src} && bash {HERE / 'fetch.sh'})`"
        )
    rev_pins, book_pins = read_pins(args.rev, "rev"), read_pins(args.books, "books")
    files = {name: source_files(name, rev_pins, book_pins) for name in args.names}
    inputs = [p for name in args.names for p in files[name]]
    verified = verify(inputs, args.src, not args.no_verify, args.quiet)
    try:
        pinned = [p for p in rev_pins if p["kind"] == "model"]
        tokenizer_sha, splits = read_and_select(args, files, pinned, verified)
    except BuildError:
        verified()  # a file that is not the pinned one explains a reader's error best
        raise
    verified()

    parent, staging = out.parent if str(out.parent) else Path("."), None
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
        manifest = build_outputs(splits, args.names, inputs, tokenizer_sha, staging)
        publish(staging, out)
    except OSError as e:
        raise BuildError(
            f"cannot write the outputs in {parent} ({e.strerror or e}); free some space there or "
            f"choose another OUT; OUT {out} is unchanged"
        ) from None
    finally:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)

    if not args.quiet:
        print_summary(manifest)
    if args.check:
        problems = check_sums(published_sums, out, manifest)
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
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: the memory is reused by the next source instead


def print_summary(manifest):
    print(f"{'source':18} {'smoke':>5} {'standard':>8} {'full':>5}  prompt tokens", file=sys.stderr)
    for name in SOURCES:
        rows = [r for r in manifest["rows"] if r["name"] == name]
        if rows:
            counts = [sum(r["split"] == s for r in rows) for s in SPLITS]
            tokens = [r["prompt_tokens"] for r in rows]
            print(
                f"{name:18} {counts[0]:5} {counts[1]:8} {counts[2]:5}  {min(tokens):,} – {max(tokens):,}",
                file=sys.stderr,
            )


def main(argv=None):
    args = parse_args(argv)

    def terminate(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    try:
        return build(args)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        state = "holds the new build" if PUBLISHED else "is unchanged"
        print(f"error: interrupted; OUT {args.out} {state}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
