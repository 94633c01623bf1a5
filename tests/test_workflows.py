"""The GitHub workflows (.github/workflows), the release commands of docs/building.md and the
README's offline command.

The workflows are read with a YAML parser: their triggers, caches, artifact and secret are checked
as data. Their own `run:` steps, taken from the files, are run in order with bash as GitHub runs
them: reproduce.yml against a local mirror of the miniature sources with the reviewed golden sums
as the published SHA256SUMS, release.yml with a stand-in `hf` first on PATH that reads its
arguments with the pinned hf's own parser and keeps the Hub in a directory. No network."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import tomllib
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

import golden
import pytest
import yaml
from mirror import checkout, serve

import build

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
WORKFLOWS = REPO / ".github" / "workflows"
GOLDEN_SUMS = golden.files()["SHA256SUMS"].decode()  # the reviewed build, for this build.py
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
BASH = shutil.which("bash") or "/bin/bash"
TOKEN = "hf_workflow_secret_0123456789"
SECRETS = {"secrets.HF_TOKEN": TOKEN}
DATASET = "Pegainfer/kern-prompts"
# A step whose whole script installs the project's pinned packages from the index is not run:
# the tests have no network, and their own environment has the same pins installed.
INSTALL = re.compile(r"python -m pip install -e (\.|'\.\[\w+\]')")


# ------------------------------------------------------------------------------------------------
# Reading the workflows, the README and the docs


def workflow(name):
    return yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))


def triggers(wf):
    # PyYAML reads YAML 1.1, where the key `on` is the boolean true.
    return wf.get("on", wf.get(True))


def steps(name, job):
    return workflow(name)["jobs"][job]["steps"]


def step_running(name, job, text):
    """The one run step of the job whose script contains text."""
    (step,) = [s for s in steps(name, job) if text in s.get("run", "")]
    return step


def step_using(name, job, action):
    """The one step of the job that uses the action (`owner/name[/path]`, any version)."""
    (step,) = [s for s in steps(name, job) if s.get("uses", "").split("@")[0] == action]
    return step


def strings(node, path=()):
    """Every string in a parsed YAML document, with the keys and indices that lead to it."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from strings(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from strings(v, (*path, i))
    elif isinstance(node, str):
        yield path, node


def section(page, title):
    """The text of the `## title` section of a Markdown page of the repository (README.md,
    docs/building.md), up to the next `## ` heading."""
    text = (REPO / page).read_text(encoding="utf-8")
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def readme_section(title):
    return section("README.md", title)


def code_blocks(text):
    """The fenced code blocks of a Markdown text, list items' indentation removed."""
    return [textwrap.dedent(b) for b in re.findall(r"^( *```\n.*?^ *```)$", text, re.M | re.S)]


def code(block):
    return block.strip().removeprefix("```").removesuffix("```").strip("\n")


# ------------------------------------------------------------------------------------------------
# Running a job's steps


def evaluate(value, context):
    """An `env:` value: plain text, or one `${{ name }}` that the test gives a value."""
    value = str(value)
    if "${{" not in value:
        return value
    m = re.fullmatch(r"\$\{\{\s*([\w.]+)\s*\}\}", value)
    assert m and m[1] in context, f"no value for {value!r} in this test"
    return context[m[1]]


def run_job(name, job_id, workspace, env, context):
    """Run one job's `run:` steps as GitHub does with `shell: bash`: each script in order with
    `bash --noprofile --norc -eo pipefail`, in the workspace, with the environment of the
    workflow, the job and the step, stopping at the first step that fails. `uses:` steps (GitHub
    actions) and INSTALL steps are not run."""
    wf = workflow(name)
    job = wf["jobs"][job_id]
    temp = Path(env["TMPDIR"])
    log, ran = [], []
    for i, step in enumerate(job["steps"]):
        if "uses" in step or INSTALL.fullmatch(step["run"].strip()):
            continue
        unknown = {"if", "shell", "working-directory", "continue-on-error"} & set(step)
        assert not unknown, f"{name}: run_job does not know {unknown} yet"
        step_env = dict(env)
        for scope in (wf, job, step):
            step_env |= {k: evaluate(v, context) for k, v in (scope.get("env") or {}).items()}
        script = temp / f"{job_id}-{i}.sh"
        script.write_text(step["run"])
        proc = subprocess.run(
            [BASH, "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            cwd=workspace,
            env=step_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=300,
        )
        log.append(f"## {step['name']}\n{proc.stdout}")
        ran.append(step["name"])
        if proc.returncode:
            return SimpleNamespace(returncode=proc.returncode, log="".join(log), ran=ran)
    return SimpleNamespace(returncode=0, log="".join(log), ran=ran)


def runner_env(base, root, hf_bin):
    """The environment of a step: this Python's packages on PATH behind the stand-in hf, a
    temporary directory of the run's own, and no HF_TOKEN but the one a step's env gives."""
    temp = root / "runner-temp"
    temp.mkdir(exist_ok=True)
    env = {k: v for k, v in base.items() if k != "HF_TOKEN"}
    env["PATH"] = os.pathsep.join([str(hf_bin), str(Path(sys.executable).parent), base["PATH"]])
    env["TMPDIR"] = str(temp)
    return env


def hf_stub(argv):
    """The `hf` of these tests. It reads its arguments with the pinned hf's own parser, so an
    option the real command does not have fails here too; appends the call, the arguments as
    parsed and the HF_TOKEN it was given, to $HF_STUB_HUB/calls.jsonl; and uploads into or
    downloads from $HF_STUB_HUB, which stands for the Hub. Files named in $HF_STUB_ALTER are
    served with their last byte changed."""
    import click
    from huggingface_hub.cli.hf import app

    hub = Path(os.environ["HF_STUB_HUB"])
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    if command not in ("upload", "download"):
        print(f"hf (test stand-in): no command {command!r} here", file=sys.stderr)
        return 2
    try:
        parsed = app.get_command(click.Context(app), command).materialize()
        params = parsed.make_context(command, list(args)).params
    except click.ClickException as e:
        e.show()
        return 2
    params = {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()}
    repo = hub / (params["repo_type"] or "model") / params["repo_id"]
    call = {"command": command, "params": params, "token": os.environ.get("HF_TOKEN")}
    if command == "upload":
        local = Path(params["local_path"])
        # As upload_folder does: a file is taken when its path matches an --include pattern.
        files = {p.relative_to(local).as_posix(): p for p in local.rglob("*") if p.is_file()}
        files = {
            rel: p
            for rel, p in files.items()
            if any(fnmatch.fnmatch(rel, pat) for pat in params["include"] or ["*"])
            and not any(fnmatch.fnmatch(rel, pat) for pat in params["exclude"])
        }
        call["files"] = sorted(files)
        for rel, p in files.items():
            dest = repo / params["path_in_repo"] / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, dest)
    else:
        local_dir = Path(params["local_dir"])
        call["local_dir_was_empty"] = not local_dir.exists() or not any(local_dir.iterdir())
        for name in params["filenames"]:
            if not (repo / name).is_file():
                print(f"404: {name} is not in {params['repo_id']}", file=sys.stderr)
                return 1
            data = bytearray((repo / name).read_bytes())
            if name in os.environ.get("HF_STUB_ALTER", "").split(","):
                data[-1] ^= 1
            (local_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (local_dir / name).write_bytes(data)
        print(local_dir)
    with (hub / "calls.jsonl").open("a") as f:
        f.write(json.dumps(call) + "\n")
    return 0


@pytest.fixture(scope="module")
def hf_bin(tmp_path_factory):
    """A directory holding `hf`, which runs hf_stub with this Python."""
    bin_dir = tmp_path_factory.mktemp("hf-bin")
    program = (
        f"import sys; sys.path.insert(0, {str(TESTS)!r}); "
        "from test_workflows import hf_stub; sys.exit(hf_stub(sys.argv[1:]))"
    )
    hf = bin_dir / "hf"
    hf.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(program)} "$@"\n')
    hf.chmod(0o755)
    return bin_dir


def calls(hub):
    path = hub / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# ------------------------------------------------------------------------------------------------
# The reproduce job, run once with the golden sums as the published ones


def reproduce(mini, hf_bin, root, sums, src=None):
    """reproduce.yml's steps in a checkout with the miniature pins, `sums` as its SHA256SUMS (none
    when None), and, when given, the sources of an earlier run in src/ (the cache's restore)."""
    workspace = checkout(mini, root / "workspace", "fetch.sh", "build.py", "pyproject.toml")
    if sums is not None:
        (workspace / "SHA256SUMS").write_text(sums)
    if src is not None:
        shutil.copytree(src, workspace / "src")
    with serve(mini) as mirror:
        env = runner_env(mirror.env, root, hf_bin)
        result = run_job("reproduce.yml", "reproduce", workspace, env, SECRETS)
    return SimpleNamespace(workspace=workspace, result=result, hub=mirror.hub, books=mirror.books)


@pytest.fixture(scope="module")
def reproduced(mini, hf_bin, tmp_path_factory):
    return reproduce(mini, hf_bin, tmp_path_factory.mktemp("reproduce"), GOLDEN_SUMS)


def test_reproduce_steps_fetch_build_and_match_the_published_sums(reproduced):
    result = reproduced.result
    assert result.returncode == 0, result.log[-3000:]
    assert result.ran == [
        "Fetch the pinned sources",
        "Build and compare with the published SHA256SUMS",
    ]
    assert "check: every file matches SHA256SUMS" in result.log
    out = reproduced.workspace / "out"
    assert sorted(p.name for p in out.iterdir()) == sorted(build.OUT_FILES)
    assert (out / "SHA256SUMS").read_text() == GOLDEN_SUMS
    # The secret reached fetch.sh through the step's env, and no log shows it.
    assert reproduced.hub.requests
    assert {r.headers.get("authorization") for r in reproduced.hub.requests} == {f"Bearer {TOKEN}"}
    assert TOKEN not in result.log


def test_reproduce_steps_fail_and_name_the_first_differing_row(mini, hf_bin, reproduced, tmp_path):
    # The sums of a published standard split that differs from this build at one row: that row's
    # line is altered, and with it the split's file and content lines (were they the same, the
    # parquet file would be the same and the check would pass).
    golden = GOLDEN_SUMS
    rows = re.findall(r"^# row standard (\d+) ([0-9a-f]{64}) (.+)$", golden, re.M)
    index, row_sha, source = rows[len(rows) // 2]
    other = lambda sha: hashlib.sha256(sha.encode()).hexdigest()
    sums = golden
    for pattern in (
        rf"^# row standard {index} ([0-9a-f]{{64}}) ",
        r"^([0-9a-f]{64})  standard\.parquet$",
        r"^# content ([0-9a-f]{64})  standard\.parquet$",
    ):
        (sha,) = re.findall(pattern, sums, re.M)
        sums = sums.replace(sha, other(sha))
    assert row_sha not in sums and len(sums.splitlines()) == len(golden.splitlines())

    run = reproduce(mini, hf_bin, tmp_path, sums, src=reproduced.workspace / "src")
    assert run.result.returncode == 1, run.result.log[-3000:]
    assert run.result.ran[-1] == "Build and compare with the published SHA256SUMS"
    first = f"check: standard.parquet: content differs; first differing row: standard index {index} source {source}"
    assert first in run.result.log
    # The new build stays in out/ for the artifact; the restored sources needed no download.
    assert (run.workspace / "out" / "SHA256SUMS").read_text() == golden
    assert run.hub.requests == [] and run.books.requests == []


def test_reproduce_steps_without_published_sums_build_and_say_so(
    mini, hf_bin, reproduced, tmp_path
):
    run = reproduce(mini, hf_bin, tmp_path, None, src=reproduced.workspace / "src")
    assert run.result.returncode == 0, run.result.log[-3000:]
    assert "SHA256SUMS is not in the repository yet" in run.result.log
    assert "check:" not in run.result.log
    assert (run.workspace / "out" / "SHA256SUMS").read_text() == GOLDEN_SUMS


# ------------------------------------------------------------------------------------------------
# The release job


def test_the_release_starts_only_for_the_pyproject_version_with_committed_sums(hf_bin, tmp_path):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    shutil.copy(REPO / "pyproject.toml", workspace)
    (workspace / "SHA256SUMS").write_text(GOLDEN_SUMS)
    env = runner_env(os.environ, tmp_path, hf_bin)
    tag = lambda name: run_job("release.yml", "version", workspace, env, {"github.ref_name": name})
    assert tag(f"v{VERSION}").returncode == 0
    wrong = tag(f"v{VERSION}.1")
    assert wrong.returncode == 1
    assert (
        f"error: tag v{VERSION}.1 does not match the version in pyproject.toml ({VERSION})"
        in wrong.log
    )
    (workspace / "SHA256SUMS").unlink()
    uncommitted = tag(f"v{VERSION}")
    assert uncommitted.returncode == 1
    assert "error: SHA256SUMS is not committed" in uncommitted.log


def publish(reproduced, hf_bin, root, alter="", sums=None):
    """release.yml's publish steps in a checkout whose out/ is the reproduced build (what the
    artifact download puts there), against a Hub kept in root/hub."""
    workspace = root / "workspace"
    workspace.mkdir()
    for name in ("build.py", "pyproject.toml"):
        shutil.copy(REPO / name, workspace)
    (workspace / "SHA256SUMS").write_text(GOLDEN_SUMS if sums is None else sums)
    shutil.copytree(reproduced.workspace / "out", workspace / "out")
    hub = root / "hub"
    hub.mkdir()
    env = runner_env(os.environ, root, hf_bin) | {"HF_STUB_HUB": str(hub), "HF_STUB_ALTER": alter}
    result = run_job("release.yml", "publish", workspace, env, SECRETS)
    return SimpleNamespace(result=result, calls=calls(hub), hub=hub, workspace=workspace)


def test_the_release_uploads_the_six_files_and_verifies_what_the_hub_serves(
    reproduced, hf_bin, tmp_path
):
    run = publish(reproduced, hf_bin, tmp_path)
    assert run.result.returncode == 0, run.result.log[-3000:]
    upload, download = run.calls
    assert upload["command"] == "upload"
    p = upload["params"]
    where = (p["repo_id"], p["repo_type"], p["local_path"], p["path_in_repo"])
    assert where == (DATASET, "dataset", "out", ".")
    assert sorted(p["include"]) == upload["files"] == sorted(build.OUT_FILES)
    assert (p["exclude"], p["delete"], p["revision"], p["create_pr"]) == ([], [], None, False)
    build_sha = hashlib.sha256((REPO / "build.py").read_bytes()).hexdigest()
    assert f"kern-prompts {VERSION}" in p["commit_message"] and build_sha in p["commit_message"]
    stored = run.hub / "dataset" / DATASET
    for name in build.OUT_FILES:
        assert (stored / name).read_bytes() == (run.workspace / "out" / name).read_bytes(), name

    assert download["command"] == "download"
    d = download["params"]
    assert (d["repo_id"], d["repo_type"]) == (DATASET, "dataset")
    assert sorted(d["filenames"]) == sorted(build.OUT_FILES)
    assert download["local_dir_was_empty"]
    for name in build.OUT_FILES[:-1]:
        assert f"{name}: OK" in run.result.log
    # Both hf calls were given the secret through env, never on the command line or in the log.
    assert upload["token"] == download["token"] == TOKEN
    assert TOKEN not in json.dumps([p, d]) and TOKEN not in run.result.log


def test_the_release_verify_fails_when_the_hub_serves_an_altered_file(reproduced, hf_bin, tmp_path):
    run = publish(reproduced, hf_bin, tmp_path, alter="standard.parquet")
    assert run.result.returncode != 0
    assert run.result.ran[-1] == "Download what the Hub serves and verify it"
    assert "standard.parquet: FAILED" in run.result.log
    assert "smoke.parquet: OK" in run.result.log


def test_the_release_uploads_nothing_when_out_is_not_the_committed_build(
    reproduced, hf_bin, tmp_path
):
    sums = GOLDEN_SUMS.replace("# packages ", "# packages other==1 ", 1)
    run = publish(reproduced, hf_bin, tmp_path, sums=sums)
    assert run.result.returncode == 1
    assert (
        "error: out/SHA256SUMS is not the committed SHA256SUMS; nothing was uploaded"
        in run.result.log
    )
    assert run.calls == []


# ------------------------------------------------------------------------------------------------
# The workflows as data


def test_run_steps_use_only_shell_variables_and_never_trace():
    for path in sorted(WORKFLOWS.glob("*.yml")):
        wf = workflow(path.name)
        assert wf["defaults"]["run"]["shell"] == "bash", path.name
        for where, text in strings(wf):
            if where[-1] == "run":
                assert "${{" not in text, (path.name, where)
                assert not re.search(r"\bset\s+(-\w*x|-o\s+xtrace)", text), (path.name, where)
                assert "HF_TOKEN" not in text, (path.name, where)  # the tools read it themselves
            elif "${{" in text:
                assert {"env", "if", "with", "secrets"} & set(where), (path.name, where)


def test_the_secret_is_the_repositorys_hf_token_passed_through_env():
    given = {}
    for path in sorted(WORKFLOWS.glob("*.yml")):
        for where, text in strings(workflow(path.name)):
            if "secrets." in text:
                assert text == "${{ secrets.HF_TOKEN }}", (path.name, where)
                assert where[-2:] in (("env", "HF_TOKEN"), ("secrets", "HF_TOKEN")), where
                given.setdefault(path.name, []).append(where)
    fetch = step_running("reproduce.yml", "reproduce", "fetch.sh")
    upload = step_running("release.yml", "publish", "hf upload")
    verify = step_running("release.yml", "publish", "hf download")
    assert all(s["env"]["HF_TOKEN"] == "${{ secrets.HF_TOKEN }}" for s in (fetch, upload, verify))
    assert len(given["reproduce.yml"]) == 1 and len(given["release.yml"]) == 3
    assert workflow("release.yml")["jobs"]["reproduce"]["secrets"] == {
        "HF_TOKEN": "${{ secrets.HF_TOKEN }}"
    }
    assert triggers(workflow("reproduce.yml"))["workflow_call"]["secrets"] == {
        "HF_TOKEN": {"required": False}
    }


def test_reproducing_is_the_main_job_after_its_setup():
    """docs/building.md "Reproducing" gives the README's main job's two commands as they are there
    (mkdir -p, the virtual environment's Python), not a variant that fails on a second run or
    without it."""
    main = code(code_blocks(readme_section("The two commands"))[0])
    lines = code(code_blocks(section("docs/building.md", "Reproducing"))[0]).splitlines()
    commands = [line.split("  #", 1)[0].strip() for line in lines]
    assert commands[0].startswith("mkdir -p ") and commands[1].startswith(".venv/bin/python ")
    assert main.endswith(" && " + " && ".join(commands))


def test_the_test_workflow_runs_the_readme_test_command_as_ci_does():
    wf = workflow("test.yml")
    assert set(triggers(wf)) == {"push", "pull_request"}
    command = code(code_blocks(readme_section("The two commands"))[1])
    assert [s["run"].strip() for s in steps("test.yml", "test") if "run" in s] == [command]
    assert (REPO / ".ci" / "run").read_text().strip().splitlines()[-1] == command
    assert step_using("test.yml", "test", "actions/setup-python")["with"] == {
        "python-version": "3.11",
        "cache": "pip",
        "cache-dependency-path": "pyproject.toml",
    }
    # the llama.cpp build tests/setup_engines.sh keeps, kept from run to run like pip's cache
    kept = step_using("test.yml", "test", "actions/cache")["with"]
    assert kept["path"] == "~/.cache/kern-prompts" and "tests/setup_engines.sh" in kept["key"]


def test_reproduce_runs_by_hand_weekly_when_build_inputs_change_and_from_the_release():
    on = triggers(workflow("reproduce.yml"))
    assert set(on) == {"workflow_dispatch", "schedule", "push", "workflow_call"}
    (cron,) = [s["cron"] for s in on["schedule"]]
    minute, hour, day, month, weekday = cron.split()
    assert minute.isdigit() and hour.isdigit() and weekday.isdigit()  # one time a week
    assert (day, month) == ("*", "*")
    assert set(on["push"]["paths"]) == {"build.py", "fetch.sh", "REV", "BOOKS", "pyproject.toml"}
    assert on["push"]["branches"] == ["**"] and "tags" not in on["push"]  # tags: release.yml


def test_reproduce_caches_the_sources_by_rev_and_books_and_keeps_out_either_way():
    job = steps("reproduce.yml", "reproduce")
    assert step_using("reproduce.yml", "reproduce", "actions/setup-python")["with"] == {
        "python-version": "3.11",
        "cache": "pip",
        "cache-dependency-path": "pyproject.toml",
    }
    restore = step_using("reproduce.yml", "reproduce", "actions/cache/restore")
    save = step_using("reproduce.yml", "reproduce", "actions/cache/save")
    key = "src-${{ hashFiles('REV', 'BOOKS') }}"
    assert restore["with"] == save["with"] == {"path": "src", "key": key}
    assert save["if"] == f"steps.{restore['id']}.outputs.cache-hit != 'true'"
    fetch = step_running("reproduce.yml", "reproduce", "fetch.sh")
    build_step = step_running("reproduce.yml", "reproduce", "build.py")
    assert "--check SHA256SUMS" in build_step["run"]
    artifact = step_using("reproduce.yml", "reproduce", "actions/upload-artifact")
    assert artifact["with"]["path"].rstrip("/") == "out"
    assert artifact["if"] == "${{ !cancelled() }}"  # also after a failed check
    # Sources saved once verified, before the build: a failed check still caches them.
    order = [job.index(s) for s in (restore, fetch, save, build_step, artifact)]
    assert order == sorted(order)


def test_the_release_checks_the_tag_reuses_reproduce_then_uploads_and_verifies():
    wf = workflow("release.yml")
    assert triggers(wf) == {"push": {"tags": ["v*"]}}
    jobs = wf["jobs"]
    assert list(jobs) == ["version", "reproduce", "publish"]
    assert jobs["reproduce"]["uses"] == "./.github/workflows/reproduce.yml"
    assert jobs["reproduce"]["needs"] == "version" and jobs["publish"]["needs"] == "reproduce"
    artifact = step_using("reproduce.yml", "reproduce", "actions/upload-artifact")["with"]["name"]
    download = step_using("release.yml", "publish", "actions/download-artifact")
    assert download["with"] == {"name": artifact, "path": "out"}
    publish_steps = steps("release.yml", "publish")
    upload = step_running("release.yml", "publish", "hf upload")
    verify = step_running("release.yml", "publish", "hf download")
    install = step_running("release.yml", "publish", "pip install")
    assert install["run"].strip() == "python -m pip install -e '.[publish]'"
    order = [publish_steps.index(s) for s in (install, download, upload, verify)]
    assert order == sorted(order)


def test_the_readme_release_commands_are_the_release_workflows():
    lines = {
        line.strip()
        for s in steps("release.yml", "publish")
        if "run" in s
        for line in s["run"].splitlines()
    }
    blocks = [code(b) for b in code_blocks(section("docs/building.md", "Publishing a release"))]
    hf_lines = [line for b in blocks for line in b.splitlines() if line.startswith("hf ")]
    assert [line.split()[1] for line in hf_lines] == ["upload", "download"]
    assert set(hf_lines) <= lines
    version_line = next(line for line in blocks[0].splitlines() if line.startswith("version="))
    assert version_line in lines
    assert "--check SHA256SUMS" in blocks[2]


def test_the_stand_in_hf_reads_its_arguments_with_the_pinned_hf():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extras["publish"] == [f"huggingface_hub=={version('huggingface_hub')}"]
    # the test extra brings the publish extra, directly or through another extra
    wanted, seen = ["test"], set()
    while wanted:
        extra = wanted.pop()
        seen.add(extra)
        wanted += [r[13:-1] for r in extras[extra] if r.startswith("kern-prompts[")
                   and r[13:-1] not in seen]  # fmt: skip
    assert "publish" in seen


# ------------------------------------------------------------------------------------------------
# Try it offline


SUMMARY_ROW = re.compile(r"^(\S+) +(\d+) +(\d+) +(\d+)  ([\d,]+) – ([\d,]+)$", re.M)


def test_the_readme_offline_command_builds_the_miniature_and_prints_the_summary(tmp_path):
    command, shown = (code(b) for b in code_blocks(readme_section("Try it offline"))[:2])
    assert "\n" not in command
    # A directory laid out like a checkout with the README's .venv, so that the command runs as
    # written and its mini/ lands here.
    assert (Path(sys.prefix) / "bin" / "python").exists(), "run the suite from the README's .venv"
    for name, target in (
        ("build.py", REPO / "build.py"),
        ("tests", TESTS),
        (".venv", Path(sys.prefix)),
    ):
        (tmp_path / name).symlink_to(target)
    result = subprocess.run(
        [BASH, "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stderr.replace("\r", "\n")
    header = next(line for line in shown.splitlines() if line.startswith("source "))
    assert header in printed.splitlines()
    table = printed.split(header, 1)[1]
    rows = lambda text: [m[:4] for m in SUMMARY_ROW.findall(text)]
    # Rows per source and split are the README's; token counts depend on the generated texts.
    assert rows(table) == rows(shown) and len(rows(shown)) == 12
    for *_, low, high in SUMMARY_ROW.findall(table):
        assert int(low.replace(",", "")) <= int(high.replace(",", ""))
    out = tmp_path / "mini" / "out"
    assert sorted(p.name for p in out.iterdir()) == sorted(build.OUT_FILES)
    # The table is this build's: its counts are the manifest's.
    manifest = json.loads((out / "manifest.json").read_text())
    for name, *counts in rows(table):
        built = [r["split"] for r in manifest["rows"] if r["name"] == name]
        assert [str(built.count(s)) for s in ("smoke", "standard", "full")] == counts, name
