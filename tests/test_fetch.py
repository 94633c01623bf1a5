"""Tests of fetch.sh against local HTTP servers (127.0.0.1 only, no other network).

Two fake servers (tests/fakehttp.py) run in threads: a Hub serving
`/datasets/<repo>/resolve/<rev>/<path>` and `/<repo>/resolve/<rev>/<path>`, and a book mirror
serving `/<repo>/<commit>/<path>`. They honour Range requests, record every request and can be
told to fail in the ways fetch.sh must handle. Every run is marked through its environment, so
that the tests can see each process it started, and check that none outlives it.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from fakehttp import (
    FakeServer,
    closed_port_url,
    processes_marked,
    processes_showing,
    read_if_there,
)

ROOT = Path(__file__).resolve().parent.parent
FETCH = ROOT / "fetch.sh"
BASH = shutil.which("bash") or "/bin/bash"
TOKEN = "hf_test_secret_0123456789"
MARK = "KERN_FETCH_TEST_RUN"
HAS_PROC = Path("/proc/self/environ").exists()
needs_proc = pytest.mark.skipif(not HAS_PROC, reason="needs /proc")


def wait_until(done: Callable[[], object], seconds: float = 10.0) -> bool:
    """Poll done() until it is true or the time is up (a bound on waiting, not an assertion)."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


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


# --------------------------------------------------------------------------------------------
# Running fetch.sh


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


def fetch_env(
    tmp: Path,
    hub: FakeServer,
    books: FakeServer,
    *,
    env: dict[str, str] | None = None,
    pins_env: bool = True,
    mark: str | None = None,
) -> dict[str, str]:
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
        MARK: mark or uuid.uuid4().hex,
    }
    if pins_env:
        e["REV_FILE"] = str(tmp / "REV")
        e["BOOKS_FILE"] = str(tmp / "BOOKS")
    e.update(env or {})
    return e


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
    args: list[str] | None = None,
    timeout: float = 120,
) -> Run:
    e = fetch_env(tmp, hub, books, env=env, pins_env=pins_env)
    if args is None:
        args = [str(dest)] if dest is not None else []
    p = subprocess.run(
        [BASH, str(script), *args],
        env=e,
        cwd=cwd or tmp,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    # The temporary directory is removed on exit, and no process outlives the run.
    assert list((tmp / "tmpdir").iterdir()) == []
    if HAS_PROC:
        assert wait_until(lambda: not processes_marked(e[MARK])), processes_marked(e[MARK])
    return Run(p.returncode, p.stdout, p.stderr)


@pytest.fixture
def started(tmp_path):
    """start(args, env) runs fetch.sh in the background, its output going to files; every process
    such a run started that is still alive at the end of the test is killed."""
    runs: list[tuple[subprocess.Popen, dict[str, str]]] = []

    def start(hub, books, dest: Path, env: dict[str, str] | None = None, name: str = "run"):
        e = fetch_env(tmp_path, hub, books, env=env)
        out = open(tmp_path / f"{name}.out", "w")
        err = open(tmp_path / f"{name}.err", "w")
        proc = subprocess.Popen(
            [BASH, str(FETCH), str(dest)],
            env=e,
            cwd=tmp_path,
            stdout=out,
            stderr=err,
            start_new_session=True,  # its own process group, like a shell job
        )
        out.close()
        err.close()
        runs.append((proc, e))
        return proc, e

    yield start
    for proc, e in runs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if HAS_PROC:
            for pid in processes_marked(e[MARK]):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def assert_in_place(dest: Path, pins: list[Pin]) -> None:
    for p in pins:
        f = dest / p.repo / p.path
        assert not f.is_symlink(), p.rel
        assert f.read_bytes() == p.data, p.rel
        assert not Path(str(f) + ".part").exists(), p.rel


def files_under(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file()) if d.exists() else []


def snapshot(d: Path) -> dict[str, object]:
    """Everything under d: a file's bytes, a link's target, a directory as 'dir'."""
    out: dict[str, object] = {}
    for p in sorted(d.rglob("*")):
        key = str(p.relative_to(d))
        if p.is_symlink():
            out[key] = ("link", os.readlink(p))
        elif p.is_dir():
            out[key] = "dir"
        else:
            out[key] = p.read_bytes()
    return out


def path_without(tmp: Path, tool: str) -> str:
    """A PATH with every program of the current PATH (bash and coreutils among them) but tool."""
    bindir = tmp / f"bin-without-{tool}"
    bindir.mkdir()
    for d in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for entry in os.scandir(d):
            target = bindir / entry.name
            if entry.name != tool and not target.exists() and os.access(entry.path, os.X_OK):
                target.symlink_to(entry.path)
    assert (bindir / "bash").exists() and (bindir / "sha256sum").exists()
    assert not (bindir / tool).exists()
    return str(bindir)


def serve_and_pin(tmp_path: Path, hub: FakeServer, books: FakeServer, pins: list[Pin]) -> Path:
    """Serve these pins, write them as REV and BOOKS, and return the DEST to fetch them into."""
    serve(pins, hub, books)
    write_pins(tmp_path, pins)
    return tmp_path / "dest"


@pytest.fixture
def setup(tmp_path, hub, books):
    """The default pins written, served by both servers; returns (pins, dest)."""
    pins = default_pins()
    return pins, serve_and_pin(tmp_path, hub, books, pins)


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
    # DEST holds the files and nothing else: no lock file, no probe.
    assert sorted(p.name for p in dest.iterdir()) == ["acme", "books", "org-a", "org-b"]


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


def test_a_dest_that_is_a_symlink_is_followed(tmp_path, hub, books, setup):
    pins, _ = setup
    real = tmp_path / "disk" / "src"
    real.mkdir(parents=True)
    link = tmp_path / "src"
    link.symlink_to(real)
    r = run_fetch(tmp_path, hub, books, link)
    assert r.returncode == 0, r.out
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert_in_place(real, pins)


def test_a_dest_that_is_a_dangling_symlink_is_refused(tmp_path, hub, books, setup):
    link = tmp_path / "src"
    link.symlink_to(tmp_path / "nowhere")
    r = run_fetch(tmp_path, hub, books, link)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"fetch.sh: the destination '{link}' is a symbolic link to a directory that does not exist"
    ]
    assert not (tmp_path / "nowhere").exists()
    assert hub.gets() == [] and books.gets() == []


@pytest.mark.parametrize("jobs", [1, 3])
def test_fetch_jobs_bounds_parallel_downloads(tmp_path, hub, books, setup, jobs):
    pins, dest = setup
    books.gauge = hub.gauge  # count the requests in flight on both servers together
    hub.delay = books.delay = 0.15
    r = run_fetch(tmp_path, hub, books, dest, env={"FETCH_JOBS": str(jobs)})
    assert r.returncode == 0, r.out
    assert_in_place(dest, pins)
    assert hub.gauge.max == jobs


def _odd_paths(n: int, seed: str) -> list[str]:
    """Paths made of characters that mean something in a URL, to curl's globbing or to a shell.
    A pin path cannot hold whitespace (it separates columns) or '#' (it starts a comment)."""
    pool = "abcXYZ019-._~!$&'()*+,;=:@[]{}%?^`|\\<>\"éü中文ж"
    rnd = random.Random(seed)
    out = []
    while len(out) < n:
        parts = ["".join(rnd.choices(pool, k=rnd.randint(1, 8))) for _ in range(rnd.randint(1, 3))]
        if all(c not in (".", "..") for c in parts):
            out.append("/".join(parts))
    return out


def test_pin_paths_are_requested_literally(tmp_path, hub, books):
    rev = _hex("odd")
    fixed = ["odd/a[1-2]{x,y}.json", "odd/100%41?q=1&r=2;v", "odd/é中*.txt"]
    pins = [
        Pin("dataset", "org/odd", rev, path, _data(path, 100 + k))
        for k, path in enumerate(fixed + _odd_paths(5, "odd"))
    ]
    pins.append(Pin("book", "books/odd", rev, "[x]{y}%3F?.txt", _data("book", 300), "9", "en", "T"))
    dest = serve_and_pin(tmp_path, hub, books, pins)
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    assert_in_place(dest, pins)
    # One request per pin, percent-encoded as Python's quote() does (no glob, no query).
    sent = sorted(q.raw for q in hub.gets() + books.gets())
    assert sent == sorted(quote(p.url_path, safe="/") for p in pins)


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
    hub.faults[p.url_path] = ["cut"]
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


@pytest.mark.parametrize("server", ["answers 416", "ignores Range (200, whole body)"])
def test_refused_resume_is_fetched_afresh(tmp_path, hub, books, setup, server):
    pins, dest = setup
    p = by_path(pins, "data/train-0.jsonl")
    (hub.refuse_range if "416" in server else hub.ignore_range).add(p.url_path)
    f = dest / p.repo / p.path
    f.parent.mkdir(parents=True)
    Path(str(f) + ".part").write_bytes(p.data[:1000])
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    assert [q.headers.get("range") for q in hub.gets(p.url_path)] == ["bytes=1000-", None]
    assert "refused to resume" in r.stderr
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


# --------------------------------------------------------------------------------------------
# Never outside DEST: links and other names in the way


def _outside(tmp_path: Path, what: str, data: bytes) -> Path:
    """A target outside DEST for a link: a file holding a prefix of data, or other bytes, or a
    directory with a file, or nothing at all (a dangling link)."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "keep.txt").write_bytes(b"not fetch.sh's\n")
    target = out / "target"
    if what == "prefix":
        target.write_bytes(data[:1000])
    elif what == "matching":
        target.write_bytes(data)
    elif what == "other bytes":
        target.write_bytes(b"\0" * 1000)
    elif what == "directory":
        target.mkdir()
        (target / "inside.txt").write_bytes(b"keep me\n")
    return target


@pytest.mark.parametrize("what", ["prefix", "other bytes", "dangling"])
def test_a_part_that_is_a_symlink_is_removed_not_written_through(tmp_path, hub, books, setup, what):
    pins, dest = setup
    p = by_path(pins, "data/train-0.jsonl")
    target = _outside(tmp_path, what, p.data)
    before = snapshot(tmp_path / "outside")
    part = dest / p.repo / (p.path + ".part")
    part.parent.mkdir(parents=True)
    part.symlink_to(target)
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    assert snapshot(tmp_path / "outside") == before
    assert [q.headers.get("range") for q in hub.gets(p.url_path)] == [None]
    assert f"{p.rel}.part is a symbolic link; removed it (not its target)" in r.stderr
    assert_in_place(dest, pins)


@pytest.mark.parametrize("what", ["matching", "other bytes", "dangling", "directory"])
def test_a_pinned_file_that_is_a_symlink_is_replaced_not_followed(
    tmp_path, hub, books, setup, what
):
    pins, dest = setup
    p = by_path(pins, "test.json")
    target = _outside(tmp_path, what, p.data)
    before = snapshot(tmp_path / "outside")
    f = dest / p.repo / p.path
    f.parent.mkdir(parents=True)
    f.symlink_to(target)
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    assert snapshot(tmp_path / "outside") == before
    assert len(hub.gets(p.url_path)) == 1
    assert f"{p.rel} is a symbolic link; removed it (not its target)" in r.stderr
    assert_in_place(dest, pins)


def test_a_part_with_other_hard_links_is_not_written_through(tmp_path, hub, books, setup):
    pins, dest = setup
    p = by_path(pins, "data/train-1.parquet")
    outside = tmp_path / "outside.bin"
    outside.write_bytes(p.data[:5000])
    part = dest / p.repo / (p.path + ".part")
    part.parent.mkdir(parents=True)
    os.link(outside, part)
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    assert outside.read_bytes() == p.data[:5000]
    assert [q.headers.get("range") for q in hub.gets(p.url_path)] == [None]
    assert "has other hard links" in r.stderr
    assert_in_place(dest, pins)


@pytest.mark.parametrize(
    "where,how",
    [
        ("org-a", "symlink"),
        ("org-a/alpha/data", "symlink"),
        ("org-a/alpha", "file"),
    ],
)
def test_a_directory_in_dest_that_is_not_one_fails_its_files_only(
    tmp_path, hub, books, setup, where, how
):
    pins, dest = setup
    elsewhere = tmp_path / "outside"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_bytes(b"not fetch.sh's\n")
    blocker = dest / where
    blocker.parent.mkdir(parents=True)
    if how == "symlink":
        blocker.symlink_to(elsewhere)
    else:
        blocker.write_bytes(b"a file where a directory is pinned\n")
    before = snapshot(elsewhere), snapshot(dest)
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 1, r.out
    # Nothing changed outside DEST nor at the blocker; the two pins behind it failed.
    assert snapshot(elsewhere) == before[0]
    assert {k: v for k, v in snapshot(dest).items() if k in before[1]} == before[1]
    behind = [q for q in pins if q.repo == "org-a/alpha"]
    assert all(hub.gets(q.url_path) == [] for q in behind)
    failed = r.last_lines(2)
    why = (
        "is a symbolic link; refused, so as not to write outside the destination"
        if how == "symlink"
        else "exists and is not a directory"
    )
    assert sorted(ln.split(":")[0] for ln in failed) == sorted(f"FAILED  {q.rel}" for q in behind)
    assert all(f"{dest / where} {why}" in ln for ln in failed), failed
    assert_in_place(dest, [q for q in pins if q not in behind])


@pytest.mark.parametrize("name", ["file", "part"])
def test_a_pinned_name_that_is_a_directory_is_left_alone(tmp_path, hub, books, setup, name):
    pins, dest = setup
    p = by_path(pins, "test.json")
    d = dest / p.repo / (p.path + (".part" if name == "part" else ""))
    d.mkdir(parents=True)
    (d / "mine.txt").write_bytes(b"mine\n")
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 1, r.out
    assert (d / "mine.txt").read_bytes() == b"mine\n"
    assert hub.gets(p.url_path) == []
    last = r.last_lines(1)[0]
    assert last == f"FAILED  {p.rel}: {d} exists and is not a regular file"
    assert_in_place(dest, [q for q in pins if q is not p])


# --------------------------------------------------------------------------------------------
# Never more than the pinned bytes


@pytest.mark.parametrize(
    "start, extra",
    [("fresh", 5000), ("resume", 5000), ("resume", 1000)],
    ids=["fresh", "resume", "resume-within-the-pinned-size"],
)
def test_a_server_sending_more_than_the_pin_is_stopped(tmp_path, hub, books, setup, start, extra):
    """The cap is the pinned size less what the .part holds: a resumed body of the remaining
    2,000 bytes and 1,000 more is stopped, though it is no longer than the pinned 3,000."""
    pins, dest = setup
    p = by_path(pins, "data/train-0.jsonl")
    hub.extra[p.url_path] = b"x" * extra
    part = dest / p.repo / (p.path + ".part")
    if start == "resume":
        part.parent.mkdir(parents=True)
        part.write_bytes(p.data[:1000])
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 1, r.out
    assert len(hub.gets(p.url_path)) == 1  # not retried
    last = r.last_lines(1)[0]
    assert last.startswith(f"FAILED  {p.rel}: the server sent more than the pinned 3000 bytes")
    assert not part.exists() and not (dest / p.rel).exists()
    assert_in_place(dest, [q for q in pins if q is not p])


def test_an_endless_body_is_stopped_at_the_pinned_size(tmp_path, hub, books, setup, started):
    pins, dest = setup
    p = by_path(pins, "data/train-0.jsonl")
    hub.endless.add(p.url_path)
    part = dest / p.repo / (p.path + ".part")
    proc, _ = started(hub, books, dest)
    largest = 0

    def watch() -> bool:
        nonlocal largest
        try:
            largest = max(largest, part.stat().st_size)
        except FileNotFoundError:
            pass
        return proc.poll() is not None or largest > len(p.data)

    wait_until(watch, 30)
    assert largest <= len(p.data)
    assert proc.wait(30) == 1
    err = (tmp_path / "run.err").read_text()
    assert f"FAILED  {p.rel}: the server sent more than the pinned 3000 bytes" in err
    assert not part.exists()
    assert_in_place(dest, [q for q in pins if q is not p])


def test_a_failed_write_is_reported_and_the_part_kept(tmp_path, hub, books):
    # A file-size limit of 2 KiB stands in for a full disk: writing past it fails.
    pins = [by_path(default_pins(), name) for name in ("data/train-0.jsonl", "test.json")]
    dest = serve_and_pin(tmp_path, hub, books, pins)
    limited = tmp_path / "limited.sh"
    limited.write_text(f"ulimit -f 2; trap '' XFSZ; exec bash {FETCH} \"$@\"\n")
    r = run_fetch(tmp_path, hub, books, dest, script=limited)
    assert r.returncode == 1, r.out
    p = pins[0]
    part = dest / p.repo / (p.path + ".part")
    assert r.last_lines(1) == [f"FAILED  {p.rel}: cannot write {part}: File too large"]
    assert part.read_bytes() == p.data[:2048]  # kept, for a resume once there is room
    assert_in_place(dest, pins[1:])
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    assert hub.gets(p.url_path)[-1].headers.get("range") == "bytes=2048-"
    assert_in_place(dest, pins)


# --------------------------------------------------------------------------------------------
# One run at a time, and a killed run stops


def test_two_runs_into_one_dest_take_turns(tmp_path, hub, books, setup, started):
    pins, dest = setup
    hub.gate = books.gate = threading.Event()  # the first run's requests wait here
    first, _ = started(hub, books, dest, env={"FETCH_JOBS": "1"}, name="first")
    assert wait_until(lambda: len(hub.gets() + books.gets()) == 1)
    second, _ = started(hub, books, dest, name="second")
    waiting = "another fetch.sh is downloading into"
    wait_until(
        lambda: (
            waiting in (tmp_path / "second.err").read_text() or len(hub.gets() + books.gets()) > 1
        )
    )
    assert waiting in (tmp_path / "second.err").read_text()
    assert len(hub.gets() + books.gets()) == 1  # the second run has sent nothing
    hub.gate.set()
    assert first.wait(30) == 0, (tmp_path / "first.err").read_text()
    assert second.wait(30) == 0, (tmp_path / "second.err").read_text()
    # Every file downloaded once, by the first run; the second found them in place.
    assert sorted(q.path for q in hub.gets() + books.gets()) == sorted(p.url_path for p in pins)
    second_err = (tmp_path / "second.err").read_text()
    assert all(f"{p.rel} (already present" in second_err for p in pins)
    assert_in_place(dest, pins)


def test_without_flock_the_run_warns_and_goes_on(tmp_path, hub, books, setup):
    pins, dest = setup
    r = run_fetch(tmp_path, hub, books, dest, env={"PATH": path_without(tmp_path, "flock")})
    assert r.returncode == 0, r.out
    assert r.stderr.splitlines()[0] == (
        f"fetch.sh: warning: flock (util-linux) not found; a second fetch.sh into {dest}"
        " at the same time is not prevented"
    )
    assert_in_place(dest, pins)


@needs_proc
def test_interrupt_stops_every_download_and_a_rerun_completes(tmp_path, hub, books, setup, started):
    pins, dest = setup
    hub.delay = books.delay = 2.0
    proc, env = started(hub, books, dest)
    assert wait_until(lambda: len(hub.gets()) + len(books.gets()) >= 4)
    assert processes_showing(hub.url), "curl should be running"
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does
    assert proc.wait(10) == 130
    assert "interrupted" in (tmp_path / "run.err").read_text()
    assert wait_until(lambda: not processes_marked(env[MARK])), processes_marked(env[MARK])
    hub.delay = books.delay = 0.0
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    assert_in_place(dest, pins)


@needs_proc
def test_sigkill_of_the_main_process_stops_every_download(tmp_path, hub, books, setup, started):
    pins, dest = setup
    p = by_path(pins, "data/train-1.parquet")
    part = dest / p.repo / (p.path + ".part")
    hub.hold = threading.Event()  # the Hub sends half of each file, then waits
    proc, env = started(hub, books, dest, env={"HF_TOKEN": TOKEN, "FETCH_JOBS": "6"})
    assert wait_until(lambda: part.exists() and part.stat().st_size > 0)
    assert wait_until(lambda: len(books.gets()) == 2)
    # curl reads the token from a pipe: it is not in curl's environment either.
    curls = [pid for pid, cmd in processes_marked(env[MARK]).items() if cmd.startswith("curl ")]
    assert curls
    for pid in curls:  # a curl that has ended since (a book done) has no environment to show
        assert TOKEN.encode() not in read_if_there(Path(f"/proc/{pid}/environ"))
    proc.kill()  # SIGKILL: no trap runs in the main process
    proc.wait()
    assert wait_until(lambda: not processes_marked(env[MARK]), 30), (
        f"the watchdog left these running 30 s after the kill: {processes_marked(env[MARK])}"
    )
    # The Hub now sends the rest; no one is left to write it.
    size = part.stat().st_size
    hub.hold.set()
    time.sleep(0.3)
    assert part.stat().st_size == size < len(p.data)
    assert not (dest / p.rel).exists()
    # The token reached the Hub and nothing else, and was never written to a file.
    assert all(q.headers.get("authorization") == f"Bearer {TOKEN}" for q in hub.gets())
    assert all("authorization" not in q.headers for q in books.gets())
    assert list((tmp_path / "tmpdir").iterdir()) == []  # the watchdog cleaned up
    for f in files_under(tmp_path / "tmpdir") + files_under(dest):
        assert TOKEN.encode() not in f.read_bytes(), f
    # A rerun resumes from the .part.
    hub.hold = None
    hub.clear()
    r = run_fetch(tmp_path, hub, books, dest, timeout=60)  # seconds here; a bound, not a speed
    assert r.returncode == 0, r.out
    assert hub.gets(p.url_path)[0].headers.get("range") == f"bytes={size}-"
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


@pytest.mark.parametrize(
    "fault,shown",
    [
        (500, "HTTP 500"),
        (503, "HTTP 503"),
        (429, "HTTP 429"),
        (408, "HTTP 408"),
        ("empty", "(52) Empty reply from server"),
        ("reset", "(56) Recv failure: Connection reset by peer"),
        ("cut", "(18) transfer closed"),
    ],
)
def test_transient_failures_are_retried(tmp_path, hub, books, setup, fault, shown):
    pins, dest = setup
    p = by_path(pins, "data/train-0.jsonl")
    hub.faults[p.url_path] = [fault, fault]
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    assert len(hub.gets(p.url_path)) == 3
    retries = [ln for ln in r.stderr.splitlines() if ln.split()[:1] == ["retry"]]
    assert len(retries) == 2 and all(shown in ln for ln in retries), r.stderr
    assert_in_place(dest, pins)


def test_retries_are_bounded(tmp_path, hub, books, setup):
    pins, dest = setup
    p = by_path(pins, "test.json")
    hub.faults[p.url_path] = [500] * 100
    r = run_fetch(tmp_path, hub, books, dest, env={"FETCH_RETRIES": "2"})
    assert r.returncode == 1, r.out
    assert len(hub.gets(p.url_path)) == 3
    last = r.last_lines(1)[0]
    assert p.rel in last and "HTTP 500" in last and "gave up after 3 attempts" in last


@pytest.mark.parametrize("retries", [0, 1, 3])
def test_a_server_that_cuts_bodies_and_ignores_range_is_reported_as_such(
    tmp_path, hub, books, setup, retries
):
    """Each attempt is counted (the resume refused among them), and the message says the server
    would not resume, not that it refused the download from the start."""
    pins, dest = setup
    p = by_path(pins, "data/train-0.jsonl")
    hub.ignore_range.add(p.url_path)
    hub.faults[p.url_path] = ["cut"] * 100
    r = run_fetch(tmp_path, hub, books, dest, env={"FETCH_RETRIES": str(retries)})
    assert r.returncode == 1, r.out
    ranges = [q.headers.get("range") for q in hub.gets(p.url_path)]
    assert ranges == ([None] if retries == 0 else [None, "bytes=1500-"] + [None] * retries)
    last = r.last_lines(1)[0]
    attempts = "1 attempt " if retries == 0 else f"{len(ranges)} attempts "
    assert last.startswith(f"FAILED  {p.rel}: curl: (18) ") and f"gave up after {attempts}" in last
    assert ("does not resume downloads (it answered a request from byte 1500 with HTTP 200), so"
            " each later attempt started from byte 0" in last) == (retries > 0)  # fmt: skip
    assert "from the start" not in r.stderr and "first byte" not in r.stderr


def test_a_download_refused_from_its_first_byte_says_so(tmp_path, hub, books, setup):
    pins, dest = setup
    p = by_path(pins, "test.json")
    hub.faults[p.url_path] = [416]
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 1, r.out
    assert r.last_lines(1)[0] == (
        f"FAILED  {p.rel}: the server refused the download from its first byte (HTTP 416, after 1"
        f" attempt): {hub.url}{p.url_path}"
    )


def test_connection_refused_is_retried_then_reported(tmp_path, hub, books, setup):
    pins, dest = setup
    nowhere = closed_port_url()
    r = run_fetch(tmp_path, hub, books, dest, env={"HF_ENDPOINT": nowhere, "FETCH_RETRIES": "1"})
    assert r.returncode == 1, r.out
    hub_pins = [p for p in pins if p.kind != "book"]
    failed = r.last_lines(len(hub_pins))
    assert len([ln for ln in r.stderr.splitlines() if "retry 1 of 1" in ln]) == len(hub_pins)
    for p in hub_pins:
        line = next(ln for ln in failed if ln.startswith(f"FAILED  {p.rel}: "))
        assert "(7) Failed to connect" in line and "gave up after 2 attempts" in line
        assert line.endswith(f" from {nowhere}{quote(p.url_path)}")
    assert_in_place(dest, [p for p in pins if p.kind == "book"])


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
    if HAS_PROC:
        assert hub.cmdline_hits == [] and books.cmdline_hits == []
    assert_in_place(dest, [q for q in pins if q is not p])


def test_hf_token_is_not_sent_on_after_a_redirect_to_another_server(tmp_path, hub, books, setup):
    # The Hub answers a resolve URL with a redirect to its CDN; the token stays with the Hub.
    pins, dest = setup
    p = by_path(pins, "tokenizer.json")
    books.files["/cdn/tokenizer.json"] = p.data
    hub.redirect[p.url_path] = books.url + "/cdn/tokenizer.json"
    r = run_fetch(tmp_path, hub, books, dest, env={"HF_TOKEN": TOKEN})
    assert r.returncode == 0, r.out
    assert hub.gets(p.url_path)[0].headers.get("authorization") == f"Bearer {TOKEN}"
    assert len(books.gets("/cdn/tokenizer.json")) == 1
    assert all("authorization" not in q.headers for q in books.gets())
    assert_in_place(dest, pins)


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
    dest = serve_and_pin(tmp_path, hub, books, pins)
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
    dest = serve_and_pin(tmp_path, hub, books, pins)
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 1, r.out
    last = r.last_lines(1)[0]
    assert p.rel in last and "0" * 64 in last and p.sha in last
    assert r.stdout == ""
    f = dest / p.repo / p.path
    assert not f.exists() and not Path(str(f) + ".part").exists()


@pytest.mark.parametrize(
    "dash,leftover",
    [
        ("sha256", "a prefix"),
        ("sha256", "the whole file"),
        ("bytes", "other bytes"),
        ("both", "a prefix"),
    ],
)
def test_dash_pin_never_trusts_a_leftover_part(tmp_path, hub, books, dash, leftover):
    pins = default_pins()
    p = by_path(pins, "data/train-0.jsonl")
    if dash != "sha256":
        p.bytes_col = "-"
    if dash != "bytes":
        p.sha_col = "-"
    dest = serve_and_pin(tmp_path, hub, books, pins)
    part = dest / p.repo / (p.path + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes({"a prefix": p.data[:1000], "other bytes": b"\0" * 1000}.get(leftover, p.data))
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 0, r.out
    assert [q.headers.get("range") for q in hub.gets(p.url_path)] == [None]
    assert "cannot be checked; downloading the whole file" in r.stderr
    assert f"{len(p.data)}  {p.sha}" in r.stdout  # the ready line has the true values
    assert_in_place(dest, pins)


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
        ("REV", "dataset  org/x  {rev}  x.json  10  abc123", "sha256 must be 64 lowercase hex"),
        ("REV", "space  org/x  {rev}  x.json  10  -", "kind must be 'dataset' or 'model'"),
        (
            "REV",
            "dataset  org/x  {rev}  x.json  10  " + "a" * 63,
            "sha256 must be 64 lowercase hex",
        ),
        ("REV", "dataset  org-b/beta  {rev}  test.json  10  -", "already pinned at"),
        ("REV", "model  org-a/alpha  {rev}  data/train-0.jsonl  10  -", "already pinned at"),
        ("BOOKS", "9  en  books/9  {rev}  9.txt  10  -", "expected 8 or more columns"),
        ("BOOKS", "nine  en  books/9  {rev}  9.txt  10  -  T", "ebook must be a number"),
        ("BOOKS", "9  en  books/101  {rev}  101-0.txt  10  -  T", "already pinned at"),
        # Two pins that need one name on disk: a file and the other's .part or directory.
        (
            "REV",
            "dataset  org-b/beta  {rev}  test.json.part  10  -",
            "destination org-b/beta/test.json.part collides on disk with org-b/beta/test.json,"
            " pinned at {rev_file}:4 (org-b/beta/test.json.part would be both a pinned file"
            " and a partial download)",
        ),
        (
            "REV",
            "dataset  org-b/beta  {rev}  test.json/x  10  -",
            "destination org-b/beta/test.json/x collides on disk with org-b/beta/test.json,"
            " pinned at {rev_file}:4 (org-b/beta/test.json would be both a directory and a"
            " pinned file)",
        ),
        (
            "REV",
            "dataset  org-a/alpha  {rev}  data  10  -",
            "destination org-a/alpha/data collides on disk with org-a/alpha/data/train-0.jsonl",
        ),
        (
            "REV",
            "dataset  org/y  {rev}  f.part  10  -\ndataset  org/y  {rev}  f  10  -",
            "destination org/y/f collides on disk with org/y/f.part",
        ),
        (
            "BOOKS",
            "9  en  org-b/beta/test.json  {rev}  9.txt  10  -  T",
            "destination org-b/beta/test.json/9.txt collides on disk with org-b/beta/test.json",
        ),
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
    assert r.returncode == 2
    first = r.stderr.splitlines()[0]
    assert first.startswith(f"{pin_file}:{n}: ")
    assert message.format(rev_file=rev) in first
    assert r.stderr.splitlines()[-1].endswith("nothing was downloaded")
    _assert_nothing_fetched(hub, books, dest)


PIN_CAP = 65536  # docs/building.md "The pin files"


@pytest.mark.parametrize(
    "what,why",
    [
        ("/dev/zero", "is a character device, not a regular file"),
        ("fifo", "is a FIFO (a named pipe), not a regular file"),
        ("directory", "is a directory, not a regular file"),
        ("missing", "does not exist"),
        ("dangling link", "is a symbolic link that leads nowhere"),
        ("socket", "is a socket, not a regular file"),
        ("too long", f"is {PIN_CAP + 1} bytes, more than the 64 KiB a pin file may have"),
    ],
)
def test_a_pin_file_that_is_not_a_small_regular_file_is_refused(tmp_path, hub, books, what, why):
    """Said before the file is opened: a FIFO would block and /dev/zero never end."""
    pins = default_pins()
    rev, _ = write_pins(tmp_path, pins)
    path = tmp_path / what.replace(" ", "-")
    if what == "/dev/zero":
        path = Path(what)
    elif what == "fifo":
        os.mkfifo(path)
    elif what == "directory":
        path.mkdir()
    elif what == "dangling link":
        path.symlink_to(tmp_path / "nowhere")
    elif what == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
    elif what == "too long":
        path.write_bytes(rev.read_bytes().ljust(PIN_CAP + 1, b"#"))
    r = run_fetch(tmp_path, hub, books, tmp_path / "dest", env={"REV_FILE": str(path)})
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"{path}: cannot read this pin file: it {why}",
        "fetch.sh: 1 error(s) in the pin files; nothing was downloaded",
    ]
    _assert_nothing_fetched(hub, books, tmp_path / "dest")
    if what == "socket":
        sock.close()


def test_a_pin_file_of_the_largest_size_is_read(tmp_path, hub, books):
    pins = default_pins()
    rev, _ = write_pins(tmp_path, pins)
    rev.write_bytes(rev.read_bytes().ljust(PIN_CAP - 1, b"#") + b"\n")
    serve(pins, hub, books)
    r = run_fetch(tmp_path, hub, books, tmp_path / "dest")
    assert r.returncode == 0, r.out
    assert_in_place(tmp_path / "dest", pins)


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_prints_the_usage(tmp_path, hub, books, setup, flag):
    r = run_fetch(tmp_path, hub, books, None, args=[flag])
    assert r.returncode == 0, r.out
    assert "Usage: bash fetch.sh [-h | --help] [--] [DEST]" in r.stdout
    for name in ("HF_ENDPOINT", "BOOKS_ENDPOINT", "HF_TOKEN", "FETCH_JOBS", "Exit status"):
        assert name in r.stdout
    assert r.stderr == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["BOOKS", "REV", "tmpdir"]
    assert hub.gets() == [] and books.gets() == []


@pytest.mark.parametrize(
    "args,why",
    [
        (["--bogus"], "unknown option '--bogus'"),
        (["-x"], "unknown option '-x'"),
        (["-"], "unknown option '-'"),
        (["a", "b"], "one DEST at most"),
        (["--", "a", "b"], "one DEST at most"),
        ([""], "DEST must not be empty"),
    ],
)
def test_bad_arguments_are_refused_with_the_usage(tmp_path, hub, books, setup, args, why):
    r = run_fetch(tmp_path, hub, books, None, args=args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("fetch.sh: ") and why in lines[0]
    assert "usage: bash fetch.sh [-h | --help] [--] [DEST]" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["BOOKS", "REV", "tmpdir"]
    assert hub.gets() == [] and books.gets() == []


def test_a_dest_starting_with_a_dash_goes_after_double_dash(tmp_path, hub, books, setup):
    pins, _ = setup
    r = run_fetch(tmp_path, hub, books, None, args=["--", "-src"])
    assert r.returncode == 0, r.out
    assert_in_place(tmp_path / "-src", pins)


def test_dest_not_writable(tmp_path, hub, books, setup):
    blocker = tmp_path / "somefile"
    blocker.write_text("a regular file\n")
    dest = blocker / "dest"
    r = run_fetch(tmp_path, hub, books, dest)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert str(dest) in lines[0] and "destination" in lines[0]
    assert hub.gets() == [] and books.gets() == []


def test_curl_missing(tmp_path, hub, books, setup):
    dest = tmp_path / "dest"
    r = run_fetch(tmp_path, hub, books, dest, env={"PATH": path_without(tmp_path, "curl")})
    assert r.returncode == 2
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
