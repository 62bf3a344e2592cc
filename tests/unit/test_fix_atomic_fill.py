"""The fixer's one-pass write: patched copy hashed while written, the preview parsed from a
copy-on-write mapping, the relinker's undefined symbols read from the raw table (issue 13).
Oracles: hashlib over the bytes on disk, apply_patches over the original, and
seedance.elf.reader (the reference ELF reader) for symbols and dynamic entries."""
import hashlib
import os
import sysconfig
from pathlib import Path

import pytest

from seedance.elf.reader import read_elf
from seedance.fix import atomic, dynedit

SITE = Path(sysconfig.get_paths()["purelib"])
REAL_LIBS = [Path("/usr/lib/x86_64-linux-gnu/libcurl.so.4"), SITE / "torch" / "lib" / "libshm.so",
             SITE / "torch" / "lib" / "libtorch_python.so", SITE / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12"]


def test_fill_writes_the_patched_bytes_and_returns_their_sha256(tmp_path):
    src = tmp_path / "big.bin"
    original = os.urandom(dynedit._CHUNK * 2 + 12345)
    src.write_bytes(original)
    edge = dynedit._CHUNK - 3  # a patch across the first chunk boundary, one in the tail
    patches = [dynedit.Patch(edge, b"ABCDEFG"), dynedit.Patch(len(original) - 5, b"xyz"), dynedit.Patch(0, b"\x7f")]
    edit = dynedit.FileEdit(str(src), "in-place", [], len(original), patches=patches)
    out = tmp_path / "out.bin"
    digest = atomic.write_temp(edit.fill, str(out), mode=0o644, result=True)
    written = out.read_bytes()
    assert written == dynedit.apply_patches(original, patches)
    assert digest == hashlib.sha256(written).hexdigest()
    assert src.read_bytes() == original


def _patched_case(directory: Path):
    src = directory / "big.bin"
    original = os.urandom(dynedit._COPY_CHUNK + dynedit._CHUNK + 4321)
    src.write_bytes(original)
    # across both chunk sizes' boundaries, at the start and in the tail
    patches = [dynedit.Patch(dynedit._COPY_CHUNK - 2, b"QRSTU"), dynedit.Patch(dynedit._CHUNK - 1, b"mn"),
               dynedit.Patch(0, b"\x7f"), dynedit.Patch(len(original) - 4, b"tail")]
    return src, original, patches


@pytest.mark.parametrize("kernel_copy", [True, False], ids=["copy_file_range", "user-space"])
def test_both_copy_paths_write_the_patched_bytes_and_their_sha256(tmp_path, monkeypatch, kernel_copy):
    src, original, patches = _patched_case(tmp_path)
    if not kernel_copy:  # a kernel or Python without copy_file_range takes the mapped path
        monkeypatch.delattr(os, "copy_file_range", raising=False)
    edit = dynedit.FileEdit(str(src), "in-place", [], len(original), patches=patches,
                            identity=atomic.file_identity(os.stat(src)))
    out = tmp_path / "out.bin"
    digest = atomic.write_temp(edit.fill, str(out), result=True)
    written = out.read_bytes()
    assert written == dynedit.apply_patches(original, patches)
    assert digest == hashlib.sha256(written).hexdigest()


def test_deferred_fill_hashes_after_the_descriptor_is_closed(tmp_path):
    """fill_deferred returns before its hash is done; write_temp closes its descriptor
    meanwhile, and the pending digest is still that of the bytes in the file."""
    src, original, patches = _patched_case(tmp_path)
    edit = dynedit.FileEdit(str(src), "in-place", [], len(original), patches=patches)
    out = tmp_path / "out.bin"
    pending = atomic.write_temp(edit.fill_deferred, str(out), result=True)
    written = out.read_bytes()
    assert written == dynedit.apply_patches(original, patches)
    digest = pending if isinstance(pending, str) else pending.result()
    assert digest == hashlib.sha256(written).hexdigest()


def test_journal_records_the_deferred_hash_of_the_result(tmp_path):
    from seedance.fix.journal import Journal

    src, original, patches = _patched_case(tmp_path)
    edit = dynedit.FileEdit(str(src), "in-place", [], len(original), patches=patches,
                            identity=atomic.file_identity(os.stat(src)))
    with Journal(tmp_path / "journal").begin("test") as entry:
        record = entry.replace_file(str(src), edit.fill_deferred, expect=edit.identity)
    assert record["sha256_after"] == hashlib.sha256(src.read_bytes()).hexdigest()
    assert record["sha256_before"] == hashlib.sha256(original).hexdigest()
    assert src.read_bytes() == dynedit.apply_patches(original, patches)


def test_fill_across_filesystems(tmp_path):
    """tmpfs to the test's directory: Linux >= 5.19 refuses copy_file_range across
    filesystems (EXDEV) and the fill falls back; older kernels copy.  Same bytes either way."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the test's directory")
    import tempfile
    with tempfile.TemporaryDirectory(dir=shm) as other:
        src, original, patches = _patched_case(Path(other))
        edit = dynedit.FileEdit(str(src), "in-place", [], len(original), patches=patches)
        out = tmp_path / "out.bin"
        digest = atomic.write_temp(edit.fill, str(out), result=True)
        written = out.read_bytes()
    assert written == dynedit.apply_patches(original, patches)
    assert digest == hashlib.sha256(written).hexdigest()


def test_fill_refuses_a_file_replaced_since_the_plan(tmp_path):
    src = tmp_path / "f.bin"
    src.write_bytes(b"\0" * 100)
    edit = dynedit.FileEdit(str(src), "in-place", [], 100, patches=[], identity=atomic.file_identity(os.stat(src)))
    replacement = tmp_path / "g.bin"
    replacement.write_bytes(b"\1" * 100)  # same size, another inode renamed over the path
    os.rename(replacement, src)
    with pytest.raises(Exception, match="changed since the edit was planned"):
        atomic.write_temp(edit.fill, str(tmp_path / "out"), result=True)


def test_fill_refuses_a_file_that_changed_size_since_the_plan(tmp_path):
    src = tmp_path / "f.bin"
    src.write_bytes(b"\0" * 100)
    edit = dynedit.FileEdit(str(src), "in-place", [], 100, patches=[])
    src.write_bytes(b"\0" * 101)
    with pytest.raises(Exception, match="changed size"):
        atomic.write_temp(edit.fill, str(tmp_path / "out"), result=True)


@pytest.mark.parametrize("lib", [p for p in REAL_LIBS if p.exists()], ids=lambda p: p.name)
def test_undefined_symbols_match_the_reference_reader(lib):
    fast = dynedit.undefined_symbols(str(lib))
    reference = {(s.name, s.version, s.binding == "WEAK") for s in read_elf(str(lib), symbols=True).symbols
                 if not s.defined}
    assert set(fast) == reference and len(fast) == len(reference)
    assert any(version for _n, version, _w in fast)  # the versioned ones are named, not dropped


def test_preview_info_equals_the_written_file(tmp_path):
    lib = SITE / "torch" / "lib" / "libshm.so"
    if not lib.exists():
        pytest.skip("needs torch's libshm.so")
    edit = dynedit.plan_file(str(lib), {"libc10.so": "libc11.so"})
    out = tmp_path / "libshm.so"
    atomic.write_temp(edit.fill, str(out), result=True)
    preview, written = edit.result_info(), read_elf(str(out))
    assert "libc11.so" in preview.needed and "libc10.so" not in preview.needed
    assert (preview.needed, preview.version_needs, preview.soname, preview.runpath) == \
        (written.needed, written.version_needs, written.soname, written.runpath)
    assert edit.identity == atomic.file_identity(os.stat(lib))
