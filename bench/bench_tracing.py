#!/usr/bin/env python3
"""What tracing costs: off (the default), on with sampling, and in the agent's loop.

    .venv/bin/python bench/bench_tracing.py [--rounds 15] [--agent-seconds 20]

Rows, every one a whole command (process start-up included), rounds interleaved so load
drifts hit all of them alike; median and best of the rounds:
  before          this working tree with seedance.telemetry replaced by a stand-in whose
                  hooks do nothing (every row runs a copy of the package through PYTHONPATH,
                  ahead of the editable install, so each imports seedance the same way)
  off             this code, no OTEL_* variable set: no SDK import, no span
  on, ratio 0     OTEL_EXPORTER_OTLP_ENDPOINT set, OTEL_TRACES_SAMPLER_ARG=0: the SDK is
                  loaded and every span recorded, the clean trace is dropped at its end
  on, ratio 1     every trace exported, to an OTLP/HTTP receiver on loopback
for `seedance ldd FILE` and `seedance check --no-cache DIR` (a small tree: the CUDA runtime
wheel's lib directory).  Then the agent: `seedance agent run` with a 1 s GC pass and a 2 s
periodic check for --agent-seconds, its own CPU time (user + system, the check children
excluded: they run the same code traced or not) with tracing off and on (ratio 1, every
pass exported).

Target: off within 3% (or 2 ms) of before in median CPU, for both commands: tracing off
costs nothing.
Exit 1 when it is missed.
"""
from __future__ import annotations

import argparse
import http.server
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SITE = Path(sysconfig.get_paths()["purelib"])
TREE = SITE / "nvidia" / "cuda_runtime" / "lib"
LDD_FILE = TREE / "libcudart.so.12"


class Sink:
    """An OTLP/HTTP endpoint on loopback that accepts and counts."""

    def __init__(self):
        sink = self
        self.posts = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                sink.posts += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"


STUB = '''"""bench/bench_tracing.py's stand-in: every hook of seedance.telemetry, doing nothing."""
class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def set(self, key, value):
        pass

    def event(self, name, attributes=None):
        pass

    def next(self, name, attributes=None):
        pass

    def end(self):
        pass


NULL = _Null()
wanted = lambda env=None: False
active = lambda: False
run_command = lambda call, name, words: call()
span = lambda name, attributes=None: NULL
phases = lambda prefix: NULL
stages = lambda prefix, attributes=None: NULL
note_report = lambda report: None
event = lambda name, attributes=None: None
child_env = lambda env: env
shim_events = lambda span, stream: stream
leak_events = lambda span, report: None
agent_pass = lambda name, attributes=None: NULL
record_pass = lambda name, start_wall, report=None, error=None: None
start_service = lambda env=None: None
stop_service = lambda: None
'''


def package_copy(into: Path, without_hooks: bool) -> Path:
    """This working tree's package, importable as `seedance` through PYTHONPATH; with
    WITHOUT_HOOKS, seedance.telemetry replaced by a stand-in whose every hook does nothing
    (STUB), so "off" against it is what the hooks cost while no OTEL_* variable is set.
    Every row runs such a copy, so all import seedance the same way."""
    into.mkdir()
    shutil.copytree(ROOT / "agent", into / "agent", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "rules", into / "rules", ignore=shutil.ignore_patterns("__pycache__"))
    if without_hooks:
        (into / "agent" / "telemetry" / "__init__.py").write_text(STUB)
    (into / "agent" / "rules_data").symlink_to(into / "rules")  # as setup.py maps the rules
    (into / "seedance").symlink_to(into / "agent")
    # bytecode, as make install writes it for the tree under test: without it every start
    # would compile the modules again (PYTHONDONTWRITEBYTECODE is set on these machines)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(into / "agent")], check=True,
                   stdout=subprocess.DEVNULL)
    return into


def timed(cmd, env) -> tuple:
    """(wall, CPU) seconds of one command: CPU (user + system, with the children it waited
    for) moves far less than wall time on a loaded host."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(map(str, cmd))}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def commands_bench(rounds: int, before: Path, now: Path, sink: Sink) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != "TRACEPARENT"}
    base["SEEDANCE_CACHE"] = "0"
    variants = {
        "before": dict(base, PYTHONPATH=str(before)),
        "off": dict(base, PYTHONPATH=str(now)),
        "on, ratio 0": dict(base, PYTHONPATH=str(now), OTEL_EXPORTER_OTLP_ENDPOINT=sink.endpoint,
                            OTEL_TRACES_SAMPLER="parentbased_traceidratio", OTEL_TRACES_SAMPLER_ARG="0"),
        "on, ratio 1": dict(base, PYTHONPATH=str(now), OTEL_EXPORTER_OTLP_ENDPOINT=sink.endpoint),
    }
    python = [sys.executable, "-c", "from seedance.cli import console; console()"]  # the console script's code
    commands = {"ldd": [*python, "ldd", str(LDD_FILE)],
                "check": [*python, "check", "--no-cache", "--no-progress", str(TREE)]}
    times = {(c, v): [] for c in commands for v in variants}
    for index in range(rounds):
        order = list(variants)
        order = order[index % len(order):] + order[:index % len(order)]
        for command, argv in commands.items():
            for variant in order:
                times[(command, variant)].append(timed(argv, variants[variant]))
    return times


WARM_S = 5.0


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def agent_cpu(seconds: float, traced: bool, sink: Sink) -> tuple:
    tmp = Path(tempfile.mkdtemp(prefix="sd-bt-", dir="/tmp"))
    try:
        (tmp / "rt").mkdir(mode=0o700)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SEEDANCE_", "NOTIFY_"))}
        env.update(HOME=str(tmp), XDG_CONFIG_HOME=str(tmp / "cfg"), XDG_STATE_HOME=str(tmp / "state"),
                   SEEDANCE_RUNTIME_DIR=str(tmp / "rt"))
        if traced:
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = sink.endpoint
        posts = sink.posts
        proc = subprocess.Popen([str(BIN / "seedance"), "agent", "run", "--probes", "off", "--gc-interval", "1s",
                                 "--scan-interval", "2s", "--scan-path", str(TREE)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(WARM_S)  # start-up (imports, the first passes) apart from the steady state
        warm = _cpu(proc.pid)
        time.sleep(seconds)
        cpu = _cpu(proc.pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        return warm, cpu - warm, sink.posts - posts
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--agent-seconds", type=float, default=20.0)
    args = parser.parse_args()
    sink = Sink()
    print(f"cores {os.cpu_count()}, load {os.getloadavg()[0]:.2f}; {args.rounds} rounds interleaved")
    with tempfile.TemporaryDirectory(prefix="sd-before-") as tmp:
        before = package_copy(Path(tmp) / "before", without_hooks=True)
        now = package_copy(Path(tmp) / "now", without_hooks=False)
        times = commands_bench(args.rounds, before, now, sink)
    missed = False
    for command in ("ldd", "check"):
        cpu_ref = statistics.median(c for _w, c in times[(command, "before")])
        print(f"\nseedance {command}" + (f" {LDD_FILE.name}" if command == "ldd" else f" {TREE}")
              + "\n  (median wall, best wall, median CPU, change of the median CPU vs before)")
        for variant in ("before", "off", "on, ratio 0", "on, ratio 1"):
            walls = [w for w, _c in times[(command, variant)]]
            cpu = statistics.median(c for _w, c in times[(command, variant)])
            print(f"  {variant:<12} {statistics.median(walls) * 1000:7.1f} ms  {min(walls) * 1000:7.1f} ms  "
                  f"{cpu * 1000:7.1f} ms CPU  ({(cpu - cpu_ref) * 1000:+6.1f} ms, {cpu / cpu_ref - 1:+6.1%})")
        off = statistics.median(c for _w, c in times[(command, "off")])
        if off - cpu_ref > max(0.03 * cpu_ref, 0.002):
            print(f"  MISSED: tracing off costs {(off - cpu_ref) * 1000:.1f} ms CPU over before")
            missed = True
    print(f"\nseedance agent run (GC pass every 1 s, check every 2 s), the agent's own CPU (check children "
          f"excluded): its first {WARM_S:g} s, then {args.agent_seconds:g} s of steady state")
    for traced in (False, True):
        warm, steady, posts = agent_cpu(args.agent_seconds, traced, sink)
        print(f"  tracing {'on ' if traced else 'off'}  start-up {warm * 1000:5.0f} ms CPU, steady "
              f"{steady * 1000:5.0f} ms CPU ({steady / args.agent_seconds * 100:.2f}% of a core)"
              + (f", {posts} OTLP requests received" if traced else ""))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
