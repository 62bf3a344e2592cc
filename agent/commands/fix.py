"""seedance fix: act on what the check found, journal every change, verify, check again.

Subcommands: cuda-mismatch, env-leak, torch-ext, undo, history (and handle-leak, which
seedance.fix.handle_leak registers).  Only this module prints: each fixer's whole sequence
runs in seedance.fix.flows, which hands every step to the show callback given here the
moment it happens; this module turns each step into its lines, so a fix cut short has
printed exactly the files it changed.
"""
from __future__ import annotations

import argparse
import sys

from ..model.errors import NotAvailable, UsageError, escape_path


def print(text: str = "", file=None) -> None:  # noqa: A001 - every line this module prints
    """One line of this command's output.  Paths, NEEDED names, journal notes and messages come
    from files on disk: a control character or an undecodable byte in them is escaped (\\n,
    \\xNN; character by character, so a line is escaped as its parts would be), and a crafted
    file name cannot forge a line of a fix's report or of the journal's."""
    (file or sys.stdout).write(escape_path(text) + "\n")

EPILOG = """\
examples:
  seedance fix cuda-mismatch --auto-relink ./build/libkernels.so --dry-run
  seedance fix cuda-mismatch --auto-relink --runtime 13 --verbose
  seedance-fix cuda-mismatch --auto-relink --verbose      (/usr/lib, $CONDA_PREFIX/lib, ./build, site-packages)
  seedance fix env-leak --scope user --inject LD_PRELOAD
  seedance fix env-leak --scope ~/.config/seedance/plugins.yaml --dry-run
  seedance fix torch-ext --clean-cache --rebuild custom_kernels
  seedance fix history
  seedance fix undo                 (the latest fix)   seedance fix undo 20260101-120000-a1b2c3

Every change is journaled under $XDG_STATE_HOME/seedance/journal (~/.local/state/...):
originals with sha256, restored byte for byte by `seedance fix undo`.
"""


def configure_parser(sub):
    parser = sub.add_parser("fix", help="Apply safe fixes for findings (relink, env-leak, torch-ext, undo)",
                            description="Apply safe, journaled, verified fixes for what `seedance check` finds.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    fixes = parser.add_subparsers(dest="fix_command", metavar="FIX", parser_class=type(parser))

    relink = fixes.add_parser("cuda-mismatch", help="retarget CUDA-family NEEDED entries to one runtime",
                              description="Relink libraries whose CUDA-family NEEDED entries do not resolve, "
                                          "resolve to a file whose SONAME lies, or mix runtime majors.",
                              epilog="examples:\n  seedance fix cuda-mismatch --auto-relink ./build --dry-run\n"
                                     "  seedance fix cuda-mismatch --auto-relink --runtime 12 lib/libk.so\n"
                                     "  seedance fix cuda-mismatch --auto-relink --pid 4242 ./build\n",
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    relink.add_argument("paths", nargs="*", metavar="PATH",
                        help="files or directories (default: /usr/lib, $CONDA_PREFIX/lib, ./build, site-packages)")
    relink.add_argument("--auto-relink", action="store_true", required=True,
                        help="rewrite NEEDED/.gnu.version_r entries (the only fix this command makes)")
    relink.add_argument("--runtime", choices=("11", "12", "13", "auto"), default="auto",
                        help="CUDA major to retarget to, across majors too (default: the major each "
                             "library was built for; a library of a mixed closure built for another "
                             "major than its root's is refused, naming this option)")
    relink.add_argument("--pid", type=int, metavar="PID",
                        help="with --runtime auto: align with the runtime this running process maps")
    relink.add_argument("--dry-run", action="store_true", help="print the dynamic-entry diff, write nothing")
    from ..render.progress import add_progress_flags
    add_progress_flags(relink)
    relink.add_argument("--verbose", "-v", action="store_true", help="show findings, strategy and verification")
    relink.set_defaults(execute=_cuda_mismatch)

    env = fixes.add_parser("env-leak", help="make ${VAR} in configs lazy; move LD_PRELOAD to environment.d",
                           description="Rewrite ${VAR}/$VAR in seedance and plugin YAML configs that the "
                                       "env-leak rule flags into the lazy form $${VAR}.",
                           epilog="examples:\n  seedance fix env-leak --scope user\n"
                                  "  seedance fix env-leak --scope user --inject LD_PRELOAD\n"
                                  "  seedance fix env-leak --scope ./plugins.yaml --dry-run\n",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    env.add_argument("--scope", required=True, metavar="user|system|PATH",
                     help="user: ~/.config/seedance; system: /etc/seedance; or a config file or directory")
    env.add_argument("--inject", choices=("LD_PRELOAD",), metavar="LD_PRELOAD",
                     help="move the preload into ~/.config/environment.d/60-seedance.conf")
    env.add_argument("--dry-run", action="store_true", help="print the diff, write nothing")
    env.add_argument("--verbose", "-v", action="store_true")
    env.set_defaults(execute=_env_leak)

    ext = fixes.add_parser("torch-ext", help="move stale torch extension builds away; rebuild them",
                           description="Inventory TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions) and "
                                       "~/.cache/seedance/torch-ext; move builds made for another torch, CUDA, "
                                       "C++ ABI or Python into the journal; rebuild with torch.utils.cpp_extension.",
                           epilog="examples:\n  seedance fix torch-ext --clean-cache\n"
                                  "  seedance fix torch-ext --clean-cache --rebuild custom_kernels\n"
                                  "  seedance fix torch-ext --clean-cache --rebuild all --dry-run\n",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    ext.add_argument("--clean-cache", action="store_true", help="move stale builds into the journal")
    ext.add_argument("--rebuild", metavar="custom_kernels|NAME|all",
                     help="rebuild these stale extensions for the current torch")
    ext.add_argument("--dry-run", action="store_true")
    ext.add_argument("--verbose", "-v", action="store_true")
    ext.set_defaults(execute=_torch_ext)

    undo = fixes.add_parser("undo", help="restore the files of a fix byte for byte",
                            description="Restore every file a fix changed to its original bytes (sha256 checked).",
                            epilog="examples:\n  seedance fix undo\n  seedance fix undo 20260101-120000-a1b2c3\n",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    undo.add_argument("id", nargs="?", metavar="ID", help="journal entry (default: the latest committed fix)")
    undo.set_defaults(execute=_undo)

    history = fixes.add_parser("history", help="list the fix journal",
                               epilog="examples:\n  seedance fix history\n  seedance fix history --json | jq .\n",
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    history.add_argument("--json", action="store_true", help="print the journal as JSON")
    history.set_defaults(execute=_history)

    _register_handle_leak(fixes)
    parser.set_defaults(execute=lambda args: _no_subcommand(parser))


# what `fix handle-leak` does where it is installed, and where to read about it
HANDLE_LEAK_MISSING = ("seedance.fix.handle_leak is missing (where installed, it switches the shim to "
                       "per-instance CUDA handles with the agent's collector of dead instances' handles, or back "
                       "to shared ones, through the fix journal: see docs/fix.md and docs/agent.md)")


def _register_handle_leak(fixes) -> None:
    """seedance.fix.handle_leak provides `fix handle-leak`; without it, say so and exit 2."""
    try:
        from ..fix import handle_leak as module  # the import is the test: find_spec would search sys.path twice
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__.rpartition('.')[0]}.fix.handle_leak":
            raise
        module = None
    if module is not None and hasattr(module, "configure_parser"):
        module.configure_parser(fixes)
        return
    leak = fixes.add_parser("handle-leak", help="per-instance CUDA handles with a collector (not in this install)",
                            description=f"Not available in this install: {HANDLE_LEAK_MISSING}.")
    leak.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def execute(args) -> int:
        raise NotAvailable(f"seedance fix handle-leak: not available in this install: {HANDLE_LEAK_MISSING}")

    leak.set_defaults(execute=execute)


def _no_subcommand(parser) -> int:
    # one line, exit 2, as every usage error: the help is for --help, on stdout
    raise UsageError("seedance fix: give an action: cuda-mismatch, env-leak, torch-ext, handle-leak, "
                     "undo or history (see seedance fix --help)")


def _argv() -> list:
    return ["seedance", *sys.argv[1:]] if sys.argv else []


def _show_common(step) -> None:
    """The steps every fixer reports: the journal's recovery of an interrupted fix, and the
    entry a fix was journaled in."""
    if step.kind == "recovered":
        result = step.detail
        if result.refused:  # one line each run until it is resolved; the entry stays open
            print(f"seedance: warning: interrupted fix {result.id} not rolled back: "
                  f"{result.refused}", file=sys.stderr)
        else:
            print(f"seedance: recovered interrupted fix {result.id}: {' '.join(result.notes)}",
                  file=sys.stderr)
    elif step.kind == "journaled":
        files = "" if step.detail is None else f": {step.detail} file(s)"
        print(f"journal {step.path}{files}; undo with: seedance fix undo {step.path}")


# --- cuda-mismatch -----------------------------------------------------------------------------

def _cuda_mismatch(args) -> int:
    from ..fix.flows import fix_cuda_mismatch
    from ..render.progress import Progress, wanted

    # a scan of the default roots takes seconds: say so on a terminal, never on stdout
    progress = Progress(enabled=wanted(args), label="scanning")
    return fix_cuda_mismatch(args.paths, args.runtime, args.pid, args.dry_run, progress, _argv(),
                             lambda step: _show_relink(step, args.verbose)).exit_code


def _show_relink(step, verbose: bool) -> None:
    kind, detail = step.kind, step.detail
    if kind == "runtime-aligned":
        pid, runtime = detail
        print(f"pid {pid} uses the CUDA {runtime} runtime: aligning with it")
    elif kind == "planned":
        roots, plan = detail
        if not plan.findings:
            print(f"no cuda-mismatch findings in {', '.join(roots)}: nothing to relink")
            return
        print(f"{len(plan.findings)} cuda-mismatch finding(s):")
        for finding in plan.findings:
            print(f"  {finding.rule}: {finding.message}")
        for path, why in plan.skipped:
            print(f"  skipped {path}: {why}")
    elif kind == "refused":
        print(f"refused {step.path}: {detail}")
    elif kind == "previewed":
        action, diff = detail
        growth = "zero growth" if action.growth == 0 else f"grows {action.growth:+d} bytes"
        print(f"{action.path}: -> CUDA {action.target_major} ({action.strategy}, {growth})")
        for line in diff:
            print(f"    {line}")
        if verbose:
            for name, target in action.targets.items():
                print(f"    {name} will resolve to {target}")
            for change in action.changes:
                print(f"    edit {change}")
    elif kind == "dry-run":
        relinkable, refused = detail
        print(f"dry run: {relinkable} library(ies) would be relinked, {refused} refused; nothing written")
    elif kind == "nothing-relinked":
        print("nothing relinked")
    elif kind == "relinked":
        print(f"relinked {step.path} ({detail}, verified: re-parsed, resolved, dlopen ok)")
    elif kind == "not-relinked":
        print(f"not relinked: {detail}")
    elif kind == "rechecked":
        if verbose:
            if detail.rechecked is None:
                print("check again: every root")
            else:
                print(f"check again: {len(detail.rechecked)} root(s) that load a rewritten file "
                      f"(the other roots' findings stand as found): {' '.join(detail.rechecked)}")
        print(f"check again: {len(detail.gone)} of {len(detail.before)} finding(s) gone, "
              f"{len(detail.now)} remaining")
        for rule, message in sorted(detail.now):
            print(f"  still: {rule}: {message}")
    else:
        _show_common(step)


# --- env-leak ------------------------------------------------------------------------------------

def _env_leak(args) -> int:
    from ..fix.flows import fix_env_leak

    return fix_env_leak(args.scope, args.inject, args.dry_run, _argv(),
                        lambda step: _show_env_leak(step, args.scope)).exit_code


def _show_env_leak(step, scope: str) -> None:
    kind, detail = step.kind, step.detail
    if kind == "planned":
        from ..fix.flows import config_diff

        plan = detail
        if not plan.paths:
            print(f"no seedance configs in scope {scope}: nothing to fix")
        elif not plan.findings:
            print(f"no env-leak findings in {len(plan.paths)} config(s)")
        else:
            print(f"{len(plan.findings)} env-leak finding(s) in {len(plan.by_path)} config(s)")
            for edit in plan.edits:
                for line in config_diff(edit):
                    print(f"    {line}")
            if plan.drop_in:
                print(f"    LD_PRELOAD moves to {plan.drop_in}")
            for finding in plan.unfixable:
                print(f"  cannot fix here: {finding.message}")
    elif kind == "dry-run":
        print("dry run: nothing written")
    elif kind == "rewrote":
        print(f"rewrote {step.path} ({detail} value(s))")
    elif kind == "wrote-drop-in":
        print(f"wrote {step.path}: applies at the next login (or: systemctl --user daemon-reexec)")
    elif kind == "rechecked":
        before, remaining = detail
        print(f"check again: {len(before) - len(remaining)} of {len(before)} env-leak finding(s) gone, "
              f"{len(remaining)} remaining")
        for finding in remaining:
            print(f"  still: {finding.message}")
    else:
        _show_common(step)


# --- torch-ext -------------------------------------------------------------------------------------

def _torch_ext(args) -> int:
    from ..fix.flows import fix_torch_ext

    return fix_torch_ext(args.clean_cache, args.rebuild, args.dry_run, _argv(),
                         lambda step: _show_torch_ext(step, args.clean_cache)).exit_code


def _show_torch_ext(step, clean_cache: bool) -> None:
    kind, detail = step.kind, step.detail
    if kind == "planned":
        plan = detail
        print(f"{len(plan.facts)} cached extension build(s) in {', '.join(plan.roots)}; {len(plan.stale)} stale")
        for build in plan.stale:
            print(f"  stale {build.path}: {'; '.join(build.reasons)}")
    elif kind == "dry-run":
        plan = detail
        if clean_cache:
            print(f"dry run: would move {len(plan.stale)} build(s) into the journal")
        for build in plan.chosen:
            print(f"dry run: would rebuild {build.name} from {', '.join(build.sources) or '?'}")
        print("dry run: nothing written")
    elif kind == "moved":
        print(f"moved {step.path} into journal {detail}")
    elif kind == "rebuilt":
        archs = ";".join(detail["archs"]) or "none (CPU-only torch or no GPU)"
        print(f"rebuilt {step.path} for torch {detail['torch']} in {detail['build_dir']} "
              f"(TORCH_CUDA_ARCH_LIST {archs}); imported ok")
    elif kind == "rechecked":
        stale, gone, remaining = detail
        print(f"check again: {gone} of {stale} stale build(s) gone, {len(remaining)} remaining")
        for finding in remaining:
            print(f"  still: {finding.message}")
    else:
        _show_common(step)


# --- journal ---------------------------------------------------------------------------------------

def _undo(args) -> int:
    from ..fix.flows import undo_fix

    result = undo_fix(args.id)  # RestoreRefused/DamagedEntry: one line, exit 2, nothing written
    for path in result.restored:
        print(f"restored {path} (sha256 verified)")
    for path in result.unchanged:
        print(f"unchanged {path}: already its original bytes")
    for note in result.notes:
        print(f"note: {note}")
    print(f"undone {result.id}: {len(result.restored)} path(s) restored")
    return 0


def _history(args) -> int:
    from ..fix.flows import fix_history

    history = fix_history(_show_common)
    if args.json:
        import json  # only history prints JSON

        # JSON escapes what it holds itself; the output is many lines (print escapes one)
        sys.stdout.write(json.dumps([entry.manifest for entry in history.entries], indent=2) + "\n")
        return 0
    if not history.entries:
        print(f"no fixes journaled in {history.root}")
        return 0
    for entry in history.entries:
        if entry.damaged:
            print(f"{entry.id}  damaged      {entry.damaged}")
            continue
        note = f"  {entry.note}" if entry.note else ""
        print(f"{entry.id}  {str(entry.status):<11}  {entry.command}  {len(entry.files)} file(s){note}")
        for record in entry.files:
            link = f" (via {record['link']})" if isinstance(record.get("link"), str) else ""
            print(f"    {record['action']:<10} {record['path']}{link}")
    return 0
