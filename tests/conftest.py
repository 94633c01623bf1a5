"""Shared fixtures: miniature sources in the real formats, and optional real inputs."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SHARED = Path(__file__).resolve().parents[1].parent / "shared"

if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from make_sources import make_sources, make_tokenizer, write_pins  # noqa: E402


def _mini(root: Path) -> SimpleNamespace:
    tokenizer = make_tokenizer(root / "tokenizer.json")
    src = root / "src"
    make_sources(src, tokenizer)
    write_pins(src, root / "REV", root / "BOOKS", tokenizer_path=tokenizer)
    return SimpleNamespace(
        root=root, src=src, rev=root / "REV", books=root / "BOOKS", tokenizer=tokenizer
    )


@pytest.fixture(scope="session")
def mini(tmp_path_factory) -> SimpleNamespace:
    """Miniature copies of every pinned source, generated once per session.

    ``.src`` holds ``<repo>/<path>`` for every line of REV and BOOKS (synthetic books, pseudo-text,
    no real data), ``.rev`` and ``.books`` pin those files, ``.tokenizer`` is the byte-level test
    tokenizer (a token per UTF-8 byte of the NFC text). REV's model line pins that tokenizer, copied
    to ``src/Qwen/Qwen3.8-27B/tokenizer.json``, so a build given ``--rev``/``--books`` accepts it.
    Every slot of the README's slot table fills under it, with decoys met before the slots close."""
    return _mini(tmp_path_factory.mktemp("mini"))


@pytest.fixture(scope="session")
def out(mini, tmp_path_factory):
    """The miniature build's OUT (the scoring tests' rows)."""
    import build

    out = tmp_path_factory.mktemp("built") / "out"
    args = [str(mini.src), str(mini.tokenizer), str(out), "--rev", str(mini.rev)]
    assert build.main([*args, "--books", str(mini.books), "--quiet"]) == 0
    return out


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    """A tiny model of Qwen3.8's architecture (tests/make_model.py)."""
    from make_model import make_model

    return make_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="session")
def qwen_tokenizer() -> Path:
    """The Qwen3.5/3.6-vocabulary tokenizer.json beside the repository, when there is one."""
    path = SHARED / "tokenizers" / "qwen3.5-text.json"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    return path


@pytest.fixture(scope="session")
def realdata() -> Path:
    """Real source texts beside the repository (books, GSM8K, HumanEval), when there are any."""
    path = SHARED / "realdata"
    if not path.is_dir():
        pytest.skip(f"{path} not found")
    return path


# The modules that run real engines on real or tiny models, longest first: the suite's two workers
# take whole modules (--dist loadscope) in collection order, so these start first and the many
# short modules fill in beside them, rather than one of these starting last on its own.
FIRST = ("test_real_model.py", "test_vllm.py", "test_served.py",
         "test_mlx.py", "test_llamacpp.py", "test_tokens.py", "test_real_peer.py")  # fmt: skip


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: the rest in order
