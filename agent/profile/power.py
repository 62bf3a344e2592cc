"""Power samples for the launch profiler: from an nvidia-smi CSV log, dcgm-exporter
scrapes, or live NVML.  Every sample is (wall-clock epoch seconds, watts); SM activity
(0..1) comes only from a profiling metric (DCGM_FI_PROF_SM_ACTIVE): nvidia-smi's
utilization.gpu is the share of time *any* kernel ran, not how busy the SMs were, so it
never stands in for it (NVML docs, nvmlDeviceGetUtilizationRates).
"""
from __future__ import annotations

import csv
import io
import re
import time
from dataclasses import dataclass, field
from datetime import datetime

from ..model.errors import BadInput


@dataclass(frozen=True)
class PowerSample:
    t: float                 # epoch seconds (wall clock)
    watts: float
    energy_j: float | None = None   # the device's energy counter, when the source has one


@dataclass
class PowerLog:
    source: str
    samples: list = field(default_factory=list)        # PowerSample, sorted by t
    sm_active: list = field(default_factory=list)      # (t, ratio 0..1)
    utilization: list = field(default_factory=list)    # (t, utilization.gpu 0..1), informational
    why_no_sm: str = ""


def _number(text: str) -> float | None:
    """'123.45 W' / '45 %' / '[N/A]' -> 123.45 / 45.0 / None."""
    match = re.match(r"\s*([-+]?\d+(?:\.\d*)?)", text or "")
    return float(match.group(1)) if match else None


def read_nvidia_smi_csv(text: str, gpu: int, source: str = "power.csv") -> PowerLog:
    """`nvidia-smi --query-gpu=timestamp,index,power.draw,utilization.gpu --format=csv -lms N`:
    a header line, then "YYYY/MM/DD HH:MM:SS.mmm, index, P W, U %" rows, local time.  The
    header may repeat (nvidia-smi restarted); rows of other GPUs are skipped."""
    log = PowerLog(source=source, why_no_sm="nvidia-smi reports no SM-activity profiling metric "
                                             "(utilization.gpu is time-busy, not SM activity)")
    columns = None
    for number, row in enumerate(csv.reader(io.StringIO(text)), 1):
        if not row or not "".join(row).strip():
            continue
        cells = [c.strip() for c in row]
        if cells[0].startswith("timestamp"):
            columns = {name.split(" [")[0].strip(): i for i, name in enumerate(cells)}
            continue
        if columns is None or "power.draw" not in columns or "timestamp" not in columns:
            raise BadInput(f"{source}: line {number}: expected nvidia-smi's CSV header "
                           "(--query-gpu=timestamp,index,power.draw,utilization.gpu --format=csv)")
        try:
            stamp = datetime.strptime(cells[columns["timestamp"]], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        except (ValueError, IndexError):
            raise BadInput(f"{source}: line {number}: not an nvidia-smi timestamp: {cells[0]!r}") from None
        if "index" in columns and _number(cells[columns["index"]]) != gpu:
            continue
        watts = _number(cells[columns["power.draw"]]) if columns["power.draw"] < len(cells) else None
        if watts is not None:
            log.samples.append(PowerSample(stamp, watts))
        if "utilization.gpu" in columns and columns["utilization.gpu"] < len(cells):
            util = _number(cells[columns["utilization.gpu"]])
            if util is not None:
                log.utilization.append((stamp, util / 100.0))
    log.samples.sort(key=lambda s: s.t)
    if not log.samples:
        raise BadInput(f"{source}: no power.draw sample for GPU {gpu}")
    return log


_PROM = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)(?:\s+(\d+))?\s*$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def read_dcgm_scrapes(text: str, gpu: int, source: str = "dcgm.prom") -> PowerLog:
    """dcgm-exporter's Prometheus text, one scrape after another.  A sample's time is its
    Prometheus timestamp (ms) when present, else the last `# TIME <epoch seconds>` comment
    before it (what `while :; do echo "# TIME $(date +%s.%N)"; curl -s host:9400/metrics;
    sleep 1; done` writes).  DCGM_FI_DEV_POWER_USAGE is watts, DCGM_FI_PROF_SM_ACTIVE a
    ratio 0..1; series of other GPUs (label gpu) are skipped."""
    log = PowerLog(source=source)
    now = None
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line[1:].split()
            if len(parts) == 2 and parts[0] == "TIME":
                try:
                    now = float(parts[1])
                except ValueError:
                    raise BadInput(f"{source}: line {number}: # TIME needs epoch seconds") from None
            continue
        match = _PROM.match(line)
        if not match:
            raise BadInput(f"{source}: line {number}: not a Prometheus sample line")
        name, labels, value, stamp = match.groups()
        if name not in ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_SM_ACTIVE"):
            continue
        label = dict(_LABEL.findall(labels or ""))
        if "gpu" in label and label["gpu"] != str(gpu):
            continue
        t = int(stamp) / 1000.0 if stamp else now
        if t is None:
            raise BadInput(f"{source}: line {number}: a sample without a time (no timestamp, no # TIME line before it)")
        try:
            number_value = float(value)
        except ValueError:
            raise BadInput(f"{source}: line {number}: not a number: {value!r}") from None
        if name == "DCGM_FI_DEV_POWER_USAGE":
            log.samples.append(PowerSample(t, number_value))
        else:
            log.sm_active.append((t, number_value))
    log.samples.sort(key=lambda s: s.t)
    if not log.sm_active:
        log.why_no_sm = "the scrapes hold no DCGM_FI_PROF_SM_ACTIVE (enable the profiling metrics in dcgm-exporter's counters file)"
    if not log.samples:
        raise BadInput(f"{source}: no DCGM_FI_DEV_POWER_USAGE sample for GPU {gpu}")
    return log


class NvmlSampler:
    """Live NVML: nvmlDeviceGetTotalEnergyConsumption (mJ since driver load, Volta and
    later) where supported, else nvmlDeviceGetPowerUsage (mW).  Started and stopped around
    the run; take() is called from the profiler's tick, off the program's path."""

    def __init__(self, gpu: int):
        self.log = PowerLog(source="nvml")
        self.why = ""
        self.nvml = self.handle = None
        self.energy = True
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(gpu)
        except Exception as exc:  # pynvml missing, no driver, no such GPU
            self.why = f"NVML unavailable ({' '.join(str(exc).split()) or type(exc).__name__})"
        self.log.why_no_sm = "SM activity from NVML's GPM metrics is not sampled; use --dcgm" if self.nvml else \
            (self.why or "NVML unavailable")

    def take(self) -> None:
        if self.nvml is None:
            return
        t = time.time()
        try:
            watts = self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0
        except Exception:
            return
        energy = None
        if self.energy:
            try:
                energy = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0
            except Exception:
                self.energy = False
        self.log.samples.append(PowerSample(t, watts, energy))
