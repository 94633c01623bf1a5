"""A candidate behind an OpenAI-compatible server: the engine as it is deployed, over HTTP
(docs/scoring.md "Served engines").

`--model` is the server's API base (`http://host:port/v1`); every request is a POST to its
`/completions` with the prompt as token ids, temperature 0, and `logprobs` entries asked as token
ids. Two ways, chosen with `--set way=forced|stepwise` or detected:

- forced: vLLM's server started with this project's logits processor
  (`--logits-processors scoring.engines.vllm_processors:ForceTokens`). Each prompt is one request: tokens
  [0, ctx) its prompt, the rest forced one per decode step through `vllm_xargs` (the processor
  leaves only the forced token; the log-probabilities are the raw ones, taken before it runs), as
  the in-process vLLM engine does (scoring/engines/vllm.py).
- stepwise: any server. Per scored position one request of the tokens up to it, `max_tokens` 1,
  the corpus's next token made the one sampled by `logit_bias` (so that its own log-probability
  is returned whatever its rank), relying on the server's prefix cache for the tokens before.

Detection: ForceTokens refuses a malformed forcing list when a request is admitted, so a server
that has it loaded answers a probe with that list with an error naming FORCE_KEY; any other
answer means stepwise. Token ids come either as llama.cpp's server gives them (`logprobs.content`
items with an `id`) or as vLLM's legacy lists with `return_tokens_as_token_ids` ("token_id:123");
a server giving token strings only is refused: a string can stand for several ids, so its
entries cannot be matched with the reference's ids.

HTTP is urllib3's (pinned in the `served` extra, pyproject.toml): a pool of kept-alive
connections, one per prompt in flight, that follows no redirect, reads an answer as it comes and
retries nothing by itself. It was chosen over httpx (which the score extra brings through
huggingface_hub) because it is synchronous and small (no h11, anyio or sniffio), and over the
standard library's urllib because that opens a new connection for every request (a TCP, and
against a hosted endpoint a TLS, handshake at every position; bench/served_bench.py measures it)
and follows redirects with the key. `batch` prompts are in flight at once, each on a daemon
thread, their results yielded as they finish; a record that stops (an error, Ctrl-C, SIGTERM)
cuts the requests in flight and waits for none of them.

What the server says is untrusted: every request has a deadline for the whole of it (`timeout`,
however slowly the server sends), an answer is refused past a size (ANSWER_BYTES), a redirect is
refused (the key goes to the API base's origin alone), and every text of the server's that a
message shows or the trace records has the key removed in every form a server may echo it
(`short`, scoring/engines/keys.py); a 401's or 403's text is not shown at all. 429, 5xx and
every transport failure (a refused, reset or dropped connection, a body cut short or malformed, a
garbled status line, the deadline) are retried with a doubling backoff of at most BACKOFF_MAX
seconds, `retries` times; any other 4xx is one line with the server's message. The API key is
read from KERN_API_KEY (or OPENAI_API_KEY) and sent as a bearer token; it is never recorded or
printed, and neither is a key in the URL: the URL is recorded and shown as keys.shown_url gives
it, and one holding a user, password, query or fragment is refused (`api_base`).
"""

import math
import queue
import re
import socket
import threading
import time
import urllib.parse
import weakref
from contextlib import contextmanager
from http.client import HTTPException

import numpy as np
import orjson
import urllib3

from scoring.engines import FORCE_KEY, FORCE_REFUSAL, Engine, package, scores_of
from scoring.engines.keys import KEY_MIN, VARIABLES, api_key, shown_url, unkeyed
from scoring.trace import ScoreError

FORCE_CLASS = "scoring.engines.vllm_processors:ForceTokens"
TIE_MARGIN = 8  # entries asked beyond k: exact ties at the k-th place are then ordered by id
BIAS = 100  # OpenAI's largest logit_bias: makes the corpus's next token the one sampled
BACKOFF = 0.5  # seconds before the first retry; doubled each time
BACKOFF_MAX = 30.0  # seconds: the longest wait between two tries
TIMEOUT_MAX = 86400.0  # seconds: a day; --set timeout above it is a mistake (or 1e308)
# An answer's size at most: a step's entries take about 2 KB in llama.cpp's content form (k + 8
# of them, each with its text and bytes) and 1 KB in vLLM's lists; 64 KB a step asked
# (max_tokens), and 1 MB for any answer, leave room for servers that say more, and stop a body
# without end long before it fills the memory.
STEP_BYTES, ANSWER_BYTES = 64 * 1024, 1024 * 1024
READ = 64 * 1024  # bytes a read takes at most
BATCH_MAX = (
    1024  # prompts in flight at most: a server serves fewer at once; a pool of 1e9 is a typo
)
TICK = 0.05  # seconds between two looks at the requests' deadlines
WAYS = ("auto", "forced", "stepwise")
TOKEN_ID = re.compile(r"token_id:(-?\d+)")
ID_END = 2**31  # ids are int32 in the trace (TRACE.md)
# Every way a request can fail on its way (a connection refused, reset or dropped, a body cut
# short or not what its headers say, a garbled status line, a deadline): each is retried alike.
TRANSPORT = (urllib3.exceptions.HTTPError, HTTPException, OSError)


class Late(Exception):
    """A request past its deadline."""


class TooLong(Exception):
    """An answer past its size."""


class Deadlines:
    """The connections of the requests in flight and when each must be done. urllib3's timeouts
    bound each read, not a request: a thread looks every TICK and shuts down the socket of a
    request past its deadline, so that a server sending a byte at a time cannot hold one longer;
    `cut` shuts them all at once, when a record stops. The thread ends with its Deadlines."""

    def __init__(self):
        self.lock, self.local = threading.Lock(), threading.local()
        self.due = {}  # connection -> (its request's deadline (time.monotonic()), the request)
        threading.Thread(target=watch, args=(weakref.ref(self),), daemon=True,
                         name="openai-deadlines").start()  # fmt: skip

    @contextmanager
    def watched(self, deadline):
        """The connections this thread opens requests on within, watched until `deadline`."""
        mine = self.local.request = (deadline, object())
        self.local.conns = []
        try:
            yield
        finally:
            with self.lock:
                for conn in self.local.conns:
                    if self.due.get(conn) is mine:  # not since taken by another request
                        del self.due[conn]

    def add(self, conn):
        with self.lock:
            self.due[conn] = self.local.request
            self.local.conns.append(conn)

    def cut(self, now=math.inf):
        """Shut down the sockets of the requests due by `now` (all of them by default)."""
        with self.lock:
            for conn, (t, _) in self.due.items():
                if t <= now:
                    try:
                        conn.sock.shutdown(socket.SHUT_RDWR)
                    except (AttributeError, OSError):  # not connected yet, or closed already
                        pass


def watch(deadlines):
    """Deadlines' thread: every TICK, the requests past their deadline cut, while it lives."""
    while (d := deadlines()) is not None:
        d.cut(time.monotonic())
        del d
        time.sleep(TICK)


def api_base(model):
    """--model's URL and its parts; one line for a URL that is not a server's, or that holds
    more than its API base: a user or password, a query, a fragment (docs/scoring.md "Served
    engines": the URL is recorded and shown, so no part of it may hold a key)."""
    url = str(model).rstrip("/")
    shown = shown_url(url)
    if not re.match(r"https?://[^/]", url):
        raise ScoreError(f"--model {shown}: not a server's URL (--engine openai takes the API "
                         "base, e.g. http://127.0.0.1:8000/v1)")  # fmt: skip
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # raises for a port that is not one
    except ValueError as e:
        raise ScoreError(f"--model {shown}: not a server's URL ({unkeyed(str(e))})") from None
    held = [what for what, there in (("a user or password", "@" in parts.netloc),
                                     ("a query", parts.query), ("a fragment", parts.fragment))
            if there]  # fmt: skip
    if held:
        raise ScoreError(f"--model {shown}: the URL held {' and '.join(held)} as well, left out "
                         "here: the URL is recorded and shown, and no query is sent; give the "
                         f"API base alone, and the key in {VARIABLES[0]}, which is sent but "
                         "never recorded")  # fmt: skip
    return url, parts


def pool_of(url, batch, deadlines):
    """Kept-alive connections to the server of `url`: `batch` of them kept (one a prompt in
    flight; a probe's is dropped), each request's connection watched by `deadlines`."""
    pool = urllib3.connection_from_url(url, maxsize=batch, block=False, retries=False)

    class Watched(pool.ConnectionCls):
        def request(self, *args, **kwargs):
            deadlines.add(self)
            return super().request(*args, **kwargs)

    pool.ConnectionCls = Watched
    return pool


class OpenAI(Engine):
    """A server's /completions. Settings (`--set`): way (auto, forced, stepwise), served_model
    (the name the server serves; default: its only one), max_logprobs (the most entries the
    server gives a step, at least 2: the trace then keeps min(k, max_logprobs)), timeout (seconds
    a request may take, at most a day: 600), retries (4). `--batch`: the prompts in flight at
    once (1)."""

    FLAGS = ("batch",)

    def __init__(self, model, batch=None, way="auto", served_model=None, max_logprobs=None,
                 timeout=600, retries=4):  # fmt: skip
        url, parts = api_base(model)
        batch = 1 if batch is None else batch
        if batch < 1:
            raise ScoreError("--batch must be at least 1")
        if batch > BATCH_MAX:
            raise ScoreError(f"--batch {batch}: at most {BATCH_MAX} prompts in flight (each holds "
                             "a connection and a thread)")  # fmt: skip
        if way not in WAYS:
            raise ScoreError(f"--set way={way}: must be one of {', '.join(WAYS)}")
        for name, v, low in (("max_logprobs", max_logprobs, 2), ("retries", retries, 0)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < low):
                raise ScoreError(
                    f"--set {name}={v}: must be an integer of at least {low}"
                    + ("; a trace's top-k lists hold at least 2 entries (TRACE.md): start the "
                       "server allowing more (vLLM: --max-logprobs) and give that number"
                       if name == "max_logprobs" else "")
                )  # fmt: skip
        if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                or not 0 < timeout <= TIMEOUT_MAX):  # fmt: skip
            raise ScoreError(f"--set timeout={timeout}: must be a number of seconds above 0 and "
                             f"at most {TIMEOUT_MAX:g} (a day)")  # fmt: skip
        # self.url is the URL as shown and recorded (keys.shown_url): requests go to the pool's
        # origin, at self.api
        self.url, self.batch, self.timeout = shown_url(url), batch, float(timeout)
        self.shown, self.retries = self.url, retries
        self.api = parts.path.rstrip("/")
        self.root = self.api.removesuffix("/v1")  # where the server's own paths are
        self.max_logprobs = max_logprobs
        self.key_from, key = api_key()
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.key_from:
            if not re.fullmatch(r"[\x21-\x7e]+", key):
                raise ScoreError(f"{self.key_from} holds a space, a line end or another character "
                                 "an HTTP header cannot carry (a key file with Windows line "
                                 "ends?): set it to the key alone")  # fmt: skip
            if len(key) < KEY_MIN:
                raise ScoreError(f"{self.key_from} holds a key of {len(key)} characters, fewer "
                                 f"than {KEY_MIN}: so short a key cannot be told from other text "
                                 "to keep it out of what is shown; give the server a longer "
                                 "one")  # fmt: skip
            self.headers["Authorization"] = f"Bearer {key}"
        self.deadlines = Deadlines()
        try:
            self.pool = pool_of(url, batch, self.deadlines)
        except ValueError as e:  # urllib3's LocationParseError, which shows the whole URL
            raise ScoreError(f"--model {self.url}: not a server's URL "
                             f"({unkeyed(str(e).replace(url, self.url))})") from None  # fmt: skip
        self.served = self.served_model(served_model)
        self.server = self.server_version()
        self.way = self.detect() if way == "auto" else way
        if self.way == "forced" and way == "forced" and not self.forces():
            raise ScoreError(f"--set way=forced: the server at {self.url} does not force tokens; "
                             f"start vLLM's server with --logits-processors {FORCE_CLASS} "
                             "(this project installed in its environment), or use "
                             "--set way=stepwise")  # fmt: skip
        self.detected = way == "auto"

    # HTTP

    def request(self, path, body=None, retries=None, where="", stop=None, root=False):
        """The JSON a GET (body None) or POST of `path` (under the API base, or the server's
        `root`) answers; retried on 429, 5xx and transport failures; anything else one
        ScoreError line. `stop`, when set, ends it before its next try."""
        retries = self.retries if retries is None else retries
        target = (self.root if root else self.api) + path
        cap = ANSWER_BYTES + STEP_BYTES * (body or {}).get("max_tokens", 0)
        data = None if body is None else orjson.dumps(body)
        for attempt in range(retries + 1):
            if stop is not None and stop.is_set():
                raise ScoreError("stopped")
            deadline = time.monotonic() + self.timeout
            try:
                status, text, location = self.exchange(target, data, deadline, cap)
            except TooLong:
                raise ScoreError(f"the server at {self.url} answered {path}{where} "
                                 f"with more than {cap:,} bytes, more than any answer to it "
                                 "takes") from None  # fmt: skip
            except (Late, *TRANSPORT) as e:
                # urllib3's NewConnectionError (a connection refused) is a ConnectTimeoutError
                late = (isinstance(e, (Late, urllib3.exceptions.ReadTimeoutError))
                        or type(e) is urllib3.exceptions.ConnectTimeoutError
                        or time.monotonic() >= deadline)  # fmt: skip
                why = f"no answer within {self.timeout:g} s" if late else transport(e)
            else:
                if 300 <= status < 400:
                    raise ScoreError(f"the server at {self.url} redirected {path} to "
                                     f"{short(location)} (HTTP {status}): redirects are not "
                                     "followed, so that the key goes to no other server; give "
                                     "the API base the server answers at as --model")  # fmt: skip
                if 200 <= status < 300:
                    try:
                        return orjson.loads(text)
                    except orjson.JSONDecodeError:
                        raise ScoreError(f"the server at {self.url} answered {path} "
                                         f"with something that is not JSON: {short(text)}"
                                         ) from None  # fmt: skip
                if status in (401, 403):  # its text is not shown: it may hold the key
                    raise ScoreError(f"the server at {self.url} refused {path}{where} "
                                     f"(HTTP {status}): {self.unauthorised()}")  # fmt: skip
                if status != 429 and status < 500:
                    raise ScoreError(f"the server at {self.url} refused {path}{where} "
                                     f"(HTTP {status}): {message(text)}")  # fmt: skip
                why = f"HTTP {status}: {message(text)}"
            if attempt < retries:
                wait = min(BACKOFF * 2 ** min(attempt, 16), BACKOFF_MAX)
                # a prompt's thread wakes when the record stops; the main thread's sleep ends at
                # a signal
                stop.wait(wait) if stop is not None else time.sleep(wait)
        tries = f" after {retries + 1} tries" if retries else ""
        raise ScoreError(f"cannot reach the server at {self.url}{where}{tries}: {why}")

    def unauthorised(self):
        """What a 401 or 403 says in place of the server's text, which may echo the key."""
        if self.key_from is None:
            return (f"no key was sent; set {VARIABLES[0]} to this server's key (what the server "
                    "said is not shown: it may echo a key)")  # fmt: skip
        return (
            f"it did not take the key in {self.key_from}; check that it is this server's, and "
            "allowed this model (what the server said is not shown: it may echo the key)"
        )

    def exchange(self, target, data, deadline, cap):
        """(status, body, Location) of one request, read as it comes: Late past `deadline`,
        TooLong past `cap` bytes; its connection back in the pool when it was whole."""
        left = max(deadline - time.monotonic(), 0.001)
        with self.deadlines.watched(deadline):
            r = self.pool.urlopen("GET" if data is None else "POST", target, body=data,
                                  headers=self.headers, redirect=False, retries=False,
                                  preload_content=False,
                                  timeout=urllib3.Timeout(left, left))  # fmt: skip
            try:
                text = bytearray()
                while chunk := r.read1(READ):
                    text += chunk
                    if len(text) > cap:
                        raise TooLong
                    if time.monotonic() >= deadline:
                        raise Late
                if time.monotonic() >= deadline:  # cut by `deadlines`: the body is not whole
                    raise Late
            except BaseException:
                r.close()
                raise
            finally:
                r.release_conn()
        return r.status, bytes(text), r.headers.get("Location")

    def served_model(self, name):
        """The model name requests carry: `name`, which the server must list, or its only one."""
        got = self.request("/models", retries=0)
        listed = got.get("data") if isinstance(got, dict) else None
        if not isinstance(listed, list) or not all(isinstance(m, dict) for m in listed):
            raise ScoreError(f"the server at {self.url} answered /models with something that is "
                             f"not a list of models ({{\"data\": [{{\"id\": NAME}}, ...]}}): "
                             f"{short(got)}")  # fmt: skip
        models = [m.get("id") for m in listed]
        if not models:
            raise ScoreError(f"the server at {self.url} lists no model at /models")
        if not all(isinstance(m, str) and m for m in models):
            raise ScoreError(f"the server at {self.url} lists a model at /models whose id is not a "
                             f"name: {short(models)}")  # fmt: skip
        if name is None:
            if len(models) > 1:
                raise ScoreError(f"the server at {self.url} serves "
                                 f"{', '.join(map(short, models))}: name one with --set "
                                 "served_model=NAME")  # fmt: skip
            return models[0]
        if name not in models:
            raise ScoreError(f"--set served_model={name}: not served at {self.url} (it serves "
                             f"{', '.join(map(short, models))})")  # fmt: skip
        return name

    def server_version(self):
        """What the server says it is: vLLM's /version, or llama.cpp's /props build_info."""
        for path, field, name in (("/version", "version", "vllm"),
                                  ("/props", "build_info", "llama.cpp")):  # fmt: skip
            try:
                got = self.request(path, retries=0, root=True)
            except ScoreError:
                continue
            if isinstance(got, dict) and got.get(field):
                return {"server": name, "version": unkeyed(str(got[field]))}
        return {"server": None, "version": None}

    def forces(self):
        """Whether ForceTokens runs in the server: it refuses a forcing list that is not one."""
        probe = dict(self.base(1, 1), prompt=[0], vllm_xargs={FORCE_KEY: "probe"})
        try:
            self.request("/completions", probe)
        except ScoreError as e:
            # ForceTokens' own words: a server that echoes the request (vllm_xargs and all) in
            # its refusal does not force
            if FORCE_REFUSAL in str(e):
                return True
            if "(HTTP 4" in str(e):
                return False
            raise
        return False

    def detect(self):
        return "forced" if self.forces() else "stepwise"

    # requests

    def asked(self, k):
        """(entries asked a step, entries kept) for top-k lists of k."""
        cap = self.max_logprobs or k + TIE_MARGIN
        return min(k + TIE_MARGIN, cap), min(k, cap)

    def base(self, max_tokens, logprobs):
        return dict(model=self.served, max_tokens=max_tokens, temperature=0.0, logprobs=logprobs,
                    return_tokens_as_token_ids=True)  # fmt: skip

    def describe(self):
        request = self.base("steps + 1" if self.way == "forced" else 1,
                            f"k + {TIE_MARGIN}" + (f", at most {self.max_logprobs}"
                                                   if self.max_logprobs else ""))  # fmt: skip
        request["model"] = unkeyed(self.served)  # a name a server gives may hold the key
        if self.way == "forced":
            request |= dict(ignore_eos=True, vllm_xargs={FORCE_KEY: "the continuation"})
        else:
            request |= dict(logit_bias={"the next token": BIAS})
        return dict(
            engine="openai", url=self.url, served_model=unkeyed(self.served), **self.server,
            way=self.way, way_detected=self.detected,
            measures=("the decode path: the prompt prefilled, each next token forced through "
                      "the server's decode (vLLM's, with " + FORCE_CLASS + ")"
                      if self.way == "forced" else
                      "one request a position, the tokens before it from the server's prefix "
                      "cache: a decode step on llama.cpp's server, a cached prefill on vLLM "
                      "and SGLang"),
            request=request, batch=self.batch, max_logprobs=self.max_logprobs,
            timeout=self.timeout, retries=self.retries, api_key_from=self.key_from,
            packages={p: package(p) for p in ("numpy", "orjson", "urllib3")},
        )  # fmt: skip

    def force(self, jobs, k, progress=lambda n: None):
        """Each prompt as it finishes; `batch` prompts in flight, each on a daemon thread. When
        the caller stops (an error, Ctrl-C, SIGTERM) the requests in flight are cut and no thread
        is waited for: a stopped record ends at once, whatever the server does."""
        one = self.forced if self.way == "forced" else self.stepwise
        lock, stop, results = threading.Lock(), threading.Event(), queue.SimpleQueue()

        def counted(n):
            with lock:
                if not stop.is_set():
                    progress(n)

        def run(job):
            try:
                results.put((one(job, k, counted, stop), None))
            except BaseException as e:  # raised in the caller's thread, below
                results.put((None, e))

        jobs, live = iter(jobs), 0
        try:
            while True:
                while live < self.batch and (job := next(jobs, None)) is not None:
                    threading.Thread(target=run, args=(job,), daemon=True, name="openai").start()
                    live += 1
                if not live:
                    break
                got, error = arrived(results)
                live -= 1
                if error is not None:  # a prompt that failed raises its ScoreError here
                    raise error
                yield got
        finally:
            stop.set()
            self.deadlines.cut()

    def forced(self, job, k, progress, stop):
        ctx, n = job.schedule.ctx, job.schedule.steps + 1
        tokens = [int(t) for t in job.tokens[: ctx + n]]
        asked, keep = self.asked(k)
        body = self.base(n, asked) | dict(prompt=tokens[:ctx], ignore_eos=True,
                                          vllm_xargs={FORCE_KEY: tokens[ctx:]})  # fmt: skip
        got = self.request("/completions", body, where=f" (prompt {job.index})", stop=stop)
        steps = entries(got, self.url)
        if len(steps) != n:
            raise ScoreError(f"the server at {self.url} returned {len(steps)} tokens for prompt "
                             f"{job.index}, {n} were forced (max_tokens {n})")  # fmt: skip
        rows = []
        for j, (step, t) in enumerate(zip(steps, tokens[ctx:])):
            where = f"prompt {job.index} position {ctx - 1 + j}"
            rows.append(self.row(step, t, asked, keep, where))
            if j == 0 and raw_needed(step, t):
                raise ScoreError(f"the server at {self.url} reports log-probabilities after its "
                                 "logits processors (only the forced token is left): start it "
                                 "with --logprobs-mode raw_logprobs")  # fmt: skip
        progress(n)
        return job.index, scores_of(job.schedule, rows)

    def stepwise(self, job, k, progress, stop):
        tokens = [int(t) for t in job.tokens]
        asked, keep = self.asked(k)
        rows = []
        for pos in job.schedule.positions:
            if stop.is_set():
                return job.index, None
            nxt = tokens[pos + 1]
            body = self.base(1, asked) | dict(prompt=tokens[: pos + 1],
                                              logit_bias={str(nxt): BIAS})  # fmt: skip
            where = f"prompt {job.index} position {pos}"
            got = entries(
                self.request("/completions", body, where=f" ({where})", stop=stop), self.url
            )
            if len(got) != 1:
                raise ScoreError(f"the server at {self.url} returned {len(got)} tokens at {where}, "
                                 "1 was asked (max_tokens 1)")  # fmt: skip
            rows.append(self.row(got[0], nxt, asked, keep, where))
            progress(1)
        return job.index, scores_of(job.schedule, rows)

    def row(self, step, fed, asked, keep, where):
        """One position's (ids, log-probabilities, fed log-probability) from a step's entries:
        the sampled token must be the corpus's; its top entries sorted by value, ties to the lower
        id, cut at `keep`."""
        tok, lp, top = step
        if tok != fed:
            raise ScoreError(
                f"the server at {self.url} did not take the corpus's token at {where}: it "
                f"returned {tok}, the corpus has {fed} ("
                + ("is --logits-processors " + FORCE_CLASS + " loaded?)" if self.way == "forced"
                   else f"it ignored logit_bias {BIAS})")
            )  # fmt: skip
        if lp is None:
            raise ScoreError(f"the server at {self.url} gave no log-probability of the token at "
                             f"{where}")  # fmt: skip
        # vLLM's legacy lists add the sampled token to the entries asked when it is not among them
        if len(top) > asked and tok in top:
            top = {i: v for i, v in top.items() if i != tok}
        if len(top) < keep:
            raise ScoreError(
                f"the server at {self.url} gave {len(top)} top log-probabilities at {where}, "
                f"{keep} were kept of {asked} asked: if it caps them, --set max_logprobs="
                f"{len(top)} keeps that many"
            )
        ranked = sorted((-v, i) for i, v in top.items())[:keep]
        return (np.asarray([i for _, i in ranked], np.int32),
                np.asarray([-v for v, _ in ranked], np.float64), float(lp))  # fmt: skip


def arrived(results):
    """The next of `results`, looked for every TICK: a signal may be delivered to any of the
    process's threads, and Python runs its handler only once the main thread runs again, which a
    wait without end would never do."""
    while True:
        try:
            return results.get(timeout=TICK)
        except queue.Empty:
            pass


def raw_needed(step, t):
    """A forced step whose log-probabilities were taken after the forcing: the forced token
    certain and every other entry impossible."""
    _, lp, top = step
    return lp == 0.0 and all(v <= -9999.0 for i, v in top.items() if i != t) and len(top) > 1


def entries(got, url):
    """A /completions answer's steps, each (token id, its log-probability, {id: log-probability}
    of the top entries), from either form servers give: `logprobs.content` items with ids
    (llama.cpp's server), or the legacy `tokens` / `token_logprobs` / `top_logprobs` lists with
    "token_id:N" strings (vLLM with return_tokens_as_token_ids)."""
    try:
        choice = got["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise ScoreError(f"the server at {url} answered without choices: {short(got)}") from None
    lp = choice.get("logprobs") if isinstance(choice, dict) else None
    if not isinstance(lp, dict):
        raise ScoreError(f"the server at {url} answered without log-probabilities (logprobs "
                         f"{short(lp)}): it does not give them for completions")  # fmt: skip
    try:
        if "content" in lp:
            return [(token_id(c, url),
                     None if c.get("logprob") is None else float(c["logprob"]),
                     listed(((token_id(e, url), e["logprob"]) for e in c["top_logprobs"]), url))
                    for c in lp["content"]]  # fmt: skip
        return [(token_id(t, url), None if f is None else float(f),
                 listed(((token_id(s, url), v) for s, v in top.items()), url))
                for t, f, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"],
                                     strict=True)]  # fmt: skip
    except ScoreError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ScoreError(f"the server at {url} gave log-probabilities in a form this engine does "
                         f"not read: {short(lp)}") from None  # fmt: skip


def listed(pairs, url):
    """{id: log-probability} of a step's (id, log-probability) entries; an id listed twice is
    refused (a dict would keep one of the two silently)."""
    top = {}
    for i, v in pairs:
        if i in top:
            raise ScoreError(f"the server at {url} lists token {i} twice in one step's top "
                             f"log-probabilities ({short(top[i])} and {short(v)})")  # fmt: skip
        top[i] = float(v)
    return top


def token_id(entry, url):
    """A token's id: an entry's `id`, or a "token_id:N" string; a bare token string is refused,
    and so is an id no vocabulary has (the trace's ids are int32)."""
    if isinstance(entry, dict):
        if "id" in entry:
            return in_range(entry["id"], url)
        entry = entry.get("token")
    m = TOKEN_ID.fullmatch(entry) if isinstance(entry, str) else None
    if m is not None:
        return in_range(m.group(1), url)
    raise ScoreError(
        f"the server at {url} names tokens by their text ({short(entry)}), not by id: a "
        "text can stand for several ids, so its top-k cannot be matched with the "
        "reference's ids (vLLM gives ids with return_tokens_as_token_ids; llama.cpp's server "
        "gives them always)"
    )


def in_range(i, url):
    """An id (an int, or its digits) from 0 below ID_END; else one line naming it."""
    n = i if type(i) is int else int(i) if isinstance(i, str) and len(i) < 12 else None
    if n is None or not 0 <= n < ID_END:
        raise ScoreError(f"the server at {url} gave token id {short(i, 40)}, not an id of any "
                         "vocabulary (an integer from 0 to 2^31 - 1)")  # fmt: skip
    return n


def message(text):
    """A server's error body as one line: its JSON error message where it has one."""
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError:
        return short(text)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            for field in ("message", "detail", "msg"):
                if err.get(field):
                    return short(err[field])
        elif isinstance(err, str):
            return short(err)
    return short(body)


def short(value, n=300):
    """A value of the server's as one line of at most n characters, without the API key: every
    text of the server's a message shows passes here."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    elif not isinstance(value, str):
        try:
            value = orjson.dumps(value).decode()
        except TypeError:  # orjson: an integer beyond 64 bits
            value = repr(value)
    line = " ".join(unkeyed(value).split())
    return line if len(line) <= n else line[: n - 3] + "..."


def transport(e):
    """A transport failure in a few words: the innermost error's (urllib3 wraps http.client's
    and the socket's), an OSError's by its reason alone ("Connection refused")."""
    while True:
        inner = next((a for a in getattr(e, "args", ()) if isinstance(a, BaseException)), None)
        inner = inner or e.__cause__
        if inner is None:
            break
        e = inner
    if isinstance(e, OSError) and e.strerror:
        return short(e.strerror, 200)
    return short(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__, 200)
