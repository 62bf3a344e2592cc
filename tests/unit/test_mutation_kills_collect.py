"""Tests written for the mutants of agent/collect/ that a seeded sample found alive (issue 17;
bench/mutation-survivors.md lists the sample and what became of each survivor).

Oracles: the XDG Base Directory specification, the kernel's /proc/self/maps of a real
mapping (a file whose name is not UTF-8), and the torch wheel as pip laid it out on disk.
"""
import mmap
import os
import sysconfig
from pathlib import Path

import pytest

from seedance.collect import host, process, torch_ext


def test_config_dir_follows_the_xdg_base_directory_spec(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    # "If $XDG_CONFIG_HOME is either not set or empty, a default equal to $HOME/.config should be used."
    assert host.config_dir(str(tmp_path / "home")) == str(tmp_path / "home" / ".config" / "seedance")
    monkeypatch.setenv("HOME", str(tmp_path / "h2"))
    assert host.config_dir() == str(tmp_path / "h2" / ".config" / "seedance")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert host.config_dir(str(tmp_path / "home")) == str(tmp_path / "cfg" / "seedance")


def test_parse_maps_keeps_a_path_that_is_not_utf8(tmp_path):
    name = os.fsencode(str(tmp_path)) + b"/lib\xff\xfe.so"
    with open(name, "wb") as handle:
        handle.write(os.urandom(8192))
    with open(name, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ)
        try:
            with open("/proc/self/maps", "rb") as maps:
                raw = maps.read()
        finally:
            mapped.close()
    assert name in raw  # the kernel's own record of the mapping
    paths = [os.fsencode(m.path) for m in process.parse_maps(raw)]
    assert name in paths
    [mine] = [m for m in process.parse_maps(raw) if os.fsencode(m.path) == name]
    assert mine.inode == os.stat(name).st_ino and not mine.deleted


def test_find_torch_finds_the_wheel_in_this_interpreters_site_packages():
    wheel = Path(sysconfig.get_paths()["purelib"]) / "torch"
    if not (wheel / "version.py").is_file():
        pytest.skip("the torch wheel is not installed in this interpreter")
    found = torch_ext.find_torch()
    assert found is not None and os.path.realpath(found.path) == os.path.realpath(wheel)
    # the version pip recorded for the wheel, read from its dist-info
    dist = [p for p in wheel.parent.glob("torch-*.dist-info")]
    if dist:
        version = next(line.split(":", 1)[1].strip() for line in (dist[0] / "METADATA").read_text().splitlines()
                       if line.startswith("Version:"))
        assert found.version == version
