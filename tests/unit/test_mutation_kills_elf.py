"""Tests written for the mutants of agent/elf/ that the suite let through (bench/run_mutation.py,
bench/mutation-survivors.md): the ELF sniff on real objects, and the DT_GNU_HASH symbol
count ld.so uses when an object has no section headers, on a gcc-built library whose hash
table is located by pyelftools (the reference) and then damaged field by field."""
from __future__ import annotations

import shutil
import struct
import subprocess
import sys

import pytest
from elftools.elf.elffile import ELFFile

from seedance.elf import is_elf, read_elf
from seedance.errors import ELFError

SOURCE = "".join(f"int seedance_fn_{i}(int x) {{ return x + {i}; }}\n" for i in range(12))


@pytest.fixture(scope="module")
def gnu_lib(tmp_path_factory):
    """A real 64-bit library with only a DT_GNU_HASH table, and where pyelftools finds it."""
    if not shutil.which("gcc"):
        pytest.skip("gcc not found")
    tmp = tmp_path_factory.mktemp("gnuhash")
    (tmp / "f.c").write_text(SOURCE)
    lib = tmp / "libf.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,--hash-style=gnu", "-o", str(lib), str(tmp / "f.c")],
                   check=True)
    with open(lib, "rb") as handle:
        elf = ELFFile(handle)
        section = elf.get_section_by_name(".gnu.hash")
        dynsym = elf.get_section_by_name(".dynsym")
        assert section is not None and elf.get_section_by_name(".hash") is None
        return {"path": lib, "offset": section["sh_offset"], "dynsym_count": dynsym.num_symbols(),
                "names": {s.name for s in dynsym.iter_symbols() if s["st_shndx"] != "SHN_UNDEF" and s.name}}


def bare_copy(gnu_lib, tmp_path, **fields) -> tuple:
    """The library without section headers (so the reader must count symbols through
    DT_GNU_HASH, as ld.so does), with header fields of the hash table replaced."""
    data = bytearray(gnu_lib["path"].read_bytes())
    struct.pack_into("<Q", data, 0x28, 0)  # e_shoff
    struct.pack_into("<HHH", data, 0x3A, 0, 0, 0)  # e_shentsize, e_shnum, e_shstrndx
    off = gnu_lib["offset"]
    nbuckets, symoffset, bloom, shift = struct.unpack_from("<IIII", data, off)
    values = {"nbuckets": nbuckets, "symoffset": symoffset, "bloom": bloom, "shift": shift}
    buckets = off + 16 + bloom * 8
    if fields.pop("pad_to_4", False):
        data += b"\0" * (-len(data) % 4)
    for name, value in fields.items():
        values[name] = value(len(data), buckets) if callable(value) else value
    struct.pack_into("<IIII", data, off, values["nbuckets"], values["symoffset"], values["bloom"], values["shift"])
    out = tmp_path / "bare.so"
    out.write_bytes(bytes(data))
    return str(out), values


def test_is_elf_is_true_for_real_objects_and_false_for_others(gnu_lib, tmp_path):
    for path in (str(gnu_lib["path"]), sys.executable):
        with open(path, "rb") as handle:
            ELFFile(handle)  # the reference parses it: it is ELF
        assert is_elf(path) is True, path
    text = tmp_path / "notes.txt"
    text.write_text("ELF is not at the start of this file\n")
    assert is_elf(str(text)) is False
    assert is_elf(str(tmp_path / "missing")) is False


def test_gnu_hash_count_gives_every_dynamic_symbol_without_section_headers(gnu_lib, tmp_path):
    bare, _ = bare_copy(gnu_lib, tmp_path)
    info = read_elf(bare, symbols=True)
    assert not info.has_sections
    # the null symbol at index 0 is not reported
    assert len(info.symbols) == gnu_lib["dynsym_count"] - 1
    assert {f"seedance_fn_{i}" for i in range(12)} <= set(info.defined_symbols())


def test_bucket_count_past_the_end_of_the_file_is_malformed(gnu_lib, tmp_path):
    # 0x80000000 buckets: negative if the header were read as signed
    bare, _ = bare_copy(gnu_lib, tmp_path, nbuckets=0x80000000)
    with pytest.raises(ELFError) as caught:
        read_elf(bare, symbols=True)
    assert str(caught.value) == f"{bare}: malformed ELF: DT_GNU_HASH buckets past end of file"


def test_buckets_ending_one_word_past_the_file_are_malformed(gnu_lib, tmp_path):
    bare, _ = bare_copy(gnu_lib, tmp_path, pad_to_4=True,
                        nbuckets=lambda size, buckets: (size - buckets) // 4 + 1)
    with pytest.raises(ELFError) as caught:
        read_elf(bare, symbols=True)
    assert str(caught.value).endswith("malformed ELF: DT_GNU_HASH buckets past end of file")


def test_buckets_ending_exactly_at_the_end_of_the_file_fit(gnu_lib, tmp_path):
    # the buckets fit (the check is "past the end", not "at"); what follows them is garbage,
    # so a later read may still fail, but never as "buckets past end of file"
    bare, _ = bare_copy(gnu_lib, tmp_path, pad_to_4=True, nbuckets=lambda size, buckets: (size - buckets) // 4)
    try:
        read_elf(bare, symbols=True)
    except ELFError as exc:
        assert "buckets past end of file" not in str(exc)


def test_no_buckets_means_only_the_unhashed_symbols(gnu_lib, tmp_path):
    # nbuckets 0: no symbol is reachable through the hash, so the table holds symoffset
    # entries; symoffset 1 is the null symbol alone
    bare, _ = bare_copy(gnu_lib, tmp_path, nbuckets=0, symoffset=1)
    assert read_elf(bare, symbols=True).symbols == ()


# -- fatbin: what a driver can JIT, written from NVIDIA's tables, not read from the module ----
# PTX ISA release notes (docs.nvidia.com/cuda/parallel-thread-execution, "Release Notes"):
# the newest PTX ISA each toolkit/driver release understands.
@pytest.mark.parametrize("cuda, isa", [
    ((10, 2), None),       # older than any release seedance knows: unknown, not a guess
    ((11, 0), (7, 0)), ((11, 8), (7, 8)), ((12, 0), (8, 0)), ((12, 5), (8, 5)),
    ((12, 6), (8, 5)),     # CUDA 12.6 shipped no new PTX ISA
    ((12, 8), (8, 7)), ((13, 0), (9, 0)),
])
def test_ptx_isa_a_driver_can_jit(cuda, isa):
    from seedance.elf import fatbin

    assert fatbin.ptx_isa_for_cuda(cuda) == isa


# ptxas: 'a' PTX compiles only for exactly its architecture; 'f' PTX within its family
# (same major) at or above it; plain PTX to anything at or above it.
@pytest.mark.parametrize("arch, variant, target, jits", [
    (100, "f", 100, True), (100, "f", 103, True), (103, "f", 103, True), (103, "f", 100, False),
    (100, "f", 110, False), (100, "f", 90, False),
    (90, "a", 90, True), (90, "a", 100, False), (90, "", 100, True), (90, "", 89, False),
])
def test_which_targets_ptx_jits_to(arch, variant, target, jits):
    from seedance.elf import fatbin

    entry = fatbin.FatbinEntry("ptx", arch, variant, False, 0)
    assert fatbin.ptx_jits_to(entry, target) is jits
