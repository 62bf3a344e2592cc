"""CUDA fatbin inventory: which SASS and PTX images an object carries, module by module.

Layout (little-endian, as nvcc 11-13 write it; checked against `cuobjdump --list-elf
--list-ptx` in tests/unit/test_elf_fatbin_oracle.py):
  container header, 16 bytes: magic 0xBA55ED50, u16 version, u16 header size, u64 payload size
  then entries, each: u16 kind (1 PTX, 2 ELF/SASS), u16 version, u32 header size,
    u64 padded payload size, u32 compressed size, u32 -, u16 minor, u16 major, u32 arch
    (86 = sm_86), u32 name offset, u32 name length, u64 flags, u64 -, u64 uncompressed size.
  For PTX, major.minor is the PTX ISA version (9.0 from CUDA 13.0, 8.8 from 12.9).
Flags: 0x2000 an LZ4 payload, 0x8000 a Zstandard one (see fatbin_payload), 0x100000 an
arch-specific 'a' target, 0x200000 a family 'f' target.
Containers are concatenated in .nv_fatbin (executables and shared objects) or
__nv_relfatbin (relocatable objects of -rdc builds); .nvFatBinSegment holds one wrapper per container, and
the runtime registers each container as its own module (__cudaRegisterFatBinary): every
translation unit, and the device-link step, brings its own.  So code is judged per module:
one module that cannot run on the device is enough for a kernel launch to fail.
There is no cap on the number of entries: cuBLASLt 12.9 alone holds 5969 in 3015 modules.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from . import fatbin_payload

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_SASS = 1, 2
FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000
FLAG_COMPRESSED = FLAG_LZ4 | FLAG_ZSTD
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY = 0x200000
SECTIONS = (".nv_fatbin", "__nv_relfatbin", ".nvFatBinSegment")
ET_REL = 1

_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")

# PTX ISA version -> the CUDA release that introduced it (PTX ISA manual, "Release
# Notes"; 12.6 kept 8.5, and 8.6 came with 12.7, which shipped no toolkit).  A driver
# JIT-compiles only PTX whose ISA it knows, i.e. PTX from a toolkit no newer than itself:
# otherwise cudaErrorUnsupportedPtxVersion (222) / CUDA_ERROR_UNSUPPORTED_PTX_VERSION.
PTX_ISA_CUDA = {
    (7, 0): (11, 0), (7, 1): (11, 1), (7, 2): (11, 2), (7, 3): (11, 3), (7, 4): (11, 4),
    (7, 5): (11, 5), (7, 6): (11, 6), (7, 7): (11, 7), (7, 8): (11, 8),
    (8, 0): (12, 0), (8, 1): (12, 1), (8, 2): (12, 2), (8, 3): (12, 3), (8, 4): (12, 4),
    (8, 5): (12, 5), (8, 6): (12, 7), (8, 7): (12, 8), (8, 8): (12, 9),
    (9, 0): (13, 0), (9, 1): (13, 1),
}


def ptx_isa_for_cuda(cuda: tuple) -> tuple | None:
    """Newest PTX ISA a driver supporting CUDA ``cuda`` (major, minor) can JIT; None: unknown."""
    known = [isa for isa, release in PTX_ISA_CUDA.items() if release <= tuple(cuda)]
    return max(known) if known else None


@dataclass(frozen=True)
class FatbinEntry:
    kind: str  # "sass", "ptx", or "damaged" (a container that overruns its section)
    arch: int  # 86 for sm_86 / compute_86
    variant: str  # "", "a" or "f"
    compressed: bool
    size: int
    module: int = 0  # which container (= runtime module) the image belongs to
    isa: tuple = ()  # PTX ISA version (major, minor); () for SASS
    offset: int = 0  # file offset of the stored payload
    stored: int = 0  # bytes stored at offset (compressed size when compressed)
    usize: int = 0  # decompressed size (= stored when not compressed)
    codec: str = ""  # "", "lz4" or "zstd"
    note: str = ""  # why a "damaged" entry is damaged

    @property
    def name(self) -> str:
        if self.kind == "damaged":
            return "damaged"
        return f"{'sm' if self.kind == 'sass' else 'compute'}_{self.arch}{self.variant}"

    @property
    def isa_text(self) -> str:
        return ".".join(str(p) for p in self.isa)


def inventory(path: str, data, sections: dict, fail) -> list:
    """All fatbin entries of the object; [] when it carries none.

    A container that overruns its section becomes one "damaged" entry instead of an
    exception, so the object is judged (the runtime cannot register it either), not skipped.
    """
    entries: list = []
    module = 0
    # A linked object keeps its inputs' __nv_relfatbin (pre-device-link images) beside the
    # .nv_fatbin the runtime registers (__cudaRegisterLinkedBinary); only relocatable
    # objects are judged by theirs, as cuobjdump lists them.
    relocatable = len(data) >= 18 and struct.unpack_from("<H", data, 16)[0] == ET_REL
    for name in (".nv_fatbin", "__nv_relfatbin") if relocatable else (".nv_fatbin",):
        if name not in sections:
            continue
        _type, offset, size, _addr, _link, _ent = sections[name]
        if _type == 8:  # SHT_NOBITS
            continue
        if offset + size > len(data):
            fail(f"{name} past end of file")
        module = _walk(data, offset, offset + size, module, entries)
    return entries


def _walk(data, start: int, end: int, module: int, out: list) -> int:
    pos = start
    while pos + _CONTAINER.size <= end:
        magic, _version, header_size, payload = _CONTAINER.unpack_from(data, pos)
        if magic != FATBIN_MAGIC:
            # nvcc aligns containers; skip padding words until the next magic or the end.
            pos += 8
            continue
        body, body_end = pos + header_size, pos + header_size + payload
        if header_size < _CONTAINER.size or body_end > end:
            out.append(_damaged(module, f"fatbin container at {pos:#x} overruns its section"))
            return module + 1
        entry_pos = body
        while entry_pos + _ENTRY.size <= body_end:
            (kind, _ver, ehsize, padded, csize, _u0, minor, major, arch, _noff, _nlen, flags, _z,
             usize) = _ENTRY.unpack_from(data, entry_pos)
            if ehsize < _ENTRY.size or entry_pos + ehsize + padded > body_end:
                out.append(_damaged(module, f"fatbin entry at {entry_pos:#x} overruns its container"))
                break
            if kind in (KIND_PTX, KIND_SASS):
                codec = (fatbin_payload.CODEC_LZ4 if flags & FLAG_LZ4 else
                         fatbin_payload.CODEC_ZSTD if flags & FLAG_ZSTD else "")
                variant = "a" if flags & FLAG_ARCH_SPECIFIC else ("f" if flags & FLAG_FAMILY else "")
                out.append(FatbinEntry(
                    kind="ptx" if kind == KIND_PTX else "sass", arch=arch, variant=variant,
                    compressed=bool(codec), size=padded, module=module,
                    isa=(major, minor) if kind == KIND_PTX else (), offset=entry_pos + ehsize,
                    stored=min(csize, padded) if codec else padded,
                    usize=usize if codec else padded, codec=codec))
            entry_pos += ehsize + padded
        module += 1
        pos = body_end
    return module


def _damaged(module: int, why: str) -> FatbinEntry:
    return FatbinEntry(kind="damaged", arch=0, variant="", compressed=False, size=0, module=module,
                       note=why)


def read_image(path: str, entry: FatbinEntry) -> bytes:
    """The decompressed bytes of one image (fatbin_payload.PayloadError when undecodable)."""
    with open(path, "rb") as handle:
        handle.seek(entry.offset)
        stored = handle.read(entry.stored)
    if len(stored) != entry.stored:
        raise fatbin_payload.PayloadError("image past end of file")
    return fatbin_payload.decode(stored, entry.codec, entry.usize)


def modules(entries) -> dict:
    """module number -> its entries, in file order."""
    grouped: dict = {}
    for entry in entries:
        grouped.setdefault(entry.module, []).append(entry)
    return grouped


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
        if not (major.isdigit() and minor.isdigit()):
            raise ValueError(f"not a GPU architecture: {text!r} (expected e.g. sm_90)")
        value = f"{int(major)}{int(minor)}"
    if not value.isdigit() or not 10 <= int(value) <= 999:
        raise ValueError(f"not a GPU architecture: {text!r} (expected e.g. sm_90)")
    return int(value), variant


def sass_runs_on(entry: FatbinEntry, target: int) -> bool:
    """SASS for sm_XY runs on X.Z with Z >= Y (binary compatibility within a major);
    'a' SASS only on exactly X.Y; 'f' SASS within its family, which is the same rule."""
    if entry.variant == "a":
        return entry.arch == target
    return entry.arch // 10 == target // 10 and entry.arch <= target


def ptx_jits_to(entry: FatbinEntry, target: int) -> bool:
    """compute_XY PTX JITs to any capability >= X.Y; 'a' PTX only to exactly X.Y; 'f' PTX
    only within its family (ptxas: "cannot be compiled to different SM family")."""
    if entry.variant == "a":
        return entry.arch == target
    if entry.variant == "f":
        return entry.arch // 10 == target // 10 and entry.arch <= target
    return entry.arch <= target


def choose_image(entries, target: int, ptx_isa_max: tuple | None = None) -> tuple:
    """What the driver loads from one module for a device of capability ``target``.

    Returns (entry or None, why, ptx_too_new).  SASS that runs there wins; else PTX that
    JITs there and whose ISA this driver knows (``ptx_isa_max``; None: driver unknown).
    ``ptx_too_new`` is True when the only way in was PTX too new for the driver.
    """
    damaged = [e for e in entries if e.kind == "damaged"]
    if damaged:
        return None, damaged[0].note, False
    for entry in entries:
        if entry.kind == "sass" and sass_runs_on(entry, target):
            exact = entry.arch == target and not entry.variant
            return entry, f"SASS {entry.name}" + ("" if exact else " (binary-compatible)"), False
    too_new = None
    for entry in entries:
        if entry.kind == "ptx" and ptx_jits_to(entry, target):
            if ptx_isa_max is not None and entry.isa and entry.isa > tuple(ptx_isa_max):
                too_new = too_new or entry
                continue
            return entry, f"PTX {entry.name} JIT", False
    if too_new is not None:
        needs = PTX_ISA_CUDA.get(too_new.isa)
        needs_text = f"CUDA {needs[0]}.{needs[1]}" if needs else "a newer CUDA"
        return None, (f"PTX {too_new.name} is ISA {too_new.isa_text}, which needs a driver for "
                      f"{needs_text}; the driver JITs up to ISA "
                      f"{'.'.join(map(str, ptx_isa_max))} (cudaErrorUnsupportedPtxVersion)"), True
    return None, "no SASS for this arch and no PTX that JITs to it", False


def runnable_on(entries, target: int, target_variant: str = "", ptx_isa_max: tuple | None = None) -> tuple:
    """Coarse, file-level: does any module have an image for capability ``target``?

    Returns (ok, why).  It cannot tell a device-link stub or a kernel-less cubin from code,
    so it is only a first look; collect.fatbin.judge decides per module and kernel.
    ``target_variant`` is accepted for callers that pass sm_90a: a device is a
    capability, so the variant of the target changes nothing.
    """
    if not entries:
        return True, "no device code"
    first_why = "no SASS for this arch and no PTX that JITs to it"
    for number, module in modules(entries).items():
        image, why, _too_new = choose_image(module, target, ptx_isa_max)
        if image is not None:
            return True, why
        first_why = why if number == 0 else first_why
    return False, first_why
