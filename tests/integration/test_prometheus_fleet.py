"""Three real agents scraped by a real Prometheus, with deploy/prometheus-rules.yaml loaded.

Debian's prometheus runs on a loopback port with its own data directory and scrapes three
`seedance agent run` processes, each on its own loopback metrics port with its own state
and runtime directories, each checking its own tree (--scan-path):
  a: a planted trap (a program whose NEEDED library is gone: needed-unresolved, an error)
     beside CUDA runtime 12;
  b: CUDA runtime 12, nothing wrong;
  c: CUDA runtime 11, nothing wrong: the host whose stack differs from its group.
The rules are the shipped ones with every `for:` and evaluation interval cut to one second
(the test's copy); the test reads Prometheus' HTTP API only.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PROMETHEUS = shutil.which("prometheus")
GCC = shutil.which("gcc")
SITE = Path(__import__("sysconfig").get_paths()["purelib"])
CUDART = SITE / "nvidia" / "cuda_runtime" / "lib"
DEADLINE_S = 120

pytestmark = [
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian: apt-get install prometheus)"),
    pytest.mark.skipif(GCC is None, reason="gcc not installed"),
    pytest.mark.skipif(not (CUDART / "libcudart.so.12").exists() or not (CUDART / "libcudart.so.11.0").exists(),
                       reason="nvidia-cuda-runtime-cu11/cu12 wheels not installed"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plant_trap(tree: Path, work: Path) -> None:
    (work / "gone.c").write_text("int gone(void) { return 1; }\n")
    subprocess.run([GCC, "-shared", "-fPIC", work / "gone.c", "-o", work / "libgone.so"], check=True)
    (work / "app.c").write_text("int gone(void);\nint main(void) { return gone(); }\n")
    subprocess.run([GCC, work / "app.c", "-o", tree / "app", f"-L{work}", "-lgone"], check=True)
    (work / "libgone.so").unlink()


class Agent:
    def __init__(self, root: Path, name: str, tree: Path):
        self.name, self.root = name, root / name
        self.root.mkdir()
        (self.root / "rt").mkdir(mode=0o700)
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("OTEL_", "SEEDANCE_", "NOTIFY_", "WATCHDOG_")) and k != "TRACEPARENT"}
        self.env.update(HOME=str(self.root / "home"), XDG_CONFIG_HOME=str(self.root / "cfg"),
                        XDG_STATE_HOME=str(self.root / "state"), SEEDANCE_RUNTIME_DIR=str(self.root / "rt"))
        self.log_path = self.root / "agent.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [str(BIN / "seedance"), "agent", "run", "--probes", "off", "--metrics", "127.0.0.1:0",
             "--scan-interval", "1s", "--scan-path", str(tree)],
            env=self.env, stdout=subprocess.DEVNULL, stderr=self.log)
        self.address = None

    def started(self) -> bool:
        for line in self.log_path.read_text().splitlines():
            if line.startswith("{"):
                event = json.loads(line)
                if event.get("event") == "started" or event.get("msg") == "started":
                    self.address = event.get("metrics")
        if self.proc.poll() is not None:
            raise AssertionError(f"agent {self.name} exited {self.proc.returncode}: {self.log_path.read_text()}")
        return self.address is not None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def short_windows(tmp: Path) -> Path:
    """The shipped rules with every `for:` and rule-group interval cut to one second."""
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus-rules.yaml").read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "1s"
    out = tmp / "rules.yaml"
    out.write_text(yaml.safe_dump(rules, sort_keys=False))
    return out


class Prometheus:
    def __init__(self, tmp: Path, targets: list, rules: Path):
        self.port = free_port()
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
                  "rule_files": [str(rules)],
                  "scrape_configs": [{"job_name": "seedance-agent",
                                      "static_configs": [{"targets": targets, "labels": {"group": "pool-test"}}]}]}
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = open(tmp / "prometheus.log", "w")
        self.log_path = tmp / "prometheus.log"
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=tmp)

    def api(self, path: str, **params):
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2).close()
            return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def wait_until(what: str, check, deadline: float, describe=lambda: ""):
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: {describe()}")


def test_a_real_prometheus_fires_the_trap_and_drift_alerts_for_the_right_agent_only():
    tmp = Path(tempfile.mkdtemp(prefix="sd-fleet-", dir="/tmp"))  # short: unix socket paths
    agents, prometheus = [], None
    try:
        trees = {}
        for name, runtime in (("a", "libcudart.so.12"), ("b", "libcudart.so.12"), ("c", "libcudart.so.11.0")):
            tree = trees[name] = tmp / f"tree-{name}"
            tree.mkdir()
            shutil.copy(CUDART / runtime, tree / runtime)
        plant_trap(trees["a"], tmp)
        deadline = time.monotonic() + DEADLINE_S
        agents = [Agent(tmp, name, trees[name]) for name in ("a", "b", "c")]
        wait_until("the agents' metrics addresses", lambda: all(agent.started() for agent in agents), deadline,
                   lambda: [a.log_path.read_text()[-500:] for a in agents])
        instance = {agent.name: agent.address for agent in agents}
        prometheus = Prometheus(tmp, list(instance.values()), short_windows(tmp))
        wait_until("prometheus ready", prometheus.ready, deadline)

        # the seedance series, through Prometheus: every agent up and its stack recorded
        def stacks():
            result = prometheus.api("query", query="seedance_gpu_stack_info")["result"]
            return {r["metric"]["instance"]: r["metric"] for r in result} if len(result) == 3 else None

        stack = wait_until("seedance_gpu_stack_info from all three agents", stacks, deadline,
                           lambda: prometheus.api("targets"))
        assert {stack[instance[n]]["cuda_runtime"] for n in "ab"} == {"12"}
        assert stack[instance["c"]]["cuda_runtime"] == "11.0"
        assert {stack[instance[n]]["driver"] for n in "abc"} == {"none"}  # no NVIDIA driver here
        up = prometheus.api("query", query='up{job="seedance-agent"}')["result"]
        assert sorted((r["metric"]["instance"], r["value"][1]) for r in up) == sorted((a, "1") for a in instance.values())
        scans = prometheus.api("query", query="seedance_scans_total")["result"]
        assert len(scans) == 3

        def firing():
            alerts = prometheus.api("alerts")["alerts"]
            active = [a for a in alerts if a["state"] == "firing"]
            names = {(a["labels"]["alertname"], a["labels"].get("instance")) for a in active}
            wanted = {("SeedanceErrorFinding", instance["a"]), ("SeedanceStackDrift", instance["c"])}
            return active if wanted <= names else None

        active = wait_until("the trap's and the drift alert", firing, deadline,
                            lambda: prometheus.api("alerts"))
        errors = [a["labels"] for a in active if a["labels"]["alertname"] == "SeedanceErrorFinding"]
        drift = [a["labels"] for a in active if a["labels"]["alertname"] == "SeedanceStackDrift"]
        assert [(e["instance"], e["rule"]) for e in errors] == [(instance["a"], "needed-unresolved")]
        assert [(d["instance"], d["drift_label"], d["cuda_runtime"]) for d in drift] == \
            [(instance["c"], "cuda_runtime", "11.0")]
        others = {a["labels"]["alertname"] for a in active} - {"SeedanceErrorFinding", "SeedanceStackDrift"}
        assert others == set(), active  # nothing else is wrong with these three
        # the fleet view agrees: one host with the error, two hosts on runtime 12
        view = prometheus.api("query", query="seedance:hosts_with_error_findings:count_by_rule")["result"]
        assert [(r["metric"]["rule"], r["value"][1]) for r in view] == [("needed-unresolved", "1")]
    finally:
        if prometheus is not None:
            prometheus.stop()
        for agent in agents:
            agent.stop()
        shutil.rmtree(tmp, ignore_errors=True)
