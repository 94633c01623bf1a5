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

HTTP is the standard library's (urllib); `batch` prompts are in flight at once, each on a thread,
their results yielded as they finish. 429, 5xx, timeouts and dropped connections are retried with
a doubling backoff, a bounded number of times; a 4xx is one line with the server's message. The
API key is read from KERN_API_KEY (or OPENAI_API_KEY) and sent as a bearer token; it is never
recorded or printed.
"""

import os
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import numpy as np
import orjson

from scoring.engines import FORCE_KEY, Engine, package, scores_of
from scoring.trace import ScoreError

FORCE_CLASS = "scoring.engines.vllm_processors:ForceTokens"
KEY_VARIABLES = ("KERN_API_KEY", "OPENAI_API_KEY")  # the first one set is the API key
TIE_MARGIN = 8  # entries asked beyond k: exact ties at the k-th place are then ordered by id
BIAS = 100  # OpenAI's largest logit_bias: makes the corpus's next token the one sampled
BACKOFF = 0.5  # seconds before the first retry; doubled each time
WAYS = ("auto", "forced", "stepwise")
TOKEN_ID = re.compile(r"token_id:(\d+)")


class OpenAI(Engine):
    """A server's /completions. Settings (`--set`): way (auto, forced, stepwise), served_model
    (the name the server serves; default: its only one), max_logprobs (the most entries the
    server gives a step: the trace then keeps min(k, max_logprobs)), timeout (seconds a request
    may take, 600), retries (4). `--batch`: the prompts in flight at once (1)."""

    FLAGS = ("batch",)

    def __init__(self, model, batch=None, way="auto", served_model=None, max_logprobs=None,
                 timeout=600, retries=4):  # fmt: skip
        url = str(model).rstrip("/")
        if not re.match(r"https?://[^/]", url):
            raise ScoreError(f"--model {model}: not a server's URL (--engine openai takes the API "
                             "base, e.g. http://127.0.0.1:8000/v1)")  # fmt: skip
        parts = urllib.parse.urlsplit(url)
        if "@" in parts.netloc or parts.query or parts.fragment:
            # the URL is recorded in the trace and shown in messages; a key must be neither
            raise ScoreError("--model: the server's URL holds a user, a password or a query "
                             f"(shown here without them: {parts.scheme}://"
                             f"{parts.netloc.rpartition('@')[2]}{parts.path}); give the API base "
                             f"alone and the key in {' or '.join(KEY_VARIABLES)}, which is sent "
                             "but never recorded")  # fmt: skip
        batch = 1 if batch is None else batch
        if batch < 1:
            raise ScoreError("--batch must be at least 1")
        if way not in WAYS:
            raise ScoreError(f"--set way={way}: must be one of {', '.join(WAYS)}")
        for name, v, low in (("max_logprobs", max_logprobs, 1), ("retries", retries, 0)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < low):
                raise ScoreError(f"--set {name}={v}: must be an integer of at least {low}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ScoreError(f"--set timeout={timeout}: must be a number of seconds above 0")
        self.url, self.batch, self.timeout, self.retries = url, batch, float(timeout), retries
        self.max_logprobs = max_logprobs
        self.key_from = next((v for v in KEY_VARIABLES if os.environ.get(v)), None)
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

    def request(self, path, body=None, retries=None, where=""):
        """The JSON a GET (body None) or POST of `path` answers; retried on 429, 5xx, timeouts
        and dropped connections; anything else one ScoreError line."""
        retries = self.retries if retries is None else retries
        url = self.url + path if path.startswith("/") else path
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        key = os.environ.get(self.key_from) if self.key_from else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        data = None if body is None else orjson.dumps(body)
        for attempt in range(retries + 1):
            why = None
            try:
                req = urllib.request.Request(url, data=data, headers=headers)
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    text = r.read()
                try:
                    return orjson.loads(text)
                except orjson.JSONDecodeError:
                    raise ScoreError(f"the server at {self.url} answered {path} with something "
                                     f"that is not JSON: {short(text)}") from None  # fmt: skip
            except urllib.error.HTTPError as e:
                text = e.read()
                if e.code != 429 and e.code < 500:
                    raise ScoreError(f"the server at {self.url} refused {path}{where} (HTTP "
                                     f"{e.code}): {message(text)}") from None  # fmt: skip
                why = f"HTTP {e.code}: {message(text)}"
            except urllib.error.URLError as e:
                if isinstance(e.reason, TimeoutError):
                    why = f"no answer within {self.timeout:g} s"
                else:
                    why = str(e.reason.strerror if hasattr(e.reason, "strerror") and
                              e.reason.strerror else e.reason)  # fmt: skip
            except TimeoutError:
                why = f"no answer within {self.timeout:g} s"
            except (ConnectionError, OSError) as e:  # a connection dropped mid-answer
                why = e.strerror or type(e).__name__
            if attempt < retries:
                time.sleep(BACKOFF * 2**attempt)
        tries = f" after {retries + 1} tries" if retries else ""
        raise ScoreError(f"cannot reach the server at {self.url}{where}{tries}: {why}")

    def served_model(self, name):
        """The model name requests carry: `name`, which the server must list, or its only one."""
        got = self.request("/models", retries=0)
        models = [m.get("id") for m in got.get("data", []) if isinstance(m, dict)]
        if not models:
            raise ScoreError(f"the server at {self.url} lists no model at /models")
        if name is None:
            if len(models) > 1:
                raise ScoreError(f"the server at {self.url} serves {', '.join(models)}: name one "
                                 "with --set served_model=NAME")  # fmt: skip
            return models[0]
        if name not in models:
            raise ScoreError(f"--set served_model={name}: not served at {self.url} (it serves "
                             f"{', '.join(models)})")  # fmt: skip
        return name

    def server_version(self):
        """What the server says it is: vLLM's /version, or llama.cpp's /props build_info."""
        root = self.url.removesuffix("/v1")
        for path, field, name in (("/version", "version", "vllm"),
                                  ("/props", "build_info", "llama.cpp")):  # fmt: skip
            try:
                got = self.request(root + path, retries=0)
            except ScoreError:
                continue
            if isinstance(got, dict) and got.get(field):
                return {"server": name, "version": str(got[field])}
        return {"server": None, "version": None}

    def forces(self):
        """Whether ForceTokens runs in the server: it refuses a forcing list that is not one."""
        probe = dict(self.base(1, 1), prompt=[0], vllm_xargs={FORCE_KEY: "probe"})
        try:
            self.request("/completions", probe)
        except ScoreError as e:
            if FORCE_KEY in str(e):
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
        if self.way == "forced":
            request |= dict(ignore_eos=True, vllm_xargs={FORCE_KEY: "the continuation"})
        else:
            request |= dict(logit_bias={"the next token": BIAS})
        return dict(
            engine="openai", url=self.url, served_model=self.served, **self.server,
            way=self.way, way_detected=self.detected,
            measures=("the decode path: the prompt prefilled, each next token forced through "
                      "the server's decode (vLLM's, with " + FORCE_CLASS + ")"
                      if self.way == "forced" else
                      "one request a position, the tokens before it from the server's prefix "
                      "cache: a decode step on llama.cpp's server, a cached prefill on vLLM "
                      "and SGLang"),
            request=request, batch=self.batch, max_logprobs=self.max_logprobs,
            timeout=self.timeout, retries=self.retries, api_key_from=self.key_from,
            packages={p: package(p) for p in ("numpy", "orjson")},
        )  # fmt: skip

    def force(self, jobs, k, progress=lambda n: None):
        """Each prompt as it finishes; `batch` prompts in flight, each on a thread."""
        one = self.forced if self.way == "forced" else self.stepwise
        lock, stop = threading.Lock(), threading.Event()

        def counted(n):
            with lock:
                progress(n)

        jobs = iter(jobs)
        pool = ThreadPoolExecutor(self.batch, thread_name_prefix="openai")
        live = set()
        try:
            while True:
                while len(live) < self.batch and (job := next(jobs, None)) is not None:
                    live.add(pool.submit(one, job, k, counted, stop))
                if not live:
                    break
                done, live = wait(live, return_when=FIRST_COMPLETED)
                for f in done:  # a prompt that failed raises its ScoreError here
                    yield f.result()
        finally:
            stop.set()
            pool.shutdown(wait=True, cancel_futures=True)

    def forced(self, job, k, progress, stop):
        ctx, n = job.schedule.ctx, job.schedule.steps + 1
        tokens = [int(t) for t in job.tokens[: ctx + n]]
        asked, keep = self.asked(k)
        body = self.base(n, asked) | dict(prompt=tokens[:ctx], ignore_eos=True,
                                          vllm_xargs={FORCE_KEY: tokens[ctx:]})  # fmt: skip
        got = self.request("/completions", body, where=f" (prompt {job.index})")
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
            got = entries(self.request("/completions", body, where=f" ({where})"), self.url)
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
            return [(token_id(c, url), c.get("logprob"),
                     {token_id(e, url): float(e["logprob"]) for e in c["top_logprobs"]})
                    for c in lp["content"]]  # fmt: skip
        return [(token_id(t, url), None if f is None else float(f),
                 {token_id(s, url): float(v) for s, v in top.items()})
                for t, f, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"],
                                     strict=True)]  # fmt: skip
    except ScoreError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ScoreError(f"the server at {url} gave log-probabilities in a form this engine does "
                         f"not read: {short(lp)}") from None  # fmt: skip


def token_id(entry, url):
    """A token's id: an entry's `id`, or a "token_id:N" string; a bare token string is refused."""
    if isinstance(entry, dict):
        if isinstance(entry.get("id"), int):
            return entry["id"]
        entry = entry.get("token")
    m = TOKEN_ID.fullmatch(entry) if isinstance(entry, str) else None
    if m is None:
        raise ScoreError(
            f"the server at {url} names tokens by their text ({short(entry)}), not by id: a "
            "text can stand for several ids, so its top-k cannot be matched with the "
            "reference's ids (vLLM gives ids with return_tokens_as_token_ids; llama.cpp's server "
            "gives them always)"
        )
    return int(m.group(1))


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
    """A value as one line of at most n characters."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    elif not isinstance(value, str):
        value = orjson.dumps(value).decode() if value is not None else "null"
    line = " ".join(value.split())
    return line if len(line) <= n else line[: n - 3] + "..."
