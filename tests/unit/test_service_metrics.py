"""Prometheus exposition, for real over loopback HTTP; non-loopback binds refused."""
import socket
import urllib.request

import pytest

from seedance.model.errors import BadInput, UsageError
from seedance.service.metrics import MetricsServer, parse_listen, require_loopback
from tests.unit.test_collect_container import CID, UID, _pod_node  # the same pod on disk

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
    gpu = 'Hostname="%s",UUID="GPU-abc",device="nvidia0",gpu="0"' % socket.gethostname()
    assert lines['seedance_gpu_utilization_ratio{%s}' % gpu] == 0.97
    assert lines['seedance_gpu_power_watts{%s}' % gpu] == 250.5
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


def _exposition(snapshot: dict, **collector) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    from seedance.service.metrics import SnapshotCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snapshot, **collector))
    return generate_latest(registry).decode()


def _promtool_clean(*bodies: str) -> None:
    import shutil
    import subprocess

    if not shutil.which("promtool"):
        pytest.skip("promtool is not installed")
    for body in bodies:
        lint = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, text=True,
                              timeout=60)
        assert lint.returncode == 0 and lint.stdout + lint.stderr == "", lint.stdout + lint.stderr


def _samples(body: str, family: str) -> list:
    """(labels, value) of each sample of one family, as Prometheus' own parser reads them."""
    from prometheus_client.parser import text_string_to_metric_families

    return sorted(((sample.labels, sample.value) for fam in text_string_to_metric_families(body)
                   for sample in fam.samples if sample.name == family), key=repr)


def test_last_scan_timestamp_is_absent_before_the_first_scan_and_promtool_accepts_both():
    """Before the first periodic check there is no time to report: the series is absent (as
    node_exporter leaves out what it has not read), not 0, which would be a check in 1970."""
    import shutil
    import subprocess

    before = _exposition({**SNAPSHOT, "scan": {}})
    assert "seedance_last_scan_timestamp_seconds" not in before
    after = _exposition({**SNAPSHOT, "scan": {"at": 1_700_000_000.5}})
    assert "seedance_last_scan_timestamp_seconds 1.7000000005e+09" in after
    _promtool_clean(before, after)


# --- labels that join with dcgm-exporter's ------------------------------------------------

OTHER = "9" * 64
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def node(tmp_path):
    """A node as the kubelet leaves it: /proc/PID/cgroup of two processes of one pod's
    container (pids 501, 502), one of the pod's other container (503), a host process (504);
    /var/log/pods/<namespace>_<pod>_<uid>/<container>/ and
    /var/log/containers/<pod>_<namespace>_<container>-<id>.log."""
    from seedance.collect.container import WorkloadLabels

    slice_ = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice"
    cgroups = {501: f"0::{slice_}/cri-containerd-{CID}.scope\n", 502: f"0::{slice_}/cri-containerd-{CID}.scope\n",
               503: f"0::{slice_}/cri-containerd-{OTHER}.scope\n", 504: "0::/system.slice/sshd.service\n"}
    for pid, text in cgroups.items():
        (tmp_path / "proc" / str(pid)).mkdir(parents=True)
        (tmp_path / "proc" / str(pid) / "cgroup").write_text(text)
    _pods, logs = _pod_node(tmp_path)
    (logs / f"trainer-7d9f_ml-team_loader-{OTHER}.log").write_text("")
    return WorkloadLabels(proc=str(tmp_path / "proc"), kubelet=str(tmp_path / "kubelet"),
                          pod_logs=str(tmp_path / "var/log/pods"), container_logs=str(logs))


def _workload_snapshot(per_pid: bool) -> dict:
    gpu_procs = [{"pid": 501, "used_memory": 1 << 30}, {"pid": 502, "used_memory": 1 << 29},
                 {"pid": 503, "used_memory": 1 << 28}, {"pid": 504, "used_memory": 1 << 27},
                 {"pid": 505, "used_memory": None}]
    return {**SNAPSHOT, "agent": {**SNAPSHOT["agent"], "config": {"metrics_per_pid": per_pid}},
            # 501 and 502 run the same program in the same container; 77 is 501 as its own
            # pid namespace numbers it (the registry's pid), host_pid the node's
            "instances": [{"pid": 7, "host_pid": 501, "alive": True, "command": "/bin/train", "allocated_bytes": 4096},
                          {"pid": 8, "host_pid": 502, "alive": True, "command": "/bin/train", "allocated_bytes": 1024},
                          {"pid": 504, "alive": True, "command": "/bin/train", "allocated_bytes": 100}],
            "devices": [{"index": 1, "uuid": "GPU-b1", "name": H100, "utilization": 0.5, "memory_used": 1 << 31,
                         "memory_total": 80 << 30, "power_watts": 300.0, "processes": gpu_procs}]}


def test_gpu_series_carry_dcgm_exporters_labels_and_pods_their_names(node):
    body = _exposition(_workload_snapshot(per_pid=False), hostname="gpu-node-7", workloads=node)
    dcgm = {"gpu": "1", "UUID": "GPU-b1", "device": "nvidia1", "Hostname": "gpu-node-7"}
    # the model once per GPU, as an info series: promtool refuses dcgm-exporter's camelCase modelName
    assert _samples(body, "seedance_gpu_info") == [({**dcgm, "model_name": H100}, 1.0)]
    for family in ("seedance_gpu_utilization_ratio", "seedance_gpu_memory_used_bytes",
                   "seedance_gpu_memory_total_bytes", "seedance_gpu_power_watts", "seedance_gpu_processes"):
        assert [labels for labels, _ in _samples(body, family)] == [dcgm], family
    pod = {"namespace": "ml-team", "pod": "trainer-7d9f"}
    # per workload, not per pid: 501 and 502 are one series; a host process has empty pod
    # labels (dcgm-exporter's own value for a GPU no pod holds); NVML's unknown amount is left out
    assert _samples(body, "seedance_gpu_process_memory_used_bytes") == sorted([
        ({**dcgm, **pod, "container": "worker"}, float((1 << 30) + (1 << 29))),
        ({**dcgm, **pod, "container": "loader"}, float(1 << 28)),
        ({**dcgm, "namespace": "", "pod": "", "container": ""}, float(1 << 27))], key=repr)
    assert _samples(body, "seedance_instance_allocated_bytes") == sorted([
        ({"Hostname": "gpu-node-7", **pod, "container": "worker", "command": "/bin/train"}, 5120.0),
        ({"Hostname": "gpu-node-7", "namespace": "", "pod": "", "container": "", "command": "/bin/train"}, 100.0)],
        key=repr)
    assert "pid=" not in body
    _promtool_clean(body)


def test_per_pid_series_only_when_asked(node):
    body = _exposition(_workload_snapshot(per_pid=True), hostname="gpu-node-7", workloads=node)
    by_pid = {labels["pid"]: (labels["container"], value)
              for labels, value in _samples(body, "seedance_gpu_process_memory_used_bytes")}
    assert by_pid == {"501": ("worker", float(1 << 30)), "502": ("worker", float(1 << 29)),
                      "503": ("loader", float(1 << 28)), "504": ("", float(1 << 27))}
    # the node's pid (host_pid), the one nvidia-smi and ps show there, not the namespace's
    by_pid = {labels["pid"]: (labels["container"], value)
              for labels, value in _samples(body, "seedance_instance_allocated_bytes")}
    assert by_pid == {"501": ("worker", 4096.0), "502": ("worker", 1024.0), "504": ("", 100.0)}
    _promtool_clean(body)


def test_without_nvml_the_gpu_families_are_empty_and_promtool_is_clean(node):
    body = _exposition({**SNAPSHOT, "devices": []}, hostname="gpu-node-7", workloads=node)
    for family in ("seedance_gpu_utilization_ratio", "seedance_gpu_processes",
                   "seedance_gpu_process_memory_used_bytes", "seedance_gpu_info"):
        assert _samples(body, family) == [] and f"# TYPE {family} gauge" in body, family
    _promtool_clean(body)


def test_hostname_is_the_nodes_name_from_the_downward_api():
    from seedance.service.metrics import node_name

    assert node_name({"NODE_NAME": "gpu-node-7"}) == "gpu-node-7"
    assert node_name({}) == socket.gethostname()
