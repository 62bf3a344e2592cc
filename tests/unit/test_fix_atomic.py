"""Pre-flight refusals and the durable write."""
import os
import shutil
import stat
import subprocess
import sys

import pytest

from seedance.model.errors import BadInput
from seedance.fix import atomic


def test_atomic_write_sets_mode_and_leaves_no_temp(tmp_path):
    target = tmp_path / "f"
    atomic.atomic_write(str(target), b"data", mode=0o640)
    assert target.read_bytes() == b"data"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640
    assert os.listdir(tmp_path) == ["f"]


def test_read_only_file_is_refused(tmp_path):
    target = tmp_path / "ro.so"
    target.write_bytes(b"x")
    os.chmod(target, 0o444)
    with pytest.raises(BadInput, match="read-only"):
        atomic.check_rewritable(str(target))


def test_not_a_regular_file_is_refused(tmp_path):
    with pytest.raises(BadInput, match="not a regular file"):
        atomic.check_rewritable(str(tmp_path))


def test_file_mapped_by_a_running_process_is_refused(tmp_path):
    lib = tmp_path / "libm-copy.so.6"
    shutil.copy("/lib/x86_64-linux-gnu/libm.so.6", lib)
    child = subprocess.Popen([sys.executable, "-c",
                              "import ctypes, sys, time; ctypes.CDLL(sys.argv[1]); print('up', flush=True); time.sleep(60)",
                              str(lib)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        mapped = atomic.MappedIndex.scan()
        with pytest.raises(BadInput, match=rf"busy, mapped by running pid {child.pid} .*restart"):
            atomic.check_rewritable(str(lib), mapped)
    finally:
        child.kill()
        child.wait()
    # once the process is gone the same file is fine
    assert atomic.check_rewritable(str(lib), atomic.MappedIndex.scan())


def test_crash_point_kills_only_at_the_named_step(tmp_path):
    code = ("import os, sys; os.environ['SEEDANCE_FIX_CRASH_AT'] = 'after-fsync';"
            "from seedance.fix import atomic;"
            "atomic.crash_point('after-rename'); print('alive', flush=True); atomic.crash_point('after-fsync');"
            "print('not reached')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9
    assert proc.stdout.strip() == "alive"
