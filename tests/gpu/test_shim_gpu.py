"""Real-GPU checks of `seedance run` (issue 4).  They skip, with the reason, without a GPU.

    tests/gpu/run.sh        builds what is needed and runs these on a GPU machine

What they prove that the fake-driver tests cannot: the real driver's cuGetProcAddress
path (libcudart >= 11.3 fetches every entry point through it) goes through the shim,
PyTorch's allocations land on the remapped device, a quota surfaces in PyTorch as
torch.cuda.OutOfMemoryError, and a SIGKILLed instance's memory is reported.
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SEEDANCE = [sys.executable, "-m", "seedance"]


def _gpu_count() -> tuple[int, str]:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return 0, f"no CUDA driver (libcuda.so.1: {exc})"
    n = ctypes.c_int(0)
    rc = cuda.cuInit(0)
    if rc != 0:
        return 0, f"cuInit failed ({rc})"
    if cuda.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value == 0:
        return 0, "the CUDA driver reports no device"
    name = ctypes.create_string_buffer(128)
    cuda.cuDeviceGetName(name, 128, 0)
    if name.value.startswith(b"Fake CUDA"):
        return 0, "only the fake test driver is on the library path"
    return n.value, ""


GPUS, WHY = _gpu_count()
pytestmark = pytest.mark.skipif(GPUS == 0, reason=f"no GPU: {WHY}")


def _torch_cuda() -> str:
    p = subprocess.run([sys.executable, "-c", "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 3)"],
                       capture_output=True, text=True)
    return "" if p.returncode == 0 else "PyTorch with CUDA is not installed here"


def run(*args, env=None, timeout=300):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run([*SEEDANCE, "run", *map(str, args)], capture_output=True, text=True, env=full,
                          timeout=timeout)


@pytest.fixture(scope="module")
def sdtest(tmp_path_factory):
    inc = Path("/usr/local/cuda/include")
    if not (inc / "cuda.h").exists() or shutil.which("cc") is None:
        pytest.skip("needs cuda.h in /usr/local/cuda/include and a C compiler")
    out = tmp_path_factory.mktemp("gpu") / "sdtest_linked"
    subprocess.run(["cc", "-O2", "-DLINKED", f"-I{inc}", str(ROOT / "tests/shim/sdtest.c"), "-o", str(out),
                    "-lcuda", "-pthread", "-ldl"], check=True)
    return out


def test_real_driver_quota_and_remap(sdtest, tmp_path):
    report = tmp_path / "r.json"
    target = GPUS - 1   # the last GPU: with two or more, a real remap away from device 0
    p = run("--affinity", f"gpu:{target}", "--mem-limit", "1G", "--report-json", report, "--",
            sdtest, "--via", "procaddr", "init", "count", "ctx:0", "alloc:536870912", "alloc:1073741824",
            "meminfo", "free:all")
    lines = p.stdout.splitlines()
    assert "count result=0 count=1" in lines, p.stdout + p.stderr
    assert lines[3] == "alloc result=0" and lines[4] == "alloc result=2", p.stdout
    assert "total=1073741824" in lines[5]
    data = json.loads(report.read_text())
    assert data["stats"]["quota_refusals"] == 1
    assert len(data["remap"]) == 1 and len(data["remap"][0]["logical_to_physical"]) == 1


def _real_cudart() -> Path | None:
    """A real libcudart: the nvidia-cuda-runtime-cu12 wheel's, else the toolkit's."""
    try:
        import nvidia.cuda_runtime as runtime
        for base in map(Path, runtime.__path__):
            if (base / "lib" / "libcudart.so.12").exists():
                return base / "lib" / "libcudart.so.12"
    except ImportError:
        pass
    for lib in (Path("/usr/local/cuda/lib64/libcudart.so"), Path("/usr/local/cuda/lib/libcudart.so")):
        if lib.exists():
            return lib
    return None


@pytest.fixture(scope="module")
def sdrt_real(tmp_path_factory):
    """tests/shim/sdrt.c linked against the REAL runtime: the paths tests/shim drives
    through the stand-in tests/fakecuda/fakecudart.c (which exists only because the real
    runtime refuses the fake driver, issue 17)."""
    lib = _real_cudart()
    if lib is None or shutil.which("cc") is None:
        pytest.skip("needs a real libcudart (nvidia-cuda-runtime-cu12 wheel or /usr/local/cuda) and a C compiler")
    out = tmp_path_factory.mktemp("gpu-rt") / "sdrt_real"
    subprocess.run(["cc", "-O2", str(ROOT / "tests/shim/sdrt.c"), "-o", str(out), f"-L{lib.parent}",
                    f"-l:{lib.name}", f"-Wl,-rpath,{lib.parent}"], check=True)
    return out


def test_real_runtime_remap_quota_and_caller(sdrt_real, tmp_path):
    """cudaMalloc through the real libcudart (which reaches the driver only through
    cuGetProcAddress): remapped, held to the quota, attributed to the program."""
    report = tmp_path / "r.json"
    target = GPUS - 1
    mib = 1 << 20
    p = run("--affinity", f"gpu:{target}", "--mem-limit", "64Mi", "--report-json", report, "--",
            sdrt_real, str(4 * mib), f"k{5 * mib}", str(60 * mib))
    lines = p.stdout.splitlines()
    assert lines[0] == "count result=0 count=1", p.stdout + p.stderr
    mallocs = [line for line in lines if line.startswith("malloc")]
    assert mallocs == ["malloc result=0", "malloc result=0", "malloc result=2"], p.stdout   # 5 + 60 > 64 MiB
    data = json.loads(report.read_text())
    assert data["calls_by_api"]["cudaMalloc"] == 3
    assert str(sdrt_real) in data["allocations_by_library"]          # the caller, not libcudart
    leaks = [f for f in data["findings"] if f["rule"] == "handle-leak"
             and f["evidence"]["library"] == str(sdrt_real)]
    assert [f["evidence"]["bytes"] for f in leaks] == [5 * mib]
    assert data["stats"]["quota_refusals"] >= 1


def test_launcher_on_the_real_driver(sdtest):
    """seedance-run (the C launcher, issue 13): the same quota and remap as `seedance run`."""
    from seedance import shim

    try:
        launcher = shim.launcher_path()
    except shim.NotAvailable as exc:
        pytest.skip(str(exc))
    p = subprocess.run([str(launcher), "--affinity", f"gpu:{GPUS - 1}", "--mem-limit", "1G", "--", str(sdtest),
                        "--via", "procaddr", "init", "count", "ctx:0", "alloc:536870912", "alloc:1073741824",
                        "free:all"], capture_output=True, text=True, timeout=300)
    lines = p.stdout.splitlines()
    assert "count result=0 count=1" in lines, p.stdout + p.stderr
    assert lines[3] == "alloc result=0" and lines[4] == "alloc result=2", p.stdout
    assert p.returncode == 0 and "handle-leak" not in p.stderr


def test_real_runtime_environment_changes_after_start_change_nothing(sdtest, tmp_path):
    """The quota is read before main on the real driver too (issue 10)."""
    p = run("--mem-limit", "1M", "--", sdtest, "--via", "procaddr", "unsetenv:SEEDANCE_MEM_LIMIT",
            "setenv:SEEDANCE_DISABLE=1", "init", "ctx:0", f"alloc:{8 << 20}")
    assert p.stdout.splitlines()[-1] == "alloc result=2", p.stdout + p.stderr


def test_torch_allocates_on_remapped_device(tmp_path):
    why = _torch_cuda()
    if why:
        pytest.skip(why)
    target = GPUS - 1
    report = tmp_path / "r.json"
    code = "import torch; x = torch.ones(64 << 20, dtype=torch.uint8, device='cuda'); " \
           "print(torch.cuda.device_count(), x.device.index)"
    p = run("--affinity", f"gpu:{target}", "--report-json", report, "--", sys.executable, "-c", code)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["1", "0"]          # one device, seen as ordinal 0
    data = json.loads(report.read_text())
    phys = {int(d["device"]) for d in data["devices"]}
    assert phys, data
    if GPUS >= 2:
        assert phys == {target}, data              # every allocation on the chosen GPU


def test_torch_quota_is_out_of_memory_error(tmp_path):
    why = _torch_cuda()
    if why:
        pytest.skip(why)
    code = textwrap.dedent("""
        import torch
        try:
            x = torch.empty(2 << 30, dtype=torch.uint8, device='cuda')
            print('allocated')
        except torch.cuda.OutOfMemoryError:
            print('OutOfMemoryError')
    """)
    p = run("--mem-limit", "1G", "--", sys.executable, "-c", code)
    assert p.stdout.strip() == "OutOfMemoryError", p.stdout + p.stderr


def test_torch_leak_of_killed_instance_is_reported(tmp_path):
    why = _torch_cuda()
    if why:
        pytest.skip(why)
    report = tmp_path / "r.json"
    code = "import os, signal, torch; x = torch.ones(256 << 20, dtype=torch.uint8, device='cuda'); " \
           "torch.cuda.synchronize(); os.kill(os.getpid(), signal.SIGKILL)"
    p = run("--report-json", report, "--", sys.executable, "-c", code)
    assert p.returncode == 137
    leaks = [f for f in json.loads(report.read_text())["findings"] if f["rule"] == "handle-leak"]
    assert leaks and sum(f["evidence"]["bytes"] for f in leaks) >= 256 << 20
    assert all(isinstance(f["evidence"]["bytes"], int) and "device" in f["evidence"] for f in leaks)
