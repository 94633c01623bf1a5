"""An engine from outside the package, as a user writes one (docs/DESIGN.md "Adding an engine"):
`--engine plugin_engine:FullForward` with tests/ on the Python path.

It scores each prompt with one forward over all its tokens, without a cache: a real engine, whose
numbers are transformers' own, that takes whole prompts at once as vLLM does (`Engine.force`),
where the package's transformers engine prefills and then steps through its cache."""

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from scoring.engines import Engine, top_k
from scoring.trace import Scores


class FullForward(Engine):
    def __init__(self, model, dtype="float32"):
        self.dtype = dtype
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype))

    def describe(self):
        return dict(engine="full-forward", dtype=self.dtype)

    def vocab_size(self):
        return self.model.config.vocab_size

    def force(self, jobs, k, progress=lambda n: None):
        for job in jobs:
            positions = np.asarray(job.schedule.positions)
            ids = torch.tensor(job.tokens[: positions[-1] + 1], dtype=torch.long)[None]
            with torch.inference_mode():
                logits = self.model(input_ids=ids).logits[0, positions].double().numpy()
            got = [top_k(row, k, int(job.tokens[p + 1])) for row, p in zip(logits, positions)]
            progress(len(got))
            yield (
                job.index,
                Scores(
                    np.zeros(len(got), np.int32),
                    positions.astype(np.int32),
                    np.array([fed for _, _, fed in got]),
                    np.stack([i for i, _, _ in got]),
                    np.stack([lp for _, lp, _ in got]),
                ),
            )


class NotAnEngine:
    """A class that does not derive from scoring.engines.Engine."""
