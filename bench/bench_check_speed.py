#!/usr/bin/env python3
"""Speed of `seedance check` on a whole library tree against its peers, interleaved in one run.

    .venv/bin/python bench/bench_check_speed.py [DIR...] [--rounds 5] [--no-ldd]
    .venv/bin/python bench/bench_check_speed.py --big        (site-packages + /usr/local/cuda)
    .venv/bin/python bench/bench_check_speed.py --ldd FILE   (seedance ldd FILE against ldd, libtree)

Every row times a whole command (process start-up included), over the same ELF files (the
roots check itself would close: one per inode, listed with check's own walker):
  seedance check DIR...     NEEDED resolution, every verneed against its verdef, symbol-version
                            gaps, CUDA fatbins and runtimes, the torch C++ ABI check
  libtree F1 F2 ...         ONE libtree process over all the files (a static resolver in C)
  lddtree F1 F2 ...         ONE lddtree process (Debian's pax-utils), when installed
  libtree loop              one `libtree FILE` per file, from a shell loop
  ldd loop                  one `ldd FILE` per file (glibc's ld.so in trace mode)
With --strict, also `seedance check --strict DIR...` (every strong undefined symbol of every
closure: the symbol tables of every object) beside an `ldd -r` loop (ld.so relocating each
file in trace mode, which reports undefined symbols).
Rounds interleave the tools (rotating which goes first), so load drifts hit all of them;
best and median of the rounds are printed, with the core count and the load average, and
each command's CPU time (user + system, with the children it waited for: a check with two
cores forks a helper, helper.py, and its CPU shows here).  SEEDANCE_JOBS=1 in the
environment times the one-process check.

  seedance check, cached    the same check again, answered from the check cache (every input
                            stat'ed again); the other seedance rows pass --no-cache
Targets: /usr/lib within 10x of one libtree process (cold); a cached re-run within
3x of it; the big tree faster than the libtree loop (cold).  A target is met when the best and the median round both meet it; exit 1
when one is missed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEEDANCE = ROOT / ".venv" / "bin" / "seedance"


def elf_roots(directories) -> list:
    """The files check treats as roots, listed with check's own walker."""
    from seedance.collect.scan import CheckOptions, Scanner, _unique_roots
    from seedance.elf.reader import read_elf
    from seedance.resolve import ABIS

    scanner = Scanner(CheckOptions(targets=list(directories)))
    found = []
    for directory in directories:
        found.extend(scanner._walk(directory))
    roots = []
    for path in _unique_roots(found):
        try:
            info = read_elf(path)
        except Exception:
            continue
        if (info.elf_class, info.machine) in ABIS:
            roots.append(path)
    return roots


def lddtree_command() -> list:
    """Debian's lddtree is a Python script (`#!/usr/bin/env python3`) needing the Debian
    python3-pyelftools: run it with the system interpreter, not whatever python3 comes
    first on PATH (a pyenv one lacks elftools and exits at once)."""
    path = shutil.which("lddtree")
    with open(path, "rb") as handle:
        first = handle.readline()
    if b"python" in first and os.path.exists("/usr/bin/python3"):
        return ["/usr/bin/python3", path]
    return [path]


def run_once(cmd) -> tuple:
    """(wall seconds, exit code, CPU seconds): the CPU is the command's user + system time
    with the children it waited for (a check's helper process), so a command that uses two
    cores shows it."""
    env = None
    if isinstance(cmd, tuple):  # (command, environment): a baseline kept off the check cache
        cmd, env = cmd
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _pid, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait
    return elapsed, proc.returncode, usage.ru_utime + usage.ru_stime


def load() -> str:
    one, five, _fifteen = os.getloadavg()
    return f"{one:.1f}/{five:.1f}"


def measure(tools: dict, rounds: int) -> tuple:
    """({name: [seconds per round]}, {name: set of exit codes}), the tools interleaved, the
    first one rotating."""
    times = {name: [] for name in tools}
    codes = {name: set() for name in tools}
    names = list(tools)
    for index in range(rounds):
        order = names[index % len(names):] + names[:index % len(names)]
        for name in order:
            elapsed, rc, cpu = run_once(tools[name])
            times[name].append(elapsed)
            codes[name].add(rc)
            CPU.setdefault(name, []).append(cpu)
    return times, codes


CPU: dict = {}  # tool -> CPU seconds per round (run_once), beside measure()'s wall times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directories", nargs="*", metavar="DIR")
    parser.add_argument("--big", action="store_true",
                        help="the venv's site-packages (torch, nvidia wheels) and /usr/local/cuda")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-ldd", action="store_true", help="leave out the (slow) ldd loop")
    parser.add_argument("--ldd", metavar="FILE", help="time `seedance ldd FILE` against ldd and libtree")
    parser.add_argument("--baseline", metavar="EXE",
                        help="another seedance executable (an older version) timed in the same rounds, "
                             "for an honest before/after")
    parser.add_argument("--no-lddtree", action="store_true", help="leave out the (slow) lddtree row")
    parser.add_argument("--one-process", action="store_true",
                        help="also time the check with SEEDANCE_JOBS=1 (no helper process)")
    parser.add_argument("--strict", action="store_true",
                        help="also time `check --strict` (every undefined symbol of every closure), "
                             "beside an `ldd -r` loop (ld.so's own relocation of each file)")
    args = parser.parse_args()
    if args.ldd:
        return ldd_main(args.ldd, args.rounds, args.baseline)
    directories = args.directories
    if args.big:
        directories = [sysconfig.get_paths()["purelib"]] + (["/usr/local/cuda"] if os.path.isdir(
            "/usr/local/cuda") else [])
    directories = directories or ["/usr/lib/x86_64-linux-gnu"]

    roots = elf_roots(directories)
    with tempfile.NamedTemporaryFile("w", suffix=".list", delete=False) as handle:
        handle.write("\n".join(roots) + "\n")
        listing = handle.name
    loop = 'while IFS= read -r f; do {tool} "$f" >/dev/null 2>&1; done < "{listing}"'
    # every seedance row but the cached one is a cold check (--no-cache); the cached row
    # answers from the check cache (collect/check_cache.py), warmed by one run before the
    # rounds, in a cache directory of this bench's own
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="seedance-bench-cache-")
    tools = {"seedance check": [str(SEEDANCE), "check", "--no-cache", "--no-progress", "--json", *directories],
             "seedance check, cached": [str(SEEDANCE), "check", "--no-progress", "--json", *directories]}
    warm = subprocess.run(tools["seedance check, cached"], capture_output=True, text=True, errors="replace")
    again = subprocess.run(tools["seedance check, cached"], capture_output=True, text=True, errors="replace")
    state = json.loads(again.stdout).get("stats", {}).get("cache", {}).get("state") if again.stdout else None
    if state != "hit":
        print(f"cached row: the second check said {state!r}, not 'hit' ({warm.returncode}): its row is a cold check")
    if args.baseline:
        # SEEDANCE_CACHE=0: a baseline that has the check cache checks cold too (older ones ignore it)
        cold = {**os.environ, "SEEDANCE_CACHE": "0"}
        tools["baseline check"] = ([args.baseline, "check", "--no-progress", "--json", *directories], cold)
    if args.one_process:  # (through env(1): ~1 ms more)
        tools["seedance, 1 process"] = ["env", "SEEDANCE_JOBS=1", str(SEEDANCE), "check", "--no-cache",
                                        "--no-progress", "--json",
                                        *directories]
    if args.strict:
        tools["seedance check --strict"] = [str(SEEDANCE), "check", "--strict", "--no-cache", "--no-progress", "--json",
                                            *directories]
        if args.baseline:
            tools["baseline --strict"] = ([args.baseline, "check", "--strict", "--no-progress", "--json",
                                           *directories], cold)
    if shutil.which("libtree"):
        tools["libtree (one process)"] = ["libtree", *roots]
    if shutil.which("lddtree") and not args.no_lddtree:
        tools["lddtree (one process)"] = [*lddtree_command(), *roots]
    if shutil.which("libtree"):
        tools["libtree loop"] = ["bash", "-c", loop.format(tool="libtree", listing=listing)]
    if shutil.which("ldd") and not args.no_ldd:
        tools["ldd loop"] = ["bash", "-c", loop.format(tool="ldd", listing=listing)]
    if shutil.which("ldd") and args.strict and not args.no_ldd:
        tools["ldd -r loop"] = ["bash", "-c", loop.format(tool="ldd -r", listing=listing)]

    print(f"tree: {' '.join(directories)}: {len(roots)} ELF roots (one per inode)")
    print(f"machine: {os.cpu_count()} cores, load {load()} (1/5 min) before; {args.rounds} rounds, "
          f"tools interleaved; every row is a whole command")
    times, codes = measure(tools, args.rounds)
    print(f"load after: {load()}")
    print(f"{'tool':<24} {'best s':>8} {'median s':>9} {'CPU s (median)':>15}  exit")
    for name, values in times.items():
        print(f"{name:<24} {min(values):8.3f} {statistics.median(values):9.3f} "
              f"{statistics.median(CPU[name]):15.3f}  {','.join(str(c) for c in sorted(codes[name]))}")
    # libtree exits 1 when a dependency is not found; a peer that crashed (lddtree without
    # python3-pyelftools exits 1 at once) would only look fast
    if "lddtree (one process)" in codes and codes["lddtree (one process)"] - {0}:
        check = subprocess.run([*lddtree_command(), roots[0]], capture_output=True, text=True,
                               errors="replace")
        if check.returncode != 0:
            print(f"lddtree failed on {roots[0]}: {check.stderr.strip().splitlines()[-1:]}: its row "
                  f"is not a timing")
            del times["lddtree (one process)"], tools["lddtree (one process)"]

    ours = times["seedance check"]
    verdict = 0

    def ratio(peer: str) -> tuple:
        return min(ours) / min(times[peer]), statistics.median(ours) / statistics.median(times[peer])

    for peer in tools:
        if peer in ("seedance check", "seedance check, cached", "seedance, 1 process", "ldd -r loop") \
                or "strict" in peer:
            continue
        best, median = ratio(peer)
        print(f"seedance / {peer:<22} {best:6.2f}x (best)  {median:6.2f}x (median)")
    # a target is met when the best AND the median rounds meet it; best alone is said so
    if not args.big and "libtree (one process)" in times:
        best, median = ratio("libtree (one process)")
        verdict |= _target(f"within 10x of one libtree process: {best:.1f}x / {median:.1f}x (best / median)",
                           best <= 10, median <= 10)
    cached = times["seedance check, cached"]
    if "libtree (one process)" in times:
        peer = times["libtree (one process)"]
        best, median = min(cached) / min(peer), statistics.median(cached) / statistics.median(peer)
        print(f"seedance cached / libtree (one process) {best:6.2f}x (best)  {median:6.2f}x (median)")
        if not args.big:
            verdict |= _target(f"a cached re-run within 3x of one libtree process: {best:.1f}x / {median:.1f}x "
                               f"(best / median)", best <= 3, median <= 3)
    if args.big and "libtree loop" in times:
        best, median = ratio("libtree loop")
        verdict |= _target(f"faster than the libtree loop: {best:.2f}x / {median:.2f}x its time (best / median)",
                           best < 1, median < 1)
    if "seedance check --strict" in times:
        strict = times["seedance check --strict"]
        for peer in [p for p in ("baseline --strict", "ldd -r loop") if p in times]:
            print(f"seedance --strict / {peer:<15} {min(strict) / min(times[peer]):6.2f}x (best)  "
                  f"{statistics.median(strict) / statistics.median(times[peer]):6.2f}x (median)")
    os.unlink(listing)
    return verdict


def _target(text: str, best_ok: bool, median_ok: bool) -> int:
    verdict = "PASS" if best_ok and median_ok else "best only: FAIL" if best_ok else "FAIL"
    print(f"target: {text}  {verdict}")
    return 0 if best_ok and median_ok else 1


def ldd_main(path: str, rounds: int, baseline: str | None = None) -> int:
    """seedance ldd against ldd (target: within 5x of its wall time) and libtree."""
    tools = {"seedance ldd": [str(SEEDANCE), "ldd", path], "ldd": ["ldd", path]}
    if baseline:
        tools["baseline ldd"] = [baseline, "ldd", path]
    if shutil.which("libtree"):
        tools["libtree"] = ["libtree", path]
    print(f"file: {path}")
    print(f"machine: {os.cpu_count()} cores, load {load()} (1/5 min) before; {rounds} rounds, "
          f"tools interleaved; every row is a whole command")
    times, codes = measure(tools, rounds)
    print(f"load after: {load()}")
    for name, values in times.items():
        print(f"{name:<14} best {min(values) * 1e3:8.1f} ms  median {statistics.median(values) * 1e3:8.1f} ms"
              f"  exit {','.join(str(c) for c in sorted(codes[name]))}")
    best = min(times["seedance ldd"]) / min(times["ldd"])
    median = statistics.median(times["seedance ldd"]) / statistics.median(times["ldd"])
    ok = best <= 5
    print(f"seedance ldd / ldd: {best:.1f}x (best)  {median:.1f}x (median); target within 5x  "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
