"""Mutation score of the scoring package (docs/testing.md "Mutation score of the scoring package").

    python tests/mutants_scoring.py [--dir DIR] [--max-children N] [MODULE.FUNCTION | MUTANT ...]

mutmut reads its settings from the pyproject.toml of the directory it runs in, and the
checkout's [tool.mutmut] is the builder's. So this copies the checkout (its tracked and
untracked files that git does not ignore) to DIR (default: .mutants-scoring beside the
checkout's files, git-ignored), with a [tool.mutmut] that mutates the scoring package's
arithmetic and checks and runs the fast scoring tests against each mutant, then runs mutmut
there on FUNCTIONS (default: all of them), or on the mutants named (a survivor run again after a
test was added), and prints its results. A second run in the same DIR
reuses mutmut's results for what did not change.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The functions mutated, by module: the verdict, the band, the strata and the drift; the trace's
# metadata and schedule; the merge's shards and the vocabulary's edge; the sampler and the top-k
# every engine reduces a row with. Not the code that drives an engine (the engine tests run
# models against transformers float32), nor the estimators' arithmetic (tests/test_score.py
# checks it against the plain definitions on random tables): a subset that a shared two-core
# machine runs in about half an hour.
FUNCTIONS = {
    "scoring.compare": [
        "quantiles",
        "band",
        "confident",
        "steps_and_phases",
        "strata",
        "trailing_mean",
        "left_at",
        "drift",
        "verdict",
    ],
    "scoring.trace": ["meta_error", "xǁCorpusǁschedules"],
    "scoring.record": ["whole_run"],
    "scoring.engines": [
        "sample",
        "uniforms",
        "top_k",
        "normalised",
        "sampled_top_k",
        "_drawn",
        "_log_total",
        "_top_of",
        "_at_least",
        "_shifted_exp",
    ],
    "scoring.boundary": [
        "xǁWidthǁcheck",
        "given",
        "tokens_checked",
        "scores_checked",
        "in_vocabulary",
    ],
}

# The fast tests: tables that are data, and the engine functions on arrays; none runs a model.
TESTS = ["tests/test_scoring_mutants.py", "tests/test_verdicts.py", "tests/test_score.py",
         "tests/test_sampler.py", "tests/test_boundary.py"]  # fmt: skip
SLOW = [  # test_score.py's tests that record with a model or build the miniature
    "a_record_is", "short_prompts", "same_seed", "stop_tokens_are", "decode_through", "teacher_",
    "chunkings", "lower_precision", "killed", "second_record", "shards_merge", "bad_rows",
    "template", "not_a_trace", "needs_replace", "nan_logits", "bf16_state", "against_itself",
    "off_by_one", "published_cards", "json_out_and_plot", "in_process",
    # test_boundary.py's that record or judge with a model
    "faulty_engine", "describe_json", "existing_out", "umask", "resume_with", "settings_say",
    "tokens_changed", "merge_refuses", "flag_an_engine", "transformers_refuses", "another_top_k",
    "another_tokenizer",
]  # fmt: skip

MUTATED = sorted(m.replace(".", "/") + ("/__init__.py" if m.endswith("engines") else ".py")
                 for m in FUNCTIONS)  # fmt: skip
SELECT = " and ".join(f"not {s}" for s in SLOW)
CONFIG = f"""[tool.mutmut]
source_paths = ["scoring"]
only_mutate = {MUTATED!r}
also_copy = ["score.py", "build.py"]
pytest_add_cli_args_test_selection = {TESTS!r}
pytest_add_cli_args = ["-n", "0", "-p", "no:cacheprovider", "-k", {SELECT!r}]
process_isolation = "forkserver"
timeout_multiplier = 6.0
# the tests of one mutant take a fraction of a second: a busy machine would stop them at 1 s
timeout_constant = 10.0
"""


def copy_checkout(dest):
    """The checkout's files as they are now (links kept as links) into `dest`, with the scoring
    [tool.mutmut] in its pyproject.toml; mutmut's own `mutants/` there is kept."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, files):
        src, dst = REPO / name, dest / name
        if name.startswith(dest.name + "/") or not (src.exists() or src.is_symlink()):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.is_symlink() or dst.exists():
            dst.unlink()
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)
    text = (REPO / "pyproject.toml").read_text()
    text = re.sub(r"\[tool\.mutmut\].*?(?=^\[|\Z)", CONFIG, text, flags=re.S | re.M)
    (dest / "pyproject.toml").write_text(text)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, default=REPO / ".mutants-scoring")
    p.add_argument("--max-children", type=int, default=2)
    p.add_argument("functions", nargs="*",
                   help="MODULE.FUNCTION (default: all above), or a mutant's name")  # fmt: skip
    args = p.parse_args(argv)
    names = args.functions or [f"{m}.{f}" for m, fs in FUNCTIONS.items() for f in fs]
    globs = []
    for name in names:
        if "__mutmut_" in name:  # one mutant, as `mutmut results` names it: run again
            globs.append(name)
            continue
        module, _, function = name.rpartition(".")
        if function not in FUNCTIONS.get(module, ()):
            p.error(f"{name}: not one of the functions mutated here")
        globs.append(f"{module}.{'' if function.startswith('xǁ') else 'x_'}{function}__mutmut_*")
    args.dir.mkdir(exist_ok=True)
    copy_checkout(args.dir)
    mutmut = [sys.executable, "-m", "mutmut"]
    subprocess.run([*mutmut, "run", "--max-children", str(args.max_children), *globs],
                   cwd=args.dir, check=True)  # fmt: skip
    got = subprocess.run([*mutmut, "results"], cwd=args.dir, capture_output=True, text=True)
    lines = [x for x in got.stdout.splitlines() if "not checked" not in x]
    print("\n".join(lines))
    return got.returncode


if __name__ == "__main__":
    sys.exit(main())
