"""Render a Report: the terminal table and the seedance.report/v1 JSON.

Only commands call these; the core never prints.
"""
from __future__ import annotations

import json
import os
import shutil
import sys

from .model import Report

SEVERITY_LABEL = {"info": "INFO", "warning": "WARN", "error": "ERROR", "fatal": "FATAL"}


def report_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False) + "\n"


def write_json(report: Report, destination: str) -> None:
    """'-' is stdout; a file is written whole (temp + rename) so a reader never sees half."""
    text = report_json(report)
    if destination == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    directory = os.path.dirname(os.path.abspath(destination))
    temp = os.path.join(directory, f".{os.path.basename(destination)}.{os.getpid()}.tmp")
    with open(temp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, destination)


def _subject(subject) -> str:
    parts = []
    if "pid" in subject:
        parts.append(f"pid {subject['pid']}")
    if "path" in subject:
        parts.append(str(subject["path"]))
    if "plugin" in subject:
        parts.append(f"plugin {subject['plugin']}")
    return " ".join(parts) or "-"


def table(report: Report, width: int | None = None) -> str:
    """Severity, rule, subject and message per finding, the fix under it, then a summary."""
    width = width or shutil.get_terminal_size((120, 24)).columns
    findings = report.sorted_findings()
    lines = []
    if findings:
        rows = [(f"{SEVERITY_LABEL[f.severity]} {f.layer}", f.rule, _subject(f.subject), f.message, f.fix)
                for f in findings]
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
