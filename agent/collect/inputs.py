"""What a check read from the file system, recorded as it reads it (the check cache's inputs).

A check's report is a function of the files and directories it looked at, its options, the
environment and this host (CPU, glibc, GPU).  The first part is recorded where it happens:

- the code a check runs (the resolver, the walk, the collectors) asks this module, not
  ``os``, whether a path is there and what it is: ``inputs.stat``, ``lstat``, ``exists``,
  ``isfile``, ``isdir``, ``islink``, ``samefile``, ``realpath`` and ``walk`` answer as their
  ``os`` and ``os.path`` namesakes do and, while a check is recorded, keep each answer (a
  stat result, or the errno of a path that is not there) as it was *before* the file was read;
- an audit hook (PEP 578) sees ``open`` (``open()``, ``os.open``), ``os.listdir`` and
  ``os.scandir``; the file or directory is stat'ed then, before it is read or listed (a
  file changed after that stat is seen as changed on the next run, never the other way).

The C reader opens files itself, but only paths the resolver has stat'ed first; the C walk
hands what it stat'ed, listed and opened to note_walk().  A forked helper (helper.py) records
in its own copy and sends its records back with its answer.

A recorded input is (path, follow-links, identity) where identity is (dev, inode, mode, size,
mtime_ns, ctime_ns) or the errno.  ``changed()`` stats them all again: one difference, one
new file where none was, one missing file, and the cached report is not used.
/proc, /sys and /dev are not recorded (volatile, and what they tell a check is keyed
elsewhere: the boot id for the CPU), nor seedance's own cache directory.
"""
from __future__ import annotations

import os
import stat as _stat
import sys

_IGNORED = ("/proc/", "/sys/", "/dev/")
_state = {"on": False, "hooked": False, "opaque": None}
_OPAQUE = ("subprocess.Popen", "os.system", "os.posix_spawn", "os.spawn", "os.exec", "ctypes.dlopen")
_records: dict = {}  # (path, follow) -> identity tuple | errno int
_skip = {"prefixes": _IGNORED}  # paths under these are not recorded (a tuple, for str.startswith)


def identity(st) -> tuple:
    return (st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def weak_identity(st) -> tuple:
    """A directory that was stat'ed but not listed (os.path.realpath walking a path, isdir):
    what it is (dev, inode, mode: a directory, or a link) is what the check learnt, not what
    it holds; its size and times (-1: not compared) change with every file made in it (/tmp).
    A listing of it records the whole identity."""
    return (st.st_dev, st.st_ino, st.st_mode, -1, -1, -1)


def is_weak(value) -> bool:
    return not isinstance(value, int) and value[3] == -1


def _path_of(path):
    """The absolute str path of an os.stat/open argument, or None (an fd, a dir_fd-relative
    name, bytes that do not decode as the file system encoding would)."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    elif not isinstance(path, str):
        path = getattr(path, "__fspath__", None)
        if path is None:
            return None
        path = path()
        if not isinstance(path, str):
            return _path_of(path)
    if not path.startswith("/"):
        path = os.path.join(os.getcwd(), path)
    return path


def _note(path: str, follow: bool, result) -> None:
    key = (path, follow)
    if key in _records:
        return
    if path.startswith(_skip["prefixes"]):
        return
    _records[key] = result


def _stat_now(path: str, follow: bool) -> None:
    known = _records.get((path, follow))
    if (known is not None and not is_weak(known)) or path.startswith(_skip["prefixes"]):
        return  # (a directory only stat'ed before is listed now: its whole identity counts)
    try:
        st = os.stat(path, follow_symlinks=follow)
    except OSError as exc:
        _records[(path, follow)] = exc.errno or -1
    except ValueError:  # an embedded NUL: no file
        return
    else:
        _records[(path, follow)] = identity(st)


def _note_stat(path, follow: bool, dir_fd=None):
    """os.stat or os.lstat of ``path``, its answer noted: a directory weakly (weak_identity),
    anything else whole, an error by its errno."""
    where = _path_of(path) if dir_fd is None else None
    try:
        st = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow)
    except OSError as exc:
        if where is not None:
            _note(where, follow, exc.errno or -1)
        raise
    if where is not None:
        _note(where, follow, weak_identity(st) if _stat.S_ISDIR(st.st_mode) else identity(st))
    return st


def stat(path, *, dir_fd=None, follow_symlinks: bool = True):
    """os.stat(path), an input of the check being recorded (a path relative to ``dir_fd``
    is not: it names no file on its own)."""
    if not _state["on"]:
        return os.stat(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
    return _note_stat(path, follow_symlinks, dir_fd)


def lstat(path, *, dir_fd=None):
    """os.lstat(path), an input of the check being recorded."""
    if not _state["on"]:
        return os.lstat(path, dir_fd=dir_fd)
    return _note_stat(path, False, dir_fd)


def exists(path) -> bool:
    """os.path.exists(path), recorded."""
    try:
        stat(path)
    except (OSError, ValueError):
        return False
    return True


def isfile(path) -> bool:
    """os.path.isfile(path), recorded."""
    try:
        st = stat(path)
    except (OSError, ValueError):
        return False
    return _stat.S_ISREG(st.st_mode)


def isdir(path) -> bool:
    """os.path.isdir(path), recorded."""
    try:
        st = stat(path)
    except (OSError, ValueError):
        return False
    return _stat.S_ISDIR(st.st_mode)


def islink(path) -> bool:
    """os.path.islink(path), recorded."""
    try:
        st = lstat(path)
    except (OSError, ValueError, AttributeError):
        return False
    return _stat.S_ISLNK(st.st_mode)


def samefile(first, second) -> bool:
    """os.path.samefile(first, second), both recorded."""
    return os.path.samestat(stat(first), stat(second))


def realpath(path) -> str:
    """os.path.realpath(path): each component on the way lstat'ed as posixpath.realpath does
    it (non-strict), and recorded; the links among them read with os.readlink."""
    if not _state["on"]:
        return os.path.realpath(path)
    path = os.fspath(path)
    if isinstance(path, bytes):
        return os.fsencode(realpath(os.fsdecode(path)))
    resolved, _ok = _join_real("", path, {})
    return os.path.abspath(resolved)


def _join_real(path: str, rest: str, seen: dict) -> tuple:
    """posixpath._joinrealpath, non-strict, for str paths: the one place the components of a
    path are lstat'ed on its way to its real path."""
    if rest.startswith("/"):
        rest, path = rest[1:], "/"
    while rest:
        name, _, rest = rest.partition("/")
        if not name or name == ".":
            continue
        if name == "..":
            if path:
                path, name = os.path.split(path)
                if name == "..":
                    path = os.path.join(path, "..", "..")
            else:
                path = ".."
            continue
        newpath = os.path.join(path, name)
        try:
            is_link = _stat.S_ISLNK(lstat(newpath).st_mode)
        except OSError:
            is_link = False
        if not is_link:
            path = newpath
            continue
        if newpath in seen:
            path = seen[newpath]
            if path is not None:
                continue
            return os.path.join(newpath, rest), False  # a loop of links: the rest as it is
        seen[newpath] = None
        path, ok = _join_real(path, os.readlink(newpath), seen)
        if not ok:
            return os.path.join(path, rest), False
        seen[newpath] = path
    return path, True


def walk(top: str, followlinks: bool = False):
    """os.walk(top, followlinks=followlinks) (top-down), recorded: each directory is listed
    through os.scandir (the audit hook records the listing) and, unless links are followed,
    lstat'ed before it is entered, as os.walk's os.path.islink does."""
    if not _state["on"] or followlinks:
        yield from os.walk(top, followlinks=followlinks)
        return
    for base, dirs, files in os.walk(top, followlinks=True):
        # os.walk(followlinks=True) does not ask islink: ask it here, for each directory it
        # is about to enter, and prune the links as os.walk(followlinks=False) would
        yield base, dirs, files
        dirs[:] = [name for name in dirs if not islink(os.path.join(base, name))]


def _audit(event: str, args) -> None:
    if not _state["on"]:
        return
    if event == "open":
        path, mode, flags = args
        if mode is not None and any(c in mode for c in "wax+"):
            return  # written, not read
        if isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR):
            return
    elif event in _OPAQUE:
        # what another program or a loaded library read is not seen here: such a check
        # (--python asks the interpreter where its torch is) is not cached
        _state["opaque"] = event
        return
    elif event not in ("os.listdir", "os.scandir"):
        return
    else:
        path = args[0]
        if path is None:
            path = "."
    where = _path_of(path)
    if where is not None:
        _stat_now(where, True)


def start(skip: tuple = ()) -> None:
    """Record from now on (a fresh record), until stop()."""
    _records.clear()
    _state["opaque"] = None
    _skip["prefixes"] = _IGNORED + tuple(p.rstrip("/") + "/" for p in skip if p)
    if not _state["hooked"]:
        sys.addaudithook(_audit)  # (a hook cannot be removed: it does nothing while off)
        _state["hooked"] = True
    _state["on"] = True


def stop() -> dict:
    """Stop recording; {(path, follow): identity or errno}."""
    _state["on"] = False
    return dict(_records)


def recording() -> bool:
    return _state["on"]


def opaque():
    """The audit event of a program run or a library loaded while recording (whose reads
    the record cannot hold), or None."""
    return _state["opaque"]


class paused:
    """``with inputs.paused():`` what is not an input: seedance's own cache files, written
    during a check (private_file.write_private)."""

    def __enter__(self):
        self._was = _state["on"]
        _state["on"] = False
        return self

    def __exit__(self, *exc):
        _state["on"] = self._was
        return False


def mark() -> int:
    """How many inputs are recorded so far (a forked helper sends back what follows)."""
    return len(_records)


def since(count: int) -> list:
    """The records made after mark() gave ``count`` (dicts keep their insertion order)."""
    return list(_records.items())[count:]


def merge(records: list) -> None:
    """A helper's records: each path as the helper first saw it, unless seen here before."""
    for key, value in records:
        if isinstance(key, tuple) and len(key) == 2:
            _records.setdefault(tuple(key), value)


# The records as the C validator reads them (struct sd_input_record in agent/elf/fastelf.h,
# native byte order: written and read on one host): path_len, follow, err, weak (1: dev,
# inode and mode only, weak_identity), dev, ino,
# mode, size, mtime_ns, ctime_ns, then the path's bytes.
_RECORD = "=IiiiQQQqqq"


def encode(records: dict) -> bytes:
    """The blob of ``records`` ({(path, follow): identity or errno}), for changed()."""
    import struct

    pack, parts = struct.Struct(_RECORD).pack, []
    for (path, follow), value in records.items():
        raw = os.fsencode(path)
        if isinstance(value, int):
            parts.append(pack(len(raw), 1 if follow else 0, value, 0, 0, 0, 0, 0, 0, 0))
        elif is_weak(value):
            parts.append(pack(len(raw), 1 if follow else 0, 0, 1, *value[:3], 0, 0, 0))
        else:
            parts.append(pack(len(raw), 1 if follow else 0, 0, 0, *value))
        parts.append(raw)
    return b"".join(parts)


def changed(blob: bytes, count: int, use_c: bool | None = None) -> str | None:
    """None when all ``count`` records of ``blob`` are as recorded now; else why not (the
    first path that differs, or 'malformed').  In C when the extension is built (inputcheck.c);
    changed_python() is its reference."""
    if use_c is not False:
        from ..elf import fastread

        loaded = fastread._load() if fastread.available() else None
        lib = getattr(loaded[1], "sd_inputs_changed", None) if loaded else None
        if lib is not None:
            ffi = loaded[0]
            validated = ffi.new("size_t *")
            index = lib(ffi.from_buffer(blob), len(blob), validated)
            return _verdict(blob, index, validated[0], count)
        if use_c:
            raise RuntimeError("the C validator is not built")
    return changed_python(blob, count)


def changed_python(blob: bytes, count: int) -> str | None:
    """changed() in Python, with the same answers: the blob's structure first (a malformed
    blob is malformed whatever its records say), then each record in order."""
    import struct

    header = struct.Struct(_RECORD)
    parsed, at = [], 0
    while at < len(blob):
        if len(blob) - at < header.size:
            return _verdict(blob, -2, 0, count)
        path_len, follow, err, weak, *was = header.unpack_from(blob, at)
        at += header.size
        if path_len == 0 or path_len > 4096 or len(blob) - at < path_len:
            return _verdict(blob, -2, 0, count)
        parsed.append((blob[at:at + path_len], follow, err, weak, tuple(was)))
        at += path_len
    for index, (raw, follow, err, weak, was) in enumerate(parsed):
        if b"\0" in raw:
            return _verdict(blob, -2, index, count)
        try:
            st = os.stat(raw, follow_symlinks=bool(follow))
        except OSError as exc:
            if err != (exc.errno or -1):
                return _verdict(blob, index, index, count)
        else:
            if err != 0 or (identity(st)[:3] != was[:3] if weak else identity(st) != was):
                return _verdict(blob, index, index, count)
    return _verdict(blob, -1, len(parsed), count)


def _verdict(blob: bytes, index: int, validated: int, count: int) -> str | None:
    if index == -2:
        return "malformed inputs"
    if index >= 0:
        return f"{_path_at(blob, index)}: changed"
    if validated != count:
        return "malformed inputs: fewer records than stored"
    return None


def _path_at(blob: bytes, index: int) -> str:
    import struct

    header = struct.Struct(_RECORD)
    at = 0
    for _ in range(index):
        at += header.size + header.unpack_from(blob, at)[0]
    path_len = header.unpack_from(blob, at)[0]
    return os.fsdecode(blob[at + header.size:at + header.size + path_len])


def newest_change(records: dict) -> int:
    """The latest ctime/mtime (ns) among the recorded files, 0 when none exists."""
    newest = 0
    for value in records.values():
        if not isinstance(value, int) and not is_weak(value):
            newest = max(newest, value[4], value[5])
    return newest


def note_walk(items) -> None:
    """What the C walk (elf/treewalk.c) stat'ed, listed and opened: (path, identity or errno,
    weak) each, as inputs.stat and the audit hook would have noted them (a whole
    identity replaces a weak one, as a listing after a stat does)."""
    if not _state["on"]:
        return
    prefixes = _skip["prefixes"]
    for path, value, weak in items:
        path = _path_of(path)
        if path is None or path.startswith(prefixes):
            continue
        key = (path, True)
        known = _records.get(key)
        if known is None or (not weak and is_weak(known)):
            _records[key] = value
