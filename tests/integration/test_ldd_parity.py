"""`seedance ldd` against glibc's `ldd` on real trees: the same set of objects, file by file.

A spread-out sample of /usr/lib/x86_64-linux-gnu plus torch/lib/*.so and the NVIDIA CUDA
runtime wheels in the venv.  bench/bench_ldd_parity.py runs the same comparison over the
whole trees and prints the count of differences.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import sysconfig
from pathlib import Path

import pytest

from seedance.commands.ldd import render
from seedance.resolve import Resolver
from tests.conftest import run_cli

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_ldd_parity.py"
_spec = importlib.util.spec_from_file_location("bench_ldd_parity", _BENCH)
parity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(parity)

pytestmark = pytest.mark.skipif(shutil.which("ldd") is None, reason="needs glibc's ldd")
SAMPLE = 40


def sample_files() -> list:
    system = parity.elf_files(["/usr/lib/x86_64-linux-gnu"])
    step = max(1, len(system) // SAMPLE)
    files = system[::step][:SAMPLE]
    site = sysconfig.get_paths()["purelib"]
    files += sorted(p for p in glob.glob(os.path.join(site, "torch", "lib", "*.so*"))
                    if not os.path.islink(p))
    files += sorted(glob.glob(os.path.join(site, "nvidia", "cuda_runtime", "lib", "*.so*")))
    return files


def as_ldd_view(resolver, path):
    """What `seedance ldd` prints for ``path``, parsed exactly as ldd's output is."""
    kind = parity.ours(resolver, path)[0]
    if kind != "dynamic":
        return parity.ours(resolver, path)
    text = render(resolver.closure(path))
    return parity.parse_ldd(text)


def test_sample_matches_ldd():
    files = sample_files()
    assert len(files) >= SAMPLE
    resolver = Resolver()
    differences = []
    for path in files:
        expected = parity.run_ldd(path)
        got = as_ldd_view(resolver, path)
        why = parity.compare(expected, got)
        if why:
            differences.append(f"{path}: {why}")
        elif expected[4] != got[4]:
            differences.append(f"{path}: listing order: ldd {expected[4]} seedance {got[4]}")
    assert differences == []


def test_torch_and_cuda_runtime_are_in_the_sample():
    files = sample_files()
    if not any("/torch/lib/" in f for f in files):
        pytest.skip("torch is not installed in this environment")
    assert any(os.path.basename(f).startswith("libtorch") for f in files)
    assert any("libcudart.so.12" in f for f in files) or not glob.glob(
        os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "cuda_runtime", "lib", "libcudart.so.12*"))


@pytest.mark.parametrize("path", ["/usr/bin/curl", "/usr/bin/python3", "/bin/true"])
def test_cli_text_and_json_match_ldd(path):
    if not os.path.exists(path):
        pytest.skip(f"{path} not installed")
    expected = parity.run_ldd(path)
    proc = run_cli("ldd", path)
    assert proc.returncode == 0, proc.stderr
    assert parity.compare(expected, parity.parse_ldd(proc.stdout)) is None
    doc = json.loads(run_cli("ldd", "--json", path, check=True).stdout)
    assert doc["schema"] == "seedance.ldd/v1" and doc["file"] == path
    assert {os.path.realpath(lib["path"]) for lib in doc["libraries"]} == expected[1]
    assert all(lib["source"] in ("loaded", "direct", "rpath", "ld_library_path", "runpath",
                                 "ld.so.cache", "default") for lib in doc["libraries"])


def test_cli_env_ld_library_path_matches_ldd(tmp_path):
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    import subprocess
    (tmp_path / "lib").mkdir()
    (tmp_path / "l.c").write_text("int l(void){return 0;}\n")
    (tmp_path / "m.c").write_text("int l(void); int main(void){return l();}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", tmp_path / "lib" / "libl.so", tmp_path / "l.c", "-Wl,-soname,libl.so"], check=True)
    subprocess.run(["gcc", "-o", tmp_path / "app", tmp_path / "m.c", tmp_path / "lib" / "libl.so"], check=True)
    app = str(tmp_path / "app")
    without = run_cli("ldd", app)
    assert "libl.so => not found" in without.stdout
    assert parity.compare(parity.run_ldd(app), parity.parse_ldd(without.stdout)) is None
    env = {"LD_LIBRARY_PATH": str(tmp_path / "lib")}
    with_env = run_cli("ldd", "--env", f"LD_LIBRARY_PATH={tmp_path / 'lib'}", app)
    assert parity.compare(parity.run_ldd(app, env=env), parity.parse_ldd(with_env.stdout)) is None
    assert f"libl.so => {tmp_path / 'lib'}/libl.so" in with_env.stdout


@pytest.mark.parametrize("content", [b"", b"#!/bin/sh\necho hi\n", b"\x7fELF\x02\x01\x01" + b"\0" * 9,
                                     b"\x7fELF\x02\x01\x01" + b"\xff" * 120])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, content):
    bad = tmp_path / "bad.so"
    bad.write_bytes(content)
    proc = run_cli("ldd", bad)
    assert proc.returncode == 2
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


def test_cli_missing_file_and_directory(tmp_path):
    for target in (tmp_path / "nope", tmp_path):
        proc = run_cli("ldd", target)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("preload", ["/usr/lib/x86_64-linux-gnu/libz.so.1", "libz.so.1 libcap.so.2",
                                     "libnot-there.so:libz.so.1"])
def test_cli_preload_matches_ldd(preload):
    expected = parity.run_ldd("/usr/bin/true", env={"LD_PRELOAD": preload})
    proc = run_cli("ldd", "--env", f"LD_PRELOAD={preload}", "/usr/bin/true")
    assert proc.returncode == 0, proc.stderr
    assert parity.compare(expected, parity.parse_ldd(proc.stdout)) is None


def test_cli_symlink_loop_and_fifo(tmp_path):
    loop = tmp_path / "loop.so"
    os.symlink(loop.name, loop)
    fifo = tmp_path / "fifo.so"
    os.mkfifo(fifo)
    for target in (loop, fifo):
        proc = run_cli("ldd", target, timeout=30)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("script", [None, "V1 { global: f; local: *; };\n", "V0 { global: f; local: *; };\n"])
def test_provider_rebuilt_without_a_version_script_matches_ldd(tmp_path, script):
    """Issue 17: a program linked against libv.so's node V1, then libv.so rebuilt without a
    version script (ld.so only warns: no version information available), with it, or with
    another node (ldd: version `V1' not found).  The CLI and ldd agree on every one."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    import subprocess

    body = "#include <unistd.h>\nint f(void){return getpid() > 0;}\n"
    (tmp_path / "v.c").write_text(body)
    (tmp_path / "v1.map").write_text("V1 { global: f; local: *; };\n")
    (tmp_path / "m.c").write_text("int f(void); int main(void){return f() ? 0 : 1;}\n")
    lib = tmp_path / "libv.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", lib, tmp_path / "v.c", "-Wl,-soname,libv.so",
                    f"-Wl,--version-script,{tmp_path / 'v1.map'}"], check=True)
    subprocess.run(["gcc", "-o", tmp_path / "app", tmp_path / "m.c", f"-L{tmp_path}", "-lv",
                    "-Wl,-rpath,$ORIGIN"], check=True)
    rebuild = ["gcc", "-shared", "-fPIC", "-o", lib, tmp_path / "v.c", "-Wl,-soname,libv.so"]
    if script is not None:
        (tmp_path / "again.map").write_text(script)
        rebuild.append(f"-Wl,--version-script,{tmp_path / 'again.map'}")
    subprocess.run(rebuild, check=True)
    app = str(tmp_path / "app")
    expected = parity.run_ldd(app)
    # ld.so's trace mode also prints dl-version.c's warning for a provider without version
    # definitions ("libv.so: no version information available (required by app)"): a
    # warning, not a library, and the load goes on
    warning = "no version information available"
    warned = any(warning in entry for entry in expected[1])
    assert warned == (script is None)
    expected = (expected[0], {e for e in expected[1] if warning not in e}, *expected[2:4],
                [e for e in expected[4] if warning not in e], *expected[5:])
    proc = run_cli("ldd", app)
    assert parity.compare(expected, parity.parse_ldd(proc.stdout)) is None, proc.stdout
    ran = subprocess.run([app], capture_output=True, text=True, errors="replace")
    assert (ran.returncode == 0) == (expected[3] == set()), ran.stderr  # ldd's verdict is the loader's
    judged = run_cli("check", "--no-progress", app)
    assert judged.returncode == (0 if ran.returncode == 0 else 1), judged.stdout + judged.stderr


# --- the caller's environment: ldd runs the loader in it, so `seedance ldd` assumes it ------------

def _two_copies(tmp_path):
    """libdup.so.1 built twice (one/ and two/), each with a marker symbol, and app needing it."""
    import subprocess
    for which in ("one", "two"):
        (tmp_path / which).mkdir()
        (tmp_path / f"{which}.c").write_text(f"int dup(void){{return 1;}} int {which}_marker(void){{return 2;}}\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", tmp_path / which / "libdup.so.1",
                        tmp_path / f"{which}.c", "-Wl,-soname,libdup.so.1"], check=True)
    (tmp_path / "m.c").write_text("int dup(void); int main(void){return dup();}\n")
    subprocess.run(["gcc", "-o", tmp_path / "app", tmp_path / "m.c", tmp_path / "one" / "libdup.so.1"], check=True)
    return str(tmp_path / "app")


def _resolved(text: str, name: str) -> list:
    """The paths NAME resolves to in ldd-style output (both tools' lines read the same way).
    A file found under a relative path equal to its name (an empty LD_LIBRARY_PATH entry is
    the current directory) is listed by its path alone, without "=>"."""
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(f"{name} =>"):
            found.append(line.split("=>", 1)[1].split("(")[0].strip())
        elif line.split(" (")[0] == name:
            found.append(name)
    return found


def _ldd_in(env: dict, path: str, cwd) -> str:
    import subprocess
    proc = subprocess.run(["ldd", path], capture_output=True, env={**parity.CLEAN_ENV, **env}, cwd=cwd)
    return (proc.stdout + proc.stderr).decode("utf-8", errors="replace")


def _seedance_ldd_in(env: dict, path: str, cwd):
    """`seedance ldd PATH` started as a user would, in this environment plus ``env``."""
    import subprocess
    from tests.conftest import BIN
    exe = BIN / "seedance"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "seedance"]
    return subprocess.run([*cmd, "ldd", path], capture_output=True, cwd=cwd, env={**os.environ, **env})


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@pytest.mark.parametrize("shape", ["plain", "empty-entries", "origin-token"])
def test_cli_assumes_the_callers_ld_library_path_as_ldd_does(tmp_path, shape):
    """Oracle: ldd run with the same LD_LIBRARY_PATH, in the same directory.  Two files answer
    to libdup.so.1 (app was linked against one/); the one ld.so picks must win in both tools."""
    app = _two_copies(tmp_path)
    llp, cwd, winner = {
        "plain": (str(tmp_path / "two"), tmp_path, "two"),
        # an empty entry is the current directory for ld.so (fillin_rpath), ahead of two/
        "empty-entries": (f"::{tmp_path / 'two'}:", tmp_path / "one", "one"),
        # $ORIGIN in LD_LIBRARY_PATH expands against the main program's directory
        "origin-token": ("$ORIGIN/two", tmp_path, "two")}[shape]
    expected = _resolved(_ldd_in({"LD_LIBRARY_PATH": llp}, app, cwd), "libdup.so.1")
    assert [os.path.realpath(os.path.join(cwd, p)) for p in expected] == [str(tmp_path / winner / "libdup.so.1")]
    proc = _seedance_ldd_in({"LD_LIBRARY_PATH": llp}, app, cwd)
    assert proc.returncode == 0, proc.stderr
    got = _resolved(proc.stdout.decode("utf-8", errors="replace"), "libdup.so.1")
    assert [os.path.realpath(os.path.join(cwd, p)) for p in got] == \
        [os.path.realpath(os.path.join(cwd, p)) for p in expected]
    # --env still overrides what the caller's environment holds
    first = run_cli("ldd", "--env", f"LD_LIBRARY_PATH={tmp_path / 'one'}", app, env={"LD_LIBRARY_PATH": llp})
    assert _resolved(first.stdout, "libdup.so.1") == [f"{tmp_path / 'one'}/libdup.so.1"]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_cli_assumes_the_callers_ld_preload_as_ldd_does(tmp_path):
    app = _two_copies(tmp_path)
    preload = str(tmp_path / "two" / "libdup.so.1")
    expected = parity.parse_ldd(_ldd_in({"LD_PRELOAD": preload}, app, tmp_path))
    assert os.path.realpath(preload) in expected[1]
    proc = _seedance_ldd_in({"LD_PRELOAD": preload}, app, tmp_path)
    assert parity.compare(expected, parity.parse_ldd(proc.stdout.decode("utf-8", errors="replace"))) is None
