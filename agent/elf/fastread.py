"""The C ELF reader (fastelf.c, through cffi) behind reader.read_elf without fatbins.

read_elf(path) is what a check does for every object of a tree, and read_elf(path,
symbols=PREFIXES) (the C++ ABI check) walks torch's symbol tables: in Python, struct
unpacking and an object per entry make both a large part of a check
(bench/bench_elf.py compares the two readers).  The C reader
returns the same ElfInfo, or raises the same ELFError, or answers None ("read it in
Python"): when its bounded output buffers would overflow, or on an OS condition that
the Python reader reports as a plain OSError.  reader.py remains the reference; the
tests compare the two on every ELF of the host and on mutated files.

SEEDANCE_ELF_READER=python forces the Python reader (tests, and a way out should the C
reader ever disagree).  Without the compiled module (no compiler at install) the Python
reader is used, with the same results.
"""
from __future__ import annotations

import _thread  # threading's own primitives; importing threading itself is paid at every `seedance ldd` start
import os

from ..model.errors import ELFError

# Output capacity per call; real objects use a few KB (libtorch_cpu: ~2 KB of names).
STRINGS_CAPACITY = 1 << 20
VERNEED_CAPACITY = 1 << 16  # reader.py's MAX_VER_ENTRIES: never exceeded by a real file
SCRATCH_CAPACITY = 1 << 16  # files up to this size are read, not mapped (fastelf.c says why)

ABI = 7  # must equal SD_FASTELF_ABI in fastelf.h

_lock = _thread.allocate_lock()  # threading.Lock
_lib = None  # the loaded module's (ffi, lib), False when unavailable
_local = _thread._local()  # threading.local: per-thread buffers, as cffi drops the GIL during the call


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


# os.environ's own dict of bytes (CPython's os._Environ keeps it in step with every change
# through os.environ, monkeypatch's included): a lookup there is a dict lookup, where
# os.environ.get goes through the Mapping ABC and encodes the key, and this is asked once
# per file read
_environ_data = getattr(os.environ, "_data", None)
_SWITCH = os.fsencode("SEEDANCE_ELF_READER")


def enabled() -> bool:
    """The C reader is built and not switched off by SEEDANCE_ELF_READER=python."""
    if _environ_data is not None:
        if _environ_data.get(_SWITCH) == b"python":
            return False
    elif os.environ.get("SEEDANCE_ELF_READER") == "python":
        return False
    return available()


def _buffers(ffi):
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = (ffi.new("struct sd_fastelf_result *"), ffi.new("char[]", STRINGS_CAPACITY),
                   ffi.new("unsigned int[]", VERNEED_CAPACITY), ffi.new("struct sd_fastelf_symbols *"),
                   ffi.new("unsigned char[]", SCRATCH_CAPACITY))
        _local.buffers = buffers
    return buffers


_prefix_cache: dict = {}  # prefixes tuple -> (bytes, lengths, count) as C takes them


def _prefixes(ffi, prefixes: tuple):
    entry = _prefix_cache.get(prefixes)
    if entry is None:
        encoded = [p.encode("utf-8", "surrogateescape") for p in prefixes]
        entry = (ffi.new("char[]", b"".join(encoded) or b"\0"), ffi.new("size_t[]", [len(e) for e in encoded] or [0]),
                 len(encoded))
        if len(_prefix_cache) < 64:
            _prefix_cache[prefixes] = entry
    return entry


def read(path: str, symbols: bool | tuple = False, tables: bool = False):
    """ElfInfo for ``path`` (no fatbins), ELFError, or None: use the Python reader.
    ``symbols`` as read_elf's: False, True, or a tuple of name prefixes.  ``tables``: instead
    of the ElfInfo, what the symbols give without Symbol objects: with symbols=True the
    resolver's symbol tables (symbol_tables), with prefixes the exported names
    (exported_names)."""
    loaded = _lib if _lib is not None else _load()
    if not loaded or "\0" in path:
        return None
    ffi, lib = loaded
    out, strings, vn_counts, syms, scratch = _buffers(ffi)
    try:
        encoded = os.fsencode(path)
    except UnicodeError:
        return None
    if not symbols:
        rc = lib.sd_fastelf_read(encoded, out, strings, STRINGS_CAPACITY, vn_counts, VERNEED_CAPACITY,
                                 lib.SD_FASTELF_NO_SYMBOLS, ffi.NULL, ffi.NULL, 0, ffi.NULL, scratch,
                                 SCRATCH_CAPACITY)
    elif symbols is True:
        rc = lib.sd_fastelf_read(encoded, out, strings, STRINGS_CAPACITY, vn_counts, VERNEED_CAPACITY,
                                 lib.SD_FASTELF_ALL_SYMBOLS, ffi.NULL, ffi.NULL, 0, syms, scratch, SCRATCH_CAPACITY)
    elif type(symbols) is tuple and all(type(p) is str for p in symbols):
        prefix_bytes, prefix_lens, count = _prefixes(ffi, symbols)
        mode = lib.SD_FASTELF_EXPORTED_PREFIXED if tables else lib.SD_FASTELF_PREFIXED_SYMBOLS
        rc = lib.sd_fastelf_read(encoded, out, strings, STRINGS_CAPACITY, vn_counts, VERNEED_CAPACITY,
                                 mode, prefix_bytes, prefix_lens, count, syms, scratch, SCRATCH_CAPACITY)
    else:
        return None
    try:
        if rc == lib.SD_FASTELF_ERROR:
            raise ELFError(f"{path}: {ffi.string(out.error).decode('utf-8', 'replace')}")
        if rc != lib.SD_FASTELF_OK:
            return None
        if tables and symbols is True:
            return _tables(ffi, syms)
        if tables and symbols:
            return _exports(ffi, syms)
        info = _info(path, out, ffi.unpack(strings, out.strings_len), vn_counts)
        if len(_isa_levels) >= 65536:
            _isa_levels.clear()  # (a long-lived agent reads new paths for ever)
        _isa_levels[path] = out.x86_isa_needed
        if symbols:
            info.__dict__["symbols"] = _symbols(ffi, syms)
        return info
    finally:
        if symbols:
            lib.sd_fastelf_free_symbols(syms)


# path -> properties.x86_isa_needed of the image the last read of that path parsed: a check
# asks it of every object it loads, and reopening each file for it would cost an open and
# reads of its program headers and notes per object.  Kept beside ElfInfo, not in it: the
# Python reader does not read it (elf/properties.py).
_isa_levels: dict = {}


def x86_isa_needed(path: str):
    """properties.x86_isa_needed(path) as of this module's last read of ``path``; None when
    it has not read that path."""
    return _isa_levels.get(path)


_names = None  # (binding names, type names) by number, as info.py spells them


def _symbols(ffi, syms) -> tuple:
    """Symbol objects from the C output, built as _info builds ElfInfo (one __dict__ each:
    libtorch_cpu has tens of thousands of dynamic symbols, and a frozen __init__ per
    Symbol would be a large part of reading them)."""
    global _names
    from .info import BIND_NAMES, STT_NAMES, Symbol

    if _names is None:
        _names = ([BIND_NAMES.get(n, str(n)) for n in range(16)], [STT_NAMES.get(n, str(n)) for n in range(16)])
    bind_names, type_names = _names
    if not syms.count:
        return ()
    names, versions, records = _raw(ffi, syms)
    new, set_dict = object.__new__, object.__setattr__
    out = []
    append = out.append
    for name, (bind, kind, defined, hidden, slot) in zip(names, records):
        symbol = new(Symbol)
        set_dict(symbol, "__dict__", {"name": name, "defined": defined == 1, "binding": bind_names[bind],
                                      "type": type_names[kind], "version": versions[slot], "hidden": hidden == 1})
        append(symbol)
    return tuple(out)


def _raw(ffi, syms) -> tuple:
    """(names, versions by slot (slot 0: None), iterator of (bind, type, defined, hidden,
    slot) records) of a non-empty symbol output, as fastelf.h lays it out."""
    import struct

    names = ffi.unpack(syms.names, syms.names_len).decode("utf-8", "surrogateescape").split("\0")
    versions = [None]
    if syms.n_versions:
        versions += ffi.unpack(syms.versions, syms.versions_len).decode("utf-8", "surrogateescape").split("\0")
    return names, versions, struct.iter_unpack("=BBBBI", ffi.buffer(syms.records, 8 * syms.count))


def symbol_tables(path: str):
    """Resolver._symbol_tables(path, read_elf(path, symbols=True)) straight from the C
    output: (definitions: name -> frozenset of tags, strong undefined ((name, version), ...)),
    ELFError, or None: use the Python reader.  No Symbol is built: the version-gap check of a
    site-packages with the CUDA wheels reads many whole symbol tables, and a Python Symbol
    object per entry would be a large part of that check."""
    return read(path, True, tables=True)


def exported_names(path: str, prefixes: tuple):
    """frozenset of the names ``path`` exports among those starting with ``prefixes``
    (defined, not STB_LOCAL, not a hidden version: cxxabi.TorchAbiCache.defined over
    read_elf(path, symbols=prefixes)), ELFError, or None: use the Python reader.  torch's
    libraries export tens of thousands of such names, and a Symbol object for each would
    be built only to be thrown away."""
    return read(path, prefixes, tables=True)


def _exports(ffi, syms) -> frozenset:
    """The names of a SD_FASTELF_EXPORTED_PREFIXED read: the C reader kept only the defined,
    not hidden ones (and never keeps STB_LOCAL)."""
    if not syms.count:
        return frozenset()
    names = ffi.unpack(syms.names, syms.names_len - 1).decode("utf-8", "surrogateescape").split("\0")
    return frozenset(names)


def _tables(ffi, syms) -> tuple:
    """The tables of Resolver._symbol_tables (its docstring says what the tags mean), over
    the raw records: bind 0 is STB_LOCAL, 1 STB_GLOBAL; one frozenset per (version, hidden)
    for a name defined once, the union for a name defined under several versions."""
    if not syms.count:
        return {}, ()
    names, versions, records = _raw(ffi, syms)
    shared: dict = {}  # (version slot, hidden) -> the tags of one such definition
    defs: dict = {}
    undefs = []
    for name, (bind, _kind, defined, hidden, slot) in zip(names, records):
        if defined == 1:
            if bind == 0:
                continue
            tags = shared.get((slot, hidden))
            if tags is None:
                version = versions[slot]
                tags = {version} if hidden == 1 else ({version, "default", "*"} if version is None
                                                      else {version, "default"})
                tags = shared[(slot, hidden)] = frozenset(tags)
            known = defs.get(name)
            defs[name] = tags if known is None else known | tags
        elif bind == 1:
            undefs.append((name, versions[slot]))
    return defs, tuple(undefs)


_classes = None  # (ElfInfo, VersionNeed, every ElfInfo field at its default), on first use


def _load_classes():
    global _classes
    from .info import ElfInfo, VersionNeed

    _classes = (ElfInfo, VersionNeed, dict(ElfInfo.DEFAULTS))
    return _classes


def _info(path: str, out, raw: bytes, vn_counts):
    """The ElfInfo of one result, built without ElfInfo's __init__.

    When ElfInfo was a frozen dataclass, its __init__ set each of its 21 fields through
    object.__setattr__, a Python call per field for every object read.  The
    instance's __dict__ filled at once makes the same object (ElfInfo, info.py, keeps its
    fields in its __dict__; equality and hashing read them); the tests
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
        versions = tuple([(text[1:], text[0] == "1") for text in parts[at:at + count]])
        at += count
        version_needs.append(VersionNeed(parts[at], versions))
        at += 1
    version_defs = tuple(parts[at:at + out.n_verdef])
    fields = defaults.copy()
    fields.update(path=path, elf_class=out.elf_class, little_endian=bool(out.little_endian),
                  machine=out.machine, osabi=out.osabi, e_type=out.e_type, interpreter=interpreter,
                  needed=needed, soname=soname, rpath=rpath, runpath=runpath, flags=out.flags,
                  flags_1=out.flags_1, version_needs=tuple(version_needs), version_defs=version_defs,
                  build_id=build_id, has_sections=bool(out.has_sections), has_dynamic=bool(out.has_dynamic),
                  section_names=section_names)
    return ElfInfo._build(fields)
