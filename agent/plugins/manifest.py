"""Plugin manifests: load manifest.yaml, validate it against the JSON Schema, normalise it.

Why ruamel.yaml and not PyYAML here: an error must name the field AND the line, and only
ruamel's round-trip loader keeps the line of every key (``.lc``).  The same round-trip
document is what install edits when --affinity/--batch-policy are recorded, so the user's
comments and key order survive in the installed copy.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..model.errors import BadInput

MANIFEST_NAME = "manifest.yaml"
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "manifest.schema.json"
DEFAULT_BATCH = {"max_batch_size": 32, "max_wait_ms": 5.0}
# Operators that put a ceiling on a range; a range without one silently accepts any future
# (or, with a lowest-first resolver, the oldest) release: the version-fallback trap.
UPPER_BOUND_OPS = ("<", "<=", "==", "~=", "===")


@dataclass(frozen=True)
class BatchPolicy:
    policy: str  # "adaptive", "static" or "" (missing)
    max_batch_size: int
    max_wait_ms: float
    declared: bool  # False when the manifest has no batch_policy at all


@dataclass(frozen=True)
class Manifest:
    name: str
    version: str
    seedance_version: str
    libraries: tuple
    module: str | None
    device_affinity: str | None
    batch: BatchPolicy
    depends: dict
    cuda_runtime: int | None
    cuda_archs: tuple
    torch_range: str | None
    bench: str | None
    path: str  # the manifest file
    labels: dict = field(default_factory=dict)  # workload labels for quota policies
    lines: dict = field(default_factory=dict, compare=False)  # "a.b" -> line (1-based)
    raw: dict = field(default_factory=dict, compare=False)

    @property
    def root(self) -> Path:
        return Path(self.path).parent

    @property
    def ident(self) -> str:
        return f"{self.name} {self.version}"

    def line_of(self, dotted: str) -> int | None:
        return self.lines.get(dotted)


@lru_cache(maxsize=1)
def schema() -> dict:
    try:
        return json.loads(SCHEMA_PATH.read_text())
    except (OSError, ValueError) as exc:  # a broken install, not the user's input
        raise BadInput(f"{SCHEMA_PATH}: cannot load the manifest schema: {exc}") from None


def _yaml():
    from ruamel.yaml import YAML
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    return yaml


def load_document(text: str, where: str):
    """Round-trip load; a YAML syntax error becomes one line with the line number."""
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    from ..files import yamlio

    try:
        doc = yamlio.roundtrip_load(_yaml(), text, where)  # bounded: aliases and nesting capped
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f" line {mark.line + 1}" if mark else ""
        raise BadInput(f"{where}:{line}: not valid YAML: {exc.problem or exc.context}") from None
    except YAMLError as exc:
        raise BadInput(f"{where}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise BadInput(f"{where}: line 1: a manifest must be a mapping of fields (name, version, ...)")
    return doc


def dump_document(doc) -> str:
    buf = io.StringIO()
    _yaml().dump(doc, buf)
    return buf.getvalue()


def line_map(doc) -> dict:
    """'field.sub' -> 1-based line of that key, for every key of the round-trip document."""
    lines: dict = {}

    def walk(node, prefix):
        if isinstance(node, dict) and hasattr(node, "lc"):
            for key in node:
                dotted = f"{prefix}{key}"
                try:
                    lines[dotted] = node.lc.key(key)[0] + 1
                except (KeyError, TypeError, AttributeError):
                    pass
                walk(node[key], dotted + ".")
        elif isinstance(node, list) and hasattr(node, "lc"):
            for index, item in enumerate(node):
                dotted = f"{prefix}{index}"
                try:
                    lines[dotted] = node.lc.item(index)[0] + 1
                except (KeyError, TypeError, AttributeError):
                    pass
                walk(item, dotted + ".")

    walk(doc, "")
    return lines


def plain(node) -> Any:
    """Round-trip containers and scalars -> plain dict/list/str/int/float/bool."""
    if isinstance(node, dict):
        return {str(k): plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [plain(v) for v in node]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    return str(node)


def validate(doc, where: str) -> None:
    """Raise BadInput naming the first offending field and its line."""
    import jsonschema

    data = plain(doc)
    lines = line_map(doc)
    validator = _strict_validator(jsonschema)(schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: (_line_for(e, lines), list(e.absolute_path)))
    if errors:
        raise BadInput(_describe(errors[0], lines, where, len(errors)))


def _strict_validator(jsonschema):
    """Draft 2020-12 with `pattern` read as the schema's authors meant it.

    JSON Schema patterns are ECMA-262 regular expressions, where `$` matches only at the end
    of the string.  Python's `$` also matches before a final newline, so with the stock
    validator (re.search) a name such as "evil\\n" passed `^[a-z0-9...]+$` and reached the
    terminal.  Here a pattern ending in `$` must match the whole string."""
    import re

    def pattern(validator, patrn, instance, schema):
        if not validator.is_type(instance, "string"):
            return
        strict = patrn[:-1] + r"\Z" if patrn.endswith("$") and not patrn.endswith("\\$") else patrn
        if not re.search(strict, instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {patrn!r}")

    return jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": pattern})


def _line_for(error, lines: dict) -> int:
    path = [str(p) for p in error.absolute_path]
    while path:
        line = lines.get(".".join(path))
        if line:
            return line
        path.pop()
    return 1


def _describe(error, lines: dict, where: str, count: int) -> str:
    if error.validator == "oneOf" and isinstance(error.instance, dict) and error.context:
        # The mapping form was meant: report its problem (e.g. max_batch_size), not "oneOf".
        deeper = [e for e in error.context
                  if e.relative_schema_path and e.relative_schema_path[0] == _MAPPING_BRANCH]
        if deeper:
            return _describe(max(deeper, key=lambda e: len(e.absolute_path)), lines, where, count)
    path = [str(p) for p in error.absolute_path]
    line = _line_for(error, lines)
    more = f" (and {count - 1} more problem{'s' if count > 2 else ''})" if count > 1 else ""
    if error.validator == "required":
        missing = [name for name in error.validator_value if name not in (error.instance or {})]
        name = ".".join(path + [missing[0]]) if missing else ".".join(path)
        return f"{where}: line {line}: field '{name}' is required{more}"
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        name = ".".join(path + [extra[0]]) if extra else ".".join(path)
        line = lines.get(name, line)
        return f"{where}: line {line}: field '{name}' is not a manifest field{more}"
    field_name = ".".join(path) or "(top level)"
    return f"{where}: line {line}: field '{field_name}': {_reason(error)}{more}"


_MAPPING_BRANCH = 1  # batch_policy's oneOf: [string form, mapping form]


def _reason(error) -> str:
    value = error.instance
    shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    if error.validator == "pattern":
        hint = error.schema.get("description", "")
        return f"{shown} is not in the expected form{': ' + hint if hint else ''}"
    if error.validator == "enum":
        return f"{shown} is not one of {', '.join(map(str, error.validator_value))}"
    if error.validator == "type":
        want = error.validator_value
        want = " or ".join(want) if isinstance(want, list) else want
        return f"{shown} is not {'an' if str(want)[:1] in 'aeiou' else 'a'} {want}"
    if error.validator == "oneOf":
        return f"{shown} must be 'adaptive', 'static' or a mapping with policy, max_batch_size, max_wait_ms"
    if error.validator in ("minimum", "maximum"):
        return f"{shown} is out of range ({error.validator} {error.validator_value})"
    return error.message.splitlines()[0]


def parse_range(text: str):
    """Manifest range -> packaging SpecifierSet; a bare version '2.0' means '>=2.0'."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    text = str(text).strip()
    parts = [p.strip() for p in text.split(",") if p.strip()]
    parts = [p if p[0] in "<>=!~" else f">={p}" for p in parts]
    try:
        return SpecifierSet(",".join(parts))
    except InvalidSpecifier as exc:
        raise BadInput(f"not a version range: {text!r} ({exc})") from None


def has_upper_bound(text: str) -> bool:
    return any(spec.operator in UPPER_BOUND_OPS for spec in parse_range(text))


def load_manifest(path: str | Path, text: str | None = None) -> Manifest:
    """Load and validate a manifest file (or ``text`` read from an archive, named ``path``)."""
    path = Path(path)
    where = str(path)
    if text is None:
        try:
            from ..files import yamlio

            text = yamlio.read_text(path)  # size-capped; not UTF-8 is one BadInput line
        except FileNotFoundError:
            raise BadInput(f"{where}: no manifest.yaml (a plugin is a directory, .tar.gz or wheel "
                           f"with a manifest.yaml)") from None
        except UnicodeDecodeError:
            raise BadInput(f"{where}: not a text file") from None
    doc = load_document(text, where)
    validate(doc, where)
    return from_document(doc, where)


def _range_text(node) -> str:
    """A range written as a bare YAML number keeps its spelling: `seedance_version: 2.10`
    is 2.10, not the float 2.1 (ruamel records the width and the dot's position)."""
    width, dot = getattr(node, "_width", None), getattr(node, "_prec", None)
    if isinstance(node, float) and width and dot is not None and width - dot - 1 >= 0:
        return f"{float(node):.{width - dot - 1}f}"
    return str(node)


def from_document(doc, where: str) -> Manifest:
    data = plain(doc)
    lines = line_map(doc)
    # Ranges as the user spelled them (see _range_text), not as floats.
    data["seedance_version"] = _range_text(doc["seedance_version"])
    for name in data.get("depends", {}):
        data["depends"][name] = _range_text(doc["depends"][name])
    if "torch" in data.get("framework", {}):
        data["framework"]["torch"] = _range_text(doc["framework"]["torch"])
    for key in ["seedance_version", *[f"depends.{d}" for d in data.get("depends", {})],
                *(["framework.torch"] if "torch" in data.get("framework", {}) else [])]:
        value = data
        for part in key.split("."):
            value = value[part]
        try:
            parse_range(str(value))
        except BadInput as exc:
            raise BadInput(f"{where}: line {lines.get(key, 1)}: field '{key}': {exc}") from None
    batch = data.get("batch_policy")
    if batch is None:
        policy = BatchPolicy("", DEFAULT_BATCH["max_batch_size"], DEFAULT_BATCH["max_wait_ms"], False)
    elif isinstance(batch, str):
        policy = BatchPolicy(batch, DEFAULT_BATCH["max_batch_size"], DEFAULT_BATCH["max_wait_ms"], True)
    else:
        policy = BatchPolicy(batch["policy"], int(batch.get("max_batch_size", DEFAULT_BATCH["max_batch_size"])),
                             float(batch.get("max_wait_ms", DEFAULT_BATCH["max_wait_ms"])), True)
    entry = data["entry"]
    cuda = data.get("cuda", {})
    return Manifest(
        name=data["name"], version=data["version"], seedance_version=str(data["seedance_version"]),
        libraries=tuple(entry.get("libraries", ())), module=entry.get("module"),
        device_affinity=data.get("device_affinity"), batch=policy,
        depends={k: str(v) for k, v in data.get("depends", {}).items()},
        cuda_runtime=cuda.get("runtime"), cuda_archs=tuple(cuda.get("archs", ())),
        torch_range=(str(data["framework"]["torch"]) if "torch" in data.get("framework", {}) else None),
        bench=data.get("bench"), path=where, lines=lines, raw=data,
        labels={str(k): str(v) for k, v in (data.get("labels") or {}).items()},
    )


def apply_overrides(text: str, where: str, affinity: str | None = None,
                    batch_policy: str | None = None) -> str:
    """Record --affinity / --batch-policy in the manifest text, keeping comments and order."""
    doc = load_document(text, where)
    if affinity is not None:
        doc["device_affinity"] = affinity
    if batch_policy is not None:
        current = doc.get("batch_policy")
        if isinstance(current, dict):
            current["policy"] = batch_policy
        else:
            from ruamel.yaml.comments import CommentedMap
            new = CommentedMap()
            new["policy"] = batch_policy
            new["max_batch_size"] = DEFAULT_BATCH["max_batch_size"]
            new["max_wait_ms"] = DEFAULT_BATCH["max_wait_ms"]
            doc["batch_policy"] = new
    out = dump_document(doc)
    validate(load_document(out, where), f"{where} (with --affinity/--batch-policy)")
    return out
