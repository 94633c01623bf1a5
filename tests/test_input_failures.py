"""An input that is not the pinned one, or cannot be read, fails the whole build with one error
line and nothing written: also when the hashing, which runs beside the reading, finds it only
after every source has been read (docs/failures.md).

Whole builds of the miniature GSM8K source, run in this process so that the hashing can be held
back until the reading is done (tests/test_inputs.py checks the same on `verify` alone)."""

import errno
import hashlib
import os
import pathlib
import shutil
import signal
import threading

import pytest

import build

GSM8K = "openai/gsm8k/main/test-00000-of-00001.parquet"


@pytest.fixture
def case(mini, tmp_path):
    """SRC holding the GSM8K file, its REV, and where OUT goes; signal handlers restored after."""
    src = tmp_path / "src"
    (src / GSM8K).parent.mkdir(parents=True)
    shutil.copyfile(mini.src / GSM8K, src / GSM8K)
    rev = tmp_path / "REV"
    shutil.copyfile(mini.rev, rev)
    parent = tmp_path / "outputs"
    parent.mkdir()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    argv = [str(src), str(mini.tokenizer), str(parent / "out"), "--rev", str(rev),
            "--books", str(mini.books), "--only", "gsm8k", "--quiet"]  # fmt: skip
    yield argv, src / GSM8K, rev, parent
    for s, handler in handlers.items():
        signal.signal(s, handler)


def hold_hashing(monkeypatch, path, error=None):
    """The hashing of `path` waits until the sources have all been read (then fails with `error`,
    if given); returns the order in which the two happened."""
    events, read = [], threading.Event()
    read_and_select, real_open = build.read_and_select, open

    def reading(*args):
        splits = read_and_select(*args)
        events.append("read")
        read.set()
        return splits

    def opening(file, *args, **kw):
        if pathlib.Path(file) == path:
            read.wait(30)
            events.append("hash")
            if error:
                raise error
        return real_open(file, *args, **kw)

    monkeypatch.setattr(build, "read_and_select", reading)
    monkeypatch.setattr(build, "open", opening, raising=False)
    return events


def test_a_wrong_sha256_found_after_reading_fails_with_nothing_written(case, monkeypatch, capsys):
    argv, file, rev, parent = case
    actual = hashlib.sha256(file.read_bytes()).hexdigest()
    wrong = "0" * 64
    rev.write_text(rev.read_text().replace(actual, wrong))
    events = hold_hashing(monkeypatch, file)
    assert build.main(argv) == 1
    assert events == ["read", "hash"], "the mismatch was found after the reading"
    assert capsys.readouterr().err == (
        f"error: {file}: sha256 {actual}, expected {wrong}; fetch it again with fetch.sh\n"
    )
    assert os.listdir(parent) == []


def test_an_input_that_cannot_be_read_fails_with_nothing_written(case, monkeypatch, capsys):
    argv, file, _, parent = case
    events = hold_hashing(monkeypatch, file, PermissionError(errno.EACCES, "Permission denied"))
    assert build.main(argv) == 1
    assert events == ["read", "hash"]
    assert capsys.readouterr().err == f"error: cannot read {file}: Permission denied\n"
    assert os.listdir(parent) == []


def test_the_same_build_succeeds_when_the_input_is_the_pinned_one(case, monkeypatch, capsys):
    argv, file, _, parent = case
    events = hold_hashing(monkeypatch, file)
    assert build.main(argv) == 0, capsys.readouterr().err
    assert events == ["read", "hash"]
    assert sorted(os.listdir(parent / "out")) == sorted(build.OUT_FILES)
