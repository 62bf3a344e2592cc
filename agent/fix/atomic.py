"""Durable file replacement and the pre-flight checks every fixer runs before touching a file.

The order is the classic one (write a temp file in the same directory, fsync it, rename it
over the target, fsync the directory) because rename(2) within one filesystem is atomic:
after a crash the path holds either the old bytes or the new ones, never a mix.  The temp
file lives in the target's directory so the rename never crosses a filesystem.

Crash injection: SEEDANCE_FIX_CRASH_AT=<step> makes the fixer SIGKILL itself when it
reaches that step; the crash-safety tests use it to stop the fixer at every step.
"""
from __future__ import annotations

import hashlib
import os
import stat

from ..model.errors import BadInput
from ..model.record import NEW, Record

CRASH_ENV = "SEEDANCE_FIX_CRASH_AT"
TEMP_TAG = ".seedance-tmp"


def crash_point(step: str) -> None:
    """Die here, without cleanup, when the crash-safety tests ask for this step."""
    if os.environ.get(CRASH_ENV) == step:
        import signal  # here only: a fix that is not crash-tested never needs it

        os.kill(os.getpid(), signal.SIGKILL)


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fsync_dir(path: str) -> None:
    """fsync a directory so a rename or unlink inside it survives a power cut."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_path_for(target: str, tag: str = "") -> str:
    """A deterministic temp name beside ``target``, so recovery can find and remove it."""
    directory, base = os.path.split(os.path.abspath(target))
    return os.path.join(directory, f".{base}{TEMP_TAG}{('-' + tag) if tag else ''}")


def file_identity(st: os.stat_result) -> tuple:
    """What says "the same file as when an edit was planned from it": inode, size, mtime."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def write_temp(data, temp: str, mode: int = 0o644, owner: tuple | None = None,
               crash: bool = False, sync: bool = True, result: bool = False):
    """Write ``data`` to ``temp`` with ``mode`` and ``owner`` (uid, gid) set, then fsync it.

    ``data`` is bytes, or a callable ``fill(fd)`` that writes the content itself (a patched
    copy of a large library).  Returns ``temp``; with ``result=True``, what fill returned
    (None for bytes): a fill may hash what it writes, so nobody reads the file again.

    Mode and owner are set before the rename so the target never appears, even for an
    instant, with looser permissions than it had.  ``crash`` arms the injection points:
    only a target rewrite has them, never the journal's own bookkeeping.
    """
    if os.path.lexists(temp):
        os.unlink(temp)  # a leftover of a crashed run; recovery would remove it too
    # O_RDWR: a fill may read back what it wrote to hash it (dynedit.FileEdit.fill)
    fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        filled = None
        if callable(data):
            filled = data(fd)
        else:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        if crash:
            crash_point("after-temp-write")
        if owner is not None and (os.geteuid() == 0 or owner[0] == os.geteuid()):
            try:
                os.fchown(fd, owner[0], owner[1])
            except PermissionError:
                pass  # not root and not in the owner's group: the mode is still copied
        os.fchmod(fd, stat.S_IMODE(mode))
        if sync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(temp)
        raise
    os.close(fd)
    if crash and sync:
        crash_point("after-fsync")
    return filled if result else temp


class BackgroundSync:
    """fsync a file (or a directory) in a thread (the GIL is released while the kernel writes it back), so the
    writeback of a large temp overlaps its verification instead of preceding it.  join()
    returns once the bytes are durable, and raises what fsync raised."""

    def __init__(self, path: str):
        import threading

        self.error = None
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            os.fsync(self._fd)
        except OSError as exc:
            self.error = exc
        finally:
            os.close(self._fd)

    def join(self) -> None:
        self._thread.join()
        if self.error is not None:
            raise self.error

    def join_quietly(self) -> None:
        """Wait for it on a path that already fails for another reason."""
        self._thread.join()


def replace(temp: str, target: str, crash: bool = False, sync: bool = True) -> None:
    """Atomically put ``temp`` at ``target`` and make the rename durable."""
    os.rename(temp, target)
    if crash:
        crash_point("after-rename")
    if sync:
        fsync_dir(os.path.dirname(os.path.abspath(target)) or ".")


def atomic_write(target: str, data, mode: int = 0o644, owner: tuple | None = None, sync: bool = True) -> None:
    """Write ``data`` (bytes or fill(fd)) to ``target``: temp + fsync + rename + dir fsync.

    sync=False exists only for the benchmark's like-for-like comparison with patchelf,
    which does not fsync; fixers always sync.
    """
    temp = temp_path_for(target)
    write_temp(data, temp, mode=mode, owner=owner, sync=sync)
    replace(temp, target, sync=sync)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# --- pre-flight: refuse before anything is touched -------------------------------------------

class MappedIndex(Record):
    """Which running processes map which files, read once from /proc/*/maps.

    A rewrite by rename leaves a running process on the old inode: it keeps running the old
    code until it restarts, and a later dlopen of a sibling mixes old and new.  So a file a
    process maps is refused and the user is told which process to restart.

    scan() keeps each process's maps as read; users() looks for one file's inode (or path)
    with a C-speed substring search and parses only the lines that name it.  Parsing every
    line of every process up front (a host with CUDA processes holds many thousands of
    mappings) would cost more than the fix of a small library itself.
    """
    _fields = ("maps",)

    def __init__(self, maps: list = NEW):
        self.maps = [] if maps is NEW else maps  # (pid, comm, raw /proc/PID/maps bytes)

    @classmethod
    def scan(cls, proc: str = "/proc") -> "MappedIndex":
        index = cls()
        me = os.getpid()
        try:
            pids = [name for name in os.listdir(proc) if name.isdigit()]
        except OSError:
            return index
        for pid_text in pids:
            pid = int(pid_text)
            if pid == me:
                continue
            try:
                with open(f"{proc}/{pid}/maps", "rb") as handle:
                    maps = handle.read()
                with open(f"{proc}/{pid}/comm", "rb") as handle:
                    comm = handle.read().decode("utf-8", "replace").strip()
            except OSError:
                continue  # exited mid-scan or not ours to read: nothing it maps can be known
            if maps:
                index.maps.append((pid, comm, maps))
        return index

    def users(self, path: str) -> list:
        try:
            st = os.stat(path)
        except OSError:
            return []
        key = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
        inode = b" %d " % st.st_ino
        real = os.fsencode(os.path.realpath(path))
        found = []
        for pid, comm, maps in self.maps:
            if inode not in maps and real not in maps:
                continue
            for line in maps.splitlines():
                if inode not in line and real not in line:
                    continue
                parts = line.split(None, 5)
                if len(parts) < 6 or parts[4] == b"0" or parts[5].endswith(b" (deleted)"):
                    continue  # anonymous, or the old inode: the path on disk is already another file
                try:
                    major, minor = (int(x, 16) for x in parts[3].split(b":"))
                    same = (major, minor, int(parts[4])) == key
                except ValueError:
                    continue
                # overlayfs reports another device in maps than stat() does; the path still matches
                if same or parts[5] == real:
                    found.append((pid, comm))
                    break
        return found


def check_rewritable(path: str, mapped: MappedIndex | None = None) -> os.stat_result:
    """Refuse, with one line, any file a fixer must not rewrite; returns its stat otherwise."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise BadInput(f"{path}: {(exc.strerror or 'cannot stat').lower()}") from None
    if not stat.S_ISREG(st.st_mode):
        raise BadInput(f"{path}: not a regular file; not rewritten")
    # root passes access(W_OK) on a 0444 file, so judge by the mode bits the owner chose
    if not st.st_mode & 0o222:
        raise BadInput(f"{path}: file is read-only (mode {stat.S_IMODE(st.st_mode):04o}); not rewritten")
    try:
        vfs = os.statvfs(path)
        if vfs.f_flag & os.ST_RDONLY:
            raise BadInput(f"{path}: on a read-only filesystem; not rewritten")
    except OSError:
        pass
    directory = os.path.dirname(os.path.abspath(path))
    if not os.access(directory, os.W_OK | os.X_OK):
        raise BadInput(f"{directory}: directory is not writable; {path} not rewritten")
    if _is_immutable(path):
        raise BadInput(f"{path}: file is immutable (chattr +i); not rewritten")
    if mapped is not None:
        users = mapped.users(path)
        if users:
            who = ", ".join(f"pid {pid} ({comm})" for pid, comm in users[:3])
            more = f" and {len(users) - 3} more" if len(users) > 3 else ""
            raise BadInput(f"{path}: busy, mapped by running {who}{more}; not rewritten: "
                           f"stop that process, re-run the fix, then restart it")
    return st


def _is_immutable(path: str) -> bool:
    """FS_IOC_GETFLAGS & FS_IMMUTABLE_FL; rename over an immutable file fails half-way."""
    import fcntl
    import struct
    fs_ioc_getflags, fs_immutable_fl = 0x80086601, 0x10
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        buf = fcntl.ioctl(fd, fs_ioc_getflags, struct.pack("l", 0))
        return bool(struct.unpack("l", buf)[0] & fs_immutable_fl)
    except OSError:
        return False  # the filesystem has no such flags (tmpfs, overlay): not immutable
    finally:
        os.close(fd)
