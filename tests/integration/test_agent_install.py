"""`seedance agent install --user` for real: the unit file it writes passes systemd-analyze."""
import shutil
import tempfile
from pathlib import Path

import pytest

from seedance.service import unit
from tests.conftest import run_cli


@pytest.fixture
def home():
    root = Path(tempfile.mkdtemp(prefix="sd-install-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _env(home):
    # no DBUS/XDG_RUNTIME_DIR of a session: like a container or an ssh without lingering
    return {"HOME": str(home), "XDG_CONFIG_HOME": "", "XDG_RUNTIME_DIR": "", "DBUS_SESSION_BUS_ADDRESS": ""}


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_install_writes_a_unit_that_verifies(home):
    proc = run_cli("agent", "install", "--user", "--gc-interval", "2s", "--metrics", "127.0.0.1:9464",
                   env=_env(home), timeout=120)
    assert proc.returncode == 0, proc.stderr
    path = home / ".config" / "systemd" / "user" / "seedance-agent.service"
    assert f"wrote {path}" in proc.stdout
    text = path.read_text()
    assert "--gc-interval 2s --metrics 127.0.0.1:9464" in text
    result = unit.verify_unit(path)
    assert result.ok, result.output
    assert "warning" not in proc.stderr
    running, _ = unit.user_manager_running(_env(home))
    if not running:
        assert "no user manager is running" in proc.stdout and "not enabled" in proc.stdout


def test_print_writes_nothing(home):
    proc = run_cli("agent", "install", "--user", "--print", env=_env(home))
    assert proc.returncode == 0 and proc.stdout.startswith("# Written by")
    assert not (home / ".config").exists()


def test_install_needs_user_and_valid_durations(home):
    proc = run_cli("agent", "install", env=_env(home))
    assert proc.returncode == 2 and "--user" in proc.stderr
    proc = run_cli("agent", "install", "--user", "--gc-interval", "soon", env=_env(home))
    assert proc.returncode == 2 and "not a duration" in proc.stderr
    assert not (home / ".config").exists()
