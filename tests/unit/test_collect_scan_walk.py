"""check's tree walk (scandir entries, each file sniffed once) finds what os.walk finds, in
os.walk's order, and counts the same files, skips and errors."""
from __future__ import annotations

import os
import shutil

import pytest

from seedance.collect.scan import CheckOptions, Scanner
from tests.conftest import seedance_jobs

LIBZ = "/usr/lib/x86_64-linux-gnu/libz.so.1"
# written out here, not imported: sources, bytecode, headers and build-system text files
# are never opened
NEVER_ELF = (".py", ".pyc", ".pyi", ".h", ".hpp", ".cuh", ".pl", ".pm", ".ph", ".pc", ".cmake", ".la")
pytestmark = pytest.mark.skipif(not os.path.exists(LIBZ), reason="libz.so.1 not installed")


def reference_walk(directory: str) -> tuple:
    """The walk as os.walk gives it: ([(path, (dev, ino))], files, skipped)."""
    found, files, skipped = [], 0, 0
    for base, dirs, names in os.walk(directory, followlinks=False):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(base, name)
            files += 1
            try:
                st = os.stat(path)
            except OSError:
                skipped += 1
                continue
            if not os.path.isfile(path) or st.st_size < 16 or name.endswith(NEVER_ELF):
                skipped += 1
                continue
            with open(path, "rb") as handle:
                if handle.read(4) == b"\x7fELF":
                    found.append((path, (st.st_dev, st.st_ino)))
                else:
                    skipped += 1
    return found, files, skipped


def build_tree(root) -> None:
    real = os.path.realpath(LIBZ)
    (root / "b" / "deep").mkdir(parents=True)
    (root / "a").mkdir()
    shutil.copyfile(real, root / "a" / "libz.so.1.2")
    os.symlink("libz.so.1.2", root / "a" / "libz.so.1")  # the same inode through a link
    os.symlink("../a", root / "b" / "link-to-a")  # a linked directory: not entered
    os.symlink("missing.so", root / "b" / "dangling.so")
    shutil.copyfile(real, root / "b" / "deep" / "copy.so")
    (root / "b" / "notes.txt").write_text("not an ELF file, long enough to be sniffed\n")
    (root / "b" / "short").write_bytes(b"\x7fELF")
    (root / "b" / "mod.py").write_text("import os  # a Python source is not opened\n")
    (root / "b" / "libodd.data").write_bytes(open(real, "rb").read())  # any other name is sniffed
    # an ELF named like a Perl source or a pkg-config file is not opened (nothing loads one
    # by that name); a name that only contains such a suffix is
    (root / "b" / "tool.pl").write_bytes(open(real, "rb").read())
    (root / "b" / "zlib.pc").write_bytes(open(real, "rb").read())
    (root / "b" / "libpm.so").write_bytes(open(real, "rb").read())
    (root / "b" / "unicore.pm").write_text("package unicore;  # a Perl module is not opened\n")
    (root / "Z-first.so").write_bytes(open(real, "rb").read())
    (root / "setup.py").write_text("pass  # counted and skipped where it is listed, once\n")
    # a directory whose name ends like a Python source is still walked, and a linked
    # directory with such a name is neither walked nor counted as a file
    (root / "b" / "pkg.py").mkdir()
    shutil.copyfile(real, root / "b" / "pkg.py" / "inner.so")
    os.symlink("../a", root / "b" / "linked.h")


@pytest.fixture(params=["c", "python"])
def walker(request, monkeypatch):
    """The C walk (elf/treewalk.c) where it is built, and the Python one."""
    if request.param == "python":
        monkeypatch.setenv("SEEDANCE_WALK", "python")
    else:
        from seedance.collect import treewalk

        monkeypatch.delenv("SEEDANCE_WALK", raising=False)
        if treewalk._lib() is None:
            pytest.skip("the C walk is not built")
    return request.param


def test_walk_matches_os_walk(tmp_path, walker):
    build_tree(tmp_path)
    scanner = Scanner(CheckOptions(targets=[str(tmp_path)]))
    found = scanner._walk(str(tmp_path))
    expected, files, skipped = reference_walk(str(tmp_path))
    assert [(path, (st.st_dev, st.st_ino)) for path, st in found] == expected
    assert scanner.stats["files"] == files
    assert scanner.stats["skipped"] == skipped
    assert not scanner.errors
    # both names of the linked library are roots here; check keeps one per inode later
    assert str(tmp_path / "a" / "libz.so.1") in [p for p, _ in found]
    assert str(tmp_path / "b" / "pkg.py" / "inner.so") in [p for p, _ in found]
    assert str(tmp_path / "b" / "libpm.so") in [p for p, _ in found]
    assert str(tmp_path / "b" / "tool.pl") not in [p for p, _ in found]


def test_walk_reports_an_unlistable_directory(tmp_path, walker):
    if os.geteuid() == 0:
        pytest.skip("root lists every directory")
    build_tree(tmp_path)
    os.chmod(tmp_path / "b", 0)
    try:
        scanner = Scanner(CheckOptions(targets=[str(tmp_path)]))
        scanner._walk(str(tmp_path))
        assert [e["path"] for e in scanner.errors] == [str(tmp_path / "b")]
    finally:
        os.chmod(tmp_path / "b", 0o755)


# --- a walk shared with a helper process (helper.share) ----------------------------------

def build_big_tree(root) -> None:
    """build_tree's cases, and enough entries for the walk to be cut in pieces: 300 files
    beside them, 12 packages of files and subdirectories, a link loop, a FIFO, configs."""
    build_tree(root)
    real = os.path.realpath(LIBZ)
    data = open(real, "rb").read()
    for index in range(300):
        name = f"f{index:03d}" + (".so" if index % 25 == 0 else ".txt")
        (root / name).write_bytes(data if index % 25 == 0 else b"plain text, not ELF, long enough\n")
    for package in range(12):
        base = root / f"pkg{package:02d}"
        (base / "lib" / "deeper").mkdir(parents=True)
        (base / "include").mkdir()
        for index in range(30):
            (base / "include" / f"h{index}.h").write_text("/* a header */\n")
            (base / f"m{index}.py").write_text("pass  # never opened\n")
        shutil.copyfile(real, base / "lib" / f"libp{package}.so.1")
        os.symlink(f"libp{package}.so.1", base / "lib" / f"libp{package}.so")
        shutil.copyfile(real, base / "lib" / "deeper" / "x.so")
        (base / "lib" / "deeper" / "notes").write_text("another file that is sniffed, not ELF\n")
        (base / "seedance.yaml").write_text("{}\n")
    os.symlink("loop-b", root / "pkg03" / "loop-a")
    os.symlink("loop-a", root / "pkg03" / "loop-b")
    os.mkfifo(root / "pkg05" / "fifo.so")
    (root / "seedance").mkdir()
    (root / "seedance" / "policy.yaml").write_text("{}\n")


from seedance.collect.helper import share as _SHARE  # noqa: E402  (before any test replaces it)


def _walked(root, monkeypatch, jobs):
    from seedance.collect import helper

    from seedance.collect import scan

    seedance_jobs(monkeypatch, jobs)
    monkeypatch.setenv("SEEDANCE_WALK", "python")  # (the C walk shares with threads, not a helper)
    pids = []  # the process that took each piece: here, or (from its answer) the helper
    share, piece, parent = _SHARE, scan.Scanner._walk_piece, os.getpid()

    def tagged(items, run, minimum):
        results = share(items, run, minimum)
        pids.extend(getattr(result, "taken_by", None) for result in results)
        return results

    def tagged_piece(self, item):
        result = piece(self, item)
        result.taken_by = os.getpid()
        if result.taken_by == parent:
            pids.append(parent)  # (walked here, through share or not)
        return result

    monkeypatch.setattr(helper, "share", tagged)
    scan.Scanner._walk_piece = tagged_piece
    try:
        scanner = Scanner(CheckOptions(targets=[str(root)]))
        found = scanner._walk(str(root))
    finally:
        scan.Scanner._walk_piece = piece  # (a later call wraps what the test put there, not this)
    return ([(path, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)) for path, st in found],
            dict(scanner.stats), scanner.errors, scanner.dir_configs, sorted(scanner._plain_files)), pids


def test_a_walk_shared_with_a_helper_is_the_one_process_walk(tmp_path, monkeypatch):
    from seedance.collect import helper

    if helper.cores() < 2:
        pytest.skip("one core: the walk is never shared")
    build_big_tree(tmp_path)
    alone, alone_pids = _walked(tmp_path, monkeypatch, "1")
    # with its 27 subtrees two levels down, this tree is below the threshold of a helper:
    # cut in pieces, all walked here
    below, below_pids = _walked(tmp_path, monkeypatch, None)
    assert below == alone and set(below_pids) == {os.getpid()}
    from seedance.collect import scan as scan_mod

    monkeypatch.setattr(scan_mod, "WALK_SPLIT_MIN_SUBTREES", 4)
    # each piece waits a little, in either process: neither takes every piece before the
    # other starts, however busy the machine is
    from seedance.collect import scan
    import time

    piece = scan.Scanner._walk_piece

    def slow_here(self, item):
        time.sleep(0.01)
        return piece(self, item)

    monkeypatch.setattr(scan.Scanner, "_walk_piece", slow_here)
    shared, pids = _walked(tmp_path, monkeypatch, None)
    assert alone_pids == []  # SEEDANCE_JOBS=1: not cut in pieces at all
    assert len(set(pids)) == 2, "the helper took no piece"  # (the helper starts while we take the first)
    assert shared == alone
    found, stats, errors, configs, plain = shared
    expected, files, skipped = reference_walk(str(tmp_path))
    assert [(path, ident[:2]) for path, ident in found] == expected
    assert stats["files"] == files
    assert [e["path"] for e in errors] == [str(tmp_path / "pkg03" / "loop-a"), str(tmp_path / "pkg03" / "loop-b")]
    assert len(configs) == 13


def test_a_shared_walk_survives_its_helper(tmp_path, monkeypatch):
    """A helper that dies after its first piece: every piece is walked here."""
    from seedance.collect import helper, scan

    if helper.cores() < 2:
        pytest.skip("one core: the walk is never shared")
    build_big_tree(tmp_path)
    alone, _ = _walked(tmp_path, monkeypatch, "1")
    parent = os.getpid()
    piece = scan.Scanner._walk_piece
    taken = []

    marker = tmp_path.parent / (tmp_path.name + ".helper-died")

    def dying(self, item):
        import time

        time.sleep(0.01)  # (both processes: the helper gets pieces however busy the machine is)
        if os.getpid() != parent:
            taken.append(item)
            if len(taken) > 1:
                marker.write_text("after two pieces\n")
                os._exit(9)
        return piece(self, item)

    monkeypatch.setattr(scan.Scanner, "_walk_piece", dying)
    monkeypatch.setattr(scan, "WALK_SPLIT_MIN_SUBTREES", 4)
    shared, _ = _walked(tmp_path, monkeypatch, None)
    assert marker.exists(), "the helper did not get to its second piece"
    assert shared == alone
