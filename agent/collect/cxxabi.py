"""cxx_abi facts: does an extension mangle std::string the way the torch it loads does?

GCC's dual ABI (_GLIBCXX_USE_CXX11_ABI) changes how std::string mangles: the old ABI uses
the standard abbreviation ``Ss``, the new one spells out
``NSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE``.  A c10/torch function taking a
string therefore has two different symbol names, and an extension built with the other
ABI imports a name torch never exports.  We read the mangled names; nothing is demangled.

torch's own ABI is decided from its c10/at/torch/caffe2-namespaced exports only:
libc10 of torch < 2.7 (pre-cxx11 wheels) also exports statically linked libstdc++
helpers in ``std::__cxx11`` (213 of them in torch 2.4.1's libc10, against 62 old-string
names), so counting every export calls the old ABI new.  The namespaced exports are
unambiguous: torch 2.4.1's libc10 has 36 old-string names and no new one; torch 2.13's
has 74 new-string names and no old one.
"""
from __future__ import annotations

import functools
import os

from ..elf.reader import read_elf
from ..model.report import Fact
from . import inputs

# The names are read in cxx_mangling.py, which torch_ext.py (imported here) uses too; they are
# offered here as well, where the C++ ABI check's callers have always found them.
from .cxx_mangling import (NEW, NEW_ABI_MARK, OLD, TORCH_PREFIXES, abi_of,  # noqa: F401
                           torch_abi_of, uses_new_string, uses_old_string)
from .torch_ext import rebuild_command, torch_at


class TorchAbiCache:
    """ABI and exports of each torch library, read once per scan (libtorch_cpu has ~100k symbols)."""

    def __init__(self, key=None):
        self._abi: dict = {}
        self._defined: dict = {}  # key(path) -> frozenset of the names it exports
        self._tables: dict = {}  # key(path) -> (every name it exports, its strong undefined names)
        # the file a path names (the scan's (dev, inode)): torch's test programs reach
        # torch/bin/../lib/libtorch_cpu.so, its extensions torch/lib/libtorch_cpu.so
        self._key = key or str

    def defined(self, path: str, info) -> frozenset:
        """Names ``path`` exports to other objects: defined, not local, not a hidden version."""
        key = self._key(path)
        known = self._defined.get(key)
        if known is None:
            # a list comprehension, not a generator: libtorch_cpu exports about a hundred
            # thousand names, and a generator pays a frame resumption for each
            known = self._defined[key] = frozenset([s.name for s in info.symbols
                                                    if s.defined and s.binding != "LOCAL" and not s.hidden])
        return known

    def warm(self, paths, read_exports) -> None:
        """Read ahead the exports of ``paths`` (torch's libraries), as missing() would read
        them: the check's helper does this while the root loop gets to the first extension."""
        for path in paths:
            self._read_exports(self._key(path), path, read_exports)

    def _read_exports(self, key, path: str, read_exports) -> None:
        """The names alone, when the reader can (an error leaves the symbols to be read)."""
        if key not in self._defined:
            try:
                exports = read_exports(path)
            except Exception:
                return
            if exports is not None:
                self._defined[key] = exports

    def missing(self, imports, ext_path: str, closure_objects: dict, torch_paths, read_symbols,
                read_exports=None) -> list:
        """The ``imports`` no object of the closure defines.

        Only torch's own libraries and the objects that link a torch library themselves can
        define a c10/at/torch symbol (c10 is torch's; one defines it by including its headers
        and building against it), so the CUDA and system libraries of the closure, gigabytes
        in a CUDA torch, are not read."""
        torch_dirs = {os.path.dirname(p) for p in torch_paths}
        ordered = sorted((p for p in closure_objects if p != ext_path
                          and (os.path.dirname(p) in torch_dirs or _links_torch(closure_objects[p]))),
                         key=lambda p: (os.path.dirname(p) not in torch_dirs, p))
        left = set(imports)
        for path in ordered:
            if not left:
                break
            info = closure_objects[path]
            key = self._key(path)
            if not info.symbols and read_exports is not None:
                self._read_exports(key, path, read_exports)
            if key not in self._defined and not info.symbols:
                try:
                    info = read_symbols(path)
                except Exception:  # an unreadable object is the loader rules' finding, not ours
                    continue
            left -= self.defined(path, info)
        return sorted(left)

    def tables(self, path: str) -> tuple:
        """(names ``path`` defines, its strong undefined names), every name, read once."""
        key = self._key(path)
        known = self._tables.get(key)
        if known is None:
            known = self._tables[key] = _all_symbols(path)
        return known

    def unbound_others(self, ext_path: str, closure_objects: dict, torch_paths) -> list:
        """The strong undefined names of ``ext_path`` outside the c10/at/torch namespaces and
        the Python C API that no object loaded with it defines: ld.so binds every one at an
        RTLD_NOW dlopen (Python's import), whatever its name, so one missing fails the import
        with "undefined symbol".  The interpreter provides the Py*/_Py* names (the C API's
        reserved prefixes); the loader rules judge those with the interpreter in scope."""
        _defined, undefined = self.tables(ext_path)
        left = {name for name in undefined
                if not name.startswith(TORCH_PREFIXES) and not name.startswith(_PYTHON_API)}
        if not left:
            return []
        torch_dirs = {os.path.dirname(p) for p in torch_paths}
        # torch's own libraries first: they define nearly every name a torch extension imports
        # besides libc's and libstdc++'s, so the CUDA libraries are rarely read at all
        ordered = sorted((p for p in closure_objects if p != ext_path),
                         key=lambda p: (os.path.dirname(p) not in torch_dirs, _size(p), p))
        for path in ordered:
            left -= self.tables(path)[0]
            if not left:
                return []
        return sorted(left)

    def abi(self, path: str) -> str | None:
        if path not in self._abi:
            try:
                info = read_elf(path, symbols=TORCH_PREFIXES)  # only these names are judged
                names = (s.name for s in info.symbols if s.defined and s.binding != "LOCAL")
                self._abi[path] = torch_abi_of(names)[0]
            except Exception:  # an unreadable torch is reported by the loader rules, not here
                self._abi[path] = None
        return self._abi[path]


def extension_facts(ext_path: str, closure_objects: dict, torch_paths, cache: "TorchAbiCache",
                    read_symbols, torch_source: str = "", read_exports=None) -> list:
    """Facts about an extension judged against the torch its closure loads.

    - cxx_abi: which std::string mangling its c10/at/torch imports use, against torch's;
    - torch_symbols: the c10/at/torch functions it calls that nothing in its closure defines.
      Python imports extensions with RTLD_NOW (sys.getdlopenflags()), so one such symbol
      fails the import with "undefined symbol: _ZN3c10...".

    ``closure_objects``: path -> ElfInfo of everything loaded with it (torch's libraries
    included); ``read_symbols(path)`` -> ElfInfo with symbols (the resolver's cached reader;
    reading only the TORCH_PREFIXES names is enough: nothing else is looked at);
    ``read_exports(path)`` -> the frozenset TorchAbiCache.defined would make of it, or None
    (read_symbols is asked then).
    """
    if _same_directory(ext_path, torch_paths):
        return []  # torch's own libraries (libtorch_cuda beside libc10) are torch itself
    try:
        ext_info = read_symbols(ext_path)
    except Exception:  # unreadable: the loader rules report it
        return []
    imports = [s.name for s in ext_info.symbols if not s.defined and s.binding != "WEAK"
               and s.name.startswith(TORCH_PREFIXES)]
    # the C functions torch exports (aoti_torch_* shims, THP* of libtorch_python) and C++
    # ones outside the c10/at/torch namespaces fail the import the same way when missing
    others = cache.unbound_others(ext_path, closure_objects, torch_paths)
    if others and _has_unresolved_needed(ext_path, ext_info, closure_objects):
        # a NEEDED entry that resolves nowhere is needed-unresolved's finding; the names that
        # library would have defined cannot be told from names nothing defines
        others = []
    if not imports and not others:
        return []
    torch_dir = os.path.dirname(os.path.dirname(sorted(torch_paths, key=lambda p: ("libc10" not in p, p))[0]))
    torch = torch_at(torch_dir, source=torch_source)
    version = torch.version if torch else "?"
    facts = []
    abi_fact = cxx_abi_fact(ext_path, ext_info, torch_paths, cache)
    mismatch = abi_fact is not None and abi_fact.data["ext_abi"] != abi_fact.data["torch_abi"]
    missing = sorted(set(cache.missing(imports, ext_path, closure_objects, torch_paths, read_symbols,
                                       read_exports)) | set(others)) if imports else others
    # The rebuild command is only ever shown with a finding (a mismatch or a missing symbol);
    # working it out asks pip's RECORDs and dpkg which package ships the file, reads that
    # the healthy majority (torch's own test programs, every extension built right) never need.
    fix = rebuild_command(ext_path, torch) if mismatch or missing else ""
    if abi_fact is not None:
        abi_fact.data.update(torch_version=version, torch_source=torch_source, fix_command=fix)
        facts.append(abi_fact)
    if missing:
        facts.append(Fact("torch_symbols", {"path": ext_path},
                          {"count": len(missing), "examples": missing[:5], "torch_version": version,
                           "torch_path": torch_dir, "torch_source": torch_source,
                           "explained_by_abi": bool(mismatch), "fix_command": fix},
                          source="collect.cxxabi"))
    return facts


def _has_unresolved_needed(ext_path: str, ext_info, closure_objects: dict) -> bool:
    """Whether a NEEDED entry of the extension or of anything loaded with it names no object
    of the closure (by SONAME, or file name as ld.so matches a name it found on its path)."""
    provided = set()
    for path, info in closure_objects.items():
        provided.add(os.path.basename(path))
        if getattr(info, "soname", None):
            provided.add(info.soname)
    provided.add(os.path.basename(ext_path))
    infos = [ext_info, *closure_objects.values()]
    return any(name not in provided for info in infos for name in (getattr(info, "needed", None) or ()))


def cxx_abi_fact(ext_path: str, ext_info, torch_paths, cache: TorchAbiCache) -> Fact | None:
    """Compare the extension's torch imports with torch's own exports; None when unknown."""
    imports = [s.name for s in ext_info.symbols
               if not s.defined and s.name.startswith(TORCH_PREFIXES)]
    ext_abi, example = abi_of(imports)
    if ext_abi is None:
        return None
    if _same_directory(ext_path, torch_paths):
        return None  # torch's own libraries (libtorch_cuda beside libc10) are torch itself
    for torch_path in sorted(torch_paths, key=lambda p: ("libc10" not in p, p)):
        torch_abi = cache.abi(torch_path)
        if torch_abi is not None:
            return Fact("cxx_abi", {"path": ext_path},
                        {"ext_abi": ext_abi, "torch_abi": torch_abi, "torch_path": torch_path,
                         "example_symbol": example},
                        source="collect.cxxabi")
    return None


# The Python C API's reserved prefixes (Include/Python.h: every public name is Py* or _Py*)
_PYTHON_API = ("Py", "_Py")


def _all_symbols(path: str) -> tuple:
    """(frozenset of the names ``path`` exports, frozenset of its strong undefined names);
    empty for an object that cannot be read (the loader rules report it)."""
    from ..elf import fastread

    tables = fastread.symbol_tables(path) if fastread.enabled() else None
    if isinstance(tables, tuple):
        defs, undefs = tables
        return frozenset(defs), frozenset(name for name, _version in undefs)
    try:
        info = read_elf(path, symbols=True)
    except Exception:  # noqa: BLE001 - unreadable: reported by the loader rules
        return frozenset(), frozenset()
    return (frozenset(s.name for s in info.symbols if s.defined and s.binding != "LOCAL" and not s.hidden),
            frozenset(s.name for s in info.symbols if not s.defined and s.binding != "WEAK"))


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _links_torch(info) -> bool:
    return any(name.startswith(("libc10", "libtorch")) for name in info.needed)


def _same_directory(path: str, others) -> bool:
    here = _real_dir(path)
    return any(_real_dir(other) == here for other in others)


@functools.lru_cache(maxsize=4096)
def _real_dir(path: str) -> str:
    """realpath's directory, once per path per process: torch's libraries are asked about
    for every extension and test program (a check runs in its own process; the agent's
    scans run in a child each)."""
    return os.path.dirname(inputs.realpath(path))
