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
