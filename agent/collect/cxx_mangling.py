"""What a mangled C++ name says about std::string's ABI (GCC's dual ABI).

GCC's _GLIBCXX_USE_CXX11_ABI changes how std::string mangles: the old ABI uses the standard
abbreviation ``Ss``, the new one spells out ``NSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE``.
Only the names are read; nothing is demangled.  Both the C++ ABI check (cxxabi.py) and the
torch extension cache (torch_ext.py) judge builds by these names, so they live below both.
"""
from __future__ import annotations

import functools
import re

NEW_ABI_MARK = "__cxx11"
OLD, NEW = "pre-cxx11", "cxx11"
# Namespaces torch's own libraries export (c10, at, torch, caffe2), plain or const member.
TORCH_PREFIXES = tuple(f"_ZN{q}{ns}" for q in ("", "K") for ns in ("3c10", "2at", "5torch", "6caffe2"))
_SEQ_ID = re.compile(r"[0-9A-Z]*_")


@functools.lru_cache(maxsize=1 << 16)  # torch's test programs and extensions share most names
def uses_old_string(symbol: str) -> bool:
    """True when the mangled name contains the old-ABI std::string abbreviation ``Ss``.

    ``Ss`` may also occur inside an identifier ("isSsl"), so identifiers (<length><name>),
    substitutions and template parameters (S<seq-id>_, T<seq-id>_) and literals (L...E)
    are stepped over before looking.  Every part stepped over leaves a space in
    _mangling_codes' output, so an ``Ss`` there is an ``Ss`` of the name: a name without one
    is not walked (most of torch's names: the walk is a Python loop over the name, and
    libtorch_cpu alone exports about a hundred thousand).
    """
    return "Ss" in symbol and "Ss" in _mangling_codes(symbol)


def uses_new_string(symbol: str) -> bool:
    return NEW_ABI_MARK in symbol


def _mangling_codes(symbol: str) -> str:
    out = []
    index, length = 0, len(symbol)
    while index < length:
        char = symbol[index]
        if char in "ST" and index + 1 < length:
            match = _SEQ_ID.match(symbol, index + 1)
            if match:
                out.append(" ")
                index = match.end()
                continue
            out.append(char)
            index += 1
        elif char == "L" and index + 1 < length and not symbol[index + 1].isdigit() \
                and symbol[index + 1] != "_":
            end = symbol.find("E", index + 1)
            index = length if end < 0 else end + 1
            out.append(" ")
        elif char.isdigit() and index and symbol[index - 1] in "CD":
            out.append(char)  # constructor/destructor kind (C1, D2), not an identifier length
            index += 1
        elif char.isdigit():
            end = index
            while end < length and symbol[end].isdigit():
                end += 1
            index = end + int(symbol[index:end])
            out.append(" ")
        else:
            out.append(char)
            index += 1
    return "".join(out)


def torch_abi_of(defined_names) -> tuple:
    """(abi, example) of a torch library from its exports, c10/at/torch/caffe2 names only."""
    return abi_of(name for name in defined_names if name.startswith(TORCH_PREFIXES))


def abi_of(symbol_names) -> tuple:
    """(abi, example) from mangled names; (None, None) when no name involves std::string."""
    old = new = None
    old_count = new_count = 0
    for name in symbol_names:
        if not name.startswith("_Z"):
            continue
        if uses_new_string(name):
            new_count += 1
            new = new or name
        elif uses_old_string(name):
            old_count += 1
            old = old or name
    if not old_count and not new_count:
        return None, None
    return (NEW, new) if new_count >= old_count else (OLD, old)
