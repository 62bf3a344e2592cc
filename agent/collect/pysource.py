"""A module's source with the bodies of its functions left out, found through its bytecode.

Predicting an import walks what a module runs when imported: its top-level statements and
class bodies.  Function bodies run only when called, and they are most of a large
package's source (torch's ~1,000 modules: ~60% of the lines), so parsing them is most of
the work, while the interpreter itself never parses at all: it loads __pycache__/*.pyc.

The .pyc of a module, when it is current for the source exactly as importlib decides
(importlib._bootstrap_external: the source's mtime and size in the header, or its
SipHash for a hash-based one), holds a code object per function with the source position
of every instruction (co_positions(): start and end line).  The lines from a function's
first body instruction to the end of its last are its body: they are replaced by ``pass``
and empty lines (the line count kept, so line numbers in notes stay right) before parsing.
Any doubt gives None and the caller parses the whole source: a .pyc of another Python (its
magic number), one that is stale, a body on its `def` line, a result that does not parse.
"""
from __future__ import annotations

import bisect
import itertools
import marshal
import os
import re

_FUNCTION = 0x1 | 0x2  # CO_OPTIMIZED | CO_NEWLOCALS: a function's code, not a class body's
_INLINE = ("<lambda>", "<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>")  # parts of an expression


def pyc_path(source_path: str, cache_tag: str) -> str:
    """PEP 3147: __pycache__/NAME.TAG.pyc beside the source (not optimized: the interpreter's
    default -O level is what the planner predicts)."""
    directory, name = os.path.split(source_path)
    return os.path.join(directory, "__pycache__", f"{name.rpartition('.')[0]}.{cache_tag}.pyc")


def current_code(source_path: str, source: bytes, cache_tag: str):
    """The module's code object from its .pyc when that is current for ``source``, else None."""
    import importlib.util

    try:
        with open(pyc_path(source_path, cache_tag), "rb") as handle:
            data = handle.read()
        st = os.stat(source_path)
    except OSError:
        return None
    if len(data) < 16 or data[:4] != importlib.util.MAGIC_NUMBER:
        return None  # another Python's bytecode: not ours to read
    flags = int.from_bytes(data[4:8], "little")
    if flags & ~0b11:
        return None
    if flags & 0b1:  # hash-based (PEP 552): checked here whatever its check_source bit says
        if data[8:16] != importlib.util.source_hash(source):
            return None
    elif (int.from_bytes(data[8:12], "little") != int(st.st_mtime) & 0xFFFFFFFF
          or int.from_bytes(data[12:16], "little") != len(source) & 0xFFFFFFFF):
        return None
    try:
        code = marshal.loads(memoryview(data)[16:])
    except (ValueError, EOFError, TypeError):
        return None
    return code if hasattr(code, "co_positions") else None


def _last_line(code) -> int:
    """The last line an instruction of a function (or of the code nested in it) starts on;
    the lines after it that are still the body's (a call's closing parenthesis, a dropped
    `pass`) are indented deeper than its `def` (_body)."""
    last = 0
    stack = [code]
    while stack:
        item = stack.pop()
        for _start, _end, line in item.co_lines():
            if line is not None and line > last:
                last = line
        stack.extend(c for c in item.co_consts if hasattr(c, "co_lines"))
    return last


def _functions(code, out: list) -> None:
    """(first line, last line) of every outermost function in the module's or a class
    body's code: first is where its decorators or `def` start."""
    for item in code.co_consts:
        if not hasattr(item, "co_positions") or item.co_name in _INLINE:
            continue
        if item.co_flags & _FUNCTION == _FUNCTION:
            out.append((item.co_firstlineno, _last_line(item)))
        else:
            _functions(item, out)  # a class body: its methods


# what can hide a ':' or a bracket in a def's header: strings (any prefix) and comments
_HEADER_TOKEN = re.compile(rb"""[rRbBuUfF]{0,2}(\"\"\"|'''|"|')|#[^\n]*|[()\[\]{}:]""")
_STRING_END = {
    b'"""': re.compile(rb'(?:[^"\\]|\\.|"(?!""))*"""', re.S),
    b"'''": re.compile(rb"(?:[^'\\]|\\.|'(?!''))*'''", re.S),
    b'"': re.compile(rb'(?:[^"\\\n]|\\.)*"'),
    b"'": re.compile(rb"(?:[^'\\\n]|\\.)*'"),
}
_DEF = re.compile(rb"[ \t]*(?:async[ \t]+)?def[ \t]")


def _indent(line: bytes) -> bytes:
    return line[:len(line) - len(line.lstrip(b" \t"))]


def _blank_or_comment(line: bytes) -> bool:
    stripped = line.strip()
    return not stripped or stripped.startswith(b"#")


def _body(lines: list, text: bytes, offsets: list, first: int, last: int):
    """(its `def` line, first body line, last body line, the body's indentation) of the
    function whose decorators or `def` start on line ``first`` (1-based) and whose
    instructions end on line ``last``; None when its body shares a line with its header,
    or anything is unclear."""
    line = first
    while not _DEF.match(lines[line - 1]):
        line += 1
        if line > last or line > len(lines):
            return None
    def_indent = len(_indent(lines[line - 1]))
    depth, at = 0, offsets[line - 1]
    while True:  # to the ':' that ends the header, outside brackets, strings and comments
        match = _HEADER_TOKEN.search(text, at)
        if match is None:
            return None
        token, at = match.group(0), match.end()
        if match.group(1):
            end = _STRING_END[match.group(1)].match(text, at)
            if end is None:
                return None
            at = end.end()
        elif token in (b"(", b"[", b"{"):
            depth += 1
        elif token in (b")", b"]", b"}"):
            depth -= 1
        elif token == b":" and depth == 0:
            break
    header_end = bisect.bisect_right(offsets, at - 1)  # the line holding the ':'
    if not _blank_or_comment(lines[header_end - 1][at - offsets[header_end - 1]:]):
        return None  # `def f(): return x`: the body is on the header's line
    start = header_end + 1
    while start <= min(last, len(lines)) and _blank_or_comment(lines[start - 1]):
        start += 1
    if start > last or start > len(lines):
        return None
    indent = _indent(lines[start - 1])
    if len(indent) <= def_indent:
        return None
    end = last
    # a body's last lines without an instruction (a `pass` the compiler dropped, a comment)
    # are still indented deeper than its `def`, or blank
    while end < len(lines) and (_blank_or_comment(lines[end]) or len(_indent(lines[end])) > def_indent):
        end += 1
    return line, start, end, indent


def skimmed(source_path: str, source: bytes, cache_tag: str) -> bytes | None:
    """``source`` with every function body replaced by ``pass``, or None (no current .pyc,
    or nothing to leave out)."""
    found = skim(source_path, source, cache_tag)
    return found[0] if found is not None else None


def skim(source_path: str, source: bytes, cache_tag: str):
    """(skimmed source, {line of a left-out function's `def`: the last line of its body}),
    or None."""
    code = current_code(source_path, source, cache_tag)
    if code is None:
        return None
    found: list = []
    _functions(code, found)
    if not found:
        return None
    lines = source.split(b"\n")
    offsets = list(itertools.accumulate(map((1).__add__, map(len, lines)), initial=0))  # each line's start
    ends: dict = {}
    for first, last in sorted(found):
        body = _body(lines, source, offsets, first, last)
        if body is None:
            continue
        def_line, start, end, indent = body
        lines[start - 1] = indent + b"pass"
        lines[start:end] = [b""] * (end - start)
        ends[def_line] = end
    return (b"\n".join(lines), ends) if ends else None


def function_source(source: bytes, def_line: int, end: int) -> bytes:
    """Lines ``def_line``..``end`` of ``source``, the whole text of one left-out function
    whose `def` starts its line: parsed alone when it runs at import time."""
    lines = source.split(b"\n", end)[:end]
    return b"\n".join(lines[def_line - 1:end])
