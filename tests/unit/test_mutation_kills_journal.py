"""Tests written for the mutants of agent/fix/journal.py that the journal tests let through
(issue 17; bench/mutation-survivors.md lists them).

The oracles are outside the journal: the file system (bytes, mode, owner, symlinks, what is
left beside a target and in the journal), the kernel (EXDEV between the test's directory and
/dev/shm, SIGKILL of a child fixer at the documented crash points), and the messages the user
reads, computed here from the files (sha256 prefixes) and from libc (strerror).

mutmut runs a test for a mutant only when the test reached the mutated function in its own
process, so a test that kills a fixer in a child also runs the same path once in-process.
"""
import errno
import hashlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile

import pytest

from seedance.cli import main
from seedance.model.errors import BadInput
from seedance.fix.journal import Journal, RestoreRefused, VerifyFailed


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture
def state(tmp_path, monkeypatch):
    """A journal where the CLI looks for it (XDG_STATE_HOME), for history and undo in-process."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return Journal(tmp_path / "state" / "seedance" / "journal")


def cli(capsys, *argv):
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def history(capsys):
    rc, out, err = cli(capsys, "fix", "history", "--json")
    assert rc == 0, err
    return {e["id"]: e for e in json.loads(out)}


def other_fs_dir(tmp_path):
    shm = "/dev/shm"
    if not os.path.isdir(shm) or not os.access(shm, os.W_OK) or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the test's tmp dir")
    return tempfile.TemporaryDirectory(dir=shm)


def temps(directory):
    return sorted(n for n in os.listdir(directory) if ".seedance-tmp" in n)


# --- a fixer killed at each crash point (SEEDANCE_FIX_CRASH_AT) ------------------------------------

CHILD = r"""
import sys
from seedance.fix.journal import Journal
root, op, path = sys.argv[1:4]
with Journal(root).begin("crash-test") as entry:
    if op == "create":
        entry.create_file(path, b"X=1\n")
    elif op == "move":
        entry.move_into(path)
    elif op == "modify":
        entry.replace_file(path, b"result bytes")
print("finished", flush=True)
"""


def run_child(root, op, path, step):
    env = {**os.environ, "SEEDANCE_FIX_CRASH_AT": step}
    return subprocess.run([sys.executable, "-c", CHILD, str(root), op, str(path)], env=env,
                          capture_output=True, text=True, errors="replace", timeout=120)


CREATE_STEPS = ["after-backup", "after-temp-write", "after-fsync", "after-verify", "after-rename", "after-commit"]


def test_create_file_killed_at_each_step_is_removed_by_recovery(state, tmp_path, capsys):
    d = tmp_path / "env.d"
    d.mkdir()  # an existing directory, as /etc/environment.d is
    # the same path once in this process, uninterrupted
    with state.begin("reference") as entry:
        entry.create_file(str(d / "ref.conf"), b"X=1\n")
    assert (d / "ref.conf").read_bytes() == b"X=1\n"
    for step in CREATE_STEPS:
        target = d / f"{step}.conf"
        before = set(state.ids())
        proc = run_child(state.root, "create", target, step)
        assert proc.returncode == -signal.SIGKILL, (step, proc.returncode, proc.stderr[-2000:])
        [crashed] = set(state.ids()) - before
        notes = state.recover()
        entries = history(capsys)
        if step == "after-commit":
            # committed before the kill: the file stays, and undo removes it
            assert notes == [] and target.read_bytes() == b"X=1\n"
            assert entries[crashed]["status"] == "committed"
            state.undo(crashed)
            assert not target.exists()
        else:
            assert entries[crashed]["status"] == "rolled-back", (step, entries[crashed])
            assert notes and notes[0].startswith(f"{crashed}: interrupted; rolled back on recovery"), (step, notes)
            assert not target.exists(), step
        assert temps(d) == [], step


MOVE_STEPS = ["after-backup", "after-rename", "after-commit"]


def test_move_into_killed_at_each_step_is_put_back_by_recovery(state, tmp_path, capsys):
    with state.begin("reference") as entry:
        ref = tmp_path / "ref-cache"
        ref.mkdir()
        entry.move_into(str(ref))
    assert not ref.exists()
    for step in MOVE_STEPS:
        cache = tmp_path / f"cache-{step}"
        cache.mkdir()
        (cache / "ext.so").write_bytes(b"so " + step.encode())
        before = set(state.ids())
        proc = run_child(state.root, "move", cache, step)
        assert proc.returncode == -signal.SIGKILL, (step, proc.returncode, proc.stderr[-2000:])
        [crashed] = set(state.ids()) - before
        state.recover()
        status = history(capsys)[crashed]["status"]
        if step == "after-commit":
            assert status == "committed" and not cache.exists()
            state.undo(crashed)
        else:
            assert status == "rolled-back", (step, status)
        assert (cache / "ext.so").read_bytes() == b"so " + step.encode(), step


def test_replace_file_killed_right_after_the_backup_rolls_back_cleanly(state, tmp_path, capsys):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original bytes")
    with state.begin("reference") as entry:
        entry.replace_file(str(target), b"result bytes")
    state.undo(entry.id)
    proc = run_child(state.root, "modify", target, "after-backup")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    [result] = state.recover_entries()
    assert result.refused == "" and target.read_bytes() == b"original bytes"
    assert history(capsys)[result.id]["status"] == "rolled-back"


# --- create_file -----------------------------------------------------------------------------------

def test_create_file_in_an_existing_directory_with_its_mode_and_summary(state, tmp_path):
    d = tmp_path / "env.d"
    d.mkdir()
    with state.begin("test") as entry:
        entry.create_file(str(d / "a.conf"), b"A=1\n")
        entry.create_file(str(d / "b.conf"), b"B=1\n", mode=0o600, summary="session preload")
        with pytest.raises(BadInput, match=rf"{d / 'a.conf'}: already exists; not overwritten"):
            entry.create_file(str(d / "a.conf"), b"again")
    assert stat.S_IMODE(os.stat(d / "a.conf").st_mode) == 0o644  # the documented default
    assert stat.S_IMODE(os.stat(d / "b.conf").st_mode) == 0o600
    records = state.load(entry.id).files
    assert [(r["path"], r["mode"], r["summary"]) for r in records] == [
        (str(d / "a.conf"), 0o644, ""), (str(d / "b.conf"), 0o600, "session preload")]
    assert (d / "a.conf").read_bytes() == b"A=1\n"


def test_a_created_file_edited_after_the_fixer_died_is_kept(state, tmp_path):
    created = tmp_path / "60-x.conf"
    entry = state.begin("test")
    entry.create_file(str(created), b"X=1\n")
    entry.release()  # the fixer dies after the rename
    created.write_bytes(b"the user's own line\n")
    [result] = state.recover_entries()
    assert result.refused == f"{created}: changed since fix {entry.id}; not removed"
    assert created.read_bytes() == b"the user's own line\n"
    assert state.load(entry.id).manifest["status"] == "open"


def test_a_created_file_already_gone_when_the_fixer_died_is_not_an_error(state, tmp_path):
    created = tmp_path / "60-x.conf"
    entry = state.begin("test")
    entry.create_file(str(created), b"X=1\n")
    entry.release()
    created.unlink()
    [result] = state.recover_entries()
    assert result.refused == "" and not created.exists()
    assert state.load(entry.id).manifest["status"] == "rolled-back"


# --- expect_new_dir / created (a rebuilt extension's directory) --------------------------------------

def _build(path):
    path.mkdir()
    (path / "ext.so").write_bytes(b"built")


def test_a_new_build_directory_is_moved_into_the_journal_by_undo(state, tmp_path, capsys):
    dest = tmp_path / "torch_extensions" / "ext"
    dest.parent.mkdir()
    with state.begin("test") as entry:
        record = entry.expect_new_dir(str(dest))
        _build(dest)
        entry.created(record)
    [listed] = history(capsys)[entry.id]["files"]
    assert (listed["action"], listed["path"], listed["state"], listed["summary"]) == (
        "create-dir", str(dest), "written", "")
    result = state.undo(entry.id)
    assert result.restored == [str(dest)] and not dest.exists()
    assert (state.root / entry.id / "files" / "0" / "ext.so").read_bytes() == b"built"
    rc, out, _ = cli(capsys, "fix", "history")
    assert rc == 0 and f"create-dir {dest}" in out  # an undone record is still listed


def test_a_build_directory_left_by_a_dead_fixer_is_moved_away_by_recovery(state, tmp_path):
    dest = tmp_path / "ext"
    entry = state.begin("test")
    entry.expect_new_dir(str(dest))
    _build(dest)
    entry.release()  # the build ran, the fixer died before created()
    [result] = state.recover_entries()
    assert result.refused == "" and not dest.exists()
    assert (state.root / entry.id / "files" / "0" / "ext.so").read_bytes() == b"built"
    assert state.load(entry.id).manifest["status"] == "rolled-back"


def test_a_build_that_never_created_its_directory_needs_nothing_on_recovery(state, tmp_path):
    dest = tmp_path / "ext"
    entry = state.begin("test")
    entry.expect_new_dir(str(dest))
    entry.release()
    [result] = state.recover_entries()
    assert result.refused == "" and not dest.exists()
    assert not (state.root / entry.id / "files" / "0").exists()
    assert state.load(entry.id).manifest["status"] == "rolled-back"


def test_undo_of_a_build_directory_whose_journal_is_on_another_filesystem_is_refused(tmp_path):
    with other_fs_dir(tmp_path) as root:
        journal = Journal(root)
        dest = tmp_path / "ext"
        with journal.begin("test") as entry:
            record = entry.expect_new_dir(str(dest))
            _build(dest)
            entry.created(record)
        with pytest.raises(RestoreRefused) as refused:
            journal.undo(entry.id)
        # rename(2) across filesystems: EXDEV, and a tree is never copied
        assert str(refused.value) == (f"{dest}: cannot move it into the journal "
                                      f"({os.strerror(errno.EXDEV).lower()}); nothing moved")
        assert (dest / "ext.so").read_bytes() == b"built"


# --- move_into across filesystems (EXDEV: copy, rename, delete) ---------------------------------------

def _tree(where):
    where.mkdir()
    (where / "lib.so").write_bytes(b"\x7fELF lib")
    os.chmod(where / "lib.so", 0o751)
    (where / "sub").mkdir()
    (where / "sub" / "data").write_bytes(b"data")
    os.symlink("lib.so", where / "link.so")  # must stay a link, not become a copy
    os.symlink("/nonexistent/target", where / "dangling")


def _snapshot(where):
    out = {}
    for dirpath, dirnames, filenames in os.walk(where):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, where)
            if os.path.islink(p):
                out[rel] = ("link", os.readlink(p))
            elif os.path.isdir(p):
                out[rel] = ("dir",)
            else:
                out[rel] = ("file", open(p, "rb").read(), stat.S_IMODE(os.stat(p).st_mode))
    return out


def test_moves_across_filesystems_keep_links_and_leave_nothing_behind(tmp_path):
    tree, single, link, dirlink = tmp_path / "cache", tmp_path / "stale.so", tmp_path / "alias.so", tmp_path / "cache-link"
    _tree(tree)
    single.write_bytes(b"stale")
    os.symlink("stale.so", link)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_bytes(b"keep")
    os.symlink(str(elsewhere), dirlink)  # a symlink to a directory is moved as a link
    want = _snapshot(tree)
    with other_fs_dir(tmp_path) as root:
        journal = Journal(root)
        with journal.begin("test") as entry:
            for p in (tree, single, link, dirlink):
                entry.move_into(str(p))
        for p in (tree, single, link, dirlink):
            assert not os.path.lexists(p), p
        assert (elsewhere / "keep").read_bytes() == b"keep"  # the link's target is not touched
        files = os.path.join(root, entry.id, "files")
        assert sorted(os.listdir(files)) == ["0", "1", "2", "3"]  # no .partial left
        assert _snapshot(os.path.join(files, "0")) == want
        assert os.readlink(os.path.join(files, "2")) == "stale.so"
        assert os.readlink(os.path.join(files, "3")) == str(elsewhere)
        result = journal.undo(entry.id)
        assert sorted(result.restored) == sorted(map(str, (tree, single, link, dirlink)))
        assert _snapshot(tree) == want
        assert single.read_bytes() == b"stale"
        assert os.readlink(link) == "stale.so" and os.readlink(dirlink) == str(elsewhere)
        assert os.listdir(files) == []


def test_a_partial_copy_left_by_a_crash_is_removed_when_the_move_is_undone(state, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "x").write_bytes(b"x")
    with state.begin("test") as entry:
        entry.move_into(str(cache))
    partial = state.root / entry.id / "files" / "0.partial"  # what a copy killed half-way leaves
    partial.mkdir()
    (partial / "x").write_bytes(b"half")
    state.undo(entry.id)
    assert (cache / "x").read_bytes() == b"x"
    assert not partial.exists()


def test_a_moved_directory_whose_copy_vanished_is_refused_on_recovery(state, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    entry = state.begin("test")
    entry.move_into(str(cache))
    entry.release()
    backup = state.root / entry.id / "files" / "0"
    os.rmdir(backup)
    [result] = state.recover_entries()
    assert result.refused == f"{cache}: its copy {backup} is missing from the journal; nothing restored"
    assert state.load(entry.id).manifest["status"] == "open"


def test_a_moved_directory_already_back_is_left_alone_by_recovery(state, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    entry = state.begin("test")
    entry.move_into(str(cache))
    entry.release()
    cache.mkdir()
    (cache / "new").write_bytes(b"rebuilt by the user")
    [result] = state.recover_entries()
    assert result.refused == ""
    assert (cache / "new").read_bytes() == b"rebuilt by the user"
    assert (state.root / entry.id / "files" / "0").is_dir()  # the journal copy is kept


# --- owner and mode come back (root only: chown) -----------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


@needs_root
@pytest.mark.parametrize("where", ["same-fs-copy", "other-fs"])
def test_undo_restores_owner_and_mode(tmp_path, where):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    os.chown(target, 1234, 2345)
    os.chmod(target, 0o640)
    if where == "same-fs-copy":
        os.link(target, tmp_path / "second-name.so")  # two names: the backup is a copy, owned by us
        ctx = tempfile.TemporaryDirectory(dir=tmp_path)
    else:
        ctx = other_fs_dir(tmp_path)
    with ctx as root:
        journal = Journal(root)
        with journal.begin("test") as entry:
            record = entry.replace_file(str(target), b"result")
        assert record["backup_kind"] == "copy"
        st = os.stat(target)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 2345, 0o640)  # the result
        journal.undo(entry.id)
        st = os.stat(target)
        assert target.read_bytes() == b"original"
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 2345, 0o640)
        assert temps(tmp_path) == []


# --- recovery and roll back ---------------------------------------------------------------------------

def test_recovery_puts_back_a_target_deleted_after_the_fixer_died(state, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    entry = state.begin("test")
    entry.replace_file(str(target), b"result")
    entry.release()
    target.unlink()
    notes = state.recover()
    assert target.read_bytes() == b"original"
    assert notes == [f"{entry.id}: interrupted; rolled back on recovery; put back {target}"]


def test_recovery_refusal_messages_show_the_sha256_prefixes(state, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    entry = state.begin("test")
    entry.replace_file(str(target), b"result")
    entry.release()
    target.write_bytes(b"edited by the user")
    [result] = state.recover_entries()
    edited, wrote = hashlib.sha256(b"edited by the user").hexdigest(), hashlib.sha256(b"result").hexdigest()
    assert result.refused == (f"{target}: changed since fix {entry.id} (sha256 {edited[:12]}, the fix "
                              f"wrote {wrote[:12]}); nothing restored")
    target.write_bytes(b"result")
    backup = state.root / entry.id / "files" / "0"
    backup.write_bytes(b"damaged")
    [result] = state.recover_entries()
    assert result.refused == (f"{target}: backup {backup} is damaged (sha256 "
                              f"{hashlib.sha256(b'damaged').hexdigest()[:12]}, recorded "
                              f"{hashlib.sha256(b'original').hexdigest()[:12]}); nothing restored")
    backup.unlink()
    [result] = state.recover_entries()
    assert result.refused == f"{target}: backup {backup} is missing; nothing restored"
    assert target.read_bytes() == b"result"


def test_undo_refusal_message_shows_the_sha256_prefixes(state, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    with state.begin("test") as entry:
        entry.replace_file(str(target), b"result")
    target.write_bytes(b"edited")
    with pytest.raises(RestoreRefused) as refused:
        state.undo(entry.id)
    assert str(refused.value) == (f"{target} changed since fix {entry.id} (sha256 "
                                  f"{hashlib.sha256(b'edited').hexdigest()[:12]}, expected "
                                  f"{hashlib.sha256(b'result').hexdigest()[:12]}); nothing restored")


def test_a_second_file_failing_verification_rolls_back_the_first(state, tmp_path, capsys):
    a, b = tmp_path / "a.so", tmp_path / "b.so"
    a.write_bytes(b"a0")
    b.write_bytes(b"b0")

    def refuse(temp):
        raise BadInput("does not load")

    with pytest.raises(VerifyFailed):
        with state.begin("test") as entry:
            entry.replace_file(str(a), b"a1")
            entry.replace_file(str(b), b"b1", verify=refuse)
    assert a.read_bytes() == b"a0" and b.read_bytes() == b"b0"
    listed = history(capsys)[entry.id]
    assert listed["status"] == "rolled-back" and listed["finished"]
    assert listed["note"] == f"aborted: {b}: verification failed, not rewritten: does not load put back {a}"
    assert [(f["path"], f["state"]) for f in listed["files"]] == [(str(a), "rolled-back"), (str(b), "verify-failed")]
    rc, out, _ = cli(capsys, "fix", "history")
    assert rc == 0 and f"modify     {a}" in out and f"modify     {b}" not in out


def test_an_abort_whose_roll_back_is_refused_says_why_and_stays_open(state, tmp_path, capsys):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    with pytest.raises(RestoreRefused):
        with state.begin("test") as entry:
            entry.replace_file(str(target), b"result")
            (state.root / entry.id / "files" / "0").write_bytes(b"spoilt")  # the linked original inode
            raise RuntimeError("later step failed")
    listed = state.load(entry.id).manifest  # read before history: its recovery rewrites the note
    assert listed["status"] == "open"
    assert listed["note"].startswith("aborted: later step failed; roll back refused: "
                                     f"{target}: backup ")
    assert target.read_bytes() == b"result"


def test_recovery_waits_while_another_run_holds_a_target_lock(state, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    entry = state.begin("test")
    entry.replace_file(str(target), b"result")
    entry.release()
    holder = state.begin("other")
    holder.lock_target(os.path.realpath(target))  # another fix or undo is changing this file now
    assert state.recover_entries() == []
    assert target.read_bytes() == b"result"
    assert state.load(entry.id).manifest["status"] == "open"
    holder.commit()  # nothing written: it ends rolled-back, and its locks go
    [result] = state.recover_entries()
    assert result.refused == "" and target.read_bytes() == b"original"


def test_undo_marks_each_record_undone_in_history(state, tmp_path, capsys):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    with state.begin("test") as entry:
        entry.replace_file(str(target), b"result")
    state.undo(entry.id)
    listed = history(capsys)[entry.id]
    assert listed["status"] == "undone"
    assert [(f["path"], f["state"]) for f in listed["files"]] == [(str(target), "undone")]


# --- damaged manifests in history --json --------------------------------------------------------------

def test_a_truncated_manifest_is_one_damaged_row_in_history_json(state, tmp_path, capsys):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    with state.begin("test", ["fix", "x"], ["a finding"]) as entry:
        entry.replace_file(str(target), b"result")
    manifest = state.root / entry.id / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:40])
    listed = history(capsys)[entry.id]
    assert listed["status"] == "damaged" and listed["id"] == entry.id
    assert (listed["command"], listed["argv"], listed["findings"], listed["files"]) == ("", [], [], [])
    assert re.fullmatch(r"manifest\.json is not valid JSON \(line \d+; truncated\?\)", listed["note"])
    rc, out, err = cli(capsys, "fix", "undo", entry.id)
    assert rc == 2 and err.count("\n") == 1 and "not valid JSON" in err


# --- undo's choices and checks ----------------------------------------------------------------------

def _commit_fix(journal, target, data=b"result"):
    with journal.begin("test") as entry:
        entry.replace_file(str(target), data)
    return entry


def _next_second():
    """Entry ids order by their UTC second: wait for the next one.

    On the clock the ids are made from: time.gmtime() reads time(2), which glibc serves from the
    kernel's coarse clock, a tick behind time.time(); waiting on time.time() let the next id fall
    in the same second now and then (a CI failure)."""
    import time
    start = time.gmtime()[:6]
    while time.gmtime()[:6] == start:
        time.sleep(0.05)


def test_undo_without_an_id_takes_a_newer_interrupted_fix_first(state, tmp_path):
    a, b = tmp_path / "a.so", tmp_path / "b.so"
    a.write_bytes(b"a0")
    b.write_bytes(b"b0")
    committed = _commit_fix(state, a, b"a1")
    _next_second()
    died = state.begin("test")
    died.replace_file(str(b), b"b1")
    died.release()
    result = state.undo()  # the interrupted fix is rolled back: that is the undo asked for
    assert result.id == died.id and result.restored == [str(b)]
    assert a.read_bytes() == b"a1" and b.read_bytes() == b"b0"
    assert state.load(committed.id).manifest["status"] == "committed"


def test_undo_without_an_id_takes_a_commit_newer_than_an_interrupted_fix(state, tmp_path):
    a, b = tmp_path / "a.so", tmp_path / "b.so"
    a.write_bytes(b"a0")
    b.write_bytes(b"b0")
    died = state.begin("test")
    died.replace_file(str(b), b"b1")
    died.release()
    _next_second()
    committed = _commit_fix(state, a, b"a1")
    result = state.undo()
    assert result.id == committed.id and result.restored == [str(a)]
    assert a.read_bytes() == b"a0" and b.read_bytes() == b"b0"  # b by recovery, a by the undo
    assert state.load(died.id).manifest["status"] == "rolled-back"


def _damaged_entry(journal, entry_id):
    (journal.root / entry_id / "files").mkdir(parents=True)
    (journal.root / entry_id / "manifest.json").write_bytes(b'{"schema": "seedance.journal/v1", "id": ')


def test_undo_without_an_id_passes_over_an_older_damaged_entry(state, tmp_path):
    a = tmp_path / "a.so"
    a.write_bytes(b"a0")
    entry = _commit_fix(state, a)
    _damaged_entry(state, "20000101-000000-000000")
    assert state.undo().id == entry.id and a.read_bytes() == b"a0"


def test_undo_without_an_id_stops_at_a_damaged_entry_newer_than_the_last_commit(state, tmp_path):
    a, b = tmp_path / "a.so", tmp_path / "b.so"
    a.write_bytes(b"a0")
    b.write_bytes(b"b0")
    first = _commit_fix(state, a)
    _next_second()
    second = _commit_fix(state, b)
    between = first.id[:16] + "ffffff"
    assert first.id < between < second.id
    _damaged_entry(state, between)
    assert state.undo().id == second.id  # the damaged one is older than the newest commit
    with pytest.raises(BadInput, match=rf"journal entry {between}: .*nothing restored \(name the entry"):
        state.undo()  # now it is newer than the newest commit
    assert a.read_bytes() == b"result"
    # an entry undone since is not "damaged": it never stops undo of an older commit
    (state.root / between / "manifest.json").unlink()
    os.rmdir(state.root / between / "files")
    os.rmdir(state.root / between)
    assert state.undo().id == first.id and a.read_bytes() == b"a0"


def test_undo_refuses_an_entry_a_live_fixer_holds_and_releases_its_own_lock(state, tmp_path):
    import fcntl
    live = state.begin("test")  # open, no file touched yet, its fixer alive
    with pytest.raises(BadInput, match=rf"^journal entry {live.id} is in use by a running fixer$"):
        state.undo(live.id)
    assert state.recover_entries() == []  # nor does recovery take it
    assert state.load(live.id).manifest["status"] == "open"
    live.commit()
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    entry = _commit_fix(state, target)
    result = state.undo(entry.id)
    assert result.id == entry.id
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", state.load(entry.id).manifest["undone"])
    fd = os.open(state.root / entry.id / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # undo let go of the entry
    finally:
        os.close(fd)


def test_a_lock_file_with_a_second_name_is_refused(state, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    entry = _commit_fix(state, target)
    [lock] = os.listdir(state.root / "locks")
    os.link(state.root / "locks" / lock, tmp_path / "planted")
    with pytest.raises(BadInput, match=rf"{target}: its lock .* is not a private regular file; not touched"):
        state.undo(entry.id)
    assert target.read_bytes() == b"result"


USER_LINE, E_LINE = b"the user's line\n", b"E=1\n"


def test_undo_of_created_files_judges_them_first(state, tmp_path):
    kept, edited = tmp_path / "kept.conf", tmp_path / "edited.conf"
    with state.begin("test") as entry:
        entry.create_file(str(kept), b"K=1\n")
        entry.create_file(str(edited), E_LINE)
    edited.write_bytes(USER_LINE)
    with pytest.raises(RestoreRefused) as refused:
        state.undo(entry.id)
    assert str(refused.value) == (f"{edited} changed since fix {entry.id} (sha256 "
                                  f"{hashlib.sha256(USER_LINE).hexdigest()[:12]}, "
                                  f"expected {hashlib.sha256(E_LINE).hexdigest()[:12]}); nothing restored")
    assert kept.exists() and state.load(entry.id).manifest["status"] == "committed"
    edited.unlink()  # gone is fine for a created file: nothing to remove
    result = state.undo(entry.id)
    assert result.restored == [str(kept)] and result.unchanged == [str(edited)] and not kept.exists()


def test_undo_refuses_a_modified_file_the_user_deleted(state, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    entry = _commit_fix(state, target)
    target.unlink()
    with pytest.raises(RestoreRefused, match=rf"^{target} changed since fix {entry.id} \(sha256 None,"):
        state.undo(entry.id)
    assert not target.exists()


def test_undo_of_moves_is_judged_before_anything_is_written(state, tmp_path):
    again, lost = tmp_path / "again", tmp_path / "lost"
    for p in (again, lost):
        p.mkdir()
    with state.begin("test") as entry:
        entry.move_into(str(again))
        entry.move_into(str(lost))
    again.mkdir()  # rebuilt by the user since
    with pytest.raises(RestoreRefused, match=rf"^{again} exists again since fix {entry.id}; move it away first"):
        state.undo(entry.id)
    assert not lost.exists() and state.load(entry.id).manifest["status"] == "committed"
    os.rmdir(again)
    os.rmdir(state.root / entry.id / "files" / "1")
    with pytest.raises(RestoreRefused) as refused:
        state.undo(entry.id)
    assert str(refused.value) == (f"{lost}: its copy {state.root / entry.id / 'files' / '1'} is missing from "
                                  f"the journal; nothing restored")
    assert not again.exists() and state.load(entry.id).manifest["status"] == "committed"


def test_undo_of_a_build_directory_the_user_removed_is_not_an_error(state, tmp_path):
    dest = tmp_path / "ext"
    with state.begin("test") as entry:
        record = entry.expect_new_dir(str(dest))
        _build(dest)
        entry.created(record)
    (dest / "ext.so").unlink()
    dest.rmdir()
    result = state.undo(entry.id)
    assert result.restored == [] and result.unchanged == [str(dest)]


def test_a_stale_build_moved_away_and_rebuilt_in_place_is_undone(state, tmp_path):
    """fix torch-ext: the stale build is moved into the journal, the rebuild creates the same
    path; undo moves the rebuild away and puts the stale build back."""
    build = tmp_path / "ext"
    build.mkdir()
    (build / "ext.so").write_bytes(b"stale")
    with state.begin("test") as entry:
        entry.move_into(str(build))
        record = entry.expect_new_dir(str(build))
        build.mkdir()
        (build / "ext.so").write_bytes(b"rebuilt")
        entry.created(record)
    result = state.undo(entry.id)
    assert (build / "ext.so").read_bytes() == b"stale"
    assert (state.root / entry.id / "files" / "1" / "ext.so").read_bytes() == b"rebuilt"
    assert result.restored == [str(build), str(build)]


def test_an_undo_stopped_half_way_is_completed_by_recovery(tmp_path):
    """An undo that was refused after it began (the rebuilt directory cannot be renamed into a
    journal on another filesystem) is finished by the next recovery once the cause is gone."""
    target, dest = tmp_path / "lib.so", tmp_path / "ext"
    target.write_bytes(b"original")
    with other_fs_dir(tmp_path) as root:
        journal = Journal(root)
        with journal.begin("test") as entry:
            entry.replace_file(str(target), b"result")
            record = entry.expect_new_dir(str(dest))
            _build(dest)
            entry.created(record)
        with pytest.raises(RestoreRefused, match="cannot move it into the journal"):
            journal.undo(entry.id)
        assert target.read_bytes() == b"result"
        (dest / "ext.so").unlink()
        dest.rmdir()  # the user removes the build
        [result] = journal.recover_entries()
        assert (result.id, result.refused, result.notes) == (entry.id, "", ["undo interrupted; completed on recovery"])
        assert target.read_bytes() == b"original"
        assert journal.load(entry.id).manifest["status"] == "undone"


def test_recovery_reports_what_it_touched_and_goes_on_past_a_held_entry(state, tmp_path):
    a, b = tmp_path / "a.so", tmp_path / "b.so"
    a.write_bytes(b"a0")
    b.write_bytes(b"b0")
    first = state.begin("test")
    first.replace_file(str(a), b"a1")
    first.release()
    _next_second()
    second = state.begin("test")
    second.replace_file(str(b), b"b1")
    second.release()
    holder = state.begin("other")
    holder.lock_target(os.path.realpath(a))
    [result] = state.recover_entries()  # the first waits, the second is rolled back
    assert (result.id, result.restored, result.refused) == (second.id, [str(b)], "")
    assert result.notes == [f"interrupted; rolled back on recovery; put back {b}"]
    holder.commit()
    (state.root / first.id / "files" / "0").write_bytes(b"spoilt")
    [result] = state.recover_entries()
    assert (result.id, result.restored) == (first.id, [])
    assert result.notes == [f"recovery refused: {result.refused}"] and str(a) in result.refused


def test_a_commit_records_when_it_finished(state, tmp_path, capsys):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    entry = _commit_fix(state, target)
    listed = history(capsys)[entry.id]
    assert listed["status"] == "committed"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", listed["finished"])
    assert listed["note"] == ""  # a commit adds no note; an empty one, not a missing one


def test_a_manifest_larger_than_any_entry_needs_is_damaged(state, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    entry = _commit_fix(state, target)
    path = state.root / entry.id / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["note"] = "x" * (17 << 20)
    path.write_text(json.dumps(manifest))
    assert state.read(entry.id).damaged == "manifest.json is larger than 16 MiB"


# --- manifests that do not describe an entry ------------------------------------------------------------

def _set(path, key, value):
    def change(m):
        m["files"][0][key] = value
    return change


def _top(key, value):
    def change(m):
        m[key] = value
    return change


MANIFEST_CASES = [
    (lambda m: m.clear() or m.update({"x": 1}), "names another entry ('None')"),
    (_top("id", "20990101-000000-abcdef"), "names another entry ('20990101-000000-abcdef')"),
    (_top("status", "s" * 30), "has an unknown status '" + "s" * 20 + "'"),
    (_top("files", "f" * 30), "has no list of files (files: \"" + "f" * 19 + ")"),
    (_top("files", [1]), "file record 0 is not an object"),
    (_set(None, "path", "relative/lib.so"), "file record 0 has no absolute path"),
    (_set(None, "path", "/abs/with\0nul"), "file record 0 has no absolute path"),
    (_set(None, "path", 5), "file record 0 has no absolute path"),
    (_set(None, "action", "delete"), "file record 0 has an unknown action"),
    (_set(None, "backup", "../../etc/passwd"), "file record 0 has a bad backup name"),
    (_set(None, "backup", 5), "file record 0 has a bad backup name"),
    (_set(None, "state", None), "file record 0 has no state"),
    (_set(None, "sha256_before", "abc"), "file record 0 has a bad sha256_before"),
    (_set(None, "sha256_after", "A" * 64), "file record 0 has a bad sha256_after"),
    (_set(None, "mode", 0o10000), "file record 0 has a bad mode"),
    (_set(None, "mode", -1), "file record 0 has a bad mode"),
    (_set(None, "mode", True), "file record 0 has a bad mode"),
    (_set(None, "mode", "420"), "file record 0 has a bad mode"),
    (_set(None, "uid", 2**32), "file record 0 has a bad uid"),  # uid_t is 32 bits
    (_set(None, "gid", 2**32), "file record 0 has a bad gid"),
    (_set(None, "temp", "/elsewhere/.lib.so.seedance-tmp"), "file record 0 has a bad temp name"),
    (_set(None, "temp", 5), "file record 0 has a bad temp name"),
    (_set(None, "sha256_after", None), "file record 0 lacks its sha256"),
]


@pytest.mark.parametrize("change,why", MANIFEST_CASES, ids=[w for _, w in MANIFEST_CASES])
def test_a_manifest_that_does_not_describe_an_entry_is_damaged(state, tmp_path, change, why):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    entry = _commit_fix(state, target)
    path = state.root / entry.id / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))
    assert state.read(entry.id).damaged == f"manifest.json {why}"


def test_a_temp_name_in_the_targets_directory_but_not_a_temp_is_damaged(state, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    entry = _commit_fix(state, target)
    path = state.root / entry.id / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["files"][0]["temp"] = str(tmp_path / "lib.so")  # rollback would unlink the target itself
    path.write_text(json.dumps(manifest))
    assert state.read(entry.id).damaged == "manifest.json file record 0 has a bad temp name"


@pytest.mark.parametrize("key,value", [("mode", 0o7777), ("mode", 0), ("uid", 2**32 - 1), ("gid", 2**32 - 1),
                                       ("uid", 1234), ("gid", 1234), ("temp", None)])
def test_the_edges_of_a_valid_manifest_are_accepted(state, tmp_path, key, value):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    entry = _commit_fix(state, target)
    path = state.root / entry.id / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["files"][0][key] = value
    path.write_text(json.dumps(manifest))
    assert state.read(entry.id).damaged == ""


MODIFY_STEPS = ["after-backup", "after-temp-write", "after-fsync", "after-verify", "after-rename", "after-commit"]


def test_replace_file_killed_at_each_step_leaves_the_original_or_the_result(state, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original bytes")
    with state.begin("reference") as entry:  # the same path once in this process
        entry.replace_file(str(target), b"result bytes")
    state.undo(entry.id)
    for step in MODIFY_STEPS:
        before = set(state.ids())
        proc = run_child(state.root, "modify", target, step)
        assert proc.returncode == -signal.SIGKILL, (step, proc.returncode, proc.stderr[-2000:])
        [crashed] = set(state.ids()) - before
        results = state.recover_entries()
        if step == "after-commit":
            assert results == [] and target.read_bytes() == b"result bytes"
            state.undo(crashed)
        else:
            [result] = results
            assert result.refused == "", (step, result.refused)
        assert target.read_bytes() == b"original bytes", step
        assert temps(tmp_path) == [], step


def test_a_fill_that_returns_no_digest_is_hashed_from_the_temp(state, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")

    def fill(fd):
        os.write(fd, b"filled bytes")  # returns None: the journal reads the temp back

    with state.begin("test") as entry:
        record = entry.replace_file(str(target), fill)
    assert record["sha256_after"] == hashlib.sha256(b"filled bytes").hexdigest()
    assert target.read_bytes() == b"filled bytes"
    state.undo(entry.id)
    assert target.read_bytes() == b"original"


def test_an_entry_keeps_its_backups_private(state, tmp_path):
    """The originals of a user's files are readable only by the owner of the journal."""
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    old = os.umask(0o022)  # a usual umask: the modes must not come from it
    try:
        entry = _commit_fix(state, target)
    finally:
        os.umask(old)
    for path, want in ((state.root, 0o700), (state.root / entry.id / "files", 0o700),
                       (state.root / entry.id / "manifest.json", 0o600), (state.root / entry.id / "lock", 0o600)):
        assert stat.S_IMODE(os.stat(path).st_mode) == want, path


# --- a move across filesystems that fails half-way (bench/mutation-survivors.md: `_move` 9) --------

class _SmallTmpfs:
    """A 1 MiB tmpfs mounted for the test: a journal there runs out of space in the middle of
    the copy that a move across filesystems makes (ENOSPC from the kernel, not simulated)."""

    def __init__(self, where):
        self.where = where

    def __enter__(self):
        self.where.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(self.where)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        return self.where

    def __exit__(self, *exc):
        # lazy: a failed assertion's traceback may still hold a file open in it
        subprocess.run(["umount", "-l", str(self.where)], check=True)
        return False


def _leftovers(root):
    """Every file and directory in the journal except its own records (manifest, locks)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            parts = rel.split(os.sep)
            if len(parts) >= 2 and parts[1] == "files":
                found.append(rel)
    return sorted(p for p in found if p.split(os.sep)[1:] != ["files"] and len(p.split(os.sep)) > 2)


@pytest.mark.parametrize("kind", ["directory", "file"])
def test_a_move_that_runs_out_of_space_half_way_leaves_no_partial_copy(tmp_path, kind):
    """The copy into a full journal fails (ENOSPC); the entry is rolled back, the target is
    where it was with its bytes, and no partial copy stays in the journal, whatever it is
    named."""
    target = tmp_path / "cache"
    if kind == "directory":
        target.mkdir()
        for i in range(3):
            (target / f"blob{i}.bin").write_bytes(os.urandom(600 * 1024))
    else:
        target.write_bytes(os.urandom(2 * 1024 * 1024))
    want = _snapshot(target) if kind == "directory" else target.read_bytes()
    with _SmallTmpfs(tmp_path / "small") as root:
        assert os.stat(root).st_dev != os.stat(tmp_path).st_dev
        journal = Journal(root / "journal")
        with pytest.raises(OSError) as info:
            with journal.begin("test") as entry:
                entry.move_into(str(target))
        text = str(info.value)
        assert os.strerror(errno.ENOSPC) in text, text  # the kernel's refusal, not another failure
        assert (_snapshot(target) if kind == "directory" else target.read_bytes()) == want
        assert _leftovers(root / "journal") == []
        assert journal.read(entry.id).manifest["status"] == "rolled-back"
