"""Live events -> Facts for the same rule engine as `seedance check`.

The facts have the kinds and data keys the check's collectors produce (rules/*.yaml
select them), plus what only a live trace knows: the loader's own message
(``loader_message``), the requesting object, the pid.  Facts never judge: a NEEDED
resolved live is reported whether or not its SONAME matches; the rule decides.

Per process this keeps what the loader has mapped (from link-map events), the CUDA
runtimes among them, and every device allocation not yet freed.  At exit, what is left
becomes an ``instance_leak`` fact per (device, allocating library): the fact kind and
data keys `seedance run` produces from the shim's registry, judged by handle-leak.
"""
from __future__ import annotations

import os
import re
from bisect import bisect_right
from dataclasses import dataclass, field

from ..model.report import Fact
from .events import TraceEvent

SOURCE = "trace"
LEAK_KIND = "instance_leak"  # rules/runtime.yaml handle-leak, same data keys as seedance.run.report
_VERSION_MISSING = re.compile(r"^version `(?P<version>[^']+)' not found \(required by (?P<requester>.+)\)$")
_UNDEFINED = re.compile(r"^undefined symbol: (?P<symbol>[^,\s]+)(?:, version (?P<version>\S+))?$")


@dataclass(frozen=True)
class FileInfo:
    path: str
    dev: int | None = None
    inode: int | None = None
    soname: str | None = None
    needed: tuple = ()
    version_needs: tuple = ()
    version_defs: tuple = ()
    is_elf: bool = False


class FileInfoCache:
    """stat + ELF header facts per path, re-read only when the inode changes."""

    def __init__(self):
        self._cache: dict = {}

    def get(self, path: str, pid: int | None = None) -> FileInfo:
        candidates = [path]
        if pid:
            # the file as the process sees it (containers, chroots), then as we do
            candidates.insert(0, f"/proc/{pid}/root{path}")
        for candidate in candidates:
            try:
                st = os.stat(candidate)
            except OSError:
                continue
            key = (path, st.st_dev, st.st_ino, st.st_mtime_ns)
            info = self._cache.get(key)
            if info is None:
                info = self._read(path, candidate, st)
                self._cache[key] = info
            return info
        return FileInfo(path=path)

    @staticmethod
    def _read(path: str, candidate: str, st) -> FileInfo:
        from ..elf.reader import read_elf
        from ..model.errors import ELFError

        try:
            elf = read_elf(candidate)
        except (ELFError, OSError):
            return FileInfo(path=path, dev=st.st_dev, inode=st.st_ino)
        return FileInfo(path=path, dev=st.st_dev, inode=st.st_ino, soname=elf.soname,
                        needed=tuple(elf.needed), version_needs=tuple(elf.version_needs),
                        version_defs=tuple(elf.version_defs), is_elf=True)


def runtime_major(path: str, info: FileInfo) -> int | None:
    """The libcudart major: what the file declares (SONAME, version nodes) before its name;
    the check's rule for it (seedance.collect.cuda) when available."""
    try:
        from ..collect import cuda
    except ImportError:  # pragma: no cover - the check's collectors are part of the package
        cuda = None
    if cuda is not None:
        return cuda.runtime_major(path, info if info.is_elf else None)
    for name in (info.soname or "", *info.version_defs, os.path.basename(path)):
        match = re.match(r"^libcudart\.so\.(\d+)", name or "")
        if match:
            return int(match.group(1))
    return None


def is_cudart(path: str, info: FileInfo) -> bool:
    return any((n or "").startswith("libcudart.so") for n in (os.path.basename(path), info.soname))


@dataclass
class _Object:
    path: str
    base: int
    namespace: int
    info: FileInfo


@dataclass
class _Allocation:
    bytes: int
    device: int
    api: str
    library: str


@dataclass
class _Process:
    pid: int
    exe: str | None = None
    objects: dict = field(default_factory=dict)  # link_map address -> _Object
    runtimes: dict = field(default_factory=dict)  # libcudart path -> major
    reported_mixes: set = field(default_factory=set)
    allocations: dict = field(default_factory=dict)  # device pointer -> _Allocation
    pending_needed: list = field(default_factory=list)  # (requester path, namespace, name)
    dlopens: dict = field(default_factory=dict)  # tid -> [[event data, [link maps added]], ...]
    seeded: bool = False

    def library_at(self, address) -> str | None:
        """The object whose load address is the highest at or below ``address``."""
        if isinstance(address, str):
            address = int(address, 16)
        if not address:
            return None
        ranked = sorted((o.base, o.path or (self.exe or "")) for o in self.objects.values() if o.base)
        index = bisect_right([base for base, _ in ranked], address) - 1
        if index >= 0:
            return ranked[index][1] or self.exe
        return self.exe

    def find(self, namespace: int, name: str) -> _Object | None:
        for obj in self.objects.values():
            if obj.namespace != namespace or not obj.path:
                continue
            if os.path.basename(obj.path) == name or obj.info.soname == name:
                return obj
        return None


class LiveFacts:
    """Feed events in order; get the facts each one establishes."""

    def __init__(self, files: FileInfoCache | None = None):
        self.files = files or FileInfoCache()
        self.processes: dict = {}
        self._containers: dict = {}  # pid -> its container's subject (collect.container), or None

    def container_of(self, pid: int):
        """The container ``pid`` runs in (ContainerIdentity.subject()), None for a host
        process: read once per pid from its cgroup, which a process cannot leave for
        another container's (an exec keeps it)."""
        if pid not in self._containers:
            from ..collect import container  # lazy: the check's collectors

            identity = container.identify(pid)
            self._containers[pid] = identity.subject() if identity is not None else None
        return self._containers[pid]

    def _tag(self, pid: int, facts: list) -> list:
        """Facts about ``pid`` name its container, as the check's do (subject.container),
        so a finding of a traced container says which one to restart."""
        where = self.container_of(pid)
        if where is None:
            return facts
        return [Fact(f.kind, {**f.subject, "container": where}, f.data, f.source)
                if f.subject.get("pid") == pid and "container" not in f.subject else f for f in facts]

    def process(self, pid: int) -> _Process:
        proc = self.processes.get(pid)
        if proc is None:
            proc = self.processes[pid] = _Process(pid=pid)
        return proc

    def seed(self, pid: int) -> list:
        """A process that was running before the trace: its objects from /proc/PID/maps.
        Returns the facts they already establish (two runtimes mapped before we came)."""
        return self._tag(pid, self._seed(pid))

    def _seed(self, pid: int) -> list:
        proc = self.process(pid)
        if proc.seeded:
            return []
        proc.seeded = True
        try:
            proc.exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
            with open(f"/proc/{pid}/maps") as maps:
                lines = maps.read().splitlines()
        except OSError:
            return []
        seen = set()
        for line in lines:
            parts = line.split(None, 5)
            if len(parts) < 6 or parts[2].strip("0") or not parts[5].startswith("/"):
                continue  # file offset 0 mappings only: where each object starts
            path = parts[5].strip().removesuffix(" (deleted)")
            if path in seen:
                continue
            seen.add(path)
            base = int(parts[0].split("-")[0], 16)
            info = self.files.get(path, pid)
            if not info.is_elf:
                continue
            proc.objects[f"maps:{path}"] = _Object(path=path, base=base, namespace=0, info=info)
            if is_cudart(path, info):
                major = runtime_major(path, info)
                if major is not None:
                    proc.runtimes[path] = major
        return self._runtime_facts(proc)

    def feed(self, event: TraceEvent) -> list:
        where = self.container_of(event.pid)
        if where is not None:
            event.data.setdefault("container", where)  # the JSON event says where it ran
        handler = getattr(self, f"_on_{event.kind}", None)
        facts = self._tag(event.pid, handler(event)) if handler else []
        if event.kind == "exit":
            self._containers.pop(event.pid, None)  # the pid may be used again, elsewhere
        return facts

    # --- lifecycle -------------------------------------------------------------------
    def _on_exec(self, event: TraceEvent) -> list:
        # a process we know nothing of (its earlier events were lost) can still hold memory
        old = self.processes.pop(event.pid, None) or _Process(pid=event.pid)
        facts = self._leak_facts(old, "exec", event.data.get("held"))
        try:  # the kernel's absolute path, not the (maybe relative) name given to execve
            exe = os.readlink(f"/proc/{event.pid}/exe").removesuffix(" (deleted)")
        except OSError:
            exe = event.data.get("path")
        self.process(event.pid).exe = exe
        return facts

    def _on_exit(self, event: TraceEvent) -> list:
        proc = self.processes.pop(event.pid, None) or _Process(pid=event.pid)
        return self._leak_facts(proc, "exit", event.data.get("held"))

    # --- the link map ----------------------------------------------------------------
    def _on_object(self, event: TraceEvent) -> list:
        proc = self.process(event.pid)
        path = event.data.get("path") or ""
        namespace = event.data.get("namespace", 0)
        if path and not path.startswith("/"):
            return []  # linux-vdso.so.1: no file behind it
        if not path:
            path = proc.exe or ""  # the main program's link map has an empty name
            event.data["path"] = path
            event.data["main"] = True
        info = self.files.get(path, event.pid) if path else FileInfo(path="")
        event.data.setdefault("inode", info.inode)
        event.data.setdefault("soname", info.soname)
        obj = _Object(path=path, base=event.data.get("base", 0), namespace=namespace, info=info)
        proc.objects[event.data.get("link_map")] = obj
        for frames in proc.dlopens.get(event.tid, []):
            frames[1].append(event.data.get("link_map"))
        facts = []
        if path and info.needed:
            proc.pending_needed.extend((path, namespace, name) for name in info.needed)
        facts.extend(self._resolve_pending(proc))
        if path and is_cudart(path, info):
            major = runtime_major(path, info)
            if major is not None:
                proc.runtimes[path] = major
                facts.extend(self._runtime_facts(proc))
        return facts

    def _resolve_pending(self, proc: _Process) -> list:
        facts, still = [], []
        for requester, namespace, name in proc.pending_needed:
            provider = proc.find(namespace, name)
            if provider is None:
                still.append((requester, namespace, name))
                continue
            facts.append(self._needed_fact(proc, requester, name, provider.path, provider.info, "DT_NEEDED"))
        proc.pending_needed = still
        return facts

    def _needed_fact(self, proc, requester, name, observed, info: FileInfo, source) -> Fact:
        # The keys rules/loader.yaml reads (closure.py's needed facts):
        # same_library by the check's own comparison (a vendored hashed name is its plain
        # name), and context "" because a load seen live is the load in practice, not a
        # standalone view that needed-via-loader and its siblings correct.  Without them
        # the conditions read a missing attribute, which is no match (0 findings).
        from ..resolve.names import same_library  # lazy: the check's resolver package

        return Fact("needed", {"path": requester, "pid": proc.pid},
                    {"name": name, "resolved": True, "resolved_path": observed,
                     "has_soname": bool(info.soname), "soname": info.soname,
                     "same_library": same_library(name, info.soname or ""), "context": "",
                     "source": source, "tried": [], "search_order": [], "observed": True},
                    source=SOURCE)

    def _runtime_facts(self, proc: _Process) -> list:
        paths = frozenset(proc.runtimes)
        majors = sorted(set(proc.runtimes.values()))
        if len(majors) < 2 or paths in proc.reported_mixes:
            return []
        proc.reported_mixes.add(paths)
        return [Fact("cuda_runtimes", {"pid": proc.pid, "path": proc.exe or f"pid {proc.pid}"},
                     {"majors": majors, "paths": sorted(paths), "via": "trace (live link map)"},
                     source=SOURCE)]

    # --- dlopen ----------------------------------------------------------------------
    def _on_dlopen(self, event: TraceEvent) -> list:
        proc = self.process(event.pid)
        proc.dlopens.setdefault(event.tid, []).append([dict(event.data), []])
        return []

    def _on_dlopen_ret(self, event: TraceEvent) -> list:
        proc = self.process(event.pid)
        stack = proc.dlopens.get(event.tid) or []
        call, added = stack.pop() if stack else ({}, [])
        for frames in stack:  # an outer dlopen also owns what the inner one added
            frames[1].extend(added)
        if not event.data.get("ok"):
            # a failed dlopen unloads everything it mapped (elf/dl-open.c, _dl_close_worker)
            for link_map in added:
                gone = proc.objects.pop(link_map, None)
                if gone is not None and gone.path in proc.runtimes:
                    del proc.runtimes[gone.path]
            return []
        requested = event.data.get("path") or ""
        observed = event.data.get("loaded")
        if not requested or "/" in requested or not observed:
            return []  # a path is not searched; only a bare name can resolve to another file
        info = self.files.get(observed, event.pid)
        requester = proc.library_at(call.get("caller", 0)) or proc.exe or f"pid {proc.pid}"
        return [self._needed_fact(proc, requester, requested, observed, info, "dlopen")]

    # --- loader errors ---------------------------------------------------------------
    def _on_loader_error(self, event: TraceEvent) -> list:
        obj = event.data.get("object") or ""
        message = event.data.get("message") or ""
        context = event.data.get("context")
        loader_message = f"{obj}: {message}" if obj else message
        match = _VERSION_MISSING.match(message)
        if match:
            requester = match.group("requester")
            version = match.group("version")
            provider_info = self.files.get(obj, event.pid)
            requester_info = self.files.get(requester, event.pid)
            file = next((need.file for need in requester_info.version_needs
                         if any(name == version for name, _weak in need.versions)),
                        provider_info.soname or os.path.basename(obj))
            return [Fact("version_need", {"path": requester, "pid": event.pid},
                         {"file": file, "version": version, "weak": False, "provider": obj,
                          "defined": False, "provider_versions": list(provider_info.version_defs),
                          "loader_message": loader_message, "requester": requester,
                          "context": context, "observed": True},
                         source=SOURCE)]
        match = _UNDEFINED.match(message)
        if match and context != "dlsym":
            from ..collect.closure import NO_DEFINITION  # lazy: the check's collectors

            # a dlsym miss is an answer the caller asked for, not a failed load
            return [Fact("undefined_symbol", {"path": obj, "pid": event.pid},
                         # cause: which of the check's two undefined-symbol rules judges
                         # it; the live message does not say whether a provider defines
                         # the version node, so it is a plain missing definition
                         {"symbol": match.group("symbol"), "version": match.group("version"),
                          "provided": False, "closure_size": None, "cause": NO_DEFINITION,
                          "loader_message": loader_message, "requester": obj,
                          "context": context, "observed": True},
                         source=SOURCE)]
        return []

    # --- CUDA memory -----------------------------------------------------------------
    def _on_cuda_alloc(self, event: TraceEvent) -> list:
        proc = self.process(event.pid)
        library = (event.data.get("library")  # the shim names it (LD_AUDIT fallback)
                   or proc.library_at(event.data.get("caller", 0)) or proc.exe or "?")
        event.data["library"] = library
        proc.allocations[event.data["ptr"]] = _Allocation(
            bytes=int(event.data.get("bytes", 0)), device=int(event.data.get("device", -1)),
            api=event.data.get("api", ""), library=library)
        return []

    def _on_cuda_free(self, event: TraceEvent) -> list:
        proc = self.process(event.pid)
        proc.allocations.pop(event.data.get("ptr"), None)
        return []

    def _leak_facts(self, proc: _Process, when: str, held=None) -> list:
        """``held``: the kernel's account of what is still allocated (eBPF), which wins over
        the one kept from alloc/free events (lost events, or not streamed)."""
        if held is not None:
            allocations = [_Allocation(bytes=h["bytes"], device=h["device"], api=h["api"],
                                       library=proc.library_at(h["caller"]) or proc.exe or "?")
                           for h in held]
        else:
            allocations = list(proc.allocations.values())
        groups: dict = {}
        for alloc in allocations:
            group = groups.setdefault((alloc.device, alloc.library), {"bytes": 0, "count": 0, "apis": set()})
            group["bytes"] += alloc.bytes
            group["count"] += 1
            group["apis"].add(alloc.api)
        facts = []
        for (device, library), group in sorted(groups.items(), key=lambda item: str(item[0])):
            exe = proc.exe or f"pid {proc.pid}"
            facts.append(Fact(LEAK_KIND, {"pid": proc.pid, "path": exe},
                              {"pid": proc.pid, "exe": exe, "bytes": group["bytes"],
                               "device": device,  # -1: the thread had no known current context
                               "library": library, "allocations": group["count"],
                               "api": ",".join(sorted(group["apis"])),
                               "exit": "exited" if when == "exit" else when, "via": "trace"},
                              source=SOURCE))
        return facts

    def live_pids(self) -> list:
        return [pid for pid in self.processes if os.path.exists(f"/proc/{pid}")]


def mapped_lib_facts(pids) -> list:
    """lib-deleted for live processes: the check's /proc collector, unchanged."""
    try:
        from ..collect import process as proc_collect
    except ImportError:  # pragma: no cover
        return []
    facts = []
    for pid in pids:
        try:
            facts.extend(proc_collect.mapped_lib_facts(proc_collect.read_process(pid)))
        except (proc_collect.ProcessGone, OSError):
            continue
    return facts
