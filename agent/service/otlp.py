"""Optional OTLP/HTTP metric export, for fleets that run an OpenTelemetry collector.

Imported only when an endpoint is configured (--otlp-endpoint, agent.yaml otlp_endpoint,
or the standard OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT), so the agent neither pays for nor
needs opentelemetry otherwise.  The same snapshot feeds Prometheus and OTLP: one set of
numbers, two transports.
"""
from __future__ import annotations

import socket
from typing import Callable


def metrics_url(endpoint: str) -> str:
    """OTEL_EXPORTER_OTLP_ENDPOINT is a base URL; the metrics signal lives at /v1/metrics."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/metrics") else endpoint + "/v1/metrics"


class OtlpExporter:
    def __init__(self, endpoint: str, snapshot: Callable[[], dict], interval: float, version: str):
        self.endpoint = metrics_url(endpoint)
        self.snapshot = snapshot
        self.interval = interval
        self.version = version
        self._provider = None

    def start(self) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.metrics import CallbackOptions, Observation  # noqa: F401
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
            from opentelemetry.sdk.resources import Resource
        except ImportError as exc:
            from ..model.extras import missing

            raise missing("otlp", "OTLP export", exc) from None
        from opentelemetry.metrics import Observation

        resource = Resource.create({"service.name": "seedance-agent", "service.version": self.version,
                                    "host.name": socket.gethostname()})
        reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=self.endpoint, timeout=5),
                                               export_interval_millis=int(self.interval * 1000))
        # A private provider, not the global one: the agent must not change the telemetry of
        # anything that imports it, and shutdown() must stop exactly this exporter.
        self._provider = MeterProvider(resource=resource, metric_readers=[reader])
        meter = self._provider.get_meter("seedance.agent", self.version)

        def counter(name):
            return lambda _options: [Observation(int(self.snapshot().get("counters", {}).get(name, 0)))]

        for name, unit, text in (("leaks_reported", "{instance}", "dead instances whose leaks were reported"),
                                 ("leaked_bytes", "By", "GPU bytes still allocated at instance death"),
                                 ("slots_reclaimed", "{slot}", "registry slots reclaimed"),
                                 ("gc_passes", "{pass}", "registry GC passes")):
            meter.create_observable_counter(f"seedance.{name}", callbacks=[counter(name)], unit=unit,
                                            description=text)

        def instances(_options):
            snap = self.snapshot().get("instances", [])
            alive = sum(1 for i in snap if i.get("alive"))
            return [Observation(alive, {"state": "alive"}), Observation(len(snap) - alive, {"state": "dead"})]

        def findings(_options):
            return [Observation(count, {"rule": rule, "severity": severity})
                    for rule, severity, count in self.snapshot().get("finding_counts", [])]

        def gpu(key):
            def observe(_options):
                # the labels of /metrics, which are dcgm-exporter's: gpu is the index, device
                # its nvidia<N> node, UUID as NVML prints it
                return [Observation(dev[key], {"gpu": str(dev.get("index")), "device": f"nvidia{dev.get('index')}",
                                               "UUID": str(dev.get("uuid", ""))})
                        for dev in self.snapshot().get("devices", []) if dev.get(key) is not None]
            return observe

        meter.create_observable_gauge("seedance.instances", callbacks=[instances], unit="{instance}")
        meter.create_observable_gauge("seedance.findings", callbacks=[findings], unit="{finding}")
        meter.create_observable_gauge("seedance.gpu.utilization", callbacks=[gpu("utilization")], unit="1")
        meter.create_observable_gauge("seedance.gpu.memory.used", callbacks=[gpu("memory_used")], unit="By")
        meter.create_observable_gauge("seedance.gpu.power", callbacks=[gpu("power_watts")], unit="W")

    def stop(self) -> None:
        if self._provider is not None:
            # shutdown() does a final export, so the last numbers before a stop are not lost.
            self._provider.shutdown(timeout_millis=3000)
            self._provider = None
