"""The end of a run: this run's instances read from the shim's registry, judged by the rule
engine (handle-leak is a finding like every other), and their slots given back.

Shared by `seedance run`, the C launcher's hand-over (`--finish-group`) and the live
profiler, which all start programs under the shim.  What the user must hear goes through
the caller's ``notice``; the report is returned for the caller to write.
"""
from __future__ import annotations

from typing import Callable

from ..model.errors import NotAvailable, UsageError


def judge_and_release(registry, group_key: int, result, affinity: str | None,
                      notice: Callable[[str], None]):
    """After the program: read this run's instances, say what needs saying, give the slots
    and the group back.  Returns the run report (seedance.report/v1)."""
    from .. import shim
    from .report import build_report, leaks_with_apis

    if registry is None:
        try:
            registry = shim.Registry.open()
        except NotAvailable:
            registry = None
    instances, leaks, group = [], {}, None
    if registry is not None:
        result.registry = str(registry.path)
        group = registry.find_group(group_key)
        if group:
            # only this run's slots, found in C; records are summed only for these
            instances = [i for i in map(registry.instance, registry.slots_of_group(group.index)) if i]
            leaks = {i.slot: leaks_with_apis(registry, i.slot) for i in instances if i.current}
    if affinity and any(i.visible == [] for i in instances):
        notice(f"seedance: note: --affinity {affinity} named no device the driver has: "
               f"the program saw none")
    if group and (group.overflow_total or group.overflow_refused):
        notice(f"seedance: note: the registry was full: {group.overflow_total + group.overflow_refused} "
               f"process(es) of this run had no slot of their own; they shared the run's quota"
               + (f" ({group.overflow_refused} could not even join it: their quota'd allocations were refused)"
                  if group.overflow_refused else "") + ", and their allocations are not itemised in the report")
    report = build_report(result, instances, leaks, group, _load_rules)
    for finding in report.sorted_findings():
        if finding.rule == "handle-leak":
            notice(f"seedance: {finding.severity}: {finding.rule}: {finding.message}")
    if registry is not None:
        for inst in instances:
            registry.reclaim(inst.slot)
        if group:
            registry.release_group(group.index)
    return report


def finish_launcher_group(group_key: str, exit_code: int | None, affinity: str | None,
                          notice: Callable[[str], None]) -> int:
    """The end of a run that seedance-run (the C launcher, shim/src/launcher.c) started, when
    its instances ended holding memory: the handle-leak findings come from the rule engine,
    which is in Python.  Returns the program's exit code."""
    from .report import RunResult

    try:
        key = int(group_key, 16)
    except ValueError:
        raise UsageError(f"run: --finish-group: {group_key!r} is not a group key") from None
    code = exit_code if exit_code is not None else 0
    result = RunResult(argv=[], exit_code=code, signal=code - 128 if code > 128 else None, wrapped=True)
    judge_and_release(None, key, result, affinity, notice)
    return result.exit_code


def _load_rules():
    """The rule engine, loaded only when the run produced facts to judge: compiling every
    rule is a cost each run would pay at its end."""
    from ..judge.engine import load_rules

    return load_rules()
