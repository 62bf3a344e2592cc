"""Enforce quotas through the user's systemd manager: one transient scope per workload.

Where a user manager answers, a workload belongs in a unit of that manager, as every other
thing the user runs does: `systemctl --user status` then shows it, and the manager, not a
directory seedance made behind its back, owns the cgroup.  `systemd-run --user --scope
-p CPUQuota= -p MemoryMax= CMD` is StartTransientUnit(NAME.scope, PIDs=[its own pid]) on
the manager's bus followed by exec(CMD); a workload that already runs gets the same call
with its own pids (org.freedesktop.systemd1(5): StartTransientUnit, AttachProcessesToUnit).
The limits are then the unit's properties, changed with `systemctl --user set-property
--runtime` exactly as `-p` sets them (systemd.resource-control(5): CPUQuota=, MemoryMax=,
MemoryHigh=).

Whether the kernel enforces them depends on the hierarchy the manager runs on.  On cgroup v2
the system manager delegates cpu and memory to user@UID.service and the scope's cpu.max and
memory.max are written.  On the legacy (v1) hierarchy systemd never delegates controllers
to a user manager: the scope exists, holds the processes and records CPUQuota=/MemoryMax=,
but no cpu or memory cgroup is made for it.  enforcement() reports which of the two holds,
read from the kernel's files, so `quota apply` says so instead of claiming a limit.

The scope is made with Delegate=yes: the manager refuses AttachProcessesToUnit (a workload's
process that started after it was placed) into a scope it was not told to delegate.

The state file keeps, per workload, the unit and its control group path; `remove` lifts the
limits and, while processes remain, leaves them in the (now limitless) scope: a user
manager cannot move a process back to a cgroup outside its own tree, and stopping the scope
would kill the workload.  systemd removes the scope when its last process exits.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

from ..model.errors import BadInput, NotAvailable
from .cgroups import SOFT_FRACTION, Backend, Placement, _proc_cgroups

MANAGER = ("org.freedesktop.systemd1", "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager")
TIMEOUT_S = 15
# unit names allow [A-Za-z0-9:_.\\-] (systemd.unit(5)); anything else in a policy name or a
# workload id is replaced so the scope name is always valid and never reinterpreted
_UNIT_UNSAFE = re.compile(r"[^A-Za-z0-9:_.-]")


def _tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        raise NotAvailable(f"quota (systemd): {name} is not installed")
    return path


def _run(argv: list[str], what: str) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise NotAvailable(f"quota (systemd): {what}: the user manager did not answer within {TIMEOUT_S}s") from None
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise BadInput(f"quota (systemd): {what}: {reason}")
    return proc.stdout


def user_manager_answers() -> bool:
    """True when `systemctl --user` reaches a running user manager of this user."""
    if not shutil.which("systemctl") or not shutil.which("busctl"):
        return False
    try:
        proc = subprocess.run(["systemctl", "--user", "is-system-running"], capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except (subprocess.TimeoutExpired, OSError):
        return False
    return proc.stdout.strip() in ("running", "degraded", "starting", "initializing")


def _hierarchies(mountinfo: str = "/proc/self/mountinfo") -> dict:
    """Mount points: 'unified' (cgroup2), 'systemd' (v1 name=systemd), and v1 'cpu', 'memory'."""
    found = {}
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as handle:
        for line in handle:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) < 5 or len(tail) < 3:
                continue
            point = fields[4].replace("\\040", " ")
            if tail[0] == "cgroup2":
                found.setdefault("unified", point)
            elif tail[0] == "cgroup":
                for option in tail[2].split(","):
                    key = "systemd" if option == "name=systemd" else option
                    if key in ("systemd", "cpu", "memory"):
                        found.setdefault(key, point)
    return found


class SystemdScopes(Backend):
    name = "systemd-scope"

    def __init__(self, mountinfo: str = "/proc/self/mountinfo"):
        self.mounts = _hierarchies(mountinfo)

    # -- the manager's view ----------------------------------------------------------------
    def _show(self, unit: str, *props: str) -> dict:
        out = _run(["systemctl", "--user", "show", unit, *(f"--property={p}" for p in props)],
                   f"systemctl --user show {unit}")
        values = {}
        for line in out.splitlines():
            key, _, value = line.partition("=")
            values[key] = value
        return values

    def _scope_dir(self, control_group: str) -> str | None:
        """The scope's directory in the hierarchy the manager tracks processes in."""
        for key in ("unified", "systemd"):
            base = self.mounts.get(key)
            if base:
                directory = os.path.normpath(os.path.join(base, control_group.lstrip("/")))
                if os.path.isdir(directory):
                    return directory
        return None

    # -- Backend ---------------------------------------------------------------------------
    def place(self, pid: int, group: str) -> Placement:
        unit = _UNIT_UNSAFE.sub("_", group) + ".scope"
        v1, v2 = _proc_cgroups(pid)  # refuses a pid that is gone, as the cgroup backends do
        before = v2 if v2 is not None else v1.get("cpu", "/")
        _run(["busctl", "--user", "call", *MANAGER, "StartTransientUnit", "ssa(sv)a(sa(sv))", unit, "fail",
              "3", "PIDs", "au", "1", str(pid), "Delegate", "b", "true",
              "Description", "s", f"seedance quota workload {group}", "0"],
             f"start scope {unit} for pid {pid}")
        control_group = ""
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:  # the start job runs asynchronously to the call
            props = self._show(unit, "ActiveState", "ControlGroup")
            if props.get("ActiveState") == "active" and props.get("ControlGroup"):
                control_group = props["ControlGroup"]
                break
            if props.get("ActiveState") == "failed":
                break
            time.sleep(0.05)
        if not control_group:
            raise BadInput(f"quota (systemd): scope {unit} for pid {pid} did not become active")
        groups = {"unit": unit, "cgroup": control_group}
        return Placement(self.name, groups, {"cgroup": before}, [unit])

    def set_limits(self, placement: Placement, cpu_millicores, memory_bytes) -> dict:
        unit = placement.groups["unit"]
        # CPUQuota= in percent of one CPU, as `systemd-run -p CPUQuota=` takes it; empty resets
        settings = [f"CPUQuota={cpu_millicores / 10:g}%" if cpu_millicores is not None else "CPUQuota="]
        if memory_bytes is not None:
            settings += [f"MemoryMax={memory_bytes}", f"MemoryHigh={int(memory_bytes * SOFT_FRACTION)}"]
        _run(["systemctl", "--user", "set-property", "--runtime", unit, *settings],
             f"systemctl --user set-property {unit}")
        return self.limits(placement)

    def limits(self, placement: Placement) -> dict:
        props = self._show(placement.groups["unit"], "CPUQuotaPerSecUSec", "MemoryMax", "MemoryHigh")
        return {key: value for key, value in props.items() if value}

    def move(self, pids, placement: Placement, *, back: bool = False) -> None:
        if back or not pids:
            return  # see the module docstring: a user manager cannot hand a process back
        unit = placement.groups["unit"]
        members = self.members(placement)
        alive = [pid for pid in pids if pid not in members and os.path.exists(f"/proc/{pid}")]
        if alive:
            _run(["busctl", "--user", "call", *MANAGER, "AttachProcessesToUnit", "ssau", unit, "",
                  str(len(alive)), *map(str, alive)], f"attach pids to {unit}")

    def members(self, placement: Placement) -> set[int]:
        directory = self._scope_dir(placement.groups["cgroup"])
        if directory is None:
            return set()
        try:
            with open(os.path.join(directory, "cgroup.procs"), encoding="ascii") as handle:
                return {int(p) for p in handle.read().split()}
        except OSError:
            return set()

    def remove(self, placement: Placement) -> None:
        unit = placement.groups["unit"]
        if not self.members(placement):
            subprocess.run(["systemctl", "--user", "stop", unit], capture_output=True, timeout=TIMEOUT_S)
            return
        _run(["systemctl", "--user", "set-property", "--runtime", unit, "CPUQuota=", "MemoryMax=infinity",
              "MemoryHigh=infinity"], f"lift the limits of {unit}")

    def pressure_file(self, placement: Placement, resource: str) -> str:
        base = self.mounts.get("unified")
        if base:
            own = os.path.join(base, placement.groups["cgroup"].lstrip("/"), f"{resource}.pressure")
            if os.path.exists(own):
                return own
        return super().pressure_file(placement, resource)

    def enforcement(self, placement: Placement) -> tuple[bool, str]:
        """Whether the kernel holds the scope to its limits: its cpu and memory cgroup files."""
        control_group = placement.groups["cgroup"].lstrip("/")
        unified = self.mounts.get("unified")
        if unified and os.path.exists(os.path.join(unified, control_group, "cpu.max")) \
                and os.path.exists(os.path.join(unified, control_group, "memory.max")):
            return True, "cgroup v2: cpu.max and memory.max of the scope"
        if all(self.mounts.get(c) and os.path.isdir(os.path.join(self.mounts[c], control_group))
               for c in ("cpu", "memory")):
            return True, "cgroup v1: the scope's cpu and memory cgroups"
        return False, ("the user manager runs on the legacy cgroup hierarchy, where systemd delegates no "
                       "cpu or memory controller to it: the scope holds the workload and records the "
                       "limits, the kernel does not enforce them (SEEDANCE_QUOTA_BACKEND=cgroup enforces "
                       "them through the cgroup files, as root)")


def detect() -> Backend:
    """SEEDANCE_QUOTA_BACKEND (systemd, cgroup, auto): systemd scopes when a user manager
    answers, else the cgroup files (cgroups.detect)."""
    from . import cgroups

    wanted = os.environ.get("SEEDANCE_QUOTA_BACKEND", "auto") or "auto"
    if wanted not in ("auto", "systemd", "cgroup"):
        raise BadInput(f"SEEDANCE_QUOTA_BACKEND={wanted!r}: expected auto, systemd or cgroup")
    if wanted == "cgroup":
        return cgroups.detect()
    if user_manager_answers():
        return SystemdScopes()
    if wanted == "systemd":
        raise NotAvailable("SEEDANCE_QUOTA_BACKEND=systemd: no user manager answers `systemctl --user` "
                           "(log in with a systemd session, or `loginctl enable-linger`)")
    return cgroups.detect()
