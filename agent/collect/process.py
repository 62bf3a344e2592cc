"""What a running process really loaded: /proc/PID/maps, environ, exe and root.

Only /proc is read; nothing is attached to or signalled.  A process can exit at any point
while we read it: that is a normal event (ProcessGone), not an error.
"""
from __future__ import annotations

import os

from ..elf.reader import read_elf
from ..model.errors import ELFError
from ..model.report import Fact
from ..model.record import NEW, Record
from . import config, cuda

DELETED = " (deleted)"


class ProcessGone(Exception):
    """The process exited (or its /proc entry became unreadable) while we read it."""


class Mapping(Record):
    """One file a process maps."""
    _fields = ("path", "inode", "dev", "range", "deleted")

    def __init__(self, path: str, inode: int, dev: str, range: str, deleted: bool):
        self.path = path
        self.inode = inode
        self.dev = dev  # "maj:min" in hex, as maps prints it
        self.range = range  # "start-end", the name of its /proc/PID/map_files entry
        self.deleted = deleted


class ProcessView(Record):
    """What /proc says of one process."""
    _fields = ("pid", "exe", "root", "environ", "mappings")

    def __init__(self, pid: int, exe: str | None, root: str, environ: dict = NEW, mappings: list = NEW):
        self.pid = pid
        self.exe = exe
        self.root = root
        self.environ = {} if environ is NEW else environ
        self.mappings = [] if mappings is NEW else mappings  # one Mapping per distinct file

    def host_path(self, path: str) -> str:
        """The path as seen from here, through the process's root (containers, chroots)."""
        if self.root in ("", "/"):
            return path
        return f"/proc/{self.pid}/root{path}"


def _proc(pid: int, name: str) -> str:
    return f"/proc/{pid}/{name}"


def read_process(pid: int) -> ProcessView:
    """Read one process; ProcessGone if it vanished, PermissionError if it is not ours."""
    try:
        with open(_proc(pid, "maps"), "rb") as handle:
            maps = handle.read()
        try:
            exe = os.readlink(_proc(pid, "exe"))
        except (PermissionError, FileNotFoundError):
            exe = None  # kernel threads have no exe
        try:
            root = os.readlink(_proc(pid, "root"))
        except PermissionError:
            root = "/"
        environ = {}
        try:
            with open(_proc(pid, "environ"), "rb") as handle:
                for item in handle.read().split(b"\0"):
                    key, sep, value = item.partition(b"=")
                    if sep:
                        environ[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        except PermissionError:
            pass
        except ProcessLookupError:
            # a kernel thread has no mm: no maps, no exe, and reading environ gives ESRCH
            # although it runs (read as "vanished", 57 of them made every host check here
            # say 57 processes had exited).  An exited process (a zombie) looks the same, so
            # the kernel's own flag decides.
            if maps or exe is not None or not is_kernel_thread(pid):
                raise
    except (FileNotFoundError, ProcessLookupError):
        raise ProcessGone(pid) from None
    except OSError as exc:
        if exc.errno == 3:  # ESRCH: exited between open and read
            raise ProcessGone(pid) from None
        raise
    if exe and exe.endswith(DELETED):
        exe = exe[: -len(DELETED)]
    return ProcessView(pid=pid, exe=exe, root=root, environ=environ, mappings=parse_maps(maps))


PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread


def is_kernel_thread(pid: int) -> bool:
    """PF_KTHREAD in /proc/PID/stat's flags (field 9; the name in field 2 may hold spaces
    and parentheses, so the fields are counted after its last ')')."""
    try:
        with open(_proc(pid, "stat"), "rb") as handle:
            fields = handle.read().rpartition(b")")[2].split()
        return bool(int(fields[6]) & PF_KTHREAD)
    except (OSError, IndexError, ValueError):
        return False


def parse_maps(raw: bytes) -> list:
    """Distinct file-backed mappings, in first-mapped order."""
    seen: dict = {}
    for line in raw.decode("utf-8", "surrogateescape").splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        addr, _perms, _offset, dev, inode, path = parts
        if not path.startswith("/") or inode == "0":
            continue
        deleted = path.endswith(DELETED)
        if deleted:
            path = path[: -len(DELETED)]
        if path.startswith(("/dev/", "/memfd:", "/SYSV")):
            continue
        if path not in seen:
            seen[path] = Mapping(path=path, inode=int(inode), dev=dev, range=addr, deleted=deleted)
    return list(seen.values())


def is_library(path: str) -> bool:
    base = os.path.basename(path)
    return ".so" in base


def mapped_lib_facts(view: ProcessView) -> list:
    """A fact per mapped shared object (and the executable): deleted, replaced or ok."""
    facts = []
    for mapping in view.mappings:
        if not (is_library(mapping.path) or mapping.path == view.exe):
            continue
        state, disk_inode = _disk_state(view, mapping)
        facts.append(Fact("mapped_lib", {"pid": view.pid, "path": mapping.path},
                          {"deleted": state == "deleted", "replaced": state == "replaced",
                           "state": state, "mapped_inode": mapping.inode, "disk_inode": disk_inode,
                           "exe": view.exe},
                          source="collect.process"))
    return facts


def _disk_state(view: ProcessView, mapping: Mapping) -> tuple:
    # The kernel marks a mapping "(deleted)" once its inode is unlinked; when a file is
    # back under the same name, the library was replaced (an upgrade renames a new file
    # over the old one), otherwise it is gone.
    try:
        on_disk = os.stat(view.host_path(mapping.path))
    except FileNotFoundError:
        return "deleted", None
    except OSError:
        return ("deleted" if mapping.deleted else "unknown"), None
    if mapping.deleted:
        return "replaced", on_disk.st_ino
    # Compare like with like: stat through map_files gives the mapped file as this kernel
    # view sees it (overlayfs reports other inode numbers in maps than stat does).
    try:
        mapped = os.stat(f"/proc/{view.pid}/map_files/{mapping.range}")
        same = (mapped.st_dev, mapped.st_ino) == (on_disk.st_dev, on_disk.st_ino)
    except OSError:
        same = on_disk.st_ino == mapping.inode
    return ("ok" if same else "replaced"), on_disk.st_ino


def runtime_facts(view: ProcessView) -> list:
    """cuda_runtimes for the process: every libcudart it maps, by major."""
    runtimes = {}
    for mapping in view.mappings:
        if not os.path.basename(mapping.path).startswith("libcudart.so"):
            continue
        info = None
        for candidate in (f"/proc/{view.pid}/map_files/{mapping.range}", view.host_path(mapping.path)):
            try:
                info = read_elf(candidate)
                break
            except ELFError:
                continue
        major = cuda.runtime_major(mapping.path, info)
        if major is not None:
            runtimes[mapping.path] = major
    if not runtimes:
        return []
    return [Fact("cuda_runtimes", {"pid": view.pid, "path": view.exe or f"pid {view.pid}"},
                 {"majors": sorted(set(runtimes.values())), "paths": sorted(runtimes),
                  "via": "process"},
                 source="collect.process")]


def preload_facts(view: ProcessView) -> list:
    """config_env facts for the LD_PRELOAD a process was started with (its environ).

    Expansion already happened when it started, so only the paths are judged: a preload
    that is missing, or that group/others can write (code injected into this process).
    """
    value = view.environ.get("LD_PRELOAD", "")
    if not value.strip():
        return []
    missing, writable = [], []
    for item in value.replace(":", " ").split():
        if "/" not in item:
            continue
        path = view.host_path(item)
        if not os.path.exists(path):
            missing.append(item)
            continue
        why = config.writable_by_others(path)
        if why:
            writable.append(why)
    problems = [f"preload {m} does not exist" for m in missing]
    problems += [f"preload from an unsafe path: {w}" for w in writable]
    return [Fact("config_env", {"pid": view.pid, "path": view.exe or f"/proc/{view.pid}"},
                 {"key": "LD_PRELOAD", "value": value, "problem": "; ".join(problems), "line": None,
                  "expands_early": False, "variables": [], "preload_missing": bool(missing),
                  "preload_writable": bool(writable), "use": "preload"},
                 source="collect.process")]


def all_pids() -> list:
    return sorted(int(name) for name in os.listdir("/proc") if name.isdigit())
