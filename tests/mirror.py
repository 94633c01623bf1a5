"""A local mirror of the miniature sources, so that fetch.sh, and the workflows that run it, work
without network: a Hub and a book server (tests/test_fetch.py's FakeServer) holding every file the
miniature REV and BOOKS pin, and a checkout whose pin files are the miniature ones."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

from test_fetch import FakeServer

REPO = Path(__file__).resolve().parents[1]


def pin_fields(path):
    """The columns of every pin line of a REV or BOOKS file (comments and blank lines dropped)."""
    lines = (line.split("#", 1)[0].split() for line in Path(path).read_text().splitlines())
    return [fields for fields in lines if fields]


@contextmanager
def serve(mini):
    """Start the two servers; `.env` is the environment that points fetch.sh at them."""
    hub, books = FakeServer(), FakeServer()
    try:
        for kind, repo, revision, path, *_ in pin_fields(mini.rev):
            prefix = "/datasets" if kind == "dataset" else ""
            data = (mini.src / repo / path).read_bytes()
            hub.files[f"{prefix}/{repo}/resolve/{revision}/{path}"] = data
        for _, _, repo, commit, path, *_ in pin_fields(mini.books):
            books.files[f"/{repo}/{commit}/{path}"] = (mini.src / repo / path).read_bytes()
        env = dict(
            os.environ,
            HF_ENDPOINT=hub.url,
            BOOKS_ENDPOINT=books.url,
            NO_PROXY="*",
            FETCH_RETRY_DELAY="0",
        )
        env.pop("REV_FILE", None)
        env.pop("BOOKS_FILE", None)
        yield SimpleNamespace(hub=hub, books=books, env=env)
    finally:
        hub.close()
        books.close()


def checkout(mini, dest, *names):
    """A copy of the repository's files `names` in dest, with the miniature REV and BOOKS."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(REPO / name, dest / name)
    shutil.copy(mini.rev, dest / "REV")
    shutil.copy(mini.books, dest / "BOOKS")
    return dest
