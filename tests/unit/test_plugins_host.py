"""GPU observations and the pure parts of the seven-layer check."""
from __future__ import annotations

import ctypes
import re
from dataclasses import replace
from pathlib import Path

import pytest

from seedance.model.errors import BadInput
from seedance.plugins import host, layers
from seedance.plugins.manifest import load_manifest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plugins"
NO_GPU = host.GpuHost(False, "NVML Shared Library Not Found", 0, None, None, None, "no module")
ONE_H100 = host.GpuHost(True, "", 1, "550.54.15", 12, "550.54.15", "/proc/driver/nvidia/version",
                        ({"index": 0, "name": "H100", "cc": "9.0", "arch": 90, "utilisation": 40},))


def _real_module_version():
    """The loaded nvidia module's version straight from the kernel's files, parsed here
    without seedance: /sys/module/nvidia/version holds it alone; /proc/driver/nvidia/version
    has it as the first dotted number of its "NVRM version:" line."""
    sys_file = Path("/sys/module/nvidia/version")
    proc_file = Path("/proc/driver/nvidia/version")
    sys_version = sys_file.read_text().strip() if sys_file.exists() else None
    proc_version = None
    if proc_file.exists():
        line = next((l for l in proc_file.read_text(errors="replace").splitlines() if l.startswith("NVRM")), "")
        proc_version = next((t for t in line.split() if re.fullmatch(r"[0-9]+(\.[0-9]+)+", t)), None)
    return proc_version, sys_version


def test_kernel_module_version_is_the_loaded_modules():
    proc_version, sys_version = _real_module_version()
    version, source = host.kernel_module_version()
    if proc_version is None and sys_version is None:
        assert version is None
        assert "no nvidia kernel module" in source and str(host.PROC_VERSION) in source
    else:
        assert version == (proc_version or sys_version)
        if proc_version and sys_version:
            assert proc_version == sys_version  # the kernel's two files agree: the oracle holds
        assert Path(source).exists()


def _nvml_oracle():
    """This host's NVML through its C API (ctypes), not through pynvml or seedance:
    (facts, None) when the library loads and initialises, (None, why) otherwise."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as exc:
        return None, f"no libnvidia-ml.so.1: {exc}"
    rc = lib.nvmlInit_v2()
    if rc != 0:  # NVML_SUCCESS
        return None, f"nvmlInit_v2 returned {rc}"
    try:
        count = ctypes.c_uint()
        assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0
        driver = ctypes.create_string_buffer(96)
        assert lib.nvmlSystemGetDriverVersion(driver, 96) == 0
        cuda = ctypes.c_int()
        cuda_major = cuda.value // 1000 if lib.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(cuda)) == 0 else None
        return {"count": count.value, "driver": driver.value.decode(), "cuda_major": cuda_major}, None
    finally:
        lib.nvmlShutdown()


def test_probe_reports_what_this_hosts_nvml_says(tmp_path, monkeypatch):
    # no agent to fall back on: the probe must report NVML's own view (or its absence)
    monkeypatch.setenv("SEEDANCE_RUNTIME_DIR", str(tmp_path))
    host.probe.cache_clear()
    try:
        observed = host.probe()
    finally:
        host.probe.cache_clear()
    facts, why = _nvml_oracle()
    proc_version, sys_version = _real_module_version()
    assert observed.module_version == (proc_version or sys_version)
    if facts is None:
        assert not observed.nvml_ok, f"the probe says NVML works, but {why}"
        assert observed.device_count == 0 and observed.devices == () and observed.driver_version is None
        assert observed.nvml_error and observed.device_source == f"NVML unavailable ({observed.nvml_error})"
        if why.startswith("no libnvidia-ml"):
            assert "Not Found" in observed.nvml_error  # pynvml's NVMLError_LibraryNotFound, said as such
    else:
        assert observed.nvml_ok, observed.nvml_error
        assert observed.device_count == facts["count"] == len(observed.devices)
        assert observed.driver_version == facts["driver"]
        assert observed.cuda_driver_major == facts["cuda_major"]
        assert [d["index"] for d in observed.devices] == list(range(facts["count"]))


def test_affinity_metric_needs_two_devices():
    assert host.affinity_metric(NO_GPU)["observed"] is False
    single = host.affinity_metric(ONE_H100)
    assert single["observed"] is False and "1 device" in single["value"]


def fatbin_manifest():
    return load_manifest(EXAMPLES / "fatbin-kernels" / "manifest.yaml")


def test_arch_target_precedence():
    manifest = fatbin_manifest()
    assert layers.arch_targets(manifest, ONE_H100, "sm_75") == [(75, "", "--force-arch")]
    assert layers.arch_targets(manifest, ONE_H100, None) == [(90, "", "NVML device 0")]
    assert layers.arch_targets(manifest, NO_GPU, None) == [(86, "", "manifest cuda.archs")]
    with pytest.raises(BadInput, match="--force-arch"):
        layers.arch_targets(manifest, NO_GPU, "ampere")


def test_framework_range_against_installed_torch():
    manifest = load_manifest(EXAMPLES / "audio-encoder-v2.0.5" / "manifest.yaml")
    fact, note = layers.framework_fact(manifest)
    assert fact.data["torch_ok"] is True and "within framework.torch" in note
    fact, _ = layers.framework_fact(replace(manifest, torch_range=">=1.0,<2"))
    assert fact.data["torch_ok"] is False


def test_cuda_runtime_against_driver():
    manifest = fatbin_manifest()  # cuda.runtime 13
    facts, note = layers.cuda_runtime_facts(manifest, {}, ONE_H100)
    data = facts[0].data
    assert data["driver_observed"] and data["driver_max_major"] == 12 and not data["driver_ok"]
    facts, note = layers.cuda_runtime_facts(manifest, {}, NO_GPU)
    assert facts[0].data["driver_ok"] and "driver not observed" in note
