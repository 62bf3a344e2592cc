"""Which container a process runs in, from its cgroup, and how to restart it.

The container engines name the cgroup they put a container's processes in after the
container's id; that is the one identity every runtime leaves readable from the host,
without asking a daemon.  /proc/PID/cgroup holds either cgroup v1 lines
(``4:memory:/docker/<id>``, one per hierarchy) or the v2 line (``0::/system.slice/...``);
the leaf segments seen on real hosts:

    docker      docker-<64hex>.scope (systemd driver)      /docker/<64hex> (cgroupfs)
    podman      libpod-<64hex>.scope, libpod-<64hex>        libpod-conmon-<64hex>.scope (its monitor)
    containerd  cri-containerd-<64hex>.scope
    CRI-O       crio-<64hex>.scope                          crio-conmon-<64hex>.scope (its monitor)
    kubelet     kubepods-<qos>-pod<uid_with_underscores>.slice, or /kubepods/<qos>/pod<uid>/<64hex>

A pod's namespace and name come from the kubelet's own files where they are on this node:
/var/log/pods/<namespace>_<pod>_<uid>/<container>/ and
/var/log/containers/<pod>_<namespace>_<container>-<id>.log.  Names of docker and podman
containers, and the images they run, come from their state files (config.v2.json,
containers.json).  Nothing here runs a program except pid_of(), which asks the engine's CLI
for a name the user typed.
"""
from __future__ import annotations

import json
import os
import re
import threading

from ..model.record import Record

_ID = r"([0-9a-f]{64})"
# (pattern on one cgroup path segment, runtime, whether it is the engine's monitor process)
_SEGMENTS = (
    (re.compile(rf"^docker-{_ID}\.scope$"), "docker", False),
    (re.compile(rf"^libpod-conmon-{_ID}(?:\.scope)?$"), "podman", True),
    (re.compile(rf"^libpod-{_ID}(?:\.scope)?$"), "podman", False),
    (re.compile(rf"^cri-containerd-{_ID}\.scope$"), "containerd", False),
    (re.compile(rf"^crio-conmon-{_ID}\.scope$"), "cri-o", True),
    (re.compile(rf"^crio-{_ID}\.scope$"), "cri-o", False),
)
_POD_SLICE = re.compile(r"^kubepods(?:-[a-z]+)*-pod([0-9a-f_]{36})\.slice$")
_POD_DIR = re.compile(r"^pod([0-9a-f-]{36})$")
_BARE_ID = re.compile(rf"^{_ID}$")

CGROUP_CAP = 64 << 10  # /proc/PID/cgroup: a few hundred bytes on any real host
STATE_CAP = 16 << 20  # an engine's state file (podman's containers.json lists every container)


class ContainerIdentity(Record):
    """One container, as far as this node can tell (None where it cannot)."""
    _fields = ("runtime", "id", "name", "pod_uid", "namespace", "pod", "container", "monitor")

    def __init__(self, runtime: str, id: str, name: str | None = None, pod_uid: str | None = None,
                 namespace: str | None = None, pod: str | None = None, container: str | None = None,
                 monitor: bool = False):
        self.runtime = runtime  # docker, podman, containerd, cri-o, or cri (a kubepods id, engine unsaid)
        self.id = id
        self.name = name
        self.pod_uid = pod_uid
        self.namespace = namespace
        self.pod = pod
        self.container = container
        self.monitor = monitor  # the engine's conmon for this container, not the container itself

    def subject(self) -> dict:
        """What a finding's subject carries: every field that is known."""
        out = {"runtime": self.runtime, "id": self.id}
        for key in ("name", "pod_uid", "namespace", "pod", "container"):
            value = getattr(self, key)
            if value:
                out[key] = value
        if self.monitor:
            out["monitor"] = True
        return out

    def short(self) -> str:
        """`podman container 415b9f57acdc (web)`, or `pod ns/name container c (containerd ...)`."""
        text = f"{self.runtime} container {self.id[:12]}"
        if self.pod:
            text = f"pod {self.namespace}/{self.pod}" + (f" container {self.container}" if self.container else "") \
                + f" ({text})"
        elif self.name:
            text += f" ({self.name})"
        return text

    def workload_labels(self) -> tuple[str, str, str]:
        """(namespace, pod, container) as dcgm-exporter's pod attribution labels a series, so
        the two join on them: a pod's names from the kubelet's files; a docker or podman
        container outside any pod has only its container name; "" for what is not known
        (dcgm-exporter's own value for a GPU no pod holds).  The engine's monitor (conmon)
        is not the workload: it gets none."""
        if self.monitor:
            return "", "", ""
        if self.pod_uid:
            return self.namespace or "", self.pod or "", self.container or ""
        return "", "", self.name or ""

    def restart(self) -> str:
        """The command that restarts what maps the stale file: the pod where the kubelet
        owns it (deleting it makes its controller start a new one), else the engine's."""
        if self.pod and self.namespace:
            return f"kubectl delete pod -n {self.namespace} {self.pod}"
        if self.runtime in ("docker", "podman"):
            return f"{self.runtime} restart {self.name or self.id[:12]}"
        if self.runtime == "cri-o" or self.runtime == "containerd" or self.runtime == "cri":
            if self.pod_uid:
                return f"kubectl delete pod --field-selector metadata.uid={self.pod_uid} -A"
            return f"crictl stop {self.id[:12]}  # its pod's controller starts it again"
        return f"restart container {self.id[:12]}"


def parse_cgroup(text: str):
    """(runtime, id, pod_uid, monitor) from a /proc/PID/cgroup text; None outside a container.

    Each line's path is read leaf-first: the innermost container segment wins (podman nests
    a container's own cgroup under libpod-<id>.scope/container when it delegates)."""
    for line in text.splitlines():
        _hier, _sep, rest = line.partition(":")
        _controllers, _sep, path = rest.partition(":")
        found = _parse_path(path)
        if found is not None:
            return found
    return None


def _parse_path(path: str):
    segments = [s for s in path.split("/") if s]
    pod_uid = None
    for segment in segments:
        match = _POD_SLICE.match(segment) or _POD_DIR.match(segment)
        if match:
            pod_uid = match.group(1).replace("_", "-")
    for index in range(len(segments) - 1, -1, -1):
        segment = segments[index]
        for pattern, runtime, monitor in _SEGMENTS:
            match = pattern.match(segment)
            if match:
                return runtime, match.group(1), pod_uid, monitor
        match = _BARE_ID.match(segment)
        if match and index > 0:
            parent = segments[index - 1]
            if parent == "docker":
                return "docker", match.group(1), pod_uid, False
            if pod_uid is not None and _POD_DIR.match(parent):
                return "cri", match.group(1), pod_uid, False  # cgroupfs kubelet: the engine is not named
    return None


KUBELET_PODS = "/var/lib/kubelet/pods"
POD_LOGS = "/var/log/pods"
CONTAINER_LOGS = "/var/log/containers"
# Seen from a DaemonSet's pod (hostPID, no hostPath for these directories), the node's files
# are under its init's root: /proc/1/root is the host's / as the kernel's proc_root_link()
# resolves it for a process allowed to ptrace-read pid 1 (the agent's SYS_PTRACE).
HOST_ROOT = "/proc/1/root"


def node_dir(path: str, host_root: str = HOST_ROOT) -> str:
    """``path`` where it is a directory here, else the same directory under the host's root
    when that one is (an agent in a pod that shares the host's pid namespace)."""
    if os.path.isdir(path):
        return path
    under_host = host_root + path
    return under_host if os.path.isdir(under_host) else path


def _read_cgroup(pid: int, proc: str):
    try:
        with open(f"{proc}/{pid}/cgroup", "rb") as handle:
            return handle.read(CGROUP_CAP).decode("utf-8", "replace")
    except OSError:
        return None


def identify(pid: int, proc: str = "/proc", kubelet: str | None = None, pod_logs: str | None = None,
             container_logs: str | None = None, state_roots: dict | None = None):
    """The container ``pid`` runs in, None when its cgroup names none (a host process, a
    chroot, or a process gone before we looked).  The kubelet's directories default to the
    node's (node_dir())."""
    text = _read_cgroup(pid, proc)
    found = parse_cgroup(text) if text is not None else None
    if found is None:
        return None
    return _named(found, kubelet, pod_logs, container_logs, state_roots)


def _named(found, kubelet, pod_logs, container_logs, state_roots) -> ContainerIdentity:
    runtime, cid, pod_uid, monitor = found
    identity = ContainerIdentity(runtime, cid, pod_uid=pod_uid, monitor=monitor)
    if pod_uid:
        _kube_names(identity, kubelet or node_dir(KUBELET_PODS), pod_logs or node_dir(POD_LOGS),
                    container_logs or node_dir(CONTAINER_LOGS))
    elif runtime in ("docker", "podman"):
        identity.name = engine_name(runtime, cid, state_roots)
    return identity


class WorkloadLabels:
    """(namespace, pod, container) of processes, for metric series, asked at each scrape.

    The cgroup of each pid is read every time (a pid can be reused by a process of another
    container between two scrapes); the names, which need directory listings and the
    engines' state files, are looked up once per container and kept (up to CAP containers)."""

    CAP = 1024

    def __init__(self, proc: str = "/proc", kubelet: str | None = None, pod_logs: str | None = None,
                 container_logs: str | None = None, state_roots: dict | None = None):
        self.proc = proc
        self._roots = (kubelet, pod_logs, container_logs, state_roots)
        self._names: dict = {}
        self._lock = threading.Lock()  # scrapes are answered on threads of their own

    def of(self, pid) -> tuple[str, str, str]:
        if not isinstance(pid, int) or pid <= 0:
            return "", "", ""
        text = _read_cgroup(pid, self.proc)
        found = parse_cgroup(text) if text is not None else None
        if found is None:
            return "", "", ""  # a host process, or one gone since it was listed
        with self._lock:
            labels = self._names.get(found)
        if labels is None:
            labels = _named(found, *self._roots).workload_labels()
            if labels == ("", "", "") and found[2]:
                return labels  # a pod whose files the kubelet has not written yet: ask again next time
            with self._lock:
                if len(self._names) >= self.CAP:
                    self._names.clear()
                self._names[found] = labels
        return labels


def _kube_names(identity: ContainerIdentity, kubelet: str, pod_logs: str, container_logs: str) -> None:
    uid = identity.pod_uid
    try:
        for entry in os.listdir(pod_logs):
            namespace, sep, rest = entry.partition("_")
            pod, sep2, entry_uid = rest.rpartition("_")
            if sep and sep2 and entry_uid == uid:
                identity.namespace, identity.pod = namespace, pod
                containers = _listdir(os.path.join(pod_logs, entry))
                if len(containers) == 1:
                    identity.container = containers[0]
                break
    except OSError:
        pass
    # /var/log/containers/<pod>_<namespace>_<container>-<id>.log: the one place that ties an id to a name
    suffix = f"-{identity.id}.log"
    for entry in _listdir(container_logs):
        if entry.endswith(suffix):
            pod, _s, rest = entry[: -len(suffix)].partition("_")
            namespace, _s, container = rest.partition("_")
            identity.pod = identity.pod or pod
            identity.namespace = identity.namespace or namespace
            identity.container = container or identity.container
            break
    if identity.container is None:
        containers = _listdir(os.path.join(kubelet, uid, "containers"))
        if len(containers) == 1:
            identity.container = containers[0]


def _listdir(path: str) -> list:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


_DEFAULT_STATE = {"docker": "/var/lib/docker/containers",
                  "podman": "/var/lib/containers/storage/overlay-containers/containers.json"}
_podman_state: dict = {}  # containers.json (dev, inode, mtime) -> {id: (name, image)}


def engine_name(runtime: str, cid: str, state_roots: dict | None = None):
    """The name the user gave a docker or podman container, from the engine's state files."""
    return _engine_state(runtime, cid, state_roots)[0]


def engine_image(runtime: str, cid: str, state_roots: dict | None = None):
    """The image a docker or podman container was started from, as the user named it
    (nvcr.io/nvidia/pytorch:24.05-py3), from the engine's state files; None where unsaid."""
    return _engine_state(runtime, cid, state_roots)[1]


def _engine_state(runtime: str, cid: str, state_roots: dict | None) -> tuple:
    """(name, image) of a docker or podman container; None for either not known."""
    where = (state_roots or {}).get(runtime, _DEFAULT_STATE[runtime])
    if runtime == "docker":
        doc = _json(os.path.join(where, cid, "config.v2.json"))
        if not isinstance(doc, dict):
            return None, None
        name = doc.get("Name")
        # Config.Image is the reference given to docker run; the top-level Image is only its sha256 id
        image = (doc.get("Config") or {}).get("Image") if isinstance(doc.get("Config"), dict) else None
        return (name.lstrip("/") if isinstance(name, str) and name else None,
                image if isinstance(image, str) and image else None)
    try:
        st = os.stat(where)
    except OSError:
        return None, None
    key = (where, st.st_dev, st.st_ino, st.st_mtime_ns)
    state = _podman_state.get(key)
    if state is None:
        state = {}
        doc = _json(where)
        for item in doc if isinstance(doc, list) else []:
            if isinstance(item, dict):
                names = item.get("names")
                name = str(names[0]) if isinstance(names, list) and names else None
                state[str(item.get("id"))] = (name, _podman_image(item))
        _podman_state.clear()
        _podman_state[key] = state
    return state.get(cid, (None, None))


def _podman_image(item: dict):
    """containers/storage keeps the image's name in the container's metadata (a JSON string:
    "image-name"), libpod's own config calls it rootfsImageName; "image" is only the id."""
    try:
        metadata = json.loads(item.get("metadata") or "{}")
    except (TypeError, ValueError):
        metadata = {}
    for value in ((metadata or {}).get("image-name") if isinstance(metadata, dict) else None,
                  item.get("rootfsImageName")):
        if isinstance(value, str) and value:
            return value
    image_id = item.get("image")
    return image_id[:12] if isinstance(image_id, str) and image_id else None


def _json(path: str):
    try:
        with open(path, "rb") as handle:
            data = handle.read(STATE_CAP + 1)
        if len(data) > STATE_CAP:
            return None
        return json.loads(data)
    except (OSError, ValueError):
        return None


# The engine CLIs asked for a container's pid, in this order; each prints the pid of the
# container's first process (0 when it is not running).
_ENGINES = (
    ("podman", ["podman", "inspect", "--type", "container", "--format", "{{.State.Pid}}"]),
    ("docker", ["docker", "inspect", "--type", "container", "--format", "{{.State.Pid}}"]),
    ("crictl", ["crictl", "inspect", "--output", "go-template", "--template", "{{.info.pid}}"]),
)


def pid_of(name: str, timeout: float = 20.0):
    """(pid, engine) of the running container ``name`` (a name or an id), asking podman,
    docker, then crictl, whichever is installed; (None, why) when none knows it."""
    import shutil
    import subprocess

    asked = []
    for engine, argv in _ENGINES:
        if shutil.which(argv[0]) is None:
            continue
        asked.append(engine)
        try:
            done = subprocess.run(argv + [name], capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            continue
        text = done.stdout.strip()
        if done.returncode == 0 and text.isdigit():
            pid = int(text)
            if pid > 0:
                return pid, engine
            return None, f"{engine} knows container {name}, but it is not running"
    if not asked:
        return None, "none of podman, docker or crictl is installed"
    return None, f"no running container {name} (asked {', '.join(asked)})"
