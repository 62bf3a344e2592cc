"""Prometheus text exposition of seedance_* metrics, on loopback only.

The agent exposes host facts (pids, commands, leaked bytes) that are nobody else's
business, so it never listens beyond loopback; fleets scrape through a node-local
Prometheus agent or an authenticating proxy (deploy/).  Values are read from the agent's
snapshot at scrape time (a custom collector), so an idle agent does no metric work.

Served the way prometheus_client's own start_http_server serves (ThreadingWSGIServer: a
daemon thread per request), plus what it lacks (without it one local user opening a
connection and sending nothing stalls every scrape): a socket timeout per read, one
deadline for the whole connection, and at most MAX_CLIENTS connections at once.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import threading
from typing import Callable

from ..model.errors import BadInput, UsageError

READ_TIMEOUT_S = 5.0        # each read of the request
CONNECTION_DEADLINE_S = 10.0  # the whole connection, however slowly it dribbles
MAX_CLIENTS = 16


def parse_listen(text: str) -> tuple[str, int]:
    """'127.0.0.1:9464', '[::1]:9464', 'localhost:9464' or ':9464' (-> 127.0.0.1)."""
    if not isinstance(text, str):
        raise UsageError(f"metrics: {text!r} is not HOST:PORT")
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            host, port_text = text, "9464"
    host = host or "127.0.0.1"
    try:
        port = int(port_text)
    except ValueError:
        raise UsageError(f"--metrics: {text!r} is not HOST:PORT") from None
    if not 0 <= port <= 65535:
        raise UsageError(f"--metrics: port {port} is out of range")
    return host, port


def require_loopback(host: str) -> str:
    """The loopback address to bind, or BadInput when host is (or resolves beyond) loopback."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise BadInput(f"--metrics: cannot resolve {host!r}: {exc.strerror}") from None
    addresses = {info[4][0] for info in infos}
    outside = sorted(a for a in addresses if not ipaddress.ip_address(a.split("%")[0]).is_loopback)
    if outside or not addresses:
        raise BadInput(f"--metrics: refusing to listen on {host} ({', '.join(outside) or 'no address'}): "
                       f"metrics are served on loopback only (127.0.0.1 or ::1)")
    return sorted(addresses)[0]


# The labels dcgm-exporter puts on a GPU's series (its GPU, UUID, GPUDevice and Hostname
# fields), spelt as it spells them, so that `on (UUID)` or `on (Hostname, gpu)` joins
# seedance's series with DCGM_FI_* ones without relabelling.  `device` is the character
# device's name, nvidia<gpu>, as dcgm-exporter derives it from the index.  Its fifth,
# modelName, is left out: promtool check metrics (client_golang's promlint) refuses
# camelCase label names, so the model is model_name on seedance_gpu_info alone, one series
# per GPU (`* on (UUID) group_left (model_name) seedance_gpu_info`), as dcgm-exporter's
# own modelName is reached with `group_left (modelName)`.
GPU_LABELS = ("gpu", "UUID", "device", "Hostname")
# dcgm-exporter's pod attribution (--kubernetes): the pod holding the GPU, "" when none does.
WORKLOAD_LABELS = ("namespace", "pod", "container")
def node_name(env=None) -> str:
    """What the Hostname label holds: NODE_NAME where the DaemonSet sets it from the
    downward API (spec.nodeName: in a pod, gethostname() is the pod's name), as dcgm-exporter
    reads it, else this host's name."""
    env = os.environ if env is None else env
    return env.get("NODE_NAME") or socket.gethostname()


def gpu_labels(dev: dict, hostname: str) -> list:
    index = dev.get("index")
    return [str(index), str(dev.get("uuid") or ""), f"nvidia{index}", hostname]


class SnapshotCollector:
    """Turns the agent's snapshot dict into metric families at each scrape.

    Per-process series are summed by workload (namespace, pod, container, command) unless
    the agent's config asks for one series per pid (metrics_per_pid): every process a job
    starts would otherwise be a new series for Prometheus to index and keep."""

    def __init__(self, snapshot: Callable[[], dict], hostname: str | None = None, workloads=None):
        from ..collect.container import WorkloadLabels

        self.snapshot = snapshot
        self.hostname = node_name() if hostname is None else hostname
        self.workloads = workloads if workloads is not None else WorkloadLabels()

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

        snap = self.snapshot()
        agent = snap.get("agent", {})
        counters = snap.get("counters", {})
        yield InfoMetricFamily("seedance_agent", "seedance agent build and settings",
                               value={"version": str(agent.get("version", "")),
                                      "handle_mode": str(agent.get("config", {}).get("handle_mode", "")),
                                      "probes": str(agent.get("probes", {}).get("state", ""))})
        yield GaugeMetricFamily("seedance_agent_start_time_seconds", "Unix time the agent started",
                                value=float(agent.get("started", 0)))
        for name, help_text in (
                ("gc_passes", "Registry GC passes run"),
                ("slots_reclaimed", "Registry slots of dead instances reclaimed"),
                ("leaks_reported", "Dead instances whose outstanding GPU allocations were reported"),
                ("leaked_bytes", "GPU bytes still allocated by instances when they died"),
                ("instances_ended", "Wrapped instances seen to end"),
                ("scans", "Periodic checks completed"),
                ("scan_errors", "Periodic checks that failed"),
                ("nvml_samples", "NVML sampling passes"),
                ("reloads", "SIGHUP reloads of rules and config"),
                ("status_refused", "Status socket connections refused for a foreign uid"),
                ("probe_events", "Events received from the trace probes"),
                ("probe_events_lost", "Events the probes dropped (ring buffer full)"),
                ("quota_placed", "Labelled workloads placed under a quota policy's cgroup"),
                ("quota_burst", "Burstable workloads raised to their burst CPU (pressure low)"),
                ("quota_unburst", "Burstable workloads lowered to their quota (pressure reached)"),
                ("quota_released", "Quota workloads released (ended, or their policy removed)")):
            yield CounterMetricFamily(f"seedance_{name}", help_text, value=float(counters.get(name, 0)))

        per_pid = bool(agent.get("config", {}).get("metrics_per_pid"))
        instances = snap.get("instances", [])
        live = GaugeMetricFamily("seedance_instances", "Wrapped instances in the registry", labels=["state"])
        live.add_metric(["alive"], float(sum(1 for i in instances if i.get("alive"))))
        live.add_metric(["dead"], float(sum(1 for i in instances if not i.get("alive"))))
        yield live
        yield GaugeMetricFamily("seedance_registry_slots_free", "Free slots in the shim registry",
                                value=float(snap.get("registry", {}).get("free_slots", 0)))
        outstanding = GaugeMetricFamily("seedance_instance_allocated_bytes",
                                        "GPU bytes currently allocated by live wrapped instances",
                                        labels=["Hostname", *WORKLOAD_LABELS, "command"] + (["pid"] if per_pid else []))
        sums: dict = {}
        for inst in instances:
            if inst.get("alive"):
                # the pid in the agent's namespace: the one its cgroup is read by, and the one
                # the node's ps and nvidia-smi show
                pid = inst.get("host_pid") or inst.get("pid")
                key = (self.hostname, *self.workloads.of(pid), str(inst.get("command", ""))[:64]) \
                    + ((str(pid),) if per_pid else ())
                sums[key] = sums.get(key, 0.0) + float(inst.get("allocated_bytes", 0))
        for key, value in sums.items():
            outstanding.add_metric(list(key), value)
        yield outstanding

        findings = GaugeMetricFamily("seedance_findings", "Active findings by rule and severity",
                                     labels=["rule", "severity"])
        for rule, severity, count in snap.get("finding_counts", []):
            findings.add_metric([rule, severity], float(count))
        yield findings
        scanned_at = snap.get("scan", {}).get("at")
        if scanned_at:
            # absent until the first check ends: a 0 would read as a check made in 1970, which
            # time() - x turns into a 56-year-old scan rather than "not yet"
            yield GaugeMetricFamily("seedance_last_scan_timestamp_seconds", "Unix time of the latest periodic check",
                                    value=float(scanned_at))

        info = InfoMetricFamily("seedance_gpu", "Each GPU NVML lists, with its model", labels=GPU_LABELS)
        util = GaugeMetricFamily("seedance_gpu_utilization_ratio", "GPU utilisation (0..1) from NVML",
                                 labels=GPU_LABELS)
        mem = GaugeMetricFamily("seedance_gpu_memory_used_bytes", "GPU memory used, from NVML", labels=GPU_LABELS)
        total = GaugeMetricFamily("seedance_gpu_memory_total_bytes", "GPU memory size, from NVML",
                                  labels=GPU_LABELS)
        power = GaugeMetricFamily("seedance_gpu_power_watts", "GPU power draw, from NVML", labels=GPU_LABELS)
        procs = GaugeMetricFamily("seedance_gpu_processes", "Processes on the device, from NVML",
                                  labels=GPU_LABELS)
        held = GaugeMetricFamily("seedance_gpu_process_memory_used_bytes",
                                 "GPU memory used by the processes of a workload on the device, from NVML",
                                 labels=[*GPU_LABELS, *WORKLOAD_LABELS] + (["pid"] if per_pid else []))
        for dev in snap.get("devices", []):
            labels = gpu_labels(dev, self.hostname)
            info.add_metric(labels, {"model_name": str(dev.get("name") or "")})
            if dev.get("utilization") is not None:
                util.add_metric(labels, float(dev["utilization"]))
            if dev.get("memory_used") is not None:
                mem.add_metric(labels, float(dev["memory_used"]))
            if dev.get("memory_total") is not None:
                total.add_metric(labels, float(dev["memory_total"]))
            if dev.get("power_watts") is not None:
                power.add_metric(labels, float(dev["power_watts"]))
            procs.add_metric(labels, float(len(dev.get("processes", []))))
            sums = {}
            for gpu_proc in dev.get("processes", []):
                if gpu_proc.get("used_memory") is None:
                    continue  # NVML could not say (no permission, or a driver that does not count it)
                pid = gpu_proc.get("pid")
                key = (*labels, *self.workloads.of(pid)) + ((str(pid),) if per_pid else ())
                sums[key] = sums.get(key, 0.0) + float(gpu_proc["used_memory"])
            for key, value in sums.items():
                held.add_metric(list(key), value)
        yield from (info, util, mem, total, power, procs, held)
        stack = snap.get("gpu_stack")
        if stack:
            # one series per host, labels bounded by seedance.telemetry.stack; the drift rules
            # count hosts by each label (deploy/prometheus-rules.yaml)
            from ..telemetry.stack import LABELS

            yield InfoMetricFamily("seedance_gpu_stack", "GPU software stack of this host: driver, CUDA runtimes, "
                                   "torch with its CUDA and C++ ABI, NCCL, cuDNN, container images",
                                   value={label: str(stack.get(label, "none")) for label in LABELS})
        yield GaugeMetricFamily("seedance_probes_attached", "1 when the trace probes are attached",
                                value=1.0 if agent.get("probes", {}).get("state") == "attached" else 0.0)


class MetricsServer:
    def __init__(self, listen: str, snapshot: Callable[[], dict]):
        host, self.port = parse_listen(listen)
        self.host = require_loopback(host)
        self.snapshot = snapshot
        self._server = None
        self._thread = None

    def start(self) -> str:
        from socketserver import ThreadingMixIn
        from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

        from prometheus_client import CollectorRegistry, make_wsgi_app

        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(self.snapshot))
        slots = threading.BoundedSemaphore(MAX_CLIENTS)

        class Server(ThreadingMixIn, WSGIServer):
            address_family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
            daemon_threads = True
            block_on_close = False

            def process_request(self, request, client_address):
                if not slots.acquire(blocking=False):
                    self.shutdown_request(request)  # full: drop it rather than queue behind slow ones
                    return
                try:
                    super().process_request(request, client_address)
                except BaseException:
                    slots.release()
                    raise

            def process_request_thread(self, request, client_address):
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    slots.release()

            def handle_error(self, request, client_address):
                pass  # a client that timed out or went away: nothing to log on stderr

        class Quiet(WSGIRequestHandler):
            timeout = READ_TIMEOUT_S  # StreamRequestHandler sets it on the connection

            def setup(self):
                super().setup()
                # One deadline for the connection: closing the socket under a dribbling
                # client ends its thread (the read raises) within CONNECTION_DEADLINE_S.
                self._deadline = threading.Timer(CONNECTION_DEADLINE_S, self._cut)
                self._deadline.daemon = True
                self._deadline.start()

            def _cut(self):
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

            def finish(self):
                self._deadline.cancel()
                try:
                    super().finish()
                except OSError:
                    pass

            def log_message(self, *args):  # the agent logs JSON; no access log on stderr
                pass

        try:
            self._server = make_server(self.host, self.port, make_wsgi_app(registry), Server, handler_class=Quiet)
        except OSError as exc:
            raise BadInput(f"--metrics: cannot listen on {self.host}:{self.port}: "
                           f"{(exc.strerror or str(exc)).lower()}") from None
        self.port = self._server.server_port
        # Accepting blocks (serve_forever() would wake twice a second to poll for shutdown,
        # which is most of what an idle agent would otherwise spend); each accepted
        # connection is answered on its own thread.
        self._server.timeout = None
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="seedance-metrics", daemon=True)
        self._thread.start()
        return self.address

    def _serve(self) -> None:
        while not self._stopping:
            try:
                self._server.handle_request()
            except OSError:
                return

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def stop(self) -> None:
        if self._server is not None:
            self._stopping = True
            try:  # wake the blocked handle_request() with one last connection
                socket.create_connection((self.host, self.port), timeout=1).close()
            except OSError:
                pass
            self._thread.join(timeout=2)
            self._server.server_close()
            self._server = None
