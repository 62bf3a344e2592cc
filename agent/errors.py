"""One small error hierarchy with one mapping to exit codes.

Exit codes: 0 clean, 1 findings at or above the threshold, 2 usage error or bad input.
Everything the CLI catches at its single boundary (seedance.cli.main) is a SeedanceError;
OS errors are translated there too, so no traceback ever reaches the user.
"""
from __future__ import annotations

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2


class SeedanceError(Exception):
    """Base class: one line of text for the user, exit code 2."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:  # one line, always
        return " ".join(self.message.split())


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


def describe_os_error(err: OSError) -> str:
    """Render an OSError as 'PATH: reason' without the errno noise."""
    reason = err.strerror or err.__class__.__name__
    if err.filename is not None:
        return f"{err.filename}: {reason.lower()}"
    return reason.lower()
