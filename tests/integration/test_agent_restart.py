"""kill -9 of the agent, then a restart, loses no finding and no registry slot.

Real parts: the shim (libseedance_shim.so) preloaded by `seedance run`, the fake driver
built from tests/fakecuda, the real registry, SQLite and the status socket.  The first
agent is killed (SIGKILL, by SEEDANCE_AGENT_CRASH_AT) in the worst window: right after it
committed and logged a leak, before it reclaimed the slot.
"""
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CUDA_INCLUDE = Path("/usr/local/cuda/include")
INSTANCES = 5


def _cc(*args):
    subprocess.run(["cc", *map(str, args)], check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def fake_driver():
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    try:
        from seedance import shim
        shim.library_path()
    except Exception as exc:  # NotAvailable: the shim is not built here
        pytest.skip(f"the shim is not available: {exc}")
    out = Path(tempfile.mkdtemp(prefix="sd-fake-"))
    inc = ["-I", str(CUDA_INCLUDE)] if (CUDA_INCLUDE / "cuda.h").exists() else []
    _cc("-O2", "-fPIC", "-shared", *inc, "-Wl,-soname,libcuda.so.1", ROOT / "tests/fakecuda/fakecuda.c",
        "-o", out / "libcuda.so.1", "-pthread")
    _cc("-O2", *inc, ROOT / "tests/shim/sdtest.c", "-o", out / "sdtest", "-pthread", "-ldl")
    yield out
    shutil.rmtree(out, ignore_errors=True)


@pytest.fixture
def env(fake_driver):
    root = Path(tempfile.mkdtemp(prefix="sd-rs-", dir="/tmp"))
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("SEEDANCE_", "FAKECUDA_", "CUDA_", "OTEL_")) and k not in ("LD_PRELOAD", "NOTIFY_SOCKET")}
    e.update(HOME=str(root / "home"), XDG_CONFIG_HOME=str(root / "cfg"), XDG_STATE_HOME=str(root / "state"),
             SEEDANCE_RUNTIME_DIR=str(root / "rt"), LD_LIBRARY_PATH=str(fake_driver), FAKECUDA_DEVICES="2",
             FAKECUDA_LEDGER=str(root / "ledger"))
    e["XDG_RUNTIME_DIR"] = str(root / "xdg")
    yield e
    shutil.rmtree(root, ignore_errors=True)


def start_agent(env, log: Path, crash_at=None):
    agent_env = dict(env)
    if crash_at:
        agent_env["SEEDANCE_AGENT_CRASH_AT"] = crash_at
    return subprocess.Popen([str(BIN / "seedance"), "agent", "run", "--gc-interval", "300ms", "--no-scan",
                             "--probes", "off"], env=agent_env, stdout=subprocess.DEVNULL,
                            stderr=open(log, "a"))


def registry(env):
    code = ("import json; from seedance import shim; r = shim.Registry.open(); "
            "print(json.dumps([[i.slot, i.pid, i.alive, sum(i.current.values())] for i in r.instances()]))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout)


def wait_until(predicate, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def leak_events(log: Path):
    return [e for e in (json.loads(line) for line in log.read_text().splitlines() if line.startswith("{"))
            if e["event"] == "leak"]


def test_kill_9_and_restart_loses_no_finding_and_no_slot(env, fake_driver, tmp_path):
    log = tmp_path / "agent.log"
    sizes = {}
    wrappers = []
    for n in range(INSTANCES):
        size = (n + 1) * 1048576 + 4096 * n  # distinct sizes: each leak is recognisable
        wrappers.append(subprocess.Popen(
            [str(BIN / "seedance"), "run", "--", str(fake_driver / "sdtest"), "--via", "dlsym", "init", "ctx:0",
             f"alloc:{size}", "alloc:4096", "sleep:120000"], env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True))
    live = wait_until(lambda: (r := registry(env)) and len([i for i in r if i[2] and i[3] > 0]) == INSTANCES and r,
                      "all instances allocated and live in the registry")
    for slot, pid, _alive, held in live:
        sizes[pid] = held
    # SIGKILL each whole process group: the program and its `seedance run`, like the OOM
    # killer or a cgroup kill, so nothing but the agent is left to report and reclaim.
    for wrapper in wrappers:
        os.killpg(wrapper.pid, signal.SIGKILL)
        wrapper.wait()
    wait_until(lambda: all(not alive for _s, _p, alive, _h in registry(env)), "the killed instances to be gone")

    first = start_agent(env, log, crash_at="before-reclaim")
    first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL
    db = Path(env["XDG_STATE_HOME"]) / "seedance" / "agent.db"
    conn = sqlite3.connect(db)
    recorded = conn.execute("SELECT pid, leaked_bytes, reclaimed FROM instances WHERE ended IS NOT NULL").fetchall()
    conn.close()
    assert len(recorded) == 1 and recorded[0][2] is None  # committed, not yet reclaimed
    assert len(registry(env)) == INSTANCES                 # the slot is still there

    second = start_agent(env, log)
    try:
        wait_until(lambda: registry(env) == [], "every slot reclaimed")
        # kill -9 again with nothing in flight, and restart: the history must be intact
        second.send_signal(signal.SIGKILL)
        second.wait()
        third = start_agent(env, log)
        try:
            status = wait_until(lambda: _status(env), "status from the restarted agent")
        finally:
            third.send_signal(signal.SIGTERM)
            third.wait(timeout=30)
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()

    leaks = {leak["pid"]: leak["bytes"] for leak in status["leaks"]}
    assert leaks == sizes  # every instance once, with the exact bytes it still held
    assert status["history"]["leaked"] == INSTANCES and status["history"]["ended_unreclaimed"] == 0
    findings = [f for f in status["findings"] if f["rule"] == "handle-leak"]
    by_pid = {}
    for f in findings:
        by_pid.setdefault(f["subject"]["pid"], []).append(f)
    assert sorted(by_pid) == sorted(sizes)
    for pid, per_pid in by_pid.items():
        assert sum(f["evidence"]["bytes"] for f in per_pid) == sizes[pid]
        assert all(f["seen"] == 1 for f in per_pid)  # recorded once, never re-raised
    # one leak log line per instance across all three agents: the first agent's one is not repeated
    assert sorted(e["pid"] for e in leak_events(log)) == sorted(sizes)


def _status(env):
    proc = subprocess.run([str(BIN / "seedance"), "status", "--json"], env=env, capture_output=True, text=True,
                          timeout=30)
    return json.loads(proc.stdout) if proc.returncode == 0 else None
