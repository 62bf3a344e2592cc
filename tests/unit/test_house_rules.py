"""House rules a newcomer can rely on, checked over the source tree itself.

* seedance never patches the standard library or another package's modules at run time
  (no `argparse._ = ...`, no `sys.modules[...] = ...`, no `setattr(module, ...)`), and never
  hides objects from the cyclic collector with gc.freeze().
* What cffi generates (the C reader's wrapper, the shim's ABI module) is built by the
  install, never kept in git, so it cannot go stale beside the header it comes from.
* The Python modules import each other without circles (deferred imports inside functions
  count too), and only the command line imports the commands.
* The shim's C files and headers include each other without circles, and no two of its C
  files call into each other.
"""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "seedance"


# --- the Python tree ---------------------------------------------------------------------

def _package_dirs() -> dict:
    """setup.py's PACKAGE_DIRS (import name -> directory), read without running setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PACKAGE_DIRS"
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no PACKAGE_DIRS")


def _modules() -> dict:
    """Dotted module name -> path, for every .py file of the packages setup.py installs."""
    found = {}
    for name, directory in _package_dirs().items():
        for path in sorted((ROOT / directory).glob("*.py")):
            module = name if path.stem == "__init__" else f"{name}.{path.stem}"
            found[module] = path
    return found


def _is_package(module: str, modules: dict) -> bool:
    return modules[module].stem == "__init__"


def _imports(module: str, path: Path, modules: dict, tree=None):
    """(line, imported module) for every import statement of the file, at any depth, relative
    imports resolved; `from X import name` counts as importing X.name where that is a module."""
    tree = tree or ast.parse(path.read_text(), str(path))
    package = module if _is_package(module, modules) else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in modules:
                    yield node.lineno, sub
                elif target not in modules or not _is_package(target, modules) \
                        or alias.name in _bound_names(modules[target]):
                    yield node.lineno, target
                # else a submodule that is not Python source (the compiled C reader, cffi's
                # module): importing it runs no module of ours


def _bound_names(path: Path) -> set:
    """The names a module binds at its top level."""
    names = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _own_graph() -> dict:
    modules = _modules()
    graph = {m: set() for m in modules}
    for module, path in modules.items():
        for _line, target in _imports(module, path, modules):
            if target in modules and target != module:
                graph[module].add(target)
    return graph


def _circles(graph: dict) -> list:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(node):
        # iterative: the module graph is deep enough to matter for the recursion limit
        work = [(node, iter(sorted(graph.get(node, ()))))]
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        while work:
            current, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[current] = min(low[current], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[current])
            if low[current] == index[current]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == current:
                        break
                if len(component) > 1:
                    out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(out)


def test_the_circle_finder_finds_circles():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set(), "c": {"c"}}) == []


def test_python_modules_import_each_other_without_circles():
    assert _circles(_own_graph()) == []


COMMANDS = f"{PACKAGE}.commands"


def _command_importers() -> list:
    modules = _modules()
    allowed = {f"{PACKAGE}.cli"}
    found = []
    for module, path in modules.items():
        if module in allowed or module == COMMANDS or module.startswith(COMMANDS + "."):
            continue
        for line, target in _imports(module, path, modules):
            if target == COMMANDS or target.startswith(COMMANDS + "."):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    return found


def test_only_the_command_line_imports_the_commands():
    assert _command_importers() == []


# --- no patches of other packages, no gc.freeze --------------------------------------------

# the interpreter's standard streams are there to be replaced (the sys module's documentation):
# setting one is not a patch
_REPLACEABLE = {("sys", "stdout"), ("sys", "stderr"), ("sys", "stdin")}
_SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _scope_names(scope) -> tuple:
    """(names imported from another package -> module, names bound otherwise) of one scope,
    nested functions and classes left out."""
    imported, other = {}, set()
    todo = list(ast.iter_child_nodes(scope))
    if not isinstance(scope, ast.Module):
        other.update(a.arg for a in ast.walk(scope.args) if isinstance(a, ast.arg))
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.partition(".")[0] != PACKAGE:
                    imported[alias.asname or alias.name.partition(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if not node.level and node.module and node.module.partition(".")[0] != PACKAGE:
                    imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                else:
                    other.add(alias.asname or alias.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            other.add(node.name)
            continue  # a scope of its own
        elif isinstance(node, ast.Lambda):
            continue
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            other.add(node.id)
        todo.extend(ast.iter_child_nodes(node))
    return imported, other - set(imported)


def _patches(source: str, where: str = "<source>") -> list:
    """Lines of SOURCE that change another package's module at run time, or call gc.freeze."""
    tree = ast.parse(source, where)
    found = []

    def check(scope, outer: list):
        names = outer + [_scope_names(scope)]

        def foreign(name):
            """The module NAME was imported from (another package), in this scope, or None."""
            for imported, other in reversed(names):
                if name in other:
                    return None
                if name in imported:
                    return imported[name]
            return None

        def module_of(expr):
            return foreign(expr.id) if isinstance(expr, ast.Name) else None

        def module_state(expr):
            """X.attr (X imported from elsewhere), X.__dict__[...], sys.modules[...]"""
            if isinstance(expr, ast.Attribute) and module_of(expr.value):
                return (module_of(expr.value), expr.attr) not in _REPLACEABLE
            if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Attribute):
                base = expr.value
                return bool(module_of(base.value)) and (
                    base.attr == "__dict__" or (module_of(base.value) == "sys" and base.attr == "modules"))
            return False

        todo = list(ast.iter_child_nodes(scope))
        while todo:
            node = todo.pop()
            if isinstance(node, _SCOPES):
                check(node, names)
                continue
            todo.extend(ast.iter_child_nodes(node))
            targets = []
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for target in targets:
                for part in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]):
                    if module_state(part):
                        found.append(f"{where}:{node.lineno}: {ast.unparse(part)} changed")
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and node.args \
                    and module_of(node.args[0]):
                found.append(f"{where}:{node.lineno}: {func.id}({node.args[0].id}, ...)")
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute) \
                    and module_of(func.value.value) == "sys" and func.value.attr == "modules" \
                    and func.attr in ("update", "setdefault", "pop", "popitem", "clear", "__setitem__"):
                found.append(f"{where}:{node.lineno}: sys.modules.{func.attr}(...)")
            elif (isinstance(func, ast.Attribute) and func.attr == "freeze" and module_of(func.value) == "gc") \
                    or (isinstance(func, ast.Name) and foreign(func.id) == "gc.freeze"):
                found.append(f"{where}:{node.lineno}: gc.freeze()")

    check(tree, [])
    return found


@pytest.mark.parametrize("source", [
    "import argparse\ndef f():\n    argparse._ = str\n",
    "def f():\n    import argparse as a\n    a.ngettext = None\n",
    "import sys\nsys.modules['cel.cel'] = object()\n",
    "import sys\nsys.modules.setdefault('x', None)\n",
    "import os\nsetattr(os, 'sep', '/')\n",
    "from email import utils\nutils.__dict__['x'] = 1\n",
    "import gc\ngc.freeze()\n",
    "from gc import freeze\nfreeze()\n",
])
def test_the_patch_finder_finds_patches(source):
    assert _patches(source)


@pytest.mark.parametrize("source", [
    "import sys\ncore = sys.modules.get('cel')\n",
    "import os\nos.environ.get('X')\nvalue = os.sep\n",
    "from . import options\noptions.KEEP_UNTIL_EXIT = []\n",
    "import gc\ngc.disable()\n",
    "import sys\nsys.stdout = None\n",
    "import yaml\ndef f():\n    from ruamel.yaml import YAML\n    yaml = YAML()\n    yaml.preserve_quotes = True\n",
    "class A:\n    pass\na = A()\na.x = 1\nsetattr(a, 'y', 2)\n",
])
def test_the_patch_finder_leaves_own_state_alone(source):
    assert _patches(source) == []


def _tree_patches() -> list:
    found = []
    for path in sorted(ROOT.joinpath("agent").rglob("*.py")) + sorted(ROOT.joinpath("shim").glob("*.py")):
        found += _patches(path.read_text(), str(path.relative_to(ROOT)))
    return found


def test_no_module_patches_another_package_or_freezes_the_collector():
    assert _tree_patches() == []


# --- hand-written records ----------------------------------------------------------------

RECORD_MODULE = "agent/model/record.py"
_RECORD_INTERNALS = ("_new_dict", "_new_object")


def _record_tricks(source: str, where: str = "<source>") -> list:
    """Lines that give an object its __dict__ wholesale (object.__setattr__(x, "__dict__", ...))
    or import the record module's private makers: how a record gets its fields is
    model/record.py's business (set_fields in a record's __init__, Cls._build elsewhere)."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "__setattr__" and isinstance(node.func.value, ast.Name) \
                and node.func.value.id == "object" and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and node.args[1].value == "__dict__":
            found.append(f"{where}:{node.lineno}: object.__setattr__(..., '__dict__', ...)")
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name in _RECORD_INTERNALS:
                    found.append(f"{where}:{node.lineno}: imports {alias.name}")
        elif isinstance(node, ast.Attribute) and node.attr in _RECORD_INTERNALS:
            found.append(f"{where}:{node.lineno}: uses {node.attr}")
    return found


@pytest.mark.parametrize("source", [
    "def f(x):\n    object.__setattr__(x, '__dict__', {})\n",
    "from ..model.record import FrozenRecord, _new_dict\n",
    "from seedance.model.record import _new_object as make\n",
    "from ..model import record\nrecord._new_dict(x, '__dict__', {})\n",
])
def test_the_record_trick_finder_finds_tricks(source):
    assert _record_tricks(source)


@pytest.mark.parametrize("source", [
    "from ..model.record import FrozenRecord, set_fields\nclass A(FrozenRecord):\n"
    "    def __init__(self, a):\n        set_fields(self, {'a': a})\n",
    "fact = Fact._build({'kind': 'k'})\n",
    "object.__setattr__(x, 'name', 1)\n",
])
def test_the_record_trick_finder_leaves_plain_code_alone(source):
    assert _record_tricks(source) == []


def test_only_the_record_module_gives_records_their_fields():
    found = []
    for path in sorted(ROOT.joinpath("agent").rglob("*.py")):
        where = str(path.relative_to(ROOT))
        if where != RECORD_MODULE:
            found += _record_tricks(path.read_text(), where)
    assert found == []


# --- generated files ---------------------------------------------------------------------

def test_git_holds_no_cffi_output():
    """cffi's output (the C reader's wrapper, the shim's ABI module) is built, not committed."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    # cffi's C output starts by defining _CFFI_ macros; its Python output imports _cffi_backend.
    # Read from the index: what a commit would hold, whatever the working tree has.
    found = subprocess.run(["git", "-C", str(ROOT), "grep", "--cached", "-l", "-E",
                            r"^(#define _CFFI_|import _cffi_backend$)", "--", "*.c", "*.py"],
                           capture_output=True, text=True)
    assert found.returncode in (0, 1), found.stderr  # 1: nothing found
    generated = found.stdout.split()
    assert generated == []


# --- the shim's C ------------------------------------------------------------------------

SHIM_SRC = ROOT / "shim" / "src"
LAUNCHER = "launcher.c"  # a program of its own (seedance-run), not a part of the library


def _include_graph() -> dict:
    """Area -> the areas it includes: x.c and x.h are one area (the header is the area's face),
    #include "..." lines only (system headers are not ours)."""
    graph = {}
    for path in sorted(SHIM_SRC.iterdir()):
        if path.suffix not in (".c", ".h", ".def"):
            continue
        area = path.stem if path.suffix != ".def" else path.name
        edges = graph.setdefault(area, set())
        for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), re.M):
            included = (path.parent / name).resolve()
            if included.parent == SHIM_SRC:
                other = included.stem if included.suffix != ".def" else included.name
                if other != area:
                    edges.add(other)
    return graph


def _call_graph(tmp_path) -> dict:
    """C file -> the C files whose functions or data it uses, from the compiled objects'
    symbol tables (what the linker joins, inline helpers of headers included)."""
    sys.path.insert(0, str(ROOT / "shim"))
    try:
        import build_shim
    finally:
        sys.path.remove(str(ROOT / "shim"))
    defined, used = {}, {}
    for source in sorted(SHIM_SRC.glob("*.c")):
        if source.name == LAUNCHER:
            continue
        obj = tmp_path / (source.stem + ".o")
        subprocess.run(["cc", *build_shim.CFLAGS, "-c", str(source), "-o", str(obj)], check=True)
        table = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout
        defined[source.stem], used[source.stem] = set(), set()
        for line in table.splitlines():
            fields = line.split()
            if len(fields) == 3 and fields[1] in "TDBRC":
                defined[source.stem].add(fields[2])
            elif len(fields) == 2 and fields[0] == "U":
                used[source.stem].add(fields[1])
    owner = {symbol: area for area, symbols in defined.items() for symbol in symbols}
    return {area: {owner[s] for s in used[area] if s in owner and owner[s] != area} for area in defined}


def test_shim_headers_include_each_other_without_circles():
    assert _circles(_include_graph()) == []


@pytest.mark.skipif(shutil.which("cc") is None or shutil.which("nm") is None, reason="needs cc and nm")
def test_shim_c_files_call_each_other_without_circles(tmp_path):
    """One header per area only helps if the areas form layers: a C file never calls (or reads
    the data of) a file that calls it back, directly or round about."""
    assert _circles(_call_graph(tmp_path)) == []


# --- comments say why, not when ----------------------------------------------------------

COMMENTED_TREES = ("agent", "shim", "probes")
COMMENTED_SUFFIXES = (".py", ".c", ".h", ".def")
# A comment that cites this project's issues or a profiler's counts ages with them, and a
# reader cannot open either: the figures live in bench/, beside the script that makes them.
HISTORY = (
    re.compile(r"\bissues?\s+\d+", re.IGNORECASE),
    re.compile(r"\d+(?:\.\d+)?\s*[KMG]?\s*instructions\b", re.IGNORECASE),
    re.compile(r"\bcallgrind\b", re.IGNORECASE),
)
# C read left to right: a comment, or a string or character literal that may hold "/*" or
# "//" and is no comment (an apostrophe inside a comment is the comment's)
_C_LEXEME = re.compile(r"(?P<comment>/\*.*?\*/|//[^\n]*)" r'|"(?:[^"\\\n]|\\.)*"' r"|'(?:[^'\\\n]|\\.)*'",
                       re.DOTALL)
_MARKER = re.compile(r"^\s*(?:/\*+|\*+(?!/)|//+|#+)?")  # a comment line's own leader


def _python_comments(source: str) -> list:
    """(first line, text) of each run of `#` comments on consecutive lines and of each
    module, class and function docstring."""
    import io
    import tokenize

    found = []
    previous = None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        line = token.start[0]
        if previous is not None and found and line == previous + 1:
            found[-1] = (found[-1][0], found[-1][1] + "\n" + token.string)
        else:
            found.append((line, token.string))
        previous = line
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                found.append((first.lineno, first.value.value))
    return found


def _c_comments(source: str) -> list:
    """(first line, text) of each /* */ comment and each run of // comments on consecutive
    lines."""
    found = []
    previous_end = None
    for match in _C_LEXEME.finditer(source):
        text = match.group("comment")
        if text is None:
            continue
        line = source.count("\n", 0, match.start()) + 1
        if (text.startswith("//") and previous_end is not None and found
                and source[previous_end:match.start()].strip() == ""
                and source.count("\n", previous_end, match.start()) == 1):
            found[-1] = (found[-1][0], found[-1][1] + "\n" + text)
        else:
            found.append((line, text))
        previous_end = match.end() if text.startswith("//") else None
    return found


def _history(source: str, suffix: str) -> list:
    """(line, cited text) for every issue number or profiler count in the comments and
    docstrings of a source file: Python for .py, C (.c, .h, the shim's .def) otherwise.
    A citation broken over two comment lines is still one citation."""
    found = []
    for first, text in (_python_comments if suffix == ".py" else _c_comments)(source):
        lines = [_MARKER.sub("", line, count=1) for line in text.split("\n")]
        joined = "\n".join(lines)
        for pattern in HISTORY:
            for match in pattern.finditer(joined):
                found.append((first + joined.count("\n", 0, match.start()), " ".join(match.group().split())))
    return sorted(found)


def _generated(source: str) -> bool:
    """cffi's output (built, never committed): its comments are cffi's own."""
    return source.startswith("#define _CFFI_") or "\nimport _cffi_backend\n" in f"\n{source}"


def _commented_files() -> list:
    files = []
    for tree in COMMENTED_TREES:
        for path in sorted((ROOT / tree).rglob("*")):
            if path.suffix in COMMENTED_SUFFIXES and path.is_file() and "__pycache__" not in path.parts:
                files.append(path)
    return files


def _history_by_file() -> dict:
    """Relative path -> [(line, cited text)] over agent/, shim/ and probes/."""
    found = {}
    for path in _commented_files():
        source = path.read_text(errors="replace")
        if _generated(source):
            continue
        hits = _history(source, path.suffix)
        if hits:
            found[path.relative_to(ROOT).as_posix()] = hits
    return found


@pytest.mark.parametrize("source, suffix, expected", [
    ("x = 1  # bounded (issue 10)\n", ".py", [(1, "issue 10")]),
    ('"""Why (issue 10, item 3): YAML is a graph."""\n', ".py", [(1, "issue 10")]),
    ("def f():\n    '''A start costs\n    ~47M instructions.'''\n", ".py", [(3, "47M instructions")]),
    ("# measured with callgrind, issue\n# 13\ny = 2\n", ".py", [(1, "callgrind"), (1, "issue 13")]),
    ("int x; /* inline on every allocation\n * (issue 13) */\n", ".c", [(2, "issue 13")]),
    ("// ~9.5 M instructions a call\nint y;\n", ".h", [(1, "9.5 M instructions")]),
    ("HOOK(a) /* launches per library (issue 14) */\n", ".def", [(1, "issue 14")]),
    ("/* the driver's table */ char c = '\"'; /* (issue 13) */\n", ".c", [(1, "issue 13")]),
    ("int z;\n// a citation split over lines, issue\n// 13\n", ".c", [(2, "issue 13")]),
])
def test_the_history_finder_finds_history(source, suffix, expected):
    assert _history(source, suffix) == expected


@pytest.mark.parametrize("source, suffix", [
    ('message = "see issue 13"  # a string, not a comment\n', ".py"),
    ("x = 1  # one locked instruction fewer than a CAS\n", ".py"),
    ("# cffi's own quirk (upstream issue #350)\n", ".py"),
    ('const char *s = "/* issue 13 */";\n', ".c"),
    ('const char *u = "http://x"; int issue = 13;\n', ".c"),
])
def test_the_history_finder_leaves_code_and_strings_alone(source, suffix):
    assert _history(source, suffix) == []


def test_comments_cite_no_issue_numbers_or_profiler_counts():
    """A comment says why in the words of ld.so, CUDA or the kernel; the issue that found a
    problem and the profiler run that measured it belong to the history and to bench/."""
    found = [f"{path}:{line}: {text}" for path, hits in _history_by_file().items()
             for line, text in hits]
    assert found == []
