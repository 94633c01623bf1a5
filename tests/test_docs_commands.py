"""The docs' commands, as written, against the scripts they run (docs/testing.md "The docs'
commands"): every fenced command line of README.md and docs/*.md that runs build.py, score.py or a
script of tests/ has its arguments parsed by that script's own parser (nothing runs), every script
and file a command names exists, score.py's synopsis in docs/scoring.md is its parser, and each
script takes --help."""

import argparse
import importlib.util
import re
import shlex
import sys
from pathlib import Path

import pytest

import build
import score

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PYTHON = re.compile(r"(?:\S+/)?python3?$")
# scripts of other projects the docs run (llama.cpp's converter, from its checkout)
ELSEWHERE = {"convert_hf_to_gguf.py"}


def fenced(path):
    """(line number, text) of every line inside a ``` block."""
    inside = False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            inside = not inside
        elif inside:
            yield n, line


def commands():
    """Each python command of the docs' fenced blocks: (where, script, argv); chains split at
    &&, environment assignments and trailing comments left out."""
    found = []
    for path in DOCS:
        for n, line in fenced(path):
            for part in re.split(r"&&|\(|\)", line.split("  #")[0]):
                try:
                    words = shlex.split(part)
                except ValueError:
                    continue
                while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                    words = words[1:]
                if words[:1] == ["score.py"] and not is_synopsis(words):  # python left out
                    words = ["python", *words]
                if len(words) >= 2 and PYTHON.search(words[0]) and words[1].endswith(".py"):
                    found.append((f"{path.relative_to(REPO)}:{n}", words[1], words[2:]))
                elif len(words) >= 2 and words[0] == "bash":
                    found.append((f"{path.relative_to(REPO)}:{n}", words[1], None))
    return found


def is_synopsis(words):
    """A synopsis line names its values in capitals (M, F, NAME) and shows what is optional ([…])
    or repeated (...); a command gives values, or is an example with capitals but no brackets
    (`judge REF --candidate CAND --kl-floor 1e-10`), which parses as it is."""
    shown = any("[" in w or w == "..." for w in words)
    return shown and any(re.fullmatch(r"[A-Z][A-Z_]*", re.sub(r"[\[\]|].*", "", w)) for w in words)


class Parsed(Exception):
    pass


def parse(script, argv, monkeypatch):
    """Parse argv with `script`'s parser, running nothing."""
    if script == "score.py":
        return score.parse_args(argv)
    if script == "build.py":
        return build.parse_args(argv)
    real = argparse.ArgumentParser.parse_args

    def parsed(self, args=None, namespace=None):
        raise Parsed(real(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parsed)
    with pytest.raises(Parsed):
        script_main(script)(argv)


def script_main(script):
    """The main() of a script of this repository, imported from its file."""
    if script.startswith("tests/"):  # on the path: the module the tests import
        return importlib.import_module(Path(script).stem).main
    name = "docs_" + re.sub(r"\W", "_", script)
    spec = importlib.util.spec_from_file_location(name, REPO / script)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_the_docs_have_commands_to_check():
    scripts = {s for _, s, _ in commands()}
    assert {"score.py", "build.py", "tests/make_sources.py", "tests/make_model.py",
            "tests/make_gguf.py", "../fetch.sh", "tests/setup_engines.sh"} <= scripts  # fmt: skip


@pytest.mark.parametrize("where, script, argv", commands(), ids=lambda x: str(x)[:60])
def test_a_documented_command_parses(where, script, argv, monkeypatch):
    if script in ELSEWHERE:
        return
    path = REPO / "src" / script if script.startswith("../") else REPO / script
    assert path.resolve().is_file(), f"{where}: {script} is not in the repository"
    if argv is not None:
        try:
            parse(script, argv, monkeypatch)
        except SystemExit as e:
            pytest.fail(f"{where}: {script} refuses {shlex.join(argv)} (exit {e.code})")


@pytest.mark.parametrize("script", ["score.py", "build.py", "tests/make_sources.py",
                                    "tests/make_model.py", "tests/make_gguf.py"])  # fmt: skip
def test_each_script_the_docs_run_takes_help(script, tmp_path, monkeypatch, capsys):
    """--help prints the usage and exits 0, and writes nothing (make_model.py wrote a model into
    a directory named --help)."""
    monkeypatch.chdir(tmp_path)
    main = {"score.py": score.main, "build.py": build.main}.get(script) or script_main(script)
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("usage:")
    assert list(tmp_path.iterdir()) == []


# ---- score.py's synopsis (docs/scoring.md) against its parser --------------------------------


def synopsis():
    """Each synopsis entry of docs/scoring.md: (command, required [(flag, value)], positionals,
    optional flags); "[engine flags]" stands for score.py's engine flags."""
    lines = [line for _, line in fenced(REPO / "docs" / "scoring.md")]
    entries = []
    for line in lines:
        if line.startswith("score.py ") and is_synopsis(line.split()):
            entries.append(line.split("#")[0])
        elif line.startswith("score.py "):
            entries.append(None)
        elif entries and entries[-1] and line.startswith(" ") and line.strip().startswith("["):
            entries[-1] += " " + line.split("#")[0]
    out = []
    for text in filter(None, entries):
        words = text.split()[1:]
        command, words = words[0], words[1:]
        required, positional, optional, depth, i = [], [], set(), 0, 0
        while i < len(words):
            w = words[i]
            while re.search(r"\w\[[^\[\]]*\]", w):  # OUT|hub[:REPO[@REV]]: a value's own brackets
                w = re.sub(r"(\w)\[[^\[\]]*\]", r"\1", w)
            opened = len(w) - len(w.lstrip("["))
            depth += opened
            flag = w.strip("[]")
            if flag == "engine" and words[i + 1].startswith("flags"):
                optional |= ENGINE_FLAGS
            elif flag.startswith("--") and depth:
                optional.add(flag)
            elif flag.startswith("--"):
                value = words[i + 1] if i + 1 < len(words) else ""
                takes = value and not value.startswith(("-", "[", "|"))
                required.append((flag, value.split("|")[0]) if takes else (flag,))
                i += bool(takes)
            elif not depth and flag not in ("...", "|"):
                positional.append(flag)
            depth -= len(w) - len(w.rstrip("]"))
            i += 1
        out.append((command, required, positional, optional))
    return out


def options(p):
    return {o for a in p._actions for o in a.option_strings if o.startswith("--")} - {"--help"}


def engine_options():
    p = argparse.ArgumentParser()
    score.engine_flags(p)
    return options(p)


ENGINE_FLAGS = engine_options()


# ids from sorted sets: a set's order follows the hash seed, and xdist's workers must collect the
# same ids
@pytest.mark.parametrize("command, required, positional, optional", synopsis(),
                         ids=lambda x: str(sorted(x) if isinstance(x, set) else x)[:40])  # fmt: skip
def test_the_synopsis_is_the_parser(command, required, positional, optional):
    """What the synopsis shows required is required, what it shows in brackets is optional, and
    every flag it names is one the command takes."""
    sub = score.parser()[1][command]
    named = {f[0] for f in required} | optional
    assert named <= options(sub), f"{command}: not flags of it: {named - options(sub)}"
    given = [w for f in required for w in f]
    score.parse_args([command, *positional, *given])  # the required alone parse
    for i, flag in enumerate(required):
        left = [w for f in required[:i] + required[i + 1 :] for w in f]
        with pytest.raises(SystemExit):
            score.parse_args([command, *positional, *left])
        assert flag  # each one shown required is


@pytest.mark.parametrize("command", ["record", "merge", "judge"])
def test_the_synopsis_names_every_flag(command):
    sub = score.parser()[1][command]
    named = set()
    for c, required, _, optional in synopsis():
        if c == command:
            named |= {f[0] for f in required} | optional
    assert options(sub) - named == set(), f"score.py {command}: not in docs/scoring.md's synopsis"


def test_a_subcommands_mistake_shows_its_own_usage(tmp_path, capsys):
    """record --corpus F --first 1 printed the usage of score.py, not record's."""
    with pytest.raises(SystemExit) as e:
        score.parse_args(["record", "--corpus", str(tmp_path / "c.parquet"), "--model", "m",
                          "--producer", "p", "--out", str(tmp_path / "o.parquet"), "--first", "1"])  # fmt: skip
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("usage: score.py record "), err
    assert err.splitlines()[-1] == ("score.py record: error: --first chooses rows (--rows); "
                                    "--corpus feeds the trace's tokens as they are")  # fmt: skip
