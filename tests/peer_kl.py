"""A peer's numbers: llama.cpp's own `llama-perplexity --kl-divergence` beside the project's KL, on
the same model pair, the same tokens and the same positions (docs/scoring.md "A real model").

    python tests/peer_kl.py [--quantized q8_0,q4_0] [--ctx 256] [--chunks 4] [--steps]

On the real model (tests/real_model.py) and the text of the real rows (tests/real: every row's
messages, joined), llama-perplexity of the same llama.cpp build as the project's llama.cpp engine
(tests/setup_engines.sh puts it in .venv/llama-server/):

1. the base, f32.gguf with an f32 KV cache: `--kl-divergence-base BASE -f TEXT -c CTX -b CTX
   --chunks N`. It tokenizes TEXT itself, cuts the tokens into chunks of CTX, feeds each chunk as
   one batch (its first token replaced by BOS where the vocabulary adds one), and keeps, of
   positions CTX/2 .. CTX-2 of each chunk only, every log-probability of the vocabulary in 16 bits
   (`read_base`), with the chunks' tokens;
2. the candidate, a quantized file with llama.cpp's default f16 KV cache: `--kl-divergence-base
   BASE --kl-divergence`, which prints Mean KLD, its percentiles and "Same top p" (`peer_stats`).

The project's side reads the tokens out of BASE, so both sides see the same ids, and computes
the same positions the same way (`prefill`): each chunk one batch (BOS first likewise) through
the project's llama.cpp build (llama-cpp-python, as scoring/engines/llamacpp.py loads it: same
files, same cache types, no flash attention, one thread), every scored position's row kept. Then
scoring/compare.py: its KL with every token kept (the exact KL), its estimator on the top-k tables
a trace keeps (what `score.py judge` reports: a lower bound), and the share of positions whose top
token is the same.

It prints, per quantized file, both sides' mean and median KL and same top token, the judge's
estimator, and how far the project's f32 log-probabilities are from llama-perplexity's stored ones
(the 16-bit storage's step bounds that: the positions are the same). With --steps, also what the
project's engine records on the same positions (prefill to CTX/2, then a decode step a position)
against the prefill's rows of the same file.
"""

import argparse
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pyarrow.parquet as pq

TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(TESTS), str(TESTS.parent)]

PERPLEXITY = TESTS.parent / ".venv" / "llama-server" / "llama-perplexity"
ROWS = TESTS / "real" / "smoke.parquet"
F32_KV = ("-ctk", "f32", "-ctv", "f32")  # the base's cache, as the tests' llama-f32 candidate's
MAGIC = b"_logits_"


@dataclass
class Base:
    """What `--kl-divergence-base` keeps: the chunks' tokens, and the base's log-probabilities of
    the vocabulary at the scored positions (CTX/2 .. CTX-2) of each chunk, as llama-perplexity
    reads them back from 16 bits (scale * u + min, in float32)."""

    n_ctx: int
    tokens: np.ndarray  # int32 [chunks, n_ctx], as the text tokenized (no BOS put in)
    logprob: np.ndarray  # float32 [chunks, n_ctx - 1 - n_ctx // 2, n_vocab]
    step: np.ndarray  # float32 [chunks, positions]: each row's 16-bit step (its scale)

    @property
    def first(self):
        return self.n_ctx // 2


def read_base(path):
    """The file llama-perplexity writes with --kl-divergence-base (tools/perplexity/perplexity.cpp
    of llama.cpp: "_logits_", n_ctx, n_vocab, n_chunk, the tokens, then per scored position the
    row's scale and minimum as two float32 and a uint16 a token, padded to an even count)."""
    raw = Path(path).read_bytes()
    if raw[:8] != MAGIC:
        raise ValueError(f"{path}: not a llama-perplexity base file")
    n_ctx, n_vocab, n_chunk = (int(x) for x in np.frombuffer(raw, "<i4", 3, 8))
    at = 20 + 4 * n_chunk * n_ctx
    tokens = np.frombuffer(raw, "<i4", n_chunk * n_ctx, 20).reshape(n_chunk, n_ctx)
    rows, nv = n_ctx - 1 - n_ctx // 2, 2 * ((n_vocab + 1) // 2) + 4
    u = np.frombuffer(raw, "<u2", n_chunk * rows * nv, at).reshape(n_chunk, rows, nv)
    head = np.ascontiguousarray(u[:, :, :4]).view("<f4")  # [chunks, rows, 2]: scale, minimum
    scale, low = head[..., :1], head[..., 1:]
    logprob = scale * u[:, :, 4 : 4 + n_vocab].astype(np.float32) + low
    return Base(n_ctx, tokens.astype(np.int32), logprob.astype(np.float32), scale[..., 0])


def text_of(rows=ROWS):
    """The real rows' text, plain: every message's content, in order, a blank line between."""
    out = []
    for messages in pq.read_table(rows, columns=["messages"]).column(0).to_pylist():
        out += [m["content"] for m in orjson.loads(messages)]
    return "\n\n".join(out)


def perplexity(*argv, binary=PERPLEXITY):
    """llama-perplexity's output (stdout and stderr), one thread, no flash attention (as the
    project's llama.cpp engine by default)."""
    got = subprocess.run([str(binary), *map(str, argv), "-t", "1", "-tb", "1", "-fa", "off"],
                         capture_output=True, text=True)  # fmt: skip
    if got.returncode:
        raise RuntimeError(f"llama-perplexity {' '.join(map(str, argv))} failed: "
                           f"{got.stderr[-800:]}")  # fmt: skip
    return got.stdout + got.stderr


def peer_stats(out):
    """Mean KLD, Median KLD and Same top p (a fraction) from --kl-divergence's output."""
    found = {}
    for name, pattern in (("mean", r"Mean +KLD: +(\S+)"), ("median", r"Median +KLD: +(\S+)"),
                          ("same_top", r"Same top p: +(\S+)")):  # fmt: skip
        m = re.search(pattern, out)
        if not m:
            raise RuntimeError(f"no {pattern!r} in llama-perplexity's output: {out[-800:]}")
        found[name] = float(m.group(1))
    found["same_top"] /= 100
    return found


def peer(real, kinds, text, ctx, chunks, tmp):
    """llama-perplexity: the f32 base once, then each quantized file against it; (Base, {kind:
    its stats})."""
    base, text_file = Path(tmp) / "base.kld", Path(tmp) / "text.txt"
    text_file.write_text(text, encoding="utf-8")
    perplexity("-m", real.gguf("f32"), *F32_KV, "-f", text_file, "-c", ctx, "-b", ctx,
               "--chunks", chunks, "--kl-divergence-base", base)  # fmt: skip
    stats = {kind: peer_stats(perplexity("-m", real.gguf(kind), "-c", ctx, "-b", ctx,
                                         "--kl-divergence-base", base, "--kl-divergence"))
             for kind in kinds}  # fmt: skip
    return read_base(base), stats


def add_bos(engine):
    """The id llama.cpp puts first in a chunk (BOS where the vocabulary adds one), else None."""
    from scoring.engines.llamacpp import L

    vocab = L.llama_model_get_vocab(engine.model)
    return int(L.llama_vocab_bos(vocab)) if L.llama_vocab_get_add_bos(vocab) else None


def prefill(gguf, base, **settings):
    """The base's chunks through the project's llama.cpp engine as llama-perplexity feeds them:
    each chunk one batch (BOS first where llama.cpp adds one), every scored position's logits
    row kept; the rows as float64 log-probabilities, [chunks * positions, vocabulary]."""
    from scoring.engines import normalised
    from scoring.engines.llamacpp import L, LlamaCpp

    n, first = base.n_ctx, base.first
    e = LlamaCpp(str(gguf), n_threads=1, n_batch=n, **settings)
    e.make_context(n)
    bos, out, batch = add_bos(e), [], L.llama_batch_init(n, 0, 1)
    try:
        for chunk in base.tokens:
            L.llama_memory_clear(e.memory, True)
            for i, t in enumerate(chunk):
                batch.token[i] = bos if i == 0 and bos is not None else int(t)
                batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0] = i, 1, 0
                batch.logits[i] = first <= i < n - 1
            batch.n_tokens = n
            if L.llama_decode(e.ctx, batch):
                raise RuntimeError(f"llama.cpp's decode of a chunk of {n} tokens failed")
            for i in range(first, n - 1):
                row = np.ctypeslib.as_array(L.llama_get_logits_ith(e.ctx, i), shape=(e.n_vocab,))
                out.append(normalised(row).copy())
    finally:
        L.llama_batch_free(batch)
        e.close()
    return np.stack(out)


def table(lp, base, k=None):
    """Full log-probability rows as a producer's top-k Scores (ties to the lower id), at the
    base's positions: prompt = chunk, pos = position in it."""
    from scoring.trace import TOP_K, Scores

    chunks, per = base.tokens.shape[0], base.n_ctx - 1 - base.first
    ids = np.argsort(-lp, 1, kind="stable")[:, : k or TOP_K].astype(np.int32)
    prompt = np.repeat(np.arange(chunks, dtype=np.int32), per)
    pos = np.tile(np.arange(base.first, base.n_ctx - 1, dtype=np.int32), chunks)
    fed = lp[np.arange(len(lp)), base.tokens[prompt, pos + 1]]
    return Scores(prompt, pos, fed, ids, np.take_along_axis(lp, ids, 1))


def project(real, kinds, base):
    """The project's numbers on llama-perplexity's positions: llama.cpp's f32 and each quantized
    file's prefill rows (`prefill`), then scoring/compare.py's KL over the whole vocabulary (its
    `coarse_kl` with every token kept: the exact KL), and its estimator on the top-k tables a
    trace keeps (the judge's: a lower bound), and the share of positions whose top token is the
    same. ({kind: stats}, the f32 rows)."""
    from scoring.compare import coarse_kl, compare

    f32 = prefill(real.gguf("f32"), base, type_k="f32", type_v="f32")
    ref, stats = table(f32, base), {}
    for kind in kinds:
        q = prefill(real.gguf(kind), base)
        kl, _ = coarse_kl(f32, q, np.ones(f32.shape, bool))
        judged = compare(ref, table(q, base), threads=1)
        stats[kind] = dict(mean=float(kl.mean()), median=float(np.median(kl)),
                           estimator=float(judged.kl.mean()),
                           same_top=float(np.mean(f32.argmax(1) == q.argmax(1))),
                           positions=len(kl))  # fmt: skip
    return stats, f32


def stored_gap(f32, base):
    """The largest |project's f32 log-probability - llama-perplexity's stored one| over the
    vocabulary of every scored position, where llama-perplexity stores it in its range (within 16
    nat of the row's top; below, it stores the row's floor), and the largest 16-bit step."""
    stored = base.logprob.reshape(f32.shape)
    inside = f32 > f32.max(1, keepdims=True) - 15.99
    return float(np.abs(stored - f32)[inside].max()), float(base.step.max())


def decode_steps(real, kind, base, rows):
    """What the project's llama.cpp engine records on the same positions (the chunk up to CTX/2
    as a prefill, then a decode step a position) against the prefill's rows of the same file:
    (mean KL by the judge's estimator, flips)."""
    from scoring.compare import compare
    from scoring.engines import Job
    from scoring.engines.llamacpp import LlamaCpp
    from scoring.trace import TOP_K, Schedule, concat_scores

    settings = dict(type_k="f32", type_v="f32") if kind == "f32" else {}
    engine = LlamaCpp(str(real.gguf(kind)), n_threads=1, **settings)
    bos, parts = add_bos(engine), []
    schedule = Schedule(base.first + 1, base.n_ctx - 2 - base.first)  # first .. n_ctx - 2
    try:
        for i, chunk in enumerate(base.tokens):
            chunk = chunk.copy()
            if bos is not None:
                chunk[0] = bos
            for _, s in engine.force([Job(i, chunk, schedule)], TOP_K):
                s.prompt[:] = i
                parts.append(s)
    finally:
        engine.close()
    c = compare(table(rows, base), concat_scores(parts), threads=1)
    return float(c.kl.mean()), int(c.flip.sum())


def main(argv=None):
    import real_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quantized", default="q8_0,q4_0", help="the GGUF files judged against f32")
    p.add_argument("--ctx", type=int, default=256, help="llama-perplexity's -c (default 256)")
    p.add_argument("--chunks", type=int, default=4, help="chunks of --ctx tokens (default 4)")
    p.add_argument("--steps", action="store_true", help="also the project's decode steps on the "
                   "same positions against the prefill's rows, file by file")  # fmt: skip
    a = p.parse_args(argv)
    if not PERPLEXITY.is_file():
        sys.exit(f"error: {PERPLEXITY} not found: bash tests/setup_engines.sh builds it")
    real, kinds = real_model.make(), a.quantized.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        base, theirs = peer(real, kinds, text_of(), a.ctx, a.chunks, tmp)
    ours, f32 = project(real, kinds, base)
    gap, step = stored_gap(f32, base)
    print(f"{base.tokens.shape[0]} chunks of {base.n_ctx} tokens, {len(f32)} positions (the "
          f"second half of each); f32 log-probabilities, the project's against llama-perplexity's "
          f"stored: largest gap {gap:.2e} nat (16-bit step at most {step:.2e})")  # fmt: skip
    print("| file | llama-perplexity: mean KLD | project: mean KL | project: median KL | "
          "llama-perplexity: median | project's top-k estimator (the judge's) | same top: "
          "llama-perplexity | same top: project |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    for kind in kinds:
        t, o = theirs[kind], ours[kind]
        print(f"| {kind} | {t['mean']:.6f} | {o['mean']:.6f} | {o['median']:.6f} | "
              f"{t['median']:.6f} | {o['estimator']:.6f} | {100 * t['same_top']:.3f}% | "
              f"{100 * o['same_top']:.3f}% |")  # fmt: skip
    if a.steps:
        for kind in ["f32", *kinds]:
            rows = f32 if kind == "f32" else prefill(real.gguf(kind), base)
            kl, flips = decode_steps(real, kind, base, rows)
            print(f"{kind}: the project's decode steps against its prefill rows: mean KL "
                  f"{kl:.3g}, {flips} flips of {len(rows)}")  # fmt: skip


if __name__ == "__main__":
    main()
