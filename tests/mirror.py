"""A local mirror of the miniature sources, so that fetch.sh, and the workflows that run it, work
without network: a Hub and a book server (tests/fakehttp.py's FakeServer) holding every file the
miniature REV and BOOKS pin, and a checkout whose pin files are the miniature ones."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

from fakehttp import FakeServer
from make_sources import read_books, read_rev

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def serve(mini):
    """Start the two servers; `.env` is the environment that points fetch.sh at them."""
    hub, books = FakeServer(), FakeServer()
    try:
        for p in read_rev(mini.rev):
            prefix = "/datasets" if p["kind"] == "dataset" else ""
            data = (mini.src / p["repo"] / p["path"]).read_bytes()
            hub.files[f"{prefix}/{p['repo']}/resolve/{p['revision']}/{p['path']}"] = data
        for b in read_books(mini.books):
            data = (mini.src / b["repo"] / b["path"]).read_bytes()
            books.files[f"/{b['repo']}/{b['commit']}/{b['path']}"] = data
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
