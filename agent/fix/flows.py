"""The plan and check-again halves of each fixer's sequence (findings -> plan -> journaled
apply -> verify -> check again), for `seedance fix`.

Each function takes plain arguments and returns what it found or decided; the command
prints it.  The journaled apply loops stay beside the lines they print, one per file as
it is written, so that a fix cut short has said exactly which files it changed.
"""
from __future__ import annotations

import contextlib
import gc
import os
from dataclasses import dataclass, field

from ..model.errors import BadInput, UsageError


def open_journal(recover: bool = True):
    """The fix journal, and what recovering its interrupted entries did (UndoResults:
    rolled back, or refused with the reason the entry stays open)."""
    from .journal import Journal

    journal = Journal()
    recovered = list(journal.recover_entries()) if recover else []
    return journal, recovered


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
