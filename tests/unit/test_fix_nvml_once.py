"""fix cuda-mismatch checks, then checks again: NVML is probed once for both (issue 13).

The probe itself is the real one (wrapped only to count its calls); without NVML on this
machine it answers "not found", which both checks then report alike."""
import subprocess
import sysconfig
from pathlib import Path

import pytest

from seedance.collect import cuda, scan
from seedance.fix.relink import Relinker

SITE = Path(sysconfig.get_paths()["purelib"])
CU12 = SITE / "nvidia" / "cuda_runtime" / "lib"
CU13 = Path("/usr/local/cuda/lib64")


def gcc(out: Path, source: str, *args) -> Path:
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src), *args], check=True)
    return out


@pytest.fixture
def probes(monkeypatch):
    calls = []
    real = cuda.probe_nvml

    def counted():
        calls.append(1)
        return real()

    monkeypatch.setattr(cuda, "probe_nvml", counted)
    return calls


def test_a_given_probe_is_copied_and_the_command_line_still_wins(probes):
    probed = cuda.GpuInfo(driver_version="550.54.15", driver_source="nvml", nvml=True,
                          targets=[(80, "", "sm_80", "nvml")], devices=[{"index": 0, "name": "A100", "arch": "sm_80"}])
    same = scan.gpu_context(scan.CheckOptions(nvml=probed))
    assert same == probed and same is not probed and same.targets is not probed.targets
    given = scan.gpu_context(scan.CheckOptions(nvml=probed, arch="sm_90", driver_version="580.65.06"))
    assert [t[2] for t in given.targets] == ["sm_90"] and given.driver_version == "580.65.06"
    assert [t[2] for t in probed.targets] == ["sm_80"] and probed.driver_version == "550.54.15"
    assert probes == []  # neither asked NVML
    scan.gpu_context(scan.CheckOptions())
    assert probes == [1]


@pytest.mark.skipif(not (CU12 / "libcudart.so.12").exists() or not (CU13 / "libcudart.so.13").exists(),
                    reason="needs the cu12 runtime wheel and the CUDA 13 toolkit")
def test_check_and_check_again_probe_nvml_once(tmp_path, probes):
    kern = gcc(tmp_path / "libkern.so", "int cudaGetDeviceCount(int*);\nint kern(void){int n=0; return cudaGetDeviceCount(&n);}\n",
               f"-L{CU12}", "-l:libcudart.so.12", f"-Wl,-rpath,{CU12}")
    app = gcc(tmp_path / "libapp.so", "int cudaGetDeviceCount(int*);\nint app(void){int n; return cudaGetDeviceCount(&n);}\n",
              f"-L{CU13}", "-l:libcudart.so.13", f"-L{tmp_path}", "-Wl,--no-as-needed", "-l:libkern.so",
              f"-Wl,-rpath,{tmp_path}")
    relinker = Relinker([str(app)], env={})
    first = relinker.check()
    assert [f.rule for f in Relinker.relevant(first.findings)] == ["cuda-runtime-mixed"]
    assert probes == [1]
    remaining = relinker.recheck(first.findings, [str(kern)])  # nothing rewritten: the same finding
    assert relinker.rechecked == [str(app)]  # a real check of the root ran again
    assert [(f.rule, f.message) for f in remaining] == [(f.rule, f.message) for f in Relinker.relevant(first.findings)]
    assert probes == [1]
    # what the second check saw of the GPU is what the first did
    again = scan.run_check(scan.CheckOptions(targets=[str(app)], env={}, nvml=relinker.nvml))
    assert again.host["gpu"] == first.host["gpu"]
    assert probes == [1]


@pytest.mark.skipif(not (CU12 / "libcudart.so.12").exists() or not (CU13 / "libcudart.so.13").exists(),
                    reason="needs the cu12 runtime wheel and the CUDA 13 toolkit")
@pytest.mark.parametrize("collecting", [True, False])
def test_fix_leaves_the_cyclic_collector_as_it_found_it(tmp_path, monkeypatch, capsys, collecting):
    """fix cuda-mismatch runs without cyclic collection (issue 13); main() in a process that
    goes on (the agent, these tests) finds the collector as it was, after success or error."""
    import gc

    from seedance import cli

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    kern = gcc(tmp_path / "libkern.so", "int cudaGetDeviceCount(int*);\nint kern(void){int n=0; return cudaGetDeviceCount(&n);}\n",
               f"-L{CU12}", "-l:libcudart.so.12", f"-Wl,-rpath,{CU12}")
    seen = []
    real = Relinker.check

    def check(self, progress=None):
        seen.append(gc.isenabled())
        return real(self, progress)

    monkeypatch.setattr(Relinker, "check", check)
    was = gc.isenabled()
    try:
        (gc.enable if collecting else gc.disable)()
        assert cli.main(["fix", "cuda-mismatch", "--auto-relink", "--dry-run", str(kern)]) == 0
        assert gc.isenabled() is collecting
        assert cli.main(["fix", "cuda-mismatch", "--auto-relink", str(tmp_path / "gone.so")]) == 2
        assert gc.isenabled() is collecting
    finally:
        (gc.enable if was else gc.disable)()
    assert seen == [False]  # the check ran without it
    assert "nothing to relink" in capsys.readouterr().out
