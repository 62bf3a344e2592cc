"""seedance trace with real kernel eBPF (root): the acceptance scenarios of the live
tracing issue, end to end through the console script."""
from __future__ import annotations

import json
import os
import signal
import tempfile
import subprocess
import time
from pathlib import Path

import pytest

from trace_helpers import BIN, findings, trace, validate, wheel_runtime

CUDA13 = Path("/usr/local/cuda/lib64/libcudart.so.13")


def program_lines(proc) -> list:
    """The traced command's own output.  While the event stream owns seedance's stdout, the
    command's stdout goes to seedance's stderr (agent/commands/trace.py, child_stdout), one
    whole line per write beside the tracer's own "seedance trace: ..." notices."""
    return [line for line in proc.stderr.splitlines() if not line.startswith("seedance trace:")]


def program_line(proc, prefix: str) -> str:
    """The first line the traced command printed starting with prefix; a failure names the
    tracer's exit status and both of its streams (issue 17: this used to be a bare StopIteration)."""
    for line in program_lines(proc):
        if line.startswith(prefix):
            return line
    raise AssertionError(f"the traced command printed no {prefix!r} line; seedance trace exited "
                         f"{proc.returncode}\n--- stderr ---\n{proc.stderr}\n--- stdout ---\n{proc.stdout[-3000:]}")


def test_mixed_runtimes_raise_cuda_runtime_mixed_with_both_paths(ebpf, built):
    cu12 = wheel_runtime("12")
    if cu12 is None or not CUDA13.exists():
        pytest.skip("needs the nvidia-cuda-runtime-cu12 wheel and the CUDA 13 toolkit")
    proc, report = trace("--", built / "dlopen_each", cu12, CUDA13)
    assert proc.returncode == 1, proc.stderr  # an error-level finding
    assert program_line(proc, f"ok {cu12}") and program_line(proc, f"ok {CUDA13}")
    validate(report)
    assert report["command"] == "trace"
    mixed = findings(report, "cuda-runtime-mixed")
    assert len(mixed) == 1, report["findings"]
    evidence = mixed[0]["evidence"]
    assert evidence["majors"] == [12, 13]
    assert sorted(evidence["paths"]) == sorted([str(cu12), str(CUDA13)])
    assert mixed[0]["subject"]["pid"] > 0
    # raised live: the finding line is printed before the program's exit event
    lines = proc.stdout.splitlines()
    raised = next(i for i, line in enumerate(lines) if "cuda-runtime-mixed" in line)
    exited = next(i for i, line in enumerate(lines) if " exit " in line)
    assert raised < exited


def test_missing_version_node_carries_the_loaders_own_message(ebpf, built):
    consumer = built / "run" / "libconsumer.so"
    proc, report = trace("--", built / "dlopen_each", consumer)
    # the program prints dlerror(): the loader's message as the application saw it
    dlerror = program_line(proc, "error ")[len("error "):]
    assert "version `PROVIDER_2' not found" in dlerror
    validate(report)
    missing = findings(report, "symbol-version-missing")
    assert len(missing) == 1, report["findings"]
    evidence = missing[0]["evidence"]
    assert evidence["loader_message"] == dlerror
    assert evidence["requester"] == str(consumer)
    assert evidence["version"] == "PROVIDER_2"
    assert evidence["provider"] == str(built / "run" / "libprovider.so.1")
    assert evidence["provider_versions"] == ["PROVIDER_1"]
    assert missing[0]["subject"]["path"] == str(consumer)
    assert proc.returncode == 1


def test_undefined_symbol_at_dlopen_carries_the_loaders_message(ebpf, built):
    library = built / "libundefined.so"
    proc, report = trace("--", built / "dlopen_each", library)
    dlerror = program_line(proc, "error ")[len("error "):]
    undefined = findings(report, "symbol-undefined")
    assert len(undefined) == 1, report["findings"]
    assert undefined[0]["evidence"]["symbol"] == "seedance_nowhere_fn"
    assert undefined[0]["evidence"]["loader_message"] == dlerror
    assert undefined[0]["subject"]["path"] == str(library)


def test_leak_at_exit_reports_the_exact_bytes_device_and_library(ebpf, built):
    if not (built / "leaky").exists():
        pytest.skip("needs cuda.h to build the leak program")
    sizes = ["1048576", "-4096", "12345", "-777", "3000000"]
    proc, report = trace("--", built / "leaky", "1", *sizes)
    expected = 1048576 + 12345 + 3000000
    assert program_line(proc, "leaked ") == f"leaked {expected}"  # the program's own account
    validate(report)
    leaks = findings(report, "handle-leak")
    assert len(leaks) == 1, (report["findings"], proc.stderr)
    evidence = leaks[0]["evidence"]
    assert evidence["bytes"] == expected and isinstance(evidence["bytes"], int)
    assert evidence["device"] == 1
    assert evidence["library"] == str(built / "leaky")
    assert evidence["allocations"] == 3
    assert report["trace"]["cuda_libraries"][0]["path"] == str(built / "fakecuda" / "libcuda.so.1")


def test_no_leak_when_everything_is_freed(ebpf, built):
    if not (built / "leaky").exists():
        pytest.skip("needs cuda.h to build the leak program")
    proc, report = trace("--", built / "leaky", "0", "-4096", "-65536")
    assert program_line(proc, "leaked ") == "leaked 0"
    assert findings(report, "handle-leak") == []
    assert proc.returncode == 0


def test_renamed_runtime_raises_needed_soname_mismatch_observed_vs_expected(ebpf, built):
    if not (built / "renamed").exists():
        pytest.skip("needs the nvidia-cuda-runtime-cu11 wheel")
    proc, report = trace("--", built / "dlopen_each", "libcudart.so.12",
                         env={"LD_LIBRARY_PATH": str(built / "renamed")})
    assert program_line(proc, "ok libcudart.so.12")
    mismatch = findings(report, "needed-soname-mismatch")
    assert len(mismatch) == 1, report["findings"]
    evidence = mismatch[0]["evidence"]
    assert evidence["name"] == "libcudart.so.12"
    assert evidence["resolved_path"] == str(built / "renamed" / "libcudart.so.12")
    assert evidence["soname"] == "libcudart.so.11.0"


def test_json_stream_and_link_map_events(ebpf, built):
    proc, report = trace("--json", "--", built / "dlopen_each", "libz.so.1", "/nonexistent/libnope.so")
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "exec" and kinds[-1] == "exit"
    objects = [e for e in events if e["event"] == "object"]
    libz = next(e for e in objects if e["path"].endswith("/libz.so.1"))
    assert libz["soname"] == "libz.so.1" and libz["inode"] == os.stat(libz["path"]).st_ino
    assert libz["namespace"] == 0
    returns = [e for e in events if e["event"] == "dlopen_ret"]
    assert [r["ok"] for r in returns] == [True, False]
    assert returns[0]["loaded"] == libz["path"]
    errors = [e for e in events if e["event"] == "loader_error"]
    assert errors and "cannot open shared object file" in errors[0]["message"]
    assert errors[0]["context"] == "dlopen"
    assert report["stats"]["lost_events"] == 0
    assert report["stats"]["events"] == len(events)


def test_pid_exiting_mid_trace_is_a_normal_event(ebpf, built):
    target = subprocess.Popen([str(built / "dlopen_each"), "@libz.so.1"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert target.stdout.readline().strip() == "waiting"
    tracer = subprocess.Popen([str(BIN / "seedance"), "trace", "--json", "--pid", str(target.pid)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(tracer, "probes attached")
        target.stdin.write("go\n")
        target.stdin.flush()
        out, err = tracer.communicate(timeout=60)
    finally:
        if tracer.poll() is None:
            tracer.kill()
        target.wait(timeout=10)
    assert tracer.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["event"] for e in events if e["pid"] == target.pid][-1] == "exit"
    assert any(e["event"] == "dlopen_ret" and e["path"] == "libz.so.1" and e["ok"] for e in events)
    assert "all traced processes exited" in err
    assert "Traceback" not in err


def test_sigint_detaches_cleanly(ebpf, built):
    sleeper = subprocess.Popen(["sleep", "60"])
    tracer = subprocess.Popen([str(BIN / "seedance"), "trace", "--pid", str(sleeper.pid)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(tracer, "probes attached")
        tracer.send_signal(signal.SIGINT)
        out, err = tracer.communicate(timeout=60)
    finally:
        sleeper.kill()
        sleeper.wait()
        if tracer.poll() is None:
            tracer.kill()
    assert tracer.returncode == 0, err
    assert "SIGINT received: probes detached" in err
    assert "Traceback" not in err
    assert "0 lost" in err.strip().splitlines()[-1]


def test_vanished_pid_is_one_line_exit_2(ebpf):
    proc, _ = trace("--pid", "999999999")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no such process" in proc.stderr


def _wait_for(proc, text, timeout=60):
    """Read the tracer's stderr until ``text`` appears (the session says when it is ready)."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return
    raise AssertionError(f"{text!r} not seen on stderr: {''.join(seen)}")



def test_deleted_library_of_a_traced_pid_raises_lib_deleted(ebpf, built, tmp_path):
    import shutil as _shutil
    copy_dir = Path(tempfile.mkdtemp(prefix="seedance-trace-deleted-"))
    copy = copy_dir / "libz.so.1"
    _shutil.copy2("/lib/x86_64-linux-gnu/libz.so.1", copy)
    target = subprocess.Popen([str(built / "dlopen_each"), str(copy), "@libm.so.6"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().strip() == f"ok {copy}"
        assert target.stdout.readline().strip() == "waiting"
        copy.unlink()  # an upgrade replaced it on disk: the process still runs the old code
        tracer = subprocess.Popen([str(BIN / "seedance"), "trace", "-q", "--json", "--pid", str(target.pid)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_for(tracer, "probes attached")
        target.stdin.write("go\n")
        target.stdin.flush()
        out, err = tracer.communicate(timeout=60)
    finally:
        target.kill()
        target.wait()
        _shutil.rmtree(copy_dir, ignore_errors=True)
    deleted = [json.loads(line) for line in out.splitlines() if '"lib-deleted"' in line]
    assert len(deleted) == 1, (out, err)
    assert deleted[0]["subject"] == {"pid": target.pid, "path": str(copy)}
    assert deleted[0]["evidence"]["state"] == "deleted"


def test_lost_events_are_counted_and_the_leak_is_still_exact(ebpf, built):
    """A one-page ring buffer overflows; the loss is reported, and the leak evidence comes
    from the kernel's allocation map, so it does not depend on the events that were lost."""
    if not (built / "leaky").exists():
        pytest.skip("needs cuda.h to build the leak program")
    sizes = [str(4096 + i) for i in range(600)]
    proc, report = trace("--json", "--buffer-pages", "1", "--", built / "leaky", "0", *sizes)
    expected = sum(int(s) for s in sizes)
    assert program_line(proc, "leaked ") == f"leaked {expected}"
    assert report["stats"]["lost_events"] > 0
    assert f"{report['stats']['lost_events']} lost" in proc.stderr.strip().splitlines()[-1]
    leaks = findings(report, "handle-leak")
    assert len(leaks) == 1 and leaks[0]["evidence"]["bytes"] == expected
    assert leaks[0]["evidence"]["allocations"] == 600


def test_runtimes_mixed_before_the_trace_started_are_found_for_a_pid(ebpf, built):
    """--pid: what the process mapped before we attached comes from /proc/PID/maps."""
    import sys as _sys
    cu12 = wheel_runtime("12")
    if cu12 is None or not CUDA13.exists():
        pytest.skip("needs the nvidia-cuda-runtime-cu12 wheel and the CUDA 13 toolkit")
    code = (f"import ctypes, sys; ctypes.CDLL({str(cu12)!r}); ctypes.CDLL({str(CUDA13)!r}); "
            "print('ready', flush=True); sys.stdin.readline()")
    target = subprocess.Popen([_sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().strip() == "ready"
        tracer = subprocess.Popen([str(BIN / "seedance"), "trace", "-q", "--json", "--pid", str(target.pid)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_for(tracer, "probes attached")
        target.stdin.write("done\n")
        target.stdin.flush()
        out, err = tracer.communicate(timeout=60)
    finally:
        target.kill()
        target.wait()
    mixed = [json.loads(line) for line in out.splitlines() if '"cuda-runtime-mixed"' in line]
    assert len(mixed) == 1, (out, err)
    assert mixed[0]["subject"]["pid"] == target.pid
    # /proc/PID/maps names the files the kernel resolved (symlinks followed)
    assert sorted(mixed[0]["evidence"]["paths"]) == sorted([os.path.realpath(cu12), os.path.realpath(CUDA13)])
    assert tracer.returncode == 1
