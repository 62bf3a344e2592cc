"""seedance fix handle-leak: settings written through the fix journal, undoable, loadable."""
import os

import pytest

from seedance.model.errors import BadInput, UsageError
from seedance.fix import handle_leak
from seedance.service import config


@pytest.fixture
def env(tmp_path, monkeypatch):
    values = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
              "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_RUNTIME_DIR": str(tmp_path / "rt")}
    for key, value in values.items():
        monkeypatch.setenv(key, value)  # the journal reads os.environ
    return values


def _agent_config(env):
    return config.build_config(config.read_config_file(config.agent_config_path(env)), {}, env={})


def test_per_instance_then_shared_then_undo(env, tmp_path):
    agent_yaml = config.agent_config_path(env)
    agent_yaml.parent.mkdir(parents=True)
    agent_yaml.write_text("# my agent settings\nagent:\n  scan_interval: 1h  # nightly-ish\n")
    result = handle_leak.apply("per-instance", None, env=env)
    assert sorted(result.changed) == sorted([str(agent_yaml), str(agent_yaml.with_name("shim.yaml"))])
    cfg = _agent_config(env)
    assert (cfg.handle_mode, cfg.gc_interval, cfg.scan_interval) == ("per-instance", 2.0, 3600.0)
    assert "# nightly-ish" in agent_yaml.read_text() and "# my agent settings" in agent_yaml.read_text()
    assert "handles: per-instance" in agent_yaml.with_name("shim.yaml").read_text()
    assert "no agent running" in result.agent
    first = result.journal_id

    again = handle_leak.apply("per-instance", "2s", env=env)
    assert again.changed == [] and again.journal_id is None  # idempotent: nothing rewritten

    shared = handle_leak.apply("shared", None, env=env)
    assert _agent_config(env).handle_mode == "shared"
    assert "handles: shared" in agent_yaml.with_name("shim.yaml").read_text()

    from seedance.fix.journal import Journal
    Journal().undo(shared.journal_id)
    assert _agent_config(env).handle_mode == "per-instance"
    Journal().undo(first)
    assert agent_yaml.read_text() == "# my agent settings\nagent:\n  scan_interval: 1h  # nightly-ish\n"
    assert not agent_yaml.with_name("shim.yaml").exists()


def test_dry_run_writes_nothing(env):
    result = handle_leak.apply("per-instance", "5s", dry_run=True, env=env)
    assert len(result.changed) == 2
    assert not config.agent_config_path(env).exists()


def test_bad_inputs_touch_nothing(env):
    with pytest.raises(UsageError):
        handle_leak.apply("per-instance", "often", env=env)
    with pytest.raises(UsageError):
        handle_leak.apply("private", None, env=env)
    path = config.agent_config_path(env)
    path.parent.mkdir(parents=True)
    path.write_text("agent: [not, a, mapping\n")
    with pytest.raises(BadInput, match="not rewritten"):
        handle_leak.apply("per-instance", None, env=env)
    assert path.read_text() == "agent: [not, a, mapping\n"
    assert not path.with_name("shim.yaml").exists()
