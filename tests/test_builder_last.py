"""The names build.py derives from OUT's are cut between characters, never inside one; `--check
SUMS` reads both of sha256sum's formats, refuses a line of neither, and never passes on one of two
different sums of a file (README "When something is wrong")."""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_errors import C_LOCALE, REPO, Case, previous  # noqa: F401 (a fixture)
from test_out import KILL_AFTER_EXCHANGE, run_patched

import build

NAME_MAX = build.NAME_MAX
SUMMED = build.OUT_FILES[:-1]  # the five files SHA256SUMS lists
HAS_SHA256SUM = shutil.which("sha256sum") is not None


@pytest.fixture
def case(mini, previous, tmp_path):  # noqa: F811
    return Case(mini, previous, tmp_path)


@pytest.fixture
def prior(previous):  # noqa: F811
    """The OUT of an earlier build (gsm8k only), not to be changed."""
    return previous[0]


# ------------------------------------------------------------------------------------------------
# OUT's name, and the names beside it (.OUT.lock, .OUT.tmp-*, .OUT.old-*)

SCRIPTS = {"2-byte": "é", "3-byte": "中", "4-byte": "😀", "mixed": "é中😀"}


def names_near_the_limit(chars):
    """Names of `chars` (cycled) of NAME_MAX - 40 to NAME_MAX bytes, after 0 to 3 ASCII letters,
    so that the cut of a long name falls at every position inside a character."""
    for lead in range(4):
        for count in range(1, NAME_MAX + 1):
            name = "a" * lead + "".join(itertools.islice(itertools.cycle(chars), count))
            size = len(name.encode())
            if size > NAME_MAX:
                break
            if size >= NAME_MAX - 40:
                yield name


def check_stem(name, stem):
    """What stem(name) must be, for a name held as os.fsdecode holds it."""
    raw = os.fsencode(name)
    stem_raw = os.fsencode(stem)
    stem_raw.decode("utf-8")  # UTF-8 as the name is: pyarrow and the messages take it
    for beside in (".lock", ".tmp-abcd1234", ".old-abcd1234"):
        assert len(b"." + stem_raw + beside.encode()) <= NAME_MAX, (name, beside)
    if len(raw) + build.BESIDE <= NAME_MAX:
        assert stem == name
        return
    head, digest = stem_raw[:-17], stem_raw[-17:].decode()
    assert digest == "-" + hashlib.sha256(raw).hexdigest()[:16]
    assert raw.startswith(head), "the start of the name, whole characters only"
    assert len(head) > NAME_MAX - build.BESIDE - 17 - 4, "at most one character is left out"


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_names_beside_out_are_cut_between_characters(script):
    names = list(names_near_the_limit(SCRIPTS[script]))
    assert len(names) > 40
    stems = set()
    for name in names:
        stem = build.stem(name)
        check_stem(name, stem)
        stems.add(stem)
    assert len(stems) == len(names), "two names never share the names beside them"


STEMS_IN_LOCALE = """
import os, sys
sys.path.insert(0, sys.argv[1])
import build
assert sys.getfilesystemencoding() == "ascii", sys.getfilesystemencoding()
for raw in sys.stdin.buffer.read().split(b"\\0"):
    stem = build.stem(os.fsdecode(raw))  # as OUT's name is held under this locale
    sys.stdout.buffer.write(os.fsencode(stem) + b"\\0")
"""


def test_the_names_beside_out_are_cut_between_characters_in_the_c_locale():
    """Under LC_ALL=C with UTF-8 mode off, a name is held one byte per character: the cut is
    still made between the UTF-8 characters of its bytes."""
    names = [n for chars in SCRIPTS.values() for n in names_near_the_limit(chars)]
    result = subprocess.run(
        [sys.executable, "-c", STEMS_IN_LOCALE, str(REPO)],
        input=b"\0".join(n.encode() for n in names), capture_output=True,
        env=os.environ | C_LOCALE, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    stems = result.stdout.split(b"\0")[:-1]
    assert len(stems) == len(names)
    for name, stem in zip(names, stems):
        check_stem(name, os.fsdecode(stem))


# Names whose cut would fall inside a character: 82 CJK characters (246 bytes, the name that was
# reported), and 2- and 4-byte letters shifted by ASCII; and 255 bytes, the longest name there is.
LONG_NAMES = {
    "3-byte-246": "中" * 82,
    "2-byte-247": "a" + "é" * 123,
    "4-byte-246": "ab" + "😀" * 61,
    "3-byte-255": "中" * 85,
}


BUILT = [(which, "default") for which in LONG_NAMES] + [("3-byte-246", "C"), ("4-byte-246", "C")]


@pytest.mark.parametrize("which, locale", BUILT, ids=[f"{w}-{loc}" for w, loc in BUILT])
def test_a_multibyte_out_name_near_the_limit_builds(case, which, locale):
    """The build writes its staging directory through pyarrow, which takes UTF-8 paths only: a
    name cut inside a character was a UnicodeDecodeError traceback."""
    out = case.parent / LONG_NAMES[which]
    env = os.environ | (C_LOCALE if locale == "C" else {})
    cmd = case.command("--only", "gsm8k", "--quiet", out=out)
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, env=env, timeout=120)
    stderr = result.stderr.decode(errors="replace")
    assert result.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert sorted(os.listdir(out)) == sorted(build.OUT_FILES)
    assert sorted(os.listdir(case.parent)) == sorted(["out", out.name]), "no lock, no staging"


@pytest.mark.parametrize("which", ["3-byte-246", "4-byte-246"])
def test_a_killed_build_into_a_multibyte_out_is_recovered(case, which):
    """The next build finds what a killed one left beside OUT, under the same cut name."""
    out = case.parent / LONG_NAMES[which]
    assert case.run("--only", "gsm8k", "--quiet", out=out).returncode == 0
    killed = run_patched(case, KILL_AFTER_EXCHANGE, "--only", "gsm8k", "--quiet", out=out)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    stem = "." + build.stem(out.name)
    beside = sorted(p for p in os.listdir(case.parent) if p not in ("out", out.name))
    assert len(beside) == 2 and beside[0] == f"{stem}.lock", beside
    left = beside[1]
    assert left.startswith(f"{stem}.tmp-"), beside
    for name in beside:
        name.encode("utf-8")  # os.listdir decoded it whole: no byte of a cut character
    result = case.run("--only", "gsm8k", "--quiet", out=out)
    assert result.returncode == 0, result.stderr
    assert f"note: removed {case.parent / left}, left by an interrupted build" in result.stderr
    assert sorted(os.listdir(case.parent)) == sorted(["out", out.name])


@pytest.mark.parametrize(
    "name",
    ["é" * 128, "中" * 86, "😀" * 64, "a" * 256],
    ids=["2-byte", "3-byte", "4-byte", "ascii"],
)
def test_an_out_name_past_the_limit_is_one_line(case, name):
    size = len(name.encode())
    result = case.run("--only", "gsm8k", out=case.parent / name)
    case.failed(result, f"its name is {size} bytes", f"the {NAME_MAX}", "choose a shorter name")


# ------------------------------------------------------------------------------------------------
# --check SUMS: the formats read


def sha256_of(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


FORMS = {
    "text": lambda h, n: f"{h}  {n}",
    "binary": lambda h, n: f"{h} *{n}",
    "dot-slash": lambda h, n: f"{h}  ./{n}",
    "tag": lambda h, n: f"SHA256 ({n}) = {h}",
    "tag-dot-slash": lambda h, n: f"SHA256 (./{n}) = {h}",
    "tag-upper-case": lambda h, n: f"SHA256 ({n}) = {h.upper()}",
}


def sums_in(out, forms, names=SUMMED, comments=True):
    """SUMS for the build in `out`, its files' lines in `forms` (cycled), with the comment lines
    of its own SHA256SUMS after them."""
    lines = [FORMS[f](sha256_of(out / n), n) for n, f in zip(names, itertools.cycle(forms))]
    if comments:
        lines += [ln for ln in (out / "SHA256SUMS").read_text().splitlines() if ln.startswith("#")]
    return "\n".join(lines) + "\n"


def checked(out, sums_file):
    manifest = build.orjson.loads((out / "manifest.json").read_bytes())
    return build.check_sums(build.read_sums(sums_file), out, manifest)


MIXES = [["text"], ["binary"], ["tag"], ["tag", "text"], ["text", "tag-dot-slash", "binary"],
         ["tag-upper-case", "dot-slash"], ["tag", "tag-dot-slash", "tag-upper-case"]]  # fmt: skip


@pytest.mark.parametrize("forms", MIXES, ids=["+".join(m) for m in MIXES])
def test_check_reads_both_formats_and_a_mix(prior, tmp_path, forms):
    sums = tmp_path / "SUMS"
    sums.write_text(sums_in(prior, forms))
    assert checked(prior, sums) == []
    if HAS_SHA256SUM:  # the lines are sha256sum's own: it checks them too
        check = subprocess.run(["sha256sum", "-c", "--strict", "--quiet", str(sums)], cwd=prior)
        assert check.returncode == 0


@pytest.mark.skipif(not HAS_SHA256SUM, reason="no sha256sum here")
@pytest.mark.parametrize("tag", [False, True], ids=["sha256sum", "sha256sum --tag"])
def test_check_reads_what_sha256sum_writes_names_escaped_included(prior, tmp_path, tag):
    """Written by the tool itself, for a build and for names it escapes (a backslash, a line
    break), which a build never writes and are reported as such."""
    out = tmp_path / "out"
    shutil.copytree(prior, out)
    odd = ["back\\slash", "line\nbreak"]
    for name in odd:
        (out / name).write_text(name)
    cmd = ["sha256sum", *(["--tag"] if tag else []), *SUMMED, *odd]
    written = subprocess.run(cmd, cwd=out, capture_output=True, check=True).stdout
    assert written.count(b"\n\\") == 2, "the tool escaped the two names"
    sums = tmp_path / "SUMS"
    sums.write_bytes(written)
    assert sorted(build.read_sums(sums)["files"]) == sorted([*SUMMED, *odd])
    problems = checked(out, sums)
    assert problems == [f"{n}: listed in the published sums, but a build does not write it"
                        for n in odd]  # fmt: skip


def test_check_with_sha256sum_tag_lines_passes_a_build(case):
    sums = case.root / "SUMS"
    sums.write_text(sums_in(case.out, ["tag"]))
    result = case.run("--only", "gsm8k", "--quiet", "--check", str(sums))
    assert result.returncode == 0, result.stderr
    assert f"check: every file matches {sums}" in result.stderr


HEX = "0123456789abcdef" * 4
MALFORMED = {
    "tag-short-hash": f"SHA256 (smoke.parquet) = {HEX[:63]}",
    "tag-long-hash": f"SHA256 (smoke.parquet) = {HEX}0",
    "tag-sha1": f"SHA1 (smoke.parquet) = {HEX[:40]}",
    "tag-md5": f"MD5 (smoke.parquet) = {HEX[:32]}",
    "tag-sha512": f"SHA512 (smoke.parquet) = {HEX * 2}",
    "tag-no-equals": f"SHA256 (smoke.parquet) {HEX}",
    "tag-no-parentheses": f"SHA256 smoke.parquet = {HEX}",
    "tag-no-name": f"SHA256 () = {HEX}",
    "text-short-hash": f"{HEX[:63]}  smoke.parquet",
    "text-sha1": f"{HEX[:40]}  smoke.parquet",
    "text-no-separator": f"{HEX}smoke.parquet",
    "text-tab": f"{HEX}\tsmoke.parquet",
    "text-no-name": f"{HEX}  ",
    "text-not-hex": f"{'g' * 64}  smoke.parquet",
    "prose": "checksums of the release, made with sha256sum",
}


@pytest.mark.parametrize("around", ["text", "tag"])
@pytest.mark.parametrize("bad", MALFORMED)
def test_check_refuses_a_line_of_neither_format(prior, tmp_path, bad, around):
    """A line misread as nothing would leave its file unchecked: it is refused, by its number,
    with the formats that are read; good lines around it do not hide it."""
    good = sums_in(prior, [around], comments=False).splitlines()
    sums = tmp_path / "SUMS"
    sums.write_text("\n".join([*good[:2], MALFORMED[bad], *good[2:]]) + "\n")
    with pytest.raises(build.BuildError) as e:
        build.read_sums(sums)
    message = str(e.value)
    assert message.startswith(f"{sums}:3: not a sha256 line"), message
    assert "'HASH  NAME'" in message and "'SHA256 (NAME) = HASH'" in message, message


@pytest.mark.parametrize("content", ["", "\n\n", "# content only comments\n", "# packages x\n"])
def test_check_sums_without_a_sum_names_the_formats_it_reads(tmp_path, content):
    sums = tmp_path / "SUMS"
    sums.write_text(content)
    with pytest.raises(build.BuildError, match=r"no sha256 lines; --check reads .*--tag"):
        build.read_sums(sums)


def test_a_malformed_sums_line_is_one_error_line(case):
    sums = case.root / "SUMS"
    sums.write_text(sums_in(case.out, ["tag"]) + MALFORMED["tag-sha1"] + "\n")
    result = case.run("--only", "gsm8k", "--check", str(sums))
    case.failed(result, f"{sums}:", "not a sha256 line", "'SHA256 (NAME) = HASH'")


# ------------------------------------------------------------------------------------------------
# --check SUMS: a file listed twice


def listed_twice(out, name, first, second, wrong_first):
    """SUMS for `out` with `name` listed once more: in form `first`, then in form `second`, one
    of the two with a wrong sha256 (or neither: wrong_first None)."""
    right = sha256_of(out / name)
    wrong = "f" * 64
    a, b = {True: (wrong, right), False: (right, wrong), None: (right, right)}[wrong_first]
    others = [n for n in SUMMED if n != name]
    lines = [FORMS[first](a, name), *sums_in(out, ["text"], others).splitlines()]
    lines.append(FORMS[second](b, name))
    return "\n".join(lines) + "\n"


PAIRS = [("text", "text"), ("text", "tag"), ("tag", "dot-slash"), ("binary", "tag-upper-case")]


@pytest.mark.parametrize("wrong_first", [True, False], ids=["wrong-first", "wrong-second"])
@pytest.mark.parametrize("pair", PAIRS, ids=["+".join(p) for p in PAIRS])
@pytest.mark.parametrize("name", SUMMED)
def test_a_file_listed_twice_with_different_sums_is_refused(
    prior,
    tmp_path,
    name,
    pair,
    wrong_first,
):
    """Whichever line comes first and in whichever format: the check cannot pass on one sum of
    a file while SUMS gives it another."""
    sums = tmp_path / "SUMS"
    sums.write_text(listed_twice(prior, name, *pair, wrong_first))
    with pytest.raises(build.BuildError) as e:
        build.read_sums(sums)
    last = len(sums.read_text().splitlines())
    assert str(e.value).startswith(
        f"{sums}:{last}: {name} is listed again with another sha256 than at line 1"
    ), str(e.value)


@pytest.mark.parametrize("pair", PAIRS, ids=["+".join(p) for p in PAIRS])
def test_a_file_listed_twice_with_the_same_sum_is_accepted(prior, tmp_path, pair):
    """The same sum said twice (two copies of SUMS put together, or both of sha256sum's formats)
    is no contradiction: accepted, as sha256sum -c accepts it."""
    sums = tmp_path / "SUMS"
    sums.write_text(listed_twice(prior, "smoke.parquet", *pair, None))
    assert checked(prior, sums) == []
    if HAS_SHA256SUM:
        check = subprocess.run(["sha256sum", "-c", "--quiet", str(sums)], cwd=prior)
        assert check.returncode == 0


def test_two_content_sums_of_a_split_are_refused(prior, tmp_path):
    """The content sha256 chooses what a difference is called: two of a split contradict too."""
    text = (prior / "SHA256SUMS").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("# content "))
    sums = tmp_path / "SUMS"
    sums.write_text(text + line[: len("# content ")] + "f" * 64 + line[len("# content ") + 64 :])
    with pytest.raises(build.BuildError, match="is listed again with another sha256"):
        build.read_sums(sums)


def test_smoke_listed_twice_first_with_a_wrong_sum_fails_the_build(case):
    """As reported: the wrong sum first, the right one after it; this passed the check."""
    sums = case.root / "SUMS"
    sums.write_text(f"{'f' * 64}  smoke.parquet\n" + (case.out / "SHA256SUMS").read_text())
    result = case.run("--only", "gsm8k", "--check", str(sums))
    assert result.returncode == 1
    case.failed(result, f"{sums}:", "smoke.parquet is listed again with another sha256")


def test_smoke_listed_twice_with_its_sum_passes_the_build(case):
    sums = case.root / "SUMS"
    text = (case.out / "SHA256SUMS").read_text()
    sums.write_text(sums_in(case.out, ["tag"], ["smoke.parquet"], comments=False) + text)
    result = case.run("--only", "gsm8k", "--quiet", "--check", str(sums))
    assert result.returncode == 0, result.stderr
    assert f"check: every file matches {sums}" in result.stderr
