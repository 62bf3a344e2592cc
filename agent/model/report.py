"""The one data model that check, trace, fix and the agent share.

collectors -> Fact -> rule engine -> Finding -> Report (-> fix plan -> fixer -> verify)

A Fact is something observed: a NEEDED entry and how it resolved, a mapped library of a
process, a fatbin entry, a config value.  It carries a ``kind`` (rules select facts by
kind), a ``subject`` (what it is about: path and/or pid, or plugin) and ``data``, the
attributes that rule conditions read.  Facts never judge; rules do.
"""
from __future__ import annotations

import re
import sys
from collections.abc import Mapping  # not typing's alias: importing typing is paid at every fix's start

from .record import NEW, FrozenRecord, Record, set_fields

SEVERITIES = ("info", "warning", "error", "fatal")
SEVERITY_RANK = {name: rank for rank, name in enumerate(SEVERITIES)}

# The three waste traps of the product notes (chapter 1).  A finding belongs in
# report.waste_traps[] when its rule's trap is one of these.
WASTE_TRAPS = ("affinity-unset", "version-fallback", "batch-static")


class Fact(FrozenRecord):
    """kind, subject, data and source (which collector produced it, for --verbose and
    debugging); frozen, as the @dataclass(frozen=True) it was (record.py)."""
    _fields = ("kind", "subject", "data", "source")

    def __init__(self, kind: str, subject: Mapping[str, Any], data: Mapping[str, Any], source: str = ""):
        set_fields(self, {"kind": kind, "subject": subject, "data": data, "source": source})

    def to_dict(self) -> dict:
        return {"kind": self.kind, "subject": dict(self.subject), "data": _plain(self.data),
                "source": self.source}


class Finding(FrozenRecord):
    """What a rule concluded from a fact (frozen, as the @dataclass(frozen=True) it was)."""
    _fields = ("rule", "severity", "trap", "layer", "subject", "message", "evidence", "fix", "title")

    def __init__(self, rule: str, severity: str, trap: str, layer: str, subject: Mapping[str, Any],
                 message: str, evidence: Mapping[str, Any] = NEW, fix: str = "", title: str = ""):
        set_fields(self, {"rule": rule, "severity": severity, "trap": trap, "layer": layer,
                                     "subject": subject, "message": message,
                                     "evidence": {} if evidence is NEW else evidence, "fix": fix,
                                     "title": title})

    @property
    def rank(self) -> int:
        return SEVERITY_RANK[self.severity]

    @property
    def is_waste_trap(self) -> bool:
        return self.trap in WASTE_TRAPS

    def key(self) -> tuple:
        """Identity used to de-duplicate the same finding raised from two facts."""
        return (self.rule, tuple(sorted((k, str(v)) for k, v in self.subject.items())), self.message)

    def to_dict(self) -> dict:
        return {
            "rule": self.rule,
            "severity": self.severity,
            "trap": self.trap,
            "layer": self.layer,
            "subject": _plain(self.subject),
            "message": self.message,
            "evidence": _plain(self.evidence),
            "fix": self.fix,
            "fingerprint": self.fingerprint,
        }

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.rule, self.subject, self.message)


class Report(Record):
    """What every command that judges emits; serialised as seedance.report/v1."""
    _fields = ("command", "host", "stats", "findings", "extra")

    SCHEMA = "seedance.report/v1"

    def __init__(self, command: str, host: dict = NEW, stats: dict = NEW, findings: list = NEW,
                 extra: dict = NEW):
        self.command = command
        self.host = {} if host is NEW else host
        self.stats = {} if stats is NEW else stats
        self.findings = [] if findings is NEW else findings
        self.extra = {} if extra is NEW else extra  # command-specific sections (run: devices, ...)

    def add(self, findings) -> None:
        seen = {f.key() for f in self.findings}
        for finding in findings:
            if finding.key() not in seen:
                seen.add(finding.key())
                self.findings.append(finding)

    def sorted_findings(self) -> list[Finding]:
        return sorted(self.findings, key=lambda f: (-f.rank, f.rule, str(f.subject.get("path", "")),
                                                    str(f.subject.get("pid", ""))))

    def worst(self) -> int:
        return max((f.rank for f in self.findings), default=-1)

    def exit_code(self, strict: bool = False) -> int:
        threshold = SEVERITY_RANK["warning" if strict else "error"]
        return 1 if self.worst() >= threshold else 0

    def to_dict(self) -> dict:
        findings = [f.to_dict() for f in self.sorted_findings()]
        out = {
            "schema": self.SCHEMA,
            "command": self.command,
            "host": _plain(self.host),
            "stats": _plain(self.stats),
            "findings": findings,
            "waste_traps": [f for f in findings if f["trap"] in WASTE_TRAPS],
        }
        out.update(_plain(self.extra))
        return out


# Numbers in a message that change from run to run without the cause changing: pids, sizes,
# counts, addresses.  A number that is part of a name or a version (libcudart.so.12, sm_90,
# 525.60.13, GLIBC_2.34) is kept: it *is* the cause.
_VOLATILE_NUMBER = re.compile(r"0x[0-9a-fA-F]+|(?<![\w.])\d+(?:\.\d+)?(?![\w.])")
_VOLATILE_SUBJECT = ("pid",)  # a process restarts with another pid; the same cause stays


# A load failure's message ends, where other objects of the checked tree load the failing
# object, with the objects that fail with it (fails_with_note, collect/closure.py): those are
# consequences, not the cause, and the fingerprint leaves them out, so the finding keeps its
# identity when the tree gains or loses an object that loads the failing one.
_FAILS_WITH = re.compile(r"; \d+ more objects? of this tree fails? with it \(.*\)\Z", re.S)


def fails_with_note(count: int, names: list) -> str:
    """'; 3 more objects of this tree fail with it (a, b, c, …)': the end of a load failure's
    message, ``names`` the first few of the ``count`` objects."""
    shown = ", ".join(names) + (", …" if count > len(names) else "")
    return f"; {count} more object{'s' if count != 1 else ''} of this tree fail{'' if count != 1 else 's'} " \
           f"with it ({shown})"


def fingerprint(rule: str, subject: Mapping[str, Any], message: str) -> str:
    """16 hex digits identifying a finding across runs (suppression, --baseline):
    rule + subject (without pid) + cause, the cause being the message with volatile
    numbers masked, so `pid 4242 holds 812 MiB` and `pid 77 holds 640 MiB` of the same
    library are one finding."""
    import hashlib
    import json

    stable = {str(k): str(v) for k, v in subject.items() if k not in _VOLATILE_SUBJECT}
    cause = _VOLATILE_NUMBER.sub("#", _FAILS_WITH.sub("", message))
    text = json.dumps([rule, stable, cause], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def _plain(value: Any) -> Any:
    """Turn records, dataclasses, tuples, sets and paths into JSON-ready values."""
    if isinstance(value, (FrozenRecord, Record)):  # facts, findings, resolver results (record.py)
        return _plain(value._asdict())
    # a dataclass instance means dataclasses is imported already: no import here for the rest
    dataclasses = sys.modules.get("dataclasses")
    if dataclasses is not None and dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_plain(v) for v in value]
        return sorted(items, key=str) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
