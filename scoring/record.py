"""Driving an engine over a corpus: a reference sampled on the rows of a split, or a candidate
teacher-forced on a trace's tokens; the staging that makes a record resumable; merge.

`resolve` turns the command line into a `Run`, asking the engine everything once, before any
prompt runs; `record` (record's) and `candidate` (the judge's) are functions of that value and the
only ones that run a model. Everything they hand on is data (docs/scoring.md "Recording").
"""

import inspect
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import orjson

from scoring import boundary
from scoring import builder as build
from scoring.boundary import (
    Width,
    given,
    in_vocabulary,
    own,
    same_vocabulary,
    scores_checked,
    settings,
    tokenizer_of_model,
)
from scoring.engines import (
    Engine,
    Job,
    Stepwise,
    can_sample,
    drive,
    engine_class,
    scores_of,
    teacher,
    uniforms,
    vocabulary_id,
)
from scoring.rows import load_tokenizer, plan_rows, stop_ids, tokenizer_sha256
from scoring.trace import (
    Prompt,
    Schedule,
    ScoreError,
    Trace,
    Writing,
    beside,
    concat_scores,
    corpus_sha256,
    identity,
    note,
    prompt_tables,
    read_trace,
    slice_scores,
    trace_tables,
    write_trace,
)


@dataclass(frozen=True)
class Run:
    """One run of an engine, resolved before any prompt runs (`resolve`): the engine, asked
    each thing once through the boundary's checks (boundary.py), and everything the run reads.
    A reference is sampled on the rows of a split; a candidate is fed the tokens of `corpus`, a
    trace (record --corpus, judge --model). A record's run also says what it writes (`out` and
    below); the judge's candidate writes nothing."""

    engine: Engine
    who: str  # the engine as every message names it: `--engine NAME`
    model: str  # --model as recorded and printed (shown_model)
    k: int  # the length of the top-k lists asked
    vocab: int | None  # the model's count of ids (vocab_size()); None where it cannot say
    recorded: int | None  # what the corpus records of its model's ids (recorded_ids)
    jobs: tuple  # the plan: each prompt as the engine is given it (engines.Job), in corpus order
    decode: int  # decode steps a prompt
    quiet: bool = True
    corpus: Trace | None = None  # the trace a candidate is fed; None: a reference, sampled
    settings: dict | None = None  # describe(); a record's adds `run`: the model's identity, flags
    out: Path | None = None  # the trace a record writes,
    was: tuple | None = None  # what was there as it began (trace.identity),
    producer: str | None = None  # the producer's name in it,
    meta: dict | None = None  # its metadata but that producer's (rows, tokenizer, context, ...),
    key: dict | None = None  # and what its staged prompts depend on (run_key)


def cmd_record(args):
    return record(resolve(args))


def resolve(args, ref=None):
    """The command line's run: record's (a reference on the rows of a split, or a producer added
    to the trace --corpus), or with `ref` the judge's candidate on that reference. The engine is
    built, then asked once each for its count of ids, its vocabulary (where something is checked
    against it), its context (unless --context) and describe(), in this order; nothing after
    this reads `args`."""
    who = f"--engine {args.engine}"
    if ref is not None:  # judge --model
        engine = engine_of(args, reference_k(ref))
        run = fed(engine, who, ref, shown_model(engine, args.model), quiet=args.quiet)
        return replace(run, settings=settings(run.engine, who))
    out = Path(args.out)
    was = identity(out)  # what the record may replace at its end: only this, unchanged
    corpus = read_trace(args.corpus) if args.corpus else None
    if corpus and args.producer in corpus.producers and not args.replace:
        raise ScoreError(
            f"{args.corpus} already has producer {args.producer!r}; --replace replaces it"
        )
    engine = engine_of(args, args.top_k)
    model = shown_model(engine, args.model)  # as recorded and printed
    if corpus:
        run = fed(engine, who, corpus, model, args.top_k, args.corpus, args.quiet)
        meta = dict(corpus.meta)
    else:
        vocab = vocab_checked(engine, who, args.top_k)
        if not can_sample(engine):
            raise ScoreError(f"--engine {args.engine} cannot sample a reference (it has no "
                             "`sample`); it scores a corpus (--corpus)")  # fmt: skip
        source, flag = rendering_tokenizer(args.tokenizer, args.model)  # after the engine: its
        tokenizer = load_tokenizer(source, flag)  # own word on a model file
        if args.tokenizer:
            strings = boundary.vocabulary(engine, who)
            tokenizer_of_model(strings, tokenizer, args.tokenizer, args.model)
        context = args.context or boundary.context(engine, who)
        plan, skipped, length, options = plan_rows(args, tokenizer, context)
        meta = dict(
            split=args.split, rows=str(args.rows), length=length,
            choice=dict(sources=args.sources, first=args.first, shard=list(args.shard)),
            model=model, tokenizer=str(source),
            tokenizer_sha256=tokenizer_sha256(tokenizer),
            vocabulary=vocabulary_id(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))))
            | ({} if vocab is None else {"ids": vocab}),  # the ids the logits cover, if it says
            chat_template_sha256=build.sha256_hex(tokenizer.chat_template or ""),
            template_options=options, seed=args.seed,
            sampler=dict(kind="ancestral", temperature=1.0, never=stop_ids(tokenizer, source),
                         producer=args.producer),  # whose samples the tokens are
            context=context, skipped=skipped,
            prompts=[dict(index=r.index, source=r.source, name=r.name, rendered=len(t))
                     for t, _, r in plan],
        )  # fmt: skip
        never = tuple(meta["sampler"]["never"])
        # the plan's tokens are the rendered prompts; each is extended by its continuation
        jobs = tuple(Job(i, np.asarray(t, np.int32), Schedule.of(len(t) + length, length - 1),
                         uniforms(args.seed, row.source, length), never)
                     for i, (t, _, row) in enumerate(plan))  # fmt: skip
        run = Run(engine, who, model, args.top_k, vocab, None, jobs, length - 1, args.quiet)
    # what is recorded of the producer: its describe() and, added here for every engine (none
    # can leave it out), what ran: --engine, the model as a user can check it, the flags and
    # --set options given
    producer = settings(engine, who) | {"run": dict(
        engine=args.engine, model=model_identity(model), flags=flags_given(args),
        options=dict(args.set or []),
    )}  # fmt: skip
    if corpus:  # the same tokens too
        key = run_key(meta | {"decode": corpus.decode}, args.producer, producer, args.top_k) | {
            "corpus_tokens": corpus_sha256(corpus)}  # fmt: skip
    else:
        key = run_key(meta, args.producer, producer, args.top_k)
    return replace(run, settings=producer, out=out, was=was, producer=args.producer, meta=meta,
                   key=key)  # fmt: skip


def fed(engine, who, corpus, model, k=None, path="the reference", quiet=True):
    """The run of `engine` fed the tokens of the trace `corpus` (at `path`): record --corpus's,
    for top-k lists of k, or (k None) the judge's candidate, whose lists are as long as the
    reference's longest (reference_k). A corpus of another model's tokens or tokenizer is refused
    before any forward, and for the judge's stepwise candidate a producer listing an id the model
    does not have (the `against` estimator looks each up)."""
    judged = k is None
    k = reference_k(corpus) if judged else k
    vocab = vocab_checked(engine, who, k)
    in_vocabulary(vocab, corpus, path, judged and isinstance(engine, Stepwise))
    want = corpus.meta.get("vocabulary")  # asked only where the corpus records one
    if isinstance(want, dict) and "sha256" in want:
        same_vocabulary(boundary.vocabulary(engine, who), corpus, path, model)
    jobs = tuple(Job(i, p.tokens, corpus.schedule(i)) for i, p in enumerate(corpus.prompts))
    return Run(engine, who, model, k, vocab, recorded_ids(corpus.meta), jobs, corpus.decode, quiet,
               corpus)  # fmt: skip


def engine_of(args, k):
    """The engine the command line names, built from --model, the flags it takes (each engine
    names them, Engine.FLAGS) and its --set options, for top-k lists of k. A flag or an option it
    does not take is refused before it is built, never dropped."""
    cls = engine_class(args.engine)
    who = f"--engine {args.engine}"
    given = flags_given(args)
    unused = [f for f in given if f not in cls.FLAGS]
    if unused:
        flag = "--" + unused[0].replace("_", "-")
        takes = ", ".join("--" + f.replace("_", "-") for f in cls.FLAGS)
        raise ScoreError(f"{who} does not use {flag} (it takes {takes + ' and ' if takes else ''}"
                         "--set KEY=VALUE: docs/scoring.md \"Engines\")")  # fmt: skip
    options = dict(args.set or [])
    for key in options:
        if key in cls.FLAGS:
            raise ScoreError(f"--set {key}: {who} takes it as --{key.replace('_', '-')}")
        if key == "model" or (key == "k" and cls.TAKES_K):
            raise ScoreError(f"--set {key}: set by the command (--model, --top-k), not by --set")
    kwargs = given | options | ({"k": k} if cls.TAKES_K else {})
    try:
        inspect.signature(cls).bind(args.model, **kwargs)
    except TypeError as e:  # names the option the constructor does not take
        raise ScoreError(f"{who}: {e}") from None
    except ValueError:  # a class whose signature cannot be read: its constructor says
        pass
    with own(who, " could not start"):
        return cls(args.model, **kwargs)


# The command line's engine flags (score.py); None where not given, and each engine takes its own.
ENGINE_FLAGS = ("device", "dtype", "chunk", "kv_dtype", "state_dtype", "batch")


def flags_given(args):
    return {f: getattr(args, f) for f in ENGINE_FLAGS if getattr(args, f, None) is not None}


def vocab_checked(engine, who, k):
    """The engine's count of ids (vocab_size()), which a top-k list of k cannot be longer than."""
    vocab = boundary.vocab_size(engine, who)
    if vocab is not None and k > vocab:
        raise ScoreError(f"--top-k {k}: the model has {vocab} token ids; a top-k list is at most "
                         "that long")  # fmt: skip
    return vocab


class Staging:
    """Where a record keeps its finished prompts until the trace is whole: a directory beside
    the output holding a marker that names the run's settings and one one-prompt trace file per
    finished prompt, while the record holds the output's lock (trace.Writing, which merge takes
    too). A killed record resumes from it; only a directory with our marker is ever reused or
    removed."""

    MARKER = "kern-prompts-record.json"

    def __init__(self, out, key):
        self.dir = out.parent / beside(out, "record")
        self.key = key
        marker = self.dir / self.MARKER
        if self.dir.is_symlink() or (self.dir.exists() and not marker.is_file()):
            raise ScoreError(f"{self.dir} exists and is not a record's staging; it is left alone")
        self.lock = Writing(out)
        try:
            self.dir.mkdir(exist_ok=True)
            if marker.is_file():
                if orjson.loads(marker.read_bytes()) != key:
                    raise ScoreError(
                        f"{self.dir} holds an unfinished record with other settings; rerun it "
                        "with its settings to finish it, or remove that directory"
                    )
            else:
                marker.write_bytes(orjson.dumps(key))
        except OSError as e:
            self.lock.release()
            raise ScoreError(f"cannot write beside {out}: {e.strerror or e}") from None
        except ScoreError:
            self.lock.release()
            raise

    def path(self, i):
        return self.dir / f"{i:06d}.parquet"

    def done(self, i):
        """Prompt i's tokens and scores, if a previous run finished it."""
        p = self.path(i)
        if not p.is_file():
            return None
        t = read_trace(p)
        return t.prompts[0].tokens, next(iter(t.producers.values()))

    def keep(self, i, decode, tokens, name, scores):
        """Stage prompt i; a write that fails (a full disk) is one line, as the trace's is."""
        try:
            write_trace(self.path(i), decode, {}, prompt_tables(0, Prompt(tokens), {name: scores}))
        except OSError as e:
            raise ScoreError(f"cannot stage prompt {i} in {self.dir} ({e.strerror or e})") from None

    def remove(self):
        for p in self.dir.iterdir():
            p.unlink()
        self.dir.rmdir()
        self.lock.release()

    def abandon(self):
        """A record that stopped before its end: its finished prompts are kept for the same
        command to resume from, and a staging without any is removed. The number kept."""
        kept = len(list(self.dir.glob("[0-9]*.parquet")))
        if kept:
            self.lock.release()
        else:
            self.remove()
        return kept


def run_key(corpus, name, producer, k):
    """What a staged prompt depends on: a resumed record must have all of it the same."""
    return {"corpus": {k: v for k, v in corpus.items() if k != "producers"}, "producer": name,
            "settings": producer, "top_k": k}  # fmt: skip


def record(run):
    """A record, as a function of its run: every prompt run and staged as it comes, then the
    trace written whole, the corpus's prompts (or the rows' sampled) with the new producer."""
    staging = Staging(run.out, run.key)
    tokens, scores = record_prompts(run, staging)
    c, meta = run.corpus, run.meta
    prompts = c.prompts if c else [Prompt(t, p["source"], p["name"], p["index"], p["rendered"])
                                   for t, p in zip(tokens, meta["prompts"])]  # fmt: skip
    producers = (c.producers if c else {}) | {run.producer: scores}
    meta = meta | {"producers": meta.get("producers", {}) | {run.producer: run.settings}}
    finish(run, Trace(prompts, run.decode, producers, meta), staging)
    return 0


def record_prompts(run, staging):
    """Every job's tokens and scores, in job order: those a previous run finished from the
    staging, the others from the engine (`given_by`), each staged as it comes. The run's top-k
    length (boundary.Width) is the staged prompts' first."""
    from tqdm import tqdm

    got, width = {}, Width(run.k)
    try:
        for job in run.jobs:
            done = staging.done(job.index)
            if done is not None:
                got[job.index] = done
                width.seen = width.seen or done[1].ids.shape[1]
        missing = [job for job in run.jobs if job.index not in got]
        total = sum(job.schedule.steps + 1 for job in missing)
        # closed before any error line is printed, so that the line stands on its own
        with tqdm(total=total, desc=run.producer, unit="pos", disable=run.quiet,
                  file=sys.stderr) as bar:  # fmt: skip
            arrived = 0
            for i, tokens, s in given_by(run, missing, bar.update, width):
                staging.keep(i, run.decode, tokens, run.producer, s)
                got[i] = tokens, s
                arrived += len(s.pos)
                if bar.n < arrived:  # an engine that does not report progress: by whole prompts
                    bar.update(arrived - bar.n)
    except ScoreError as e:
        kept = staging.abandon()
        raise ScoreError(
            f"{e}; "
            + (f"the {kept} finished prompts are kept in {staging.dir}, and the same command "
               "resumes from them" if kept else "nothing was written")
        ) from None  # fmt: skip
    except BaseException:
        staging.abandon()
        raise
    out_tokens, out_scores = [], []
    for job in run.jobs:
        tokens, s = got[job.index]
        s.prompt = np.full(len(s.pos), job.index, np.int32)
        out_tokens.append(tokens)
        out_scores.append(s)
    return out_tokens, concat_scores(out_scores)


def given_by(run, jobs, progress, width):
    """What the engine gives for `jobs` (a reference: its sample of them; a candidate: its force
    of the corpus's tokens), each prompt checked at the engine boundary (boundary.py) as it
    comes: (index, tokens, Scores)."""
    sampled = run.corpus is None
    with own(run.who, " failed"):
        items = (run.engine.sample if sampled else run.engine.force)(jobs, run.k, progress)
    nonfinite = not_a_reference(run) if sampled else lambda i: ""
    for i, tokens, s in given(run.who, jobs, items, width, run.vocab, sampled, nonfinite,
                              run.recorded):  # fmt: skip
        yield i, tokens if sampled else run.corpus.prompts[i].tokens, s


def shown_model(engine, model):
    """--model as it is recorded and printed: the engine's `shown` where it has one (a served
    engine's URL without its key), else as given."""
    return getattr(engine, "shown", None) or str(model)


WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".npz")


def model_identity(model):
    """--model as given, and the sha256 of each file that makes it: a file itself, or a
    directory's config and weights files; for a Hub id, those of its snapshot in the local cache
    where the engine put one. A resumed record or a merge that differs in any is refused."""
    p = Path(model)
    if not p.exists() and not p.is_absolute():
        try:
            from huggingface_hub import snapshot_download

            p = Path(snapshot_download(str(model), local_files_only=True))
        except Exception:  # not a Hub id, or not in the cache: the name is all there is
            return {"path": str(model), "sha256": None}
    if p.is_file():
        files = [p]
    else:
        files = sorted(f for f in p.iterdir() if f.is_file() and (
            f.suffix in WEIGHTS or f.name.endswith("config.json") or f.name.endswith(".index.json")))  # fmt: skip
    return {"path": str(model), "sha256": {f.name: build.sha256_file(f) for f in files}}


def recorded_ids(meta):
    """The count of ids the corpus records of its model (`vocabulary.ids`, else its tokenizer's
    `vocabulary.size`); None in a file that records neither (kern's)."""
    v = meta.get("vocabulary")
    if not isinstance(v, dict):
        return None
    n = v.get("ids", v.get("size"))
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def rendering_tokenizer(tokenizer, model):
    """Where the rows' tokenizer and chat template come from, and its flag: --tokenizer, else
    the model's own (a directory or Hub id). A model that is one file (a GGUF) needs --tokenizer:
    transformers renders the rows and names the stop ids (docs/scoring.md "llama.cpp")."""
    if tokenizer:
        return tokenizer, "--tokenizer"
    if Path(model).is_file():
        raise ScoreError(
            f"--model {model} is a file: the rows are rendered with a Hugging Face "
            "tokenizer and chat template, which it does not hold; give the model's with "
            "--tokenizer DIR|HUB_ID (the directory or Hub id it was converted from)"
        )
    return model, "--model"


def not_a_reference(run):
    """What a reference with log-probabilities that are not finite is told, after the prompt and
    position (boundary.py stops there, before the prompt is staged): the common cause."""
    flags = run.settings["run"]["flags"]
    return lambda i: (
        f" ({run.meta['prompts'][i]['source']}): not a reference. --model {run.model} on --device "
        f"{flags.get('device') or 'cpu'} (--dtype {flags.get('dtype') or 'float32'}) gives them; "
        "a common cause is transformers' fallback for Qwen3.8's gated-delta-rule layers without "
        "flash-linear-attention (reported to give NaN at the 27B size: pip install "
        "flash-linear-attention), or a dtype too narrow for the model"
    )


def finish(run, trace, staging):
    """Write the trace over what was at the run's `out` when the record began (`was`), remove
    the staging, say what was written (and the rows a reference skipped, by their source ids)."""
    out, name = run.out, run.producer
    skipped = () if run.corpus else run.meta["skipped"]
    try:
        write_trace(out, trace.decode, trace.meta, trace_tables(trace), run.was)
    except (OSError, ScoreError) as e:
        kept = staging.abandon()
        why = f"cannot write {out} ({e.strerror or e})" if isinstance(e, OSError) else str(e)
        raise ScoreError(
            f"{why}; the {kept} finished prompts are kept in {staging.dir}, and the same command "
            "resumes from them"
        ) from None
    staging.remove()
    s = trace.producers[name]
    note(
        f"wrote {out}: {len(trace.prompts)} prompts, {len(s.pos)} positions of producer {name}"
        + (f", {len(skipped)} rows skipped (too long for the context of {trace.meta['context']} "
           f"tokens): {', '.join(r['source'] for r in skipped)}" if skipped else ""),
    )  # fmt: skip


def cmd_merge(args):
    """Several records of disjoint rows (one per device) into one trace, under the lock every
    command that writes a trace takes (a record into the same file runs, or this one does)."""
    lock = Writing(args.out)
    try:
        return merge(args.files, args.out, identity(args.out))
    finally:
        lock.release()


def merge(files, out, was):
    """The traces `files` as one written to `out` over what was there (`was`)."""
    # a shard that got no rows has no prompts (and so no producer rows): it agrees by its settings
    traces = [read_trace(p, empty=True) for p in files]
    first = traces[0]
    scored = next((t for t in traces if t.prompts), None)
    if scored is None:
        raise ScoreError("none of the files holds a prompt (every shard got no rows): nothing to "
                         "merge")  # fmt: skip
    by = files[traces.index(scored)]

    def settings(t):
        c = {k: v for k, v in t.meta.items() if k not in ("prompts", "skipped")}
        c["choice"] = {k: v for k, v in c.get("choice", {}).items() if k != "shard"}
        return c

    for path, t in zip(files, traces):
        if len(t.meta.get("prompts", ())) != len(t.prompts) or "prompts" not in t.meta:
            raise ScoreError(f"{path}: has no record of its rows; only files record wrote merge")
        if settings(t) != settings(first) or t.decode != first.decode:
            raise ScoreError(f"{path}: its corpus or producer settings differ from {files[0]}")
        if t.prompts and set(t.producers) != set(scored.producers):
            raise ScoreError(f"{path}: its producers differ from {by}")
        for n, s in t.producers.items():
            k, k0 = s.ids.shape[1], scored.producers[n].ids.shape[1]
            if k != k0 and len(s.pos) and len(scored.producers[n].pos):
                raise ScoreError(f"{path}: producer {n!r} keeps {k} ids per position (--top-k), "
                                 f"{by} {k0}")  # fmt: skip
    parts = sorted(
        ((p.index, t, i) for t in traces for i, p in enumerate(t.prompts)), key=lambda x: x[0]
    )
    indices = [x[0] for x in parts]
    if len(set(indices)) != len(indices):
        dup = next(i for i in indices if indices.count(i) > 1)
        raise ScoreError(f"row {dup} is in more than one file: the records are not disjoint")
    whole_run(files, [t.meta.get("choice", {}).get("shard") for t in traces])
    prompts, scores = [], {n: [] for n in scored.producers}
    for j, (_, t, i) in enumerate(parts):
        prompts.append(t.prompts[i])
        for n in scores:
            s = slice_scores(t.producers[n], i)
            s.prompt = np.full(len(s.pos), j, np.int32)
            scores[n].append(s)
    meta = dict(first.meta)
    meta["choice"] = settings(first)["choice"] | {"shard": [0, 1]}
    meta["prompts"] = [dict(index=p.index, source=p.source, name=p.name, rendered=p.rendered)
                       for p in prompts]  # fmt: skip
    meta["skipped"] = sorted((s for t in traces for s in t.meta.get("skipped", [])),
                             key=lambda s: s["index"])  # fmt: skip
    merged = Trace(prompts, first.decode, {n: concat_scores(v) for n, v in scores.items()}, meta)
    write_trace(out, merged.decode, meta, trace_tables(merged), was)
    note(f"wrote {out}: {len(prompts)} prompts from {len(traces)} files")
    return 0


def whole_run(files, shards):
    """Refuse shards that are not one whole run: every I of one N, each once."""
    for path, sh in zip(files, shards):
        if sh is None:
            raise ScoreError(f"{path}: has no record of its shard; only files record wrote merge")
    n = shards[0][1]
    for path, (i, m) in zip(files, shards):
        if m != n:
            raise ScoreError(f"{path} is shard {i}/{m}, {files[0]} shard {shards[0][0]}/{n}: "
                             "shards of one run have one N")  # fmt: skip
    seen = {}
    for path, (i, _) in zip(files, shards):
        if i in seen:
            raise ScoreError(f"{seen[i]} and {path} are both shard {i}/{n}")
        seen[i] = path
    missing = [f"{i}/{n}" for i in range(n) if i not in seen]
    if missing:
        raise ScoreError(f"shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                         f"missing: merge writes only a whole run, all {n} shards of it")  # fmt: skip


def reference_k(ref):
    """The candidate's top-k lists are as long as the longest a reference producer keeps."""
    return max(s.ids.shape[1] for s in ref.producers.values())


def candidate(run):
    """Run the judge's candidate (resolve): its top-k and, from an engine driven step by step,
    its log-probabilities of every producer's kept ids (for the `against` estimator; None from
    other engines), checked at the engine boundary (boundary.py) as a record's are; and its
    settings."""
    from tqdm import tqdm

    total = sum(j.schedule.steps + 1 for j in run.jobs)
    with tqdm(total=total, desc="candidate", unit="pos", disable=run.quiet, file=sys.stderr) as bar:
        if isinstance(run.engine, Stepwise):
            return stepped(run, bar)
        got = {i: s for i, _, s in given_by(run, run.jobs, bar.update, Width(run.k))}
    return concat_scores([got[j.index] for j in run.jobs]), None, run.settings


def stepped(run, bar):
    """candidate() of an engine driven step by step: also its log-probabilities of every
    reference producer's kept ids."""
    engine, ref, width = run.engine, run.corpus, Width(run.k)
    at_ids = {n: [] for n in ref.producers}
    index = {n: {(int(a), int(b)): j for j, (a, b) in enumerate(zip(s.prompt, s.pos))}
             for n, s in ref.producers.items()}  # fmt: skip
    parts = []
    with own(run.who, " failed"):  # the engine's own code, driven here: its failures one line
        for job in engine.fit(run.jobs):
            i, tokens, rows = job.index, list(map(int, job.tokens)), []
            for pos, row, nxt in drive(engine, tokens, job.schedule, teacher(tokens)):
                rows.append(engine.top(row, run.k, nxt))
                for n, s in ref.producers.items():
                    j = index[n].get((i, pos))
                    kept = s.ids[j] if j is not None else np.zeros(s.ids.shape[1], np.int32)
                    at_ids[n].append(engine.at(row, kept))
                bar.update()
            parts.append(scores_checked(run.who, job, scores_of(job.schedule, rows), width,
                                        run.vocab, recorded=run.recorded))  # fmt: skip
    full = {n: np.stack(v) for n, v in at_ids.items()}
    return concat_scores(parts), full, run.settings
