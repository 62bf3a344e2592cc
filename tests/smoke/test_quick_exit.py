"""`seedance check` and `seedance ldd` end with os._exit once their output is flushed, the
scan kept alive to the end (cli._quick_exit, issue 13): nothing they print may be lost, and
a process that goes on (main() in the tests, the agent) keeps nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from seedance import cli
from seedance.collect import options

SEEDANCE = Path(sys.executable).parent / "seedance"
# stdout block-buffered on a pipe, as for most users (PYTHONUNBUFFERED would hide a lost flush)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def test_a_big_report_on_a_pipe_arrives_whole_with_the_exit_code():
    proc = subprocess.run([str(SEEDANCE), "check", "--no-cache", "--strict", "--json", "/usr/lib/x86_64-linux-gnu"],
                          capture_output=True, timeout=300, env=ENV)
    report = json.loads(proc.stdout)  # every byte of a report of ~100 findings, flushed
    assert proc.returncode == report_exit(report)
    assert len(proc.stdout) > 10000


def report_exit(report) -> int:
    ranks = {"info": 0, "warning": 1, "error": 2, "fatal": 3}
    worst = max((ranks[f["severity"]] for f in report["findings"]), default=-1)
    return 1 if worst >= 1 else 0  # --strict: warnings count


def test_a_reader_that_goes_away_leaves_no_traceback():
    proc = subprocess.run(f"{SEEDANCE} check --no-cache --strict /usr/lib/x86_64-linux-gnu | head -c 10",
                          shell=True, capture_output=True, timeout=300, env=ENV)
    assert proc.stdout == b"SEVERITY  "
    assert b"Traceback" not in proc.stderr and b"Exception ignored" not in proc.stderr


def test_usage_errors_and_help_still_exit_as_before():
    bad = subprocess.run([str(SEEDANCE), "check", "--bogus"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    help_ = subprocess.run([str(SEEDANCE), "check", "--help"], capture_output=True, text=True, timeout=60)
    assert help_.returncode == 0 and "--no-cache" in help_.stdout
    ldd = subprocess.run([str(SEEDANCE), "ldd", "/bin/ls"], capture_output=True, text=True, timeout=60)
    assert ldd.returncode == 0 and "libc.so.6" in ldd.stdout


def test_main_in_a_process_that_goes_on_keeps_no_scan(tmp_path, capsys):
    assert options.KEEP_UNTIL_EXIT is None
    assert cli.main(["check", "--no-cache", "--json", str(Path(sys.executable).resolve())]) in (0, 1)
    assert options.KEEP_UNTIL_EXIT is None
    json.loads(capsys.readouterr().out)
