"""Rename DT_NEEDED entries (with their .gnu.version_r records) inside .dynstr, in place.

patchelf --replace-needed always appends a new .dynstr and usually a new PT_LOAD, so even a
same-length rename grows the file by a page or more.  When the new name fits where the old
one was (or already exists somewhere in .dynstr), nothing needs to move: only the string
bytes, or the 4/8-byte offsets pointing at them, change.  That keeps the file the same size,
and a second run finds nothing to do, so repeated runs never grow a file.

What is renamed together, because ld.so checks them together (glibc elf/dl-version.c):
  - the DT_NEEDED string;
  - vn_file of the .gnu.version_r record for that library;
  - optionally vna_name of that record's version nodes (e.g. "libcudart.so.12" ->
    "libcudart.so.13"), with vna_hash recomputed with the SysV ELF hash, since
    match_symbol() compares the hash before the name.

A string is overwritten only when every reference into its bytes (including suffix-shared
references: ld merges "bar" into the tail of "libbar") belongs to the rename; otherwise an
existing identical string is reused, or the caller falls back to LIEF.
"""
from __future__ import annotations

import array
import bisect
import errno
import hashlib
import os
import struct
import sys

from ..model.errors import ELFError
from ..model.record import FrozenRecord, Record, set_fields
from .atomic import file_identity

DT_NULL, DT_NEEDED, DT_HASH, DT_STRTAB, DT_SYMTAB, DT_STRSZ = 0, 1, 4, 5, 6, 10
DT_SONAME, DT_RPATH, DT_RUNPATH = 14, 15, 29
DT_GNU_HASH = 0x6FFFFEF5
DT_VERDEF, DT_VERDEFNUM, DT_VERNEED, DT_VERNEEDNUM = 0x6FFFFFFC, 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF
DT_VERSYM = 0x6FFFFFF0
# Dynamic tags whose value is an offset into the dynamic string table.
STRING_TAGS = {DT_NEEDED: "needed", DT_SONAME: "soname", DT_RPATH: "rpath", DT_RUNPATH: "runpath",
               0x7FFFFFFD: "auxiliary", 0x7FFFFFFF: "filter", 0x6FFFFEFA: "config",
               0x6FFFFEFB: "depaudit", 0x6FFFFEFC: "audit"}
SHT_DYNSYM = 11
MAX_ENTRIES = 1 << 20


def elf_hash(name: bytes) -> int:
    """The SysV ELF hash (gABI), which vna_hash/vda_hash carry."""
    h = 0
    for byte in name:
        h = ((h << 4) + byte) & 0xFFFFFFFF
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
        h &= ~g & 0xFFFFFFFF
    return h


class StrRef(Record):
    """A field in the file that holds an offset into .dynstr."""
    _fields = ("field_off", "size", "value", "role", "hash_off", "owner")

    def __init__(self, field_off: int, size: int, value: int, role: str, hash_off: int | None = None,
                 owner: str | None = None):
        self.field_off = field_off  # file offset of the offset value
        self.size = size  # 4 or 8 bytes
        self.value = value  # the offset into .dynstr it holds now
        self.role = role  # needed, soname, vn_file, vna_name, vda_name, dynsym, ...
        self.hash_off = hash_off  # vna_name: file offset of its vna_hash
        self.owner = owner  # vna_name: the vn_file it belongs to


class DynLayout:
    """Where .dynstr is and every reference into it, read from program headers and PT_DYNAMIC."""

    def __init__(self, data: bytes, path: str = "<bytes>"):
        self.data = data
        self.path = path
        if data[:4] != b"\x7fELF" or len(data) < 64:
            raise ELFError(f"{path}: not an ELF file")
        cls, enc = data[4], data[5]
        if cls not in (1, 2) or enc not in (1, 2):
            raise ELFError(f"{path}: bad ELF class or data encoding")
        self.is64 = cls == 2
        self.end = "<" if enc == 1 else ">"
        self.word = 8 if self.is64 else 4
        try:
            self._parse()
        except (struct.error, IndexError, ValueError) as exc:
            raise ELFError(f"{path}: malformed ELF ({exc})") from None

    def _u(self, fmt: str, off: int) -> tuple:
        if off < 0 or off + struct.calcsize(self.end + fmt) > len(self.data):
            raise ELFError(f"{self.path}: structure at {off:#x} runs past the end of the file")
        return struct.unpack_from(self.end + fmt, self.data, off)

    def _parse(self) -> None:
        if self.is64:
            (phoff, shoff) = self._u("QQ", 0x20)
            (phentsize, phnum, shentsize, shnum) = self._u("HHHH", 0x36)
        else:
            (phoff, shoff) = self._u("II", 0x1C)
            (phentsize, phnum, shentsize, shnum) = self._u("HHHH", 0x2A)
        self.shoff = shoff
        self.all_headers = []  # (p_type, p_offset, p_filesz) of every program header
        self.loads = []
        self.load_headers = []  # (header file offset, p_flags, p_offset, p_vaddr, p_filesz, p_memsz)
        dyn = None
        for i in range(min(phnum, 4096)):
            off = phoff + i * phentsize
            if self.is64:
                p_type, p_flags, p_offset, p_vaddr, _pa, p_filesz, p_memsz, _al = self._u("IIQQQQQQ", off)
            else:
                p_type, p_offset, p_vaddr, _pa, p_filesz, p_memsz, p_flags, _al = self._u("IIIIIIII", off)
            self.all_headers.append((p_type, p_offset, p_filesz))
            if p_type == 1:
                self.loads.append((p_vaddr, p_offset, p_filesz))
                self.load_headers.append((off, p_flags, p_offset, p_vaddr, p_filesz, p_memsz))
            elif p_type == 2:
                dyn = (p_offset, p_filesz)
        if dyn is None:
            raise ELFError(f"{self.path}: no PT_DYNAMIC (a static executable has no NEEDED entries)")
        entsize = 16 if self.is64 else 8
        fmt = "qQ" if self.is64 else "iI"
        self.dynamic = []  # (file offset of entry, tag, value)
        tags = {}
        for i in range(min(dyn[1] // entsize, MAX_ENTRIES)):
            off = dyn[0] + i * entsize
            tag, val = self._u(fmt, off)
            if tag == DT_NULL:
                break
            self.dynamic.append((off, tag, val))
            tags.setdefault(tag, val)
        self.tags = tags
        if DT_STRTAB not in tags or DT_STRSZ not in tags:
            raise ELFError(f"{self.path}: PT_DYNAMIC has no string table")
        self.strtab_off = self.vaddr_to_offset(tags[DT_STRTAB])
        self.strtab_size = tags[DT_STRSZ]
        if self.strtab_off + self.strtab_size > len(self.data):
            raise ELFError(f"{self.path}: .dynstr runs past the end of the file")
        self.refs: list[StrRef] = []
        self.dynsym_names: list = []  # sorted .dynstr offsets of the dynamic symbols' names
        self.vna_names: dict = {}  # vna_other (the versym index) -> .dynstr offset of its name
        self.symtab = None  # (file offset, count, entry size) of the dynamic symbol table
        for off, tag, val in self.dynamic:
            if tag in STRING_TAGS:
                self.refs.append(StrRef(off + self.word, self.word, val, STRING_TAGS[tag]))
        if DT_VERNEED in tags:
            self._verneed(self.vaddr_to_offset(tags[DT_VERNEED]), tags.get(DT_VERNEEDNUM, 0))
        if DT_VERDEF in tags:
            self._verdef(self.vaddr_to_offset(tags[DT_VERDEF]), tags.get(DT_VERDEFNUM, 0))
        self._dynsym(phoff, shoff, shentsize, shnum)

    def vaddr_to_offset(self, vaddr: int) -> int:
        for p_vaddr, p_offset, p_filesz in self.loads:
            if p_vaddr <= vaddr < p_vaddr + p_filesz:
                return vaddr - p_vaddr + p_offset
        raise ELFError(f"{self.path}: address {vaddr:#x} is in no PT_LOAD segment")

    def _verneed(self, off: int, count: int) -> None:
        for _ in range(min(count, MAX_ENTRIES)):
            _ver, cnt, file_off, aux, nxt = self._u("HHIII", off)
            file_name = self.string(file_off)
            self.refs.append(StrRef(off + 4, 4, file_off, "vn_file"))
            aux_off = off + aux
            for _ in range(min(cnt, MAX_ENTRIES)):
                _hash, _flags, other, name_off, aux_next = self._u("IHHII", aux_off)
                self.refs.append(StrRef(aux_off + 8, 4, name_off, "vna_name", hash_off=aux_off,
                                        owner=file_name))
                self.vna_names[other & 0x7FFF] = name_off
                if not aux_next:
                    break
                aux_off += aux_next
            if not nxt:
                break
            off += nxt

    def _verdef(self, off: int, count: int) -> None:
        for _ in range(min(count, MAX_ENTRIES)):
            _ver, _flags, _ndx, cnt, _hash, aux, nxt = self._u("HHHHIII", off)
            aux_off = off + aux
            for _ in range(min(cnt, MAX_ENTRIES)):
                name_off, aux_next = self._u("II", aux_off)
                self.refs.append(StrRef(aux_off, 4, name_off, "vda_name"))
                if not aux_next:
                    break
                aux_off += aux_next
            if not nxt:
                break
            off += nxt

    def _dynsym(self, phoff: int, shoff: int, shentsize: int, shnum: int) -> None:
        """Symbol names live in .dynstr too; a shared tail must not be overwritten."""
        count = None
        self.sections = []  # (header file offset, sh_type, sh_offset, sh_addr, sh_size)
        if shoff and shnum and shentsize:
            for i in range(min(shnum, 65536)):
                off = shoff + i * shentsize
                if self.is64:
                    _name, sh_type, _fl, sh_addr, sh_offset, sh_size, _l, _i, sh_align, sh_entsize = \
                        self._u("IIQQQQIIQQ", off)
                else:
                    _name, sh_type, _fl, sh_addr, sh_offset, sh_size, _l, _i, sh_align, sh_entsize = \
                        self._u("IIIIIIIIII", off)
                self.sections.append((off, sh_type, sh_offset, sh_addr, sh_size, sh_align))
                if sh_type == SHT_DYNSYM and sh_entsize and count is None:
                    count = sh_size // sh_entsize
        if count is None and DT_HASH in self.tags:
            count = self._u("II", self.vaddr_to_offset(self.tags[DT_HASH]))[1]
        if count is None and DT_GNU_HASH in self.tags:
            count = self._gnu_hash_count(self.vaddr_to_offset(self.tags[DT_GNU_HASH]))
        if not count or DT_SYMTAB not in self.tags:
            return
        symoff = self.vaddr_to_offset(self.tags[DT_SYMTAB])
        entsize = 24 if self.is64 else 16
        count = min(count, MAX_ENTRIES)
        if symoff < 0 or symoff + count * entsize > len(self.data):
            raise ELFError(f"{self.path}: structure at {symoff:#x} runs past the end of the file")
        # st_name is the first 4 bytes of each entry.  Only the set of offsets matters (no
        # rename ever targets a symbol name), so read them as one array: a Python object per
        # symbol is too many for a library such as libtorch_cpu.so, with its hundreds of
        # thousands of dynamic symbols.
        self.symtab = (symoff, count, entsize)
        names = array.array("I")
        names.frombytes(bytes(self.data[symoff:symoff + count * entsize]))
        if (self.end == "<") != (sys.byteorder == "little"):
            names.byteswap()
        self.dynsym_names = sorted(set(names[::entsize // 4]) - {0})

    def undefined_symbols(self) -> list:
        """(name, version or None, weak) of every undefined non-local dynamic symbol.

        What the relinker's refusal check needs (the symbols a library binds elsewhere), read
        from the raw table: seedance.elf.reader builds an object for every one of
        libtorch_cpu.so's hundreds of thousands of symbols, and most are defined ones."""
        if self.symtab is None:
            return []
        symoff, count, entsize = self.symtab
        fmt = struct.Struct(self.end + ("IBBHQQ" if self.is64 else "IIIBBH"))
        versym = array.array("H")
        if DT_VERSYM in self.tags:
            off = self.vaddr_to_offset(self.tags[DT_VERSYM])
            if 0 <= off and off + 2 * count <= len(self.data):
                versym.frombytes(bytes(self.data[off:off + 2 * count]))
                if (self.end == "<") != (sys.byteorder == "little"):
                    versym.byteswap()
        if entsize != fmt.size:
            raise ELFError(f"{self.path}: unexpected dynamic symbol size {entsize}")
        table = bytes(self.data[symoff:symoff + count * entsize])
        out = []
        name_at, info_at = (0, 1) if self.is64 else (0, 3)
        shndx_at = 3 if self.is64 else 5
        for index, fields in enumerate(fmt.iter_unpack(table)):
            if fields[shndx_at] != 0 or not fields[name_at] or fields[info_at] >> 4 == 0:
                continue  # defined, nameless (entry 0) or STB_LOCAL
            name, info = fields[name_at], fields[info_at]
            ver = versym[index] & 0x7FFF if versym else 0
            version = self.string(self.vna_names[ver]) if ver > 1 and ver in self.vna_names else None
            out.append((self.string(name), version, info >> 4 == 2))  # STB_WEAK
        return out

    def referenced_between(self, low: int, high: int) -> bool:
        """Whether a symbol name starts at a .dynstr offset in [low, high]."""
        i = bisect.bisect_left(self.dynsym_names, low)
        return i < len(self.dynsym_names) and self.dynsym_names[i] <= high

    def _gnu_hash_count(self, off: int) -> int:
        nbuckets, symoffset, bloom_size, _shift = self._u("IIII", off)
        buckets = off + 16 + bloom_size * self.word
        chains = buckets + nbuckets * 4
        last = 0
        for i in range(min(nbuckets, MAX_ENTRIES)):
            last = max(last, self._u("I", buckets + i * 4)[0])
        if last < symoffset:
            return symoffset
        while True:
            (h,) = self._u("I", chains + (last - symoffset) * 4)
            if h & 1:
                return last + 1
            last += 1

    def string(self, offset: int) -> str:
        return self.string_bytes(offset).decode("utf-8", "replace")

    def string_bytes(self, offset: int) -> bytes:
        if offset >= self.strtab_size:
            raise ELFError(f"{self.path}: string offset {offset:#x} outside .dynstr")
        start = self.strtab_off + offset
        end = self.data.find(b"\0", start, self.strtab_off + self.strtab_size)
        if end < 0:
            raise ELFError(f"{self.path}: unterminated string in .dynstr")
        return bytes(self.data[start:end])

    def needed(self) -> list:
        return [self.string(r.value) for r in self.refs if r.role == "needed"]


class Patch(FrozenRecord):
    """Bytes to write at an offset of the file."""
    _fields = ("offset", "data")

    def __init__(self, offset: int, data: bytes):
        set_fields(self, {"offset": offset, "data": data})


class EditPlan(Record):
    """The byte patches of a rename that fits, with what they change."""
    _fields = ("patches", "changes", "strategy")

    def __init__(self, patches: list, changes: list, strategy: str):
        self.patches = patches  # of Patch
        self.changes = changes  # human-readable "role: old -> new"
        self.strategy = strategy  # "in-place", "reuse", "in-place+reuse", "none"


def plan_rename(layout: DynLayout, needed_renames: dict, version_renames: dict | None = None) -> EditPlan | None:
    """Byte patches that rename NEEDED entries without growing the file, or None if impossible.

    ``needed_renames``: old NEEDED name -> new name.  ``version_renames``: old version node
    name -> new one, applied only to the version_r records of renamed libraries.
    """
    wanted = [(ref, new) for ref, new in _wanted(layout, needed_renames, version_renames or {})
              if layout.string_bytes(ref.value) != new]  # (ref, new string bytes)
    if not wanted:
        return EditPlan([], [], "none")

    # group by the string each reference points at now
    groups: dict = {}
    for ref, new in wanted:
        groups.setdefault(ref.value, []).append((ref, new))
    wanted_ids = {id(ref) for ref, _ in wanted}
    table = bytes(layout.data[layout.strtab_off:layout.strtab_off + layout.strtab_size])

    overwrites = {}  # old offset -> new bytes
    repoints = []  # (ref, new offset)
    for offset, members in groups.items():
        news = {new for _, new in members}
        old = layout.string_bytes(offset)
        reuse = {new: _find_string(table, new) for new in news}
        if all(pos is not None for pos in reuse.values()):
            repoints.extend((ref, reuse[new]) for ref, new in members)
            continue
        foreign = [r for r in layout.refs
                   if offset <= r.value <= offset + len(old) and id(r) not in wanted_ids]
        foreign += ["dynsym"] if layout.referenced_between(offset, offset + len(old)) else []
        if len(news) == 1 and not foreign and len(next(iter(news))) <= len(old):
            overwrites[offset] = next(iter(news))
            continue
        # two wanted names share one string, or someone else shares it: reuse what exists
        for ref, new in members:
            if reuse[new] is None:
                return None
            repoints.append((ref, reuse[new]))

    # a reused string must not sit in bytes that an overwrite is about to change
    for ref, pos in repoints:
        for offset, new in overwrites.items():
            old_len = len(layout.string_bytes(offset))
            if offset <= pos <= offset + old_len:
                return None

    patches, changes = [], []
    fmt = {4: "I", 8: "Q"}
    for offset, new in overwrites.items():
        old_len = len(layout.string_bytes(offset))
        patches.append(Patch(layout.strtab_off + offset, new + b"\0" * (old_len + 1 - len(new))))
        for ref, _ in groups[offset]:
            changes.append(f"{ref.role}: {layout.string(offset)} -> {new.decode()}")
            if ref.hash_off is not None:
                patches.append(Patch(ref.hash_off, struct.pack(layout.end + "I", elf_hash(new))))
    for ref, pos in repoints:
        new = layout.string_bytes(pos)
        patches.append(Patch(ref.field_off, struct.pack(layout.end + fmt[ref.size], pos)))
        changes.append(f"{ref.role}: {layout.string(ref.value)} -> {new.decode()}")
        if ref.hash_off is not None:
            patches.append(Patch(ref.hash_off, struct.pack(layout.end + "I", elf_hash(new))))
    strategy = "+".join(name for name, used in (("in-place", overwrites), ("reuse", repoints)) if used)
    return EditPlan(patches, changes, strategy)


def plan_relocated(layout: DynLayout, needed_renames: dict, version_renames: dict | None = None,
                   page: int = 0x1000) -> EditPlan | None:
    """Zero growth for names that do not fit: move .dynstr into the slack after a segment.

    A read-only PT_LOAD usually ends well before the page where the next segment starts
    (-z separate-code layouts); that file gap is zero padding.  A copy of .dynstr with the
    new names appended goes there, the segment is extended over it, and DT_STRTAB/DT_STRSZ
    and the .dynstr section header are pointed at it, so strip/objcopy still see a proper
    section.  The old .dynstr bytes become dead space.  None when there is no such gap.
    """
    wanted = _wanted(layout, needed_renames, version_renames or {})
    if not wanted:
        return EditPlan([], [], "none")
    old_table = bytes(layout.data[layout.strtab_off:layout.strtab_off + layout.strtab_size])
    table, new_offsets = _extended_table(old_table, wanted)
    section = next((s for s in layout.sections if s[1] == 3 and s[2] == layout.strtab_off), None)
    loads = sorted(layout.load_headers, key=lambda h: h[2])
    occupied = [(s[2], s[2] + s[4]) for s in layout.sections if s[1] != 8 and s[4]]  # not NOBITS
    for i, (hdr_off, flags, p_offset, p_vaddr, p_filesz, p_memsz) in enumerate(loads):
        if flags & 2 or p_filesz != p_memsz or i + 1 >= len(loads):
            continue  # writable or with .bss: extending it would change what is zero-filled
        nxt = loads[i + 1]
        start = (p_offset + p_filesz + 7) & ~7
        end = start + len(table)
        gap_end = min(nxt[2], p_offset + ((nxt[3] - p_vaddr) & ~(page - 1)))
        if end > gap_end or end > len(layout.data):
            continue
        if any(a < end and start < b for a, b in occupied):
            continue
        if any(layout.data[start:end]):
            continue  # not padding
        new_vaddr = p_vaddr + (start - p_offset)
        pack = layout.end + ("Q" if layout.is64 else "I")
        patches = [Patch(start, bytes(table))]
        new_filesz = end - p_offset
        if layout.is64:
            patches.append(Patch(hdr_off + 32, struct.pack(layout.end + "QQ", new_filesz, new_filesz)))
        else:
            patches.append(Patch(hdr_off + 16, struct.pack(layout.end + "II", new_filesz, new_filesz)))
        for off, tag, _val in layout.dynamic:
            if tag == DT_STRTAB:
                patches.append(Patch(off + layout.word, struct.pack(pack, new_vaddr)))
            elif tag == DT_STRSZ:
                patches.append(Patch(off + layout.word, struct.pack(pack, len(table))))
        if section is not None:
            sh_off = section[0]
            if layout.is64:
                patches.append(Patch(sh_off + 16, struct.pack(layout.end + "QQQ", new_vaddr, start, len(table))))
            else:
                patches.append(Patch(sh_off + 12, struct.pack(layout.end + "III", new_vaddr, start, len(table))))
        changes = []
        fmt = {4: "I", 8: "Q"}
        for ref, new in wanted:
            pos = new_offsets[new]
            patches.append(Patch(ref.field_off, struct.pack(layout.end + fmt[ref.size], pos)))
            changes.append(f"{ref.role}: {layout.string(ref.value)} -> {new.decode()}")
            if ref.hash_off is not None:
                patches.append(Patch(ref.hash_off, struct.pack(layout.end + "I", elf_hash(new))))
        return EditPlan(patches, changes, "moved-dynstr")
    return None


def plan_appended(layout: DynLayout, needed_renames: dict, version_renames: dict | None = None) -> tuple | None:
    """The growing path, kept smaller than patchelf's: extend the last (RW) PT_LOAD.

    When no segment has slack, the new .dynstr (a copy plus the new names) goes right after
    the last loaded byte: the last PT_LOAD's .bss range is written out as zeros (it is
    zero-initialised memory either way), the table follows, and the segment is extended
    over both.  Only the non-loaded tail (.comment, .symtab, the section header table)
    moves, so no program header has to be added, unlike patchelf, which makes room for a
    new PT_LOAD.  Returns (new bytes, changes) or None when the layout is not the usual one.
    """
    wanted = _wanted(layout, needed_renames, version_renames or {})
    if not wanted:
        return None
    loads = sorted(layout.load_headers, key=lambda h: h[3])
    if not loads:
        return None
    hdr_off, _flags, p_offset, p_vaddr, p_filesz, p_memsz = loads[-1]
    insert = p_offset + p_filesz
    if any(h[2] + h[4] > insert for h in layout.load_headers):
        return None  # another segment's bytes lie after the last one's: not the usual layout
    if any(p_type != 1 and filesz and off + filesz > insert for p_type, off, filesz in layout.all_headers):
        return None
    if any(s[1] != 8 and s[2] < insert < s[2] + s[4] for s in layout.sections):
        return None  # a section straddles the insertion point
    section = next((s for s in layout.sections if s[1] == 3 and s[2] == layout.strtab_off), None)
    table, new_offsets = _extended_table(layout.data[layout.strtab_off:layout.strtab_off + layout.strtab_size],
                                         wanted)
    bss = p_memsz - p_filesz
    shifted = [s for s in layout.sections if s[1] != 8 and s[2] >= insert and s[4]]
    align = max([s[5] for s in shifted] + [8 if layout.is64 else 4, 1])
    grow = bss + len(table)
    delta = (grow + align - 1) // align * align
    table_off = insert + bss
    table_vaddr = p_vaddr + p_memsz
    # one buffer, one copy of the original: slicing an mmap and concatenating copies the
    # whole library once per slice, and a CUDA or torch library runs to hundreds of MB
    size = len(layout.data)
    data = bytearray(size + delta)
    view = memoryview(data)
    view[:insert] = memoryview(layout.data)[:insert]
    view[table_off:table_off + len(table)] = table  # the .bss range and padding stay zero
    view[insert + delta:] = memoryview(layout.data)[insert:]
    view.release()
    word = "Q" if layout.is64 else "I"
    end = layout.end

    def put(offset: int, fmt: str, *values) -> None:
        struct.pack_into(end + fmt, data, offset, *values)

    new_size = p_memsz + len(table)
    put(hdr_off + (32 if layout.is64 else 16), word * 2, new_size, new_size)
    for off, tag, _val in layout.dynamic:
        if tag == DT_STRTAB:
            put(off + layout.word, word, table_vaddr)
        elif tag == DT_STRSZ:
            put(off + layout.word, word, len(table))
    if layout.shoff and layout.shoff >= insert:
        put(0x28 if layout.is64 else 0x20, word, layout.shoff + delta)
    shdr_shift = delta if layout.shoff and layout.shoff >= insert else 0
    for sh in shifted:
        put(sh[0] + shdr_shift + (24 if layout.is64 else 16), word, sh[2] + delta)
    if section is not None:
        put(section[0] + shdr_shift + (16 if layout.is64 else 12), word * 3, table_vaddr, table_off, len(table))
    changes = []
    for ref, new in wanted:
        put(ref.field_off, {4: "I", 8: "Q"}[ref.size], new_offsets[new])
        changes.append(f"{ref.role}: {layout.string(ref.value)} -> {new.decode()}")
        if ref.hash_off is not None:
            put(ref.hash_off, "I", elf_hash(new))
    return data, changes


def _wanted(layout: DynLayout, needed_renames: dict, version_renames: dict) -> list:
    wanted = []
    for ref in layout.refs:
        text = layout.string(ref.value) if ref.role in ("needed", "vn_file", "vna_name") else None
        if ref.role in ("needed", "vn_file") and text in needed_renames:
            wanted.append((ref, needed_renames[text].encode()))
        elif ref.role == "vna_name" and ref.owner in needed_renames and text in version_renames:
            wanted.append((ref, version_renames[text].encode()))
    return wanted


def _extended_table(old_table, wanted) -> tuple:
    """(a copy of .dynstr with every new string present, new string -> its offset);
    a string already in the table (or the tail of one) is reused, not appended."""
    table = bytearray(old_table)
    if not table.endswith(b"\0"):
        table += b"\0"
    new_offsets = {}
    for _, new in wanted:
        if new not in new_offsets:
            pos = _find_string(bytes(table), new)
            if pos is None:
                pos = len(table)
                table += new + b"\0"
            new_offsets[new] = pos
    return table, new_offsets


def _find_string(table: bytes, new: bytes) -> int | None:
    """Offset of ``new`` as a NUL-terminated string (a whole string or a shared tail)."""
    needle = new + b"\0"
    pos = table.find(needle, 1 if new else 0)
    return pos if pos >= 0 else None


def apply_patches(data: bytes, patches: list) -> bytes:
    out = bytearray(data)
    for patch in patches:
        out[patch.offset:patch.offset + len(patch.data)] = patch.data
    return bytes(out)


class FileEdit(Record):
    """The planned edit of one file: byte patches over a copy, or LIEF's rebuilt bytes."""
    _fields = ("path", "strategy", "changes", "size_before", "patches", "data", "identity")

    def __init__(self, path: str, strategy: str, changes: list, size_before: int, patches: list | None = None,
                 data: bytes | None = None, identity: tuple | None = None):
        self.path = path
        self.strategy = strategy
        self.changes = changes
        self.size_before = size_before
        self.patches = patches
        self.data = data
        self.identity = identity  # atomic.file_identity() of the file planned from

    @property
    def growth(self) -> int:
        return (len(self.data) if self.data is not None else self.size_before) - self.size_before

    def fill(self, fd: int) -> str:
        """Write the edited file into ``fd``; returns the sha256 of what was written.

        The bytes are copied inside the kernel (copy_file_range: no page faults on a mapping
        and no copy through user space; bench/bench_relink.py times it against patchelf),
        the few patches are written over the copy, and each copied chunk is read back from
        ``fd`` and hashed in a second thread while the next chunk is copied: the digest is
        of the bytes in the file, taken while it is written, and nobody reads it again
        (a library of hundreds of MB is read once, not once per hash).  ``fd`` must be open for
        reading too (atomic.write_temp opens O_RDWR).  Where the kernel cannot copy between
        the two files, one pass over a read-only mapping does the same in user space.
        """
        filled = self.fill_deferred(fd)
        return filled if isinstance(filled, str) else filled.result()

    def fill_deferred(self, fd: int):
        """fill(), but it may return before the hash is done: the sha256 hex digest, or a
        pending one whose result() waits for it and returns it (raising what the hashing
        raised).  The journal verifies the temp meanwhile: the hash of a large result then
        overlaps the dlopen in a child instead of preceding it."""
        if self.data is not None:
            _write_all(fd, memoryview(self.data))
            return hashlib.sha256(self.data).hexdigest()
        src = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            before = os.fstat(src)
            if before.st_size != self.size_before:
                raise ELFError(f"{self.path}: changed size since the edit was planned")
            if self.identity is not None and file_identity(before) != tuple(self.identity):
                raise ELFError(f"{self.path}: changed since the edit was planned")
            patches = sorted(self.patches, key=lambda p: p.offset)
            filled = _kernel_copy(src, fd, self.size_before, patches)
            if filled is None:
                digest = hashlib.sha256()
                _mapped_copy(src, fd, self.size_before, patches, digest)
                filled = digest.hexdigest()
            after = os.fstat(src)
            if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
                if not isinstance(filled, str):
                    filled.abandon()
                raise ELFError(f"{self.path}: changed while it was copied")
        finally:
            os.close(src)
        return filled

    def result_info(self):
        """The ElfInfo of the edited file, without writing it anywhere: the patches go into a
        private copy-on-write mapping of the original (only the touched pages are copied)."""
        from ..elf import reader

        if self.data is not None:
            return reader._Parser(self.path, self.data).parse(False, False)
        import mmap

        src = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            mapped = mmap.mmap(src, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(src)
        try:
            for patch in self.patches:
                mapped[patch.offset:patch.offset + len(patch.data)] = patch.data
            return reader._Parser(self.path, mapped).parse(False, False)
        finally:
            mapped.close()


_CHUNK = 4 << 20
_COPY_CHUNK = 16 << 20  # per copy_file_range call: large enough that the calls cost nothing


def _write_all(fd: int, view) -> None:
    while view:
        view = view[os.write(fd, view):]


def _patch_range(patches: list, start: int, end: int):
    """(file offset, bytes) of the parts of ``patches`` that fall in [start, end)."""
    for patch in patches:
        if patch.offset < end and patch.offset + len(patch.data) > start:
            lo, hi = max(patch.offset, start), min(patch.offset + len(patch.data), end)
            yield lo, patch.data[lo - patch.offset:hi - patch.offset]


def _hash_range(digest, fd: int, start: int, end: int) -> None:
    """digest.update() with the bytes of ``fd`` in [start, end), read back (page cache)."""
    while start < end:
        block = os.pread(fd, min(end - start, 1 << 20), start)
        if not block:
            raise ELFError("the copy is shorter than the original")
        digest.update(block)
        start += len(block)


class ReadBackHash:
    """sha256 of ranges of a file read back from the page cache, in a thread, in the order
    given: add() each range once its bytes are final, then end(); result() waits and returns
    the hex digest.  It reads through its own descriptor (a dup), so the writer may close
    its own."""

    def __init__(self, fd: int):
        import queue
        import threading

        self.digest = hashlib.sha256()
        self.error = None
        self._fd = os.dup(fd)
        self._ranges = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                item = self._ranges.get()
                if item is None:
                    return
                if self.error is None:
                    _hash_range(self.digest, self._fd, *item)
        except BaseException as exc:
            self.error = exc
            while self._ranges.get() is not None:  # let the writer finish its puts
                pass
        finally:
            os.close(self._fd)

    def add(self, start: int, end: int) -> None:
        self._ranges.put((start, end))

    def end(self) -> None:
        self._ranges.put(None)

    def abandon(self) -> None:
        """Stop without a result (the write failed); waits for the thread."""
        self.error = self.error or ELFError("abandoned")
        self.end()
        self._thread.join()

    def result(self) -> str:
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.digest.hexdigest()


def _kernel_copy(src: int, fd: int, size: int, patches: list):
    """Copy [0, size) of ``src`` into ``fd`` with copy_file_range and patch it; returns the
    sha256 hex digest of the result (one chunk) or its ReadBackHash (ended, several chunks:
    hashed while the next is copied), or None, with nothing written, when the kernel
    cannot copy between these files (no copy_file_range, another filesystem, a filesystem
    that does not support it)."""
    copy = getattr(os, "copy_file_range", None)
    if copy is None:
        return None
    hasher = None
    try:
        for start in range(0, size, _COPY_CHUNK):
            end = min(start + _COPY_CHUNK, size)
            offset = start
            while offset < end:
                try:
                    n = copy(src, fd, end - offset, offset, offset)
                except OSError as exc:
                    # before the first byte, the kernel cannot copy between these: copy in user space
                    if offset == 0 and exc.errno in (errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP,
                                                     errno.ENOSYS):
                        return None
                    raise
                if n == 0:
                    if offset == 0:
                        return None  # a filesystem that reports nothing copied (procfs-like)
                    raise ELFError("the original ended early while it was copied")
                offset += n
            for at, data in _patch_range(patches, start, end):
                os.pwrite(fd, data, at)
            if end == size and hasher is None:
                # one chunk (most libraries): nothing to overlap, so no thread to start
                digest = hashlib.sha256()
                _hash_range(digest, fd, 0, size)
                return digest.hexdigest()
            if hasher is None:
                hasher = ReadBackHash(fd)
            hasher.add(start, end)  # hashed in the thread while the next chunk is copied
    except BaseException:
        if hasher is not None:
            hasher.abandon()
        raise
    if hasher is None:  # an empty file
        return hashlib.sha256().hexdigest()
    hasher.end()
    return hasher


def _mapped_copy(src: int, fd: int, size: int, patches: list, digest) -> None:
    """The same in user space: one pass over a read-only mapping of ``src``; each chunk is
    patched (only the few chunks a patch falls in are copied), hashed in a second thread
    and written (hashlib and write both release the GIL)."""
    import mmap
    from concurrent.futures import ThreadPoolExecutor

    mapped = mmap.mmap(src, 0, prot=mmap.PROT_READ)
    try:
        mapped.madvise(mmap.MADV_SEQUENTIAL)
        view = memoryview(mapped)
        with ThreadPoolExecutor(1) as hasher:
            for start in range(0, size, _CHUNK):
                end = min(start + _CHUNK, size)
                chunk = view[start:end]
                inside = list(_patch_range(patches, start, end))
                if inside:
                    patched = bytearray(chunk)
                    for at, data in inside:
                        patched[at - start:at - start + len(data)] = data
                    chunk.release()
                    chunk = memoryview(patched)
                hashed = hasher.submit(digest.update, chunk)
                try:
                    _write_all(fd, chunk)
                finally:
                    hashed.result()  # the chunk stays alive until both are done with it
                chunk.release()
        view.release()
    finally:
        mapped.close()


class MappedLayout:
    """A DynLayout over a read-only mapping of the file at ``path``, and that file's identity.

    One parse serves the relinker's refusal check (undefined_symbols) and the edit's plan:
    the dynamic symbol table of a large library is read once, not once for each."""

    def __init__(self, path: str):
        import mmap

        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise ELFError(f"{path}: {(exc.strerror or 'cannot open').lower()}") from None
        try:
            st = os.fstat(fd)
            if st.st_size < 64:
                raise ELFError(f"{path}: not an ELF file (too short)")
            self.mapped = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self.path, self.size, self.identity = path, st.st_size, file_identity(st)
        try:
            self.layout = DynLayout(self.mapped, path)
        except BaseException:
            self.mapped.close()
            raise

    def current(self) -> bool:
        """Whether the path still names the file this maps, unchanged."""
        try:
            return file_identity(os.stat(self.path)) == self.identity
        except OSError:
            return False

    def close(self) -> None:
        self.layout = None  # drops its references into the mapping first
        self.mapped.close()


def undefined_symbols(path: str, mapped: MappedLayout | None = None) -> list:
    """DynLayout.undefined_symbols() of the file at ``path`` (a read-only mapping of it)."""
    if mapped is not None:
        return mapped.layout.undefined_symbols()
    own = MappedLayout(path)
    try:
        return own.layout.undefined_symbols()
    finally:
        own.close()


def plan_file(path: str, needed_renames: dict, version_renames: dict | None = None,
              allow_lief: bool = True, mapped: MappedLayout | None = None) -> FileEdit:
    """Plan the rename for the file at ``path`` from a read-only mapping of it (``mapped``
    when it still maps the file at ``path``)."""
    own = None
    if mapped is None or not mapped.current():
        mapped = own = MappedLayout(path)
    try:
        layout, size, identity = mapped.layout, mapped.size, mapped.identity
        plan = plan_rename(layout, needed_renames, version_renames)
        if plan is None:
            plan = plan_relocated(layout, needed_renames, version_renames)
        if plan is not None:
            return FileEdit(path, plan.strategy, plan.changes, size, patches=plan.patches, identity=identity)
        appended = plan_appended(layout, needed_renames, version_renames)
        if appended is not None:
            return FileEdit(path, "appended", appended[1], size, data=appended[0], identity=identity)
        if not allow_lief:
            raise ELFError(f"{path}: the new names do not fit in .dynstr and LIEF is not allowed")
        data, strategy, changes = _rename_with_lief(bytes(mapped.mapped), needed_renames, version_renames or {},
                                                    path)
        return FileEdit(path, strategy, changes, size, data=data, identity=identity)
    finally:
        if own is not None:
            own.close()


def rename_needed_bytes(data: bytes, needed_renames: dict, version_renames: dict | None = None,
                        path: str = "<bytes>", allow_lief: bool = True) -> tuple:
    """Return (new bytes, strategy, changes).  Zero growth in place; LIEF only when needed."""
    layout = DynLayout(data, path)
    plan = plan_rename(layout, needed_renames, version_renames)
    if plan is None:
        plan = plan_relocated(layout, needed_renames, version_renames)
    if plan is not None:
        return apply_patches(data, plan.patches), plan.strategy, plan.changes
    appended = plan_appended(layout, needed_renames, version_renames)
    if appended is not None:
        return bytes(appended[0]), "appended", appended[1]
    if not allow_lief:
        raise ELFError(f"{path}: the new names do not fit in .dynstr and LIEF is not allowed")
    return _rename_with_lief(data, needed_renames, version_renames or {}, path)


def _rename_with_lief(data: bytes, needed_renames: dict, version_renames: dict, path: str) -> tuple:
    """The growing path: LIEF rebuilds .dynstr (and what it must move to fit it)."""
    import lief  # heavy and optional: only the growing path needs it

    binary = lief.ELF.parse(list(data))
    if binary is None:
        raise ELFError(f"{path}: LIEF cannot parse it")
    changes = []
    for entry in binary.dynamic_entries:
        if isinstance(entry, lief.ELF.DynamicEntryLibrary) and entry.name in needed_renames:
            changes.append(f"needed: {entry.name} -> {needed_renames[entry.name]}")
            entry.name = needed_renames[entry.name]
    for req in binary.symbols_version_requirement:
        if req.name in needed_renames:
            changes.append(f"vn_file: {req.name} -> {needed_renames[req.name]}")
            req.name = needed_renames[req.name]
            for aux in req.get_auxiliary_symbols():
                if aux.name in version_renames:
                    new = version_renames[aux.name]
                    changes.append(f"vna_name: {aux.name} -> {new}")
                    aux.name = new
                    aux.hash = elf_hash(new.encode())
    builder = lief.ELF.Builder(binary)
    builder.build()
    return bytes(builder.get_build()), "lief", changes
