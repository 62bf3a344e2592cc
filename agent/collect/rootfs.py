"""Paths resolved inside a root that is not ours: a container's, a chroot's, an unpacked image.

seedance runs as root and reads other roots' files: /proc/PID/root of a container, an image
unpacked in a directory.  A plain ``open(root + path)`` lets the kernel walk ``path`` from
*our* root: an absolute symlink planted in the container (``/etc/ld.so.conf ->
/etc/shadow``, ``libfoo.so -> /root/.ssh/id_rsa``) is then followed on the host, and ``..``
climbs out of the root.  Everything here resolves the way the process inside the root
would see the path: an absolute symlink starts again at the root, ``..`` at the root stays
at the root, and at most MAX_LINK_HOPS symlinks are followed (the kernel's ELOOP limit,
include/linux/namei.h MAXSYMLINKS).

How: openat2(2) with RESOLVE_IN_ROOT (Linux 5.6+) asks the kernel to do exactly that
(plus RESOLVE_NO_MAGICLINKS: a /proc/PID/root or /proc/self/fd link met inside the root
must not lead back out of it).  Where openat2 is missing (an older kernel, or a seccomp
filter that answers ENOSYS/EPERM) the same walk is made here, one component at a time,
each opened O_PATH|O_NOFOLLOW relative to the directory fd before it, so a component
swapped for a symlink mid-walk gives ELOOP, never an escape.

API (``root`` is a path such as ``/proc/1234/root`` or ``/srv/image``, an open directory
fd, or a Root; paths are as the root's own processes write them, ``/usr/lib/libc.so.6``):

    Root(root)                     an open handle on the root (a context manager); the
                                   functions below are also its methods, without ``root``
    open(root, path, flags=O_RDONLY, follow=True) -> fd   (the caller closes it)
    read(root, path, limit=READ_CAP) -> bytes      OSError(EFBIG) past ``limit`` bytes
    stat(root, path, follow=True) -> os.stat_result
    exists(root, path) -> bool
    listdir(root, path, limit=LIST_CAP) -> [names]  OSError(E2BIG) past ``limit`` entries
    readlink(root, path) -> str                     the link's text, unresolved
    realpath(root, path, strict=False) -> str       the canonical path inside the root
    host_path(root, path) -> str                    root path + realpath: a path a tool that
                                                    only takes paths can be given (it holds
                                                    no symlink when resolved; a container
                                                    that swaps a component afterwards wins
                                                    the race: prefer open/read)

Errors are the OSError the walk met (ENOENT, ENOTDIR, ELOOP, EACCES), with the path as the
root's processes spell it.
"""
from __future__ import annotations

import errno
import os
import stat as _stat

MAX_LINK_HOPS = 40  # include/linux/namei.h MAXSYMLINKS: the kernel's ELOOP after 40 links
READ_CAP = 16 << 20  # read(): an ld.so.conf, environ or maps larger than this is not honest
LIST_CAP = 100_000  # listdir(): names per directory

# A path every open fails on with ENOENT (a fd number is never negative), for a caller that
# must hand a path to a tool when the name did not resolve inside the root: never a host file
NOWHERE = "/proc/self/fd/-1"

_SYS_OPENAT2 = 437  # the same number on every architecture (the unified table from 5.1)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10

_openat2 = None  # the libc syscall() wrapper, once found; False when openat2 is unusable


def _syscall():
    global _openat2
    if _openat2 is None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            func = libc.syscall
            func.restype = ctypes.c_long

            class OpenHow(ctypes.Structure):  # include/uapi/linux/openat2.h struct open_how
                _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                            ("resolve", ctypes.c_uint64)]

            _openat2 = (ctypes, func, OpenHow)
        except (OSError, AttributeError):
            _openat2 = False
    return _openat2


def _kernel_open(dirfd: int, path: str, flags: int):
    """openat2(dirfd, path, RESOLVE_IN_ROOT); None when this kernel cannot do it (the walk
    below does it instead)."""
    global _openat2
    found = _syscall()
    if not found:
        return None
    ctypes, func, OpenHow = found
    how = OpenHow(flags | os.O_CLOEXEC, 0, _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS)
    raw = os.fsencode(path)
    for _ in range(3):  # EAGAIN: a rename raced the walk; the kernel asks to try again
        fd = func(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dirfd), ctypes.c_char_p(raw),
                  ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err == errno.EAGAIN:
            continue
        if err in (errno.ENOSYS, errno.EPERM, errno.E2BIG):
            _openat2 = False  # not this kernel, or a seccomp filter: walk by hand from now on
            return None
        raise OSError(err, os.strerror(err), path)
    return None


class Root:
    """An open directory fd standing for a root; closes it unless it was given as an fd."""

    def __init__(self, root):
        if isinstance(root, Root):
            self.fd, self.path, self._own = root.fd, root.path, False
        elif isinstance(root, int):
            self.fd, self.path, self._own = root, f"/proc/self/fd/{root}", False
        else:
            # the root itself is trusted as given: /proc/PID/root is a link the kernel must follow
            self.fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            self.path, self._own = os.fspath(root), True

    def close(self) -> None:
        if self._own and self.fd >= 0:
            os.close(self.fd)
        self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- the walk ----------------------------------------------------------------------
    def _walk(self, path: str, follow: bool):
        """(parent fd, last name, canonical parts of the parent) for ``path``, each directory
        entered by fd; the parent fd is the caller's to close (or self.fd, which it must not)."""
        parts = [p for p in path.split("/") if p and p != "."]
        stack: list = []  # (fd, name) of each directory entered below the root
        hops = 0
        try:
            while parts:
                name = parts.pop(0)
                here = stack[-1][0] if stack else self.fd
                if name == "..":
                    if stack:  # ".." at the root is the root, as for a chrooted process
                        os.close(stack.pop()[0])
                    continue
                try:
                    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=here)
                except FileNotFoundError as exc:
                    if parts:
                        # where the walk stopped, links followed: realpath's missing tail
                        exc.resolved = [n for _f, n in stack] + [name] + parts
                        raise
                    return self._parent(stack), name, [n for _f, n in stack]
                st = os.fstat(fd)
                if _stat.S_ISLNK(st.st_mode) and (parts or follow):
                    os.close(fd)
                    hops += 1
                    if hops > MAX_LINK_HOPS:
                        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                    target = os.readlink(name, dir_fd=here)
                    if target.startswith("/"):  # an absolute link starts again at this root
                        while stack:
                            os.close(stack.pop()[0])
                    parts[:0] = [p for p in target.split("/") if p and p != "."]
                    continue
                if not parts:
                    os.close(fd)
                    return self._parent(stack), name, [n for _f, n in stack]
                if not _stat.S_ISDIR(st.st_mode):
                    os.close(fd)
                    raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
                stack.append((fd, name))
            return self._parent(stack), ".", [n for _f, n in stack]  # the path names a directory
        finally:
            for fd, _name in stack:
                os.close(fd)

    def _parent(self, stack: list) -> int:
        """A fd of the innermost directory entered (a dup: _walk closes its own)."""
        return os.dup(stack[-1][0]) if stack else self.fd

    # --- the API -------------------------------------------------------------------------
    def open(self, path: str, flags: int = os.O_RDONLY, follow: bool = True) -> int:
        if follow and not flags & os.O_NOFOLLOW:
            fd = _kernel_open(self.fd, path, flags)
            if fd is not None:
                return fd
        parent, name, _parts = self._walk(path, follow)
        try:
            # O_NOFOLLOW: the walk left no link to follow; one that appeared since is refused
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, path) from None
        finally:
            if parent != self.fd:
                os.close(parent)

    def read(self, path: str, limit: int = READ_CAP) -> bytes:
        fd = self.open(path, os.O_RDONLY)
        try:
            if _stat.S_ISDIR(os.fstat(fd).st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
            chunks, size = [], 0
            while True:
                chunk = os.read(fd, min(1 << 20, limit + 1 - size))
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:
                    raise OSError(errno.EFBIG, f"larger than {limit} bytes", path)
        finally:
            os.close(fd)

    def stat(self, path: str, follow: bool = True) -> os.stat_result:
        fd = self.open(path, os.O_PATH, follow=follow)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
        except (OSError, ValueError):
            return False
        return True

    def listdir(self, path: str, limit: int = LIST_CAP) -> list:
        fd = self.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            names = []
            with os.scandir(fd) as entries:
                for entry in entries:
                    names.append(entry.name)
                    if len(names) > limit:
                        raise OSError(errno.E2BIG, f"more than {limit} entries", path)
            return names
        finally:
            os.close(fd)

    def readlink(self, path: str) -> str:
        parent, name, _parts = self._walk(path, follow=False)
        try:
            return os.readlink(name, dir_fd=parent)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, path) from None
        finally:
            if parent != self.fd:
                os.close(parent)

    def realpath(self, path: str, strict: bool = False) -> str:
        """The canonical path inside the root; a missing tail is kept as written (as
        ``realpath -m``) unless ``strict``, where it is ENOENT."""
        try:
            parent, name, parts = self._walk(path, follow=True)
        except FileNotFoundError as exc:
            if strict:
                raise
            # the links met before the missing name are resolved, not kept as written:
            # `libx.so -> /opt/gone/libx.so` gives /opt/gone/libx.so, which names nothing
            # under the root, where /libx.so under it would be followed to a host file
            resolved = getattr(exc, "resolved", None)
            return "/" + "/".join(resolved) if resolved is not None else _lexical(path)
        if parent != self.fd:
            os.close(parent)
        if strict and name != ".":
            self.stat("/" + "/".join(parts + [name]), follow=False)
        return "/" + "/".join(parts + ([name] if name != "." else []))

    def host_path(self, path: str) -> str:
        return self.path.rstrip("/") + self.realpath(path)


def _lexical(path: str) -> str:
    out: list = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if out:
                out.pop()
            continue
        out.append(part)
    return "/" + "/".join(out)


def _with_root(method: str):
    def call(root, path, *args, **kwargs):
        handle = Root(root)
        try:
            return getattr(handle, method)(path, *args, **kwargs)
        finally:
            handle.close()
    call.__name__ = method
    call.__doc__ = f"Root(root).{method}(path, ...): see the module's docstring."
    return call


open = _with_root("open")  # noqa: A001 - the module's verbs mirror os's
read = _with_root("read")
stat = _with_root("stat")
exists = _with_root("exists")
listdir = _with_root("listdir")
readlink = _with_root("readlink")
realpath = _with_root("realpath")
host_path = _with_root("host_path")


def kernel_resolves() -> bool:
    """True when openat2(RESOLVE_IN_ROOT) serves open() on this kernel (else the walk)."""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        got = _kernel_open(fd, "/", os.O_PATH)
    except OSError:
        got = None
    finally:
        os.close(fd)
    if got is None:
        return False
    os.close(got)
    return True
