"""Tests written for the mutants of agent/fix/atomic.py that its tests let through (issue 17;
bench/mutation-survivors.md lists them).

Oracles: published SHA-256 test vectors and coreutils' sha256sum, the file system (names,
modes, owners, what is left), the kernel's own answers (fsync of /dev/null is EINVAL, SIGKILL
at a crash point), and strace's record of the syscalls (what is fsynced, and before which
rename): durability cannot be seen in the files without a power cut, but the order of fsync and
rename can.
"""
import errno
import hashlib
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading

import pytest

from seedance.model.errors import BadInput
from seedance.fix import atomic


def open_fds():
    return sorted(os.listdir("/proc/self/fd"))


# --- hashing ---------------------------------------------------------------------------------------

# FIPS 180-2 appendix B.1 and the empty message
ABC = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
EMPTY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_sha256_of_files_and_bytes_against_the_published_vectors_and_sha256sum(tmp_path):
    (tmp_path / "abc").write_bytes(b"abc")
    (tmp_path / "empty").write_bytes(b"")
    big = tmp_path / "big"  # several of the reader's blocks, and not a multiple of one
    big.write_bytes(os.urandom((3 << 20) + 12345))
    assert atomic.sha256_file(str(tmp_path / "abc")) == ABC
    assert atomic.sha256_file(str(tmp_path / "empty")) == EMPTY
    assert atomic.sha256_bytes(b"abc") == ABC and atomic.sha256_bytes(b"") == EMPTY
    if shutil.which("sha256sum"):
        want = subprocess.run(["sha256sum", str(big)], capture_output=True, text=True, check=True).stdout.split()[0]
    else:
        want = hashlib.sha256(big.read_bytes()).hexdigest()
    assert atomic.sha256_file(str(big)) == want


# --- names -----------------------------------------------------------------------------------------

def test_temp_names_sit_beside_the_target(tmp_path, monkeypatch):
    assert atomic.temp_path_for("/a/b/lib.so") == "/a/b/.lib.so.seedance-tmp"
    assert atomic.temp_path_for("/a/b/lib.so", "20260101-000000-abcdef") == "/a/b/.lib.so.seedance-tmp-20260101-000000-abcdef"
    monkeypatch.chdir(tmp_path)
    assert atomic.temp_path_for("lib.so") == str(tmp_path / ".lib.so.seedance-tmp")


def test_file_identity_changes_when_the_file_is_replaced(tmp_path):
    target = tmp_path / "f"
    target.write_bytes(b"one")
    first = atomic.file_identity(os.stat(target))
    assert first == atomic.file_identity(os.stat(target))
    atomic.atomic_write(str(target), b"two")
    assert atomic.file_identity(os.stat(target)) != first


# --- write_temp --------------------------------------------------------------------------------------

def test_write_temp_defaults(tmp_path):
    temp = str(tmp_path / ".f.seedance-tmp")
    assert atomic.write_temp(b"data", temp) == temp  # the path, unless result= is asked
    assert open(temp, "rb").read() == b"data"
    assert stat.S_IMODE(os.stat(temp).st_mode) == 0o644
    # a leftover of a crashed run, even a planted symlink, is replaced, never followed
    victim = tmp_path / "victim"
    victim.write_bytes(b"victim")
    os.unlink(temp)
    os.symlink(victim, temp)
    atomic.write_temp(b"fresh", temp, mode=0o600)
    assert not os.path.islink(temp) and open(temp, "rb").read() == b"fresh"
    assert stat.S_IMODE(os.stat(temp).st_mode) == 0o600
    assert victim.read_bytes() == b"victim"


def test_write_temp_with_a_fill_returns_what_it_returned(tmp_path):
    temp = str(tmp_path / ".f.seedance-tmp")

    def fill(fd):
        os.write(fd, b"filled")
        return "digest"

    assert atomic.write_temp(fill, temp, result=True) == "digest"
    assert atomic.write_temp(fill, temp) == temp
    assert atomic.write_temp(b"bytes", temp, result=True) is None
    assert open(temp, "rb").read() == b"bytes"


def test_a_fill_that_fails_leaves_no_temp_and_no_open_file(tmp_path):
    temp = str(tmp_path / ".f.seedance-tmp")
    before = open_fds()

    def fill(fd):
        os.write(fd, b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic.write_temp(fill, temp)
    assert not os.path.lexists(temp)
    assert open_fds() == before


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_write_temp_and_atomic_write_set_the_owner(tmp_path):
    temp = str(tmp_path / ".f.seedance-tmp")
    atomic.write_temp(b"x", temp, owner=(1234, 2345))
    assert (os.stat(temp).st_uid, os.stat(temp).st_gid) == (1234, 2345)
    target = tmp_path / "g"
    atomic.atomic_write(str(target), b"y", mode=0o640, owner=(3456, 4567))
    st = os.stat(target)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (3456, 4567, 0o640)


def test_atomic_write_defaults_and_leaves_one_name(tmp_path):
    target = tmp_path / "f"
    atomic.atomic_write(str(target), b"data")
    assert target.read_bytes() == b"data" and stat.S_IMODE(os.stat(target).st_mode) == 0o644
    assert os.listdir(tmp_path) == ["f"]


# --- crash points ------------------------------------------------------------------------------------

STEPS_CHILD = r"""
import os, sys
from seedance.fix import atomic
what, d = sys.argv[1], sys.argv[2]
t = os.path.join(d, ".t.seedance-tmp")
if what == "write-default":
    atomic.write_temp(b"x", t)
elif what == "write-crash":
    atomic.write_temp(b"x", t, crash=True)
elif what == "write-crash-nosync":
    atomic.write_temp(b"x", t, crash=True, sync=False)
elif what == "replace-default":
    atomic.write_temp(b"x", t); atomic.replace(t, os.path.join(d, "target"))
elif what == "replace-crash":
    atomic.write_temp(b"x", t); atomic.replace(t, os.path.join(d, "target"), crash=True)
elif what == "point":
    atomic.crash_point("after-commit")
print("alive", flush=True)
"""


@pytest.mark.parametrize("what,step,dies", [
    ("write-default", "after-temp-write", False),  # crash points are armed only when asked
    ("write-default", "after-fsync", False),
    ("write-crash", "after-temp-write", True),
    ("write-crash", "after-fsync", True),
    ("write-crash-nosync", "after-fsync", False),  # no fsync, no "after-fsync"
    ("replace-default", "after-rename", False),
    ("replace-crash", "after-rename", True),
    ("point", "after-commit", True),
    ("point", "after-rename", False),
])
def test_crash_points(tmp_path, monkeypatch, what, step, dies):
    monkeypatch.delenv(atomic.CRASH_ENV, raising=False)
    atomic.crash_point(step)  # not asked for in this process: returns
    monkeypatch.setenv(atomic.CRASH_ENV, "some-other-step")
    atomic.crash_point(step)
    atomic.write_temp(b"x", str(tmp_path / ".in-process.seedance-tmp"), crash=True)
    atomic.replace(str(tmp_path / ".in-process.seedance-tmp"), str(tmp_path / "in-process"), crash=True)
    env = {**os.environ, atomic.CRASH_ENV: step}
    proc = subprocess.run([sys.executable, "-c", STEPS_CHILD, what, str(tmp_path)], env=env,
                          capture_output=True, text=True, errors="replace", timeout=120)
    if dies:
        assert proc.returncode == -signal.SIGKILL and "alive" not in proc.stdout, proc.stderr[-2000:]
        if step == "after-rename":
            assert (tmp_path / "target").read_bytes() == b"x"  # killed after the rename, not before
    else:
        assert proc.returncode == 0 and proc.stdout.strip() == "alive", proc.stderr[-2000:]


# --- durability, as strace sees it -------------------------------------------------------------------

TRACE_CHILD = r"""
import os, sys
from seedance.fix import atomic
d = sys.argv[1]
atomic.atomic_write(os.path.join(d, "target"), b"data")
print("MARK", flush=True)
atomic.atomic_write(os.path.join(d, "nosync"), b"data", sync=False)
"""


def _trace(tmp_path, code, *args):
    if not shutil.which("strace"):
        pytest.skip("strace is not installed")
    log = tmp_path / "strace.log"
    proc = subprocess.run(["strace", "-f", "-y", "-qq", "-e", "signal=none", "-e",
                           "trace=fsync,fdatasync,rename,renameat,renameat2,write", "-o", str(log),
                           sys.executable, "-c", code, *args], capture_output=True, text=True, errors="replace",
                          timeout=120)
    if proc.returncode != 0 and "ptrace" in proc.stderr:
        pytest.skip(f"strace cannot trace here: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return log.read_text(errors="replace").splitlines()


def _events(lines, d):
    """(call, path) of the fsyncs and renames inside ``d``, in order; 'MARK' where the child printed it."""
    out = []
    for line in lines:
        if re.search(r"\bwrite\(1<[^>]*>, \"MARK", line):
            out.append(("MARK", ""))
            continue
        m = re.search(r"\b(fsync|fdatasync)\(\d+<([^>]*)>\)\s+=\s+0", line)
        if m and m.group(2).startswith(str(d)):
            out.append(("fsync", m.group(2)))
        m = re.search(r"\brename(?:at2?)?\((?:[^,]+, )?\"([^\"]+)\", (?:[^,]+, )?\"([^\"]+)\"", line)
        if m and str(d) in m.group(2):
            out.append(("rename", os.path.basename(m.group(2))))
    return out


def test_atomic_write_fsyncs_the_data_before_the_rename_and_the_directory_after(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    atomic.atomic_write(str(d / "in-process"), b"data")  # the same path once here
    events = _events(_trace(tmp_path, TRACE_CHILD, str(d)), d)
    assert events == [("fsync", str(d / ".target.seedance-tmp")), ("rename", "target"), ("fsync", str(d)),
                      ("MARK", ""), ("rename", "nosync")], events


def test_background_sync_fsyncs_the_file_and_reports_failure(tmp_path, monkeypatch):
    raised = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    target = tmp_path / "f"
    target.write_bytes(b"data")
    before = open_fds()
    atomic.BackgroundSync(str(target)).join()
    assert raised == [] and open_fds() == before
    # the kernel refuses fsync on a character device: the error comes back from join()
    syncer = atomic.BackgroundSync("/dev/null")
    with pytest.raises(OSError) as failed:
        syncer.join()
    assert failed.value.errno == errno.EINVAL
    assert raised == [] and open_fds() == before


TRACE_SYNC = r"""
import sys
from seedance.fix import atomic
atomic.BackgroundSync(sys.argv[1]).join()
"""


def test_background_sync_really_fsyncs(tmp_path):
    target = tmp_path / "f"
    target.write_bytes(b"data")
    atomic.BackgroundSync(str(target)).join()
    events = _events(_trace(tmp_path, TRACE_SYNC, str(target)), tmp_path)
    assert events == [("fsync", str(target))], events


# --- pre-flight refusals -------------------------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chattr and mount need root")


def _chattr(flag, path):
    if not shutil.which("chattr"):
        pytest.skip("chattr is not installed")
    proc = subprocess.run(["chattr", flag, str(path)], capture_output=True, text=True, errors="replace")
    if proc.returncode != 0:
        pytest.skip(f"chattr {flag} refused here: {proc.stderr.strip()[:200]}")


def test_fsync_dir_wants_a_directory(tmp_path):
    (tmp_path / "f").write_bytes(b"")
    atomic.fsync_dir(str(tmp_path))
    with pytest.raises(NotADirectoryError):
        atomic.fsync_dir(str(tmp_path / "f"))


def test_check_rewritable_messages(tmp_path):
    missing = tmp_path / "missing.so"
    with pytest.raises(BadInput) as refused:
        atomic.check_rewritable(str(missing))
    assert str(refused.value) == f"{missing}: {os.strerror(errno.ENOENT).lower()}"
    rx = tmp_path / "rx.so"  # r-x for everyone: nobody may write it, root included by choice
    rx.write_bytes(b"x")
    os.chmod(rx, 0o555)
    with pytest.raises(BadInput, match=r"file is read-only \(mode 0555\); not rewritten"):
        atomic.check_rewritable(str(rx))
    os.chmod(rx, 0o755)
    assert atomic.check_rewritable(str(rx)).st_ino == os.stat(rx).st_ino


def test_is_immutable_on_files_without_flags():
    assert atomic._is_immutable("/nonexistent/file") is False  # cannot open: judged elsewhere
    assert atomic._is_immutable("/proc/self/status") is False  # procfs has no inode flags (ENOTTY)


@needs_root
def test_an_immutable_file_and_a_file_in_an_immutable_directory_are_refused(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    target = d / "lib.so"
    target.write_bytes(b"x")
    _chattr("+i", target)
    try:
        lsattr = subprocess.run(["lsattr", str(target)], capture_output=True, text=True, errors="replace").stdout
        assert "i" in lsattr.split()[0]  # the oracle: e2fsprogs reads the same flag
        with pytest.raises(BadInput) as refused:
            atomic.check_rewritable(str(target))
        assert str(refused.value) == f"{target}: file is immutable (chattr +i); not rewritten"
    finally:
        _chattr("-i", target)
    assert atomic._is_immutable(str(target)) is False
    _chattr("+s", target)  # FS_SECRM_FL, the flag beside FS_IMMUTABLE_FL: not immutable
    assert atomic.check_rewritable(str(target)).st_ino == os.stat(target).st_ino
    _chattr("-s", target)
    _chattr("+i", d)
    try:
        with pytest.raises(BadInput) as refused:
            atomic.check_rewritable(str(target))
        assert str(refused.value) == f"{d}: directory is not writable; {target} not rewritten"
    finally:
        _chattr("-i", d)


@needs_root
def test_a_file_on_a_read_only_filesystem_is_refused(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (mnt / "lib.so").write_bytes(b"x")
        if subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True).returncode:
            pytest.skip("cannot remount read-only here")
        with pytest.raises(BadInput) as refused:
            atomic.check_rewritable(str(mnt / "lib.so"))
        assert str(refused.value) == f"{mnt / 'lib.so'}: on a read-only filesystem; not rewritten"
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


# --- which processes map a file -------------------------------------------------------------------------

MAPPER = r"""
import ctypes, mmap, sys, time
if len(sys.argv) > 2:  # a comm that is not UTF-8 (PR_SET_NAME = 15)
    ctypes.CDLL(None).prctl(15, ctypes.c_char_p(bytes.fromhex(sys.argv[2])), 0, 0, 0)
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
print("up", flush=True)
time.sleep(120)
"""


class Mappers:
    def __init__(self, path, n, comm_hex=None):
        extra = [comm_hex] if comm_hex else []
        self.procs = [subprocess.Popen([sys.executable, "-c", MAPPER, str(path), *extra], stdout=subprocess.PIPE,
                                       text=True) for _ in range(n)]
        for p in self.procs:
            assert p.stdout.readline().strip() == "up"
        self.pids = [p.pid for p in self.procs]

    def comm(self, pid):
        with open(f"/proc/{pid}/comm", "rb") as handle:
            return handle.read().decode("utf-8", "replace").strip()

    def close(self):
        for p in self.procs:
            p.kill()
            p.wait()
            p.stdout.close()


def _lib(tmp_path, name="lib.so"):
    lib = tmp_path / name
    lib.write_bytes(os.urandom(8192))
    return lib


@pytest.mark.parametrize("n,more", [(3, ""), (4, " and 1 more")])
def test_busy_names_three_processes_and_counts_the_rest(tmp_path, n, more):
    import mmap
    lib = _lib(tmp_path)
    with open(lib, "rb") as f:
        mine = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)  # this process maps it too: never counted
        mappers = Mappers(lib, n)
        try:
            index = atomic.MappedIndex.scan()
            users = index.users(str(lib))
            assert sorted(pid for pid, _ in users) == sorted(mappers.pids)
            assert all(comm == mappers.comm(pid) for pid, comm in users)
            with pytest.raises(BadInput) as refused:
                atomic.check_rewritable(str(lib), index)
            named = re.findall(r"pid (\d+) \(([^)]*)\)", str(refused.value))
            assert len(named) == 3 and all(int(pid) in mappers.pids and comm == mappers.comm(int(pid))
                                           for pid, comm in named)
            assert str(refused.value).endswith(f"{', '.join(f'pid {p} ({c})' for p, c in named)}{more}; "
                                               f"not rewritten: stop that process, re-run the fix, then restart it")
        finally:
            mappers.close()
            mine.close()


def test_a_mapping_through_another_name_of_the_same_inode_counts(tmp_path):
    lib = _lib(tmp_path)
    other = tmp_path / "hardlink.so"
    os.link(lib, other)
    mappers = Mappers(other, 1)
    try:
        assert [pid for pid, _ in atomic.MappedIndex.scan().users(str(lib))] == mappers.pids
    finally:
        mappers.close()


@pytest.mark.parametrize("directory", ["plain", "dir with space"])  # maps lines split on whitespace
def test_a_process_still_on_the_replaced_inode_does_not_block_the_new_file(tmp_path, directory):
    lib = tmp_path / directory / "lib.so"
    lib.parent.mkdir()
    lib.write_bytes(os.urandom(8192))
    mappers = Mappers(lib, 1)
    try:
        assert [pid for pid, _ in atomic.MappedIndex.scan().users(str(lib))] == mappers.pids
        atomic.atomic_write(str(lib), os.urandom(8192))  # the mapper keeps the old, now deleted, inode
        with open(f"/proc/{mappers.pids[0]}/maps", "rb") as handle:
            assert b" (deleted)" in handle.read()  # the kernel's own view of it
        assert atomic.MappedIndex.scan().users(str(lib)) == []
    finally:
        mappers.close()


def test_a_command_name_that_is_not_utf8_is_shown_replaced(tmp_path):
    lib = _lib(tmp_path)
    mappers = Mappers(lib, 1, comm_hex=b"map\xff\xfeper".hex())
    try:
        [(pid, comm)] = atomic.MappedIndex.scan().users(str(lib))
        assert pid == mappers.pids[0] and comm == "map\ufffd\ufffdper"
    finally:
        mappers.close()


TRACE_REPLACE = r"""
import os, sys
from seedance.fix import atomic
d = sys.argv[1]
t = os.path.join(d, ".target.seedance-tmp")
atomic.write_temp(b"data", t)
atomic.replace(t, os.path.join(d, "target"))  # as the journal calls it: durable by default
"""


def test_replace_makes_the_rename_durable_by_default(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    atomic.write_temp(b"x", str(d / ".in-process.seedance-tmp"))
    atomic.replace(str(d / ".in-process.seedance-tmp"), str(d / "in-process"))
    events = _events(_trace(tmp_path, TRACE_REPLACE, str(d)), d)
    assert events == [("fsync", str(d / ".target.seedance-tmp")), ("rename", "target"), ("fsync", str(d))], events


# --- the last gaps of bench/mutation-survivors.md (atomic: write_temp 29, users 39, 55, 56) ---------

def _in_fork(work):
    """Run ``work()`` in a forked copy of this process (for process-wide limits and ids the
    test must not change in itself); returns repr(result) or repr(the exception)."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(reader)
        try:
            try:
                answer = repr(work())
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                answer = repr(exc)
            os.write(writer, answer.encode())
        finally:
            os._exit(0)
    os.close(writer)
    chunks = []
    while True:
        chunk = os.read(reader, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(reader)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode()


def test_a_short_write_is_continued_until_the_kernel_refuses(tmp_path):
    """RLIMIT_FSIZE makes write(2) stop at the limit and return a short count (setrlimit(2));
    the next write fails with EFBIG (SIGXFSZ ignored).  write_temp must write on after a short
    write, so it reports the failure instead of leaving a temp that holds only the first 4 KiB.
    (A single write(2) is also cut at 0x7ffff000 bytes: the same loop is all that saves a
    temp above 2 GiB.)"""
    import resource

    temp = tmp_path / "big.seedance-tmp"
    data = os.urandom(3 * 4096 + 100)

    def work():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
        try:
            atomic.write_temp(data, str(temp))
            return ("written", os.path.getsize(temp))
        except OSError as exc:
            return ("refused", exc.errno, os.path.lexists(temp))

    assert _in_fork(work) == repr(("refused", errno.EFBIG, False))
    # without the limit the same bytes are written whole
    atomic.write_temp(data, str(temp))
    assert temp.read_bytes() == data


MAP_AT = r"""
import ctypes, mmap, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
keep = []
print("up", flush=True)
for line in sys.stdin:
    path, hint = line.split()
    f = open(path, "rb")
    keep.append(f)
    # PROT_READ, MAP_PRIVATE; the hint is only a hint (no MAP_FIXED): the kernel says where it went
    at = libc.mmap(int(hint, 16), 8192, 1, 2, f.fileno(), 0)
    print(hex(at), flush=True)
"""


def test_a_process_mapping_the_old_inode_below_the_new_one_still_counts(tmp_path):
    """A process maps lib.so, the fix renames a new file over it, and the process maps the new
    file too, at a higher address: maps lists the old inode's "(deleted)" line first.  The
    process maps the file now on disk, so it counts."""
    lib = _lib(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", MAP_AT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        proc.stdin.write(f"{lib} 0x10000000\n")
        proc.stdin.flush()
        low = int(proc.stdout.readline(), 16)
        atomic.atomic_write(str(lib), os.urandom(8192))
        proc.stdin.write(f"{lib} 0x7e0000000000\n")
        proc.stdin.flush()
        high = int(proc.stdout.readline(), 16)
        with open(f"/proc/{proc.pid}/maps", "rb") as handle:
            lines = [line for line in handle.read().splitlines() if os.fsencode(str(lib)) in line]
        # the kernel's own view: the deleted old inode first, then the new one
        if not (low < high and len(lines) == 2 and lines[0].endswith(b" (deleted)")):
            pytest.skip(f"the kernel placed the mappings otherwise: {lines}")
        assert int(lines[1].split()[4]) == os.stat(lib).st_ino
        assert [pid for pid, _ in atomic.MappedIndex.scan().users(str(lib))] == [proc.pid]
    finally:
        proc.kill()
        proc.wait()


def test_a_library_on_overlayfs_is_found_by_its_path(tmp_path):
    """overlayfs over a tmpfs lower layer: stat() gives the overlay's device, maps the device of
    the layer the file lives on, with the same inode number.  The path is what tells them to be
    one file (the mapping through overlayfs must count, a file beside it must not)."""
    lower, upper, work, merged = (tmp_path / n for n in ("lower", "upper", "work", "merged"))
    for d in (lower, upper, work, merged):
        d.mkdir()
    mounted = []
    try:
        for args in (["-t", "tmpfs", "tmpfs", str(lower)],
                     ["-t", "overlay", "overlay", "-o", f"lowerdir={lower},upperdir={upper},workdir={work}",
                      str(merged)]):
            proc = subprocess.run(["mount", *args], capture_output=True, text=True)
            if proc.returncode != 0:
                pytest.skip(f"cannot mount here: {proc.stderr.strip()}")
            mounted.insert(0, args[-1])
            if args[-1] == str(lower):
                (lower / "lib.so").write_bytes(os.urandom(8192))
                (lower / "other.so").write_bytes(os.urandom(8192))
        lib = merged / "lib.so"
        mappers = Mappers(lib, 1)
        try:
            with open(f"/proc/{mappers.pids[0]}/maps", "rb") as handle:
                [line] = [x for x in handle.read().splitlines() if x.endswith(os.fsencode(str(lib)))]
            st = os.stat(lib)
            device = tuple(int(x, 16) for x in line.split()[3].split(b":"))
            if device == (os.major(st.st_dev), os.minor(st.st_dev)):
                pytest.skip("this kernel's maps gives the overlay's own device: the path test is not needed")
            index = atomic.MappedIndex.scan()
            assert [pid for pid, _ in index.users(str(lib))] == mappers.pids
            assert index.users(str(merged / "other.so")) == []
        finally:
            mappers.close()
    finally:
        for where in mounted:
            subprocess.run(["umount", "-l", where], check=True)


def test_a_mapping_in_another_mount_namespace_with_the_target_path_counts(tmp_path):
    """A process in its own mount namespace (a container) maps a file at the target's path, but
    its maps line names another inode: a tmpfs mounted over the directory inside that namespace
    only.  maps gives no way to tell that from an overlay layer of this very file (kernels before
    overlayfs' xino report the layer's inode), so `users` errs on the side of a busy refusal:
    the path alone counts.  Without the path test (the pre-filter on the whole maps, or on each
    line) the process would be missed."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    (tmp_path / "d").mkdir()
    lib = _lib(tmp_path / "d")
    other = _lib(tmp_path, "other.so")
    script = (f"mount -t tmpfs seedance-test {tmp_path / 'd'} && cp {other} {lib} && "
              f"exec {sys.executable} -c '{MAPPER}' {lib}")
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if proc.stdout.readline().strip() != "up":
            pytest.skip(f"no private mount namespace here: {proc.stderr.read().strip()}")
        with open(f"/proc/{proc.pid}/maps", "rb") as handle:
            lines = [x for x in handle.read().splitlines() if x.endswith(os.fsencode(str(lib)))]
        # the kernel's own view: the path is the target's, the inode is not
        assert len(lines) == 1 and int(lines[0].split()[4]) != os.stat(lib).st_ino, lines
        assert b" %d " % os.stat(lib).st_ino not in open(f"/proc/{proc.pid}/maps", "rb").read()
        index = atomic.MappedIndex.scan()
        assert [pid for pid, _ in index.users(str(lib))] == [proc.pid]
        assert index.users(str(other)) == []
        with pytest.raises(BadInput, match=rf"busy, mapped by running pid {proc.pid} "):
            atomic.check_rewritable(str(lib), index)
    finally:
        proc.kill()
        proc.wait()
