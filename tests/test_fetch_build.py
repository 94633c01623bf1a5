"""The README's main job, unchanged, against a local mirror of the miniature sources: fetch.sh
downloads and verifies every pinned file, then build.py builds the three splits from them."""

import subprocess
import sys
from pathlib import Path

from golden import files
from mirror import checkout, serve

import build

REPO = Path(__file__).resolve().parents[1]


def test_the_readme_main_job_runs_against_a_mirror(mini, tmp_path):
    # A checkout whose pin files are the miniature ones: the commands are the README's own.
    root = checkout(mini, tmp_path / "kern-prompts", "fetch.sh", "build.py")
    with serve(mini) as mirror:
        command = (
            "mkdir -p src && (cd src && bash ../fetch.sh) && "
            f"{sys.executable} build.py src src/Qwen/Qwen3.8-27B/tokenizer.json out --quiet"
        )
        result = subprocess.run(
            ["bash", "-c", command],
            cwd=root,
            env=mirror.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert result.returncode == 0, result.stderr[-3000:]
    served = mirror.hub.files | mirror.books.files
    requested = {r.path for r in mirror.hub.requests + mirror.books.requests}
    assert set(served) <= requested, sorted(set(served) - requested)
    assert sorted(p.name for p in (root / "out").iterdir()) == sorted(build.OUT_FILES)
    # Same sources, same bytes: the mirror build equals the reviewed golden build.
    golden = files()["SHA256SUMS"].decode()
    assert (root / "out" / "SHA256SUMS").read_text() == golden
