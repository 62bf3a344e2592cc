"""plan: the dry-run diff of dynamic entries, and the relink helpers it is made from."""
import os

from seedance.elf.reader import ElfInfo, VersionNeed
from seedance.fix import relink
from seedance.fix.plan import dynamic_diff


def info(needed, needs=()):
    return ElfInfo(path="x", elf_class=64, little_endian=True, machine=62, osabi=0, e_type=3,
                   interpreter=None, needed=tuple(needed), version_needs=tuple(needs))


def test_dynamic_diff_lists_removed_then_added():
    before = info(["libc.so.6", "libcudart.so.12"], [VersionNeed("libcudart.so.12", (("libcudart.so.12", False),))])
    after = info(["libc.so.6", "libcudart.so.13"], [VersionNeed("libcudart.so.13", (("libcudart.so.13", False),))])
    assert dynamic_diff(before, after) == [
        "- NEEDED libcudart.so.12", "- VERNEED libcudart.so.12 libcudart.so.12",
        "+ NEEDED libcudart.so.13", "+ VERNEED libcudart.so.13 libcudart.so.13"]
    assert dynamic_diff(before, before) == []


def test_family_and_runtime_names():
    assert relink.family_of("libcudart.so.12") == "cudart"
    assert relink.family_of("libcublasLt.so.12") == "cublasLt"
    assert relink.family_of("libcublas.so.11") == "cublas"
    assert relink.family_of("libnvrtc-builtins.so.12.4") == "nvrtc-builtins"
    assert relink.family_of("libcudnn.so.9") is None and relink.family_of("libc.so.6") is None
    assert relink.cudart_name(11) == "libcudart.so.11.0" and relink.cudart_name(13) == "libcudart.so.13"


def test_default_roots(tmp_path, monkeypatch):
    (tmp_path / "conda" / "lib").mkdir(parents=True)
    (tmp_path / "proj" / "build").mkdir(parents=True)
    roots = relink.default_roots({"CONDA_PREFIX": str(tmp_path / "conda")}, cwd=str(tmp_path / "proj"))
    assert roots[:3] == ["/usr/lib", str(tmp_path / "conda" / "lib"), str(tmp_path / "proj" / "build")]
    assert any(r.endswith("site-packages") for r in roots[3:])
    assert relink.default_roots({}, cwd=str(tmp_path))[:1] == ["/usr/lib"]
    assert all(os.path.isdir(r) for r in roots)
