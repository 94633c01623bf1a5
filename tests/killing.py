"""A record killed part way (tests/test_vllm.py, tests/test_llamacpp.py)."""

import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def kill_after_first_prompt(python, argv, target, seconds=600):
    """Run `python argv` (a record into `target`) from the repository and SIGKILL it as soon as
    its first prompt is staged; the staged prompts' files."""
    staging = target.parent / f".{target.name}.record"
    proc = subprocess.Popen([str(python), *map(str, argv)], cwd=REPO, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + seconds
    while not (staging / "000000.parquet").exists() and time.monotonic() < deadline:
        assert proc.poll() is None, "the record ended before it was killed"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (staging / "000000.parquet").exists(), f"no prompt staged in {seconds} s"
    return sorted(staging.glob("0*.parquet"))
