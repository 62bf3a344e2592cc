"""A module's source with the bodies of its functions left out, found through its bytecode.

Predicting an import walks what a module runs when imported: its top-level statements and
class bodies.  Function bodies run only when called, and they are most of a large
package's source (torch's ~1,000 modules: ~60% of the lines), so parsing them is most of
the work, while the interpreter itself never parses at all: it loads __pycache__/*.pyc.

The .pyc of a module, when it is current for the source exactly as importlib decides
(importlib._bootstrap_external: the source's mtime and size in the header, or its
SipHash for a hash-based one), holds the module's code and its class bodies' code, where
the instruction that makes each function carries the source position of its whole `def`
statement (co_positions(): the `def` line and the last line of the body).  From the line
after the header's ':' to that last line is the body: replaced by ``pass`` and empty lines
(the line count kept, so line numbers in notes stay right) before parsing.  Any doubt
leaves a function whole, or gives None and the caller parses the whole source: a .pyc of
another Python (its magic number), one that is stale, a body on its header's line; a
result that does not parse is parsed whole by the caller.
"""
from __future__ import annotations

import bisect
import dis
import itertools
import marshal
import os
import re

_FUNCTION = 0x1 | 0x2  # CO_OPTIMIZED | CO_NEWLOCALS: a function's code, not a class body's


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


_MAKE_FUNCTION = dis.opmap["MAKE_FUNCTION"]


def _def_ends(code, ends: dict) -> None:
    """{line of a `def`: the last line of its body} for the functions the module's code and
    its class bodies make: the instruction that makes a function carries the whole `def`
    statement's position (its line, the end of its body), as the compiler sets it for the
    statement.  A lambda or comprehension made on a `def`'s line ends before the `def` does."""
    raw = code.co_code
    positions = None
    for offset in range(0, len(raw), 2):
        if raw[offset] == _MAKE_FUNCTION:
            if positions is None:
                positions = list(code.co_positions())
            start, end = positions[offset // 2][:2]
            if start is not None and end is not None and end > ends.get(start, 0):
                ends[start] = end
    for item in code.co_consts:
        if hasattr(item, "co_code") and item.co_flags & _FUNCTION != _FUNCTION:
            _def_ends(item, ends)  # a class body: its methods


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


def _body(lines: list, text: bytes, offsets: list, def_line: int, last: int):
    """(first body line, the body's indentation) of the function whose `def` is on line
    ``def_line`` (1-based) and whose body ends on line ``last``; None when its body shares
    a line with its header, or anything is unclear."""
    if def_line > len(lines) or last > len(lines) or not _DEF.match(lines[def_line - 1]):
        return None  # a lambda's or a comprehension's line
    head = lines[def_line - 1]
    def_indent = len(_indent(head))
    if head.rstrip().endswith(b":") and not any(c in head for c in (b"#", b"'", b'"', b"\\")) \
            and head.count(b"(") == head.count(b")") and head.count(b"[") == head.count(b"]") \
            and head.count(b"{") == head.count(b"}"):
        return _body_after(lines, def_line, last, def_indent)  # the whole header on its line
    depth, at = 0, offsets[def_line - 1]
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
    if header_end > last or not _blank_or_comment(lines[header_end - 1][at - offsets[header_end - 1]:]):
        return None  # `def f(): return x`: the body is on the header's line
    return _body_after(lines, header_end, last, def_indent)


def _body_after(lines: list, header_end: int, last: int, def_indent: int):
    """The body's first line after a header that ends on ``header_end``, and its indentation."""
    start = header_end + 1
    while start <= last and _blank_or_comment(lines[start - 1]):
        start += 1
    if start > last:
        return None
    indent = _indent(lines[start - 1])
    if len(indent) <= def_indent:
        return None
    return start, indent


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
    found: dict = {}
    _def_ends(code, found)
    if not found:
        return None
    lines = source.split(b"\n")
    offsets = list(itertools.accumulate(map((1).__add__, map(len, lines)), initial=0))  # each line's start
    ends: dict = {}
    covered = 0  # a function inside one already left out (a def in a class in a def) goes with it
    for def_line, last in sorted(found.items()):
        if def_line <= covered:
            continue
        body = _body(lines, source, offsets, def_line, last)
        if body is None:
            continue
        start, indent = body
        lines[start - 1] = indent + b"pass"
        lines[start:last] = [b""] * (last - start)
        ends[def_line] = covered = last
    return (b"\n".join(lines), ends) if ends else None


def function_source(source: bytes, def_line: int, end: int) -> bytes:
    """Lines ``def_line``..``end`` of ``source``, the whole text of one left-out function
    whose `def` starts its line: parsed alone when it runs at import time."""
    lines = source.split(b"\n", end)[:end]
    return b"\n".join(lines[def_line - 1:end])
