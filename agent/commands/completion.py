"""seedance completion: print a shell completion script generated from the parsers."""
from __future__ import annotations

import argparse
import sys

EPILOG = """\
examples:
  eval "$(seedance completion bash)"              this shell (put it in ~/.bashrc to keep it)
  seedance completion zsh > ~/.zfunc/_seedance    zsh: a directory on $fpath, then compinit
  seedance completion bash --prog seedance-check  the alias's own script

`make install` also writes every script and man page under .venv/share: source
.venv/share/bash-completion/completions/seedance, or `man -M .venv/share/man seedance`.
"""


def configure_parser(sub):
    from .completion_files import ALIASES, SHELLS

    parser = sub.add_parser("completion", help="Print a bash or zsh completion script",
                            description="Print a static completion script generated from seedance's own "
                                        "parsers (shtab).",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shell", choices=SHELLS, help="the shell to complete for")
    # PROG, not the choices spelled out: six names are wider than a man page's 80 columns
    parser.add_argument("--prog", choices=("seedance", *ALIASES), default="seedance", metavar="PROG",
                        help=f"the command to complete: {', '.join(('seedance', *ALIASES))} (default seedance)")
    parser.set_defaults(execute=execute)


def execute(args) -> int:
    from .completion_files import completion_script

    sys.stdout.write(completion_script(args.shell, args.prog))
    return 0
