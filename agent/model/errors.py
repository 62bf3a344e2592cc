"""One small error hierarchy with one mapping to exit codes.

Exit codes: 0 clean, 1 findings at or above the threshold, 2 usage error or bad input.
Everything the CLI catches at its single boundary (seedance.cli.main) is a SeedanceError;
OS errors are translated there too, so no traceback ever reaches the user.
"""
from __future__ import annotations

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_NOT_RUNNING = 3  # systemctl status and LSB init scripts: "program is not running"


class SeedanceError(Exception):
    """Base class: one line of text for the user, exit code 2."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:  # one line, always: a newline from a file name is shown as \\n
        return escape_path(self.message)


class UsageError(SeedanceError):
    """The command line itself is wrong."""


class BadInput(SeedanceError):
    """A file, PID, config or rule that seedance was pointed at cannot be used."""


class ELFError(BadInput):
    """A file is not ELF, or its ELF structures are malformed."""


class RuleError(BadInput):
    """A rules file does not load or does not validate."""


class NotAvailable(SeedanceError):
    """A capability that is not built, or not possible on this host (no GPU, no eBPF, ...)."""


class NotRunning(NotAvailable):
    """The agent asked for is not running: exit 3, as `systemctl status` of an inactive unit,
    so a script tells "not running" from "cannot ask" (2) without reading the line."""

    exit_code = EXIT_NOT_RUNNING


def escape_path(value) -> str:
    """A path (or any text from outside) safe to print on one line: control characters
    (newline, CR, ESC, DEL, C1) and undecodable bytes (surrogateescape) become \\n, \\xNN,
    so a crafted file name cannot forge a `seedance: error:` line or a table row.  Used by
    render and by the CLI's error line."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "surrogateescape")
    text = str(value)
    # isprintable() is False for every character _UNSAFE matches (categories Cc, Cs, Zl,
    # Zp), so printable text needs neither the pattern nor `re` (importing re also imports
    # enum and re's own compiler and parser: a cost on every `seedance ldd` that escapes nothing)
    if text.isprintable():
        return text
    import re

    return re.sub(_UNSAFE, _escape_one, text)


def _escape_one(match) -> str:
    char = match.group(0)
    code = ord(char)
    if char in _NAMED:
        return _NAMED[char]
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte kept by surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# C0, DEL, C1, lone surrogates, and the Unicode line/paragraph separators
_UNSAFE = "[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029]"


def describe_os_error(err: OSError) -> str:
    """Render an OSError as 'PATH: reason' without the errno noise."""
    reason = err.strerror or err.__class__.__name__
    if err.filename is not None:
        return f"{escape_path(err.filename)}: {reason.lower()}"
    return reason.lower()
