"""open_verify on a candidate the resolver has already parsed (it then takes e_ident and
e_machine from that parse, not from a second read of the header) against a resolver that
reads the header: the same verdict for every candidate.  The candidates are the host's own
libraries, and copies altered as ld.so sees them: another e_machine (skipped), an ELF
executable, and a big-endian EI_DATA that the readers still parse.  ld.so itself is the
oracle for the altered machine: a program whose library is that copy fails to start."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from seedance.model.errors import ELFError
from seedance.resolve import ABIS, Resolver

ABI = ABIS[(64, 62)]
LIBZ = "/usr/lib/x86_64-linux-gnu/libz.so.1"
pytestmark = pytest.mark.skipif(os.uname().machine != "x86_64" or not os.path.exists(LIBZ),
                                reason="needs x86-64 and libz")


def verdicts(paths):
    """(header read, after a parse) verdicts of each path, each from a fresh resolver."""
    out = []
    for path in paths:
        cold = Resolver(env={})._open_verify(path, ABI)
        warm = Resolver(env={})
        try:
            warm.read(path)
        except ELFError:
            pass
        out.append((cold, warm._open_verify(path, ABI)))
    return out


def norm(verdict):
    kind, detail = verdict
    return (kind, detail if kind != "ok" else (detail.path, detail.soname, detail.needed))


def test_the_host_libraries_get_the_same_verdict():
    base = "/usr/lib/x86_64-linux-gnu"
    paths = sorted(os.path.join(base, n) for n in os.listdir(base) if ".so" in n)[:300] + ["/bin/ls", "/etc/passwd"]
    for path, (cold, warm) in zip(paths, verdicts(paths)):
        assert norm(cold) == norm(warm), path


def _altered(tmp_path, name, offset, data):
    copy = tmp_path / name
    shutil.copyfile(LIBZ, copy)
    with open(copy, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)
    return str(copy)


def test_altered_headers_get_the_same_verdict(tmp_path):
    paths = [_altered(tmp_path, "machine.so", 18, (183).to_bytes(2, "little")),  # EM_AARCH64
             _altered(tmp_path, "exec.so", 16, (2).to_bytes(2, "little")),  # ET_EXEC
             _altered(tmp_path, "bigendian.so", 5, b"\x02")]
    got = verdicts(paths)
    for path, (cold, warm) in zip(paths, got):
        assert norm(cold) == norm(warm), path
    assert got[0][1] == ("skip", "wrong machine: e_machine 183")


def test_ld_so_skips_the_library_of_another_machine(tmp_path):
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    libdir = tmp_path / "lib"
    libdir.mkdir()
    (tmp_path / "m.c").write_text("int zlibVersion(void); int main(void) { return !zlibVersion(); }\n")
    program = tmp_path / "prog"
    subprocess.run(["gcc", "-o", str(program), str(tmp_path / "m.c"), "-lz", f"-Wl,-rpath,{libdir}"],
                   check=True, capture_output=True)
    _altered(libdir, "libz.so.1", 18, (183).to_bytes(2, "little"))
    warm = Resolver(env={})
    warm.read(str(libdir / "libz.so.1"))
    res = warm.closure(str(program))
    mine = [r for r in res.resolutions if r.name == "libz.so.1"][0]
    assert (str(libdir / "libz.so.1"), "wrong machine: e_machine 183") in mine.tried
    # ld.so skips the copy and loads the system's libz: the program runs
    run = subprocess.run([str(program)], capture_output=True, env={"LD_DEBUG": "libs"}, errors="replace", text=True)
    assert run.returncode == 0
    assert mine.path is not None and mine.path in run.stderr
