#!/usr/bin/env python3
"""Full-size benchmark of build.py (DESIGN.md 6): generated sources in the real formats, timed.

Usage, from the repository root with the project's environment:

    .venv/bin/python bench/bench.py                    # generate (once) and benchmark
    .venv/bin/python bench/bench.py --generate-only    # just make, or check, the sources
    .venv/bin/python bench/bench.py --profile          # also cProfile the build, top functions
    .venv/bin/python bench/bench.py --build /tmp/x/build.py   # measure a modified copy

Options:
    --cache DIR        where the generated sources live (default: bench-data/ at the repository
                       root, git-ignored). Reused across runs when its STAMP matches the generator
                       version and the pin files' lists; --regenerate forces a new tree.
    --tokenizer PATH   tokenizer.json for the build (default: ../shared/tokenizers/qwen3.5-text.json
                       relative to the repository). On a fresh clone without it, pass any
                       Qwen-family tokenizer.json, e.g. the one fetch.sh downloads to
                       SRC/Qwen/Qwen3.8-27B/tokenizer.json. It is also copied into the tree.
    --build FILE       the build.py to measure (default: the repository's)
    --gen-jobs N       generator processes (default 2)
    --naive-budget B   bytes of candidate text per source that the naive builder really tokenizes
                       (default 3000000); the rest is extrapolated from it
    --skip-naive       do not run the naive builder (naive_s is then reported as nan)
    --profile          run the instrumented build under cProfile (DIR/profile.pstats)

Generating takes about 40 s with two processes and 2.5 GB of disk; a benchmark run about three
minutes (two builds, the floor's measurements and the naive builder). DIR also receives out/ and
out-instrumented/ (the two builds' outputs), a log and a JSON file per child process.

The generated tree (DIR/src) holds every file REV and BOOKS pin, at the same paths and within 10%
of the real sizes, in the real formats of SOURCES.md: the LongBench-Pro JSON array, the MRCR,
SWE-smith, WildChat, GSM8K, NuminaMath, HumanEval, MBPP and MiMo parquet files, the Nemotron and
LongWriter JSONL files, the eight books and the tokenizer. Text is real text recombined: paragraphs
of the four English and four Chinese books of ../shared/realdata/books (drawn with a fixed-seed
random.Random), GSM8K and HumanEval rows from ../shared/realdata for maths and code (the names a
function defines renamed per use). Russian text is the English text transliterated to Cyrillic,
Japanese the Chinese text with kana particles inserted. Without ../shared/realdata the generator
falls back to synthetic words (same formats and sizes, less realistic token density) and writes
synthetic books. Generation is deterministic: the same tree, byte for byte, on every run.
Choices where the real files are not known: the MRCR files are written as pandas writes them (one
row group, dictionary encoding on, snappy), which makes reading a file's `prompt` column cost about
1.3 GB of Arrow memory; the SWE-smith shard (size unpublished) gets 3,300 rows, about 26k rows over
8 shards, trajectories of 3k to 190k tokens, 8.5% of traj_ids stored twice, 1% double-encoded.
DIR/REV and DIR/BOOKS pin the generated files (same order and format as the repository's pin
files, real sizes and sha256); DIR/STAMP records the generator version and the file list.

The benchmark then:
  1. measures the floor's parts: sha256 of every input (as the build's verify does), the reading
     any builder must do (parse the JSON and JSONL files, read the needed parquet columns into
     Arrow, decode the books), and the tokenizer's two-thread throughput (encode_batch_fast on
     batches of 8 chunks of 32,768 characters cut from each source's output rows; the best of
     three passes, each with a freshly loaded tokenizer so that its word cache never holds the
     text being timed, as in a build, which encodes each text once; or the build's own rate on
     that source when it was higher);
  2. runs `python build.py SRC TOK OUT --rev DIR/REV --books DIR/BOOKS --any-tokenizer --quiet` as
     a subprocess: wall time and peak RSS (os.wait4, through a small launcher process so that the
     peak is the build's own: Linux carries a process's peak RSS over fork and exec);
  3. runs the same build again in a child python that calls build.main with a build.Stats, the
     hook through which build.py reports tokens counted, tokenizer time and wall time per source
     (and, through its watch callback, the RSS per source); its outputs must equal the first
     run's byte for byte;
  4. runs a naive builder on the same candidates (build.py's readers): every candidate's whole
     prompt tokenized with plain `Tokenizer.encode`, really on a sample of each source and
     extrapolated to all candidates by their size (bytes of the row in the file where the reader
     gives them, else the byte bound; the output says so);
  5. prints floor = sha256 + reading + the sum over sources of tokens counted / throughput, the
     ratio wall / floor, the same floor with only the output rows' tokens (what a builder that
     counted nothing in vain would need), and ends with one line:
     bench: wall_s=<x> peak_rss_mib=<y> floor_s=<z> ratio=<wall/floor> naive_s=<n>
"""

import argparse
import builtins
import hashlib
import json
import keyword
import math
import multiprocessing
import os
import random
import re
import shutil
import string
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
REALDATA = SHARED / "realdata"
DEFAULT_TOKENIZER = ROOT / ".." / "shared" / "tokenizers" / "qwen3.5-text.json"
GENERATOR = "kern-prompts bench sources v1"
SEED = "kern-prompts bench"
MIB = 1 << 20
INF = float("inf")

# Characters per Qwen token of the recombined text (measured on the books), for sizing only.
CPT = {"en": 4.3, "zh": 1.17, "code": 2.7}


# ------------------------------------------------------------------------------------------------
# Real sizes and shapes (SOURCES.md). bytes None: take the size from the repository's REV.

EXPECT = {
    ("caskcsg/LongBench-Pro", "longbench_pro.json"): dict(rows=1_500),
    ("openai/mrcr", "2needle/2needle_0.parquet"): dict(rows=None),
    ("openai/mrcr", "2needle/2needle_1.parquet"): dict(rows=None),
    ("SWE-bench/SWE-smith-trajectories", "data/xml-00000-of-00008.parquet"): dict(rows=None),
    ("nvidia/Nemotron-Agentic-v1", "data/interactive_agent.jsonl"): dict(rows=19_028),
    ("allenai/WildChat-4.8M", "data/train-00000-of-00086.parquet"): dict(rows=37_208),
    ("openai/gsm8k", "main/test-00000-of-00001.parquet"): dict(rows=1_319),
    ("AI-MO/NuminaMath-1.5", "data/train-00000-of-00003.parquet"): dict(rows=298_739),
    ("AI-MO/NuminaMath-1.5", "data/train-00001-of-00003.parquet"): dict(rows=298_738),
    ("AI-MO/NuminaMath-1.5", "data/train-00002-of-00003.parquet"): dict(rows=298_738),
    ("openai/openai_humaneval", "openai_humaneval/test-00000-of-00001.parquet"): dict(rows=164),
    ("google-research-datasets/mbpp", "sanitized/test-00000-of-00001.parquet"): dict(rows=257),
    ("XiaomiMiMo/MiMo-V2.6-RL-oss", "webdev.parquet"): dict(rows=2_093),
    ("XiaomiMiMo/MiMo-V2.6-RL-oss", "music.parquet"): dict(rows=1_000),
    ("zai-org/LongWriter-6k", "long.jsonl"): dict(rows=6_000, bytes=149_000_000),
}
TOTAL_ROWS = {"openai/mrcr": 800, "AI-MO/NuminaMath-1.5": 896_215}
SWE_ROWS = 3_300  # the shard's row count is not published: about 26k rows over 8 shards
COLUMNS = {  # top-level parquet columns and their Arrow types (nested types abbreviated)
    "openai/mrcr": "prompt:string answer:string random_string_to_prepend:string n_needles:int64 "
    "desired_msg_index:int64 total_messages:int64 n_chars:int64",
    "SWE-bench/SWE-smith-trajectories": "messages:string instance_id:string resolved:bool "
    "model:string traj_id:string patch:string",
    "allenai/WildChat-4.8M": "conversation_hash:string model:string timestamp:timestamp "
    "conversation:list turn:int64 language:string openai_moderation:list detoxify_moderation:list "
    "toxic:bool redacted:bool state:string country:string hashed_ip:string header:struct",
    "openai/gsm8k": "question:string answer:string",
    "AI-MO/NuminaMath-1.5": "problem:string solution:string answer:string problem_type:string "
    "question_type:string problem_is_valid:string solution_is_valid:string source:string "
    "synthetic:bool",
    "openai/openai_humaneval": "task_id:string prompt:string canonical_solution:string "
    "test:string entry_point:string",
    "google-research-datasets/mbpp": "source_file:string task_id:int32 prompt:string code:string "
    "test_imports:list test_list:list",
    "XiaomiMiMo/MiMo-V2.6-RL-oss": "prompt:list data_source:string ability:string "
    "agent_name:string reward_model:struct extra_info:struct",
}


# ------------------------------------------------------------------------------------------------
# Text pools: real paragraphs, recombined deterministically.

CYRILLIC = str.maketrans(
    {
        **dict(zip("abcdefghijklmnopqrstuvwyz", "абцдефгхийклмнопкрстуввыз")),
        **dict(zip("ABCDEFGHIJKLMNOPQRSTUVWYZ", "АБЦДЕФГХИЙКЛМНОПКРСТУВВЫЗ")),
        "x": "кс",
        "X": "Кс",
    }
)
KANA = ["の", "は", "を", "に", "が", "て", "た", "で", "と", "も", "です", "ます", "した", "ない"]
SYLLABLES = "ka ri to mo ne sa lu vi en or an ith ter ble con ment al is ed ly pro re de".split()


def book_text(text):
    """The body of a Project Gutenberg text (between the markers, if any)."""
    text = text.replace("\r\n", "\n")
    if m := re.search(r"\*\*\*\s*START OF (?:THE|THIS) PROJECT GUTENBERG[^\n]*\n", text, re.I):
        text = text[m.end() :]
    m = re.search(
        r"^[^\n]*(\*\*\*\s*END OF (?:THE|THIS) PROJECT GUTENBERG|End of (?:the )?"
        r"Project Gutenberg)",
        text,
        re.I | re.M,
    )
    return text[: m.start()] if m else text


def paragraphs(text, lang):
    out = []
    for block in re.split(r"\n[ \t]*\n|\n(?=[ \t\u3000]{2,}\S)", book_text(text)):
        lines = [line.strip(" \t\u3000") for line in block.split("\n")]
        lines = [line for line in lines if line and not re.fullmatch(r"[-=*_ ]+", line)]
        para = (" " if lang == "en" else "").join(lines)
        if (
            len(para) >= (80 if lang == "en" else 30)
            and sum(c.isupper() for c in para) < len(para) / 4
        ):
            out.append(para)
    return out


def sentences(paras, lang):
    split = r"(?<=[.!?])\s+(?=[A-Z“\"])" if lang == "en" else r"(?<=[。！？])"
    return [s for p in paras for s in re.split(split, p) if 12 <= len(s) <= 400]


class Pool(list):
    def __init__(self, items):
        super().__init__(items)
        self.avg = sum(map(len, items)) / max(len(items), 1)


class Pools:
    """Everything generated text is drawn from; built once, in a fixed order."""

    def __init__(self):
        books = self.real_books()
        self.real = books is not None
        if books:
            en = [p for name, lang, text in books if lang == "en" for p in paragraphs(text, "en")]
            zh = [p for name, lang, text in books if lang == "zh" for p in paragraphs(text, "zh")]
        else:
            en, zh = synthetic_paragraphs()
        self.en, self.zh = Pool(en), Pool(zh)
        self.en_sent, self.zh_sent = Pool(sentences(en, "en")), Pool(sentences(zh, "zh"))
        words = sorted({w.lower() for p in en[:4000] for w in re.findall(r"[A-Za-z]{3,11}", p)})
        self.words = [w for w in words if not keyword.iskeyword(w)]
        self.humaneval = self.real_humaneval() or synthetic_humaneval()
        self.gsm8k = self.real_gsm8k() or synthetic_gsm8k(self)
        self.code = Pool(
            [r["prompt"] + r["canonical_solution"] for r in self.humaneval]
            + [r["test"].strip("\n") + "\n" for r in self.humaneval]
        )
        self.code_parts = [code_parts(block) for block in self.code]

    @staticmethod
    def real_books():
        order = [line.split() for line in pin_lines(ROOT / "BOOKS")]
        books = []
        for fields in order:
            path = REALDATA / "books" / fields[4]
            if not path.is_file():
                return None
            books.append((fields[4], fields[1], path.read_bytes().decode("utf-8")))
        return books

    @staticmethod
    def real_humaneval():
        import gzip

        path = REALDATA / "HumanEval.jsonl.gz"
        if not path.is_file():
            return None
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    @staticmethod
    def real_gsm8k():
        path = REALDATA / "gsm8k-test.jsonl"
        if not path.is_file():
            return None
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def synthetic_paragraphs():
    rng = random.Random(SEED + ":synthetic")
    words = ["".join(rng.choices(SYLLABLES, k=rng.randint(1, 4))) for _ in range(6000)]
    hanzi = [chr(0x4E00 + rng.randrange(3000)) for _ in range(3000)]
    en, zh = [], []
    for _ in range(20_000):
        sent = [
            " ".join(rng.choices(words, k=rng.randint(5, 25))).capitalize() + "."
            for _ in range(rng.randint(2, 8))
        ]
        en.append(" ".join(sent))
        zh.append(
            "，".join(
                "".join(rng.choices(hanzi, k=rng.randint(4, 12))) for _ in range(rng.randint(3, 12))
            )
            + "。"
        )
    return en, zh


def synthetic_humaneval():
    rows = []
    for i in range(164):
        name = f"task_{i}"
        prompt = (
            f'def {name}(values: list, limit: int) -> list:\n    """ Return the values '
            f'below limit, in order.\n    >>> {name}([1, 5, 2], 3)\n    [1, 2]\n    """\n'
        )
        rows.append(
            dict(
                task_id=f"HumanEval/{i}",
                prompt=prompt,
                entry_point=name,
                canonical_solution="    return [v for v in values if v < limit]\n",
                test="\n\ndef check(candidate):\n    assert candidate([1, 5, 2], 3) == [1, 2]\n",
            )
        )
    return rows


def synthetic_gsm8k(pools):
    rng = random.Random(SEED + ":gsm8k")
    rows = []
    for _ in range(1319):
        a, b = rng.randint(2, 90), rng.randint(2, 90)
        q = " ".join(rng.choices(pools.en_sent, k=2)) + f" If she has {a} and buys {b}, how many?"
        rows.append(
            dict(question=q, answer=f"{a} + {b} = <<{a}+{b}={a + b}>>{a + b}\n#### {a + b}")
        )
    return rows


P = None  # the pools of this process


def pools():
    global P
    if P is None:
        P = Pools()
    return P


def rand(name):
    return random.Random(f"{SEED}:{name}")


def prose(rng, pool, n, sep="\n\n"):
    """About n characters of paragraphs drawn from pool (exactly n: the last one is cut)."""
    n = int(n)
    if n <= 0:
        return ""
    parts, size = [], 0
    while size < n:
        k = int((n - size) / (pool.avg + len(sep))) + 1
        batch = rng.choices(pool, k=k)
        parts += batch
        size += sum(map(len, batch)) + len(sep) * k
    return sep.join(parts)[:n].rstrip()


def sentence(rng, lang="en"):
    return rng.choice(pools().en_sent if lang == "en" else pools().zh_sent)


def lognormal(rng, median, sigma, lo, hi):
    return min(hi, max(lo, int(median * math.exp(rng.gauss(0, sigma)))))


def japanese(rng, text):
    out, i = [], 0
    while i < len(text):
        step = rng.randint(2, 4)
        out.append(text[i : i + step])
        if text[i + step - 1 : i + step] not in "，。！？「」：；" and rng.random() < 0.7:
            out.append(rng.choice(KANA))
        i += step
    return "".join(out).replace("，", "、")


def text_in(rng, lang, n, sep="\n\n"):
    """Text of a conversation language: English, Chinese, Russian, Japanese (others as English)."""
    p = pools()
    if lang == "Chinese":
        return prose(rng, p.zh, n, sep)
    if lang == "Japanese":
        return japanese(rng, prose(rng, p.zh, n * 0.7, sep))
    if lang == "Russian":
        return prose(rng, p.en, n, sep).translate(CYRILLIC)
    return prose(rng, p.en, n, sep)


PY_NAMES = (
    set(dir(builtins))
    | set(keyword.kwlist)
    | {"self", "cls", "List", "Dict", "Tuple", "Optional", "typing", "math", "str", "int"}
)


DEFINED = re.compile(
    r"\bdef\s+([A-Za-z_]\w*)|\bclass\s+([A-Za-z_]\w*)|^\s*([A-Za-z_]\w*)\s*(?:[-+*/%]?=)(?!=)|\bfor\s+([A-Za-z_]\w*)(?:\s*,\s*([A-Za-z_]\w*))?\s+in\b"
    r"|\blambda\s+([A-Za-z_]\w*)|[(,]\s*([A-Za-z_]\w*)\s*(?::[^,)]*)?(?=[,)])",
    re.M,
)


def code_parts(block):
    """A code block split into [text, name, text, name, ..., text] at the names it defines."""
    names = sorted({n for m in DEFINED.finditer(block) for n in m.groups() if n} - PY_NAMES)
    if not names:
        return [block]
    pattern = r"\b(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")\b"
    return re.split(pattern, block)


def code_block(rng):
    """A real Python function or test with the names it defines renamed (consistently)."""
    p = pools()
    parts = rng.choice(p.code_parts)
    names = {}
    out = list(parts)
    for i in range(1, len(parts), 2):
        word = parts[i]
        if word not in names:
            new = rng.choices(p.words, k=rng.choice((1, 2, 2)))
            names[word] = (
                "".join(w.capitalize() for w in new) if word[0].isupper() else "_".join(new)
            )
        out[i] = names[word]
    return "".join(out)


def code_text(rng, n):
    parts, size = [], 0
    while size < n:
        block = code_block(rng)
        parts.append(block)
        size += len(block) + 2
    return "\n\n".join(parts)


def numbered(text, start=1):
    return "\n".join(f"{i:6}\t{line}" for i, line in enumerate(text.split("\n"), start))


def hexid(rng, n):
    return "".join(rng.choices("0123456789abcdef", k=n))


def snake(rng, k=2):
    return "_".join(rng.choices(pools().words, k=k))


# ------------------------------------------------------------------------------------------------
# Writers


def write_parquet(table, path, row_group_size=None, compression="snappy"):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".part")
    pq.write_table(table, tmp, row_group_size=row_group_size, compression=compression)
    os.replace(tmp, path)


def open_part(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path.with_suffix(path.suffix + ".part"), "wb")


def close_part(f, path):
    f.close()
    os.replace(path.with_suffix(path.suffix + ".part"), path)


# ------------------------------------------------------------------------------------------------
# LongBench-Pro: one JSON array of 1,500 flat objects, contexts sized like their bucket.

LB_BUCKETS = [
    ("8k", 8_000),
    ("16k", 16_000),
    ("32k", 32_000),
    ("64k", 64_000),
    ("128k", 128_000),
    ("256k", 256_000),
]
LB_TASKS = {
    "T1 Retrieval & Ranking": ["T1.1 Global Cohesive Retrieval", "T1.2 Key-Snippet Retrieval"],
    "T2 Sequencing & Structure": ["T2.1 Global Timeline", "T2.2 Local Causal Chain"],
    "T3 Evidence-Grounded QA": ["T3.1 Single-Hop Fact QA", "T3.2 Multi-Hop Fact QA"],
    "T4 Summarization & Synthesis": ["T4.1 Global-Coverage Summary", "T4.2 Query-Focused Summary"],
    "T5 Attribution & Citation": ["T5.1 Full-Sentence Citation", "T5.2 Key-Claim Citation"],
    "T6 Aggregation & Clustering": ["T6.1 Large-Scale Clustering", "T6.2 Targeted Counting"],
    "T7 Consistency & Compliance": ["T7.1 Global Conflict Detection", "T7.2 Rule Compliance"],
    "T8 Structured Numeric Reasoning": ["T8.1 Statistics", "T8.2 Multi-Level Computation"],
    "T9 Version & Code Diff": ["T9.1 Dependency Reasoning", "T9.2 Version Diff"],
    "T10 Rule Induction": ["T10.1 Rule Extraction", "T10.2 Rule Application"],
    "T11 Dialogue Memory": ["T11.1 Long-Range Entity Tracking", "T11.2 Long-Range Preference"],
}
LB_DISTINCT = 92  # distinct contexts per (bucket, language): 12 x 92 = 1,104


def lb_question(rng, lang, thinking):
    if lang == "English":
        q = " ".join(rng.choice(pools().en_sent) for _ in range(rng.randint(1, 3)))
        head = "Please read the above text carefully and answer the question below.\n\n"
        tail = (
            "Think step by step, then give the final answer on the last line in the form "
            "[Answer]: <answer>."
            if thinking
            else "Output the final answer directly in the form [Answer]: <answer>."
        )
        return f"{head}Question: {q}\n\n{tail}"
    q = "".join(rng.choice(pools().zh_sent) for _ in range(rng.randint(1, 3)))
    head = "請仔細閱讀上面的文本並回答下面的問題。\n\n"
    tail = (
        "請逐步思考，然後在最後一行以「[答案]：<答案>」的格式給出最終答案。"
        if thinking
        else "請直接以「[答案]：<答案>」的格式輸出最終答案。"
    )
    return f"{head}問題：{q}\n\n{tail}"


def lb_context(seed, lang, chars):
    rng = random.Random(seed)
    pool = pools().en if lang == "English" else pools().zh
    docs, size = [], 0
    while size < chars:
        n = min(chars - size, lognormal(rng, chars / 3, 0.7, 2_000, chars))
        title = sentence(rng, "en" if lang == "English" else "zh")[:60]
        doc = f"## {title}\n\n" + prose(rng, pool, n)
        docs.append(doc)
        size += len(doc) + 2
    return "\n\n".join(docs)


def gen_longbench(src):
    rng = rand("longbench")
    specs = []
    for bucket, tokens in LB_BUCKETS:
        for lang in ("English", "Chinese"):
            cpt = CPT["en" if lang == "English" else "zh"]
            contexts = [
                (f"{SEED}:lb:{bucket}:{lang}:{i}", int(tokens * rng.uniform(0.9, 1.28) * cpt))
                for i in range(LB_DISTINCT)
            ]
            use = contexts + [rng.choice(contexts) for _ in range(125 - LB_DISTINCT)]
            specs += [(bucket, lang, seed, chars) for seed, chars in use]
    rng.shuffle(specs)
    path = src / "caskcsg/LongBench-Pro/longbench_pro.json"
    f = open_part(path)
    f.write(b"[\n")
    for i, (bucket, lang, seed, chars) in enumerate(specs):
        primary = rng.choice(sorted(LB_TASKS))
        n_answers = rng.choice((1, 1, 1, 2, 3, 5))
        answers = [
            sentence(rng, "en" if lang == "English" else "zh")[:80] for _ in range(n_answers)
        ]
        row = {
            "id": f"{hexid(rng, 8)}-{hexid(rng, 4)}-{hexid(rng, 4)}-{hexid(rng, 12)}",
            "context": lb_context(seed, lang, chars),
            "language": lang,
            "token_length": bucket,
            "primary_task": primary,
            "secondary_task": rng.choice(LB_TASKS[primary]),
            "contextual_requirement": rng.choice(("Full", "Partial")),
            "question_nonthinking": lb_question(random.Random(f"{seed}:{i}"), lang, False),
            "question_thinking": lb_question(random.Random(f"{seed}:{i}"), lang, True),
            "answer": answers,
            "difficulty": rng.choice(("Easy", "Moderate", "Hard", "Extreme")),
        }
        f.write((b",\n" if i else b"") + orjson.dumps(row))
    f.write(b"\n]\n")
    close_part(f, path)


# ------------------------------------------------------------------------------------------------
# MRCR 2needle: 800 rows over two parquet files, eight length bins of 100 rows.

MRCR_FORMS = [
    "poem",
    "short story",
    "essay",
    "riddle",
    "social media post",
    "speech",
    "blog post",
    "play scene",
    "letter",
    "song",
    "limerick",
    "news article",
]


def mrcr_row(rng, target):
    p = pools()
    topics = rng.sample(p.words, 40)
    needle = (rng.choice(MRCR_FORMS), rng.choice(topics))
    pairs, size = [], 0
    while size < target:
        ask = (rng.choice(MRCR_FORMS), rng.choice(topics))
        while ask == needle:
            ask = (rng.choice(MRCR_FORMS), rng.choice(topics))
        n = lognormal(rng, 2_200, 0.6, 200, 12_000)
        pairs.append((f"write a {ask[0]} about {ask[1]}", prose(rng, p.en, n, "\n")))
        size += len(pairs[-1][0]) + len(pairs[-1][1])
    spots = sorted(rng.sample(range(len(pairs) + 1), 2))
    for j, spot in enumerate(spots):
        text = prose(rng, p.en, lognormal(rng, 2_200, 0.6, 200, 12_000), "\n")
        pairs.insert(spot + j, (f"write a {needle[0]} about {needle[1]}", text))
    which = rng.randint(1, 2)
    messages = []
    for ask, text in pairs:
        messages += [{"role": "user", "content": ask}, {"role": "assistant", "content": text}]
    needles = [
        i
        for i in range(1, len(messages), 2)
        if messages[i - 1]["content"] == f"write a {needle[0]} about {needle[1]}"
    ]
    desired = needles[which - 1]
    prefix = "".join(rng.choices(string.ascii_letters + string.digits, k=10))
    nth = {1: "1st", 2: "2nd"}[which]
    messages.append(
        {
            "role": "user",
            "content": f"Prepend {prefix} to the {nth} (1 indexed) "
            f"{needle[0]} about {needle[1]}. Do not include any other text in your response.",
        }
    )
    return {
        "prompt": json.dumps(messages),
        "answer": prefix + messages[desired]["content"],
        "random_string_to_prepend": prefix,
        "n_needles": 2,
        "desired_msg_index": desired,
        "total_messages": len(messages),
        "n_chars": sum(len(m["content"]) for m in messages),
    }


MRCR_SCHEMA = pa.schema(
    [
        ("prompt", pa.string()),
        ("answer", pa.string()),
        ("random_string_to_prepend", pa.string()),
        ("n_needles", pa.int64()),
        ("desired_msg_index", pa.int64()),
        ("total_messages", pa.int64()),
        ("n_chars", pa.int64()),
    ]
)


def gen_mrcr(src, part):
    rng = rand("mrcr")
    specs = []  # (bin, target characters, file)
    for b in range(8):
        lo = 15_500 * 2**b
        hi = 15_500 * 2 ** (b + 1) if b < 7 else 5_100_000
        targets = [lo + (hi - lo) * rng.random() ** 0.75 for _ in range(100)]
        to_first = 35 if b == 7 else 50  # the second file holds more of the longest rows
        specs += [(b, t, 0 if j < to_first else 1) for j, t in enumerate(targets)]
    rng.shuffle(specs)
    rows = [
        mrcr_row(random.Random(f"{SEED}:mrcr:{i}"), t)
        for i, (b, t, f) in enumerate(specs)
        if f == part
    ]
    table = pa.Table.from_pylist(rows, schema=MRCR_SCHEMA)
    write_parquet(table, src / f"openai/mrcr/2needle/2needle_{part}.parquet")


# ------------------------------------------------------------------------------------------------
# SWE-smith xml trajectories: messages as a JSON string, tool calls in <function=...> form.

SWE_SYSTEM = """You are a helpful assistant that can interact with a computer to solve tasks.
<IMPORTANT>
* If user provides a path, you should NOT assume it's relative to the current working directory. Instead, you should explore the file system to find the file before working on it.
</IMPORTANT>

You have access to the following functions:

---- BEGIN FUNCTION #1: bash ----
Description: Execute a bash command in the terminal.

Parameters:
  (1) command (string, required): The bash command to execute. Can be empty to view additional logs when previous exit code is `-1`. Can be `ctrl+c` to interrupt the currently running process.
---- END FUNCTION #1 ----

---- BEGIN FUNCTION #2: submit ----
Description: Finish the interaction when the task is complete OR if the assistant cannot proceed further with the task.
No parameters are required for this function.
---- END FUNCTION #2 ----

---- BEGIN FUNCTION #3: str_replace_editor ----
Description: Custom editing tool for viewing, creating and editing files
* State is persistent across command calls and discussions with the user
* If `path` is a file, `view` displays the result of applying `cat -n`. If `path` is a directory, `view` lists non-hidden files and directories up to 2 levels deep
* The `create` command cannot be used if the specified `path` already exists as a file
* If a `command` generates a long output, it will be truncated and marked with `<response clipped>`
* The `undo_edit` command will revert the last edit made to the file at `path`

Notes for using the `str_replace` command:
* The `old_str` parameter should match EXACTLY one or more consecutive lines from the original file. Be mindful of whitespaces!
* If the `old_str` parameter is not unique in the file, the replacement will not be performed. Make sure to include enough context in `old_str` to make it unique
* The `new_str` parameter should contain the edited lines that should replace the `old_str`

Parameters:
  (1) command (string, required): The commands to run. Allowed options are: `view`, `create`, `str_replace`, `insert`, `undo_edit`.
  (2) path (string, required): Absolute path to file or directory, e.g. `/testbed/file.py` or `/testbed`.
  (3) file_text (string, optional): Required parameter of `create` command, with the content of the file to be created.
  (4) old_str (string, optional): Required parameter of `str_replace` command containing the string in `path` to replace.
  (5) new_str (string, optional): Optional parameter of `str_replace` command containing the new string (if not given, no string will be added). Required parameter of `insert` command containing the string to insert.
  (6) insert_line (integer, optional): Required parameter of `insert` command. The `new_str` will be inserted AFTER the line `insert_line` of `path`.
  (7) view_range (array, optional): Optional parameter of `view` command when `path` points to a file. If none is given, the full file is shown. If provided, the file will be shown in the indicated line number range, e.g. [11, 12] will show lines 11 and 12. Indexing at 1 to start.
---- END FUNCTION #3 ----


If you choose to call a function ONLY reply in the following format with NO suffix:

Provide any reasoning for the function call here.
<function=example_function_name>
<parameter=example_parameter_1>value_1</parameter>
<parameter=example_parameter_2>
This is the value for the second parameter
that can span
multiple lines
</parameter>
</function>

<IMPORTANT>
Reminder:
- Function calls MUST follow the specified format, start with <function= and end with </function>
- Required parameters MUST be specified
- Only call one function at a time
- Always provide reasoning for your function call in natural language BEFORE the function call (not after)
</IMPORTANT>"""

SWE_TASK = """<uploaded_files>
/testbed
</uploaded_files>
I've uploaded a python code repository in the directory /testbed. Consider the following PR description:

<pr_description>
{issue}
</pr_description>

Can you help me implement the necessary changes to the repository so that the requirements specified in the <pr_description> are met?
I've already taken care of all changes to any of the test files described in the <pr_description>. This means you DON'T have to modify the testing logic or any of the tests in any way!
Your task is to make the minimal changes to non-tests files in the /testbed directory to ensure the <pr_description> is satisfied.
Follow these steps to resolve the issue:
1. As a first step, it might be a good idea to find and read code relevant to the <pr_description>
2. Create a script to reproduce the error and execute it with `python <filename.py>` using the bash tool, to confirm the error
3. Edit the sourcecode of the repo to resolve the issue
4. Rerun your reproduce script and confirm that the error is fixed!
5. Think about edgecases and make sure your fix handles them as well
Your thinking should be thorough and so it's fine if it's very long."""

SWE_REPOS = [
    "pandas-dev__pandas",
    "getmoto__moto",
    "pydantic__pydantic",
    "conan-io__conan",
    "iterative__dvc",
    "python__mypy",
    "dask__dask",
    "Project-MONAI__MONAI",
    "facebookresearch__hydra",
    "bokeh__bokeh",
    "pylint-dev__astroid",
    "sqlfluff__sqlfluff",
    "pygments__pygments",
    "marshmallow-code__marshmallow",
    "tweepy__tweepy",
    "pallets__jinja",
]
SWE_KINDS = [
    "func_pm_remove_assign",
    "func_pm_op_swap",
    "func_basic__",
    "lm_rewrite__",
    "combine_file__",
    "pr_",
    "func_pm_ctrl_invert_if",
    "func_pm_remove_cond",
]


def call(name, **params):
    body = "".join(
        f"<parameter={k}>{v}</parameter>\n"
        if "\n" not in str(v)
        else f"<parameter={k}>\n{v}\n</parameter>\n"
        for k, v in params.items()
    )
    return f"<function={name}>\n{body}</function>"


def swe_path(rng, repo):
    pkg = repo.split("__")[1].lower().replace("-", "_")
    return f"/testbed/{pkg}/{'/'.join(rng.choices(pools().words, k=rng.randint(0, 2)))}/{snake(rng, 1)}.py".replace(
        "//", "/"
    )


def swe_step(rng, repo):
    """One assistant action and the user observation that answers it."""
    thought = " ".join(sentence(rng) for _ in range(rng.randint(1, 4)))
    kind = rng.choices(["view", "grep", "run", "edit", "create"], weights=[5, 3, 3, 3, 1])[0]
    path = swe_path(rng, repo)
    if kind == "view":
        action = call("str_replace_editor", command="view", path=path)
        start = rng.randint(1, 400)
        body = code_text(rng, lognormal(rng, 6_000, 0.8, 400, 40_000))
        obs = f"Here's the result of running `cat -n` on {path}:\n{numbered(body, start)}"
    elif kind == "grep":
        word = rng.choice(pools().words)
        action = call("bash", command=f'grep -rn "{word}" /testbed --include="*.py" | head -n 40')
        lines = [
            f"{swe_path(rng, repo)}:{rng.randint(1, 2000)}:{line}"
            for line in code_text(rng, 1_500).split("\n")[: rng.randint(3, 40)]
            if line.strip()
        ]
        obs = "\n".join(lines)
    elif kind == "run":
        action = call("bash", command=f"cd /testbed && python {snake(rng)}.py")
        frames = "\n".join(
            f'  File "{swe_path(rng, repo)}", line {rng.randint(1, 3000)}, in {snake(rng)}\n'
            f"    {rng.choice(code_text(rng, 200).split(chr(10))).strip()}"
            for _ in range(rng.randint(1, 12))
        )
        obs = f"Traceback (most recent call last):\n{frames}\n{rng.choice(['ValueError', 'TypeError', 'KeyError', 'AttributeError'])}: {sentence(rng)[:120]}"
    elif kind == "edit":
        old, new = code_block(rng), code_block(rng)
        action = call(
            "str_replace_editor", command="str_replace", path=path, old_str=old, new_str=new
        )
        start = rng.randint(1, 500)
        obs = (
            f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet "
            f"of {path}:\n{numbered(new, start)}\nReview the changes and make sure they are as "
            "expected. Edit the file again if necessary."
        )
    else:
        body = code_text(rng, lognormal(rng, 1_500, 0.5, 200, 8_000))
        action = call(
            "str_replace_editor", command="create", path=f"/testbed/{snake(rng)}.py", file_text=body
        )
        obs = f"File created successfully at: /testbed/{snake(rng)}.py"
    return thought + "\n\n" + action, "OBSERVATION:\n" + obs


def swe_patch(rng, repo):
    path = swe_path(rng, repo)[len("/testbed/") :]
    old, new = code_block(rng).split("\n"), code_block(rng).split("\n")
    start = rng.randint(1, 900)
    return (
        f"diff --git a/{path} b/{path}\nindex {hexid(rng, 7)}..{hexid(rng, 7)} 100644\n"
        f"--- a/{path}\n+++ b/{path}\n@@ -{start},{len(old)} +{start},{len(new)} @@\n"
        + "\n".join("-" + line for line in old)
        + "\n"
        + "\n".join("+" + line for line in new)
        + "\n"
    )


def swe_messages(rng, repo, target_chars):
    issue = "\n\n".join(sentence(rng) for _ in range(rng.randint(2, 6)))
    issue += (
        "\n\n```python\n" + code_block(rng) + "```\n\n" + " ".join(sentence(rng) for _ in range(2))
    )
    messages = [
        {"role": "system", "content": SWE_SYSTEM},
        {"role": "user", "content": SWE_TASK.format(issue=issue)},
    ]
    size = sum(len(m["content"]) for m in messages)
    while size < target_chars:
        action, obs = swe_step(rng, repo)
        messages += [{"role": "assistant", "content": action}, {"role": "user", "content": obs}]
        size += len(action) + len(obs)
    patch = swe_patch(rng, repo)
    messages += [
        {
            "role": "assistant",
            "content": " ".join(sentence(rng) for _ in range(2)) + "\n\n" + call("submit"),
        },
        {
            "role": "user",
            "content": "OBSERVATION:\nThank you for your work on this issue. Please "
            "carefully follow the steps below to help review your changes.\n\n" + patch,
        },
        {
            "role": "assistant",
            "content": " ".join(sentence(rng) for _ in range(3)) + "\n\n" + call("submit"),
        },
    ]
    return messages, patch


def gen_swe(src):
    rng = rand("swe-smith")
    rows, recent = [], []
    for i in range(SWE_ROWS):
        r = random.Random(f"{SEED}:swe:{i}")
        if recent and r.random() < 0.085:  # a trajectory stored twice under one traj_id
            row = dict(r.choice(recent))
            row["resolved"] = r.random() < 0.5
        else:
            repo = r.choice(SWE_REPOS)
            tokens = lognormal(r, 22_000, 0.8, 3_000, 165_000)
            messages, patch = swe_messages(r, repo, tokens * CPT["code"])
            instance = f"{repo}.{hexid(r, 8)}.{r.choice(SWE_KINDS)}{hexid(r, 8) if r.random() < 0.7 else ''}"
            text = json.dumps(messages)
            if r.random() < 0.01:
                text = json.dumps(text)  # a second JSON layer
            row = {
                "messages": text,
                "instance_id": instance,
                "resolved": r.random() < 0.6,
                "model": r.choice(["claude-3-7-sonnet-20250219", "claude-3-5-sonnet-20241022"]),
                "traj_id": f"{instance}.{hexid(r, 8)}",
                "patch": patch,
            }
            recent = (recent + [row])[-40:]
        rows.append(row)
    rng.shuffle(rows)
    schema = pa.schema(
        [
            ("messages", pa.string()),
            ("instance_id", pa.string()),
            ("resolved", pa.bool_()),
            ("model", pa.string()),
            ("traj_id", pa.string()),
            ("patch", pa.string()),
        ]
    )
    write_parquet(
        pa.Table.from_pylist(rows, schema=schema),
        src / "SWE-bench/SWE-smith-trajectories/data/xml-00000-of-00008.parquet",
        row_group_size=100,
    )


# ------------------------------------------------------------------------------------------------
# Nemotron-Agentic interactive_agent.jsonl: OpenAI messages with tool calls, tools per row.

JSON_TYPES = ["string", "string", "string", "integer", "number", "boolean", "array", "object"]
VERBS = [
    "get",
    "find",
    "update",
    "cancel",
    "book",
    "search",
    "list",
    "create",
    "check",
    "send",
    "modify",
    "return",
    "exchange",
    "calculate",
    "transfer",
    "lookup",
]


def nemotron_tool(rng):
    props = {}
    for _ in range(rng.randint(1, 6)):
        t = rng.choice(JSON_TYPES)
        prop = {"type": t, "description": sentence(rng)[:160]}
        if t == "string" and rng.random() < 0.3:
            prop["enum"] = rng.sample(pools().words, rng.randint(2, 5))
        if t == "array":
            prop["items"] = {"type": rng.choice(["string", "integer"])}
        if t == "object":
            prop["properties"] = {
                snake(rng, 1): {"type": "string"} for _ in range(rng.randint(1, 3))
            }
        props[snake(rng)] = prop
    return {
        "type": "function",
        "function": {
            "name": f"{rng.choice(VERBS)}_{snake(rng, rng.randint(1, 2))}",
            "description": " ".join(sentence(rng) for _ in range(rng.randint(1, 3)))[:600],
            "parameters": {
                "type": "object",
                "properties": props,
                "required": sorted(rng.sample(sorted(props), rng.randint(0, len(props)))),
            },
        },
    }


def json_value(rng, depth=0):
    kind = rng.random()
    if kind < 0.4:
        return sentence(rng)[: rng.randint(5, 200)]
    if kind < 0.6:
        return rng.randint(0, 100_000)
    if kind < 0.7:
        return round(rng.uniform(0, 5_000), 2)
    if kind < 0.75:
        return rng.random() < 0.5
    if depth < 2 and kind < 0.9:
        return {snake(rng, 1): json_value(rng, depth + 1) for _ in range(rng.randint(1, 6))}
    if depth < 2:
        return [json_value(rng, depth + 1) for _ in range(rng.randint(1, 4))]
    return hexid(rng, 10)


def nemotron_row(rng, index):
    tools = [nemotron_tool(rng) for _ in range(rng.randint(2, 9))]
    reasoning = rng.random() < 0.6
    policy = "# Policy\n\n" + prose(rng, pools().en, lognormal(rng, 6_000, 0.5, 1_000, 30_000))
    messages = [{"role": "system", "content": policy}]
    for _ in range(rng.randint(1, 4)):
        messages.append(
            {"role": "user", "content": " ".join(sentence(rng) for _ in range(rng.randint(1, 4)))}
        )
        for _ in range(rng.choice((0, 1, 1, 2, 2, 3, 4, 5))):
            batch = []
            for _ in range(rng.choice((1, 1, 1, 2))):
                tool = rng.choice(tools)["function"]
                args = {k: json_value(rng, 2) for k in list(tool["parameters"]["properties"])[:4]}
                batch.append(
                    {
                        "id": f"call_{hexid(rng, 24)}",
                        "type": "function",
                        "function": {"name": tool["name"], "arguments": json.dumps(args)},
                    }
                )
            m = {"role": "assistant", "content": "" if rng.random() < 0.7 else sentence(rng)}
            if reasoning:
                m["reasoning_content"] = prose(
                    rng, pools().en, lognormal(rng, 400, 0.6, 50, 4_000), " "
                )
            m["tool_calls"] = batch
            messages.append(m)
            for c in batch:
                result = {snake(rng, 1): json_value(rng) for _ in range(rng.randint(1, 10))}
                content = (
                    result if rng.random() < 0.05 else json.dumps(result)
                )  # structured content
                messages.append({"role": "tool", "content": content, "tool_call_id": c["id"]})
        m = {
            "role": "assistant",
            "content": " ".join(sentence(rng) for _ in range(rng.randint(1, 6))),
        }
        if reasoning:
            m["reasoning_content"] = prose(
                rng, pools().en, lognormal(rng, 400, 0.6, 50, 4_000), " "
            )
        messages.append(m)
    return {
        "uuid": f"{hexid(rng, 8)}-{hexid(rng, 4)}-4{hexid(rng, 3)}-a{hexid(rng, 3)}-{hexid(rng, 12)}",
        "messages": messages,
        "tools": tools,
        "license": "cc-by-4.0" if rng.random() < 0.8 else "apache-2.0",
        "used_in": ["nano_v3"] if rng.random() < 0.7 else ["nano_v3", "super_v1"],
        "reasoning": "on" if reasoning else "off",
    }


def gen_nemotron(src):
    path = src / "nvidia/Nemotron-Agentic-v1/data/interactive_agent.jsonl"
    f = open_part(path)
    for i in range(19_028):
        row = nemotron_row(random.Random(f"{SEED}:nemotron:{i}"), i)
        f.write(json.dumps(row, ensure_ascii=False).encode() + b"\n")
    close_part(f, path)


# ------------------------------------------------------------------------------------------------
# WildChat shard 0: 37,208 conversations with nested per-turn structs.

WC_LANGS = [
    ("English", 46),
    ("Chinese", 22),
    ("Russian", 15),
    ("French", 3),
    ("Spanish", 3),
    ("German", 2),
    ("Japanese", 2),
    ("Portuguese", 2),
    ("Italian", 1),
    ("Arabic", 1),
    ("Korean", 1),
    ("Turkish", 1),
    ("Vietnamese", 1),
]
WC_COUNTRIES = [
    "United States",
    "China",
    "Russia",
    "Hong Kong",
    "United Kingdom",
    "Germany",
    "France",
    "Japan",
    "Canada",
    "India",
    "Brazil",
    "Singapore",
]
WC_MODELS = [
    "gpt-3.5-turbo-0613",
    "gpt-4-0314",
    "gpt-4-1106-preview",
    "gpt-3.5-turbo-0125",
    "gpt-4o-2024-05-13",
    "gpt-4-0125-preview",
]
OPENAI_CATEGORIES = [
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "self-harm",
    "self-harm/instructions",
    "self-harm/intent",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
]
DETOXIFY = [
    "identity_attack",
    "insult",
    "obscene",
    "severe_toxicity",
    "sexual_explicit",
    "threat",
    "toxicity",
]
HEADER_T = pa.struct([("accept-language", pa.string()), ("user-agent", pa.string())])
USAGE_T = pa.struct(
    [("completion_tokens", pa.int64()), ("prompt_tokens", pa.int64()), ("total_tokens", pa.int64())]
)
TS = pa.timestamp("s", tz="UTC")
WC_MESSAGE_T = pa.struct(
    [
        ("content", pa.string()),
        ("country", pa.string()),
        ("created", TS),
        ("hashed_ip", pa.string()),
        ("header", HEADER_T),
        ("language", pa.string()),
        ("openai_id", pa.string()),
        ("redacted", pa.bool_()),
        ("role", pa.string()),
        ("state", pa.string()),
        ("system_fingerprint", pa.string()),
        ("temperature", pa.float64()),
        ("timestamp", TS),
        ("token_counter", pa.int64()),
        ("top_p", pa.float64()),
        ("toxic", pa.bool_()),
        ("turn_identifier", pa.int64()),
        ("usage", USAGE_T),
    ]
)
WC_SCHEMA = pa.schema(
    [
        ("conversation_hash", pa.string()),
        ("model", pa.string()),
        ("timestamp", TS),
        ("conversation", pa.list_(WC_MESSAGE_T)),
        ("turn", pa.int64()),
        ("language", pa.string()),
        (
            "openai_moderation",
            pa.list_(
                pa.struct(
                    [
                        ("categories", pa.struct([(c, pa.bool_()) for c in OPENAI_CATEGORIES])),
                        (
                            "category_scores",
                            pa.struct([(c, pa.float64()) for c in OPENAI_CATEGORIES]),
                        ),
                        ("flagged", pa.bool_()),
                    ]
                )
            ),
        ),
        ("detoxify_moderation", pa.list_(pa.struct([(c, pa.float64()) for c in DETOXIFY]))),
        ("toxic", pa.bool_()),
        ("redacted", pa.bool_()),
        ("state", pa.string()),
        ("country", pa.string()),
        ("hashed_ip", pa.string()),
        ("header", HEADER_T),
    ]
)
WC_GREETINGS = ["hi", "hello", "你好", "Привет", "hey", "test", "who are you?", "你是谁"]


def wildchat_row(rng, firsts):
    lang = rng.choices([lang for lang, _ in WC_LANGS], weights=[w for _, w in WC_LANGS])[0]
    turns = min(30, int(rng.paretovariate(1.3))) if rng.random() < 0.45 else 1
    toxic, redacted = rng.random() < 0.08, rng.random() < 0.04
    country = rng.choice(WC_COUNTRIES)
    ip = hexid(rng, 64)
    header = {
        "accept-language": rng.choice(["en-US,en;q=0.9", "zh-CN,zh;q=0.9", "ru-RU,ru;q=0.9"]),
        "user-agent": f"Mozilla/5.0 (Windows NT 10.0; Win64; x64) Chrome/{rng.randint(100, 125)}.0.0.0",
    }
    t0 = 1_680_000_000 + rng.randrange(30_000_000)
    dense = 3 if lang in ("Chinese", "Japanese") else 1
    conversation, omod, dmod = [], [], []
    for turn in range(turns):
        r = rng.random()
        if turn == 0 and r < 0.03:
            ask = rng.choice(WC_GREETINGS)
        elif turn == 0 and r < 0.05 and firsts:
            ask = rng.choice(firsts)
        else:
            ask = text_in(rng, lang, lognormal(rng, 130 // dense, 1.2, 2, 20_000), "\n")
            if rng.random() < 0.1:
                ask += "\n\n" + code_text(rng, lognormal(rng, 800, 0.8, 50, 8_000))
        if turn == 0:
            firsts.append(ask)
        n = lognormal(rng, 1_000 // dense, 0.8, 1, 16_000)
        reply = text_in(rng, lang, n, "\n\n")
        if rng.random() < 0.15:
            reply += (
                "\n\n```python\n" + code_text(rng, lognormal(rng, 900, 0.7, 80, 8_000)) + "\n```"
            )
        ts = t0 + 40 * turn
        tid = rng.randrange(1, 1 << 53)
        for role, content in (("user", ask), ("assistant", reply)):
            user = role == "user"
            conversation.append(
                {
                    "content": content,
                    "country": country if user else None,
                    "created": None if user else ts + 5,
                    "hashed_ip": ip if user else None,
                    "header": header if user else None,
                    "language": lang,
                    "openai_id": None if user else f"chatcmpl-{hexid(rng, 29)}",
                    "redacted": redacted and user and rng.random() < 0.5,
                    "role": role,
                    "state": None
                    if not user
                    else rng.choice([None, "California", "Beijing", "Moscow"]),
                    "system_fingerprint": None
                    if user
                    else rng.choice([None, f"fp_{hexid(rng, 10)}"]),
                    "temperature": None if user else 1.0,
                    "timestamp": ts + (0 if user else 9),
                    "token_counter": None if user else len(content) // 4,
                    "top_p": None if user else 1.0,
                    "toxic": toxic and rng.random() < 0.5,
                    "turn_identifier": tid,
                    "usage": None
                    if user
                    else {
                        "completion_tokens": len(content) // 4,
                        "prompt_tokens": len(ask) // 4,
                        "total_tokens": (len(content) + len(ask)) // 4,
                    },
                }
            )
            scores = {c: rng.random() ** 6 for c in OPENAI_CATEGORIES}
            omod.append(
                {
                    "categories": {c: s > 0.5 for c, s in scores.items()},
                    "category_scores": scores,
                    "flagged": max(scores.values()) > 0.5,
                }
            )
            dmod.append({c: rng.random() ** 5 for c in DETOXIFY})
    if len(firsts) > 500:
        del firsts[:250]
    return {
        "conversation_hash": hexid(rng, 32),
        "model": rng.choice(WC_MODELS),
        "timestamp": t0,
        "conversation": conversation,
        "turn": turns,
        "language": lang,
        "openai_moderation": omod,
        "detoxify_moderation": dmod,
        "toxic": toxic,
        "redacted": redacted,
        "state": rng.choice([None, "California", "Beijing", "Moscow", "Texas"]),
        "country": country,
        "hashed_ip": ip,
        "header": header,
    }


def gen_wildchat(src):
    rng = rand("wildchat")
    firsts = []
    path = src / "allenai/WildChat-4.8M/data/train-00000-of-00086.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".parquet.part")
    with pq.ParquetWriter(tmp, WC_SCHEMA, compression="snappy") as w:
        for start in range(0, 37_208, 1_000):
            rows = [wildchat_row(rng, firsts) for _ in range(min(1_000, 37_208 - start))]
            w.write_table(pa.Table.from_pylist(rows, schema=WC_SCHEMA))
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------
# Small parquet sources: GSM8K, HumanEval, MBPP, MiMo.


def gen_gsm8k(src):
    rows = [{"question": r["question"], "answer": r["answer"]} for r in pools().gsm8k]
    write_parquet(
        pa.Table.from_pylist(
            rows, schema=pa.schema([("question", pa.string()), ("answer", pa.string())])
        ),
        src / "openai/gsm8k/main/test-00000-of-00001.parquet",
    )


def gen_humaneval(src):
    cols = ["task_id", "prompt", "canonical_solution", "test", "entry_point"]
    rows = [{c: r[c] for c in cols} for r in pools().humaneval]
    schema = pa.schema([(c, pa.string()) for c in cols])
    write_parquet(
        pa.Table.from_pylist(rows, schema=schema),
        src / "openai/openai_humaneval/openai_humaneval/test-00000-of-00001.parquet",
    )


def gen_mbpp(src):
    rng = rand("mbpp")
    rows = []
    for i in range(257):
        r = pools().humaneval[i % len(pools().humaneval)]
        doc = re.search(r'"""(.*?)(>>>|""")', r["prompt"], re.S)
        task = " ".join((doc.group(1) if doc else sentence(rng)).split())
        task = re.split(r"(?<=\.)\s", task)[0][:300]
        fn = r["entry_point"]
        code = re.sub(r'\n\s*""".*?"""', "", r["prompt"], flags=re.S) + r["canonical_solution"]
        tests = [
            f"assert {fn}({[rng.randint(0, 99) for _ in range(rng.randint(2, 9))]}, "
            f"{rng.randint(0, 99)}) == {[rng.randint(0, 99) for _ in range(rng.randint(1, 5))]}"
            for _ in range(3)
        ]
        rows.append(
            {
                "source_file": "Benchmark Questions Verification V2.ipynb",
                "task_id": 11 + i * 2,
                "prompt": f"Write a function to {task[0].lower() + task[1:]}",
                "code": code,
                "test_imports": [] if rng.random() < 0.9 else ["import math"],
                "test_list": tests,
            }
        )
    schema = pa.schema(
        [
            ("source_file", pa.string()),
            ("task_id", pa.int32()),
            ("prompt", pa.string()),
            ("code", pa.string()),
            ("test_imports", pa.list_(pa.string())),
            ("test_list", pa.list_(pa.string())),
        ]
    )
    write_parquet(
        pa.Table.from_pylist(rows, schema=schema),
        src / "google-research-datasets/mbpp/sanitized/test-00000-of-00001.parquet",
    )


PROMPT_T = pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))
REWARD_T = pa.struct([("ground_truth", pa.string()), ("style", pa.string())])


def mimo_schema(extra_info):
    """webdev.parquet and music.parquet differ only in the fields of extra_info."""
    return pa.schema(
        [
            ("prompt", PROMPT_T),
            ("data_source", pa.string()),
            ("ability", pa.string()),
            ("agent_name", pa.string()),
            ("reward_model", REWARD_T),
            ("extra_info", pa.struct(extra_info)),
        ]
    )


def gen_mimo(src):
    rng = rand("mimo")
    rows = []
    for i in range(2_093):
        n = lognormal(rng, 825, 0.9, 49, 12_173)
        prompt = (
            prose(rng, pools().en, n, "\n")
            if rng.random() < 0.9
            else prose(rng, pools().zh, n / 3, "\n")
        )
        rubric = [sentence(rng) for _ in range(rng.randint(1, 6))]
        instance = {
            "instance_id": f"webdev_{hexid(rng, 16)}",
            "query": prompt,
            "rubric": rubric,
            "category": rng.choice(["game", "dashboard", "landing page", "tool", "animation"]),
        }
        rows.append(
            {
                "prompt": [{"content": prompt, "role": "user"}],
                "data_source": "blackbox/webdev",
                "ability": "webdev",
                "agent_name": "webdev_agent",
                "reward_model": {"ground_truth": "", "style": "rubric"},
                "extra_info": {
                    "index": i,
                    "instance_json": json.dumps(instance, ensure_ascii=False),
                    "split": "train",
                },
            }
        )
    schema = mimo_schema(
        [("index", pa.int64()), ("instance_json", pa.string()), ("split", pa.string())]
    )
    write_parquet(
        pa.Table.from_pylist(rows, schema=schema),
        src / "XiaomiMiMo/MiMo-V2.6-RL-oss/webdev.parquet",
    )
    rows = []
    langs = ["zh"] * 504 + ["en"] * 496
    rng.shuffle(langs)
    for i, lang in enumerate(langs):
        meter, bpm = rng.choice(["4/4", "3/4", "6/8"]), rng.randint(60, 160)
        tag = rng.choice(["pop", "rock", "folk", "ballad", "hip-hop", "r&b", "electronic", "jazz"])
        length = rng.choice(["short", "medium", "long"])
        if lang == "zh":
            theme = sentence(rng, "zh")[:60]
            text = (
                f"請為一首{tag}風格的歌曲創作歌詞。主題：{theme}\n拍號：{meter}，速度：{bpm} BPM，"
                f"篇幅：{length}。要求包含主歌、副歌和橋段，押韻自然，情感真摯。"
            )
        else:
            theme = " ".join(sentence(rng) for _ in range(2))[:240]
            text = (
                f"Write the lyrics of a {tag} song. Theme: {theme}\nMeter: {meter}, tempo: {bpm} "
                f"BPM, length: {length}. Include verses, a chorus and a bridge; keep the rhymes "
                "natural and the imagery concrete."
            )
        rows.append(
            {
                "prompt": [{"content": text, "role": "user"}],
                "data_source": "music",
                "ability": "music",
                "agent_name": "music_agent",
                "reward_model": {"ground_truth": "", "style": "model"},
                "extra_info": {
                    "src_id": f"music_{i:05d}",
                    "lang": lang,
                    "length": length,
                    "meter": meter,
                    "bpm": bpm,
                    "tag": tag,
                },
            }
        )
    schema = mimo_schema(
        [
            ("src_id", pa.string()),
            ("lang", pa.string()),
            ("length", pa.string()),
            ("meter", pa.string()),
            ("bpm", pa.int64()),
            ("tag", pa.string()),
        ]
    )
    write_parquet(
        pa.Table.from_pylist(rows, schema=schema), src / "XiaomiMiMo/MiMo-V2.6-RL-oss/music.parquet"
    )


# ------------------------------------------------------------------------------------------------
# NuminaMath-1.5: 896,215 rows over three files.

NUMINA_SOURCES = [
    ("cn_k12", 0.29, False),
    ("olympiads", 0.2, False),
    ("orca_math", 0.16, False),
    ("synthetic_math", 0.18, True),
    ("synthetic_amc", 0.05, True),
    ("aops_forum", 0.035, False),
    ("cn_contest", 0.03, False),
    ("amc_aime", 0.005, False),
    ("inequalities", 0.01, False),
    ("number_theory", 0.005, False),
    ("olympiads_ref", 0.005, False),
    ("metamath", 0.03, False),
]
NUMINA_TYPES = [
    "Algebra",
    "Geometry",
    "Number Theory",
    "Combinatorics",
    "Inequalities",
    "Calculus",
    "Logic and Puzzles",
    "Other",
]
NUMINA_ROWS = (298_739, 298_738, 298_738)
NUMINA_SCALE = (1.1, 1.0, 0.91)  # the three real files shrink in this proportion


def latex(rng):
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(1, 9)
    x = rng.choice("xyzntk")
    return rng.choice(
        [
            f"${x}^{{{c}}} + {a}{x} - {b} = 0$",
            f"$\\frac{{{a}}}{{{b}}}$",
            f"$\\sqrt{{{a}}}$",
            f"$f({x}) = {a}{x}^2 - {b}$",
            f"$\\angle ABC = {a}^{{\\circ}}$",
            f"$a_{{{c}}} = {a}$",
            f"$\\sum_{{k=1}}^{{{a}}} k^{{{c}}}$",
            f"$|{x} - {a}| < {b}$",
            f"${a} \\times {b} = {a * b}$",
            f"$\\log_{{{c + 1}}} {a}$",
            f"$\\binom{{{a}}}{{{c}}}$",
            f"$({x} + {a})({x} - {b})$",
        ]
    )


def math_sentences(seed, n=60_000):
    """Sentences of maths problems and solutions: GSM8K's with new numbers, and LaTeX."""
    rng = random.Random(seed)
    p = pools()
    base = [s for r in p.gsm8k for s in re.split(r"(?<=[.?!])\s+", r["question"]) if len(s) > 10]
    steps = [
        re.sub(r"<<[^>]*>>", "", s) for r in p.gsm8k for s in r["answer"].split("\n")[:-1] if s
    ]
    out = []
    for _ in range(n):
        kind = rng.random()
        s = rng.choice(base if kind < 0.45 else steps if kind < 0.8 else p.en_sent)
        s = re.sub(r"\d+", lambda m: str(rng.randint(1, 999)), s)
        if rng.random() < 0.6:
            s += " " + latex(rng)
        out.append(s)
    return Pool(out)


def gen_numina(src, part):
    rng = rand(f"numina:{part}")
    sents = math_sentences(f"{SEED}:numina-sentences:{part}")
    names = [s for s, _, _ in NUMINA_SOURCES]
    weights = [w for _, w, _ in NUMINA_SOURCES]
    synthetic = {s: syn for s, _, syn in NUMINA_SOURCES}
    scale = NUMINA_SCALE[part]
    cols = {
        c: []
        for c in (
            "problem",
            "solution",
            "answer",
            "problem_type",
            "question_type",
            "problem_is_valid",
            "solution_is_valid",
            "source",
            "synthetic",
        )
    }
    for _ in range(NUMINA_ROWS[part]):
        source = rng.choices(names, weights)[0]
        k = max(1, int(rng.lognormvariate(math.log(2.6 * scale), 0.6)))
        cols["problem"].append(" ".join(rng.choices(sents, k=k)))
        k = max(1, int(rng.lognormvariate(math.log(6 * scale), 0.7)))
        cols["solution"].append("\n\n".join(rng.choices(sents, k=k)))
        cols["answer"].append(rng.choice(["proof", str(rng.randint(0, 9999)), latex(rng)]))
        cols["problem_type"].append(rng.choice(NUMINA_TYPES))
        cols["question_type"].append(rng.choice(["math-word-problem", "proof", "MCQ"]))
        cols["problem_is_valid"].append("Yes" if rng.random() < 0.93 else "Incomplete")
        cols["solution_is_valid"].append("Yes" if rng.random() < 0.9 else "Problem not solved")
        cols["source"].append(source)
        cols["synthetic"].append(synthetic[source] or rng.random() < 0.02)
    table = pa.table(
        {c: pa.array(v, pa.bool_() if c == "synthetic" else pa.string()) for c, v in cols.items()}
    )
    write_parquet(
        table,
        src / f"AI-MO/NuminaMath-1.5/data/train-0000{part}-of-00003.parquet",
        row_group_size=10_000,
    )


# ------------------------------------------------------------------------------------------------
# LongWriter long.jsonl: 6,000 conversations of one request and one long answer.

LW_GENRES_EN = ["essay", "story", "report", "travel guide", "business plan", "review", "speech"]
LW_GENRES_ZH = ["文章", "小說", "報告", "旅遊指南", "商業計劃書", "評論", "演講稿"]


def gen_longwriter(src):
    path = src / "zai-org/LongWriter-6k/long.jsonl"
    f = open_part(path)
    for i in range(6_000):
        rng = random.Random(f"{SEED}:longwriter:{i}")
        zh = rng.random() < 0.5
        size = lognormal(rng, 20_500, 0.55, 3_000, 120_000)  # UTF-8 bytes of the answer
        if zh:
            words = rng.choice([2000, 3000, 5000, 8000, 10000, 20000])
            ask = f"寫一篇{words}字的{rng.choice(LW_GENRES_ZH)}，主題是：{sentence(rng, 'zh')}"
            if rng.random() < 0.4:
                ask += "\n\n" + prose(rng, pools().zh, lognormal(rng, 120, 0.8, 10, 1_000), "\n")
            answer = "\n\n".join(
                f"## {sentence(rng, 'zh')[:20]}\n\n" + prose(rng, pools().zh, size / 3 / 6)
                for _ in range(6)
            )
        else:
            words = rng.choice([2000, 3000, 5000, 8000, 10000, 20000])
            ask = f"Write a {words}-word {rng.choice(LW_GENRES_EN)} about: {sentence(rng)}"
            if rng.random() < 0.4:
                ask += "\n\n" + prose(rng, pools().en, lognormal(rng, 300, 0.8, 20, 3_000), "\n")
            answer = "\n\n".join(
                f"## {sentence(rng)[:60]}\n\n" + prose(rng, pools().en, size / 6) for _ in range(6)
            )
        row = {
            "messages": [{"role": "user", "content": ask}, {"role": "assistant", "content": answer}]
        }
        f.write(json.dumps(row, ensure_ascii=False).encode() + b"\n")
    close_part(f, path)


# ------------------------------------------------------------------------------------------------
# Books: the pinned texts when ../shared/realdata has them, else synthetic books of the same size.


def gen_books(src):
    for fields in (line.split() for line in pin_lines(ROOT / "BOOKS")):
        ebook, lang, repo, _, path, size = fields[:6]
        dest = src / repo / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        real = REALDATA / "books" / path
        if real.is_file():
            shutil.copyfile(real, dest)
            continue
        rng = rand(f"book:{ebook}")
        pool = pools().en if lang == "en" else pools().zh
        body = prose(rng, pool, int(size) // (1 if lang == "en" else 3))
        text = (
            f"The Project Gutenberg EBook {ebook}\n\n*** START OF THE PROJECT GUTENBERG EBOOK "
            f"{ebook} ***\n\n{body}\n\n*** END OF THE PROJECT GUTENBERG EBOOK {ebook} ***\n"
        )
        if ebook == "1228":
            text = text.replace("\n", "\r\n")
        dest.write_bytes(text.encode())


# ------------------------------------------------------------------------------------------------
# The generated tree: jobs, pins, stamp, checks.

JOBS = [  # (name, function, args, files written), longest first
    ("longbench", gen_longbench, (), [("caskcsg/LongBench-Pro", "longbench_pro.json")]),
    (
        "nemotron",
        gen_nemotron,
        (),
        [("nvidia/Nemotron-Agentic-v1", "data/interactive_agent.jsonl")],
    ),
    (
        "swe-smith",
        gen_swe,
        (),
        [("SWE-bench/SWE-smith-trajectories", "data/xml-00000-of-00008.parquet")],
    ),
    ("mrcr-1", gen_mrcr, (1,), [("openai/mrcr", "2needle/2needle_1.parquet")]),
    ("mrcr-0", gen_mrcr, (0,), [("openai/mrcr", "2needle/2needle_0.parquet")]),
    (
        "wildchat",
        gen_wildchat,
        (),
        [("allenai/WildChat-4.8M", "data/train-00000-of-00086.parquet")],
    ),
    *[
        (
            f"numinamath-{k}",
            gen_numina,
            (k,),
            [("AI-MO/NuminaMath-1.5", f"data/train-0000{k}-of-00003.parquet")],
        )
        for k in range(3)
    ],
    ("longwriter", gen_longwriter, (), [("zai-org/LongWriter-6k", "long.jsonl")]),
    (
        "small",
        lambda src: (gen_gsm8k(src), gen_humaneval(src), gen_mbpp(src), gen_mimo(src)),
        (),
        [
            ("openai/gsm8k", "main/test-00000-of-00001.parquet"),
            ("openai/openai_humaneval", "openai_humaneval/test-00000-of-00001.parquet"),
            ("google-research-datasets/mbpp", "sanitized/test-00000-of-00001.parquet"),
            ("XiaomiMiMo/MiMo-V2.6-RL-oss", "webdev.parquet"),
            ("XiaomiMiMo/MiMo-V2.6-RL-oss", "music.parquet"),
        ],
    ),
    ("books", gen_books, (), []),
]


def pin_lines(path):
    return [
        line
        for line in Path(path).read_text(encoding="utf-8").splitlines()
        if line.split("#", 1)[0].strip()
    ]


def run_job(index, src):
    name, fn, args, _ = JOBS[index]
    t0 = time.perf_counter()
    fn(Path(src), *args)
    return name, time.perf_counter() - t0


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def stamp_key(tokenizer):
    return {
        "generator": GENERATOR,
        "realdata": Pools.real_books() is not None,
        "rev": [line.split()[1:4:2] for line in pin_lines(ROOT / "REV")],
        "books": [line.split()[4] for line in pin_lines(ROOT / "BOOKS")],
        "tokenizer_bytes": tokenizer.stat().st_size,
    }


def ensure_sources(cache, tokenizer, regenerate, gen_jobs):
    """Generate DIR/src (or reuse it) and write DIR/REV and DIR/BOOKS; return (stamp, seconds)."""
    src, stamp_path = cache / "src", cache / "STAMP"
    key = stamp_key(tokenizer)
    if stamp_path.is_file() and not regenerate:
        stamp = json.loads(stamp_path.read_text())
        if stamp.get("key") == key and all(
            (src / f).is_file() and (src / f).stat().st_size == size
            for f, (size, _) in stamp["files"].items()
        ):
            return stamp, None
    print(f"generating full-size sources in {src} ({GENERATOR}) ...", file=sys.stderr)
    t0 = time.perf_counter()
    if stamp_path.exists():
        stamp_path.unlink()
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    pools()  # built once, shared with the workers by fork
    ctx = multiprocessing.get_context("fork")
    times = {}
    with ProcessPoolExecutor(max_workers=gen_jobs, mp_context=ctx) as ex:
        for name, seconds in ex.map(run_job, range(len(JOBS)), [str(src)] * len(JOBS)):
            times[name] = seconds
            print(f"  {name:14} {seconds:7.1f} s", file=sys.stderr)
    dest = src / "Qwen/Qwen3.8-27B/tokenizer.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tokenizer, dest)
    files = {}
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        files[str(path.relative_to(src))] = (path.stat().st_size, sha256_file(path))
    stamp = {
        "key": key,
        "gen_jobs": gen_jobs,
        "files": files,
        "generate_s": round(time.perf_counter() - t0, 1),
        "job_s": {k: round(v, 1) for k, v in times.items()},
    }
    write_pins(cache, stamp)
    stamp_path.write_text(json.dumps(stamp, indent=1) + "\n")
    return stamp, stamp["generate_s"]


def write_pins(cache, stamp):
    """DIR/REV and DIR/BOOKS: the repository's pin files with the generated sizes and sha256."""
    files = stamp["files"]
    lines = []
    for line in (ROOT / "REV").read_text(encoding="utf-8").splitlines():
        fields = line.split("#", 1)[0].split()
        if not fields:
            lines.append(line)
            continue
        kind, repo, revision, path = fields[:4]
        size, sha = files[f"{repo}/{path}"]
        lines.append(f"{kind:8} {repo:37} {revision}  {path:44} {size:<10} {sha}")
    (cache / "REV").write_text("\n".join(lines) + "\n", encoding="utf-8")
    lines = []
    for line in (ROOT / "BOOKS").read_text(encoding="utf-8").splitlines():
        fields = line.split("#", 1)[0].split()
        if not fields:
            lines.append(line)
            continue
        ebook, lang, repo, commit, path = fields[:5]
        size, sha = files[f"{repo}/{path}"]
        title = " ".join(fields[7:])
        lines.append(f"{ebook:6} {lang}  {repo}  {commit}  {path}  {size}  {sha}  {title}")
    (cache / "BOOKS").write_text("\n".join(lines) + "\n", encoding="utf-8")


def arrow_type(t):
    for name, test in (
        ("list", pa.types.is_list),
        ("struct", pa.types.is_struct),
        ("timestamp", pa.types.is_timestamp),
    ):
        if test(t):
            return name
    return str(t)


def check_sources(cache):
    """Rows, sizes and column types of the generated files against SOURCES.md; returns lines."""
    src = cache / "src"
    real = {}
    for line in pin_lines(ROOT / "REV"):
        fields = line.split()
        real[(fields[1], fields[3])] = None if fields[4] == "-" else int(fields[4])
    out, problems = [], []
    rows_by_repo = Counter()
    for (repo, path), expect in EXPECT.items():
        file = src / repo / path
        size = file.stat().st_size
        want = real.get((repo, path)) or expect.get("bytes")
        if path.endswith(".parquet"):
            meta = pq.ParquetFile(file)
            rows = meta.metadata.num_rows
            schema = meta.schema_arrow
            types = " ".join(f"{f.name}:{arrow_type(f.type)}" for f in schema)
            if repo in COLUMNS and types != COLUMNS[repo]:
                problems.append(f"{repo}/{path}: columns {types}, expected {COLUMNS[repo]}")
        elif path.endswith(".jsonl"):
            with open(file, "rb") as f:
                first = orjson.loads(f.readline())
                rows = 1 + sum(1 for _ in f)
            types = "JSON lines of objects: " + " ".join(first)
        else:
            data = orjson.loads(file.read_bytes())
            rows = len(data)
            keys = list(data[0])
            types = "JSON array of objects: " + " ".join(keys)
            langs = Counter(r["language"] for r in data)
            buckets = Counter(r["token_length"] for r in data)
            distinct = len({r["context"] for r in data})
            types += f"; {dict(langs)}; {dict(buckets)}; {distinct} distinct contexts"
            del data
        rows_by_repo[repo] += rows
        if expect["rows"] is not None and rows != expect["rows"]:
            problems.append(f"{repo}/{path}: {rows} rows, expected {expect['rows']}")
        off = f"{(size / want - 1) * 100:+.1f}%" if want else "size unpublished"
        if want and abs(size / want - 1) > 0.10:
            problems.append(f"{repo}/{path}: {size:,} bytes, {off} from {want:,}")
        out.append(
            f"  {repo}/{path}: {rows:,} rows, {size:,} bytes "
            f"({off}{f' of {want:,}' if want else ''}); {types}"
        )
    for repo, rows in TOTAL_ROWS.items():
        if rows_by_repo[repo] != rows:
            problems.append(f"{repo}: {rows_by_repo[repo]} rows in all, expected {rows}")
    for line in pin_lines(ROOT / "BOOKS"):
        fields = line.split()
        file = src / fields[2] / fields[4]
        same = sha256_file(file) == fields[6]
        out.append(
            f"  {fields[2]}/{fields[4]}: {file.stat().st_size:,} bytes, "
            f"{'the pinned text' if same else 'synthetic'}"
        )
    return out, problems


# ------------------------------------------------------------------------------------------------
# Child processes: the instrumented build, the tokenizer throughput, the naive builder.


def child_instrumented(argv):
    """Run build.main(argv) with a build.Stats: tokens counted, tokenizer time and wall time per
    source (build.py measures them itself), and the RSS of each source, read from /proc by the
    Stats' watch hook."""
    stats_path, profile_path, build_dir, build_argv = argv[0], argv[1], argv[2], argv[3:]
    sys.path.insert(0, build_dir)
    import dataclasses

    import build

    memory = {}

    def rss():
        status = Path("/proc/self/status").read_text()
        get = lambda k: int(re.search(rf"^{k}:\s+(\d+)", status, re.M).group(1)) / 1024
        return get("VmRSS"), get("VmHWM")

    def watch(name, event):
        m = memory.setdefault(name, {})
        if event == "start":
            m["rss_start_mib"] = rss()[0]
            try:  # reset the peak, so that each source's peak is its own
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                pass
        elif event == "read":
            m["rss_after_read_mib"] = rss()[0]
        else:
            m["rss_mib"], m["hwm_mib"] = rss()

    stats = build.Stats(watch=watch)
    t0 = time.perf_counter()
    if profile_path != "-":
        import cProfile

        prof = cProfile.Profile()
        rc = prof.runcall(build.main, build_argv, stats)
        prof.dump_stats(profile_path)
    else:
        rc = build.main(build_argv, stats)
    result = {
        "sources": {
            name: dataclasses.asdict(s) | memory.get(name, {"hwm_mib": 0.0})
            for name, s in stats.sources.items()
        },
        "phases": stats.phases,
        "wall_s": time.perf_counter() - t0,
        "rc": rc,
    }
    Path(stats_path).write_text(json.dumps(result, indent=1))
    return rc or 0


def child_throughput(argv):
    """Two-thread encode_batch_fast throughput on 32k-character chunks of each source's rows.

    The tokenizer keeps a cache of the words it has split; timing the same chunks again would
    measure that cache, not the tokenizer, while a build encodes each text once. So every pass
    loads the tokenizer afresh and encodes the sources in the build's order: when a source is
    timed, the cache holds the words of the sources before it, as in a build, never its own."""
    stats_path, tokenizer, out, cap = argv[0], argv[1], Path(argv[2]), int(argv[3])
    from tokenizers import Tokenizer

    manifest = json.loads((out / "manifest.json").read_text())
    texts = {}
    for split in ("standard", "full"):
        table = pq.read_table(out / f"{split}.parquet", columns=["messages"]).column(0).to_pylist()
        for r in manifest["rows"]:
            if r["split"] == split:
                texts.setdefault(r["name"], []).extend(
                    m["content"]
                    for m in orjson.loads(table[r["index"]])
                    if isinstance(m.get("content"), str)
                )
    chunks = {}
    for name, ts in texts.items():
        # The source's texts end to end, cut every 32,768 characters; chunks spread evenly over it.
        joined = "\n".join(ts)
        starts = range(0, len(joined), 32_768)
        step = max(1, len(starts) * 32_768 // cap)
        chunks[name] = [joined[i : i + 32_768] for i in starts[::step]]
    result = {}
    for _ in range(3):  # the best of three passes, each with a fresh tokenizer
        tok = Tokenizer.from_file(tokenizer)
        tok.encode_batch_fast(["warm up the thread pool"] * 8)
        for name, cs in chunks.items():
            tokens, t0 = 0, time.perf_counter()
            for i in range(0, len(cs), 8):
                tokens += sum(
                    len(e) for e in tok.encode_batch_fast(cs[i : i + 8], add_special_tokens=False)
                )
            seconds = time.perf_counter() - t0
            if name not in result or seconds < result[name]["seconds"]:
                size = sum(map(len, cs))
                result[name] = dict(
                    tokens=tokens, chars=size, seconds=seconds, tps=tokens / seconds
                )
    Path(stats_path).write_text(json.dumps(result, indent=1))
    return 0


def child_naive(argv):
    """Every candidate's whole prompt tokenized with plain encode (a sample, extrapolated)."""
    stats_path, build_dir, src, tokenizer, rev, books = (
        argv[0],
        argv[1],
        Path(argv[2]),
        argv[3],
        argv[4],
        argv[5],
    )
    budget = int(argv[6])
    sys.path.insert(0, build_dir)
    import build

    tok = build.Tokens(Path(tokenizer), 2)
    rev_pins, book_pins = build.read_pins(rev, "rev"), build.read_pins(books, "books")
    result = {}
    for name, source in build.SOURCES.items():
        files = build.source_files(source, rev_pins, book_pins)
        for pin in files:
            pin.file = src / pin.repo / pin.path
            pin.size = pin.file.stat().st_size
        t0 = time.perf_counter()
        cands = list(build.READERS[name](source, files, Counter()))
        read_s = time.perf_counter() - t0
        cands.sort(key=lambda c: c.key)
        views = {s.view for s in source.slots}

        def weight(c):
            # The same measure for every candidate of a source: the bytes of its row in the file
            # when the reader gives them, else its byte bound, else its contents' bytes.
            if c.size:
                return c.size
            if c.bound < build.INF:
                return c.bound
            if c.book is not None:
                return len(c.book.text[c.book.start : c.book.ends[-1]].encode())
            return sum(len(t.encode()) for t in map(build.content_text, c.messages))

        weights = [weight(c) for c in cands]
        total = sum(weights)
        step = max(1, min(len(cands) // 4 or 1, round(total / budget))) if total > budget else 1
        sample = list(range(0, len(cands), step))
        lazy = [cands[i] for i in sample if cands[i].messages is None and cands[i].load]
        t0 = time.perf_counter()
        groups = {}
        for c in lazy:
            groups.setdefault(c.load, []).append(c)
        for load, group in groups.items():
            load(group)
        fetch_s = time.perf_counter() - t0
        tokens, seconds, sample_weight = 0, 0.0, 0
        for i in sample:
            c = cands[i]
            if c.book is not None:
                b = c.book
                messages = build.user(
                    build.BOOK_INSTRUCTION[b.lang] + "\n\n" + b.text[b.start : b.ends[-1]]
                )
            else:
                messages = c.messages
                if views & {"before-last", "cut"}:
                    k = build.last_assistant(messages)
                    messages = messages[:k] if k else messages
            t0 = time.perf_counter()
            tokens += build.prompt_tokens_plain(tok, messages)
            seconds += time.perf_counter() - t0
            sample_weight += weights[i]
        scale = total / max(sample_weight, 1)
        result[name] = dict(
            candidates=len(cands),
            sampled=len(sample),
            read_s=read_s,
            fetch_s=fetch_s,
            sample_tokens=tokens,
            sample_s=seconds,
            share=1 / scale,
            encode_s=seconds * scale,
            tokens=tokens * scale,
        )
        del cands
    Path(stats_path).write_text(json.dumps(result, indent=1))
    return 0


# ------------------------------------------------------------------------------------------------
# The benchmark


# A minimal launcher between the benchmark and the measured process: Linux carries a process's
# peak RSS across fork and exec, so a child started directly by this (large) process would report
# this process's peak as its own. The launcher is small, and its child starts from it.
LAUNCHER = """
import json, os, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(p.pid, 0)
wall = time.perf_counter() - t0
p.returncode = os.waitstatus_to_exitcode(status)
with open(sys.argv[1], "w") as f:
    json.dump({"rc": p.returncode, "wall": wall, "maxrss_mib": usage.ru_maxrss / 1024}, f)
"""


def run(cmd, log, env=None):
    """Run cmd; return (exit status, wall seconds, peak RSS in MiB of that process alone)."""
    stats = log.with_name(log.name + ".rusage.json")
    with open(log, "wb") as f:
        subprocess.run(
            [sys.executable, "-c", LAUNCHER, str(stats), *map(str, cmd)],
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=env,
            check=False,
        )
    r = json.loads(stats.read_text())
    return r["rc"], r["wall"], r["maxrss_mib"]


def child(mode, *args, env=None, log):
    cmd = [sys.executable, str(Path(__file__).resolve()), "_child", mode, *map(str, args)]
    rc, wall, rss = run(cmd, log, env)
    if rc:
        sys.exit(f"bench: the {mode} child failed (exit {rc}); see {log}")
    return wall, rss


def measure_sha(src, files):
    t0 = time.perf_counter()
    for f in files:
        sha256_file(src / f)
    return time.perf_counter() - t0


NEEDED = {  # the columns a builder has to read, per parquet repo
    "openai/mrcr": ["prompt"],
    "SWE-bench/SWE-smith-trajectories": ["messages", "traj_id"],
    "allenai/WildChat-4.8M": [
        "conversation.list.element.role",
        "conversation.list.element.content",
        "language",
        "toxic",
        "redacted",
        "turn",
    ],
    "openai/gsm8k": ["question"],
    "AI-MO/NuminaMath-1.5": ["problem", "source", "synthetic"],
    "openai/openai_humaneval": ["prompt"],
    "google-research-datasets/mbpp": ["prompt", "test_list"],
    "XiaomiMiMo/MiMo-V2.6-RL-oss": ["prompt", "extra_info.lang"],
}


def measure_read(src, files):
    """The reading any builder must do, per file: parse JSON, read needed parquet columns."""
    times = {}
    for rel in files:
        path = src / rel
        repo = "/".join(rel.split("/")[:2])
        t0 = time.perf_counter()
        if rel.endswith(".json") and "tokenizer" not in rel:
            orjson.loads(path.read_bytes())
        elif rel.endswith(".jsonl"):
            with open(path, "rb") as f:
                for line in f:
                    orjson.loads(line)
        elif rel.endswith(".parquet"):
            pf = pq.ParquetFile(path)
            cols = [c for c in NEEDED[repo] if c.split(".")[0] in pf.schema_arrow.names]
            for _ in pf.iter_batches(columns=cols, batch_size=1024):
                pass
        elif rel.endswith(".txt"):
            path.read_bytes().decode("utf-8")
        else:
            continue
        times[rel] = time.perf_counter() - t0
    return times


def fmt_table(headers, rows):
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    line = lambda r: (
        "  "
        + "  ".join(
            str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(r, widths))
        )
    )
    return "\n".join([line(headers)] + [line(r) for r in rows])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_child"]:
        mode = {
            "instrumented": child_instrumented,
            "throughput": child_throughput,
            "naive": child_naive,
        }
        return mode[argv[1]](argv[2:])
    p = argparse.ArgumentParser(
        description="Full-size benchmark of build.py (see the module docstring)."
    )
    p.add_argument("--cache", type=Path, default=ROOT / "bench-data")
    p.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    p.add_argument("--build", type=Path, default=ROOT / "build.py", help="the build.py to measure")
    p.add_argument("--regenerate", action="store_true")
    p.add_argument("--generate-only", action="store_true")
    p.add_argument("--gen-jobs", type=int, default=2)
    p.add_argument("--naive-budget", type=int, default=3_000_000)
    p.add_argument("--skip-naive", action="store_true")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args(argv)
    tokenizer, build_py = args.tokenizer.resolve(), args.build.resolve()
    if not tokenizer.is_file():
        sys.exit(
            f"bench: tokenizer {args.tokenizer} not found; pass --tokenizer PATH (a Qwen tokenizer.json)"
        )
    cache = args.cache.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    src = cache / "src"

    stamp, generated = ensure_sources(cache, tokenizer, args.regenerate, args.gen_jobs)
    if generated is not None:
        print(f"generation: {generated:.1f} s with {args.gen_jobs} processes", file=sys.stderr)
    lines, problems = check_sources(cache)
    print(
        f"sources ({GENERATOR}; generated in {stamp['generate_s']} s with {stamp.get('gen_jobs', '?')} processes, "
        f"{'real text' if stamp['key']['realdata'] else 'SYNTHETIC text: ../shared/realdata is missing'}):"
    )
    print("\n".join(lines))
    for problem in problems:
        print(f"  MISMATCH {problem}")
    if args.generate_only:
        return 1 if problems else 0

    load_before = os.getloadavg()
    files = [f for f in stamp["files"] if not f.startswith("Qwen/")]
    input_bytes = sum(stamp["files"][f][0] for f in files)
    print(
        f"measuring the floor over {len(files)} inputs, {input_bytes / 1e9:.2f} GB ...",
        file=sys.stderr,
    )
    sha_s = measure_sha(src, files)
    read = measure_read(src, files)
    read_s = sum(read.values())

    out, out2 = cache / "out", cache / "out-instrumented"
    build_argv = lambda o: [
        str(src),
        str(tokenizer),
        str(o),
        "--rev",
        str(cache / "REV"),
        "--books",
        str(cache / "BOOKS"),
        "--any-tokenizer",
        "--quiet",
    ]
    print(f"running {build_py} ...", file=sys.stderr)
    rc, wall, rss = run([sys.executable, str(build_py), *build_argv(out)], cache / "build.log")
    if rc:
        sys.exit(
            f"bench: build.py failed (exit {rc}); see {cache / 'build.log'}:\n"
            + (cache / "build.log").read_text()[-2000:]
        )

    print("running the instrumented build ...", file=sys.stderr)
    profile = cache / "profile.pstats" if args.profile else "-"
    child(
        "instrumented",
        cache / "instrumented.json",
        profile,
        build_py.parent,
        *build_argv(out2),
        log=cache / "instrumented.log",
    )
    inst = json.loads((cache / "instrumented.json").read_text())
    same = (out / "SHA256SUMS").read_bytes() == (out2 / "SHA256SUMS").read_bytes()

    print("measuring the tokenizer's two-thread throughput ...", file=sys.stderr)
    env = dict(os.environ, RAYON_NUM_THREADS="2", TOKENIZERS_PARALLELISM="true")
    child(
        "throughput",
        cache / "throughput.json",
        tokenizer,
        out,
        1_000_000,
        env=env,
        log=cache / "throughput.log",
    )
    tput = json.loads((cache / "throughput.json").read_text())

    naive = None
    if not args.skip_naive:
        print("running the naive builder (sampled) ...", file=sys.stderr)
        child(
            "naive",
            cache / "naive.json",
            build_py.parent,
            src,
            tokenizer,
            cache / "REV",
            cache / "BOOKS",
            args.naive_budget,
            env=env,
            log=cache / "naive.log",
        )
        naive = json.loads((cache / "naive.json").read_text())
    load_after = os.getloadavg()

    # The report
    manifest = json.loads((out / "manifest.json").read_text())
    selected = Counter()  # prompt tokens of the rows in the outputs (smoke rows are standard rows)
    for r in manifest["rows"]:
        if r["split"] != "smoke":
            selected[r["name"]] += r["prompt_tokens"]
    all_tokens = sum(s["tokens"] for s in inst["sources"].values())
    all_tp = sum(t["tokens"] for t in tput.values()) / sum(t["seconds"] for t in tput.values())
    floor_tok = strict_tok = 0.0
    rows = []
    for name, s in inst["sources"].items():
        # The best two-thread rate seen in this run on this source's text: the measurement above,
        # or the build's own when other work on the machine slowed the measurement down.
        tps = max(tput.get(name, {}).get("tps", all_tp), s["tokens"] / max(s["encode_s"], 1e-9))
        floor_tok += s["tokens"] / tps
        strict_tok += selected[name] / tps
        rows.append(
            [
                name,
                f"{s['read_s'] + s['select_s']:.2f}",
                f"{s['read_s']:.2f}",
                f"{s['select_s']:.2f}",
                f"{s['encode_s']:.2f}",
                f"{s['tokens']:,}",
                f"{selected[name]:,}",
                f"{tps / 1e3:,.0f}k",
                f"{s['tokens'] / tps:.2f}",
                f"{s.get('rss_start_mib', 0):,.0f}",
                f"{s.get('rss_after_read_mib', 0):,.0f}",
                f"{s['hwm_mib']:,.0f}",
            ]
        )
    floor = sha_s + read_s + floor_tok
    strict = sha_s + read_s + strict_tok
    print(
        f"\nbuild: {build_py}; machine: {os.cpu_count()} cores, load average {load_before[0]:.2f} before "
        f"and {load_after[0]:.2f} after the runs (other work on the machine slows every number)"
    )
    print(
        f"inputs: {len(files)} files, {input_bytes:,} bytes read; outputs of the two builds identical: {same}"
    )
    print(
        f"build.py: wall {wall:.1f} s, peak RSS {rss:,.0f} MiB (instrumented run: {inst['wall_s']:.1f} s)"
    )
    print(
        f"tokens counted: {all_tokens:,}, {all_tokens / wall / 1e3:,.0f}k per second of wall time; "
        f"the output rows hold {sum(selected.values()):,}"
    )
    print(
        "per source, from the instrumented run (s = seconds; tokens = counted by the build, kept = in "
        "its output rows; tok/s = the best two-thread rate seen on that source's text (encode_batch_fast "
        "on its output rows, or the build's own); "
        "floor s = tokens / tok/s; RSS in MiB: rss0 when the source starts, rss1 after reading it, "
        "peak while reading and selecting it):"
    )
    print(
        fmt_table(
            [
                "source",
                "total s",
                "read s",
                "select s",
                "encode s",
                "tokens",
                "kept",
                "tok/s",
                "floor s",
                "rss0",
                "rss1",
                "peak",
            ],
            rows,
        )
    )
    print("other phases: " + ", ".join(f"{k} {v:.2f} s" for k, v in inst["phases"].items()))
    print(
        f"floor: sha256 {sha_s:.2f} s + reading {read_s:.2f} s + tokens counted {floor_tok:.2f} s = "
        f"{floor:.2f} s; ratio wall/floor {wall / floor:.2f}"
    )
    print(
        f"  with only the output rows' tokens: {strict:.2f} s (ratio {wall / strict:.2f}); "
        f"mixed throughput {all_tp / 1e3:,.0f}k tokens/s"
    )
    slow = sorted(read.items(), key=lambda kv: -kv[1])[:5]
    print("  slowest reads: " + ", ".join(f"{k.split('/')[-1]} {v:.2f} s" for k, v in slow))
    naive_s = float("nan")
    if naive:
        n_read = sum(v["read_s"] + v["fetch_s"] for v in naive.values())
        n_enc = sum(v["encode_s"] for v in naive.values())
        naive_s = sha_s + n_read + n_enc
        share = sum(v["sample_s"] for v in naive.values()) / max(n_enc, 1e-9)
        print(
            f"naive builder (plain encode of every candidate's whole prompt): sha256 {sha_s:.1f} s + "
            f"reading {n_read:.1f} s + encode {n_enc:,.0f} s = {naive_s:,.0f} s; EXTRAPOLATED: only "
            f"{share:.1%} of that encode time was measured, on a sample of the candidates"
        )
        print(
            fmt_table(
                ["source", "candidates", "sampled", "tokens (est.)", "encode s (est.)"],
                [
                    [
                        k,
                        f"{v['candidates']:,}",
                        f"{v['sampled']:,}",
                        f"{v['tokens']:,.0f}",
                        f"{v['encode_s']:,.1f}",
                    ]
                    for k, v in naive.items()
                ],
            )
        )
    if args.profile:
        import pstats

        print(f"\nprofile of the instrumented build ({profile}), top 25 by internal time:")
        pstats.Stats(str(profile), stream=sys.stdout).sort_stats("tottime").print_stats(25)
    print(
        f"bench: wall_s={wall:.1f} peak_rss_mib={rss:.0f} floor_s={floor:.1f} ratio={wall / floor:.2f} "
        f"naive_s={naive_s:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
