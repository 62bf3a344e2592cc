"""The fix journal: byte-identical undo, crash recovery, refusals that touch nothing."""
import hashlib
import json
import os
import stat

import pytest

from seedance.model.errors import BadInput
from seedance.fix.journal import DamagedEntry, Journal, RestoreRefused, VerifyFailed, journal_root


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture
def journal(tmp_path):
    return Journal(tmp_path / "journal")


def test_root_honours_xdg_state_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert journal_root() == tmp_path / "seedance" / "journal"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert journal_root() == tmp_path / "h" / ".local" / "state" / "seedance" / "journal"


def test_replace_then_undo_is_byte_identical_and_keeps_mode(journal, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"\x7fELF original bytes")
    os.chmod(target, 0o751)
    before = sha(target)
    with journal.begin("test", ["t"]) as entry:
        record = entry.replace_file(str(target), b"new bytes")
    assert target.read_bytes() == b"new bytes"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o751
    assert record["sha256_before"] == before
    manifest = json.loads((journal.root / entry.id / "manifest.json").read_text())
    assert manifest["status"] == "committed"
    assert (journal.root / entry.id / "files" / "0").read_bytes() == b"\x7fELF original bytes"
    result = journal.undo()
    assert result.restored == [str(target)]
    assert sha(target) == before
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o751
    assert journal.load(entry.id).manifest["status"] == "undone"
    with pytest.raises(BadInput, match="already undone"):
        journal.undo(entry.id)


def test_verify_failure_leaves_target_and_no_temp(journal, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")

    def refuse(temp):
        assert open(temp, "rb").read() == b"broken"
        raise BadInput("does not load")

    with journal.begin("test") as entry:
        with pytest.raises(VerifyFailed, match="does not load"):
            entry.replace_file(str(target), b"broken", verify=refuse)
    assert target.read_bytes() == b"original"
    assert sorted(os.listdir(tmp_path)) == ["journal", "lib.so"]
    assert journal.load(entry.id).manifest["status"] == "rolled-back"


def test_undo_refuses_a_file_changed_since_and_touches_nothing(journal, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"a0")
    b.write_bytes(b"b0")
    with journal.begin("test") as entry:
        entry.replace_file(str(a), b"a1")
        entry.replace_file(str(b), b"b1")
    b.write_bytes(b"someone else")
    with pytest.raises(BadInput, match="changed since fix"):
        journal.undo(entry.id)
    assert a.read_bytes() == b"a1" and b.read_bytes() == b"someone else"


def test_create_and_move_are_undone(journal, tmp_path):
    created = tmp_path / "env.d" / "60-x.conf"
    cache = tmp_path / "cache" / "ext"
    cache.mkdir(parents=True)
    (cache / "ext.so").write_bytes(b"so")
    with journal.begin("test") as entry:
        entry.create_file(str(created), b"X=1\n")
        entry.move_into(str(cache))
    assert created.read_bytes() == b"X=1\n" and not cache.exists()
    journal.undo(entry.id)
    assert not created.exists()
    assert (cache / "ext.so").read_bytes() == b"so"


def test_exception_inside_entry_rolls_back_everything(journal, tmp_path):
    target = tmp_path / "cfg.yaml"
    target.write_bytes(b"a: 1\n")
    with pytest.raises(RuntimeError):
        with journal.begin("test") as entry:
            entry.replace_file(str(target), b"a: 2\n")
            raise RuntimeError("later step failed")
    assert target.read_bytes() == b"a: 1\n"
    assert journal.load(entry.id).manifest["status"] == "rolled-back"


def test_recovery_rolls_back_an_entry_whose_fixer_died(journal, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    entry = journal.begin("test")
    entry.replace_file(str(target), b"result")
    entry.release()  # the fixer dies: its flock goes away, the entry stays open
    assert journal.load(entry.id).manifest["status"] == "open"
    notes = journal.recover()
    assert notes and entry.id in notes[0]
    assert target.read_bytes() == b"original"
    assert journal.load(entry.id).manifest["status"] == "rolled-back"


@pytest.mark.parametrize("separators", [(", ", ": "), (",", ":"), (",\n", " :\t")], ids=["json", "compact", "spaced"])
def test_recovery_finds_the_open_entry_among_finished_ones_whatever_the_json_spacing(journal, tmp_path, separators):
    """Recovery rules finished entries out from their raw manifest (issue 13); an open one
    is found however its JSON is spaced, and the finished ones are left as they were."""
    done = tmp_path / "done.so"
    done.write_bytes(b"v1")
    for n in range(3):
        with journal.begin("test") as finished:
            finished.replace_file(str(done), b"v%d" % (n + 2))
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    entry = journal.begin("test")
    entry.replace_file(str(target), b"result")
    entry.release()  # the fixer dies
    path = journal.root / entry.id / "manifest.json"
    path.write_text(json.dumps(json.loads(path.read_text()), separators=separators))
    before = {e.id: (journal.root / e.id / "manifest.json").read_bytes() for e in journal.entries() if e.id != entry.id}
    notes = journal.recover()
    assert len(notes) == 1 and entry.id in notes[0]
    assert target.read_bytes() == b"original" and done.read_bytes() == b"v4"
    assert journal.load(entry.id).manifest["status"] == "rolled-back"
    assert {i: (journal.root / i / "manifest.json").read_bytes() for i in before} == before


def test_recovery_skips_an_entry_a_live_fixer_holds(journal, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    entry = journal.begin("test")
    entry.replace_file(str(target), b"result")
    assert journal.recover() == []  # our own flock is held
    assert target.read_bytes() == b"result"
    entry.commit()


def test_undo_with_nothing_committed(journal):
    with pytest.raises(BadInput, match="nothing to undo"):
        journal.undo()


def test_ids_are_validated_before_any_path_is_built(journal):
    for bad in ("../../etc", "x", "20260101-000000-zzzzzz"):
        with pytest.raises(BadInput, match="not a journal entry id"):
            journal.load(bad)


# --- nothing is put back unseen (issue 10 item 5, issue 17 "Journal tests") -----------------------

def _fixed(journal, tmp_path, name="lib.so", original=b"\x7fELF original", result=b"\x7fELF result"):
    target = tmp_path / name
    target.write_bytes(original)
    with journal.begin("test") as entry:
        entry.replace_file(str(target), result)
    return target, entry


def _interrupted(journal, tmp_path, original=b"\x7fELF original", result=b"\x7fELF result"):
    """An entry whose fixer died after the rename: target holds the result, entry still open."""
    target = tmp_path / "lib.so"
    target.write_bytes(original)
    entry = journal.begin("test")
    entry.replace_file(str(target), result)
    entry.release()
    return target, entry


def test_undo_with_the_backup_deleted_is_refused_naming_the_path(journal, tmp_path):
    target, entry = _fixed(journal, tmp_path)
    os.unlink(journal.root / entry.id / "files" / "0")
    with pytest.raises(RestoreRefused, match=rf"{target}: backup .*files/0 is missing; nothing restored"):
        journal.undo()
    assert target.read_bytes() == b"\x7fELF result"
    assert journal.load(entry.id).manifest["status"] == "committed"


def test_undo_with_a_damaged_backup_is_refused_and_writes_nothing(journal, tmp_path):
    target, entry = _fixed(journal, tmp_path)
    backup = journal.root / entry.id / "files" / "0"
    with open(backup, "r+b") as handle:  # one flipped byte, same size
        handle.write(b"\x00")
    with pytest.raises(RestoreRefused, match=rf"{target}: backup .* is damaged"):
        journal.undo(entry.id)
    assert target.read_bytes() == b"\x7fELF result"
    assert backup.read_bytes() == b"\x00ELF original"
    assert journal.load(entry.id).manifest["status"] == "committed"
    assert [n for n in os.listdir(tmp_path) if "seedance-tmp" in n] == []


def test_recovery_with_a_damaged_backup_is_refused_and_the_entry_stays_open(journal, tmp_path):
    target, entry = _interrupted(journal, tmp_path)
    with open(journal.root / entry.id / "files" / "0", "r+b") as handle:
        handle.seek(5)
        handle.write(b"X")
    [result] = journal.recover_entries()
    assert result.refused and str(target) in result.refused and "damaged" in result.refused
    assert target.read_bytes() == b"\x7fELF result"
    assert journal.load(entry.id).manifest["status"] == "open"
    with pytest.raises(RestoreRefused, match=rf"{entry.id} cannot be rolled back: {target}: backup"):
        journal.undo()
    assert target.read_bytes() == b"\x7fELF result"


def test_recovery_leaves_a_target_edited_after_the_crash(journal, tmp_path):
    target, entry = _interrupted(journal, tmp_path)
    target.write_bytes(b"the user's own rebuild")
    [result] = journal.recover_entries()
    assert f"{target}: changed since fix {entry.id}" in result.refused
    assert target.read_bytes() == b"the user's own rebuild"
    assert journal.load(entry.id).manifest["status"] == "open"


def test_undo_reports_restored_only_for_what_it_wrote(journal, tmp_path):
    target, entry = _fixed(journal, tmp_path)
    target.write_bytes(b"\x7fELF original")  # the user already put the original back
    result = journal.undo(entry.id)
    assert result.restored == [] and result.unchanged == [str(target)]
    assert journal.load(entry.id).manifest["status"] == "undone"


@pytest.mark.parametrize("content", [b"[]", b'{"files": null}', b"", b'{"schema": "seedance.journal/v1", "id": "',
                                     b"\xff\xfe{}", b"[" * 100000, b"null"])
def test_a_damaged_manifest_is_one_line_for_load_undo_and_recovery(journal, tmp_path, content):
    target, entry = _fixed(journal, tmp_path)
    (journal.root / entry.id / "manifest.json").write_bytes(content)
    read = journal.read(entry.id)
    assert read.damaged and read.manifest["status"] == "damaged"
    assert "\n" not in read.damaged
    with pytest.raises(DamagedEntry, match=rf"journal entry {entry.id}: manifest.json "):
        journal.undo(entry.id)
    with pytest.raises(DamagedEntry, match="name the entry to undo"):
        journal.undo()
    assert journal.recover_entries() == []
    assert target.read_bytes() == b"\x7fELF result"


def test_a_manifest_with_files_null_in_a_valid_entry_is_damaged(journal, tmp_path):
    _target, entry = _fixed(journal, tmp_path)
    path = journal.root / entry.id / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["files"] = None
    path.write_text(json.dumps(manifest))
    assert journal.read(entry.id).damaged == "manifest.json has no list of files (files: null)"


def test_fix_through_a_symlink_rewrites_the_target_and_keeps_the_link(journal, tmp_path):
    real = tmp_path / "real" / "libk.so.1.0"
    real.parent.mkdir()
    real.write_bytes(b"\x7fELF original")
    link = tmp_path / "libk.so"
    link.symlink_to("real/libk.so.1.0")
    with journal.begin("test") as entry:
        record = entry.replace_file(str(link), b"\x7fELF fixed")
    assert os.readlink(link) == "real/libk.so.1.0"
    assert real.read_bytes() == b"\x7fELF fixed"
    assert record["path"] == str(real) and record["link"] == str(link)
    assert sorted(os.listdir(tmp_path)) == ["journal", "libk.so", "real"]
    journal.undo()
    assert os.readlink(link) == "real/libk.so.1.0" and real.read_bytes() == b"\x7fELF original"


def test_a_second_fix_of_the_same_file_is_refused_while_the_first_holds_it(journal, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    (tmp_path / "alias.so").symlink_to(target)
    first = journal.begin("first")
    first.replace_file(str(target), b"first")
    second = journal.begin("second")
    with pytest.raises(BadInput, match=rf"{target}: another seedance fix or undo \(pid {os.getpid()}\)"):
        second.replace_file(str(tmp_path / "alias.so"), b"second")  # same real file, same lock
    second.commit()
    first.commit()
    assert target.read_bytes() == b"first"
    assert journal.load(second.id).manifest["status"] == "rolled-back"


def test_a_file_replaced_since_the_plan_is_not_rewritten(journal, tmp_path):
    from seedance.fix.atomic import file_identity

    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    planned = file_identity(os.stat(target))
    (tmp_path / "other").write_bytes(b"another fix's result")
    os.rename(tmp_path / "other", target)
    with pytest.raises(BadInput, match="changed since this fix planned its edit"):
        with journal.begin("test") as entry:
            entry.replace_file(str(target), b"stale plan", expect=planned)
    assert target.read_bytes() == b"another fix's result"


def test_the_backup_is_the_original_inode_when_it_can_be(journal, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    inode = os.stat(target).st_ino
    with journal.begin("test") as entry:
        record = entry.replace_file(str(target), b"result")
    backup = journal.root / entry.id / "files" / "0"
    assert record["backup_kind"] == "link" and os.stat(backup).st_ino == inode
    assert os.stat(target).st_ino != inode and os.stat(backup).st_nlink == 1
    assert record["sha256_before"] == hashlib.sha256(b"original").hexdigest()
    assert record["sha256_after"] == hashlib.sha256(b"result").hexdigest()


def test_a_file_with_other_names_is_copied_not_linked(journal, tmp_path):
    target = tmp_path / "lib.so"
    target.write_bytes(b"original")
    os.link(target, tmp_path / "other-name.so")
    with journal.begin("test") as entry:
        record = entry.replace_file(str(target), b"result")
    backup = journal.root / entry.id / "files" / "0"
    assert record["backup_kind"] == "copy" and os.stat(backup).st_ino != os.stat(tmp_path / "other-name.so").st_ino
    (tmp_path / "other-name.so").write_bytes(b"changed through the other name")
    journal.undo()
    assert target.read_bytes() == b"original"


def test_a_journal_on_another_filesystem_copies_and_restores(tmp_path):
    shm = "/dev/shm"
    if not os.path.isdir(shm) or os.stat(shm).st_dev == os.stat(tmp_path).st_dev or not os.access(shm, os.W_OK):
        pytest.skip("needs /dev/shm on another filesystem than the test's tmp dir")
    import tempfile

    with tempfile.TemporaryDirectory(dir=shm) as root:
        journal = Journal(root)
        target = tmp_path / "lib.so"
        target.write_bytes(b"original")
        os.chmod(target, 0o750)
        with journal.begin("test") as entry:
            record = entry.replace_file(str(target), b"result")
        assert record["backup_kind"] == "copy"
        journal.undo()
        assert target.read_bytes() == b"original" and stat.S_IMODE(os.stat(target).st_mode) == 0o750


@pytest.mark.parametrize("spoiled", ["edited", "backup-damaged"])
def test_a_refusal_of_the_first_file_stops_undo_before_the_last_is_written(journal, tmp_path, spoiled):
    """Undo restores newest first; every file is judged before any is written, so a refusal
    about the first file (restored last) leaves the second one as the fix left it."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"a0")
    b.write_bytes(b"b0")
    with journal.begin("test") as entry:
        entry.replace_file(str(a), b"a1")
        entry.replace_file(str(b), b"b1")
    if spoiled == "edited":
        a.write_bytes(b"user")
    else:
        (journal.root / entry.id / "files" / "0").write_bytes(b"zz")
    with pytest.raises(RestoreRefused, match=rf"{a}"):
        journal.undo(entry.id)
    assert b.read_bytes() == b"b1" and a.read_bytes() == (b"user" if spoiled == "edited" else b"a1")
    assert journal.load(entry.id).manifest["status"] == "committed"


def test_fixes_begun_in_one_second_undo_newest_first(journal, tmp_path):
    """Ids order as the fixes began, even within one second: undo without an id takes the
    newest.  With a random suffix half of such pairs sorted the older fix last, so undo
    restored the original under the newer fix's result."""
    target = tmp_path / "lib.so"
    target.write_bytes(b"v0")
    made = []
    for version in (b"v1", b"v2", b"v3", b"v4"):  # in well under a second on any host
        with journal.begin("test") as entry:
            entry.replace_file(str(target), version)
        made.append(entry.id)
    assert journal.ids() == made
    for expected in (b"v3", b"v2", b"v1", b"v0"):
        journal.undo()
        assert target.read_bytes() == expected


def test_an_id_taken_in_the_same_microsecond_moves_on(journal, monkeypatch):
    import time
    frozen = time.time_ns()
    monkeypatch.setattr(time, "time_ns", lambda: frozen)
    first, second = journal.begin("test"), journal.begin("test")
    first.commit()
    second.commit()
    assert first.id[:16] == second.id[:16]
    assert int(second.id[16:], 16) == int(first.id[16:], 16) + 1
    assert journal.ids() == [first.id, second.id]
