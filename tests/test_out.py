"""OUT is a place that can hold a person's files: a build replaces only an empty directory or a
previous build, keeps OUT whole at every instant (even when killed), never writes elsewhere, and
cleans up or restores what a killed build left (docs/building.md "What a build writes",
docs/failures.md)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from test_errors import REPO, Case, _tree, previous  # noqa: F401 (a fixture)

import build

OUT_FILES = build.OUT_FILES

PATCHED = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
import build
exec(sys.argv[2])
sys.exit(build.main(sys.argv[3:]))
"""


def run_patched(case, patch, *extra, **kw):
    """Run build.py's main after `patch` (Python source) has changed something in build."""
    cmd = [sys.executable, "-c", PATCHED, str(REPO), patch, *case.command(*extra, **kw)[2:]]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)


def leftovers(parent):
    return sorted(p.name for p in parent.iterdir() if re.match(r"\.out\.(tmp|old|lock)", p.name))


@pytest.fixture
def case(mini, previous, tmp_path):  # noqa: F811
    return Case(mini, previous, tmp_path)


# ------------------------------------------------------------------------------------------------
# What may be replaced


def damage_modified(out, name):
    with open(out / name, "ab") as f:
        f.write(b"\n")


def damage_directory(out, name):
    (out / name).unlink()
    (out / name).mkdir()
    (out / name / "mine.txt").write_text("a person's file\n")


def damage_symlink(out, name):
    outside = out.parent.parent / f"outside-{name}"
    outside.write_bytes((out / name).read_bytes())
    (out / name).unlink()
    (out / name).symlink_to(outside)


def damage_missing(out, name):
    (out / name).unlink()


DAMAGES = {
    "modified": damage_modified,
    "directory": damage_directory,
    "symlink": damage_symlink,
    "missing": damage_missing,
}


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("name", OUT_FILES)
def test_out_that_is_not_exactly_a_previous_build_is_refused(case, name, damage):
    """A build is recognised by its content: the six files, regular, matching its SHA256SUMS.
    Anything else may be a person's work and is left exactly as it is."""
    DAMAGES[damage](case.out, name)
    case.before, whole = _tree(case.parent), _tree(case.root)  # a link's target included
    result = case.run("--only", "gsm8k")
    case.failed(result, f"OUT {case.out}", "choose an empty or new directory")
    assert _tree(case.root) == whole


def test_a_persons_readme_and_a_folder_named_like_a_build_file_are_kept(case):
    shutil.rmtree(case.out)
    case.out.mkdir()
    (case.out / "README.md").write_text("my notes\n")
    (case.out / "manifest.json").mkdir()
    (case.out / "manifest.json" / "plan.txt").write_text("keep\n")
    case.before = _tree(case.parent)
    case.failed(case.run("--only", "gsm8k"), f"OUT {case.out}", "not a build")


@pytest.mark.parametrize("kind", ["empty", "previous"])
def test_an_empty_directory_or_a_previous_build_is_replaced(case, kind):
    if kind == "empty":
        shutil.rmtree(case.out)
        case.out.mkdir()
    result = case.run("--only", "gsm8k", "--quiet")
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(case.out)) == sorted(OUT_FILES)
    assert leftovers(case.parent) == []


@pytest.mark.parametrize("where", ["cwd", "parent-of-cwd"])
def test_out_that_is_or_holds_the_current_directory_is_refused_up_front(case, where):
    here = case.root / "here"
    here.mkdir()
    cwd = here if where == "cwd" else here / "deeper"
    cwd.mkdir(exist_ok=True)
    before = _tree(case.root)
    out = "." if where == "cwd" else ".."
    cmd = case.command("--only", "gsm8k", out=out)
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60)
    case.before = _tree(case.parent)
    case.failed(result, "current directory")
    assert _tree(case.root) == before, "nothing is left behind, in OUT or beside it"


# ------------------------------------------------------------------------------------------------
# OUT as a link, a mount point, immutable


def test_a_symbolic_link_to_a_previous_build_is_followed_and_kept(case):
    real = case.parent / "real"
    case.out.rename(real)
    case.out.symlink_to(real)
    result = case.run("--only", "gsm8k,humaneval", "--quiet")
    assert result.returncode == 0, result.stderr
    assert case.out.is_symlink() and os.readlink(case.out) == str(real)
    assert "humaneval" in (real / "manifest.json").read_text()
    assert sorted(os.listdir(case.parent)) == ["out", "real"]


def test_a_dangling_symbolic_link_is_followed(case):
    shutil.rmtree(case.out)
    target = case.parent / "made-here"
    case.out.symlink_to(target)
    result = case.run("--only", "gsm8k", "--quiet")
    assert result.returncode == 0, result.stderr
    assert case.out.is_symlink() and sorted(os.listdir(target)) == sorted(OUT_FILES)


def test_a_symbolic_link_loop_is_refused(case):
    shutil.rmtree(case.out)
    case.out.symlink_to(case.out)
    case.before = _tree(case.parent)
    case.failed(case.run("--only", "gsm8k"), str(case.out), "symbolic link")


def test_an_immutable_out_is_found_before_the_build(case):
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not available")
    if subprocess.run(["chattr", "+i", str(case.out)], capture_output=True).returncode:
        pytest.skip("this file system or user cannot set the immutable flag")
    try:
        result = case.run("--only", "gsm8k")
        case.failed(result, str(case.out), "immutable")
        assert "gsm8k:" not in result.stderr, "refused before reading any source"
    finally:
        subprocess.run(["chattr", "-i", str(case.out)], check=True)


def test_a_mount_point_is_found_before_the_build(mini, previous, tmp_path):  # noqa: F811
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-m", "true"], capture_output=True).returncode:
        pytest.skip("unshare -m (a private mount namespace) is not available")
    case = Case(mini, previous, tmp_path, had_out=False)
    case.out.mkdir()
    case.before = _tree(case.parent)
    script = 'mount -t tmpfs tmpfs "$1" || exit 99; shift; exec "$@"'
    cmd = [unshare, "-m", "sh", "-c", script, "sh", str(case.out), *case.command("--only", "gsm8k")]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    if result.returncode == 99:
        pytest.skip(f"tmpfs mount failed: {result.stderr.strip()}")
    case.failed(result, str(case.out), "mount point")


# ------------------------------------------------------------------------------------------------
# Permissions, and two builds at once


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_out_has_the_permissions_of_a_normal_new_directory(case, umask):
    shutil.rmtree(case.out)
    cmd = case.command("--only", "gsm8k", "--quiet")
    result = subprocess.run(
        cmd,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: os.umask(umask),
    )
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(case.out.stat().st_mode) == 0o777 & ~umask
    for name in OUT_FILES:
        assert stat.S_IMODE((case.out / name).stat().st_mode) == 0o666 & ~umask


def test_a_second_build_into_the_same_out_is_refused_while_the_first_runs(case):
    lock = case.parent / ".out.lock"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        case.before = _tree(case.parent)
        line = case.failed(case.run("--only", "gsm8k"), str(case.out), "another build")
        assert str(lock) in line
    lock.unlink()
    result = case.run("--only", "gsm8k", "--quiet")
    assert result.returncode == 0, result.stderr
    assert leftovers(case.parent) == [], "the lock is gone with the build that took it"


SECOND_BUILD = """
import json, subprocess
write = build.build_outputs
def build_outputs(*args):
    m = write(*args)  # the first build's files are staged; it holds its lock
    second = subprocess.run([sys.executable, sys.argv[1] + "/build.py", *sys.argv[3:]],
                            capture_output=True, text=True, timeout=120)
    build.Path({result!r}).write_text(json.dumps([second.returncode, second.stderr]))
    return m
build.build_outputs = build_outputs
"""


def test_a_second_real_build_into_the_same_out_is_refused_while_the_first_runs(case):
    """Two builds, each taking the lock its own way: the second starts while the first holds
    its staged files, is refused with one line and changes nothing; the first then publishes."""
    result_path = case.root / "second.json"
    patch = SECOND_BUILD.format(result=str(result_path))
    first = run_patched(case, patch, "--only", "gsm8k,humaneval", "--quiet")
    assert first.returncode == 0, first.stderr
    code, err = json.loads(result_path.read_text())
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith(f"error: another build is writing OUT {case.out}"), err
    assert "humaneval" in (case.out / "manifest.json").read_text(), "the first build published"
    assert leftovers(case.parent) == []


def test_builds_into_two_outs_beside_each_other_run_at_once(case):
    """The lock is OUT's own, not its parent's."""
    lock = case.parent / ".other.lock"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        result = case.run("--only", "gsm8k", "--quiet")
    assert result.returncode == 0, result.stderr


# ------------------------------------------------------------------------------------------------
# Killed while publishing: OUT holds the old build or the new one, and the next build tidies up

KILL_AFTER_EXCHANGE = """
def remove_build(path):
    os.kill(os.getpid(), signal.SIGKILL)
build.remove_build = remove_build
"""

NO_EXCHANGE = """
def renameat2(a, b, flags):
    raise OSError(errno.ENOSYS, "no renameat2 here")
import errno
import json
build.renameat2 = renameat2
"""

KILL_BETWEEN_RENAMES = (
    NO_EXCHANGE
    + """
renames = []
rename = os.rename
def counted(a, b):
    renames.append((a, b))
    if len(renames) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return rename(a, b)
os.rename = counted
"""
)


def test_killed_after_the_exchange_out_holds_the_new_build_and_the_old_is_removed_next(case):
    old = _tree(case.out)
    result = run_patched(case, KILL_AFTER_EXCHANGE, "--only", "gsm8k,humaneval", "--quiet")
    assert result.returncode == -signal.SIGKILL
    new = _tree(case.out)
    assert new != old and "humaneval" in new["manifest.json"].decode()
    (staged,) = [p for p in case.parent.iterdir() if p.name.startswith(".out.tmp-")]
    assert _tree(staged) == old | {build.MARKER: build.MARKER_TEXT}, "the old build waits, marked"
    result = case.run("--only", "gsm8k,humaneval", "--quiet")
    assert result.returncode == 0, result.stderr
    assert f"note: removed {staged}, left by an interrupted build" in result.stderr
    assert _tree(case.out) == new
    assert leftovers(case.parent) == []


def test_without_an_exchange_two_renames_publish_the_build(case):
    result = run_patched(case, NO_EXCHANGE, "--only", "gsm8k,humaneval", "--quiet")
    assert result.returncode == 0, result.stderr
    assert "humaneval" in (case.out / "manifest.json").read_text()
    assert leftovers(case.parent) == []


def test_killed_between_two_renames_the_next_build_restores_out_first(case):
    old = _tree(case.out)
    result = run_patched(case, KILL_BETWEEN_RENAMES, "--only", "gsm8k,humaneval", "--quiet")
    assert result.returncode == -signal.SIGKILL
    assert not case.out.exists(), "the kill came between the renames"
    # The next build fails for another reason, yet first puts the previous build back.
    result = case.run("--only", "gsm8k", src=case.root / "no-such-src")
    assert result.returncode == 1
    assert f"note: restored OUT {case.out} from " in result.stderr
    assert "note: removed " in result.stderr
    assert _tree(case.out) == old
    assert leftovers(case.parent) == []


def test_a_leftover_that_holds_other_files_is_not_touched(case):
    mine = case.parent / ".out.tmp-mine"
    mine.mkdir()
    build.mark(mine)
    (mine / "thesis.tex").write_text("years of work\n")
    case.before = _tree(case.parent)
    result = case.run("--only", "gsm8k", "--quiet")
    assert result.returncode == 0, result.stderr
    assert f"note: left {mine} alone" in result.stderr
    assert (mine / "thesis.tex").read_text() == "years of work\n"


@pytest.mark.parametrize("kind", ["tmp", "old"])
@pytest.mark.parametrize("content", ["a-build", "empty", "a-link"])
def test_a_directory_named_like_a_leftover_without_the_marker_is_not_touched(case, kind, content):
    """A leftover is known by the marker only build.py writes inside it, never by its name: a
    person's copy of a build named .out.old-mybuild is not restored over OUT, nor removed; a
    link named like one is not followed."""
    mine = case.parent / f".out.{kind}-mine"
    if content == "a-link":
        target = case.root / "elsewhere"
        shutil.copytree(case.out, target)
        build.mark(target)  # even a marked directory behind a link is not followed
        mine.symlink_to(target)
    elif content == "a-build":
        shutil.copytree(case.out, mine)  # a person's copy of the previous build
    else:
        mine.mkdir()
    shutil.rmtree(case.out)
    beside = lambda tree: {k: v for k, v in tree.items() if k.split("/")[:2] != ["outputs", "out"]}
    whole = beside(_tree(case.root))
    result = case.run("--only", "gsm8k", "--quiet")
    assert result.returncode == 0, result.stderr
    assert "note:" not in result.stderr
    assert beside(_tree(case.root)) == whole


@pytest.mark.parametrize("had_out", [True, False], ids=["out", "no-out"])
@pytest.mark.parametrize("kind", ["tmp", "old"])
def test_a_symbolic_link_named_like_a_leftover_is_never_followed(case, kind, had_out):
    """A link beside OUT named as a killed build's staging or old directory, to a directory
    elsewhere holding a build: what it points to is not removed, restored or moved, and the
    link stays."""
    elsewhere = case.root / "elsewhere"
    shutil.copytree(case.out, elsewhere)
    if not had_out:
        shutil.rmtree(case.out)
    link = case.parent / f".out.{kind}-mine"
    link.symlink_to(elsewhere, target_is_directory=True)
    before = _tree(elsewhere)
    result = case.run("--only", "gsm8k", "--quiet")
    assert _tree(elsewhere) == before
    assert link.is_symlink() and os.readlink(link) == str(elsewhere)
    if result.returncode == 0:  # a build, into a real OUT
        assert sorted(os.listdir(case.out)) == sorted(OUT_FILES)
        assert not case.out.is_symlink()
    else:  # or a refusal, in one line
        assert result.returncode == 1 and result.stderr.startswith("error: "), result.stderr
        assert result.stderr.count("\n") == 1, result.stderr


def test_a_file_added_to_out_during_the_build_stops_the_publish(case):
    sneak = """
write = build.build_outputs
def build_outputs(*args):
    m = write(*args)
    (build.Path(sys.argv[5]) / "notes.txt").write_text("written while the build ran")
    return m
build.build_outputs = build_outputs
"""
    result = run_patched(case, sneak, "--only", "gsm8k", "--quiet")
    assert result.returncode == 1, result.stderr
    assert "changed during the build" in result.stderr
    assert (case.out / "notes.txt").read_text() == "written while the build ran"
    assert leftovers(case.parent) == []


def test_renameat2_exchanges_two_directories(tmp_path):
    """The exchange the build relies on, where this machine has it."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x").write_text("a")
    (b / "y").write_text("b")
    try:
        build.renameat2(a, b, build.RENAME_EXCHANGE)
    except OSError as e:
        if e.errno in (errno.ENOSYS, errno.EINVAL):
            pytest.skip("no RENAME_EXCHANGE here")
        raise
    assert os.listdir(a) == ["y"] and os.listdir(b) == ["x"]
    with pytest.raises(FileExistsError):
        build.renameat2(a, b, build.RENAME_NOREPLACE)
    assert Path(a / "y").read_text() == "b"


def test_out_that_cannot_be_read_is_one_error(case):
    """Tests run as root, which reads everything: the denial is simulated where OUT is listed."""
    patch = """
def regular_files(path):
    raise PermissionError(13, "Permission denied", str(path))
build.regular_files = regular_files
"""
    result = run_patched(case, patch, "--only", "gsm8k")
    case.failed(result, "cannot use OUT", "Permission denied", str(case.out))


REPLACE_OUT = """
write = build.build_outputs
def build_outputs(*args):
    m = write(*args)
    out = build.Path(sys.argv[5])
    os.rename(out, out.parent / "moved-away")
    if {kind!r} == "file":
        out.write_text("a person's file, put where OUT was")
    elif {kind!r} == "link":
        out.symlink_to(out.parent / "moved-away")
    return m
build.build_outputs = build_outputs
"""


@pytest.mark.parametrize("kind", ["file", "link", "nothing"])
def test_out_replaced_during_the_build_is_left_where_the_person_put_it(case, kind):
    before = _tree(case.out)
    result = run_patched(case, REPLACE_OUT.format(kind=kind), "--only", "gsm8k", "--quiet")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: OUT {case.out} changed during the build: ") and "left" in line
    assert _tree(case.parent / "moved-away") == before
    if kind == "file":
        assert case.out.read_text() == "a person's file, put where OUT was"
    elif kind == "link":
        assert case.out.is_symlink() and os.readlink(case.out) == str(case.parent / "moved-away")
    else:
        assert not os.path.lexists(case.out)
    assert leftovers(case.parent) == []


@pytest.mark.parametrize("length", [241, 242, 250, 255])
def test_a_long_out_name_builds_and_the_names_beside_it_fit(case, length):
    """Any legal OUT name (up to 255 bytes): the lock and staging names beside it are made to
    fit, and the next build finds its own leftovers under the same names."""
    out = case.parent / ("o" * length)
    result = case.run("--only", "gsm8k", "--quiet", out=out)
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(out)) == sorted(OUT_FILES)
    assert sorted(os.listdir(case.parent)) == sorted(["out", out.name])
    killed = run_patched(case, KILL_AFTER_EXCHANGE, "--only", "gsm8k,humaneval", "--quiet", out=out)
    assert killed.returncode == -signal.SIGKILL
    result = case.run("--only", "gsm8k", "--quiet", out=out)
    assert result.returncode == 0, result.stderr
    assert "note: removed " in result.stderr, "the leftover was found under its short name"
    assert sorted(os.listdir(case.parent)) == sorted(["out", out.name])


def test_an_internal_assertion_is_one_line(case):
    # the sha256 thread still hashing when the assertion comes: its progress bar must have ended
    # its line before the error's
    patch = """
import time
def select_splits(*args, **kw):
    raise AssertionError("a bound below the count")
build.select_splits = select_splits
hash_file = build.sha256_file
def slow_sha256(path, progress=lambda n: None):
    time.sleep(0.5)
    return hash_file(path, progress)
build.sha256_file = slow_sha256
"""
    case.before = _tree(case.parent)
    result = run_patched(case, patch, "--only", "gsm8k")
    assert result.returncode == 70
    case.failed(result, "internal error", "a bound below the count")
