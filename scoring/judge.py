"""The judge command: a reference and a candidate read together prompt by prompt (or the
candidate run here on the reference's tokens), judged (compare.py), reported (report.py), and the
outputs written (docs/scoring.md "Judging a candidate")."""

import os
from itertools import zip_longest
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from scoring.compare import BATCH_ROWS, batch, judge, judge_batches
from scoring.record import candidate, resolve
from scoring.report import as_json, plot, positions_table, report_lines
from scoring.trace import (
    ScoreError,
    ahead,
    empty_scores,
    into_place,
    read_trace,
    stream_trace,
    temporary,
)


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


def same_rows(i, a, b, ref_path, cand_path):
    """Refuse a producer name that means different rows in the two files (prompt i's rows of
    each): `record --corpus` copies a file's producers as they are, so the same name is the same
    rows, or one of the files is not what it claims."""
    for name in sorted(a.keys() & b.keys()):
        x, y = a[name], b[name]
        at = diff_at(x, y)
        if at is not None:
            raise ScoreError(
                f"producer {name!r} means different rows in {ref_path} and {cand_path} (prompt "
                f"{i} position {at}): rename one with record --producer, or judge against a "
                "file without it"
            )


def diff_at(x, y):
    """The first position where two producers' rows of one prompt differ (None: the same rows,
    bit for bit)."""
    if not np.array_equal(x.pos, y.pos):
        n = min(len(x.pos), len(y.pos))
        d = np.flatnonzero(x.pos[:n] != y.pos[:n])
        return int(x.pos[d[0]] if len(d) else (x.pos if len(x.pos) > n else y.pos)[n])
    if len(x.pos) == 0:
        return None
    if x.ids.shape != y.ids.shape:
        return int(x.pos[0])

    def bits(v):
        return np.ascontiguousarray(v, np.float32).view(np.uint32).reshape(len(v), -1)

    d = (x.ids != y.ids).any(1) | (bits(x.logprob) != bits(y.logprob)).any(1)
    d |= (bits(x.ref_logprob) != bits(y.ref_logprob)).any(1)
    return int(x.pos[np.flatnonzero(d)[0]]) if d.any() else None


def lockstep(ref, ref_parts, cand_parts, name, ref_path, cand_path, seen):
    """Batches of whole prompts read from both files together, the corpora compared prompt by
    prompt as they come, and the producers both files hold compared row for row; the
    reference's prompts are added to `ref`, and the candidate's positions counted in `seen`.
    The candidate's producer is never a reference producer, also where the reference file holds
    it too."""
    names = [n for n in ref.producers if n != name]
    parts, size, count = [], 0, [0, 0]
    for r, c in zip_longest(ref_parts, cand_parts):
        count[0] += r is not None
        count[1] += c is not None
        if r is None or c is None:
            continue  # count the rest of the longer file
        i = len(ref.prompts)
        same_prompt(i, r[0].tokens, c[0].tokens, ref_path, cand_path)
        same_rows(i, r[1], c[1], ref_path, cand_path)
        ref.prompts.append(r[0])
        cand = c[1].get(name, empty_scores())
        seen[0] += len(cand.pos)
        parts.append((r[1], cand))
        size += len(cand.pos)
        if size >= BATCH_ROWS:
            yield batch(names, parts)
            parts, size = [], 0
    if count[0] != count[1]:
        raise ScoreError(f"{cand_path} has {count[1]} prompts, {ref_path} has {count[0]}")
    if parts:
        yield batch(names, parts)


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
        if set(ref.producers) == {name}:
            raise ScoreError(f"{args.reference} has no producer but the candidate's ({name!r}): "
                             "nothing recorded to judge against")  # fmt: skip
        seen = [0]
        batches = lockstep(ref, ahead(ref_parts), ahead(cand_parts), name, args.reference,
                           args.candidate, seen)  # fmt: skip
        j = judge_batches(ref, batches, args.limit_kl, candidate=name, floor=args.kl_floor)
        label, positions = f"{args.candidate} producer {name}", seen[0]
    else:
        run = resolve(args, ref)
        cand, full, _ = candidate(run)
        j = judge(ref, cand, full, args.limit_kl, floor=args.kl_floor)
        label, positions = f"--model {run.model}", len(cand.pos)
    lines = report_lines(ref, args.reference, label, positions, j)
    outputs = []
    if args.out:
        outputs.append(("--out", Path(args.out),
                        lambda p: pq.write_table(positions_table(ref, j), p)))  # fmt: skip
    if args.plot:
        title = f"{label} against {args.reference}" + (
            f" · split {ref.meta['split']}" if ref.meta.get("split") else ""
        )
        outputs.append(("--plot", Path(args.plot), lambda p: plot(p, ref, j, title)))
    write_outputs(outputs)
    if args.json:
        print(orjson.dumps(as_json(ref, j), option=orjson.OPT_INDENT_2).decode())
    else:
        print("\n".join(lines[:-1]))
    print(lines[-1])
    return j["verdict"].code


def write_outputs(outputs):
    """Each output, (flag, path, write), rendered to a temporary beside its path first; only
    when all of them are is each moved into place. A failure while rendering leaves none
    written; one while moving (the file system failing between two renames) says which are."""
    temps = []
    try:
        for flag, path, write in outputs:
            try:
                temps.append(temporary(path, path.suffix))
                write(temps[-1])
            except (OSError, ValueError, RuntimeError, pa.ArrowException) as e:
                raise ScoreError(
                    f"{flag} {path}: cannot write it ({e}); nothing was written"
                ) from None
        done = []
        for (flag, path, _), tmp in zip(outputs, temps):
            try:
                into_place(tmp, path)
            except OSError as e:
                raise ScoreError(
                    f"{flag} {path}: cannot move it into place ({e.strerror or e}); "
                    + (f"written: {', '.join(done)}" if done else "nothing was written")
                ) from None
            done.append(f"{flag} {path}")
    finally:
        for tmp in temps:
            if os.path.exists(tmp):
                os.unlink(tmp)
