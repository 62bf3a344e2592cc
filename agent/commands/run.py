"""seedance run: wrap a command with the CUDA shim (affinity, quotas, per-instance handles).

The program runs unchanged under LD_PRELOAD=libseedance_shim.so (and LD_AUDIT with
--audit).  seedance and the program never share a descriptor: notes go to stderr, the
report to -o/--report-json FILE, events to --events FILE; when either goes to stdout
(`-`), the program's stdout goes to stderr, so `seedance run -o - -- prog | jq` always
reads one clean document.  The exit code is the program's (128+N when killed by signal N).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..model.errors import BadInput, NotAvailable, SeedanceError, UsageError
from ..run.preload import unsafe_reason

EXAMPLES = """\
examples:
  seedance run --affinity gpu:1 -- python train.py          only physical GPU 1, seen as device 0
  seedance run --affinity GPU-5eedface -- ./infer           by UUID prefix (MIG-... too)
  seedance run --affinity auto --mem-limit 8G -- python serve.py
  seedance run --mem-limit 8G,1:4G --report-json run.json -- ./bench
  seedance run --events ev.jsonl --audit -- python -c 'import torch'
  seedance run -o - --mem-limit 1G -- ./app | jq .stats      the report on stdout; the app's stdout on stderr
  SEEDANCE_DISABLE=1 seedance run -- ./app                  shim loaded but bypassed (said on stderr)
"""

# programs whose job is to start the real workload: without --follow-children it escapes
LAUNCHERS = {"sh", "bash", "dash", "zsh", "env", "torchrun", "mpirun", "mpiexec", "srun", "xargs", "nohup"}

SIZE_RE = re.compile(r"^(\d+)\s*([KMGTkmgt]?)(i?[Bb])?$")


def configure_parser(sub):
    parser = sub.add_parser(
        "run", help="Wrap a command with the CUDA shim (affinity, quotas, per-instance handles)",
        description=__doc__.split("\n\n")[0], epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--affinity", metavar="DEV",
                        help="devices the program may see: gpu:N, N, npuN, GPU-<uuid>, MIG-<uuid>, "
                             "a comma list of those, or auto (least-loaded device)")
    parser.add_argument("--mem-limit", metavar="SIZE",
                        help="device memory quota: 8G for every device, 1:4G for device 1, or both (8G,1:4G)")
    parser.add_argument("--events", metavar="FILE",
                        help="write the shim's events as JSON lines (- for stdout: the program's stdout "
                             "then goes to stderr)")
    parser.add_argument("-o", "--report-json", metavar="FILE", dest="report_json",
                        help="write the run report (seedance.report/v1) to FILE; - for stdout once the "
                             "program has ended (the program's stdout then goes to stderr)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite an output file that is not empty and not a seedance output")
    parser.add_argument("--audit", action="store_true",
                        help="also load the shim as LD_AUDIT: record library searches, loads and CUDA bindings")
    parser.add_argument("--follow-children", action="store_true",
                        help="wrap the programs it starts too (default: they run unwrapped)")
    parser.add_argument("--handles", choices=("per-instance", "shared"),
                        help="per-instance: the process gets a CUDA context of its own instead of the "
                             "device's shared primary context (default: what `seedance fix handle-leak` "
                             "set in ~/.config/seedance/shim.yaml, else shared)")
    parser.add_argument("--label", action="append", metavar="KEY=VALUE",
                        help="label the workload (repeat or comma-separate); a matching `seedance quota` "
                             "policy limits it from its first instruction")
    parser.add_argument("--strict", action="store_true",
                        help="refuse (exit 2) an --affinity device the driver does not have, instead of a warning")
    parser.add_argument("--plugin", metavar="NAME",
                        help="the program hosts this installed plugin: its manifest's labels label the workload")
    # the end of a run started by seedance-run, the C launcher (shim/src/launcher.c)
    parser.add_argument("--finish-group", metavar="KEY", help=argparse.SUPPRESS)
    parser.add_argument("--exit-code", type=int, help=argparse.SUPPRESS)
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS")
    parser.set_defaults(execute=execute)
    return parser


def parse_size(text: str) -> int:
    m = SIZE_RE.match(text.strip())
    if not m:
        raise UsageError(f"seedance run: --mem-limit: {text!r} is not a size (e.g. 8G, 512M)")
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    value = int(m.group(1)) * mult
    if value <= 0:
        raise UsageError(f"seedance run: --mem-limit: {text!r} must be more than 0")
    return value


def parse_mem_limit(text: str) -> tuple[str, dict]:
    """'8G,1:4G' -> ('8589934592,1:4294967296', {'default': ..., 'per_device': {...}})"""
    default, per_device, parts = None, {}, []
    for item in filter(None, (s.strip() for s in text.split(","))):
        if ":" in item:
            dev, size = item.split(":", 1)
            if not dev.strip().isdigit() or int(dev) >= 16:
                raise UsageError(f"seedance run: --mem-limit: {item!r}: the device must be 0..15")
            per_device[int(dev)] = parse_size(size)
            parts.append(f"{int(dev)}:{per_device[int(dev)]}")
        else:
            if default is not None:
                raise UsageError("seedance run: --mem-limit: give one default size at most")
            default = parse_size(item)
            parts.insert(0, str(default))
    if default is None and not per_device:
        raise UsageError("seedance run: --mem-limit needs a size")
    return ",".join(parts), {"default_bytes": default, "per_device_bytes": per_device}


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
    static-pie) never runs ld.so, which is what reads LD_PRELOAD (issue 10: a static
    binary was reported wrapped).  A #! script is judged by its interpreter."""
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


def resolve_affinity(spec: str) -> tuple[str, dict]:
    """The SEEDANCE_AFFINITY value for the shim, and what the report says about it."""
    info = {"requested": spec}
    if spec == "auto":
        value, why = pick_least_loaded()
        info.update(resolved=value, how=why)
        return value, info
    items = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        low = item.lower()
        if low.startswith("gpu:"):
            item = item[4:]
        elif low.startswith("npu") and item[3:].isdigit():
            item = item[3:]
        if item.isdigit():
            uuid = nvml_uuid(int(item))
            items.append(uuid or item)
        elif low.startswith(("gpu-", "mig-")):
            items.append(item)
        else:
            raise UsageError(f"seedance run: --affinity: {item!r} is not gpu:N, N, npuN, GPU-<uuid>, MIG-<uuid> or auto")
    value = ",".join(items)
    info.update(resolved=value, how="NVML index -> UUID" if value != spec and "GPU-" in value
                else "CUDA ordinals (CUDA_DEVICE_ORDER=%s)" % os.environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST"))
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        info["cuda_visible_devices"] = os.environ["CUDA_VISIBLE_DEVICES"]
    return value, info


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


def check_affinity_devices(spec: str, strict: bool) -> str:
    """The warning for device indices in ``spec`` (gpu:N, N, npuN) this host does not have;
    '' when all exist.  Under --strict a missing device is refused (exit 2).  The count is
    NVML's (gpu:N is the NVML index), else the CUDA driver's; with neither answering it
    cannot be known, and the warning says so (refused by --strict only when known)."""
    indices = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        low = item.lower()
        digits = item[4:] if low.startswith("gpu:") else item[3:] if low.startswith("npu") else item
        if digits.isdigit():
            indices.append((item, int(digits)))
    if not indices:
        return ""
    count, source = device_count()
    if count is None:
        return (f"seedance: warning: --affinity {spec}: cannot check that device "
                f"{', '.join(str(i) for _item, i in indices)} exists: {source}")
    absent = [item for item, index in indices if index >= count]
    if not absent:
        return ""
    text = (f"--affinity {spec}: no device {', '.join(absent)} on this host ({source} reports "
            f"{count} device{'s' if count != 1 else ''}): the program would see none")
    if strict:
        raise UsageError(f"seedance run: {text}")
    return f"seedance: warning: {text}"


def device_count() -> tuple:
    """(number of devices, who said so) or (None, why nobody can): NVML first, as gpu:N
    names NVML indices, then the CUDA driver (cuDeviceGetCount after cuInit)."""
    nvml, why = _nvml()
    if nvml:
        try:
            return int(nvml.nvmlDeviceGetCount()), "NVML"
        except Exception as exc:  # noqa: BLE001 - a driver that answers init but not this
            why = f"NVML unavailable ({exc})"
    import ctypes
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None, f"{why}, and there is no CUDA driver (libcuda.so.1 does not load)"
    n = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(n)) != 0:
        return None, f"{why}, and the CUDA driver does not answer (cuInit failed)"
    return n.value, "the CUDA driver"


def _nvml():
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml, ""
    except Exception as exc:  # pynvml missing, or no libnvidia-ml / no driver
        return None, f"NVML unavailable ({' '.join(str(exc).split()) or type(exc).__name__})"


def nvml_uuid(index: int) -> str | None:
    """gpu:N means NVML/nvidia-smi index N; its UUID makes it independent of CUDA's order."""
    nvml, _ = _nvml()
    if not nvml:
        return None
    try:
        uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))
        return uuid.decode() if isinstance(uuid, bytes) else uuid
    except Exception:
        return None


def pick_least_loaded() -> tuple[str, str]:
    nvml, why = _nvml()
    if nvml:
        best = None
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            used = nvml.nvmlDeviceGetMemoryInfo(h).used
            try:
                util = nvml.nvmlDeviceGetUtilizationRates(h).gpu
            except Exception:
                util = 0
            key = (util, used, i)
            if best is None or key < best[0]:
                uuid = nvml.nvmlDeviceGetUUID(h)
                best = (key, uuid.decode() if isinstance(uuid, bytes) else uuid)
        if best:
            return best[1], f"NVML: least utilised, then least memory used (util {best[0][0]}%, {best[0][1]} bytes)"
    count = driver_device_count()
    if not count:
        raise NotAvailable(f"seedance run: --affinity auto: {why}, and no CUDA driver answers either")
    load = {d: 0 for d in range(count)}
    try:
        from ..shim import Registry
        reg = Registry.open()
        for inst in reg.instances():
            if inst.alive and inst.state == "live":
                for d, held in inst.current.items():
                    if d in load:
                        load[d] += held
        reg.close()
    except Exception:
        pass
    device = min(load, key=lambda d: (load[d], d))
    return str(device), f"{why}; chose the device with the least memory held by live seedance instances ({load[device]} bytes of {count} devices)"


def driver_device_count() -> int:
    import ctypes
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        n = ctypes.c_int(0)
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(n)) != 0:
            return 0
        return n.value
    except OSError:
        return 0


class EventDrain:
    """Drains the event rings of this run's instances into a JSONL file, off the hot path."""

    def __init__(self, registry, group_key: int, out, interval: float = 0.05):
        self.registry, self.group_key, self.interval = registry, group_key, interval
        self.out = out            # an open text stream (OutputTarget.open_stream); closed by its owner
        self.written = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def slots(self):
        group = self.registry.find_group(self.group_key)
        return self.registry.slots_of_group(group.index) if group else []

    def drain(self):
        for slot in self.slots():
            for event in self.registry.drain_events(slot):
                if event.get("ev") in ("alloc", "free"):
                    self.device_record(event)
                self.out.write(json.dumps(event) + "\n")
                self.written += 1
        self.out.flush()

    def device_record(self, event: dict) -> None:
        """Before a device's first alloc/free: its {"ev":"device"} record (docs/profile.md)."""
        devices = self.__dict__.setdefault("devices", None)
        if devices is None:
            from ..profile.devices import DriverDevices
            devices = self.devices = DriverDevices()
        if event["dev"] >= 0 and event["dev"] not in devices.known:
            self.out.write(json.dumps(devices.record(event["dev"], event.get("addr"))) + "\n")
            self.written += 1

    def loop(self):
        while not self.stop.wait(self.interval):
            try:
                self.drain()
            except Exception:
                pass

    def finish(self):
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()
        self.drain()


def prepare_outputs(args):
    """Check every output path before any work (seedance.render.output: never destroys a file)."""
    from ..render.output import prepare_output

    report = prepare_output(args.report_json, force=args.force, what="report") if args.report_json else None
    events = prepare_output(args.events, force=args.force, what="event stream") if args.events else None
    return report, events


def _join_quota(labels: dict):
    """Place this process in the cgroup of the first stored quota policy selecting the
    labels, before the program starts: it inherits the cgroup at fork, so the quota holds
    from its first instruction.  None when no policy matches; a policy that cannot be
    enforced here is said on stderr, never silently dropped."""
    from ..quota.controller import QuotaController, QuotaStore

    controller = QuotaController(QuotaStore())
    try:
        return controller.join(labels)
    except SeedanceError as exc:
        print(f"seedance: note: quota not applied: {exc}", file=sys.stderr)
        return None


def execute(args) -> int:
    from .. import shim
    from ..run.report import RunResult
    from ..shim.binding import expected_version
    from ..shim.wrap import wrap_env

    if args.finish_group:
        return finish_group(args)
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("seedance run: give the command after --, e.g. seedance run -- python train.py")
    exe = find_command(cmd[0])
    report_out, events_out = prepare_outputs(args)
    # a stream on stdout: the program's stdout goes to stderr, never into the stream
    stream_on_stdout = any(t is not None and t.is_stdout for t in (report_out, events_out))

    library = shim.library_path()
    shim.binding()  # refuses a library of another version, with the fix
    check_preload_path(library)
    env = dict(os.environ)
    result = RunResult(argv=cmd, exit_code=0, signal=None, wrapped=True, shim=str(library),
                       shim_version=expected_version(), audit=args.audit, follow_children=args.follow_children)
    if not args.follow_children and Path(exe).name in LAUNCHERS:
        print(f"seedance: note: {Path(exe).name} starts other programs, which run unwrapped "
              f"without --follow-children", file=sys.stderr)
    for note in (setuid_note(exe), static_note(exe)):
        if note:
            print(f"seedance: {note}", file=sys.stderr)
            result.wrapped, result.why_unwrapped = False, note
            break
    if env.get("SEEDANCE_DISABLE") == "1":
        why = "SEEDANCE_DISABLE=1 is set in the environment: the shim passes every call through"
        if args.mem_limit or args.affinity:
            why += ", so --mem-limit and --affinity are NOT enforced"
        print(f"seedance: note: {why}", file=sys.stderr)
        result.wrapped, result.why_unwrapped = False, why

    affinity_value = mem_value = None
    if args.affinity:
        affinity_value, result.affinity = resolve_affinity(args.affinity)
        if args.affinity != "auto":  # auto picks among the devices the driver has
            warning = check_affinity_devices(args.affinity, args.strict)
            if warning:
                print(warning, file=sys.stderr)
    if args.mem_limit:
        mem_value, result.mem_limit = parse_mem_limit(args.mem_limit)
    if args.handles is None:
        from ..service.config import config_dir

        # the default lives in shim.yaml (`seedance fix handle-leak`); without one, no YAML
        # parser is imported (issue 13: start-up time)
        if (config_dir(env) / "shim.yaml").exists():
            from ..fix.handle_leak import shim_handles_default
            args.handles = shim_handles_default(env)
        else:
            args.handles = "shared"
    result.handles = args.handles
    env, group_key = wrap_env(env, audit=args.audit, events=bool(args.events),
                              follow_children=args.follow_children, affinity=affinity_value,
                              mem_limit=mem_value, handles=args.handles)

    quota = None
    if args.label or args.plugin:
        from ..quota.policy import format_labels, parse_labels
        labels = {}
        if args.plugin:
            from ..profile.calls_report import load_plugin_manifest
            labels.update(load_plugin_manifest(args.plugin).labels)
        labels.update(parse_labels(args.label))
        if labels:
            env["SEEDANCE_LABELS"] = format_labels(labels)
            quota = _join_quota(labels)

    registry = None
    try:
        registry = shim.Registry.open()
    except NotAvailable:
        pass
    with contextlib.ExitStack() as stack:
        drain = None
        if events_out is not None:
            stream = stack.enter_context(events_out.open_stream())
            # the first line names the stream, so a later --events to the same file knows it
            # t (CLOCK_MONOTONIC, the events' clock) beside wall (epoch): the anchor that
            # aligns power logs (nvidia-smi, DCGM; wall clock) with the launches (issue 14)
            stream.write(json.dumps({"schema": "seedance.run-events/v1", "kind": "start", "pid": os.getpid(),
                                     "argv": cmd, "t": time.monotonic(), "wall": time.time()}) + "\n")
            if registry is None:
                # the first wrapped process creates the registry: wait for it in the drain loop
                drain = _LateDrain(group_key, stream)
            else:
                drain = EventDrain(registry, group_key, stream)
            drain.thread.start()

        started = time.monotonic()
        try:
            child = spawn(cmd, exe, env=env, stdout=2 if stream_on_stdout else None)
        except CommandNotRun:
            if quota is not None:
                quota.release()
            raise
        if quota is not None:
            stack.callback(quota.release)
            quota.record(child.pid)
        # Ctrl-C reaches the program from the terminal (same process group): seedance only
        # waits for it to finish and report; SIGTERM/SIGHUP sent to seedance are passed on.
        forwarded = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN)}
        for sig in (signal.SIGTERM, signal.SIGHUP):
            forwarded[sig] = signal.signal(sig, lambda s, f: child.send_signal(s))
        try:
            rc = child.wait()
        finally:
            for sig, old in forwarded.items():
                signal.signal(sig, old)
        result.wall_s = time.monotonic() - started
        result.exit_code = rc if rc >= 0 else 128 - rc
        result.signal = -rc if rc < 0 else None

        if drain:
            drain.finish()
            result.events_file, result.events_written = args.events, drain.written
            registry = registry or getattr(drain, "registry", None)
    return report_and_release(registry, group_key, result, args.affinity, report_out)


def report_and_release(registry, group_key: int, result, affinity: str | None, report_out=None) -> int:
    """After the program: read this run's instances, say what needs saying on stderr,
    write the report, give the slots and the group back.  Returns the exit code."""
    from .. import shim
    from ..run.report import build_report, leaks_with_apis

    if registry is None:
        try:
            registry = shim.Registry.open()
        except NotAvailable:
            registry = None
    instances, leaks, group = [], {}, None
    if registry is not None:
        result.registry = str(registry.path)
        group = registry.find_group(group_key)
        if group:
            # only this run's slots, found in C; records are summed only for these
            instances = [i for i in map(registry.instance, registry.slots_of_group(group.index)) if i]
            leaks = {i.slot: leaks_with_apis(registry, i.slot) for i in instances if i.current}
    if affinity and any(i.visible == [] for i in instances):
        print(f"seedance: note: --affinity {affinity} named no device the driver has: "
              f"the program saw none", file=sys.stderr)
    if group and (group.overflow_total or group.overflow_refused):
        print(f"seedance: note: the registry was full: {group.overflow_total + group.overflow_refused} "
              f"process(es) of this run had no slot of their own; they shared the run's quota"
              + (f" ({group.overflow_refused} could not even join it: their quota'd allocations were refused)"
                 if group.overflow_refused else "") + ", and their allocations are not itemised in the report",
              file=sys.stderr)
    report = build_report(result, instances, leaks, group, _load_rules)
    for finding in report.sorted_findings():
        if finding.rule == "handle-leak":
            print(f"seedance: {finding.severity}: {finding.rule}: {finding.message}", file=sys.stderr)
    if report_out is not None:
        report_out.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    if registry is not None:
        for inst in instances:
            registry.reclaim(inst.slot)
        if group:
            registry.release_group(group.index)
    return result.exit_code


def finish_group(args) -> int:
    """`--finish-group KEY --exit-code N`: the end of a run that seedance-run (the C
    launcher, shim/src/launcher.c) started, when its instances ended holding memory:
    the handle-leak findings come from the rule engine, which is here."""
    from ..run.report import RunResult

    try:
        key = int(args.finish_group, 16)
    except ValueError:
        raise UsageError(f"run: --finish-group: {args.finish_group!r} is not a group key") from None
    code = args.exit_code if args.exit_code is not None else 0
    result = RunResult(argv=[], exit_code=code, signal=code - 128 if code > 128 else None, wrapped=True)
    return report_and_release(None, key, result, args.affinity)


def _load_rules():
    """The rule engine, loaded only when the run produced facts to judge (issue 13)."""
    from ..judge.engine import load_rules

    return load_rules()


class _LateDrain(EventDrain):
    """An EventDrain that opens the registry once the first wrapped process made it."""

    def __init__(self, group_key: int, out):
        self.registry = None
        self.group_key, self.interval = group_key, 0.05
        self.out = out
        self.written = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def drain(self):
        if self.registry is None:
            from ..shim import Registry
            try:
                self.registry = Registry.open()
            except NotAvailable:
                return
        super().drain()
