"""`seedance fix handle-leak`: per-instance handles plus the agent's collector, or back to shared.

The product notes' `seedance-fix handle-leak --mode=per-instance --gc-interval=2s` gives each
instance its own CUDA context and handles and runs a collector that releases the handles
of instances that have gone.  Here that is two settings files, both written through the fix
journal (backup, temp + fsync + rename, verify, undo with `seedance fix undo`):

  $XDG_CONFIG_HOME/seedance/agent.yaml   handle_mode, gc_interval: the agent's collector
  $XDG_CONFIG_HOME/seedance/shim.yaml    handles: the default `seedance run` gives the shim

and a running agent is asked to reload (the same as SIGHUP).  `--mode shared` reverts both
to shared handles; the collector keeps running, because a dead instance's slot must be
reclaimed in either mode.

Entry points for seedance.commands.fix: configure_parser(sub) adds the `handle-leak`
subcommand to fix's subparsers; main(args) -> int runs it; apply(...) is the core.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Mapping  # annotations only; importing typing is paid at every fix's start

from ..model.errors import BadInput, NotAvailable, UsageError
from ..model.record import NEW, Record

MODES = ("per-instance", "shared")

EPILOG = """\
examples:
  seedance fix handle-leak --mode per-instance --gc-interval 2s
  seedance fix handle-leak --mode shared          revert to shared handles
  seedance fix handle-leak --mode per-instance --dry-run
"""


class HandleLeakResult(Record):
    """What `fix handle-leak` changed, or would change."""
    _fields = ("mode", "gc_interval", "changed", "unchanged", "journal_id", "agent")

    def __init__(self, mode: str, gc_interval: str | None, changed: list = NEW, unchanged: list = NEW,
                 journal_id: str | None = None, agent: str = ""):
        self.mode = mode
        self.gc_interval = gc_interval
        self.changed = [] if changed is NEW else changed  # paths rewritten
        self.unchanged = [] if unchanged is NEW else unchanged  # paths that already said so
        self.journal_id = journal_id
        self.agent = agent  # what the running agent did


def configure_parser(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser("handle-leak", help="per-instance CUDA handles and the agent's leak collector",
                            description="Configure the agent and the shim's defaults for per-instance handles "
                                        "(--mode per-instance) or revert to shared handles (--mode shared).",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=MODES, required=True, help="per-instance handles, or shared (revert)")
    parser.add_argument("--gc-interval", metavar="DURATION",
                        help="how often the agent reclaims dead instances (default: 2s with per-instance)")
    parser.add_argument("--dry-run", action="store_true", help="show what would change, write nothing")
    parser.set_defaults(execute=main)
    return parser


def main(args) -> int:
    result = apply(args.mode, getattr(args, "gc_interval", None), dry_run=getattr(args, "dry_run", False),
                   argv=sys.argv[1:])
    verb = "would update" if getattr(args, "dry_run", False) else "updated"
    for path in result.changed:
        print(f"{verb} {path}")
    for path in result.unchanged:
        print(f"already set: {path}")
    if result.journal_id:
        print(f"journal entry {result.journal_id} (undo: seedance fix undo {result.journal_id})")
    if result.agent:
        print(result.agent)
    return 0


def shim_handles_default(env: Mapping[str, str] = os.environ) -> str:
    """The handles mode `seedance run` gives the shim when --handles is not given."""
    import yaml

    from ..files import yamlio

    path = _settings_paths(env)[1]
    try:
        doc = yamlio.load_file(path)  # bounded: size, depth, alias expansion (YAML is a graph)
    except FileNotFoundError:
        return "shared"
    except (OSError, yaml.YAMLError) as exc:
        raise BadInput(f"{path}: cannot read the shim defaults: {str(exc).splitlines()[0]}") from None
    mode = doc.get("handles", "shared") if isinstance(doc, dict) else None
    if mode not in MODES:
        raise BadInput(f"{path}: handles must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


def _settings_paths(env: Mapping[str, str]) -> tuple:
    from ..service.config import agent_config_path, config_dir

    return agent_config_path(env), config_dir(env) / "shim.yaml"


def _updated(path, section: str | None, values: dict) -> tuple[bytes | None, bytes]:
    """(old bytes or None, new bytes) with values merged in, keeping the user's comments."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    from ..files import yamlio

    yaml = YAML()
    yaml.preserve_quotes = True
    try:
        with open(path, "rb") as handle:
            old = handle.read(yamlio.MAX_BYTES + 1)  # more is refused by roundtrip_load
    except FileNotFoundError:
        old = None
    try:
        doc = yamlio.roundtrip_load(yaml, old, str(path)) if old else None
    except YAMLError as exc:
        raise BadInput(f"{path}: not valid YAML, not rewritten: {str(exc).splitlines()[0]}") from None
    if doc is None:
        doc = {}
    if not hasattr(doc, "items"):
        raise BadInput(f"{path}: expected a mapping, not rewritten")
    target = doc
    if section is not None:
        if section in doc and not hasattr(doc[section], "items"):
            raise BadInput(f"{path}: '{section}' is not a mapping, not rewritten")
        if section not in doc:
            doc[section] = {}
        target = doc[section]
    for key, value in values.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
    out = io.StringIO()
    yaml.dump(doc, out)
    return old, out.getvalue().encode()


def apply(mode: str, gc_interval: str | None = None, dry_run: bool = False, env: Mapping[str, str] = os.environ,
          argv=()) -> HandleLeakResult:
    from ..service.config import build_config, format_duration, parse_duration, read_config_file

    if mode not in MODES:
        raise UsageError(f"--mode: {mode!r} is not one of {', '.join(MODES)}")
    if gc_interval is None and mode == "per-instance":
        gc_interval = "2s"
    interval = format_duration(parse_duration(gc_interval, "--gc-interval")) if gc_interval else None
    agent_path, shim_path = _settings_paths(env)
    agent_values = {"handle_mode": mode}
    if interval:
        agent_values["gc_interval"] = interval
    plans = [(agent_path, _updated(agent_path, "agent", agent_values)),
             (shim_path, _updated(shim_path, None, {"handles": mode}))]
    result = HandleLeakResult(mode=mode, gc_interval=interval)

    def verify_agent(temp: str) -> None:
        from pathlib import Path  # here, not on the start of every `seedance fix` (its parser imports us)

        build_config(read_config_file(Path(temp)), {}, env={})  # the agent must be able to load it

    def verify_shim(temp: str) -> None:
        from ..files import yamlio
        if (yamlio.load_file(temp) or {}).get("handles") != mode:
            raise BadInput(f"{temp}: handles is not {mode}")

    todo = []
    for (path, (old, new)), verify in zip(plans, (verify_agent, verify_shim)):
        (todo.append((path, old, new, verify)) if old != new else result.unchanged.append(str(path)))
    result.changed = [str(path) for path, *_ in todo]
    if dry_run or not todo:
        return result
    from .journal import Journal

    with Journal().begin("handle-leak", argv=list(argv)) as entry:
        for path, old, new, verify in todo:
            if old is None:
                entry.create_file(str(path), new, mode=0o644, summary=f"handles: {mode}")
                verify(str(path))
            else:
                entry.replace_file(str(path), new, verify=verify, summary=f"handles: {mode}")
        result.journal_id = entry.id
    result.agent = _ask_agent_to_reload(env)
    return result


def _ask_agent_to_reload(env: Mapping[str, str]) -> str:
    from ..service.api import request
    from ..service.config import socket_path

    try:
        request(socket_path(env), "reload", timeout=5)
    except NotAvailable:
        return "no agent running: the settings apply when it starts (seedance agent run / install --user)"
    return "the running agent is reloading its config"
