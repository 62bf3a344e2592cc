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


# --- libraries a package loads by path when it is imported --------------------------------

_BY_PATH = {
    # module: the __init__.py that loads lib/libx.so by path
    "by_join": """
        import ctypes, os
        _here = os.path.dirname(os.path.abspath(__file__))
        _lib = ctypes.CDLL(os.path.join(_here, "lib", "libx.so"), mode=ctypes.RTLD_GLOBAL)
        """,
    "by_pathlib": """
        import ctypes
        from pathlib import Path
        ctypes.cdll.LoadLibrary(str(Path(__file__).resolve().parent / "lib" / "libx.so"))
        """,
    "by_guarded": """
        import ctypes, os
        try:
            ctypes.CDLL(os.path.join(os.path.dirname(__file__), "lib", "libx.so"))
        except OSError:
            _lib = None
        """,
}


def _by_path_site(root, with_dependency):
    """Packages whose __init__ loads lib/libx.so, which NEEDs liby.so.1: present beside it
    (RUNPATH $ORIGIN) or not shipped at all."""
    site = os.path.join(root, "site")
    for module, source in _BY_PATH.items():
        lib = os.path.join(site, module, "lib")
        os.makedirs(lib, exist_ok=True)
        F.shared_lib(os.path.join(root, "liby.so.1"), "int y_value(void) { return 1; }\n", soname="liby.so.1")
        if with_dependency:
            shutil.copy(os.path.join(root, "liby.so.1"), lib)
        F.shared_lib(os.path.join(lib, "libx.so"), "extern int y_value(void);\nint x_value(void) { return y_value(); }\n",
                     rpath="$ORIGIN", links=(os.path.join(root, "liby.so.1"),))
        F.package(site, module, source)
    return site


@pytest.mark.parametrize("with_dependency", [False, True], ids=["liby-missing", "liby-shipped"])
def test_a_library_loaded_by_path_decides_the_import(tmp_path, with_dependency):
    from seedance.collect.python_env import ask_interpreter, predict_imports

    site = _by_path_site(str(tmp_path), with_dependency)
    interp = ask_interpreter(PYTHON, env=dict(os.environ, PYTHONPATH=site))
    for module in _BY_PATH:
        real = F.run_python(site, f"import {module}")
        prediction = predict_imports(interp, [module], search_orders=False)
        assert prediction.ok == (real.returncode == 0), (module, prediction.error, real.stderr[-300:])
        if real.returncode:
            assert prediction.error == real.stderr.decode().strip().splitlines()[-1]
        dlopened = [step.load.target for step in prediction.model.steps if step.load.kind == "dlopen"]
        assert dlopened and dlopened[0].endswith(f"{module}/lib/libx.so")


def test_a_failed_load_by_path_is_a_finding_and_exit_1(tmp_path):
    site = _by_path_site(str(tmp_path), with_dependency=False)
    env = dict(os.environ, PYTHONPATH=site)
    report = tmp_path / "report.json"
    proc = _seedance("check", "--python", PYTHON, "--imports", "by_join,by_guarded", "--report-json", str(report),
                     env=env)
    failed = [f for f in _findings(report) if f["rule"] == "process-load-fails"]
    assert proc.returncode == 1, proc.stderr
    # by_guarded catches the OSError and imports: only by_join's load is a finding
    assert [f["subject"]["path"] for f in failed] == [os.path.join(site, "by_join", "lib", "libx.so")]
    assert "the import raises OSError: liby.so.1: cannot open shared object file" in failed[0]["message"]


def test_torch_ops_load_library_fails_the_import_with_torchs_text(tmp_path, torch):
    from seedance.collect.python_env import ask_interpreter, predict_imports

    site = _by_path_site(str(tmp_path), with_dependency=False)
    F.package(site, "by_torch_ops", """
        import os
        import torch
        torch.ops.load_library(os.path.join(os.path.dirname(__file__), "..", "by_join", "lib", "libx.so"))
        """)
    real = F.run_python(site, "import by_torch_ops")
    prediction = predict_imports(ask_interpreter(PYTHON, env=dict(os.environ, PYTHONPATH=site)),
                                 ["by_torch_ops"], search_orders=False)
    assert real.returncode != 0
    assert prediction.error == real.stderr.decode().strip().splitlines()[-1]


# --- an interpreter without torch ----------------------------------------------------------

def test_an_interpreter_without_torch_is_checked_all_the_same(tmp_path):
    """--python names a venv with no torch: its site-packages and its imports are checked
    like any other (an extension whose NEEDED is missing fails its import for real)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert subprocess.run([python, "-c", "import torch"], capture_output=True).returncode != 0
    lib = os.path.join(str(tmp_path), "libgone.so.1")
    F.shared_lib(lib, "int gone(void) { return 1; }\n", soname="libgone.so.1")
    F.extension(os.path.join(site, "needsgone"), "_core", ["gone"], links=(lib,), rpath="$ORIGIN")
    F.package(site, "needsgone", "from . import _core\n")
    os.unlink(lib)
    real = subprocess.run([python, "-c", "import needsgone"], capture_output=True, text=True)
    assert "libgone.so.1: cannot open shared object file" in real.stderr
    for args in (["check", "--python", python, site], ["check", "--python", python, "--imports", "needsgone,json"]):
        proc = _seedance(*args)
        assert proc.returncode == 1, (args, proc.stdout[-800:], proc.stderr)
        assert "libgone.so.1" in proc.stdout and "no torch" not in proc.stderr


# --- what the --imports text says -----------------------------------------------------------

def test_imports_text_names_the_interpreter_given_and_counts_what_is_not_known(tmp_path):
    F.package(str(tmp_path), "dynamic_loads", """
        import ctypes, ctypes.util
        for _name in ("z", "m", "c"):
            ctypes.CDLL(ctypes.util.find_library(_name))
        ctypes.CDLL(ctypes.util.find_library("z"))
        ctypes.CDLL(ctypes.util.find_library("m"))
        """)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    assert subprocess.run([PYTHON, "-c", "import dynamic_loads"], env=env).returncode == 0
    quiet = _seedance("check", "--python", PYTHON, "--imports", "dynamic_loads", env=env)
    loud = _seedance("check", "--python", PYTHON, "--imports", "dynamic_loads", "-v", env=env)
    assert quiet.returncode == loud.returncode == 0, quiet.stderr
    # the interpreter as given (a venv's bin/python), not the base binary it runs
    assert quiet.stdout.startswith(f"import dynamic_loads in {PYTHON} ")
    unknown = [line for line in quiet.stdout.splitlines() if line.startswith("not known statically")]
    listed = [line for line in loud.stdout.splitlines() if line.startswith("not known statically")]
    assert unknown == [f"not known statically: {len(listed)} places (dynamic loads, imports under conditions "
                       "not followed); -v lists them"]
    ours = [line for line in listed if "dynamic_loads" in line]
    assert [line.split(":")[2] for line in ours] == ["4", "5", "6"] and all("CDLL()" in line for line in ours)


# --- distribution metadata -------------------------------------------------------------------

def _pinned_site(root, torch, requires, dist="fakevision", version="0.1"):
    """fakevision (distribution ``dist`` ``version``): a torch extension built against
    another torch (it binds a function this torch lacks), whose METADATA pins that torch."""
    site = os.path.join(root, "site")
    lib = os.path.join(torch.path, "lib")
    F.extension(os.path.join(site, "fakevision"), "_C", [], links=("-L", lib, "-Wl,--no-as-needed", "-ltorch_cpu"),
                rpath=lib, refs=["aoti_torch_removed_in_this_release"])
    F.package(site, "fakevision", "import torch\nfrom . import _C\n")
    info = os.path.join(site, f"{dist}-{version}.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as handle:
        handle.write(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
                     + "".join(f"Requires-Dist: {line}\n" for line in requires) + "\nA description.\n")
    with open(os.path.join(info, "RECORD"), "w") as handle:
        handle.write("fakevision/__init__.py,,\nfakevision/_C" + F.EXT_SUFFIX
                     + f",,\n{dist}-{version}.dist-info/METADATA,,\n")
    return site


def test_unmet_requirements_are_what_pip_check_reports(tmp_path, torch):
    from seedance.collect.python_env import ask_interpreter, unmet_requirements

    site = _pinned_site(str(tmp_path), torch, ["torch==1.0", "numpy>=1.0", "nosuchdist-xyz>=1; extra == 'all'",
                                               "nosuchdist-abc; python_version < '3'", "nosuchdist-def>=2"])
    env = dict(os.environ, PYTHONPATH=site)
    pip = subprocess.run([PYTHON, "-m", "pip", "check"], capture_output=True, text=True, env=env, timeout=120)
    if "No module named pip" in pip.stderr:
        pytest.skip("pip is not installed for this interpreter")
    said = sorted(line.rstrip(".") for line in pip.stdout.splitlines() if line.strip())
    ours = []
    for item in unmet_requirements(ask_interpreter(PYTHON, env=env)):
        if item.installed is None:
            ours.append(f"{item.distribution} {item.version} requires {item.name}, which is not installed")
        else:
            ours.append(f"{item.distribution} {item.version} has requirement {item.requirement}, "
                        f"but you have {item.name} {item.installed}")
    assert sorted(ours) == said


def test_a_pin_that_explains_an_import_failure_is_named_with_the_proof(tmp_path, torch):
    site = _pinned_site(str(tmp_path), torch, ["torch==1.0"])
    env = dict(os.environ, PYTHONPATH=site)
    real = subprocess.run([PYTHON, "-c", "import fakevision"], capture_output=True, text=True, env=env)
    assert "undefined symbol: aoti_torch_removed_in_this_release" in real.stderr
    report = tmp_path / "report.json"
    proc = _seedance("check", "--python", PYTHON, "--imports", "fakevision", "--report-json", str(report), env=env)
    pinned = [f for f in _findings(report) if f["rule"] == "dist-requirement-unmet"]
    assert proc.returncode == 1
    assert len(pinned) == 1 and pinned[0]["severity"] == "error", pinned
    message = pinned[0]["message"]
    assert message.startswith(f"fakevision 0.1 requires torch==1.0, torch {torch.version} is installed; "
                              "import fakevision fails: ImportError: ")
    assert message.endswith("undefined symbol: aoti_torch_removed_in_this_release")


def test_a_pin_of_a_paired_extension_names_its_release_for_the_installed_torch(tmp_path, torch):
    """torchvision 0.19.1 pins torch==2.4.1: against another torch the fix is the
    torchvision release built for that torch (rules/context/release_pairs.yaml), pinned."""
    from seedance.collect import package_context

    found = package_context.matching_release("torchvision", torch.version)
    if found is None:
        pytest.skip(f"release_pairs.yaml pairs no torchvision with torch {torch.version}")
    site = _pinned_site(str(tmp_path), torch, ["torch==2.4.1"], dist="torchvision", version="0.19.1")
    env = dict(os.environ, PYTHONPATH=site)
    report = tmp_path / "report.json"
    proc = _seedance("check", "--python", PYTHON, "--imports", "fakevision", "--report-json", str(report), env=env)
    pinned = [f for f in _findings(report) if f["rule"] == "dist-requirement-unmet"]
    assert proc.returncode == 1 and len(pinned) == 1, proc.stdout
    fix = pinned[0]["fix"]
    assert fix.startswith(f"{PYTHON} -m pip install --no-deps 'torchvision=={found[0]}'"), fix
    assert ("--index-url https://download.pytorch.org/whl/" in fix) == ("+" in torch.version)
    assert "--no-binary" not in fix


def test_a_bad_release_pairs_file_stops_the_check_with_one_line(tmp_path, torch):
    import seedance.judge.engine as engine

    rules = tmp_path / "rules"
    shutil.copytree(engine.default_rules_dir(), rules)
    (rules / "context" / "release_pairs.yaml").write_text("extensions:\n  - distribution: torchvision\n")
    site = _pinned_site(str(tmp_path), torch, ["torch==2.4.1"], dist="torchvision", version="0.19.1")
    code = ("import sys, seedance.judge.engine as e; e.RULES_DIR = sys.argv[1]; "
            "from seedance.cli import main; sys.exit(main(['check', '--python', sys.argv[2], '--imports', 'fakevision']))")
    proc = subprocess.run([PYTHON, "-c", code, str(rules), PYTHON], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=site, SEEDANCE_CACHE="0"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "release_pairs.yaml#0: 'pairs' must be a non-empty list" in lines[0]


def test_an_extension_fix_pins_the_release_for_the_installed_torch_never_a_source_rebuild(torch):
    from seedance.collect import package_context

    paired = torch_ext.matching_install("torchvision", torch, "py")
    found = package_context.matching_release("torchvision", torch.version)
    if found is not None:
        assert paired.startswith(f"py -m pip install --no-deps 'torchvision=={found[0]}'")
    # a torch release with no known pair: what to install, and no --no-binary rebuild of a
    # project that publishes wheels only
    future = torch_ext.TorchInstall(torch.path, "9.99.0+cpu", None, None, torch.python_tag, torch.source)
    unknown = torch_ext.matching_install("torchvision", future, "py")
    assert "torch 9.99.0+cpu" in unknown and "--no-binary" not in unknown and "pip install" not in unknown
    assert torch_ext.matching_install("some-other-extension", torch, "py") is None


# --- the prediction cache: a repeat answers from it, a changed file is seen ---------------

def _cached_check(site, cache, names):
    report = os.path.join(cache, "report.json")
    env = dict(os.environ, PYTHONPATH=site, XDG_CACHE_HOME=cache)
    env.pop("SEEDANCE_CACHE", None)
    proc = _seedance("check", "--python", PYTHON, "--imports", names, "--report-json", report, env=env)
    with open(report) as handle:
        data = json.load(handle)
    return proc, data["stats"]["cache"]["state"], data["process"]


def test_a_repeat_answers_from_the_cache_until_a_file_it_read_changes(tmp_path):
    import time

    site = _by_path_site(str(tmp_path), with_dependency=True)
    cache = str(tmp_path / "cache")
    os.makedirs(cache)
    time.sleep(2.1)  # files written within the timestamp tick of a read are never cached (check_cache.RACY_S)
    first, state, process = _cached_check(site, cache, "by_join")
    assert (first.returncode, state, process["ok"]) == (0, "stored", True), first.stderr
    again, state, process_again = _cached_check(site, cache, "by_join")
    assert (again.returncode, state) == (0, "hit")
    assert again.stdout.startswith(first.stdout.rstrip("\n")) and "from the check cache" in again.stdout
    assert process_again == process
    # the library the package loads by path needs liby.so.1, now gone: the real import fails
    os.unlink(os.path.join(site, "by_join", "lib", "liby.so.1"))
    assert F.run_python(site, "import by_join").returncode != 0
    changed, state, process = _cached_check(site, cache, "by_join")
    assert state != "hit" and changed.returncode == 1 and not process["ok"]
    assert "liby.so.1: cannot open shared object file" in process["error"]
    # a source edited: its new load by path is read, not the cached answer
    time.sleep(2.1)
    assert _cached_check(site, cache, "by_pathlib")[1] == "stored"
    with open(os.path.join(site, "by_pathlib", "__init__.py"), "a") as handle:
        handle.write('\nctypes.CDLL(str(Path(__file__).resolve().parent / "lib" / "libgone.so"))\n')
    real = F.run_python(site, "import by_pathlib")
    edited, state, process = _cached_check(site, cache, "by_pathlib")
    assert state != "hit" and edited.returncode == 1 and real.returncode != 0
    assert process["error"] == real.stderr.decode().strip().splitlines()[-1]
