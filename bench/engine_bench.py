"""Benchmark of each engine's recording against its own plain decode (docs/performance.md).

    python bench/engine_bench.py [--engines transformers,llama.cpp] [--prompts 3] [--ctx 64]
                                 [--length 128] [--threads N] [--repeat 3] [--real]

For each engine, on a tiny model of Qwen's 248,320-token vocabulary made here (transformers and
MLX: the dense Qwen3 of tests/make_model.py, float32; llama.cpp: tests/make_gguf.py's f32 GGUF
with an f32 KV cache; all need ../shared/tokenizers/qwen3.5-text.json, and llama.cpp the source
package of tests/make_gguf.py), in one process and on the same tokens:

- reference: `Engine.sample` of `--prompts` prompts of `--ctx` random ids, `--length` tokens each
  (what `record --rows` runs);
- plain: the same engine's prefill and decode steps of the tokens the reference drew, its logits
  rows left unread (the engine alone, no scoring); for MLX, mlx-lm's own forward on its prompt
  cache, each step's logits row evaluated (MLX computes lazily) and left in MLX;
- candidate: `Engine.force` of those tokens (what `record --corpus` runs).

With `--real`, the model is the real one, SmolLM2-135M-Instruct (tests/real_model.py makes it
once into the cache: transformers and MLX float32 `hf/`, llama.cpp's `f32.gguf` with an f32 KV
cache and `q8_0.gguf` with its default f16 one), and the prompts are the first `--prompts` rows
of tests/real (`--ctx` unused), recorded once by `score.py record --rows` (transformers float32,
`--length` tokens each) into bench-data/engine/: each engine's reference draws from that
record's uniforms, and its positions are the record's (each row's prefill counted in its
positions' time, as record runs it).

Each is run `--repeat` times, interleaved, and the fastest run is kept, in wall time and in this
process's CPU time (on a machine other processes share, the CPU time is the steadier measure:
with one thread, `--threads 1`, every engine here computes on the calling thread). It prints
positions a second (the fastest run) and the ratio to plain per engine, both ways (the median of
each repeat's ratio: the runs of a repeat share the machine's speed of the moment); the goal is
1.2x at most. An engine is one function taking the arguments and returning its Result rows: SECTIONS
names them (vLLM's section goes there, in a function of its own)."""

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from scoring.engines import Job, uniforms  # noqa: E402
from scoring.trace import TOP_K, Schedule  # noqa: E402

DATA = REPO / "bench-data" / "engine"
REAL_ROWS = REPO / "tests" / "real"  # the real rows (tests/real_rows.py), split smoke
QWEN_TOKENIZER = REPO.parent / "shared" / "tokenizers" / "qwen3.5-text.json"
VOCAB = 248_320  # the tiny models' embedding rows (Qwen's vocabulary)


@dataclass
class Result:
    engine: str
    run: str  # plain, reference or candidate
    positions: int
    seconds: float  # wall time, the fastest run
    cpu: float  # this process's CPU time, the fastest run
    ratio: float  # wall time over plain's, the median over repeats
    cpu_ratio: float


def reference_jobs(args, never):
    """The prompts: `--ctx` random ids each (the same for every engine), to be continued by
    `--length` sampled tokens."""
    rng = np.random.default_rng(0)
    return [Job(i, rng.integers(1000, 100_000, args.ctx).astype(np.int32),
                Schedule.of(args.ctx + args.length, args.length - 1),
                uniforms(0, f"bench-{i}", args.length), tuple(never))
            for i in range(args.prompts)]  # fmt: skip


def jobs_of(ref):
    """A reference's prompts as record's jobs: to force (all tokens) and to sample (the prompt,
    the uniforms and stop ids record drew them with)."""
    from scoring.trace import read_trace

    trace = read_trace(ref)
    meta = trace.meta
    never = tuple(meta["sampler"]["never"])
    force, sample = [], []
    for i, p in enumerate(trace.prompts):
        s = trace.schedule(i)
        force.append(Job(i, p.tokens, s))
        u = uniforms(meta["seed"], p.source, s.steps + 1)
        sample.append(Job(i, p.tokens[: s.ctx], s, u, never))
    return force, sample


def real_reference(args):
    """The real rows recorded once by score.py: transformers float32 on the real model."""
    ref = DATA / f"real-{args.real.root.name}-{args.prompts}x{args.length}.parquet"
    if not ref.is_file():
        argv = ["score.py", "record", "--rows", REAL_ROWS, "--split", "smoke", "--model",
                args.real.hf, "--first", args.prompts, "--length", args.length, "--out", ref,
                "--quiet"]  # fmt: skip
        subprocess.run([sys.executable, *map(str, argv)], check=True, cwd=REPO)
    return ref


def stepwise(name, engine, args, never, plain_prompt=None):
    """The three runs of an engine driven one forward at a time (scoring.engines.Stepwise);
    `plain_prompt(tokens, schedule)` is the engine's own decode of one prompt where it is not
    the engine's prefill and steps."""
    jobs = jobs_of(real_reference(args))[1] if args.real else reference_jobs(args, never)
    drawn = {i: t for i, t, _ in engine.sample(jobs, TOP_K)}  # a first run: warm, and the tokens
    forced = [Job(j.index, drawn[j.index], j.schedule) for j in jobs]
    positions = sum(j.schedule.steps + 1 for j in jobs)

    def plain():
        for j in forced:
            s = j.schedule
            if plain_prompt is not None:
                plain_prompt(list(map(int, j.tokens[: s.ctx + s.steps])), s)
                continue
            engine.prefill(list(map(int, j.tokens[: s.ctx])))
            for t in j.tokens[s.ctx : s.ctx + s.steps]:
                engine.step(int(t))

    def reference():
        for i, t, _ in engine.sample(jobs, TOP_K):
            assert np.array_equal(t, drawn[i])  # the same draws every run

    def candidate():
        for _ in engine.force(forced, TOP_K):
            pass

    runs = {"plain": plain, "reference": reference, "candidate": candidate}
    wall, cpu = {run: [] for run in runs}, {run: [] for run in runs}
    for _ in range(args.repeat):
        for run, f in runs.items():
            t0, c0 = time.perf_counter(), time.process_time()
            f()
            cpu[run].append(time.process_time() - c0)
            wall[run].append(time.perf_counter() - t0)
    # A run's ratio is the median over repeats of its time over plain's in the same repeat: the
    # three run back to back, so a slower spell of a shared machine slows all three alike.
    return [Result(name, run, positions, min(wall[run]), min(cpu[run]),
                   float(np.median(np.divide(wall[run], wall["plain"]))),
                   float(np.median(np.divide(cpu[run], cpu["plain"]))))
            for run in runs]  # fmt: skip


def dense():
    """The dense Qwen3 of tests/make_model.py, float32, made once."""
    from make_model import make_model

    model = DATA / "qwen3-dense"
    if not (model / "config.json").is_file():
        make_model(model, "qwen3", QWEN_TOKENIZER)
    return model


def transformers_section(args):
    import torch

    from scoring.engines.transformers import Transformers

    torch.set_num_threads(args.threads)
    engine = Transformers(str(args.real.hf if args.real else dense()))
    with torch.inference_mode():
        return stepwise("transformers", engine, args, never=(engine.vocab_size() - 1,))


def llamacpp_section(args):
    from make_gguf import SDIST, make_gguf

    from scoring.engines.llamacpp import LlamaCpp

    f32 = dict(type_k="f32", type_v="f32")
    if args.real:  # f32 with an f32 KV cache, q8_0 with llama.cpp's default f16 one
        files = {"llama.cpp f32": (args.real.gguf("f32"), f32),
                 "llama.cpp q8_0": (args.real.gguf("q8_0"), {})}  # fmt: skip
    else:
        gguf = DATA / "gguf" / "tiny-f32.gguf"
        if not gguf.is_file():
            make_gguf(DATA / "gguf", QWEN_TOKENIZER, SDIST, ("f32",))
        files = {"llama.cpp": (gguf, f32)}
    out = []
    for name, (gguf, cache) in files.items():
        engine = LlamaCpp(str(gguf), n_threads=args.threads, **cache)
        out += stepwise(name, engine, args, never=(engine.vocab_size() - 1,))
        engine.close()
    return out


def mlx_section(args):
    """MLX on its CPU backend (`--threads` is not MLX's to set: its CPU kernels run on the calling
    thread here)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from scoring.engines.mlx import MLX

    engine = MLX(str(args.real.hf if args.real else dense()))

    def own(tokens, s):
        """mlx-lm's decode of one prompt: the prompt as its generation feeds it, then one token a
        forward, each logits row evaluated."""
        model, cache, step = engine.model, make_prompt_cache(engine.model), engine.step_size
        for at in range(0, s.ctx - 1, step):
            model(mx.array(tokens[at : min(at + step, s.ctx - 1)])[None], cache=cache)
            mx.eval([c.state for c in cache])
        for t in tokens[s.ctx - 1 :]:
            mx.eval(model(mx.array([[t]]), cache=cache)[0, -1])

    return stepwise("mlx", engine, args, never=(engine.vocab_size() - 1,), plain_prompt=own)


# An engine's section: a function of the arguments returning its Result rows (plain, reference,
# candidate). vLLM's is added here in a function of its own.
SECTIONS = {"transformers": transformers_section, "llama.cpp": llamacpp_section,
            "mlx": mlx_section}  # fmt: skip


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default=",".join(SECTIONS))
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--real", action="store_true", help="the real model and rows (tests/real)")
    args = ap.parse_args(argv)
    if args.real:
        import real_model

        args.real = real_model.make(say=lambda text: print(text, file=sys.stderr, flush=True))
    elif not QWEN_TOKENIZER.is_file():
        raise SystemExit(f"{QWEN_TOKENIZER} not found: the tiny models use Qwen's vocabulary")
    DATA.mkdir(parents=True, exist_ok=True)
    model = f"real model {args.real.root.name}, rows of tests/real" if args.real else "tiny models"
    print(f"engine-bench: {model}, prompts={args.prompts} ctx={args.ctx} length={args.length} "
          f"threads={args.threads} repeat={args.repeat} (speed: the fastest run; ratio to "
          "plain: the median of the repeats' ratios)")  # fmt: skip
    for name in args.engines.split(","):
        for r in SECTIONS[name](args):
            print(f"{r.engine:14} {r.run:9} {r.positions / r.seconds:7.1f} positions/s "
                  f"{1e3 * r.seconds / r.positions:6.2f} ms/position (CPU "
                  f"{1e3 * r.cpu / r.positions:6.2f})  {r.ratio:5.2f}x plain "
                  f"(CPU {r.cpu_ratio:5.2f}x)")  # fmt: skip
        sys.stdout.flush()


if __name__ == "__main__":
    main()
