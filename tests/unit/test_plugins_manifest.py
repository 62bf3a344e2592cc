"""Manifest loading and validation: every example loads; errors name the field and line."""
from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from seedance.model.errors import BadInput
from seedance.plugins import manifest as mf

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "plugins"
COMPLIANT = (EXAMPLES / "audio-encoder-v2.0.5" / "manifest.yaml").read_text()


def line_of(text: str, needle: str) -> int:
    for number, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in text")


def test_schema_is_valid_draft_2020_12():
    jsonschema.Draft202012Validator.check_schema(json.loads(mf.SCHEMA_PATH.read_text()))


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*/manifest.yaml")), ids=lambda p: p.parent.name)
def test_every_example_manifest_loads(path):
    manifest = mf.load_manifest(path)
    assert manifest.name and manifest.version
    assert path.parent.name.startswith(manifest.name)


def test_compliant_manifest_normalised():
    manifest = mf.load_manifest(EXAMPLES / "audio-encoder-v2.0.5" / "manifest.yaml")
    assert manifest.device_affinity == "auto"
    assert (manifest.batch.policy, manifest.batch.max_batch_size, manifest.batch.max_wait_ms) == ("adaptive", 32, 20.0)
    assert manifest.depends == {"dsp-kernels": ">=1.0,<3"}
    assert manifest.cuda_runtime == 12 and manifest.cuda_archs == ("sm_86", "sm_90")
    assert manifest.line_of("device_affinity") == line_of(COMPLIANT, "device_affinity:")


def test_legacy_manifest_has_the_three_traps_in_its_data():
    manifest = mf.load_manifest(EXAMPLES / "legacy-audio-encoder" / "manifest.yaml")
    assert manifest.device_affinity is None
    assert manifest.batch.policy == "static"
    assert manifest.seedance_version == "0.1"  # a YAML float, kept as the range text
    assert not mf.has_upper_bound(manifest.seedance_version)


def test_string_batch_policy_and_missing_policy():
    text = COMPLIANT.replace("batch_policy:\n  policy: adaptive\n  max_batch_size: 32\n  max_wait_ms: 20\n",
                             "batch_policy: static\n")
    assert mf.load_manifest("m.yaml", text=text).batch.policy == "static"
    text = COMPLIANT.replace("batch_policy:\n  policy: adaptive\n  max_batch_size: 32\n  max_wait_ms: 20\n", "")
    batch = mf.load_manifest("m.yaml", text=text).batch
    assert batch.policy == "" and not batch.declared


BAD = [
    # (replace, by, field named, line needle)
    ("max_batch_size: 32", "max_batch_size: big", "batch_policy.max_batch_size", "max_batch_size: big"),
    ("max_batch_size: 32", "max_batch_size: 0", "batch_policy.max_batch_size", "max_batch_size: 0"),
    ("  policy: adaptive", "  policy: dynamic", "batch_policy.policy", "policy: dynamic"),
    ("max_wait_ms: 20", "max_wait: 20", "batch_policy.max_wait", "max_wait: 20"),
    ("device_affinity: auto", "device_affinity: gpu-1", "device_affinity", "device_affinity: gpu-1"),
    ("bench: audio_bench", "benchmark: audio_bench", "benchmark", "benchmark:"),
    ('seedance_version: ">=0.1,<1"', 'seedance_version: "newest please"', "seedance_version", "seedance_version"),
    ('  dsp-kernels: ">=1.0,<3"', '  dsp-kernels: [1, 2]', "depends.dsp-kernels", "dsp-kernels: [1, 2]"),
    ("  runtime: 12", "  runtime: twelve", "cuda.runtime", "runtime: twelve"),
    ("  libraries: [lib/libaudioenc.so]", "  libraries: [/abs/libaudioenc.so]", "entry.libraries.0", "libraries:"),
    ("name: audio-encoder\n", "", "name", None),
]


@pytest.mark.parametrize("old,new,field,needle", BAD, ids=[b[2] for b in BAD])
def test_bad_manifest_error_names_field_and_line(old, new, field, needle):
    assert old in COMPLIANT
    text = COMPLIANT.replace(old, new, 1)
    with pytest.raises(BadInput) as info:
        mf.load_manifest("plug/manifest.yaml", text=text)
    message = str(info.value)
    assert "\n" not in message
    assert f"field '{field}'" in message
    match = re.search(r"line (\d+)", message)
    assert match, message
    if needle:
        assert int(match.group(1)) == line_of(text, needle)


def test_yaml_syntax_error_has_line():
    with pytest.raises(BadInput) as info:
        mf.load_manifest("m.yaml", text="name: x\nversion: [1.0\n")
    assert "line" in str(info.value) and "not valid YAML" in str(info.value)


def test_not_a_mapping():
    with pytest.raises(BadInput, match="mapping"):
        mf.load_manifest("m.yaml", text="- a\n- b\n")


@pytest.mark.parametrize("text,bounded", [("2.0", False), (">=2.0", False), (">=0.1,<1", True),
                                          ("~=1.2", True), ("==2.0.5", True), ("!=1.0", False)])
def test_upper_bound(text, bounded):
    assert mf.has_upper_bound(text) is bounded


def test_bare_version_means_at_least():
    spec = mf.parse_range("2.0")
    assert spec.contains("2.0.5") and spec.contains("9.0") and not spec.contains("1.9")


def test_overrides_keep_comments_and_record_values():
    text = mf.apply_overrides(COMPLIANT, "m.yaml", affinity="npu0", batch_policy="static")
    assert text.splitlines()[0] == COMPLIANT.splitlines()[0]  # the comment survives
    manifest = mf.load_manifest("m.yaml", text=text)
    assert manifest.device_affinity == "npu0" and manifest.batch.policy == "static"
    assert manifest.batch.max_batch_size == 32


def test_override_adds_batch_policy_mapping_when_missing():
    legacy = (EXAMPLES / "legacy-audio-encoder" / "manifest.yaml").read_text()
    text = legacy.replace("batch_policy:\n  policy: static\n  max_batch_size: 32\n  max_wait_ms: 20\n", "")
    manifest = mf.load_manifest("m.yaml", text=mf.apply_overrides(text, "m.yaml", batch_policy="adaptive"))
    assert manifest.batch.policy == "adaptive" and manifest.batch.declared


def test_bad_override_is_rejected_with_field():
    with pytest.raises(BadInput, match="device_affinity"):
        mf.apply_overrides(COMPLIANT, "m.yaml", affinity="gpu-two")


def test_bare_float_range_keeps_its_spelling():
    text = COMPLIANT.replace('seedance_version: ">=0.1,<1"', "seedance_version: 0.10")
    text = text.replace('  dsp-kernels: ">=1.0,<3"', "  dsp-kernels: 1.50")
    manifest = mf.load_manifest("m.yaml", text=text)
    assert manifest.seedance_version == "0.10"
    assert manifest.depends == {"dsp-kernels": "1.50"}


@pytest.mark.parametrize("old, new", [
    ("name: audio-encoder", 'name: "audio-encoder\\n"'),
    ("version: 2.0.5", 'version: "2.0.5\\n"'),
])
def test_a_trailing_newline_fails_the_schema_pattern(old, new):
    """JSON Schema patterns are ECMA-262, where `$` is the end of the string; Python's `$` also
    matched before a final newline, so "audio-encoder\\n" passed `^[a-z0-9...]$` and split the
    rows of `plugin list`."""
    assert old in COMPLIANT
    with pytest.raises(BadInput):
        mf.load_manifest("m.yaml", text=COMPLIANT.replace(old, new, 1))
