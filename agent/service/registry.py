"""The agent's view of the shim's instance registry (seedance.shim, issue 4).

GC needs four things from it: the slots with their identity (pid + start time) and
liveness, the allocations a slot still holds, reclaiming a dead slot, and how many slots
are free.  This module adapts the shim's Python API to exactly that, so the loop does not
depend on the registry's layout.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..errors import NotAvailable


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

    def to_dict(self) -> dict:
        return {"slot": self.slot, "pid": self.pid, "start_time": self.start_time, "command": self.exe,
                "alive": self.alive, "allocated_bytes": self.allocated_bytes, "remapped": self.remapped,
                "devices": list(self.devices)}


def open_registry(env: Mapping[str, str]):
    try:
        import seedance.shim  # noqa: F401
    except ImportError:
        raise NotAvailable("the shim's registry API (seedance.shim) is not installed") from None
    raise NotAvailable("the shim's registry API is not wired into the agent yet")
