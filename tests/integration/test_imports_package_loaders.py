"""Packages that load their own libraries through their own helper functions at import time,
the way torchvision, torchaudio and torchcodec do, against the real import.

- torchvision: `if _load_library("_C"):`, whose body finds the file by name
  (`_get_extension_path(lib_name)`, imported from another module) and catches the OSError;
  later a module-level `@torch.library.register_fake("ns::op")` raises RuntimeError when
  the library that registers the operator did not load.
- torchaudio: `_load_lib("libx")` globs `_LIB_DIR / f"{lib}*{suffix}"` and loads paths[0]
  before the extension module that NEEDs it (no RUNPATH: found already loaded, by SONAME).
- torchcodec: `load_image_library()` with no arguments, imported from a helper module.

Python's outcome is the oracle, both when the library loads and when it does not."""
from __future__ import annotations

import os
import shutil
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import process_fixtures as F  # noqa: E402

from seedance.collect import torch_ext  # noqa: E402
from seedance.collect.python_env import ask_interpreter, predict_imports  # noqa: E402

PYTHON = sys.executable
pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")


@pytest.fixture(scope="module")
def torch():
    if torch_ext.find_torch() is None:
        pytest.skip("torch is not installed for this interpreter")


def _write(root, files: dict) -> None:
    for relative, source in files.items():
        path = os.path.join(root, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(textwrap.dedent(source))


def _agree(site: str, module: str):
    prediction = predict_imports(ask_interpreter(PYTHON, env=dict(os.environ, PYTHONPATH=site)), [module],
                                 search_orders=False)
    real = F.run_python(site, f"import {module}")
    last = (real.stderr.decode("utf-8", "replace").strip().splitlines() or [""])[-1]
    assert prediction.ok == (real.returncode == 0), (module, prediction.error, last)
    if real.returncode:
        assert prediction.error == last, (prediction.error, last)
    return prediction


# --- torchvision's form -----------------------------------------------------------------------

_OPS_PACKAGE = {
    "zqvision/__init__.py": """
        import torch
        from . import extension
        from zqvision import _ops, _meta
        """,
    "zqvision/_utils.py": """
        import importlib.machinery
        import os

        def _get_extension_path(lib_name):
            lib_dir = os.path.dirname(__file__)
            loader_details = (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES)
            spec = importlib.machinery.FileFinder(lib_dir, loader_details).find_spec(lib_name)
            if spec is None:
                raise ImportError(f"no {lib_name} in {lib_dir}")
            return spec.origin
        """,
    "zqvision/extension.py": """
        import torch
        from ._utils import _get_extension_path

        def _load_library(lib_name):
            try:
                lib_path = _get_extension_path(lib_name)
                torch.ops.load_library(lib_path)
                return True
            except (ImportError, OSError):
                return False

        def _has_ops():
            return False

        if _load_library("_C"):
            def _has_ops():
                return True
        """,
    # what the library's TORCH_LIBRARY block would do, done from Python once it has loaded
    "zqvision/_ops.py": """
        import torch
        from .extension import _has_ops
        if _has_ops():
            torch.library.define("zqvision::nms", "(Tensor dets) -> Tensor")
        """,
    "zqvision/_meta.py": """
        import torch

        @torch.library.register_fake("zqvision::nms")
        def meta_nms(dets):
            return dets.new_empty(dets.shape)
        """,
}


@pytest.mark.parametrize("loads", [False, True], ids=["library-fails", "library-loads"])
def test_an_operator_of_a_library_that_failed_fails_the_import(tmp_path, torch, loads):
    site = str(tmp_path / "site")
    _write(site, _OPS_PACKAGE)
    # the library names its operator's schema, as m.def("zqvision::nms(Tensor dets) -> Tensor") does
    F.shared_lib(str(tmp_path / "libzqdep.so.1"), "int zq_dep(void) { return 1; }\n", soname="libzqdep.so.1")
    if loads:
        shutil.copy(tmp_path / "libzqdep.so.1", os.path.join(site, "zqvision"))
    suffix = ".cpython-%d%d-x86_64-linux-gnu.so" % sys.version_info[:2]
    F.shared_lib(os.path.join(site, "zqvision", "_C" + suffix),
                 'extern int zq_dep(void);\nconst char *schema = "zqvision::nms(Tensor dets) -> Tensor";\n'
                 "int zq_call(void) { return zq_dep(); }\n",
                 rpath="$ORIGIN", links=(str(tmp_path / "libzqdep.so.1"),))
    prediction = _agree(site, "zqvision")
    if not loads:
        assert prediction.error == "RuntimeError: operator zqvision::nms does not exist"
        assert prediction.causes, "the caught failed load is named as the cause"


# --- torchaudio's and torchcodec's forms -----------------------------------------------------

_LIB_PACKAGES = {
    "zqaudio/__init__.py": """
        from ._extension import AVAILABLE
        """,
    "zqaudio/_extension/__init__.py": """
        from .utils import _load_lib
        AVAILABLE = _load_lib("libzqaudio")
        if AVAILABLE:
            import zqaudio.lib._zqaudio
        """,
    "zqaudio/_extension/utils.py": """
        import ctypes
        import os
        from pathlib import Path

        _LIB_DIR = Path(__file__).parent.parent / "lib"

        def _load_lib(lib: str) -> bool:
            suffix = ".pyd" if os.name == "nt" else ".so"
            paths = list(_LIB_DIR.glob(f"{lib}*{suffix}"))
            if not paths:
                return False
            ctypes.CDLL(str(paths[0]))
            return True
        """,
    "zqcodec/__init__.py": """
        from .ops import value
        """,
    "zqcodec/_utils.py": """
        import ctypes
        import os

        def _get_extension_path(lib_name):
            return os.path.join(os.path.dirname(__file__), lib_name + ".so")

        def load_image_library():
            image_library_path = _get_extension_path("libzqcodec_image")
            ctypes.CDLL(image_library_path)
        """,
    "zqcodec/ops.py": """
        from ._utils import load_image_library
        load_image_library()
        value = 1
        """,
}


@pytest.mark.parametrize("dependency", [False, True], ids=["dependency-missing", "dependency-shipped"])
def test_libraries_a_package_helper_loads_decide_the_import(tmp_path, dependency):
    site = str(tmp_path / "site")
    _write(site, _LIB_PACKAGES)
    F.shared_lib(str(tmp_path / "libzqleaf.so.1"), "int zq_leaf(void) { return 1; }\n", soname="libzqleaf.so.1")
    for lib_dir in ("zqaudio/lib", "zqcodec"):
        if dependency:
            os.makedirs(os.path.join(site, lib_dir), exist_ok=True)
            shutil.copy(tmp_path / "libzqleaf.so.1", os.path.join(site, lib_dir))
    F.shared_lib(os.path.join(site, "zqaudio", "lib", "libzqaudio.so"),
                 "extern int zq_leaf(void);\nint zq_audio(void) { return zq_leaf(); }\n", soname="libzqaudio.so",
                 rpath="$ORIGIN", links=(str(tmp_path / "libzqleaf.so.1"),))
    F.shared_lib(os.path.join(site, "zqcodec", "libzqcodec_image.so"),
                 "extern int zq_leaf(void);\nint zq_image(void) { return zq_leaf(); }\n",
                 rpath="$ORIGIN", links=(str(tmp_path / "libzqleaf.so.1"),))
    # the extension module NEEDs libzqaudio.so with no RUNPATH: it loads only because the
    # helper loaded that library by path first
    F.extension(os.path.join(site, "zqaudio", "lib"), "_zqaudio", ["zq_audio"],
                links=(os.path.join(site, "zqaudio", "lib", "libzqaudio.so"),), rpath=None)
    for module in ("zqaudio", "zqcodec"):
        prediction = _agree(site, module)
        loaded = [step.load.target for step in prediction.model.steps if step.load.kind == "dlopen"]
        assert any(path.endswith(("libzqaudio.so", "libzqcodec_image.so")) for path in loaded), loaded


def test_a_glob_the_planner_follows_stays_in_one_directory(tmp_path):
    """A package's source names the pattern: one that reaches across directories (`*/*`,
    `**`) or a bare glob.glob is not followed, so no package makes seedance walk a tree."""
    from seedance.collect.static_values import _UNKNOWN, _glob_value, _Path
    import ast

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libone.so").write_bytes(b"")
    known = {"_LIB_DIR": _Path(str(tmp_path / "lib")), "root": _Path(str(tmp_path)), "prefix": str(tmp_path)}
    value = _glob_value(ast.parse('list(_LIB_DIR.glob(f"libone*.so"))').body[0].value, known, __file__)
    assert list(value) == [str(tmp_path / "lib" / "libone.so")]
    for source in ('list(root.glob("*/libone.so"))', 'list(root.glob("**/*.so"))', 'glob.glob(f"{prefix}/*/libone.so")',
                   'glob.glob("/*/*/*")',
                   'list(Path("relative").glob("*.so"))'):
        assert _glob_value(ast.parse(source).body[0].value, known, __file__) is _UNKNOWN, source
