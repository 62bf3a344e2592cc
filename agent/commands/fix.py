"""seedance fix: act on what the check found, journal every change, verify, check again.

Subcommands: cuda-mismatch, env-leak, torch-ext, undo, history (and handle-leak, which
seedance.fix.handle_leak registers).  Only this module prints; the fixers in seedance.fix
(flows.py: the plan and check-again of each) return plans and results.
"""
from __future__ import annotations

import argparse
import os
import sys

from ..model.errors import BadInput, NotAvailable, UsageError, escape_path


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


def _register_handle_leak(fixes) -> None:
    """seedance.fix.handle_leak provides `fix handle-leak`; without it, say so and exit 2."""
    try:
        from ..fix import handle_leak as module  # not importlib.util.find_spec: ~1 ms of every fix
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__.rpartition('.')[0]}.fix.handle_leak":
            raise
        module = None
    if module is not None and hasattr(module, "configure_parser"):
        module.configure_parser(fixes)
        return
    leak = fixes.add_parser("handle-leak", help="per-instance CUDA handles with a collector (not yet available)",
                            description="Not yet available: planned in the agent issue.")
    leak.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def execute(args) -> int:
        raise NotAvailable("seedance fix handle-leak: not yet available (planned in the agent issue)")

    leak.set_defaults(execute=execute)


def _no_subcommand(parser) -> int:
    # one line, exit 2, as every usage error: the help is for --help, on stdout
    raise UsageError("seedance fix: give an action: cuda-mismatch, env-leak, torch-ext, handle-leak, "
                     "undo or history (see seedance fix --help)")


def _journal(recover: bool = True):
    from ..fix.flows import open_journal

    journal, recovered = open_journal(recover)
    for result in recovered:
        if result.refused:  # one line each run until it is resolved; the entry stays open
            print(f"seedance: warning: interrupted fix {result.id} not rolled back: "
                  f"{result.refused}", file=sys.stderr)
        else:
            print(f"seedance: recovered interrupted fix {result.id}: {' '.join(result.notes)}",
                  file=sys.stderr)
    return journal


def _argv() -> list:
    return ["seedance", *sys.argv[1:]] if sys.argv else []


# --- cuda-mismatch -----------------------------------------------------------------------------

def _cuda_mismatch(args) -> int:
    from ..fix.flows import cyclic_collector_paused, start_dlopen_zygote

    zygote = start_dlopen_zygote(args.dry_run)
    try:
        with cyclic_collector_paused():
            return _relink(args, zygote)
    finally:
        if zygote is not None:
            zygote.close()


def _relink(args, zygote) -> int:
    from ..fix import atomic, relink
    from ..fix.journal import VerifyFailed
    from ..model.errors import ELFError

    relink.require_elf(args.paths)
    roots = args.paths or relink.default_roots()
    if not roots:
        raise BadInput("no roots to scan: none of /usr/lib, $CONDA_PREFIX/lib, ./build, site-packages exists")
    runtime = args.runtime
    if args.pid is not None and runtime == "auto":
        runtime = str(relink.process_major(args.pid))
        print(f"pid {args.pid} uses the CUDA {runtime} runtime: aligning with it")
    journal = None if args.dry_run else _journal()
    relinker = relink.Relinker(roots, runtime=runtime, zygote=zygote)
    # a scan of the default roots takes seconds: say so on a terminal, never on stdout
    from ..render.progress import Progress, wanted
    report = relinker.check(Progress(enabled=wanted(args), label="scanning"))
    plan = relinker.plan(report)
    if not plan.findings:
        print(f"no cuda-mismatch findings in {', '.join(roots)}: nothing to relink")
        return 0
    print(f"{len(plan.findings)} cuda-mismatch finding(s):")
    for finding in plan.findings:
        print(f"  {finding.rule}: {finding.message}")
    for path, why in plan.skipped:
        print(f"  skipped {path}: {why}")
    runnable = []
    for action in plan.actions:
        if action.refusal is None:
            try:
                diff = relinker.preview(action)
            except ELFError as exc:
                action.refusal = str(exc)
                diff = []
        if action.refusal:
            print(f"refused {action.path}: {action.refusal}")
            continue
        runnable.append(action)
        growth = "zero growth" if action.growth == 0 else f"grows {action.growth:+d} bytes"
        print(f"{action.path}: -> CUDA {action.target_major} ({action.strategy}, {growth})")
        for line in diff:
            print(f"    {line}")
        if args.verbose:
            for name, target in action.targets.items():
                print(f"    {name} will resolve to {target}")
            for change in action.changes:
                print(f"    edit {change}")
    refused = len(plan.actions) - len(runnable)
    if args.dry_run:
        print(f"dry run: {len(runnable)} library(ies) would be relinked, {refused} refused; nothing written")
        return 1 if refused or plan.skipped else 0
    if not runnable:
        print("nothing relinked")
        return 1
    relinker.drop_mappings()  # the plans are made; nothing of ours maps a target from here on
    relinker.start_verifier()  # without a zygote: its interpreter starts while the pre-flight checks run
    try:
        mapped = atomic.MappedIndex.scan()
        for action in runnable:  # every refusal before any file is touched
            atomic.check_rewritable(action.path, mapped)
        failed = []
        with journal.begin("fix cuda-mismatch", _argv(), [f.message for f in plan.findings]) as entry:
            for action in runnable:
                relinker.start_verifier()
                edit = relinker.edit(action)
                try:
                    entry.replace_file(action.path, edit.fill_deferred,
                                       verify=lambda temp, a=action: relinker.verify(a, temp),
                                       summary="; ".join(action.changes), expect=action.identity)
                    print(f"relinked {action.path} ({action.strategy}, verified: re-parsed, resolved, dlopen ok)")
                except VerifyFailed as exc:
                    failed.append(str(exc))
                    print(f"not relinked: {exc}")
    finally:
        relinker.close()
    written = [r for r in entry.files if r["state"] == "written"]
    if written:
        print(f"journal {entry.id}: {len(written)} file(s); undo with: seedance fix undo {entry.id}")
    return _recheck_relink(relinker, plan, [r["path"] for r in written], refused or failed or plan.skipped,
                           args.verbose)


def _recheck_relink(relinker, plan, written, incomplete, verbose=False) -> int:
    """Check again: the roots that load a rewritten file, the first check's findings elsewhere."""
    from ..fix.flows import recheck_relink

    recheck = recheck_relink(relinker, plan, written)
    if verbose:
        if recheck.rechecked is None:
            print("check again: every root")
        else:
            print(f"check again: {len(recheck.rechecked)} root(s) that load a rewritten file "
                  f"(the other roots' findings stand as found): {' '.join(recheck.rechecked)}")
    print(f"check again: {len(recheck.gone)} of {len(recheck.before)} finding(s) gone, "
          f"{len(recheck.now)} remaining")
    for rule, message in sorted(recheck.now):
        print(f"  still: {rule}: {message}")
    return 1 if recheck.now or incomplete else 0


# --- env-leak ------------------------------------------------------------------------------------

def _env_leak(args) -> int:
    from ..fix import atomic, envleak
    from ..fix.flows import config_diff, plan_env_leak, remaining_env_leaks, verify_config

    plan = plan_env_leak(args.scope, args.inject)
    if not plan.paths:
        print(f"no seedance configs in scope {args.scope}: nothing to fix")
        return 0
    findings, edits, drop_in = plan.findings, plan.edits, plan.drop_in
    if not findings:
        print(f"no env-leak findings in {len(plan.paths)} config(s)")
        return 0
    print(f"{len(findings)} env-leak finding(s) in {len(plan.by_path)} config(s)")
    for edit in edits:
        for line in config_diff(edit):
            print(f"    {line}")
    if drop_in:
        print(f"    LD_PRELOAD moves to {drop_in}")
    for finding in plan.unfixable:
        print(f"  cannot fix here: {finding.message}")
    if args.dry_run:
        print("dry run: nothing written")
        return 1 if plan.unfixable else 0
    if not edits:
        return 1
    mapped = atomic.MappedIndex.scan()
    for edit in edits:
        atomic.check_rewritable(edit.path, mapped)
    if drop_in and os.path.exists(drop_in):
        atomic.check_rewritable(drop_in, mapped)
    journal = _journal()
    with journal.begin("fix env-leak", _argv(), [f.message for f in findings]) as entry:
        for edit in edits:
            entry.replace_file(edit.path, edit.new, verify=lambda temp, e=edit: verify_config(e, temp),
                               summary=f"{len(edit.changes)} value(s) made lazy or moved")
            print(f"rewrote {edit.path} ({len(edit.changes)} value(s))")
        if drop_in:
            existing = open(drop_in, encoding="utf-8").read() if os.path.exists(drop_in) else None
            content = envleak.drop_in_content(existing, "LD_PRELOAD", plan.preloads, entry.id).encode()
            if existing is None:
                entry.create_file(drop_in, content, mode=0o644, summary="LD_PRELOAD for the user session")
            else:
                entry.replace_file(drop_in, content, summary="LD_PRELOAD for the user session")
            print(f"wrote {drop_in}: applies at the next login (or: systemctl --user daemon-reexec)")
    print(f"journal {entry.id}; undo with: seedance fix undo {entry.id}")
    remaining = remaining_env_leaks(plan.paths)
    print(f"check again: {len(findings) - len(remaining)} of {len(findings)} env-leak finding(s) gone, "
          f"{len(remaining)} remaining")
    for finding in remaining:
        print(f"  still: {finding.message}")
    return 1 if remaining else 0


# --- torch-ext -------------------------------------------------------------------------------------

def _torch_ext(args) -> int:
    from ..fix import torchext
    from ..fix.flows import plan_torch_ext, remaining_stale_builds

    plan = plan_torch_ext(args.clean_cache, args.rebuild)  # an unknown NAME is refused before any change
    roots, findings, facts, stale, chosen = plan.roots, plan.findings, plan.facts, plan.stale, plan.chosen
    print(f"{len(facts)} cached extension build(s) in {', '.join(roots)}; {len(stale)} stale")
    for build in stale:
        print(f"  stale {build.path}: {'; '.join(build.reasons)}")
    if not stale:
        return 0
    if args.dry_run:
        if args.clean_cache:
            print(f"dry run: would move {len(stale)} build(s) into the journal")
        for build in chosen:
            print(f"dry run: would rebuild {build.name} from {', '.join(build.sources) or '?'}")
        print("dry run: nothing written")
        return 0
    journal = _journal()
    moved = {b.path for b in (stale if args.clean_cache else chosen)}
    with journal.begin("fix torch-ext", _argv(), [f.message for f in findings]) as entry:
        for build in stale:
            if build.path in moved:
                entry.move_into(build.path, summary=f"stale {build.name}: {'; '.join(build.reasons)}")
                print(f"moved {build.path} into journal {entry.id}")
        for build in chosen:
            dest = torchext.expected_build_dir(build.name)
            record = entry.expect_new_dir(dest, summary=f"rebuild of {build.name}") \
                if dest and not os.path.exists(dest) else None
            result = torchext.rebuild(build)
            if record is not None:
                entry.created(record)
            archs = ";".join(result["archs"]) or "none (CPU-only torch or no GPU)"
            print(f"rebuilt {build.name} for torch {result['torch']} in {result['build_dir']} "
                  f"(TORCH_CUDA_ARCH_LIST {archs}); imported ok")
    print(f"journal {entry.id}; undo with: seedance fix undo {entry.id}")
    remaining = remaining_stale_builds(roots)
    print(f"check again: {len(stale) - len([r for r in remaining if r.subject['path'] in moved])} of "
          f"{len(stale)} stale build(s) gone, {len(remaining)} remaining")
    for finding in remaining:
        print(f"  still: {finding.message}")
    return 1 if remaining else 0


# --- journal ---------------------------------------------------------------------------------------

def _undo(args) -> int:
    journal = _journal(recover=False)  # undo recovers itself: an interrupted fix is undone by it
    result = journal.undo(args.id)  # RestoreRefused/DamagedEntry: one line, exit 2, nothing written
    for path in result.restored:
        print(f"restored {path} (sha256 verified)")
    for path in result.unchanged:
        print(f"unchanged {path}: already its original bytes")
    for note in result.notes:
        print(f"note: {note}")
    print(f"undone {result.id}: {len(result.restored)} path(s) restored")
    return 0


def _history(args) -> int:
    import json  # only history prints JSON

    journal = _journal()
    entries = journal.entries(damaged=True)  # a damaged manifest is one line, never a traceback
    if args.json:
        # JSON escapes what it holds itself; the output is many lines (print escapes one)
        sys.stdout.write(json.dumps([{k: e.manifest.get(k) for k in ("id", "status", "created", "finished",
                                                                     "command", "argv", "findings", "files",
                                                                     "note")}
                                     for e in entries], indent=2) + "\n")
        return 0
    if not entries:
        print(f"no fixes journaled in {journal.root}")
        return 0
    for entry in entries:
        m = entry.manifest
        if entry.damaged:
            print(f"{entry.id}  damaged      {entry.damaged}")
            continue
        files = [f for f in m["files"] if f.get("state") in ("written", "undone", "rolled-back")]
        note = m["note"] if isinstance(m.get("note"), str) and m["note"] else ""
        print(f"{m['id']}  {str(m.get('status')):<11}  {m.get('command', '')}  "
              f"{len(files)} file(s){'  ' + note if note else ''}")
        for record in files:
            link = f" (via {record['link']})" if isinstance(record.get("link"), str) else ""
            print(f"    {record['action']:<10} {record['path']}{link}")
    return 0
