"""seedance check end to end: the host scope, bad input, progress and exit codes."""
from __future__ import annotations

import json
import os
import pty
import shutil
import struct
import subprocess
import sys

import jsonschema
import pytest

from tests.conftest import BIN, NOBODY, ROOT, run_cli, seedance_as_nobody

SCHEMA = json.loads((ROOT / "agent" / "schemas" / "report.schema.json").read_text())
LIBZ = "/usr/lib/x86_64-linux-gnu/libz.so.1"


def one_line_error(proc, code=2):
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_help_has_examples(cli):
    proc = cli("check", "--help")
    assert proc.returncode == 0 and "examples:" in proc.stdout


def test_host_scope_report_is_valid(tmp_path):
    out = tmp_path / "r.json"
    proc = run_cli("check", "--no-progress", "--report-json", out)
    assert proc.returncode in (0, 1), proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("seedance check: ")
    report = json.loads(out.read_text())
    jsonschema.validate(report, SCHEMA)
    assert report["stats"]["elf_objects"] > 0 and report["stats"]["processes"] > 0
    assert report["host"]["glibc"].startswith("glibc")
    assert proc.returncode == (1 if any(f["severity"] in ("error", "fatal") for f in report["findings"]) else 0)


def write_hostile(tmp_path):
    good = open(LIBZ, "rb").read()
    files = {"truncated.so": good[:100], "garbage.so": b"\x7fELF\x02\x01\x01" + os.urandom(500)}
    huge_phnum = bytearray(good)
    huge_phnum[0x38:0x3A] = struct.pack("<H", 0xFFFF)
    files["phnum.so"] = bytes(huge_phnum)
    far_phoff = bytearray(good)
    far_phoff[0x20:0x28] = struct.pack("<Q", 1 << 62)
    files["phoff.so"] = bytes(far_phoff)
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return sorted(files)


@pytest.mark.skipif(not os.path.exists(LIBZ), reason="libz.so.1 not installed")
def test_bad_files_in_a_tree_are_reported_not_fatal(tmp_path):
    names = write_hostile(tmp_path)
    shutil.copy(LIBZ, tmp_path / "ok.so")
    (tmp_path / "notes.txt").write_text("not ELF, skipped quietly\n")
    os.symlink("loop-b", tmp_path / "loop-a")
    os.symlink("loop-a", tmp_path / "loop-b")
    os.mkfifo(tmp_path / "fifo")
    os.symlink(".", tmp_path / "self")  # a directory loop: not followed
    proc = run_cli("check", "--json", "--no-progress", tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    jsonschema.validate(report, SCHEMA)
    bad = sorted(os.path.basename(e["path"]) for e in report["stats"]["errors"])
    assert bad == sorted(names + ["loop-a", "loop-b"])
    assert report["stats"]["elf_objects"] == 1
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == len(bad)  # one line each


@pytest.mark.skipif(not os.path.exists(LIBZ), reason="libz.so.1 not installed")
def test_explicit_bad_file_is_one_line_exit_2(tmp_path):
    for name in write_hostile(tmp_path):
        line = one_line_error(run_cli("check", "--no-progress", tmp_path / name, timeout=60))
        assert name in line and "malformed ELF" in line


@pytest.mark.parametrize("args, words", [
    (["/no/such/file"], "no such file"),
    (["--pid", "999999999"], "no such process"),
    (["--plugin", "no-such-plugin"], "not installed"),
    (["--arch", "sm_x", "/bin/sh"], "--arch"),
    (["--driver-version", "abc", "/bin/sh"], "--driver-version"),
    (["--pid", "abc"], "not a process id"),
])
def test_usage_and_bad_input(args, words):
    assert words in one_line_error(run_cli("check", *args))


def test_special_files_and_loops_as_targets(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    os.symlink("b", tmp_path / "a")
    os.symlink("a", tmp_path / "b")
    (tmp_path / "t.txt").write_text("x")
    assert "not a regular file" in one_line_error(run_cli("check", tmp_path / "fifo", timeout=30))
    assert "symbolic link loop" in one_line_error(run_cli("check", tmp_path / "a"))
    assert "not an ELF file" in one_line_error(run_cli("check", tmp_path / "t.txt"))


def test_vanished_pid_as_explicit_target():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert "no such process" in one_line_error(run_cli("check", "--pid", child.pid))


def test_process_that_exits_mid_scan_is_counted_not_fatal():
    from seedance.collect.scan import CheckOptions, Scanner

    scanner = Scanner(CheckOptions(targets=["/bin/true"]))
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    scanner._process(child.pid, explicit=False)
    assert scanner.stats["vanished"] == 1 and scanner.facts == []


def test_live_pid_target():
    proc = run_cli("check", "--json", "--pid", os.getpid())
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    jsonschema.validate(report, SCHEMA)
    assert report["stats"]["processes"] == 1
    assert report["stats"]["facts_by_kind"]["mapped_lib"] >= 1


@pytest.mark.parametrize("content, words", [
    ("rules: [", "not valid YAML"),
    ("rules:\n  - id: x\n", "missing field"),
])
def test_bad_rules_dir(tmp_path, content, words):
    (tmp_path / "r.yaml").write_text(content)
    assert words in one_line_error(run_cli("check", "--rules", tmp_path, "/bin/sh"))


def test_bad_config_target_is_one_line(tmp_path):
    cfg = tmp_path / "plugins.yaml"
    cfg.write_text("env: [unclosed\n")
    assert "not valid YAML" in one_line_error(run_cli("check", cfg))


def test_config_target_env_leak(tmp_path):
    cfg = tmp_path / "plugins.yaml"
    cfg.write_text("env:\n  LD_PRELOAD: ${HOME}/.local/lib/libshim.so\n")
    proc = run_cli("check", "--json", cfg)
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and [f["rule"] for f in report["findings"]] == ["env-leak"]
    cfg.write_text("env:\n  LD_PRELOAD: $${HOME}/.local/lib/libshim.so\n")
    proc = run_cli("check", "--json", cfg)
    assert proc.returncode == 0 and json.loads(proc.stdout)["findings"] == []


def test_host_scope_reads_seedance_config(tmp_path):
    (tmp_path / "seedance").mkdir()
    (tmp_path / "seedance" / "plugins.yaml").write_text("LD_LIBRARY_PATH: $HOME/lib\n")
    proc = run_cli("check", "--json", env={"XDG_CONFIG_HOME": str(tmp_path)})
    report = json.loads(proc.stdout)
    leaks = [f for f in report["findings"] if f["rule"] == "env-leak"]
    assert [f["subject"]["path"] for f in leaks] == [str(tmp_path / "seedance" / "plugins.yaml")]


def test_pipe_gets_no_progress_and_tty_does(tmp_path):
    shutil.copy("/bin/sh", tmp_path / "sh")
    proc = run_cli("check", tmp_path)
    assert proc.stderr == ""
    exe = BIN / "seedance"
    master, slave = pty.openpty()
    try:
        child = subprocess.run([str(exe), "check", str(tmp_path)], stdout=subprocess.PIPE, stderr=slave,
                               timeout=60)
        os.close(slave)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
    assert child.returncode == 0
    assert b"checking [" in seen
    proc = subprocess.run([str(exe), "check", "--no-progress", str(tmp_path)], capture_output=True)
    assert proc.stderr == b""


def test_table_shows_fix_and_summary(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("LD_PRELOAD: ${HOME}/x.so\n")
    proc = run_cli("check", cfg)
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["SEVERITY", "RULE", "SUBJECT", "MESSAGE"]
    assert lines[1].startswith("ERROR L7") and "env-leak" in lines[1]
    assert lines[2].strip() == f"fix: seedance fix env-leak --scope {cfg} --inject LD_PRELOAD"
    assert lines[-1].startswith("seedance check: 1 finding (1 error)")


def test_host_scope_finds_stale_torch_extension(tmp_path):
    from seedance.collect.torch_ext import find_torch
    if find_torch() is None or shutil.which("gcc") is None:
        pytest.skip("needs the torch wheel and gcc")
    build = tmp_path / "ext" / "kernels"
    build.mkdir(parents=True)
    (build / "build.ninja").write_text("cflags = -isystem /gone/site-packages/torch/include -fPIC\n")
    src = tmp_path / "k.c"
    src.write_text('extern void f(void) __asm__("_ZN3c1017gone_in_new_torchEv");\nvoid g(void) { f(); }\n')
    subprocess.run(["gcc", "-shared", "-fPIC", str(src), "-o", str(build / "kernels.so")], check=True)
    proc = run_cli("check", "--json", env={"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")})
    report = json.loads(proc.stdout)
    stale = [f for f in report["findings"] if f["rule"] == "torch-ext-stale"]
    assert [f["subject"]["path"] for f in stale] == [str(build)]
    assert "gone_in_new_torch" in " ".join(stale[0]["evidence"]["reasons"])


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None or not os.path.exists(LIBZ),
                    reason="needs root (to drop to nobody with setpriv) and libz")
def test_unreadable_files_and_dirs_as_another_user():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(dir="/tmp") as top:  # pytest's tmp root is 0700
        _unreadable_as_nobody(Path(top))


def _unreadable_as_nobody(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    shutil.copy(LIBZ, tree / "ok.so")
    shutil.copy(LIBZ, tree / "secret.so")
    os.chmod(tree / "secret.so", 0)
    (tree / "closed").mkdir()
    os.chmod(tree / "closed", 0)
    for path in (tmp_path, tree, tree / "ok.so"):
        os.chmod(path, 0o755)
    nobody = [*NOBODY, *seedance_as_nobody(), "check", "--no-progress"]
    proc = subprocess.run(nobody + ["--json", str(tree)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert sorted(e["path"] for e in report["stats"]["errors"]) == [str(tree / "closed"), str(tree / "secret.so")]
    assert all("permission denied" in e["error"] for e in report["stats"]["errors"])
    proc = subprocess.run(nobody + [str(tree / "secret.so")], capture_output=True, text=True, timeout=60)
    assert one_line_error(proc).endswith("secret.so: permission denied")


def test_host_scope_reads_plugin_store_configs(tmp_path):
    manifest = tmp_path / "seedance" / "plugins" / "enc" / "2.0.5" / "manifest.yaml"
    manifest.parent.mkdir(parents=True)
    manifest.write_text("name: enc\nenv:\n  LD_PRELOAD: ${HOME}/libenc-shim.so\n")
    proc = run_cli("check", "--json", env={"XDG_DATA_HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg")})
    leaks = [f for f in json.loads(proc.stdout)["findings"] if f["rule"] == "env-leak"]
    assert [f["subject"]["path"] for f in leaks] == [str(manifest)]
