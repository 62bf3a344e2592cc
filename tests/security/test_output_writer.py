"""Issue 10, defect 1 and 7: writing a report or a stream never destroys what stands at the
path, never follows a link someone planted, and never mixes a wrapped program's stdout into
a JSON stream.  Every test runs the installed CLI for real against real files, devices,
FIFOs and links; the oracles are the kernel's own (stat, readlink, inotify), not the writer.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import select
import shutil
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from tests.conftest import BIN

SEEDANCE = str(BIN / "seedance")
TRUE = shutil.which("true")
SCHEMA = "seedance.report/v1"


def run(*args, cwd=None, timeout=180, **kw):
    """The CLI as a user runs it; bytes decoded leniently (an oracle never decodes strictly)."""
    proc = subprocess.run([SEEDANCE, *map(str, args)], capture_output=True, cwd=cwd, timeout=timeout, **kw)
    proc.out = proc.stdout.decode("utf-8", "surrogateescape")
    proc.err = proc.stderr.decode("utf-8", "surrogateescape")
    return proc


def one_error_line(proc) -> str:
    lines = proc.err.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.err)
    assert len(lines) == 1 and lines[0].startswith("seedance: error: "), proc.err
    assert "Traceback" not in proc.err
    return lines[0]


def sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def elf_copy(directory: Path, name: str = "py") -> Path:
    target = directory / name
    shutil.copy2(TRUE, target)
    assert target.read_bytes()[:4] == b"\x7fELF"
    return target


# -- the swallowed target -------------------------------------------------------------------
def test_report_json_cannot_swallow_a_target(tmp_path):
    """`check --report-json ./py`: ./py was taken as the report file and overwritten."""
    py = elf_copy(tmp_path)
    before = sha(py)
    proc = run("check", "--no-progress", "--report-json", "./py", cwd=tmp_path)
    line = one_error_line(proc)
    assert "./py" in line and "--force" in line
    assert sha(py) == before and os.access(py, os.X_OK)
    assert sorted(os.listdir(tmp_path)) == ["py"]  # no report, no temp file
    # without a FILE at all it is a usage error, never "the next word"
    one_error_line(run("check", "--report-json"))
    one_error_line(run("plugin", "verify", "--report-json"))


def test_force_replaces_a_foreign_file(tmp_path):
    py = elf_copy(tmp_path)
    mode = stat.S_IMODE(py.stat().st_mode)
    proc = run("check", "--no-progress", "--force", "--report-json", py, TRUE)
    assert proc.returncode in (0, 1), proc.err
    assert json.loads(py.read_text())["schema"] == SCHEMA
    assert stat.S_IMODE(py.stat().st_mode) == mode  # the file keeps its permissions


def test_own_report_is_replaced_without_force(tmp_path):
    report = tmp_path / "r.json"
    for _ in range(2):  # the second run replaces the first one's report
        proc = run("check", "--no-progress", "--report-json", report, TRUE)
        assert proc.returncode in (0, 1), proc.err
    assert json.loads(report.read_text())["schema"] == SCHEMA
    assert sorted(os.listdir(tmp_path)) == ["r.json"]


# -- devices, FIFOs, descriptors: written through, never replaced -----------------------------
def test_dev_null_stays_a_char_device():
    before = os.stat("/dev/null")
    proc = run("check", "--no-progress", "--report-json", "/dev/null", TRUE)
    assert proc.returncode in (0, 1), proc.err
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino


def test_dev_full_is_one_line_exit_2():
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    before = os.stat("/dev/full")
    line = one_error_line(run("check", "--no-progress", "--report-json", "/dev/full", TRUE))
    assert "/dev/full" in line and "no space" in line
    after = os.stat("/dev/full")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev


def test_fifo_is_written_through(tmp_path):
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    got = []

    def reader():
        with open(fifo, "rb") as handle:  # blocks until the writer opens it
            got.append(handle.read())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    proc = run("check", "--no-progress", "--report-json", fifo, TRUE)
    thread.join(60)
    assert proc.returncode in (0, 1), proc.err
    assert got and json.loads(got[0])["schema"] == SCHEMA
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["report.fifo"]


def test_descriptor_path_writes_into_the_shells_file(tmp_path):
    """/dev/fd/3 onto a file the shell opened: the same inode gets the report."""
    out = tmp_path / "out.json"
    out.touch()
    inode = out.stat().st_ino
    proc = subprocess.run(["sh", "-c", f'exec {SEEDANCE} check --no-progress --report-json /dev/fd/3 {TRUE} 3>>"$0"',
                           str(out)], capture_output=True, timeout=180)
    assert proc.returncode in (0, 1), proc.stderr
    assert out.stat().st_ino == inode
    assert json.loads(out.read_text())["schema"] == SCHEMA


# -- symlinks ---------------------------------------------------------------------------------
def test_symlinked_report_path_keeps_its_link(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "report.json"
    link = tmp_path / "link.json"
    link.symlink_to("real/report.json")  # dangling: the target does not exist yet
    for _ in range(2):  # created through the link, then replaced through it
        proc = run("check", "--no-progress", "--report-json", link, TRUE)
        assert proc.returncode in (0, 1), proc.err
        assert link.is_symlink() and os.readlink(link) == "real/report.json"
        assert json.loads(target.read_text())["schema"] == SCHEMA
    assert sorted(os.listdir(tmp_path / "real")) == ["report.json"]


def test_planted_symlink_at_the_old_temp_name_is_not_followed(tmp_path):
    """The old writer opened `.NAME.PID.tmp` without O_EXCL/O_NOFOLLOW.  The shell plants a
    link at that name for its own PID, then execs seedance (same PID)."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    script = (f'ln -s {victim} "{shared}/.r.json.$$.tmp" && '
              f'exec {SEEDANCE} check --no-progress --report-json {shared}/r.json {TRUE}')
    proc = subprocess.run(["sh", "-c", script], capture_output=True, timeout=180)
    assert proc.returncode in (0, 1), proc.stderr
    assert victim.read_text() == "precious\n"
    report = shared / "r.json"
    assert not report.is_symlink() and json.loads(report.read_text())["schema"] == SCHEMA
    left = sorted(p for p in os.listdir(shared) if p != "r.json")
    assert len(left) == 1 and (shared / left[0]).is_symlink()  # only the planted link remains


def test_link_planted_by_another_user_in_a_sticky_dir_is_refused(tmp_path):
    """fs.protected_symlinks for our rename: root never writes where another user's link in
    /tmp-like directory points."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give the link another owner")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    link = shared / "report.json"
    link.symlink_to(victim)
    os.lchown(link, 65534, 65534)
    line = one_error_line(run("check", "--no-progress", "--report-json", link, TRUE))
    assert "symlink" in line
    assert victim.read_text() == "precious\n" and link.is_symlink()


# -- checked before the scan ------------------------------------------------------------------
class _Inotify:
    """The kernel's record of who opened a file (IN_OPEN): the oracle for "before the scan"."""
    IN_OPEN = 0x20

    def __init__(self, path: Path):
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0 or libc.inotify_add_watch(self.fd, str(path).encode(), self.IN_OPEN) < 0:
            pytest.skip("inotify unavailable")

    def opened(self) -> bool:
        ready, _, _ = select.select([self.fd], [], [], 0.5)
        if not ready:
            return False
        return len(os.read(self.fd, 4096)) > 0

    def close(self):
        os.close(self.fd)


def test_report_to_a_directory_fails_before_the_scan(tmp_path):
    target = elf_copy(tmp_path, "target.so")
    out = tmp_path / "outdir"
    out.mkdir()
    watch = _Inotify(target)
    try:
        line = one_error_line(run("check", "--no-progress", "--report-json", out, target))
        assert "directory" in line
        assert not watch.opened(), "the target was read before the report path was refused"
        assert os.listdir(out) == [] and sorted(os.listdir(tmp_path)) == ["outdir", "target.so"]
        # the oracle sees a scan when there is one
        proc = run("check", "--no-progress", "--report-json", tmp_path / "ok.json", target)
        assert proc.returncode in (0, 1), proc.err
        assert watch.opened()
    finally:
        watch.close()


def test_missing_parent_and_block_device_fail_before_the_scan(tmp_path):
    line = one_error_line(run("check", "--no-progress", "--report-json", tmp_path / "no" / "r.json", TRUE))
    assert "no such file" in line
    blocks = [f"/dev/{n}" for n in sorted(os.listdir("/dev")) if stat.S_ISBLK(os.stat(f"/dev/{n}").st_mode)]
    if blocks:
        before = os.stat(blocks[0])
        one_error_line(run("check", "--no-progress", "--report-json", blocks[0], TRUE))
        assert os.stat(blocks[0]).st_mode == before.st_mode


# -- streams never share a descriptor with the wrapped program --------------------------------
def _audit_trace_available() -> str:
    try:
        from seedance import shim
        shim.library_path()
        shim.binding()
    except Exception as exc:  # noqa: BLE001 - any reason the shim cannot load is a skip
        return f"shim unavailable: {exc}"
    return ""


PRINTER = ["sh", "-c", "echo not-json-from-the-program; echo '{\"event\": \"forged\"}'"]


def test_trace_json_stream_survives_a_program_that_prints():
    why = _audit_trace_available()
    if why:
        pytest.skip(why)
    proc = run("trace", "--backend", "audit", "--json", "--", *PRINTER)
    assert proc.returncode in (0, 1), proc.err
    events = [json.loads(line) for line in proc.out.splitlines()]  # every line is ours
    assert events and all(e["event"] != "forged" for e in events)
    assert any(e["event"] == "exec" for e in events)
    assert "not-json-from-the-program" in proc.err  # the program's stdout went to stderr


def test_trace_output_file_keeps_the_programs_stdout(tmp_path):
    why = _audit_trace_available()
    if why:
        pytest.skip(why)
    stream = tmp_path / "events.jsonl"
    for _ in range(2):  # a rerun replaces its own stream without --force
        proc = run("trace", "--backend", "audit", "--json", "-o", stream, "--", *PRINTER)
        assert proc.returncode in (0, 1), proc.err
        assert proc.out.splitlines() == ["not-json-from-the-program", '{"event": "forged"}']
        events = [json.loads(line) for line in stream.read_text().splitlines()]
        assert events and all(e["event"] != "forged" for e in events)
    # a foreign file is not a stream of ours
    py = elf_copy(tmp_path)
    before = sha(py)
    one_error_line(run("trace", "--backend", "audit", "--json", "-o", py, "--", "true"))
    assert sha(py) == before


def test_trace_report_to_stdout_after_the_stream():
    why = _audit_trace_available()
    if why:
        pytest.skip(why)
    proc = run("trace", "--backend", "audit", "--quiet", "--report-json", "-", "--", *PRINTER)
    assert proc.returncode in (0, 1), proc.err
    assert json.loads(proc.out)["schema"] == SCHEMA  # the program's lines are not in it
    assert "not-json-from-the-program" in proc.err


def test_trace_stream_to_dev_full_is_one_line():
    why = _audit_trace_available()
    if why:
        pytest.skip(why)
    proc = run("trace", "--backend", "audit", "--json", "-o", "/dev/full", "--", "true")
    errors = [line for line in proc.err.splitlines() if "error" in line]
    assert proc.returncode == 2 and "Traceback" not in proc.err  # notices may come first
    assert len(errors) == 1 and errors[0].startswith("seedance: error: ")
    assert "/dev/full" in errors[0] and "no space" in errors[0]
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


# -- what counts as ours (agent/render/output.py docstring): each marker, and what is not ------------
def _refused(path) -> bool:
    from seedance.model.errors import UsageError
    from seedance.render.output import prepare_output
    try:
        prepare_output(str(path))
    except UsageError:
        return True
    return False


@pytest.mark.parametrize(("content", "ours"), [
    (b"", True),
    (b"\n  \n", True),
    (json.dumps({"schema": "seedance.report/v1", "findings": []}).encode(), True),
    (json.dumps({"schema": "seedance.ldd/v1"}, indent=2).encode(), True),
    (b'{"event": "exec", "pid": 1}\n{"event": "exit", "pid": 1}\n', True),
    (b'{"seq": 1, "t_ns": 5, "pid": 7, "kind": "init"}\n', True),
    (b'{"kind": "Deployment", "apiVersion": "v1"}\n', False),
    (b"# seedance trace: ./app\n   42 app  exec  /app\n", True),
    (json.dumps({"$schema": "https://json.schemastore.org/sarif-2.1.0.json",
                 "runs": [{"tool": {"driver": {"name": "seedance"}}}]}).encode(), True),
    (json.dumps({"$schema": "https://json.schemastore.org/sarif-2.1.0.json",
                 "runs": [{"tool": {"driver": {"name": "other"}}}]}).encode(), False),
    (json.dumps({"schema": "other/v1"}).encode(), False),
    (b'{"name": "package.json of someone"}', False),
    (b"seedance notes, typed by hand\n", False),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", False),
    (b"#!/bin/sh\necho seedance\n", False),
])
def test_recognised_outputs(tmp_path, content, ours):
    path = tmp_path / "out"
    path.write_bytes(content)
    assert _refused(path) is not ours
    assert path.read_bytes() == content  # preparing never writes


def test_a_large_report_is_still_ours(tmp_path):
    path = tmp_path / "big.json"
    findings = [{"rule": "r", "message": "x" * 200} for _ in range(2000)]  # well over the 64 KiB head
    path.write_text(json.dumps({"schema": "seedance.report/v1", "findings": findings}, indent=2))
    assert path.stat().st_size > 256 * 1024
    assert not _refused(path)
    path.write_text(json.dumps({"findings": findings, "schema": "seedance.report/v1"}, indent=2)[:-1])
    assert _refused(path)  # truncated and its marker not first: not recognisably ours


def test_bench_plot_png_is_ours(tmp_path):
    pytest.importorskip("matplotlib")
    from seedance.plugins.bench import plot
    rounds = [{"round": i, "p50_ms": 1.0 + i, "p99_ms": 2.0 + i} for i in (1, 2)]
    result = {"plugin": "p", "version": "1", "policy": "static", "max_batch_size": 4, "max_wait_ms": 2,
              "rates": {"low": {"rate_rps": 10, "p99_cv": 0.01, "throughput_drift": 0.0, "rounds": rounds}}}
    path = tmp_path / "latency.png"
    plot(result, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not _refused(path)


def test_replacing_keeps_owner_and_mode(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the report another owner")
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"schema": SCHEMA}))
    os.chown(report, 65534, 65534)
    os.chmod(report, 0o640)
    proc = run("check", "--no-progress", "--report-json", report, TRUE)
    assert proc.returncode in (0, 1), proc.err
    st = report.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, 65534, 0o640)
    assert json.loads(report.read_text())["findings"] is not None


def test_a_failed_write_leaves_the_old_report_and_no_temp(tmp_path):
    """RLIMIT_FSIZE makes the write fail half way (EFBIG): the old report stays whole and the
    temp file is removed."""
    import resource
    import signal

    report = tmp_path / "r.json"
    old = json.dumps({"schema": SCHEMA, "findings": [], "note": "the previous run"})
    report.write_text(old)

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death
        resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))

    proc = subprocess.run([SEEDANCE, "check", "--no-progress", "--report-json", str(report), TRUE],
                          capture_output=True, text=True, timeout=180, preexec_fn=limit)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("seedance: error: cannot write the report to ")
    assert report.read_text() == old
    assert sorted(os.listdir(tmp_path)) == ["r.json"]
