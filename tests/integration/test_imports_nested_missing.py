"""A module the import reaches deep down imports a distribution that is not installed.

`import sklearn` fails with "No module named 'cloudpickle'" when joblib, four modules down,
does `from cloudpickle import dumps` and joblib's Requires-Dist pin on cloudpickle was not
met.  Each package here is written to a site in tmp_path and imported for real: Python's
outcome is the oracle for `predict_imports`, both ways (a guarded or conditional import of
a missing name must not be predicted to fail)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from seedance.collect.python_env import ask_interpreter, predict_imports

PYTHON = sys.executable

# package -> {relative file: source}; each names `nosuchdist_zq`, which no finder knows
PACKAGES = {
    # the chain: top/__init__ -> top/base -> lib/__init__ -> lib/wrapper -> the missing name
    "chain_top": {
        "chain_top/__init__.py": "from chain_top.base import clone\n",
        "chain_top/base.py": "import chain_lib\nclone = 1\n",
        "chain_lib/__init__.py": "from ._wrapper import wrap\n",
        "chain_lib/_wrapper.py": ("from ._helpers import mp\n"
                                  "if mp is not None:\n"
                                  "    from .externals import wrap\n"
                                  "else:\n"
                                  "    wrap = None\n"),
        # joblib's own test: the environment decides, then the import binds a module
        "chain_lib/_helpers.py": textwrap.dedent("""\
            import os
            mp = int(os.environ.get("CHAIN_LIB_MULTIPROCESSING_ZQ", 1)) or None
            if mp:
                try:
                    import multiprocessing as mp
                except ImportError:
                    mp = None
            """),
        "chain_lib/externals/__init__.py": "from .pickling import wrap\n",
        "chain_lib/externals/pickling.py": "from nosuchdist_zq import dumps\nwrap = dumps\n",
    },
    # caught: ImportError, a bare except, Exception; contextlib.suppress
    "guarded_try": {"guarded_try/__init__.py": "try:\n    import nosuchdist_zq\nexcept ImportError:\n    nosuchdist_zq = None\n"},
    "guarded_bare": {"guarded_bare/__init__.py": "try:\n    from nosuchdist_zq import x\nexcept:\n    x = None\n"},
    "guarded_suppress": {"guarded_suppress/__init__.py": ("import contextlib\nwith contextlib.suppress(ImportError):\n"
                                                          "    import nosuchdist_zq\n")},
    # raised again by the handler: the import fails all the same
    "reraised": {"reraised/__init__.py": ("try:\n    import nosuchdist_zq\nexcept ImportError as exc:\n"
                                          "    raise ImportError('reraised needs nosuchdist_zq') from exc\n")},
    # a handler for another exception does not catch it
    "wrong_handler": {"wrong_handler/__init__.py": "try:\n    import nosuchdist_zq\nexcept OSError:\n    pass\n"},
    # an `if` whose test is not known before running: either may run
    "conditional": {"conditional/__init__.py": ("import random\nif random.random() > 2:\n"
                                                "    import nosuchdist_zq\n")},
    # mpmath's backend: a name assigned in a branch that may not run is not known afterwards
    "maybe_assigned": {"maybe_assigned/__init__.py": textwrap.dedent("""\
        import os
        BACKEND = 'python'
        if 'MAYBE_ASSIGNED_SAGE_ZQ' in os.environ:
            BACKEND = 'sage'
        if BACKEND == 'sage':
            import nosuchdist_zq
        """)},
    # a module that puts a directory on sys.path first (setuptools' _vendor): found there
    "path_added": {"path_added/__init__.py": ("import os, sys\nsys.path.insert(0, os.path.join(os.path.dirname(__file__), "
                                              "'_vendor'))\nimport vendored_zq\n"),
                   "path_added/_vendor/vendored_zq.py": "X = 1\n"},
    # a function body does not run at import time
    "in_function": {"in_function/__init__.py": "def later():\n    import nosuchdist_zq\n"},
    # a missing name after an unknown test surely runs once the test is decided by a literal
    "known_false": {"known_false/__init__.py": "import sys\nif sys.platform == 'win32':\n    import nosuchdist_zq\n"},
}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("nested-missing")
    for files in PACKAGES.values():
        for relative, source in files.items():
            path = root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source)
    return str(root)


def _real(site: str, module: str) -> tuple:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CHAIN_LIB", "MAYBE_ASSIGNED"))}
    env["PYTHONPATH"] = site
    proc = subprocess.run([PYTHON, "-c", f"import {module}"], capture_output=True, text=True, errors="replace",
                          env=env, timeout=120, cwd="/")
    return proc.returncode == 0, (proc.stderr.strip().splitlines() or [""])[-1]


@pytest.mark.parametrize("module", sorted(PACKAGES))
def test_the_prediction_agrees_with_the_import(site, module):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CHAIN_LIB", "MAYBE_ASSIGNED"))}
    env["PYTHONPATH"] = site
    prediction = predict_imports(ask_interpreter(PYTHON, env=env), [module], search_orders=False)
    imports, last_line = _real(site, module)
    assert prediction.ok == imports, (module, prediction.error, last_line)
    if not imports and last_line.startswith("ModuleNotFoundError"):
        assert prediction.error == last_line


def test_the_chain_is_one_error_with_the_pin_that_explains_it(site, tmp_path):
    """The finding names the missing distribution and the pin of the distribution whose
    module raised; `check` exits 1."""
    dist = os.path.join(site, "chain_lib-2.0.dist-info")
    os.makedirs(dist, exist_ok=True)
    with open(os.path.join(dist, "METADATA"), "w") as handle:
        handle.write("Metadata-Version: 2.1\nName: chain-lib\nVersion: 2.0\nRequires-Dist: nosuchdist-zq>=3.0\n"
                     "Requires-Dist: pytest; extra == 'test'\n\n")
    with open(os.path.join(dist, "RECORD"), "w") as handle:
        handle.write("chain_lib/__init__.py,,\nchain_lib/_wrapper.py,,\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CHAIN_LIB"))}
    env["PYTHONPATH"] = site
    proc = subprocess.run([PYTHON, "-m", "seedance", "check", "--json", "--no-progress", "--python", PYTHON,
                           "--imports", "chain_top"], capture_output=True, text=True, env=env, timeout=300, cwd="/")
    assert proc.returncode == 1, proc.stderr[-2000:]
    findings = json.loads(proc.stdout)["findings"]
    failing = [f for f in findings if f["rule"] == "import-fails"]
    assert len(failing) == 1 and "No module named 'nosuchdist_zq'" in failing[0]["message"], findings
    assert "pip install 'nosuchdist-zq>=3.0'" in failing[0]["fix"], failing[0]["fix"]
    pins = [f for f in findings if f["rule"] == "dist-requirement-unmet"]
    assert len(pins) == 1 and pins[0]["severity"] == "error", pins
    assert "chain-lib 2.0 requires nosuchdist-zq>=3.0" in pins[0]["message"], pins[0]["message"]
    assert "import chain_top fails" in pins[0]["message"], pins[0]["message"]
