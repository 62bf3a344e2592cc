"""Issue 10, defect 8: the error contract the README states, everywhere.

Bad input or usage: exactly one line `seedance: error: ...` on stderr, exit 2, never a
traceback, never help text.  Help goes to stdout, and only on --help.  A control character
in a path is escaped, so a crafted file name cannot forge a line of its own.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN, seedance_as_nobody

SEEDANCE = str(BIN / "seedance")
FORGED = "seedance: error: forged"


def run(*args, env=None, timeout=90, cwd=None):
    full = dict(os.environ)
    full.update(env or {})
    proc = subprocess.run([SEEDANCE, *map(str, args)], capture_output=True, env=full, timeout=timeout, cwd=cwd)
    # decoded strictly on purpose: an error line must be valid UTF-8 whatever the input held
    proc.out = proc.stdout.decode("utf-8")
    proc.err = proc.stderr.decode("utf-8")
    return proc


def assert_one_error_line(proc) -> str:
    lines = proc.err.splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.err)
    assert len(lines) == 1, proc.err
    assert lines[0].startswith("seedance: error: "), lines[0]
    assert "error: seedance" not in lines[0] and "Traceback" not in proc.err
    assert "usage:" not in proc.out and "usage:" not in proc.err
    return lines[0]


@pytest.fixture
def isolated(tmp_path):
    """XDG dirs of our own: no agent socket, an empty journal, an empty plugin store."""
    env = {"XDG_STATE_HOME": tmp_path / "state", "XDG_RUNTIME_DIR": tmp_path / "run",
           "XDG_DATA_HOME": tmp_path / "data", "XDG_CONFIG_HOME": tmp_path / "config"}
    for path in env.values():
        path.mkdir(mode=0o700)
    return {k: str(v) for k, v in env.items()}


def test_bare_seedance_is_one_line_not_help():
    proc = run()
    assert_one_error_line(proc)
    assert proc.out == ""


@pytest.mark.parametrize("argv", [["fix"], ["plugin"], ["agent"]])
def test_command_without_action_is_one_line(argv):
    proc = run(*argv)
    line = assert_one_error_line(proc)
    assert proc.out == "" and f" {argv[0]}" in line


def test_help_goes_to_stdout_only_on_help():
    from seedance.cli import COMMANDS
    for argv in [["--help"], *[[name, "--help"] for name in COMMANDS], ["fix", "undo", "--help"]]:
        proc = run(*argv)
        assert proc.returncode == 0, (argv, proc.err)
        assert proc.out.startswith("usage:") and proc.err == "", argv


@pytest.mark.parametrize("argv", [
    ["no-such-command"],
    ["check", "--pid", "x"],
    ["check", "--arch"],
    ["check", "--report-json"],
    ["ldd"],
    ["ldd", "/nonexistent/lib.so"],
    ["run"],
    ["bench"],
    ["trace", "--duration", "nan"],
    ["trace", "--duration", "inf"],
    ["trace", "--duration", "-1"],
    ["trace", "--duration", "0"],
    ["trace", "--buffer-pages", "3"],
    ["fix", "cuda-mismatch"],
    ["fix", "undo", "no-such-entry"],
    ["plugin", "verify", "--report-json"],
    ["plugin", "install", "/nonexistent/plugin"],
    # (`status` without an agent is exit 3, as systemctl's: tests/smoke/test_conventions.py)
])
def test_usage_and_bad_input_are_one_line(argv, isolated):
    # a refused --duration must never start tracing: the timeout would fail the test
    assert_one_error_line(run(*argv, env=isolated, timeout=60))


def test_alias_uses_the_same_prefix():
    alias = BIN / "seedance-check"
    if not alias.exists():
        pytest.skip("seedance-check console script not installed")
    proc = subprocess.run([str(alias), "--bogus"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("seedance: error: check: ")
    assert len(proc.stderr.splitlines()) == 1


def test_non_utf8_inputs_are_one_line(tmp_path, isolated):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "bad.yaml").write_bytes(b"rules:\n- id: caf\xe9\n")
    line = assert_one_error_line(run("check", "--rules", rules, shutil.which("true"), env=isolated))
    assert "bad.yaml" in line


def test_damaged_journal_is_one_line(isolated):
    journal = Path(isolated["XDG_STATE_HOME"]) / "seedance" / "journal"
    entry = journal / "20260101-000000-abcdef"
    entry.mkdir(parents=True)
    (entry / "manifest.json").write_bytes(b"{\"schema\": \"seedance.journal/v1\", \"id\": \"\xff")
    proc = run("fix", "undo", "20260101-000000-abcdef", env=isolated)
    assert_one_error_line(proc)
    history = run("fix", "history", env=isolated)
    assert "Traceback" not in history.err and history.returncode in (0, 2)


@pytest.fixture
def public_dir():
    """A directory an unprivileged user can reach (pytest's tmp_path is 0700 root's)."""
    import tempfile
    path = Path(tempfile.mkdtemp(prefix="seedance-contract-", dir="/tmp"))
    os.chmod(path, 0o755)
    yield path
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
    shutil.rmtree(path, ignore_errors=True)


def test_unreadable_directory_on_the_command_line_exits_2(public_dir):
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or not setpriv:
        pytest.skip("needs root and setpriv to run as an unprivileged user (root reads everything)")
    tmp_path = public_dir
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o000)
    os.chmod(locked, 0o000)
    proc = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *seedance_as_nobody(),
                           "check", "--no-progress", str(locked)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HOME": str(tmp_path)})
    if "permission denied" not in proc.stderr.lower() and proc.returncode == 127:
        pytest.skip(f"cannot run seedance as nobody: {proc.stderr.strip()}")
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("seedance: error: ")]
    assert len(errors) == 1 and str(locked) in errors[0]
    # a readable directory with the same contents is clean
    os.chmod(locked, 0o755)
    proc = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *seedance_as_nobody(),
                           "check", "--no-progress", str(locked)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr


def test_a_newline_in_a_file_name_cannot_forge_a_line(tmp_path):
    crafted = tmp_path / f"a\n{FORGED}"
    crafted.mkdir()
    # an error naming the path
    line = assert_one_error_line(run("ldd", crafted / "missing.so"))
    assert "\\n" in line
    # a damaged ELF under a crafted name: the skipped line and the table stay one line each
    (crafted / "lib.so").write_bytes(Path(shutil.which("true")).read_bytes()[:100])
    proc = run("check", "--no-progress", tmp_path)
    assert proc.returncode in (0, 1, 2), proc.err
    for line in (proc.out + proc.err).splitlines():
        assert not line.startswith(FORGED), line
    assert any("\\n" + FORGED in line for line in proc.err.splitlines())


def test_undecodable_bytes_in_a_path_are_escaped(tmp_path):
    name = os.fsencode(tmp_path) + b"/caf\xe9\x1b[31m.so"
    proc = subprocess.run([SEEDANCE.encode(), b"ldd", name], capture_output=True, timeout=60)
    err = proc.stderr.decode("utf-8")  # strict: the line is valid UTF-8
    assert proc.returncode == 2 and len(err.splitlines()) == 1
    assert "\\xe9" in err and "\\x1b" in err and "\x1b" not in err


def test_a_crafted_needed_name_cannot_forge_a_line_of_explain(tmp_path):
    """`check --explain NAME FILE` prints NAME and the paths it tried: a NEEDED entry holding
    a newline printed a line of its own ("=> ... via ld.so.cache", read as the answer)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    name = f"libx\n=> forged.so via ld.so.cache\x1b[2J.so"
    (tmp_path / "f.c").write_text("int f(void){return 1;}\n")
    (tmp_path / "g.c").write_text("int g(void){return 2;}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / name), str(tmp_path / "f.c")], check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "libg.so"), str(tmp_path / "g.c"),
                    "-Wl,--no-as-needed", f"-L{tmp_path}", f"-l:{name}"], check=True)
    (tmp_path / name).unlink()
    proc = run("check", "--explain", name, tmp_path / "libg.so")
    assert proc.returncode == 1, proc.err
    lines = proc.out.splitlines()
    assert lines[0] == f"libx\\n=> forged.so via ld.so.cache\\x1b[2J.so needed by {tmp_path}/libg.so"
    assert lines[-1] == "=> not found"
    assert not any(line.startswith("=> forged") for line in lines) and "\x1b" not in proc.out


def test_a_crafted_path_cannot_forge_a_line_of_a_fix_report(tmp_path):
    """Every line `seedance fix` prints names paths from disk: a directory name holding a
    newline stays on its line (escaped), in the diff of an env-leak dry run."""
    crafted = tmp_path / "a\nforged: rewrote everything"
    crafted.mkdir()
    (crafted / "shim.yaml").write_text("LD_PRELOAD: ${HOME}/x.so\n")
    proc = run("fix", "env-leak", "--scope", crafted, "--dry-run", env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert proc.returncode == 0, proc.err
    lines = proc.out.splitlines()
    assert not any(line.startswith("forged") for line in lines), proc.out
    assert f"    --- {tmp_path}/a\\nforged: rewrote everything/shim.yaml (before)" in lines


def _with_bad_symbol_table(tmp_path) -> Path:
    """A library whose dynamic section is sound but whose DT_SYMENT is 4, smaller than an
    Elf64_Sym: read without its symbols it parses, its symbol table does not."""
    import struct

    src = tmp_path / "bad.c"
    src.write_text("int f(void) { return 1; }\n")
    tree = tmp_path / "tree"
    tree.mkdir()
    lib = tree / "libbad.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True, capture_output=True)
    data = bytearray(lib.read_bytes())
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    patched = 0
    for i in range(phnum):
        p_type, _flags, offset, _va, _pa, filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 2:  # PT_DYNAMIC
            for k in range(filesz // 16):
                if struct.unpack_from("<q", data, offset + 16 * k)[0] == 11:  # DT_SYMENT
                    struct.pack_into("<qQ", data, offset + 16 * k, 11, 4)
                    patched += 1
    assert patched == 1
    lib.write_bytes(data)
    return lib


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@pytest.mark.parametrize("reader", ["c", "python"])
def test_strict_check_of_a_library_whose_symbol_table_does_not_parse(tmp_path, reader):
    """--strict reads every symbol table; one that does not parse makes that library
    unreadable like any read: found in a tree it is skipped and counted (exit 0 here, no
    finding), named on the command line it is bad input (one line, exit 2)."""
    lib = _with_bad_symbol_table(tmp_path)
    env = {"SEEDANCE_ELF_READER": reader}
    plain = run("check", lib.parent, env=env)
    assert plain.returncode == 0 and "skipped" not in plain.err, plain.err  # no symbols read
    found = run("check", "--strict", "--report-json", tmp_path / "r.json", lib.parent, env=env)
    assert found.returncode == 0, found.err
    assert found.err.splitlines() == [f"seedance: skipped {lib}: malformed ELF: DT_SYMENT 4 too small"]
    import json

    stats = json.loads((tmp_path / "r.json").read_text())["stats"]
    assert stats["unreadable"] == 1 and stats["elf_objects"] == 0
    named = run("check", "--strict", lib, env=env)
    assert assert_one_error_line(named) == f"seedance: error: {lib}: malformed ELF: DT_SYMENT 4 too small"
