"""Verdicts on the wider Python GPU ecosystem, with the real loader as the oracle.

- Vendored libraries renamed by a repair tool with a hash anywhere in the file name, the
  SONAME left plain (gcc-built, renamed as auditwheel and its peers do): ld.so loads the
  dependent with RTLD_NOW, so no needed-soname-mismatch; a file of another major or
  another library under such a name fails or is another library, and stays an error.
- bitsandbytes (a real wheel) beside the torch of this venv: the variant it picks is the one
  its own import loads (the oracle: `import bitsandbytes` and the library it mapped); the
  others are info, never errors, and the check exits 0.
- onnxruntime-gpu (a real wheel): the TensorRT provider is an optional provider, a warning
  naming what it needs (the oracle: RTLD_NOW fails on exactly those names).

Wheels are cached outside the repository (tests/accuracy/conftest.py); a wheel pip cannot
fetch skips its test with the reason.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from seedance.resolve.names import same_library
from tests.accuracy.conftest import Unavailable, install, site
from tests.conftest import run_cli

GCC = shutil.which("gcc")
PATCHELF = shutil.which("patchelf")


def load_now(path, preload=()) -> tuple:
    """(loaded, ld.so's message): RTLD_NOW in a fresh interpreter, after ``preload`` RTLD_GLOBAL."""
    code = ("import ctypes, os, sys\n"
            "for p in sys.argv[2:]: ctypes.CDLL(p, os.RTLD_NOW | os.RTLD_GLOBAL)\n"
            "ctypes.CDLL(sys.argv[1], os.RTLD_NOW)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path), *map(str, preload)],
                          capture_output=True, text=True, errors="replace", timeout=120)
    return proc.returncode == 0, proc.stderr.strip().splitlines()[-1:] or [""]


def check_json(target) -> tuple:
    proc = run_cli("check", "--no-cache", "--json", target)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)["findings"]


def cc(*args):
    subprocess.run([GCC, *map(str, args)], check=True, capture_output=True)


def vendored_tree(tmp_path: Path, file_name: str, soname: str, plain: str) -> Path:
    """pkg/ext.so whose NEEDED names pkg.libs/FILE_NAME (SONAME ``soname``), reached by
    RPATH $ORIGIN/../pkg.libs, as a repair tool leaves a wheel: built against ``plain``."""
    libs = tmp_path / "pkg.libs"
    libs.mkdir(parents=True, exist_ok=True)
    (tmp_path / "v.c").write_text("int vendored(void) { return 7; }\n")
    cc("-shared", "-fPIC", tmp_path / "v.c", "-o", libs / file_name, f"-Wl,-soname,{soname}")
    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "e.c").write_text("int vendored(void); int ext(void) { return vendored(); }\n")
    link = tmp_path / "link"  # link time only: the linker records ``plain``
    link.mkdir(exist_ok=True)
    (link / plain).unlink(missing_ok=True)
    cc("-shared", "-fPIC", "-Wl,-soname," + plain, tmp_path / "v.c", "-o", link / plain)
    ext = tmp_path / "pkg" / "ext.so"
    cc("-shared", "-fPIC", tmp_path / "e.c", "-o", ext, f"-L{link}", f"-l:{plain}",
       "-Wl,--disable-new-dtags,-rpath,$ORIGIN/../pkg.libs")
    subprocess.run([PATCHELF, "--replace-needed", plain, file_name, str(ext)], check=True)
    return ext


RENAMED = [  # (file name, its SONAME, the name the dependent was linked against)
    ("libz.2fd3c0b3.so.1", "libz.so.1", "libz.so.1"),
    ("libpng16.7f72a3c5.so.16", "libpng16.so.16", "libpng16.so.16"),
    ("libgomp-a34b3233.so.1", "libgomp.so.1", "libgomp.so.1"),
    ("libgfortran-040039e1-0352e75f.so.5.0.0", "libgfortran.so.5", "libgfortran.so.5"),
    ("libjpeg-6dc8d115.so.62.4.0", "libjpeg.so.62", "libjpeg.so.62"),
    ("libscipy_openblas64_-32a4b2a6.so", "libscipy_openblas64_.so", "libscipy_openblas64_.so"),
]


@pytest.mark.skipif(GCC is None or PATCHELF is None, reason="needs gcc and patchelf")
@pytest.mark.parametrize("file_name,soname,plain", RENAMED)
def test_vendored_renamed_library_loads_and_is_no_soname_mismatch(tmp_path, file_name, soname, plain):
    ext = vendored_tree(tmp_path, file_name, soname, plain)
    loaded, why = load_now(ext)
    assert loaded, why  # the oracle: ld.so loads it
    code, findings = check_json(tmp_path)
    assert [(f["rule"], f["severity"]) for f in findings if f["severity"] in ("error", "fatal")] == []
    assert code == 0


@pytest.mark.skipif(GCC is None or PATCHELF is None, reason="needs gcc and patchelf")
@pytest.mark.parametrize("file_name,soname", [
    ("libz.2fd3c0b3.so.1", "libz.so.2"),          # another major under the vendored name
    ("libgomp-a34b3233.so.1", "libiomp5.so"),     # another library
    ("libcudart.so.12", "libcudart.so.11.0"),     # the classic: the 11.x runtime as 12
])
def test_a_renamed_file_of_another_major_or_library_stays_an_error(tmp_path, file_name, soname):
    plain = file_name.split(".", 1)[0].split("-", 1)[0] + ".so." + file_name.rsplit(".so.", 1)[-1]
    ext = vendored_tree(tmp_path, file_name, soname, plain)
    _code, findings = check_json(tmp_path)
    assert [(f["rule"], f["severity"]) for f in findings] == [("needed-soname-mismatch", "error")]
    assert not same_library(file_name, soname)
    assert ext.exists()


# --- bitsandbytes: one variant picked by the torch beside it -----------------------------------

def _bitsandbytes_env() -> Path:
    purelib = Path(sysconfig.get_paths()["purelib"])
    if not (purelib / "torch" / "version.py").is_file():
        pytest.skip("this venv has no torch to pair bitsandbytes with")
    try:
        bnb = install("bitsandbytes", "bitsandbytes==0.50.2")
        return site("bnb-torch-cpu", [(bnb, "bitsandbytes"), (purelib, "torch")])
    except Unavailable as exc:
        pytest.skip(str(exc))


def test_bitsandbytes_variants_not_picked_are_info_and_the_picked_one_loads():
    packages = _bitsandbytes_env()
    # the oracle: the import itself, in this venv's interpreter (its torch), and what it mapped
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import bitsandbytes, bitsandbytes.cextension as c\n"
            "print([l.split()[-1] for l in open('/proc/self/maps') if 'libbitsandbytes_' in l][0])")
    proc = subprocess.run([sys.executable, "-c", code, str(packages)], capture_output=True, text=True,
                          errors="replace", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    picked = os.path.basename(proc.stdout.strip().splitlines()[-1])
    variants = sorted(p.name for p in (packages / "bitsandbytes").glob("libbitsandbytes_*.so"))
    failing = [v for v in variants if not load_now(packages / "bitsandbytes" / v)[0]]
    assert picked not in failing and failing  # the others need runtimes this host lacks
    code, findings = check_json(packages)
    on_variants = {(f["subject"]["path"].rsplit("/", 1)[-1], f["rule"], f["severity"]) for f in findings
                   if "libbitsandbytes_" in f["subject"]["path"]}
    assert {name for name, _rule, _sev in on_variants} == set(failing)
    assert {(rule, sev) for _name, rule, sev in on_variants} == {("needed-unpicked-variant", "info")}
    assert all(f"loads {picked} here" in f["message"] for f in findings if f["rule"] == "needed-unpicked-variant")
    assert code == 0


# --- onnxruntime-gpu: the TensorRT provider is optional ---------------------------------------

def test_onnxruntime_tensorrt_provider_is_a_warning_naming_what_it_needs():
    try:
        ort = install("onnxruntime-gpu", "onnxruntime-gpu==1.31.1")
        packages = site("ort-gpu", [(ort, "onnxruntime")])
    except Unavailable as exc:
        pytest.skip(str(exc))
    provider = packages / "onnxruntime" / "capi" / "libonnxruntime_providers_tensorrt.so"
    loaded, why = load_now(provider)
    assert not loaded
    _code, findings = check_json(packages)
    on_provider = [f for f in findings if f["subject"]["path"] == str(provider)]
    assert on_provider and {(f["rule"], f["severity"]) for f in on_provider} == {
        ("needed-optional-provider", "warning")}
    # what ld.so names first is among the names the warnings give
    needed = {f["evidence"]["name"] for f in on_provider}
    assert "libnvinfer.so.10" in needed
    assert any(name in why[0] for name in needed), why
