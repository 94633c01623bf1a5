"""Benchmark of the served engine's HTTP (docs/performance.md "The served engine").

    python bench/served_bench.py [--repo DIR] [--prompts 8] [--positions 64] [--batch 1,4]
                                 [--repeat 3]

`--engine openai`, step by step (one request a scored position), against a local server on
127.0.0.1 that answers at once: tests/fakehttp.py's FakeServer, HTTP/1.1 with keep-alive, its
/completions answer a fixed vLLM-style step of k + 8 entries made without looking at the request
beyond the token it must give. What is measured is the client's cost a request and the TCP
connections it opens, not a model's: requests a second (the fastest of `--repeat` runs) and
connections the server accepted, per `--batch`.

`--repo DIR` takes the scoring package from another checkout (its scoring/engines/openai.py is the
one measured; the server and this script are this checkout's): the figures before a change are
those of the same command with `--repo` a checkout of the code before it, e.g.

    mkdir /tmp/before && git archive main | tar -x -C /tmp/before
    python bench/served_bench.py --repo /tmp/before
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import orjson

REPO = Path(__file__).resolve().parents[1]


def answer(k):
    """A /completions answer giving the token the request's logit_bias asks and k + 8 entries."""
    top = {f"token_id:{i}": -1.0 - i / 100 for i in range(k + 8)}

    def completions(posted):
        body = orjson.loads(posted)
        if "vllm_xargs" in body:  # the forcing probe: a server without ForceTokens
            return 200, orjson.dumps({"choices": [{"text": "", "logprobs": None}]})
        t = next(iter(body["logit_bias"]))
        lp = {"tokens": [f"token_id:{t}"], "token_logprobs": [-0.5], "top_logprobs": [top]}
        return 200, orjson.dumps({"choices": [{"text": "x", "logprobs": lp}]})

    return completions


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", type=Path, default=REPO, help="the checkout whose scoring to run")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--positions", type=int, default=64, help="scored positions a prompt")
    p.add_argument("--batch", default="1,4", help="prompts in flight, comma-separated")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    sys.path[:0] = [str(args.repo.resolve()), str(REPO / "tests")]
    from fakehttp import FakeServer

    from scoring.engines import Job
    from scoring.engines.openai import OpenAI
    from scoring.trace import TOP_K, Schedule

    server = FakeServer(keep_alive=True)
    server.files["/v1/models"] = orjson.dumps({"data": [{"id": "m"}]})
    server.answers["/v1/completions"] = answer(TOP_K)
    rng = np.random.default_rng(0)
    ctx = 32
    jobs = [Job(i, rng.integers(0, 1000, ctx + args.positions).astype(np.int32),
                Schedule(ctx, args.positions - 1)) for i in range(args.prompts)]  # fmt: skip
    n = args.prompts * args.positions
    print(f"scoring from {args.repo.resolve()}: {args.prompts} prompts x {args.positions} "
          f"positions = {n} requests a run, best of {args.repeat}")  # fmt: skip
    try:
        for batch in map(int, args.batch.split(",")):
            best, opened = 0.0, []
            for _ in range(args.repeat):
                before = server.connections
                engine = OpenAI(f"{server.url}/v1", batch=batch, way="stepwise")
                server.clear()
                t0 = time.perf_counter()
                got = list(engine.force(jobs, TOP_K))
                took = time.perf_counter() - t0
                assert len(got) == len(jobs) and len(server.gets("/v1/completions")) == n
                best = max(best, n / took)
                opened.append(server.connections - before)
            print(f"batch {batch}: {best:,.0f} requests/s, {max(opened)} TCP connections opened "
                  f"a run ({n + 3} requests: the start-up's 3 and {n} positions)")  # fmt: skip
    finally:
        server.close()


if __name__ == "__main__":
    main()
