"""OTLP/HTTP export to a real loopback HTTP receiver, decoded with the OTLP protobufs."""
import http.server
import threading

import pytest

from seedance.service.otlp import OtlpExporter, metrics_url

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="opentelemetry-exporter-otlp-proto-http not installed")


class Receiver(http.server.BaseHTTPRequestHandler):
    bodies = []

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        Receiver.bodies.append((self.path, self.headers.get("Content-Type"), self.rfile.read(length)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_metrics_url():
    assert metrics_url("http://127.0.0.1:4318") == "http://127.0.0.1:4318/v1/metrics"
    assert metrics_url("http://c:4318/v1/metrics") == "http://c:4318/v1/metrics"


def test_exporter_pushes_seedance_metrics():
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    Receiver.bodies = []
    server = http.server.HTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    snapshot = {"counters": {"leaks_reported": 2, "leaked_bytes": 8192},
                "instances": [{"alive": True}, {"alive": False}],
                "finding_counts": [["handle-leak", "warning", 2]],
                "devices": [{"index": 0, "uuid": "GPU-x", "utilization": 0.5}]}
    exporter = OtlpExporter(f"http://127.0.0.1:{server.server_port}", lambda: snapshot, interval=60, version="t")
    exporter.start()
    exporter.stop()  # shutdown performs the final export
    server.shutdown()
    assert Receiver.bodies, "no OTLP request arrived"
    path, content_type, body = Receiver.bodies[-1]
    assert path == "/v1/metrics" and content_type == "application/x-protobuf"
    request = ExportMetricsServiceRequest.FromString(body)
    resource = request.resource_metrics[0]
    attributes = {a.key: a.value.string_value for a in resource.resource.attributes}
    assert attributes["service.name"] == "seedance-agent"
    metrics = {m.name: m for scope in resource.scope_metrics for m in scope.metrics}
    assert metrics["seedance.leaks_reported"].sum.data_points[0].as_int == 2
    assert metrics["seedance.leaked_bytes"].sum.data_points[0].as_int == 8192
    assert metrics["seedance.gpu.utilization"].gauge.data_points[0].as_double == 0.5
    labels = {a.key: a.value.string_value for a in metrics["seedance.gpu.utilization"].gauge.data_points[0].attributes}
    assert labels == {"gpu": "0", "device": "nvidia0", "UUID": "GPU-x"}  # as /metrics and dcgm-exporter
    states = {dp.attributes[0].value.string_value: dp.as_int for dp in metrics["seedance.instances"].gauge.data_points}
    assert states == {"alive": 1, "dead": 1}
