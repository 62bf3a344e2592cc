"""Symbol binding against the real ld.so: versioned references, providers without version
definitions, and a version node that exists but lacks the symbol (issue 11 item 5, issue 17).

Every verdict is checked by loading the object for real with RTLD_NOW in a subprocess."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from seedance.resolve import Resolver

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
CLEAN = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}


def gcc(*args):
    proc = subprocess.run(["gcc", *map(str, args)], capture_output=True, text=True, env=CLEAN)
    assert proc.returncode == 0, proc.stderr


def load_now(path: Path) -> subprocess.CompletedProcess:
    """The oracle: ld.so itself loads the object with every symbol bound (RTLD_NOW)."""
    code = "import ctypes, os, sys; ctypes.CDLL(sys.argv[1], os.RTLD_NOW)"
    return subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                          errors="replace", env=CLEAN)


def provider(work: Path, body: str, script: str | None) -> Path:
    src = work / "libv.c"
    src.write_text(body)
    extra = []
    if script is not None:
        (work / "v.map").write_text(script)
        extra = [f"-Wl,--version-script,{work / 'v.map'}"]
    gcc("-shared", "-fPIC", src, "-o", work / "libv.so", "-Wl,-soname,libv.so", *extra)
    return work / "libv.so"


def consumer(work: Path, call: str = "f2") -> Path:
    src = work / "user.c"
    src.write_text(f"int {call}(void);\nint use(void) {{ return {call}(); }}\n")
    out = work / "libuser.so"
    gcc("-shared", "-fPIC", src, "-o", out, f"-L{work}", "-Wl,--no-as-needed", "-lv", "-Wl,-rpath,$ORIGIN")
    return out


# f1 calls into libc, so the provider has DT_VERSYM (for its GLIBC_2.2.5 need) even without
# a version script of its own.  A provider with no DT_VERSYM at all trips an assertion in
# check_match (dl-lookup.c: "version->filename == NULL || ! _dl_name_match_p") on Debian's
# glibc, which is built with assertions, and the load aborts.
BODY = "#include <unistd.h>\nint f1(void){return getpid() > 0;}\nint f2(void){return 2;}\n"


def test_provider_rebuilt_without_a_version_script_satisfies_versioned_references(tmp_path):
    """dl-version.c only warns when the provider has no version definitions, and
    dl-lookup.c check_match accepts its unversioned definitions: the load succeeds."""
    provider(tmp_path, BODY, "V1 { global: f1; f2; local: *; };\n")
    user = consumer(tmp_path)
    provider(tmp_path, BODY, None)  # rebuilt without the script: no verdef at all
    assert load_now(user).returncode == 0
    resolver = Resolver()
    closure = resolver.closure(str(user), symbols=True)
    needs = [c for c in closure.version_checks if c.file == "libv.so"]
    assert [(c.version, c.defined) for c in needs] == [("V1", True)]
    assert resolver.version_gaps(closure) == []
    assert [u for u in closure.undefined if u[1] == "f2"] == []


def test_node_that_exists_but_lacks_the_symbol_fails_to_load(tmp_path):
    provider(tmp_path, BODY, "V1 { global: f1; f2; local: *; };\n")
    user = consumer(tmp_path)
    assert load_now(user).returncode == 0
    provider(tmp_path, BODY, "V1 { global: f1; local: *; };\n")  # node V1 kept, f2 gone from it
    real = load_now(user)
    assert real.returncode != 0 and "undefined symbol: f2, version V1" in real.stderr
    resolver = Resolver()
    closure = resolver.closure(str(user))
    assert all(c.defined for c in closure.version_checks)  # the node check passes, as in ld.so
    gaps = resolver.version_gaps(closure)
    assert [(g.requester, g.symbol, g.version, g.provider) for g in gaps] == [
        (str(user), "f2", "V1", f"{tmp_path}/libv.so")]


def test_another_object_defining_the_symbol_at_that_node_fills_the_gap(tmp_path):
    """ld.so looks X@V up in the whole global scope, not only in the verneed's file."""
    provider(tmp_path, BODY, "V1 { global: f1; local: *; };\n")
    (tmp_path / "other.map").write_text("V1 { global: f2; local: *; };\n")
    (tmp_path / "other.c").write_text("int f2(void){return 2;}\n")
    gcc("-shared", "-fPIC", tmp_path / "other.c", "-o", tmp_path / "libother.so", "-Wl,-soname,libother.so",
        f"-Wl,--version-script,{tmp_path / 'other.map'}")
    # link against a provider that has f2@V1, then swap it for the one that lacks it
    provider(tmp_path, BODY, "V1 { global: f1; f2; local: *; };\n")
    src = tmp_path / "user.c"
    src.write_text("int f2(void);\nint use(void) { return f2(); }\n")
    user = tmp_path / "libuser.so"
    gcc("-shared", "-fPIC", src, "-o", user, f"-L{tmp_path}", "-Wl,--no-as-needed", "-lv", "-lother",
        "-Wl,-rpath,$ORIGIN")
    provider(tmp_path, BODY, "V1 { global: f1; local: *; };\n")
    assert load_now(user).returncode == 0
    resolver = Resolver()
    closure = resolver.closure(str(user))
    assert str(tmp_path / "libother.so") in closure.objects
    assert resolver.version_gaps(closure) == []


def test_weak_reference_to_a_missing_symbol_is_no_gap(tmp_path):
    provider(tmp_path, BODY, "V1 { global: f1; f2; local: *; };\n")
    src = tmp_path / "user.c"
    src.write_text("int f2(void) __attribute__((weak));\nint use(void) { return f2 ? f2() : 0; }\n")
    user = tmp_path / "libuser.so"
    gcc("-shared", "-fPIC", src, "-o", user, f"-L{tmp_path}", "-Wl,--no-as-needed", "-lv", "-Wl,-rpath,$ORIGIN")
    provider(tmp_path, BODY, "V1 { global: f1; local: *; };\n")
    assert load_now(user).returncode == 0
    resolver = Resolver()
    assert resolver.version_gaps(resolver.closure(str(user))) == []


def test_one_resolver_over_many_closures_answers_each_as_a_fresh_one(tmp_path):
    """Resolver._undefined remembers which table bound a name and which objects had every
    reference bound, across the closures of one scan.  An object bound in one closure by a
    provider that another closure lacks is missing there; a second provider defining the
    name binds it too.  Each verdict against a fresh Resolver and against ld.so itself."""
    for letter in "ab":
        src = tmp_path / f"prov_{letter}.c"
        src.write_text("#include <unistd.h>\nint shared_fn(void){return getpid() > 0;}\n")
        gcc("-shared", "-fPIC", src, "-o", tmp_path / f"libprov_{letter}.so", f"-Wl,-soname,libprov_{letter}.so")
    user = tmp_path / "user.c"
    user.write_text("int shared_fn(void);\nint use(void) { return shared_fn(); }\n")
    # no NEEDED for the provider: a plugin-style library whose loader brings shared_fn
    gcc("-shared", "-fPIC", user, "-o", tmp_path / "libuser.so", "-Wl,-soname,libuser.so")
    roots = {}
    for name, links in (("with_a", ["-lprov_a", "-luser"]), ("alone", ["-luser"]),
                        ("with_b", ["-lprov_b", "-luser"])):
        src = tmp_path / f"{name}.c"
        src.write_text(f"int use(void);\nint {name}(void) {{ return use(); }}\n")
        roots[name] = tmp_path / f"lib{name}.so"
        gcc("-shared", "-fPIC", src, "-o", roots[name], f"-L{tmp_path}", "-Wl,--no-as-needed", *links,
            "-Wl,-rpath,$ORIGIN")
    shared = Resolver()
    order = ["with_a", "alone", "with_b", "alone", "with_a"]
    for name in order:
        path = str(roots[name])
        got = sorted(shared.closure(path, symbols=True).undefined)
        fresh = sorted(Resolver().closure(path, symbols=True).undefined)
        assert got == fresh, name
        assert shared.undefined(shared.closure(path)) == shared.closure(path, symbols=True).undefined, name
        loaded = load_now(roots[name])
        if name == "alone":
            assert got == [(str(tmp_path / "libuser.so"), "shared_fn", None)]
            assert loaded.returncode != 0 and "undefined symbol: shared_fn" in loaded.stderr
        else:
            assert got == [], name
            assert loaded.returncode == 0, loaded.stderr
