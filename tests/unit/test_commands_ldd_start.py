"""`seedance ldd FILE` start-up (issue 13): its own reading of the command line
(cli._lean_ldd) gives what argparse gives, and the plain command loads none of the heavy
modules it was cut from.  Nothing here times anything; the bench measures the time."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

LIBRARY = next((p for p in ("/usr/lib/x86_64-linux-gnu/libcurl.so.4", "/lib/x86_64-linux-gnu/libz.so.1",
                            "/lib/x86_64-linux-gnu/libc.so.6") if os.path.exists(p)), None)
needs_library = pytest.mark.skipif(LIBRARY is None, reason="no system library to resolve")


def seedance(*args, env=None):
    return subprocess.run([sys.executable, "-c", "from seedance.cli import console; console()", *args],
                          capture_output=True, text=True, errors="surrogateescape", timeout=120,
                          env={**os.environ, "COLUMNS": "80", **(env or {})})


@needs_library
@pytest.mark.parametrize("lean, through_argparse", [
    (["ldd", "{f}"], ["ldd", "--", "{f}"]),
    (["ldd", "--json", "{f}"], ["ldd", "--jso", "{f}"]),  # an abbreviation: argparse's path
    (["ldd", "{f}", "--tree"], ["ldd", "--tre", "{f}"]),
    (["ldd", "--env", "LD_LIBRARY_PATH=/nonexistent", "--secure", "{f}"],
     ["ldd", "--env=LD_LIBRARY_PATH=/nonexistent", "--sec", "{f}"]),
    (["ldd", "--env", "LD_PRELOAD=libz.so.1", "--env", "LD_LIBRARY_PATH=/x", "{f}"],
     ["ldd", "--env=LD_PRELOAD=libz.so.1", "--env=LD_LIBRARY_PATH=/x", "--", "{f}"]),
    (["ldd", "--env", "NOEQUALS", "{f}"], ["ldd", "--env=NOEQUALS", "{f}"]),  # the same usage error
    (["ldd", "/nonexistent/libx.so"], ["ldd", "--", "/nonexistent/libx.so"]),
    (["ldd", "/"], ["ldd", "--", "/"]),
])
def test_lean_reading_gives_what_argparse_gives(lean, through_argparse):
    one = seedance(*[a.format(f=LIBRARY) for a in lean])
    other = seedance(*[a.format(f=LIBRARY) for a in through_argparse])
    assert (one.returncode, one.stdout, one.stderr) == (other.returncode, other.stdout, other.stderr)
    assert one.returncode in (0, 2)


def test_what_the_lean_reading_leaves_to_argparse():
    from seedance.cli import _lean_ldd

    for argv in (["ldd"], ["ldd", "--help"], ["ldd", "-h"], ["ldd", "a", "b"], ["ldd", "--env"],
                 ["ldd", "--env", "-x", "f"], ["ldd", "--js", "f"], ["ldd", "-"], ["ldd", ""], ["ldd", "-1"],
                 ["ldd", "--env=A=1", "f"], ["ldd", "--", "f"], ["check", "f"], [], ["--version"]):
        assert _lean_ldd(argv) is None, argv
    words = _lean_ldd(["ldd", "--env", "A=1", "f", "--tree", "--env", "B=2"])
    assert (words.file, words.env, words.tree, words.json, words.secure) == ("f", ["A=1", "B=2"], True, False, False)


def test_usage_errors_keep_their_one_line_and_exit_code():
    for args in (["ldd"], ["ldd", "a", "b"], ["ldd", "--env"], ["ldd", "-x", "f"]):
        done = seedance(*args)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.startswith("seedance: error: ") and done.stderr.count("\n") == 1, done.stderr
    done = seedance("ldd", "--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: seedance ldd ") and "--env VAR=VALUE" in done.stdout


@needs_library
def test_a_plain_ldd_loads_no_heavy_module():
    """argparse, json, re, dataclasses (with inspect) and the Python ELF reader were most of
    the start-up of `seedance ldd`; the plain command needs none of them."""
    code = ("import sys, io; import seedance.cli as cli; out = sys.stdout; sys.stdout = io.StringIO(); "
            f"rc = cli.main(['ldd', {LIBRARY!r}]); sys.stdout = out; "
            "print(rc, sorted(m for m in ('argparse', 'json', 're', 'dataclasses', 'inspect', 'threading', "
            "'seedance.elf.reader', 'seedance.resolve.names') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "SEEDANCE_ELF_READER"})
    rc, _, loaded = done.stdout.strip().partition(" ")
    assert rc == "0", done.stderr
    from seedance.elf import fastread

    if fastread.available():
        assert loaded == "[]"
    else:  # without the compiled C reader the Python one is the reader
        assert "seedance.elf.reader" in loaded


@pytest.mark.parametrize("entry", ["console", "fix_alias"])
def test_console_scripts_exit_with_the_commands_code_and_leave_the_collector_alone(entry, tmp_path):
    """The console scripts end with the command's exit code, and hide nothing from the cyclic
    collector (no gc.freeze: the house rules allow no process-wide tricks at exit)."""
    probe = ("import gc, sys, atexit\n"
             "from seedance import cli\n"
             "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0, flush=True))\n"
             f"sys.argv = ['seedance'] + sys.argv[1:]\n"
             f"entry = cli.{entry}\n"
             "sys.exit(entry())\n")
    args = ["--version"] if entry == "console" else ["--no-such-flag"]
    ran = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True,
                         errors="replace", timeout=120)
    assert ran.stdout.strip().endswith("frozen False"), (ran.stdout, ran.stderr)
    assert ran.returncode == (0 if entry == "console" else 2)


@pytest.mark.parametrize("columns", [None, "", "abc", "0", "-5", "37", "200"])
def test_terminal_columns_are_shutils(columns, monkeypatch):
    """terminal.columns (no shutil import on a check's start) against shutil.get_terminal_size,
    with COLUMNS unset, empty, garbage, zero, negative and set; stdout is a pipe under
    pytest, so the terminal query fails the same way for both."""
    import shutil

    from seedance.render import terminal

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    for fallback in (80, 120):
        assert terminal.columns(fallback) == shutil.get_terminal_size((fallback, 24)).columns
