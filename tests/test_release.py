"""What a build writes and publishes (docs/building.md "What a build writes"): the manifest,
SHA256SUMS, the content sha256, --check, the atomic replacement of OUT, the generated card, and
parquet files that the usual readers (pyarrow, Hugging Face datasets, DuckDB) load as the schema
says."""

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
import unicodedata
from datetime import UTC, datetime
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from make_sources import write_pins

import build

REPO = Path(__file__).resolve().parents[1]
SPLITS = ("smoke", "standard", "full")
PARQUETS = tuple(f"{s}.parquet" for s in SPLITS)
OUT_FILES = (*PARQUETS, "manifest.json", "README.md", "SHA256SUMS")
SOURCE_NAMES = (
    "longbench-pro mrcr swe-smith nemotron-agentic wildchat gsm8k numinamath humaneval mbpp "
    "mimo longwriter gutenberg"
).split()
ROW_KEYS = {"split", "index", "source", "name", "group", "slot", "prompt_tokens", "row_sha256"}
INPUT_KEYS = {"repo", "revision", "path", "bytes", "sha256"}


# ------------------------------------------------------------------------------------------------
# Helpers


def build_cmd(mini, out, *extra, src=None, rev=None, books=None, quiet=True):
    return [sys.executable, str(REPO / "build.py"), str(src or mini.src), str(mini.tokenizer),
            str(out), "--rev", str(rev or mini.rev), "--books", str(books or mini.books),
            *(["--quiet"] if quiet else []), *extra]  # fmt: skip


def run_build(mini, out, *extra, **kw):
    return subprocess.run(
        build_cmd(mini, out, *extra, **kw), cwd=REPO, capture_output=True, text=True, timeout=300
    )


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def snapshot(out):
    return {p.name: p.read_bytes() for p in sorted(Path(out).iterdir())}


def leftovers(out):
    """Temporary directories a build leaves beside OUT (`.OUT.tmp-*`, `.OUT.old-*`)."""
    return sorted(p.name for p in Path(out).parent.iterdir() if p.name.startswith(f".{out.name}."))


def canonical(row):
    """README: one line per row, computed here with the standard library only."""
    obj = {"messages": row["messages"], "tools": row["tools"], "source": row["source"]}
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def nfc_bytes(text):
    """Prompt tokens under the fixture's byte tokenizer: a token per UTF-8 byte of the NFC text."""
    return len(unicodedata.normalize("NFC", text).encode("utf-8"))


def read_pin_lines(path):
    return [line.split("#", 1)[0].split() for line in Path(path).read_text().splitlines()]


def sums_lines(text):
    """SHA256SUMS -> ({file: sha}, {file: content sha}, packages line, [(split, index, sha, source)])."""
    files, content, packages, rows = {}, {}, None, []
    for line in text.splitlines():
        if m := re.fullmatch(r"([0-9a-f]{64})  (\S+)", line):
            files[m[2]] = m[1]
        elif m := re.fullmatch(r"# content ([0-9a-f]{64})  (\S+)", line):
            content[m[2]] = m[1]
        elif line.startswith("# packages "):
            packages = line.removeprefix("# packages ")
        elif m := re.fullmatch(r"# row (\S+) (\d+) ([0-9a-f]{64}) (.+)", line):
            rows.append((m[1], int(m[2]), m[3], m[4]))
        else:
            raise AssertionError(f"unexpected SHA256SUMS line {line!r}")
    return files, content, packages, rows


def md_table(card, heading):
    """The rows of the first Markdown table under `## heading`, as lists of cell strings."""
    section = card.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    assert len(lines) >= 3 and set(lines[1]) <= set("|-: "), f"no table under {heading}"
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]
    return cells(lines[0]), [cells(line) for line in lines[2:]]


def token_range(cell):
    m = re.fullmatch(r"([\d,]+) – ([\d,]+)", cell)
    assert m, f"not a token range: {cell!r}"
    return [int(m[1].replace(",", "")), int(m[2].replace(",", ""))]


def yaml_header(text):
    yaml = pytest.importorskip("yaml", reason="PyYAML (installed with the test extra) is missing")
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("\n---\n", 1)[0].removeprefix("---\n"))


def default_sigint():
    # A shell that starts jobs in the background makes them ignore SIGINT, and Python keeps an
    # ignored SIGINT ignored: give the build the default disposition, as at a terminal.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# ------------------------------------------------------------------------------------------------
# Fixtures: one full build reused by most tests, and a build from sources with one row altered.


@pytest.fixture(scope="module")
def release(mini, tmp_path_factory):
    out = tmp_path_factory.mktemp("release") / "out"
    result = run_build(mini, out)
    assert result.returncode == 0, result.stderr
    return SimpleNamespace(
        out=out,
        files=snapshot(out),
        manifest=json.loads((out / "manifest.json").read_bytes()),
        tables={s: pq.read_table(out / f"{s}.parquet") for s in SPLITS},
        sums=(out / "SHA256SUMS").read_text(encoding="utf-8"),
    )


@pytest.fixture(scope="module")
def altered(mini, release, tmp_path_factory):
    """Sources where the smoke GSM8K question differs by one character (same length, so the same
    selection, order and token count), built with --check against the release's SHA256SUMS."""
    root = tmp_path_factory.mktemp("altered")
    src = root / "src"
    shutil.copytree(mini.src, src)
    row = next(
        r for r in release.manifest["rows"] if r["split"] == "smoke" and r["name"] == "gsm8k"
    )
    number = int(row["source"].rsplit("#", 1)[1])
    (pin,) = [p for p in read_pin_lines(mini.rev) if p and p[1] == "openai/gsm8k"]
    path = src / pin[1] / pin[3]
    table = pq.read_table(path)
    questions = table.column("question").to_pylist()
    old = questions[number]
    questions[number] = old[:-1] + ("!" if old[-1] != "!" else "?")
    table = table.set_column(
        table.schema.get_field_index("question"), "question", pa.array(questions, pa.string())
    )
    pq.write_table(table, path)
    write_pins(src, root / "REV", root / "BOOKS", rev_in=mini.rev, books_in=mini.books)
    out = root / "out"
    result = run_build(
        mini, out, "--check", str(release.out / "SHA256SUMS"),
        src=src, rev=root / "REV", books=root / "BOOKS",
    )  # fmt: skip
    return SimpleNamespace(out=out, result=result, source=row["source"], src=src, root=root)


# ------------------------------------------------------------------------------------------------
# 1. manifest.json


def test_manifest_records_tokenizer_packages_and_every_input_as_on_disk(release, mini):
    m = release.manifest
    assert m["only"] is None
    assert m["tokenizer_sha256"] == sha256(mini.tokenizer.read_bytes())
    (model,) = [p for p in read_pin_lines(mini.rev) if p and p[0] == "model"]
    assert m["tokenizer_sha256"] == model[5]

    pins = {}
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        name, pinned = dep.split("==")
        pins[name] = pinned
    assert set(pins) == {"tokenizers", "pyarrow", "orjson", "tqdm"}
    assert m["packages"] == pins
    assert m["packages"] == {p: version(p) for p in pins}

    expected = [
        dict(repo=p[1], revision=p[2], path=p[3])
        for p in read_pin_lines(mini.rev)
        if p and p[0] == "dataset"
    ] + [dict(repo=p[2], revision=p[3], path=p[4]) for p in read_pin_lines(mini.books) if p]
    assert all(set(i) == INPUT_KEYS for i in m["inputs"])
    key = lambda i: (i["repo"], i["path"])
    assert sorted(
        [{k: i[k] for k in ("repo", "revision", "path")} for i in m["inputs"]], key=key
    ) == sorted(expected, key=key)
    for i in m["inputs"]:
        data = (mini.src / i["repo"] / i["path"]).read_bytes()
        assert i["bytes"] == len(data), i
        assert i["sha256"] == sha256(data), i


def test_manifest_splits_match_the_parquet_files(release):
    m = release.manifest
    assert list(m["splits"]) == list(SPLITS)
    for split in SPLITS:
        info, table = m["splits"][split], release.tables[split]
        rows = [r for r in m["rows"] if r["split"] == split]
        assert info["rows"] == table.num_rows == len(rows) > 0
        assert info["file_sha256"] == sha256(release.files[f"{split}.parquet"])
        tokens = [r["prompt_tokens"] for r in rows]
        assert info["prompt_tokens"] == [min(tokens), max(tokens)]
        assert set(info) == {"rows", "file_sha256", "content_sha256", "prompt_tokens"}


def test_manifest_rows_describe_each_parquet_row(release):
    m = release.manifest
    assert all(set(r) == ROW_KEYS for r in m["rows"])
    assert [r["split"] for r in m["rows"]] == sorted(
        (r["split"] for r in m["rows"]), key=SPLITS.index
    )
    for split in SPLITS:
        rows = [r for r in m["rows"] if r["split"] == split]
        parquet = release.tables[split].to_pylist()
        assert [r["index"] for r in rows] == list(range(len(parquet)))
        assert [r["source"] for r in rows] == [p["source"] for p in parquet]
        for r, p in zip(rows, parquet):
            assert r["name"] in SOURCE_NAMES
            assert isinstance(r["slot"], str) and r["slot"].split()[0] in ("standard", "full")
            assert r["group"] is None or isinstance(r["group"], str)
            contents = [msg["content"] for msg in json.loads(p["messages"])]
            assert r["prompt_tokens"] == sum(nfc_bytes(c) for c in contents if isinstance(c, str))
        names = [r["name"] for r in rows]
        assert names == sorted(names, key=SOURCE_NAMES.index), f"{split}: not in card order"


def test_no_absolute_path_and_no_timestamp_in_any_out_file(release, mini):
    now = datetime.now(UTC)
    ours = {str(release.out.parent), str(mini.root), str(REPO)}
    for name, data in release.files.items():
        # Text files name no absolute path at all; in a parquet file a row may quote one.
        paths = ours if name.endswith(".parquet") else {*ours, str(Path.home()), "/tmp/"}
        for path in paths:
            assert path.encode() not in data, f"{name} holds the path {path}"
    for name in PARQUETS:
        meta = pq.read_metadata(release.out / name)
        assert set(meta.metadata) == {b"ARROW:schema"}, name
        assert meta.created_by == f"parquet-cpp-arrow version {version('pyarrow')}"
    dates = re.compile(
        rf"\b{now.year}\b|\b{now.year - 1}\b|\d{{4}}-\d\d-\d\d|\d\d:\d\d:\d\d|"
        rf"\b{now:%Y%m%d}\b|{now:%b} +{now.day}\b"
    )
    for name in ("manifest.json", "README.md", "SHA256SUMS"):
        text = re.sub(r"[0-9a-f]{40,64}", "", release.files[name].decode("utf-8"))
        assert not dates.search(text), f"{name}: {dates.search(text)[0]!r} looks like a date"

    def walk(value):
        if isinstance(value, dict):
            for v in value.values():
                yield from walk(v)
        elif isinstance(value, list):
            for v in value:
                yield from walk(v)
        else:
            yield value

    assert not [v for v in walk(release.manifest) if isinstance(v, str) and v.startswith("/")]


# ------------------------------------------------------------------------------------------------
# 2-3. SHA256SUMS and the content sha256


def test_sha256sum_verifies_the_five_files(release):
    files, content, packages, rows = sums_lines(release.sums)
    assert list(files) == list(OUT_FILES[:-1])
    for args in (["-c"], ["-c", "--strict"]):
        result = subprocess.run(
            ["sha256sum", *args, "SHA256SUMS"], cwd=release.out, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.splitlines() == [f"{f}: OK" for f in OUT_FILES[:-1]]
    assert packages == " ".join(f"{p}=={v}" for p, v in release.manifest["packages"].items())
    assert list(content) == list(PARQUETS)
    assert len(rows) == len(release.manifest["rows"])


def test_content_and_row_sha256_recomputed_with_the_json_module(release):
    _, content, _, sum_rows = sums_lines(release.sums)
    m = release.manifest
    for split in SPLITS:
        lines = [canonical(row) for row in release.tables[split].to_pylist()]
        digest = sha256(b"".join(lines))
        assert digest == m["splits"][split]["content_sha256"], split
        assert digest == content[f"{split}.parquet"], split
        rows = [r for r in m["rows"] if r["split"] == split]
        assert [r["row_sha256"] for r in rows] == [sha256(line) for line in lines], split
        assert [(s, i, h, src) for s, i, h, src in sum_rows if s == split] == [
            (split, r["index"], r["row_sha256"], r["source"]) for r in rows
        ]
    # The definition is exercised here: rows carry unescaped non-ASCII text and escaped newlines.
    raw = b"".join(canonical(r) for t in release.tables.values() for r in t.to_pylist())
    assert "中".encode() in raw or re.search(rb"[\xe4-\xe9][\x80-\xbf]{2}", raw)
    assert b"\\n" in raw


def test_the_builders_canonical_line_is_the_json_modules_for_any_text():
    import build

    text = "".join(map(chr, range(0x20))) + '\x7f"\\/ é中\u2028\u2029\ufeff\U0001f600'
    for record in (
        {"messages": text, "tools": None, "source": "a@b#1"},
        {"messages": "[]", "tools": text, "source": text},
    ):
        assert build.canonical_line(dict(reversed(record.items()))) == canonical(record)


def test_the_content_sha256_does_not_depend_on_the_parquet_writer(release, tmp_path):
    for split in SPLITS:
        other = tmp_path / f"{split}.parquet"
        pq.write_table(release.tables[split], other, compression="snappy", use_dictionary=True)
        assert sha256(other.read_bytes()) != release.manifest["splits"][split]["file_sha256"]
        lines = [canonical(row) for row in pq.read_table(other).to_pylist()]
        assert sha256(b"".join(lines)) == release.manifest["splits"][split]["content_sha256"]


# ------------------------------------------------------------------------------------------------
# 4. --check SUMS


def test_check_against_the_builds_own_sums_passes_from_another_directory(release, mini, tmp_path):
    out = tmp_path / "elsewhere" / "out"
    out.parent.mkdir()
    result = run_build(mini, out, "--check", str(release.out / "SHA256SUMS"))
    assert result.returncode == 0, result.stderr
    assert "every file matches" in result.stderr
    assert snapshot(out) == release.files


def test_check_names_the_first_differing_row_of_each_split(altered, release):
    result = altered.result
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr
    rows = json.loads((altered.out / "manifest.json").read_bytes())["rows"]
    ours = {(r["split"], r["index"]): r for r in release.manifest["rows"]}
    changed = [r for r in rows if r["row_sha256"] != ours[r["split"], r["index"]]["row_sha256"]]
    assert {(r["split"], r["source"]) for r in changed} == {
        ("smoke", altered.source),
        ("standard", altered.source),
    }
    problems = [line for line in result.stderr.splitlines() if line.startswith("check: ")]
    assert len(problems) == 2, result.stderr
    for r, line in zip(changed, problems):
        assert line.startswith(f"check: {r['split']}.parquet: content differs"), line
        assert f"{r['split']} index {r['index']} source {altered.source}" in line, line
    assert "toolchain" not in result.stderr


def test_check_reports_a_toolchain_difference_with_both_package_sets(release, mini, tmp_path):
    # A publisher whose pyarrow differed: the same rows (content sha256) in other file bytes.
    published = tmp_path / "published"
    published.mkdir()
    pq.write_table(release.tables["smoke"], published / "smoke.parquet", compression="snappy")
    theirs = sha256((published / "smoke.parquet").read_bytes())
    ours = release.manifest["splits"]["smoke"]["file_sha256"]
    sums = release.sums.replace(f"{ours}  smoke.parquet", f"{theirs}  smoke.parquet")
    sums = sums.replace("pyarrow==26.0.1", "pyarrow==25.0.0")
    assert sums.count(theirs) == 1 and "pyarrow==25.0.0" in sums
    (published / "SHA256SUMS").write_text(sums)

    result = run_build(mini, tmp_path / "out", "--check", str(published / "SHA256SUMS"))
    assert result.returncode != 0, result.stderr
    problems = [line for line in result.stderr.splitlines() if line.startswith("check: ")]
    assert len(problems) == 1, result.stderr
    (line,) = problems
    assert line.startswith("check: smoke.parquet:") and "toolchain difference" in line, line
    ours_packages = " ".join(f"{p}=={v}" for p, v in release.manifest["packages"].items())
    assert ours_packages in line and "pyarrow==25.0.0" in line, line
    assert "first differing row" not in result.stderr


def test_check_against_outs_own_sums_reads_them_before_replacing_out(
    altered, release, mini, tmp_path
):
    """`build ... OUT --check OUT/SHA256SUMS` compares with the previous build, not with itself."""
    out = tmp_path / "out"
    shutil.copytree(altered.out, out)
    result = run_build(mini, out, "--check", str(out / "SHA256SUMS"))
    assert result.returncode != 0, result.stderr
    assert "smoke index " in result.stderr and altered.source in result.stderr
    assert snapshot(out) == release.files


def test_check_counts_a_file_missing_from_the_sums_as_a_difference(release, tmp_path):
    import build

    for missing in ("standard.parquet", "README.md"):
        sums = tmp_path / f"without-{missing}"
        sums.write_text(
            "".join(
                line
                for line in release.sums.splitlines(True)
                if not line.endswith(f"  {missing}\n")
            )
        )
        problems = build.check_sums(build.read_sums(sums), release.out, release.manifest)
        assert problems == [f"{missing}: not listed in the published sums"], problems
    sums = tmp_path / "all"
    sums.write_text(release.sums)
    assert build.check_sums(build.read_sums(sums), release.out, release.manifest) == []


# ------------------------------------------------------------------------------------------------
# 5. OUT is replaced as a whole, or not at all


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_building_leaves_the_previous_out(sig, altered, mini, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(altered.out, out)
    before = snapshot(out)
    log = tmp_path / "stderr"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            build_cmd(mini, out, quiet=False), cwd=REPO, stdout=subprocess.DEVNULL, stderr=err,
            preexec_fn=default_sigint,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while b"longbench-pro" not in log.read_bytes():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "no progress on stderr"
            time.sleep(0.01)
        assert proc.poll() is None, "the build ended before it could be interrupted"
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
    stderr = log.read_text()
    assert code == 130, stderr
    assert f"interrupted; OUT {out} is unchanged" in stderr
    assert "Traceback" not in stderr
    assert snapshot(out) == before
    assert leftovers(out) == []


SELF_SIGNAL = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
import build
sig, phase = getattr(signal, sys.argv[2]), sys.argv[3]
if phase == "staging":  # after the first file is written into the temporary directory
    write = build.write_parquet
    def write_parquet(records, path):
        write(records, path)
        os.kill(os.getpid(), sig)
    build.write_parquet = write_parquet
else:  # as publish starts moving directories
    move = build.renameat2
    def first_move(a, b, flags):
        build.renameat2 = move
        os.kill(os.getpid(), sig)
        return move(a, b, flags)
    build.renameat2 = first_move
sys.exit(build.main(sys.argv[4:]))
"""


@pytest.mark.parametrize(
    "sig, phase, state",
    [
        (signal.SIGINT, "staging", "is unchanged"),
        (signal.SIGTERM, "publish", "holds the new build"),
    ],
    ids=["SIGINT-staging", "SIGTERM-publish"],
)
def test_a_signal_while_writing_or_moving_leaves_one_whole_build(
    sig, phase, state, altered, release, mini, tmp_path
):
    out = tmp_path / "out"
    shutil.copytree(altered.out, out)
    before = snapshot(out)
    script = tmp_path / "self_signal.py"
    script.write_text(SELF_SIGNAL)
    cmd = [sys.executable, str(script), str(REPO), sig.name, phase, *build_cmd(mini, out)[2:]]
    result = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=300, preexec_fn=default_sigint
    )
    assert result.returncode == 130, result.stderr
    assert f"interrupted; OUT {out} {state}" in result.stderr
    assert "Traceback" not in result.stderr
    assert snapshot(out) == (before if phase == "staging" else release.files)
    assert leftovers(out) == []


def test_a_rebuild_replaces_every_file_together(altered, release, mini, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(altered.out, out)
    old = snapshot(out)
    assert old != release.files and set(old) == set(release.files)
    inode = out.stat().st_ino
    seen, stop = set(), threading.Event()

    def look():
        """What OUT holds, read through one directory descriptor: "old", "new", "mixed",
        "absent", or None when OUT was replaced while being read (that look saw no OUT)."""
        try:
            fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            return "absent"
        try:
            opener = lambda name, flags: os.open(name, flags, dir_fd=fd)
            try:
                files = {}
                # build.py's marker is in OUT for an instant on each side of the exchange
                # (docs/building.md "What a build writes"); it is not a file of either build.
                for name in sorted(n for n in os.listdir(fd) if n != build.MARKER):
                    with open(name, "rb", opener=opener) as f:
                        files[name] = f.read()
            except FileNotFoundError:
                files = None
            try:
                if os.stat(out).st_ino != os.fstat(fd).st_ino:
                    return None
            except FileNotFoundError:
                return None
        finally:
            os.close(fd)
        return "old" if files == old else "new" if files == release.files else "mixed"

    def watch():
        while not stop.is_set():
            seen.add(look())
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = run_build(mini, out)
    finally:
        stop.set()
        watcher.join()
    assert result.returncode == 0, result.stderr
    assert snapshot(out) == release.files
    assert "mixed" not in seen, f"OUT was seen holding files of two builds: {seen}"
    assert out.stat().st_ino != inode, "OUT was rewritten in place, not replaced as a whole"
    assert "old" in seen and "new" in seen
    assert leftovers(out) == []


# ------------------------------------------------------------------------------------------------
# 6. The generated card


def test_card_header_parses_and_declares_what_the_hub_shows(release):
    card = release.files["README.md"].decode("utf-8")
    header = yaml_header(card)
    assert header["configs"] == [
        {
            "config_name": "default",
            "data_files": [{"split": s, "path": f"{s}.parquet"} for s in SPLITS],
        }
    ]
    for config in header["configs"][0]["data_files"]:
        assert (release.out / config["path"]).is_file()
    assert header["license"] == "other" and header["license_name"]
    assert header["pretty_name"] == "kern prompts"
    assert header["task_categories"] == ["text-generation"]
    assert {"long-context", "evaluation", "numerics", "tool-use"} <= set(header["tags"])
    assert header["language"] == ["en", "zh", "ru", "ja"]
    total = sum(info["rows"] for info in release.manifest["splits"].values())
    assert total < 1000 and header["size_categories"] == ["n<1K"]
    # The repository's README is the card as published: the same header.
    assert yaml_header((REPO / "README.md").read_text(encoding="utf-8")) == header


def test_card_tables_are_the_manifests(release):
    card = release.files["README.md"].decode("utf-8")
    m = release.manifest
    head, rows = md_table(card, "Splits")
    assert head == ["split", "rows", "prompt tokens", "suggested decode cap", "use"]
    assert [r[0] for r in rows] == list(SPLITS)
    for r, split in zip(rows, build.SPLITS):
        info = m["splits"][r[0]]
        assert int(r[1]) == info["rows"], r
        assert token_range(r[2]) == info["prompt_tokens"], r
        assert (int(r[3]), r[4]) == (split.decode_cap, split.use)

    head, rows = md_table(card, "Composition")
    assert head == ["source", "smoke", "standard", "full", "prompt tokens", "what it covers"]
    *rows, total = rows
    names = [n for n in SOURCE_NAMES if any(r["name"] == n for r in m["rows"])]
    assert [r[0] for r in rows] == [build.SOURCES[n].title for n in names]
    for name, r in zip(names, rows):
        mine = [x for x in m["rows"] if x["name"] == name]
        counts = [sum(x["split"] == s for x in mine) for s in SPLITS]
        assert [0 if c == "–" else int(c) for c in r[1:4]] == counts, r
        tokens = [x["prompt_tokens"] for x in mine]
        assert token_range(r[4]) == [min(tokens), max(tokens)], r
        assert r[5] == build.SOURCES[name].covers
    for i, split in enumerate(SPLITS, 1):
        assert sum(0 if r[i] == "–" else int(r[i]) for r in rows) == m["splits"][split]["rows"]
        assert total[i] == f"**{m['splits'][split]['rows']}**"

    head, rows = md_table(card, "Licenses")
    assert head == ["source", "license"]
    licensed = {short: lic for names, lic in rows for short in names.split(", ")}
    assert licensed == {build.SOURCES[n].short: build.SOURCES[n].license for n in names}


def test_card_provenance_names_the_builder_the_tokenizer_and_every_input(release):
    card = release.files["README.md"].decode("utf-8")
    m = release.manifest
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert m["builder_version"] == version
    assert m["build_py_sha256"] == sha256((REPO / "build.py").read_bytes())
    provenance = card.split("\n## Provenance\n", 1)[1]
    for needle in (version, m["build_py_sha256"], m["tokenizer_sha256"]):
        assert needle in provenance
    for package, v in m["packages"].items():
        assert f"{package} {v}" in provenance
    _, rows = md_table(card, "Provenance")
    assert [r[0] for r in rows] == [
        f"`{i['repo']}@{i['revision']}/{i['path']}`" for i in m["inputs"]
    ]
    assert [(int(r[1].replace(",", "")), r[2].strip("`")) for r in rows] == [
        (i["bytes"], i["sha256"]) for i in m["inputs"]
    ]
    for section in ("Schema", "Usage", "How rows are chosen", "Licenses"):
        assert f"\n## {section}\n" in card
    for note in ("WildChat", "Claude 3.7 Sonnet", "do not train on this set"):
        assert note in card.split("\n## Licenses\n", 1)[1]


CHAT_TEMPLATE = (
    "{% if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif %}"
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content if m.content is not none else '' }}"
    "{% if m.tool_calls %}<calls>{{ m.tool_calls | tojson }}</calls>{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

RUN_USAGE = """
import json, sys
snippet, out, model = sys.argv[1], sys.argv[2], sys.argv[3]
code = snippet.replace('"Pegainfer/kern-prompts"', repr(out)).replace('"Qwen/Qwen3.8-27B"', repr(model))
scope = {}
exec(compile(code, "usage", "exec"), scope)
print(json.dumps({"text": scope["text"], "messages": scope["messages"], "tools": scope["tools"],
                  "rows": len(scope["rows"])}))
"""


def test_card_usage_snippet_runs_against_the_build(release, mini, tmp_path):
    """The card's Python, as printed, with the Hub ids replaced by the local build and a local
    tokenizer directory (the miniature tokenizer with a chat template)."""
    pytest.importorskip("transformers", reason="transformers (test extra) is missing")
    card = release.files["README.md"].decode("utf-8")
    usage = card.split("\n## Usage\n", 1)[1]
    snippet = usage.split("```python\n", 1)[1].split("```", 1)[0]
    assert snippet == build.CARD_USAGE
    assert f"```python\n{snippet}```" in (REPO / "README.md").read_text(), "the README shows it too"
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(mini.tokenizer, model / "tokenizer.json")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE}
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               HF_HOME=str(tmp_path / "hf"), TRANSFORMERS_OFFLINE="1")  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c", RUN_USAGE, snippet, str(release.out), str(model)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout.splitlines()[-1])
    smoke = release.tables["smoke"].to_pylist()
    assert got["rows"] == len(smoke)
    last = smoke[-1]
    assert got["messages"] == json.loads(last["messages"])
    assert got["tools"] == (json.loads(last["tools"]) if last["tools"] else None)
    # The snippet ran over every smoke row, the Nemotron row with its tools among them.
    assert any(r["tools"] for r in smoke)
    assert got["text"].endswith(got["messages"][-1]["content"] + "<|assistant|>")


# ------------------------------------------------------------------------------------------------
# 7. Readers: Hugging Face datasets and DuckDB

LOAD_WITH_DATASETS = """
import json, sys
import datasets
out, cache = sys.argv[1], sys.argv[2]
by_files = datasets.load_dataset(
    "parquet", data_files={s: f"{out}/{s}.parquet" for s in ("smoke", "standard", "full")},
    cache_dir=cache,
)
by_card = datasets.load_dataset(out, cache_dir=cache)  # the card's configs name the files
report = {}
for how, ds in (("files", by_files), ("card", by_card)):
    report[how] = {
        split: {
            "rows": d.num_rows,
            "features": {k: v.dtype for k, v in d.features.items()},
            "sources": list(d["source"]),
            "null_tools": sum(t is None for t in list(d["tools"])),
        }
        for split, d in ds.items()
    }
print(json.dumps(report))
"""


def test_the_splits_load_with_hugging_face_datasets(release, tmp_path):
    if find_spec("datasets") is None:
        pytest.skip("the datasets package is not installed (pip install -e '.[test]')")
    env = dict(
        os.environ,
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf"),
        HF_DATASETS_CACHE=str(tmp_path / "cache"),
    )
    result = subprocess.run(
        [sys.executable, "-c", LOAD_WITH_DATASETS, str(release.out), str(tmp_path / "cache")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    for how in ("files", "card"):
        assert list(report[how]) == list(SPLITS), how
        for split in SPLITS:
            got, table = report[how][split], release.tables[split]
            assert got["rows"] == release.manifest["splits"][split]["rows"]
            assert got["features"] == {"messages": "string", "tools": "string", "source": "string"}
            assert got["sources"] == table.column("source").to_pylist()
            assert got["null_tools"] == table.column("tools").null_count


def test_the_splits_load_with_duckdb(release):
    duckdb = pytest.importorskip("duckdb", reason="the duckdb package is not installed")
    for split in SPLITS:
        path = str(release.out / f"{split}.parquet")
        table = release.tables[split]
        (count,) = duckdb.sql(f"select count(*) from '{path}'").fetchall()[0]
        assert count == release.manifest["splits"][split]["rows"]
        described = duckdb.sql(f"describe select * from '{path}'").fetchall()
        assert [(d[0], d[1]) for d in described] == [
            ("messages", "VARCHAR"),
            ("tools", "VARCHAR"),
            ("source", "VARCHAR"),
        ]
        (nulls,) = duckdb.sql(f"select count(*) - count(tools) from '{path}'").fetchall()[0]
        assert nulls == table.column("tools").null_count
        sources = [r[0] for r in duckdb.sql(f"select source from '{path}'").fetchall()]
        assert sources == table.column("source").to_pylist()


# ------------------------------------------------------------------------------------------------
# 8. The parquet writer's pinned options


def test_parquet_files_use_the_pinned_writer_options(release, tmp_path):
    schema = pa.schema([("messages", pa.string()), ("tools", pa.string()), ("source", pa.string())])
    tools_seen = {"null": 0, "json": 0}
    for split in SPLITS:
        path = release.out / f"{split}.parquet"
        meta = pq.read_metadata(path)
        assert meta.num_row_groups == 1
        assert meta.format_version == "2.6"
        arrow = pq.read_schema(path)
        assert arrow.equals(schema) and arrow.metadata is None
        assert b"pandas" not in (meta.metadata or {})
        assert all(f.nullable for f in arrow)
        for i in range(meta.num_columns):
            col = meta.row_group(0).column(i)
            assert col.compression == "ZSTD"
            assert col.is_stats_set
            assert not {"PLAIN_DICTIONARY", "RLE_DICTIONARY"} & set(col.encodings)
            assert not col.has_offset_index and not col.has_column_index
            assert meta.schema.column(i).logical_type.type == "STRING"
        table = release.tables[split]
        assert all(table.column(c).num_chunks == 1 for c in schema.names)
        tools_seen["null"] += table.column("tools").null_count
        tools_seen["json"] += table.num_rows - table.column("tools").null_count
        # The writer options of docs/building.md, applied to the same rows, give the same bytes.
        again = tmp_path / path.name
        pq.write_table(
            table, again, row_group_size=table.num_rows, compression="zstd",
            compression_level=9, use_dictionary=False, write_statistics=True,
            write_page_index=False, data_page_version="2.0", version="2.6",
        )  # fmt: skip
        assert sha256(again.read_bytes()) == sha256(release.files[path.name]), split
    assert tools_seen["null"] > 0 and tools_seen["json"] > 0


def test_check_with_the_same_packages_does_not_call_it_a_toolchain_difference(release, tmp_path):
    theirs = "f" * 64
    ours = release.manifest["splits"]["smoke"]["file_sha256"]
    sums = tmp_path / "SUMS"
    sums.write_text(release.sums.replace(f"{ours}  smoke.parquet", f"{theirs}  smoke.parquet"))
    (problem,) = build.check_sums(build.read_sums(sums), release.out, release.manifest)
    assert problem.startswith("smoke.parquet: same rows, different file bytes"), problem
    assert "toolchain" not in problem and "same package versions" in problem, problem


@pytest.mark.parametrize("form", ["binary", "dot-slash", "upper-case"])
def test_check_reads_every_line_form_sha256sum_accepts(release, tmp_path, form):
    change = {
        "binary": lambda h, name: f"{h} *{name}",
        "dot-slash": lambda h, name: f"{h}  ./{name}",
        "upper-case": lambda h, name: f"{h.upper()}  {name}",
    }[form]
    lines = []
    for line in release.sums.splitlines():
        if m := re.fullmatch(r"([0-9a-f]{64})  (\S+)", line):
            line = change(m[1], m[2])
        lines.append(line)
    sums = tmp_path / "SUMS"
    sums.write_text("\n".join(lines) + "\n")
    assert (
        subprocess.run(["sha256sum", "-c", "--quiet", str(sums)], cwd=release.out).returncode == 0
    )
    assert build.check_sums(build.read_sums(sums), release.out, release.manifest) == []


def test_check_reports_a_listed_file_a_build_does_not_write(release, tmp_path):
    sums = tmp_path / "SUMS"
    sums.write_text(release.sums + f"{'0' * 64}  notes.txt\n")
    problems = build.check_sums(build.read_sums(sums), release.out, release.manifest)
    assert problems == ["notes.txt: listed in the published sums, but a build does not write it"]
