"""GPU memory fragmentation: the address map of one device over time (product notes 2.2).

The model is one device's address range [base, base + capacity) and its live allocations,
each rounded up to the page size.  Free blocks are the gaps between live allocations.
Per sample:

  free_bytes, free_blocks, mean_free_block_bytes = free_bytes / free_blocks,
  largest_free_ratio = largest free block / free_bytes

and the verdict by the notes' thresholds: healthy when the ratio is > 35% and the mean free
block > 64 MiB; danger when the ratio is < 12% or the mean < 8 MiB; warning otherwise.  A
device with no free byte at all has ratio 0 and mean 0: danger (nothing more fits).

Inputs are event records, the JSON lines of `seedance run --events` (docs/profile.md):
  {"ev":"device","dev":0,"base":B,"capacity":C}
  {"t":S,"ev":"alloc","dev":0,"addr":A,"size":N[,"library":L]}
  {"t":S,"ev":"free","dev":0,"addr":A}
"""
from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field

from ..errors import BadInput

MIB = 1 << 20
HEALTHY_RATIO, HEALTHY_MEAN = 0.35, 64 * MIB
DANGER_RATIO, DANGER_MEAN = 0.12, 8 * MIB
VERDICTS = ("healthy", "warning", "danger")


def verdict(ratio: float, mean: float) -> str:
    if ratio > HEALTHY_RATIO and mean > HEALTHY_MEAN:
        return "healthy"
    if ratio < DANGER_RATIO or mean < DANGER_MEAN:
        return "danger"
    return "warning"


def parse_size(text: str, what: str = "size") -> int:
    """'4K', '64KiB', '2M', '4096' -> bytes (K/M/G are powers of 1024, as page sizes are)."""
    value = str(text).strip()
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    number, unit = value, ""
    for suffix in ("KiB", "MiB", "GiB", "KB", "MB", "GB", "K", "M", "G", "k", "B"):
        if value.endswith(suffix):
            number, unit = value[: -len(suffix)], suffix[0].upper() if suffix != "B" else ""
            break
    try:
        size = int(float(number) * units[unit])
    except (ValueError, KeyError):
        raise BadInput(f"{what}: not a size: {value!r} (use 4K, 64K, 2M)") from None
    if size <= 0:
        raise BadInput(f"{what}: must be positive: {value!r}")
    return size


@dataclass(frozen=True)
class Metrics:
    t: float
    free_bytes: int
    free_blocks: int
    largest_free_block: int
    largest_free_ratio: float
    mean_free_block_bytes: float
    used_bytes: int
    live_allocations: int
    verdict: str

    def to_dict(self) -> dict:
        return {"t": self.t, "free_bytes": self.free_bytes, "free_blocks": self.free_blocks,
                "largest_free_block": self.largest_free_block,
                "largest_free_ratio": self.largest_free_ratio,
                "mean_free_block_bytes": self.mean_free_block_bytes, "used_bytes": self.used_bytes,
                "live_allocations": self.live_allocations, "verdict": self.verdict}


class AddressMap:
    """Live allocations of one device, page-rounded and kept sorted by address."""

    def __init__(self, base: int, capacity: int, page_size: int):
        if capacity <= 0 or page_size <= 0:
            raise BadInput("device capacity and page size must be positive")
        self.base, self.capacity, self.page_size = base, capacity, page_size
        self.starts: list[int] = []       # sorted start addresses
        self.sizes: dict[int, int] = {}   # start -> page-rounded size
        self.sites: dict[int, str] = {}   # start -> allocating library (when known)

    def round_up(self, size: int) -> int:
        return -(-size // self.page_size) * self.page_size

    def alloc(self, addr: int, size: int, site: str | None = None) -> None:
        if addr in self.sizes:
            self.free(addr)  # the driver reused an address whose free we never saw
        start = max(addr, self.base)
        end = min(addr + self.round_up(max(size, 1)), self.base + self.capacity)
        if end <= start:
            return  # outside the modelled range
        bisect.insort(self.starts, start)
        self.sizes[start] = end - start
        if site:
            self.sites[start] = site

    def free(self, addr: int) -> bool:
        start = max(addr, self.base)
        if start not in self.sizes:
            return False
        del self.sizes[start]
        self.sites.pop(start, None)
        self.starts.pop(bisect.bisect_left(self.starts, start))
        return True

    def used_extents(self) -> list[tuple[int, int]]:
        """(start, end) of used memory, overlaps merged."""
        extents: list[list[int]] = []
        for start in self.starts:
            end = start + self.sizes[start]
            if extents and start <= extents[-1][1]:
                extents[-1][1] = max(extents[-1][1], end)
            else:
                extents.append([start, end])
        return [(a, b) for a, b in extents]

    def free_blocks(self) -> list[tuple[int, int]]:
        blocks, cursor = [], self.base
        for start, end in self.used_extents():
            if start > cursor:
                blocks.append((cursor, start))
            cursor = max(cursor, end)
        if cursor < self.base + self.capacity:
            blocks.append((cursor, self.base + self.capacity))
        return blocks

    def metrics(self, t: float = 0.0) -> Metrics:
        blocks = self.free_blocks()
        sizes = [b - a for a, b in blocks]
        free = sum(sizes)
        largest = max(sizes, default=0)
        ratio = largest / free if free else 0.0
        mean = free / len(sizes) if sizes else 0.0
        return Metrics(t, free, len(sizes), largest, ratio, mean, self.capacity - free, len(self.sizes),
                       verdict(ratio, mean))

    def hole_sites(self) -> dict:
        """Which allocation sites border the free blocks: the ones that left the holes.

        Each free block that is not at the range's end is bounded above by a live
        allocation; its site and size class get the hole's bytes."""
        out: dict = {}
        starts = self.starts
        for a, b in self.free_blocks():
            index = bisect.bisect_left(starts, b)
            if index >= len(starts) or starts[index] != b:
                continue
            site = self.sites.get(b, "unknown")
            size_class = _size_class(self.sizes[b])
            entry = out.setdefault((site, size_class), {"site": site, "size_class": size_class,
                                                        "holes": 0, "hole_bytes": 0})
            entry["holes"] += 1
            entry["hole_bytes"] += b - a
        return out


def _size_class(size: int) -> str:
    """Power-of-two class: '64MiB-128MiB'."""
    low = 1 << (max(size, 1).bit_length() - 1)
    return f"{_human(low)}-{_human(low * 2)}"


def _human(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size // scale}{unit}"
    return f"{size}B"


@dataclass
class MemoryProfile:
    device: int
    base: int
    capacity: int
    page_size: int
    interval: float
    samples: list = field(default_factory=list)          # Metrics
    extents: list = field(default_factory=list)          # per sample: used (start_page, pages)
    final: Metrics | None = None
    sites: list = field(default_factory=list)
    events: int = 0
    unmatched_frees: int = 0
    _worst: Metrics | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        return {"device": self.device, "base": self.base, "capacity": self.capacity,
                "page_size": self.page_size, "sample_interval_s": self.interval, "events": self.events,
                "unmatched_frees": self.unmatched_frees, "samples": [m.to_dict() for m in self.samples],
                "final": self.final.to_dict() if self.final else None, "hole_sites": self.sites}


def read_event_lines(lines, source: str = "trace") -> list[dict]:
    """Parse JSON lines; a bad line is one BadInput naming its line number."""
    records = []
    for number, line in enumerate(lines, 1):
        if isinstance(line, bytes):
            line = line.decode("utf-8", "replace")
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise BadInput(f"{source}: line {number}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise BadInput(f"{source}: line {number}: expected a JSON object")
        record["_line"] = number
        records.append(record)
    return records


def _int(record: dict, key: str, source: str) -> int:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadInput(f"{source}: line {record.get('_line', '?')}: {key!r} must be a non-negative integer, got {value!r}")
    return value


def profile_events(records, *, device: int = 0, page_size: int = 4096, interval: float = 0.01,
                   base: int | None = None, capacity: int | None = None, source: str = "trace") -> MemoryProfile:
    """Replay event records for one device and sample the address map every ``interval``
    seconds of trace time (records without "t" keep the current time)."""
    if interval <= 0:
        raise BadInput("sample interval must be positive")
    mine = [r for r in records if r.get("dev", 0) == device and r.get("ev") in ("device", "alloc", "free")]
    for record in mine:
        if record["ev"] == "device":
            base = _int(record, "base", source) if base is None else base
            capacity = _int(record, "capacity", source) if capacity is None else capacity
    if capacity is None:
        raise BadInput(f"{source}: no {{\"ev\":\"device\",\"dev\":{device},...}} record gives the device's "
                       "base and capacity (or pass --capacity)")
    amap = AddressMap(base or 0, capacity, page_size)
    profile = MemoryProfile(device, amap.base, capacity, page_size, interval)
    next_sample = None
    t = 0.0
    for record in mine:
        if record["ev"] == "device":
            continue
        if "t" in record:
            value = record["t"]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                raise BadInput(f"{source}: line {record['_line']}: 't' must be a number of seconds")
            t = float(value)
        if next_sample is None:
            next_sample = t
        while t >= next_sample + interval:  # the map as it stood at each boundary passed
            _sample(profile, amap, next_sample)
            next_sample += interval
        profile.events += 1
        if record["ev"] == "alloc":
            amap.alloc(_int(record, "addr", source), _int(record, "size", source), record.get("library"))
        elif not amap.free(_int(record, "addr", source)):
            profile.unmatched_frees += 1
    _sample(profile, amap, t if next_sample is None else max(t, next_sample))
    profile.final = profile.samples[-1]
    return profile


def _rank(metrics: Metrics) -> tuple:
    return (VERDICTS.index(metrics.verdict), -metrics.largest_free_ratio)


def _sample(profile: MemoryProfile, amap: AddressMap, t: float) -> None:
    metrics = amap.metrics(t)
    # the hole sites are those of the worst moment (the one the rule reports), not the end:
    # a program that frees everything at exit has no holes left to blame
    if profile._worst is None or _rank(metrics) > _rank(profile._worst):
        profile._worst = metrics
        profile.sites = sorted(amap.hole_sites().values(), key=lambda s: -s["hole_bytes"])
    profile.samples.append(metrics)
    page = amap.page_size
    profile.extents.append([((a - amap.base) // page, (b - a) // page) for a, b in amap.used_extents()])


def worst_sample(profile: MemoryProfile) -> Metrics:
    """The sample with the worst verdict (the lowest largest-free ratio among equals)."""
    return max(profile.samples, key=_rank)


def memory_facts(profile: MemoryProfile, subject: dict) -> list:
    """One fact for rule gpu-memory-fragmented: the worst sample's metrics, since a program
    that fragments and then frees everything at exit ended healthy but ran in danger."""
    from ..model import Fact

    worst = worst_sample(profile)
    danger_time = sum(profile.interval for m in profile.samples if m.verdict == "danger")
    sites = [f"{s['site']} ({s['size_class']}: {s['holes']} holes, {s['hole_bytes']} B)" for s in profile.sites[:3]]
    data = {**worst.to_dict(), "device": profile.device, "capacity": profile.capacity,
            "page_size": profile.page_size, "final_verdict": profile.final.verdict,
            "samples": len(profile.samples), "danger_seconds": round(danger_time, 6),
            "hole_sites": profile.sites[:5], "hole_sites_text": "; ".join(sites) or "no allocation borders a hole",
            "ratio_pct": round(worst.largest_free_ratio * 100, 2),
            "mean_free_mib": round(worst.mean_free_block_bytes / MIB, 3)}
    return [Fact("gpu_memory_profile", dict(subject, device=profile.device), data, source="profile.memory")]
