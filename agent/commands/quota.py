"""seedance quota: WorkloadQuotaPolicy on cgroups, bursting on PSI (notes 2.4)."""
from __future__ import annotations

import argparse
import json

from ._argtypes import positive_float

EPILOG = """\
examples:
  seedance quota apply encoders.yaml        validate, store and apply to running workloads
  seedance run --label app=encoder -- ./encode in.wav
  seedance quota list --json | jq '.[].workloads[].limits'
  seedance quota watch --interval 1         keep applying and bursting in the foreground
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
    watch.add_argument("--interval", type=positive_float, default=2.0, metavar="S", help="seconds between passes (default 2)")
    watch.add_argument("--duration", type=positive_float, metavar="S", help="stop after S seconds (default: until Ctrl-C)")
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
    import time

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
    parts = []
    if policy.cpu_millicores is not None:
        parts.append(f"cpu {policy.cpu_millicores}m")
    if policy.memory_bytes is not None:
        parts.append(f"memory {policy.memory_bytes} B")
    if policy.burstable:
        parts.append(f"burst cpu {policy.burst_cpu_millicores}m while {policy.pressure_key} < {policy.pressure_below:g}")
    return ", ".join(parts)


def _event_line(event: dict) -> str:
    from ..model.errors import escape_path

    return escape_path(_event_text(event))


def _event_text(event: dict) -> str:
    name = event["event"]
    if name == "placed":
        return (f"  placed workload {event['workload']} (pids {', '.join(map(str, event['pids']))}): {event['limits']}"
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

    if not entries:
        print("no quota policies (seedance quota apply FILE)")
        return
    # policy names and labels come from the policy files, workloads and limits from the
    # state file and cgroup files: each line is escaped as check escapes paths, so none of
    # them paints the terminal or forges a line
    for entry in entries:
        labels = ",".join(f"{k}={v}" for k, v in sorted(entry["match_labels"].items()))
        print(escape_path(f"{entry['name']}: selects {labels}; cpu {entry['cpu_millicores']}m, "
                          f"memory {entry['memory_bytes']}"
                          + (f", burst {entry['burst_cpu_millicores']}m" if entry["burstable"] else "")))
        for member in entry["workloads"]:
            state = "bursting" if member["bursting"] else "at quota"
            print(escape_path(f"  workload {member['workload']}: pids {member['pids']}, {state}, "
                              f"{member['limits']}"))
