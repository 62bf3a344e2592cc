"""On a host without the NVIDIA driver, every CUDA library links libcuda.so.1: the check says
so once (needed-driver-absent, info), with how many more objects need it, not once per
library or environment."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from seedance.collect import practice

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")


def _gcc(*args):
    subprocess.run(["gcc", *args], check=True, capture_output=True)


def test_the_absent_driver_is_one_finding_per_check(tmp_path):
    if practice._driver_installed():
        pytest.skip("this host has the NVIDIA driver: no library misses it")
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "cuda.c").write_text("int cuInit(unsigned f) { return f; }\n")
    _gcc("-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub / "libcuda.so.1"), str(stub / "cuda.c"))
    envs = []
    for env in ("env-a", "env-b"):  # two environments, two CUDA libraries each
        lib = tmp_path / env / "lib"
        lib.mkdir(parents=True)
        for name in ("one", "two"):
            source = lib / f"{name}.c"
            source.write_text(f"extern int cuInit(unsigned);\nint {name}_init(void) {{ return cuInit(0); }}\n")
            _gcc("-shared", "-fPIC", "-o", str(lib / f"lib{name}.so"), str(source),
                 str(stub / "libcuda.so.1"))
        envs.append(str(tmp_path / env))
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "seedance", "check", "--no-cache", *envs,
                           "--report-json", str(report)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    findings = [f for f in json.loads(report.read_text())["findings"] if f["rule"] == "needed-driver-absent"]
    assert len(findings) == 1, [f["subject"] for f in findings]
    assert "3 more objects need libcuda.so.1" in findings[0]["message"]
    assert not [f for f in json.loads(report.read_text())["findings"] if f["rule"] == "needed-unresolved"]
