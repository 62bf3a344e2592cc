"""The binary /etc/ld.so.cache, read the way glibc's elf/dl-cache.c reads it.

Three layouts exist and all are accepted: the new format alone
("glibc-ld.so.cache1.1", what ldconfig writes since glibc 2.32), the old libc6 format
("ld.so-1.7.0"), and the old format with a new-format cache appended after it.  When a
new-format part is present, glibc searches only that part; so do we.

Lookup follows search_cache(): a binary search with _dl_cache_libcmp ordering (digit runs
compare numerically), back up to the first entry with an equal key, then scan forward for
the first entry whose flags match this ABI and whose hwcap bits are usable, preferring
glibc-hwcaps entries by subdirectory priority.  Those priorities come per index into the
cache's list of subdirectory names, merged the way glibc_hwcaps_priorities_init() merges
them (see hwcaps_index_priorities), so a compat cache, whose names ld.so misreads, gets
ld.so's answer (tests/unit/test_resolve_ldcache_compat_hwcaps.py has the real loader as oracle).
A glibc-hwcaps entry whose recorded x86 ISA level the CPU lacks is passed over, as
dl_cache_hwcap_isa_level_compatible() makes glibc 2.36 do (tests/unit/test_resolve_ldcache_isa_level.py).
"""
from __future__ import annotations

import os
import struct

from ..collect import inputs
from ..model.errors import BadInput
from ..model.record import FrozenRecord, set_fields

MAGIC_OLD = b"ld.so-1.7.0"
MAGIC_NEW = b"glibc-ld.so.cache1.1"
OLD_HEADER = struct.Struct("<11sxI")  # magic[11], pad, nlibs
OLD_ENTRY = struct.Struct("<iII")  # flags, key, value
NEW_HEADER = struct.Struct("<20sIIB3xI12x")  # magic+version, nlibs, len_strings, flags, ext offset
NEW_ENTRY = struct.Struct("<iIIIQ")  # flags, key, value, osversion (unused), hwcap
EXT_MAGIC = 0xEAA42174
EXT_TAG_GLIBC_HWCAPS = 1

# dl-cache.h: flag values ldconfig stores per entry.
FLAG_ELF_LIBC6 = 0x0003
FLAG_X8664_LIB64 = 0x0300
FLAG_X8664_LIBX32 = 0x0800
# What _dl_cache_check_flags() accepts for each ABI (sysdeps/unix/sysv/linux/x86_64/dl-cache.h).
ABI_FLAGS = {"x86_64": FLAG_ELF_LIBC6 | FLAG_X8664_LIB64, "i386": FLAG_ELF_LIBC6}

# dl-cache.h: bit 62 marks an entry that lives in a glibc-hwcaps subdirectory; the low 32
# bits then index the extension's list of subdirectory names.
HWCAP_EXTENSION = 1 << 62
HWCAP_TLS = 1 << 63
ISA_LEVEL_MASK = (1 << 10) - 1
HWCAP_PLATFORM_MASK = ((1 << 4) - 1) << 48  # x86: _DL_FIRST_PLATFORM 48, 4 platforms
X86_PLATFORMS = ("i586", "i686", "haswell", "xeon_phi")
# GNU_PROPERTY_X86_ISA_1_* bits (elf/elf.h): baseline is bit 0, x86-64-vN is bit N-1.
ISA_1_BASELINE = 1 << 0
ISA_1_LEVEL_BITS = {"x86-64-v2": 1 << 1, "x86-64-v3": 1 << 2, "x86-64-v4": 1 << 3}


class CacheEntry(FrozenRecord):
    _fields = ("name", "path", "flags", "hwcap", "hwcaps_subdir")

    def __init__(self, name: str, path: str, flags: int, hwcap: int, hwcaps_subdir: str | None):
        set_fields(self, {"name": name, "path": path, "flags": flags, "hwcap": hwcap,
                                              "hwcaps_subdir": hwcaps_subdir})  # for glibc-hwcaps entries


def is_hwcaps_extension(hwcap: int) -> bool:
    """dl_cache_hwcap_extension(): only bit 62 set above the low 32 bits, ignoring the ISA
    level bits (32..41) that ldconfig stores next to it."""
    return ((hwcap >> 32) & ~ISA_LEVEL_MASK) == (HWCAP_EXTENSION >> 32)


def isa_1_from_hwcaps(priorities: dict) -> int:
    """cpu_features->isa_1, the ISA levels this CPU supports, as GNU_PROPERTY_X86_ISA_1 bits.

    glibc 2.36 derives both the usable glibc-hwcaps subdirectories
    (sysdeps/x86_64/dl-hwcaps-subdirs.c) and isa_1 (sysdeps/x86/cpu-features.c) from the same
    get_isa_level(), so the usable x86-64-vN names are exactly the supported levels above the
    baseline, which every x86-64 CPU meets (CMOV, CX8, FPU, FXSR, MMX, SSE, SSE2).
    """
    bits = ISA_1_BASELINE
    for name in priorities:
        bits |= ISA_1_LEVEL_BITS.get(name, 0)
    return bits


def isa_level_compatible(hwcap: int, isa_1: int) -> bool:
    """dl_cache_hwcap_isa_level_compatible() (sysdeps/x86/dl-isa-level.h, glibc 2.36).

    ldconfig stores in bits 32..41 of a glibc-hwcaps entry the index of the highest bit of
    the library's GNU_PROPERTY_X86_ISA_1_NEEDED note (elf-read-prop.h read_gnu_property, a
    bsr; elf/cache.c compute_hwcap_value), 0 without a note; ld.so passes over an entry whose
    level bit the CPU lacks, e.g. a library linked with -z x86-64-v4 on a CPU without v4.
    """
    level_bit = 1 << ((hwcap >> 32) & ISA_LEVEL_MASK)
    return level_bit & isa_1 == level_bit


def libcmp(left: str, right: str) -> int:
    """_dl_cache_libcmp: bytewise, except runs of digits compare as numbers."""
    # The common head decides nothing: equal characters compare equal, and a digit run
    # that ends inside it is the same number on both sides.  So the comparison can start
    # where the strings first differ, backed up to the start of the digit run (if any)
    # that reaches there.  A binary search compares the name with many entries that
    # share a long head ("lib", "libcu..."), so walking every character from the start
    # would be most of a lookup.
    if left == right:
        return 0
    start, end = 0, min(len(left), len(right))
    while start < end and left[start] == right[start]:
        start += 1
    while start and left[start - 1].isdigit() and left[start - 1].isascii():
        start -= 1
    return _libcmp_from(left, right, start)


def _libcmp_from(left: str, right: str, start: int) -> int:
    """_dl_cache_libcmp from ``start``, where both strings are at the same place."""
    i = j = start
    n1, n2 = len(left), len(right)
    while i < n1:
        c1 = left[i]
        c2 = right[j] if j < n2 else ""
        if c1.isdigit() and c1.isascii():
            if c2 and c2.isdigit() and c2.isascii():
                s1 = i
                while i < n1 and left[i].isascii() and left[i].isdigit():
                    i += 1
                s2 = j
                while j < n2 and right[j].isascii() and right[j].isdigit():
                    j += 1
                v1, v2 = int(left[s1:i]), int(right[s2:j])
                if v1 != v2:
                    return v1 - v2
                continue
            return 1
        if c2 and c2.isdigit() and c2.isascii():
            return -1
        if c1 != c2:
            return ord(c1) - (ord(c2) if c2 else 0)
        i += 1
        j += 1
    return 0 - (ord(right[j]) if j < n2 else 0)


class LdCache:
    """A parsed ld.so.cache; ``entries`` in file order (ldconfig's sorted order)."""

    def __init__(self, entries: list | None, fmt: str, path: str, hwcaps_names: list | None = None,
                 table: "_NewTable | None" = None):
        # entries None: decoded from ``table`` (a new-format cache as load() read it) when
        # first asked for; a lookup decodes only the names its binary search visits
        self._entries = entries
        self._table = table
        self.format = fmt  # 'new', 'old', 'old+new' or 'missing'
        self.path = path
        if hwcaps_names is None:  # built from entries alone: the names they point at
            by_index = {e.hwcap & 0xFFFFFFFF: e.hwcaps_subdir for e in self.entries if e.hwcaps_subdir is not None}
            hwcaps_names = [by_index.get(i) for i in range(max(by_index, default=-1) + 1)]
        self.hwcaps_names = hwcaps_names  # the extension's glibc-hwcaps list, in file order
        self._merged: dict = {}

    @property
    def entries(self) -> list:
        if self._entries is None:
            self._entries = [self._table.entry(index) for index in range(self._table.count)]
        return self._entries

    def _reader(self) -> tuple:
        """(count, name of entry i, entry i): from the table while entries are not decoded."""
        if self._entries is None:
            return self._table.count, self._table.name, self._table.entry
        entries = self._entries
        return len(entries), lambda index: entries[index].name, entries.__getitem__

    @classmethod
    def load(cls, path: str = "/etc/ld.so.cache") -> "LdCache":
        """A missing or unusable cache is an empty one, exactly as ld.so treats it.

        One parse per file version per process: a check asks for it several times (the
        host's roots, the NVML probe, each resolver), and each parse would read and check
        the whole file again.  ldconfig replaces the file (a new inode and mtime), which
        cache_stamp sees."""
        stamp = cache_stamp(path)
        known = _LOADED.get(path)
        if stamp is not None and known is not None and known[0] == stamp:
            return known[1]
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError:
            return cls([], "missing", path)
        try:
            if data.startswith(MAGIC_NEW):  # what ldconfig writes: validated now, decoded on use
                table = _NewTable(data, 0)
                loaded = cls(None, "new", path, table.subdirs, table)
            else:
                entries, names, fmt = _parse(data)
                loaded = cls(entries, fmt, path, names)
        except BadInput:
            loaded = cls([], "corrupt", path)
        if stamp is not None:
            if len(_LOADED) > 16:
                _LOADED.clear()
            _LOADED[path] = (stamp, loaded)
        return loaded

    def lookup(self, name: str, abi: str = "x86_64", hwcaps_priority: dict | None = None,
               hwcap_bits: int = 0, platform: str | None = None) -> str | None:
        """The path ld.so would take from the cache for NEEDED ``name``, or None.

        ``hwcaps_priority``: glibc-hwcaps subdirectory name -> priority (higher wins), only
        the subdirectories usable on this CPU.  ``hwcap_bits``: legacy dl_hwcap & mask.
        """
        count, name_at, entry_at = self._reader()
        want_flags = ABI_FLAGS.get(abi)
        if want_flags is None:
            return None
        middle = self._first_named(name, count, name_at)
        if middle is None:
            return None
        priorities = hwcaps_priority or {}
        return self._select(entry_at, count, middle, name, want_flags, self._index_priorities(priorities),
                            hwcap_bits, platform, isa_1_from_hwcaps(priorities))

    def lists(self, name: str) -> bool:
        """Does an entry of the cache, of any ABI, carry the name ``name``?  Found as lookup
        finds it, by a binary search that decodes a handful of names, not by decoding
        every entry of the cache, which a short command would pay for one answer."""
        count, name_at, _entry_at = self._reader()
        return self._first_named(name, count, name_at) is not None

    @staticmethod
    def _first_named(name: str, count: int, name_at) -> int | None:
        """The index of the first entry whose name compares equal to ``name``
        (_dl_cache_libcmp), by binary search, or None."""
        left, right = 0, count - 1
        while left <= right:
            middle = (left + right) // 2
            cmp = libcmp(name, name_at(middle))
            if cmp == 0:
                while middle > 0 and libcmp(name, name_at(middle - 1)) == 0:
                    middle -= 1
                return middle
            # ldconfig sorts entries in descending _dl_cache_libcmp order.
            if cmp < 0:
                left = middle + 1
            else:
                right = middle - 1
        return None

    def _index_priorities(self, priorities: dict) -> list:
        key = tuple(sorted(priorities.items()))
        merged = self._merged.get(key)
        if merged is None:
            merged = self._merged[key] = hwcaps_index_priorities(self.hwcaps_names, priorities)
        return merged

    @staticmethod
    def _select(entry_at, count, start, name, want_flags, index_priority, hwcap_bits, platform, isa_1):
        platform_bit = None
        if platform in X86_PLATFORMS:
            platform_bit = 1 << (48 + X86_PLATFORMS.index(platform))
        exclude = ~(hwcap_bits | HWCAP_PLATFORM_MASK | HWCAP_TLS)
        best, best_priority = None, 0
        for index in range(start, count):
            entry = entry_at(index)
            if libcmp(name, entry.name) != 0:
                break
            if entry.flags != want_flags:
                continue
            named = is_hwcaps_extension(entry.hwcap)
            priority = 0
            if named:
                index = entry.hwcap & 0xFFFFFFFF  # glibc_hwcaps_priority(): past the list is 0
                priority = index_priority[index] if index < len(index_priority) else 0
                if not priority:
                    continue  # not usable on this CPU, or its name never matched (priority 0)
                # search_cache() (elf/dl-cache.c, 2.36) skips a glibc-hwcaps entry whose
                # recorded ISA level this CPU lacks, and only those: plain entries carry none.
                if not isa_level_compatible(entry.hwcap, isa_1):
                    continue
            if not named and best is not None:
                break
            if not named and entry.hwcap & exclude:
                continue
            plat = entry.hwcap & HWCAP_PLATFORM_MASK
            if not named and plat and plat != platform_bit:
                continue
            if named:
                if best is not None and priority <= best_priority:
                    continue
                best_priority = priority
            best = entry.path
            if not named:
                break  # flags already equal the ABI's default id: nothing better follows
        return best


def hwcaps_index_priorities(names: list, priorities: dict) -> list:
    """The priority of each index into the cache's glibc-hwcaps name list (0: never use).

    glibc_hwcaps_priorities_init() (elf/dl-cache.c; the same in 2.33, 2.36 and master) does not look each
    name up: it walks the cache's list and the usable subdirectories (sorted by name,
    sort_priorities_by_name in elf/dl-hwcaps.c) side by side, as a merge of two sorted
    lists, comparing bytes then length (glibc_hwcaps_compare), which is Python's bytes order.
    A name the walk steps past gets 0 even if it is usable, which happens when the list is
    out of order: ldconfig writes it sorted, but in a compat cache ld.so reads every name at
    the wrong offset (glibc_hwcaps_compare adds the index to the file start, ldconfig's
    write_extensions made it relative to the new-format table), so the names it compares are
    whatever strings lie there, in no order.  ``priorities``: name -> priority, higher wins.
    """
    def key(text):
        return text.encode("utf-8", "surrogateescape")

    right = sorted((key(n), p) for n, p in priorities.items())
    result = [0] * len(names)
    i = j = 0
    while i < len(names) and j < len(right):
        if names[i] is None:  # an index no name was read for (only in caches built by hand)
            i += 1
            continue
        left = key(names[i])
        if left == right[j][0]:
            result[i] = right[j][1]
            i += 1
            j += 1
        elif left < right[j][0]:
            i += 1
        else:
            j += 1
    return result


def _string(data: bytes, base: int, offset: int) -> str:
    start = base + offset
    if offset < 0 or start >= len(data):
        raise BadInput("ld.so.cache: string offset out of range")
    end = data.find(b"\0", start)
    if end < 0:
        raise BadInput("ld.so.cache: unterminated string")
    return data[start:end].decode("utf-8", "surrogateescape")


def parse(data: bytes) -> tuple:
    """(entries, format) from the bytes of a cache file; BadInput if it is not one."""
    entries, _names, fmt = _parse(data)
    return entries, fmt


def _parse(data: bytes) -> tuple:
    """(entries, the glibc-hwcaps subdirectory names in file order, format)."""
    if data.startswith(MAGIC_NEW):
        return (*_parse_new(data, 0), "new")
    if data.startswith(MAGIC_OLD):
        if len(data) < OLD_HEADER.size:
            raise BadInput("ld.so.cache: truncated header")
        _magic, nlibs = OLD_HEADER.unpack_from(data, 0)
        if (len(data) - OLD_HEADER.size) // OLD_ENTRY.size < nlibs:
            raise BadInput("ld.so.cache: entry count exceeds file size")
        end_old = OLD_HEADER.size + nlibs * OLD_ENTRY.size
        new_start = (end_old + 7) & ~7  # ALIGN_CACHE: __alignof__ (struct cache_file_new)
        if data[new_start:new_start + len(MAGIC_NEW)] == MAGIC_NEW:
            return (*_parse_new(data, new_start), "old+new")
        entries = []
        for index in range(nlibs):
            flags, key, value = OLD_ENTRY.unpack_from(data, OLD_HEADER.size + index * OLD_ENTRY.size)
            entries.append(CacheEntry(_string(data, end_old, key), _string(data, end_old, value),
                                      flags, 0, None))
        return entries, [], "old"
    raise BadInput("ld.so.cache: unknown format")


def _parse_new(data: bytes, base: int) -> tuple:
    """(entries, glibc-hwcaps names) of the new-format table at ``base``."""
    table = _NewTable(data, base)
    return [table.entry(index) for index in range(table.count)], table.subdirs


class _NewTable:
    """A new-format entry table, checked at once exactly as _parse_new checks it (BadInput
    for the same files), its entries decoded on use.  A lookup is a binary search that
    decodes a handful of names; decoding every entry up front would cost each short
    command (`seedance ldd`) the whole cache for the few names it asks about
    (bench/bench_check_speed.py --ldd times it)."""

    def __init__(self, data: bytes, base: int):
        if len(data) - base < NEW_HEADER.size:
            raise BadInput("ld.so.cache: truncated header")
        _magic, nlibs, _len_strings, flags, ext_offset = NEW_HEADER.unpack_from(data, base)
        if (len(data) - base - NEW_HEADER.size) // NEW_ENTRY.size < nlibs:
            raise BadInput("ld.so.cache: entry count exceeds file size")
        if flags == 3:  # cache_file_new_matches_endian: 2 little, 3 big, 0/1 unknown
            raise BadInput("ld.so.cache: big-endian cache")
        self.subdirs = _hwcaps_names(data, base, ext_offset)
        start = base + NEW_HEADER.size
        self.rows = list(NEW_ENTRY.iter_unpack(data[start:start + nlibs * NEW_ENTRY.size]))
        # _string refuses a string that starts past the end or has no NUL after its start,
        # i.e. one starting after the last NUL of the file: the furthest start decides.
        if self.rows:
            _flags, keys, values, _osv, _hwcap = zip(*self.rows)
            furthest = base + max(max(keys), max(values))
            if furthest > data.rfind(b"\0"):
                raise BadInput("ld.so.cache: string offset out of range or unterminated")
        self.count = nlibs
        self.data, self.base = data, base
        self._names: dict = {}
        self._entries: dict = {}

    def name(self, index: int) -> str:
        name = self._names.get(index)
        if name is None:
            name = self._names[index] = _string(self.data, self.base, self.rows[index][1])
        return name

    def entry(self, index: int) -> CacheEntry:
        entry = self._entries.get(index)
        if entry is None:
            e_flags, _key, value, _osv, hwcap = self.rows[index]
            subdir = None
            if is_hwcaps_extension(hwcap):
                idx = hwcap & 0xFFFFFFFF
                subdir = self.subdirs[idx] if idx < len(self.subdirs) else None
            entry = self._entries[index] = CacheEntry(self.name(index), _string(self.data, self.base, value),
                                                      e_flags, hwcap, subdir)
        return entry


def _hwcaps_names(data: bytes, _base: int, ext_offset: int) -> list:
    """The glibc-hwcaps subdirectory names from the cache extension section, if any.

    Unlike entry strings, the extension offset, its section offsets and the name offsets
    count from the start of the file, even in the old+new layout (dl-cache.h
    cache_extension_load(cache_new, cache, ...); dl-cache.c glibc_hwcaps_compare).
    """
    base = 0
    if not ext_offset or base + ext_offset + 8 > len(data):
        return []
    magic, count = struct.unpack_from("<II", data, base + ext_offset)
    if magic != EXT_MAGIC:
        return []
    names = []
    for index in range(min(count, 64)):
        pos = base + ext_offset + 8 + index * 16
        if pos + 16 > len(data):
            break
        tag, _flags, offset, size = struct.unpack_from("<IIII", data, pos)
        if tag != EXT_TAG_GLIBC_HWCAPS or base + offset + size > len(data):
            continue
        for item in range(size // 4):
            (str_off,) = struct.unpack_from("<I", data, base + offset + 4 * item)
            names.append(_string(data, base, str_off))
    return names


_LOADED: dict = {}  # path -> (cache_stamp, LdCache)


def cache_stamp(path: str):
    """What invalidates a parsed cache: ldconfig rewrites the file (new inode, mtime)."""
    try:
        st = inputs.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
