"""read_elf(symbols=PREFIXES) reads only the dynamic symbols whose names start with a prefix:
the same symbols, judged against pyelftools' .dynsym, as a full read keeps."""
from __future__ import annotations

import os
import subprocess
import sysconfig

import pytest
from elftools.elf.elffile import ELFFile

from seedance.collect.cxxabi import TORCH_PREFIXES
from seedance.elf import read_elf

SITE = sysconfig.get_paths()["purelib"]


def pyelftools_names(path: str, prefixes: tuple) -> list:
    """(name, defined) of every non-local .dynsym entry starting with a prefix, in order."""
    with open(path, "rb") as handle:
        table = ELFFile(handle).get_section_by_name(".dynsym")
        return [(s.name, s["st_shndx"] != "SHN_UNDEF") for s in list(table.iter_symbols())[1:]
                if s["st_info"]["bind"] != "STB_LOCAL" and s.name.startswith(prefixes)]


def candidates() -> list:
    paths = [os.path.join(SITE, "torch", "lib", name) for name in ("libc10.so", "libshm.so",
                                                                     "libtorch_python.so")]
    paths += ["/usr/lib/x86_64-linux-gnu/libstdc++.so.6"]
    return [p for p in paths if os.path.exists(p)]


@pytest.mark.parametrize("path", candidates())
def test_prefixed_symbols_match_pyelftools(path):
    for prefixes in (TORCH_PREFIXES, ("_ZNSt", "_ZNKSt"), ("no_such_prefix",)):
        filtered = read_elf(path, symbols=prefixes).symbols
        assert [(s.name, s.defined) for s in filtered] == pyelftools_names(path, prefixes)
        full = read_elf(path, symbols=True).symbols
        assert filtered == tuple(s for s in full if s.name.startswith(prefixes))


def test_a_name_inside_a_longer_string_is_found(tmp_path):
    # GNU ld merges string tails: _ZN3c103fooEv is stored inside Q_ZN3c103fooEv, so the
    # symbol's name offset points into the middle of another string.
    source = tmp_path / "t.c"
    source.write_text('int a(void) __asm__("Q_ZN3c103fooEv");\nint a(void) { return 1; }\n'
                      'int b(void) __asm__("_ZN3c103fooEv");\nint b(void) { return 2; }\n'
                      'extern int c(void) __asm__("_ZN2at3barEv");\nint d(void) { return c(); }\n')
    lib = tmp_path / "libt.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    dynstr = subprocess.run(["readelf", "-p", ".dynstr", str(lib)], capture_output=True, text=True,
                            errors="replace").stdout
    assert "Q_ZN3c103fooEv" in dynstr
    filtered = read_elf(str(lib), symbols=TORCH_PREFIXES).symbols
    assert sorted((s.name, s.defined) for s in filtered) == sorted(pyelftools_names(str(lib), TORCH_PREFIXES))
    assert ("_ZN3c103fooEv", True) in [(s.name, s.defined) for s in filtered]
