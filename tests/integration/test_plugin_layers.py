"""The seven-layer check on real objects: GLIBC/GLIBCXX nodes the host lacks (built against
stubs), a fatbin built by nvcc for the wrong arch, --force-arch, and the check entry point."""
from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import load_example_builder

from seedance.plugins.layers import main_for_check, run_layers
from seedance.plugins.store import Store

LINE = re.compile(r"^(INFO|WARNING|ERROR|FATAL) L[1-7]: ")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if not shutil.which("gcc"):
        pytest.skip("gcc not found")
    out = tmp_path_factory.mktemp("layers")
    builder = load_example_builder()
    for name in ("future-toolchain", "legacy-audio-encoder", "audio-encoder-v2.0.5"):
        builder.build(name, out)
    return out


@pytest.fixture(scope="module")
def fatbin_plugin(tmp_path_factory):
    builder = load_example_builder()
    if not builder.have_nvcc():
        pytest.skip("nvcc not found: fatbin-kernels needs the CUDA toolkit")
    return builder.build("fatbin-kernels", tmp_path_factory.mktemp("fatbin"))


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "plugins")


def by_layer(lines):
    return {line.split(":")[0]: line for line in lines}


def test_every_layer_reports_and_lines_have_the_form(built, store):
    report, lines = run_layers(built / "audio-encoder-v2.0.5", strict=True, store=store, sources=[])
    assert all(LINE.match(line) for line in lines), lines
    assert [line.split(":")[0].split()[1] for line in lines[:7]] == [f"L{n}" for n in range(1, 8)]
    assert "GLIBC version node" in lines[1]  # libm's cos@GLIBC_2.x, really read from the ELF
    assert "torch" in lines[5]


def test_glibc_and_glibcxx_nodes_missing_on_this_host(built, store):
    report, lines = run_layers(built / "future-toolchain", strict=False, store=store, sources=[])
    layer = by_layer(lines)
    assert "GLIBC_2.99" in layer["ERROR L2"] and "libc.so.6" in layer["ERROR L2"]
    assert "GLIBCXX_3.4.99" in layer["ERROR L3"]
    rules = {f.rule: f for f in report.findings}
    assert rules["plugin-glibc-version-missing"].evidence["newest_here"].startswith("GLIBC_2.")
    assert all(f.subject["plugin"] == "future-toolchain" for f in report.findings)
    assert report.exit_code() == 1


def test_fatbin_for_the_wrong_arch_is_error_l5(fatbin_plugin, store):
    report, lines = run_layers(fatbin_plugin, strict=False, store=store, sources=[])
    l5 = by_layer(lines)["ERROR L5"]
    assert "sm_86" in l5 and "sm_75" in l5
    finding = next(f for f in report.findings if f.rule == "cuda-arch-missing")
    assert finding.evidence["target_source"] == "manifest cuda.archs"
    # pinned to the arch it was built for, L5 is clean; a newer arch of another major is not
    report, lines = run_layers(fatbin_plugin, strict=False, force_arch="sm_75", store=store, sources=[])
    assert not [f for f in report.findings if f.layer == "L5"]
    assert "--force-arch" in by_layer(lines)["INFO L5"]
    report, _ = run_layers(fatbin_plugin, strict=False, force_arch="sm_90", store=store, sources=[])
    assert [f.rule for f in report.findings if f.layer == "L5"] == ["cuda-arch-missing"]


def test_fatbin_plugin_install_refused_then_pinned(cli, fatbin_plugin, tmp_path):
    env = {"XDG_DATA_HOME": str(tmp_path / "data")}
    proc = cli("plugin", "install", fatbin_plugin, env=env)
    assert proc.returncode == 1 and any(l.startswith("ERROR L5: ") for l in proc.stdout.splitlines())
    proc = cli("plugin", "install", fatbin_plugin, "--no-deps", "--force-arch=sm_75", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "--no-deps: skipped dependency fatbin-kernels 1.0.0: none declared" in proc.stdout
    # verify remembers the pinned arch
    verify = json.loads(cli("plugin", "verify", "fatbin-kernels", "--report-json", "-", env=env).stdout)
    assert not [f for f in verify["findings"] if f["layer"] == "L5"]


def test_invalid_manifest_is_fatal_l7(tmp_path, store):
    plugin = tmp_path / "broken"
    plugin.mkdir()
    (plugin / "manifest.yaml").write_text("name: broken\nversion: 1.0\nentry: {}\n")
    report, lines = run_layers(plugin, strict=False, store=store, sources=[])
    assert len(lines) == 1 and lines[0].startswith("FATAL L7: ") and "line" in lines[0]
    assert report.exit_code() == 1


def test_missing_entry_library_is_fatal_l7(built, tmp_path, store):
    plugin = tmp_path / "nolib"
    shutil.copytree(built / "legacy-audio-encoder", plugin)
    (plugin / "lib" / "libaudioenc.so").unlink()
    _report, lines = run_layers(plugin, strict=False, store=store, sources=[])
    assert any(l.startswith("FATAL L7: ") and "lib/libaudioenc.so is missing" in l for l in lines)


def test_main_for_check_prints_lines_and_returns_exit_code(built, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    args = argparse.Namespace(plugin=str(built / "legacy-audio-encoder"), strict=True, force_arch=None,
                              report_json=None)
    assert main_for_check(args) == 1
    out = capsys.readouterr().out.splitlines()
    assert sum(l.startswith("WARNING L7: ") for l in out) == 3
    args = argparse.Namespace(plugin=str(built / "legacy-audio-encoder"), strict=False, force_arch=None,
                              report_json="-")
    assert main_for_check(args) == 0  # warnings only, not strict
    report = json.loads(capsys.readouterr().out)
    assert report["command"] == "check --plugin"


def _abi_plugin(root: Path, old_abi: bool) -> Path:
    """A plugin whose library calls into torch's c10 with a std::string in the signature."""
    torch = pytest.importorskip("torch")
    if not shutil.which("g++"):
        pytest.skip("g++ not found")
    import subprocess

    lib_dir = Path(torch.__file__).parent / "lib"
    plugin = root / ("old-abi" if old_abi else "new-abi")
    (plugin / "lib").mkdir(parents=True)
    (plugin / "ext.cc").write_text(
        "#include <string>\nnamespace c10 { void seedance_probe(const std::string&); }\n"
        "extern \"C\" void entry() { c10::seedance_probe(std::string(\"x\")); }\n")
    subprocess.run(["g++", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={0 if old_abi else 1}",
                    "-o", str(plugin / "lib/libext.so"), str(plugin / "ext.cc"),
                    f"-L{lib_dir}", "-Wl,--no-as-needed", "-lc10"], check=True)
    (plugin / "manifest.yaml").write_text(
        f"name: {plugin.name}\nversion: 1.0.0\nseedance_version: '>=0.1,<1'\n"
        "entry:\n  libraries: [lib/libext.so]\ndevice_affinity: auto\nbatch_policy: adaptive\n")
    return plugin


@pytest.mark.parametrize("old_abi", [True, False])
def test_cxx_abi_of_a_torch_extension_against_the_real_torch(tmp_path, store, old_abi):
    report, lines = run_layers(_abi_plugin(tmp_path, old_abi), strict=False, store=store, sources=[])
    rules = {f.rule for f in report.findings}
    l3 = next(line for line in lines if " L3: " in line)
    if old_abi:  # torch 2.x wheels use the cxx11 ABI: an Ss-mangled import never binds
        assert "cxx-abi-mismatch" in rules and l3.startswith("ERROR L3"), l3
    else:
        assert "cxx-abi-mismatch" not in rules and l3.startswith("INFO L3"), l3
