import os
import shutil
import subprocess
import sys

import pytest

from seedance.collect import process
from seedance.judge.engine import load_rules

LIBZ = "/usr/lib/x86_64-linux-gnu/libz.so.1"


@pytest.fixture
def loader(tmp_path):
    """A real process that has dlopened a private copy of libz, then waits."""
    if not os.path.exists(LIBZ):
        pytest.skip("libz.so.1 not installed")
    lib = tmp_path / "libzcopy.so.1"
    shutil.copy(os.path.realpath(LIBZ), lib)
    child = subprocess.Popen([sys.executable, "-c",
                              "import ctypes, sys; ctypes.CDLL(sys.argv[1]); print('up', flush=True);"
                              " sys.stdin.read()", str(lib)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "up"
    yield child, lib
    child.stdin.close()
    child.wait(timeout=10)


def lib_fact(view, lib):
    facts = [f for f in process.mapped_lib_facts(view) if f.subject["path"] == str(lib)]
    assert len(facts) == 1
    return facts[0]


def test_loaded_library_is_ok(loader):
    child, lib = loader
    view = process.read_process(child.pid)
    assert view.exe == os.path.realpath(sys.executable)
    assert lib_fact(view, lib).data["state"] == "ok"


def test_deleted_library(loader):
    child, lib = loader
    lib.unlink()
    fact = lib_fact(process.read_process(child.pid), lib)
    assert fact.data["deleted"] is True
    findings = load_rules().evaluate([fact])
    assert [f.rule for f in findings] == ["lib-deleted"]
    assert findings[0].subject == {"pid": child.pid, "path": str(lib)}


def test_replaced_library(loader):
    child, lib = loader
    new = lib.with_name("new.so")
    shutil.copy(lib, new)
    os.replace(new, lib)  # what an upgrade does: a new inode under the old name
    fact = lib_fact(process.read_process(child.pid), lib)
    assert (fact.data["state"], fact.data["replaced"]) == ("replaced", True)
    assert fact.data["disk_inode"] == os.stat(lib).st_ino


def test_vanished_process_is_process_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    with pytest.raises(process.ProcessGone):
        process.read_process(child.pid)


def test_parse_maps_dedups_and_marks_deleted():
    raw = (b"7f00-7f01 r--p 00000000 08:01 42 /usr/lib/libx.so.1\n"
           b"7f01-7f02 r-xp 00001000 08:01 42 /usr/lib/libx.so.1\n"
           b"7f02-7f03 r--p 00000000 08:01 43 /tmp/liby.so (deleted)\n"
           b"7f03-7f04 rw-p 00000000 00:00 0 \n"
           b"7f04-7f05 rw-p 00000000 00:00 0 [heap]\n")
    maps = process.parse_maps(raw)
    assert [(m.path, m.inode, m.deleted) for m in maps] == [
        ("/usr/lib/libx.so.1", 42, False), ("/tmp/liby.so", 43, True)]


def test_process_preloading_from_a_world_writable_dir(tmp_path):
    if not os.path.exists(LIBZ):
        pytest.skip("libz.so.1 not installed")
    open_dir = tmp_path / "drop"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    lib = open_dir / "libinject.so"
    shutil.copy(os.path.realpath(LIBZ), lib)
    env = dict(os.environ, LD_PRELOAD=f"{lib} {tmp_path}/gone.so")
    child = subprocess.Popen([sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "up"
        facts = process.preload_facts(process.read_process(child.pid))
    finally:
        child.stdin.close()
        child.wait(timeout=10)
    assert len(facts) == 1
    data = facts[0].data
    assert (data["preload_missing"], data["preload_writable"]) == (True, True)
    findings = load_rules().evaluate(facts)
    assert [f.rule for f in findings] == ["env-leak"]
    assert findings[0].subject["pid"] == child.pid


def _a_kernel_thread():
    """A pid whose /proc/PID/stat flags carry PF_KTHREAD (kthreadd is pid 2 on a host), read
    here from the flags directly; None where this namespace shows none (a container)."""
    for name in sorted(os.listdir("/proc"), key=lambda n: (len(n), n)):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                flags = int(handle.read().rpartition(b")")[2].split()[6])
        except (OSError, IndexError, ValueError):
            continue
        if flags & 0x00200000:
            return int(name)
    return None


def test_a_kernel_thread_is_read_not_vanished():
    """A kernel thread has no maps, no exe, and its environ read fails with ESRCH, which read
    as "the process exited": a host check here said 57 processes had vanished."""
    from seedance.collect.scan import CheckOptions, Scanner
    from seedance.model.errors import BadInput

    pid = _a_kernel_thread()
    if pid is None:
        pytest.skip("no kernel thread visible in this pid namespace")
    view = process.read_process(pid)
    assert view.exe is None and view.mappings == [] and view.environ == {}
    scanner = Scanner(CheckOptions(pids=[pid]))
    scanner._process(pid, explicit=False)
    assert (scanner.stats["processes"], scanner.stats["vanished"]) == (0, 0)
    with pytest.raises(BadInput, match=rf"^pid {pid}: a kernel thread"):
        scanner._process(pid, explicit=True)


def test_an_exited_unreaped_process_is_still_process_gone():
    """A zombie has no maps and no exe either, and its environ read fails the same way; it is
    no kernel thread, so it stays "gone"."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        for _ in range(200):  # until it is a zombie
            with open(f"/proc/{pid}/stat", "rb") as handle:
                if handle.read().rpartition(b")")[2].split()[0] == b"Z":
                    break
            import time
            time.sleep(0.01)
        assert not process.is_kernel_thread(pid)
        with pytest.raises(process.ProcessGone):
            process.read_process(pid)
    finally:
        os.waitpid(pid, 0)
