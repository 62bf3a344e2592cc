"""`seedance agent run` as a real process: sd_notify on a real NOTIFY_SOCKET, the status
socket, /metrics, SIGHUP reloading rules and config, SIGTERM stopping cleanly."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import run_cli

BIN = Path(sys.executable).parent


class RunningAgent:
    """One agent process with its own HOME/XDG dirs and a notify socket the test bound."""

    def __init__(self, root: Path, args=(), watchdog_usec=2_000_000):
        self.root = root
        self.runtime = root / "rt"
        self.runtime.mkdir(mode=0o700)
        self.env = {**os.environ, "HOME": str(root / "home"), "XDG_RUNTIME_DIR": str(self.runtime),
                    "XDG_CONFIG_HOME": str(root / "cfg"), "XDG_STATE_HOME": str(root / "state")}
        self.env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        name = f"seedance-agent-test-{os.getpid()}-{time.monotonic_ns()}"
        self.notify.bind("\0" + name)  # abstract namespace, as systemd uses in containers
        self.env["NOTIFY_SOCKET"] = "@" + name
        if watchdog_usec:
            self.env["WATCHDOG_USEC"] = str(watchdog_usec)
        self.messages: list[dict] = []
        self.log_path = root / "agent.log"
        self.args = ["agent", "run", "--no-scan", "--probes", "off", "--metrics", "127.0.0.1:0", *args]
        self.proc = None

    def start(self):
        exe = BIN / "seedance"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([str(exe), *self.args], env=self.env, stdout=subprocess.DEVNULL,
                                     stderr=self.log)
        self.wait_for(lambda m: m.get("READY") == "1", "READY=1")
        return self

    def receive(self, timeout=10.0):
        self.notify.settimeout(timeout)
        data = self.notify.recv(4096).decode()
        message = dict(line.split("=", 1) for line in data.splitlines())
        self.messages.append(message)
        return message

    def wait_for(self, predicate, what, timeout=20.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                message = self.receive(timeout=0.2)
            except socket.timeout:
                # messages sent before an exit are still queued: only give up once drained
                if self.proc.poll() is not None:
                    raise AssertionError(f"agent exited {self.proc.returncode} waiting for {what}: "
                                         f"{self.log_text()}") from None
                continue
            if predicate(message):
                return message
        raise AssertionError(f"no {what} from the agent; got {self.messages}; log: {self.log_text()}")

    def status(self):
        proc = run_cli("status", "--json", env=self.env)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def events(self):
        return [json.loads(line) for line in self.log_text().splitlines() if line.startswith("{")]

    def log_text(self):
        self.log.flush()
        return self.log_path.read_text()

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def close(self):
        # SIGTERM: the agent's own shutdown stops its scan child.  SIGKILL (stop()'s fallback
        # after 20 s) left that child and multiprocessing's resource tracker running after
        # every run (issue 17; tests/conftest.py now fails a session that leaves processes).
        self.stop()
        self.notify.close()
        self.log.close()


@pytest.fixture
def agent_root():
    root = Path(tempfile.mkdtemp(prefix="sd-agent-", dir="/tmp"))  # short: unix socket paths <= 108 bytes
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def agent(agent_root):
    running = RunningAgent(agent_root).start()
    yield running
    running.close()


def test_notify_ready_status_and_watchdog(agent):
    ready = agent.messages[-1]
    assert ready["READY"] == "1" and "STATUS" in ready and ready["MAINPID"] == str(agent.proc.pid)
    # WATCHDOG_USEC=2s: pings at half of it
    agent.wait_for(lambda m: m.get("WATCHDOG") == "1", "WATCHDOG=1", timeout=5)
    agent.wait_for(lambda m: m.get("WATCHDOG") == "1", "a second WATCHDOG=1", timeout=5)


def test_status_and_metrics(agent):
    status = agent.status()
    assert status["schema"] == "seedance.agent-status/v1"
    assert status["agent"]["pid"] == agent.proc.pid
    assert Path(status["agent"]["socket"]).parent.parent == agent.runtime
    assert Path(status["agent"]["state_db"]).is_file()
    text = run_cli("status", env=agent.env)
    assert text.returncode == 0 and "INSTANCES" in text.stdout and "LEAKS" in text.stdout
    body = urllib.request.urlopen(f"http://{status['agent']['metrics']}/metrics", timeout=5).read().decode()
    assert "seedance_gc_passes_total" in body and "seedance_agent_info" in body
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
              if line.startswith("seedance_")}
    assert values["seedance_agent_start_time_seconds"] == pytest.approx(status["agent"]["started"])
    assert values["seedance_gc_passes_total"] == status["counters"]["gc_passes"] or \
        values["seedance_gc_passes_total"] >= status["counters"]["gc_passes"]


def test_sighup_reloads_config_and_rules_and_keeps_running_on_bad_files(agent, agent_root):
    assert agent.status()["agent"]["config"]["gc_interval"] == "2s"
    rules_before = agent.status()["agent"]["rules"]
    config = agent_root / "cfg" / "seedance" / "agent.yaml"
    config.parent.mkdir(parents=True)
    # a rules dir with one extra rule, so a reload of the rules is visible in the count
    rules_dir = agent_root / "rules"
    shutil.copytree(Path(__file__).resolve().parents[2] / "rules", rules_dir,
                    ignore=shutil.ignore_patterns("__pycache__", "*.py", "*.md"))
    (rules_dir / "zz-extra.yaml").write_text(
        "rules:\n  - {id: zz-extra, title: t, severity: info, trap: t, layer: L1, fact: nothing,\n"
        "     condition: 'true', message: m, explain: e, metric: m, fix: f}\n")
    config.write_text(f"agent:\n  gc_interval: 1s\n  handle_mode: per-instance\n  rules_dir: {rules_dir}\n")
    agent.proc.send_signal(signal.SIGHUP)
    agent.wait_for(lambda m: m.get("RELOADING") == "1", "RELOADING=1")
    agent.wait_for(lambda m: m.get("READY") == "1", "READY=1 after reload")
    status = agent.status()
    assert status["agent"]["config"]["gc_interval"] == "1s"
    assert status["agent"]["config"]["handle_mode"] == "per-instance"
    assert status["agent"]["rules"] == rules_before + 1
    assert status["counters"]["reloads"] == 1
    # a broken rule file: the reload fails in one log line, the agent keeps the old rules
    (rules_dir / "zz-extra.yaml").write_text("rules: [ {id: broken\n")
    agent.proc.send_signal(signal.SIGHUP)
    agent.wait_for(lambda m: m.get("READY") == "1", "READY=1 after failed reload")
    status = agent.status()
    assert status["agent"]["rules"] == rules_before + 1 and status["counters"]["reloads"] == 1
    failed = [e for e in agent.events() if e["event"] == "reload-failed"]
    assert failed and "zz-extra.yaml" in failed[0]["error"]
    assert agent.proc.poll() is None


def test_sigterm_stops_cleanly(agent):
    socket_path = Path(agent.status()["agent"]["socket"])
    assert agent.stop(signal.SIGTERM) == 0
    stopping = [m for m in agent.messages if m.get("STOPPING") == "1"]
    if not stopping:
        stopping = [agent.wait_for(lambda m: m.get("STOPPING") == "1", "STOPPING=1", timeout=2)]
    assert stopping
    names = [e["event"] for e in agent.events()]
    assert names[-4:] == ["signal", "stopping", "state-flushed", "stopped"] or \
        names[-5:] == ["signal", "stopping", "probes-detached", "state-flushed", "stopped"]
    assert not socket_path.exists()  # no stale socket left behind
    # state flushed: the WAL was folded into the database (TRUNCATE checkpoint)
    db = Path(agent.env["XDG_STATE_HOME"]) / "seedance" / "agent.db"
    wal = db.with_name("agent.db-wal")
    assert db.is_file() and (not wal.exists() or wal.stat().st_size == 0)


def test_no_agent_is_one_line_exit_3(agent_root):
    env = {"HOME": str(agent_root), "XDG_RUNTIME_DIR": str(agent_root)}
    proc = run_cli("status", env=env)
    assert proc.returncode == 3  # systemctl status: "program is not running"
    assert proc.stderr.count("\n") == 1 and "no agent running" in proc.stderr


def test_second_agent_refuses_to_start(agent):
    proc = run_cli(*agent.args, env={**agent.env, "NOTIFY_SOCKET": ""}, timeout=30)
    assert proc.returncode == 2
    assert "already running" in proc.stderr and "Traceback" not in proc.stderr


def test_non_loopback_metrics_refused_before_start(agent_root):
    runtime = agent_root / "rt2"
    runtime.mkdir(mode=0o700)
    env = {"HOME": str(agent_root / "h"), "XDG_RUNTIME_DIR": str(runtime)}
    proc = run_cli("agent", "run", "--no-scan", "--probes", "off", "--metrics", "0.0.0.0:9464", env=env, timeout=30)
    assert proc.returncode == 2
    assert "loopback only" in proc.stderr and "Traceback" not in proc.stderr


def test_fix_handle_leak_reconfigures_the_running_agent(agent):
    code = (
        "import sys; from seedance.fix import handle_leak; "
        "r = handle_leak.apply('per-instance', '1s'); print(r.agent)")
    proc = subprocess.run([sys.executable, "-c", code], env=agent.env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "reloading" in proc.stdout
    agent.wait_for(lambda m: m.get("RELOADING") == "1", "RELOADING=1")
    agent.wait_for(lambda m: m.get("READY") == "1", "READY=1 after reload")
    config = agent.status()["agent"]["config"]
    assert (config["handle_mode"], config["gc_interval"]) == ("per-instance", "1s")


def test_periodic_check_keeps_the_latest_report(agent_root):
    # a program whose NEEDED library is gone: the check's needed-unresolved finding
    target = agent_root / "scan"
    target.mkdir()
    (target / "l.c").write_text("int f(void){return 1;}\n")
    (target / "m.c").write_text("int f(void); int main(void){return f();}\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", target / "libgone.so", target / "l.c"], check=True)
    subprocess.run(["cc", "-o", target / "app", target / "m.c", f"-L{target}", "-lgone"], check=True)
    (target / "libgone.so").unlink()
    running = RunningAgent(agent_root, watchdog_usec=0)
    running.args = [a for a in running.args if a != "--no-scan"] + ["--scan-interval", "1s", "--scan-path", str(target)]
    running.start()
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            status = running.status()
            if status["counters"]["scans"] >= 2:
                break
            time.sleep(0.5)
        assert status["counters"]["scans"] >= 2, status["scan"]
        scan = [f for f in status["findings"] if f["origin"] == "scan"]
        assert [f["rule"] for f in scan] == ["needed-unresolved"]
        assert scan[0]["subject"]["path"] == str(target / "app")
        assert scan[0]["seen"] >= 2  # the same finding, refreshed by each check, not duplicated
        # fixed on disk: the next check's report replaces the old one and the finding goes
        (target / "app").unlink()
        scans = status["counters"]["scans"]
        while time.monotonic() < deadline and running.status()["counters"]["scans"] < scans + 2:
            time.sleep(0.5)
        assert [f for f in running.status()["findings"] if f["origin"] == "scan"] == []
    finally:
        running.close()


def test_otlp_export_from_the_running_agent(agent_root):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="OTLP exporter not installed")
    import http.server
    import threading

    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    received = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    running = RunningAgent(agent_root, args=("--otlp-endpoint", f"http://127.0.0.1:{server.server_port}"),
                           watchdog_usec=0)
    running.env["SEEDANCE_OTLP_INTERVAL"] = "0.5"
    running.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not received:
            time.sleep(0.2)
        assert received, "no OTLP export arrived"
        assert running.status()["agent"]["otlp"] == f"http://127.0.0.1:{server.server_port}/v1/metrics"
    finally:
        running.close()
        server.shutdown()
    request = ExportMetricsServiceRequest.FromString(received[-1])
    names = {m.name for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert {"seedance.gc_passes", "seedance.leaks_reported", "seedance.instances"} <= names


def test_corrupt_state_is_moved_aside_with_a_message(agent_root):
    db = agent_root / "state" / "seedance" / "agent.db"
    db.parent.mkdir(parents=True)
    db.write_bytes(b"\x00garbage that is not SQLite\x00" * 512)
    original = db.read_bytes()
    running = RunningAgent(agent_root, watchdog_usec=0).start()
    try:
        corrupt = [e for e in running.events() if e["event"] == "state-corrupt"]
        assert len(corrupt) == 1 and corrupt[0]["level"] == "error"
        aside = Path(corrupt[0]["moved_to"])
        assert aside.read_bytes() == original and str(aside) in corrupt[0]["message"]
        status = running.status()
        assert status["agent"]["state_moved_aside"] == str(aside)
        text = run_cli("status", env=running.env).stdout
        assert f"moved aside to {aside}" in text
    finally:
        running.close()
