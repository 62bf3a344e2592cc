import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from seedance.collect import cuda
from seedance.elf.reader import read_elf

ROOT = Path(__file__).resolve().parents[2]
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)

# NVIDIA's "CUDA Toolkit and Minimum Required Driver Version for CUDA Minor Version
# Compatibility" table (CUDA release notes, Linux x86_64), written here, not read from the
# module under test.
NVIDIA_FLOORS = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}


def vt(text):
    return tuple(int(p) for p in text.split("."))


@pytest.mark.parametrize("driver", ["418.87", "450.80.01", "450.80.02", "470.256.02", "525.60.12", "525.60.13",
                                    "535.104.05", "550.54.15", "580.65.05", "580.65.06", "590.44.01"])
@pytest.mark.parametrize("major", [11, 12, 13])
def test_driver_floor_per_runtime_major(driver, major):
    fact = cuda.driver_fact("/x.so", "/libcudart.so", major, driver, "--driver-version")
    assert fact.data["driver_ok"] is (vt(driver) >= NVIDIA_FLOORS[major])
    assert vt(fact.data["required_driver"]) == NVIDIA_FLOORS[major]


@pytest.mark.parametrize("text, kind, meets", [
    # nvidia-smi's "CUDA Version" is the newest CUDA the driver supports, not a driver
    ("12.4", "cuda", {11: True, 12: True, 13: False}),
    ("12.0", "cuda", {11: True, 12: True, 13: False}),
    ("13.0", "cuda", {11: True, 12: True, 13: True}),
    ("11.8", "cuda", {11: True, 12: False, 13: False}),
    ("535", "branch", {11: True, 12: True, 13: False}),
    ("525", "branch", {11: True, 12: True, 13: False}),
    ("580", "branch", {11: True, 12: True, 13: True}),
    ("470", "branch", {11: True, 12: False, 13: False}),
    ("535.104.05", "driver", {11: True, 12: True, 13: False}),
    ("418.87", "driver", {11: False, 12: False, 13: False}),
])
def test_driver_version_forms(text, kind, meets):
    spec = cuda.parse_driver_version(text)
    assert spec.kind == kind
    for major, ok in meets.items():
        fact = cuda.driver_fact("/x.so", "/libcudart.so", major, text, "--driver-version")
        assert fact.data["driver_ok"] is ok, (text, major)
        assert "None" not in fact.data["fix"]


@pytest.mark.parametrize("text, cuda_version", [
    # nvidia-smi on these drivers prints "CUDA Version: X.Y" (release notes, Table 3)
    ("535.104.05", (12, 2)), ("550.54.15", (12, 4)), ("525.60.13", (12, 0)), ("470.82.01", (11, 4)),
    ("570.124.06", (12, 8)), ("580.65.06", (13, 0)), ("560", (12, 6)), ("12.4", (12, 4)),
])
def test_driver_cuda_version(text, cuda_version):
    assert cuda.parse_driver_version(text).cuda == cuda_version


@pytest.mark.parametrize("bad", ["5x5", "", "12.4.1.1", "550.54.15.1", "9.2", "sm_90", "-1"])
def test_bad_driver_version(bad):
    with pytest.raises(ValueError):
        cuda.parse_driver_version(bad)


@pytest.mark.parametrize("driver", ["418.87", "300.1", "10.1"])
def test_no_runtime_major_fits_the_driver_never_prints_none(driver):
    fact = cuda.driver_fact("/x.so", "/libcudart.so", 12, driver, "--driver-version")
    assert not fact.data["driver_ok"]
    assert "None" not in fact.data["fix"] and "525.60.13" in fact.data["fix"]


def test_runtime_major_prefers_soname_over_file_name(tmp_path):
    nvidia = pytest.importorskip("nvidia.cuda_runtime")
    lib = os.path.join(list(nvidia.__path__)[0], "lib", "libcudart.so.11.0")
    if not os.path.exists(lib):
        pytest.skip("nvidia-cuda-runtime-cu11 wheel not installed")
    fake = tmp_path / "libcudart.so.12"
    fake.write_bytes(open(lib, "rb").read())
    info = read_elf(str(fake))
    assert cuda.is_cudart(str(fake), info)
    assert cuda.runtime_major(str(fake), info) == 11
    assert cuda.runtime_major("/x/libcudart.so.13") == 13


def test_no_nvml_here_is_an_empty_gpu_info():
    gpu = cuda.probe_nvml()
    if gpu.nvml:
        pytest.skip("this host has NVML")
    assert gpu.driver_version is None and gpu.targets == [] and gpu.nvml_error


def test_compat_driver_on_the_loader_path(tmp_path):
    compat = tmp_path / "cuda-12.8" / "compat"
    compat.mkdir(parents=True)
    (compat / "libcuda.so.570.124.06").write_bytes(b"")
    (compat / "libcuda.so.1").symlink_to("libcuda.so.570.124.06")
    assert cuda.compat_driver({"LD_LIBRARY_PATH": f"/nowhere:{compat}"}) == "570.124.06"
    assert cuda.compat_driver({"LD_LIBRARY_PATH": str(tmp_path)}) is None
    # the compat driver replaces the floor: a 12.x runtime on a 470 driver with compat 570
    fact = cuda.driver_fact("/x.so", "/x.so", 12, "470.82.01", "--driver-version", linkage="static",
                            compat="570.124.06")
    assert fact.data["driver_ok"] is True
    assert cuda.driver_fact("/x.so", "/x.so", 13, "470.82.01", "--driver-version", compat="570.124.06").data["driver_ok"] is False


def test_compat_on_ld_library_path_applies_to_shared_runtimes(tmp_path, monkeypatch):
    compat = tmp_path / "compat"
    compat.mkdir()
    (compat / "libcuda.so.580.65.06").write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(compat))
    assert cuda.driver_fact("/x.so", "/libcudart.so.13", 13, "535.104.05", "nvml").data["driver_ok"] is True
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    assert cuda.driver_fact("/x.so", "/libcudart.so.13", 13, "535.104.05", "nvml").data["driver_ok"] is False


# --- a statically linked runtime, judged by the real static runtime against a driver -------

PROBE = """
#include <cstdio>
#include <cuda_runtime.h>
int main() { int n = -1; cudaError_t e = cudaGetDeviceCount(&n); printf("%d\\n", (int)e); return 0; }
"""
INSUFFICIENT_DRIVER = 35  # cudaErrorInsufficientDriver


@pytest.fixture(scope="module")
def static_probe(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc (CUDA toolkit) not installed")
    tmp = tmp_path_factory.mktemp("static_rt")
    (tmp / "probe.cu").write_text(PROBE)
    subprocess.run([NVCC, "-o", tmp / "probe", tmp / "probe.cu"], check=True, capture_output=True)  # -cudart static
    fake = tmp / "fake"
    fake.mkdir()
    inc = ["-I/usr/local/cuda/include"] if os.path.isdir("/usr/local/cuda/include") else ["-DFAKE_NO_CUDA_H"]
    subprocess.run(["gcc", "-O2", "-fPIC", "-shared", *inc, "-Wl,-soname,libcuda.so.1", "-Wl,-Bsymbolic",
                    ROOT / "tests/fakecuda/fakecuda.c", "-o", fake / "libcuda.so.1", "-pthread"],
                   check=True, capture_output=True)
    return tmp / "probe", fake


def static_runtime_refuses(probe, fake, cuda_version: int) -> bool:
    """Reality: does the static runtime return cudaErrorInsufficientDriver on this driver?"""
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake), FAKECUDA_DRIVER_VERSION=str(cuda_version))
    out = subprocess.run([probe], env=env, capture_output=True, text=True, errors="replace", timeout=60)
    return int(out.stdout.strip()) == INSUFFICIENT_DRIVER


@pytest.mark.parametrize("driver, reports", [
    # what cuDriverGetVersion returns on these drivers (1000*major + 10*minor)
    ("535.104.05", 12020), ("12.4", 12040), ("575", 12090), ("580.65.06", 13000), ("13.0", 13000),
    ("590", 13010), ("470.82.01", 11040),
])
def test_static_runtime_judged_like_the_runtime_itself(static_probe, driver, reports):
    probe, fake = static_probe
    info = read_elf(str(probe))
    found = cuda.static_runtime(str(probe), info)
    assert found is not None and found["major"] == 13  # nvcc 13 built it
    code = subprocess.run([str(ROOT / ".venv/bin/seedance"), "check", "--no-progress", "--json",
                           "--driver-version", driver, str(probe)], capture_output=True, text=True,
                          errors="replace", timeout=120)
    assert code.returncode in (0, 1), code.stderr
    report = json.loads(code.stdout)
    too_old = [f for f in report["findings"] if f["rule"] == "cuda-driver-too-old"]
    assert bool(too_old) is static_runtime_refuses(probe, fake, reports), code.stdout
    assert code.returncode == (1 if too_old else 0)
    for finding in too_old:
        assert "None" not in finding["message"] + (finding.get("fix") or "")
        assert finding["evidence"]["linkage"] == "static"


def test_shared_objects_without_the_static_runtime_are_not_flagged():
    libc = "/lib/x86_64-linux-gnu/libc.so.6"
    if not os.path.exists(libc):
        pytest.skip("no glibc at the Debian path")
    assert cuda.static_runtime(libc, read_elf(libc)) is None
    nvidia = pytest.importorskip("nvidia.cuda_runtime")
    for lib in Path(list(nvidia.__path__)[0], "lib").glob("libcudart.so.*"):
        assert cuda.static_runtime(str(lib), read_elf(str(lib))) is None  # the shared runtime itself


def test_bad_driver_version_on_the_command_line_is_one_line():
    proc = subprocess.run([str(ROOT / ".venv/bin/seedance"), "check", "--driver-version", "12.x", "/bin/true"],
                          capture_output=True, text=True, errors="replace", timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("seedance: error:") and proc.stderr.count("\n") == 1, proc.stderr
