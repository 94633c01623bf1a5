"""kern's trace table and its schedule, as data; reading a trace (streaming, prompt by prompt) and
writing one (docs/scoring.md "The trace file").

kern's format: one parquet table of seven columns and one metadata key, `decode`. Every prompt
has one row per token (producer null); each producer has one row per scored position, holding the
corpus token there, the log-probability of the next one and the top-k table. This module holds
the format's facts in one place; nothing here runs a model or judges.
"""

import fcntl
import hashlib
import os
import queue
import sys
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from scoring import builder as build

ITEM = "item"  # kern compares the list item field's name too: pyarrow's default is `element`
TRACE_SCHEMA = pa.schema([
    pa.field("prompt", pa.int32(), nullable=False),
    pa.field("pos", pa.int32(), nullable=False),
    pa.field("token", pa.int32(), nullable=False),
    pa.field("producer", pa.string()),
    pa.field("ref_logprob", pa.float32()),
    pa.field("top_ids", pa.list_(pa.field(ITEM, pa.int32()))),
    pa.field("top_logprob", pa.list_(pa.field(ITEM, pa.float32()))),
])  # fmt: skip
DECODE_KEY = b"decode"  # kern's one metadata key
OURS_KEY = b"kern_prompts"  # this tool's metadata (kern ignores unknown keys)
TOP_K = 20  # kern keeps the top 20


@dataclass(frozen=True, slots=True)
class Schedule:
    """Where a prompt of `n` tokens is scored: tokens [0, ctx) go through prefill (position ctx-1
    is the prefill position), then tokens ctx .. ctx+steps-1 one at a time through decode."""

    ctx: int
    steps: int

    @staticmethod
    def of(n, decode):
        steps = min(decode, n - 2)
        return Schedule(n - 1 - steps, steps)

    @property
    def positions(self):
        return range(self.ctx - 1, self.ctx + self.steps)


class ScoreError(Exception):
    """A user's mistake or a bad input: one line on stderr, nothing written."""


# Where this tool's own lines (what was written, what was skipped, a warning) go: stderr, or with
# --quiet the stderr that score.py keeps for them while it drops an engine's notes.
NOTES = None


def note(text):
    print(text, file=NOTES or sys.stderr, flush=True)


def name_max(directory):
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return build.NAME_MAX


def beside(path, tag, room=0):
    """The name of something of `path`'s kept beside it (a temporary, a record's staging):
    `.NAME.TAG`, at most NAME_MAX bytes less `room` (what mkstemp adds). A NAME too long for that
    is cut on a character boundary and a hash of the whole name added, as build.py's `stem` cuts
    OUT's name, so it still names `path` alone and the same `path` always gets the same name."""
    name = Path(path).name
    return f".{build.stem(name, room + len(os.fsencode(f'..{tag}')))}.{tag}"


def target(path):
    """Where an output named `path` is written: through a symbolic link to its target (a link a
    user made to share a file stays that link), else `path` itself."""
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def temporary(path, suffix=""):
    """A new empty file beside `path`'s target, to be written and then moved into place with
    `into_place`."""
    path = target(path)
    fd, tmp = tempfile.mkstemp(prefix=beside(path, "tmp-", room=8 + len(suffix)),
                               suffix=suffix, dir=path.parent)  # fmt: skip
    os.close(fd)
    return tmp


class Writing:
    """The lock every command that writes a trace (record, merge) holds on it while it runs, until
    the trace is in place: a second one is refused, never left to replace the first one's file
    with its own copy (a writer that takes no lock is caught by write_trace's `was`).
    `.NAME.lock` beside the target, removed as it is released; a lock file opened just as its
    holder removed it is not the lock, and is opened again."""

    def __init__(self, path):
        self.path = target(path).parent / beside(target(path), "lock")
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as e:
                raise ScoreError(f"cannot write beside {path}: {e.strerror}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise ScoreError(f"another record or merge is writing {path}; wait for it to "
                                 "end") from None  # fmt: skip
            here = identity(self.path)
            if here is not None and here[:2] == identity(fd)[:2]:
                break
            os.close(fd)
        self.fd = fd

    def release(self):
        if self.fd is not None:
            here = identity(self.path)  # ours unless someone removed it by hand meanwhile
            if here is not None and here[:2] == identity(self.fd)[:2]:
                os.unlink(self.path)
            os.close(self.fd)
            self.fd = None


def identity(path):
    """What is at `path`'s target (or an open file descriptor), to tell whether it changed: its
    device, inode, size and modification time; None where nothing is."""
    try:
        st = os.fstat(path) if isinstance(path, int) else os.stat(target(path))
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def into_place(tmp, path):
    """Move a finished temporary to `path`'s target, with the mode a new file gets under the
    user's umask (mkstemp makes it 0600: a shared trace would no longer be readable by others)."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)
    os.replace(tmp, target(path))


# ================================================================================================
# Records.


@dataclass(slots=True)
class Prompt:
    """One prompt of a trace: its tokens and, in files this tool wrote, the row it came from."""

    tokens: np.ndarray  # int32
    source: str = "-"  # the row's `source` id
    name: str = "-"  # the builder's source name (the card's Composition table)
    index: int = -1  # the row's index in its split file
    rendered: int = 0  # the rendered prompt's length (prefill ends there)


@dataclass(slots=True)
class Scores:
    """One producer's scored positions, sorted by (prompt, pos)."""

    prompt: np.ndarray  # int32 [n]
    pos: np.ndarray  # int32 [n]
    ref_logprob: np.ndarray  # [n]: log-probability of the corpus token at pos + 1
    ids: np.ndarray  # int32 [n, k], most likely first
    logprob: np.ndarray  # [n, k]; float32 as a trace stores them, float64 from an engine

    def take(self, mask):
        return Scores(*(getattr(self, f)[mask] for f in Scores.__slots__))


@dataclass(slots=True)
class Trace:
    prompts: list  # of Prompt
    decode: int
    producers: dict = field(default_factory=dict)  # name -> Scores
    meta: dict = field(default_factory=dict)  # this tool's metadata (empty in kern's files)

    def schedule(self, i):
        return Schedule.of(len(self.prompts[i].tokens), self.decode)


# ================================================================================================
# Reading and writing a trace.


@contextmanager
def parquet_errors(path):
    """A damaged file's errors, from pyarrow, as one line."""
    try:
        yield
    except (OSError, pa.ArrowException) as e:
        raise ScoreError(f"{path}: cannot read it as parquet ({e})") from None


def open_trace(path):
    """The parquet file, `decode` and this tool's metadata of the trace in `path`, checked as kern
    checks a trace: the metadata key and every column's type."""
    path = Path(path)
    with parquet_errors(path):
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
    meta = schema.metadata or {}
    if DECODE_KEY not in meta:
        raise ScoreError(f"{path}: not a trace: no `decode` in the file metadata")
    decode = count(meta[DECODE_KEY])
    if decode is None:
        raise ScoreError(
            f"{path}: `decode` metadata {meta[DECODE_KEY]!r} is not a count (ASCII digits, as "
            f"kern reads it, at most {DECODE_MAX})"
        )
    for want in TRACE_SCHEMA:
        if want.name not in schema.names:
            raise ScoreError(f"{path}: not a trace: no column `{want.name}`")
        got = schema.field(want.name)
        if not got.type.equals(want.type, check_metadata=False) or str(got.type) != str(want.type):
            raise ScoreError(
                f"{path}: column `{want.name}` is {got.type}, a trace's is {want.type}"
            )
    try:
        ours = orjson.loads(meta.get(OURS_KEY, b"{}"))
    except orjson.JSONDecodeError:
        raise ScoreError(f"{path}: its {OURS_KEY.decode()} metadata is not JSON") from None
    wrong = meta_error(ours)
    if wrong:
        raise ScoreError(f"{path}: its {OURS_KEY.decode()} metadata is not this tool's: {wrong}")
    return pf, decode, ours


DECODE_MAX = 2**63 - 1  # a count numpy holds; any decode past a prompt's length scores it all


def count(raw):
    """`decode` as kern reads it: ASCII digits only (no sign, space or `_`), or None."""
    if not (raw and raw.isdigit() and raw.isascii()):
        return None
    value = int(raw)
    return value if value <= DECODE_MAX else None


# The keys of this tool's metadata that are read back, and what each must be.
META_KINDS = {"prompts": list, "skipped": list, "producers": dict, "choice": dict}
ROW_KINDS = {"index": int, "source": str, "name": str, "rendered": int}


def meta_error(ours):
    """What is wrong with this tool's metadata as read back (None: nothing). Keys it does not
    read are left alone; kern's files have none of them."""
    if not isinstance(ours, dict):
        return f"a JSON {type(ours).__name__}, not an object"
    for key, kind in META_KINDS.items():
        if key in ours and not isinstance(ours[key], kind):
            return f"`{key}` is a {type(ours[key]).__name__}, not a {kind.__name__}"
    for key in ("prompts", "skipped"):
        for j, row in enumerate(ours.get(key, [])):
            if not isinstance(row, dict):
                return f"`{key}[{j}]` is a {type(row).__name__}, not an object"
            for part, kind in ROW_KINDS.items():
                v = row.get(part)
                if part in row and not (isinstance(v, kind) and not isinstance(v, bool)):
                    return f"`{key}[{j}].{part}` is {v!r}, not a {kind.__name__}"
    for name, settings in ours.get("producers", {}).items():
        if not isinstance(settings, dict):
            return f"`producers.{name}` is a {type(settings).__name__}, not an object"
    shard = ours.get("choice", {}).get("shard", [0, 1])
    if not (isinstance(shard, list) and len(shard) == 2 and all(type(x) is int for x in shard)
            and 0 <= shard[0] < shard[1]):  # fmt: skip
        return f"`choice.shard` is {shard!r}, not [I, N] with 0 <= I < N"
    return None


def arrow_errors(path, rows):
    """`rows` (an iterator), with a damaged file's errors as one line."""
    with parquet_errors(path):
        yield from rows


TOKEN_COLUMNS = ["prompt", "pos", "token"]


def row_tables(pf):
    """The file's producers' names, and its rows as tables whose prompts never go back: row group
    by row group where the groups' statistics show the prompts in order (this tool writes them so:
    each prompt's token rows and each producer's rows a group of their own), reading only the
    token columns of a group without producer rows; else the whole file as one table."""
    md = pf.metadata
    leaf = {md.schema.column(i).path: i for i in range(md.num_columns)}
    plan, last = [], -1
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        sp, sq = rg.column(leaf["prompt"]).statistics, rg.column(leaf["producer"]).statistics
        if sp is None or not sp.has_min_max or sp.min < last:
            plan = None
            break
        last = sp.max
        plan.append((g, sq is not None and sq.has_null_count and sq.null_count == rg.num_rows))
    scored = [g for g, tokens_only in plan or [] if not tokens_only]
    names = (pf.read_row_groups(scored, columns=["producer"]) if plan is not None
             else pf.read(columns=["producer"]))["producer"]  # fmt: skip
    names = pc.unique(names.drop_null()).to_pylist()

    def tables():
        if plan is None:
            yield pf.read()
            return
        for g, tokens_only in plan:
            yield pf.read_row_group(g, columns=TOKEN_COLUMNS if tokens_only else None)

    return sorted(names), tables()


def stream_trace(path, empty=False):
    """The trace in `path`, prompt by prompt in bounded memory: a Trace with its `decode`, metadata
    and producers' names (no prompts yet, no scores), and an iterator of (Prompt, {name: Scores}).
    Checked as kern checks a trace, and more: every producer row is at a scored position and
    carries the corpus token there. A file whose prompts go back (not written prompt by prompt) is
    read whole first. A trace without prompts is refused unless `empty` (merge reads the record
    of a shard that got no rows)."""
    pf, decode, ours = open_trace(path)
    if pf.metadata.num_rows == 0 and not empty:
        raise no_prompts(path, ours)
    with parquet_errors(path):
        names, tables = row_tables(pf)
    trace = Trace([], decode, dict.fromkeys(names), ours)
    return trace, prompt_parts(Path(path), tables, trace, empty)


def no_prompts(path, meta):
    i, n = meta.get("choice", {}).get("shard", [0, 1])
    return ScoreError(f"{path}: the corpus has no prompts"
                      + (f" (shard {i}/{n}, which got no rows: merge it with the other shards)"
                         if n > 1 else ""))  # fmt: skip


def prompt_parts(path, tables, trace, empty=False):
    """Each prompt as soon as the tables have given all its rows: those of a prompt below the
    next table's first prompt are complete."""
    pending, state = [], dict(next=0, k={})  # pending: (table, its first and last prompt)
    for t in arrow_errors(path, tables):
        for name in TOKEN_COLUMNS:
            if t[name].null_count:
                raise ScoreError(f"{path}: column `{name}` has nulls")
        if t.num_rows == 0:
            continue
        lo, hi = (x.as_py() for x in pc.min_max(t["prompt"]).values())
        done, keep = [], []
        for p, a, b in pending:
            if b < lo:
                done.append(p)
            elif a >= lo:
                keep.append((p, a, b))
            else:  # a table that reaches into the prompt `lo` begins: split it there
                done.append(p.filter(pc.less(p["prompt"], lo)))
                keep.append((p.filter(pc.greater_equal(p["prompt"], lo)), lo, b))
        if done:
            yield from block(path, done, trace, state)
        pending = keep + [(t, lo, hi)]
    if pending:
        yield from block(path, [p for p, _, _ in pending], trace, state)
    if state["next"] == 0 and not empty:
        raise no_prompts(path, trace.meta)


def column(table, name):
    return table[name].combine_chunks().to_numpy(zero_copy_only=False)


def sorted_by(major, minor):
    d = np.diff(major)
    return bool((d >= 0).all() and (np.diff(minor)[d == 0] > 0).all())


@dataclass(slots=True)
class Corpus:
    """A block of whole prompts' tokens flat, for vectorised checks of producer rows."""

    first: int  # the block's first prompt
    starts: np.ndarray  # where each prompt's tokens begin in `tokens`
    tokens: np.ndarray
    decode: int

    def schedules(self):
        lengths = np.diff(np.r_[self.starts, len(self.tokens)])
        steps = np.minimum(self.decode, lengths - 2)
        return lengths - 1 - steps, steps  # ctx, steps


def block(path, tables, trace, state):
    """The prompts of `tables` (whole prompts, the next ones of the file), checked."""
    tokens, scored = [], {}
    for t in tables:
        nulls = t.num_rows if t.num_columns == len(TOKEN_COLUMNS) else t["producer"].null_count
        if nulls == t.num_rows:
            tokens.append(t.select(TOKEN_COLUMNS))
            continue
        if nulls:
            is_token = pc.is_null(t["producer"])
            tokens.append(t.select(TOKEN_COLUMNS).filter(is_token))
            t = t.filter(pc.invert(is_token))
        here = pc.unique(t["producer"]).to_pylist()
        for name in here:
            scored.setdefault(name, []).append(
                t if len(here) == 1 else t.filter(pc.equal(t["producer"], name))
            )
    tokens = (
        pa.concat_tables(tokens)
        if tokens
        else pa.table({n: pa.array([], pa.int32()) for n in TOKEN_COLUMNS})
    )
    prompt_col, pos_col, token_col = (column(tokens, n) for n in TOKEN_COLUMNS)
    if not sorted_by(prompt_col, pos_col):  # this tool and kern write them in order
        order = np.lexsort((pos_col, prompt_col))
        prompt_col, pos_col, token_col = prompt_col[order], pos_col[order], token_col[order]
    first = state["next"]
    starts = np.flatnonzero(np.r_[True, prompt_col[1:] != prompt_col[:-1]][: len(prompt_col)])
    numbers = prompt_col[starts]
    expected = np.arange(first, first + len(numbers))
    if not np.array_equal(numbers, expected):
        bad = int(numbers[np.flatnonzero(numbers != expected)[0]]) if len(numbers) else first
        raise ScoreError(f"{path}: prompts are not numbered 0.. without gaps (prompt {bad})")
    ends = np.r_[starts[1:], len(prompt_col)]
    expected_pos = np.arange(len(pos_col)) - np.repeat(starts, ends - starts)
    if not np.array_equal(pos_col, expected_pos):
        at = int(np.flatnonzero(pos_col != expected_pos)[0])
        raise ScoreError(
            f"{path}: prompt {prompt_col[at]} has a gap or a repeat in its positions "
            f"(at position {expected_pos[at]})"
        )
    short = np.flatnonzero(ends - starts < 2)
    if len(short):
        i = int(short[0])
        raise ScoreError(
            f"{path}: prompt {first + i} has {ends[i] - starts[i]} token(s); a scored position "
            "needs two"
        )
    corpus = Corpus(first, starts, token_col, trace.decode)
    scores = {n: producer_scores(path, corpus, pa.concat_tables(ts), n, state["k"])
              for n, ts in sorted(scored.items())}  # fmt: skip
    state["next"] = first + len(numbers)
    rows = trace.meta.get("prompts", [])
    for j, (a, b) in enumerate(zip(starts, ends)):
        i = first + j
        info = rows[i] if i < len(rows) else {}
        prompt = Prompt(token_col[a:b], source=info.get("source", "-"), name=info.get("name", "-"),
                        index=info.get("index", -1), rendered=info.get("rendered", 0))  # fmt: skip
        yield prompt, {n: slice_scores(s, i) for n, s in scores.items()}


def producer_scores(path, corpus, rows, name, ks):
    for col in ("ref_logprob", "top_ids", "top_logprob"):
        if rows[col].null_count:
            raise ScoreError(f"{path}: producer {name!r} has a row without `{col}`")
    prompt, pos, token = (column(rows, n) for n in TOKEN_COLUMNS)
    ids_col = rows["top_ids"].combine_chunks()
    lps_col = rows["top_logprob"].combine_chunks()
    ref_lp = column(rows, "ref_logprob")
    if not sorted_by(prompt, pos):
        order = np.lexsort((pos, prompt))
        prompt, pos, token, ref_lp = prompt[order], pos[order], token[order], ref_lp[order]
        ids_col, lps_col = ids_col.take(pa.array(order)), lps_col.take(pa.array(order))
    lengths = pc.list_value_length(ids_col).to_numpy()
    other = pc.list_value_length(lps_col).to_numpy()
    if not np.array_equal(lengths, other):
        j = int(np.flatnonzero(lengths != other)[0])
        raise ScoreError(
            f"{path}: producer {name!r}: prompt {prompt[j]} position {pos[j]}: top_ids holds "
            f"{lengths[j]} ids, top_logprob {other[j]} log-probabilities (they differ in length)"
        )
    if len(lengths):
        seen = ks.setdefault(name, int(lengths[0]))
        lo, hi = min(seen, int(lengths.min())), max(seen, int(lengths.max()))
        if lo != hi or lo < 2:
            raise ScoreError(
                f"{path}: producer {name!r}: top-k lists must all have one length of at least 2 "
                f"(found {lo} to {hi})"
            )
    k = ks.get(name, 2)
    ids_flat, lps_flat = ids_col.flatten(), lps_col.flatten()
    if ids_flat.null_count or lps_flat.null_count:
        raise ScoreError(f"{path}: producer {name!r}: a top-k list holds a null")
    n = len(prompt)
    ids = ids_flat.to_numpy().reshape(n, k)
    if n and ids.min() < 0:
        j = int(np.flatnonzero((ids < 0).any(1))[0])
        raise ScoreError(f"{path}: producer {name!r}: prompt {prompt[j]} position {pos[j]} lists "
                         f"a negative token id")  # fmt: skip
    twice = listed_twice(ids)
    if twice is not None:
        j, v = twice
        raise ScoreError(f"{path}: producer {name!r} lists id {v} twice at prompt {prompt[j]} "
                         f"position {pos[j]}")  # fmt: skip
    local = prompt.astype(np.int64) - corpus.first
    if n and (local.min() < 0 or local.max() >= len(corpus.starts)):
        raise ScoreError(f"{path}: producer {name!r} scores a prompt the corpus does not have")
    dup = np.flatnonzero((prompt[1:] == prompt[:-1]) & (pos[1:] == pos[:-1]))
    if len(dup):
        raise ScoreError(
            f"{path}: producer {name!r} scores prompt {prompt[dup[0]]} position {pos[dup[0]]} twice"
        )
    ctx, steps = corpus.schedules()
    lo, hi = ctx[local] - 1, ctx[local] + steps[local] - 1
    outside = np.flatnonzero((pos < lo) | (pos > hi))
    if len(outside):
        j = outside[0]
        raise ScoreError(
            f"{path}: producer {name!r}: prompt {prompt[j]} position {pos[j]} is not a scored "
            f"position (they are {lo[j]} to {hi[j]})"
        )
    want = corpus.tokens[corpus.starts[local] + pos]
    wrong = np.flatnonzero(token != want)
    if len(wrong):
        j = wrong[0]
        raise ScoreError(
            f"{path}: producer {name!r}: prompt {prompt[j]} position {pos[j]} has token "
            f"{token[j]}, the corpus has {want[j]}"
        )
    return Scores(prompt, pos, ref_lp, ids, lps_flat.to_numpy().reshape(n, k))


def listed_twice(ids):
    """The first top-k list of `ids` ([n, k]) that lists an id twice, and that id: (row, id), or
    None. A list holds each id once; a duplicate is refused as one before any check of the
    values (two entries of one id would count its probability twice)."""
    srt = np.sort(ids, 1)
    same = srt[:, 1:] == srt[:, :-1]
    rows = np.flatnonzero(same.any(1))
    if not len(rows):
        return None
    j = int(rows[0])
    return j, int(srt[j, 1:][same[j]][0])


def ahead(items, depth=2):
    """`items` made on a thread of its own, up to `depth` ahead: reading overlaps judging. The
    thread ends when the items do, or soon after the reader stops taking them."""
    q, end, stop = queue.Queue(depth), object(), threading.Event()

    def offer(x):
        while not stop.is_set():
            try:
                return q.put(x, timeout=0.05)
            except queue.Full:
                pass

    def run():
        try:
            for x in items:
                offer((x, None))
                if stop.is_set():
                    return
            offer((end, None))
        except BaseException as e:  # handed to the reader, which raises it
            offer((end, e))

    threading.Thread(target=run, name="read ahead", daemon=True).start()
    try:
        while True:
            x, e = q.get()
            if x is end:
                if e is not None:
                    raise e
                return
            yield x
    finally:
        stop.set()


def read_trace(path, empty=False):
    """The whole trace in `path` (stream_trace's prompts put together)."""
    trace, parts = stream_trace(path, empty)
    got = {n: [] for n in trace.producers}
    for prompt, scores in parts:
        trace.prompts.append(prompt)
        for n, s in scores.items():
            got[n].append(s)
    trace.producers = {n: concat_scores(v) for n, v in got.items()}
    return trace


def prompt_tables(i, prompt, scores_by_name):
    """Prompt i's rows: its token rows, then each producer's rows in name order, each a table
    that write_trace makes one row group (docs/scoring.md "The trace file")."""
    n = len(prompt.tokens)
    parts = [
        pa.table(
            [
                pa.array(np.full(n, i, np.int32)),
                pa.array(np.arange(n, dtype=np.int32)),
                pa.array(prompt.tokens, pa.int32()),
                pa.nulls(n, pa.string()),
                pa.nulls(n, pa.float32()),
                pa.nulls(n, TRACE_SCHEMA.field("top_ids").type),
                pa.nulls(n, TRACE_SCHEMA.field("top_logprob").type),
            ],
            schema=TRACE_SCHEMA,
        )
    ]
    for name in sorted(scores_by_name):
        s = scores_by_name[name]
        m, k = s.ids.shape
        if m == 0:
            continue
        offsets = pa.array(np.arange(0, m * k + 1, k, dtype=np.int32))
        parts.append(
            pa.table(
                [
                    pa.array(np.full(m, i, np.int32)),
                    pa.array(s.pos.astype(np.int32)),
                    pa.array(prompt.tokens[s.pos], pa.int32()),
                    pa.array([name] * m, pa.string()),
                    pa.array(s.ref_logprob.astype(np.float32)),
                    list_array(offsets, s.ids.reshape(-1).astype(np.int32), "top_ids"),
                    list_array(offsets, s.logprob.reshape(-1).astype(np.float32), "top_logprob"),
                ],
                schema=TRACE_SCHEMA,
            )
        )
    return parts


def list_array(offsets, values, column):
    return pa.ListArray.from_arrays(offsets, pa.array(values), type=TRACE_SCHEMA.field(column).type)


ANY = object()  # write_trace's `was` when whatever is at the path may be replaced


def write_trace(path, decode, meta, tables, was=ANY):
    """Write the trace (an iterable of tables, each one row group, in prompt order) beside `path`,
    read it back as every command reads a trace, then move it into place: a killed write never
    leaves a half-written file where the trace should be, and a file that would not read back
    (metadata past what parquet readers take, say) never replaces anything. With `was` (what
    `identity(path)` gave when the command read it), a path that changed since is left as it is."""
    path = Path(path)
    tmp = temporary(path)
    try:
        write_parquet(tmp, decode, meta, tables)
        reads_back(tmp, path)
        if was is not ANY and identity(path) != was:
            raise ScoreError(f"{path} changed while this command ran (another command wrote it): "
                             "it is left as it is, not replaced")  # fmt: skip
        into_place(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_parquet(path, decode, meta, tables):
    """The trace's parquet file as this tool writes it, at `path` itself, unchecked (write_trace
    checks it and moves it into place; the tests write damaged traces with it). Positions and
    prompt numbers count up, so they are stored as deltas, which read far faster than plain
    values; only the producer's name is a dictionary."""
    schema = TRACE_SCHEMA.with_metadata(
        {
            DECODE_KEY: str(decode).encode(),
            OURS_KEY: orjson.dumps(meta, option=orjson.OPT_SORT_KEYS),
        }
    )
    with pq.ParquetWriter(
        path, schema, compression="zstd", compression_level=3, use_compliant_nested_type=False,
        use_dictionary=["producer"],
        column_encoding={"prompt": "DELTA_BINARY_PACKED", "pos": "DELTA_BINARY_PACKED"},
    ) as w:  # fmt: skip
        for t in tables:
            w.write_table(t.replace_schema_metadata(schema.metadata))


def reads_back(tmp, path):
    """Refuse a written temporary that the reader refuses (its words, the temporary named as
    `path`): it is never moved into place."""
    try:
        for _ in stream_trace(tmp, empty=True)[1]:
            pass
    except ScoreError as e:
        why = str(e).replace(f"{tmp}: ", "")
        raise ScoreError(f"{path}: the trace written does not read back ({why}); {path} is left "
                         "as it is") from None  # fmt: skip


def slice_scores(s, i):
    """The rows of prompt i in `s` (sorted by prompt)."""
    a, b = np.searchsorted(s.prompt, [i, i + 1])
    return s.take(slice(a, b))


def trace_tables(trace, replace=None):
    """Per-prompt tables of `trace`, with `replace` (name -> Scores) instead of those producers."""
    producers = dict(trace.producers) | (replace or {})
    for i, p in enumerate(trace.prompts):
        yield from prompt_tables(i, p, {n: slice_scores(s, i) for n, s in producers.items()})


def empty_scores():
    return Scores(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.float32),
                  np.zeros((0, 2), np.int32), np.zeros((0, 2), np.float32))  # fmt: skip


def concat_scores(parts):
    parts = [p for p in parts if len(p.pos)] or parts[:1] or [empty_scores()]  # k may differ
    if len(parts) == 1:
        return parts[0]
    return Scores(*(np.concatenate([getattr(p, f) for p in parts]) for f in Scores.__slots__))


def corpus_sha256(trace):
    h = hashlib.sha256(str(trace.decode).encode())
    for p in trace.prompts:
        h.update(len(p.tokens).to_bytes(8, "little") + p.tokens.astype("<i4").tobytes())
    return h.hexdigest()
