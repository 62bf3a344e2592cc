"""What a module's statements are worth before it runs: the values, tests and paths the
import planner (import_plan.py) can know statically.

A name bound to a constant, to an environment variable's value or to a path built from the
module's own __file__ is known; a test over such names (or over sys.platform, os.name,
sys.version_info, TYPE_CHECKING) is decided; anything else is _UNKNOWN and both branches of
an `if` on it are followed.  Nothing here imports or runs the package.
"""
from __future__ import annotations

import ast
import os

# annotations only (typing's TYPE_CHECKING would import typing at every start)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .python_env import Interpreter


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


class _Matches(tuple):
    """The files a glob matched, when exactly one: `paths[0]` is then known."""


def _glob_value(node, known: dict, module_file: str):
    """list(PATH.glob(PATTERN)) or sorted(...) where PATH is a known directory and PATTERN a
    known pattern of names in that one directory (never `/` or `**`: a package's source must
    not make seedance walk a tree): _Matches of the one file it matches, else _UNKNOWN (none
    or several: which one the package picks depends on directory order)."""
    import glob as globbing

    call = node
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in ("list", "sorted") \
            and len(call.args) == 1:
        call = call.args[0]
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "glob"
            and len(call.args) == 1 and not call.keywords):
        return _UNKNOWN
    if isinstance(call.func.value, ast.Name) and call.func.value.id == "glob":
        return _UNKNOWN  # glob.glob(PATTERN): a pattern over any directory
    pattern = _string_value(call.args[0], known)
    if pattern is None or "/" in pattern or "**" in pattern or pattern in ("", ".", ".."):
        return _UNKNOWN
    base = _path_value(call.func.value, known, module_file)
    if base is None or not os.path.isabs(base):
        return _UNKNOWN
    found = globbing.glob(os.path.join(globbing.escape(base), pattern))
    return _Matches(found) if len(found) == 1 else _UNKNOWN


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


def _catches(node, names: tuple) -> bool:
    """Whether an except clause of this type (a bare except, a name, a tuple of them) names
    one of ``names``."""
    if node is None:
        return True
    if isinstance(node, ast.Tuple):
        return any(_catches(item, names) for item in node.elts)
    return (node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")) in names


def _catches_importerror(node) -> bool:
    """Whether an except clause of this type catches ModuleNotFoundError."""
    return _catches(node, ("ImportError", "ModuleNotFoundError", "Exception", "BaseException"))


def _catches_oserror(node) -> bool:
    """Whether an except clause of this type catches the OSError of a failed ctypes load."""
    return _catches(node, ("OSError", "Exception", "BaseException", "EnvironmentError", "IOError"))


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
