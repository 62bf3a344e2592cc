"""GPU observations and the pure parts of the seven-layer check."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from seedance.errors import BadInput
from seedance.plugins import host, layers
from seedance.plugins.manifest import load_manifest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plugins"
NO_GPU = host.GpuHost(False, "NVML Shared Library Not Found", 0, None, None, None, "no module")
ONE_H100 = host.GpuHost(True, "", 1, "550.54.15", 12, "550.54.15", "/proc/driver/nvidia/version",
                        ({"index": 0, "name": "H100", "cc": "9.0", "arch": 90, "utilisation": 40},))


@pytest.mark.parametrize("text", [
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\nGCC version:  gcc 12\n",
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder@U16)\n",
])
def test_kernel_module_version_from_proc(tmp_path, monkeypatch, text):
    proc = tmp_path / "version"
    proc.write_text(text)
    monkeypatch.setattr(host, "PROC_VERSION", proc)
    assert host.kernel_module_version() == ("550.54.15", str(proc))


def test_kernel_module_absent_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(host, "PROC_VERSION", tmp_path / "none")
    monkeypatch.setattr(host, "SYS_MODULE_VERSION", tmp_path / "none2")
    version, why = host.kernel_module_version()
    assert version is None and "no nvidia kernel module" in why


def test_probe_on_this_host_never_raises():
    observed = host.probe()
    assert observed.device_count >= 0
    if not observed.nvml_ok:
        assert observed.nvml_error and observed.device_source.startswith("NVML unavailable")


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
