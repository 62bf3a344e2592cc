"""Render a Report: the terminal table and the seedance.report/v1 JSON.

Only commands call these; the core never prints.
"""
from __future__ import annotations

import json
import os
import re

from . import terminal
from ..model.errors import escape_path
from ..model.report import Report

SEVERITY_LABEL = {"info": "INFO", "warning": "WARN", "error": "ERROR", "fatal": "FATAL"}
# SGR colours per severity (ECMA-48): fatal bold red, error red, warning yellow, info cyan
SEVERITY_COLOR = {"fatal": "1;31", "error": "31", "warning": "33", "info": "36"}
COLOR_CHOICES = ("auto", "always", "never")
# a rule with more rows than this, for one cause, is folded to its first FOLD_SHOWN rows and a
# count (so --strict on a big tree reads like a summary; --verbose shows every one)
FOLD_AFTER = 5
FOLD_SHOWN = 3


def use_color(choice: str = "auto", stream=None) -> bool:
    """--color=always|never decide; auto: a terminal (not TERM=dumb) and no NO_COLOR.
    A command-line choice overrides NO_COLOR, as https://no-color.org asks."""
    import sys

    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR", ""):
        return False
    stream = stream if stream is not None else sys.stdout
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return tty and os.environ.get("TERM") != "dumb"


def human_size(count: int) -> str:
    """1536 -> '1.5 KiB' (binary units, as nvidia-smi and free -h print them)."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


# "123456789 bytes", "123456789 free bytes" in a finding's message: JSON keeps the exact
# count (and the evidence has it as a number); the table shows a size a person reads
_BYTES = re.compile(r"\b(\d{4,}) (free )?bytes\b")


def humanize_sizes(text: str) -> str:
    return _BYTES.sub(lambda m: f"{human_size(int(m.group(1)))}{' free' if m.group(2) else ''}", text)


def report_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False) + "\n"


def write_json(report: Report, destination) -> None:
    """Write the report through seedance.render.output: DESTINATION is a prepared OutputTarget
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


def table(report: Report, width: int | None = None, color: bool = False, verbose: bool = False) -> str:
    """Severity, rule, subject and message per finding, the fix under it, then a summary.
    Repeated causes are grouped and counted unless VERBOSE; COLOR paints the severity."""
    width = width or terminal.columns(120)
    findings = report.sorted_findings()
    lines = []
    if findings:
        shown = findings if verbose else _folded(_grouped(findings))
        # paths and messages come from files on disk: control characters are escaped so a
        # crafted name cannot forge a row or an error line
        rows = [(f"{SEVERITY_LABEL[f.severity]} {f.layer}", f.rule, _subject(f.subject),
                 humanize_sizes(escape_path(f.message)), escape_path(f.fix) if f.fix else f.fix, f.severity)
                for f in shown]
        sev_w = max(len("SEVERITY"), *(len(r[0]) for r in rows))
        rule_w = max(len("RULE"), *(len(r[1]) for r in rows))
        subj_w = min(max(len("SUBJECT"), *(len(r[2]) for r in rows)), max(20, width // 3))
        lines.append(f"{'SEVERITY':<{sev_w}}  {'RULE':<{rule_w}}  {'SUBJECT':<{subj_w}}  MESSAGE")
        for sev, rule, subject, message, fix, severity in rows:
            if len(subject) > subj_w:
                subject = "..." + subject[-(subj_w - 3):]
            cell = f"{sev:<{sev_w}}"  # padded first: escape codes have no width
            if color:
                cell = f"\033[{SEVERITY_COLOR[severity]}m{cell}\033[0m"
            lines.append(f"{cell}  {rule:<{rule_w}}  {subject:<{subj_w}}  {message}")
            if fix:
                lines.append(f"{'':<{sev_w}}  {'':<{rule_w}}  fix: {fix}")
    lines.append(summary(report))
    return "\n".join(lines) + "\n"


SYMBOL_CAUSES = {"node-lacks-symbol": "missing from a version node their provider defines",
                 "no-definition": "defined by nothing in the closure"}


def _grouped(findings: list) -> list:
    """One row per library, rule and cause for symbol findings, with a count: --strict on a
    Python tree would otherwise print one line per C-API symbol.  The
    JSON report keeps every finding."""
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
        out.append(members[0]._replace(message=f"{len(members)} symbols {cause}{where}: {shown}"))
    return out


def _folded(findings: list) -> list:
    """Fold a rule's rows for one cause beyond FOLD_AFTER into the first FOLD_SHOWN and one
    counted row, in place of the rest."""
    keys = [(f.rule, f.severity, str(f.evidence.get("cause", ""))) for f in findings]
    totals: dict = {}
    for key in keys:
        totals[key] = totals.get(key, 0) + 1
    seen: dict = {}
    out = []
    for finding, key in zip(findings, keys):
        seen[key] = seen.get(key, 0) + 1
        if totals[key] <= FOLD_AFTER or seen[key] <= FOLD_SHOWN:
            out.append(finding)
        elif seen[key] == FOLD_SHOWN + 1:
            rest = totals[key] - FOLD_SHOWN
            out.append(finding._replace(subject={"path": f"({rest} more)"},
                                        message=f"{rest} more {finding.rule} finding(s) like the ones above "
                                                f"(--verbose shows every one; the JSON report has them all)",
                                        fix=None))
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
    if isinstance(stats.get("cache"), dict) and stats["cache"].get("state") == "hit":
        # (a tenth of the time: say why, and how to check afresh)
        line += f" (unchanged since the last check: from the check cache, {stats['cache'].get('inputs', 0)} " \
                f"inputs as they were; --no-cache checks again)"
    problems = len(stats.get("errors", ()))
    if problems:
        line += f"; {problems} file(s) could not be read (stats.errors in --report-json)"
    return line
