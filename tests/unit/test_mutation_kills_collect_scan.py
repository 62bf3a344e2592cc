"""Kill tests for agent/collect/scan.py, closure.py, config.py and fatbin.py (issue 17).

scan.py's Scanner is called in-process here (as agent/commands/check.py calls it), so
mutmut sees which tests reach each function, on small real trees built once per module with
gcc (and nvcc -fatbin for the device code).  Every expected value comes from outside the code
under test: the real ld.so (dlopen RTLD_NOW in a child, `ld.so --help`, LD_DEBUG), readelf
and pyelftools on the built files, dpkg's own database, PyYAML's own error, cuobjdump, and the
files this module wrote itself.
"""
from __future__ import annotations

import errno
import glob
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from seedance.collect import closure as closure_mod
from seedance.collect import config as config_mod
from seedance.collect import fatbin as fatbin_mod
from seedance.collect import scan
from seedance.collect.scan import CheckOptions, Scanner
from seedance.model.errors import BadInput, ELFError, UsageError
from tests.conftest import ld_so_hwcaps_levels

GCC = shutil.which("gcc")
pytestmark = pytest.mark.skipif(GCC is None, reason="gcc not installed")
EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".cpython-3%d-x86_64-linux-gnu.so" % sys.version_info.minor


def cc(*args):
    subprocess.run([GCC, *map(str, args)], check=True, capture_output=True)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def dlopen_error(loader: Path, path) -> str:
    """What the real ld.so says when ``path`` is dlopen'ed RTLD_NOW by a fresh process ('' if it loads)."""
    proc = subprocess.run([str(loader), str(path)], capture_output=True, timeout=60)
    return proc.stdout.decode("utf-8", "replace").strip()


def python_dlopen_error(path) -> str:
    """dlopen RTLD_NOW inside this Python interpreter (its C API in scope), in a child."""
    code = "import ctypes, os, sys\ntry:\n    ctypes.CDLL(sys.argv[1], os.RTLD_NOW)\nexcept OSError as e:\n    print(e)\n"
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, timeout=60)
    return proc.stdout.decode("utf-8", "replace").strip()


# --------------------------------------------------------------------------------------------
# the tree: one scan of it, strict, shared by the tests below
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tree_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("scantree")
    b, t = root / "build", root / "tree"
    b.mkdir()
    t.mkdir()
    p = {"build": b, "tree": t}
    write(b / "dl.c", "#include <dlfcn.h>\n#include <stdio.h>\nint main(int c, char **v) {\n"
                      "  if (!dlopen(v[1], RTLD_NOW)) { printf(\"%s\\n\", dlerror()); return 1; }\n  return 0;\n}\n")
    cc(b / "dl.c", "-o", b / "dl", "-ldl")
    p["dl"] = b / "dl"
    # a versioned provider: linked against with VER_1 {foo, bar} and VER_2 {baz}; the copy
    # installed in the tree has VER_1 {foo} only
    write(b / "prov.c", "int foo(void){return 1;}\nint bar(void){return 2;}\nint baz(void){return 3;}\n")
    write(b / "full.map", "VER_1 { global: foo; bar; local: *; };\nVER_2 { global: baz; } VER_1;\n")
    write(b / "old.map", "VER_1 { global: foo; local: *; };\n")
    cc("-shared", "-fPIC", b / "prov.c", "-o", b / "libprov.so", "-Wl,-soname,libprov.so.1",
       f"-Wl,--version-script={b / 'full.map'}")
    write(b / "prov_old.c", "int foo(void){return 1;}\n")
    cc("-shared", "-fPIC", b / "prov_old.c", "-o", t / "libprov.so.1", "-Wl,-soname,libprov.so.1",
       f"-Wl,--version-script={b / 'old.map'}")
    write(b / "gap.c", "int foo(void); int bar(void);\nint gap(void){return foo()+bar();}\n")
    cc("-shared", "-fPIC", b / "gap.c", "-o", t / "libusergap.so", f"-L{b}", "-lprov", "-Wl,-rpath,$ORIGIN")
    write(b / "ver.c", "int foo(void); int baz(void);\nint ver(void){return foo()+baz();}\n")
    cc("-shared", "-fPIC", b / "ver.c", "-o", t / "libuserver.so", f"-L{b}", "-lprov", "-Wl,-rpath,$ORIGIN")
    # NEEDED entries that resolve nowhere: one with a copy elsewhere in the tree, one without
    write(b / "g.c", "int g(void){return 7;}\n")
    cc("-shared", "-fPIC", b / "g.c", "-o", b / "libgone.so.1", "-Wl,-soname,libgone.so.1")
    cc("-shared", "-fPIC", b / "g.c", "-o", b / "libnowhere.so.7", "-Wl,-soname,libnowhere.so.7")
    (t / "elsewhere").mkdir()
    shutil.copyfile(b / "libgone.so.1", t / "elsewhere" / "libgone.so.1")
    write(b / "broken.c", "int g(void);\nint broken(void){return g();}\n")
    cc("-shared", "-fPIC", b / "broken.c", "-o", t / "libbroken.so", "-Wl,--no-as-needed", f"-L{b}",
       "-l:libgone.so.1", "-l:libnowhere.so.7")
    # an optional plugin (Open MPI's mca_* components) with a NEEDED that resolves nowhere
    cc("-shared", "-fPIC", b / "broken.c", "-o", t / "mca_btl_demo.so", "-Wl,--no-as-needed", f"-L{b}",
       "-l:libnowhere.so.7")
    # a symbol nothing defines (libc linked, so its closure is libc and ld.so too)
    write(b / "undef.c", "#include <stdio.h>\nint nowhere_at_all(void);\n"
                         "int u(void){puts(\"u\"); return nowhere_at_all();}\n")
    cc("-shared", "-fPIC", b / "undef.c", "-o", t / "libundef.so")
    # a NEEDED found only through the loader: app's DT_RPATH is inherited by libA
    (t / "sub").mkdir()
    write(b / "B.c", "int bee(void){return 2;}\n")
    cc("-shared", "-fPIC", b / "B.c", "-o", t / "sub" / "libB.so", "-Wl,-soname,libB.so")
    write(b / "A.c", "int bee(void);\nint ay(void){return bee();}\n")
    cc("-shared", "-fPIC", b / "A.c", "-o", t / "sub" / "libA.so", "-Wl,-soname,libA.so", f"-L{t / 'sub'}", "-lB")
    write(b / "app.c", "int ay(void);\nint main(void){return ay() - 2;}\n")
    cc(b / "app.c", "-o", t / "app", f"-L{t / 'sub'}", "-lA", "-Wl,--disable-new-dtags,-rpath,$ORIGIN/sub",
       "-Wl,--allow-shlib-undefined")
    # a NEEDED found already loaded: app2 loads libD itself (its own DT_RUNPATH, which libC
    # does not inherit), then libC, whose NEEDED libD is the copy already there
    (t / "sub2").mkdir()
    cc("-shared", "-fPIC", b / "B.c", "-o", t / "sub2" / "libD.so", "-Wl,-soname,libD.so")
    cc("-shared", "-fPIC", b / "A.c", "-o", t / "sub2" / "libC.so", "-Wl,-soname,libC.so", f"-L{t / 'sub2'}", "-lD")
    cc(b / "app.c", "-o", t / "app2", "-Wl,--no-as-needed", f"-L{t / 'sub2'}", "-lD", "-lC",
       "-Wl,--enable-new-dtags,-rpath,$ORIGIN/sub2")
    # a Python extension: PyLong_FromLong is the interpreter's, nowhere_py nobody's
    write(b / "ext.c", "long PyLong_FromLong(long);\nint nowhere_py(void);\n"
                       "long e(void){ PyLong_FromLong(1); return nowhere_py(); }\n")
    cc("-shared", "-fPIC", b / "ext.c", "-o", t / ("ext" + EXT_SUFFIX))
    # files that are not checked
    write(t / "notes.txt", "not an ELF file, long enough to be sniffed\n")
    write(t / "mod.py", "import os  # never opened\n")
    (t / "short").write_bytes(b"\x7fELF")
    os.symlink("missing.so", t / "dangling.so")
    os.symlink("loop2", t / "loop1")
    os.symlink("loop1", t / "loop2")
    for sub in ("zz", "aa"):  # a loop in each of two directories: walked in os.walk's (sorted) order
        (t / sub).mkdir()
        os.symlink(f"loop-{sub}", t / sub / f"loop-{sub}")
    os.symlink("sub", t / "linkdir")  # a linked directory: neither entered nor counted
    os.symlink("libprov.so.1", t / "libprov.so")  # the same file again: one root
    os.mkfifo(t / "fifo")
    data = bytearray((t / "libprov.so.1").read_bytes())
    data[18:20] = (183).to_bytes(2, "little")  # EM_AARCH64: another machine's object
    (t / "arm.so").write_bytes(bytes(data))
    (t / "corrupt.so").write_bytes(b"\x7fELF\x02\x01\x01" + b"\x00" * 9 + b"\xff" * 48)
    # 16 bytes, the ELF magic first: long enough to be read as an object (and too short to be one)
    (t / "sixteen.so").write_bytes(b"\x7fELF" + b"\x00" * 12)
    os.symlink("sixteen.so", t / "sixteen-link.so")
    # configs: seedance's own, a bad one, a plugin manifest, and YAML that is none of ours
    write(t / "seedance.yaml", "env:\n  LD_PRELOAD: ${HOME}/.local/lib/libshim.so\n")
    (b / "bad").mkdir()  # outside the tree: a bad config found in a named tree is bad input
    write(b / "bad" / "seedance.yml", "env: [unclosed\n")
    (t / "plug").mkdir()
    write(t / "plug" / "manifest.yaml", "seedance_version: 1\nlibrary: /opt/plug/libplug.so\n")
    (t / "ci").mkdir()
    write(t / "ci" / "manifest.yml", "name: build\nLD_LIBRARY_PATH: ${PREFIX}/lib\n")
    write(t / "ci" / "workflow.yaml", "env:\n  LD_PRELOAD: ${HOME}/x.so\n")
    for name in ("app", "libbroken.so", "libundef.so", "libusergap.so", "libuserver.so", "mca_btl_demo.so"):
        p[name] = t / name
    p["ext"] = t / ("ext" + EXT_SUFFIX)
    return p


_SCANS: dict = {}  # tree -> (scanner, report): the strict scan of the tree, once per module


@pytest.fixture
def tree(tree_files):
    """The tree's paths, with its strict scan (run on first use, then remembered)."""
    key = str(tree_files["tree"])
    if key not in _SCANS:
        scanner = Scanner(CheckOptions(targets=[key], strict=True))
        _SCANS[key] = (scanner, scanner.run())
    scanner, report = _SCANS[key]
    return {**tree_files, "scanner": scanner, "report": report}


def facts_of(scanner, kind, path=None):
    return [f for f in scanner.facts if f.kind == kind and (path is None or f.subject["path"] == str(path))]


def test_the_trees_counts_and_errors(tree):
    t = tree["tree"]
    stats = dict(tree["report"].stats)
    duration = stats.pop("duration_s")
    assert isinstance(duration, float) and duration >= 0
    elf_files = ["app", "app2", "sub2/libC.so", "sub2/libD.so", "libbroken.so", "libprov.so.1", "libundef.so", "libusergap.so", "libuserver.so",
                 "mca_btl_demo.so", "ext" + EXT_SUFFIX, "elsewhere/libgone.so.1", "sub/libA.so", "sub/libB.so"]
    # every name in the tree, links included (the linked directory is not a file)
    listed = ["notes.txt", "mod.py", "short", "dangling.so", "loop1", "loop2", "libprov.so", "fifo", "arm.so",
              "corrupt.so", "sixteen.so", "sixteen-link.so", "aa/loop-aa", "zz/loop-zz", "seedance.yaml", "plug/manifest.yaml", "ci/manifest.yml",
              "ci/workflow.yaml"] + elf_files
    errors = stats.pop("errors")
    loops = [t / "loop1", t / "loop2", t / "aa" / "loop-aa", t / "zz" / "loop-zz"]
    assert errors[:4] == [{"path": str(p), "error": "symbolic link loop"} for p in loops]
    # then the roots, in order: each unreadable object once (sixteen.so, not the link to it)
    assert [e["path"] for e in errors[4:]] == [str(t / "corrupt.so"), str(t / "sixteen.so")]
    from seedance.elf.reader import read_elf
    for error in errors[4:]:
        assert set(error) == {"path", "error"}
        with pytest.raises(ELFError) as read_error:  # the reader's own verdict on the file
            read_elf(error["path"])
        assert error["error"] == str(read_error.value) and error["error"] not in ("", "None")
    kinds = {}
    for fact in tree["scanner"].facts:
        kinds[fact.kind] = kinds.get(fact.kind, 0) + 1
    objects = set()
    for f in tree["scanner"].facts:
        objects.add(f.subject["path"])
    assert stats == {
        "files_scanned": len(listed),
        "elf_objects": len(elf_files),  # arm.so is skipped, corrupt.so unreadable
        "closure_objects": len(tree["scanner"].objects_seen),
        # notes, mod.py, short, dangling, fifo, ci/workflow.yaml (not ours), ci/manifest.yml (no
        # seedance_version), and arm.so (another machine's object)
        "skipped": 8,
        "unreadable": 6,  # four loops, corrupt.so and sixteen.so
        "processes": 0, "processes_vanished": 0,
        "configs": 2,  # seedance.yaml and plug/manifest.yaml
        "facts": len(tree["scanner"].facts), "facts_by_kind": dict(sorted(kinds.items())),
    }
    assert list(stats["facts_by_kind"]) == sorted(kinds)


def test_closure_objects_are_what_ld_so_maps(tree):
    """closure_objects: the distinct files of every root's closure; ldd lists them for the
    roots that load (the tree's files plus libc and ld.so)."""
    seen = {os.path.realpath(p) for p in tree["scanner"].objects_seen}
    proc = subprocess.run(["ldd", str(tree["app"])], capture_output=True, text=True, errors="replace")
    for line in proc.stdout.splitlines():
        m = re.search(r"(/\S+) \(0x", line)
        if m:
            assert os.path.realpath(m.group(1)) in seen, line
    assert len(tree["scanner"].objects_seen) == tree["report"].stats["closure_objects"]


def ldd_paths(path) -> list:
    """The files ldd (ld.so in trace mode) maps for ``path``, in its order."""
    proc = subprocess.run(["ldd", str(path)], capture_output=True, text=True, errors="replace",
                          env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"})
    return [m.group(1) for m in re.finditer(r"(/\S+) \(0x", proc.stdout)]


def ld_debug_libs(loader, path, env=None) -> list:
    """LD_DEBUG=libs lines of ``loader`` loading ``path`` (pid prefix removed)."""
    full = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "LD_DEBUG": "libs", **(env or {})}
    proc = subprocess.run([str(loader), *([str(path)] if path else [])], capture_output=True, env=full, timeout=60)
    return [line.split(":", 1)[1].strip() for line in proc.stderr.decode("utf-8", "replace").splitlines()
            if ":" in line]


def system_dirs(lines, name) -> list:
    """The system search path ld.so used for ``name``, its hwcaps/tls/platform subdirectories
    folded into the directory they are under (seedance lists the directories themselves)."""
    start = lines.index(f"find library={name} [0]; searching")
    path = next(line for line in lines[start:] if line.startswith("search path=") and "(system search path)" in line)
    dirs = []
    for entry in path.split("=", 1)[1].split()[0].split(":"):
        # (the legacy subdirectories too: tls/haswell/avx512_1/x86_64 on an AVX-512 Intel CPU)
        base = re.sub(r"/(glibc-hwcaps/[^/]+|(tls|haswell|xeon_phi|avx512_1|x86_64)"
                      r"(/(haswell|xeon_phi|avx512_1|x86_64))*)$", "", entry)
        if base + "/" not in dirs:
            dirs.append(base + "/")
    return dirs


def as_lists(value):
    return [list(item) for item in value]


def test_needed_facts_of_a_library_with_two_missing_needed(tree):
    lines = ld_debug_libs(tree["dl"], tree["libbroken.so"])
    error = dlopen_error(tree["dl"], tree["libbroken.so"])
    assert "libgone.so.1: cannot open shared object file" in error
    facts = {f.data["name"]: f.data for f in facts_of(tree["scanner"], "needed", tree["libbroken.so"])}
    assert sorted(facts) == ["libc.so.6", "libgone.so.1", "libnowhere.so.7"]  # readelf's NEEDED list
    copy = str(tree["tree"] / "elsewhere" / "libgone.so.1")
    for name, extra in (("libgone.so.1", {"installed_at": [copy], "package": "",
                                           "where": f"; installed at {copy}, which is not on its loader path"}),
                        ("libnowhere.so.7", {})):
        dirs = system_dirs(lines, "libgone.so.1")
        data = dict(facts[name])
        data["tried"], data["search_order"] = as_lists(data["tried"]), as_lists(data["search_order"])
        expected = {"name": name, "resolved": False, "resolved_path": None, "has_soname": False, "soname": None,
                    "same_library": False, "source": "not-found",
                    "tried": [[d + name, "no such file"] for d in dirs],
                    "search_order": [["ld.so.cache", "/etc/ld.so.cache"]] + [["default", d] for d in dirs],
                    "context": "", "reason": "", "package": "", "loader": "", "installed_at": [], "where": ""}
        expected.update(extra)
        assert data == expected, name
    libc = facts["libc.so.6"]
    assert (libc["resolved"], libc["soname"], libc["has_soname"], libc["same_library"], libc["source"]) == (
        True, "libc.so.6", True, True, "ld.so.cache")
    tried = next(line for line in lines[lines.index("find library=libc.so.6 [0]; searching"):]
                 if line.startswith("trying file="))
    assert libc["resolved_path"] == tried.split("=", 1)[1]


def test_a_needed_found_through_the_loaders_rpath(tree):
    sub = tree["tree"] / "sub"
    assert "libB.so: cannot open shared object file" in dlopen_error(tree["dl"], sub / "libA.so")
    assert subprocess.run([str(tree["app"])]).returncode == 0  # loaded by app, it runs
    lines = ld_debug_libs(tree["app"], None)
    start = lines.index("find library=libB.so [0]; searching")
    assert lines[start + 1] == f"search path={sub}\t\t(RPATH from file {tree['app']})"
    [fact] = [f for f in facts_of(tree["scanner"], "needed", sub / "libA.so")
              if f.data["name"] == "libB.so"]
    data = dict(fact.data)
    assert as_lists(data.pop("tried")) == [[str(sub / "libB.so"), "ok"]]
    assert as_lists(data.pop("search_order"))[0] == ["rpath", str(sub) + "/"]
    assert data == {"name": "libB.so", "resolved": True, "resolved_path": str(sub / "libB.so"),
                    "has_soname": True, "soname": "libB.so", "same_library": True, "source": "rpath",
                    "context": "loader", "reason": f"found through the DT_RPATH it inherits from {tree['app']}",
                    "package": "", "loader": str(tree["app"]), "installed_at": [], "where": ""}
    rules = {(f.rule, f.subject["path"]) for f in tree["report"].findings}
    assert ("needed-via-loader", str(sub / "libA.so")) in rules


def test_a_needed_found_already_loaded_by_the_loader(tree):
    sub2 = tree["tree"] / "sub2"
    assert "libD.so: cannot open shared object file" in dlopen_error(tree["dl"], sub2 / "libC.so")
    assert subprocess.run([str(tree["tree"] / "app2")]).returncode == 0
    lines = ld_debug_libs(tree["tree"] / "app2", None)
    assert lines.count("find library=libD.so [0]; searching") == 1  # looked for once: for app2
    [fact] = [f for f in facts_of(tree["scanner"], "needed", sub2 / "libC.so") if f.data["name"] == "libD.so"]
    assert (fact.data["resolved_path"], fact.data["source"], fact.data["context"], fact.data["loader"]) == (
        str(sub2 / "libD.so"), "loaded", "loader", str(tree["tree"] / "app2"))
    assert fact.data["reason"] == f"found already loaded by {tree['tree'] / 'app2'}"


def test_an_optional_plugin_with_a_missing_needed(tree):
    assert "libnowhere.so.7: cannot open" in dlopen_error(tree["dl"], tree["mca_btl_demo.so"])
    [fact] = [f for f in facts_of(tree["scanner"], "needed", tree["mca_btl_demo.so"])
              if f.data["name"] == "libnowhere.so.7"]
    assert (fact.data["context"], fact.data["reason"], fact.data["resolved"]) == (
        "optional-plugin", "Open MPI loads an MCA component only when that component is selected", False)
    assert (fact.data["installed_at"], fact.data["where"], fact.data["loader"]) == ([], "", "")


def test_a_symbol_nothing_defines(tree):
    assert "undefined symbol: nowhere_at_all" in dlopen_error(tree["dl"], tree["libundef.so"])
    [fact] = facts_of(tree["scanner"], "undefined_symbol", tree["libundef.so"])
    assert fact.data == {"symbol": "nowhere_at_all", "version": None, "provided": False,
                         "closure_size": 1 + len(ldd_paths(tree["libundef.so"])), "cause": "no-definition",
                         "provider": "", "host": ""}
    assert fact.source == "collect.closure"
    # a strict check reports it (a rule for strict mode only)
    assert ("symbol-undefined", str(tree["libundef.so"])) in {(f.rule, f.subject["path"])
                                                             for f in tree["report"].findings}
    lax = Scanner(CheckOptions(targets=[str(tree["libundef.so"])])).run()
    assert "undefined_symbol" not in lax.stats["facts_by_kind"] and lax.findings == []


def test_undefined_facts_default_to_the_closures_own(tree):
    from seedance.resolve import Resolver

    result = Resolver(env={}).closure(str(tree["libundef.so"]), symbols=True)
    facts = closure_mod.undefined_facts(result, closure_mod.FactDedup())
    assert [(f.subject["path"], f.data["symbol"], f.data["host"]) for f in facts] == [
        (str(tree["libundef.so"]), "nowhere_at_all", "")]


def test_a_symbol_its_version_node_lacks(tree):
    """bar@VER_1: libprov.so.1 defines VER_1, but not bar.  Once, although strict mode
    also looks for undefined symbols (one dedup bucket)."""
    provider = str(tree["tree"] / "libprov.so.1")
    assert "undefined symbol: bar, version VER_1" in dlopen_error(tree["dl"], tree["libusergap.so"])
    [fact] = facts_of(tree["scanner"], "undefined_symbol", tree["libusergap.so"])
    assert fact.data == {"symbol": "bar", "version": "VER_1", "provided": False,
                         "closure_size": 1 + len(ldd_paths(tree["libusergap.so"])), "cause": "node-lacks-symbol",
                         "provider": provider, "host": "", "upgrade": "install a newer libprov.so.1"}
    assert fact.source == "collect.closure"
    [need] = facts_of(tree["scanner"], "version_need", tree["libusergap.so"])
    assert need.data == {"file": "libprov.so.1", "version": "VER_1", "weak": False, "provider": provider,
                         "defined": True, "provider_versions": ["VER_1"]}


def provider_versions(path) -> list:
    """Version definitions of ``path`` as pyelftools reads them, the file's own base entry left out."""
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as handle:
        section = ELFFile(handle).get_section_by_name(".gnu.version_d")
        return [next(aux).name for verdef, aux in section.iter_versions() if not verdef["vd_flags"] & 1]


def test_a_version_its_provider_does_not_define(tree):
    provider = str(tree["tree"] / "libprov.so.1")
    assert "version `VER_2' not found" in dlopen_error(tree["dl"], tree["libuserver.so"])
    versions = provider_versions(provider)
    needs = {f.data["version"]: f.data for f in facts_of(tree["scanner"], "version_need", tree["libuserver.so"])}
    assert needs == {
        "VER_1": {"file": "libprov.so.1", "version": "VER_1", "weak": False, "provider": provider,
                  "defined": True, "provider_versions": versions},
        "VER_2": {"file": "libprov.so.1", "version": "VER_2", "weak": False, "provider": provider,
                  "defined": False, "provider_versions": versions}}
    [undefined] = facts_of(tree["scanner"], "undefined_symbol", tree["libuserver.so"])
    assert (undefined.data["symbol"], undefined.data["version"], undefined.data["cause"]) == ("baz", "VER_2",
                                                                                               "no-definition")
    rules = sorted(f.rule for f in tree["report"].findings if f.subject["path"] == str(tree["libuserver.so"]))
    assert "symbol-version-missing" in rules


def test_an_extension_module_sees_its_interpreters_symbols(tree):
    """The interpreter that loads an extension provides the C API: only nowhere_py is missing."""
    error = python_dlopen_error(tree["ext"])
    assert "undefined symbol: nowhere_py" in error
    facts = facts_of(tree["scanner"], "undefined_symbol", tree["ext"])
    assert [f.data["symbol"] for f in facts] == ["nowhere_py"]
    assert facts[0].data["host"] == os.path.realpath(sys.executable)
    assert facts[0].data["closure_size"] == 1 + len(ldd_paths(tree["ext"]))


def test_configs_found_in_the_tree(tree):
    t = tree["tree"]
    facts = {f.subject["path"]: f.data for f in facts_of(tree["scanner"], "config_env")}
    assert facts == {
        str(t / "seedance.yaml"): {"key": "LD_PRELOAD", "value": "${HOME}/.local/lib/libshim.so",
                                   "problem": "expands ${HOME} when the config is read (use the lazy form $${...})",
                                   "line": 2, "expands_early": True, "variables": ["HOME"],
                                   "preload_missing": False, "preload_writable": False, "use": "preload"},
        str(t / "plug" / "manifest.yaml"): {"key": "library", "value": "/opt/plug/libplug.so", "problem": "",
                                            "line": 2, "expands_early": False, "variables": [],
                                            "preload_missing": False, "preload_writable": False,
                                            "use": "libpath"}}


# --------------------------------------------------------------------------------------------
# scan.py's collectors called one by one
# --------------------------------------------------------------------------------------------

def ready(options=None) -> Scanner:
    """A Scanner with what run() sets up before its collectors run."""
    from seedance.resolve import Resolver

    scanner = Scanner(options or CheckOptions(targets=["/"]))
    scanner.gpu = scan.gpu_context(scanner.options)
    scanner.python_torch = None
    scanner.resolver = Resolver(env={})
    return scanner


def enoent_text(path) -> str:
    return f"{path}: {os.strerror(errno.ENOENT).lower()}"


def test_expand_each_kind_of_target(tree, tmp_path):
    t = tree["tree"]
    scanner = ready()
    with pytest.raises(BadInput) as err:
        scanner._expand(str(tmp_path / "nope"))
    assert str(err.value) == enoent_text(tmp_path / "nope")
    with pytest.raises(BadInput) as err:
        scanner._expand(str(t / "loop1"))
    assert str(err.value) == f"{t / 'loop1'}: symbolic link loop"
    with pytest.raises(BadInput) as err:
        scanner._expand(str(t / "fifo"))
    assert str(err.value) == f"{t / 'fifo'}: not a regular file or directory"
    with pytest.raises(BadInput) as err:
        scanner._expand(str(t / "notes.txt"))
    assert str(err.value) == f"{t / 'notes.txt'}: not an ELF file or a seedance YAML config"
    assert scanner.stats["files"] == 1  # the fifo and the missing file are no files
    assert scanner._expand(str(t / "ci" / "workflow.yaml")) == ([], [str(t / "ci" / "workflow.yaml")])
    lib = str(t / "libundef.so")
    roots, configs = scanner._expand(lib)
    assert (roots, configs) == ([(lib, os.stat(lib))], []) and scanner.explicit == {lib}
    assert scanner.stats["files"] == 3
    roots, configs = scanner._expand(str(t / "sub"))
    assert [r[0] for r in roots] == [str(t / "sub" / "libA.so"), str(t / "sub" / "libB.so")] and configs == []
    assert scanner.explicit == {lib}


def test_an_unreadable_root(tree, tmp_path):
    scanner = ready()
    gone = str(tmp_path / "libvanished.so")
    scanner._root(gone)
    assert scanner.stats["unreadable"] == 1 and scanner.stats["elf"] == 0
    assert scanner.errors == [{"path": gone, "error": enoent_text(gone)}]
    # named on the command line: the reader's error is the command's (exit 2)
    named, other = ready(), str(tmp_path / "libnamed.so")
    named.explicit.add(other)
    with pytest.raises(ELFError) as err:
        named._root(other)
    assert str(err.value) == enoent_text(other)
    assert (named.stats["unreadable"], named.errors) == (0, [])
    corrupt = str(tree["tree"] / "corrupt.so")
    scanner.explicit.add(corrupt)
    with pytest.raises(ELFError):
        scanner._root(corrupt)
    assert scanner.stats["unreadable"] == 1 and len(scanner.errors) == 1


def test_a_named_corrupt_object_is_bad_input(tree):
    with pytest.raises(ELFError):
        Scanner(CheckOptions(targets=[str(tree["tree"] / "corrupt.so")])).run()


def test_another_machines_object_is_skipped(tree):
    scanner = ready()
    scanner._root(str(tree["tree"] / "arm.so"))
    assert (scanner.stats["skipped"], scanner.stats["elf"], scanner.errors, scanner.facts) == (1, 0, [], [])


def test_config_errors_named_or_found(tree, tmp_path):
    import yaml

    bad = str(tree["build"] / "bad" / "seedance.yml")
    try:  # libyaml's own words (PyYAML's pure-Python parser words it otherwise)
        yaml.compose(open(bad).read(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        text = f"{bad}: line {exc.problem_mark.line + 1} not valid YAML: {exc.problem}"
    scanner = ready()
    with pytest.raises(BadInput) as err:
        scanner._config(bad, explicit=True)
    assert str(err.value) == text
    scanner._config(bad, explicit=False)
    assert scanner.errors == [{"path": bad, "error": text}]
    assert (scanner.stats["configs"], scanner.stats["unreadable"]) == (0, 0)
    gone = str(tmp_path / "seedance.yaml")
    with pytest.raises(BadInput) as err:
        scanner._config(gone, explicit=True)
    assert str(err.value) == enoent_text(gone)
    scanner._config(gone, explicit=False)
    assert scanner.errors[1:] == [{"path": gone, "error": enoent_text(gone)}]
    assert (scanner.stats["configs"], scanner.stats["unreadable"]) == (0, 1)
    good = str(tree["tree"] / "seedance.yaml")
    scanner._config(good, explicit=True)
    assert scanner.stats["configs"] == 1 and [f.kind for f in scanner.facts] == ["config_env"]
    with pytest.raises(BadInput) as err:
        Scanner(CheckOptions(targets=[bad])).run()
    assert str(err.value) == text


def test_processes_live_and_gone():
    scanner = ready()
    views = []
    scanner.on_process = views.append
    scanner._process(os.getpid(), explicit=True)
    assert scanner.stats["processes"] == 1 and [v.pid for v in views] == [os.getpid()]
    # the mapped-library facts are this process's: its executable, as the kernel names it
    exe = os.path.realpath(f"/proc/{os.getpid()}/exe")
    mapped = [f for f in scanner.facts if f.kind == "mapped_lib"]
    assert {"pid": os.getpid(), "path": exe} in [f.subject for f in mapped]
    child = subprocess.Popen(["true"])
    child.wait()
    with pytest.raises(BadInput) as err:
        scanner._process(child.pid, explicit=True)
    assert str(err.value) == f"pid {child.pid}: no such process"
    scanner._process(child.pid, explicit=False)
    assert (scanner.stats["vanished"], scanner.stats["processes"]) == (1, 1)
    report = Scanner(CheckOptions(pids=[os.getpid()])).run()
    assert (report.stats["processes"], report.stats["processes_vanished"]) == (1, 0)
    assert report.extra["scope"]["pids"] == [os.getpid()] and report.extra["scope"]["host"] is False


def test_a_rules_directory_is_read_before_any_work(tmp_path):
    from seedance.model.errors import RuleError

    with pytest.raises(RuleError) as err:
        Scanner(CheckOptions(targets=[str(tmp_path / "nothing-here")], rules_dir=str(tmp_path))).run()
    assert str(err.value) == f"{tmp_path}: no rule files (*.yaml)"


def test_a_named_process_that_is_gone():
    child = subprocess.Popen(["true"])
    child.wait()
    with pytest.raises(BadInput) as err:
        Scanner(CheckOptions(pids=[child.pid])).run()
    assert str(err.value) == f"pid {child.pid}: no such process"


def test_gpu_context_from_the_command_line():
    with pytest.raises(UsageError) as err:
        scan.gpu_context(CheckOptions(arch="gfx90a"))
    assert str(err.value) == "--arch: not a GPU architecture: 'gfx90a' (expected e.g. sm_90)"
    with pytest.raises(UsageError) as err:
        scan.gpu_context(CheckOptions(driver_version="banana"))
    assert str(err.value).startswith("--driver-version: ")
    gpu = scan.gpu_context(CheckOptions(arch="sm_90a", driver_version="550.54.15"))
    assert gpu.targets == [(90, "a", "sm_90a", "--arch")]
    assert (gpu.driver_version, gpu.driver_source) == ("550.54.15", "--driver-version")


def test_scope_of_a_target_check(tree):
    report = tree["report"]
    scope = report.extra["scope"]
    assert scope == {"host": False, "targets": [str(tree["tree"])], "pids": [], "strict": True,
                     "gpu_targets": [], "driver_version": scope["driver_version"]}
    report = Scanner(CheckOptions(targets=[str(tree["libundef.so"])], arch="sm_86", driver_version="560.28.03")).run()
    assert report.extra["scope"] == {"host": False, "targets": [str(tree["libundef.so"])], "pids": [],
                                     "strict": False, "gpu_targets": ["sm_86"], "driver_version": "560.28.03"}
    assert (report.host["gpu"]["driver_version"], report.host["gpu"]["driver_source"]) == (
        "560.28.03", "--driver-version")
    assert report.command == "check"


def test_scope_of_a_host_check(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    scanner = ready(CheckOptions())
    scope = scanner._scope()
    assert scope["host"] is True and (scope["targets"], scope["pids"], scope["strict"]) == ([], [], False)
    assert scope["ld_so_cache"] == "/etc/ld.so.cache"
    assert scope["config_dirs"] == [str(tmp_path / "cfg" / "seedance"), "/etc/seedance",
                                    str(tmp_path / "data" / "seedance" / "plugins")]
    cuda_dirs = scope["cuda_dirs"]
    assert isinstance(cuda_dirs, list) and all(os.path.isdir(d) for d in cuda_dirs)
    if os.path.isdir("/usr/local/cuda/lib64"):
        assert os.path.realpath("/usr/local/cuda/lib64") in {os.path.realpath(d) for d in cuda_dirs}
    assert isinstance(scope["torch_ext_roots"], list)
    assert set(scope) == {"host", "targets", "pids", "strict", "gpu_targets", "driver_version", "ld_so_cache",
                          "cuda_dirs", "config_dirs", "torch_ext_roots"}


def test_sniff(tree, tmp_path):
    t = tree["tree"]
    assert scan._sniff(str(t / "libundef.so")) == "elf"
    assert scan._sniff(str(t / "notes.txt")) == "other"
    assert scan._sniff(str(t / "fifo")) == "other"  # O_NONBLOCK: an empty read, no hang
    missing = scan._sniff(str(tmp_path / "nope"))
    assert isinstance(missing, OSError) and missing.errno == errno.ENOENT
    assert missing.filename == str(tmp_path / "nope")
    directory = scan._sniff(str(t))
    assert isinstance(directory, OSError) and directory.errno == errno.EISDIR


def test_is_seedance_config(tmp_path):
    def make(rel, text="a: 1\n"):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return str(path)

    assert scan._is_seedance_config(make("x/agent.yaml"))
    assert scan._is_seedance_config(make("x/shim.yaml"))
    assert scan._is_seedance_config(make("x/seedance.yml"))
    assert not scan._is_seedance_config(make("x/other.yaml"))
    assert scan._is_seedance_config(make("seedance/other.yaml"))
    assert not scan._is_seedance_config(make("rules_data/seedance.yaml"))
    assert not scan._is_seedance_config(make("seedance/rules_data/agent.yaml"))
    assert not scan._is_seedance_config(make("p/manifest.yaml", "name: x\n"))
    assert scan._is_seedance_config(make("q/manifest.yaml", "name: x\nseedance_version: 2\n"))
    assert scan._is_seedance_config(make("r/manifest.yml", "seedance_version: 2\n"))
    assert scan._is_seedance_config(make("seedance/manifest.yml", "name: x\n"))
    # the marker past the first 64 KiB is not read
    assert not scan._is_seedance_config(make("s/manifest.yaml", "#" * (1 << 16) + "\nseedance_version: 1\n"))
    assert scan._is_seedance_config(make("u/manifest.yaml", "#" * ((1 << 16) - 17) + "\nseedance_version"))
    (tmp_path / "t" / "manifest.yaml").mkdir(parents=True)  # cannot be read: not ours
    assert not scan._is_seedance_config(str(tmp_path / "t" / "manifest.yaml"))


def test_unique_roots_order_and_choice(tmp_path):
    for name in ("libb.so.1", "liba.so.1"):
        (tmp_path / name).write_bytes(name.encode())
    os.symlink("libb.so.1", tmp_path / "libb.so")
    os.symlink("liba.so.1", tmp_path / "liba.so")
    paths = [tmp_path / "libb.so", tmp_path / "libb.so.1", tmp_path / "liba.so", tmp_path / "liba.so.1"]
    found = [(str(p), os.stat(p)) for p in paths]
    assert scan._unique_roots(found) == [str(tmp_path / "liba.so.1"), str(tmp_path / "libb.so.1")]
    # the real file first, then a link: the real file stays
    assert scan._unique_roots(found[1:2] + found[0:1]) == [str(tmp_path / "libb.so.1")]
    # two links to one file: the first stays
    os.symlink("libb.so.1", tmp_path / "libb.so.x")
    two = [(str(tmp_path / "libb.so.x"), os.stat(tmp_path / "libb.so.x")), found[0]]
    assert scan._unique_roots(two) == [str(tmp_path / "libb.so.x")]
    assert scan._unique_roots([]) == []


class Recorder:
    """A progress observer: what the scan reported, in order."""

    def __init__(self):
        self.calls = []

    def start(self, total, label=None):
        self.calls.append(("start", total, label))

    def advance(self, step=1, note=""):
        self.calls.append(("advance", step, note))

    def finish(self):
        self.calls.append(("finish",))


def test_run_check_reports_progress_and_closures(tree):
    import socket
    import time

    sub = tree["tree"] / "sub"
    progress = Recorder()
    before = time.monotonic()
    report = scan.run_check(CheckOptions(targets=[str(sub)]), progress)
    took = time.monotonic() - before
    # the duration is the scan's own, measured inside the call (not a wall-time assertion)
    assert 0 <= report.stats["duration_s"] <= round(took, 3) + 0.001
    assert report.stats["duration_s"] == round(report.stats["duration_s"], 3)
    assert report.host["hostname"] == socket.gethostname() and report.host["kernel"] == os.uname().release
    assert report.host["glibc"] == os.confstr("CS_GNU_LIBC_VERSION")
    roots = [str(sub / "libA.so"), str(sub / "libB.so")]
    assert progress.calls == [("start", 2, "checking"), ("advance", 1, roots[0]), ("advance", 1, roots[1]),
                              ("finish",)]
    assert report.stats["elf_objects"] == 2
    scanner = Scanner(CheckOptions(targets=[str(sub)]))
    seen = []
    scanner.on_closure = lambda root, result, runtimes: seen.append((root, result.root, runtimes))
    scanner.run()
    assert seen == [(roots[0], roots[0], {}), (roots[1], roots[1], {})]
    # the _Null progress of a scan without one
    null = scan._Null()
    assert (null.start(3), null.advance(), null.finish()) == (None, None, None)


def test_host_targets(monkeypatch, tmp_path):
    """The host scope's roots: every ELF file ld.so.cache lists (`ldconfig -p` as the
    oracle), the CUDA library directories, and the YAML files of the config directories."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    cfg = tmp_path / "cfg" / "seedance"
    (cfg / "plugins" / "p").mkdir(parents=True)
    write(cfg / "agent.yaml", "a: 1\n")
    write(cfg / "plugins" / "p" / "manifest.yml", "b: 2\n")
    write(cfg / "notes.txt", "c\n")
    proc = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, errors="replace")
    if proc.returncode != 0:
        pytest.skip("ldconfig -p does not run here")
    listed = sorted({line.rsplit(" => ", 1)[1].strip() for line in proc.stdout.splitlines() if " => " in line})
    elf = []
    for path in listed:
        try:
            with open(path, "rb") as handle:
                if handle.read(4) == b"\x7fELF":
                    elf.append(path)
        except OSError:
            pass
    scanner = ready(CheckOptions())
    scanner.dir_configs = ["left over from a target walk"]
    roots, configs = scanner._host_targets()
    assert scanner.dir_configs == []
    assert configs == [str(cfg / "agent.yaml"), str(cfg / "plugins" / "p" / "manifest.yml")]
    paths = [path for path, _st in roots]
    assert paths[:len(elf)] == elf  # the cache's files first, in its sorted order
    for path, st in roots[:len(elf)]:
        assert (st.st_ino, st.st_dev) == (os.stat(path).st_ino, os.stat(path).st_dev)
    missing = [path for path in listed if not os.path.exists(path)]
    # every name the cache lists, and every file os.walk lists under the CUDA library dirs
    from seedance.collect import host
    walked = sum(len(files) for directory in host.cuda_library_dirs()
                 for _base, _dirs, files in os.walk(directory, followlinks=False))
    assert scanner.stats["files"] == len(listed) + walked
    assert scanner.stats["skipped"] >= len(missing)
    assert scanner.stats["processes"] >= 1  # this process at least


def test_interpreter_for_extension_modules(tmp_path):
    minor = sys.version_info.minor
    mine = os.path.realpath(sys.executable)
    prefix = tmp_path / "env"
    site = prefix / "lib" / f"python3.{minor}" / "site-packages"
    (site / "pkg").mkdir(parents=True)
    (prefix / "bin").mkdir()
    shutil.copyfile("/bin/true", prefix / "bin" / f"python3.{minor}")  # an ELF file: the env's interpreter
    tag = f".cpython-3{minor}-x86_64-linux-gnu.so"
    assert scan._interpreter_for(str(site / "pkg" / ("m" + tag))) == str(prefix / "bin" / f"python3.{minor}")
    assert scan._interpreter_for(str(site / "pkg" / "_untagged.so")) == str(prefix / "bin" / f"python3.{minor}")
    assert scan._interpreter_for(str(site / "pkg" / "sub" / "libhelper.so.1")) == str(
        prefix / "bin" / f"python3.{minor}")
    # outside any site-packages: this interpreter for its own minor version, an abi3 module too
    assert scan._interpreter_for(str(tmp_path / ("m" + tag))) == mine
    assert scan._interpreter_for(str(tmp_path / "m.abi3.so")) == mine
    # a minor version no interpreter here has
    assert scan._interpreter_for(str(tmp_path / "m.cpython-399-x86_64-linux-gnu.so")) is None
    other = tmp_path / "o" / "lib" / "python3.99" / "site-packages"
    other.mkdir(parents=True)
    (tmp_path / "o" / "bin").mkdir()
    os.symlink("/bin/true", tmp_path / "o" / "bin" / "python3.99")  # the link is resolved
    assert scan._interpreter_for(str(other / "m.cpython-399-x86_64-linux-gnu.so")) == os.path.realpath("/bin/true")
    assert scan._interpreter_for(str(other / "x" / "_plain.so")) == os.path.realpath("/bin/true")
    # an interpreter that is not an ELF file is passed over
    text = tmp_path / "t" / "lib" / f"python3.{minor}" / "site-packages"
    text.mkdir(parents=True)
    (tmp_path / "t" / "bin").mkdir()
    write(tmp_path / "t" / "bin" / f"python3.{minor}", "#!/bin/sh\n")
    assert scan._interpreter_for(str(text / ("m" + tag))) == mine
    # a site-packages whose path names no python3.X: this interpreter's minor version
    bare = tmp_path / "b" / "x" / "y" / "site-packages"
    bare.mkdir(parents=True)
    (tmp_path / "b" / "bin").mkdir()
    shutil.copyfile("/bin/true", tmp_path / "b" / "bin" / f"python3.{minor}")
    assert scan._interpreter_for(str(bare / "z.so")) == str(tmp_path / "b" / "bin" / f"python3.{minor}")
    # not an extension module at all
    assert scan._interpreter_for(str(tmp_path / "libplain.so")) is None
    assert scan._interpreter_for(str(tmp_path / "auto" / "Mod" / "Mod.txt")) is None
    perl = next((p for p in ("/usr/bin/perl", "/usr/local/bin/perl") if os.path.isfile(p)), None)
    expected = os.path.realpath(perl) if perl else None
    assert scan._interpreter_for(str(tmp_path / "auto" / "Mod" / "Mod.so")) == expected


@pytest.fixture(scope="module")
def isa_lib(tmp_path_factory):
    root = tmp_path_factory.mktemp("isa")
    write(root / "v4.c", "int v4(void){return 4;}\n")
    cc("-shared", "-fPIC", root / "v4.c", "-o", root / "libv4.so", "-Wl,-z,x86-64-v4")
    # and a second marked object that NEEDs the first: two marked objects in one closure
    cc("-shared", "-fPIC", root / "v4.c", "-o", root / "libv4b.so", "-Wl,-z,x86-64-v4", "-Wl,--no-as-needed",
       f"-L{root}", "-lv4", "-Wl,-rpath,$ORIGIN")
    for lib in ("libv4.so", "libv4b.so"):
        out = subprocess.run(["readelf", "-n", str(root / lib)], capture_output=True, text=True, errors="replace")
        if "x86 ISA needed: x86-64-v4" not in out.stdout:
            pytest.skip("this linker does not mark an x86-64-v4 ISA level")
    return root / "libv4.so"


def test_an_object_needing_an_isa_level_this_cpu_lacks(isa_lib):
    levels = ld_so_hwcaps_levels()
    if not levels or "supported" in levels.get("x86-64-v4", ()):
        pytest.skip("this CPU runs x86-64-v4 code, or ld.so --help lists no levels")
    py = subprocess.run([sys.executable, "-c", "import ctypes, os, sys\ntry:\n    ctypes.CDLL(sys.argv[1])\n"
                         "except OSError as e:\n    print(e)\n", str(isa_lib)], capture_output=True, text=True)
    assert "CPU ISA level is lower than required" in py.stdout  # ld.so refuses it
    supported = [level for level in ("x86-64-v2", "x86-64-v3", "x86-64-v4") if "supported" in levels.get(level, ())]
    scanner = Scanner(CheckOptions(targets=[str(isa_lib), str(isa_lib.parent)]))
    scanner.run()
    facts = facts_of(scanner, "cpu_isa")
    second = isa_lib.parent / "libv4b.so"
    # one fact per marked object, at the first root (by name) whose closure holds it
    assert [(f.subject["path"], f.data["loaded_by"]) for f in facts] == [(str(isa_lib), str(isa_lib)),
                                                                         (str(second), str(second))]
    assert facts[0].data == {"needed": ["x86-64-v4"], "highest_needed": "x86-64-v4",
                             "cpu_levels": supported or ["baseline"], "cpu_highest": (supported or ["baseline"])[-1],
                             "lacking": ["x86-64-v4"], "loaded_by": str(isa_lib),
                             "loader_message": "CPU ISA level is lower than required"}
    assert facts[0].source == "collect.scan"
    alone = Scanner(CheckOptions(targets=[str(second)]))
    alone.run()
    assert [f.subject["path"] for f in facts_of(alone, "cpu_isa")] == [str(second), str(isa_lib)]
    # objects without a marking (libc) give no fact; the same object again is not read again
    scanner._isa_cpu = None
    from seedance.resolve import Resolver
    result = Resolver(env={}).closure(str(isa_lib))
    assert scanner._isa_facts(str(isa_lib), result) == []
    assert len(scanner._isa_seen) >= 1


def dpkg_owner(path) -> str | None:
    proc = subprocess.run(["dpkg-query", "-S", str(path)], capture_output=True, text=True, errors="replace")
    if proc.returncode != 0 or ":" not in proc.stdout:
        return None
    return proc.stdout.split(":", 1)[0].split(",")[0].strip()


def test_a_private_library_of_a_debian_program():
    """systemd's libsystemd-core NEEDs libsystemd-shared, which only systemd's own DT_RUNPATH
    finds: dpkg says who ships and who loads it, ld.so how the program finds it."""
    from elftools.elf.elffile import ELFFile

    cores = sorted(glob.glob("/usr/lib/x86_64-linux-gnu/systemd/libsystemd-core-*.so"))
    if not cores or shutil.which("dpkg-query") is None:
        pytest.skip("no Debian systemd here")
    core = cores[0]
    shared_name = os.path.basename(core).replace("core", "shared")
    shared = os.path.join(os.path.dirname(core), shared_name)
    package = dpkg_owner(core)
    if package is None or not os.path.exists(shared):
        pytest.skip("libsystemd-core is not a dpkg-owned file here")
    scanner = Scanner(CheckOptions(targets=[core]))
    scanner.run()
    [fact] = [f for f in facts_of(scanner, "needed", core) if f.data["name"] == shared_name]
    loader = fact.data["loader"]
    assert fact.data["context"] == "private" and not fact.data["resolved"]
    # the program: a file of a package depending on the library's, that NEEDs libsystemd-core
    # and whose DT_RUNPATH holds libsystemd-shared
    with open(loader, "rb") as handle:
        dynamic = ELFFile(handle).get_section_by_name(".dynamic")
        tags = [(t.entry.d_tag, getattr(t, "needed", None) or getattr(t, "runpath", None)) for t in dynamic.iter_tags()]
    assert ("DT_NEEDED", os.path.basename(core)) in tags
    assert ("DT_RUNPATH", os.path.dirname(shared)) in tags
    owner = dpkg_owner(loader)
    assert owner is not None
    # ld.so in trace mode: the program loads libsystemd-shared itself, and the copy it loaded
    # serves libsystemd-core's NEEDED (looked for once)
    trace = subprocess.run([loader], capture_output=True, env={"LD_TRACE_LOADED_OBJECTS": "1", "LD_DEBUG": "files",
                                                               "PATH": "/usr/bin:/bin"}, timeout=60)
    debug = trace.stderr.decode("utf-8", "replace")
    assert f"file={shared_name} [0];  needed by {loader} [0]" in debug
    assert debug.count(f"file={shared_name} [0];  needed by") == 1
    assert fact.data["reason"] == (f"{core} is a private library of {loader} (package {owner}), which finds "
                                   f"{shared_name} at {shared} through the copy it loads itself")
    assert scanner._private[(core, shared_name)] == (loader, fact.data["reason"])
    assert scanner._private_loader(core, shared_name) == (loader, fact.data["reason"])  # remembered


def test_no_private_loader_outside_dpkg(tree, tmp_path):
    scanner = ready()
    broken = str(tree["libbroken.so"])
    assert dpkg_owner(broken) is None
    assert scanner._private_loader(broken, "libgone.so.1") is None
    assert scanner._private == {(broken, "libgone.so.1"): None}
    assert scanner._private_loader(str(tmp_path / "nope.so"), "x.so") is None


@pytest.fixture(scope="module")
def cuda_user(tmp_path_factory):
    root = tmp_path_factory.mktemp("cudauser")
    write(root / "c.c", "int cuInit(unsigned f){return 0;}\n")
    cc("-shared", "-fPIC", root / "c.c", "-o", root / "libcuda.so.1", "-Wl,-soname,libcuda.so.1")
    write(root / "u.c", "int cuInit(unsigned);\nint u(void){return cuInit(0);}\n")
    (root / "tree").mkdir()
    cc("-shared", "-fPIC", root / "u.c", "-o", root / "tree" / "libcudauser.so", f"-L{root}", "-l:libcuda.so.1")
    (root / "libcuda.so.1").unlink()
    return root / "tree" / "libcudauser.so"


def test_a_driver_library_on_a_host_without_the_driver(cuda_user):
    cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, errors="replace").stdout
    if "libcuda.so.1 " in cache or any(os.path.exists(os.path.join(d, "libcuda.so.1")) for d in (
            "/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/lib/wsl/lib")):
        pytest.skip("this host has the NVIDIA driver")
    scanner = Scanner(CheckOptions(targets=[str(cuda_user)]))
    scanner.run()
    [fact] = [f for f in facts_of(scanner, "needed", cuda_user) if f.data["name"] == "libcuda.so.1"]
    assert fact.data["context"] == "no-driver" and fact.data["resolved"] is False
    assert fact.data["reason"].startswith("libcuda.so.1 is installed by the NVIDIA driver")
    assert (fact.data["installed_at"], fact.data["where"], fact.data["loader"]) == ([], "", "")


# --------------------------------------------------------------------------------------------
# fatbin facts on device code nvcc built (collect/fatbin.py through scan._fatbin)
# --------------------------------------------------------------------------------------------

NVCC = "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else shutil.which("nvcc")
OBJCOPY = shutil.which("objcopy")
# one translation unit each, and its nvcc -gencode: module 0, 1, 2 in that order
DEVICE_TUS = {
    "a": ('extern "C" __global__ void kern_alpha(float *x) { x[threadIdx.x] += 1.0f; }\n',
          "arch=compute_90,code=[sm_90,compute_90]"),
    # ten kernels: more than a finding names
    "b": ('extern "C" __global__ void kern_beta(float *x) { x[threadIdx.x] *= 2.0f; }\n'
          'extern "C" __global__ void kern_gamma(int *x) { x[threadIdx.x] -= 3; }\n'
          + "".join(f'extern "C" __global__ void kern_k{n}(int *x) {{ x[threadIdx.x] += {n}; }}\n' for n in range(8)),
          "arch=compute_80,code=sm_80"),
    "c": ("__device__ int only_a_variable;\n", "arch=compute_75,code=sm_75"),  # no kernel: a module of variables
}


def cuobjdump() -> str | None:
    found = glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "cu*", "bin", "cuobjdump"))
    return found[0] if found else shutil.which("cuobjdump")


@pytest.fixture(scope="module")
def fat(tmp_path_factory):
    if NVCC is None or OBJCOPY is None:
        pytest.skip("nvcc or objcopy not installed")
    root = tmp_path_factory.mktemp("fat")
    procs = []
    for name, (source, gencode) in DEVICE_TUS.items():
        write(root / f"{name}.cu", source)
        procs.append(subprocess.Popen([NVCC, "-fatbin", "-gencode", gencode, str(root / f"{name}.cu"),
                                       "-o", str(root / f"{name}.fatbin")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    for proc in procs:
        if proc.wait() != 0:
            pytest.skip(f"nvcc -fatbin failed: {proc.stderr.read()[:200]!r}")
    write(root / "h.c", "int host_side(void){return 0;}\n")
    libs = {}
    (root / "tree").mkdir()
    # a host object whose .nv_fatbin holds the containers one after another, as the linker
    # concatenates them (one runtime module each)
    for lib, parts in (("libabc.so", "abc"), ("libac.so", "ac"), ("liba.so", "a")):
        blob = root / f"{parts}.fatbin"
        blob.write_bytes(b"".join((root / f"{p}.fatbin").read_bytes() for p in parts))
        out = root / "tree" / lib
        cc("-shared", "-fPIC", root / "h.c", "-o", out)
        subprocess.run([OBJCOPY, "--add-section", f".nv_fatbin={blob}", "--set-section-flags",
                        ".nv_fatbin=alloc,readonly", str(out)], check=True, capture_output=True)
        libs[lib] = str(out)
    libs["tree"] = root / "tree"
    return libs


def inventory(path) -> tuple:
    """(SASS names, PTX names, PTX ISA versions) of ``path`` as NVIDIA's cuobjdump lists them."""
    tool = cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not installed")
    elf = subprocess.run([tool, "--list-elf", path], capture_output=True, text=True, errors="replace").stdout
    ptx = subprocess.run([tool, "--list-ptx", path], capture_output=True, text=True, errors="replace").stdout
    text = subprocess.run([tool, "-ptx", path], capture_output=True, text=True, errors="replace").stdout
    sass = sorted(set(re.findall(r"\.(sm_\d+[af]?)\.cubin", elf)))
    ptx_names = sorted({"compute_" + a for a in re.findall(r"\.sm_(\d+[af]?)\.ptx", ptx)})
    isas = sorted(set(re.findall(r"^\s*\.version\s+(\d+\.\d+)", text, re.M)))
    return sass, ptx_names, isas


def test_fatbin_facts_of_three_modules_in_one_object(fat):
    sass, ptx, isas = inventory(fat["libabc.so"])
    assert (sass, ptx) == (["sm_75", "sm_80", "sm_90"], ["compute_90"])
    scanner = Scanner(CheckOptions(targets=[fat["libabc.so"]], arch="sm_90"))
    scanner.run()
    facts = facts_of(scanner, "fatbin")
    assert len(facts) == 1 and facts[0].subject == {"path": fat["libabc.so"]} and facts[0].source == "collect.fatbin"
    data = dict(facts[0].data)
    assert data.pop("compressed") in (True, False)
    assert data == {"target": "sm_90", "target_num": 90, "target_source": "--arch", "sass": sass, "ptx": ptx,
                    "ptx_isa": isas, "modules": 3, "modules_without_code": 2, "failing_modules": [1],
                    # ten kernels in module 1, the first eight by name named
                    "kernels": ["kern_beta", "kern_gamma"] + [f"kern_k{n}" for n in range(6)], "kernel_count": 10,
                    "ptx_too_new": False, "dispatch": 0,
                    "runnable": False, "why": "no SASS for this arch and no PTX that JITs to it"}
    assert facts_of(scanner, "fatbin_ptx") == []  # no driver given
    # sm_86: sm_80 SASS runs there (binary compatible), the sm_90 module does not
    on86 = fatbin_mod.fatbin_facts(fat["libabc.so"], read_fatbin(fat["libabc.so"]), [fatbin_mod.parse_target("sm_86")])
    assert (on86[0].data["failing_modules"], on86[0].data["kernels"], on86[0].data["runnable"]) == (
        [0], ["kern_alpha"], False)
    on75 = fatbin_mod.judge(fat["libabc.so"], read_fatbin(fat["libabc.so"]), 75)
    assert on75 == {"modules": 3, "modules_without_code": 2, "failing_modules": [0, 1],
                    "kernels": ["kern_alpha", "kern_beta", "kern_gamma"] + [f"kern_k{n}" for n in range(5)],
                    "kernel_count": 11, "ptx_too_new": False,
                    "dispatch": 0, "runnable": False, "why": "no SASS for this arch and no PTX that JITs to it"}


def read_fatbin(path):
    from seedance.elf.reader import read_elf
    return read_elf(path, fatbin=True).fatbin


def test_a_module_of_variables_only_is_no_evidence(fat):
    entries = read_fatbin(fat["libac.so"])
    assert fatbin_mod.judge(fat["libac.so"], entries, 90) == {
        "modules": 2, "modules_without_code": 1, "failing_modules": [], "kernels": [], "kernel_count": 0,
        "ptx_too_new": False, "dispatch": 0, "runnable": True,
        "why": "the 1 module(s) without code for this GPU hold no kernel (device-link stub or device variables)"}


def test_ptx_too_new_for_the_driver(fat):
    """compute_90 PTX from CUDA 13 is ISA 9.0 (cuobjdump -ptx's .version); a CUDA 12.4 driver
    JITs up to ISA 8.4 (NVIDIA's PTX ISA release table)."""
    _sass, _ptx, isas = inventory(fat["libac.so"])
    if isas != ["9.0"]:
        pytest.skip(f"this nvcc writes PTX ISA {isas}")
    scanner = Scanner(CheckOptions(targets=[str(fat["tree"])], arch="sm_100", driver_version="12.4"))
    scanner.run()
    facts = {(f.kind, f.subject["path"]): f.data for f in scanner.facts if f.kind.startswith("fatbin")}
    assert sorted(facts) == sorted([(kind, fat[lib]) for kind in ("fatbin", "fatbin_ptx")
                                    for lib in ("liba.so", "libabc.so", "libac.so")
                                    if not (lib == "libabc.so" and kind == "fatbin_ptx")])
    jit = dict(facts[("fatbin_ptx", fat["libac.so"])])
    common = {"target": "sm_100", "target_num": 100, "target_source": "--arch", "sass": ["sm_75", "sm_90"],
              "ptx": ["compute_90"], "ptx_isa": ["9.0"]}
    assert jit.pop("compressed") in (True, False)
    assert jit.pop("why").startswith("PTX compute_90 is ISA 9.0, which needs a driver for")
    assert jit == {**common, "jit_ok": False, "kernels": ["kern_alpha"], "kernel_count": 1,
                   "driver": "a driver for CUDA 12.4", "ptx_isa_max": "8.4"}
    by_arch = facts[("fatbin", fat["libac.so"])]
    assert (by_arch["runnable"], by_arch["dispatch"], by_arch["modules"]) == (True, 0, 2)
    assert facts[("fatbin", fat["libabc.so"])]["runnable"] is False
    # the same PTX with a CUDA 13.0 driver JITs
    ok = fatbin_mod.fatbin_facts(fat["liba.so"], read_fatbin(fat["liba.so"]), [fatbin_mod.parse_target("sm_100")],
                                 driver="13.0")
    assert [(f.kind, f.data["why"]) for f in ok] == [("fatbin", "PTX compute_90 JIT"), ("fatbin_ptx", "PTX compute_90 JIT")]
    assert (ok[1].data["jit_ok"], ok[1].data["ptx_isa_max"], ok[1].data["kernel_count"]) == (True, "9.0", 0)


def test_first_why_names_the_image_chosen(fat):
    entries = read_fatbin(fat["liba.so"])
    assert fatbin_mod.judge(fat["liba.so"], entries, 90) == {
        "modules": 1, "modules_without_code": 0, "failing_modules": [], "kernels": [], "kernel_count": 0,
        "ptx_too_new": False, "dispatch": 0, "runnable": True, "why": "SASS sm_90"}
    assert fatbin_mod.judge(fat["liba.so"], entries, 120)["why"] == "PTX compute_90 JIT"
    import dataclasses
    # a second module holding only the PTX: two reasons, sorted, joined
    two = list(entries) + [dataclasses.replace(e, module=1) for e in entries if e.kind == "ptx"]
    assert fatbin_mod.judge(fat["liba.so"], two, 90)["why"] == "PTX compute_90 JIT; SASS sm_90"
    assert fatbin_mod.judge(fat["liba.so"], two, 100)["why"] == "PTX compute_90 JIT"


# --------------------------------------------------------------------------------------------
# what packages load before an object: torch for its extensions, the NVIDIA wheels
# --------------------------------------------------------------------------------------------

def real_torch_lib() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("torch")  # where pip put it, without importing it
    if spec is None or spec.origin is None:
        return None
    lib = Path(spec.origin).parent / "lib"
    return lib if (lib / "libc10.so").exists() and (lib / "libtorch_python.so").exists() else None


@pytest.fixture(scope="module")
def torch_ext(tmp_path_factory):
    lib = real_torch_lib()
    if lib is None:
        pytest.skip("the torch wheel is not installed in this interpreter")
    root = tmp_path_factory.mktemp("torchext")
    # a c10 function no torch defines (the name is made up here)
    write(root / "x.c", f'extern int absent(void) __asm__("{ABSENT_C10}");\nint x(void){{return absent();}}\n')
    out = root / ("ext" + EXT_SUFFIX)
    cc("-shared", "-fPIC", root / "x.c", "-o", out, "-Wl,--no-as-needed", f"-L{lib}", "-lc10")
    (root / "own").mkdir()  # the same, finding torch through its own DT_RUNPATH
    cc("-shared", "-fPIC", root / "x.c", "-o", root / "own" / ("ext" + EXT_SUFFIX), "-Wl,--no-as-needed",
       f"-L{lib}", "-lc10", f"-Wl,-rpath,{lib}")
    return out, lib


ABSENT_C10 = "_ZN3c1024seedance_absent_for_testEv"


def torch_version() -> str:
    from importlib.metadata import version
    return version("torch")  # what pip recorded for the wheel


def test_a_torch_extension_without_a_torch(torch_ext):
    ext, _lib = torch_ext
    assert "libc10.so: cannot open shared object file" in python_dlopen_error(ext)
    scanner = Scanner(CheckOptions(targets=[str(ext)]))
    scanner.run()
    [env] = facts_of(scanner, "torch_env")
    assert (env.subject, env.data) == ({"path": str(ext)}, {"found": False, "needs": ["libc10.so"]})
    # the torch NEEDED stands in as a preload: no needed fact, no loader error
    assert sorted(f.data["name"] for f in facts_of(scanner, "needed", ext)) == ["libc.so.6"]
    from seedance.resolve import Resolver
    result = Resolver(env={}).closure(str(ext))
    fresh = ready()
    assert fresh._preloads(str(ext), result) == (("libc10.so",), {})
    assert fresh._torch_lib_near(str(ext)) is None and fresh._torch_for(str(ext)) is None


def test_a_torch_extension_judged_against_the_torch_of_python(torch_ext):
    ext, lib = torch_ext
    scanner = Scanner(CheckOptions(targets=[str(ext)], python=sys.executable))
    scanner.run()
    assert facts_of(scanner, "torch_env") == []
    needed = {f.data["name"]: f.data for f in facts_of(scanner, "needed", ext)}
    assert sorted(needed) == ["libc.so.6", "libc10.so"]
    assert (needed["libc10.so"]["resolved_path"], needed["libc10.so"]["source"]) == (str(lib / "libc10.so"), "loaded")
    # `import torch` loaded libtorch_python.so and its whole closure first
    assert list(scanner.torch_preloads) == [str(lib / "libtorch_python.so")]
    preloaded = scanner.torch_preloads[str(lib / "libtorch_python.so")]
    assert str(lib / "libtorch_python.so") in preloaded and str(lib / "libc10.so") in preloaded
    assert str(lib / "libtorch_cpu.so") in preloaded
    assert scanner._torch_lib_near(str(ext)) == str(lib)
    # the c10 function nothing defines: named, against the torch --python imports
    [missing] = facts_of(scanner, "torch_symbols", ext)
    data = dict(missing.data)
    assert data.pop("fix_command").startswith(f"rebuild {ext.name} ")
    assert data == {"count": 1, "examples": [ABSENT_C10], "torch_version": torch_version(),
                    "torch_path": str(lib.parent), "torch_source": f"--python {sys.executable}",
                    "explained_by_abi": False}
    from seedance.resolve import Resolver
    result = Resolver(env={}).closure(str(ext))
    preload, plan = scanner._preloads(str(ext), result)
    assert preload == preloaded and plan == {}


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory):
    """A site-packages laid out as pip lays out torch and an NVIDIA wheel: torch/lib/libtd.so
    NEEDs libdemo.so.1, which only site-packages/nvidia/demo/lib holds."""
    root = tmp_path_factory.mktemp("wheelsite")
    site = root / "lib" / f"python3.{sys.version_info.minor}" / "site-packages"
    (site / "nvidia" / "demo" / "lib").mkdir(parents=True)
    (site / "torch" / "lib").mkdir(parents=True)
    write(root / "d.c", "int demo(void){return 1;}\n")
    provider = site / "nvidia" / "demo" / "lib" / "libdemo.so.1"
    cc("-shared", "-fPIC", root / "d.c", "-o", provider, "-Wl,-soname,libdemo.so.1")
    write(root / "t.c", "int demo(void);\nint nowhere_td(void);\nint td(void){return demo() + nowhere_td();}\n")
    user = site / "torch" / "lib" / "libtd.so"
    cc("-shared", "-fPIC", root / "t.c", "-o", user, f"-L{provider.parent}", "-l:libdemo.so.1")
    return site, user, provider


def test_a_library_an_nvidia_wheel_provides_through_torchs_preload(wheel_site, tree):
    site, user, provider = wheel_site
    assert "libdemo.so.1: cannot open shared object file" in dlopen_error(tree["dl"], user)
    scanner = Scanner(CheckOptions(targets=[str(user)]))
    scanner.run()
    [fact] = [f for f in facts_of(scanner, "needed", user) if f.data["name"] == "libdemo.so.1"]
    assert (fact.data["resolved"], fact.data["resolved_path"], fact.data["source"]) == (True, str(provider), "loaded")
    assert (fact.data["context"], fact.data["package"]) == ("preloaded", "")
    assert fact.data["reason"] == ("torch/__init__.py _load_global_deps() loads "
                                   "site-packages/nvidia/demo/lib/libdemo.so.1 RTLD_GLOBAL before its own libraries")
    from seedance.resolve import Resolver
    result = Resolver(env={}).closure(str(user))
    preload, plan = ready()._preloads(str(user), result)
    assert preload == (str(provider),) and plan == {str(provider): (fact.data["reason"], "")}
    # strict: the preloaded provider's symbols are in scope, so only nowhere_td is missing
    env = {"PATH": "/usr/bin:/bin", "LD_PRELOAD": str(provider)}
    loaded = subprocess.run([str(tree["dl"]), str(user)], capture_output=True, env=env)
    assert b"undefined symbol: nowhere_td" in loaded.stdout
    strict = Scanner(CheckOptions(targets=[str(user)], strict=True))
    strict.run()
    assert [f.data["symbol"] for f in facts_of(strict, "undefined_symbol", user)] == ["nowhere_td"]


@pytest.fixture(scope="module")
def two_runtimes(tmp_path_factory):
    try:
        import nvidia.cuda_runtime as rt
    except ImportError:
        pytest.skip("nvidia-cuda-runtime-cu12 wheel not installed")
    cu12 = Path(list(rt.__path__)[0]) / "lib" / "libcudart.so.12"
    cu13 = Path("/usr/local/cuda/lib64/libcudart.so.13")
    if not (cu12.exists() and cu13.exists()):
        pytest.skip("libcudart.so.12 (wheel) and libcudart.so.13 (/usr/local/cuda) both needed")
    root = tmp_path_factory.mktemp("runtimes")
    (root / "tree").mkdir()
    write(root / "m.c", "int m(void){return 0;}\n")
    for name in ("libmix_b.so", "libmix_a.so"):
        cc("-shared", "-fPIC", root / "m.c", "-o", root / "tree" / name, "-Wl,--no-as-needed",
           f"-L{cu12.parent}", f"-L{cu13.parent}", "-l:libcudart.so.12", "-l:libcudart.so.13",
           f"-Wl,-rpath,{cu12.parent}:{cu13.parent}")
    write(root / "app.c", "int main(void){return 0;}\n")
    cc(root / "app.c", "-o", root / "tree" / "app", "-Wl,--no-as-needed", f"-L{root / 'tree'}", "-l:libmix_a.so",
       "-Wl,-rpath,$ORIGIN")
    # a program that NEEDs the CUDA 12 runtime itself and through libmix_a.so
    (root / "both").mkdir()
    cc(root / "app.c", "-o", root / "both" / "app", "-Wl,--no-as-needed", f"-L{cu12.parent}", "-l:libcudart.so.12",
       f"-L{root / 'tree'}", "-l:libmix_a.so", f"-Wl,-rpath,{cu12.parent}:{root / 'tree'}")
    # a libcudart.so.12 of our own that loads the CUDA 13 runtime (a forwarding shim)
    (root / "shim").mkdir()
    cc("-shared", "-fPIC", root / "m.c", "-o", root / "shim" / "libcudart.so.12", "-Wl,-soname,libcudart.so.12",
       "-Wl,--no-as-needed", f"-L{cu13.parent}", "-l:libcudart.so.13", f"-Wl,-rpath,{cu13.parent}")
    return root / "tree", str(cu12), str(cu13)


def test_two_cuda_runtimes_in_one_closure(two_runtimes):
    tree_dir, cu12, cu13 = two_runtimes
    from elftools.elf.elffile import ELFFile

    for path, soname in ((cu12, "libcudart.so.12"), (cu13, "libcudart.so.13")):
        with open(path, "rb") as handle:
            tags = {t.entry.d_tag: getattr(t, "soname", None) for t in ELFFile(handle).get_section_by_name(
                ".dynamic").iter_tags()}
        assert tags["DT_SONAME"] == soname
    mapped = ldd_paths(tree_dir / "app")
    assert os.path.realpath(cu12) in map(os.path.realpath, mapped)
    assert os.path.realpath(cu13) in map(os.path.realpath, mapped)
    scanner = Scanner(CheckOptions(targets=[str(tree_dir)], driver_version="470.256.02"))
    report = scanner.run()
    mixes = facts_of(scanner, "cuda_runtimes")
    # reported once, at the smallest closure holding both (the first by name of two equal ones)
    assert [(f.subject, f.data, f.source) for f in mixes] == [
        ({"path": str(tree_dir / "libmix_a.so")}, {"majors": [12, 13], "paths": sorted([cu12, cu13]),
                                                   "via": "closure"}, "collect.closure")]
    drivers = sorted((f.subject["path"], f.data["runtime_major"], f.data["runtime_path"])
                     for f in facts_of(scanner, "cuda_driver"))
    # one per (object that NEEDs a runtime, runtime), the app's closure adding none
    assert drivers == sorted((str(tree_dir / lib), major, path) for lib in ("libmix_a.so", "libmix_b.so")
                             for major, path in ((12, cu12), (13, cu13)))
    for fact in facts_of(scanner, "cuda_driver"):
        assert fact.data["driver_version"] == "470.256.02" and fact.data["driver_source"] == "--driver-version"
    assert report.stats["facts_by_kind"]["cuda_runtimes"] == 1
    # without a driver version: no driver fact
    quiet = Scanner(CheckOptions(targets=[str(tree_dir)]))
    quiet.run()
    if quiet.gpu.driver_version is None:
        assert facts_of(quiet, "cuda_driver") == []
    runtimes = closure_mod.closure_runtimes(scanner.resolver.closure(str(tree_dir / "app")))
    assert runtimes == {cu12: (12, str(tree_dir / "libmix_a.so")), cu13: (13, str(tree_dir / "libmix_a.so"))}
    # a runtime checked as a root loads itself: it needs no driver by itself
    assert closure_mod.closure_runtimes(scanner.resolver.closure(cu12)) == {cu12: (12, cu12)}
    alone = Scanner(CheckOptions(targets=[cu12], driver_version="470.256.02"))
    alone.run()
    assert facts_of(alone, "cuda_driver") == []
    # a runtime NEEDed twice in one closure: its requester is the object ld.so loaded it for
    both = str(tree_dir.parent / "both" / "app")
    trace = subprocess.run([both], capture_output=True, timeout=60,
                           env={"LD_TRACE_LOADED_OBJECTS": "1", "LD_DEBUG": "files", "PATH": "/usr/bin:/bin"})
    debug = trace.stderr.decode("utf-8", "replace")
    assert f"file=libcudart.so.12 [0];  needed by {both} [0]" in debug
    assert f"file=libcudart.so.13 [0];  needed by {tree_dir / 'libmix_a.so'} [0]" in debug
    assert closure_mod.closure_runtimes(scanner.resolver.closure(both)) == {
        cu12: (12, both), cu13: (13, str(tree_dir / "libmix_a.so"))}
    # ... but the runtime it loads in turn does
    shim = str(tree_dir.parent / "shim" / "libcudart.so.12")
    assert os.path.realpath(cu13) in map(os.path.realpath, ldd_paths(shim))
    forward = Scanner(CheckOptions(targets=[shim], driver_version="470.256.02"))
    forward.run()
    assert [(f.subject["path"], f.data["runtime_major"], f.data["runtime_path"])
            for f in facts_of(forward, "cuda_driver")] == [(shim, 13, cu13)]


# --------------------------------------------------------------------------------------------
# config.py: the values that feed the loader, read as a shell and ld.so read them
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, names", [
    ("$HOME/x", ["HOME"]),                # at the very start
    ("x$A", ["A"]),                       # a one-letter name at the very end
    ("x$", []), ("$", []), ("", []), ("$$", []),
    ("$A$B", ["A", "B"]),
    ("${AB}/${CD}", ["AB", "CD"]),
    ("$AB_9/x", ["AB_9"]),
    ("$$$A", ["A"]),                      # an escaped dollar, then $A
    ("$$${A}", ["A"]),
    ("x}${A}", ["A"]),                    # a brace before the reference is not its end
    ("${AB", []),                         # unclosed
    ("${}", []), ("${1A}", []), ("$1A", []),
    ("${A}$B", ["A", "B"]),
    ("${A-x}${B}", ["B"]),                # not a name; the next one is
    ("$-$A", ["A"]),
])
def test_early_references_like_a_shell(value, names):
    assert config_mod.early_references(value) == names


@pytest.mark.parametrize("key, value, use", [
    ("LD_PRELOAD", "/x", "preload"), ("ld_preload", "/x", "preload"), ("Preload", "/x", "preload"),
    ("preloads", "/x/y", "preload"), ("LD_AUDIT", "/x", "preload"), ("ld_audit", "/x", "preload"),
    ("LD_LIBRARY_PATH", "/x", "libpath"), ("ld_library_path", "/x", "libpath"),
    ("library", "/opt/x", "libpath"), ("LIBS", "/opt/x", "libpath"), ("shim_path", "/opt/x", "libpath"),
    ("my_library_path", "/opt/x", "libpath"), ("cuda_lib_path", "/opt/x", "libpath"),
    ("cuda_preload", "/opt/x", "preload"), ("CUDA_PRELOAD", "/opt/x", "preload"),
    ("x", "libfoo.so", "libpath"), ("x", "libfoo.so.1", "libpath"), ("x", "/a/libfoo.so.1.2:/b", "libpath"),
    ("x", "libfoo.so.1 more", "libpath"),
    ("x", "libfoo.sox", None), ("x", "foo.so.a", None), ("foo", "bar", None), ("env", "/opt/x", None),
])
def test_which_keys_feed_the_loader(key, value, use):
    assert config_mod.is_loader_key(key, value) == use


def config_file(tmp_path, text, name="seedance.yaml"):
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


def test_config_facts_whole(tmp_path):
    safe = tmp_path / "safe"
    safe.mkdir(mode=0o755)
    os.chmod(safe, 0o755)
    present = safe / "libok.so"
    present.write_bytes(b"x")
    os.chmod(present, 0o644)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    exposed = open_dir / "libbad.so"
    exposed.write_bytes(b"x")
    os.chmod(exposed, 0o644)
    gone1, gone2 = tmp_path / "nope1.so", tmp_path / "nope2.so"
    path = config_file(tmp_path, (
        "env:\n"
        f"  LD_PRELOAD: libbare.so:{gone1}:{gone2}\n"                       # line 2
        f"  LD_AUDIT: {present} {exposed}\n"                                # line 3
        "  LD_LIBRARY_PATH: ${A}/lib:$B/lib:$${C}\n"                       # line 4
        "items: [\"LD_PRELOAD=$HOME/x.so\", \"ld_preload=/opt/y.so\", \"FOO=/opt/z.so\", \"BAR=1\"]\n"  # line 5
        "lazy:\n"
        "  ld_preload: $${HOME}/lib/x.so\n"                                    # line 7
        "list:\n"
        "  preload:\n"
        f"    - {present}\n"                                                  # line 10
        "    - ${HOME}/y.so\n"                                                # line 11
        "? [a, b]\n"
        ": /opt/libkeyless.so\n"
        "other: 5\n"))
    facts = config_mod.config_facts(path)
    assert all(f.kind == "config_env" and f.subject == {"path": path} and f.source == "collect.config" for f in facts)
    got = [f.data for f in facts]

    def fact(key, value, line, use, problem="", names=(), missing=False, writable=False):
        return {"key": key, "value": value, "problem": problem, "line": line, "expands_early": bool(names),
                "variables": list(names), "preload_missing": missing, "preload_writable": writable, "use": use}

    lazy = " when the config is read (use the lazy form $${...})"
    assert got[0] == fact("LD_PRELOAD", f"libbare.so:{gone1}:{gone2}", 2, "preload", missing=True,
                          problem=f"preload {gone1} does not exist; preload {gone2} does not exist")
    audit = dict(got[1])
    problem = audit.pop("problem")
    assert audit == {k: v for k, v in fact("LD_AUDIT", f"{present} {exposed}", 3, "preload", writable=True).items()
                     if k != "problem"}
    assert problem.startswith("preload from an unsafe path: ") and "world-writable" in problem
    assert str(open_dir) in problem and "; " not in problem
    assert got[2] == fact("LD_LIBRARY_PATH", "${A}/lib:$B/lib:$${C}", 4, "libpath", names=["A", "B"],
                          problem="expands ${A}, ${B}" + lazy)
    assert got[3] == fact("LD_PRELOAD", "$HOME/x.so", 5, "preload", names=["HOME"], problem="expands ${HOME}" + lazy)
    assert got[4] == fact("ld_preload", "/opt/y.so", 5, "preload", missing=not os.path.exists("/opt/y.so"),
                          problem="" if os.path.exists("/opt/y.so") else "preload /opt/y.so does not exist")
    # an env item that is not the loader's: judged under its list's key, by its value
    assert got[5] == fact("items", "FOO=/opt/z.so", 5, "libpath")
    # the lazy form is expanded by the session, later: no file to look for now
    assert got[6] == fact("ld_preload", "$${HOME}/lib/x.so", 7, "preload")
    assert got[7] == fact("preload", str(present), 10, "preload")
    assert got[8] == fact("preload", "${HOME}/y.so", 11, "preload", names=["HOME"], problem="expands ${HOME}" + lazy)
    assert len(got) == 9  # the value of a key that is no scalar, and `other`, feed nothing


def test_config_facts_file_edges(tmp_path):
    assert config_mod.config_facts(config_file(tmp_path, "", "empty.yaml")) == []
    assert config_mod.config_facts(config_file(tmp_path, "# only a comment\n", "c.yaml")) == []
    # bytes that are not UTF-8 are replaced, not fatal
    [fact] = config_mod.config_facts(config_file(tmp_path, b"LD_LIBRARY_PATH: /opt/\xff/lib\n", "u.yaml"))
    assert fact.data["value"] == "/opt/\ufffd/lib"
    # only the first 4 MiB are read: a key past them is not seen, and the file is not refused
    big = config_file(tmp_path, "LD_LIBRARY_PATH: /a\n#" + "x" * (5 << 20) + "\nLD_PRELOAD: /b.so\n", "big.yaml")
    assert [f.data["key"] for f in config_mod.config_facts(big)] == ["LD_LIBRARY_PATH"]
    # a reader error has no line: the text says so without one
    bad = config_file(tmp_path, "a: \x07b\n", "ctl.yaml")
    with pytest.raises(config_mod.BadYaml) as err:
        config_mod.config_facts(bad)
    assert str(err.value).startswith(f"{bad}: not valid YAML: unacceptable character #x0007")
    # a parser error: its line, and libyaml's problem
    import yaml
    text = "a: 1\nenv: [unclosed\n"
    bad = config_file(tmp_path, text, "flow.yaml")
    try:
        yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        expected = f"{bad}: line {exc.problem_mark.line + 1} not valid YAML: {exc.problem}"
    with pytest.raises(config_mod.BadYaml) as err:
        config_mod.config_facts(bad)
    assert str(err.value) == expected and " line 3 " in expected
    # the caps (yamlio) are bad YAML too, with their own text
    deep = config_file(tmp_path, "[" * 100 + "]" * 100 + "\n", "deep.yaml")
    with pytest.raises(config_mod.BadYaml) as err:
        config_mod.config_facts(deep)
    assert str(err.value).startswith(f"{deep}:") and "nested deeper than" in str(err.value)


def test_config_nesting(tmp_path):
    import yaml

    def nested(levels):
        return "{a: " * (levels - 1) + '{LD_PRELOAD: "${HOME}/x.so"}' + "}" * (levels - 1)

    # through the file: a value 40 mappings deep is read (yamlio accepts it)
    [fact] = config_mod.config_facts(config_file(tmp_path, nested(40) + "\n", "n40.yaml"))
    assert fact.data["key"] == "LD_PRELOAD" and fact.data["line"] == 1
    # _walk's own bound, on nodes composed without the caps: 64 levels read, 65 not
    for levels, count in ((64, 1), (65, 0)):
        facts = []
        config_mod._walk("p", yaml.compose(nested(levels)), None, facts, depth=0)
        assert len(facts) == count, levels
    # sequences count as levels too (the key is inherited through them)
    for lists, count in ((63, 1), (64, 0)):
        facts = []
        config_mod._walk("p", yaml.compose("LD_PRELOAD: " + "[" * lists + "/x.so" + "]" * lists), None, facts, 0)
        assert [(f.data["key"], f.data["value"]) for f in facts] == [("LD_PRELOAD", "/x.so")] * count, lists


def test_config_files_of_a_directory(tmp_path):
    root = tmp_path / "cfg"
    deep = root / "a" / "b" / "c" / "d" / "e" / "f"
    deep.mkdir(parents=True)
    (root / "z").mkdir()
    for rel in ("x.yml", "w.yaml", "notes.txt", "a/b/c/d/e/five.yaml", "a/b/c/d/e/f/six.yaml", "z/v.yaml",
                "a/one.yml"):
        (root / rel).write_text("k: v\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "linked.yaml").write_text("k: v\n")
    os.symlink(elsewhere, root / "link")  # a linked directory is not followed
    assert config_mod.config_files(str(root)) == [
        str(root / "w.yaml"), str(root / "x.yml"), str(root / "a" / "one.yml"),
        str(root / "a" / "b" / "c" / "d" / "e" / "five.yaml"), str(root / "z" / "v.yaml")]


def hand_entry(kind, arch, variant="", module=0, isa=()):
    from seedance.elf.fatbin import FatbinEntry
    return FatbinEntry(kind, arch, variant, False, 100, module=module, isa=isa)


def test_per_architecture_dispatch_verdict(tmp_path):
    """cuBLAS's shape (hand-built entries, no file: every module is judged as holding kernels)."""
    generic = [hand_entry("sass", a, module=0) for a in (50, 60, 70, 75, 80, 90, 100, 120)] + [
        hand_entry("ptx", 120, module=0)]
    lib = generic + [hand_entry("sass", 80, module=1), hand_entry("sass", 61, module=2)]
    verdict = fatbin_mod.judge(str(tmp_path / "none.so"), lib, 90)
    assert verdict == {"modules": 3, "modules_without_code": 2, "failing_modules": [], "kernels": [],
                       "kernel_count": 0, "ptx_too_new": False, "dispatch": 2, "runnable": True,
                       "why": "2 module(s) without code for this GPU serve other GPUs that modules which run here "
                              "also serve (per-architecture dispatch)"}
    # both at once: one module served elsewhere, one for a GPU nothing here serves
    both = generic + [hand_entry("sass", 80, module=1), hand_entry("sass", 110, module=2)]
    verdict = fatbin_mod.judge(str(tmp_path / "none.so"), both, 90)
    assert (verdict["runnable"], verdict["dispatch"], verdict["failing_modules"]) == (False, 1, [2])
    # a module for a GPU the runnable modules do not serve (sm_110: no SASS of major 11 there, and
    # compute_120 PTX does not JIT back to 11.0): not dispatch
    alone = generic + [hand_entry("sass", 110, module=1)]
    verdict = fatbin_mod.judge(str(tmp_path / "none.so"), alone, 90)
    assert verdict == {"modules": 2, "modules_without_code": 1, "failing_modules": [1], "kernels": [],
                       "kernel_count": 0, "ptx_too_new": False, "dispatch": 0, "runnable": False,
                       "why": "no SASS for this arch and no PTX that JITs to it (1 module(s) could not be decoded "
                              "and were judged as holding kernels)"}
    # PTX the driver cannot JIT, in every module that fails
    new_ptx = [hand_entry("ptx", 80, isa=(9, 0))]
    verdict = fatbin_mod.judge(str(tmp_path / "none.so"), new_ptx, 90, (8, 4))
    assert (verdict["runnable"], verdict["ptx_too_new"], verdict["failing_modules"]) == (False, True, [0])
    assert verdict["why"].startswith("PTX compute_80 is ISA 9.0")
    mixed = new_ptx + [hand_entry("sass", 53, module=1)]
    verdict = fatbin_mod.judge(str(tmp_path / "none.so"), mixed, 90, (8, 4))
    assert (verdict["ptx_too_new"], verdict["failing_modules"]) == (False, [0, 1])


def test_a_torch_extension_build_directory(tmp_path):
    """A torch cpp_extension build folder (its build.ninja, written as torch writes one) among
    the targets: judged as a cached build."""
    build = tmp_path / "myext"
    build.mkdir()
    write(build / "build.ninja", "ninja_required_version = 1.3\ncxx = c++\n"
                                 f"cflags = -DTORCH_EXTENSION_NAME=myext -I{tmp_path}/gone/torch/include\n")
    scanner = Scanner(CheckOptions(targets=[str(build)]))
    report = scanner.run()
    [fact] = [f for f in scanner.facts if f.kind == "torch_ext_cache"]
    assert fact.subject == {"path": str(build)} and (fact.data["name"], fact.data["stale"]) == ("myext", True)
    assert report.stats["facts_by_kind"] == {"torch_ext_cache": 1}
    assert [b.path for b in scanner.torch_builds] == [str(build)]


def test_the_environment_the_resolver_assumes(tree, monkeypatch):
    """LD_LIBRARY_PATH of this shell is what a program started here would see; LD_PRELOAD
    is not (it belongs to this session)."""
    elsewhere = str(tree["tree"] / "elsewhere")
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": elsewhere}
    proc = subprocess.run([str(tree["dl"]), str(tree["libbroken.so"])], capture_output=True, env=env)
    assert b"libnowhere.so.7: cannot open" in proc.stdout  # libgone.so.1 was found there
    monkeypatch.setenv("LD_LIBRARY_PATH", elsewhere)
    monkeypatch.setenv("LD_PRELOAD", str(tree["libundef.so"]))
    scanner = Scanner(CheckOptions(targets=[str(tree["libbroken.so"])]))
    scanner.run()
    assert scanner.resolver.env == {"LD_LIBRARY_PATH": elsewhere}
    needed = {f.data["name"]: f.data for f in facts_of(scanner, "needed", tree["libbroken.so"])}
    assert (needed["libgone.so.1"]["resolved_path"], needed["libgone.so.1"]["source"]) == (
        os.path.join(elsewhere, "libgone.so.1"), "ld_library_path")
    assert needed["libnowhere.so.7"]["resolved"] is False
    # the environment given by the caller wins
    given = Scanner(CheckOptions(targets=[str(tree["libbroken.so"])], env={}))
    given.run()
    assert given.resolver.env == {}
    assert {f.data["name"]: f.data["resolved"] for f in facts_of(given, "needed", tree["libbroken.so"])} == {
        "libc.so.6": True, "libgone.so.1": False, "libnowhere.so.7": False}


def test_a_driver_that_cannot_jit_narrows_what_a_module_serves(tmp_path):
    """Under a CUDA 12.4 driver (PTX ISA <= 8.4), compute_90 PTX of ISA 9.0 JITs nowhere: the
    module that runs on sm_90 serves sm_90 alone, so an sm_100-only module is no per-arch
    alternative there.  Judged by architecture alone, the PTX would serve sm_100 too."""
    entries = [hand_entry("sass", 90, module=0), hand_entry("ptx", 90, module=0, isa=(9, 0)),
               hand_entry("sass", 100, module=1)]
    limited = fatbin_mod.judge(str(tmp_path / "none.so"), entries, 90, (8, 4))
    assert (limited["runnable"], limited["failing_modules"], limited["dispatch"]) == (False, [1], 0)
    unlimited = fatbin_mod.judge(str(tmp_path / "none.so"), entries, 90)
    assert (unlimited["runnable"], unlimited["failing_modules"], unlimited["dispatch"]) == (True, [], 1)


def test_a_torch_extension_that_finds_torch_itself(torch_ext):
    ext, lib = torch_ext
    own = ext.parent / "own" / ext.name
    scanner = Scanner(CheckOptions(targets=[str(own)]))
    scanner.run()
    assert facts_of(scanner, "torch_env") == [] and scanner.torch_preloads == {}
    [missing] = facts_of(scanner, "torch_symbols", own)
    assert (missing.data["examples"], missing.data["torch_path"], missing.data["torch_source"]) == (
        [ABSENT_C10], str(lib.parent), "found through its own library search path")


def test_where_a_missing_library_is_installed_or_would_come_from(tmp_path, tree):
    """A NEEDED that a Debian package installs off the loader path (dpkg names the file and
    the package), and one that torch's NVIDIA wheels would provide but none has."""
    shared = sorted(glob.glob("/usr/lib/x86_64-linux-gnu/systemd/libsystemd-shared-*.so"))
    write(tmp_path / "n.c", "int n(void){return 0;}\n")
    site = tmp_path / "lib" / f"python3.{sys.version_info.minor}" / "site-packages"
    (site / "torch" / "lib").mkdir(parents=True)
    write(tmp_path / "s.c", "int s(void){return 0;}\n")
    cc("-shared", "-fPIC", tmp_path / "s.c", "-o", tmp_path / "libabsent.so.9", "-Wl,-soname,libabsent.so.9")
    user = site / "torch" / "lib" / "libtx.so"
    cc("-shared", "-fPIC", tmp_path / "n.c", "-o", user, "-Wl,--no-as-needed", f"-L{tmp_path}", "-l:libabsent.so.9")
    targets = [str(user)]
    if shared and dpkg_owner(shared[0]):
        cc("-shared", "-fPIC", tmp_path / "n.c", "-o", tmp_path / "libuses.so", "-Wl,--no-as-needed",
           f"-L{os.path.dirname(shared[0])}", f"-l:{os.path.basename(shared[0])}")
        targets.append(str(tmp_path / "libuses.so"))
    scanner = Scanner(CheckOptions(targets=targets))
    scanner.run()
    [torch_side] = [f.data for f in facts_of(scanner, "needed", user) if f.data["name"] == "libabsent.so.9"]
    assert (torch_side["resolved"], torch_side["installed_at"], torch_side["context"]) == (False, [], "")
    assert torch_side["where"] == "; torch loads it from site-packages/nvidia/*/lib, and no NVIDIA wheel there has it"
    if len(targets) == 2:
        name = os.path.basename(shared[0])
        assert f"{name}: cannot open shared object file" in dlopen_error(tree["dl"], tmp_path / "libuses.so")
        [data] = [f.data for f in facts_of(scanner, "needed", tmp_path / "libuses.so") if f.data["name"] == name]
        package = dpkg_owner(shared[0])
        assert (data["installed_at"], data["package"]) == ([shared[0]], package)
        assert data["where"] == f"; installed at {shared[0]} ({package}), which is not on its loader path"


def dpkg_owner_of_file(path) -> str | None:
    """dpkg's package for ``path``, under either spelling of a merged /usr (/lib -> /usr/lib)."""
    real = os.path.realpath(path)
    for candidate in (real, re.sub(r"^/usr/lib/", "/lib/", real), re.sub(r"^/lib/", "/usr/lib/", real)):
        owner = dpkg_owner(candidate)
        if owner:
            return owner
    return None


def test_the_upgrade_command_for_a_provider():
    from seedance.collect import practice

    libz = "/usr/lib/x86_64-linux-gnu/libz.so.1"
    package = dpkg_owner_of_file(libz) if os.path.exists(libz) else None
    if package:
        assert closure_mod._upgrade(libz, practice.package_of) == f"apt-get install --only-upgrade {package}"
    lib = real_torch_lib()
    if lib is not None:  # pip's RECORD lists torch/lib/libc10.so under the distribution "torch"
        from importlib.metadata import files
        assert any(str(f).endswith("torch/lib/libc10.so") for f in files("torch"))
        assert closure_mod._upgrade(str(lib / "libc10.so"), practice.package_of) == "pip install -U torch"
    for directory in ("site-packages", "dist-packages"):  # a distribution pip knows, by the path alone
        provider = f"/opt/env/lib/python3/{directory}/pkg/libp.so.1"
        assert closure_mod._upgrade(provider, {provider: "pkg"}.get) == "pip install -U pkg"
    assert closure_mod._upgrade("/opt/x/libq.so.2", {}.get) == "install a newer libq.so.2"
    assert closure_mod._upgrade("/opt/x/libq.so.2", None) == "install a newer libq.so.2"


def test_a_debian_python_module_is_upgraded_with_apt():
    # closure._upgrade suggested `pip install -U <Debian package>` for a file dpkg installed
    # under /usr/lib/python3/dist-packages (package_of falls back to dpkg there, and the path
    # alone decided pip)
    from seedance.collect import practice

    found = [p for p in sorted(glob.glob("/usr/lib/python3/dist-packages/_cffi_backend*.so")) if dpkg_owner(p)]
    if not found:
        pytest.skip("no dpkg-installed python3-cffi-backend here")
    package = dpkg_owner(found[0])
    assert closure_mod._upgrade(found[0], practice.package_of) == f"apt-get install --only-upgrade {package}"


def test_a_torch_extension_beside_its_torch(torch_ext, tmp_path):
    """An extension in a site-packages that holds torch is loaded after that torch, without
    --python (pip's layout: site-packages/torch beside site-packages/pkg)."""
    ext, lib = torch_ext
    site = tmp_path / "lib" / f"python3.{sys.version_info.minor}" / "site-packages"
    (site / "pkg").mkdir(parents=True)
    os.symlink(lib.parent, site / "torch")  # the wheel's own files, seen from this site-packages
    beside = site / "pkg" / ext.name
    shutil.copyfile(ext, beside)
    scanner = Scanner(CheckOptions(targets=[str(beside)]))
    scanner.run()
    assert facts_of(scanner, "torch_env") == []
    needed = {f.data["name"]: f.data for f in facts_of(scanner, "needed", beside)}
    assert (needed["libc10.so"]["resolved_path"], needed["libc10.so"]["source"]) == (
        str(site / "torch" / "lib" / "libc10.so"), "loaded")
    assert scanner._torch_for(str(beside)).path == str(site / "torch")


def test_the_image_named_is_the_one_this_driver_can_jit(tmp_path):
    """The first PTX in file order that JITs is the one loaded; under a CUDA 12.4 driver an ISA
    9.0 image is passed over for the ISA 8.0 one."""
    entries = [hand_entry("ptx", 86, isa=(9, 0)), hand_entry("ptx", 80, isa=(8, 0))]
    assert fatbin_mod.judge(str(tmp_path / "none.so"), entries, 90)["why"] == "PTX compute_86 JIT"
    limited = fatbin_mod.judge(str(tmp_path / "none.so"), entries, 90, (8, 4))
    assert (limited["runnable"], limited["why"]) == (True, "PTX compute_80 JIT")


def test_a_module_for_other_gpus_is_no_alternative_when_nothing_here_serves_them(tmp_path):
    # sm_50 SASS runs on 5.0-5.3, which the sm_90 module does not serve; sm_35 SASS runs on no
    # GPU of the table (Kepler): serving nothing, it covers nothing either
    for old in (50, 35):
        entries = [hand_entry("sass", 90, module=0), hand_entry("sass", old, module=1)]
        verdict = fatbin_mod.judge(str(tmp_path / "none.so"), entries, 90)
        assert (verdict["runnable"], verdict["failing_modules"], verdict["dispatch"]) == (False, [1], 0), old


@pytest.fixture(scope="module")
def zlib_gap(tmp_path_factory):
    """A library linked against a libz.so.1 of our own whose ZLIB_1.2.0 node has zfake, loaded
    with the system's libz (dpkg's), whose ZLIB_1.2.0 has no such symbol."""
    libz = "/lib/x86_64-linux-gnu/libz.so.1"
    if not os.path.exists(libz) or dpkg_owner_of_file(libz) is None:
        pytest.skip("no dpkg-installed libz here")
    root = tmp_path_factory.mktemp("zgap")
    write(root / "z.c", "int zfake(void){return 0;}\n")
    write(root / "z.map", "ZLIB_1.2.0 { global: zfake; local: *; };\n")
    cc("-shared", "-fPIC", root / "z.c", "-o", root / "libz.so.1", "-Wl,-soname,libz.so.1",
       f"-Wl,--version-script={root / 'z.map'}")
    write(root / "u.c", "int zfake(void);\nint u(void){return zfake();}\n")
    (root / "tree").mkdir()
    cc("-shared", "-fPIC", root / "u.c", "-o", root / "tree" / "libzuser.so", f"-L{root}", "-l:libz.so.1")
    return root / "tree" / "libzuser.so"


def test_a_version_gap_in_a_debian_library(zlib_gap, tree):
    assert "undefined symbol: zfake, version ZLIB_1.2.0" in dlopen_error(tree["dl"], zlib_gap)
    scanner = Scanner(CheckOptions(targets=[str(zlib_gap)]))
    scanner.run()
    [gap] = facts_of(scanner, "undefined_symbol", zlib_gap)
    package = dpkg_owner_of_file(gap.data["provider"])
    assert (gap.data["symbol"], gap.data["version"], gap.data["cause"]) == ("zfake", "ZLIB_1.2.0", "node-lacks-symbol")
    assert gap.data["upgrade"] == f"apt-get install --only-upgrade {package}"
