"""Parse and validate a WorkloadQuotaPolicy.  Nothing is applied from a policy that fails here.

    apiVersion: seedance/v1
    kind: WorkloadQuotaPolicy
    metadata: {name: encoders}
    spec:
      workloadSelector: {matchLabels: {app: encoder}}
      quota: {cpu: "500m", memory: "256Mi"}
      burstable: true
      burst: {cpu: "1500m", whenPressureBelow: {cpu_some_avg10: 20}}

CPU quantities follow Kubernetes: "500m" is half a core, "1.5" or "2" are cores.  Memory
follows Kubernetes too: Ki/Mi/Gi/Ti (powers of 1024), k/M/G/T (powers of 1000), or bytes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..model.errors import BadInput

API_VERSION = "seedance/v1"
KIND = "WorkloadQuotaPolicy"
# PSI keys a burst may be conditioned on: <resource>_<some|full>_<avg10|avg60|avg300>
_PSI_KEY = re.compile(r"^(cpu|memory|io)_(some|full)_(avg10|avg60|avg300)$")
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")  # a DNS label, as Kubernetes names are
_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Policy:
    name: str
    match_labels: dict
    cpu_millicores: int | None
    memory_bytes: int | None
    burstable: bool = False
    burst_cpu_millicores: int | None = None
    pressure_key: str | None = None       # e.g. cpu_some_avg10
    pressure_below: float | None = None   # burst while that pressure is below this (percent)
    source: str = ""
    raw: dict = field(default_factory=dict, compare=False)

    def matches(self, labels: dict) -> bool:
        return all(labels.get(key) == value for key, value in self.match_labels.items())

    def to_dict(self) -> dict:
        return {"name": self.name, "match_labels": dict(self.match_labels),
                "cpu_millicores": self.cpu_millicores, "memory_bytes": self.memory_bytes,
                "burstable": self.burstable, "burst_cpu_millicores": self.burst_cpu_millicores,
                "burst_when": ({self.pressure_key: self.pressure_below} if self.pressure_key else None)}


def parse_cpu(text, field_name: str) -> int:
    """'500m' -> 500, '1.5' -> 1500, 2 -> 2000 (millicores): Kubernetes' CPU quantities,
    digits only (float() would also take 'inf', '1e3' and '1_000')."""
    value = str(text).strip()
    match = re.fullmatch(r"([0-9]+)m|([0-9]+\.?[0-9]*|\.[0-9]+)", value)
    if not match or isinstance(text, bool):
        raise BadInput(f"{field_name}: not a CPU quantity: {value!r} (use 500m or 1.5)")
    millis = int(match.group(1)) if match.group(1) else round(float(match.group(2)) * 1000)
    if millis < 1 or millis > 1_000_000:
        raise BadInput(f"{field_name}: {value!r} is out of range (1m .. 1000 cores)")
    return millis


def parse_memory(text, field_name: str) -> int:
    """A memory quantity (seedance.model.units, the grammar every command shares), at least 1Mi:
    the kernel rounds to pages, and below a few pages a cgroup cannot even hold a shell."""
    from ..model.units import parse_size

    if isinstance(text, bool) or isinstance(text, float):
        raise BadInput(f"{field_name}: not a memory quantity: {text!r} (use 256Mi, 1Gi or bytes)")
    return parse_size(text, field_name, minimum=1 << 20)


def parse_policy(document, source: str = "policy") -> Policy:
    """Validate a loaded YAML document; the first defect is one BadInput naming its field."""
    def need_map(value, name):
        if not isinstance(value, dict):
            raise BadInput(f"{source}: {name}: expected a mapping, got {type(value).__name__}")
        return value

    doc = need_map(document, "document")
    unknown = set(doc) - {"apiVersion", "kind", "metadata", "spec"}
    if unknown:
        raise BadInput(f"{source}: unknown field {sorted(unknown)[0]!r}")
    if doc.get("apiVersion") != API_VERSION:
        raise BadInput(f"{source}: apiVersion: expected {API_VERSION!r}, got {doc.get('apiVersion')!r}")
    if doc.get("kind") != KIND:
        raise BadInput(f"{source}: kind: expected {KIND!r}, got {doc.get('kind')!r}")
    name = need_map(doc.get("metadata"), "metadata").get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise BadInput(f"{source}: metadata.name: expected a lowercase DNS label, got {name!r}")
    spec = need_map(doc.get("spec"), "spec")
    unknown = set(spec) - {"workloadSelector", "quota", "burstable", "burst"}
    if unknown:
        raise BadInput(f"{source}: spec: unknown field {sorted(unknown)[0]!r}")
    selector = need_map(spec.get("workloadSelector"), "spec.workloadSelector")
    labels = need_map(selector.get("matchLabels"), "spec.workloadSelector.matchLabels")
    if not labels:
        raise BadInput(f"{source}: spec.workloadSelector.matchLabels: empty (it would select every workload)")
    for key, value in labels.items():
        if not isinstance(key, str) or not _LABEL.fullmatch(key):
            raise BadInput(f"{source}: spec.workloadSelector.matchLabels: bad label key {key!r}")
        if not isinstance(value, str) or not _LABEL.fullmatch(value):
            raise BadInput(f"{source}: spec.workloadSelector.matchLabels.{key}: bad label value {value!r}")
    quota = need_map(spec.get("quota"), "spec.quota")
    unknown = set(quota) - {"cpu", "memory"}
    if unknown:
        raise BadInput(f"{source}: spec.quota: unknown field {sorted(unknown)[0]!r}")
    if "cpu" not in quota and "memory" not in quota:
        raise BadInput(f"{source}: spec.quota: give cpu, memory or both")
    cpu = parse_cpu(quota["cpu"], "spec.quota.cpu") if "cpu" in quota else None
    memory = parse_memory(quota["memory"], "spec.quota.memory") if "memory" in quota else None
    burstable = spec.get("burstable", False)
    if not isinstance(burstable, bool):
        raise BadInput(f"{source}: spec.burstable: expected true or false, got {burstable!r}")
    burst_cpu = key = below = None
    if burstable:
        burst = need_map(spec.get("burst"), "spec.burst")
        unknown = set(burst) - {"cpu", "whenPressureBelow"}
        if unknown:
            raise BadInput(f"{source}: spec.burst: unknown field {sorted(unknown)[0]!r}")
        if cpu is None:
            raise BadInput(f"{source}: spec.burst.cpu: a burst needs spec.quota.cpu to burst from")
        burst_cpu = parse_cpu(burst.get("cpu"), "spec.burst.cpu")
        if burst_cpu <= cpu:
            raise BadInput(f"{source}: spec.burst.cpu: {burst.get('cpu')!r} is not above spec.quota.cpu")
        when = need_map(burst.get("whenPressureBelow"), "spec.burst.whenPressureBelow")
        if len(when) != 1:
            raise BadInput(f"{source}: spec.burst.whenPressureBelow: give exactly one pressure key, e.g. cpu_some_avg10")
        (key, below), = when.items()
        if not isinstance(key, str) or not _PSI_KEY.fullmatch(key):
            raise BadInput(f"{source}: spec.burst.whenPressureBelow: unknown pressure key {key!r} "
                           "(use <cpu|memory|io>_<some|full>_<avg10|avg60|avg300>)")
        if isinstance(below, bool) or not isinstance(below, (int, float)) or not 0 < below <= 100:
            raise BadInput(f"{source}: spec.burst.whenPressureBelow.{key}: expected a percentage in (0, 100], got {below!r}")
    elif "burst" in spec:
        raise BadInput(f"{source}: spec.burst: given but spec.burstable is not true")
    return Policy(name=name, match_labels=dict(labels), cpu_millicores=cpu, memory_bytes=memory,
                  burstable=burstable, burst_cpu_millicores=burst_cpu, pressure_key=key,
                  pressure_below=float(below) if below is not None else None, source=source, raw=doc)


def parse_labels(items) -> dict:
    """`--label app=encoder --label tier=gold` (or one comma-separated string) -> dict."""
    labels = {}
    for item in items or ():
        for part in str(item).split(","):
            if not part:
                continue
            key, sep, value = part.partition("=")
            if not sep or not _LABEL.fullmatch(key) or not _LABEL.fullmatch(value):
                raise BadInput(f"--label {part!r}: expected KEY=VALUE (letters, digits, . _ -)")
            labels[key] = value
    return labels


def format_labels(labels: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
