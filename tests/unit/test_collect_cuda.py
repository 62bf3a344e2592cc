import pytest

from seedance.collect import cuda
from seedance.elf.reader import read_elf


@pytest.mark.parametrize("driver, major, ok", [
    ("525.60.13", 12, True), ("525.60.12", 12, False), ("535.104.05", 13, False),
    ("580.65.06", 13, True), ("450.80.02", 11, True), ("418.87", 11, False),
])
def test_driver_fact(driver, major, ok):
    fact = cuda.driver_fact("/x.so", "/libcudart.so", major, driver, "--driver-version")
    assert fact.data["driver_ok"] is ok
    assert fact.data["required_driver"] == cuda.MIN_DRIVER[major]


@pytest.mark.parametrize("driver, best", [("580.95.05", 13), ("550.54.15", 12), ("470.1", 11), ("300.1", None)])
def test_driver_max_major(driver, best):
    assert cuda.driver_max_major(driver) == best


def test_bad_driver_version():
    with pytest.raises(ValueError):
        cuda.version_tuple("5x5")


def test_runtime_major_prefers_soname_over_file_name(tmp_path):
    nvidia = pytest.importorskip("nvidia.cuda_runtime")
    import os
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
