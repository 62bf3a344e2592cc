"""Tests written for the seed-2027 sample survivors of agent/resolve/ that first ran out of
time and then passed with a nine-fold limit (bench/run_mutation.py, issue 17).

Every expectation comes from outside the code under test: the real ld.so (run with a cache
written by the real ldconfig bound over /etc/ld.so.cache, LD_DEBUG=libs naming the file it
took; a set-user-ID program run as nobody, AT_SECURE, printing what dl_iterate_phdr sees)
and the real open(2) error text."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile

import pytest

from seedance.model.errors import ELFError
from seedance.resolve import Resolver
from seedance.resolve.ldcache import LdCache
from tests.conftest import ld_so_cache_try, run_with_ld_so_cache, write_ld_so_cache

CLEAN = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
LDCONFIG = shutil.which("ldconfig") or "/sbin/ldconfig"

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or os.uname().machine != "x86_64",
                                reason="x86-64 with gcc needed")


def _gcc(*args):
    subprocess.run(["gcc", *map(str, args)], check=True, capture_output=True)


def _lib(path, soname, source, *extra):
    src = str(path) + ".c"
    with open(src, "w") as handle:
        handle.write(source)
    _gcc("-shared", "-fPIC", "-o", path, src, *(["-Wl,-soname," + soname] if soname else []), *extra)
    os.unlink(src)
    return str(path)


# --- _dl_cache_libcmp: digit runs compare as numbers, "01" == "1" ---------------------------
# NEEDED names that differ from the cached sonames only by a leading zero in a digit run:
# glibc's _dl_cache_libcmp (elf/dl-cache.c) compares digit runs by value, so search_cache
# finds the cached entry for them; ld.so's own choice (LD_DEBUG=libs) is the oracle.
ZERO_NAMES = {"libseedz.so.01": "libseedz.so.1",  # the run ends the name
              "libseed01x.so.1": "libseed1x.so.1"}  # equal text follows the run


@pytest.fixture(scope="module")
def zero_cache(tmp_path_factory):
    if not os.path.exists(LDCONFIG) or shutil.which("unshare") is None:
        pytest.skip("ldconfig and unshare needed")
    top = tmp_path_factory.mktemp("zero")
    (top / "lib").mkdir()
    (top / "stub").mkdir()
    calls = []
    for index, (needed, cached) in enumerate(ZERO_NAMES.items()):
        body = f"int seedz{index}(void){{return {index};}}\n"
        _lib(top / "lib" / cached, cached, body)
        # a stub with the zero-padded soname, only to give the program that NEEDED name
        _lib(top / "stub" / needed, needed, body)
        calls.append(f"seedz{index}()")
    (top / "m.c").write_text("".join(f"int seedz{i}(void);" for i in range(len(calls)))
                             + f"int main(void){{return {' + '.join(calls)} - {sum(range(len(calls)))};}}\n")
    _gcc("-o", top / "app", top / "m.c", *[top / "stub" / n for n in ZERO_NAMES])
    shutil.rmtree(top / "stub")
    (top / "ld.so.conf").write_text(f"{top / 'lib'}\n")
    cache = top / "ld.so.cache"
    write_ld_so_cache(cache, top / "ld.so.conf", "-i")
    proc = run_with_ld_so_cache(cache, top / "app", env={**CLEAN, "LD_DEBUG": "libs"}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    chosen = {needed: ld_so_cache_try(proc.stderr, needed) for needed in ZERO_NAMES}
    for needed, cached in ZERO_NAMES.items():
        assert chosen[needed] == str(top / "lib" / cached), proc.stderr  # ld.so matched "01" to "1"
    return {"cache": str(cache), "app": str(top / "app"), "chosen": chosen, "top": top}


def test_a_zero_padded_digit_run_finds_the_cached_entry_as_ld_so_does(zero_cache):
    cache = LdCache.load(zero_cache["cache"])
    assert {name: cache.lookup(name) for name in ZERO_NAMES} == zero_cache["chosen"]
    closure = Resolver(env={}, cache_path=zero_cache["cache"]).closure(zero_cache["app"])
    found = {r.name: (r.source, r.path) for r in closure.resolutions if r.name in ZERO_NAMES}
    assert found == {name: ("ld.so.cache", path) for name, path in zero_cache["chosen"].items()}


def test_a_plain_cache_entry_is_taken_whatever_the_platform(zero_cache, tmp_path):
    """search_cache (elf/dl-cache.c) tests the platform only for entries with
    _DL_HWCAP_PLATFORM bits; ldconfig writes none for a library outside a platform
    subdirectory, so ld.so's choice here (AT_PLATFORM x86_64 on this host, or haswell on a
    Haswell-class Intel) is the choice under every x86 platform name (dl-procinfo.h: i586,
    i686, haswell, xeon_phi)."""
    cache = LdCache.load(zero_cache["cache"])
    for platform in ("i586", "i686", "haswell", "xeon_phi", "x86_64"):
        assert {n: cache.lookup(n, platform=platform) for n in ZERO_NAMES} == zero_cache["chosen"], platform
    # the same through a Resolver whose CPU is a Haswell-class Intel (platform "haswell",
    # sysdeps/x86/cpu-features.c)
    info = tmp_path / "cpuinfo"
    info.write_text("vendor_id\t: GenuineIntel\nflags\t\t: fpu cmov cx8 mmx sse sse2 sse3 ssse3 sse4_1 "
                    "sse4_2 popcnt avx avx2 fma bmi1 bmi2 abm movbe f16c xsave cx16 lahf_lm\n")
    resolver = Resolver(env={}, cache_path=zero_cache["cache"], cpuinfo=str(info))
    assert resolver.platform == "haswell"
    found = {r.name: r.path for r in resolver.closure(zero_cache["app"]).resolutions if r.name in ZERO_NAMES}
    assert found == zero_cache["chosen"]


def test_a_cache_file_is_parsed_once_until_ldconfig_replaces_it(zero_cache, tmp_path):
    """LdCache.load: one parse per file version per process (its docstring); ldconfig writes
    a new file (a new inode), and the next load sees the library it added."""
    conf = tmp_path / "ld.so.conf"
    conf.write_text(f"{zero_cache['top'] / 'lib'}\n")
    cache_file = tmp_path / "ld.so.cache"
    write_ld_so_cache(cache_file, conf, "-i")
    first = LdCache.load(str(cache_file))
    assert LdCache.load(str(cache_file)) is first
    assert first.lookup("libseedextra.so.3") is None
    (tmp_path / "more").mkdir()
    extra = _lib(tmp_path / "more" / "libseedextra.so.3", "libseedextra.so.3", "int seedextra(void){return 3;}\n")
    conf.write_text(f"{zero_cache['top'] / 'lib'}\n{tmp_path / 'more'}\n")
    write_ld_so_cache(cache_file, conf, "-i")
    listed = subprocess.run([LDCONFIG, "-p", "-C", str(cache_file)], capture_output=True, text=True,
                            errors="replace").stdout
    assert f"=> {extra}" in listed
    again = LdCache.load(str(cache_file))
    assert again is not first and again.lookup("libseedextra.so.3") == extra
    assert LdCache.load(str(cache_file)) is again


# --- Resolver.read: a missing file ----------------------------------------------------------

def test_reading_a_missing_file_names_it_with_the_open_error(tmp_path):
    """open(2) says ENOENT; the ELFError names the path ld.so would have opened."""
    missing = str(tmp_path / "libnothere.so")
    with pytest.raises(FileNotFoundError) as real:
        open(missing, "rb")
    assert real.value.errno == errno.ENOENT
    with pytest.raises(ELFError) as raised:
        Resolver(env={}).read(missing)
    assert str(raised.value) == f"{missing}: {os.strerror(errno.ENOENT).lower()}"
    # under a root, the file looked for is the one below the root
    with pytest.raises(ELFError) as raised:
        Resolver(env={}, root=str(tmp_path)).read("/lib/libnothere.so")
    assert str(raised.value) == f"{tmp_path}/lib/libnothere.so: {os.strerror(errno.ENOENT).lower()}"


# --- AT_SECURE: a set-user-ID program run as nobody -----------------------------------------
LIST_MAPS = r"""
#define _GNU_SOURCE
#include <link.h>
#include <stdio.h>
%s
static int show(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size; (void)data;
    if (info->dlpi_name && info->dlpi_name[0]) printf("%%s\n", info->dlpi_name);
    return 0;
}
int main(void) { %s dl_iterate_phdr(show, NULL); return 0; }
"""


@pytest.fixture(scope="module")
def secure_dir():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("root and setpriv needed to run a set-user-ID program as nobody")
    top = tempfile.mkdtemp(prefix="seedance-secure-", dir="/tmp")
    os.chmod(top, 0o755)  # nobody must reach the program and its libraries
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _as_nobody(program, env=None):
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", program],
                          capture_output=True, text=True, errors="replace", timeout=60, env={**CLEAN, **(env or {})})
    return proc


def _setuid_program(path, source, *link):
    with open(path + ".c", "w") as handle:
        handle.write(source)
    _gcc("-o", path, path + ".c", *link)
    os.chmod(path, 0o4755)  # root-owned, set-user-ID: AT_SECURE when nobody runs it
    return path


def test_a_secure_preload_takes_only_a_set_user_id_library(secure_dir):
    """rtld.c do_preload / dl-load.c open_path under __RTLD_SECURE: a preload found by a
    search must have S_ISUID, else it is ignored ("cannot be preloaded ... ignored")."""
    lib = os.path.join(secure_dir, "plib")
    os.mkdir(lib)
    os.chmod(lib, 0o755)
    suid = _lib(os.path.join(lib, "libseedsuid.so"), "libseedsuid.so", "int seedsuid(void){return 1;}\n")
    plain = _lib(os.path.join(lib, "libseedplain.so"), "libseedplain.so", "int seedplain(void){return 2;}\n")
    os.chmod(suid, 0o4755)
    os.chmod(plain, 0o755)
    prog = _setuid_program(os.path.join(secure_dir, "preprog"), LIST_MAPS % ("", ""),
                           f"-Wl,-rpath,{lib}", "-Wl,--disable-new-dtags")
    env = {"LD_PRELOAD": "libseedsuid.so libseedplain.so"}
    proc = _as_nobody(prog, env)
    assert proc.returncode == 0, proc.stderr
    loaded = set(proc.stdout.split())
    assert suid in loaded and plain not in loaded, proc.stdout + proc.stderr
    assert "libseedplain.so' from LD_PRELOAD cannot be preloaded" in proc.stderr, proc.stderr
    closure = Resolver(env=env, secure=True).closure(prog)
    pre = {r.name: r for r in closure.resolutions if r.name in ("libseedsuid.so", "libseedplain.so")}
    assert (pre["libseedsuid.so"].source, pre["libseedsuid.so"].path) == ("rpath", suid)
    assert pre["libseedplain.so"].path is None
    assert pre["libseedplain.so"].tried[-1] == (plain, "secure preload requires a set-user-ID file")
    assert suid in closure.objects and plain not in closure.objects


def test_a_secure_preload_is_not_taken_from_the_ld_so_cache(secure_dir, tmp_path):
    """dl-load.c _dl_map_object skips ld.so.cache for a name loaded with __RTLD_SECURE under
    AT_SECURE (every LD_PRELOAD of a set-user-ID program): a set-user-ID library that only the
    cache lists is not preloaded, while one in a default directory is (the real ld.so, run as
    nobody with a cache listing both bound over /etc/ld.so.cache, is the oracle)."""
    only_cached = os.path.join(secure_dir, "cached")
    os.mkdir(only_cached)
    os.chmod(only_cached, 0o755)
    cached = _lib(os.path.join(only_cached, "libseedcached.so"), "libseedcached.so", "int seedc(void){return 1;}\n")
    os.chmod(cached, 0o4755)  # set-user-ID, yet not taken: the cache is not searched
    conf = tmp_path / "ld.so.conf"
    conf.write_text(only_cached + "\n")
    cache = tmp_path / "ld.so.cache"
    write_ld_so_cache(cache, conf)
    prog = _setuid_program(os.path.join(secure_dir, "cacheprog"), LIST_MAPS % ("", ""))
    env = {"LD_PRELOAD": "libseedcached.so"}
    proc = run_with_ld_so_cache(cache, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", prog,
                                env={**CLEAN, **env})
    assert proc.returncode == 0, proc.stderr
    assert cached not in proc.stdout.split(), proc.stdout
    assert "libseedcached.so' from LD_PRELOAD cannot be preloaded" in proc.stderr, proc.stderr
    as_root = run_with_ld_so_cache(cache, prog, env={**CLEAN, **env})  # not secure: the cache serves it
    assert cached in as_root.stdout.split(), as_root.stdout + as_root.stderr
    secure = Resolver(env=env, secure=True, cache_path=str(cache)).closure(prog)
    [pre] = [r for r in secure.resolutions if r.name == "libseedcached.so"]
    assert pre.path is None and cached not in secure.objects
    assert "ld.so.cache" not in [source for source, _d in pre.search_order]
    plain = Resolver(env=env, cache_path=str(cache)).closure(prog)
    [pre] = [r for r in plain.resolutions if r.name == "libseedcached.so"]
    assert (pre.source, pre.path) == ("ld.so.cache", cached)


def test_secure_origin_rpath_is_dropped_for_the_program_but_kept_for_its_library(secure_dir):
    """dl-load.c _dl_dst_substitute: under AT_SECURE a $ORIGIN path must lie in a trusted
    directory only for the executable (l_type == lt_executable).  The program and libA, in
    the same directory, both carry RPATH $ORIGIN/lib: the program's is dropped (its libc
    lookup computes it first), libA's still finds libB there."""
    top = os.path.join(secure_dir, "origin")
    lib = os.path.join(top, "lib")
    os.makedirs(lib)
    os.chmod(top, 0o755)
    os.chmod(lib, 0o755)
    lib_b = _lib(os.path.join(lib, "libseedob.so"), "libseedob.so", "int seedob(void){return 5;}\n")
    lib_a = os.path.join(top, "libseedoa.so")  # no soname: the program NEEDs it by this path
    _lib(lib_a, None, "int seedob(void); int seedoa(void){return seedob();}\n",
         lib_b, "-Wl,-rpath,$ORIGIN/lib", "-Wl,--disable-new-dtags")
    source = LIST_MAPS % ("int seedoa(void);", "if (seedoa() != 5) return 3;")
    prog = _setuid_program(os.path.join(top, "oprog"), source, lib_a, "-Wl,-rpath,$ORIGIN/lib", "-Wl,--disable-new-dtags")
    proc = _as_nobody(prog)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    loaded = proc.stdout.split()
    assert lib_a in loaded and lib_b in loaded, proc.stdout
    closure = Resolver(env={}, secure=True).closure(prog)
    by_name = {r.name: r for r in closure.resolutions}
    assert (by_name[lib_a].source, by_name[lib_a].path) == ("direct", lib_a)
    assert (by_name["libseedob.so"].source, by_name["libseedob.so"].path) == ("rpath", lib_b)
    # the program's own $ORIGIN RPATH was searched for nothing: libc came from the cache or
    # the default directories, never from an rpath
    libc = next(r for r in closure.resolutions if r.name == "libc.so.6" and r.requester == prog)
    assert libc.source in ("ld.so.cache", "default")
    assert ("rpath", lib + "/") not in libc.search_order
