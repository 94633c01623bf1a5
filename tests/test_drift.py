"""A reader and the declared format of its source cannot drift apart: every field build.py's
readers read (`Source.fields`) is in the format tests/make_sources.py declares for that source
(`FORMATS`, the one declaration both the miniature and the benchmark are written from), with an
Arrow type the reader's kind accepts, including inside JSON layers and where a type varies by
row (inside a JSON layer too: SWE-smith's contents that are lists of content parts)."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest
from make_sources import FORMATS

import build


def drift(sources):
    """What a reader asks for that its source's declared format does not give it."""
    problems = []
    pins = build.read_pins(build.HERE / "REV", "rev")
    books = build.read_pins(build.HERE / "BOOKS", "books")
    for name, source in sources.items():
        declared = FORMATS[name]
        files = build.source_files(source, pins, books)
        if [f.path for f in declared.files] != [p.path for p in files]:
            problems.append(f"{name}: declared files differ from the pinned ones")
            continue
        for pin, file in zip(files, declared.files):
            fields = source.fields_of(pin)
            if file.schema is None:
                problems += [f"{name} {pin.path}: {f} read from a text file" for f in fields]
                continue
            for field, kind in fields.items():
                where = f"{name} {pin.path} {field}"
                if field not in file.schema.names:
                    problems.append(f"{where}: not in the declared format")
                    continue
                t, layer = file.schema.field(field).type, file.json_layers.get(field)
                if isinstance(kind, build.Json):
                    if layer is None:
                        problems.append(
                            f"{where}: the reader parses JSON text the format does not declare"
                        )
                        continue
                    if p := build.arrow_mismatch(t, str, field):  # the text itself
                        problems.append(f"{where}: {p}")
                    types = file.varies.get(field, (layer,))  # and what it decodes to
                    problems += [f"{where}: {p}" for t in types
                                 if (p := build.arrow_mismatch(t, kind.kind, field))]  # fmt: skip
                elif layer is not None:
                    problems.append(
                        f"{where}: the format holds JSON text there, the reader does not parse it"
                    )
                elif p := build.arrow_mismatch(t, kind, field):
                    problems.append(f"{where}: {p}")
            for path, types in [
                *file.varies.items(),
                *((p, (pa.string(),)) for p in file.json_layers),
            ]:
                head, *rest = path.split(".")
                if head not in fields or not rest:
                    continue
                kind = fields[head]  # below a JSON layer: the kind of what the text holds
                kind = kind.kind if isinstance(kind, build.Json) else kind
                sub = build.kind_below(kind, rest)  # lists passed through, as here
                if sub is None:
                    continue
                problems += [f"{name} {pin.path} {path}: {p}" for t in types
                             if (p := build.arrow_mismatch(t, sub, path))]  # fmt: skip
    return problems


def test_every_field_a_reader_reads_is_declared_with_a_type_it_accepts():
    assert drift(build.SOURCES) == []


@pytest.mark.parametrize(
    "name, change, problem",
    [
        ("gsm8k", {"grade": int}, "not in the declared format"),
        ("gsm8k", {"question": int}, "'question' is string, expected a number"),
        ("wildchat", {"conversation": [{"role": int}]}, "'conversation.role' is string"),
        ("mrcr", {"prompt": str}, "does not parse it"),
        (
            "mrcr",
            {"prompt": build.Json([{"role": str, "turn": int}])},
            "'prompt' has no field 'turn'",
        ),
        ("numinamath", {"synthetic": str}, "'synthetic' is bool"),
        ("nemotron-agentic", {"messages": [{"role": str, "content": str}]}, "messages.content"),
        (
            "swe-smith",
            {"messages": build.Json([{"role": str, "content": (str, [{"kind": str}])}])},
            "image_url: struct<url: string>>>, expected text or a list",
        ),
        ("swe-smith", {"messages": build.Json([{"content": str}])}, "'messages.content' is list<"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_reader_asking_for_what_its_format_lacks_is_found(name, change, problem):
    """The check itself: a reader changed to read a field the format lacks, or of another type."""
    source = build.SOURCES[name]
    changed = dataclasses.replace(source, fields=source.fields | change)
    found = drift({name: changed})
    assert any(problem in p for p in found), found
