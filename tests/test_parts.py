"""A message content that is a list of OpenAI content parts (SWE-agent writes them so for Claude
models) is the text of its parts; a part of another type drops its row, counted under its own
reason (README "How rows are chosen")."""

from __future__ import annotations

import dataclasses
import json
import random
import re
from collections import Counter

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_engine import source, tok, tokenizer_path  # noqa: F401 (fixtures)
from test_errors import Case

import build

SWE = "SWE-bench/SWE-smith-trajectories/data/xml-00000-of-00008.parquet"
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
OTHER_PARTS = [IMAGE, {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
               {"type": "tool_use", "id": "t", "name": "bash", "input": {}}, {"type": "Text"},
               {"type": "file", "file": {"file_id": "f"}}]  # fmt: skip
TEXTS = [
    "",
    " ",
    "x",
    "a\n\nb ",
    "e\u0301 \u00e9",
    "話說天下大勢",
    "<function=bash>\nls\n</function>",
]


def random_text(rng):
    return "".join(rng.choice(TEXTS) for _ in range(rng.randrange(0, 4)))


def random_message(rng):
    role = rng.choice(["system", "user", "assistant", "tool"])
    m = {"role": role, "content": random_text(rng)}
    if role == "assistant" and rng.random() < 0.3:
        m["tool_calls"] = [{"id": "c1", "type": "function",
                            "function": {"name": "f", "arguments": '{"a": 1}'}}]  # fmt: skip
    if role == "tool":
        m["tool_call_id"] = "c1"
    if rng.random() < 0.2:
        m["name"] = "n"
    return m


def as_parts(rng, text):
    """The text as 1 to 4 text parts (some empty), some with cache_control."""
    cuts = sorted(rng.randint(0, len(text)) for _ in range(rng.randrange(0, 4)))
    parts = [{"type": "text", "text": text[a:b]} for a, b in zip([0, *cuts], [*cuts, len(text)])]
    for p in parts:
        if rng.random() < 0.5:
            p["cache_control"] = {"type": "ephemeral"}
    return parts


def test_text_parts_are_the_string_they_hold_and_other_parts_drop_the_row():
    for seed in range(500):
        rng = random.Random(seed)
        plain = [random_message(rng) for _ in range(rng.randrange(1, 6))]
        parted = [dict(m) for m in plain]
        for m in parted:
            if rng.random() < 0.6:
                m["content"] = as_parts(rng, m["content"])
            if rng.random() < 0.5:
                m["message_type"] = rng.choice(["system_prompt", "observation", "action"])
        assert build.openai_messages(parted, "w") == build.openai_messages(plain, "w"), seed
        # Any part of another type, in any message, at any place: the row is unusable.
        m = rng.choice(parted)
        parts = m["content"] if isinstance(m["content"], list) else as_parts(rng, m["content"])
        parts.insert(rng.randrange(len(parts) + 1), rng.choice(OTHER_PARTS))
        m["content"] = parts
        with pytest.raises(build.Unusable, match=f"^{build.NOT_TEXT}$"):
            build.openai_messages(parted, "w")


def test_no_parts_is_empty_text_and_an_object_stays_json():
    got = build.openai_messages([{"role": "user", "content": []}], "w")
    assert got == [{"role": "user", "content": ""}]
    part = {"type": "text", "text": "x"}
    got = build.openai_messages([{"role": "tool", "content": part, "tool_call_id": "c"}], "w")
    assert got[0]["content"] == '{"type":"text","text":"x"}'  # a structured result, as today


@pytest.mark.parametrize(
    "content, problem",
    [
        ([{"type": "text", "text": 7}], "field 'm[0].content[0].text' is a number, expected text"),
        ([{"type": "text"}], "no field 'm[0].content[0].text'"),
        ([{"type": 7, "text": "x"}], "field 'm[0].content[0].type' is a number, expected text"),
        ([{"text": "x"}], "no field 'm[0].content[0].type'"),
        (["x"], "field 'm[0].content[0]' is text, expected an object"),
        ([[{"type": "text"}]], "field 'm[0].content[0]' is a list, expected an object"),
    ],
)
def test_a_damaged_part_is_an_error_naming_it(content, problem):
    with pytest.raises(build.BuildError) as e:
        build.openai_messages([{"role": "user", "content": content}], "src/x row 3", "m")
    assert str(e.value) == f"src/x row 3: {problem}"


def lazy(contents):
    """Lazy candidates whose loader converts their messages as the sources' loaders do."""

    def loader(group):
        for c in group:
            messages = [{"role": "user", "content": contents[c.id]}, {"role": "assistant"}]
            build.convert_into(c, build.openai_messages, messages, c.id)

    return [build.Candidate(i, load=loader, size=1, unique=i) for i in contents]


@pytest.mark.parametrize("longest", [False, True])
def test_a_lazy_row_found_unusable_when_loaded_is_counted_once(tok, longest):  # noqa: F811
    contents = {f"r@v#{i}": [{"type": "text", "text": "x" * (10 + i)}] for i in range(6)}
    for i in (1, 2, 4):
        contents[f"r@v#{i}"] = contents[f"r@v#{i}"] + [IMAGE]
    s = build.slot("full", 4, 1, 99, "before-last", longest=longest)
    with pytest.raises(build.BuildError) as e:
        build.select(source(s), lazy(contents), Counter(), tok)
    assert str(e.value).endswith(
        f"has 3 of 4 rows after looking at 6 of 6 candidates; rejected: 3 {build.NOT_TEXT}"
    )
    rows = build.select(source(dataclasses.replace(s, count=3)), lazy(contents), Counter(), tok)
    assert sorted(r.candidate.id for r in rows) == ["r@v#0", "r@v#3", "r@v#5"]
    assert rows[0].messages[0]["content"] == contents[rows[0].candidate.id][0]["text"]


# ------------------------------------------------------------------------------------------------
# The miniature sources: SWE-smith's rows in SWE-agent's shape, and every reader of messages


def json_text_rows(case, rel, column, change):
    """Rewrite a JSON-text column's messages through change(messages), keeping its layers."""

    def one(text):
        value = orjson.loads(text)
        twice = isinstance(value, str)
        out = json.dumps(change(orjson.loads(value) if twice else value))
        return json.dumps(out) if twice else out

    def rewrite(table):
        texts = [one(t) for t in table.column(column).to_pylist()]
        index = table.schema.get_field_index(column)
        return table.set_column(index, column, pa.array(texts, pa.string()))

    case.rewrite_parquet(rel, rewrite)


def jsonl_rows(case, rel, change):
    path = case.file(rel)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    path.write_text("".join(json.dumps(dict(r, messages=change(r["messages"]))) + "\n"
                            for r in rows), encoding="utf-8")  # fmt: skip
    case.repin(rel)


def as_strings(messages):
    """The messages as the source would hold them with string contents (images kept)."""
    if any(isinstance(m["content"], list) and IMAGE["type"] in str(m["content"]) for m in messages):
        return messages
    return [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str)
             else "".join(p["text"] for p in m["content"])} for m in messages]  # fmt: skip


def with_image(messages):
    first = messages[0]
    text = first["content"] if isinstance(first["content"], str) else ""
    return [dict(first, content=[{"type": "text", "text": text}, IMAGE]), *messages[1:]]


def outputs(case):
    manifest = json.loads((case.out / "manifest.json").read_bytes())
    return manifest["rows"], {n: (case.out / n).read_bytes() for n in build.OUT_FILES[:3]}


def test_swe_smith_rows_with_text_parts_are_the_rows_of_their_strings(mini, tmp_path):
    shaped = Case(mini, None, tmp_path / "parts", had_out=False)
    plain = Case(mini, None, tmp_path / "strings", had_out=False)
    json_text_rows(plain, SWE, "messages", as_strings)
    assert plain.file(SWE).read_bytes() != shaped.file(SWE).read_bytes()
    for case in (shaped, plain):
        result = case.run("--only", "swe-smith", "--quiet")
        assert result.returncode == 0, result.stderr
    assert outputs(shaped) == outputs(plain)  # rows, token counts and parquet bytes
    # Not vacuous: rows chosen from rows in the agent's shape, none from the image decoy.
    texts = pq.read_table(shaped.file(SWE), columns=["messages"]).column(0).to_pylist()
    agent = {i for i, t in enumerate(texts) if "message_type" in t}
    image = {i for i, t in enumerate(texts) if "image_url" in t}
    chosen = {int(re.search(r"#(\d+)", r["source"])[1]) for r in outputs(shaped)[0]}
    assert len(chosen & agent) >= 3 and len(image) == 1 and not chosen & image


@pytest.mark.parametrize(
    "name, rel, column",
    [
        ("swe-smith", SWE, "messages"),
        ("mrcr", "openai/mrcr/2needle/2needle_0.parquet", "prompt"),
        ("mrcr", "openai/mrcr/2needle/2needle_1.parquet", "prompt"),
        ("nemotron-agentic", "nvidia/Nemotron-Agentic-v1/data/interactive_agent.jsonl", None),
        ("longwriter", "zai-org/LongWriter-6k/long.jsonl", None),
    ],
)
def test_an_image_part_drops_its_row_with_the_reason_shown(mini, tmp_path, name, rel, column):
    """Every row of the file given an image part: the slots fall short, and the one error line
    counts the rows under the reason (every row, where the reader converts them all)."""
    case = Case(mini, None, tmp_path, had_out=False)
    if column:
        json_text_rows(case, rel, column, with_image)
    else:
        jsonl_rows(case, rel, with_image)
    result = case.run("--only", name, "--quiet")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {name}: slot "), line
    counted = int(re.search(rf"(\d+) {build.NOT_TEXT}", line)[1])
    if name != "mrcr":  # read whole: each row dropped as it is read, before any slot looks
        path = case.file(rel)
        rows = pq.read_metadata(path).num_rows if column else len(path.read_bytes().splitlines())
        assert re.search(rf"0 of 0 candidates; rejected: {rows} {build.NOT_TEXT}$", line), line
    else:
        assert counted >= 1
    assert not case.out.exists()
