"""`seedance check --python PY --imports ...` and the extension checks, against the real import.

Each case builds real objects with gcc (torch extensions linked against the installed torch,
packages that load a library by path at import time, distributions whose metadata pins
another release) and runs the import for real in the same interpreter: what Python does
is the oracle, and seedance's prediction has to agree with it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import process_fixtures as F  # noqa: E402

from seedance.collect import torch_ext  # noqa: E402

PYTHON = sys.executable
SEEDANCE = [PYTHON, "-m", "seedance"]
pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")


def _seedance(*args, env=None):
    return subprocess.run([*SEEDANCE, *args], capture_output=True, text=True, env=env, timeout=300)


def _findings(report_path):
    with open(report_path) as handle:
        return json.load(handle)["findings"]


@pytest.fixture(scope="module")
def torch():
    install = torch_ext.find_torch()
    if install is None:
        pytest.skip("torch is not installed for this interpreter")
    return install


# --- an extension bound to C functions torch exports -------------------------------------

@pytest.fixture(scope="module")
def c_shim_extensions(tmp_path_factory, torch):
    """Two extensions linked against torch's libraries: one binds a C shim torch 2.x exports
    (aoti_torch__fft_c2c), the other also one it does not: outside the c10/at/torch C++
    namespaces, so the mangled-name check alone never saw it."""
    lib = os.path.join(torch.path, "lib")
    links = ("-L", lib, "-Wl,--no-as-needed", "-ltorch_cpu", "-lc10")
    sites = {}
    for label, refs in (("good", ["aoti_torch__fft_c2c"]),
                        ("bad", ["aoti_torch__fft_c2c", "aoti_torch_removed_in_this_release"])):
        site = str(tmp_path_factory.mktemp(f"shim-{label}"))
        F.extension(site, "shimext", [], links=links, rpath=lib, refs=refs)
        sites[label] = site
    return sites


def test_a_c_symbol_torch_lacks_fails_the_import_and_is_predicted(c_shim_extensions):
    from seedance.collect.python_env import ask_interpreter, predict_imports

    for label, site in c_shim_extensions.items():
        real = F.run_python(site, "import torch, shimext")
        env = dict(os.environ, PYTHONPATH=site)
        prediction = predict_imports(ask_interpreter(PYTHON, env=env), ["torch", "shimext"], search_orders=False)
        assert prediction.ok == (real.returncode == 0), (label, prediction.error, real.stderr[-400:])
        if label == "bad":
            last = real.stderr.decode().strip().splitlines()[-1]
            assert "undefined symbol: aoti_torch_removed_in_this_release" in last
            assert prediction.error == last


def test_the_extension_check_names_the_c_symbol(c_shim_extensions, tmp_path):
    for label, site in c_shim_extensions.items():
        report = tmp_path / f"{label}.json"
        proc = _seedance("check", "--no-cache", "--python", PYTHON, "--report-json", str(report), site)
        rules = {(f["rule"], f["subject"].get("path")) for f in _findings(report)}
        missing = [f for f in _findings(report) if f["rule"] == "torch-symbol-missing"]
        if label == "bad":
            assert proc.returncode == 1, proc.stderr
            assert missing and "aoti_torch_removed_in_this_release" in missing[0]["message"], rules
        else:
            assert missing == [], rules
