"""The agent's view of the shim's instance registry (seedance.shim).

GC needs four things from it: the slots with their identity (pid + start time) and
liveness, the allocations a slot still holds, reclaiming a dead slot, and how many slots
are free.

A slot's pid is the one its process saw: in a container, a pid of the container's pid
namespace.  The identity the agent keeps (the state database's key, the log) stays that
recorded (pid, start time), which a restart reads back the same whether the process still
runs or not; liveness is decided in the process's own namespace (seedance.shim.pidns, one
walk of /proc per pass), and host_pid says which host process it is while it runs.  This module adapts the shim's Python API to exactly that, so the loop does not
depend on the registry's layout.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping

from ..model.errors import NotAvailable


@dataclass(frozen=True)
class Allocation:
    size: int
    device: int
    api: str = ""
    library: str = ""


@dataclass(frozen=True)
class InstanceSlot:
    slot: int
    pid: int
    start_time: int
    exe: str
    alive: bool
    allocated_bytes: int = 0
    remapped: bool = False
    devices: tuple = field(default_factory=tuple)
    raw: object = field(default=None, compare=False, repr=False)  # the shim's Instance
    host_pid: int | None = None     # the pid in the agent's namespace, while it runs
    pid_namespace: int = 0          # inode of its pid namespace (0: unknown)

    def to_dict(self) -> dict:
        return {"slot": self.slot, "pid": self.pid, "start_time": self.start_time, "command": self.exe,
                "alive": self.alive, "allocated_bytes": self.allocated_bytes, "remapped": self.remapped,
                "devices": list(self.devices), "host_pid": self.host_pid, "pid_namespace": self.pid_namespace}


class ShimRegistry:
    """seedance.shim.Registry, seen the way the GC loop needs it."""

    def __init__(self, registry):
        self._registry = registry
        self.path = registry.path
        self.slots = registry.max_slots
        self._occupied: set[int] = set()

    def scan(self) -> list[InstanceSlot]:
        """The occupied slots.

        Each slot spans many pages, so reading every slot's state touches one page per slot;
        on a VM whose idle pages have gone cold each touch can be a fault the hypervisor
        serves, for each of the SD_MAX_SLOTS slots on every pass.  That is
        why the agent re-reads an empty registry with backoff (daemon.IDLE_SCAN_MAX_S).
        """
        instances = self._registry.instances()
        self._occupied = {inst.slot for inst in instances}
        out = []
        for inst in instances:
            if inst.pid <= 0:
                continue  # a slot caught mid-claim has no identity yet: next pass
            out.append(InstanceSlot(
                slot=inst.slot, pid=inst.pid, start_time=inst.start_time, exe=inst.exe, alive=inst.alive,
                allocated_bytes=sum(inst.current.values()), remapped=inst.visible is not None,
                devices=tuple(sorted(inst.current)) if inst.current else tuple(inst.visible or ()),
                raw=inst, host_pid=getattr(inst, "host_pid", inst.pid if inst.alive else None),
                pid_namespace=getattr(inst, "pid_namespace", (0, 0))[1]))
        return out

    def outstanding(self, inst: InstanceSlot) -> list[Allocation]:
        return [Allocation(size=a.size, device=a.device, api=a.api, library=a.library or "")
                for a in self._registry.allocations(inst.slot)]

    def leak_facts(self, inst: InstanceSlot) -> list:
        """The same instance_leak facts `seedance run` makes (seedance.run.report), so the
        handle-leak rule judges an instance identically whoever looks at it."""
        from ..run.report import instance_facts, leaks_with_apis

        facts = instance_facts([inst.raw], {inst.slot: leaks_with_apis(self._registry, inst.slot)}, {})
        return [fact for fact in facts if fact.kind == "instance_leak"]

    def reclaim(self, inst: InstanceSlot) -> str:
        """'reclaimed' by us, 'gone' (someone else reclaimed it first), or 'alive'."""
        current = self._registry.instance(inst.slot)
        # Reclaim exactly the instance that was judged: the slot may have been reclaimed and
        # claimed again (by `seedance run` or a second agent) since the scan.
        if current is None or (current.pid, current.start_time, getattr(current, "pid_namespace", None)) != \
                (inst.pid, inst.start_time, getattr(inst.raw, "pid_namespace", None)):
            return "gone"
        if self._registry.reclaim(inst.slot):
            return "reclaimed"
        return "gone" if self._registry.instance(inst.slot) is None else "alive"

    def wrapper_alive(self, inst: InstanceSlot) -> bool:
        """Whether the `seedance run` that launched the instance is still running: it reports
        and reclaims its own instances when they end, so the agent leaves those to it."""
        # the parent's pid in the agent's namespace (a container's process records its own)
        ppid = getattr(inst.raw, "host_ppid", getattr(inst.raw, "ppid", 0))
        if ppid <= 1:
            return False
        try:
            with open(f"/proc/{ppid}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            return False
        words = [os.path.basename(w) for w in argv[:4]]
        return b"run" in argv[:4] and (b"seedance" in words or b"seedance" in argv[:4])

    def free_slots(self) -> int:
        """Free slots as of the last scan (GC reads the table once per pass)."""
        return self._registry.max_slots - len(self._occupied)

    def close(self) -> None:
        self._registry.close()


def open_registry(env: Mapping[str, str] | None = None) -> ShimRegistry:
    """The shim's registry (created by the first wrapped program); NotAvailable until then."""
    try:
        from seedance import shim
    except ImportError:
        raise NotAvailable("the shim's registry API (seedance.shim) is not installed") from None
    return ShimRegistry(shim.Registry.open())
