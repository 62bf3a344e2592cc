"""Which findings a check reports: --select, --ignore, --min-severity, --baseline, and the
same settings from a .seedance.yaml in the project root (issue 16, section 2).

    # .seedance.yaml (the current directory's, else the git root of the first target)
    select: [cuda-arch-missing, needed-unresolved]   # only these rules
    ignore:
      - symbol-undefined                             # this rule everywhere
      - needed-unresolved:/opt/vendor/*              # this rule under a path glob
      - 29a78bb14088511d                             # one finding, by its fingerprint
    min-severity: warning
    baseline: .seedance-baseline.json                # relative to the file

The command line wins: --select and --min-severity replace the file's, --ignore adds to it,
--baseline replaces it.  Rule ids are checked against the loaded rules, so a typo is a
usage error (exit 2), not a filter that silently keeps everything.
"""
from __future__ import annotations

import fnmatch
import json
import os
import re
from .record import NEW, Record

from .errors import BadInput, UsageError, escape_path
from .model import SEVERITIES, SEVERITY_RANK, fingerprint

CONFIG_NAME = ".seedance.yaml"
_FINGERPRINT = re.compile(r"^[0-9a-f]{16}$")
_KEYS = {"select", "ignore", "min-severity", "min_severity", "baseline"}


class Ignore(Record):
    """One ignore entry: a rule (with a path glob or not), or a finding's fingerprint."""
    _fields = ("rule", "glob", "fingerprint")

    def __init__(self, rule: str | None = None, glob: str | None = None, fingerprint: str | None = None):
        self.rule = rule  # None: a fingerprint entry
        self.glob = glob
        self.fingerprint = fingerprint

    def matches(self, finding) -> bool:
        if self.fingerprint is not None:
            return finding.fingerprint == self.fingerprint
        if finding.rule != self.rule:
            return False
        if self.glob is None:
            return True
        path = finding.subject.get("path")
        return isinstance(path, str) and fnmatch.fnmatchcase(path, self.glob)


class FindingFilter(Record):
    """Which findings a report keeps: --select, --ignore, --min-severity, --baseline."""
    _fields = ("select", "ignore", "min_severity", "baseline", "baseline_path", "config_path")

    def __init__(self, select: frozenset | None = None, ignore: list = NEW, min_severity: str | None = None,
                 baseline: frozenset | None = None, baseline_path: str | None = None,
                 config_path: str | None = None):
        self.select = select
        self.ignore = [] if ignore is NEW else ignore
        self.min_severity = min_severity
        self.baseline = baseline  # fingerprints of the findings already known
        self.baseline_path = baseline_path
        self.config_path = config_path

    @property
    def active(self) -> bool:
        return bool(self.select is not None or self.ignore or self.min_severity or self.baseline is not None)

    def keep(self, finding) -> bool:
        if self.select is not None and finding.rule not in self.select:
            return False
        if self.min_severity and SEVERITY_RANK[finding.severity] < SEVERITY_RANK[self.min_severity]:
            return False
        if any(entry.matches(finding) for entry in self.ignore):
            return False
        if self.baseline is not None and finding.fingerprint in self.baseline:
            return False
        return True

    def apply(self, report) -> dict:
        """Drop what is filtered out of ``report`` (in place); the counts go in its stats."""
        before = len(report.findings)
        report.findings = [f for f in report.findings if self.keep(f)]
        summary = {"before": before, "after": len(report.findings)}
        if self.config_path:
            summary["config"] = self.config_path
        if self.baseline_path:
            summary["baseline"] = self.baseline_path
        return summary


def parse_ignore(text: str, known: set | None = None, where: str = "--ignore") -> Ignore:
    text = text.strip()
    if _FINGERPRINT.match(text):
        return Ignore(fingerprint=text)
    rule, sep, glob = text.partition(":")
    if not rule or (sep and not glob):
        raise UsageError(f"{where}: {text!r}: expected RULE, RULE:GLOB or a 16-digit fingerprint")
    _known_rule(rule, known, where)
    return Ignore(rule=rule, glob=glob if sep else None)


def parse_select(text, known: set | None = None, where: str = "--select") -> frozenset:
    items = text.split(",") if isinstance(text, str) else list(text)
    rules = [str(item).strip() for item in items if str(item).strip()]
    if not rules:
        raise UsageError(f"{where}: no rule named")
    for rule in rules:
        _known_rule(rule, known, where)
    return frozenset(rules)


def parse_severity(text: str, where: str = "--min-severity") -> str:
    if text not in SEVERITIES:
        raise UsageError(f"{where}: {text!r} is not one of {', '.join(SEVERITIES)}")
    return text


def _known_rule(rule: str, known: set | None, where: str) -> None:
    if known is not None and rule not in known:
        raise UsageError(f"{where}: no rule named {rule!r}")


def load_baseline(path: str) -> frozenset:
    """Fingerprints of a previous seedance.report/v1 (or of a seedance SARIF log)."""
    shown = escape_path(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read((256 << 20) + 1)
    except OSError as exc:
        from .errors import describe_os_error

        raise BadInput(f"--baseline: {describe_os_error(exc)}") from None
    try:
        document = json.loads(data.decode("utf-8", "surrogateescape"))
    except ValueError as exc:
        raise BadInput(f"--baseline: {shown}: not JSON ({exc})") from None
    prints = set()
    if isinstance(document, dict) and document.get("schema") == "seedance.report/v1":
        for item in document.get("findings") or []:
            if not isinstance(item, dict):
                continue
            if isinstance(item.get("fingerprint"), str):
                prints.add(item["fingerprint"])
            elif isinstance(item.get("subject"), dict):  # a report from before fingerprints
                prints.add(fingerprint(str(item.get("rule")), item["subject"], str(item.get("message", ""))))
        return frozenset(prints)
    if isinstance(document, dict) and isinstance(document.get("runs"), list):
        for run in document["runs"]:
            for result in (run or {}).get("results") or []:
                value = ((result or {}).get("partialFingerprints") or {}).get("seedance/v1")
                if isinstance(value, str):
                    prints.add(value)
        return frozenset(prints)
    raise BadInput(f"--baseline: {shown}: not a seedance report (schema seedance.report/v1) or SARIF log")


def find_config(targets=(), cwd: str | None = None) -> str | None:
    """.seedance.yaml in the current directory, else in the git root above the first target."""
    cwd = cwd or os.getcwd()
    here = os.path.join(cwd, CONFIG_NAME)
    if os.path.isfile(here):
        return here
    for target in targets[:1]:
        directory = os.path.abspath(target)
        if not os.path.isdir(directory):
            directory = os.path.dirname(directory)
        while True:
            if os.path.exists(os.path.join(directory, ".git")):
                candidate = os.path.join(directory, CONFIG_NAME)
                return candidate if os.path.isfile(candidate) else None
            parent = os.path.dirname(directory)
            if parent == directory:
                return None
            directory = parent
    return None


def read_config(path: str) -> dict:
    """The settings of a .seedance.yaml, through the bounded loader (seedance.yamlio)."""
    import yaml

    from . import yamlio

    shown = escape_path(path)
    try:
        document = yamlio.load_file(path)
    except yaml.YAMLError as exc:
        raise BadInput(f"{shown}: not valid YAML: {str(exc).splitlines()[0]}") from None
    except OSError as exc:
        from .errors import describe_os_error

        raise BadInput(describe_os_error(exc)) from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise BadInput(f"{shown}: expected a mapping of settings ({', '.join(sorted(_KEYS - {'min_severity'}))})")
    unknown = sorted(str(k) for k in document if k not in _KEYS)
    if unknown:
        raise BadInput(f"{shown}: unknown setting {unknown[0]!r}")
    return document


def build(select=None, ignore=(), min_severity=None, baseline=None, targets=(), known: set | None = None,
          use_config: bool = True, cwd: str | None = None) -> FindingFilter:
    """The filter for one check: the project's .seedance.yaml, then the command line."""
    result = FindingFilter()
    config = find_config(list(targets), cwd) if use_config else None
    settings = read_config(config) if config else {}
    if config:
        result.config_path = config
        where = escape_path(config)
        if settings.get("select") is not None:
            result.select = parse_select(_list(settings["select"], where, "select"), known, f"{where}: select")
        for item in _list(settings.get("ignore") or [], where, "ignore"):
            result.ignore.append(parse_ignore(str(item), known, f"{where}: ignore"))
        severity = settings.get("min-severity", settings.get("min_severity"))
        if severity is not None:
            result.min_severity = parse_severity(str(severity), f"{where}: min-severity")
        if settings.get("baseline"):
            base = os.path.join(os.path.dirname(config), str(settings["baseline"]))
            result.baseline, result.baseline_path = load_baseline(base), base
    if select is not None:
        result.select = parse_select(select, known)
    for item in ignore or ():
        result.ignore.append(parse_ignore(item, known))
    if min_severity is not None:
        result.min_severity = parse_severity(min_severity)
    if baseline is not None:
        result.baseline, result.baseline_path = load_baseline(baseline), baseline
    return result


def _list(value, where: str, key: str) -> list:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return value
    raise BadInput(f"{where}: {key}: expected a list")
