"""Tests written for the mutants of agent/elf/ that the suite let through (bench/run_mutation.py,
bench/mutation-survivors.md): the ELF sniff on real objects, and the DT_GNU_HASH symbol
count ld.so uses when an object has no section headers, on a gcc-built library whose hash
table is located by pyelftools (the reference) and then damaged field by field."""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from seedance.elf import is_elf, read_elf
from seedance.model.errors import ELFError

SOURCE = "".join(f"int seedance_fn_{i}(int x) {{ return x + {i}; }}\n" for i in range(12)) + \
    "#include <stdio.h>\nint seedance_say(const char *s) { return puts(s); }\n"  # a libc version need


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


# -- fatbin: architecture names as nvcc spells them (-arch=sm_90a, -gencode code=compute_100f) --
@pytest.mark.parametrize("text, parsed", [
    ("sm_90a", (90, "a")), ("compute_100f", (100, "f")), ("SM_86", (86, "")), ("sm90", (90, "")),
    ("compute86", (86, "")), ("compute_86", (86, "")), ("8.6", (86, "")), ("12.0", (120, "")),
    ("9.0a", (90, "a")), ("90", (90, "")), ("sm_10", (10, "")), ("sm_999", (999, "")),
])
def test_arch_names(text, parsed):
    from seedance.elf import fatbin

    assert fatbin.parse_arch(text) == parsed


@pytest.mark.parametrize("text", ["gfx90a", "sm_9", "sm_1000", "8.x", "x.6", "sm_", "", "sm_abc", "compute_9.0.1"])
def test_not_arch_names_say_so(text):
    from seedance.elf import fatbin

    with pytest.raises(ValueError) as caught:
        fatbin.parse_arch(text)
    assert str(caught.value) == f"not a GPU architecture: {text!r} (expected e.g. sm_90)"


# SASS: binary-compatible within a major at or above its minor; 'a' SASS only on exactly its
# architecture; 'f' SASS within its family (CUDA programming guide, "Binary Compatibility").
@pytest.mark.parametrize("arch, variant, target, runs", [
    (80, "", 86, True), (86, "", 89, True), (86, "", 90, False), (90, "", 86, False),
    (100, "a", 100, True), (100, "a", 103, False), (100, "f", 103, True), (100, "f", 110, False),
])
def test_where_sass_runs(arch, variant, target, runs):
    from seedance.elf import fatbin

    assert fatbin.sass_runs_on(fatbin.FatbinEntry("sass", arch, variant, False, 0), target) is runs


def _image(kind, arch, variant="", isa=(), note=""):
    from seedance.elf import fatbin

    return fatbin.FatbinEntry(kind, arch, variant, False, 0, isa=isa, note=note)


def test_what_the_driver_loads_from_a_module():
    from seedance.elf import fatbin

    sm90, sm86 = _image("sass", 90), _image("sass", 86)
    assert fatbin.choose_image([sm86, sm90], 90) == (sm90, "SASS sm_90", False)
    assert fatbin.choose_image([sm86], 89) == (sm86, "SASS sm_86 (binary-compatible)", False)
    ptx80 = _image("ptx", 80, isa=(7, 0))
    assert fatbin.choose_image([sm86, ptx80], 90, (8, 5)) == (ptx80, "PTX compute_80 JIT", False)
    assert fatbin.choose_image([sm90], 86) == (None, "no SASS for this arch and no PTX that JITs to it", False)
    assert fatbin.choose_image([], 86) == (None, "no SASS for this arch and no PTX that JITs to it", False)


def test_a_damaged_container_decides_before_any_image():
    from seedance.elf import fatbin

    damaged = _image("damaged", 0, note="container overruns .nv_fatbin")
    assert fatbin.choose_image([damaged, _image("sass", 90)], 90) == (None, "container overruns .nv_fatbin", False)


def test_ptx_too_new_for_the_driver_names_the_cuda_it_needs():
    from seedance.elf import fatbin

    new, old = _image("ptx", 90, isa=(9, 0)), _image("ptx", 80, isa=(7, 0))
    # a later PTX the driver can JIT still wins over one it cannot
    assert fatbin.choose_image([new, old], 90, (8, 5)) == (old, "PTX compute_80 JIT", False)
    # PTX ISA 9.0 came with CUDA 13.0 (PTX ISA release notes)
    assert fatbin.choose_image([new], 90, (8, 5)) == (
        None, "PTX compute_90 is ISA 9.0, which needs a driver for CUDA 13.0; the driver JITs up to ISA 8.5 "
              "(cudaErrorUnsupportedPtxVersion)", True)
    future = _image("ptx", 90, isa=(9, 9))
    assert fatbin.choose_image([future], 90, (8, 5)) == (
        None, "PTX compute_90 is ISA 9.9, which needs a driver for a newer CUDA; the driver JITs up to ISA 8.5 "
              "(cudaErrorUnsupportedPtxVersion)", True)


def test_weak_version_needs_read_as_weak(gnu_lib, tmp_path):
    """VER_FLG_WEAK (0x2) on a version need: ld.so only warns when such a version is missing.
    No library here carries one, so one is set in a gcc-built library, and pyelftools (the
    reference) says which needs are weak."""
    data = bytearray(gnu_lib["path"].read_bytes())
    with open(gnu_lib["path"], "rb") as handle:
        section = ELFFile(handle).get_section_by_name(".gnu.version_r")
        assert section is not None
        offset = section["sh_offset"]
    vn_aux = struct.unpack_from("<I", data, offset + 8)[0]  # Elf64_Verneed: version, cnt, file, aux, next
    flags_at = offset + vn_aux + 4  # Elf64_Vernaux: hash, flags, other, name, next
    struct.pack_into("<H", data, flags_at, struct.unpack_from("<H", data, flags_at)[0] | 0x2)
    weak = tmp_path / "libweak.so"
    weak.write_bytes(bytes(data))
    with open(weak, "rb") as handle:
        expected = [[(aux.name, bool(aux["vna_flags"] & 0x2)) for aux in auxes]
                    for _, auxes in ELFFile(handle).get_section_by_name(".gnu.version_r").iter_versions()]
    assert any(w for need in expected for _, w in need)  # the patch took
    assert [list(need.versions) for need in read_elf(str(weak)).version_needs] == expected


def test_rpath_build_id_and_a_non_utf8_soname_against_pyelftools(tmp_path):
    """DT_RPATH (not RUNPATH), the GNU build-id note, and a SONAME that is not UTF-8 (bytes
    come back through surrogateescape, never an exception), each compared with pyelftools."""
    if not shutil.which("gcc"):
        pytest.skip("gcc not found")
    (tmp_path / "r.c").write_text("int r(void){return 1;}\n")
    lib = tmp_path / "libr.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "r.c"), "-Wl,-soname,libr.so",
                    "-Wl,--build-id=sha1", "-Wl,--disable-new-dtags", "-Wl,-rpath,/opt/one:/opt/two"], check=True)
    with open(lib, "rb") as handle:
        elf = ELFFile(handle)
        dynamic = elf.get_section_by_name(".dynamic")
        rpath = next(t.rpath for t in dynamic.iter_tags() if t.entry.d_tag == "DT_RPATH")
        note = next(n for n in elf.get_section_by_name(".note.gnu.build-id").iter_notes())
        soname_at = elf.get_section_by_name(".dynstr")["sh_offset"] + \
            next(t.entry.d_val for t in dynamic.iter_tags() if t.entry.d_tag == "DT_SONAME")
    info = read_elf(str(lib))
    assert info.rpath == tuple(rpath.split(":")) and info.runpath == ()
    assert info.build_id == note["n_desc"]
    data = bytearray(lib.read_bytes())
    assert data[soname_at:soname_at + 8] == b"libr.so\0"
    data[soname_at + 3] = 0xFF  # "lib\xff.so"
    odd = tmp_path / "odd.so"
    odd.write_bytes(bytes(data))
    assert read_elf(str(odd)).soname.encode("utf-8", "surrogateescape") == b"lib\xff.so"


# -- second round (bench/mutation-survivors.md, "elf, second sample") ------------------------
def test_a_local_symbol_in_dynsym_is_not_a_definition_ld_so_would_bind_to(gnu_lib, tmp_path):
    """A defined symbol rebound STB_LOCAL in .dynsym: glibc's do_lookup_x ignores local
    symbols ("Local symbols are ignored"), so dlsym cannot find it.  pyelftools locates the
    entry; ld.so (dlsym in a child) is the oracle for which names a library defines."""
    data = bytearray(gnu_lib["path"].read_bytes())
    with open(gnu_lib["path"], "rb") as handle:
        dynsym = ELFFile(handle).get_section_by_name(".dynsym")
        index = next(i for i, s in enumerate(dynsym.iter_symbols()) if s.name == "seedance_fn_3")
        at = dynsym["sh_offset"] + index * dynsym["sh_entsize"] + 4  # Elf64_Sym: name, info, ...
    data[at] = (0 << 4) | (data[at] & 0xF)  # STB_LOCAL, same type
    local = tmp_path / "liblocal.so"
    local.write_bytes(bytes(data))
    probe = ("import ctypes, os, sys\nlib = ctypes.CDLL(sys.argv[1], os.RTLD_NOW)\n"
             "print(hasattr(lib, 'seedance_fn_3'), hasattr(lib, 'seedance_fn_4'))")
    proc = subprocess.run([sys.executable, "-c", probe, str(local)], capture_output=True, text=True,
                          errors="replace", timeout=60)
    assert proc.stdout.split() == ["False", "True"], proc.stderr
    with open(local, "rb") as handle:
        bind = ELFFile(handle).get_section_by_name(".dynsym").get_symbol(index)["st_info"]["bind"]
    assert bind == "STB_LOCAL"
    defined = read_elf(str(local), symbols=True).defined_symbols()
    assert "seedance_fn_3" not in defined and "seedance_fn_4" in defined


def test_a_cut_off_section_header_table_is_ignored_as_ld_so_ignores_it(gnu_lib, tmp_path):
    """The section header table sits at the end of the file; cut it short and ld.so still
    loads the library (it reads only program headers).  The reader must not fail on it:
    without usable sections it reads the dynamic segment, as the loader does."""
    data = gnu_lib["path"].read_bytes()
    with open(gnu_lib["path"], "rb") as handle:
        elf = ELFFile(handle)
        shoff, shentsize = elf["e_shoff"], elf["e_shentsize"]
        needed = [t.needed for t in elf.get_section_by_name(".dynamic").iter_tags() if t.entry.d_tag == "DT_NEEDED"]
    assert shoff + elf["e_shnum"] * shentsize == len(data)  # gcc/ld put it last
    cut = tmp_path / "libcut.so"
    cut.write_bytes(data[:shoff + 2 * shentsize])
    probe = "import ctypes, os, sys\nprint(ctypes.CDLL(sys.argv[1], os.RTLD_NOW).seedance_fn_3(4))"
    proc = subprocess.run([sys.executable, "-c", probe, str(cut)], capture_output=True, text=True,
                          errors="replace", timeout=60)
    assert proc.returncode == 0 and proc.stdout.split() == ["7"], proc.stderr
    info = read_elf(str(cut), symbols=True)
    assert not info.has_sections
    assert list(info.needed) == needed
    assert {f"seedance_fn_{i}" for i in range(12)} <= set(info.defined_symbols())


KERNEL_CU = ('extern "C" __global__ void seedance_kern(float *x) { x[threadIdx.x] = 2.0f * x[threadIdx.x] + 1.0f; }\n'
             'extern "C" void go(float *x) { seedance_kern<<<1, 32>>>(x); }\n')


@pytest.fixture(scope="module")
def compressed_libs(tmp_path_factory):
    """The same kernel built by nvcc three times: images compressed with LZ4 (--compress-mode
    speed), with zstd (size) and not at all (none).  The uncompressed file's bytes are the
    reference for what decompression must give."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not shutil.which(nvcc):
        pytest.skip("nvcc (CUDA toolkit) not installed")
    import hashlib
    import os

    tmp = tmp_path_factory.mktemp("compressed")
    (tmp / "k.cu").write_text(KERNEL_CU)
    # Each build takes ~10 s; the mutation run (bench/run_mutation.py --recheck) starts this
    # file once per mutant, so builds are kept outside the repository, keyed by this nvcc's
    # own version text, the source and the flags (another toolkit builds afresh).
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, errors="replace").stdout
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "seedance-test-nvcc"
    libs = {}
    for mode in ("speed", "size", "none"):
        flags = ["-shared", "-Xcompiler", "-fPIC", "-gencode", "arch=compute_90,code=sm_90",
                 "-gencode", "arch=compute_90,code=compute_90", f"--compress-mode={mode}"]
        key = hashlib.sha256("\0".join([version, KERNEL_CU, *flags]).encode()).hexdigest()[:24]
        kept = cache / f"{key}.so"
        libs[mode] = tmp / f"lib_{mode}.so"
        if kept.is_file():
            shutil.copyfile(kept, libs[mode])
            continue
        proc = subprocess.run([nvcc, *flags, str(tmp / "k.cu"), "-o", str(libs[mode])], capture_output=True,
                              text=True, errors="replace")
        if proc.returncode != 0 and "compress-mode" in proc.stderr:
            pytest.skip(f"this nvcc has no --compress-mode: {proc.stderr.strip()[:200]}")
        assert proc.returncode == 0, proc.stderr
        cache.mkdir(parents=True, exist_ok=True)
        partial = cache / f"{key}.{os.getpid()}.tmp"
        shutil.copyfile(libs[mode], partial)
        os.replace(partial, kept)  # whole or absent: a parallel run never reads half a file
    return libs


def _images(path):
    from seedance.elf import fatbin

    return [(e, fatbin.read_image(str(path), e)) for e in read_elf(str(path), fatbin=True).fatbin]


@pytest.mark.parametrize("mode, codec", [("speed", "lz4"), ("size", "zstd")])
def test_compressed_images_decode_to_the_uncompressed_build(compressed_libs, mode, codec):
    from seedance.elf import fatbin_payload

    plain = _images(compressed_libs["none"])
    packed = _images(compressed_libs[mode])
    assert all(not e.compressed and e.codec == "" for e, _ in plain)
    assert {e.codec for e, _ in packed if e.compressed} == {codec}
    assert [(e.kind, e.arch) for e, _ in packed] == [(e.kind, e.arch) for e, _ in plain]
    for (pe, pimage), (ce, cimage) in zip(plain, packed):
        # nvcc pads an uncompressed PTX image with NULs to 8 bytes; the text is the same
        assert cimage.rstrip(b"\0") == pimage.rstrip(b"\0"), (pe.kind, ce.codec)
    # the kernel is named in the source (extern "C"): found in the SASS and in the PTX
    # (the other SASS image is nvcc's device-link stub, which defines no kernel)
    found = {(e.kind, name) for e, image in packed for name in fatbin_payload.kernels(image, e.kind)}
    assert found == {("sass", "seedance_kern"), ("ptx", "seedance_kern")}


def test_a_corrupt_lz4_image_is_a_payload_error_naming_lz4(compressed_libs):
    from seedance.elf import fatbin_payload

    pytest.importorskip("lz4.block")
    entry, _ = next((e, i) for e, i in _images(compressed_libs["speed"]) if e.codec == "lz4")
    stored = compressed_libs["speed"].read_bytes()[entry.offset:entry.offset + entry.stored]
    with pytest.raises(fatbin_payload.PayloadError) as caught:
        fatbin_payload.decode(stored[:len(stored) // 2], entry.codec, entry.usize)
    assert str(caught.value).startswith("LZ4: ")


def test_an_image_cut_off_by_the_end_of_the_file_says_so(compressed_libs, tmp_path):
    from seedance.elf import fatbin, fatbin_payload

    entry = _images(compressed_libs["none"])[-1][0]
    cut = tmp_path / "cut.so"
    cut.write_bytes(compressed_libs["none"].read_bytes()[:entry.offset + entry.stored // 2])
    with pytest.raises(fatbin_payload.PayloadError) as caught:
        fatbin.read_image(str(cut), entry)
    assert str(caught.value) == "image past end of file"


def test_a_32_bit_cubin_is_refused_by_name(compressed_libs):
    from seedance.elf import fatbin_payload

    entry, image = next((e, i) for e, i in _images(compressed_libs["none"]) if e.kind == "sass" and
                        fatbin_payload.kernels(i, "sass"))
    assert image[4] == 2  # ELFCLASS64, as every cubin since sm_20
    with pytest.raises(fatbin_payload.PayloadError) as caught:
        fatbin_payload.cubin_kernels(image[:4] + b"\x01" + image[5:])
    assert str(caught.value) == "32-bit cubin"


def test_runnable_on_gives_the_first_modules_reason():
    """Two translation units, neither loadable on sm_90 with a CUDA 12.5 driver: the first
    has only PTX ISA 9.0 (CUDA 13.0, PTX ISA release notes), the second only sm_80 SASS.
    The reason given is the first module's."""
    from seedance.elf import fatbin

    first = fatbin.FatbinEntry("ptx", 90, "", False, 0, module=0, isa=(9, 0))
    second = fatbin.FatbinEntry("sass", 80, "", False, 0, module=1)
    ok, why = fatbin.runnable_on([first, second], 90, "", (8, 5))
    assert ok is False
    assert why.startswith("PTX compute_90 is ISA 9.0, which needs a driver for CUDA 13.0")


def test_symbols_read_by_name_prefix_are_the_ones_pyelftools_finds(gnu_lib):
    with open(gnu_lib["path"], "rb") as handle:
        names = [s.name for s in ELFFile(handle).get_section_by_name(".dynsym").iter_symbols()]
    for prefixes in (("seedance_fn_1",), ("seedance_fn_1", "seedance_say"), ("nothing_has_this",)):
        expected = sorted(n for n in names if n.startswith(prefixes))
        assert sorted(s.name for s in read_elf(str(gnu_lib["path"]), symbols=prefixes).symbols) == expected


def _libc():
    out = subprocess.run(["ldd", sys.executable], capture_output=True, text=True, errors="replace").stdout
    return next((line.split("=>")[1].split("(")[0].strip() for line in out.splitlines() if "libc.so.6 =>" in line),
                None)


def test_symbol_types_and_hidden_versions_against_pyelftools_on_libc():
    """glibc's libc.so.6 has every kind a loader meets: FUNC, OBJECT, TLS, IFUNC (type 10)
    and compat versions whose .gnu.version entry has the hidden bit (0x8000) set.  The types
    come from pyelftools, the hidden bit from the raw .gnu.version words it locates."""
    libc = _libc()
    if libc is None:
        pytest.skip("no glibc libc.so.6 here")
    with open(libc, "rb") as handle:
        elf = ELFFile(handle)
        dynsym = elf.get_section_by_name(".dynsym")
        versym = elf.get_section_by_name(".gnu.version").data()
        words = struct.unpack(f"<{len(versym) // 2}H", versym)
        expected = []
        for index, sym in enumerate(dynsym.iter_symbols()):
            if index == 0:
                continue
            kind = sym["st_info"]["type"]
            kind = {"STT_LOOS": "IFUNC", "STT_GNU_IFUNC": "IFUNC"}.get(kind, kind.replace("STT_", ""))
            expected.append((sym.name, kind, bool(words[index] & 0x8000)))
    got = [(s.name, s.type, s.hidden) for s in read_elf(libc, symbols=True).symbols]
    assert got == expected
    assert {"IFUNC", "FUNC", "OBJECT", "TLS"} <= {k for _, k, _ in expected}
    assert any(h for _, _, h in expected) and not all(h for _, _, h in expected)


def test_an_object_without_symbol_versions_has_no_hidden_symbols(tmp_path):
    if not shutil.which("gcc"):
        pytest.skip("gcc not found")
    (tmp_path / "n.c").write_text("int plain(int x) { return x + 1; }\n")
    lib = tmp_path / "libplain.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-nostdlib", "-o", str(lib), str(tmp_path / "n.c")], check=True)
    with open(lib, "rb") as handle:
        assert ELFFile(handle).get_section_by_name(".gnu.version") is None
    symbols = read_elf(str(lib), symbols=True).symbols
    assert "plain" in [s.name for s in symbols]
    assert [s.hidden for s in symbols] == [False] * len(symbols)


def test_a_symbol_entry_size_smaller_than_a_symbol_is_malformed(gnu_lib, tmp_path):
    data = bytearray(gnu_lib["path"].read_bytes())
    with open(gnu_lib["path"], "rb") as handle:
        dynamic = ELFFile(handle).get_section_by_name(".dynamic")
        index = next(i for i, t in enumerate(dynamic.iter_tags()) if t.entry.d_tag == "DT_SYMENT")
        at = dynamic["sh_offset"] + index * 16 + 8  # Elf64_Dyn: d_tag, d_val
    assert struct.unpack_from("<Q", data, at)[0] == 24  # sizeof(Elf64_Sym)
    struct.pack_into("<Q", data, at, 8)
    bad = tmp_path / "libsyment.so"
    bad.write_bytes(bytes(data))
    with pytest.raises(ELFError) as caught:
        read_elf(str(bad), symbols=True)
    assert str(caught.value) == f"{bad}: malformed ELF: DT_SYMENT 8 too small"


def test_a_fresh_nvcc_build_has_no_damaged_container_and_ptx_carries_its_isa(compressed_libs):
    """nvcc's last container ends exactly at the end of .nv_fatbin: that is not an overrun.
    A PTX image's ISA is the ".version X.Y" line of its own text; SASS has none."""
    for mode in ("none", "speed"):
        entries = _images(compressed_libs[mode])
        assert {e.kind for e, _ in entries} == {"sass", "ptx"}
        for entry, image in entries:
            if entry.kind == "ptx":
                version = re.search(rb"^\.version (\d+)\.(\d+)", image, re.M)
                assert entry.isa == (int(version.group(1)), int(version.group(2)))
            else:
                assert entry.isa == ()


def test_an_overrunning_container_names_where_it_is(compressed_libs, tmp_path):
    from seedance.elf import fatbin

    lib = compressed_libs["none"]
    with open(lib, "rb") as handle:
        section = ELFFile(handle).get_section_by_name(".nv_fatbin")
        offset, size = section["sh_offset"], section["sh_size"]
    data = bytearray(lib.read_bytes())
    struct.pack_into("<Q", data, offset + 8, size * 4)  # the first container claims 4x its section
    broken = tmp_path / "libbroken.so"
    broken.write_bytes(bytes(data))
    entries = read_elf(str(broken), fatbin=True).fatbin
    why = f"fatbin container at {offset:#x} overruns its section"
    assert [(e.kind, e.note) for e in entries] == [("damaged", why)]
    assert fatbin.runnable_on(entries, 90) == (False, why)


def test_a_processor_specific_symbol_type_is_reported_by_number(gnu_lib, tmp_path):
    """Symbol types outside the generic set (13 is STT_LOPROC: ARM's STT_ARM_TFUNC, SPARC's
    STT_SPARC_REGISTER) have no name here; the number is kept rather than dropped.
    pyelftools reads the patched entry as STT_LOPROC."""
    data = bytearray(gnu_lib["path"].read_bytes())
    with open(gnu_lib["path"], "rb") as handle:
        dynsym = ELFFile(handle).get_section_by_name(".dynsym")
        index = next(i for i, s in enumerate(dynsym.iter_symbols()) if s.name == "seedance_fn_5")
        at = dynsym["sh_offset"] + index * dynsym["sh_entsize"] + 4
    data[at] = (data[at] & 0xF0) | 13
    odd = tmp_path / "libtype.so"
    odd.write_bytes(bytes(data))
    with open(odd, "rb") as handle:
        assert ELFFile(handle).get_section_by_name(".dynsym").get_symbol(index)["st_info"]["type"] == "STT_LOPROC"
    types = {s.name: s.type for s in read_elf(str(odd), symbols=True).symbols}
    assert (types["seedance_fn_5"], types["seedance_fn_6"]) == ("13", "FUNC")


def test_a_file_shorter_than_an_elf_identification_says_so(tmp_path):
    short = tmp_path / "short.so"
    short.write_bytes(b"\x7fELF\x02\x01\x01")  # 7 bytes: e_ident alone is 16
    with pytest.raises(ELFError) as caught:
        read_elf(str(short))
    assert str(caught.value) == f"{short}: not an ELF file (too short)"


def test_the_build_id_is_found_in_sections_when_no_segment_is_a_note(gnu_lib, tmp_path):
    """The GNU build-id note is read from a PT_NOTE segment, or else from the note sections
    (an object whose PT_NOTE headers were rewritten, as some strip tools leave them).
    pyelftools gives the note's descriptor."""
    data = bytearray(gnu_lib["path"].read_bytes())
    with open(gnu_lib["path"], "rb") as handle:
        elf = ELFFile(handle)
        build_id = next(n for n in elf.get_section_by_name(".note.gnu.build-id").iter_notes())["n_desc"]
        phoff, phentsize = elf["e_phoff"], elf["e_phentsize"]
        notes = [i for i, seg in enumerate(elf.iter_segments()) if seg["p_type"] == "PT_NOTE"]
    assert notes
    for index in notes:
        struct.pack_into("<I", data, phoff + index * phentsize, 0)  # PT_NULL
    patched = tmp_path / "libnonote.so"
    patched.write_bytes(bytes(data))
    with open(patched, "rb") as handle:
        assert not [s for s in ELFFile(handle).iter_segments() if s["p_type"] == "PT_NOTE"]
    assert read_elf(str(patched)).build_id == build_id
    assert read_elf(str(patched), symbols=True).build_id == build_id


def test_a_cut_lz4_block_is_reported_as_truncated(compressed_libs):
    """nvcc's own LZ4 block (the PTX image of the LZ4 build) cut inside the 2-byte match
    offset of its first sequence (token, literals, offset: lz4's Block_format.md): the
    pure-Python decoder (used when the lz4 module is absent) runs out of input there.  The
    whole block decodes to the uncompressed build's PTX."""
    from seedance.elf import fatbin_payload

    entry = next(e for e, _ in _images(compressed_libs["speed"]) if e.kind == "ptx" and e.codec == "lz4")
    block = compressed_libs["speed"].read_bytes()[entry.offset:entry.offset + entry.stored]
    plain = next(i for e, i in _images(compressed_libs["none"]) if e.kind == "ptx")
    assert fatbin_payload.lz4_block(block, entry.usize).rstrip(b"\0") == plain.rstrip(b"\0")
    literals = block[0] >> 4
    assert literals < 15  # no length extension bytes before the literals
    with pytest.raises(fatbin_payload.PayloadError) as caught:
        fatbin_payload.lz4_block(block[:1 + literals + 1], entry.usize)
    assert str(caught.value) == "truncated LZ4 block"


def test_a_nobits_fatbin_section_has_no_images(compressed_libs, tmp_path):
    """SHT_NOBITS "occupies no space in the file" (gABI; objcopy --only-keep-debug leaves
    sections so): whatever bytes lie at its sh_offset are not its contents.  The
    uncompressed build with .nv_fatbin retyped NOBITS: pyelftools reads only zeros from
    it, and the reader must find no image there."""
    lib = compressed_libs["none"]
    with open(lib, "rb") as handle:
        elf = ELFFile(handle)
        index = next(i for i, s in enumerate(elf.iter_sections()) if s.name == ".nv_fatbin")
        at = elf["e_shoff"] + index * elf["e_shentsize"] + 4  # Elf64_Shdr: sh_name, sh_type
    data = bytearray(lib.read_bytes())
    struct.pack_into("<I", data, at, 8)  # SHT_NOBITS
    nobits = tmp_path / "libnobits.so"
    nobits.write_bytes(bytes(data))
    with open(nobits, "rb") as handle:
        section = ELFFile(handle).get_section_by_name(".nv_fatbin")
        # pyelftools gives a NOBITS section's memory image (zeros), never the file's bytes
        assert section["sh_type"] == "SHT_NOBITS" and section.data() == bytes(section["sh_size"])
    assert read_elf(str(lib), fatbin=True).fatbin  # the images are there before the retyping
    assert read_elf(str(nobits), fatbin=True).fatbin == ()


def test_a_version_need_pointing_past_the_file_is_a_read_past_its_end(gnu_lib, tmp_path):
    """The first Elf64_Verneed's vn_aux (byte 8) moved 64 KiB on: its Vernaux would be read
    past the end of the file.  The error names the read, the offset and the file size."""
    data = bytearray(gnu_lib["path"].read_bytes())
    with open(gnu_lib["path"], "rb") as handle:
        offset = ELFFile(handle).get_section_by_name(".gnu.version_r")["sh_offset"]
    struct.pack_into("<I", data, offset + 8, 0x10000)
    bad = tmp_path / "libbadaux.so"
    bad.write_bytes(bytes(data))
    assert offset + 0x10000 > len(data)
    with pytest.raises(ELFError) as caught:
        read_elf(str(bad))
    assert str(caught.value) == (f"{bad}: malformed ELF: read of 16 bytes at {offset + 0x10000:#x} "
                                 f"past end of file ({len(data):#x})")


# --- program headers at their edges, and tables the loader finds by address -------------------
# (bench/mutation-survivors.md, agent/elf second sample: `_program_headers` 2 and 7,
# `vaddr_to_offset` 1, `_symbols` 79.)  Each is read by the Python reader (the reference) and by
# the C reader where it is built: both must give what pyelftools, or ld.so, give.

def _both_readers(monkeypatch):
    from seedance.elf import fastread
    yield "python"
    if fastread.available():
        yield "c"


def _read(monkeypatch, reader, *args, **kwargs):
    if reader == "python":
        monkeypatch.setenv("SEEDANCE_ELF_READER", "python")
    else:
        monkeypatch.delenv("SEEDANCE_ELF_READER", raising=False)
    return read_elf(*args, **kwargs)


def _segments(path):
    with open(path, "rb") as handle:
        elf = ELFFile(handle)
        return elf["e_phoff"], elf["e_phentsize"], [dict(seg.header) for seg in elf.iter_segments()]


def _no_section_headers(data):
    struct.pack_into("<Q", data, 0x28, 0)  # e_shoff
    struct.pack_into("<HHH", data, 0x3A, 0, 0, 0)  # e_shentsize, e_shnum, e_shstrndx


def test_an_object_with_a_single_program_header(gnu_lib, tmp_path, monkeypatch):
    """e_phnum == 1: the one header (here the build-id's PT_NOTE, no section headers left) is read."""
    data = bytearray(gnu_lib["path"].read_bytes())
    phoff, phentsize, segments = _segments(gnu_lib["path"])
    with open(gnu_lib["path"], "rb") as handle:
        elf = ELFFile(handle)
        build_id = next(n for n in elf.get_section_by_name(".note.gnu.build-id").iter_notes())["n_desc"]
        index = next(i for i, seg in enumerate(elf.iter_segments()) if seg["p_type"] == "PT_NOTE"
                     and any(n["n_type"] == "NT_GNU_BUILD_ID" for n in seg.iter_notes()))
    data[phoff:phoff + phentsize] = data[phoff + index * phentsize:phoff + (index + 1) * phentsize]
    struct.pack_into("<H", data, 0x38, 1)  # e_phnum
    _no_section_headers(data)
    single = tmp_path / "single.so"
    single.write_bytes(bytes(data))
    with open(single, "rb") as handle:
        elf = ELFFile(handle)
        assert elf.num_segments() == 1
        [note] = [n for n in elf.get_segment(0).iter_notes() if n["n_type"] == "NT_GNU_BUILD_ID"]
        assert note["n_desc"] == build_id
    for reader in _both_readers(monkeypatch):
        assert _read(monkeypatch, reader, str(single)).build_id == build_id, reader


def test_program_headers_ending_exactly_at_the_end_of_the_file(gnu_lib, tmp_path, monkeypatch):
    """A file that is its ELF header and program headers only (the LOAD headers kept, the others
    made PT_NULL, no section headers): the table fits, one byte less does not."""
    data = bytearray(gnu_lib["path"].read_bytes())
    phoff, phentsize, segments = _segments(gnu_lib["path"])
    for index, seg in enumerate(segments):
        if seg["p_type"] != "PT_LOAD":
            struct.pack_into("<I", data, phoff + index * phentsize, 0)  # PT_NULL
    _no_section_headers(data)
    end = phoff + len(segments) * phentsize
    exact = tmp_path / "headers-only.so"
    exact.write_bytes(bytes(data[:end]))
    with open(exact, "rb") as handle:
        elf = ELFFile(handle)
        assert elf.num_segments() == len(segments)
        e_type, machine = elf["e_type"], elf["e_machine"]
    assert (e_type, machine) == ("ET_DYN", "EM_X86_64")
    short = tmp_path / "one-byte-short.so"
    short.write_bytes(bytes(data[:end - 1]))
    for reader in _both_readers(monkeypatch):
        info = _read(monkeypatch, reader, str(exact))
        assert (info.e_type, info.machine, info.has_dynamic, info.interpreter) == (3, 62, False, None), reader
        with pytest.raises(ELFError, match="program headers past end of file"):
            _read(monkeypatch, reader, str(short))


def _dynamic_entry(data, dyn_offset, tag):
    """File offset of the Elf64_Dyn whose d_tag is ``tag``."""
    at = dyn_offset
    while True:
        d_tag, _ = struct.unpack_from("<qQ", data, at)
        if d_tag == tag:
            return at
        assert d_tag != 0, f"no tag {tag}"
        at += 16


def test_a_table_at_the_first_byte_of_a_load_segment(gnu_lib, tmp_path, monkeypatch):
    """The first PT_LOAD made to begin exactly at DT_GNU_HASH (offset == vaddr, as ld laid it
    out), no section headers: ld.so still loads the library and binds its symbols, and the
    readers count and read them through that address."""
    data = bytearray(gnu_lib["path"].read_bytes())
    phoff, phentsize, segments = _segments(gnu_lib["path"])
    with open(gnu_lib["path"], "rb") as handle:
        dynamic = ELFFile(handle).get_section_by_name(".dynamic")
        gnu_hash = next(t["d_ptr"] for t in dynamic.iter_tags() if t.entry.d_tag == "DT_GNU_HASH")
    index = next(i for i, seg in enumerate(segments) if seg["p_type"] == "PT_LOAD")
    first = segments[index]
    assert first["p_offset"] == first["p_vaddr"] == 0 and 0 < gnu_hash < first["p_filesz"]
    struct.pack_into("<QQQQQ", data, phoff + index * phentsize + 8, gnu_hash, gnu_hash, gnu_hash,
                     first["p_filesz"] - gnu_hash, first["p_memsz"] - gnu_hash)
    _no_section_headers(data)
    moved = tmp_path / "libmoved.so"
    moved.write_bytes(bytes(data))
    child = subprocess.run([sys.executable, "-c", "import ctypes, sys; print(ctypes.CDLL(sys.argv[1]).seedance_fn_3(4))",
                            str(moved)], capture_output=True, text=True)
    assert child.stdout.strip() == "7", child.stderr  # ld.so loaded it and bound seedance_fn_3
    for reader in _both_readers(monkeypatch):
        info = _read(monkeypatch, reader, str(moved), symbols=True)
        assert {s.name for s in info.symbols if s.defined} == gnu_lib["names"], reader


def test_symbol_names_of_a_misaligned_symbol_table(gnu_lib, tmp_path, monkeypatch):
    """A copy of .dynsym appended at a file offset that is not a multiple of 4 (the last PT_LOAD
    grown over it, DT_SYMTAB pointed at it): the names are read entry by entry, and are
    pyelftools' names of the original table."""
    data = bytearray(gnu_lib["path"].read_bytes())
    phoff, phentsize, segments = _segments(gnu_lib["path"])
    with open(gnu_lib["path"], "rb") as handle:
        elf = ELFFile(handle)
        dynsym = elf.get_section_by_name(".dynsym")
        table = dynsym.data()
        names = [s.name for s in dynsym.iter_symbols()]
        dyn_offset = elf.get_section_by_name(".dynamic")["sh_offset"]
    last = max((i for i, seg in enumerate(segments) if seg["p_type"] == "PT_LOAD"),
               key=lambda i: segments[i]["p_offset"])
    seg = segments[last]
    data += b"\0" * ((2 - len(data)) % 4)  # offset % 4 == 2
    start = len(data)
    data += table
    vaddr = seg["p_vaddr"] + (start - seg["p_offset"])
    filesz = len(data) - seg["p_offset"]
    struct.pack_into("<QQ", data, phoff + last * phentsize + 32, filesz, max(filesz, seg["p_memsz"]))
    struct.pack_into("<Q", data, _dynamic_entry(data, dyn_offset, 6) + 8, vaddr)  # DT_SYMTAB
    moved = tmp_path / "libmisaligned.so"
    moved.write_bytes(bytes(data))
    assert start % 4 == 2
    for prefixes in (("seedance_fn_1",), ("seedance_say", "seedance_fn_7")):
        expected = sorted(n for n in names if n.startswith(prefixes))
        assert expected
        for reader in _both_readers(monkeypatch):
            got = sorted(s.name for s in _read(monkeypatch, reader, str(moved), symbols=prefixes).symbols)
            assert got == expected, reader


def test_a_program_header_entry_size_smaller_than_a_header_is_malformed(gnu_lib, tmp_path):
    """e_phentsize cut from sizeof(Elf64_Phdr) = 56 to 32: ld.so refuses the object
    (dl-load.c: "ELF file's phentsize not the expected size"); the reader names the field."""
    data = bytearray(gnu_lib["path"].read_bytes())
    assert struct.unpack_from("<H", data, 54)[0] == 56  # Elf64_Ehdr.e_phentsize
    struct.pack_into("<H", data, 54, 32)
    bad = tmp_path / "libphent.so"
    bad.write_bytes(bytes(data))
    loaded = subprocess.run([sys.executable, "-c", "import ctypes, os, sys; ctypes.CDLL(sys.argv[1], os.RTLD_NOW)",
                             str(bad)], capture_output=True, text=True, errors="replace")
    assert loaded.returncode != 0 and "phentsize" in loaded.stderr, loaded.stderr
    with pytest.raises(ELFError) as caught:
        read_elf(str(bad))
    assert str(caught.value) == f"{bad}: malformed ELF: e_phentsize 32 too small"


def test_a_build_id_note_whose_size_wraps_has_no_build_id(tmp_path):
    """The build-id note's n_descsz set to 0xfffffffc (-4 if read signed): readelf -n warns
    "note with invalid namesz and/or descsz" and prints no Build ID; the reader gives none
    either (the note header's three words are unsigned, Elf64_Nhdr)."""
    if not shutil.which("gcc") or not shutil.which("readelf"):
        pytest.skip("gcc and readelf needed")
    (tmp_path / "b.c").write_text("int b(void){return 1;}\n")
    lib = tmp_path / "libb.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,--build-id", "-o", str(lib), str(tmp_path / "b.c")], check=True)
    data = bytearray(lib.read_bytes())
    with open(lib, "rb") as handle:
        at = ELFFile(handle).get_section_by_name(".note.gnu.build-id")["sh_offset"]
    assert struct.unpack_from("<III", data, at) == (4, 20, 3)  # "GNU\0", 20-byte SHA-1, NT_GNU_BUILD_ID
    assert read_elf(str(lib)).build_id is not None
    struct.pack_into("<I", data, at + 4, 0xFFFFFFFC)
    bad = tmp_path / "libbadnote.so"
    bad.write_bytes(bytes(data))
    shown = subprocess.run(["readelf", "-n", str(bad)], capture_output=True, text=True, errors="replace")
    assert "invalid namesz and/or descsz" in shown.stderr and "Build ID" not in shown.stdout, shown
    assert read_elf(str(bad)).build_id is None
