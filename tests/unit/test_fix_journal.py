"""The fix journal: byte-identical undo, crash recovery, refusals that touch nothing."""
import hashlib
import json
import os
import stat

import pytest

from seedance.errors import BadInput
from seedance.fix.journal import Journal, VerifyFailed, journal_root


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
