from pathlib import Path

import pytest

from seedance.model.errors import BadInput, UsageError
from seedance.service import config


@pytest.mark.parametrize("text, seconds", [("2s", 2.0), ("500ms", 0.5), ("10m", 600.0), ("1h", 3600.0),
                                           ("3", 3.0), ("1.5s", 1.5), (4, 4.0)])
def test_parse_duration(text, seconds):
    assert config.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2x", "-1s", "0s", "s", "1 2s"])
def test_parse_duration_rejects(text):
    with pytest.raises(UsageError):
        config.parse_duration(text)


@pytest.mark.parametrize("seconds", [0.5, 2.0, 90.0, 600.0, 7200.0])
def test_format_duration_round_trips(seconds):
    assert config.parse_duration(config.format_duration(seconds)) == seconds


def test_xdg_paths_follow_environment(tmp_path):
    env = {"HOME": str(tmp_path / "h"), "XDG_STATE_HOME": str(tmp_path / "st"),
           "XDG_CONFIG_HOME": str(tmp_path / "cf"), "XDG_RUNTIME_DIR": str(tmp_path / "rt")}
    assert config.state_dir(env) == tmp_path / "st" / "seedance"
    assert config.agent_config_path(env) == tmp_path / "cf" / "seedance" / "agent.yaml"
    assert config.socket_path(env) == tmp_path / "rt" / "seedance" / "agent.sock"
    # the shim's registry directory order (shim/src/registry.c): explicit, XDG, then $HOME
    assert config.runtime_dir({**env, "SEEDANCE_RUNTIME_DIR": "/x/y"}) == Path("/x/y")
    assert config.runtime_dir({"HOME": "/h"}) == Path("/h/.local/state/seedance/run")
    # relative XDG values are invalid per the spec and fall back to $HOME
    env["XDG_STATE_HOME"] = "relative/dir"
    assert config.state_dir(env) == tmp_path / "h" / ".local" / "state" / "seedance"


def test_flags_override_file_and_env_fills_otlp(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("agent:\n  gc_interval: 5s\n  scan_interval: 1h\n  probes: off\n  handle_mode: per-instance\n")
    values = config.read_config_file(path)
    cfg = config.build_config(values, {"gc_interval": "1s"}, env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert cfg.gc_interval == 1.0 and cfg.source["gc_interval"] == "flag"
    assert cfg.scan_interval == 3600.0 and cfg.source["scan_interval"] == "file"
    assert cfg.probes == "off"  # YAML 1.1 reads a bare off as False; it must still mean "off"
    assert cfg.handle_mode == "per-instance"
    assert cfg.otlp_endpoint == "http://127.0.0.1:4318" and cfg.source["otlp_endpoint"] == "env"


def test_missing_file_is_defaults(tmp_path):
    assert config.read_config_file(tmp_path / "none.yaml") == {}
    assert config.build_config({}, {}, env={}).gc_interval == 2.0


@pytest.mark.parametrize("text", ["agent: [1, 2]\n", "gc_intervall: 2s\n", "a: [unclosed\n"])
def test_bad_config_file_is_one_line_bad_input(tmp_path, text):
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(BadInput) as info:
        config.read_config_file(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_bad_values_are_usage_errors():
    with pytest.raises(UsageError):
        config.build_config({"handle_mode": "sometimes"}, {}, env={})
    with pytest.raises(UsageError):
        config.build_config({}, {"probes": "maybe"}, env={})


def test_per_pid_series_are_off_unless_asked(tmp_path):
    path = tmp_path / "agent.yaml"
    assert config.load_config(path, {}).metrics_per_pid is False
    path.write_text("metrics_per_pid: true\n")
    assert config.load_config(path, {}).metrics_per_pid is True
    assert config.load_config(path, {}).to_dict()["metrics_per_pid"] is True  # what the collector reads
    path.write_text('metrics_per_pid: "no"\n')  # bool("no") would be True
    with pytest.raises(BadInput, match="metrics_per_pid: expected true or false"):
        config.load_config(path, {})
