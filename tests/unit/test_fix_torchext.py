"""torch-ext helpers: what a cached build.ninja says, and which builds a --rebuild selects."""
import pytest

from seedance.model.errors import BadInput
from seedance.fix import torchext


def test_read_ninja_sources_keeps_user_flags_only(tmp_path):
    (tmp_path / "build.ninja").write_text(
        "cflags = -DTORCH_EXTENSION_NAME=k -DTORCH_API_INCLUDE_EXTENSION_H -isystem /t/torch/include "
        "-D_GLIBCXX_USE_CXX11_ABI=1 -DPYBIND11_COMPILER_TYPE=x -O3 -DMY_FLAG=1 -I/src/include -fPIC\n"
        "build k.o: compile /src/k$ 1.cpp\n"
        "build kern.cuda.o: cuda_compile /src/kern.cu\n")
    sources, flags, cuda = torchext.read_ninja_sources(str(tmp_path))
    assert sources == ["/src/k 1.cpp", "/src/kern.cu"]
    assert flags == ["-O3", "-DMY_FLAG=1", "-I/src/include"]
    assert cuda is True


def test_select():
    cpu = torchext.StaleBuild("/c/cpu_ops", "cpu_ops", [], "")
    cuda = torchext.StaleBuild("/c/kern", "kern", [], "", cuda=True)
    named = torchext.StaleBuild("/c/custom_kernels", "custom_kernels", [], "")
    builds = [cpu, cuda, named]
    assert torchext.select(builds, None) == []
    assert torchext.select(builds, "all") == builds
    assert torchext.select(builds, "custom_kernels") == [cuda, named]
    assert torchext.select(builds, "cpu_ops") == [cpu]
    with pytest.raises(BadInput, match="stale: cpu_ops, custom_kernels, kern"):
        torchext.select(builds, "nope")


def test_expected_build_dir_follows_torch_extensions_dir(tmp_path):
    assert torchext.expected_build_dir("k", {"TORCH_EXTENSIONS_DIR": str(tmp_path)}) == str(tmp_path / "k")
