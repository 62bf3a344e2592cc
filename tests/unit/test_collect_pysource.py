"""collect/pysource.py: a module's function bodies left out through its current .pyc, so
an import is planned from what runs at import time without parsing every body.  The
oracle is the whole source's own tree: everything outside function bodies is the same."""
from __future__ import annotations

import ast
import importlib.util
import os
import py_compile
import sys
import textwrap

import pytest

from seedance.collect import pysource

TAG = sys.implementation.cache_tag

TRICKY = textwrap.dedent('''\
    """A module docstring."""
    import os
    from json import (
        dumps,
        loads,
    )


    def plain(a, b=")"):
        # a comment first
        x = [
            a,
        ]
        return x


    @staticmethod
    @some.decorator(
        "def not_a_def():",
    )
    def decorated(
        a: "dict[str, int]" = {"k": (1, 2)},
        *args,
    ) -> "tuple[int]":
        """Its docstring."""
        text = """
    col 0 text inside a string
    """
        if (
            a
        ):
            pass


    def one_line(): return 1


    def defaults(k=lambda v: v, table={1: 2}, cut=[0][:1]) -> dict:
        return {k: table}


    async def coro(x):
        async with x:
            await x
        # a trailing comment
            # deeper


    class Outer:
        attr = property(lambda self: 1)
        items = [i for i in range(3)]

        def method(self):
            def inner():
                return 2
            return inner

        class Inner:
            def deep(self, y):
                import sys
                return y

    if os.name == "nt":
        def windows_only():
            import msvcrt
    else:
        def posix_only():
            import fcntl

    RESULT = plain(1)
    ''')


def _outside_bodies(tree) -> str:
    """The tree with every function's body (and its docstring) taken away."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.body = []
    return ast.dump(tree, include_attributes=False)


def _module(tmp_path, source: str, name: str = "tricky"):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    py_compile.compile(str(path), cfile=importlib.util.cache_from_source(str(path)), doraise=True)
    return str(path)


def test_everything_outside_function_bodies_is_kept(tmp_path):
    path = _module(tmp_path, TRICKY)
    source = open(path, "rb").read()
    light = pysource.skimmed(path, source, TAG)
    assert light is not None and len(light) < len(source)
    assert light.count(b"\n") == source.count(b"\n")  # line numbers in notes stay right
    assert _outside_bodies(ast.parse(light)) == _outside_bodies(ast.parse(source))
    skimmed_tree = ast.parse(light)
    bodies = {n.name: n.body for n in ast.walk(skimmed_tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert [type(s) for s in bodies["plain"]] == [ast.Pass]  # left out
    assert [type(s) for s in bodies["one_line"]] == [ast.Return]  # on its header's line: kept
    assert [type(s) for s in bodies["defaults"]] == [ast.Pass]
    assert b"import msvcrt" not in light and b"import sys\n" not in light


def test_a_stale_or_foreign_pyc_is_not_used(tmp_path):
    path = _module(tmp_path, TRICKY)
    with open(path, "a") as handle:
        handle.write("import changed_after_compiling\n")  # the .pyc's source size no longer matches
    assert pysource.skimmed(path, open(path, "rb").read(), TAG) is None
    path = _module(tmp_path, TRICKY, "foreign")
    pyc = importlib.util.cache_from_source(path)
    data = bytearray(open(pyc, "rb").read())
    data[0] ^= 0xFF  # another Python's magic number
    open(pyc, "wb").write(bytes(data))
    assert pysource.skimmed(path, open(path, "rb").read(), TAG) is None
    assert pysource.skimmed(path, open(path, "rb").read(), "cpython-299") is None  # no such .pyc


def test_a_hash_based_pyc_is_checked_against_the_source(tmp_path):
    path = tmp_path / "hashed.py"
    path.write_text(TRICKY)
    py_compile.compile(str(path), cfile=importlib.util.cache_from_source(str(path)), doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    assert pysource.skimmed(str(path), path.read_bytes(), TAG) is not None
    edited = TRICKY.replace("RESULT = plain(1)", "RESULT = plain(2)")  # same size, same mtime second
    assert pysource.skimmed(str(path), edited.encode(), TAG) is None


def test_real_modules_keep_everything_outside_their_bodies():
    """The standard library's own modules and their .pyc (where this Python has them)."""
    import email
    import json

    checked = 0
    for package in (email, json):
        directory = os.path.dirname(package.__file__)
        for name in sorted(os.listdir(directory)):
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            source = open(path, "rb").read()
            light = pysource.skimmed(path, source, TAG)
            if light is None:
                continue
            try:
                tree = ast.parse(light)
            except SyntaxError:
                continue  # the planner parses the whole source then
            assert _outside_bodies(tree) == _outside_bodies(ast.parse(source)), path
            checked += 1
    if not checked:
        pytest.skip("this Python's standard library has no current .pyc files")


PLANNED = textwrap.dedent('''\
    def helper(depth):
        if depth:
            return helper(depth - 1)
        from json import dumps
        return dumps


    def other():
        if helper:
            import email.mime.text


    helper(2)
    other()
    import ctypes
    _lib = ctypes.CDLL(None)
    ''')


def test_the_plan_from_skimmed_modules_is_the_plan_from_whole_ones(tmp_path):
    """Functions run at import time (one calling itself, one importing under a condition)
    are read with their bodies: the notes and loads are those of the whole source."""
    import compileall

    from seedance.collect import python_env

    site = tmp_path / "site"
    (site / "planned").mkdir(parents=True)
    (site / "planned" / "__init__.py").write_text(PLANNED)
    compileall.compile_dir(str(site), quiet=1)
    interp = python_env.ask_interpreter(sys.executable, env={**os.environ, "PYTHONPATH": str(site)})
    plans = {}
    for skim in (True, False):
        planner = python_env._Planner(interp)
        if not skim:
            planner._cache_tag = ""  # every module parsed whole
        plan = python_env.ImportPlan(names=("planned",))
        planner.plan = plan
        python_env._plan_names(planner, plan, ["planned"])
        plans[skim] = ([(load.module, load.path) for load in plan.loads], plan.notes, plan.missing)
    assert plans[True] == plans[False]
    notes = [n for n in plans[True][1] if "planned/__init__.py" in n]
    assert any(":8: other() runs at import time" in n for n in notes), notes
    assert not any("helper()" in n for n in notes), notes  # its one import is unconditional
