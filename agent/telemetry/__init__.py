"""Traces of seedance's own work, sent where the standard OpenTelemetry variables say.

Tracing is on only when the environment asks for it (OTEL_TRACES_EXPORTER, or an OTLP
endpoint in OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT; OTEL_SDK_DISABLED=true turns it off).
Until then every call here returns at once and nothing imports the OpenTelemetry SDK:
that happens in seedance.telemetry.tracing, loaded by start() only.  The hooks in the
commands and the agent call this module, never the SDK, so a run without the variables
pays a few dictionary lookups (bench/bench_tracing.py measures it).
"""
from __future__ import annotations

import os

_session = None  # tracing.Session while tracing is on

# the variables that can turn traces on; any other OTEL_* value alone never does
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def wanted(env=os.environ) -> bool:
    """Whether the environment asks for traces.  The specification's default exporter is
    otlp, but a CLI that sent traces to localhost:4318 on every run of every user who never
    asked would be a surprise: an exporter or an endpoint must be named."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return any(env.get(name) for name in _ENDPOINTS)


class _Null:
    """What every call answers while tracing is off."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def set(self, key, value):
        pass

    def event(self, name, attributes=None):
        pass

    def next(self, name, attributes=None):
        pass

    def end(self):
        pass


NULL = _Null()


def active() -> bool:
    return _session is not None


def run_command(call, name: str | None, words: list) -> int:
    """CALL() (the CLI's main) inside a span for the command, or as it is when tracing is
    off or cannot start.  Returns its exit code."""
    global _session
    from . import tracing

    _session = tracing.start(os.environ)
    if _session is None:
        return call()
    try:
        return _session.command(call, name, words)
    finally:
        session, _session = _session, None
        session.shutdown()


def span(name: str, attributes: dict | None = None):
    """A child span of the current one, as a context manager (NULL when off)."""
    return NULL if _session is None else _session.span(name, attributes)


def phases(prefix: str):
    """Sequential phase spans: .next(name) ends the previous phase and starts the next,
    .end() ends the last; a phase left open ends with its command."""
    return NULL if _session is None else _session.phases(prefix)


def stages(prefix: str, attributes: dict | None = None):
    """Sequential spans that each become the current span while open, as a context manager:
    .next(name) ends the previous stage and starts PREFIX.name (with ATTRIBUTES too), .set()
    writes on the open one, leaving the with ends the last (with error status when an
    exception leaves).  Unlike phases(), work done inside a stage (a check a fix runs to
    plan) nests under it.  NULL when off."""
    return NULL if _session is None else _session.stages(prefix, attributes)


def note_report(report) -> None:
    """The findings of a Report (or its dict) on the command's span: counts by severity and
    the rule ids, which the tail sampler reads to keep every trace with an error finding."""
    if _session is not None:
        _session.note_report(report)


def event(name: str, attributes: dict | None = None) -> None:
    if _session is not None:
        _session.event(name, attributes)


def child_env(env: dict) -> dict:
    """ENV with TRACEPARENT/TRACESTATE of the current span, for a program seedance starts
    (the OpenTelemetry environment-variable carrier); ENV itself when off."""
    return env if _session is None else _session.child_env(env)


def shim_events(span, stream):
    """Where a run's event drain writes: STREAM itself when off; traced, a stream that also
    turns the shim's events into events of SPAN (and still writes STREAM, when given)."""
    if _session is None:
        return stream
    from .tracing import ShimEventSink

    return ShimEventSink(span, stream)


def leak_events(span, report) -> None:
    """The run's handle-leak findings as events of its span."""
    if _session is None:
        return
    for finding in report.findings:
        if finding.rule == "handle-leak":
            evidence = finding.evidence or {}
            span.event("seedance.leak", {"seedance.rule": finding.rule, "seedance.leak.bytes": evidence.get("bytes"),
                                         "seedance.gpu.device": evidence.get("device"),
                                         "seedance.leak.library": evidence.get("library"),
                                         "seedance.leak.pid": (finding.subject or {}).get("pid")})


def agent_pass(name: str, attributes: dict | None = None):
    """A root span for one pass of the agent's loop (a trace of its own)."""
    return NULL if _session is None else _session.root_span(name, attributes)


def record_pass(name: str, start_wall: float, report: dict | None = None, error: str | None = None) -> None:
    """A finished pass (the periodic check, which runs in a child) as one root span from
    START_WALL (epoch seconds) to now."""
    if _session is not None:
        _session.record_pass(name, start_wall, report, error)


def start_service(env=os.environ) -> None:
    """Tracing for a long-running process (the agent): no span for the process itself,
    each pass is its own trace.  stop_service() flushes."""
    global _session
    if _session is None and wanted(env):
        from . import tracing

        _session = tracing.start(env)


def stop_service() -> None:
    global _session
    session, _session = _session, None
    if session is not None:
        session.shutdown()
