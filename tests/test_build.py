"""A whole build over the miniature sources: the card's composition, sha256 order, exact counts,
ids that resolve, and the same bytes whatever the thread count or hash seed."""

import hashlib
import json
import os
import subprocess
import sys
import unicodedata
from collections import Counter
from pathlib import Path

import golden
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

import build

REPO = Path(__file__).resolve().parents[1]

# The card's Composition table: source -> (smoke, standard, full).
CARD = {
    "longbench-pro": (2, 25, 12),
    "mrcr": (1, 5, 6),
    "swe-smith": (1, 12, 4),
    "nemotron-agentic": (1, 6, 0),
    "wildchat": (2, 17, 0),
    "gsm8k": (1, 4, 0),
    "numinamath": (1, 4, 4),
    "humaneval": (1, 3, 0),
    "mbpp": (1, 3, 0),
    "mimo": (2, 7, 6),
    "longwriter": (2, 4, 6),
    "gutenberg": (2, 6, 2),
}
BOOK_INSTRUCTION = {
    "en": "Continue the following text from where it stops.",
    "zh": "請從這段文字停下的地方接著寫下去。",
}


def run_build(mini, out, *extra, env=None):
    cmd = [sys.executable, str(REPO / "build.py"), str(mini.src), str(mini.tokenizer), str(out),
           "--rev", str(mini.rev), "--books", str(mini.books), "--quiet", *extra]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)


@pytest.fixture(scope="module")
def built(mini, tmp_path_factory):
    out = tmp_path_factory.mktemp("built") / "out"
    result = run_build(mini, out, "--jobs", "2")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    splits = {
        s: pq.read_table(out / f"{s}.parquet").to_pylist() for s in ("smoke", "standard", "full")
    }
    return out, manifest, splits


@pytest.fixture(scope="module")
def tokenizer(mini):
    return Tokenizer.from_file(str(mini.tokenizer))


def plain_tokens(tokenizer, messages):
    return sum(
        len(tokenizer.encode(m["content"], add_special_tokens=False).ids)
        for m in messages
        if isinstance(m["content"], str)
    )


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def pins(path):
    lines = [line.split("#", 1)[0].split() for line in Path(path).read_text().splitlines()]
    return [fields for fields in lines if fields]


# ------------------------------------------------------------------------------------------------


def test_splits_have_the_cards_rows_per_source(built):
    _, manifest, splits = built
    assert {s: len(rows) for s, rows in splits.items()} == {"smoke": 17, "standard": 96, "full": 40}
    counts = Counter((r["name"], r["split"]) for r in manifest["rows"])
    got = {name: tuple(counts[(name, s)] for s in ("smoke", "standard", "full")) for name in CARD}
    assert got == CARD


def test_the_readme_composition_table_is_the_cards(built):
    readme = (REPO / "README.md").read_text()
    table = readme.split("## Composition", 1)[1].split("\n\n")[1]
    rows = [line.split("|")[1:-1] for line in table.splitlines()[2:]]
    counts = [tuple(int(c.strip().replace("–", "0").strip("*")) for c in row[1:4]) for row in rows]
    assert counts[:-1] == list(CARD.values())
    assert counts[-1] == (17, 96, 40)


def test_rows_are_ordered_by_source_then_tokens_then_sha(built):
    _, manifest, _ = built
    order = list(CARD)
    for split in ("smoke", "standard", "full"):
        rows = [r for r in manifest["rows"] if r["split"] == split]
        keys = [(order.index(r["name"]), r["prompt_tokens"]) for r in rows]
        assert keys == sorted(keys)


def test_prompt_tokens_are_the_plain_count_of_every_row(built, tokenizer):
    _, manifest, splits = built
    for split, records in splits.items():
        rows = [r for r in manifest["rows"] if r["split"] == split]
        for record, row in zip(records, rows, strict=True):
            assert record["source"] == row["source"]
            messages = json.loads(record["messages"])
            assert plain_tokens(tokenizer, messages) == row["prompt_tokens"], row["source"]
            lo, hi = (int(x) for x in row["slot"].rsplit("[", 1)[1].rstrip("]").split(", "))
            assert lo <= row["prompt_tokens"] <= hi


def test_every_row_is_valid_openai_chat(built):
    _, _, splits = built
    for records in splits.values():
        for record in records:
            messages = json.loads(record["messages"])
            assert messages[-1]["role"] in ("user", "tool"), record["source"]
            calls = set()
            for m in messages:
                assert list(m)[:2] == ["role", "content"]
                assert set(m) <= {"role", "content", "name", "tool_calls", "tool_call_id"}
                assert isinstance(m["content"], str) or (
                    m["content"] is None and m["role"] == "assistant" and m.get("tool_calls")
                )
                for call in m.get("tool_calls", ()):
                    assert list(call) == ["id", "type", "function"] and list(call["function"]) == [
                        "name",
                        "arguments",
                    ]
                    assert isinstance(call["function"]["arguments"], str)
                    calls.add(call["id"])
                if m["role"] == "tool":
                    assert m["tool_call_id"] in calls, record["source"]
            if record["tools"] is not None:
                assert all(t["type"] == "function" for t in json.loads(record["tools"]))


def test_smoke_is_the_shortest_standard_row_of_each_source_and_group(built):
    _, manifest, _ = built
    standard = [r for r in manifest["rows"] if r["split"] == "standard"]
    smoke = [r for r in manifest["rows"] if r["split"] == "smoke"]
    groups = {"longbench-pro": ("English", "Chinese"), "wildchat": ("English", "Chinese"), "mimo": ("webdev", "music"),
              "longwriter": ("en", "zh"), "gutenberg": ("en", "zh")}  # fmt: skip
    want = []
    for name in CARD:
        for group in groups.get(name, (None,)):
            members = [r for r in standard if r["name"] == name and group in (None, r["group"])]
            want.append(
                min(members, key=lambda r: (r["prompt_tokens"], sha(r["source"].split(":")[0])))[
                    "source"
                ]
            )
    assert sorted(r["source"] for r in smoke) == sorted(want)


# ------------------------------------------------------------------------------------------------
# The chosen rows are the ones an independent walk in sha256 order predicts (six simple sources).


def rows_of(mini, repo):
    """(id, record) of every row of a repo's pinned parquet files, numbered across files."""
    out = []
    for kind, r, revision, path, *_ in pins(mini.rev):
        if r == repo and kind == "dataset":
            for record in pq.read_table(mini.src / repo / path).to_pylist():
                out.append((f"{repo}@{revision}#{len(out)}", record))
    return out


def predict(tokenizer, candidates, slots):
    """First fit in sha256 order: candidates are (id, filter fields, content); slots are
    (split, count, fields, lo, hi). Returns the set of (split, id) chosen."""
    filled = [[] for _ in slots]
    for cid, fields, content in sorted(candidates, key=lambda c: sha(c[0])):
        n = len(tokenizer.encode(content, add_special_tokens=False).ids)
        for i, (_, count, want, lo, hi) in enumerate(slots):
            if (
                len(filled[i]) < count
                and all(fields.get(k) == v for k, v in want.items())
                and lo <= n <= hi
            ):
                filled[i].append(cid)
                break
    assert all(len(f) == s[1] for f, s in zip(filled, slots)), (
        "the miniature sources fill every slot"
    )
    return {(s[0], cid) for f, s in zip(filled, slots) for cid in f}


def chosen(manifest, name):
    return {
        (r["split"], r["source"])
        for r in manifest["rows"]
        if r["name"] == name and r["split"] != "smoke"
    }


def test_gsm8k_humaneval_mbpp_follow_sha256_order(built, mini, tokenizer):
    _, manifest, _ = built
    gsm8k = [(cid, {}, r["question"]) for cid, r in rows_of(mini, "openai/gsm8k")]
    assert chosen(manifest, "gsm8k") == predict(tokenizer, gsm8k, [("standard", 4, {}, 1, 180_000)])
    humaneval = [
        (
            cid,
            {},
            "Complete the following Python function.\n\n```python\n"
            + r["prompt"]
            + ("" if r["prompt"].endswith("\n") else "\n")
            + "```",
        )
        for cid, r in rows_of(mini, "openai/openai_humaneval")
    ]
    assert chosen(manifest, "humaneval") == predict(
        tokenizer, humaneval, [("standard", 3, {}, 1, 180_000)]
    )
    mbpp = [
        (cid, {}, "You are an expert Python programmer, and here is your task: " + r["prompt"]
         + " Your code should pass these tests:\n\n" + "\n".join(r["test_list"]))
        for cid, r in rows_of(mini, "google-research-datasets/mbpp")
    ]  # fmt: skip
    assert chosen(manifest, "mbpp") == predict(tokenizer, mbpp, [("standard", 3, {}, 1, 180_000)])


def test_numinamath_takes_olympiads_only_full_first(built, mini, tokenizer):
    _, manifest, _ = built
    rows = [
        (cid, {}, r["problem"])
        for cid, r in rows_of(mini, "AI-MO/NuminaMath-1.5")
        if r["source"] == "olympiads" and r["synthetic"] is False
    ]
    slots = [("full", 4, {}, 32, 200), ("standard", 4, {}, 32, 200)]
    assert chosen(manifest, "numinamath") == predict(tokenizer, rows, slots)


def test_mimo_and_longwriter_follow_sha256_order_by_group(built, mini, tokenizer):
    _, manifest, _ = built
    mimo, n = [], 0
    for path, group in (("webdev.parquet", "webdev"), ("music.parquet", "music")):
        revision = next(p[2] for p in pins(mini.rev) if p[3] == path)
        for r in pq.read_table(mini.src / "XiaomiMiMo/MiMo-V2.6-RL-oss" / path).to_pylist():
            fields = {
                "group": group,
                "lang": r["extra_info"].get("lang") if group == "music" else None,
            }
            mimo.append(
                (f"XiaomiMiMo/MiMo-V2.6-RL-oss@{revision}#{n}", fields, r["prompt"][0]["content"])
            )
            n += 1
    slots = [("full", 3, {"group": "webdev"}, 1, 700), ("full", 2, {"group": "music", "lang": "en"}, 1, 700),
             ("full", 1, {"group": "music", "lang": "zh"}, 1, 700), ("standard", 4, {"group": "webdev"}, 1, 700),
             ("standard", 2, {"group": "music", "lang": "zh"}, 1, 700), ("standard", 1, {"group": "music", "lang": "en"}, 1, 700)]  # fmt: skip
    assert chosen(manifest, "mimo") == predict(tokenizer, mimo, slots)

    revision, path = next((p[2], p[3]) for p in pins(mini.rev) if p[1] == "zai-org/LongWriter-6k")
    longwriter, cuts = [], {}  # the prompt is the first message of a longer conversation: ":1"
    for i, line in enumerate((mini.src / "zai-org/LongWriter-6k" / path).read_text().splitlines()):
        messages = json.loads(line)["messages"]
        content = messages[0]["content"]
        cjk = sum(1 for ch in content if "\u3400" <= ch <= "\u4dbf" or "\u4e00" <= ch <= "\u9fff")
        cuts[f"zai-org/LongWriter-6k@{revision}#{i}"] = ":1" if len(messages) > 1 else ""
        longwriter.append(
            (
                f"zai-org/LongWriter-6k@{revision}#{i}",
                {"lang": "zh" if cjk >= 0.1 * len(content) else "en"},
                content,
            )
        )
    slots = [
        (split, n, {"lang": lang}, 1, 750)
        for split, n in (("full", 3), ("standard", 2))
        for lang in ("en", "zh")
    ]
    want = {(split, cid + cuts[cid]) for split, cid in predict(tokenizer, longwriter, slots)}
    assert chosen(manifest, "longwriter") == want


# ------------------------------------------------------------------------------------------------
# Every source id resolves to the row and the cut it claims.


def source_rows(mini):
    """id (without cut) -> the raw row, for every pinned dataset file, read independently."""
    table = {}
    numbered = Counter()
    for kind, repo, revision, path, *_ in pins(mini.rev):
        if kind != "dataset":
            continue
        file = mini.src / repo / path
        if file.suffix == ".parquet":
            records = pq.read_table(file).to_pylist()
        elif file.suffix == ".jsonl":
            records = [json.loads(line) for line in file.read_text().splitlines()]
        else:
            records = json.loads(file.read_text())
        for record in records:
            table[f"{repo}@{revision}#{numbered[repo]}"] = record
            numbered[repo] += 1
    return table


def conversation(name, record):
    """The source conversation as (role, content-as-string) pairs: text parts joined, an object
    as its JSON; None when a content part is not text (the row is no candidate)."""
    if name == "mrcr":
        messages = json.loads(record["prompt"])
    elif name == "swe-smith":
        messages = json.loads(record["messages"])
        messages = json.loads(messages) if isinstance(messages, str) else messages
    elif name == "wildchat":
        messages = record["conversation"]
    else:
        messages = record["messages"]
    pairs = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            if any(p["type"] != "text" for p in content):
                return None
            content = "".join(p["text"] for p in content)
        elif content is not None and not isinstance(content, str):
            content = json.dumps(content, ensure_ascii=False, separators=(",", ":"))
        pairs.append((m["role"], content))
    return pairs


def test_every_source_id_resolves_to_its_row_and_cut(built, mini):
    _, manifest, splits = built
    table = source_rows(mini)
    books = {f"{p[2]}@{p[3]}": (p[1], mini.src / p[2] / p[4]) for p in pins(mini.books)}
    for split, records in splits.items():
        rows = [r for r in manifest["rows"] if r["split"] == split]
        for record, row in zip(records, rows, strict=True):
            messages = json.loads(record["messages"])
            got = [(m["role"], m["content"]) for m in messages]
            if row["name"] == "gutenberg":
                book, span = row["source"].rsplit("#", 1)
                lang, path = books[book]
                start, end = map(int, span.split("-"))
                text = path.read_bytes().decode().replace("\r\n", "\n")
                assert got == [("user", BOOK_INSTRUCTION[lang] + "\n\n" + text[start:end])]
                assert "project gutenberg" not in text[start:end].lower()
                continue
            rid, _, k = row["source"].partition(":")
            source = table[rid]
            if row["name"] == "nemotron-agentic":  # tool schemas kept whole, in source key order
                compact = json.dumps(source["tools"], ensure_ascii=False, separators=(",", ":"))
                assert record["tools"] == compact
            else:
                assert record["tools"] is None
            if row["name"] in ("mrcr", "swe-smith", "nemotron-agentic", "wildchat"):
                whole = conversation(row["name"], source)
                if k:
                    assert whole[int(k)][0] == "assistant", (
                        "a cut stops right before an assistant turn"
                    )
                    whole = whole[: int(k)]
                assert [(r, c if c is not None else None) for r, c in got] == [
                    (r, c if c is not None or r == "assistant" else "") for r, c in whole
                ], row["source"]
            elif row["name"] == "longbench-pro":
                assert got == [
                    ("user", source["context"] + "\n\n\n\n" + source["question_thinking"])
                ]
            elif row["name"] == "longwriter":
                assert got == [("user", source["messages"][0]["content"])]
            elif row["name"] == "mimo":
                assert got == [(m["role"], m["content"]) for m in source["prompt"]]
            elif row["name"] == "gsm8k":
                assert got == [("user", source["question"])]
            elif row["name"] == "numinamath":
                assert got == [("user", source["problem"])]
                assert source["source"] == "olympiads" and source["synthetic"] is False
            elif row["name"] in ("humaneval", "mbpp"):
                assert source["prompt"] in got[0][1]


def test_cuts_are_the_longest_prefix_within_T(built, mini, tokenizer):
    _, manifest, _ = built
    table = source_rows(mini)
    for row in manifest["rows"]:
        if row["name"] != "swe-smith" or "cut(" not in row["slot"]:
            continue
        T = int(row["slot"].split("cut(")[1].split(")")[0])
        rid, _, k = row["source"].partition(":")
        whole = conversation("swe-smith", table[rid])
        counts = [len(tokenizer.encode(c, add_special_tokens=False).ids) for _, c in whole]
        k = int(k)
        assert sum(counts[:k]) == row["prompt_tokens"] <= T
        later = [j for j in range(k + 1, len(whole)) if whole[j][0] == "assistant"]
        assert not later or sum(counts[: later[0]]) > T, "the next cut point would be over T"


def test_the_longest_trajectories_agree_with_brute_force(built, mini, tokenizer):
    _, manifest, _ = built
    best = {}
    for rid, record in source_rows(mini).items():
        if not rid.startswith("SWE-bench/"):
            continue
        if (whole := conversation("swe-smith", record)) is None:
            continue
        k = max(i for i, (role, _) in enumerate(whole) if role == "assistant")
        n = sum(len(tokenizer.encode(c, add_special_tokens=False).ids) for _, c in whole[:k])
        entry = (-n, sha(rid), f"{rid}:{k}")
        if record["traj_id"] not in best or entry < best[record["traj_id"]]:
            best[record["traj_id"]] = entry
    want = {e[2] for e in sorted(best.values())[:4]}
    got = {
        r["source"] for r in manifest["rows"] if r["name"] == "swe-smith" and r["split"] == "full"
    }
    assert got == want


def test_wildchat_never_takes_a_toxic_redacted_or_single_turn_conversation(built, mini):
    _, manifest, _ = built
    table = source_rows(mini)
    firsts = Counter()
    for row in manifest["rows"]:
        if row["name"] == "wildchat" and row["split"] == "standard":
            source = table[row["source"].split(":")[0]]
            assert not source["toxic"] and not source["redacted"] and source["turn"] >= 2
            assert row["group"] == source["language"]
            firsts[source["conversation"][0]["content"]] += 1
    assert max(firsts.values()) == 1, "a first user message is used once"


def test_a_context_and_a_trajectory_are_used_once(built, mini):
    _, manifest, _ = built
    table = source_rows(mini)
    for name, key in (("longbench-pro", "context"), ("swe-smith", "traj_id")):
        used = Counter(
            table[r["source"].split(":")[0]][key]
            for r in manifest["rows"]
            if r["name"] == name and r["split"] != "smoke"
        )
        assert max(used.values()) == 1, name


# ------------------------------------------------------------------------------------------------
# Determinism


def test_two_builds_with_other_threads_and_hash_seed_give_the_same_bytes(built, mini, tmp_path):
    out, _, _ = built
    env = dict(os.environ, PYTHONHASHSEED="12345", RAYON_NUM_THREADS="1")
    again = tmp_path / "again"
    result = run_build(mini, again, "--jobs", "1", env=env)
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (out / name).read_bytes() == (again / name).read_bytes(), name


def test_the_fixture_build_matches_the_reviewed_golden_files(built, mini, tmp_path):
    """Every byte of the six files: the parquet files through --check against the golden sums,
    manifest.json, README.md and SHA256SUMS compared whole (tests/golden.py)."""
    out, _, _ = built
    expected = golden.files()
    sums = tmp_path / "SHA256SUMS"
    sums.write_bytes(expected["SHA256SUMS"])
    result = run_build(mini, tmp_path / "out", "--check", str(sums))
    review = "\n(if the change is intended, review the build, then: python tests/golden.py OUT)"
    assert result.returncode == 0, result.stderr + review
    for name, data in expected.items():
        assert (out / name).read_bytes() == data, name + review


def test_only_builds_just_the_named_sources(mini, tmp_path):
    result = run_build(mini, tmp_path / "out", "--only", "gsm8k,mbpp")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["only"] == ["gsm8k", "mbpp"]
    assert {r["name"] for r in manifest["rows"]} == {"gsm8k", "mbpp"}
    assert [i["repo"] for i in manifest["inputs"]] == [
        "openai/gsm8k",
        "google-research-datasets/mbpp",
    ]


def test_nfc_is_part_of_the_count(tokenizer):
    # The miniature tokenizer counts UTF-8 bytes after NFC, like the real one normalizes first.
    assert len(tokenizer.encode("e\u0301", add_special_tokens=False).ids) == len(
        unicodedata.normalize("NFC", "e\u0301").encode()
    )


def test_a_two_layer_swe_smith_row_reads_like_a_one_layer_row():
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    one = json.dumps(messages)
    assert build.swe_messages(json.dumps(one), "row") == build.swe_messages(one, "row") == messages


def test_longbench_rows_are_found_whatever_their_strings_hold():
    """The array is split into rows without a full parse: quotes, backslashes and brackets inside
    strings, compact or indented layout, must all give back exactly the rows a JSON parser sees."""
    tricky = [
        'say \\"hi\\"',
        "C:\\",
        "\\\\",
        '"',
        "}, {",
        "[[",
        "]]",
        "{",
        "中文「」",
        "\\u00e9",
        "",
    ]
    rows = [
        {"id": str(i), "context": "".join(tricky[(i + j) % len(tricky)] for j in range(i)),
         "answer": ["]", "{"], "meta": {"n": [i, {"deep": "}"}]}}
        for i in range(12)
    ]  # fmt: skip
    for indent in (None, 2):
        data = json.dumps(rows, indent=indent, ensure_ascii=False).encode()
        spans = build.json_array_elements(data, "rows.json")
        assert [json.loads(data[a:b]) for a, b in spans] == rows
    data = json.dumps(rows).encode()
    for cut in (data.index(b"say") + 2, len(data) - 1):  # inside a string; before the last ]
        with pytest.raises(build.BuildError, match="not JSON"):
            build.json_array_elements(data[:cut], "rows.json")


@pytest.mark.parametrize("window", [1, 40_000, 10**9])
def test_mrcr_reads_once_keeping_the_first_rows_in_sha256_order(mini, monkeypatch, window):
    """The one pass over MRCR keeps the texts of the first rows in sha256 order that fit a loading
    window (at least one); whatever that window, the slots take the same rows."""
    tok = build.Tokens(mini.tokenizer, jobs=1)
    mrcr = build.SOURCES["mrcr"]
    files = build.source_files(mrcr, build.read_pins(mini.rev, "rev"), [])
    for pin in files:
        pin.file = mini.src / pin.repo / pin.path

    def select(window):
        monkeypatch.setattr(build, "WINDOW_BYTES", window)
        cands = list(build.read_mrcr(mrcr, files, Counter()))
        loaded = {c.id for c in cands if c.messages is not None}
        rows = build.select(mrcr, cands, Counter(), tok)
        return cands, loaded, [r.candidate.id for r in rows]

    cands, loaded, rows = select(window)
    want, size = set(), 0
    for c in sorted(cands, key=lambda c: c.key):
        if want and size + c.size > window:
            break
        want.add(c.id)
        size += c.size
    assert loaded == want
    assert rows == select(10**9)[2]
