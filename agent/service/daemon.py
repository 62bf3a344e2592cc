"""The agent's loop: one thread decides, helper threads only serve or wait.

Every gc-interval the registry of wrapped instances is read; an instance whose process is
gone (pid plus start time, so a recycled pid is not mistaken for it) has its outstanding
allocations turned into `instance_leak` facts, the rule engine makes the `handle-leak`
finding, the end and the finding are committed to SQLite, and only then is the registry
slot reclaimed.  That order makes the report exactly-once across a kill -9: a restart
finds the slot still there, sees in the database that its end was already recorded, and
only reclaims it.

Signals arrive through a wakeup pipe (signal.set_wakeup_fd) so the loop sleeps in
select() and wakes at once: SIGHUP reloads rules and config, SIGTERM/SIGINT stop cleanly.
"""
from __future__ import annotations

import os
import select
import signal
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

from .. import __version__, telemetry
from ..judge.engine import load_rules
from ..model.errors import NotAvailable, SeedanceError
from ..model.report import Fact, Finding
from . import config as config_mod
from .api import StatusServer
from .gpu import NvmlSampler, affinity_facts
from .log import JsonLog
from .notify import Notifier
from .state import StateStore

STATUS_SCHEMA = "seedance.agent-status/v1"
WRAPPER_GRACE_S = 30.0
QUOTA_POLL_S = 2.0      # quota pass: new labelled workloads are placed within this
IDLE_SCAN_MAX_S = 60.0   # an empty registry is re-read at most this far apart (busy: every gc-interval)
PROBE_POLL_S = 5.0       # probe findings and counts are collected this often


class Agent:
    def __init__(self, flags: dict, env=os.environ, log: JsonLog | None = None,
                 registry_factory=None):
        self.flags = {k: v for k, v in flags.items() if v is not None}
        self.env = env
        self.log = log or JsonLog()
        self.config_path = config_mod.agent_config_path(env)
        self.config = config_mod.load_config(self.config_path, self.flags, env)
        self.registry_factory = registry_factory
        self.notifier = Notifier(env)
        self.started = time.time()
        self.counters = {name: 0 for name in (
            "gc_passes", "slots_reclaimed", "leaks_reported", "leaked_bytes", "instances_ended",
            "scans", "scan_errors", "nvml_samples", "reloads", "status_refused", "probe_events",
            "probe_events_lost", "quota_placed", "quota_burst", "quota_unburst", "quota_released")}
        self._quota = None  # seedance.quota controller, made on the first pass that has policies
        self._lock = threading.RLock()
        self._instances: list[dict] = []
        self._devices: list[dict] = []
        self._known_live: set = set()
        self._deferred: dict = {}
        self._gc_count = 0
        self._registry_busy = True
        self._idle_interval = 0.0
        self._registry_info: dict = {"state": "not opened"}
        self._probes_info: dict = {"state": "off"}
        self._nvml_info: dict = {"state": "off"}
        self._scan_info: dict = {"state": "off"}
        self._gpu_stack: dict | None = None  # labels of seedance_gpu_stack_info, from the latest check
        self._scan_child = None
        self._pending: list[int] = []
        self._stop = False
        self.rules = None
        self.state: StateStore | None = None
        self.registry = None
        self.api: StatusServer | None = None
        self.metrics = None
        self.otlp = None
        self.probes = None
        self.sampler: NvmlSampler | None = None

    # -- start / stop --------------------------------------------------------------------
    def start(self) -> None:
        self.rules = load_rules(self.config.rules_dir)
        if self.config.metrics:
            from .metrics import MetricsServer

            MetricsServer(self.config.metrics, self.snapshot)  # a bad address fails here, before any file
        self.state = StateStore.open(config_mod.state_dir(self.env))
        if self.state.moved_aside:
            self.log("state-corrupt", "error", moved_to=str(self.state.moved_aside),
                     message=f"state database {self.state.path} could not be read; moved aside to "
                             f"{self.state.moved_aside} and started a fresh one")
        self.api = StatusServer(config_mod.socket_path(self.env), self.handle_request,
                                on_refused=self._refused)
        self.api.start()
        self._open_registry()
        self._apply_outputs(None)
        self._apply_probes()
        self._start_nvml()
        self._reset_schedule()
        self.log("started", pid=os.getpid(), version=__version__, config=self.config.to_dict(),
                 state_db=str(self.state.path), socket=str(self.api.path),
                 metrics=self.metrics.address if self.metrics else None,
                 registry=self._registry_info, probes=self._probes_info, nvml=self._nvml_info,
                 rules=len(self.rules))

    def close(self, quiet: bool = False) -> None:
        """Stop in the order that loses nothing: no new work, probes off, last export, flush.

        quiet: start() failed, so the one error line is all the user sees, with no JSON
        stopping/stopped lines around it for a daemon that never started."""
        log = (lambda *a, **k: None) if quiet else self.log
        if not quiet:
            self.notifier.stopping("stopping: detaching probes, flushing state")
        log("stopping")
        self._detach_probes()
        if self._scan_child is not None:
            self._scan_child.kill()
            self._scan_child = None
        if self.api is not None:
            self.api.stop()
        if self.metrics is not None:
            self.metrics.stop()
        if self.otlp is not None:
            self.otlp.stop()
        if self.sampler is not None:
            self.sampler.stop()
        if self.registry is not None:
            self.registry.close()
        if self.state is not None:
            self.state.close()
            log("state-flushed", path=str(self.state.path))
        log("stopped", counters=dict(self.counters))
        self.notifier.close()

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> int:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        old_fd = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        started = False
        try:
            self.start()
            started = True
            self.notifier.ready(self._status_line())
            while not self._stop:
                self._run_due()
                timeout = max(0.0, min(self._due.values()) - time.monotonic())
                # A running check's pipe wakes the loop as its result arrives, so the report is
                # taken at once, not at the next 5 s look: a niced check on a loaded host is
                # slow enough without waiting on top of it.
                child = self._scan_child if "scan" in self._due else None
                watched = [wake_r] if child is None else [wake_r, child.fileno()]
                try:
                    ready, _, _ = select.select(watched, [], [], timeout)
                except InterruptedError:
                    ready = [wake_r]
                if wake_r in ready:
                    _drain(wake_r)
                if child is not None and child.fileno() in ready:
                    self._due["scan"] = time.monotonic()
                self._handle_signals()
            return 0
        finally:
            try:
                self.close(quiet=not started)
            finally:
                signal.set_wakeup_fd(old_fd)
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
                os.close(wake_r)
                os.close(wake_w)

    def _on_signal(self, signum, _frame) -> None:
        self._pending.append(signum)

    def _handle_signals(self) -> None:
        while self._pending:
            signum = self._pending.pop(0)
            if signum == signal.SIGHUP:
                try:
                    self.reload()
                except Exception as exc:  # noqa: BLE001 - a reload must never end the agent
                    self.log("reload-failed", "error", error=f"{type(exc).__name__}: {exc}")
                    self.notifier.ready(self._status_line())
            else:
                self.log("signal", signal=signal.Signals(signum).name)
                self._stop = True

    def _reset_schedule(self) -> None:
        now = time.monotonic()
        self._due = {"gc": now, "status": now + 30.0}
        watchdog = self.notifier.watchdog_interval()
        if watchdog:
            self._due["watchdog"] = now
        if self.sampler is not None:
            self._due["sample"] = now
        if self.config.scan:
            # The first check waits a little so a restart storm does not also scan the host.
            self._due["scan"] = now + min(self.config.scan_interval, 30.0)
        if self.probes is not None:
            self._due["probes"] = now
        self._due["quota"] = now

    def _run_due(self) -> None:
        now = time.monotonic()
        for task, due in sorted(self._due.items(), key=lambda item: item[1]):
            if due > now:
                continue
            try:
                # each registry GC pass is a trace of its own when traced (seedance.telemetry)
                with telemetry.agent_pass("agent.gc") if task == "gc" else telemetry.NULL:
                    interval = getattr(self, f"_task_{task}")()
            except SeedanceError as exc:
                self.log(f"{task}-failed", "error", error=str(exc))
                interval = None
            except Exception as exc:  # one bad pass must not kill a resident service
                self.log(f"{task}-failed", "error", error=f"{type(exc).__name__}: {exc}")
                interval = None
            if task in self._due:
                self._due[task] = time.monotonic() + (interval or self._interval(task))

    def _interval(self, task: str) -> float:
        return {"gc": self.config.gc_interval, "sample": self.config.sample_interval,
                "scan": self.config.scan_interval, "status": 30.0, "probes": PROBE_POLL_S,
                "watchdog": self.notifier.watchdog_interval() or 10.0, "quota": QUOTA_POLL_S}[task]

    # -- tasks ---------------------------------------------------------------------------
    def _task_watchdog(self):
        self.notifier.watchdog()

    def _task_status(self):
        self.notifier.status(self._status_line())

    def _task_quota(self):
        """Keep WorkloadQuotaPolicies applied to labelled workloads as they come and go, and
        burst them on pressure (seedance.quota; `seedance quota watch` is the same loop)."""
        from ..quota.controller import QuotaController, QuotaStore

        if self._quota is None:
            store = QuotaStore(config_mod.config_dir(self.env) / "quota", config_mod.state_dir(self.env) / "quota")
            if not store.config_dir.is_dir() and not (store.state_dir / "state.json").exists():
                # no policy was ever applied here: look again at the next pass (two stats),
                # so a policy applied while the agent runs is honoured within a pass
                return QUOTA_POLL_S
            self._quota = QuotaController(store)
        for event in self._quota.tick():
            name = event["event"]
            if f"quota_{name}" in self.counters:
                self.counters[f"quota_{name}"] += 1
            self.log(f"quota-{name}", "info", **{k: v for k, v in event.items() if k != "event"})
        return QUOTA_POLL_S

    def _task_gc(self):
        if self.registry is None:
            if self.registry_factory is not None or self._registry_info.get("retry"):
                self._open_registry()
            if self.registry is None:
                return IDLE_SCAN_MAX_S / 4  # no registry yet: the first wrapped program makes it
        self.gc_pass()
        # An empty registry is re-read with backoff (gc-interval, doubling, up to
        # IDLE_SCAN_MAX_S): reading it touches one page per slot, and on a VM cold pages
        # make a pass cost real CPU, which, repeated every gc-interval, would keep an idle
        # agent busy (bench/bench_agent_churn.py measures its idle CPU).
        if self._registry_busy:
            self._idle_interval = self.config.gc_interval
            return None
        self._idle_interval = min(IDLE_SCAN_MAX_S, max(self._idle_interval, self.config.gc_interval) * 2)
        return self._idle_interval

    def gc_pass(self) -> None:
        self._gc_count += 1
        instances = self.registry.scan()
        self._registry_busy = bool(instances)
        view = []
        for inst in instances:
            key = (inst.pid, inst.start_time)
            if inst.alive:
                if key not in self._known_live:
                    self.state.instance_seen(inst.pid, inst.start_time, inst.slot, inst.exe)
                    self._known_live.add(key)
                view.append(inst.to_dict())
                continue
            if self._wrapper_reports(inst, key):
                continue
            self._end_instance(inst)
            self._known_live.discard(key)
            self._deferred.pop(key, None)
        with self._lock:
            self._instances = view
            self._registry_info = {"state": "open", "path": str(self.registry.path),
                                   "free_slots": self.registry.free_slots(),
                                   "slots": getattr(self.registry, "slots", None)}
            self.counters["gc_passes"] += 1

    def _wrapper_reports(self, inst, key) -> bool:
        """Leave a dead instance to its live `seedance run` (it reports and reclaims it next),
        for at most WRAPPER_GRACE_S, so a leak is reported once, by one of the two."""
        if not hasattr(self.registry, "wrapper_alive") or not self.registry.wrapper_alive(inst):
            return False
        first = self._deferred.setdefault(key, time.monotonic())
        return time.monotonic() - first < WRAPPER_GRACE_S

    def _end_instance(self, inst) -> None:
        allocations = self.registry.outstanding(inst)
        leaked = sum(a.size for a in allocations)
        findings = self._leak_findings(inst, allocations) if leaked else []
        first = self.state.instance_ended(inst.pid, inst.start_time, inst.slot, inst.exe, leaked, findings)
        if first:
            with self._lock:
                self.counters["instances_ended"] += 1
                if leaked:
                    self.counters["leaks_reported"] += 1
                    self.counters["leaked_bytes"] += leaked
            if leaked:
                telemetry.event("seedance.leak", {"seedance.leak.pid": inst.pid, "seedance.leak.bytes": leaked,
                                                  "process.executable.path": inst.exe})
                self.log("leak", "warning", pid=inst.pid, start_time=inst.start_time, slot=inst.slot,
                         exe=inst.exe, bytes=leaked, allocations=len(allocations),
                         devices=sorted({a.device for a in allocations}),
                         findings=[f.to_dict() for f in findings])
            else:
                self.log("instance-ended", "debug", pid=inst.pid, slot=inst.slot, exe=inst.exe)
        # The kill -9 window the restart test exercises: reported and committed, not reclaimed.
        crash_point("before-reclaim")
        outcome = self.registry.reclaim(inst)
        if outcome in ("reclaimed", "gone"):  # gone: its wrapper reclaimed it meanwhile
            self.state.instance_reclaimed(inst.pid, inst.start_time)
        if outcome == "reclaimed":
            with self._lock:
                self.counters["slots_reclaimed"] += 1

    def _leak_findings(self, inst, allocations) -> list[Finding]:
        """The handle-leak findings, through the rule engine like every other finding."""
        facts = self.registry.leak_facts(inst) if hasattr(self.registry, "leak_facts") else leak_facts(inst, allocations)
        findings = self.rules.evaluate(facts)
        if not findings:
            self.log("leak-no-rule", "warning", pid=inst.pid,
                     message="no rule matched the instance_leak fact; the leak is recorded without a finding")
        return findings

    def _task_sample(self):
        samples = self.sampler.sample()
        facts = affinity_facts(samples, affinity=self._affinity_of)
        findings = self.rules.evaluate(facts)
        self.state.replace_findings("nvml", findings)
        with self._lock:
            self._devices = [s.to_dict() for s in samples]
            self.counters["nvml_samples"] += 1
        for finding in findings:
            self.log("finding", "warning", origin="nvml", finding=finding.to_dict())

    def _affinity_of(self, pid: int):
        from .gpu import process_affinity
        remapped = {i["pid"] for i in self._instances if i.get("remapped")}
        return process_affinity(pid, remapped)

    def _task_scan(self):
        if self._scan_child is not None:
            if self._scan_child.ready():
                self._collect_scan()
                return None
            if self._scan_child.expired():
                child, self._scan_child = self._scan_child, None
                child.kill()
                self._scan_failed(f"the check did not finish within {child.timeout:g}s and was stopped")
                return None
            return 5.0  # still running: look again soon
        self._start_scan()
        return 5.0

    def _start_scan(self) -> None:
        from .scanchild import ScanChild

        # A spawned child with an address-space cap and a deadline (agent/service/scanchild.py).
        self._scan_child = ScanChild(run_periodic_check, (self.config.rules_dir, list(self.config.scan_paths)))
        self._scan_started = time.time()
        with self._lock:
            self._scan_info = {**self._scan_info, "state": "running", "started": self._scan_started}

    def _scan_failed(self, error: str) -> None:
        with self._lock:
            self.counters["scan_errors"] += 1
            self._scan_info = {**self._scan_info, "state": "failed", "error": error}
        self.log("scan-failed", "error", error=error)
        telemetry.record_pass("agent.scan", getattr(self, "_scan_started", time.time()), error=error)
        self._due["scan"] = time.monotonic() + self.config.scan_interval

    def _collect_scan(self) -> None:
        child, self._scan_child = self._scan_child, None
        try:
            report = child.result()
        except Exception as exc:
            self._scan_failed(str(exc))
            return
        stack = report.pop("gpu_stack", None)
        findings = [Finding(**{k: f[k] for k in ("rule", "severity", "trap", "layer", "subject", "message",
                                                 "evidence", "fix")}) for f in report.get("findings", [])]
        self.state.replace_findings("scan", findings)
        self.state.save_report("scan", report)
        with self._lock:
            self.counters["scans"] += 1
            self._scan_info = {"state": "done", "at": time.time(), "findings": len(findings),
                               "duration_s": report.get("stats", {}).get("duration_s")}
            if stack is not None:
                self._gpu_stack = stack
        self.log("scan", findings=len(findings), duration_s=report.get("stats", {}).get("duration_s"))
        telemetry.record_pass("agent.scan", self._scan_started, report=report)
        self._due["scan"] = time.monotonic() + self.config.scan_interval

    def _task_probes(self):
        events, lost, findings = self.probes.poll()
        # A wrapped instance's leak is the registry GC's to report (exactly once, with the
        # shim's exact records); the probes' handle-leak covers processes the shim did not wrap.
        findings = [f for f in findings if not (f.rule == "handle-leak" and self._wrapped(f))]
        if findings:
            for finding in self.state.add_findings("probes", findings):
                self.log("finding", "warning", origin="probes", finding=finding.to_dict())
        with self._lock:
            self.counters["probe_events"] += events
            self.counters["probe_events_lost"] = lost

    # -- reload --------------------------------------------------------------------------
    def reload(self) -> dict:
        """SIGHUP: re-read agent.yaml and the rules; a bad file keeps what is running."""
        self.notifier.reloading()
        changes: dict = {}
        try:
            new_config = config_mod.load_config(self.config_path, self.flags, self.env)
            if new_config.metrics:
                from .metrics import MetricsServer

                MetricsServer(new_config.metrics, self.snapshot)  # validates; started below
            new_rules = load_rules(new_config.rules_dir)
        except Exception as exc:  # noqa: BLE001 - whatever is wrong with the file, keep running
            error = str(exc) if isinstance(exc, SeedanceError) else f"{type(exc).__name__}: {exc}"
            self.log("reload-failed", "error", error=error, message="kept the running config and rules")
            self.notifier.ready(self._status_line())
            return {"reloaded": False, "error": error}
        old = self.config
        for key, value in new_config.to_dict().items():
            if old.to_dict().get(key) != value:
                changes[key] = {"from": old.to_dict().get(key), "to": value}
        self.config, self.rules = new_config, new_rules
        try:
            self._apply_outputs(old)
            if old.probes != new_config.probes:
                self._apply_probes()
        except Exception as exc:  # noqa: BLE001 - e.g. the new port is taken: say so, keep running
            error = str(exc) if isinstance(exc, SeedanceError) else f"{type(exc).__name__}: {exc}"
            self.log("reload-partial", "error", error=error)
        if not new_config.scan:
            self._due.pop("scan", None)
        elif "scan" not in self._due or old.scan_interval != new_config.scan_interval:
            self._due["scan"] = time.monotonic() + new_config.scan_interval
        for task in ("gc", "sample"):
            if task in self._due:
                self._due[task] = time.monotonic()
        with self._lock:
            self.counters["reloads"] += 1
        self.log("reloaded", changes=changes, rules=len(new_rules))
        self.notifier.ready(self._status_line())
        return {"reloaded": True, "changes": changes, "rules": len(new_rules)}

    # -- parts ---------------------------------------------------------------------------
    def _open_registry(self) -> None:
        factory = self.registry_factory
        if factory is None:
            from .registry import open_registry as factory
        try:
            self.registry = factory(self.env)
        except NotAvailable as exc:
            self.registry = None
            # The shim creates the registry on first use: keep looking every pass.
            self._registry_info = {"state": "unavailable", "reason": str(exc), "retry": True}
            return
        self._registry_info = {"state": "open", "path": str(self.registry.path)}

    def _apply_outputs(self, old) -> None:
        from .metrics import MetricsServer

        if old is None or old.metrics != self.config.metrics:
            if self.metrics is not None:
                self.metrics.stop()
                self.metrics = None
            if self.config.metrics:
                server = MetricsServer(self.config.metrics, self.snapshot)
                server.start()
                self.metrics = server
        if old is None or old.otlp_endpoint != self.config.otlp_endpoint:
            if self.otlp is not None:
                self.otlp.stop()
                self.otlp = None
            if self.config.otlp_endpoint:
                from .otlp import OtlpExporter

                exporter = OtlpExporter(self.config.otlp_endpoint, self.snapshot,
                                        interval=float(self.env.get("SEEDANCE_OTLP_INTERVAL", "30")),
                                        version=__version__)
                exporter.start()
                self.otlp = exporter

    def _apply_probes(self) -> None:
        mode = self.config.probes
        self._detach_probes()
        if mode == "off":
            self._probes_info = {"state": "off"}
            return
        from .probes import AgentProbes

        probes = AgentProbes(self.rules, log=self.log)
        reason = probes.unavailable_reason()
        if reason:
            self._probes_info = {"state": "unavailable", "reason": reason}
            if mode == "on":
                raise NotAvailable(f"--probes on: {reason}")
            self.log("probes-unavailable", "notice", reason=reason)
            return
        try:
            probes.attach()
        except NotAvailable as exc:
            self._probes_info = {"state": "unavailable", "reason": str(exc)}
            if mode == "on":
                raise NotAvailable(f"--probes on: {exc}") from None
            self.log("probes-unavailable", "notice", reason=str(exc))
            return
        self.probes = probes
        self._probes_info = {"state": "attached", **probes.describe()}
        self.log("probes-attached", **probes.describe())
        if hasattr(self, "_due"):
            self._due["probes"] = time.monotonic()

    def _wrapped(self, finding) -> bool:
        library = str(finding.evidence.get("library", ""))
        # allocations made through the shim belong to a registry instance, even when its
        # slot is already gone (its `seedance run` reported and reclaimed it)
        return os.path.basename(library).startswith("libseedance_shim") or \
            self._is_instance(finding.subject.get("pid"))

    def _is_instance(self, pid) -> bool:
        if not isinstance(pid, int):
            return False
        if any(i["pid"] == pid for i in self._instances):
            return True
        if self.registry is not None and any(i.pid == pid for i in self.registry.scan()):
            return True
        return self.state is not None and self.state.has_pid(pid)

    def _detach_probes(self) -> None:
        if self.probes is not None:
            status = self.probes.detach()
            self.probes = None
            self._due.pop("probes", None) if hasattr(self, "_due") else None
            self._probes_info = {"state": "detached"}
            if status == "detaching":
                self.log("probes-detach-slow", "warning", message="the probe child did not exit within 12s of "
                         "SIGTERM+SIGKILL (the kernel is still tearing down its uprobes); it exits on its own")
            else:
                self.log("probes-detached", status=status)

    def _start_nvml(self) -> None:
        sampler = NvmlSampler()
        if sampler.start():
            self.sampler = sampler
            self._nvml_info = {"state": "sampling"}
        else:
            self._nvml_info = {"state": "unavailable", "reason": sampler.reason}

    def _refused(self, pid: int, uid: int) -> None:
        with self._lock:
            self.counters["status_refused"] += 1
        self.log("status-refused", "warning", peer_pid=pid, peer_uid=uid)

    # -- what the socket, metrics and OTLP read ------------------------------------------
    def handle_request(self, message: dict) -> dict:
        op = message.get("op", "status")
        if op == "ping":
            return {"pong": True, "pid": os.getpid()}
        if op == "status":
            return self.snapshot(full=True)
        if op == "reload":
            # Reload runs on the loop thread: deliver it as the SIGHUP it stands for.
            os.kill(os.getpid(), signal.SIGHUP)
            return {"reload": "requested"}
        return {"error": f"unknown op {op!r}"}

    def snapshot(self, full: bool = False) -> dict:
        with self._lock:
            snap = {
                "schema": STATUS_SCHEMA,
                "agent": {"pid": os.getpid(), "version": __version__, "host": socket.gethostname(),
                          "started": self.started, "uptime_s": round(time.time() - self.started, 1),
                          "config": self.config.to_dict(), "config_file": str(self.config_path),
                          "state_db": str(self.state.path) if self.state else None,
                          "state_moved_aside": str(self.state.moved_aside) if self.state and self.state.moved_aside else None,
                          "socket": str(self.api.path) if self.api else None,
                          "metrics": self.metrics.address if self.metrics else None,
                          "otlp": self.otlp.endpoint if self.otlp else None,
                          "rules": len(self.rules) if self.rules else 0,
                          "probes": dict(self._probes_info), "nvml": dict(self._nvml_info)},
                "registry": dict(self._registry_info),
                "instances": list(self._instances),
                "devices": list(self._devices),
                "counters": dict(self.counters),
                "scan": dict(self._scan_info),
                "gpu_stack": dict(self._gpu_stack) if self._gpu_stack else None,
            }
        if self.state is not None:
            snap["finding_counts"] = [list(row) for row in self.state.finding_counts()]
            if full:
                snap["leaks"] = [leak.__dict__ for leak in self.state.leaks()]
                snap["findings"] = self.state.findings()
                snap["history"] = self.state.counts()
        return snap

    def _status_line(self) -> str:
        with self._lock:
            live = len(self._instances)
            return (f"{live} instance(s) live, {self.counters['leaks_reported']} leak(s) reported, "
                    f"{self.counters['slots_reclaimed']} slot(s) reclaimed; probes {self._probes_info.get('state')}")


CRASH_ENV = "SEEDANCE_AGENT_CRASH_AT"


def crash_point(step: str) -> None:
    """Die here, without cleanup, when the restart tests ask for this step (kill -9 window)."""
    if os.environ.get(CRASH_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


def leak_facts(inst, allocations) -> list[Fact]:
    """instance_leak facts (the shape seedance.run.report gives them) from plain allocations:
    one per (device, calling library), for registries that are not the shim's own."""
    grouped: dict[tuple, dict] = {}
    for alloc in allocations:
        entry = grouped.setdefault((alloc.device, alloc.library or "?"), {"bytes": 0, "allocations": 0, "apis": set()})
        entry["bytes"] += alloc.size
        entry["allocations"] += 1
        entry["apis"].add(alloc.api)
    return [Fact("instance_leak", {"pid": inst.pid, "exe": inst.exe},
                 {"pid": inst.pid, "exe": inst.exe, "bytes": held["bytes"], "device": device, "library": library,
                  "allocations": held["allocations"], "api": ",".join(sorted(held["apis"])), "exit": "killed"},
                 source="agent.gc")
            for (device, library), held in sorted(grouped.items(), key=lambda kv: (kv[0][0], kv[0][1]))]


def run_periodic_check(rules_dir: str | None, paths: list | None = None) -> dict:
    """Runs in a spawned child: the check's Python API (the host, or paths), as a report dict."""
    try:
        os.nice(10)  # a periodic check must never compete with the GPU jobs it watches
    except OSError:
        pass
    from ..collect.check_cache import run_cached
    from ..collect.options import CheckOptions

    # paths that did not change since the last period are answered from the check cache
    # (collect/check_cache.py: every input stat'ed again); the host scope is never cached
    report = run_cached(CheckOptions(targets=list(paths or []), rules_dir=rules_dir)).to_dict()
    from ..telemetry.stack import gpu_stack

    # the info metric of this host's GPU software stack (seedance_gpu_stack_info), made here
    # in the niced, capped child like the check it goes with
    report["gpu_stack"] = gpu_stack(list(paths or []), (report.get("host", {}).get("gpu") or {}).get("driver_version"))
    return report


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
