"""Real-GPU profile of a PyTorch training loop (issue 14).  Skips, with the reason, without
a GPU or without a CUDA build of PyTorch.

    tests/gpu/run.sh        builds the shim and runs these on a GPU machine

What the fake driver cannot show: PyTorch's caching allocator and its kernel launches as
the real driver sees them through the shim.  The loop below launches many small kernels
per step from libtorch_cuda/libcudnn/libcublas*, so launches must be attributed to those
libraries (never to the shim or to nobody), and its allocations land in the address map
of the device the program used.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_shim_gpu import GPUS, SEEDANCE, WHY, _torch_cuda  # noqa: E402

pytestmark = pytest.mark.skipif(GPUS == 0, reason=f"no GPU: {WHY}")

TRAIN = textwrap.dedent("""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)]).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256, device="cuda")
    for step in range(200):
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        if step % 50 == 0:   # allocations of changing size: the caching allocator grows segments
            big = torch.empty(int(32e6) * (1 + step // 50), device="cuda"); del big
    torch.cuda.synchronize()
    print("loss", float(loss))
""")


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    why = _torch_cuda()
    if why:
        pytest.skip(why)
    path = tmp_path_factory.mktemp("gpu-profile") / "train.py"
    path.write_text(TRAIN)
    return path


def _seedance(*args, timeout=600):
    return subprocess.run([*SEEDANCE, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ))


def test_training_loop_launches(script, tmp_path):
    report = tmp_path / "launches.json"
    p = _seedance("profile", "launches", "--report-json", report, "--timeline", tmp_path / "t.png", "--",
                  sys.executable, script)
    assert p.returncode in (0, 1), p.stderr
    section = json.loads(report.read_text())["profile"]["launches"]
    libs = {Path(lib["library"]).name: lib for lib in section["libraries"]}
    # 200 steps of 8 layers forward and backward plus the optimiser: thousands of launches
    assert section["launches"] >= 200 * 8 * 2, libs.keys()
    assert any(name.startswith(("libtorch_cuda", "libcublas", "libcudnn", "libc10_cuda")) for name in libs), libs.keys()
    assert not any("seedance_shim" in name for name in libs)
    energy = section["energy"]
    if energy["total_j"] is not None:   # live NVML on this GPU
        assert energy["total_j"] > 0 and sum(lib["energy_j"] for lib in section["libraries"]) <= energy["total_j"] + 1e-6
    else:
        assert "not observed" in energy["note"]
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def test_training_loop_memory(script, tmp_path):
    p = _seedance("profile", "memory", "--gpu-id", "0", "--sample-interval", "10ms", "--output", tmp_path / "f.bin",
                  "--json", "--", sys.executable, script)
    assert p.returncode in (0, 1), p.stderr
    memory = json.loads(p.stdout)["profile"]["memory"]
    assert memory["capacity"] > 1 << 30 and memory["events"] > 0
    # the segments torch reserved were seen live: some sample held at least the 32e6 floats
    assert max(s["used_bytes"] for s in memory["samples"]) >= 128_000_000
    show = _seedance("profile", "show", tmp_path / "f.bin", "--json")
    assert show.returncode == 0 and json.loads(show.stdout)["samples"]
