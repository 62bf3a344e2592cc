"""The three waste traps: facts from manifests, judged by rules/plugins.yaml."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from seedance.judge.engine import load_rules
from seedance.model.report import WASTE_TRAPS, Report
from seedance.plugins.host import GpuHost
from seedance.plugins.manifest import load_manifest
from seedance.plugins.resolve import pick_version
from seedance.plugins.verify import manifest_facts

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plugins"
NO_GPU = GpuHost(False, "NVML Shared Library Not Found", 0, None, None, None, "no nvidia kernel module")
TWO_GPUS = GpuHost(True, "", 2, "550.54", 12, "550.54", "/proc/driver/nvidia/version",
                   ({"index": 0, "name": "A", "cc": "8.6", "arch": 86, "utilisation": 9},
                    {"index": 1, "name": "B", "cc": "8.6", "arch": 86, "utilisation": 3}))


@pytest.fixture(scope="module")
def rules():
    return load_rules()


def traps(rules, manifest, host, strict, picks=None, bench=None):
    findings = rules.evaluate(manifest_facts(manifest, host, strict, picks, bench=bench or {}), strict=strict)
    return {f.rule: f for f in findings if f.trap in WASTE_TRAPS}


def legacy():
    return load_manifest(EXAMPLES / "legacy-audio-encoder" / "manifest.yaml")


def compliant():
    return load_manifest(EXAMPLES / "audio-encoder-v2.0.5" / "manifest.yaml")


def test_rules_have_the_three_traps_with_trap_equal_to_id(rules):
    for trap in WASTE_TRAPS:
        assert rules[trap].trap == trap and rules[trap].layer == "L7"


def test_legacy_strict_has_exactly_the_three_traps(rules):
    found = traps(rules, legacy(), NO_GPU, strict=True)
    assert set(found) == set(WASTE_TRAPS)
    for finding in found.values():
        assert finding.subject["plugin"] == "legacy-audio-encoder"
        assert finding.evidence["metric"]
    assert found["affinity-unset"].evidence["metric_observed"] is False
    assert "not observed" in found["affinity-unset"].evidence["metric_value"]
    assert found["batch-static"].evidence["metric_observed"] is False
    assert found["version-fallback"].evidence["upper_bound"] is False
    report = Report("plugin verify")
    report.add(found.values())
    assert sorted(f["rule"] for f in report.to_dict()["waste_traps"]) == sorted(WASTE_TRAPS)


def test_affinity_unset_needs_several_devices_without_strict(rules):
    assert "affinity-unset" not in traps(rules, legacy(), NO_GPU, strict=False)
    found = traps(rules, legacy(), TWO_GPUS, strict=False)
    assert found["affinity-unset"].evidence["device_count"] == 2
    assert found["affinity-unset"].evidence["metric_observed"] is True
    assert found["affinity-unset"].evidence["metric_value"] == "met"  # GPU0 9% busy, GPU1 97% idle


def test_compliant_plugin_is_clean_even_strict(rules):
    manifest = compliant()
    picks = [pick_version(manifest.ident, "dsp-kernels", ">=1.0,<3", {"2.0.4": "/st"}, {"1.1.0": "/s"})]
    assert traps(rules, manifest, TWO_GPUS, strict=True, picks=picks) == {}


def test_fallback_pick_raises_version_fallback_with_list_marker(rules):
    manifest = compliant()
    picks = [pick_version(manifest.ident, "dsp-kernels", ">=1.0,<3", {"1.1.0": "/st"}, {"3.0.0": "/s"})]
    found = traps(rules, manifest, NO_GPU, strict=False, picks=picks)
    assert found["version-fallback"].evidence["list_marker"].startswith("(fallback)")
    assert found["version-fallback"].evidence["newest"] == "3.0.0"


def test_missing_batch_policy_is_batch_static(rules):
    manifest = replace(legacy(), batch=replace(legacy().batch, policy="", declared=False))
    found = traps(rules, manifest, NO_GPU, strict=False)
    assert "missing" in found["batch-static"].message


def test_batch_static_uses_bench_measurement_when_present(rules):
    bench = {"policy": "static", "rates": {"low": {"p99_ms": 21.2, "idle_waits": 380,
                                                   "ctx_switches_voluntary": 599}}}
    found = traps(rules, legacy(), NO_GPU, strict=False, bench=bench)
    evidence = found["batch-static"].evidence
    assert evidence["metric_observed"] is True and "21.20 ms" in evidence["metric_value"]


def test_seedance_version_incompatible_is_an_error(rules):
    manifest = replace(compliant(), seedance_version=">=9,<10")
    findings = rules.evaluate(manifest_facts(manifest, NO_GPU, False, [], bench={}))
    assert [f.severity for f in findings if f.rule == "plugin-seedance-incompatible"] == ["error"]
