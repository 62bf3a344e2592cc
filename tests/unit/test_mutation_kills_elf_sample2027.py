"""Kill tests for the survivors of agent/elf's seeded mutation sample (80 mutants, seed
2027; issue 17) that tests/unit/test_elf_fastread.py does not already kill.

Every test calls the code in-process (mutmut counts only in-process calls) with real
inputs and an oracle from outside seedance:
  * build_fastelf: the real compiler (a compiler that fails must fail the build by hand,
    and must not fail a setuptools install: the extension is optional) and the built
    module loaded in a child, its ABI against fastelf.h's #define;
  * properties: gcc/ld-built objects whose GNU property notes readelf -n decodes, and
    ld.so --help's list of the levels this CPU supports;
  * fatbin_payload.lz4_block: blocks written by the real lz4 library;
  * reader: a real versioned library (pyelftools, the reference reader, and readelf), and
    small objects laid out by hand here, where the expected answer is what was written.
"""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys

import pytest

from seedance.elf import build_fastelf, fatbin_payload, properties, reader
from seedance.model.errors import ELFError
from tests.conftest import ld_so_hwcaps_levels

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("readelf") is None,
                               reason="needs gcc and readelf")
needs_x86_64 = pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64 ISA-level notes")

# binutils include/elf/common.h (GNU_PROPERTY_X86_ISA_1_*), as the x86-64 psABI names them
ISA_BITS = {"x86-64-baseline": 1 << 0, "x86-64-v2": 1 << 1, "x86-64-v3": 1 << 2, "x86-64-v4": 1 << 3}


@pytest.fixture
def python_reader(monkeypatch):
    """reader.py itself (the C reader answers read_elf when built)."""
    monkeypatch.setenv("SEEDANCE_ELF_READER", "python")


def _run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=60, **kw)


# --- build_fastelf ----------------------------------------------------------------------

@needs_gcc
def test_build_standalone_builds_a_module_the_interpreter_loads(tmp_path):
    built = build_fastelf.build_standalone(str(tmp_path))
    assert os.path.dirname(built) == str(tmp_path) and os.listdir(tmp_path) == [os.path.basename(built)]
    header = (build_fastelf.HERE / "fastelf.h").read_text()
    abi = int(next(line.split()[2] for line in header.splitlines() if line.startswith("#define SD_FASTELF_ABI ")))
    child = _run([sys.executable, "-c",
                  "import importlib.util, sys\n"
                  "spec = importlib.util.spec_from_file_location('seedance.elf._fastelf', sys.argv[1])\n"
                  "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
                  "print(module.lib.sd_fastelf_abi())", built])
    assert child.returncode == 0, child.stderr
    assert int(child.stdout) == abi


def test_build_standalone_reports_a_failing_compiler(tmp_path):
    failing = shutil.which("false")
    if failing is None:
        pytest.skip("no false(1)")
    with pytest.raises(subprocess.CalledProcessError):
        build_fastelf.build_standalone(str(tmp_path), cc=failing)
    assert os.listdir(tmp_path) == []  # no half-built module left where an import would find it


def test_extension_is_optional_so_an_install_without_a_compiler_still_succeeds(tmp_path, monkeypatch):
    from setuptools import Distribution
    from setuptools.command.build_ext import build_ext

    ext = build_fastelf.extension()
    # its paths are relative to the project root (setup.py's directory)
    assert all(os.path.isfile(os.path.join(build_fastelf.ROOT, p)) for p in [*ext.sources, *ext.depends])
    monkeypatch.chdir(build_fastelf.ROOT)
    monkeypatch.setenv("CC", shutil.which("false") or "/bin/false")
    monkeypatch.setenv("LDSHARED", shutil.which("false") or "/bin/false")
    cmd = build_ext(Distribution({"name": "seedance-probe", "ext_modules": [ext]}))
    cmd.build_lib, cmd.build_temp = str(tmp_path / "lib"), str(tmp_path / "tmp")
    cmd.ensure_finalized()
    cmd.run()  # a required extension raises CompileError here
    assert not list((tmp_path / "lib").rglob("_fastelf*"))


# --- fastread --------------------------------------------------------------------------------

def test_prefix_cache_stays_bounded_for_a_long_lived_process(monkeypatch):
    """Each distinct prefix tuple is encoded once and kept, up to 64 of them: a process that
    asks with ever new prefix sets must not grow without bound (fastread._prefixes)."""
    from seedance.elf import fastread

    loaded = fastread._load()
    if not loaded:
        pytest.skip("seedance.elf._fastelf is not built")
    ffi = loaded[0]
    monkeypatch.setattr(fastread, "_prefix_cache", {})
    for n in range(100):
        prefix_bytes, prefix_lens, count = fastread._prefixes(ffi, (f"_ZN{n}", "_ZNK\udcff"))
        # what C is handed: the prefixes' bytes back to back, each one's length, their count
        assert ffi.unpack(prefix_bytes, len(f"_ZN{n}") + 5) == f"_ZN{n}".encode() + b"_ZNK\xff"
        assert (list(ffi.unpack(prefix_lens, 2)), count) == ([len(f"_ZN{n}"), 5], 2)
    assert len(fastread._prefix_cache) == 64


# --- properties: x86 ISA level notes -------------------------------------------------------

def _readelf_isa_mask(path) -> int:
    notes = _run(["readelf", "-n", str(path)]).stdout
    mask = 0
    for line in notes.splitlines():
        if "x86 ISA needed:" in line:
            for name in line.split("x86 ISA needed:")[1].split(","):
                mask |= ISA_BITS[name.strip()]
    return mask


def _lib(tmp_path, name, *extra):
    (tmp_path / "l.c").write_text("int f(void) { return 4; }\n")
    out = tmp_path / name
    done = _run(["gcc", "-shared", "-fPIC", "-o", str(out), str(tmp_path / "l.c"), *extra])
    if done.returncode != 0:
        pytest.skip(f"this toolchain cannot build it: {done.stderr.strip()[:200]}")
    return out


def _property_segment(path) -> tuple:
    """(offset, size) of PT_GNU_PROPERTY, as readelf -l lists it."""
    for line in _run(["readelf", "-lW", str(path)]).stdout.splitlines():
        words = line.split()
        if words and words[0] == "GNU_PROPERTY":
            return int(words[1], 16), int(words[4], 16)
    pytest.skip("the linker wrote no PT_GNU_PROPERTY")


STACK_NOTE = """\
\t.section .note.gnu.property,"a"
\t.p2align 3
\t.long 4, 16, 5          /* namesz, descsz, NT_GNU_PROPERTY_TYPE_0 */
\t.asciz "GNU"
\t.long 1, 8              /* GNU_PROPERTY_STACK_SIZE: 8 bytes of data in ELFCLASS64 */
\t.quad 0x10000000000
\t.section .note.GNU-stack,"",@progbits
"""


@needs_gcc
@needs_x86_64
def test_a_property_with_eight_bytes_of_data_before_the_isa_level(tmp_path):
    """ld merges a GNU_PROPERTY_STACK_SIZE (8-byte datum) into the note ahead of the ISA
    level: the walk must step over it by its padded size."""
    (tmp_path / "stack.s").write_text(STACK_NOTE)
    path = _lib(tmp_path, "libstack.so", "-Wl,-z,x86-64-v3", str(tmp_path / "stack.s"))
    notes = _run(["readelf", "-n", str(path)]).stdout
    if "stack size: 0x10000000000" not in notes:
        pytest.skip(f"ld did not keep the stack size property: {notes[:300]}")
    assert _readelf_isa_mask(path) == ISA_BITS["x86-64-v3"]
    assert properties.x86_isa_needed(str(path)) == ISA_BITS["x86-64-v3"]


@needs_gcc
@needs_x86_64
@pytest.mark.parametrize("level", ["x86-64-v2", "x86-64-v3", "x86-64-v4"])
def test_x86_isa_needed_is_what_readelf_decodes(tmp_path, level):
    path = _lib(tmp_path, "libisa.so", f"-Wl,-z,{level}")
    expected = _readelf_isa_mask(path)
    if not expected:
        pytest.skip(f"the linker recorded no ISA level for -z {level}")
    assert properties.x86_isa_needed(str(path)) == expected
    assert level in properties.level_names(expected)


@needs_gcc
@needs_x86_64
def test_no_isa_note_is_no_need(tmp_path):
    path = _lib(tmp_path, "libplain.so")
    assert _readelf_isa_mask(path) == 0
    assert properties.x86_isa_needed(str(path)) == 0


@needs_gcc
@needs_x86_64
@pytest.mark.parametrize("patch", ["owner", "type"])
def test_only_gnu_property_notes_carry_the_level(tmp_path, patch):
    """The same note with another owner name, or the GNU owner with another note type, is
    no ISA level (readelf -n then decodes no "x86 ISA needed")."""
    path = _lib(tmp_path, "libisa.so", "-Wl,-z,x86-64-v3")
    assert properties.x86_isa_needed(str(path)) == ISA_BITS["x86-64-v3"] == _readelf_isa_mask(path)
    offset, _size = _property_segment(path)
    data = bytearray(path.read_bytes())
    namesz, _descsz, n_type = struct.unpack_from("<III", data, offset)
    assert (namesz, n_type, bytes(data[offset + 12:offset + 16])) == (4, 5, b"GNU\0")
    if patch == "owner":
        data[offset + 12:offset + 16] = b"XYZ\0"
    else:
        struct.pack_into("<I", data, offset + 8, 0x99)
    path.write_bytes(bytes(data))
    assert _readelf_isa_mask(path) == 0
    assert properties.x86_isa_needed(str(path)) == 0


def test_cpu_isa_mask_of_the_levels_ld_so_searches():
    levels = ld_so_hwcaps_levels()
    searched = [name for name, words in levels.items() if "searched" in words]
    expected = ISA_BITS["x86-64-baseline"]
    for name in searched:
        expected |= ISA_BITS[name]
    assert properties.cpu_isa_mask(searched) == expected
    # and regardless of this CPU: every level named, in any order, plus the baseline
    assert properties.cpu_isa_mask(["x86-64-v3", "x86-64-v2"]) == 0b0111
    assert properties.cpu_isa_mask(("x86-64-v4", "x86-64-v2", "x86-64-v3")) == 0b1111
    assert properties.cpu_isa_mask([]) == 0b0001


# --- fatbin_payload.lz4_block -------------------------------------------------------------

def test_lz4_block_followed_by_zero_padding():
    """A block written by the real lz4 library, padded with zeros to the container's
    8-byte alignment: the last sequence is literals only, and the bytes after it are no
    sequence to decode."""
    lz4_block = pytest.importorskip("lz4.block")
    original = b"".join(b"sm_%d kernel %d\n" % (i % 7, i) for i in range(300)) + b"tail literals"
    stored = lz4_block.compress(original, store_size=False)
    for pad in (1, 3, 8):
        assert fatbin_payload.lz4_block(stored + b"\0" * pad, len(original)) == original
    assert fatbin_payload.lz4_block(stored, len(original)) == original


# --- reader.py ------------------------------------------------------------------------------

BASE = 0x10000
DT = dict(NULL=0, NEEDED=1, HASH=4, STRTAB=5, SYMTAB=6, STRSZ=10, SYMENT=11, SONAME=14,
          VERSYM=0x6FFFFFF0, VERDEF=0x6FFFFFFC, VERDEFNUM=0x6FFFFFFD)
# (name, bind, type, defined, versym) after the null symbol; versym 2/3 are V1/V2 below,
# 0x8000 the hidden bit
HAND_SYMBOLS = (("g1", 1, 2, True, 2), ("g2", 1, 1, True, 0x8003), ("u1", 2, 2, False, 1), ("loc", 0, 2, True, 0),
                ("g3", 1, 2, True, 3))


def _expected(symbols=HAND_SYMBOLS, versions=True) -> list:
    """HAND_SYMBOLS as read_elf reports them (the LOCAL one left out)."""
    names = {2: "V1", 3: "V2"}
    return [(name, defined, {1: "GLOBAL", 2: "WEAK"}[bind], {1: "OBJECT", 2: "FUNC"}[kind],
             names.get(ver & 0x7FFF) if versions else None, bool(ver & 0x8000) if versions else False)
            for name, bind, kind, defined, ver in symbols if bind]


def hand_elf(order=("dynstr", "verdef", "hash", "dynamic", "dynsym", "versym"), *, nchain=None,
             strsz=True, verdefnum=3, cut=0) -> bytes:
    """A little-endian ELF64 shared object without section headers: one PT_LOAD over the
    whole file at BASE, PT_DYNAMIC, and the dynamic tables in ``order``; the file ends
    with the last of them (less ``cut`` bytes)."""
    strtab = bytearray(b"\0")

    def string(text):
        strtab.extend(text.encode() + b"\0")
        return len(strtab) - len(text) - 1

    needed, soname = string("libc.so.6"), string("libhand.so.1")
    verdef = bytearray()
    for index, (name, flags) in enumerate((("libhand.so.1", 1), ("V1", 0), ("V2", 0))):
        verdef += struct.pack("<HHHHIII", 1, flags, index + 1, 1, 0, 20, 0 if index == 2 else 28)
        verdef += struct.pack("<II", string(name), 0)
    dynsym = bytearray(24)
    versym = bytearray(2)
    for name, bind, kind, defined, ver in HAND_SYMBOLS:
        dynsym += struct.pack("<IBBHQQ", string(name), bind << 4 | kind, 0, 7 if defined else 0, 0, 0)
        versym += struct.pack("<H", ver)
    count = len(HAND_SYMBOLS) + 1
    hash_table = struct.pack("<II", 1, nchain or count) + bytes(4 * (1 + count))
    blobs = {"dynstr": bytes(strtab), "verdef": bytes(verdef), "hash": hash_table, "dynsym": bytes(dynsym),
             "versym": bytes(versym)}
    dyn_size = 16 * (12 if strsz else 11)
    offset, layout = 64 + 2 * 56, {}
    for name in order:
        offset += -offset % 8
        layout[name] = offset
        offset += dyn_size if name == "dynamic" else len(blobs[name])
    entries = [(DT["NEEDED"], needed), (DT["SONAME"], soname), (DT["STRTAB"], BASE + layout["dynstr"]),
               (DT["SYMTAB"], BASE + layout["dynsym"]), (DT["SYMENT"], 24), (DT["HASH"], BASE + layout["hash"]),
               (DT["VERSYM"], BASE + layout["versym"]), (DT["VERDEF"], BASE + layout["verdef"]),
               (DT["VERDEFNUM"], verdefnum)]
    if strsz:
        entries.append((DT["STRSZ"], len(strtab)))
    entries += [(DT["NULL"], 0)] * 2
    blobs["dynamic"] = b"".join(struct.pack("<qQ", tag, value) for tag, value in entries)
    assert len(blobs["dynamic"]) == dyn_size
    out = bytearray(offset)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    out[:64] = struct.pack("<16sHHIQQQIHHHHHH", ident, 3, 62, 1, 0, 64, 0, 0, 64, 56, 2, 64, 0, 0)
    out[64:120] = struct.pack("<IIQQQQQQ", 1, 5, 0, BASE, BASE, offset, offset, 0x1000)
    out[120:176] = struct.pack("<IIQQQQQQ", 2, 6, layout["dynamic"], BASE + layout["dynamic"],
                               BASE + layout["dynamic"], dyn_size, dyn_size, 8)
    for name, at in layout.items():
        out[at:at + len(blobs[name])] = blobs[name]
    return bytes(out[:len(out) - cut])


def test_hand_built_object_reads_back(tmp_path, python_reader):
    path = tmp_path / "libhand.so"
    path.write_bytes(hand_elf())
    info = reader.read_elf(str(path), symbols=True)
    assert (info.needed, info.soname, info.version_defs) == (("libc.so.6",), "libhand.so.1", ("V1", "V2"))
    assert [(s.name, s.defined, s.binding, s.type, s.version, s.hidden) for s in info.symbols] == _expected()


def test_a_symbol_table_cut_short_reads_the_symbols_present(tmp_path, python_reader):
    """DT_HASH counts two symbols more than the file holds (the table ends the file)."""
    path = tmp_path / "libhand.so"
    path.write_bytes(hand_elf(("dynstr", "verdef", "hash", "dynamic", "versym", "dynsym"),
                              nchain=len(HAND_SYMBOLS) + 3))
    info = reader.read_elf(str(path), symbols=True)
    assert [(s.name, s.defined, s.binding, s.type, s.version, s.hidden) for s in info.symbols] == _expected()


def test_versym_table_that_ends_the_file_is_read(tmp_path, python_reader):
    """DT_VERSYM holds 2 bytes per symbol; a table that ends exactly at the end of the
    file is whole."""
    path = tmp_path / "libhand.so"
    path.write_bytes(hand_elf(("dynstr", "verdef", "hash", "dynamic", "dynsym", "versym")))
    info = reader.read_elf(str(path), symbols=True)
    assert [(s.name, s.version, s.hidden) for s in info.symbols] == [(e[0], e[4], e[5]) for e in _expected()]
    # one byte short of it: no versions at all rather than a half-read table
    path.write_bytes(hand_elf(("dynstr", "verdef", "hash", "dynamic", "dynsym", "versym"), cut=1))
    info = reader.read_elf(str(path), symbols=True)
    assert [(s.name, s.version, s.hidden) for s in info.symbols] == [(e[0], None, False) for e in _expected()]


def test_without_dt_strsz_the_string_table_runs_to_the_end_of_the_file(tmp_path, python_reader):
    path = tmp_path / "libhand.so"
    path.write_bytes(hand_elf(("dynamic", "verdef", "hash", "dynsym", "versym", "dynstr"), strsz=False))
    info = reader.read_elf(str(path), symbols=True)
    assert (info.needed, info.soname, info.version_defs) == (("libc.so.6",), "libhand.so.1", ("V1", "V2"))
    assert [s.name for s in info.symbols] == [e[0] for e in _expected()]


def test_pt_dynamic_past_the_end_of_the_file_is_an_error(tmp_path, python_reader):
    path = tmp_path / "libhand.so"
    path.write_bytes(hand_elf(("dynstr", "verdef", "hash", "dynsym", "versym", "dynamic"), cut=8))
    with pytest.raises(ELFError) as caught:
        reader.read_elf(str(path))
    assert str(caught.value) == f"{path}: malformed ELF: PT_DYNAMIC past end of file"


@needs_gcc
def test_verdef_count_is_what_the_object_declares(tmp_path, python_reader):
    """A real library with version nodes V1 and V2 (and the base entry), its declared count
    lowered to 2 in both DT_VERDEFNUM and .gnu.version_d's sh_info: pyelftools and readelf
    then list the base entry and V1 only, and so must reader.py."""
    elffile = pytest.importorskip("elftools.elf.elffile")
    (tmp_path / "v.c").write_text("int v1(void){return 1;} int v2(void){return 2;}\n")
    (tmp_path / "v.map").write_text("V1 { global: v1; local: *; };\nV2 { global: v2; } V1;\n")
    path = tmp_path / "libver.so"
    _run(["gcc", "-shared", "-fPIC", "-o", str(path), str(tmp_path / "v.c"), "-Wl,-soname,libver.so",
          f"-Wl,--version-script,{tmp_path / 'v.map'}"], check=True)
    assert reader.read_elf(str(path)).version_defs == ("V1", "V2")
    data = bytearray(path.read_bytes())
    with open(path, "rb") as handle:
        elf = elffile.ELFFile(handle)
        shoff, shentsize = elf["e_shoff"], elf["e_shentsize"]
        index = next(i for i, s in enumerate(elf.iter_sections()) if s.name == ".gnu.version_d")
        dynamic = elf.get_section_by_name(".dynamic")
        dyn_off, dyn_size = dynamic["sh_offset"], dynamic["sh_size"]
    assert struct.unpack_from("<I", data, shoff + index * shentsize + 44)[0] == 3  # sh_info
    struct.pack_into("<I", data, shoff + index * shentsize + 44, 2)
    for at in range(dyn_off, dyn_off + dyn_size, 16):
        tag, value = struct.unpack_from("<qQ", data, at)
        if tag == DT["VERDEFNUM"]:
            assert value == 3
            struct.pack_into("<Q", data, at + 8, 2)
    path.write_bytes(bytes(data))
    with open(path, "rb") as handle:
        section = elffile.ELFFile(handle).get_section_by_name(".gnu.version_d")
        theirs = [next(aux).name for verdef, aux in section.iter_versions() if not verdef["vd_flags"] & 1]
    assert theirs == ["V1"]
    assert reader.read_elf(str(path)).version_defs == tuple(theirs)
