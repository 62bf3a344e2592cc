"""What this host's GPUs look like: NVML when it loads in this process, else the running
seedance agent's samples (its status socket), plus the kernel module's own version.

Everything here is observation only, and each value says where it came from, so a finding
can say "not observed: NVML unavailable (...)" instead of guessing.  pynvml is imported
lazily: --help and hosts without a driver never pay for it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

PROC_VERSION = Path("/proc/driver/nvidia/version")
SYS_MODULE_VERSION = Path("/sys/module/nvidia/version")


@dataclass(frozen=True)
class GpuHost:
    nvml_ok: bool
    nvml_error: str  # why NVML gave nothing ('' when it worked)
    device_count: int  # 0 when unknown
    driver_version: str | None  # NVML's view
    cuda_driver_major: int | None  # newest CUDA major the driver supports (NVML)
    module_version: str | None  # the loaded kernel module's view
    module_source: str
    devices: tuple = ()  # of dict(index, name, cc, arch, utilisation)
    utilisation_error: str = ""
    agent_source: str = ""  # the status socket the devices came from, when NVML failed here
    extra: dict = field(default_factory=dict)

    @property
    def device_source(self) -> str:
        if self.nvml_ok:
            return "NVML"
        if self.agent_source:
            return f"seedance agent ({self.agent_source}); NVML unavailable here ({self.nvml_error})"
        return f"NVML unavailable ({self.nvml_error})"


def kernel_module_version() -> tuple:
    """(version, source) of the loaded nvidia kernel module, or (None, why)."""
    try:
        text = PROC_VERSION.read_text()
        match = re.search(r"Kernel Module(?: for [^ ]+)?\s+([0-9]+\.[0-9]+(?:\.[0-9]+)?)", text)
        if match:
            return match.group(1), str(PROC_VERSION)
    except OSError:
        pass
    try:
        return SYS_MODULE_VERSION.read_text().strip(), str(SYS_MODULE_VERSION)
    except OSError:
        return None, f"no nvidia kernel module ({PROC_VERSION} and {SYS_MODULE_VERSION} absent)"


@lru_cache(maxsize=1)
def probe() -> GpuHost:
    observed = _probe_nvml()
    if observed.nvml_ok:
        return observed
    return _from_agent(observed)


def _from_agent(observed: GpuHost) -> GpuHost:
    """The agent samples NVML every few seconds; when NVML does not load here (a container
    without the driver's libraries), its view is still live data."""
    try:
        from ..model.errors import SeedanceError
        from ..service import api, config
    except ImportError:
        return observed
    path = config.socket_path()
    if not path.exists():
        return observed
    try:
        status = api.request(path, "status", timeout=1.0)
    except (SeedanceError, OSError):
        return observed
    devices = []
    for dev in status.get("devices") or []:
        util = dev.get("utilization")
        devices.append({"index": dev.get("index"), "name": dev.get("name", ""), "cc": None, "arch": None,
                        "utilisation": None if util is None else round(float(util) * 100, 1)})
    if not devices:
        return observed
    return GpuHost(False, observed.nvml_error, len(devices), observed.driver_version, observed.cuda_driver_major,
                   observed.module_version, observed.module_source, tuple(devices),
                   agent_source=str(path))


def _probe_nvml() -> GpuHost:
    module_version, module_source = kernel_module_version()
    try:
        import pynvml
    except ImportError as exc:
        return GpuHost(False, f"pynvml not importable: {exc}", 0, None, None, module_version, module_source)
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, version mismatch...
        return GpuHost(False, _nvml_text(exc), 0, None, None, module_version, module_source)
    try:
        count = pynvml.nvmlDeviceGetCount()
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        try:
            cuda_major = pynvml.nvmlSystemGetCudaDriverVersion_v2() // 1000
        except Exception:
            cuda_major = None
        devices, util_error = [], ""
        for index in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            try:
                util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
            except Exception as exc:
                util, util_error = None, _nvml_text(exc)
            devices.append({"index": index, "name": _text(pynvml.nvmlDeviceGetName(handle)),
                            "cc": f"{major}.{minor}", "arch": major * 10 + minor, "utilisation": util})
        return GpuHost(True, "", count, driver, cuda_major, module_version, module_source,
                       tuple(devices), util_error)
    except Exception as exc:
        return GpuHost(False, _nvml_text(exc), 0, None, None, module_version, module_source)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_text(exc: Exception) -> str:
    return " ".join(str(exc).split()) or exc.__class__.__name__


def affinity_metric(host: GpuHost) -> dict:
    """The notes' observable for affinity-unset: GPU0 utilisation < 15% while another
    accelerator's idle time > 80%."""
    metric = "GPU0 utilisation < 15% while another accelerator's idle time > 80%"
    if not host.devices:
        return {"metric": metric, "observed": False,
                "value": f"not observed: {host.device_source}"}
    utils = {d["index"]: d["utilisation"] for d in host.devices}
    if len(utils) < 2 or any(v is None for v in utils.values()):
        why = host.utilisation_error or f"{len(utils)} device(s)"
        return {"metric": metric, "observed": False, "value": f"not observed: {why}",
                "utilisation": utils}
    others_idle = max(100 - v for k, v in utils.items() if k != 0)
    return {"metric": metric, "observed": True, "source": host.device_source, "utilisation": utils,
            "gpu0_utilisation": utils.get(0), "max_other_idle": others_idle,
            "value": "met" if (utils.get(0, 100) < 15 and others_idle > 80) else "not met now"}
