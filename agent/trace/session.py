"""One eBPF tracing session: compile once, attach, stream events, detach cleanly.

The session owns the kernel side: the BPF module, the PID filter, the uprobes of each
libcuda/libcudart inode as it appears, the launched command, signals and the lost-event
count.  What events mean is facts.py's business; how they are shown is the command's.

Launched commands are gated: the child blocks on a pipe until its PID is in the filter,
then execs; while it runs, the link-map probe stops it (SIGSTOP) whenever new objects
appear, and the session sends SIGCONT once the probes of any new CUDA library are
attached.  So no allocation happens before its probe exists.  Processes given by --pid
are never stopped: a library they map later is probed as soon as it is seen.
"""
from __future__ import annotations

import ctypes
import os
import signal
import time
from dataclasses import dataclass, field

from ..model.errors import BadInput, NotAvailable
from . import env
from .events import TraceEvent, decode
from .facts import FileInfoCache

API_NAMES = {
    "SD_API_DLOPEN": "dlopen", "SD_API_DLMOPEN": "dlmopen",
    "SD_API_CU_MEM_ALLOC": "cuMemAlloc_v2", "SD_API_CU_MEM_ALLOC_ASYNC": "cuMemAllocAsync",
    "SD_API_CU_MEM_ALLOC_MANAGED": "cuMemAllocManaged",
    "SD_API_CU_MEM_ALLOC_FROM_POOL_ASYNC": "cuMemAllocFromPoolAsync",
    "SD_API_CU_MEM_FREE": "cuMemFree_v2", "SD_API_CU_MEM_FREE_ASYNC": "cuMemFreeAsync",
    "SD_API_CUDA_MALLOC": "cudaMalloc", "SD_API_CUDA_MALLOC_MANAGED": "cudaMallocManaged",
    "SD_API_CUDA_MALLOC_ASYNC": "cudaMallocAsync", "SD_API_CUDA_FREE": "cudaFree",
    "SD_API_CUDA_FREE_ASYNC": "cudaFreeAsync",
}
DRAIN_S = 1.0  # after the launched command exits: wait this long at most for its exit event
RESCAN_S = 5.0  # how often live processes are re-read for deleted/replaced libraries


class EbpfUnavailable(NotAvailable):
    """eBPF cannot run here; the message is the one-line reason."""


@dataclass
class TraceSummary:
    backend: str = "ebpf"
    events: int = 0
    lost: int = 0
    untracked: int = 0  # allocations the kernel map had no room for (not in leak reports)
    stop_reason: str = ""
    command_status: int | None = None
    probes: list = field(default_factory=list)
    cuda_libraries: list = field(default_factory=list)  # {path, inode, kind, symbols}
    compile_s: float = 0.0
    elapsed_s: float = 0.0
    continued: int = 0  # times a gated process was stopped and continued

    def to_dict(self) -> dict:
        return {"backend": self.backend, "events": self.events, "lost_events": self.lost,
                "untracked_allocations": self.untracked,
                "stop_reason": self.stop_reason, "command_status": self.command_status,
                "probes": self.probes, "cuda_libraries": self.cuda_libraries,
                "compile_s": round(self.compile_s, 3), "elapsed_s": round(self.elapsed_s, 3),
                "gate_stops": self.continued}


class TraceSession:
    """``run(on_event)`` traces until the target ends, the duration passes or a signal."""

    def __init__(self, pids=(), command=None, duration=None, on_notice=None, files=None,
                 on_tick=None, cuda_events=True, buffer_pages=256, child_stdout=None):
        self.pids = [int(p) for p in pids]
        # a descriptor to give the launched command as its stdout (2 when the JSON stream
        # owns ours: the program must never write into it)
        self.child_stdout = child_stdout
        self.command = list(command or [])
        self.duration = duration
        self.on_notice = on_notice or (lambda text: None)
        self.on_tick = on_tick  # called about every RESCAN_S with the live pids we know of
        self.files = files or FileInfoCache()
        self.cuda_events = cuda_events  # stream each allocation, or only account for them
        self.buffer_pages = buffer_pages  # ring buffer size in pages (a power of two)
        self.progress = None  # seedance.render.progress.wanted(): the 3-5 s compile shows on a terminal
        self.summary = TraceSummary()
        self._bpf = None
        self._stop_reason = ""
        self._error = None
        self._attached_inodes: dict = {}
        self._to_continue: set = set()
        self._pending_cuda: list = []
        self._child = None
        self._exited: set = set()
        self._live_targets: set = set()

    # --- the run --------------------------------------------------------------------
    def check(self) -> None:
        """Raise EbpfUnavailable with the reason when eBPF cannot run here."""
        problem = env.ebpf_problem()
        if problem:
            raise EbpfUnavailable(problem)

    def run(self, on_event) -> TraceSummary:
        """Trace, calling ``on_event(TraceEvent)`` for each event in kernel order."""
        self.check()
        for pid in self.pids:
            if not os.path.exists(f"/proc/{pid}"):
                raise BadInput(f"pid {pid}: no such process")
        env.apply_headers_override()
        from ..probes import layout, loader

        self._loader, self._layout = loader, layout
        from ..render.progress import Step

        started = time.monotonic()
        try:
            host = loader.find_host_loader()
            with Step("compiling the eBPF probes (bcc)", enabled=self.progress):
                self._bpf = loader.compile_program(host, filter_pids=bool(self.pids or self.command),
                                                  cuda_events=self.cuda_events, ringbuf_pages=self.buffer_pages)
        except loader.ProbeError as exc:
            raise EbpfUnavailable(str(exc)) from None
        self.summary.compile_s = time.monotonic() - started
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            try:
                self.summary.probes = loader.attach_loader(self._bpf, host)
            except loader.ProbeError as exc:
                raise EbpfUnavailable(str(exc)) from None
            names = layout.names("SD_EV_")
            apis = {value: API_NAMES.get(name, name) for name, value in layout.constants().items()
                    if name.startswith("SD_API_")}
            self._apis = apis
            struct = layout.event_struct()

            def callback(_ctx, data, _size):
                if self._error is not None:
                    return
                try:
                    raw = ctypes.cast(data, ctypes.POINTER(struct)).contents
                    self._handle(decode(raw, names, apis), on_event)
                except BaseException as exc:  # a ctypes callback must not raise
                    self._error = exc

            self._bpf["events"].open_ring_buffer(callback)
            self._start_targets()
            what = (f"pid {' '.join(map(str, self.pids))}" if self.pids else
                    f"pid {self._child} ({self.command[0]})" if self.command else "every process")
            self.on_notice(f"{len(self._bpf.uprobe_fds)} probes attached "
                           f"(compiled in {self.summary.compile_s:.1f}s); tracing {what}")
            self._loop(on_event, started)
            self._settle_exits(on_event)
        finally:
            self._teardown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.summary.elapsed_s = time.monotonic() - started
            self.summary.stop_reason = self._stop_reason
        return self.summary

    def _start_targets(self) -> None:
        one = ctypes.c_uint8(1)
        for pid in self.pids:
            self._bpf["traced"][ctypes.c_uint32(pid)] = one
            self._live_targets.add(pid)
            self._attach_mapped_cuda(pid)
        if not self.pids and not self.command:
            for name in os.listdir("/proc"):
                if name.isdigit():
                    self._attach_mapped_cuda(int(name))
        if self.command:
            self._launch()

    def _launch(self) -> None:
        # The child waits on a pipe until its PID is in the filter, so its exec and every
        # library of the new image are seen.  A bare fork: subprocess.Popen waits for the
        # exec itself and would deadlock with a child waiting for us.
        read_end, write_end = os.pipe()
        status_read, status_write = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:  # child
            try:
                os.close(write_end)
                os.close(status_read)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.read(read_end, 1)
                os.close(read_end)
                if self.child_stdout is not None:
                    os.dup2(self.child_stdout, 1)
                os.execvp(self.command[0], self.command)
            except OSError as exc:
                os.write(status_write, (exc.strerror or str(exc)).encode())
            finally:
                os._exit(127)
        os.close(read_end)
        os.close(status_write)
        self._child = pid
        one = ctypes.c_uint8(1)
        key = ctypes.c_uint32(pid)
        self._bpf["traced"][key] = one
        self._bpf["gated"][key] = one
        self._live_targets.add(pid)
        os.write(write_end, b"g")
        os.close(write_end)
        failure = os.read(status_read, 512)  # EOF when the exec succeeded (close-on-exec)
        os.close(status_read)
        if failure:
            os.waitpid(pid, 0)
            self._child = None
            raise BadInput(f"{self.command[0]}: cannot run: {failure.decode(errors='replace').lower()}")

    def _child_status(self):
        """The launched command's exit status once it has ended, else None."""
        try:
            pid, status = os.waitpid(self._child, os.WNOHANG)
        except ChildProcessError:
            return self.summary.command_status if self.summary.command_status is not None else -1
        if pid == 0:
            return None
        return os.waitstatus_to_exitcode(status)

    def _loop(self, on_event, started: float) -> None:
        deadline = started + self.duration if self.duration else None
        drain_until = None
        next_scan = time.monotonic() + RESCAN_S
        while True:
            self._bpf.ring_buffer_poll(100)
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            self._after_batch()
            self._count_lost()
            now = time.monotonic()
            if self._stop_reason:
                return
            if deadline and now >= deadline:
                self._stop_reason = f"duration {self.duration:g}s elapsed"
                return
            if self._child is not None and self.summary.command_status is None:
                status = self._child_status()
                if status is not None:
                    self.summary.command_status = status
                    drain_until = now + DRAIN_S
            if drain_until is not None and (self._child in self._exited or now >= drain_until):
                self._bpf.ring_buffer_consume()
                self._after_batch()
                self._stop_reason = f"command exited with status {self.summary.command_status}"
                return
            if self.pids and not self.command and not any(
                    os.path.exists(f"/proc/{pid}") for pid in self._live_targets - self._exited):
                self._stop_reason = "all traced processes exited"
                return
            if self.on_tick and now >= next_scan:
                next_scan = now + RESCAN_S
                self.on_tick()

    def _settle_exits(self, on_event) -> None:
        """A process whose exit event was lost (full ring buffer) still ends: read what is
        left in the buffer, then report the exit of every traced process that is gone
        without one, with what the kernel's map says it still held."""
        self._bpf.ring_buffer_consume()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        candidates = set(self._live_targets)
        try:
            candidates |= {key.tgid for key in self._bpf["live_allocs"].keys()}
        except Exception:
            pass
        for pid in sorted(candidates - self._exited):
            if pid == self._child and self.summary.command_status is None:
                continue  # still running (a --duration stop)
            if pid != self._child and os.path.exists(f"/proc/{pid}"):
                continue
            self._handle(TraceEvent("exit", pid, data={"exit_event_lost": True}), on_event)

    def _on_signal(self, signum, _frame) -> None:
        self._stop_reason = f"{signal.Signals(signum).name} received: probes detached"

    # --- events ----------------------------------------------------------------------
    def _handle(self, event: TraceEvent, on_event) -> None:
        self.summary.events += 1
        if event.kind == "object":
            self._note_object(event)
        elif event.kind == "exit":
            self._exited.add(event.pid)
        if event.kind in ("exit", "exec"):
            # what the old image still holds, from the kernel's own account; the map is
            # only walked when the probe counted live allocations (or the count is unknown)
            count = event.data.pop("held_count", None)
            event.data["held"] = (self._loader.held_allocations(self._bpf, event.pid, self._apis)
                                  if count is None or count > 0 else [])
        on_event(event)

    def _note_object(self, event: TraceEvent) -> None:
        path = event.data.get("path") or ""
        if event.stopped:
            self._to_continue.add(event.pid)
        if not path.startswith("/"):
            return
        info = self.files.get(path, event.pid)
        event.data["inode"] = info.inode
        event.data["soname"] = info.soname
        kind = self._loader.cuda_kind(path, info.soname)
        if kind:
            self._pending_cuda.append((path, event.pid, kind, info))

    def _after_batch(self) -> None:
        """Attach the probes of CUDA libraries seen in this batch, then let stopped
        processes go on.  Continue even if an attach failed: never leave one stopped."""
        pending, self._pending_cuda = self._pending_cuda, []
        try:
            for path, pid, kind, info in pending:
                self._attach_cuda(path, pid, kind, info)
        finally:
            self._continue_stopped()

    def _continue_stopped(self) -> None:
        for pid in list(self._to_continue):
            self._to_continue.discard(pid)
            try:
                os.kill(pid, signal.SIGCONT)
                self.summary.continued += 1
            except ProcessLookupError:
                pass

    def _attach_mapped_cuda(self, pid: int) -> None:
        try:
            with open(f"/proc/{pid}/maps") as maps:
                paths = {line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6}
        except OSError:
            return
        for path in sorted(paths):
            path = path.removesuffix(" (deleted)")
            if not path.startswith("/"):
                continue
            kind = self._loader.cuda_kind(path)
            if kind:
                self._attach_cuda(path, pid, kind, self.files.get(path, pid))

    def _attach_cuda(self, path: str, pid: int, kind: str, info) -> None:
        if info.inode is None:
            return
        key = (info.dev, info.inode)
        if key in self._attached_inodes:
            return  # uprobes live on the inode: a second path to the same file is covered
        # attach through the path the process sees, so a container's copy is the one probed
        target = f"/proc/{pid}/root{path}" if os.path.exists(f"/proc/{pid}/root{path}") else path
        try:
            symbols = self._loader.attach_cuda(self._bpf, target, kind)
        except self._loader.ProbeError as exc:
            self._attached_inodes[key] = []
            self.on_notice(f"cannot probe {path}: {exc}")
            return
        self._attached_inodes[key] = symbols
        self.summary.cuda_libraries.append({"path": path, "inode": info.inode, "kind": kind,
                                            "symbols": symbols})
        self.on_notice(f"probing {kind} {path} (inode {info.inode}): {', '.join(symbols)}")

    def _count_lost(self) -> None:
        try:
            total = int(self._bpf["lost"].sum(0).value)
            untracked = int(self._bpf["untracked_allocs"].sum(0).value)
        except Exception:
            return
        if untracked > self.summary.untracked:
            self.on_notice(f"{untracked - self.summary.untracked} allocations not tracked (allocation map full)")
            self.summary.untracked = untracked
        if total > self.summary.lost:
            self.on_notice(f"lost {total - self.summary.lost} events (ring buffer full)")
            self.summary.lost = total

    # --- teardown --------------------------------------------------------------------
    def _teardown(self) -> None:
        if self._bpf is not None:
            try:
                self._count_lost()
            except Exception:
                pass
            try:
                self._bpf.cleanup()  # detaches every uprobe and tracepoint
            except Exception as exc:
                self.on_notice(f"detach: {exc}")
            self._bpf = None
        # a gated process must never stay stopped because we went away
        self._continue_stopped()
        if self._child is not None and self.summary.command_status is None:
            try:
                os.kill(self._child, signal.SIGCONT)
            except ProcessLookupError:
                pass
