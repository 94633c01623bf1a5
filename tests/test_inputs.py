"""The pin files and the verification of the inputs (docs/building.md "Reproducing",
docs/failures.md), on small files in a temporary directory: every check fails with its own message,
and a file that cannot be read is an error, never a check skipped.

The fast layer of the suite, with tests/test_engine.py; tests/test_input_failures.py runs the same
failures through a whole build."""

import errno
import hashlib
import os
import pathlib
import random
import re
import subprocess
import sys
import threading
from collections import Counter

import pytest

import build

SHA_A = "a" * 64


def write(path, text):
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path


# ------------------------------------------------------------------------------------------------
# unsafe_reason and read_pins


@pytest.mark.parametrize(
    "value, reason",
    [
        ("openai/gsm8k", None),
        ("data/train-00000-of-00001.parquet", None),
        ("a..b/c...", None),
        ("x", None),
        ("/etc/passwd", "is absolute"),
        ("/", "is absolute"),
        ("..", "has a '..' component"),
        ("a/../b", "has a '..' component"),
        ("a/..", "has a '..' component"),
        ("a//b", "has an empty or '.' component"),
        ("a/", "has an empty or '.' component"),
        ("", "has an empty or '.' component"),
        (".", "has an empty or '.' component"),
        ("a/./b", "has an empty or '.' component"),
    ],
)
def test_unsafe_reason(value, reason):
    assert build.unsafe_reason(value) == reason


REV_TEXT = f"""# kind repo revision path bytes sha256
dataset  openai/gsm8k   e53f0d4  main/test-00000-of-00001.parquet  0  {SHA_A}  # a # comment

model\tQwen/Qwen3.8-27B\tfeed123\ttokenizer.json\t123456789012345678\t-
dataset openai/gsm8k e53f0d4 main/train.parquet - -
"""

BOOKS_TEXT = f"""# ebook lang repo revision path bytes sha256 title
145  en  gutenbergbooks/145  c0ffee  145-0.txt  100  {SHA_A}  Middlemarch   by George Eliot
23863 zh gutenbergbooks/23863 beef 23863-0.txt - - 水滸傳
"""


def columns(pins):
    return [(p.where, p.kind, p.repo, p.revision, p.path, p.bytes, p.sha256, p.lang, p.title)
            for p in pins]  # fmt: skip


def test_read_pins_rev(tmp_path):
    path = write(tmp_path / "REV", REV_TEXT)
    pins = build.read_pins(path, "rev")
    assert columns(pins) == [
        (f"{path}:2", "dataset", "openai/gsm8k", "e53f0d4", "main/test-00000-of-00001.parquet",
         0, SHA_A, None, ""),
        (f"{path}:4", "model", "Qwen/Qwen3.8-27B", "feed123", "tokenizer.json",
         123456789012345678, None, None, ""),
        (f"{path}:5", "dataset", "openai/gsm8k", "e53f0d4", "main/train.parquet", None, None,
         None, ""),
    ]  # fmt: skip
    assert all(p.file is None and p.size == 0 and p.actual_sha256 is None for p in pins)


def test_read_pins_books(tmp_path):
    path = write(tmp_path / "BOOKS", BOOKS_TEXT)
    assert columns(build.read_pins(path, "books")) == [
        (f"{path}:2", "book", "gutenbergbooks/145", "c0ffee", "145-0.txt", 100, SHA_A, "en",
         "Middlemarch by George Eliot"),
        (f"{path}:3", "book", "gutenbergbooks/23863", "beef", "23863-0.txt", None, None, "zh",
         "水滸傳"),
    ]  # fmt: skip


REV_LINE = f"dataset openai/gsm8k e53f0d4 main/a.parquet 12 {SHA_A}"
BOOK_LINE = f"145 en gutenbergbooks/145 c0ffee 145-0.txt 100 {SHA_A} Middlemarch"


@pytest.mark.parametrize(
    "kind, line, problem",
    [
        ("rev", "dataset openai/gsm8k e53f0d4 main/a.parquet 12",
         "expected columns kind repo revision path bytes sha256, found 5"),
        ("rev", REV_LINE + " extra", "expected columns kind repo revision path bytes sha256, found 7"),
        ("books", "145 en gutenbergbooks/145 c0ffee 145-0.txt 100 " + SHA_A,
         "expected columns ebook lang repo revision path bytes sha256 title (the title is the rest"
         " of the line), found 7"),
        ("rev", REV_LINE.replace("dataset", "datasets"),
         "kind must be dataset or model, not 'datasets'"),
        ("books", BOOK_LINE.replace("145 en", "x145 en"), "ebook must be a number, not 'x145'"),
        ("books", BOOK_LINE.replace(" en ", " fr "), "lang must be en or zh, not 'fr'"),
        ("rev", REV_LINE.replace(" 12 ", " 12a "), "bytes must be a number or -, not '12a'"),
        ("rev", REV_LINE.replace(" 12 ", " " + "9" * 19 + " "),
         "bytes must be a number or -, not '" + "9" * 19 + "'"),
        ("books", BOOK_LINE.replace(" 100 ", " -1 "), "bytes must be a number or -, not '-1'"),
        ("rev", REV_LINE.replace(SHA_A, "A" * 64), "sha256 must be 64 lowercase hex digits or -"),
        ("rev", REV_LINE.replace(SHA_A, "a" * 63), "sha256 must be 64 lowercase hex digits or -"),
        ("rev", REV_LINE.replace(SHA_A, "--"), "sha256 must be 64 lowercase hex digits or -"),
        ("rev", REV_LINE.replace("openai/gsm8k", "/openai"), "repo '/openai' is absolute"),
        ("rev", REV_LINE.replace("e53f0d4", "a/../b"), "revision 'a/../b' has a '..' component"),
        ("books", BOOK_LINE.replace("145-0.txt", "x//145.txt"),
         "path 'x//145.txt' has an empty or '.' component"),
    ],
)  # fmt: skip
def test_read_pins_refuses_a_malformed_line(tmp_path, kind, line, problem):
    good = (
        REV_LINE.replace("a.parquet", "b.parquet")
        if kind == "rev"
        else BOOK_LINE.replace("145-0.txt", "145-1.txt")
    )
    path = write(tmp_path / "PINS", f"# header\n{good}\n\n{line}\n")
    with pytest.raises(build.BuildError) as e:
        build.read_pins(path, kind)
    assert str(e.value) == f"{path}:4: {problem}"


def test_read_pins_refuses_a_file_pinned_twice(tmp_path):
    other_repo = REV_LINE.replace("openai/gsm8k", "openai/gsm9k")
    other_path = REV_LINE.replace("a.parquet", "b.parquet")
    path = write(tmp_path / "REV", "\n".join(["#", REV_LINE, other_repo, other_path, REV_LINE]))
    with pytest.raises(build.BuildError) as e:
        build.read_pins(path, "rev")
    assert str(e.value) == (
        f"{path}:5: destination openai/gsm8k/main/a.parquet is already pinned at {path}:2"
    )
    path = write(tmp_path / "REV2", "\n".join([REV_LINE, other_repo, other_path]))
    assert len(build.read_pins(path, "rev")) == 3


def test_pin_files_are_utf8_whatever_the_locale(tmp_path):
    """A BOOKS title in Chinese reads the same under the C locale, whose text encoding is ASCII."""
    path = write(tmp_path / "BOOKS", BOOKS_TEXT)
    assert build.read_pins(path, "books")[1].title == "水滸傳"
    here = pathlib.Path(build.__file__).parent
    env = dict(os.environ, LC_ALL="C", LANG="C", PYTHONCOERCECLOCALE="0", PYTHONUTF8="0",
               PYTHONPATH=str(here), PYTHONIOENCODING="utf-8")  # fmt: skip
    code = "import sys, build; print(build.read_pins(sys.argv[1], 'books')[1].title)"
    result = subprocess.run([sys.executable, "-c", code, str(path)], cwd=here, env=env,
                            capture_output=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    assert result.stdout.decode() == "水滸傳\n"


def test_read_pins_that_cannot_be_read(tmp_path):
    missing = tmp_path / "nowhere" / "REV"
    with pytest.raises(build.BuildError) as e:
        build.read_pins(missing, "rev")
    assert str(e.value) == f"cannot read pin file {missing}: it does not exist"
    bad = write(tmp_path / "REV", b"\xff" + REV_LINE.encode())
    with pytest.raises(build.BuildError) as e:
        build.read_pins(bad, "rev")
    assert str(e.value) == (
        f"{bad}:1: not valid UTF-8 (byte 0xff at byte 1 of the line); a pin file is UTF-8 text"
    )


# ------------------------------------------------------------------------------------------------
# verify and sha256_file


def make_pins(tmp_path, files, **pinned):
    """Pins of files {repo/path: bytes}, pinned with their own size and sha256 unless `pinned`
    gives other (bytes, sha256) for a file."""
    src = tmp_path / "src"
    pins = []
    for number, (rel, data) in enumerate(files.items(), 1):
        repo, path = rel.split("/", 1)
        file = src / repo / path
        if data is not None:
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_bytes(data)
        nbytes, sha = pinned.get(rel, (len(data or b""), hashlib.sha256(data or b"").hexdigest()))
        pins.append(build.Pin(f"REV:{number}", "dataset", repo, "r", path, nbytes, sha))
    return src, pins


FILES = {"one/a.bin": b"a" * 1000, "two/b/c.bin": b"b" * 1048, "three/empty": b""}


def test_verify_checks_sizes_now_and_hashes_in_a_thread(tmp_path):
    src, pins = make_pins(tmp_path, FILES)
    verified = build.verify(pins, src, True, True)
    verified()
    assert [(p.file, p.size, p.actual_sha256) for p in pins] == [
        (src / rel, len(data), hashlib.sha256(data).hexdigest()) for rel, data in FILES.items()
    ]


def test_verify_without_hashing_reads_no_file(tmp_path):
    src, pins = make_pins(tmp_path, FILES, **{"one/a.bin": (1000, SHA_A)})
    build.verify(pins, src, False, True)()
    assert [(p.size, p.actual_sha256) for p in pins] == [(1000, None), (1048, None), (0, None)]


def missing_message(file, src):
    return (
        f"missing source file {file}; download the sources with "
        f"`mkdir -p {src} && (cd {src} && bash {build.HERE / 'fetch.sh'})`"
    )


def test_a_missing_file_is_missing_and_a_directory_is_named_as_one(tmp_path):
    src, pins = make_pins(tmp_path, {"one/a.bin": b"a", "two/gone": None})
    with pytest.raises(build.BuildError) as e:
        build.verify(pins, src, True, True)
    assert str(e.value) == missing_message(src / "two" / "gone", src)
    (src / "two" / "gone").mkdir(parents=True)
    with pytest.raises(build.BuildError) as e:
        build.verify(pins, src, True, True)
    assert str(e.value).startswith(f"source file {src / 'two' / 'gone'} is a directory, not a file")


def test_a_file_that_cannot_be_looked_at_is_an_error(tmp_path, monkeypatch):
    src, pins = make_pins(tmp_path, FILES)
    target = src / "two" / "b" / "c.bin"
    look = pathlib.Path.stat

    def denied(self, **kw):
        if self == target:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return look(self, **kw)

    monkeypatch.setattr(pathlib.Path, "stat", denied)
    with pytest.raises(build.BuildError) as e:
        build.verify(pins, src, True, True)
    assert str(e.value) == f"cannot read {target}: Permission denied", "not called missing"


@pytest.mark.parametrize(
    "size, pinned, state", [(999, 1000, "truncated"), (1001, 1000, "too long")]
)
def test_a_file_of_another_size(tmp_path, size, pinned, state):
    src, pins = make_pins(tmp_path, {"one/a.bin": b"a" * size}, **{"one/a.bin": (pinned, None)})
    with pytest.raises(build.BuildError) as e:
        build.verify(pins, src, False, True)
    assert str(e.value) == (
        f"{src / 'one' / 'a.bin'}: {size} bytes, expected {pinned} ({state}); "
        "fetch it again with fetch.sh"
    )


def test_an_unpinned_size_or_sha256_is_not_checked(tmp_path):
    src, pins = make_pins(tmp_path, FILES, **{"one/a.bin": (None, None)})
    build.verify(pins, src, True, True)()
    assert pins[0].size == 1000
    assert pins[0].actual_sha256 == hashlib.sha256(FILES["one/a.bin"]).hexdigest()


def test_the_first_wrong_sha256_is_reported_and_hashing_stops(tmp_path):
    wrong = {"two/b/c.bin": (1048, SHA_A), "three/empty": (0, "b" * 64)}
    src, pins = make_pins(tmp_path, FILES, **wrong)
    verified = build.verify(pins, src, True, True)
    with pytest.raises(build.BuildError) as e:
        verified()
    actual = hashlib.sha256(FILES["two/b/c.bin"]).hexdigest()
    assert str(e.value) == (
        f"{src / 'two' / 'b' / 'c.bin'}: sha256 {actual}, expected {SHA_A}; "
        "fetch it again with fetch.sh"
    )
    assert pins[2].actual_sha256 is None, "hashing stopped at the first mismatch"
    with pytest.raises(build.BuildError):
        verified(wait=False)  # still reported


class Gate:
    """Holds the hashing of one file until released, as if the disk were slow."""

    def __init__(self, monkeypatch, target, error=None):
        self.target, self.error, self.release = target, error, threading.Event()
        monkeypatch.setattr(build, "open", self.open, raising=False)

    def open(self, path, *args, **kw):
        if pathlib.Path(path) == self.target:
            self.release.wait(5)
            if self.error:
                raise self.error
        return open(path, *args, **kw)


def test_a_mismatch_found_after_the_sources_were_read_still_fails(tmp_path, monkeypatch):
    src, pins = make_pins(tmp_path, FILES, **{"two/b/c.bin": (1048, SHA_A)})
    gate = Gate(monkeypatch, src / "two" / "b" / "c.bin")
    verified = build.verify(pins, src, True, True)
    (thread,) = [t for t in threading.enumerate() if t.name == "verify"]
    assert thread.daemon, "a build that fails otherwise does not wait for the hashing"
    verified(wait=False)  # the sources are being read: nothing found yet, and no waiting
    threading.Timer(0.2, gate.release.set).start()
    with pytest.raises(build.BuildError, match=f"sha256 .*, expected {SHA_A}"):
        verified()  # the end of the build waits for the hashing, and fails


@pytest.mark.parametrize(
    "error, text",
    [
        (PermissionError(errno.EACCES, "Permission denied"), "Permission denied"),
        (OSError("the disk is gone"), "the disk is gone"),
    ],
)
def test_an_input_that_cannot_be_read_is_an_error(tmp_path, monkeypatch, error, text):
    src, pins = make_pins(tmp_path, FILES)
    target = src / "two" / "b" / "c.bin"
    gate = Gate(monkeypatch, target, error)
    gate.release.set()
    verified = build.verify(pins, src, True, True)
    with pytest.raises(build.BuildError) as e:
        verified()
    assert str(e.value) == f"cannot read {target}: {text}"
    assert pins[2].actual_sha256 is None


def test_verify_shows_its_progress_unless_quiet(tmp_path, capsys):
    src, pins = make_pins(tmp_path, FILES)
    build.verify(pins, src, True, True)()
    assert capsys.readouterr().err == ""
    build.verify(pins, src, True, False)()
    last = capsys.readouterr().err.rstrip("\n").split("\r")[-1]
    assert last.startswith("verify: 100%|") and " 2.05k/2.05k [" in last and "B/s]" in last


def test_sha256_file_reads_in_blocks_and_reports_them(tmp_path):
    for size in (0, 1, (1 << 22) + 1):
        data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        path = write(tmp_path / f"f{size}", data)
        seen = []
        assert build.sha256_file(path, seen.append) == hashlib.sha256(data).hexdigest()
        assert sum(seen) == size and all(0 < n <= 1 << 22 for n in seen), "4 MiB at a time"
        assert build.sha256_file(path) == hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------------------------------
# --help


@pytest.mark.parametrize("columns", range(30, 161, 5))
def test_help_never_breaks_a_name_across_lines(monkeypatch, capsys, columns):
    """At any terminal width, every source name and option is whole on one line (argparse would
    break `swe-smith` after its hyphen)."""
    monkeypatch.setenv("COLUMNS", str(columns))
    with pytest.raises(SystemExit) as e:
        build.parse_args(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    words = {w.strip(",.:;()[]") for line in text.splitlines() for w in line.split()}
    assert set(build.SOURCES) <= words
    assert {"--any-tokenizer", "--no-verify", "build.py", "tokenizer.json"} <= words
    assert not [line for line in text.splitlines() if re.search(r"\w-$", line)]


# The record checks: every declared kind, against the test's own reading of it


def accepts(kind, value):
    """The test's own reading of the declared kinds (build.py's is build.mismatch)."""
    if value == "deep":  # test_damage's DEEP
        return False  # whatever the kind, it cannot be written back as JSON
    if kind is build.ANY:
        return True
    if isinstance(kind, tuple):
        return any(value is None if k is None else accepts(k, value) for k in kind)
    if value is None:
        return False
    if isinstance(kind, build.Json) or kind is str:
        return isinstance(value, str)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(kind, list):
        return isinstance(value, list) and all(accepts(kind[0], v) for v in value)
    if isinstance(kind, dict):
        return isinstance(value, dict) and all(accepts(k, value.get(n)) for n, k in kind.items())
    raise AssertionError(kind)


def random_value(rng, kind, depth=0):
    """A value of `kind`, or now and then (at any depth, at any item) a value of another kind."""
    if rng.random() < 0.08:
        return rng.choice([None, 7, True, "text", ["text"], {"k": "v"}, [], {}])
    if kind is build.ANY:
        return rng.choice([None, 1, "x", [1], {"a": 1}])
    if isinstance(kind, tuple):
        k = rng.choice(kind)
        return None if k is None else random_value(rng, k, depth)
    if isinstance(kind, build.Json) or kind is str:
        return rng.choice(["", "text", "中文"])
    if kind is int:
        return rng.randrange(-3, 3)
    if kind is bool:
        return rng.random() < 0.5
    if isinstance(kind, list):
        return [
            random_value(rng, kind[0], depth + 1) for _ in range(rng.randrange(4 - min(depth, 3)))
        ]
    if isinstance(kind, dict):
        return {n: random_value(rng, k, depth + 1) for n, k in kind.items() if rng.random() < 0.95}
    raise AssertionError(kind)


DECLARED = [build.MESSAGE, build.MESSAGES, build.TOOL_CALL, build.CONTENT] + [
    kind for s in build.SOURCES.values() for f in [s.fields, *s.file_fields.values()]
    for kind in [f, *f.values()]
]  # fmt: skip


def test_fits_and_mismatch_agree_with_the_declared_kinds_on_random_values():
    """A value fits its kind exactly when every part of it does, whichever item of a list is
    wrong; mismatch names what is wrong, or says nothing when the value fits."""
    rng = random.Random(23)
    seen = {True: 0, False: 0}
    for _ in range(4000):
        kind = rng.choice(DECLARED)
        value = random_value(rng, kind)
        want = accepts(kind, value)
        seen[want] += 1
        assert build.fits(value, kind) is want, (kind, value)
        problem = build.mismatch(value, kind, "f")
        assert (problem is None) is want, (kind, value, problem)
        if not want:
            assert re.fullmatch(r"no field 'f.*'|field 'f.*' is .+, expected .+", problem), problem
    assert min(seen.values()) > 500


def arrow_type(kind):
    """The Arrow type a parquet column of `kind` has (one alternative besides null)."""
    import pyarrow as pa

    if kind is build.ANY:
        return pa.struct([("role", pa.string())])
    if isinstance(kind, tuple):
        (kind,) = [k for k in kind if k is not None]
        return arrow_type(kind)
    if kind is str or isinstance(kind, build.Json):
        return pa.string()
    if kind is int:
        return pa.int64()
    if kind is bool:
        return pa.bool_()
    if isinstance(kind, list):
        return pa.list_(arrow_type(kind[0]))
    return pa.struct([(n, arrow_type(k)) for n, k in kind.items()])


def arrow_value(rng, kind, nulls):
    """A value Arrow can hold in a column of `kind`: of the kind, but null anywhere now and then
    (the one way such a column's rows are not of their kind)."""
    if rng.random() < nulls:
        return None
    if kind is build.ANY:
        return {"role": "user"}
    if isinstance(kind, tuple):
        (kind,) = [k for k in kind if k is not None]
    if isinstance(kind, list):
        return [arrow_value(rng, kind[0], nulls) for _ in range(rng.randrange(4))]
    if isinstance(kind, dict):
        return {n: arrow_value(rng, k, nulls) for n, k in kind.items()}
    if kind is int:
        return rng.randrange(-3, 3)
    if kind is bool:
        return rng.random() < 0.5
    return rng.choice(["", "text", "中文"])


PARQUET_RECORDS = [
    build.record_kind(f)
    for s in build.SOURCES.values()
    if s.name in {"mrcr", "swe-smith", "wildchat", "gsm8k", "numinamath", "humaneval", "mbpp",
                  "mimo"}
    for f in [s.fields, *(s.fields | more for more in s.file_fields.values())]
]  # fmt: skip


def test_batch_fits_only_when_every_row_fits_sliced_and_filtered_too():
    """The Arrow test that lets parquet_records skip the check of each row: never True for a
    batch with a row that is not of its kind, and True for a batch without nulls."""
    import pyarrow as pa

    rng = random.Random(29)
    seen = {True: 0, False: 0}
    for trial in range(600):
        kind = rng.choice(PARQUET_RECORDS)
        nulls = rng.choice([0.0, 0.0, 0.002, 0.02, 0.1])
        schema = pa.schema([(n, arrow_type(k)) for n, k in kind.items()])
        rows = [{n: arrow_value(rng, k, nulls) for n, k in kind.items()} for _ in range(8)]
        batch = pa.RecordBatch.from_pylist(rows, schema=schema)
        a, b = sorted(rng.randrange(9) for _ in range(2))
        mask = pa.array([rng.random() < 0.5 for _ in range(8)])
        for part in (batch, batch.slice(a, b - a), batch.filter(mask)):
            every = all(accepts(kind, r) for r in part.to_pylist())
            got = build.batch_fits(part, kind)
            assert every or not got, (trial, kind, part.to_pylist())
            if nulls == 0.0:
                assert got, (trial, kind)
            seen[got] += 1
    assert min(seen.values()) > 100
    batch = pa.RecordBatch.from_pylist([{"question": "q"}])
    assert not build.batch_fits(batch, {"question": str, "answer": str}), "a column not read"
    assert not build.batch_fits(batch, {"question": int}), "a type it cannot hold"


def test_usable_messages_fails_as_openai_messages_does():
    """The check Nemotron's reader makes instead of the messages: the same error, the same row
    found unusable, and the same roles and tool-call answers as the messages it would make."""
    rng = random.Random(31)
    outcomes = Counter()
    for _ in range(3000):
        messages = random_value(rng, build.MESSAGES)
        if rng.random() < 0.3 and isinstance(messages, list):  # a usable conversation with calls
            call = {"function": {"name": "f", "arguments": {}}, "id": rng.choice(["c", None])}
            messages = [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "content": rng.choice(["r", [{"type": "text", "text": "r"}]]),
                 "tool_call_id": rng.choice(["c", None, "d"])},
                *messages,
            ]  # fmt: skip
        results = []
        for convert in (build.openai_messages, build.usable_messages):
            try:
                results.append(("ok", convert(messages, "f line 1")))
            except (build.BuildError, build.Unusable) as e:
                results.append((type(e).__name__, str(e)))
        (want, made), (got, raw) = results
        assert (got, raw if got != "ok" else None) == (want, made if want != "ok" else None)
        outcomes[want] += 1
        for m in messages if isinstance(messages, list) else ():
            if build.calls_tools(m):  # a message it passes without the compiled kind
                assert build.fits(m, build.MESSAGE)
                outcomes["calls tools"] += 1
        if want == "ok":
            assert [m["role"] for m in raw] == [m["role"] for m in made]
            k = build.last_assistant(made)
            assert build.last_assistant(raw) == k
            if k is not None:
                assert build.answered_tool_calls(raw[:k]) == build.answered_tool_calls(made[:k])
    assert min(outcomes.values()) > 50, outcomes


@pytest.mark.parametrize("n", [2, 3, 5])
def test_a_list_whose_bad_item_is_not_the_first_does_not_fit(n):
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    for at in range(1, n):
        calls = [dict(call) for _ in range(n)]
        calls[at] = 7
        m = {"role": "assistant", "content": None, "tool_calls": calls}
        assert not build.fits(m, build.MESSAGE)
        assert build.mismatch(m, build.MESSAGE, "m") == (
            f"field 'm.tool_calls[{at}]' is a number, expected an object"
        )


@pytest.mark.parametrize("row", [["a"], 7, 1.5, "text", True, None])
def test_check_record_refuses_a_row_that_is_not_an_object(row):
    with pytest.raises(build.BuildError) as e:
        build.check_record(row, {"question": str}, "f line 1")
    assert str(e.value) == f"f line 1: the row is {build.describe(row)}, not an object"


def test_check_record_names_the_first_field_of_another_kind():
    fields = build.SOURCES["wildchat"].fields
    good = {"conversation": [{"role": "user", "content": "hi"}] * 3, "language": "English",
            "toxic": False, "redacted": False, "turn": 2}  # fmt: skip
    build.check_record(good, fields, "f row 0")
    rng = random.Random(5)
    for _ in range(300):
        record = {n: random_value(rng, k) for n, k in fields.items()}
        wrong = [n for n, k in fields.items() if not accepts(k, record.get(n))]
        if not wrong:
            build.check_record(record, fields, "f row 0")
            continue
        with pytest.raises(build.BuildError) as e:
            build.check_record(record, fields, "f row 0")
        want = build.mismatch(record.get(wrong[0]), fields[wrong[0]], wrong[0])
        assert str(e.value) == f"f row 0: {want}"
    bad = dict(good, conversation=[{"role": "user", "content": "hi"}, {"role": 7, "content": ""}])
    with pytest.raises(build.BuildError, match=r"field 'conversation\[1\]\.role' is a number"):
        build.check_record(bad, fields, "f row 0")


def test_check_record_takes_messages_as_any_list_they_are_checked_one_by_one_later():
    build.check_record({"messages": [7, None]}, {"messages": build.MESSAGES}, "f line 1")
    with pytest.raises(build.BuildError, match="field 'messages' is a number, expected a list"):
        build.check_record({"messages": 7}, {"messages": build.MESSAGES}, "f line 1")


@pytest.mark.parametrize(
    "messages, problem",
    [
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": 7}],
         "field 'messages[1].content' is a number, expected text or null or an object or a list"),
        ([{"role": "user", "content": "a"}, 7], "field 'messages[1]' is a number, expected an object"),
        ([{"role": "user", "content": "a", "tool_call_id": 7}],
         "field 'messages[0].tool_call_id' is a number, expected text"),
        ([], "messages is not a non-empty list of messages"),
        ({"role": "user"}, "messages is not a non-empty list of messages"),
    ],
)  # fmt: skip
def test_check_messages_finds_any_message_of_another_kind(messages, problem):
    with pytest.raises(build.BuildError) as e:
        build.check_messages(messages, "f line 1")
    assert str(e.value) == f"f line 1: {problem}"
    if isinstance(messages, list) and messages:
        with pytest.raises(build.BuildError) as e:
            build.openai_messages(messages, "f line 1")
        assert str(e.value) == f"f line 1: {problem}"
