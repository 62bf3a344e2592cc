"""seedance quota: WorkloadQuotaPolicy on cgroups, bursting on PSI (notes 2.4)."""
from __future__ import annotations

import argparse
import json

from ..model.units import duration_type

EPILOG = """\
examples:
  seedance quota apply encoders.yaml        validate, store and apply to running workloads
  seedance run --label app=encoder -- ./encode in.wav
  seedance quota list --json | jq '.[].workloads[].limits'
  seedance quota watch --interval 1s       keep applying and bursting in the foreground
  seedance quota remove encoders            put every workload back where it was

A workload is a process started by `seedance run --label KEY=VALUE` (and its children).
Limits go to a cgroup of its own nested under the one it ran in: cgroup v2 cpu.max,
memory.max, memory.high where v2 carries the controllers, else v1 cpu.cfs_quota_us,
memory.limit_in_bytes, memory.soft_limit_in_bytes.  A burstable workload gets its burst
CPU while the named pressure (the cgroup's own PSI, else /proc/pressure) stays below the
threshold.  The agent runs the same loop (`seedance agent run`).
"""


def configure_parser(sub) -> None:
    parser = sub.add_parser("quota", help="Workload quotas on cgroups, bursting on PSI",
                            description="Apply WorkloadQuotaPolicy files to labelled workloads.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=type(parser))
    apply = actions.add_parser("apply", help="validate, store and apply a policy")
    apply.add_argument("file", metavar="FILE", help="a WorkloadQuotaPolicy YAML file")
    apply.add_argument("--dry-run", action="store_true", help="validate and show the limits; apply nothing")
    apply.add_argument("--json", action="store_true", help="events as JSON")
    listing = actions.add_parser("list", help="policies, their workloads and current limits")
    listing.add_argument("--json", action="store_true")
    remove = actions.add_parser("remove", help="undo a policy: workloads return to their cgroups")
    remove.add_argument("name", metavar="NAME")
    watch = actions.add_parser("watch", help="apply and burst continuously in the foreground")
    watch.add_argument("--interval", type=duration_type("--interval"), default=2.0, metavar="DURATION",
                       help="time between passes (500ms, 2s; a bare number is seconds; default 2s)")
    watch.add_argument("--duration", type=duration_type("--duration"), metavar="DURATION",
                       help="stop after DURATION (default: until Ctrl-C)")
    watch.add_argument("--json", action="store_true", help="one JSON line per change")
    parser.set_defaults(execute=execute)


def execute(args) -> int:
    from ..model.errors import UsageError
    from ..quota.controller import QuotaController, QuotaStore

    if not args.action:
        raise UsageError("quota: give an action: apply, list, remove or watch (see seedance quota --help)")
    controller = QuotaController(QuotaStore())
    if args.action == "apply":
        return _apply(controller, args)
    if args.action == "list":
        entries = controller.listing()
        if args.json:
            print(json.dumps(entries, indent=2))
        else:
            _render_list(entries)
        return 0
    if args.action == "remove":
        events = controller.remove(args.name)
        from ..model.errors import escape_path

        print(escape_path(f"removed policy {args.name}: {len(events)} workload(s) returned to their cgroups"))
        return 0
    return _watch(controller, args)


def _apply(controller, args) -> int:
    from ..files import yamlio
    from ..model.errors import escape_path
    from ..quota.controller import load_policy_text

    text = yamlio.read_text(args.file)
    policy = load_policy_text(text, escape_path(args.file))
    if args.dry_run:
        print(json.dumps(policy.to_dict(), indent=2) if args.json
              else escape_path(f"policy {policy.name} is valid: {_limits(policy)}"))
        return 0
    backend = controller.backend  # refuse before storing anything where cgroups cannot enforce it
    with controller.store.locked():
        controller.store.save_policy(policy, text)
    events = controller.tick(only_policy=policy.name)
    if args.json:
        print(json.dumps({"policy": policy.to_dict(), "backend": backend.name, "events": events}, indent=2))
        return 0
    print(escape_path(f"policy {policy.name} stored ({_limits(policy)}), enforced with {backend.name}"))
    for event in events:
        print(_event_line(event))
    if not any(e["event"] == "placed" for e in events):
        print(escape_path("no running workload matches it yet: `seedance run --label "
                          + ",".join(f"{k}={v}" for k, v in sorted(policy.match_labels.items()))
                          + " -- CMD` starts one"))
    return 0


def _watch(controller, args) -> int:
    import sys
    import time

    from ..model.errors import escape_path
    from ..model.units import format_duration

    # what this loop enforces, before the first pass: a watch over no policy, or on a backend
    # the user did not expect, would otherwise look the same as one with nothing to do
    policies = sorted(controller.store.policies())
    backend = controller.backend
    print(escape_path(f"seedance quota watch: {len(policies)} polic{'y' if len(policies) == 1 else 'ies'} "
                      f"({', '.join(policies) or 'none: seedance quota apply FILE'}), every "
                      f"{format_duration(args.interval)}, "
                      + (f"for {format_duration(args.duration)}" if args.duration else "until Ctrl-C")
                      + f", enforced with {backend.name}"), file=sys.stderr, flush=True)
    deadline = time.monotonic() + args.duration if args.duration else None
    try:
        while True:
            for event in controller.tick():
                print(json.dumps(event) if args.json else _event_line(event), flush=True)
            if deadline is not None and time.monotonic() >= deadline:
                return 0
            time.sleep(args.interval if deadline is None else max(0.0, min(args.interval, deadline - time.monotonic())))
    except KeyboardInterrupt:
        return 0


def _limits(policy) -> str:
    from ..model.units import format_size

    parts = []
    if policy.cpu_millicores is not None:
        parts.append(f"cpu {policy.cpu_millicores}m")
    if policy.memory_bytes is not None:
        parts.append(f"memory {format_size(policy.memory_bytes)}")
    if policy.burstable:
        parts.append(f"burst cpu {policy.burst_cpu_millicores}m while {policy.pressure_key} < {policy.pressure_below:g}")
    return ", ".join(parts)


def _settings(limits: dict) -> str:
    """The backend's limit files or properties as they read (cpu.max=50000 100000, ...)."""
    return ", ".join(f"{key}={value}" for key, value in limits.items()) or "-"


def _event_line(event: dict) -> str:
    from ..model.errors import escape_path

    return escape_path(_event_text(event))


def _event_text(event: dict) -> str:
    name = event["event"]
    if name == "placed":
        return (f"  placed workload {event['workload']} (pids {', '.join(map(str, event['pids']))}): "
                f"{_settings(event['limits'])}"
                + (f" (not enforced: {event['enforcement']})" if event.get("enforced") is False else ""))
    if name in ("burst", "unburst"):
        verb = "raised to" if name == "burst" else "lowered to"
        return (f"  {event['policy']}: workload {event['workload']} {verb} {event['cpu_millicores']}m "
                f"({event['pressure_key']} = {event['pressure']:g}, threshold {event['threshold']:g})")
    if name == "released":
        return f"  {event['policy']}: workload {event['workload']} released"
    return f"  {event.get('policy', '?')}: {name}: {event.get('reason', '')}"


def _render_list(entries) -> None:
    from ..model.errors import escape_path
    from ..model.units import format_size
    from .status import _table

    if not entries:
        print("no quota policies (seedance quota apply FILE)")
        return
    # policy names and labels come from the policy files, workloads and limits from the
    # state file and cgroup files: each cell is escaped as check escapes paths, so none of
    # them paints the terminal or forges a line
    for entry in entries:
        labels = ",".join(f"{k}={v}" for k, v in sorted(entry["match_labels"].items()))
        quota = [f"cpu {entry['cpu_millicores']}m" if entry["cpu_millicores"] is not None else "",
                 f"memory {format_size(entry['memory_bytes'])}" if entry["memory_bytes"] is not None else "",
                 f"burst {entry['burst_cpu_millicores']}m" if entry["burstable"] else ""]
        print(escape_path(f"{entry['name']}: selects {labels}; {', '.join(filter(None, quota))}"))
        if not entry["workloads"]:
            print(escape_path(f"  no running workload (seedance run --label {labels} -- CMD starts one)"))
            continue
        rows = [[member["workload"], ",".join(map(str, member["pids"])) or "-",
                 "bursting" if member["bursting"] else "at quota",
                 "-" if member["cpu_millicores"] is None else f"{member['cpu_millicores']}m",
                 _settings(member["limits"])] for member in entry["workloads"]]
        for line in _table(["WORKLOAD", "PIDS", "STATE", "CPU", "LIMITS"], rows).splitlines():
            print("  " + line)
