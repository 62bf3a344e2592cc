"""read_elf against pyelftools, the reference, on real objects of this host and on fixtures.

Our reader works from PT_DYNAMIC; pyelftools works from section headers.  Where both can
read a file they must agree on everything the loader uses.  Removing the section headers
must not change what our reader sees.
"""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sysconfig

import pytest
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

from seedance.elf import is_elf, read_elf
from seedance.model.errors import ELFError

SYSTEM = "/usr/lib/x86_64-linux-gnu"


def sample(count: int = 30) -> list:
    files = []
    for name in sorted(os.listdir(SYSTEM)):
        path = os.path.join(SYSTEM, name)
        if ".so" in name and os.path.isfile(path) and not os.path.islink(path) and is_elf(path):
            files.append(path)
    step = max(1, len(files) // count)
    chosen = files[::step][:count]
    site = sysconfig.get_paths()["purelib"]
    for extra in ("torch/lib/libc10.so", "torch/lib/libshm.so", "nvidia/cuda_runtime/lib/libcudart.so.12"):
        if os.path.exists(os.path.join(site, extra)):
            chosen.append(os.path.join(site, extra))
    for exe in ("/usr/bin/curl", "/usr/bin/python3.11"):
        if os.path.exists(exe):
            chosen.append(exe)
    return chosen


def reference(path: str) -> dict:
    """What pyelftools says about the loader-relevant parts of ``path``."""
    with open(path, "rb") as handle:
        elf = ELFFile(handle)
        out = {"needed": [], "soname": None, "rpath": (), "runpath": (), "flags": 0, "flags_1": 0,
               "interpreter": None, "verneed": [], "verdef": [], "symbols": []}
        for seg in elf.iter_segments():
            if seg["p_type"] == "PT_INTERP":
                out["interpreter"] = seg.get_interp_name()
        for section in elf.iter_sections():
            if isinstance(section, DynamicSection):
                for tag in section.iter_tags():
                    kind = tag.entry.d_tag
                    if kind == "DT_NEEDED":
                        out["needed"].append(tag.needed)
                    elif kind == "DT_SONAME":
                        out["soname"] = tag.soname
                    elif kind == "DT_RPATH":
                        out["rpath"] = tuple(tag.rpath.split(":"))
                    elif kind == "DT_RUNPATH":
                        out["runpath"] = tuple(tag.runpath.split(":"))
                    elif kind == "DT_FLAGS":
                        out["flags"] = tag.entry.d_val
                    elif kind == "DT_FLAGS_1":
                        out["flags_1"] = tag.entry.d_val
        names = {}
        verneed = elf.get_section_by_name(".gnu.version_r")
        if verneed is not None:
            for vn, auxes in verneed.iter_versions():
                versions = []
                for aux in auxes:
                    versions.append((aux.name, bool(aux["vna_flags"] & 2)))
                    names[aux["vna_other"] & 0x7FFF] = aux.name
                out["verneed"].append((vn.name, tuple(versions)))
        verdef = elf.get_section_by_name(".gnu.version_d")
        if verdef is not None:
            for vd, auxes in verdef.iter_versions():
                aux = next(iter(auxes))
                names[vd["vd_ndx"] & 0x7FFF] = aux.name
                if not vd["vd_flags"] & 1:
                    out["verdef"].append(aux.name)
        dynsym = elf.get_section_by_name(".dynsym")
        versym = elf.get_section_by_name(".gnu.version")
        if dynsym is not None:
            for index, sym in enumerate(dynsym.iter_symbols()):
                if index == 0 or sym["st_info"]["bind"] == "STB_LOCAL":
                    continue
                version = None
                if versym is not None:
                    ndx = versym.get_symbol(index)["ndx"]
                    ndx = ndx if isinstance(ndx, int) else {"VER_NDX_LOCAL": 0, "VER_NDX_GLOBAL": 1}[ndx]
                    if (ndx & 0x7FFF) > 1:
                        version = names.get(ndx & 0x7FFF)
                out["symbols"].append((sym.name, sym["st_shndx"] != "SHN_UNDEF",
                                       sym["st_info"]["bind"][4:], version))
    return out


def ours(info) -> dict:
    binding = {"GLOBAL": "GLOBAL", "WEAK": "WEAK", "UNIQUE": "LOOS"}
    return {"needed": list(info.needed), "soname": info.soname, "rpath": info.rpath,
            "runpath": info.runpath, "flags": info.flags, "flags_1": info.flags_1,
            "interpreter": info.interpreter,
            "verneed": [(n.file, n.versions) for n in info.version_needs],
            "verdef": list(info.version_defs),
            "symbols": [(s.name, s.defined, binding.get(s.binding, s.binding), s.version)
                        for s in info.symbols]}


@pytest.mark.parametrize("path", sample())
def test_agrees_with_pyelftools(path):
    assert ours(read_elf(path, symbols=True)) == reference(path)


def strip_section_headers(src: str, dst) -> None:
    data = bytearray(open(src, "rb").read())
    assert data[4] == 2  # 64-bit layout below
    struct.pack_into("<Q", data, 0x28, 0)  # e_shoff
    struct.pack_into("<HHH", data, 0x3A, 0, 0, 0)  # e_shentsize, e_shnum, e_shstrndx
    dst.write_bytes(bytes(data))


@pytest.mark.parametrize("path", sample(8))
def test_same_answer_without_section_headers(path, tmp_path):
    if open(path, "rb").read(5)[4] != 2:
        pytest.skip("64-bit objects only")
    stripped = tmp_path / os.path.basename(path)
    strip_section_headers(path, stripped)
    full, bare = read_elf(path, symbols=True), read_elf(str(stripped), symbols=True)
    assert not bare.has_sections
    for field in ("needed", "soname", "rpath", "runpath", "flags", "flags_1", "version_needs",
                  "version_defs", "interpreter", "build_id"):
        assert getattr(bare, field) == getattr(full, field), field
    assert {s.name for s in bare.symbols} == {s.name for s in full.symbols}


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_fixture_with_versions_rpath_runpath_and_nodeflib(tmp_path):
    (tmp_path / "v.map").write_text("V1 { global: f1; local: *; };\nV2 { global: f2; } V1;\n")
    (tmp_path / "v.c").write_text("int f1(void){return 1;} int f2(void){return 2;}\n"
                                  "int weakref(void) __attribute__((weak));\n"
                                  "int g(void){return weakref ? weakref() : 0;}\n")
    lib = tmp_path / "libv.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", lib, tmp_path / "v.c", "-Wl,-soname,libv.so.1",
                    f"-Wl,--version-script,{tmp_path / 'v.map'}", "-Wl,-z,nodefaultlib",
                    "-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN/a:/b"], check=True)
    info = read_elf(str(lib), symbols=True)
    assert ours(info) == reference(str(lib))
    assert info.soname == "libv.so.1" and info.nodeflib and info.runpath == ("$ORIGIN/a", "/b")
    assert set(info.version_defs) == {"V1", "V2"}
    by_name = {s.name: s for s in info.symbols}
    assert by_name["f2"].version == "V2" and by_name["f2"].defined
    assert by_name["weakref"].binding == "WEAK" and not by_name["weakref"].defined


def test_non_elf_and_unreadable(tmp_path):
    text = tmp_path / "text"
    text.write_text("hello, this is not an ELF file at all\n")
    with pytest.raises(ELFError, match="not an ELF"):
        read_elf(str(text))
    with pytest.raises(ELFError):
        read_elf(str(tmp_path / "missing"))
    with pytest.raises(ELFError):
        read_elf(str(tmp_path))  # a directory
    assert not is_elf(str(text)) and not is_elf(str(tmp_path / "missing"))
