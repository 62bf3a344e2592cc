"""Accuracy of the torch verdicts (issue 11, items 4, 5 and 9) on real torch wheels.

Two real torch installs: torch 2.4.1 from PyPI (the pre-cxx11 ABI, whose libc10 also exports
statically linked std::__cxx11 helpers; installed with its nvidia-* wheels, cached under
~/.cache/seedance-corpus) and the venv's torch 2.13 CPU wheel (the cxx11 ABI).  Extension
modules are compiled here with g++ and each wheel's own headers (c10/core/Device.h), with
the ABI flag that torch was built with, exactly as torch.utils.cpp_extension would compile
them (no RUNPATH: `import torch` provides libc10).  Every verdict of `seedance check` is
compared with reality: the extension imported in a child Python with that torch first.
A cache entry is compared with where torch.utils.cpp_extension would look for it
(_get_build_directory) and, when it would load it, with importing it.

cases(workdir) builds the corpus and returns the cases; evaluate_all(cases) gives the rows
(one `seedance check` per set of options); `python -m tests.accuracy.test_torch_accuracy`
prints the table, and the bench (bench/bench_accuracy.py) can print the same one.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import run_cli

# the first run downloads and installs torch 2.4.1 with its nvidia wheels (about 2 GB)
pytestmark = pytest.mark.timeout(2400)

CORPUS = Path(os.environ.get("SEEDANCE_CORPUS", Path.home() / ".cache" / "seedance-corpus"))
OLD_TORCH = "2.4.1"  # the last ABI-0 PyPI line is 2.6; 2.4.1 is the release issue 11 was measured on
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")

MODULE = """\
#include <Python.h>
#include <c10/core/Device.h>
static PyObject* probe(PyObject*, PyObject*) { c10::Device d("cpu"); return PyLong_FromLong((long)d.type()); }
static PyMethodDef methods[] = {{"probe", probe, METH_NOARGS, ""}, {nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "NAME", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&mod); }
"""

# a module that calls one c10 function by its mangled name (chosen with nm at run time)
MODULE_CALLING = """\
#include <Python.h>
extern "C" void c10_function(void) __asm__("SYMBOL");
static PyObject* probe(PyObject*, PyObject*) { c10_function(); Py_RETURN_NONE; }
static PyMethodDef methods[] = {{"probe", probe, METH_NOARGS, ""}, {nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "NAME", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&mod); }
"""


class Unavailable(Exception):
    """A part of the corpus cannot be had here (the reason says why)."""


@dataclass
class Env:
    label: str
    site: Path  # a site-packages holding torch

    @property
    def torch(self) -> Path:
        return self.site / "torch"


@dataclass
class Case:
    name: str
    kind: str  # "install", "extension" or "cache"
    env: Env
    target: Path  # what `seedance check` is given
    subject: Path  # whose findings are the verdict
    check_args: list = field(default_factory=list)
    module: str = ""  # import name (extension cases)
    build_name: str = ""  # cache cases: the extension name cpp_extension would look up


# --- the two torch installs ------------------------------------------------------------------------

def new_torch_env() -> Env:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise Unavailable("the venv's torch wheel is not installed")
    return Env("torch 2.13 (venv)", Path(list(spec.submodule_search_locations)[0]).parent)


def old_torch_env() -> Env:
    """torch 2.4.1 from PyPI with the nvidia-* wheels it pins, installed once with --no-deps
    into CORPUS/torch24/lib/pythonX.Y/site-packages (a real environment layout)."""
    site = CORPUS / "torch24" / "lib" / f"python{PY}" / "site-packages"
    if (site / "torch" / "version.py").is_file() and (site / ".seedance-complete").is_file():
        return Env(f"torch {OLD_TORCH} (PyPI)", site)
    if not (8 <= sys.version_info[1] <= 12) or sys.version_info[0] != 3:
        raise Unavailable(f"torch {OLD_TORCH} has no wheel for Python {PY}")
    CORPUS.mkdir(parents=True, exist_ok=True)
    with open(CORPUS / ".torch24.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (site / ".seedance-complete").is_file():
            _install_old_torch(site)
    return Env(f"torch {OLD_TORCH} (PyPI)", site)


def _pip(*args, timeout=1800):
    proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                          errors="replace", timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise Unavailable(f"pip {args[0]} failed: {tail}")


def _install_old_torch(site: Path) -> None:
    wheels = CORPUS / "torch24-wheels"  # ours alone: other corpora keep other nvidia versions
    wheels.mkdir(parents=True, exist_ok=True)
    torch_wheel = _wheel(wheels, f"torch=={OLD_TORCH}")
    wanted, chosen = _nvidia_pins(torch_wheel), [torch_wheel]
    seen = set()
    while wanted - seen:  # the nvidia wheels' own nvidia-* dependencies too (cusparse -> nvjitlink)
        spec = sorted(wanted - seen)[0]
        seen.add(spec)
        if "==" not in spec and any(other.startswith(spec + "==") for other in wanted):
            # cusolver needs some nvidia-cusparse-cu12, torch pins one: the pinned wheel is
            # that one (the newest in the folder would be a second version: pip refuses both)
            continue
        wheel = _wheel(wheels, spec)
        chosen.append(wheel)
        wanted |= _nvidia_pins(wheel)
    _pip("install", "--no-deps", "--target", str(site), "--upgrade", *map(str, chosen))
    (site / ".seedance-complete").write_text("torch and its nvidia wheels\n")


def _wheel(wheels: Path, spec: str) -> Path:
    """The wheel for ``spec`` (name==version or name) in ``wheels``, downloaded when absent."""
    name, _sep, version = spec.partition("==")
    pattern = f"{name.replace('-', '_')}-{version or '*'}-*.whl"
    found = sorted(wheels.glob(pattern))
    if not found:
        _pip("download", spec, "--no-deps", "--only-binary=:all:", "-d", str(wheels))
        found = sorted(wheels.glob(pattern))
    if not found:
        raise Unavailable(f"pip download {spec} left no wheel named {pattern}")
    return found[-1]


def _nvidia_pins(wheel: Path) -> set:
    """nvidia-* requirements (name==version) from a wheel's METADATA, for this platform."""
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(meta).decode("utf-8", "replace")
    pins = set()
    for line in text.splitlines():
        match = re.match(r"Requires-Dist: (nvidia-[\w-]+)\s*\(?(==[\w.]+)?\)?", line)
        if match and "extra ==" not in line:
            pins.add(match.group(1) + (match.group(2) or ""))
    return pins


# --- building extensions -----------------------------------------------------------------------------

def overlay(env: Env, where: Path) -> Path:
    """A site-packages of our own holding the env's packages (symlinks) plus our extensions:
    the extension lives in the same environment as its torch, as pip would install it."""
    site = where / "lib" / f"python{PY}" / "site-packages"
    site.mkdir(parents=True)
    for entry in os.listdir(env.site):
        if entry.startswith(("torch", "nvidia", "functorch")):
            os.symlink(env.site / entry, site / entry)
    return site


def compiled_with_cxx11_abi(env: Env) -> bool:
    """The oracle for a torch's ABI: torch.compiled_with_cxx11_abi(), imported in a child."""
    proc = import_in(env.site, "import torch; print(torch.compiled_with_cxx11_abi())")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1] == "True"


def import_in(site: Path, code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
    env["PYTHONPATH"] = str(site)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, errors="replace",
                          env=env, timeout=300, cwd="/")


def build_module(name: str, headers_of: Env, cxx11: bool, dest: Path, source: str = MODULE) -> Path:
    """g++ with that torch's headers and ABI flag; -lc10 without RUNPATH, as cpp_extension links."""
    dest.mkdir(parents=True, exist_ok=True)
    src = dest / f"{name}.cpp"
    src.write_text(source.replace("NAME", name))
    out = dest / f"{name}{EXT_SUFFIX}"
    proc = subprocess.run(["g++", "-shared", "-fPIC", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={int(cxx11)}",
                           f"-I{headers_of.torch / 'include'}", f"-I{sysconfig.get_paths()['include']}",
                           str(src), "-o", str(out), f"-L{headers_of.torch / 'lib'}", "-Wl,--no-as-needed",
                           "-lc10"], capture_output=True, text=True, errors="replace", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    src.unlink()
    return out


def nm_c10_functions(env: Env) -> set:
    """c10 functions libc10 exports, by binutils (not seedance's reader), without std::string."""
    proc = subprocess.run(["nm", "-D", "--defined-only", str(env.torch / "lib" / "libc10.so")],
                          capture_output=True, text=True, errors="replace", check=True)
    names = set()
    for line in proc.stdout.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1] == "T" and fields[2].startswith("_ZN3c10") \
                and "__cxx11" not in fields[2] and "Ss" not in fields[2]:
            names.add(fields[2])
    return names


def cases(workdir: Path) -> list:
    """Build the corpus under workdir; raises Unavailable when a torch cannot be had."""
    if shutil.which("g++") is None or shutil.which("nm") is None:
        raise Unavailable("g++ and binutils' nm are needed to build and read the corpus")
    new, old = new_torch_env(), old_torch_env()
    abi = {old.label: compiled_with_cxx11_abi(old), new.label: compiled_with_cxx11_abi(new)}
    if abi[old.label] == abi[new.label]:
        raise Unavailable("both torches use the same C++ ABI; the corpus needs one of each")
    old_site, new_site = overlay(old, workdir / "env-old"), overlay(new, workdir / "env-new")
    old_env, new_env = Env(old.label, old_site), Env(new.label, new_site)
    found = [Case("healthy torch 2.4 install", "install", old, old.site, old.site)]
    for env_label, env, site in ((old.label, old_env, old_site), (new.label, new_env, new_site)):
        for headers in (old, new):
            name = f"ext_{'old' if headers is old else 'new'}_in_{'old' if env is old_env else 'new'}"
            build_module(name, headers, abi[headers.label], site / "acc_pkg")
            what = "matching" if headers.label == env_label else "built for the other torch"
            found.append(Case(f"extension {what}: {headers.label} headers, loaded by {env_label}",
                              "extension", env, site / "acc_pkg", site / "acc_pkg" / f"{name}{EXT_SUFFIX}",
                              module=f"acc_pkg.{name}"))
    # a c10 function that one torch has and the other lacks (same ABI question does not arise)
    only_new = sorted(nm_c10_functions(new) - nm_c10_functions(old))
    only_old = sorted(nm_c10_functions(old) - nm_c10_functions(new))
    for symbol, env, site, label in ((only_new[:1], old_env, old_site, "old"), (only_old[:1], new_env, new_site, "new")):
        if not symbol:
            continue
        name = f"calls_missing_in_{label}"
        build_module(name, env, abi[env.label], site / "acc_missing", MODULE_CALLING.replace("SYMBOL", symbol[0]))
        found.append(Case(f"extension calling {symbol[0]}, which {env.label} lacks", "extension", env,
                          site / "acc_missing", site / "acc_missing" / f"{name}{EXT_SUFFIX}",
                          module=f"acc_missing.{name}"))
    # the same extension checked from outside its environment, with --python naming the interpreter
    loose = workdir / "loose"
    build_module("ext_loose", old, abi[old.label], loose)
    found.append(Case(f"extension outside any environment, --python with {new.label}", "extension", new_env,
                      loose, loose / f"ext_loose{EXT_SUFFIX}", check_args=["--python", sys.executable],
                      module="ext_loose"))
    found.extend(_cache_cases(workdir, new, abi))
    return found


def _cache_cases(workdir: Path, new: Env, abi: dict) -> list:
    """Extension cache entries judged for the venv's torch (check --python)."""
    tag = _build_tag(new)
    root = workdir / "torch_extensions"
    made = []
    other_tag = "py310_cu121" if tag != "py310_cu121" else "py39_cu118"
    old = old_torch_env()
    for label, entry_tag, headers in (("another py/cu tag, built for the other torch", other_tag, old),
                                      ("this tag, built for the other torch", tag, old),
                                      ("this tag, built for this torch", tag, new)):
        name = f"cached_{len(made)}"
        build_dir = root / entry_tag / name
        build_module(name, headers, abi[headers.label], build_dir)
        os.rename(build_dir / f"{name}{EXT_SUFFIX}", build_dir / f"{name}.so")
        (build_dir / "build.ninja").write_text(
            f"cflags = -DTORCH_EXTENSION_NAME={name} -isystem {headers.torch}/include -fPIC -std=c++17\n"
            f"post_cflags = -D_GLIBCXX_USE_CXX11_ABI={int(abi[headers.label])}\n")
        made.append(Case(f"cache entry: {label}", "cache", new, root, build_dir,
                         check_args=["--python", sys.executable], build_name=name))
    return made


def _build_tag(env: Env) -> str:
    proc = import_in(env.site, "import os, torch.utils.cpp_extension as c;"
                               "print(os.path.basename(os.path.dirname(c._get_build_directory('x', False))))")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


# --- verdicts against reality ---------------------------------------------------------------------

def reality(case: Case) -> tuple:
    """(broken, how we know) from loading the thing for real."""
    if case.kind == "install":
        proc = import_in(case.env.site, "import torch, functorch._C; print(torch.__version__)")
        return proc.returncode != 0, "import torch, functorch._C: " + ("ok" if proc.returncode == 0 else _last(proc))
    if case.kind == "extension":
        site = case.subject.parent.parent if "." in case.module else case.subject.parent
        paths = f"{site}:{case.env.site}"
        proc = import_in(Path(paths), f"import torch, {case.module} as m; m.probe(); print('ok')")
        return proc.returncode != 0, f"import {case.module}: " + ("ok" if proc.returncode == 0 else _last(proc))
    # a cache entry is only loaded by the torch whose build directory it is
    root = case.target
    code = (f"import torch.utils.cpp_extension as c; print(c._get_build_directory({case.build_name!r}, False))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_") and k != "TORCH_EXTENSIONS_DIR"}
    env["XDG_CACHE_HOME"] = str(root.parent)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, errors="replace",
                          env=env, timeout=300)
    looked_up = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 else ""
    if os.path.realpath(looked_up) != os.path.realpath(case.subject):
        return False, f"cpp_extension looks in {looked_up}, never here"
    lib = case.subject / f"{case.build_name}.so"
    load = ("import importlib.util, sys, torch; spec = importlib.util.spec_from_file_location("
            f"{case.build_name!r}, {str(lib)!r}); m = importlib.util.module_from_spec(spec); "
            "spec.loader.exec_module(m); m.probe(); print('ok')")
    proc = import_in(case.env.site, load)
    return proc.returncode != 0, "load from its build directory: " + ("ok" if proc.returncode == 0 else _last(proc))


def _last(proc) -> str:
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else f"exit {proc.returncode}"


def evaluate(case: Case) -> dict:
    """One row: what seedance says, what really happens, and whether they agree."""
    return evaluate_all([case])[0]


def evaluate_all(corpus: list) -> list:
    """Rows for every case; one `seedance check` per set of options, as a user would run it
    over a tree (the verdicts are read per subject)."""
    groups: dict = {}
    for case in corpus:
        groups.setdefault((case.kind == "install", tuple(case.check_args)), []).append(case)
    reports = {}
    for (_install, args), members in groups.items():
        targets = sorted({str(c.target) for c in members})
        proc = run_cli("check", "--json", "--no-progress", *args, *targets, timeout=1800)
        assert proc.returncode in (0, 1), proc.stderr
        report = json.loads(proc.stdout)
        for case in members:
            reports[id(case)] = report
    return [_row(case, reports[id(case)]) for case in corpus]


def _row(case: Case, report: dict) -> dict:
    subject = os.path.realpath(case.subject)
    mine = [f for f in report["findings"] if os.path.realpath(f["subject"].get("path", "")) == subject
            or (case.kind == "install" and f["rule"] in ("cxx-abi-mismatch", "torch-symbol-missing"))]
    if case.kind == "cache":
        predicted = any(f["rule"] == "torch-ext-stale" for f in mine)
    else:
        predicted = any(f["severity"] in ("error", "fatal") for f in mine)
    broken, how = reality(case)
    all_errors = sum(1 for f in report["findings"] if f["severity"] in ("error", "fatal"))
    return {"case": case.name, "predicted_broken": predicted, "broken": broken, "how": how,
            "rules": sorted({f["rule"] for f in mine}), "errors_in_report": all_errors,
            "messages": [f["message"] for f in mine]}


# --- the test ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    try:
        corpus = cases(tmp_path_factory.mktemp("torch-accuracy"))
    except Unavailable as exc:
        pytest.skip(str(exc))
    return evaluate_all(corpus)


def table(rows) -> str:
    return "\n".join(f"{r['case']}: seedance {'BROKEN' if r['predicted_broken'] else 'ok'} {r['rules']}, "
                     f"really {'BROKEN' if r['broken'] else 'ok'} ({r['how']})" for r in rows)


def test_every_torch_verdict_matches_loading_it(rows):
    false_errors = [r for r in rows if r["predicted_broken"] and not r["broken"]]
    missed = [r for r in rows if r["broken"] and not r["predicted_broken"]]
    assert not false_errors and not missed, table(rows)
    # the corpus really holds both kinds: broken cases and healthy ones
    assert any(r["broken"] for r in rows) and any(not r["broken"] for r in rows), table(rows)


def test_stale_messages_name_two_different_versions(rows):
    stale = [m for r in rows if r["rules"] == ["torch-ext-stale"] for m in r["messages"]]
    assert stale, table(rows)
    for message in stale:
        versions = re.findall(r"torch (\d+\.\d+\.\d+[\w.+]*)", message)
        assert len(versions) == len(set(versions)) == 2, message


if __name__ == "__main__":  # print the table: python -m tests.accuracy.test_torch_accuracy
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        try:
            found = evaluate_all(cases(Path(work)))
        except Unavailable as exc:
            sys.exit(f"skipped: {exc}")
        print(table(found))
        print(f"{len(found)} cases, {sum(r['predicted_broken'] and not r['broken'] for r in found)} false errors, "
              f"{sum(r['broken'] and not r['predicted_broken'] for r in found)} missed")


def test_torch_lazy_nvrtc_library_is_not_loaded_by_import_torch():
    """The torch fact for the loader rules (issue 11, item 7): libcaffe2_nvrtc.so NEEDs the
    driver's libcuda.so.1, yet `import torch` never loads it; /proc/self/maps says so."""
    from seedance.collect.torch_ext import lazily_loaded_by_torch

    try:
        env = old_torch_env()
    except Unavailable as exc:
        pytest.skip(str(exc))
    lib = env.torch / "lib" / "libcaffe2_nvrtc.so"
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, errors="replace").stdout
    assert "[libcuda.so.1]" in needed
    proc = import_in(env.site, "import torch; print(open('/proc/self/maps').read())")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "libtorch_cuda.so" in proc.stdout and "libcaffe2_nvrtc" not in proc.stdout
    assert lazily_loaded_by_torch(str(lib), "libcuda.so.1")
    assert lazily_loaded_by_torch(str(lib), "libcublas.so.12") is None
