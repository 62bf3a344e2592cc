"""Which findings a check reports: --select, --ignore, --min-severity, --baseline, and the
same settings from a .seedance.yaml in the project root.

    # .seedance.yaml (the current directory's; the git root of the first target's only
    # with --config-from-target)
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

A config that sits in the tree being checked is written by whoever wrote that tree: a
hostile one says `ignore: [needed-unresolved]` and its broken library checks clean.  So
only the current directory's file applies by itself (as flake8 and ruff read theirs); the
one found above a target applies with --config-from-target, and otherwise is named as
ignored.  Whatever applies, the report says which file (or the command line) dropped how
many findings.
"""
from __future__ import annotations

import fnmatch
import json
import os
import re
import stat
from ..model.record import NEW, Record

from ..model.errors import BadInput, UsageError, escape_path
from ..model.report import SEVERITIES, SEVERITY_RANK, fingerprint

CONFIG_NAME = ".seedance.yaml"
_FINGERPRINT = re.compile(r"^[0-9a-f]{16}$")
_KEYS = {"select", "ignore", "min-severity", "min_severity", "baseline"}
# A baseline is a report or SARIF log seedance wrote: a check of /usr/lib writes a few MiB.
# Past this it is refused before it is read, as json.loads of it would take ~10x in memory.
MAX_BASELINE_BYTES = 64 << 20
COMMAND_LINE = "the command line"


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


class ConfiguredFilter(FindingFilter):
    """The filter a check applies (what build() returns), knowing where each setting came
    from, so the report can say which file dropped how many findings.  ``from_config`` is
    the config file's part that the command line left standing; ``ignored_config`` a config
    found above a target and not applied (no --config-from-target)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.from_config: FindingFilter | None = None
        self.ignored_config: str | None = None
        self.baseline_from_config = False
        self.from_command_line = False  # --select, --ignore or --min-severity given

    @property
    def active(self) -> bool:
        # an ignored config is news even when nothing else filters: say so in the report
        return super().active or self.ignored_config is not None

    def apply(self, report) -> dict:
        findings = report.findings
        summary = super().apply(report)
        kept = {id(f) for f in report.findings}
        by_config = by_baseline = by_command_line = 0
        for finding in findings:
            if id(finding) in kept:
                continue
            # the file is named first: a finding its settings drop is the file's doing, even
            # where the command line would have dropped it too
            if self.from_config is not None and not self.from_config.keep(finding):
                by_config += 1
            elif self.baseline is not None and not self.baseline_from_config \
                    and finding.fingerprint in self.baseline:
                by_baseline += 1
            else:
                by_command_line += 1
        sources = []
        if self.from_config is not None:
            sources.append({"source": "config", "path": self.config_path, "filtered": by_config})
        if self.baseline is not None and not self.baseline_from_config:
            sources.append({"source": "baseline", "path": self.baseline_path, "filtered": by_baseline})
        if by_command_line or self.from_command_line:
            sources.append({"source": "command-line", "filtered": by_command_line})
        summary["by"] = sources
        if self.ignored_config is not None:
            summary["ignored_config"] = self.ignored_config
        return summary


def describe(summary: dict | None) -> str:
    """The lines under check's table that say who filtered what: a config that hides
    findings must never do it silently."""
    if not summary:
        return ""
    lines = []
    for source in summary.get("by", ()):
        count = source["filtered"]
        what = f"{count} finding{'s' if count != 1 else ''}"
        if source["source"] == "config":
            lines.append(f"filtered: {what} by {escape_path(source['path'])}")
        elif source["source"] == "baseline":
            lines.append(f"filtered: {what} by --baseline {escape_path(source['path'])}")
        else:
            lines.append(f"filtered: {what} by {COMMAND_LINE} (--select, --ignore, --min-severity)")
    if summary.get("ignored_config"):
        lines.append(f"not applied: {escape_path(summary['ignored_config'])}: it lies in the checked tree, "
                     f"not the current directory (--config-from-target applies it)")
    return "".join(line + "\n" for line in lines)


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
    """Fingerprints of a previous seedance.report/v1 (or of a SARIF log); BadInput, one
    line naming the first defect, when the file is neither or has the wrong shape."""
    shown = escape_path(path)
    try:
        with open(path, "rb") as handle:
            info = os.fstat(handle.fileno())
            if stat.S_ISREG(info.st_mode) and info.st_size > MAX_BASELINE_BYTES:
                raise BadInput(f"--baseline: {shown}: {info.st_size} bytes, more than the "
                               f"{MAX_BASELINE_BYTES >> 20} MiB a baseline may have")
            data = handle.read(MAX_BASELINE_BYTES + 1)  # a pipe or device: read no more than the cap
    except OSError as exc:
        from ..model.errors import describe_os_error

        raise BadInput(f"--baseline: {describe_os_error(exc)}") from None
    if len(data) > MAX_BASELINE_BYTES:
        raise BadInput(f"--baseline: {shown}: more than the {MAX_BASELINE_BYTES >> 20} MiB a baseline may have")
    try:
        document = json.loads(data.decode("utf-8", "surrogateescape"))
    except ValueError as exc:
        raise BadInput(f"--baseline: {shown}: not JSON ({exc})") from None
    except RecursionError:  # [[[[... deeper than the decoder recurses
        raise BadInput(f"--baseline: {shown}: not JSON (nested too deeply)") from None
    if isinstance(document, dict) and document.get("schema") == "seedance.report/v1":
        return frozenset(_report_fingerprints(document, shown))
    if isinstance(document, dict) and "runs" in document:
        return frozenset(_sarif_fingerprints(document, shown))
    raise BadInput(f"--baseline: {shown}: not a seedance report (schema seedance.report/v1) or SARIF log")


def _shape_error(shown: str, where: str, expected: str, value) -> BadInput:
    return BadInput(f"--baseline: {shown}: {where}: expected {expected}, got {_json_type(value)}")


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return f"the string {value[:40]!r}" + ("..." if len(value) > 40 else "")
    return "an array" if isinstance(value, list) else "an object"


def _report_fingerprints(document: dict, shown: str) -> set:
    """The findings' fingerprints, each checked against report.schema.json's finding (only
    what a baseline reads: fingerprint, or rule/subject/message of a report from before
    fingerprints)."""
    findings = document.get("findings")
    if not isinstance(findings, list):
        raise _shape_error(shown, "findings", "an array", findings)
    prints = set()
    for index, item in enumerate(findings):
        where = f"findings[{index}]"
        if not isinstance(item, dict):
            raise _shape_error(shown, where, "an object", item)
        value = item.get("fingerprint")
        if value is not None:
            if not isinstance(value, str) or not _FINGERPRINT.fullmatch(value):
                raise _shape_error(shown, f"{where}.fingerprint", "16 hex digits", value)
            prints.add(value)
            continue
        subject, rule, message = item.get("subject"), item.get("rule"), item.get("message", "")
        if not isinstance(subject, dict):
            raise _shape_error(shown, f"{where}.subject", "an object (or a fingerprint)", subject)
        for key, part in subject.items():
            if not isinstance(part, (str, int, float)) or isinstance(part, bool):
                raise _shape_error(shown, f"{where}.subject.{escape_path(key)[:40]}", "a string or number", part)
        if not isinstance(rule, str):
            raise _shape_error(shown, f"{where}.rule", "a string", rule)
        if not isinstance(message, str):
            raise _shape_error(shown, f"{where}.message", "a string", message)
        prints.add(fingerprint(rule, subject, message))  # a report from before fingerprints
    return prints


def _sarif_fingerprints(document: dict, shown: str) -> set:
    """partialFingerprints["seedance/v1"] of every result, along the shapes SARIF 2.1.0 gives
    them: runs an array of run objects, results an array of result objects (null: the tool
    did not run), partialFingerprints an object of strings."""
    from ..render.sarif import FINGERPRINT_KEY

    runs = document["runs"]
    if not isinstance(runs, list):
        raise _shape_error(shown, "runs", "an array", runs)
    prints = set()
    for run_index, run in enumerate(runs):
        where = f"runs[{run_index}]"
        if not isinstance(run, dict):
            raise _shape_error(shown, where, "an object", run)
        results = run.get("results")
        if results is None:
            continue
        if not isinstance(results, list):
            raise _shape_error(shown, f"{where}.results", "an array", results)
        for index, result in enumerate(results):
            at = f"{where}.results[{index}]"
            if not isinstance(result, dict):
                raise _shape_error(shown, at, "an object", result)
            partial = result.get("partialFingerprints")
            if partial is None:
                continue
            if not isinstance(partial, dict):
                raise _shape_error(shown, f"{at}.partialFingerprints", "an object", partial)
            for key, value in partial.items():
                if not isinstance(value, str):
                    raise _shape_error(shown, f"{at}.partialFingerprints.{escape_path(key)[:40]}", "a string", value)
            value = partial.get(FINGERPRINT_KEY)
            if value is not None:
                if not _FINGERPRINT.fullmatch(value):
                    raise _shape_error(shown, f"{at}.partialFingerprints.{FINGERPRINT_KEY}", "16 hex digits", value)
                prints.add(value)
    return prints


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
    """The settings of a .seedance.yaml, through the bounded loader (seedance.files.yamlio)."""
    import yaml

    from ..files import yamlio

    shown = escape_path(path)
    try:
        document = yamlio.load_file(path)
    except yaml.YAMLError as exc:
        raise BadInput(f"{shown}: not valid YAML: {str(exc).splitlines()[0]}") from None
    except OSError as exc:
        from ..model.errors import describe_os_error

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
          use_config: bool = True, cwd: str | None = None, config_from_target: bool = False) -> ConfiguredFilter:
    """The filter for one check: the project's .seedance.yaml, then the command line.  A
    config found above a target (not in the current directory) applies only with
    CONFIG_FROM_TARGET; otherwise the filter names it as ignored."""
    result = ConfiguredFilter()
    config = find_config(list(targets), cwd) if use_config else None
    if config and not config_from_target and config != os.path.join(cwd or os.getcwd(), CONFIG_NAME):
        result.ignored_config, config = config, None
    settings = read_config(config) if config else {}
    if config:
        own = result.from_config = FindingFilter(config_path=config)
        result.config_path = config
        where = escape_path(config)
        if settings.get("select") is not None:
            own.select = parse_select(_list(settings["select"], where, "select"), known, f"{where}: select")
        for item in _list(settings.get("ignore") or [], where, "ignore"):
            own.ignore.append(parse_ignore(str(item), known, f"{where}: ignore"))
        severity = settings.get("min-severity", settings.get("min_severity"))
        if severity is not None:
            own.min_severity = parse_severity(str(severity), f"{where}: min-severity")
        if settings.get("baseline"):
            base = os.path.join(os.path.dirname(config), str(settings["baseline"]))
            own.baseline, own.baseline_path = load_baseline(base), base
        result.select, result.min_severity = own.select, own.min_severity
        result.ignore.extend(own.ignore)
        result.baseline, result.baseline_path = own.baseline, own.baseline_path
        result.baseline_from_config = own.baseline is not None
    if select is not None:
        result.select = parse_select(select, known)
    for item in ignore or ():
        result.ignore.append(parse_ignore(item, known))
    if min_severity is not None:
        result.min_severity = parse_severity(min_severity)
    if baseline is not None:
        result.baseline, result.baseline_path = load_baseline(baseline), baseline
        result.baseline_from_config = False
    result.from_command_line = select is not None or bool(ignore) or min_severity is not None
    if result.from_config is not None:
        # what the command line replaced is no longer the file's doing
        own = result.from_config
        if select is not None:
            own.select = None
        if min_severity is not None:
            own.min_severity = None
        if baseline is not None:
            own.baseline = own.baseline_path = None
    return result


def _list(value, where: str, key: str) -> list:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return value
    raise BadInput(f"{where}: {key}: expected a list")
