import os
import shutil
import subprocess
import sys

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
    assert fact.data["torch_abi"] == torch_abi_by_import(torch.path)
    assert ("Ss" in fact.data["example_symbol"]) is (expected == cxxabi.OLD)


def torch_abi_by_import(torch_dir: str) -> str:
    """The oracle: torch.compiled_with_cxx11_abi() of that torch, imported in a child."""
    site = os.path.dirname(torch_dir)
    proc = subprocess.run([sys.executable, "-c", "import torch; print(torch.compiled_with_cxx11_abi())"],
                          capture_output=True, text=True, errors="replace", timeout=300,
                          env={**os.environ, "PYTHONPATH": site})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return cxxabi.NEW if proc.stdout.strip().splitlines()[-1] == "True" else cxxabi.OLD


def nm_defined(path) -> list:
    """Independent of seedance's reader: binutils' view of the dynamic exports."""
    proc = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True,
                          errors="replace", check=True)
    return [line.split()[-1] for line in proc.stdout.splitlines() if len(line.split()) >= 3]


@pytest.mark.skipif(GXX is None or shutil.which("nm") is None, reason="g++ or binutils' nm not installed")
@pytest.mark.parametrize("c10_flag", ["0", "1"])
def test_torch_abi_ignores_statically_linked_std_cxx11_helpers(tmp_path, c10_flag):
    """libc10 of torch < 2.7 in miniature: c10 functions built with one ABI flag, plus libstdc++'s
    std::__cxx11::basic_string instantiated with the new ABI and exported (issue 11, item 4)."""
    (tmp_path / "c10part.cpp").write_text(
        "#include <string>\nnamespace c10 { void set_name(const std::string& s) { (void)s; }\n"
        "void rename(const std::string& a, const std::string& b) { (void)a; (void)b; } }\n")
    (tmp_path / "helpers.cpp").write_text("#include <string>\ntemplate class std::__cxx11::basic_string<char>;\n")
    lib = tmp_path / "libc10.so"
    for src, flag in (("c10part", c10_flag), ("helpers", "1")):
        subprocess.run([GXX, "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={flag}", "-c", str(tmp_path / f"{src}.cpp"),
                        "-o", str(tmp_path / f"{src}.o")], check=True)
    subprocess.run([GXX, "-shared", str(tmp_path / "c10part.o"), str(tmp_path / "helpers.o"), "-o", str(lib)],
                   check=True)
    exports = nm_defined(lib)
    helpers = [n for n in exports if "__cxx11" in n and not n.startswith("_ZN3c10")]
    assert len(helpers) > 10  # the trap is really there: far more std::__cxx11 exports than c10 ones
    expected = cxxabi.NEW if c10_flag == "1" else cxxabi.OLD
    assert cxxabi.TorchAbiCache().abi(str(lib)) == expected


@pytest.mark.skipif(shutil.which("nm") is None, reason="binutils' nm not installed")
def test_venv_torch_abi_matches_compiled_with_cxx11_abi():
    torch_ext = pytest.importorskip("seedance.collect.torch_ext")
    torch = torch_ext.find_torch()
    if torch is None:
        pytest.skip("torch wheel not installed")
    libc10 = os.path.join(torch.path, "lib", "libc10.so")
    assert cxxabi.TorchAbiCache().abi(libc10) == torch_abi_by_import(torch.path)
