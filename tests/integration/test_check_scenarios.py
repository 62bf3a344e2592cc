"""Real scenarios for `seedance check`: fixtures built with gcc/nvcc against the real NVIDIA
runtimes (nvidia-cuda-runtime-cu11/-cu12 wheels, the CUDA 13 toolkit).  Each broken tree
must raise exactly the right rules; the same tree built correctly raises none.  Where the
fixture is runnable, the real ld.so confirms what check claims.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import ROOT, run_cli

SCHEMA = json.loads((ROOT / "agent" / "schemas" / "report.schema.json").read_text())
GCC = shutil.which("gcc")
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
CUDA13 = Path("/usr/local/cuda/lib64/libcudart.so.13")


def _wheel_runtime_dir() -> Path | None:
    try:
        import nvidia.cuda_runtime as rt
    except ImportError:
        return None
    lib = Path(list(rt.__path__)[0]) / "lib"
    return lib if lib.is_dir() else None


WHEEL = _wheel_runtime_dir()
CU11 = WHEEL / "libcudart.so.11.0" if WHEEL else None
CU12 = WHEEL / "libcudart.so.12" if WHEEL else None

needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc not installed")
needs_cu11 = pytest.mark.skipif(CU11 is None or not CU11.exists(), reason="nvidia-cuda-runtime-cu11 wheel not installed")
needs_cu12 = pytest.mark.skipif(CU12 is None or not CU12.exists(), reason="nvidia-cuda-runtime-cu12 wheel not installed")
needs_cu13 = pytest.mark.skipif(not CUDA13.exists(), reason="CUDA 13 toolkit (libcudart.so.13) not installed")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not installed")

USES_CUDART = "int cudaRuntimeGetVersion(int *v);\nint {fn}(void) {{ int v = 0; cudaRuntimeGetVersion(&v); return v; }}\n"


def cc(*args):
    subprocess.run([GCC, *map(str, args)], check=True, capture_output=True)


def shared_lib(out: Path, source: str, *link):
    src = out.with_suffix(".c")
    src.write_text(source)
    cc("-shared", "-fPIC", src, "-o", out, *link)
    return out


def check(*args):
    """Run the real CLI with --json; every report is validated against the shipped schema."""
    proc = run_cli("check", "--json", "--no-progress", *args)
    assert proc.returncode in (0, 1), proc.stderr
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    jsonschema.validate(report, SCHEMA)
    return proc.returncode, report


def rules(report) -> list:
    return sorted(f["rule"] for f in report["findings"])


def run_ld(exe: Path) -> subprocess.CompletedProcess:
    """Ask the real ld.so: run the fixture (it only calls cudaRuntimeGetVersion, no GPU needed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
    return subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=30)


# --- (a) two runtime majors in one closure -------------------------------------------------

def build_two_runtimes(tmp: Path, second: Path) -> Path:
    shared_lib(tmp / "liba.so", USES_CUDART.format(fn="a"), f"-L{CU12.parent}", "-l:libcudart.so.12",
               f"-Wl,-rpath,{CU12.parent}")
    shared_lib(tmp / "libb.so", USES_CUDART.format(fn="b"), f"-L{second.parent}", f"-l:{second.name}",
               f"-Wl,-rpath,{second.parent}")
    main = tmp / "app.c"
    main.write_text("int a(void); int b(void);\nint main(void) { return (a() > 0 && b() > 0) ? 0 : 3; }\n")
    cc(main, "-o", tmp / "app", f"-L{tmp}", "-la", "-lb", "-Wl,-rpath,$ORIGIN")
    return tmp / "app"


@needs_gcc
@needs_cu12
@needs_cu13
def test_two_runtime_majors_in_one_closure(tmp_path):
    build_two_runtimes(tmp_path, CUDA13)
    code, report = check(tmp_path)
    assert rules(report) == ["cuda-runtime-mixed"]
    finding = report["findings"][0]
    # reported once, at the object whose closure brings the second runtime in
    assert finding["subject"] == {"path": str(tmp_path / "app")}
    assert finding["evidence"]["majors"] == [12, 13]
    assert finding["evidence"]["paths"] == sorted([str(CU12), str(CUDA13)])
    assert code == 1


@needs_gcc
@needs_cu12
def test_one_runtime_major_is_clean(tmp_path):
    app = build_two_runtimes(tmp_path, CU12)
    code, report = check(tmp_path)
    assert (code, report["findings"]) == (0, [])
    assert report["stats"]["elf_objects"] == 3
    assert run_ld(app).returncode == 0  # and the real loader agrees it loads


@needs_gcc
@needs_cu12
@pytest.mark.parametrize("driver, too_old", [
    ("12.4", False),         # nvidia-smi's "CUDA Version": a driver for CUDA 12.4, not driver 12.4
    ("550", False),          # a branch
    ("550.54.15", False),    # a full driver version
    ("11.8", True),          # a driver for CUDA 11.8 cannot run the 12.x runtime
    ("470.82.01", True),
])
def test_driver_version_forms_against_a_cuda12_runtime(tmp_path, driver, too_old):
    build_two_runtimes(tmp_path, CU12)
    code, report = check("--driver-version", driver, tmp_path)
    assert set(rules(report)) == ({"cuda-driver-too-old"} if too_old else set()), report["findings"]
    assert code == (1 if too_old else 0)
    for finding in report["findings"]:
        assert "None" not in finding["message"] and "None" not in finding["fix"]
        assert "--runtime 11" in finding["fix"]  # relink to the runtime this driver can run


# --- (b) a file named libcudart.so.12 that is really 11.x -----------------------------------

def build_renamed_runtime(tmp: Path, runtime: Path) -> Path:
    (tmp / "lib").mkdir()
    shutil.copy(CU12, tmp / "lib" / "libcudart.so.12")
    shared_lib(tmp / "libkern.so", USES_CUDART.format(fn="kern"), f"-L{CU12.parent}", "-l:libcudart.so.12",
               "-Wl,-rpath,$ORIGIN/lib")
    main = tmp / "app.c"
    main.write_text("int kern(void);\nint main(void) { return kern() > 0 ? 0 : 3; }\n")
    cc(main, "-o", tmp / "app", f"-L{tmp}", "-lkern", "-Wl,-rpath,$ORIGIN")
    # then the runtime beside it is swapped, as a careless copy or a bad package would do
    shutil.copy(runtime, tmp / "lib" / "libcudart.so.12")
    return tmp / "app"


@needs_gcc
@needs_cu11
@needs_cu12
def test_libcudart_so_12_that_is_really_11(tmp_path):
    app = build_renamed_runtime(tmp_path, CU11)
    code, report = check(tmp_path)
    # The name matches but the file is the 11.x runtime: its SONAME says so, and the
    # libcudart.so.12 version node libkern needs is not defined by it (ld.so refuses the load).
    assert rules(report) == ["needed-soname-mismatch", "symbol-version-missing"]
    by_rule = {f["rule"]: f for f in report["findings"]}
    mismatch = by_rule["needed-soname-mismatch"]
    assert mismatch["subject"] == {"path": str(tmp_path / "libkern.so")}
    assert mismatch["evidence"]["soname"] == "libcudart.so.11.0"
    assert mismatch["evidence"]["resolved_path"] == str(tmp_path / "lib" / "libcudart.so.12")
    version = by_rule["symbol-version-missing"]
    assert (version["evidence"]["version"], version["evidence"]["provider_versions"]) == (
        "libcudart.so.12", ["libcudart.so.11.0"])
    assert code == 1
    loaded = run_ld(app)
    assert loaded.returncode != 0 and "version `libcudart.so.12' not found" in loaded.stderr


@needs_gcc
@needs_cu12
def test_real_libcudart_so_12_is_clean(tmp_path):
    app = build_renamed_runtime(tmp_path, CU12)
    code, report = check(tmp_path)
    assert (code, report["findings"]) == (0, [])
    assert run_ld(app).returncode == 0


# --- (c) fatbins against a target architecture ---------------------------------------------

KERNEL = "__global__ void scale(float *x, float a) { x[threadIdx.x] *= a; }\n" \
         "extern \"C\" void launch(float *x) { scale<<<1, 32>>>(x, 2.0f); }\n"


@pytest.fixture(scope="module")
def fatbins(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc (CUDA toolkit) not installed")
    tmp = tmp_path_factory.mktemp("fatbins")
    src = tmp / "k.cu"
    src.write_text(KERNEL)
    builds = {"sm86": ["-gencode", "arch=compute_86,code=sm_86"],
              "sm80_ptx90": ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=compute_90"]}
    out = {}
    for name, flags in builds.items():
        (tmp / name).mkdir()
        lib = tmp / name / f"libk_{name}.so"
        subprocess.run([NVCC, "-shared", "-Xcompiler", "-fPIC", *flags, str(src), "-o", str(lib)],
                       check=True, capture_output=True)
        out[name] = lib
    return out


@needs_nvcc
def test_sm86_only_fatbin_on_sm90_is_arch_missing(fatbins):
    code, report = check("--arch", "sm_90", fatbins["sm86"])
    assert rules(report) == ["cuda-arch-missing"]
    finding = report["findings"][0]
    assert finding["subject"] == {"path": str(fatbins["sm86"])}
    assert (finding["evidence"]["sass"], finding["evidence"]["ptx"]) == (["sm_86"], [])
    assert finding["evidence"]["target_source"] == "--arch"
    assert code == 1
    # the same object on the GPU it was built for is fine (sm_86 SASS on an sm_86 device)
    code, report = check("--arch", "sm_86", fatbins["sm86"])
    assert (code, report["findings"]) == (0, [])


@needs_nvcc
def test_sm80_sass_plus_compute90_ptx_passes_on_sm90(fatbins):
    code, report = check("--arch", "sm_90", fatbins["sm80_ptx90"])
    assert (code, report["findings"]) == (0, [])
    assert report["stats"]["facts_by_kind"]["fatbin"] == 1
    # compute_90 PTX does not JIT down to an older GPU, but sm_80 SASS runs on sm_86
    code, report = check("--arch", "sm_86", fatbins["sm80_ptx90"])
    assert code == 0
    # sm_75 gets neither: no Turing SASS, and the PTX is for a newer compute capability
    code, report = check("--arch", "sm_75", fatbins["sm80_ptx90"])
    assert rules(report) == ["cuda-arch-missing"]


# --- (d) a missing version node -----------------------------------------------------------

def build_versioned(tmp: Path, provider_version: str) -> Path:
    script = tmp / "v1.map"
    script.write_text("VER_1 { global: foo; local: *; };\n")
    shared_lib(tmp / "libv.so", "int foo(void) { return 7; }\n", f"-Wl,--version-script={script}",
               "-Wl,-soname,libv.so")
    main = tmp / "app.c"
    main.write_text("int foo(void);\nint main(void) { return foo() == 7 ? 0 : 3; }\n")
    cc(main, "-o", tmp / "app", f"-L{tmp}", "-lv", "-Wl,-rpath,$ORIGIN")
    if provider_version != "VER_1":  # the provider is rebuilt without the node the app needs
        script.write_text(f"{provider_version} {{ global: foo; local: *; }};\n")
        shared_lib(tmp / "libv.so", "int foo(void) { return 7; }\n", f"-Wl,--version-script={script}",
                   "-Wl,-soname,libv.so")
    return tmp / "app"


@needs_gcc
def test_missing_version_node(tmp_path):
    app = build_versioned(tmp_path, "VER_2")
    code, report = check(tmp_path)
    assert rules(report) == ["symbol-version-missing"]
    finding = report["findings"][0]
    assert finding["subject"] == {"path": str(app)}
    assert (finding["evidence"]["version"], finding["evidence"]["provider_versions"]) == ("VER_1", ["VER_2"])
    assert code == 1
    loaded = run_ld(app)
    assert loaded.returncode != 0 and "version `VER_1' not found" in loaded.stderr
    # --strict adds the symbol-level view of the same break (foo@VER_1 has no provider)
    code, report = check("--strict", tmp_path)
    assert rules(report) == ["symbol-undefined", "symbol-version-missing"]


@needs_gcc
def test_matching_version_node_is_clean(tmp_path):
    app = build_versioned(tmp_path, "VER_1")
    code, report = check("--strict", tmp_path)
    assert (code, report["findings"]) == (0, [])
    assert run_ld(app).returncode == 0


# --- needed-unresolved and the explanation ---------------------------------------------------

@needs_gcc
def test_unresolved_needed_and_explain(tmp_path):
    lib = shared_lib(tmp_path / "libgone.so", "int gone(void) { return 1; }\n", "-Wl,-soname,libgone.so")
    main = tmp_path / "app.c"
    main.write_text("int gone(void);\nint main(void) { return gone(); }\n")
    cc(main, "-o", tmp_path / "app", f"-L{tmp_path}", "-lgone", "-Wl,-rpath,$ORIGIN/sub")
    lib.unlink()
    code, report = check(tmp_path)
    assert rules(report) == ["needed-unresolved"]
    assert report["findings"][0]["fix"] == f"seedance check --explain libgone.so {tmp_path / 'app'}"
    proc = run_cli("check", "--explain", "libgone.so", tmp_path / "app")
    assert proc.returncode == 1
    assert f"{tmp_path}/sub/libgone.so" in proc.stdout and "not found" in proc.stdout


# --- C++ ABI of an extension against the real torch wheel --------------------------------------

def _torch_lib() -> Path | None:
    from seedance.collect.torch_ext import find_torch
    torch = find_torch()
    lib = Path(torch.path) / "lib" if torch else None
    return lib if lib and (lib / "libc10.so").exists() else None


@needs_gcc
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_extension_with_old_abi_against_torch(tmp_path):
    torch_lib = _torch_lib()
    if torch_lib is None:
        pytest.skip("torch wheel not installed")
    src = tmp_path / "ext.cpp"
    # c10::Device(const std::string&) is a real libc10 export: only the std::string mangling differs
    src.write_text('#include <string>\nnamespace c10 { struct Device { Device(const std::string&); signed char t, i; }; }\n'
                   'void call() { c10::Device d("cpu"); }\n')
    for name, flag in (("old_abi.so", "0"), ("new_abi.so", "1")):
        subprocess.run(["g++", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={flag}", str(src), "-o",
                        str(tmp_path / name), f"-L{torch_lib}", "-Wl,--no-as-needed", "-lc10",
                        f"-Wl,-rpath,{torch_lib}"], check=True, capture_output=True)
    code, report = check(tmp_path)
    assert rules(report) == ["cxx-abi-mismatch"]
    finding = report["findings"][0]
    assert finding["subject"] == {"path": str(tmp_path / "old_abi.so")}
    assert (finding["evidence"]["ext_abi"], finding["evidence"]["torch_abi"]) == ("pre-cxx11", "cxx11")
    assert code == 1


@needs_gcc
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_extension_linked_like_cpp_extension_resolves_through_imported_torch(tmp_path):
    """-lc10 -ltorch without a RUNPATH, as torch.utils.cpp_extension links: loadable after
    `import torch`, which is how Python loads it; a NEEDED torch does not provide still fails."""
    torch_lib = _torch_lib()
    if torch_lib is None:
        pytest.skip("torch wheel not installed")
    (tmp_path / "libextra.c").write_text("int extra(void) { return 1; }\n")
    cc("-shared", "-fPIC", tmp_path / "libextra.c", "-o", tmp_path / "libextra.so", "-Wl,-soname,libextra.so")
    src = tmp_path / "ext.cpp"
    src.write_text('#include <string>\nnamespace c10 { struct Device { Device(const std::string&); signed char t, i; }; }\n'
                   'extern "C" int extra(void);\nvoid call() { c10::Device d("cpu"); extra(); }\n')
    ext = tmp_path / "pkg" / "_C.so"
    ext.parent.mkdir()
    subprocess.run(["g++", "-shared", "-fPIC", str(src), "-o", str(ext), f"-L{torch_lib}", f"-L{tmp_path}",
                    "-Wl,--no-as-needed", "-lc10", "-ltorch", "-lextra"], check=True, capture_output=True)
    # no torch beside it: --python names the interpreter whose torch imports it (issue 11, item 4)
    code, report = check("--python", sys.executable, ext)
    assert [(f["rule"], f["evidence"]["name"]) for f in report["findings"]] == [("needed-unresolved", "libextra.so")]
    proc = run_cli("check", "--explain", "libc10.so", ext)
    assert proc.returncode == 1  # alone (no torch imported first) the loader does not find it
