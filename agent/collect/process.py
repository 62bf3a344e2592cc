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
    """What /proc says of one process.

    A process in a container (another mount namespace) or a chroot sees its own root: its
    maps, exe and environ name files inside that root.  ``foreign`` says so; ``in_root``
    turns a path /proc printed into the name the process itself uses, and ``root_dir`` is
    the directory (/proc/PID/root) that such names are resolved in, never the host's /."""
    _fields = ("pid", "exe", "root", "environ", "mappings", "foreign", "container", "comm", "root_key")

    def __init__(self, pid: int, exe: str | None, root: str, environ: dict = NEW, mappings: list = NEW,
                 foreign: bool = False, container=None, comm: str = "", root_key: tuple | None = None):
        self.pid = pid
        self.exe = exe
        self.root = root
        self.environ = {} if environ is NEW else environ
        self.mappings = [] if mappings is NEW else mappings  # one Mapping per distinct file
        self.foreign = foreign  # another root or mount namespace than ours
        self.container = container  # container.ContainerIdentity, or None
        self.comm = comm
        # (mount namespace inode, root dev, root inode): the container's files as one unit,
        # shared by every process of that container (see root_views)
        self.root_key = root_key

    @property
    def root_dir(self) -> str:
        return f"/proc/{self.pid}/root" if self.foreign else "/"

    def in_root(self, path: str) -> str:
        """The path as the process names it.  The kernel prints maps and exe relative to the
        reader's root where the file is reachable from it: a chroot at /srv/c in our mount
        namespace shows /srv/c/lib/libc.so.6, which the process calls /lib/libc.so.6.  A
        container in its own mount namespace is printed from its own root already."""
        prefix = self.root.rstrip("/")
        if prefix and path.startswith(prefix + "/"):
            return path[len(prefix):]
        if prefix and path == prefix:  # the root itself (a cwd at the chroot's top)
            return "/"
        return path

    def host_path(self, path: str) -> str:
        """A host path for ``path`` (as /proc printed it), resolved inside the process's root:
        a symlink in a container never leads to a host file."""
        if not self.foreign:
            return path
        from . import rootfs
        try:
            return rootfs.host_path(self.root_dir, self.in_root(path))
        except OSError:
            # a link loop or a file as a directory inside the root: nothing opens there, and
            # the root + name would have the host kernel follow the container's links
            return rootfs.NOWHERE + self.in_root(path)

    def where(self) -> str:
        """' in podman container 415b9f57acdc (web)', or '' for a host process."""
        if self.container is not None:
            return " in " + self.container.short()
        if self.root not in ("", "/"):
            return f" chrooted in {self.root}"
        return ""


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
        root_known = True
        try:
            root = os.readlink(_proc(pid, "root"))
        except PermissionError:
            # not ours to trace (no CAP_SYS_PTRACE): where its files are cannot be known
            root, root_known = "/", False
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
    mnt_ns = _mount_ns(pid)
    # A process whose root or mount namespace we may not read is placed nowhere, not on our
    # root: seedance in a container (a DaemonSet) sees another root than the host's, and a
    # library judged by our files would be "replaced" when it is only out of sight.  Its
    # root then cannot be opened, and its mappings' states are "unknown".
    foreign = (not root_known or root not in ("", "/")
               or (mnt_ns is None and _own_mount_ns() is not None and str(pid) != "self")
               or (mnt_ns is not None and mnt_ns != _own_mount_ns()))
    identity, key = None, None
    if foreign:
        key = _root_key(pid, mnt_ns)
        identity = _VIEWS.identity(key, pid)
        foreign = True
    elif exe is not None:
        # a host process may still be the engine's monitor of a container (conmon)
        from . import container
        identity = container.identify(pid)
        foreign = identity is not None and not identity.monitor
        if foreign:
            key = _root_key(pid, mnt_ns)
    return ProcessView(pid=pid, exe=exe, root=root, environ=environ, mappings=parse_maps(maps),
                       foreign=foreign, container=identity, comm=_comm(pid), root_key=key)


_OWN_MNT_NS: list = []


def _own_mount_ns():
    if not _OWN_MNT_NS:
        _OWN_MNT_NS.append(_mount_ns("self"))
    return _OWN_MNT_NS[0]


def _mount_ns(pid):
    """The inode of ``pid``'s mount namespace; None when unreadable (then it counts as ours,
    as before namespaces were looked at)."""
    try:
        return os.stat(_proc(pid, "ns/mnt")).st_ino
    except OSError:
        return None


def _root_key(pid: int, mnt_ns):
    """(mount namespace, root's dev, root's inode) of ``pid``: two processes with the same
    key see the same files under the same names (a container's processes, a podman exec
    into it); None when the root cannot be read."""
    try:
        st = os.stat(_proc(pid, "root"))
    except OSError:
        return None
    return (mnt_ns, st.st_dev, st.st_ino)


class RootViews:
    """What is the same for every process of one container, read once per command: the
    container's identity (its cgroup names it), an open handle on its root, and the loader
    model of its files (a Resolver, which parses its ld.so.cache once).  Keyed by
    ProcessView.root_key, so a node with many containers costs one of each per container,
    not per process.  A handle stays valid after the process it was opened through exits:
    it holds the root directory itself, in that mount namespace."""

    CAP = 4096  # containers remembered; past it the oldest are dropped (their fds closed)

    def __init__(self):
        self._identity: dict = {}
        self._roots: dict = {}
        self._resolvers: dict = {}

    def identity(self, key, pid: int):
        from . import container
        if key is None:
            return container.identify(pid)
        if key not in self._identity:
            self._bound(self._identity)
            self._identity[key] = container.identify(pid)
        return self._identity[key]

    def root(self, view: ProcessView):
        """A rootfs.Root on the view's root (shared: callers never close it); False when it
        cannot be opened (the process is gone, or not ours to read)."""
        from . import rootfs
        key = view.root_key
        found = self._roots.get(key) if key is not None else None
        if found is not None:
            return found
        try:
            # an fd of its own, so the handle outlives the process it was reached through
            opened = rootfs.Root(view.root_dir)
        except OSError:
            return False
        if key is None:
            return opened  # the caller's to close (not shared)
        if len(self._roots) >= self.CAP:
            oldest = next(iter(self._roots))
            self._roots.pop(oldest).close()
            self._resolvers = {k: v for k, v in self._resolvers.items() if k[0] != oldest}
        self._roots[key] = opened
        return opened

    def shared(self, root) -> bool:
        return any(root is held for held in self._roots.values())

    def resolver(self, view: ProcessView):
        """The loader model of the process's root with its own LD_LIBRARY_PATH and
        LD_PRELOAD (environ): what its ld.so reads, inside its root."""
        from ..resolve import Resolver
        env = {k: v for k, v in view.environ.items() if k in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
        if not view.foreign:
            return Resolver(env=env)
        root = self.root(view)
        if root is False or view.root_key is None:
            return Resolver(env=env, root=view.root_dir)
        key = (view.root_key, tuple(sorted(env.items())))
        found = self._resolvers.get(key)
        if found is None:
            # the root by our own fd: the same path for every process of the container, so
            # its ld.so.cache is parsed once and its files stat'ed once
            found = self._resolvers[key] = Resolver(env=env, root=f"/proc/self/fd/{root.fd}")
        return found

    def _bound(self, table: dict) -> None:
        if len(table) >= self.CAP:
            table.pop(next(iter(table)))


_VIEWS = RootViews()


def root_views() -> RootViews:
    """The per-container views of this command (one per process of seedance)."""
    return _VIEWS


def _comm(pid: int) -> str:
    try:
        with open(_proc(pid, "comm"), "rb") as handle:
            return handle.read(64).decode("utf-8", "replace").strip()
    except OSError:
        return ""


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
    """A fact per mapped shared object (and the executable): deleted, replaced or ok,
    judged inside the process's own root."""
    facts = []
    subject_extra = _where(view)
    restart = restart_hint(view)
    root = None
    try:
        for mapping in view.mappings:
            if not (is_library(mapping.path) or mapping.path == view.exe):
                continue
            if root is None:
                root = _open_root(view)
            state, disk_inode = _disk_state(view, mapping, root)
            facts.append(Fact("mapped_lib", {"pid": view.pid, "path": mapping.path, **subject_extra},
                              {"deleted": state == "deleted", "replaced": state == "replaced",
                               "state": state, "mapped_inode": mapping.inode, "disk_inode": disk_inode,
                               "exe": view.exe, "where": view.where(), "restart": restart},
                              source="collect.process"))
    finally:
        if root is not None and root is not False and not _VIEWS.shared(root):
            root.close()
    return facts


def _where(view: ProcessView) -> dict:
    """What a fact's subject adds for a process in a container: which one."""
    return {"container": view.container.subject()} if view.container is not None else {}


def restart_hint(view: ProcessView) -> str:
    """The restart that makes this process map the files on disk: its container's or pod's
    where it has one, the seedance agent only where the process is the agent itself."""
    if view.container is not None:
        return view.container.restart()
    argv = _cmdline(view.pid)
    if any(os.path.basename(a) == "seedance" for a in argv[:3]) and "agent" in argv:
        return "systemctl --user restart seedance-agent"
    comm = view.comm or os.path.basename(view.exe or "") or "?"
    return f"restart pid {view.pid} ({comm})"


def _cmdline(pid: int) -> list:
    try:
        with open(_proc(pid, "cmdline"), "rb") as handle:
            return [a.decode("utf-8", "replace") for a in handle.read(4096).split(b"\0") if a]
    except OSError:
        return []


def _open_root(view: ProcessView):
    """A rootfs.Root on the process's root, False when it cannot be opened (gone, or not ours)."""
    return _VIEWS.root(view)


def _disk_state(view: ProcessView, mapping: Mapping, root) -> tuple:
    # The kernel marks a mapping "(deleted)" once its inode is unlinked: only then is a file
    # gone, or replaced when a file is back under the same name (an upgrade renames a new file
    # over the old one).  The name is looked up where the process looks it up, in its own root,
    # so a container's or chroot's files are never judged by the host's.
    name = view.in_root(mapping.path)
    on_disk = None
    if root:
        try:
            on_disk = root.stat(name)
        except FileNotFoundError:
            on_disk = None
        except OSError:
            return ("deleted" if mapping.deleted else "unknown"), None
    elif root is False:
        return ("deleted" if mapping.deleted else "unknown"), None
    try:
        # the mapped file itself, as this kernel view sees it: overlayfs reports other inode
        # numbers in maps than a stat of its path does
        mapped = os.stat(f"/proc/{view.pid}/map_files/{mapping.range}")
        mapped_id = (mapped.st_dev, mapped.st_ino)
    except OSError:
        mapped_id = None
    if on_disk is None:
        if mapping.deleted:
            return "deleted", None
        # the name is missing in its root although the kernel says the mapped file still has
        # a link: a path we cannot place (a lazily unmounted or bind-hidden file), not a deletion
        return "unknown", None
    if mapped_id is not None:
        same = mapped_id == (on_disk.st_dev, on_disk.st_ino)
    else:
        same = not mapping.deleted and on_disk.st_ino == mapping.inode
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
    return [Fact("cuda_runtimes", {"pid": view.pid, "path": view.exe or f"pid {view.pid}", **_where(view)},
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
        # the process names its preloads inside its own root
        path = view.host_path(item) if view.foreign else item
        if not (_exists_in_root(view, item) if view.foreign else os.path.exists(path)):
            missing.append(item)
            continue
        why = config.writable_by_others(path)
        if why:
            writable.append(why)
    problems = [f"preload {m} does not exist" for m in missing]
    problems += [f"preload from an unsafe path: {w}" for w in writable]
    return [Fact("config_env", {"pid": view.pid, "path": view.exe or f"/proc/{view.pid}", **_where(view)},
                 {"key": "LD_PRELOAD", "value": value, "problem": "; ".join(problems), "line": None,
                  "expands_early": False, "variables": [], "preload_missing": bool(missing),
                  "preload_writable": bool(writable), "use": "preload"},
                 source="collect.process")]


def _exists_in_root(view: ProcessView, path: str) -> bool:
    root = _VIEWS.root(view)
    if root is False:
        return False
    try:
        return root.exists(path)
    finally:
        if not _VIEWS.shared(root):
            root.close()


def all_pids() -> list:
    return sorted(int(name) for name in os.listdir("/proc") if name.isdigit())
