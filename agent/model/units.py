"""Sizes and durations: one grammar for every command, config file and policy.

Sizes are Kubernetes resource quantities (apimachinery's resource.Quantity), because
the same people write pod specs, WorkloadQuotaPolicy files and `seedance run --mem-limit`:

    8Gi  512Mi  4Ki     powers of 1024 (Ki Mi Gi Ti Pi Ei)
    1.5G  500M  64k     powers of 1000 (k M G T P E; kilo is a lowercase k, as in SI)
    4096                a bare number is bytes
    8GiB  500MB         a trailing B is allowed and changes nothing (nvidia-smi writes MiB)

A fraction rounds up to a whole byte, as Quantity.Value() does (1.5 -> 2).  Suffixes are
case-sensitive: K, g and t are refused rather than guessed, and so is m, which Kubernetes
reads as milli (Docker's 512m meaning MiB is the trap it would set).  Quantity's exponent
forms (1e9) are not accepted.  A size is at most 2^64 - 1 bytes.  The launcher
(shim/src/launcher.c, parse_size) reads --mem-limit with exactly this grammar.

Durations are Go's time.ParseDuration spellings, as Prometheus, Kubernetes and systemd
users write them: 10ms, 2s, 1m, 1h, 1m30s, 1.5h (units us ms s m h d; parts add up).
A bare number is seconds (0.5 is half a second).
"""
from __future__ import annotations

import math
import re

from .errors import BadInput

# str.strip() would also strip \x1c-\x1f and Unicode spaces, which C's isspace() (the
# launcher's) does not: both entry points take the same words
_SPACE = " \t\n\v\f\r"
SIZE_SUFFIXES = {"": 1,
                 "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
                 "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
MAX_SIZE = 2**64 - 1
MAX_FRACTION_DIGITS = 18
_SIZE = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+)(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?B?")
SIZE_EXAMPLES = "e.g. 8Gi, 1.5G, 512Mi; a bare number is bytes"

DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+)(us|ms|s|m|h|d)")
_NUMBER = re.compile(r"[0-9]+\.?[0-9]*|\.[0-9]+")
DURATION_EXAMPLES = "e.g. 500ms, 2s, 1m30s, 1h; a bare number is seconds"


def _quoted(text: str) -> str:
    return repr(text)


def parse_size(text, what: str = "size", minimum: int = 0) -> int:
    """A Kubernetes quantity -> bytes.  Bad input is one BadInput line naming WHAT."""
    if isinstance(text, int) and not isinstance(text, bool):
        value, shown = text, str(text)
    else:
        shown = str(text)
        match = _SIZE.fullmatch(shown.strip(_SPACE))
        if not match:
            stripped = shown.strip(_SPACE)
            if re.fullmatch(r"[0-9.]+mB?", stripped):
                raise BadInput(f"{what}: {_quoted(shown)}: m is milli in a quantity; "
                               "write Mi (1024*1024) or M (1000*1000)")
            raise BadInput(f"{what}: {_quoted(shown)} is not a size ({SIZE_EXAMPLES})")
        number, suffix = match.group(1), match.group(2) or ""
        whole, _, fraction = number.partition(".")
        if len(fraction) > MAX_FRACTION_DIGITS:
            raise BadInput(f"{what}: {_quoted(shown)} is not a size ({SIZE_EXAMPLES})")
        scaled = int((whole or "0") + fraction) * SIZE_SUFFIXES[suffix]
        value = -(-scaled // 10 ** len(fraction))      # rounded up, as Quantity.Value()
    if value > MAX_SIZE:
        raise BadInput(f"{what}: {_quoted(shown)} is too large (at most 2^64 - 1 bytes)")
    if value < minimum:
        raise BadInput(f"{what}: {_quoted(shown)} must be more than 0" if minimum == 1
                       else f"{what}: {_quoted(shown)} is below {format_size(minimum)}")
    return value


def format_size(value: int) -> str:
    """Bytes in the largest binary unit that divides them exactly (as kubectl prints a
    quantity it parsed): 8589934592 -> 8Gi, 1500000000 -> 1500000000."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = SIZE_SUFFIXES[suffix]
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


def parse_duration(text, what: str = "duration", maximum: float | None = None) -> float:
    """'10ms', '2s', '1m30s', '1h', 90 or '0.5' (seconds) -> seconds, more than zero."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds, shown = float(text), str(text)
    else:
        shown = str(text)
        stripped = shown.strip(_SPACE)
        if _NUMBER.fullmatch(stripped):
            seconds = float(stripped)
        else:
            seconds, position = 0.0, 0
            for part in _DURATION_PART.finditer(stripped):
                if part.start() != position:
                    break
                seconds += float(part.group(1)) * DURATION_UNITS[part.group(2)]
                position = part.end()
            if not stripped or position != len(stripped):
                raise BadInput(f"{what}: {_quoted(shown)} is not a duration ({DURATION_EXAMPLES})")
    if not math.isfinite(seconds):  # YAML's .inf and .nan: a timer cannot wait for them
        raise BadInput(f"{what}: {_quoted(shown)} is not a finite duration")
    if seconds <= 0:
        raise BadInput(f"{what}: {_quoted(shown)} must be longer than zero")
    if maximum is not None and seconds > maximum:
        raise BadInput(f"{what}: {_quoted(shown)} is longer than {format_duration(maximum)}")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds in the grammar parse_duration reads: 90 -> 1m30s, 0.25 -> 250ms, 7200 -> 2h."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    if not float(seconds).is_integer():
        return f"{seconds:g}s"
    whole, parts = int(seconds), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size:
            parts.append(f"{whole // size}{unit}")
            whole %= size
    return "".join(parts)


def duration_type(what: str, maximum: float | None = None):
    """An argparse type= for a duration flag: the same grammar and the same one line."""
    def parse(text: str) -> float:
        import argparse

        try:
            return parse_duration(text, what, maximum)
        except BadInput as exc:
            raise argparse.ArgumentTypeError(exc.message.removeprefix(f"{what}: ")) from None
    return parse
