"""The fallback without eBPF: launch the command under the shim's LD_AUDIT module.

ld.so itself reports to an audit module every library search (la_objsearch, with the
search source), every object it opens (la_objopen) and the bindings of CUDA symbols
(la_symbind64); the shim's audit module (shim/src/audit.c) writes them to its per-process
event ring, and the shim preloaded alongside records device allocations and frees.
This needs no privileges, but only sees a process seedance starts, and the loader's
error messages are not among what LD_AUDIT reports.

The shim's events become the same TraceEvents the eBPF session produces (object,
cuda_alloc, cuda_free, exit, plus search and bind), so facts.py and the rules are shared.
A private registry directory keeps this run's instances apart from `seedance run`'s.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time

from ..model.errors import BadInput, NotAvailable
from .events import TraceEvent
from .session import TraceSummary

POLL_S = 0.05


def _shim():
    try:
        from .. import shim
    except ImportError as exc:  # pragma: no cover - the shim is part of the package
        raise NotAvailable(f"LD_AUDIT fallback: the shim is not installed ({exc})") from None
    return shim


def to_trace_event(raw: dict, audit_objects: dict) -> TraceEvent | None:
    """A TraceEvent from one shim event dict (seedance.shim EVENT FORMAT)."""
    kind, pid = raw.get("kind"), int(raw.get("pid", 0))
    objects = audit_objects.setdefault(pid, {})
    if kind == "objopen":
        objects[raw.get("obj")] = raw.get("path") or ""
        return TraceEvent("object", pid, data={"path": raw.get("path") or "", "namespace": raw.get("lmid", 0),
                                                "link_map": f"audit:{raw.get('obj')}", "base": 0})
    if kind == "objsearch":
        return TraceEvent("search", pid, data={"name": raw.get("name"), "source": raw.get("source"),
                                                "requester": objects.get(raw.get("requester"))})
    if kind == "symbind":
        return TraceEvent("bind", pid, data={"symbol": raw.get("symbol"),
                                              "from": objects.get(raw.get("from_obj")),
                                              "to": objects.get(raw.get("to_obj"))})
    if kind == "alloc":
        return TraceEvent("cuda_alloc", pid, data={"api": raw.get("api"), "ptr": hex(int(raw.get("ptr") or 0)),
                                                    "bytes": int(raw.get("bytes") or 0),
                                                    "device": int(raw.get("device", -1)),
                                                    "library": raw.get("library")})
    if kind == "free":
        return TraceEvent("cuda_free", pid, data={"api": raw.get("api"), "ptr": hex(int(raw.get("ptr") or 0))})
    if kind == "exit":
        return TraceEvent("exit", pid)
    return None


def run_audit(command: list, on_event, on_notice=None, duration=None, child_stdout=None) -> TraceSummary:
    """Launch ``command`` with the shim as LD_AUDIT (and LD_PRELOAD); stream its events.
    ``child_stdout``: a descriptor for the command's stdout (2 while the stream owns ours)."""
    notice = on_notice or (lambda text: None)
    shim = _shim()
    library = shim.library_path()  # NotAvailable when the shim is not built
    shim.binding()  # refuses a library of another version, with the fix
    from pathlib import Path

    from ..run.launch import check_preload_path
    check_preload_path(Path(library))  # never preload from a group/world-writable path
    from ..shim.binding import expected_version

    exe = shutil.which(command[0])
    if exe is None:
        raise BadInput(f"{command[0]}: command not found")
    summary = TraceSummary(backend="audit")
    runtime_dir = tempfile.mkdtemp(prefix="seedance-trace-")
    previous_dir = os.environ.get("SEEDANCE_RUNTIME_DIR")
    os.environ["SEEDANCE_RUNTIME_DIR"] = runtime_dir  # Registry.open() reads it too
    env = dict(os.environ, SEEDANCE_EVENTS="1", SEEDANCE_FOLLOW="1", SEEDANCE_SHIM_VERSION=expected_version())
    env["LD_AUDIT"] = ":".join(filter(None, [str(library), os.environ.get("LD_AUDIT", "")]))
    env["LD_PRELOAD"] = ":".join(filter(None, [str(library), os.environ.get("LD_PRELOAD", "")]))
    stop = {"reason": ""}

    def on_signal(signum, _frame):
        stop["reason"] = f"{signal.Signals(signum).name} received"

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    audit_objects: dict = {}
    exited: set = set()
    registry = None
    try:
        try:
            child = subprocess.Popen(command, env=env, stdout=child_stdout)
        except OSError as exc:
            raise BadInput(f"{command[0]}: cannot run: {(exc.strerror or str(exc)).lower()}") from None
        notice(f"LD_AUDIT: {library} traces pid {child.pid}")
        summary.events += 1
        on_event(TraceEvent("exec", child.pid, data={"path": exe}))  # Popen returns after the exec

        def drain():
            nonlocal registry
            if registry is None:
                try:
                    registry = shim.Registry.open()
                except NotAvailable:
                    return  # the child has not created the registry yet
            for instance in registry.instances():
                for raw in registry.drain_events(instance.slot):
                    event = to_trace_event(raw, audit_objects)
                    if event is None:
                        continue
                    if event.kind == "exit":
                        exited.add(event.pid)
                    summary.events += 1
                    on_event(event)
                summary.lost = max(summary.lost, int(getattr(instance, "events_dropped", 0) or 0))

        while True:
            drain()
            status = child.poll()
            if status is not None:
                summary.command_status = status
                drain()
                summary.stop_reason = f"command exited with status {status}"
                break
            if stop["reason"]:
                summary.stop_reason = stop["reason"]
                break
            if duration and time.monotonic() - started >= duration:
                summary.stop_reason = f"duration {duration:g}s elapsed"
                break
            time.sleep(POLL_S)
        # processes whose shim could not report its exit (killed) end here
        for pid in sorted(audit_objects):
            if pid not in exited and not os.path.exists(f"/proc/{pid}"):
                summary.events += 1
                on_event(TraceEvent("exit", pid))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if registry is not None:
            try:
                registry.close()
            except Exception:
                pass
        if previous_dir is None:
            os.environ.pop("SEEDANCE_RUNTIME_DIR", None)
        else:
            os.environ["SEEDANCE_RUNTIME_DIR"] = previous_dir
        shutil.rmtree(runtime_dir, ignore_errors=True)
        summary.elapsed_s = time.monotonic() - started
    return summary
