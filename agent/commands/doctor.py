"""seedance doctor: which optional parts of this install are present, one line each."""
from __future__ import annotations

import argparse
import json
import sys

from ..model.errors import escape_path

EPILOG = """\
examples:
  seedance doctor            one line per part: present or not, where, or how to get it
  seedance doctor --json | jq '.parts[] | select(.present | not)'

Exit status: 0 whatever is missing (a missing part is a fact about the install, not an error).
"""


def configure_parser(sub):
    parser = sub.add_parser("doctor", help="List the optional parts of this install that are present",
                            description="List the optional parts seedance can use and whether this install "
                                        "has them: the CUDA shim, the C ELF reader, bcc, NVML, graphviz's dot, "
                                        "each pip extra, the example plugins, the man pages.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the parts as JSON")
    parser.set_defaults(execute=execute)


def execute(args) -> int:
    from .. import __version__
    from ..collect.selfcheck import survey

    parts = survey()
    if args.json:
        json.dump({"schema": "seedance.doctor/v1", "version": __version__, "python": sys.executable,
                   "parts": [part.to_dict() for part in parts]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    width = max(len(part.name) for part in parts)
    for part in parts:
        line = f"{'yes' if part.present else 'no ':3}  {part.name:{width}}  {part.detail}"
        if not part.present and part.install:
            line += f"; {part.install}"
        sys.stdout.write(escape_path(line) + "\n")
    return 0
