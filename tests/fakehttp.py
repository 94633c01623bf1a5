"""A fake Hugging Face Hub or book mirror for the fetch.sh tests, and a misbehaving
OpenAI-compatible server for the served engine's (tests/test_served.py), on 127.0.0.1 only.

FakeServer serves an in-memory file tree over HTTP/1.0 (or HTTP/1.1 with keep-alive) in a thread,
answers POSTs with functions of their JSON body, honours Range requests, records every request and
can be told to misbehave in the ways fetch.sh and score.py must survive. Files are keyed by their
decoded path; each request records both the decoded and the raw path.
"""

from __future__ import annotations

import re
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

CHUNK = 1024


@dataclass
class Request:
    method: str
    path: str  # decoded
    raw: str  # as sent
    headers: dict[str, str]
    body: bytes | None = None  # a POST's


class Gauge:
    """Requests in flight, and the most seen at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.n = 0
        self.max = 0

    def __enter__(self) -> None:
        with self.lock:
            self.n += 1
            self.max = max(self.max, self.n)

    def __exit__(self, *exc) -> None:
        with self.lock:
            self.n -= 1


class FakeServer:
    """An in-memory file tree over HTTP with per-path failure knobs."""

    def __init__(self, keep_alive: bool = False) -> None:
        self.files: dict[str, bytes] = {}
        # path -> a POST's answer: (status, body) of the request's body
        self.answers: dict[str, Callable[[bytes], tuple[int, bytes]]] = {}
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        # path -> what to do instead of serving, one entry per request, in order: an HTTP status,
        # "empty" (close without a reply), "reset" (a TCP reset), "cut" (half the body, then close),
        # "garbled" (a status line that is not one), "unchunked" (a body said to be chunked, not)
        self.faults: dict[str, list[int | str]] = {}
        # an error status's body echoes the request's Authorization header: as it is (True), or
        # as a function of it gives it (the header in another form)
        self.echo: bool | Callable[[str], str] = False
        self.missing: set[str] = set()  # answer 404
        self.corrupt: set[str] = set()  # serve other bytes of the same length
        self.extra: dict[str, bytes] = {}  # path -> bytes sent after the body (and counted in it)
        self.endless: set[str] = set()  # after the body, send bytes until the client goes away
        self.endless_pause = 0.005  # seconds between two CHUNKs of an endless body
        self.ignore_range: set[str] = set()  # answer a Range request with 200 and the whole body
        self.refuse_range: set[str] = set()  # answer a Range request with 416
        self.redirect: dict[str, str] = {}  # path -> answer 302 to this URL
        self.all_404 = False
        self.delay = 0.0  # seconds before answering
        self.trickle = 0.0  # seconds between CHUNK-byte pieces of a body
        self.drip = 0.0  # seconds between single bytes of a whole answer, status line and all
        self.gate: threading.Event | None = None  # when set up, answer only once it is set
        self.hold: threading.Event | None = None  # when set up, send half a body, wait for it
        self.gauge = Gauge()
        self.cmdline_needle: str | None = None  # look for it in every process's command line
        self.cmdline_hits: list[str] = []
        self.connections = 0  # TCP connections accepted
        handler = _KeptAlive if keep_alive else _Handler
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.fake = self  # type: ignore[attr-defined]
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        for event in (self.gate, self.hold):
            if event is not None:
                event.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def gets(self, path: str | None = None) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if path is None or r.path == path]

    def clear(self) -> None:
        with self.lock:
            self.requests.clear()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, format, *args):
        pass

    def setup(self) -> None:
        super().setup()
        fake: FakeServer = self.server.fake  # type: ignore[attr-defined]
        with fake.lock:
            fake.connections += 1

    def do_GET(self) -> None:
        self._answer(None)

    def do_POST(self) -> None:
        self._answer(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

    def _answer(self, body: bytes | None) -> None:
        fake: FakeServer = self.server.fake  # type: ignore[attr-defined]
        headers = {k.lower(): v for k, v in self.headers.items()}
        path = unquote(self.path, errors="surrogateescape")
        with fake.lock:
            fake.requests.append(Request(self.command, path, self.path, headers, body))
        with fake.gauge:
            if fake.cmdline_needle:
                fake.cmdline_hits.extend(processes_showing(fake.cmdline_needle))
            if fake.gate is not None:
                fake.gate.wait(60)
            if fake.delay:
                time.sleep(fake.delay)
            try:
                self._serve(fake, path, headers, body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away (as fetch.sh does when a body is too long)

    def _head(self, status: int, length: int | None, extra: dict[str, str]) -> None:
        self.send_response(status)
        if length is not None:
            self.send_header("Content-Length", str(length))
        for k, v in extra.items():
            self.send_header(k, v)
        self.end_headers()

    def _send(self, status: int, body: bytes, extra: dict[str, str] | None = None) -> None:
        self._head(status, len(body), extra or {})
        self.wfile.write(body)

    def _body(self, fake: FakeServer, body: bytes) -> None:
        if fake.hold is not None:
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            fake.hold.wait(60)
            body = body[len(body) // 2 :]
        if not fake.trickle:
            self.wfile.write(body)
            return
        for k in range(0, len(body), CHUNK):
            self.wfile.write(body[k : k + CHUNK])
            self.wfile.flush()
            time.sleep(fake.trickle)

    def _serve(
        self, fake: FakeServer, path: str, headers: dict[str, str], posted: bytes | None
    ) -> None:
        with fake.lock:
            served = fake.files if posted is None else fake.answers
            if fake.all_404 or path in fake.missing or path not in served:
                fault: int | str | None = 404
            elif fake.faults.get(path):
                fault = fake.faults[path].pop(0)
            else:
                fault = None
        if fault == "empty":
            self.close_connection = True
            return
        if fault == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            return
        if fault == "garbled":
            self.wfile.write(b"HTTP/1.1 2OO 0K\r\nthis is not a header\r\n\r\n{}")
            self.close_connection = True
            return
        if isinstance(fault, int):
            header = headers.get("authorization", "")
            said = f": {fake.echo(header) if callable(fake.echo) else header}" if fake.echo else ""
            self._send(fault, f"error {fault}{said}\n".encode())
            return
        if path in fake.redirect:
            self._send(302, b"", {"Location": fake.redirect[path]})
            return
        status = 200
        if posted is None:
            data = fake.files[path]
        else:
            status, data = fake.answers[path](posted)
        if fake.drip:
            data = b"HTTP/1.0 %d X\r\nContent-Length: %d\r\n\r\n%s" % (status, len(data), data)
            for k in range(len(data)):
                self.wfile.write(data[k : k + 1])
                self.wfile.flush()
                time.sleep(fake.drip)
            self.close_connection = True
            return
        if fault == "unchunked":
            self._head(status, None, {"Transfer-Encoding": "chunked"})
            self.wfile.write(data)
            self.close_connection = True
            return
        if path in fake.corrupt:
            data = bytes(b ^ 0x5A for b in data)
        data += fake.extra.get(path, b"")
        total = len(data)
        extra: dict[str, str] = {"Accept-Ranges": "bytes"}
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", headers.get("range", ""))
        if m and path in fake.refuse_range:
            self._send(416, b"range not satisfiable\n", {"Content-Range": f"bytes */{total}"})
            return
        body = data
        if m and path not in fake.ignore_range:
            start = int(m.group(1))
            end = min(int(m.group(2)), total - 1) if m.group(2) else total - 1
            if start >= total:
                self._send(416, b"range not satisfiable\n", {"Content-Range": f"bytes */{total}"})
                return
            body = data[start : end + 1]
            status = 206
            extra["Content-Range"] = f"bytes {start}-{end}/{total}"
        if path in fake.endless:
            # No length: the body ends when the connection does, and this one never ends.
            self.close_connection = True
            self._head(status, None, extra)
            self._body(fake, body)
            while True:
                self.wfile.write(b"\0" * CHUNK)
                self.wfile.flush()
                time.sleep(fake.endless_pause)
        if fault == "cut":
            # Promise the whole body, send half of it, then close the connection.
            self._head(status, len(body), extra)
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self._head(status, len(body), extra)
        self._body(fake, body)


class _KeptAlive(_Handler):
    """HTTP/1.1: a connection serves request after request (every answer but the misbehaving
    ones has a Content-Length) until the client closes it."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # a head and its body written apart are not held back


def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (a connection to it is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# --------------------------------------------------------------------------------------------
# Processes (Linux /proc)


def read_if_there(p: Path) -> bytes:
    """A file's bytes; empty where it is gone (/proc of a process that has ended since)."""
    try:
        return p.read_bytes()
    except OSError:
        return b""


def processes_showing(needle: str) -> list[str]:
    """Command lines of running processes that contain needle."""
    hits = []
    for d in Path("/proc").glob("[0-9]*"):
        cmd = read_if_there(d / "cmdline").replace(b"\0", b" ").decode(errors="replace")
        if needle in cmd:
            hits.append(cmd)
    return hits


def processes_marked(marker: str) -> dict[int, str]:
    """pid -> command line of every live process whose environment holds marker (a process
    started with it, and everything that process starts, since the environment is inherited)."""
    needle = marker.encode()
    found = {}
    for d in Path("/proc").glob("[0-9]*"):
        if needle in read_if_there(d / "environ"):
            stat = read_if_there(d / "stat").decode(errors="replace")
            if ") Z " in stat:  # a zombie has ended; only its parent has not looked yet
                continue
            found[int(d.name)] = (
                read_if_there(d / "cmdline").replace(b"\0", b" ").decode(errors="replace")
            )
    return found
