"""Which hardware-capability subdirectories ld.so searches under each library directory.

glibc 2.33+ searches ``glibc-hwcaps/x86-64-v4``, ``-v3``, ``-v2`` (those this CPU supports,
best first).  glibc 2.36 (Debian 12) still also searches the legacy power set built from
dl_hwcap ("x86_64", "avx512_1"), the platform string and "tls" (elf/dl-hwcaps.c,
_dl_important_hwcaps); glibc 2.37 removed the legacy part.  ``ld.so --help`` lists both
sets for this CPU; tests compare what we derive from /proc/cpuinfo with it.
"""
from __future__ import annotations

import os
from ..model.record import FrozenRecord, set_fields

# x86-64 psABI micro-architecture levels, as cpuinfo flag names (lzcnt is "abm").
_LEVEL_FLAGS = {
    "x86-64-v2": {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"},
    "x86-64-v3": {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"},
    "x86-64-v4": {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"},
}

HWCAP_X86_64 = 1 << 1
HWCAP_X86_AVX512_1 = 1 << 2
_HWCAP_NAMES = {1: "x86_64", 2: "avx512_1"}  # bit -> name (dl-hwcap.h order)


class CpuCaps(FrozenRecord):
    _fields = ("hwcaps_subdirs", "legacy_subdirs", "platform", "hwcap_bits")

    def __init__(self, hwcaps_subdirs: tuple, legacy_subdirs: tuple, platform: str, hwcap_bits: int):
        set_fields(self, {
            "hwcaps_subdirs": hwcaps_subdirs,  # glibc-hwcaps subdirectory names, best first
            "legacy_subdirs": legacy_subdirs,  # legacy subdirectories ("tls/haswell/...") in search order, '' excluded
            "platform": platform,  # $PLATFORM
            "hwcap_bits": hwcap_bits})  # dl_hwcap & HWCAP_IMPORTANT, for ld.so.cache legacy entries

    @property
    def priorities(self) -> dict:
        """glibc-hwcaps subdir -> priority for ld.so.cache entries (higher is preferred)."""
        count = len(self.hwcaps_subdirs)
        return {name: count - index for index, name in enumerate(self.hwcaps_subdirs)}

    def subdirs(self) -> tuple:
        """Every prefix searched before the plain directory, in order, each ending in '/'."""
        return tuple(f"glibc-hwcaps/{name}/" for name in self.hwcaps_subdirs) + tuple(
            f"{name}/" for name in self.legacy_subdirs)


def read_cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> tuple:
    """(vendor, flags) of the first CPU; empty when unreadable."""
    vendor, flags = "", set()
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "vendor_id" and not vendor:
                    vendor = value.strip()
                elif key == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return vendor, flags


def glibc_version() -> tuple:
    """The host glibc as (major, minor); (0, 0) when not glibc."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        text = ""
    try:
        major, minor = text.split()[1].split(".")[:2]
        return int(major), int(minor)
    except (IndexError, ValueError):
        return (0, 0)


def detect(cpuinfo: str = "/proc/cpuinfo", libc: tuple | None = None,
           platform: str | None = None) -> CpuCaps:
    vendor, flags = read_cpu_flags(cpuinfo)
    libc = libc or glibc_version()
    levels = []
    needed: set = set()
    for level in ("x86-64-v2", "x86-64-v3", "x86-64-v4"):
        needed |= _LEVEL_FLAGS[level]
        if needed <= flags:
            levels.append(level)
    hwcaps_subdirs = tuple(reversed(levels)) if libc >= (2, 33) else ()

    # sysdeps/x86/cpu-features.c: Intel CPUs get a "haswell"/"xeon_phi" platform and the
    # avx512_1 hwcap; everyone else keeps the kernel's AT_PLATFORM, "x86_64".
    hwcap = HWCAP_X86_64
    detected = None
    if vendor == "GenuineIntel":
        if "avx512cd" in flags:
            if "avx512er" in flags:
                if "avx512pf" in flags:
                    detected = "xeon_phi"
            elif {"avx512bw", "avx512dq", "avx512vl"} <= flags:
                hwcap |= HWCAP_X86_AVX512_1
        if detected is None and {"avx2", "fma", "bmi1", "bmi2", "abm", "movbe", "popcnt"} <= flags:
            detected = "haswell"
    platform = platform or detected or os.uname().machine

    legacy: tuple = ()
    if libc < (2, 37):
        parts = [_HWCAP_NAMES[bit] for bit in sorted(_HWCAP_NAMES) if hwcap & (1 << bit)]
        parts += [platform, "tls"]
        count = len(parts)
        combos = []
        # Power set, largest mask first; bit k <-> parts[k]; path components from the
        # highest bit down ("tls/haswell/avx512_1/x86_64"), matching LD_DEBUG=libs output.
        for mask in range((1 << count) - 1, 0, -1):
            combos.append("/".join(parts[k] for k in range(count - 1, -1, -1) if mask & (1 << k)))
        legacy = tuple(combos)
    return CpuCaps(hwcaps_subdirs=hwcaps_subdirs, legacy_subdirs=legacy, platform=platform,
                   hwcap_bits=hwcap)
