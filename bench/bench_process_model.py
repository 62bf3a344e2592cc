"""Process-model agreement and ldd --tree parity, against the real thing in the same run.

    python bench/bench_process_model.py imports [--python PY]    >= 20 real import sets
    python bench/bench_process_model.py tree [--count 100]      seedance ldd --tree vs libtree

imports: each set is predicted without importing (seedance.collect.python_env) and then
run for real, `python -c 'import ...'` under LD_DEBUG=files; it agrees when the objects
ld.so mapped (the file= lines, in order) and the verdict are the same.  Where they differ,
the first difference is printed.
tree: the set of objects (realpaths) `seedance ldd --tree` shows against `libtree -p -vv`.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

# installed wheels of this venv: extension modules, bundled libraries, the CUDA runtimes
IMPORT_SETS = [
    "yaml", "numpy", "PIL.Image", "cffi", "lief", "kiwisolver", "contourpy", "matplotlib",
    "matplotlib.pyplot", "numpy, PIL.Image", "PIL.Image, numpy", "lz4.frame", "zstandard",
    "pydantic_core", "rpds", "setproctitle", "markupsafe", "charset_normalizer", "yaml, numpy, lief",
    "torch", "numpy, torch", "torch, numpy", "sqlite3", "ctypes", "json, decimal", "ssl",
    "matplotlib.ft2font", "PIL._imaging, kiwisolver", "cffi, yaml", "hashlib, lzma, bz2",
]


def first_difference(a: list, b: list):
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index, x, y
    if len(a) != len(b):
        index = min(len(a), len(b))
        return index, a[index] if index < len(a) else None, b[index] if index < len(b) else None
    return None


def bench_imports(python: str, sets: list) -> int:
    from seedance.collect.python_env import ask_interpreter, observe, predict_imports
    from seedance.resolve import Resolver
    interp = ask_interpreter(python)
    resolver = Resolver()
    agree_set = agree_order = agree_verdict = 0
    notes_total = 0
    for text in sets:
        names = [n.strip() for n in text.split(",")]
        t0 = time.perf_counter()
        prediction = predict_imports(interp, names, resolver=resolver, search_orders=False)
        t_predict = time.perf_counter() - t0
        seen = observe(python, "import " + ", ".join(names))
        predicted = prediction.loaded_names()
        actual = [name for name, _who in seen.loaded]
        same_set = set(predicted) == set(actual)
        same_order = predicted == actual
        same_verdict = prediction.ok == (seen.returncode == 0)
        agree_set += same_set
        agree_order += same_order
        agree_verdict += same_verdict
        notes_total += bool(prediction.plan.notes)
        verdict = "ok" if same_order and same_verdict else "DIFF"
        print(f"{verdict:4} import {', '.join(names):<32} predicted {len(predicted):3} objects ({t_predict:5.2f} s), "
              f"loaded {len(actual):3}; verdict {'same' if same_verdict else 'DIFFERENT'}"
              f"{'' if not prediction.plan.notes else f'; {len(prediction.plan.notes)} not-static notes'}")
        if not same_order:
            diff = first_difference(predicted, actual)
            print(f"     first difference at {diff[0]}: predicted {diff[1]!r}, loaded {diff[2]!r}")
            print(f"     loaded, not predicted: {sorted(set(actual) - set(predicted))[:8]}")
            print(f"     predicted, not loaded: {sorted(set(predicted) - set(actual))[:8]}")
    n = len(sets)
    print(f"\nagreement on {n} import sets: verdict {agree_verdict}/{n}, loaded set {agree_set}/{n}, "
          f"set and order {agree_order}/{n}; {notes_total} sets had code static analysis cannot follow")
    return 0


def bench_tree(count: int, rounds: int = 3) -> int:
    libtree = shutil.which("libtree")
    if libtree is None:
        print("libtree is not installed (apt-get install libtree)")
        return 2
    from seedance.render.graph import tree_text
    from seedance.resolve import Resolver
    files = []
    for directory in ("/usr/lib/x86_64-linux-gnu",):
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if ".so" in name and os.path.isfile(path) and not os.path.islink(path) and _is_elf(path):
                files.append(path)
    step = max(1, len(files) // count)
    files = files[::step][:count]
    same = 0
    rounds_ours, rounds_libtree = [], []
    for round_index in range(rounds):
        # one fresh Resolver per round (its caches are part of what is measured), and the
        # peer interleaved file by file in the same round
        resolver = Resolver()
        t_ours = t_libtree = 0.0
        for path in files:
            t0 = time.perf_counter()
            try:
                ours = tree_objects_real(tree_text(resolver.closure(path)))
            except Exception as exc:  # noqa: BLE001
                print(f"skip {path}: {exc}")
                continue
            t1 = time.perf_counter()
            proc = subprocess.run([libtree, "-p", "-vv", path], capture_output=True, timeout=60)
            t2 = time.perf_counter()
            t_ours += t1 - t0
            t_libtree += t2 - t1
            if round_index == 0:
                theirs = libtree_objects(proc.stdout.decode("utf-8", "surrogateescape"))
                if ours == theirs:
                    same += 1
                else:
                    print(f"DIFF {path}: only seedance {sorted(ours - theirs)[:4]}, "
                          f"only libtree {sorted(theirs - ours)[:4]}")
        rounds_ours.append(t_ours)
        rounds_libtree.append(t_libtree)
    import statistics
    print(f"\nldd --tree vs libtree -p -vv on {len(files)} libraries: same objects for {same}/{len(files)}")
    print(f"time over {rounds} interleaved rounds: seedance best {min(rounds_ours):.2f} s, median "
          f"{statistics.median(rounds_ours):.2f} s (in process, a fresh Resolver per round); libtree best "
          f"{min(rounds_libtree):.2f} s, median {statistics.median(rounds_libtree):.2f} s (a process per file)")
    return 0


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"\x7fELF"
    except OSError:
        return False


def tree_objects_real(text: str) -> set:
    out = set()
    for line in text.splitlines()[1:]:
        body = line.lstrip("│├└─ ")
        if " => " in body:
            out.add(os.path.realpath(body.split(" => ", 1)[1].split(" [", 1)[0]))
    return out


def libtree_objects(text: str) -> set:
    out = set()
    for line in text.splitlines()[1:]:
        body = line.lstrip("│├└─ ").split(" [", 1)[0].strip()
        if body.startswith("/"):
            out.add(os.path.realpath(body))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("imports", "tree"))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.what == "imports":
        return bench_imports(args.python, IMPORT_SETS)
    return bench_tree(args.count, args.rounds)


if __name__ == "__main__":
    raise SystemExit(main())
