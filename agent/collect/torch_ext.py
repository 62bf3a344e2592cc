"""torch_ext_cache facts: cached torch extension builds, and whether they are stale.

What torch.utils.cpp_extension records (torch 2.x, _get_build_directory and
_write_ninja_file): builds live in $TORCH_EXTENSIONS_DIR/<name>/ when that variable is set,
otherwise in ~/.cache/torch_extensions/py<major><minor><abiflags>_<cpu|cuXYZ|rocmXYZ>/<name>/.
Each holds build.ninja (whose cflags name torch's include directory with -isystem, Python's
include directory, and any -D_GLIBCXX_USE_CXX11_ABI) and <name>.so.  The cache is reused by
name alone, so a build made for another torch, CUDA, C++ ABI or Python is loaded as is.

We read those records and the built .so; torch is located (importlib's find_spec, which
does not import it) and its version read from torch/version.py, never imported.  The
strongest evidence is the .so itself: c10/at/torch symbols it imports that the current
torch no longer defines are exactly the "undefined symbol: _ZN3c10..." of the product notes.
"""
from __future__ import annotations

import os
import re
import sys
from ..model.record import NEW, Record

from ..elf.reader import read_elf
from ..model.errors import ELFError
from ..model.report import Fact
from . import cxx_mangling, inputs

_TAG = re.compile(r"^py(\d)(\d+)([a-z]*)_(cpu|cu\d+|rocm\d+)$")
_VERSION = re.compile(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", re.M)
_CUDA = re.compile(r"^cuda\s*(?::[^=]*)?=\s*(?:['\"]([^'\"]+)['\"]|None)", re.M)
_HIP = re.compile(r"^hip\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", re.M)
_ABI_FLAG = re.compile(r"-D_GLIBCXX_USE_CXX11_ABI=(\d)")
_PY_INCLUDE = re.compile(r"/include/python(\d)\.(\d+)([a-z]*)\b")
_TORCH_INCLUDE = re.compile(r"(\S+)/torch/include(?=[\s/'\"]|$)")
_C_MODULE = re.compile(r"^_C\.cpython-(\d)(\d+)([a-z]*)-.*\.so$")


def cache_roots(environ=None, home=None) -> list:
    """Where extension builds are cached: torch's root and seedance's own."""
    environ = os.environ if environ is None else environ
    home = home or os.path.expanduser("~")
    roots = []
    if environ.get("TORCH_EXTENSIONS_DIR"):
        roots.append(environ["TORCH_EXTENSIONS_DIR"])
    else:
        xdg = environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
        roots.append(os.path.join(xdg, "torch_extensions"))
    roots.append(os.path.join(home, ".cache", "seedance", "torch-ext"))
    return roots


class TorchInstall(Record):
    """One torch install, read from disk (never imported)."""
    _fields = ("path", "version", "cuda", "hip", "python_tag", "source")

    def __init__(self, path: str, version: str, cuda: str | None, hip: str | None = None,
                 python_tag: str = NEW, source: str = ""):
        self.path = path  # .../site-packages/torch
        self.version = version
        self.cuda = cuda
        self.hip = hip
        # by default this interpreter's tag (a default_factory: read per instance, as before)
        self.python_tag = f"py{sys.version_info[0]}{sys.version_info[1]}{getattr(sys, 'abiflags', '')}" \
            if python_tag is NEW else python_tag
        self.source = source  # how it was chosen: "beside it", "--python /usr/bin/python3", ...

    @property
    def accelerator(self) -> str:
        if self.hip:
            return "rocm" + self.hip.replace(".", "")
        return "cu" + self.cuda.replace(".", "") if self.cuda else "cpu"

    @property
    def tag(self) -> str:
        """The cache folder cpp_extension uses for this torch: py311_cpu, py310_cu121."""
        return f"{self.python_tag}_{self.accelerator}"

    @property
    def libs(self) -> list:
        lib = os.path.join(self.path, "lib")
        names = ("libc10.so", "libtorch_cpu.so", "libtorch.so", "libtorch_python.so",
                 "libtorch_cuda.so", "libc10_cuda.so")
        return [os.path.join(lib, n) for n in names if inputs.exists(os.path.join(lib, n))]

    def describe(self) -> str:
        return f"torch {self.version} ({self.accelerator}, {self.python_tag})"


def read_torch_version(torch_dir: str) -> tuple:
    """(version, cuda, hip) from torch/version.py; (None, None, None) when unreadable."""
    try:
        with open(os.path.join(torch_dir, "version.py"), encoding="utf-8") as handle:
            text = handle.read(65536)
    except OSError:
        return None, None, None
    version = _VERSION.search(text)
    cuda = _CUDA.search(text)
    hip = _HIP.search(text)
    return (version.group(1) if version else None, cuda.group(1) if cuda and cuda.group(1) else None,
            hip.group(1) if hip else None)


def python_tag_of(torch_dir: str) -> str | None:
    """py311 (or py313t) from the name of torch's own extension, torch/_C.cpython-311-...so:
    the Python this torch was built for, whichever interpreter runs seedance."""
    for name in _listdir(torch_dir):
        match = _C_MODULE.match(name)
        if match:
            return f"py{match.group(1)}{match.group(2)}{match.group(3)}"
    return None


_TORCH_AT: dict = {}  # (dir, source) -> ((version.py and dir stamps), TorchInstall or None)


def torch_at(torch_dir: str, source: str = "") -> TorchInstall | None:
    """The torch install at ``torch_dir`` (a directory holding version.py), or None.

    Remembered while version.py and the directory listing are unchanged: a check of
    site-packages asks once per extension and torch test program (hundreds of times, each
    reading version.py and listing torch/, for the same answer every time)."""
    try:
        stamp = tuple((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                      for st in (inputs.stat(os.path.join(torch_dir, "version.py")), inputs.stat(torch_dir)))
    except OSError:
        stamp = None
    known = _TORCH_AT.get((torch_dir, source)) if stamp is not None else None
    if known is not None and known[0] == stamp:
        return known[1]._replace() if known[1] is not None else None  # a copy: callers may set fields
    version, cuda, hip = read_torch_version(torch_dir)
    install = None
    if version is not None:
        install = TorchInstall(path=torch_dir, version=version, cuda=cuda, hip=hip, source=source)
        install.python_tag = python_tag_of(torch_dir) or install.python_tag
    if stamp is not None:
        if len(_TORCH_AT) > 256:
            _TORCH_AT.clear()
        _TORCH_AT[(torch_dir, source)] = (stamp, install._replace() if install is not None else None)
    return install


def find_torch() -> TorchInstall | None:
    """The torch that the interpreter running seedance would import (fix torch-ext rebuilds
    with it).  The check judges extensions with torch_beside() or torch_for_python()."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return torch_at(list(spec.submodule_search_locations)[0], source="this interpreter")


def torch_beside(path: str, levels: int = 6) -> TorchInstall | None:
    """The torch of the environment ``path`` lives in: site-packages/pkg/sub/ext.so ->
    site-packages/torch.  That torch is the one `import torch` loads before the extension."""
    directory = os.path.dirname(os.path.abspath(path))
    for _ in range(levels):
        candidate = os.path.join(directory, "torch")
        if inputs.isdir(os.path.join(candidate, "lib")) and inputs.isfile(os.path.join(candidate, "version.py")):
            return torch_at(candidate, source="beside it")
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    return None


# Runs in the interpreter the user named; find_spec locates torch without importing it.
_LOCATE = ("import importlib.util, json, sys\n"
           "spec = importlib.util.find_spec('torch')\n"
           "where = list(spec.submodule_search_locations or [None])[0] if spec else None\n"
           "print(json.dumps({'torch': where, 'tag': 'py%d%d%s' % (sys.version_info[0], sys.version_info[1],"
           " getattr(sys, 'abiflags', ''))}))\n")


def torch_for_python(python: str, timeout: float = 60) -> TorchInstall | None:
    """The torch that interpreter ``python`` imports (check --python PATH); None when it has
    none (its environment is checked all the same: an extension of it is judged against the
    torch beside it, if any); BadInput when it is not a Python."""
    import json
    import subprocess

    from ..model.errors import BadInput

    if not inputs.isfile(python) or not os.access(python, os.X_OK):
        raise BadInput(f"--python {python}: not an executable file")
    try:
        proc = subprocess.run([python, "-c", _LOCATE], capture_output=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BadInput(f"--python {python}: could not run it ({exc.__class__.__name__})") from None
    lines = proc.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise BadInput(f"--python {python}: not a Python interpreter (exit {proc.returncode})")
    if not answer.get("torch"):
        return None
    install = torch_at(answer["torch"], source=f"--python {python}")
    if install is None:
        raise BadInput(f"--python {python}: {answer['torch']} has no readable torch/version.py")
    install.python_tag = python_tag_of(install.path) or answer.get("tag") or install.python_tag
    return install


class CachedBuild(Record):
    """One cached torch extension build."""
    _fields = ("path", "name", "tag", "ninja", "library", "kind")

    def __init__(self, path: str, name: str, tag: str | None, ninja: dict = NEW, library: str | None = None,
                 kind: str = "load"):
        self.path = path  # the build directory
        self.name = name
        self.tag = tag  # py311_cpu, when the default layout records it
        self.ninja = {} if ninja is NEW else ninja  # variable -> value from build.ninja
        self.library = library
        self.kind = kind  # "load": cpp_extension.load() cache; "setup.py": BuildExtension's build/temp.*


def inventory(roots, ninja_only: bool = False) -> list:
    """Every cached build under the roots (a directory holding build.ninja or <name>.so).

    ``ninja_only``: the caller keeps only builds with a build.ninja, so a directory without
    that file is not read at all (a site-packages checked as a directory holds hundreds of
    packages, each of which would be listed for a <name>.so)."""
    builds = []
    for root in roots:
        if not inputs.isdir(root):
            continue
        for entry in _subdirs(root):
            full = os.path.join(root, entry)
            if _TAG.match(entry):
                for name in _subdirs(full):
                    build_dir = os.path.join(full, name)
                    if not ninja_only or inputs.isfile(os.path.join(build_dir, "build.ninja")):
                        builds.append(_read_build(build_dir, name, entry))
            elif not ninja_only or inputs.isfile(os.path.join(full, "build.ninja")):
                builds.append(_read_build(full, entry, None))
    return [b for b in builds if b.ninja or b.library]


def _subdirs(path: str) -> list:
    """The names of the directories in ``path`` that are not symbolic links, sorted (what
    os.path.isdir and not os.path.islink keep of _listdir's names), from the entries' types:
    scandir's d_type answers without a stat, where isdir() would stat each of the thousands
    of files of /usr/lib/x86_64-linux-gnu one by one to find no directory."""
    names = []
    try:
        with os.scandir(path) as listing:
            for entry in listing:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        names.append(entry.name)
                except OSError:
                    continue  # as os.path.isdir: what cannot be stat'ed is no directory
    except OSError:
        return []
    return sorted(names)


def _listdir(path: str) -> list:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _read_build(build_dir: str, name: str, tag: str | None) -> CachedBuild:
    build = CachedBuild(path=build_dir, name=name, tag=tag)
    try:
        with open(os.path.join(build_dir, "build.ninja"), encoding="utf-8", errors="replace") as handle:
            for line in handle.read(1 << 20).splitlines():
                key, sep, value = line.partition(" = ")
                if sep and key and not key.startswith((" ", "\t", "#", "build", "rule")):
                    build.ninja[key.strip()] = value.strip()
    except OSError:
        pass
    if name.startswith("temp.") and os.path.basename(os.path.dirname(build_dir)) == "build":
        _read_setup_build(build)
        return build
    for candidate in (f"{name}.so", *[n for n in _listdir(build_dir) if n.endswith(".so")]):
        full = os.path.join(build_dir, candidate)
        if inputs.isfile(full):
            build.library = full
            break
    return build


_EXT_NAME = re.compile(r"-DTORCH_EXTENSION_NAME=(\w+)")


def _read_setup_build(build: CachedBuild) -> None:
    """setup.py with torch's BuildExtension compiles through ninja in build/temp.<plat>/ and
    links with setuptools into build/lib.<plat>/ (cpp_extension._write_ninja_file_and_compile_objects)."""
    build.kind = "setup.py"
    match = _EXT_NAME.search(build.ninja.get("cflags", "") + " " + build.ninja.get("cuda_cflags", ""))
    if match:
        build.name = match.group(1)
    lib_dirs = [os.path.join(os.path.dirname(build.path), n) for n in _listdir(os.path.dirname(build.path))
                if n.startswith("lib.")]
    for lib_dir in lib_dirs:
        for base, _dirs, files in inputs.walk(lib_dir):
            for file_name in sorted(files):
                if file_name.endswith(".so") and file_name.split(".", 1)[0] == build.name:
                    build.library = os.path.join(base, file_name)
                    return


class TorchSymbols:
    """Symbols one torch install defines, and its C++ ABI, read once per scan."""

    def __init__(self, torch: TorchInstall):
        self.torch = torch
        self._defined = None
        self.abi = None

    def defined(self) -> set:
        if self._defined is None:
            names: set = set()
            abi_names = []
            for lib in self.torch.libs:
                try:
                    info = read_elf(lib, symbols=True)
                except ELFError:
                    continue
                for sym in info.symbols:
                    if sym.defined and sym.binding != "LOCAL" and not sym.hidden:
                        names.add(sym.name)
                        if "libc10" in lib:
                            abi_names.append(sym.name)
            self._defined = names
            self.abi = cxx_mangling.torch_abi_of(abi_names)[0]
        return self._defined


def build_facts(build: CachedBuild, torch: TorchInstall | None, symbols: TorchSymbols | None) -> Fact:
    """One torch_ext_cache fact: is ``build`` stale for ``torch``, the torch that loads it?

    A build in a pyXY_tag folder is only ever loaded by a torch of that Python and CUDA tag
    (cpp_extension's _get_build_directory puts the tag in the path), so an entry for another
    tag is not stale, it belongs to another environment.  Otherwise it is
    stale when that torch lacks c10/at/torch symbols the .so imports (the "undefined symbol:
    _ZN3c10..." of an import), mangles std::string the other way, is another release than
    the torch build.ninja names, or when the torch it was built against is gone.
    """
    built, reasons = {}, []
    flags = " ".join(build.ninja.get(k, "") for k in ("cflags", "post_cflags", "cuda_cflags",
                                                       "cuda_post_cflags", "ldflags"))
    if build.tag:
        match = _TAG.match(build.tag)
        built["python"] = f"py{match.group(1)}{match.group(2)}{match.group(3)}"
        built["accelerator"] = match.group(4)
    py_include = _PY_INCLUDE.search(flags)
    if py_include and "python" not in built:
        built["python"] = f"py{py_include.group(1)}{py_include.group(2)}{py_include.group(3)}"
    torch_include = _TORCH_INCLUDE.search(flags)
    if torch_include:
        built_torch_dir = os.path.join(torch_include.group(1), "torch")
        built["torch_path"] = built_torch_dir
        built["torch"] = read_torch_version(built_torch_dir)[0]
    abi_flag = _ABI_FLAG.search(flags)
    if abi_flag:
        built["abi"] = cxx_mangling.NEW if abi_flag.group(1) == "1" else cxx_mangling.OLD
    imports = []
    if build.library:
        try:
            info = read_elf(build.library, symbols=True)
            imports = [s.name for s in info.symbols
                       if not s.defined and s.binding != "WEAK" and s.name.startswith(cxx_mangling.TORCH_PREFIXES)]
            lib_abi = cxx_mangling.abi_of(imports)[0]
            if lib_abi and "abi" not in built:
                built["abi"] = lib_abi
        except ELFError as exc:
            reasons.append(f"built library unreadable: {exc}")

    current, differs, other_environment = {}, {}, ""
    if torch is not None:
        current = {"torch": torch.version, "torch_path": torch.path, "python": torch.python_tag,
                   "accelerator": torch.accelerator, "source": torch.source}
        if build.tag and build.tag != torch.tag:
            other_environment = (f"built for {build.tag}; {torch.describe()} uses {torch.tag}/ and never"
                                 f" loads it")
        else:
            if built.get("torch_path") and built.get("torch") is None:
                reasons.append(f"torch: the torch it was built against ({built['torch_path']}) no longer exists")
            elif built.get("torch") and built["torch"] != torch.version:
                reasons.append(f"torch: built against {built['torch']}, loaded by {torch.version}")
                differs["torch"] = (built["torch"], torch.version)
            if symbols is not None:
                defined = symbols.defined()
                current["abi"] = symbols.abi
                missing = [s for s in imports if s not in defined]
                if missing:
                    reasons.append(f"torch: imports {len(missing)} c10/at/torch symbol(s) torch {torch.version}"
                                   f" does not define, e.g. {missing[0]}")
                    current["missing"] = len(missing)
                if built.get("abi") and symbols.abi and built["abi"] != symbols.abi:
                    reasons.append(f"abi: built {built['abi']}, torch {torch.version} uses {symbols.abi}")
                    differs["abi"] = (built["abi"], symbols.abi)
    built_for, now = _describe_difference(built, current, differs)
    return Fact("torch_ext_cache", {"path": build.path},
                {"name": build.name, "stale": bool(reasons) and not other_environment, "reasons": reasons,
                 "other_environment": other_environment, "built_for": built_for, "current": now,
                 "library": build.library, "built": built, "now": current, "kind": build.kind,
                 "fix_command": _fix_command(build, torch)},
                source="collect.torch_ext")


def _describe_difference(built: dict, current: dict, differs: dict) -> tuple:
    """(built_for, current) naming only what differs, so no version is shown twice."""
    if not current:
        return _describe(built), "no torch found"
    before, after = [], []
    if "torch" in differs:
        before.append(f"torch {differs['torch'][0]}")
        after.append(f"torch {differs['torch'][1]}")
    if "abi" in differs:
        before.append(f"the {differs['abi'][0]} C++ ABI")
        after.append(f"the {differs['abi'][1]} C++ ABI")
    if not before:
        if built.get("torch_path") and built.get("torch") is None:
            before.append(f"the torch at {built['torch_path']} (gone)")
        else:
            before.append(f"another build of torch (imports {current.get('missing', '?')} symbol(s) this one lacks)")
        after.append(f"torch {current['torch']} at {current['torch_path']}")
    where = f" ({current['source']})" if current.get("source") else ""
    return ", ".join(before), ", ".join(after) + where


def _describe(values: dict) -> str:
    parts = []
    if values.get("torch"):
        parts.append(f"torch {values['torch']}")
    elif values.get("torch_path"):
        parts.append(f"torch at {values['torch_path']}")
    for key in ("accelerator", "python", "abi"):
        if values.get(key):
            parts.append(str(values[key]))
    return " ".join(parts) or "unknown"


def _fix_command(build: CachedBuild, torch: TorchInstall | None) -> str:
    if build.kind == "setup.py":
        return rebuild_command(build.library or build.path, torch, name=build.name)
    return f"seedance fix torch-ext --clean-cache --rebuild {build.name}"


def rebuild_command(ext_path: str, torch: TorchInstall | None, name: str | None = None) -> str:
    """The command that rebuilds the extension at ``ext_path`` for ``torch``.

    A cpp_extension.load() build in an extension cache is rebuilt by fix torch-ext; a
    setup.py build is rebuilt by its own project, with --no-build-isolation so that the
    build sees this environment's torch instead of a fresh one pip would download."""
    python = torch.source[len("--python "):] if torch and torch.source.startswith("--python ") else "python"
    real = inputs.realpath(ext_path)
    for root in cache_roots():
        if real.startswith(inputs.realpath(root) + os.sep):
            rel = os.path.relpath(real, inputs.realpath(root)).split(os.sep)
            cached = rel[1] if _TAG.match(rel[0]) and len(rel) > 1 else rel[0]
            return f"seedance fix torch-ext --clean-cache --rebuild {cached}"
    if inputs.isfile(os.path.join(os.path.dirname(real), "build.ninja")):
        # a cpp_extension.load() build directory outside the default roots: fix torch-ext
        # finds it (and cpp_extension rebuilds it in place) with TORCH_EXTENSIONS_DIR at its parent
        build_dir = os.path.dirname(real)
        return (f"TORCH_EXTENSIONS_DIR={os.path.dirname(build_dir)} seedance fix torch-ext --clean-cache "
                f"--rebuild {os.path.basename(build_dir)}")
    project = _project_of(real)
    if project is not None:
        if inputs.isfile(os.path.join(project, "setup.py")):
            return f"cd {project} && {python} setup.py build_ext --inplace --force"
        return f"{python} -m pip install --no-build-isolation --no-deps --force-reinstall {project}"
    from .practice import package_of

    dist = package_of(real)
    if dist:
        pinned = matching_install(dist, torch, python)
        if pinned:
            return pinned
        return (f"{python} -m pip install --no-build-isolation --no-deps --force-reinstall --no-binary {dist} {dist}")
    label = name or os.path.basename(ext_path)
    target = f"torch {torch.version}" if torch else "the torch that imports it"
    return f"rebuild {label} from its sources against {target} (no setup.py or pyproject.toml found above it)"


def matching_install(dist: str, torch: TorchInstall | None, python: str = "python") -> str | None:
    """The install of ``dist``'s release built for the installed torch, when it is one of
    the extensions whose releases pair with torch's (rules/context/release_pairs.yaml): a
    binary-only project such as torchvision has no source a --no-binary rebuild could use.
    When this torch release has no known pair, the text says what to look for instead."""
    from .package_context import index_caveat, matching_release, release_pairs

    if not torch or not torch.version or re.sub(r"[-_.]+", "-", dist).lower() not in release_pairs():
        return None
    found = matching_release(dist, torch.version)
    if found is None:
        return (f"install the {dist} release built for torch {torch.version} (its Requires-Dist pins "
                f"torch=={torch.version.split('+', 1)[0]}; the project's compatibility table lists it)")
    release, _source = found
    return f"{python} -m pip install --no-deps '{dist}=={release}'{index_caveat(torch.version)}"


def _project_of(path: str, levels: int = 6) -> str | None:
    """The nearest directory above ``path`` holding setup.py or pyproject.toml (not inside
    a site-packages: an installed package is rebuilt from its distribution)."""
    directory = os.path.dirname(path)
    for _ in range(levels):
        if os.path.basename(directory) in ("site-packages", "dist-packages"):
            return None
        if any(inputs.isfile(os.path.join(directory, n)) for n in ("setup.py", "pyproject.toml")):
            return directory
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    return None


def builds_in(directory: str) -> list:
    """Builds when ``directory`` is a cache root, a pyXY_tag folder or one build directory."""
    if inputs.isfile(os.path.join(directory, "build.ninja")):
        name = os.path.basename(os.path.normpath(directory))
        parent = os.path.basename(os.path.dirname(os.path.normpath(directory)))
        return [_read_build(directory, name, parent if _TAG.match(parent) else None)]
    base = os.path.basename(os.path.normpath(directory))
    if _TAG.match(base):
        return [b for b in (_read_build(os.path.join(directory, n), n, base) for n in _listdir(directory)
                            if inputs.isdir(os.path.join(directory, n))) if b.ninja or b.library]
    found = [b for b in inventory([directory], ninja_only=True) if b.ninja]
    build = os.path.join(directory, "build")  # a setup.py project: build/temp.<platform>/build.ninja
    for entry in _listdir(build):
        if entry.startswith("temp.") and inputs.isfile(os.path.join(build, entry, "build.ninja")):
            found.append(_read_build(os.path.join(build, entry), entry, None))
    return found


def torch_ext_facts(roots=None, builds=None, torch: TorchInstall | None = None) -> list:
    """Facts for the cached builds under ``roots`` (or ``builds``).

    Each build is judged against the torch that loads it: ``torch`` when the caller names
    one (check --python; fix torch-ext passes the torch it rebuilds with), else the torch
    its build.ninja was compiled against, still at that path, else the torch of this
    interpreter (a cache is shared by every interpreter of the user with the same tag)."""
    if builds is None:
        builds = inventory(roots if roots is not None else cache_roots())
    if not builds:
        return []
    tables: dict = {}
    fallback = []
    facts = []
    for build in builds:
        judge = torch
        if judge is None:
            built_dir = _built_torch_dir(build)
            judge = torch_at(built_dir, source="the torch it was built against") if built_dir else None
        if judge is None:
            if not fallback:
                fallback.append(find_torch())
            judge = fallback[0]
        symbols = None
        if judge is not None:
            symbols = tables.setdefault(judge.path, TorchSymbols(judge))
        facts.append(build_facts(build, judge, symbols))
    return facts


def _built_torch_dir(build: CachedBuild) -> str | None:
    flags = " ".join(build.ninja.get(k, "") for k in ("cflags", "post_cflags", "cuda_cflags"))
    match = _TORCH_INCLUDE.search(flags)
    return os.path.join(match.group(1), "torch") if match else None


def torch_not_found_fact(path: str, needs) -> Fact:
    """An extension that needs torch's libraries, with no torch to judge it against: no torch
    in its own environment and no --python.  Loaded alone it cannot load, but it is only ever
    loaded after `import torch`, so that is no loader error; it is simply not judged."""
    return Fact("torch_env", {"path": path},
                {"found": False, "needs": sorted(needs)}, source="collect.torch_ext")


# torch's own libraries that torch dlopens only on demand, never at `import torch`
# (judged as loaded in practice, collect/practice.py).  libcaffe2_nvrtc.so: CUDAHooks::nvrtc()
# (aten/src/ATen/cuda/detail/CUDAHooks.cpp) opens it through at::DynamicLibrary on the
# first NVRTC use (jiterator, fused kernels), which needs a GPU and so the driver's
# libcuda.so.1 that it NEEDs; on a host without the driver it is never loaded.
_LAZY_TORCH_LIBS = {
    "libcaffe2_nvrtc.so": "torch dlopens it only on the first NVRTC use on a GPU "
                          "(CUDAHooks::nvrtc, ATen/cuda/detail/CUDAHooks.cpp), where the driver provides {name}",
}


def lazily_loaded_by_torch(path: str, name: str) -> str | None:
    """Why a missing NEEDED ``name`` of torch's own library ``path`` is no load failure of
    torch, or None.  For the loader rules' context (collect/practice.py, scan._explain_missing)."""
    reason = _LAZY_TORCH_LIBS.get(os.path.basename(path))
    if reason is None or name != "libcuda.so.1":
        return None
    lib_dir = os.path.dirname(os.path.abspath(path))
    if not inputs.isfile(os.path.join(os.path.dirname(lib_dir), "version.py")):
        return None  # not inside a torch install
    return reason.format(name=name)
