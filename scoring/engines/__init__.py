"""The engine interface: what record and judge need of an engine (docs/scoring.md "Engines").

An engine is fed a corpus's tokens, each prompt's first `ctx` tokens through prefill and the rest
one at a time through decode, and gives at every scored position the top-k ids with their
log-probabilities and the log-probability of the token fed next. Two kinds fit:

- `Engine.force(jobs, k, progress)`: whole prompts at once (vLLM takes a prompt and its forced
  continuation in one request, and many requests together);
- `Stepwise`: one forward at a time (`prefill(ids)`, `step(token)`, each a logits row); its
  `force` and `sample` are written once, here.

A reference is sampled by an engine too (`Engine.sample`): every engine draws each token with this
module's `sample`, on its own logits, from the uniforms of the job, so that engines that compute
the same logits sample the same tokens.

An engine outside this package is `--engine module:Class`: a class built as `Class(model,
**options)` from `--model` and the `--set KEY=VALUE` options. This module imports nothing heavy:
each engine's module imports its own packages.
"""

import hashlib
import importlib
import math
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

import numpy as np
import orjson

from scoring.trace import Schedule, ScoreError, Scores

# The engines this package has, by the name `--engine` takes: module and class.
ENGINES = {
    "transformers": ("scoring.engines.transformers", "Transformers"),
    "vllm": ("scoring.engines.vllm", "VLLM"),
    "llama.cpp": ("scoring.engines.llamacpp", "LlamaCpp"),
    "openai": ("scoring.engines.openai", "OpenAI"),
}

# The request's extra argument (SamplingParams.extra_args) holding the tokens vllm.py's ForceTokens
# forces: the in-process vLLM engine sets it, and so does openai.py through a server's vllm_xargs.
FORCE_KEY = "kern_prompts_force"


@dataclass(frozen=True, slots=True)
class Job:
    """One prompt to score: its number in the corpus, all its tokens (the prompt and the
    continuation; to sample, the prompt alone), and where they are scored; to sample, the uniform
    of each decode step and the token ids never sampled."""

    index: int
    tokens: np.ndarray  # int32
    schedule: Schedule
    u: np.ndarray | None = (
        None  # float64 [steps + 1]: uniform j draws the token after position ctx-1+j
    )
    never: tuple = ()


class Engine:
    """A candidate engine. `force` yields (job.index, Scores of that prompt) for every job, in
    any order, each as soon as it is scored; Scores.prompt may be left zero. `progress(n)` may be
    called with the positions scored since the last call (a progress bar; calling it is
    optional). `describe()` is recorded as the producer's settings (a dict of plain JSON
    values). `FLAGS` are the command line's engine flags it takes (record.ENGINE_FLAGS), as
    keyword arguments of its constructor; any other flag given is refused. `TAKES_K`: its
    constructor takes `k`, the longest top-k list it will be asked for."""

    FLAGS = ()
    TAKES_K = False

    def force(self, jobs, k, progress=lambda n: None):
        raise NotImplementedError

    def describe(self):
        raise NotImplementedError

    def vocab_size(self):
        """The number of token ids the model has (a corpus with a token at or past it is
        refused before any forward); None where the engine cannot say."""
        return None

    def vocabulary(self):
        """The token strings of the model's ids in id order (as a tokenizer's
        convert_ids_to_tokens gives them): a corpus made with another tokenizer is refused
        (record.same_vocabulary). None where the engine cannot say."""
        return None

    def context(self):
        """The most tokens the model takes (a row that does not fit is skipped); None where
        the engine cannot say."""
        return None

    def sample(self, jobs, k, progress=lambda n: None):
        """A reference: each job's continuation drawn with `sample` from the engine's own logits
        and the job's uniforms, scored as `force` scores; yields (job.index, all the tokens,
        Scores). An engine without it cannot record a reference."""
        raise NotImplementedError


def can_sample(engine):
    return type(engine).sample is not Engine.sample


class Stepwise(Engine):
    """An engine driven one forward at a time: `prefill(ids)` gives the logits row of the last
    position, `step(token)` the row of the token just fed, each on the engine's own cache and
    state; `top(row, k, next_id)` reduces a row to (top-k ids, their log-probabilities, the
    log-probability of next_id)."""

    def prefill(self, ids):
        raise NotImplementedError

    def step(self, token):
        raise NotImplementedError

    def top(self, row, k, next_id=None):
        return top_k(row, k, next_id)

    def at(self, row, ids):
        """The log-probabilities of `ids` in a logits row (the judge's `against` estimator)."""
        return normalised(row)[np.asarray(ids, np.int64)]

    def choose(self, row, u, never):
        """The token `sample` draws from a logits row."""
        return sample(row, u, never)

    def force(self, jobs, k, progress=lambda n: None):
        for job in jobs:
            tokens = list(map(int, job.tokens))
            _, s = score_prompt(self, tokens, job.schedule, k, teacher(tokens), progress)
            yield job.index, s

    def sample(self, jobs, k, progress=lambda n: None):
        for job in jobs:
            start = job.schedule.ctx - 1

            def draw(pos, row, job=job, start=start):
                return self.choose(row, job.u[pos - start], job.never)

            tokens, s = score_prompt(self, job.tokens, job.schedule, k, draw, progress)
            yield job.index, tokens, s


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


def score_prompt(engine, tokens, schedule, k, choose_next, progress=lambda n: None):
    """One prompt's tokens (extended by what was chosen) and one producer's scores of it."""
    tokens = list(map(int, tokens))
    got = []
    for _, row, nxt in drive(engine, tokens, schedule, choose_next):
        got.append(engine.top(row, k, nxt))
        progress(1)
    return np.asarray(tokens, np.int32), scores_of(schedule, got)


def scores_of(schedule, got):
    """Scores of one prompt from (ids, log-probabilities, fed log-probability) per position."""
    positions = np.asarray(schedule.positions, np.int32)
    return Scores(
        np.zeros(len(positions), np.int32),
        positions,
        np.asarray([f for _, _, f in got], np.float64),
        np.stack([i for i, _, _ in got]).astype(np.int32),
        np.stack([lp for _, lp, _ in got]).astype(np.float64),
    )


def sample(row, u, never):
    """The project's sampler, the one every engine draws a reference's tokens with: the float64
    softmax of a logits row (NaN as -inf) with the `never` ids taken out and the rest renormalised,
    inverted at u: the first id whose cumulative probability reaches u times the total. With
    nothing left to draw from, the lowest id that is not a `never` id."""
    x = np.asarray(row, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        x = np.where(np.isnan(x), -np.inf, x)
        p = np.exp(x - x.max())
    p[np.asarray(never, np.int64)] = 0.0
    cdf = np.cumsum(np.nan_to_num(p, nan=0.0))
    if not cdf[-1] > 0:
        allowed = np.setdiff1d(np.arange(len(x)), np.asarray(never, np.int64))
        return int(allowed[0])
    return min(int(np.searchsorted(cdf, u * cdf[-1])), len(x) - 1)


def vocabulary_id(strings):
    """What the corpus records of its tokenizer's vocabulary, and an engine's is compared with:
    its size and the sha256 of its token strings in id order (JSON)."""
    return {"size": len(strings), "sha256": hashlib.sha256(orjson.dumps(list(strings))).hexdigest()}


def uniforms(seed, source, n):
    """n uniforms for the row `source`: the same for the same row and seed whatever else runs."""
    row_key = int.from_bytes(hashlib.sha256(source.encode()).digest()[:8], "big")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, row_key]))).random(n)


def top_k(row, k, next_id=None):
    """A logits row (or log-probabilities: normalising twice changes nothing) as log-probabilities
    in float64; the top-k ids by value, exact ties to the lower id, with their log-probabilities,
    and the log-probability of `next_id`. A NaN anywhere makes every value NaN (as a log-softmax
    does); NaN ranks below every number."""
    lp = normalised(row)
    key = np.where(np.isnan(lp), -np.inf, lp)
    k = min(k, len(key))
    order = np.lexsort((np.arange(len(key)), -key))[:k]
    fed = float(lp[next_id]) if next_id is not None else math.nan
    return order.astype(np.int32), lp[order], fed


def normalised(row):
    """A logits row as log-probabilities in float64 (a log-softmax)."""
    row = np.asarray(row, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        m = row.max()
        return row - (m + np.log(np.exp(row - m).sum()))


def package(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def engine_class(spec):
    """The class `--engine` names: one of ENGINES, or `module:Class` of a plug-in."""
    if spec in ENGINES:
        module, name = ENGINES[spec]
    elif ":" in spec:
        module, _, name = spec.partition(":")
    else:
        raise ScoreError(
            f"--engine {spec}: not an engine ({', '.join(ENGINES)}, or module:Class of your own)"
        )
    try:
        found = importlib.import_module(module)
    except ModuleNotFoundError as e:
        hint = INSTALL.get(spec, f"is {module} on the Python path?")
        raise ScoreError(f"--engine {spec}: cannot import {e.name} ({hint})") from None
    except Exception as e:  # a plug-in's own module failing as it is imported
        raise ScoreError(f"--engine {spec}: importing {module} failed: {e!r}") from None
    cls = getattr(found, name, None)
    if cls is None:
        raise ScoreError(f"--engine {spec}: {module} has no {name}")
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise ScoreError(f"--engine {spec}: {name} is not an Engine (scoring.engines.Engine)")
    return cls


# What to install when an engine's package is missing.
INSTALL = {
    "transformers": "pip install -e '.[score]'",
    "vllm": 'vLLM lives in an environment of its own: docs/scoring.md "vLLM"',
    "llama.cpp": "pip install -e '.[llamacpp]'",
}
