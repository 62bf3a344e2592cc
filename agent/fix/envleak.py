"""env-leak: make ${VAR} in seedance/plugin configs lazy, and move preloads to environment.d.

The rewrite works on the findings the check raised (rule env-leak): each names the config,
the key, the value and its line.  ruamel.yaml's round-trip mode locates
each value (with its line) and applies the edit to its model of the document; the bytes
written are the original text with only those values replaced, and they must parse back
to exactly that model.  ruamel's own dump normalises indentation and comment spacing, so
it is the reference, not the writer: comments, key order and layout stay byte for byte.

--inject LD_PRELOAD: systemd's user manager reads ~/.config/environment.d/*.conf once the
user session is up (environment.d(5)), expanding ${HOME} then.  That is exactly "after the
session is set up, not during early shell start", so the preload moves there.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ..model.errors import BadInput
from ..run.preload import unsafe_reason

DROP_IN_NAME = "60-seedance.conf"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def lazy_form(value: str) -> str:
    """${VAR} and $VAR -> $${VAR}; an existing $$ escape is kept as is."""
    out, index = [], 0
    while index < len(value):
        char = value[index]
        if char != "$":
            out.append(char)
            index += 1
            continue
        nxt = value[index + 1] if index + 1 < len(value) else ""
        if nxt == "$":
            out.append("$$")
            index += 2
            continue
        if nxt == "{":
            end = value.find("}", index + 2)
            if end > index + 2 and _NAME.fullmatch(value[index + 2:end]):
                out.append("$${" + value[index + 2:end] + "}")
                index = end + 1
                continue
        else:
            match = _NAME.match(value, index + 1)
            if match:
                out.append("$${" + match.group() + "}")
                index = match.end()
                continue
        out.append(char)
        index += 1
    return "".join(out)


def scope_paths(scope: str, environ=None) -> list:
    """The config files a scope covers: user (~/.config/seedance), system (/etc/seedance) or PATH."""
    from ..collect.config import CONFIG_SUFFIXES, config_files

    environ = os.environ if environ is None else environ
    if scope == "user":
        base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
        directory = os.path.join(base, "seedance")
    elif scope == "system":
        directory = "/etc/seedance"
    else:
        if os.path.isfile(scope):
            if not scope.endswith(CONFIG_SUFFIXES):
                raise BadInput(f"{scope}: not a YAML config (.yaml/.yml)")
            return [scope]
        if not os.path.isdir(scope):
            raise BadInput(f"{scope}: no such file or directory")
        directory = scope
    return config_files(directory) if os.path.isdir(directory) else []


def drop_in_path(environ=None) -> str:
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "environment.d", DROP_IN_NAME)


def unsafe_preload(path: str) -> str | None:
    """Why a preload path must be refused: missing, or it or a parent dir writable by others."""
    if not os.path.exists(path):
        return f"preload {path} does not exist"
    why = unsafe_reason(path)
    return f"preload {path}: {why} (another user could replace it)" if why else None


def expand_for_check(value: str, environ) -> str:
    """What the session will expand a lazy or early value to, to vet the preload path now."""
    text = value.replace("$${", "${").replace("$$", "$")
    return os.path.expandvars(text) if environ is os.environ else _expand(text, environ)


def _expand(text: str, environ) -> str:
    def sub(match):
        name = match.group(1) or match.group(2)
        return environ.get(name, match.group(0))
    return re.sub(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)", sub, text)


@dataclass
class ConfigEdit:
    path: str
    original: bytes
    new: bytes
    changes: list = field(default_factory=list)  # (line, key, old, new or None when moved)
    preloads: list = field(default_factory=list)  # values moved to environment.d


def _yaml():
    from ruamel.yaml import YAML

    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 1 << 16  # never fold a long line the user wrote on one line
    return yaml


def parse_or_refuse(path: str, text: str):
    from ruamel.yaml.error import YAMLError

    from ..files import yamlio

    try:
        return yamlio.roundtrip_load(_yaml(), text, path)  # bounded: size, depth, aliases
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise BadInput(f"{path}:{where} not valid YAML: {problem}") from None


def plan_config_edit(path: str, findings: list, inject: str | None) -> ConfigEdit | None:
    """The rewritten bytes of one config for its env-leak findings (None: nothing to change)."""
    from ..files import yamlio

    with open(path, "rb") as handle:
        original = handle.read(yamlio.MAX_BYTES + 1)  # more is refused by parse_or_refuse
    try:
        text = original.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path}: not UTF-8 text (byte {exc.start}), not rewritten") from None
    data = parse_or_refuse(path, text)
    targets = {}  # (key, value) -> finding
    for finding in findings:
        ev = finding.evidence
        if ev.get("key") is not None and ev.get("value") is not None:
            targets[(str(ev["key"]), str(ev["value"]))] = finding
    edit = ConfigEdit(path=path, original=original, new=original)
    moved_keys = []

    def visit(node, depth=0):
        if depth > 64:
            return
        if hasattr(node, "items") and hasattr(node, "lc"):
            for key in list(node.keys()):
                value = node[key]
                if isinstance(value, str) and (str(key), str(value)) in targets:
                    line = _line_of(node, key)
                    if inject and str(key).upper() == inject.upper():
                        edit.preloads.append(str(value))
                        moved_keys.append((node, key, line))
                        edit.changes.append((line, str(key), str(value), None))
                        continue
                    new = lazy_form(str(value))
                    if new != value:
                        node[key] = type(value)(new) if type(value) is not str else new
                        edit.changes.append((line, str(key), str(value), new))
                else:
                    visit(value, depth + 1)
        elif isinstance(node, list):
            for index, item in enumerate(node):
                if isinstance(item, str) and "=" in item:
                    key, _, value = item.partition("=")
                    if (key.strip(), value) in targets:
                        line = node.lc.item(index)[0] + 1 if hasattr(node, "lc") else None
                        if inject and key.strip().upper() == inject.upper():
                            edit.preloads.append(value)
                            moved_keys.append((node, index, line))
                            edit.changes.append((line, key.strip(), value, None))
                            continue
                        new = lazy_form(value)
                        if new != value:
                            node[index] = type(item)(f"{key}={new}") if type(item) is not str else f"{key}={new}"
                            edit.changes.append((line, key.strip(), value, new))
                        continue
                visit(item, depth + 1)

    visit(data)
    if not edit.changes:
        return None
    # delete moved entries last, highest index first, so list positions stay valid
    for container, key, _line in sorted(moved_keys, key=lambda m: (id(m[0]), -(m[1] if isinstance(m[1], int) else 0))):
        del container[key]
    # The bytes come from a targeted edit of the finding's lines, so indentation, quoting
    # and comment spacing stay exactly as written; ruamel's round-trip model of the edit is
    # the reference the result must parse back to.
    edit.new = _targeted_edit(path, text, edit.changes).encode("utf-8")
    if _plain(parse_or_refuse(path, edit.new.decode("utf-8"))) != _plain(data):
        raise BadInput(f"{path}: cannot rewrite it without changing other values; not rewritten")
    return edit


def _plain(node):
    """ruamel's round-trip containers as plain values; an emptied mapping reads back as null."""
    if hasattr(node, "items"):
        out = {str(k): _plain(v) for k, v in node.items()}
        return out or None
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node if node is None or isinstance(node, (bool, int, float)) else str(node)


def _line_of(mapping, key) -> int | None:
    try:
        return mapping.lc.key(key)[0] + 1
    except (AttributeError, KeyError, TypeError):
        return None


def _targeted_edit(path: str, text: str, changes: list) -> str:
    lines = text.splitlines(keepends=True)
    for line_no, key, old, new in sorted(changes, key=lambda c: -(c[0] or 0)):
        if not line_no or line_no > len(lines):
            raise BadInput(f"{path}: cannot locate {key} to rewrite it without reflowing the file")
        if new is None:
            del lines[line_no - 1]
            continue
        if old not in lines[line_no - 1]:
            raise BadInput(f"{path}:{line_no}: value of {key} is written in a form seedance cannot "
                           f"rewrite in place (multi-line or escaped)")
        lines[line_no - 1] = lines[line_no - 1].replace(old, new, 1)
    return "".join(lines)


def drop_in_content(existing: str | None, key: str, values: list, entry_id: str) -> str:
    """environment.d text with ``key`` set to the union of what it had and ``values``."""
    items = []
    kept = []
    for line in (existing or "").splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == key:
            items.extend(v for v in re.split(r"[:\s]+", value.strip()) if v)
        else:
            kept.append(line)
    for value in values:
        # environment.d expands ${VAR} itself, after the session is up: undo the $$ escape
        value = value.replace("$${", "${")
        items.extend(v for v in re.split(r"[:\s]+", value.strip()) if v)
    items = list(dict.fromkeys(items))
    if not kept:
        kept = [f"# Written by `seedance fix env-leak --inject {key}` (journal {entry_id}).",
                "# systemd --user reads this once the session is up (environment.d(5));",
                f"# undo with: seedance fix undo {entry_id}"]
    return "\n".join(kept + [f"{key}={':'.join(items)}"]) + "\n"
