"""A process seedance may not trace is placed nowhere, not on seedance's own root.

The DaemonSet runs seedance in its own container with the host's pids: without
CAP_SYS_PTRACE it can read another user's maps (CAP_PERFMON) but not /proc/PID/root, and the
files it would then stat are its own container's, not the process's.  A library judged that
way is "replaced" when it is only out of sight: the states must be "unknown", never
lib-deleted.  Here seedance runs as root with CAP_SYS_PTRACE dropped from its bounding set
(CAP_PERFMON kept) against a process of nobody's.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import BIN

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture()
def nobody_sleeper():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv(1) to run a process as nobody")
    proc = subprocess.Popen([*NOBODY, "sleep", "60"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_process_not_ours_to_trace_has_no_lib_deleted(nobody_sleeper, tmp_path):
    exe = BIN / "seedance"
    cli = [str(exe)] if exe.exists() else [sys.executable, "-m", "seedance"]
    drop = ["setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace"]
    probe = subprocess.run([*drop, "cat", f"/proc/{nobody_sleeper.pid}/maps"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("this kernel gives another user's maps only with CAP_SYS_PTRACE")
    assert subprocess.run([*drop, "readlink", f"/proc/{nobody_sleeper.pid}/root"],
                          capture_output=True).returncode != 0
    # seedance's own view differs from the process's, as in a container: in a mount namespace
    # of its own, another file (a copy) is bound over the libc the sleeper maps
    libc = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
    copy = tmp_path / "libc-copy.so.6"
    shutil.copy(libc, copy)
    script = f'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    ran = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                          str(copy), libc, *drop, *cli, "check", "--pid", str(nobody_sleeper.pid), "--json",
                          "--no-progress"], capture_output=True, text=True, errors="replace", timeout=120)
    assert ran.returncode in (0, 1), ran.stderr
    report = json.loads(ran.stdout)
    assert not [f for f in report["findings"] if f["rule"] == "lib-deleted"], ran.stdout[-3000:]
