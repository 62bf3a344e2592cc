"""Which extension modules `import a, b, c` would dlopen, found on disk without importing.

The interpreter is asked once (``python -c``, no package imported) for what only it knows:
sys.path (PYTHONPATH and site-packages included), its extension suffixes, its dlopen flags,
the modules already imported at start-up and the executable.  Then each import is followed
statically: a module's top-level statements are walked in order, as Python executes them
(class bodies run, function bodies do not), and every `import`/`from ... import` is
resolved the way importlib's PathFinder/FileFinder does (a directory with __init__ wins,
then extension suffixes, then .py).  An extension module found that way is one dlopen, in
Python's order.  What cannot be known statically (ctypes.CDLL, importlib.import_module of a
computed name, sys.setdlopenflags, `from x import *`) is reported as a note: observe() runs
the import for real under LD_DEBUG=files, and says that it executed code.
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field

from ..model.errors import BadInput

# Printed with ascii() and read back with ast.literal_eval: json would import _json, an
# extension module of some builds, and change the very start-up state we ask about.  ascii(),
# not repr(): a non-ASCII path then reaches us as escapes whatever PYTHONIOENCODING the
# interpreter's environment sets (repr() under latin-1 printed a byte literal_eval refused).
_FACTS_SCRIPT = r"""
import sys, importlib.machinery as m
mods = []
for name, mod in list(sys.modules.items()):
    f = getattr(mod, '__file__', None)
    if isinstance(f, str) and f.endswith(tuple(m.EXTENSION_SUFFIXES)):
        mods.append((name, f))
facts = {'executable': sys.executable, 'path': list(sys.path),
 'builtins': list(sys.builtin_module_names), 'suffixes': list(m.EXTENSION_SUFFIXES),
 'dlopenflags': sys.getdlopenflags(), 'modules': list(sys.modules), 'extensions': mods,
 'platform': sys.platform, 'version': tuple(sys.version_info[:3]), 'impl': sys.implementation.name, 'exe': __import__('os').readlink('/proc/self/exe')}
import os, platform
v = sys.implementation.version
facts['markers'] = {'implementation_name': sys.implementation.name,
 'implementation_version': '%d.%d.%d' % (v.major, v.minor, v.micro) + ('' if v.releaselevel == 'final' else v.releaselevel[0] + str(v.serial)),
 'os_name': os.name, 'platform_machine': platform.machine(), 'platform_release': platform.release(),
 'platform_system': platform.system(), 'platform_version': platform.version(),
 'python_full_version': platform.python_version(), 'platform_python_implementation': platform.python_implementation(),
 'python_version': '.'.join(platform.python_version_tuple()[:2]), 'sys_platform': sys.platform}
print(ascii(facts))
"""


@dataclass(frozen=True)
class Interpreter:
    python: str
    executable: str  # the running binary (/proc/self/exe): the main program of the process
    path: tuple
    builtins: frozenset
    suffixes: tuple
    dlopenflags: int
    modules: frozenset  # imported at start-up
    startup_extensions: tuple  # ((module, path), ...) dlopened at start-up, in order
    platform: str
    version: tuple
    implementation: str = "cpython"
    env: dict | None = field(default=None, compare=False, repr=False)  # the environment it was asked in
    markers: dict | None = field(default=None, compare=False, repr=False)  # PEP 508 marker values


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


def ask_interpreter(python: str = "python3", env: dict | None = None, timeout: float = 30) -> Interpreter:
    """Start ``python`` once without importing any package; BadInput when it cannot run."""
    import shutil
    exe = python if "/" in python else shutil.which(python)
    if not exe or not os.path.exists(exe):
        raise BadInput(f"{python}: no such interpreter")
    try:
        proc = subprocess.run([exe, "-c", _FACTS_SCRIPT], capture_output=True, timeout=timeout,
                              env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BadInput(f"{python}: cannot run it as a Python interpreter ({exc.__class__.__name__})") from None
    text = proc.stdout.decode("utf-8", "surrogateescape").strip().splitlines()
    try:
        facts = ast.literal_eval(text[-1]) if proc.returncode == 0 and text else None
    except (ValueError, SyntaxError):
        facts = None
    if not isinstance(facts, dict):
        raise BadInput(f"{python}: not a Python interpreter seedance can ask (exit {proc.returncode})")
    return Interpreter(python=exe, executable=facts["exe"], path=tuple(facts["path"]),
                       builtins=frozenset(facts["builtins"]), suffixes=tuple(facts["suffixes"]),
                       dlopenflags=int(facts["dlopenflags"]), modules=frozenset(facts["modules"]),
                       startup_extensions=tuple(tuple(x) for x in facts["extensions"]),
                       platform=facts["platform"], version=tuple(facts["version"]),
                       implementation=str(facts.get("impl", "cpython")), env=env,
                       markers=facts.get("markers") if isinstance(facts.get("markers"), dict) else None)


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
            self._walk(stmt.finalbody, spec, package)
            if handler is None:
                self._raised = raised
            return ok and not self._raised
        if not body_ok:
            # an import that may fail: its handlers may run
            for handler in stmt.handlers:
                self._maybe(True, handler.body, spec, package)
        else:
            ok = self._walk(stmt.orelse, spec, package)
        saved, self._raised = self._raised, ""
        self._walk(stmt.finalbody, spec, package)
        self._raised = self._raised or saved
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
                        self._run_loader(name, node, loader, spec)
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

    def _run_loader(self, function: str, call, loader: tuple, spec: _Spec) -> None:
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
        whole = _function_at(origin, line)
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
        outer = self._uncertain
        self._uncertain, self._in_function = 0, self._in_function + 1
        try:
            self._walk(whole.body, _Spec(module, "source", origin, ()), module.rpartition(".")[0])
        finally:
            self._uncertain, self._in_function, self._raised = outer, self._in_function - 1, ""
            for table, value in zip((self._known, self._named_paths, self._calls), saved):
                if value is None:
                    table.pop(origin, None)
                else:
                    table[origin] = value
        del function

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


class _Path(str):
    """A path a module computes from its own __file__ (never a constant an `if` compares)."""


class _ByName:
    """What a package function returns for a library's name: its path, found by the
    package's own code (the one file of the package of that name, _package_file)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


class _Module:
    """A name bound by `import X [as Y]`: a module object, true and never None, whose value
    nothing else reads (never a path, never a constant an `==` compares)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


def _function_at(origin: str, line: int):
    """The module-level function whose `def` is at ``line`` of ``origin``, with its body (the
    module was walked with bodies left out); None when it cannot be read.  A source over
    8 MiB is cut there and fails to parse: no package's loader lives in such a file."""
    try:
        with open(origin, "rb") as handle:
            source = handle.read(8 << 20)
        tree = ast.parse(source, filename=origin)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return next((node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and node.lineno == line), None)


class _Matches(tuple):
    """The files a glob matched, when exactly one: `paths[0]` is then known."""


def _glob_value(node, known: dict, module_file: str):
    """list(PATH.glob(PATTERN)) / sorted(...) / glob.glob(PATTERN) where PATH and PATTERN
    are known: _Matches of the one file it matches, else _UNKNOWN (none or several: which
    one the package picks depends on directory order)."""
    import glob as globbing

    call = node
    if isinstance(call, ast.Call) and ast.unparse(call.func) in ("list", "sorted") and len(call.args) == 1:
        call = call.args[0]
    if not isinstance(call, ast.Call) or len(call.args) != 1 or call.keywords:
        return _UNKNOWN
    pattern = _string_value(call.args[0], known)
    if pattern is None:
        return _UNKNOWN
    func = ast.unparse(call.func)
    if func in ("glob.glob", "glob"):
        base = ""
    elif isinstance(call.func, ast.Attribute) and call.func.attr == "glob":
        base = _path_value(call.func.value, known, module_file)
        if base is None:
            return _UNKNOWN
    else:
        return _UNKNOWN
    if "**" in pattern or "/" in pattern and base:
        return _UNKNOWN
    found = globbing.glob(os.path.join(globbing.escape(base), pattern) if base else pattern)
    return _Matches(found) if len(found) == 1 and os.path.isabs(found[0]) else _UNKNOWN


def _string_value(node, known: dict):
    """A str constant, a name bound to one, or an f-string of those; None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and isinstance(known.get(node.id), str) and not isinstance(known[node.id], _Path):
        return known[node.id]
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.FormattedValue):
                if value.conversion != -1 or value.format_spec is not None:
                    return None
                value = value.value
            text = _string_value(value, known)
            if text is None:
                return None
            parts.append(text)
        return "".join(parts)
    return None


def _argument_value(node, known: dict):
    """A call's argument when known before running: a constant, or a name bound to one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, bool, type(None))):
        return node.value
    if isinstance(node, ast.Name) and isinstance(known.get(node.id), (str, int, bool)) \
            and not isinstance(known.get(node.id), (_Path, _Flags)):
        return known[node.id]
    return _UNKNOWN


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


def _changes_sys_path(stmt) -> bool:
    """`sys.path.extend(...)`, `sys.path.insert(...)`, `sys.path[:0] = ...`, `sys.path = ...`,
    `site.addsitedir(...)` as a statement of its own (read from the nodes: this runs on
    every statement of every module the import reaches)."""
    if isinstance(stmt, ast.Expr):
        call = stmt.value
        if not isinstance(call, ast.Call):
            return False
        func = call.func
        if isinstance(func, ast.Attribute):
            return func.attr == "addsitedir" or _is_sys_path(func.value)
        return isinstance(func, ast.Name) and func.id == "addsitedir"
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, ast.AugAssign):
        targets = [stmt.target]
    else:
        return False
    return any(_is_sys_path(t.value if isinstance(t, ast.Subscript) else t) for t in targets)


def _is_sys_path(node) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
        and node.value.id == "sys"


def _catches_importerror(node) -> bool:
    """Whether an except clause of this type catches ModuleNotFoundError."""
    if node is None:
        return True
    if isinstance(node, ast.Tuple):
        return any(_catches_importerror(item) for item in node.elts)
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name in ("ImportError", "ModuleNotFoundError", "Exception", "BaseException")


def _catches_oserror(node) -> bool:
    """Whether an except clause of this type catches the OSError of a failed ctypes load."""
    if node is None:
        return True
    if isinstance(node, ast.Tuple):
        return any(_catches_oserror(item) for item in node.elts)
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name in ("OSError", "Exception", "BaseException", "EnvironmentError", "IOError")


def _path_value(node, known: dict, module_file: str):
    """The path an expression names, when it depends only on literals, the module's own
    __file__ and names bound to such paths: os.path.join/dirname/abspath/realpath/normpath,
    str()/os.fspath(), pathlib's Path(...), .parent, .resolve(), .absolute(), / and
    .joinpath().  None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        if node.id == "__file__":
            return module_file
        value = known.get(node.id)
        return str(value) if isinstance(value, str) else None
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
            and isinstance(known.get(node.value.id), _Matches) and isinstance(node.slice, ast.Constant) \
            and node.slice.value in (0, -1):
        return known[node.value.id][0]
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        inner = _path_value(node.value, known, module_file)
        return os.path.dirname(inner) if inner is not None else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        left, right = _path_value(node.left, known, module_file), _path_value(node.right, known, module_file)
        return os.path.join(left, right) if left is not None and right is not None else None
    if not isinstance(node, ast.Call) or node.keywords:
        return None
    func = ast.unparse(node.func)
    tail = func.rpartition(".")[2]
    if isinstance(node.func, ast.Attribute) and tail in ("resolve", "absolute", "joinpath") \
            and not func.startswith(("os.", "posixpath.")):
        base = _path_value(node.func.value, known, module_file)
        if base is None:
            return None
        if tail == "joinpath":
            parts = [_path_value(arg, known, module_file) for arg in node.args]
            return None if None in parts else os.path.join(base, *parts)
        return os.path.realpath(base) if tail == "resolve" else os.path.abspath(base)
    args = [_path_value(arg, known, module_file) for arg in node.args]
    if None in args or not args:
        return None
    if func in ("os.path.join", "path.join", "join"):
        return os.path.join(*args)
    if len(args) != 1:
        return None
    if func in ("os.path.dirname", "path.dirname", "dirname"):
        return os.path.dirname(args[0])
    if func in ("os.path.abspath", "path.abspath", "abspath", "os.path.normpath"):
        return os.path.abspath(args[0])
    if func in ("os.path.realpath", "path.realpath", "realpath"):
        return os.path.realpath(args[0])
    if func in ("str", "os.fspath", "Path", "pathlib.Path", "PurePath", "pathlib.PurePath", "PosixPath"):
        return args[0]
    return None


_RTLD = {"RTLD_LAZY": 0x1, "RTLD_NOW": 0x2, "RTLD_NOLOAD": 0x4, "RTLD_DEEPBIND": 0x8,
         "RTLD_GLOBAL": 0x100, "RTLD_LOCAL": 0, "RTLD_NODELETE": 0x1000}


class _Flags(int):
    """dlopen flags read back with sys.getdlopenflags(): a value only setdlopenflags() uses
    (never a module constant that an `if` compares)."""


def _dl_flags(node, known: dict | None = None):
    """The value of os.RTLD_NOW | os.RTLD_GLOBAL (ctypes.RTLD_*, bare names, ints, a name
    bound to sys.getdlopenflags() earlier), or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name) and isinstance((known or {}).get(node.id), _Flags):
        return int(known[node.id])
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left, right = _dl_flags(node.left, known), _dl_flags(node.right, known)
        return None if left is None or right is None else left | right
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    return _RTLD.get(name)


def _absolute(module: str | None, level: int, package: str) -> str | None:
    if level == 0:
        return module
    parts = package.split(".") if package else []
    # importlib.util.resolve_name: a level past the package's depth is "attempted relative
    # import beyond top-level package" (package.rsplit('.', level - 1) has fewer than level parts)
    if level > len(parts) or not parts:
        return None
    base = ".".join(parts[:len(parts) - (level - 1)])
    return f"{base}.{module}" if module else base


_UNKNOWN = object()


def _literal(node):
    """The items of a literal list/tuple of constants (or of tuples of them), else None."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return list(value) if isinstance(value, (list, tuple)) else None


def _bind(target, item, known: dict) -> None:
    if isinstance(target, ast.Name):
        known[target.id] = item
    elif isinstance(target, ast.Tuple) and isinstance(item, (list, tuple)) and len(item) == len(target.elts):
        for sub, value in zip(target.elts, item):
            _bind(sub, value, known)


def _known_value(node, known: dict):
    """A module-level value known before running: a constant, or os.environ.get(NAME,
    default) / os.getenv read from this environment (the interpreter inherits it)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in known and isinstance(known[node.id], (_Module, type(None))):
        return known[node.id]
    if isinstance(node, ast.BoolOp):
        # `int(os.environ.get("JOBLIB_MULTIPROCESSING", 1)) or None`: Python's short circuit
        value = _UNKNOWN
        for item in node.values:
            value = _known_value(item, known)
            if value is _UNKNOWN or isinstance(value, _Flags):
                return _UNKNOWN
            if bool(value) == isinstance(node.op, ast.Or):
                return value
        return value
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("int", "bool") and len(node.args) == 1 \
            and not node.keywords:
        inner = _known_value(node.args[0], known)
        if inner is _UNKNOWN:
            return _UNKNOWN
        try:
            return int(inner) if ast.unparse(node.func) == "int" else bool(inner)
        except (TypeError, ValueError):
            return _UNKNOWN  # int("x") raises: what runs next is not known
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args \
            and node.func.attr in ("strip", "lower", "upper"):
        inner = _known_value(node.func.value, known)
        return getattr(inner, node.func.attr)() if isinstance(inner, str) else _UNKNOWN
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv", "environ.get") \
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        default = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else None
        return os.environ.get(node.args[0].value, default)
    return _UNKNOWN


def _static_test(test, interp: Interpreter, known: dict | None = None):
    """True/False for the few tests known before running (TYPE_CHECKING, sys.platform,
    os.name, sys.version_info, platform.python_implementation(), module constants);
    None otherwise (both branches are followed)."""
    text = ast.unparse(test)
    # `not typing.TYPE_CHECKING` ends in ".TYPE_CHECKING" too: the negation is tested first
    if text.startswith("not ") and (text[4:] in ("TYPE_CHECKING", "_TYPE_CHECKING")
                                    or text.endswith(".TYPE_CHECKING")):
        return True
    if text in ("TYPE_CHECKING", "_TYPE_CHECKING") or text.endswith(".TYPE_CHECKING"):
        return False
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left = ast.unparse(test.left)
        facts = {"platform.python_implementation()": {"cpython": "CPython", "pypy": "PyPy"}.get(
                     interp.implementation, interp.implementation),
                 # platform.system() is uname's sysname: "Linux" wherever sys.platform is "linux"
                 "platform.system()": {"linux": "Linux", "darwin": "Darwin", "win32": "Windows"}.get(
                     interp.platform, _UNKNOWN),
                 "sys.implementation.name": interp.implementation, "sys.platform": interp.platform,
                 "os.name": "nt" if interp.platform == "win32" else "posix",
                 "__name__": "<an imported module>"}  # never '__main__' for an import
        value = facts.get(left, _UNKNOWN)
        if value is _UNKNOWN and isinstance(test.left, ast.Name) and known and test.left.id in known:
            value = known[test.left.id]
        if value is not _UNKNOWN:
            try:
                right = ast.literal_eval(test.comparators[0])
            except (ValueError, SyntaxError, TypeError):
                right = _UNKNOWN
            op = type(test.ops[0])
            if right is not _UNKNOWN:
                if op is ast.Eq:
                    return value == right
                if op is ast.NotEq:
                    return value != right
                if op is ast.In and isinstance(right, (tuple, list, set, str)):
                    return value in right
                if op is ast.NotIn and isinstance(right, (tuple, list, set, str)):
                    return value not in right
                if op in (ast.Is, ast.IsNot) and right is None:
                    return (value is None) == (op is ast.Is)
    env = {"sys.platform": interp.platform, "os.name": "posix" if interp.platform != "win32" else "nt"}
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left = ast.unparse(test.left)
        right = test.comparators[0]
        if left in env and isinstance(right, ast.Constant) and isinstance(test.ops[0], (ast.Eq, ast.NotEq)):
            equal = env[left] == right.value
            return equal if isinstance(test.ops[0], ast.Eq) else not equal
        if left == "sys.version_info" and isinstance(right, ast.Tuple):
            try:
                value = tuple(ast.literal_eval(right))
            except ValueError:
                return None
            ops = {ast.GtE: lambda a, b: a >= b, ast.Lt: lambda a, b: a < b,
                   ast.Gt: lambda a, b: a > b, ast.LtE: lambda a, b: a <= b}
            op = ops.get(type(test.ops[0]))
            if op is None or len(value) > 3:
                return None  # the release level and serial are not probed
            # sys.version_info has five fields, and Python compares tuples item by item, a
            # shorter equal prefix first: on 3.11.7, `sys.version_info > (3, 11)` and even
            # `> (3, 11, 7)` are True.  The probed (major, minor, micro) plus one more item
            # compares the same way against any tuple of up to three.
            try:
                return op(tuple(interp.version) + ("release",), value)
            except TypeError:
                return None
    if isinstance(test, ast.Call) and ast.unparse(test.func) == "sys.platform.startswith" and test.args \
            and isinstance(test.args[0], ast.Constant):
        return interp.platform.startswith(test.args[0].value)
    if isinstance(test, ast.Name) and known and test.id in known and not isinstance(known[test.id], _Flags):
        return bool(known[test.id])
    if isinstance(test, ast.Call):
        # `os.getenv("TORCH_USE_RTLD_GLOBAL")` as a test: the interpreter inherits this environment
        value = _known_value(test, known or {})
        if value is not _UNKNOWN:
            return bool(value)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _static_test(test.operand, interp, known)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        # three-valued: `A or B` is True when one is True, False when all are False
        values = [_static_test(v, interp, known) for v in test.values]
        decisive = isinstance(test.op, ast.Or)
        if decisive in values:
            return decisive
        return (not decisive) if all(v is not None for v in values) else None
    return None


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


@dataclass(frozen=True)
class Observation:
    """What really happened: the files ld.so mapped, in order, and how Python ended."""
    loaded: tuple  # (name as ld.so was asked for it, requester or '') in mapping order
    returncode: int
    error_line: str  # the last line Python wrote on stderr ('' when it exited 0)
    executed: bool = True


def observe(python: str, statement: str, env: dict | None = None, timeout: float = 300) -> Observation:
    """Run ``python -c statement`` under LD_DEBUG=files (glibc's own trace, written to a
    private directory through LD_DEBUG_OUTPUT): this EXECUTES the imported packages' code."""
    import re
    run_env = dict(os.environ if env is None else env)
    with tempfile.TemporaryDirectory(prefix="seedance-observe-") as tmp:
        run_env["LD_DEBUG"] = "files"
        run_env["LD_DEBUG_OUTPUT"] = os.path.join(tmp, "ld")
        try:
            proc = subprocess.run([python, "-c", statement], capture_output=True, timeout=timeout,
                                  env=run_env, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise BadInput(f"{python} -c {statement!r} did not finish in {timeout:.0f} s") from None
        text = ""
        for entry in sorted(os.listdir(tmp)):
            with open(os.path.join(tmp, entry), "rb") as handle:
                text += handle.read().decode("utf-8", "surrogateescape")
    loaded = []
    pattern = re.compile(r"file=(.*?) \[\d+\];  (?:needed by (.*?) \[\d+\]|dynamically loaded by (.*?) \[\d+\])$")
    for line in text.splitlines():
        body = line.split(":", 1)[1].strip() if ":" in line else line
        match = pattern.match(body)
        if match:
            loaded.append((match.group(1), match.group(2) or match.group(3) or ""))
    err = proc.stderr.decode("utf-8", "surrogateescape").strip().splitlines()
    return Observation(tuple(loaded), proc.returncode, err[-1] if err and proc.returncode else "")


# --- predictions: the plan run through the process model -----------------------------------

@dataclass
class Prediction:
    """What `import <names>` (or a sequence of dlopens) would do, decided without running it."""
    names: tuple
    model: object  # seedance.resolve.process.ProcessModel
    plan: ImportPlan | None
    interpreter: Interpreter | None
    ok: bool
    error: str | None  # dlerror() text / Python's exception line
    failed_module: str | None = None
    orders: list = field(default_factory=list)  # (order, ok) tried when it fails
    working_order: tuple | None = None
    searched_orders: bool = False
    guarded: set = field(default_factory=set)  # model.steps indexes of failures the module catches
    causes: dict = field(default_factory=dict)  # index of a caught failure -> the operator use it fails

    def loaded_names(self) -> list:
        """The names ld.so maps, in order, as LD_DEBUG=files prints them (file=NAME)."""
        out = []
        for step in self.model.steps:
            for obj in step.new_objects:
                if step.load.kind != "exec" and obj == step.load.target:
                    out.append(obj)
                    continue
                edge = next((e for e in step.edges if e.path == obj), None)
                # an object found 'loaded' was in the process already (ld.so itself): no
                # file is mapped for it, so LD_DEBUG=files prints no file= line
                if edge is not None and edge.source != "loaded":
                    out.append(edge.name)
        return out


def predict_imports(interp: Interpreter, names, resolver=None, search_orders: bool = True,
                    dlopenflags: int | None = None) -> Prediction:
    """`import a, b, c` in this interpreter: the extension modules it dlopens, in order,
    through the process model; Python stops at the first ImportError."""
    from ..resolve import Resolver
    resolver = resolver or Resolver(env=_loader_env())
    names = tuple(names)
    prediction = _run_imports(interp, names, resolver, dlopenflags)
    # a module no finder knows is missing in every order: no other order is worth its run
    not_found = prediction.plan is not None and prediction.failed_module in dict(prediction.plan.missing)
    if search_orders and not not_found:
        _search_orders(prediction, names, lambda order: _run_imports(interp, order, resolver, dlopenflags))
    return prediction


def _search_orders(prediction: Prediction, items: tuple, run) -> None:
    """When the loads fail in their order, the other orders (all of them up to 4 loads, else
    the rotations) through ``run``, until one loads: prediction.orders, .working_order."""
    if prediction.ok or len(items) < 2:
        return
    import itertools
    candidates = list(itertools.permutations(items)) if len(items) <= 4 else \
        [items[i:] + items[:i] for i in range(1, len(items))]
    for order in candidates:
        if order == items:
            continue
        ok = run(order).ok
        named = tuple(x[0] if isinstance(x, tuple) else x for x in order)
        prediction.orders.append((named, ok))
        if ok:
            prediction.working_order = named
            break
    prediction.searched_orders = True


def _loader_env() -> dict:
    """The loader variables of this environment (the interpreter runs with them too)."""
    return {k: v for k, v in os.environ.items() if k in ("LD_LIBRARY_PATH", "LD_PRELOAD")}


def _run_imports(interp: Interpreter, names: tuple, resolver, dlopenflags) -> Prediction:
    from ..resolve.process import Load, Simulator
    flags = interp.dlopenflags if dlopenflags is None else dlopenflags
    sim = Simulator(resolver, interp.executable)
    sim.start()
    for module, path in interp.startup_extensions:
        sim.dlopen(Load(path, "import", flags, module, "<startup>"))
    plan = plan_imports(interp, names)
    ok, error, failed = True, None, None
    guarded: set = set()  # indexes of failed steps whose OSError the module catches
    causes: dict = {}  # index of a caught failure -> the operator use it makes fail
    missing = dict(plan.missing)
    for name in names:
        for load in plan.per_name.get(name, ()):
            if load.how == "operator":
                cause = _operator_missing(sim, guarded, load.path)
                if cause is not None:
                    # the library that registers the operator failed (its OSError caught):
                    # torch.library raises when asked for a kernel of an operator it lacks
                    guarded.discard(cause)
                    ok, error, failed = False, f"RuntimeError: operator {load.path} does not exist", load.module
                    plan.notes.append(f"{load.module} needs the operator {load.path}, which "
                                      f"{sim.model.steps[cause].load.target} registers and which failed to load")
                    causes[cause] = load
                    break
                continue
            step = sim.dlopen(Load(load.path, "import" if load.how == "import" else "dlopen",
                                   flags if load.flags is None else load.flags, load.module, name))
            if load.how == "import" and not step.ok:
                step = _after_package_preloads(sim, step, load, name)
            if load.how != "import":
                if not step.ok and load.guarded:
                    guarded.add(len(sim.model.steps) - 1)
                    plan.notes.append(f"{load.module}: {load.path} fails to load ({step.error}); the module "
                                      "catches the OSError and goes on")
                elif not step.ok:
                    ok, error, failed = False, _python_load_error(load, step.error), load.module
                    break
                continue
            if any(sym.startswith("PyImport_Import") for sym, _v in sim.symbols.undefined(load.path)):
                # numpy's _multiarray_umath imports datetime, contextvars, ... from its C init
                plan.notes.append(f"{load.path}: imports modules from C when initialised "
                                  "(PyImport_Import*); which ones is not known statically (use --observe)")
            if not step.ok:
                ok, error, failed = False, step.python_error, load.module
                break
        if not ok:
            break
        if name in missing:
            ok, error, failed = False, f"ModuleNotFoundError: No module named '{missing[name]}'", name
            break
    return Prediction(names, sim.model, plan, interp, ok, error, failed, guarded=guarded, causes=causes)


_CANNOT_OPEN = re.compile(r"^([^:/\s]+): cannot open shared object file")


def _after_package_preloads(sim, step, load: ExtensionLoad, name: str):
    """The extension's load once the package's own loader has run: faiss/loader.py (and
    the other packages rules/context/packages.yaml says load the NVIDIA wheels' libraries
    themselves, RTLD_GLOBAL, before their modules) maps site-packages/nvidia/*/lib/NAME
    for each NAME the module's closure cannot otherwise open."""
    import glob

    from ..resolve.process import RTLD_GLOBAL, RTLD_NOW, Load
    from . import practice

    top = (load.module or "").split(".")[0]
    reason = practice.preload_reason(top) if top else None
    site = practice.site_packages_of(load.path)
    if reason is None or reason[1] != "preloaded" or "nvidia-wheels" not in reason[2] or site is None:
        return step
    tried: set = set()
    while not step.ok:
        match = _CANNOT_OPEN.match(step.error or "")
        found = sorted(glob.glob(os.path.join(glob.escape(site), "nvidia", "*", "lib", glob.escape(match.group(1))))) \
            if match else []
        if not found or found[0] in tried or len(tried) > 16:
            return step
        tried.add(found[0])
        sim.model.steps.pop()  # the attempt without the preload: the loader runs first
        preload = sim.dlopen(Load(found[0], "dlopen", RTLD_NOW | RTLD_GLOBAL, f"{top}: its loader", name))
        if not preload.ok:
            sim.model.steps.pop()
            return sim.dlopen(Load(load.path, "import", step.load.flags, load.module, name))
        step = sim.dlopen(Load(load.path, "import", step.load.flags, load.module, name))
    return step


def _operator_missing(sim, guarded: set, qualname: str):
    """The index of the caught failed load whose file registers ``qualname`` (the schema
    text "ns::op(" that TORCH_LIBRARY's m.def() keeps in the library), or None: an operator
    no failed library names may come from anywhere else."""
    import mmap

    needle = qualname.encode("utf-8", "surrogateescape") + b"("
    for index in sorted(guarded):
        target = sim.model.steps[index].load.target
        try:
            with open(target, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                if data.find(needle) >= 0:
                    return index
        except (OSError, ValueError):
            continue
    return None


def _python_load_error(load: ExtensionLoad, error: str) -> str:
    """The exception a failed load by path ends the import with: ctypes raises OSError with
    dlerror()'s text (Modules/_ctypes/callproc.c); torch.ops.load_library catches that and
    raises OSError("Could not load this library: PATH") from it (torch/_ops.py)."""
    if load.how == "torch.ops":
        return f"OSError: Could not load this library: {load.path}"
    return f"OSError: {error}"


def predict_dlopens(executable: str, libraries, flags: int, resolver=None,
                    search_orders: bool = True) -> Prediction:
    """A non-Python host: ``executable`` starts, then dlopens each library in order; when
    that fails, the other orders are tried (the order that works is the fix to suggest)."""
    from ..resolve import Resolver
    resolver = resolver or Resolver(env=_loader_env())
    libraries = tuple(libraries)
    prediction = _run_dlopens(executable, libraries, flags, resolver)
    if search_orders:
        _search_orders(prediction, libraries, lambda order: _run_dlopens(executable, order, flags, resolver))
    return prediction


def _run_dlopens(executable: str, libraries: tuple, flags: int, resolver) -> Prediction:
    from ..resolve.process import Load, Simulator
    sim = Simulator(resolver, executable)
    sim.start()
    ok, error, failed = True, None, None
    for item in libraries:
        lib, lib_flags = item if isinstance(item, tuple) else (item, flags)
        step = sim.dlopen(Load(lib, "dlopen", lib_flags, None, lib))
        if not step.ok:
            ok, error, failed = False, step.error, lib
            break
    return Prediction(tuple(x[0] if isinstance(x, tuple) else x for x in libraries), sim.model, None, None,
                      ok, error, failed)


def distributions_providing(interp: Interpreter, module: str) -> list:
    """(distribution, recorded) for each distribution installed for ``interp`` whose RECORD
    names the top-level package of ``module``; ``recorded``: its RECORD lists ``module``
    itself (the file was installed and is gone since).  Read from the *.dist-info
    directories on the interpreter's sys.path, without running it or any package."""
    top = module.split(".")[0]
    stem = module.replace(".", "/")
    found = []
    for entry in interp.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if not name.endswith(".dist-info"):
                continue
            try:
                with open(os.path.join(entry or ".", name, "RECORD"), encoding="utf-8", errors="replace") as handle:
                    files = [line.split(",", 1)[0] for line in handle]
            except OSError:
                continue
            if not any(f == f"{top}.py" or f.startswith((f"{top}/", f"{top}.")) for f in files):
                continue
            recorded = any(f in (f"{stem}.py", f"{stem}/__init__.py") or
                           (f.startswith(f"{stem}.") and f.endswith(".so")) for f in files)
            found.append((_dist_name(os.path.join(entry or ".", name), name), recorded))
    return found


def _dist_name(dist_info: str, dirname: str) -> str:
    """The distribution's Name: from METADATA, else the directory's name before the version."""
    try:
        with open(os.path.join(dist_info, "METADATA"), encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("Name:"):
                    return line.split(":", 1)[1].strip()
                if not line.strip():
                    break
    except OSError:
        pass
    return dirname[:-len(".dist-info")].split("-")[0]


def import_failure_fix(interp: Interpreter, module: str) -> tuple:
    """(distribution or '', the fix text) for `No module named MODULE` in ``interp``.  A pip
    command only where the distribution is known: one installed for this interpreter whose
    RECORD lists the module (installed, then deleted: a reinstall brings it back).  An
    import name often differs from its PyPI name (cv2 is opencv-python), so nothing is
    guessed from the name alone."""
    python = interp.python
    dists = distributions_providing(interp, module)
    broken = [d for d, recorded in dists if recorded]
    if not dists:
        wanted = next((item for item in unmet_requirements(interp)
                       if item.installed is None and _names_module(item.name, module)), None)
        if wanted is not None:
            return wanted.name, (f"{python} -m pip install '{wanted.requirement}' ({wanted.distribution} "
                                 f"{wanted.version} requires it and it is not installed)")
    if broken:
        return broken[0], (f"{python} -m pip install --force-reinstall {broken[0]} "
                           f"(its RECORD lists {module}, which is gone)")
    if dists:
        names = ", ".join(d for d, _r in dists)
        return "", (f"{module.split('.')[0]} comes from {names}, which has no module {module}: check the "
                    f"name against its version ({python} -m pip show {dists[0][0]})")
    return "", (f"no distribution installed for {python} provides {module.split('.')[0]}: check the "
                f"spelling and that this is the interpreter meant, then install the distribution that "
                f"ships it ({python} -m pip install NAME; the PyPI name may differ from the import name)")


def shadowing_facts(prediction: Prediction) -> list:
    """One `process-load` fact per shadowed NEEDED, per failed load and per import that
    fails because a module is not found (rules/process.yaml)."""
    from ..model.report import Fact
    if prediction.ok:
        hint = "this order loads: the copy loaded first serves both here"
    elif prediction.working_order:
        hint = "import order that works: " + ", ".join(prediction.working_order) \
            if prediction.plan is not None else "order that works: " + ", ".join(prediction.working_order)
    elif prediction.searched_orders:
        hint = "no import order works" if prediction.plan is not None else "no order works"
    else:
        hint = ""
    # a shadowing's message and fix always say something of the order (never "...; ")
    shadow_hint = hint or ("a single load: no order to change" if len(prediction.names) < 2
                           else "other orders not tried")
    facts = []
    python = prediction.plan is not None
    why_args = (f"--imports {','.join(prediction.names)}" if python
                else f"--in {prediction.model.executable}")
    for index, step in enumerate(prediction.model.steps):
        if index in prediction.guarded:
            continue  # a load the module tries and does without (a note says so)
        module = step.load.module or step.load.target
        how = f"import {step.load.importer}" if python else f"dlopen {step.load.target}"
        for shadow in step.shadowed:
            missing = ", ".join(s + (f"@{v}" if v else "") for s, v in shadow.missing)
            copies = ", ".join(s + (f"@{v}" if v else "") for s, v, _p in shadow.other_copy[:5])
            facts.append(Fact("process-load", {"path": shadow.requester}, {
                "event": "shadowed", "importer": step.load.importer or "", "module": module,
                "how": how, "why_args": why_args,
                "name": shadow.name, "used": shadow.used, "alone": shadow.alone,
                "loaded_by": shadow.loaded_by, "loaded_for": shadow.loaded_for,
                "missing": missing, "other_copy": copies, "order_hint": shadow_hint,
                "consequence": (step.shadow_consequence(missing) if missing else
                                f"{len(shadow.other_copy)} of its symbols bind to that copy"
                                + (f" ({copies})" if copies else "")),
                "error": step.error or ""}, source="python_env"))
        if not step.ok and not step.shadowed and step.load.kind != "exec":
            then = f"; {hint}" if hint else ""
            if python and step.load.kind == "dlopen":
                # a library the module loads by path (ctypes, torch.ops.load_library): Python
                # raises what ctypes or torch raises, not ImportError
                how = f"loaded by path when {how} runs"
                then = f"; the import raises {prediction.error}{then}" if prediction.failed_module == module \
                    else then
                use = prediction.causes.get(index)
                if use is not None:
                    then = (f"; the module catches the OSError, then {use.module.partition(':')[0]} asks torch.library "
                            f"for the operator {use.path}, which this library registers: the import raises "
                            f"{prediction.error}{'; ' + hint if hint else ''}")
            facts.append(Fact("process-load", {"path": step.load.target}, {
                "event": "failed", "importer": step.load.importer or "", "module": module,
                "how": how, "why_args": why_args, "then": then,
                "error": step.error or "", "order_hint": hint}, source="python_env"))
    if python and not prediction.ok and prediction.failed_module in dict(prediction.plan.missing):
        # no load fails: Python's own finder does (ModuleNotFoundError, before any dlopen)
        interp = prediction.interpreter
        module = dict(prediction.plan.missing)[prediction.failed_module]
        distribution, fix = import_failure_fix(interp, module)
        exception, _sep, _text = (prediction.error or "").partition(":")
        facts.append(Fact("process-load", {"path": interp.executable}, {
            "event": "import-fails", "importer": prediction.failed_module, "module": module,
            "python": interp.python, "exception": exception, "error": prediction.error or "",
            "distribution": distribution, "fix": fix}, source="python_env"))
    return facts


# --- distribution metadata: what pip check reads ----------------------------------------------

@dataclass(frozen=True)
class UnmetRequirement:
    """One Requires-Dist of an installed distribution that the installed set does not meet."""
    distribution: str
    version: str
    requirement: str  # as METADATA spells it, without its marker
    name: str  # the required distribution
    installed: str | None  # its installed version; None: not installed
    dist_info: str


def installed_distributions(interp: Interpreter) -> dict:
    """canonical name -> (Name, Version, dist-info path, [Requires-Dist]) for every
    *.dist-info on the interpreter's sys.path, the first one found per name winning (as
    importlib.metadata and pip do), read without running the interpreter."""
    from packaging.utils import canonicalize_name

    found: dict = {}
    for entry in interp.path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for dirname in names:
            if not dirname.endswith(".dist-info"):
                continue
            path = os.path.join(entry or ".", dirname)
            headers = _metadata_headers(os.path.join(path, "METADATA"))
            if headers is None or not headers.get("Name") or not headers.get("Version"):
                continue
            key = canonicalize_name(headers["Name"][0])
            found.setdefault(key, (headers["Name"][0], headers["Version"][0], path, headers.get("Requires-Dist", [])))
    return found


def _metadata_headers(path: str) -> dict | None:
    """The header fields of a METADATA file (RFC 822 style, up to the first blank line)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(1 << 20)
    except OSError:
        return None
    headers: dict = {}
    last = None
    for line in text.splitlines():
        if not line.strip():
            break
        if line[0] in " \t" and last is not None:
            headers[last][-1] += " " + line.strip()
            continue
        key, sep, value = line.partition(":")
        if sep:
            last = key.strip()
            headers.setdefault(last, []).append(value.strip())
    return headers


def unmet_requirements(interp: Interpreter) -> list:
    """Every Requires-Dist whose marker holds for this interpreter (no extra requested) and
    that the installed distributions do not meet: what `pip check` reports."""
    from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    markers = dict(interp.markers or {})
    markers["extra"] = ""
    dists = installed_distributions(interp)
    unmet = []
    for name, version, path, requires in dists.values():
        for text in requires:
            try:
                requirement = Requirement(text)
                if requirement.marker is not None and not requirement.marker.evaluate(markers):
                    continue
            except (InvalidRequirement, InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
                continue  # pip check skips what it cannot parse too
            wanted = dists.get(canonicalize_name(requirement.name))
            installed = wanted[1] if wanted is not None else None
            if installed is not None:
                try:
                    if requirement.specifier.contains(Version(installed), prereleases=True):
                        continue
                except InvalidVersion:
                    continue
            spec = str(requirement.specifier)
            unmet.append(UnmetRequirement(name, version, f"{requirement.name}{spec}", requirement.name,
                                          installed, path))
    return unmet


def requirement_facts(prediction: Prediction) -> list:
    """One `dist-requirement` fact per unmet Requires-Dist of a distribution that provides a
    module of the import: the failure a pin explains names the pin, then the loader's
    text as proof."""
    from ..model.report import Fact

    interp, plan = prediction.interpreter, prediction.plan
    if interp is None or plan is None:
        return []
    unmet = unmet_requirements(interp)
    if not unmet:
        return []
    tops = {name.split(".")[0] for name in prediction.names}
    failed_top = (prediction.failed_module or "").split(".")[0]
    # ModuleNotFoundError raised deep in the import (joblib's `from cloudpickle import ...`
    # under `import sklearn`): the pin that explains it is the raising module's distribution's
    not_found = dict(plan.missing).get(prediction.failed_module or "", "") if not prediction.ok else ""
    raiser = plan.raised_in.get(prediction.failed_module or "", "").split(".")[0]
    owners: dict = {}
    for top in tops | ({failed_top, raiser} - {""}):
        for dist, _recorded in distributions_providing(interp, top):
            owners.setdefault(dist.lower(), set()).add(top)
    facts = []
    for item in unmet:
        modules = owners.get(item.distribution.lower())
        if not modules:
            continue
        have = f"{item.name} {item.installed} is installed" if item.installed else f"{item.name} is not installed"
        if not_found:
            explains = item.installed is None and _names_module(item.name, not_found)
        else:
            explains = not prediction.ok and failed_top in modules
        proof = prediction.error if explains else ""
        check = (f"{interp.python} -m pip install --dry-run '{item.distribution}' '{item.name}=={item.installed}'"
                 if item.installed else f"{interp.python} -m pip install '{item.requirement}'")
        facts.append(Fact("dist-requirement", {"path": item.dist_info}, {
            "distribution": item.distribution, "version": item.version, "requirement": item.requirement,
            "required": item.name, "installed": item.installed or "", "have": have,
            "modules": ", ".join(sorted(modules)), "python": interp.python,
            "fails": bool(proof), "proof": f"; import {failed_top} fails: {proof}" if proof else "",
            "check": check, "remedy": _requirement_remedy(item, interp.python, check)}, source="python_env"))
    return facts


def _names_module(distribution: str, module: str) -> bool:
    """Whether a distribution's name is the import name of ``module``'s top (cloudpickle,
    typing-extensions for typing_extensions): the one case the name alone tells."""
    from packaging.utils import canonicalize_name

    return canonicalize_name(distribution) == canonicalize_name(module.split(".")[0])


def _requirement_remedy(item: UnmetRequirement, python: str, check: str) -> str:
    """The fix of an unmet pin: the extension's release built for the installed torch when
    rules/context/release_pairs.yaml pairs them, else how to find it."""
    from packaging.utils import canonicalize_name

    from .package_context import index_caveat, matching_release

    if item.installed and canonicalize_name(item.name) == "torch":
        found = matching_release(item.distribution, item.installed)
        if found is not None:
            release, source = found
            return (f"{python} -m pip install --no-deps '{item.distribution}=={release}'"
                    f"{index_caveat(item.installed)} (the {item.distribution} release built for the installed "
                    f"torch {item.installed}: {source})")
    if not item.installed:
        return (f"{python} -m pip install '{item.requirement}' ({item.distribution} {item.version} requires it; "
                f"pip installs what a distribution requires unless told --no-deps)")
    return (f"install the {item.distribution} release whose Requires-Dist accepts the installed {item.name}, or "
            f"the {item.requirement} it was built for; `pip install --upgrade {item.distribution}` alone does not "
            f"choose by torch's release: check a candidate with {check}")
