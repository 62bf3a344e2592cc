"""seedance why: which chain of requesters pulls a library into a program or a process.

    seedance why LIB --in FILE               FILE's closure (as ldd loads it)
    seedance why LIB --pid PID               a running process (its mapped objects)
    seedance why LIB --imports a,b [--python PY]   what `import a, b` would load (not imported)

Reads; never executes.  Exit 0 when LIB is loaded, 1 when it is not, 2 on bad input.
"""
from __future__ import annotations

import argparse
import os
import sys

from ..model.errors import BadInput, UsageError, escape_path

EPILOG = """\
examples:
  seedance why libcudart.so.12 --in ./libkernels.so
  seedance why libstdc++.so.6 --imports torch,scipy --python ~/venv/bin/python
  seedance why libnccl.so.2 --pid 4242
"""


def configure_parser(sub):
    parser = sub.add_parser(
        "why", help="Show the chain of requesters that pulls a library in",
        description="Show which requesters pull LIB in, through which NEEDED entries, and how "
                    "each was resolved (rpath, runpath, ld_library_path, cache, default dir, "
                    "already loaded).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lib", metavar="LIB", help="library: SONAME, file name or path")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--in", dest="file", metavar="FILE", help="an executable or library: its closure")
    where.add_argument("--pid", type=int, metavar="PID", help="a running process")
    where.add_argument("--imports", metavar="A,B", help="the modules `import A, B` would load")
    parser.add_argument("--python", metavar="PATH", help="with --imports: the interpreter (default python3)")
    parser.set_defaults(execute=execute)
    return parser


def execute(args) -> int:
    from ..resolve import Resolver
    from ..resolve.process import Simulator, live, why

    resolver = Resolver(env={k: v for k, v in os.environ.items() if k in ("LD_LIBRARY_PATH",)})
    heading = None
    if args.python and args.imports is None:
        raise UsageError("seedance why: --python goes with --imports")
    if args.file is not None:
        if not os.path.isfile(args.file):
            raise BadInput(f"{args.file}: no such file")
        info = resolver.read(args.file)
        if not info.has_dynamic:
            raise BadInput(f"{args.file}: not a dynamic executable")
        sim = Simulator(resolver, args.file)
        sim.start()
        model, where = sim.model, args.file
    elif args.pid is not None:
        from ..collect.process import ProcessGone, read_process, root_views
        from ..model.errors import ELFError
        try:
            view = read_process(args.pid)
        except ProcessGone:
            raise BadInput(f"process {args.pid}: no such process") from None
        except PermissionError:
            raise BadInput(f"process {args.pid}: permission denied") from None
        if view.exe is None:
            raise BadInput(f"process {args.pid}: no executable")
        # The chain as the process's own ld.so made it: its root (a container's or chroot's
        # /etc/ld.so.cache and libraries, every name resolved inside /proc/PID/root) and the
        # LD_LIBRARY_PATH of its environ, not ours.
        resolver = root_views().resolver(view)
        try:
            sim, _shadowed = live(resolver, view.in_root(view.exe),
                                  [view.in_root(m.path) for m in view.mappings if not m.deleted])
        except ELFError as exc:
            raise BadInput(f"process {args.pid}{view.where()}: {exc.message}") from None
        model, where = sim.model, f"process {args.pid}{view.where()}"
        if view.foreign:
            heading = f"{where}: paths inside its root"
    else:
        from ..collect.python_env import ask_interpreter, predict_imports
        names = [n.strip() for n in args.imports.split(",") if n.strip()]
        if not names:
            raise UsageError("seedance why: --imports needs module names")
        interp = ask_interpreter(args.python or "python3")
        prediction = predict_imports(interp, names, resolver=resolver, search_orders=False)
        model, where = prediction.model, f"import {', '.join(names)}"
    chains = why(model, args.lib, resolver)
    if not chains:
        sys.stdout.write(escape_path(f"{args.lib} is not loaded by {where}") + "\n")
        return 1
    out = [heading] if heading else []
    for chain in chains:
        out.append(f"{chain.path}: brought in by {chain.load}")
        for depth, link in enumerate(chain.links):
            out.append(f"{'  ' * (depth + 1)}{link.requester} NEEDED {link.name} => {link.path} [{link.source}]")
        for link in chain.also:
            out.append(f"  also answers {link.name} of {link.requester} [already loaded]")
    sys.stdout.write("".join(escape_path(line) + "\n" for line in out))
    return 0
