"""Where the agent's files live, durations, and the agent config file.

The config file ($XDG_CONFIG_HOME/seedance/agent.yaml) is what `seedance fix handle-leak`
writes and what SIGHUP re-reads; command-line flags override it.  Paths follow the XDG base
directory spec so a user unit, a root DaemonSet and a test in a temp dir all agree on them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Mapping

from ..model.errors import BadInput, UsageError

MAX_DURATION_S = 30 * 86400.0

HANDLE_MODES = ("per-instance", "shared")
PROBE_MODES = ("auto", "on", "off")


def parse_duration(text, what: str = "duration") -> float:
    """'2s', '500ms', '1m30s', '1h' or a bare number of seconds -> seconds (> 0): the grammar
    of seedance.model.units, which every command shares; at most 30 days, as a timer the
    agent arms must end."""
    from ..model.units import parse_duration as parse

    try:
        return parse(text, what, maximum=MAX_DURATION_S)
    except BadInput as exc:
        raise UsageError(exc.message) from None


def format_duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    if seconds >= 1 and float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{int(round(seconds * 1000))}ms"


def _home(env: Mapping[str, str]) -> Path:
    return Path(env.get("HOME") or os.path.expanduser("~"))


def _xdg(env: Mapping[str, str], name: str, fallback: str) -> Path:
    value = env.get(name, "")
    # The spec says relative values are invalid and must be ignored.
    if value and os.path.isabs(value):
        return Path(value)
    return _home(env) / fallback


def config_dir(env: Mapping[str, str] = os.environ) -> Path:
    return _xdg(env, "XDG_CONFIG_HOME", ".config") / "seedance"


def state_dir(env: Mapping[str, str] = os.environ) -> Path:
    return _xdg(env, "XDG_STATE_HOME", ".local/state") / "seedance"


def runtime_dir(env: Mapping[str, str] = os.environ) -> Path:
    """Where the status socket lives: the same directory as the shim's registry.

    The same order as the shim's seedance_registry_path() (shim/src/registry.c), so the
    agent, `seedance run` and `seedance status` always meet: SEEDANCE_RUNTIME_DIR, then
    $XDG_RUNTIME_DIR/seedance, then ~/.local/state/seedance/run (cron, a bare container).
    """
    explicit = env.get("SEEDANCE_RUNTIME_DIR", "")
    if explicit:
        return Path(explicit)
    value = env.get("XDG_RUNTIME_DIR", "")
    if value:
        return Path(value) / "seedance"
    return _home(env) / ".local" / "state" / "seedance" / "run"


def agent_config_path(env: Mapping[str, str] = os.environ) -> Path:
    return config_dir(env) / "agent.yaml"


def socket_path(env: Mapping[str, str] = os.environ) -> Path:
    return runtime_dir(env) / "agent.sock"


@dataclass(frozen=True)
class AgentConfig:
    gc_interval: float = 2.0
    scan_interval: float = 600.0
    sample_interval: float = 10.0
    metrics: str | None = None          # "127.0.0.1:9464"; None = no exposition
    # one series per pid in the per-process metric families; off, they are summed by
    # workload (namespace, pod, container, command), as a pid per job run would otherwise
    # add series without bound
    metrics_per_pid: bool = False
    probes: str = "auto"                # auto: attach when root + bcc allow it
    otlp_endpoint: str | None = None
    handle_mode: str = "shared"
    scan: bool = True
    scan_paths: tuple = ()              # empty: the whole host, as `seedance check` does
    rules_dir: str | None = None
    source: dict = field(default_factory=dict, compare=False)  # key -> "file"|"flag"|"env"

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "source"}
        for key in ("gc_interval", "scan_interval", "sample_interval"):
            out[key] = format_duration(out[key])
        out["scan_paths"] = list(out["scan_paths"])
        return out


_FILE_KEYS = {"gc_interval", "scan_interval", "sample_interval", "metrics", "metrics_per_pid", "probes",
              "otlp_endpoint", "handle_mode", "scan", "scan_paths", "rules_dir"}


def read_config_file(path: Path) -> dict:
    """The agent.yaml mapping, validated; a missing file is an empty mapping."""
    import yaml

    from ..files import yamlio

    try:
        text = yamlio.read_text(path)  # size-capped, UTF-8 or one BadInput line
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise BadInput(f"{path}: {exc.strerror or exc}") from None
    try:
        doc = yamlio.load(text, str(path)) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark else ""
        raise BadInput(f"{path}:{where} not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(doc, Mapping):
        raise BadInput(f"{path}: expected a mapping of agent settings")
    agent = doc.get("agent", doc)
    if not isinstance(agent, Mapping):
        raise BadInput(f"{path}: 'agent' must be a mapping")
    unknown = set(agent) - _FILE_KEYS
    if unknown:
        raise BadInput(f"{path}: unknown agent setting(s) {', '.join(sorted(map(str, unknown)))}")
    return dict(agent)


def load_config(path: Path, flags: Mapping, env: Mapping[str, str] = os.environ) -> AgentConfig:
    """agent.yaml merged with the flags; a bad value in the file names the file."""
    values = read_config_file(path)
    try:
        build_config(values, {}, env)
    except UsageError as exc:
        raise BadInput(f"{path}: {exc}") from None
    return build_config(values, flags, env)


def build_config(file_values: Mapping, flags: Mapping, env: Mapping[str, str] = os.environ) -> AgentConfig:
    """Defaults < config file < environment (OTLP only) < command-line flags."""
    merged: dict = {}
    source: dict = {}
    for origin, values in (("file", file_values), ("flag", flags)):
        for key, value in values.items():
            if value is not None:
                merged[key] = value
                source[key] = origin
    if "otlp_endpoint" not in merged:
        endpoint = env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if endpoint:
            merged["otlp_endpoint"] = endpoint
            source["otlp_endpoint"] = "env"
    for key in ("metrics", "otlp_endpoint", "rules_dir", "handle_mode"):
        # A number or a list here would reach the servers as-is and crash a reload.
        value = merged.get(key)
        if value is not None and not isinstance(value, str) and not (key == "metrics" and value is False):
            raise UsageError(f"{key.replace('_', '-')}: expected text, not {value!r}")
    for key in ("gc_interval", "scan_interval", "sample_interval"):
        if key in merged:
            merged[key] = parse_duration(merged[key], key.replace("_", "-"))
    if merged.get("probes") is not None:
        probes = merged["probes"]
        if isinstance(probes, bool):  # YAML reads a bare on/off as a boolean
            probes = "on" if probes else "off"
        if probes not in PROBE_MODES:
            raise UsageError(f"probes: {probes!r} is not one of {', '.join(PROBE_MODES)}")
        merged["probes"] = probes
    if merged.get("handle_mode") is not None and merged["handle_mode"] not in HANDLE_MODES:
        raise UsageError(f"handle_mode: {merged['handle_mode']!r} is not one of {', '.join(HANDLE_MODES)}")
    if "scan" in merged:
        merged["scan"] = bool(merged["scan"])
    if "metrics_per_pid" in merged and not isinstance(merged["metrics_per_pid"], bool):
        # bool("no") is True: a quoted value would turn the high-cardinality series on
        raise UsageError(f"metrics_per_pid: expected true or false, not {merged['metrics_per_pid']!r}")
    if "scan_paths" in merged:
        paths = merged["scan_paths"]
        if isinstance(paths, str):
            paths = [paths]
        if not isinstance(paths, (list, tuple)) or not all(isinstance(p, str) for p in paths):
            raise UsageError("scan_paths: expected a list of paths")
        merged["scan_paths"] = tuple(paths)
    if merged.get("metrics") in ("", "off", False):
        merged["metrics"] = None
    return replace(AgentConfig(), **merged, source=source)
