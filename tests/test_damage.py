"""Any value in a source file can be damaged: of another kind (a number where text is expected,
text where a number is, a list, an object, null), invalid UTF-8, nested deeper than JSON can be
written. Every such input gives a build, or one `error:` line naming the file, the row or line,
and the field, with a previous OUT untouched (docs/failures.md).

The cases are generated from what build.py declares its readers read (`Source.fields`), so a
field a reader starts to use is damaged here without a new test. The last test damages the
miniature sources at random (bit flips, truncations, swapped types) in one child process that
runs the builds one after another."""

from __future__ import annotations

import copy
import io
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_errors import REPO, Case, _tree, previous  # noqa: F401 (a fixture)
from test_inputs import accepts

import build

# The values swapped in: one of each JSON kind, and a structure nested past what can be written.
DEEP = "deep"
WRONG = [None, 7, True, "text", ["text"], {"k": "v"}, DEEP]


def deep():
    value = "x"
    for _ in range(300):
        value = [value]
    return value


def materialize(value):
    return deep() if value is DEEP else copy.deepcopy(value)


def field_paths(value, kind, path=()):
    """(path, kind) of every declared field found in a parsed value, one per field pattern
    (messages[3].role and messages[0].role are one pattern; the first found is kept)."""
    seen = set()

    def walk(value, kind, path):
        kinds = [k for k in kind if k is not None] if isinstance(kind, tuple) else [kind]
        for k in kinds:
            if isinstance(k, list) and isinstance(value, list):
                for i, item in enumerate(value):
                    yield from walk(item, k[0], (*path, i))
            elif isinstance(k, dict) and isinstance(value, dict):
                for name, sub in k.items():
                    pattern = tuple("*" if isinstance(p, int) else p for p in (*path, name))
                    if pattern not in seen:
                        seen.add(pattern)
                        yield (*path, name), sub
                    if name in value:
                        yield from walk(value[name], sub, (*path, name))

    yield from walk(value, kind, path)


def set_path(record, path, value):
    for p in path[:-1]:
        record = record[p]
    record[path[-1]] = value


def label(path):
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def damage(name, rel, path, kind, wrong):
    """One case, with a test id that names the source, the field and the value swapped in."""
    shown = "deep" if wrong is DEEP else repr(wrong)
    return pytest.param(name, rel, path, kind, wrong, id=f"{name}-{label(path)}-{shown}")


def run_build(case, only, capsys):
    """build.main in this process: (exit status, stderr)."""
    capsys.readouterr()
    argv = case.command("--only", only, "--quiet")[2:]
    code = build.main(argv)
    return code, capsys.readouterr().err


def outcome(case, only, capsys, accepted, *names, damaged=None):
    """A value of the declared kind gives a build, or one error line (a slot may fall short
    when every row holds it); a value of another kind gives one error line naming `names`, or,
    when only the row `damaged` holds it, a build in which no row comes from that row."""
    code, err = run_build(case, only, capsys)
    assert "Traceback" not in err
    if accepted and code == 0:
        return
    if damaged is not None and code == 0:
        sources = [
            r["source"] for r in json.loads((case.out / "manifest.json").read_bytes())["rows"]
        ]
        assert not [s for s in sources if re.fullmatch(re.escape(damaged) + r"(:\d+)?", s)]
        return
    errors = [ln for ln in err.splitlines() if "error:" in ln]
    assert code == 1 and len(errors) == 1, err
    for n in names if not accepted else ():
        assert n in errors[0], (n, errors[0])
    case.untouched()


def row_id(case, rel, row):
    """The id of a row of the first file of a source (rows of later files are numbered on)."""
    pin = next(p for p in build.read_pins(case.rev, "rev") if f"{p.repo}/{p.path}" == rel)
    return f"{pin.repo}@{pin.revision}#{row}"


@pytest.fixture
def case(mini, previous, tmp_path):  # noqa: F811
    return Case(mini, previous, tmp_path)


# ------------------------------------------------------------------------------------------------
# JSON files and JSON text: every declared field of a row, swapped for each kind it is not


def first_record(data, rel):
    """The first line of a JSONL file, or the first object of a JSON array file."""
    if rel.endswith(".jsonl"):
        return orjson.loads(data.splitlines()[0])
    if rel.endswith(".json"):
        return orjson.loads(data)[0]
    raise AssertionError(rel)


def json_text_value(text):
    """What a JSON-text column holds: JSON of the value, or (some SWE-smith rows) JSON of that
    JSON text."""
    value = orjson.loads(text)
    return orjson.loads(value) if isinstance(value, str) else value


def write_json_record(case, rel, record):
    path = case.file(rel)
    if rel.endswith(".jsonl"):
        lines = path.read_bytes().splitlines(keepends=True)
        lines[0] = json.dumps(record).encode() + b"\n"
        path.write_bytes(b"".join(lines))
    else:
        rows = orjson.loads(path.read_bytes())
        rows[0] = record
        path.write_bytes(json.dumps(rows).encode())
    case.repin(rel)


JSON_SOURCES = {"longbench-pro": ".json", "nemotron-agentic": ".jsonl", "longwriter": ".jsonl"}
JSON_TEXT = {"mrcr": "prompt", "swe-smith": "messages"}


def json_damage_params(mini_src_rows):
    params = []
    for name, (rel, record, fields) in mini_src_rows.items():
        for field, kind in fields.items():
            for path, sub in [((field,), kind), *field_paths(record.get(field), kind, (field,))]:
                for wrong in WRONG:
                    params.append(damage(name, rel, path, sub, wrong))
    return params


def sample_rows():
    """The first row of each JSON source and JSON-text column of the miniature sources, made
    once for the parameter list (the generator is deterministic)."""
    import tempfile

    from make_sources import make_sources, make_tokenizer

    pins = {p.repo: p for p in reversed(build.read_pins(REPO / "REV", "rev"))}
    rows = {}
    with tempfile.TemporaryDirectory(prefix="kern-damage-") as tmp:
        src = Path(tmp) / "src"
        make_sources(src, make_tokenizer(Path(tmp) / "tokenizer.json"))
        for name, source in build.SOURCES.items():
            if name not in JSON_SOURCES and name not in JSON_TEXT:
                continue
            pin = pins[source.repo]
            rel = f"{pin.repo}/{pin.path}"
            if name in JSON_SOURCES:
                rows[name] = (rel, first_record((src / rel).read_bytes(), rel), source.fields)
            else:
                column = JSON_TEXT[name]
                text = pq.read_table(src / rel, columns=[column]).column(0)[0].as_py()
                kind = source.fields[column].kind
                rows[name] = (rel, {column: json_text_value(text)}, {column: kind})
    return rows


SAMPLES = sample_rows()


def change_first_record(case, name, rel, change):
    """Apply change(record) to the first row of a JSON source or JSON-text column; returns
    where an error names it ("row 0", "line 1")."""
    if name in JSON_TEXT:
        column = JSON_TEXT[name]
        table = pq.read_table(case.file(rel))
        texts = table.column(column).to_pylist()
        record = {column: json_text_value(texts[0])}
        change(record)
        texts[0] = json.dumps(record[column])
        index = table.schema.get_field_index(column)
        pq.write_table(
            table.set_column(index, column, pa.array(texts, pa.string())), case.file(rel)
        )
        case.repin(rel)
        return "row 0"
    record = first_record(case.file(rel).read_bytes(), rel)
    change(record)
    write_json_record(case, rel, record)
    return "row 0" if rel.endswith(".json") else "line 1"


@pytest.mark.parametrize(
    "name, rel, path, kind, wrong",
    json_damage_params(SAMPLES),
)
def test_a_json_value_of_another_kind(case, capsys, name, rel, path, kind, wrong):
    where = change_first_record(
        case, name, rel, lambda record: set_path(record, path, materialize(wrong))
    )
    outcome(
        case,
        name,
        capsys,
        accepts(kind, wrong),
        rel,
        where,
        str(path[-1]),
        damaged=row_id(case, rel, 0),
    )


def declared_lists(value, kind, path=()):
    """(path, item kind) of every non-empty list found in a parsed value where its kind declares
    one, one per field pattern (the first found)."""
    seen = set()

    def walk(value, kind, path):
        for k in [k for k in kind if k is not None] if isinstance(kind, tuple) else [kind]:
            if isinstance(k, list) and isinstance(value, list):
                pattern = tuple("*" if isinstance(p, int) else p for p in path)
                if value and pattern not in seen:
                    seen.add(pattern)
                    yield path, k[0]
                for i, item in enumerate(value):
                    yield from walk(item, k[0], (*path, i))
            elif isinstance(k, dict) and isinstance(value, dict):
                for name, sub in k.items():
                    if name in value:
                        yield from walk(value[name], sub, (*path, name))

    yield from walk(value, kind, path)


def list_damage_params():
    for name, (rel, record, fields) in SAMPLES.items():
        for field, kind in fields.items():
            for path, item in declared_lists(record.get(field), kind, (field,)):
                yield pytest.param(name, rel, path, item, id=f"{name}-{label(path)}")


@pytest.mark.parametrize("name, rel, path, item", list(list_damage_params()))
def test_a_bad_item_after_good_ones_in_a_declared_list(case, capsys, name, rel, path, item):
    """Every item of a list is checked, not only the first: a number appended to the first
    row's list (tools, tool_calls, messages) is one error line naming that item."""
    assert not accepts(item, 7)
    n = []

    def append(record):
        for p in path:
            record = record[p]
        n.append(len(record))
        record.append(7)

    where = change_first_record(case, name, rel, append)
    outcome(case, name, capsys, False, rel, where, f"{label(path)}[{n[0]}]")


@pytest.mark.parametrize("name", JSON_SOURCES)
@pytest.mark.parametrize("value", [["a", "list"], 7, "text", True, None], ids=repr)
def test_a_json_row_that_is_not_an_object(case, capsys, name, value):
    """A row that is valid JSON of another kind than an object is one error line, whatever
    the kind."""
    pin = next(p for p in build.read_pins(case.rev, "rev") if p.repo == build.SOURCES[name].repo)
    rel = f"{pin.repo}/{pin.path}"
    write_json_record(case, rel, value)
    where = "row 0" if rel.endswith(".json") else "line 1"
    outcome(case, name, capsys, False, rel, where, f"the row is {build.describe(value)}")


# ------------------------------------------------------------------------------------------------
# Parquet columns: another Arrow type, a null, invalid UTF-8


def kind_leaves(name, kind):
    """(path, kind) of a column and of the fields of its struct (or list of structs)."""
    yield (name,), kind
    inner = kind[0] if isinstance(kind, list) else kind
    if isinstance(inner, dict):
        for key, sub in inner.items():
            yield (name, key), sub


def parquet_params():
    for name, source in build.SOURCES.items():
        if source.repo is None or name in JSON_SOURCES:
            continue
        done = set()  # the first file that has a field stands for the others
        for pin in (p for p in build.read_pins(REPO / "REV", "rev") if p.repo == source.repo):
            for field, declared in source.fields_of(pin).items():
                for path, kind in kind_leaves(field, declared):
                    if path in done:
                        continue
                    done.add(path)
                    for wrong in [w for w in WRONG if w is not DEEP]:
                        yield damage(name, f"{pin.repo}/{pin.path}", path, kind, wrong)
                    if (kind is str or isinstance(kind, build.Json)) and len(path) == 1:
                        yield damage(name, f"{pin.repo}/{pin.path}", path, kind, b"\xff\xfe")


def replace_leaf(values, leaf, value):
    """A list-of-struct or struct column's values with one field of every object replaced."""

    def one(v):
        return None if v is None else dict(v, **{leaf: value})

    return [[one(x) for x in v] if isinstance(v, list) else one(v) for v in values]


@pytest.mark.parametrize("name, rel, path, kind, wrong", list(parquet_params()))
def test_a_parquet_column_of_another_type(case, capsys, name, rel, path, kind, wrong):
    table = pq.read_table(case.file(rel))
    head, leaf = path[0], path[1] if len(path) > 1 else None
    index = table.schema.get_field_index(head)
    values = table.column(head).to_pylist()
    if wrong is None:  # one null, in the first row
        if leaf:
            values[0] = replace_leaf(values[:1], leaf, None)[0]
        else:
            values[0] = None
        column = pa.array(values, table.schema.field(index).type)
    elif isinstance(wrong, bytes):  # invalid UTF-8 in the first row
        raw = [v.encode() if isinstance(v, str) else v for v in values]
        raw[0] = wrong
        column = pa.array(raw, pa.binary()).view(pa.string())
    elif leaf:
        column = pa.array(replace_leaf(values, leaf, wrong))
    else:
        column = pa.array([wrong] * len(values))
    pq.write_table(table.set_column(index, head, column), case.file(rel))
    case.repin(rel)
    accepted = not isinstance(wrong, bytes) and accepts(kind, wrong)
    names, damaged = [rel, ".".join(path) if wrong is not None else head], None
    if wrong is None or isinstance(wrong, bytes):
        names.append("row 0")
        damaged = row_id(case, rel, 0)
    outcome(case, name, capsys, accepted, *names, damaged=damaged)


def parquet_list_params():
    for name, source in build.SOURCES.items():
        if source.repo is None or name in JSON_SOURCES:
            continue
        for pin in (p for p in build.read_pins(REPO / "REV", "rev") if p.repo == source.repo):
            for field, kind in source.fields_of(pin).items():
                if isinstance(kind, list):
                    yield pytest.param(name, f"{pin.repo}/{pin.path}", field, id=f"{name}-{field}")
                    break  # the first file of a source stands for the others
            else:
                continue
            break


@pytest.mark.parametrize("name, rel, field", list(parquet_list_params()))
def test_a_null_item_after_good_ones_in_a_list_column(case, capsys, name, rel, field):
    """Every item of a list column is checked, not only the first: a null appended to the
    first row's list is one error line naming that item."""
    table = pq.read_table(case.file(rel))
    index = table.schema.get_field_index(field)
    values = table.column(field).to_pylist()
    n = len(values[0])
    values[0] = [*values[0], None]
    column = pa.array(values, table.schema.field(index).type)
    pq.write_table(table.set_column(index, field, column), case.file(rel))
    case.repin(rel)
    outcome(case, name, capsys, False, rel, "row 0", f"{field}[{n}]")


# ------------------------------------------------------------------------------------------------
# At random: bit flips, truncations and swapped types, many builds in one child process

DRIVER = """
import contextlib, io, json, sys, traceback
sys.path.insert(0, sys.argv[1])
import build
results = []
for argv in json.loads(sys.stdin.read()):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            code = build.main(argv)
    except BaseException:
        code, err = "raised", io.StringIO(err.getvalue() + traceback.format_exc())
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


def mutate(rng, data, rel):
    how = rng.choice(["flip", "flip", "truncate", "swap"])
    if how == "truncate":
        return data[: rng.randrange(len(data))], how
    if how == "swap" and rel.endswith(".parquet"):
        table = pq.read_table(io.BytesIO(data))
        name = rng.choice(table.column_names)
        column = pa.array([rng.choice([7, "x", [1], {"k": 1}, True])] * table.num_rows)
        out = io.BytesIO()
        pq.write_table(table.set_column(table.schema.get_field_index(name), name, column), out)
        return out.getvalue(), f"swap {name}"
    if how == "swap" and rel.endswith((".json", ".jsonl")):
        text = data.decode()
        spots = [m.end() - 1 for m in re.finditer(r'": ?"', text)]  # a string value's quote
        if spots:
            at = rng.choice(spots)
            end = text.index('"', at + 1)
            other = rng.choice(["7", "null", "[1]", "{}", "true"])
            return (text[:at] + other + text[end + 1 :]).encode(), "swap"
    data = bytearray(data)
    for _ in range(rng.choice([1, 1, 3, 20])):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return bytes(data), "flip"


def test_random_damage_gives_a_build_or_one_error_line(mini, previous, tmp_path):  # noqa: F811
    rng = random.Random(int(os.environ.get("KERN_DAMAGE_SEED", "2024")))
    pins = [p for p in build.read_pins(mini.rev, "rev") if p.kind == "dataset"]
    names = {s.repo: n for n, s in build.SOURCES.items() if s.repo}
    cases, runs = [], []
    for i in range(int(os.environ.get("KERN_DAMAGE_RUNS", "40"))):
        pin = rng.choice(pins)
        rel = f"{pin.repo}/{pin.path}"
        case = Case(mini, previous, tmp_path / str(i))
        data, how = mutate(rng, case.file(rel).read_bytes(), rel)
        case.file(rel).write_bytes(data)
        case.repin(rel, "-", "-")  # the pins say nothing: the reader meets the damage itself
        cases.append((case, rel, how))
        runs.append(case.command("--only", names[pin.repo], "--quiet")[2:])
    child = subprocess.run(
        [sys.executable, "-c", DRIVER, str(REPO)], input=json.dumps(runs), cwd=REPO,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    for (case, rel, how), (code, err) in zip(cases, json.loads(child.stdout)):
        assert code in (0, 1), (rel, how, err)
        assert "Traceback" not in err, (rel, how, err)
        if code == 1:
            errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
            assert len(errors) == 1 and len(err.strip().splitlines()) == 1, (rel, how, err)
            case.untouched()
        else:
            assert sorted(p.name for p in case.out.iterdir()) == sorted(build.OUT_FILES)
