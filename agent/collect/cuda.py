"""CUDA runtime majors, the driver each needs, and the GPU facts NVML can tell us.

The runtime major of a libcudart is read from what the file declares (DT_SONAME, then its
version definitions) before its file name: a file *named* libcudart.so.12 whose SONAME is
libcudart.so.11.0 is the 11.x runtime, whatever its name says.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ..model import Fact

_CUDART = re.compile(r"^libcudart\.so\.(\d+)")

# Minimum Linux driver for each runtime major under CUDA minor-version compatibility:
# the "CUDA Toolkit and Minimum Required Driver Version" table of the CUDA release notes
# (11.x: 450.80.02, 12.x: 525.60.13, 13.x: 580.65.06).  A runtime newer than this fails
# every call with cudaErrorInsufficientDriver.
MIN_DRIVER = {
    10: "410.48",
    11: "450.80.02",
    12: "525.60.13",
    13: "580.65.06",
}


def version_tuple(text: str) -> tuple:
    parts = []
    for piece in str(text).strip().split("."):
        if not piece.isdigit():
            raise ValueError(f"not a driver version: {text!r} (expected e.g. 550.54.15)")
        parts.append(int(piece))
    if not parts:
        raise ValueError(f"not a driver version: {text!r}")
    return tuple(parts)


def is_cudart(path: str, info=None) -> bool:
    names = [os.path.basename(path)]
    if info is not None and info.soname:
        names.append(info.soname)
    return any(n.startswith("libcudart.so") for n in names)


def runtime_major(path: str, info=None) -> int | None:
    """Major of a libcudart: SONAME, then version nodes, then the file name."""
    candidates = []
    if info is not None:
        candidates.append(info.soname or "")
        candidates.extend(info.version_defs)
    candidates.append(os.path.basename(path))
    for name in candidates:
        match = _CUDART.match(name or "")
        if match:
            return int(match.group(1))
    return None


def driver_max_major(driver_version: str) -> int | None:
    """Highest runtime major this driver supports, or None when it supports none we know."""
    have = version_tuple(driver_version)
    best = None
    for major, needed in MIN_DRIVER.items():
        if have >= version_tuple(needed):
            best = major if best is None else max(best, major)
    return best


def driver_fact(requester: str, runtime_path: str, major: int, driver_version: str,
                driver_source: str) -> Fact | None:
    """cuda_driver fact for one object that loads a runtime of ``major``."""
    needed = MIN_DRIVER.get(major)
    if needed is None:
        return None  # a future major we have no table entry for: say nothing rather than guess
    ok = version_tuple(driver_version) >= version_tuple(needed)
    return Fact("cuda_driver", {"path": requester},
                {"runtime_major": major, "runtime_path": runtime_path, "required_driver": needed,
                 "driver_version": driver_version, "driver_source": driver_source,
                 "driver_ok": ok, "driver_max_major": driver_max_major(driver_version)},
                source="collect.cuda")


@dataclass
class GpuInfo:
    """What is known about this host's GPUs: from NVML, or from the command line."""

    driver_version: str | None = None
    driver_source: str = ""
    targets: list = field(default_factory=list)  # of (arch_num, variant, label, source)
    devices: list = field(default_factory=list)  # of {index, name, arch}
    nvml: bool = False
    nvml_error: str = ""

    def to_dict(self) -> dict:
        return {"nvml": self.nvml, "nvml_error": self.nvml_error or None,
                "driver_version": self.driver_version, "driver_source": self.driver_source or None,
                "devices": self.devices,
                "targets": [label for _n, _v, label, _s in self.targets]}


NVML_LIBRARY = "libnvidia-ml.so.1"


def nvml_library_present() -> bool:
    """Would dlopen("libnvidia-ml.so.1") find a file: LD_LIBRARY_PATH, ld.so.cache, defaults."""
    from ..resolve.ldcache import LdCache

    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"]
    if any(os.path.exists(os.path.join(d, NVML_LIBRARY)) for d in dirs):
        return True
    try:
        return any(e.name == NVML_LIBRARY for e in LdCache.load().entries)
    except Exception:
        return True  # cannot tell: let pynvml try


def probe_nvml() -> GpuInfo:
    """Driver version and device architectures from NVML; an empty GpuInfo without it."""
    info = GpuInfo()
    if not nvml_library_present():
        # importing pynvml alone costs ~80 ms; without the library it could only fail
        info.nvml_error = "NVML library (libnvidia-ml.so.1) not found"
        return info
    try:
        import pynvml  # nvidia-ml-py; loads libnvidia-ml.so.1 only when initialised
    except ImportError:
        info.nvml_error = "nvidia-ml-py not installed"
        return info
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        info.nvml_error = str(exc) or exc.__class__.__name__
        return info
    try:
        info.nvml = True
        version = pynvml.nvmlSystemGetDriverVersion()
        info.driver_version = version.decode() if isinstance(version, bytes) else str(version)
        info.driver_source = "nvml"
        seen = set()
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            arch = major * 10 + minor
            info.devices.append({"index": index, "name": name, "arch": f"sm_{arch}"})
            if arch not in seen:
                seen.add(arch)
                info.targets.append((arch, "", f"sm_{arch}", "nvml"))
    except Exception as exc:
        info.nvml_error = str(exc) or exc.__class__.__name__
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return info
