"""The reviewed result of the miniature build, in tests/golden/: SHA256SUMS, manifest.json and
README.md as the build writes them, except that build.py's own sha256 (which changes with every
edit of build.py, whatever the rows) is written `<build.py sha256>` in the manifest and the card,
and SHA256SUMS lists those two files as stored. Every other byte is pinned.

    python tests/golden.py OUT    # after reviewing a build of the miniature sources in OUT

copies OUT's three files into tests/golden/ in that form."""

import hashlib
import json
import sys
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "golden"
BUILD_PY = GOLDEN.parents[1] / "build.py"
PLACEHOLDER = "<build.py sha256>"
NAMES = ("manifest.json", "README.md")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build_py_sha256() -> str:
    return sha256(BUILD_PY.read_bytes())


def relist(sums: str, old: dict, new: dict) -> str:
    """SHA256SUMS with the lines of NAMES listing `new` contents instead of `old`."""
    for name in NAMES:
        line = f"{sha256(old[name])}  {name}\n"
        assert line in sums, f"{name} is not listed as it is"
        sums = sums.replace(line, f"{sha256(new[name])}  {name}\n")
    return sums


def files(build_sha: str | None = None) -> dict[str, bytes]:
    """The golden manifest.json, README.md and SHA256SUMS for build.py of `build_sha`
    (default: the build.py of this checkout)."""
    build_sha = build_sha or build_py_sha256()
    stored = {name: (GOLDEN / name).read_bytes() for name in NAMES}
    out = {n: v.replace(PLACEHOLDER.encode(), build_sha.encode()) for n, v in stored.items()}
    out["SHA256SUMS"] = relist((GOLDEN / "SHA256SUMS").read_text(), stored, out).encode()
    return out


def update(out: Path) -> None:
    built = {name: (out / name).read_bytes() for name in (*NAMES, "SHA256SUMS")}
    build_sha = json.loads(built["manifest.json"])["build_py_sha256"]
    stored = {n: built[n].replace(build_sha.encode(), PLACEHOLDER.encode()) for n in NAMES}
    GOLDEN.mkdir(exist_ok=True)
    for name, data in stored.items():
        (GOLDEN / name).write_bytes(data)
    (GOLDEN / "SHA256SUMS").write_text(relist(built["SHA256SUMS"].decode(), built, stored))


if __name__ == "__main__":
    update(Path(sys.argv[1]))
