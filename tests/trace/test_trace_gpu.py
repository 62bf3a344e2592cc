"""Real GPU: the runtime probes (cudaMalloc/cudaFree in the real libcudart) against the real
driver.  Skips without a GPU; on a GPU host it runs as root with real eBPF."""
from __future__ import annotations

import ctypes.util
from pathlib import Path

import pytest

from trace_helpers import FIXTURES, _cc, findings, trace, wheel_runtime


def _gpu_problem() -> str | None:
    if not Path("/dev/nvidiactl").exists():
        return "no NVIDIA GPU (/dev/nvidiactl missing)"
    if ctypes.util.find_library("cuda") is None:
        return "no NVIDIA driver library (libcuda.so.1)"
    return None


@pytest.mark.skipif(_gpu_problem() is not None, reason=str(_gpu_problem()))
def test_cudamalloc_leak_is_counted_once_at_the_runtime_api(ebpf, tmp_path):
    runtime = wheel_runtime("12")
    if runtime is None:
        pytest.skip("needs the nvidia-cuda-runtime-cu12 wheel")
    program = tmp_path / "runtime_alloc"
    _cc("-O2", FIXTURES / "runtime_alloc.c", "-o", program, "-ldl")
    proc, report = trace("--", program, runtime, "0", "1048576", "-4096", "777")
    assert "leaked 1049353" in proc.stderr, proc.stdout + proc.stderr  # the command's stdout: on stderr
    # the runtime may also keep internal driver allocations of its own (library: libcudart);
    # the program's are the ones attributed to the program
    leaks = [f for f in findings(report, "handle-leak") if f["evidence"]["library"] == str(program)]
    assert len(leaks) == 1, report["findings"]
    evidence = leaks[0]["evidence"]
    # counted at cudaMalloc, not again at the cuMemAlloc the runtime makes inside it
    assert evidence["bytes"] == 1049353 and evidence["api"] == "cudaMalloc"
    assert evidence["device"] == 0 and evidence["allocations"] == 2
