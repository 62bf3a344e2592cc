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
import math
import struct
from dataclasses import dataclass, field, replace

from ..model.errors import BadInput

MIB = 1 << 20
ADDRESS_SPACE = 1 << 64        # base + capacity may reach it, never pass it
MAX_U64 = ADDRESS_SPACE - 1    # addresses, sizes and capacities are the driver's 64-bit values
MAX_PAGE = 1 << 30             # frag.bin keeps the page size in 32 bits; 1 GiB is past any GPU page
MAX_DEVICE = (1 << 31) - 1     # frag.bin keeps the device index as a signed 32-bit integer
EXTENT = struct.Struct("<QQ")  # one used extent of a sample's map: (start page, pages), as frag.bin stores it
EXTENT_BYTES = EXTENT.size


@dataclass(frozen=True)
class Limits:
    """What one memory trace may hold (docs/profile.md lists them).  Real traces stay far
    below each; a hostile one is refused with one line naming the field, or, for its
    timeline, folded, so memory is bounded by the live set whatever the trace's length.
    Tests shrink them to reach each edge cheaply."""
    line_bytes: int = 1 << 20          # one JSON line
    events: int = 1_000_000_000        # records in one trace: time, not memory, is what they cost
    live: int = 1 << 18                # live allocations of the device at once
    span_s: float = 1e7                # trace time from the first event (~116 days)
    min_interval_s: float = 1e-6       # the sample interval's floor: the shim stamps in microseconds at best
    samples: int = 4096                # samples kept; past it every other one goes and the interval doubles
    map_extents: int = 1 << 22         # used extents over all kept samples' maps (16 B each in frag.bin)
    sites: int = 1024                  # distinct allocating-library names kept; later ones count as "other"
    site_chars: int = 4096             # a library name (PATH_MAX)


LIMITS = Limits()
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
    """'4Ki', '2Mi', '4096' -> bytes: the quantity grammar every command shares
    (seedance.model.units), so 4Ki is a 4096-byte page and 2M is 2000000 bytes."""
    from ..model.units import parse_size as parse

    return parse(text, what, minimum=1)


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

    def __init__(self, base: int, capacity: int, page_size: int, limits: Limits = LIMITS):
        if capacity <= 0 or page_size <= 0:
            raise BadInput("device capacity and page size must be positive")
        self.base, self.capacity, self.page_size = base, capacity, page_size
        self.limits = limits
        self.starts: list[int] = []       # sorted start addresses
        self.sizes: dict[int, int] = {}   # start -> page-rounded size
        self.sites: dict[int, str] = {}   # start -> allocating library (when known)
        self.names: dict[str, str] = {}   # one copy of each library name, however many allocations it has
        self.changes = 0                  # bumped by every alloc/free: an unchanged map is not re-measured

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
        self.changes += 1
        if site:
            self.sites[start] = self._site_name(site)

    def _site_name(self, site) -> str:
        """The library name, shared between its allocations; a trace naming more libraries
        than limits.sites, or a name longer than a path, cannot grow memory with them."""
        name = str(site)[: self.limits.site_chars]
        if name not in self.names:
            if len(self.names) >= self.limits.sites:
                return "other"
            self.names[name] = name
        return self.names[name]

    def free(self, addr: int) -> bool:
        start = max(addr, self.base)
        if start not in self.sizes:
            return False
        del self.sizes[start]
        self.changes += 1
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
    interval: float                                      # grows (doubles) when the timeline folds
    samples: list = field(default_factory=list)          # Metrics, at most Limits.samples
    extents: list = field(default_factory=list)          # per sample: its used (start_page, pages), EXTENT-packed
    final: Metrics | None = None
    sites: list = field(default_factory=list)
    events: int = 0
    unmatched_frees: int = 0
    requested_interval: float = 0.0
    worst: Metrics | None = None                         # over every sample taken, kept or folded away
    danger_seconds: float = 0.0                          # likewise
    map_extents: int = 0                                 # extents held in `extents`

    def to_dict(self) -> dict:
        return {"device": self.device, "base": self.base, "capacity": self.capacity,
                "page_size": self.page_size, "sample_interval_s": self.interval,
                "requested_sample_interval_s": self.requested_interval or self.interval, "events": self.events,
                "unmatched_frees": self.unmatched_frees, "samples": [m.to_dict() for m in self.samples],
                "final": self.final.to_dict() if self.final else None, "hole_sites": self.sites}


def extent_pairs(packed: bytes):
    """(start page, pages) of a sample's packed map."""
    return EXTENT.iter_unpack(packed)


def read_event_lines(lines, source: str = "trace", limits: Limits = LIMITS) -> list[dict]:
    """Every record of a small trace, as a list (iter_event_lines streams a large one)."""
    return list(iter_event_lines(lines, source, limits))


def iter_event_lines(lines, source: str = "trace", limits: Limits = LIMITS):
    """Parse JSON lines one at a time; a bad line is one BadInput naming its line number.

    `lines` is a binary file (read with a bounded readline, so a file with no newline never
    becomes one huge string) or any iterable of str/bytes lines."""
    records = 0
    for number, line in enumerate(_bounded_lines(lines, limits.line_bytes, source), 1):
        if isinstance(line, bytes):
            line = line.decode("utf-8", "replace")
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except RecursionError:   # [[[[...: the decoder recurses once per level
            raise BadInput(f"{source}: line {number}: not JSON (nested too deeply)") from None
        except ValueError as exc:   # JSONDecodeError, or an integer of more digits than Python converts
            raise BadInput(f"{source}: line {number}: not JSON ({getattr(exc, 'msg', exc)})") from None
        if not isinstance(record, dict):
            raise BadInput(f"{source}: line {number}: expected a JSON object")
        records += 1
        if records > limits.events:
            raise BadInput(f"{source}: line {number}: more than {limits.events} records; refusing the trace")
        record["_line"] = number
        yield record


def _bounded_lines(lines, max_bytes: int, source: str):
    if hasattr(lines, "readline"):
        number = 0
        while True:
            line = lines.readline(max_bytes + 1)
            if not line:
                return
            number += 1
            if len(line.rstrip(b"\r\n" if isinstance(line, bytes) else "\r\n")) > max_bytes:
                raise BadInput(f"{source}: line {number}: longer than {max_bytes} bytes; refusing the trace")
            yield line
    else:
        for number, line in enumerate(lines, 1):
            if len(line) > max_bytes + 2:
                raise BadInput(f"{source}: line {number}: longer than {max_bytes} bytes; refusing the trace")
            yield line


class TraceFile:
    """An event trace on disk, parsed lazily as it is iterated: a replay holds the live set
    and its aggregates, never the trace."""

    def __init__(self, path, source: str, limits: Limits = LIMITS):
        self.path, self.source, self.limits = path, source, limits

    def __iter__(self):
        with open(self.path, "rb") as handle:
            yield from iter_event_lines(handle, self.source, self.limits)


def _int(record: dict, key: str, source: str, high: int = MAX_U64) -> int:
    """A non-negative integer field no larger than `high` (addresses and sizes are the
    driver's 64-bit values; a bigger one is a damaged or forged trace)."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadInput(f"{source}: line {record.get('_line', '?')}: {key!r} must be a non-negative integer, "
                       f"got {_short(value)}")
    if value > high:
        raise BadInput(f"{source}: line {record.get('_line', '?')}: {key!r} {value} is beyond {high}")
    return value


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _time(record: dict, source: str) -> float:
    value = record["t"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise BadInput(f"{source}: line {record.get('_line', '?')}: 't' must be a finite, non-negative number "
                       f"of seconds, got {_short(value)}")
    return float(value)


def check_settings(*, device: int, page_size: int, interval: float, capacity: int | None, base: int | None,
                   limits: Limits = LIMITS) -> None:
    """The command line's side of the model: what frag.bin's header must be able to hold."""
    if not 0 <= device <= MAX_DEVICE:
        raise BadInput(f"--gpu-id: must be between 0 and {MAX_DEVICE}, got {device}")
    if not 0 < page_size <= MAX_PAGE:
        raise BadInput(f"--page-size: must be between 1 B and {MAX_PAGE} B (1 GiB), got {page_size}")
    if not (math.isfinite(interval) and limits.min_interval_s <= interval <= limits.span_s):
        raise BadInput(f"--sample-interval: must be between {limits.min_interval_s:g} s and {limits.span_s:g} s, "
                       f"got {interval:g} s")
    if capacity is not None:
        _check_range(base or 0, capacity, "--capacity")


def _check_range(base: int, capacity: int, where: str) -> None:
    if capacity <= 0:
        raise BadInput(f"{where}: 'capacity' must be positive, got {capacity}")
    if base + capacity > ADDRESS_SPACE:
        raise BadInput(f"{where}: 'capacity' {capacity} from base {base:#x} runs past the 64-bit address space")


def profile_events(records, *, device: int = 0, page_size: int = 4096, interval: float = 0.01,
                   base: int | None = None, capacity: int | None = None, source: str = "trace",
                   limits: Limits = LIMITS) -> MemoryProfile:
    """Replay event records for one device and sample the address map every ``interval``
    seconds of trace time (records without "t" keep the current time).

    `records` is walked once, as a stream (a TraceFile, a generator, a list): what is kept
    is the live set and at most limits.samples samples, so memory does not grow with the
    trace's length.  The device record must come before the device's first alloc/free, as
    `seedance run --events` writes it (or --capacity gives the size)."""
    check_settings(device=device, page_size=page_size, interval=interval, capacity=capacity, base=base,
                   limits=limits)
    replay = _Replay(device, page_size, interval, base, capacity, source, limits)
    for record in records:
        replay.feed(record)
    return replay.finish()


class _Replay:
    def __init__(self, device, page_size, interval, base, capacity, source, limits):
        self.device, self.page_size, self.interval = device, page_size, interval
        self.base, self.capacity = base, capacity      # from the command line: they win over the trace
        self.source, self.limits = source, limits
        self.amap: AddressMap | None = None
        self.profile: MemoryProfile | None = None
        self.t0: float | None = None                   # the first event's time: sample 0's boundary
        self.t = 0.0
        self.device_seen = False

    def feed(self, record: dict) -> None:
        if record.get("dev", 0) != self.device:
            return
        kind = record.get("ev")
        if kind == "device":
            self._device_record(record)
        elif kind in ("alloc", "free"):
            self._event(kind, record)

    def _device_record(self, record: dict) -> None:
        if self.amap is not None or self.device_seen:
            return   # the first record of the device says its range; later ones change nothing
        self.device_seen = True
        if self.base is None:
            self.base = _int(record, "base", self.source)
        if self.capacity is None:
            self.capacity = _int(record, "capacity", self.source)
        _check_range(self.base, self.capacity, f"{self.source}: line {record.get('_line', '?')}")

    def _open_map(self, line) -> None:
        if self.capacity is None:
            where = f"line {line}: an alloc/free comes before" if line is not None else "no"
            raise BadInput(f"{self.source}: {where} {{\"ev\":\"device\",\"dev\":{self.device},...}} record "
                           "giving the device's base and capacity (or pass --capacity)")
        self.amap = AddressMap(self.base or 0, self.capacity, self.page_size, self.limits)
        self.profile = MemoryProfile(self.device, self.amap.base, self.capacity, self.page_size, self.interval,
                                     requested_interval=self.interval)

    def _event(self, kind: str, record: dict) -> None:
        line = record.get("_line", "?")
        if self.amap is None:
            self._open_map(line)
        if "t" in record:
            self.t = _time(record, self.source)
            if self.t0 is None:
                self.t0 = self.t
            if abs(self.t - self.t0) > self.limits.span_s:
                raise BadInput(f"{self.source}: line {line}: 't' {self.t:g} is {self.t - self.t0:g} s from the "
                               f"first event's; a trace may span at most {self.limits.span_s:g} s")
        elif self.t0 is None:
            self.t0 = self.t
        self._pass_boundaries()
        profile = self.profile
        profile.events += 1
        if kind == "alloc":
            self.amap.alloc(_int(record, "addr", self.source), _int(record, "size", self.source),
                            record.get("library"))
            if len(self.amap.sizes) > self.limits.live:
                raise BadInput(f"{self.source}: line {line}: more than {self.limits.live} live allocations on "
                               f"device {self.device}; refusing the trace")
        elif not self.amap.free(_int(record, "addr", self.source)):
            profile.unmatched_frees += 1

    def _boundaries_passed(self) -> int:
        """How many interval boundaries since t0 the current time has passed; the epsilon
        keeps 0.03 / 0.01 (2.9999...) at 3."""
        return max(0, math.floor((self.t - self.t0) / self.profile.interval + 1e-9))

    def _next_boundary(self, profile: MemoryProfile) -> float:
        return self.t0 + len(profile.samples) * profile.interval

    def _pass_boundaries(self) -> None:
        """One sample (the map as it stood) for each boundary passed, keeping room for the
        final sample; a trace longer than limits.samples intervals folds its timeline."""
        profile = self.profile
        while True:
            passed = self._boundaries_passed()
            if passed >= self.limits.samples:
                _fold(profile)
            elif len(profile.samples) < passed:   # len(samples) is the next boundary's index
                _sample(profile, self.amap, self._next_boundary, self.limits)
            else:
                return

    def finish(self) -> MemoryProfile:
        if self.amap is None:
            self._open_map(None)
        profile = self.profile
        if self.t0 is None:
            self.t0 = self.t
        # the final sample: the map at the end, at the trace's last time or the next boundary
        _sample(profile, self.amap, lambda p: max(self.t, self._next_boundary(p)), self.limits)
        profile.final = profile.samples[-1]
        return profile


def _fold(profile: MemoryProfile) -> None:
    """Keep every other sample and double the interval: sample i of the new timeline is
    sample 2i of the old one, so the samples still sit on the (new) boundaries."""
    profile.samples = profile.samples[::2]
    profile.extents = profile.extents[::2]
    profile.interval *= 2
    profile.map_extents = sum(len(e) for e in profile.extents) // EXTENT_BYTES


def _rank(metrics: Metrics) -> tuple:
    return (VERDICTS.index(metrics.verdict), -metrics.largest_free_ratio)


def _measure(amap: AddressMap) -> tuple:
    """(metrics at t=0, packed used extents) of the map, measured once per change: a long
    quiet stretch of trace time is many samples of one map."""
    cached = getattr(amap, "_measured", None)
    if cached is None or cached[0] != amap.changes:
        page = amap.page_size
        flat = [n for a, b in amap.used_extents() for n in ((a - amap.base) // page, (b - a) // page)]
        cached = (amap.changes, amap.metrics(0.0), struct.pack(f"<{len(flat)}Q", *flat))
        amap._measured = cached
    return cached[1], cached[2]


def _sample(profile: MemoryProfile, amap: AddressMap, when, limits: Limits = LIMITS) -> None:
    """Append the map's sample; `when(profile)` gives its time once the timeline has made
    room for it (folding moves the next boundary)."""
    measured, packed = _measure(amap)
    count = len(packed) // EXTENT_BYTES
    while profile.map_extents + count > limits.map_extents and len(profile.samples) > 1:
        _fold(profile)   # the maps kept for frag.bin stay within their budget
    metrics = replace(measured, t=when(profile))
    # the hole sites are those of the worst moment (the one the rule reports), not the end:
    # a program that frees everything at exit has no holes left to blame
    if profile.worst is None or _rank(metrics) > _rank(profile.worst):
        profile.worst = metrics
        profile.sites = sorted(amap.hole_sites().values(), key=lambda s: -s["hole_bytes"])
    if metrics.verdict == "danger":
        profile.danger_seconds += profile.interval
    profile.samples.append(metrics)
    profile.extents.append(packed)
    profile.map_extents += count


def worst_sample(profile: MemoryProfile) -> Metrics:
    """The sample with the worst verdict (the lowest largest-free ratio among equals), of
    all those taken: one the folded timeline dropped still counts."""
    return profile.worst if profile.worst is not None else max(profile.samples, key=_rank)


def memory_facts(profile: MemoryProfile, subject: dict) -> list:
    """One fact for rule gpu-memory-fragmented: the worst sample's metrics, since a program
    that fragments and then frees everything at exit ended healthy but ran in danger."""
    from ..model.report import Fact

    worst = worst_sample(profile)
    danger_time = profile.danger_seconds
    sites = [f"{s['site']} ({s['size_class']}: {s['holes']} holes, {s['hole_bytes']} B)" for s in profile.sites[:3]]
    data = {**worst.to_dict(), "device": profile.device, "capacity": profile.capacity,
            "page_size": profile.page_size, "final_verdict": profile.final.verdict,
            "samples": len(profile.samples), "danger_seconds": round(danger_time, 6),
            "hole_sites": profile.sites[:5], "hole_sites_text": "; ".join(sites) or "no allocation borders a hole",
            "ratio_pct": round(worst.largest_free_ratio * 100, 2),
            "mean_free_mib": round(worst.mean_free_block_bytes / MIB, 3)}
    return [Fact("gpu_memory_profile", dict(subject, device=profile.device), data, source="profile.memory")]
