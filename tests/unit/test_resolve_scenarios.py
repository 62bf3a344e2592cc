"""The resolver against the real ld.so, on small objects built with gcc in tmp dirs.

Every scenario asserts what the resolver decides against what glibc decides on this host:
`ldd` (ld.so in trace mode) or the built program run for real.  No expected path is written
down by hand.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from seedance.resolve import Resolver

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("ldd") is None,
                                reason="needs gcc and ldd")

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_ldd_parity.py"
_spec = importlib.util.spec_from_file_location("bench_ldd_parity", _BENCH)
parity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(parity)

CLEAN = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}


def sh(*cmd, cwd=None, env=None):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd,
                          env=env or CLEAN, timeout=120)
    assert proc.returncode == 0, f"{cmd}: {proc.stderr}"
    return proc


def lib(directory: Path, name: str, body: str, needs=(), rpath=None, runpath=None, soname=None,
        extra=()):
    directory.mkdir(parents=True, exist_ok=True)
    src = directory / (name + ".c")
    src.write_text(body + "\n")
    cmd = ["gcc", "-shared", "-fPIC", "-o", directory / name, src]
    cmd += [f"-Wl,-soname,{soname or name}"]
    for dep in needs:
        cmd += [dep]
    if rpath:
        cmd += ["-Wl,--disable-new-dtags", f"-Wl,-rpath,{rpath}"]
    if runpath:
        cmd += ["-Wl,--enable-new-dtags", f"-Wl,-rpath,{runpath}"]
    cmd += list(extra)
    sh(*cmd)
    return directory / name


def prog(path: Path, body: str, needs=(), rpath=None, runpath=None, extra=()):
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.with_suffix(".c")
    src.write_text(body + "\n")
    cmd = ["gcc", "-o", path, src, "-Wl,--no-as-needed", *needs, "-Wl,--allow-shlib-undefined"]
    if rpath:
        cmd += ["-Wl,--disable-new-dtags", f"-Wl,-rpath,{rpath}"]
    if runpath:
        cmd += ["-Wl,--enable-new-dtags", f"-Wl,-rpath,{runpath}"]
    cmd += list(extra)
    sh(*cmd)
    return path


def real_ldd(path: Path, env=None):
    return parity.run_ldd(str(path), env=env)


def ours(path: Path, env=None, **kwargs):
    resolver = Resolver(env=env, **kwargs)
    return parity.ours(resolver, str(path)), resolver.closure(str(path))


def source_of(closure, name):
    return [r for r in closure.resolutions if r.name == name][0]


def test_rpath_is_inherited_down_the_loader_chain(tmp_path):
    d1, d2, d3 = tmp_path / "d1", tmp_path / "d2", tmp_path / "d3"
    deep = lib(d3, "libdeep.so", "int deep(void){return 3;}")
    leaf = lib(d2, "libleaf.so", "int deep(void); int leaf(void){return deep();}", needs=[deep])
    mid = lib(d1, "libmid.so", "int leaf(void); int mid(void){return leaf();}", needs=[leaf],
              rpath=f"{d2}:{d3}")
    exe = prog(tmp_path / "app", "int mid(void); int main(void){return mid()==3?0:1;}",
               needs=[mid], rpath=str(d1))
    expected = real_ldd(exe)
    got, closure = ours(exe)
    assert parity.compare(expected, got) is None
    assert str(d3 / "libdeep.so") in {os.path.realpath(p) for p in closure.objects}
    res = source_of(closure, "libdeep.so")
    assert res.source == "rpath" and res.path.startswith(str(d3))
    assert subprocess.run([exe], env=CLEAN).returncode == 0  # and ld.so really runs it


def test_runpath_is_not_inherited(tmp_path):
    d1, d2, d3 = tmp_path / "d1", tmp_path / "d2", tmp_path / "d3"
    deep = lib(d3, "libdeep.so", "int deep(void){return 3;}")
    leaf = lib(d2, "libleaf.so", "int deep(void); int leaf(void){return deep();}", needs=[deep])
    mid = lib(d1, "libmid.so", "int leaf(void); int mid(void){return leaf();}", needs=[leaf],
              runpath=f"{d2}:{d3}")
    exe = prog(tmp_path / "app", "int mid(void); int main(void){return mid();}",
               needs=[mid], rpath=str(d1))
    expected = real_ldd(exe)
    got, closure = ours(exe)
    assert parity.compare(expected, got) is None
    assert "libdeep.so" in expected[2]  # ld.so itself does not find it
    assert source_of(closure, "libdeep.so").source == "not-found"
    assert source_of(closure, "libleaf.so").source == "runpath"


def test_origin_lib_and_platform_tokens(tmp_path):
    resolver = Resolver()
    base = tmp_path / "pkg"
    lib(base / "lib" / "x86_64-linux-gnu", "liblibtok.so", "int a(void){return 1;}")
    lib(base / resolver.platform, "libplat.so", "int b(void){return 2;}")
    lib(base / "curly", "libcurly.so", "int c(void){return 3;}")
    needs = [base / "lib" / "x86_64-linux-gnu" / "liblibtok.so", base / resolver.platform / "libplat.so",
             base / "curly" / "libcurly.so"]
    exe = prog(base / "bin" / "app", "int a(void),b(void),c(void); int main(void){return a()+b()+c()-6;}",
               needs=needs, rpath="$ORIGIN/../$LIB:$ORIGIN/../$PLATFORM:${ORIGIN}/../curly")
    expected = real_ldd(exe)
    got, closure = ours(exe)
    assert parity.compare(expected, got) is None
    assert len(expected[1]) >= 5  # the three token-found libraries, libc and ld.so
    assert subprocess.run([exe], env=CLEAN).returncode == 0
    assert source_of(closure, "libplat.so").source == "rpath"


def test_ld_library_path_order_against_rpath_and_runpath(tmp_path):
    for kind in ("rpath", "runpath"):
        work = tmp_path / kind
        in_path = lib(work / "path", "libpick.so", "int pick(void){return 1;}")
        lib(work / "llp", "libpick.so", "int pick(void){return 2;}")
        exe = prog(work / "app", "int pick(void); int main(void){return pick();}", needs=[in_path],
                   **{kind: str(work / "path")})
        env = {"LD_LIBRARY_PATH": f"{work / 'nothing'};{work / 'llp'}"}
        expected = real_ldd(exe, env=env)
        got, closure = ours(exe, env=env)
        assert parity.compare(expected, got) is None
        # ld.so's choice is visible in the exit status: 1 from path/, 2 from llp/
        status = subprocess.run([exe], env={**CLEAN, **env}).returncode
        res = source_of(closure, "libpick.so")
        assert res.path.startswith(str(work / ("path" if status == 1 else "llp")))
        assert res.source == ("rpath" if kind == "rpath" else "ld_library_path")


def test_nodeflib_refuses_system_directories(tmp_path):
    libz = lib(tmp_path / "own", "libown.so", "int own(void){return 0;}")
    exe = prog(tmp_path / "app", "int own(void); int main(void){return own();}", needs=[libz],
               rpath=str(tmp_path / "own"), extra=["-Wl,-z,nodefaultlib"])
    expected = real_ldd(exe)
    got, closure = ours(exe)
    assert parity.compare(expected, got) is None
    libc = source_of(closure, "libc.so.6")
    assert libc.source == "not-found" and "libc.so.6" in expected[2]
    assert any("NODEFLIB" in why for _p, why in libc.tried)


def test_soname_already_loaded_is_reused(tmp_path):
    hidden = tmp_path / "hidden"
    libx = lib(hidden, "libx.so", "int x(void){return 0;}", soname="libx.so.1")
    other = lib(tmp_path / "other", "libother.so", "int x(void); int o(void){return x();}",
                needs=[libx])
    exe = prog(tmp_path / "app", "int o(void); int main(void){return o();}", needs=[other, libx],
               rpath=str(tmp_path / "other"))
    # the program names libx by its path; libother asks for the SONAME, found nowhere else
    sh("patchelf", "--replace-needed", "libx.so.1", str(libx), exe)
    expected = real_ldd(exe)
    got, closure = ours(exe)
    assert parity.compare(expected, got) is None
    assert not expected[2]
    reused = [r for r in closure.resolutions if r.name == "libx.so.1"]
    assert reused and reused[0].source == "loaded"
    assert subprocess.run([exe], env=CLEAN).returncode == 0


def test_wrong_class_and_machine_candidates_are_skipped(tmp_path):
    if subprocess.run(["gcc", "-m32", "-c", "-x", "c", "/dev/null", "-o", os.devnull]).returncode:
        pytest.skip("gcc cannot build 32-bit objects here")
    first, second, third = tmp_path / "a32", tmp_path / "barm", tmp_path / "c64"
    lib(first, "libw.so", "int w(void){return 32;}", extra=["-m32", "-nostdlib"])
    good = lib(third, "libw.so", "int w(void){return 64;}")
    arm = lib(second, "libw.so", "int w(void){return 1;}")
    data = bytearray(arm.read_bytes())
    data[18:20] = (183).to_bytes(2, "little")  # EM_AARCH64: ld.so skips other machines
    arm.write_bytes(bytes(data))
    exe = prog(tmp_path / "app", "int w(void); int main(void){return w()==64?0:1;}", needs=[good],
               rpath=f"{first}:{second}:{third}")
    expected = real_ldd(exe)
    got, closure = ours(exe)
    assert parity.compare(expected, got) is None
    res = source_of(closure, "libw.so")
    assert res.path == f"{third}/libw.so"
    whys = dict(res.tried)
    assert "wrong ELF class" in whys[f"{first}/libw.so"]
    assert "wrong machine" in whys[f"{second}/libw.so"]
    assert subprocess.run([exe], env=CLEAN).returncode == 0


def test_missing_version_node(tmp_path):
    work = tmp_path / "v"
    work.mkdir()
    (work / "v2.map").write_text("V1 { global: f1; local: *; };\nV2 { global: f2; } V1;\n")
    (work / "v1.map").write_text("V1 { global: f1; f2; local: *; };\n")
    body = "int f1(void){return 1;} int f2(void){return 2;}"
    libv = lib(work, "libv.so", body, extra=[f"-Wl,--version-script,{work / 'v2.map'}"])
    exe = prog(work / "app", "int f2(void); int main(void){return f2()==2?0:1;}", needs=[libv],
               rpath=str(work))
    before, closure = ours(exe)
    assert all(c.defined for c in closure.version_checks)
    lib(work, "libv.so", body, extra=[f"-Wl,--version-script,{work / 'v1.map'}"])  # V2 gone
    expected = real_ldd(exe)
    got, closure = ours(exe)
    assert parity.compare(expected, got) is None
    assert expected[3] == {"V2"}  # ldd: version `V2' not found
    missing = [c for c in closure.version_checks if not c.defined]
    assert [(c.file, c.version, c.provider) for c in missing] == [("libv.so", "V2", f"{work}/libv.so")]
    assert "V1" in missing[0].provider_versions
    run = subprocess.run([exe], env=CLEAN, capture_output=True, text=True)
    assert run.returncode != 0 and "V2" in run.stderr


def test_same_file_under_two_names_is_one_object(tmp_path):
    real = lib(tmp_path / "d", "libq.so.1", "int q(void){return 0;}")
    os.symlink("libq.so.1", tmp_path / "d" / "libq.so")
    other = lib(tmp_path / "d", "libr.so", "int q(void); int r(void){return q();}",
                needs=[real], soname="libr.so")
    exe = prog(tmp_path / "app", "int r(void); int main(void){return r();}", needs=[other],
               rpath=str(tmp_path / "d"))
    sh("patchelf", "--add-needed", "libq.so", exe)
    expected = real_ldd(exe)
    got, closure = ours(exe)
    assert parity.compare(expected, got) is None
    assert len([p for p in closure.objects if "libq" in p]) == 1


def test_hwcaps_subdirectory_preferred(tmp_path):
    resolver = Resolver()
    if not resolver.caps.hwcaps_subdirs:
        pytest.skip("no glibc-hwcaps level supported on this CPU")
    level = resolver.caps.hwcaps_subdirs[-1]
    plain = lib(tmp_path / "d", "libh.so", "int h(void){return 1;}")
    lib(tmp_path / "d" / "glibc-hwcaps" / level, "libh.so", "int h(void){return 0;}", soname="libh.so")
    exe = prog(tmp_path / "app", "int h(void); int main(void){return h();}", needs=[plain],
               rpath=str(tmp_path / "d"))
    expected = real_ldd(exe)
    got, closure = ours(exe)
    assert parity.compare(expected, got) is None
    assert f"glibc-hwcaps/{level}/" in source_of(closure, "libh.so").path
    assert subprocess.run([exe], env=CLEAN).returncode == 0  # the hwcaps copy returns 0


def test_legacy_platform_subdirectory(tmp_path):
    resolver = Resolver()
    if not resolver.caps.legacy_subdirs:
        pytest.skip("this glibc has no legacy hwcaps subdirectories")
    plain = lib(tmp_path / "d", "libp.so", "int p(void){return 1;}")
    lib(tmp_path / "d" / resolver.platform, "libp.so", "int p(void){return 0;}", soname="libp.so")
    exe = prog(tmp_path / "app", "int p(void); int main(void){return p();}", needs=[plain],
               rpath=str(tmp_path / "d"))
    expected = real_ldd(exe)
    got, closure = ours(exe)
    assert parity.compare(expected, got) is None
    assert subprocess.run([exe], env=CLEAN).returncode == (
        0 if f"/{resolver.platform}/" in source_of(closure, "libp.so").path else 1)


def test_ld_library_path_is_ignored_when_secure(tmp_path):
    """AT_SECURE for real: a set-user-ID program run by an unprivileged user."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run a set-user-ID program as another user")
    work = tmp_path / "s"
    dep = lib(work / "llp", "libsec.so", "int s(void){return 0;}")
    exe = prog(work / "app", "int s(void); int main(void){return s();}", needs=[dep])
    for path in [tmp_path, work, work / "llp", dep]:
        os.chmod(path, 0o755)
    parent = tmp_path.parent
    while parent != parent.parent:  # pytest's base temp is private to root
        os.chmod(parent, os.stat(parent).st_mode | 0o011)
        parent = parent.parent
    os.chmod(exe, 0o4755)
    env = {"LD_LIBRARY_PATH": str(work / "llp")}
    run = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", exe],
                         env={**CLEAN, **env}, capture_output=True, text=True)
    plain = Resolver(env=env).closure(str(exe))
    secure = Resolver(env=env, secure=True).closure(str(exe))
    assert source_of(plain, "libsec.so").source == "ld_library_path"
    assert (run.returncode == 0) == (source_of(secure, "libsec.so").path is not None)
    assert source_of(secure, "libsec.so").source == "not-found"


def _run_setuid_as_nobody(exe: Path, tmp_path: Path, env=None):
    for path in [tmp_path, *[p for p in tmp_path.rglob("*")]]:
        os.chmod(path, os.stat(path).st_mode | 0o755 if path.is_dir() else os.stat(path).st_mode | 0o644)
    parent = tmp_path.parent
    while parent != parent.parent:
        os.chmod(parent, os.stat(parent).st_mode | 0o011)
        parent = parent.parent
    os.chmod(exe, 0o4755)
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", exe],
                          env={**CLEAN, **(env or {})}, capture_output=True, text=True)


@pytest.mark.parametrize("rpath", ["$ORIGIN/lib", "/nonexistent/$ORIGIN/../lib"])
def test_origin_rules_when_secure(tmp_path, rpath):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run a set-user-ID program as another user")
    dep = lib(tmp_path / "lib", "liborig.so", "int o(void){return 0;}")
    exe = prog(tmp_path / "app", "int o(void); int main(void){return o();}", needs=[dep], rpath=rpath)
    run = _run_setuid_as_nobody(exe, tmp_path)
    plain = Resolver().closure(str(exe))
    secure = Resolver(secure=True).closure(str(exe))
    if "/nonexistent/" not in rpath:
        assert source_of(plain, "liborig.so").source == "rpath"
    assert (run.returncode == 0) == (source_of(secure, "liborig.so").path is not None)


def test_explain_reports_the_search(tmp_path):
    found = lib(tmp_path / "d", "libe.so", "int e(void){return 0;}")
    exe = prog(tmp_path / "app", "int e(void); int main(void){return e();}", needs=[found],
               runpath=str(tmp_path / "d"))
    resolver = Resolver()
    res = resolver.explain("libe.so", str(exe))
    assert res.source == "runpath" and res.path == f"{tmp_path}/d/libe.so"
    assert res.tried[-1] == (res.path, "ok")
    assert ("runpath", f"{tmp_path}/d/") in res.search_order
    assert res.search_order[-1][0] == "default"
    # a name the program does not need: the same search, from the program
    other = resolver.explain("libnot-needed-anywhere.so", str(exe))
    assert other.path is None and other.source == "not-found"
    assert [s for s, _d in other.search_order][:2] == ["runpath", "ld.so.cache"]
    libc = resolver.explain("libc.so.6", str(exe))
    assert os.path.realpath(libc.path) in parity.run_ldd(exe)[1]


def test_explain_uses_the_loader_chain_of_an_earlier_closure(tmp_path):
    d1, d2, d3 = tmp_path / "d1", tmp_path / "d2", tmp_path / "d3"
    deep = lib(d3, "libdeep.so", "int deep(void){return 3;}")
    leaf = lib(d2, "libleaf.so", "int leaf(void){return 0;}")
    mid = lib(d1, "libmid.so", "int leaf(void); int mid(void){return leaf();}", needs=[leaf],
              rpath=f"{d2}:{d3}")
    exe = prog(tmp_path / "app", "int mid(void); int main(void){return mid();}", needs=[mid],
               rpath=str(d1))
    resolver = Resolver()
    resolver.closure(str(exe))
    leaf_path = source_of(resolver.closure(str(exe)), "libleaf.so").path
    # libleaf has no RPATH of its own: libdeep is found through libmid's, inherited
    via_chain = resolver.explain("libdeep.so", leaf_path)
    assert via_chain.source == "rpath" and via_chain.path == str(deep)
    # on its own, libleaf would not find it
    alone = Resolver().explain("libdeep.so", leaf_path)
    assert alone.path is None
    # and real ld.so agrees once libleaf really needs it through that chain
    lib(d2, "libleaf.so", "int deep(void); int leaf(void){return deep()-3;}", needs=[deep])
    assert str(deep) in parity.run_ldd(exe)[1]


def test_root_resolves_inside_another_tree(tmp_path):
    """root= answers for a container/chroot tree; the oracle is ld.so run inside a real chroot."""
    if os.geteuid() != 0 or shutil.which("chroot") is None:
        pytest.skip("needs root and chroot")
    root = tmp_path / "root"
    host = Resolver().closure("/usr/bin/true")
    for path in list(host.objects) + ["/lib64/ld-linux-x86-64.so.2"]:
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(path), target)
    extra = lib(root / "opt" / "lib", "libextra.so", "int x(void){return 0;}")
    exe = prog(root / "usr" / "bin" / "app", "int x(void); int main(void){return x();}",
               needs=[extra], rpath="/opt/lib")
    listing = subprocess.run([shutil.which("chroot"), str(root), "/lib64/ld-linux-x86-64.so.2", "--list", "/usr/bin/app"],
                             capture_output=True, text=True, env=CLEAN)
    assert listing.returncode == 0, listing.stderr
    expected = set()
    for line in listing.stdout.splitlines():
        target = line.strip().rsplit(" (0x", 1)[0].split("=>")[-1].strip()
        if target.startswith("/"):
            expected.add(target)
    closure = Resolver(root=str(root), cache_path="/etc/ld.so.cache").closure("/usr/bin/app")
    ours_paths = {p for p in closure.objects if p != "/usr/bin/app"}
    assert ours_paths == expected
    assert source_of(closure, "libextra.so").path == "/opt/lib/libextra.so"
    assert exe.exists()


def one_resolver_in_order(roots: dict, order, name: str) -> dict:
    """label -> the Resolution of NEEDED ``name`` in that root's closure, from ONE Resolver
    checking the roots in ``order``; each root's whole closure is asserted equal to ldd's."""
    resolver = Resolver(env={})
    found = {}
    for label in order:
        expected = real_ldd(roots[label])
        got = parity.ours(resolver, str(roots[label]))
        assert parity.compare(expected, got) is None, label
        found[label] = source_of(resolver.closure(str(roots[label])), name)
    return found


@pytest.mark.parametrize("order", [("rpath", "wrapped", "runpath", "alone"), ("alone", "runpath", "wrapped", "rpath")])
def test_one_resolver_answers_each_root_in_its_own_search_context(tmp_path, order):
    """The resolver remembers a requester's search when it is the requester's own (no
    DT_RPATH on its loader chain): libmid.so, without a path of its own, finds libleaf.so
    only through a DT_RPATH it inherits (from the program, or from libwrap.so that loads
    it).  One Resolver checks the four roots in either order, each as ld.so loads it."""
    d1, d2, d3 = tmp_path / "d1", tmp_path / "d2", tmp_path / "d3"
    leaf = lib(d2, "libleaf.so", "int leaf(void){return 3;}")
    mid = lib(d1, "libmid.so", "int leaf(void); int mid(void){return leaf();}", needs=[leaf])
    wrap = lib(d3, "libwrap.so", "int mid(void); int wrap(void){return mid();}", needs=[mid],
               rpath=f"{d1}:{d2}")
    roots = {
        "rpath": prog(tmp_path / "app_rpath", "int mid(void); int main(void){return mid()==3?0:1;}",
                      needs=[mid], rpath=f"{d1}:{d2}"),
        "runpath": prog(tmp_path / "app_runpath", "int mid(void); int main(void){return 0;}",
                        needs=[mid], runpath=str(d1)),
        "wrapped": prog(tmp_path / "app_wrapped", "int wrap(void); int main(void){return wrap()==3?0:1;}",
                        needs=[wrap], runpath=str(d3)),
        "alone": mid,
    }
    sources = {label: res.source for label, res in one_resolver_in_order(roots, order, "libleaf.so").items()}
    # the contexts really differ: found through an inherited DT_RPATH, or nowhere
    assert sources == {"rpath": "rpath", "wrapped": "rpath", "runpath": "not-found", "alone": "not-found"}
    assert subprocess.run([roots["rpath"]], env=CLEAN).returncode == 0
    assert subprocess.run([roots["wrapped"]], env=CLEAN).returncode == 0


@pytest.mark.parametrize("order", [("plain", "nodeflib", "runpath"), ("runpath", "nodeflib", "plain")])
def test_requesters_share_a_search_only_where_their_order_is_the_same(tmp_path, order):
    """The resolver searches a name once for every requester whose order is LD_LIBRARY_PATH,
    ld.so.cache and the default directories; a requester with DF_1_NODEFLIB (which refuses
    the cache's system entries and the default directories) or with its own DT_RUNPATH
    searches for itself.  Three programs NEED libm.so.6, one Resolver checks them in either
    order, each as ld.so loads it."""
    own = tmp_path / "own"
    lib(own, "libm.so.6", "int own_m(void){return 0;}")  # a private libm the RUNPATH finds first
    roots = {
        "plain": prog(tmp_path / "app_plain", "int main(void){return 0;}", needs=["-lm"]),
        "nodeflib": prog(tmp_path / "app_nodeflib", "int main(void){return 0;}", needs=["-lm"],
                         extra=["-Wl,-z,nodefaultlib"]),
        "runpath": prog(tmp_path / "app_runpath", "int main(void){return 0;}", needs=[str(own / "libm.so.6")],
                        runpath=str(own)),
    }
    sources = {label: (res.source, os.path.dirname(res.path or ""))
               for label, res in one_resolver_in_order(roots, order, "libm.so.6").items()}
    assert sources["runpath"] == ("runpath", str(own))
    assert sources["nodeflib"][0] == "not-found"
    assert sources["plain"][0] in ("ld.so.cache", "default") and sources["plain"][1] != str(own)
