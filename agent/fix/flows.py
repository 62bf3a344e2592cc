"""Each fixer's whole sequence (findings -> plan -> journaled apply -> verify -> check
again), and the journal's undo and history, for `seedance fix`.

Each fixer takes plain arguments and a ``show`` callback, and returns a FixOutcome: its
Steps in order and its exit code.  It hands every Step to ``show`` the moment it happens,
before the next begins: the command prints each one then, so a fix cut short (a refusal
half-way, a verify that fails, Ctrl-C, a full disk) has already said exactly which files it
changed, and the journal entry it names undoes them.  Nothing here prints.

Traced (seedance.telemetry), each fixer is three stages under the command's span: fix.plan
(the check and the plan: files planned), fix.apply (the journaled writes: files changed,
the journal entry) and fix.verify (the check again: what remains).  Off, they cost nothing.
"""
from __future__ import annotations

import contextlib
import gc
import os
from dataclasses import dataclass, field

from .. import telemetry
from ..model.errors import BadInput, UsageError
from ..model.record import NEW, Record


class Step(Record):
    """One thing a fix found, decided or did, in the order it happened.

    kind    what happened: "recovered" (an interrupted fix the journal rolled back, or
            could not: detail is its UndoResult) and "journaled" (path: the entry's id,
            detail: the count of files written, where the fixer says it) for every fixer;
            each fixer's own kinds are listed in its docstring
    path    the file, directory or build it is about, when it is about one
    detail  what the kind carries: a plan, a diff, a reason, a count, a rebuild's result
    """
    _fields = ("kind", "path", "detail")

    def __init__(self, kind: str, path: str | None = None, detail=None):
        self.kind = kind
        self.path = path
        self.detail = detail


class FixOutcome(Record):
    """What a fix did: its steps in order, its journal entry (None when it wrote nothing
    through the journal: a dry run, nothing to fix) and the command's exit code (0 clean,
    1 findings remain or a change was refused)."""
    _fields = ("exit_code", "steps", "entry_id")

    def __init__(self, exit_code: int, steps: list = NEW, entry_id: str | None = None):
        self.exit_code = exit_code
        self.steps = [] if steps is NEW else steps
        self.entry_id = entry_id


class _Steps:
    """Collects a fix's steps, handing each to ``show`` as it is made."""

    def __init__(self, show, stages=telemetry.NULL):
        self._show = show
        self.steps = []
        self.stages = stages  # the fix.plan/apply/verify spans, when traced

    def __call__(self, kind: str, path: str | None = None, detail=None) -> None:
        step = Step(kind, path, detail)
        self.steps.append(step)
        self._show(step)

    def outcome(self, exit_code: int, entry_id: str | None = None) -> FixOutcome:
        return FixOutcome(exit_code, self.steps, entry_id)


def open_journal(recover: bool = True):
    """The fix journal, and what recovering its interrupted entries did (UndoResults:
    rolled back, or refused with the reason the entry stays open)."""
    from .journal import Journal

    journal = Journal()
    recovered = list(journal.recover_entries()) if recover else []
    return journal, recovered


def _files_written(entry) -> int:
    """The files a journal entry changed (written, not rolled back)."""
    return sum(1 for record in entry.files if record.get("state") == "written")


def _applied(stages, entry) -> None:
    stages.set("seedance.fix.files.changed", _files_written(entry))
    stages.set("seedance.fix.journal.id", entry.id)


def _verified(stages, remaining: int) -> None:
    stages.set("seedance.fix.verify.result", "findings-remain" if remaining else "clean")
    stages.set("seedance.fix.findings.remaining", remaining)


def _journal_recovered(step: _Steps):
    """The journal, its interrupted entries recovered first (each one a "recovered" step):
    a file an interrupted fix left half-changed is put back before anything reads it."""
    journal, recovered = open_journal()
    for result in recovered:
        step("recovered", detail=result)
    return journal


# --- cuda-mismatch -------------------------------------------------------------------------------

def start_dlopen_zygote(dry_run: bool):
    """The process verify() dlopens each rewritten file in, forked first, while this process
    holds nothing but the interpreter (seedance.fix.dlopen_child); None for a dry run or
    where forking is not safe or not possible (verify then starts fresh interpreters)."""
    if dry_run:
        return None
    from .dlopen_child import DlopenZygote

    if not DlopenZygote.safe_to_fork():
        return None
    try:
        return DlopenZygote()
    except OSError:  # no fork (EAGAIN, a process limit)
        return None


@contextlib.contextmanager
def cyclic_collector_paused():
    """No cyclic collection while a fix runs: its passes over the objects every import
    leaves are a large share of a fix of one small library, and a check of a system library
    directory or of a site-packages with torch leaves objects in cycles.  Switched back on
    after: the fix may run in a process that goes on (the tests, the agent)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


@dataclass
class Recheck:
    """The findings a fix set out to remove, checked again after it."""
    before: set
    now: set
    rechecked: list | None = None      # the roots checked again; None: every root

    @property
    def gone(self) -> set:
        return self.before - self.now


def recheck_relink(relinker, plan, written: list) -> Recheck:
    """Check again: the roots that load a rewritten file, the first check's findings elsewhere."""
    remaining = relinker.recheck(plan.findings, written)
    return Recheck(before={(f.rule, f.message) for f in plan.findings},
                   now={(f.rule, f.message) for f in remaining}, rechecked=relinker.rechecked)


def fix_cuda_mismatch(paths: list, runtime: str, pid: int | None, dry_run: bool, progress, argv: list,
                      show) -> FixOutcome:
    """Relink the libraries under PATHS (default: relink.default_roots()) whose CUDA-family
    NEEDED entries do not resolve, lie or mix majors; journaled, each verified before it is
    renamed into place, then checked again.  PROGRESS draws the scan.

    Steps: "runtime-aligned" (detail: (pid, runtime)), "planned" (detail: (roots, plan)),
    "refused" (path, detail: why) or "previewed" (path, detail: (action, its dynamic-entry
    diff)) per library, then "dry-run" (detail: (relinkable, refused)) or "nothing-relinked",
    or per library "relinked" (detail: its strategy) or "not-relinked" (detail: why), then
    "journaled" (detail: files written) and "rechecked" (detail: a Recheck)."""
    zygote = start_dlopen_zygote(dry_run)
    try:
        with cyclic_collector_paused(), telemetry.stages("fix", {"seedance.fix.fixer": "cuda-mismatch"}) as stages:
            return _relink(paths, runtime, pid, dry_run, progress, argv, _Steps(show, stages), zygote)
    finally:
        if zygote is not None:
            zygote.close()


def _relink(paths, runtime, pid, dry_run, progress, argv, step: _Steps, zygote) -> FixOutcome:
    from ..model.errors import ELFError
    from . import atomic, relink
    from .journal import VerifyFailed

    step.stages.next("plan")
    relink.require_elf(paths)
    roots = paths or relink.default_roots()
    if not roots:
        raise BadInput("no roots to scan: none of /usr/lib, $CONDA_PREFIX/lib, ./build, site-packages exists")
    if pid is not None and runtime == "auto":
        runtime = str(relink.process_major(pid))
        step("runtime-aligned", detail=(pid, runtime))
    journal = None if dry_run else _journal_recovered(step)
    relinker = relink.Relinker(roots, runtime=runtime, zygote=zygote)
    plan = relinker.plan(relinker.check(progress))
    step("planned", detail=(roots, plan))
    step.stages.set("seedance.fix.files.planned", len(plan.actions))
    if not plan.findings:
        return step.outcome(0)
    runnable = []
    for action in plan.actions:
        if action.refusal is None:
            try:
                diff = relinker.preview(action)
            except ELFError as exc:
                action.refusal = str(exc)
                diff = []
        if action.refusal:
            step("refused", action.path, action.refusal)
            continue
        runnable.append(action)
        step("previewed", action.path, (action, diff))
    refused = len(plan.actions) - len(runnable)
    if dry_run:
        step("dry-run", detail=(len(runnable), refused))
        return step.outcome(1 if refused or plan.skipped else 0)
    if not runnable:
        step("nothing-relinked")
        return step.outcome(1)
    step.stages.next("apply")
    relinker.drop_mappings()  # the plans are made; nothing of ours maps a target from here on
    relinker.start_verifier()  # without a zygote: its interpreter starts while the pre-flight checks run
    try:
        mapped = atomic.MappedIndex.scan()
        for action in runnable:  # every refusal before any file is touched
            atomic.check_rewritable(action.path, mapped)
        failed = []
        with journal.begin("fix cuda-mismatch", argv, [f.message for f in plan.findings]) as entry:
            for action in runnable:
                relinker.start_verifier()
                edit = relinker.edit(action)
                try:
                    entry.replace_file(action.path, edit.fill_deferred,
                                       verify=lambda temp, a=action: relinker.verify(a, temp),
                                       summary="; ".join(action.changes), expect=action.identity)
                    step("relinked", action.path, action.strategy)
                except VerifyFailed as exc:
                    failed.append(str(exc))
                    step("not-relinked", action.path, str(exc))
    finally:
        relinker.close()
    written = [r["path"] for r in entry.files if r["state"] == "written"]
    if written:
        step("journaled", entry.id, len(written))
    _applied(step.stages, entry)
    step.stages.next("verify")
    recheck = recheck_relink(relinker, plan, written)
    step("rechecked", detail=recheck)
    _verified(step.stages, len(recheck.now))
    incomplete = refused or failed or plan.skipped
    return step.outcome(1 if recheck.now or incomplete else 0, entry.id)


# --- env-leak ------------------------------------------------------------------------------------

@dataclass
class EnvLeakPlan:
    paths: list                                   # the configs in scope
    findings: list = field(default_factory=list)  # their env-leak findings
    by_path: dict = field(default_factory=dict)
    edits: list = field(default_factory=list)     # envleak.ConfigEdit per config it can fix
    preloads: list = field(default_factory=list)  # LD_PRELOAD values that move to environment.d
    drop_in: str | None = None
    unfixable: list = field(default_factory=list)


def plan_env_leak(scope: str, inject: str | None) -> EnvLeakPlan:
    """The configs in SCOPE checked, and the edit of each that makes ${VAR} lazy (and moves
    LD_PRELOAD out with --inject).  A preload that is not safe is refused here, before
    anything is touched."""
    from ..collect.scan import CheckOptions, run_check
    from . import envleak

    plan = EnvLeakPlan(paths=envleak.scope_paths(scope))
    if not plan.paths:
        return plan
    report = run_check(CheckOptions(targets=plan.paths))  # a config that does not parse stops here
    plan.findings = [f for f in report.findings if f.rule == "env-leak"]
    for finding in plan.findings:
        plan.by_path.setdefault(finding.subject["path"], []).append(finding)
    for path in sorted(plan.by_path):
        edit = envleak.plan_config_edit(path, plan.by_path[path], inject)
        if edit is not None:
            plan.edits.append(edit)
    plan.preloads = [value for edit in plan.edits for value in edit.preloads]
    for value in plan.preloads:
        for item in [v for v in envleak.expand_for_check(value, os.environ).replace(":", " ").split() if v]:
            problem = envleak.unsafe_preload(item)
            if problem:
                raise BadInput(f"--inject LD_PRELOAD refused: {problem}; nothing changed")
    plan.drop_in = envleak.drop_in_path() if plan.preloads else None
    plan.unfixable = [f for f in plan.findings
                      if not any(c[1] == f.evidence.get("key") and c[2] == f.evidence.get("value")
                                 for e in plan.edits for c in e.changes)]
    return plan


def config_diff(edit) -> list:
    """The unified diff of one config edit, line by line."""
    import difflib  # only env-leak shows a text diff: kept off every fix's start-up

    return list(difflib.unified_diff(edit.original.decode("utf-8").splitlines(),
                                     edit.new.decode("utf-8").splitlines(),
                                     f"{edit.path} (before)", f"{edit.path} (after)", lineterm="", n=1))


def verify_config(edit, temp: str) -> None:
    """The rewritten config (at TEMP, not yet in place) no longer expands what it made lazy
    and no longer holds what it moved out; BadInput otherwise, and the journal keeps the
    original."""
    from ..collect.config import config_facts

    moved = {c[1] for c in edit.changes if c[3] is None}
    for fact in config_facts(temp):
        if fact.data.get("expands_early") and any(c[1] == fact.data["key"] for c in edit.changes):
            raise BadInput(f"{fact.data['key']} still expands early: {fact.data['value']}")
        if fact.data["key"] in moved and fact.data["value"] in edit.preloads:
            raise BadInput(f"{fact.data['key']} was not moved out")


def remaining_env_leaks(paths: list) -> list:
    """The env-leak findings a check of PATHS still makes."""
    from ..collect.scan import CheckOptions, run_check

    return [f for f in run_check(CheckOptions(targets=paths)).findings if f.rule == "env-leak"]


def fix_env_leak(scope: str, inject: str | None, dry_run: bool, argv: list, show) -> FixOutcome:
    """Make ${VAR} lazy in the configs of SCOPE that the env-leak rule flags (and move
    LD_PRELOAD into environment.d with --inject); journaled, each config verified before it
    is renamed into place, then checked again.

    Steps: "planned" (detail: the EnvLeakPlan), then "dry-run", or per config "rewrote"
    (detail: the values changed) and "wrote-drop-in" (path: the environment.d file), then
    "journaled" and "rechecked" (detail: (findings before, the findings that remain))."""
    with telemetry.stages("fix", {"seedance.fix.fixer": "env-leak"}) as stages:
        return _env_leak(scope, inject, dry_run, argv, _Steps(show, stages))


def _env_leak(scope, inject, dry_run, argv, step: _Steps) -> FixOutcome:
    from . import atomic, envleak

    step.stages.next("plan")
    plan = plan_env_leak(scope, inject)
    step("planned", detail=plan)
    step.stages.set("seedance.fix.files.planned", len(plan.edits) + (1 if plan.drop_in else 0))
    if not plan.paths or not plan.findings:
        return step.outcome(0)
    edits, drop_in = plan.edits, plan.drop_in
    if dry_run:
        step("dry-run")
        return step.outcome(1 if plan.unfixable else 0)
    if not edits:
        return step.outcome(1)
    step.stages.next("apply")
    mapped = atomic.MappedIndex.scan()
    for edit in edits:
        atomic.check_rewritable(edit.path, mapped)
    if drop_in and os.path.exists(drop_in):
        atomic.check_rewritable(drop_in, mapped)
    journal = _journal_recovered(step)
    with journal.begin("fix env-leak", argv, [f.message for f in plan.findings]) as entry:
        for edit in edits:
            entry.replace_file(edit.path, edit.new, verify=lambda temp, e=edit: verify_config(e, temp),
                               summary=f"{len(edit.changes)} value(s) made lazy or moved")
            step("rewrote", edit.path, len(edit.changes))
        if drop_in:
            existing = open(drop_in, encoding="utf-8").read() if os.path.exists(drop_in) else None
            content = envleak.drop_in_content(existing, "LD_PRELOAD", plan.preloads, entry.id).encode()
            if existing is None:
                entry.create_file(drop_in, content, mode=0o644, summary="LD_PRELOAD for the user session")
            else:
                entry.replace_file(drop_in, content, summary="LD_PRELOAD for the user session")
            step("wrote-drop-in", drop_in)
    step("journaled", entry.id)
    _applied(step.stages, entry)
    step.stages.next("verify")
    remaining = remaining_env_leaks(plan.paths)
    step("rechecked", detail=(plan.findings, remaining))
    _verified(step.stages, len(remaining))
    return step.outcome(1 if remaining else 0, entry.id)


# --- torch-ext -----------------------------------------------------------------------------------

@dataclass
class TorchExtPlan:
    roots: list
    findings: list
    facts: list
    stale: list        # torchext.StaleBuild
    chosen: list       # the stale builds to rebuild


def plan_torch_ext(clean_cache: bool, rebuild: str | None) -> TorchExtPlan:
    """The extension caches inventoried; the stale builds, and those --rebuild names (an
    unknown NAME is refused before any change)."""
    from ..collect.torch_ext import cache_roots
    from . import torchext

    if not clean_cache and not rebuild:
        raise UsageError("seedance fix torch-ext: give --clean-cache and/or --rebuild custom_kernels|NAME|all")
    roots = cache_roots()
    findings, facts = torchext.check_caches(roots)
    stale = torchext.stale_builds(findings)
    chosen = torchext.select(stale, rebuild)
    return TorchExtPlan(roots, findings, facts, stale, chosen)


def remaining_stale_builds(roots: list) -> list:
    """The torch-ext-stale findings a new inventory of ROOTS still makes."""
    from . import torchext

    after, _facts = torchext.check_caches(roots)
    return [f for f in after if f.rule == "torch-ext-stale"]


def fix_torch_ext(clean_cache: bool, rebuild: str | None, dry_run: bool, argv: list, show) -> FixOutcome:
    """Move the stale extension builds into the journal (--clean-cache) and rebuild those
    --rebuild names for the current torch, then inventory the caches again.

    Steps: "planned" (detail: the TorchExtPlan), then "dry-run", or per build "moved" (path:
    the build, detail: the journal entry) and "rebuilt" (path: the extension's name, detail:
    torchext.rebuild()'s result), then "journaled" and "rechecked" (detail: (stale builds
    before, those of them gone, the findings that remain))."""
    with telemetry.stages("fix", {"seedance.fix.fixer": "torch-ext"}) as stages:
        return _torch_ext(clean_cache, rebuild, dry_run, argv, _Steps(show, stages))


def _torch_ext(clean_cache, rebuild, dry_run, argv, step: _Steps) -> FixOutcome:
    from . import torchext

    step.stages.next("plan")
    plan = plan_torch_ext(clean_cache, rebuild)  # an unknown NAME is refused before any change
    step("planned", detail=plan)
    stale, chosen = plan.stale, plan.chosen
    step.stages.set("seedance.fix.files.planned", len(stale if clean_cache else chosen))  # chosen: of stale
    if not stale:
        return step.outcome(0)
    if dry_run:
        step("dry-run", detail=plan)
        return step.outcome(0)
    step.stages.next("apply")
    journal = _journal_recovered(step)
    moved = {b.path for b in (stale if clean_cache else chosen)}
    with journal.begin("fix torch-ext", argv, [f.message for f in plan.findings]) as entry:
        for build in stale:
            if build.path in moved:
                entry.move_into(build.path, summary=f"stale {build.name}: {'; '.join(build.reasons)}")
                step("moved", build.path, entry.id)
        for build in chosen:
            dest = torchext.expected_build_dir(build.name)
            record = entry.expect_new_dir(dest, summary=f"rebuild of {build.name}") \
                if dest and not os.path.exists(dest) else None
            result = torchext.rebuild(build)
            if record is not None:
                entry.created(record)
            step("rebuilt", build.name, result)
    step("journaled", entry.id)
    _applied(step.stages, entry)
    step.stages.next("verify")
    remaining = remaining_stale_builds(plan.roots)
    gone = len(stale) - len([r for r in remaining if r.subject["path"] in moved])
    step("rechecked", detail=(len(stale), gone, remaining))
    _verified(step.stages, len(remaining))
    return step.outcome(1 if remaining else 0, entry.id)


# --- the journal ---------------------------------------------------------------------------------

def undo_fix(entry_id: str | None):
    """Put back the files of the fix ENTRY_ID (default: the latest committed one) byte for
    byte; its UndoResult.  RestoreRefused or DamagedEntry when it cannot, nothing written.
    The journal is not recovered first: undo recovers an interrupted entry itself."""
    journal, _recovered = open_journal(recover=False)
    return journal.undo(entry_id)


# what `fix history --json` shows of each entry's manifest
HISTORY_FIELDS = ("id", "status", "created", "finished", "command", "argv", "findings", "files", "note")
# the files a history line lists: those a fix changed, and what became of them
_LISTED_STATES = ("written", "undone", "rolled-back")


class HistoryEntry(Record):
    """One journal entry as `fix history` lists it.

    id        the entry's id
    damaged   why its manifest is unusable ('' when it is fine)
    status    open, committed, rolled-back, undone
    command   the fix that made it ("fix cuda-mismatch")
    note      why it ended as it did ('' when nothing needs saying)
    files     the manifest's records of the paths it changed
    manifest  the manifest's fields in HISTORY_FIELDS, for --json
    """
    _fields = ("id", "damaged", "status", "command", "note", "files", "manifest")

    def __init__(self, id: str, damaged: str, status, command: str, note: str, files: list, manifest: dict):
        self.id = id
        self.damaged = damaged
        self.status = status
        self.command = command
        self.note = note
        self.files = files
        self.manifest = manifest


class FixHistory(Record):
    """The fix journal's entries, oldest first, and where it lives."""
    _fields = ("root", "entries", "steps")

    def __init__(self, root, entries: list = NEW, steps: list = NEW):
        self.root = root
        self.entries = [] if entries is NEW else entries
        self.steps = [] if steps is NEW else steps  # the "recovered" steps of opening it


def fix_history(show) -> FixHistory:
    """Every journal entry, damaged ones too (a manifest that cannot be read is listed with
    why, never a traceback); interrupted entries are recovered first, each a "recovered"
    step handed to ``show``."""
    step = _Steps(show)
    journal = _journal_recovered(step)
    listed = []
    for entry in journal.entries(damaged=True):
        m = entry.manifest
        note = m["note"] if isinstance(m.get("note"), str) and m["note"] else ""
        files = [] if entry.damaged else [f for f in m["files"] if f.get("state") in _LISTED_STATES]
        listed.append(HistoryEntry(m["id"] if not entry.damaged else entry.id, entry.damaged, m.get("status"),
                                   m.get("command", ""), note, files, {k: m.get(k) for k in HISTORY_FIELDS}))
    return FixHistory(journal.root, listed, step.steps)
