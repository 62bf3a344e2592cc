"""An extension judged against the torch that imports it (issue 11, items 4 and 5), with
the real venv torch; the verdict is compared with importing the extension in a child."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from tests.conftest import run_cli

GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None or shutil.which("nm") is None, reason="needs g++ and binutils' nm")
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")

MODULE = """\
#include <Python.h>
extern "C" void c10_function(void) __asm__("SYMBOL");
static PyObject* probe(PyObject*, PyObject*) { c10_function(); Py_RETURN_NONE; }
static PyMethodDef methods[] = {{"probe", probe, METH_NOARGS, ""}, {nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "NAME", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&mod); }
"""


def real_c10_function(torch_dir) -> str:
    proc = subprocess.run(["nm", "-D", "--defined-only", os.path.join(torch_dir, "lib", "libc10.so")],
                          capture_output=True, text=True, errors="replace", check=True)
    for line in proc.stdout.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1] == "T" and fields[2].startswith("_ZN3c10") and "__cxx11" not in fields[2]:
            return fields[2]
    pytest.skip("nm lists no c10 function")


def environment(tmp_path, torch_dir):
    """A site-packages holding (a link to) the venv's torch, as an extension's environment."""
    site = tmp_path / "env" / "lib" / f"python{PY}" / "site-packages"
    site.mkdir(parents=True)
    os.symlink(torch_dir, site / "torch")
    return site


def build(dest, name, symbol, torch_dir):
    dest.mkdir(parents=True, exist_ok=True)
    src = dest / f"{name}.cpp"
    src.write_text(MODULE.replace("NAME", name).replace("SYMBOL", symbol))
    out = dest / f"{name}{SUFFIX}"
    subprocess.run([GXX, "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", str(src), "-o", str(out),
                    f"-L{torch_dir}/lib", "-Wl,--no-as-needed", "-lc10"], check=True, capture_output=True)
    src.unlink()
    return out


def imports(site, module) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
    env["PYTHONPATH"] = str(site)
    return subprocess.run([sys.executable, "-c", f"import torch, {module}"], capture_output=True, text=True,
                          errors="replace", env=env, timeout=300, cwd="/")


def findings_for(path, *args):
    proc = run_cli("check", "--json", "--no-progress", *args, path)
    assert proc.returncode in (0, 1), proc.stderr
    return [f for f in json.loads(proc.stdout)["findings"] if f["subject"].get("path") == str(path)]


def test_call_to_a_c10_function_this_torch_lacks_is_an_error(tmp_path, torch_dir):
    site = environment(tmp_path, torch_dir)
    good = build(site / "pkg", "good", real_c10_function(torch_dir), torch_dir)
    bad = build(site / "pkg", "bad", "_ZN3c1019gone_from_this_torchEv", torch_dir)
    assert imports(site, "pkg.good").returncode == 0
    reality = imports(site, "pkg.bad")
    assert reality.returncode != 0 and "undefined symbol: _ZN3c1019gone_from_this_torchEv" in reality.stderr
    assert findings_for(good) == []
    found = findings_for(bad)
    assert [(f["rule"], f["severity"]) for f in found] == [("torch-symbol-missing", "error")]
    assert found[0]["evidence"]["examples"] == ["_ZN3c1019gone_from_this_torchEv"]
    assert found[0]["evidence"]["torch_source"] == "beside it"


def test_without_a_torch_in_its_environment_it_is_not_judged_and_no_loader_error(tmp_path, torch_dir):
    loose = build(tmp_path / "loose", "bad", "_ZN3c1019gone_from_this_torchEv", torch_dir)
    found = findings_for(loose)
    assert [(f["rule"], f["severity"]) for f in found] == [("torch-not-found", "info")]
    # --python names the interpreter that imports it: now it is judged, against that torch
    found = findings_for(loose, "--python", sys.executable)
    assert [f["rule"] for f in found] == ["torch-symbol-missing"]
    assert found[0]["evidence"]["torch_source"] == f"--python {sys.executable}"


def test_python_names_the_torch_that_interpreter_imports(torch_dir):
    from seedance.collect import torch_ext

    install = torch_ext.torch_for_python(sys.executable)
    proc = subprocess.run([sys.executable, "-c", "import torch, os; print(os.path.dirname(torch.__file__))"],
                          capture_output=True, text=True, errors="replace", timeout=300)
    assert os.path.realpath(install.path) == os.path.realpath(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("python, says", [
    ("/nonexistent/python", "not an executable file"),
    ("/bin/true", "not a Python interpreter"),
])
def test_bad_python_is_one_line_and_exit_2(tmp_path, python, says):
    # (an interpreter without torch is no bad input: its environment is checked all the same)
    proc = run_cli("check", "--python", python, tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("seedance: error: --python")
    assert says in proc.stderr
