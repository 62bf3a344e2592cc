"""Fixtures for the trace tests: real C programs and libraries built with gcc, the real
NVIDIA runtimes, the tests' fake libcuda.so.1, and real eBPF as root.

eBPF tests skip with the reason when this host cannot run eBPF (not root, no bcc, no
kernel headers); CI runs them as root after `make install` (which sets the headers up).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from trace_helpers import CUDA_INCLUDE, FIXTURES, ROOT, _cc, wheel_runtime


@pytest.fixture(scope="session")
def ebpf():
    """Skip unless real eBPF can run here; the reason is the one `seedance trace` gives."""
    from seedance.trace import env
    problem = env.ebpf_problem()
    if problem:
        pytest.skip(f"eBPF unavailable: {problem}")


@pytest.fixture(scope="session")
def built():
    """Every fixture program and library, in one world-readable directory (the fallback
    test runs the tracer as nobody)."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    out = Path(tempfile.mkdtemp(prefix="seedance-trace-tests-"))
    os.chmod(out, 0o755)
    inc = ["-I", str(CUDA_INCLUDE)] if (CUDA_INCLUDE / "cuda.h").exists() else []
    _cc("-O2", FIXTURES / "dlopen_each.c", "-o", out / "dlopen_each", "-ldl")
    # the fake driver, exactly as the shim's tests build it
    fake = out / "fakecuda"
    fake.mkdir()
    _cc("-O2", "-fPIC", "-shared", "-fvisibility=hidden", *inc, "-Wl,-soname,libcuda.so.1",
        ROOT / "tests/fakecuda/fakecuda.c", "-o", fake / "libcuda.so.1", "-pthread")
    if inc:
        _cc("-O2", *inc, FIXTURES / "leaky.c", "-o", out / "leaky", f"-L{fake}", "-l:libcuda.so.1",
            f"-Wl,-rpath,{fake}")
    # a missing version node: consumer linked against PROVIDER_2, run next to a provider
    # that only defines PROVIDER_1
    link, run = out / "link", out / "run"
    link.mkdir()
    run.mkdir()
    for directory, node in ((link, "PROVIDER_2"), (run, "PROVIDER_1")):
        script = directory / "provider.map"
        script.write_text(f"{node} {{ global: provider_fn; local: *; }};\n")
        _cc("-shared", "-fPIC", f"-Wl,--version-script={script}", "-Wl,-soname,libprovider.so.1",
            FIXTURES / "provider.c", "-o", directory / "libprovider.so.1")
    _cc("-shared", "-fPIC", FIXTURES / "consumer.c", "-o", run / "libconsumer.so", f"-L{link}",
        "-l:libprovider.so.1", "-Wl,-rpath,$ORIGIN")
    _cc("-shared", "-fPIC", FIXTURES / "undefined.c", "-o", out / "libundefined.so")
    # a file named libcudart.so.12 that is really the 11.x runtime (SONAME libcudart.so.11.0)
    cu11 = wheel_runtime("11")
    if cu11 is not None:
        renamed = out / "renamed"
        renamed.mkdir()
        shutil.copy2(cu11, renamed / "libcudart.so.12")
    for path in out.rglob("*"):
        path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
    yield out
    shutil.rmtree(out, ignore_errors=True)


