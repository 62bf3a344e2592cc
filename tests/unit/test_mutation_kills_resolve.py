"""Tests written for the mutants of agent/resolve/ that the suite let through
(bench/run_mutation.py, bench/mutation-survivors.md).

The search order is judged against ld.so itself: LD_DEBUG=libs prints, for each library it
looks for, every directory list it searched and where the list came from.  The secure-mode
$ORIGIN check follows glibc's is_trusted_path_normalize (elf/dl-load.c)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from seedance.resolve import Resolver
from seedance.resolve.tokens import is_trusted

CLEAN = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
# the directory variants ld.so prints in a search path before each directory it was given
VARIANT = re.compile(r"/(glibc-hwcaps/[^/:]+|tls(/x86_64){0,2}|x86_64(/x86_64)?)$")
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
