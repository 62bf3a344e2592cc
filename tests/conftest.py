"""Shared fixtures: paths and helpers for running the real CLI."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# The seedance runs of the test now running: a failing test's report shows their stderr.
# This file is loaded twice (by pytest as `conftest`, by the tests as `tests.conftest`), so the
# list lives on the one module both copies share.
_RUNS: list = pytest.__dict__.setdefault("_seedance_cli_runs", [])


def run_cli(*args, env=None, check=False, timeout=120, input=None):
    """Run the installed console script as a user would; returns CompletedProcess."""
    exe = BIN / "seedance"
    cmd = [str(exe), *map(str, args)] if exe.exists() else [sys.executable, "-m", "seedance", *map(str, args)]
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=full_env, timeout=timeout,
                          input=input)
    _RUNS.append(proc)
    if check and proc.returncode != 0:
        raise AssertionError(describe_run(proc))
    return proc


X86_64_RTLD = "/lib64/ld-linux-x86-64.so.2"


def ld_so_hwcaps_levels(rtld: str = X86_64_RTLD) -> dict:
    """The x86-64-vN levels the real ld.so reports, as `ld.so --help` lists them:
    level -> set of words ("supported", "searched").  An independent oracle for the CPU's
    levels (seedance's own hwcaps.detect reads /proc/cpuinfo); {} without that ld.so."""
    try:
        out = subprocess.run([rtld, "--help"], capture_output=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    levels = {}
    for line in out.decode("utf-8", "replace").splitlines():
        words = line.split()
        if words and words[0].startswith("x86-64-v") and "(" in line:
            levels[words[0]] = {w.strip("(),") for w in words[1:]}
    return levels


LDCONFIG = shutil.which("ldconfig") or "/sbin/ldconfig"


def write_ld_so_cache(cache_file, conf, *options, timeout=120) -> None:
    """ldconfig writes ``cache_file`` from the directories ``conf`` lists, making no links
    (-X), with ``options`` (-i, -c FORMAT); its warnings are kept off the test's output."""
    subprocess.run([LDCONFIG, "-X", *options, "-C", str(cache_file), "-f", str(conf)], check=True,
                   capture_output=True, timeout=timeout)


def run_with_ld_so_cache(cache_file, *argv, env=None, timeout=120) -> subprocess.CompletedProcess:
    """argv run with ``cache_file`` bound over /etc/ld.so.cache, in a mount namespace of its
    own (private propagation: the bind never reaches the host's /etc), so the real ld.so reads
    that cache.  Skips the test when no such namespace can be made here (not root, no unshare)."""
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                           'mount --bind "$1" /etc/ld.so.cache && shift && exec "$@"', "sh",
                           str(cache_file), *map(str, argv)],
                          capture_output=True, text=True, errors="replace",
                          env=env or {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}, timeout=timeout)
    if proc.stderr.startswith(("unshare:", "mount:")):
        pytest.skip(f"no private mount namespace here: {proc.stderr.strip()[:200]}")
    return proc


def ld_so_cache_try(ld_debug_stderr: str, library: str) -> str:
    """The file ld.so tried first from its cache for ``library``, from LD_DEBUG=libs output
    (asserting the search went to the cache)."""
    lines = [line.split(":", 1)[1].strip() for line in ld_debug_stderr.splitlines() if ":" in line]
    start = lines.index(f"find library={library} [0]; searching")
    assert lines[start + 1] == "search cache=/etc/ld.so.cache", ld_debug_stderr
    tried = lines[start + 2]
    assert tried.startswith("trying file="), ld_debug_stderr
    return tried.split("=", 1)[1]


def describe_run(proc, expected=None) -> str:
    """One command's exit status with its stderr (and the end of its stdout), for assertion messages."""
    args = proc.args if isinstance(proc.args, str) else " ".join(map(str, proc.args))
    want = "" if expected is None else f" (expected {expected})"
    stderr = proc.stderr if isinstance(proc.stderr, str) else (proc.stderr or b"").decode("utf-8", "replace")
    stdout = proc.stdout if isinstance(proc.stdout, str) else (proc.stdout or b"").decode("utf-8", "replace")
    return (f"`{args}` exited {proc.returncode}{want}\n--- stderr ---\n{stderr.rstrip()[-4000:]}"
            f"\n--- stdout (end) ---\n{stdout.rstrip()[-1500:]}")


def expect_exit(proc, *codes):
    """assert proc exited with one of codes; the failure message carries the tool's stderr."""
    assert proc.returncode in codes, describe_run(proc, " or ".join(map(str, codes)))
    return proc


def load_example_builder():
    """examples/plugins/build.py, which builds the example plugins' C libraries."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("seedance_examples_build", ROOT / "examples/plugins/build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def cli():
    return run_cli


# -- a failing test shows what the tool said ---------------------------------------------------
def pytest_runtest_setup(item):
    _RUNS.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and _RUNS:
        for proc in _RUNS[-3:]:  # the last runs are the ones the failing assertion looked at
            report.sections.append(("seedance run", describe_run(proc)))


# -- every process a test starts is stopped by the end of the session --------------------------
# Each child inherits SEEDANCE_TEST_SESSION, so a process is found even after its parent died
# and it was re-parented to init (the agent test's orphaned scan child, issue 17).  Processes
# forked without exec keep their parent's /proc/PID/environ, so this session's descendants
# are walked through PPid as well.
_SESSION_TOKEN = f"{os.getpid()}-{os.urandom(6).hex()}"


def pytest_configure(config):
    os.environ["SEEDANCE_TEST_SESSION"] = _SESSION_TOKEN


def _session_processes() -> dict:
    """pid -> command line of the live processes this session started (never itself)."""
    me = os.getpid()
    parents, marked, cmdlines = {}, set(), {}
    token = f"SEEDANCE_TEST_SESSION={_SESSION_TOKEN}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                stat = handle.read()
            fields = stat[stat.rindex(b")") + 2:].split()
            if fields[0] == b"Z":
                continue  # exited, only waiting to be reaped
            parents[pid] = int(fields[1])
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                cmdlines[pid] = handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
            with open(f"/proc/{pid}/environ", "rb") as handle:
                if token in handle.read().split(b"\0"):
                    marked.add(pid)
        except (OSError, ValueError, IndexError):
            continue
    found = set(marked)
    frontier = {me}
    while frontier:
        children = {pid for pid, ppid in parents.items() if ppid in frontier and pid not in found}
        found |= children
        frontier = children
    return {pid: cmdlines.get(pid, "?") for pid in sorted(found)}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    import signal
    import time

    deadline = time.monotonic() + 5.0  # a child told to stop at the end of the last test may still be exiting
    left = _session_processes()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _session_processes()
    if not left:
        return
    lines = "\n".join(f"  pid {pid}: {cmd[:200]}" for pid, cmd in left.items())
    session.config._seedance_leftovers = lines
    for pid in left:  # stop them, so one leaky test does not leave work running after the suite
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lines = getattr(config, "_seedance_leftovers", None)
    if lines:
        terminalreporter.section("processes left running by the tests (killed now)", red=True)
        terminalreporter.write_line(lines)


@pytest.fixture(scope="module")
def torch_dir():
    """The venv's torch package directory (found, not imported), or a skip."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None:
        pytest.skip("torch wheel not installed")
    return list(spec.submodule_search_locations)[0]


def seedance_jobs(monkeypatch, value: str | None) -> None:
    """SEEDANCE_JOBS for a test: "1" keeps a check in one process, None lets it use a helper."""
    if value:
        monkeypatch.setenv("SEEDANCE_JOBS", value)
    else:
        monkeypatch.delenv("SEEDANCE_JOBS", raising=False)


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
_NOBODY_CLI: list = []


def seedance_as_nobody() -> list:
    """The seedance command for a test that runs it as nobody through setpriv (NOBODY +
    this + arguments): the venv's `seedance` where nobody can start this interpreter, else
    the Python CLI by one exec.  setpriv execs its program while it still holds root's
    capabilities, and on these machines the interpreter lies under /root (mode 0700):
    nobody cannot start it a second time, which the venv's `seedance` (the C launcher, as
    `make install` links it) does for every command but `run`.  A user who can run the
    interpreter at all runs the launcher the same way."""
    if not _NOBODY_CLI:
        probe = subprocess.run([*NOBODY, "sh", "-c", 'exec "$0" -c 0', sys.executable], capture_output=True,
                               timeout=60)
        _NOBODY_CLI.extend([str(BIN / "seedance")] if probe.returncode == 0 else [sys.executable, "-P", "-m",
                                                                                     "seedance"])
    return list(_NOBODY_CLI)
