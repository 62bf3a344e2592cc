"""hwcaps subdirectories, $PLATFORM and the search-path expansion against the real ld.so.

Oracles: `ld.so --help` (which glibc-hwcaps and legacy subdirectories it searches on this
CPU) and `LD_DEBUG=libs` (the exact expanded search path it builds from LD_LIBRARY_PATH).
"""
from __future__ import annotations

import os
import subprocess

import pytest

from seedance.resolve import Resolver, hwcaps
from seedance.resolve.resolver import ABIS, _Loaded, _origin_of

RTLD = "/lib64/ld-linux-x86-64.so.2"
pytestmark = pytest.mark.skipif(not os.path.exists(RTLD), reason="needs the x86-64 ld.so")


def rtld_help() -> str:
    return subprocess.run([RTLD, "--help"], capture_output=True, text=True).stdout


def help_section(text: str, title: str) -> list:
    section = text.split(title, 1)[1].split("\n\n", 1)[0]
    return [line.strip() for line in section.splitlines()[1:] if line.strip()]


def test_glibc_hwcaps_levels_match_ld_so_help():
    text = rtld_help()
    if "Subdirectories of glibc-hwcaps" not in text:
        pytest.skip("this glibc predates glibc-hwcaps")
    searched = [line.split()[0] for line in help_section(text, "Subdirectories of glibc-hwcaps")
                if "searched" in line]
    assert list(hwcaps.detect().hwcaps_subdirs) == searched


def test_platform_and_legacy_names_match_ld_so_help():
    text = rtld_help()
    caps = hwcaps.detect()
    if "Legacy HWCAP subdirectories" not in text:
        assert caps.legacy_subdirs == ()
        return
    lines = help_section(text, "Legacy HWCAP subdirectories")
    platform = [line.split()[0] for line in lines if "AT_PLATFORM" in line]
    names = {line.split()[0] for line in lines if "searched" in line}
    assert platform == [caps.platform]
    single = {d for d in caps.legacy_subdirs if "/" not in d}
    assert single == names


def test_system_search_path_matches_ld_so_help():
    lines = help_section(rtld_help(), "Shared library search path")
    dirs = [line.split()[0] for line in lines if "system search path" in line]
    assert [d.rstrip("/") for d in ABIS[(64, 62)].system_dirs] == dirs


def debug_search_path(llp: str, program: str = "/usr/bin/true") -> list:
    env = {"LD_DEBUG": "libs", "LD_LIBRARY_PATH": llp, "PATH": "/usr/bin:/bin"}
    err = subprocess.run([program], env=env, capture_output=True, text=True).stderr
    for line in err.splitlines():
        if "search path=" in line and "(LD_LIBRARY_PATH)" in line:
            value = line.split("search path=", 1)[1].rsplit("(LD_LIBRARY_PATH)", 1)[0].rstrip()
            return value.split(":")
    raise AssertionError(f"no LD_LIBRARY_PATH search path in LD_DEBUG output:\n{err[:2000]}")


@pytest.mark.parametrize("llp", [
    "/a/$ORIGIN/x:/b/$LIB/y:/c/${PLATFORM}z:/d/$ORIGINAL:/e/$FOO:/f/${LIB}",
    "/g//:/h/./:;/i",
    "/j/${ORIGIN}:/k/$PLATFORM/$LIB::/l",
    "/same:/same/:/m",
])
def test_ld_library_path_expansion_matches_ld_debug(llp):
    resolver = Resolver(env={"LD_LIBRARY_PATH": llp})
    abi = ABIS[(64, 62)]
    program = os.path.realpath("/usr/bin/true")
    main = _Loaded(program, resolver.read(program), [program], None, _origin_of(program), None,
                   is_main=True)
    dirs = resolver._path_list([llp], main, abi, separators=":;")
    ours = []
    for directory in dirs:
        for sub in resolver.caps.subdirs():
            ours.append((directory + sub).rstrip("/"))
        ours.append(directory.rstrip("/") if directory != "/" else "/")
    assert ours == debug_search_path(llp, program)
