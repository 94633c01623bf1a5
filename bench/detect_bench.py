"""What the judge catches (docs/scoring.md "What the judge catches"): bugs planted in an engine
from a known decode step, searched for the smallest size the judge fails, at kern's KL floor and
at an exact one.

    python bench/detect_bench.py [--prompts 3] [--dense-length 192] [--hybrid-length 512]
                                 [--real-length 64] [--from-step 64] [--real-from-step 16]
                                 [--exact 1e-10] [--models dense,hybrid,real]

Builds the miniature (tests/make_sources.py) and two tiny models (tests/make_model.py: the dense
Qwen3, and the hybrid of gated-delta-rule layers and one attention layer) in bench-data/detect/;
records for each a float32 reference of the standard split's first `--prompts` rows with a band
of two producers (the same tokens prefilled in chunks of 3 on the dense model, of 64 on the
hybrid); then runs tests/planted_engine.py with each bug from decode step `--from-step`, and the
transformers engine at each lower precision (--kv-dtype, --state-dtype, --dtype: from step 1),
and judges each run at both floors. The real model (`real`: SmolLM2-135M-Instruct as
tests/real_model.py makes it, its float32 directory) is judged on the first `--prompts` rows of
tests/real (real text: a GSM8K question, HumanEval/0, a GSM8K chat), its band in chunks of 64,
decoding `--real-length` steps with each bug from `--real-from-step` (its rows are shorter than the
miniature's). A continuous size is searched over decades from the largest
down until a size passes at both floors, then refined on the 1-2-5 grid below the smallest
failing decade. Prints the table and writes it, with every run, to bench-data/detect/.
One torch thread: on a tiny model a second one only waits (on a shared machine, ten times)."""

import argparse
import sys
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import score  # noqa: E402
from scoring import compare  # noqa: E402
from scoring.record import candidate, fed  # noqa: E402
from scoring.trace import read_trace  # noqa: E402

DATA = REPO / "bench-data" / "detect"
BAND_CHUNK = {"dense": 3, "hybrid": 64, "real": 64}
ARCH = {"dense": "qwen3", "hybrid": "qwen3_5"}
# Each planted bug: what its size is, and the decades searched (largest first); None: no size.
BUGS = {
    "noise": ("standard deviation of the noise on each logit", [10.0**-e for e in range(1, 8)]),
    "scale": ("logits times 1 + size", [10.0**-e for e in range(1, 8)]),
    "rotary": ("positions the rotary angle is ahead", [10.0**-e for e in range(0, 6)]),
    "mask": ("the first token's attention score lowered by", [10.0**-e for e in range(-1, 5)]),
    "unfed": ("one token not fed", None),
    "reset": ("the cache emptied", None),
}
PRECISION = {
    "dense": [("kv_dtype", "float16"), ("kv_dtype", "bfloat16"), ("kv_dtype", "float8_e4m3fn"),
              ("dtype", "float16"), ("dtype", "bfloat16")],
    "hybrid": [("state_dtype", "float16"), ("state_dtype", "bfloat16"), ("kv_dtype", "bfloat16"),
               ("dtype", "bfloat16")],
    "real": [("kv_dtype", "float16"), ("kv_dtype", "bfloat16"), ("kv_dtype", "float8_e4m3fn"),
             ("dtype", "float16"), ("dtype", "bfloat16")],
}  # fmt: skip


def model_and_rows(name):
    """The model's directory and the `--rows` flags of the split it is judged on: a tiny model
    made here, on the miniature's standard split; the real model from tests/real_model.py's cache,
    on tests/real."""
    if name == "real":
        import real_model
        import real_rows

        return real_model.make().hf, [str(real_rows.OUT), "--split", "smoke"]
    from make_model import make_model
    from make_sources import miniature

    model = DATA / name
    if not (model / "config.json").is_file():
        make_model(model, ARCH[name])
    return model, [str(miniature(DATA))]


def reference(name, args):
    """The model and its reference with the band, made once for these settings."""
    model, split = model_and_rows(name)
    length = getattr(args, f"{name}_length")
    ref = DATA / f"{name}-{args.prompts}x{length}.parquet"
    if not ref.is_file():
        tmp = ref.with_suffix(".tmp.parquet")
        common = ["--model", str(model), "--out", str(tmp), "--quiet", "--replace"]
        rows = ["--rows", *split, "--first", str(args.prompts), "--length", str(length)]
        assert score.main(["record", *rows, *common]) == 0
        band = ["--corpus", str(tmp), "--producer", f"chunk{BAND_CHUNK[name]}", "--chunk",
                str(BAND_CHUNK[name])]  # fmt: skip
        assert score.main(["record", *band, *common[:-1]]) == 0
        tmp.rename(ref)
    return model, read_trace(ref)


def judged(engine, model, ref, floors):
    """One run of the engine, judged at each floor: verdict, drift step, first flip's step."""
    cand, full, _ = candidate(fed(engine, "the engine", ref, str(model)))
    got = {}
    for floor in floors:
        j = compare.judge(ref, cand, full, floor=float(floor))
        first = sorted(j["results"])[0]
        c = j["results"][first]
        step, _ = compare.steps_and_phases(ref, c)
        flips = step[c.flip]
        got[floor] = dict(word=j["verdict"].word, drift=j["drift"]["overall"],
                          flip=int(flips.min()) if len(flips) else None,
                          kl_p50=compare.quantile(c.kl, 0.5), kl_max=float(c.kl.max()))  # fmt: skip
    return got


def search(run, grid, floors):
    """Sizes run: decades from the largest down until one passes at every floor, then for each
    floor the 1-2-5 grid below its smallest failing decade."""
    runs = {}
    for size in grid:
        runs[size] = run(size)
        if all(runs[size][f]["word"] == "PASS" for f in floors):
            break
    for f in floors:
        fails = [s for s in runs if runs[s][f]["word"] == "FAIL"]
        if not fails:
            continue
        d = min(fails)
        for size in (d / 2, d / 5):
            size = float(f"{size:.0e}")
            if size not in runs:
                runs[size] = run(size)
            if runs[size][f]["word"] != "FAIL":
                break
    return runs


def smallest(runs, floor):
    """The smallest size failing at `floor` above which every size tried fails too."""
    best = None
    for size in sorted(runs, reverse=True):
        if runs[size][floor]["word"] != "FAIL":
            break
        best = size
    return best


def cell(runs, floor, planted):
    """Two table cells: the smallest failing size (a run without a size: its verdict), and the
    drift step minus the planted step at the smallest size whose drift is found (and that size)."""
    if None in runs:
        r = runs[None][floor]
        drift = "-" if r["drift"] is None else f"{r['drift'] - planted:+d}"
        return ("fails" if r["word"] == "FAIL" else "passes"), drift
    size, found = smallest(runs, floor), None
    for s in sorted(runs, reverse=True):
        if runs[s][floor]["drift"] is None:
            break
        found = s
    if size is None:
        return "passes", "-"
    if found is None:
        return f"{size:g}", "-"
    return f"{size:g}", f"{runs[found][floor]['drift'] - planted:+d} (size {found:g})"


def bench(name, args, rows, log):
    import torch
    from planted_engine import DEFAULT_SIZE, Planted

    from scoring.engines.transformers import Transformers

    torch.set_num_threads(1)
    model, ref = reference(name, args)
    floors = (compare.KL_FLOOR, args.exact)
    floors = [f"{f:g}" for f in floors]  # the keys of judged()
    from_step = args.real_from_step if name == "real" else args.from_step
    engine = Planted(str(model), from_step=from_step)

    def planted(bug):
        def run(size):
            engine.bug, engine.size = bug, DEFAULT_SIZE[bug] if size is None else size
            got = judged(engine, model, ref, floors)
            log.append(dict(model=name, bug=bug, size=size, judged=got))
            print(f"  {name} {bug} {size}: "
                  + ", ".join(f"{f} {g['word']} drift {g['drift']}" for f, g in got.items()),
                  file=sys.stderr, flush=True)  # fmt: skip
            return got

        return run

    correct = {None: planted("none")(None)}
    rows.append((name, "none (the correct engine)", *(cell(correct, f, 0) for f in floors)))
    for bug, (what, grid) in BUGS.items():
        runs = {None: planted(bug)(None)} if grid is None else search(planted(bug), grid, floors)
        rows.append((name, f"{bug}: {what}", *(cell(runs, f, from_step) for f in floors)))
    for flag, dtype in PRECISION[name]:
        setting = f"--{flag.replace('_', '-')} {dtype}"
        got = judged(Transformers(str(model), **{flag: dtype}), model, ref, floors)
        log.append(dict(model=name, setting=setting, judged=got))
        rows.append((name, f"`{setting}`", *(cell({None: got}, f, 1) for f in floors)))


def table(rows, args):
    lines = [
        f"| model | planted | kern's floor 1e-6: fails from | drift step - planted | "
        f"{args.exact:g}: fails from | drift step - planted |",
        "|---|---|---|---|---|---|",
    ]
    for name, what, (s1, d1), (s2, d2) in rows:
        lines.append(f"| {name} | {what} | {s1} | {d1} | {s2} | {d2} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--dense-length", type=int, default=192)
    ap.add_argument("--hybrid-length", type=int, default=512)
    ap.add_argument("--real-length", type=int, default=64)
    ap.add_argument("--from-step", type=int, default=64)
    ap.add_argument("--real-from-step", type=int, default=16)
    ap.add_argument("--exact", type=float, default=1e-10)
    ap.add_argument("--models", default="dense,hybrid,real")
    args = ap.parse_args(argv)
    DATA.mkdir(parents=True, exist_ok=True)
    rows, log, took = [], [], {}
    for name in args.models.split(","):
        t = time.time()
        bench(name, args, rows, log)
        took[name] = time.time() - t
    text = table(rows, args)
    print(text)
    print("seconds: " + ", ".join(f"{n} {t:.0f}" for n, t in took.items()))
    (DATA / "table.md").write_text(text + "\n")
    (DATA / "runs.json").write_bytes(orjson.dumps(dict(args=vars(args), seconds=took, runs=log),
                                                  option=orjson.OPT_SERIALIZE_NUMPY))  # fmt: skip


if __name__ == "__main__":
    main()
