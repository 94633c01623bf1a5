"""Tests of fetch.sh against local HTTP servers (127.0.0.1 only, no other network).

Two fake servers run in threads: a Hub serving `/datasets/<repo>/resolve/<rev>/<path>` and
`/<repo>/resolve/<rev>/<path>`, and a book mirror serving `/<repo>/<commit>/<path>`. They honour
Range requests, record every request and can be told to fail in the ways fetch.sh must handle.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FETCH = ROOT / "fetch.sh"
BASH = shutil.which("bash") or "/bin/bash"
TOKEN = "hf_test_secret_0123456789"


# --------------------------------------------------------------------------------------------
# The fake servers


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]


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

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        self.fail_500: dict[str, int] = {}  # path -> answer 500 this many times first
        self.drop_half: dict[str, int] = {}  # path -> cut the body in half this many times
        self.missing: set[str] = set()  # answer 404
        self.corrupt: set[str] = set()  # serve other bytes of the same length
        self.all_404 = False
        self.delay = 0.0
        self.gauge = Gauge()
        self.cmdline_needle: str | None = None  # look for it in every process's command line
        self.cmdline_hits: list[str] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
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

    def do_GET(self) -> None:
        fake: FakeServer = self.server.fake  # type: ignore[attr-defined]
        headers = {k.lower(): v for k, v in self.headers.items()}
        with fake.lock:
            fake.requests.append(Request("GET", self.path, headers))
        with fake.gauge:
            if fake.cmdline_needle:
                fake.cmdline_hits.extend(_processes_showing(fake.cmdline_needle))
            if fake.delay:
                time.sleep(fake.delay)
            self._serve(fake, headers)

    def _send(self, status: int, body: bytes, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _serve(self, fake: FakeServer, headers: dict[str, str]) -> None:
        path = self.path
        with fake.lock:
            if fake.all_404 or path in fake.missing or path not in fake.files:
                status = 404
            elif fake.fail_500.get(path, 0) > 0:
                fake.fail_500[path] -= 1
                status = 500
            else:
                status = 200
            drop = status == 200 and fake.drop_half.get(path, 0) > 0
            if drop:
                fake.drop_half[path] -= 1
        if status != 200:
            self._send(status, f"error {status}\n".encode())
            return
        data = fake.files[path]
        if path in fake.corrupt:
            data = bytes(b ^ 0x5A for b in data)
        total = len(data)
        extra: dict[str, str] = {"Accept-Ranges": "bytes"}
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", headers.get("range", ""))
        if m:
            start = int(m.group(1))
            end = min(int(m.group(2)), total - 1) if m.group(2) else total - 1
            if start >= total:
                self._send(416, b"range not satisfiable\n", {"Content-Range": f"bytes */{total}"})
                return
            body = data[start : end + 1]
            status = 206
            extra["Content-Range"] = f"bytes {start}-{end}/{total}"
        else:
            body = data
        if drop:
            # Promise the whole body, send half of it, then close the connection.
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            for k, v in extra.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self._send(status, body, extra)


def _processes_showing(needle: str) -> list[str]:
    """Command lines of running processes that contain needle (Linux /proc)."""
    hits = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmd:
            hits.append(cmd)
    return hits


@pytest.fixture
def hub():
    s = FakeServer()
    yield s
    s.close()


@pytest.fixture
def books():
    s = FakeServer()
    yield s
    s.close()


# --------------------------------------------------------------------------------------------
# Fixture pins


def _hex(seed: str, n: int = 40) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:n]


@dataclass
class Pin:
    kind: str  # dataset | model | book
    repo: str
    rev: str
    path: str
    data: bytes
    ebook: str = ""
    lang: str = ""
    title: str = ""
    bytes_col: str | None = None  # what is written in the bytes column (default: the real size)
    sha_col: str | None = None  # what is written in the sha256 column (default: the real one)

    @property
    def sha(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def rel(self) -> str:
        return f"{self.repo}/{self.path}"

    @property
    def url_path(self) -> str:
        if self.kind == "dataset":
            return f"/datasets/{self.repo}/resolve/{self.rev}/{self.path}"
        if self.kind == "model":
            return f"/{self.repo}/resolve/{self.rev}/{self.path}"
        return f"/{self.repo}/{self.rev}/{self.path}"

    def line(self) -> str:
        b = str(len(self.data)) if self.bytes_col is None else self.bytes_col
        s = self.sha if self.sha_col is None else self.sha_col
        if self.kind == "book":
            return f"{self.ebook}  {self.lang}  {self.repo}  {self.rev}  {self.path}  {b}  {s}  {self.title}"
        return f"{self.kind}  {self.repo}  {self.rev}  {self.path}  {b}  {s}"


def _data(name: str, size: int) -> bytes:
    return random.Random(name).randbytes(size)


def default_pins() -> list[Pin]:
    r1, r2, r3 = _hex("rev1"), _hex("rev2"), _hex("rev3")
    return [
        Pin("dataset", "org-a/alpha", r1, "data/train-0.jsonl", _data("a0", 3000)),
        Pin("dataset", "org-a/alpha", r1, "data/train-1.parquet", _data("a1", 200_000)),
        Pin("dataset", "org-b/beta", r2, "test.json", _data("b", 777)),
        Pin("model", "acme/tok-1B", r3, "tokenizer.json", _data("tok", 5000)),
        Pin(
            "book",
            "books/101",
            _hex("c101"),
            "101-0.txt",
            _data("101", 4000),
            ebook="101",
            lang="en",
            title="A. Author, A  Title",
        ),
        Pin(
            "book",
            "books/202",
            _hex("c202"),
            "202-0.txt",
            _data("202", 6000),
            ebook="202",
            lang="zh",
            title="某人《測試之書》",
        ),
    ]


def by_path(pins: list[Pin], path: str) -> Pin:
    return next(p for p in pins if p.path == path)


def serve(pins: list[Pin], hub: FakeServer, books: FakeServer) -> None:
    for p in pins:
        (books if p.kind == "book" else hub).files[p.url_path] = p.data


def write_pins(tmp: Path, pins: list[Pin], rev_extra: str = "", books_extra: str = ""):
    rev = tmp / "REV"
    bks = tmp / "BOOKS"
    rev.write_text(
        "# kind repo revision path bytes sha256\n"
        + "".join(p.line() + "\n" for p in pins if p.kind != "book")
        + rev_extra,
        encoding="utf-8",
    )
    bks.write_text(
        "# ebook lang repo commit path bytes sha256 title\n"
        + "".join(p.line() + "\n" for p in pins if p.kind == "book")
        + books_extra,
        encoding="utf-8",
    )
    return rev, bks


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    @property
    def out(self) -> str:
        return self.stdout + self.stderr

    def last_lines(self, n: int) -> list[str]:
        return self.stderr.strip().splitlines()[-n:]


def run_fetch(
    tmp: Path,
    hub: FakeServer,
    books: FakeServer,
    dest: Path | None,
    *,
    env: dict[str, str] | None = None,
    script: Path = FETCH,
    cwd: Path | None = None,
    pins_env: bool = True,
) -> Run:
    tmpdir = tmp / "tmpdir"
    tmpdir.mkdir(exist_ok=True)
    e = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp),
        "TMPDIR": str(tmpdir),
        "HF_ENDPOINT": hub.url,
        "BOOKS_ENDPOINT": books.url,
        "FETCH_RETRY_DELAY": "0",
        "NO_PROXY": "*",
    }
    if pins_env:
        e["REV_FILE"] = str(tmp / "REV")
        e["BOOKS_FILE"] = str(tmp / "BOOKS")
    e.update(env or {})
    args = [BASH, str(script)] + ([str(dest)] if dest is not None else [])
    p = subprocess.run(
        args, env=e, cwd=cwd or tmp, capture_output=True, text=True, timeout=120, check=False
    )
    # The temporary directory (which held the token file, if any) is removed on exit.
    assert list(tmpdir.iterdir()) == []
    return Run(p.returncode, p.stdout, p.stderr)


def assert_in_place(dest: Path, pins: list[Pin]) -> None:
    for p in pins:
        f = dest / p.repo / p.path
        assert f.read_bytes() == p.data, p.rel
        assert not Path(str(f) + ".part").exists(), p.rel


def files_under(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file()) if d.exists() else []


@pytest.fixture
def setup(tmp_path, hub, books):
    """The default pins written, served by both servers; returns (pins, dest)."""
    pins = default_pins()
    serve(pins, hub, books)
    write_pins(tmp_path, pins)
    return pins, tmp_path / "dest"


# --------------------------------------------------------------------------------------------
# Fetching


def test_fresh_fetch_places_every_file(tmp_path, hub, books, setup):
    pins, dest = setup
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    assert_in_place(dest, pins)
    assert len(files_under(dest)) == len(pins)
    # Each file requested once, under its URL layout, from the right server, without Range.
    hub_paths = sorted(q.path for q in hub.gets())
    book_paths = sorted(q.path for q in books.gets())
    assert hub_paths == sorted(p.url_path for p in pins if p.kind != "book")
    assert book_paths == sorted(p.url_path for p in pins if p.kind == "book")
    assert "/datasets/org-a/alpha/resolve/" in " ".join(hub_paths)
    assert "/acme/tok-1B/resolve/" in " ".join(hub_paths)
    assert all("range" not in q.headers for q in hub.gets() + books.gets())
    assert r.stdout == ""  # nothing pinned as "-", so no ready lines
    assert "all 6 files are in place and verified" in r.stderr


def test_second_run_downloads_nothing(tmp_path, hub, books, setup):
    pins, dest = setup
    assert run_fetch(tmp_path, hub, books, dest).returncode == 0
    hub.clear()
    books.clear()
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    assert hub.gets() == [] and books.gets() == []
    assert r.stderr.count("verified ") >= len(pins)
    for p in pins:
        assert re.search(rf"verified\s+{re.escape(p.rel)} \(already present", r.stderr)
    assert_in_place(dest, pins)


def test_default_dest_is_cwd_and_pins_are_found_beside_the_script(tmp_path, hub, books):
    pins = default_pins()[:3]
    serve(pins, hub, books)
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copy(FETCH, proj / "fetch.sh")
    write_pins(proj, pins)
    src = proj / "src"
    src.mkdir()
    r = run_fetch(tmp_path, hub, books, None, script=Path("../fetch.sh"), cwd=src, pins_env=False)
    assert r.returncode == 0, r.out
    assert_in_place(src, pins)


@pytest.mark.parametrize("jobs", [1, 3])
def test_fetch_jobs_bounds_parallel_downloads(tmp_path, hub, books, setup, jobs):
    pins, dest = setup
    books.gauge = hub.gauge  # count the requests in flight on both servers together
    hub.delay = books.delay = 0.15
    r = run_fetch(tmp_path, hub, books, dest, env={"FETCH_JOBS": str(jobs)})
    assert r.returncode == 0, r.out
    assert_in_place(dest, pins)
    assert hub.gauge.max == jobs


def test_resume_from_truncated_part(tmp_path, hub, books, setup):
    pins, dest = setup
    p = by_path(pins, "data/train-1.parquet")
    f = dest / p.repo / p.path
    f.parent.mkdir(parents=True)
    cut = 70_001
    Path(str(f) + ".part").write_bytes(p.data[:cut])
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    reqs = hub.gets(p.url_path)
    assert [q.headers.get("range") for q in reqs] == [f"bytes={cut}-"]
    assert_in_place(dest, pins)


def test_connection_dropped_halfway_is_resumed(tmp_path, hub, books, setup):
    pins, dest = setup
    p = by_path(pins, "data/train-1.parquet")
    hub.drop_half[p.url_path] = 1
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    reqs = hub.gets(p.url_path)
    assert len(reqs) == 2
    assert "range" not in reqs[0].headers
    m = re.fullmatch(r"bytes=(\d+)-", reqs[1].headers.get("range", ""))
    assert m and 0 < int(m.group(1)) < len(p.data)
    assert "(18) transfer closed" in r.stderr  # curl's report of the cut, shown on the retry
    assert_in_place(dest, pins)


def test_complete_part_is_verified_without_a_request(tmp_path, hub, books, setup):
    pins, dest = setup
    p = by_path(pins, "test.json")
    f = dest / p.repo / p.path
    f.parent.mkdir(parents=True)
    Path(str(f) + ".part").write_bytes(p.data)
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    assert hub.gets(p.url_path) == []
    assert_in_place(dest, pins)


def test_oversized_part_is_dropped_and_fetched_afresh(tmp_path, hub, books, setup):
    pins, dest = setup
    p = by_path(pins, "test.json")
    f = dest / p.repo / p.path
    f.parent.mkdir(parents=True)
    Path(str(f) + ".part").write_bytes(p.data + b"extra bytes")
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    assert [q.headers.get("range") for q in hub.gets(p.url_path)] == [None]
    assert_in_place(dest, pins)


def test_stale_part_with_wrong_prefix_is_fetched_afresh_once(tmp_path, hub, books, setup):
    pins, dest = setup
    p = by_path(pins, "data/train-0.jsonl")
    f = dest / p.repo / p.path
    f.parent.mkdir(parents=True)
    Path(str(f) + ".part").write_bytes(b"\0" * 1000)  # not a prefix of the real bytes
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    assert [q.headers.get("range") for q in hub.gets(p.url_path)] == ["bytes=1000-", None]
    assert_in_place(dest, pins)


def test_resume_answered_416_is_fetched_afresh(tmp_path, hub, books):
    # bytes unknown: a complete .part is resumed, the server answers 416, fetch starts over.
    pins = default_pins()
    p = by_path(pins, "test.json")
    p.bytes_col = "-"
    serve(pins, hub, books)
    write_pins(tmp_path, pins)
    dest = tmp_path / "dest"
    f = dest / p.repo / p.path
    f.parent.mkdir(parents=True)
    Path(str(f) + ".part").write_bytes(p.data)
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    assert [q.headers.get("range") for q in hub.gets(p.url_path)] == [f"bytes={len(p.data)}-", None]
    assert_in_place(dest, pins)


def test_present_file_that_does_not_match_is_replaced(tmp_path, hub, books, setup):
    pins, dest = setup
    p = by_path(pins, "tokenizer.json")
    f = dest / p.repo / p.path
    f.parent.mkdir(parents=True)
    f.write_bytes(b"x" * len(p.data))
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    assert len(hub.gets(p.url_path)) == 1
    assert_in_place(dest, pins)


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
def test_interrupt_stops_every_download_and_a_rerun_completes(tmp_path, hub, books, setup):
    pins, dest = setup
    hub.delay = books.delay = 2.0
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "REV_FILE": str(tmp_path / "REV"),
        "BOOKS_FILE": str(tmp_path / "BOOKS"),
        "HF_ENDPOINT": hub.url,
        "BOOKS_ENDPOINT": books.url,
        "NO_PROXY": "*",
    }
    proc = subprocess.Popen(
        [BASH, str(FETCH), str(dest)],
        env=env,
        start_new_session=True,  # its own process group, like a shell job
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 10
        while len(hub.gets()) + len(books.gets()) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _processes_showing(str(dest)), "curl should be running"
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    time.sleep(0.1)
    assert _processes_showing(str(dest)) == []  # no curl left behind
    hub.delay = books.delay = 0.0
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    assert_in_place(dest, pins)


# --------------------------------------------------------------------------------------------
# Failures


def test_corrupted_file_is_deleted_and_reported(tmp_path, hub, books, setup):
    pins, dest = setup
    p = by_path(pins, "tokenizer.json")
    hub.corrupt.add(p.url_path)
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 1, r.out
    actual = hashlib.sha256(bytes(b ^ 0x5A for b in p.data)).hexdigest()
    last = r.last_lines(1)[0]
    assert p.rel in last
    assert p.sha in last and actual in last
    assert f"expected {len(p.data)} bytes" in last
    f = dest / p.repo / p.path
    assert not f.exists() and not Path(str(f) + ".part").exists()
    assert_in_place(dest, [q for q in pins if q is not p])


def test_404_is_reported_not_retried(tmp_path, hub, books, setup):
    pins, dest = setup
    p = by_path(pins, "202-0.txt")
    books.missing.add(p.url_path)
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 1, r.out
    assert len(books.gets(p.url_path)) == 1
    last = r.last_lines(2)
    assert "5 of 6 files are in place" in last[0]
    assert last[1].startswith("FAILED") and p.rel in last[1]
    assert "HTTP 404" in last[1] and books.url + p.url_path in last[1]
    assert_in_place(dest, [q for q in pins if q is not p])
    assert not (dest / p.repo / p.path).exists()


def test_transient_500_is_retried(tmp_path, hub, books, setup):
    pins, dest = setup
    p = by_path(pins, "data/train-0.jsonl")
    hub.fail_500[p.url_path] = 2
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    assert len(hub.gets(p.url_path)) == 3
    assert "HTTP 500" in r.stderr
    assert_in_place(dest, pins)


def test_retries_are_bounded(tmp_path, hub, books, setup):
    pins, dest = setup
    p = by_path(pins, "test.json")
    hub.fail_500[p.url_path] = 100
    r = run_fetch(tmp_path, hub, books, dest, env={"FETCH_RETRIES": "2"})
    assert r.returncode == 1, r.out
    assert len(hub.gets(p.url_path)) == 3
    last = r.last_lines(1)[0]
    assert p.rel in last and "HTTP 500" in last and "gave up after 3 attempts" in last


def test_hf_token_goes_to_the_hub_only(tmp_path, hub, books, setup):
    pins, dest = setup
    p = by_path(pins, "test.json")
    hub.missing.add(p.url_path)
    hub.cmdline_needle = books.cmdline_needle = TOKEN
    r = run_fetch(tmp_path, hub, books, dest, env={"HF_TOKEN": TOKEN})
    assert r.returncode == 1, r.out
    assert len(hub.gets()) == 4 and len(books.gets()) == 2
    for q in hub.gets():
        assert q.headers.get("authorization") == f"Bearer {TOKEN}"
    for q in books.gets():
        assert "authorization" not in q.headers
        assert TOKEN not in str(q.headers)
    assert TOKEN not in r.out  # not even in the 404 report
    assert "HTTP 404" in r.last_lines(1)[0]
    if Path("/proc/self/cmdline").exists():
        assert hub.cmdline_hits == [] and books.cmdline_hits == []
    assert_in_place(dest, [q for q in pins if q is not p])


def test_no_token_no_authorization_header(tmp_path, hub, books, setup):
    pins, dest = setup
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    assert_in_place(dest, pins)
    assert all("authorization" not in q.headers for q in hub.gets() + books.gets())


# --------------------------------------------------------------------------------------------
# Pins written "-"


def test_dash_pins_are_accepted_and_printed_as_ready_lines(tmp_path, hub, books):
    pins = default_pins()
    both = by_path(pins, "test.json")
    both.bytes_col = both.sha_col = "-"
    size_only = by_path(pins, "data/train-0.jsonl")
    size_only.bytes_col = "-"
    book = by_path(pins, "101-0.txt")
    book.sha_col = "-"
    serve(pins, hub, books)
    write_pins(tmp_path, pins)
    dest = tmp_path / "dest"
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    assert_in_place(dest, pins)

    def ready(p: Pin) -> str:
        if p.kind == "book":
            cols = [p.ebook, p.lang, p.repo, p.rev, p.path, str(len(p.data)), p.sha]
            return " ".join(cols) + " " + p.title
        return " ".join([p.kind, p.repo, p.rev, p.path, str(len(p.data)), p.sha])

    def printed(out: str) -> list[str]:
        return [" ".join(ln.split()) for ln in out.splitlines() if not ln.startswith("#")]

    expected = [ready(both), ready(size_only), ready(book)]
    assert sorted(printed(r.stdout)) == sorted(" ".join(e.split()) for e in expected)
    # The title keeps its own spacing.
    assert book.title in r.stdout
    # A ready line is a valid pin line: with it, the next run is an ordinary verified run.
    hub.clear()
    books.clear()
    r2 = run_fetch(tmp_path, hub, books, dest)
    assert r2.returncode == 0, r2.out
    assert hub.gets() == [] and books.gets() == []
    assert sorted(printed(r2.stdout)) == sorted(printed(r.stdout))


def test_dash_pin_still_checks_the_known_value(tmp_path, hub, books):
    pins = default_pins()
    p = by_path(pins, "test.json")
    p.bytes_col = "-"
    p.sha_col = "0" * 64
    serve(pins, hub, books)
    write_pins(tmp_path, pins)
    dest = tmp_path / "dest"
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 1, r.out
    last = r.last_lines(1)[0]
    assert p.rel in last and "0" * 64 in last and p.sha in last
    assert r.stdout == ""
    f = dest / p.repo / p.path
    assert not f.exists() and not Path(str(f) + ".part").exists()


# --------------------------------------------------------------------------------------------
# Refused before anything is downloaded


def _assert_nothing_fetched(hub, books, dest: Path) -> None:
    assert hub.gets() == [] and books.gets() == []
    assert files_under(dest) == []


@pytest.mark.parametrize(
    "where,line,why",
    [
        ("REV", "dataset  org/x  {rev}  ../x  10  -", "path '../x' has a '..' component"),
        ("REV", "dataset  org/x  {rev}  a/../../x  10  -", "has a '..' component"),
        ("REV", "model  org/x  {rev}  /etc/x  10  -", "path '/etc/x' is absolute"),
        ("REV", "dataset  ../evil  {rev}  x.json  10  -", "repo '../evil' has a '..' component"),
        ("REV", "dataset  /abs/repo  {rev}  x.json  10  -", "repo '/abs/repo' is absolute"),
        ("BOOKS", "9  en  books/9  {rev}  ../../x.txt  10  -  T", "has a '..' component"),
        ("BOOKS", "9  en  books/9  {rev}  /tmp/x.txt  10  -  T", "is absolute"),
    ],
)
def test_unsafe_paths_are_refused(tmp_path, hub, books, where, line, why):
    pins = default_pins()
    serve(pins, hub, books)
    extra = line.format(rev=_hex("r")) + "\n"
    rev, bks = write_pins(
        tmp_path,
        pins,
        rev_extra=extra if where == "REV" else "",
        books_extra=extra if where == "BOOKS" else "",
    )
    n = len((rev if where == "REV" else bks).read_text().splitlines())
    dest = tmp_path / "d" / "dest"
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode != 0
    pin_file = rev if where == "REV" else bks
    assert f"{pin_file}:{n}: refused:" in r.stderr
    assert why in r.stderr
    assert "nothing was downloaded" in r.stderr
    _assert_nothing_fetched(hub, books, tmp_path / "d")
    assert not (tmp_path / "x").exists() and not (tmp_path / "d" / "x").exists()


@pytest.mark.parametrize(
    "where,line,message",
    [
        ("REV", "dataset  org/x  {rev}  x.json  10", "expected 6 columns"),
        ("REV", "dataset  org/x  {rev}  x.json  10  -  extra", "expected 6 columns"),
        ("REV", "dataset  org/x  {rev}  x.json  12x  -", "bytes must be a number or '-'"),
        ("REV", "dataset  org/x  {rev}  x.json  10  abc123", "sha256 must be 64 hex digits"),
        ("REV", "space  org/x  {rev}  x.json  10  -", "kind must be 'dataset' or 'model'"),
        ("REV", "dataset  org/x  {rev}  x.json  10  " + "a" * 63, "sha256 must be 64 hex digits"),
        ("REV", "dataset  org-b/beta  {rev}  test.json  10  -", "already pinned at"),
        ("REV", "model  org-a/alpha  {rev}  data/train-0.jsonl  10  -", "already pinned at"),
        ("BOOKS", "9  en  books/9  {rev}  9.txt  10  -", "expected 8 or more columns"),
        ("BOOKS", "nine  en  books/9  {rev}  9.txt  10  -  T", "ebook must be a number"),
        ("BOOKS", "9  en  books/101  {rev}  101-0.txt  10  -  T", "already pinned at"),
    ],
)
def test_malformed_lines_are_refused_with_their_line_number(
    tmp_path, hub, books, where, line, message
):
    pins = default_pins()
    serve(pins, hub, books)
    extra = "\n# a comment line\n" + line.format(rev=_hex("r")) + "   # trailing comment\n"
    rev, bks = write_pins(
        tmp_path,
        pins,
        rev_extra=extra if where == "REV" else "",
        books_extra=extra if where == "BOOKS" else "",
    )
    pin_file = rev if where == "REV" else bks
    n = len(pin_file.read_text().splitlines())
    dest = tmp_path / "dest"
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode != 0
    first = r.stderr.splitlines()[0]
    assert first.startswith(f"{pin_file}:{n}: ") and message in first
    _assert_nothing_fetched(hub, books, dest)


def test_dest_not_writable(tmp_path, hub, books, setup):
    blocker = tmp_path / "somefile"
    blocker.write_text("a regular file\n")
    dest = blocker / "dest"
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert str(dest) in lines[0] and "destination" in lines[0]
    assert hub.gets() == [] and books.gets() == []


def test_curl_missing(tmp_path, hub, books, setup):
    # A PATH with every program of the current PATH (bash and coreutils among them) but curl.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for d in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for entry in os.scandir(d):
            target = bindir / entry.name
            if entry.name != "curl" and not target.exists() and os.access(entry.path, os.X_OK):
                target.symlink_to(entry.path)
    assert (bindir / "bash").exists() and (bindir / "sha256sum").exists()
    assert not (bindir / "curl").exists()
    dest = tmp_path / "dest"
    r = run_fetch(tmp_path, hub, books, dest, env={"PATH": str(bindir)})
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "curl" in lines[0] and "not found" in lines[0]
    _assert_nothing_fetched(hub, books, dest)


# --------------------------------------------------------------------------------------------
# The repository's own pins


def _real_pins() -> list[tuple[str, int, list[str], str]]:
    """(file, line, columns, expected URL path) of every pin in the repo's REV and BOOKS."""
    out = []
    for name in ("REV", "BOOKS"):
        for n, raw in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1):
            cols = raw.split("#", 1)[0].split()
            if not cols:
                continue
            if name == "REV":
                kind, repo, rev, path = cols[:4]
                assert len(cols) == 6 and kind in ("dataset", "model"), (name, n)
                prefix = "/datasets" if kind == "dataset" else ""
                url = f"{prefix}/{repo}/resolve/{rev}/{path}"
            else:
                assert len(cols) >= 8, (name, n)
                repo, commit, path = cols[2:5]
                url = f"/{repo}/{commit}/{path}"
            out.append((name, n, cols, url))
    return out


def test_real_pins_parse_and_use_the_right_urls(tmp_path, hub, books):
    real = _real_pins()
    rev_lines = [cols for name, _, cols, _ in real if name == "REV"]
    book_lines = [cols for name, _, cols, _ in real if name == "BOOKS"]
    assert rev_lines and book_lines
    # The pins the design says are not yet known are written "-" and must be accepted.
    dash = {c[1]: (c[4], c[5]) for c in rev_lines if "-" in (c[4], c[5])}
    assert dash.get("SWE-bench/SWE-smith-trajectories") == ("-", "-")
    assert dash.get("zai-org/LongWriter-6k", ("", ""))[0] == "-"

    hub.all_404 = books.all_404 = True
    dest = tmp_path / "dest"
    r = run_fetch(tmp_path, hub, books, dest, env={"FETCH_JOBS": "2"}, pins_env=False)
    assert r.returncode == 1, r.out
    assert "pin files" not in r.stderr  # no line was refused
    hub_paths = sorted(q.path for q in hub.gets())
    book_paths = sorted(q.path for q in books.gets())
    assert hub_paths == sorted(u for name, _, _, u in real if name == "REV")
    assert book_paths == sorted(u for name, _, _, u in real if name == "BOOKS")
    for repo in dash:
        assert any(f"/{repo}/resolve/" in p for p in hub_paths)
    failed = [ln for ln in r.stderr.splitlines() if ln.startswith("FAILED")]
    assert len(failed) == len(real)
    assert r.stderr.strip().splitlines()[-len(real) :] == failed
    for name, _, cols, url in real:
        repo, path = (cols[1], cols[3]) if name == "REV" else (cols[2], cols[4])
        full = (hub.url if name == "REV" else books.url) + url
        assert any(ln.endswith(f" {repo}/{path}: HTTP 404 from {full}") for ln in failed), full
    assert files_under(dest) == []
