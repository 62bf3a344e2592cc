"""GPU telemetry from NVML, and the live facts of the affinity trap.

The live trap (product notes chapter 1): a process binds device 0 while another
job already keeps device 0 busy, and the other devices sit idle.  The agent does not judge
this itself: it offers a `plugin_affinity` fact (the kind rules/plugins.yaml's
`affinity-unset` reads) for each such process, and the rule engine raises the finding, as
it does for a manifest without device_affinity.

A process counts as having chosen its device when CUDA_VISIBLE_DEVICES is in its
environment (or the shim remapped it); a process whose environment cannot be read is not
judged.  On device 0 the process holding the most memory is taken to be the job that owns
it; the others are the ones that landed there by default.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..model.report import Fact

# "idle time > 80%" in the product notes: an idle device is one below 20% utilisation
# with no compute process on it.
IDLE_UTILISATION = 0.20
AFFINITY_METRIC = "GPU0 utilisation < 15% while another accelerator's idle time > 80%"


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory: int | None = None


@dataclass(frozen=True)
class DeviceSample:
    index: int
    uuid: str = ""
    name: str = ""
    utilization: float | None = None     # 0..1
    memory_used: int | None = None
    memory_total: int | None = None
    power_watts: float | None = None
    processes: tuple = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return {"index": self.index, "uuid": self.uuid, "name": self.name, "utilization": self.utilization,
                "memory_used": self.memory_used, "memory_total": self.memory_total,
                "power_watts": self.power_watts,
                "processes": [{"pid": p.pid, "used_memory": p.used_memory} for p in self.processes]}


class NvmlSampler:
    """pynvml (nvidia-ml-py), imported and initialised only when the agent samples."""

    def __init__(self):
        self._nvml = None
        self.reason = ""

    def start(self) -> bool:
        try:
            import pynvml
        except ImportError:
            self.reason = "nvidia-ml-py (pynvml) is not installed"
            return False
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            self.reason = f"NVML unavailable: {exc}"
            return False
        self._nvml = pynvml
        return True

    def sample(self) -> list[DeviceSample]:
        nvml = self._nvml
        if nvml is None:
            return []
        samples = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            util = _try(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
            memory = _try(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
            power = _try(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
            procs = _try(lambda: nvml.nvmlDeviceGetComputeProcesses(handle)) or []
            samples.append(DeviceSample(
                index=index, uuid=_text(_try(lambda: nvml.nvmlDeviceGetUUID(handle)) or ""),
                name=_text(_try(lambda: nvml.nvmlDeviceGetName(handle)) or ""),
                utilization=util, memory_used=getattr(memory, "used", None),
                memory_total=getattr(memory, "total", None), power_watts=power,
                processes=tuple(GpuProcess(p.pid, getattr(p, "usedGpuMemory", None)) for p in procs)))
        return samples

    def stop(self) -> None:
        if self._nvml is not None:
            _try(self._nvml.nvmlShutdown)
            self._nvml = None


def _try(call):
    try:
        return call()
    except Exception:  # NVMLError_NotSupported and friends: that metric is simply absent
        return None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def process_affinity(pid: int, shim_remapped: set[int] = frozenset(), proc: str = "/proc") -> bool | None:
    """True when the process chose its devices, False when it did not, None when unknown."""
    if pid in shim_remapped:
        return True
    try:
        with open(f"{proc}/{pid}/environ", "rb") as handle:
            environ = handle.read().split(b"\0")
    except OSError:
        return None
    return any(item.startswith(b"CUDA_VISIBLE_DEVICES=") for item in environ)


def _process_identity(pid: int, proc: str) -> tuple[str, str]:
    try:
        comm = open(f"{proc}/{pid}/comm").read().strip()
    except OSError:
        comm = "?"
    try:
        exe = os.readlink(f"{proc}/{pid}/exe")
    except OSError:
        exe = ""
    return comm, exe


def affinity_facts(samples: list[DeviceSample], affinity=process_affinity, proc: str = "/proc") -> list[Fact]:
    """plugin_affinity facts for processes stuck on a busy device 0 while other devices idle."""
    if len(samples) < 2:
        return []
    by_index = {s.index: s for s in samples}
    device0 = by_index.get(0)
    if device0 is None or len(device0.processes) < 2:
        return []  # no other job on device 0: landing there alone wastes nothing
    others = [s for s in samples if s.index != 0]
    idle = [s.index for s in others
            if not s.processes and s.utilization is not None and s.utilization < IDLE_UTILISATION]
    if not idle:
        return []
    owner = max(device0.processes, key=lambda p: (p.used_memory or 0, -p.pid))
    util0 = device0.utilization
    facts = []
    for gpu_proc in device0.processes:
        if gpu_proc.pid == owner.pid:
            continue
        chose = affinity(gpu_proc.pid)
        if chose is None or chose:
            continue
        comm, exe = _process_identity(gpu_proc.pid, proc)
        source = (f"NVML: device 0 {'at %d%%' % round(util0 * 100) if util0 is not None else 'busy'} "
                  f"with {len(device0.processes)} processes (job pid {owner.pid}); "
                  f"idle device(s) {', '.join(map(str, idle))}")
        facts.append(Fact(
            kind="plugin_affinity",
            subject={"pid": gpu_proc.pid, "path": exe, "device": 0},
            data={"plugin": f"{comm} (pid {gpu_proc.pid})", "version": "(live)", "path": exe,
                  "affinity_set": False, "strict": False, "device_count": len(samples),
                  "device_source": source, "metric": AFFINITY_METRIC,
                  "metric_value": {"gpu0_utilization": util0, "gpu0_processes": len(device0.processes),
                                   "job_pid": owner.pid, "idle_devices": idle},
                  "metric_observed": True, "line": None},
            source="agent.nvml"))
    return facts
