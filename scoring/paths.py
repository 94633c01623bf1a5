"""The paths a command names, checked before any work is done (docs/failures.md, score.py's
rows): every name valid UTF-8; every output a file that can be written where it is named; no
output one of the command's inputs (the same file, also through a link) or inside the build
`--rows` reads, and no two outputs one file; a record's --out that exists only with --replace. The
one exception is documented: `record --corpus F --out F` adds a producer to F in place (the trace
is written beside F and moved into place)."""

import os
import stat
from pathlib import Path

from scoring import builder as build
from scoring.rows import is_hub
from scoring.trace import ScoreError, name_max, temporary


def named(args):
    """The command's outputs and inputs: (flag, path) each, inputs with whether an output may
    be that same file."""
    outputs, inputs = [("--out", args.out)], []
    if args.command == "record":
        if args.rows and not is_hub(args.rows):
            inputs.append(("--rows", Path(args.rows), False))
        if args.corpus:
            inputs.append(("--corpus", args.corpus, True))
    elif args.command == "merge":
        inputs += [("one of the files merged,", f, False) for f in args.files]
    else:
        outputs.append(("--plot", args.plot))
        inputs += [("the reference", args.reference, False),
                   ("--candidate", args.candidate, False)]  # fmt: skip
    if getattr(args, "model", None):
        inputs.append(("--model", Path(args.model), False))
    return [(f, Path(p)) for f, p in outputs if p], [(f, Path(p), ok) for f, p, ok in inputs if p]


def utf8(flag, path):
    shown = build.not_utf8(path)
    if shown is not None:
        raise ScoreError(
            f"{flag} {shown} is not a valid UTF-8 file name; rename it, or give another path"
        )


def writable(flag, path):
    """Refuse an output that cannot be written where it is named: before any work, so that a
    record never runs its forwards to fail at the end."""
    try:
        place(flag, path)
    except OSError as e:  # a path the system will not look at (a loop of links, no access)
        raise ScoreError(f"{flag} {path}: {e.strerror or e}") from None


def place(flag, path):
    parent = path.parent
    size, most = len(os.fsencode(path.name)), name_max(parent)
    if size > most:
        raise ScoreError(f"{flag} {path}: its name is {size} bytes, longer than the {most} a file "
                         "name may have here; give a shorter name")  # fmt: skip
    if path.is_dir():
        raise ScoreError(f"{flag} {path} is a directory; name a file (in it, or elsewhere)")
    if path.exists() and not path.is_file():
        kind = (
            "a FIFO" if stat.S_ISFIFO(path.stat().st_mode) else "a device or another special file"
        )
        raise ScoreError(f"{flag} {path} is {kind}, not a file; name a file")
    if not parent.is_dir():
        raise ScoreError(f"{flag} {path}: the directory {parent} "
                         + ("is not a directory" if parent.exists() else "does not exist"))  # fmt: skip
    try:
        os.unlink(temporary(path, path.suffix))
    except OSError as e:
        raise ScoreError(f"{flag} {path}: cannot write in {parent} ({e.strerror or e})") from None


def same(a, b):
    """Whether two paths name one file: the same inode (links followed, hard links included)
    where both exist, else the same real path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def inside(path, directory):
    real, top = Path(os.path.realpath(path.parent)), Path(os.path.realpath(directory))
    return real == top or top in real.parents


def plot_format(path):
    """Refuse a --plot whose extension matplotlib cannot write (no extension: PNG)."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:  # vLLM's environment, say: the base install has no plotting
        raise ScoreError(f"--plot {path}: needs matplotlib, which this environment lacks (pip "
                         "install matplotlib, or the score extra)") from None  # fmt: skip

    kinds = FigureCanvasBase.get_supported_filetypes()
    ext = path.suffix[1:].lower()
    if ext and ext not in kinds:
        raise ScoreError(
            f"--plot {path}: matplotlib cannot write .{ext} files (it writes "
            f"{', '.join('.' + k for k in sorted(kinds))})"
        )


def check_paths(args):
    """Every path the command names, checked before any work (the module's docstring)."""
    outputs, inputs = named(args)
    for flag, path in outputs + [(f, p) for f, p, _ in inputs]:
        utf8(flag, path)
    for flag, path in outputs:
        writable(flag, path)
    for j, (flag, path) in enumerate(outputs):
        for other, there in outputs[:j]:
            if same(path, there):
                raise ScoreError(f"{other} {there} and {flag} {path} are one file; give each "
                                 "its own")  # fmt: skip
        for what, source, may in inputs:
            if what == "--rows" and inside(path, source):
                raise ScoreError(f"{flag} {path} is inside {source}, the build --rows reads; "
                                 "write it elsewhere")  # fmt: skip
            if not may and source.exists() and same(path, source):
                raise ScoreError(f"{flag} {path} is {what} {source} (the same file): it would be "
                                 "overwritten; write it elsewhere")  # fmt: skip
    if args.command == "record":
        kept(args)
    if getattr(args, "plot", None):
        plot_format(Path(args.plot))


def kept(args):
    """A record writes a whole new trace at --out: an existing file there that is not the
    --corpus (whose producers the record carries over) would lose what it holds; refused unless
    --replace says to replace it."""
    out = Path(args.out)
    if out.exists() and not args.replace and not (args.corpus and same(out, args.corpus)):
        raise ScoreError(f"--out {out} exists and is not the --corpus: the record would replace "
                         "it and what it holds; --replace replaces it, or write elsewhere")  # fmt: skip
