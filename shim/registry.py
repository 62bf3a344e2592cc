"""Read (and reclaim in) the shim's shared registry from Python.

The layout is the cdef of seedance_shim.h; the rules that change it (reclaiming a
slot, releasing a group, deciding whether a slot's process is dead) are the C
functions the shim itself uses, called through the binding, so they exist once.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ..model.errors import NotAvailable
from .binding import binding
from .events import EVENT_STRUCT, event_to_dict
from .pidns import ProcessTable, own_pid_namespace

STATES = {0: "free", 1: "claiming", 2: "live", 3: "exited"}
RECORD_STRUCT = struct.Struct("<QQiHH")
TOMBSTONE = 1
HANDLE_TAG = 1 << 63


@dataclass(frozen=True)
class Allocation:
    ptr: int            # device pointer, or the cuMemCreate handle
    size: int
    device: int         # physical device (driver ordinal)
    api: str
    library: str | None
    handle: bool = False


@dataclass(frozen=True)
class Group:
    index: int
    key: int
    owner_pid: int
    members: int
    limits: dict[int, int]
    used: dict[int, int]
    refused: dict[int, int]
    peak: dict[int, int]
    overflow_total: int = 0       # processes that shared the quota without a slot (registry full)
    overflow_refused: int = 0     # ... that found no overflow entry either: quota'd allocations refused


@dataclass(frozen=True)
class Instance:
    slot: int
    pid: int
    start_time: int
    state: str
    alive: bool
    exe: str
    ppid: int
    group: int
    ndevices: int
    visible: list[int] | None         # logical ordinal i -> physical visible[i]; None: no remap
    current: dict[int, int]           # bytes held per physical device (sum of its records)
    refused: dict[int, int]
    contexts: dict[int, int]
    api_calls: dict[str, int]
    libraries: list[str]
    library_allocs: dict[str, int]    # allocations made per calling library
    untracked: int
    audit: bool
    started_ns: int
    exited_ns: int
    events_dropped: int = 0
    extra: dict = field(default_factory=dict)
    # pid and ppid above are as the process saw them, in its own pid namespace; a reader in
    # another one (the host agent, for a container's process) finds it by these:
    pid_namespace: tuple[int, int] = (0, 0)   # (st_dev, st_ino) of its /proc/self/ns/pid; 0: unknown
    host_pid: int | None = None               # its pid in the reader's namespace; None: ended or unseen
    host_ppid: int = 0                        # its parent's, 0 when unknown


def registry_path() -> Path:
    """The path the shim uses (same rules, computed by the same C function)."""
    ffi, lib = binding()
    buf = ffi.new("char[]", 1024)
    rc = lib.seedance_registry_path(buf, 1024)
    if rc < 0:
        raise NotAvailable(f"no registry directory for seedance: {os.strerror(-rc)}")
    return Path(ffi.string(buf).decode())


def _nonzero(array, n) -> dict[int, int]:
    return {i: int(array[i]) for i in range(n) if array[i]}


class Registry:
    """An open registry: ``Registry.open()``; cheap to open, safe to keep open."""

    def __init__(self, path: Path, mm: mmap.mmap):
        self.ffi, self.lib = binding()
        self.path = path
        self._mm = mm
        self.base = self.ffi.from_buffer("char[]", mm)
        self.header = self.ffi.cast("struct sd_header *", self.base)
        ffi = self.ffi
        if self.header.magic != self.lib.SD_MAGIC or \
                self.header.abi_version != self.lib.SD_ABI_VERSION or \
                self.header.slot_size != ffi.sizeof("struct sd_slot") or \
                self.header.group_size != ffi.sizeof("struct sd_group"):
            raise NotAvailable(f"{path}: registry of another seedance version (ABI {self.header.abi_version}, "
                               f"this seedance reads ABI {self.lib.SD_ABI_VERSION}): its programs must run "
                               f"under the same seedance")
        if ffi.sizeof("struct sd_event") != EVENT_STRUCT.size or \
                ffi.sizeof("struct sd_record") != RECORD_STRUCT.size:
            raise NotAvailable("seedance.shim: event/record layout out of step with seedance_shim.h")
        self.max_slots = self.lib.SD_MAX_SLOTS
        self.max_devices = self.lib.SD_MAX_DEVICES
        self.api_names = [ffi.string(self.header.api_names[i]).decode() for i in range(self.header.napis)]
        self.pid_namespace = own_pid_namespace()

    @classmethod
    def open(cls, path: str | os.PathLike | None = None) -> "Registry":
        ffi, lib = binding()
        path = Path(path) if path else registry_path()
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise NotAvailable(f"{path}: no registry yet (no program has run under `seedance run`)") from None
        try:
            size = lib.seedance_registry_size()
            if os.fstat(fd).st_size < size:
                raise NotAvailable(f"{path}: registry is truncated")
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return cls(path, mm)

    # -- slots ---------------------------------------------------------------------
    def _slot(self, index: int):
        ptr = self.lib.seedance_registry_slot_ptr(self.base, index)
        if ptr == self.ffi.NULL:
            raise IndexError(index)
        return ptr

    def libraries(self, index: int) -> list[str]:
        s = self._slot(index)
        n = min(int(s.nlibs), self.lib.SD_MAX_LIBS)
        return [self.ffi.string(s.libs[i].path).decode("utf-8", "replace") if s.libs[i].ready else "?"
                for i in range(n)]

    def library_allocs(self, index: int) -> dict[str, int]:
        s = self._slot(index)
        out: dict[str, int] = {}
        for i, path in enumerate(self.libraries(index)):
            if s.libs[i].allocs:
                out[path] = out.get(path, 0) + int(s.libs[i].allocs)
        return out

    def _foreign_namespace(self, s) -> tuple[int, int] | None:
        """The slot's pid namespace when it is not this reader's (None: ours, or unknown)."""
        ns = (int(s.pid_ns_dev), int(s.pid_ns_ino))
        return ns if ns[1] and self.pid_namespace is not None and ns != self.pid_namespace else None

    def process_table(self) -> ProcessTable | None:
        """One walk of /proc for the slots of other pid namespaces (containers); None when
        every occupied slot is of this reader's namespace.  A pass reads it once."""
        wanted = set()
        for index in range(self.max_slots):
            s = self._slot(index)
            if int(s.state) != 0 and (ns := self._foreign_namespace(s)) is not None:
                wanted.add(ns)
        return ProcessTable.scan(wanted) if wanted else None

    def instance(self, index: int, processes: ProcessTable | None = None) -> Instance | None:
        """The slot's instance.  ``processes``: a ProcessTable of this pass (instances()
        makes one); without it a process of another pid namespace costs a walk of /proc."""
        s = self._slot(index)
        state = int(s.state)
        if state == 0:
            return None
        nd = self.max_devices
        pid, start, ppid = int(s.pid), int(s.start_time), int(s.ppid)
        foreign = self._foreign_namespace(s)
        if foreign is None:
            alive = self.lib.seedance_registry_slot_dead(self.base, index) == 0
            host_pid, host_ppid = (pid if alive else None), ppid
        else:
            if processes is None or foreign not in processes.wanted:
                processes = ProcessTable.scan({foreign})
            alive = state != 3 and pid > 0 and processes.alive(foreign, pid, start)
            host_pid = processes.find(foreign, pid, start) if alive else None
            host_ppid = (processes.translate(foreign, ppid) or 0) if ppid > 0 else 0
        return Instance(
            slot=index, pid=pid, start_time=start, state=STATES.get(state, str(state)),
            alive=alive, exe=self.ffi.string(s.exe).decode("utf-8", "replace"), ppid=ppid,
            group=int(s.group), ndevices=int(s.ndevices),
            visible=None if s.nvisible < 0 else [int(s.visible[i]) for i in range(s.nvisible)],
            current=self._held(index), refused=_nonzero(s.refused, nd),
            contexts=_nonzero(s.contexts, nd),
            api_calls={self.api_names[i]: int(s.api_calls[i]) for i in range(len(self.api_names))
                       if s.api_calls[i]},
            libraries=self.libraries(index), library_allocs=self.library_allocs(index), untracked=int(s.untracked), audit=bool(s.flags & 1),
            started_ns=int(s.started_ns), exited_ns=int(s.exited_ns), events_dropped=int(s.ring_dropped),
            pid_namespace=(int(s.pid_ns_dev), int(s.pid_ns_ino)), host_pid=host_pid, host_ppid=host_ppid)

    def _held(self, index: int) -> dict[int, int]:
        """Bytes held per device: the sum of the slot's records, added up in C."""
        held = self.ffi.new("uint64_t[]", self.max_devices)
        self.lib.seedance_slot_held(self.base, index, held)
        return _nonzero(held, self.max_devices)

    def slots_of_group(self, group_index: int) -> list[int]:
        """Occupied slots of one quota group; cheap (one pass in C, no record scan)."""
        out = self.ffi.new("int[]", self.max_slots)
        n = self.lib.seedance_group_slots(self.base, group_index, out, self.max_slots)
        return list(out[0:max(n, 0)])

    def instances(self) -> list[Instance]:
        processes = self.process_table()
        return [inst for i in range(self.max_slots) if (inst := self.instance(i, processes)) is not None]

    def allocations(self, index: int) -> list[Allocation]:
        """What the instance still holds; for a dead instance, its leaks."""
        s = self._slot(index)
        if not self._held(index):
            return []
        libs = self.libraries(index)
        raw = bytes(self.ffi.buffer(s.records))
        out = []
        for ptr, size, device, api, lib in RECORD_STRUCT.iter_unpack(raw):
            if ptr in (0, TOMBSTONE):
                continue
            out.append(Allocation(ptr=ptr & ~HANDLE_TAG, size=size, device=device,
                                  api=self.api_names[api] if api < len(self.api_names) else str(api),
                                  library=libs[lib] if lib < len(libs) else None,
                                  handle=bool(ptr & HANDLE_TAG)))
        return out

    def leaks(self, index: int) -> dict[tuple[int, str | None], dict]:
        """{(device, library): {"bytes": n, "allocations": k}} of what is still held."""
        out: dict[tuple[int, str | None], dict] = {}
        for a in self.allocations(index):
            entry = out.setdefault((a.device, a.library), {"bytes": 0, "allocations": 0})
            entry["bytes"] += a.size
            entry["allocations"] += 1
        return out

    def reclaim(self, index: int) -> bool:
        """Free the slot of a dead or exited instance (quota given back); False if alive."""
        return self.lib.seedance_registry_reclaim(self.base, index) == 0

    def drain_events(self, index: int) -> list[dict]:
        """Events published since the last drain (single consumer per slot)."""
        s = self._slot(index)
        n = self.lib.SD_RING_EVENTS
        head, tail = int(s.ring_head), int(s.ring_tail)
        dropped = 0
        if head - tail > n:
            dropped += head - tail - n
            tail = head - n
        dead = self.lib.seedance_registry_slot_dead(self.base, index) == 1
        libs = self.libraries(index)
        pid = int(s.pid)
        out = []
        while tail < head:
            e = self.ffi.addressof(s.ring, tail % n)
            seq = int(e.seq)
            if seq == tail + 1:
                raw = bytes(self.ffi.buffer(e))
                if int(e.seq) == seq:
                    out.append(event_to_dict(raw, pid, self.api_names, libs))
                else:
                    dropped += 1
            elif seq > tail + 1:
                dropped += 1          # overwritten: the writer lapped us
            elif not dead:
                break                 # still being written: next drain
            else:
                dropped += 1          # its writer died mid-event
            tail += 1
        s.ring_tail = tail
        s.ring_dropped += dropped
        return out

    # -- groups --------------------------------------------------------------------
    def group(self, index: int) -> Group | None:
        g = self.lib.seedance_registry_group_ptr(self.base, index)
        if g == self.ffi.NULL or not g.key:
            return None
        nd = self.max_devices
        return Group(index=index, key=int(g.key), owner_pid=int(g.owner_pid), members=int(g.members),
                     limits=_nonzero(g.limit, nd), used=_nonzero(g.used, nd), refused=_nonzero(g.refused, nd),
                     peak=_nonzero(g.peak, nd), overflow_total=int(g.overflow_total),
                     overflow_refused=int(g.overflow_refused))

    def find_group(self, key: int) -> Group | None:
        index = self.lib.seedance_group_find(self.base, key)
        return self.group(index) if index >= 0 else None

    def release_group(self, index: int) -> bool:
        return self.lib.seedance_group_release(self.base, index) == 0

    def close(self) -> None:
        self.base = None
        self.header = None
        try:
            self._mm.close()
        except BufferError:
            pass
