"""The engine boundary (scoring/boundary.py, docs/scoring.md "Engines"): an engine is untrusted
input. A plug-in with each fault a real engine has (tests/plugin_engine.py `Faulty`) recording in
place into a reference: one line naming the engine, the prompt and the position; the reference's
bytes unchanged; the prompts finished before the fault kept for the resume. And the file says what
ran: the model and its files, the options; a resume or a merge of anything else is refused."""

import hashlib
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file, save_file
from test_score import failing, record, ref  # noqa: F401  (ref: a fixture)
from test_score_failures import listing

import score
from scoring import boundary
from scoring.compare import LOGPROB_SLACK
from scoring.engines import Job
from scoring.trace import Schedule, ScoreError, Scores, read_trace, write_trace

PLUGIN = ("--engine", "plugin_engine:Faulty")


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# Each fault, and what the one line says of it (the prompt is the second, from `at=1` on).
FAULTS = {
    "shift": "gave prompt 1 position {p1} where position {p0} is due",
    "past": "gave prompt 1 position {last1} where position {last} is due",
    "twice": "gave prompt 1 position {p0} where position {p1} is due",
    "narrow": "gave top-k lists of 10 entries for prompt 1, 20 for the prompts before it",
    "ragged": "top-k arrays of shapes (11, 20)",
    "vocab": "gave token id {vocab} at prompt 1 position",
    "negative": "gave token id -1 at prompt 1 position",
    "repeat": "prompt 1 position {mid} lists id {id} twice",
    "nan": "gave log-probabilities that are not finite (NaN or infinite) at prompt 1 position {last}",
    "logits": "prompt 1 position {p0} lists log-probability",
    "unasked": "gave prompt 2, which it was not asked for",
    "again": "gave prompt 1 twice",
    "index": "gave '1' as a prompt's index",
    "bare": "gave a tuple for prompt 1, not Scores",
    "never": "stopped without giving prompt 1",
    "raise": "failed: RuntimeError: out of memory on device 0",
}


@pytest.mark.parametrize("fault", FAULTS)
def test_what_a_faulty_engine_gives_never_reaches_the_file(fault, ref, model, tmp_path, capsys):  # noqa: F811
    """record --corpus R --out R with a faulty plug-in: R's bytes and producers unchanged, one
    line, and the first prompt (given before the fault) kept in the staging for the resume."""
    r = tmp_path / "ref.parquet"
    shutil.copy(ref, r)
    before = sha(r)
    trace = read_trace(r)
    s0, s1 = trace.schedule(0), trace.schedule(1)
    words = FAULTS[fault].format(p0=s1.ctx - 1, p1=s1.ctx, last=s1.ctx + s1.steps - 1,
                                 last1=s1.ctx + s1.steps, vocab=trace_vocab(model),
                                 mid=s1.ctx - 1 + (s1.steps + 1) // 2,
                                 id=trace.producers["reference"].ids[len(s0.positions), 0])  # fmt: skip
    assert s0.ctx != s1.ctx  # positions of the two prompts differ: a shifted one is told apart
    line = failing(capsys, ["record", "--corpus", r, *PLUGIN, "--model", model, "--set",
                            f"fault={fault}", "--producer", "p2", "--out", r], words)  # fmt: skip
    assert line.startswith("error: --engine plugin_engine:Faulty")
    assert sha(r) == before
    staging = tmp_path / ".ref.parquet.record"
    kept = ["000000.parquet"] + (["000001.parquet"] if fault == "again" else [])  # its first one
    assert f"the {len(kept)} finished prompts are kept" in line
    assert listing(staging) == [*kept, "kern-prompts-record.json"]
    assert listing(tmp_path) == [".ref.parquet.record", "ref.parquet"]  # the lock released


def trace_vocab(model):
    import json

    return json.loads((Path(model) / "config.json").read_text())["vocab_size"]


@pytest.mark.parametrize("fault", ["numpy", "set", "path", "tuple"])
def test_a_describe_json_cannot_hold_is_refused_before_any_forward(fault, ref, model, tmp_path,  # noqa: F811
                                                                   capsys):  # fmt: skip
    r = tmp_path / "ref.parquet"
    shutil.copy(ref, r)
    before = sha(r)
    failing(capsys, ["record", "--corpus", r, *PLUGIN, "--model", model, "--set", f"fault={fault}",
                     "--producer", "p2", "--out", r], "describe()")  # fmt: skip
    assert sha(r) == before and listing(tmp_path) == ["ref.parquet"]


def test_every_fault_is_caught_by_the_plain_checks_too():
    """The boundary's checks as functions of data: each fault of one prompt's Scores refused in
    the words it is told with, the faultless one given back as it is, and the edges taken."""
    job = Job(3, np.arange(20, dtype=np.int32), Schedule(10, 5))
    good = good_prompt(job)
    got = boundary.scores_checked("e", job, good, boundary.Width(4), 50)
    assert np.array_equal(got.ids, good.ids) and np.array_equal(got.prompt, np.full(6, 3))
    assert got.ids.dtype == np.int32 and got.logprob.dtype == np.float64
    two = Scores(good.prompt, good.pos, good.ref_logprob, good.ids[:, :2], good.logprob[:, :2])
    assert boundary.scores_checked("e", job, two, boundary.Width(2), 50).ids.shape == (6, 2)
    edge = Scores(good.prompt, good.pos, good.ref_logprob, np.where(good.ids == good.ids[0, 0], 0,
                  np.where(good.ids == 0, good.ids[0, 0], good.ids)), good.logprob)  # fmt: skip
    assert boundary.scores_checked("e", job, edge, boundary.Width(4), None).ids[0, 0] == 0
    faults = {
        "pos": (dict(pos=good.pos + 1), "e gave prompt 3 position 10 where position 9 is due "
                "(its scored positions are 9 to 14, each once)"),
        "short": (dict(pos=good.pos[:-1]), "e gave prompt 3 no more positions where position 14 "
                  "is due (its scored positions are 9 to 14, each once)"),
        "ids": (dict(ids=np.where(good.ids == good.ids[0, 0], 50, good.ids)),
                "e gave token id 50 at prompt 3 position 9: the model has 50 ids"),
        "negative": (dict(ids=np.where(good.ids == good.ids[1, 1], -1, good.ids)),
                     "e gave token id -1 at prompt 3 position 10: the model has 50 ids"),
        "dup": (dict(ids=np.c_[good.ids[:, :3], good.ids[:, :1]]),
                "e: prompt 3 position 9 lists id 9 twice"),
        "nan": (dict(logprob=np.where(good.logprob == good.logprob[2, 1], np.nan, good.logprob)),
                "e gave log-probabilities that are not finite (NaN or infinite) at prompt 3 "
                "position 11, and 1 of its 6 positions"),
        "fed": (dict(ref_logprob=good.ref_logprob + 9.0), "e gave the fed token a log-probability "
                "of 4.7, above 0, at prompt 3 position 9: a log-probability is the log-softmax of "
                "the logits, not a logit"),
        "logits": (dict(logprob=good.logprob + 3.0), "e: prompt 3 position 9 lists "
                   "log-probability 0.7815 above 0: a top-k table holds log-probabilities (the "
                   "log-softmax of the logits), not logits"),
        "float ids": (dict(ids=good.ids.astype(np.float64)),
                      "e gave prompt 3 token ids of float64, not integers"),
        "shape": (dict(ids=good.ids[:-1]), "e gave prompt 3 top-k arrays of shapes (5, 4) and "
                  "(6, 4) and 6 fed values for its 6 positions"),
        "width": (dict(ids=good.ids[:, :1], logprob=good.logprob[:, :1]),
                  "e gave top-k lists of 1 entries for prompt 3; 4 were asked (at least 2)"),
    }  # fmt: skip
    for name, (change, words) in faults.items():
        bad = Scores(**{f: getattr(good, f) for f in Scores.__slots__} | change)
        with pytest.raises(ScoreError) as e:
            boundary.scores_checked("e", job, bad, boundary.Width(4), 50)
        assert str(e.value) == words, name
    big = Scores(**{f: getattr(good, f) for f in Scores.__slots__} | dict(
        ids=np.where(good.ids == good.ids[0, 0], 2**31, good.ids.astype(np.int64))))  # fmt: skip
    with pytest.raises(ScoreError, match="gave token id 2147483648 at prompt 3 position 9: not an"):
        boundary.scores_checked("e", job, big, boundary.Width(4), None)


def test_an_existing_out_that_is_not_the_corpus_needs_replace(ref, model, tmp_path, capsys):  # noqa: F811
    x = tmp_path / "x.parquet"
    shutil.copy(ref, x)
    before = sha(x)
    argv = ["record", "--corpus", ref, "--engine", "plugin_engine:FullForward", "--model", model,
            "--producer", "p2", "--out", x]  # fmt: skip
    failing(capsys, argv, f"--out {x} exists and is not the --corpus")
    assert sha(x) == before
    assert score.main([*map(str, argv), "--replace", "--quiet"]) == 0
    assert set(read_trace(x).producers) == {"reference", "p2"}


def test_outputs_follow_the_umask_and_links_are_written_through(ref, model, tmp_path):  # noqa: F811
    shared = tmp_path / "shared"
    shared.mkdir()
    target = shared / "ref.parquet"
    shutil.copy(ref, target)
    os.chmod(target, 0o644)
    link = tmp_path / "link.parquet"
    link.symlink_to(target)
    old = os.umask(0o027)
    try:
        assert record("--corpus", link, "--engine", "plugin_engine:FullForward", "--model", model,
                      "--producer", "p2", "--out", link) == 0  # fmt: skip
        assert link.is_symlink() and os.readlink(link) == str(target)
        assert set(read_trace(target).producers) == {"reference", "p2"}
        assert stat.S_IMODE(target.stat().st_mode) == 0o640
        plot, table = tmp_path / "k.png", tmp_path / "k.parquet"
        assert score.main(["judge", str(ref), "--candidate", str(target), "--producer", "p2",
                           "--plot", str(plot), "--out", str(table)]) == 0  # fmt: skip
        assert {stat.S_IMODE(p.stat().st_mode) for p in (plot, table)} == {0o640}
    finally:
        os.umask(old)


def perturb(model):
    """Change one weight of the model in place."""
    (weights,) = Path(model).glob("*.safetensors")
    w = load_file(weights)
    name = next(n for n in sorted(w) if n.endswith("norm.weight"))
    w[name] = w[name] + 1e-3  # Qwen3.5's norms are stored as w in (1 + w), zeros at start
    save_file(w, weights, metadata={"format": "pt"})


def perturbed(model, tmp_path):
    """A copy of the model with one weight changed."""
    copy = tmp_path / "other"
    shutil.copytree(model, copy)
    perturb(copy)
    return copy


def test_a_resume_with_another_model_or_options_is_refused(ref, model, tmp_path, capsys):  # noqa: F811
    """The record stopped after its first prompt; resumed with a copy of the model with one
    weight changed, or other options, it is refused; with the same, it finishes."""
    r = tmp_path / "ref.parquet"
    shutil.copy(ref, r)
    first = ["record", "--corpus", r, *PLUGIN, "--set", "fault=raise", "--producer", "p2",
             "--out", r]  # fmt: skip
    failing(capsys, [*first, "--model", model], "out of memory")
    other = perturbed(model, tmp_path)
    same = [
        "record",
        "--corpus",
        r,
        *PLUGIN,
        "--set",
        "fault=raise",
        "--producer",
        "p2",
        "--out",
        r,
    ]
    failing(capsys, [*same, "--model", other], "holds an unfinished record with other settings")
    failing(capsys, [*same, "--model", model, "--set", "at=2"], "with other settings")
    # the same: resumed from its first prompt, the second one given (the fault comes at the
    # second prompt a run gives, and this run gives one)
    assert score.main([*map(str, same), "--model", str(model), "--quiet"]) == 0
    assert set(read_trace(r).producers) == {"reference", "p2"}


def test_the_producer_settings_say_what_ran(ref, model, tmp_path):  # noqa: F811
    x = tmp_path / "x.parquet"
    assert record("--corpus", ref, "--engine", "plugin_engine:FullForward", "--model", model,
                  "--set", "dtype=float32", "--producer", "p2", "--out", x) == 0  # fmt: skip
    run = read_trace(x).meta["producers"]["p2"]["run"]
    files = {p.name: sha(p) for p in Path(model).iterdir() if p.name == "config.json"
             or p.suffix == ".safetensors"}  # fmt: skip
    assert run == dict(engine="plugin_engine:FullForward", flags={},
                       model=dict(path=str(model), sha256=files | {
                           "generation_config.json": sha(Path(model) / "generation_config.json"),
                           "tokenizer_config.json": sha(Path(model) / "tokenizer_config.json")}),
                       options={"dtype": "float32"})  # fmt: skip
    settings = read_trace(ref).meta["producers"]["reference"]
    assert settings["run"]["flags"] == {} and settings["run"]["engine"] == "transformers"


def test_a_corpus_whose_tokens_changed_under_the_same_metadata_does_not_resume(ref, model,  # noqa: F811
                                                                               tmp_path, capsys):  # fmt: skip
    r = tmp_path / "ref.parquet"
    shutil.copy(ref, r)
    argv = ["record", "--corpus", r, *PLUGIN, "--model", model, "--set", "fault=raise",
            "--producer", "p2", "--out", r]  # fmt: skip
    failing(capsys, argv, "out of memory")
    t = read_trace(r)
    t.prompts[1].tokens = t.prompts[1].tokens.copy()
    t.prompts[1].tokens[3] += 1
    from scoring.trace import trace_tables

    write_trace(r, t.decode, t.meta, trace_tables(t))
    failing(capsys, argv, "holds an unfinished record with other settings")


def test_merge_refuses_shards_of_two_models(out, model, tmp_path, capsys):
    """Shard 0 recorded, then the model's weights changed in place (the same path), then shard
    1: the files record other sha256s, and merge refuses them."""
    m = tmp_path / "m"
    shutil.copytree(model, m)
    parts = [tmp_path / f"s{i}.parquet" for i in range(2)]
    for i, p in enumerate(parts):
        if i == 1:
            perturb(m)
        assert record("--rows", out, "--split", "smoke", "--model", m, "--sources",
                      "gsm8k,humaneval", "--length", 4, "--shard", f"{i}/2", "--out", p) == 0  # fmt: skip
    failing(capsys, ["merge", *parts, "--out", tmp_path / "m.parquet"], "differ from")
    assert not (tmp_path / "m.parquet").exists()


@pytest.mark.parametrize("flag", [("--batch", "2"), ("--device", "cpu"), ("--chunk", "8"),
                                  ("--kv-dtype", "bfloat16"), ("--dtype", "float32")])  # fmt: skip
def test_a_flag_an_engine_does_not_take_is_refused(flag, ref, model, tmp_path, capsys):  # noqa: F811
    """A plug-in takes its options through --set alone; transformers has no --batch."""
    argv = ["record", "--corpus", ref, "--engine", "plugin_engine:FullForward", "--model", model,
            "--producer", "x", "--out", tmp_path / "x.parquet", *flag]  # fmt: skip
    failing(capsys, argv, f"--engine plugin_engine:FullForward does not use {flag[0]}")
    if flag[0] == "--batch":
        argv[4] = "transformers"
        failing(capsys, argv, "--engine transformers does not use --batch")


def test_transformers_refuses_an_option_it_does_not_take_and_records_those_it_does(ref, model,  # noqa: F811
                                                                                    tmp_path, capsys):  # fmt: skip
    x = tmp_path / "x.parquet"
    base = ["--corpus", ref, "--model", model, "--producer", "eager", "--out", x]
    failing(capsys, ["record", *base, "--set", "flavour=1"], "unexpected keyword argument")
    failing(capsys, ["record", *base, "--set", "chunk=8"], "takes it as --chunk")
    failing(capsys, ["record", *base, "--set", "max_memory={}"], "needs --set device_map")
    assert record(*base, "--set", "attn_implementation=eager", "--set", "device_map=cpu") == 0
    t = read_trace(x)
    d = t.meta["producers"]["eager"]
    assert d["attn_implementation"] == "eager" and d["device_map"] in ("cpu", {"": "cpu"})
    # the same numbers as the default placement and attention, to float rounding
    a, b = t.producers["reference"], t.producers["eager"]
    assert np.abs(a.ref_logprob - b.ref_logprob).max() < 1e-4


def test_a_candidate_at_another_top_k_is_judged_with_the_difference_named(ref, model, tmp_path,  # noqa: F811
                                                                          capsys):  # fmt: skip
    x = tmp_path / "x.parquet"
    assert record("--corpus", ref, "--model", model, "--producer", "k5", "--top-k", "5",
                  "--chunk", "64", "--out", x) == 0  # fmt: skip
    capsys.readouterr()
    score.main(["judge", str(ref), "--candidate", str(x), "--producer", "k5"])
    out = capsys.readouterr().out
    assert "top-k differs: the candidate keeps 5 ids a position, reference 20" in out


def test_a_corpus_of_another_tokenizer_is_refused(ref, model, tmp_path, capsys):  # noqa: F811
    """The corpus records its tokenizer's vocabulary; a model whose tokenizer gives two ids each
    other's strings (the same size, the same weights) is refused before any forward."""
    import json

    other = tmp_path / "other"
    shutil.copytree(model, other)
    spec = json.loads((other / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[40:42]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    x = tmp_path / "x.parquet"
    failing(capsys, ["record", "--corpus", ref, "--model", other, "--producer", "x", "--out", x],
            "is not the tokenizer")  # fmt: skip
    failing(capsys, ["judge", ref, "--model", other], "is not the tokenizer")
    assert not x.exists()


def good_prompt(job, k=4, vocab=50, seed=0):
    """Scores an honest engine gives for `job`: log-probabilities of a random distribution."""
    n = len(job.schedule.positions)
    lp = np.log(np.random.default_rng(seed).dirichlet(np.ones(vocab), n))
    ids = np.argsort(-lp, 1)[:, :k]
    return Scores(np.zeros(n, np.int32), np.asarray(job.schedule.positions, np.int32), lp[:, 7],
                  ids.astype(np.int32), np.take_along_axis(lp, ids, 1))  # fmt: skip


def test_the_stream_an_engine_gives_is_checked_as_it_comes():
    """boundary.given on items as data: the honest stream passes whole and in the engine's
    order; each fault of the stream is one ScoreError naming the engine, after the prompts given
    before it (those a record stages)."""
    jobs = [Job(i, np.arange(30 + i, dtype=np.int32), Schedule(20 + i, 6)) for i in range(3)]
    honest = [(j.index, good_prompt(j, seed=j.index)) for j in reversed(jobs)]

    def run(items, width=None):
        seen = []
        try:
            for i, _, _ in boundary.given("e", jobs, items, width or boundary.Width(4), 50):
                seen.append(i)
        except ScoreError as e:
            return seen, str(e)
        return seen, None

    assert run(iter(honest)) == ([2, 1, 0], None)

    def raising():
        yield honest[0]
        raise MemoryError("no room")

    faults = {
        "unasked": ([honest[0], (7, honest[1][1])], "gave prompt 7, which it was not asked for"),
        "twice": ([honest[0], honest[0]], "gave prompt 2 twice"),
        "never": (honest[:2], "stopped without giving prompt 0"),
        "index": ([honest[0], (1.0, honest[1][1])], "gave 1.0 as a prompt's index"),
        "bool": ([honest[0], (True, honest[2][1])], "gave True as a prompt's index"),
        "shape": ([honest[0], (1,)], "gave tuple"),
        "raise": (raising(), "e failed: MemoryError: no room"),
        "other's": ([honest[0], (1, honest[2][1])], "gave prompt 1 position 19 where position 20"),
        "width": ([honest[0], (1, good_prompt(jobs[1], k=3))], "3 entries for prompt 1, 4 for"),
    }
    faults |= {
        "none": ([], "e stopped without giving prompt 0 and 2 more"),
        "pair": ([honest[0], (1, 2, 3)], "e gave tuple '(1, 2, 3)', not (index, Scores)"),
    }
    for name, (items, words) in faults.items():
        seen, error = run(iter(items))
        assert error is not None and error.startswith("e ") and words in error, (name, error)
        assert seen == {"never": [2, 1], "none": []}.get(name, [2]), name
    # the width a resumed record's staged prompts fixed holds for the prompts given now
    seen, error = run(iter(honest), boundary.Width(6, 5))
    assert seen == [] and "gave top-k lists of 4 entries for prompt 2, 5 for the prompts" in error


def test_a_sampled_continuation_is_checked_against_its_prompt_and_the_stop_ids():
    job = Job(0, np.arange(10, dtype=np.int32), Schedule(10, 3), np.zeros(4), (5, 9))
    s = good_prompt(job)
    cont = np.r_[job.tokens, [1, 2, 3, 4]].astype(np.int32)

    def check(tokens):
        (got,) = boundary.given("e", [job], iter([(0, tokens, s)]), boundary.Width(4), 50,
                                sampled=True)  # fmt: skip
        return got[1]

    assert np.array_equal(check(cont), cont) and check(cont).dtype == np.int32
    assert check(np.r_[job.tokens, [0, 0, 0, 49]])[-1] == 49  # id 0 and the last id are ids
    bad = {
        "short": (cont[:-1], "not the 14 ids of its prompt and continuation"),
        "prompt": (np.r_[cont[:3] + 1, cont[3:]], "with token 1 at position 0, where the prompt"),
        "stop": (
            np.r_[cont[:11], [9], cont[12:]],
            "sampled token 9 at prompt 0 position 11: a stop",
        ),
        "vocab": (np.r_[cont[:13], [50]], "sampled token 50 at prompt 0 position 13: not an id"),
        "floats": (cont.astype(np.float64), "tokens of float64"),
    }
    bad["pair"] = (None, "")
    for name, (tokens, words) in bad.items():
        if tokens is None:
            with pytest.raises(
                ScoreError,
                match=r"e gave tuple '\(0, Scores\(prompt=array.*', not \(index, tokens, Scores\)$",
            ):
                list(boundary.given("e", [job], iter([(0, s)]), boundary.Width(4), 50,
                                    sampled=True))  # fmt: skip
            continue
        with pytest.raises(ScoreError) as e:
            check(tokens)
        assert str(e.value).startswith("e ") and words in str(e.value), (name, str(e.value))


def test_the_boundarys_edges_in_exact_words():
    """Each message in full where a word of it could go wrong, and the edges of each check: one
    prompt missing or three, a position past the schedule, one array of the wrong shape alone,
    the first bad id of a row named, a token twice that is not the row's least, int32's last id,
    what is given back."""
    jobs = [Job(i, np.arange(30, dtype=np.int32), Schedule(20, 6)) for i in range(3)]
    good = [good_prompt(j, seed=j.index) for j in jobs]

    def error(items, vocab=50, hint=lambda i: ""):
        with pytest.raises(ScoreError) as e:
            list(boundary.given("e", jobs, iter(items), boundary.Width(4), vocab, nonfinite=hint))
        return str(e.value)

    assert error([(0, good[0]), (1, good[1])]) == "e stopped without giving prompt 2"
    assert error([]) == "e stopped without giving prompt 0 and 2 more"
    assert error([(0, good[0])]) == "e stopped without giving prompt 1 and 1 more"
    assert error([(0, "x")]) == "e gave a str for prompt 0, not Scores (scoring.trace.Scores)"
    s = good[0]

    def bent(**change):
        return Scores(**{f: getattr(s, f) for f in Scores.__slots__} | change)

    words = error([(0, bent(logprob=[["a"] * 4] * 7))])
    assert words.startswith("e gave prompt 0 with arrays that are not numbers (could not convert")
    longer = bent(pos=np.r_[s.pos, s.pos[-1] + 1])
    assert error([(0, longer)]) == ("e gave prompt 0 position 26 where position none is due (its "
                                    "scored positions are 19 to 25, each once)")  # fmt: skip
    for change in (dict(logprob=s.logprob[:, :3]), dict(ref_logprob=s.ref_logprob[:-1]),
                   dict(ids=s.ids[0])):  # fmt: skip
        assert "top-k arrays of shapes" in error([(0, bent(**change))])
    row = s.ids.copy()
    row[3] = [0, 60, 7, 8]
    assert (
        error([(0, bent(ids=row))])
        == "e gave token id 60 at prompt 0 position 22: the model has 50 ids"
    )
    row = s.ids.copy()
    row[2] = [row[2, 1], row[2, 0], row[2, 1], row[2, 3]]
    assert error([(0, bent(ids=row))]) == "e: prompt 0 position 21 lists id 30 twice"
    nan = bent(logprob=np.where(s.logprob == s.logprob[4, 0], np.nan, s.logprob))
    assert error([(0, nan)], hint=lambda i: f" (row {i})").endswith(
        "and 1 of its 7 positions (row 0)"
    )
    last = bent(ids=np.where(s.ids == s.ids[0, 0], 2**31 - 1, s.ids))
    (got,) = boundary.given("e", jobs[:1], iter([(0, last)]), boundary.Width(4), None)
    assert got[2].ids[0, 0] == 2**31 - 1 and got[2].prompt.dtype == np.int32
    assert np.array_equal(got[2].ref_logprob, s.ref_logprob)
    sampled = Job(0, np.arange(5, dtype=np.int32), Schedule(5, 1), np.zeros(2), ())
    tokens = np.r_[sampled.tokens, [2**31 - 1, 2**31 - 1]].astype(np.int64)
    assert boundary.tokens_checked("e", sampled, tokens, None)[-1] == 2**31 - 1
    with pytest.raises(
        ScoreError, match=r"^e sampled token 2147483648 at prompt 0 position 6: not"
    ):
        boundary.tokens_checked("e", sampled, np.r_[tokens[:-1], 2**31], None)


@pytest.mark.parametrize("command", ["record --corpus", "judge --model"])
def test_an_engine_that_cannot_say_its_vocabulary_is_held_to_the_corpuss(command, ref, model,  # noqa: F811
                                                                         tmp_path, capsys):  # fmt: skip
    """A plug-in whose vocab_size() is None (as a served engine's is) giving id 1261 on a
    corpus that records its model's 261 ids: refused, naming the prompt and the position, as
    int32 alone would not."""
    r = tmp_path / "ref.parquet"
    shutil.copy(ref, r)
    before = sha(r)
    vocabulary = read_trace(r).meta["vocabulary"]
    assert vocabulary["ids"] == vocabulary["size"] == trace_vocab(model) == 261
    plugin = ["--engine", "plugin_engine:Unruly", "--model", model, "--set",
              "fault=an id past the corpus's vocabulary"]  # fmt: skip
    argv = {"record --corpus": ["record", "--corpus", r, *plugin, "--producer", "p2", "--out", r],
            "judge --model": ["judge", r, *plugin]}[command]  # fmt: skip
    at = read_trace(r).schedule(0).ctx - 1 + 3
    failing(capsys, argv, f"--engine plugin_engine:Unruly gave token id 1261 at prompt 0 position "
            f"{at}: the corpus's model has 261 ids (what the corpus records of its vocabulary; "
            "the engine does not say its own)")  # fmt: skip
    assert sha(r) == before and listing(tmp_path) == ["ref.parquet"]


def test_each_bound_of_the_boundary_at_its_edge():
    """Every bound with the value just inside it taken and the one just outside refused, so
    that a check loosened by any amount fails here: the fed token's log-probability at
    LOGPROB_SLACK and the next float above; the kept probabilities summing to the greatest
    float32 log-probability within 1 + LOGPROB_SLACK and the next; an id one below the model's
    count and at it, the same with the count the corpus records, int32's last id and one past."""
    job = Job(3, np.arange(20, dtype=np.int32), Schedule(10, 5))
    good = good_prompt(job)
    slack = LOGPROB_SLACK

    def said(vocab=50, recorded=None, **change):
        s = Scores(**{f: getattr(good, f) for f in Scores.__slots__} | change)
        try:
            boundary.scores_checked("e", job, s, boundary.Width(4), vocab, recorded=recorded)
        except ScoreError as e:
            return str(e)
        return "taken"

    def fed(value):
        f = good.ref_logprob.copy()
        f[2] = value
        return f

    assert said(ref_logprob=fed(slack)) == "taken"
    assert said(ref_logprob=fed(np.nextafter(slack, 1))) == (
        "e gave the fed token a log-probability of 1e-05, above 0, at prompt 3 position 11: a "
        "log-probability is the log-softmax of the logits, not a logit")  # fmt: skip

    def whole(x):  # row 0 one entry of log-probability x (float32, as a trace keeps it), the
        lp = good.logprob.copy()  # others next to nothing
        lp[0] = [x, -200, -201, -202]
        return lp

    x = np.float32(np.log1p(slack))
    up, down = (
        (lambda v: np.nextafter(v, np.float32(1))),
        (lambda v: np.nextafter(v, np.float32(-1))),
    )
    while np.exp(np.float64(x)) > 1 + slack:
        x = down(x)
    while np.exp(np.float64(up(x))) <= 1 + slack:
        x = up(x)
    assert said(logprob=whole(x)) == "taken"
    assert said(logprob=whole(up(x))) == (
        "e: prompt 3 position 9 lists kept probabilities summing to 1.00001, above 1: a top-k "
        "table holds log-probabilities (the log-softmax of the logits), not logits")  # fmt: skip
    # a value past the slack is named as that (the sum is past 1 + the slack too)
    assert said(logprob=whole(np.nextafter(np.float32(slack), np.float32(1)))).startswith(
        "e: prompt 3 position 9 lists log-probability 1e-05 above 0"
    )

    def with_id(v):
        j = next(j for j in range(len(good.ids)) if v not in good.ids[j])
        ids = good.ids.astype(np.int64)
        ids[j, 2] = v
        return ids, int(good.pos[j])

    ids, at = with_id(49)
    assert said(ids=ids) == said(vocab=None, recorded=50, ids=ids) == "taken"
    ids, at = with_id(50)
    assert said(ids=ids) == f"e gave token id 50 at prompt 3 position {at}: the model has 50 ids"
    assert said(vocab=None, recorded=50, ids=ids) == (
        f"e gave token id 50 at prompt 3 position {at}: the corpus's model has 50 ids (what the "
        "corpus records of its vocabulary; the engine does not say its own)")  # fmt: skip
    assert said(vocab=None, recorded=51, ids=ids) == "taken"
    ids, at = with_id(2**31 - 1)
    assert said(vocab=None, ids=ids) == "taken"
    ids, at = with_id(2**31)
    assert said(vocab=None, ids=ids) == (
        f"e gave token id 2147483648 at prompt 3 position {at}: not an int32 id"
    )


@pytest.mark.parametrize(
    "method, gives, words",
    [
        ("vocab_size", "261", "e: vocab_size() gave '261' (str), not a count of token ids"),
        ("vocab_size", True, "e: vocab_size() gave True (bool), not a count of token ids"),
        ("vocab_size", 0, "e: vocab_size() gave 0 (int), not a count of token ids"),
        ("vocabulary", 261, "e: vocabulary() gave 261 (int), not a list of token strings"),
        ("vocabulary", [b"a"], "e: vocabulary() gave [b'a'] (list), not a list of token strings"),
        ("context", 8.5, "e: context() gave 8.5 (float), not a count of tokens or None"),
        ("context", SystemExit(2), "e: context() failed: SystemExit: 2"),
        ("vocabulary", ValueError("no tokenizer"), "e: vocabulary() failed: ValueError: no tokenizer"),
    ],
)  # fmt: skip
def test_what_an_engine_says_of_its_model_is_checked_for_its_kind(method, gives, words):
    """vocab_size(), vocabulary() and context() as boundary.py reads them: a value of another
    kind, or the method raising (a sys.exit included), is one line; what fits is given back."""

    class Engine:
        def __getattr__(self, name):
            def said():
                if isinstance(gives, BaseException):
                    raise gives
                return gives

            return said

    with pytest.raises(ScoreError) as e:
        getattr(boundary, method)(Engine(), "e")
    assert str(e.value).startswith(words), str(e.value)
    fits = {"vocab_size": 261, "vocabulary": ["a", None], "context": 4096}[method]
    engine = type("Fits", (), {method: lambda self: fits})()
    assert getattr(boundary, method)(engine, "e") == fits
