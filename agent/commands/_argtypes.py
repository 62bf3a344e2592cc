"""argparse value types and flags shared by the commands: one wording for a bad number
everywhere, one spelling of the report flags."""
from __future__ import annotations

import argparse
import math


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def positive_float(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def bounded_int(low: int, high: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}: {text!r}")
        return value
    return parse


def add_report_flags(parser) -> None:
    """--report-json FILE, --json (the same as --report-json -) and --force, read back as
    ``"-" if args.json else args.report_json`` and handed to seedance.render.output."""
    parser.add_argument("--report-json", metavar="FILE", help="write seedance.report/v1 (- for stdout)")
    parser.add_argument("--json", action="store_true", help="the report on stdout (same as --report-json -)")
    parser.add_argument("--force", action="store_true", help="overwrite an output file that is not a seedance output")
