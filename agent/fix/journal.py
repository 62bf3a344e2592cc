"""The fix journal: every file a fixer touches is kept here first, so any fix can be undone.

Layout (XDG base directory spec: state that should survive reboots but is not config):

    $XDG_STATE_HOME/seedance/journal/<id>/      (default ~/.local/state/seedance/journal)
        manifest.json   what was done, with sha256 before/after and the entry status
        lock            flock held by the fixer while the entry is open
        files/<n>       the original of a modified file (a hard link to its old inode when the
                        journal shares its filesystem, else a copy), or a moved directory
    $XDG_STATE_HOME/seedance/journal/locks/<sha256 of the real path>.lock
                        flock held while one fix, undo or recovery changes that file

Crash consistency: an original and its manifest record are made durable (fsync file, fsync
manifest, fsync directory) BEFORE the target is touched, and the expected sha256 of the
result is recorded before the rename.  An entry still "open" whose lock nobody holds was
interrupted; recovery (run by the next fix, undo or history) puts every file it lists back
to its original bytes and marks it "rolled-back".  So after a crash at any step, each file
is the original or the verified result, and undo works either way.

Nothing is put back unseen: a backup is renamed into place only
after its sha256 matched the one recorded before the fix, and a target that is neither the
fix's result nor its original is left alone.  Either refusal names the path, writes nothing,
and leaves the entry as it was (never "undone" or "rolled-back" when it is not).  Every file
is judged before any is touched; a failure after that, part-way through putting files back
(a move that cannot complete, e.g. across filesystems), leaves the entry "undoing", and the
next recovery finishes the undo.

Symlinks: a fix follows a symlink to the real file, rewrites that, and keeps the link.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import stat
import threading
import time

from ..model.errors import BadInput
from ..model.record import NEW, Record
from . import atomic
from .atomic import crash_point, sha256_bytes, sha256_file

SCHEMA = "seedance.journal/v1"
_ID = re.compile(r"[0-9]{8}-[0-9]{6}-[0-9a-f]{6}")
OPEN, COMMITTED, ROLLED_BACK, UNDOING, UNDONE = "open", "committed", "rolled-back", "undoing", "undone"
DAMAGED = "damaged"  # shown by history for a manifest that cannot be read; never written
STATUSES = (OPEN, COMMITTED, ROLLED_BACK, UNDOING, UNDONE)
ACTIONS = ("modify", "create", "move", "create-dir")
_BACKUP = re.compile(r"files/[0-9]{1,9}")
_SHA = re.compile(r"[0-9a-f]{64}")
_UNFINISHED = re.compile(rb'"status"\s*:\s*"(?:open|undoing)"')
MAX_MANIFEST = 16 << 20  # a manifest lists a handful of files; anything larger is not ours
# record states in which the target may already hold the result (the rename happens only
# after "verified" is saved); before that the target was never touched
_MAYBE_WRITTEN = ("verified", "written", "moving", "building")


class VerifyFailed(BadInput):
    """The rewritten temp file did not pass verification; the target was not touched."""


class RestoreRefused(BadInput):
    """A file could not be put back safely (backup missing or damaged, target changed); nothing
    was written to it."""


class DamagedEntry(BadInput):
    """A journal entry's manifest.json cannot be read or does not describe an entry."""


def journal_root():
    """The journal's directory, a pathlib.Path ($XDG_STATE_HOME/seedance/journal)."""
    from pathlib import Path

    return Path(_journal_root())


def _journal_root() -> str:
    # str paths inside the journal: importing pathlib (with urllib.parse and ipaddress) would
    # be paid at every `seedance fix` start; Journal.root and Entry.dir still give a Path
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "seedance", "journal")


def _write_json(path: str, obj: dict, sync: bool = True) -> None:
    atomic.atomic_write(str(path), (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode(),
                        mode=0o600, sync=sync)


class UndoResult(Record):
    """What an undo or a recovery did to one entry's files."""
    _fields = ("id", "restored", "notes", "unchanged", "refused")

    def __init__(self, id: str, restored: list = NEW, notes: list = NEW, unchanged: list = NEW,
                 refused: str = ""):
        self.id = id
        self.restored = [] if restored is NEW else restored  # paths whose original bytes were put back
        self.notes = [] if notes is NEW else notes
        self.unchanged = [] if unchanged is NEW else unchanged  # paths that already held their original
        self.refused = refused  # why recovery could not put the files back ('' when it could)


class Entry:
    """One fix run: a set of file changes that is committed, rolled back or undone together."""

    def __init__(self, journal: "Journal", entry_id: str, manifest: dict, lock_fd: int | None,
                 damaged: str = ""):
        self.journal = journal
        self.id = entry_id
        self._dir = f"{journal._root}/{entry_id}"
        self.manifest = manifest
        self.damaged = damaged  # why manifest.json is unusable ('' when it is fine)
        self._lock_fd = lock_fd
        self._target_locks: dict = {}  # real path -> flock fd, held until release()
        self._root_synced = False

    @property
    def dir(self):
        """The entry's directory, a pathlib.Path."""
        from pathlib import Path

        return Path(self._dir)

    def _backup_path(self, record: dict) -> str:
        """Where the entry keeps ``record``'s original (files/N, checked by _manifest_problem)."""
        return f"{self._dir}/{record['backup']}"

    # -- bookkeeping ---------------------------------------------------------------------------
    def save(self, durable: bool = True) -> None:
        """Write manifest.json.  durable=False only for states that recovery can infer from the
        files themselves (a state that comes before any change to a target, or "written",
        which recovery tells from "verified" by the target's sha256): each fsync waits for
        the disk to commit the file, and on a busy disk those waits would be most of a
        small fix's wall time."""
        if self.damaged:
            raise DamagedEntry(f"journal entry {self.id}: {self.damaged}; not rewritten")
        _write_json(f"{self._dir}/manifest.json", self.manifest, sync=durable)
        if durable and not self._root_synced:
            atomic.fsync_dir(self.journal._root)  # the entry's own directory entry
            self._root_synced = True

    @property
    def files(self) -> list:
        return self.manifest["files"]

    def _new_record(self, path: str, action: str, summary: str, link: str | None = None) -> dict:
        index = len(self.files)
        record = {"path": path, "action": action, "backup": f"files/{index}",
                  "sha256_before": None, "sha256_after": None, "mode": None, "uid": None,
                  "gid": None, "temp": None, "state": "planned", "summary": summary}
        if link:
            record["link"] = link  # the symlink the fixer was given; it still points at path
        self.files.append(record)
        return record

    def lock_target(self, path: str) -> None:
        """Hold the per-target lock of ``path`` (a real path) until this entry ends."""
        if path not in self._target_locks:
            self._target_locks[path] = self.journal.lock_target(path)

    # -- the three kinds of change ----------------------------------------------------------------
    def replace_file(self, path: str, new_data, verify=None, summary: str = "", expect=None) -> dict:
        """Back up ``path``, write ``new_data`` beside it, verify the temp, rename it over.

        ``new_data`` is bytes or a callable fill(fd) (see atomic.write_temp); a fill that
        returns the sha256 hex digest of what it wrote (dynedit.FileEdit.fill) saves a second
        read of the result, and one that returns a pending digest (an object with result(),
        dynedit.FileEdit.fill_deferred) lets it be taken while the temp is verified.

        A symlink is followed: the real file is rewritten and the link stays a link.
        ``expect`` is atomic.file_identity() of the file the edit was planned from; if the file is no
        longer that one (another fix renamed a result over it since), nothing is written.

        ``verify(temp_path)`` raises (any SeedanceError) to refuse; then the target is not
        touched, the temp is removed and VerifyFailed carries the reason.
        """
        given = os.path.abspath(path)
        path = os.path.realpath(given)
        self.lock_target(path)
        st = os.stat(path)
        if expect is not None and atomic.file_identity(st) != tuple(expect):
            raise BadInput(f"{path}: changed since this fix planned its edit (another fix ran?); not rewritten")
        record = self._new_record(path, "modify", summary, link=given if given != path else None)
        backup = self._backup_path(record)
        record["backup_kind"], before = _make_backup(path, backup, st)
        # the backup's directory entry is made durable while the temp is written and verified
        # (it must be, like the temp, before the "verified" save that precedes the rename)
        dir_sync = atomic.BackgroundSync(os.path.dirname(backup))
        record.update(sha256_before=before, mode=st.st_mode & 0o7777, uid=st.st_uid, gid=st.st_gid,
                      temp=atomic.temp_path_for(path, self.id), state="backed-up")
        self.save(durable=False)  # the target is untouched until the "verified" save below
        crash_point("after-backup")
        # a linked backup is the original inode itself: hash it while the temp is written and
        # verified (hashlib releases the GIL), instead of reading the file once more after
        hasher = None if before else _Hasher(str(backup))

        temp = record["temp"]
        syncer = None
        try:
            filled = atomic.write_temp(new_data, temp, mode=record["mode"], owner=(st.st_uid, st.st_gid),
                                       crash=True, result=True, sync=False)
            # the temp is made durable while it is verified; both end before the rename
            syncer = atomic.BackgroundSync(temp)
        except BaseException:
            dir_sync.join_quietly()
            if hasher is not None:
                hasher.join_quietly()
            raise
        try:
            if verify is not None:
                verify(temp)
        except Exception as exc:
            syncer.join()
            dir_sync.join_quietly()
            if hasattr(filled, "abandon"):
                filled.abandon()
            _unlink(temp)
            if hasher is not None:
                hasher.join_quietly()
            record["state"] = "verify-failed"
            record["error"] = str(exc)
            self.save()
            raise VerifyFailed(f"{path}: verification failed, not rewritten: {exc}") from None
        syncer.join()
        dir_sync.join()
        crash_point("after-fsync")
        if hasattr(filled, "result"):  # the result's hash, taken while it was written and verified
            try:
                filled = filled.result()
            except BaseException:
                _unlink(temp)
                if hasher is not None:
                    hasher.join_quietly()
                raise
        if isinstance(filled, str) and _SHA.fullmatch(filled):
            after = filled
        elif callable(new_data):
            after = sha256_file(temp)
        else:
            after = sha256_bytes(new_data)
        if hasher is not None:
            before = hasher.join()
            if os.stat(path).st_ino != st.st_ino:
                _unlink(temp)
                raise BadInput(f"{path}: replaced by someone else during the fix; not rewritten")
        record.update(sha256_before=before, sha256_after=after, state="verified")
        self.save()
        crash_point("after-verify")
        atomic.replace(temp, path, crash=True)
        record["state"] = "written"
        self.save(durable=False)
        return record

    def create_file(self, path: str, data: bytes, mode: int = 0o644, summary: str = "") -> dict:
        """Create a file that did not exist (undo removes it)."""
        path = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path))
        if os.path.lexists(path):
            raise BadInput(f"{path}: already exists; not overwritten")
        self.lock_target(path)
        record = self._new_record(path, "create", summary)
        record.update(sha256_after=sha256_bytes(data), mode=mode, temp=atomic.temp_path_for(path, self.id),
                      state="backed-up")
        self.save(durable=False)
        crash_point("after-backup")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic.write_temp(data, record["temp"], mode=mode, crash=True)
        record["state"] = "verified"
        self.save()
        crash_point("after-verify")
        if os.path.lexists(path):  # appeared meanwhile: never clobber what another wrote
            _unlink(record["temp"])
            raise BadInput(f"{path}: appeared while this fix ran; not overwritten")
        atomic.replace(record["temp"], path, crash=True)
        record["state"] = "written"
        self.save(durable=False)
        return record

    def move_into(self, path: str, summary: str = "") -> dict:
        """Move a file or directory (a stale build cache) into the journal."""
        path = os.path.abspath(path)
        self.lock_target(os.path.realpath(path))
        record = self._new_record(path, "move", summary)
        record["state"] = "moving"
        self.save()
        crash_point("after-backup")
        dest = self._backup_path(record)
        _move(path, dest)
        crash_point("after-rename")
        record["state"] = "written"
        self.save()
        return record

    def expect_new_dir(self, path: str, summary: str = "") -> dict:
        """Record, before a build runs, that ``path`` is about to be created (undo moves it away)."""
        path = os.path.abspath(path)
        self.lock_target(os.path.realpath(path))
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
        try:
            put_back = self.journal._roll_back(self)
        except RestoreRefused as exc:
            # the entry stays open: recovery retries it and says why each time
            self.manifest["note"] = f"{reason}; roll back refused: {exc}"
            self.save()
            self.release()
            raise
        self.manifest["status"] = ROLLED_BACK
        self.manifest["note"] = " ".join([reason, *(f"put back {p}" for p in put_back)]).strip()
        self.manifest["finished"] = _now()
        self.save()
        self.release()

    def release(self) -> None:
        for fd in self._target_locks.values():
            os.close(fd)
        self._target_locks.clear()
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
        self._root = os.fspath(root) if root else _journal_root()

    @property
    def root(self):
        """The journal's directory, a pathlib.Path."""
        from pathlib import Path

        return Path(self._root)

    # -- entries ---------------------------------------------------------------------------------
    def begin(self, command: str, argv=(), findings=()) -> Entry:
        os.makedirs(self._root, mode=0o700, exist_ok=True)  # the mode for the leaf, as Path.mkdir
        entry_id, entry_dir = self._new_entry_dir()
        lock_fd = os.open(f"{entry_dir}/lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        manifest = {"schema": SCHEMA, "id": entry_id, "status": OPEN, "created": _now(),
                    "finished": None, "command": command, "argv": list(argv), "pid": os.getpid(),
                    "host": os.uname().nodename, "findings": list(findings), "files": [], "note": ""}
        entry = Entry(self, entry_id, manifest, lock_fd)
        entry.save(durable=False)  # made durable, with the root, by the first save before a change
        return entry

    def _new_entry_dir(self):
        """A fresh id and its directory, made.  Ids sort in the order fixes began: undo without
        an id takes the newest, so two fixes in one second must not order by chance (the suffix
        was random: half of such pairs sorted the older fix last).  The suffix is the
        microsecond, read with the second from one clock (time.gmtime() alone reads time(2),
        the kernel's coarse clock, a tick behind); a taken id moves one microsecond on."""
        now = time.time_ns() // 1000
        seconds, micro = divmod(now, 1_000_000)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(seconds))
        while True:
            entry_id = f"{stamp}-{micro:06x}"
            entry_dir = f"{self._root}/{entry_id}"
            try:
                os.mkdir(entry_dir, 0o700)
            except FileExistsError:
                micro += 1  # 0xffffff > 999,999: room to move on within the same second's ids
                continue
            os.mkdir(f"{entry_dir}/files", 0o700)
            return entry_id, entry_dir

    def ids(self) -> list:
        root = self._root  # str paths: a Path per entry was most of this on a long history
        if not os.path.isdir(root):
            return []
        return sorted(name for name in os.listdir(root)
                      if _ID.fullmatch(name) and os.path.lexists(f"{root}/{name}/manifest.json"))

    def load(self, entry_id: str) -> Entry:
        """The entry; DamagedEntry (one line, exit 2) when its manifest cannot be used."""
        entry = self.read(entry_id)
        if entry.damaged:
            raise DamagedEntry(f"journal entry {entry_id}: {entry.damaged}; nothing restored")
        return entry

    def read(self, entry_id: str) -> Entry:
        """The entry, or one marked damaged (status "damaged", the reason in .damaged)."""
        if not _ID.fullmatch(entry_id or ""):
            raise BadInput(f"{entry_id!r} is not a journal entry id (see: seedance fix history)")
        path = f"{self._root}/{entry_id}/manifest.json"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            raise BadInput(f"journal entry {entry_id} not found in {self._root}") from None
        except OSError as exc:
            return self._damaged(entry_id, f"manifest.json unreadable ({(exc.strerror or 'error').lower()})")
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return self._damaged(entry_id, "manifest.json is not a regular file")
            with os.fdopen(os.dup(fd), "rb") as handle:
                raw = handle.read(MAX_MANIFEST + 1)
        finally:
            os.close(fd)
        if len(raw) > MAX_MANIFEST:
            return self._damaged(entry_id, f"manifest.json is larger than {MAX_MANIFEST >> 20} MiB")
        try:
            manifest = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            return self._damaged(entry_id, "manifest.json is not UTF-8")
        except (ValueError, RecursionError) as exc:
            why = f"line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else "nested too deep"
            return self._damaged(entry_id, f"manifest.json is not valid JSON ({why}; truncated?)")
        problem = _manifest_problem(entry_id, manifest)
        if problem:
            return self._damaged(entry_id, f"manifest.json {problem}")
        return Entry(self, entry_id, manifest, None)

    def _damaged(self, entry_id: str, why: str) -> Entry:
        manifest = {"id": entry_id, "status": DAMAGED, "created": None, "finished": None,
                    "command": "", "argv": [], "findings": [], "files": [], "note": why}
        return Entry(self, entry_id, manifest, None, damaged=why)

    def entries(self, damaged: bool = False) -> list:
        """Every entry, oldest first; damaged ones only when asked (history shows them)."""
        found = [self.read(entry_id) for entry_id in self.ids()]
        return found if damaged else [e for e in found if not e.damaged]

    # -- per-target locks ----------------------------------------------------------------------------
    def lock_target(self, path: str) -> int:
        """flock the lock file of the real path ``path``; refuse at once when another holds it.

        Refusing rather than waiting: the other run may be planning from the same bytes, and
        a stale plan must not be applied after it (concurrent fixes of one file would all
        commit, each over the other's result).  The lock lives in the journal, keyed by the
        sha256 of the real path, so a symlink and its target share one lock.
        """
        locks = f"{self._root}/locks"
        os.makedirs(locks, mode=0o700, exist_ok=True)
        name = f"{locks}/" + hashlib.sha256(os.fsencode(path)).hexdigest()[:40] + ".lock"
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        except OSError as exc:
            raise BadInput(f"{path}: its lock {name} cannot be opened "
                           f"({(exc.strerror or 'error').lower()}); not touched") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.geteuid():
            os.close(fd)
            raise BadInput(f"{path}: its lock {name} is not a private regular file; not touched")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
            os.close(fd)
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise BadInput(f"{path}: another seedance fix or undo{who} is changing it now; "
                           f"not touched: retry when it has finished") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return fd

    def _lock_targets(self, entry: Entry) -> bool:
        """All target locks of ``entry`` (False, holding none, when any is taken)."""
        try:
            for record in entry.files:
                entry.lock_target(os.path.realpath(record["path"]))
        except BadInput:
            for fd in entry._target_locks.values():
                os.close(fd)
            entry._target_locks.clear()
            return False
        return True

    # -- recovery --------------------------------------------------------------------------------
    def recover(self) -> list:
        """Roll back entries left open by a fixer that died; returns one note per entry."""
        return [f"{r.id}: {r.refused or ' '.join(r.notes)}" for r in self.recover_entries()]

    def _maybe_unfinished(self, entry_id: str) -> bool:
        """False when the entry's manifest is a regular file that cannot hold an open or
        undoing status; True when it may (read and judged in full then).  Every fix starts
        with recovery, and parsing and validating every manifest of a long history would
        make every fix's start grow with the history; a status key can only be written as
        JSON writes keys (inside a string every quote is escaped), so a raw search is enough
        to rule one out."""
        try:
            fd = os.open(f"{self._root}/{entry_id}/manifest.json",
                         os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return True  # read() says what is wrong
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_MANIFEST:
                return True
            raw = os.read(fd, st.st_size + 1)  # one read: a manifest is a few KB
        finally:
            os.close(fd)
        return len(raw) > st.st_size or _UNFINISHED.search(raw) is not None

    def recover_entries(self) -> list:
        """Like recover(), as UndoResults (the paths put back, or why they were not)."""
        results = []
        for entry_id in self.ids():
            if not self._maybe_unfinished(entry_id):
                continue
            entry = self.read(entry_id)
            if entry.damaged or entry.manifest.get("status") not in (OPEN, UNDOING):
                continue
            lock_fd = _try_lock(f"{entry._dir}/lock")
            if lock_fd is None:
                continue  # a live fixer holds it
            entry._lock_fd = lock_fd
            try:
                if not self._lock_targets(entry):
                    continue  # a live fix or undo holds one of its files: recover later
                touched = [r["path"] for r in entry.files if r.get("state") in _MAYBE_WRITTEN]
                try:
                    if entry.manifest["status"] == OPEN:
                        done = self._roll_back(entry)
                        entry.manifest["status"] = ROLLED_BACK
                        entry.manifest["note"] = "interrupted; rolled back on recovery" + "".join(
                            f"; put back {p}" for p in done)
                    else:
                        self._restore_all(entry)
                        entry.manifest["status"] = UNDONE
                        entry.manifest["note"] = "undo interrupted; completed on recovery"
                except RestoreRefused as exc:
                    # the entry keeps its status: nothing is claimed that did not happen
                    entry.manifest["note"] = f"recovery refused: {exc}"
                    entry.save()
                    results.append(UndoResult(entry.id, [], [entry.manifest["note"]], refused=str(exc)))
                    continue
                entry.manifest["finished"] = _now()
                entry.save()
                results.append(UndoResult(entry.id, touched, [entry.manifest["note"].strip()]))
            finally:
                entry.release()
        return results

    def _roll_back(self, entry: Entry) -> list:
        """Return every file of ``entry`` to its original state, newest change first; returns
        the paths whose bytes were put back."""
        put_back = []
        for record in reversed(entry.files):
            if record.get("temp"):
                _unlink(record["temp"])
            state = record.get("state")
            if state not in _MAYBE_WRITTEN or (state == "building" and not os.path.lexists(record["path"])):
                continue  # the target was never touched
            if self._restore(entry, record):
                put_back.append(record["path"])
            record["state"] = "rolled-back"
            entry.save()
        return put_back

    # -- undo ------------------------------------------------------------------------------------
    def undo(self, entry_id: str | None = None) -> UndoResult:
        recovered = {r.id: r for r in self.recover_entries()}
        refused = [r for r in recovered.values() if r.refused]
        if refused:
            raise RestoreRefused(f"interrupted fix {refused[0].id} cannot be rolled back: {refused[0].refused}")
        if entry_id in recovered:
            return recovered[entry_id]  # the interrupted fix is rolled back: that is its undo
        everything = self.entries(damaged=True)
        if entry_id is None and recovered and not any(
                e.manifest.get("status") == COMMITTED and e.id > max(recovered) for e in everything):
            return recovered[max(recovered)]
        if entry_id is None:
            candidates = [e for e in everything if e.manifest.get("status") == COMMITTED]
            newest_damaged = [e for e in everything if e.damaged and (not candidates or e.id > candidates[-1].id)]
            if newest_damaged:
                e = newest_damaged[-1]
                raise DamagedEntry(f"journal entry {e.id}: {e.damaged}; nothing restored "
                                   f"(name the entry to undo: seedance fix undo ID)")
            if not candidates:
                raise BadInput(f"nothing to undo: no committed fix in {self._root}")
            entry = candidates[-1]
        else:
            entry = self.load(entry_id)
        status = entry.manifest.get("status")
        if status in (ROLLED_BACK, UNDONE):
            raise BadInput(f"journal entry {entry.id} is already {status}; nothing to undo")
        lock_fd = _try_lock(f"{entry._dir}/lock")
        if lock_fd is None:
            raise BadInput(f"journal entry {entry.id} is in use by a running fixer")
        entry._lock_fd = lock_fd
        try:
            for record in entry.files:
                entry.lock_target(os.path.realpath(record["path"]))
            # judge every file before touching any, so a refusal leaves everything as it was
            created = {r["path"] for r in entry.files
                       if r["action"] in ("create", "create-dir") and r.get("state") == "written"}
            for record in entry.files:
                if record.get("state") == "written" and not (
                        record["action"] == "move" and record["path"] in created):
                    problem = _undo_problem(entry, record)
                    if problem:
                        raise RestoreRefused(problem)
            entry.manifest["status"] = UNDOING
            entry.save()
            result = UndoResult(entry.id)
            result.restored, result.unchanged = self._restore_all(entry)
            entry.manifest["status"] = UNDONE
            entry.manifest["undone"] = _now()
            entry.save()
            return result
        finally:
            entry.release()

    def _restore_all(self, entry: Entry) -> tuple:
        restored, unchanged = [], []
        for record in reversed(entry.files):
            if record.get("state") == "written":
                done = self._restore(entry, record)
                record["state"] = "undone"
                entry.save()
                (restored if done else unchanged).append(record["path"])
        return restored, unchanged

    def _restore(self, entry: Entry, record: dict) -> bool:
        """Put one file back; True when bytes were written, False when it already was original.

        RestoreRefused, with nothing written, when the target is neither the fix's result nor
        its original, or the backup is missing or does not hash to the recorded sha256.
        """
        path, action = record["path"], record["action"]
        backup = entry._backup_path(record)
        if action == "modify":
            current = _sha_or_none(path)
            if current == record["sha256_before"]:
                return False
            if current is not None and current != record["sha256_after"]:
                raise RestoreRefused(f"{path}: changed since fix {entry.id} (sha256 {current[:12]}, the fix "
                                     f"wrote {str(record['sha256_after'])[:12]}); nothing restored")
            _put_back(path, backup, record, entry.id)
            return True
        if action == "create":
            current = _sha_or_none(path)
            if current is None:
                return False
            if current != record["sha256_after"]:
                raise RestoreRefused(f"{path}: changed since fix {entry.id}; not removed")
            os.unlink(path)
            atomic.fsync_dir(os.path.dirname(path))
            return True
        if action == "create-dir":
            if os.path.lexists(path) and not os.path.lexists(backup):
                try:  # generated, but kept rather than deleted; a rename, never a copy of a tree
                    os.rename(path, backup)
                except OSError as exc:
                    raise RestoreRefused(f"{path}: cannot move it into the journal "
                                         f"({(exc.strerror or 'error').lower()}); nothing moved") from None
                atomic.fsync_dir(os.path.dirname(backup))
                return True
            return False
        if action == "move":
            # what a copy across filesystems that stopped half-way left (_move): a tree, or a
            # single file or link (rmtree refuses those, and the copy would stay for good)
            partial = backup + ".partial"
            if os.path.isdir(partial) and not os.path.islink(partial):
                import shutil  # only after a move across filesystems: not on every fix's start

                shutil.rmtree(partial, ignore_errors=True)
            elif os.path.lexists(partial):
                os.unlink(partial)
            if os.path.lexists(path):
                return False
            if not os.path.lexists(backup):
                raise RestoreRefused(f"{path}: its copy {backup} is missing from the journal; nothing restored")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            _move(backup, path)
            return True
        raise RestoreRefused(f"{path}: unknown action {action}; nothing restored")


def _make_backup(path: str, backup: str, st: os.stat_result) -> tuple:
    """Keep the original at ``backup``: ("link", None) or ("copy", sha256 of the bytes).

    A hard link costs nothing, whatever the size (a copy of a CUDA library of hundreds of
    MB is paid in full), and it is safe because the fix renames a new inode over the path:
    the old inode is then reachable only through the journal.  Only a file with no other
    names is linked, since a write through another name would change the backup; across
    filesystems, or where protected_hardlinks refuses, the bytes are copied (hashed while
    copied).
    """
    if st.st_nlink == 1:
        try:
            os.link(path, backup, follow_symlinks=False)
        except OSError:
            pass
        else:
            if os.stat(backup).st_ino == st.st_ino:
                return "link", None
            os.unlink(backup)  # the path was replaced between stat and link: copy what is there
    digest = hashlib.sha256()
    src = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        def fill(fd):
            for block in iter(lambda: os.read(src, 1 << 20), b""):
                digest.update(block)
                _write_all(fd, block)
        atomic.write_temp(fill, backup, mode=0o600)
    finally:
        os.close(src)
    return "copy", digest.hexdigest()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class _Hasher(threading.Thread):
    """sha256 of a file in a thread (hashlib releases the GIL on large updates)."""

    def __init__(self, path: str):
        super().__init__(daemon=True)
        self.path, self.digest, self.error = path, None, None
        self.start()

    def run(self) -> None:
        try:
            self.digest = sha256_file(self.path)
        except OSError as exc:
            self.error = exc

    def join(self, timeout=None) -> str:
        super().join(timeout)
        if self.error is not None:
            raise self.error
        return self.digest

    def join_quietly(self) -> None:
        super().join()


def _put_back(path: str, backup: str, record: dict, entry_id: str) -> None:
    """Rename the verified backup over ``path`` (a copy when it lies on another filesystem).

    The bytes renamed into place are the ones hashed: the backup is checked against the
    sha256 recorded before the fix, then that same inode is renamed (or copied into a temp
    while hashed, and the temp renamed).  Any mismatch: the temp is removed, nothing written.
    """
    want = record["sha256_before"]
    got = _sha_or_none(backup)
    if got is None:
        raise RestoreRefused(f"{path}: backup {backup} is missing; nothing restored")
    if got != want:  # NOT_REGULAR included: a planted symlink is never renamed into place
        raise RestoreRefused(f"{path}: backup {backup} is damaged (sha256 {got[:12]}, recorded "
                             f"{str(want)[:12]}); nothing restored")
    owner = (record["uid"], record["gid"])
    mode = record["mode"] if record["mode"] is not None else 0o644
    try:
        if os.geteuid() == 0 or owner[0] == os.geteuid():
            try:
                os.chown(backup, *owner, follow_symlinks=False)
            except (PermissionError, TypeError):
                pass
        os.chmod(backup, stat.S_IMODE(mode))
        os.rename(backup, path)
    except OSError as exc:
        if exc.errno != 18:  # EXDEV: the journal is on another filesystem
            raise
        temp = atomic.temp_path_for(path, "undo-" + entry_id)
        digest = hashlib.sha256()
        with open(backup, "rb") as src:
            def fill(fd):
                for block in iter(lambda: src.read(1 << 20), b""):
                    digest.update(block)
                    _write_all(fd, block)
            atomic.write_temp(fill, temp, mode=mode, owner=owner)
        if digest.hexdigest() != want:
            _unlink(temp)
            raise RestoreRefused(f"{path}: backup {backup} changed while being restored; nothing restored")
        atomic.replace(temp, path)
        return
    atomic.fsync_dir(os.path.dirname(path))


def _manifest_problem(entry_id: str, manifest) -> str:
    """'' when ``manifest`` describes a journal entry; else what is wrong, for one line."""
    if not isinstance(manifest, dict):
        return f"is not an object (a JSON {type(manifest).__name__})"
    if manifest.get("id") != entry_id:
        return f"names another entry ({str(manifest.get('id'))[:40]!r})"
    if manifest.get("status") not in STATUSES:
        return f"has an unknown status {str(manifest.get('status'))[:20]!r}"
    files = manifest.get("files")
    if not isinstance(files, list):
        return f"has no list of files (files: {json.dumps(files)[:20]})"
    for n, record in enumerate(files):
        if not isinstance(record, dict):
            return f"file record {n} is not an object"
        path = record.get("path")
        if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
            return f"file record {n} has no absolute path"
        if record.get("action") not in ACTIONS:
            return f"file record {n} has an unknown action"
        if not isinstance(record.get("backup"), str) or not _BACKUP.fullmatch(record["backup"]):
            return f"file record {n} has a bad backup name"
        if not isinstance(record.get("state"), str):
            return f"file record {n} has no state"
        for key in ("sha256_before", "sha256_after"):
            value = record.get(key)
            if value is not None and not (isinstance(value, str) and _SHA.fullmatch(value)):
                return f"file record {n} has a bad {key}"
        for key, top in (("mode", 0o7777), ("uid", 2**32 - 1), ("gid", 2**32 - 1)):
            value = record.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or not 0 <= value <= top):
                return f"file record {n} has a bad {key}"
        temp = record.get("temp")
        if temp is not None and not (isinstance(temp, str) and os.path.dirname(temp) == os.path.dirname(path)
                                     and atomic.TEMP_TAG in os.path.basename(temp)):
            return f"file record {n} has a bad temp name"
        if record["action"] == "modify" and record["state"] in _MAYBE_WRITTEN and not (
                record.get("sha256_before") and record.get("sha256_after")):
            return f"file record {n} lacks its sha256"
    return ""


def _undo_problem(entry: Entry, record: dict) -> str:
    path = record["path"]
    if record["action"] in ("modify", "create"):
        current = _sha_or_none(path)
        allowed = {record["sha256_after"], record["sha256_before"]}
        if record["action"] == "create":
            allowed.add(None)
        if current not in allowed:
            return (f"{path} changed since fix {entry.id} (sha256 {str(current)[:12]}, "
                    f"expected {str(record['sha256_after'])[:12]}); nothing restored")
        if record["action"] == "modify" and current != record["sha256_before"]:
            backup = entry._backup_path(record)
            got = _sha_or_none(backup)
            if got is None:
                return f"{path}: backup {backup} is missing; nothing restored"
            if got != record["sha256_before"]:
                return (f"{path}: backup {backup} is damaged (sha256 {got[:12]}, recorded "
                        f"{str(record['sha256_before'])[:12]}); nothing restored")
    elif record["action"] == "move":
        backup = entry._backup_path(record)
        if os.path.lexists(path) and os.path.lexists(backup):
            return f"{path} exists again since fix {entry.id}; move it away first; nothing restored"
        if not os.path.lexists(path) and not os.path.lexists(backup):
            return f"{path}: its copy {backup} is missing from the journal; nothing restored"
    return ""


def _move(src: str, dest: str) -> None:
    """rename(2) when possible; across filesystems copy to a partial name, rename, then delete."""
    try:
        os.rename(src, dest)
    except OSError as exc:
        if exc.errno != 18:  # EXDEV
            raise
        import shutil  # across filesystems only: its imports are not paid on every fix's start

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


def _try_lock(path: str) -> int | None:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


NOT_REGULAR = "not-a-regular-file"  # never equal to a sha256: a dir, FIFO or symlink is "changed"


def _sha_or_none(path: str) -> str | None:
    """sha256 of the regular file at ``path``; None when nothing is there.  Anything else (a
    directory, FIFO, device or symlink) is never opened: reading a FIFO would hang."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return NOT_REGULAR
    try:
        return sha256_file(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
