"""Real SQLite: exactly-once ends, restart survival, corrupt databases moved aside."""
import os
import sqlite3

from seedance.model.report import Finding
from seedance.service.state import StateStore


def leak(pid=42, bytes_=4096):
    return Finding(rule="handle-leak", severity="warning", trap="handle-leak", layer="L4",
                   subject={"pid": pid, "path": "/bin/app"}, message=f"pid {pid} leaked {bytes_} bytes",
                   evidence={"bytes": bytes_, "device": 0})


def test_instance_end_is_recorded_exactly_once(tmp_path):
    store = StateStore.open(tmp_path)
    store.instance_seen(42, 1000, 3, "/bin/app")
    assert store.instance_ended(42, 1000, 3, "/bin/app", 4096, [leak()]) is True
    assert store.instance_ended(42, 1000, 3, "/bin/app", 4096, [leak()]) is False
    # the same pid with another start time is another instance (pid reuse)
    assert store.instance_ended(42, 2000, 3, "/bin/app", 0, []) is True
    counts = store.counts()
    assert counts["leaked"] == 1 and counts["exited"] == 1 and counts["leaked_bytes"] == 4096
    assert counts["ended_unreclaimed"] == 2
    store.instance_reclaimed(42, 1000)
    assert store.counts()["ended_unreclaimed"] == 1
    assert [f["rule"] for f in store.findings()] == ["handle-leak"]
    store.close()


def test_state_survives_an_unclean_close(tmp_path):
    store = StateStore.open(tmp_path)
    store.instance_ended(7, 70, 1, "/bin/x", 100, [leak(7, 100)])
    # no close(): like a kill -9, only the WAL holds the transaction
    store2 = StateStore.open(tmp_path)
    assert store2.instance_ended(7, 70, 1, "/bin/x", 100, [leak(7, 100)]) is False
    assert [l.pid for l in store2.leaks()] == [7]
    assert store2.findings()[0]["evidence"] == {"bytes": 100, "device": 0}
    store2.close()


def test_replace_findings_deactivates_old_ones(tmp_path):
    store = StateStore.open(tmp_path)
    a, b = leak(1), leak(2)
    store.replace_findings("scan", [a, b])
    store.replace_findings("scan", [b])
    assert [f["subject"]["pid"] for f in store.findings()] == [2]
    assert len(store.findings(active_only=False)) == 2
    assert store.add_findings("probes", [a]) == []  # same key as an existing finding
    c = leak(3)
    assert store.add_findings("probes", [a, c]) == [c]
    store.close()


def test_corrupt_database_is_moved_aside_not_dropped(tmp_path):
    db = tmp_path / "agent.db"
    db.write_bytes(b"this is not an sqlite database, but somebody's data" * 100)
    before = db.read_bytes()
    store = StateStore.open(tmp_path)
    assert store.moved_aside is not None and store.moved_aside.exists()
    assert store.moved_aside.read_bytes() == before
    assert "not a database" in (store.moved_aside.with_name(store.moved_aside.name + ".why")).read_text()
    assert store.instance_ended(1, 1, 0, "x", 0, []) is True  # the fresh database works
    store.close()


def test_damaged_pages_are_detected(tmp_path):
    store = StateStore.open(tmp_path)
    for pid in range(300):
        store.instance_ended(pid, pid, 0, "/bin/app-" + "x" * 200, 10, [])
    store.close()
    db = tmp_path / "agent.db"
    data = bytearray(db.read_bytes())
    assert len(data) > 8192
    page = 4096  # the default page size: scribble over every page after the first (the header)
    for offset in range(page, len(data)):
        data[offset] = 0xA5
    db.write_bytes(bytes(data))
    store = StateStore.open(tmp_path)
    assert store.moved_aside is not None
    store.close()


def test_database_is_private_and_in_wal_mode(tmp_path):
    store = StateStore.open(tmp_path)
    store.close()
    assert oct(os.stat(tmp_path / "agent.db").st_mode & 0o777) == "0o600"
    conn = sqlite3.connect(tmp_path / "agent.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
