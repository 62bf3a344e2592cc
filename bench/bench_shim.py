"""Benchmarks of the CUDA shim against the same program without it, in the same run.

    .venv/bin/python bench/bench_shim.py [--quick] [--rounds N]

Every figure is best and median of N interleaved rounds (each round runs every variant
once, in turn, so drift and the other load of the machine hit them alike); the machine's
core count and load average are printed with them.

1. overhead (in-process: a C loop of N calls timed with CLOCK_MONOTONIC inside
   bench_shim.c, fake driver in FAKECUDA_BUMP=1 mode so its own cost is a few ns):
   ns per cuMemAlloc_v2+cuMemFree_v2 pair with a quota, per interposed-but-not-accounted
   call (cuDeviceGetUuid_v2) and per call the shim does not interpose (cuCtxGetCurrent),
   with and without LD_PRELOAD.  Targets: <= 50 ns added per pair, <= 5 ns
   added on a pass-through call.
2. run (whole commands): 200 programs (bench_shim inittime: cuInit, print,
   exit) one after another from one shell loop, started by raw LD_PRELOAD, by
   seedance-run (the C launcher), by `seedance run` (the venv's bin/seedance: the launcher
   itself under that name, as the Makefile installs it; pip's console script instead
   would exec it after a Python start-up) and by `python -m seedance run` (the Python
   command; fewer programs, scaled to 200 and said so).  Targets: seedance-run and
   `seedance run` <= 2x raw LD_PRELOAD.
3. start-up: 200 wrapped processes started at once; time from the first spawn until the
   last cuInit returned, against 200 unwrapped ones.  Target: <= 2 s.
4. concurrency: 64 threads x 4 processes allocate and free under one shared quota; the
   fake driver's ledger must show a high-water mark <= the quota.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CUDA_INCLUDE = Path("/usr/local/cuda/include")


def build(tmp: Path) -> dict:
    inc = [f"-I{CUDA_INCLUDE}"]
    cc = ["cc", "-O2"]
    subprocess.run([*cc, "-fPIC", "-shared", "-fvisibility=hidden", *inc, "-Wl,-soname,libcuda.so.1", "-Wl,-Bsymbolic",
                    str(ROOT / "tests/fakecuda/fakecuda.c"), "-o", str(tmp / "libcuda.so.1"), "-pthread"], check=True)
    os.symlink("libcuda.so.1", tmp / "libcuda.so")
    subprocess.run([*cc, *inc, str(ROOT / "bench/bench_shim.c"), "-o", str(tmp / "bench_shim"), f"-L{tmp}", "-lcuda"],
                   check=True)
    subprocess.run([*cc, "-DLINKED", *inc, str(ROOT / "tests/shim/sdtest.c"), "-o", str(tmp / "sdtest_linked"),
                    f"-L{tmp}", "-lcuda", "-pthread", "-ldl"], check=True)
    sys.path.insert(0, str(ROOT))
    from seedance import shim
    from seedance.shim.build_shim import build_standalone

    # the tests' build (SEEDANCE_TEST_HOOKS) for the lock-holder measure: the product has none
    (tmp / "hooks").mkdir()
    build_standalone(str(tmp / "hooks" / "libseedance_shim.so"), extra=["-DSEEDANCE_TEST_HOOKS"])
    launcher = None
    try:
        launcher = str(shim.launcher_path())
    except shim.NotAvailable:
        pass
    return {"dir": tmp, "shim": str(shim.library_path()), "test_shim": str(tmp / "hooks" / "libseedance_shim.so"),
            "launcher": launcher}


def machine() -> dict:
    return {"cores": os.cpu_count(), "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()]}


def best_median(values) -> dict:
    return {"best": round(min(values), 3), "median": round(statistics.median(values), 3), "n": len(values)}


def base_env(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SEEDANCE_", "FAKECUDA_", "CUDA_"))}
    env.pop("LD_PRELOAD", None)
    env.update(LD_LIBRARY_PATH=str(tmp), SEEDANCE_RUNTIME_DIR=str(tmp / "rt"), FAKECUDA_DEVICES="2")
    return env


PIN: dict = {}   # --pin CPU: the in-process loops run on one CPU (and SCHED_FIFO as root)


def _pin():
    # in the child before exec: no taskset/chrt in between (a program started through
    # them would run unwrapped: the shim leaves the programs a process execs alone)
    os.sched_setaffinity(0, {PIN["cpu"]})
    if os.geteuid() == 0:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))


def per_call(exe, mode, n, env) -> float:
    out = subprocess.run([str(exe), mode, str(n)], env=env, capture_output=True, text=True, check=True,
                         preexec_fn=_pin if PIN else None)
    return float(out.stdout.strip())


def overhead(b, rounds, n):
    tmp = b["dir"]
    plain = dict(base_env(tmp), FAKECUDA_BUMP="1")   # the driver's own cost: a few ns
    wrapped = dict(plain, LD_PRELOAD=b["shim"], SEEDANCE_GROUP="b1", SEEDANCE_MEM_LIMIT="64G")
    events = dict(wrapped, SEEDANCE_EVENTS="1")
    modes = (("alloc", "cuMemAlloc_v2+cuMemFree_v2 pair, 64G quota"),
             ("uuid", "cuDeviceGetUuid_v2 (interposed, not accounted)"),
             ("current", "cuCtxGetCurrent (not interposed: pass-through)"))
    samples = {(m, v): [] for m, _ in modes for v in ("without", "with")}
    samples[("alloc", "events")] = []
    for _ in range(rounds):  # interleaved: every variant once per round
        for mode, _ in modes:
            samples[(mode, "without")].append(per_call(tmp / "bench_shim", mode, n, plain))
            samples[(mode, "with")].append(per_call(tmp / "bench_shim", mode, n, wrapped))
        samples[("alloc", "events")].append(per_call(tmp / "bench_shim", "alloc", n, events))
    results = {"timed": f"in-process: {n} calls in a C loop, ns per call"}
    for mode, label in modes:
        w0, w1 = samples[(mode, "without")], samples[(mode, "with")]
        results[mode] = {"call": label, "without_ns": best_median(w0), "with_ns": best_median(w1),
                         "added_ns": {"best": round(min(w1) - min(w0), 2),
                                      "median": round(statistics.median(w1) - statistics.median(w0), 2)}}
    ev = samples[("alloc", "events")]
    results["alloc_with_events"] = {"call": "pair, with SEEDANCE_EVENTS=1 (--events)", "with_ns": best_median(ev),
                                    "added_ns": {"median": round(statistics.median(ev) - statistics.median(
                                        samples[("alloc", "without")]), 2)}}
    return results


def run_commands(b, rounds, count, python_count):
    """Whole commands: `count` programs one after another from one shell loop."""
    tmp = b["dir"]
    prog = str(tmp / "bench_shim")
    seedance = str(Path(sys.executable).parent / "seedance")
    env = base_env(tmp)
    variants = {"raw LD_PRELOAD": (f"LD_PRELOAD={b['shim']} {prog} inittime", count)}
    if b["launcher"]:
        variants["seedance-run (C launcher)"] = (f"{b['launcher']} --mem-limit 8G -- {prog} inittime", count)
        # what `seedance` is on the venv's PATH: the launcher (Makefile) or pip's console script
        kind = "the launcher" if os.path.realpath(seedance) == os.path.realpath(b["launcher"]) else "console script"
        variants[f"seedance run ({kind})"] = (f"{seedance} run --mem-limit 8G -- {prog} inittime", count)
    variants["seedance run (Python)"] = (f"{sys.executable} -m seedance run --mem-limit 8G -- {prog} inittime",
                                         python_count)
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (line, n) in variants.items():
            script = f"i=0; while [ $i -lt {n} ]; do {line} >/dev/null || exit 1; i=$((i+1)); done"
            t0 = time.monotonic()
            p = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=1800)
            elapsed = time.monotonic() - t0
            if p.returncode != 0:
                raise SystemExit(f"{name}: {p.stderr.strip()[:300]}")
            times[name].append(elapsed * count / n)    # scaled to `count` programs
    raw = times["raw LD_PRELOAD"]
    out = {"timed": f"whole commands: {count} programs one after another from one sh loop, seconds for {count} "
                    f"(python -m seedance run: {python_count} programs per round, scaled to {count})"}
    for name, values in times.items():
        out[name] = {"seconds": best_median(values), "per_program_ms": round(1000 * min(values) / count, 2),
                     "x_raw": {"best": round(min(values) / min(raw), 2),
                               "median": round(statistics.median(values) / statistics.median(raw), 2)}}
    return out


def startup(b, count):
    tmp = b["dir"]
    out = {}
    for label, env in (("unwrapped", base_env(tmp)),
                       ("wrapped", dict(base_env(tmp), LD_PRELOAD=b["shim"], SEEDANCE_GROUP="b2",
                                        SEEDANCE_MEM_LIMIT="8G"))):
        t0 = time.monotonic_ns()
        procs = [subprocess.Popen([str(tmp / "bench_shim"), "inittime"], env=env, stdout=subprocess.PIPE, text=True)
                 for _ in range(count)]
        ends, failed = [], 0
        for p in procs:
            text, _ = p.communicate(timeout=60)
            rc, t = text.split()
            failed += int(rc) != 0
            ends.append(float(t))
        out[label] = {"processes": count, "failed": failed, "last_cuInit_s": round((max(ends) - t0) / 1e9, 3)}
    return out


def concurrency(b, iters):
    tmp = b["dir"]
    limit = 4 << 20   # below what 256 threads x 1 MiB want at once: the quota binds
    out = {}
    for label, wrap in (("unwrapped", False), ("wrapped", True)):
        ledger = tmp / f"ledger-{label}"
        env = dict(base_env(tmp), FAKECUDA_LEDGER=str(ledger))
        cmd = [str(tmp / "sdtest_linked"), f"procs:4:64:{iters}:1048576"]
        if wrap:  # what `seedance run --mem-limit 4M --follow-children` sets, without its Python start-up
            env.update(LD_PRELOAD=b["shim"], SEEDANCE_GROUP=f"c{iters}", SEEDANCE_MEM_LIMIT=str(limit),
                       SEEDANCE_FOLLOW="1")
        t0 = time.monotonic()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        wall = time.monotonic() - t0
        rows = [dict(kv.split("=") for kv in line.split()[1:]) for line in p.stdout.splitlines()
                if line.startswith("threads")]
        values = struct.unpack("<80Q", ledger.read_bytes()[:640])
        out[label] = {"rc": p.returncode, "wall_s": round(wall, 3), "ok": sum(int(r["ok"]) for r in rows),
                      "refused": sum(int(r["oom"]) for r in rows), "errors": sum(int(r["other"]) for r in rows),
                      "driver_high_water_bytes": values[16], "quota_bytes": limit if wrap else None,
                      "never_overcommitted": (values[16] <= limit) if wrap else None}
    return out


def killed_lock_holder(b):
    """A process SIGKILLed inside the registry lock: how long the next one takes to get in."""
    tmp = b["dir"]
    env = dict(base_env(tmp), LD_PRELOAD=b["shim"], SEEDANCE_MEM_LIMIT="1G")
    holder = subprocess.Popen([str(tmp / "sdtest_linked"), "init", "sleep:60000"],
                              env=dict(env, LD_PRELOAD=b["test_shim"], SEEDANCE_GROUP="dead1",
                                       SEEDANCE_TEST_HOLD_LOCK_MS="60000"),
                              stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    holder.kill()
    holder.wait()
    t0 = time.monotonic()
    p = subprocess.run([str(tmp / "bench_shim"), "inittime"], env=dict(env, SEEDANCE_GROUP="alive2"),
                       capture_output=True, text=True, timeout=30)
    return {"next_process_rc": p.returncode, "next_process_s": round(time.monotonic() - t0, 3),
            "deadlock": False}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds (CI smoke)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 7, --quick 3)")
    ap.add_argument("--pin", metavar="CPU", type=int,
                    help="run the in-process loops on CPU (taskset) and, as root, at SCHED_FIFO 10 (chrt): on a "
                         "shared machine the other jobs then stop preempting them; both sides get the same")
    args = ap.parse_args()
    if args.pin is not None:
        PIN["cpu"] = args.pin
    rounds, n = (3, 200000) if args.quick else (7, 2000000)
    rounds = args.rounds or rounds
    with tempfile.TemporaryDirectory(prefix="seedance-bench-shim-") as d:
        b = build(Path(d))
        result = {"machine": dict(machine(), pinned=(f"cpu {PIN['cpu']}" + (", SCHED_FIFO 10" if os.geteuid() == 0
                                                                                  else "")) if PIN else None),
                  "overhead_ns_per_call": overhead(b, rounds, n),
                  "run_200_programs": run_commands(b, rounds, 200, 10 if args.quick else 20),
                  "startup": startup(b, 200),
                  "concurrency_64x4": concurrency(b, 50 if args.quick else 400),
                  "sigkill_in_registry_lock": killed_lock_holder(b)}
        result["machine_after"] = machine()
    ov = result["overhead_ns_per_call"]
    runs = result["run_200_programs"]
    launcher = runs.get("seedance-run (C launcher)", {})
    front = next((row for name, row in runs.items() if name.startswith("seedance run (") and "Python" not in name), {})
    result["verdict"] = {
        "alloc_added_ns<=50 (median)": ov["alloc"]["added_ns"]["median"] <= 50,
        "pass_through_added_ns<=5 (median)": ov["current"]["added_ns"]["median"] <= 5,
        "interposed_not_accounted_added_ns<=5 (median)": ov["uuid"]["added_ns"]["median"] <= 5,
        "seedance-run<=2x_raw (median)": bool(launcher) and launcher["x_raw"]["median"] <= 2.0,
        "seedance_run<=2x_raw (median)": bool(front) and front["x_raw"]["median"] <= 2.0,
        "startup_200_wrapped<=2s": result["startup"]["wrapped"]["last_cuInit_s"] <= 2.0
                                   and result["startup"]["wrapped"]["failed"] == 0,
        "never_overcommitted": result["concurrency_64x4"]["wrapped"]["never_overcommitted"],
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
