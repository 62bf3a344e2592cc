"""An mmap+struct ELF reader for exactly what the dynamic loader uses.

Why not pyelftools for the hot path: a check of /usr/lib reads a few thousand objects and
every dynamic symbol table in them; pyelftools builds a Python object per structure and was
measured ~20x slower on the same files (bench/bench_elf.py prints the ratio).  pyelftools
remains the reference the tests compare against.

Everything here works from PT_DYNAMIC and the program headers, so stripped objects without
section headers are read the same way ld.so reads them.  Sections are used only where the
loader does not look (the build-id note is found either way; fatbins need sections).

Every offset, size and count read from the file is bounds-checked against the mapping:
hostile files raise ELFError, never IndexError, MemoryError or a hang.
"""
from __future__ import annotations

import functools
import mmap
import os
import re
import stat
import struct
import sys

from ..model.errors import ELFError
from . import fastread as _fastread
# defined apart so that the C reader needs no reader.py
from .info import BIND_NAMES, STB_LOCAL, STT_NAMES, ElfInfo, Symbol, VersionNeed  # noqa: F401

ELF_MAGIC = b"\x7fELF"

# e_type
ET_EXEC, ET_DYN = 2, 3
# p_type
PT_LOAD, PT_DYNAMIC, PT_INTERP, PT_NOTE = 1, 2, 3, 4
# d_tag
DT_NULL, DT_NEEDED, DT_HASH, DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_SYMENT = 0, 1, 4, 5, 6, 10, 11
DT_SONAME, DT_RPATH, DT_RUNPATH, DT_FLAGS = 14, 15, 29, 30
DT_GNU_HASH = 0x6FFFFEF5
DT_VERSYM, DT_VERDEF, DT_VERDEFNUM = 0x6FFFFFF0, 0x6FFFFFFC, 0x6FFFFFFD
DT_VERNEED, DT_VERNEEDNUM, DT_FLAGS_1 = 0x6FFFFFFE, 0x6FFFFFFF, 0x6FFFFFFB
DF_1_NODEFLIB = 0x800
DF_ORIGIN, DF_1_ORIGIN = 0x1, 0x80
VER_FLG_BASE, VER_FLG_WEAK = 0x1, 0x2
SHN_UNDEF, SHN_ABS = 0, 0xFFF1
NT_GNU_BUILD_ID = 3

# Sanity caps: a real object never comes close; a hostile one must not make us loop.
MAX_DYN_ENTRIES = 1 << 16
MAX_VER_ENTRIES = 1 << 16
MAX_STRING = 1 << 16


def is_elf(path: str) -> bool:
    """Cheap sniff used by directory scans to skip non-ELF files quietly."""
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == ELF_MAGIC
    except OSError:
        return False


def read_elf(path: str, symbols: bool | tuple = False, fatbin: bool = False) -> ElfInfo:
    """Parse ``path``; ELFError for anything that is not a well-formed ELF object.

    ``symbols``: True reads every dynamic symbol; a tuple of name prefixes reads only the
    symbols whose names start with one of them (the C++ ABI check wants torch's c10/at
    names out of libtorch_cpu's ~100,000: a Symbol object for each of the others would be
    most of a check of site-packages).

    Without fatbins the C reader (fastread.py, fastelf.c) answers when it is built: the
    same ElfInfo or the same ELFError, 2-3x faster (bench/bench_elf.py); this module stays
    the reference it is tested against, and SEEDANCE_ELF_READER=python selects it."""
    if not fatbin and type(path) is str and _fastread.enabled():
        info = _fastread.read(path, symbols)
        if info is not None:
            return info
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (a hang, not an answer).
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise ELFError(f"{path}: {(exc.strerror or 'cannot open').lower()}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ELFError(f"{path}: not a regular file")
        size = st.st_size
        if size < 16:
            raise ELFError(f"{path}: not an ELF file (too short)")
        try:
            data = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        except (OSError, ValueError) as exc:
            raise ELFError(f"{path}: cannot map file: {exc}") from None
    finally:
        os.close(fd)
    try:
        return _Parser(path, data).parse(symbols, fatbin)
    except ELFError:
        raise
    except (struct.error, IndexError, ValueError, OverflowError, UnicodeError) as exc:
        raise ELFError(f"{path}: malformed ELF ({exc.__class__.__name__}: {exc})") from None
    finally:
        data.close()


@functools.lru_cache(maxsize=16)
def _prefix_pattern(prefixes: tuple):
    """A regex matching every occurrence of any of ``prefixes``.

    A plain alternation keeps sre's literal-prefix search (memchr-speed over the common
    head, "_ZN"); a zero-width lookahead, needed only when one occurrence can begin inside
    another's match, defeats it and was 13x slower over libtorch_cpu's string table."""
    raw = [p.encode("utf-8", "surrogateescape") for p in prefixes]
    alternation = b"|".join(re.escape(p) for p in raw)
    overlapping = any(q[k:].startswith(p) or p.startswith(q[k:])
                      for q in raw for p in raw for k in range(1, len(q)))
    return re.compile(b"(?=" + alternation + b")" if overlapping else alternation)


class _Parser:
    def __init__(self, path: str, data):
        self.path = path
        self.data = data
        self.size = len(data)

    def fail(self, why: str):
        raise ELFError(f"{self.path}: malformed ELF: {why}")

    # --- primitive reads, all bounds-checked ---------------------------------------------
    def unpack(self, fmt: struct.Struct, offset: int):
        if offset < 0 or offset + fmt.size > self.size:
            self.fail(f"read of {fmt.size} bytes at {offset:#x} past end of file ({self.size:#x})")
        return fmt.unpack_from(self.data, offset)

    def cstring(self, offset: int, limit: int | None = None) -> str:
        end_limit = self.size if limit is None else min(self.size, limit)
        if offset < 0 or offset >= end_limit:
            self.fail(f"string offset {offset:#x} outside its table")
        end = self.data.find(b"\0", offset, min(end_limit, offset + MAX_STRING))
        if end < 0:
            self.fail(f"unterminated string at {offset:#x}")
        return self.data[offset:end].decode("utf-8", "surrogateescape")

    # --- header ---------------------------------------------------------------------------
    def parse(self, want_symbols: bool, want_fatbin: bool) -> ElfInfo:
        ident = self.data[:16]
        if ident[:4] != ELF_MAGIC:
            raise ELFError(f"{self.path}: not an ELF file")
        ei_class, ei_data, osabi = ident[4], ident[5], ident[7]
        if ei_class not in (1, 2):
            self.fail(f"bad EI_CLASS {ei_class}")
        if ei_data not in (1, 2):
            self.fail(f"bad EI_DATA {ei_data}")
        self.is64 = ei_class == 2
        end = "<" if ei_data == 1 else ">"
        self.end = end
        if self.is64:
            ehdr = struct.Struct(end + "HHIQQQIHHHHHH")
            self.phdr = struct.Struct(end + "IIQQQQQQ")
            self.shdr = struct.Struct(end + "IIQQQQIIQQ")
            self.dyn = struct.Struct(end + "qQ")
            self.sym = struct.Struct(end + "IBBHQQ")
        else:
            ehdr = struct.Struct(end + "HHIIIIIHHHHHH")
            self.phdr = struct.Struct(end + "IIIIIIII")
            self.shdr = struct.Struct(end + "IIIIIIIIII")
            self.dyn = struct.Struct(end + "iI")
            self.sym = struct.Struct(end + "IIIBBH")
        (e_type, e_machine, _ver, _entry, e_phoff, e_shoff, _flags, _ehsize, e_phentsize,
         e_phnum, e_shentsize, e_shnum, e_shstrndx) = self.unpack(ehdr, 16)
        self.u16 = struct.Struct(end + "H")
        self.u32 = struct.Struct(end + "I")

        segments = self._program_headers(e_phoff, e_phentsize, e_phnum)
        self.loads = [s for s in segments if s[0] == PT_LOAD]
        sections = self._section_headers(e_shoff, e_shentsize, e_shnum, e_shstrndx)

        interpreter = None
        build_id = None
        dynamic = None
        for p_type, p_offset, p_vaddr, p_filesz in segments:
            if p_type == PT_INTERP:
                interpreter = self.cstring(p_offset, p_offset + p_filesz)
            elif p_type == PT_DYNAMIC:
                dynamic = (p_offset, p_filesz)
            elif p_type == PT_NOTE and build_id is None:
                build_id = self._build_id(p_offset, p_filesz)
        if build_id is None:
            for name, (sh_type, sh_offset, sh_size, _a, _l, _e) in sections.items():
                if sh_type == 7 and name.startswith(".note"):
                    build_id = self._build_id(sh_offset, sh_size)
                    if build_id:
                        break

        info = dict(path=self.path, elf_class=64 if self.is64 else 32, little_endian=end == "<",
                    machine=e_machine, osabi=osabi, e_type=e_type, interpreter=interpreter,
                    build_id=build_id, has_sections=bool(sections),
                    # an empty PT_DYNAMIC (separate debug files) is "no dynamic section" to ld.so
                    has_dynamic=dynamic is not None and dynamic[1] > 0,
                    section_names=tuple(sections))
        if dynamic is not None:
            info.update(self._dynamic(*dynamic, sections, want_symbols))
        if want_fatbin and sections:
            from . import fatbin as _fatbin  # only fatbin reads pay for its import (seedance ldd)

            info["fatbin"] = tuple(_fatbin.inventory(self.path, self.data, sections, self.fail))
        return ElfInfo(**info)

    def _program_headers(self, phoff: int, phentsize: int, phnum: int) -> list:
        if phnum == 0:
            return []
        if phentsize < self.phdr.size:
            self.fail(f"e_phentsize {phentsize} too small")
        if phoff + phnum * phentsize > self.size:
            self.fail("program headers past end of file")
        out = []
        for index in range(phnum):
            fields = self.unpack(self.phdr, phoff + index * phentsize)
            if self.is64:
                p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz, p_memsz, _align = fields
            else:
                p_type, p_offset, p_vaddr, _paddr, p_filesz, p_memsz, _flags, _align = fields
            out.append((p_type, p_offset, p_vaddr, p_filesz))
        return out

    def _section_headers(self, shoff: int, shentsize: int, shnum: int, shstrndx: int) -> dict:
        """name -> (type, offset, size, addr, link, entsize); {} when absent or unusable."""
        if shoff == 0 or shnum == 0:
            return {}
        if shentsize < self.shdr.size or shoff + shnum * shentsize > self.size or shstrndx >= shnum:
            return {}  # the loader never reads sections; neither do we when they are broken
        raw = []
        for index in range(shnum):
            fields = self.unpack(self.shdr, shoff + index * shentsize)
            if self.is64:
                name, sh_type, _flags, addr, offset, size, link, _info, _align, entsize = fields
            else:
                name, sh_type, _flags, addr, offset, size, link, _info, _align, entsize = fields
            raw.append((name, sh_type, offset, size, addr, link, entsize))
        _n, _t, str_off, str_size, _a, _l, _e = raw[shstrndx]
        if str_off + str_size > self.size:
            return {}
        out = {}
        for name, sh_type, offset, size, addr, link, entsize in raw:
            try:
                text = self.cstring(str_off + name, str_off + str_size)
            except ELFError:
                continue
            out.setdefault(text, (sh_type, offset, size, addr, link, entsize))
        return out

    def _build_id(self, offset: int, size: int) -> str | None:
        end = min(offset + size, self.size)
        note = struct.Struct(self.end + "III")
        while offset + 12 <= end:
            namesz, descsz, n_type = self.unpack(note, offset)
            name_off = offset + 12
            desc_off = name_off + ((namesz + 3) & ~3)
            nxt = desc_off + ((descsz + 3) & ~3)
            if nxt > end or nxt <= offset:
                return None
            if n_type == NT_GNU_BUILD_ID and self.data[name_off:name_off + namesz].rstrip(b"\0") == b"GNU":
                return self.data[desc_off:desc_off + descsz].hex()
            offset = nxt
        return None

    # --- dynamic section ----------------------------------------------------------------
    def vaddr_to_offset(self, vaddr: int) -> int:
        for _t, p_offset, p_vaddr, p_filesz in self.loads:
            if p_vaddr <= vaddr < p_vaddr + p_filesz:
                return p_offset + (vaddr - p_vaddr)
        self.fail(f"address {vaddr:#x} is in no PT_LOAD segment")

    def _dynamic(self, offset: int, filesz: int, sections: dict, want_symbols: bool) -> dict:
        entries = []
        count = min(filesz // self.dyn.size, MAX_DYN_ENTRIES)
        if offset + count * self.dyn.size > self.size:
            self.fail("PT_DYNAMIC past end of file")
        for index in range(count):
            tag, value = self.unpack(self.dyn, offset + index * self.dyn.size)
            if tag == DT_NULL:
                break
            entries.append((tag, value))
        tags: dict = {}
        for tag, value in entries:
            tags.setdefault(tag, value)
        if DT_STRTAB not in tags:
            if any(t in (DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH) for t, _ in entries):
                self.fail("DT_STRTAB missing")
            return {}
        strtab = self.vaddr_to_offset(tags[DT_STRTAB])
        strsz = tags.get(DT_STRSZ, self.size - strtab)
        if strtab + strsz > self.size:
            self.fail("DT_STRSZ past end of file")
        self.strtab, self.strend = strtab, strtab + strsz

        def string(value):
            return self.cstring(self.strtab + value, self.strend)

        needed, rpath, runpath, soname = [], (), (), None
        for tag, value in entries:
            if tag == DT_NEEDED:
                needed.append(string(value))
            elif tag == DT_SONAME and soname is None:
                soname = string(value)
            elif tag == DT_RPATH and not rpath:
                rpath = tuple(string(value).split(":"))
            elif tag == DT_RUNPATH and not runpath:
                runpath = tuple(string(value).split(":"))
        out = dict(needed=tuple(needed), soname=soname, rpath=rpath, runpath=runpath,
                   flags=tags.get(DT_FLAGS, 0), flags_1=tags.get(DT_FLAGS_1, 0))
        version_names: dict = {}  # version index -> (name, hidden-capable)
        if DT_VERNEED in tags:
            out["version_needs"] = self._verneed(self.vaddr_to_offset(tags[DT_VERNEED]),
                                                 tags.get(DT_VERNEEDNUM, 0), string, version_names)
        if DT_VERDEF in tags:
            out["version_defs"] = self._verdef(self.vaddr_to_offset(tags[DT_VERDEF]),
                                               tags.get(DT_VERDEFNUM, 0), string, version_names)
        if want_symbols and DT_SYMTAB in tags:
            prefixes = want_symbols if isinstance(want_symbols, tuple) else None
            out["symbols"] = self._symbols(tags, sections, string, version_names, prefixes)
        return out

    def _verneed(self, offset: int, count: int, string, version_names: dict) -> tuple:
        vn = struct.Struct(self.end + "HHIII")
        vna = struct.Struct(self.end + "IHHII")
        result = []
        seen = 0
        while count and seen < min(count, MAX_VER_ENTRIES):
            seen += 1
            _ver, cnt, file_off, aux, nxt = self.unpack(vn, offset)
            versions = []
            aux_off = offset + aux
            for _ in range(min(cnt, MAX_VER_ENTRIES)):
                _hash, flags, other, name_off, aux_next = self.unpack(vna, aux_off)
                name = string(name_off)
                versions.append((name, bool(flags & VER_FLG_WEAK)))
                version_names[other & 0x7FFF] = name
                if aux_next == 0:
                    break
                aux_off += aux_next
            result.append(VersionNeed(file=string(file_off), versions=tuple(versions)))
            if nxt == 0:
                break
            offset += nxt
        return tuple(result)

    def _verdef(self, offset: int, count: int, string, version_names: dict) -> tuple:
        vd = struct.Struct(self.end + "HHHHIII")
        vda = struct.Struct(self.end + "II")
        names = []
        seen = 0
        while count and seen < min(count, MAX_VER_ENTRIES):
            seen += 1
            _ver, flags, ndx, cnt, _hash, aux, nxt = self.unpack(vd, offset)
            if cnt:
                name_off, _aux_next = self.unpack(vda, offset + aux)
                name = string(name_off)
                version_names[ndx & 0x7FFF] = name
                if not flags & VER_FLG_BASE:
                    names.append(name)
            if nxt == 0:
                break
            offset += nxt
        return tuple(names)

    def _symbol_count(self, tags: dict, sections: dict) -> int:
        dynsym = sections.get(".dynsym")
        if dynsym and dynsym[5]:
            return dynsym[2] // dynsym[5]
        if DT_HASH in tags:
            _nbucket, nchain = self.unpack(struct.Struct(self.end + "II"),
                                           self.vaddr_to_offset(tags[DT_HASH]))
            return nchain
        if DT_GNU_HASH in tags:
            return self._gnu_hash_count(self.vaddr_to_offset(tags[DT_GNU_HASH]))
        return 0

    def _gnu_hash_count(self, offset: int) -> int:
        """Symbols = the highest index reachable through the buckets' chains, plus one."""
        nbuckets, symoffset, bloom_size, _shift = self.unpack(struct.Struct(self.end + "IIII"), offset)
        word = 8 if self.is64 else 4
        buckets = offset + 16 + bloom_size * word
        chains = buckets + nbuckets * 4
        if buckets + nbuckets * 4 > self.size:
            self.fail("DT_GNU_HASH buckets past end of file")
        last = max((self.unpack(self.u32, buckets + 4 * i)[0] for i in range(nbuckets)), default=0)
        if last < symoffset:
            return symoffset
        index = last
        while True:
            (value,) = self.unpack(self.u32, chains + 4 * (index - symoffset))
            if value & 1:
                return index + 1
            index += 1
            if index - last > self.size // 4:
                self.fail("DT_GNU_HASH chain does not terminate")

    # st_name is the first field of Elf32_Sym and Elf64_Sym.
    def _name_offset(self, symtab: int, entsize: int, index: int) -> int:
        return self.u32.unpack_from(self.data, symtab + index * entsize)[0]

    def _native_u32(self, symtab: int, entsize: int) -> bool:
        return (self.end == "<") == (sys.byteorder == "little") and symtab % 4 == 0 and entsize % 4 == 0

    def _name_offsets(self, symtab: int, entsize: int, count: int):
        """Every symbol's st_name at once: the table copied and read as native u32 with the
        entry's stride (one struct.unpack per symbol is a call and a tuple for each of
        libtorch_cpu's tens of thousands)."""
        table = bytes(self.data[symtab:symtab + count * entsize])
        return memoryview(table).cast("I")[::entsize // 4].tolist()

    def _symbols(self, tags: dict, sections: dict, string, version_names: dict,
                 prefixes: tuple | None = None) -> tuple:
        count = self._symbol_count(tags, sections)
        if count <= 0:
            return ()
        symtab = self.vaddr_to_offset(tags[DT_SYMTAB])
        entsize = tags.get(DT_SYMENT, self.sym.size) or self.sym.size
        if entsize < self.sym.size:
            self.fail(f"DT_SYMENT {entsize} too small")
        if symtab + count * entsize > self.size:
            count = (self.size - symtab) // entsize  # truncated table: read what is there
        versym = self.vaddr_to_offset(tags[DT_VERSYM]) if DT_VERSYM in tags else None
        if versym is not None and versym + 2 * count > self.size:
            versym = None
        unpack_sym = self.sym.unpack_from
        data = self.data
        find = data.find
        strtab, strend = self.strtab, self.strend
        wanted = None
        if prefixes is not None:
            # Every string-table offset where a prefix starts: a symbol's name offset must be
            # one of them (a name may begin inside a longer string, so any position counts).
            wanted = {m.start() - strtab for m in _prefix_pattern(prefixes).finditer(data, strtab, strend)}
        indices = range(1, count)
        if wanted is not None:
            indices = [i for i in indices if self._name_offset(symtab, entsize, i) in wanted] \
                if not self._native_u32(symtab, entsize) else \
                [i for i, off in enumerate(self._name_offsets(symtab, entsize, count)) if i and off in wanted]
        out = []
        for index in indices:
            fields = unpack_sym(data, symtab + index * entsize)
            if self.is64:
                name_off, info, _other, shndx, _value, _size = fields
            else:
                name_off, _value, _size, info, _other, shndx = fields
            bind = info >> 4
            if bind == STB_LOCAL:
                continue
            version = None
            hidden = False
            if versym is not None:
                (ver,) = self.u16.unpack_from(data, versym + 2 * index)
                hidden = bool(ver & 0x8000)
                if (ver & 0x7FFF) > 1:
                    version = version_names.get(ver & 0x7FFF)
            # Inlined cstring(): this loop runs once per dynamic symbol of every object.
            name_start = strtab + name_off
            name_end = find(b"\0", name_start, strend) if name_start < strend else -1
            if name_end < 0:
                self.fail(f"symbol name at {name_off:#x} outside or unterminated in DT_STRTAB")
            out.append(Symbol(name=data[name_start:name_end].decode("utf-8", "surrogateescape"),
                              defined=shndx != SHN_UNDEF,
                              binding=BIND_NAMES.get(bind, str(bind)),
                              type=STT_NAMES.get(info & 0xF, str(info & 0xF)),
                              version=version, hidden=hidden))
        return tuple(out)
