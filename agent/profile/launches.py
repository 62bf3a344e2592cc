"""Kernel-launch attribution (product notes 2.3): who launches how often, and what it costs
in energy.

Input: the launch events of `seedance run --events` (docs/profile.md)
  {"t":S,"ev":"launch","api":"cuLaunchKernel","library":"/path/libx.so"}
timestamped by the shim on CLOCK_MONOTONIC, per calling library (the return address of
the call resolved to its object).  Per library (and per plugin, where an installed
plugin's directory holds the library):

  launches_per_s     launches / (last - first launch) (0 for a single launch)
  intervals          the distribution of gaps between consecutive launches (µs):
                     p10/p50/p90/p99/max and a log2 histogram
  coverage           the share of the profile's time bins (--bin, 10 ms) that hold at
                     least one launch of the library: how much of the run it was launching
                     (kernel durations are not observable from the host side)
  energy_j           power samples are steps: sample i's watts hold from t_i to t_i+1
                     (an energy counter's difference, where the source has one); each step's
                     joules go to the libraries in proportion to their launches inside it,
                     steps without a launch to "idle"

Power timestamps are wall clock; the trace's start record carries both clocks
({"kind":"start","t":MONOTONIC,"wall":EPOCH}), which aligns them.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from ..model.errors import BadInput
from .memory import LIMITS

LAUNCH_BOUND_US = 50.0      # notes 2.3: below this median gap, launch overhead dominates
SM_UNDERUSED = 0.30
MAX_SPAN_S = LIMITS.span_s
MIN_BIN_S = LIMITS.min_interval_s
MAX_TIMELINE_BINS = 10_000  # the picture's bins: a long trace gets wider bins, not a longer list


@dataclass(frozen=True)
class LibraryLaunches:
    library: str
    plugin: str | None
    launches: int
    first_t: float
    last_t: float
    launches_per_s: float
    interval_us: dict          # p10, p50, p90, p99, max, mean
    histogram: list            # [{"le_us": 2**k, "count": n}]
    coverage: float
    energy_j: float | None = None
    energy_share: float | None = None

    def to_dict(self) -> dict:
        return {"library": self.library, "plugin": self.plugin, "launches": self.launches,
                "first_t": self.first_t, "last_t": self.last_t, "launches_per_s": self.launches_per_s,
                "interval_us": self.interval_us, "histogram": self.histogram, "coverage": self.coverage,
                "energy_j": self.energy_j, "energy_share": self.energy_share}


@dataclass
class LaunchProfile:
    libraries: list = field(default_factory=list)    # LibraryLaunches, most launches first
    span_s: float = 0.0
    bin_s: float = 0.01
    launches: int = 0
    energy_j: float | None = None
    idle_energy_j: float | None = None
    power_source: str = ""
    power_note: str = ""
    sm_active: float | None = None
    sm_note: str = ""
    power: list = field(default_factory=list)         # [(t monotonic, watts)] for the timeline
    events_dropped: int = 0

    def to_dict(self) -> dict:
        return {"launches": self.launches, "span_s": self.span_s, "bin_s": self.bin_s,
                "libraries": [lib.to_dict() for lib in self.libraries],
                "energy": {"source": self.power_source or None, "total_j": self.energy_j,
                           "idle_j": self.idle_energy_j, "note": self.power_note or None},
                "sm_activity": {"observed": self.sm_active is not None, "mean": self.sm_active,
                                "note": self.sm_note or None}}


def percentile(sorted_values: list, q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an ascending list."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def _bin(offset: float, bin_s: float) -> int:
    """The bin of a time offset; the epsilon keeps 0.4 / 0.01 (39.999...) in bin 40."""
    return math.floor(offset / bin_s + 1e-9)


def launch_events(records, source: str = "trace") -> tuple[list, float | None]:
    """(launch records, wall - monotonic offset or None) from run --events records."""
    launches, offset = [], None
    for record in records:
        if record.get("kind") == "start" and _seconds(record.get("t")) and _seconds(record.get("wall")):
            offset = record["wall"] - record["t"]
        if record.get("ev") != "launch":
            continue
        t = record.get("t")
        if not _seconds(t):
            raise BadInput(f"{source}: line {record.get('_line', '?')}: a launch needs a time 't' in seconds "
                           "(finite, non-negative)")
        if record.get("result", 0) not in (0, None):
            continue
        # only what the profile reads: the rest of a run --events record is not kept per launch
        launches.append({"t": t, "library": record.get("library")})
    return launches, offset


def _seconds(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0


def plugin_owners() -> list[tuple[str, str]]:
    """(directory, "name version") of the installed plugins: a library under the directory
    belongs to that plugin."""
    try:
        from ..plugins.store import Store
        return [(str(p.path.resolve()) + "/", f"{p.name} {p.version}") for p in Store().installed()]
    except Exception:  # no store, unreadable manifests: attribution stays per library
        return []


def profile_launches(launches, *, bin_s: float = 0.01, power=None, offset: float | None = None,
                     owners=None) -> LaunchProfile:
    """Per-library figures of launch records; `power` a profile.power.PowerLog (wall clock)
    aligned through `offset` (wall - monotonic)."""
    if not MIN_BIN_S <= bin_s <= MAX_SPAN_S:
        raise BadInput(f"--bin must be between {MIN_BIN_S:g} s and {MAX_SPAN_S:g} s")
    by_lib: dict[str, list] = {}
    for record in launches:
        by_lib.setdefault(record.get("library") or "unknown", []).append(float(record["t"]))
    profile = LaunchProfile(bin_s=bin_s, launches=sum(len(v) for v in by_lib.values()))
    if not by_lib:
        return _attach_power(profile, {}, power, offset)
    start = min(min(v) for v in by_lib.values())
    end = max(max(v) for v in by_lib.values())
    profile.span_s = end - start
    if profile.span_s > MAX_SPAN_S:   # the same cap as a memory trace's (docs/profile.md)
        raise BadInput(f"launches span {profile.span_s:g} s of 't'; a trace may span at most {MAX_SPAN_S:g} s")
    bins_total = _bin(end - start, bin_s) + 1
    owners = plugin_owners() if owners is None else owners
    for library, times in by_lib.items():
        times.sort()
        gaps = sorted((b - a) * 1e6 for a, b in zip(times, times[1:]))
        span = times[-1] - times[0]
        histogram: dict[int, int] = {}
        for gap in gaps:
            bucket = 1 << max(0, math.ceil(math.log2(gap))) if gap > 1 else 1
            histogram[bucket] = histogram.get(bucket, 0) + 1
        bins = {_bin(t - start, bin_s) for t in times}
        plugin = next((name for prefix, name in owners if library.startswith(prefix)), None)
        profile.libraries.append(LibraryLaunches(
            library=library, plugin=plugin, launches=len(times), first_t=times[0], last_t=times[-1],
            launches_per_s=(len(times) - 1) / span if span > 0 else 0.0,
            interval_us={"p10": percentile(gaps, 10), "p50": percentile(gaps, 50), "p90": percentile(gaps, 90),
                         "p99": percentile(gaps, 99), "max": gaps[-1] if gaps else 0.0,
                         "mean": sum(gaps) / len(gaps) if gaps else 0.0, "count": len(gaps)},
            histogram=[{"le_us": k, "count": histogram[k]} for k in sorted(histogram)],
            coverage=len(bins) / bins_total))
    profile.libraries.sort(key=lambda lib: (-lib.launches, lib.library))
    return _attach_power(profile, by_lib, power, offset)


def _attach_power(profile: LaunchProfile, by_lib: dict, power, offset) -> LaunchProfile:
    if power is None:
        profile.power_note = "power not observed (no NVML, no --power-csv or --dcgm)"
        profile.sm_note = "SM activity not observed (no DCGM profiling metric: --dcgm)"
        return profile
    profile.power_source = power.source
    if power.sm_active:
        profile.sm_active = sum(v for _, v in power.sm_active) / len(power.sm_active)
    else:
        profile.sm_note = f"SM activity not observed: {power.why_no_sm}"
    if offset is None:
        profile.power_note = "power not aligned: the trace has no clock anchor (its start record lacks t and wall)"
        return profile
    steps = [(s.t - offset, s.watts, s.energy_j) for s in power.samples]
    profile.power = [(t, w) for t, w, _ in steps]
    if len(steps) < 2:
        profile.power_note = "one power sample: no interval to integrate"
        return profile
    sorted_times = {lib: sorted(times) for lib, times in by_lib.items()}
    energy = {lib: 0.0 for lib in by_lib}
    total = idle = 0.0
    for (t0, watts, e0), (t1, _, e1) in zip(steps, steps[1:]):
        joules = (e1 - e0) if (e0 is not None and e1 is not None and e1 >= e0) else watts * (t1 - t0)
        total += joules
        counts = {lib: bisect.bisect_left(times, t1) - bisect.bisect_left(times, t0)
                  for lib, times in sorted_times.items()}
        launched = sum(counts.values())
        if not launched:
            idle += joules
            continue
        for lib, n in counts.items():
            energy[lib] += joules * n / launched
    profile.energy_j, profile.idle_energy_j = total, idle
    attributed = total - idle
    profile.libraries = [LibraryLaunches(**{**lib.__dict__, "energy_j": energy.get(lib.library, 0.0),
                                            "energy_share": energy.get(lib.library, 0.0) / attributed
                                            if attributed > 0 else None})
                         for lib in profile.libraries]
    return profile


def launch_facts(profile: LaunchProfile, subject: dict) -> list:
    """launch-bound per library (two launches at least, so an interval exists), and one
    sm-underused fact for the device when a profiling metric was observed."""
    from ..model.report import Fact

    facts = []
    for lib in profile.libraries:
        if lib.launches < 2:
            continue
        data = {"library": lib.library, "plugin": lib.plugin or "", "owner": lib.plugin or lib.library,
                "launches": lib.launches, "median_interval_us": lib.interval_us["p50"],
                "p90_interval_us": lib.interval_us["p90"], "launches_per_s": round(lib.launches_per_s, 3),
                "coverage": round(lib.coverage, 4), "threshold_us": LAUNCH_BOUND_US,
                "energy_j": lib.energy_j}
        facts.append(Fact("gpu_launch_profile", dict(subject, library=lib.library), data, source="profile.launches"))
    data = {"observed": profile.sm_active is not None, "sm_active": profile.sm_active,
            "sm_active_pct": round(profile.sm_active * 100, 1) if profile.sm_active is not None else None,
            "threshold": SM_UNDERUSED, "source": profile.power_source or "none", "note": profile.sm_note}
    facts.append(Fact("gpu_sm_activity", dict(subject), data, source="profile.launches"))
    return facts


def timeline_png(profile: LaunchProfile, launches, target, title: str) -> None:
    """Launches per library per bin on top (one line each), power below, one time axis
    (seconds from the first launch)."""
    import io

    from ..model.extras import pyplot

    plt = pyplot("the launch timeline picture")
    times = [float(r["t"]) for r in launches]
    t0 = min(times + [t for t, _ in profile.power]) if (times or profile.power) else 0.0
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 5.4), dpi=110,
                                      gridspec_kw={"height_ratios": [3, 2]})
    last = max(times + [t for t, _ in profile.power]) if (times or profile.power) else 0.0
    # the profile's bin, or wider where the span would need more than MAX_TIMELINE_BINS
    bin_s = max(profile.bin_s, (last - t0) / MAX_TIMELINE_BINS)
    nbins = min(int((last - t0) / bin_s), MAX_TIMELINE_BINS) + 2
    for lib in profile.libraries[:8]:
        counts = [0] * nbins     # every bin, empty ones too, so a one-bin burst still shows
        for r in launches:
            if (r.get("library") or "unknown") == lib.library:
                counts[min(int((float(r["t"]) - t0) / bin_s), nbins - 1)] += 1
        top.step([i * bin_s for i in range(nbins)], counts, where="post",
                 label=(lib.plugin or lib.library.rsplit("/", 1)[-1]))
    top.set_yscale("symlog", linthresh=10)
    top.set_ylabel(f"launches / {bin_s * 1000:g} ms")
    top.set_title(title)
    if profile.libraries:
        top.legend(loc="upper right", fontsize=8)
    if profile.power:
        bottom.step([t - t0 for t, _ in profile.power], [w for _, w in profile.power], where="post", color="#d62728")
        bottom.set_ylabel("power (W)")
    else:
        bottom.text(0.5, 0.5, profile.power_note or "power not observed", ha="center", va="center",
                    transform=bottom.transAxes)
        bottom.set_yticks([])
    bottom.set_xlabel("time (s from the first launch)")
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", metadata={"Software": "seedance profile launches"})
    plt.close(fig)
    target.write_bytes(buffer.getvalue())
