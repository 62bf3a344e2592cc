#!/usr/bin/env python3
"""Speed of `seedance check` on a whole library tree against the peers, in one run.

    .venv/bin/python bench/bench_check_speed.py [DIR]      (default /usr/lib/x86_64-linux-gnu)

Runs, over the same ELF files (the roots check itself would close: one per inode):
  1. seedance check DIR       (full check: NEEDED resolution + every verneed against verdef)
  2. a shell loop of `ldd FILE`       (glibc's ldd: runs ld.so in trace mode per file)
  3. a shell loop of `libtree FILE`   (a static resolver written in C)
and prints the wall times and ratios.  Targets (issue 2): >= 5x faster than the ldd loop,
no slower than the libtree loop.  Each timing is the best of --repeat runs (default 3) so
one noisy neighbour on a shared machine does not decide the result.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEEDANCE = ROOT / ".venv" / "bin" / "seedance"


def elf_roots(directory: str) -> list:
    """The files check treats as roots, listed with check's own walker."""
    sys.path.insert(0, str(ROOT))
    from seedance.collect.scan import CheckOptions, Scanner, _unique_roots
    from seedance.resolve import ABIS
    from seedance.elf.reader import read_elf

    scanner = Scanner(CheckOptions(targets=[directory]))
    roots = []
    for path in _unique_roots(scanner._walk(directory)):
        try:
            info = read_elf(path)
        except Exception:
            continue
        if (info.elf_class, info.machine) in ABIS:
            roots.append(path)
    return roots


def timed(cmd, repeat: int, **kwargs) -> tuple:
    best, result = None, None
    for _ in range(repeat):
        start = time.perf_counter()
        result = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs)
        elapsed = time.perf_counter() - start
        best = elapsed if best is None else min(best, elapsed)
    return best, result.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", nargs="?", default="/usr/lib/x86_64-linux-gnu")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    roots = elf_roots(args.directory)
    with tempfile.NamedTemporaryFile("w", suffix=".list", delete=False) as handle:
        handle.write("\n".join(roots) + "\n")
        listing = handle.name
    loop = 'while IFS= read -r f; do {tool} "$f" >/dev/null 2>&1; done < "{listing}"'
    print(f"tree: {args.directory}: {len(roots)} ELF files (one per inode), best of {args.repeat}")

    check_s, check_rc = timed([str(SEEDANCE), "check", "--no-progress", "--json", args.directory], args.repeat)
    print(f"seedance check      {check_s:8.2f} s   (exit {check_rc})")
    import json
    report = json.loads(subprocess.run([str(SEEDANCE), "check", "--no-progress", "--json", args.directory],
                                       capture_output=True, text=True).stdout)
    kinds = report["stats"]["facts_by_kind"]
    print(f"  checked {report['stats']['elf_objects']} roots, {report['stats']['closure_objects']} objects in"
          f" closures; facts: {kinds} (version_need = every verneed checked against its verdef)")
    results = {}
    for tool in ("ldd", "libtree"):
        if shutil.which(tool) is None:
            print(f"{tool:<19} not installed: skipped")
            continue
        results[tool], _rc = timed(["bash", "-c", loop.format(tool=tool, listing=listing)], args.repeat)
        print(f"{tool + ' loop':<19} {results[tool]:8.2f} s")
    os.unlink(listing)

    verdict = 0
    if "ldd" in results:
        ratio = results["ldd"] / check_s
        ok = ratio >= 5
        verdict |= not ok
        print(f"check vs ldd loop:     {ratio:5.1f}x faster (target >= 5x)   {'PASS' if ok else 'FAIL'}")
    if "libtree" in results:
        ratio = results["libtree"] / check_s
        ok = ratio >= 1
        verdict |= not ok
        print(f"check vs libtree loop: {ratio:5.1f}x faster (target >= 1x)   {'PASS' if ok else 'FAIL'}")
    return verdict


if __name__ == "__main__":
    raise SystemExit(main())
