"""`seedance run` argument handling: sizes, quotas, affinity spellings, preload safety."""
from __future__ import annotations

import os

import pytest

from seedance.run.launch import check_preload_path
from seedance.run.limits import parse_mem_limit, parse_size, resolve_affinity
from seedance.model.errors import BadInput, UsageError


@pytest.mark.parametrize("text,value", [("8Gi", 8 << 30), ("512Mi", 512 << 20), ("4096", 4096), ("1GiB", 1 << 30),
                                        ("2Ti", 2 << 40), ("8G", 8 * 10**9), ("1.5G", 1_500_000_000)])
def test_sizes(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "G", "-1G", "2t", "8X", "0"])
def test_bad_sizes(text):
    with pytest.raises(UsageError):
        parse_size(text)


def test_mem_limit_default_and_per_device():
    value, info = parse_mem_limit("8Gi,1:4Gi")
    assert value == f"{8 << 30},1:{4 << 30}"
    assert info == {"default_bytes": 8 << 30, "per_device_bytes": {1: 4 << 30}}
    assert parse_mem_limit("0:1Mi")[0] == f"0:{1 << 20}"
    with pytest.raises(UsageError):
        parse_mem_limit("8G,4G")
    with pytest.raises(UsageError):
        parse_mem_limit("16:1G")


def test_affinity_spellings_without_nvml():
    assert resolve_affinity("gpu:1")[0] in ("1",) or resolve_affinity("gpu:1")[0].startswith("GPU-")
    assert resolve_affinity("npu0")[0] in ("0",) or resolve_affinity("npu0")[0].startswith("GPU-")
    assert resolve_affinity("GPU-abc,MIG-def")[0] == "GPU-abc,MIG-def"
    with pytest.raises(UsageError):
        resolve_affinity("tpu:3")


@pytest.fixture
def private_dir():
    """A directory whose parents nobody else can write (not under the sticky /tmp)."""
    import shutil
    import tempfile
    from pathlib import Path

    base = Path.home() / ".cache"
    base.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix="seedance-test-", dir=base))
    os.chmod(d, 0o755)
    for p in d.parents:
        if p.stat().st_mode & 0o022:
            shutil.rmtree(d)
            pytest.skip(f"{p} is itself group/world-writable on this host")
    yield d
    shutil.rmtree(d)


def test_preload_path_must_not_be_writable_by_others(private_dir):
    lib = private_dir / "d" / "libseedance_shim.so"
    lib.parent.mkdir()
    lib.write_bytes(b"")
    os.chmod(lib.parent, 0o755)
    check_preload_path(lib)
    os.chmod(lib, 0o666)
    with pytest.raises(BadInput, match="world-writable"):
        check_preload_path(lib)
    os.chmod(lib, 0o644)
    os.chmod(lib.parent, 0o775)
    with pytest.raises(BadInput, match=str(lib.parent)):
        check_preload_path(lib)


# --- a command that cannot be run: the exit codes of env(1) and timeout(1), both front ends ----

import subprocess  # noqa: E402

from shimhelpers import seedance_run  # noqa: E402


def _oracle(cmd: list, cwd, env) -> tuple:
    """(exit code, stdout) of `env CMD` and of `timeout 5 CMD`, which must agree."""
    codes = []
    for prefix in (["env"], ["timeout", "5"]):
        proc = subprocess.run([*prefix, *cmd], cwd=cwd, env=env, capture_output=True, text=True)
        codes.append((proc.returncode, proc.stdout))
    assert codes[0] == codes[1], codes
    return codes[0]


def _commands(d):
    """name -> (argv, what the error line says, or None where the command runs)."""
    (d / "notexec").write_text("#!/bin/sh\necho ran\n")
    os.chmod(d / "notexec", 0o644)
    (d / "adir").mkdir()
    (d / "noshebang").write_text("echo from-sh \"$1\"\nexit 3\n")  # ENOEXEC: execvp runs /bin/sh
    os.chmod(d / "noshebang", 0o755)
    (d / "badinterp").write_text("#!/no/such/interpreter\n")
    os.chmod(d / "badinterp", 0o755)
    (d / "bin").mkdir()
    (d / "bin" / "onlyhere").write_text("#!/bin/sh\necho ran\n")  # on PATH, not executable
    os.chmod(d / "bin" / "onlyhere", 0o644)
    return {"missing name": (["seedance-no-such-command-x"], "command not found"),
            "missing path": (["./no-such-file"], "no such file or directory"),
            "not executable": (["./notexec"], "permission denied"),
            "directory": (["./adir"], "permission denied"),
            "no #! line": (["./noshebang", "arg1"], None),
            "missing interpreter": (["./badinterp"], "no such file or directory"),
            "on PATH, not executable": (["onlyhere"], "permission denied")}


@pytest.mark.parametrize("case", ["missing name", "missing path", "not executable", "directory", "no #! line",
                                  "missing interpreter", "on PATH, not executable"])
def test_exit_codes_match_env_and_timeout(env, tmp_path, front, case, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    cmd, says = _commands(work)[case]
    env = {**env, "PATH": f"{work / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"}
    expected, expected_out = _oracle(cmd, work, env)
    monkeypatch.chdir(work)
    proc = seedance_run(env, "--", *cmd)
    assert proc.returncode == expected, (front, proc.stderr)
    if says is None:  # it ran, as env ran it
        assert proc.stdout == expected_out and expected == 3
    else:
        assert expected in (126, 127)
        assert proc.stderr.startswith("seedance: error: run: ") and says in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_both_front_ends_say_the_same(env, tmp_path, monkeypatch):
    """The launcher's lines are the Python command's, word for word."""
    from seedance import shim
    import shimhelpers

    try:
        shim.launcher_path()
    except shim.NotAvailable as exc:
        pytest.skip(str(exc))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    env = {**env, "PATH": f"{work / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"}
    for name, (cmd, says) in _commands(work).items():
        if says is None:
            continue
        lines = {}
        for which in ("python", "launcher"):
            shimhelpers.FRONT["name"] = which
            try:
                lines[which] = seedance_run(env, "--", *cmd).stderr
            finally:
                shimhelpers.FRONT["name"] = "python"
        assert lines["python"] == lines["launcher"] and says in lines["python"], name


# --- --affinity naming a device the host does not have -------------------------------------------

def test_affinity_device_beyond_the_driver_is_a_warning(env, front):
    quiet = seedance_run(env, "--affinity", "gpu:1", "--", "true")  # FAKECUDA_DEVICES=2: it has 0 and 1
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    p = seedance_run(env, "--affinity", "gpu:2", "--", "true")
    assert p.returncode == 0
    assert p.stderr.strip().splitlines() == [
        "seedance: warning: --affinity gpu:2: no device gpu:2 on this host (the CUDA driver reports 2 devices): "
        "the program would see none"], p.stderr


def test_affinity_device_beyond_the_driver_is_refused_under_strict(env, front):
    p = seedance_run(env, "--strict", "--affinity", "gpu:2", "--", "true")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "seedance: error: run: --affinity gpu:2: no device gpu:2 on this host (the CUDA driver reports 2 devices): "
        "the program would see none"], p.stderr


def test_affinity_without_any_driver_says_it_cannot_know(env, front, tmp_path):
    # no libcuda.so.1 anywhere on the loader path: the count cannot be known
    if subprocess.run(["sh", "-c", "ldconfig -p | grep -q 'libcuda.so.1 '"]).returncode == 0:
        pytest.skip("this host has a CUDA driver in ld.so.cache")
    env = {**env, "LD_LIBRARY_PATH": str(tmp_path)}
    for extra in ((), ("--strict",)):
        p = seedance_run(env, *extra, "--affinity", "gpu:1", "--", "true")
        assert p.returncode == 0, p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("seedance: warning: --affinity gpu:1: cannot check that "
                                                       "device 1 exists: ") and "no CUDA driver" in lines[0], lines
