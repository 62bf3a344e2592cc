"""The one command-line boundary: parse, dispatch, and map every error to an exit code.

Each subcommand lives in seedance.commands.<name> and exposes
``configure_parser(subparsers)`` and ``execute(args) -> int``.  Only command modules
print; the core returns data.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__
from .errors import EXIT_USAGE, SeedanceError, UsageError, describe_os_error

# name -> module under seedance.commands.  Order is the order shown in --help.
COMMANDS = {
    "check": "check",
    "ldd": "ldd",
    "fix": "fix",
    "run": "run",
    "trace": "trace",
    "agent": "agent",
    "status": "status",
    "plugin": "plugin",
    "bench": "bench",
    "profiler": "profiler",
}

EPILOG = """\
examples:
  seedance check                          check this host (processes, ld.so.cache, configs, caches)
  seedance check --report-json r.json ./build
  seedance check --pid 4242               what a running process really loaded
  seedance ldd /usr/lib/x86_64-linux-gnu/libcurl.so.4
  seedance check --explain libcudart.so.12 ./libkernels.so
  seedance run --affinity gpu:1 --mem-limit 8G -- python train.py
  seedance plugin verify --strict --report-json | jq '.waste_traps[]'
"""


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in one line with exit code 2."""

    def error(self, message):
        raise UsageError(f"{self.prog}: {message}")


def build_parser(prog: str = "seedance") -> argparse.ArgumentParser:
    parser = _Parser(prog=prog,
                     description="Find and fix the hidden traps that waste GPU compute and break GPU plugins.",
                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"seedance {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module in COMMANDS.items():
        mod = importlib.import_module(f"seedance.commands.{module}")
        mod.configure_parser(sub)
    return parser


def main(argv: list[str] | None = None, prog: str = "seedance") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(prog)
        args = parser.parse_args(argv)
        if not getattr(args, "command", None):
            parser.print_help()
            return EXIT_USAGE
        return int(args.execute(args) or 0)
    except SeedanceError as exc:
        _error_line(str(exc), exc.exit_code)
        return exc.exit_code
    except KeyboardInterrupt:
        _error_line("interrupted", 130)
        return 130
    except BrokenPipeError:
        # stdout went away (| head): not an error of ours, and nothing more to say.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except OSError as exc:
        _error_line(describe_os_error(exc), EXIT_USAGE)
        return EXIT_USAGE


def _error_line(text: str, code: int) -> None:
    prefix = "seedance: " if not text.startswith("seedance") else ""
    print(f"{prefix}error: {text}" if code == EXIT_USAGE else f"{prefix}{text}", file=sys.stderr)


def _alias(command: str, prog: str):
    def entry() -> int:
        return main([command, *sys.argv[1:]], prog=prog)
    return entry


# Console-script aliases from the product notes: same flags as the subcommand.
check_alias = _alias("check", "seedance-check")
fix_alias = _alias("fix", "seedance-fix")
plugin_alias = _alias("plugin", "seedance-plugin")
bench_alias = _alias("bench", "seedance-bench")
profiler_alias = _alias("profiler", "seedance-profiler")


def console() -> None:
    raise SystemExit(main())
