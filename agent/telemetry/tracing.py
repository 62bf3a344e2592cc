"""The OpenTelemetry side of seedance's traces: provider, sampler, tail decision, export.

Loaded only when the environment asks for traces (seedance.telemetry.wanted).  What it
follows from the OpenTelemetry specification:
- the exporter, endpoint, headers and timeout come from the standard variables, read by
  the OTLP/HTTP exporter itself (OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, ..._HEADERS,
  ..._TIMEOUT); OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES by Resource.create;
- OTEL_TRACES_EXPORTER: otlp (http/protobuf), console (stderr: stdout carries reports),
  none; an exporter this build does not have is said once and ignored, as the SDK does;
- context arrives in TRACEPARENT/TRACESTATE (the environment-variable carrier) and
  leaves the same way to the programs `seedance run` starts.

Sampling is parent-based with a tail decision.  The head decision (a remote parent's
sampled flag, else OTEL_TRACES_SAMPLER_ARG as a trace-id ratio) sets the flag that the
spans and the wrapped program's TRACEPARENT carry.  Every span is recorded, and the
spans of one local trace (a command, an agent pass) are held until its root ends; the
trace is then exported when the head decision kept it, or, whatever it said, when the
trace ends in failure: a non-zero exit, an error or fatal finding, a span with error
status.  So a fleet can sample healthy runs at 1% and still see every failing one.
"""
from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .. import __version__

MAX_SPANS_PER_TRACE = 512     # a trace's buffer; later spans of a runaway trace are dropped
MAX_OPEN_TRACES = 64          # local traces waiting for their root (the agent: one per pass)
MAX_QUEUED_TRACES = 256       # decided traces waiting for the exporter thread
MAX_RULE_IDS = 32             # rule ids on one span (the rules are a fixed set of ~40)
SHUTDOWN_WAIT_S = 5.0         # a command waits at most this for its trace to leave
ERROR_SEVERITIES = ("error", "fatal")

_PROPAGATOR = TraceContextTextMapPropagator()
_GRAMMAR_WORD = re.compile(r"[a-z][a-z0-9-]{0,31}\Z")


def _ratio(env) -> tuple:
    """(parent_based, ratio) from OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG."""
    name = env.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower() or "parentbased_always_on"
    parent_based = name.startswith("parentbased_") or name not in ("always_on", "always_off", "traceidratio")
    if name.endswith("always_off"):
        return parent_based, 0.0
    if name.endswith("traceidratio"):
        try:
            ratio = float(env.get("OTEL_TRACES_SAMPLER_ARG", "1.0"))
        except ValueError:
            ratio = 1.0  # the specification: an invalid argument falls back to the default
        if ratio != ratio:  # nan
            ratio = 1.0
        return parent_based, min(1.0, max(0.0, ratio))
    return parent_based, 1.0


class HeadSampler(Sampler):
    """Parent-based trace-id ratio, recording every span either way: the tail decision
    needs the spans of a trace it did not sample at its head."""

    def __init__(self, parent_based: bool, ratio: float):
        self.parent_based, self.ratio = parent_based, ratio
        self.bound = round(ratio * (1 << 64))  # TraceIdRatioBased: the low 64 bits of the id

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None,
                      trace_state=None):
        parent = trace.get_current_span(parent_context).get_span_context()
        if self.parent_based and parent.is_valid:
            sampled = parent.trace_flags.sampled
        else:
            sampled = (trace_id & 0xFFFFFFFFFFFFFFFF) < self.bound
        return SamplingResult(Decision.RECORD_AND_SAMPLE if sampled else Decision.RECORD_ONLY, attributes,
                              parent.trace_state if parent.is_valid else trace_state)

    def get_description(self) -> str:
        return f"seedance.HeadSampler{{parent_based={self.parent_based},ratio={self.ratio}}}"


class TailProcessor(SpanProcessor):
    """Holds each local trace's spans until its root ends, decides, and hands the kept
    traces to one exporter thread (a slow collector never blocks a command or the agent's
    loop beyond SHUTDOWN_WAIT_S)."""

    def __init__(self, exporters: list):
        self.exporters = exporters
        self._lock = threading.Lock()
        self._open: dict = {}       # trace_id -> [ReadableSpan]
        self._queue: list = []
        self._wake = threading.Condition(self._lock)
        self._busy = False
        self._closed = False
        self.kept = self.dropped = 0
        self._thread = threading.Thread(target=self._export_loop, name="seedance-traces", daemon=True)
        self._thread.start()

    def on_start(self, span, parent_context=None):
        pass

    def on_end(self, span) -> None:
        trace_id = span.context.trace_id
        local_root = span.parent is None or span.parent.is_remote
        with self._lock:
            spans = self._open.get(trace_id)
            if spans is None:
                if len(self._open) >= MAX_OPEN_TRACES:
                    self._open.pop(next(iter(self._open)))  # the oldest never ended: let it go
                spans = self._open[trace_id] = []
            if len(spans) < MAX_SPANS_PER_TRACE:
                spans.append(span)
            if not local_root:
                return
            del self._open[trace_id]
            if span.context.trace_flags.sampled or _failed(spans):
                if len(self._queue) < MAX_QUEUED_TRACES:
                    self._queue.append(spans)
                    self.kept += 1
                    self._wake.notify()
            else:
                self.dropped += 1

    def _export_loop(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._wake.wait()
                if not self._queue:
                    return
                batch, self._queue = self._queue, []
                self._busy = True
            spans = [s for trace_spans in batch for s in trace_spans]
            for exporter in self.exporters:
                try:
                    exporter.export(spans)
                except Exception:  # noqa: BLE001 - a collector that fails must not end the command
                    pass
            with self._lock:
                self._busy = False
                self._wake.notify_all()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        with self._lock:
            while (self._queue or self._busy) and time.monotonic() < deadline:
                self._wake.wait(max(0.0, deadline - time.monotonic()))
            return not (self._queue or self._busy)

    def shutdown(self) -> None:
        self.force_flush(int(SHUTDOWN_WAIT_S * 1000))
        with self._lock:
            self._closed = True
            self._wake.notify_all()
        for exporter in self.exporters:
            try:
                exporter.shutdown()
            except Exception:  # noqa: BLE001
                pass


def _failed(spans) -> bool:
    """Whether a trace ended in failure: the tail sampler keeps all of those."""
    for span in spans:
        if span.status.status_code is StatusCode.ERROR:
            return True
        attrs = span.attributes or {}
        if attrs.get("process.exit.code", 0) not in (0, None):
            return True
        if any(attrs.get(f"seedance.findings.{level}", 0) for level in ERROR_SEVERITIES):
            return True
    return False


def _exporters(env) -> list:
    names = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",") if n.strip()]
    exporters = []
    for name in names or ["otlp"]:
        if name == "otlp":
            protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                        or "http/protobuf")
            if protocol != "http/protobuf":
                _note(f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r}: only http/protobuf is built in; using it")
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter(out=sys.stderr))  # stdout carries the reports
        elif name != "none":
            _note(f"OTEL_TRACES_EXPORTER {name!r} is not supported (otlp, console, none): ignored")
    return exporters


def _note(text: str) -> None:
    try:
        print(f"seedance: note: {text}", file=sys.stderr)
    except OSError:
        pass


def _container_attributes() -> dict:
    """container.id and k8s.pod.uid from this process's cgroup path, as the OpenTelemetry
    resource detectors find them (cgroup v2: /proc/self/cgroup '0::/...<64 hex>...')."""
    import re

    try:
        with open("/proc/self/cgroup") as f:
            text = f.read(8192)
    except OSError:
        return {}
    out = {}
    match = re.search(r"([0-9a-f]{64})(?:\.scope)?\s*$", text, re.M)
    if match:
        out["container.id"] = match.group(1)
    pod = re.search(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})", text)
    if pod:
        out["k8s.pod.uid"] = pod.group(1).replace("_", "-")
    return out


def resource(env) -> Resource:
    import platform

    attributes = {"service.name": "seedance", "service.version": __version__,
                  "host.name": socket.gethostname(), "host.arch": platform.machine(), "os.type": "linux",
                  "process.pid": os.getpid(), "process.executable.name": "seedance",
                  "process.runtime.name": sys.implementation.name,
                  "process.runtime.version": platform.python_version(),
                  **_container_attributes()}
    # OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME win over these, as the specification
    # orders them (k8s.namespace.name, k8s.pod.name, k8s.node.name come that way, from the
    # downward API); Resource.create alone would let the values given here win
    return Resource.create(attributes).merge(OTELResourceDetector().detect())


def start(env):
    """A Session, or None (said once on stderr) when the SDK cannot start here."""
    try:
        exporters = _exporters(env)
    except ImportError as exc:
        _note(f"traces need opentelemetry-exporter-otlp-proto-http ({exc.name} is missing): not traced")
        return None
    if not exporters:
        return None
    return Session(env, exporters)


class Phases:
    """One phase span at a time under the current span."""

    def __init__(self, session, prefix: str):
        self.session, self.prefix, self.current = session, prefix, None

    def next(self, name: str, attributes: dict | None = None) -> None:
        self.end()
        self.current = self.session.tracer.start_span(f"{self.prefix}.{name}", attributes=attributes)
        if self not in self.session.open_phases:
            self.session.open_phases.append(self)

    def end(self) -> None:
        if self.current is not None:
            self.current.end()
            self.current = None

    def set(self, key, value):
        if self.current is not None:
            self.current.set_attribute(key, value)

    def event(self, name, attributes=None):
        if self.current is not None:
            self.current.add_event(name, attributes or {})


class Stages:
    """One stage span at a time under the span current when it was made, each attached as
    the current span while it runs, so spans started inside it are its children.  The
    stages follow one another on one thread: each is detached before the next attaches,
    which keeps the context's tokens in the order they were set."""

    def __init__(self, session, prefix: str, attributes: dict | None):
        self.session, self.prefix = session, prefix
        self.attributes = {k: v for k, v in (attributes or {}).items() if v is not None}
        self.current = None  # the open stage: a _Span

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        self._close(kind, value)
        return False

    def next(self, name: str, attributes: dict | None = None) -> None:
        self._close(None, None)
        span = self.session.tracer.start_span(f"{self.prefix}.{name}", attributes={**self.attributes,
                                                                                   **(attributes or {})})
        self.current = _Span(span).__enter__()

    def end(self) -> None:
        self._close(None, None)

    def _close(self, kind, value) -> None:
        current, self.current = self.current, None
        if current is not None:
            current.__exit__(kind, value, None)

    def set(self, key, value):
        if self.current is not None and value is not None:
            self.current.set(key, value)

    def event(self, name, attributes=None):
        if self.current is not None:
            self.current.event(name, attributes)


class _Span:
    """A started span as a context manager that also ends it, with the status an exception
    leaves."""

    def __init__(self, span, token=None):
        self.span, self.token = span, token

    def __enter__(self):
        if self.token is None:
            self.token = otel_context.attach(trace.set_span_in_context(self.span))
        return self

    def __exit__(self, kind, value, _tb):
        if value is not None and not isinstance(value, (SystemExit, GeneratorExit)):
            self.span.record_exception(value)
            self.span.set_status(Status(StatusCode.ERROR, f"{kind.__name__}: {value}"))
        otel_context.detach(self.token)
        self.span.end()
        return False

    def set(self, key, value):
        self.span.set_attribute(key, value)

    def event(self, name, attributes=None):
        self.span.add_event(name, {k: v for k, v in (attributes or {}).items() if v is not None})


MAX_SHIM_EVENTS = 64          # span events from the shim on one run (the rest are counted)
# the shim's event kinds that say something happened to the program (shim/events.py); the
# alloc/free/launch stream is the profiler's, counted here but never one span event each
SHIM_SPAN_EVENTS = {"init": "cuda.init", "quota_refused": "seedance.allocation.refused", "remap": "seedance.remap",
                    "note": "seedance.shim.note", "context": "cuda.context", "exit": "seedance.instance.exit"}


class ShimEventSink:
    """The drain's output (seedance.run.events): each JSON line also becomes a span event."""

    def __init__(self, span, stream=None):
        self.span, self.stream = span, stream
        self.counts: dict = {}
        self.recorded = 0

    def write(self, text: str) -> None:
        if self.stream is not None:
            self.stream.write(text)
        import json

        for line in text.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            kind = event.get("kind") if isinstance(event, dict) else None
            if not kind or kind == "start":
                continue
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self.span.set(f"seedance.shim.events.{kind}", self.counts[kind])
            name = SHIM_SPAN_EVENTS.get(kind)
            if name is None or self.recorded >= MAX_SHIM_EVENTS:
                continue
            self.recorded += 1
            attributes = {"process.pid": event.get("pid"), "seedance.gpu.device": event.get("device"),
                          "seedance.cuda.api": event.get("api"), "seedance.cuda.result": event.get("result"),
                          "seedance.allocation.bytes": event.get("bytes"), "seedance.shim.text": event.get("text")}
            self.span.event(name, {k: v for k, v in attributes.items() if isinstance(v, (str, int, float))})

    def flush(self) -> None:
        if self.stream is not None:
            self.stream.flush()


class Session:
    def __init__(self, env, exporters):
        parent_based, ratio = _ratio(env)
        self.processor = TailProcessor(exporters)
        self.provider = TracerProvider(sampler=HeadSampler(parent_based, ratio), resource=resource(env),
                                       shutdown_on_exit=False)
        self.provider.add_span_processor(self.processor)
        # a private provider, not the global one: a program importing seedance keeps its own
        self.tracer = self.provider.get_tracer("seedance", __version__)
        carrier = {"traceparent": env.get("TRACEPARENT", ""), "tracestate": env.get("TRACESTATE", "")}
        # a malformed TRACEPARENT is ignored (a new trace starts), as the W3C spec says
        self.parent = _PROPAGATOR.extract({k: v for k, v in carrier.items() if v})
        self.root = None
        self.open_phases: list = []

    # -- the command -----------------------------------------------------------------
    def command(self, call, name, words) -> int:
        if name == "agent" and words[1:2] == ["run"]:
            return call()  # the agent's life is no trace: each pass is one (root_span)
        span_name = f"seedance {name}" if name else "seedance"
        attributes = {"process.executable.name": "seedance", "process.pid": os.getpid()}
        if name:
            attributes["seedance.command"] = name
            # fix env-leak, fix cuda-mismatch: the grammar's words have hyphens, paths have / or .
            sub = words[1] if len(words) > 1 and _GRAMMAR_WORD.match(words[1]) else None
            if sub and name in ("fix", "plugin", "profile", "quota", "agent", "trace", "bench"):
                attributes["seedance.subcommand"] = sub  # a word of the grammar, never a path
        self.root = self.tracer.start_span(span_name, context=self.parent, attributes=attributes)
        token = otel_context.attach(trace.set_span_in_context(self.root))
        code = 2
        try:
            code = call()
            return code
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            raise
        except BaseException as exc:
            self.root.record_exception(exc)
            raise
        finally:
            for phases in self.open_phases:
                phases.end()
            self.root.set_attribute("process.exit.code", int(code))
            if code == 2 or code >= 126:  # bad input, a program not run, a signal: a failed operation
                self.root.set_status(Status(StatusCode.ERROR, f"exit code {code}"))
            otel_context.detach(token)
            self.root.end()

    def shutdown(self) -> None:
        self.processor.shutdown()

    # -- spans under it ------------------------------------------------------------------
    def span(self, name, attributes=None):
        return _Span(self.tracer.start_span(name, attributes=attributes))

    def root_span(self, name, attributes=None):
        """A new trace (the agent's passes): no parent, not even the process's TRACEPARENT."""
        return _Span(self.tracer.start_span(name, context=otel_context.Context(), attributes=attributes))

    def phases(self, prefix):
        return Phases(self, prefix)

    def stages(self, prefix, attributes=None):
        return Stages(self, prefix, attributes)

    def event(self, name, attributes=None):
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event(name, {k: v for k, v in (attributes or {}).items() if v is not None})

    def note_report(self, report, span=None) -> None:
        findings = report.get("findings", []) if isinstance(report, dict) else report.findings
        counts: dict = {}
        rules: set = set()
        for finding in findings:
            severity = finding.get("severity") if isinstance(finding, dict) else finding.severity
            rule = finding.get("rule") if isinstance(finding, dict) else finding.rule
            counts[str(severity)] = counts.get(str(severity), 0) + 1
            rules.add(str(rule))
        target = span or self.root or trace.get_current_span()
        target.set_attribute("seedance.findings.count", sum(counts.values()))
        for severity in ("info", "warning", "error", "fatal"):
            target.set_attribute(f"seedance.findings.{severity}", counts.get(severity, 0))
        target.set_attribute("seedance.rule_ids", sorted(rules)[:MAX_RULE_IDS])
        stats = report.get("stats", {}) if isinstance(report, dict) else getattr(report, "stats", {})
        cache = (stats or {}).get("cache")
        if isinstance(cache, dict) and cache.get("state"):
            target.set_attribute("seedance.check.cache", str(cache["state"]))

    def child_env(self, env: dict) -> dict:
        carrier: dict = {}
        _PROPAGATOR.inject(carrier)  # the current span: the one that starts the program
        env = {k: v for k, v in env.items() if k not in ("TRACEPARENT", "TRACESTATE")}
        if "traceparent" in carrier:
            env["TRACEPARENT"] = carrier["traceparent"]
        if carrier.get("tracestate"):
            env["TRACESTATE"] = carrier["tracestate"]
        return env

    def record_pass(self, name, start_wall, report=None, error=None) -> None:
        span = self.tracer.start_span(name, context=otel_context.Context(), start_time=int(start_wall * 1e9))
        if report is not None:
            self.note_report(report, span=span)
            duration = (report.get("stats") or {}).get("duration_s")
            if duration is not None:
                span.set_attribute("seedance.check.duration_s", float(duration))
        if error:
            span.set_status(Status(StatusCode.ERROR, str(error)[:512]))
        span.end()
