#!/usr/bin/env python3
"""Full-size benchmark of build.py: generated sources in the real formats, timed.

Usage, from the repository root with the project's environment:

    .venv/bin/python bench/bench.py                    # generate (once) and benchmark
    .venv/bin/python bench/bench.py --generate-only    # just make, or check, the sources
    .venv/bin/python bench/bench.py --profile          # also cProfile the build, top functions
    .venv/bin/python bench/bench.py --build /tmp/x/build.py   # measure a modified copy

Options:
    --cache DIR        where the generated sources live (default: bench-data/ at the repository
                       root, git-ignored). Reused across runs when its STAMP matches the generator
                       (the sha256 of tests/make_sources.py) and the pin files' lists;
                       --regenerate forces a new tree.
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

Generating takes about a minute with two processes and 2.5 GB of disk; a benchmark run about three
minutes (two builds, the floor's measurements and the naive builder). DIR also receives out/ and
out-instrumented/ (the two builds' outputs), a log and a JSON file per child process.

The generated tree (DIR/src) is the full size of tests/make_sources.py, the generator the tests'
miniature comes from: the same declarations (FORMATS: files, Arrow schemas, record layouts, JSON
layers, real row counts) and the same row builders, driven by full-size plans. Every file REV and
BOOKS pin, at the same path, with the real row counts and within 10% of the real sizes; text is
real text recombined (paragraphs and sentences of the books of ../shared/realdata, its GSM8K and
HumanEval rows), sized by an estimate of the tokens. Without ../shared/realdata the generator
falls back to made-up text and books (same formats and sizes, less realistic token density).
Generation is deterministic: the same tree, byte for byte, on every run. Choices where the real
files are not known: parquet written as pandas writes it (snappy, dictionary encoding; MRCR in one
row group, which makes reading a file's `prompt` column cost about 1.3 GB of Arrow memory); the
SWE-smith shard (size unpublished) gets 3,300 rows. After generating, every file is checked
against its declaration, its real row count and its real size. DIR/REV and DIR/BOOKS pin the
generated files; DIR/STAMP records the generator and the file list.

The benchmark then:
  1. measures the floor's parts: sha256 of every input (as the build's verify does), the reading
     any builder must do (parse the JSON and JSONL files, read into Arrow the parquet columns
     that build.py declares its readers read, decode the books), and the tokenizer's two-thread throughput (encode_batch_fast on
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
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import make_sources  # noqa: E402
from make_sources import sha256_file  # noqa: E402

SHARED = ROOT.parent / "shared"
REALDATA = SHARED / "realdata"
DEFAULT_TOKENIZER = SHARED / "tokenizers" / "qwen3.5-text.json"
GENERATOR = Path(make_sources.__file__)
PUBLISHED_BYTES = {"long.jsonl": 149_000_000}  # the Hub page's "149 MB"; REV has no exact size


# ------------------------------------------------------------------------------------------------
# The generated tree: stamp, generation, checks.


def stamp_key(tokenizer):
    return {
        "generator": sha256_file(GENERATOR),
        "realdata": REALDATA.is_dir(),
        "rev": [[e["repo"], e["path"]] for e in make_sources.read_rev()],  # as JSON reads it back
        "books": [b["path"] for b in make_sources.read_books()],
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
    print(f"generating full-size sources in {src} with {GENERATOR} ...", file=sys.stderr)
    t0 = time.perf_counter()
    if stamp_path.exists():
        stamp_path.unlink()
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    realdata = REALDATA if REALDATA.is_dir() else None
    times = make_sources.make_sources(src, realdata=realdata, scale="full", jobs=gen_jobs)
    for name, seconds in times.items():
        print(f"  {name:58} {seconds:7.1f} s", file=sys.stderr)
    make_sources.write_pins(src, cache / "REV", cache / "BOOKS", tokenizer_path=tokenizer)
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
    stamp_path.write_text(json.dumps(stamp, indent=1) + "\n")
    return stamp, stamp["generate_s"]


def check_sources(cache):
    """Every generated file against its declaration (the first rows of the large ones), the real
    row counts and the real sizes; returns (lines, problems)."""
    src, out, problems = cache / "src", [], []
    pins = {(e["repo"], e["path"]): e for e in make_sources.read_rev()}
    pins |= {(b["path"], b["path"]): b for b in make_sources.read_books()}
    for source in make_sources.FORMATS.values():
        total = 0
        for file in source.files:
            pin = pins[(source.repo or file.path, file.path)]
            path = src / pin["repo"] / pin["path"]
            size = path.stat().st_size
            want = int(pin["bytes"]) if pin["bytes"].isdigit() else PUBLISHED_BYTES.get(file.path)
            problems += make_sources.check_file(file, path, limit=200)
            if file.kind == "parquet":
                rows = pq.ParquetFile(path).metadata.num_rows
            elif file.kind == "jsonl":
                with open(path, "rb") as f:
                    rows = sum(1 for _ in f)
            elif file.kind == "json-array":
                rows = len(orjson.loads(path.read_bytes()))
            else:
                rows = "the pinned text" if sha256_file(path) == pin["sha256"] else "made up"
            total += rows if isinstance(rows, int) else 0
            if file.rows is not None and rows != file.rows:
                problems.append(f"{path}: {rows} rows, the real file has {file.rows}")
            off = f"{(size / want - 1) * 100:+.1f}% of {want:,}" if want else "size unpublished"
            if want and abs(size / want - 1) > 0.10:
                problems.append(f"{path}: {size:,} bytes, {off}")
            shape = f"{rows:,} rows" if isinstance(rows, int) else rows
            out.append(f"  {pin['repo']}/{pin['path']}: {size:,} bytes ({off}), {shape}")
        if source.rows is not None and total != source.rows:
            problems.append(
                f"{source.name}: {total} rows in all, the real source has {source.rows}"
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
    stats_path, build_dir, src, tokenizer, rev, books, budget = argv
    src, budget = Path(src), int(budget)
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


def measure_read(src, files, rev):
    """The reading any builder must do, per file: parse the JSON and JSONL, decode the books, and
    read the parquet columns that the repository's build.py declares its readers read (only the
    leaves they use)."""
    sys.path.insert(0, str(ROOT))
    import build

    sources = {s.repo: s for s in build.SOURCES.values() if s.repo}
    pins = {f"{p.repo}/{p.path}": p for p in build.read_pins(rev, "rev")}
    times = {}
    for rel in files:
        path = src / rel
        t0 = time.perf_counter()
        if rel.endswith(".json") and "tokenizer" not in rel:
            orjson.loads(path.read_bytes())
        elif rel.endswith(".jsonl"):
            with open(path, "rb") as f:
                for line in f:
                    orjson.loads(line)
        elif rel.endswith(".parquet"):
            pf = pq.ParquetFile(path)
            pin = pins[rel]
            cols = build.parquet_columns(pf, sources[pin.repo].fields_of(pin), path)
            for _ in pf.iter_batches(columns=cols, batch_size=1024):
                pass
        elif rel.endswith(".txt"):
            path.read_bytes().decode("utf-8")
        else:
            continue
        times[rel] = time.perf_counter() - t0
    return times


def fmt_table(headers, rows):
    """headers: the column names, comma-separated."""
    headers = headers.split(",")
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
        f"sources ({GENERATOR.relative_to(ROOT)}; generated in {stamp['generate_s']} s with {stamp.get('gen_jobs', '?')} processes, "
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
    read = measure_read(src, files, cache / "REV")
    read_s = sum(read.values())

    out, out2 = cache / "out", cache / "out-instrumented"
    pins = ["--rev", cache / "REV", "--books", cache / "BOOKS"]
    build_argv = lambda o: [*map(str, (src, tokenizer, o, *pins)), "--any-tokenizer", "--quiet"]
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
    columns = "source,total s,read s,select s,encode s,tokens,kept,tok/s,floor s,rss0,rss1,peak"
    print(fmt_table(columns, rows))
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
                "source,candidates,sampled,tokens (est.),encode s (est.)",
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
