"""The miniature sources have the real formats, fill every slot, and are reproducible."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import unicodedata
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from make_sources import (
    REPO_ROOT,
    SCHEMAS,
    census,
    make_sources,
    make_tokenizer,
    read_books,
    read_rev,
    schema_for,
)
from tokenizers import Tokenizer

S, I64, B = pa.string(), pa.int64(), pa.bool_()


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


def test_parquet_schemas(mini):
    files = _files(mini, ".parquet")
    assert len(files) == 12
    for e, path in files:
        schema = pq.read_schema(path)
        assert schema.equals(schema_for(e["repo"], e["path"])), path
        assert b"pandas" not in (schema.metadata or {})
    spelled = {
        "openai/mrcr": {"prompt": S, "n_needles": I64, "desired_msg_index": I64, "n_chars": I64},
        "SWE-bench/SWE-smith-trajectories": {"messages": S, "resolved": B, "traj_id": S},
        "openai/gsm8k": {"question": S, "answer": S},
        "AI-MO/NuminaMath-1.5": {"problem": S, "source": S, "synthetic": B},
        "openai/openai_humaneval": {"task_id": S, "prompt": S, "entry_point": S},
        "google-research-datasets/mbpp": {
            "task_id": pa.int32(),
            "test_imports": pa.list_(S),
            "test_list": pa.list_(S),
        },
        "allenai/WildChat-4.8M": {"turn": I64, "language": S, "toxic": B, "redacted": B},
    }
    for e, path in files:
        schema = pq.read_schema(path)
        for name, typ in spelled.get(e["repo"], {}).items():
            assert schema.field(name).type == typ, (path, name)
    wildchat = pq.read_schema(_files(mini, "train-00000-of-00086.parquet")[0][1])
    turn = wildchat.field("conversation").type.value_type
    names = {turn.field(i).name for i in range(turn.num_fields)}
    assert {
        "content",
        "role",
        "language",
        "toxic",
        "redacted",
        "turn_identifier",
        "timestamp",
        "created",
        "header",
        "hashed_ip",
        "country",
        "state",
        "openai_id",
        "temperature",
        "top_p",
        "token_counter",
        "system_fingerprint",
        "usage",
    } <= names
    for e, path in _files(mini, ".parquet"):
        if e["repo"] == "XiaomiMiMo/MiMo-V2.6-RL-oss":
            schema = pq.read_schema(path)
            prompt = pa.list_(pa.struct([("role", S), ("content", S)]))
            assert schema.field("prompt").type == prompt
            assert pa.types.is_struct(schema.field("extra_info").type)
            assert pa.types.is_struct(schema.field("reward_model").type)
            extra = {f.name for f in schema.field("extra_info").type}
            want = {"instance_json"} if "webdev" in e["path"] else {"src_id", "lang", "length"}
            assert want <= extra
    assert set(SCHEMAS) >= {"openai/mrcr", "allenai/WildChat-4.8M"}


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
            assert [m["role"] for m in msgs[:2]] == ["user", "assistant"]
            assert msgs[-1]["role"] == "user"
            assert row["total_messages"] == len(msgs)
            assert row["answer"].startswith(row["random_string_to_prepend"])


def test_swe_smith_has_one_and_two_json_layers(mini):
    ((_, path),) = [f for f in _files(mini, ".parquet") if "xml-" in str(f[1])]
    rows = pq.read_table(path).to_pylist()
    layers = {1: 0, 2: 0}
    for r in rows:
        msgs = json.loads(r["messages"])
        if isinstance(msgs, str):
            layers[2] += 1
            msgs = json.loads(msgs)
        else:
            layers[1] += 1
        assert msgs[0]["role"] == "system" and msgs[-1]["role"] == "assistant"
        assert all(set(m) == {"role", "content"} for m in msgs)
        assert any("<function=" in m["content"] for m in msgs if m["role"] == "assistant")
    assert layers[1] and layers[2]
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
    assert any(
        m["reasoning_content"] for r in rows for m in r["messages"] if m["role"] == "assistant"
    )
    tools = [m for r in rows for m in r["messages"] if m["role"] == "tool"]
    assert all("tool_call_id" in m for m in tools)
    assert any(not isinstance(m["content"], str) for m in tools)
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
        assert scan["filter"] + scan["range"] + scan["unique"] > 0, name
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
