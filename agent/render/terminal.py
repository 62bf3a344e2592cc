"""The terminal's width, as shutil.get_terminal_size() gives it, without importing shutil
(shutil imports bz2, lzma and fnmatch at its own import: every check's start would pay for
compression modules it never uses)."""
from __future__ import annotations

import os
import sys


def columns(fallback: int) -> int:
    """$COLUMNS when it is a positive number, else stdout's terminal width, else ``fallback``
    (shutil.get_terminal_size((fallback, ...)).columns)."""
    try:
        width = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        width = 0
    if width <= 0:
        try:
            width = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            width = 0
    return width or fallback
