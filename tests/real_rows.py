"""Rows of real text for the real model's tests: a split that `score.py record --rows` reads.

    python tests/real_rows.py [--realdata DIR] [--out DIR]

writes OUT/smoke.parquet and OUT/manifest.json (default OUT: tests/real, which the repository
keeps, so that a fresh clone without ../shared judges the same rows) from the real files of
../shared/realdata (the GSM8K test file, HumanEval, the books as BOOKS pins them), each checked
against its sha256 first. The rows, worded as build.py words its prompts, fit SmolLM2's 8,192
tokens of context with room for the decode:

    gsm8k       GSM8K test question 0
    humaneval   HumanEval/0, a function to complete
    chat        a multi-turn chat: GSM8K test questions 1, 2 and 3, the first two answered by
                their real solutions
    gutenberg   two excerpts, from the start of Bleak House and of Middlemarch up to the last
                paragraph end within BOOKS' characters (about 1,700 and 2,500 of SmolLM2's
                tokens)

Run again, it writes the same bytes: tests/test_real_model.py checks the kept copy against it
where ../shared is there.
"""

import argparse
import gzip
import json
import sys
from pathlib import Path

import orjson

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS.parent))
import build  # noqa: E402

REALDATA = TESTS.parent.parent / "shared" / "realdata"
OUT = TESTS / "real"
# (repository, commit, file, sha256 of the file as ../shared/realdata holds it, measured there)
GSM8K = ("openai/grade-school-math", "3101c7d5072418e28b9008a6636bde82a006892c",
         "gsm8k-test.jsonl", "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14")  # fmt: skip
HUMANEVAL = ("openai/human-eval", "6d43fb980f9fee3c892a914eda09951f772ad10d", "HumanEval.jsonl.gz",
             "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef")  # fmt: skip
BOOKS = {"1023-0.txt": 7_000, "145-0.txt": 10_000}  # the book's file: characters at most


def checked(realdata, name, want):
    path = Path(realdata) / name
    got = build.sha256_file(path)
    if got != want:
        sys.exit(f"error: {path}: sha256 {got}, not the {want} it is pinned at")
    return path


def excerpt(text, limit):
    """(start, end) of the book from its body's start to its last paragraph end within `limit`
    characters (build.py's `book_body` and paragraph ends)."""
    start, end = build.book_body(text)
    ends = [m.start() for m in build.PARAGRAPH_END.finditer(text, start + 1, end)]
    return start, max(e for e in ends if e - start <= limit)


def rows(realdata):
    """[(name, source, messages)] in the split's order."""
    repo, rev, name, sha = GSM8K
    gsm = [json.loads(line) for line in checked(realdata, name, sha).read_text().splitlines()]
    repo_h, rev_h, name_h, sha_h = HUMANEVAL
    with gzip.open(checked(realdata, name_h, sha_h), "rt") as f:
        human = [json.loads(line) for line in f]
    out = [
        ("gsm8k", f"{repo}@{rev}#0", build.user(gsm[0]["question"])),
        ("humaneval", f"{repo_h}@{rev_h}#0", build.user(
            "Complete the following Python function.\n\n```python\n" + human[0]["prompt"] + "```")),
        ("chat", f"{repo}@{rev}#1,2,3", [
            {"role": "user", "content": gsm[1]["question"]},
            {"role": "assistant", "content": gsm[1]["answer"]},
            {"role": "user", "content": gsm[2]["question"]},
            {"role": "assistant", "content": gsm[2]["answer"]},
            {"role": "user", "content": gsm[3]["question"]},
        ]),
    ]  # fmt: skip
    pins = {p.path: p for p in build.read_pins(TESTS.parent / "BOOKS", "books")}
    for file, limit in BOOKS.items():
        p = pins[file]
        raw = checked(Path(realdata) / "books", file, p.sha256).read_bytes()
        text = raw.decode("utf-8").replace("\r\n", "\n")
        a, b = excerpt(text, limit)
        content = build.BOOK_INSTRUCTION[p.lang] + "\n\n" + text[a:b]
        out.append(("gutenberg", f"{p.repo}@{p.revision}#{a}-{b}", build.user(content)))
    return out


def write(realdata=REALDATA, out=OUT):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    chosen = rows(realdata)
    records = [dict(messages=orjson.dumps(m).decode(), tools=None, source=s) for _, s, m in chosen]
    build.write_parquet(records, out / "smoke.parquet")
    manifest = dict(
        made_by="tests/real_rows.py",
        splits={"smoke": dict(rows=len(records),
                              file_sha256=build.sha256_file(out / "smoke.parquet"))},
        rows=[dict(split="smoke", index=i, source=s, name=n) for i, (n, s, _) in enumerate(chosen)],
    )  # fmt: skip
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument(
        "--realdata",
        type=Path,
        default=REALDATA,
        help="the real files (default: ../shared/realdata beside the repository)",
    )
    p.add_argument("--out", type=Path, default=OUT, help="where to write (default: tests/real)")
    a = p.parse_args(argv)
    if not a.realdata.is_dir():
        sys.exit(f"error: --realdata {a.realdata}: no such directory")
    print(f"wrote {write(a.realdata, a.out)}")


if __name__ == "__main__":
    main()
