"""The store: XDG location, atomic commit, the lock, leftovers swept."""
from __future__ import annotations

import fcntl
import os

import pytest

from seedance.model.errors import BadInput
from seedance.plugins import store as st

MANIFEST = "name: tiny\nversion: {v}\nseedance_version: '>=0.1,<1'\nentry:\n  module: tiny\n"


def test_root_honours_xdg_data_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert st.default_root() == tmp_path / "seedance" / "plugins"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert st.default_root() == tmp_path / "home" / ".local" / "share" / "seedance" / "plugins"


def _staged(store, version):
    staged = store.stage()
    (staged / "manifest.yaml").write_text(MANIFEST.format(v=version))
    return staged


def test_commit_and_replace(tmp_path):
    store = st.Store(tmp_path / "plugins")
    with store.locked():
        final = store.commit(_staged(store, "1.0.0"), "tiny", "1.0.0")
        assert final == store.root / "tiny" / "1.0.0"
        with pytest.raises(BadInput, match="already installed"):
            store.commit(_staged(store, "1.0.0"), "tiny", "1.0.0")
        staged = _staged(store, "1.0.0")
        (staged / "new.txt").write_text("new")
        store.commit(staged, "tiny", "1.0.0", replace=True)
    assert (final / "new.txt").read_text() == "new"
    assert [p.version for p in store.installed("tiny")] == ["1.0.0"]
    # the refused commit left its staging dir behind (as a crash would); the next lock sweeps it
    assert [p for p in store.root.iterdir() if p.name.startswith(".staging")]
    with store.locked():
        pass
    assert not [p.name for p in store.root.iterdir() if p.name.startswith((".staging", ".trash"))]


def test_versions_sorted_and_remove(tmp_path):
    store = st.Store(tmp_path / "plugins")
    with store.locked():
        for version in ("1.10.0", "1.9.0", "1.0.0"):
            store.commit(_staged(store, version), "tiny", version)
    assert [p.version for p in store.installed("tiny")] == ["1.0.0", "1.9.0", "1.10.0"]
    assert store.newest("tiny").version == "1.10.0"
    with store.locked():
        removed = store.remove("tiny", "1.9.0")
    assert [p.version for p in removed] == ["1.9.0"]
    with store.locked():
        store.remove("tiny")
    assert not (store.root / "tiny").exists()
    with pytest.raises(BadInput, match="not installed"):
        store.get("tiny")


def test_lock_is_exclusive_across_open_files(tmp_path):
    store = st.Store(tmp_path / "plugins")
    with store.locked():
        fd = os.open(store.root / st.LOCK_NAME, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    fd = os.open(store.root / st.LOCK_NAME, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released after the with-block
    finally:
        os.close(fd)


def test_unreadable_entries_are_skipped(tmp_path):
    store = st.Store(tmp_path / "plugins")
    (store.root / "junk" / "1.0").mkdir(parents=True)
    (store.root / "junk" / "1.0" / "manifest.yaml").write_text("name: [\n")
    assert store.installed() == []
