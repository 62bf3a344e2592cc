"""Our mmap+struct ELF reader against pyelftools on the same files; prints the ratio.

Both sides do the same work per file: the dynamic section (NEEDED, SONAME, RPATH,
RUNPATH), the version needs and definitions, and every dynamic symbol with its version.

    .venv/bin/python bench/bench_elf.py [--limit N] [--repeat R] [PATH...]
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
