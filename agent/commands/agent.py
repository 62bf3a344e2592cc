"""seedance agent: the resident agent (run it, or install it as a systemd user service)."""
from __future__ import annotations

import argparse
import json
import os
import sys

from ..model.errors import UsageError
from ._argtypes import bounded_int

_lines = bounded_int(0, 1_000_000)

EPILOG = """\
examples:
  seedance agent run                                   GC every 2s, check every 10m, probes when root
  seedance agent run --gc-interval 2s --metrics 127.0.0.1:9464 --probes off
  seedance agent run --otlp-endpoint http://127.0.0.1:4318
  seedance agent install --user                        write ~/.config/systemd/user/seedance-agent.service
  seedance agent install --user --print                show the unit instead of writing it
  seedance agent start                                 start it (systemctl --user start: returns once it serves)
  seedance agent status                                running? pid, uptime (exit 3 when not, as systemctl)
  seedance agent reload                                reload rules and agent.yaml (SIGHUP)
  seedance agent restart                               stop, then start
  seedance agent stop                                  stop it (systemctl --user stop when a user manager runs it)
  seedance agent logs -n 20 -f                         its log: the journal under systemd, else its log file
  seedance agent uninstall --user                      stop, disable, remove the unit, socket and state
  seedance agent uninstall --user --keep-state         ... but keep agent.db (findings, instance history)

The agent is a python process: `pidof seedance` finds nothing.  Without this command,
`pkill -HUP -f 'seedance agent run'` reloads it.
"""


def configure_parser(sub):
    parser = sub.add_parser("agent", help="The resident agent (systemd user service)",
                            description="The resident agent: reclaims the registry slots of dead instances and "
                                        "reports their leaked GPU memory, runs the trace probes and periodic "
                                        "checks, samples NVML, and serves status, Prometheus and OTLP.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="agent_command", metavar="ACTION", parser_class=type(parser))

    run = actions.add_parser("run", help="run the agent in the foreground (what the unit starts)",
                             epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _run_flags(run)
    run.set_defaults(execute=execute_run)

    install = actions.add_parser("install", help="write (and enable) the systemd user unit",
                                 epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    install.add_argument("--user", action="store_true", help="install as a user service (the supported mode)")
    install.add_argument("--print", dest="print_only", action="store_true", help="print the unit, write nothing")
    install.add_argument("--no-enable", action="store_true", help="write the unit but do not enable it")
    install.add_argument("--watchdog", default="30s", metavar="DURATION", help="WatchdogSec (default 30s)")
    _run_flags(install, defaults_for_unit=True)
    install.set_defaults(execute=execute_install)

    for name, help_text, execute in (
            ("start", "start the agent (systemctl --user start, or in the background with a log file)",
             execute_start),
            ("status", "is the agent running: pid, uptime, how it was started (exit 3 when not)", execute_status),
            ("stop", "stop the agent (systemctl --user stop, or SIGTERM to the process)", execute_stop),
            ("restart", "stop the agent if it runs, then start it (systemctl --user restart)", execute_restart),
            ("reload", "reload rules and agent.yaml (systemctl --user reload, or SIGHUP)", execute_reload),
            ("logs", "the agent's log: journalctl --user -u seedance-agent, else its log file", execute_logs)):
        action = actions.add_parser(name, help=help_text, epilog=EPILOG,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        action.add_argument("--user", action="store_true", help="the user service (the only mode; accepted "
                                                                "as systemctl --user takes it)")
        if name == "status":
            action.add_argument("--json", action="store_true", help="the state as JSON")
        if name == "logs":
            action.add_argument("-n", "--lines", type=_lines, default=50, metavar="N",
                                help="the last N lines (default 50)")
            action.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
        action.set_defaults(execute=execute)
    uninstall = actions.add_parser("uninstall", help="stop and disable the agent, remove its unit",
                                   epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    uninstall.add_argument("--user", action="store_true", help="the user service (required, as for install)")
    uninstall.add_argument("--keep-state", action="store_true",
                           help="keep the agent's state (agent.db: findings and instance history)")
    uninstall.set_defaults(execute=execute_uninstall)

    def no_action(args) -> int:
        raise UsageError("seedance agent: choose an action: run, install, start, status, stop, restart, reload, "
                         "logs or uninstall (see seedance agent --help)")

    parser.set_defaults(execute=no_action)


def _run_flags(parser, defaults_for_unit: bool = False):
    parser.add_argument("--gc-interval", metavar="DURATION",
                        help="reclaim dead instances' registry slots this often (default 2s)")
    parser.add_argument("--scan-interval", metavar="DURATION", help="periodic check interval (default 10m)")
    parser.add_argument("--sample-interval", metavar="DURATION", help="NVML sampling interval (default 10s)")
    parser.add_argument("--metrics", metavar="HOST:PORT",
                        help="serve Prometheus /metrics on this loopback address (e.g. 127.0.0.1:9464)")
    parser.add_argument("--metrics-per-pid", dest="metrics_per_pid", action="store_true", default=None,
                        help="one series per process in the per-process metrics (high cardinality; "
                             "default: summed by namespace, pod, container and command)")
    parser.add_argument("--probes", choices=("on", "off", "auto"),
                        help="trace probes: on (required), off, auto (when root + bcc allow; default)")
    parser.add_argument("--otlp-endpoint", metavar="URL", help="export metrics over OTLP/HTTP to this collector")
    parser.add_argument("--no-scan", dest="scan", action="store_false", default=None,
                        help="no periodic checks")
    parser.add_argument("--scan-path", dest="scan_paths", action="append", metavar="PATH",
                        help="check these paths periodically instead of the whole host (repeatable)")
    parser.add_argument("--rules", dest="rules_dir", metavar="DIR", help="rules directory (default: built in)")


def _flags(args) -> dict:
    return {"gc_interval": args.gc_interval, "scan_interval": args.scan_interval,
            "sample_interval": args.sample_interval, "metrics": args.metrics,
            "metrics_per_pid": args.metrics_per_pid, "probes": args.probes, "otlp_endpoint": args.otlp_endpoint,
            "scan": args.scan, "rules_dir": args.rules_dir,
            "scan_paths": [os.path.abspath(p) for p in args.scan_paths] if args.scan_paths else None}


def _unit_args(args) -> list[str]:
    from ..service.config import parse_duration

    words = []
    for flag, value in (("--gc-interval", args.gc_interval), ("--scan-interval", args.scan_interval),
                        ("--sample-interval", args.sample_interval), ("--metrics", args.metrics),
                        ("--probes", args.probes), ("--otlp-endpoint", args.otlp_endpoint),
                        ("--rules", os.path.abspath(args.rules_dir) if args.rules_dir else None)):
        if value is not None:
            if flag.endswith("interval"):
                parse_duration(value, flag)  # a bad duration fails now, not when systemd starts it
            words += [flag, value]
    if args.scan is False:
        words.append("--no-scan")
    if args.metrics_per_pid:
        words.append("--metrics-per-pid")
    for path in args.scan_paths or ():
        words += ["--scan-path", os.path.abspath(path)]
    return words


def execute_run(args) -> int:
    from ..service.daemon import Agent

    agent = Agent(_flags(args))
    return agent.run()


def execute_install(args) -> int:
    from ..service import unit
    from ..service.config import parse_duration

    if not args.user:
        raise UsageError("seedance agent install: only --user is supported (a systemd user service)")
    watchdog = parse_duration(args.watchdog, "--watchdog")
    if watchdog < 2:
        raise UsageError("--watchdog: must be at least 2s (the agent pings at half of it)")
    text = unit.render_unit(_unit_args(args), watchdog_sec=int(round(watchdog)),
                            allow_probes=os.geteuid() == 0 and args.probes != "off")
    if args.print_only:
        sys.stdout.write(text)
        return 0
    path = unit.user_unit_dir() / unit.UNIT_NAME
    backup = unit.write_unit(path, text)
    print(f"wrote {path}" + (f" (previous unit kept as {backup})" if backup else ""))
    check = unit.verify_unit(path)
    if check.available and not check.ok:
        print(f"seedance: warning: systemd-analyze verify --user: {check.output.splitlines()[0]}", file=sys.stderr)
    if args.no_enable:
        print("not enabled (--no-enable): systemctl --user enable --now seedance-agent.service")
        return 0
    running, why = unit.user_manager_running()
    if not running:
        print(f"no user manager is running ({why}): the unit is written but not enabled; "
              f"in a login session run: systemctl --user daemon-reload && "
              f"systemctl --user enable --now {unit.UNIT_NAME}")
        return 0
    for step in (("daemon-reload",), ("enable", "--now", unit.UNIT_NAME)):
        proc = unit.systemctl_user(*step)
        if proc.returncode != 0:
            reason = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            raise UsageError(f"systemctl --user {' '.join(step)}: {reason}")
    print(f"enabled and started {unit.UNIT_NAME} (systemctl --user status {unit.UNIT_NAME})")
    return 0


# -- lifecycle: systemctl --user when a user manager runs the unit, else the socket ------------
EXIT_NOT_RUNNING = 3  # systemctl status / LSB: "program is not running"
STOP_TIMEOUT_S = 20.0  # the unit's TimeoutStopSec


def _find():
    from ..service import unit
    from ..service.config import socket_path

    return unit.find_agent(socket_path())


def execute_status(args) -> int:
    from ..service import unit

    agent = _find()
    state = unit.unit_state()
    unit_path = unit.user_unit_dir() / unit.UNIT_NAME
    doc = {"running": agent is not None, "pid": agent.pid if agent else None,
           "socket": agent.socket if agent else None,
           "uptime_s": (agent.status.get("agent") or {}).get("uptime_s") if agent else None,
           "version": (agent.status.get("agent") or {}).get("version") if agent else None,
           "unit": str(unit_path) if unit_path.exists() else None, "unit_state": state}
    # the socket and unit paths come from the environment's directories, the version and
    # state from other processes: escaped as check escapes paths, so none forges a line
    from ..model.errors import escape_path

    if args.json:
        print(json.dumps(doc, indent=2))
    elif agent is None:
        print(f"seedance agent: inactive (no agent answers at {escape_path(_socket())})"
              + (f"; unit {escape_path(unit_path)} is installed ({escape_path(state or 'no user manager')})"
                 if doc["unit"] else ""))
    else:
        uptime = f", up {doc['uptime_s']:.0f} s" if isinstance(doc["uptime_s"], (int, float)) else ""
        how = f"unit {unit.UNIT_NAME} {escape_path(state)}" if state else "no user manager: started by hand"
        print(f"seedance agent: active (running), pid {agent.pid}{uptime}, version {escape_path(doc['version'])}")
        print(f"  socket {escape_path(agent.socket)}; {how}")
    return 0 if agent is not None else EXIT_NOT_RUNNING


def _socket() -> str:
    from ..service.config import socket_path
    return str(socket_path())


def execute_stop(args) -> int:
    import signal

    from ..service import unit

    state = unit.unit_state()
    if state in ("active", "activating", "reloading"):
        # the manager must stop it, or Restart= would bring it back
        proc = unit.systemctl_user("stop", unit.UNIT_NAME)
        if proc.returncode != 0:
            raise UsageError(f"systemctl --user stop {unit.UNIT_NAME}: "
                             f"{(proc.stderr.strip().splitlines() or [f'exit {proc.returncode}'])[-1]}")
        print(f"stopped {unit.UNIT_NAME} (systemctl --user stop)")
        return 0
    agent = _find()
    if agent is None:
        # as `systemctl stop` of an inactive unit: nothing to do is success
        print(f"seedance agent: not running (no agent answers at {_socket()}): nothing to stop")
        return 0
    os.kill(agent.pid, signal.SIGTERM)
    if not unit.wait_gone(agent.pid, STOP_TIMEOUT_S):
        raise UsageError(f"seedance agent stop: pid {agent.pid} still running {STOP_TIMEOUT_S:.0f} s after "
                         f"SIGTERM (kill -KILL {agent.pid} ends it)")
    print(f"stopped the agent (pid {agent.pid}, SIGTERM)")
    return 0


def execute_reload(args) -> int:
    import signal

    from ..model.errors import NotAvailable
    from ..service import unit

    if unit.unit_state() in ("active", "reloading"):
        # the unit's ExecReload (kill -HUP $MAINPID), with the manager showing "reloading"
        _systemctl_or_fail("reload", unit.UNIT_NAME)
        print(f"reloaded {unit.UNIT_NAME} (systemctl --user reload)")
        return 0
    agent = _find()
    if agent is None:
        raise NotAvailable(f"seedance agent reload: no agent running (no agent answers at {_socket()})")
    os.kill(agent.pid, signal.SIGHUP)  # what the unit's ExecReload sends
    print(f"asked the agent (pid {agent.pid}) to reload rules and agent.yaml (SIGHUP)")
    return 0


def _systemctl_or_fail(*words: str) -> None:
    from ..service import unit

    proc = unit.systemctl_user(*words)
    if proc.returncode != 0:
        raise UsageError(f"systemctl --user {' '.join(words)}: "
                         f"{(proc.stderr.strip().splitlines() or [f'exit {proc.returncode}'])[-1]}")


START_TIMEOUT_S = 30.0  # how long `agent start` waits for a hand-started agent's socket


def _unit_managed() -> bool:
    """A user manager runs and knows the unit: then it, and only it, starts and stops the agent."""
    from ..service import unit

    state = unit.unit_state()
    return state is not None and (unit.user_unit_dir() / unit.UNIT_NAME).exists()


def execute_start(args) -> int:
    import subprocess
    import time

    from ..model.errors import NotAvailable
    from ..service import unit

    if _unit_managed():
        # Type=notify: this returns once the agent said READY=1 (socket and /metrics up)
        _systemctl_or_fail("start", unit.UNIT_NAME)
        agent = _find()
        print(f"started {unit.UNIT_NAME} (systemctl --user start)" + (f", pid {agent.pid}" if agent else ""))
        return 0
    agent = _find()
    if agent is not None:
        print(f"seedance agent: already running (pid {agent.pid}): nothing to start")
        return 0
    # No user manager: start it in its own session, its log appended to a file `agent logs` reads.
    log = log_file()
    log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(log, "ab") as out:
        os.chmod(log, 0o600)
        child = subprocess.Popen([*unit.agent_command(), "agent", "run"], stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=out, start_new_session=True, close_fds=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        agent = _find()
        if agent is not None:
            print(f"started the agent (pid {agent.pid}, no user manager); its log: {log}")
            return 0
        if child.poll() is not None:
            raise NotAvailable(f"seedance agent start: the agent exited with status {child.returncode} before "
                               f"serving; see {log} (seedance agent logs)")
        time.sleep(0.1)
    raise NotAvailable(f"seedance agent start: pid {child.pid} did not answer at {_socket()} within "
                       f"{START_TIMEOUT_S:.0f} s; see {log}")


def log_file():
    """Where a hand-started agent (no user manager, so no journal) appends its log."""
    from ..service.config import state_dir

    return state_dir() / "agent.log"


def execute_restart(args) -> int:
    from ..service import unit

    if _unit_managed():
        _systemctl_or_fail("restart", unit.UNIT_NAME)
        agent = _find()
        print(f"restarted {unit.UNIT_NAME} (systemctl --user restart)" + (f", pid {agent.pid}" if agent else ""))
        return 0
    execute_stop(args)
    return execute_start(args)


def _journal_has_unit() -> bool:
    import shutil

    from ..service import unit

    return bool(shutil.which("journalctl")) and unit.unit_state() is not None and \
        (unit.user_unit_dir() / unit.UNIT_NAME).exists()


def execute_logs(args) -> int:
    import time

    from ..model.errors import NotAvailable
    from ..service import unit

    if _journal_has_unit():
        # the journal keeps each line's PRIORITY (the agent's "<N>" prefix): -p warning filters
        argv = ["journalctl", "--user", "-u", unit.UNIT_NAME, "--no-pager", "-n", str(args.lines)]
        if args.follow:
            argv.append("-f")
        sys.stdout.flush()
        os.execvp(argv[0], argv)
    log = log_file()
    try:
        handle = open(log, "rb")
    except FileNotFoundError:
        raise NotAvailable(f"seedance agent logs: no journal for {unit.UNIT_NAME} and no log file at {log} "
                           "(an agent run in a terminal logs to its stderr)") from None
    with handle:
        tail = _last_lines(handle, args.lines)
        out = sys.stdout.buffer
        out.write(tail)
        out.flush()
        while args.follow:
            chunk = handle.read(1 << 16)
            if chunk:
                out.write(chunk)
                out.flush()
            else:
                time.sleep(0.5)
    return 0


def _last_lines(handle, count: int, block: int = 1 << 16) -> bytes:
    """The last COUNT lines of an open binary file, reading backwards; leaves it at its end."""
    handle.seek(0, os.SEEK_END)
    end = position = handle.tell()
    data = b""
    while position > 0 and data.count(b"\n") <= count:
        step = min(block, position)
        position -= step
        handle.seek(position)
        data = handle.read(step) + data
    handle.seek(end)
    lines = data.splitlines(keepends=True)
    return b"".join(lines[-count:]) if count else b""


def execute_uninstall(args) -> int:
    from ..service import unit
    from ..service.config import socket_path, state_dir

    if not args.user:
        raise UsageError("seedance agent uninstall: only --user is supported (a systemd user service)")
    path = unit.user_unit_dir() / unit.UNIT_NAME
    running, _why = unit.user_manager_running()
    if running and path.exists():
        _systemctl_or_fail("disable", "--now", unit.UNIT_NAME)
        print(f"disabled and stopped {unit.UNIT_NAME}")
    elif _find() is not None:
        execute_stop(args)
    removed = [p for p in (path, path.with_name(path.name + ".bak")) if p.exists()]
    for item in removed:
        item.unlink()
        print(f"removed {item}")
    if running and removed:
        unit.systemctl_user("daemon-reload")
        # a unit that failed before it was removed stays listed as "not-found failed"
        unit.systemctl_user("reset-failed", unit.UNIT_NAME)
    if not removed:
        print(f"no unit at {path}: nothing to remove")
    # a socket left by an agent that was killed (a stopped one removes its own)
    sock = socket_path()
    if sock.is_socket():
        sock.unlink()
        print(f"removed {sock}")
    state = state_dir()
    # agent.db with its WAL and any copy moved aside as corrupt, and a hand-started agent's log
    agent_files = sorted([*state.glob("agent.db*"), *state.glob("agent.log*")]) if state.is_dir() else []
    if args.keep_state:
        print(f"kept the agent's state in {state} (--keep-state)")
        return 0
    gone = agent_files
    for item in gone:
        item.unlink()
    # the state directory is shared with quota's state: removed only when nothing else is left in it
    try:
        state.rmdir()
    except OSError:
        pass
    print(f"removed the agent's state in {state}" if gone else f"no agent state in {state}")
    return 0
