"""Live data from the agent: when NVML does not load in this process, verify asks the
running agent (its real status socket) for device samples and uses them as the
affinity-unset trap's metric and device count."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import load_example_builder



@pytest.fixture
def agent_socket(tmp_path):
    api = pytest.importorskip("seedance.service.api")
    runtime = tmp_path / "run"
    samples = [{"index": 0, "name": "GPU-A", "utilization": 0.08, "processes": []},
               {"index": 1, "name": "GPU-B", "utilization": 0.02, "processes": []}]
    requests = []

    def handler(message):
        requests.append(message)
        return {"schema": "seedance.status/v1", "devices": samples} if message.get("op") == "status" else {}

    server = api.StatusServer(runtime / "agent.sock", handler)
    server.start()
    try:
        yield runtime, requests
    finally:
        server.stop()


def test_verify_uses_the_agents_device_samples(cli, tmp_path, agent_socket):
    import pynvml
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML loads here: the agent is only asked when it does not")
    except pynvml.NVMLError:
        pass
    if not shutil.which("gcc"):
        pytest.skip("gcc not found")
    runtime, requests = agent_socket
    builder = load_example_builder()
    plugin = builder.build("legacy-audio-encoder", tmp_path)
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "SEEDANCE_RUNTIME_DIR": str(runtime)}
    cli("plugin", "install", plugin, env=env, check=True)
    report = json.loads(cli("plugin", "verify", "--report-json", "-", env=env).stdout)
    # two devices seen by the agent: affinity-unset is raised without --strict
    affinity = next(f for f in report["waste_traps"] if f["rule"] == "affinity-unset")
    evidence = affinity["evidence"]
    assert evidence["device_count"] == 2
    assert evidence["device_source"].startswith("seedance agent (")
    assert evidence["metric_observed"] is True
    assert evidence["metric_value"] == "met"  # GPU0 8% busy while GPU1 is 98% idle
    assert {"op": "status"} in requests
