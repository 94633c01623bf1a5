#!/usr/bin/env python3
"""Score an engine on the kern-prompts splits: record a reference, judge a candidate.

    python score.py record --rows OUT [--split standard] --model PATH --out ref.parquet
    python score.py record --corpus ref.parquet --model PATH --producer NAME --out ref.parquet
    python score.py merge a.parquet b.parquet --out ref.parquet
    python score.py judge ref.parquet --candidate cand.parquet | --model PATH [--plot F.png]

(`score.py COMMAND --help` lists every flag; docs/scoring.md's synopsis is tested against them.)

The other half of the card (docs/scoring.md): a reference samples a continuation of each row and
records its next-token distribution at every step; a candidate is fed the same tokens, prefill
then decode one token at a time, and is judged position by position. The work is done by the
package `scoring` beside this file (scoring/__init__.py maps it); this is its command line.
"""

import argparse
import contextlib
import math
import os
import re
import signal
import sys
import tempfile
import warnings
from pathlib import Path

import orjson

from scoring import builder as build
from scoring import trace
from scoring.compare import KL_FLOOR, LIMIT_KL
from scoring.engines import ENGINES, missing_package
from scoring.engines.keys import unkeyed
from scoring.engines.transformers import STATE_DTYPES
from scoring.judge import cmd_judge
from scoring.paths import check_paths
from scoring.record import cmd_merge, cmd_record
from scoring.trace import TOP_K, ScoreError

# ================================================================================================
# The command line.


def shard(text):
    m = re.fullmatch(r"(\d+)/(\d+)", text)
    if not m or not int(m[1]) < int(m[2]):
        raise argparse.ArgumentTypeError("a shard is I/N with 0 <= I < N")
    return int(m[1]), int(m[2])


def nats(word):
    """--limit-kl, --kl-floor: a number of nats, 0 < value < inf (nan, inf, 0 and below judge
    nothing)."""

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not 0 < value < math.inf:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a KL {word}: a number of nats, 0 < {word} < inf"
            )
        return value

    return parse


def option(text):
    """--set KEY=VALUE: VALUE as JSON where it is JSON (numbers, true, false, null), else text."""
    key, eq, value = text.partition("=")
    if not eq or not key.isidentifier():
        raise argparse.ArgumentTypeError("an option is KEY=VALUE, KEY a Python name")
    try:
        return key, orjson.loads(value)
    except orjson.JSONDecodeError:
        return key, value


def engine_flags(p):
    """The engine flags; each engine takes its own (Engine.FLAGS) and refuses the others, so
    none has a default here: an engine's defaults are its own."""
    p.add_argument("--engine", default="transformers",
                   help=f"{', '.join(ENGINES)}, or module:Class of your own (default: "
                   "transformers)")  # fmt: skip
    p.add_argument("--model", help="a model directory, Hub id, GGUF file or server URL")
    p.add_argument("--set", type=option, action="append", metavar="KEY=VALUE",
                   help="an engine option, passed to the engine as it is (repeatable)")  # fmt: skip
    p.add_argument("--batch", type=int,
                   help="vllm: prompts run together, its max_num_seqs; openai: prompts in "
                   "flight (default: 1)")  # fmt: skip
    p.add_argument("--device", help="transformers: torch device (default: cpu); mlx: cpu or gpu "
                   "(default: MLX's)")  # fmt: skip
    p.add_argument("--dtype",
                   help="transformers, vllm: weights and activations (default: float32; vllm: "
                   "the model's)")  # fmt: skip
    p.add_argument("--chunk", type=int,
                   help="transformers: prefill chunk, tokens (default: 512)")  # fmt: skip
    p.add_argument("--kv-dtype", choices=STATE_DTYPES,
                   help="transformers: store the KV cache at this precision between steps "
                   "(default: float32)")  # fmt: skip
    p.add_argument("--state-dtype", choices=STATE_DTYPES,
                   help="transformers: store the recurrent and convolution states at this "
                   "precision (default: float32)")  # fmt: skip
    p.add_argument("--quiet", action="store_true",
                   help="nothing on stderr but errors: no progress bars, no engine's notes")  # fmt: skip


# record's flags that choose and sample rows (--rows), with their defaults
ROW_FLAGS = dict(split="standard", seed=0, length=None, sources=None, first=None, shard=(0, 1),
                 context=None, thinking="off", tokenizer=None)  # fmt: skip


def parser():
    """The command line: the parser and its subcommands' own, by name."""
    p = argparse.ArgumentParser(  # prog: the name the docs and messages use, however it is run
        prog="score.py", description="Record a reference trace of a split, judge a candidate."
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="record a reference (or one more producer) as a trace")
    r.add_argument("--rows", help="a build's OUT directory, or hub[:REPO[@REVISION]]")
    r.add_argument("--split", choices=build.SPLIT_NAMES, help="with --rows (default: standard)")
    r.add_argument("--corpus", type=Path, help="an existing trace: feed its tokens instead")
    r.add_argument("--out", type=Path, required=True, help="the trace to write")
    r.add_argument("--producer",
                   help="the producer's name in the file (with --rows: default reference; "
                   "--corpus needs one, a name the corpus does not hold)")  # fmt: skip
    r.add_argument("--replace", action="store_true",
                   help="replace that producer's rows, or an --out that exists and is not the "
                   "--corpus")  # fmt: skip
    r.add_argument("--top-k", type=int, default=TOP_K, help=f"ids kept per position ({TOP_K})")
    r.add_argument("--seed", type=int, help="the sampler's seed (default: 0)")
    r.add_argument("--length", type=int, help="continuation length (default: the split's cap)")
    r.add_argument("--sources", type=lambda s: [n for n in s.split(",") if n],
                   help="only rows of these sources: " + ",".join(build.SOURCES))  # fmt: skip
    r.add_argument("--first", type=int, help="only the first N chosen rows")
    r.add_argument("--shard", type=shard, help="every N-th row from the I-th: I/N (default: 0/1)")
    r.add_argument("--context", type=int, help="the context (default: the model's)")
    r.add_argument("--tokenizer",
                   help="with --rows: the tokenizer and chat template rows are rendered with, a "
                   "directory or Hub id (default: --model's; a GGUF --model needs it)")  # fmt: skip
    r.add_argument("--thinking", choices=("on", "off"),
                   help="the template's enable_thinking (default: off)")  # fmt: skip
    engine_flags(r)
    r.set_defaults(run=cmd_record)
    m = sub.add_parser("merge", help="merge records of disjoint rows into one trace")
    m.add_argument("files", nargs="+", type=Path,
                   help="traces record wrote: the shards of one run, or records of disjoint rows")  # fmt: skip
    m.add_argument("--out", type=Path, required=True, help="the merged trace to write")
    m.set_defaults(run=cmd_merge)
    j = sub.add_parser("judge", help="judge a candidate against a reference trace")
    j.add_argument("reference", type=Path, help="the reference trace (one or more producers)")
    j.add_argument("--candidate", type=Path, help="a trace holding the candidate's producer")
    j.add_argument("--producer", help="the candidate's producer in that file")
    j.add_argument("--limit-kl", type=nats("limit"), default=LIMIT_KL,
                   help=f"with one reference producer: the KL limit, nat ({LIMIT_KL})")  # fmt: skip
    j.add_argument("--kl-floor", type=nats("floor"), default=KL_FLOOR,
                   help=f"the least the band's KL p50 and p99 are, nat ({KL_FLOOR:.0e}, kern's); "
                   "lower to judge a float32 engine exactly")  # fmt: skip
    j.add_argument("--json", action="store_true", help="print one JSON object, then the verdict")
    j.add_argument("--out", type=Path, help="write every judged position to this parquet file")
    j.add_argument("--plot", type=Path,
                   help="draw KL and flips against decode step, in any format matplotlib writes "
                   "(by the extension: .png, .pdf, .svg, ...; none: PNG)")  # fmt: skip
    engine_flags(j)
    j.set_defaults(run=cmd_judge)
    return p, {"record": r, "merge": m, "judge": j}


def parse_args(argv):
    p, sub = parser()
    r, j = sub["record"], sub["judge"]
    args = p.parse_args(argv)
    if args.command == "record":  # a mistake shows record's own usage, not the command's
        if not (args.rows or args.corpus) or (args.rows and args.corpus):
            r.error("record takes --rows (a split) or --corpus (a trace), one of them")
        if not args.model:
            r.error("record needs --model")
        if args.top_k < 2:
            r.error("--top-k must be at least 2")
        for flag in ("first", "length", "context"):
            if getattr(args, flag) is not None and getattr(args, flag) < 1:
                r.error(f"--{flag} must be at least 1")
        given = [f for f in ROW_FLAGS if getattr(args, f) is not None]
        if args.corpus and given:  # they choose and sample rows: a corpus has its tokens already
            r.error(
                f"--{given[0]} chooses rows (--rows); --corpus feeds the trace's tokens as they are"
            )
        if args.corpus and args.producer is None:
            r.error("record --corpus needs --producer NAME, the new producer's name in the file")
        args.producer = args.producer or "reference"
        for f, default in ROW_FLAGS.items():
            if getattr(args, f) is None:
                setattr(args, f, default)
        if args.sources is not None:
            unknown = [n for n in args.sources if n not in build.SOURCES]
            if unknown or not args.sources:
                r.error(f"unknown source {unknown[0] if unknown else ''!r}; sources: "
                        + ", ".join(build.SOURCES))  # fmt: skip
    if args.command == "judge" and bool(args.candidate) == bool(args.model):
        j.error("judge takes --candidate (a trace) or --model (run it here), one of them")
    return args


@contextlib.contextmanager
def quieted():
    """--quiet: stderr holds this command's own lines alone (an error, what was written). An
    engine's notes, warnings and loading bars, from Python or from its C++ and its worker
    processes, go to a file that is dropped, unless something fails that is not a user's
    mistake: then they are shown."""
    warnings.simplefilter("ignore")
    sys.stderr.flush()
    saved, stream = os.dup(2), sys.stderr
    with tempfile.TemporaryFile() as notes:
        os.dup2(notes.fileno(), 2)
        sys.stderr = open(os.dup(notes.fileno()), "w", buffering=1)  # also where it is not fd 2
        trace.NOTES = stream  # this tool's own lines (what was written) stay
        try:
            yield
        except (ScoreError, KeyboardInterrupt):
            raise
        except BaseException:
            sys.stderr.flush()
            notes.seek(0)
            os.write(saved, notes.read())
            raise
        finally:
            trace.NOTES = None
            sys.stderr.close()
            sys.stderr = stream
            os.dup2(saved, 2)
            os.close(saved)


def fail(message, code=1):
    return build.fail(message, code)


STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def main(argv=None):
    stopped = []

    def terminate(signum, frame):
        # The first signal ends the command; the ones after it are let pass while it ends, so
        # that a second Ctrl-C cannot cut the ending short (the staging kept, the one line). The
        # handler stays a Python one: a signal ignored at the OS level as it arrives is a race
        # that Python reports in a line of its own.
        if not stopped:
            stopped.append(signum)
            raise KeyboardInterrupt

    args = parse_args(argv)
    saved = {s: signal.signal(s, terminate) for s in STOPPING}
    try:
        with quieted() if getattr(args, "quiet", False) else contextlib.nullcontext():
            check_paths(args)  # before any work: nothing of the user's is overwritten or lost
            try:
                return args.run(args)
            except ModuleNotFoundError as e:  # an extra not installed: one line naming it
                raise missing_package(e) or e from None
    except ScoreError as e:  # a served engine's key, in any form, is in no line (keys.py)
        return fail(f"error: {unkeyed(str(e))}")
    except KeyboardInterrupt:
        return fail(
            f"error: interrupted; {getattr(args, 'out', None) or 'nothing'} is unchanged"
            + ("; the same command resumes" if args.command == "record" else ""),
            130,
        )
    finally:
        # After a signal the process ends: the ones still to come are ignored, since Python sets
        # its own handlers back to the default ones as it exits, where one would kill it.
        for s, handler in saved.items():
            signal.signal(s, signal.SIG_IGN if stopped else handler)


if __name__ == "__main__":
    sys.exit(main())
