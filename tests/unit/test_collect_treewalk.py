"""The C walk (elf/treewalk.c, collect/treewalk.py) is the Python walk (Scanner._walk_list,
_walk_files): the same ELF files in the same order with the same stat, the same counts,
errors, configs and plain files, and the same inputs for the check cache, on one thread
and on two, on trees built to hit every case and on the host's own library trees."""
from __future__ import annotations

import json
import os
import shutil
import socket
import sysconfig

import pytest

from seedance.collect import inputs, treewalk
from seedance.collect.scan import CheckOptions, Scanner
from tests.conftest import seedance_jobs
from tests.unit.test_collect_scan_walk import LIBZ, build_big_tree

pytestmark = [pytest.mark.skipif(not os.path.exists(LIBZ), reason="libz.so.1 not installed"),
              pytest.mark.skipif(treewalk._lib() is None, reason="the C walk (seedance.elf._fastelf) is not built")]

# Names whose order as Python sorts str (code points, surrogateescape) is not their byte
# order: "a\x80" decodes to U+DC80, which sorts after "aé" (U+00E9, bytes C3 A9) though
# 0x80 < 0xC3; and invalid or overlong sequences decode byte by byte.
ODD_NAMES = [b"a\x80.so", "aé.so".encode(), b"a\xc3.so", "a\U0001f600.so".encode(), b"a\xff.so",
             "a\ue000.so".encode(), b"a\xed\xa0\x80.so", b"a\xc0\xaf.so", b"a\xe2\x82.so", b"A.so", b"a.so",
             "a\u07ff.so".encode(), b"a\xf4\x90\x80\x80.so"]


def walk(root, mode: str, monkeypatch, jobs: str | None = None) -> tuple:
    seedance_jobs(monkeypatch, jobs)
    if mode == "python":
        monkeypatch.setenv("SEEDANCE_WALK", "python")
    else:
        monkeypatch.delenv("SEEDANCE_WALK", raising=False)
    scanner = Scanner(CheckOptions(targets=[str(root)]))
    found = scanner._walk(str(root))
    # every field of the stat but the access time, which the first walk's reads move
    return ([(path, st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid, st.st_size,
              st.st_mtime, st.st_ctime, st.st_mtime_ns, st.st_ctime_ns, st.st_blksize, st.st_blocks, st.st_rdev,
              type(st.st_mtime)) for path, st in found],
            dict(scanner.stats), scanner.errors, scanner.dir_configs, sorted(scanner._plain_files))


def build_odd_tree(root) -> None:
    """build_big_tree's cases and those it lacks: names out of byte order (files and
    directories), a socket, a link to a FIFO, a config-named ELF that is not a seedance
    config and a seedance one that is, a tiny config, an empty directory, a relative link
    up and out of the tree."""
    build_big_tree(root)
    data = open(os.path.realpath(LIBZ), "rb").read()
    odd = root / "odd"
    odd.mkdir()
    raw = os.fsencode(str(odd))
    for name in ODD_NAMES:
        with open(raw + b"/" + name, "wb") as handle:
            handle.write(data)
        os.mkdir(raw + b"/" + name + b".d")
        with open(raw + b"/" + name + b".d/" + b"inner.so", "wb") as handle:
            handle.write(data)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(odd / "sock"))
    os.mkfifo(odd / "fifo")
    os.symlink("fifo", odd / "to-fifo")
    os.symlink("../../a/libz.so.1.2", odd / "up.so")
    (odd / "lib.yaml").write_bytes(data)  # a config's name, an ELF's bytes, not ours
    (odd / "seedance").mkdir()
    (odd / "seedance" / "rules.yaml").write_bytes(data)  # ours by its directory
    (odd / "seedance.yml").write_text("x")  # ours by its name, however short
    (odd / "tiny.yml").write_text("x")
    (odd / "empty").mkdir()
    (odd / "manifest.yaml").write_text("seedance_version: '0.1'\nname: p\n")


@pytest.mark.parametrize("jobs", ["1", None], ids=["one-thread", "two-threads"])
def test_the_c_walk_is_the_python_walk_on_a_tree_of_every_case(tmp_path, monkeypatch, jobs):
    build_odd_tree(tmp_path)
    python = walk(tmp_path, "python", monkeypatch, "1")
    c = walk(tmp_path, "c", monkeypatch, jobs)
    assert c == python
    found, stats, errors, configs, plain = c
    odd = os.fsencode(str(tmp_path / "odd"))
    paths = [os.fsencode(p) for p, *_ in found]
    files = [os.path.basename(p) for p in paths if os.path.dirname(p) == odd and os.path.basename(p) in ODD_NAMES]
    inner = [os.path.basename(os.path.dirname(p))[:-2] for p in paths
             if os.path.dirname(os.path.dirname(p)) == odd and p.endswith(b".so.d/inner.so")]
    # the files, then the directories, each in the order Python sorts their names in
    expected = [os.fsencode(n) for n in sorted(os.fsdecode(n) for n in ODD_NAMES)]
    assert files == expected and inner == expected
    assert sorted(ODD_NAMES) != expected  # (byte order is another order)
    assert str(tmp_path / "odd" / "lib.yaml") in [p for p, *_ in found]
    assert {str(tmp_path / "odd" / "seedance" / "rules.yaml"), str(tmp_path / "odd" / "seedance.yml"),
            str(tmp_path / "odd" / "manifest.yaml")} <= set(configs)
    assert str(tmp_path / "odd" / "tiny.yml") not in configs
    assert [e["error"] for e in errors] == ["symbolic link loop"] * 2


@pytest.mark.parametrize("jobs", ["1", None], ids=["one-thread", "two-threads"])
def test_the_c_walk_is_the_python_walk_on_the_hosts_trees(monkeypatch, jobs):
    trees = [d for d in ("/usr/lib/x86_64-linux-gnu", sysconfig.get_paths()["purelib"], "/usr/local/cuda")
             if os.path.isdir(d)]
    for tree in trees:
        assert walk(tree, "c", monkeypatch, jobs) == walk(tree, "python", monkeypatch, "1"), tree


def test_the_c_walk_records_what_the_python_walk_records(tmp_path, monkeypatch):
    """Recording for the check cache: every input the Python walk notes (os.stat of links,
    the listing of each directory, the open of each file looked at) is noted by the C walk
    with the same identity; what it notes beyond is a link's target directory, by what it
    is (weak), or a file named like a config, which it reads before Python asks whether it
    is one (more inputs only ever make the cache more careful)."""
    build_odd_tree(tmp_path)
    records = {}
    for mode in ("python", "c"):
        inputs.start()
        try:
            walk(tmp_path, mode, monkeypatch, "1" if mode == "python" else None)
        finally:
            records[mode] = inputs.stop()
    python, c = records["python"], records["c"]
    assert python
    for key, value in python.items():
        assert key in c, key
        assert c[key] == value or (inputs.is_weak(value) and not inputs.is_weak(c[key])), key
    for key in set(c) - set(python):
        assert inputs.is_weak(c[key]) or key[0].endswith((".yaml", ".yml")), key


def test_unreadable_files_and_directories_alike(monkeypatch):
    """As a user who cannot read some of the tree (root reads everything: the walks run
    in a child that gave up root), a directory that cannot be listed and a file that cannot
    be opened are the same errors and counts in both walks."""
    import tempfile

    base = tempfile.mkdtemp(prefix="seedance-walk-")
    try:
        os.chmod(base, 0o755)
        root = os.path.join(base, "tree")
        os.mkdir(root)
        from pathlib import Path

        old_umask = os.umask(0o022)  # (the tree is made for others to read)
        try:
            build_big_tree(Path(root))
        finally:
            os.umask(old_umask)
        os.chmod(os.path.join(root, "pkg02", "lib"), 0)
        os.chmod(os.path.join(root, "a", "libz.so.1.2"), 0)
        os.chmod(os.path.join(root, "f000.so"), 0)
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: drop root, walk both ways, say what came out
            try:
                os.close(reader)
                if os.geteuid() == 0:
                    os.setgid(65534)
                    os.setuid(65534)
                out = {}
                for mode, jobs in (("python", "1"), ("c", "1"), ("c", None)):
                    found, stats, errors, configs, plain = walk(root, mode, monkeypatch, jobs)
                    out[f"{mode}-{jobs}"] = [[f[:2] for f in found], stats, errors, configs, plain]
                os.write(writer, json.dumps(out).encode())
            finally:
                os._exit(0)
        os.close(writer)
        with os.fdopen(reader, "rb") as handle:
            out = json.loads(handle.read() or b"{}")
        os.waitpid(pid, 0)
        assert set(out) == {"python-1", "c-1", "c-None"}, "the child did not answer"
        assert out["c-1"] == out["python-1"] and out["c-None"] == out["python-1"]
        errors = {e["path"]: e["error"] for e in out["python-1"][2]}
        assert errors[os.path.join(root, "pkg02", "lib")].endswith(": permission denied")
        assert errors[os.path.join(root, "f000.so")].endswith(": permission denied")
        assert out["python-1"][1]["unreadable"] >= 4  # + the two loop links
    finally:
        for dirpath, dirnames, filenames in os.walk(base):
            for name in dirnames + filenames:
                try:
                    os.chmod(os.path.join(dirpath, name), 0o755, follow_symlinks=False)
                except (OSError, NotImplementedError):
                    pass
        shutil.rmtree(base, ignore_errors=True)


def test_a_tree_deeper_than_path_max_is_one_error_in_both_walks(tmp_path, monkeypatch):
    """Paths past PATH_MAX (25 levels of 200-byte names): the directory that cannot be
    opened any more is one 'file name too long' error, the same in both walks."""
    data = open(os.path.realpath(LIBZ), "rb").read()
    here = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = os.dup(here)
        for level in range(25):
            name = f"{level:02d}" + "d" * 198
            os.mkdir(name, dir_fd=fd)
            deeper = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            if level == 3:
                with open(os.open("lib.so", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=deeper), "wb") as handle:
                    handle.write(data)
            os.close(fd)
            fd = deeper
        os.close(fd)
    finally:
        os.close(here)
    results = {}
    for mode, jobs in (("python", "1"), ("c", "1"), ("c", None)):
        found, stats, errors, configs, plain = walk(tmp_path, mode, monkeypatch, jobs)
        results[(mode, jobs)] = (found, {k: stats.get(k, 0) for k in ("files", "skipped", "unreadable")}, errors)
    python = results[("python", "1")]
    assert results[("c", "1")] == python and results[("c", None)] == python
    found, stats, errors = python
    assert len(found) == 1 and stats["unreadable"] == 1
    assert len(errors) == 1 and errors[0]["error"].endswith(": file name too long")


@pytest.mark.parametrize("jobs", ["1", None], ids=["one-thread", "two-threads"])
def test_many_links_to_few_files_are_each_judged_by_their_target(tmp_path, monkeypatch, jobs):
    """3,000 links to 40 files, ELF and not, in one directory and below it: each target is
    sniffed once per piece of the walk (a table of the targets seen, grown as it fills), and
    every link is what its target is."""
    data = open(os.path.realpath(LIBZ), "rb").read()
    targets = tmp_path / "targets"
    targets.mkdir()
    for index in range(40):
        (targets / f"t{index:02d}").write_bytes(data if index % 3 == 0 else b"not an ELF file, long enough\n")
    for where in (tmp_path / "links", tmp_path / "links" / "deeper"):
        where.mkdir(parents=True, exist_ok=True)
        for index in range(1500):
            os.symlink(f"{targets}/t{index % 40:02d}", where / f"l{index:04d}")
    python = walk(tmp_path, "python", monkeypatch, "1")
    assert walk(tmp_path, "c", monkeypatch, jobs) == python
    found = python[0]
    assert len(found) == 14 + 2 * sum(1 for index in range(1500) if index % 40 % 3 == 0)
