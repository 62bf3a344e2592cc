"""Render a Report: the terminal table and the seedance.report/v1 JSON.

Only commands call these; the core never prints.
"""
from __future__ import annotations

import json
import shutil

from .errors import escape_path
from .model import Report

SEVERITY_LABEL = {"info": "INFO", "warning": "WARN", "error": "ERROR", "fatal": "FATAL"}


def report_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False) + "\n"


def write_json(report: Report, destination) -> None:
    """Write the report through seedance.output: DESTINATION is a prepared OutputTarget
    (prepare it before the work, so a bad path fails first) or a path ('-' is stdout)."""
    from .output import OutputTarget, prepare_output

    target = destination if isinstance(destination, OutputTarget) else prepare_output(destination)
    target.write_text(report_json(report))


def _subject(subject) -> str:
    parts = []
    if "pid" in subject:
        parts.append(f"pid {subject['pid']}")
    if "path" in subject:
        parts.append(escape_path(subject["path"]))
    if "plugin" in subject:
        parts.append(f"plugin {subject['plugin']}")
    return " ".join(parts) or "-"


def table(report: Report, width: int | None = None) -> str:
    """Severity, rule, subject and message per finding, the fix under it, then a summary."""
    width = width or shutil.get_terminal_size((120, 24)).columns
    findings = report.sorted_findings()
    lines = []
    if findings:
        # paths and messages come from files on disk: control characters are escaped so a
        # crafted name cannot forge a row or an error line (issue 10, defect 8)
        rows = [(f"{SEVERITY_LABEL[f.severity]} {f.layer}", f.rule, _subject(f.subject), escape_path(f.message),
                 escape_path(f.fix) if f.fix else f.fix) for f in _grouped(findings)]
        sev_w = max(len("SEVERITY"), *(len(r[0]) for r in rows))
        rule_w = max(len("RULE"), *(len(r[1]) for r in rows))
        subj_w = min(max(len("SUBJECT"), *(len(r[2]) for r in rows)), max(20, width // 3))
        lines.append(f"{'SEVERITY':<{sev_w}}  {'RULE':<{rule_w}}  {'SUBJECT':<{subj_w}}  MESSAGE")
        for sev, rule, subject, message, fix in rows:
            if len(subject) > subj_w:
                subject = "..." + subject[-(subj_w - 3):]
            lines.append(f"{sev:<{sev_w}}  {rule:<{rule_w}}  {subject:<{subj_w}}  {message}")
            if fix:
                lines.append(f"{'':<{sev_w}}  {'':<{rule_w}}  fix: {fix}")
    lines.append(summary(report))
    return "\n".join(lines) + "\n"


SYMBOL_CAUSES = {"node-lacks-symbol": "missing from a version node their provider defines",
                 "no-definition": "defined by nothing in the closure"}


def _grouped(findings: list) -> list:
    """One row per library, rule and cause for symbol findings, with a count: --strict on a
    Python tree would otherwise print one line per C-API symbol (issue 11, item 5).  The
    JSON report keeps every finding."""
    from dataclasses import replace

    groups: dict = {}
    order = []
    for finding in findings:
        if "symbol" not in finding.evidence:
            order.append(finding)
            continue
        key = (finding.rule, _subject(finding.subject), finding.evidence.get("cause", ""))
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(finding)
    out = []
    for item in order:
        if not isinstance(item, tuple):
            out.append(item)
            continue
        members = groups[item]
        if len(members) == 1:
            out.append(members[0])
            continue
        names = [f"{f.evidence['symbol']}@{f.evidence['version']}" if f.evidence.get("version")
                 else str(f.evidence["symbol"]) for f in members]
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        cause = SYMBOL_CAUSES.get(item[2], item[2] or "undefined")
        host = members[0].evidence.get("host")
        where = f" (with {host} in scope)" if host and item[2] == "no-definition" else ""
        out.append(replace(members[0], message=f"{len(members)} symbols {cause}{where}: {shown}"))
    return out


def summary(report: Report) -> str:
    counts: dict = {}
    for finding in report.findings:
        counts[finding.severity] = counts.get(finding.severity, 0) + 1
    stats = report.stats
    by_severity = ", ".join(f"{counts[s]} {s}" for s in ("fatal", "error", "warning", "info") if s in counts)
    found = f"{len(report.findings)} finding{'s' if len(report.findings) != 1 else ''}"
    if by_severity:
        found += f" ({by_severity})"
    scope = []
    if "files_scanned" in stats:
        scope.append(f"{stats['files_scanned']} files")
    if "elf_objects" in stats:
        scope.append(f"{stats['elf_objects']} ELF objects")
    if stats.get("processes"):
        scope.append(f"{stats['processes']} processes")
    if stats.get("configs"):
        scope.append(f"{stats['configs']} configs")
    line = f"seedance {report.command}: {found}"
    if scope:
        line += " in " + ", ".join(scope)
    if "duration_s" in stats:
        line += f", {stats['duration_s']:.1f} s"
    problems = len(stats.get("errors", ()))
    if problems:
        line += f"; {problems} file(s) could not be read (stats.errors in --report-json)"
    return line
