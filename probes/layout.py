"""The event layout, read from events.h: the one definition both sides share.

The BPF programs include events.h; this module parses the same file into a ctypes
Structure and a table of the SD_* constants, so a field added to the header is seen by
Python without a second, hand-synced copy.
"""
from __future__ import annotations

import ctypes
import re
from functools import lru_cache

from . import PROBES_DIR

HEADER = PROBES_DIR / "events.h"

_CTYPES = {
    "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32, "u64": ctypes.c_uint64,
    "s8": ctypes.c_int8, "s16": ctypes.c_int16, "s32": ctypes.c_int32, "s64": ctypes.c_int64,
    "char": ctypes.c_char,
}
_DEFINE = re.compile(r"^#define\s+(SD_\w+)\s+(-?\d+)\b", re.M)
_STRUCT = re.compile(r"struct\s+sd_event\s*\{(.*?)\};", re.S)
_FIELD = re.compile(r"^\s*(\w+)\s+(\w+)\s*(?:\[\s*(\w+)\s*\])?\s*;\s*$")


class LayoutError(Exception):
    pass


@lru_cache(maxsize=None)
def constants(text: str | None = None) -> dict:
    """Every ``#define SD_NAME <int>`` of events.h."""
    text = HEADER.read_text() if text is None else text
    return {name: int(value) for name, value in _DEFINE.findall(text)}


def fields(text: str | None = None) -> list:
    """[(name, ctype)] of struct sd_event, in order."""
    text = HEADER.read_text() if text is None else text
    match = _STRUCT.search(text)
    if not match:
        raise LayoutError(f"{HEADER}: no struct sd_event")
    defines = constants(text)
    out = []
    for line in match.group(1).splitlines():
        line = line.split("/*")[0].split("//")[0]
        if not line.strip():
            continue
        field = _FIELD.match(line)
        if not field or field.group(1) not in _CTYPES:
            raise LayoutError(f"{HEADER}: cannot parse struct field {line.strip()!r}")
        ctype = _CTYPES[field.group(1)]
        if field.group(3):
            length = field.group(3)
            count = int(length) if length.isdigit() else defines.get(length)
            if count is None:
                raise LayoutError(f"{HEADER}: unknown array length {length}")
            ctype = ctype * count
        out.append((field.group(2), ctype))
    return out


@lru_cache(maxsize=None)
def event_struct() -> type:
    """The ctypes mirror of struct sd_event (natural alignment, as clang lays it out)."""
    return type("SdEvent", (ctypes.Structure,), {"_fields_": fields()})


def names(prefix: str) -> dict:
    """{value: short name} for one constant family, e.g. names("SD_EV_")[1] == "exec"."""
    return {value: name[len(prefix):].lower() for name, value in constants().items()
            if name.startswith(prefix)}
