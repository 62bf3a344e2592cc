"""Tests written for the mutants of agent/resolve/ that the suite let through
(bench/run_mutation.py, bench/mutation-survivors.md).

The search order is judged against ld.so itself: LD_DEBUG=libs prints, for each library it
looks for, every directory list it searched and where the list came from.  The secure-mode
$ORIGIN check follows glibc's is_trusted_path_normalize (elf/dl-load.c)."""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess

import pytest

from seedance.resolve import Resolver
from seedance.resolve.tokens import is_trusted
from tests.conftest import ld_so_cache_try, run_with_ld_so_cache, write_ld_so_cache

CLEAN = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
# the directory variants ld.so prints in a search path before each directory it was given:
# glibc-hwcaps levels and the legacy tls/platform/hwcap subdirectories (on an Intel CPU
# with AVX-512, glibc 2.36 also tries tls/haswell/avx512_1/x86_64 and its shorter forms)
VARIANT = re.compile(r"/(glibc-hwcaps/[^/:]+|(tls|haswell|xeon_phi|avx512_1|x86_64)"
                     r"(/(haswell|xeon_phi|avx512_1|x86_64))*)$")
SOURCES = {"RPATH": "rpath", "RUNPATH": "runpath", "LD_LIBRARY_PATH": "ld_library_path",
           "system search path": "default"}


def ld_so_search(program, library: str, env=None) -> list:
    """[(source, directory)] ld.so searched for ``library``, in order, from LD_DEBUG=libs."""
    proc = subprocess.run([str(program)], capture_output=True, text=True, errors="replace", timeout=60,
                          env={**CLEAN, **(env or {}), "LD_DEBUG": "libs"})
    order, active = [], False
    for line in proc.stderr.splitlines():
        text = line.split(":", 1)[1].strip() if ":" in line else line.strip()
        if text.startswith("find library="):
            active = text.startswith(f"find library={library} ")
            continue
        if not active:
            continue
        if text.startswith("search cache="):
            order.append(("ld.so.cache", text.split("=", 1)[1]))
        elif text.startswith("search path="):
            dirs, _, where = text[len("search path="):].partition("\t")
            where = where.strip().strip("()")
            source = next((v for k, v in SOURCES.items() if where.startswith(k)), where)
            order += [(source, d) for d in dirs.split(":") if not VARIANT.search(d)]
        elif not text.startswith("trying file="):
            active = False  # the next library's lines, or the program's own
    return order


@pytest.fixture
def app_with_rpath_and_a_missing_library(tmp_path):
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    (tmp_path / "link").mkdir()
    (tmp_path / "g.c").write_text("int g(void){return 1;}\n")
    (tmp_path / "m.c").write_text("int g(void); int main(void){return g();}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", tmp_path / "link" / "libgone.so", tmp_path / "g.c",
                    "-Wl,-soname,libgone.so"], check=True)
    subprocess.run(["gcc", "-o", tmp_path / "app", tmp_path / "m.c", tmp_path / "link" / "libgone.so",
                    "-Wl,--disable-new-dtags", f"-Wl,-rpath,{tmp_path / 'r1'}:{tmp_path / 'r2'}"], check=True)
    (tmp_path / "link" / "libgone.so").unlink()
    return tmp_path / "app"


def test_search_order_is_ld_sos_for_the_main_programs_own_needed(app_with_rpath_and_a_missing_library):
    app = app_with_rpath_and_a_missing_library
    expected = ld_so_search(app, "libgone.so")
    assert expected and expected[0][0] == "rpath", expected  # the oracle parsed something real
    closure = Resolver(env={}).closure(str(app))
    gone = next(r for r in closure.resolutions if r.name == "libgone.so")
    assert gone.source == "not-found"
    # the program's own DT_RPATH is searched once, not again as "the main program's" at the end
    assert [(s, d.rstrip("/") or "/") for s, d in gone.search_order] == \
        [(s, d.rstrip("/") or "/") for s, d in expected]


# glibc elf/dl-load.c is_trusted_path_normalize: '.', '..' and '//' collapse, then the
# result must start with one of the system directories followed by '/'.
SYSTEM = ("/lib/x86_64-linux-gnu/", "/usr/lib/x86_64-linux-gnu/")


@pytest.mark.parametrize("path, trusted", [
    ("/usr/lib/x86_64-linux-gnu", True),
    ("/usr/lib/x86_64-linux-gnu/", True),
    ("/usr//lib/./x86_64-linux-gnu/.", True),
    ("/tmp/../usr/lib/x86_64-linux-gnu/sub", True),
    ("/usr/lib/x86_64-linux-gnu/../../../tmp", False),
    ("/usr/lib/x86_64-linux-gnu-evil", False),
    ("usr/lib/x86_64-linux-gnu", False),  # relative: never a system directory
    ("/tmp/x", False),
    ("", False),
])
def test_secure_origin_trusts_only_normalised_system_dirs(path, trusted):
    assert is_trusted(path, SYSTEM) is trusted


def test_root_itself_normalises_to_slash():
    assert is_trusted("/..", ("/",)) is True
    assert is_trusted("/.", ("/usr/",)) is False


@pytest.mark.parametrize("name, major", [
    ("libgfortran.so.5.0.0", "libgfortran.so.5"), ("libcudart.so.12", "libcudart.so.12"),
    ("libcudart.so.12.8.90", "libcudart.so.12"), ("libfoo.so", "libfoo.so"), ("libz.so.1.2.13", "libz.so.1"),
])
def test_major_name(name, major):
    from seedance.resolve.resolver import _major_name

    assert _major_name(name) == major


# elf/dl-load.c _dl_dst_substitute (glibc 2.36), as tokens.py's docstring states it
def test_a_token_after_an_unknown_one_is_still_a_token():
    from seedance.resolve.tokens import has_tokens

    assert has_tokens("$ORIGIN/$FOO") is True
    assert has_tokens("$FOO/$ORIGIN") is True
    assert has_tokens("$FOO/$BAR") is False


@pytest.mark.parametrize("text, secure, is_main, expanded", [
    ("$ORIGIN/lib", True, False, "/opt/app/lib"),   # secure: at the start, then '/': kept
    ("$ORIGIN", True, False, "/opt/app"),           # secure: the whole element: kept
    ("lib/$ORIGIN", True, False, ""),               # secure: not at the start: dropped
    ("$ORIGIN/lib", True, True, ""),                # secure main program: /opt/app is not trusted
    ("$ORIGIN/lib", False, True, "/opt/app/lib"),
])
def test_secure_origin(text, secure, is_main, expanded):
    from seedance.resolve.tokens import expand

    assert expand(text, "/opt/app", "lib/x86_64-linux-gnu", "x86_64", secure=secure, is_main=is_main,
                  trusted_dirs=SYSTEM) == expanded


def test_a_library_ld_so_finds_in_its_cache_is_reported_as_found_there(tmp_path):
    """ld.so looks up a bare NEEDED name in /etc/ld.so.cache before the default directories
    (LD_DEBUG=libs shows which step found it); the resolver must say the same step."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    (tmp_path / "m.c").write_text("#include <zlib.h>\nint main(void){return zlibVersion() == 0;}\n")
    built = subprocess.run(["gcc", "-o", tmp_path / "app", tmp_path / "m.c", "-lz"], capture_output=True)
    if built.returncode != 0:
        pytest.skip("zlib development files not installed")
    proc = subprocess.run([str(tmp_path / "app")], capture_output=True, text=True, errors="replace", timeout=60,
                          env={**CLEAN, "LD_DEBUG": "libs"})
    lines = [line.split(":", 1)[1].strip() for line in proc.stderr.splitlines() if ":" in line]
    start = next(i for i, line in enumerate(lines) if line.startswith("find library=libz.so.1 "))
    block = []
    for line in lines[start + 1:]:
        if not line.startswith(("search ", "trying file=")):
            break  # the next library's lookup, or the program starting
        block.append(line)
    steps = [line for line in block if line.startswith("search ")]
    # found in the cache: the cache was the only place searched
    found_in_cache = [s.split("=")[0] for s in steps] == ["search cache"]
    closure = Resolver(env={}).closure(str(tmp_path / "app"))
    libz = next(r for r in closure.resolutions if r.name == "libz.so.1")
    assert libz.source == ("ld.so.cache" if found_in_cache else "default"), steps


def test_a_pie_executable_found_for_a_needed_name_stops_the_load_as_ld_so_says(tmp_path):
    """ld.so refuses to load a PIE executable as a library and stops there (a fatal
    open_verify verdict, not "keep searching"); its own message is the oracle."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    (tmp_path / "link").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "p.c").write_text("int pf(void){return 1;}\n")
    (tmp_path / "e.c").write_text("int pf(void){return 1;} int main(void){return 0;}\n")
    (tmp_path / "m.c").write_text("int pf(void); int main(void){return pf()-1;}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", tmp_path / "link" / "libpie.so", tmp_path / "p.c",
                    "-Wl,-soname,libpie.so"], check=True)
    subprocess.run(["gcc", "-o", tmp_path / "app", tmp_path / "m.c", tmp_path / "link" / "libpie.so",
                    "-Wl,--disable-new-dtags", f"-Wl,-rpath,{tmp_path / 'run'}"], check=True)
    subprocess.run(["gcc", "-fPIE", "-pie", "-o", tmp_path / "run" / "libpie.so", tmp_path / "e.c"], check=True)
    proc = subprocess.run([str(tmp_path / "app")], capture_output=True, text=True, errors="replace", env=CLEAN,
                          timeout=60)
    assert proc.returncode == 127
    ld_so_says = proc.stderr.strip().rsplit("libpie.so: ", 1)[1]
    closure = Resolver(env={}).closure(str(tmp_path / "app"))
    pie = next(r for r in closure.resolutions if r.name == "libpie.so")
    assert pie.source == "not-found"
    assert pie.tried == ((str(tmp_path / "run" / "libpie.so"), ld_so_says),)


def test_two_libraries_without_build_id_keep_their_own_symbols(tmp_path):
    """Symbol tables are cached per object; two libraries with no build-id and the same
    number of symbols must not share one.  Oracle: ld.so binds everything at start-up
    (LD_BIND_NOW) and the program runs."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    libs = []
    for name in ("one", "two"):
        (tmp_path / f"{name}.c").write_text(f"int fn_{name}(void){{return 1;}}\n")
        lib = tmp_path / f"lib{name}.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,--build-id=none", "-o", lib, tmp_path / f"{name}.c",
                        f"-Wl,-soname,lib{name}.so"], check=True)
        libs.append(lib)
    (tmp_path / "m.c").write_text("int fn_one(void), fn_two(void); int main(void){return fn_one()+fn_two()-2;}\n")
    subprocess.run(["gcc", "-o", tmp_path / "app", tmp_path / "m.c", *libs, "-Wl,--disable-new-dtags",
                    f"-Wl,-rpath,{tmp_path}"], check=True)
    assert subprocess.run([str(tmp_path / "app")], env={**CLEAN, "LD_BIND_NOW": "1"}, timeout=60).returncode == 0
    resolver = Resolver(env={})
    closure = resolver.closure(str(tmp_path / "app"), symbols=True)
    assert [u for u in resolver.undefined(closure) if "fn_" in str(u)] == []


# -- second round (bench/mutation-survivors.md, "resolve, second sample") --------------------
RTLD = "/lib64/ld-linux-x86-64.so.2"
LDCONFIG = shutil.which("ldconfig") or "/sbin/ldconfig"


def _glibc_hwcaps_searched(env=None) -> list:
    """The glibc-hwcaps subdirectories ld.so --help marks "supported, searched", best first."""
    text = subprocess.run([RTLD, "--help"], capture_output=True, text=True, errors="replace",
                          env={**CLEAN, **(env or {})}, timeout=60).stdout
    lines = text.split("Subdirectories of glibc-hwcaps directories, in priority order:", 1)[1].split("\n\n")[0]
    return [line.split()[0] for line in lines.splitlines() if "supported" in line]


# glibc.cpu.hwcaps=-NAME turns a CPU feature off for ld.so (sysdeps/x86/cpu-tunables.c); the
# same feature is removed from a copy of /proc/cpuinfo.  SSE4_2 and POPCNT are x86-64-v2
# features, AVX2 a v3 one: the levels are cumulative (x86-64 psABI), so losing a v2 feature
# loses v3 and v4 too, whatever else the CPU has.
@pytest.mark.parametrize("feature", ["SSE4_2", "POPCNT", "AVX2"])
def test_hwcaps_levels_with_a_feature_masked_match_ld_so(tmp_path, feature):
    from seedance.resolve import hwcaps

    if os.uname().machine != "x86_64" or not os.path.exists(RTLD):
        pytest.skip("x86-64 glibc only")
    if hwcaps.glibc_version() < (2, 33):
        pytest.skip("glibc-hwcaps needs glibc 2.33")
    cpuinfo = open("/proc/cpuinfo", encoding="utf-8", errors="replace").read()
    flag = feature.lower()
    if not re.search(rf"^flags\s*:.*\b{flag}\b", cpuinfo, re.M):
        pytest.skip(f"this CPU has no {flag}")
    masked = tmp_path / "cpuinfo"
    masked.write_text(re.sub(rf"(^flags\s*:.*?) {flag}\b", r"\1", cpuinfo, flags=re.M))
    level = "x86-64-v3" if feature == "AVX2" else "x86-64-v2"
    if level not in _glibc_hwcaps_searched():
        pytest.skip(f"ld.so does not search {level} on this CPU: masking {feature} changes nothing")
    expected = _glibc_hwcaps_searched({"GLIBC_TUNABLES": f"glibc.cpu.hwcaps=-{feature}"})
    assert level not in expected  # the tunable took
    assert list(hwcaps.detect(str(masked)).hwcaps_subdirs) == expected


def test_an_intel_cpu_with_avx512_bw_dq_vl_gets_the_avx512_1_hwcap(tmp_path):
    """sysdeps/x86/cpu-features.c (glibc 2.26-2.36): on Intel, AVX512CD without AVX512ER,
    and AVX512BW+DQ+VL usable, sets HWCAP_X86_AVX512_1 (dl_hwcap bit 2), which adds the
    legacy "avx512_1" subdirectory; without AVX512BW it does not.  This host is not such a
    CPU, so the rule is taken from the source, on a written cpuinfo."""
    from seedance.resolve import hwcaps

    base = "avx avx2 bmi1 bmi2 f16c fma abm movbe xsave cx16 lahf_lm popcnt sse4_1 sse4_2 ssse3 avx512f avx512cd"
    for extra, has in (("avx512bw avx512dq avx512vl", True), ("avx512dq avx512vl", False)):
        info = tmp_path / "cpuinfo"
        info.write_text(f"vendor_id\t: GenuineIntel\nflags\t\t: {base} {extra}\n")
        caps = hwcaps.detect(str(info), libc=(2, 36), platform="haswell")
        assert bool(caps.hwcap_bits & (1 << 2)) is has
        assert ("avx512_1" in caps.legacy_subdirs) is has


def test_a_missing_cache_keeps_its_path(tmp_path):
    from seedance.resolve.ldcache import LdCache

    where = str(tmp_path / "no" / "ld.so.cache")
    cache = LdCache.load(where)
    assert (cache.format, cache.entries, cache.path) == ("missing", [], where)


def test_an_empty_cache_that_fits_exactly_is_valid(tmp_path):
    """glibc's dl-cache.c accepts a new-format cache when (size - header) / entry size >=
    nlibs: a 48-byte header with no entries is a valid, empty cache (ldconfig -p lists it
    as "0 libs found"), not a corrupt one."""
    from seedance.resolve.ldcache import LdCache

    blob = b"glibc-ld.so.cache1.1"
    empty = tmp_path / "empty.cache"
    empty.write_bytes(blob + bytes(48 - len(blob)))
    listed = subprocess.run([LDCONFIG, "-p", "-C", str(empty)], capture_output=True, text=True, errors="replace")
    assert listed.stdout.startswith("0 libs found"), listed.stdout + listed.stderr
    cache = LdCache.load(str(empty))
    assert (cache.format, cache.entries) == ("new", [])


def test_an_extension_offset_past_the_end_leaves_the_entries_usable(tmp_path):
    """A cache written by ldconfig, its extension_offset (struct cache_file_new, byte 32)
    pointed past the end of the file.  ldconfig -p refuses it ("Malformed extension data"),
    but ld.so still uses its entries.  Oracle: the program run by ld.so in a private mount
    namespace with that file bound over /etc/ld.so.cache, LD_DEBUG=libs saying where it found
    the library."""
    from seedance.resolve.ldcache import LdCache

    if shutil.which("gcc") is None or not os.path.exists(LDCONFIG) or shutil.which("unshare") is None:
        pytest.skip("gcc, ldconfig and unshare needed")
    (tmp_path / "lib").mkdir()
    (tmp_path / "x.c").write_text("int seedx(void){return 3;}\n")
    (tmp_path / "m.c").write_text("int seedx(void); int main(void){return seedx()-3;}\n")
    lib = tmp_path / "lib" / "libseedx.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", lib, tmp_path / "x.c", "-Wl,-soname,libseedx.so.1"], check=True)
    subprocess.run(["gcc", "-o", tmp_path / "app", tmp_path / "m.c", lib], check=True)  # no RPATH: the cache
    (tmp_path / "ld.so.conf").write_text(f"{tmp_path / 'lib'}\n")
    cache_file = tmp_path / "ld.so.cache"
    write_ld_so_cache(cache_file, tmp_path / "ld.so.conf", "-i")
    data = bytearray(cache_file.read_bytes())
    assert data[:20] == b"glibc-ld.so.cache1.1"  # the new format alone (glibc 2.32+ default)
    assert struct.unpack_from("<I", data, 32)[0] != 0  # ldconfig wrote an extension
    struct.pack_into("<I", data, 32, len(data) + 64)
    cache_file.write_bytes(bytes(data))
    proc = run_with_ld_so_cache(cache_file, tmp_path / "app", env={**CLEAN, "LD_DEBUG": "libs"}, timeout=60)
    assert ld_so_cache_try(proc.stderr, "libseedx.so.1") == str(lib), proc.stderr
    assert proc.returncode == 0, proc.stderr
    cache = LdCache.load(str(cache_file))
    assert cache.format == "new"
    assert cache.lookup("libseedx.so.1") == str(lib)
    res = next(r for r in Resolver(env={}, cache_path=str(cache_file)).closure(str(tmp_path / "app")).resolutions
               if r.name == "libseedx.so.1")
    assert (res.source, res.path) == ("ld.so.cache", str(lib))
    assert res.tried[-1] == (str(lib), "ok")  # the file ld.so took from the cache, accepted


def _ld_debug_lines(program) -> list:
    proc = subprocess.run([str(program)], capture_output=True, text=True, errors="replace", timeout=60,
                          env={**CLEAN, "LD_DEBUG": "libs"})
    return [line.split(":", 1)[1].strip() for line in proc.stderr.splitlines() if ":" in line]


def test_a_name_already_loaded_is_not_searched_again(tmp_path):
    """_dl_map_object first matches a NEEDED name against the loaded objects (names,
    SONAMEs) and searches only when none answers: LD_DEBUG=libs prints "find library=" once
    per search.  A library needed by the program and by another library is searched once;
    the second request is answered by the loaded object."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    (tmp_path / "a.c").write_text("int a(void){return 1;}\n")
    (tmp_path / "b.c").write_text("int a(void); int b(void){return a();}\n")
    (tmp_path / "m.c").write_text("int a(void), b(void); int main(void){return a()+b()-2;}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", tmp_path / "liba.so", tmp_path / "a.c",
                    "-Wl,-soname,liba.so"], check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", tmp_path / "libb.so", tmp_path / "b.c", tmp_path / "liba.so",
                    "-Wl,-soname,libb.so", f"-Wl,-rpath,{tmp_path}"], check=True)
    subprocess.run(["gcc", "-o", tmp_path / "app", tmp_path / "m.c", tmp_path / "liba.so", tmp_path / "libb.so",
                    f"-Wl,-rpath,{tmp_path}"], check=True)
    searches: dict = {}
    for line in _ld_debug_lines(tmp_path / "app"):
        if line.startswith("find library="):
            name = line[len("find library="):].split(" ", 1)[0]
            searches[name] = searches.get(name, 0) + 1
    assert searches.get("liba.so") == 1
    closure = Resolver(env={}).closure(str(tmp_path / "app"))
    ours: dict = {}
    for res in closure.resolutions:
        if res.source != "loaded":
            ours[res.name] = ours.get(res.name, 0) + 1
    assert ours == searches
    second = [r for r in closure.resolutions if r.name == "liba.so" and r.requester == str(tmp_path / "libb.so")]
    assert [(r.source, r.path) for r in second] == [("loaded", str(tmp_path / "liba.so"))]


def test_nodefaultlib_skips_the_cache_and_the_default_directories(tmp_path):
    """A library linked -z nodefaultlib (DF_1_NODEFLIB): ld.so searches its RUNPATH and the
    cache (whose entries in system directories it then refuses), never the default
    directories (dl-load.c _dl_map_object); the search order says the default step was
    skipped, and why."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    (tmp_path / "link").mkdir()
    (tmp_path / "g.c").write_text("int g(void){return 1;}\n")
    (tmp_path / "n.c").write_text("int g(void); int n(void){return g();}\n")
    (tmp_path / "m.c").write_text("int n(void); int main(void){return n()-1;}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", tmp_path / "link" / "libgone.so", tmp_path / "g.c",
                    "-Wl,-soname,libgone.so"], check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", tmp_path / "libn.so", tmp_path / "n.c",
                    tmp_path / "link" / "libgone.so", "-Wl,-soname,libn.so", "-Wl,-z,nodefaultlib",
                    f"-Wl,-rpath,{tmp_path / 'r'}"], check=True)
    subprocess.run(["gcc", "-o", tmp_path / "app", tmp_path / "m.c", tmp_path / "libn.so",
                    f"-Wl,-rpath,{tmp_path}", f"-Wl,-rpath-link,{tmp_path / 'link'}"], check=True)
    (tmp_path / "link" / "libgone.so").unlink()
    expected = ld_so_search(tmp_path / "app", "libgone.so")
    assert expected and all(source != "default" for source, _ in expected)
    res = next(r for r in Resolver(env={}).closure(str(tmp_path / "app")).resolutions if r.name == "libgone.so")
    assert res.source == "not-found"
    assert res.search_order[-1] == ("default", "skipped: DF_1_NODEFLIB")
    assert [(source, d.rstrip("/")) for source, d in res.search_order[:-1]] == expected


def test_the_interpreter_is_the_one_ldd_names(tmp_path):
    if shutil.which("gcc") is None or shutil.which("ldd") is None:
        pytest.skip("gcc and ldd needed")
    (tmp_path / "m.c").write_text("int main(void){return 0;}\n")
    subprocess.run(["gcc", "-o", tmp_path / "app", tmp_path / "m.c"], check=True)
    out = subprocess.run(["ldd", str(tmp_path / "app")], capture_output=True, text=True, errors="replace",
                         env=CLEAN).stdout
    # ldd lists the interpreter as a bare path with its load address, no "=>"
    interp = [line.split()[0] for line in out.splitlines() if line.strip().startswith("/") and "=>" not in line]
    assert len(interp) == 1, out
    assert Resolver(env={}).closure(str(tmp_path / "app")).interpreter == interp[0]


def test_more_roots_than_the_closure_cache_holds(tmp_path):
    """The resolver keeps a bounded number of recent closures (a scan of thousands of roots
    must not hold them all); going past the bound drops the oldest and goes on.  Each
    copy's closure is what ldd says for the first."""
    if shutil.which("gcc") is None or shutil.which("ldd") is None:
        pytest.skip("gcc and ldd needed")
    (tmp_path / "c.c").write_text("#include <stdio.h>\nint c(void){return puts(\"c\");}\n")
    first = tmp_path / "lib0.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", first, tmp_path / "c.c"], check=True)
    out = subprocess.run(["ldd", str(first)], capture_output=True, text=True, errors="replace", env=CLEAN).stdout
    libc = next(line.split("=>")[1].split("(")[0].strip() for line in out.splitlines() if "libc.so.6 =>" in line)
    resolver = Resolver(env={})
    for index in range(80):
        copy = tmp_path / f"lib{index}.so"
        if index:
            shutil.copy2(first, copy)
        closure = resolver.closure(str(copy))
        got = next(r.path for r in closure.resolutions if r.name == "libc.so.6")
        assert os.path.realpath(got) == os.path.realpath(libc)


def test_a_needed_path_that_is_a_pie_is_refused_with_ld_sos_reason(tmp_path):
    """A NEEDED entry with a slash (a library linked by path, without a SONAME) is opened
    as it is, with no search; when that file is a PIE executable, ld.so stops with its own
    reason, which the resolver's tried list must give for that path."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    (tmp_path / "lib").mkdir()
    (tmp_path / "d.c").write_text("int df(void){return 1;}\n")
    (tmp_path / "e.c").write_text("int df(void){return 1;} int main(void){return 0;}\n")
    (tmp_path / "m.c").write_text("int df(void); int main(void){return df()-1;}\n")
    lib = tmp_path / "lib" / "libd.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", lib, tmp_path / "d.c"], check=True)  # no SONAME
    subprocess.run(["gcc", "-o", tmp_path / "app", tmp_path / "m.c", str(lib)], check=True)
    subprocess.run(["gcc", "-fPIE", "-pie", "-o", lib, tmp_path / "e.c"], check=True)
    proc = subprocess.run([str(tmp_path / "app")], capture_output=True, text=True, errors="replace", env=CLEAN,
                          timeout=60)
    assert proc.returncode == 127, proc.stderr
    ld_so_says = proc.stderr.strip().rsplit(f"{lib}: ", 1)[1]
    res = next(r for r in Resolver(env={}).closure(str(tmp_path / "app")).resolutions if r.name == str(lib))
    assert (res.source, res.tried) == ("not-found", ((str(lib), ld_so_says),))


def test_undefined_symbols_with_the_host_program_in_scope(tmp_path):
    """A plugin calls a function its host program exports (-rdynamic), as Python extension
    modules call the interpreter.  Oracle: the host dlopens it RTLD_NOW and it loads; loaded
    alone (python's ctypes, RTLD_NOW) it fails with "undefined symbol".  The resolver, given
    the host as scope (read without symbols, as a closure reads it), must agree both ways."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    import sys

    from seedance.elf import read_elf

    (tmp_path / "p.c").write_text("int seedance_host_fn(void); int plug(void){return seedance_host_fn();}\n")
    (tmp_path / "h.c").write_text("#include <dlfcn.h>\n#include <stdio.h>\n"
                                  "int seedance_host_fn(void){return 7;}\n"
                                  "int main(int c, char **v){void *h = dlopen(v[1], RTLD_NOW);"
                                  " if (!h) {puts(dlerror()); return 1;} return 0;}\n")
    plugin = tmp_path / "libplug.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", plugin, tmp_path / "p.c"], check=True)
    subprocess.run(["gcc", "-rdynamic", "-o", tmp_path / "host", tmp_path / "h.c", "-ldl"], check=True)
    hosted = subprocess.run([str(tmp_path / "host"), str(plugin)], capture_output=True, text=True,
                            errors="replace", env=CLEAN, timeout=60)
    assert hosted.returncode == 0, hosted.stdout
    alone = subprocess.run([sys.executable, "-c", "import ctypes, os, sys; ctypes.CDLL(sys.argv[1], os.RTLD_NOW)",
                            str(plugin)], capture_output=True, text=True, errors="replace", timeout=60)
    assert "undefined symbol: seedance_host_fn" in alone.stderr, alone.stderr
    resolver = Resolver(env={})
    closure = resolver.closure(str(plugin))
    host = str(tmp_path / "host")
    assert "seedance_host_fn" in str(resolver.undefined(closure))
    assert "seedance_host_fn" not in str(resolver.undefined(closure, scope={host: read_elf(host)}))


def test_an_intel_cpu_with_the_haswell_features_gets_the_haswell_platform(tmp_path):
    """sysdeps/x86/cpu-features.c (glibc 2.26-2.36): an Intel CPU with AVX2, FMA, BMI1,
    BMI2, LZCNT ("abm" in cpuinfo), MOVBE and POPCNT usable gets the "haswell" platform
    (a legacy search subdirectory); another vendor keeps the kernel's AT_PLATFORM."""
    from seedance.resolve import hwcaps

    flags = "avx avx2 fma bmi1 bmi2 abm movbe popcnt f16c xsave cx16 lahf_lm sse4_1 sse4_2 ssse3"
    for vendor, platform in (("GenuineIntel", "haswell"), ("AuthenticAMD", os.uname().machine)):
        info = tmp_path / "cpuinfo"
        info.write_text(f"vendor_id\t: {vendor}\nflags\t\t: {flags}\n")
        caps = hwcaps.detect(str(info), libc=(2, 36))
        assert caps.platform == platform
        assert platform in caps.legacy_subdirs


def _process_fixtures():
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
    import process_fixtures

    return process_fixtures


def test_dlopen_of_a_name_nothing_provides_fails_as_dlopen_does(tmp_path):
    """A bare name no search finds: dlopen fails with dlerror's text (the real dlopen in a
    child is the oracle) and nothing joins the process, so nothing is shadowed or unbound."""
    import sys

    from seedance.resolve.process import RTLD_NOW, Load, Simulator

    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    F = _process_fixtures()
    host = F.host_program(str(tmp_path / "host"))
    for target in ("libseedance_nothing_here.so", str(tmp_path / "nowhere" / "libgone.so")):
        real = subprocess.run([sys.executable, "-c", "import ctypes, sys\ntry:\n ctypes.CDLL(sys.argv[1])\n"
                               "except OSError as exc:\n print(exc)", target], capture_output=True, text=True,
                              errors="replace", timeout=60)
        sim = Simulator(Resolver(env={}), host)
        sim.start()
        before = list(sim.model.link_map)
        step = sim.dlopen(Load(target, "dlopen", RTLD_NOW))
        assert (step.ok, step.error) == (False, real.stdout.strip())
        assert (step.new_objects, step.shadowed, step.unbound) == ((), (), ())
        assert sim.model.link_map == before


def test_a_shadowing_copy_names_the_symbols_both_copies_define(tmp_path):
    """libver.so.1 v1 (ver@VER_1) loaded first; then a library whose own RUNPATH copy, v2,
    defines ver@VER_1 and ver2@VER_2 and which calls both.  ld.so refuses it (VER_2 not
    found: the real dlopen sequence is the oracle), and the shadowing names ver@VER_1 as
    the symbol bound to the loaded copy that its own copy defines too (nm -D says both
    define it)."""
    from seedance.resolve.process import RTLD_NOW, Load, Simulator

    if shutil.which("gcc") is None or shutil.which("nm") is None:
        pytest.skip("gcc and nm needed")
    F = _process_fixtures()
    root = str(tmp_path)
    host = F.host_program(os.path.join(root, "host"))
    v1 = F.shared_lib(os.path.join(root, "v1", "libver.so.1"), "int ver(void){return 1;}\n", soname="libver.so.1",
                      version_script="VER_1 { global: ver; local: *; };\n")
    v2 = F.shared_lib(os.path.join(root, "v2", "libver.so.1"),
                      "int ver(void){return 1;}\nint ver2(void){return 2;}\n", soname="libver.so.1",
                      version_script="VER_1 { global: ver; local: *; };\nVER_2 { global: ver2; } VER_1;\n")
    both = F.shared_lib(os.path.join(root, "v2", "libboth.so"),
                        "extern int ver(void), ver2(void);\nint b(void){return ver() + ver2();}\n",
                        soname="libboth.so", links=(f"-L{root}/v2", "-l:libver.so.1"), rpath="$ORIGIN")
    real = subprocess.run([host, v1, both], capture_output=True, timeout=60, env={"PATH": os.environ["PATH"]})
    assert real.returncode != 0 and b"VER_2" in real.stdout, real.stdout
    for lib in (v1, v2):
        nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True).stdout
        assert "ver@@VER_1" in nm
    sim = Simulator(Resolver(env={}), host)
    sim.start()
    assert sim.dlopen(Load(v1, "dlopen", RTLD_NOW)).ok
    step = sim.dlopen(Load(both, "dlopen", RTLD_NOW))
    assert not step.ok
    shadow = [s for s in step.shadowed if s.name == "libver.so.1"]
    assert [(s.used, s.alone) for s in shadow] == [(v1, v2)]
    assert [(name, version) for name, version, _provider in shadow[0].other_copy] == [("ver", "VER_1")]
    # the same copy already in the process at start (adopted, as an interpreter's start-up
    # modules are): the shadowing names that start-up, given by the caller, as the load
    # that brought it in and the one it was loaded for
    sim = Simulator(Resolver(env={}), host)
    sim.start()
    sim.adopt([v1], "interpreter start-up")
    step = sim.dlopen(Load(both, "dlopen", RTLD_NOW))
    assert not step.ok
    shadow = [s for s in step.shadowed if s.name == "libver.so.1"]
    assert [(s.used, s.loaded_by, s.loaded_for) for s in shadow] == [(v1, "interpreter start-up",
                                                                       "interpreter start-up")]


def test_the_interpreter_goes_before_a_missing_library_in_ldds_order(tmp_path):
    """NEEDED [libc.so.6, libgone.so] with libgone.so missing: rtld.c puts ld.so back into
    the chain after the object before it, leaving out not-found placeholders; ldd lists
    libc, ld.so, then "libgone.so => not found".  The load order must be ldd's."""
    if shutil.which("gcc") is None or shutil.which("ldd") is None:
        pytest.skip("gcc and ldd needed")
    (tmp_path / "lib").mkdir()
    (tmp_path / "g.c").write_text("int g(void){return 1;}\n")
    (tmp_path / "m.c").write_text("int g(void); int main(void){return g();}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", tmp_path / "lib" / "libgone.so", tmp_path / "g.c",
                    "-Wl,-soname,libgone.so"], check=True)
    subprocess.run(["gcc", "-o", tmp_path / "app", tmp_path / "m.c", "-Wl,--no-as-needed", "-lc",
                    tmp_path / "lib" / "libgone.so"], check=True)
    (tmp_path / "lib" / "libgone.so").unlink()
    out = subprocess.run(["ldd", str(tmp_path / "app")], capture_output=True, text=True, errors="replace",
                         env=CLEAN).stdout
    listed = [line.split()[0] for line in out.splitlines() if line.strip() and "linux-vdso" not in line]
    assert listed[-1] == "libgone.so"
    closure = Resolver(env={}).closure(str(tmp_path / "app"))
    assert [name for name, _path, _first in closure.load_order] == listed


def test_a_second_name_for_a_loaded_file_is_remembered(tmp_path):
    """libbb needs "libalias.so", a symlink to the liba.so the program already loaded (libcc
    needs "liba.so" itself): ld.so finds the same file (same inode) and adds the name to the
    loaded object, which then provides libbb's version need ALIAS_1 of "libalias.so"
    (dl-version.c finds the provider by that name).  LD_DEBUG=libs counts the searches; the
    program bound at start-up is the oracle for the version need."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    (tmp_path / "a.c").write_text("int a(void){return 1;}\n")
    (tmp_path / "b.c").write_text("int a(void); int b(void){return a();}\n")
    (tmp_path / "c.c").write_text("int a(void); int c(void){return a();}\n")
    (tmp_path / "m.c").write_text("int a(void), b(void), c(void); int main(void){return a()+b()+c()-3;}\n")
    (tmp_path / "a.map").write_text("ALIAS_1 { global: a; local: *; };\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", tmp_path / "liba.so", tmp_path / "a.c",
                    f"-Wl,--version-script,{tmp_path / 'a.map'}"], check=True)
    os.symlink("liba.so", tmp_path / "libalias.so")
    for name, link in (("b", "-lalias"), ("c", "-la")):  # liba.so has no SONAME: NEEDED is the name linked
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", tmp_path / f"lib{name}{name}.so", tmp_path / f"{name}.c",
                        f"-L{tmp_path}", link, f"-Wl,-soname,lib{name}{name}.so", f"-Wl,-rpath,{tmp_path}"],
                       check=True)
    subprocess.run(["gcc", "-o", tmp_path / "app", tmp_path / "m.c", f"-L{tmp_path}", "-la", "-lbb", "-lcc",
                    f"-Wl,-rpath,{tmp_path}"], check=True)
    searches: dict = {}
    for line in _ld_debug_lines(tmp_path / "app"):
        if line.startswith("find library="):
            name = line[len("find library="):].split(" ", 1)[0]
            searches[name] = searches.get(name, 0) + 1
    assert searches.get("libalias.so") == 1
    # every version need (ALIAS_1 of "libalias.so") is met: the program runs, bound at start
    ran = subprocess.run([str(tmp_path / "app")], env={**CLEAN, "LD_BIND_NOW": "1"}, timeout=60)
    assert ran.returncode == 0
    closure = Resolver(env={}).closure(str(tmp_path / "app"))
    ours: dict = {}
    for res in closure.resolutions:
        if res.source != "loaded":
            ours[res.name] = ours.get(res.name, 0) + 1
    assert ours == searches
    alias = [c for c in closure.version_checks if c.file == "libalias.so"]
    assert alias and all(c.defined and c.provider == str(tmp_path / "liba.so") for c in alias), alias


def test_a_version_need_on_a_missing_library_does_not_stop_the_closure(tmp_path):
    """The program needs GONE_1 of libgone.so, which is not there: ld.so stops at the
    missing library ("cannot open shared object file"); the closure says not-found and
    its version checks still complete."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    (tmp_path / "lib").mkdir()
    (tmp_path / "g.c").write_text("int g(void){return 1;}\n")
    (tmp_path / "v.map").write_text("GONE_1 { global: g; local: *; };\n")
    (tmp_path / "m.c").write_text("int g(void); int main(void){return g()-1;}\n")
    lib = tmp_path / "lib" / "libgone.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", lib, tmp_path / "g.c", "-Wl,-soname,libgone.so",
                    f"-Wl,--version-script,{tmp_path / 'v.map'}"], check=True)
    subprocess.run(["gcc", "-o", tmp_path / "app", tmp_path / "m.c", str(lib)], check=True)
    lib.unlink()
    proc = subprocess.run([str(tmp_path / "app")], capture_output=True, text=True, errors="replace", env=CLEAN,
                          timeout=60)
    assert "libgone.so: cannot open shared object file" in proc.stderr
    closure = Resolver(env={}).closure(str(tmp_path / "app"))
    assert [r.source for r in closure.resolutions if r.name == "libgone.so"] == ["not-found"]
    assert any(c.requester == str(tmp_path / "app") for c in closure.version_checks)


def test_origin_of_a_program_named_by_a_relative_path(tmp_path, monkeypatch):
    """$ORIGIN of a program run as "sub/app" is its directory (ld.so takes it from the
    kernel's absolute path): LD_DEBUG=libs shows the file it tried."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    (tmp_path / "sub" / "lib").mkdir(parents=True)
    (tmp_path / "o.c").write_text("int o(void){return 1;}\n")
    (tmp_path / "m.c").write_text("int o(void); int main(void){return o()-1;}\n")
    lib = tmp_path / "sub" / "lib" / "libo.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", lib, tmp_path / "o.c", "-Wl,-soname,libo.so"], check=True)
    subprocess.run(["gcc", "-o", tmp_path / "sub" / "app", tmp_path / "m.c", str(lib), "-Wl,-rpath,$ORIGIN/lib"],
                   check=True)
    monkeypatch.chdir(tmp_path)
    proc = subprocess.run(["sub/app"], capture_output=True, text=True, errors="replace", timeout=60,
                          env={**CLEAN, "LD_DEBUG": "libs"})
    assert proc.returncode == 0, proc.stderr
    tried = [line.split("trying file=", 1)[1].strip() for line in proc.stderr.splitlines() if "trying file=" in line
             and "libo.so" in line]
    res = next(r for r in Resolver(env={}).closure("sub/app").resolutions if r.name == "libo.so")
    assert os.path.realpath(res.path) == os.path.realpath(tried[-1])
    assert os.path.dirname(res.path).endswith("sub/lib")


def test_a_cache_entry_for_an_unsupported_hwcaps_level_is_passed_over(tmp_path):
    """libhw.so.1 in a directory and in its glibc-hwcaps/x86-64-v2, x86-64-v4 and aaa-other
    (a name no ld.so knows, which ldconfig records all the same and sorts first), cached by
    ldconfig with the hwcaps extension.  ld.so passes over the subdirectories this CPU does
    not support and takes the best one it does (dl-cache.c search_cache).  Oracle: the
    program in a private mount namespace with that cache bound over /etc/ld.so.cache,
    LD_DEBUG=libs naming the file it tried."""
    if os.uname().machine != "x86_64" or shutil.which("gcc") is None or shutil.which("unshare") is None \
            or not os.path.exists(LDCONFIG):
        pytest.skip("x86-64 with gcc, ldconfig and unshare needed")
    top = tmp_path / "lib"
    (tmp_path / "h.c").write_text("int hw(void){return 0;}\n")
    (tmp_path / "m.c").write_text("int hw(void); int main(void){return hw();}\n")
    for sub in ("", "glibc-hwcaps/x86-64-v2/", "glibc-hwcaps/x86-64-v4/", "glibc-hwcaps/aaa-other/"):
        (top / sub).mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", top / sub / "libhw.so.1", tmp_path / "h.c",
                        "-Wl,-soname,libhw.so.1"], check=True)
    subprocess.run(["gcc", "-o", tmp_path / "app", tmp_path / "m.c", top / "libhw.so.1"], check=True)
    (tmp_path / "ld.so.conf").write_text(f"{top}\n")
    cache_file = tmp_path / "ld.so.cache"
    write_ld_so_cache(cache_file, tmp_path / "ld.so.conf", "-i")
    proc = run_with_ld_so_cache(cache_file, tmp_path / "app", env={**CLEAN, "LD_DEBUG": "libs"}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    chosen = ld_so_cache_try(proc.stderr, "libhw.so.1")
    assert "aaa-other" not in chosen
    res = next(r for r in Resolver(env={}, cache_path=str(cache_file)).closure(str(tmp_path / "app")).resolutions
               if r.name == "libhw.so.1")
    assert (res.source, res.path) == ("ld.so.cache", chosen)


def test_a_missing_preload_is_ignored_as_ld_so_ignores_it(tmp_path):
    """rtld.c do_preload: a preload that cannot be opened is reported ("cannot be preloaded
    ... ignored") and the program runs; ldd lists no "not found" line for it.  The load order
    must be ldd's, without a placeholder for the preload."""
    if shutil.which("gcc") is None or shutil.which("ldd") is None:
        pytest.skip("gcc and ldd needed")
    (tmp_path / "m.c").write_text("int main(void){return 0;}\n")
    subprocess.run(["gcc", "-o", tmp_path / "app", tmp_path / "m.c"], check=True)
    env = {"LD_PRELOAD": "libseedance_nothere.so"}
    proc = subprocess.run(["ldd", str(tmp_path / "app")], capture_output=True, text=True, errors="replace",
                          env={**CLEAN, **env})
    said = proc.stdout + proc.stderr  # ld.so's message goes to ldd's stdout
    assert "libseedance_nothere.so' from LD_PRELOAD cannot be preloaded" in said and "ignored" in said, said
    listed = [line.split()[0] for line in proc.stdout.splitlines()
              if line.strip() and "linux-vdso" not in line and "cannot be preloaded" not in line]
    closure = Resolver(env=env).closure(str(tmp_path / "app"))
    assert [name for name, _path, _first in closure.load_order] == listed
    assert [r.source for r in closure.resolutions if r.name == "libseedance_nothere.so"] == ["not-found"]


def test_a_version_need_naming_a_file_nothing_needs(tmp_path):
    """The program's Verneed for libgone.so rewritten to name "gone.so" (a suffix of the same
    .dynstr string), which no DT_NEEDED names: dl-version.c finds no provider for it and ld.so
    refuses to start the program; the resolver reports the need as not met, with no provider,
    instead of failing itself (bench/mutation-survivors.md: `_version_checks` 13)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    from elftools.elf.elffile import ELFFile
    (tmp_path / "g.c").write_text("int g(void){return 1;}\n")
    (tmp_path / "v.map").write_text("GONE_1 { global: g; local: *; };\n")
    (tmp_path / "m.c").write_text("int g(void); int main(void){return g()-1;}\n")
    lib = tmp_path / "libgone.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", lib, tmp_path / "g.c", "-Wl,-soname,libgone.so",
                    f"-Wl,--version-script,{tmp_path / 'v.map'}"], check=True)
    app = tmp_path / "app"
    subprocess.run(["gcc", "-o", app, tmp_path / "m.c", str(lib), f"-Wl,-rpath,{tmp_path}"], check=True)
    assert subprocess.run([str(app)], env=CLEAN, timeout=60).returncode == 0
    data = bytearray(app.read_bytes())
    with open(app, "rb") as handle:
        elf = ELFFile(handle)
        dynstr = elf.get_section_by_name(".dynstr")
        at = elf.get_section_by_name(".gnu.version_r")["sh_offset"]
        while True:
            _version, _count, vn_file, _aux, vn_next = struct.unpack_from("<HHIII", data, at)
            if dynstr.get_string(vn_file) == "libgone.so":
                struct.pack_into("<I", data, at + 4, vn_file + 3)  # "gone.so"
                break
            assert vn_next, "no Verneed for libgone.so"
            at += vn_next
    app.write_bytes(bytes(data))
    proc = subprocess.run([str(app)], capture_output=True, text=True, errors="replace", env=CLEAN, timeout=60)
    assert proc.returncode != 0, "ld.so ran a program whose version need names no loaded file"
    closure = Resolver(env={}).closure(str(app))
    [check] = [c for c in closure.version_checks if c.file == "gone.so"]
    assert (check.requester, check.version, check.provider, check.defined) == (str(app), "GONE_1", None, False)
    assert [r.path for r in closure.resolutions if r.name == "libgone.so"] == [str(lib)]
