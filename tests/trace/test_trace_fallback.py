"""Without eBPF, `seedance trace --backend auto` says why in one line and traces a launched
command through the shim's LD_AUDIT module; what needs eBPF fails in one line, exit 2."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from trace_helpers import findings, trace, validate

from tests.conftest import NOBODY, seedance_as_nobody

HIDDEN = {"SEEDANCE_KERNEL_HEADERS": "/nonexistent"}


@pytest.fixture(scope="module")
def shim_library():
    from seedance import shim
    from seedance.model.errors import NotAvailable
    try:
        return shim.library_path()
    except NotAvailable as exc:
        pytest.skip(f"the shim is not built: {exc}")


def _events(stdout: str) -> list:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_hidden_headers_fall_back_to_ld_audit_and_say_why(built, shim_library):
    proc, report = trace("--json", "--", built / "dlopen_each", "libz.so.1", env=HIDDEN)
    assert proc.returncode == 0, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first == ("seedance trace: eBPF unavailable (no kernel headers at /nonexistent "
                     "(SEEDANCE_KERNEL_HEADERS)); falling back to LD_AUDIT")
    assert report["trace"]["backend"] == "audit"
    events = _events(proc.stdout)
    objects = [e["path"] for e in events if e["event"] == "object"]
    assert any(path.endswith("/libz.so.1") for path in objects)  # the dlopen, seen by ld.so's audit
    searches = [e for e in events if e["event"] == "search" and e["name"] == "libz.so.1"]
    assert searches and searches[0]["source"] == "LA_SER_ORIG"
    assert "ok libz.so.1" in proc.stderr  # the stream owns stdout: the command's own went to stderr


def test_non_root_falls_back_and_still_reports_the_leak(built, shim_library):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the tracer as nobody")
    if not (built / "leaky").exists():
        pytest.skip("needs cuda.h to build the leak program")
    proc, report = trace("--", built / "leaky", "0", "8192", "-4096", prefix=NOBODY, cli=seedance_as_nobody(),
                         env={"HOME": "/tmp"})
    assert proc.returncode == 0, proc.stderr
    assert "eBPF unavailable (not root (uid 65534)" in proc.stderr.splitlines()[0]
    assert "falling back to LD_AUDIT" in proc.stderr.splitlines()[0]
    assert "leaked 8192" in proc.stderr  # the command's stdout, moved off the stream's
    validate(report)
    leaks = findings(report, "handle-leak")
    assert len(leaks) == 1 and leaks[0]["evidence"]["bytes"] == 8192, report["findings"]
    assert leaks[0]["evidence"]["device"] == 0


def test_pid_without_ebpf_is_one_line_exit_2(built):
    proc, _ = trace("--pid", str(os.getpid()), env=HIDDEN)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "eBPF unavailable: no kernel headers at /nonexistent" in proc.stderr
    assert "LD_AUDIT only covers a launched command" in proc.stderr


def test_forced_ebpf_without_ebpf_is_one_line_exit_2(built):
    proc, _ = trace("--backend", "ebpf", "--", built / "dlopen_each", env=HIDDEN)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("seedance: error: eBPF unavailable: no kernel headers at /nonexistent "
                                   "(SEEDANCE_KERNEL_HEADERS)")


def test_missing_command_is_one_line_exit_2(built, shim_library):
    proc, _ = trace("--backend", "audit", "--", "/nonexistent/program")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_headers_that_do_not_compile_fall_back_with_the_compilers_error(ebpf, built, shim_library, tmp_path):
    """The environment checks pass (an include/ exists) but clang fails: still one line."""
    (tmp_path / "include").mkdir()
    proc, report = trace("--", built / "dlopen_each", "libz.so.1",
                         env={"SEEDANCE_KERNEL_HEADERS": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("seedance trace: eBPF unavailable (bcc could not compile or load the probes: ")
    assert "file not found" in first and first.endswith("); falling back to LD_AUDIT")
    assert report["trace"]["backend"] == "audit"
    assert "ok libz.so.1" in proc.stderr.splitlines()  # the command's stdout, moved off the stream's
