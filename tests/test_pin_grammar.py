"""build.py and fetch.sh on one table of pin lines (tests/pin_lines.py, docs/building.md "The pin
files"): each line gets the table's verdict from both, so a line one accepts and the other refuses
fails. fetch.sh reads every line in one run (it reports each refused line as FILE:LINE before
anything is downloaded); build.py reads each line as a pin file of its own."""

import re
import unicodedata

import pytest
from fakehttp import FakeServer
from pin_lines import FORBIDDEN, PAIRS, ROWS, numbered
from test_fetch import run_fetch

import build

KIND = {"REV": "rev", "BOOKS": "books"}


def build_verdict(files):
    """[(file, line)] read in order by build.py -> None (accepted) or the refusal."""
    claimed = {}
    try:
        for path, _ in files:
            build.read_pins(path, KIND[path.name], claimed)
    except build.BuildError as e:
        return str(e)
    return None


def write(path, lines):
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def fetch_errors(tmp_path_factory):
    """{(file, line number): fetch.sh's refusals} for every row and pair, in one run, and where
    each row and pair landed."""
    tmp = tmp_path_factory.mktemp("grammar")
    lines = {"REV": [], "BOOKS": []}
    at_row, at_pair = [], []
    for n, (name, line, _) in enumerate(ROWS):
        lines[name].append(numbered(line, n))
        at_row.append((name, len(lines[name])))
    for n, ((name1, line1, _), (name2, line2, _), _) in enumerate(PAIRS, len(ROWS)):
        lines[name1].append(numbered(line1, n))
        lines[name2].append(numbered(line2, n))
        at_pair.append((name2, len(lines[name2])))
    for name in lines:
        write(tmp / name, lines[name])
    hub, books = FakeServer(), FakeServer()
    try:
        r = run_fetch(tmp, hub, books, tmp / "dest")
        assert hub.gets() == [] and books.gets() == []
    finally:
        hub.close()
        books.close()
    assert r.returncode == 2 and r.stderr.endswith("nothing was downloaded\n"), r.stderr
    errors = {}
    for err in r.stderr.splitlines()[:-1]:
        m = re.match(rf"{re.escape(str(tmp))}/(REV|BOOKS):(\d+): ", err)
        assert m, err
        errors.setdefault((m[1], int(m[2])), []).append(err)
    return errors, at_row, at_pair


def check(verdict, refusal, what):
    if refusal is None:
        assert verdict is None, f"{what} refused a line the grammar accepts: {verdict}"
    else:
        assert verdict is not None, f"{what} accepted a line the grammar refuses ({refusal})"
        assert refusal in verdict, f"{what} refused it, not for {refusal}: {verdict}"


@pytest.mark.parametrize("n", range(len(ROWS)), ids=lambda n: f"{ROWS[n][0]}-{ROWS[n][1]!r}")
def test_both_scripts_give_each_line_its_verdict(tmp_path, fetch_errors, n):
    name, line, refusal = ROWS[n]
    path = write(tmp_path / name, [numbered(line, n)])
    verdict = build_verdict([(path, line)])
    check(verdict, refusal, "build.py")
    if refusal is not None:
        assert verdict.startswith(f"{path}:1: "), verdict
    errors, at_row, _ = fetch_errors
    check(" ".join(errors.get(at_row[n], [])) or None, refusal, "fetch.sh")


@pytest.mark.parametrize("n", range(len(PAIRS)))
def test_both_scripts_refuse_two_pins_that_need_one_name_on_disk(tmp_path, fetch_errors, n):
    (name1, line1, _), (name2, line2, _), refusal = PAIRS[n]
    k = len(ROWS) + n
    if name1 == name2:
        path = write(tmp_path / name1, [numbered(line1, k), numbered(line2, k)])
        files, where = [(path, None)], f"{path}:2: "
    else:
        first = write(tmp_path / name1, [numbered(line1, k)])
        second = write(tmp_path / name2, [numbered(line2, k)])
        files, where = [(first, None), (second, None)], f"{second}:1: "
    verdict = build_verdict(files)
    check(verdict, refusal, "build.py")
    if refusal is not None:
        assert verdict.startswith(where), verdict
    errors, _, at_pair = fetch_errors
    check(" ".join(errors.get(at_pair[n], [])) or None, refusal, "fetch.sh")


def test_the_table_covers_the_grammar():
    """The characters refused are the list in docs/building.md "The pin files"; every language
    build.py has an instruction for is accepted in BOOKS, and every other lang tried is refused."""
    ranges, start = [], None
    codes = [ord(c) for c in FORBIDDEN if c not in "\0\r"]
    for i, c in enumerate(codes):
        if start is None:
            start = c
        if i + 1 == len(codes) or codes[i + 1] != c + 1:
            ranges.append(f"U+{start:04X}" + ("" if c == start else f"–U+{c:04X}"))
            start = None
    page = (build.HERE / "docs" / "building.md").read_text(encoding="utf-8")
    grammar = " ".join(page.split("\n## The pin files\n", 1)[1].split("\n## ", 1)[0].split())
    assert f"({', '.join(ranges)})" in grammar
    assert all(unicodedata.category(c) == "Cc" or c.isspace() for c in FORBIDDEN)
    accepted = {line.split()[1].decode() for name, line, r in ROWS if name == "BOOKS" and not r}
    assert accepted == set(build.BOOK_INSTRUCTION)
