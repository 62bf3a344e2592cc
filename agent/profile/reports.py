"""Each `seedance profile` action, from its source to a judged report.

The source is a live program under the shim (profile.live), a trace of `seedance run
--events`, a torch memory snapshot or a plugin's bench callable; the measurement becomes
facts, the rule engine judges them, and the caller gets the profile and the Report back
to write and render.  Progress goes through the caller's ``step(label)`` (a context
manager) and notes through ``notice(line)``: nothing here prints.
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field

from ..model.errors import BadInput, NotAvailable, escape_path


def _no_step(label: str):
    return contextlib.nullcontext()


def _no_notice(line: str) -> None:
    return None


def parse_interval(text: str, what: str = "--sample-interval") -> float:
    """10ms, 0.5s, 500us or a bare number of seconds: seedance.model.units' durations."""
    from ..model.units import parse_duration

    return parse_duration(text, what)


# --- launches ------------------------------------------------------------------------------------

@dataclass
class LaunchesProfiled:
    profile: object            # profile.launches.LaunchProfile
    launches: list             # the launch records the profile was made of (for the timeline)
    report: object             # model.report.Report
    exit_code: int | None = None   # the live program's, when it was run


def read_power_log(gpu_id: int, power_csv: str | None = None, dcgm: str | None = None):
    """The power samples of a file source (nvidia-smi CSV or dcgm-exporter scrapes), or None."""
    from . import power

    if power_csv:
        with open(power_csv, "rb") as handle:
            return power.read_nvidia_smi_csv(handle.read().decode("utf-8", "replace"), gpu_id,
                                             escape_path(power_csv))
    if dcgm:
        with open(dcgm, "rb") as handle:
            return power.read_dcgm_scrapes(handle.read().decode("utf-8", "replace"), gpu_id, escape_path(dcgm))
    return None


def profile_launches_report(cmd: list, *, from_trace: str | None, log, gpu_id: int, bin_s: float,
                            interval: float, step=_no_step, notice=_no_notice) -> LaunchesProfiled:
    """Kernel launches per calling library, from a trace or from CMD run under the shim, with
    energy from LOG (a file source) or live NVML power; judged by launch-bound/sm-underused."""
    from ..judge.engine import load_rules
    from ..model.report import Report
    from . import launches as launch_profile
    from . import memory

    if from_trace:
        source = escape_path(from_trace)
        # streamed: only the launch records are kept, not the allocations around them
        launches, offset = launch_profile.launch_events(memory.TraceFile(from_trace, source), source)
        subject, exit_code = {"trace": from_trace}, None
    else:
        (launches, offset), exit_code, log = _launches_live(cmd, gpu_id, interval, log, step, notice)
        subject = {"argv": cmd}
    with step("attributing launches"):
        profile = launch_profile.profile_launches(launches, bin_s=bin_s, power=log, offset=offset)
    report = Report(command="profile launches", stats={"launches": profile.launches,
                                                       "libraries": len(profile.libraries)},
                    extra={"profile": {"launches": profile.to_dict()}})
    report.add(load_rules().evaluate(launch_profile.launch_facts(profile, subject)))
    return LaunchesProfiled(profile, launches, report, exit_code)


def _launches_live(cmd, gpu_id, interval, log, step, notice):
    """-- CMD under the shim with its events drained (every 10 ms: a launch storm fills the
    2048-event ring quickly) into a private temporary file; live NVML power when no file
    source was given."""
    import os
    import tempfile

    from ..run.events import start_record
    from . import launches as launch_profile
    from . import live, memory, power

    sampler = power.NvmlSampler(gpu_id) if log is None else None
    with tempfile.TemporaryDirectory(prefix="seedance-launches-") as private:   # 0700
        path = os.path.join(private, "events.jsonl")
        with open(path, "w", encoding="utf-8") as stream:
            # the same start record as run --events: both clocks, to align power samples
            stream.write(json.dumps(start_record(cmd)) + "\n")
            tick = (lambda registry, slots, t: sampler.take()) if sampler is not None and sampler.nvml else None
            with step(f"profiling {escape_path(' '.join(cmd))[:60]}"):
                code, _wall = live.run_wrapped(cmd, interval=interval, on_tick=tick, events_stream=stream,
                                               drain_interval=0.01, notice=notice)
        launched = launch_profile.launch_events(memory.TraceFile(path, "live"), "live")
    if sampler is not None:
        if sampler.nvml and len(sampler.log.samples) >= 2:
            log = sampler.log
        else:
            log = None
    return launched, code, log


# --- memory --------------------------------------------------------------------------------------

@dataclass
class MemoryProfiled:
    profile: object            # profile.memory.MemoryProfile
    report: object             # model.report.Report
    encoded: bytes             # the frag.bin of every sample's page map
    exit_code: int = 0         # the live program's (0 for an offline source or --pid)
    stats: dict = field(default_factory=dict)


@dataclass
class MemorySource:
    """Where the allocations come from: one of these."""
    cmd: list = field(default_factory=list)
    pid: int | None = None
    from_trace: str | None = None
    from_torch_snapshot: str | None = None


def profile_memory_report(source: MemorySource, *, device: int, page: int, interval: float,
                          capacity: int | None, step=_no_step, notice=_no_notice) -> MemoryProfiled:
    """One device's address map replayed and sampled every interval, judged by
    gpu-memory-fragmented."""
    from . import memory

    if source.pid or source.cmd:
        return _memory_live(source, device, page, interval, capacity, step, notice)
    if source.from_trace:
        label = escape_path(source.from_trace)
        records = memory.TraceFile(source.from_trace, label)   # streamed: the replay keeps the live set only
        subject = {"trace": source.from_trace}
    else:
        from .torch_snapshot import read_snapshot, snapshot_records
        label = escape_path(source.from_torch_snapshot)
        records = snapshot_records(read_snapshot(source.from_torch_snapshot, label), device, label)
        subject = {"snapshot": source.from_torch_snapshot}
    with step(f"profiling {label}"):
        profile = memory.profile_events(records, device=device, page_size=page, interval=interval,
                                        capacity=capacity, source=label)
    return _judge_memory(profile, subject)


def _memory_live(source, device, page, interval, capacity, step, notice) -> MemoryProfiled:
    """-- CMD under the shim, or --pid PID already under it: the registry's allocation
    records of the device, sampled every interval (profile.live)."""
    from . import live, memory

    label = f"profiling pid {source.pid}" if source.pid else f"profiling {escape_path(' '.join(source.cmd))[:60]}"
    with step(label):
        if source.pid:
            sampled = live.sample_pid(source.pid, device=device, interval=interval, notice=notice)
            subject = {"pid": source.pid}
        else:
            sampled = live.sample_command(source.cmd, device=device, interval=interval, notice=notice)
            subject = {"argv": source.cmd}
    records = sampled.records
    if not records:   # nothing allocated on that device: the empty map still has a size
        from .devices import DriverDevices
        records = [DriverDevices().record(device)]
        records[0].setdefault("base", 0)
        if "capacity" not in records[0] and capacity is None:
            raise BadInput(f"profile memory: the program allocated nothing on device {device} and "
                           "the driver does not say its capacity (pass --capacity)")
    profile = memory.profile_events(records, device=device, page_size=page, interval=interval,
                                    capacity=capacity, source="live")
    profiled = _judge_memory(profile, subject, stats={"live_samples": sampled.samples,
                                                      "wall_s": round(sampled.wall_s, 6)})
    if not source.pid:
        profiled.exit_code = sampled.exit_code
    return profiled


def _judge_memory(profile, subject, stats=None) -> MemoryProfiled:
    from ..judge.engine import load_rules
    from ..model.report import Report
    from . import fragbin, memory

    report = Report(command="profile memory", stats={"events": profile.events, "samples": len(profile.samples),
                                                     **(stats or {})},
                    extra={"profile": {"memory": profile.to_dict()}})
    report.add(load_rules().evaluate(memory.memory_facts(profile, subject)))
    return MemoryProfiled(profile, report, fragbin.encode(profile))


# --- calls ---------------------------------------------------------------------------------------

@dataclass
class CallsProfiled:
    manifest: object           # the plugin's manifest
    graph: object              # profile.callgraph.CallGraph
    report: object             # model.report.Report


def profile_calls_report(plugin: str, batch: int) -> CallsProfiled:
    """The plugin's bench callable run once on a batch of BATCH requests under the profiling
    hook; its call graph judged by plugin-redundant-path."""
    from ..judge.engine import load_rules
    from ..model.report import Report
    from .calls_report import callgraph_facts, profile_plugin

    manifest, graph = profile_plugin(plugin, batch)
    facts = callgraph_facts(manifest, graph, batch)
    report = Report(command="profile calls", stats={"calls": len(graph.calls), "input": batch},
                    extra={"profile": {"callgraph": {"plugin": manifest.name, "version": manifest.version,
                                                     **graph.to_dict()}}})
    report.add(load_rules().evaluate(facts))
    return CallsProfiled(manifest, graph, report)


def call_graph_svg(profiled: CallsProfiled) -> bytes:
    """The call graph drawn by graphviz, redundant paths in red."""
    import shutil

    from .callgraph import to_dot

    dot = to_dot(profiled.graph, f"{profiled.manifest.name} {profiled.manifest.version}: call graph, "
                                 "redundant paths in red")
    if not shutil.which("dot"):
        raise NotAvailable("profile calls --svg: graphviz's `dot` is not installed (apt-get install graphviz)")
    svg = dot.pipe(format="svg")
    # mark the picture as ours so a rerun may replace it (seedance.render.output recognises this)
    return svg.replace(b"<svg ", b"<!-- seedance profile calls -->\n<svg ", 1)
