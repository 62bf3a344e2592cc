"""Our mmap+struct ELF reader against pyelftools on the same files; prints the ratio.

Both sides do the same work per file: the dynamic section (NEEDED, SONAME, RPATH,
RUNPATH), the version needs and definitions, and every dynamic symbol with its version.

Then the C reader (fastelf.c) against the Python reader on read_elf(path) without
symbols, what a check does for every object: in process, interleaved rounds,
best and median.  With --check, the whole `seedance check DIR` command with each reader
(SEEDANCE_ELF_READER=python for the Python one), interleaved, best and median.

    .venv/bin/python bench/bench_elf.py [--limit N] [--repeat R] [--check] [PATH...]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile


def files_under(paths, limit):
    out = []
    for root in paths:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                if ".so" not in name or os.path.islink(path) or not os.path.isfile(path):
                    continue
                with open(path, "rb") as handle:
                    if handle.read(4) != b"\x7fELF":
                        continue
                out.append(path)
                if limit and len(out) >= limit:
                    return out
    return out


def with_pyelftools(path: str) -> int:
    """The same facts as read_elf(symbols=True), from pyelftools; returns a count to keep."""
    count = 0
    with open(path, "rb") as handle:
        elf = ELFFile(handle)
        for section in elf.iter_sections():
            if isinstance(section, DynamicSection):
                for tag in section.iter_tags():
                    if tag.entry.d_tag in ("DT_NEEDED", "DT_SONAME", "DT_RPATH", "DT_RUNPATH"):
                        count += 1
        names = {}
        verneed = elf.get_section_by_name(".gnu.version_r")
        if verneed is not None:
            for _vn, auxes in verneed.iter_versions():
                for aux in auxes:
                    names[aux["vna_other"] & 0x7FFF] = aux.name
        verdef = elf.get_section_by_name(".gnu.version_d")
        if verdef is not None:
            for vd, auxes in verdef.iter_versions():
                names[vd["vd_ndx"] & 0x7FFF] = next(iter(auxes)).name
        dynsym = elf.get_section_by_name(".dynsym")
        versym = elf.get_section_by_name(".gnu.version")
        if dynsym is not None:
            for index, sym in enumerate(dynsym.iter_symbols()):
                if sym["st_info"]["bind"] == "STB_LOCAL":
                    continue
                if versym is not None:
                    ndx = versym.get_symbol(index)["ndx"]
                    if isinstance(ndx, int):
                        names.get(ndx & 0x7FFF)
                count += 1
    return count


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=["/usr/lib/x86_64-linux-gnu"])
    parser.add_argument("--limit", type=int, default=300, help="files (0: all)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--check", action="store_true",
                        help="also time the whole `seedance check PATH...` with the C and the Python reader")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of --check")
    args = parser.parse_args(argv)

    from seedance.elf import read_elf

    files = files_under(args.paths, args.limit)
    size = sum(os.path.getsize(p) for p in files)
    print(f"files: {len(files)} ({size / 1e6:.1f} MB) from {' '.join(args.paths)}")

    best_ours = best_ref = float("inf")
    symbols_ours = symbols_ref = 0
    for _ in range(args.repeat):
        start = time.perf_counter()
        symbols_ours = sum(len(read_elf(p, symbols=True).symbols) for p in files)
        best_ours = min(best_ours, time.perf_counter() - start)
        start = time.perf_counter()
        symbols_ref = sum(with_pyelftools(p) for p in files)
        best_ref = min(best_ref, time.perf_counter() - start)
    print(f"seedance read_elf: {best_ours:.2f}s  ({symbols_ours} dynamic symbols)")
    print(f"pyelftools:        {best_ref:.2f}s")
    print(f"ratio (pyelftools / ours): {best_ref / best_ours:.1f}x")
    every = files_under(args.paths, 0)  # every file: what a check reads
    rounds = max(args.repeat, 5)
    c_vs_python(every, rounds, False, "read_elf(path)")
    # the C++ ABI check's read (collect/cxxabi.py), and a read of every symbol
    from seedance.collect.cxxabi import TORCH_PREFIXES

    c_vs_python(every, rounds, TORCH_PREFIXES, "read_elf(path, symbols=TORCH_PREFIXES)")
    c_vs_python(files, rounds, True, "read_elf(path, symbols=True)")
    if args.check:
        check_command(args.paths, args.rounds)
    return 0


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"{os.cpu_count()} cores, load {one:.1f}/{five:.1f} (1/5 min)"


def c_vs_python(files, rounds: int, symbols, label: str) -> None:
    """read_elf(path, symbols) over the files with the C reader and with the Python reader,
    in interleaved rounds (the order alternating), in this process."""
    import statistics

    from seedance.elf import fastread, read_elf

    if not fastread.available():
        print("C reader: not built (pip install -e . builds seedance.elf._fastelf)")
        return
    saved = os.environ.pop("SEEDANCE_ELF_READER", None)
    times = {"C": [], "Python": []}
    try:
        for index in range(rounds):
            for name in (("C", "Python") if index % 2 == 0 else ("Python", "C")):
                if name == "Python":
                    os.environ["SEEDANCE_ELF_READER"] = "python"
                start = time.perf_counter()
                for path in files:
                    try:
                        read_elf(path, symbols=symbols)
                    except Exception:  # same verdict either way (tests/unit/test_elf_fastread.py)
                        pass
                times[name].append(time.perf_counter() - start)
                os.environ.pop("SEEDANCE_ELF_READER", None)
    finally:
        if saved is not None:
            os.environ["SEEDANCE_ELF_READER"] = saved
    print(f"{label}, {len(files)} files, {rounds} interleaved rounds; {_load()}")
    for name, values in times.items():
        print(f"  {name + ' reader':<16} best {min(values) * 1e3:8.1f} ms  median {statistics.median(values) * 1e3:8.1f} ms"
              f"  ({min(values) / len(files) * 1e6:.0f} us/file)")
    print(f"  ratio (Python / C): {min(times['Python']) / min(times['C']):.1f}x best, "
          f"{statistics.median(times['Python']) / statistics.median(times['C']):.1f}x median")


def check_command(paths, rounds: int) -> None:
    """The whole `seedance check --no-progress --json PATH...` with each reader, interleaved."""
    import statistics
    import subprocess
    from pathlib import Path

    seedance = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "seedance"
    command = [str(seedance), "check", "--no-cache", "--no-progress", "--json", *paths]  # (both readers really read)
    base = {k: v for k, v in os.environ.items() if k != "SEEDANCE_ELF_READER"}
    envs = {"C reader": base, "Python reader": {**base, "SEEDANCE_ELF_READER": "python"}}
    times = {name: [] for name in envs}
    outputs = {name: set() for name in envs}
    print(f"whole command: {' '.join(command[1:])}; {rounds} interleaved rounds; {_load()} before")
    for index in range(rounds):
        order = list(envs) if index % 2 == 0 else list(reversed(envs))
        for name in order:
            start = time.perf_counter()
            done = subprocess.run(command, env=envs[name], capture_output=True)
            times[name].append(time.perf_counter() - start)
            outputs[name].add(done.returncode)
    print(f"  load after: {_load()}")
    for name, values in times.items():
        print(f"  {name:<14} best {min(values):6.3f} s  median {statistics.median(values):6.3f} s  "
              f"exit {','.join(map(str, sorted(outputs[name])))}")
    saved = min(times["Python reader"]) - min(times["C reader"])
    print(f"  C saves {saved:.3f} s best, "
          f"{statistics.median(times['Python reader']) - statistics.median(times['C reader']):.3f} s median")


if __name__ == "__main__":
    sys.exit(main())
