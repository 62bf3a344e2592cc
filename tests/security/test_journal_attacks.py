"""The fix journal attacked on purpose (issue 10 item 5): crafted and damaged manifests,
planted links and FIFOs, and a fuzz run.  Nothing outside the journal is written, nothing
hangs, and every refusal is one line (a SeedanceError; the CLI prints it as one line, exit 2).
"""
import copy
import hashlib
import json
import os
import random
import stat

import pytest

from seedance.model.errors import SeedanceError
from seedance.fix.journal import Journal, RestoreRefused

from tests.conftest import run_cli


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture
def fixed(tmp_path):
    """A committed fix of lib.so, and a victim file that no journal operation may touch."""
    journal = Journal(tmp_path / "state" / "seedance" / "journal")
    target = tmp_path / "lib.so"
    target.write_bytes(b"\x7fELF original")
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    with journal.begin("test") as entry:
        entry.replace_file(str(target), b"\x7fELF result")
    manifest = json.loads((journal.root / entry.id / "manifest.json").read_text())
    return {"journal": journal, "entry": entry, "target": target, "victim": victim, "manifest": manifest,
            "env": {"XDG_STATE_HOME": str(tmp_path / "state")}}


def write_manifest(fixed, manifest):
    (fixed["journal"].root / fixed["entry"].id / "manifest.json").write_text(json.dumps(manifest))


def untouched(fixed):
    return fixed["victim"].read_bytes() == b"precious" and \
        fixed["target"].read_bytes() in (b"\x7fELF result", b"\x7fELF original")


@pytest.mark.parametrize("field,value", [
    ("backup", "../../../victim"), ("backup", "/etc/passwd"), ("path", "lib.so"),
    ("temp", "VICTIM"), ("mode", 0o100000), ("uid", -1), ("action", "exec"), ("sha256_before", "../x"),
])
def test_a_crafted_record_is_damaged_and_touches_nothing(fixed, field, value):
    manifest = copy.deepcopy(fixed["manifest"])
    manifest["files"][0][field] = str(fixed["victim"]) if value == "VICTIM" else value
    manifest["status"] = "open"  # recovery would unlink the temp and restore the backup
    write_manifest(fixed, manifest)
    journal = fixed["journal"]
    assert journal.read(fixed["entry"].id).damaged
    assert journal.recover_entries() == []
    with pytest.raises(SeedanceError):
        journal.undo(fixed["entry"].id)
    assert untouched(fixed) and fixed["target"].read_bytes() == b"\x7fELF result"


def test_a_planted_symlink_as_backup_is_never_renamed_into_place(fixed):
    backup = fixed["journal"].root / fixed["entry"].id / "files" / "0"
    backup.unlink()
    backup.symlink_to(fixed["victim"])
    os.chmod(fixed["victim"], 0o600)
    with pytest.raises(RestoreRefused, match="is damaged"):
        fixed["journal"].undo()
    assert os.path.islink(backup) and stat.S_IMODE(os.stat(fixed["victim"]).st_mode) == 0o600
    assert not os.path.islink(fixed["target"]) and untouched(fixed)


def test_a_fifo_as_backup_or_target_does_not_hang(fixed):
    backup = fixed["journal"].root / fixed["entry"].id / "files" / "0"
    backup.unlink()
    os.mkfifo(backup)
    proc = run_cli("fix", "undo", env=fixed["env"], timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "is damaged" in proc.stderr
    backup.unlink()
    fixed["target"].unlink()
    os.mkfifo(fixed["target"])
    proc = run_cli("fix", "undo", env=fixed["env"], timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "changed since fix" in proc.stderr
    assert stat.S_ISFIFO(os.lstat(fixed["target"]).st_mode)


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory", "huge", "deep"])
def test_a_strange_manifest_file_is_one_line(fixed, kind):
    path = fixed["journal"].root / fixed["entry"].id / "manifest.json"
    path.unlink()
    if kind == "symlink":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "huge":
        path.write_bytes(b" " * (17 << 20) + b"{}")
    else:
        path.write_bytes(b'{"files": ' + b"[" * 200000)
    history = run_cli("fix", "history", env=fixed["env"], timeout=60)
    assert history.returncode == 0 and not history.stderr, history.stderr
    assert history.stdout.count("\n") == 1 and f"{fixed['entry'].id}  damaged" in history.stdout
    undo = run_cli("fix", "undo", fixed["entry"].id, env=fixed["env"], timeout=60)
    assert undo.returncode == 2 and undo.stderr.count("\n") == 1 and "Traceback" not in undo.stderr
    assert untouched(fixed)


def test_a_planted_lock_file_is_refused_not_truncated(fixed, tmp_path):
    journal = fixed["journal"]
    target = tmp_path / "other.so"
    target.write_bytes(b"data")
    name = hashlib.sha256(os.fsencode(str(target))).hexdigest()[:40] + ".lock"
    (journal.root / "locks" / name).symlink_to(fixed["victim"])
    with pytest.raises(SeedanceError, match="lock"):
        with journal.begin("test") as entry:
            entry.replace_file(str(target), b"new")
    (journal.root / "locks" / name).unlink()
    os.link(fixed["victim"], journal.root / "locks" / name)  # a second name of the victim
    with pytest.raises(SeedanceError, match="not a private regular file"):
        with journal.begin("test") as entry:
            entry.replace_file(str(target), b"new")
    assert target.read_bytes() == b"data" and untouched(fixed)


def test_an_entry_id_cannot_name_a_path(fixed):
    for bad in ("../../victim", "/etc", "20260101-000000-abcdef/../.."):
        proc = run_cli("fix", "undo", bad, env=fixed["env"])
        assert proc.returncode == 2 and "not a journal entry id" in proc.stderr
    assert untouched(fixed)


def _mutants(manifest, rng, count):
    """Structural mutants (a field set to another type or a hostile value) and byte mutants."""
    text = json.dumps(manifest).encode()
    hostile = [None, 0, -1, 2**70, True, "", "..", "/", "/dev/zero", "files/../../x", [], {}, "\udcff", 1.5]
    for _ in range(count):
        if rng.random() < 0.6:
            mutant = copy.deepcopy(manifest)
            record = mutant["files"][0]
            holder = record if rng.random() < 0.8 else mutant
            key = rng.choice(sorted(holder))
            holder[key] = rng.choice(hostile)
            yield json.dumps(mutant).encode("utf-8", "surrogatepass")
        else:
            data = bytearray(text)
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            yield bytes(data[:rng.randint(0, len(data))]) if rng.random() < 0.2 else bytes(data)


def test_fuzz_manifests_never_traceback_and_never_write_outside(fixed):
    """Counts for the issue: inputs tried, tracebacks (non-SeedanceError), files outside the
    journal changed (the victim) and targets left in a third state.  Target: 0 of each."""
    rng = random.Random(1017)
    journal, entry = fixed["journal"], fixed["entry"]
    tried = tracebacks = outside = third_state = 0
    failures = []
    for data in _mutants(fixed["manifest"], rng, 400):
        tried += 1
        (journal.root / entry.id / "manifest.json").write_bytes(data)
        for step in (lambda: journal.entries(damaged=True), journal.recover_entries,
                     lambda: journal.undo(entry.id), journal.undo):
            try:
                step()
            except SeedanceError as exc:
                assert "\n" not in str(exc)
            except Exception as exc:  # noqa: BLE001 - this is what the fuzz counts
                tracebacks += 1
                failures.append(f"{type(exc).__name__}: {exc} <- {data[:200]!r}")
        if fixed["victim"].read_bytes() != b"precious":
            outside += 1
            fixed["victim"].write_bytes(b"precious")
        if fixed["target"].read_bytes() not in (b"\x7fELF result", b"\x7fELF original"):
            third_state += 1
        # put the fix back in force for the next mutant
        if fixed["target"].read_bytes() != b"\x7fELF result":
            fixed["target"].write_bytes(b"\x7fELF result")
        backup = journal.root / entry.id / "files" / "0"
        if not backup.exists():
            backup.write_bytes(b"\x7fELF original")
    print(f"journal fuzz: {tried} inputs, {tracebacks} tracebacks, {outside} files outside changed, "
          f"{third_state} targets in a third state")
    assert (tracebacks, outside, third_state) == (0, 0, 0), failures[:5]
    assert tried == 400
