"""The run report of `seedance run`: what the wrapped program did on each device.

Reads the shim's registry after the program ends (seedance.shim.Registry), turns what
the instances of this run still hold into `instance_leak` facts and quota refusals
into `instance_quota` facts, and lets the rule engine judge them (rules/runtime.yaml),
so `handle-leak` is a finding like every other.  Returns data; the command prints.
"""
from __future__ import annotations

import platform
import socket
from dataclasses import dataclass, field

from ..model.report import Fact, Report


@dataclass
class RunResult:
    argv: list[str]
    exit_code: int
    signal: int | None
    wrapped: bool
    why_unwrapped: str = ""
    shim: str = ""
    shim_version: str = ""
    registry: str = ""
    affinity: dict = field(default_factory=dict)
    mem_limit: dict = field(default_factory=dict)
    audit: bool = False
    follow_children: bool = False
    handles: str = "shared"
    events_file: str = ""
    events_written: int = 0
    wall_s: float = 0.0


def instance_facts(instances, leaks_by_slot, limits, peaks=None) -> list[Fact]:
    """instance_leak per (instance, device, library) still held; instance_quota per refusal."""
    facts = []
    peaks = peaks or {}
    for inst in instances:
        ended = "exited" if inst.state == "exited" else "killed"
        subject = {"pid": inst.pid, "exe": inst.exe}
        apis: dict[tuple, set] = {}
        for (device, library), held in sorted(leaks_by_slot.get(inst.slot, {}).items(),
                                              key=lambda kv: (kv[0][0], str(kv[0][1]))):
            facts.append(Fact("instance_leak", subject, {
                "pid": inst.pid, "exe": inst.exe, "bytes": int(held["bytes"]), "device": int(device),
                "library": library or "?", "allocations": int(held["allocations"]),
                "api": ",".join(sorted(held.get("apis", ()))), "exit": ended}, source="seedance.shim"))
            apis[(device, library)] = held.get("apis", set())
        for device, refused in sorted(inst.refused.items()):
            facts.append(Fact("instance_quota", subject, {
                "pid": inst.pid, "exe": inst.exe, "device": int(device), "refused": int(refused),
                "limit": int(limits.get(device, 0)), "peak": int(peaks.get(device, 0))},
                source="seedance.shim"))
    return facts


def leaks_with_apis(registry, slot) -> dict:
    out: dict = {}
    for a in registry.allocations(slot):
        entry = out.setdefault((a.device, a.library), {"bytes": 0, "allocations": 0, "apis": set()})
        entry["bytes"] += a.size
        entry["allocations"] += 1
        entry["apis"].add(a.api)
    return out


def build_report(result: RunResult, instances, leaks_by_slot, group, rules) -> Report:
    """``rules``: the loaded rules, or a callable that loads them; it is called only when
    there are facts to judge: compiling every rule's condition is a real share of a short
    run's exit, and a program the shim saw no instance of leaves nothing for them to judge."""
    limits = dict(group.limits) if group else {}
    facts = instance_facts(instances, leaks_by_slot, limits, dict(group.peak) if group else {})
    if facts and callable(rules):
        rules = rules()
    findings = rules.evaluate(facts) if facts else []

    devices: dict[int, dict] = {}

    def dev(d):
        return devices.setdefault(int(d), {
            "device": int(d), "peak_bytes": 0, "leaked_bytes": 0, "allocations_by_api": {},
            "allocations_by_library": {}, "quota_refusals": 0, "contexts": 0,
            "limit_bytes": int(limits.get(d, 0)) or None})

    for inst in instances:
        for d, n in inst.refused.items():
            dev(d)["quota_refusals"] += n
        for d, n in inst.contexts.items():
            dev(d)["contexts"] += n
        for (d, library), held in leaks_by_slot.get(inst.slot, {}).items():
            dev(d)["leaked_bytes"] += held["bytes"]
        # all-time counts are per instance; attribute them to the devices it used
        used = sorted(set(inst.current) | set(inst.refused) | set(inst.contexts)) or []
        for d in used[:1] if len(used) == 1 else []:
            for api, n in inst.api_calls.items():
                if api.startswith(("cuMemAlloc", "cuMemCreate")):
                    by_api = dev(d)["allocations_by_api"]
                    by_api[api] = by_api.get(api, 0) + n
            for lib, n in inst.library_allocs.items():
                by_lib = dev(d)["allocations_by_library"]
                by_lib[lib] = by_lib.get(lib, 0) + n
    if group:
        for d, peak in group.peak.items():
            dev(d)["peak_bytes"] = max(dev(d)["peak_bytes"], peak)
        # the group counts every member's refusals, those of members without a slot too
        for d, refused in group.refused.items():
            dev(d)["quota_refusals"] = max(dev(d)["quota_refusals"], refused)
    without_slot = (group.overflow_total + group.overflow_refused) if group else 0

    remap = []
    for inst in instances:
        if inst.visible is not None:
            remap.append({"pid": inst.pid, "devices_seen": len(inst.visible),
                          "logical_to_physical": {str(i): p for i, p in enumerate(inst.visible)},
                          "driver_devices": inst.ndevices})
    allocations_by_api: dict[str, int] = {}
    allocations_by_library: dict[str, int] = {}
    for inst in instances:
        for api, n in inst.api_calls.items():
            allocations_by_api[api] = allocations_by_api.get(api, 0) + n
        for lib, n in inst.library_allocs.items():
            allocations_by_library[lib] = allocations_by_library.get(lib, 0) + n

    report = Report(
        command="run",
        host={"hostname": socket.gethostname(), "kernel": platform.release(), "machine": platform.machine()},
        stats={"instances": len(instances), "instances_without_slot": without_slot,
               "exit_code": result.exit_code, "wall_s": round(result.wall_s, 3),
               "leaked_bytes": sum(d["leaked_bytes"] for d in devices.values()),
               "quota_refusals": sum(d["quota_refusals"] for d in devices.values())},
        extra={
            "run": {"argv": result.argv, "exit_code": result.exit_code, "signal": result.signal,
                    "wrapped": result.wrapped, "why_unwrapped": result.why_unwrapped or None,
                    "shim": result.shim, "shim_version": result.shim_version, "registry": result.registry,
                    "audit": result.audit, "follow_children": result.follow_children,
                    "handles": result.handles,
                    # processes that found the registry full: they shared the quota (peak and
                    # refusals above count them) but their allocations are not itemised
                    "instances_without_slot": without_slot,
                    "events_file": result.events_file or None, "events_written": result.events_written},
            "affinity": result.affinity,
            "mem_limit": result.mem_limit,
            "remap": remap,
            "devices": [devices[d] for d in sorted(devices)],
            "calls_by_api": allocations_by_api,
            "allocations_by_library": allocations_by_library,
            "instances": [{"pid": i.pid, "exe": i.exe, "state": i.state if i.state == "exited" else "killed",
                           "visible": i.visible, "held_at_exit": i.current,
                           "untracked_allocations": i.untracked, "events_dropped": i.events_dropped}
                          for i in instances],
        },
    )
    report.add(findings)
    return report
