"""The fatbin reader on damaged input: judged, never skipped with exit 0 (issue 11)."""
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from seedance.elf import fatbin as elf_fatbin
from seedance.elf import fatbin_payload
from seedance.elf.reader import read_elf

ROOT = Path(__file__).resolve().parents[2]
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


@pytest.fixture(scope="module")
def kernel_lib(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc (CUDA toolkit) not installed")
    tmp = tmp_path_factory.mktemp("damaged")
    (tmp / "k.cu").write_text("__global__ void k(float *x) { x[0] = 1; }\n"
                              "extern \"C\" void go(float *x) { k<<<1, 1>>>(x); }\n")
    lib = tmp / "libk.so"
    subprocess.run([NVCC, "-shared", "-Xcompiler", "-fPIC", "-gencode", "arch=compute_90,code=sm_90",
                    tmp / "k.cu", "-o", lib], check=True, capture_output=True)
    return lib


def fatbin_section(path):
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as handle:
        section = ELFFile(handle).get_section_by_name(".nv_fatbin")
        return section["sh_offset"], section["sh_size"]


def test_overrunning_container_is_judged_not_skipped(kernel_lib, tmp_path):
    offset, size = fatbin_section(kernel_lib)
    data = bytearray(kernel_lib.read_bytes())
    magic, _v, header, _payload = struct.unpack_from("<IHHQ", data, offset)
    assert magic == elf_fatbin.FATBIN_MAGIC
    struct.pack_into("<Q", data, offset + 8, size * 4)  # the first container claims 4x its section
    broken = tmp_path / "libbroken.so"
    broken.write_bytes(bytes(data))
    entries = read_elf(str(broken), fatbin=True).fatbin
    assert [e.kind for e in entries] == ["damaged"]
    proc = subprocess.run([str(ROOT / ".venv/bin/seedance"), "check", "--no-progress", "--json", "--arch", "sm_90",
                           str(broken)], capture_output=True, text=True, errors="replace", timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert [f["rule"] for f in json.loads(proc.stdout)["findings"]] == ["cuda-arch-missing"]


def test_truncated_image_is_a_payload_error(kernel_lib):
    entry = next(e for e in read_elf(str(kernel_lib), fatbin=True).fatbin if e.kind == "sass")
    image = elf_fatbin.read_image(str(kernel_lib), entry)
    with pytest.raises(fatbin_payload.PayloadError):
        fatbin_payload.cubin_kernels(image[:40])
    with pytest.raises(fatbin_payload.PayloadError):
        fatbin_payload.lz4_block(b"\xf0", 100)


def test_pure_python_lz4_matches_the_c_decoder():
    lz4_block_mod = pytest.importorskip("lz4.block")
    payload = (b"__global__ kernels " * 50) + bytes(range(256)) + b"\0" * 300
    packed = lz4_block_mod.compress(payload, store_size=False)
    assert fatbin_payload.lz4_block(packed, len(payload)) == payload
