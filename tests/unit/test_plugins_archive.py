"""Plugin sources: request names, safe extraction of .tar.gz and wheels."""
from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from seedance.model.errors import BadInput
from seedance.plugins import archive

MANIFEST = b"name: tiny\nversion: 1.0.0\nseedance_version: '>=0.1,<1'\nentry:\n  module: tiny\n"


@pytest.mark.parametrize("text,expected", [
    ("audio-encoder-v2.0.5", ("audio-encoder", "2.0.5")),
    ("audio-encoder==2.0.5", ("audio-encoder", "2.0.5")),
    ("audio-encoder", ("audio-encoder", None)),
    ("my-vision-kit", ("my-vision-kit", None)),  # '-v' followed by a letter is part of the name
])
def test_split_request(text, expected):
    assert archive.split_request(text) == expected


def _tar(path: Path, members):
    with tarfile.open(path, "w:gz") as tar:
        for name, data, kind, link in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            elif kind == "sym":
                info.type = tarfile.SYMTYPE
                info.linkname = link
                tar.addfile(info)
            elif kind == "hard":
                info.type = tarfile.LNKTYPE
                info.linkname = link
                tar.addfile(info)
    return path


def test_tar_with_top_dir_extracts(tmp_path):
    src = _tar(tmp_path / "tiny-1.0.0.tar.gz", [("tiny-1.0.0/manifest.yaml", MANIFEST, "file", None),
                                                 ("tiny-1.0.0/tiny.py", b"x = 1\n", "file", None),
                                                 ("tiny-1.0.0/alias.py", b"", "sym", "tiny.py")])
    assert "name: tiny" in archive.manifest_text(src)
    (tmp_path / "out").mkdir()
    root = archive.extract(src, tmp_path / "out")
    assert (root / "tiny.py").read_text() == "x = 1\n"
    assert (root / "alias.py").is_symlink()


@pytest.mark.parametrize("member,kind,link,why", [
    ("../evil.so", "file", None, "'..'"),
    ("tiny/../../evil.so", "file", None, "'..'"),
    ("/etc/evil.so", "file", None, "absolute"),
    ("tiny/lib.so", "sym", "/etc/passwd", "escapes"),
    ("tiny/lib.so", "sym", "../../outside", "escapes"),
    ("tiny/lib.so", "hard", "tiny/manifest.yaml", "unsupported"),
])
def test_hostile_tar_is_refused_and_writes_nothing_outside(tmp_path, member, kind, link, why):
    src = _tar(tmp_path / "bad.tar.gz", [("tiny/manifest.yaml", MANIFEST, "file", None),
                                         (member, b"boom", kind, link)])
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(BadInput, match=why):
        archive.extract(src, out)
    assert not (tmp_path / "evil.so").exists()


def test_wheel_extracts_and_refuses_climbing(tmp_path):
    good = tmp_path / "tiny-1.0.0-py3-none-any.whl"
    with zipfile.ZipFile(good, "w") as zf:
        zf.writestr("tiny/manifest.yaml", MANIFEST)
        zf.writestr("tiny/tiny.py", "x = 2\n")
        zf.writestr("tiny-1.0.0.dist-info/METADATA", "Name: tiny\n")
    (tmp_path / "o1").mkdir()
    root = archive.extract(good, tmp_path / "o1")
    assert (root / "tiny.py").read_text() == "x = 2\n"
    bad = tmp_path / "bad-1.0-py3-none-any.whl"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("tiny/manifest.yaml", MANIFEST)
        zf.writestr("../../escape.py", "boom")
    (tmp_path / "o2").mkdir()
    with pytest.raises(BadInput, match="'..'"):
        archive.extract(bad, tmp_path / "o2")


def test_directory_symlink_escaping_is_refused(tmp_path):
    plugin = tmp_path / "p"
    plugin.mkdir()
    (plugin / "manifest.yaml").write_bytes(MANIFEST)
    (plugin / "lib.so").symlink_to("/etc/passwd")
    (tmp_path / "out").mkdir()
    with pytest.raises(BadInput, match="escapes"):
        archive.extract(plugin, tmp_path / "out")


def test_not_a_plugin_and_corrupt_archive(tmp_path):
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(BadInput, match="not a plugin"):
        archive.manifest_text(tmp_path / "x.txt")
    (tmp_path / "broken.tar.gz").write_bytes(b"\x1f\x8b not really")
    with pytest.raises(BadInput, match="not a readable"):
        archive.manifest_text(tmp_path / "broken.tar.gz")


def test_scan_sources_skips_broken_neighbours(tmp_path):
    good = tmp_path / "tiny-v1.0.0"
    good.mkdir()
    (good / "manifest.yaml").write_bytes(MANIFEST)
    bad = tmp_path / "broken"
    bad.mkdir()
    (bad / "manifest.yaml").write_text("name: [\n")
    found = archive.scan_sources([tmp_path])
    assert [(s.name, s.version) for s in found] == [("tiny", "1.0.0")]
