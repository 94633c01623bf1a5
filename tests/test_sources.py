"""The miniature sources have the real formats, fill every slot, and are reproducible."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import unicodedata
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from make_sources import (
    FORMATS,
    REPO_ROOT,
    census,
    check_file,
    make_sources,
    make_tokenizer,
    read_books,
    read_rev,
)
from tokenizers import Tokenizer

S, I64, B = pa.string(), pa.int64(), pa.bool_()
SWE_PATH = "SWE-bench/SWE-smith-trajectories/data/xml-00000-of-00008.parquet"


def _declared(root: Path):
    """(source, file declaration, generated path) of every file the pins name."""
    rev, books = read_rev(root / "REV"), read_books(root / "BOOKS")
    for name, source in FORMATS.items():
        pins = books if source.repo is None else [e for e in rev if e["repo"] == source.repo]
        assert [p["path"] for p in pins] == [f.path for f in source.files], name
        for pin, file in zip(pins, source.files):
            yield name, file, root / "src" / pin["repo"] / pin["path"]


def _files(mini, suffix):
    return [
        (e, mini.src / e["repo"] / e["path"])
        for e in read_rev(mini.rev)
        if e["kind"] == "dataset" and e["path"].endswith(suffix)
    ]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- tokenizer


def test_tokenizer_counts_bytes_and_is_stable(tmp_path):
    a = make_tokenizer(tmp_path / "a.json").read_bytes()
    b = make_tokenizer(tmp_path / "b.json").read_bytes()
    assert a == b
    tok = Tokenizer.from_file(str(tmp_path / "a.json"))
    assert tok.get_vocab_size() == 257
    assert tok.token_to_id("<|endoftext|>") == 256
    for text in ["plain", "e\u0301 \u212b", "\u3000\u3000第一回", "x\r\n\r\n  y\t", "\U0001f600!"]:
        n = len(tok.encode(text, add_special_tokens=False).ids)
        assert n == len(unicodedata.normalize("NFC", text).encode())


def test_tokenizer_matches_qwen_pre_tokenizer(tmp_path, qwen_tokenizer):
    ours = json.loads(make_tokenizer(tmp_path / "t.json").read_text())
    qwen = json.loads(qwen_tokenizer.read_text())
    assert ours["normalizer"] == qwen["normalizer"]
    assert ours["pre_tokenizer"] == qwen["pre_tokenizer"]
    assert ours["decoder"] == qwen["decoder"]


# --------------------------------------------------------------------------- pins


def test_pins_match_the_generated_files(mini):
    rev, real_rev = read_rev(mini.rev), read_rev(REPO_ROOT / "REV")
    assert [(e["kind"], e["repo"], e["revision"], e["path"]) for e in rev] == [
        (e["kind"], e["repo"], e["revision"], e["path"]) for e in real_rev
    ]
    for e in rev:
        path = mini.src / e["repo"] / e["path"]
        assert path.stat().st_size == int(e["bytes"]), path
        assert _sha256(path) == e["sha256"], path
    assert _sha256(mini.src / "Qwen/Qwen3.8-27B/tokenizer.json") == _sha256(mini.tokenizer)
    books, real_books = read_books(mini.books), read_books(REPO_ROOT / "BOOKS")
    keep = ("ebook", "lang", "repo", "commit", "path", "title")
    assert [[b[k] for k in keep] for b in books] == [[b[k] for k in keep] for b in real_books]
    for b in books:
        path = mini.src / b["repo"] / b["path"]
        assert path.stat().st_size == int(b["bytes"])
        assert _sha256(path) == b["sha256"]
    comments = [ln for ln in (REPO_ROOT / "REV").read_text().splitlines() if ln.startswith("#")]
    assert comments == [ln for ln in mini.rev.read_text().splitlines() if ln.startswith("#")]


# --------------------------------------------------------------------------- formats


def test_the_declarations_name_every_pinned_file_in_pin_order(mini):
    import build

    assert list(FORMATS) == list(build.SOURCES)
    kinds = Counter(file.kind for _, file, _ in _declared(mini.root))
    assert kinds == {"parquet": 12, "json-array": 1, "jsonl": 2, "text": 8}


def test_every_miniature_file_matches_its_declaration(mini):
    for name, file, path in _declared(mini.root):
        assert check_file(file, path) == [], (name, path)
        if file.kind == "parquet":
            assert b"pandas" not in (pq.read_schema(path).metadata or {})


def test_the_full_size_writes_the_declared_formats_reproducibly(tmp_path):
    """The full size's rows go through the same declarations (a few rows a file, cheaply), the
    same bytes whether one process writes them or two."""
    names = [n for n in FORMATS if n != "gutenberg"]
    make_sources(tmp_path / "src", scale="full", only=names, limit=3)
    make_sources(tmp_path / "again", scale="full", only=names, limit=3, jobs=2)
    for name, file, path in _declared(REPO_ROOT):
        if name != "gutenberg":
            ours = tmp_path / path.relative_to(REPO_ROOT)
            assert check_file(file, ours, limit=3) == [], name
            assert (
                ours.read_bytes()
                == (tmp_path / "again" / ours.relative_to(tmp_path / "src")).read_bytes()
            )


def test_a_departure_from_the_declaration_is_reported(mini, tmp_path):
    """The check is not vacuous: an undeclared field, a wrong kind, a missing JSON layer."""
    (longwriter,) = FORMATS["longwriter"].files
    rows = [json.loads(line) for line in (mini.src / "zai-org/LongWriter-6k/long.jsonl").open()]
    rows[3]["messages"][0]["name"] = "x"
    rows[4]["messages"][1]["content"] = 7
    bad = tmp_path / "long.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    problems = check_file(longwriter, bad)
    assert any("['name'] undeclared" in p for p in problems)
    assert any("messages.content: int64, declared string" in p for p in problems)
    mrcr = FORMATS["mrcr"].files[0]
    table = pq.read_table(mini.src / "openai/mrcr" / mrcr.path)
    flat = table.set_column(0, "prompt", pa.array(['"not a list"'] * len(table)))
    pq.write_table(flat, tmp_path / "m.parquet")
    assert any(
        "prompt: string, declared list" in p for p in check_file(mrcr, tmp_path / "m.parquet")
    )
    pq.write_table(table.drop(["date_added"]), tmp_path / "n.parquet")
    assert check_file(mrcr, tmp_path / "n.parquet")[0].endswith(str(mrcr.schema))
    # Exact both ways: a declared kind no row has (SWE-smith without its two-layer rows).
    (swe,) = FORMATS["swe-smith"].files
    table = pq.read_table(mini.src / SWE_PATH)
    one_layer = table.filter(
        pa.array([not m.startswith('"') for m in table["messages"].to_pylist()])
    )
    pq.write_table(one_layer, tmp_path / "s.parquet")
    assert check_file(swe, tmp_path / "s.parquet") == [
        f"{tmp_path / 's.parquet'}: messages is declared string but no row has one"
    ]
    # ... and a field of a type the path varies over (content parts without the image decoy).
    no_image = table.filter(pa.array(["image_url" not in m for m in table["messages"].to_pylist()]))
    pq.write_table(no_image, tmp_path / "i.parquet")
    assert check_file(swe, tmp_path / "i.parquet") == [
        f"{tmp_path / 'i.parquet'}: messages.content.image_url is declared struct but no row has one",
        f"{tmp_path / 'i.parquet'}: messages.content.image_url.url is declared string but no row has "
        "one",
    ]


def test_longbench_is_one_json_array(mini):
    ((_, path),) = _files(mini, ".json")
    raw = path.read_bytes()
    assert raw.lstrip().startswith(b"[")
    rows = json.loads(raw)
    fields = {
        "id",
        "context",
        "language",
        "token_length",
        "primary_task",
        "secondary_task",
        "contextual_requirement",
        "question_nonthinking",
        "question_thinking",
        "answer",
        "difficulty",
    }
    assert all(set(r) == fields for r in rows)
    assert {r["language"] for r in rows} == {"English", "Chinese"}
    assert {r["token_length"] for r in rows} == {"8k", "16k", "32k", "64k", "128k", "256k"}
    assert len({r["id"] for r in rows}) == len(rows)
    assert len({r["context"] for r in rows}) < len(rows)  # documents recur
    assert all(isinstance(r["answer"], list) for r in rows)


def test_mrcr_prompts_are_json_strings(mini):
    files = _files(mini, ".parquet")
    mrcr = [p for e, p in files if e["repo"] == "openai/mrcr"]
    assert len(mrcr) == 2
    for path in mrcr:
        for row in pq.read_table(path).to_pylist():
            msgs = json.loads(row["prompt"])
            # The few-shot user turn, then the first ask: two user turns in a row.
            assert [m["role"] for m in msgs[:3]] == ["user", "user", "assistant"]
            assert "======EXAMPLE======" in msgs[0]["content"]
            assert msgs[-1]["role"] == "user"
            assert row["total_messages"] == len(msgs)
            answer = row["random_string_to_prepend"] + msgs[row["desired_msg_index"]]["content"]
            assert row["answer"] == answer
            assert row["n_chars"] == sum(len(m["content"]) for m in msgs)


def test_swe_smith_has_one_and_two_json_layers_and_the_agents_content_parts(mini):
    ((_, path),) = [f for f in _files(mini, ".parquet") if "xml-" in str(f[1])]
    rows = pq.read_table(path).to_pylist()
    layers, shapes = Counter(), Counter()
    for r in rows:
        msgs = json.loads(r["messages"])
        if isinstance(msgs, str):
            msgs = json.loads(msgs)
        layers[1 if r["messages"].startswith("[") else 2] += 1
        assert msgs[0]["role"] == "system" and msgs[-1]["role"] == "assistant"
        agent = "message_type" in msgs[0]
        assert all(set(m) == ({"role", "content"} | ({"message_type"} if agent else set()))
                   for m in msgs)  # fmt: skip
        assert any("<function=" in m["content"] for m in msgs if m["role"] == "assistant")
        parts = [p for m in msgs if isinstance(m["content"], list) for p in m["content"]]
        assert bool(parts) == agent
        kinds = {p["type"] for p in parts}
        shapes["image" if "image_url" in kinds else "text parts" if agent else "strings"] += 1
        assert any("cache_control" in p for p in parts) == agent
    assert layers[1] and layers[2]
    assert shapes["strings"] and shapes["text parts"] and shapes["image"] == 1
    assert len({r["traj_id"] for r in rows}) < len(rows)  # duplicated traj_id


def test_nemotron_jsonl_has_the_real_quirks(mini):
    ((_, path),) = _files(mini, ".jsonl")[:1]
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    assert all(
        set(r) == {"uuid", "messages", "tools", "license", "used_in", "reasoning"} for r in rows
    )
    shapes = {
        json.dumps(t["function"]["parameters"], sort_keys=True) for r in rows for t in r["tools"]
    }
    assert len(shapes) > 3  # parameter schemas differ between rows
    calls = [m for r in rows for m in r["messages"] if m["role"] == "assistant" and m["tool_calls"]]
    assert {m["content"] for m in calls} == {None, ""}
    assert not any("reasoning_content" in m for r in rows for m in r["messages"])
    tools = [m for r in rows for m in r["messages"] if m["role"] == "tool"]
    assert all("tool_call_id" in m for m in tools)
    # Structured results: the JSON text of an object in some rows, the object in others.
    assert any(isinstance(m["content"], dict) for m in tools)
    assert any(m["content"].startswith("{") for m in tools if isinstance(m["content"], str))
    for m in calls:
        for c in m["tool_calls"]:
            assert isinstance(json.loads(c["function"]["arguments"]), dict)


def test_wildchat_has_decoys(mini):
    ((_, path),) = [f for f in _files(mini, ".parquet") if "WildChat" in str(f[1])]
    rows = pq.read_table(path).to_pylist()
    assert any(r["toxic"] for r in rows) and any(r["redacted"] for r in rows)
    assert any(r["turn"] < 2 for r in rows)
    assert {"English", "Chinese", "Russian", "Japanese"} <= {r["language"] for r in rows}
    for r in rows:
        assert r["turn"] == sum(1 for m in r["conversation"] if m["role"] == "user")


def test_mimo_music_rows_have_no_instance_json_and_chinese_tags(mini):
    music = pq.read_table(mini.src / "XiaomiMiMo/MiMo-V2.6-RL-oss/music.parquet").to_pylist()
    assert {r["extra_info"]["lang"] for r in music} == {"en", "zh"}
    for r in music:
        assert "instance_json" not in r["extra_info"] and r["extra_info"]["nvoice_want"] >= 1
        assert re.search("[\u4e00-\u9fff]", r["extra_info"]["tag"])
    web = pq.read_table(mini.src / "XiaomiMiMo/MiMo-V2.6-RL-oss/webdev.parquet").to_pylist()
    for r in web:
        assert json.loads(r["extra_info"]["instance_json"])["instance_id"].startswith("webdev_")


def test_longwriter_lines(mini):
    ((_, path),) = [f for f in _files(mini, ".jsonl") if "long.jsonl" in str(f[1])]
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        assert list(row) == ["messages"]
        assert [m["role"] for m in row["messages"]] == ["user", "assistant"]


def test_synthetic_books_have_the_real_quirks(mini):
    books = {b["ebook"]: mini.src / b["repo"] / b["path"] for b in read_books(mini.books)}
    raw = {k: p.read_bytes() for k, p in books.items()}
    assert b"\r\n" in raw["1228"] and b"\n" not in raw["1228"].replace(b"\r\n", b"")
    text = {k: v.decode("utf-8").replace("\r\n", "\n") for k, v in raw.items()}
    assert "*** START OF THIS PROJECT GUTENBERG EBOOK" in text["1228"]
    assert "*** START OF THE PROJECT GUTENBERG EBOOK BLEAK\nHOUSE ***" in text["1023"]
    assert "E-BOOK" in text["23863"] and "*** start of the project" in text["23950"]
    assert "End of the Project Gutenberg EBook of" in text["23863"]
    assert "End of Project Gutenberg's" in text["23950"]
    assert "START OF" not in text["3300"]
    for k in ("145", "23962", "24264"):
        assert "*** END OF TH" in text[k] and "FULL LICENSE" in text[k]
    assert all("\n\u3000\u3000" in text[k] for k in ("23863", "23950", "23962", "24264"))
    assert any("\n    \n" in t for t in text.values())  # a line of spaces only


# --------------------------------------------------------------------------- sizes


def test_every_slot_fills_with_candidates_to_spare(mini):
    result = census(mini.src, mini.tokenizer, rev=mini.rev, books=mini.books)
    assert len(result) == 12
    single = {("mrcr", "full"), ("gutenberg", "full")}
    for name, info in result.items():
        for slot, count, fitting, filled in info["slots"]:
            assert filled == count, (name, slot)
            spare = 1 if (name, slot.split()[0]) in single else 2
            assert fitting >= spare * count, (name, slot, fitting)
    for name in ("longbench-pro", "swe-smith", "wildchat", "numinamath", "mimo", "longwriter"):
        scan = result[name]["scan"]
        assert scan["filter"] + scan["range"] + scan["unique"] + scan["dropped"] > 0, name
    for name in ("longbench-pro", "swe-smith", "wildchat"):
        assert result[name]["scan"]["unique"] > 0, name


def test_byte_count_shortcut_is_exact(mini):
    tok = Tokenizer.from_file(str(mini.tokenizer))
    ((_, path),) = [f for f in _files(mini, ".parquet") if "WildChat" in str(f[1])]
    texts = [m["content"] for r in pq.read_table(path).to_pylist() for m in r["conversation"]]
    for text, enc in zip(texts, tok.encode_batch(texts, add_special_tokens=False)):
        assert len(enc.ids) == len(unicodedata.normalize("NFC", text).encode())


# --------------------------------------------------------------------------- determinism


def test_command_line_reproduces_the_fixture_byte_for_byte(mini, tmp_path):
    dest = tmp_path / "again"
    script = Path(__file__).resolve().parent / "make_sources.py"
    subprocess.run([sys.executable, str(script), str(dest)], check=True, capture_output=True)
    ours = sorted(p.relative_to(mini.root) for p in mini.root.rglob("*") if p.is_file())
    theirs = sorted(p.relative_to(dest) for p in dest.rglob("*") if p.is_file())
    assert ours == theirs
    for rel in ours:
        assert (mini.root / rel).read_bytes() == (dest / rel).read_bytes(), rel


def test_real_books_are_copied_byte_for_byte(tmp_path, realdata):
    tokenizer = make_tokenizer(tmp_path / "tokenizer.json")
    make_sources(tmp_path / "src", tokenizer, books_dir=realdata / "books", realdata=realdata)
    for b in read_books(REPO_ROOT / "BOOKS"):
        path = tmp_path / "src" / b["repo"] / b["path"]
        assert path.stat().st_size == int(b["bytes"])
        assert _sha256(path) == b["sha256"]
    gsm = pq.read_table(tmp_path / "src/openai/gsm8k/main/test-00000-of-00001.parquet")
    first = json.loads((realdata / "gsm8k-test.jsonl").read_text().splitlines()[0])
    assert gsm.column("question")[0].as_py() == first["question"]


def test_sizes_follow_the_tokenizer(tmp_path, qwen_tokenizer):
    """Sized under the Qwen vocabulary, the narrow token ranges still fill."""
    make_sources(tmp_path / "src", qwen_tokenizer)
    narrow = {"nemotron-agentic", "wildchat", "numinamath", "mimo", "longwriter", "gsm8k"}
    result = census(tmp_path / "src", qwen_tokenizer, only=narrow)
    assert set(result) == narrow
    for source, info in result.items():
        for slot, count, fitting, filled in info["slots"]:
            assert filled == count and fitting >= 2 * count, (source, slot)
