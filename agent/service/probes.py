"""The trace probes as the agent runs them: `seedance trace --json` host-wide, as a child.

Why a child process and not TraceSession in a thread: bcc compiles the probes with LLVM,
which peaks at well over a hundred MB in whatever process does it (the probes give most
of it back right after: probes/loader.py release_compiler_memory), and TraceSession owns its own
loop and signal handlers (main thread only).  A child keeps the agent small, lets the
probes' own SIGTERM handling detach every uprobe, and a crash in it costs the agent
nothing: the agent notices, logs it, and starts it again on the next poll.

The probes need root (or CAP_BPF+CAP_PERFMON), bcc and kernel headers; seedance.trace.env
says which is missing in one line, and the agent logs that instead of attaching.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

from ..model.errors import NotAvailable
from ..model.report import Finding

_FINDING_BYTES = b'{"event": "finding"'
RESTART_BACKOFF_S = 30.0


class AgentProbes:
    def __init__(self, rules=None, log=None):
        self.rules = rules
        self.log = log or (lambda *a, **k: None)
        self._proc: subprocess.Popen | None = None
        self._queue: queue.Queue = queue.Queue()
        self._events = 0
        self._lost = 0
        self._threads: list[threading.Thread] = []
        self._started = 0.0
        self._next_start = 0.0
        self.restarts = 0
        self.attached_note = ""
        self.last_exit: int | None = None

    # -- availability ----------------------------------------------------------------------
    def unavailable_reason(self) -> str:
        """Asked in a child too: importing bcc maps libbcc (LLVM) into the asker for good."""
        code = ("import sys\n"
                "try:\n    from seedance.trace import env\n"
                "except ImportError:\n    print('the trace probes (seedance.trace) are not installed'); sys.exit()\n"
                "print(env.ebpf_problem() or '')\n")
        try:
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return "checking for eBPF took longer than 60s"
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            return f"checking for eBPF failed: {last}"
        return proc.stdout.strip()

    # -- lifecycle -------------------------------------------------------------------------
    def attach(self, timeout: float = 180.0) -> None:
        """Start the probe child and wait until it says its probes are attached.

        bcc compiles for seconds (9 s on a busy 2-core host), and READY=1 must mean the
        probes really watch: the agent's readiness waits for the child's "probes attached".
        """
        self._spawn()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                kind, value = self._queue.get(timeout=0.5)
            except queue.Empty:
                if self._proc.poll() is not None:
                    break
                continue
            if kind == "notice" and "probes attached" in value:
                self.attached_note = value
                self.log("probes-notice", "info", text=value)
                return
            self._queue.put((kind, value)) if kind != "notice" else self.log("probes-notice", "info", text=value)
        status = self._proc.poll()
        self.detach()
        raise NotAvailable(f"the trace probes did not attach within {timeout:g}s"
                           if status is None else f"the trace probes exited with status {status} before attaching")

    def _spawn(self) -> None:
        command = [sys.executable, "-m", "seedance", "trace", "--json"]
        self._proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, bufsize=0,
                                      start_new_session=True)  # a Ctrl-C at the agent's tty is ours to relay
        self._started = time.monotonic()
        self._threads = [threading.Thread(target=self._read_stdout, args=(self._proc,), daemon=True),
                         threading.Thread(target=self._read_stderr, args=(self._proc,), daemon=True)]
        for thread in self._threads:
            thread.start()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def describe(self) -> dict:
        return {"pid": self.pid, "backend": "ebpf", "command": "seedance trace --json",
                "restarts": self.restarts, "attached": self.attached_note}

    def poll(self) -> tuple[int, int, list[Finding]]:
        """(new events, lost events so far, new findings) since the last poll."""
        findings = []
        events = 0
        while True:
            try:
                kind, value = self._queue.get_nowait()
            except queue.Empty:
                break
            if kind == "events":
                events += value
            elif kind == "finding":
                if value is not None:
                    findings.append(value)
            elif kind == "lost":
                self._lost += value
            elif kind == "notice":
                self.log("probes-notice", "info", text=value)
        if self._proc is not None and self._proc.poll() is not None:
            self.last_exit = self._proc.returncode
            self.log("probes-exited", "error", status=self.last_exit,
                     message="the trace probes stopped; restarting them")
            self._proc = None
            self._next_start = time.monotonic() + RESTART_BACKOFF_S
        if self._proc is None and self._next_start and time.monotonic() >= self._next_start:
            self._next_start = 0.0
            self.restarts += 1
            self._spawn()
        return events, self._lost, findings

    def detach(self, grace: float = 8.0, after_kill: float = 4.0) -> int | str | None:
        """SIGTERM: `seedance trace` detaches every probe and exits; SIGKILL if it takes too long.

        Bounded, because a stop must fit in the unit's TimeoutStopSec: tearing down many
        uprobes waits on RCU grace periods in the kernel, and a child stuck there (state D)
        cannot even die at once.  It is left to finish on its own ("detaching" is
        returned); its probes go with it when it exits.
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                try:
                    proc.wait(timeout=after_kill)
                except subprocess.TimeoutExpired:
                    return "detaching"
        for thread in self._threads:
            thread.join(timeout=2)
        self._log_last_notices()  # the child's closing summary: events, lost, why it stopped
        return proc.returncode

    def _log_last_notices(self) -> None:
        while True:
            try:
                kind, value = self._queue.get_nowait()
            except queue.Empty:
                return
            if kind == "notice":
                self.log("probes-notice", "info", text=value)

    # -- readers ---------------------------------------------------------------------------
    def _read_stdout(self, proc) -> None:
        # Host-wide tracing streams every dlopen, mapped object, exec and exit on the host:
        # read in large blocks and only count newlines, parsing just the finding lines, so
        # the agent's share of a busy host's event stream stays small.
        fd = proc.stdout.fileno()
        rest = b""
        while True:
            try:
                block = os.read(fd, 1 << 16)
            except OSError:
                break
            if not block:
                break
            data = rest + block
            cut = data.rfind(b"\n") + 1
            complete, rest = data[:cut], data[cut:]
            lines = complete.count(b"\n")
            if _FINDING_BYTES in complete:
                for line in complete.split(b"\n"):
                    if line.startswith(_FINDING_BYTES):
                        lines -= 1
                        self._queue.put(("finding", _finding(line)))
            if lines:
                self._queue.put(("events", lines))

    def _read_stderr(self, proc) -> None:
        for raw in proc.stderr:
            text = raw.decode("utf-8", "replace").rstrip()
            if not text:
                continue
            if "lost " in text and "events (ring buffer full)" in text:
                try:
                    self._queue.put(("lost", int(text.split("lost ", 1)[1].split()[0])))
                    continue
                except ValueError:
                    pass
            self._queue.put(("notice", text.removeprefix("seedance trace: ")))


def _finding(line: bytes) -> Finding | None:
    try:
        data = json.loads(line)
        return Finding(**{k: data[k] for k in ("rule", "severity", "trap", "layer", "subject", "message",
                                                "evidence", "fix")})
    except (ValueError, KeyError, TypeError):
        return None


def probe_child_rss(pid: int | None) -> int:
    """Resident bytes of the probe child (the bench reports it beside the agent's own)."""
    if not pid:
        return 0
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
