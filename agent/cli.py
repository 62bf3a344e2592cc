"""The one command-line boundary: parse, dispatch, and map every error to an exit code.

Each subcommand lives in seedance.commands.<name> and exposes
``configure_parser(subparsers)`` and ``execute(args) -> int``.  Only command modules
print; the core returns data.
"""
from __future__ import annotations

import os
import sys

from . import __version__
from .model.errors import EXIT_USAGE, SeedanceError, UsageError, describe_os_error, escape_path

# argparse, json and re are imported when first needed: with the modules they pull in
# (enum, functools, collections, gettext) Python's import system would load and run them at
# every start, and `seedance ldd`, which parses its few words itself (_lean_ldd), needs
# none of them.

# name -> module under seedance.commands.  Order is the order shown in --help.
COMMANDS = {
    "check": "check",
    "ldd": "ldd",
    "why": "why",
    "fix": "fix",
    "run": "run",
    "trace": "trace",
    "agent": "agent",
    "status": "status",
    "plugin": "plugin",
    "bench": "bench",
    "profile": "profile",
    "profiler": "profiler",
    "pareto": "pareto",
    "quota": "quota",
    "completion": "completion",
    "doctor": "doctor",
}

EPILOG = """\
examples:
  seedance check                          check this host (processes, ld.so.cache, configs, caches)
  seedance check --report-json r.json ./build
  seedance check --pid 4242               what a running process really loaded
  seedance ldd /usr/lib/x86_64-linux-gnu/libcurl.so.4
  seedance check --explain libcudart.so.12 ./libkernels.so
  seedance run --affinity gpu:1 --mem-limit 8Gi -- python train.py
  seedance plugin verify --strict --report-json - | jq '.waste_traps[]'

errors: one line `seedance: error: ...` on stderr, exit 2 (0 clean, 1 findings).
"""


_PARSER_CLASS = None


def _parser_class():
    """_Parser, defined on first use (it subclasses argparse's parser)."""
    global _PARSER_CLASS
    if _PARSER_CLASS is None:
        import argparse

        class _Parser(argparse.ArgumentParser):
            """argparse that reports usage errors in one line with exit code 2."""

            def parse_known_args(self, args=None, namespace=None):
                self._words = list(sys.argv[1:] if args is None else args)  # for error()'s suggestion
                return super().parse_known_args(args, namespace)

            def error(self, message):
                raise UsageError(f"{self.prog}: {_did_you_mean(self, message)}")

            def _get_formatter(self):
                # argparse builds a formatter for every add_argument; without a width its
                # __init__ imports shutil (and with it zlib, bz2, lzma) for the terminal size,
                # which every command would pay at its start.  The same width, found the same way.
                return self.formatter_class(prog=self.prog, width=_terminal_width())

        _PARSER_CLASS = _Parser
    return _PARSER_CLASS


def _did_you_mean(parser, message: str) -> str:
    """argparse's message, with the closest command, action, choice or flag to a mistyped one
    (as git and cargo suggest): difflib over what this parser and the subcommands named on
    its command line accept."""
    import difflib
    import re

    choice = re.match(r"(?P<head>argument [^:]+: invalid choice: (?P<bad>'[^']*'|\"[^\"]*\")) "
                      r"\(choose from (?P<choices>.*)\)$", message)
    if choice:
        bad = choice.group("bad")[1:-1]
        close = difflib.get_close_matches(bad, re.findall(r"'([^']*)'", choice.group("choices")), n=1)
        return f"{choice.group('head')}; did you mean {close[0]!r}?" if close else message
    unknown = re.match(r"unrecognized arguments: (?P<words>.*)$", message)
    if not unknown:
        return message
    flags = set()
    current = parser
    for word in getattr(parser, "_words", []):
        flags.update(current._option_string_actions)
        sub = next((action.choices[word] for action in current._actions
                    if getattr(action, "choices", None) and isinstance(action.choices, dict)
                    and word in action.choices), None)
        if sub is not None:
            current = sub
    flags.update(current._option_string_actions)
    for word in unknown.group("words").split():
        if word.startswith("--"):
            close = difflib.get_close_matches(word.split("=", 1)[0], sorted(flags), n=1)
            if close:
                return f"{message}; did you mean {close[0]}?"
    return message


def _terminal_width() -> int:
    """shutil.get_terminal_size().columns - 2, as argparse.HelpFormatter uses it."""
    from .render.terminal import columns

    return columns(80) - 2


def build_parser(prog: str = "seedance", only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with ONLY (a name in COMMANDS) just that command's subparser:
    importing and configuring every command (each pulling in its own modules) would be paid
    at each run's start-up, and a run of `seedance ldd` needs only ldd's.  --help, a bad command name
    and the completion scripts still get every command."""
    import argparse
    import importlib

    parser_class = _parser_class()
    parser = parser_class(prog=prog,
                          description="Find and fix the hidden traps that waste GPU compute and break GPU plugins.",
                          epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"seedance {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=parser_class)
    # only="": no command at all (--version needs none of them)
    names = [only] if only in COMMANDS else ([] if only == "" else list(COMMANDS))
    for name in names:
        mod = importlib.import_module(f"seedance.commands.{COMMANDS[name]}")
        mod.configure_parser(sub)
    return parser


def _command_named(argv: list[str]) -> str | None:
    """The command argv runs, when its first word names one.  The top-level parser has no
    option that takes a value, so the first word is either an option (--help, --version)
    or the command.  "" for --version, which argparse answers before any command is
    looked at: importing every command for it was most of `seedance --version`."""
    if argv[:1] == ["--version"]:
        return ""
    return argv[0] if argv and argv[0] in COMMANDS else None


class _Words:
    """The attributes argparse's Namespace would hold for a `seedance ldd` command line."""

    def __init__(self, **values):
        self.__dict__.update(values)


def _lean_ldd(argv: list[str]):
    """`ldd [--json] [--secure] [--tree] [-v] [--env VAR=VALUE]... FILE` read without argparse,
    or None: anything else (--help, an abbreviation, `--env=`, a word starting with '-',
    a missing or second FILE) goes to argparse, which gives the usual help, errors and exit
    codes.  Importing argparse (with re, enum, gettext) and building ldd's parser would
    cost each `seedance ldd` more than the resolution itself, for a command meant to stand
    beside glibc's ldd (bench/bench_check_speed.py --ldd times the two).  The words accepted here are
    exactly those argparse reads the same way: whole option names, an --env value and a
    FILE that do not start with '-' (argparse would take those for options)."""
    if argv[:1] != ["ldd"]:
        return None
    flags = {"--json": False, "--secure": False, "--tree": False, "--verbose": False}
    env, files = [], []
    words = iter(argv[1:])
    for word in words:
        if word in flags or word == "-v":
            flags["--verbose" if word == "-v" else word] = True
        elif word == "--env":
            value = next(words, None)
            if value is None or value.startswith("-"):
                return None
            env.append(value)
        elif word and not word.startswith("-"):
            files.append(word)
        else:
            return None
    if len(files) != 1:
        return None
    from .commands import ldd

    return _Words(command="ldd", file=files[0], env=env, json=flags["--json"], secure=flags["--secure"],
                  tree=flags["--tree"], verbose=flags["--verbose"], execute=ldd.execute)


# the variables that can ask for traces (seedance.telemetry.wanted decides): without any of
# them no telemetry module is imported at all
_TRACE_VARIABLES = ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def main(argv: list[str] | None = None, prog: str = "seedance", command: str | None = None) -> int:
    """Parse, run, and turn every failure into one line on stderr:
    `seedance: error: ...`, exit 2.  Help goes to stdout, and only on --help.
    COMMAND: run as an alias of that subcommand (seedance-check is `seedance check`).
    With the OpenTelemetry variables set, the whole command is one span (seedance.telemetry)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not os.environ.keys().isdisjoint(_TRACE_VARIABLES):
        from . import telemetry

        if telemetry.wanted():
            return telemetry.run_command(lambda: _main(argv, prog, command),
                                         command or _command_named(argv), argv)
    return _main(argv, prog, command)


def _main(argv: list[str], prog: str, command: str | None) -> int:
    try:
        if command:
            parser = alias_parser(command, prog)
            args = parser.parse_args(argv)
            args.command = command
        else:
            args = _lean_ldd(argv)
            if args is None:
                parser = build_parser(prog, only=_command_named(argv))
                args = parser.parse_args(argv)
        if not getattr(args, "command", None):
            raise UsageError(f"{prog}: give a command (see {prog} --help)")
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
    except UnicodeError as exc:
        # a rule file, config or journal that is not UTF-8 text: bad input, not a crash
        _error_line(f"input is not valid UTF-8 text ({_unicode_reason(exc)})", EXIT_USAGE)
        return EXIT_USAGE
    except ValueError as exc:
        # a damaged state file, journal or report read back: bad input, one line.  json is
        # imported only by commands that read JSON; without it this cannot be its error.
        json = sys.modules.get("json")
        if json is None or not isinstance(exc, json.JSONDecodeError):
            return _internal_error(exc)
        _error_line(f"damaged JSON input: {exc.msg} (line {exc.lineno}, column {exc.colno})", EXIT_USAGE)
        return EXIT_USAGE
    except RecursionError:
        _error_line("input nested too deeply to read", EXIT_USAGE)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - the contract: never a traceback
        return _internal_error(exc)


def _internal_error(exc: Exception) -> int:
    if os.environ.get("SEEDANCE_DEBUG"):
        raise  # the exception being handled, with its traceback
    _error_line(f"internal error: {exc.__class__.__name__}: {exc} "
                f"(SEEDANCE_DEBUG=1 shows the traceback)", EXIT_USAGE)
    return EXIT_USAGE


def _unicode_reason(exc: UnicodeError) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"
    return exc.reason if hasattr(exc, "reason") else str(exc)


# "seedance check: x", "seedance fix undo: x", "seedance-check: x", "error: x" ->
# "check: x", "fix undo: x", "x": the prefix is ours, written once (compiled on first use)
_OWN_PREFIX = (r"^(?:seedance(?:[ -](?P<command>[a-z][a-z-]*(?: [a-z][a-z-]*){0,2}))?:\s*)?"
               r"(?:error:\s*)?")


def error_text(text: str) -> str:
    """The one form of an error line: `seedance: error: [COMMAND: ]message`, control
    characters escaped so a crafted name cannot start a line of its own."""
    text = escape_path(text)
    import re

    match = re.match(_OWN_PREFIX, text)
    rest = text[match.end():]
    command = match.group("command")
    return f"seedance: error: {command}: {rest}" if command else f"seedance: error: {rest}"


def _error_line(text: str, code: int) -> None:
    if code == EXIT_USAGE:
        line = error_text(text)
    else:
        line = f"seedance: {escape_path(text)}"
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass  # stderr closed: the exit code still says it


def alias_parser(command: str, prog: str) -> argparse.ArgumentParser:
    """The subcommand's own parser, renamed to the alias: its usage line must be one the
    user can copy (not `usage: seedance-check check`, which fails when the user runs it as
    shown).  Nested actions are renamed too
    (`seedance-plugin install`), and the alias answers --version like seedance."""
    parser = build_parser("seedance", only=command)
    sub = _subparser(parser, command)
    _rename_prog(sub, f"seedance {command}", prog)
    if "--version" not in sub._option_string_actions:
        sub.add_argument("--version", action="version", version=f"seedance {__version__}")
    return sub


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    raise UsageError(f"seedance: no command {name!r}")


def _rename_prog(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    import argparse

    if parser.prog.startswith(old):
        parser.prog = new + parser.prog[len(old):]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            if action._prog_prefix.startswith(old):
                action._prog_prefix = new + action._prog_prefix[len(old):]
            for child in {id(c): c for c in action.choices.values()}.values():
                _rename_prog(child, old, new)


def _alias(command: str, prog: str):
    def entry() -> int:
        return main(sys.argv[1:], prog=prog, command=command)
    return entry


def _launch() -> None:
    """exec seedance-run (shim/src/launcher.c) with this `seedance run`'s arguments: it makes
    every check the Python command makes, runs the common case itself and hands the rest
    (-o, --events, --help, a run that ended holding memory, ...) to `python -m seedance run`
    unchanged.  Importing the CLI and the run command and parsing the arguments here would
    delay every wrapped program by the interpreter's whole import of them, where the
    launcher is one small C exec (bench/bench_shim.py times both).  Found without importing
    seedance.shim (which pulls in cffi and its own imports): the package's directory from
    the import system, as an editable install maps it."""
    import seedance

    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        try:
            spec = find("seedance.shim", seedance.__path__) if find is not None else None
        except (ImportError, OSError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            launcher = os.path.join(list(spec.submodule_search_locations)[0], "seedance-run")
            if os.path.isfile(launcher) and os.access(launcher, os.X_OK):
                try:
                    os.execv(launcher, [launcher, *sys.argv[2:]])
                except OSError:
                    return  # (not executable after all: the Python command runs it)
            return


# Console-script aliases from the product notes: same flags as the subcommand.
check_alias = _alias("check", "seedance-check")
fix_alias = _alias("fix", "seedance-fix")
plugin_alias = _alias("plugin", "seedance-plugin")
bench_alias = _alias("bench", "seedance-bench")
profiler_alias = _alias("profiler", "seedance-profiler")


def console(front_end: bool = True) -> None:
    """The `seedance` console script.  ``front_end``: a `seedance run` goes to seedance-run,
    the C launcher, at once (``python -m seedance``, which the launcher itself execs for
    what it leaves to Python, passes False)."""
    if front_end and sys.argv[1:2] == ["run"] and os.environ.keys().isdisjoint(_TRACE_VARIABLES):
        _launch()  # returns only when the launcher is not built (a traced run is Python's)
    if sys.argv[1:2] in (["check"], ["ldd"]):
        # A `seedance ldd` or `seedance check` reads its objects, reports and the process ends
        # (_quick_exit): the cyclic collector's passes over what the exit frees anyway walk
        # every object the scan made (a check of /usr/lib makes hundreds of thousands), again
        # and again as allocations trigger them, for memory the process never reuses.
        # Only these short commands, and only from the console script: main() called in a
        # process that goes on (the tests, the agent) leaves the collector alone.
        import gc

        gc.disable()
        _quick_exit()
    raise SystemExit(main())


def _quick_exit() -> None:
    """Run `seedance check` or `seedance ldd` and end the process with os._exit once its
    output is flushed: the scan is kept alive to the end (options.KEEP_UNTIL_EXIT) instead
    of being freed object by object (the kernel frees the whole address space at exit at
    once), and Py_Finalize, which
    frees every module, is skipped.  Both commands close every file they write and start
    no thread or helper that outlives them, and neither registers an atexit handler."""
    if sys.argv[1:2] == ["check"]:
        from .collect import options

        options.KEEP_UNTIL_EXIT = []
    try:
        code = main()
    except SystemExit as exc:  # argparse: --help, a usage error
        code = exc.code
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # stdout went away (| head): nothing more to say
            pass
    os._exit(code & 0xFF)
