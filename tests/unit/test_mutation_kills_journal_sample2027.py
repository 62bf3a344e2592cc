"""Tests for the survivors of the seed-2027 mutation sample of agent/fix/journal.py (issue 17).

Each test drives a real journal in a temp dir through the API the fixers use.  The oracles
are outside the journal: the bytes on disk (hashlib), the kernel's own errno for opening a
symlink with O_NOFOLLOW (os.strerror via the OSError it raises here), a flock taken by the
test as another seedance process would take it, and the manifest as json reads it back.
A test that opens a FIFO guards itself with signal.alarm: a mutant that drops O_NONBLOCK
must fail it, not hang the run.
"""
import errno
import hashlib
import json
import os
import signal
import fcntl

import pytest

from seedance.model.errors import BadInput
from seedance.fix import journal as journal_mod
from seedance.fix.journal import DamagedEntry, Journal


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture
def journal(tmp_path):
    return Journal(tmp_path / "journal")


class _Timeout(Exception):
    pass


@pytest.fixture
def alarm():
    """Fail (not hang) when a call blocks: the handler raises, which interrupts open(2)."""
    def ring(signum, frame):
        raise _Timeout("blocked: a FIFO was opened without O_NONBLOCK")
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(5)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _entry_dir(journal, entry_id):
    d = journal.root / entry_id
    d.mkdir(parents=True)
    return d


# -- Entry.__exit__ (mutant 2: an exception inside `with` swallowed once the entry ended) --------

def test_exception_after_commit_inside_with_propagates(journal, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    with pytest.raises(ZeroDivisionError):
        with journal.begin("test") as entry:
            entry.replace_file(str(target), b"patched")
            entry.commit()  # the entry has ended: its lock is released
            1 / 0
    assert target.read_bytes() == b"patched"
    on_disk = json.loads((journal.root / entry.id / "manifest.json").read_bytes())
    assert on_disk["status"] == "committed"


def test_exception_inside_with_of_a_read_entry_propagates(journal, tmp_path):
    with journal.begin("test") as entry:
        pass
    with pytest.raises(KeyError, match="boom"):
        with journal.read(entry.id):  # read() holds no lock
            raise KeyError("boom")


# -- Entry.move_into (mutant 9: the summary dropped) ----------------------------------------------

def test_move_into_records_its_summary(journal, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "kernel.cubin").write_bytes(b"stale")
    summary = "stale CUDA JIT cache moved aside (\u00e9)"
    with journal.begin("test") as entry:
        record = entry.move_into(str(cache), summary=summary)
    assert record["summary"] == summary
    on_disk = json.loads((journal.root / entry.id / "manifest.json").read_bytes())
    assert [r["summary"] for r in on_disk["files"]] == [summary]
    assert (journal.root / entry.id / "files" / "0" / "kernel.cubin").read_bytes() == b"stale"


# -- Entry.replace_file (mutant 102: a failing fill with a copied backup; mutant 93: result=True) ---

def test_failing_fill_with_a_copied_backup_raises_its_own_error(journal, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original bytes")
    os.link(target, tmp_path / "second-name")  # two names: the backup is a copy, no hasher runs
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fill(fd):
        os.write(fd, b"half")
        raise full

    with pytest.raises(OSError) as caught:
        with journal.begin("test") as entry:
            entry.replace_file(str(target), fill)
    assert caught.value is full
    assert target.read_bytes() == b"original bytes"
    assert sorted(os.listdir(tmp_path)) == ["journal", "lib.so", "second-name"]  # no temp left
    record = json.loads((journal.root / entry.id / "manifest.json").read_bytes())["files"][0]
    assert record["backup_kind"] == "copy"
    assert record["sha256_before"] == hashlib.sha256(b"original bytes").hexdigest()


class _FailedDigest:
    """A pending digest (what dynedit.FileEdit.fill_deferred returns) whose hashing failed."""

    def __init__(self, error):
        self.error = error
        self.abandoned = False

    def result(self):
        raise self.error

    def abandon(self):
        self.abandoned = True


def test_a_fill_whose_pending_digest_fails_rewrites_nothing(journal, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original bytes")
    io_error = OSError(errno.EIO, os.strerror(errno.EIO))

    def fill(fd):
        os.write(fd, b"patched bytes")
        return _FailedDigest(io_error)

    with pytest.raises(OSError) as caught:
        with journal.begin("test") as entry:
            entry.replace_file(str(target), fill)
    assert caught.value is io_error
    assert target.read_bytes() == b"original bytes"
    assert sorted(os.listdir(tmp_path)) == ["journal", "lib.so"]  # the temp was removed
    on_disk = json.loads((journal.root / entry.id / "manifest.json").read_bytes())
    assert on_disk["status"] == "rolled-back"
    assert on_disk["files"][0]["sha256_after"] is None


def test_a_refused_temp_abandons_the_pending_digest(journal, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original bytes")
    pending = _FailedDigest(OSError(errno.EIO, "unused"))

    def fill(fd):
        os.write(fd, b"patched bytes")
        return pending

    def verify(temp):
        raise BadInput("does not load")

    with pytest.raises(BadInput, match="does not load"):
        with journal.begin("test") as entry:
            entry.replace_file(str(target), fill, verify=verify)
    assert pending.abandoned is True
    assert target.read_bytes() == b"original bytes"


# -- Journal._maybe_unfinished (mutant 6: O_NOFOLLOW & O_NONBLOCK == 0) ------------------------------

def test_recovery_passes_a_fifo_manifest_without_blocking(journal, tmp_path, alarm):
    fifo_id = "20000101-000000-abcdef"  # older than any begun entry: recovery meets it first
    os.mkfifo(_entry_dir(journal, fifo_id) / "manifest.json")
    target = tmp_path / "lib.so"
    target.write_bytes(b"original bytes")
    entry = journal.begin("test")
    entry.replace_file(str(target), b"patched bytes")
    entry.release()  # the fixer died: the entry stays open, its lock free
    notes = journal.recover()
    assert notes == [f"{entry.id}: interrupted; rolled back on recovery; put back {target}"]
    assert target.read_bytes() == b"original bytes"
    assert journal.read(fifo_id).damaged == "manifest.json is not a regular file"


def test_a_symlinked_manifest_may_be_unfinished(journal, tmp_path):
    real = _entry_dir(journal, "20000101-000000-000001")
    (real / "manifest.json").write_text(json.dumps({"status": "committed"}))
    link_id = "20000101-000000-000002"
    os.symlink(real / "manifest.json", _entry_dir(journal, link_id) / "manifest.json")
    # a link is never followed: the entry goes to read(), which names it damaged
    assert journal._maybe_unfinished(link_id) is True
    assert journal._maybe_unfinished("20000101-000000-000001") is False


# -- Journal.entries (mutant 1: damaged entries by default) ------------------------------------------

def test_entries_leaves_out_damaged_ones_unless_asked(journal):
    with journal.begin("test") as good:
        pass
    bad_id = "20000101-000000-0000ff"
    (_entry_dir(journal, bad_id) / "manifest.json").write_bytes(b"{")
    assert [e.id for e in journal.entries()] == [good.id]
    assert [e.id for e in journal.entries(damaged=True)] == [bad_id, good.id]


# -- Journal.lock_target (mutant 20: the lock file's name) ---------------------------------------------

def test_a_lock_held_at_the_documented_path_refuses_the_fix(journal, tmp_path):
    """The lock is a protocol between processes (two seedance installs may share one journal):
    the module docstring puts it at locks/<sha256 of the real path>.lock."""
    target = tmp_path / "lib.so"
    target.write_bytes(b"original bytes")
    real = os.path.realpath(target)
    digest = hashlib.sha256(os.fsencode(real)).hexdigest()
    held = None
    try:
        with journal.begin("test") as entry:
            entry.lock_target(real)
        names = os.listdir(journal.root / "locks")
        assert len(names) == 1 and names[0].endswith(".lock")
        assert digest.startswith(names[0][:-len(".lock")]) and len(names[0]) > 30
        held = os.open(journal.root / "locks" / names[0], os.O_RDWR)
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another process's fix, as it holds it
        os.ftruncate(held, 0)  # as the journal does: the earlier holder's pid may be longer
        os.pwrite(held, b"4242", 0)
        with pytest.raises(BadInput, match=r"another seedance fix or undo \(pid 4242\) is changing it now"):
            with journal.begin("test") as entry:
                entry.replace_file(str(target), b"patched")
        assert target.read_bytes() == b"original bytes"
    finally:
        if held is not None:
            os.close(held)


# -- Journal.read (mutant 21: the unreadable text; mutant 31: the id of a non-regular manifest) --------

def test_an_unopenable_manifest_says_why_in_the_kernels_words(journal, tmp_path):
    entry_id = "20000101-000000-0000aa"
    manifest = _entry_dir(journal, entry_id) / "manifest.json"
    (tmp_path / "elsewhere.json").write_text("{}")
    os.symlink(tmp_path / "elsewhere.json", manifest)
    with pytest.raises(OSError) as kernel:
        os.close(os.open(manifest, os.O_RDONLY | os.O_NOFOLLOW))
    why = f"manifest.json unreadable ({kernel.value.strerror.lower()})"
    entry = journal.read(entry_id)
    assert entry.damaged == why
    assert entry.manifest["status"] == "damaged" and entry.manifest["note"] == why
    with pytest.raises(DamagedEntry) as refused:
        journal.load(entry_id)
    assert str(refused.value) == f"journal entry {entry_id}: {why}; nothing restored"


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_non_regular_manifest_is_damaged_under_its_own_id(journal, alarm, kind):
    entry_id = "20000101-000000-0000bb"
    manifest = _entry_dir(journal, entry_id) / "manifest.json"
    if kind == "fifo":
        os.mkfifo(manifest)
    else:
        manifest.mkdir()
    entry = journal.read(entry_id)
    assert entry.id == entry_id and entry.manifest["id"] == entry_id
    assert entry.dir == journal.root / entry_id
    assert entry.damaged == "manifest.json is not a regular file"
    assert [e.id for e in journal.entries(damaged=True)] == [entry_id]


# -- _Hasher.__init__ (mutant 1: daemon=None, i.e. not a daemon when started from the main thread) -----

def test_the_backup_hasher_never_holds_up_interpreter_exit(tmp_path):
    """replace_file leaves its hasher un-joined when verify raises a BaseException that is not an
    Exception (KeyboardInterrupt) or an fsync fails: a daemon thread lets the process exit then
    instead of waiting for the hash of a large library."""
    path = tmp_path / "lib.so"
    path.write_bytes(os.urandom(1 << 16))
    hasher = journal_mod._Hasher(str(path))
    assert hasher.daemon is True
    assert hasher.join() == sha(path)
