"""Container identity from /proc/PID/cgroup, as each runtime and cgroup layout writes it."""
import json

import pytest

from seedance.collect import container

CID = "415b9f57acdc90179d054a908b42c821181fdb0cac8fed30b52fd1d368908220"
UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
UID_ = UID.replace("-", "_")

V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids")


def v1(path: str) -> str:
    """A cgroup v1 file: one line per hierarchy, all in the same container cgroup."""
    lines = [f"{12 - n}:{c}:{path}" for n, c in enumerate(V1_CONTROLLERS)]
    return "\n".join(["13:name=systemd:" + path] + lines + ["0::/"]) + "\n"


def v2(path: str) -> str:
    return f"0::{path}\n"


CASES = [
    # (cgroup file text, runtime, id, pod uid, monitor)
    (v2(f"/system.slice/docker-{CID}.scope"), "docker", CID, None, False),
    (v1(f"/system.slice/docker-{CID}.scope"), "docker", CID, None, False),
    (v1(f"/docker/{CID}"), "docker", CID, None, False),
    (v2(f"/machine.slice/libpod-{CID}.scope"), "podman", CID, None, False),
    (v2(f"/machine.slice/libpod-{CID}.scope/container"), "podman", CID, None, False),
    (v2(f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope"), "podman", CID, None, False),
    (v1(f"/libpod_parent/libpod-{CID}"), "podman", CID, None, False),  # podman with cgroupfs, as on this machine
    (v2(f"/machine.slice/libpod-conmon-{CID}.scope"), "podman", CID, None, True),
    (v2(f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope"),
     "containerd", CID, UID, False),
    (v1(f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope"),
     "containerd", CID, UID, False),
    (v2(f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope"), "cri-o", CID, UID, False),
    (v1(f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope"),
     "cri-o", CID, UID, False),
    (v2(f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{CID}.scope"), "cri-o", CID, UID, True),
    (v1(f"/kubepods/burstable/pod{UID}/{CID}"), "cri", CID, UID, False),
    (v2(f"/kubepods/besteffort/pod{UID}/{CID}"), "cri", CID, UID, False),
]


@pytest.mark.parametrize("text,runtime,cid,uid,monitor", CASES)
def test_runtimes_and_layouts(text, runtime, cid, uid, monitor):
    assert container.parse_cgroup(text) == (runtime, cid, uid, monitor)


@pytest.mark.parametrize("text", [
    v2("/"), v2("/user.slice/user-1000.slice/session-3.scope"), v2("/system.slice/sshd.service"),
    v1("/"), "4:memory:/process_api/5f62b8011fe8eb008f740c7d1cbe5866\n0::/\n",
    v2(f"/system.slice/docker-{CID[:12]}.scope"),  # not a full id: some other unit
    v2(f"/{CID}"),  # a bare id with no engine or pod above it says nothing
    "", "garbage without colons",
])
def test_host_processes_are_not_containers(text):
    assert container.parse_cgroup(text) is None


def _proc(tmp_path, text, pid=77):
    (tmp_path / "proc" / str(pid)).mkdir(parents=True)
    (tmp_path / "proc" / str(pid) / "cgroup").write_text(text)
    return str(tmp_path / "proc")


def test_kube_names_from_the_kubelets_logs(tmp_path):
    proc = _proc(tmp_path, v2(f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
                               f"cri-containerd-{CID}.scope"))
    pods = tmp_path / "pods"
    (pods / f"ml-team_trainer-7d9f_{UID}" / "worker").mkdir(parents=True)
    (pods / f"ml-team_trainer-7d9f_{UID}" / "sidecar").mkdir()
    logs = tmp_path / "containers"
    logs.mkdir()
    (logs / f"trainer-7d9f_ml-team_worker-{CID}.log").symlink_to("/nonexistent")
    found = container.identify(77, proc=proc, kubelet=str(tmp_path / "kubelet"), pod_logs=str(pods),
                               container_logs=str(logs))
    assert found.subject() == {"runtime": "containerd", "id": CID, "pod_uid": UID, "namespace": "ml-team",
                               "pod": "trainer-7d9f", "container": "worker"}
    assert found.restart() == "kubectl delete pod -n ml-team trainer-7d9f"
    assert found.short() == f"pod ml-team/trainer-7d9f container worker (containerd container {CID[:12]})"


def test_kube_pod_without_logs_still_restartable(tmp_path):
    proc = _proc(tmp_path, v1(f"/kubepods/burstable/pod{UID}/{CID}"))
    (tmp_path / "kubelet" / UID / "containers" / "app").mkdir(parents=True)
    found = container.identify(77, proc=proc, kubelet=str(tmp_path / "kubelet"), pod_logs=str(tmp_path / "no"),
                               container_logs=str(tmp_path / "no"))
    assert (found.runtime, found.container, found.pod) == ("cri", "app", None)
    assert UID in found.restart()


def test_docker_and_podman_names_from_state_files(tmp_path):
    docker = tmp_path / "docker" / CID
    docker.mkdir(parents=True)
    (docker / "config.v2.json").write_text(json.dumps({"Name": "/web"}))
    podman = tmp_path / "containers.json"
    podman.write_text(json.dumps([{"id": CID, "names": ["db"]}]))
    roots = {"docker": str(tmp_path / "docker"), "podman": str(podman)}
    found = container.identify(77, proc=_proc(tmp_path, v2(f"/system.slice/docker-{CID}.scope")),
                               state_roots=roots)
    assert (found.name, found.restart(), found.short()) == ("web", "docker restart web",
                                                            f"docker container {CID[:12]} (web)")
    found = container.identify(78, proc=_proc(tmp_path, v1(f"/libpod_parent/libpod-{CID}"), pid=78),
                               state_roots=roots)
    assert (found.name, found.restart()) == ("db", "podman restart db")


def test_unnamed_podman_and_gone_process(tmp_path):
    found = container.identify(77, proc=_proc(tmp_path, v2(f"/machine.slice/libpod-{CID}.scope")),
                               state_roots={"podman": str(tmp_path / "absent.json")})
    assert found.subject() == {"runtime": "podman", "id": CID}
    assert found.restart() == f"podman restart {CID[:12]}"
    assert container.identify(4242, proc=str(tmp_path / "proc")) is None


# --- workload labels for metric series (dcgm-exporter's namespace, pod, container) --------

def _pod_node(tmp_path):
    """/var/log/pods and /var/log/containers as the kubelet writes them, for a pod with two
    containers (so the pod's directory alone cannot say which one a process is in)."""
    pods = tmp_path / "var/log/pods" / f"ml-team_trainer-7d9f_{UID}"
    for name in ("worker", "loader"):
        (pods / name).mkdir(parents=True)
    logs = tmp_path / "var/log/containers"
    logs.mkdir(parents=True)
    (logs / f"trainer-7d9f_ml-team_worker-{CID}.log").write_text("")
    return pods.parent, logs


def test_workload_labels_of_a_pod_a_podman_container_a_monitor_and_a_host_process(tmp_path):
    pods, logs = _pod_node(tmp_path)
    proc = _proc(tmp_path, v2(f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope"), pid=10)
    _proc(tmp_path, v1(f"/libpod_parent/libpod-{'a' * 64}"), pid=11)
    _proc(tmp_path, v2(f"/machine.slice/libpod-conmon-{'a' * 64}.scope"), pid=12)
    _proc(tmp_path, v2("/system.slice/sshd.service"), pid=13)
    podman = tmp_path / "containers.json"
    podman.write_text(json.dumps([{"id": "a" * 64, "names": ["notebook"]}]))
    labels = container.WorkloadLabels(proc=proc, kubelet=str(tmp_path / "kubelet"), pod_logs=str(pods),
                                      container_logs=str(logs), state_roots={"podman": str(podman)})
    assert labels.of(10) == ("ml-team", "trainer-7d9f", "worker")
    assert labels.of(11) == ("", "", "notebook")
    assert labels.of(12) == ("", "", "")  # conmon is the engine's, not the workload
    assert labels.of(13) == ("", "", "")
    assert labels.of(4242) == ("", "", "") and labels.of(None) == ("", "", "")


def test_a_reused_pid_gets_the_labels_of_its_new_container(tmp_path):
    pods, logs = _pod_node(tmp_path)
    proc = _proc(tmp_path, v2(f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope"), pid=10)
    labels = container.WorkloadLabels(proc=proc, kubelet=str(tmp_path / "kubelet"), pod_logs=str(pods),
                                      container_logs=str(logs))
    assert labels.of(10) == ("ml-team", "trainer-7d9f", "worker")
    (tmp_path / "proc" / "10" / "cgroup").write_text(v2("/user.slice/user-1000.slice/session-3.scope"))
    assert labels.of(10) == ("", "", "")


def test_the_kubelets_files_are_read_under_the_hosts_root_from_a_pod(tmp_path):
    """An agent in a DaemonSet pod (hostPID, no hostPath for /var/log/pods) reads the node's
    files under /proc/1/root; a directory present here is used as it is."""
    host = tmp_path / "host"
    (host / "var/log/pods").mkdir(parents=True)
    assert container.node_dir("/var/log/pods-nowhere", host_root=str(host)) == "/var/log/pods-nowhere"
    assert container.node_dir("/var/log/pods", host_root=str(host)) in ("/var/log/pods", f"{host}/var/log/pods")
    (host / "srv/pods-only-on-host").mkdir(parents=True)
    assert container.node_dir("/srv/pods-only-on-host", host_root=str(host)) == f"{host}/srv/pods-only-on-host"
