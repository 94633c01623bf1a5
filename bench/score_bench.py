"""Benchmark of score.py (docs/performance.md): recording with the tiny model, and judging.

    python bench/score_bench.py record [--length N] [--first N] [--context N]  # miniature standard
    python bench/score_bench.py judge [--prompts 40] [--steps 16384]  # a synthetic full split

record: builds the miniature sources and the tiny model (tests/make_sources.py,
tests/make_model.py) in bench-data/score/, records the standard split with score.py, then runs
the engine's bare prefill and decode forwards on the same tokens in the same process, and prints
the recorder's overhead over those forwards (goal: at most 10%) with its wall time and peak RSS.

judge: writes a reference trace with two producers and a candidate trace of the full split's
shape (40 prompts of the full split's lengths, 16,384 scored positions each, top-20), then
judges them in a fresh process and prints positions per second and that process's peak RSS
(goals: one million positions a second, under 1 GiB)."""

import argparse
import hashlib
import inspect
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import score  # noqa: E402
from scoring.engines.transformers import Transformers  # noqa: E402
from scoring.trace import TOP_K, Prompt, Schedule, Scores, prompt_tables, read_trace, write_trace  # noqa: E402

DATA = REPO / "bench-data" / "score"
# The full split's 40 prompts in tokens, by its slots (README "How rows are chosen"): LongBench-Pro
# 256k rows, MRCR one per slot, SWE-smith's longest, the books' 393k slot, and the short sources.
FULL_PROMPTS = np.array(
    [200_000] * 12 + [221_000, 328_000, 459_000, 590_000, 721_000, 893_000] + [150_000] * 4
    + [340_000] * 2 + [150] * 4 + [500] * 12
)  # fmt: skip


def peak_rss_mib(who=resource.RUSAGE_SELF):
    return resource.getrusage(who).ru_maxrss / 1024


def bench_record(args):
    import torch
    from make_model import make_model
    from make_sources import miniature

    out, model = miniature(DATA), DATA / "model"
    if not (model / "config.json").is_file():
        make_model(model)
    trace = DATA / "ref.parquet"
    extra = [] if args.length is None else ["--length", str(args.length)]
    extra += [] if args.first is None else ["--first", str(args.first)]
    extra += [] if args.context is None else ["--context", str(args.context)]
    Transformers(str(model))  # imports and a first load: the same start for both runs
    t0 = time.perf_counter()
    code = score.main(["record", "--rows", str(out), "--split", "standard", "--model", str(model),
                       "--out", str(trace), "--quiet", *extra])  # fmt: skip
    wall = time.perf_counter() - t0
    assert code == 0
    ref = read_trace(trace)
    t0 = time.perf_counter()
    engine = Transformers(str(model))
    with torch.inference_mode():
        for i, p in enumerate(ref.prompts):
            s = ref.schedule(i)
            engine.prefill(list(map(int, p.tokens[: s.ctx])))
            for t in p.tokens[s.ctx : s.ctx + s.steps]:
                engine.step(int(t))
    bare = time.perf_counter() - t0
    positions = sum(ref.schedule(i).steps + 1 for i in range(len(ref.prompts)))
    print(
        f"score-record: prompts={len(ref.prompts)} positions={positions} wall_s={wall:.1f} "
        f"bare_s={bare:.1f} overhead={wall / bare - 1:.1%} peak_rss_mib={peak_rss_mib():.0f} "
        f"threads={torch.get_num_threads()}"
    )


def synthetic(args):
    """A reference (two producers) and a candidate of the full split's shape."""
    DATA.mkdir(parents=True, exist_ok=True)
    ref_path, cand_path = DATA / "judge-ref.parquet", DATA / "judge-cand.parquet"
    writer = hashlib.sha256(inspect.getsource(write_trace).encode()).hexdigest()[:12]
    key = DATA / f"judge-{args.prompts}-{args.steps}-{writer}.done"  # made again for a new layout
    for old in DATA.glob("judge-*.done"):
        if old != key:
            old.unlink()
    if key.is_file():
        return ref_path, cand_path
    rng = np.random.default_rng(0)
    lengths = np.resize(FULL_PROMPTS, args.prompts) + args.steps
    decode, k, vocab = args.steps - 1, TOP_K, 248_044

    def scores(i, sched, lp0, noise):
        n = sched.steps + 1
        lp = lp0 + rng.normal(0, noise, lp0.shape)
        lp = np.sort(lp, 1)[:, ::-1]
        ids = np.tile(np.arange(k, dtype=np.int32), (n, 1)) + (np.arange(n)[:, None] % 1000) * k
        return Scores(np.full(n, i, np.int32), np.asarray(sched.positions, np.int32),
                            lp[:, 1].copy(), ids.astype(np.int32), lp)  # fmt: skip

    def tables(noises, name_of):
        for i, n in enumerate(lengths):
            tokens = np.random.default_rng(i).integers(0, vocab, n).astype(np.int32)
            sched = Schedule.of(int(n), decode)
            lp0 = np.log(rng.dirichlet(np.full(k + 1, 0.3), sched.steps + 1)[:, :k])
            yield from prompt_tables(i, Prompt(tokens),
                                     {name_of(j): scores(i, sched, lp0, s)
                                      for j, s in enumerate(noises)})  # fmt: skip

    write_trace(ref_path, decode, {}, tables((1e-4, 1e-4), lambda j: f"ref{j}"))
    write_trace(cand_path, decode, {}, tables((1e-3,), lambda j: "candidate"))
    key.touch()
    return ref_path, cand_path


def bench_judge(args):
    ref, cand = synthetic(args)
    code = (
        "import resource, sys, time; sys.path.insert(0, sys.argv[1]); import score; "
        "t = time.perf_counter(); "
        "code = score.main(['judge', sys.argv[2], '--candidate', sys.argv[3]]); "
        "w = time.perf_counter() - t; "
        "print(f'{w} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}', file=sys.stderr)"
    )
    p = subprocess.run([sys.executable, "-c", code, str(REPO), str(ref), str(cand)],
                       capture_output=True, text=True, env=os.environ)  # fmt: skip
    if p.returncode not in (0, 1, 2):
        sys.exit(p.stderr)
    wall, rss = map(float, p.stderr.strip().splitlines()[-1].split())
    positions = args.prompts * args.steps
    print(p.stdout.strip().splitlines()[-1])
    print(
        f"score-judge: positions={positions} wall_s={wall:.2f} "
        f"positions_per_s={positions / wall:,.0f} peak_rss_mib={rss:.0f}"
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("record")
    r.add_argument("--length", type=int)
    r.add_argument("--first", type=int)
    r.add_argument("--context", type=int, help="skip rows longer than this (score.py record)")
    j = sub.add_parser("judge")
    j.add_argument("--prompts", type=int, default=40)
    j.add_argument("--steps", type=int, default=16_384)
    args = p.parse_args()
    (bench_record if args.what == "record" else bench_judge)(args)


if __name__ == "__main__":
    main()
