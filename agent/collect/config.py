"""config_env facts: seedance and plugin YAML configs that feed the dynamic loader.

The trap (product notes, chapter 4): a config says ``LD_PRELOAD: ${HOME}/.local/lib/x.so``;
the reference is expanded while the shell or unit starts, before the user session exists,
so the loader gets the wrong home or nothing.  The lazy form ``$${HOME}`` is an escaped
``$`` that survives until the session expands it, so it is NOT a leak.  Separately, a
preload from a missing path fails every start, and one from a group- or world-writable
path lets another user inject code into every GPU process.
"""
from __future__ import annotations

import os
import re

from ..model.report import Fact
from ..run.preload import unsafe_reason
from . import inputs

# Keys whose value the loader consumes.  Environment-style names are matched in any case.
LOADER_ENV = {"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT"}
PRELOAD_KEYS = {"ld_preload", "preload", "preloads", "ld_audit"}
LIBRARY_KEYS = {"library", "libraries", "library_path", "library_paths", "lib", "libs",
                "lib_path", "lib_paths", "lib_dir", "lib_dirs", "shim", "shim_path"}
_SHARED_OBJECT = re.compile(r"\.so(\.[0-9]+)*($|[:\s])")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENV_ITEM = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
CONFIG_SUFFIXES = (".yaml", ".yml")


def early_references(value: str) -> list:
    """Names referenced as $VAR or ${VAR} that are expanded now; ``$$`` escapes a dollar."""
    names = []
    index = 0
    while True:
        index = value.find("$", index)
        if index < 0 or index + 1 >= len(value):
            return names
        nxt = value[index + 1]
        if nxt == "$":  # $${HOME} / $$HOME: the lazy form, expanded later by the session
            index += 2
            continue
        if nxt == "{":
            end = value.find("}", index + 2)
            if end > index + 2 and _NAME.fullmatch(value[index + 2:end]):
                names.append(value[index + 2:end])
                index = end + 1
                continue
        else:
            match = _NAME.match(value, index + 1)
            if match:
                names.append(match.group())
                index = match.end()
                continue
        index += 1


def is_loader_key(key: str, value: str) -> str | None:
    """'preload', 'libpath' or None: does this key feed the loader, and how?"""
    lowered = key.lower()
    if key.upper() in LOADER_ENV or lowered in PRELOAD_KEYS:
        return "preload" if "preload" in lowered or "audit" in lowered else "libpath"
    if lowered in LIBRARY_KEYS or lowered.endswith(("library_path", "lib_path", "_preload")):
        return "preload" if lowered.endswith("_preload") else "libpath"
    if _SHARED_OBJECT.search(value):
        return "libpath"
    return None


def writable_by_others(path: str) -> str | None:
    """Why others could replace this preload (it or a parent dir writable by them); None if safe."""
    return unsafe_reason(path)


def _preload_problems(value: str) -> tuple:
    missing, writable = [], []
    for item in re.split(r"[:\s]+", value.strip()):
        if not item or "$" in item or "/" not in item:
            continue  # lazy references and bare names (searched in system dirs) are fine here
        if not inputs.exists(item):
            missing.append(item)
            continue
        why = writable_by_others(item)
        if why:
            writable.append(why)
    return missing, writable


def _fact(path: str, key: str, value: str, line: int, kind: str) -> Fact:
    names = early_references(value)
    missing, writable = _preload_problems(value) if kind == "preload" and not names else ([], [])
    problems = []
    if names:
        problems.append("expands " + ", ".join(f"${{{n}}}" for n in names) + " when the config is read"
                        " (use the lazy form $${...})")
    problems.extend(f"preload {m} does not exist" for m in missing)
    problems.extend(f"preload from an unsafe path: {w}" for w in writable)
    return Fact("config_env", {"path": path},
                {"key": key, "value": value, "problem": "; ".join(problems), "line": line,
                 "expands_early": bool(names), "variables": names,
                 "preload_missing": bool(missing), "preload_writable": bool(writable),
                 "use": kind},
                source="collect.config")


def config_facts(path: str) -> list:
    """Facts for every loader-feeding value in one YAML file; BadYaml when it does not parse."""
    import yaml

    from ..files import yamlio
    from ..model.errors import BadInput

    try:
        with open(path, "rb") as handle:
            text = handle.read(yamlio.MAX_BYTES).decode("utf-8", "replace")
        # Bounded: an alias bomb or a 5000-deep file in the config dir is one
        # skipped config, not a hung check.
        root = yamlio.compose(text, path)
    except BadInput as exc:
        raise BadYaml(str(exc)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise BadYaml(f"{path}:{where} not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    facts: list = []
    if root is not None:
        _walk(path, root, None, facts, depth=0)
    return facts


class BadYaml(ValueError):
    pass


def _walk(path: str, node, key, facts: list, depth: int) -> None:
    import yaml

    if depth > 64:
        return  # YAML anchors can nest absurdly deep; real configs never do
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            name = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            _walk(path, value_node, name, facts, depth + 1)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _walk(path, item, key, facts, depth + 1)
    elif isinstance(node, yaml.ScalarNode) and isinstance(node.value, str):
        value, line = node.value, node.start_mark.line + 1
        env_item = _ENV_ITEM.match(value)
        if env_item and env_item.group(1).upper() in LOADER_ENV:  # env: ["LD_PRELOAD=..."]
            kind = is_loader_key(env_item.group(1), env_item.group(2))
            facts.append(_fact(path, env_item.group(1), env_item.group(2), line, kind))
        elif key is not None:
            kind = is_loader_key(str(key), value)
            if kind:
                facts.append(_fact(path, str(key), value, line, kind))


def config_files(directory: str) -> list:
    """*.yaml / *.yml under a seedance config directory (plugins/ included), sorted."""
    found = []
    for base, dirs, files in inputs.walk(directory, followlinks=False):
        dirs.sort()
        if base[len(directory):].count(os.sep) > 4:
            dirs[:] = []
        for name in sorted(files):
            if name.endswith(CONFIG_SUFFIXES):
                found.append(os.path.join(base, name))
    return found
