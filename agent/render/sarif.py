"""Render a Report as a SARIF 2.1.0 log (`check --format sarif`), for code-scanning UIs.

SARIF's shape (OASIS SARIF 2.1.0, sections 3.13 sarifLog, 3.14 run, 3.19 toolComponent,
3.27 result, 3.49 reportingDescriptor): one run whose tool driver is named "seedance" (the
output writer recognises such a log as ours, seedance.render.output), one reportingDescriptor per
rule that fired, one result per finding.  Severities map onto SARIF levels: fatal and error
-> "error", warning -> "warning", info -> "note".  The finding's stable fingerprint
(seedance.model.report.fingerprint) is the result's partialFingerprints entry, so a code-scanning
service tracks a finding across runs as `--baseline` does.
"""
from __future__ import annotations

import json
import os

from ..model.report import Report, _plain

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
LEVELS = {"fatal": "error", "error": "error", "warning": "warning", "info": "note"}
FINGERPRINT_KEY = "seedance/v1"
INFORMATION_URI = "https://seedance.invalid/docs/check"


def sarif_log(report: Report, version: str = "") -> dict:
    findings = report.sorted_findings()
    rule_ids = sorted({f.rule for f in findings})
    index = {rule: n for n, rule in enumerate(rule_ids)}
    titles = {f.rule: f.title or f.rule for f in findings}
    example = {f.rule: f for f in findings}
    rules = [{"id": rule, "name": rule,
              "shortDescription": {"text": titles[rule]},
              "defaultConfiguration": {"level": LEVELS[example[rule].severity]},
              "properties": {"trap": example[rule].trap, "layer": example[rule].layer}}
             for rule in rule_ids]
    results = []
    for finding in findings:
        result = {"ruleId": finding.rule, "ruleIndex": index[finding.rule],
                  "level": LEVELS[finding.severity],
                  "message": {"text": finding.message + (f" (fix: {finding.fix})" if finding.fix else "")},
                  "partialFingerprints": {FINGERPRINT_KEY: finding.fingerprint},
                  "properties": {"severity": finding.severity, "trap": finding.trap, "layer": finding.layer,
                                 "subject": _plain(finding.subject), "evidence": _plain(finding.evidence),
                                 "fix": finding.fix}}
        path = finding.subject.get("path")
        if isinstance(path, str) and path:
            result["locations"] = [{"physicalLocation": {"artifactLocation": {"uri": _uri(path)}}}]
        results.append(result)
    driver = {"name": "seedance", "informationUri": INFORMATION_URI, "rules": rules}
    if version:
        driver["version"] = version
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION,
            "runs": [{"tool": {"driver": driver}, "results": results,
                      "properties": {"command": report.command, "host": _plain(report.host)}}]}


def sarif_text(report: Report) -> str:
    try:
        from importlib.metadata import version

        own = version("seedance")
    except Exception:
        own = ""
    return json.dumps(sarif_log(report, own), indent=2) + "\n"


def _uri(path: str) -> str:
    """An absolute file URI (RFC 8089); a path outside any checkout has no base to be relative to."""
    from urllib.parse import quote

    absolute = os.path.abspath(path)
    return "file://" + quote(absolute, safe="/")
