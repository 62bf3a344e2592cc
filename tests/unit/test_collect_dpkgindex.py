"""The dpkg lists' C index (agent/elf/dpkgindex.c) against the Python search it replaces
(practice._dpkg_by_name with SEEDANCE_DPKG=python), which the practice tests check against
dpkg-query itself: the same (package, path) lines for every name, on the host's database
and on a private one built to hold each odd case; the same inputs noted for the check
cache; and, in a forked child (where the thread that builds the index is not), the Python
search instead of a wait for ever."""
import os
import random
import signal

import pytest

from seedance.collect import inputs, practice
from seedance.elf import fastread

pytestmark = pytest.mark.skipif(not fastread.available(), reason="the C extension is not built")


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(practice, "_DPKG", {})
    monkeypatch.delenv("SEEDANCE_DPKG", raising=False)


def both(monkeypatch, names):
    """(C answers, Python answers) for ``names``, each from a fresh start."""
    practice._DPKG.clear()
    assert practice._dpkg_index() is not None
    c = [practice._dpkg_by_name(n) for n in names]
    assert practice._DPKG.get("lists") is None, "the C index did not answer"
    practice._DPKG.clear()
    monkeypatch.setenv("SEEDANCE_DPKG", "python")
    py = [practice._dpkg_by_name(n) for n in names]
    monkeypatch.delenv("SEEDANCE_DPKG")
    practice._DPKG.clear()
    return c, py


def host_names(limit=400):
    names = set()
    for entry in sorted(os.listdir(practice.DPKG_INFO)):
        if entry.endswith(".list"):
            with open(os.path.join(practice.DPKG_INFO, entry), "rb") as handle:
                for line in handle:
                    names.add(os.path.basename(line.rstrip(b"\n")).decode("utf-8", "replace"))
    names = sorted(n for n in names if "\ufffd" not in n)
    random.Random(13).shuffle(names)
    return names[:limit] + ["libc.so.6", "libz.so.1", "__init__.py", "no-such-file.so.9", ""]


def test_the_host_database_answers_the_same(monkeypatch):
    if not os.path.isdir(practice.DPKG_INFO):
        pytest.skip("no dpkg database here")
    names = host_names()
    c, py = both(monkeypatch, names)
    assert c == py
    assert sum(map(len, c)) > len(names) // 2  # (the names do occur in the lists)


def test_a_private_database_of_odd_lines_answers_the_same(tmp_path, monkeypatch):
    info = tmp_path / "info"
    info.mkdir()
    (info / "a.list").write_bytes(b"/.\n/usr\n/usr/lib/libx.so.1\n/usr/lib/dir/\n/usr/lib/libx.so.1\nnoslash\n"
                                  b"/usr/share/caf\xe9/libx.so.1\n/usr/lib/trailing \n/usr/lib/last-without-newline")
    (info / "b:amd64.list").write_bytes(b"/lib/libx.so.1\n/usr/lib/libx.so.1.2\n/x/libx.so.1\n")
    (info / "c.list").write_bytes(b"")
    (info / "not-a-list.md5sums").write_bytes(b"/usr/lib/libx.so.1\n")
    os.mkfifo(info / "d.list")  # no writer: reads as empty, never blocks
    monkeypatch.setattr(practice, "DPKG_INFO", str(info))
    names = ["libx.so.1", "libx.so.1.2", "", "dir", "noslash", "trailing ", "last-without-newline",
             "libx.so", "caf\xe9", "usr", "."]
    old = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the dpkg index blocked"))
    signal.alarm(20)
    try:
        c, py = both(monkeypatch, names)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert c == py
    assert c[0] == [("a", "/usr/lib/libx.so.1"), ("a", "/usr/lib/libx.so.1"),
                    ("a", "/usr/share/caf\ufffd/libx.so.1"), ("b", "/lib/libx.so.1"), ("b", "/x/libx.so.1")]


def test_a_list_name_that_is_not_ascii_leaves_the_search_to_python(tmp_path, monkeypatch):
    info = tmp_path / "info"
    info.mkdir()
    (info / "z.list").write_bytes(b"/usr/lib/liby.so.1\n")
    (info / "\u00e9.list").write_bytes(b"/usr/lib/liby.so.1\n")
    monkeypatch.setattr(practice, "DPKG_INFO", str(info))
    index = practice._dpkg_index()
    ffi, lib, handle = index
    assert lib.sd_dpkg_wait(handle) == lib.SD_DPKG_FALLBACK
    assert practice._dpkg_by_name("liby.so.1") == [("z", "/usr/lib/liby.so.1"), ("\u00e9", "/usr/lib/liby.so.1")]


def test_the_check_cache_notes_the_same_inputs(monkeypatch):
    if not os.path.isdir(practice.DPKG_INFO):
        pytest.skip("no dpkg database here")

    def noted(python):
        practice._DPKG.clear()
        if python:
            monkeypatch.setenv("SEEDANCE_DPKG", "python")
        inputs.start()
        try:
            assert practice._dpkg_by_name("libz.so.1")
        finally:
            records = inputs.stop()
            monkeypatch.delenv("SEEDANCE_DPKG", raising=False)
        return {path: value for (path, _follow), value in records.items()
                if path.startswith(practice.DPKG_INFO)}

    c, py = noted(False), noted(True)
    assert len(py) > 10 and c == py


def test_a_forked_child_searches_in_python(monkeypatch):
    if not os.path.isdir(practice.DPKG_INFO):
        pytest.skip("no dpkg database here")
    practice.prefetch_dpkg()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child's answer is its exit status)
        signal.alarm(30)
        ok = practice._dpkg_index() is None and practice._dpkg_by_name("libz.so.1") != []
        os._exit(0 if ok and practice._DPKG.get("lists") is not None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert practice._dpkg_by_name("libz.so.1") and practice._DPKG.get("lists") is None
