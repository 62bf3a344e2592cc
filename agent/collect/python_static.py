"""The Python of a root filesystem (an image, an unpacked root), read without running it.

``check --python PY`` on the host asks the interpreter itself (python_env.py, torch_ext.py
start it once).  An image's interpreter is never started: it may not even run on this
machine, and whatever it would execute is the image's, not ours.  So everything is read off
the tree the layers built (collect/layers.py):

- which interpreter: the one --python names (a path inside the image), else the first
  ``python3``/``python`` on the image's PATH (Env), else a usual place (/usr/local/bin,
  /usr/bin, /opt/conda/bin);
- its version: a venv's pyvenv.cfg ``version``, the interpreter's file name (python3.11,
  after its links), the one lib/pythonX.Y directory beside it, or its NEEDED libpythonX.Y;
- its site directories, in sys.path order, as site.py builds them: a venv's own
  lib/pythonX.Y/site-packages (and the base's when include-system-site-packages is true),
  PYTHONPATH first, then <prefix>/lib/pythonX.Y/site-packages, and Debian's
  /usr/local/lib/pythonX.Y/dist-packages, /usr/lib/python3/dist-packages,
  /usr/lib/pythonX.Y/dist-packages for a /usr prefix (Debian's patched site.py).

Then the packages' own loading is modelled as the host check does (collect/practice.py,
scan._preloads): torch (torch/__init__.py _load_global_deps) and cupy load the NVIDIA
wheels' site-packages/nvidia/*/lib libraries before their own, and an extension that needs
torch's libraries loads after ``import torch`` put them in the process.
"""
from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from . import practice

_VERSION_NAME = re.compile(r"^python(\d)\.(\d+)[a-z]*$")
_LIB_DIR = re.compile(r"^python(\d)\.(\d+)[a-z]*$")
_LIBPYTHON = re.compile(r"^libpython(\d)\.(\d+)[a-z]*\.so")
_CFG_VERSION = re.compile(r"^\s*version(?:_info)?\s*=\s*(\d+)\.(\d+)", re.M)
_CFG_SYSTEM = re.compile(r"^\s*include-system-site-packages\s*=\s*(\S+)", re.M)
_CFG_HOME = re.compile(r"^\s*home\s*=\s*(\S.*?)\s*$", re.M)
USUAL_PLACES = ("/usr/local/bin/python3", "/usr/bin/python3", "/opt/conda/bin/python",
                "/usr/local/bin/python", "/usr/bin/python")
# torch's libraries an extension links with -lc10 -ltorch... and finds only because
# `import torch` loaded them first (scan._torch_preload)
TORCH_PRELOAD_ORDER = ("libtorch_python.so", "libtorch.so", "libc10.so")


@dataclass(frozen=True)
class RootPython:
    """An interpreter of a root, as read from its files."""
    interpreter: str  # the path inside the root, as named or found on PATH
    canonical: str  # the file it is, after its links
    version: str  # "3.11"
    version_from: str  # where the version was read
    prefix: str  # sys.prefix: the venv's directory, else the installation's
    site_dirs: tuple  # site-packages / dist-packages directories present, sys.path order
    found_by: str  # "--python", "PATH", "a usual place"
    venv: bool = False

    def as_scope(self) -> dict:
        return {"interpreter": self.interpreter, "canonical": self.canonical, "version": self.version,
                "version_from": self.version_from, "prefix": self.prefix, "venv": self.venv,
                "site_dirs": list(self.site_dirs), "found_by": self.found_by}


class NotAnInterpreter(ValueError):
    """--python names nothing usable inside the root (the message says why)."""


def _file_at(tree, path: str):
    """(canonical path, node) of a regular file, links followed inside the tree, else (path, None)."""
    from .layers import SymlinkLoop

    try:
        canonical, node = tree.lookup(path)
    except SymlinkLoop:
        return path, None
    if node is None or node.kind != "file":
        return canonical, None
    return canonical, node


def _dir_at(tree, path: str):
    from .layers import SymlinkLoop

    try:
        canonical, node = tree.lookup(path)
    except SymlinkLoop:
        return path, None
    return (canonical, node) if node is not None and node.kind == "dir" else (canonical, None)


def _read_small(node, limit: int = 4096) -> str:
    """The first bytes of a staged file (layers.py keeps at least the first 4 KiB of any file)."""
    try:
        with open(node.blob.path, "rb") as handle:
            return handle.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def find_python(tree, env: dict, requested: str | None = None, default_path: str = "") -> RootPython | None:
    """The interpreter of the root: ``requested`` (--python, a path inside it), else the
    first python3/python on the Env's PATH, else a usual place; None when there is none.
    NotAnInterpreter when ``requested`` is not a regular file of the root."""
    if requested:
        if not requested.startswith("/"):
            raise NotAnInterpreter(f"--python {requested}: give the interpreter's absolute path inside the image")
        canonical, node = _file_at(tree, requested)
        if node is None:
            raise NotAnInterpreter(f"--python {requested}: no such file in the image")
        if _read_small(node, 4)[:4] != "\x7fELF" and not _read_small(node, 2).startswith("#!"):
            raise NotAnInterpreter(f"--python {requested}: not a program (neither ELF nor a #! script)")
        return _describe(tree, env, requested, canonical, node, "--python")
    for directory in (env.get("PATH") or default_path).split(":"):
        if not directory.startswith("/"):
            continue  # execvp's relative entries are relative to a working directory we do not know
        for name in ("python3", "python"):
            candidate = posixpath.join(directory, name)
            canonical, node = _file_at(tree, candidate)
            if node is not None:
                described = _describe(tree, env, candidate, canonical, node, "PATH")
                if described is not None:
                    return described
    for candidate in USUAL_PLACES:
        canonical, node = _file_at(tree, candidate)
        if node is not None:
            described = _describe(tree, env, candidate, canonical, node, "a usual place")
            if described is not None:
                return described
    return None


def _describe(tree, env: dict, named: str, canonical: str, node, found_by: str) -> RootPython | None:
    bin_dir = posixpath.dirname(named)
    venv_home = posixpath.dirname(bin_dir)
    cfg_canonical, cfg = _file_at(tree, posixpath.join(venv_home, "pyvenv.cfg"))
    cfg_text = _read_small(cfg) if cfg is not None else ""
    version, version_from = None, ""
    match = _CFG_VERSION.search(cfg_text)
    if match:
        version, version_from = f"{match.group(1)}.{match.group(2)}", "pyvenv.cfg"
    if version is None:
        for name in (posixpath.basename(named), posixpath.basename(canonical)):
            match = _VERSION_NAME.match(name)
            if match:
                version, version_from = f"{match.group(1)}.{match.group(2)}", f"the file name {name}"
                break
    base_prefix = posixpath.dirname(posixpath.dirname(canonical))
    if version is None:
        _lib, lib = _dir_at(tree, posixpath.join(base_prefix, "lib"))
        found = sorted(((int(m.group(1)), int(m.group(2))) for m in map(_LIB_DIR.match, lib.children or {})
                        if m), reverse=True) if lib is not None else []
        if len(found) == 1:
            version, version_from = "%d.%d" % found[0], f"{base_prefix.rstrip('/')}/lib/python%d.%d" % found[0]
    if version is None:
        version, version_from = _version_from_needed(node)
    if version is None:
        if found_by == "--python":
            raise NotAnInterpreter(f"--python {named}: cannot tell its Python version (no pythonX.Y in its "
                                   "name, no lib/pythonX.Y beside it, no libpythonX.Y it needs)")
        return None
    venv = cfg is not None
    prefix = venv_home if venv else base_prefix
    candidates = [d for d in env.get("PYTHONPATH", "").split(":") if d.startswith("/")]
    if venv:
        candidates.append(f"{venv_home}/lib/python{version}/site-packages")
    system = _CFG_SYSTEM.search(cfg_text)
    if not venv or (system and system.group(1).lower() == "true"):
        if venv:
            home = _CFG_HOME.search(cfg_text)
            if home:  # the base interpreter's bin directory
                base_prefix = posixpath.dirname(home.group(1).rstrip("/")) or base_prefix
        if base_prefix in ("/usr", "/"):
            # Debian's site.py (python3 packaging): local first, then the distribution's
            candidates += [f"/usr/local/lib/python{version}/dist-packages", "/usr/lib/python3/dist-packages",
                           f"/usr/lib/python{version}/dist-packages", f"/usr/lib/python{version}/site-packages"]
        else:
            candidates += [f"{base_prefix}/lib/python{version}/site-packages",
                           f"{base_prefix}/lib/python{version}/dist-packages"]
    site_dirs = []
    for candidate in candidates:
        canonical_dir, directory = _dir_at(tree, candidate)
        if directory is not None and canonical_dir not in site_dirs:
            site_dirs.append(canonical_dir)
    return RootPython(named, canonical, version, version_from, prefix, tuple(site_dirs), found_by, venv)


def _version_from_needed(node) -> tuple:
    """X.Y from a libpythonX.Y NEEDED of the interpreter (a shared-libpython build)."""
    try:
        from ..elf.reader import read_elf

        info = read_elf(node.blob.path)
    except Exception:  # not ELF, or unreadable: no version from here
        return None, ""
    for name in info.needed:
        match = _LIBPYTHON.match(name)
        if match:
            return f"{match.group(1)}.{match.group(2)}", f"its NEEDED {name}"
    return None, ""


# --- how the packages load ---------------------------------------------------------------------
def site_of(path: str) -> str | None:
    """The site-packages / dist-packages directory holding the image path ``path``."""
    return practice.site_packages_of(path)


def torch_dir_in(tree, site_dirs) -> str | None:
    """site/torch of the first site directory that holds torch (import order)."""
    for site in site_dirs:
        found = torch_beside_in(tree, site + "/torch/x")
        if found is not None:
            return found
    return None


def torch_beside_in(tree, path: str, levels: int = 6) -> str | None:
    """The torch of the environment ``path`` lives in (torch_ext.torch_beside, in the tree)."""
    directory = posixpath.dirname(path)
    for _ in range(levels):
        candidate = posixpath.join(directory, "torch")
        _c, lib = _dir_at(tree, candidate + "/lib")
        _v, version = _file_at(tree, candidate + "/version.py")
        if lib is not None and version is not None:
            return candidate
        parent = posixpath.dirname(directory)
        if parent == directory:
            break
        directory = parent
    return None


def nvidia_wheel_libs(tree, site: str) -> dict:
    """NAME -> image path of every file in site/nvidia/*/lib (practice.nvidia_wheel_libs, in the tree)."""
    found: dict = {}
    _c, base = _dir_at(tree, site + "/nvidia")
    if base is None:
        return found
    for package in sorted(base.children):
        _l, lib = _dir_at(tree, f"{site}/nvidia/{package}/lib")
        if lib is None:
            continue
        for name in sorted(lib.children):
            found.setdefault(name, f"{site}/nvidia/{package}/lib/{name}")
    return found


def preload_plan(tree, path: str, missing: set) -> dict:
    """provider image path -> (reason, package) that the package around ``path`` loads before
    it and that provide some of its ``missing`` NEEDED names (practice.preload_plan, read
    in the tree; the package is the wheel's directory, there is no dpkg to ask)."""
    plan: dict = {}
    site = site_of(path)
    if site is None:
        return plan
    top = posixpath.relpath(path, site).split("/", 1)[0]
    template = _nvidia_preloader(top)
    if template is None:
        return plan
    wheel_libs = nvidia_wheel_libs(tree, site)
    for name in sorted(missing):
        provider = wheel_libs.get(name)
        if provider is not None and provider not in plan:
            rel = posixpath.relpath(provider, site)
            plan[provider] = (template.format(provider="site-packages/" + rel), "")
    return plan


def _nvidia_preloader(top: str) -> str | None:
    """The reason template of a package that loads the NVIDIA wheels' libraries before its
    own (practice.py's table of packages), or None."""
    reason = getattr(practice, "preload_reason", None)
    if reason is not None:
        known = reason(top)
        if known is None or known[1] != "preloaded" or "nvidia-wheels" not in known[2]:
            return None
        return known[0]
    return getattr(practice, "NVIDIA_PRELOADERS", {}).get(top)


_EXTENSION = re.compile(r"\.(?:cpython-\d+[^/.]*|abi3)\.so$|^[^/.]+\.so$")


def is_extension_module(path: str) -> bool:
    """A file importlib's ExtensionFileLoader takes: NAME.cpython-311-x86_64-linux-gnu.so,
    NAME.abi3.so or NAME.so (a library such as libfoo.so.1 is not one)."""
    name = posixpath.basename(path)
    return bool(_EXTENSION.search(name)) and not (name.startswith("lib") and ".cpython-" not in name
                                                 and ".abi3." not in name)


def module_name(path: str, site: str) -> str:
    """The import name of an extension module under ``site``: pkg/sub/_ext.cpython-311-x86_64-linux-gnu.so
    -> pkg.sub._ext."""
    rel = posixpath.relpath(path, site)
    head, _, name = rel.rpartition("/")
    name = name.split(".", 1)[0]
    return ".".join([p for p in head.split("/") if p] + [name])
