"""The C ELF reader (fastelf.c, through cffi) behind reader.read_elf's common case.

read_elf(path) without symbols or fatbins is what a check does for every object of a
tree; in Python it was ~0.3 s of a ~2 s check of /usr/lib (issue 13).  The C reader
returns the same ElfInfo, or raises the same ELFError, or answers None ("read it in
Python"): when its bounded output buffers would overflow, or on an OS condition that
the Python reader reports as a plain OSError.  reader.py remains the reference; the
tests compare the two on every ELF of the host and on mutated files.

SEEDANCE_ELF_READER=python forces the Python reader (tests, and a way out should the C
reader ever disagree).  Without the compiled module (no compiler at install) the Python
reader is used, with the same results.
"""
from __future__ import annotations

import os
import threading

from ..errors import ELFError

# Output capacity per call; real objects use a few KB (libtorch_cpu: ~2 KB of names).
STRINGS_CAPACITY = 1 << 20
VERNEED_CAPACITY = 1 << 16  # reader.py's MAX_VER_ENTRIES: never exceeded by a real file

ABI = 1  # must equal SD_FASTELF_ABI in fastelf.h

_lock = threading.Lock()
_lib = None  # the loaded module's (ffi, lib), False when unavailable
_local = threading.local()  # per-thread buffers: cffi drops the GIL during the call


def _load():
    """(ffi, lib) of seedance.elf._fastelf, or False: not built, or built from another
    layout of fastelf.h (a stale .so next to newer sources must not be trusted)."""
    global _lib
    with _lock:
        if _lib is None:
            try:
                from . import _fastelf  # type: ignore[attr-defined]

                ok = _fastelf.lib.sd_fastelf_abi() == _fastelf.lib.SD_FASTELF_ABI == ABI
            except (ImportError, AttributeError):
                ok = False
            _lib = (_fastelf.ffi, _fastelf.lib) if ok else False
        return _lib


def available() -> bool:
    return bool(_lib if _lib is not None else _load())


def enabled() -> bool:
    """The C reader is built and not switched off by SEEDANCE_ELF_READER=python."""
    return os.environ.get("SEEDANCE_ELF_READER") != "python" and available()


def _buffers(ffi):
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = (ffi.new("struct sd_fastelf_result *"), ffi.new("char[]", STRINGS_CAPACITY),
                   ffi.new("unsigned int[]", VERNEED_CAPACITY))
        _local.buffers = buffers
    return buffers


def read(path: str):
    """ElfInfo for ``path`` (no symbols, no fatbins), ELFError, or None: use the Python reader."""
    loaded = _lib if _lib is not None else _load()
    if not loaded or "\0" in path:
        return None
    ffi, lib = loaded
    out, strings, vn_counts = _buffers(ffi)
    try:
        encoded = os.fsencode(path)
    except UnicodeError:
        return None
    rc = lib.sd_fastelf_read(encoded, out, strings, STRINGS_CAPACITY, vn_counts, VERNEED_CAPACITY)
    if rc == lib.SD_FASTELF_ERROR:
        raise ELFError(f"{path}: {ffi.string(out.error).decode('utf-8', 'replace')}")
    if rc != lib.SD_FASTELF_OK:
        return None
    return _info(path, out, ffi.unpack(strings, out.strings_len), vn_counts)


_classes = None  # (ElfInfo, VersionNeed, every ElfInfo field at its default), on first use


def _load_classes():
    global _classes
    import dataclasses

    from .reader import ElfInfo, VersionNeed

    _classes = (ElfInfo, VersionNeed, {f.name: f.default for f in dataclasses.fields(ElfInfo)})
    return _classes


def _info(path: str, out, raw: bytes, vn_counts):
    """The ElfInfo of one result, built without ElfInfo's generated __init__.

    A frozen dataclass's __init__ sets each of ElfInfo's 21 fields through
    object.__setattr__: ~10 us per object, a quarter of this module's time per file.  The
    instance's __dict__ filled at once makes the same object (ElfInfo has neither
    __slots__ nor __post_init__; equality and hashing read the attributes); the tests
    compare it with the Python reader's ElfInfo on every file."""
    ElfInfo, VersionNeed, defaults = _classes or _load_classes()
    # One decode for every string: NUL never occurs inside a UTF-8 sequence, so decoding
    # the joined strings equals decoding each one (surrogateescape, as reader.py does).
    parts = raw.decode("utf-8", "surrogateescape").split("\0")
    at = 0
    interpreter = None
    if out.has_interp:
        interpreter = parts[0]
        at = 1
    count = out.n_sections
    section_names = tuple(dict.fromkeys(parts[at:at + count]))  # first occurrence, as reader.py's dict
    at += count
    count = out.n_needed
    needed = tuple(parts[at:at + count])
    at += count
    soname = None
    if out.has_soname:
        soname = parts[at]
        at += 1
    rpath = runpath = ()
    if out.has_rpath:
        rpath = tuple(parts[at].split(":"))
        at += 1
    if out.has_runpath:
        runpath = tuple(parts[at].split(":"))
        at += 1
    build_id = None
    if out.has_build_id:
        build_id = parts[at]
        at += 1
    version_needs = []
    for index in range(out.n_verneed):
        count = vn_counts[index]
        versions = tuple((text[1:], text[0] == "1") for text in parts[at:at + count])
        at += count
        version_needs.append(VersionNeed(file=parts[at], versions=versions))
        at += 1
    version_defs = tuple(parts[at:at + out.n_verdef])
    fields = defaults.copy()
    fields.update(path=path, elf_class=out.elf_class, little_endian=bool(out.little_endian),
                  machine=out.machine, osabi=out.osabi, e_type=out.e_type, interpreter=interpreter,
                  needed=needed, soname=soname, rpath=rpath, runpath=runpath, flags=out.flags,
                  flags_1=out.flags_1, version_needs=tuple(version_needs), version_defs=version_defs,
                  build_id=build_id, has_sections=bool(out.has_sections), has_dynamic=bool(out.has_dynamic),
                  section_names=section_names)
    info = object.__new__(ElfInfo)
    object.__setattr__(info, "__dict__", fields)
    return info
