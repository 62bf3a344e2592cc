import os
import shutil
import subprocess

import pytest

from seedance.collect import torch_ext
from seedance.elf.reader import read_elf
from seedance.engine import load_rules

GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None, reason="g++ not installed")


@pytest.fixture(scope="module")
def torch():
    install = torch_ext.find_torch()
    if install is None:
        pytest.skip("torch wheel not installed")
    return install


def real_c10_symbol(torch):
    info = read_elf(os.path.join(torch.path, "lib", "libc10.so"), symbols=True)
    for sym in info.symbols:
        if sym.defined and sym.type == "FUNC" and sym.name.startswith("_ZN3c10") and "__cxx11" in sym.name:
            return sym.name
    pytest.skip("no suitable c10 symbol")


def make_build(root, tag, name, torch_dir, symbol, tmp_path):
    build = root / tag / name if tag else root / name
    build.mkdir(parents=True)
    (build / "build.ninja").write_text(
        "ninja_required_version = 1.3\ncxx = c++\n"
        f"cflags = -DTORCH_EXTENSION_NAME={name} -isystem {torch_dir}/include "
        f"-isystem {torch_dir}/include/torch/csrc/api/include -isystem /usr/include/python3.11 -fPIC -std=c++20\n"
        "post_cflags =\nldflags = -shared -lc10 -ltorch\n")
    # an object that imports exactly `symbol` (declared through asm labels: no torch headers)
    src = tmp_path / f"{name}.c"
    src.write_text(f'extern void imported(void) __asm__("{symbol}");\nvoid call(void) {{ imported(); }}\n')
    subprocess.run(["gcc", "-shared", "-fPIC", str(src), "-o", str(build / f"{name}.so")], check=True)
    return build


def test_fresh_build_is_not_stale(tmp_path, torch):
    root = tmp_path / "torch_extensions"
    make_build(root, f"{torch.python_tag}_{torch.accelerator}", "fresh", torch.path, real_c10_symbol(torch), tmp_path)
    facts = torch_ext.torch_ext_facts([str(root)])
    assert len(facts) == 1
    assert facts[0].data["stale"] is False, facts[0].data["reasons"]
    assert load_rules().evaluate(facts) == []


def test_build_for_other_python_cuda_and_torch_is_stale(tmp_path, torch):
    root = tmp_path / "torch_extensions"
    old_torch = tmp_path / "old-venv" / "site-packages" / "torch"
    old_torch.mkdir(parents=True)
    (old_torch / "version.py").write_text("__version__ = '2.1.0+cu118'\ncuda = '11.8'\n")
    make_build(root, "py310_cu118", "kernels", str(old_torch), "_ZN3c1017gone_in_new_torchEv", tmp_path)
    facts = torch_ext.torch_ext_facts([str(root)])
    assert len(facts) == 1
    reasons = " | ".join(facts[0].data["reasons"])
    for word in ("python: built for py310", "cuda: built for cu118", "torch: built against 2.1.0+cu118",
                 "_ZN3c1017gone_in_new_torchEv"):
        assert word in reasons
    findings = load_rules().evaluate(facts)
    assert [f.rule for f in findings] == ["torch-ext-stale"]
    assert findings[0].fix == "seedance fix torch-ext --clean-cache --rebuild kernels"


def test_torch_extensions_dir_layout_and_roots(tmp_path, torch):
    root = tmp_path / "custom"
    make_build(root, None, "direct", torch.path, "_ZN3c1017gone_in_new_torchEv", tmp_path)
    facts = torch_ext.torch_ext_facts([str(root)])
    assert [f.data["name"] for f in facts] == ["direct"]
    assert facts[0].data["stale"] is True
    roots = torch_ext.cache_roots({"TORCH_EXTENSIONS_DIR": str(root)}, home="/home/u")
    assert roots == [str(root), "/home/u/.cache/seedance/torch-ext"]
    assert torch_ext.cache_roots({}, home="/home/u")[0] == "/home/u/.cache/torch_extensions"


def test_cache_given_as_a_check_target(tmp_path, torch):
    from seedance.collect.scan import CheckOptions, Scanner

    root = tmp_path / "torch_extensions"
    build = make_build(root, "py310_cu118", "kernels", torch.path, real_c10_symbol(torch), tmp_path)
    for target in (root, root / "py310_cu118", build):
        report = Scanner(CheckOptions(targets=[str(target)])).run()
        assert [(f.rule, f.subject["path"]) for f in report.findings] == [("torch-ext-stale", str(build))]
