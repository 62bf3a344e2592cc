"""Kill tests for agent/collect/torch_ext.py and cxxabi.py (issue 17); python_env.py's are in
test_mutation_kills_collect_python.py.

Mutmut only counts a test that calls the mutated function in its own process, so every test
here calls seedance.collect.* in-process, on real objects built with gcc/g++ once per module
and on the torch wheel installed in the venv, and asserts the exact values a mutant changes.
The expected values come from outside seedance: the wheel's dist-info, its version.py run by
Python, torch's own torch/_appdirs.py (the root cpp_extension builds under), the folder rule
of cpp_extension._get_build_directory written here, binutils' nm -D and c++filt for symbols
and manglings, the _GLIBCXX_USE_CXX11_ABI flag each object was built with, and ld.so itself
(the objects dlopened with ctypes in a child).
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import process_fixtures as F  # noqa: E402

from seedance.collect import cxxabi, torch_ext  # noqa: E402
from seedance.model.errors import BadInput  # noqa: E402

PYTHON = sys.executable
GXX = __import__("shutil").which("g++")
pytestmark = pytest.mark.skipif(GXX is None or __import__("shutil").which("nm") is None
                                or __import__("shutil").which("c++filt") is None,
                                reason="needs gcc/g++ and binutils (nm, c++filt)")


def real_run(env, statement):
    """(exit status, last stderr line or '', stdout) of the real interpreter."""
    proc = subprocess.run([PYTHON, "-c", statement], capture_output=True, env=env, timeout=120,
                          stdin=subprocess.DEVNULL)
    err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
    return proc.returncode, (err[-1] if err and proc.returncode else ""), proc.stdout.decode("utf-8", "replace")


def nm(path, *flags):
    proc = subprocess.run(["nm", "-D", *flags, str(path)], capture_output=True, text=True, errors="replace",
                          check=True)
    return [line.split()[-1] for line in proc.stdout.splitlines() if line.split()]


def _script(path, body, mode=0o755):
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(mode)
    return str(path)


# --- torch_ext: the wheel's torch, read from outside seedance ------------------------------------------

def _demangled(names):
    proc = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True, text=True,
                          errors="replace", check=True)
    return proc.stdout.splitlines()


@pytest.fixture(scope="module")
def real_torch(tmp_path_factory):
    """The wheel's torch, from outside seedance and without importing it (3-8 s here): the
    version pip recorded in its dist-info, version.py run by Python, the C++ ABI c++filt reads
    in libc10's c10 exports, and the cache folders of torch's own code (torch/_appdirs.py,
    which cpp_extension.get_default_build_root() calls, loaded on its own)."""
    import importlib.util
    torch_dir = os.path.join(sysconfig.get_paths()["purelib"], "torch")
    if not os.path.isfile(os.path.join(torch_dir, "version.py")):
        pytest.skip("the torch wheel is not installed in this interpreter")
    dist = sorted(Path(torch_dir).parent.glob("torch-*.dist-info"))
    if not dist:
        pytest.skip("the torch wheel has no dist-info")
    version = next(line.split(":", 1)[1].strip() for line in (dist[0] / "METADATA").read_text().splitlines()
                   if line.startswith("Version:"))
    _, cuda, hip = _exec_version(torch_dir)
    c10 = [n for n in nm(os.path.join(torch_dir, "lib", "libc10.so"), "--defined-only") if n.startswith("_ZN3c10")]
    text = [d for d in _demangled(c10) if "basic_string<char" in d or "std::string" in d]
    new = sum("std::__cxx11::basic_string" in d for d in text)
    assert text and new in (0, len(text))  # one ABI or the other, never both, in c10's own names
    # cpp_extension._get_build_directory: py<major><minor><abiflags>_<rocmXY|cuXY|cpu>
    accelerator = f"rocm{hip.replace('.', '')}" if hip else f"cu{cuda.replace('.', '')}" if cuda else "cpu"
    spec = importlib.util.spec_from_file_location("sd17_torch_appdirs", os.path.join(torch_dir, "_appdirs.py"))
    appdirs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(appdirs)
    home = str(tmp_path_factory.mktemp("home"))
    saved = {k: os.environ.get(k) for k in ("HOME", "XDG_CACHE_HOME")}
    try:
        os.environ.update(HOME=home, XDG_CACHE_HOME=os.path.join(home, "xdg"))
        root_xdg = os.path.realpath(appdirs.user_cache_dir(appname="torch_extensions"))
        del os.environ["XDG_CACHE_HOME"]
        root_home = os.path.realpath(appdirs.user_cache_dir(appname="torch_extensions"))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {"dir": torch_dir, "version": version, "cuda": cuda, "hip": hip, "cxx11": new > 0, "home": home,
            "tag": f"py{sys.version_info[0]}{sys.version_info[1]}{getattr(sys, 'abiflags', '')}_{accelerator}",
            "root_xdg": root_xdg, "root_home": root_home}


@pytest.fixture(scope="module")
def install(real_torch):
    """A TorchInstall made from the oracle's values, not by seedance's reader."""
    return torch_ext.TorchInstall(path=real_torch["dir"], version=real_torch["version"], cuda=real_torch["cuda"],
                                  hip=real_torch["hip"], python_tag=real_torch["tag"].rsplit("_", 1)[0],
                                  source="the test's torch")


def _fake_torch(base, version_py, c_module=None, lib=True):
    torch_dir = Path(base) / "torch"
    torch_dir.mkdir(parents=True, exist_ok=True)
    if version_py is not None:
        (torch_dir / "version.py").write_text(version_py)
    if lib:
        (torch_dir / "lib").mkdir(exist_ok=True)
    if c_module:
        (torch_dir / c_module).write_bytes(b"")
    return str(torch_dir)


def _exec_version(torch_dir):
    namespace: dict = {}
    exec(Path(torch_dir, "version.py").read_text(), namespace)  # the oracle: Python runs version.py
    return namespace.get("__version__"), namespace.get("cuda"), namespace.get("hip")


def test_the_real_torch_as_cpp_extension_sees_it(real_torch, install):
    found = torch_ext.torch_at(real_torch["dir"], source="here")
    assert (found.path, found.version, found.cuda, found.hip, found.source) == \
        (real_torch["dir"], real_torch["version"], real_torch["cuda"], real_torch["hip"], "here")
    assert found.tag == real_torch["tag"] and found.python_tag == install.python_tag
    assert found.accelerator == real_torch["tag"].rsplit("_", 1)[1]
    assert found.describe() == f"torch {real_torch['version']} ({found.accelerator}, {found.python_tag})"
    assert torch_ext.read_torch_version(real_torch["dir"]) == _exec_version(real_torch["dir"])
    lib = os.path.join(real_torch["dir"], "lib")
    assert found.libs[:2] == [os.path.join(lib, "libc10.so"), os.path.join(lib, "libtorch_cpu.so")]
    assert all(os.path.isfile(p) for p in found.libs) and len(set(found.libs)) == len(found.libs)
    found.python_tag = "changed"
    assert torch_ext.torch_at(real_torch["dir"], source="here").python_tag == install.python_tag  # a copy
    beside = torch_ext.torch_beside(os.path.join(real_torch["dir"], "lib", "libc10.so"))
    assert (beside.path, beside.version, beside.source) == (real_torch["dir"], real_torch["version"], "beside it")
    interp = torch_ext.torch_for_python(PYTHON)
    assert (interp.path, interp.version, interp.cuda, interp.python_tag, interp.source) == \
        (real_torch["dir"], real_torch["version"], real_torch["cuda"], install.python_tag, f"--python {PYTHON}")


def test_cache_roots_are_where_cpp_extension_builds(real_torch, monkeypatch):
    home = real_torch["home"]
    ours = os.path.join(home, ".cache", "seedance", "torch-ext")
    assert torch_ext.cache_roots({"XDG_CACHE_HOME": os.path.join(home, "xdg")}, home=home) == \
        [real_torch["root_xdg"], ours]
    assert torch_ext.cache_roots({}, home=home) == [real_torch["root_home"], ours]
    assert torch_ext.cache_roots({"XDG_CACHE_HOME": "", "TORCH_EXTENSIONS_DIR": ""}, home=home) == \
        [real_torch["root_home"], ours]
    assert torch_ext.cache_roots({"TORCH_EXTENSIONS_DIR": "/srv/ext", "XDG_CACHE_HOME": "/x"}, home=home) == \
        ["/srv/ext", ours]
    monkeypatch.setenv("HOME", home)
    monkeypatch.setenv("XDG_CACHE_HOME", os.path.join(home, "xdg"))
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    assert torch_ext.cache_roots() == [real_torch["root_xdg"], ours]


@pytest.mark.parametrize("version_py, c_module, tag", [
    ("__version__ = '2.1.0+cu118'\ncuda = '11.8'\n", "_C.cpython-310-x86_64-linux-gnu.so", "py310_cu118"),
    ('from typing import Optional\n__version__ = "2.4.1"\ncuda: Optional[str] = "12.4"\nhip = None\n',
     "_C.cpython-313t-x86_64-linux-gnu.so", "py313t_cu124"),
    ("__version__ = '2.5.0+rocm6.2'\ncuda = None\nhip = '6.2.41133'\n", None, None),
    ("__version__ = '2.0.0'\ncuda = None\n", "_C.so", None),
    ("version = '1'\n", None, None),
])
def test_fake_torch_installs_read_as_python_runs_version_py(tmp_path, version_py, c_module, tag):
    torch_dir = _fake_torch(tmp_path / "site", version_py, c_module)
    version, cuda, hip = _exec_version(torch_dir)
    assert torch_ext.read_torch_version(torch_dir) == (version, cuda, hip)
    found = torch_ext.torch_at(torch_dir, source="s")
    if version is None:
        assert found is None
        return
    assert (found.path, found.version, found.cuda, found.hip, found.source) == (torch_dir, version, cuda, hip, "s")
    # cpp_extension._get_build_directory: rocm<hip without dots> > cu<cuda without dots> > cpu
    accelerator = f"rocm{hip.replace('.', '')}" if hip else f"cu{cuda.replace('.', '')}" if cuda else "cpu"
    assert found.accelerator == accelerator
    this = f"py{sys.version_info[0]}{sys.version_info[1]}{getattr(sys, 'abiflags', '')}"
    assert found.tag == (tag or f"{this}_{accelerator}")
    assert torch_ext.python_tag_of(torch_dir) == (tag.rsplit("_", 1)[0] if tag else None)
    ext = Path(torch_dir).parent / "pkg" / "sub" / "deeper" / "ext.so"
    ext.parent.mkdir(parents=True)
    ext.write_bytes(b"")
    beside = torch_ext.torch_beside(str(ext))
    assert (beside.path, beside.version, beside.source) == (torch_dir, version, "beside it")


def test_an_interpreter_without_torch_finds_none(tmp_path, monkeypatch):
    stdlib = [p for p in sys.path if p and "site-packages" not in p and os.path.isdir(p)]
    monkeypatch.setattr(sys, "path", stdlib)
    # find_spec answers from sys.modules first: a test earlier in the session may have imported torch
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert __import__("importlib.util").util.find_spec("torch") is None  # Python agrees: no torch
    assert torch_ext.find_torch() is None
    (tmp_path / "torch.py").write_text("")  # a plain module named torch: no package, no version.py
    monkeypatch.setattr(sys, "path", [str(tmp_path)] + stdlib)
    assert __import__("importlib.util").util.find_spec("torch").submodule_search_locations is None
    assert torch_ext.find_torch() is None


def test_torch_at_sees_version_py_change_and_missing_pieces(tmp_path):
    torch_dir = _fake_torch(tmp_path / "one", "__version__ = '1.0'\n")
    assert torch_ext.torch_at(torch_dir).version == "1.0"
    Path(torch_dir, "version.py").write_text("__version__ = '1.0.1'\ncuda = '12.1'\n")
    again = torch_ext.torch_at(torch_dir)
    assert (again.version, again.cuda) == _exec_version(torch_dir)[:2]
    assert torch_ext.torch_at(str(tmp_path / "nowhere")) is None
    assert torch_ext.read_torch_version(str(tmp_path / "nowhere")) == (None, None, None)
    assert torch_ext.python_tag_of(str(tmp_path / "nowhere")) is None
    no_lib = _fake_torch(tmp_path / "two", "__version__ = '1.0'\n", lib=False)
    no_version = _fake_torch(tmp_path / "three", None)
    for torch_dir in (no_lib, no_version):
        ext = Path(torch_dir).parent / "pkg" / "ext.so"
        ext.parent.mkdir(parents=True)
        assert torch_ext.torch_beside(str(ext)) is None
    assert torch_ext.torch_beside("/ext.so") is None


def test_torch_for_python_names_what_is_wrong(tmp_path, real_torch):
    this = f"py{sys.version_info[0]}{sys.version_info[1]}{getattr(sys, 'abiflags', '')}"
    fake_site = tmp_path / "fake-site"
    _fake_torch(fake_site, "__version__ = '9.9.9'\ncuda = '12.4'\n")
    (fake_site / "torch" / "__init__.py").write_text("")
    unreadable_site = tmp_path / "unreadable-site"
    _fake_torch(unreadable_site, None)
    (unreadable_site / "torch" / "__init__.py").write_text("")
    no_torch = _script(tmp_path / "py-no-torch", f'exec {PYTHON} -S "$@"')
    assert real_run(dict(os.environ), f"import subprocess, sys; sys.exit(subprocess.run([{no_torch!r}, '-c', "
                                      "'import torch']).returncode == 0)")[0] == 0
    fake = _script(tmp_path / "py-fake", f'PYTHONPATH={fake_site} exec {PYTHON} -S "$@"')
    found = torch_ext.torch_for_python(fake)
    assert (found.path, found.version, found.cuda, found.python_tag, found.source) == \
        (str(fake_site / "torch"), "9.9.9", "12.4", this, f"--python {fake}")
    (fake_site / "torch" / "_C.cpython-399-x86_64-linux-gnu.so").write_bytes(b"")
    assert torch_ext.torch_for_python(fake).python_tag == "py399"
    cases = [
        (str(tmp_path), "not an executable file"),
        (_script(tmp_path / "noexec", "true", 0o644), "not an executable file"),
        (_script(tmp_path / "garbage", "", 0o755), None),
        ("/bin/false", "not a Python interpreter (exit 1)"),
        (_script(tmp_path / "notjson", "echo hello"), "not a Python interpreter (exit 0)"),
        (_script(tmp_path / "nolines", "true"), "not a Python interpreter (exit 0)"),
        (_script(tmp_path / "list", "echo '[1]'"), "not a Python interpreter (exit 0)"),
        (_script(tmp_path / "py-unreadable", f'PYTHONPATH={unreadable_site} exec {PYTHON} -S "$@"'),
         f"{unreadable_site / 'torch'} has no readable torch/version.py"),
    ]
    Path(cases[2][0]).write_bytes(b"\x7fELF garbage, not a program")  # execve: ENOEXEC
    assert torch_ext.torch_for_python(no_torch) is None  # no torch: the environment is still checked
    for python, reason in cases:
        with pytest.raises(BadInput) as err:
            torch_ext.torch_for_python(python)
        assert str(err.value) == f"--python {python}: {reason or 'could not run it (OSError)'}"
    other = _other_python()
    if other is not None:  # another Python's tag, when torch/ holds no _C module to name one
        (fake_site / "torch" / "_C.cpython-399-x86_64-linux-gnu.so").unlink()
        wrapper = _script(tmp_path / "py-other", f'PYTHONPATH={fake_site} exec {other[0]} -S "$@"')
        assert torch_ext.torch_for_python(wrapper).python_tag == other[1]
    slow = _script(tmp_path / "slow", "exec sleep 30")
    with pytest.raises(BadInput) as err:
        torch_ext.torch_for_python(slow, timeout=0.3)
    assert str(err.value) == f"--python {slow}: could not run it (TimeoutExpired)"


def _other_python():
    """(path, its cpp_extension tag prefix) of an installed Python of another minor version, or None."""
    import glob
    import shutil
    for minor in (12, 10, 13, 9, 8, 14):
        if minor == sys.version_info[1]:
            continue
        # on PATH, or beside this interpreter's own installation (pyenv's versions/, /usr/bin)
        candidates = [shutil.which(f"python3.{minor}"), f"/usr/bin/python3.{minor}",
                      *glob.glob(os.path.join(os.path.dirname(sys.base_prefix), "*", "bin", f"python3.{minor}"))]
        exe = next((c for c in candidates if c and os.path.isfile(c) and os.access(c, os.X_OK)
                    and subprocess.run([c, "-c", ""], capture_output=True, timeout=60).returncode == 0), None)
        if exe is None:
            continue
        proc = subprocess.run([exe, "-c", "import sys; print('py%d%d%s' % (sys.version_info[0], sys.version_info[1], "
                                          "getattr(sys, 'abiflags', '')))"], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
        if proc.returncode == 0 and proc.stdout.strip():
            return exe, proc.stdout.strip().splitlines()[-1]
    return None


def test_lazily_loaded_libraries_of_torch(tmp_path):
    torch_dir = _fake_torch(tmp_path / "site", "__version__ = '2.4.0'\ncuda = '12.1'\n")
    nvrtc = os.path.join(torch_dir, "lib", "libcaffe2_nvrtc.so")
    Path(nvrtc).write_bytes(b"")
    # aten/src/ATen/cuda/detail/CUDAHooks.cpp: CUDAHooks::nvrtc() opens libcaffe2_nvrtc through
    # at::DynamicLibrary on first use, and that library NEEDs the driver's libcuda.so.1
    assert torch_ext.lazily_loaded_by_torch(nvrtc, "libcuda.so.1") == (
        "torch dlopens it only on the first NVRTC use on a GPU (CUDAHooks::nvrtc, ATen/cuda/detail/CUDAHooks.cpp), "
        "where the driver provides libcuda.so.1")
    assert torch_ext.lazily_loaded_by_torch(nvrtc, "libnvrtc.so.12") is None
    assert torch_ext.lazily_loaded_by_torch(os.path.join(torch_dir, "lib", "libc10_cuda.so"), "libcuda.so.1") is None
    outside = tmp_path / "elsewhere" / "lib" / "libcaffe2_nvrtc.so"
    outside.parent.mkdir(parents=True)
    assert torch_ext.lazily_loaded_by_torch(str(outside), "libcuda.so.1") is None
    fact = torch_ext.torch_not_found_fact("/x/ext.so", {"libtorch.so", "libc10.so"})
    assert (fact.kind, dict(fact.subject), dict(fact.data), fact.source) == \
        ("torch_env", {"path": "/x/ext.so"}, {"found": False, "needs": ["libc10.so", "libtorch.so"]},
         "collect.torch_ext")


# --- torch_ext: cached builds judged against the wheel's torch -------------------------------

GONE = "_ZN3c1017gone_in_new_torchEv"
GONE_TOO = "_ZN2at13also_gone_nowEv"
OLD_STRING = "_ZN3c1010set_stringERKSs"  # c10::set_string(std::string const&), old ABI


def _c_object(path, imports=(), weak=(), defines=(), links=()):
    """A shared object importing exactly ``imports`` (and ``weak`` weakly) through asm labels."""
    src = str(path) + ".c"
    lines = [f'extern void i{k}(void) __asm__("{s}");' for k, s in enumerate(imports)]
    lines += [f'extern void w{k}(void) __asm__("{s}") __attribute__((weak));' for k, s in enumerate(weak)]
    lines += [f'void d{k}(void) __asm__("{s}");\nvoid d{k}(void) {{}}' for k, s in enumerate(defines)]
    lines.append("void call(void) {" + "".join(f" i{k}();" for k in range(len(imports)))
                 + "".join(f" if (w{k}) w{k}();" for k in range(len(weak))) + " }")
    Path(src).write_text("\n".join(lines) + "\n")
    F.gcc("-shared", "-fPIC", src, "-o", str(path), *links)
    os.unlink(src)
    return str(path)


def _ninja(build_dir, torch_base, *flags, extra="", torch_in="cflags", **more):
    """build.ninja as cpp_extension writes it: ``flags`` in cflags, torch's include directories
    in ``torch_in``, and ``more`` (post_cflags, cuda_cflags, cuda_post_cflags) as given."""
    Path(build_dir).mkdir(parents=True, exist_ok=True)
    values = {"cflags": f"-DTORCH_EXTENSION_NAME={os.path.basename(build_dir)} {' '.join(flags)} -fPIC -std=c++17",
              "post_cflags": "", **more}
    values[torch_in] = f"-isystem {torch_base}/torch/include -isystem {torch_base}/torch/include/torch/csrc/api/" \
                       f"include {values.get(torch_in, '')}".strip()
    Path(build_dir, "build.ninja").write_text(
        "ninja_required_version = 1.3\ncxx = c++\n" + "".join(f"{k} = {v}\n" for k, v in values.items())
        + "ldflags = -shared -lc10 -ltorch\n" + extra)


@pytest.fixture(scope="module")
def torch_exports(real_torch):
    """Every name the wheel's torch libraries export, as binutils' nm lists them."""
    names = set()
    lib = os.path.join(real_torch["dir"], "lib")
    for name in os.listdir(lib):
        if name.startswith(("libc10", "libtorch")) and name.endswith(".so"):
            names.update(nm(os.path.join(lib, name), "--defined-only"))
    return names


@pytest.fixture(scope="module")
def cache(tmp_path_factory, real_torch):
    """A torch_extensions root: a build of this tag against an older torch with the old ABI
    flag, one of another tag, one against a torch that is gone, one against this torch that
    imports a symbol it lacks, one whose .so is not ELF, and clutter that is no build."""
    tmp = tmp_path_factory.mktemp("torch-cache")
    old = tmp / "old-env" / "site-packages"
    _fake_torch(old, "__version__ = '2.1.0+cpu'\ncuda = None\n")
    root = tmp / "torch_extensions"
    tag = real_torch["tag"]
    stale = root / tag / "stale3"
    _ninja(stale, old, "-isystem /usr/include/python3.10", post_cflags="-D_GLIBCXX_USE_CXX11_ABI=0")
    _c_object(stale / "stale3.so", imports=[GONE, GONE_TOO], weak=["_ZN3c1013weakly_neededEv"])
    other = root / "py39_cu117" / "other"
    _ninja(other, old, "-isystem /usr/include/python3.9")
    _c_object(other / "other.so", imports=[GONE])
    gone = root / "gonetorch"
    _ninja(gone, tmp / "removed-env", torch_in="cuda_cflags", cuda_cflags="-isystem /usr/include/python3.10",
           cuda_post_cflags="-D_GLIBCXX_USE_CXX11_ABI=1")
    _c_object(gone / "gonetorch.so", imports=[GONE])
    here = root / "here"
    _ninja(here, os.path.dirname(real_torch["dir"]), torch_in="post_cflags", extra="rule compile\n  command = c++ $cflags\n"
           "build here.o: compile here.cpp\n  cflags = -DSCOPED=1\n# comment = no\n\tdepfile = x\n")
    _c_object(here / "here.so", imports=[GONE])
    libabi = root / "libabi"  # no ABI flag in build.ninja: the .so's own imports say which
    _ninja(libabi, os.path.dirname(real_torch["dir"]), torch_in="cuda_cflags")
    _c_object(libabi / "libabi.so", imports=[OLD_STRING])
    broken = root / tag / "broken"
    broken.mkdir(parents=True)
    (broken / "broken.so").write_bytes(b"not an ELF file at all" * 4)
    (root / tag / "empty").mkdir()  # neither build.ninja nor a .so: not a build
    (root / "afile").write_text("")
    os.symlink(here, root / "link-to-here")  # a link is not followed (cpp_extension makes none)
    anyso = root / "anyso"
    anyso.mkdir()
    _c_object(anyso / "zz.so")
    _c_object(anyso / "aa.so")
    return {"root": str(root), "old": str(old / "torch"), "removed": str(tmp / "removed-env" / "torch"),
            "stale": str(stale), "other": str(other), "gone": str(gone), "here": str(here), "broken": str(broken),
            "anyso": str(anyso), "libabi": str(libabi)}


def test_inventory_reads_ninja_as_ninja_does(cache, real_torch):
    builds = torch_ext.inventory([cache["root"], cache["root"] + "-absent"])
    by_name = {b.name: b for b in builds}
    assert sorted(by_name) == ["anyso", "broken", "gonetorch", "here", "libabi", "other", "stale3"]
    tag = real_torch["tag"]
    assert [(b.path, b.tag, b.kind) for b in sorted(builds, key=lambda b: b.path)] == sorted(
        [(cache["anyso"], None, "load"), (cache["broken"], tag, "load"), (cache["gone"], None, "load"),
         (cache["here"], None, "load"), (cache["libabi"], None, "load"), (cache["other"], "py39_cu117", "load"),
         (cache["stale"], tag, "load")])
    # ninja's top-level `name = value` bindings only (rule and build blocks bind indented names)
    here = Path(cache["here"], "build.ninja").read_text().splitlines()
    top = dict(line.split(" = ", 1) for line in here if " = " in line and line[0] not in " \t#")
    assert by_name["here"].ninja == {k.strip(): v.strip() for k, v in top.items()}
    assert "depfile" not in by_name["here"].ninja and "command" not in by_name["here"].ninja
    assert by_name["here"].library == os.path.join(cache["here"], "here.so")
    assert by_name["anyso"].library == os.path.join(cache["anyso"], "aa.so") and by_name["anyso"].ninja == {}
    assert by_name["broken"].library == os.path.join(cache["broken"], "broken.so")
    assert torch_ext.builds_in(cache["stale"])[0].tag == tag
    assert torch_ext.builds_in(cache["here"])[0].tag is None
    assert sorted(b.name for b in torch_ext.builds_in(os.path.join(cache["root"], tag))) == ["broken", "stale3"]
    assert sorted(b.name for b in torch_ext.builds_in(cache["root"])) == ["gonetorch", "here", "libabi", "other",
                                                                          "stale3"]


def _facts_by_name(facts):
    return {f.data["name"]: f for f in facts}


def test_build_facts_against_the_wheels_torch(cache, real_torch, install, torch_exports):
    V, P = real_torch["version"], real_torch["dir"]
    abi = "cxx11" if real_torch["cxx11"] else "pre-cxx11"
    assert abi == "cxx11"  # torch 2.7+ wheels; the stale build below is the old ABI
    facts = _facts_by_name(torch_ext.torch_ext_facts([cache["root"]], torch=install))
    assert all((f.kind, f.source) == ("torch_ext_cache", "collect.torch_ext") for f in facts.values())
    now = {"torch": V, "torch_path": P, "python": install.python_tag,
           "accelerator": real_torch["tag"].rsplit("_", 1)[1], "source": "the test's torch"}
    stale_lib = os.path.join(cache["stale"], "stale3.so")
    undefined = [n for n in nm(stale_lib, "--undefined-only") if n.startswith(cxxabi.TORCH_PREFIXES)]
    strong = [n for n in undefined if n != "_ZN3c1013weakly_neededEv"]
    missing = sorted(n for n in strong if n not in torch_exports)
    assert missing == sorted([GONE, GONE_TOO])
    fact = facts["stale3"]
    assert dict(fact.subject) == {"path": cache["stale"]}
    assert fact.data["reasons"][0] == f"torch: built against 2.1.0+cpu, loaded by {V}"
    assert fact.data["reasons"][1].startswith(f"torch: imports {len(missing)} c10/at/torch symbol(s) torch {V} "
                                              "does not define, e.g. ")
    assert fact.data["reasons"][1].rsplit(", e.g. ", 1)[1] in missing
    assert dict(fact.data) == {
        "name": "stale3", "stale": True,
        "reasons": fact.data["reasons"][:2] + [f"abi: built pre-cxx11, torch {V} uses {abi}"],
        "other_environment": "", "built_for": "torch 2.1.0+cpu, the pre-cxx11 C++ ABI",
        "current": f"torch {V}, the {abi} C++ ABI (the test's torch)", "library": stale_lib,
        "built": {"python": install.python_tag, "accelerator": "cpu", "torch_path": cache["old"], "torch": "2.1.0+cpu",
                  "abi": "pre-cxx11"},
        "now": dict(now, abi=abi, missing=len(missing)), "kind": "load",
        "fix_command": "seedance fix torch-ext --clean-cache --rebuild stale3"}

    fact = facts["other"]
    other_env = f"built for py39_cu117; torch {V} ({now['accelerator']}, {install.python_tag}) uses " \
                f"{real_torch['tag']}/ and never loads it"
    assert dict(fact.data) == {
        "name": "other", "stale": False, "reasons": [], "other_environment": other_env,
        "built_for": "another build of torch (imports ? symbol(s) this one lacks)",
        "current": f"torch {V} at {P} (the test's torch)", "library": os.path.join(cache["other"], "other.so"),
        "built": {"python": "py39", "accelerator": "cu117", "torch_path": cache["old"], "torch": "2.1.0+cpu"},
        "now": now, "kind": "load", "fix_command": "seedance fix torch-ext --clean-cache --rebuild other"}

    fact = facts["gonetorch"]
    assert dict(fact.data) == {
        "name": "gonetorch", "stale": True,
        "reasons": [f"torch: the torch it was built against ({cache['removed']}) no longer exists",
                    f"torch: imports 1 c10/at/torch symbol(s) torch {V} does not define, e.g. {GONE}"],
        "other_environment": "", "built_for": f"the torch at {cache['removed']} (gone)",
        "current": f"torch {V} at {P} (the test's torch)", "library": os.path.join(cache["gone"], "gonetorch.so"),
        "built": {"python": "py310", "torch_path": cache["removed"], "torch": None, "abi": "cxx11"},
        "now": dict(now, abi=abi, missing=1), "kind": "load",
        "fix_command": "seedance fix torch-ext --clean-cache --rebuild gonetorch"}

    fact = facts["here"]
    assert dict(fact.data) == {
        "name": "here", "stale": True,
        "reasons": [f"torch: imports 1 c10/at/torch symbol(s) torch {V} does not define, e.g. {GONE}"],
        "other_environment": "", "built_for": "another build of torch (imports 1 symbol(s) this one lacks)",
        "current": f"torch {V} at {P} (the test's torch)", "library": os.path.join(cache["here"], "here.so"),
        "built": {"torch_path": P, "torch": V}, "now": dict(now, abi=abi, missing=1), "kind": "load",
        "fix_command": "seedance fix torch-ext --clean-cache --rebuild here"}

    demangled = _demangled([OLD_STRING])[0]
    assert _old_string_in(demangled)  # c++filt: the old ABI's string
    fact = facts["libabi"]
    assert dict(fact.data) == {
        "name": "libabi", "stale": True,
        "reasons": [f"torch: imports 1 c10/at/torch symbol(s) torch {V} does not define, e.g. {OLD_STRING}",
                    f"abi: built pre-cxx11, torch {V} uses {abi}"],
        "other_environment": "", "built_for": "the pre-cxx11 C++ ABI", "current": f"the {abi} C++ ABI (the test's torch)",
        "library": os.path.join(cache["libabi"], "libabi.so"), "built": {"torch_path": P, "torch": V, "abi": "pre-cxx11"},
        "now": dict(now, abi=abi, missing=1), "kind": "load",
        "fix_command": "seedance fix torch-ext --clean-cache --rebuild libabi"}

    # a torch with no source named (fix torch-ext passes one so): nothing in parentheses
    here, = torch_ext.builds_in(cache["here"])
    assert torch_ext.build_facts(here, install._replace(source=""), None).data["current"] == \
        f"torch {V} at {P}"

    fact = facts["broken"]
    assert fact.data["stale"] is True and len(fact.data["reasons"]) == 1
    assert fact.data["reasons"][0].startswith("built library unreadable: ")
    assert fact.data["built"] == {"python": install.python_tag, "accelerator": now["accelerator"]}


def test_each_build_is_judged_by_the_torch_that_loads_it(cache, real_torch):
    """No torch given: the torch build.ninja names, still there, else this interpreter's."""
    V = real_torch["version"]
    builds = torch_ext.builds_in(cache["here"]) + torch_ext.builds_in(cache["gone"]) + \
        torch_ext.builds_in(cache["stale"]) + torch_ext.builds_in(cache["libabi"])
    facts = _facts_by_name(torch_ext.torch_ext_facts(builds=builds))
    # torch's include directory in post_cflags (here) or cuda_cflags (libabi), where it still is
    assert facts["here"].data["now"]["source"] == "the torch it was built against"
    assert facts["libabi"].data["now"]["source"] == "the torch it was built against"
    assert facts["here"].data["now"]["torch_path"] == real_torch["dir"]
    assert facts["gonetorch"].data["now"]["source"] == "this interpreter"
    assert facts["gonetorch"].data["now"]["torch"] == V
    # the stale build names an older torch that is still on disk (a version.py and an empty lib/):
    # judged by it, and it defines none of the imports
    assert facts["stale3"].data["now"]["torch"] == "2.1.0+cpu" and facts["stale3"].data["now"]["torch_path"] == \
        cache["old"]
    first = next(n for n in nm(os.path.join(cache["stale"], "stale3.so"), "--undefined-only") if n in (GONE, GONE_TOO))
    assert facts["stale3"].data["reasons"] == [
        f"torch: imports 2 c10/at/torch symbol(s) torch 2.1.0+cpu does not define, e.g. {first}"]
    assert facts["stale3"].data["stale"] is True and facts["stale3"].data["now"]["missing"] == 2
    assert torch_ext.torch_ext_facts(builds=[]) == [] and torch_ext.torch_ext_facts([cache["root"] + "-none"]) == []


def test_build_facts_without_any_torch(cache):
    build, = torch_ext.builds_in(cache["stale"])
    fact = torch_ext.build_facts(build, None, None)
    assert fact.data["built_for"] == f"torch 2.1.0+cpu cpu {build.tag.rsplit('_', 1)[0]} pre-cxx11"
    assert (fact.data["current"], fact.data["now"], fact.data["stale"], fact.data["reasons"]) == \
        ("no torch found", {}, False, [])
    build, = torch_ext.builds_in(cache["gone"])
    assert torch_ext.build_facts(build, None, None).data["built_for"] == f"torch at {cache['removed']} py310 cxx11"
    bare = torch_ext.CachedBuild(path="/nowhere", name="bare", tag=None)
    assert torch_ext.build_facts(bare, None, None).data["built_for"] == "unknown"


def test_a_setup_py_build_is_found_from_its_project(tmp_path, install):
    project = tmp_path / "proj"
    temp = project / "build" / "temp.linux-x86_64-cpython-311"
    _ninja(temp, os.path.dirname(install.path))
    ninja = (temp / "build.ninja").read_text().replace("-DTORCH_EXTENSION_NAME=temp.linux-x86_64-cpython-311", "")
    (temp / "build.ninja").write_text(ninja + "cuda_cflags = -DTORCH_EXTENSION_NAME=fancy_ops -O2\n")
    libdir = project / "build" / "lib.linux-x86_64-cpython-311" / "pkg"
    libdir.mkdir(parents=True)
    _c_object(libdir / "fancy_opsx.cpython-311-x86_64-linux-gnu.so")  # another name: not it
    _c_object(libdir / "fancy_ops.cpython-311-x86_64-linux-gnu.so", imports=[GONE])
    (project / "pyproject.toml").write_text("")
    build, = torch_ext.builds_in(str(project))
    assert (build.name, build.kind, build.library, build.tag) == \
        ("fancy_ops", "setup.py", str(libdir / "fancy_ops.cpython-311-x86_64-linux-gnu.so"), None)
    fact = torch_ext.build_facts(build, None, None)
    assert fact.data["fix_command"] == \
        f"python -m pip install --no-build-isolation --no-deps --force-reinstall {project}"
    assert fact.data["kind"] == "setup.py" and fact.data["name"] == "fancy_ops"
    named = tmp_path / "named" / "build" / "temp.y"
    named.mkdir(parents=True)
    (named / "build.ninja").write_text("cflags = -DTORCH_EXTENSION_NAME=plain_ops -fPIC\npost_cflags =\n")
    build, = torch_ext.builds_in(str(tmp_path / "named"))
    assert (build.name, build.kind, build.library) == ("plain_ops", "setup.py", None)
    nolib = tmp_path / "nolib" / "build" / "temp.x"
    nolib.mkdir(parents=True)
    (nolib / "build.ninja").write_text("cflags = -fPIC\n")
    build, = torch_ext.builds_in(str(tmp_path / "nolib"))
    assert (build.name, build.kind, build.library) == ("temp.x", "setup.py", None)
    assert torch_ext.build_facts(build, None, None).data["fix_command"] == (
        f"rebuild temp.x from its sources against the torch that imports it (no setup.py or pyproject.toml "
        f"found above it)")


def test_rebuild_commands_per_place(tmp_path, monkeypatch, install):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    tagged = tmp_path / "cache" / "py311_cu121" / "kernels" / "kernels.so"
    assert torch_ext.rebuild_command(str(tagged), None) == "seedance fix torch-ext --clean-cache --rebuild kernels"
    top = tmp_path / "cache" / "py311_cu121"
    assert torch_ext.rebuild_command(str(top), None) == "seedance fix torch-ext --clean-cache --rebuild py311_cu121"
    site = tmp_path / "lib" / "site-packages" / "pkg"
    site.mkdir(parents=True)
    (site.parent / "setup.py").write_text("")  # above site-packages: not a project of the file
    label = torch_ext.rebuild_command(str(site / "_C.so"), install, name="mine")
    assert label == f"rebuild mine from its sources against torch {install.version} (no setup.py or " \
                    "pyproject.toml found above it)"
    assert torch_ext.rebuild_command(str(site / "_C.so"), None).startswith("rebuild _C.so from its sources against "
                                                                           "the torch that imports it")
    outside = tmp_path / "elsewhere" / "py311_cpu" / "kernels"
    outside.mkdir(parents=True)
    (outside / "build.ninja").write_text("cflags = -fPIC\n")
    assert torch_ext.rebuild_command(str(outside / "kernels.so"), None) == \
        f"TORCH_EXTENSIONS_DIR={outside.parent} seedance fix torch-ext --clean-cache --rebuild kernels"
    deep = tmp_path / "p" / "a" / "b" / "c" / "d"
    deep.mkdir(parents=True)
    (tmp_path / "p" / "setup.py").write_text("")
    assert torch_ext.rebuild_command(str(deep / "x.so"), install._replace(source="--python /v/python")) \
        == f"cd {tmp_path / 'p'} && /v/python setup.py build_ext --inplace --force"


# --- cxxabi: mangled names against c++filt, extensions against ld.so -------------------------

MANGLING_SOURCE = """
#include <string>
#include <vector>
#include <map>
namespace c10 {
struct isSsl { isSsl(const std::string&); ~isSsl(); void f(int) const; static void s(std::vector<std::string>); };
isSsl::isSsl(const std::string&) {}
isSsl::~isSsl() {}
void isSsl::f(int) const {}
void isSsl::s(std::vector<std::string>) {}
template <int N> void lit(const std::string&) {}
template void lit<5>(const std::string&);
template <int N> void lit2(int) {}
template void lit2<-7>(int);
template <char C> void chr(long) {}
template void chr<'S'>(long);
template <class T> void tp(T, const std::string&) {}
template void tp<long>(long, const std::string&);
template <class T, class U> void tpu(T, U) {}
template void tpu<std::string, int>(std::string, int);
template void tpu<int, std::map<int, std::string>>(int, std::map<int, std::string>);
void two(const std::string&, const std::string&) {}
template <int N> void byval(std::string) {}
template void byval<5>(std::string);
template <long N> void lng(std::string, int) {}
template void lng<123456789>(std::string, int);
void plain(int, char) {}
void Ss_in_name_SsX(int) {}
void S12345(double) {}
namespace Ssx { void Ss(unsigned) {} }
void viaptr(void (*)(const std::string&)) {}
std::string ret(int) { return {}; }
bool operator==(const isSsl&, const std::string&) { return true; }
}
"""


@pytest.fixture(scope="module")
def mangled(tmp_path_factory):
    """Every c10 name g++ mangles from one source, built with each _GLIBCXX_USE_CXX11_ABI, and
    what c++filt makes of it."""
    tmp = tmp_path_factory.mktemp("mangling")
    (tmp / "m.cpp").write_text(MANGLING_SOURCE)
    out = {}
    for flag in ("0", "1"):
        lib = tmp / f"m{flag}.so"
        subprocess.run([GXX, "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={flag}", str(tmp / "m.cpp"),
                        "-o", str(lib)], check=True, capture_output=True)
        names = sorted({n for n in nm(lib, "--defined-only") if n.startswith("_ZN3c10")})
        out[flag] = (str(lib), dict(zip(names, _demangled(names))))
    return out


def _old_string_in(demangled: str) -> bool:
    """c++filt spells the old-ABI string std::string (the abbreviation Ss) and the new one
    std::__cxx11::basic_string<...>."""
    return "std::string" in demangled.replace("std::__cxx11::basic_string", "") or (
        "std::basic_string<char" in demangled and "__cxx11" not in demangled)


def test_string_mangling_of_every_name_gxx_makes(mangled):
    for flag, (_lib, names) in mangled.items():
        assert len(names) >= 15
        for name, demangled in names.items():
            assert cxxabi.uses_old_string(name) is _old_string_in(demangled), (flag, name, demangled)
            assert cxxabi.uses_new_string(name) is ("std::__cxx11::" in demangled), (flag, name, demangled)
    olds = [n for n, d in mangled["0"][1].items() if _old_string_in(d)]
    news = [n for n, d in mangled["1"][1].items() if "std::__cxx11::" in d]
    assert olds and news
    assert cxxabi.abi_of(olds + ["printf", "_Z3barv"]) == ("pre-cxx11", olds[0])
    assert cxxabi.abi_of(["_Z3barv"] + news) == ("cxx11", news[0])
    assert cxxabi.abi_of(olds[:2] + news[:1]) == ("pre-cxx11", olds[0])
    assert cxxabi.abi_of(news[:2] + olds[:1]) == ("cxx11", news[0])
    assert cxxabi.abi_of(["plain", "_Z3barv"]) == (None, None) and cxxabi.abi_of([]) == (None, None)
    # torch's own ABI only counts c10/at/torch/caffe2 names
    assert cxxabi.torch_abi_of(["_ZN5other1fERKSs"] * 3 + news[:1]) == ("cxx11", news[0])
    assert cxxabi.torch_abi_of(["_ZN5other1fERKSs"]) == (None, None)
    libs = {flag: lib for flag, (lib, _names) in mangled.items()}
    assert cxxabi.TorchAbiCache().abi(libs["0"]) == "pre-cxx11"
    assert cxxabi.TorchAbiCache().abi(libs["1"]) == "cxx11"


@pytest.mark.parametrize("name", ["_ZN3c10L1xE", "_ZN3c106detail14torchCheckFailEPKcS2_jRKSs", "_ZN3c105isSsl1fEv",
                                  "_ZN3c101fIS_EEvv", "_ZN3c103SsxL2SsE"])
def test_hand_written_manglings_as_cxxfilt_reads_them(name):
    demangled = _demangled([name])[0]
    assert demangled != name  # a name c++filt reads
    assert cxxabi.uses_old_string(name) is _old_string_in(demangled), demangled


@pytest.fixture(scope="module")
def extensions(tmp_path_factory, real_torch, torch_exports):
    """Extensions of a project, each importing c10 names through asm labels (no torch headers):
    `old` the old-ABI spelling of a function libc10 exports with the new one, plus one name torch
    lacks; `new` only a new-ABI c10 function libc10 exports; `plain` no torch name; `helped` a name
    that a library linking libc10 defines.  The oracle for what binds is ld.so (ctypes in a child)."""
    tmp = tmp_path_factory.mktemp("ext-project")
    lib = os.path.join(real_torch["dir"], "lib")
    c10 = os.path.join(lib, "libc10.so")
    # a c10 function libc10 exports whose last parameter is a new-ABI std::string
    new_fn = next((n for n in sorted(nm(c10, "--defined-only")) if n.startswith("_ZN3c10") and
                   n.endswith("NSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE")), None)
    if new_fn is None:
        pytest.skip("libc10 exports no c10 function taking a new-ABI std::string (a pre-cxx11 torch)")
    old_fn = new_fn.replace("NSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE", "Ss")
    assert old_fn != new_fn and old_fn not in torch_exports
    (tmp / "setup.py").write_text("")
    pkg = tmp / "pkg"
    pkg.mkdir()
    links = (f"-L{lib}", "-Wl,--no-as-needed", "-lc10", "-Wl,--as-needed")
    out = {"c10": c10, "lib": lib, "project": str(tmp), "new_fn": new_fn, "old_fn": old_fn}
    out["old"] = _c_object(pkg / "old.so", imports=[old_fn, GONE], weak=["_ZN3c1013weakly_neededERKSs"], links=links)
    out["new"] = _c_object(pkg / "new.so", imports=[new_fn], links=links)
    out["newgone"] = _c_object(pkg / "newgone.so", imports=[new_fn, GONE], links=links)
    out["plain"] = _c_object(pkg / "plain.so", imports=["puts"])
    out["helper"] = _c_object(tmp / "libhelper.so", defines=[GONE], links=("-Wl,-soname,libhelper.so", *links))
    # a torch library of the closure in another directory (sorting before torch's own lib/)
    elsewhere = tmp / "aaa" / "lib"
    elsewhere.mkdir(parents=True)
    out["elsewhere"] = _c_object(elsewhere / "libtorch_extra.so")
    out["helped"] = _c_object(pkg / "helped.so", imports=[GONE],
                              links=(f"-L{tmp}", f"-Wl,-rpath,{tmp}", "-lhelper", *links))
    return out


def _dlopen_error(*paths):
    """ld.so's verdict: each path dlopened in order with RTLD_NOW | RTLD_GLOBAL in a child."""
    code = ("import ctypes, sys\ntry:\n    [ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL) for p in sys.argv[1:]]\n"
            "    print('ok')\nexcept OSError as exc:\n    print(exc)\n")
    proc = subprocess.run([PYTHON, "-c", code, *paths], capture_output=True, text=True, errors="replace",
                          env=dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(paths[0])), timeout=60)
    return proc.stdout.strip()


def _closure(extensions, *extra):
    from seedance.elf.reader import read_elf
    paths = [extensions["c10"], *extra]
    return {p: read_elf(p) for p in paths}  # without symbols: missing() asks read_symbols for them


def _read_symbols(path):
    from seedance.elf.reader import read_elf
    return read_elf(path, symbols=True)


def test_an_old_abi_extension_against_the_wheels_torch(extensions, real_torch, torch_exports):
    V = real_torch["version"]
    old = extensions["old"]
    error = _dlopen_error(extensions["c10"], old)
    assert "undefined symbol: " in error  # ld.so refuses it
    strong = [n for n in nm(old, "--undefined-only") if n.startswith(cxxabi.TORCH_PREFIXES)
              and n != "_ZN3c1013weakly_neededERKSs"]
    missing = sorted(n for n in strong if n not in torch_exports)
    assert error.rsplit("undefined symbol: ", 1)[1] in missing and len(missing) == 2
    torch_paths = [os.path.join(extensions["lib"], "libtorch_cpu.so"), extensions["c10"]]
    closure = _closure(extensions, old, torch_paths[0])
    facts = cxxabi.extension_facts(old, closure, torch_paths, cxxabi.TorchAbiCache(), _read_symbols, "src")
    fix = f"cd {extensions['project']} && python setup.py build_ext --inplace --force"
    assert [(f.kind, dict(f.subject), f.source) for f in facts] == \
        [("cxx_abi", {"path": old}, "collect.cxxabi"), ("torch_symbols", {"path": old}, "collect.cxxabi")]
    assert dict(facts[0].data) == {"ext_abi": "pre-cxx11", "torch_abi": "cxx11" if real_torch["cxx11"] else "pre-cxx11",
                                   "torch_path": extensions["c10"], "example_symbol": extensions["old_fn"],
                                   "torch_version": V, "torch_source": "src", "fix_command": fix}
    assert dict(facts[1].data) == {"count": 2, "examples": missing, "torch_version": V,
                                   "torch_path": real_torch["dir"], "torch_source": "src", "explained_by_abi": True,
                                   "fix_command": fix}
    # torch is where libc10 lives, whatever other torch-named library the closure holds, in
    # either order (which one sorts first depends on where the checkout and /tmp are)
    for order in ([extensions["elsewhere"], extensions["c10"]], [extensions["c10"], extensions["elsewhere"]]):
        again = cxxabi.extension_facts(old, closure, order, cxxabi.TorchAbiCache(), _read_symbols, "src")
        assert [(f.data["torch_version"], f.data.get("torch_path")) for f in again] == \
            [(V, extensions["c10"]), (V, real_torch["dir"])], order


def test_a_new_abi_extension_that_binds(extensions, real_torch):
    new = extensions["new"]
    assert _dlopen_error(extensions["c10"], new) == "ok"
    facts = cxxabi.extension_facts(new, _closure(extensions, new), [extensions["c10"]], cxxabi.TorchAbiCache(),
                                   _read_symbols)
    assert [f.kind for f in facts] == ["cxx_abi"]
    assert dict(facts[0].data) == {"ext_abi": "cxx11", "torch_abi": "cxx11", "torch_path": extensions["c10"],
                                   "example_symbol": extensions["new_fn"], "torch_version": real_torch["version"],
                                   "torch_source": "", "fix_command": ""}


def test_a_new_abi_extension_that_lacks_a_symbol(extensions, real_torch):
    newgone = extensions["newgone"]
    assert _dlopen_error(extensions["c10"], newgone).endswith(f"undefined symbol: {GONE}")
    facts = cxxabi.extension_facts(newgone, _closure(extensions, newgone), [extensions["c10"]],
                                   cxxabi.TorchAbiCache(), _read_symbols, "s")
    fix = f"cd {extensions['project']} && python setup.py build_ext --inplace --force"
    assert [(f.kind, f.data["fix_command"]) for f in facts] == [("cxx_abi", fix), ("torch_symbols", fix)]
    assert (facts[0].data["ext_abi"], facts[0].data["torch_abi"]) == ("cxx11", "cxx11")
    assert dict(facts[1].data) == {"count": 1, "examples": [GONE], "torch_version": real_torch["version"],
                                   "torch_path": real_torch["dir"], "torch_source": "s", "explained_by_abi": False,
                                   "fix_command": fix}
    # judged for check --python: the rebuild runs with that interpreter
    named = cxxabi.extension_facts(newgone, _closure(extensions, newgone), [extensions["c10"]],
                                   cxxabi.TorchAbiCache(), _read_symbols, "--python /opt/py/bin/python")
    assert [f.data["fix_command"] for f in named] == \
        [f"cd {extensions['project']} && /opt/py/bin/python setup.py build_ext --inplace --force"] * 2


def test_a_torch_library_outside_any_torch_install(extensions, mangled):
    """A libc10 whose directory is not inside a torch install (no version.py above it): the
    version is unknown, the verdict still stands (ld.so: new_fn is not in that library)."""
    lib = mangled["1"][0]
    assert extensions["new_fn"] not in nm(lib, "--defined-only")
    new = extensions["new"]
    closure = {lib: _read_symbols(lib), new: _read_symbols(new)}
    facts = cxxabi.extension_facts(new, closure, [lib], cxxabi.TorchAbiCache(), _read_symbols)
    fix = f"cd {extensions['project']} && python setup.py build_ext --inplace --force"
    assert [(f.kind, f.data["torch_version"], f.data["fix_command"]) for f in facts] == \
        [("cxx_abi", "?", fix), ("torch_symbols", "?", fix)]
    assert facts[1].data["torch_path"] == os.path.dirname(os.path.dirname(lib))
    assert facts[1].data["examples"] == [extensions["new_fn"]]


def test_a_symbol_defined_by_a_library_that_links_torch(extensions):
    helped, helper = extensions["helped"], extensions["helper"]
    assert _dlopen_error(extensions["c10"], helper, helped) == "ok"
    closure = _closure(extensions, helped, helper)
    assert cxxabi.extension_facts(helped, closure, [extensions["c10"]], cxxabi.TorchAbiCache(), _read_symbols) == []
    cache = cxxabi.TorchAbiCache()
    assert cache.missing([GONE, "_ZN3c10Xv"], helped, closure, [extensions["c10"]], _read_symbols) == ["_ZN3c10Xv"]

    def unreadable(path):
        if path == helper:
            raise OSError("unreadable")
        return _read_symbols(path)
    assert cxxabi.TorchAbiCache().missing([GONE], helped, closure, [extensions["c10"]], unreadable) == [GONE]
    assert cxxabi.TorchAbiCache().missing([], helped, closure, [extensions["c10"]], unreadable) == []


def test_what_extension_facts_leaves_alone(extensions, tmp_path):
    c10 = [extensions["c10"]]
    # every undefined name of an extension is judged against its closure, whatever its name:
    # `plain` binds only puts, which its closure's libc defines (ld.so's own closure of it)
    libc = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
    for path in (extensions["plain"], str(tmp_path / "absent.so"),
                 os.path.join(extensions["lib"], "libtorch_cpu.so")):
        assert cxxabi.extension_facts(path, _closure(extensions, libc), c10, cxxabi.TorchAbiCache(),
                                      _read_symbols) == []
    link = tmp_path / "torchlib"
    os.symlink(extensions["lib"], link)
    assert cxxabi.extension_facts(str(link / "libtorch_cpu.so"), _closure(extensions), c10, cxxabi.TorchAbiCache(),
                                  _read_symbols) == []
    info = _read_symbols(extensions["new"])
    assert cxxabi.cxx_abi_fact(str(link / "libtorch_cpu.so"), info, c10, cxxabi.TorchAbiCache()) is None
    assert cxxabi.cxx_abi_fact(extensions["plain"], _read_symbols(extensions["plain"]), c10,
                               cxxabi.TorchAbiCache()) is None
    unreadable = str(tmp_path / "libc10_broken.so")
    Path(unreadable).write_bytes(b"junk")
    fact = cxxabi.cxx_abi_fact(extensions["new"], info, [unreadable, extensions["c10"]], cxxabi.TorchAbiCache())
    assert fact.data["torch_path"] == extensions["c10"]
    assert cxxabi.cxx_abi_fact(extensions["new"], info, [unreadable], cxxabi.TorchAbiCache()) is None


def test_defined_names_are_what_nm_exports(extensions):
    from seedance.elf.reader import read_elf
    helper = extensions["helper"]
    exported = set(nm(helper, "--defined-only"))
    assert cxxabi.TorchAbiCache().defined(helper, read_elf(helper, symbols=True)) == frozenset(exported)


def test_a_library_that_links_only_libtorch_cpu_may_define_torch_symbols(real_torch, tmp_path):
    """A helper library outside torch/lib that links libtorch_cpu (and not libc10) defines an
    at:: function an extension imports: ld.so binds it, so it is not missing (seed-2027 sample:
    cxxabi._links_torch 5 knew only libc10 as a torch library, and reported it missing)."""
    from seedance.elf.reader import read_elf

    lib = os.path.join(real_torch["dir"], "lib")
    helper_dir = tmp_path / "helper"
    helper_dir.mkdir()
    (tmp_path / "helper.cc").write_text("namespace at { int helper() { return 42; } }\n")
    (tmp_path / "ext.cc").write_text("namespace at { int helper(); }\nint ext_entry() { return at::helper(); }\n")
    helper, ext = helper_dir / "libhelper.so", tmp_path / "ext.so"
    subprocess.run(["g++", "-shared", "-fPIC", tmp_path / "helper.cc", "-o", helper, "-Wl,--no-as-needed",
                    f"-L{lib}", "-ltorch_cpu", f"-Wl,-rpath,{lib}"], check=True, capture_output=True)
    subprocess.run(["g++", "-shared", "-fPIC", tmp_path / "ext.cc", "-o", ext, f"-L{helper_dir}", "-lhelper",
                    f"-Wl,-rpath,{helper_dir}"], check=True, capture_output=True)
    from elftools.elf.elffile import ELFFile

    with open(helper, "rb") as handle:  # the oracle for "links torch": the helper's own DT_NEEDED
        tags = ELFFile(handle).get_section_by_name(".dynamic").iter_tags()
        needed = [t.needed for t in tags if t.entry.d_tag == "DT_NEEDED"]
    assert "libtorch_cpu.so" in needed and not any(n.startswith("libc10") for n in needed)
    symbol = "_ZN2at6helperEv"
    assert symbol in nm(ext, "--undefined-only") and symbol in nm(helper, "--defined-only")
    assert _dlopen_error(str(ext)) == "ok"  # ld.so binds it from the helper
    closure = {str(helper): read_elf(str(helper)), str(ext): read_elf(str(ext))}
    c10 = os.path.join(lib, "libc10.so")
    assert cxxabi.TorchAbiCache().missing([symbol], str(ext), closure, [c10], _read_symbols) == []
