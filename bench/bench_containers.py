"""A host check with running containers against the same check with them stopped.

    sudo .venv/bin/python bench/bench_containers.py [--containers 20] [--rounds 5]

Target: `seedance check --no-cache` (the whole command, as a user runs it) with 20 running
podman containers costs at most 2x the same check with them stopped.  Each container runs
a small gcc-built program that maps a few libraries (libm, libz, libdl, libc), forks two
workers and sleeps (three processes per container, beside its conmon);
the image is `podman import`ed from those host files.  Rounds interleave: containers
started -> check, containers stopped -> check, so a machine that slows down mid-run slows
both sides.  Best and median of each side and their ratio are printed.

Every container and the image carry a unique name and are removed at the end, also on
Ctrl-C or SIGTERM.  Needs root and podman (runc as the runtime, as the tests use it).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

PODMAN_RUN = ["podman", "run", "-d", "--runtime", "/usr/sbin/runc", "--ulimit", "nofile=1024:1024",
              "--ulimit", "nproc=1024:1024"]
PROGRAM = r"""
#include <dlfcn.h>
#include <math.h>
#include <unistd.h>
#include <zlib.h>
int main(int argc, char **argv) {
    /* touch each library so none is dropped by --as-needed */
    volatile double x = cos((double)argc);
    (void)x; (void)zlibVersion(); (void)dlerror();
    /* two workers beside it, as a trainer's data loaders: three processes per container */
    if (fork() > 0) fork();
    for (;;) pause();
}
"""


def _run(argv, check=False, timeout=120):
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode:
        raise SystemExit(f"{' '.join(argv[:3])}: {done.stderr.strip()[-400:]}")
    return done


def _copy_in(root: str, path: str) -> None:
    real = os.path.realpath(path)
    for name in {path, real}:
        dest = os.path.join(root, name.lstrip("/"))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if not os.path.exists(dest):
            shutil.copy2(real, dest)


def build_image(work: str, tag: str) -> None:
    root = os.path.join(work, "rootfs")
    os.makedirs(os.path.join(root, "app"))
    src = os.path.join(work, "sleeper.c")
    with open(src, "w") as handle:
        handle.write(PROGRAM)
    exe = os.path.join(root, "app", "sleeper")
    _run(["gcc", "-O1", "-o", exe, src, "-lm", "-lz", "-ldl", "-Wl,--no-as-needed"], check=True)
    ldd = _run(["ldd", exe], check=True).stdout
    for part in ldd.split():
        if part.startswith("/"):
            _copy_in(root, part)
    _run(["tar", "-C", root, "-cf", root + ".tar", "."], check=True)
    _run(["podman", "import", root + ".tar", tag], check=True)


class Fleet:
    def __init__(self, count: int, tag: str, prefix: str):
        self.names = [f"{prefix}-{i}" for i in range(count)]
        self.tag = tag
        self.created: list = []

    def create(self) -> None:
        for name in self.names:
            done = _run(PODMAN_RUN + ["--name", name, self.tag, "/app/sleeper"])
            if done.returncode:
                raise SystemExit(f"podman run {name}: {done.stderr.strip()[-400:]}")
            self.created.append(name)

    def start(self) -> None:
        _run(["podman", "start", *self.names], check=True, timeout=600)

    def stop(self) -> None:
        # the sleeper is pid 1 of its container and has no SIGTERM handler: kill at once
        _run(["podman", "stop", "-t", "0", *self.names], check=True, timeout=600)

    def running_pids(self) -> list:
        pids = []
        for name in self.names:
            text = _run(["podman", "inspect", "--format", "{{.State.Pid}}", name]).stdout.strip()
            if text.isdigit() and int(text) > 0:
                pids.append(int(text))
        return pids

    def remove(self) -> None:
        if self.created:
            _run(["podman", "rm", "-f", "-t", "0", *self.created], timeout=600)
        _run(["podman", "rmi", "-f", self.tag])


def timed_check(seedance: list) -> tuple:
    started = time.perf_counter()
    done = subprocess.run(seedance + ["check", "--no-cache", "--json"], capture_output=True, text=True,
                          timeout=600)
    elapsed = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"seedance check exited {done.returncode}: {done.stderr.strip()[-400:]}")
    import json
    processes = json.loads(done.stdout).get("stats", {}).get("processes")
    return elapsed, processes


def collect_containers(pids: list, shared: bool, repeat: int = 5) -> float:
    """Seconds for the check's per-process collectors over the containers' processes (each
    container's process and its conmon), best of ``repeat``: with the per-container views
    shared (as a check runs), or read again for every process."""
    from seedance.collect import process

    targets = set(pids)
    for pid in pids:  # its conmon (the parent) and its workers (the children)
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                targets.add(int(handle.read().rpartition(b")")[2].split()[1]))
            with open(f"/proc/{pid}/task/{pid}/children") as handle:
                targets.update(int(child) for child in handle.read().split())
        except (OSError, ValueError, IndexError):
            pass
    best = None
    for _ in range(repeat):
        process._VIEWS = process.RootViews()
        started = time.perf_counter()
        for pid in sorted(targets):
            if not shared:
                process._VIEWS = process.RootViews()
            try:
                view = process.read_process(pid)
            except (process.ProcessGone, PermissionError):
                continue
            process.mapped_lib_facts(view)
            process.runtime_facts(view)
            process.preload_facts(view)
        elapsed = time.perf_counter() - started
        best = elapsed if best is None else min(best, elapsed)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--containers", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seedance", default=os.path.join(os.path.dirname(sys.executable), "seedance"),
                        help="the seedance command (default: the one beside this python)")
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("podman") is None:
        print("bench_containers: needs root and podman", file=sys.stderr)
        return 2
    unique = uuid.uuid4().hex[:8]
    tag = f"localhost/sd-bench-sleeper-{unique}:1"
    fleet = Fleet(args.containers, tag, f"sd-bench-{unique}")
    # SIGTERM ends the run the way Ctrl-C does, so the finally below removes the containers
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    work = tempfile.mkdtemp(prefix="sd-bench-containers-")
    seedance = [args.seedance]
    running, stopped = [], []
    try:
        build_image(work, tag)
        fleet.create()
        pids = fleet.running_pids()
        print(f"{len(pids)} containers running ({tag})")
        timed_check(seedance)  # warm the page cache and the interpreter's files for both sides
        try:
            shared = collect_containers(pids, shared=True)
            alone = collect_containers(pids, shared=False)
            print(f"the collectors over the containers' processes (in this process, best of 5): "
                  f"{shared * 1000:.1f} ms with per-container views shared, "
                  f"{alone * 1000:.1f} ms read again per process")
        except ImportError:
            print("(seedance is not importable from this python: in-process timing skipped)")
        for round_no in range(args.rounds):
            fleet.start()
            t_run, n_run = timed_check(seedance)
            fleet.stop()
            t_stop, n_stop = timed_check(seedance)
            running.append(t_run)
            stopped.append(t_stop)
            print(f"round {round_no + 1}: running {t_run:.3f}s ({n_run} processes), "
                  f"stopped {t_stop:.3f}s ({n_stop} processes)", flush=True)
    except KeyboardInterrupt:
        print("interrupted: removing the containers", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not skip the removal
        fleet.remove()
        shutil.rmtree(work, ignore_errors=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    best = min(running) / min(stopped)
    median = statistics.median(running) / statistics.median(stopped)
    print(f"check --no-cache, {args.containers} containers running: best {min(running):.3f}s, "
          f"median {statistics.median(running):.3f}s")
    print(f"check --no-cache, containers stopped: best {min(stopped):.3f}s, "
          f"median {statistics.median(stopped):.3f}s")
    print(f"ratio running/stopped: best {best:.2f}x, median {median:.2f}x (target <= 2x)")
    return 0 if median <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
