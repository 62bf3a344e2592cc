"""CUDA fatbin inventory: which SASS and PTX images an object carries.

Layout (little-endian, as nvcc 11-13 write it; read off objects built by the tests):
  container header, 16 bytes: magic 0xBA55ED50, u16 version, u16 header size, u64 payload size
  then entries, each: u16 kind (1 PTX, 2 ELF/SASS), u16 version, u32 header size,
    u64 padded payload size, u32 compressed size, u32 -, u16 -, u16 -, u32 arch (86 = sm_86),
    u32 name offset, u32 name length, u64 flags, u64 -, u64 uncompressed size.
Flags seen: 0x2000 (LZ4, CUDA <= 12.x) or 0x8000 (CUDA 13) mark a compressed payload,
0x100000 an arch-specific 'a' target, 0x200000 a family 'f' target.
Containers are concatenated in .nv_fatbin (executables and shared objects) or
__nv_relfatbin (relocatable objects); .nvFatBinSegment only points at them.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_SASS = 1, 2
FLAG_COMPRESSED = 0x2000 | 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY = 0x200000
SECTIONS = (".nv_fatbin", "__nv_relfatbin", ".nvFatBinSegment")
MAX_ENTRIES = 4096

_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")


@dataclass(frozen=True)
class FatbinEntry:
    kind: str  # "sass" or "ptx"
    arch: int  # 86 for sm_86 / compute_86
    variant: str  # "", "a" or "f"
    compressed: bool
    size: int

    @property
    def name(self) -> str:
        return f"{'sm' if self.kind == 'sass' else 'compute'}_{self.arch}{self.variant}"


def inventory(path: str, data, sections: dict, fail) -> list:
    """All fatbin entries of the object; [] when it carries none."""
    entries: list = []
    for name in (".nv_fatbin", "__nv_relfatbin"):
        if name not in sections:
            continue
        _type, offset, size, _addr, _link, _ent = sections[name]
        if _type == 8:  # SHT_NOBITS
            continue
        if offset + size > len(data):
            fail(f"{name} past end of file")
        entries.extend(_walk(data, offset, offset + size, fail))
    return entries


def _walk(data, start: int, end: int, fail) -> list:
    out = []
    pos = start
    while pos + _CONTAINER.size <= end:
        magic, _version, header_size, payload = _CONTAINER.unpack_from(data, pos)
        if magic != FATBIN_MAGIC:
            # nvcc aligns containers; skip padding words until the next magic or the end.
            pos += 8
            continue
        body, body_end = pos + header_size, pos + header_size + payload
        if header_size < _CONTAINER.size or body_end > end:
            fail(f"fatbin container at {pos:#x} overruns its section")
        entry_pos = body
        while entry_pos + _ENTRY.size <= body_end:
            (kind, _ver, ehsize, padded, _csize, _u0, _u1, _u2, arch, _noff, _nlen, flags, _z,
             _usize) = _ENTRY.unpack_from(data, entry_pos)
            if ehsize < _ENTRY.size or entry_pos + ehsize + padded > body_end:
                fail(f"fatbin entry at {entry_pos:#x} overruns its container")
            if kind in (KIND_PTX, KIND_SASS):
                variant = "a" if flags & FLAG_ARCH_SPECIFIC else ("f" if flags & FLAG_FAMILY else "")
                out.append(FatbinEntry(kind="ptx" if kind == KIND_PTX else "sass", arch=arch,
                                       variant=variant, compressed=bool(flags & FLAG_COMPRESSED),
                                       size=padded))
                if len(out) > MAX_ENTRIES:
                    fail("too many fatbin entries")
            entry_pos += ehsize + padded
        pos = body_end
    return out


def parse_arch(text: str) -> tuple:
    """'sm_90a' / 'compute_90' / '9.0' / '90' -> (90, 'a')."""
    value = text.strip().lower()
    for prefix in ("sm_", "compute_", "sm", "compute"):
        if value.startswith(prefix):
            value = value[len(prefix):]
            break
    variant = ""
    if value and value[-1] in "af":
        value, variant = value[:-1], value[-1]
    if "." in value:
        major, _, minor = value.partition(".")
        value = f"{int(major)}{int(minor)}"
    if not value.isdigit():
        raise ValueError(f"not a GPU architecture: {text!r} (expected e.g. sm_90)")
    return int(value), variant


def runnable_on(entries, target: int, target_variant: str = "") -> tuple:
    """Can the driver run this fatbin on a device of compute capability ``target``?

    Returns (ok, why).  SASS runs on the same major with minor >= its own (sm_80 SASS runs on
    sm_86), except arch-specific 'a' SASS, which runs only on exactly that arch; 'f' SASS runs
    within its family (same major, minor >=).  PTX JIT-compiles forward to any newer
    target, except 'a' PTX, which only targets its own arch.
    """
    if not entries:
        return True, "no device code"
    for entry in entries:
        if entry.kind != "sass":
            continue
        if entry.variant == "a":
            if entry.arch == target:
                return True, f"SASS {entry.name}"
        elif entry.arch // 10 == target // 10 and entry.arch <= target:
            return True, f"SASS {entry.name} (binary-compatible)"
    for entry in entries:
        if entry.kind != "ptx":
            continue
        if entry.variant == "a":
            if entry.arch == target:
                return True, f"PTX {entry.name}"
        elif entry.arch <= target:
            return True, f"PTX {entry.name} JIT"
    return False, "no SASS for this arch and no PTX that JITs to it"
