"""The engine boundary: everything an engine gives is checked here before anything is staged or
judged (docs/scoring.md "Engines"). An engine is untrusted input, ours included: a plug-in that
scores the wrong positions, lists a token twice or past its vocabulary, gives logits for
log-probabilities, raises half-way or forgets a prompt is refused with one line naming the engine,
the prompt and the position, and nothing it gave reaches a file that the judge would refuse.
What it says of its model (its count of ids, its token strings: asked once, by record.resolve)
is held here against the corpus it is fed and the tokenizer the rows are rendered with.

Plain functions of data, but for `given`, which draws the engine's iterator.
"""

import math
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import orjson

from scoring.compare import LOGPROB_SLACK, logprobs
from scoring.engines import vocabulary_id
from scoring.trace import ScoreError, Scores

INT32_MAX = 2**31 - 1  # a trace stores ids as int32

# What a producer's settings (describe()) may hold in the file. Every parquet reader bounds the
# footer it deserialises (pyarrow, which every command reads with: 100 MB a string, and the
# settings are in the footer twice, as this tool's key and inside the Arrow schema, base64): an
# engine or server that says more would make a file no command reads again. A text longer than
# SETTING_TEXT is cut, and says so; settings still longer than SETTINGS_BYTES as JSON (a list of
# millions of numbers) are refused. A version or a path is far below either.
SETTING_TEXT = 4096  # characters of one string (a key or a value)
SETTINGS_BYTES = 1 << 20  # bytes of the whole, as JSON
CUT = " [cut by kern-prompts: {n} characters in all]"


@contextmanager
def own(who, what):
    """A call into the engine's code (its constructor, describe(), force(), ...): whatever it
    raises, a sys.exit() inside it included, is one line naming the engine and the call. An
    interruption (Ctrl-C) stays one."""
    try:
        yield
    except ScoreError:
        raise
    except (Exception, SystemExit) as e:
        raise failed(who, what, e) from None


def failed(who, what, e):
    return ScoreError(f"{who}{what}: {type(e).__name__}: {e}")


def vocab_size(engine, who):
    """The engine's vocab_size(): a count of token ids, or None where it cannot say."""
    with own(who, ": vocab_size() failed"):
        v = engine.vocab_size()
    if v is None:
        return None
    if not (isinstance(v, int | np.integer) and not isinstance(v, bool) and v > 0):
        raise ScoreError(f"{who}: vocab_size() gave {shown(v)}, not a count of token ids (a "
                         "positive int) or None")  # fmt: skip
    return int(v)


def vocabulary(engine, who):
    """The engine's vocabulary(): its token strings in id order, or None."""
    with own(who, ": vocabulary() failed"):
        v = engine.vocabulary()
    if v is None:
        return None
    # (a hole in a tokenizer's ids is None, as convert_ids_to_tokens gives it)
    if not (isinstance(v, list | tuple) and all(x is None or isinstance(x, str) for x in v)):
        raise ScoreError(f"{who}: vocabulary() gave {shown(v)}, not a list of token strings "
                         "in id order or None")  # fmt: skip
    return v


def context(engine, who):
    """The engine's context(): the most tokens the model takes, or None."""
    with own(who, ": context() failed"):
        v = engine.context()
    if v is not None and not (isinstance(v, int | np.integer) and not isinstance(v, bool)
                              and v > 0):  # fmt: skip
        raise ScoreError(f"{who}: context() gave {shown(v)}, not a count of tokens or None")
    return None if v is None else int(v)


def shown(v):
    """A value an engine gave, in a message: the start of its text, and its type."""
    text = repr(v)
    return text[:60] + ("…" if len(text) > 60 else "") + f" ({type(v).__name__})"


# What the engine says of its model, against the corpus and the rows' tokenizer.


def tokenizer_of_model(strings, tokenizer, given, model):
    """Refuse a --tokenizer (`given`) whose token strings are not the model's (`strings`, where
    the engine can say): the rows' ids would mean other text to it."""
    if strings is None:
        return
    want = vocabulary_id(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))))
    if len(strings) < want["size"] or vocabulary_id(strings[: want["size"]]) != want:
        raise ScoreError(
            f"--tokenizer {given}: its {want['size']} tokens are not the vocabulary of "
            f"--model {model} ({len(strings)} tokens): the rendered ids would mean other "
            "text to the model; give the tokenizer of the model it was converted from"
        )


def same_vocabulary(strings, trace, path, model):
    """Refuse a model whose vocabulary (`strings`, the engine's) is not the tokenizer the corpus
    was made with (its token strings differ: the ids mean other text), where the corpus records
    it and the engine can say (a corpus of kern's records none)."""
    want = trace.meta.get("vocabulary")
    if not isinstance(want, dict) or "sha256" not in want or strings is None:
        return
    n = want.get("size", 0)
    got = vocabulary_id(strings[:n])
    if len(strings) < n or got["sha256"] != want["sha256"]:
        raise ScoreError(
            f"--model {model}: its vocabulary ({len(strings)} tokens) is not the tokenizer "
            f"{path} was made with ({n} tokens" + (", whose strings differ" if len(strings) >= n
                                                  else "") + "): the same ids mean other text. "
            "Judge a model of the corpus's tokenizer, or record this model's own reference "
            "(record --rows)"
        )  # fmt: skip


def in_vocabulary(vocab, trace, path, ids=False):
    """Refuse a corpus holding a token the model has no id for (at or past `vocab`, its count;
    a corpus tokenized for another model), and with `ids` a producer listing one (the `against`
    estimator looks each up): the first such prompt and position, before any forward."""
    if vocab is None:
        return
    for i, p in enumerate(trace.prompts):
        out = np.flatnonzero(p.tokens >= vocab)
        if len(out):
            raise ScoreError(
                f"{path}: prompt {i} position {out[0]} holds token {p.tokens[out[0]]}, outside "
                f"the model's vocabulary of {vocab} ids: the corpus was tokenized for another "
                "model; record this model's own reference (record --rows), or run the model the "
                "corpus was made with"
            )
    for name, s in trace.producers.items() if ids else ():
        out = np.flatnonzero((s.ids >= vocab).any(1))
        if len(out):
            j = out[0]
            raise ScoreError(
                f"{path}: producer {name!r} lists a token id of {int(s.ids[j].max())} at prompt "
                f"{s.prompt[j]} position {s.pos[j]}, outside the model's vocabulary of {vocab} "
                "ids: the reference was recorded with another model"
            )


@dataclass(slots=True)
class Width:
    """The length of the top-k lists of one run: every prompt's must be the same (a trace keeps
    one per producer), at least 2 and at most the k asked. Set by the first prompt staged or
    given."""

    asked: int
    seen: int | None = None

    def check(self, who, index, w):
        if not 2 <= w <= self.asked:
            raise ScoreError(f"{who} gave top-k lists of {w} entries for prompt {index}; "
                             f"{self.asked} were asked (at least 2)")  # fmt: skip
        if self.seen is None:
            self.seen = w
        elif w != self.seen:
            raise ScoreError(f"{who} gave top-k lists of {w} entries for prompt {index}, "
                             f"{self.seen} for the prompts before it: one length a run")  # fmt: skip


def settings(engine, who):
    """The engine's describe() as it will be recorded: a JSON object, read back as JSON gives it
    (a numpy number, a set or a path is refused, not written as something else)."""
    with own(who, ": describe() failed"):
        d = engine.describe()
    if not isinstance(d, dict):
        raise ScoreError(f"{who}: describe() gave a {type(d).__name__}, not a dict")
    try:
        text = orjson.dumps(d)
    except TypeError as e:
        raise ScoreError(f"{who}: describe() holds a value JSON cannot hold ({e}); give plain "
                         "numbers, strings, lists and dicts") from None  # fmt: skip
    back = orjson.loads(text)
    if back != d:
        raise ScoreError(f"{who}: describe() does not read back as itself from JSON (a tuple, "
                         "or a float key?); give plain numbers, strings, lists and dicts")  # fmt: skip
    if len(text) <= SETTINGS_BYTES and all(len(t) <= SETTING_TEXT for t in texts(back)):
        return back
    back = cut(back)
    size = len(orjson.dumps(back))
    if size > SETTINGS_BYTES:
        raise ScoreError(f"{who}: describe() is {size:,} bytes as JSON with every text cut to "
                         f"{SETTING_TEXT} characters, more than the {SETTINGS_BYTES:,} a "
                         "producer's settings may hold in a trace (parquet readers bound the "
                         "file's metadata); say less")  # fmt: skip
    return back


def texts(v):
    """Every string in a JSON value, keys included."""
    if isinstance(v, str):
        yield v
    elif isinstance(v, dict):
        for k, x in v.items():
            yield k
            yield from texts(x)
    elif isinstance(v, list):
        for x in v:
            yield from texts(x)


def cut(v):
    """A JSON value with every string longer than SETTING_TEXT cut to that, saying so (CUT)."""
    if isinstance(v, str):
        return v if len(v) <= SETTING_TEXT else v[:SETTING_TEXT] + CUT.format(n=f"{len(v):,}")
    if isinstance(v, dict):
        return {cut(k): cut(x) for k, x in v.items()}
    if isinstance(v, list):
        return [cut(x) for x in v]
    return v


def given(who, jobs, items, width, vocab, sampled=False, nonfinite=lambda i: "", recorded=None):
    """The engine's `items` (from force: (index, Scores); from sample: (index, tokens, Scores)),
    each checked against its job as it comes (`scores_checked`, `recorded` the corpus's count of
    ids); the engine's own errors as one line; then every job given once. Yields (index, tokens or
    None, Scores). `nonfinite(index)` is added to the line that refuses a value that is not finite
    (what it means there)."""
    asked = {job.index: job for job in jobs}
    done = set()
    if items is None or isinstance(items, str | bytes | dict) or not hasattr(items, "__iter__"):
        raise ScoreError(f"{who}: {'sample' if sampled else 'force'}() gave {shown(items)}, not "
                         "an iterator of its prompts")  # fmt: skip
    with own(who, " failed"):
        items = iter(items)
    while True:
        try:
            item = next(items)
        except StopIteration:
            break
        except ScoreError:
            raise
        except (Exception, SystemExit) as e:  # a plug-in's own failure: its type and words, once
            raise failed(who, " failed", e) from None
        n = 3 if sampled else 2
        if not (isinstance(item, tuple) and len(item) == n):
            raise ScoreError(f"{who} gave {type(item).__name__} {str(item)[:60]!r}, not "
                             + ("(index, tokens, Scores)" if sampled else "(index, Scores)"))  # fmt: skip
        index = item[0]
        if not (isinstance(index, int | np.integer) and not isinstance(index, bool)):
            raise ScoreError(f"{who} gave {index!r} as a prompt's index")
        index = int(index)
        if index not in asked:
            raise ScoreError(f"{who} gave prompt {index}, which it was not asked for")
        if index in done:
            raise ScoreError(f"{who} gave prompt {index} twice")
        job = asked[index]
        tokens = tokens_checked(who, job, item[1], vocab) if sampled else None
        s = scores_checked(who, job, item[-1], width, vocab, nonfinite, recorded)
        done.add(index)
        yield index, tokens, s
    missing = [i for i in asked if i not in done]
    if missing:
        raise ScoreError(f"{who} stopped without giving prompt {missing[0]}"
                         + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))  # fmt: skip


def tokens_checked(who, job, tokens, vocab):
    """A sampled prompt's tokens: its prompt, then one token per decode step and one more, each
    an id of the model and none of the ids never sampled."""
    s = job.schedule
    t = np.asarray(tokens)
    if t.ndim != 1 or not np.issubdtype(t.dtype, np.integer) or len(t) != s.ctx + s.steps + 1:
        raise ScoreError(f"{who} gave prompt {job.index} as {t.shape} tokens of {t.dtype}, not "
                         f"the {s.ctx + s.steps + 1} ids of its prompt and continuation")  # fmt: skip
    n = min(len(job.tokens), s.ctx)
    if not np.array_equal(t[:n], job.tokens[:n]):
        at = int(np.flatnonzero(t[:n] != job.tokens[:n])[0])
        raise ScoreError(f"{who} gave prompt {job.index} with token {t[at]} at position {at}, "
                         f"where the prompt has {job.tokens[at]}")  # fmt: skip
    new = t[s.ctx :]
    bad = np.flatnonzero((new < 0) | (new >= (vocab or INT32_MAX + 1)) | np.isin(new, job.never))
    if len(bad):
        j = int(bad[0])
        raise ScoreError(f"{who} sampled token {new[j]} at prompt {job.index} position "
                         f"{s.ctx + j}: " + ("a stop id, never sampled" if new[j] in job.never
                                             else "not an id of the model"))  # fmt: skip
    return t.astype(np.int32)


def scores_checked(who, job, s, width, vocab, nonfinite=lambda i: "", recorded=None):
    """One prompt's Scores as an engine gave them: the positions of its schedule, each once and in
    order; top-k lists of the run's one length; ids of the model (below `vocab`, the engine's
    count; where it cannot say, below `recorded`, what the corpus records of its model's; and
    int32), each once a list; real, finite log-probabilities (the judge's `logprobs` rule). As
    float64 and int32 arrays."""
    if not isinstance(s, Scores):
        raise ScoreError(f"{who} gave a {type(s).__name__} for prompt {job.index}, not Scores "
                         "(scoring.trace.Scores)")  # fmt: skip
    want = np.asarray(job.schedule.positions, np.int64)
    try:
        pos = np.asarray(s.pos).reshape(-1)
        ids = np.asarray(s.ids)
        lp, fed = np.asarray(s.logprob), np.asarray(s.ref_logprob).reshape(-1)
        if np.iscomplexobj(lp) or np.iscomplexobj(fed):
            raise ScoreError(f"{who} gave prompt {job.index} complex log-probabilities: a "
                             "log-probability is a real number")  # fmt: skip
        lp, fed = lp.astype(np.float64), fed.astype(np.float64)
    except ScoreError:
        raise
    except Exception as e:  # what numpy cannot read as numbers: its own words
        raise ScoreError(f"{who} gave prompt {job.index} with arrays that are not numbers ({e})"
                         ) from None  # fmt: skip
    n = len(want)
    if len(pos) != n or not np.array_equal(pos, want):
        j = next((j for j in range(min(len(pos), n)) if pos[j] != want[j]), min(len(pos), n))
        got = f"position {pos[j]}" if j < len(pos) else "no more positions"
        raise ScoreError(f"{who} gave prompt {job.index} {got} where position "
                         f"{want[j] if j < n else 'none'} is due (its scored positions are "
                         f"{want[0]} to {want[-1]}, each once)")  # fmt: skip
    if ids.ndim != 2 or lp.shape != ids.shape or len(ids) != n or len(fed) != n:
        raise ScoreError(f"{who} gave prompt {job.index} top-k arrays of shapes {ids.shape} and "
                         f"{lp.shape} and {len(fed)} fed values for its {n} positions")  # fmt: skip
    width.check(who, job.index, ids.shape[1])
    if not np.issubdtype(ids.dtype, np.integer):
        raise ScoreError(f"{who} gave prompt {job.index} token ids of {ids.dtype}, not integers")
    n_ids = vocab or recorded
    top = min(n_ids or math.inf, INT32_MAX + 1)
    bad = np.flatnonzero(((ids < 0) | (ids >= top)).any(1))
    if len(bad):
        j = int(bad[0])
        v = ids[j][(ids[j] < 0) | (ids[j] >= top)][0]
        raise ScoreError(f"{who} gave token id {v} at prompt {job.index} position {want[j]}: "
                         + (f"the model has {vocab} ids" if vocab else
                            f"the corpus's model has {recorded} ids (what the corpus records of "
                            "its vocabulary; the engine does not say its own)" if recorded else
                            "not an int32 id"))  # fmt: skip
    bad = np.flatnonzero(~(np.isfinite(lp).all(1) & np.isfinite(fed)))
    if len(bad):
        j = int(bad[0])
        raise ScoreError(f"{who} gave log-probabilities that are not finite (NaN or infinite) "
                         f"at prompt {job.index} position {want[j]}, and {len(bad)} of its {n} "
                         f"positions{nonfinite(job.index)}")  # fmt: skip
    out = Scores(np.full(n, job.index, np.int32), want.astype(np.int32), fed,
                 ids.astype(np.int32), lp)  # fmt: skip
    logprobs(out, who)
    high = np.flatnonzero(fed > LOGPROB_SLACK)  # a log-probability is at most 0
    if len(high):
        raise ScoreError(f"{who} gave the fed token a log-probability of {fed[high[0]]:.4g}, "
                         f"above 0, at prompt {job.index} position {want[high[0]]}: a "
                         "log-probability is the log-softmax of the logits, not a logit")  # fmt: skip
    return out
