"""Starting the program of `seedance run` under the shim, and what stops it from being wrapped.

The program runs unchanged under LD_PRELOAD=libseedance_shim.so (and LD_AUDIT with
--audit).  The command is found as execvp finds it and refused as env(1) refuses it (127
not found, 126 cannot be run); a program ld.so will never preload into (set-user-ID,
statically linked) is said to run unwrapped.  The exit code is the program's (128+N when
killed by signal N).  Notes for the user go through the caller's ``notice``: this module
never prints.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..model.errors import BadInput, NotAvailable, SeedanceError
from .preload import unsafe_reason

# programs whose job is to start the real workload: without --follow-children it escapes
LAUNCHERS = {"sh", "bash", "dash", "zsh", "env", "torchrun", "mpirun", "mpiexec", "srun", "xargs", "nohup"}


def check_preload_path(path: Path) -> None:
    """Never preload a library that someone else could replace (file or any parent)."""
    why = unsafe_reason(str(path), owners=(0, os.geteuid()))
    if why:
        raise BadInput(f"refusing to preload {path}: {why}, "
                       f"so another user could replace what every wrapped program loads")


def setuid_note(exe: str | None) -> str:
    if not exe:
        return ""
    try:
        st = os.stat(exe)
    except OSError:
        return ""
    if st.st_mode & (stat.S_ISUID | stat.S_ISGID):
        return (f"{exe} is set-user/group-ID: glibc ignores LD_PRELOAD and LD_AUDIT for it "
                f"(secure-execution mode), so it runs unwrapped")
    return ""


PT_INTERP = 3


def static_note(exe: str | None, depth: int = 0) -> str:
    """Why LD_PRELOAD can never reach EXE: an ELF without a program interpreter (static,
    static-pie) never runs ld.so, which is what reads LD_PRELOAD, so calling it wrapped
    would be a lie.  A #! script is judged by its interpreter."""
    if not exe:
        return ""
    try:
        with open(exe, "rb") as f:
            head = f.read(64)
            if head[:2] == b"#!" and depth == 0:
                words = (head + f.read(192)).split(b"\n", 1)[0][2:].split()
                if not words:
                    return ""
                interp = os.fsdecode(words[0])
                if os.path.basename(interp) == "env" and len(words) > 1:
                    interp = shutil.which(os.fsdecode(words[1])) or ""
                note = static_note(interp, depth + 1)
                return f"its interpreter {note}" if note else ""
            if head[:4] != b"\x7fELF" or len(head) < 64:
                return ""
            end = "<" if head[5] == 1 else ">"
            if head[4] == 2:   # ELFCLASS64
                phoff, = struct.unpack_from(end + "Q", head, 0x20)
                phentsize, phnum = struct.unpack_from(end + "HH", head, 0x36)
            else:
                phoff, = struct.unpack_from(end + "I", head, 0x1C)
                phentsize, phnum = struct.unpack_from(end + "HH", head, 0x2A)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return ""
    types = [struct.unpack_from(end + "I", table, i * phentsize)[0] for i in range(len(table) // max(phentsize, 1))]
    if PT_INTERP in types:
        return ""
    return (f"{exe} is statically linked (no program interpreter): ld.so never runs for it, so "
            f"LD_PRELOAD cannot load the shim and it runs unwrapped")


# env(1), timeout(1) and POSIX shells: 127 when the command is not found, 126 when it is found
# but cannot be executed (coreutils env.c: EXIT_ENOENT / EXIT_CANNOT_INVOKE)
EXIT_NOT_FOUND = 127
EXIT_CANNOT_INVOKE = 126


class CommandNotRun(BadInput):
    """The command could not be started: one line, and the exit code env(1) gives.  The CLI
    prints the text of an error whose code is not 2 after "seedance: " alone, so the text
    carries "error: run: " itself: the line is the launcher's, word for word."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def find_command(name: str, path: str | None = None) -> str:
    """The file execvp() would execute for ``name``, or CommandNotRun as env(1) reports it.

    As glibc's execvp (posix/execvpe.c): a name with a slash is used as it is; otherwise each
    PATH entry (an empty one is the current directory) is tried in order, a file that exists
    but cannot be executed (EACCES: no execute bit, a directory) is skipped, and when nothing
    is executable the search fails with EACCES if such a file was met, else ENOENT."""
    def executable(candidate: str):
        """None when it runs, else the errno execve would give."""
        try:
            st = os.stat(candidate)
        except FileNotFoundError:
            return "ENOENT"
        except NotADirectoryError:
            return "ENOENT"
        except OSError:
            return "EACCES"
        if stat.S_ISDIR(st.st_mode):
            return "EISDIR"
        return None if os.access(candidate, os.X_OK) and stat.S_ISREG(st.st_mode) else "EACCES"

    if "/" in name:
        why = executable(name)
        if why is None:
            return name
        if why == "ENOENT":
            raise CommandNotRun(f"error: run: {name}: no such file or directory", EXIT_NOT_FOUND)
        detail = "is a directory" if why == "EISDIR" else "not executable"
        raise CommandNotRun(f"error: run: {name}: permission denied ({detail})", EXIT_CANNOT_INVOKE)
    if not name:
        raise CommandNotRun("error: run: '': command not found", EXIT_NOT_FOUND)
    search = os.environ.get("PATH", os.defpath) if path is None else path
    denied = None
    for directory in search.split(":"):
        candidate = os.path.join(directory or ".", name)
        why = executable(candidate)
        if why is None:
            return candidate
        if why != "ENOENT" and denied is None:
            denied = (candidate, why)
    if denied is not None:
        detail = "is a directory" if denied[1] == "EISDIR" else "not executable"
        raise CommandNotRun(f"error: run: {name}: permission denied ({denied[0]} {detail})", EXIT_CANNOT_INVOKE)
    raise CommandNotRun(f"error: run: {name}: command not found", EXIT_NOT_FOUND)


def spawn(cmd: list, exe: str, **popen_args) -> subprocess.Popen:
    """Start ``exe`` with argv ``cmd``; a file the kernel cannot execute (ENOEXEC: no #! line,
    not ELF) runs as a /bin/sh script, as execvp does (posix/execvpe.c maybe_script_execute),
    and so as env(1) and the shells run it.  CommandNotRun with env's exit code otherwise."""
    import errno

    try:
        return subprocess.Popen(cmd, executable=exe, **popen_args)  # argv[0] as given, as execvp
    except OSError as exc:
        if exc.errno == errno.ENOEXEC:
            try:
                return subprocess.Popen(["/bin/sh", exe, *cmd[1:]], **popen_args)
            except OSError as again:
                exc = again
        reason = (exc.strerror or str(exc)).lower()
        if exc.errno == errno.ENOENT:  # e.g. the #! interpreter does not exist
            raise CommandNotRun(f"error: run: {cmd[0]}: {reason}", EXIT_NOT_FOUND) from None
        raise CommandNotRun(f"error: run: {cmd[0]}: {reason}", EXIT_CANNOT_INVOKE) from None




def exit_status(returncode: int) -> tuple:
    """(exit code, signal) of a Popen return code: a program killed by signal N exits
    128+N, as the shells report it."""
    return (returncode if returncode >= 0 else 128 - returncode), (-returncode if returncode < 0 else None)


def wait_forwarding_signals(child: subprocess.Popen) -> int:
    """Wait for CHILD.  Ctrl-C reaches the program from the terminal (same process group):
    seedance only waits for it to finish and report; SIGTERM/SIGHUP sent to seedance are
    passed on."""
    forwarded = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN)}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        forwarded[sig] = signal.signal(sig, lambda s, f: child.send_signal(s))
    try:
        return child.wait()
    finally:
        for sig, old in forwarded.items():
            signal.signal(sig, old)


@dataclass
class RunRequest:
    """What `seedance run` was asked to do, its flags checked and its outputs prepared."""
    cmd: list
    exe: str                                  # find_command(cmd[0])
    affinity: str | None = None
    mem_limit: str | None = None
    strict: bool = False
    audit: bool = False
    follow_children: bool = False
    handles: str | None = None                # None: shim.yaml's default, else shared
    labels: list = field(default_factory=list)
    plugin: str | None = None
    events: str | None = None                 # the --events name, for the report
    events_out: object = None                 # its prepared OutputTarget
    program_stdout: int | None = None         # 2 while a stream owns seedance's stdout


def preload_library():
    """The shim library, refused unless it is of this version and only root or this user
    could replace it."""
    from .. import shim

    library = shim.library_path()
    shim.binding()  # refuses a library of another version, with the fix
    check_preload_path(library)
    return library


def unwrapped_reason(request: RunRequest, env: dict, notice: Callable[[str], None]) -> str:
    """Why the program will run unwrapped, or ''; each reason is said as it is found."""
    why = ""
    if not request.follow_children and Path(request.exe).name in LAUNCHERS:
        notice(f"seedance: note: {Path(request.exe).name} starts other programs, which run unwrapped "
               f"without --follow-children")
    for note in (setuid_note(request.exe), static_note(request.exe)):
        if note:
            notice(f"seedance: {note}")
            why = note
            break
    if env.get("SEEDANCE_DISABLE") == "1":
        why = "SEEDANCE_DISABLE=1 is set in the environment: the shim passes every call through"
        if request.mem_limit or request.affinity:
            why += ", so --mem-limit and --affinity are NOT enforced"
        notice(f"seedance: note: {why}")
    return why


def default_handles(env: dict) -> str:
    """The --handles default: what `seedance fix handle-leak` stored in shim.yaml, else shared.
    Without a shim.yaml no YAML parser is imported: every run would pay its start-up."""
    from ..service.config import config_dir

    if (config_dir(env) / "shim.yaml").exists():
        from ..fix.handle_leak import shim_handles_default
        return shim_handles_default(env)
    return "shared"


def join_quota(labels: dict, notice: Callable[[str], None]):
    """Place this process in the cgroup of the first stored quota policy selecting the
    labels, before the program starts: it inherits the cgroup at fork, so the quota holds
    from its first instruction.  None when no policy matches; a policy that cannot be
    enforced here is said, never silently dropped."""
    from ..quota.controller import QuotaController, QuotaStore

    controller = QuotaController(QuotaStore())
    try:
        return controller.join(labels)
    except SeedanceError as exc:
        notice(f"seedance: note: quota not applied: {exc}")
        return None


def run_program(request: RunRequest, notice: Callable[[str], None]):
    """Run the program under the shim to its end; read, judge and give back its registry
    slots.  Returns (RunResult, Report).  Traced (seedance.telemetry): one span from the
    wrap to the exit, whose context the program gets in TRACEPARENT/TRACESTATE, with the
    shim's events (cuInit, refused allocations) and the leaks as its events."""
    from .. import telemetry

    with telemetry.span("run.program", {"process.executable.path": request.exe,
                                        "process.executable.name": os.path.basename(request.exe)}) as span:
        result, report = _run_program(request, notice, span)
        span.set("process.exit.code", result.exit_code)
        telemetry.note_report(report)
        telemetry.leak_events(span, report)
    return result, report


def _run_program(request: RunRequest, notice: Callable[[str], None], span):
    from .. import shim, telemetry
    from ..shim.binding import expected_version
    from ..shim.wrap import wrap_env
    from .events import start_drain, start_record
    from .finish import judge_and_release
    from .limits import check_affinity_devices, parse_mem_limit, resolve_affinity
    from .report import RunResult

    cmd = request.cmd
    library = preload_library()
    env = dict(os.environ)
    result = RunResult(argv=cmd, exit_code=0, signal=None, wrapped=True, shim=str(library),
                       shim_version=expected_version(), audit=request.audit,
                       follow_children=request.follow_children)
    why = unwrapped_reason(request, env, notice)
    if why:
        result.wrapped, result.why_unwrapped = False, why

    affinity_value = mem_value = None
    if request.affinity:
        affinity_value, result.affinity = resolve_affinity(request.affinity)
        if request.affinity != "auto":  # auto picks among the devices the driver has
            warning = check_affinity_devices(request.affinity, request.strict)
            if warning:
                notice(warning)
    if request.mem_limit:
        mem_value, result.mem_limit = parse_mem_limit(request.mem_limit)
    handles = request.handles if request.handles is not None else default_handles(env)
    result.handles = handles
    # traced, the shim records its events too: they become events of the run's span
    env, group_key = wrap_env(env, audit=request.audit, events=request.events_out is not None or telemetry.active(),
                              follow_children=request.follow_children, affinity=affinity_value,
                              mem_limit=mem_value, handles=handles)

    quota = None
    if request.labels or request.plugin:
        from ..quota.policy import format_labels, parse_labels
        labels = {}
        if request.plugin:
            from ..profile.calls_report import load_plugin_manifest
            labels.update(load_plugin_manifest(request.plugin).labels)
        labels.update(parse_labels(request.labels))
        if labels:
            env["SEEDANCE_LABELS"] = format_labels(labels)
            quota = join_quota(labels, notice)

    registry = None
    try:
        registry = shim.Registry.open()
    except NotAvailable:
        pass
    env = telemetry.child_env(env)  # TRACEPARENT: the program's spans continue this run's trace
    with contextlib.ExitStack() as stack:
        drain = None
        if request.events_out is not None or telemetry.active():
            stream = None
            if request.events_out is not None:
                stream = stack.enter_context(request.events_out.open_stream())
                stream.write(json.dumps(start_record(cmd)) + "\n")
            drain = start_drain(registry, group_key, telemetry.shim_events(span, stream))

        started = time.monotonic()
        try:
            child = spawn(cmd, request.exe, env=env, stdout=request.program_stdout)
        except CommandNotRun:
            if quota is not None:
                quota.release()
            raise
        span.set("process.pid", child.pid)
        if quota is not None:
            stack.callback(quota.release)
            quota.record(child.pid)
        rc = wait_forwarding_signals(child)
        result.wall_s = time.monotonic() - started
        result.exit_code, result.signal = exit_status(rc)

        if drain:
            drain.finish()
            if request.events_out is not None:
                result.events_file, result.events_written = request.events, drain.written
            registry = registry or getattr(drain, "registry", None)
    report = judge_and_release(registry, group_key, result, request.affinity, notice)
    return result, report
