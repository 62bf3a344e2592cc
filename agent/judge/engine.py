"""The rule engine: rules are data (rules/*.yaml), conditions are CEL.

Why CEL, and why the `common-expression-language` binding: CEL is a small, side-effect
free, well-specified expression language (Kubernetes admission, Envoy, IAM conditions), so
rule authors do not learn a language we invented.  The Rust-backed binding evaluates a
compiled condition in ~5 us; the pure-Python cel-python took ~370 us on the same
expression, which would dominate a scan of /usr/lib (tens of thousands of facts).

Like Falco indexes rules by event type, each rule names the fact ``kind`` it applies to,
(its `fact:` field), so a fact is only offered to the rules that can match it.
"""
from __future__ import annotations

import os
import re
import string
import sys
from collections.abc import Iterable, Mapping
# Any is named in annotations only (strings here): importing typing (and the modules it
# pulls in) would be paid at every start of a short command such as `seedance fix`

from . import cel_subset
from ..collect import inputs
from ..model.errors import BadInput, RuleError
from ..model.report import SEVERITIES, Fact, Finding
from ..model.record import NEW, FrozenRecord, set_fields

# os.path, not pathlib: importing pathlib (with urllib.parse) is paid at every command's start
# the checkout's rules/, three levels above agent/judge/engine.py
RULES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))), "rules")
REQUIRED = ("id", "title", "severity", "trap", "layer", "fact", "condition", "message",
            "explain", "metric", "fix")
LAYERS = ("L1", "L2", "L3", "L4", "L5", "L6", "L7")


def default_rules_dir() -> str:
    """rules/ beside the package in a checkout; the installed copy otherwise."""
    if inputs.isdir(RULES_DIR):
        return RULES_DIR
    from importlib.resources import files
    return str(files("seedance") / "rules_data")


class Rule(FrozenRecord):
    """One rule of rules/*.yaml, compiled (frozen, as the @dataclass(frozen=True) it was;
    program, names, memo and escalate_program are left out of ==, hash() and repr())."""
    _fields = ("id", "title", "severity", "trap", "layer", "fact", "condition", "message", "explain",
               "metric", "fix", "evidence", "strict_only", "maturity", "source", "program", "names", "memo",
               "escalate", "escalate_program", "defaults")
    _compared = _shown = ("id", "title", "severity", "trap", "layer", "fact", "condition", "message",
                          "explain", "metric", "fix", "evidence", "strict_only", "maturity", "source",
                          "escalate", "defaults")

    def __init__(self, id: str, title: str, severity: str, trap: str, layer: str, fact: str, condition: str,
                 message: str, explain: str, metric: str, fix: str, evidence: tuple = (),
                 strict_only: bool = False, maturity: str = "stable", source: str = "", program=None,
                 names: tuple = (), memo: dict = NEW, escalate=None, escalate_program=None, defaults=None):
        set_fields(self, {
            "id": id, "title": title, "severity": severity, "trap": trap, "layer": layer, "fact": fact,
            "condition": condition, "message": message, "explain": explain, "metric": metric, "fix": fix,
            "evidence": evidence, "strict_only": strict_only, "maturity": maturity, "source": source,
            "program": program,
            # The identifiers the condition reads.  Only those are handed to CEL: converting a
            # fact's whole data (search paths, tried lists) to CEL values costs far more per
            # evaluation than the few scalars a condition actually reads
            # (bench/bench_check_speed.py times a whole check).
            "names": names,
            # CEL is side-effect free, so a verdict over the same scalar inputs is reused: a
            # scan of /usr/lib offers thousands of facts whose relevant values repeat.
            "memo": {} if memo is NEW else memo,
            # escalate: {condition: CEL, severity: S} raises the finding's severity where the
            # condition holds too, so one stable rule id covers "warning, and error when worse"
            # (gpu-memory-fragmented: warning at "warning", error at "danger").
            "escalate": escalate, "escalate_program": escalate_program,
            # defaults: values for data keys a fact may lack, so facts from another collector
            # still match (trace's observed `needed` facts carry no `same_library`) instead of
            # reading as a missing attribute, which is no match
            "defaults": defaults})

    def matches(self, fact: Fact) -> bool:
        return self._verdict(fact, *_context_and_key(fact, self.names, self.defaults))

    def _verdict(self, fact: Fact, context: dict, key) -> bool:
        """The condition over ``context`` (what _context_and_key built for this rule's
        names and defaults), remembered under ``key`` when that is not None."""
        if key is not None:
            known = self.memo.get(key)
            if known is not None:
                return known
        try:
            result = self.program.execute({k: _cel_value(v) for k, v in context.items()})
        except Exception as exc:  # a condition over a missing attribute is no match
            text = str(exc)
            if "Undefined variable" in text or "No such key" in text:
                result = False
            else:
                raise RuleError(f"rule {self.id}: condition failed on a {fact.kind} fact: {exc}") from None
        verdict = result is True
        if key is not None and len(self.memo) < 65536:
            self.memo[key] = verdict
        return verdict

    def finding(self, fact: Fact) -> Finding:
        # a key the fact lacks reads as the rule's default in the message too (the end of a
        # message that only some facts have: also_fails_note)
        values = _FormatValues({**self.defaults, **fact.data, **fact.subject} if self.defaults
                               else {**fact.data, **fact.subject})
        evidence = {name: fact.data[name] for name in self.evidence if name in fact.data}
        severity = self.severity
        if self.escalate_program is not None:
            context = _cel_context(fact, _condition_names(str(self.escalate["condition"])))
            try:
                if self.escalate_program.execute({k: _cel_value(v) for k, v in context.items()}) is True:
                    severity = self.escalate["severity"]
            except Exception:  # a missing attribute: no escalation, as for conditions
                pass
        return Finding(
            rule=self.id, severity=severity, trap=self.trap, layer=self.layer,
            subject=dict(fact.subject),
            message=_FORMATTER.vformat(self.message, (), values),
            evidence=evidence,
            fix=_FORMATTER.vformat(self.fix, (), values),
            title=self.title,
        )


class RuleSet:
    def __init__(self, rules: Iterable[Rule]):
        self.rules = list(rules)
        self.by_id = {r.id: r for r in self.rules}
        self.by_kind: dict[str, list[Rule]] = {}
        for rule in self.rules:
            self.by_kind.setdefault(rule.fact, []).append(rule)
        self._plans: dict = {}  # (kind, ids of the rules that apply) -> _KindPlan

    def __len__(self) -> int:
        return len(self.rules)

    def __getitem__(self, rule_id: str) -> Rule:
        return self.by_id[rule_id]

    def evaluate(self, facts: Iterable[Fact], strict: bool = False,
                 only: Iterable[str] | None = None) -> list[Finding]:
        wanted = set(only) if only is not None else None
        plans: dict = {}
        for kind, rules in self.by_kind.items():
            chosen = tuple(rule for rule in rules if (strict or not rule.strict_only)
                           and (wanted is None or rule.id in wanted))
            if chosen:
                key = (kind, tuple(rule.id for rule in chosen))
                plan = self._plans.get(key)
                if plan is None:
                    plan = self._plans[key] = _KindPlan(chosen)
                plans[kind] = plan
        findings = []
        for fact in facts:
            plan = plans.get(fact.kind)
            if plan is not None:
                for rule in plan.matching(fact):
                    findings.append(rule.finding(fact))
        return findings


_ABSENT = object()  # a name the fact's data lacks, in a _KindPlan key
_ALL_PRESENT = object()  # the tag of a _KindPlan key made from every name's value at once


def _values_of(names: tuple):
    """data -> the tuple of data[name] for ``names`` (KeyError when one is missing)."""
    from operator import itemgetter

    getter = itemgetter(*names)
    if len(names) == 1:
        return lambda data: (getter(data),)
    return getter


class _KindPlan:
    """The rules that apply to one fact kind, and which of them match, per input.

    Every rule's context is a function of the fact's values for the names the rules read
    (with each rule's defaults for the missing ones), so when those values are scalars the
    matching rules are remembered under them, for all the rules at once: a scan of a
    library tree offers thousands of facts whose inputs repeat (the same NEEDED name, the
    same version node), each to every rule of its kind.  On a
    miss each rule decides as Rule.matches does, and rules reading the same names and
    defaults (five of the six `needed` rules) share one context.  ``subject`` (a mapping)
    and other non-scalar values are never part of a key: those facts are judged each time."""

    __slots__ = ("rules", "names", "memo", "inputs", "values")

    def __init__(self, rules: tuple):
        self.rules = rules
        names = sorted(set().union(*(rule.names for rule in rules)))
        self.names = None if "subject" in names else tuple(names)
        # the values of every name at once, in C, for the usual fact that has them all
        self.values = _values_of(self.names) if self.names else None
        self.memo: dict = {}
        self.inputs = tuple((rule.names, tuple((rule.defaults or {}).items())) for rule in rules)

    def matching(self, fact: Fact) -> tuple:
        key = None
        if self.values is not None:
            # a fact with every name, all scalars: the key is the values with their types
            # (True is not 1), made without a loop in Python (this runs for every fact);
            # tagged, so it never equals a key of the loop below, which holds _ABSENT
            try:
                values = self.values(fact.data)
            except KeyError:
                values = None
            if values is not None:
                types = tuple(map(type, values))
                if _SCALAR_TYPES.issuperset(types):
                    key = (_ALL_PRESENT, values, types)
                    known = self.memo.get(key)
                    if known is not None:
                        return known
                    return self._judge(fact, key)
        if self.names is not None:
            data = fact.data
            key = []
            for name in self.names:
                if name in data:
                    value = data[name]
                    kind = value.__class__  # with the type: True is not 1
                    if kind not in _SCALAR_TYPES:
                        key = None
                        break
                    key.append(kind)
                    key.append(value)
                else:
                    key.append(_ABSENT)
                    key.append(None)
            if key is not None:
                key = tuple(key)
                known = self.memo.get(key)
                if known is not None:
                    return known
        return self._judge(fact, key)

    def _judge(self, fact: Fact, key) -> tuple:
        """The rules that match ``fact``, remembered under ``key`` (None: not remembered)."""
        built: dict = {}
        matched = []
        for rule, inputs in zip(self.rules, self.inputs):
            context_key = built.get(inputs)
            if context_key is None:
                context_key = built[inputs] = _context_and_key(fact, rule.names, rule.defaults)
            if rule._verdict(fact, *context_key):
                matched.append(rule)
        matched = tuple(matched)
        if key is not None and len(self.memo) < 65536:
            self.memo[key] = matched
        return matched


# (directory, the files' identities) -> RuleSet.  Parsing and validating the YAML is most
# of a load (compiling the CEL conditions is a small part), and `fix` checks twice, before
# and after.  A rule file rewritten in place or replaced has another
# mtime, ctime, size or inode, so it is read again.
_LOADED: dict = {}


def _identity(path: str) -> tuple:
    st = inputs.stat(path)
    return (os.path.basename(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _rule_files(directory: str) -> list:
    """directory/*.yaml, sorted (what Path.glob matched: any such name; none where the
    directory is missing or unreadable)."""
    try:
        with os.scandir(directory) as listing:
            names = [entry.name for entry in listing if entry.name.endswith(".yaml")]
    except OSError:
        return []
    return [os.path.join(directory, name) for name in sorted(names)]


def load_rules(directory=None) -> RuleSet:
    """Load and validate every rules/*.yaml; any problem is one RuleError line.

    ``directory``: a path (str or os.PathLike); the shipped rules by default."""
    if directory:
        directory = os.fspath(directory)
        if len(directory) > 1:
            directory = directory.rstrip("/") or "/"
    else:
        directory = default_rules_dir()
    files = _rule_files(directory)
    if not files:
        raise RuleError(f"{directory}: no rule files (*.yaml)")
    try:
        key = (inputs.realpath(directory), tuple(_identity(path) for path in files))
    except OSError:
        key = None  # vanished while listed: read now, and let the reader report it
    if key is not None and key in _LOADED:
        return _LOADED[key]
    shipped = key is not None and key[0] == inputs.realpath(default_rules_dir())
    ruleset = _load_shipped(key[0], files) if shipped else None
    if ruleset is None:
        ruleset = _load_rule_files(files)
    if key is not None:
        _LOADED.clear()  # one rules directory is in use at a time: keep only the newest
        _LOADED[key] = ruleset
    return ruleset


def _parse_rule_files(files: list) -> list:
    """[(file name, path, parsed document)]: the YAML read within yamlio's caps."""
    import yaml

    from ..files import yamlio

    docs = []
    for path in files:
        try:
            doc = yamlio.load_file(path)  # bounded: size, depth, alias expansion (YAML is a graph)
        except RuleError:
            raise
        except BadInput as exc:
            raise RuleError(str(exc)) from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            raise RuleError(f"{path}:{where} not valid YAML: {getattr(exc, 'problem', exc)}") from None
        except OSError as exc:
            raise RuleError(f"{path}: {exc.strerror}") from None
        docs.append((os.path.basename(path), path, doc))
    return docs


def _load_rule_files(files: list) -> RuleSet:
    return _rules_from_docs(_parse_rule_files(files))


def _rules_from_docs(docs: list, compiled: bool = False) -> RuleSet:
    """Validate the parsed documents into a RuleSet.  ``compiled``: every condition is known
    to compile (a cache written after a full load says so), so each compiles on first use."""
    rules: list[Rule] = []
    for name, path, doc in docs:
        if not isinstance(doc, Mapping) or not isinstance(doc.get("rules"), list):
            raise RuleError(f"{path}: expected a mapping with a 'rules:' list")
        for index, entry in enumerate(doc["rules"]):
            rules.append(_build_rule(entry, f"{name}#{index}", lazy=compiled))
    seen: set[str] = set()
    for rule in rules:
        if rule.id in seen:
            raise RuleError(f"{rule.source}: duplicate rule id {rule.id!r}")
        seen.add(rule.id)
    return RuleSet(rules)


# --- the shipped rules, parsed, kept across runs ----------------------------------------------
# Importing PyYAML and parsing rules/*.yaml would be paid by every command that checks,
# often more than the check of a small library itself (bench/bench_relink.py times a whole
# `fix cuda-mismatch`).  The cache holds the parsed documents only: every rule is
# validated from them on each load, as
# from the YAML, and a condition that compiled when the cache was written compiles on first
# use (most commands offer facts of a few kinds only).  It is keyed by each file's name,
# size and CRC-32 of its bytes (a file rewritten within one timestamp tick is still seen),
# by the parsing code (engine.py, yamlio.py) and by the CEL binding's file.  Only the
# shipped rules directory is cached (a test's or a user's --rules-dir is read each time),
# and only a file of this user's that nobody else can write is believed: it decides findings.
_CACHE_FORMAT = 1
_CACHE_MAX = 4 << 20


def _cache_path(directory: str) -> str | None:
    import zlib

    from ..files.private import cache_home

    base = cache_home()
    if base is None:
        return None

    # one file per rules directory and per copy of this code: two installations sharing a
    # rules directory (a checkout and a copy of it, a bench's baseline) would otherwise
    # replace each other's cache on every run
    who = os.fsencode(directory) + b"\0" + os.fsencode(inputs.realpath(__file__))
    return os.path.join(base, f"rules-{zlib.crc32(who):08x}.json")


def _file_stamp(path: str) -> list:
    st = inputs.stat(path)
    return [path, st.st_size, st.st_mtime_ns]


def _cache_stamp(files: list) -> list | None:
    """What the cached documents were parsed from and with; None when a file cannot be read."""
    import zlib

    stamp = []
    try:
        for path in files:
            with open(path, "rb") as handle:
                data = handle.read(_CACHE_MAX + 1)
            stamp.append([os.path.basename(path), len(data), zlib.crc32(data)])
        from ..files import yamlio
        stamp.append(_file_stamp(inputs.realpath(__file__)))
        stamp.append(_file_stamp(inputs.realpath(yamlio.__file__)))
    except OSError:
        return None
    return stamp


def _load_shipped(directory: str, files: list) -> RuleSet | None:
    """The shipped rules from the cache, or parsed and cached; None: read them as any other."""
    cache = _cache_path(directory)
    stamp = _cache_stamp(files) if cache else None
    if stamp is None:
        return None
    cached = _read_cache(cache, directory, stamp)
    if cached is not None:
        paths = {os.path.basename(path): path for path in files}
        docs = [(name, paths[name], doc) for name, doc in cached]
        return _rules_from_docs(docs, compiled=True)
    docs = _parse_rule_files(files)
    ruleset = _rules_from_docs(docs)  # raises before anything is cached
    _write_cache(cache, directory, stamp, [[name, doc] for name, _path, doc in docs])
    return ruleset


def _read_cache(cache: str, directory: str, stamp: list):
    import json

    from ..files.private import read_private

    raw = read_private(cache, _CACHE_MAX)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("format") != _CACHE_FORMAT or \
            data.get("directory") != directory or data.get("stamp") != stamp:
        return None
    cel_file = data.get("cel")
    try:
        if not isinstance(cel_file, list) or not cel_file or _file_stamp(cel_file[0]) != cel_file:
            return None
    except (OSError, TypeError, ValueError):
        return None
    docs = data.get("docs")
    if not isinstance(docs, list) or [d[0] if isinstance(d, list) and len(d) == 2 else None for d in docs] \
            != [s[0] for s in stamp[:-2]]:
        return None
    return docs


def _write_cache(cache: str, directory: str, stamp: list, docs: list) -> None:
    """Best effort: a cache that cannot be written is read from YAML next time."""
    import json

    from ..files.private import write_private

    core = _cel_core()
    try:
        cel_file = _file_stamp(core.__file__)
        text = json.dumps({"format": _CACHE_FORMAT, "directory": directory, "stamp": stamp, "cel": cel_file,
                           "docs": docs}, separators=(",", ":"))
        if json.loads(text)["docs"] != docs:
            return  # not plain JSON data (a YAML date, a tuple): read from YAML each time
        write_private(cache, text.encode())
    except (OSError, TypeError, ValueError, AttributeError):
        pass


class _LazyProgram:
    """A rule's CEL condition: answered by cel_subset where it can be (no CEL binding loaded
    for it), else by the CEL program, compiled on first use when the rules cache says it
    compiles (``program`` given: compiled already)."""

    __slots__ = ("text", "where", "_program", "_native")

    def __init__(self, text: str, where: str, program=None):
        self.text, self.where, self._program, self._native = text, where, program, _UNPARSED

    def execute(self, context: dict):
        native = self._native
        if native is _UNPARSED:
            native = self._native = cel_subset.compile(self.text)
        if native is not None:
            try:
                return cel_subset.evaluate(native, context)
            except cel_subset.Defer:
                pass
        program = self._program
        if program is None:
            try:
                program = self._program = _cel_core().compile(self.text)
            except Exception as exc:  # the CEL binding changed under the cache
                raise RuleError(f"{self.where}: condition does not compile: "
                                f"{str(exc).splitlines()[0] if str(exc) else exc}") from None
        try:
            return program.execute(context)
        except ValueError as exc:
            if "Conversion Error" not in str(exc):
                raise
        # a string that is not UTF-8 (a NEEDED or path with other bytes, os.fsdecode'd): the
        # binding cannot take it, and a check stopped with "condition failed"; its bytes
        # are shown \xNN instead, so equal names stay equal and different ones different
        return program.execute({k: _utf8_safe(v) for k, v in context.items()})


_UNPARSED = object()


def _utf8_safe(value):
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if isinstance(value, list):
        return [_utf8_safe(v) for v in value]
    if isinstance(value, dict):
        return {_utf8_safe(k): _utf8_safe(v) for k, v in value.items()}
    return value


_CEL_CORE = None  # the compiled CEL core, once loaded


def _cel_core():
    """The compiled CEL core (the package's Rust extension cel/cel*.so), loaded on first use.

    Loaded from its file, not through ``import cel``: the package's __init__ also imports its
    interactive REPL (prompt_toolkit, rich), which every command that needs a condition the
    subset leaves to CEL would import for nothing.  The extension itself is one shared
    object for ld.so to map and has the same compile()/execute() API.  It is kept here, not registered as
    cel.cel: seedance is its only user in the process.  The extension can be started only once
    per process (its logging bridge refuses a second start), so a process that imported the
    package first is served the package's copy.
    """
    global _CEL_CORE
    if _CEL_CORE is not None:
        return _CEL_CORE
    package = sys.modules.get("cel")
    core = getattr(package, "cel", None) if package is not None else None
    if core is None:
        core = _load_cel_core(_cel_core_path())
    _CEL_CORE = core
    return core


def _load_cel_core(path: str | None):
    import importlib.machinery
    import importlib.util

    if path is not None:
        try:
            loader = importlib.machinery.ExtensionFileLoader("cel.cel", path)
            core = importlib.util.module_from_spec(importlib.util.spec_from_loader("cel.cel", loader))
            loader.exec_module(core)
            return core
        except (ImportError, OSError):
            pass
    import cel  # another layout of the package: take the documented import

    return cel


def _cel_core_path() -> str | None:
    """The file of the compiled CEL core, found without loading it (or the package), or None."""
    import importlib.machinery
    import importlib.util

    try:
        spec = importlib.util.find_spec("cel")
    except (ImportError, ValueError):
        return None
    for directory in (spec.submodule_search_locations or []) if spec else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(directory, "cel" + suffix)
            if inputs.exists(path):
                return path
    return None


def _build_rule(entry: Any, where: str, lazy: bool = False) -> Rule:
    """One validated Rule.  ``lazy``: the conditions are known to compile; compile on first use."""
    cel = None if lazy else _cel_core()
    if not isinstance(entry, Mapping):
        raise RuleError(f"{where}: a rule must be a mapping")
    missing = [k for k in REQUIRED if k not in entry]
    if missing:
        raise RuleError(f"{where} ({entry.get('id', '?')}): missing field(s) {', '.join(missing)}")
    if entry["severity"] not in SEVERITIES:
        raise RuleError(f"{where} ({entry['id']}): severity must be one of {', '.join(SEVERITIES)}")
    if entry["layer"] not in LAYERS:
        raise RuleError(f"{where} ({entry['id']}): layer must be one of L1..L7")
    for key in ("message", "fix"):
        try:
            list(_FORMATTER.parse(str(entry[key])))
        except ValueError as exc:
            raise RuleError(f"{where} ({entry['id']}): bad {key} template: {exc}") from None
    try:
        text = str(entry["condition"])
        program = _LazyProgram(text, f"{where} ({entry['id']})", None if lazy else cel.compile(text))
    except Exception as exc:
        raise RuleError(f"{where} ({entry['id']}): condition does not compile: "
                        f"{str(exc).splitlines()[0] if str(exc) else exc}") from None
    escalate_program = None
    if "escalate" in entry:
        escalate = entry["escalate"]
        if (not isinstance(escalate, Mapping) or set(escalate) != {"condition", "severity"}
                or escalate["severity"] not in SEVERITIES):
            raise RuleError(f"{where} ({entry['id']}): escalate must be {{condition: CEL, severity: "
                            f"{'|'.join(SEVERITIES)}}}")
        try:
            text = str(escalate["condition"])
            escalate_program = _LazyProgram(text, f"{where} ({entry['id']}) escalate",
                                            None if lazy else cel.compile(text))
        except Exception as exc:
            raise RuleError(f"{where} ({entry['id']}): escalate condition does not compile: "
                            f"{str(exc).splitlines()[0] if str(exc) else exc}") from None
    defaults = entry.get("defaults", {})
    if not isinstance(defaults, Mapping) or not all(
            isinstance(k, str) and isinstance(v, (str, int, float, bool)) for k, v in defaults.items()):
        raise RuleError(f"{where} ({entry['id']}): defaults must map data keys to plain values")
    known = set(Rule._fields) - {"program", "source", "escalate_program"}
    unknown = set(entry) - known
    if unknown:
        raise RuleError(f"{where} ({entry['id']}): unknown field(s) {', '.join(sorted(unknown))}")
    values = {k: entry[k] for k in known if k in entry}
    values["evidence"] = tuple(values.get("evidence", ()))
    return Rule(**values, source=where, program=program, names=_condition_names(str(entry["condition"])),
                escalate_program=escalate_program)


# Identifiers not preceded by '.' (so not a method such as .size()); quoted text removed first.
_IDENTIFIER = re.compile(r"(?<![.\w])([A-Za-z_]\w*)")
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_SCALARS = (str, int, float, bool, type(None))


def _condition_names(condition: str) -> tuple:
    return tuple(sorted(set(_IDENTIFIER.findall(_QUOTED.sub(" ", condition)))))


def _cel_context(fact: Fact, names: tuple | None = None) -> dict:
    """The variables a condition sees: fact.data, plus ``subject``; only ``names`` if given."""
    if names is None:
        context = dict(fact.data)
        context.setdefault("subject", dict(fact.subject))
        return context
    context = {}
    for name in names:
        if name in fact.data:
            context[name] = fact.data[name]
        elif name == "subject":
            context[name] = dict(fact.subject)
    return context


_SCALAR_TYPES = frozenset(_SCALARS)


def _context_and_key(fact: Fact, names: tuple, defaults) -> tuple:
    """(context, memo key) for a condition reading ``names``: _cel_context with the rule's
    defaults filled in, and the verdict's key, in one pass over the names (this runs for
    every fact of a scan).

    The context holds each name found in fact.data, else ``subject`` (fact.subject), else
    the rule's default for it; names found nowhere are left out (CEL: no such variable).
    The key is None when a value is not a scalar (the verdict is not remembered)."""
    data = fact.data
    context = {}
    key = []
    for name in names:
        if name in data:
            value = data[name]
        elif name == "subject":
            value = dict(fact.subject)
        elif defaults and name in defaults:
            value = defaults[name]
        else:
            continue
        context[name] = value
        if key is not None:
            kind = value.__class__  # with the type: True is not 1
            if kind in _SCALAR_TYPES:
                key.append((name, kind, value))
            else:
                key = None
    return context, (tuple(key) if key is not None else None)


_PLAIN_CLASSES = frozenset((bool, int, float, str, type(None)))


def _cel_value(value: Any) -> Any:
    if value.__class__ in _PLAIN_CLASSES:
        return value  # (the usual case, answered before the slower ABC check below)
    if isinstance(value, (tuple, set, frozenset)):
        return [_cel_value(v) for v in value]
    if isinstance(value, list):
        return [_cel_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _cel_value(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


class _FormatValues(dict):
    def __missing__(self, key):
        return "?"


class _SafeFormatter(string.Formatter):
    """str.format over fact values, where a missing field reads '?' instead of raising."""

    def get_field(self, field_name, args, kwargs):
        try:
            return super().get_field(field_name, args, kwargs)
        except (KeyError, AttributeError, IndexError, TypeError):
            return "?", field_name

    def format_field(self, value, format_spec):
        if isinstance(value, (list, tuple)):
            value = ", ".join(str(v) for v in value)
        return super().format_field(value, format_spec)


_FORMATTER = _SafeFormatter()
