"""seedance fix env-leak on real YAML configs: lazy ${VAR}, environment.d preload, undo."""
import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from tests.conftest import run_cli

CONFIG = """\
# seedance plugin config: comments and key order must survive
plugins:
  - name: audio-encoder   # the encoder
    version: "2.0.5"
    env:
      LD_PRELOAD: ${SHIMDIR}/libshim.so
      LD_LIBRARY_PATH: "$HOME/lib:/opt/x/lib"  # quoted, with a comment
    args:
      - --batch
      - "LD_LIBRARY_PATH=${CUDA_HOME}/lib64"
zeta: 1
alpha: 2   # not sorted
"""


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def shimdir():
    """A preload directory no other user can write: under root's home, not /tmp (1777)."""
    path = Path.home() / ".cache" / f"seedance-envleak-test-{os.getpid()}"
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o755)
    (path / "libshim.so").write_bytes(b"\x7fELF")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def setup(tmp_path, shimdir):
    config_dir = tmp_path / "config" / "seedance"
    config_dir.mkdir(parents=True)
    config = config_dir / "plugins.yaml"
    config.write_text(CONFIG)
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "SHIMDIR": str(shimdir), "HOME": os.environ.get("HOME", "/root")}
    return config, env, tmp_path / "config" / "environment.d" / "60-seedance.conf"


def env_leaks(config, env):
    proc = run_cli("check", "--report-json", "-", config, env=env)
    return [f for f in json.loads(proc.stdout)["findings"] if f["rule"] == "env-leak"]


def test_lazy_rewrite_keeps_comments_order_layout_and_undo_restores_bytes(setup):
    config, env, drop_in = setup
    original = config.read_bytes()
    assert len(env_leaks(config, env)) == 3
    proc = run_cli("fix", "env-leak", "--scope", "user", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "check again: 3 of 3 env-leak finding(s) gone, 0 remaining" in proc.stdout
    new = config.read_text()
    expected = (CONFIG.replace("${SHIMDIR}", "$${SHIMDIR}").replace('"$HOME/lib', '"$${HOME}/lib')
                .replace("${CUDA_HOME}", "$${CUDA_HOME}"))
    assert new == expected  # only the three values changed: every comment, key and space kept
    assert env_leaks(config, env) == []
    assert not drop_in.exists()
    assert run_cli("fix", "undo", env=env).returncode == 0
    assert config.read_bytes() == original


def test_inject_moves_the_preload_to_environment_d(setup, shimdir):
    config, env, drop_in = setup
    original = config.read_bytes()
    proc = run_cli("fix", "env-leak", "--scope", "user", "--inject", "LD_PRELOAD", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = (CONFIG.replace("      LD_PRELOAD: ${SHIMDIR}/libshim.so\n", "")
                .replace('"$HOME/lib', '"$${HOME}/lib').replace("${CUDA_HOME}", "$${CUDA_HOME}"))
    assert config.read_text() == expected  # the preload line gone, everything else as written
    lines = [l for l in drop_in.read_text().splitlines() if not l.startswith("#")]
    assert lines == ["LD_PRELOAD=${SHIMDIR}/libshim.so"]
    assert env_leaks(config, env) == []
    assert run_cli("fix", "undo", env=env).returncode == 0
    assert config.read_bytes() == original and not drop_in.exists()


def test_dry_run_writes_nothing(setup):
    config, env, drop_in = setup
    original = config.read_bytes()
    proc = run_cli("fix", "env-leak", "--scope", str(config), "--dry-run", env=env)
    assert proc.returncode == 0
    assert "+      LD_PRELOAD: $${SHIMDIR}/libshim.so" in proc.stdout
    assert config.read_bytes() == original and not (Path(env["XDG_STATE_HOME"]) / "seedance").exists()


def one_line_exit_2(proc):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_world_writable_preload_is_refused_and_nothing_touched(setup, shimdir):
    config, env, drop_in = setup
    original = config.read_bytes()
    os.chmod(shimdir, 0o777)
    proc = run_cli("fix", "env-leak", "--scope", "user", "--inject", "LD_PRELOAD", env=env)
    one_line_exit_2(proc)
    assert "world-writable" in proc.stderr
    assert config.read_bytes() == original and not drop_in.exists()


def test_missing_preload_is_refused(setup, shimdir):
    config, env, drop_in = setup
    (shimdir / "libshim.so").unlink()
    proc = run_cli("fix", "env-leak", "--scope", "user", "--inject", "LD_PRELOAD", env=env)
    one_line_exit_2(proc)
    assert "does not exist" in proc.stderr
    assert not drop_in.exists()


def test_yaml_that_does_not_parse_is_refused(setup):
    config, env, drop_in = setup
    bad = config.parent / "broken.yaml"
    bad.write_text("env:\n  LD_PRELOAD: ${HOME}/x.so\n   bad: [unclosed\n")
    before = {p.name: sha(p) for p in config.parent.iterdir()}
    proc = run_cli("fix", "env-leak", "--scope", "user", env=env)
    one_line_exit_2(proc)
    assert "broken.yaml" in proc.stderr and "YAML" in proc.stderr
    assert {p.name: sha(p) for p in config.parent.iterdir()} == before


def test_read_only_config_is_refused(setup):
    config, env, drop_in = setup
    os.chmod(config, 0o444)
    original = config.read_bytes()
    proc = run_cli("fix", "env-leak", "--scope", "user", env=env)
    one_line_exit_2(proc)
    assert "read-only" in proc.stderr
    assert config.read_bytes() == original
    assert stat.S_IMODE(os.stat(config).st_mode) == 0o444
