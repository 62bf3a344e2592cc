"""Live data from the agent: when NVML does not load in this process, verify asks the
running agent (its real status socket) for device samples and uses them as the
affinity-unset trap's metric and device count.

The agent here is the real daemon (`seedance agent run`), sampling this host's NVML as it
does in production; the oracle is what that agent itself reports (`seedance status --json`),
never a canned answer.  Issue 17: this test used to serve a hard-coded "2 GPUs" from a
status server of its own while no daemon ran.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import expect_exit, load_example_builder, run_cli

BIN = Path(sys.executable).parent


@pytest.fixture
def agent_env():
    root = Path(tempfile.mkdtemp(prefix="sd-pa-", dir="/tmp"))  # short: unix socket paths <= 108 bytes
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SEEDANCE_", "OTEL_")) and k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    env.update(HOME=str(root / "home"), XDG_CONFIG_HOME=str(root / "cfg"), XDG_STATE_HOME=str(root / "state"),
               XDG_DATA_HOME=str(root / "data"), SEEDANCE_RUNTIME_DIR=str(root / "rt"))
    # keep the session mark (tests/conftest.py): a process left running is found and named
    env["SEEDANCE_TEST_SESSION"] = os.environ.get("SEEDANCE_TEST_SESSION", "")
    yield env
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def agent(agent_env):
    """The real agent daemon; stopped with SIGTERM (its own clean shutdown) at the end."""
    log = open(Path(agent_env["HOME"]).parent / "agent.log", "w")
    proc = subprocess.Popen([str(BIN / "seedance"), "agent", "run", "--no-scan", "--probes", "off"],
                            env=agent_env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline and proc.poll() is None:
            probe = run_cli("status", "--json", env=agent_env)
            if probe.returncode == 0:
                status = json.loads(probe.stdout)
                if status["agent"]["nvml"].get("state") != "off":  # NVML started (or said why not)
                    break
            time.sleep(0.2)
        if status is None:
            log.flush()
            pytest.fail(f"the agent did not answer (exit {proc.poll()}): {Path(log.name).read_text()}")
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def _nvml_loads_here() -> bool:
    import pynvml
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_verify_reports_the_running_agents_devices(tmp_path, agent_env, agent):
    if not shutil.which("gcc"):
        pytest.skip("gcc not found")
    builder = load_example_builder()
    plugin = builder.build("legacy-audio-encoder", tmp_path)
    expect_exit(run_cli("plugin", "install", plugin, env=agent_env), 0)
    # what the agent itself says it sees on this host, read before and after verify
    before = json.loads(expect_exit(run_cli("status", "--json", env=agent_env), 0).stdout)
    proc = expect_exit(run_cli("plugin", "verify", "--strict", "--report-json", "-", env=agent_env), 0, 1)
    after = json.loads(expect_exit(run_cli("status", "--json", env=agent_env), 0).stdout)
    assert before["agent"]["pid"] == after["agent"]["pid"] == agent.pid  # the same live daemon answered
    agent_devices = after["devices"]
    assert len(before["devices"]) == len(agent_devices)  # the host did not change under the test

    report = json.loads(proc.stdout)
    # --strict raises affinity-unset for a manifest without device_affinity on any host,
    # so its evidence is there to read whatever the device count
    affinity = next(f for f in report["waste_traps"] if f["rule"] == "affinity-unset")
    evidence = affinity["evidence"]
    assert evidence["device_count"] == len(agent_devices), (evidence, after["agent"]["nvml"])
    if _nvml_loads_here():
        assert evidence["device_source"] == "NVML"
    elif agent_devices:
        # NVML fails here but works in the agent: its samples are the live view
        assert evidence["device_source"].startswith(f"seedance agent ({agent_env['SEEDANCE_RUNTIME_DIR']}/")
        utils = [d["utilization"] for d in agent_devices]
        assert evidence["metric_observed"] is (len(utils) >= 2 and None not in utils)
    else:
        # neither here nor in the agent: said as such, and the agent's reason agrees
        assert after["agent"]["nvml"]["state"] == "unavailable", after["agent"]["nvml"]
        assert evidence["device_source"].startswith("NVML unavailable (")
        assert evidence["metric_observed"] is False
        assert evidence["metric_value"].startswith("not observed: NVML unavailable")
