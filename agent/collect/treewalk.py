"""The check's tree walk in C (elf/treewalk.c), read back into what Scanner._walk keeps.

In Python the walk is a large share of a check of a big tree (/usr/lib/x86_64-linux-gnu,
site-packages with torch): an object per directory entry, and the listing, the open and the
4-byte read of each file one after another.  treewalk.c makes the same walk
(scan.py's _walk_list and _walk_files say what it must keep, and the tests compare the
two) with no Python object per entry, on this process's cores at once.  What comes back is
a record per ELF file, per file named like a config, per error and, while the check cache
records (collect/inputs.py), per directory listed and file opened or stat'ed.

SEEDANCE_WALK=python walks in Python (the tests' reference, and a way out); without the
compiled module the Python walk is used, with the same results.
"""
from __future__ import annotations

import os
import struct

from . import inputs

# struct sd_walk_record (fastelf.h), native layout
_RECORD = struct.Struct("=I4Bii7Q6q")


def _lib():
    """(ffi, lib) when the C walk is built and wanted, else None."""
    if os.environ.get("SEEDANCE_WALK") == "python":
        return None
    from ..elf import fastread

    loaded = fastread._lib if fastread._lib is not None else fastread._load()
    if not loaded or not hasattr(loaded[1], "sd_walk") or loaded[1].sd_walk_record_size() != _RECORD.size:
        return None
    return loaded


def _suffixes(ffi, names: tuple):
    return ffi.new("char[]", b"".join(os.fsencode(n) + b"\0" for n in names) + b"\0")


_stat_result = os.stat_result


def _stat(dev, ino, mode, nlink, uid, gid, rdev, size, blksize, blocks, atime_ns, mtime_ns, ctime_ns):
    """The os.stat_result os.stat would have built (its 10 sequence fields, the float and
    nanosecond times, st_blksize, st_blocks, st_rdev: CPython's order on Linux)."""
    times = []
    floats = []
    for ns in (atime_ns, mtime_ns, ctime_ns):
        sec, nsec = divmod(ns, 1000000000)
        times.append(sec)
        floats.append(sec + nsec * 1e-9)
    return _stat_result((mode, ino, dev, nlink, uid, gid, size, *times, *floats, atime_ns, mtime_ns, ctime_ns,
                         blksize, blocks, rdev))


def walk(directory: str, never_suffixes: tuple, config_suffixes: tuple, threads: int):
    """(counts {files, skipped, unreadable}, records) of the C walk, or None: walk in
    Python.  records: (kind, path, errno, stat_result or None, plain, elf) in walk order;
    the inputs it saw are noted in the recorder (collect/inputs.py) when it records."""
    loaded = _lib()
    if loaded is None:
        return None
    ffi, lib = loaded
    try:
        root = os.fsencode(directory)
    except UnicodeError:
        return None
    if b"\0" in root:
        return None
    record = inputs.recording()
    out = ffi.new("struct sd_walk_result *")
    rc = lib.sd_walk(root, 1 if record else 0, _suffixes(ffi, never_suffixes), _suffixes(ffi, config_suffixes),
                     max(1, threads), out)
    if rc != lib.SD_WALK_OK:
        return None  # (out of memory in C: the Python walk tries)
    try:
        data = ffi.buffer(out.data, out.len)[:] if out.len else b""
    finally:
        lib.sd_walk_free(out)
    counts = {"files": out.files, "skipped": out.skipped, "unreadable": out.unreadable}
    records = []
    seen = []  # (path, identity or errno, weak) for the recorder
    unpack, size, at, end = _RECORD.unpack_from, _RECORD.size, 0, len(data)
    fsdecode = os.fsdecode
    while at < end:
        (path_len, kind, plain, elf, has_stat, err, _reserved, dev, ino, mode, nlink, uid, gid, rdev, st_size,
         blksize, blocks, atime_ns, mtime_ns, ctime_ns) = unpack(data, at)
        at += size
        path = fsdecode(data[at:at + path_len])
        at += path_len
        kind = chr(kind)
        if kind in "DSW":
            # (inputs.identity and weak_identity, from the fields: no stat_result is built)
            if has_stat:
                value = (dev, ino, mode, -1, -1, -1) if kind == "W" else (dev, ino, mode, st_size, mtime_ns, ctime_ns)
            else:
                value = err or -1
            seen.append((path, value, kind == "W"))
            continue
        st = _stat(dev, ino, mode, nlink, uid, gid, rdev, st_size, blksize, blocks, atime_ns, mtime_ns,
                   ctime_ns) if has_stat else None
        if record and st is not None:
            seen.append((path, inputs.identity(st), False))
        records.append((kind, path, err, st, plain == 1, elf == 1))
    if seen:
        inputs.note_walk(seen)
    return counts, records
