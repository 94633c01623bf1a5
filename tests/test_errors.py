"""Every bad input gives one clear `error:` line, a non-zero exit, no traceback, and leaves OUT as
it was: the same bytes when a previous build is there, nothing new otherwise, and no staging
directories (`.OUT.tmp-*`, `.OUT.old-*`) beside it.

Each test damages a copy of the miniature sources (the `mini` fixture is never touched) and runs
build.py as a user would, restricted with --only to the source concerned.
"""

from __future__ import annotations

import hashlib
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "build.py"

GSM8K = "openai/gsm8k/main/test-00000-of-00001.parquet"
HUMANEVAL = "openai/openai_humaneval/openai_humaneval/test-00000-of-00001.parquet"
MRCR_1 = "openai/mrcr/2needle/2needle_1.parquet"
SWE = "SWE-bench/SWE-smith-trajectories/data/xml-00000-of-00008.parquet"
NEMOTRON = "nvidia/Nemotron-Agentic-v1/data/interactive_agent.jsonl"
LONGWRITER = "zai-org/LongWriter-6k/long.jsonl"
LONGBENCH = "caskcsg/LongBench-Pro/longbench_pro.json"
WILDCHAT = "allenai/WildChat-4.8M/data/train-00000-of-00086.parquet"
MIMO_MUSIC = "XiaomiMiMo/MiMo-V2.6-RL-oss/music.parquet"


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under root (relative path -> bytes), directories included as None."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def previous(mini, tmp_path_factory):
    """A good OUT from an earlier build (gsm8k only), and its bytes."""
    out = tmp_path_factory.mktemp("previous") / "out"
    cmd = [sys.executable, str(BUILD), str(mini.src), str(mini.tokenizer), str(out)]
    cmd += ["--rev", str(mini.rev), "--books", str(mini.books), "--only", "gsm8k", "--quiet"]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return out, _tree(out)


class Case:
    """A damageable copy of the miniature sources, and an OUT beside a watched parent."""

    def __init__(self, mini, previous, root: Path, had_out: bool = True):
        self.root = root
        self.src = root / "src"
        shutil.copytree(mini.src, self.src)
        self.rev, self.books = root / "REV", root / "BOOKS"
        shutil.copyfile(mini.rev, self.rev)
        shutil.copyfile(mini.books, self.books)
        self.tokenizer = root / "tokenizer.json"
        shutil.copyfile(mini.tokenizer, self.tokenizer)
        self.parent = root / "outputs"
        self.parent.mkdir()
        self.out = self.parent / "out"
        if had_out:
            shutil.copytree(previous[0], self.out)
        self.before = _tree(self.parent)
        assert bool(self.before) == had_out

    def file(self, rel: str) -> Path:
        return self.src / rel

    def repin(self, rel: str, nbytes: str | None = None, sha: str | None = None) -> None:
        """Give the REV line of `rel` the file's present size and sha256 (or the values given)."""
        path = self.file(rel)
        nbytes = nbytes or str(path.stat().st_size)
        sha = sha or _sha256(path)
        lines = []
        for line in self.rev.read_text(encoding="utf-8").splitlines():
            fields = line.split()
            if fields and not line.startswith("#") and f"{fields[1]}/{fields[3]}" == rel:
                line = "  ".join(fields[:4] + [nbytes, sha])
            lines.append(line)
        self.rev.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def rewrite_parquet(self, rel: str, change) -> None:
        """Rewrite a parquet file through `change(table) -> table`, then repin it."""
        path = self.file(rel)
        table = change(pq.read_table(path))
        pq.write_table(table, path)
        self.repin(rel)

    def command(self, *extra, src=None, tokenizer=None, out=None) -> list[str]:
        return [
            sys.executable, str(BUILD), str(src or self.src), str(tokenizer or self.tokenizer),
            str(out or self.out), "--rev", str(self.rev), "--books", str(self.books), *extra,
        ]  # fmt: skip

    def run(self, *extra, timeout=60, **kw) -> subprocess.CompletedProcess:
        preexec = kw.pop("preexec_fn", None)
        return subprocess.run(
            self.command(*extra, **kw), cwd=REPO, capture_output=True, text=True,
            timeout=timeout, preexec_fn=preexec,
        )  # fmt: skip

    def failed(self, result, *names: str, prefix: str = "error: ") -> str:
        """The build failed cleanly: one error line naming `names`; OUT untouched."""
        assert result.returncode != 0, result.stderr
        assert "Traceback" not in result.stderr, result.stderr
        errors = [ln for ln in re.split(r"[\r\n]+", result.stderr) if "error:" in ln]
        assert len(errors) == 1, result.stderr
        (line,) = errors
        assert line.startswith(prefix), line
        for name in names:
            assert name in line, (name, line)
        self.untouched()
        return line

    def untouched(self) -> None:
        assert _tree(self.parent) == self.before, sorted(os.listdir(self.parent))


@pytest.fixture
def case(mini, previous, tmp_path):
    return Case(mini, previous, tmp_path)


@pytest.fixture(params=[True, False], ids=["previous-out", "no-out"])
def either(request, mini, previous, tmp_path):
    return Case(mini, previous, tmp_path, had_out=request.param)


# ------------------------------------------------------------------------------------------------
# Source files: present, the pinned size and sha256


def test_src_missing(either):
    result = either.run("--only", "gsm8k", src=either.root / "nowhere")
    either.failed(result, str(either.root / "nowhere"), "fetch.sh")


def test_pinned_file_missing(case):
    case.file(GSM8K).unlink()
    line = case.failed(case.run("--only", "gsm8k"), GSM8K, "fetch.sh")
    assert "missing source file" in line


@pytest.mark.parametrize("change", ["shorter", "longer"])
def test_pinned_file_wrong_size(case, change):
    path = case.file(HUMANEVAL)
    data = path.read_bytes()
    size = len(data)
    path.write_bytes(data[:-1] if change == "shorter" else data + b"\0")
    line = case.failed(case.run("--only", "humaneval"), HUMANEVAL, str(size))
    assert str(size - 1 if change == "shorter" else size + 1) in line
    assert ("truncated" if change == "shorter" else "too long") in line


def test_pinned_file_wrong_sha256(case):
    path = case.file(HUMANEVAL)
    pinned = _sha256(path)
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    case.failed(case.run("--only", "humaneval"), HUMANEVAL, pinned, _sha256(path), "expected")


def test_wrong_sha256_is_reported_before_the_reader_fails(case):
    """The hashing runs while the sources are read: a file that is not the pinned one and cannot
    be parsed either is reported by its sha256, which says what to do."""
    path = case.file(MRCR_1)
    size = path.stat().st_size
    path.write_bytes(b"<html>rate limited</html>\n".ljust(size, b" "))
    line = case.failed(case.run("--only", "mrcr"), MRCR_1, _sha256(path), "expected")
    assert "unreadable" not in line


# ------------------------------------------------------------------------------------------------
# Unreadable files, rows and lines


def test_parquet_truncated(case):
    path = case.file(GSM8K)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    case.repin(GSM8K)  # the new size and sha256: the reader is the one to notice
    line = case.failed(case.run("--only", "gsm8k"), GSM8K, "row 0")
    assert "unreadable parquet" in line


def test_parquet_not_parquet(case):
    case.file(MRCR_1).write_bytes(b"<html>rate limited</html>\n")
    case.repin(MRCR_1, "-", "-")
    line = case.failed(case.run("--only", "mrcr", "--no-verify"), MRCR_1)
    assert "unreadable parquet" in line


@pytest.mark.parametrize(
    "rel,only",
    [(NEMOTRON, "nemotron-agentic"), (LONGWRITER, "longwriter")],
    ids=["nemotron", "longwriter"],
)
def test_jsonl_line_not_json(case, rel, only):
    path = case.file(rel)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = b'{"messages": [{"role": "user", "content": "cut off\n'
    path.write_bytes(b"".join(lines))
    case.repin(rel)
    case.failed(case.run("--only", only), rel, "line 3", "not JSON")


def test_longbench_not_a_json_array(case):
    case.file(LONGBENCH).write_bytes(b'{"data": []}\n')
    case.repin(LONGBENCH)
    case.failed(case.run("--only", "longbench-pro"), LONGBENCH, "JSON array")


def test_longbench_not_json(case):
    path = case.file(LONGBENCH)
    path.write_bytes(path.read_bytes()[:-1000])
    case.repin(LONGBENCH)
    case.failed(case.run("--only", "longbench-pro"), LONGBENCH, "not JSON")


def test_mrcr_prompt_not_json(case):
    """MRCR prompts are parsed when a slot looks at them: spoil the longest one of the second
    file (it is looked at), keeping its length; the message gives the row within that file."""
    prompts = pq.read_table(case.file(MRCR_1), columns=["prompt"])["prompt"].to_pylist()
    row = max(range(len(prompts)), key=lambda i: len(prompts[i]))

    def spoil(table):
        bad = "not JSON " + "x" * (len(prompts[row]) - 9)
        values = prompts[:row] + [bad] + prompts[row + 1 :]
        index = table.schema.get_field_index("prompt")
        return table.set_column(index, table.schema.field(index), pa.array(values, pa.string()))

    case.rewrite_parquet(MRCR_1, spoil)
    case.failed(case.run("--only", "mrcr"), MRCR_1, f"row {row}:", "prompt")


def test_swe_smith_messages_not_json(case):
    def spoil(table):
        values = table["messages"].to_pylist()
        values[5] = '[{"role": "system", "content": '
        index = table.schema.get_field_index("messages")
        return table.set_column(index, table.schema.field(index), pa.array(values, pa.string()))

    case.rewrite_parquet(SWE, spoil)
    case.failed(case.run("--only", "swe-smith"), SWE, "row 5:", "messages")


def _without(table, column, row):
    values = table[column].to_pylist()
    values[row] = None
    index = table.schema.get_field_index(column)
    field = table.schema.field(index)
    return table.set_column(index, field, pa.array(values, field.type))


def test_parquet_row_without_a_field(case):
    case.rewrite_parquet(GSM8K, lambda t: _without(t, "question", 2))
    case.failed(case.run("--only", "gsm8k"), GSM8K, "row 2:", "'question'")


def test_parquet_row_without_a_field_second_file(case):
    """The row is counted within the file that holds it (the source id counts across files)."""
    n0 = pq.ParquetFile(case.file(MRCR_1.replace("_1", "_0"))).metadata.num_rows
    assert n0 > 0
    case.rewrite_parquet(MRCR_1, lambda t: _without(t, "prompt", 1))
    case.failed(case.run("--only", "mrcr"), MRCR_1, "row 1:", "'prompt'")


def test_json_row_without_a_field(case):
    rows = orjson.loads(case.file(LONGBENCH).read_bytes())
    del rows[4]["question_thinking"]
    case.file(LONGBENCH).write_bytes(orjson.dumps(rows))
    case.repin(LONGBENCH)
    case.failed(case.run("--only", "longbench-pro"), LONGBENCH, "row 4:", "question_thinking")


@pytest.mark.parametrize(
    "damage,needle",
    [
        (lambda r: r.pop("messages"), "'messages'"),
        (lambda r: r["messages"].__setitem__(0, {"content": "no role"}), "role"),
        (lambda r: r["messages"].__setitem__(1, {"role": "assistant", "tool_calls": [{"id": "c"}]}),
         "tool_calls[0].function"),
    ],
    ids=["no-messages", "no-role", "tool-call-without-function"],
)  # fmt: skip
def test_jsonl_row_without_a_field(case, damage, needle):
    path = case.file(NEMOTRON)
    lines = path.read_bytes().splitlines(keepends=True)
    record = orjson.loads(lines[6])
    damage(record)
    lines[6] = orjson.dumps(record) + b"\n"
    path.write_bytes(b"".join(lines))
    case.repin(NEMOTRON)
    case.failed(case.run("--only", "nemotron-agentic"), NEMOTRON, "line 7", needle)


@pytest.mark.parametrize("column", ["toxic", "language", "conversation"])
def test_wildchat_without_a_column(case, column):
    case.rewrite_parquet(WILDCHAT, lambda t: t.drop_columns([column]))
    case.failed(case.run("--only", "wildchat"), WILDCHAT, f"'{column}")


# ------------------------------------------------------------------------------------------------
# The tokenizer


def test_tokenizer_missing(case):
    missing = case.root / "no-tokenizer.json"
    case.failed(case.run("--only", "gsm8k", tokenizer=missing), str(missing), "fetch.sh")


def test_tokenizer_not_a_tokenizer(case):
    bogus = case.root / "bogus.json"
    bogus.write_text('{"not": "a tokenizer"}\n')
    line = case.failed(case.run("--only", "gsm8k", tokenizer=bogus), str(bogus))
    assert "--any-tokenizer" in line  # without it, a file that is not pinned is refused first
    case.failed(case.run("--only", "gsm8k", "--any-tokenizer", tokenizer=bogus), str(bogus))
    bogus.write_bytes(b"\x89PNG\r\n\x1a\n")
    line = case.failed(case.run("--only", "gsm8k", "--any-tokenizer", tokenizer=bogus), str(bogus))
    assert "not a tokenizer" in line


def test_tokenizer_not_the_pinned_one(case):
    other = case.root / "other.json"
    raw = orjson.loads(case.tokenizer.read_bytes())
    other.write_bytes(orjson.dumps(raw))  # the same tokenizer, other bytes
    line = case.failed(case.run("--only", "gsm8k", tokenizer=other), str(other), _sha256(other))
    assert "--any-tokenizer" in line and _sha256(case.tokenizer) in line


# ------------------------------------------------------------------------------------------------
# A slot left short


def test_slot_short_when_rev_drops_files(case):
    text = case.rev.read_text(encoding="utf-8")
    case.rev.write_text(
        "".join(ln for ln in text.splitlines(keepends=True) if "music.parquet" not in ln)
    )
    line = case.failed(case.run("--only", "mimo"), "mimo", "slot", "group=music", "looking at")
    assert re.search(r"looking at \d+ of \d+ candidates; rejected: \d+ filter", line), line


def test_slot_short_when_a_file_has_too_few_rows(case):
    case.rewrite_parquet(GSM8K, lambda t: t.slice(0, 2))
    line = case.failed(case.run("--only", "gsm8k"), "gsm8k", "slot", "2 of 4 rows")
    assert "looking at 2 of 2 candidates" in line and "rejected:" in line


# ------------------------------------------------------------------------------------------------
# Pin files


@pytest.mark.parametrize(
    "bad",
    [
        "dataset  openai/gsm8k  740312add88f781978c0658806c59bc2815b9866  main/x.parquet  12",
        "data  openai/gsm8k  740312add88f781978c0658806c59bc2815b9866  main/x.parquet  12  -",
        "dataset  openai/gsm8k  740312add88f781978c0658806c59bc2815b9866  main/x.parquet  1e3  -",
        "dataset  openai/gsm8k  740312add88f781978c0658806c59bc2815b9866  main/x.parquet  12  ABC",
        "dataset  openai/gsm8k  740312add88f781978c0658806c59bc2815b9866  ../x.parquet  12  -",
        "duplicate",
    ],
    ids=["columns", "kind", "bytes", "sha256", "traversal", "duplicate"],
)
def test_rev_malformed_line(case, bad):
    lines = case.rev.read_text(encoding="utf-8").splitlines()
    gsm = next(i for i, ln in enumerate(lines) if GSM8K.split("/", 2)[2] in ln)
    lines.insert(gsm + 1, lines[gsm] if bad == "duplicate" else bad)
    case.rev.write_text("\n".join(lines) + "\n", encoding="utf-8")
    line = case.failed(case.run("--only", "gsm8k"), f"{case.rev}:{gsm + 2}")
    if bad == "duplicate":
        assert f"is already pinned at {case.rev}:{gsm + 1}" in line


UNSAFE = {"absolute": "/etc/x", "dotdot": "a/../b", "parent": "..", "empty": "a//b", "dot": "./a"}


@pytest.mark.parametrize("value", UNSAFE.values(), ids=UNSAFE.keys())
@pytest.mark.parametrize("column", ["repo", "revision", "path"])
@pytest.mark.parametrize("pins", ["REV", "BOOKS"])
def test_a_pin_that_would_leave_src_is_refused(case, pins, column, value):
    """What fetch.sh refuses, build.py refuses too: no pinned file is read from outside SRC."""
    path = case.rev if pins == "REV" else case.books
    lines = path.read_text(encoding="utf-8").splitlines()
    first = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    fields = lines[first].split()
    fields[
        {
            "REV": {"repo": 1, "revision": 2, "path": 3},
            "BOOKS": {"repo": 2, "revision": 3, "path": 4},
        }[pins][column]
    ] = value
    lines[first] = "  ".join(fields)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    only = "gutenberg" if pins == "BOOKS" else "longbench-pro"
    case.failed(case.run("--only", only), f"{path}:{first + 1}", column, repr(value))


@pytest.mark.parametrize(
    "digits", ["١٢٣", "１２３", "²"], ids=["arabic-indic", "fullwidth", "superscript"]
)
def test_pinned_bytes_in_other_digits_are_refused(case, digits):
    lines = case.rev.read_text(encoding="utf-8").splitlines()
    gsm = next(i for i, ln in enumerate(lines) if GSM8K.split("/", 2)[2] in ln)
    fields = lines[gsm].split()
    fields[4] = digits
    lines[gsm] = "  ".join(fields)
    case.rev.write_text("\n".join(lines) + "\n", encoding="utf-8")
    case.failed(case.run("--only", "gsm8k"), f"{case.rev}:{gsm + 1}", "bytes")


@pytest.mark.parametrize("bad", ["lang", "columns", "duplicate", "ebook"])
def test_books_malformed_line(case, bad):
    lines = case.books.read_text(encoding="utf-8").splitlines()
    first = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    fields = lines[first].split()
    new = {
        "lang": "  ".join([fields[0], "fr", *fields[2:]]),
        "columns": "  ".join(fields[:6]),
        "duplicate": lines[first],
        "ebook": "  ".join(["١٤٥", *fields[1:]]),
    }[bad]
    lines.insert(first + 1, new)
    case.books.write_text("\n".join(lines) + "\n", encoding="utf-8")
    case.failed(case.run("--only", "gutenberg"), f"{case.books}:{first + 2}")


@pytest.mark.parametrize("how", ["missing", "not-text"])
def test_rev_not_readable(case, how):
    if how == "missing":
        case.rev.unlink()
    else:
        case.rev.write_bytes(b"\xff\xfe not text\n")
    line = case.failed(case.run("--only", "gsm8k"), str(case.rev))
    if how == "missing":
        assert "cannot read pin file" in line
    else:  # docs/building.md "The pin files": UTF-8 text, refused at the line that is not
        assert line.startswith(f"error: {case.rev}:1: not valid UTF-8 (byte 0xff at byte 1")


# ------------------------------------------------------------------------------------------------
# OUT


def test_out_is_a_file(case):
    target = case.parent / "a-file"
    target.write_bytes(b"keep me\n")
    case.before = _tree(case.parent)
    case.failed(case.run("--only", "gsm8k", out=target), str(target), "not a directory")


def test_out_parent_is_a_file(case):
    target = case.parent / "a-file" / "out"
    target.parent.write_bytes(b"keep me\n")
    case.before = _tree(case.parent)
    case.failed(case.run("--only", "gsm8k", out=target), str(target.parent), "writable")


def test_out_parent_read_only(mini, previous, tmp_path):
    """A read-only bind mount of OUT's parent, in a private mount namespace (root ignores
    permission bits; the mount vanishes with the process)."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-m", "true"], capture_output=True).returncode:
        pytest.skip("unshare -m (a private mount namespace) is not available")
    case = Case(mini, previous, tmp_path)
    parent = str(case.parent)
    script = 'mount --bind -o ro "$1" "$1" || exit 99; shift; exec "$@"'
    cmd = [unshare, "-m", "sh", "-c", script, "sh", parent, *case.command("--only", "gsm8k")]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    if result.returncode == 99:
        pytest.skip(f"read-only bind mount failed: {result.stderr.strip()}")
    case.failed(result, parent, "writable")


def test_out_holds_foreign_files(case):
    (case.out / "notes.txt").write_text("mine\n")
    (case.out / "data").mkdir()
    case.before = _tree(case.parent)
    case.failed(case.run("--only", "gsm8k"), str(case.out), "notes.txt")


def _small_files(limit):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


@pytest.mark.parametrize("limit", [0, 3000])
def test_disk_full(either, limit):
    """Writes past RLIMIT_FSIZE fail (EFBIG) as on a full disk: at the first parquet file, or
    later ones."""
    result = either.run("--only", "gsm8k,humaneval", preexec_fn=_small_files(limit))
    line = either.failed(result, "cannot write", str(either.out))
    assert "unchanged" in line


@pytest.mark.parametrize("full", ["space", "inodes"])
def test_disk_full_tmpfs(mini, previous, tmp_path, full):
    """A real ENOSPC: OUT's parent on a tiny tmpfs in a private mount namespace, with room for the
    previous OUT and a little more (space), or with no inode left for the staging directory."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-m", "true"], capture_output=True).returncode:
        pytest.skip("unshare -m (a private mount namespace) is not available")
    case = Case(mini, previous, tmp_path)
    size = sum(len(v) for v in case.before.values() if v) + 24 * 1024
    opts = f"size={size}" if full == "space" else f"size=4m,nr_inodes={len(case.before) + 1}"
    script = (
        'p="$1"; shift; mkdir -p "$p.keep"; cp -a "$p/." "$p.keep/";'
        'mount -t tmpfs -o "$OPTS" tmpfs "$p" || exit 99; cp -a "$p.keep/." "$p/";'
        '"$@"; rc=$?; cd "$p" && find . -type f | sort | xargs -r sha256sum; ls -A; exit $rc'
    )
    cmd = [unshare, "-m", "sh", "-c", script, "sh", str(case.parent)]
    cmd += case.command("--only", "gsm8k,humaneval,mbpp,mimo")
    env = dict(os.environ, OPTS=opts)
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    if result.returncode == 99:
        pytest.skip(f"tmpfs mount failed: {result.stderr.strip()}")
    shutil.rmtree(str(case.parent) + ".keep")
    case.failed(result, "cannot write", str(case.out))
    sums = {f"./{k}": hashlib.sha256(v).hexdigest() for k, v in case.before.items() if v}
    listed = dict(reversed(ln.split("  ", 1)) for ln in result.stdout.splitlines() if "  " in ln)
    assert listed == sums
    assert [ln for ln in result.stdout.splitlines() if "  " not in ln] == ["out"]


# ------------------------------------------------------------------------------------------------
# Interrupted


@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"]
)
def test_interrupted_mid_build(either, signum):
    log = either.root / "stderr.txt"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            either.command("--only", "mrcr,swe-smith,gutenberg"), cwd=REPO,
            stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while b"mrcr:" not in log.read_bytes():  # selecting the first source
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.01)
            proc.send_signal(signum)
            returncode = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    result = subprocess.CompletedProcess(proc.args, returncode, "", log.read_text())
    line = either.failed(result, "interrupted", str(either.out))
    assert "unchanged" in line


# ------------------------------------------------------------------------------------------------
# Command line


def test_only_unknown_name(case):
    result = case.run("--only", "gsm8k,gsm9k")
    assert result.returncode == 2
    case.failed(result, "'gsm9k'", "mrcr", prefix="build.py: error: ")


@pytest.mark.parametrize("jobs", ["0", "-1", "two"])
def test_jobs_not_positive(case, jobs):
    result = case.run("--only", "gsm8k", "--jobs", jobs)
    assert result.returncode == 2
    case.failed(result, "--jobs", prefix="build.py: error: ")


@pytest.mark.parametrize("content", [b"\xff\xfe\x00binary\x00", b"", b"not sums\n"])
def test_check_sums_that_are_not_sums(case, content):
    sums = case.root / "SHA256SUMS"
    sums.write_bytes(content)
    case.failed(case.run("--only", "gsm8k", "--check", str(sums)), str(sums))


def test_only_empty_is_refused(case):
    result = case.run("--only", "")
    assert result.returncode == 2
    case.failed(result, "--only", "gsm8k", prefix="build.py: error: ")


def test_jobs_beyond_the_cpus_are_cut_to_them(case):
    """More tokenizer threads than CPUs would only cost memory (and ignore signals while they
    start): --jobs is cut to the CPUs this process may run on."""
    import build

    args = build.parse_args(["s", "t", "o", "--jobs", "1000000000"])
    assert args.jobs == build.available_cpus() >= 1
    result = case.run("--only", "gsm8k", "--quiet", "--jobs", "1000000000")
    assert result.returncode == 0, result.stderr


# ------------------------------------------------------------------------------------------------
# Files a user names: regular files, read with a cap


def _not_a_file(kind, path):
    """Put a FIFO, a directory or a device (a link to /dev/zero) at `path`."""
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")
    return {"fifo": "a FIFO", "directory": "a directory", "device": "a character device"}[kind]


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
@pytest.mark.parametrize("which", ["rev", "books", "check", "tokenizer", "pinned"])
def test_a_named_path_that_is_not_a_regular_file_is_refused(case, which, kind):
    """Never blocks on a FIFO, never reads /dev/zero into memory; says what the path is."""
    path = {
        "rev": case.rev, "books": case.books, "check": case.root / "SUMS",
        "tokenizer": case.tokenizer, "pinned": case.file(GSM8K),
    }[which]  # fmt: skip
    what = _not_a_file(kind, path)
    extra = ["--check", str(path)] if which == "check" else []
    only = "gutenberg" if which == "books" else "gsm8k"
    result = case.run("--only", only, "--any-tokenizer", *extra, timeout=60)
    case.failed(result, str(path), what)


def test_a_pin_file_past_its_cap_is_refused(case):
    import build

    case.rev.write_text(case.rev.read_text() + "#" * build.PIN_CAP)
    case.failed(case.run("--only", "gsm8k"), str(case.rev), "larger than 64 KiB")


# ------------------------------------------------------------------------------------------------
# Paths that are not UTF-8, in any locale


C_LOCALE = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}


def _run_bytes(case, which, name, env):
    args = {"src": case.src, "tokenizer": case.tokenizer, "out": case.out}
    target = os.fsencode(args[which].parent) + b"/" + name
    if which != "out":
        os.rename(args[which], target)
    args[which] = target
    cmd = [os.fsencode(a) for a in case.command("--only", "gsm8k", "--quiet")]
    cmd[2:5] = [os.fsencode(args[k]) for k in ("src", "tokenizer", "out")]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, timeout=60, env=os.environ | env)


@pytest.mark.parametrize("locale", ["default", "C"])
@pytest.mark.parametrize("which", ["src", "tokenizer", "out"])
def test_a_path_that_is_not_utf8_is_one_line(case, which, locale):
    result = _run_bytes(case, which, b"name-\xff", C_LOCALE if locale == "C" else {})
    text = subprocess.CompletedProcess(result.args, result.returncode, "", result.stderr.decode())
    case.failed(text, "not a valid UTF-8 file name", "name-")


@pytest.mark.parametrize("which", ["src", "tokenizer", "out"])
def test_a_utf8_name_builds_in_the_c_locale(case, which):
    result = _run_bytes(case, which, "näme-中".encode(), C_LOCALE)
    assert result.returncode == 0, result.stderr.decode()
    assert b"Traceback" not in result.stderr


def test_a_pin_path_this_locale_cannot_name_is_one_line(case):
    """Under a C locale with UTF-8 mode off, file names are ASCII: a pinned path with a letter
    outside it is refused in one line, not a UnicodeEncodeError traceback."""
    rev = case.rev.read_text(encoding="utf-8").replace("test-00000-of-00001", "tést", 1)
    case.rev.write_text(rev, encoding="utf-8")
    cmd = case.command("--only", "gsm8k", "--quiet")
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60,
                            env=os.environ | C_LOCALE, encoding="utf-8", errors="replace")  # fmt: skip
    case.failed(result, "cannot be a file name in this locale")


# ------------------------------------------------------------------------------------------------
# Start-up


@pytest.mark.parametrize("after", ["argparse", "orjson", "pyarrow.parquet", "tqdm"])
@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"]
)
def test_a_signal_while_build_py_starts_is_one_line(case, signum, after):
    """A signal while build.py imports its modules (sent once `-X importtime` reports a module
    it imports): one line, never a KeyboardInterrupt traceback."""
    cmd = case.command("--only", "gsm8k")
    proc = subprocess.Popen(
        [cmd[0], "-X", "importtime", *cmd[1:]], cwd=REPO, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.rstrip().endswith(f"| {after}"):
            break
    proc.send_signal(signum)
    lines += proc.stderr.read().splitlines(True)
    proc.wait(timeout=60)
    err = "".join(ln for ln in lines if not ln.startswith("import time:"))
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert proc.returncode == 130, err
    (line,) = err.splitlines()
    assert line.startswith("error: interrupted"), err
    case.untouched()


def test_a_line_after_a_progress_bar_left_open_is_a_line_of_its_own(capsys):
    """A signal that comes while a progress bar is being made leaves it open (its first line
    written, its `with` not entered: test_interrupted_mid_build met it on a loaded machine); the
    one error line still starts a line."""
    import build

    bar = build.tqdm(desc="mrcr", unit=" candidates", file=sys.stderr)  # kept: not collected
    assert build.fail("error: interrupted; OUT out is unchanged", 130) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "error: interrupted; OUT out is unchanged"
    assert bar.disable  # closed
