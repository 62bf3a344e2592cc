import os
import shutil
import subprocess

import pytest

from seedance.collect import host


@pytest.mark.skipif(shutil.which("ldconfig") is None and not os.path.exists("/sbin/ldconfig"),
                    reason="ldconfig not installed")
def test_ld_cache_paths_match_ldconfig():
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, check=True).stdout
    expected = {line.rsplit(" => ", 1)[1].strip() for line in out.splitlines() if " => " in line}
    assert set(host.ld_cache_paths()) == expected


def test_missing_cache_is_empty(tmp_path):
    assert host.ld_cache_paths(str(tmp_path / "none")) == []


def test_host_facts():
    facts = host.host_facts()
    assert facts["kernel"] == os.uname().release
    assert facts["glibc"] == os.confstr("CS_GNU_LIBC_VERSION")
    assert facts["cpu"]["count"] == os.cpu_count()


@pytest.mark.skipif(not os.path.isdir("/usr/local/cuda/lib64"), reason="no CUDA toolkit")
def test_cuda_dirs_include_toolkit_once():
    dirs = host.cuda_library_dirs()
    reals = [os.path.realpath(d) for d in dirs]
    assert os.path.realpath("/usr/local/cuda/lib64") in reals
    assert len(reals) == len(set(reals))


def test_config_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert host.config_dir() == str(tmp_path / "seedance")
