import shutil
import subprocess

import pytest

from seedance.collect import cxxabi

OLD = "_ZN3c106detail14torchCheckFailEPKcS2_jRKSs"
NEW = "_ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"


@pytest.mark.parametrize("symbol, old, new", [
    (OLD, True, False),
    (NEW, False, True),
    ("_ZN3foo5isSslEv", False, False),        # "Ss" inside an identifier is not std::string
    ("_ZNSsC1Ev", True, False),               # std::string::string()
    ("_ZN3c105ErrorC1ENS_14SourceLocationESs", True, False),
    ("_Z3fooILi5EEvv", False, False),
])
def test_string_mangling(symbol, old, new):
    assert cxxabi.uses_old_string(symbol) is old
    assert cxxabi.uses_new_string(symbol) is new


def test_abi_of_majority_and_unknown():
    assert cxxabi.abi_of([OLD, "_Z3barv"]) == (cxxabi.OLD, OLD)
    assert cxxabi.abi_of([NEW, OLD, NEW]) == (cxxabi.NEW, NEW)
    assert cxxabi.abi_of(["_Z3barv", "printf"]) == (None, None)


GXX = shutil.which("g++")


@pytest.mark.skipif(GXX is None, reason="g++ not installed")
@pytest.mark.parametrize("abi_flag, expected", [("0", cxxabi.OLD), ("1", cxxabi.NEW)])
def test_real_extension_against_real_torch(tmp_path, abi_flag, expected):
    torch_ext = pytest.importorskip("seedance.collect.torch_ext")
    torch = torch_ext.find_torch()
    if torch is None:
        pytest.skip("torch wheel not installed")
    from seedance.elf.reader import read_elf

    src = tmp_path / "ext.cpp"
    src.write_text('#include <string>\nnamespace c10 { void set_name(const std::string&); }\n'
                   'void call() { c10::set_name("x"); }\n')
    out = tmp_path / "ext.so"
    subprocess.run([GXX, "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi_flag}", str(src), "-o", str(out),
                    f"-L{torch.path}/lib", "-Wl,--no-as-needed", "-lc10"], check=True)
    fact = cxxabi.cxx_abi_fact(str(out), read_elf(str(out), symbols=True),
                               [f"{torch.path}/lib/libc10.so"], cxxabi.TorchAbiCache())
    assert fact.data["ext_abi"] == expected
    assert fact.data["torch_abi"] == cxxabi.NEW  # torch 2.x wheels are built with the new ABI
    assert ("Ss" in fact.data["example_symbol"]) is (expected == cxxabi.OLD)
