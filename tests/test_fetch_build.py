"""The README's main job, unchanged, against a local mirror of the miniature sources: fetch.sh
downloads and verifies every pinned file, then build.py builds the three splits from them."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from test_fetch import FakeServer

import build

REPO = Path(__file__).resolve().parents[1]


def mirror(mini):
    """A Hub and a book server holding every file the miniature REV and BOOKS pin."""
    hub, books = FakeServer(), FakeServer()
    for line in mini.rev.read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if fields:
            kind, repo, revision, path = fields[:4]
            prefix = "/datasets" if kind == "dataset" else ""
            hub.files[f"{prefix}/{repo}/resolve/{revision}/{path}"] = (
                mini.src / repo / path
            ).read_bytes()
    for line in mini.books.read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if fields:
            _, _, repo, commit, path = fields[:5]
            books.files[f"/{repo}/{commit}/{path}"] = (mini.src / repo / path).read_bytes()
    return hub, books


def test_the_readme_main_job_runs_against_a_mirror(mini, tmp_path):
    # A checkout whose pin files are the miniature ones: the commands are the README's own.
    checkout = tmp_path / "kern-prompts"
    checkout.mkdir()
    for name in ("fetch.sh", "build.py"):
        shutil.copy(REPO / name, checkout / name)
    shutil.copy(mini.rev, checkout / "REV")
    shutil.copy(mini.books, checkout / "BOOKS")
    hub, books = mirror(mini)
    try:
        env = dict(
            os.environ,
            HF_ENDPOINT=hub.url,
            BOOKS_ENDPOINT=books.url,
            NO_PROXY="*",
            FETCH_RETRY_DELAY="0",
        )
        env.pop("REV_FILE", None)
        env.pop("BOOKS_FILE", None)
        command = (
            "mkdir -p src && (cd src && bash ../fetch.sh) && "
            f"{sys.executable} build.py src src/Qwen/Qwen3.8-27B/tokenizer.json out --quiet"
        )
        result = subprocess.run(
            ["bash", "-c", command],
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        hub.close()
        books.close()
    assert result.returncode == 0, result.stderr[-3000:]
    for path in hub.files | books.files:
        assert any(r.path == path for r in (hub.requests + books.requests)), path
    assert sorted(p.name for p in (checkout / "out").iterdir()) == sorted(build.OUT_FILES)
    # Same sources, same bytes: the mirror build equals the reviewed golden build.
    golden = (REPO / "tests" / "golden" / "SHA256SUMS").read_text()
    assert (checkout / "out" / "SHA256SUMS").read_text() == golden
