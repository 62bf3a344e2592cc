"""seedance status: instances, devices, leaks and findings, read from the agent's socket."""
from __future__ import annotations

import argparse
import json
import sys
import time

from ..model.errors import escape_path

EPILOG = """\
examples:
  seedance status                 tables: agent, instances, devices, leaks, findings
  seedance status --json | jq '.leaks[]'

exit status: 0 the agent answered, 3 no agent is running (as systemctl status), 2 it
cannot be asked (another user's agent, no answer).
"""


def configure_parser(sub):
    parser = sub.add_parser("status", help="Show instances, devices, leaks and findings from the agent",
                            description="Ask the running agent (over its unix socket in $XDG_RUNTIME_DIR) for "
                                        "its instances, devices, leaks and latest findings.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the agent's status document as JSON")
    parser.set_defaults(execute=execute)


def execute(args) -> int:
    from ..model.errors import NotAvailable, NotRunning
    from ..service.api import request
    from ..service.config import socket_path

    path = socket_path()
    try:
        status = request(path, "status")
    except NotAvailable as exc:
        # no socket, or one nobody listens on: not running (exit 3, as systemctl status);
        # an agent of another user, or one that does not answer, stays exit 2
        if not _listening(path):
            raise NotRunning(exc.message) from None
        raise
    if args.json:
        json.dump(status, sys.stdout, indent=2, sort_keys=False, default=str)
        sys.stdout.write("\n")
        return 0
    sys.stdout.write(render(status))
    return 0


def _listening(path) -> bool:
    import socket

    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        probe.connect(str(path))
        return True
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
        return False
    except OSError:  # permission denied, ...: something is there that we cannot ask
        return True
    finally:
        probe.close()


def _bytes(value) -> str:
    if value is None:
        return "-"
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(value)


def _table(headers: list[str], rows: list[list]) -> str:
    # command lines and paths come from other processes: escape control characters
    cells = [[escape_path(str(c)) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines) + "\n"


def _ago(ts) -> str:
    if not ts:
        return "-"
    seconds = max(0, time.time() - float(ts))
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def _text(value) -> str:
    """A value of the agent's status on one line: paths (the state directory), reasons (an
    NVML or registry error) and addresses come from disk and other processes."""
    return escape_path(str(value))


def render(status: dict) -> str:
    agent = status.get("agent", {})
    counters = status.get("counters", {})
    config = agent.get("config", {})
    out = [f"agent pid {_text(agent.get('pid'))}  up {_text(agent.get('uptime_s'))}s  "
           f"gc every {_text(config.get('gc_interval'))}  "
           f"handles {_text(config.get('handle_mode'))}  probes {_text(agent.get('probes', {}).get('state'))}  "
           f"nvml {_text(agent.get('nvml', {}).get('state'))}  metrics {_text(agent.get('metrics') or 'off')}\n",
           f"registry {_text(status.get('registry', {}).get('state'))}  "
           f"reclaimed {_text(counters.get('slots_reclaimed', 0))}  leaks {_text(counters.get('leaks_reported', 0))} "
           f"({_bytes(counters.get('leaked_bytes', 0))})  state {_text(agent.get('state_db'))}\n"]
    if agent.get("state_moved_aside"):
        out.append(f"  state: the previous database could not be read and was moved aside to "
                   f"{_text(agent['state_moved_aside'])}\n")
    reason = status.get("registry", {}).get("reason")
    if reason:
        out.append(f"  registry: {_text(reason)}\n")

    instances = status.get("instances", [])
    out.append(f"\nINSTANCES ({len(instances)})\n")
    out.append(_table(["SLOT", "PID", "ALLOCATED", "DEVICES", "COMMAND"],
                      [[i.get("slot"), i.get("pid"), _bytes(i.get("allocated_bytes")),
                        ",".join(map(str, i.get("devices", []))) or "-", i.get("command", "")]
                       for i in instances]) if instances else "  none\n")

    devices = status.get("devices", [])
    out.append(f"\nDEVICES ({len(devices)})\n")
    if devices:
        out.append(_table(["GPU", "UTIL", "MEMORY", "POWER", "PROCS", "NAME"],
                          [[d.get("index"), "-" if d.get("utilization") is None else f"{d['utilization'] * 100:.0f}%",
                            f"{_bytes(d.get('memory_used'))} / {_bytes(d.get('memory_total'))}",
                            "-" if d.get("power_watts") is None else f"{d['power_watts']:.0f} W",
                            len(d.get("processes", [])), d.get("name", "")] for d in devices]))
    else:
        out.append(f"  none ({_text(agent.get('nvml', {}).get('reason') or 'no NVML samples yet')})\n")

    leaks = status.get("leaks", [])
    out.append(f"\nLEAKS ({_text(status.get('history', {}).get('leaked', len(leaks)))} recorded, latest first)\n")
    out.append(_table(["ENDED", "PID", "LEAKED", "COMMAND"],
                      [[_ago(l.get("ended")), l.get("pid"), _bytes(l.get("bytes")), l.get("command", "")]
                       for l in leaks[:20]]) if leaks else "  none\n")

    findings = status.get("findings", [])
    scan = status.get("scan", {})
    out.append(f"\nFINDINGS ({len(findings)} active; last check {_ago(scan.get('at'))})\n")
    out.append(_table(["SEVERITY", "RULE", "FROM", "MESSAGE"],
                      [[f.get("severity"), f.get("rule"), f.get("origin"), f.get("message", "")[:100]]
                       for f in findings[:30]]) if findings else "  none\n")
    return "".join(out)
