"""The systemd user unit for the agent, and installing it.

Type=notify so `systemctl --user start` returns when the agent is really serving (READY=1
after the state db, status socket and metrics are up); WatchdogSec so a wedged loop is
restarted; Restart=on-failure but not on a clean stop.  On a missed watchdog ping systemd
sends SIGABRT (WatchdogSignal=), which a stopped or wedged-in-the-kernel process never acts
on: SIGABRT dumps core, and the kernel delivers a core-dumping signal only when the process
runs again.  TimeoutAbortSec= bounds that wait before SIGKILL, instead of TimeoutStopSec's
20 s, so a wedged agent is back within WatchdogSec + 5 s + RestartSec.  ExecReload= uses the
shell's kill: /bin/kill is procps', which a minimal Debian does not install (203/EXEC).

Hardening: a user manager has no privileges to set up mount namespaces or drop
capabilities unless it can create a user namespace, which many hosts forbid (and then the
unit fails to start with 218/CAPABILITIES).  So the unit uses only what works for every
user manager: no_new_privs and the seccomp-based options (which no_new_privs makes
available to unprivileged processes), plus a private umask.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

UNIT_NAME = "seedance-agent.service"

HARDENING = (
    ("NoNewPrivileges", "yes"),
    ("LockPersonality", "yes"),
    ("RestrictRealtime", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("RestrictNamespaces", "yes"),
    ("SystemCallArchitectures", "native"),
    ("SystemCallFilter", "@system-service"),
    ("SystemCallErrorNumber", "EPERM"),
    ("UMask", "0077"),
)


def user_unit_dir(env: Mapping[str, str] = os.environ) -> Path:
    base = env.get("XDG_CONFIG_HOME", "")
    base_path = Path(base) if base and os.path.isabs(base) else Path(env.get("HOME") or os.path.expanduser("~")) / ".config"
    return base_path / "systemd" / "user"


def agent_command() -> list[str]:
    """How to start this very installation of seedance (the venv's script, not $PATH's)."""
    script = Path(sys.executable).parent / "seedance"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "seedance"]


def _systemd_quote(word: str, executable: bool = False) -> str:
    # systemd.service(5) "Command lines": C-style quoting; '%' starts a specifier and is
    # doubled everywhere, '$' starts a variable only in arguments (systemd 252 looks the
    # executable up verbatim, so "$$" there would name a file that does not exist).
    word = word.replace("%", "%%")
    if not executable:
        word = word.replace("$", "$$")
    if word and all(c.isalnum() or c in "/._-+:=,@" for c in word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_unit(agent_args: list[str], watchdog_sec: int = 30, command: list[str] | None = None,
                allow_probes: bool = False) -> str:
    words = [*(command or agent_command()), "agent", "run", *agent_args]
    exec_start = " ".join(_systemd_quote(w, executable=(i == 0)) for i, w in enumerate(words))
    hardening = "\n".join(f"{key}={value}" for key, value in HARDENING)
    if allow_probes:
        # root's own user manager can run the eBPF probes: @system-service lacks the two
        # system calls bcc needs to load programs and attach uprobes.
        hardening += "\nSystemCallFilter=bpf perf_event_open"
    return f"""\
# Written by `seedance agent install --user`; re-run it to regenerate.
[Unit]
Description=seedance agent: GPU handle-leak GC, GPU telemetry and metrics
After=default.target

[Service]
Type=notify
NotifyAccess=main
ExecStart={exec_start}
ExecReload=/bin/sh -c "kill -HUP ${{MAINPID}}"
WatchdogSec={watchdog_sec}s
TimeoutAbortSec=5s
Restart=on-failure
RestartSec=2s
TimeoutStopSec=20s
Environment=PYTHONUNBUFFERED=1
# Hardening a user manager can apply without privileges (see seedance.service.unit).
{hardening}

[Install]
WantedBy=default.target
"""


def write_unit(path: Path, text: str) -> Path | None:
    """Write atomically (temp + fsync + rename); keep the previous unit as .bak if it differed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    backup = None
    if path.exists():
        old = path.read_text()
        if old == text:
            return None
        backup = path.with_name(path.name + ".bak")
        shutil.copy2(path, backup)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return backup


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    output: str
    available: bool = True


def verify_unit(path: Path, env: Mapping[str, str] = os.environ) -> VerifyResult:
    """`systemd-analyze verify --user` on the unit.

    verify --user sets up a user manager in-process and needs a runtime directory; without
    XDG_RUNTIME_DIR (a container, a cron job) it fails with "Failed to lookup RuntimeDirectory
    path" before reading the unit, so give it a private temporary one.  It exits 0 even
    after "Unknown key ... ignoring", so any output counts as a failure.
    """
    tool = shutil.which("systemd-analyze")
    if not tool:
        return VerifyResult(False, "systemd-analyze is not installed", available=False)
    run_env = dict(env)
    with tempfile.TemporaryDirectory(prefix="seedance-verify-") as runtime:
        os.chmod(runtime, 0o700)
        if not run_env.get("XDG_RUNTIME_DIR") or not os.path.isdir(run_env["XDG_RUNTIME_DIR"]):
            run_env["XDG_RUNTIME_DIR"] = runtime
        proc = subprocess.run([tool, "verify", "--user", "--man=no", str(path)], capture_output=True,
                              text=True, env=run_env, timeout=60)
    output = (proc.stdout + proc.stderr).strip()
    return VerifyResult(proc.returncode == 0 and not output, output)


def user_manager_running(env: Mapping[str, str] = os.environ) -> tuple[bool, str]:
    """Whether `systemctl --user` reaches a user manager, and why not when it does not."""
    tool = shutil.which("systemctl")
    if not tool:
        return False, "systemctl is not installed"
    try:
        proc = subprocess.run([tool, "--user", "is-system-running"], capture_output=True, text=True,
                              env=dict(env), timeout=15)
    except subprocess.TimeoutExpired:
        return False, "systemctl --user did not answer within 15s"
    state = proc.stdout.strip()
    if state in ("running", "degraded", "starting", "initializing"):
        return True, state
    reason = (proc.stderr.strip().splitlines() or [state or f"exit {proc.returncode}"])[-1]
    return False, reason


def systemctl_user(*args: str, env: Mapping[str, str] = os.environ) -> subprocess.CompletedProcess:
    return subprocess.run(["systemctl", "--user", *args], capture_output=True, text=True,
                          env=dict(env), timeout=60)


def describe_command(words: list[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)


# -- lifecycle without a user manager ----------------------------------------------------------
# `seedance agent stop|status|reload|uninstall --user` go through `systemctl --user` when a
# user manager runs the unit, and otherwise straight to the agent: its status socket names
# the process (SO_PEERCRED gives the kernel's word for the listening pid, so a stale or
# forged pid file cannot point the signal at another process), and signals do the rest,
# exactly what the unit's ExecReload (kill -HUP $MAINPID) and stop (SIGTERM) send.

@dataclass(frozen=True)
class AgentProcess:
    pid: int
    socket: str
    status: dict  # the agent's status document (seedance.service.daemon.snapshot)


def find_agent(socket_path: Path) -> AgentProcess | None:
    """The agent listening on SOCKET_PATH, or None when none answers there."""
    import socket as socketlib
    import struct

    from .api import _read_line, _send

    sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM | socketlib.SOCK_CLOEXEC)
    sock.settimeout(5.0)
    try:
        try:
            sock.connect(str(socket_path))
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
            return None
        creds = sock.getsockopt(socketlib.SOL_SOCKET, socketlib.SO_PEERCRED, struct.calcsize("3i"))
        pid, _uid, _gid = struct.unpack("3i", creds)
        try:
            _send(sock, {"op": "status"})
            line = _read_line(sock, limit=64 << 20)
        except (OSError, socketlib.timeout):
            line = b""
    finally:
        sock.close()
    import json
    try:
        status = json.loads(line) if line else {}
    except ValueError:
        status = {}
    return AgentProcess(pid, str(socket_path), status if isinstance(status, dict) else {})


def wait_gone(pid: int, timeout: float) -> bool:
    """Poll until PID has exited (or is a zombie); True when it did within TIMEOUT."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                # field 3, after the parenthesised comm (which may hold spaces or ')')
                state = handle.read().rsplit(b")", 1)[1].split()[0]
            if state in (b"Z", b"X"):
                return True
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def unit_state(env: Mapping[str, str] = os.environ) -> str | None:
    """`systemctl --user is-active` of the unit when a user manager runs; None without one."""
    running, _why = user_manager_running(env)
    if not running:
        return None
    proc = systemctl_user("is-active", UNIT_NAME, env=env)
    return proc.stdout.strip() or "unknown"
