"""seedance.collect.python_env: the static import planner against the real interpreter.

A synthetic package exercises each construct the planner reads (relative and absolute
imports, try/except ImportError, TYPE_CHECKING, `if __name__ == "__main__"`, platform and
environment tests, a literal loop over import_module, a module function called at import
time, sys.setdlopenflags); each of its modules that matters is a real extension module, so
the oracle is which extension modules the real `import` dlopens, in order (LD_DEBUG=files)."""
from __future__ import annotations

import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import process_fixtures as F  # noqa: E402

from seedance.collect.python_env import ask_interpreter, observe, plan_imports  # noqa: E402

PYTHON = sys.executable


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(textwrap.dedent(text))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("planner-site"))
    pkg = os.path.join(root, "pkg")
    for name in ("e_first", "e_try", "e_fallback", "e_never", "e_main", "e_posix", "e_nt", "e_loop1", "e_loop2",
                 "e_called", "e_env_default", "e_env_other", "e_sub", "e_class", "e_global"):
        F.extension(pkg if name != "e_sub" else os.path.join(pkg, "sub"), name, [], rpath=None)
    _write(os.path.join(pkg, "sub", "__init__.py"), "from .e_sub import value\n")
    _write(os.path.join(pkg, "__init__.py"), """
        import os, sys
        from typing import TYPE_CHECKING
        from . import e_first
        try:
            from . import e_try
        except ImportError:
            from . import e_never
        try:
            import pkg_missing_module
        except ImportError:
            from . import e_fallback
        if TYPE_CHECKING:
            from . import e_never
        if sys.platform == "win32" or os.name == "nt":
            from . import e_nt
        elif sys.platform.startswith("linux"):
            from . import e_posix
        import importlib
        for name in ["pkg.e_loop1", "pkg.e_loop2"]:
            importlib.import_module(name)
        def _later():
            from . import e_called
        _later()
        _policy = os.environ.get("PKG_TEST_POLICY", "default").strip()
        if _policy == "default":
            from . import e_env_default
        else:
            from . import e_env_other
        class Holder:
            from .sub import value
            from . import e_class
        sys.setdlopenflags(os.RTLD_NOW | os.RTLD_GLOBAL)
        from . import e_global
        sys.setdlopenflags(os.RTLD_NOW)
        if __name__ == "__main__":
            from . import e_main
        """)
    return root


def test_planned_extension_order_is_what_python_loads(site):
    env = dict(os.environ, PYTHONPATH=site)
    env.pop("PKG_TEST_POLICY", None)
    interp = ask_interpreter(PYTHON, env=env)
    plan = plan_imports(interp, ["pkg"])
    predicted = [load.path for load in plan.loads if load.path.startswith(site)]
    seen = observe(PYTHON, "import pkg", env=env)
    assert seen.returncode == 0, seen.error_line
    real = [name for name, _who in seen.loaded if name.startswith(site)]
    assert predicted == real
    flags = {os.path.basename(load.path).split(".")[0]: load.flags for load in plan.loads}
    assert flags["e_global"] == os.RTLD_NOW | os.RTLD_GLOBAL and flags["e_first"] is None


def test_missing_top_level_module_is_reported(site):
    interp = ask_interpreter(PYTHON, env=dict(os.environ, PYTHONPATH=site))
    plan = plan_imports(interp, ["pkg_that_is_not_installed"])
    assert plan.missing == [("pkg_that_is_not_installed", "pkg_that_is_not_installed")]


def test_dynamic_loads_are_named_not_guessed(tmp_path):
    """A computed name is a note; a literal one is a dlopen in the import's order."""
    _write(str(tmp_path / "dyn" / "__init__.py"), "import ctypes, ctypes.util\n"
                                                   "ctypes.CDLL(ctypes.util.find_library('z'))\n"
                                                   "ctypes.CDLL('libz.so.1')\n")
    interp = ask_interpreter(PYTHON, env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    plan = plan_imports(interp, ["dyn"])
    assert any(note.startswith(str(tmp_path / "dyn" / "__init__.py") + ":2: CDLL()") for note in plan.notes)
    assert [(load.path, load.how) for load in plan.loads if load.how != "import"] == [("libz.so.1", "ctypes")]


def test_interpreter_that_is_not_python_is_bad_input(tmp_path):
    from seedance.model.errors import BadInput
    with pytest.raises(BadInput):
        ask_interpreter("/bin/true")
    with pytest.raises(BadInput):
        ask_interpreter(str(tmp_path / "nope"))


def test_a_package_from_a_meta_path_finder_is_found():
    """seedance itself is installed in this venv (editable installs are served by a
    meta-path finder, not a sys.path directory): the planner finds what Python finds."""
    import subprocess
    interp = ask_interpreter(PYTHON)
    plan = plan_imports(interp, ["seedance"])
    real = subprocess.run([PYTHON, "-c", "import seedance"], capture_output=True).returncode == 0
    assert real and plan.missing == []


@pytest.mark.parametrize("source", [b"import os\nx = (" + b"(" * 200000 + b"\n", b"\x00\x01 not python",
                                    b"# -*- coding: no-such-codec -*-\nimport os\n"])
def test_a_module_that_cannot_be_parsed_is_a_note_not_a_crash(tmp_path, source):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "__init__.py").write_bytes(source)
    interp = ask_interpreter(PYTHON, env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    plan = plan_imports(interp, ["broken"])
    assert any("cannot be parsed" in note for note in plan.notes) and plan.loads == []


def test_flags_set_in_a_branch_not_taken_and_restored_do_not_leak(tmp_path):
    """torch's own `import torch` does this: a branch taken only when a constant of another
    module (False) or an unset variable says so sets RTLD_GLOBAL|RTLD_LAZY around one import
    and puts sys.getdlopenflags() back.  Later extensions load RTLD_NOW, so one with an
    undefined symbol fails its import: the real import is the oracle."""
    from seedance.collect.python_env import predict_imports

    pkg = tmp_path / "flagpkg"
    for name in ("e_core", "e_after"):
        F.extension(str(pkg), name, [], rpath=None, refs=["flagpkg_symbol_nobody_defines"] if name == "e_after" else ())
    _write(str(pkg / "_internal.py"), "USE_GLOBAL = False\n")
    _write(str(pkg / "__init__.py"), """
        import os, sys, platform
        from ._internal import USE_GLOBAL
        if (USE_GLOBAL or os.getenv("FLAGPKG_TEST_GLOBAL")) and platform.system() != "Windows":
            old_flags = sys.getdlopenflags()
            sys.setdlopenflags(os.RTLD_GLOBAL | os.RTLD_LAZY)
            from . import e_core
            sys.setdlopenflags(old_flags)
        else:
            from . import e_core
        from . import e_after
        """)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    env.pop("FLAGPKG_TEST_GLOBAL", None)
    real = F.run_python(str(tmp_path), "import flagpkg")
    assert real.returncode != 0 and b"flagpkg_symbol_nobody_defines" in real.stderr
    prediction = predict_imports(ask_interpreter(PYTHON, env=env), ["flagpkg"], search_orders=False)
    assert not prediction.ok and "undefined symbol: flagpkg_symbol_nobody_defines" in prediction.error
    assert {load.module: load.flags for load in prediction.plan.loads}["flagpkg.e_core"] is None
