#!/usr/bin/env python3
"""`seedance check --python PY --imports ...` against just trying the import, interleaved.

    .venv/bin/python bench/bench_imports.py [--rounds 5] [--python .venv/bin/python] [--sets torch torch,numpy]
        [--site DIR]   (a site-packages put first on PYTHONPATH for every command: e.g. one of the
                        accuracy corpus's environments, torch 2.4.1 with torchvision 0.19.1)

Every row is a whole command as a user runs it (process start-up included):
  import               PY -c "import A, B"  (executes the packages: the oracle the prediction replaces)
  seedance cold        seedance check --python PY --imports A,B, with an empty cache directory
                       (XDG_CACHE_HOME of its own: the first run of a user; it stores its entry)
  seedance warm        the same command again on unchanged files, answered from the prediction
                       cache (an untimed run just before each timed one fills it: seedance's own
                       files are part of the key, and a checkout being edited changes them)
Rounds interleave the three (rotating which goes first), so load drifts hit all of them;
best and median wall time of the rounds and each command's peak RSS (getrusage of the
child from wait4, the children it waited for included) are printed, with the core count
and the load average.
Targets: cold within 1.5x of the import's wall time and at most its peak RSS; warm within
0.3x.  A target is met when the best and the median round both meet it; exit 1 when one is
missed.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEEDANCE = ROOT / ".venv" / "bin" / "seedance"


def run(cmd: list, env: dict) -> tuple:
    """(wall s, peak RSS MB, exit code) of one whole command."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)}: exit {code}: {err.strip()[-400:]}")
    return wall, usage.ru_maxrss / 1024, code


def bench_set(names: str, python: str, rounds: int, site: str | None = None) -> dict:
    base = dict(os.environ)
    base.pop("SEEDANCE_CACHE", None)
    if site:
        base["PYTHONPATH"] = site
    warm_home = tempfile.mkdtemp(prefix="bench-imports-warm-")
    check = [str(SEEDANCE), "check", "--python", python, "--imports", names]
    commands = {
        "import": ([python, "-c", "import " + ", ".join(names.split(","))], None),
        "seedance cold": (check, "cold"),
        "seedance warm": (check, warm_home),
    }
    results: dict = {label: [] for label in commands}
    try:
        for index in range(rounds):
            order = list(commands)
            order = order[index % len(order):] + order[:index % len(order)]
            for label in order:
                cmd, home = commands[label]
                env = dict(base)
                cold_home = None
                if home == "cold":
                    cold_home = tempfile.mkdtemp(prefix="bench-imports-cold-")
                    env["XDG_CACHE_HOME"] = cold_home
                elif home is not None:
                    env["XDG_CACHE_HOME"] = home
                    run(cmd, env)  # fills the cache the timed run answers from
                try:
                    results[label].append(run(cmd, env))
                finally:
                    if cold_home is not None:
                        shutil.rmtree(cold_home, ignore_errors=True)
    finally:
        shutil.rmtree(warm_home, ignore_errors=True)
    return results


def summary(samples: list) -> tuple:
    walls = [s[0] for s in samples]
    return min(walls), statistics.median(walls), max(s[1] for s in samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--sets", nargs="+", default=["torch", "torch,numpy"],
                        help="comma-separated import lists, one benchmark each")
    parser.add_argument("--site", help="a site-packages directory put on PYTHONPATH for every command")
    args = parser.parse_args()
    if args.site and not os.path.isdir(args.site):
        raise SystemExit(f"{args.site}: no such directory")
    if not SEEDANCE.exists():
        raise SystemExit(f"{SEEDANCE}: not built (make install)")
    print(f"{os.cpu_count()} cores, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
          f"{args.rounds} interleaved rounds, python {args.python}" + (f", PYTHONPATH {args.site}" if args.site else ""))
    missed = []
    for names in args.sets:
        results = bench_set(names, args.python, args.rounds, args.site)
        imp_best, imp_median, imp_rss = summary(results["import"])
        print(f"\n--imports {names}")
        print(f"  {'command':<16} {'best s':>8} {'median s':>9} {'peak MB':>8} {'best x':>7} {'median x':>9}")
        for label, samples in results.items():
            best, median, rss = summary(samples)
            print(f"  {label:<16} {best:8.3f} {median:9.3f} {rss:8.0f} {best / imp_best:7.2f} "
                  f"{median / imp_median:9.2f}")
        cold_best, cold_median, cold_rss = summary(results["seedance cold"])
        warm_best, warm_median, _warm_rss = summary(results["seedance warm"])
        checks = [
            (f"cold within 1.5x of the import ({names})",
             cold_best <= 1.5 * imp_best and cold_median <= 1.5 * imp_median),
            (f"cold peak RSS at most the import's ({names})", cold_rss <= imp_rss),
            (f"warm within 0.3x of the import ({names})",
             warm_best <= 0.3 * imp_best and warm_median <= 0.3 * imp_median),
        ]
        for what, met in checks:
            print(f"  target {what}: {'met' if met else 'MISSED'}")
            if not met:
                missed.append(what)
    print(f"\nload after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
