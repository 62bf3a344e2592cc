"""Fixtures for the shim tests: the fake driver, the C clients and the shim, built once.

Every test gets its own registry directory (SEEDANCE_RUNTIME_DIR) and its own fake
driver ledger (FAKECUDA_LEDGER), so tests never see each other's instances.
"""
from __future__ import annotations

import mmap
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CUDA_INCLUDE = Path("/usr/local/cuda/include")
FAKE_MAX = 16


def _cc(*args):
    subprocess.run(["cc", *map(str, args)], check=True, capture_output=True, text=True)


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("fakecuda")
    inc = ["-I", str(CUDA_INCLUDE)] if (CUDA_INCLUDE / "cuda.h").exists() else ["-I", str(ROOT / "tests/shim/include")]
    _cc("-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Werror", *inc,
        "-Wl,-soname,libcuda.so.1", "-Wl,-Bsymbolic", ROOT / "tests/fakecuda/fakecuda.c", "-o", out / "libcuda.so.1", "-pthread")
    os.symlink("libcuda.so.1", out / "libcuda.so")
    src = ROOT / "tests/shim/sdtest.c"
    _cc("-O2", "-DLINKED", *inc, src, "-o", out / "sdtest_linked", f"-L{out}", "-lcuda", "-pthread", "-ldl")
    _cc("-O2", *inc, src, "-o", out / "sdtest", "-pthread", "-ldl")
    _cc("-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Werror", "-Wl,-soname,libcudart.so.12",
        ROOT / "tests/fakecuda/fakecudart.c", "-o", out / "libcudart.so.12", "-pthread", "-ldl")
    os.symlink("libcudart.so.12", out / "libcudart.so")
    _cc("-O2", ROOT / "tests/shim/sdrt.c", "-o", out / "sdrt", f"-L{out}", "-lcudart")
    from seedance import shim
    from seedance.shim.build_shim import build_standalone

    # the test build: the product's sources plus the hooks only tests may use (issue 17:
    # SEEDANCE_TEST_HOLD_LOCK_MS never ships in the product library)
    test_shim = out / "hooks" / "libseedance_shim.so"
    test_shim.parent.mkdir()
    build_standalone(str(test_shim), extra=["-DSEEDANCE_TEST_HOOKS"])
    return {"dir": out, "linked": out / "sdtest_linked", "dlsym": out / "sdtest", "runtime": out / "sdrt",
            "shim": shim.library_path(), "test_shim": test_shim}


class Ledger:
    """The fake driver's side channel: per physical device, as the driver saw it."""

    FIELDS = ("outstanding", "high_water", "allocs", "frees", "oom")

    def __init__(self, path: Path):
        self.path = path

    def read(self) -> dict:
        if not self.path.exists():
            return {f: [0] * FAKE_MAX for f in self.FIELDS}
        raw = self.path.read_bytes()
        values = struct.unpack(f"<{FAKE_MAX * len(self.FIELDS)}Q", raw[: 8 * FAKE_MAX * len(self.FIELDS)])
        return {f: list(values[i * FAKE_MAX:(i + 1) * FAKE_MAX]) for i, f in enumerate(self.FIELDS)}


@pytest.fixture
def env(built, tmp_path):
    e = dict(os.environ)
    for key in list(e):
        if key.startswith(("SEEDANCE_", "FAKECUDA_", "CUDA_")) or key in ("LD_PRELOAD", "LD_AUDIT"):
            del e[key]
    e.update(LD_LIBRARY_PATH=str(built["dir"]), SEEDANCE_RUNTIME_DIR=str(tmp_path / "rt"),
             XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_STATE_HOME=str(tmp_path / "state"),
             FAKECUDA_LEDGER=str(tmp_path / "ledger"), FAKECUDA_DEVICES="2")
    return e


@pytest.fixture
def ledger(tmp_path):
    return Ledger(tmp_path / "ledger")




@pytest.fixture(params=["python", "launcher"])
def front(request):
    """Run the test through `seedance run` and through seedance-run (the C launcher):
    every check and message must be the same (issue 13)."""
    import shimhelpers

    if request.param == "launcher":
        from seedance import shim
        try:
            shim.launcher_path()
        except shim.NotAvailable as exc:
            pytest.skip(str(exc))
    shimhelpers.FRONT["name"] = request.param
    yield request.param
    shimhelpers.FRONT["name"] = "python"
