"""What Python packages do before their native modules load, read from rules/context/.

Three data files, validated when first read (a bad one is one RuleError line, exit 2):

- packages.yaml: per package, what its Python code loads first (torch's
  _load_global_deps, cupy's cuda-pathfinder), which package it imports first (torchvision
  imports torch), an explicit preload step the user calls (onnxruntime.preload_dlls()),
  its optional providers, and the variants of one library it picks at run time;
- pip_distributions.yaml: the pip requirement that ships a library file, per CUDA major;
- release_pairs.yaml: which release of a torch extension (torchvision, torchaudio) was
  built for which torch release.

No wheel is named in Python code: what a package does is data, with its source.
"""
from __future__ import annotations

import fnmatch
import os
import re

from ..model.errors import BadInput, RuleError

_CACHE: dict = {}
_LOADS = ("nvidia-wheels", "cuda-toolkit")
_PACKAGE_KEYS = {"package", "loads_first", "imports_first", "preload_step", "how", "missing_hint", "extra", "distribution",
                 "optional", "variants", "source"}
_VARIANT_KEYS = {"files", "picked_by", "source"}
_OPTIONAL_KEYS = {"files", "what", "source"}
_LIBRARY_KEYS = {"soname", "cuda", "requirement", "source"}
_EXTENSION_KEYS = {"distribution", "pairs"}
_PAIR_KEYS = {"torch", "release", "source"}
_RELEASE = re.compile(r"^[0-9]+(\.[0-9]+)*$")  # a public release, no local label (+cpu)
# a requirement a fix prints: a project name and at most a version specifier, nothing a
# shell would read as more (PEP 508 names, PEP 440 specifiers)
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[a-z0-9,]+\])?([=<>~!]=?[0-9][0-9.*]*(,[=<>~!]=?[0-9][0-9.*]*)*)?$")


def context_dir() -> str:
    from ..judge.engine import default_rules_dir

    return os.path.join(default_rules_dir(), "context")


def _load(name: str):
    from ..files import yamlio

    path = os.path.join(context_dir(), name)
    try:
        return path, yamlio.load_file(path)
    except RuleError:
        raise
    except BadInput as exc:
        raise RuleError(str(exc)) from None
    except OSError as exc:
        raise RuleError(f"{path}: {exc.strerror}") from None
    except Exception as exc:  # yaml.YAMLError: bad syntax, said in one line
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise RuleError(f"{path}:{where} not valid YAML: {getattr(exc, 'problem', exc)}") from None


def _text(entry, key, where, required=True) -> str:
    value = entry.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        raise RuleError(f"{where}: '{key}' must be a non-empty string")
    return value


def _names(entry, key, where) -> tuple:
    value = entry.get(key)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise RuleError(f"{where}: '{key}' must be a name or a list of names")
    return tuple(value)


def _unknown(entry, known, where) -> None:
    extra = sorted(set(entry) - known)
    if extra:
        raise RuleError(f"{where}: unknown field(s) {', '.join(map(str, extra))}")


def _regex(text, where):
    try:
        return re.compile(text)
    except re.error as exc:
        raise RuleError(f"{where}: bad regex {text!r}: {exc}") from None


def _entries(doc, key: str, allowed, path: str, article: str = "a"):
    """(PATH#N, entry) of each entry of the data file's ``key:`` list, an entry a mapping of
    ``allowed`` keys only; RuleError on the first that is not."""
    if not isinstance(doc, dict) or not isinstance(doc.get(key), list):
        raise RuleError(f"{path}: expected a mapping with {article} '{key}:' list")
    for index, entry in enumerate(doc[key]):
        where = f"{path}#{index}"
        if not isinstance(entry, dict):
            raise RuleError(f"{where}: an entry must be a mapping")
        _unknown(entry, allowed, where)
        yield where, entry


def validate_packages(doc, path: str) -> tuple:
    """The entries of packages.yaml as dicts, each checked; RuleError on the first problem."""
    entries = []
    for where, entry in _entries(doc, "packages", _PACKAGE_KEYS, path):
        out = {"package": _names(entry, "package", where), "source": _text(entry, "source", where),
               "loads_first": (), "imports_first": _text(entry, "imports_first", where, False),
               "preload_step": _text(entry, "preload_step", where, False), "how": _text(entry, "how", where, False),
               "missing_hint": _text(entry, "missing_hint", where, False), "extra": _text(entry, "extra", where, False),
               "distribution": _text(entry, "distribution", where, False),
               "optional": (), "variants": None}
        if "loads_first" in entry:
            out["loads_first"] = _names(entry, "loads_first", where)
            bad = [v for v in out["loads_first"] if v not in _LOADS]
            if bad:
                raise RuleError(f"{where}: loads_first must be among {', '.join(_LOADS)}, not {bad[0]}")
            if not out["how"] and not out["preload_step"]:
                raise RuleError(f"{where}: loads_first needs 'how' (the reason shown) or 'preload_step'")
        if out["extra"] and not (out["distribution"] and out["missing_hint"]):
            raise RuleError(f"{where}: 'extra' needs 'distribution' (when no RECORD names one) and 'missing_hint'")
        if "{provider}" not in out["how"] and out["how"]:
            raise RuleError(f"{where}: 'how' must name the library loaded first as {{provider}}")
        if not (out["loads_first"] or out["imports_first"] or entry.get("optional") or entry.get("variants")):
            raise RuleError(f"{where}: says nothing the package does (loads_first, imports_first, optional, variants)")
        optional = entry.get("optional", [])
        if not isinstance(optional, list):
            raise RuleError(f"{where}: 'optional' must be a list")
        for number, item in enumerate(optional):
            spot = f"{where} optional#{number}"
            if not isinstance(item, dict):
                raise RuleError(f"{spot}: must be a mapping")
            _unknown(item, _OPTIONAL_KEYS, spot)
            out["optional"] += ({"files": _text(item, "files", spot), "what": _text(item, "what", spot),
                                 "source": _text(item, "source", spot)},)
        if "variants" in entry:
            variants = entry["variants"]
            spot = f"{where} variants"
            if not isinstance(variants, dict):
                raise RuleError(f"{spot}: must be a mapping")
            _unknown(variants, _VARIANT_KEYS, spot)
            files = _regex(_text(variants, "files", spot), spot)
            if not {"backend", "version"} <= set(files.groupindex):
                raise RuleError(f"{spot}: 'files' needs the groups (?P<backend>...) and (?P<version>...)")
            if variants.get("picked_by") != "torch":
                raise RuleError(f"{spot}: picked_by must be torch")
            out["variants"] = {"files": files, "picked_by": "torch", "source": _text(variants, "source", spot)}
        entries.append(out)
    return tuple(entries)


def validate_libraries(doc, path: str) -> tuple:
    entries = []
    for where, entry in _entries(doc, "libraries", _LIBRARY_KEYS, path):
        requirement = _text(entry, "requirement", where)
        if not _REQUIREMENT.match(requirement):
            raise RuleError(f"{where}: requirement {requirement!r} is not a plain 'name[==version]'")
        cuda = entry.get("cuda")
        if cuda is not None and (not isinstance(cuda, int) or isinstance(cuda, bool) or cuda < 1):
            raise RuleError(f"{where}: cuda must be a CUDA major (12, 13)")
        entries.append({"soname": _regex(_text(entry, "soname", where), where), "cuda": cuda,
                        "requirement": requirement, "source": _text(entry, "source", where)})
    return tuple(entries)


def validate_release_pairs(doc, path: str) -> dict:
    """release_pairs.yaml as {canonical distribution: {torch release: (release, source)}};
    RuleError on the first problem (a torch release listed twice for one extension too)."""
    out: dict = {}
    for where, entry in _entries(doc, "extensions", _EXTENSION_KEYS, path, article="an"):
        dist = _text(entry, "distribution", where)
        if not _REQUIREMENT.match(dist) or any(c in dist for c in "=<>~!["):
            raise RuleError(f"{where}: distribution {dist!r} is not a plain project name")
        pairs = entry.get("pairs")
        if not isinstance(pairs, list) or not pairs:
            raise RuleError(f"{where}: 'pairs' must be a non-empty list")
        table = out.setdefault(_canonical(dist), {})
        for number, pair in enumerate(pairs):
            spot = f"{where} pairs#{number}"
            if not isinstance(pair, dict):
                raise RuleError(f"{spot}: must be a mapping")
            _unknown(pair, _PAIR_KEYS, spot)
            torch, release = _text(pair, "torch", spot), _text(pair, "release", spot)
            for key, value in (("torch", torch), ("release", release)):
                if not _RELEASE.match(value):
                    raise RuleError(f"{spot}: {key} {value!r} is not a release like 2.4.1")
            if torch in table:
                raise RuleError(f"{spot}: torch {torch} is paired twice for {dist}")
            table[torch] = (release, _text(pair, "source", spot))
    return out


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _validated(name: str, validate):
    """rules/context/NAME, read and validated once per process."""
    known = _CACHE.get(name)
    if known is None:
        path, doc = _load(name)
        known = _CACHE[name] = validate(doc, path)
    return known


def packages() -> tuple:
    return _validated("packages.yaml", validate_packages)


def libraries() -> tuple:
    return _validated("pip_distributions.yaml", validate_libraries)


def release_pairs() -> dict:
    return _validated("release_pairs.yaml", validate_release_pairs)


def matching_release(distribution: str, torch_version: str):
    """(release, source) of ``distribution`` built for the installed ``torch_version``
    (a local build's label, +cpu or +cu124, does not change the release), or None when
    the distribution or that torch release is not in release_pairs.yaml."""
    table = release_pairs().get(_canonical(distribution))
    if not table or not torch_version:
        return None
    return table.get(torch_version.split("+", 1)[0])


def index_caveat(torch_version: str) -> str:
    """What a pinned extension install needs besides its pin when the installed torch is a
    local build: PyTorch publishes +cpu and +cuXXX builds on its own index, where the
    extension's matching build is too (https://pytorch.org/get-started/locally/)."""
    _public, sep, label = (torch_version or "").partition("+")
    if not sep or not re.fullmatch(r"cpu|cu[0-9]+|rocm[0-9.]+|xpu", label):
        return ""
    return (f"; the installed torch is the {label} build from PyTorch's index: take the same build of it "
            f"from there (add --index-url https://download.pytorch.org/whl/{label})")


def entry_for(top: str):
    """The packages.yaml entry whose ``package`` patterns match a top-level name, or None."""
    for entry in packages():
        if any(fnmatch.fnmatchcase(top, pattern) for pattern in entry["package"]):
            return entry
    return None


def requirement_for(name: str, cuda_major: int | None) -> str | None:
    """The pip requirement that ships the library ``name`` for an object built for CUDA
    ``cuda_major`` (None: unknown; then only an entry that holds for any major answers)."""
    candidates = [e for e in libraries() if e["soname"].fullmatch(name)]
    for entry in candidates:
        if entry["cuda"] is None or entry["cuda"] == cuda_major:
            return entry["requirement"]
    majors = {e["cuda"] for e in candidates}
    if len(candidates) == 1 or (cuda_major is None and len(majors) == 1):
        return candidates[0]["requirement"]
    return None


_MAJOR = re.compile(r"^lib(?:cudart|cublas|cublasLt|nvrtc|nvJitLink)\.so\.(\d+)$")


def cuda_major_of(needed) -> int | None:
    """The CUDA major an object was built for, from the NEEDED names whose SONAME carries it
    (libcudart.so.13, libcublas.so.12, libnvrtc.so.13); None when it names none."""
    for name in needed:
        match = _MAJOR.match(name)
        if match:
            return int(match.group(1))
    return None
