#!/usr/bin/env python3
"""check's tree walk in C (elf/treewalk.c) against the Python walk (scan.py), in process.

    .venv/bin/python bench/bench_walk.py [--rounds 7] [DIR...]

What is timed: Scanner._walk(DIR) as a check calls it (listing, links, the 4-byte sniff of
every file that may be ELF, the stat of what is kept), nothing else; the C walk on one
thread and on two (as a check uses it where a second core is free), the Python walk in one
process (SEEDANCE_JOBS=1) and shared with its helper process where it would be.  Rounds
interleave the four, rotating which goes first; best and median of the rounds, with the
core count and the load.  Each variant's result is checked to be the Python walk's.
Default trees: /usr/lib/x86_64-linux-gnu and this venv's site-packages.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VARIANTS = {  # name -> (SEEDANCE_WALK, SEEDANCE_JOBS)
    "C, two threads": (None, None),
    "C, one thread": (None, "1"),
    "Python, one process": ("python", "1"),
    "Python, with its helper": ("python", None),
}


def set_env(name, value):
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def walk_once(directory: str, walk_mode, jobs) -> tuple:
    from seedance.collect.scan import CheckOptions, Scanner

    set_env("SEEDANCE_WALK", walk_mode)
    set_env("SEEDANCE_JOBS", jobs)
    scanner = Scanner(CheckOptions(targets=[directory]))
    start = time.perf_counter()
    found = scanner._walk(directory)
    elapsed = time.perf_counter() - start
    result = ([(path, st.st_ino) for path, st in found],
              {k: scanner.stats.get(k, 0) for k in ("files", "skipped", "unreadable")}, scanner.errors)
    return elapsed, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directories", nargs="*", metavar="DIR")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    trees = args.directories or [d for d in ("/usr/lib/x86_64-linux-gnu", sysconfig.get_paths()["purelib"])
                                 if os.path.isdir(d)]
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load {load[0]:.1f}/{load[1]:.1f} (1/5 min) before; "
          f"{args.rounds} rounds, interleaved; in process: Scanner._walk only")
    names = list(VARIANTS)
    failed = 0
    for tree in trees:
        times = {name: [] for name in names}
        reference = None
        for name in names:  # an untimed warm-up of each (page cache, imports)
            _, result = walk_once(tree, *VARIANTS[name])
            if name == "Python, one process":
                reference = result
        for index in range(args.rounds):
            order = names[index % len(names):] + names[:index % len(names)]
            for name in order:
                elapsed, result = walk_once(tree, *VARIANTS[name])
                if result != reference:
                    print(f"  {name}: a result unlike the Python walk's on {tree}")
                    failed = 1
                times[name].append(elapsed)
        found, stats, _errors = reference
        print(f"{tree}: {stats['files']} files, {len(found)} ELF")
        for name in names:
            print(f"  {name:26} best {min(times[name]) * 1000:7.1f} ms  median "
                  f"{statistics.median(times[name]) * 1000:7.1f} ms")
    load = os.getloadavg()
    print(f"load after: {load[0]:.1f}/{load[1]:.1f}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
