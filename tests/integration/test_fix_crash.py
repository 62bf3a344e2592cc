"""Crash safety: SIGKILL the fixer at every step of a rewrite (SEEDANCE_FIX_CRASH_AT).

After each kill, every file is either its original bytes or the verified result; the next
seedance run recovers the interrupted journal entry, and undo restores the original sha256.
"""
import hashlib
import json
import os
import subprocess
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import run_cli

SITE = Path(sysconfig.get_paths()["purelib"])
CU12 = SITE / "nvidia" / "cuda_runtime" / "lib"
STEPS = ["after-backup", "after-temp-write", "after-fsync", "after-verify", "after-rename", "after-commit"]

pytestmark = pytest.mark.skipif(not (CU12 / "libcudart.so.12").exists() or
                                not Path("/usr/local/cuda/lib64/libcudart.so.13").exists(),
                                reason="needs the cu12 runtime wheel and the CUDA 13 toolkit")


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def temps(directory):
    return [n for n in os.listdir(directory) if ".seedance-tmp" in n]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    d = tmp_path_factory.mktemp("crash")
    (d / "kern.c").write_text("int cudaGetDeviceCount(int*);\nint kern(void){int n=0; cudaGetDeviceCount(&n); return n;}\n")
    (d / "app.c").write_text("int cudaGetDeviceCount(int*); int kern(void);\nint app(void){int n; cudaGetDeviceCount(&n); return kern();}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", d / "libkern.so", d / "kern.c", f"-L{CU12}",
                    "-l:libcudart.so.12", f"-Wl,-rpath,{CU12}"], check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", d / "libapp.so", d / "app.c", "-L/usr/local/cuda/lib64",
                    "-l:libcudart.so.13", f"-L{d}", "-lkern", f"-Wl,-rpath,{d}"], check=True)
    original = (d / "libkern.so").read_bytes()
    # the verified result, from one uninterrupted run (the edit is deterministic)
    env = {"XDG_STATE_HOME": str(d / "state0"), "LD_LIBRARY_PATH": ""}
    proc = run_cli("fix", "cuda-mismatch", "--auto-relink", d / "libapp.so", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = sha(d / "libkern.so")
    assert run_cli("fix", "undo", env=env).returncode == 0
    assert (d / "libkern.so").read_bytes() == original
    return {"dir": d, "original": hashlib.sha256(original).hexdigest(), "result": result}


@pytest.mark.parametrize("step", STEPS)
def test_relink_killed_at_each_step(scenario, step, tmp_path):
    d, kern = scenario["dir"], scenario["dir"] / "libkern.so"
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "LD_LIBRARY_PATH": ""}
    proc = run_cli("fix", "cuda-mismatch", "--auto-relink", d / "libapp.so",
                   env={**env, "SEEDANCE_FIX_CRASH_AT": step})
    assert proc.returncode == -9, proc.stdout + proc.stderr  # really killed there
    assert sha(kern) in (scenario["original"], scenario["result"])
    expected_after_crash = scenario["result"] if step in ("after-rename", "after-commit") else scenario["original"]
    assert sha(kern) == expected_after_crash

    history = run_cli("fix", "history", "--json", env=env)  # any run recovers the open entry
    assert history.returncode == 0, history.stderr
    [entry] = json.loads(history.stdout)
    assert not temps(d)
    if step == "after-commit":
        assert entry["status"] == "committed" and sha(kern) == scenario["result"]
    else:
        assert entry["status"] == "rolled-back" and sha(kern) == scenario["original"]
        assert "recovered" in history.stderr

    undo = run_cli("fix", "undo", env=env)
    if step == "after-commit":
        assert undo.returncode == 0, undo.stderr
    else:
        assert undo.returncode == 2 and "nothing to undo" in undo.stderr
    assert sha(kern) == scenario["original"]


@pytest.mark.parametrize("step", ["after-backup", "after-verify", "after-rename"])
def test_undo_right_after_a_crash_restores_the_original(scenario, step, tmp_path):
    d, kern = scenario["dir"], scenario["dir"] / "libkern.so"
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "LD_LIBRARY_PATH": ""}
    proc = run_cli("fix", "cuda-mismatch", "--auto-relink", d / "libapp.so",
                   env={**env, "SEEDANCE_FIX_CRASH_AT": step})
    assert proc.returncode == -9
    undo = run_cli("fix", "undo", env=env)
    assert undo.returncode == 0, undo.stderr
    assert sha(kern) == scenario["original"] and not temps(d)


@pytest.mark.parametrize("step", STEPS)
def test_env_leak_with_drop_in_killed_at_each_step(step, tmp_path):
    """Two files in one entry (the config and the environment.d drop-in)."""
    home = Path.home() / ".cache" / f"seedance-crash-{os.getpid()}-{step}"
    home.mkdir(parents=True, exist_ok=True)
    try:
        shim = home / "libshim.so"
        shim.write_bytes(b"\x7fELF")
        os.chmod(home, 0o755)
        config_dir = tmp_path / "config" / "seedance"
        config_dir.mkdir(parents=True)
        config = config_dir / "plugins.yaml"
        config.write_text("# plugins\nenv:\n  LD_PRELOAD: ${SHIMDIR}/libshim.so  # the shim\n"
                          "  LD_LIBRARY_PATH: $HOME/lib\norder: [b, a]\n")
        original = sha(config)
        env = {"XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config"),
               "SHIMDIR": str(home)}
        drop_in = tmp_path / "config" / "environment.d" / "60-seedance.conf"
        proc = run_cli("fix", "env-leak", "--scope", "user", "--inject", "LD_PRELOAD",
                       env={**env, "SEEDANCE_FIX_CRASH_AT": step})
        assert proc.returncode == -9, proc.stdout + proc.stderr
        run_cli("fix", "history", env=env)
        if step == "after-commit":
            assert sha(config) != original and drop_in.exists()
            assert run_cli("fix", "undo", env=env).returncode == 0
        assert sha(config) == original and not drop_in.exists()
        assert not temps(config_dir)
    finally:
        import shutil
        shutil.rmtree(home, ignore_errors=True)
