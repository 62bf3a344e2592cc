"""Attacks on the resident agent (issue 10 items 4 and 8), each against the real servers.

The status socket and /metrics run for real (unix socket, TCP on loopback, real threads);
SIGHUP and start-up are tried on a real `seedance agent run` process.  What is checked is
what an operator sees: the server still answers, the process is still up, the error is one
line.  Nothing here asserts on elapsed time: a slow client is measured by how many bytes it
got to send before it was cut off.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from seedance.service import metrics as metrics_mod
from seedance.service.api import StatusServer, request
from tests.conftest import run_cli
from tests.integration.test_agent_lifecycle import RunningAgent
from tests.security.test_yaml_limits import alias_bomb, deep_block


@pytest.fixture
def runtime():
    path = Path(tempfile.mkdtemp(prefix="sd-atk-", dir="/tmp"))  # unix socket paths <= 108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def status_server(runtime):
    srv = StatusServer(runtime / "seedance" / "agent.sock", lambda message: {"pong": True, "op": message.get("op")})
    srv.start()
    yield srv
    srv.stop()


def _raw(path: Path, payload: bytes, timeout: float = 10.0) -> str:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        sock.sendall(payload)
        chunks = []
        while True:
            data = sock.recv(65536)
            if not data:
                break
            chunks.append(data)
        return b"".join(chunks).decode("utf-8", "replace")
    finally:
        sock.close()


def _dribble(connect, first: bytes, limit: int, interval: float = 1.5) -> int:
    """Send one byte every `interval` s until the server closes; how many it took (or limit)."""
    sock = connect()
    sent = 0
    try:
        for byte in (first * limit)[:limit]:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                return sent
            sent += 1
            # closed by the server (EOF or an error reply) while we wait for the next byte
            sock.settimeout(interval)
            try:
                data = sock.recv(4096, socket.MSG_PEEK)
                if data == b"" or data:
                    return sent
            except socket.timeout:
                continue
            except OSError:
                return sent
        return sent
    finally:
        sock.close()


def test_2000_brackets_get_an_error_reply_and_the_socket_keeps_answering(status_server):
    reply = json.loads(_raw(status_server.path, b"[" * 2000 + b"\n"))
    assert "error" in reply
    for _ in range(3):  # the server thread survived: every later client is answered
        assert request(status_server.path, "ping", timeout=5)["pong"] is True


def test_a_dribbling_client_is_cut_off_and_does_not_block_others(status_server):
    def connect():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(status_server.path))
        return sock

    result = {}
    slow = threading.Thread(target=lambda: result.setdefault("sent", _dribble(connect, b'{"op": "status"', 12)))
    slow.start()
    time.sleep(0.5)  # the dribbler is connected and mid-request
    answered = [request(status_server.path, "ping", timeout=5)["pong"] for _ in range(3)]
    slow.join(timeout=60)
    assert answered == [True, True, True]
    # 12 bytes at one per 1.5 s would take 18 s: cut off well before by the request deadline
    assert result["sent"] < 6, result


def test_many_idle_clients_do_not_stop_the_socket(status_server):
    idle = []
    for _ in range(8):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(status_server.path))
        idle.append(sock)
    try:
        assert request(status_server.path, "ping", timeout=5)["pong"] is True
    finally:
        for sock in idle:
            sock.close()


@pytest.fixture
def metrics_server(monkeypatch):
    monkeypatch.setattr(metrics_mod, "CONNECTION_DEADLINE_S", 3.0, raising=False)
    server = metrics_mod.MetricsServer("127.0.0.1:0", lambda: {"agent": {"version": "t"}, "counters": {"scans": 7}})
    server.start()
    yield server
    server.stop()


def _scrape(server) -> str:
    return urllib.request.urlopen(f"http://{server.address}/metrics", timeout=5).read().decode()


def test_an_idle_connection_does_not_stall_metrics(metrics_server):
    idle = socket.create_connection(("127.0.0.1", metrics_server.port), timeout=5)  # sends nothing
    try:
        for _ in range(3):
            assert "seedance_scans_total 7.0" in _scrape(metrics_server)
    finally:
        idle.close()


def test_a_dribbling_metrics_client_is_cut_off_and_others_are_served(metrics_server):
    result = {}
    connect = lambda: socket.create_connection(("127.0.0.1", metrics_server.port), timeout=5)  # noqa: E731
    slow = threading.Thread(target=lambda: result.setdefault(
        "sent", _dribble(connect, b"GET /metrics HTTP/1.1\r\nHost: x\r\n", 12)))
    slow.start()
    time.sleep(0.5)
    assert "seedance_scans_total 7.0" in _scrape(metrics_server)
    slow.join(timeout=60)
    assert result["sent"] < 6, result


# --- a real agent process -------------------------------------------------------------------

@pytest.fixture
def agent_root():
    root = Path(tempfile.mkdtemp(prefix="sd-atk-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


BAD_CONFIGS = {
    "alias-bomb": alias_bomb().encode(),
    "deep-nesting": deep_block().encode(),
    "not-utf8": b"agent:\n  gc_interval: 1s # caf\xe9\n",
    "rules_dir-a-number": b"agent:\n  rules_dir: 5\n",
    "agent-a-list": b"agent: [1, 2]\n",
    "syntax": b"agent: {gc_interval: [\n",
    "gc_interval-nan": b"agent:\n  gc_interval: .nan\n",  # select(nan) ended the loop
}


def test_bad_agent_yaml_on_sighup_keeps_the_old_config(agent_root):
    agent = RunningAgent(agent_root).start()
    try:
        config = agent_root / "cfg" / "seedance" / "agent.yaml"
        config.parent.mkdir(parents=True)
        config.write_text("agent:\n  gc_interval: 3s\n")
        agent.proc.send_signal(signal.SIGHUP)
        agent.wait_for(lambda m: m.get("READY") == "1", "READY=1 after a good reload")
        assert agent.status()["agent"]["config"]["gc_interval"] == "3s"
        for name, payload in BAD_CONFIGS.items():
            config.write_bytes(payload)
            agent.proc.send_signal(signal.SIGHUP)
            agent.wait_for(lambda m: m.get("READY") == "1", f"READY=1 after the {name} reload")
            assert agent.proc.poll() is None, f"{name}: {agent.log_text()}"
            status = agent.status()
            assert status["agent"]["config"]["gc_interval"] == "3s", name
            assert status["counters"]["reloads"] == 1, name
        failed = [e for e in agent.events() if e["event"] == "reload-failed"]
        assert len(failed) == len(BAD_CONFIGS), agent.log_text()
        assert "Traceback" not in agent.log_text()
        # and the socket still takes 2000 '[' from the agent's own client uid
        reply = json.loads(_raw(Path(agent.status()["agent"]["socket"]), b"[" * 2000 + b"\n"))
        assert "error" in reply and agent.status()["agent"]["pid"] == agent.proc.pid
    finally:
        agent.close()


def _agent_env(root: Path) -> dict:
    return {"HOME": str(root / "home"), "XDG_RUNTIME_DIR": str(root / "rt"), "XDG_CONFIG_HOME": str(root / "cfg"),
            "XDG_STATE_HOME": str(root / "state"), "NOTIFY_SOCKET": ""}


def _one_line_exit_2(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("seedance: error:"), proc.stderr
    assert proc.stdout == "" and not any(line.lstrip().startswith("{") for line in lines)
    return lines[0]


@pytest.mark.parametrize("args,says", [
    (["--metrics", "0.0.0.0:9464"], "loopback only"),
    (["--rules", "/nonexistent"], "/nonexistent"),
])
def test_agent_run_with_a_bad_flag_is_one_line_exit_2(agent_root, args, says):
    proc = run_cli("agent", "run", "--probes", "off", "--no-scan", *args, env=_agent_env(agent_root), timeout=60)
    assert says in _one_line_exit_2(proc)
    assert not (agent_root / "state").exists()  # refused before any file was made


@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
def test_agent_run_with_a_bad_agent_yaml_is_one_line_exit_2(agent_root, name):
    config = agent_root / "cfg" / "seedance" / "agent.yaml"
    config.parent.mkdir(parents=True)
    config.write_bytes(BAD_CONFIGS[name])
    proc = run_cli("agent", "run", "--probes", "off", "--no-scan", env=_agent_env(agent_root), timeout=60)
    assert "agent.yaml" in _one_line_exit_2(proc)


def test_agent_run_with_a_non_utf8_rule_file_is_one_line_exit_2(agent_root):
    rules = agent_root / "rules"
    rules.mkdir()
    (rules / "bad.yaml").write_bytes(b"rules:\n  - id: caf\xe9\n")
    proc = run_cli("agent", "run", "--probes", "off", "--no-scan", "--rules", rules,
                   env=_agent_env(agent_root), timeout=60)
    assert "bad.yaml" in _one_line_exit_2(proc)


# --- the scan child -------------------------------------------------------------------------
# Run from a fresh interpreter: spawning starts multiprocessing's resource tracker, which
# lives as long as the process that started it, and must not outlive the test.

SCAN_CHILD = """
import json, signal, sys, time
from seedance.service.scanchild import ScanChild
from tests.security.test_agent_attacks import _hog, _sleeper

out = {}
child = ScanChild(_hog, (1024,), address_space=512 << 20, timeout=120)
while not child.ready():
    out["expired_while_hogging"] = child.expired()
    time.sleep(0.1)
try:
    child.result()
except RuntimeError as exc:
    out["hog_error"] = str(exc)
ok = ScanChild(_hog, (16,), address_space=512 << 20, timeout=120)
while not ok.ready():
    time.sleep(0.1)
out["small"] = ok.result()
sleeper = ScanChild(_sleeper, (600,), timeout=1.0)
while not sleeper.expired():
    out["ready_before_deadline"] = sleeper.ready()
    time.sleep(0.2)
sleeper.kill()
out["sleeper_alive"] = sleeper.process.is_alive()
out["sleeper_exit"] = sleeper.process.exitcode
print(json.dumps(out))
"""


def _hog(megabytes: int) -> int:
    return len(bytearray(megabytes << 20))


def _sleeper(seconds: float) -> str:
    time.sleep(seconds)
    return "woke"


def test_scan_child_is_held_to_its_address_space_and_its_deadline():
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", SCAN_CHILD], capture_output=True, text=True, cwd=root,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    # 1 GiB asked under a 512 MiB RLIMIT_AS: one line back to the agent, not a grown host
    assert "address space" in out["hog_error"] and "\n" not in out["hog_error"], out
    assert out.get("expired_while_hogging") is not True
    assert out["small"] == 16 << 20  # the cap leaves a normal amount of work alone
    # past its deadline the child is killed (SIGKILL), not waited for
    assert out.get("ready_before_deadline") is not True
    assert out["sleeper_alive"] is False and out["sleeper_exit"] == -signal.SIGKILL
