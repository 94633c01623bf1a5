#!/usr/bin/env python3
"""Score an engine on the kern-prompts splits: record a reference, judge a candidate.

    python score.py record --rows OUT --split standard --model PATH --out ref.parquet
    python score.py record --corpus ref.parquet --model PATH --producer NAME --out ref.parquet
    python score.py merge a.parquet b.parquet --out ref.parquet
    python score.py judge ref.parquet --candidate cand.parquet | --model PATH [--plot F.png]

The other half of the card (README "Scoring an engine"): a reference samples a continuation of
each row and records its next-token distribution at every step; a candidate is fed the same tokens,
prefill then decode one token at a time, and is judged position by position. The file is kern's
trace table (README "The trace file"), so kern and this tool read each other's files.

The file reads like that section: the trace table and its schedule as data, the records, reading
and writing a trace, the rows of a split, the engine behind one small interface (prefill a prompt,
step one token, each giving one logits row), the two functions that drive an engine (record and
the judge's candidate run), the judge as plain functions from arrays to numbers, the report, and
the command line. Everything but the functions that drive an engine is data in, data out, so the
tests reach every verdict through tables that are data.
"""

import argparse
import fcntl
import hashlib
import math
import os
import queue
import re
import signal
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from itertools import zip_longest
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import build

# ================================================================================================
# The trace table and its schedule, as data (README "The trace file").

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
KL_FLOOR = 1e-6  # the band's KL statistics are at least this (kern's floor)
LIMIT_KL = 0.01  # nat: with one reference producer, a flip beyond it fails
REST_FLOOR = 1e-12  # a rest bucket's mass is at least this: float32 sums can leave it at 0 or below
DECODE_BUCKETS = ((1, 64), (65, 512), (513, 4_096), (4_097, 16_384))  # the splits' decode caps
DEPTH_BUCKETS = ((1, 2_048), (2_049, 16_384), (16_385, 131_072), (131_073, 1_048_576))
DRIFT_WINDOW = 16  # decode steps in the trailing mean that drift is read from
SHOW = 5  # flips and worst positions listed in the report
STATE_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")


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
    try:
        decode = int(meta[DECODE_KEY].decode("ascii"))
        if decode < 0:
            raise ValueError
    except ValueError:
        raise ScoreError(f"{path}: `decode` metadata {meta[DECODE_KEY]!r} is not a count") from None
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
    return pf, decode, ours


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


def stream_trace(path):
    """The trace in `path`, prompt by prompt in bounded memory: a Trace with its `decode`, metadata
    and producers' names (no prompts yet, no scores), and an iterator of (Prompt, {name: Scores}).
    Checked as kern checks a trace, and more: every producer row is at a scored position and
    carries the corpus token there. A file whose prompts go back (not written prompt by prompt) is
    read whole first."""
    pf, decode, ours = open_trace(path)
    with parquet_errors(path):
        names, tables = row_tables(pf)
    trace = Trace([], decode, dict.fromkeys(names), ours)
    return trace, prompt_parts(Path(path), tables, trace)


def prompt_parts(path, tables, trace):
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
    if state["next"] == 0:
        raise ScoreError(f"{path}: the corpus has no prompts")


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
    if not np.array_equal(lengths, pc.list_value_length(lps_col).to_numpy()):
        raise ScoreError(f"{path}: producer {name!r}: top_ids and top_logprob differ in length")
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


def read_trace(path):
    """The whole trace in `path` (stream_trace's prompts put together)."""
    trace, parts = stream_trace(path)
    got = {n: [] for n in trace.producers}
    for prompt, scores in parts:
        trace.prompts.append(prompt)
        for n, s in scores.items():
            got[n].append(s)
    trace.producers = {n: concat_scores(v) for n, v in got.items()}
    return trace


def prompt_tables(i, prompt, scores_by_name):
    """Prompt i's rows: its token rows, then each producer's rows in name order, each a table
    that write_trace makes one row group (README "The trace file")."""
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


def write_trace(path, decode, meta, tables):
    """Write the trace (an iterable of tables, each one row group, in prompt order) beside `path`,
    then move it into place: a killed write never leaves a half-written file where the trace
    should be. Positions and prompt numbers count up, so they are stored as deltas, which read
    far faster than plain values; only the producer's name is a dictionary."""
    path = Path(path)
    schema = TRACE_SCHEMA.with_metadata(
        {
            DECODE_KEY: str(decode).encode(),
            OURS_KEY: orjson.dumps(meta, option=orjson.OPT_SORT_KEYS),
        }
    )
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    os.close(fd)
    try:
        with pq.ParquetWriter(
            tmp, schema, compression="zstd", compression_level=3, use_compliant_nested_type=False,
            use_dictionary=["producer"],
            column_encoding={"prompt": "DELTA_BINARY_PACKED", "pos": "DELTA_BINARY_PACKED"},
        ) as w:  # fmt: skip
            for t in tables:
                w.write_table(t.replace_schema_metadata(schema.metadata))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def slice_scores(s, i):
    """The rows of prompt i in `s` (sorted by prompt)."""
    a, b = np.searchsorted(s.prompt, [i, i + 1])
    return s.take(slice(a, b))


def trace_tables(trace, replace=None):
    """Per-prompt tables of `trace`, with `replace` (name -> Scores) instead of those producers."""
    producers = dict(trace.producers) | (replace or {})
    for i, p in enumerate(trace.prompts):
        yield from prompt_tables(i, p, {n: slice_scores(s, i) for n, s in producers.items()})


# ================================================================================================
# The rows of a split: a build's OUT or the published dataset, read by the same code.


@dataclass(frozen=True, slots=True)
class Row:
    index: int  # in the split file
    source: str
    name: str
    messages: list
    tools: list | None


def hub_rows(spec, split):
    """Download `split` and the manifest of the published dataset (`hub` or `hub:REPO[@REV]`)."""
    repo, _, revision = spec.partition(":")[2].partition("@")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise ScoreError("--rows hub needs huggingface_hub (pip install -e '.[score]')") from None
    files = {}
    for name in (f"{split}.parquet", "manifest.json"):
        try:
            files[name] = hf_hub_download(
                repo or build.REPO_ID, name, repo_type="dataset", revision=revision or None
            )
        except Exception as e:  # the hub client's errors have no common base worth naming
            raise ScoreError(f"cannot download {name} of {repo or build.REPO_ID}: {e}") from None
    return Path(files[f"{split}.parquet"]), Path(files["manifest.json"])


def read_rows(rows_arg, split):
    """The split's rows, after checking the split file against the manifest beside it."""
    if rows_arg.startswith("hub"):
        data, manifest_path = hub_rows(rows_arg, split)
    else:
        out = Path(rows_arg)
        if not out.is_dir():
            raise ScoreError(f"--rows {out}: not a build's output directory")
        data, manifest_path = out / f"{split}.parquet", out / "manifest.json"
        if not data.is_file():
            raise ScoreError(
                f"--rows {out}: no {split}.parquet (splits: {', '.join(build.SPLIT_NAMES)})"
            )
        if not manifest_path.is_file():
            raise ScoreError(f"--rows {out}: no manifest.json: not a build's output directory")
    try:
        manifest = orjson.loads(manifest_path.read_bytes())
        want = manifest["splits"][split]["file_sha256"]
        names = {r["index"]: r["name"] for r in manifest["rows"] if r["split"] == split}
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError) as e:
        raise ScoreError(f"{manifest_path}: not a build's manifest ({e})") from None
    got = build.sha256_file(data)
    if got != want:
        raise ScoreError(
            f"{data}: sha256 {got} is not the {want} its manifest lists: the rows are not that build's"
        )
    table = pq.read_table(data)
    rows = []
    for i, (m, t, s) in enumerate(
        zip(table["messages"].to_pylist(), table["tools"].to_pylist(), table["source"].to_pylist())
    ):
        rows.append(Row(i, s, names.get(i, "-"), orjson.loads(m), orjson.loads(t) if t else None))
    return rows


def choose(rows, sources=None, first=None, shard=(0, 1)):
    """The rows a run takes: those of the named sources, then the first N, then every n-th."""
    if sources:
        rows = [r for r in rows if r.name in sources]
    if first is not None:
        rows = rows[:first]
    i, n = shard
    return [r for j, r in enumerate(rows) if j % n == i]


def render(tokenizer, row, options):
    """The row's token ids through the model's own chat template, the generation prompt open."""
    try:
        out = tokenizer.apply_chat_template(
            row.messages, tools=row.tools, add_generation_prompt=True, tokenize=True, **options
        )
    except Exception as e:  # a template raises whatever its author chose
        raise ScoreError(
            f"the chat template cannot render row {row.index} ({row.source}): {e}"
        ) from None
    ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
    return np.asarray(ids, dtype=np.int32).reshape(-1)


# ================================================================================================
# The engine: prefill a prompt, step one token, each giving one logits row (on its device).


class Engine:
    """What record and judge need of an engine; another engine is one more small class."""

    def prefill(self, ids):  # -> logits row of the last position
        raise NotImplementedError

    def step(self, token):  # -> logits row of the token just fed
        raise NotImplementedError

    def describe(self):  # -> dict recorded as the producer's settings
        raise NotImplementedError


def package(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return None


class Transformers(Engine):
    """Hugging Face transformers in-process: prefill in chunks through the cache (KV cache and
    recurrent state), then one token at a time through the same cache, so decode runs the model's
    own decode path. Only the last position's logits of a prefill are computed. After every
    forward, the cache can be stored at a lower precision (`kv_dtype`, `state_dtype`): what an
    engine that keeps its state that way would see."""

    def __init__(self, model, device="cpu", dtype="float32", chunk=512, kv_dtype="float32",
                 state_dtype="float32"):  # fmt: skip
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        # its notes on kernels it falls back from, and its loading bars, are not ours to print
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()

        self.torch = torch
        self.device, self.dtype, self.chunk = device, dtype, chunk
        self.kv_dtype, self.state_dtype = kv_dtype, state_dtype
        try:
            self.model = (
                AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype))
                .to(device)
                .eval()
            )
        except (OSError, ValueError, KeyError) as e:
            raise ScoreError(f"--model {model}: not a model transformers can load ({e})") from None
        self.cache = None

    def describe(self):
        return dict(
            engine="transformers", model_class=type(self.model).__name__, device=self.device,
            dtype=self.dtype, chunk=self.chunk, kv_dtype=self.kv_dtype,
            state_dtype=self.state_dtype,
            packages={p: package(p) for p in ("torch", "transformers", "numpy", "pyarrow")},
        )  # fmt: skip

    def forward(self, ids):
        torch = self.torch
        with torch.inference_mode():
            x = torch.as_tensor(np.asarray(ids, dtype=np.int64)[None], device=self.model.device)
            out = self.model(input_ids=x, cache=self.cache, use_cache=True, logits_to_keep=1)
            self.store()
            return out.logits[0, -1]

    def prefill(self, ids):
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self.stored = {}
        for a in range(0, len(ids), self.chunk):
            row = self.forward(ids[a : a + self.chunk])
        return row

    def step(self, token):
        return self.forward([token])

    def store(self):
        """Round every state tensor written since the last forward through the storage dtypes."""
        for i, layer in enumerate(self.cache.layers):
            if hasattr(layer, "recurrent_states"):
                if self.state_dtype != "float32":
                    for states in (layer.conv_states, layer.recurrent_states):
                        for t in states.values():
                            if t is not None:
                                self.round(t, self.state_dtype)
            elif self.kv_dtype != "float32" and getattr(layer, "keys", None) is not None:
                a = self.stored.get(i, 0)  # KV entries are written once: round only the new ones
                for t in (layer.keys, layer.values):
                    self.round(t[..., a:, :], self.kv_dtype)
                self.stored[i] = layer.keys.shape[-2]

    def round(self, t, dtype):
        t.copy_(t.to(getattr(self.torch, dtype)).to(t.dtype))


def top(row, k, next_id=None):
    """Log-softmax in float64 of a logits row; the top-k ids (ties to the lower id) with their
    log-probabilities and the log-probability of `next_id`. Only these values leave the device."""
    torch = sys.modules["torch"]
    lp = torch.log_softmax(row.double(), -1)
    key = torch.nan_to_num(lp, nan=-math.inf)
    k = min(k, key.numel())
    kth = torch.topk(key, k).values[-1]
    near = torch.nonzero(key >= kth).reshape(-1)  # every id tied with the k-th too, ascending
    order = torch.sort(key[near], descending=True, stable=True).indices[:k]
    ids = near[order]
    fed = lp[next_id].item() if next_id is not None else math.nan
    return ids.cpu().numpy().astype(np.int32), lp[ids].cpu().numpy(), fed


def sample(row, u, banned):
    """The token whose cumulative probability first passes u * total, over the model's own
    distribution with the stop tokens taken out (so every continuation is as long as asked)."""
    torch = sys.modules["torch"]
    p = torch.softmax(torch.nan_to_num(row.double(), nan=-math.inf), -1).nan_to_num(0.0)
    p[banned] = 0.0
    cdf = torch.cumsum(p, -1)
    if not cdf[-1].item() > 0:  # nothing left to sample from: the lowest id that is not a stop
        allowed = np.setdiff1d(np.arange(row.numel()), banned.cpu().numpy())
        return int(allowed[0])
    t = torch.searchsorted(
        cdf, torch.tensor([u * cdf[-1].item()], dtype=cdf.dtype, device=cdf.device)
    )
    return min(int(t.item()), row.numel() - 1)


def uniforms(seed, source, n):
    """n uniforms for the row `source`: the same for the same row and seed whatever else runs."""
    row_key = int.from_bytes(hashlib.sha256(source.encode()).digest()[:8], "big")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, row_key]))).random(n)


# ================================================================================================
# Driving an engine: the two functions that are not data in, data out.


def drive(engine, tokens, schedule, choose_next):
    """Feed one prompt: prefill tokens [0, ctx), then step each next token, yielding every scored
    position with its logits row and the token at pos + 1, which `choose_next(pos, row)` gives
    (the corpus's, or a sample: `tokens` is extended with it)."""
    row = engine.prefill(tokens[: schedule.ctx])
    for pos in schedule.positions:
        nxt = choose_next(pos, row)
        if pos + 1 == len(tokens):
            tokens.append(nxt)
        yield pos, row, nxt
        if pos + 1 < schedule.ctx + schedule.steps:
            row = engine.step(tokens[pos + 1])


def teacher(tokens):
    """Teacher forcing: the token at pos + 1 is the corpus's."""
    return lambda pos, row: tokens[pos + 1]


def score_prompt(engine, tokens, schedule, k, choose_next, progress=None):
    """One prompt's tokens (extended by what was chosen) and one producer's scores of it."""
    tokens = list(map(int, tokens))
    got = []
    for _, row, nxt in drive(engine, tokens, schedule, choose_next):
        got.append(top(row, k, nxt))
        if progress:
            progress.update()
    return np.asarray(tokens, np.int32), scores_of(schedule, got)


def scores_of(schedule, got):
    positions = np.asarray(schedule.positions, np.int32)
    return Scores(
        np.zeros(len(positions), np.int32),
        positions,
        np.asarray([f for _, _, f in got], np.float64),
        np.stack([i for i, _, _ in got]).astype(np.int32),
        np.stack([lp for _, lp, _ in got]).astype(np.float64),
    )


def nonfinite(scores):
    """Positions whose recorded log-probabilities are not all finite."""
    return ~(np.isfinite(scores.logprob).all(1) & np.isfinite(scores.ref_logprob))


class Staging:
    """Where a record keeps its finished prompts until the trace is whole: a directory beside
    the output holding a marker that names the run's settings, one one-prompt trace file per
    finished prompt, and a lock. A killed record resumes from it; only a directory with our
    marker is ever reused or removed."""

    MARKER = "kern-prompts-record.json"

    def __init__(self, out, key):
        self.dir = out.parent / f".{out.name}.record"
        self.key = key
        marker = self.dir / self.MARKER
        if self.dir.is_symlink() or (self.dir.exists() and not marker.is_file()):
            raise ScoreError(f"{self.dir} exists and is not a record's staging; it is left alone")
        try:
            self.dir.mkdir(exist_ok=True)
            self.lock = open(self.dir / "lock", "a")
        except OSError as e:
            raise ScoreError(f"cannot write beside {out}: {e.strerror}") from None
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ScoreError(f"another record is writing {out}") from None
        if marker.is_file():
            if orjson.loads(marker.read_bytes()) != key:
                raise ScoreError(
                    f"{self.dir} holds an unfinished record with other settings; rerun it with "
                    "its settings to finish it, or remove that directory"
                )
        else:
            marker.write_bytes(orjson.dumps(key))

    def path(self, i):
        return self.dir / f"{i:06d}.parquet"

    def done(self, i):
        """Prompt i's tokens and scores, if a previous run finished it."""
        p = self.path(i)
        if not p.is_file():
            return None
        t = read_trace(p)
        return t.prompts[0].tokens, next(iter(t.producers.values()))

    def keep(self, i, decode, tokens, name, scores):
        write_trace(self.path(i), decode, {}, prompt_tables(0, Prompt(tokens), {name: scores}))

    def remove(self):
        for p in self.dir.iterdir():
            p.unlink()
        self.dir.rmdir()
        self.lock.close()


def run_key(corpus, name, producer):
    return {"corpus": {k: v for k, v in corpus.items() if k != "producers"}, "producer": name,
            "settings": producer}  # fmt: skip


def record_prompts(engine, plan, staging, name, k, decode, choose_for, quiet):
    """Score every planned prompt (tokens, schedule, row) that a previous run did not finish."""
    from tqdm import tqdm

    out_tokens, out_scores = [], []
    bar = tqdm(plan, desc="prompts", unit="prompt", disable=quiet, file=sys.stderr)
    for i, (tokens, sched, row) in enumerate(bar):
        done = staging.done(i)
        if done is None:
            steps = tqdm(total=sched.steps + 1, desc=f"prompt {i}", unit="step", leave=False,
                         disable=quiet, file=sys.stderr)  # fmt: skip
            got = score_prompt(engine, tokens, sched, k, choose_for(i, tokens, row), steps)
            steps.close()
            staging.keep(i, decode, got[0], name, got[1])
            done = got
        out_tokens.append(done[0])
        s = done[1]
        s.prompt = np.full(len(s.pos), i, np.int32)
        out_scores.append(s)
    return out_tokens, concat_scores(out_scores)


def empty_scores():
    return Scores(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.float32),
                  np.zeros((0, 2), np.int32), np.zeros((0, 2), np.float32))  # fmt: skip


def concat_scores(parts):
    parts = [p for p in parts if len(p.pos)] or parts[:1] or [empty_scores()]  # k may differ
    if len(parts) == 1:
        return parts[0]
    return Scores(*(np.concatenate([getattr(p, f) for p in parts]) for f in Scores.__slots__))


def engine_of(args):
    if args.chunk < 1:
        raise ScoreError("--chunk must be at least 1")
    return Transformers(args.model, args.device, args.dtype, args.chunk, args.kv_dtype,
                        args.state_dtype)  # fmt: skip


def load_tokenizer(model):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError, KeyError) as e:
        raise ScoreError(f"--model {model}: no tokenizer transformers can load ({e})") from None


def stop_ids(tokenizer, model_dir):
    """The ids a reference never samples: every end-of-sequence id of the tokenizer, the model's
    config and its generation config."""
    from transformers import AutoConfig, GenerationConfig

    ids = {tokenizer.eos_token_id}
    for load in (AutoConfig.from_pretrained, GenerationConfig.from_pretrained):
        try:
            eos = getattr(load(model_dir), "eos_token_id", None)
        except (OSError, ValueError):
            continue
        ids |= set(eos if isinstance(eos, list) else [eos])
    return sorted(i for i in ids if i is not None)


def tokenizer_sha256(tokenizer):
    return build.sha256_hex(tokenizer.backend_tokenizer.to_str())


def model_context(engine):
    return int(getattr(engine.model.config, "max_position_embeddings", 0) or 0) or None


def plan_rows(args, tokenizer, context):
    """Render the chosen rows; keep those whose prompt plus continuation fit the context."""
    rows = read_rows(args.rows, args.split)
    cap = next(s.decode_cap for s in build.SPLITS if s.name == args.split)
    length = args.length or cap
    if length < 1 or length > cap:
        raise ScoreError(f"--length must be from 1 to the {args.split} split's cap, {cap}")
    chosen = choose(rows, args.sources, args.first, args.shard)
    if not chosen:
        raise ScoreError("no row is chosen: check --sources and --first")
    options = {"enable_thinking": args.thinking == "on"}
    plan, skipped = [], []
    for row in chosen:
        ids = render(tokenizer, row, options)
        if context and len(ids) + length > context:
            skipped.append(dict(index=row.index, source=row.source, rendered=len(ids)))
            continue
        plan.append((list(map(int, ids)), Schedule(len(ids), length - 1), row))
    if not plan:
        raise ScoreError(
            f"no chosen row fits a context of {context} tokens with {length} to decode"
        )
    return plan, skipped, length, options


def cmd_record(args):
    out = Path(args.out)
    if args.corpus:
        return record_corpus(args, out)
    engine = engine_of(args)
    tokenizer = load_tokenizer(args.model)
    context = args.context or model_context(engine)
    plan, skipped, length, options = plan_rows(args, tokenizer, context)
    template = tokenizer.chat_template or ""
    corpus = dict(
        split=args.split, rows=str(args.rows), length=length,
        choice=dict(sources=args.sources, first=args.first, shard=list(args.shard)),
        model=str(args.model), tokenizer_sha256=tokenizer_sha256(tokenizer),
        chat_template_sha256=build.sha256_hex(template), template_options=options,
        seed=args.seed, sampler=dict(kind="ancestral", temperature=1.0,
                                     never=stop_ids(tokenizer, args.model)),
        context=context, skipped=skipped,
        prompts=[dict(index=r.index, source=r.source, name=r.name, rendered=len(t))
                 for t, _, r in plan],
    )  # fmt: skip
    producer = engine.describe()
    staging = Staging(out, run_key(corpus, args.producer, producer))
    banned = sys.modules["torch"].tensor(
        corpus["sampler"]["never"], dtype=sys.modules["torch"].long
    )

    def choose_for(i, tokens, row):
        u = uniforms(args.seed, row.source, length)
        return lambda pos, logits: sample(logits, u[pos - (len(tokens) - 1)], banned)

    # the plan's tokens are the rendered prompts; each is extended by its continuation
    full = [(t, Schedule.of(len(t) + length, length - 1), r) for t, _, r in plan]
    tokens, scores = record_prompts(engine, full, staging, args.producer, args.top_k, length - 1,
                                    choose_for, args.quiet)  # fmt: skip
    corpus["producers"] = {args.producer: producer}
    prompts = [Prompt(t, r.source, r.name, r.index, len(p)) for t, (p, _, r) in zip(tokens, plan)]
    trace = Trace(prompts, length - 1, {args.producer: scores}, corpus)
    finish(out, trace, staging, args.producer)
    return 0


def finish(out, trace, staging, name):
    """Write the trace, remove the staging, say what was written."""
    write_trace(out, trace.decode, trace.meta, trace_tables(trace))
    staging.remove()
    s = trace.producers[name]
    bad = nonfinite(s)
    print(
        f"wrote {out}: {len(trace.prompts)} prompts, {len(s.pos)} positions of producer {name}"
        + (f", {len(trace.meta.get('skipped', []))} rows skipped (too long for the context)"
           if trace.meta.get("skipped") else ""),
        file=sys.stderr,
    )  # fmt: skip
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        print(
            f"warning: {int(bad.sum())} positions of {name} have non-finite log-probabilities "
            f"(first: prompt {s.prompt[j]} pos {s.pos[j]}); a judge fails on them",
            file=sys.stderr,
        )


def record_corpus(args, out):
    """Teacher forcing: feed an existing trace's tokens and add (or replace) a producer."""
    trace = read_trace(args.corpus)
    if args.producer in trace.producers and not args.replace:
        raise ScoreError(
            f"{args.corpus} already has producer {args.producer!r}; --replace replaces it"
        )
    engine = engine_of(args)
    producer = engine.describe()
    corpus = dict(trace.meta)
    staging = Staging(out, run_key(corpus | {"decode": trace.decode}, args.producer, producer)
                      | {"corpus_tokens": corpus_sha256(trace)})  # fmt: skip
    plan = [
        (list(map(int, p.tokens)), trace.schedule(i), None) for i, p in enumerate(trace.prompts)
    ]

    def choose_for(i, tokens, row):
        return teacher(tokens)

    _, scores = record_prompts(engine, plan, staging, args.producer, args.top_k, trace.decode,
                               choose_for, args.quiet)  # fmt: skip
    trace.producers[args.producer] = scores
    trace.meta = corpus | {"producers": corpus.get("producers", {}) | {args.producer: producer}}
    finish(out, trace, staging, args.producer)
    return 0


def corpus_sha256(trace):
    h = hashlib.sha256(str(trace.decode).encode())
    for p in trace.prompts:
        h.update(len(p.tokens).to_bytes(8, "little") + p.tokens.astype("<i4").tobytes())
    return h.hexdigest()


def cmd_merge(args):
    """Several records of disjoint rows (one per device) into one trace."""
    traces = [read_trace(p) for p in args.files]
    first = traces[0]

    def settings(t):
        c = {k: v for k, v in t.meta.items() if k not in ("prompts", "skipped")}
        c["choice"] = {k: v for k, v in c.get("choice", {}).items() if k != "shard"}
        return c

    for path, t in zip(args.files, traces):
        if not t.meta.get("prompts"):
            raise ScoreError(f"{path}: has no record of its rows; only files record wrote merge")
        if settings(t) != settings(first) or t.decode != first.decode:
            raise ScoreError(f"{path}: its corpus or producer settings differ from {args.files[0]}")
        if set(t.producers) != set(first.producers):
            raise ScoreError(f"{path}: its producers differ from {args.files[0]}")
    parts = sorted(
        ((p.index, t, i) for t in traces for i, p in enumerate(t.prompts)), key=lambda x: x[0]
    )
    indices = [x[0] for x in parts]
    if len(set(indices)) != len(indices):
        dup = next(i for i in indices if indices.count(i) > 1)
        raise ScoreError(f"row {dup} is in more than one file: the records are not disjoint")
    prompts, scores = [], {n: [] for n in first.producers}
    for j, (_, t, i) in enumerate(parts):
        prompts.append(t.prompts[i])
        for n in scores:
            s = slice_scores(t.producers[n], i)
            s.prompt = np.full(len(s.pos), j, np.int32)
            scores[n].append(s)
    meta = dict(first.meta)
    meta["choice"] = settings(first)["choice"] | {"shard": [0, 1]}
    meta["prompts"] = [dict(index=p.index, source=p.source, name=p.name, rendered=p.rendered)
                       for p in prompts]  # fmt: skip
    meta["skipped"] = sorted((s for t in traces for s in t.meta.get("skipped", [])),
                             key=lambda s: s["index"])  # fmt: skip
    merged = Trace(prompts, first.decode, {n: concat_scores(v) for n, v in scores.items()}, meta)
    write_trace(args.out, merged.decode, meta, trace_tables(merged))
    print(f"wrote {args.out}: {len(prompts)} prompts from {len(traces)} files", file=sys.stderr)
    return 0


# ================================================================================================
# The judge: plain functions from arrays to numbers.

LOW = 0 if sys.byteorder == "little" else 1  # where a uint64's low 32 bits are, as two uint32s
CHUNK_ROWS = 8192  # positions compared at once: large enough for two threads to share the work


def coarse_sums(kept, p, q, d):
    """KL(a || b) and KL(b || a) over the vocabulary coarsened into the `kept` tokens (each its own
    bucket) plus one rest bucket, from the tokens' probabilities `p`, `q` on the two sides and
    log-ratios `d` ([n, w] in any order; entries not kept are left out). By the data-processing
    inequality each is at most the true KL: a lower bound, exact when the kept tokens cover the
    vocabulary. A non-finite value anywhere in a row gives an infinite KL."""
    w = kept.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        p_rest = np.maximum(1.0 - np.einsum("ij,ij->i", w, p), REST_FLOOR)
        q_rest = np.maximum(1.0 - np.einsum("ij,ij->i", w, q), REST_FLOOR)
        rest = np.log(p_rest / q_rest)
        kl = np.einsum("ij,ij,ij->i", w, p, d) + p_rest * rest
        kl_rev = -np.einsum("ij,ij,ij->i", w, q, d) - q_rest * rest
    return tuple(np.where(np.isfinite(x), np.maximum(x, 0.0), np.inf) for x in (kl, kl_rev))


def coarse_kl(lp_a, lp_b, kept):
    """coarse_sums from the log-probabilities of the same tokens on both sides."""
    with np.errstate(invalid="ignore", over="ignore"):
        return coarse_sums(kept, np.exp(lp_a), np.exp(lp_b), lp_a - lp_b)


def float32(x):
    """Log-probabilities as a trace stores them: the judge computes on what a file would hold."""
    return np.asarray(x, np.float32)


def sorted_tables(ids_a, lp_a, ids_b, lp_b):
    """Both tables of each position in one row sorted by token id, a's entry of a token just
    before b's: [n, ka + kb] uint64 keys, as [n, ka + kb, 2] uint32 halves: the high half the id
    and the side (id * 2 for a, id * 2 + 1 for b), the low half the float32 log-probability's
    bits. A token both kept is then two neighbours, found in O(k log k) rather than by comparing
    every id with every id."""
    n, ka = ids_a.shape
    width = ka + ids_b.shape[1]
    key = np.empty((n, width), np.uint64)
    half = key.view(np.uint32).reshape(n, width, 2)
    for ids, side in ((ids_a, half[:, :ka, 1 - LOW]), (ids_b, half[:, ka:, 1 - LOW])):
        np.left_shift(np.asarray(ids, np.int32).view(np.uint32), 1, out=side)  # ids are >= 0
    half[:, ka:, 1 - LOW] |= 1
    half[:, :ka, LOW] = float32(lp_a).view(np.uint32)
    half[:, ka:, LOW] = float32(lp_b).view(np.uint32)
    key.sort(1)
    return half


def measure(ids_a, lp_a, ids_b, lp_b, full_b=None):
    """One chunk of positions: KL both ways (`shared`; with `full_b`, b's log-probabilities of a's
    kept ids from a full logits row, `against`), the rank of a's argmax in b, the top-k overlap,
    and whether a table lists a token twice."""
    half = sorted_tables(ids_a, lp_a, ids_b, lp_b)
    high = half[:, :, 1 - LOW]
    link = high[:, :-1] ^ high[:, 1:]  # 1: a's and b's entries of one token; 0: a token twice
    kept = link == 1
    if full_b is None:
        v = half[:, :, LOW].view(np.float32).astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.exp(v)
            kl, kl_rev = coarse_sums(kept, e[:, :-1], e[:, 1:], v[:, :-1] - v[:, 1:])
    else:
        kl, kl_rev = coarse_kl(float32(lp_a).astype(np.float64), full_b, np.ones(lp_a.shape, bool))
    top = ids_b == ids_a[:, :1]
    rank = np.where(top.any(1), top.argmax(1) + 1, 0).astype(np.int32)
    overlap = (np.count_nonzero(kept, 1) / ids_a.shape[1]).astype(np.float32)
    return kl, kl_rev, rank, overlap, (link == 0).any(1)


@dataclass(slots=True)
class Compared:
    """A reference side `a` against a candidate `b` at the positions both scored."""

    prompt: np.ndarray
    pos: np.ndarray
    kl: np.ndarray  # KL(a || b), the estimator's lower bound
    kl_reverse: np.ndarray  # KL(b || a), the same estimator with the roles swapped
    flip: np.ndarray  # argmax of b differs from a's (both tie to the lower id)
    margin: np.ndarray  # a's top-1 minus top-2 log-probability
    margin_b: np.ndarray  # b's
    rank: np.ndarray  # a's argmax in b, 1-based; 0 when b did not keep it
    overlap: np.ndarray  # share of a's kept tokens that b kept too
    lp_a: np.ndarray  # a's log-probability of the fed token
    lp_b: np.ndarray
    argmax_a: np.ndarray
    argmax_b: np.ndarray


def concat_compared(parts):
    return Compared(*(np.concatenate([getattr(c, f) for c in parts]) for f in Compared.__slots__))


def join(a, b):
    """Indices of the positions both a and b scored, in (prompt, pos) order."""
    ka = a.prompt.astype(np.int64) << 32 | a.pos.astype(np.int64)
    kb = b.prompt.astype(np.int64) << 32 | b.pos.astype(np.int64)
    _, ia, ib = np.intersect1d(ka, kb, assume_unique=True, return_indices=True)
    return ia, ib


def chunks(n):
    return [slice(i, i + CHUNK_ROWS) for i in range(0, n, CHUNK_ROWS)] or [slice(0, 0)]


def compare(a, b, full_b=None, threads=None):
    """Compare two producers' tables position by position, with the shared estimator (the tokens
    both kept, plus a rest bucket); with `full_b` (b's log-probabilities of a's kept ids, from a
    full logits row), the `against` estimator (a's kept tokens, plus a rest bucket: tighter).
    Chunks are measured on every core; each chunk's numbers do not depend on how many."""
    if not (np.array_equal(a.prompt, b.prompt) and np.array_equal(a.pos, b.pos)):
        ia, ib = join(a, b)
        a, b = a.take(ia), b.take(ib)
        full_b = None if full_b is None else full_b[ib]

    def one(c):
        return measure(a.ids[c], a.logprob[c], b.ids[c], b.logprob[c],
                       None if full_b is None else full_b[c])  # fmt: skip

    cs = chunks(len(a.pos))
    with ThreadPoolExecutor(min(threads or build.available_cpus(), len(cs))) as pool:
        parts = list(pool.map(one, cs))
    kl, kl_rev, rank, overlap, twice = (np.concatenate([p[i] for p in parts]) for i in range(5))
    if twice.any():
        j = int(np.flatnonzero(twice)[0])
        raise ScoreError(f"a top-k list names a token twice at prompt {a.prompt[j]} position "
                         f"{a.pos[j]}")  # fmt: skip
    lp_a, lp_b = (float32(x.logprob[:, :2]).astype(np.float64) for x in (a, b))
    return Compared(
        a.prompt, a.pos, kl, kl_rev,
        a.ids[:, 0] != b.ids[:, 0],
        lp_a[:, 0] - lp_a[:, 1], lp_b[:, 0] - lp_b[:, 1],
        rank, overlap,
        float32(a.ref_logprob), float32(b.ref_logprob),
        a.ids[:, 0], b.ids[:, 0],
    )  # fmt: skip


def quantiles(v, *qs):
    """kern's quantiles: the sorted values at index round((n - 1) q), from one partition."""
    if len(v) == 0:
        return [0.0] * len(qs)
    at = [round((len(v) - 1) * q) for q in qs]
    part = np.partition(v, at)
    return [float(part[i]) for i in at]


def quantile(v, q):
    return quantiles(v, q)[0]


@dataclass(slots=True)
class Band:
    """The widest disagreement between reference producers, over every ordered pair: the largest
    margin at which one flipped another's argmax, flip rate, KL p50 and p99 (at least KL_FLOOR)."""

    margin: float = 0.0
    flip_rate: float = 0.0
    kl_p50: float = KL_FLOOR
    kl_p99: float = KL_FLOOR


def band(between):
    """The band from each unordered pair of producers compared once: with the shared estimator
    KL(y || x) is the reverse KL of x against y, and y's margin is measured beside x's."""
    if not between:
        return None
    b = Band()
    for c in between.values():
        if len(c.kl) == 0:
            continue
        for margin, kl in ((c.margin, c.kl), (c.margin_b, c.kl_reverse)):
            b.margin = max(b.margin, float(margin[c.flip].max(initial=0.0)))
            b.flip_rate = max(b.flip_rate, float(c.flip.mean()))
            p50, p99 = quantiles(kl, 0.5, 0.99)
            b.kl_p50, b.kl_p99 = max(b.kl_p50, p50), max(b.kl_p99, p99)
    return b


def confident(c, band_, limit):
    """The flips that fail: above the band's margin, or (one producer) beyond the KL limit."""
    return c.flip & ((c.margin > band_.margin) if band_ else (c.kl > limit))


def stats(c, sel, conf):
    """One stratum's numbers; `conf` marks the confident flips."""
    kl = c.kl[sel]
    n = len(kl)
    if n == 0:
        return None
    flips = c.flip[sel]
    p50, p99, top = quantiles(kl, 0.5, 0.99, 1.0)
    finite = kl[np.isfinite(kl)]
    return dict(
        positions=n, flips=int(flips.sum()), flip_rate=float(flips.mean()),
        confident=int(conf[sel].sum()), kl_p50=p50, kl_p99=p99, kl_max=top,
        kl_mean=float(finite.mean()) if len(finite) else math.inf,
        kl_reverse_p99=quantile(c.kl_reverse[sel], 0.99),
        overlap_mean=float(c.overlap[sel].mean()),
    )  # fmt: skip


def steps_and_phases(trace, c):
    """The decode step of each compared position (0 at the prefill position) and its depth."""
    ctx = np.array([trace.schedule(i).ctx for i in range(len(trace.prompts))], np.int64)
    step = c.pos.astype(np.int64) - (ctx[c.prompt] - 1)
    return step, c.pos.astype(np.int64) + 1


def strata(trace, c, band_, limit):
    """Every statistic per source name, phase, decode-step bucket and context-depth bucket."""
    step, depth = steps_and_phases(trace, c)
    names = sorted({p.name for p in trace.prompts})
    code = np.array([names.index(p.name) for p in trace.prompts], np.int32)[c.prompt]
    conf = confident(c, band_, limit)
    out = {"all": stats(c, slice(None), conf)}
    for phase, sel in (("prefill", step == 0), ("decode", step > 0)):
        out[f"phase {phase}"] = stats(c, sel, conf)
    for lo, hi in DECODE_BUCKETS:
        out[f"decode steps {lo:,}-{hi:,}"] = stats(c, (step >= lo) & (step <= hi), conf)
    for lo, hi in DEPTH_BUCKETS:
        out[f"depth {lo:,}-{hi:,}"] = stats(c, (depth >= lo) & (depth <= hi), conf)
    for j, name in enumerate(names):
        out[f"source {name}"] = stats(c, code == j, conf)
    return {k: v for k, v in out.items() if v is not None}


def trailing_mean(x, w):
    """The mean of the last w values at each index (fewer at the start)."""
    x = np.where(np.isfinite(x), x, 1e300)
    s = np.cumsum(np.r_[0.0, x])
    i = np.arange(1, len(x) + 1)
    return (s[i] - s[np.maximum(i - w, 0)]) / np.minimum(i, w)


def left_at(kl_by_step, threshold):
    """The first decode step from which the trailing mean KL stays above the threshold (None: it
    ends within it). `kl_by_step[j]` is the KL at decode step j + 1."""
    if len(kl_by_step) == 0:
        return None
    over = trailing_mean(kl_by_step, DRIFT_WINDOW) > threshold
    if not over[-1]:
        return None
    within = np.flatnonzero(~over)
    return int(within[-1] + 2) if len(within) else 1


def drift(trace, c, threshold):
    """Per prompt and overall (the mean KL over prompts at each decode step), the step the
    candidate left the band at."""
    step, _ = steps_and_phases(trace, c)
    dec = step > 0
    per = {}
    for i in np.unique(c.prompt[dec]):
        sel = dec & (c.prompt == i)
        order = np.argsort(step[sel])
        per[int(i)] = left_at(c.kl[sel][order], threshold)
    if not dec.any():
        return per, None, np.zeros(0)
    n = int(step[dec].max())
    total = np.bincount(step[dec] - 1, weights=np.minimum(c.kl[dec], 1e300), minlength=n)
    count = np.bincount(step[dec] - 1, minlength=n)
    mean = total / np.maximum(count, 1)
    return per, left_at(mean, threshold), mean


@dataclass(slots=True)
class Verdict:
    code: int  # 0 pass, 1 fail, 2 inconclusive
    word: str
    why: str


def verdict(results, band_, limit):
    """kern's rules, on one estimator (README "Judging a candidate"). `results` maps each
    reference producer to the candidate compared against it. An infinite KL (non-finite
    log-probabilities on either side) fails first: no band excuses it."""
    at_once = (
        (lambda c: ~np.isfinite(c.kl), lambda c, j, n: (
            f"non-finite log-probabilities at prompt {c.prompt[j]} pos {c.pos[j]} (infinite KL "
            f"at {n} positions)")),
        (lambda c: confident(c, band_, limit), lambda c, j, n: (
            f"confident argmax flip at prompt {c.prompt[j]} pos {c.pos[j]} ({c.argmax_a[j]} -> "
            f"{c.argmax_b[j]}, margin {c.margin[j]:.3f}, KL {c.kl[j]:.1e})")),
    )  # fmt: skip
    for failing, why in at_once:
        for name, c in results.items():
            bad = np.flatnonzero(failing(c))
            if len(bad):
                return Verdict(1, "FAIL", f"{why(c, bad[0], len(bad))} against {name}")
    n = min(len(c.kl) for c in results.values())
    if band_:
        over = []
        for name, c in results.items():
            rate, p50, p99 = float(c.flip.mean()), quantile(c.kl, 0.5), quantile(c.kl, 0.99)
            what = [w for o, w in (
                (rate > band_.flip_rate, f"flip rate {rate:.2%}"),
                (p50 > band_.kl_p50, f"KL p50 {p50:.1e}"),
                (p99 > band_.kl_p99, f"KL p99 {p99:.1e}"),
            ) if o]  # fmt: skip
            if what:
                over.append(f"against {name}: {', '.join(what)}")
        if over:
            return Verdict(1, "FAIL", "beyond the band: " + "; ".join(over))
        return Verdict(
            0, "PASS", f"within the band of {len(results)} producers on all {n} positions"
        )
    ((name, c),) = results.items()
    kl_max = float(c.kl.max(initial=0.0))
    if kl_max <= limit:
        return Verdict(0, "PASS", f"within KL {limit:.0e} of {name} on all {n} positions")
    return Verdict(2, "INCONCLUSIVE", (
        f"KL up to {kl_max:.1e} (limit {limit:.0e}) against {name} with no confident flip on "
        f"{n} positions; record a second reference producer to make a band"
    ))  # fmt: skip


# ================================================================================================
# The report.


def same_header(ref, cand, ref_path, cand_path):
    """Refuse files recorded with other settings or another decode cap."""
    for key in ("split", "length", "choice", "seed", "model"):
        a, b = ref.meta.get(key), cand.meta.get(key)
        if a is not None and b is not None and a != b:
            raise ScoreError(f"{cand_path} was recorded with {key} {b}, {ref_path} with {a}")
    if ref.decode != cand.decode:
        raise ScoreError(f"{cand_path} has decode {cand.decode}, {ref_path} has {ref.decode}")


def same_prompt(i, a, b, ref_path, cand_path):
    """Refuse corpora that differ: name the first position of prompt i where they do."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    if len(diff) or len(a) != len(b):
        at = int(diff[0]) if len(diff) else n
        raise ScoreError(
            f"the corpora differ: prompt {i} position {at} ({ref_path}: "
            f"{a[at] if at < len(a) else 'end'}, {cand_path}: {b[at] if at < len(b) else 'end'})"
        )


BATCH_ROWS = 1 << 13  # scored positions judged together, at least: a stream's memory is bounded


def batch(names, parts):
    """One batch from the parts of several prompts: each reference producer's scores and the
    candidate's."""
    refs = {n: concat_scores([r[n] for r, _ in parts if n in r]) for n in names}
    return refs, concat_scores([c for _, c in parts]), None


def lockstep(ref, ref_parts, cand_parts, name, ref_path, cand_path, seen):
    """Batches of whole prompts read from both files together, the corpora compared prompt by
    prompt as they come; the reference's prompts are added to `ref`, and the candidate's
    positions counted in `seen`."""
    parts, size, count = [], 0, [0, 0]
    for r, c in zip_longest(ref_parts, cand_parts):
        count[0] += r is not None
        count[1] += c is not None
        if r is None or c is None:
            continue  # count the rest of the longer file
        i = len(ref.prompts)
        same_prompt(i, r[0].tokens, c[0].tokens, ref_path, cand_path)
        ref.prompts.append(r[0])
        cand = c[1].get(name, empty_scores())
        seen[0] += len(cand.pos)
        parts.append((r[1], cand))
        size += len(cand.pos)
        if size >= BATCH_ROWS:
            yield batch(ref.producers, parts)
            parts, size = [], 0
    if count[0] != count[1]:
        raise ScoreError(f"{cand_path} has {count[1]} prompts, {ref_path} has {count[0]}")
    if parts:
        yield batch(ref.producers, parts)


def judge_batches(ref, batches, limit=LIMIT_KL, estimator="shared"):
    """Everything the report says, as data: the band, the candidate against every reference
    producer, the strata, the drift and the verdict. `batches` gives (each reference producer's
    scores, the candidate's, the candidate's full log-probabilities at each producer's ids or
    None) for whole prompts; `ref.prompts` is whole once they are given."""
    names = sorted(ref.producers)
    pairs = [(x, y) for i, x in enumerate(names) for y in names[i + 1 :]]
    between, got = {p: [] for p in pairs}, {n: [] for n in names}
    for refs, cand, full in batches:
        for x, y in pairs:
            between[x, y].append(compare(refs[x], refs[y]))
        for n in names:
            fb = full[n] if estimator == "against" else None
            got[n].append(compare(refs[n], cand, fb))
    between = {p: concat_compared(v) for p, v in between.items()}
    results = {n: concat_compared(v) for n, v in got.items()}
    if all(len(c.kl) == 0 for c in results.values()):
        raise ScoreError("the reference and the candidate share no scored position")
    band_ = band(between)
    v = verdict(results, band_, limit)
    first = names[0]
    threshold = band_.kl_p99 if band_ else limit
    per, overall, mean = drift(ref, results[first], threshold)
    return dict(
        band=band_, estimator=estimator, results=results, between=between, verdict=v,
        limit=limit, strata={n: strata(ref, c, band_, limit) for n, c in results.items()},
        drift=dict(against=first, threshold=threshold, overall=overall, per_prompt=per,
                   mean_by_step=mean),
    )  # fmt: skip


def judge(ref, cand, full=None, limit=LIMIT_KL, estimator=None):
    """judge_batches on a whole reference (a Trace) and candidate (Scores) in memory."""
    estimator = estimator or ("against" if full is not None and len(ref.producers) < 2
                              else "shared")  # fmt: skip
    return judge_batches(ref, [(ref.producers, cand, full)], limit, estimator)


def candidate_from_model(engine, ref, quiet=True):
    """Run the candidate here on the reference's tokens: its top-k (k as the reference keeps)
    and, for the `against` estimator, its log-probabilities of every producer's kept ids."""
    torch = sys.modules["torch"]
    k = max(s.ids.shape[1] for s in ref.producers.values())
    at_ids = {n: [] for n in ref.producers}
    index = {n: {(int(a), int(b)): j for j, (a, b) in enumerate(zip(s.prompt, s.pos))}
             for n, s in ref.producers.items()}  # fmt: skip
    from tqdm import tqdm

    bar = tqdm(total=sum(ref.schedule(i).steps + 1 for i in range(len(ref.prompts))),
               desc="candidate", unit="pos", disable=quiet, file=sys.stderr)  # fmt: skip
    parts = []
    for i, p in enumerate(ref.prompts):
        tokens, sched, rows = list(map(int, p.tokens)), ref.schedule(i), []
        for pos, row, nxt in drive(engine, tokens, sched, teacher(tokens)):
            rows.append(top(row, k, nxt))
            lp = torch.log_softmax(row.double(), -1)
            for n, s in ref.producers.items():
                j = index[n].get((i, pos))
                ids = s.ids[j] if j is not None else np.zeros(s.ids.shape[1], np.int32)
                at_ids[n].append(lp[torch.as_tensor(ids, dtype=torch.long)].cpu().numpy())
            bar.update()
        s = scores_of(sched, rows)
        s.prompt = np.full(len(s.pos), i, np.int32)
        parts.append(s)
    bar.close()
    return concat_scores(parts), {n: np.stack(v) for n, v in at_ids.items()}, engine.describe()


ESTIMATORS = {
    "shared": "the tokens both sides kept plus one rest bucket (a lower bound on the true KL)",
    "against": "the reference's kept tokens plus one rest bucket, the candidate's full logits "
    "(a lower bound on the true KL, tighter)",
}


def stats_line(label, st):
    return (
        f"  {label}: {st['positions']} positions · {st['positions'] - st['flips']}/"
        f"{st['positions']} argmax agree ({st['confident']} confident flips) · KL p50 "
        f"{st['kl_p50']:.1e} · p99 {st['kl_p99']:.1e} · max {st['kl_max']:.1e} · reverse p99 "
        f"{st['kl_reverse_p99']:.1e} · top-k overlap {st['overlap_mean']:.2f}"
    )


def report_lines(ref, ref_path, cand_label, cand_positions, j):
    positions = sum(ref.schedule(i).steps + 1 for i in range(len(ref.prompts)))
    lines = [
        f"reference {ref_path} · producers {', '.join(sorted(ref.producers))} · "
        f"{len(ref.prompts)} prompts · {positions} positions ({len(ref.prompts)} prefill + "
        f"{positions - len(ref.prompts)} decode)"
        + (f" · split {ref.meta['split']}" if ref.meta.get("split") else ""),
        f"candidate {cand_label} · {cand_positions} positions",
        f"estimator {j['estimator']}: {ESTIMATORS[j['estimator']]}",
    ]
    b = j["band"]
    lines.append(
        f"band between producers · flips at margin <= {b.margin:.3f} · flip rate "
        f"{b.flip_rate:.2%} · KL p50 {b.kl_p50:.1e} · p99 {b.kl_p99:.1e}"
        if b
        else f"band none (one producer) · KL limit {j['limit']:.0e}: a flip beyond it fails"
    )
    first = sorted(j["results"])[0]
    for name, c in sorted(j["results"].items()):
        missing = positions - len(c.kl)
        lines.append(
            f"against {name}: judged on {len(c.kl)} positions"
            + (f" ({missing} the candidate lacks)" if missing > 0 else "")
        )
        for label, st in j["strata"][name].items():
            if label == "all" or name == first:  # every stratum against the first producer
                lines.append(stats_line(label, st))
    d = j["drift"]
    per = ", ".join(f"{i}: {'-' if s is None else s}" for i, s in sorted(d["per_prompt"].items()))
    lines.append(
        f"drift against {d['against']}: "
        + ("stays within" if d["overall"] is None else f"left at decode step {d['overall']}")
        + f" (trailing mean of {DRIFT_WINDOW} steps over KL {d['threshold']:.1e}); per prompt: "
        + (per or "-")
    )
    c = j["results"][first]
    worst = np.argsort(-np.where(np.isnan(c.kl), np.inf, c.kl), kind="stable")[:SHOW]
    for w in worst:
        p = ref.prompts[c.prompt[w]]
        lines.append(f"worst prompt {c.prompt[w]} pos {c.pos[w]} · KL {c.kl[w]:.1e} · "
                     f"{p.name} {p.source}")  # fmt: skip
    conf = confident(c, j["band"], j["limit"])
    for f in np.flatnonzero(c.flip)[:SHOW]:
        lines.append(
            f"flip {'x ' if conf[f] else ''}prompt {c.prompt[f]} pos {c.pos[f]} vs {first}: "
            f"{c.argmax_a[f]} -> {c.argmax_b[f]} · margin {c.margin[f]:.3f} · KL {c.kl[f]:.1e} "
            f"· reference token is #{c.rank[f]} · fed logprob {c.lp_a[f]:.3f} -> {c.lp_b[f]:.3f}"
        )
    lines.append(f"{j['verdict'].word} {j['verdict'].why}")
    return lines


def as_json(ref, j):
    def num(x):
        return None if x is None else (x if math.isfinite(x) else str(x))

    def clean(d):
        return {k: (clean(v) if isinstance(v, dict) else num(v) if isinstance(v, float) else v)
                for k, v in d.items()}  # fmt: skip

    flips = []
    for name, c in sorted(j["results"].items()):
        for f in np.flatnonzero(c.flip):
            flips.append(dict(producer=name, prompt=int(c.prompt[f]), pos=int(c.pos[f]),
                              reference=int(c.argmax_a[f]), candidate=int(c.argmax_b[f]),
                              margin=num(float(c.margin[f])), kl=num(float(c.kl[f]))))  # fmt: skip
    d = j["drift"]
    return dict(
        summary=dict(prompts=len(ref.prompts), producers=sorted(ref.producers),
                     split=ref.meta.get("split"), estimator=j["estimator"], limit_kl=j["limit"]),
        band=None if j["band"] is None else clean(
            {f: getattr(j["band"], f) for f in Band.__slots__}),
        strata={n: {k: clean(v) for k, v in st.items()} for n, st in j["strata"].items()},
        drift=dict(against=d["against"], threshold=d["threshold"], overall=d["overall"],
                   per_prompt={str(k): v for k, v in d["per_prompt"].items()}),
        flips=flips,
        verdict=dict(code=j["verdict"].code, word=j["verdict"].word, why=j["verdict"].why),
    )  # fmt: skip


def positions_table(ref, j):
    cols = {k: [] for k in ("producer", "prompt", "pos", "step", "kl", "kl_reverse", "flip",
                            "margin", "rank", "overlap", "ref_logprob", "cand_logprob",
                            "argmax_ref", "argmax_cand")}  # fmt: skip
    for name, c in sorted(j["results"].items()):
        step, _ = steps_and_phases(ref, c)
        for k, v in (("producer", np.full(len(c.kl), name, object)), ("prompt", c.prompt),
                     ("pos", c.pos), ("step", step), ("kl", c.kl), ("kl_reverse", c.kl_reverse),
                     ("flip", c.flip), ("margin", c.margin), ("rank", c.rank),
                     ("overlap", c.overlap), ("ref_logprob", c.lp_a), ("cand_logprob", c.lp_b),
                     ("argmax_ref", c.argmax_a), ("argmax_cand", c.argmax_b)):  # fmt: skip
            cols[k].append(v)
    return pa.table({k: pa.array(np.concatenate(v)) for k, v in cols.items()})


def step_bins(n):
    """Log-spaced bins of decode steps 1..n: (first, last) of each."""
    edges = np.unique(np.round(np.logspace(0, math.log10(max(n, 1)) + 1e-9, 40)).astype(int))
    edges = np.r_[edges[edges <= n], n + 1]
    return list(zip(edges[:-1], edges[1:] - 1))


def binned(trace, c, bins):
    step, _ = steps_and_phases(trace, c)
    out = []
    for lo, hi in bins:
        sel = (step >= lo) & (step <= hi)
        out.append((quantile(c.kl[sel], 0.5), quantile(c.kl[sel], 0.99),
                    float(c.flip[sel].mean()) if sel.any() else 0.0))  # fmt: skip
    return np.array(out).reshape(-1, 3)


def plot(path, ref, j, title):
    """KL p50 / p99 and flip rate against decode step (log scale), the band shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = sorted(j["results"])[0]
    c = j["results"][first]
    n = int(ref.decode)
    bins = step_bins(n)
    x = np.array([(lo * hi) ** 0.5 for lo, hi in bins])
    cand = binned(ref, c, bins)
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True, height_ratios=(3, 1.3))
    floor = KL_FLOOR / 10
    if j["band"] is not None:
        pairs = [binned(ref, c, bins) for c in j["between"].values()]  # both directions alike
        top99 = np.maximum(np.max([p[:, 1] for p in pairs], 0), KL_FLOOR)
        ax.fill_between(x, floor, top99, color="tab:green", alpha=0.2,
                        label="reference band (KL p99 between producers)")  # fmt: skip
        ax.axhline(j["band"].kl_p99, color="tab:green", lw=1, ls="--",
                   label=f"band KL p99 {j['band'].kl_p99:.1e}")  # fmt: skip
        bx.fill_between(x, 0, np.max([p[:, 2] for p in pairs], 0), color="tab:green", alpha=0.2)
    else:
        ax.axhline(j["limit"], color="tab:green", lw=1, ls="--", label=f"KL limit {j['limit']:.0e}")
    ax.plot(x, np.maximum(cand[:, 0], floor), "o-", ms=3, label="candidate KL p50")
    ax.plot(x, np.maximum(cand[:, 1], floor), "s-", ms=3, label="candidate KL p99")
    if j["drift"]["overall"] is not None:
        for a in (ax, bx):
            a.axvline(j["drift"]["overall"], color="tab:red", lw=1, ls=":")
        ax.text(j["drift"]["overall"], ax.get_ylim()[1] if False else floor * 2,
                f" left the band at step {j['drift']['overall']}", color="tab:red")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylabel(
        f"KL(reference || candidate), nat\n({j['estimator']} estimator, a lower bound;"
        f" below {floor:.0e} drawn at it)"
    )
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title, fontsize=10)
    bx.plot(x, cand[:, 2], "o-", ms=3, color="tab:purple", label="candidate flip rate")
    bx.set_ylim(0, max(0.01, 1.2 * float(cand[:, 2].max(initial=0.0))))
    bx.set_ylabel("top-1 flip rate")
    bx.set_xlabel("decode step (log scale)")
    bx.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cmd_judge(args):
    if args.candidate:
        ref, ref_parts = stream_trace(args.reference)
    else:  # the candidate runs here on the reference's tokens
        ref = read_trace(args.reference)
    if not ref.producers:
        raise ScoreError(f"{args.reference} has no producer: nothing recorded to judge against")
    if args.candidate:
        cand_trace, cand_parts = stream_trace(args.candidate)
        same_header(ref, cand_trace, args.reference, args.candidate)
        names = sorted(cand_trace.producers)
        new = [n for n in names if n not in ref.producers]  # record --corpus keeps the others
        name = args.producer or next((ns[0] for ns in (names, new) if len(ns) == 1), None)
        if not names:
            raise ScoreError(f"{args.candidate} has no producer: nothing to judge")
        if name is None:
            raise ScoreError(f"{args.candidate} has producers {', '.join(names)}: name one "
                             "with --producer")  # fmt: skip
        if name not in cand_trace.producers:
            raise ScoreError(f"{args.candidate} has no producer {name!r} (it has "
                             f"{', '.join(names)})")  # fmt: skip
        seen = [0]
        batches = lockstep(ref, ahead(ref_parts), ahead(cand_parts), name, args.reference,
                           args.candidate, seen)  # fmt: skip
        j = judge_batches(ref, batches, args.limit_kl)
        label, positions = f"{args.candidate} producer {name}", seen[0]
    else:
        cand, full, _ = candidate_from_model(engine_of(args), ref, args.quiet)
        j = judge(ref, cand, full, args.limit_kl)
        label, positions = f"--model {args.model}", len(cand.pos)
    lines = report_lines(ref, args.reference, label, positions, j)
    if args.out:
        write_atomic(Path(args.out), lambda p: pq.write_table(positions_table(ref, j), p))
    if args.plot:
        title = f"{label} against {args.reference}" + (
            f" · split {ref.meta['split']}" if ref.meta.get("split") else ""
        )
        write_atomic(Path(args.plot), lambda p: plot(p, ref, j, title))
    if args.json:
        print(orjson.dumps(as_json(ref, j), option=orjson.OPT_INDENT_2).decode())
    else:
        print("\n".join(lines[:-1]))
    print(lines[-1])
    return j["verdict"].code


def write_atomic(path, write):
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# ================================================================================================
# The command line.


def shard(text):
    m = re.fullmatch(r"(\d+)/(\d+)", text)
    if not m or not int(m[1]) < int(m[2]):
        raise argparse.ArgumentTypeError("a shard is I/N with 0 <= I < N")
    return int(m[1]), int(m[2])


def engine_flags(p):
    p.add_argument("--model", help="a model directory or Hub id (transformers)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--dtype", default="float32", help="weights and activations (default: float32)")
    p.add_argument("--chunk", type=int, default=512, help="prefill chunk, tokens (default: 512)")
    p.add_argument("--kv-dtype", default="float32", choices=STATE_DTYPES,
                   help="store the KV cache at this precision between steps")  # fmt: skip
    p.add_argument("--state-dtype", default="float32", choices=STATE_DTYPES,
                   help="store the recurrent and convolution states at this precision")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Record a reference trace of a split, judge a candidate."
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="record a reference (or one more producer) as a trace")
    r.add_argument("--rows", help="a build's OUT directory, or hub[:REPO[@REVISION]]")
    r.add_argument("--split", choices=build.SPLIT_NAMES, default="standard")
    r.add_argument("--corpus", type=Path, help="an existing trace: feed its tokens instead")
    r.add_argument("--out", type=Path, required=True, help="the trace to write")
    r.add_argument("--producer", default="reference", help="the producer's name in the file")
    r.add_argument("--replace", action="store_true", help="replace that producer's rows")
    r.add_argument("--top-k", type=int, default=TOP_K, help=f"ids kept per position ({TOP_K})")
    r.add_argument("--seed", type=int, default=0, help="the sampler's seed (default: 0)")
    r.add_argument("--length", type=int, help="continuation length (default: the split's cap)")
    r.add_argument("--sources", type=lambda s: [n for n in s.split(",") if n],
                   help="only rows of these sources: " + ",".join(build.SOURCES))  # fmt: skip
    r.add_argument("--first", type=int, help="only the first N chosen rows")
    r.add_argument("--shard", type=shard, default=(0, 1), help="every N-th row from the I-th: I/N")
    r.add_argument("--context", type=int, help="the context (default: the model's)")
    r.add_argument("--thinking", choices=("on", "off"), default="off",
                   help="the template's enable_thinking (default: off)")  # fmt: skip
    engine_flags(r)
    r.set_defaults(run=cmd_record)
    m = sub.add_parser("merge", help="merge records of disjoint rows into one trace")
    m.add_argument("files", nargs="+", type=Path)
    m.add_argument("--out", type=Path, required=True)
    m.set_defaults(run=cmd_merge)
    j = sub.add_parser("judge", help="judge a candidate against a reference trace")
    j.add_argument("reference", type=Path)
    j.add_argument("--candidate", type=Path, help="a trace holding the candidate's producer")
    j.add_argument("--producer", help="the candidate's producer in that file")
    j.add_argument("--limit-kl", type=float, default=LIMIT_KL,
                   help=f"with one reference producer: the KL limit, nat ({LIMIT_KL})")  # fmt: skip
    j.add_argument("--json", action="store_true", help="print one JSON object, then the verdict")
    j.add_argument("--out", type=Path, help="write every judged position to this parquet file")
    j.add_argument("--plot", type=Path, help="draw KL and flips against decode step (PNG)")
    engine_flags(j)
    j.set_defaults(run=cmd_judge)
    args = p.parse_args(argv)
    if args.command == "record":
        if not (args.rows or args.corpus) or (args.rows and args.corpus):
            p.error("record takes --rows (a split) or --corpus (a trace), one of them")
        if not args.model:
            p.error("record needs --model")
        if args.top_k < 2:
            p.error("--top-k must be at least 2")
        for flag in ("first", "length", "context"):
            if getattr(args, flag) is not None and getattr(args, flag) < 1:
                p.error(f"--{flag} must be at least 1")
        if args.sources is not None:
            unknown = [n for n in args.sources if n not in build.SOURCES]
            if unknown or not args.sources:
                p.error(f"unknown source {unknown[0] if unknown else ''!r}; sources: "
                        + ", ".join(build.SOURCES))  # fmt: skip
    if args.command == "judge" and bool(args.candidate) == bool(args.model):
        p.error("judge takes --candidate (a trace) or --model (run it here), one of them")
    return args


def fail(message, code=1):
    return build.fail(message, code)


def main(argv=None):
    def terminate(signum, frame):
        raise KeyboardInterrupt

    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, terminate)
    args = parse_args(argv)
    try:
        return args.run(args)
    except ScoreError as e:
        return fail(f"error: {e}")
    except KeyboardInterrupt:
        return fail(
            f"error: interrupted; {getattr(args, 'out', None) or 'nothing'} is unchanged"
            + ("; the same command resumes" if args.command == "record" else ""),
            130,
        )


if __name__ == "__main__":
    sys.exit(main())
