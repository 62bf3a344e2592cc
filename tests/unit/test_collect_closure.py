"""Closure facts through the real resolver on fixtures built with gcc: dedup across roots,
runtime majors and driver facts."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from seedance.collect.scan import CheckOptions, Scanner

GCC = shutil.which("gcc")
pytestmark = pytest.mark.skipif(GCC is None, reason="gcc not installed")


def cc(*args):
    subprocess.run([GCC, *map(str, args)], check=True, capture_output=True)


def scan(*targets, **options):
    return Scanner(CheckOptions(targets=[str(t) for t in targets], **options)).run()


def test_broken_needed_in_a_shared_library_is_reported_once(tmp_path):
    (tmp_path / "m.c").write_text("int m(void) { return 1; }\n")
    cc("-shared", "-fPIC", tmp_path / "m.c", "-o", tmp_path / "libmissing.so", "-Wl,-soname,libmissing.so")
    (tmp_path / "b.c").write_text("int m(void);\nint b(void) { return m(); }\n")
    cc("-shared", "-fPIC", tmp_path / "b.c", "-o", tmp_path / "libbroken.so", f"-L{tmp_path}", "-lmissing")
    for index in range(3):
        src = tmp_path / f"app{index}.c"
        src.write_text("int b(void);\nint main(void) { return b(); }\n")
        cc(src, "-o", tmp_path / f"app{index}", f"-L{tmp_path}", "-lbroken", "-Wl,-rpath,$ORIGIN",
           "-Wl,--allow-shlib-undefined")
    (tmp_path / "libmissing.so").unlink()
    report = scan(tmp_path)
    assert [(f.rule, f.subject["path"]) for f in report.findings] == [
        ("needed-unresolved", str(tmp_path / "libbroken.so"))]
    assert report.stats["elf_objects"] == 4


@pytest.fixture
def cu12_user(tmp_path):
    try:
        import nvidia.cuda_runtime as rt
    except ImportError:
        pytest.skip("nvidia-cuda-runtime-cu12 wheel not installed")
    lib = Path(list(rt.__path__)[0]) / "lib"
    if not (lib / "libcudart.so.12").exists():
        pytest.skip("nvidia-cuda-runtime-cu12 wheel not installed")
    (tmp_path / "k.c").write_text("int cudaRuntimeGetVersion(int *v);\nint k(void) { int v; return cudaRuntimeGetVersion(&v); }\n")
    out = tmp_path / "libk.so"
    cc("-shared", "-fPIC", tmp_path / "k.c", "-o", out, f"-L{lib}", "-l:libcudart.so.12", f"-Wl,-rpath,{lib}")
    return out, lib / "libcudart.so.12"


@pytest.mark.parametrize("driver, too_old", [("470.256.02", True), ("525.60.13", False), ("550.54.15", False)])
def test_driver_version_against_runtime_major(cu12_user, driver, too_old):
    lib, runtime = cu12_user
    report = scan(lib, driver_version=driver)
    rules = [f.rule for f in report.findings]
    assert rules == (["cuda-driver-too-old"] if too_old else [])
    facts = [f for f in Scanner(CheckOptions(targets=[str(lib)], driver_version=driver)).run().stats["facts_by_kind"]]
    assert "cuda_driver" in facts
    if too_old:
        finding = report.findings[0]
        assert finding.evidence["runtime_major"] == 12 and finding.evidence["required_driver"] == "525.60.13"
        assert finding.subject == {"path": str(lib)}
        assert finding.fix.endswith(f"--runtime 11 {lib}")


def test_no_driver_known_means_no_driver_fact(cu12_user):
    lib, _runtime = cu12_user
    report = scan(lib)
    if report.host["gpu"]["nvml"]:
        pytest.skip("this host has NVML")
    assert "cuda_driver" not in report.stats["facts_by_kind"]
    assert report.stats["facts_by_kind"]["cuda_runtimes"] == 1


def test_runtime_on_its_own_is_not_judged_against_the_driver(cu12_user):
    _lib, runtime = cu12_user
    report = scan(runtime, driver_version="470.256.02")
    assert report.findings == []
    assert "cuda_driver" not in report.stats["facts_by_kind"]
