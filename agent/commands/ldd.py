"""seedance ldd: a safe ldd that executes nothing.

glibc's ldd runs the target's dynamic loader in trace mode, which runs code from the target's
own dependency tree (and, for a hostile file, its loader).  This answers the same question
from the resolver alone.  Output follows ldd's format without load addresses:

    NAME => PATH            a dependency found by a search
    PATH                    an object loaded by its own path (the interpreter)
    NAME => not found

linux-vdso.so.1 is left out: the kernel maps it, there is no file to resolve.
"""
from __future__ import annotations

import sys

from ..model.errors import BadInput, UsageError, escape_path

EPILOG = """\
examples:
  seedance ldd /usr/bin/curl
  seedance ldd --json ./libkernels.so | jq '.not_found'
  seedance ldd --env LD_LIBRARY_PATH=/opt/cuda/lib64 ./app
  seedance ldd --tree ./libkernels.so            the tree, with how each edge resolved
"""

SCHEMA = "seedance.ldd/v1"


def configure_parser(sub):
    import argparse  # here, not at the top: a plain `seedance ldd FILE` never needs it (cli._lean_ldd)

    parser = sub.add_parser(
        "ldd", help="Print shared-library dependencies without executing anything",
        description="Print the shared libraries FILE would load, as ldd does, decided by an "
                    "ld.so-faithful resolver instead of running the loader.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", metavar="FILE", help="ELF executable or shared library")
    parser.add_argument("--json", action="store_true", help=f"print a {SCHEMA} JSON object")
    parser.add_argument("--env", action="append", default=[], metavar="VAR=VALUE",
                        help="loader environment to assume, e.g. LD_LIBRARY_PATH=/opt/lib "
                             "(repeatable; overrides this environment's LD_LIBRARY_PATH and "
                             "LD_PRELOAD, which are assumed otherwise, as ldd does)")
    parser.add_argument("--secure", action="store_true",
                        help="resolve as for a set-user-ID program (AT_SECURE)")
    parser.add_argument("--tree", action="store_true",
                        help="print libtree's tree with the reason per edge (rpath, runpath, ld_library_path, "
                             "ld.so.cache, default): each library expanded once, libc, libm, libdl, "
                             "libstdc++, libgcc_s and the loader left out, as libtree's default")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="with --tree: every library, the C runtime and loader too, and the path of "
                             "each one already loaded")
    parser.set_defaults(execute=execute)
    return parser


# The loader variables ldd passes on to ld.so (it runs the loader in this environment):
# rtld.c reads LD_LIBRARY_PATH and LD_PRELOAD in trace mode as in a normal start.
CALLER_LOADER_VARS = ("LD_LIBRARY_PATH", "LD_PRELOAD")


def _parse_env(items: list, environ=None) -> dict:
    """The caller's loader variables, then each --env VAR=VALUE over them.  An empty value
    stays a value (LD_LIBRARY_PATH= is an empty list for ld.so, not the variable unset)."""
    import os

    environ = os.environ if environ is None else environ
    env = {k: environ[k] for k in CALLER_LOADER_VARS if k in environ}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"seedance ldd: --env expects VAR=VALUE, got {item!r}")
        env[key] = value
    return env


def execute(args) -> int:
    import os

    from ..resolve import Resolver

    env = _parse_env(args.env)
    root, path = _in_process_root(args.file)
    if root != "/":
        # a file under /proc/PID/root (a container's, a chroot's) loads that root's
        # libraries, found through its own ld.so.cache; it is resolved inside that root
        _check_in_root(root, path, args.file)
        args.file = path
    elif not os.path.exists(args.file):
        if os.path.lexists(args.file):
            raise BadInput(f"{args.file}: dangling symbolic link or symbolic link loop")
        raise BadInput(f"{args.file}: no such file or directory")
    elif os.path.isdir(args.file):
        raise BadInput(f"{args.file}: is a directory")
    resolver = Resolver(env=env, secure=args.secure, root=root)
    info = resolver.read(args.file)
    # As ld.so --verify decides for ldd: no PT_DYNAMIC (or no loader for the ABI) is "not a
    # dynamic executable"; a dynamic object without DT_NEEDED is "statically linked"
    # (static-pie, or a library that needs nothing).
    if info.e_type not in (2, 3) or resolver.loader_for(info) is None or not info.has_dynamic:
        raise BadInput(f"{args.file}: not a dynamic executable")
    if not info.needed:
        if args.json:
            import json

            print(json.dumps(_document(args.file, None, info), indent=2))
        else:
            print("\tstatically linked")
        return 0
    closure = resolver.closure(args.file)
    if getattr(args, "tree", False) and not args.json:
        from ..render.graph import tree_text
        sys.stdout.write(escape_path(tree_text(closure, verbose=getattr(args, "verbose", False)))
                         .replace("\\n", "\n"))
        return 0
    if args.json:
        import json

        print(json.dumps(_document(args.file, closure, info), indent=2))
    else:
        sys.stdout.write(render(closure))
    return 0


def _in_process_root(file: str) -> tuple:
    """('/proc/PID/root', '/path/inside') for a file named through a process's root, else
    ('/', file)."""
    if not file.startswith("/proc/"):  # the common case: no `re` to import at every ldd's start
        return "/", file
    import os
    import re

    match = re.match(r"^/proc/(\d+|self)/root(/.*)?$", os.path.normpath(file))
    if match is None:
        return "/", file
    return f"/proc/{match.group(1)}/root", match.group(2) or "/"


def _check_in_root(root: str, path: str, shown: str) -> None:
    import errno
    import stat

    from ..collect import rootfs

    try:
        st = rootfs.stat(root, path)
    except FileNotFoundError:
        raise BadInput(f"{shown}: no such file or directory") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BadInput(f"{shown}: symbolic link loop") from None
        raise BadInput(f"{shown}: {(exc.strerror or 'cannot open').lower()}") from None
    if stat.S_ISDIR(st.st_mode):
        raise BadInput(f"{shown}: is a directory")


def render(closure) -> str:
    """ldd's lines; names and paths from the file are escaped (a newline in a DT_NEEDED or
    a directory name cannot forge a line)."""
    lines = []
    for name, path, _res in closure.load_order:
        if path is None:
            lines.append(f"\t{name} => not found")
        elif name == path:
            lines.append(f"\t{path}")
        else:
            lines.append(f"\t{name} => {path}")
    for check in closure.version_checks:
        if not check.defined and not check.weak and check.provider is not None:
            lines.append(f"\t{check.provider}: version `{check.version}' not found "
                         f"(required by {check.requester})")
    return "".join("\t" + escape_path(line[1:]) + "\n" for line in lines)  # each starts with a tab


def _document(path: str, closure, info) -> dict:
    libraries, not_found, version_errors = [], [], []
    if closure is not None:
        for name, lib_path, res in closure.load_order:
            if lib_path is None:
                not_found.append({"name": name, "requester": res.requester if res else None,
                                  "tried": [list(t) for t in res.tried] if res else []})
                continue
            libraries.append({"name": name, "path": lib_path,
                              "source": res.source if res else "loaded",
                              "requester": res.requester if res else None})
        for check in closure.version_checks:
            if not check.defined and check.provider is not None:
                version_errors.append({"requester": check.requester, "file": check.file,
                                       "version": check.version, "weak": check.weak,
                                       "provider": check.provider,
                                       "provider_versions": list(check.provider_versions)})
    return {"schema": SCHEMA, "file": path,
            "interpreter": info.interpreter,
            "libraries": libraries, "not_found": not_found, "version_errors": version_errors}
