#!/usr/bin/env python3
"""The agent under churn: 500 wrapped instances on the fake driver, some SIGKILLed.

The agent's acceptance targets, measured in one run:

- agent RSS (VmHWM, the high-water mark) <= 150 MB with the trace probes attached; the
  probes run as the agent's child (`seedance trace --json`, bcc/LLVM), whose RSS is
  printed beside it, and a bare python3 interpreter's RSS is printed as the floor;
- idle CPU <= 1% of a core: agent (and probe child) CPU time over the idle tail of the run,
  after the churn has settled (the instance starts are spread over --churn-share of the
  run, half by default, so the agent lives under churn for minutes, not one burst);
- every dead instance's leak reported exactly once, with its exact bytes;
- no registry slot lost: the registry is empty at the end and the agent has no ended
  instance it did not reclaim.

Each instance is `seedance run -- sdtest ...` (tests/shim/sdtest.c over the fake
libcuda.so.1 of tests/fakecuda, both built here) and allocates a size unique to it, so a
report is matched to its instance by bytes.  Three kinds, in a fixed shuffled order:
  clean   allocates, frees everything, exits;
  leaky   allocates and exits without freeing: the `seedance run` wrapper lives on, so
          either its run report or the agent reports it (the union must be exactly once);
  killed  allocates, then the whole process group (program and wrapper) is SIGKILLed,
          like an OOM or cgroup kill: only the agent is left to report and reclaim it.

    .venv/bin/python bench/bench_agent_churn.py [--minutes 10] [--instances 500]
        [--probes on|off|auto] [--json FILE]

Not a test: it takes --minutes (default 10) of wall time and most of two cores while the
churn runs.  Run it as root for the probes.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CUDA_INCLUDE = Path("/usr/local/cuda/include")
BASE_BYTES = 1 << 20
STEP_BYTES = 4096
LEAK_LINE = re.compile(r"ended holding (\d+) bytes")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def build(out: Path) -> Path:
    inc = ["-I", str(CUDA_INCLUDE)] if (CUDA_INCLUDE / "cuda.h").exists() else []
    for args in (["-O2", "-fPIC", "-shared", *inc, "-Wl,-soname,libcuda.so.1", ROOT / "tests/fakecuda/fakecuda.c",
                  "-o", out / "libcuda.so.1", "-pthread"],
                 ["-O2", *inc, ROOT / "tests/shim/sdtest.c", "-o", out / "sdtest", "-pthread", "-ldl"]):
        subprocess.run(["cc", *map(str, args)], check=True, capture_output=True, text=True)
    return out / "sdtest"


def proc_status(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def bare_python_rss() -> int:
    proc = subprocess.run([sys.executable, "-c", "print(open('/proc/self/status').read())"],
                          capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Agent:
    def __init__(self, env: dict, probes: str, log: Path):
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        name = f"seedance-bench-{os.getpid()}"
        self.notify.bind("\0" + name)
        agent_env = {**env, "NOTIFY_SOCKET": "@" + name}
        self.proc = subprocess.Popen([sys.executable, "-m", "seedance", "agent", "run", "--gc-interval", "2s", "--no-scan",
                                      "--probes", probes, "--metrics", "127.0.0.1:0"], env=agent_env,
                                     stdout=subprocess.DEVNULL, stderr=open(log, "w"))
        self.log = log
        self.notify.settimeout(180)
        while True:  # READY=1 comes after the probes are attached (bcc compiles first)
            message = self.notify.recv(4096).decode()
            if "READY=1" in message:
                break
        # stop listening: nobody would drain it (the agent's sends do not block on that)
        self.notify.close()
        self.env = env

    def status(self) -> dict:
        proc = subprocess.run([sys.executable, "-m", "seedance", "status", "--json"], env=self.env, capture_output=True,
                              text=True, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"seedance status: {proc.stderr.strip()}")
        return json.loads(proc.stdout)

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]

    def stop(self) -> int | str:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return "did not stop within 60s of SIGTERM"
        finally:
            pass


def run_instance(index: int, kind: str, sdtest: Path, env: dict, rng: random.Random) -> dict:
    size = BASE_BYTES + index * STEP_BYTES
    steps = ["init", f"ctx:{index % 2}", f"alloc:{size}", f"alloc:{STEP_BYTES}"]
    steps += {"clean": ["free:all"], "leaky": [], "killed": ["sleep:120000"]}[kind]
    proc = subprocess.Popen([sys.executable, "-m", "seedance", "run", "--", str(sdtest), "--via", "dlsym", *steps], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    allocated = 0
    if kind == "killed":
        for line in proc.stdout:
            allocated += line.startswith("alloc result=0")
            if allocated == 2:
                break
        time.sleep(rng.uniform(0.0, 0.5))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.stdout.close()
        proc.wait()
        stderr = proc.stderr.read()
    else:
        stdout, stderr = proc.communicate(timeout=120)
        allocated = stdout.count("alloc result=0")
    run_reported = [int(m.group(1)) for m in LEAK_LINE.finditer(stderr)]
    return {"index": index, "kind": kind, "bytes": size + STEP_BYTES, "allocated": allocated,
            "returncode": proc.returncode, "run_reported": run_reported}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="total wall time (default 10)")
    parser.add_argument("--instances", type=int, default=500)
    parser.add_argument("--killed", type=float, default=0.3, help="fraction SIGKILLed (default 0.3)")
    parser.add_argument("--leaky", type=float, default=0.3, help="fraction exiting without freeing (default 0.3)")
    parser.add_argument("--concurrency", type=int, default=8, help="instances running at once (default 8)")
    parser.add_argument("--churn-share", type=float, default=0.5,
                        help="spread the instance starts over this share of the run (default 0.5); "
                             "the rest is the idle window")
    parser.add_argument("--probes", choices=("on", "off", "auto"), default="auto")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (agent log, state db)")
    args = parser.parse_args(argv)

    from seedance import shim
    shim.library_path()  # NotAvailable (one line) when the shim is not built

    work = Path(tempfile.mkdtemp(prefix="sd-churn-", dir="/tmp"))
    try:
        sdtest = build(work)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SEEDANCE_", "FAKECUDA_", "CUDA_", "OTEL_"))
               and k not in ("LD_PRELOAD", "NOTIFY_SOCKET")}
        env.update(HOME=str(work / "home"), XDG_CONFIG_HOME=str(work / "cfg"), XDG_STATE_HOME=str(work / "state"),
                   XDG_RUNTIME_DIR=str(work / "xdg"), SEEDANCE_RUNTIME_DIR=str(work / "rt"),
                   LD_LIBRARY_PATH=str(work), FAKECUDA_DEVICES="2", FAKECUDA_LEDGER=str(work / "ledger"))
        # a private copy of the shim: a rebuild of the tree's copy during the run must not
        # change the library under the instances (`seedance run` and the agent honour this)
        shutil.copy2(shim.library_path(), work / "libseedance_shim.so")
        env["SEEDANCE_SHIM_LIB"] = str(work / "libseedance_shim.so")
        return _bench(args, work, sdtest, env)
    finally:
        if args.keep:
            print(f"bench: kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def _bench(args, work: Path, sdtest: Path, env: dict) -> int:
    rng = random.Random(args.seed)
    n_killed = int(args.instances * args.killed)
    n_leaky = int(args.instances * args.leaky)
    kinds = ["killed"] * n_killed + ["leaky"] * n_leaky + ["clean"] * (args.instances - n_killed - n_leaky)
    rng.shuffle(kinds)
    deadline = time.monotonic() + args.minutes * 60

    print(f"bench: starting the agent (probes {args.probes}) ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    agent = Agent(env, args.probes, work / "agent.log")
    try:
        return _measure(args, work, sdtest, env, agent, started, kinds, n_killed, n_leaky, deadline)
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait()


def _measure(args, work, sdtest, env, agent, started, kinds, n_killed, n_leaky, deadline) -> int:
    ready_s = time.monotonic() - started
    status = agent.status()
    probe_pid = status["agent"]["probes"].get("pid")
    print(f"bench: agent pid {agent.proc.pid} ready in {ready_s:.1f}s; probes {status['agent']['probes']}",
          file=sys.stderr, flush=True)

    peak = {"agent": 0, "probes": 0, "sum": 0}
    sampling = threading.Event()

    def sample_rss():
        while not sampling.is_set():
            a, p = proc_status(agent.proc.pid, "VmRSS"), proc_status(probe_pid, "VmRSS") if probe_pid else 0
            peak["agent"], peak["probes"], peak["sum"] = max(peak["agent"], a), max(peak["probes"], p), \
                max(peak["sum"], a + p)
            sampling.wait(0.5)

    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()

    print(f"bench: churn of {args.instances} instances ({n_killed} SIGKILLed, {n_leaky} leaky) ...",
          file=sys.stderr, flush=True)
    churn_started = time.monotonic()
    results = []
    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        # paced: instance i starts no earlier than i * spacing, so the agent lives under
        # churn for a share of the run instead of one burst
        spacing = args.minutes * 60 * args.churn_share / max(1, len(kinds))

        def paced(i, kind):
            delay = churn_started + i * spacing - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            return run_instance(i, kind, sdtest, env, random.Random(args.seed * 1000 + i))

        futures = [pool.submit(paced, i, kind) for i, kind in enumerate(kinds)]
        for done, future in enumerate(futures, 1):
            results.append(future.result())
            if done % 50 == 0:
                print(f"bench: {done}/{args.instances} instances done", file=sys.stderr, flush=True)
    churn_s = time.monotonic() - churn_started
    rss_after_churn = proc_status(agent.proc.pid, "VmRSS")

    # settle: three GC intervals after the last instance, then the agent must be idle
    time.sleep(6.0)
    status = agent.status()
    idle_s = max(30.0, deadline - time.monotonic())
    cpu0 = (cpu_seconds(agent.proc.pid), cpu_seconds(probe_pid) if probe_pid else 0.0)
    wall0 = time.monotonic()
    print(f"bench: churn took {churn_s:.0f}s; measuring idle CPU for {idle_s:.0f}s ...", file=sys.stderr, flush=True)
    time.sleep(idle_s)
    wall = time.monotonic() - wall0
    cpu1 = (cpu_seconds(agent.proc.pid), cpu_seconds(probe_pid) if probe_pid else 0.0)
    idle_agent = (cpu1[0] - cpu0[0]) / wall * 100
    idle_probes = (cpu1[1] - cpu0[1]) / wall * 100
    final = agent.status()
    hwm = proc_status(agent.proc.pid, "VmHWM")
    rss_end = proc_status(agent.proc.pid, "VmRSS")
    probes_hwm = proc_status(probe_pid, "VmHWM") if probe_pid else 0
    sampling.set()
    stop_started = time.monotonic()
    stop_code = agent.stop()
    stop_s = time.monotonic() - stop_started
    events = agent.events()

    registry_left = subprocess.run(
        [sys.executable, "-c", "import json; from seedance import shim; "
         "print(json.dumps([[i.slot, i.pid, i.alive] for i in shim.Registry.open().instances()]))"],
        env=env, capture_output=True, text=True)
    slots_left = json.loads(registry_left.stdout) if registry_left.returncode == 0 else None
    conn = sqlite3.connect(work / "state" / "seedance" / "agent.db")
    history = conn.execute("SELECT pid, leaked_bytes, ended, reclaimed FROM instances WHERE ended IS NOT NULL").fetchall()
    conn.close()

    agent_reports: dict[int, int] = {}
    for event in events:
        if event["event"] == "leak":
            agent_reports[event["bytes"]] = agent_reports.get(event["bytes"], 0) + 1
    probe_leaks = sum(1 for e in events if e["event"] == "finding" and e.get("origin") == "probes"
                      and e["finding"]["rule"] == "handle-leak")
    by_kind = {"killed": [], "leaky": [], "clean": []}
    for r in results:
        by_kind[r["kind"]].append(r)
    problems = []
    killed_once = sum(1 for r in by_kind["killed"] if agent_reports.get(r["bytes"], 0) == 1)
    for r in by_kind["killed"]:
        if r["allocated"] != 2:
            problems.append(f"instance {r['index']} (killed) allocated {r['allocated']}/2 before the kill")
        elif agent_reports.get(r["bytes"], 0) != 1:
            problems.append(f"instance {r['index']} (killed, {r['bytes']} B): agent reported it "
                            f"{agent_reports.get(r['bytes'], 0)} times")
    leaky_once = 0
    leaky_by_agent = 0
    for r in by_kind["leaky"]:
        total = agent_reports.get(r["bytes"], 0) + r["run_reported"].count(r["bytes"])
        leaky_by_agent += agent_reports.get(r["bytes"], 0)
        leaky_once += total == 1
        if total != 1:
            problems.append(f"instance {r['index']} (leaky, {r['bytes']} B): reported {total} times "
                            f"(agent {agent_reports.get(r['bytes'], 0)}, run report {r['run_reported'].count(r['bytes'])})")
    for r in by_kind["clean"]:
        if agent_reports.get(r["bytes"], 0) or r["run_reported"]:
            problems.append(f"instance {r['index']} (clean) was reported as a leak")
    unreclaimed = [h for h in history if h[3] is None]
    agent_free = final.get("registry", {}).get("free_slots")
    total_slots = final.get("registry", {}).get("slots")
    if slots_left is None:
        # a fresh reader could not open the registry (a shim of another layout installed
        # meanwhile): judge by the agent's own view of it, through the binding it runs
        problems.append(f"registry unreadable from a fresh process: {registry_left.stderr.strip()[-200:]}")
    elif slots_left:
        problems.append(f"registry slots left at the end: {slots_left}")
    if agent_free is None or agent_free != total_slots:
        problems.append(f"the agent sees {agent_free} free registry slots of {total_slots} at the end")
    if unreclaimed:
        problems.append(f"{len(unreclaimed)} ended instances the agent did not reclaim")

    figures = {
        "instances": args.instances, "killed": n_killed, "leaky": n_leaky, "clean": len(by_kind["clean"]),
        "minutes": args.minutes, "churn_s": round(churn_s, 1), "concurrency": args.concurrency, "idle_window_s": round(wall, 1),
        "agent_ready_s": round(ready_s, 1), "probes": final["agent"]["probes"],
        "agent_rss_peak_mb": round(max(peak["agent"], hwm) / 2**20, 1),
        "agent_rss_after_churn_mb": round(rss_after_churn / 2**20, 1),
        "agent_rss_at_end_mb": round(rss_end / 2**20, 1),
        "probe_child_rss_peak_mb": round(max(peak["probes"], probes_hwm) / 2**20, 1),
        "agent_plus_probes_rss_peak_mb": round(peak["sum"] / 2**20, 1),
        "bare_python_rss_mb": round(bare_python_rss() / 2**20, 1),
        "idle_cpu_agent_pct_of_core": round(idle_agent, 3),
        "idle_cpu_probe_child_pct_of_core": round(idle_probes, 3),
        # the probes trace the whole host: how busy it was while "idle" (other work on it)
        "host_probe_events_per_s_during_idle": round(
            (final["counters"]["probe_events"] - status["counters"]["probe_events"]) / wall, 1),
        "killed_reported_exactly_once_by_agent": f"{killed_once}/{n_killed}",
        "leaky_reported_exactly_once_run_or_agent": f"{leaky_once}/{n_leaky}",
        "leaky_reported_by_agent": leaky_by_agent,
        "probe_handle_leak_findings_for_wrapped": probe_leaks,
        "agent_counters": final["counters"],
        "registry_slots_left": slots_left, "agent_view_free_slots": agent_free,
        "ended_not_reclaimed": len(unreclaimed),
        "agent_exit_on_sigterm": stop_code, "agent_stop_s": round(stop_s, 1),
        "probe_detach": [e["event"] for e in events if e["event"].startswith("probes-detach")],
        "problems": problems[:20], "problem_count": len(problems),
    }
    targets = {"agent RSS <= 150 MB": figures["agent_rss_peak_mb"] <= 150,
               "idle CPU <= 1% of a core (agent)": idle_agent <= 1.0,
               "every dead instance's leak reported exactly once": not [p for p in problems if "report" in p],
               "no slot lost": agent_free is not None and agent_free == total_slots and slots_left in ([], None) and not unreclaimed}
    figures["targets"] = targets
    print(json.dumps(figures, indent=2))
    for name, ok in targets.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    print(f"       agent RSS peak {figures['agent_rss_peak_mb']} MB (probe child {figures['probe_child_rss_peak_mb']} MB, "
          f"together {figures['agent_plus_probes_rss_peak_mb']} MB; a bare python3 is {figures['bare_python_rss_mb']} MB)")
    print(f"       idle CPU: agent {idle_agent:.3f}% of a core, probe child {idle_probes:.3f}% "
          f"(host events traced meanwhile: {figures['host_probe_events_per_s_during_idle']}/s)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if all(targets.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
