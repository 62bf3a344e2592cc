"""Which optional parts of this seedance install are present: one Part each, for
`seedance doctor`.  Probing is cheap and side-effect free: modules are looked up, not
imported, where importing would cost (matplotlib); libraries are loaded only where loading
is the question (NVML's libnvidia-ml.so.1, the shim's binding is not loaded at all)."""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    name: str
    present: bool
    detail: str  # where it is, or why it is not
    used_by: str  # what needs it
    install: str  # how to get it ("" when present)

    def to_dict(self) -> dict:
        return {"name": self.name, "present": self.present, "detail": self.detail, "used_by": self.used_by,
                "install": self.install}


REINSTALL = "install seedance's wheel, or reinstall from source with a C compiler (gcc)"


def shim() -> Part:
    from .. import shim as shim_package
    from ..model.errors import NotAvailable

    try:
        library = shim_package.library_path()
        launcher = shim_package.launcher_path()
    except NotAvailable as exc:
        return Part("shim", False, str(exc), "seedance run, trace --audit", REINSTALL)
    return Part("shim", True, f"{library}, {launcher}", "seedance run, trace --audit", "")


def elf_reader() -> Part:
    from ..elf import fastread

    if fastread.available():
        return Part("C ELF reader", True, "seedance.elf._fastelf", "check, ldd (speed only)", "")
    return Part("C ELF reader", False, "not built: the Python reader gives the same answers, slower",
                "check, ldd (speed only)", REINSTALL)


def bcc() -> Part:
    from ..trace.env import BCC_INSTALL, bcc_problem

    problem = bcc_problem()
    if problem:
        return Part("bcc", False, problem.split(":", 1)[0], "trace (eBPF; else it falls back)", BCC_INSTALL)
    spec = importlib.util.find_spec("bcc")
    return Part("bcc", True, os.path.dirname(spec.origin) if spec and spec.origin else "importable",
                "trace (eBPF; else it falls back)", "")


def nvml() -> Part:
    used_by = "GPU facts: check, run --affinity, the agent's device metrics"
    try:
        import pynvml
    except ImportError:
        return Part("NVML", False, "nvidia-ml-py is not installed", used_by, "pip install nvidia-ml-py")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return Part("NVML", False, f"libnvidia-ml.so.1: {exc}", used_by,
                    "the NVIDIA driver (it ships libnvidia-ml.so.1); without a GPU there is nothing to read")
    try:
        count = pynvml.nvmlDeviceGetCount()
        driver = pynvml.nvmlSystemGetDriverVersion()
    except pynvml.NVMLError as exc:
        return Part("NVML", False, str(exc), used_by, "")
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    driver = driver.decode() if isinstance(driver, bytes) else driver
    return Part("NVML", True, f"driver {driver}, {count} device(s)", used_by, "")


def graphviz_dot() -> Part:
    used_by = "check --graph, profile calls (SVG/PNG pictures; DOT text needs nothing)"
    dot = shutil.which("dot")
    if dot:
        return Part("graphviz dot", True, dot, used_by, "")
    return Part("graphviz dot", False, "no `dot` on PATH", used_by,
                "install graphviz (Debian/Ubuntu: apt install graphviz; Fedora: dnf install graphviz)")


def extras() -> list:
    from ..model.extras import EXTRAS

    parts = []
    for extra in EXTRAS:
        missing = [m for m in extra.modules if not _findable(m)]
        detail = f"{', '.join(missing)} not installed" if missing else ", ".join(extra.modules)
        parts.append(Part(f"[{extra.name}] extra", not missing, detail, extra.purpose,
                          f"pip install 'seedance[{extra.name}]'" if missing else ""))
    return parts


def example_plugins() -> Part:
    from ..plugins.resolve import builtin_source_dir

    where = builtin_source_dir()
    used_by = "plugin install NAME without --from"
    if where is not None:
        return Part("example plugins", True, str(where), used_by, "")
    return Part("example plugins", False, "not built with this install", used_by, REINSTALL)


def manual() -> Part:
    """The man pages and completion scripts the wheel installs below its prefix."""
    used_by = "man seedance, shell completion"
    for base in _data_prefixes():
        page = os.path.join(base, "share", "man", "man1", "seedance.1")
        if os.path.isfile(page):
            return Part("man pages and completions", True, os.path.join(base, "share"), used_by, "")
    return Part("man pages and completions", False, "not found below " + ", ".join(_data_prefixes()), used_by,
                "seedance completion bash|zsh prints a script; a wheel install puts both in place")


def _data_prefixes() -> list:
    """Where pip puts a wheel's data files: the environment's prefix, or the user base of a
    --user install."""
    import site

    prefixes = [sys.prefix]
    user = getattr(site, "USER_BASE", None) or site.getuserbase()
    if user and user not in prefixes:
        prefixes.append(user)
    return prefixes


def _findable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def survey() -> list:
    return [shim(), elf_reader(), bcc(), nvml(), graphviz_dot(), *extras(), example_plugins(), manual()]
