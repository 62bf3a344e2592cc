"""cpu-isa-level-unsupported against the real loader: a library marked (ld -z x86-64-vN)
with a level this CPU lacks, and the program that needs it started for real.

Oracles, both independent of seedance: ld.so's own list of the levels this CPU supports
(`ld.so --help`: "x86-64-v4 (supported, searched)"), and the program's exit status and
error line ("CPU ISA level is lower than required", glibc 2.33+ sysdeps/x86/dl-prop.h).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from tests.conftest import ld_so_hwcaps_levels, run_cli

RTLD = "/lib64/ld-linux-x86-64.so.2"
LEVELS = ("x86-64-v2", "x86-64-v3", "x86-64-v4")

pytestmark = pytest.mark.skipif(os.uname().machine != "x86_64" or shutil.which("gcc") is None
                                or not os.path.exists(RTLD), reason="needs gcc and x86-64's ld.so")


def _supported_levels() -> set:
    return {level for level, words in ld_so_hwcaps_levels(RTLD).items() if "supported" in words}


def _build(tmp_path, level: str):
    directory = tmp_path / level
    directory.mkdir()
    (directory / "l.c").write_text("int f(void) { return 4; }\n")
    (directory / "m.c").write_text("int f(void); int main(void) { return f() - 4; }\n")
    link = subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-z,{level}", "-Wl,-soname,libisaseed.so",
                           "-o", str(directory / "libisaseed.so"), str(directory / "l.c")],
                          capture_output=True, text=True, errors="replace")
    if link.returncode != 0:
        pytest.skip(f"this linker cannot mark an ISA level: {link.stderr.strip()[:200]}")
    note = subprocess.run(["readelf", "-n", str(directory / "libisaseed.so")], capture_output=True, text=True,
                          errors="replace").stdout
    if f"x86 ISA needed: {level}" not in note:
        pytest.skip(f"the linker did not record {level} (readelf -n: {note.strip()[:200]})")
    subprocess.run(["gcc", "-o", str(directory / "prog"), str(directory / "m.c"), f"-L{directory}",
                    "-lisaseed", "-Wl,-rpath,$ORIGIN"], check=True, capture_output=True)
    return directory


def _findings(directory):
    done = run_cli("check", "--json", str(directory))
    assert done.returncode in (0, 1), done.stderr
    return [f for f in json.loads(done.stdout)["findings"] if f["rule"] == "cpu-isa-level-unsupported"]


def test_a_level_this_cpu_lacks_is_an_error_as_ld_so_refuses_it(tmp_path):
    supported = _supported_levels()
    lacking = [level for level in LEVELS if level not in supported]
    if not lacking:
        pytest.skip(f"this CPU supports every level ({sorted(supported)}): nothing to lack")
    directory = _build(tmp_path, lacking[0])
    run = subprocess.run([str(directory / "prog")], capture_output=True, text=True, errors="replace", timeout=30)
    assert run.returncode == 127 and "CPU ISA level is lower than required" in run.stderr, run.stderr
    found = _findings(directory)
    assert [f["subject"]["path"] for f in found] == [str(directory / "libisaseed.so")]
    assert found[0]["severity"] == "error"
    assert found[0]["evidence"]["lacking"] == [lacking[0]]


def test_a_level_this_cpu_supports_is_not_reported(tmp_path):
    supported = _supported_levels()
    if not supported:
        pytest.skip("ld.so lists no supported x86-64-vN level on this CPU")
    directory = _build(tmp_path, sorted(supported)[-1])
    run = subprocess.run([str(directory / "prog")], capture_output=True, text=True, errors="replace", timeout=30)
    assert run.returncode == 0, run.stderr  # the loader takes it
    assert _findings(directory) == []


# An ISA_1_NEEDED bit no level has (a later level, or a crafted note): glibc refuses the
# object as it refuses a missing level; the check once failed on it with an IndexError.
UNKNOWN_BIT_NOTE = r"""
int f(void) { return 4; }
__asm__(".section .note.gnu.property,\"a\"\n.p2align 3\n"
        ".long 4\n.long 16\n.long 5\n.asciz \"GNU\"\n"
        ".long 0xc0008002\n.long 4\n.long 0x10\n.p2align 3\n.text\n");
"""


def test_a_bit_no_level_has_is_an_error_as_ld_so_refuses_it(tmp_path):
    (tmp_path / "l.c").write_text(UNKNOWN_BIT_NOTE)
    (tmp_path / "m.c").write_text("int f(void); int main(void) { return f() - 4; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libisaseed.so", "-o", str(tmp_path / "libisaseed.so"),
                    str(tmp_path / "l.c")], check=True, capture_output=True)
    note = subprocess.run(["readelf", "-n", str(tmp_path / "libisaseed.so")], capture_output=True, text=True,
                          errors="replace").stdout
    if "x86 ISA needed: <unknown: 10>" not in note:
        pytest.skip(f"the linker did not keep the crafted ISA note (readelf -n: {note.strip()[:200]})")
    subprocess.run(["gcc", "-o", str(tmp_path / "prog"), str(tmp_path / "m.c"), f"-L{tmp_path}", "-lisaseed",
                    "-Wl,-rpath,$ORIGIN"], check=True, capture_output=True)
    run = subprocess.run([str(tmp_path / "prog")], capture_output=True, text=True, errors="replace", timeout=30)
    if run.returncode == 0:
        pytest.skip("this ld.so loads an object needing an unknown ISA bit (glibc before 2.33 checks no level)")
    assert run.returncode == 127 and "CPU ISA level is lower than required" in run.stderr, run.stderr
    found = _findings(tmp_path)
    assert [f["subject"]["path"] for f in found] == [str(tmp_path / "libisaseed.so")]
    assert found[0]["severity"] == "error"
    assert found[0]["evidence"]["lacking"] == ["x86 ISA bit 0x10"]
