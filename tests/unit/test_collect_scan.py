"""The scan never lets a hostile file escape as an exception: mutated real objects in a tree
end up checked or listed in stats.errors."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seedance.collect.scan import CheckOptions, Scanner, _unique_roots

LIBZ = "/usr/lib/x86_64-linux-gnu/libz.so.1"
pytestmark = pytest.mark.skipif(not os.path.exists(LIBZ), reason="libz.so.1 not installed")
ORIGINAL = open(os.path.realpath(LIBZ), "rb").read() if os.path.exists(LIBZ) else b""


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(patches=st.lists(st.tuples(st.integers(0, 4095), st.binary(min_size=1, max_size=8)), min_size=1, max_size=6),
       cut=st.one_of(st.none(), st.integers(16, 8192)))
def test_mutated_objects_never_escape(tmp_path_factory, patches, cut):
    tree = tmp_path_factory.mktemp("fuzz")
    data = bytearray(ORIGINAL)
    for offset, chunk in patches:  # the headers, PT_DYNAMIC and version tables live up front
        data[offset:offset + len(chunk)] = chunk
    if cut is not None:
        data = data[:cut]
    data[:4] = b"\x7fELF"  # keep it an ELF candidate so the reader and resolver see it
    (tree / "libfuzz.so").write_bytes(bytes(data))
    report = Scanner(CheckOptions(targets=[str(tree)])).run()
    checked = report.stats["elf_objects"] + report.stats["skipped"] + len(report.stats["errors"])
    assert checked == 1
    for problem in report.stats["errors"]:
        assert "\n" not in problem["error"]


def test_unique_roots_prefers_the_real_file_over_links(tmp_path):
    real = tmp_path / "libx.so.1.2"
    real.write_bytes(b"x")
    os.symlink(real.name, tmp_path / "libx.so.1")
    os.symlink("libx.so.1", tmp_path / "libx.so")
    found = [(str(p), os.stat(p)) for p in (tmp_path / "libx.so", tmp_path / "libx.so.1", real)]
    assert _unique_roots(found) == [str(real)]
