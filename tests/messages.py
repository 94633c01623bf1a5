"""The messages build.py and score.py print, read from their code, and the examples
docs/failures.md quotes for them (tests/test_failure_rows.py; docs/testing.md).

A template is the text of an error raised or printed (ScoreError, BuildError, build.fail, argparse's
`error`, ArgumentTypeError, an engine's exception wrapped by scoring/boundary.py's `own`), read with ast: its f-string fields and the values joined to it are
wildcards. An example is a backquoted span of the table's message column, split on ` · `, `…` a
wildcard. The two match when one string could be both: a glob against a glob.
"""

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What build.py and score.py print: build.py itself, and the package score.py is the command of.
CODE = [REPO / "build.py", REPO / "score.py", *sorted((REPO / "scoring").rglob("*.py"))]
RAISED = {"ScoreError", "BuildError", "ArgumentTypeError"}
CALLED = {"fail", "error"}  # build.fail(message, code) and argparse's parser.error(message)
WRITTEN = {"write"}  # os.write(2, b"error: ...") where build.py has no Python yet to print with
# scoring/boundary.py's own(who, what) and failed(who, what, e): "{who}{what}: {exception}", the
# engine's exception after the words the call site gives
WRAPPED = {"own", "failed"}
STAR = "\0"  # a wildcard, in templates and examples alike
WORD = "\1"  # a wildcard within a word: `9c1…`
WILD = (STAR, WORD)


@dataclass(frozen=True)
class Template:
    where: str  # file:line
    text: str  # literal text, STAR where a value goes

    def __str__(self):
        return f"{self.where}: {self.text.replace(STAR, '{…}')}"


def glob(node):
    """The text a message expression can print, STAR for what is computed."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
        return node.value if isinstance(node.value, str) else node.value.decode()
    if isinstance(node, ast.JoinedStr):
        return "".join(glob(v) if not isinstance(v, ast.FormattedValue) else STAR
                       for v in node.values)  # fmt: skip
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return glob(node.left) + glob(node.right)
    if isinstance(node, ast.IfExp):  # one of two texts: the common parts stay literal
        return STAR
    return STAR


def templates(paths=CODE, returned=False):
    """The messages raised or printed, each once (scoring/builder.py is a link to build.py);
    with `returned`, the texts functions return as well (the parts a message is made of, such as
    build.py's reasons a pin line is refused), each a glob with STAR on either side."""
    found, seen = [], set()
    for path in paths:
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if returned and isinstance(node, ast.Return) and node.value is not None:
                text = glob(node.value)
                if literal(text) >= 6:
                    found.append(Template(where(path, node), STAR + text + STAR))
            if not isinstance(node, ast.Call) or not node.args:
                continue
            text, f = None, node.func
            name = getattr(f, "id", None) or getattr(f, "attr", "")
            if name in WRITTEN and len(node.args) == 2:
                text = glob(node.args[1]).strip()
                if not text.startswith("error: "):
                    continue
            elif name in WRAPPED and len(node.args) >= 2:
                text = STAR + glob(node.args[1]) + ": " + STAR
            elif name in RAISED or name in CALLED:
                text = re.sub(f"{STAR}+", STAR, glob(node.args[0]))
                if name == "ArgumentTypeError":  # argparse puts "argument --flag: " before it
                    text = STAR + text
            else:
                continue
            if literal(text) >= 6:  # not "{…}: {…}", which any message is
                found.append(Template(where(path, node), text))
    return found


def literal(text):
    return len(re.sub(r"\W", "", text.replace(STAR, "")))


def where(path, node):
    return f"{path.relative_to(REPO)}:{node.lineno}"


@dataclass(frozen=True)
class Example:
    line: int  # in docs/failures.md
    section: str  # build.py, fetch.sh, score.py
    text: str  # what follows `error: `, STAR for `…`


FAILURES = REPO / "docs" / "failures.md"
SECTIONS = {"build.py": "build.py", "fetch.sh": "fetch.sh", "score.py": "score.py",
            "The engine boundary": "score.py"}  # fmt: skip


def cells(row):
    """A table row's cells, split on the pipes outside backquotes (a `\\|` is a pipe in one)."""
    out, cell, quoted, i = [], "", False, 0
    while i < len(row):
        c = row[i]
        if c == "\\" and row[i + 1 : i + 2] == "|":
            cell, i = cell + "|", i + 2
            continue
        if c == "`":
            quoted = not quoted
        if c == "|" and not quoted:
            out.append(cell.strip())
            cell = ""
        else:
            cell += c
        i += 1
    return out[1:]


def spans(cell):
    """The backquoted spans of a cell: `x` and `` x `` (which may hold a backquote)."""
    return [m[1] if m[1] is not None else m[2]
            for m in re.finditer(r"``\s?(.+?)\s?``|`([^`]+)`", cell)]  # fmt: skip


def examples(path=FAILURES):
    """The error lines the table quotes, by section."""
    found, section = [], None
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.startswith("| ") or line.startswith("|---"):
            continue
        first, message = cells(line)[:2]
        heading = re.fullmatch(r"\*\*(.+?)\*\*.*", first)
        if heading and not message:
            section = SECTIONS.get(heading[1])
            continue
        for quoted in spans(message):
            for one in quoted.split(" · "):
                m = re.match(r"(?:…\s*|usage, then )?(?:[\w.]+(?: \w+)?: )?error: (.*)", one)
                if m or one.startswith("… "):
                    text = m[1] if m else one
                    text = re.sub(r"(?<=\w)…", WORD, text)
                    found.append(Example(n, section, re.sub(r"\s*…\s*", STAR, text)))
    return found


@functools.cache
def intersect(a, b):
    """Whether some string matches both globs: STAR any text, WORD text without a space (an
    example's `9c1…` shortens one word), in either."""
    if not any(w in b for w in WILD):  # a plain text: the glob a as a regular expression
        return as_regex(a).fullmatch(b) is not None
    while a and b and a[0] not in WILD and b[0] not in WILD:  # the literal ends, compared
        if a[0] != b[0]:
            return False
        a, b = a[1:], b[1:]
    while a and b and a[-1] not in WILD and b[-1] not in WILD:
        if a[-1] != b[-1]:
            return False
        a, b = a[:-1], b[:-1]
    n, m = len(a), len(b)

    def eats(w, c):  # wildcard w can stand for the character c
        return c in WILD or w == STAR or not c.isspace()

    reach = None  # reach[j]: a[:i] and b[:j] can stand for one text
    for i in range(n + 1):
        row = [False] * (m + 1)
        for j in range(m + 1):
            if reach is not None:
                p = a[i - 1]
                row[j] = ((reach[j] and (p in WILD or (j < m and b[j] in WILD and eats(b[j], p))))
                          or (j > 0 and reach[j - 1] and p == b[j - 1] and p not in WILD))  # fmt: skip
            elif j == 0:
                row[j] = True
            if not row[j] and j > 0 and row[j - 1]:
                q = b[j - 1]
                row[j] = q in WILD or (i < n and a[i] in WILD and eats(a[i], q))
        reach = row
    return reach[m]


@functools.cache
def as_regex(glob):
    parts = {STAR: ".*", WORD: r"\S*"}
    return re.compile("".join(parts.get(c) or re.escape(c) for c in glob), re.DOTALL)


def ends_agree(a, b):
    """A quick necessary condition of intersect: the literal starts agree, and the ends."""
    for x, y in ((a, b), (a[::-1], b[::-1])):
        for p, q in zip(x, y):
            if p in WILD or q in WILD:
                break
            if p != q:
                return False
    return True


@functools.cache
def words(text):
    return frozenset(re.findall(r"[a-z]{3,}", text.lower()))


def matches(template, example):
    """The example is of this template: one string could be both (what follows the template is
    free: a caller may add to it), and the example holds most of the template's own words, or
    five of them where it is cut short with …"""
    t = template.text.removeprefix("error: ")
    if not t.endswith(STAR):  # what a caller adds: "; nothing was written", "; the 2 finished …"
        t += STAR
    if not ends_agree(t, example.text):
        return False
    own = words(t.replace(STAR, " "))
    shared = own & words(example.text.replace(STAR, " ").replace(WORD, " "))
    if len(shared) < 0.6 * len(own) and not (STAR in example.text and len(shared) >= 5):
        return False
    return intersect(t, example.text)
