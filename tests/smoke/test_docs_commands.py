"""Docs that cannot drift (issue 16): every command block in README.md and docs/*.md runs,
line by line and in order, and each line exits as documented.

The convention (documented in README.md, "Tests"):

* A *command block* is a fenced block whose info string is `sh`, `bash`, `shell` or
  `console`.  Plain ``` blocks are synopses and sample output, and are not run.
* Each line runs in bash from a scratch directory holding the placeholders of
  tests/smoke/test_doc_pipelines.py (./app, ./build, ./libkernels.so, train.py) and a
  `.venv` link to this checkout's, as in a fresh clone after `make install`; HOME and the
  XDG directories are the block's own, and SEEDANCE_PLUGIN_PATH is unset (the built-in
  example plugins are the source).  A `\\` at the end of a line continues it.
* PID 4242, the docs' example process, stands for a running process the test starts.
* A line is expected to exit 0, unless it ends with a comment `# exit N`.
* `<!-- doc-test: skip needs a GPU -->` or `<!-- doc-test: skip root-only: WHY -->` on the line
  before the fence skips the block here, with that reason; no other reason is accepted.

test_doc_pipelines.py checks what `| jq` pipelines print; this test checks that every
block, pipelines included, runs in sequence with the exit codes the docs promise.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN, ROOT
from tests.smoke.test_doc_pipelines import scene  # noqa: F401  (the placeholders fixture)

RUNNABLE = ("sh", "bash", "shell", "console")
SKIP_MARK = re.compile(r"<!--\s*doc-test:\s*skip\s+(?P<reason>.+?)\s*-->")
ACCEPTED_SKIPS = ("needs a GPU", "root-only")
EXIT_MARK = re.compile(r"#\s*exit\s+(?P<code>\d+)\s*$")


def command_blocks() -> list:
    """pytest params: (lines, skip reason or None) per command block, id FILE:LINE."""
    blocks = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = doc.read_text(encoding="utf-8").splitlines()
        inside, info, start, body, marker = False, "", 0, [], None
        for number, line in enumerate(lines, 1):
            fence = re.match(r"^\s*```\s*(\S*)", line)
            if fence and not inside:
                inside, info, start, body = True, fence.group(1), number, []
                previous = lines[number - 2] if number >= 2 else ""
                found = SKIP_MARK.search(previous)
                marker = found.group("reason") if found else None
                continue
            if fence and inside:
                inside = False
                if info in RUNNABLE:
                    blocks.append(pytest.param(_commands(body), marker, id=f"{doc.name}:{start}"))
                continue
            if inside:
                body.append(line)
    return blocks


def _commands(body: list) -> list:
    """Join continuation lines; drop blank lines and comment-only lines; strip a `$ ` prompt."""
    commands, pending = [], ""
    for line in body:
        text = re.sub(r"^\s*\$\s+", "", line) if not pending else line
        if text.rstrip().endswith("\\"):
            pending += text.rstrip()[:-1] + " "
            continue
        text = pending + text
        pending = ""
        if text.strip() and not text.strip().startswith("#"):
            commands.append(text.strip())
    return commands


BLOCKS = command_blocks()


def expected_exit(command: str) -> int:
    found = EXIT_MARK.search(command)
    return int(found.group("code")) if found else 0


def test_the_docs_have_command_blocks():
    ids = [p.id for p in BLOCKS]
    # the headline plugin workflow must be among them (issue 16)
    assert any(i.startswith("README.md:") for i in ids), ids
    assert len(BLOCKS) >= 4


def test_skip_markers_name_an_accepted_reason():
    for param in BLOCKS:
        _lines, reason = param.values
        if reason is not None:
            assert reason.startswith(ACCEPTED_SKIPS), f"{param.id}: skip reason {reason!r}"


def test_exit_marker_parsing():
    assert expected_exit("seedance agent status   # exit 3") == 3
    assert expected_exit("seedance check ./build") == 0
    assert _commands(["$ seedance check \\", "    ./build", "", "# a comment", "jq ."]) == \
        ["seedance check      ./build", "jq ."]


@pytest.mark.parametrize("commands,skip_reason", BLOCKS)
def test_doc_block_runs_as_documented(commands, skip_reason, scene, tmp_path):  # noqa: F811
    if skip_reason is not None:
        pytest.skip(f"marked in the docs: {skip_reason}")
    if not (ROOT / ".venv" / "share" / "seedance" / "plugins").is_dir():
        pytest.fail("the built-in example plugins are missing: run `make install`")
    work, base_env = scene
    venv_link = work / ".venv"
    if not venv_link.exists():
        venv_link.symlink_to(ROOT / ".venv")
    env = dict(base_env)
    env.pop("SEEDANCE_PLUGIN_PATH", None)
    env.pop("NO_COLOR", None)
    env["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env.update(HOME=str(tmp_path / "home"), XDG_DATA_HOME=str(tmp_path / "data"),
               XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_STATE_HOME=str(tmp_path / "state"),
               XDG_CACHE_HOME=str(tmp_path / "cache"), XDG_RUNTIME_DIR=str(runtime))
    Path(env["HOME"]).mkdir()
    process = subprocess.Popen(["sleep", "600"])  # the docs' pid 4242
    try:
        for command in commands:
            _run_line(re.sub(r"\b4242\b", str(process.pid), command), command, work, env)
    finally:
        process.kill()
        process.wait()


def _run_line(command: str, documented: str, work, env) -> None:
    proc = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True,
                          errors="replace", timeout=300, stdin=subprocess.DEVNULL)
    want = expected_exit(documented)
    assert proc.returncode == want, (
        f"`{documented}` exited {proc.returncode}, the docs say {want}\n"
        f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-2000:]}")
