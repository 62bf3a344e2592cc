"""Parity of `seedance ldd` with glibc's `ldd` over whole trees; prints the count of differences.

Trees: every ELF file under /usr/lib/x86_64-linux-gnu (recursive), the venv's torch package
and the NVIDIA CUDA runtime wheel (nvidia/cuda_runtime).  For each file the set of objects
ldd lists (compared by realpath; 'not found' names by name; linux-vdso left out) must equal
what the resolver decides.  Files ldd calls "not a dynamic executable" or "statically
linked" must be classified the same way.

    .venv/bin/python bench/bench_ldd_parity.py [--limit N] [--jobs 2] [--show 20] [PATH...]

The resolver side runs in this process with one shared Resolver (as `seedance check`
does); the ldd side runs `ldd` per file in a clean environment.  Both times are printed.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
import sysconfig
import time

DEFAULT_TREES = ("/usr/lib/x86_64-linux-gnu",)
CLEAN_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}


def venv_trees() -> list:
    site = sysconfig.get_paths()["purelib"]
    return [p for p in (os.path.join(site, "torch"), os.path.join(site, "nvidia", "cuda_runtime"))
            if os.path.isdir(p)]


def elf_files(trees) -> list:
    """Regular ELF files (symlinks to files counted once, via their target elsewhere)."""
    out = []
    for tree in trees:
        if os.path.isfile(tree):
            out.append(tree)
            continue
        for dirpath, dirnames, filenames in os.walk(tree):
            dirnames.sort()
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                try:
                    with open(path, "rb") as handle:
                        if handle.read(4) != b"\x7fELF":
                            continue
                except OSError:
                    continue
                out.append(path)
    return out


def parse_ldd(text: str) -> tuple:
    """ldd output -> (kind, set of realpaths, set of not-found names, version errors, order).

    kind: 'dynamic', 'static' (statically linked) or 'not-dynamic'.  order: the listed
    objects, realpaths or not-found names, in the order printed (kernel vdso left out).
    """
    paths, missing, version_errors, order = set(), set(), set(), []
    kind = "dynamic"
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if "not a dynamic executable" in line:
            kind = "not-dynamic"
            continue
        if line == "statically linked":
            kind = "static"
            continue
        if "version `" in line and "not found" in line:
            version_errors.add(line.split(": version `", 1)[1].split("'", 1)[0])
            continue
        if "=>" in line:
            name, _, rest = line.partition("=>")
            rest = rest.strip()
            if rest.startswith("not found"):
                missing.add(name.strip())
                order.append(name.strip())
                continue
            target = rest.rsplit(" (0x", 1)[0].strip()
            if target:
                paths.add(os.path.realpath(target))
                order.append(os.path.realpath(target))
            continue
        target = line.rsplit(" (0x", 1)[0].strip()
        if target.startswith("/"):
            paths.add(os.path.realpath(target))
            order.append(os.path.realpath(target))
        # else: linux-vdso.so.1 and similar kernel-provided objects
    return kind, paths, missing, version_errors, order


def run_ldd(path: str, env: dict | None = None) -> tuple:
    full_env = dict(CLEAN_ENV)
    full_env.update(env or {})
    try:
        proc = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=60,
                              env=full_env, errors="surrogateescape")
    except subprocess.TimeoutExpired:
        return "timeout", set(), set(), set(), []
    return parse_ldd(proc.stdout + "\n" + proc.stderr)


def ours(resolver, path: str) -> tuple:
    """The resolver's answer in parse_ldd's shape."""
    from seedance.model.errors import SeedanceError

    try:
        info = resolver.read(path)
    except SeedanceError:
        return "not-dynamic", set(), set(), set(), []
    if info.e_type not in (2, 3):
        return "not-dynamic", set(), set(), set(), []
    # rtld.c: --verify fails without PT_DYNAMIC (ldd: "not a dynamic executable"); trace
    # mode prints "statically linked" when the main object has no DT_NEEDED.
    if resolver.loader_for(info) is None or not info.has_dynamic:
        return "not-dynamic", set(), set(), set(), []
    if not info.needed:
        return "static", set(), set(), set(), []
    closure = resolver.closure(path)
    paths, missing, order = set(), set(), []
    for name, lib_path, _res in closure.load_order:
        if lib_path is None:
            missing.add(name)
            order.append(name)
        else:
            paths.add(os.path.realpath(lib_path))
            order.append(os.path.realpath(lib_path))
    version_errors = {c.version for c in closure.version_checks
                      if not c.defined and not c.weak and c.provider is not None}
    return "dynamic", paths, missing, version_errors, order


def compare(left: tuple, right: tuple) -> str | None:
    """None when equal, else a one-line description of the difference (ldd = left)."""
    if left[0] != right[0]:
        return f"kind: ldd {left[0]}, seedance {right[0]}"
    if left[0] != "dynamic":
        return None
    parts = []
    if left[1] != right[1]:
        parts.append(f"only ldd: {sorted(left[1] - right[1])} only seedance: {sorted(right[1] - left[1])}")
    if left[2] != right[2]:
        parts.append(f"not found: ldd {sorted(left[2])} seedance {sorted(right[2])}")
    if left[3] != right[3]:
        parts.append(f"version errors: ldd {sorted(left[3])} seedance {sorted(right[3])}")
    return "; ".join(parts) or None


def speed(files: list, ours_s: float) -> None:
    """Serial peer loops, as a shell `for f in ...; do ldd "$f"; done` would run them."""
    import shutil
    for peer in ("ldd", "libtree"):
        exe = shutil.which(peer)
        if exe is None:
            print(f"{peer}: not installed")
            continue
        start = time.perf_counter()
        for path in files:
            subprocess.run([exe, path], capture_output=True, env=CLEAN_ENV, timeout=60)
        took = time.perf_counter() - start
        print(f"{peer} loop (serial): {took:.2f}s  ratio {peer}/seedance: {took / ours_s:.1f}x")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="trees or files (default: the issue's trees)")
    parser.add_argument("--limit", type=int, default=0, help="compare only the first N files")
    parser.add_argument("--jobs", type=int, default=2, help="parallel ldd processes")
    parser.add_argument("--show", type=int, default=20, help="differences to print")
    parser.add_argument("--speed", action="store_true",
                        help="also time serial `ldd` and `libtree` loops over the same files")
    args = parser.parse_args(argv)

    from seedance.resolve import Resolver

    trees = args.paths or list(DEFAULT_TREES) + venv_trees()
    files = elf_files(trees)
    if args.limit:
        files = files[:args.limit]
    print(f"trees: {' '.join(trees)}")
    print(f"ELF files: {len(files)}")

    start = time.perf_counter()
    resolver = Resolver()
    mine = {path: ours(resolver, path) for path in files}
    ours_s = time.perf_counter() - start

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        theirs = dict(zip(files, pool.map(run_ldd, files)))
    ldd_s = time.perf_counter() - start

    differences = []
    order_differences = 0
    for path in files:
        why = compare(theirs[path], mine[path])
        if why:
            differences.append((path, why))
        elif theirs[path][4] != mine[path][4]:
            order_differences += 1
            if order_differences <= args.show:
                print(f"ORDER {path}: ldd {theirs[path][4]} seedance {mine[path][4]}")
    kinds: dict = {}
    for result in theirs.values():
        kinds[result[0]] = kinds.get(result[0], 0) + 1
    print(f"ldd kinds: {kinds}")
    for path, why in differences[:args.show]:
        print(f"DIFF {path}: {why}")
    print(f"seedance: {ours_s:.2f}s  ldd ({args.jobs} jobs): {ldd_s:.2f}s")
    if args.speed:
        speed(files, ours_s)
    print(f"same set, different listing order: {order_differences}")
    print(f"files compared: {len(files)}  differences: {len(differences)}")
    return 0 if not differences else 1


if __name__ == "__main__":
    sys.exit(main())
