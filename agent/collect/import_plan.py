"""Which extension modules `import a, b, c` would dlopen, found on disk without importing.

Each import is followed statically: a module's top-level statements are walked in order, as
Python executes them (class bodies run, function bodies do not, a package function called
at import time that loads a library runs), and every `import`/`from ... import` is resolved
the way importlib's PathFinder/FileFinder does (a directory with __init__ wins, then
extension suffixes, then .py).  An extension module found that way is one dlopen, in
Python's order; a library loaded by path (ctypes, torch.ops.load_library) whose path is
known statically is one more.  A module that surely raises ModuleNotFoundError fails its
importers up to the first try that catches it.  What cannot be known statically is a note.
The values and tests known before running are static_values.py's.
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
from dataclasses import dataclass, field

from .static_values import (_UNKNOWN, _absolute, _argument_value, _bind, _ByName, _catches_importerror,
                            _catches_oserror, _changes_sys_path, _dl_flags, _Flags, _glob_value, _known_value,
                            _literal, _Module, _Path, _path_value, _static_test)

# annotations only (typing's TYPE_CHECKING would import typing at every start)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .python_env import Interpreter


@dataclass(frozen=True)
class ExtensionLoad:
    module: str
    path: str
    importer: str  # the name given to --imports that led here
    flags: int | None = None  # dlopen flags set by a sys.setdlopenflags() before it; None: the interpreter's
    # "import": Python's own extension loader; "ctypes": ctypes.CDLL/LoadLibrary of a path the
    # module names; "torch.ops": torch.ops/torch.classes.load_library, which wraps ctypes
    how: str = "import"
    guarded: bool = False  # inside a try whose handlers catch the OSError: a failure is not the import's


@dataclass
class ImportPlan:
    names: tuple
    loads: list = field(default_factory=list)  # ExtensionLoad in dlopen order
    missing: list = field(default_factory=list)  # (importer, module) not found on sys.path
    notes: list = field(default_factory=list)  # what static analysis cannot know
    per_name: dict = field(default_factory=dict)  # import name -> [ExtensionLoad]
    meta_answers: dict = field(default_factory=dict)  # top-level name -> the meta-path finders' answer
    raised_in: dict = field(default_factory=dict)  # import name -> the module whose import statement raised


@dataclass(frozen=True)
class _Spec:
    name: str
    kind: str  # package | source | extension | namespace | builtin
    origin: str | None
    search: tuple  # submodule_search_locations


class _Finder:
    """importlib's PathFinder + FileFinder over directories (zip entries are not read)."""

    def __init__(self, interp: Interpreter):
        self.interp = interp
        self._listing: dict = {}
        self.cwd = os.getcwd()
        self.meta: _MetaPathAsker | None = None
        self.meta_answers: dict = {}  # name -> what the meta-path finders answered

    def _names(self, directory: str):
        if directory not in self._listing:
            try:
                self._listing[directory] = frozenset(os.listdir(directory or "."))
            except OSError:
                self._listing[directory] = frozenset()
        return self._listing[directory]

    def find(self, fullname: str, search: tuple | None) -> _Spec | None:
        tail = fullname.rpartition(".")[2]
        if search is None:
            if fullname in self.interp.builtins:
                return _Spec(fullname, "builtin", None, ())
            search = self.interp.path
        portions = []
        for entry in search:
            directory = entry or self.cwd
            if not os.path.isabs(directory):
                directory = os.path.join(self.cwd, directory)
            names = self._names(directory)
            if not names:
                continue
            if tail in names and os.path.isdir(os.path.join(directory, tail)):
                pkg = os.path.join(directory, tail)
                inner = self._names(pkg)
                for suffix in self.interp.suffixes + (".py", ".pyc"):
                    if "__init__" + suffix in inner:
                        kind = "extension" if suffix in self.interp.suffixes else "package"
                        return _Spec(fullname, kind if kind == "extension" else "package",
                                     os.path.join(pkg, "__init__" + suffix), (pkg,))
                portions.append(pkg)
            for suffix in self.interp.suffixes:
                if tail + suffix in names:
                    return _Spec(fullname, "extension", os.path.join(directory, tail + suffix), ())
            for suffix in (".py", ".pyc"):
                if tail + suffix in names:
                    return _Spec(fullname, "source" if suffix == ".py" else "bytecode",
                                 os.path.join(directory, tail + suffix), ())
        if portions:
            return _Spec(fullname, "namespace", None, tuple(portions))
        if "." not in fullname:
            return self._meta_path(fullname)
        return None

    def _meta_path(self, name: str) -> _Spec | None:
        """A top-level name no sys.path directory holds may still come from a meta-path
        finder installed at start-up (pip's editable installs, setuptools' distutils shim):
        ask the interpreter's own importlib.util.find_spec, which runs the finders but no
        code of the package.  One interpreter answers every such name of the plan (a start
        of the interpreter each would cost as much as the rest of a small plan)."""
        if self.meta is None:
            self.meta = _MetaPathAsker(self.interp)
        found = self.meta.ask(name)
        self.meta_answers[name] = found
        return _spec_from_meta(name, found, self.interp)

    def close(self) -> None:
        if self.meta is not None:
            self.meta.close()
            self.meta = None


_META_SCRIPT = (
    "import sys, importlib.util as u\n"
    "for line in sys.stdin:\n"
    "    try:\n"
    "        s = u.find_spec(line.strip())\n"
    "    except Exception:\n"
    "        s = None\n"
    "    print('seedance-spec:', ascii(None if s is None else (s.origin, None if s.submodule_search_locations "
    "is None else list(s.submodule_search_locations))), flush=True)\n")
# what the interpreter's start-up prints (a sitecustomize banner, a finder's chatter) is not
# an answer: each answer carries this mark
_META_MARK = b"seedance-spec: "


class _MetaPathAsker:
    """The interpreter, started once, answering find_spec(NAME) for one name per line; it
    ends when closed, or when the asker is dropped (a finder used on its own)."""

    def __init__(self, interp: Interpreter, timeout: float = 30):
        import weakref

        from . import inputs

        self.timeout = timeout
        try:
            # not an input the prediction cache could record: it keeps these answers and asks
            # the finders again before it believes an entry (prediction_cache.py)
            with inputs.paused():
                # unbuffered: a line read ahead into a buffer would hide from select()
                self.proc = subprocess.Popen([interp.python, "-c", _META_SCRIPT], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                             env=interp.env, bufsize=0)
        except OSError:
            self.proc = None
        self._end = weakref.finalize(self, _end_asker, self.proc)

    def ask(self, name: str):
        """(origin, locations) as find_spec gives them, or None (not found, or no answer)."""
        import select
        if self.proc is None:
            return None
        try:
            self.proc.stdin.write(name.encode("utf-8", "surrogateescape") + b"\n")
            line = b""
            while not line.startswith(_META_MARK):
                ready, _w, _x = select.select([self.proc.stdout], [], [], self.timeout)
                line = self.proc.stdout.readline() if ready else b""
                if not line:
                    raise OSError("no answer")
            found = ast.literal_eval(line[len(_META_MARK):].decode("utf-8", "surrogateescape").strip())
        except (OSError, ValueError, SyntaxError):
            self.close()  # a finder that hangs or dies answers nothing more
            return None
        return found if isinstance(found, tuple) and len(found) == 2 else None

    def close(self) -> None:
        self.proc = None
        self._end()


def _end_asker(proc) -> None:
    """End of input: the interpreter's loop ends and it exits (killed if it does not)."""
    if proc is None:
        return
    try:
        proc.stdin.close()
        proc.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()
    proc.stdout.close()


def meta_path_answers(interp: Interpreter, names) -> dict:
    """name -> what the interpreter's meta-path finders answer for it now (_Finder._meta_path)."""
    asker = _MetaPathAsker(interp)
    try:
        return {name: asker.ask(name) for name in names}
    finally:
        asker.close()


def _spec_from_meta(name: str, found, interp: Interpreter) -> _Spec | None:
    if not isinstance(found, tuple):
        return None
    origin, locations = found
    search = tuple(locations) if locations is not None else ()
    if not isinstance(origin, str) or origin in ("built-in", "frozen"):
        return _Spec(name, "namespace" if locations is not None else "builtin", None, search)
    if origin.endswith(tuple(interp.suffixes)):
        return _Spec(name, "extension", origin, search)
    kind = "package" if locations is not None else ("source" if origin.endswith(".py") else "bytecode")
    return _Spec(name, kind, origin, search)


_DYNAMIC_CALLS = {"CDLL", "LoadLibrary", "PyDLL", "setdlopenflags", "dlopen", "load_library",
                  "_load_global_deps", "_preload_cuda_deps", "load_dynamic"}


class _Planner:
    def __init__(self, interp: Interpreter):
        self.interp = interp
        self.finder = _Finder(interp)
        self.done: dict = {}  # module -> _Spec or None
        self.plan: ImportPlan | None = None
        self.importer = ""
        self.flags: int | None = None  # after a static sys.setdlopenflags(...)
        self._functions: dict = {}  # module origin -> {name: FunctionDef}
        self._called: set = set()  # (origin, function) already walked
        self._known: dict = {}  # module origin -> {name: value known before running}
        self._sources: dict = {}  # module origin -> (whole source, {def line: body end}) while skimmed
        self._calls: dict = {}  # module origin -> where its source calls what the planner acts on
        self._parsed_text = b""  # the text the last tree was parsed from
        self._wholes: dict = {}  # module origin -> {def line: the function parsed with its body}
        # the bytecode of a CPython like the one running seedance shows where function bodies are
        # (pysource.py); another implementation or version is parsed whole
        self._cache_tag = (f"cpython-{interp.version[0]}{interp.version[1]}"
                           if interp.implementation == "cpython" and len(interp.version) >= 2 else "")
        self._guarded = 0  # depth of try bodies whose handlers catch OSError
        # A module whose body raises is not imported: Python removes it from sys.modules and
        # the statement that imported it raises the same ModuleNotFoundError, up to the first
        # try that catches it.  Only a failure that surely happens is followed that way: an
        # import of a top-level name no finder knows, in statements that surely run.
        self.failed: dict = {}  # module -> the top-level name whose absence made its body raise
        self.raisers: dict = {}  # module in failed -> the module whose own import statement raised
        self.last_missing = ""  # the module Python names when import_name() returned False
        self.last_raiser = ""  # and the module whose statement raised it ('': not found at all)
        self._raised = ""  # set while a ModuleNotFoundError unwinds the module being walked
        self._raiser = ""
        self._uncertain = 0  # depth of statements that may not run (an `if` not known statically)
        self.path_changed = False  # a module changed sys.path: the finder's path is not the interpreter's
        # module -> {function: (file, def line)} of its functions that load a library by path
        self._path_loaders: dict = {}
        self._imported_loaders: dict = {}  # module file -> {name: (file, def line)} imported from others
        self._package_names: dict = {}  # module file -> its functions' names and those it imports from its package
        self._origin_names: dict = {}  # module file -> its module name
        self._ran: set = set()  # (file, def line, arguments) of loader functions walked
        self._loader_bodies: dict = {}  # file -> {def line: function} of the loader functions' files
        self._in_function = 0  # depth of loader functions being walked
        self._named_paths: dict = {}  # module file -> {name: _ByName} bound by `x = package_function("NAME")`

    def import_name(self, fullname: str) -> bool:
        """Import ``fullname`` and its parents; False when it is not found."""
        parts = fullname.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name in self.interp.modules:
                continue
            if name in self.failed:  # not in sys.modules: a second import runs it, and fails, again
                self.last_missing, self.last_raiser = self.failed[name], self.raisers[name]
                return False
            self.last_raiser = ""
            if name in self.done:
                if self.done[name] is None:
                    self.last_missing = name
                    return False
                continue
            parent = self.done.get(".".join(parts[:i - 1])) if i > 1 else None
            if i > 1 and parent is None and ".".join(parts[:i - 1]) not in self.interp.modules:
                self.last_missing = ".".join(parts[:i - 1])
                return False
            search = parent.search if parent is not None else None
            if i > 1 and parent is None:
                search = self._startup_search(".".join(parts[:i - 1]))
            spec = self.finder.find(name, search)
            self.done[name] = spec
            if spec is None:
                self.last_missing = name
                return False
            raised, raiser = self._exec(spec)
            if raised:
                self.failed[name], self.raisers[name] = raised, raiser
                self.last_missing, self.last_raiser = raised, raiser
                return False
        return True

    def _raise_here(self, module: str) -> bool:
        """After an import that failed: whether the statement surely raises (and the rest of
        ``module``'s body does not run).  A dotted name no directory holds may still come from
        a package's own import machinery (six.moves), so only a top-level one counts."""
        missing = self.last_missing
        if self._uncertain or self._in_function or self.path_changed or not missing or "." in missing:
            return False
        self._raised, self._raiser = missing, self.last_raiser or module
        return True

    def _startup_search(self, package: str) -> tuple:
        """__path__ of a package imported at start-up (found again on sys.path)."""
        spec = self.finder.find(package, None if "." not in package else self._startup_search(
            package.rpartition(".")[0]))
        return spec.search if spec is not None else ()

    def _exec(self, spec: _Spec) -> tuple:
        """Walk the module's body as Python runs it: (the missing top-level name, the module
        whose import statement raised) when the body surely raises ModuleNotFoundError,
        else ('', '')."""
        if spec.kind == "extension":
            load = ExtensionLoad(spec.name, spec.origin, self.importer, self.flags)
            self.plan.loads.append(load)
            self.plan.per_name.setdefault(self.importer, []).append(load)
            return "", ""
        if spec.kind == "bytecode":
            self.plan.notes.append(f"{spec.origin}: bytecode only; its imports are not read")
            return "", ""
        if spec.kind not in ("package", "source"):
            return "", ""
        tree = self._parse(spec.origin)
        if tree is None:
            return "", ""
        package = spec.name if spec.kind == "package" else spec.name.rpartition(".")[0]
        # functions defined at module level: a top-level call to one runs its body at import
        # time (matplotlib's _check_versions() does `from . import ft2font`)
        outer = self._functions.get(spec.origin)  # the same file imported under another name
        self._functions[spec.origin] = {node.name: node for node in tree.body
                                        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self._calls[spec.origin] = _CallSites.of(self._parsed_text, self._functions[spec.origin])
        loaders = self._loader_functions(spec.origin)
        if loaders:
            self._path_loaders[spec.name] = loaders
        self._origin_names[spec.origin] = spec.name
        self._package_names.setdefault(spec.origin, set()).update(self._functions[spec.origin])
        self._known[spec.origin] = {}
        # a module's body runs whole however its importer reached the import
        outer_state = (self._uncertain, self._raised, self._raiser, self._in_function)
        self._uncertain, self._raised, self._raiser, self._in_function = 0, "", "", 0
        try:
            self._walk(tree.body, spec, package)
            return self._raised, self._raiser if self._raised else ""
        finally:
            self._uncertain, self._raised, self._raiser, self._in_function = outer_state
            # a module runs once (importlib's sys.modules check): once walked, nothing reads
            # its tree or its functions again, and a package the size of torch is ~1,000
            # modules whose trees together would outweigh the real import's whole process
            if outer is None:
                del self._functions[spec.origin]
                self._sources.pop(spec.origin, None)
                self._calls.pop(spec.origin, None)
                self._wholes.pop(spec.origin, None)
            else:
                self._functions[spec.origin] = outer

    def _parse(self, path: str):
        """The module's tree; its function bodies left out where its current .pyc shows
        them (the whole source is kept to read a body that runs at import time)."""
        from . import pysource

        try:
            with open(path, "rb") as handle:
                source = handle.read()
        except OSError:
            self.plan.notes.append(f"{path}: cannot be parsed; its imports are not read")
            return None
        skim = pysource.skim(path, source, self._cache_tag) if self._cache_tag else None
        if skim is not None:
            light, ends = skim
            try:
                tree = ast.parse(light, filename=path)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                tree = None  # a body the bytecode placed wrongly for this source: read it whole
            if tree is not None:
                self._sources[path] = (source, ends)
                self._parsed_text = light
                return tree
        try:
            tree = ast.parse(source, filename=path)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            self.plan.notes.append(f"{path}: cannot be parsed; its imports are not read")
            return None
        self._parsed_text = source
        return tree

    def _whole_function(self, origin: str, node):
        """``node`` (a module function of ``origin``) with its body: one called at import
        time runs its body, so a left-out body is parsed, alone, the first time it is."""
        source, ends = self._sources.get(origin, (None, {}))
        end = ends.get(node.lineno)
        if source is None or end is None or node.col_offset != 0:
            return node
        done = self._wholes.setdefault(origin, {})
        if node.lineno in done:  # one node per function: a recursive call is the same function
            return done[node.lineno]
        from . import pysource

        try:
            whole = ast.parse(pysource.function_source(source, node.lineno, end), filename=origin).body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return node
        if len(whole) != 1 or not isinstance(whole[0], (ast.FunctionDef, ast.AsyncFunctionDef)) \
                or whole[0].name != node.name:
            return node
        ast.increment_lineno(whole[0], node.lineno - 1)  # the lines of the module, in notes
        done[node.lineno] = whole[0]
        functions = self._functions.get(origin, {})
        for key, value in list(functions.items()):  # its aliases (`a = f`) too
            if value is node:
                functions[key] = whole[0]
        return whole[0]

    def _walk(self, body, spec: _Spec, package: str) -> bool:
        """Walk statements in order; returns False when an import in them was not found
        (so a `try:` body would raise ImportError and its handlers run)."""
        ok = True
        for stmt in body:
            if self._raised:
                return False  # Python stopped at the statement that raised
            if isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if not self.import_name(alias.name):
                        ok = False
                        if self._raise_here(spec.name):
                            return False
                        continue
                    # `import multiprocessing as mp`: a module object, never None, for the
                    # tests below it (`if mp is not None:`)
                    bound = alias.asname or alias.name.partition(".")[0]
                    self._learn(spec.origin, bound, _Module(alias.asname and alias.name or bound))
            elif isinstance(stmt, ast.ImportFrom):
                base = _absolute(stmt.module, stmt.level, package)
                if base is None:
                    continue
                if not self.import_name(base):
                    ok = False
                    if self._raise_here(spec.name):
                        return False
                    continue
                base_spec = self.done.get(base)
                source_known = self._known.get(base_spec.origin, {}) if base_spec is not None else {}
                loaders = self._path_loaders.get(base, {})
                if base.partition(".")[0] == spec.name.partition(".")[0]:
                    self._package_names.setdefault(spec.origin, set()).update(
                        alias.asname or alias.name for alias in stmt.names)
                for alias in stmt.names:
                    if alias.name == "*":
                        continue
                    if alias.name in loaders:
                        # `from .utils import _load_lib`: its calls here load a library too
                        self._imported_loaders.setdefault(spec.origin, {})[alias.asname or alias.name] = \
                            loaders[alias.name]
                        sites = self._calls.get(spec.origin)
                        if sites is not None:
                            sites.watch(alias.asname or alias.name)
                    if alias.name in source_known:
                        # `from torch._utils_internal import USE_RTLD_GLOBAL_WITH_LIBTORCH`:
                        # a constant of the module it comes from decides this module's tests
                        self._known.setdefault(spec.origin, {})[alias.asname or alias.name] = \
                            source_known[alias.name]
                    sub = f"{base}.{alias.name}"
                    if sub in self.failed:
                        self.last_missing = self.failed[sub]
                        ok = False
                        if self._raise_here(spec.name):
                            return False
                        continue
                    if sub in self.done or sub in self.interp.modules:
                        continue
                    search = base_spec.search if base_spec is not None else ()
                    if search and self.finder.find(sub, search) is not None and not self.import_name(sub):
                        ok = False
                        if sub in self.failed and self._raise_here(spec.name):
                            return False
            elif isinstance(stmt, ast.If):
                self._note_dynamic(stmt.test, spec, package)  # `if _load_library("_C"):` runs the call
                verdict = _static_test(stmt.test, self.interp, self._known.get(spec.origin))
                if verdict is not False:
                    ok = self._maybe(verdict is None, stmt.body, spec, package) and ok
                if verdict is not True:
                    ok = self._maybe(verdict is None, stmt.orelse, spec, package) and ok
            elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
                ok = self._try(stmt, spec, package) and ok
            elif isinstance(stmt, ast.With):
                # `with contextlib.suppress(ImportError):` swallows what its body raises
                suppressed = any(isinstance(item.context_expr, ast.Call)
                                 and ast.unparse(item.context_expr.func).endswith("suppress")
                                 for item in stmt.items)
                ok = self._maybe(suppressed, stmt.body, spec, package) and ok
                if suppressed:
                    self._raised = ""
            elif isinstance(stmt, ast.ClassDef):
                if stmt.decorator_list:
                    self._operator_uses(stmt, spec)
                ok = self._walk(stmt.body, spec, package) and ok
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if stmt.decorator_list:
                    self._operator_uses(stmt, spec)
                continue
            elif isinstance(stmt, ast.For) and isinstance(stmt.target, (ast.Name, ast.Tuple)):
                # `for name, minver in [("cycler", "0.10"), ...]: import_module(name)`: a loop
                # over a literal runs its body once per item, in order
                items = _literal(stmt.iter)
                if items is None:
                    self._note_dynamic(stmt.iter, spec, package)
                    ok = self._maybe(True, stmt.body, spec, package) and ok
                    continue
                known = self._known.setdefault(spec.origin, {})
                for item in items:
                    _bind(stmt.target, item, known)
                    ok = self._walk(stmt.body, spec, package) and ok
            elif isinstance(stmt, ast.While):
                ok = self._maybe(True, stmt.body, spec, package) and ok
            else:
                if not self.path_changed and _changes_sys_path(stmt):
                    # setuptools puts its _vendor directory on sys.path before importing
                    # what it vendors: from here on a name no directory holds may be found
                    self.path_changed = True
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                    value = _known_value(stmt.value, self._known.get(spec.origin, {}))
                    if isinstance(stmt.value, ast.IfExp):
                        # `suffix = ".pyd" if os.name == "nt" else ".so"`
                        verdict = _static_test(stmt.value.test, self.interp, self._known.get(spec.origin))
                        if verdict is not None:
                            value = _known_value(stmt.value.body if verdict else stmt.value.orelse,
                                                 self._known.get(spec.origin, {}))
                    if value is _UNKNOWN and isinstance(stmt.value, ast.Call):
                        # `paths = list(_LIB_DIR.glob(f"{lib}*{suffix}"))` (torchaudio): the one
                        # file it matches on disk, or not known
                        value = _glob_value(stmt.value, self._known.get(spec.origin, {}), spec.origin)
                    if isinstance(stmt.value, ast.Call) and ast.unparse(stmt.value.func).endswith("getdlopenflags"):
                        # `old_flags = sys.getdlopenflags()` before a setdlopenflags(): the
                        # later setdlopenflags(old_flags) puts these back
                        value = _Flags(self.interp.dlopenflags if self.flags is None else self.flags)
                    if value is _UNKNOWN:
                        # `_lib = os.path.join(os.path.dirname(__file__), "lib")`: a path
                        # a later ctypes.CDLL or torch.ops.load_library names
                        value = _path_value(stmt.value, self._known.get(spec.origin, {}), spec.origin)
                        value = _UNKNOWN if value is None else _Path(value)
                    # `lib_path = _get_extension_path("_C")` (torchvision): the package's own
                    # function turns a library's name into its path, which only a load by
                    # path reads (never an `if`: what the function returns is not known)
                    named = self._package_call(stmt.value, spec) if value is _UNKNOWN else _UNKNOWN
                    paths = self._named_paths.setdefault(spec.origin, {})
                    if named is _UNKNOWN or self._uncertain:
                        paths.pop(stmt.targets[0].id, None)
                    else:
                        paths[stmt.targets[0].id] = named
                    self._learn(spec.origin, stmt.targets[0].id, value)
                    functions = self._functions.get(spec.origin, {})
                    if isinstance(stmt.value, ast.Name) and stmt.value.id in functions:
                        # `__get_hash = __get_openssl_constructor` (hashlib): calls through
                        # the alias run that function
                        functions.setdefault(stmt.targets[0].id, functions[stmt.value.id])
                        sites = self._calls.get(spec.origin)
                        if sites is not None:
                            sites.watch(stmt.targets[0].id)
                self._note_dynamic(stmt, spec, package)
        return ok

    def _operator_uses(self, stmt, spec: _Spec) -> None:
        """`@torch.library.register_fake("torchvision::nms")` on a module-level function: the
        decorator runs at import time and raises RuntimeError when the operator was never
        registered (its library failed to load): one more step of the import, in order."""
        if self._uncertain:
            return
        for decorator in stmt.decorator_list:
            if not isinstance(decorator, ast.Call) or not decorator.args:
                continue
            func = ast.unparse(decorator.func)
            first = decorator.args[0]
            if func.rpartition(".")[2] not in _NEEDS_OPERATOR or not isinstance(first, ast.Constant) \
                    or not isinstance(first.value, str) or "::" not in first.value:
                continue
            if "." in func and "library" not in func:
                continue  # another library's register_kernel, not torch.library's
            use = ExtensionLoad(f"{spec.name}: @{func}", first.value.split(".")[0], self.importer, None, "operator")
            self.plan.per_name.setdefault(self.importer, []).append(use)

    def _learn(self, origin: str, name: str, value) -> None:
        """``name = value`` ran: a value known from now on, unless the statement may not have
        run (then the name may hold either value: neither is known) or its value is not known."""
        known = self._known.setdefault(origin, {})
        if value is _UNKNOWN or self._uncertain:
            known.pop(name, None)
        else:
            known[name] = value

    def _maybe(self, uncertain: bool, body, spec: _Spec, package: str) -> bool:
        """Walk statements that may not run (``uncertain``): what fails in them does not
        surely raise."""
        self._uncertain += uncertain
        try:
            return self._walk(body, spec, package)
        finally:
            self._uncertain -= uncertain

    def _try(self, stmt, spec: _Spec, package: str) -> bool:
        catches = any(_catches_oserror(handler.type) for handler in stmt.handlers)
        self._guarded += catches
        try:
            body_ok = self._walk(stmt.body, spec, package)
        finally:
            self._guarded -= catches
        raised, ok = self._raised, True
        if raised:
            handler = next((h for h in stmt.handlers if _catches_importerror(h.type)), None)
            self._raised = ""
            if handler is not None:
                # the first handler that matches runs; one that raises again (`raise
                # ImportError("install X") from e`) ends the module as surely
                ok = self._walk(handler.body, spec, package)
                if not self._raised and any(isinstance(st, ast.Raise) for st in handler.body):
                    self._raised = raised
            else:
                self._raised = raised
        elif not body_ok:
            # an import that may fail: its handlers may run
            for handler in stmt.handlers:
                self._maybe(True, handler.body, spec, package)
        else:
            ok = self._walk(stmt.orelse, spec, package)
        # `finally:` runs whether or not an error is on its way out, which goes on after it
        pending, self._raised = self._raised, ""
        self._walk(stmt.finalbody, spec, package)
        self._raised = self._raised or pending
        return ok and not self._raised

    def _imports_inside(self, func, origin: str, skip: set, depth: int = 0) -> bool:
        """Whether ``func`` (or a module function it calls, a few levels down) imports
        anything besides the statements in ``skip``."""
        functions = self._functions.get(origin, {})
        for node in ast.walk(func):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip:
                return True
            if depth < 3 and isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                callee = functions.get(node.func.id)
                if callee is not None:
                    callee = self._whole_function(origin, callee)
                if callee is not None and callee is not func and self._imports_inside(callee, origin, skip, depth + 1):
                    return True
        return False

    def _note_dynamic(self, stmt, spec: _Spec, package: str = "") -> None:
        sites = self._calls.get(spec.origin)
        if sites is not None and not sites.within(stmt.lineno, stmt.end_lineno):
            return  # nothing below acts on a call in these lines: no need to walk their nodes
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                local = self._functions.get(spec.origin, {}).get(name) if isinstance(func, ast.Name) else None
                if isinstance(func, ast.Name):
                    loader = self._path_loaders.get(spec.name, {}).get(name) or \
                        self._imported_loaders.get(spec.origin, {}).get(name)
                    if loader is not None:
                        self._run_loader(node, loader, spec)
                        continue
                if local is not None and (spec.origin, name) not in self._called:
                    local = self._whole_function(spec.origin, local)
                    # only the function's unconditional imports: its branches depend on
                    # arguments and state (following them over-predicted readline,
                    # subprocess, ... in numpy's and the stdlib's start-up checks)
                    self._called.add((spec.origin, name))
                    direct = [st for st in local.body if isinstance(st, (ast.Import, ast.ImportFrom))]
                    self._maybe(True, direct, spec, package)
                    if self._imports_inside(local, spec.origin, set(map(id, direct))):
                        self.plan.notes.append(f"{spec.origin}:{local.lineno}: {name}() runs at import time "
                                               "and imports under conditions not followed statically")
                    continue
                if name == "import_module" and node.args and isinstance(node.args[0], ast.Name):
                    value = self._known.get(spec.origin, {}).get(node.args[0].id)
                    if isinstance(value, str) and not value.startswith("."):
                        self.import_name(value)
                        continue
                if name == "setdlopenflags" and node.args:
                    value = _dl_flags(node.args[0], self._known.get(spec.origin, {}))
                    if value is not None:
                        self.flags = value  # every later extension import uses these
                        continue
                if name in _PATH_LOADS and self._load_by_path(node, name, spec):
                    continue
                if name == "import_module" and node.args and isinstance(node.args[0], ast.Constant) \
                        and isinstance(node.args[0].value, str) and not node.args[0].value.startswith("."):
                    self.import_name(node.args[0].value)
                elif name in _DYNAMIC_CALLS or name in ("import_module", "__import__"):
                    self.plan.notes.append(f"{spec.origin}:{node.lineno}: {name}() runs at import time; "
                                           "what it loads is not known statically (use --observe)")


    def _package_call(self, node, spec: _Spec):
        """_ByName(NAME) when ``node`` calls a function of the module's own package (defined
        there, or imported from a module of the same top-level package) with one argument,
        a string known before running; else _UNKNOWN."""
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1
                and not node.keywords):
            return _UNKNOWN
        value = _argument_value(node.args[0], self._known.get(spec.origin, {}))
        if not isinstance(value, str) or not (node.func.id in self._functions.get(spec.origin, {}) or
                                              node.func.id in self._package_names.get(spec.origin, ())):
            return _UNKNOWN
        return _ByName(value)

    def _loader_functions(self, origin: str) -> dict:
        """{name: (file, def line)} of the module's functions whose body calls ctypes.CDLL,
        LoadLibrary or torch.ops.load_library (found in the source text, bodies unparsed)."""
        functions = self._functions.get(origin, {})
        # the whole source: the tree walked may have left the function bodies out
        text = self._sources.get(origin, (None, {}))[0] or self._parsed_text
        if not functions or _PATH_LOAD_TEXT.search(text) is None:
            return {}
        if not text.isascii():
            return {}
        sites = _CallSites(text, None, [])  # only the path loads' lines, not every name acted on
        lines = sorted(line for call in _PATH_LOADS for line in sites._calls_of(call))
        if not lines:
            return {}
        import bisect

        ends = self._sources.get(origin, (None, {}))[1]
        found = {}
        for name, node in functions.items():
            end = ends.get(node.lineno) or getattr(node, "end_lineno", None) or node.lineno
            index = bisect.bisect_left(lines, node.lineno)
            if index < len(lines) and lines[index] <= end:
                found[name] = (origin, node.lineno)
        return found

    def _run_loader(self, call, loader: tuple, spec: _Spec) -> None:
        """`_load_library("_C")` (torchvision), `_load_lib("libtorchaudio")` (torchaudio),
        `load_image_library()` (torchcodec): a package function, called at import time,
        that loads a library by path.  Its body is walked as it runs, its parameters bound
        to the call's known arguments: the path it loads is found where it is known."""
        origin, line = loader
        known = self._known.get(spec.origin, {})
        args = tuple(_argument_value(arg, known) for arg in call.args)
        key = (origin, line, args)
        if key in self._ran or len(self._ran) > 256:
            return
        self._ran.add(key)
        if origin not in self._loader_bodies:  # each file parsed whole once, however many calls
            self._loader_bodies[origin] = _functions_at(origin)
        whole = self._loader_bodies[origin].get(line)
        if whole is None:
            return
        bound = {param.arg: value for param, value in zip(whole.args.args, args) if value is not _UNKNOWN}
        module = self._origin_names.get(origin, spec.name)
        # the module's call sites were found in its text without function bodies: the body
        # walked here is read whole
        saved = (self._known.get(origin), self._named_paths.get(origin), self._calls.get(origin))
        # the function reads its module's globals (torchaudio's _LIB_DIR) and its parameters
        self._known[origin], self._named_paths[origin] = {**(saved[0] or {}), **bound}, {}
        self._calls.pop(origin, None)
        # the body runs in order, as a module's does; what fails in it is the caller's
        # business (its own try, its return value), never a sure failure of the import
        outer = (self._uncertain, self._raised)
        self._uncertain, self._in_function = 0, self._in_function + 1
        # a relative import in a package's __init__ is relative to the package itself
        package = module if os.path.basename(origin).startswith("__init__.") else module.rpartition(".")[0]
        try:
            self._walk(whole.body, _Spec(module, "source", origin, ()), package)
        finally:
            (self._uncertain, self._raised), self._in_function = outer, self._in_function - 1
            for table, value in zip((self._known, self._named_paths, self._calls), saved):
                if value is None:
                    table.pop(origin, None)
                else:
                    table[origin] = value

    def _load_by_path(self, call, name: str, spec: _Spec) -> bool:
        """ctypes.CDLL(PATH[, mode]), ctypes.cdll.LoadLibrary(PATH), torch.ops.load_library(PATH)
        and torch.classes.load_library(PATH) where PATH is known statically: one more dlopen,
        in the import's order.  False when the path (or the mode) is not known."""
        func = ast.unparse(call.func)
        if name == "load_library":
            if not func.endswith(("ops.load_library", "classes.load_library")):
                return False
            how = "torch.ops"
        else:
            how = "ctypes"
        if not call.args or isinstance(call.args[0], ast.Starred):
            return False
        known = self._known.get(spec.origin, {})
        path = _path_value(call.args[0], known, spec.origin)
        named = self._named_paths.get(spec.origin, {}).get(call.args[0].id) \
            if isinstance(call.args[0], ast.Name) else self._package_call(call.args[0], spec)
        if path is None and isinstance(named, _ByName):
            path = _package_file(spec.origin, named.name, self.interp.suffixes)
        if path is None or ("/" in path and not os.path.isabs(path)):
            return False  # relative to the working directory: not known before running
        mode_node = call.args[1] if len(call.args) > 1 and name != "load_library" else next(
            (kw.value for kw in call.keywords if kw.arg == "mode"), None)
        mode = 0 if mode_node is None else _dl_flags(mode_node, known)  # ctypes.DEFAULT_MODE: RTLD_LOCAL
        if mode is None:
            return False
        if how == "torch.ops":
            path = os.path.realpath(path)  # torch._utils_internal.resolve_library_path
        # ctypes' dlopen always adds RTLD_NOW (Modules/_ctypes/callproc.c, py_dl_open)
        load = ExtensionLoad(f"{spec.name}: {func}", path, self.importer, (mode & ~0x1) | 0x2, how,
                             self._guarded > 0)
        self.plan.loads.append(load)
        self.plan.per_name.setdefault(self.importer, []).append(load)
        return True


_PATH_LOADS = {"CDLL", "PyDLL", "LoadLibrary", "load_library"}
_PATH_LOAD_TEXT = re.compile(rb"CDLL|PyDLL|LoadLibrary|load_library")  # one scan of a module's text for them
# torch.library's decorators that look the operator up when they run (torch/library.py:
# register_fake, register_kernel, register_autograd; impl_abstract before 2.4)
_NEEDS_OPERATOR = frozenset({"register_fake", "impl_abstract", "register_kernel", "register_autograd",
                             "register_vmap", "register_torch_dispatch"})
# the calls _note_dynamic acts on, besides the module's own functions
_ACTED_ON = frozenset(_DYNAMIC_CALLS | _PATH_LOADS | {"import_module", "__import__", "setdlopenflags"})
_OPEN_PAREN = re.compile(rb"\s*\(")  # after a name: where a call can be (comments and strings too: a superset)


class _CallSites:
    """The lines of a module's source where a name the planner acts on is called: the
    calls in _ACTED_ON and the module's own functions (and their aliases, once seen)."""

    def __init__(self, text: bytes, starts: list | None, lines: list):
        self.text, self.starts, self.lines = text, starts, lines

    @classmethod
    def of(cls, text: bytes, functions) -> "_CallSites | None":
        """None for a source with non-ASCII text, whose identifiers the patterns do not know."""
        if not text.isascii():
            return None
        sites = cls(text, None, [])
        for name in _ACTED_ON.union(functions):
            sites.lines.extend(sites._calls_of(name))
        sites.lines.sort()
        return sites

    def _calls_of(self, name: str) -> list:
        import bisect

        raw, text, found = name.encode("ascii"), self.text, []
        at = text.find(raw)
        while at >= 0:
            before = text[at - 1:at] if at else b" "
            # `def name(` defines, it does not call: most modules' only matches of their own
            # functions' names, and no line table is built for a module without a call
            if not (before.isalnum() or before == b"_") and _OPEN_PAREN.match(text, at + len(raw)) \
                    and text[max(at - 4, 0):at] != b"def ":
                if self.starts is None:
                    import itertools

                    self.starts = list(itertools.accumulate(map((1).__add__, map(len, text.split(b"\n"))),
                                                            initial=0))
                found.append(bisect.bisect_right(self.starts, at))
            at = text.find(raw, at + len(raw))
        return found

    def watch(self, name: str) -> None:
        """Calls through ``name`` (an alias of a module function) matter from now on."""
        if name.isascii():
            self.lines = sorted(self.lines + self._calls_of(name))

    def within(self, first: int, last: int | None) -> bool:
        import bisect

        index = bisect.bisect_left(self.lines, first)
        return index < len(self.lines) and self.lines[index] <= (last if last is not None else first)


def _functions_at(origin: str) -> dict:
    """{line of its `def`: the function} of ``origin``'s module-level functions, with their
    bodies (the module was walked with bodies left out); empty when it cannot be read.  A
    source over 8 MiB is cut there and fails to parse: no package's loader lives in such a
    file."""
    try:
        with open(origin, "rb") as handle:
            source = handle.read(8 << 20)
        tree = ast.parse(source, filename=origin)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    return {node.lineno: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _package_file(origin: str, name: str, suffixes: tuple, limit: int = 20000):
    """The single file of the top-level package around ``origin`` named NAME.so, NAME.so.N
    or NAME<extension suffix>; None when there is none or more than one."""
    if not name or "/" in name or name.startswith("."):
        return None
    top = os.path.dirname(origin)
    while os.path.exists(os.path.join(os.path.dirname(top), "__init__.py")):
        top = os.path.dirname(top)
    found, seen = [], 0
    for directory, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        seen += len(files) + len(dirs)
        if seen > limit:
            return None
        for file in files:
            if file == name + ".so" or file.startswith(name + ".so.") or \
                    any(file == name + suffix for suffix in suffixes):
                found.append(os.path.join(directory, file))
    return found[0] if len(found) == 1 else None


def plan_imports(interp: Interpreter, names) -> ImportPlan:
    """The extension modules `import <names>` dlopens, in order, and what is not knowable."""
    planner = _Planner(interp)
    plan = ImportPlan(names=tuple(names))
    planner.plan = plan
    try:
        _plan_names(planner, plan, names)
    finally:
        planner.finder.close()
    plan.meta_answers = dict(planner.finder.meta_answers)
    return plan


def _plan_names(planner, plan: ImportPlan, names) -> None:
    for name in names:
        planner.importer = name
        plan.per_name.setdefault(name, [])
        if not planner.import_name(name):
            # Python names the first part of the dotted name it could not find
            # (importlib._bootstrap._find_and_load_unlocked): `import nosuch.sub` says
            # 'nosuch'; a module whose own import of a missing name raised names that one
            parts = name.split(".")
            prefixes = (".".join(parts[:i]) for i in range(1, len(parts) + 1))
            failed = next((p for p in prefixes if p in planner.failed), "")
            prefixes = (".".join(parts[:i]) for i in range(1, len(parts) + 1))
            plan.missing.append((name, planner.failed[failed] if failed else next(
                (p for p in prefixes if p in planner.done and planner.done[p] is None), name)))
            if failed:
                plan.raised_in[name] = planner.raisers[failed]
