#!/usr/bin/env python3
"""Cost of `seedance trace` per cuMemAlloc_v2, against the peers, in one run.

    sudo .venv/bin/python bench/bench_trace.py [--calls N] [--repeat R]

The workload (bench/trace_alloc_loop.c) calls cuMemAlloc_v2 N times, then cuMemFree_v2
N times, through the tests' fake libcuda.so.1, and times its own loops.  Configurations,
each the best of R runs:
  untraced       the program alone
  shim           under `seedance run` (LD_PRELOAD of libseedance_shim.so)
  seedance trace under `seedance trace -q`: uprobe + uretprobe, the allocation kept in a
                 kernel map (what -q, and the leak report, need)
  ... streaming  under `seedance trace --json`: plus one ring-buffer event per call, read
                 and printed by Python (on a 2-core host it competes with the workload)
  bare uprobe    the peer: a bcc uprobe that only counts, on the same function
  bare u+uret    the peer with a return probe too (what an allocation needs to read the pointer)
Prints ns per call and what each adds over the untraced call.  Needs root (eBPF); without
it the eBPF rows say why and the others still run.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".venv" / "bin"
CUDA_INCLUDE = Path("/usr/local/cuda/include")


def build(out: Path) -> tuple:
    inc = ["-I", str(CUDA_INCLUDE)]
    fake = out / "libcuda.so.1"
    subprocess.run(["cc", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", *inc, "-Wl,-soname,libcuda.so.1",
                    str(ROOT / "tests/fakecuda/fakecuda.c"), "-o", str(fake), "-pthread"], check=True)
    program = out / "trace_alloc_loop"
    subprocess.run(["cc", "-O2", *inc, str(ROOT / "bench/trace_alloc_loop.c"), "-o", str(program),
                    f"-L{out}", "-l:libcuda.so.1", f"-Wl,-rpath,{out}"], check=True)
    return program, fake


def measure(cmd: list, env=None) -> tuple:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    match = re.search(r"alloc_ns ([\d.]+) free_ns ([\d.]+)", proc.stdout)
    if not match:
        raise RuntimeError(f"{' '.join(map(str, cmd))}: {proc.returncode}\n{proc.stdout}{proc.stderr}")
    return float(match.group(1)), float(match.group(2))


def median_of(repeat: int, cmd: list, env=None) -> tuple:
    """Best of ``repeat`` runs: on a shared host, noise only ever adds time."""
    runs = [measure(cmd, env) for _ in range(repeat)]
    return min(r[0] for r in runs), min(r[1] for r in runs)


def bare_uprobe(fake: Path, program: list, repeat: int, with_return: bool) -> tuple:
    from bcc import BPF

    bpf = BPF(text=(ROOT / "probes" / "bare_uprobe.bpf.c").read_text())
    try:
        for symbol in ("cuMemAlloc_v2", "cuMemFree_v2"):
            bpf.attach_uprobe(name=str(fake), sym=symbol, fn_name="bare_enter")
            if with_return:
                bpf.attach_uretprobe(name=str(fake), sym=symbol, fn_name="bare_return")
        return median_of(repeat, program)
    finally:
        bpf.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if shutil.which("cc") is None or not (CUDA_INCLUDE / "cuda.h").exists():
        print("bench_trace: needs cc and /usr/local/cuda/include/cuda.h", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from seedance.trace import env as trace_env

    others = [line for line in subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
              if "seedance trace" in line and str(os.getpid()) not in line.split()[0]]
    if others:
        print("bench_trace: warning: another `seedance trace` is running; its probes on the same "
              "library inflate every row:\n  " + "\n  ".join(others), file=sys.stderr)
    out = Path(tempfile.mkdtemp(prefix="seedance-bench-trace-"))
    try:
        program, fake = build(out)
        workload = [str(program), str(args.calls)]
        rows = [("untraced", median_of(args.repeat, workload))]
        rows.append(("shim (seedance run)", median_of(args.repeat, [str(BIN / "seedance"), "run", "--", *workload])))
        problem = trace_env.ebpf_problem()
        if problem:
            print(f"bench_trace: eBPF rows skipped: {problem}", file=sys.stderr)
        else:
            rows.append(("seedance trace", median_of(args.repeat, [str(BIN / "seedance"), "trace", "-q", "--", *workload])))
            rows.append(("seedance trace (streaming)", median_of(args.repeat, [str(BIN / "seedance"), "trace", "--json", "--", *workload])))
            rows.append(("bare uprobe (peer)", bare_uprobe(fake, workload, args.repeat, with_return=False)))
            rows.append(("bare uprobe+uretprobe (peer)", bare_uprobe(fake, workload, args.repeat, with_return=True)))
        base_alloc, base_free = rows[0][1]
        print(f"cuMemAlloc_v2 / cuMemFree_v2 through the fake driver, {args.calls} calls, best of {args.repeat} runs")
        print(f"{'configuration':<30} {'alloc ns':>10} {'+ns':>10} {'free ns':>10} {'+ns':>10}")
        for name, (alloc, free) in rows:
            print(f"{name:<30} {alloc:>10.1f} {alloc - base_alloc:>10.1f} {free:>10.1f} {free - base_free:>10.1f}")
        named = dict(rows)
        if "seedance trace" in named:
            trace_added = named["seedance trace"][0] - base_alloc
            peer_added = named["bare uprobe+uretprobe (peer)"][0] - base_alloc
            shim_added = named["shim (seedance run)"][0] - base_alloc
            print(f"seedance trace adds {trace_added:.0f} ns per cuMemAlloc_v2: "
                  f"{trace_added / peer_added:.2f}x a bare uprobe+uretprobe ({peer_added:.0f} ns), "
                  f"{trace_added / shim_added if shim_added > 0 else float('inf'):.1f}x the shim ({shim_added:.0f} ns)")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
