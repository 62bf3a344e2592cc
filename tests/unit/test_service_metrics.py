"""Prometheus exposition, for real over loopback HTTP; non-loopback binds refused."""
import urllib.request

import pytest

from seedance.model.errors import BadInput, UsageError
from seedance.service.metrics import MetricsServer, parse_listen, require_loopback

SNAPSHOT = {
    "agent": {"version": "9.9.9", "started": 1700000000.0, "config": {"handle_mode": "per-instance"},
              "probes": {"state": "attached"}},
    "counters": {"leaks_reported": 3, "leaked_bytes": 12288, "slots_reclaimed": 5, "gc_passes": 17},
    "instances": [{"pid": 10, "alive": True, "command": "/bin/train", "allocated_bytes": 4096},
                  {"pid": 11, "alive": False, "command": "/bin/old"}],
    "registry": {"free_slots": 250},
    "finding_counts": [["handle-leak", "warning", 3]],
    "devices": [{"index": 0, "uuid": "GPU-abc", "utilization": 0.97, "memory_used": 1000,
                 "memory_total": 8000, "power_watts": 250.5, "processes": [{"pid": 10}]}],
    "scan": {"at": 1700000100.0},
}


@pytest.mark.parametrize("text, expected", [("127.0.0.1:9464", ("127.0.0.1", 9464)), ("[::1]:80", ("::1", 80)),
                                            (":9000", ("127.0.0.1", 9000)), ("localhost:1", ("localhost", 1))])
def test_parse_listen(text, expected):
    assert parse_listen(text) == expected


def test_parse_listen_rejects_garbage():
    with pytest.raises(UsageError):
        parse_listen("127.0.0.1:http")
    with pytest.raises(UsageError):
        parse_listen("127.0.0.1:70000")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "8.8.8.8", "192.168.1.10"])
def test_non_loopback_is_refused(host):
    with pytest.raises(BadInput, match="loopback only"):
        require_loopback(host)


def test_loopback_names_are_accepted():
    assert require_loopback("127.0.0.1") == "127.0.0.1"
    assert require_loopback("localhost") in ("127.0.0.1", "::1")


def test_metrics_endpoint_serves_seedance_metrics():
    server = MetricsServer("127.0.0.1:0", lambda: SNAPSHOT)
    address = server.start()
    try:
        assert server.port != 0
        body = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    finally:
        server.stop()
    lines = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
             for line in body.splitlines() if line.startswith("seedance_")}
    assert lines["seedance_leaks_reported_total"] == 3
    assert lines["seedance_leaked_bytes_total"] == 12288
    assert lines["seedance_slots_reclaimed_total"] == 5
    assert lines['seedance_instances{state="alive"}'] == 1
    assert lines['seedance_instances{state="dead"}'] == 1
    assert lines['seedance_findings{rule="handle-leak",severity="warning"}'] == 3
    assert lines['seedance_gpu_utilization_ratio{device="0",uuid="GPU-abc"}'] == 0.97
    assert lines['seedance_gpu_power_watts{device="0",uuid="GPU-abc"}'] == 250.5
    assert lines["seedance_probes_attached"] == 1
    assert lines["seedance_registry_slots_free"] == 250
    assert any(k.startswith("seedance_agent_info{") and 'version="9.9.9"' in k for k in lines)
    # nothing but seedance_* (no process_/python_ collectors from the global registry)
    names = {line.split()[2] for line in body.splitlines() if line.startswith("# TYPE")}
    assert names and all(n.startswith("seedance_") for n in names)


def test_port_in_use_is_one_line_bad_input():
    first = MetricsServer("127.0.0.1:0", lambda: SNAPSHOT)
    first.start()
    try:
        with pytest.raises(BadInput, match="cannot listen"):
            MetricsServer(f"127.0.0.1:{first.port}", lambda: SNAPSHOT).start()
    finally:
        first.stop()


def _exposition(snapshot: dict) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    from seedance.service.metrics import SnapshotCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snapshot))
    return generate_latest(registry).decode()


def test_last_scan_timestamp_is_absent_before_the_first_scan_and_promtool_accepts_both():
    """Before the first periodic check there is no time to report: the series is absent (as
    node_exporter leaves out what it has not read), not 0, which would be a check in 1970."""
    import shutil
    import subprocess

    before = _exposition({**SNAPSHOT, "scan": {}})
    assert "seedance_last_scan_timestamp_seconds" not in before
    after = _exposition({**SNAPSHOT, "scan": {"at": 1_700_000_000.5}})
    assert "seedance_last_scan_timestamp_seconds 1.7000000005e+09" in after
    if not shutil.which("promtool"):
        pytest.skip("promtool is not installed")
    for body in (before, after):
        lint = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, text=True,
                              timeout=60)
        assert lint.returncode == 0 and lint.stdout + lint.stderr == "", lint.stdout + lint.stderr
