"""The cffi binding to libseedance_shim.so: started lazily, once, behind a lock.

ABI mode (ffi.dlopen) with the cdef taken from shim/include/seedance_shim.h, the same
header the C code is compiled with, pre-parsed into _shim_cffi.py by the build
(build_shim.write_ffi_module; cffi's out-of-line ABI mode: importing the serialised types
is cheap, where parsing the cdef runs pycparser over the whole header at every start);
without that module (a tree never built) the
header is parsed here.  On first use the binding refuses a library built
from another version (its ABI number and its version string are compiled in), and says
how to fix it: psutil's __init__ does the same against its C extension.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

from ..model.errors import NotAvailable
from .. import __version__

HERE = Path(__file__).resolve().parent
LIBRARY_NAME = "libseedance_shim.so"

_lock = threading.Lock()
_binding = None


def library_path() -> Path:
    """Where libseedance_shim.so is (SEEDANCE_SHIM_LIB overrides, for tests)."""
    override = os.environ.get("SEEDANCE_SHIM_LIB")
    path = Path(override) if override else HERE / LIBRARY_NAME
    if not path.is_file():
        raise NotAvailable(f"{path}: the CUDA shim is not built: {_not_built_reason()}; install seedance's "
                           f"wheel, or reinstall from source with a C compiler (gcc)")
    return path


def _not_built_reason() -> str:
    """The reason the package build left beside the shim when compiling it failed
    (shim/build_shim.py NOT_BUILT_NOTE), else what is known without it."""
    try:
        with open(HERE / "not-built.txt", encoding="utf-8", errors="replace") as handle:
            return " ".join(handle.read(400).split()) or "its build failed"
    except OSError:
        return "this install was made without building it"


def launcher_path() -> Path:
    """seedance-run, the C front end of `seedance run` built next to the library."""
    path = library_path().parent / "seedance-run"
    if not path.is_file():
        raise NotAvailable(f"{path}: seedance-run is not built (reinstall seedance: `pip install -e .`)")
    return path


def header_path() -> Path:
    return HERE / "include" / "seedance_shim.h"


def read_cdef() -> str:
    from .build_shim import read_cdef as _read

    return _read(header_path())


def header_constant(name: str) -> int:
    """An integer #define of the cdef region (without loading the library)."""
    import re

    match = re.search(rf"#define\s+{name}\s+(0x[0-9a-fA-F]+|\d+)", read_cdef())
    if not match:
        raise KeyError(name)
    return int(match.group(1), 0)


def expected_version() -> str:
    """What `seedance run` puts in SEEDANCE_SHIM_VERSION for the shim to check."""
    return f"{__version__}+abi{header_constant('SD_ABI_VERSION')}"


def _ffi():
    try:
        from ._shim_cffi import ffi  # generated from the header by the build (build_shim.py)
        return ffi
    except ImportError:
        from cffi import FFI

        ffi = FFI()
        ffi.cdef(read_cdef())
        return ffi


def binding():
    """(ffi, lib) for the installed shim; raises NotAvailable when absent or mismatched."""
    global _binding
    if _binding is not None:
        return _binding
    with _lock:
        if _binding is None:
            ffi = _ffi()
            path = library_path()
            try:
                lib = ffi.dlopen(str(path))
            except OSError as exc:
                raise NotAvailable(f"{path}: cannot load the CUDA shim ({exc})") from None
            abi = lib.seedance_shim_abi_version()
            built = ffi.string(lib.seedance_shim_version_string()).decode()
            want_abi = lib.SD_ABI_VERSION
            if abi != want_abi or built != __version__:
                raise NotAvailable(f"{path} is seedance {built} (ABI {abi}) but this is seedance "
                                   f"{__version__} (ABI {want_abi}): reinstall (`pip install -e .`)")
            _binding = (ffi, lib)
    return _binding
