"""The shim as built: no libpython, the cdef parses, the hooks match NVIDIA's prototypes."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CUDA_INCLUDE = Path("/usr/local/cuda/include")


def test_installed_library_needs_no_libpython():
    from seedance import shim

    path = shim.library_path()
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(path)], capture_output=True, text=True).stdout
    assert not re.search(r"\bPy\w+", undefined)
    needed = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
    assert "libpython" not in needed


def test_exports_exactly_the_hooks_the_audit_interface_and_helpers():
    from seedance import shim

    hooks = re.findall(r"^HOOK\(\w+,\s*(\w+),", (ROOT / "shim/src/hooks.def").read_text(), re.M)
    out = subprocess.run(["nm", "-D", "--defined-only", str(shim.library_path())], capture_output=True, text=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.split()[-2] in ("T", "W")}
    ours = {name for name in exported if not name.startswith(("seedance_", "la_")) and name != "dlsym"}
    assert ours == set(hooks)
    assert {"la_version", "la_objsearch", "la_objopen", "la_symbind64", "dlsym"} <= exported


def test_binding_checks_version_and_names_every_api():
    from seedance import shim

    ffi, lib = shim.binding()
    assert lib.seedance_shim_abi_version() == lib.SD_ABI_VERSION
    assert ffi.sizeof("struct sd_event") == 256


@pytest.mark.skipif(not (CUDA_INCLUDE / "cuda.h").exists(), reason="no CUDA toolkit headers in /usr/local/cuda")
@pytest.mark.parametrize("source", ["hooks.c", "memory.c", "device.c", "launch.c"])
def test_hook_signatures_match_cuda_h(source, tmp_path):
    """Compiled against NVIDIA's cuda.h, any hook whose prototype differs is an error."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    p = subprocess.run(["cc", "-fsyntax-only", "-Werror", "-DSD_CHECK_WITH_CUDA_H", f"-I{CUDA_INCLUDE}",
                        str(ROOT / "shim/src" / source)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_product_library_has_no_test_hooks():
    """Issue 17: test-only knobs are compiled only into the tests' build (-DSEEDANCE_TEST_HOOKS)."""
    from seedance import shim

    data = shim.library_path().read_bytes()
    assert b"SEEDANCE_TEST_" not in data
    assert b"SEEDANCE_MEM_LIMIT" in data          # the oracle can see strings at all


def test_preparsed_cffi_module_matches_the_header():
    """shim/_shim_cffi.py is generated from seedance_shim.h; a stale copy would misread the registry."""
    pytest.importorskip("cffi")
    from seedance.shim import build_shim

    assert build_shim.FFI_MODULE.read_text() == build_shim.ffi_module_source(), \
        "run `python shim/build_shim.py --ffi` (or reinstall) to regenerate shim/_shim_cffi.py"


def _wheel_cudart() -> Path | None:
    try:
        import nvidia.cuda_runtime as runtime
    except ImportError:
        return None
    for base in map(Path, runtime.__path__):
        if (base / "lib" / "libcudart.so.12").exists():
            return base / "lib"
    return None


def test_real_runtime_still_refuses_the_fake_driver(built, env):
    """The reason tests/fakecuda/fakecudart.c exists, checked: the real libcudart over the
    fake driver answers cudaErrorCallRequiresNewerDriver (36), because the fake has no
    cuGetProcAddress answer for cuGetExportTable.  If this ever passes, drop the stand-in."""
    lib = _wheel_cudart()
    if lib is None:
        pytest.skip("the nvidia-cuda-runtime-cu12 wheel is not installed")
    exe = built["dir"] / "sdrt_real"
    subprocess.run(["cc", "-O2", str(ROOT / "tests/shim/sdrt.c"), "-o", str(exe), f"-L{lib}", "-l:libcudart.so.12"],
                   check=True, capture_output=True)
    run_env = dict(env, LD_LIBRARY_PATH=f"{lib}:{built['dir']}")   # the wheel's runtime first
    p = subprocess.run([str(exe), "4096"], env=run_env, capture_output=True, text=True, timeout=60)
    assert p.stdout.splitlines()[0] == "count result=36 count=-1", p.stdout + p.stderr
    # the fake driver is the one answering: the stand-in runtime over it works
    p = subprocess.run([str(built["runtime"]), "4096"], env=env, capture_output=True, text=True, timeout=60)
    assert p.stdout.splitlines()[0] == "count result=0 count=2", p.stdout + p.stderr
