import os
import shutil
import subprocess

import pytest

from seedance.collect import torch_ext
from seedance.elf.reader import read_elf
from seedance.judge.engine import load_rules

GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None, reason="g++ not installed")


@pytest.fixture(scope="module")
def torch():
    install = torch_ext.find_torch()
    if install is None:
        pytest.skip("torch wheel not installed")
    return install


def real_c10_symbol(torch):
    """A c10 function libc10 really exports, as binutils sees it (not seedance's reader: issue 17)."""
    proc = subprocess.run(["nm", "-D", "--defined-only", os.path.join(torch.path, "lib", "libc10.so")],
                          capture_output=True, text=True, errors="replace", check=True)
    for line in proc.stdout.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1] == "T" and fields[2].startswith("_ZN3c10"):
            return fields[2]
    pytest.skip("nm lists no c10 function in libc10.so")


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


def old_torch_tree(tmp_path, version="2.1.0+cu118", cuda="'11.8'"):
    old_torch = tmp_path / "old-venv" / "site-packages" / "torch"
    old_torch.mkdir(parents=True)
    (old_torch / "version.py").write_text(f"__version__ = '{version}'\ncuda = {cuda}\n")
    return old_torch


def test_build_for_another_python_or_cuda_tag_is_not_stale(tmp_path, torch):
    """cpp_extension puts the tag in the path: a py311 torch never loads py310_cu118/ (issue 11, item 9)."""
    root = tmp_path / "torch_extensions"
    other = "py310_cu118" if torch.tag != "py310_cu118" else "py39_cu117"
    make_build(root, other, "kernels", str(old_torch_tree(tmp_path)), "_ZN3c1017gone_in_new_torchEv", tmp_path)
    facts = torch_ext.torch_ext_facts([str(root)], torch=torch)
    assert len(facts) == 1
    assert facts[0].data["stale"] is False
    assert other in facts[0].data["other_environment"] and torch.tag in facts[0].data["other_environment"]
    assert load_rules().evaluate(facts) == []


def test_build_of_this_tag_for_another_torch_is_stale_and_names_both_versions(tmp_path, torch):
    root = tmp_path / "torch_extensions"
    old = old_torch_tree(tmp_path, version="2.1.0+cpu", cuda="None")
    make_build(root, torch.tag, "kernels", str(old), "_ZN3c1017gone_in_new_torchEv", tmp_path)
    facts = torch_ext.torch_ext_facts([str(root)], torch=torch)
    reasons = " | ".join(facts[0].data["reasons"])
    assert f"torch: built against 2.1.0+cpu, loaded by {torch.version}" in reasons
    assert "_ZN3c1017gone_in_new_torchEv" in reasons
    findings = load_rules().evaluate(facts)
    assert [f.rule for f in findings] == ["torch-ext-stale"]
    assert findings[0].message.count("2.1.0+cpu") == 1 and findings[0].message.count(torch.version) == 1
    assert findings[0].fix == "seedance fix torch-ext --clean-cache --rebuild kernels"


def test_stale_message_never_shows_one_version_twice(tmp_path, torch):
    """Built against this very torch path, which was upgraded in place since: build.ninja
    names the same directory, so 'built for torch X; current torch X' must not be said."""
    root = tmp_path / "custom"
    make_build(root, None, "direct", torch.path, "_ZN3c1017gone_in_new_torchEv", tmp_path)
    facts = torch_ext.torch_ext_facts([str(root)])
    assert facts[0].data["stale"] is True
    finding, = load_rules().evaluate(facts)
    assert finding.message.count(torch.version) == 1, finding.message
    assert "1 symbol(s)" in finding.message


def test_setup_py_build_gets_a_rebuild_command(tmp_path, torch):
    project = tmp_path / "proj"
    (project / "build").mkdir(parents=True)
    (project / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    temp = project / "build" / "temp.linux-x86_64-cpython-311"
    temp.mkdir()
    (temp / "build.ninja").write_text(
        f"cflags = -DTORCH_EXTENSION_NAME=myext -isystem {torch.path}/include -fPIC\npost_cflags =\n"
        f"build {temp}/myext.o: compile {project}/myext.cpp\n")
    lib_dir = project / "build" / "lib.linux-x86_64-cpython-311" / "pkg"
    lib_dir.mkdir(parents=True)
    src = tmp_path / "m.c"
    src.write_text('extern void f(void) __asm__("_ZN3c1017gone_in_new_torchEv");\nvoid g(void) { f(); }\n')
    subprocess.run(["gcc", "-shared", "-fPIC", str(src), "-o", str(lib_dir / "myext.cpython-311-x86_64-linux-gnu.so")],
                   check=True)
    facts = torch_ext.torch_ext_facts(builds=torch_ext.builds_in(str(project)))
    assert [(f.data["name"], f.data["kind"], f.data["stale"]) for f in facts] == [("myext", "setup.py", True)]
    finding, = load_rules().evaluate(facts)
    assert finding.fix == f"cd {project} && python setup.py build_ext --inplace --force"


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
    build = make_build(root, torch.tag, "kernels", torch.path, "_ZN3c1017gone_in_new_torchEv", tmp_path)
    make_build(root, "py39_cu117", "other", torch.path, "_ZN3c1017gone_in_new_torchEv", tmp_path)
    for target in (root, root / torch.tag, build):
        report = Scanner(CheckOptions(targets=[str(target)])).run()
        stale = [(f.rule, f.subject["path"]) for f in report.findings if f.rule == "torch-ext-stale"]
        assert stale == [("torch-ext-stale", str(build))]


def test_python_tag_read_from_torchs_own_extension_module(torch):
    """The tag comes from torch/_C.cpython-XY-...so, which `ls` shows independently."""
    names = [n for n in os.listdir(torch.path) if n.startswith("_C.cpython-") and n.endswith(".so")]
    assert len(names) == 1
    digits = names[0].split("-")[1]
    assert torch_ext.python_tag_of(torch.path) == "py" + digits


def test_rebuild_command_follows_how_the_extension_was_built(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    python_torch = torch_ext.TorchInstall(path="/x/torch", version="2.13.0", cuda=None,
                                          source="--python /venv/bin/python")
    cached = tmp_path / "cache" / "kernels" / "kernels.so"
    assert torch_ext.rebuild_command(str(cached), python_torch) == \
        "seedance fix torch-ext --clean-cache --rebuild kernels"
    setup_project = tmp_path / "proj"
    (setup_project / "pkg").mkdir(parents=True)
    (setup_project / "setup.py").write_text("")
    assert torch_ext.rebuild_command(str(setup_project / "pkg" / "_C.so"), python_torch) == \
        f"cd {setup_project} && /venv/bin/python setup.py build_ext --inplace --force"
    toml_project = tmp_path / "proj2"
    (toml_project / "src").mkdir(parents=True)
    (toml_project / "pyproject.toml").write_text("")
    assert torch_ext.rebuild_command(str(toml_project / "src" / "_C.so"), None) == \
        f"python -m pip install --no-build-isolation --no-deps --force-reinstall {toml_project}"
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    (site / "myext").mkdir(parents=True)
    (site / "myext-1.0.dist-info").mkdir()
    (site / "myext-1.0.dist-info" / "RECORD").write_text("myext/_C.so,,\n")
    assert torch_ext.rebuild_command(str(site / "myext" / "_C.so"), python_torch) == \
        "/venv/bin/python -m pip install --no-build-isolation --no-deps --force-reinstall --no-binary myext myext"


def test_rebuild_command_for_a_cache_build_outside_the_default_roots(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    build = tmp_path / "elsewhere" / "py311_cpu" / "kernels"
    build.mkdir(parents=True)
    (build / "build.ninja").write_text("cflags = -fPIC\n")
    assert torch_ext.rebuild_command(str(build / "kernels.so"), None) == \
        f"TORCH_EXTENSIONS_DIR={build.parent} seedance fix torch-ext --clean-cache --rebuild kernels"
