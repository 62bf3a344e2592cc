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
from dataclasses import dataclass, field

from ..elf.reader import read_elf
from ..errors import ELFError
from ..model import Fact
from . import cxxabi

_TAG = re.compile(r"^py(\d)(\d+)([a-z]*)_(cpu|cu\d+|rocm\d+)$")
_VERSION = re.compile(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", re.M)
_CUDA = re.compile(r"^cuda\s*(?::[^=]*)?=\s*(?:['\"]([^'\"]+)['\"]|None)", re.M)
_HIP = re.compile(r"^hip\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", re.M)
_ABI_FLAG = re.compile(r"-D_GLIBCXX_USE_CXX11_ABI=(\d)")
_PY_INCLUDE = re.compile(r"/include/python(\d)\.(\d+)([a-z]*)\b")
_TORCH_INCLUDE = re.compile(r"(\S+)/torch/include(?=[\s/'\"]|$)")


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


@dataclass
class TorchInstall:
    """The torch the current Python would import, read from disk."""

    path: str  # .../site-packages/torch
    version: str
    cuda: str | None
    hip: str | None = None
    python_tag: str = field(default_factory=lambda: f"py{sys.version_info[0]}{sys.version_info[1]}"
                                                     f"{getattr(sys, 'abiflags', '')}")

    @property
    def accelerator(self) -> str:
        if self.hip:
            return "rocm" + self.hip.replace(".", "")
        return "cu" + self.cuda.replace(".", "") if self.cuda else "cpu"

    @property
    def libs(self) -> list:
        lib = os.path.join(self.path, "lib")
        names = ("libc10.so", "libtorch_cpu.so", "libtorch.so", "libtorch_python.so",
                 "libtorch_cuda.so", "libc10_cuda.so")
        return [os.path.join(lib, n) for n in names if os.path.exists(os.path.join(lib, n))]

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


def find_torch() -> TorchInstall | None:
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    torch_dir = list(spec.submodule_search_locations)[0]
    version, cuda, hip = read_torch_version(torch_dir)
    if version is None:
        return None
    return TorchInstall(path=torch_dir, version=version, cuda=cuda, hip=hip)


@dataclass
class CachedBuild:
    path: str  # the build directory
    name: str
    tag: str | None  # py311_cpu, when the default layout records it
    ninja: dict = field(default_factory=dict)  # variable -> value from build.ninja
    library: str | None = None


def inventory(roots) -> list:
    """Every cached build under the roots (a directory holding build.ninja or <name>.so)."""
    builds = []
    for root in roots:
        if not os.path.isdir(root):
            continue
        for entry in _listdir(root):
            full = os.path.join(root, entry)
            if not os.path.isdir(full) or os.path.islink(full):
                continue
            if _TAG.match(entry):
                for name in _listdir(full):
                    build_dir = os.path.join(full, name)
                    if os.path.isdir(build_dir) and not os.path.islink(build_dir):
                        builds.append(_read_build(build_dir, name, entry))
            else:
                builds.append(_read_build(full, entry, None))
    return [b for b in builds if b.ninja or b.library]


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
    for candidate in (f"{name}.so", *[n for n in _listdir(build_dir) if n.endswith(".so")]):
        full = os.path.join(build_dir, candidate)
        if os.path.isfile(full):
            build.library = full
            break
    return build


class TorchSymbols:
    """Symbols the current torch defines, read once per scan."""

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
                    if sym.defined:
                        names.add(sym.name)
                        if "libc10" in lib:
                            abi_names.append(sym.name)
            self._defined = names
            self.abi = cxxabi.torch_abi_of(abi_names)[0]
        return self._defined


def build_facts(build: CachedBuild, torch: TorchInstall | None, symbols: TorchSymbols | None) -> Fact:
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
        built["abi"] = cxxabi.NEW if abi_flag.group(1) == "1" else cxxabi.OLD
    imports = []
    if build.library:
        try:
            info = read_elf(build.library, symbols=True)
            imports = [s.name for s in info.symbols
                       if not s.defined and s.name.startswith(cxxabi.TORCH_PREFIXES)]
            lib_abi = cxxabi.abi_of(imports)[0]
            if lib_abi and "abi" not in built:
                built["abi"] = lib_abi
        except ELFError as exc:
            reasons.append(f"built library unreadable: {exc}")

    current = {}
    if torch is not None:
        current = {"torch": torch.version, "torch_path": torch.path, "python": torch.python_tag,
                   "accelerator": torch.accelerator}
        if built.get("python") and built["python"] != torch.python_tag:
            reasons.append(f"python: built for {built['python']}, current {torch.python_tag}")
        if built.get("accelerator") and built["accelerator"] != torch.accelerator:
            reasons.append(f"cuda: built for {built['accelerator']}, current torch is {torch.accelerator}")
        if built.get("torch") and built["torch"] != torch.version:
            reasons.append(f"torch: built against {built['torch']}, current {torch.version}")
        if symbols is not None and imports:
            defined = symbols.defined()
            missing = [s for s in imports if s not in defined]
            if missing:
                reasons.append(f"torch: imports {len(missing)} symbol(s) torch {torch.version} does not"
                               f" define, e.g. {missing[0]}")
            current["abi"] = symbols.abi
            if built.get("abi") and symbols.abi and built["abi"] != symbols.abi:
                reasons.append(f"abi: built {built['abi']}, torch uses {symbols.abi}")
    return Fact("torch_ext_cache", {"path": build.path},
                {"name": build.name, "stale": bool(reasons), "reasons": reasons,
                 "built_for": _describe(built), "current": _describe(current) if current else "no torch found",
                 "library": build.library, "built": built, "now": current},
                source="collect.torch_ext")


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


def builds_in(directory: str) -> list:
    """Builds when ``directory`` is a cache root, a pyXY_tag folder or one build directory."""
    if os.path.isfile(os.path.join(directory, "build.ninja")):
        name = os.path.basename(os.path.normpath(directory))
        parent = os.path.basename(os.path.dirname(os.path.normpath(directory)))
        return [_read_build(directory, name, parent if _TAG.match(parent) else None)]
    base = os.path.basename(os.path.normpath(directory))
    if _TAG.match(base):
        return [b for b in (_read_build(os.path.join(directory, n), n, base) for n in _listdir(directory)
                            if os.path.isdir(os.path.join(directory, n))) if b.ninja or b.library]
    return [b for b in inventory([directory]) if b.ninja]


def torch_ext_facts(roots=None, builds=None) -> list:
    if builds is None:
        builds = inventory(roots if roots is not None else cache_roots())
    if not builds:
        return []
    torch = find_torch()
    symbols = TorchSymbols(torch) if torch is not None else None
    return [build_facts(build, torch, symbols) for build in builds]
