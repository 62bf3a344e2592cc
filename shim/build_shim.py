"""Build libseedance_shim.so: the LD_PRELOAD + LD_AUDIT library, a plain C shared object.

Used two ways:
  * from setup.py (install time, `pip install .` and `pip install -e .`): ``extension()``
    gives setuptools a build_ext entry whose output is renamed to exactly
    ``libseedance_shim.so`` by ``ShimBuildExt``; the compiler is setuptools' own.
  * by hand, for tests and benches: ``python shim/build_shim.py OUT.so``.

The shim is preloaded into arbitrary C programs, so it is built without libpython
(setuptools never links extensions against it on Linux; ``check_no_libpython`` makes
sure) and with hidden visibility: only the hooked names, la_* and seedance_* are
exported.  cffi parses the header's cdef region at build time (write_ffi_module), so the
Python side can never disagree with the C layout.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
HEADER = HERE / "include" / "seedance_shim.h"
# launcher.c is a program of its own (seedance-run), not a part of the library
LAUNCHER_SOURCE = "shim/src/launcher.c"
SOURCES = sorted(s for s in (str(p.relative_to(HERE.parent)) for p in (HERE / "src").glob("*.c"))
                 if s != LAUNCHER_SOURCE)
LIBRARY = "libseedance_shim.so"
LAUNCHER = "seedance-run"
# what the launcher passes the interpreter it execs: -P (3.11+) keeps the working directory
# off sys.path (launcher.c)
SAFE_PATH_FLAG = "-P" if sys.version_info >= (3, 11) else ""
CFLAGS = ["-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-std=gnu11", "-pthread"]
LDFLAGS = ["-pthread", "-Wl,-z,now", "-Wl,--no-undefined", "-ldl"]


def read_cdef(header: Path = HEADER) -> str:
    """The region of seedance_shim.h between the cdef markers: what cffi parses."""
    text = header.read_text()
    match = re.search(r"/\* cdef-begin \*/(.*)/\* cdef-end \*/", text, re.S)
    if not match:
        raise RuntimeError(f"{header}: no cdef-begin/cdef-end region")
    return match.group(1)


FFI_MODULE = HERE / "_shim_cffi.py"


def ffi_module_source() -> str:
    """cffi's out-of-line ABI module for the cdef region: the parsed types, serialised.

    Parsing the cdef runs pycparser (a lexer and parser in pure Python) over the header at
    every `seedance run`; importing the serialised form only builds the types.  It is
    generated from the header by every build (setup.py calls write_ffi_module(); cffi is a
    build requirement, pyproject.toml) and never kept in git; tests/shim/test_build.py fails
    when a built copy is stale."""
    import tempfile

    from cffi import FFI

    ffi = FFI()
    ffi.cdef(read_cdef())
    ffi.set_source("_shim_cffi", None)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "_shim_cffi.py"
        with contextlib.redirect_stdout(io.StringIO()):  # cffi says "generating ..." on stdout
            ffi.emit_python_code(str(out))
        return out.read_text()


def write_ffi_module() -> bool:
    """Write _shim_cffi.py from the header when it differs (needs cffi); True if it did.
    Parsing the cdef here is also the build's check that the header's cdef region parses,
    so the Python side can never disagree with the C layout."""
    text = ffi_module_source()
    if FFI_MODULE.exists() and FFI_MODULE.read_text() == text:
        return False
    FFI_MODULE.write_text(text)
    return True


def package_version() -> str:
    text = (HERE.parent / "agent" / "__init__.py").read_text()
    return re.search(r'__version__\s*=\s*"([^"]+)"', text).group(1)


def extension(version: str | None = None):
    """The setuptools Extension for the shim (renamed on output by ShimBuildExt)."""
    from setuptools import Extension

    version = version or package_version()
    return Extension(
        "seedance.shim.libseedance_shim",
        sources=[os.path.join("shim", os.path.relpath(s, "shim")) for s in SOURCES],
        depends=[str(HEADER.relative_to(HERE.parent)), "shim/src/hooks.def",
                 *sorted(str(p.relative_to(HERE.parent)) for p in (HERE / "src").glob("*.h"))],
        define_macros=[("SD_VERSION_STRING", f'"{version}"')],
        extra_compile_args=CFLAGS,
        extra_link_args=LDFLAGS,
        py_limited_api=False,
        # without a C compiler (an sdist install) the pure-Python parts still install:
        # check and ldd need no shim, and `seedance run` says it is not built and why
        optional=True,
    )


# Written beside the package's shim when its build failed: the one line `seedance run`
# gives (shim/binding.py reads it), so the user learns why, not only that it is missing.
NOT_BUILT_NOTE = "not-built.txt"


def near_paths() -> dict:
    """Where an install from a wheel puts the interpreter and the shim, relative to the
    launcher's two copies (the package's shim/ directory and the scripts directory), from
    this interpreter's install scheme: a venv's bin/ beside lib/python3.X/site-packages/.
    The launcher tries them before anything else (launcher.c near_self)."""
    import sysconfig

    scripts = sysconfig.get_path("scripts")
    shim_dir = os.path.join(sysconfig.get_path("platlib"), "seedance", "shim")
    python = os.path.join(scripts, "python%d.%d" % sys.version_info[:2])
    return {"SD_PYTHON_NEAR_PACKAGE": os.path.relpath(python, shim_dir),
            "SD_PYTHON_NEAR_SCRIPTS": os.path.relpath(python, scripts),
            "SD_SHIM_NEAR_SCRIPTS": os.path.relpath(os.path.join(shim_dir, LIBRARY), scripts)}


def make_build_ext(base):
    """A build_ext subclass that names the shim libseedance_shim.so (no ABI tag)."""

    class ShimBuildExt(base):
        def get_ext_filename(self, fullname):
            # called with the dotted name and with its last part alone (get_ext_fullpath)
            parts = fullname.split(".")
            if parts[-1] == "libseedance_shim":
                return os.path.join(*parts[:-1], LIBRARY)
            return super().get_ext_filename(fullname)

        def get_export_symbols(self, ext):
            # not a Python module: no PyInit_ symbol to export
            if ext.name == "seedance.shim.libseedance_shim":
                return []
            return super().get_export_symbols(ext)

        def build_extension(self, ext):
            if ext.name != "seedance.shim.libseedance_shim":
                return super().build_extension(ext)
            from setuptools.errors import CCompilerError, CompileError, LinkError, PlatformError

            note = os.path.join(os.path.dirname(self.get_ext_fullpath(ext.name)), NOT_BUILT_NOTE)
            try:
                super().build_extension(ext)
                self.build_launcher(ext)
            except (CCompilerError, CompileError, LinkError, PlatformError, OSError) as exc:
                reason = " ".join(str(exc).split()) or type(exc).__name__
                self.warn(f"the CUDA shim and seedance-run are not built ({reason}); "
                          f"check and ldd work without them, `seedance run` does not")
                os.makedirs(os.path.dirname(note), exist_ok=True)
                with open(note, "w") as handle:
                    handle.write(f"its build failed when seedance was installed: {reason}\n")
                return
            if os.path.exists(note):
                os.remove(note)
            check_no_libpython(self.get_ext_fullpath(ext.name))

        # `pip install -e .` builds in a temporary tree and copies the outputs back next to
        # the sources: the launcher goes along with the library
        def _launcher_pair(self, ext):
            inplace_file, regular_file = self._get_inplace_equivalent(self.get_finalized_command("build_py"), ext)
            return (os.path.join(os.path.dirname(regular_file), LAUNCHER),
                    os.path.join(os.path.dirname(inplace_file), LAUNCHER))

        def _get_output_mapping(self):
            yield from super()._get_output_mapping()
            if self.inplace:
                for ext in self.extensions:
                    if ext.name == "seedance.shim.libseedance_shim":
                        yield self._launcher_pair(ext)

        def copy_extensions_to_source(self):
            super().copy_extensions_to_source()
            for ext in self.extensions:
                if ext.name == "seedance.shim.libseedance_shim":
                    regular, inplace = self._launcher_pair(ext)
                    if os.path.exists(regular):
                        self.copy_file(regular, inplace, level=self.verbose)

        def build_launcher(self, ext):
            """seedance-run, next to the library: same compiler, same version."""
            out_dir = os.path.dirname(self.get_ext_fullpath(ext.name))
            macros = [*ext.define_macros, ("SD_PYTHON", f'"{sys.executable}"'),
                      ("SD_PYTHON_SAFE_PATH", f'"{SAFE_PATH_FLAG}"')]
            if not self.inplace and not getattr(self, "editable_mode", False):
                # a wheel: installed elsewhere, under another interpreter
                macros += [(name, f'"{value}"') for name, value in near_paths().items()]
            objects = self.compiler.compile([LAUNCHER_SOURCE], output_dir=self.build_temp, macros=macros,
                                            extra_postargs=CFLAGS)
            self.compiler.link_executable(objects, LAUNCHER, output_dir=out_dir, extra_postargs=["-ldl"])

    return ShimBuildExt


def check_no_libpython(path: str) -> None:
    out = subprocess.run(["nm", "-D", "--undefined-only", path], capture_output=True, text=True)
    if out.returncode == 0 and re.search(r"\bPy\w+", out.stdout):
        raise RuntimeError(f"{path} references libpython symbols; it must load into any C program")


def build_standalone(out: str, cc: str | None = None, extra: list[str] | None = None) -> str:
    """Compile the shim directly with the C compiler (tests, benches, the GPU script).
    It never rewrites _shim_cffi.py: only the package build and `--ffi` do, so the test
    that compares a built copy with the header cannot be satisfied behind its back."""
    cc = cc or os.environ.get("CC", "cc")
    root = HERE.parent
    cmd = [cc, *CFLAGS, "-shared", f'-DSD_VERSION_STRING="{package_version()}"',
           *[str(root / s) for s in SOURCES], "-o", out, *LDFLAGS, *(extra or [])]
    subprocess.run(cmd, check=True)
    return out


def build_launcher_standalone(out: str, cc: str | None = None) -> str:
    """Compile seedance-run directly (tests, benches); it uses the library next to it."""
    cc = cc or os.environ.get("CC", "cc")
    root = HERE.parent
    subprocess.run([cc, *CFLAGS, f'-DSD_VERSION_STRING="{package_version()}"', f'-DSD_PYTHON="{sys.executable}"',
                    f'-DSD_PYTHON_SAFE_PATH="{SAFE_PATH_FLAG}"', str(root / LAUNCHER_SOURCE), "-o", out, "-ldl"],
                   check=True)
    return out


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "--ffi":
        write_ffi_module()
        print(FFI_MODULE)
    elif len(sys.argv) == 2:
        print(build_standalone(sys.argv[1]))
    else:
        sys.exit("usage: build_shim.py OUT.so | --ffi")
