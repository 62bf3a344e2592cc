"""Plugin archives that try to write or point outside the staging root (issue 10 item 2).

Each hostile archive is unpacked by the real extractor (and once by the real `seedance
plugin install`) into a staging dir beside an `outside` directory; the test then looks on
disk: the archive must be refused with one BadInput line and nothing may exist outside.
"""
from __future__ import annotations

import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from seedance.model.errors import BadInput
from seedance.plugins import archive
from tests.conftest import run_cli

MANIFEST = b"name: tiny\nversion: 1.0.0\nseedance_version: '>=0.1,<1'\nentry:\n  module: tiny\n"


def _tar(path: Path, members) -> Path:
    """members: (name, kind, data_or_link, mode); kind in file/dir/sym/hard/chr/fifo."""
    with tarfile.open(path, "w:gz") as tar:
        for name, kind, payload, mode in members:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if kind == "file":
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE,
                         "chr": tarfile.CHRTYPE, "fifo": tarfile.FIFOTYPE}[kind]
            if kind in ("sym", "hard"):
                info.linkname = payload
            if kind == "chr":
                info.devmajor, info.devminor = 1, 3  # /dev/null's numbers
            tar.addfile(info)
    return path


def _chain(depth: int = 15) -> list:
    """l1 -> .., lK -> l(K-1)/..: each link looks harmless alone, together they climb to /."""
    links = [("pkg/l1", "sym", "..", 0o777)]
    links += [(f"pkg/l{k}", "sym", f"l{k - 1}/..", 0o777) for k in range(2, depth + 1)]
    return links


def _files_under(path: Path) -> list:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


@pytest.fixture
def place(tmp_path):
    """(staging dest, outside dir): the staging dir sits a few levels down, as in a store."""
    dest = tmp_path / "store" / ".staging" / "x"
    dest.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    return dest, outside


def test_symlink_chain_then_file_under_it_is_refused_and_writes_nothing_outside(tmp_path, place):
    dest, outside = place
    target = str(outside).lstrip("/")
    src = _tar(tmp_path / "chain.tar.gz", [("pkg/manifest.yaml", "file", MANIFEST, 0o644), *_chain(),
                                           (f"pkg/l15/{target}/pwned", "file", b"owned\n", 0o644)])
    with pytest.raises(BadInput, match="symlink"):
        archive.extract(src, dest)
    assert _files_under(outside) == []


def test_symlink_chain_alone_is_refused(tmp_path, place):
    dest, outside = place
    src = _tar(tmp_path / "chain.tar.gz", [("pkg/manifest.yaml", "file", MANIFEST, 0o644), *_chain()])
    with pytest.raises(BadInput, match="escapes"):
        archive.extract(src, dest)


def test_link_made_harmful_by_a_later_link_is_refused(tmp_path, place):
    # 'a' is checked before 'b' exists: lexically pkg/b/../../x is x, inside; once b -> '.'
    # it is pkg/../../x, outside.  Only a check against the finished tree sees it.
    dest, outside = place
    src = _tar(tmp_path / "late.tar.gz", [("pkg/manifest.yaml", "file", MANIFEST, 0o644),
                                          ("pkg/a", "sym", "b/../../x", 0o777),
                                          ("pkg/b", "sym", ".", 0o777)])
    with pytest.raises(BadInput, match="escapes"):
        archive.extract(src, dest)


def test_plugin_install_of_the_chain_archive_exits_2_and_store_stays_put(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    target = str(outside).lstrip("/")
    src = _tar(tmp_path / "tiny-1.0.0.tar.gz", [("pkg/manifest.yaml", "file", MANIFEST, 0o644),
                                                ("pkg/tiny.py", "file", b"x = 1\n", 0o644), *_chain(),
                                                (f"pkg/l15/{target}/pwned", "file", b"owned\n", 0o644)])
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path), "SEEDANCE_PLUGIN_PATH": ""}
    proc = run_cli("plugin", "install", src, env=env, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("seedance: error:") and "symlink" in lines[0], proc.stderr
    assert _files_under(outside) == []
    store = tmp_path / "data" / "seedance" / "plugins"
    assert not (store / "tiny").exists()


@pytest.mark.parametrize("member,why", [
    (("pkg/evil", "hard", "pkg/manifest.yaml", 0o644), "hard link"),
    (("pkg/evil", "hard", "/etc/passwd", 0o644), "hard link"),
    (("pkg/null", "chr", None, 0o666), "device"),
    (("pkg/pipe", "fifo", None, 0o644), "fifo"),
    (("/tmp/evil", "file", b"x", 0o644), "absolute"),
    (("pkg/../../evil", "file", b"x", 0o644), "'..'"),
    (("pkg/sub/../../../evil", "dir", None, 0o755), "'..'"),
    (("pkg/lib.so", "sym", "/etc/passwd", 0o777), "escapes"),
])
def test_hostile_members_are_refused(tmp_path, place, member, why):
    dest, outside = place
    src = _tar(tmp_path / "bad.tar.gz", [("pkg/manifest.yaml", "file", MANIFEST, 0o644), member])
    with pytest.raises(BadInput, match=why):
        archive.extract(src, dest)
    assert not (tmp_path / "evil").exists() and _files_under(outside) == []


def test_file_over_a_symlink_member_is_refused(tmp_path, place):
    # A link to a file inside, then a file of the same name: following the link would
    # overwrite the manifest; O_EXCL|O_NOFOLLOW refuses the duplicate instead.
    dest, _ = place
    src = _tar(tmp_path / "dup.tar.gz", [("pkg/manifest.yaml", "file", MANIFEST, 0o644),
                                         ("pkg/alias", "sym", "manifest.yaml", 0o777),
                                         ("pkg/alias", "file", b"clobbered\n", 0o644)])
    with pytest.raises(BadInput, match="duplicate"):
        archive.extract(src, dest)
    assert (dest / "p" / "pkg" / "manifest.yaml").read_bytes() == MANIFEST


def test_setuid_setgid_and_sticky_bits_are_dropped(tmp_path, place):
    dest, _ = place
    src = _tar(tmp_path / "suid.tar.gz", [("pkg/manifest.yaml", "file", MANIFEST, 0o644),
                                          ("pkg/tool", "file", b"#!/bin/sh\n", 0o7777)])
    root = archive.extract(src, dest)
    mode = (root / "tool").stat().st_mode
    assert not mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWGRP | stat.S_IWOTH)
    assert mode & stat.S_IXUSR  # the executable bit a plugin tool needs is kept


def test_zip_suid_bits_dropped_and_zip_symlinks_and_climbs_refused(tmp_path, place):
    dest, outside = place
    good = tmp_path / "tiny-1.0.0.zip"
    with zipfile.ZipFile(good, "w") as zf:
        zf.writestr("tiny/manifest.yaml", MANIFEST)
        info = zipfile.ZipInfo("tiny/tool")
        info.external_attr = (stat.S_IFREG | 0o6755) << 16
        zf.writestr(info, b"#!/bin/sh\n")
    root = archive.extract(good, dest)
    assert not (root / "tool").stat().st_mode & (stat.S_ISUID | stat.S_ISGID)
    for name, mode, why in (("tiny/link", stat.S_IFLNK | 0o777, "symlink"),
                            ("../../evil", stat.S_IFREG | 0o644, "'..'"),
                            ("tiny/dev", stat.S_IFCHR | 0o666, "device")):
        bad = tmp_path / "bad.whl"
        with zipfile.ZipFile(bad, "w") as zf:
            zf.writestr("tiny/manifest.yaml", MANIFEST)
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            zf.writestr(info, str(outside))
        fresh = tmp_path / f"o-{why.strip(chr(39))}"
        fresh.mkdir()
        with pytest.raises(BadInput, match=why):
            archive.extract(bad, fresh)
    assert _files_under(outside) == [] and not (tmp_path / "evil").exists()


def test_plugin_directory_with_a_fifo_or_an_escaping_chain_is_refused(tmp_path, place):
    dest, outside = place
    plugin = tmp_path / "plug"
    plugin.mkdir()
    (plugin / "manifest.yaml").write_bytes(MANIFEST)
    os.mkfifo(plugin / "pipe")  # copying it would block on open or read forever
    with pytest.raises(BadInput, match="fifo"):
        archive.extract(plugin, dest)
    os.unlink(plugin / "pipe")
    (plugin / "l1").symlink_to("..")
    for k in range(2, 16):
        (plugin / f"l{k}").symlink_to(f"l{k - 1}/..")
    fresh = tmp_path / "again"
    fresh.mkdir()
    with pytest.raises(BadInput, match="escapes"):
        archive.extract(plugin, fresh)


def test_a_good_archive_still_unpacks_with_its_inner_links(tmp_path, place):
    dest, _ = place
    src = _tar(tmp_path / "ok.tar.gz", [("tiny-1.0.0/", "dir", None, 0o755),
                                        ("tiny-1.0.0/manifest.yaml", "file", MANIFEST, 0o644),
                                        ("tiny-1.0.0/lib/libx.so.1", "file", b"\x7fELF", 0o755),
                                        ("tiny-1.0.0/lib/libx.so", "sym", "libx.so.1", 0o777),
                                        ("tiny-1.0.0/up", "sym", "lib/../lib/libx.so", 0o777)])
    root = archive.extract(src, dest)
    assert (root / "lib" / "libx.so").read_bytes() == b"\x7fELF"
    assert (root / "up").resolve() == (root / "lib" / "libx.so.1").resolve()


def _each_byte_damaged(blob: bytes):
    for pos in range(len(blob)):
        for value in (0x00, 0xFF, blob[pos] ^ 0x01):
            yield pos, blob[:pos] + bytes([value]) + blob[pos + 1:]


@pytest.mark.parametrize("fmt", ["whl", "tar.gz"])
def test_every_single_byte_damage_is_one_line_or_a_clean_extract(tmp_path, fmt):
    # The fuzz run found a wheel with one flipped byte in its central directory that made
    # zipfile raise IndexError: a traceback from `plugin install`.  Here every byte of a
    # small plugin is damaged in turn.
    src = tmp_path / f"tiny-1.0.0.{fmt}"
    if fmt == "whl":
        with zipfile.ZipFile(src, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("tiny/manifest.yaml", MANIFEST)
            info = zipfile.ZipInfo("tiny/tool")
            info.external_attr = (stat.S_IFREG | 0o755) << 16
            zf.writestr(info, b"#!/bin/sh\n")
    else:
        _tar(src, [("tiny/manifest.yaml", "file", MANIFEST, 0o644), ("tiny/lib.so", "sym", "tool", 0o777),
                   ("tiny/tool", "file", b"#!/bin/sh\n", 0o755)])
    blob = src.read_bytes()
    outcomes = {"refused": 0, "extracted": 0}
    for n, (pos, damaged) in enumerate(_each_byte_damaged(blob)):
        case = tmp_path / f"c{n}"
        case.mkdir()
        bad = case / src.name
        bad.write_bytes(damaged)
        try:
            archive.manifest_text(bad)
            archive.extract(bad, case)
            outcomes["extracted"] += 1
        except BadInput as exc:
            assert "\n" not in str(exc)
            outcomes["refused"] += 1
        except Exception as exc:  # noqa: BLE001 - this is what the test is looking for
            raise AssertionError(f"byte {pos}: {type(exc).__name__}: {exc}") from None
    assert outcomes["refused"] > 0
