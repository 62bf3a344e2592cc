"""Can eBPF run here?  Each check returns None or the one-line reason it cannot.

The order is the order a user fixes things in: the bcc module, privileges, kernel
lockdown, kernel headers (bcc compiles against them), tracefs (uprobe and tracepoint
events live there).  SEEDANCE_KERNEL_HEADERS points bcc at another header tree
(BCC_KERNEL_SOURCE); a path that does not exist makes eBPF unavailable, which is also
how the tests hide the headers to exercise the fallback.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path

HEADERS_ENV = "SEEDANCE_KERNEL_HEADERS"
TRACEFS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
# CAP_SYS_ADMIN (21), CAP_PERFMON (38), CAP_BPF (39)
_CAP_SYS_ADMIN, _CAP_PERFMON, _CAP_BPF = 21, 38, 39


# bcc's Python module comes with the distribution's bcc build (it drives libbcc through
# ctypes and must match it); PyPI's "bcc" is an unrelated project.  A venv sees it when made
# with --system-site-packages (make install links it into .venv instead).
BCC_INSTALL = ("install your distribution's bcc (Debian/Ubuntu: apt install python3-bpfcc; Fedora: "
               "dnf install python3-bcc) and use a Python that sees it (a venv made with "
               "--system-site-packages); PyPI's bcc is another project")


def bcc_problem() -> str | None:
    try:
        import bcc  # noqa: F401  (the distribution's python3-bpfcc / python3-bcc)
    except ImportError as exc:
        return f"bcc is not importable ({exc}): {BCC_INSTALL}"
    except OSError as exc:  # libbcc.so missing under the Python module
        return f"bcc cannot load libbcc ({exc})"
    return None


def _effective_caps() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def privilege_problem() -> str | None:
    caps = _effective_caps()
    has = lambda bit: bool(caps & (1 << bit))  # noqa: E731
    if has(_CAP_SYS_ADMIN) or (has(_CAP_BPF) and has(_CAP_PERFMON)):
        return None
    return f"not root (uid {os.geteuid()}): uprobes need CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN"


def lockdown_problem() -> str | None:
    try:
        text = Path("/sys/kernel/security/lockdown").read_text()
    except OSError:
        return None
    # "none [integrity] confidentiality": the bracketed mode is active.  Only
    # confidentiality forbids reading process memory from BPF (bpf_probe_read).
    if "[confidentiality]" in text:
        return "kernel lockdown is in confidentiality mode, which forbids eBPF reading process memory"
    return None


def headers_dir() -> Path:
    override = os.environ.get(HEADERS_ENV)
    if override:
        return Path(override)
    return Path("/lib/modules") / platform.release() / "build"


def headers_problem() -> str | None:
    directory = headers_dir()
    if (directory / "include").is_dir():
        return None
    if os.environ.get(HEADERS_ENV):
        return f"no kernel headers at {directory} ({HEADERS_ENV})"
    if Path("/sys/kernel/kheaders.tar.xz").exists():
        return None  # bcc unpacks the in-kernel headers (CONFIG_IKHEADERS) itself
    return (f"no kernel headers for {platform.release()} ({directory} is missing); "
            "run `make headers` as root, or install linux-headers-$(uname -r)")


def tracefs_root() -> str | None:
    for root in TRACEFS:
        if os.path.isdir(os.path.join(root, "events")):
            return root
    return None


def tracefs_problem(mount: bool = True) -> str | None:
    if tracefs_root():
        return None
    if mount and os.geteuid() == 0:
        # tracefs is a pseudo file system the kernel always has; mounting it changes no
        # state beyond making the event files visible, the same as bcc's own tools expect.
        import subprocess
        subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS[0]],
                       capture_output=True, check=False)
        if tracefs_root():
            return None
    return f"tracefs is not mounted at {TRACEFS[0]} (mount -t tracefs nodev {TRACEFS[0]})"


def ebpf_problem(mount_tracefs: bool = True) -> str | None:
    """None when eBPF tracing can be tried here, else the first reason it cannot."""
    for check in (bcc_problem, privilege_problem, lockdown_problem, headers_problem):
        problem = check()
        if problem:
            return problem
    return tracefs_problem(mount=mount_tracefs)


def apply_headers_override() -> None:
    """Point bcc at SEEDANCE_KERNEL_HEADERS (bcc reads BCC_KERNEL_SOURCE when it compiles)."""
    override = os.environ.get(HEADERS_ENV)
    if override:
        os.environ["BCC_KERNEL_SOURCE"] = override
