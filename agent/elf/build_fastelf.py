"""Build seedance.elf._fastelf: the C ELF reader (fastelf.c) as a cffi extension module.

cffi's API mode writes a C wrapper (_fastelf_cffi.c) from the cdef region of fastelf.h;
that wrapper is generated here, kept in git and compiled by setuptools like any C
extension, because pip builds in an isolated environment that holds only setuptools (no
cffi at build time, and no network to fetch it).  At run time the module needs cffi's
_cffi_backend, which is an install requirement anyway.  tests/unit/test_elf_fastread.py
fails when the generated wrapper is stale.

    python agent/elf/build_fastelf.py --cffi     (re)generate _fastelf_cffi.c
    python agent/elf/build_fastelf.py OUTDIR     build the module by hand into OUTDIR
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
HEADER = HERE / "fastelf.h"
SOURCE = HERE / "fastelf.c"
# the check cache's input validation (inputcheck.c) and the check's tree walk (treewalk.c)
# ride in the same extension: one build
EXTRA_SOURCES = (HERE / "inputcheck.c", HERE / "treewalk.c", HERE / "dpkgindex.c")
WRAPPER = HERE / "_fastelf_cffi.c"
MODULE = "seedance.elf._fastelf"
CFLAGS = ["-O2", "-Wall", "-Wextra", "-std=gnu11", "-fvisibility=hidden"]


def read_cdef(header: Path = HEADER) -> str:
    text = header.read_text()
    match = re.search(r"/\* cdef-begin \*/(.*)/\* cdef-end \*/", text, re.S)
    if not match:
        raise RuntimeError(f"{header}: no cdef-begin/cdef-end region")
    return match.group(1)


def wrapper_source() -> str:
    """The C text cffi generates for the cdef region (needs cffi)."""
    from cffi import FFI

    ffi = FFI()
    ffi.cdef(read_cdef())
    ffi.set_source(MODULE, '#include "fastelf.h"')
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "wrapper.c"
        with contextlib.redirect_stdout(io.StringIO()):  # cffi says "generating ..." on stdout
            ffi.emit_c_code(str(out))
        return out.read_text()


def refresh_wrapper() -> bool:
    """Rewrite _fastelf_cffi.c when cffi is importable and the header changed; True if it did."""
    try:
        text = wrapper_source()
    except ImportError:
        return False
    if WRAPPER.exists() and WRAPPER.read_text() == text:
        return False
    WRAPPER.write_text(text)
    return True


def extension():
    """The setuptools Extension; optional: without a compiler seedance falls back to the
    Python reader (reader.py), which gives the same answers, only slower."""
    from setuptools import Extension

    rel = os.path.relpath(HERE, ROOT)
    return Extension(
        MODULE,
        sources=[os.path.join(rel, WRAPPER.name), os.path.join(rel, SOURCE.name),
                 *(os.path.join(rel, extra.name) for extra in EXTRA_SOURCES)],
        include_dirs=[rel],
        depends=[os.path.join(rel, HEADER.name)],
        extra_compile_args=CFLAGS,
        optional=True,
    )


def build_standalone(out_dir: str, cc: str | None = None) -> str:
    """Compile the module directly (development, tests); returns the .so path.  Written to a
    temporary name and renamed, so a process importing it never sees half a file."""
    import subprocess

    cc = cc or os.environ.get("CC", "cc")
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    target = os.path.join(out_dir, "_fastelf" + suffix)
    tmp = target + f".tmp{os.getpid()}"
    subprocess.run([cc, *CFLAGS, "-fPIC", "-shared", f"-I{sysconfig.get_paths()['include']}", f"-I{HERE}",
                    str(WRAPPER), str(SOURCE), *map(str, EXTRA_SOURCES), "-o", tmp], check=True)
    os.replace(tmp, target)
    return target


if __name__ == "__main__":
    if sys.argv[1:] == ["--cffi"]:
        print(("refreshed " if refresh_wrapper() else "up to date: ") + str(WRAPPER))
    elif len(sys.argv) == 2:
        print(build_standalone(sys.argv[1]))
    else:
        sys.exit(__doc__)
