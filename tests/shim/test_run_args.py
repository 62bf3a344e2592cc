"""`seedance run` argument handling: sizes, quotas, affinity spellings, preload safety."""
from __future__ import annotations

import os

import pytest

from seedance.commands.run import check_preload_path, parse_mem_limit, parse_size, resolve_affinity
from seedance.errors import BadInput, UsageError


@pytest.mark.parametrize("text,value", [("8G", 8 << 30), ("512M", 512 << 20), ("4096", 4096), ("1GiB", 1 << 30),
                                        ("2t", 2 << 40)])
def test_sizes(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "G", "-1G", "1.5G", "8X", "0"])
def test_bad_sizes(text):
    with pytest.raises(UsageError):
        parse_size(text)


def test_mem_limit_default_and_per_device():
    value, info = parse_mem_limit("8G,1:4G")
    assert value == f"{8 << 30},1:{4 << 30}"
    assert info == {"default_bytes": 8 << 30, "per_device_bytes": {1: 4 << 30}}
    assert parse_mem_limit("0:1M")[0] == f"0:{1 << 20}"
    with pytest.raises(UsageError):
        parse_mem_limit("8G,4G")
    with pytest.raises(UsageError):
        parse_mem_limit("16:1G")


def test_affinity_spellings_without_nvml():
    assert resolve_affinity("gpu:1")[0] in ("1",) or resolve_affinity("gpu:1")[0].startswith("GPU-")
    assert resolve_affinity("npu0")[0] in ("0",) or resolve_affinity("npu0")[0].startswith("GPU-")
    assert resolve_affinity("GPU-abc,MIG-def")[0] == "GPU-abc,MIG-def"
    with pytest.raises(UsageError):
        resolve_affinity("tpu:3")


@pytest.fixture
def private_dir():
    """A directory whose parents nobody else can write (not under the sticky /tmp)."""
    import shutil
    import tempfile
    from pathlib import Path

    base = Path.home() / ".cache"
    base.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix="seedance-test-", dir=base))
    os.chmod(d, 0o755)
    for p in d.parents:
        if p.stat().st_mode & 0o022:
            shutil.rmtree(d)
            pytest.skip(f"{p} is itself group/world-writable on this host")
    yield d
    shutil.rmtree(d)


def test_preload_path_must_not_be_writable_by_others(private_dir):
    lib = private_dir / "d" / "libseedance_shim.so"
    lib.parent.mkdir()
    lib.write_bytes(b"")
    os.chmod(lib.parent, 0o755)
    check_preload_path(lib)
    os.chmod(lib, 0o666)
    with pytest.raises(BadInput, match="world-writable"):
        check_preload_path(lib)
    os.chmod(lib, 0o644)
    os.chmod(lib.parent, 0o775)
    with pytest.raises(BadInput, match=str(lib.parent)):
        check_preload_path(lib)
