"""Join the probe programs into one BPF module, compile it once, attach it.

bcc compiles each BPF() text with clang, which costs seconds per module; every program
of a session therefore goes into one module (``program_text``), and filters are passed
as -D constants rather than spliced into the C.

Only this module imports bcc, and only inside functions, so ``seedance trace --help``
and the rest of seedance work on hosts without it.
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import PROBES_DIR

PROGRAMS = ("proc.bpf.c", "dlopen.bpf.c", "loader_errors.bpf.c", "linkmap.bpf.c", "cudamem.bpf.c")
_LOCAL_INCLUDE = re.compile(r'^#include\s+"([\w.]+)"\s*$', re.M)

# (symbol, handler) pairs; each also gets a return probe "<handler>_return" unless noted.
DRIVER_PROBES = (
    ("cuMemAlloc_v2", True), ("cuMemAllocAsync", True), ("cuMemAllocManaged", True),
    ("cuMemAllocFromPoolAsync", True), ("cuMemFree_v2", True), ("cuMemFreeAsync", True),
    ("cuCtxCreate_v2", True), ("cuCtxCreate_v3", True), ("cuCtxCreate_v4", True), ("cuDevicePrimaryCtxRetain", True),
    ("cuCtxSetCurrent", False), ("cuCtxPushCurrent_v2", False),
)
RUNTIME_PROBES = (
    ("cudaMalloc", True), ("cudaMallocManaged", True), ("cudaMallocAsync", True),
    ("cudaFree", True), ("cudaFreeAsync", True), ("cudaSetDevice", False),
)
# Symbols every libcuda/libcudart must have for its probes to mean anything.
REQUIRED = {"driver": "cuMemAlloc_v2", "runtime": "cudaMalloc"}


class ProbeError(Exception):
    """A probe could not be compiled or attached; the message is one line."""


@dataclass
class HostLoader:
    """Where this host's dynamic loader and libc live, and the ld.so offsets we need."""

    ldso: str
    libc: str
    dl_library: str  # the library exporting dlopen: libc.so.6 (glibc >= 2.34) or libdl.so.2
    glibc: tuple
    debug_state_offset: int
    r_debug_offset: int
    notes: list = field(default_factory=list)


def glibc_version() -> tuple:
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        text = ""
    match = re.search(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _mapped(substring: str) -> str | None:
    """The path of a library this very process maps (the system's ld.so and libc)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(None, 5)
            if len(parts) == 6 and substring in os.path.basename(parts[5].strip()):
                return os.path.realpath(parts[5].strip())
    return None


def _symbol_values(path: str, wanted: set) -> dict:
    from elftools.elf.elffile import ELFFile

    found = {}
    with open(path, "rb") as handle:
        elf = ELFFile(handle)
        for section_name in (".dynsym", ".symtab"):
            section = elf.get_section_by_name(section_name)
            if section is None:
                continue
            for symbol in section.iter_symbols():
                if symbol.name in wanted and symbol["st_value"] and symbol.name not in found:
                    found[symbol.name] = symbol["st_value"]
    return found


def find_host_loader() -> HostLoader:
    ldso = _mapped("ld-linux") or os.path.realpath("/lib64/ld-linux-x86-64.so.2")
    libc = _mapped("libc.so.6") or os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
    version = glibc_version()
    dl_library = libc
    if version < (2, 34):
        # before 2.34 dlopen lived in libdl.so.2
        dl_library = os.path.join(os.path.dirname(libc), "libdl.so.2")
    values = _symbol_values(ldso, {"_dl_debug_state", "_r_debug"})
    missing = {"_dl_debug_state", "_r_debug"} - set(values)
    if missing:
        raise ProbeError(f"{ldso}: no {', '.join(sorted(missing))} symbol; cannot walk the link map")
    return HostLoader(ldso=ldso, libc=libc, dl_library=dl_library, glibc=version,
                      debug_state_offset=values["_dl_debug_state"], r_debug_offset=values["_r_debug"])


def _inline(name: str, seen: set) -> str:
    """The program file with its local includes expanded once (what clang compiles)."""
    text = (PROBES_DIR / name).read_text()

    def expand(match):
        included = match.group(1)
        if included in seen:
            return f"/* {included}: already included */"
        seen.add(included)
        return _inline(included, seen)

    return _LOCAL_INCLUDE.sub(expand, text)


def program_text() -> str:
    """All programs as one C text: the single BPF module of a session."""
    seen: set = set()
    parts = []
    for name in PROGRAMS:
        seen.add(name)
        parts.append(f"/* ---- {name} ---- */\n" + _inline(name, seen))
    return "\n".join(parts)


def cflags(host: HostLoader, filter_pids: bool, ringbuf_pages: int = 256, cuda_events: bool = True) -> list:
    flags = [
        f"-DSD_FILTER_PIDS={1 if filter_pids else 0}",
        f"-DSD_CUDA_EVENTS={1 if cuda_events else 0}",
        f"-DSD_RINGBUF_PAGES={ringbuf_pages}",
        f"-DSD_LDSO_DEBUG_STATE_OFF={host.debug_state_offset:#x}ULL",
        f"-DSD_LDSO_R_DEBUG_OFF={host.r_debug_offset:#x}ULL",
    ]
    if _exit_has_group_dead():
        flags.append("-DSD_HAVE_GROUP_DEAD=1")
    return flags


def _exit_has_group_dead() -> bool:
    for root in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"):
        try:
            return "group_dead" in Path(root, "events/sched/sched_process_exit/format").read_text()
        except OSError:
            continue
    return False


def compile_program(host: HostLoader, filter_pids: bool, cuda_events: bool = True, ringbuf_pages: int = 256):
    """The compiled BPF module (bcc.BPF); its tracepoints attach as it loads."""
    import tempfile

    from bcc import BPF

    # clang and libbcc write diagnostics straight to fds 1 and 2: keep them off the event
    # stream, and on failure report the first real error in one line, not pages of output.
    with tempfile.TemporaryFile(mode="w+b") as captured:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        for fd in saved:
            os.dup2(captured.fileno(), fd)
        try:
            bpf = BPF(text=program_text(), cflags=cflags(host, filter_pids, ringbuf_pages=ringbuf_pages,
                                                         cuda_events=cuda_events))
            release_compiler_memory()
            return bpf
        except Exception as exc:  # bcc raises bare Exception on compile/load failure
            failure = exc
        finally:
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
        captured.seek(0)
        log = captured.read().decode("utf-8", "replace")
    reason = next((line.strip() for line in log.splitlines() if "error:" in line), "")
    if not reason:
        text = str(failure).strip()
        reason = text.splitlines()[0] if text else failure.__class__.__name__
    raise ProbeError(f"bcc could not compile or load the probes: {reason}")


def release_compiler_memory() -> None:
    """Give back what compiling left resident: most of the memory a compile leaves.

    clang and LLVM run inside this process (libbcc links libclang-cpp and libLLVM), and
    their code pages and freed heap stay resident long after the one compile they serve;
    in a long-lived tracer (the agent's probe child) that is most of its RSS.  malloc_trim
    returns the freed heap; MADV_PAGEOUT asks the kernel to reclaim the compiler's
    file-backed pages.  Both only drop pages that can be refaulted or were free, so later
    bcc calls (attaching probes as libraries appear) still work; errors are ignored: this
    is an optimisation, never a reason to fail.
    """
    import ctypes
    import re

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.malloc_trim(0)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        madv_pageout = 21  # Linux 5.4+; EINVAL on older kernels, which is fine
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                if len(fields) >= 6 and re.search(r"/lib(bcc|LLVM|clang)[^/]*\.so", fields[5]):
                    low, high = (int(x, 16) for x in fields[0].split("-"))
                    libc.madvise(low, high - low, madv_pageout)
    except (OSError, AttributeError, ValueError):
        pass


def _attach(bpf, path: str, symbol: str, handler: str, with_return: bool) -> None:
    bpf.attach_uprobe(name=path, sym=symbol, fn_name=handler)
    if with_return:
        bpf.attach_uretprobe(name=path, sym=symbol, fn_name=handler + "_return")


def attach_loader(bpf, host: HostLoader) -> list:
    """dlopen/dlmopen/dlsym in libc (or libdl), the error constructors and
    _dl_debug_state in ld.so.  Returns what was attached, as 'path:symbol'.

    Every uprobe's detach waits out an RCU grace period on 6.x kernels, one after another, so the
    set is kept to what the facts need: dlvsym (rare) is not probed."""
    plan = [
        (host.dl_library, "dlopen", "sd_dlopen", False),
        (host.dl_library, "dlmopen", "sd_dlmopen", False),
        (host.dl_library, "dlsym", "sd_dlsym", True),
        (host.ldso, "_dl_exception_create", "sd_exception_create", True),
        (host.ldso, "_dl_exception_create_format", "sd_exception_create", True),
        (host.ldso, "_dl_debug_state", "sd_debug_state", False),
    ]
    from bcc import BPF

    # the link-map walk continues itself through this tail-call slot
    bpf["walk_chunks"][0] = bpf.load_func("sd_walk_chunk", BPF.KPROBE)
    attached = []
    for path, symbol, handler, with_return in plan:
        try:
            _attach(bpf, path, symbol, handler, with_return)
        except Exception as exc:
            raise ProbeError(f"cannot attach a uprobe to {symbol} in {path}: {exc}") from None
        attached.append(f"{path}:{symbol}")
    # dlopen and dlmopen share one return handler
    for symbol in ("dlopen", "dlmopen"):
        try:
            bpf.attach_uretprobe(name=host.dl_library, sym=symbol, fn_name="sd_dlopen_return")
        except Exception as exc:
            raise ProbeError(f"cannot attach a return probe to {symbol} in {host.dl_library}: {exc}") from None
    return attached


def cuda_kind(path: str, soname: str | None = None) -> str | None:
    """'driver' for a libcuda.so*, 'runtime' for a libcudart.so*, else None."""
    for name in (soname or "", os.path.basename(path)):
        if name.startswith("libcudart.so"):
            return "runtime"
        if name.startswith("libcuda.so"):
            return "driver"
    return None


def attach_cuda(bpf, path: str, kind: str) -> list:
    """Attach the memory probes of one libcuda/libcudart file (the kernel keys uprobes
    by inode).  Returns the symbols attached; symbols a build lacks are skipped."""
    plan = DRIVER_PROBES if kind == "driver" else RUNTIME_PROBES
    attached = []
    for symbol, with_return in plan:
        try:
            _attach(bpf, path, symbol, f"sd_{symbol}", with_return)
        except Exception:
            if symbol == REQUIRED[kind]:
                raise ProbeError(f"{path}: cannot attach to {symbol}") from None
            continue
        attached.append(symbol)
    return attached


def held_allocations(bpf, pid: int, api_names: dict) -> list:
    """What ``pid`` still holds, from the kernel's live_allocs map; the entries are removed
    (the process is gone, and its pid may be reused)."""
    table = bpf["live_allocs"]
    held, keys = [], []
    for key, value in table.items():
        if key.tgid != pid:
            continue
        keys.append(key)
        held.append({"ptr": hex(key.ptr), "bytes": int(value.bytes), "device": int(value.device),
                     "caller": hex(value.caller), "api": api_names.get(value.api, str(value.api))})
    for key in keys:
        try:
            del table[key]
        except KeyError:
            pass
    return held


def detach_cuda(bpf, path: str, kind: str, symbols: list) -> None:
    plan = dict(DRIVER_PROBES if kind == "driver" else RUNTIME_PROBES)
    for symbol in symbols:
        try:
            bpf.detach_uprobe(name=path, sym=symbol)
            if plan.get(symbol):
                bpf.detach_uretprobe(name=path, sym=symbol)
        except Exception:
            pass
