"""An engine from outside the package, as a user writes one (docs/DESIGN.md "Adding an engine"):
`--engine plugin_engine:FullForward` with tests/ on the Python path.

It scores each prompt with one forward over all its tokens, without a cache: a real engine, whose
numbers are transformers' own, that takes whole prompts at once as vLLM does (`Engine.force`),
where the package's transformers engine prefills and then steps through its cache."""

import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from scoring.engines import Engine, top_k
from scoring.engines.transformers import Transformers
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


class Faulty(FullForward):
    """FullForward with one fault of the kinds a real engine has, from prompt `at` on
    (tests/test_boundary.py): what it gives must be refused before anything is written."""

    def __init__(self, model, fault, at=1):
        super().__init__(model)
        self.fault, self.at = fault, at

    def describe(self):
        odd = {"numpy": np.float32(1.5), "set": {1, 2}, "path": Path("/m"), "tuple": (1, 2)}
        return dict(engine="faulty", fault=self.fault) | (
            {"odd": odd[self.fault]} if self.fault in odd else {}
        )

    def force(self, jobs, k, progress=lambda n: None):
        jobs = list(jobs)
        for n, (i, s) in enumerate(super().force(jobs, k, progress)):
            if n < self.at:
                yield i, s
                continue
            f = self.fault
            if f == "raise":
                raise RuntimeError("out of memory on device 0")
            if f == "never":
                return
            if f in ("shift", "past", "twice"):
                s.pos = {"shift": s.pos + 1, "past": np.r_[s.pos[:-1], s.pos[-1] + 1],
                         "twice": np.r_[s.pos[:1], s.pos[:-1]]}[f]  # fmt: skip
            elif f == "narrow":
                s.ids, s.logprob = s.ids[:, : k // 2], s.logprob[:, : k // 2]
            elif f == "ragged":
                s.ids, s.logprob = s.ids[:-1], s.logprob[:-1]
            elif f in ("vocab", "negative", "repeat"):
                v = {"vocab": self.vocab_size(), "negative": -1, "repeat": s.ids[0, 0]}[f]
                s.ids = s.ids.copy()
                s.ids[len(s.ids) // 2, 1] = v
            elif f == "nan":
                s.logprob = s.logprob.copy()
                s.logprob[-1, 0] = np.nan
            elif f == "logits":
                s.logprob = s.logprob + 7.0
            elif f == "unasked":
                i = max(j.index for j in jobs) + 1
            elif f == "again":
                yield i, s
            elif f == "index":
                i = str(i)
            elif f == "bare":
                yield i, (s.ids, s.logprob)
                continue
            yield i, s


class Unruly(FullForward):
    """FullForward with one way a plug-in's own code goes wrong outside the numbers it scores
    (tests/test_score_failures.py `UNRULY`): each must be one line naming the engine, and nothing
    written. `size`: the length of the version text a huge describe() holds."""

    def __init__(self, model, fault, size=0):
        if fault == "exit in the constructor":
            sys.exit(0)
        super().__init__(model)
        self.fault, self.size = fault, size

    def describe(self):
        if self.fault == "exit in describe()":
            sys.exit(0)
        if self.fault == "huge describe()":  # a server's /version, say, answering megabytes
            return dict(engine="unruly", version="v" * self.size, fault=self.fault)
        return dict(engine="unruly", fault=self.fault)

    def vocab_size(self):
        f = self.fault
        if f == "vocab_size() a string":
            return "261"
        if f == "vocab_size() raises":
            raise KeyError("vocab_size")
        if f == "exit in vocab_size()":
            sys.exit(3)
        if f == "an id past the corpus's vocabulary":  # a server: it cannot say
            return None
        return super().vocab_size()

    def vocabulary(self):
        return 261 if self.fault == "vocabulary() a number" else None

    def force(self, jobs, k, progress=lambda n: None):
        if self.fault == "force() gives None":
            return None
        return self.changed(super().force(jobs, k, progress))

    def changed(self, items):
        for i, s in items:
            f = self.fault
            if f == "exit in force()":
                sys.exit(0)
            if f == "a tensor that needs its gradient":
                s.logprob = torch.tensor(s.logprob, requires_grad=True)
            elif f == "complex log-probabilities":
                s.logprob = s.logprob + 1e-3j
            elif f == "an id past the corpus's vocabulary":
                s.ids = s.ids.copy()
                s.ids[3, 1] = 1261
            yield i, s


RAN = []  # what each of Meanwhile's runs returned


class Meanwhile(FullForward):
    """FullForward that, once it has given its first prompt, lets another writer at the file:
    runs score.py with the arguments `run` (a merge into the record's --out, say), or copies the
    file `put[0]` over `put[1]` (a writer that takes no lock). A race made deterministic: the
    other writer runs exactly while the record is in progress; what each run returned is added
    to RAN."""

    def __init__(self, model, run=None, put=None):
        super().__init__(model)
        self.run, self.put = run, put

    def force(self, jobs, k, progress=lambda n: None):
        import score

        for n, item in enumerate(super().force(jobs, k, progress)):
            if n == 1 and self.run:
                RAN.append(score.main(self.run))
            if n == 1 and self.put:
                shutil.copyfile(*self.put)
            yield item


ASKED = []  # what Counted was asked of its model, in order, and "forward" at its first forward


class Counted(Transformers):
    """The package's transformers engine, noting each question about its model in ASKED
    (tests/test_engines.py): a command asks each once, before any forward."""

    def asked(self, what):
        ASKED.append(what)
        return getattr(super(), what)()

    def vocab_size(self):
        return self.asked("vocab_size")

    def vocabulary(self):
        return self.asked("vocabulary")

    def context(self):
        return self.asked("context")

    def describe(self):
        return self.asked("describe")

    def prefill(self, ids):
        if "forward" not in ASKED:
            ASKED.append("forward")
        return super().prefill(ids)
