#!/usr/bin/env python3
"""How `seedance check` scales with the number of files, against one libtree process.

    .venv/bin/python bench/bench_scaling.py [--sizes 100,300,900,2700,10000] [--rounds 3]
                                            [--plot bench/check_scaling.png]

The files are real ELF roots of this host (/usr/lib, /usr/bin, /usr/libexec, the venv's
site-packages, /usr/local/cuda), sorted; when a size asks for more files than the host has,
the rest are copies of its small libraries (under 64 KiB, each copy its own inode) made in
~/.cache/seedance-bench/scaling, outside the repository.  Every timing is a whole command
(`seedance check F1 F2 ...` and `libtree F1 F2 ...`), the two interleaved per round; the
best of the rounds is plotted, and the per-file cost is the slope of a least-squares line
through the best times.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEEDANCE = ROOT / ".venv" / "bin" / "seedance"
COPIES = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "seedance-bench" / "scaling"
TREES = ["/usr/lib/x86_64-linux-gnu", "/usr/bin", "/usr/sbin", "/usr/libexec",
         sysconfig.get_paths()["purelib"], "/usr/local/cuda"]


def pool(largest: int) -> list:
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_check_speed import elf_roots

    files = elf_roots([t for t in TREES if os.path.isdir(t)])
    if len(files) >= largest:
        return files
    small = [f for f in files if os.path.getsize(f) < 64 * 1024 and ".so" in os.path.basename(f)]
    COPIES.mkdir(parents=True, exist_ok=True)
    index = 0
    while len(files) < largest:
        source = small[index % len(small)]
        target = COPIES / f"{index:05d}-{os.path.basename(source)}"
        if not target.exists():
            shutil.copyfile(source, target)
        files.append(str(target))
        index += 1
    return files


def timed(cmd) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def slope(xs, ys) -> tuple:
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return b, mean_y - b * mean_x


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,300,900,2700,10000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plot", default=str(ROOT / "bench" / "check_scaling.png"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    files = pool(max(sizes))
    one, five, _ = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load {one:.1f}/{five:.1f}; {args.rounds} rounds, interleaved; "
          f"whole commands")
    rows = []
    for size in sizes:
        chosen = files[:size]
        ours, peer = [], []
        for round_ in range(args.rounds):
            pair = [("ours", [str(SEEDANCE), "check", "--no-cache", "--no-progress", "--json", *chosen]),
                    ("peer", ["libtree", *chosen])]
            for name, cmd in (pair if round_ % 2 == 0 else pair[::-1]):
                (ours if name == "ours" else peer).append(timed(cmd))
        rows.append((size, min(ours), statistics.median(ours), min(peer), statistics.median(peer)))
        print(f"{size:6d} files: seedance check best {min(ours):7.2f} s median {statistics.median(ours):7.2f} s"
              f" | libtree best {min(peer):6.3f} s median {statistics.median(peer):6.3f} s")
    xs = [r[0] for r in rows]
    ours_b, ours_a = slope(xs, [r[1] for r in rows])
    peer_b, peer_a = slope(xs, [r[3] for r in rows])
    print(f"per-file cost (slope of the best times): seedance check {ours_b * 1e3:.2f} ms/file "
          f"(+{ours_a:.2f} s fixed), libtree {peer_b * 1e3:.3f} ms/file (+{peer_a:.3f} s fixed)")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return 0
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, [r[1] for r in rows], "o-", label=f"seedance check ({ours_b * 1e3:.2f} ms/file)")
    ax.plot(xs, [r[3] for r in rows], "s-", label=f"libtree, one process ({peer_b * 1e3:.3f} ms/file)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ELF files checked")
    ax.set_ylabel("wall time, best of rounds (s)")
    ax.set_title(f"check scaling, {os.cpu_count()} cores, load {one:.1f}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.plot, dpi=80)
    print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
