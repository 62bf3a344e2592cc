"""A library both in a plain directory and in its glibc-hwcaps/x86-64-v2 subdirectory, cached
by the real ldconfig in each of the formats it writes (`ldconfig -c new|compat|old`): seedance
must take from the cache the copy the real ld.so loads.

Why the formats differ (glibc 2.36; read, not assumed - ld.so is the oracle here):
- new: search_cache() prefers the glibc-hwcaps entry by subdirectory priority.
- compat (old entries, then the new table): ld.so searches the new table, but
  glibc_hwcaps_compare() (elf/dl-cache.c) reads the subdirectory names at `cache + index`, the
  file start, while ldconfig (elf/cache.c write_extensions) stores them relative to the new
  table.  Every name then reads as some other string (`ldconfig -p` shows it too:
  `hwcap: "u/libmenuw.so.6"`), no name matches a usable subdirectory, each hwcaps entry gets
  priority 0 and is passed over: the plain copy loads.
- old: no hwcap data at all; ldconfig still lists the glibc-hwcaps entries (their legacy
  hwcap is 0) and sorts them first, and the first entry with the right flags wins.

Oracle: the program itself, run by ld.so in a private mount namespace with the test cache
bound over /etc/ld.so.cache.  Each copy returns a different value, and LD_DEBUG=libs names
the file ld.so tried; both must agree before seedance is compared with them.
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
from seedance.resolve.ldcache import LdCache
from tests.conftest import BIN

LDCONFIG = shutil.which("ldconfig") or "/sbin/ldconfig"
RTLD = "/lib64/ld-linux-x86-64.so.2"
CLEAN = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
LIB = "libseedwhich.so.1"
# the value each copy's function returns: what the program prints tells which copy ran
COPIES = {"": 1, "glibc-hwcaps/x86-64-v2/": 2}
FORMAT_NAMES = {"new": "new", "compat": "old+new", "old": "old"}


def _x86_64_v2_searched() -> bool:
    """ld.so --help lists the glibc-hwcaps subdirectories it searches on this CPU."""
    return "searched" in ld_so_hwcaps_levels(RTLD).get("x86-64-v2", set())


def _skip_reason():
    if os.uname().machine != "x86_64":
        return "x86-64 only (glibc-hwcaps/x86-64-v2)"
    if os.geteuid() != 0:
        return "needs root to bind a cache over /etc/ld.so.cache in a private mount namespace"
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "needs unshare and mount (util-linux)"
    if shutil.which("gcc") is None or not os.path.exists(LDCONFIG) or not os.path.exists(RTLD):
        return "needs gcc, ldconfig and the x86-64 ld.so"
    if not _x86_64_v2_searched():
        return "this CPU lacks x86-64-v2: ld.so would not search glibc-hwcaps/x86-64-v2"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    base = tmp_path_factory.mktemp("compat_hwcaps")
    top = base / "lib"
    for sub, value in COPIES.items():
        (top / sub).mkdir(parents=True, exist_ok=True)
        src = base / f"which{value}.c"
        src.write_text(f"int seed_which(void){{return {value};}}\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(top / sub / LIB), str(src),
                        f"-Wl,-soname,{LIB}"], check=True)
    (base / "m.c").write_text('#include <stdio.h>\nint seed_which(void);\n'
                              'int main(void){printf("which=%d\\n", seed_which());return 0;}\n')
    # no RPATH/RUNPATH: the NEEDED name can only come from the cache (or the default dirs,
    # which do not hold it)
    subprocess.run(["gcc", "-o", str(base / "app"), str(base / "m.c"), str(top / LIB)], check=True)
    (base / "ld.so.conf").write_text(f"{top}\n")
    return base


def _write_cache(base: Path, fmt: str) -> Path:
    cache_file = base / f"ld.so.cache.{fmt}"
    proc = subprocess.run([LDCONFIG, "-X", "-i", "-C", str(cache_file), "-f", str(base / "ld.so.conf"),
                           "-c", fmt], capture_output=True, timeout=120)
    if proc.returncode != 0 or not cache_file.exists():
        pytest.skip(f"this ldconfig does not write the {fmt} format: "
                    f"{proc.stderr.decode('utf-8', 'replace').strip()[:200]}")
    return cache_file


def _ld_so_choice(base: Path, cache_file: Path) -> str:
    """The copy ld.so loads: the path LD_DEBUG=libs says it tried from the cache, checked
    against the value the program printed."""
    proc = run_with_ld_so_cache(cache_file, base / "app", env={**CLEAN, "LD_DEBUG": "libs"})
    assert proc.returncode == 0, proc.stderr
    path = ld_so_cache_try(proc.stderr, LIB)
    sub = str(Path(path).parent.relative_to(base / "lib"))
    printed = proc.stdout.strip()
    assert printed == f"which={COPIES['' if sub == '.' else sub + '/']}", (path, printed)
    return path


@pytest.mark.parametrize("fmt", ["new", "compat", "old"])
def test_the_cached_copy_is_the_one_ld_so_loads(tree, fmt):
    cache_file = _write_cache(tree, fmt)
    chosen = _ld_so_choice(tree, cache_file)

    cache = LdCache.load(str(cache_file))
    assert cache.format == FORMAT_NAMES[fmt]
    res = next(r for r in Resolver(env={}, cache_path=str(cache_file)).closure(str(tree / "app")).resolutions
               if r.name == LIB)
    assert (res.source, res.path) == ("ld.so.cache", chosen)

    # the command a user runs, reading the same cache at its real place
    exe = BIN / "seedance"
    if exe.exists():
        proc = run_with_ld_so_cache(cache_file, exe, "ldd", tree / "app", env=CLEAN)
        assert proc.returncode == 0, proc.stderr
        assert f"\t{LIB} => {chosen}" in proc.stdout.splitlines(), proc.stdout


def test_the_formats_really_differ_here(tree):
    """Guards the test above against passing vacuously: if ld.so took the same copy from
    every format, the comparison would not exercise the hwcaps choice at all."""
    choices = {fmt: _ld_so_choice(tree, _write_cache(tree, fmt)) for fmt in ("new", "compat")}
    if choices["new"] == choices["compat"]:
        pytest.skip(f"this glibc takes the same copy from both formats: {choices['new']}")
    assert "glibc-hwcaps/x86-64-v2/" in choices["new"]


def _swap_hwcaps_names(path: Path) -> list:
    """Swap the first two entries of a new-format cache's glibc-hwcaps name list (extension
    section tag 1; offsets from the file start, dl-cache.h); the names before the swap."""
    data = bytearray(path.read_bytes())
    assert data[:20] == b"glibc-ld.so.cache1.1"
    (ext,) = struct.unpack_from("<I", data, 32)  # struct cache_file_new.extension_offset
    magic, count = struct.unpack_from("<II", data, ext)
    assert magic == 0xEAA42174, hex(magic)
    for index in range(count):
        tag, _flags, offset, size = struct.unpack_from("<IIII", data, ext + 8 + 16 * index)
        if tag == 1:
            break
    else:
        raise AssertionError("ldconfig wrote no glibc-hwcaps section")
    offsets = list(struct.unpack_from(f"<{size // 4}I", data, offset))
    names = [bytes(data[o:data.index(b"\0", o)]).decode("ascii", "replace") for o in offsets]
    struct.pack_into("<II", data, offset, offsets[1], offsets[0])
    path.write_bytes(bytes(data))
    return names


def test_an_out_of_order_hwcaps_name_list_is_merged_as_ld_so_merges_it(tmp_path):
    """glibc_hwcaps_priorities_init() merges the cache's name list with the usable names as two
    sorted lists; a usable name after one that sorts past every usable name is never reached
    and gets priority 0 (how a compat cache's misread names behave).  Here the list ldconfig
    wrote, [x86-64-v2, zzz-other], is swapped by hand, so the entries ldconfig made for
    glibc-hwcaps/zzz-other/ now point at the name "x86-64-v2".  A lookup by name would take
    that copy; ld.so, which walks the merge, loads the plain one."""
    top = tmp_path / "lib"
    for sub, value in (("", 1), ("glibc-hwcaps/x86-64-v2/", 2), ("glibc-hwcaps/zzz-other/", 3)):
        (top / sub).mkdir(parents=True, exist_ok=True)
        (tmp_path / f"o{value}.c").write_text(f"int seed_only(void){{return {value};}}\n")
        names = ["libseedonly.so.1"] if sub != "glibc-hwcaps/x86-64-v2/" else []
        names += [LIB] if sub != "glibc-hwcaps/zzz-other/" else []  # keeps x86-64-v2 in the list
        for lib in names:
            subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(top / sub / lib), str(tmp_path / f"o{value}.c"),
                            f"-Wl,-soname,{lib}"], check=True)
    (tmp_path / "m.c").write_text('#include <stdio.h>\nint seed_only(void);\n'
                                  'int main(void){printf("which=%d\\n", seed_only());return 0;}\n')
    subprocess.run(["gcc", "-o", str(tmp_path / "app"), str(tmp_path / "m.c"), str(top / "libseedonly.so.1")],
                   check=True)
    (tmp_path / "ld.so.conf").write_text(f"{top}\n")
    cache_file = tmp_path / "ld.so.cache"
    write_ld_so_cache(cache_file, tmp_path / "ld.so.conf", "-i", "-c", "new")
    assert _swap_hwcaps_names(cache_file) == ["x86-64-v2", "zzz-other"]

    proc = run_with_ld_so_cache(cache_file, tmp_path / "app", env={**CLEAN, "LD_DEBUG": "libs"})
    assert proc.returncode == 0, proc.stderr
    chosen = ld_so_cache_try(proc.stderr, "libseedonly.so.1")
    value = {str(top / "libseedonly.so.1"): 1, str(top / "glibc-hwcaps/zzz-other/libseedonly.so.1"): 3}[chosen]
    assert proc.stdout.strip() == f"which={value}", (chosen, proc.stdout)

    res = next(r for r in Resolver(env={}, cache_path=str(cache_file)).closure(str(tmp_path / "app")).resolutions
               if r.name == "libseedonly.so.1")
    assert (res.source, res.path) == ("ld.so.cache", chosen)
