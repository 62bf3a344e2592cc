"""In-place .dynstr edits: zero growth when the name fits, nothing shared ever clobbered."""
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seedance.elf.reader import read_elf
from seedance.model.errors import ELFError
from seedance.fix import dynedit

SITE = Path(sysconfig.get_paths()["purelib"])
CU12 = SITE / "nvidia" / "cuda_runtime" / "lib"
TORCH_LIB = SITE / "torch" / "lib"


MAPPED_CUDART = ("import ctypes, os, sys; ctypes.CDLL(sys.argv[1], os.RTLD_NOW);"
                 "print(*sorted({os.path.basename(l.split()[-1]) for l in open('/proc/self/maps') if 'libcudart' in l}))")


def gcc(out, source, *args, cwd):
    src = Path(cwd) / (Path(out).name + ".c")
    src.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src), *args], check=True, cwd=cwd)
    return Path(out)


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("dynedit")
    gcc(d / "libfoo.so.1", "int foo(void){return 1;}", "-Wl,-soname,libfoo.so.1", cwd=d)
    gcc(d / "libfoo.so.2", "int foo(void){return 2;}", "-Wl,-soname,libfoo.so.2", cwd=d)
    k = gcc(d / "libk.so", "int cudaRuntimeGetVersion(int*);\nint v(void){int x=0;cudaRuntimeGetVersion(&x);return x;}",
            f"-L{CU12}", "-l:libcudart.so.12", f"-Wl,-rpath,{CU12}", cwd=d)
    # "oo.so.1" is tail-merged into "libfoo.so.1" by ld: overwriting that string would rename the symbol
    sfx = gcc(d / "libsfx.so", 'int tail __asm__("oo.so.1") = 1;\nint foo(void);\nint use(void){return foo();}',
              f"-L{d}", "-l:libfoo.so.1", f"-Wl,-rpath,{d}", cwd=d)
    reuse = gcc(d / "libreuse.so", "int foo(void);\nint use(void){return foo();}",
                f"-L{d}", "-l:libfoo.so.1", "-Wl,-soname,libfoo.so.2", cwd=d)
    return {"dir": d, "k": k, "sfx": sfx, "reuse": reuse}


def verneed_of(path):
    """(file, [(name, hash)]) from pyelftools, an independent parser."""
    with open(path, "rb") as handle:
        elf = ELFFile(handle)
        out = []
        for section in elf.iter_sections():
            if isinstance(section, GNUVerNeedSection):
                for verneed, auxes in section.iter_versions():
                    out.append((verneed.name, [(aux.name, aux["vna_hash"]) for aux in auxes]))
        return out


def test_elf_hash_matches_vna_hash_in_real_files():
    seen = 0
    for path in ("/usr/lib/x86_64-linux-gnu/libcurl.so.4", str(CU12 / "libcudart.so.12")):
        for _file, auxes in verneed_of(path):
            for name, value in auxes:
                assert dynedit.elf_hash(name.encode()) == value, name
                seen += 1
    assert seen > 5


def test_same_length_rename_is_in_place_with_zero_growth(libs):
    data = libs["k"].read_bytes()
    new, strategy, changes = dynedit.rename_needed_bytes(
        data, {"libcudart.so.12": "libcudart.so.13"}, {"libcudart.so.12": "libcudart.so.13"})
    assert strategy == "in-place" and len(new) == len(data)
    assert sum(a != b for a, b in zip(data, new)) <= 8  # one string digit + the hash bytes
    out = libs["dir"] / "k13.so"
    out.write_bytes(new)
    info = read_elf(str(out))
    assert "libcudart.so.13" in info.needed and "libcudart.so.12" not in info.needed
    [(file, auxes)] = verneed_of(out)
    assert file == "libcudart.so.13"
    assert auxes == [("libcudart.so.13", dynedit.elf_hash(b"libcudart.so.13"))]
    # the CUDA 13 toolkit's runtime defines that node: the result really loads
    proc = subprocess.run([sys.executable, "-c", "import ctypes,sys; print(ctypes.CDLL(sys.argv[1]).v())", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith("13")


def test_repeated_runs_never_grow_and_round_trip_restores_bytes(libs):
    data = libs["k"].read_bytes()
    once, _, _ = dynedit.rename_needed_bytes(data, {"libcudart.so.12": "libcudart.so.13"},
                                             {"libcudart.so.12": "libcudart.so.13"})
    twice, strategy, changes = dynedit.rename_needed_bytes(once, {"libcudart.so.12": "libcudart.so.13"},
                                                           {"libcudart.so.12": "libcudart.so.13"})
    assert strategy == "none" and twice == once and changes == []
    back, _, _ = dynedit.rename_needed_bytes(once, {"libcudart.so.13": "libcudart.so.12"},
                                             {"libcudart.so.13": "libcudart.so.12"})
    assert back == data


def test_shorter_name_fits_in_place(libs):
    data = libs["k"].read_bytes()
    new, strategy, _ = dynedit.rename_needed_bytes(data, {"libcudart.so.12": "libcudart.so"},
                                                   {"libcudart.so.12": "libcudart.so"})
    assert strategy == "in-place" and len(new) == len(data)
    # the version node shares the string: renaming NEEDED alone must not overwrite it
    new, strategy, _ = dynedit.rename_needed_bytes(data, {"libcudart.so.12": "libcudart.so"})
    assert strategy != "in-place" and len(new) == len(data)
    out = libs["dir"] / "short.so"
    out.write_bytes(new)
    assert verneed_of(out)[0][1][0][0] == "libcudart.so.12"


def test_existing_identical_string_is_reused(libs):
    data = libs["reuse"].read_bytes()
    new, strategy, _ = dynedit.rename_needed_bytes(data, {"libfoo.so.1": "libfoo.so.2"})
    assert strategy == "reuse" and len(new) == len(data)
    out = libs["dir"] / "reused.so"
    out.write_bytes(new)
    info = read_elf(str(out))
    assert info.needed == ("libfoo.so.2",) and info.soname == "libfoo.so.2"


def test_tail_shared_string_is_never_overwritten(libs):
    data = libs["sfx"].read_bytes()
    new, strategy, _ = dynedit.rename_needed_bytes(data, {"libfoo.so.1": "libfoo.so.2"})
    assert strategy != "in-place"
    out = libs["dir"] / "sfx2.so"
    out.write_bytes(new)
    info = read_elf(str(out), symbols=True)
    assert info.needed == ("libfoo.so.2",)
    assert "oo.so.1" in {s.name for s in info.symbols if s.defined}
    proc = subprocess.run([sys.executable, "-c", "import ctypes,sys; print(ctypes.CDLL(sys.argv[1]).use())", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "2", proc.stderr


def test_longer_name_moves_dynstr_into_segment_slack_with_zero_growth(libs):
    data = libs["k"].read_bytes()
    new, strategy, _ = dynedit.rename_needed_bytes(data, {"libcudart.so.12": "libcudart.so.11.0"},
                                                   {"libcudart.so.12": "libcudart.so.11.0"})
    assert strategy == "moved-dynstr" and len(new) == len(data)
    out = libs["dir"] / "k11.so"
    out.write_bytes(new)
    assert verneed_of(out) == [("libcudart.so.11.0", [("libcudart.so.11.0", dynedit.elf_hash(b"libcudart.so.11.0"))])]
    stripped = libs["dir"] / "k11-stripped.so"
    shutil.copy(out, stripped)
    subprocess.run(["strip", str(stripped)], check=True)  # the new .dynstr is a real section: strip keeps it
    assert "libcudart.so.11.0" in read_elf(str(stripped)).needed
    proc = subprocess.run([sys.executable, "-c", MAPPED_CUDART, str(out)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "LD_LIBRARY_PATH": str(CU12)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "libcudart.so.11.0"


def test_lief_fallback_renames_needed_and_version_r(libs):
    data = libs["k"].read_bytes()
    new, strategy, changes = dynedit._rename_with_lief(data, {"libcudart.so.12": "libcudart.so.11.0"},
                                                       {"libcudart.so.12": "libcudart.so.11.0"}, "k")
    assert strategy == "lief" and len(changes) == 3
    out = libs["dir"] / "k11-lief.so"
    out.write_bytes(new)
    assert verneed_of(out) == [("libcudart.so.11.0", [("libcudart.so.11.0", dynedit.elf_hash(b"libcudart.so.11.0"))])]


@pytest.mark.parametrize("path", [TORCH_LIB / "libtorch.so", TORCH_LIB / "libshm.so", CU12 / "libcudart.so.12"])
def test_real_torch_and_nvidia_libraries_round_trip(path, tmp_path):
    data = path.read_bytes()
    old = read_elf(str(path)).needed[0]
    new_name = old[:-1] + ("x" if old[-1] != "x" else "y")
    edited, strategy, _ = dynedit.rename_needed_bytes(data, {old: new_name})
    assert strategy == "in-place" and len(edited) == len(data)
    out = tmp_path / path.name
    out.write_bytes(edited)
    assert read_elf(str(out)).needed[0] == new_name
    back, _, _ = dynedit.rename_needed_bytes(edited, {new_name: old})
    assert back == data


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=40)
       | st.just("libcudart.so.12"))
def test_any_new_name_gives_a_valid_file_that_never_grows_when_it_fits(libs, name, tmp_path_factory):
    data = libs["k"].read_bytes()
    new, strategy, _ = dynedit.rename_needed_bytes(data, {"libcudart.so.12": name})
    if len(name) <= len("libcudart.so.12"):
        assert len(new) == len(data)
    out = tmp_path_factory.mktemp("h") / "out.so"
    out.write_bytes(new)
    if name == "libcudart.so.12":
        assert new == data  # renaming to the name it already has changes nothing
    info = read_elf(str(out))
    assert info.needed[0] == name
    assert [f for f, _ in verneed_of(out)] == [name]


@pytest.mark.parametrize("blob", [b"", b"not an elf at all" * 4, b"\x7fELF\x02\x01\x01" + b"\0" * 9 + b"\xff" * 60])
def test_bad_input_is_an_elf_error(blob):
    with pytest.raises(ELFError):
        dynedit.rename_needed_bytes(blob, {"a": "b"})


def test_no_slack_appends_to_the_last_segment_and_stays_smaller_than_patchelf(tmp_path):
    """libcurl's segments have no room for its 10 KB .dynstr: extend the RW segment instead."""
    src = Path("/usr/lib/x86_64-linux-gnu/libcurl.so.4")
    if not src.exists() or not shutil.which("patchelf"):
        pytest.skip("needs libcurl4 and patchelf")
    edit = dynedit.plan_file(str(src), {"libz.so.1": "libz.so.1.2.13"})
    assert edit.strategy == "appended"
    peer = tmp_path / "patchelf.so"
    shutil.copy(src, peer)
    subprocess.run(["patchelf", "--replace-needed", "libz.so.1", "libz.so.1.2.13", str(peer)], check=True)
    assert 0 < edit.growth <= peer.stat().st_size - src.stat().st_size
    out = tmp_path / "libcurl.so.4"
    out.write_bytes(edit.data)
    assert "libz.so.1.2.13" in read_elf(str(out)).needed and "libz.so.1" not in read_elf(str(out)).needed
    zdir = tmp_path / "z"
    zdir.mkdir()
    shutil.copy("/usr/lib/x86_64-linux-gnu/libz.so.1", zdir / "libz.so.1.2.13")
    proc = subprocess.run([sys.executable, "-c", "import ctypes, os, sys; ctypes.CDLL(sys.argv[1], os.RTLD_NOW)", str(out)],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "LD_LIBRARY_PATH": str(zdir)})
    assert proc.returncode == 0, proc.stderr
    stripped = tmp_path / "stripped.so"
    shutil.copy(out, stripped)
    subprocess.run(["strip", str(stripped)], check=True)
    assert "libz.so.1.2.13" in read_elf(str(stripped)).needed
    # a second run finds the name in place and changes nothing
    again = dynedit.plan_file(str(out), {"libz.so.1": "libz.so.1.2.13"})
    assert again.strategy == "none" and again.growth == 0
