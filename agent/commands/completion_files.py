"""Shell completion and man pages, generated from the real argparse parsers.

shtab writes *static* completion scripts from a parser (no runtime hook such as
argcomplete's, which would import seedance on every <TAB>); argparse-manpage writes roff
from the same parser, so neither can drift from `--help`.  `make install` writes both into
the venv's share/ (`python -m seedance.commands.completion_files install PREFIX`); `seedance completion
bash|zsh` prints a script for `eval`/`source`.

The aliases (seedance-check, seedance-plugin, ...) get their own scripts and pages, built
from the same alias parsers that `seedance-check --help` shows (seedance.cli.alias_parser).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

SHELLS = ("bash", "zsh")
ALIASES = {"seedance-check": "check", "seedance-fix": "fix", "seedance-plugin": "plugin",
           "seedance-bench": "bench", "seedance-profiler": "profiler"}


def parser_for(prog: str):
    from .. import cli

    if prog == "seedance":
        return cli.build_parser("seedance")
    return cli.alias_parser(ALIASES[prog], prog)


def completion_script(shell: str, prog: str = "seedance") -> str:
    if shell not in SHELLS:
        from ..model.errors import UsageError
        raise UsageError(f"completion: unsupported shell {shell!r} (choose: {', '.join(SHELLS)})")
    try:
        import shtab
    except ImportError:
        # shtab is a build requirement, not an install one: the package build generated the
        # scripts (setup.py) and pip put them below the install's prefix
        return installed_script(shell, prog)
    parser = parser_for(prog)
    # shell function names may not hold '-': _seedance_check, not _seedance-check
    return shtab.complete(parser, shell=shell, root_prefix=prog.replace("-", "_"))


# The sections man-pages(7) lists for a command's page after OPTIONS, in its order.  roff,
# written once here for every page: what a user's scripts may rely on (EXIT STATUS), what
# changes a run from outside (ENVIRONMENT) and what is read or written (FILES).
def _tp(items) -> str:
    return "\n".join(f".TP\n.B {term}\n{text}" for term, text in items)


_EXIT_COMMON = [("0", "Clean: nothing at or above the severity threshold, or the action succeeded."),
                ("1", "Findings at or above the threshold (check, ldd, why, plugin verify)."),
                ("2", "Usage error or bad input: one line, \\fBseedance: error: ...\\fR, on stderr. "
                      "A mistyped command or flag names the closest one."),
                ("130", "Interrupted (Ctrl-C).")]
_EXIT_EXTRA = {
    "seedance": [("3", "\\fBseedance status\\fR and \\fBseedance agent status\\fR: no agent is running, "
                       "as \\fBsystemctl status\\fR of an inactive unit."),
                 ("126, 127", "\\fBseedance run\\fR: the command cannot be run, or is not found, as "
                              "\\fBenv\\fR(1); otherwise \\fBrun\\fR exits with the program's own status.")],
}
_ENVIRONMENT = [
    ("NO_COLOR", "Set to anything: no colour, whatever the terminal (https://no-color.org)."),
    ("LD_LIBRARY_PATH", "Searched as \\fBld.so\\fR(8) searches it when resolving libraries (check, ldd)."),
    ("XDG_CONFIG_HOME", "Settings below \\fI$XDG_CONFIG_HOME/seedance\\fR (default \\fI~/.config\\fR)."),
    ("XDG_STATE_HOME", "The fix journal, the agent's and the quotas' state below "
                       "\\fI$XDG_STATE_HOME/seedance\\fR (default \\fI~/.local/state\\fR)."),
    ("XDG_CACHE_HOME", "The check's result cache below \\fI$XDG_CACHE_HOME/seedance\\fR (default \\fI~/.cache\\fR)."),
    ("XDG_DATA_HOME", "The plugin store below \\fI$XDG_DATA_HOME/seedance\\fR (default \\fI~/.local/share\\fR)."),
    ("XDG_RUNTIME_DIR, SEEDANCE_RUNTIME_DIR", "Where the agent's socket and the shim's registry live: "
                                              "\\fI$SEEDANCE_RUNTIME_DIR\\fR, else \\fI$XDG_RUNTIME_DIR/seedance\\fR."),
    ("SEEDANCE_PLUGIN_PATH", "Colon-separated directories of plugin sources for \\fBplugin install\\fR."),
    ("SEEDANCE_CACHE", "0: check does not read or write its result cache."),
    ("SEEDANCE_JOBS", "1: check forks no helper process."),
    ("SEEDANCE_DEBUG", "Set: an internal error shows its Python traceback."),
    ("OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_EXPORTER", "Each command is traced as one OpenTelemetry span "
                                                          "(needs the [otlp] extra)."),
]
_FILES = [
    ("~/.config/seedance/agent.yaml", "The agent's settings (durations such as 2s, 1m30s; "
                                      "\\fBseedance fix handle-leak\\fR writes it, SIGHUP re-reads it)."),
    ("~/.config/seedance/shim.yaml", "The \\fB--handles\\fR default of \\fBseedance run\\fR."),
    ("~/.config/seedance/quota/", "Stored WorkloadQuotaPolicy files (\\fBseedance quota apply\\fR)."),
    ("~/.local/state/seedance/journal/", "The fix journal that \\fBseedance fix undo\\fR reads."),
    ("~/.local/state/seedance/agent.db", "The agent's state (leaks, findings)."),
    ("$XDG_RUNTIME_DIR/seedance/agent.sock", "The agent's status socket (\\fBseedance status\\fR)."),
    ("~/.local/share/seedance/plugins/", "The plugin store, one directory per NAME/VERSION."),
    ("~/.cache/seedance/check/", "The check's result cache, keyed by file identity."),
]


def manpage(prog: str = "seedance") -> str:
    from argparse_manpage.manpage import Manpage

    from .. import __version__

    parser = parser_for(prog)
    page = Manpage(parser)
    # NAME's "prog - what it does": whatis, apropos and lexgrog read the page by that line
    page.description = (parser.description or "").split(". ")[0].rstrip(".") or None
    page.version = __version__
    page.project_name = "seedance"
    page.manual = "seedance manual"
    page.url = None
    # "=": the page's sections are kept on the parser, so a second page of the same parser
    # (the install writes each once, a test again) replaces them rather than doubling them
    codes = sorted(_EXIT_COMMON + _EXIT_EXTRA.get(prog, []), key=lambda item: int(item[0].split(",")[0]))
    page.add_section("exit status", "=", _tp(codes))
    page.add_section("environment", "=", _tp(_ENVIRONMENT))
    page.add_section("files", "=", _tp(_FILES))
    return str(page)


def installed_script(shell: str, prog: str) -> str:
    """The script the build generated for PROG, read where the install put it (install()'s
    layout below the environment's prefix, or the user base of a --user install)."""
    import site
    import sys

    from ..model.errors import NotAvailable

    relative = (Path("share", "bash-completion", "completions", prog) if shell == "bash"
                else Path("share", "zsh", "site-functions", f"_{prog}"))
    prefixes = [sys.prefix, site.getuserbase()]
    for prefix in prefixes:
        try:
            return (Path(prefix) / relative).read_text()
        except OSError:
            continue
    raise NotAvailable(f"completion: no {shell} script for {prog} below {' or '.join(prefixes)} (this install "
                       f"came without its generated files; pip install shtab lets seedance write one)")


@dataclass(frozen=True)
class Installed:
    kind: str  # "bash", "zsh" or "man"
    path: Path


def install(prefix: Path) -> list:
    """Write every completion script and man page under PREFIX/share; returns what was
    written.  The layout is the one bash-completion, zsh's fpath and man(1) search below a
    prefix: share/bash-completion/completions/PROG, share/zsh/site-functions/_PROG,
    share/man/man1/PROG.1."""
    share = Path(prefix) / "share"
    written = []
    for prog in ("seedance", *ALIASES):
        targets = ((("bash", share / "bash-completion" / "completions" / prog)),
                   ("zsh", share / "zsh" / "site-functions" / f"_{prog}"),
                   ("man", share / "man" / "man1" / f"{prog}.1"))
        for kind, path in targets:
            text = manpage(prog) if kind == "man" else completion_script(kind, prog)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text)
            tmp.replace(path)
            written.append(Installed(kind, path))
    return written


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "install":
        print("usage: python -m seedance.commands.completion_files install PREFIX", file=sys.stderr)
        return 2
    for item in install(Path(argv[1])):
        print(f"{item.kind}: {item.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
