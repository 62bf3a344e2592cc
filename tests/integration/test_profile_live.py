"""Live profiling on the fake driver (issue 14): a program that fragments its device gives
the verdict computed by hand; a launch storm is launch-bound for its library only, and the
energy split follows an nvidia-smi CSV fixture.

The fake driver (tests/fakecuda/fakecuda.c) places allocations first-fit over a fixed
range per device, so the addresses the shim sees are those a first-fit allocator gives.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CUDA_INCLUDE = Path("/usr/local/cuda/include")
SEEDANCE = [sys.executable, "-m", "seedance"]
MIB = 1 << 20


def _cc(*args):
    subprocess.run(["cc", *map(str, args)], check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("profile-live")
    inc = ["-I", str(CUDA_INCLUDE)] if (CUDA_INCLUDE / "cuda.h").exists() else ["-I", str(ROOT / "tests/shim/include")]
    _cc("-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Werror", *inc, "-Wl,-soname,libcuda.so.1",
        "-Wl,-Bsymbolic", ROOT / "tests/fakecuda/fakecuda.c", "-o", out / "libcuda.so.1", "-pthread")
    src = ROOT / "tests/integration/profile_workload.c"
    for lib in ("a", "b"):
        _cc("-O2", "-fPIC", "-shared", *inc, f"-DSTORM_LIB={lib}", src, "-o", out / f"libstorm_{lib}.so",
            f"-L{out}", "-l:libcuda.so.1")
    _cc("-O2", *inc, src, "-o", out / "workload", f"-L{out}", "-lstorm_a", "-lstorm_b", "-l:libcuda.so.1",
        f"-Wl,-rpath,{out}")
    return out


@pytest.fixture
def env(built, tmp_path):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("SEEDANCE_", "FAKECUDA_", "CUDA_")) and k not in ("LD_PRELOAD", "LD_AUDIT")}
    e.update(LD_LIBRARY_PATH=str(built), SEEDANCE_RUNTIME_DIR=str(tmp_path / "rt"), FAKECUDA_DEVICES="1",
             FAKECUDA_MEM="1G", XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_STATE_HOME=str(tmp_path / "state"),
             XDG_DATA_HOME=str(tmp_path / "data"))
    return e


def _worst_by_hand():
    """31 blocks of 32 MiB fill 992 MiB of 1 GiB first-fit; freeing blocks 0, 2, .., 30
    leaves 15 holes of 32 MiB and, at the top, block 30's 32 MiB merged with the 32 MiB
    never used: 16 free blocks, 17 * 32 MiB free, largest 64 MiB, ratio 64/544 < 12%."""
    free = 17 * 32 * MIB
    return {"free_blocks": 16, "free_bytes": free, "largest_free_block": 64 * MIB,
            "largest_free_ratio": 64 * MIB / free, "verdict": "danger"}


def _check_worst(evidence):
    expected = _worst_by_hand()
    assert evidence["verdict"] == expected["verdict"]
    assert evidence["free_blocks"] == expected["free_blocks"]
    assert evidence["free_bytes"] == expected["free_bytes"]
    assert evidence["largest_free_block"] == expected["largest_free_block"]
    assert evidence["largest_free_ratio"] == pytest.approx(expected["largest_free_ratio"])


def test_live_fragmenting_program(built, env, tmp_path):
    frag = tmp_path / "frag.bin"
    p = subprocess.run([*SEEDANCE, "profile", "memory", "--sample-interval", "10ms", "--output", str(frag),
                        "--json", "--", str(built / "workload"), "fragment"], env=env, capture_output=True, text=True)
    assert p.returncode == 1, p.stderr      # an error finding: danger
    report = json.loads(p.stdout)
    [finding] = [f for f in report["findings"] if f["rule"] == "gpu-memory-fragmented"]
    assert finding["severity"] == "error"
    _check_worst(finding["evidence"])
    memory = report["profile"]["memory"]
    assert memory["capacity"] == 1 << 30 and memory["base"] % (1 << 40) == 0   # the driver's fixed range
    assert memory["final"]["verdict"] == "healthy" and memory["final"]["free_blocks"] == 1
    # the holes were held 300 ms: most of that many 10 ms samples saw them
    assert sum(1 for s in memory["samples"] if s["free_blocks"] == 16) >= 5
    show = subprocess.run([*SEEDANCE, "profile", "show", str(frag), "--json"], env=env, capture_output=True, text=True)
    assert show.returncode == 0, show.stderr
    assert any(s["verdict"] == "danger" and s["free_blocks"] == 16 for s in json.loads(show.stdout)["samples"])


def test_seed_spelling_live(built, env, tmp_path):
    p = subprocess.run([sys.executable, "-m", "seedance", "profiler", "--gpu-id", "0", "--page-size", "4Ki",
                        "--sample-interval", "10ms", "--output", str(tmp_path / "frag.bin"), "--",
                        str(built / "workload"), "fragment"], env=env, capture_output=True, text=True)
    assert p.returncode == 1, p.stderr
    assert "gpu-memory-fragmented" in p.stdout and (tmp_path / "frag.bin").stat().st_size > 0


def test_attach_by_pid(built, env, tmp_path):
    run = subprocess.Popen([*SEEDANCE, "run", "--", str(built / "workload"), "fragment", "1500"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = run.stdout.readline()
        assert line.startswith("pid "), line + run.stderr.read()
        pid = int(line.split()[1])
        p = subprocess.run([*SEEDANCE, "profile", "memory", "--pid", str(pid), "--json"], env=env,
                           capture_output=True, text=True, timeout=60)
    finally:
        run.wait(timeout=60)
    assert p.returncode == 1, p.stderr
    [finding] = [f for f in json.loads(p.stdout)["findings"] if f["rule"] == "gpu-memory-fragmented"]
    _check_worst(finding["evidence"])


def test_attach_to_a_pid_not_wrapped(env):
    p = subprocess.run([*SEEDANCE, "profile", "memory", "--pid", str(os.getpid())], env=env,
                       capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.startswith("seedance: error:") and len(p.stderr.splitlines()) == 1


def _stamp(wall: float) -> str:
    return datetime.fromtimestamp(wall).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]


def test_launch_storm_and_energy_split(built, env, tmp_path):
    events = tmp_path / "ev.jsonl"
    p = subprocess.run([*SEEDANCE, "run", "--events", str(events), "--", str(built / "workload"), "storm"],
                       env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in events.read_text().splitlines()]
    start = rows[0]
    offset = start["wall"] - start["t"]
    a = [r["t"] for r in rows if r.get("ev") == "launch" and r["library"].endswith("/libstorm_a.so")]
    b = [r["t"] for r in rows if r.get("ev") == "launch" and r["library"].endswith("/libstorm_b.so")]
    assert len(a) == 1000 and len(b) == 10      # the shim saw every launch, from the right library
    # nvidia-smi log (local time, ms): 300 W from 5 ms before A's burst to 5 ms after it,
    # then 100 W until 5 ms after B's last launch, where the log ends.
    walls = [round(t + offset, 3) for t in (a[0] - 0.005, a[-1] + 0.005, b[-1] + 0.005)]
    assert a[-1] + 0.005 < b[0]                  # B starts 100 ms after A: the steps do not mix
    csv = tmp_path / "smi.csv"
    csv.write_text("timestamp, index, power.draw [W], utilization.gpu [%]\n"
                   f"{_stamp(walls[0])}, 0, 300.00 W, 99 %\n{_stamp(walls[1])}, 0, 100.00 W, 12 %\n"
                   f"{_stamp(walls[2])}, 0, 40.00 W, 0 %\n")
    expected_a = 300.0 * (walls[1] - walls[0])
    expected_b = 100.0 * (walls[2] - walls[1])
    png = tmp_path / "timeline.png"
    p = subprocess.run([*SEEDANCE, "profile", "launches", "--from-trace", str(events), "--power-csv", str(csv),
                        "--timeline", str(png), "--report-json", str(tmp_path / "r.json")],
                       env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["schema"] == "seedance.report/v1"
    libs = {Path(lib["library"]).name: lib for lib in report["profile"]["launches"]["libraries"]}
    assert libs["libstorm_a.so"]["energy_j"] == pytest.approx(expected_a, rel=1e-3)
    assert libs["libstorm_b.so"]["energy_j"] == pytest.approx(expected_b, rel=1e-3)
    assert libs["libstorm_a.so"]["energy_share"] == pytest.approx(expected_a / (expected_a + expected_b), rel=1e-3)
    bound = [f for f in report["findings"] if f["rule"] == "launch-bound"]
    assert [Path(f["evidence"]["library"]).name for f in bound] == ["libstorm_a.so"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_launches_live(built, env):
    p = subprocess.run([*SEEDANCE, "profile", "launches", "--json", "--", str(built / "workload"), "storm"],
                       env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    libs = {Path(lib["library"]).name: lib["launches"] for lib in report["profile"]["launches"]["libraries"]}
    assert libs == {"libstorm_a.so": 1000, "libstorm_b.so": 10}
    assert [Path(f["evidence"]["library"]).name for f in report["findings"] if f["rule"] == "launch-bound"] == \
        ["libstorm_a.so"]
    energy = report["profile"]["launches"]["energy"]
    assert energy["total_j"] is None and "not observed" in energy["note"]


def test_run_events_trace_gives_the_same_answer(built, env, tmp_path):
    """run --events writes the profiler's format: a device record (the fake driver's range)
    before the first allocation, then alloc/free with t/ev/dev/addr/size."""
    events = tmp_path / "ev.jsonl"
    p = subprocess.run([*SEEDANCE, "run", "--events", str(events), "--", str(built / "workload"), "fragment"],
                       env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in events.read_text().splitlines()]
    kinds = [r.get("ev") for r in rows if r.get("ev")]
    assert kinds[0] == "device" and kinds.count("alloc") == 31 and kinds.count("free") == 31
    device = rows[[r.get("ev") for r in rows].index("device")]
    assert device["capacity"] == 1 << 30 and device["base_from"] == "driver"
    allocs = sorted(r["addr"] for r in rows if r.get("ev") == "alloc")
    assert allocs == [device["base"] + i * 32 * MIB for i in range(31)]   # first fit, back to back
    p = subprocess.run([*SEEDANCE, "profile", "memory", "--from-trace", str(events), "--json"], env=env,
                       capture_output=True, text=True)
    assert p.returncode == 1, p.stderr
    [finding] = [f for f in json.loads(p.stdout)["findings"] if f["rule"] == "gpu-memory-fragmented"]
    _check_worst(finding["evidence"])
