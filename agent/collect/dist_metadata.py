"""Installed distributions as evidence: their RECORD (which distribution ships a module)
and their METADATA's Requires-Dist, evaluated for the interpreter as pip check does, read
from the *.dist-info directories on its sys.path without running it or any package."""
from __future__ import annotations

import os
from dataclasses import dataclass

# annotations only (typing's TYPE_CHECKING would import typing at every start)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .python_env import Interpreter, Prediction


def distributions_providing(interp: Interpreter, module: str) -> list:
    """(distribution, recorded) for each distribution installed for ``interp`` whose RECORD
    names the top-level package of ``module``; ``recorded``: its RECORD lists ``module``
    itself (the file was installed and is gone since).  Read from the *.dist-info
    directories on the interpreter's sys.path, without running it or any package."""
    top = module.split(".")[0]
    stem = module.replace(".", "/")
    found = []
    for entry in interp.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if not name.endswith(".dist-info"):
                continue
            try:
                with open(os.path.join(entry or ".", name, "RECORD"), encoding="utf-8", errors="replace") as handle:
                    files = [line.split(",", 1)[0] for line in handle]
            except OSError:
                continue
            if not any(f == f"{top}.py" or f.startswith((f"{top}/", f"{top}.")) for f in files):
                continue
            recorded = any(f in (f"{stem}.py", f"{stem}/__init__.py") or
                           (f.startswith(f"{stem}.") and f.endswith(".so")) for f in files)
            found.append((_dist_name(os.path.join(entry or ".", name), name), recorded))
    return found


def _dist_name(dist_info: str, dirname: str) -> str:
    """The distribution's Name: from METADATA, else the directory's name before the version."""
    try:
        with open(os.path.join(dist_info, "METADATA"), encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("Name:"):
                    return line.split(":", 1)[1].strip()
                if not line.strip():
                    break
    except OSError:
        pass
    return dirname[:-len(".dist-info")].split("-")[0]


def import_failure_fix(interp: Interpreter, module: str) -> tuple:
    """(distribution or '', the fix text) for `No module named MODULE` in ``interp``.  A pip
    command only where the distribution is known: one installed for this interpreter whose
    RECORD lists the module (installed, then deleted: a reinstall brings it back).  An
    import name often differs from its PyPI name (cv2 is opencv-python), so nothing is
    guessed from the name alone."""
    python = interp.python
    dists = distributions_providing(interp, module)
    broken = [d for d, recorded in dists if recorded]
    if not dists:
        wanted = next((item for item in unmet_requirements(interp)
                       if item.installed is None and _names_module(item.name, module)), None)
        if wanted is not None:
            return wanted.name, (f"{python} -m pip install '{wanted.requirement}' ({wanted.distribution} "
                                 f"{wanted.version} requires it and it is not installed)")
    if broken:
        return broken[0], (f"{python} -m pip install --force-reinstall {broken[0]} "
                           f"(its RECORD lists {module}, which is gone)")
    if dists:
        names = ", ".join(d for d, _r in dists)
        return "", (f"{module.split('.')[0]} comes from {names}, which has no module {module}: check the "
                    f"name against its version ({python} -m pip show {dists[0][0]})")
    return "", (f"no distribution installed for {python} provides {module.split('.')[0]}: check the "
                f"spelling and that this is the interpreter meant, then install the distribution that "
                f"ships it ({python} -m pip install NAME; the PyPI name may differ from the import name)")


# --- distribution metadata: what pip check reads ----------------------------------------------


@dataclass(frozen=True)
class UnmetRequirement:
    """One Requires-Dist of an installed distribution that the installed set does not meet."""
    distribution: str
    version: str
    requirement: str  # as METADATA spells it, without its marker
    name: str  # the required distribution
    installed: str | None  # its installed version; None: not installed
    dist_info: str


def installed_distributions(interp: Interpreter) -> dict:
    """canonical name -> (Name, Version, dist-info path, [Requires-Dist]) for every
    *.dist-info on the interpreter's sys.path, the first one found per name winning (as
    importlib.metadata and pip do), read without running the interpreter."""
    from packaging.utils import canonicalize_name

    found: dict = {}
    for entry in interp.path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for dirname in names:
            if not dirname.endswith(".dist-info"):
                continue
            path = os.path.join(entry or ".", dirname)
            headers = _metadata_headers(os.path.join(path, "METADATA"))
            if headers is None or not headers.get("Name") or not headers.get("Version"):
                continue
            key = canonicalize_name(headers["Name"][0])
            found.setdefault(key, (headers["Name"][0], headers["Version"][0], path, headers.get("Requires-Dist", [])))
    return found


def _metadata_headers(path: str) -> dict | None:
    """The header fields of a METADATA file (RFC 822 style, up to the first blank line)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(1 << 20)
    except OSError:
        return None
    headers: dict = {}
    last = None
    for line in text.splitlines():
        if not line.strip():
            break
        if line[0] in " \t" and last is not None:
            headers[last][-1] += " " + line.strip()
            continue
        key, sep, value = line.partition(":")
        if sep:
            last = key.strip()
            headers.setdefault(last, []).append(value.strip())
    return headers


def unmet_requirements(interp: Interpreter) -> list:
    """Every Requires-Dist whose marker holds for this interpreter (no extra requested) and
    that the installed distributions do not meet: what `pip check` reports."""
    from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    markers = dict(interp.markers or {})
    markers["extra"] = ""
    dists = installed_distributions(interp)
    unmet = []
    for name, version, path, requires in dists.values():
        for text in requires:
            try:
                requirement = Requirement(text)
                if requirement.marker is not None and not requirement.marker.evaluate(markers):
                    continue
            except (InvalidRequirement, InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
                continue  # pip check skips what it cannot parse too
            wanted = dists.get(canonicalize_name(requirement.name))
            installed = wanted[1] if wanted is not None else None
            if installed is not None:
                try:
                    if requirement.specifier.contains(Version(installed), prereleases=True):
                        continue
                except InvalidVersion:
                    continue
            spec = str(requirement.specifier)
            unmet.append(UnmetRequirement(name, version, f"{requirement.name}{spec}", requirement.name,
                                          installed, path))
    return unmet


def requirement_facts(prediction: Prediction) -> list:
    """One `dist-requirement` fact per unmet Requires-Dist of a distribution that provides a
    module of the import: the failure a pin explains names the pin, then the loader's
    text as proof."""
    from ..model.report import Fact

    interp, plan = prediction.interpreter, prediction.plan
    if interp is None or plan is None:
        return []
    unmet = unmet_requirements(interp)
    if not unmet:
        return []
    tops = {name.split(".")[0] for name in prediction.names}
    failed_top = (prediction.failed_module or "").split(".")[0]
    # ModuleNotFoundError raised deep in the import (joblib's `from cloudpickle import ...`
    # under `import sklearn`): the pin that explains it is the raising module's distribution's
    not_found = dict(plan.missing).get(prediction.failed_module or "", "") if not prediction.ok else ""
    raiser = plan.raised_in.get(prediction.failed_module or "", "").split(".")[0]
    owners: dict = {}
    for top in tops | ({failed_top, raiser} - {""}):
        for dist, _recorded in distributions_providing(interp, top):
            owners.setdefault(dist.lower(), set()).add(top)
    facts = []
    for item in unmet:
        modules = owners.get(item.distribution.lower())
        if not modules:
            continue
        have = f"{item.name} {item.installed} is installed" if item.installed else f"{item.name} is not installed"
        if not_found:
            explains = item.installed is None and _names_module(item.name, not_found)
        else:
            explains = not prediction.ok and failed_top in modules
        proof = prediction.error if explains else ""
        check = (f"{interp.python} -m pip install --dry-run '{item.distribution}' '{item.name}=={item.installed}'"
                 if item.installed else f"{interp.python} -m pip install '{item.requirement}'")
        facts.append(Fact("dist-requirement", {"path": item.dist_info}, {
            "distribution": item.distribution, "version": item.version, "requirement": item.requirement,
            "required": item.name, "installed": item.installed or "", "have": have,
            "modules": ", ".join(sorted(modules)), "python": interp.python,
            "fails": bool(proof), "proof": f"; import {failed_top} fails: {proof}" if proof else "",
            "check": check, "remedy": _requirement_remedy(item, interp.python, check)}, source="python_env"))
    return facts


def _names_module(distribution: str, module: str) -> bool:
    """Whether a distribution's name is the import name of ``module``'s top (cloudpickle,
    typing-extensions for typing_extensions): the one case the name alone tells."""
    from packaging.utils import canonicalize_name

    return canonicalize_name(distribution) == canonicalize_name(module.split(".")[0])


def _requirement_remedy(item: UnmetRequirement, python: str, check: str) -> str:
    """The fix of an unmet pin: the extension's release built for the installed torch when
    rules/context/release_pairs.yaml pairs them, else how to find it."""
    from packaging.utils import canonicalize_name

    from .package_context import index_caveat, matching_release

    if item.installed and canonicalize_name(item.name) == "torch":
        found = matching_release(item.distribution, item.installed)
        if found is not None:
            release, source = found
            return (f"{python} -m pip install --no-deps '{item.distribution}=={release}'"
                    f"{index_caveat(item.installed)} (the {item.distribution} release built for the installed "
                    f"torch {item.installed}: {source})")
    if not item.installed:
        return (f"{python} -m pip install '{item.requirement}' ({item.distribution} {item.version} requires it; "
                f"pip installs what a distribution requires unless told --no-deps)")
    return (f"install the {item.distribution} release whose Requires-Dist accepts the installed {item.name}, or "
            f"the {item.requirement} it was built for; `pip install --upgrade {item.distribution}` alone does not "
            f"choose by torch's release: check a candidate with {check}")
