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
    # the verified result, from one uninterrupted run (the edit is deterministic).  libkern.so
    # was built for CUDA 12: every run asks for the move to its root's 13 with --runtime 13
    env = {"XDG_STATE_HOME": str(d / "state0"), "LD_LIBRARY_PATH": ""}
    proc = run_cli("fix", "cuda-mismatch", "--auto-relink", "--runtime", "13", d / "libapp.so", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = sha(d / "libkern.so")
    assert run_cli("fix", "undo", env=env).returncode == 0
    assert (d / "libkern.so").read_bytes() == original
    return {"dir": d, "original": hashlib.sha256(original).hexdigest(), "result": result}


@pytest.mark.parametrize("step", STEPS)
def test_relink_killed_at_each_step(scenario, step, tmp_path):
    d, kern = scenario["dir"], scenario["dir"] / "libkern.so"
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "LD_LIBRARY_PATH": ""}
    proc = run_cli("fix", "cuda-mismatch", "--auto-relink", "--runtime", "13", d / "libapp.so",
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
    proc = run_cli("fix", "cuda-mismatch", "--auto-relink", "--runtime", "13", d / "libapp.so",
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


# --- refusals that write nothing (issue 10 item 5, issue 17 "Journal tests") ---------------------

def one_line_exit_2(proc):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr


def fixed(scenario, tmp_path, step=None):
    """Run the fix (killed at ``step`` when given); returns (env, journal entry dir)."""
    d = scenario["dir"]
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "LD_LIBRARY_PATH": ""}
    proc = run_cli("fix", "cuda-mismatch", "--auto-relink", "--runtime", "13", d / "libapp.so",
                   env={**env, **({"SEEDANCE_FIX_CRASH_AT": step} if step else {})})
    assert proc.returncode == (-9 if step else 0), proc.stdout + proc.stderr
    root = tmp_path / "state" / "seedance" / "journal"
    [entry] = [p for p in root.iterdir() if p.name != "locks"]
    return env, entry


def restore_original(scenario):
    kern = scenario["dir"] / "libkern.so"
    if sha(kern) != scenario["original"]:
        # the module's fixture is shared: rebuild the original from the first run's journal-free copy
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", kern, scenario["dir"] / "kern.c",
                        f"-L{CU12}", "-l:libcudart.so.12", f"-Wl,-rpath,{CU12}"], check=True)
    assert sha(kern) == scenario["original"]


def test_undo_after_the_target_was_edited_is_refused_with_the_reason(scenario, tmp_path):
    kern = scenario["dir"] / "libkern.so"
    env, entry = fixed(scenario, tmp_path)
    try:
        with open(kern, "ab") as handle:  # the user's own change after the fix
            handle.write(b"\0user")
        edited = sha(kern)
        undo = run_cli("fix", "undo", env=env)
        one_line_exit_2(undo)
        assert f"{kern} changed since fix {entry.name}" in undo.stderr and "nothing restored" in undo.stderr
        assert sha(kern) == edited and "restored" not in undo.stdout
        assert json.loads((entry / "manifest.json").read_text())["status"] == "committed"
    finally:
        restore_original(scenario)


@pytest.mark.parametrize("damage", ["delete", "corrupt"])
def test_undo_with_a_missing_or_damaged_backup_is_refused_naming_the_path(scenario, tmp_path, damage):
    kern = scenario["dir"] / "libkern.so"
    env, entry = fixed(scenario, tmp_path)
    try:
        backup = entry / "files" / "0"
        if damage == "delete":
            backup.unlink()
        else:
            with open(backup, "r+b") as handle:
                handle.seek(100)
                handle.write(b"\xde\xad")
        undo = run_cli("fix", "undo", env=env)
        one_line_exit_2(undo)
        assert f"{kern}: backup {backup} is {'missing' if damage == 'delete' else 'damaged'}" in undo.stderr
        assert sha(kern) == scenario["result"] and not undo.stdout
        history = json.loads(run_cli("fix", "history", "--json", env=env).stdout)
        assert [e["status"] for e in history] == ["committed"]
    finally:
        restore_original(scenario)


def test_recovery_with_a_damaged_backup_is_refused_and_writes_nothing(scenario, tmp_path):
    kern = scenario["dir"] / "libkern.so"
    env, entry = fixed(scenario, tmp_path, step="after-rename")
    try:
        assert sha(kern) == scenario["result"]
        backup = entry / "files" / "0"
        with open(backup, "r+b") as handle:
            handle.write(b"\0")
        damaged = sha(backup)
        history = run_cli("fix", "history", env=env)  # recovery runs first, and refuses
        assert history.returncode == 0, history.stderr
        assert history.stderr.count("\n") == 1 and "Traceback" not in history.stderr
        assert f"not rolled back: {kern}: backup {backup} is damaged" in history.stderr
        assert f"{entry.name}  open" in history.stdout
        undo = run_cli("fix", "undo", env=env)
        one_line_exit_2(undo)
        assert f"{entry.name} cannot be rolled back: {kern}: backup" in undo.stderr
        assert sha(kern) == scenario["result"] and sha(backup) == damaged
        assert not temps(scenario["dir"])
    finally:
        restore_original(scenario)


@pytest.mark.parametrize("cut", ["truncated", "empty-list", "files-null", "not-utf8"])
def test_a_damaged_manifest_is_one_line_in_history_and_undo(scenario, tmp_path, cut):
    kern = scenario["dir"] / "libkern.so"
    env, entry = fixed(scenario, tmp_path)
    try:
        manifest = entry / "manifest.json"
        text = manifest.read_bytes()
        manifest.write_bytes({"truncated": text[:len(text) // 2], "empty-list": b"[]",
                              "files-null": text.replace(b'"files": [', b'"files": null, "x": [', 1),
                              "not-utf8": b"\xff" + text}[cut])
        history = run_cli("fix", "history", env=env)
        assert history.returncode == 0 and not history.stderr, history.stderr
        assert history.stdout.count("\n") == 1 and history.stdout.startswith(f"{entry.name}  damaged  ")
        undo = run_cli("fix", "undo", env=env)
        one_line_exit_2(undo)
        assert f"journal entry {entry.name}: manifest.json" in undo.stderr
        named = run_cli("fix", "undo", entry.name, env=env)
        one_line_exit_2(named)
        assert sha(kern) == scenario["result"]
    finally:
        restore_original(scenario)
