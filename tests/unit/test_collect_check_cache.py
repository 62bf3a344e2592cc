"""The check cache (collect/check_cache.py, collect/inputs.py): a repeat check of files that
did not change answers from the last report, and any change to what the check read makes
it check again.  The oracle is always a fresh, uncached check of the same tree."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seedance.collect import check_cache, inputs
from seedance.collect.options import CheckOptions
from seedance.collect.scan import Scanner

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")

DEP_V1 = "int dep_value(void) { return 1; }\n"
DEP_V2 = "int dep_value(void) { return 2; }\nint dep_extra(void) { return 3; }\n"
TOP = "int dep_value(void); int dep_extra(void); int top(void) { return dep_value() + dep_extra(); }\n"


def _cc(src: Path, out: Path, *args) -> None:
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(src), *args], check=True, capture_output=True)


def _build_dep(tmp: Path, source: str, name: str = "libdep.so.1") -> Path:
    """libdep.so.1 built aside and renamed in: a new inode, whatever the timestamp tick."""
    src = tmp / f"dep{time.monotonic_ns()}.c"
    src.write_text(source)
    built = tmp / f"built{time.monotonic_ns()}.so"
    _cc(src, built, f"-Wl,-soname,{name}")
    return built


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """tree/lib/libtop.so NEEDs libdep.so.1 through DT_RUNPATH $ORIGIN/first:$ORIGIN/second;
    libdep.so.1 lies in second/.  The cache lives in the test's own XDG_CACHE_HOME, and the
    racy window is 0 for the tests that change files by renaming new inodes in."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("SEEDANCE_CACHE", raising=False)
    monkeypatch.setattr(check_cache, "RACY_S", 0.0)
    root = tmp_path / "tree"
    (root / "lib" / "first").mkdir(parents=True)
    (root / "lib" / "second").mkdir()
    os.replace(_build_dep(tmp_path, DEP_V2), root / "lib" / "second" / "libdep.so.1")
    src = tmp_path / "top.c"
    src.write_text(TOP)
    _cc(src, root / "lib" / "libtop.so", "-Wl,-soname,libtop.so", "-Wl,--enable-new-dtags",
        "-Wl,-rpath,$ORIGIN/first:$ORIGIN/second", f"-L{root / 'lib' / 'second'}", "-l:libdep.so.1")
    return root


def _plain(report) -> dict:
    out = report.to_dict()
    out["stats"] = {k: v for k, v in out["stats"].items() if k not in ("duration_s", "cache")}
    return out


def _check(root, **options):
    return check_cache.run_cached(CheckOptions(targets=[str(root)], **options))


def _fresh(root, **options):
    return Scanner(CheckOptions(targets=[str(root)], **options)).run()


def test_a_repeat_check_answers_from_the_cache_with_the_same_report(tree):
    first = _check(tree)
    assert first.stats["cache"]["state"] == "stored" and first.stats["cache"]["inputs"] > 0
    second = _check(tree)
    assert second.stats["cache"]["state"] == "hit"
    assert _plain(second) == _plain(first) == _plain(_fresh(tree))
    from seedance.render import text as render
    table, again = render.table(first, color=False, verbose=True), render.table(second, color=False, verbose=True)
    # the summary line differs: this run's time, and that the answer came from the cache
    assert again.splitlines()[:-1] == table.splitlines()[:-1]
    assert "from the check cache" in again.splitlines()[-1] and "check cache" not in table


def _replace_dep_with_v1(tmp, tree):
    os.replace(_build_dep(tmp, DEP_V1), tree / "lib" / "second" / "libdep.so.1")


def _remove_dep(tmp, tree):
    os.unlink(tree / "lib" / "second" / "libdep.so.1")


def _shadow_dep_earlier(tmp, tree):
    os.replace(_build_dep(tmp, DEP_V1), tree / "lib" / "first" / "libdep.so.1")


def _dep_becomes_a_dangling_link(tmp, tree):
    link = tree / "lib" / "second" / "libdep.so.1.tmp"
    os.symlink("nowhere.so", link)
    os.replace(link, tree / "lib" / "second" / "libdep.so.1")


@pytest.mark.parametrize("change", [_replace_dep_with_v1, _remove_dep, _shadow_dep_earlier,
                                    _dep_becomes_a_dangling_link])
def test_a_changed_input_is_checked_again(tree, tmp_path, change):
    """--strict: a library without dep_extra is then a finding (symbol-undefined)."""
    before = _check(tree, strict=True)
    assert _check(tree, strict=True).stats["cache"]["state"] == "hit"
    change(tmp_path, tree)
    after = _check(tree, strict=True)
    assert after.stats["cache"]["state"] != "hit"
    fresh = _fresh(tree, strict=True)
    assert _plain(after) == _plain(fresh)
    # the change changes the verdict: a stale answer would have been wrong
    assert [f.rule for f in fresh.findings] != [f.rule for f in before.findings] or \
        _plain(fresh) != _plain(before)
    assert _check(tree, strict=True).stats["cache"]["state"] == "hit"  # the new answer is cached in turn


def test_the_command_line_and_environment_are_in_the_key(tree, monkeypatch):
    _check(tree)
    assert _check(tree, arch="sm_90").stats["cache"]["state"] == "stored"
    assert _check(tree, strict=True).stats["cache"]["state"] == "stored"
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tree / "lib" / "first"))
    assert _check(tree).stats["cache"]["state"] == "stored"
    assert _check(tree).stats["cache"]["state"] == "hit"
    monkeypatch.delenv("LD_LIBRARY_PATH")
    for options in ({}, {"arch": "sm_90"}, {"strict": True}):
        assert _check(tree, **options).stats["cache"]["state"] == "hit"


def test_inputs_changed_just_before_the_check_are_not_cached(tree, monkeypatch):
    monkeypatch.setattr(check_cache, "RACY_S", 2.0)
    os.utime(tree / "lib" / "libtop.so")  # ctime and mtime now: within a timestamp tick of the check
    report = _check(tree)
    assert report.stats["cache"]["state"].startswith("not stored: an input changed")
    assert _check(tree).stats["cache"]["state"] != "hit"


def _entry(tree) -> Path:
    entries = list(Path(check_cache.cache_dir()).glob("check-*.json"))
    assert len(entries) == 1
    return entries[0]


@pytest.mark.parametrize("spoil", ["world-writable", "truncated", "not-json", "fewer-records", "symlink"])
def test_a_cache_entry_that_is_not_trusted_is_not_used(tree, tmp_path, spoil):
    _check(tree)
    entry = _entry(tree)
    data = entry.read_bytes()
    if spoil == "world-writable":
        os.chmod(entry, 0o666)
    elif spoil == "truncated":
        entry.write_bytes(data[:-10])
    elif spoil == "not-json":
        entry.write_bytes(b"[" + data[1:])
    elif spoil == "fewer-records":
        # a blob cut at a record boundary, its length and CRC fixed up: the count says no
        import zlib

        line, _, blob = data.partition(b"\n")
        header = json.loads(line)
        cut = blob[:len(inputs.encode(dict(list(_records_of(blob).items())[:1])))]
        header["blob"] = [len(cut), zlib.crc32(cut)]
        entry.write_bytes(json.dumps(header).encode() + b"\n" + cut)
    else:
        moved = tmp_path / "elsewhere.json"
        os.replace(entry, moved)
        os.symlink(moved, entry)
    report = _check(tree)
    assert report.stats["cache"]["state"] != "hit"
    assert _plain(report) == _plain(_fresh(tree))


def _records_of(blob: bytes) -> dict:
    import struct

    header = struct.Struct(inputs._RECORD)
    out, at = {}, 0
    while at < len(blob):
        path_len, follow, err, _pad, *was = header.unpack_from(blob, at)
        path = os.fsdecode(blob[at + header.size:at + header.size + path_len])
        out[(path, bool(follow))] = err if err else tuple(was)
        at += header.size + path_len
    return out


def test_the_c_validator_agrees_with_the_python_one(tmp_path):
    from seedance.elf import fastread

    if not fastread.available():
        pytest.skip("the C extension is not built")
    files = []
    for index in range(5):
        path = tmp_path / f"f{index}"
        path.write_bytes(b"x" * index)
        files.append(path)
    inputs.start()
    try:
        for path in files:
            inputs.stat(path)
        inputs.lstat(tmp_path)
        inputs.exists(tmp_path / "missing")
        with open(files[0], "rb"):
            pass
    finally:
        records = inputs.stop()
    assert (str(tmp_path / "missing"), True) in records and (str(tmp_path), False) in records
    blob = inputs.encode(records)
    count = len(records)

    def both(data, n=count):
        c, py = inputs.changed(data, n, use_c=True), inputs.changed_python(data, n)
        assert c == py
        return c

    assert both(blob) is None
    assert both(blob, count + 1) == "malformed inputs: fewer records than stored"
    assert both(blob[:-1]) == "malformed inputs"
    assert both(blob[:7]) == "malformed inputs"
    files[3].write_bytes(b"longer than before")
    assert both(blob) == f"{files[3]}: changed"
    files[3].write_bytes(b"xxx")
    os.utime(files[3], ns=(records[(str(files[3]), True)][4],) * 2)  # mtime back: ctime still tells
    assert both(blob) == f"{files[3]}: changed"
    fresh = inputs.encode({key: value for key, value in records.items() if key[0] != str(files[3])})
    assert both(fresh, count - 1) is None
    (tmp_path / "missing").write_text("now here")  # (the directory changes with it: first in order)
    assert both(fresh, count - 1) in (f"{tmp_path}: changed", f"{tmp_path / 'missing'}: changed")
    zero = bytearray(blob)
    zero[0:4] = (0).to_bytes(4, sys.byteorder)
    assert both(bytes(zero)) == "malformed inputs"


def test_what_a_helper_reads_is_recorded_too(tmp_path, monkeypatch):
    """A walk with 128+ subtrees two levels down is shared with a forked helper
    (helper.share); the files the helper sniffed are inputs of the check all the same."""
    from seedance.collect import helper

    if not helper.available():
        pytest.skip("one usable core: no helper is forked")
    root = tmp_path / "wide"
    for index in range(140):
        sub = root / f"p{index:03d}" / "s"
        sub.mkdir(parents=True)
        for number in range(20):  # (enough work that the helper takes pieces before the check has them all)
            (sub / f"data{number}.bin").write_bytes(b"not an elf, but read to know it")
    seen = {}
    for jobs in ("1", ""):
        monkeypatch.setenv("SEEDANCE_JOBS", jobs)
        inputs.start()
        try:
            Scanner(CheckOptions(targets=[str(root)])).run()
        finally:
            records = inputs.stop()
        seen[jobs] = {path for path, _follow in records if path.startswith(str(root))}
    sniffed = {str(p) for p in root.rglob("data*.bin")}
    assert sniffed <= seen["1"]
    assert seen[""] == seen["1"]


def test_command_line_says_hit_and_no_cache_turns_it_off(tree, tmp_path):
    from tests.conftest import run_cli

    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    time.sleep(check_cache.RACY_S + 0.1 if check_cache.RACY_S else 2.1)  # the tree ages past the racy window
    states = []
    for extra in ([], [], ["--no-cache"]):
        proc = run_cli("check", *extra, "--json", tree, env=env)
        assert proc.returncode in (0, 1), proc.stderr
        states.append(json.loads(proc.stdout)["stats"].get("cache", {}).get("state"))
    assert states == ["stored", "hit", None]
    proc = run_cli("check", tree, env=env)  # the table says where the answer came from
    assert "from the check cache" in proc.stdout.splitlines()[-1]
    proc = run_cli("check", "--no-cache", tree, env=env)
    assert "check cache" not in proc.stdout
    proc = run_cli("check", "--json", tree, env={**env, "SEEDANCE_CACHE": "0"})
    assert "cache" not in json.loads(proc.stdout)["stats"]


def test_a_check_that_runs_a_program_is_not_cached(tree, tmp_path):
    """--python asks that interpreter where its torch is: what it read is not recorded."""
    report = _check(tree, python=sys.executable)
    assert report.stats["cache"]["state"] == "not stored: the check ran something whose reads are not recorded " \
                                             "(subprocess.Popen)"
    assert _check(tree, python=sys.executable).stats["cache"]["state"] != "hit"


def test_the_c_validator_splits_big_records_and_still_names_the_first_change(tmp_path):
    """Above 1024 records the C validator stats the second half on a second thread
    (inputcheck.c): the first change in record order is still the one named."""
    from seedance.elf import fastread

    if not fastread.available():
        pytest.skip("the C extension is not built")
    files = [tmp_path / f"f{index:04d}" for index in range(1500)]
    for path in files:
        path.write_bytes(b"x")
    inputs.start()
    try:
        for path in files:
            inputs.stat(path)
    finally:
        records = inputs.stop()
    blob = inputs.encode(records)
    assert inputs.changed(blob, 1500, use_c=True) is None
    files[1200].write_bytes(b"changed")
    assert inputs.changed(blob, 1500, use_c=True) == inputs.changed_python(blob, 1500) == f"{files[1200]}: changed"
    files[3].write_bytes(b"changed too")
    assert inputs.changed(blob, 1500, use_c=True) == inputs.changed_python(blob, 1500) == f"{files[3]}: changed"
    assert inputs.changed(blob[:-1], 1500, use_c=True) == inputs.changed_python(blob[:-1], 1500) == \
        "malformed inputs"


def test_the_agents_periodic_check_of_paths_is_answered_from_the_cache(tmp_path):
    """The agent's periodic check (service/daemon.run_periodic_check, run in a child of its
    own) of paths that did not change: from the cache, the same report."""
    target = str(Path(sys.executable).resolve().parent)  # the interpreter's bin: files long unchanged
    code = ("import json, sys; from seedance.service.daemon import run_periodic_check; "
            "print(json.dumps(run_periodic_check(None, [sys.argv[1]])))")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("SEEDANCE_CACHE", None)
    reports = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", code, target], capture_output=True, text=True, env=env,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr
        reports.append(json.loads(proc.stdout))
    assert [r["stats"]["cache"]["state"] for r in reports] == ["stored", "hit"]
    assert reports[0]["findings"] == reports[1]["findings"]


def _validators() -> tuple:
    from seedance.elf import fastread

    return (True, False) if fastread.available() else (False,)


VALIDATORS = _validators()


def test_a_directory_only_stat_ed_is_what_it_is_a_listed_one_is_what_it_holds(tmp_path):
    """inputs.realpath lstats every directory on the way (/tmp among them, whose times move
    with every file made in it): such a directory counts by dev, inode and mode; one the
    check listed counts whole (inputs.weak_identity)."""
    busy = tmp_path / "busy"
    busy.mkdir()
    inputs.start()
    try:
        inputs.realpath(busy / "x")
        inputs.isdir(busy)
    finally:
        records = inputs.stop()
    assert inputs.is_weak(records[(str(busy), True)]) and inputs.is_weak(records[(str(busy), False)])
    blob = inputs.encode(records)
    assert inputs.newest_change(records) == 0
    (busy / "new-file").write_text("made after the check")
    for use_c in VALIDATORS:
        assert inputs.changed(blob, len(records), use_c=use_c) is None
    os.rename(busy, tmp_path / "gone")
    (tmp_path / "busy").symlink_to("gone")  # now a link where a directory was: it is not what it was
    for use_c in VALIDATORS:
        assert inputs.changed(blob, len(records), use_c=use_c) is not None
    inputs.start()
    try:
        inputs.isdir(tmp_path / "gone")
        os.listdir(tmp_path / "gone")
    finally:
        records = inputs.stop()
    assert not inputs.is_weak(records[(str(tmp_path / "gone"), True)])
    blob = inputs.encode(records)
    (tmp_path / "gone" / "another").write_text("a new entry")
    for use_c in VALIDATORS:
        assert inputs.changed(blob, len(records), use_c=use_c) == f"{tmp_path / 'gone'}: changed"


def test_the_recorded_path_questions_answer_as_os_path_does(tmp_path):
    """inputs.realpath, walk, islink, samefile: os.path's and os.walk's answers, each path
    they looked at recorded (a link loop, '..' through a link, a relative path, a link to a
    directory that a walk does not enter)."""
    (tmp_path / "real" / "sub" / "deep").mkdir(parents=True)
    (tmp_path / "real" / "file").write_text("x")
    (tmp_path / "link").symlink_to("real")
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    (tmp_path / "real" / "sub" / "up").symlink_to("..")
    asked = [tmp_path / "link" / "file", tmp_path / "loop1" / "x", tmp_path / "link" / "sub" / "up" / "..",
             tmp_path / "missing" / "..", "relative/../x", b"/usr/../usr/lib"]
    inputs.start()
    try:
        for path in asked:
            assert inputs.realpath(path) == os.path.realpath(path), path
        walked = [(base, sorted(dirs), sorted(files)) for base, dirs, files in inputs.walk(str(tmp_path))]
        assert inputs.islink(tmp_path / "link") and not inputs.islink(tmp_path / "real")
        assert inputs.samefile(tmp_path / "link" / "file", tmp_path / "real" / "file")
    finally:
        records = inputs.stop()
    assert walked == [(base, sorted(dirs), sorted(files)) for base, dirs, files in os.walk(str(tmp_path))]
    for path in (tmp_path / "link", tmp_path / "loop1", tmp_path / "loop2", tmp_path / "real" / "sub" / "up",
                 tmp_path / "missing", tmp_path / "real" / "sub" / "deep"):
        assert (str(path), False) in records, path
    assert records[(str(tmp_path / "missing"), False)] == errno.ENOENT
    assert (os.path.join(os.getcwd(), "relative"), False) in records
    assert (str(tmp_path / "link" / "file"), True) in records


def test_a_stat_outside_the_recorders_questions_is_not_an_input(tmp_path):
    """The recorder sees what a check asks through it, not every os.stat of the process."""
    inputs.start()
    try:
        os.stat(tmp_path)
        assert not inputs.exists(tmp_path / "missing")
    finally:
        records = inputs.stop()
    assert list(records) == [(str(tmp_path / "missing"), True)]
