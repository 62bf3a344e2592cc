"""check's tree walk (scandir entries, each file sniffed once) finds what os.walk finds, in
os.walk's order, and counts the same files, skips and errors."""
from __future__ import annotations

import os
import shutil

import pytest

from seedance.collect.scan import CheckOptions, Scanner

LIBZ = "/usr/lib/x86_64-linux-gnu/libz.so.1"
# written out here, not imported: sources, bytecode and headers are never opened
NEVER_ELF = (".py", ".pyc", ".pyi", ".h", ".hpp", ".cuh")
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
    (root / "Z-first.so").write_bytes(open(real, "rb").read())
    # a directory whose name ends like a Python source is still walked, and a linked
    # directory with such a name is neither walked nor counted as a file
    (root / "b" / "pkg.py").mkdir()
    shutil.copyfile(real, root / "b" / "pkg.py" / "inner.so")
    os.symlink("../a", root / "b" / "linked.h")


def test_walk_matches_os_walk(tmp_path):
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


def test_walk_reports_an_unlistable_directory(tmp_path):
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
