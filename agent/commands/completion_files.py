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


def manpage(prog: str = "seedance") -> str:
    from argparse_manpage.manpage import Manpage

    from .. import __version__

    parser = parser_for(prog)
    page = Manpage(parser)
    # NAME's "prog - what it does": whatis, apropos and lexgrog read the page by that line
    page.description = (parser.description or "").split(". ")[0].rstrip(".") or None
    page.version = __version__
    page.project_name = "seedance"
    page.url = None
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
