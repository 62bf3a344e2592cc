"""The agent's memory: findings and instance history in SQLite (WAL), surviving restarts.

Why SQLite in WAL mode: one file, crash-safe transactions, and readers (the status socket)
never block the writer (the GC loop).  synchronous=FULL because a leak is reported exactly
once: the row that says "reported" must be on disk before the registry slot is reclaimed,
or a kill -9 between the two would either lose the leak or report it twice.

A database that SQLite cannot read is moved aside (never deleted) and a fresh one is
started; the caller logs the path so the operator can inspect or restore it.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..model.report import Finding

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS instances (
    pid INTEGER NOT NULL,
    start_time INTEGER NOT NULL,
    slot INTEGER,
    command TEXT NOT NULL DEFAULT '',
    first_seen REAL NOT NULL,
    ended REAL,
    outcome TEXT NOT NULL DEFAULT 'running',  -- running | exited | leaked
    leaked_bytes INTEGER NOT NULL DEFAULT 0,
    reclaimed REAL,
    PRIMARY KEY (pid, start_time)
);
CREATE TABLE IF NOT EXISTS findings (
    key TEXT PRIMARY KEY,
    rule TEXT NOT NULL,
    severity TEXT NOT NULL,
    trap TEXT NOT NULL,
    layer TEXT NOT NULL,
    subject TEXT NOT NULL,
    message TEXT NOT NULL,
    evidence TEXT NOT NULL,
    fix TEXT NOT NULL,
    title TEXT NOT NULL DEFAULT '',
    origin TEXT NOT NULL,               -- gc | scan | probes | nvml
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    seen INTEGER NOT NULL DEFAULT 1,
    active INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS findings_origin ON findings (origin, active);
CREATE TABLE IF NOT EXISTS reports (name TEXT PRIMARY KEY, at REAL NOT NULL, body TEXT NOT NULL);
"""


@dataclass(frozen=True)
class LeakRecord:
    pid: int
    start_time: int
    slot: int | None
    command: str
    bytes: int
    ended: float


class StateStore:
    """One connection shared by the loop and the status thread, serialised by a lock."""

    def __init__(self, path: Path, conn: sqlite3.Connection, moved_aside: Path | None = None):
        self.path = path
        self.moved_aside = moved_aside
        self._conn = conn
        self._lock = threading.Lock()

    # -- opening -----------------------------------------------------------------------
    @classmethod
    def open(cls, directory: Path) -> "StateStore":
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = directory / "agent.db"
        try:
            return cls(path, _connect(path))
        except sqlite3.DatabaseError as exc:
            aside = _move_aside(path, str(exc))
            return cls(path, _connect(path), moved_aside=aside)

    def close(self) -> None:
        with self._lock:
            try:
                # Fold the WAL into the main file so a clean stop leaves one self-contained db.
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.DatabaseError:
                pass
            self._conn.close()

    def flush(self) -> None:
        with self._lock:
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")

    # -- instances ---------------------------------------------------------------------
    def instance_seen(self, pid: int, start_time: int, slot: int | None, command: str) -> None:
        with self._lock, self._conn:
            self._conn.execute(
                "INSERT OR IGNORE INTO instances (pid, start_time, slot, command, first_seen) "
                "VALUES (?, ?, ?, ?, ?)", (pid, start_time, slot, command, time.time()))

    def instance_ended(self, pid: int, start_time: int, slot: int | None, command: str,
                       leaked_bytes: int, findings: list[Finding] = ()) -> bool:
        """Record an instance's end and its leak finding in one transaction.

        Returns True when this call recorded the end for the first time: the caller reports
        the leak only then, which is what makes the report exactly-once across restarts.
        """
        now = time.time()
        with self._lock, self._conn:
            row = self._conn.execute("SELECT ended FROM instances WHERE pid=? AND start_time=?",
                                     (pid, start_time)).fetchone()
            if row is not None and row[0] is not None:
                return False
            outcome = "leaked" if leaked_bytes > 0 else "exited"
            self._conn.execute(
                "INSERT INTO instances (pid, start_time, slot, command, first_seen, ended, outcome, leaked_bytes) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (pid, start_time) DO UPDATE SET "
                "ended=excluded.ended, outcome=excluded.outcome, leaked_bytes=excluded.leaked_bytes, "
                "slot=coalesce(instances.slot, excluded.slot), "
                "command=CASE WHEN instances.command='' THEN excluded.command ELSE instances.command END",
                (pid, start_time, slot, command, now, now, outcome, leaked_bytes))
            for finding in findings:
                self._upsert_finding(finding, "gc", now)
            return True

    def instance_reclaimed(self, pid: int, start_time: int) -> None:
        with self._lock, self._conn:
            self._conn.execute("UPDATE instances SET reclaimed=? WHERE pid=? AND start_time=?",
                               (time.time(), pid, start_time))

    def has_pid(self, pid: int) -> bool:
        with self._lock:
            return self._conn.execute("SELECT 1 FROM instances WHERE pid=? LIMIT 1", (pid,)).fetchone() is not None

    def leaks(self, limit: int = 50) -> list[LeakRecord]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT pid, start_time, slot, command, leaked_bytes, ended FROM instances "
                "WHERE outcome='leaked' ORDER BY ended DESC LIMIT ?", (limit,)).fetchall()
        return [LeakRecord(*row) for row in rows]

    def counts(self) -> dict:
        with self._lock:
            rows = self._conn.execute(
                "SELECT outcome, count(*), coalesce(sum(leaked_bytes), 0) FROM instances GROUP BY outcome").fetchall()
            unreclaimed = self._conn.execute(
                "SELECT count(*) FROM instances WHERE ended IS NOT NULL AND reclaimed IS NULL").fetchone()[0]
        out = {"running": 0, "exited": 0, "leaked": 0, "leaked_bytes": 0, "ended_unreclaimed": unreclaimed}
        for outcome, count, leaked in rows:
            out[outcome] = count
            if outcome == "leaked":
                out["leaked_bytes"] = leaked
        return out

    # -- findings ----------------------------------------------------------------------
    def replace_findings(self, origin: str, findings: list[Finding]) -> None:
        """The latest pass of one origin (scan, nvml) replaces what that origin said before."""
        now = time.time()
        with self._lock, self._conn:
            self._conn.execute("UPDATE findings SET active=0 WHERE origin=?", (origin,))
            for finding in findings:
                self._upsert_finding(finding, origin, now)

    def add_findings(self, origin: str, findings: list[Finding]) -> list[Finding]:
        """Record findings that accumulate (probes); returns the ones not seen before."""
        now = time.time()
        new = []
        with self._lock, self._conn:
            for finding in findings:
                if self._upsert_finding(finding, origin, now):
                    new.append(finding)
        return new

    def _upsert_finding(self, finding: Finding, origin: str, now: float) -> int:
        key = finding_key(finding)
        cursor = self._conn.execute(
            "INSERT OR IGNORE INTO findings (key, rule, severity, trap, layer, subject, message, evidence, "
            "fix, title, origin, first_seen, last_seen) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (key, finding.rule, finding.severity, finding.trap, finding.layer,
             json.dumps(_plain(finding.subject), sort_keys=True), finding.message,
             json.dumps(_plain(finding.evidence), sort_keys=True), finding.fix, finding.title,
             origin, now, now))
        if cursor.rowcount:
            return 1
        self._conn.execute("UPDATE findings SET last_seen=?, seen=seen+1, active=1 WHERE key=?", (now, key))
        return 0

    def findings(self, active_only: bool = True, limit: int = 200) -> list[dict]:
        where = "WHERE active=1" if active_only else ""
        with self._lock:
            rows = self._conn.execute(
                f"SELECT rule, severity, trap, layer, subject, message, evidence, fix, origin, first_seen, "
                f"last_seen, seen FROM findings {where} ORDER BY last_seen DESC LIMIT ?", (limit,)).fetchall()
        return [{"rule": r[0], "severity": r[1], "trap": r[2], "layer": r[3], "subject": json.loads(r[4]),
                 "message": r[5], "evidence": json.loads(r[6]), "fix": r[7], "origin": r[8],
                 "first_seen": r[9], "last_seen": r[10], "seen": r[11]} for r in rows]

    def finding_counts(self) -> list[tuple[str, str, int]]:
        with self._lock:
            return self._conn.execute(
                "SELECT rule, severity, count(*) FROM findings WHERE active=1 GROUP BY rule, severity").fetchall()

    # -- reports -----------------------------------------------------------------------
    def save_report(self, name: str, report: dict) -> None:
        with self._lock, self._conn:
            self._conn.execute("INSERT OR REPLACE INTO reports (name, at, body) VALUES (?, ?, ?)",
                               (name, time.time(), json.dumps(report)))

    def report(self, name: str) -> tuple[float, dict] | None:
        with self._lock:
            row = self._conn.execute("SELECT at, body FROM reports WHERE name=?", (name,)).fetchone()
        return (row[0], json.loads(row[1])) if row else None


def finding_key(finding: Finding) -> str:
    rule, subject, message = finding.key()
    return json.dumps([rule, [list(pair) for pair in subject], message])


def _connect(path: Path) -> sqlite3.Connection:
    fresh = not path.exists()
    conn = sqlite3.connect(str(path), timeout=10, check_same_thread=False, isolation_level=None)
    try:
        if fresh:
            os.chmod(path, 0o600)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        # quick_check reads every page: a truncated or scribbled file fails here, at start,
        # not in the middle of a GC pass.
        verdict = conn.execute("PRAGMA quick_check").fetchone()[0]
        if verdict != "ok":
            raise sqlite3.DatabaseError(f"integrity check failed: {verdict}")
        conn.executescript(_SCHEMA)
        conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        version = int(conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"schema {version} is newer than this seedance ({SCHEMA_VERSION})")
    except BaseException:
        conn.close()
        raise
    conn.isolation_level = "DEFERRED"
    return conn


def _move_aside(path: Path, why: str) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    counter = 1
    while aside.exists():
        aside = path.with_name(f"{path.name}.corrupt-{stamp}.{counter}")
        counter += 1
    os.replace(path, aside)
    for suffix in ("-wal", "-shm"):
        companion = path.with_name(path.name + suffix)
        if companion.exists():
            os.replace(companion, aside.with_name(aside.name + suffix))
    (aside.with_name(aside.name + ".why")).write_text(why + "\n")
    return aside


def _plain(value):
    from ..model.report import _plain as plain
    return plain(value)
