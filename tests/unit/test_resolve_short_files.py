"""A NEEDED that finds a file shorter than an ELF header: the resolver's reason against ld.so's.

dl-load.c open_verify reads sizeof(ElfW(Ehdr)) bytes (64 for x86-64's ld.so) and stops the
search with "file too short" when fewer come back, before looking at e_ident.  The oracle
is the program itself, started for real: ld.so's own error line.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from seedance.resolve import Resolver

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or os.uname().machine != "x86_64",
                                reason="needs gcc on x86-64")


def _program_needing(tmp_path, soname: str):
    """A program with NEEDED soname (linked against a real stub, which is then replaced)."""
    good = tmp_path / "build"
    good.mkdir()
    (good / "s.c").write_text("int f(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(good / soname),
                    str(good / "s.c")], check=True, capture_output=True)
    (tmp_path / "m.c").write_text("int f(void); int main(void) { return f() - 1; }\n")
    program = tmp_path / "prog"
    subprocess.run(["gcc", "-o", str(program), str(tmp_path / "m.c"), str(good / soname)],
                   check=True, capture_output=True)
    return program


@pytest.mark.parametrize("size", [0, 19, 20, 40, 63])
def test_a_file_shorter_than_the_elf_header(tmp_path, size):
    soname = "libshortseed.so.1"
    program = _program_needing(tmp_path, soname)
    libdir = tmp_path / "lib"
    libdir.mkdir()
    # a real ELF identity, cut short: only the length can make ld.so refuse it
    ident = b"\x7fELF\x02\x01\x01" + b"\0" * 57
    (libdir / soname).write_bytes(ident[:size])
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "LD_LIBRARY_PATH": str(libdir)}
    run = subprocess.run([str(program)], capture_output=True, text=True, errors="replace", env=env, timeout=60)
    assert run.returncode == 127, run.stderr
    marker = f"{soname}: "
    assert marker in run.stderr, run.stderr
    ld_so_reason = run.stderr.split(marker, 1)[1].strip()

    closure = Resolver(env={"LD_LIBRARY_PATH": str(libdir)}).closure(str(program))
    res = next(r for r in closure.resolutions if r.name == soname)
    assert res.path is None  # ld.so stops there: the program does not start
    reasons = dict(res.tried)
    assert reasons[str(libdir / soname)] == ld_so_reason, (res.tried, run.stderr)
