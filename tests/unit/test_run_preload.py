"""The one preload-safety judgement, against real modes and owners on disk."""
import os

import pytest

from seedance.run.preload import unsafe_reason


@pytest.fixture
def tree(tmp_path):
    lib = tmp_path / "d" / "libx.so"
    lib.parent.mkdir()
    lib.write_bytes(b"x")
    os.chmod(tmp_path, 0o755)
    os.chmod(lib.parent, 0o755)
    os.chmod(lib, 0o644)
    if unsafe_reason(str(lib)) is not None:
        pytest.skip(f"a directory above {tmp_path} is itself unsafe on this host: {unsafe_reason(str(lib))}")
    return lib


def test_private_tree_is_safe(tree):
    assert unsafe_reason(str(tree)) is None


@pytest.mark.parametrize("target, mode, words", [
    ("file", 0o666, "world-writable"),
    ("file", 0o664, "group-writable"),
    ("dir", 0o777, "world-writable"),
    ("dir", 0o775, "group-writable"),
])
def test_writable_file_or_parent_is_refused(tree, target, mode, words):
    victim = tree if target == "file" else tree.parent
    os.chmod(victim, mode)
    assert unsafe_reason(str(tree)) == f"{victim} is {words}"


def test_sticky_directory_protects_entries_of_trusted_owners(tree):
    # /tmp's 1777: others may create entries but cannot rename ours
    os.chmod(tree.parent, 0o1777)
    assert unsafe_reason(str(tree)) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another uid")
def test_sticky_directory_does_not_protect_a_stranger_entry(tree):
    os.chmod(tree.parent, 0o1777)
    os.chown(tree, 65534, 65534)
    assert unsafe_reason(str(tree)) == f"{tree.parent} is world-writable"
    assert unsafe_reason(str(tree), owners=(0,)) == f"{tree} belongs to uid 65534"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another uid")
def test_owner_check_when_asked(tree):
    os.chown(tree, 65534, 65534)
    assert unsafe_reason(str(tree)) is None  # writability alone: fine
    assert unsafe_reason(str(tree), owners=(0,)) == f"{tree} belongs to uid 65534"


def test_missing_path(tmp_path):
    assert "no such file" in unsafe_reason(str(tmp_path / "nope.so"))
