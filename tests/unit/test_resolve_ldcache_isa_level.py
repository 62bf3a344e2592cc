"""A glibc-hwcaps copy of a library that needs an ISA level this CPU lacks: seedance must take
from ld.so.cache the copy the real ld.so loads.

Why (glibc 2.36; ld.so is the oracle, the sources only say what to try): ldconfig records in
bits 32..41 of a glibc-hwcaps cache entry the highest bit of the library's
GNU_PROPERTY_X86_ISA_1_NEEDED note (sysdeps/unix/sysv/linux/x86/elf-read-prop.h,
elf/cache.c compute_hwcap_value), and search_cache() (elf/dl-cache.c) passes over a
glibc-hwcaps entry whose level the CPU does not support (dl_cache_hwcap_isa_level_compatible,
sysdeps/x86/dl-isa-level.h), even in a subdirectory the CPU does support.

The library copies are linked with `-z x86-64-vN` (binutils writes the ISA_1_NEEDED note), the
cache is written by the real ldconfig, and the program runs under ld.so in a private mount
namespace with that cache bound over /etc/ld.so.cache.  Each copy returns a different value,
and LD_DEBUG=libs names the file ld.so tried; both must agree before seedance is compared.
"""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from seedance.resolve import Resolver
from tests.conftest import ld_so_cache_try, ld_so_hwcaps_levels, run_with_ld_so_cache, write_ld_so_cache

LDCONFIG = shutil.which("ldconfig") or "/sbin/ldconfig"
RTLD = "/lib64/ld-linux-x86-64.so.2"
CLEAN = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
LIB = "libseedisa.so.1"
LEVELS = ("x86-64-v2", "x86-64-v3", "x86-64-v4")


def _supported_levels() -> list:
    """The x86-64-vN levels `ld.so --help` marks supported on this CPU."""
    return [level for level, words in ld_so_hwcaps_levels(RTLD).items() if level in LEVELS and "supported" in words]


SUPPORTED = _supported_levels()
LACKING = [level for level in LEVELS if level not in SUPPORTED]


def _skip_reason():
    if os.uname().machine != "x86_64":
        return "x86-64 only (GNU_PROPERTY_X86_ISA_1_NEEDED, glibc-hwcaps/x86-64-vN)"
    if os.geteuid() != 0:
        return "needs root to bind a cache over /etc/ld.so.cache in a private mount namespace"
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "needs unshare and mount (util-linux)"
    if shutil.which("gcc") is None or not os.path.exists(LDCONFIG) or not os.path.exists(RTLD):
        return "needs gcc, ldconfig and the x86-64 ld.so"
    if "x86-64-v2" not in SUPPORTED:
        return "this CPU lacks x86-64-v2: ld.so searches no glibc-hwcaps subdirectory"
    if not LACKING:
        return "this CPU supports every x86-64 level: no ISA level to lack"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


def _build(base: Path, copies: dict) -> Path:
    """copies: subdirectory ('' or 'glibc-hwcaps/x86-64-vN/') -> (value, level it needs or
    None).  Returns the program linked against the plain copy (no RPATH: the cache decides)."""
    top = base / "lib"
    for sub, (value, needs) in copies.items():
        (top / sub).mkdir(parents=True, exist_ok=True)
        src = base / f"w{value}.c"
        src.write_text(f"int seed_which(void){{return {value};}}\n")
        mark = [f"-Wl,-z,{needs}"] if needs else []
        proc = subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(top / sub / LIB), str(src),
                               f"-Wl,-soname,{LIB}", *mark], capture_output=True, timeout=120)
        if proc.returncode != 0:
            pytest.skip(f"this linker cannot mark an ISA level ({needs}): "
                        f"{proc.stderr.decode('utf-8', 'replace').strip()[:200]}")
    (base / "m.c").write_text('#include <stdio.h>\nint seed_which(void);\n'
                              'int main(void){printf("which=%d\\n", seed_which());return 0;}\n')
    subprocess.run(["gcc", "-o", str(base / "app"), str(base / "m.c"), str(top / LIB)], check=True)
    (base / "ld.so.conf").write_text(f"{top}\n")
    cache_file = base / "ld.so.cache"
    write_ld_so_cache(cache_file, base / "ld.so.conf", "-i", "-c", "new")
    return cache_file


def _recorded_levels(cache_file: Path) -> dict:
    """path -> ISA level field (hwcap bits 32..41) of each entry for LIB, read from the raw
    new-format cache (struct cache_file_new / file_entry_new, elf/dl-cache.h)."""
    data = cache_file.read_bytes()
    assert data[:20] == b"glibc-ld.so.cache1.1"
    (nlibs,) = struct.unpack_from("<I", data, 20)

    def string(offset):
        return data[offset:data.index(b"\0", offset)].decode("utf-8", "surrogateescape")

    levels = {}
    for index in range(nlibs):
        _flags, key, value, _osv, hwcap = struct.unpack_from("<iIIIQ", data, 48 + 24 * index)
        if string(key) == LIB:
            levels[string(value)] = (hwcap >> 32) & 0x3FF
    return levels


def _ld_so_choice(base: Path, cache_file: Path) -> tuple:
    """The copy ld.so loads from the cache: the file LD_DEBUG=libs says it tried, checked
    against the value the program printed."""
    proc = run_with_ld_so_cache(cache_file, base / "app", env={**CLEAN, "LD_DEBUG": "libs"})
    assert proc.returncode == 0, proc.stderr
    return ld_so_cache_try(proc.stderr, LIB), proc.stdout.strip()


def _seedance_choice(base: Path, cache_file: Path) -> str:
    res = next(r for r in Resolver(env={}, cache_path=str(cache_file)).closure(str(base / "app")).resolutions
               if r.name == LIB)
    assert res.source == "ld.so.cache", res
    return res.path


def _scenario(base: Path, copies: dict):
    """(ld.so's path, seedance's path) after checking ldconfig recorded each mark."""
    cache_file = _build(base, copies)
    recorded = _recorded_levels(cache_file)
    for sub, (_value, needs) in copies.items():
        if sub and needs:
            # GNU_PROPERTY_X86_ISA_1_V<N> is bit N-1; ldconfig stores that bit's index
            want = LEVELS.index(needs) + 1
            got = recorded.get(str(base / "lib" / sub / LIB))
            if got != want:
                pytest.skip(f"this ldconfig did not record ISA level {want} for {sub}{LIB} (got {got})")
    chosen, printed = _ld_so_choice(base, cache_file)
    value = {str(base / "lib" / sub / LIB): v for sub, (v, _needs) in copies.items()}[chosen]
    assert printed == f"which={value}", (chosen, printed)
    return chosen, _seedance_choice(base, cache_file)


def test_a_hwcaps_copy_needing_a_lacking_level_is_passed_over(tmp_path):
    """glibc-hwcaps/x86-64-v2/ holds a copy marked as needing the lowest level this CPU lacks;
    ld.so (2.36) passes over that entry and loads the plain copy."""
    copies = {"": (1, None), "glibc-hwcaps/x86-64-v2/": (2, LACKING[0])}
    chosen, ours = _scenario(tmp_path, copies)
    assert ours == chosen
    # the finding this test pins (if a later glibc loads the marked copy, seedance must follow
    # it, and this line says the rule changed)
    assert chosen == str(tmp_path / "lib" / LIB), chosen


def test_the_same_copy_marked_with_a_supported_level_is_taken(tmp_path):
    """Control: the mark alone makes the difference.  Marked with a level this CPU supports,
    the glibc-hwcaps copy wins again, for ld.so and for seedance."""
    copies = {"": (1, None), "glibc-hwcaps/x86-64-v2/": (2, SUPPORTED[-1])}
    chosen, ours = _scenario(tmp_path, copies)
    assert ours == chosen
    assert chosen == str(tmp_path / "lib" / "glibc-hwcaps/x86-64-v2" / LIB), chosen


def test_a_passed_over_entry_leaves_the_next_best_subdirectory(tmp_path):
    """The skip is per entry: with glibc-hwcaps/x86-64-v3/ marked as needing x86-64-v4, the
    x86-64-v2 copy (marked x86-64-v2) is next, not the plain one."""
    if "x86-64-v3" not in SUPPORTED or "x86-64-v4" in SUPPORTED:
        pytest.skip("needs a CPU with x86-64-v3 and without x86-64-v4")
    copies = {"": (1, None), "glibc-hwcaps/x86-64-v2/": (2, "x86-64-v2"),
              "glibc-hwcaps/x86-64-v3/": (3, "x86-64-v4")}
    chosen, ours = _scenario(tmp_path, copies)
    assert ours == chosen
    assert chosen == str(tmp_path / "lib" / "glibc-hwcaps/x86-64-v2" / LIB), chosen
