"""Enforce CPU and memory limits through the kernel's cgroup files.

Each workload gets its own cgroup *nested under the cgroup it already runs in*, one per
controller: limits above it (a container's, a systemd slice's) still hold, and removing
the policy moves the processes back to exactly where they were, whose limits seedance
never touched.  Two backends, chosen by what the host mounts (see detect()):

  cgroup v2: cpu.max ("QUOTA PERIOD"), memory.max, memory.high
             (Documentation/admin-guide/cgroup-v2.rst); needs cpu and memory enabled in
             the parent's cgroup.subtree_control, i.e. a delegated subtree.
  cgroup v1: cpu.cfs_quota_us / cpu.cfs_period_us, memory.limit_in_bytes /
             memory.soft_limit_in_bytes (Documentation/admin-guide/cgroup-v1/), as on
             hybrid hosts where systemd mounts v2 for itself and the controllers stay v1.

memory.high / the v1 soft limit is set to 90% of the quota: the kernel reclaims and
throttles there before the hard limit's OOM killer has to act.
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field

from ..model.errors import BadInput, NotAvailable

CFS_PERIOD_US = 100_000  # the kernel's default period; quota = millicores * period / 1000
SOFT_FRACTION = 0.9
CONTROLLERS = ("cpu", "memory")


@dataclass
class Placement:
    """Where one workload's cgroup lives, per controller, and where its processes came from."""
    backend: str
    groups: dict          # controller -> absolute cgroup directory we created
    original: dict        # controller -> absolute cgroup directory the workload ran in
    created: list = field(default_factory=list)  # directories we made (removed on undo)

    def to_dict(self) -> dict:
        return {"backend": self.backend, "groups": dict(self.groups), "original": dict(self.original),
                "created": list(self.created)}

    @classmethod
    def from_dict(cls, data: dict) -> "Placement":
        return cls(data["backend"], dict(data["groups"]), dict(data["original"]), list(data.get("created", ())))


def _mounts(mountinfo: str = "/proc/self/mountinfo") -> tuple[dict, str | None]:
    """v1 controller -> mount point, and the cgroup2 mount point (or None)."""
    v1, v2 = {}, None
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as handle:
        for line in handle:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) < 5 or len(tail) < 3:
                continue
            mount_point = fields[4].replace("\\040", " ")
            if tail[0] == "cgroup2":
                v2 = v2 or mount_point
            elif tail[0] == "cgroup":
                for option in tail[2].split(","):
                    if option in CONTROLLERS and option not in v1:
                        v1[option] = mount_point
    return v1, v2


def _proc_cgroups(pid: int) -> tuple[dict, str | None]:
    """/proc/PID/cgroup -> (v1 controller -> path, v2 path)."""
    v1, v2 = {}, None
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="surrogateescape") as handle:
            for line in handle:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "":
                    v2 = path
                for controller in controllers.split(","):
                    if controller in CONTROLLERS:
                        v1[controller] = path
    except FileNotFoundError:
        raise BadInput(f"pid {pid}: no such process") from None
    return v1, v2


def _write(path: str, value) -> None:
    try:
        with open(path, "w") as handle:
            handle.write(f"{value}\n")
    except OSError as exc:
        raise BadInput(f"cannot write {value} to {path}: {os.strerror(exc.errno).lower()}") from None


def _make_group(directory: str, created: list) -> str:
    """mkdir a cgroup (an existing one is reused); record it in ``created`` when we made it."""
    try:
        os.mkdir(directory, 0o755)
        created.append(directory)
    except FileExistsError:
        pass
    except OSError as exc:
        raise BadInput(f"cannot create cgroup {directory}: {os.strerror(exc.errno).lower()}") from None
    return directory


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read().strip()


class Backend:
    name = "?"

    def place(self, pid: int, group: str) -> Placement:  # pragma: no cover - interface
        raise NotImplementedError

    def set_limits(self, placement: Placement, cpu_millicores, memory_bytes) -> dict:
        raise NotImplementedError

    def pressure_file(self, placement: Placement, resource: str) -> str:
        return f"/proc/pressure/{resource}"

    def move(self, pids, placement: Placement, *, back: bool = False) -> None:
        target = placement.original if back else placement.groups
        for directory in sorted(set(target.values())):  # v2: one directory for both controllers
            for pid in pids:
                try:
                    _write(os.path.join(directory, "cgroup.procs"), pid)
                except BadInput:
                    if os.path.exists(f"/proc/{pid}"):
                        raise  # a process that exited meanwhile is not an error

    def members(self, placement: Placement) -> set[int]:
        pids = set()
        for directory in placement.groups.values():
            try:
                pids.update(int(p) for p in _read(os.path.join(directory, "cgroup.procs")).split())
            except OSError:
                pass
        return pids

    def remove(self, placement: Placement) -> None:
        """Move every member back where the workload came from, then remove our groups."""
        self.move(sorted(self.members(placement)), placement, back=True)
        for directory in reversed(placement.created):
            try:
                os.rmdir(directory)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    raise BadInput(f"cannot remove cgroup {directory}: {os.strerror(exc.errno).lower()}") from None

    def limits(self, placement: Placement) -> dict:
        raise NotImplementedError


class CgroupV1(Backend):
    name = "cgroup-v1"

    def __init__(self, mounts: dict):
        self.mounts = mounts

    def place(self, pid: int, group: str) -> Placement:
        current, _ = _proc_cgroups(pid)
        groups, original, created = {}, {}, []
        for controller in CONTROLLERS:
            base = os.path.join(self.mounts[controller], current.get(controller, "/").lstrip("/"))
            original[controller] = os.path.normpath(base)
            groups[controller] = _make_group(os.path.join(original[controller], group), created)
        return Placement(self.name, groups, original, created)

    def set_limits(self, placement, cpu_millicores, memory_bytes) -> dict:
        cpu_dir, mem_dir = placement.groups["cpu"], placement.groups["memory"]
        if cpu_millicores is None:
            _write(os.path.join(cpu_dir, "cpu.cfs_quota_us"), -1)
        else:
            _write(os.path.join(cpu_dir, "cpu.cfs_period_us"), CFS_PERIOD_US)
            _write(os.path.join(cpu_dir, "cpu.cfs_quota_us"), cpu_millicores * CFS_PERIOD_US // 1000)
        if memory_bytes is not None:
            _write(os.path.join(mem_dir, "memory.limit_in_bytes"), memory_bytes)
            _write(os.path.join(mem_dir, "memory.soft_limit_in_bytes"), int(memory_bytes * SOFT_FRACTION))
        return self.limits(placement)

    def limits(self, placement) -> dict:
        out = {}
        for controller, names in (("cpu", ("cpu.cfs_quota_us", "cpu.cfs_period_us")),
                                  ("memory", ("memory.limit_in_bytes", "memory.soft_limit_in_bytes"))):
            for name in names:
                try:
                    out[name] = _read(os.path.join(placement.groups[controller], name))
                except OSError:
                    pass
        return out


class CgroupV2(Backend):
    name = "cgroup-v2"

    def __init__(self, mount: str):
        self.mount = mount

    def place(self, pid: int, group: str) -> Placement:
        _, current = _proc_cgroups(pid)
        parent = os.path.normpath(os.path.join(self.mount, (current or "/").lstrip("/")))
        enabled = _read(os.path.join(parent, "cgroup.subtree_control")).split()
        missing = [c for c in CONTROLLERS if c not in enabled]
        if missing:
            # cgroup v2's "no internal processes" rule: a delegated parent must enable the
            # controllers for its children (cgroup-v2.rst, "Delegation").
            raise NotAvailable(f"cgroup v2: {parent} does not delegate {', '.join(missing)} to its children "
                               "(cgroup.subtree_control); run inside a delegated subtree")
        created = []
        directory = _make_group(os.path.join(parent, group), created)
        groups = {c: directory for c in CONTROLLERS}
        return Placement(self.name, groups, {c: parent for c in CONTROLLERS}, created)

    def set_limits(self, placement, cpu_millicores, memory_bytes) -> dict:
        directory = placement.groups["cpu"]
        quota = "max" if cpu_millicores is None else cpu_millicores * CFS_PERIOD_US // 1000
        _write(os.path.join(directory, "cpu.max"), f"{quota} {CFS_PERIOD_US}")
        if memory_bytes is not None:
            _write(os.path.join(directory, "memory.max"), memory_bytes)
            _write(os.path.join(directory, "memory.high"), int(memory_bytes * SOFT_FRACTION))
        return self.limits(placement)

    def limits(self, placement) -> dict:
        out = {}
        for name in ("cpu.max", "memory.max", "memory.high"):
            try:
                out[name] = _read(os.path.join(placement.groups["cpu"], name))
            except OSError:
                pass
        return out

    def pressure_file(self, placement, resource) -> str:
        own = os.path.join(placement.groups["cpu"], f"{resource}.pressure")
        return own if os.path.exists(own) else super().pressure_file(placement, resource)


def detect(mountinfo: str = "/proc/self/mountinfo") -> Backend:
    """v2 when it carries both controllers, else v1 when both are mounted, else refuse."""
    v1, v2 = _mounts(mountinfo)
    if v2:
        try:
            available = _read(os.path.join(v2, "cgroup.controllers")).split()
        except OSError:
            available = []
        if all(c in available for c in CONTROLLERS):
            return CgroupV2(v2)
    if all(c in v1 for c in CONTROLLERS):
        return CgroupV1(v1)
    raise NotAvailable("no cgroup cpu and memory controllers are mounted (neither v2 nor v1): quotas cannot be enforced")
