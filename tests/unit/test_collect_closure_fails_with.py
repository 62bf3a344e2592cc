"""An object that fails to load only because a library it needs fails is named on that
library's finding (also_fails), not reported nowhere and not made an error of its own.

Real ld.so inputs: small libraries built with gcc in tmp_path, linked with DT_RUNPATH
$ORIGIN as wheels link theirs; the missing or older provider is built outside the checked
tree, where nothing the loader searches can find it."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from seedance.collect import practice
from seedance.collect.scan import CheckOptions, Scanner
from seedance.model.report import fingerprint
from seedance.render.sarif import sarif_log

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")

ERROR = ("error", "fatal")


def _gcc(*args) -> None:
    subprocess.run(["gcc", *map(str, args)], check=True, capture_output=True)


def _library(directory, name: str, source: str, *link, soname: str | None = None, script: str | None = None):
    """lib<name>.so built from ``source`` in ``directory``, linked to ``link`` (paths), RUNPATH $ORIGIN."""
    c_file = directory / f"{name}.c"
    c_file.write_text(source)
    out = directory / f"lib{name}.so"
    extra = []
    if script is not None:
        (directory / f"{name}.map").write_text(script)
        extra.append(f"-Wl,--version-script,{directory / f'{name}.map'}")
    _gcc("-shared", "-fPIC", "-o", out, c_file, *link, f"-Wl,-soname,{soname or out.name}",
         "-Wl,--enable-new-dtags,-rpath,$ORIGIN", *extra)
    return out


def _tree(tmp_path, b_needs: str):
    """tree/: liba.so -> libb.so -> (libzz.so.1 | libcuda.so.1), libc.so -> liba.so, an
    unrelated libd.so, and libe.so -> libf.so -> libyy.so.1, which is missing.  ``b_needs``: 'missing' (libzz.so.1 built outside the tree), 'driver'
    (libcuda.so.1, built outside the tree), 'present' (libzz.so.1 in the tree)."""
    outside, tree = tmp_path / "outside", tmp_path / "tree"
    outside.mkdir()
    tree.mkdir()
    provider_dir = tree if b_needs == "present" else outside
    soname = "libcuda.so.1" if b_needs == "driver" else "libzz.so.1"
    provider = _library(provider_dir, "provider", "int zz(void) { return 1; }\n", soname=soname)
    provider = provider.rename(provider_dir / soname)
    b = _library(tree, "b", "extern int zz(void);\nint b(void) { return zz(); }\n", provider)
    a = _library(tree, "a", "extern int b(void);\nint a(void) { return b(); }\n", b)
    c = _library(tree, "c", "extern int a(void);\nint c(void) { return a(); }\n", a)
    d = _library(tree, "d", "int d(void) { return 4; }\n")
    # beside them a pair that does fail: libe.so -> libf.so -> libyy.so.1, built outside the tree
    yy = _library(outside, "yy", "int yy(void) { return 1; }\n", soname="libyy.so.1").rename(outside / "libyy.so.1")
    f = _library(tree, "f", "extern int yy(void);\nint f(void) { return yy(); }\n", yy)
    e = _library(tree, "e", "extern int f(void);\nint e(void) { return f(); }\n", f)
    return tree, {"a": str(a), "b": str(b), "c": str(c), "d": str(d), "e": str(e), "f": str(f)}


def _check(*targets):
    return Scanner(CheckOptions(targets=[str(t) for t in targets])).run()


def _dlopen_fails(path: str) -> bool:
    """dlopen(path, RTLD_NOW) in a fresh process: in this one a library of an earlier test
    with the same SONAME may be loaded already, and ld.so would take it."""
    probe = f"import ctypes, os; ctypes.CDLL({path!r}, mode=os.RTLD_NOW)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode != 0


def test_a_missing_library_names_every_object_that_fails_with_it(tmp_path):
    tree, lib = _tree(tmp_path, "missing")
    # what ld.so does: A and C fail through B, D loads
    assert _dlopen_fails(lib["a"]) and _dlopen_fails(lib["c"]) and not _dlopen_fails(lib["d"])
    report = _check(tree)
    errors = {f.subject["path"]: f for f in report.findings if f.severity in ERROR}
    assert sorted(errors) == [lib["b"], lib["f"]]
    assert {f.rule for f in errors.values()} == {"needed-unresolved"}
    finding = errors[lib["b"]]
    assert finding.evidence["also_fails"] == sorted([lib["a"], lib["c"]])
    assert finding.evidence["also_fails_count"] == 2
    assert finding.message.endswith("is not found; 2 more objects of this tree fail with it (liba.so, libc.so)")
    assert errors[lib["f"]].evidence["also_fails"] == [lib["e"]]
    # the consequences are not the cause: B's finding keeps the fingerprint it has where
    # nothing else loads B
    alone = [f for f in _check(lib["b"]).findings if f.rule == "needed-unresolved"]
    assert [f.fingerprint for f in alone] == [finding.fingerprint]
    assert "also_fails" not in alone[0].evidence and "more object" not in alone[0].message
    assert finding.fingerprint == fingerprint(finding.rule, finding.subject, alone[0].message)


def test_the_objects_that_fail_with_it_are_related_locations_in_sarif(tmp_path):
    from tests.unit.test_render_sarif import conform

    tree, lib = _tree(tmp_path, "missing")
    log = sarif_log(_check(tree), source_root=str(tmp_path))
    conform({k: v for k, v in log.items() if k != "$schema"}, "SarifLog")
    result, = [r for r in log["runs"][0]["results"] if r["ruleId"] == "needed-unresolved"
               and r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "tree/libb.so"]
    related = result["relatedLocations"]
    for location in related:
        conform(location, "Location")
    assert [r["physicalLocation"]["artifactLocation"]["uri"] for r in related] == ["tree/liba.so", "tree/libc.so"]
    assert sorted(r["id"] for r in related) == [0, 1]


def _named_as_failing_with(report) -> dict:
    """failing object -> the objects its error finding says fail with it."""
    return {f.subject["path"]: f.evidence["also_fails"] for f in report.findings
            if f.severity in ERROR and "also_fails" in f.evidence}


def test_a_library_that_needs_only_the_absent_driver_fails_no_one(tmp_path):
    if practice._driver_installed():
        pytest.skip("this host has the NVIDIA driver: libcuda.so.1 is found")
    tree, lib = _tree(tmp_path, "driver")
    report = _check(tree)
    # B loads where its package runs, on a GPU host: A and C do not fail with it
    assert [f.rule for f in report.findings if f.subject.get("path") == lib["b"]] == ["needed-driver-absent"]
    assert _named_as_failing_with(report) == {lib["f"]: [lib["e"]]}
    assert not [f for f in report.findings if "more object" in f.message and f.subject["path"] != lib["f"]]


def test_healthy_objects_fail_with_nothing(tmp_path):
    tree, lib = _tree(tmp_path, "present")
    assert not _dlopen_fails(lib["c"])
    report = _check(tree)
    assert [f.subject["path"] for f in report.findings if f.severity in ERROR] == [lib["f"]]
    assert _named_as_failing_with(report) == {lib["f"]: [lib["e"]]}


def test_a_missing_version_node_names_the_objects_that_fail_with_it(tmp_path):
    outside, tree = tmp_path / "outside", tmp_path / "tree"
    outside.mkdir()
    tree.mkdir()
    # B was linked against a libzz that defines ZZ_2; the tree's libzz defines only ZZ_1
    newer = _library(outside, "zz", "int zz(void) { return 2; }\n", soname="libzz.so.1",
                     script="ZZ_2 { global: zz; local: *; };\n")
    b = _library(tree, "b", "extern int zz(void);\nint b(void) { return zz(); }\n", newer)
    older = _library(tree, "zz", "int zz(void) { return 1; }\n", soname="libzz.so.1",
                     script="ZZ_1 { global: zz; local: *; };\n")
    older.rename(tree / "libzz.so.1")
    a = _library(tree, "a", "extern int b(void);\nint a(void) { return b(); }\n", b)
    assert _dlopen_fails(str(a))
    report = _check(tree)
    errors = [f for f in report.findings if f.severity in ERROR]
    assert [(f.rule, f.subject["path"]) for f in errors] == [("symbol-version-missing", str(b))]
    assert errors[0].evidence["also_fails"] == [str(a)] and errors[0].evidence["also_fails_count"] == 1
    assert errors[0].message.endswith("; 1 more object of this tree fails with it (liba.so)")


def test_a_root_filesystem_names_what_fails_with_a_missing_library(tmp_path):
    from seedance.collect.image import check_root

    rootfs = tmp_path / "rootfs"
    (rootfs / "opt").mkdir(parents=True)
    _tree(rootfs / "opt", "missing")  # rootfs/opt/tree: the libraries, rootfs/opt/outside: their providers
    report = check_root(str(rootfs), CheckOptions(targets=[]))
    errors = {f.subject["path"]: f for f in report.findings if f.severity in ERROR}
    assert sorted(errors) == ["/opt/tree/libb.so", "/opt/tree/libf.so"]  # paths inside the root
    assert errors["/opt/tree/libb.so"].evidence["also_fails"] == ["/opt/tree/liba.so", "/opt/tree/libc.so"]
    assert errors["/opt/tree/libf.so"].evidence["also_fails"] == ["/opt/tree/libe.so"]
