"""How much of a candidate's KL is an offset of its normaliser (docs/scoring.md "A real model").

    .venv/bin/python bench/normaliser_offset.py REFERENCE CANDIDATE [--producer NAME]

An engine that reports log-probabilities rather than logits normalises each row itself; when it
sums the row's exponentials in float32 (vLLM's raw log-probabilities: a float32 log-softmax), the
sum is off by a few parts in a million, and every log-probability of the row by the same delta.
The judge's estimator (scoring/compare.py `coarse_sums`) gives the kept tokens' missing mass to
the rest bucket, so a row off by delta, where the reference leaves mass r outside the kept tokens,
scores KL = delta^2 (1 - r)^2 / (2 r) to second order: small where r is near 1 (a random model's
flat rows), a hundred times delta^2 where the model is sure of itself (r near 0.01).

This prints, over the positions both traces scored: the judge's KL, |delta| (the candidate's
log-probability of the reference's top token minus the reference's: the top token's logit less the
row's maximum is 0 on both sides when both rank it first, so what is left is the normaliser and
the logit's own difference), r, the prediction, and the prediction over the KL.

The two engines here, for `score.py record --engine bench.normaliser_offset:NAME` from the
repository's root, put the offset in and take it out:

- `Float32LogSoftmax`: transformers in float32 whose rows are a float32 log-softmax, reported as
  they are (`top` does not normalise them again, as scoring.engines.top_k would).
- `VLLMFloat64LogSoftmax` (in vLLM's environment): vLLM with its raw log-probabilities taken in
  float64 (vLLM's Sampler.compute_logprobs made a float64 log-softmax, stored back in float32), so
  what is left is its kernels' own difference.
"""

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from scoring.compare import measure  # noqa: E402
from scoring.engines.transformers import Transformers  # noqa: E402
from scoring.trace import read_trace  # noqa: E402


def offsets(ref, cand):
    """Per position: the judge's KL, delta, the reference's rest mass r and the prediction
    delta^2 (1 - r)^2 / (2 r), of two producers' Scores over the same positions."""
    kl = measure(ref.ids, ref.logprob, cand.ids, cand.logprob)[0]
    a, b = ref.logprob.astype(np.float64), cand.logprob.astype(np.float64)
    top = cand.ids == ref.ids[:, :1]
    delta = np.where(top.any(1), b[np.arange(len(b)), top.argmax(1)] - a[:, 0], np.nan)
    rest = np.maximum(1.0 - np.exp(a).sum(1), 1e-12)
    return kl, delta, rest, delta**2 * (1 - rest) ** 2 / (2 * rest)


class Float32LogSoftmax(Transformers):
    """transformers float32, each row a float32 log-softmax reported as it is."""

    def forward(self, ids):
        return self.torch.log_softmax(super().forward(ids), -1, dtype=self.torch.float32)

    def top(self, row, k, next_id=None):
        x = row.numpy()
        ids = np.argsort(-x, kind="stable")[:k].astype(np.int32)
        fed = float(x[next_id]) if next_id is not None else float("nan")
        return ids, x[ids].astype(np.float64), fed

    def describe(self):
        return dict(super().describe(), log_softmax="float32, not normalised again")


def _float64_log_softmax(logits):
    return logits.double().log_softmax(dim=-1).float()


if importlib.util.find_spec("vllm") is not None:  # in vLLM's environment only
    from scoring.engines.vllm import VLLM

    class VLLMFloat64LogSoftmax(VLLM):
        """scoring.engines.vllm.VLLM with vLLM's raw log-probabilities taken in float64 (its
        engine core runs in this process, so the sampler changed here is the one it uses)."""

        def __init__(self, model, **options):
            from vllm.v1.sample.sampler import Sampler

            Sampler.compute_logprobs = staticmethod(_float64_log_softmax)
            super().__init__(model, **options)

        def describe(self):
            return dict(super().describe(), log_softmax="float64")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[2])  # fmt: skip
    p.add_argument("reference", help="the reference trace")
    p.add_argument("candidate", help="a trace holding the candidate's producer")
    p.add_argument("--producer", help="the candidate's producer (default: the candidate file's "
                   "only producer the reference does not hold)")  # fmt: skip
    p.add_argument("--against", default="reference", help="the reference's producer (reference)")
    args = p.parse_args(argv)
    ref, cand = read_trace(args.reference).producers, read_trace(args.candidate).producers
    name = args.producer or next(iter(set(cand) - set(ref)), None)
    if name not in cand or args.against not in ref:
        p.error(f"no producer {name if name not in cand else args.against} to compare")
    a, b = ref[args.against], cand[name]
    if not (np.array_equal(a.prompt, b.prompt) and np.array_equal(a.pos, b.pos)):
        p.error("the two producers scored different positions")
    kl, delta, rest, pred = offsets(a, b)

    def q(x):
        p50, p99 = np.nanquantile(x, [0.5, 0.99])
        return f"p50 {p50:.2g}  p99 {p99:.2g}"

    print(f"{name} against {args.against}, {len(kl)} positions")
    print(f"  KL                         {q(kl)}")
    print(f"  |delta|                    {q(np.abs(delta))}")
    print(f"  rest mass r                {q(rest)}")
    print(f"  delta^2 (1-r)^2 / (2r)     {q(pred)}")
    print(f"  prediction / KL            {q(pred / np.maximum(kl, 1e-300))}")


if __name__ == "__main__":
    main()
