"""The x86 ISA level an object needs: GNU_PROPERTY_X86_ISA_1_NEEDED in PT_GNU_PROPERTY.

glibc 2.33+ on x86 refuses, after mapping the whole closure, any object that needs an ISA
level the CPU lacks: "CPU ISA level is lower than required" (sysdeps/x86/dl-prop.h
dl_isa_level_check, from _rtld_main_check and _dl_open_check).  The level comes from the
GNU property note that ld writes with `-z x86-64-v2|v3|v4` (or gcc -march=x86-64-vN with
-mneeded), in the PT_GNU_PROPERTY segment that binutils 2.32+ emits beside it.

Only PT_GNU_PROPERTY is read: an object with the note in a plain PT_NOTE segment only
(linked by binutils older than 2.32) is not judged, and reads as needing nothing.
This is kept out of ElfInfo on purpose: the Python reader does not read it.  The C reader
(fastelf.c) takes the same value from the image it has already read, and a check asks
fastread.x86_isa_needed first; this function is the reference the tests compare it with,
and the answer for files the C reader did not read.
"""
from __future__ import annotations

import os
import struct

PT_GNU_PROPERTY = 0x6474E553
NT_GNU_PROPERTY_TYPE_0 = 5
GNU_PROPERTY_X86_ISA_1_NEEDED = 0xC0008002
EM_X86_64 = 62
# GNU_PROPERTY_X86_ISA_1_BASELINE is bit 0; the named levels (the glibc-hwcaps names)
LEVEL_BITS = (("x86-64-v2", 1 << 1), ("x86-64-v3", 1 << 2), ("x86-64-v4", 1 << 3))
BASELINE = 1 << 0
_KNOWN_BITS = BASELINE | LEVEL_BITS[0][1] | LEVEL_BITS[1][1] | LEVEL_BITS[2][1]
_MAX_SEGMENT = 1 << 16  # a property segment is a few dozen bytes; more is not one


def x86_isa_needed(path: str) -> int:
    """The ISA_1_NEEDED bit mask of a 64-bit little-endian x86-64 object; 0 when it has
    none, is another machine, or cannot be read (the loader rules report that)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return 0
    try:
        ehdr = os.pread(fd, 64, 0)
        if len(ehdr) < 64 or ehdr[:4] != b"\x7fELF" or ehdr[4] != 2 or ehdr[5] != 1:
            return 0
        (machine,) = struct.unpack_from("<H", ehdr, 18)
        if machine != EM_X86_64:
            return 0
        (phoff,) = struct.unpack_from("<Q", ehdr, 32)
        phentsize, phnum = struct.unpack_from("<HH", ehdr, 54)
        if phentsize < 56 or not 0 < phnum <= 4096:
            return 0
        table = os.pread(fd, phentsize * phnum, phoff)
        for index in range(len(table) // phentsize):
            p_type, _flags, p_offset, _vaddr, _paddr, p_filesz, _memsz, p_align = struct.unpack_from(
                "<IIQQQQQQ", table, index * phentsize)
            if p_type == PT_GNU_PROPERTY and 0 < p_filesz <= _MAX_SEGMENT:
                return _isa_from_notes(os.pread(fd, p_filesz, p_offset))
        return 0
    except (OSError, struct.error, OverflowError):
        return 0
    finally:
        os.close(fd)


def _isa_from_notes(data: bytes) -> int:
    """NT_GNU_PROPERTY_TYPE_0 "GNU" notes: pr_type, pr_datasz, data padded to 8 (ELFCLASS64)."""
    needed = 0
    at = 0
    while at + 12 <= len(data):
        namesz, descsz, n_type = struct.unpack_from("<III", data, at)
        name_at = at + 12
        desc_at = name_at + ((namesz + 3) & ~3)
        end = desc_at + ((descsz + 7) & ~7)
        if desc_at + descsz > len(data):
            break
        if n_type == NT_GNU_PROPERTY_TYPE_0 and data[name_at:name_at + namesz] == b"GNU\0":
            ptr, stop = desc_at, desc_at + descsz
            while ptr + 8 <= stop:
                pr_type, pr_datasz = struct.unpack_from("<II", data, ptr)
                if ptr + 8 + pr_datasz > stop:
                    break
                if pr_type == GNU_PROPERTY_X86_ISA_1_NEEDED and pr_datasz == 4:
                    needed |= struct.unpack_from("<I", data, ptr + 8)[0]
                ptr += 8 + ((pr_datasz + 7) & ~7)
        if end <= at:
            break
        at = end
    return needed


def level_names(mask: int) -> list:
    """The named levels (x86-64-v2...) in a mask, lowest first; the baseline is not named.
    A bit no level has (a later level, or a crafted note) is named by its value after them:
    glibc refuses an object needing any bit its CPU mask lacks ("CPU ISA level is lower than
    required", checked with a note needing bit 0x10), so it is a level this CPU lacks too."""
    names = [name for name, bit in LEVEL_BITS if mask & bit]
    unknown = mask & ~_KNOWN_BITS
    bit = 1
    while unknown:
        if unknown & bit:
            names.append(f"x86 ISA bit {bit:#x}")
            unknown &= ~bit
        bit <<= 1
    return names


def cpu_isa_mask(hwcaps_subdirs) -> int:
    """This CPU's ISA_1 mask from the glibc-hwcaps levels ld.so searches (hwcaps.detect):
    glibc fills both from the same get_isa_level(), so the searched x86-64-vN names are
    exactly the levels the CPU supports, plus the baseline."""
    mask = BASELINE
    for name, bit in LEVEL_BITS:
        if name in hwcaps_subdirs:
            mask |= bit
    return mask
