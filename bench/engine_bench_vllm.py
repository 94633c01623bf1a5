"""Benchmark of recording through vLLM against vLLM's plain decode (docs/performance.md).

    .venv-vllm/bin/python bench/engine_bench_vllm.py [--prompts 8] [--length 256] [--repeat 3]
                                                     [--real DIR]

Builds the miniature sources and the tiny dense Qwen3 (tests/make_sources.py, tests/make_model.py
--dense) in bench-data/engines/, records a transformers float32 reference of the standard split's
first --prompts rows (--length tokens each) with score.py once, then, in this process, on the same
prompts and tokens with vLLM float32 (eager, its engine core in this process):

- plain: vLLM decoding the same number of tokens greedily, no logprobs, no processor;
- candidate: `VLLM.force` (every continuation token forced, top-k read at every position);
- reference: `VLLM.sample` (every token drawn by the project's sampler, top-k read);

at batch 1 and 4 (one thread: below), --repeat runs each taken in turn, printing positions a
second (the best run) and each recording's ratio to plain (the median over repeats of its time
over plain's in the same repeat; goal: at most 1.2); then transformers recording the reference one
prompt at a time on the same model and rows (`Transformers.sample`), and vLLM's batched
reference against it. `vllm_section(args)` is the section a shared engine benchmark calls.
With `--real DIR` (the directory tests/real_model.py prints), the model is the real one (DIR/hf,
float32) and the rows are the first --prompts of tests/real. Each run's CPU time (this process's,
the engine core's included) is printed beside it: on a shared machine the steadier measure.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

# One thread, not bound to a core (set before torch loads): on the 2-core development machine,
# shared with other work, vLLM's threads bound to both cores wait on each other, and a model this
# small gains nothing from a second thread (8 prompts of 256 at batch 4, plain decode: 466
# positions a second bound to both cores, 2,089 on one unbound thread; docs/performance.md).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

DATA = REPO / "bench-data" / "engines"


def made(args):
    """The rows, the model and its transformers float32 reference (made once): the miniature's
    standard split and the tiny dense Qwen3, or with --real DIR the real rows (tests/real, split
    smoke) and DIR/hf."""
    from make_model import make_model
    from make_sources import miniature

    if args.real:
        out, split, model = REPO / "tests" / "real", "smoke", Path(args.real) / "hf"
        if not (model / "config.json").is_file():
            raise SystemExit(f"--real {args.real}: no hf/config.json in it (tests/real_model.py "
                             "prints the directory it makes)")  # fmt: skip
        ref = DATA / f"real-{Path(args.real).name}-{args.prompts}x{args.length}.parquet"
        DATA.mkdir(parents=True, exist_ok=True)
    else:
        out, split, model = miniature(DATA), "standard", DATA / "dense"
        if not (model / "config.json").is_file():
            make_model(model, "qwen3")
        ref = DATA / f"ref-{args.prompts}x{args.length}.parquet"
    if not ref.is_file():
        argv = ["score.py", "record", "--rows", out, "--split", split, "--model", model,
                "--first", args.prompts, "--length", args.length, "--out", ref,
                "--quiet"]  # fmt: skip
        subprocess.run([sys.executable, *map(str, argv)], check=True, cwd=REPO)
    return model, ref


def vllm_section(args):
    """vLLM: plain decode against recording as candidate and as reference, at batch 1 and 4;
    then transformers one prompt at a time against vLLM batched, on the reference."""
    from engine_bench import jobs_of

    from scoring.engines.transformers import Transformers
    from scoring.engines.vllm import VLLM
    from scoring.trace import TOP_K

    model, ref = made(args)
    force, sample = jobs_of(ref)
    positions = sum(j.schedule.steps + 1 for j in force)
    engine = VLLM(model, batch=4, dtype="float32", enforce_eager=True)

    def plain():
        def request(job):
            n = job.schedule.steps + 1
            return [int(t) for t in job.tokens[: job.schedule.ctx]], plain_params(n)

        for _ in engine.requests(force, TOP_K, request):
            pass

    def plain_params(n):
        import vllm
        from vllm.sampling_params import RequestOutputKind

        return vllm.SamplingParams(
            temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )  # fmt: skip

    def candidate():
        for _ in engine.force(force, TOP_K):
            pass

    def reference():
        for _ in engine.sample(sample, TOP_K):
            pass

    what = "the real model" if args.real else "tiny dense Qwen3"
    print(f"vLLM {engine.describe()['vllm']} float32 eager, {what}, {len(force)} "
          f"prompts, {positions} positions, {args.repeat} runs each (pos/s: the best; ratio: "
          "the median of the runs')")  # fmt: skip
    rates = {}
    for batch in (1, 4):
        engine.batch = batch  # the engine holds 4 sequences; the loop keeps `batch` in it
        plain()  # warm
        # interleaved: a machine whose load changes slows the three runs of a repeat alike
        runs = {"plain": plain, "candidate": candidate, "reference": reference}
        took, cpu = {name: [] for name in runs}, {name: [] for name in runs}
        for _ in range(args.repeat):
            for name, run in runs.items():
                t, c = time.perf_counter(), time.process_time()
                run()
                cpu[name].append(time.process_time() - c)
                took[name].append(time.perf_counter() - t)
        base = min(took["plain"])
        line = [f"batch {batch}: plain {positions / base:,.0f} pos/s "
                f"(CPU {1e3 * min(cpu['plain']) / positions:.2f} ms/position)"]  # fmt: skip
        for name in ("candidate", "reference"):
            t = min(took[name])
            rates[name, batch] = positions / t
            # the ratio: the median over repeats of each run's time over plain's in that repeat
            ratio = statistics.median(a / b for a, b in zip(took[name], took["plain"]))
            line.append(f"{name} {positions / t:,.0f} pos/s ({ratio:.2f}x plain; CPU "
                        f"{1e3 * min(cpu[name]) / positions:.2f} ms/position)")  # fmt: skip
        print(" · ".join(line))
    hf = Transformers(model, "cpu", "float32")
    t, c = time.perf_counter(), time.process_time()
    for _ in hf.sample(sample, TOP_K):
        pass
    t, c = time.perf_counter() - t, time.process_time() - c
    fast = rates["reference", 4]
    print(f"reference: transformers one prompt at a time {positions / t:,.0f} pos/s (CPU "
          f"{1e3 * c / positions:.2f} ms/position) · vLLM batch 4 {fast:,.0f} pos/s "
          f"({fast * t / positions:.1f}x transformers)")  # fmt: skip


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--real", metavar="DIR", help="the real model's directory, as "
                   "tests/real_model.py prints it, and the real rows (tests/real)")  # fmt: skip
    vllm_section(p.parse_args())
