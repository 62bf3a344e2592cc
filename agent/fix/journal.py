"""The fix journal: every file a fixer touches is kept here first, so any fix can be undone.

Layout (XDG base directory spec: state that should survive reboots but is not config):

    $XDG_STATE_HOME/seedance/journal/<id>/      (default ~/.local/state/seedance/journal)
        manifest.json   what was done, with sha256 before/after and the entry status
        lock            flock held by the fixer while the entry is open
        files/<n>       the original bytes of a modified file, or a moved directory

Crash consistency: an original and its manifest record are made durable (fsync file, fsync
manifest, fsync directory) BEFORE the target is touched, and the expected sha256 of the
result is recorded before the rename.  An entry still "open" whose lock nobody holds was
interrupted; recovery (run by the next fix, undo or history) puts every file it lists back
to its original bytes and marks it "rolled-back".  So after a crash at any step, each file
is the original or the verified result, and undo works either way.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BadInput
from . import atomic
from .atomic import crash_point, sha256_bytes, sha256_file

SCHEMA = "seedance.journal/v1"
_ID = re.compile(r"[0-9]{8}-[0-9]{6}-[0-9a-f]{6}")
OPEN, COMMITTED, ROLLED_BACK, UNDOING, UNDONE = "open", "committed", "rolled-back", "undoing", "undone"


class VerifyFailed(BadInput):
    """The rewritten temp file did not pass verification; the target was not touched."""


def journal_root() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "seedance" / "journal"


def _write_json(path: Path, obj: dict) -> None:
    atomic.atomic_write(str(path), (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode(),
                        mode=0o600)


@dataclass
class UndoResult:
    id: str
    restored: list = field(default_factory=list)  # paths put back
    notes: list = field(default_factory=list)


class Entry:
    """One fix run: a set of file changes that is committed, rolled back or undone together."""

    def __init__(self, journal: "Journal", entry_id: str, manifest: dict, lock_fd: int | None):
        self.journal = journal
        self.id = entry_id
        self.dir = journal.root / entry_id
        self.manifest = manifest
        self._lock_fd = lock_fd

    # -- bookkeeping ---------------------------------------------------------------------------
    def save(self) -> None:
        _write_json(self.dir / "manifest.json", self.manifest)

    @property
    def files(self) -> list:
        return self.manifest["files"]

    def _new_record(self, path: str, action: str, summary: str) -> dict:
        index = len(self.files)
        record = {"path": os.path.abspath(path), "action": action, "backup": f"files/{index}",
                  "sha256_before": None, "sha256_after": None, "mode": None, "uid": None,
                  "gid": None, "temp": None, "state": "planned", "summary": summary}
        self.files.append(record)
        return record

    # -- the three kinds of change ----------------------------------------------------------------
    def replace_file(self, path: str, new_data, verify=None, summary: str = "") -> dict:
        """Back up ``path``, write ``new_data`` beside it, verify the temp, rename it over.

        ``new_data`` is bytes or a callable fill(fd) (see atomic.write_temp).

        ``verify(temp_path)`` raises (any SeedanceError) to refuse; then the target is not
        touched, the temp is removed and VerifyFailed carries the reason.
        """
        path = os.path.abspath(path)
        st = os.stat(path)
        record = self._new_record(path, "modify", summary)
        backup = self.dir / record["backup"]
        with open(path, "rb") as handle:
            original = handle.read()
        atomic.write_temp(original, str(backup), mode=0o600)
        atomic.fsync_dir(str(backup.parent))
        record.update(sha256_before=sha256_bytes(original), mode=st.st_mode & 0o7777,
                      uid=st.st_uid, gid=st.st_gid, temp=atomic.temp_path_for(path, self.id),
                      state="backed-up")
        self.save()
        crash_point("after-backup")

        temp = record["temp"]
        atomic.write_temp(new_data, temp, mode=record["mode"], owner=(st.st_uid, st.st_gid), crash=True)
        try:
            if verify is not None:
                verify(temp)
        except Exception as exc:
            _unlink(temp)
            record["state"] = "verify-failed"
            record["error"] = str(exc)
            self.save()
            raise VerifyFailed(f"{path}: verification failed, not rewritten: {exc}") from None
        after = sha256_file(temp) if callable(new_data) else sha256_bytes(new_data)
        record.update(sha256_after=after, state="verified")
        self.save()
        crash_point("after-verify")
        atomic.replace(temp, path, crash=True)
        record["state"] = "written"
        self.save()
        return record

    def create_file(self, path: str, data: bytes, mode: int = 0o644, summary: str = "") -> dict:
        """Create a file that did not exist (undo removes it)."""
        path = os.path.abspath(path)
        if os.path.lexists(path):
            raise BadInput(f"{path}: already exists; not overwritten")
        record = self._new_record(path, "create", summary)
        record.update(sha256_after=sha256_bytes(data), mode=mode, temp=atomic.temp_path_for(path, self.id),
                      state="backed-up")
        self.save()
        crash_point("after-backup")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic.write_temp(data, record["temp"], mode=mode, crash=True)
        crash_point("after-verify")
        atomic.replace(record["temp"], path, crash=True)
        record["state"] = "written"
        self.save()
        return record

    def move_into(self, path: str, summary: str = "") -> dict:
        """Move a file or directory (a stale build cache) into the journal."""
        path = os.path.abspath(path)
        record = self._new_record(path, "move", summary)
        record["state"] = "moving"
        self.save()
        crash_point("after-backup")
        dest = self.dir / record["backup"]
        _move(path, str(dest))
        crash_point("after-rename")
        record["state"] = "written"
        self.save()
        return record

    def expect_new_dir(self, path: str, summary: str = "") -> dict:
        """Record, before a build runs, that ``path`` is about to be created (undo moves it away)."""
        path = os.path.abspath(path)
        record = self._new_record(path, "create-dir", summary)
        record["state"] = "building"
        self.save()
        return record

    def created(self, record: dict) -> None:
        record["state"] = "written"
        self.save()

    # -- ending an entry -------------------------------------------------------------------------
    def commit(self) -> None:
        self.manifest["status"] = COMMITTED if any(r["state"] == "written" for r in self.files) else ROLLED_BACK
        self.manifest["finished"] = _now()
        self.save()
        crash_point("after-commit")
        self.release()

    def abort(self, reason: str) -> None:
        """Put back every file this entry changed (used when a later step fails)."""
        notes = self.journal._roll_back(self)
        self.manifest["status"] = ROLLED_BACK
        self.manifest["note"] = " ".join([reason, *notes]).strip()
        self.manifest["finished"] = _now()
        self.save()
        self.release()

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._lock_fd is None:
            return False
        if exc is None:
            self.commit()
        else:
            self.abort(f"aborted: {exc}")
        return False


class Journal:
    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root else journal_root()

    # -- entries ---------------------------------------------------------------------------------
    def begin(self, command: str, argv=(), findings=()) -> Entry:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        entry_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)
        entry_dir = self.root / entry_id
        (entry_dir / "files").mkdir(parents=True, mode=0o700)
        lock_fd = os.open(entry_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        manifest = {"schema": SCHEMA, "id": entry_id, "status": OPEN, "created": _now(),
                    "finished": None, "command": command, "argv": list(argv), "pid": os.getpid(),
                    "host": socket.gethostname(), "findings": list(findings), "files": [], "note": ""}
        entry = Entry(self, entry_id, manifest, lock_fd)
        entry.save()
        atomic.fsync_dir(str(self.root))
        return entry

    def ids(self) -> list:
        if not self.root.is_dir():
            return []
        return sorted(name for name in os.listdir(self.root)
                      if _ID.fullmatch(name) and (self.root / name / "manifest.json").is_file())

    def load(self, entry_id: str) -> Entry:
        if not _ID.fullmatch(entry_id or ""):
            raise BadInput(f"{entry_id!r} is not a journal entry id (see: seedance fix history)")
        path = self.root / entry_id / "manifest.json"
        try:
            manifest = json.loads(path.read_text())
        except FileNotFoundError:
            raise BadInput(f"journal entry {entry_id} not found in {self.root}") from None
        except (OSError, ValueError) as exc:
            raise BadInput(f"{path}: unreadable journal manifest: {exc}") from None
        return Entry(self, entry_id, manifest, None)

    def entries(self) -> list:
        return [self.load(entry_id) for entry_id in self.ids()]

    # -- recovery --------------------------------------------------------------------------------
    def recover(self) -> list:
        """Roll back entries left open by a fixer that died; returns one note per entry."""
        return [f"{r.id}: {' '.join(r.notes)}" for r in self.recover_entries()]

    def recover_entries(self) -> list:
        """Like recover(), as UndoResults (the paths put back, and why)."""
        results = []
        for entry_id in self.ids():
            entry = self.load(entry_id)
            if entry.manifest.get("status") not in (OPEN, UNDOING):
                continue
            lock_fd = _try_lock(entry.dir / "lock")
            if lock_fd is None:
                continue  # a live fixer holds it
            entry._lock_fd = lock_fd
            try:
                touched = [r["path"] for r in entry.files
                           if r.get("state") in ("written", "verified", "moving", "building", "backed-up")]
                if entry.manifest["status"] == OPEN:
                    done = self._roll_back(entry)
                    entry.manifest["status"] = ROLLED_BACK
                    entry.manifest["note"] = "interrupted; rolled back on recovery " + " ".join(done)
                else:
                    self._restore_all(entry)
                    entry.manifest["status"] = UNDONE
                    entry.manifest["note"] = "undo interrupted; completed on recovery"
                entry.manifest["finished"] = _now()
                entry.save()
                results.append(UndoResult(entry_id, touched, [entry.manifest["note"].strip()]))
            finally:
                entry.release()
        return results

    def _roll_back(self, entry: Entry) -> list:
        """Return every file of ``entry`` to its original state, newest change first."""
        notes = []
        for record in reversed(entry.files):
            if record.get("temp"):
                _unlink(record["temp"])
            state = record.get("state")
            if state in ("planned", "verify-failed", "rolled-back") or (
                    state == "building" and not os.path.lexists(record["path"])):
                continue
            note = self._restore(entry, record, tolerate_original=True)
            if note:
                notes.append(note)
            record["state"] = "rolled-back"
        return notes

    # -- undo ------------------------------------------------------------------------------------
    def undo(self, entry_id: str | None = None) -> UndoResult:
        recovered = {r.id: r for r in self.recover_entries()}
        if entry_id in recovered:
            return recovered[entry_id]  # the interrupted fix is rolled back: that is its undo
        if entry_id is None and recovered and not any(
                e.manifest.get("status") == COMMITTED and e.id > max(recovered) for e in self.entries()):
            return recovered[max(recovered)]
        if entry_id is None:
            candidates = [e for e in self.entries() if e.manifest.get("status") == COMMITTED]
            if not candidates:
                raise BadInput(f"nothing to undo: no committed fix in {self.root}")
            entry = candidates[-1]
        else:
            entry = self.load(entry_id)
        status = entry.manifest.get("status")
        if status in (ROLLED_BACK, UNDONE):
            raise BadInput(f"journal entry {entry.id} is already {status}; nothing to undo")
        lock_fd = _try_lock(entry.dir / "lock")
        if lock_fd is None:
            raise BadInput(f"journal entry {entry.id} is in use by a running fixer")
        entry._lock_fd = lock_fd
        try:
            # judge every file before touching any, so a refusal leaves everything as it was
            created = {r["path"] for r in entry.files
                       if r["action"] in ("create", "create-dir") and r.get("state") == "written"}
            for record in entry.files:
                if record.get("state") == "written" and not (
                        record["action"] == "move" and record["path"] in created):
                    problem = _undo_problem(entry, record)
                    if problem:
                        raise BadInput(problem)
            entry.manifest["status"] = UNDOING
            entry.save()
            result = UndoResult(entry.id)
            result.restored = self._restore_all(entry)
            entry.manifest["status"] = UNDONE
            entry.manifest["undone"] = _now()
            entry.save()
            return result
        finally:
            entry.release()

    def _restore_all(self, entry: Entry) -> list:
        restored = []
        for record in reversed(entry.files):
            if record.get("state") == "written":
                self._restore(entry, record, tolerate_original=True)
                record["state"] = "undone"
                entry.save()
                restored.append(record["path"])
        return restored

    def _restore(self, entry: Entry, record: dict, tolerate_original: bool) -> str:
        """Put one file back; returns a note when something could not be judged safe."""
        path, action = record["path"], record["action"]
        backup = entry.dir / record["backup"]
        if action == "modify":
            current = _sha_or_none(path)
            if current == record["sha256_before"]:
                return ""
            if current is not None and current != record["sha256_after"]:
                return f"{path}: changed since the fix; left as is"
            if not backup.is_file() or sha256_file(str(backup)) != record["sha256_before"]:
                return f"{path}: backup missing or damaged; left as is"
            atomic.atomic_write(path, backup.read_bytes(), mode=record["mode"],
                                owner=(record["uid"], record["gid"]))
            if sha256_file(path) != record["sha256_before"]:
                raise BadInput(f"{path}: restored bytes do not match the recorded sha256")
            return ""
        if action == "create":
            current = _sha_or_none(path)
            if current is None:
                return ""
            if current != record["sha256_after"]:
                return f"{path}: changed since the fix; left as is"
            os.unlink(path)
            atomic.fsync_dir(os.path.dirname(path))
            return ""
        if action == "create-dir":
            if os.path.lexists(path) and not backup.exists():
                _move(path, str(backup))  # generated, but kept rather than deleted
            return ""
        if action == "move":
            partial = Path(str(backup) + ".partial")
            if partial.exists():
                shutil.rmtree(partial, ignore_errors=True)
            if backup.exists() and not os.path.lexists(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                _move(str(backup), path)
            return ""
        return f"{path}: unknown action {action}"


def _undo_problem(entry: Entry, record: dict) -> str:
    path = record["path"]
    if record["action"] in ("modify", "create"):
        current = _sha_or_none(path)
        allowed = {record["sha256_after"], record["sha256_before"]}
        if record["action"] == "create":
            allowed.add(None)
        if current not in allowed:
            return (f"{path} changed since fix {entry.id} (sha256 {str(current)[:12]}, "
                    f"expected {record['sha256_after'][:12]}); nothing restored")
    elif record["action"] == "move":
        if os.path.lexists(path) and (entry.dir / record["backup"]).exists():
            return f"{path} exists again since fix {entry.id}; move it away first; nothing restored"
    return ""


def _move(src: str, dest: str) -> None:
    """rename(2) when possible; across filesystems copy to a partial name, rename, then delete."""
    try:
        os.rename(src, dest)
    except OSError as exc:
        if exc.errno != 18:  # EXDEV
            raise
        partial = dest + ".partial"
        if os.path.isdir(src) and not os.path.islink(src):
            shutil.copytree(src, partial, symlinks=True)
        else:
            shutil.copy2(src, partial, follow_symlinks=False)
        os.rename(partial, dest)
        atomic.fsync_dir(os.path.dirname(dest))
        if os.path.isdir(src) and not os.path.islink(src):
            shutil.rmtree(src)
        else:
            os.unlink(src)
    atomic.fsync_dir(os.path.dirname(dest))
    atomic.fsync_dir(os.path.dirname(src))


def _try_lock(path: Path) -> int | None:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _sha_or_none(path: str) -> str | None:
    try:
        return sha256_file(path)
    except FileNotFoundError:
        return None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
