"""The C ELF reader (agent/elf/fastelf.c via fastread.py) against the Python reader.

reader.py is the reference: on every ELF object of this host, on hand-built 32/64-bit
little/big-endian objects, on real 32-bit objects linked here, and on thousands of
mutated files, the C reader must give an equal ElfInfo (section names included) or the
same ELFError message.  The fuzz runs in a child process, so a crash in C is a failed
test with its signal, not a dead pytest.

Run by hand:  python tests/unit/test_elf_fastread.py --fuzz COUNT SEED
"""
from __future__ import annotations

import json
import os
import random
import shutil
import stat
import struct
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from seedance.elf import fastread, properties, reader
from seedance.model.errors import ELFError

ROOT = Path(__file__).resolve().parents[2]
TREES = ["/usr/lib/x86_64-linux-gnu", "/usr/local/cuda/lib64", sysconfig.get_paths()["purelib"]]

needs_c = pytest.mark.skipif(not fastread.available(),
                             reason="seedance.elf._fastelf is not built (pip install -e . builds it)")


# --- the two verdicts -----------------------------------------------------------------

# the C++ ABI check's prefixes (collect/cxxabi.py), spelled out: a test input, not read from it
TORCH_PREFIXES = ("_ZN3c10", "_ZN2at", "_ZN5torch", "_ZN6caffe2", "_ZNK3c10", "_ZNK2at", "_ZNK5torch", "_ZNK6caffe2")


def python_verdict(path: str, symbols=False):
    """reader.py's answer: ("ok", ElfInfo, section names) or ("error", message)."""
    saved = os.environ.get("SEEDANCE_ELF_READER")
    os.environ["SEEDANCE_ELF_READER"] = "python"
    try:
        info = reader.read_elf(path, symbols=symbols)
        return ("ok", info, info.section_names)
    except ELFError as exc:
        return ("error", str(exc))
    finally:
        if saved is None:
            del os.environ["SEEDANCE_ELF_READER"]
        else:
            os.environ["SEEDANCE_ELF_READER"] = saved


def c_verdict(path: str, symbols=False):
    """fastread's answer, or ("fallback",) when it hands the file to the Python reader."""
    try:
        info = fastread.read(path, symbols)
    except ELFError as exc:
        return ("error", str(exc))
    if info is None:
        return ("fallback",)
    return ("ok", info, info.section_names)


def tables_differ(path: str, info) -> bool:
    """Whether fastread.symbol_tables (built from the C reader's raw symbols) differs from
    the resolver's tables over ``info``, the reference reader's symbols of the same file."""
    from seedance.resolve.resolver import Resolver

    # _symbol_tables reads only ``info``; a fresh object, without __init__'s host probing
    # (/proc/cpuinfo), so that no table is remembered from another file
    return fastread.symbol_tables(path) != Resolver._symbol_tables(_Bare(), path, info)


class _Bare:
    def __init__(self):
        self._elf = {}


def exports_differ(path: str, prefixes=TORCH_PREFIXES, info=None) -> bool:
    """Whether fastread.exported_names differs from what cxxabi.TorchAbiCache.defined makes
    of the reference reader's prefixed symbols (``info``: that read, when made already)."""
    from seedance.collect.cxxabi import TorchAbiCache

    if info is None:
        theirs = python_verdict(path, prefixes)
        if theirs[0] != "ok":
            return False
        info = theirs[1]
    return fastread.exported_names(path, prefixes) != TorchAbiCache().defined(path, info)


def isa_differs(path: str):
    """After an "ok" C read of ``path``: (C, properties.py) when the ISA level the C reader
    took from the same image is not what properties.x86_isa_needed reads, else None."""
    ours, theirs = fastread.x86_isa_needed(path), properties.x86_isa_needed(path)
    return None if ours == theirs else (ours, theirs)


def elf_files(root: str) -> list:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            try:
                if not stat.S_ISREG(os.lstat(path).st_mode):
                    continue
                with open(path, "rb") as handle:
                    if handle.read(4) == b"\x7fELF":
                        out.append(path)
            except OSError:
                continue
    return out


# --- hand-built objects: any class, any byte order ------------------------------------

# (name, bind, type, defined, versym): versym 2/3 are the verdef nodes V1/V2, 10/11 the
# verneed's GLIBC_2.2/GLIBC_2.34, 0x8000 the hidden bit, 1 the global (unversioned) index
SYNTH_SYMBOLS = (("", 0, 0, False, 0), ("f1", 1, 2, True, 2), ("f2", 2, 1, True, 0x8003),
                 ("_ZN3c10bar", 1, 2, False, 10), ("loc", 0, 2, True, 0), ("_ZN2at5baz", 1, 10, True, 1),
                 ("odd", 5, 13, True, 11))

def synth_elf(is64: bool, little: bool, *, needed=("libc.so.6",), soname="libsynth.so.1",
              rpath="/opt/a:$ORIGIN", runpath="/opt/run", verneed=(("libc.so.6", (("GLIBC_2.2", False),
                                                                                   ("GLIBC_2.34", True))),),
              verdef=("V1", "V2"), build_id=bytes(range(20)), interp="/lib/ld-synth.so",
              flags=0x8, flags_1=0x800, machine=62, extra_sections=(".dynstr", ".note.dup"),
              symbols=SYNTH_SYMBOLS, dynsym_section=True) -> bytes:
    """A small shared object laid out by hand, every structure in the requested class and
    byte order: PT_INTERP, one PT_LOAD over the file at a non-zero address, PT_DYNAMIC,
    PT_NOTE (GNU build id), verneed, verdef, a dynamic symbol table with DT_HASH and
    versym, and section headers (with a repeated name; .dynsym unless dynsym_section is
    false, then the symbol count comes from DT_HASH)."""
    e = "<" if little else ">"
    base = 0x10000
    ehdr = struct.Struct(e + ("16sHHIQQQIHHHHHH" if is64 else "16sHHIIIIIHHHHHH"))
    phdr = struct.Struct(e + ("IIQQQQQQ" if is64 else "IIIIIIII"))
    shdr = struct.Struct(e + ("IIQQQQIIQQ" if is64 else "IIIIIIIIII"))
    dyn = struct.Struct(e + ("qQ" if is64 else "iI"))
    strtab = bytearray(b"\0")

    def string(text: str) -> int:
        offset = len(strtab)
        strtab.extend(text.encode("utf-8", "surrogateescape") + b"\0")
        return offset

    dyn_entries = [(1, string(name)) for name in needed]
    if soname is not None:
        dyn_entries.append((14, string(soname)))
    if rpath is not None:
        dyn_entries.append((15, string(rpath)))
    if runpath is not None:
        dyn_entries.append((29, string(runpath)))
    vn = bytearray()
    for index, (file, versions) in enumerate(verneed):
        file_off = string(file)
        last = index == len(verneed) - 1
        vn += struct.pack(e + "HHIII", 1, len(versions), file_off, 16, 0 if last else 16 + 16 * len(versions))
        for k, (name, weak) in enumerate(versions):
            vn += struct.pack(e + "IHHII", 0, 2 if weak else 0, 10 + k, string(name),
                              0 if k == len(versions) - 1 else 16)
    vd = bytearray()
    names = ["libsynth.so.1", *verdef]
    for index, name in enumerate(names):
        last = index == len(names) - 1
        vd += struct.pack(e + "HHHHIII", 1, 1 if index == 0 else 0, index + 1, 1, 0, 20, 0 if last else 28)
        vd += struct.pack(e + "II", string(name), 0)
    sym = struct.Struct(e + ("IBBHQQ" if is64 else "IIIBBH"))
    symtab, versym = bytearray(), bytearray()
    for name, bind, kind, defined, ver in symbols:
        name_off = string(name) if name else 0
        info, shndx = bind << 4 | kind, 7 if defined else 0
        symtab += sym.pack(name_off, info, 0, shndx, 0, 0) if is64 else sym.pack(name_off, 0, 0, info, 0, shndx)
        versym += struct.pack(e + "H", ver)
    hash_table = struct.pack(e + "II", 1, len(symbols)) + struct.pack(e + "I", 0) * (1 + len(symbols))
    note = struct.pack(e + "III", 4, len(build_id), 3) + b"GNU\0" + build_id + b"\0" * (-len(build_id) % 4)
    interp_bytes = interp.encode() + b"\0"

    phnum = 4
    offset = ehdr.size + phnum * phdr.size
    layout = {}
    blobs = []
    for name, blob in (("interp", interp_bytes), ("dynstr", bytes(strtab)), ("verneed", bytes(vn)),
                       ("verdef", bytes(vd)), ("note", note), ("dynsym", bytes(symtab)), ("versym", bytes(versym)),
                       ("hash", hash_table)):
        offset += -offset % 8
        layout[name] = (offset, len(blob))
        blobs.append((offset, blob))
        offset += len(blob)
    offset += -offset % 8
    dyn_entries += [(5, base + layout["dynstr"][0]), (10, layout["dynstr"][1]),
                    (0x6FFFFFFE, base + layout["verneed"][0]), (0x6FFFFFFF, len(verneed)),
                    (0x6FFFFFFC, base + layout["verdef"][0]), (0x6FFFFFFD, len(names)),
                    (30, flags), (0x6FFFFFFB, flags_1), (6, base + layout["dynsym"][0]), (11, sym.size),
                    (4, base + layout["hash"][0]), (0x6FFFFFF0, base + layout["versym"][0]), (0, 0)]
    dyn_blob = b"".join(dyn.pack(tag, value) for tag, value in dyn_entries)
    layout["dynamic"] = (offset, len(dyn_blob))
    blobs.append((offset, dyn_blob))
    offset += len(dyn_blob)
    shstr = bytearray(b"\0")
    section_list = [("", 0, 0, 0), (".interp", 1, *layout["interp"]), (".dynstr", 3, *layout["dynstr"]),
                    (".note.gnu.build-id", 7, *layout["note"]), (".dynamic", 6, *layout["dynamic"])]
    if dynsym_section:
        section_list.append((".dynsym", 11, *layout["dynsym"]))
    section_list += [(name, 1, 0, 0) for name in extra_sections]
    section_list.append((".shstrtab", 3, 0, 0))
    name_offsets = []
    for name, *_rest in section_list:
        name_offsets.append(len(shstr))
        shstr += name.encode() + b"\0"
    layout["shstrtab"] = (offset, len(shstr))
    blobs.append((offset, bytes(shstr)))
    offset += len(shstr)
    section_list[-1] = (".shstrtab", 3, *layout["shstrtab"])
    offset += -offset % 8
    shoff = offset
    total = shoff + len(section_list) * shdr.size

    out = bytearray(total)
    ident = b"\x7fELF" + bytes([2 if is64 else 1, 1 if little else 2, 1, 0]) + bytes(8)
    out[:ehdr.size] = ehdr.pack(ident, 3, machine, 1, 0, ehdr.size, shoff, 0, ehdr.size, phdr.size, phnum,
                                shdr.size, len(section_list), len(section_list) - 1)
    segments = [(3, *layout["interp"]), (1, 0, total), (2, *layout["dynamic"]), (4, *layout["note"])]
    for index, (p_type, p_offset, p_size) in enumerate(segments):
        fields = ((p_type, 4, p_offset, base + p_offset, base + p_offset, p_size, p_size, 8) if is64 else
                  (p_type, p_offset, base + p_offset, base + p_offset, p_size, p_size, 4, 8))
        at = ehdr.size + index * phdr.size
        out[at:at + phdr.size] = phdr.pack(*fields)
    for at, blob in blobs:
        out[at:at + len(blob)] = blob
    for index, ((_name, sh_type, sh_offset, sh_size), name_off) in enumerate(zip(section_list, name_offsets)):
        at = shoff + index * shdr.size
        entsize = sym.size if sh_type == 11 else 0
        out[at:at + shdr.size] = shdr.pack(name_off, sh_type, 0, 0, sh_offset, sh_size, 0, 0, 1, entsize)
    return bytes(out)


# --- the fuzz (runs in a child process) -------------------------------------------------

def fuzz_seeds() -> dict:
    seeds = {}
    for is64 in (True, False):
        for little in (True, False):
            seeds[f"synth{64 if is64 else 32}{'le' if little else 'be'}"] = synth_elf(is64, little)
    for path in ("/usr/bin/true", "/usr/lib/x86_64-linux-gnu/libdl.so.2", "/usr/lib/x86_64-linux-gnu/libz.so.1"):
        if os.path.exists(path):
            seeds[os.path.basename(path)] = open(os.path.realpath(path), "rb").read()
    # without section headers (e_shnum = 0) the symbol count comes from DT_GNU_HASH or DT_HASH
    for name in ("libz.so.1", "synth64le", "synth32be"):
        if name in seeds:
            data = bytearray(seeds[name])
            e = "<" if data[5] == 1 else ">"
            struct.pack_into(e + "H", data, 0x3C if data[4] == 2 else 0x30, 0)
            seeds[name + "-nosections"] = bytes(data)
    return seeds


def interesting_offsets(data: bytes) -> list:
    """Header, program headers, the dynamic section, the section headers, and the tables
    the dynamic section points at (hash tables, symbols, versym, verneed, verdef, strings):
    where a hostile file hurts."""
    offsets = list(range(0, 64))
    loads, tables = [], []
    try:
        is64, e = data[4] == 2, "<" if data[5] == 1 else ">"
        if is64:
            phoff, shoff = struct.unpack_from(e + "QQ", data, 0x20)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(e + "HHHH", data, 0x36)
        else:
            phoff, shoff = struct.unpack_from(e + "II", data, 0x1C)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(e + "HHHH", data, 0x2A)
        for index in range(min(phnum, 32)):
            at = phoff + index * phentsize
            offsets += range(at, at + phentsize)
            p_type = struct.unpack_from(e + "I", data, at)[0]
            word = "Q" if is64 else "I"
            p_offset, p_vaddr = struct.unpack_from(e + word * 2, data, at + (8 if is64 else 4))
            p_filesz = struct.unpack_from(e + word, data, at + (32 if is64 else 16))[0]
            if p_type == 1:
                loads.append((p_offset, p_vaddr, p_filesz))
            if p_type in (2, 4, 0x6474E553):  # PT_DYNAMIC, PT_NOTE, PT_GNU_PROPERTY
                offsets += range(p_offset, p_offset + 512)
            if p_type == 2:
                dyn = struct.Struct(e + ("qQ" if is64 else "iI"))
                for k in range(min(p_filesz // dyn.size, 64)):
                    tag, value = dyn.unpack_from(data, p_offset + k * dyn.size)
                    if tag in (4, 5, 6, 0x6FFFFEF5, 0x6FFFFFF0, 0x6FFFFFFC, 0x6FFFFFFE):
                        tables.append(value)
        for index in range(min(shnum, 64)):
            at = shoff + index * shentsize
            offsets += range(at, at + min(shentsize, 64))
    except struct.error:
        pass
    for vaddr in tables:
        for p_offset, p_vaddr, p_filesz in loads:
            if p_vaddr <= vaddr < p_vaddr + p_filesz:
                start = p_offset + vaddr - p_vaddr
                offsets += range(start, start + 96)
                break
    return [o for o in offsets if 0 <= o < len(data)]


def mutate(rng: random.Random, data: bytes, hot: list) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.random()
        if choice < 0.08 and len(out) > 1:
            del out[rng.randrange(1, len(out)):]  # truncation
        elif choice < 0.7 and hot:
            at = rng.choice(hot)
            width = rng.choice((1, 2, 4, 8))
            value = rng.choice((0, 1, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF, len(out),
                                len(out) - 1, rng.randrange(len(out) + 1), rng.getrandbits(64), 0x10000))
            chunk = (value & ((1 << 8 * width) - 1)).to_bytes(width, rng.choice(("little", "big")))
            out[at:at + width] = chunk[:max(0, len(out) - at)]
        elif out:
            out[rng.randrange(len(out))] = rng.randrange(256)
    return bytes(out)


def fuzz(count: int, seed: int) -> dict:
    """Mutate the seeds ``count`` times; the two readers' verdicts compared on each file."""
    rng = random.Random(seed)
    seeds = fuzz_seeds()
    names = sorted(seeds)
    hot = {name: interesting_offsets(seeds[name]) for name in names}
    summary = {"compared": 0, "ok": 0, "error": 0, "fallback": 0, "mismatches": [], "isa_marked": 0}
    with tempfile.TemporaryDirectory(prefix="seedance-fastelf-fuzz-") as work:
        path = os.path.join(work, "mutant.so")
        for index in range(count):
            name = names[index % len(names)]
            data = mutate(rng, seeds[name], hot[name])
            with open(path, "wb") as handle:
                handle.write(data)
            symbols = rng.choice((False, False, True, TORCH_PREFIXES, ("f", "_ZN3c10", "")))
            theirs = python_verdict(path, symbols)
            ours = c_verdict(path, symbols)
            summary["compared"] += 1
            summary[ours[0]] += 1
            differ = ours != theirs or (ours[0] == "ok" and ours[1].symbols != theirs[1].symbols)
            isa = isa_differs(path) if ours[0] == "ok" and not differ else None
            differ = differ or isa is not None
            if symbols is True and ours[0] == "ok" and not differ:
                differ = tables_differ(path, theirs[1])
            elif type(symbols) is tuple and ours[0] == "ok" and not differ:
                differ = exports_differ(path, symbols, theirs[1])
            if ours[0] == "ok" and properties.x86_isa_needed(path):
                summary["isa_marked"] += 1
            if ours[0] != "fallback" and differ and len(summary["mismatches"]) < 5:
                keep = os.path.join(tempfile.gettempdir(), f"seedance-fastelf-mismatch-{seed}-{index}.so")
                shutil.copyfile(path, keep)
                summary["mismatches"].append({"seed": name, "file": keep, "symbols": repr(symbols),
                                              "python": repr(theirs)[:600],
                                              "c": repr(ours)[:600], "isa": repr(isa)})
    return summary


# --- tests --------------------------------------------------------------------------------

_TREE_FILES: dict = {}


@needs_c
@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("symbols", [False, TORCH_PREFIXES, True], ids=["no-symbols", "prefixed", "all-symbols"])
def test_equal_on_every_elf_of_the_host(tree, symbols):
    """Every ELF file of the tree; with every symbol, every fifth one (the Python reader
    takes ~4 ms per object there, and the code path is the prefixed one's without a filter)."""
    if not os.path.isdir(tree):
        pytest.skip(f"{tree} is not on this host")
    files = _TREE_FILES.get(tree) or _TREE_FILES.setdefault(tree, elf_files(tree))
    assert files, f"no ELF file under {tree}"
    if symbols is True:
        files = files[::5]
    differences = []
    for path in files:
        theirs, ours = python_verdict(path, symbols), c_verdict(path, symbols)
        if ours != theirs or (ours[0] == "ok" and ours[1].symbols != theirs[1].symbols):
            differences.append((path, str(theirs)[:300], str(ours)[:300]))
        elif ours[0] == "ok" and isa_differs(path):
            differences.append((path, "ISA level (C, properties.py)", isa_differs(path)))
    assert not differences[:3], f"{len(differences)} of {len(files)} files differ"


@needs_c
@pytest.mark.parametrize("is64", [True, False], ids=["elf64", "elf32"])
@pytest.mark.parametrize("little", [True, False], ids=["le", "be"])
def test_hand_built_objects_of_every_class_and_byte_order(tmp_path, is64, little):
    path = tmp_path / "libsynth.so"
    path.write_bytes(synth_elf(is64, little, needed=("libc.so.6", "libm.so.6", "lib\udcffodd.so")))
    ours = c_verdict(str(path))
    assert ours == python_verdict(str(path))
    info = ours[1]
    # what was written, read back
    assert (info.elf_class, info.little_endian, info.machine) == (64 if is64 else 32, little, 62)
    assert info.needed == ("libc.so.6", "libm.so.6", "lib\udcffodd.so")
    assert (info.soname, info.rpath, info.runpath) == ("libsynth.so.1", ("/opt/a", "$ORIGIN"), ("/opt/run",))
    assert info.version_needs[0].file == "libc.so.6"
    assert info.version_needs[0].versions == (("GLIBC_2.2", False), ("GLIBC_2.34", True))
    assert info.version_defs == ("V1", "V2")
    assert (info.build_id, info.interpreter) == (bytes(range(20)).hex(), "/lib/ld-synth.so")
    assert (info.flags, info.flags_1) == (0x8, 0x800)
    # the repeated ".dynstr" section name is kept once, at its first place
    # (the null section's name is the empty string at offset 0)
    assert info.section_names == ("", ".interp", ".dynstr", ".note.gnu.build-id", ".dynamic", ".dynsym",
                                  ".note.dup", ".shstrtab")


def _expected_symbols(prefixes=None) -> list:
    """SYNTH_SYMBOLS as read_elf reports them: LOCAL ones and the null entry left out."""
    versions = {2: "V1", 3: "V2", 10: "GLIBC_2.2", 11: "GLIBC_2.34"}
    binds = {1: "GLOBAL", 2: "WEAK"}
    types = {1: "OBJECT", 2: "FUNC", 10: "IFUNC"}
    out = []
    for name, bind, kind, defined, ver in SYNTH_SYMBOLS[1:]:
        if bind == 0 or (prefixes and not name.startswith(prefixes)):
            continue
        out.append((name, defined, binds.get(bind, str(bind)), types.get(kind, str(kind)),
                    versions.get(ver & 0x7FFF), bool(ver & 0x8000)))
    return out


@needs_c
@pytest.mark.parametrize("is64", [True, False], ids=["elf64", "elf32"])
@pytest.mark.parametrize("little", [True, False], ids=["le", "be"])
@pytest.mark.parametrize("dynsym_section", [True, False], ids=["dynsym", "hash-count"])
def test_hand_built_symbols(tmp_path, is64, little, dynsym_section):
    path = tmp_path / "libsynth.so"
    path.write_bytes(synth_elf(is64, little, dynsym_section=dynsym_section))
    for symbols, prefixes in ((True, None), (("_ZN3c10", "_ZN2at"), ("_ZN3c10", "_ZN2at"))):
        ours = c_verdict(str(path), symbols)
        assert ours == python_verdict(str(path), symbols)
        assert [(s.name, s.defined, s.binding, s.type, s.version, s.hidden) for s in ours[1].symbols] == \
            _expected_symbols(prefixes)


def _linked_32bit(tmp_path) -> list:
    """Real i386 shared objects: gcc -m32 -c, then ld -m elf_i386 (no 32-bit libgcc needed)."""
    if not shutil.which("gcc") or not shutil.which("ld"):
        pytest.skip("gcc/ld not installed")
    (tmp_path / "dep.c").write_text("int dep_v1(void){return 1;} int dep_v2(void){return 2;}\n")
    (tmp_path / "dep.map").write_text("DEP_1 { global: dep_v1; local: *; };\nDEP_2 { global: dep_v2; } DEP_1;\n")
    (tmp_path / "use.c").write_text("int dep_v1(void); int dep_v2(void); int use(void){return dep_v1()+dep_v2();}\n")
    for name in ("dep", "use"):
        built = subprocess.run(["gcc", "-m32", "-fPIC", "-c", str(tmp_path / f"{name}.c"), "-o",
                                str(tmp_path / f"{name}.o")], capture_output=True, text=True, errors="replace")
        if built.returncode != 0:
            pytest.skip(f"gcc -m32 cannot compile here: {built.stderr.strip()[-200:]}")
    subprocess.run(["ld", "-m", "elf_i386", "-shared", "-soname", "libdep.so.1", "--version-script",
                    str(tmp_path / "dep.map"), "--build-id", str(tmp_path / "dep.o"), "-o", str(tmp_path / "libdep.so")],
                   check=True)
    subprocess.run(["ld", "-m", "elf_i386", "-shared", "-soname", "libuse.so", "-rpath", "$ORIGIN/lib",
                    "--enable-new-dtags", str(tmp_path / "use.o"), str(tmp_path / "libdep.so"), "-o",
                    str(tmp_path / "libuse.so")], check=True)
    return [tmp_path / "libdep.so", tmp_path / "libuse.so"]


@needs_c
def test_real_32bit_objects(tmp_path):
    dep, use = _linked_32bit(tmp_path)
    for path in (dep, use):
        for symbols in (False, True, ("dep_",)):
            ours = c_verdict(str(path), symbols)
            assert ours == python_verdict(str(path), symbols)
    assert {(s.name, s.version, s.defined) for s in fastread.read(str(use), ("dep_",)).symbols} == \
        {("dep_v1", "DEP_1", False), ("dep_v2", "DEP_2", False)}
    info = fastread.read(str(use))
    assert (info.elf_class, info.needed, info.runpath) == (32, ("libdep.so.1",), ("$ORIGIN/lib",))
    assert [(v.file, [name for name, _weak in v.versions]) for v in info.version_needs] == \
        [("libdep.so.1", ["DEP_1", "DEP_2"])]
    assert fastread.read(str(dep)).version_defs == ("DEP_1", "DEP_2")


@needs_c
def test_symbol_count_from_gnu_hash_without_section_headers(tmp_path):
    """Stripped of its section headers, a GNU-hash-only library (Debian builds them so)
    gives the same symbols through DT_GNU_HASH's chains as through .dynsym's size."""
    source = os.path.realpath("/usr/lib/x86_64-linux-gnu/libz.so.1")
    if not os.path.exists(source):
        pytest.skip("no libz on this host")
    data = bytearray(open(source, "rb").read())
    struct.pack_into("<H", data, 0x3C, 0)  # e_shnum
    path = tmp_path / "libz-nosections.so"
    path.write_bytes(bytes(data))
    stripped = c_verdict(str(path), True)
    assert stripped == python_verdict(str(path), True)
    whole = c_verdict(source, True)[1]
    assert not stripped[1].has_sections and whole.has_sections
    assert stripped[1].symbols == whole.symbols and len(whole.symbols) > 50


@needs_c
def test_os_level_failures_say_what_the_python_reader_says(tmp_path):
    (tmp_path / "short").write_bytes(b"\x7fELF\x02")
    (tmp_path / "text").write_text("not an elf at all, but long enough\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # must not wait for a writer
    secret = tmp_path / "secret.so"
    secret.write_bytes(synth_elf(True, True))
    secret.chmod(0)
    cases = [tmp_path / "missing", tmp_path, tmp_path / "short", tmp_path / "text", fifo]
    if os.geteuid() != 0:
        cases.append(secret)
    for path in cases:
        theirs = python_verdict(str(path))
        assert theirs[0] == "error"
        assert c_verdict(str(path)) == theirs


@needs_c
def test_output_too_large_for_the_buffers_falls_back_to_python(tmp_path):
    """2 MB of DT_NEEDED strings (100 entries naming one 20 KB string) overflow the 1 MB
    output: the C reader declines and read_elf answers through the Python reader."""
    path = tmp_path / "libwide.so"
    path.write_bytes(synth_elf(True, True, needed=["x" * 20000] * 100))
    assert fastread.read(str(path)) is None
    info = reader.read_elf(str(path))
    assert info.needed == ("x" * 20000,) * 100
    assert python_verdict(str(path))[1] == info


def test_python_reader_when_forced_or_not_built(tmp_path, monkeypatch):
    path = tmp_path / "libsynth.so"
    path.write_bytes(synth_elf(True, True))
    calls = []
    real = fastread.read
    monkeypatch.setattr(fastread, "read", lambda p: calls.append(p) or real(p))
    monkeypatch.setenv("SEEDANCE_ELF_READER", "python")
    forced = reader.read_elf(str(path))
    assert calls == []
    monkeypatch.delenv("SEEDANCE_ELF_READER")
    monkeypatch.setattr(fastread, "_lib", False)  # as when the extension was never built
    assert reader.read_elf(str(path)) == forced and calls == []
    assert forced.needed == ("libc.so.6",)


def _report(command: list, reader: str | None) -> tuple:
    env = {k: v for k, v in os.environ.items() if k != "SEEDANCE_ELF_READER"}
    if reader:
        env["SEEDANCE_ELF_READER"] = reader
    done = subprocess.run(command, env=env, capture_output=True, text=True, errors="replace", timeout=600)

    def without_times(value):
        if isinstance(value, dict):
            return {k: without_times(v) for k, v in value.items() if k != "duration_s"}
        if isinstance(value, list):
            return [without_times(v) for v in value]
        return value

    return done.returncode, without_times(json.loads(done.stdout))


@needs_c
def test_check_reports_the_same_with_either_reader(tmp_path):
    """The whole `seedance check --json` on a tree with findings (a missing library, a
    version node its provider lacks) and on /usr/lib: one report, either reader."""
    if not shutil.which("gcc"):
        pytest.skip("gcc not installed")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tmp_path / "dep.c").write_text("int dep_v1(void){return 1;} int dep_v2(void){return 2;}\n")
    (tmp_path / "dep2.map").write_text("DEP_1 { global: dep_v1; local: *; };\nDEP_2 { global: dep_v2; } DEP_1;\n")
    (tmp_path / "dep1.map").write_text("DEP_1 { global: dep_v1; dep_v2; local: *; };\n")
    (tmp_path / "use.c").write_text("int dep_v1(void); int dep_v2(void); int use(void){return dep_v1()+dep_v2();}\n")
    gcc = ["gcc", "-shared", "-fPIC"]
    subprocess.run([*gcc, "-o", str(tmp_path / "libdep.so.1"), str(tmp_path / "dep.c"), "-Wl,-soname,libdep.so.1",
                    f"-Wl,--version-script,{tmp_path / 'dep2.map'}"], check=True)
    subprocess.run([*gcc, "-o", str(tree / "libuse.so"), str(tmp_path / "use.c"), str(tmp_path / "libdep.so.1"),
                    "-Wl,-rpath,$ORIGIN", "-Wl,--no-as-needed", "-lm"], check=True)
    # the provider next to it defines DEP_1 only; and a library nothing provides
    subprocess.run([*gcc, "-o", str(tree / "libdep.so.1"), str(tmp_path / "dep.c"), "-Wl,-soname,libdep.so.1",
                    f"-Wl,--version-script,{tmp_path / 'dep1.map'}"], check=True)
    subprocess.run([*gcc, "-o", str(tree / "liblost.so"), str(tmp_path / "use.c"), "-Wl,-rpath,$ORIGIN/none",
                    str(tmp_path / "libdep.so.1")], check=True)
    # --no-cache: each reader really reads (a report from the check cache would answer for both)
    seedance = [sys.executable, "-m", "seedance", "check", "--no-cache", "--no-progress", "--json"]
    for target in (str(tree), "/usr/lib/x86_64-linux-gnu"):
        if not os.path.isdir(target):
            continue
        ours, theirs = _report([*seedance, target], None), _report([*seedance, target], "python")
        assert ours == theirs
    code, report = _report([*seedance, str(tree)], None)
    assert code == 1, report  # the findings are there to be compared
    rules = {finding.get("rule") for finding in report.get("findings", [])}
    assert {"symbol-version-missing", "needed-missing"} & rules, rules


@needs_c
def test_generated_cffi_wrapper_is_current():
    pytest.importorskip("cffi")
    sys.path.insert(0, str(ROOT / "agent" / "elf"))
    try:
        import build_fastelf
    finally:
        sys.path.pop(0)
    assert build_fastelf.wrapper_source() == build_fastelf.WRAPPER.read_text(), \
        "agent/elf/_fastelf_cffi.c is stale: python agent/elf/build_fastelf.py --cffi"



def _has_property_segment(data: bytes) -> bool:
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4:6] != b"\x02\x01":
        return False
    phoff = struct.unpack_from("<Q", data, 0x20)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return any(struct.unpack_from("<I", data, phoff + i * phentsize)[0] == properties.PT_GNU_PROPERTY
               for i in range(phnum) if phoff + i * phentsize + 4 <= len(data))


def _property_seed(tmp_path):
    """An x86-64 object with a PT_GNU_PROPERTY segment: one of the host's, or built here
    with the ISA-level note (binutils 2.32+ writes the segment with it)."""
    for path in ("/usr/bin/true", "/bin/true", "/usr/lib/x86_64-linux-gnu/libc.so.6", sys.executable):
        if os.path.exists(path):
            data = open(os.path.realpath(path), "rb").read()
            if _has_property_segment(data):
                return data
    if shutil.which("gcc"):
        (tmp_path / "p.c").write_text("int p(void) { return 1; }\n")
        built = subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-z,x86-64-baseline", "-o", str(tmp_path / "p.so"),
                                str(tmp_path / "p.c")], capture_output=True)
        if built.returncode == 0:
            data = (tmp_path / "p.so").read_bytes()
            if _has_property_segment(data):
                return data
    return None


def _property_edges(data: bytes):
    """(label, mutated image) for every bound properties.x86_isa_needed keeps, applied to an
    object with a PT_GNU_PROPERTY segment: the header, the program-header table, the
    segment's offset and size, and each field of its note and properties."""
    phoff = struct.unpack_from("<Q", data, 0x20)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    at = next(phoff + i * phentsize for i in range(phnum)
              if struct.unpack_from("<I", data, phoff + i * phentsize)[0] == properties.PT_GNU_PROPERTY)
    seg_off, seg_size = struct.unpack_from("<Q", data, at + 8)[0], struct.unpack_from("<Q", data, at + 32)[0]

    def put(fmt, where, value, base=data):
        out = bytearray(base)
        struct.pack_into(fmt, out, where, value)
        return bytes(out)

    yield "as built", data
    for value in (55, 57):
        yield f"e_phentsize {value}", put("<H", 0x36, value)
    for value in (4097, phnum + 1):
        yield f"e_phnum {value}", put("<H", 0x38, value)
    # a table of 4096 or 4097 entries that the file really holds (zero padding after it)
    padded = data + bytes(4097 * phentsize)
    moved = len(data)
    table = bytearray(padded)
    table[moved:moved + phentsize * phnum] = data[phoff:phoff + phentsize * phnum]
    struct.pack_into("<Q", table, 0x20, moved)
    for value in (4096, 4097):
        yield f"e_phnum {value}, table held", put("<H", 0x38, value, bytes(table))
    index = (at - phoff) // phentsize
    if index > 0:
        yield "e_phnum ending before PT_GNU_PROPERTY", put("<H", 0x38, index)
    yield "machine 3", put("<H", 18, 3)
    yield "program headers cut by the end", data[:phoff + phentsize * phnum - 10]
    for value in (0, 1, 7, 16, seg_size + 8, 65536, 65537, 1 << 40):
        yield f"p_filesz {value}", put("<Q", at + 32, value)
    for value in (len(data) - 8, len(data), len(data) + 100, (1 << 63) - 1, 1 << 63, (1 << 64) - 1):
        yield f"p_offset {value}", put("<Q", at + 8, value)
    yield "segment cut by the end", data[:seg_off + seg_size - 4]
    # the note: namesz, descsz, type, name, then pr_type, pr_datasz of the first property
    for value in (0, 3, 4, 5, 8, 0xFFFFFFFF):
        yield f"namesz {value}", put("<I", seg_off, value)
    for value in (0, 7, 8, 15, 16, 24, 0xFFFFFFF0):
        yield f"descsz {value}", put("<I", seg_off + 4, value)
    for value in (1, 4, 5, 6):
        yield f"note type {value}", put("<I", seg_off + 8, value)
    yield "name GNX", put("<4s", seg_off + 12, b"GNX\0")
    yield "name GNU without NUL", put("<4s", seg_off + 12, b"GNUX")
    for value in (properties.GNU_PROPERTY_X86_ISA_1_NEEDED, 0xC0008001, 0):
        for datasz in (0, 3, 4, 5, 8, 0xFFFFFFFF):
            image = put("<I", seg_off + 16, value)
            yield f"pr_type {value:#x} pr_datasz {datasz}", put("<I", seg_off + 20, datasz, image)
    needed = put("<I", seg_off + 16, properties.GNU_PROPERTY_X86_ISA_1_NEEDED)
    for mask in (1, 2, 4, 8, 0xF, 0xFFFFFFFF):
        yield f"ISA_1_NEEDED {mask:#x}", put("<I", seg_off + 24, mask, put("<I", seg_off + 20, 4, needed))


@needs_c
def test_isa_level_of_the_c_read_equals_properties_at_every_bound(tmp_path):
    """The ISA level the C reader takes from the image it parsed (scan's cpu_isa facts use
    it) against properties.x86_isa_needed reading the file again, on one real object
    changed at each bound the Python function keeps."""
    data = _property_seed(tmp_path)
    if data is None:
        pytest.skip("no x86-64 object with a PT_GNU_PROPERTY segment here, and gcc wrote none")
    edges = list(_property_edges(data))
    path = tmp_path / "edge.so"
    compared, differences, marked = 0, [], set()
    for label, image in edges:
        path.write_bytes(image)
        if c_verdict(str(path))[0] != "ok":
            continue  # the C reader refused it: scan then asks properties.py itself
        compared += 1
        marked.add(properties.x86_isa_needed(str(path)))
        if isa_differs(str(path)):
            differences.append((label, isa_differs(str(path))))
    assert not differences, differences
    assert compared > len(edges) // 2 and len(marked) > 3, (compared, marked)


@needs_c
@pytest.mark.parametrize("tree", TREES)
def test_symbol_tables_from_the_raw_symbols_equal_the_resolvers(tree):
    """The version-gap check reads whole symbol tables through fastread.symbol_tables (no
    Symbol objects): every seventh ELF file of the tree, and every NVIDIA and torch library
    (whose per-symbol versions the check is about), against Resolver._symbol_tables over
    the Python reader's symbols."""
    if not os.path.isdir(tree):
        pytest.skip(f"{tree} is not on this host")
    files = _TREE_FILES.get(tree) or _TREE_FILES.setdefault(tree, elf_files(tree))
    chosen = sorted(set(files[::7]) | {f for f in files if "/nvidia/" in f or "/torch/lib/" in f})
    differences, compared = [], 0
    for path in chosen:
        theirs = python_verdict(path, True)
        if theirs[0] != "ok":
            continue
        compared += 1
        if tables_differ(path, theirs[1]) or exports_differ(path):
            differences.append(path)
    assert compared and not differences[:3], f"{len(differences)} of {compared} differ"

@needs_c
def test_fuzz_same_verdicts_and_no_crash():
    count = int(os.environ.get("SEEDANCE_FASTELF_FUZZ", "3000"))
    child = subprocess.run([sys.executable, __file__, "--fuzz", str(count), "13"], capture_output=True,
                           text=True, errors="replace", timeout=600)
    assert child.returncode == 0, f"fuzz child died (rc {child.returncode}): {child.stderr[-2000:]}"
    summary = json.loads(child.stdout.strip().splitlines()[-1])
    assert summary["compared"] == count
    assert summary["mismatches"] == []
    # both verdicts well represented, or the mutations were too gentle or too harsh to mean much
    assert summary["ok"] > count // 10 and summary["error"] > count // 10, summary
    assert summary["isa_marked"] > count // 10, summary  # the ISA note was there to compare


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--fuzz":
        print(json.dumps(fuzz(int(sys.argv[2]), int(sys.argv[3]))))
    else:
        sys.exit(__doc__)
