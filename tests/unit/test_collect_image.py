"""collect/layers.py and collect/oci.py: the tree's in-root resolution, whiteouts, re-rooted
links, the layer stream's caps; image.py's subject fields."""
from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile

import pytest

from seedance.collect import layers, oci
from seedance.model.errors import BadInput


def _tar(entries) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, payload in entries:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "link": tarfile.SYMTYPE, "fifo": tarfile.FIFOTYPE,
                         "hardlink": tarfile.LNKTYPE}[kind]
            info.linkname = payload or ""
            tar.addfile(info)
    return buffer.getvalue()


def _layer(digest, data, diff_id=None):
    return oci.Layer(digest, "", None, diff_id, lambda: io.BytesIO(data))


@pytest.fixture
def tree(tmp_path):
    staging = tmp_path / "s"
    (staging / "blobs").mkdir(parents=True)
    return layers.Tree(str(staging))


def _apply(tree, stack, caps=None):
    budget = layers._Budget(caps or layers.Caps(), "img")
    for index, (digest, entries) in enumerate(stack):
        layers.apply_layer(tree, _layer(digest, gzip.compress(_tar(entries))), index, budget, "img")


def test_lookup_stays_inside_the_root(tree):
    _apply(tree, [("sha256:a", [("usr/lib", "dir", None), ("usr/lib/x.so", "file", b"\x7fELF"),
                                ("lib", "link", "/usr/lib"), ("up", "link", "../../../../usr/lib/x.so"),
                                ("host", "link", "/etc/passwd")])])
    assert tree.lookup("/lib/x.so")[0] == "/usr/lib/x.so"
    assert tree.lookup("/up")[0] == "/usr/lib/x.so"  # '..' stops at the image's /
    canonical, node = tree.lookup("/host")
    assert canonical == "/etc/passwd" and node is None  # the image's /etc/passwd: absent


def test_whiteout_and_opaque_remove_only_lower_layers(tree):
    _apply(tree, [("sha256:a", [("d/old", "file", b"1"), ("d/keep", "file", b"2"), ("e/x", "file", b"3")]),
                  ("sha256:b", [("d/.wh.old", "file", b""), ("e/.wh..wh..opq", "file", b""),
                                ("e/new", "file", b"4")])])
    assert tree.node_at("/d/old") is None and tree.node_at("/d/keep") is not None
    assert tree.node_at("/e/x") is None and tree.node_at("/e/new").layer == "sha256:b"
    assert tree.removed == {"/d/old": "sha256:b", "/e/x": "sha256:b"}


def test_materialized_links_are_relative_and_inside(tree, tmp_path):
    _apply(tree, [("sha256:a", [("usr/lib/x.so", "file", b"\x7fELFxx"), ("lib", "link", "/usr/lib"),
                                ("usr/lib/abs", "link", "/lib/x.so"), ("fifo", "fifo", None)])])
    dest = tmp_path / "root"
    layers.materialize(tree, str(dest), "img")
    assert os.readlink(dest / "usr/lib/abs") == "x.so"
    assert os.readlink(dest / "lib") == "usr/lib"
    assert not (dest / "fifo").exists() and tree.skipped_special == 1


def test_setuid_dropped(tree, tmp_path):
    data = _tar([("p", "file", b"\x7fELF")])
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("p")
        info.mode, info.size = 0o6755, 4
        tar.addfile(info, io.BytesIO(b"\x7fELF"))
    data = buffer.getvalue()
    layers.apply_layer(tree, _layer("sha256:a", data), 0, layers._Budget(layers.Caps(), "img"), "img")
    layers.materialize(tree, str(tmp_path / "root"), "img")
    assert os.stat(tmp_path / "root/p").st_mode & 0o7777 == 0o755


def test_hard_link_outside_the_image_is_refused(tree):
    with pytest.raises(BadInput, match="hard link"):
        _apply(tree, [("sha256:a", [("h", "hardlink", "etc/shadow")])])


def test_diff_id_is_checked(tree, tmp_path):
    data = _tar([("a", "file", b"x")])
    wrong = "sha256:" + "0" * 64
    with pytest.raises(BadInput, match="diff_id"):
        layers.apply_layer(tree, _layer("sha256:a", data, wrong), 0, layers._Budget(layers.Caps(), "i"), "i")
    right = "sha256:" + hashlib.sha256(data).hexdigest()
    (tmp_path / "s2" / "blobs").mkdir(parents=True)
    layers.apply_layer(layers.Tree(str(tmp_path / "s2")), _layer("sha256:a", data, right), 0,
                       layers._Budget(layers.Caps(), "i"), "i")


def test_huge_pax_header_is_a_cap_not_memory(tree):
    header = tarfile.TarInfo("x")
    header.pax_headers = {"comment": "z" * (layers.MAX_HEADER_BYTES + 10)}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(header)
    with pytest.raises(BadInput, match="cap: header bytes"):
        layers.apply_layer(tree, _layer("sha256:a", gzip.compress(buffer.getvalue(), 1)), 0,
                           layers._Budget(layers.Caps(), "i"), "i")


def test_verify_stream_digest_and_size():
    data = b"blob"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert oci.verify_stream(io.BytesIO(data), digest, "w", "layer", 4) == 4
    with pytest.raises(BadInput, match="does not match its digest"):
        oci.verify_stream(io.BytesIO(b"blob!"), digest, "w", "layer")
    with pytest.raises(BadInput, match="descriptor says 5"):
        oci.verify_stream(io.BytesIO(data), digest, "w", "layer", 5)
    with pytest.raises(BadInput, match="malformed digest"):
        oci.verify_stream(io.BytesIO(data), "md5:00", "w", "layer")


def test_default_caps_are_the_documented_ones(monkeypatch):
    for name in ("MAX_TOTAL_BYTES", "MAX_FILE_BYTES", "MAX_ENTRIES"):
        monkeypatch.delenv("SEEDANCE_IMAGE_" + name, raising=False)
    caps = layers.Caps()
    assert (caps.total, caps.file, caps.entries) == (16 << 30, 4 << 30, 500_000)
    docs = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "containers.md")).read()
    for text in ("| 16 GiB |", "| 4 GiB |", "| 500,000 |", "| 8 MiB |", "| 4 MiB |", "| 100,000 |"):
        assert text in docs
    assert (oci.MAX_JSON_BYTES, oci.MAX_ARCHIVE_MEMBERS, layers.MAX_HEADER_BYTES) == (4 << 20, 100_000, 8 << 20)
