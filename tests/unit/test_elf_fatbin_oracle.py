"""The fatbin reader against NVIDIA's own tool (issue 17): cuobjdump --list-elf/--list-ptx,
-xelf/-xptx and -res-usage, on objects nvcc builds here with arch-specific (sm_90a) and
family (compute_100f) targets, every compression mode and separate compilation (-rdc,
__nv_relfatbin).  cuobjdump comes from /usr/local/cuda/bin or NVIDIA's
nvidia-cuda-cuobjdump wheel (requirements-test.txt)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from seedance.elf import fatbin as elf_fatbin
from seedance.elf import fatbin_payload
from seedance.elf.reader import read_elf

NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


def find_cuobjdump():
    for candidate in ("/usr/local/cuda/bin/cuobjdump", shutil.which("cuobjdump")):
        if candidate and os.path.exists(candidate):
            return candidate
    for base in sys.path:  # the nvidia-cuda-cuobjdump wheel: nvidia/cu13/bin/cuobjdump
        for found in Path(base).glob("nvidia/cu*/bin/cuobjdump") if os.path.isdir(base) else ():
            return str(found)
    return None


CUOBJDUMP = find_cuobjdump()
pytestmark = [pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not installed"),
              pytest.mark.skipif(CUOBJDUMP is None, reason="cuobjdump not found (pip install nvidia-cuda-cuobjdump)")]

SOURCE = """
__device__ float table_only[64];
__global__ void scale_kernel(float *x) { x[threadIdx.x] *= table_only[threadIdx.x]; }
__global__ void shift_kernel(float *x) { x[threadIdx.x] += 1.0f; }
extern "C" void launch(float *x) { scale_kernel<<<1, 32>>>(x); shift_kernel<<<1, 32>>>(x); }
"""
KERNELS = {"_Z12scale_kernelPf", "_Z12shift_kernelPf"}


def nvcc_help() -> str:
    return subprocess.run([NVCC, "--help"], capture_output=True, text=True, errors="replace").stdout


BUILDS = {
    "sm90a": ["-gencode", "arch=compute_90a,code=[sm_90a,compute_90a]"],
    "f100": ["-gencode", "arch=compute_100f,code=[sm_100f,compute_100f]"],
    "mixed": ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_86,code=sm_86",
              "-gencode", "arch=compute_90,code=compute_90"],
    "compress_all": ["-Xfatbin", "-compress-all", "-gencode", "arch=compute_80,code=[sm_80,compute_80]",
                     "-gencode", "arch=compute_90a,code=sm_90a"],
    "mode_size": ["--compress-mode=size", "-Xfatbin", "-compress-all", "-gencode", "arch=compute_89,code=[sm_89,compute_89]"],
    "mode_speed": ["--compress-mode=speed", "-Xfatbin", "-compress-all", "-gencode", "arch=compute_89,code=[sm_89,compute_89]"],
    "mode_balance": ["--compress-mode=balance", "-Xfatbin", "-compress-all", "-gencode", "arch=compute_75,code=[sm_75,compute_75]"],
    "mode_none": ["--compress-mode=none", "-gencode", "arch=compute_120f,code=[sm_120f,compute_120f]"],
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fatbin_oracle")
    src = tmp / "k.cu"
    src.write_text(SOURCE)
    has_mode = "--compress-mode" in nvcc_help()
    out = {}
    for name, flags in BUILDS.items():
        if name.startswith("mode_") and not has_mode:
            continue
        lib = tmp / f"lib{name}.so"
        run([NVCC, "-shared", "-Xcompiler", "-fPIC", *flags, str(src), "-o", str(lib)])
        out[name] = lib
    # separate compilation: the relocatable object carries __nv_relfatbin, the library
    # the nvlink output and its device-link stub
    obj = tmp / "rdc.o"
    run([NVCC, "-rdc=true", "-c", "-Xcompiler", "-fPIC", "-gencode", "arch=compute_90a,code=sm_90a",
         "-gencode", "arch=compute_80,code=[sm_80,compute_80]", str(src), "-o", str(obj)])
    out["rdc_object"] = obj
    lib = tmp / "librdc.so"
    run([NVCC, "-rdc=true", "-shared", "-gencode", "arch=compute_90a,code=sm_90a",
         "-gencode", "arch=compute_80,code=[sm_80,compute_80]", str(obj), "-o", str(lib)])
    out["rdc_shared"] = lib
    return out


def run(cmd, cwd=None) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, errors="replace", cwd=cwd)
    assert proc.returncode == 0, f"{cmd[0]} failed ({proc.returncode}): {proc.stderr.strip()}"
    return proc.stdout


def cuobjdump_inventory(path) -> tuple:
    """(ELF arch names, PTX arch names) in cuobjdump's order, e.g. (['sm_90a'], ['sm_90a'])."""
    out = run([CUOBJDUMP, "--list-elf", "--list-ptx", path])
    elves = re.findall(r"^ELF file\s+\d+: .*\.(sm_\w+)\.cubin$", out, re.M)
    ptx = re.findall(r"^PTX file\s+\d+: .*\.(sm_\w+)\.ptx$", out, re.M)
    return elves, ptx


def ours(path) -> list:
    return list(read_elf(str(path), fatbin=True).fatbin)


def as_cuobjdump_names(entries) -> tuple:
    # cuobjdump names a family cubin by its plain arch (an sm_100f cubin lists as sm_100);
    # arch-specific cubins and both variants of PTX keep their suffix
    elves = [f"sm_{e.arch}{e.variant if e.variant == 'a' else ''}" for e in entries if e.kind == "sass"]
    ptx = [f"sm_{e.arch}{e.variant}" for e in entries if e.kind == "ptx"]
    return elves, ptx


@pytest.mark.parametrize("name", list(BUILDS) + ["rdc_object", "rdc_shared"])
def test_inventory_matches_cuobjdump(built, name):
    if name not in built:
        pytest.skip("this nvcc has no --compress-mode")
    path = built[name]
    assert as_cuobjdump_names(ours(path)) == cuobjdump_inventory(path)


def test_variants_are_told_apart(built):
    """'a' and 'f' read from the flags, not guessed: cuobjdump prints sm_90a / sm_100f PTX."""
    assert cuobjdump_inventory(built["sm90a"])[1] == ["sm_90a"]
    assert cuobjdump_inventory(built["f100"])[1] == ["sm_100f"]
    assert {(e.kind, e.variant) for e in ours(built["sm90a"])} >= {("sass", "a"), ("ptx", "a")}
    assert ("ptx", "f") in {(e.kind, e.variant) for e in ours(built["f100"])}


def test_compressed_builds_are_compressed(built):
    codecs = {e.codec for e in ours(built["compress_all"]) if e.kind == "sass"}
    assert codecs - {""}, "-compress-all left every cubin uncompressed"
    if "mode_speed" in built:
        assert {e.codec for e in ours(built["mode_size"])} - {""}
        assert {e.codec for e in ours(built["mode_speed"])} - {""}


@pytest.mark.parametrize("name", ["compress_all", "mode_size", "mode_speed", "mode_balance", "mode_none",
                                  "sm90a", "rdc_object"])
def test_images_match_cuobjdump_extraction(built, name, tmp_path):
    """Every decompressed image is byte for byte what cuobjdump -xelf/-xptx extracts."""
    if name not in built:
        pytest.skip("this nvcc has no --compress-mode")
    path = built[name]
    run([CUOBJDUMP, "-xelf", "all", path], cwd=tmp_path)
    run([CUOBJDUMP, "-xptx", "all", path], cwd=tmp_path)
    entries = ours(path)
    for kind, suffix in (("sass", "cubin"), ("ptx", "ptx")):
        theirs = sorted(tmp_path.glob(f"*.{suffix}"), key=lambda p: int(p.name.split(".")[-3]))
        mine = [e for e in entries if e.kind == kind]
        assert len(mine) == len(theirs)
        for entry, extracted in zip(mine, theirs):
            image = elf_fatbin.read_image(str(path), entry)
            expected = extracted.read_bytes()
            if kind == "ptx":
                image = image.split(b"\0", 1)[0]
                assert image.rstrip() == expected.rstrip(), extracted.name
            else:  # the fatbin pads a cubin to its alignment
                assert image[:len(expected)] == expected and not image[len(expected):].strip(b"\0"), extracted.name


def test_kernels_match_cuobjdump_resource_usage(built):
    """Kernel names read from each cubin equal the functions cuobjdump -res-usage lists."""
    path = built["mixed"]
    listed = run([CUOBJDUMP, "-res-usage", path])
    per_cubin = [set(re.findall(r"Function (\S+):", block)) for block in listed.split("Fatbin elf code")[1:]]
    mine = [fatbin_payload.kernels(elf_fatbin.read_image(str(path), e), "sass")
            for e in ours(path) if e.kind == "sass"]
    assert [set(k) for k in mine] == per_cubin
    assert KERNELS in per_cubin and set() in per_cubin  # the kernels, and nvcc's device-link stub


def test_ptx_isa_is_the_toolkits(built):
    """The PTX entry header carries the ISA version that the PTX text declares (.version)."""
    path = built["mixed"]
    for entry in (e for e in ours(path) if e.kind == "ptx"):
        text = elf_fatbin.read_image(str(path), entry).decode("ascii", "replace")
        declared = re.search(r"^\.version (\d+)\.(\d+)", text, re.M)
        assert entry.isa == (int(declared.group(1)), int(declared.group(2)))
