"""Commands whose capability has not landed yet: they say so and exit 2, never fake output."""
from __future__ import annotations

import argparse

from ..model.errors import NotAvailable


def register(sub, name: str, help_text: str, issue: str) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=f"{help_text} (not yet available)",
                            description=f"{help_text}.  Not yet available: planned in {issue}.")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def execute(args) -> int:
        raise NotAvailable(f"seedance {name}: not yet available (planned in {issue})")

    parser.set_defaults(execute=execute)
    return parser
