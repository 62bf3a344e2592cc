#!/usr/bin/env python3
"""NEEDED rewrites: seedance against `patchelf --replace-needed` (and LIEF), one interleaved run.

Two parts.

1. Whole commands, as a user runs them (the target: "fix: no slower than patchelf on the
   419 MB library; for a small library, at most 100 ms for the whole command").  Each round, in
   rotating order, every tool gets a fresh copy of the same fixture (copy and `sync` are
   outside the timing, so no tool pays for another's dirty pages), and the wall time of one
   process is taken:
     seedance         `seedance fix cuda-mismatch --auto-relink --runtime 13 ROOT`: check, plan, journal
                      (hard-linked backup, hashed), copy in the kernel + patch + hash read back,
                      verify (re-parse, resolve, dlopen in a child started ahead), fsync, rename,
                      check again of the roots that load the rewritten file;
     patchelf         `patchelf --replace-needed OLD NEW FILE` (no verification, no fsync);
     patchelf+sync    the same, then `sync FILE` (durable, like seedance);
     seedance-start   `seedance --version`: the CLI's start-up alone, the floor under any command;
     seedance@base    with --baseline DIR: the same command running another version's package.
   One untimed warm-up run of each tool per case comes first.
   Cases: a 15 KB gcc-built library in a closure that mixes CUDA 12 and 13, and the biggest
   real library at hand (torch's libtorch_cpu.so, ~420 MB) given NEEDED libcudart.so.12 by
   patchelf, in the same kind of mixed closure.  Best and median of --rounds (--big-rounds)
   are printed with the ratio to patchelf, the children's CPU seconds (wall time on a shared
   machine includes waiting for the CPU), and the machine's cores and load before and after.

2. In process, per tool, on small and torch files: the growth in bytes (result size - original
   size), the median time over --repeat runs, and the growth after --cycles back-and-forth
   renames (A->B->A->...), which shows whether repeated runs keep growing a file:
     patchelf   one `patchelf --replace-needed OLD NEW FILE` process (that is how it is used);
     lief       in process: parse, rename NEEDED + version_r, write;
     seedance   in process: plan from a read-only mapping, write the temp (patched copy,
                hashed while written), rename; no fsync, like patchelf (the "ratio" column);
     durable    the same with fsync of the file and the directory, as the fixer writes;
     process    the durable path in a fresh `python -c` process (interpreter start included).

    .venv/bin/python bench/bench_relink.py [--rounds 7] [--big-rounds 3] [--repeat 15] [--json]
    .venv/bin/python bench/bench_relink.py --only whole --big-rounds 0      (small case only)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

SITE = Path(sysconfig.get_paths()["purelib"])
CU12 = SITE / "nvidia" / "cuda_runtime" / "lib"
TORCH_LIB = SITE / "torch" / "lib"

CHILD = ("import sys\n"
         "from seedance.fix import dynedit, atomic\n"
         "path, old, new = sys.argv[1:4]\n"
         "edit = dynedit.plan_file(path, {old: new}, {old: new})\n"
         "atomic.atomic_write(path, edit.fill, mode=0o755)\n")


def build_fixture(work: Path) -> Path:
    src = work / "kern.c"
    src.write_text("int cudaGetDeviceCount(int*);\nint kern(void){int n=0; cudaGetDeviceCount(&n); return n;}\n")
    out = work / "libkern.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src), f"-L{CU12}", "-l:libcudart.so.12",
                    f"-Wl,-rpath,{CU12}"], check=True)
    return out


def cases(work: Path) -> list:
    """(label, file, old NEEDED, new NEEDED): the names that fit and one that does not."""
    kern = build_fixture(work)
    found = [
        ("gcc lib cu12->cu13 (fits)", kern, "libcudart.so.12", "libcudart.so.13"),
        ("gcc lib cu12->cu11 (longer)", kern, "libcudart.so.12", "libcudart.so.11.0"),
    ]
    for label, path, old, new in (
            ("torch libshm.so", TORCH_LIB / "libshm.so", "libc10.so", "libc11.so"),
            ("torch libtorch.so", TORCH_LIB / "libtorch.so", "libtorch_cpu.so", "libtorch_cpX.so"),
            ("torch libtorch_python.so", TORCH_LIB / "libtorch_python.so", "libshm.so", "libshX.so"),
            ("nvidia libcudart.so.12", CU12 / "libcudart.so.12", "libdl.so.2", "libdl.so.3"),
            ("libcurl.so.4 (fits)", Path("/usr/lib/x86_64-linux-gnu/libcurl.so.4"), "libz.so.1", "libz.so.2"),
            ("libcurl.so.4 (longer)", Path("/usr/lib/x86_64-linux-gnu/libcurl.so.4"), "libz.so.1", "libz.so.1.2.13"),
    ):
        if path.exists():
            found.append((label, path, old, new))
    return found


def run_patchelf(path: Path, old: str, new: str) -> None:
    subprocess.run(["patchelf", "--replace-needed", old, new, str(path)], check=True)


def run_lief(path: Path, old: str, new: str) -> None:
    from seedance.fix import dynedit
    data = path.read_bytes()
    out, _s, _c = dynedit._rename_with_lief(data, {old: new}, {old: new}, str(path))
    path.write_bytes(out)


def run_seedance(path: Path, old: str, new: str, sync: bool = False) -> str:
    from seedance.fix import atomic, dynedit
    edit = dynedit.plan_file(str(path), {old: new}, {old: new})
    atomic.atomic_write(str(path), edit.fill, mode=0o755, sync=sync)
    return edit.strategy


def run_durable(path: Path, old: str, new: str) -> str:
    return run_seedance(path, old, new, sync=True)


def run_seedance_process(path: Path, old: str, new: str) -> None:
    subprocess.run([sys.executable, "-c", CHILD, str(path), old, new], check=True)


TOOLS = {"patchelf": run_patchelf, "lief": run_lief, "seedance": run_seedance, "durable": run_durable,
         "seedance-process": run_seedance_process}


def measure(tool: str, src: Path, old: str, new: str, work: Path, repeat: int) -> dict:
    times, growth, strategy = [], None, None
    for i in range(repeat):
        copy = work / f"{tool}-{i}-{src.name}"
        shutil.copy2(src, copy)
        start = time.perf_counter()
        result = TOOLS[tool](copy, old, new)
        times.append(time.perf_counter() - start)
        growth = copy.stat().st_size - src.stat().st_size
        strategy = result if isinstance(result, str) else strategy
        from seedance.elf.reader import read_elf
        needed = read_elf(str(copy)).needed
        if new not in needed or old in needed:
            raise SystemExit(f"{tool} did not rename {old} in {src}: {needed}")
        copy.unlink()
    return {"median_s": statistics.median(times), "growth": growth, "strategy": strategy}


def cycles(tool: str, src: Path, old: str, new: str, work: Path, count: int) -> int:
    """Growth after ``count`` renames back and forth (old->new->old->...)."""
    copy = work / f"cycle-{tool}-{src.name}"
    shutil.copy2(src, copy)
    names = (old, new)
    for i in range(count):
        TOOLS[tool](copy, names[i % 2], names[(i + 1) % 2])
    growth = copy.stat().st_size - src.stat().st_size
    copy.unlink()
    return growth


# --- part 1: whole commands ------------------------------------------------------------------

SEEDANCE = Path(sys.executable).with_name("seedance")
CU13_DIR = Path("/usr/local/cuda/lib64")


def gcc(out: Path, source: str, *args) -> Path:
    src = out.parent / (out.name + ".c")
    src.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src), *args], check=True)
    return out


def app_over(work: Path, libdir: Path, needed_lib: str, link_dir: Path | None = None) -> Path:
    """A root library that uses the CUDA 13 runtime itself and loads ``needed_lib`` (CUDA 12)
    from ``libdir``: the closure mixes runtime majors, and the fix, asked with --runtime 13 (a
    library built for CUDA 12 is moved to 13 only when asked), relinks ``needed_lib`` to 13.
    ``link_dir`` holds the copy ld links against (GNU ld rejects patchelf's output of a
    420 MB library, "file format not recognized"; ld.so loads it)."""
    return gcc(work / "libapp.so", "int cudaGetDeviceCount(int*);\nint app(void){int n; return cudaGetDeviceCount(&n);}\n",
               f"-L{CU13_DIR}", "-l:libcudart.so.13", f"-L{link_dir or libdir}", "-Wl,--no-as-needed",
               f"-l:{needed_lib}", f"-Wl,-rpath,{libdir}")


def whole_cases(work: Path, big: bool) -> list:
    """(label, root to fix, file the fix rewrites, fixture to reset it from)."""
    cases = []
    small = work / "small"
    small.mkdir(parents=True)
    kern = gcc(small / "libkern.so", "int cudaGetDeviceCount(int*);\nint kern(void){int n=0; cudaGetDeviceCount(&n); return n;}\n",
               f"-L{CU12}", "-l:libcudart.so.12", f"-Wl,-rpath,{CU12}")
    fixture = work / "small.fixture"
    shutil.copy2(kern, fixture)
    cases.append(("gcc-built library", app_over(small, small, "libkern.so"), kern, fixture))
    torch_cpu = TORCH_LIB / "libtorch_cpu.so"
    if big and torch_cpu.exists():
        big_dir = work / "big"
        libdir = big_dir / "lib"
        libdir.mkdir(parents=True)
        for sibling in TORCH_LIB.iterdir():  # its $ORIGIN neighbours (libc10.so, libgomp...)
            if sibling.name != torch_cpu.name:
                (libdir / sibling.name).symlink_to(sibling)
        fixture = work / "big.fixture"
        shutil.copy2(torch_cpu, fixture)
        # two runs: patchelf 0.14-0.18 given both options at once points RUNPATH at the new
        # NEEDED string ("libcudart.so.12"), so nothing would resolve
        subprocess.run(["patchelf", "--set-rpath", f"$ORIGIN:{CU12}", str(fixture)], check=True)
        subprocess.run(["patchelf", "--add-needed", "libcudart.so.12", str(fixture)], check=True)
        target = libdir / torch_cpu.name
        shutil.copy2(fixture, target)
        cases.append(("torch libtorch_cpu.so", app_over(big_dir, libdir, torch_cpu.name, TORCH_LIB), target,
                      fixture))
    return cases


def timed(cmd: list, env: dict | None = None) -> tuple:
    """(wall seconds, children's CPU seconds, CompletedProcess) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc


def whole_round(tool: str, root: Path, target: Path, work: Path) -> tuple:
    # PYTHONDONTWRITEBYTECODE is dropped: an installed seedance runs from compiled bytecode,
    # and the untimed warm-up round (measure_whole) writes it for any source changed since
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(XDG_STATE_HOME=str(work / "state"), LD_LIBRARY_PATH="")
    if tool in ("seedance", "seedance@base"):
        if tool == "seedance@base":  # the same entry point, importing the baseline's package first
            env["PYTHONPATH"] = BASELINE
        wall, cpu, proc = timed([str(SEEDANCE), "fix", "cuda-mismatch", "--auto-relink", "--runtime", "13",
                                 str(root)], env)
    elif tool == "patchelf":
        wall, cpu, proc = timed(["patchelf", "--replace-needed", "libcudart.so.12", "libcudart.so.13", str(target)])
    elif tool == "patchelf+sync":
        wall, cpu, proc = timed(["patchelf", "--replace-needed", "libcudart.so.12", "libcudart.so.13", str(target)])
        if proc.returncode == 0:
            wall2, cpu2, proc = timed(["sync", str(target)])
            wall, cpu = wall + wall2, cpu + cpu2
    else:  # seedance-start
        wall, cpu, proc = timed([str(SEEDANCE), "--version"], env)
        return wall, cpu
    if proc.returncode != 0:
        raise SystemExit(f"{tool} failed on {target}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    from seedance.elf.reader import read_elf
    needed = read_elf(str(target)).needed
    if "libcudart.so.13" not in needed or "libcudart.so.12" in needed:
        raise SystemExit(f"{tool} did not relink {target}: {needed}")
    return wall, cpu


BASELINE = ""  # --baseline DIR: a directory holding another version's package as seedance/


def measure_whole(cases: list, rounds_small: int, rounds_big: int, work: Path) -> list:
    tools = ["seedance", "patchelf", "patchelf+sync", "seedance-start"] + (["seedance@base"] if BASELINE else [])
    rows = []
    for label, root, target, fixture in cases:
        rounds = rounds_big if fixture.stat().st_size > (64 << 20) else rounds_small
        runs = {tool: [] for tool in tools}
        for tool in tools:  # one untimed warm-up each: bytecode written, page cache as in the rounds
            shutil.copy2(fixture, target)
            shutil.rmtree(work / "state", ignore_errors=True)
            whole_round(tool, root, target, work)
        for i in range(rounds):
            for tool in tools[i % len(tools):] + tools[:i % len(tools)]:  # rotate who goes first
                shutil.copy2(fixture, target)
                shutil.rmtree(work / "state", ignore_errors=True)
                os.sync()  # nobody pays for the copy's (or another tool's) dirty pages
                runs[tool].append(whole_round(tool, root, target, work))
        shutil.rmtree(work / "state", ignore_errors=True)
        row = {"case": label, "file": str(target), "size": fixture.stat().st_size, "rounds": rounds}
        for tool, samples in runs.items():
            walls = [w for w, _c in samples]
            row[tool] = {"best_s": min(walls), "median_s": statistics.median(walls),
                         "median_cpu_s": statistics.median(c for _w, c in samples)}
        row["ratio_median"] = row["seedance"]["median_s"] / row["patchelf"]["median_s"]
        row["ratio_best"] = row["seedance"]["best_s"] / row["patchelf"]["best_s"]
        row["ratio_durable_median"] = row["seedance"]["median_s"] / row["patchelf+sync"]["median_s"]
        if BASELINE:
            row["baseline"] = BASELINE
        rows.append(row)
    return rows


def print_whole(rows: list, load_before, load_after) -> None:
    print(f"whole commands, wall seconds (best / median), children's CPU seconds (median); "
          f"{os.cpu_count()} cores, load {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    print(f"{'case':<23} {'size':>10} {'n':>2} | {'seedance':>15} {'cpu':>5} | {'patchelf':>15} {'cpu':>5} | "
          f"{'patchelf+sync':>15} | {'seedance --version':>18} | {'ratio best/median':>17} {'vs +sync':>8}")
    for r in rows:
        cell = lambda t: f"{r[t]['best_s']:.3f} / {r[t]['median_s']:.3f}"  # noqa: E731
        print(f"{r['case']:<23} {r['size']:>10} {r['rounds']:>2} | {cell('seedance'):>15} "
              f"{r['seedance']['median_cpu_s']:>5.2f} | {cell('patchelf'):>15} {r['patchelf']['median_cpu_s']:>5.2f} | "
              f"{cell('patchelf+sync'):>15} | {cell('seedance-start'):>18} | "
              f"{r['ratio_best']:>6.2f}x / {r['ratio_median']:.2f}x {r['ratio_durable_median']:>7.2f}x")
        if "seedance@base" in r:
            b = r["seedance@base"]
            print(f"{'':<23} {'':>10} {'':>2} | baseline {cell('seedance@base')} s, {b['median_cpu_s']:.2f} s CPU "
                  f"(the package in {r['baseline']}; same rounds, interleaved)")
    print()


# --- part 2: in process ------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="whole-command rounds, small library")
    parser.add_argument("--big-rounds", type=int, default=3, help="whole-command rounds, ~420 MB library (0: skip)")
    parser.add_argument("--repeat", type=int, default=15, help="in-process runs per tool and file")
    parser.add_argument("--cycles", type=int, default=4)
    parser.add_argument("--only", choices=("whole", "inprocess"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--baseline", metavar="DIR",
                        help="also time `seedance fix` with DIR first on PYTHONPATH (DIR/seedance: another "
                             "version's package, e.g. `git archive COMMIT agent rules` unpacked, agent linked "
                             "as seedance), interleaved in the same rounds")
    args = parser.parse_args(argv)
    global BASELINE
    if args.baseline:
        if not (Path(args.baseline) / "seedance" / "__init__.py").is_file():
            print(f"--baseline {args.baseline}: no seedance/__init__.py there", file=sys.stderr)
            return 2
        BASELINE = str(Path(args.baseline).resolve())
    if not shutil.which("patchelf"):
        print("patchelf is not installed: the peer must run in the same run", file=sys.stderr)
        return 2
    result = {"cores": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="bench-relink-", dir=os.environ.get("BENCH_TMP")) as tmp:
        work = Path(tmp)
        if args.only != "inprocess":
            if not SEEDANCE.exists() or not (CU12 / "libcudart.so.12").exists() or \
                    not (CU13_DIR / "libcudart.so.13").exists():
                print("whole commands need .venv/bin/seedance, the cu12 runtime wheel and the CUDA 13 toolkit",
                      file=sys.stderr)
                return 2
            load_before = os.getloadavg()
            whole = measure_whole(whole_cases(work / "whole", args.big_rounds > 0), args.rounds,
                                  args.big_rounds, work / "whole")
            result.update(whole=whole, load_before=load_before, load_after=os.getloadavg())
            if not args.json:
                print_whole(whole, load_before, result["load_after"])
        if args.only != "whole":
            (work / "inproc").mkdir()
            result["inprocess"] = inprocess(work / "inproc", args)
    if args.json:
        print(json.dumps(result, indent=2))
    return 0


def inprocess(work: Path, args) -> list:
    rows = []
    for label, path, old, new in cases(work):
        src = work / f"src-{path.name}"
        shutil.copy2(path, src)
        row = {"case": label, "file": str(path), "size": src.stat().st_size, "old": old, "new": new}
        for tool in TOOLS:
            row[tool] = measure(tool, src, old, new, work, args.repeat)
        for tool in ("patchelf", "lief", "seedance"):
            row[tool]["growth_after_cycles"] = cycles(tool, src, old, new, work, args.cycles)
        row["speedup_vs_patchelf"] = row["patchelf"]["median_s"] / row["seedance"]["median_s"]
        row["process_speedup_vs_patchelf"] = row["patchelf"]["median_s"] / row["seedance-process"]["median_s"]
        row["durable_speedup_vs_patchelf"] = row["patchelf"]["median_s"] / row["durable"]["median_s"]
        row["lief_speedup_vs_patchelf"] = row["patchelf"]["median_s"] / row["lief"]["median_s"]
        row["not_larger_than_patchelf"] = row["seedance"]["growth"] <= row["patchelf"]["growth"]
        rows.append(row)
    if args.json:
        return rows
    print(f"{'case':<29} {'size':>9} | {'growth B: patchelf':>18} {'lief':>6} {'seedance':>8} "
          f"{'strategy':<12} | {'ms: patchelf':>12} {'lief':>7} {'seedance':>8} {'durable':>7} {'process':>7} | "
          f"{'ratio':>6} {'durable':>7} {'process':>7} | {'growth after ' + str(args.cycles) + ' runs p/l/s':>22}")
    for r in rows:
        p, l, s, d, sp = r["patchelf"], r["lief"], r["seedance"], r["durable"], r["seedance-process"]
        cyc = f"{p['growth_after_cycles']}/{l['growth_after_cycles']}/{s['growth_after_cycles']}"
        print(f"{r['case']:<29} {r['size']:>9} | {p['growth']:>18} {l['growth']:>6} {s['growth']:>8} "
              f"{s['strategy']:<12} | {p['median_s'] * 1e3:>12.2f} {l['median_s'] * 1e3:>7.2f} "
              f"{s['median_s'] * 1e3:>8.2f} {d['median_s'] * 1e3:>7.2f} {sp['median_s'] * 1e3:>7.1f} | "
              f"{r['speedup_vs_patchelf']:>5.1f}x {r['durable_speedup_vs_patchelf']:>6.2f}x "
              f"{r['process_speedup_vs_patchelf']:>6.2f}x | {cyc:>22}")
    fits = [r for r in rows if r["seedance"]["strategy"] in ("in-place", "reuse", "in-place+reuse", "moved-dynstr")]
    print()
    print(f"never larger than patchelf: {sum(r['not_larger_than_patchelf'] for r in rows)}/{len(rows)} cases")
    print(f"zero growth where the name fits (in .dynstr or in segment slack): "
          f"{sum(r['seedance']['growth'] == 0 for r in fits)}/{len(fits)} cases")
    geo = statistics.geometric_mean([r["speedup_vs_patchelf"] for r in fits]) if fits else 0
    print(f"faster than patchelf on in-place edits (like for like, no fsync): "
          f"{sum(r['speedup_vs_patchelf'] > 1 for r in fits)}/{len(fits)} cases, geometric mean {geo:.1f}x; "
          f"durable (fsync): {sum(r['durable_speedup_vs_patchelf'] > 1 for r in fits)}/{len(fits)}; "
          f"fresh python process: {sum(r['process_speedup_vs_patchelf'] > 1 for r in fits)}/{len(fits)}")
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    raise SystemExit(main())
