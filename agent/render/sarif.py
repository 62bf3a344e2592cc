"""Render a Report as a SARIF 2.1.0 log (`check --format sarif`), for code-scanning UIs.

SARIF's shape (OASIS SARIF 2.1.0, sections 3.13 sarifLog, 3.14 run, 3.19 toolComponent,
3.27 result, 3.49 reportingDescriptor): one run whose tool driver is named "seedance" (the
output writer recognises such a log as ours, seedance.render.output), one reportingDescriptor per
rule that fired, one result per finding.  Severities map onto SARIF levels: fatal and error
-> "error", warning -> "warning", info -> "note".  The finding's stable fingerprint
(seedance.model.report.fingerprint) is the result's partialFingerprints entry, so a code-scanning
service tracks a finding across runs as `--baseline` does.

Locations are relative to a source root (`check --source-root`, else the working directory),
named SRCROOT in run.originalUriBaseIds (3.14.14, 3.4.4 uriBaseId), so a log made in a CI
checkout points at the same files in the repository's browser; a path outside the root
keeps its absolute file URI.  Each rule carries its `explain` and fix as help (3.49.13) and
a helpUri (3.49.12) into rules/README.md at the rule's own anchor (`<a id="RULE-ID">`),
the copy installed with the rules that judged the check.
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


SOURCE_ROOT_ID = "SRCROOT"  # the name GitHub code scanning and the SARIF SDK use for the checkout


def sarif_log(report: Report, version: str = "", source_root: str | None = None,
              rules_doc: str | None = None, rule_help: dict | None = None) -> dict:
    """SOURCE_ROOT: the directory file URIs are relative to (absolute; None: every URI
    absolute).  RULES_DOC: rules/README.md's path, the helpUri's target.  RULE_HELP: rule id
    -> help text (the rule's explain and fix)."""
    findings = report.sorted_findings()
    rule_ids = sorted({f.rule for f in findings})
    index = {rule: n for n, rule in enumerate(rule_ids)}
    titles = {f.rule: f.title or f.rule for f in findings}
    example = {f.rule: f for f in findings}
    rule_help = rule_help or {}
    rules = []
    for rule in rule_ids:
        descriptor = {"id": rule, "name": rule,
                      "shortDescription": {"text": titles[rule]},
                      "help": {"text": rule_help.get(rule) or titles[rule]},
                      "defaultConfiguration": {"level": LEVELS[example[rule].severity]},
                      "properties": {"trap": example[rule].trap, "layer": example[rule].layer}}
        if rules_doc:
            descriptor["helpUri"] = _file_uri(rules_doc) + "#" + rule
        rules.append(descriptor)
    root = os.path.join(os.path.abspath(source_root), "") if source_root else None
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
            result["locations"] = [{"physicalLocation": {"artifactLocation": _artifact(path, root)}}]
        also = finding.evidence.get("also_fails")
        if isinstance(also, list) and also:
            # the objects that fail to load with this one (3.27.22 relatedLocations, each with
            # an id unique within the result, 3.28.2)
            result["relatedLocations"] = [
                {"id": n, "physicalLocation": {"artifactLocation": _artifact(str(other), root)},
                 "message": {"text": "fails to load with it"}}
                for n, other in enumerate(also)]
        results.append(result)
    driver = {"name": "seedance", "informationUri": INFORMATION_URI, "rules": rules}
    if version:
        driver["version"] = version
    run = {"tool": {"driver": driver}, "results": results,
           "properties": {"command": report.command, "host": _plain(report.host)}}
    if root:
        run["originalUriBaseIds"] = {SOURCE_ROOT_ID: {"uri": _file_uri(root)}}
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}


def sarif_text(report: Report, source_root: str | None = None, rules_dir: str | None = None) -> str:
    """The log of a check: URIs relative to SOURCE_ROOT (default: the working directory), help
    from the rules in RULES_DIR (default: the shipped rules) and their README."""
    try:
        from importlib.metadata import version

        own = version("seedance")
    except Exception:
        own = ""
    doc, rule_help = _rule_help(rules_dir)
    return json.dumps(sarif_log(report, own, source_root=source_root or os.getcwd(), rules_doc=doc,
                                rule_help=rule_help), indent=2) + "\n"


def _rule_help(rules_dir) -> tuple:
    """(rules/README.md beside the rules, {rule id: its explain, then its fix}); a directory
    of rules without a README points at the shipped one, which documents every shipped id."""
    from ..judge.engine import default_rules_dir, load_rules

    rules = load_rules(rules_dir).rules
    help_text = {}
    for rule in rules:
        text = " ".join((rule.explain or rule.title).split())
        help_text[rule.id] = text + (f" Fix: {rule.fix}" if rule.fix else "")
    doc = os.path.join(rules_dir, "README.md") if rules_dir else ""
    if not os.path.isfile(doc):
        doc = os.path.join(default_rules_dir(), "README.md")
    return (os.path.abspath(doc) if os.path.isfile(doc) else None), help_text


def _artifact(path: str, root: str | None) -> dict:
    """Relative to the source root when the file is below it (RFC 3986 relative reference,
    percent-encoded), else an absolute file URI without a base."""
    from urllib.parse import quote

    absolute = os.path.abspath(path)
    if root and absolute.startswith(root):
        return {"uri": quote(absolute[len(root):], safe="/"), "uriBaseId": SOURCE_ROOT_ID}
    return {"uri": _file_uri(absolute)}


def _file_uri(path: str) -> str:
    """An absolute file URI (RFC 8089); a directory's keeps its trailing slash, as a base
    URI must end in one (SARIF 3.14.14)."""
    from urllib.parse import quote

    return "file://" + quote(path, safe="/")
