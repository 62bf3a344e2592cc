"""Dependency ranges -> the newest compatible version, with every pick explained.

A pick is a *fallback* when it is older than the newest version of that plugin that is
installed or available: the range (or a pin) kept the dependent plugin on an older
release, which is how the notes' optimised 2.0.4+ path gets skipped.  `plugin list` marks
such picks with '(fallback)' and the version-fallback rule reports them.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from .manifest import Manifest, parse_range
from .store import Store, version_key


@dataclass(frozen=True)
class Pick:
    dependent: str  # "name version" of the plugin whose range this is
    name: str
    range: str
    version: str | None  # None: nothing satisfies the range
    installed: bool  # the picked version is already in the store
    source: str | None  # where to install it from when it is not
    matching: tuple
    newest: str | None  # newest installed-or-available version of ``name``
    fallback: bool
    explanation: str

    def to_dict(self) -> dict:
        return {"dependent": self.dependent, "name": self.name, "range": self.range,
                "version": self.version, "installed": self.installed, "source": self.source,
                "matching": list(self.matching), "newest": self.newest,
                "fallback": self.fallback, "explanation": self.explanation}


def builtin_source_dir() -> Path | None:
    """The example plugins: the default source of `plugin install NAME` when
    SEEDANCE_PLUGIN_PATH is unset.  `make install` builds them (examples/plugins/build.py)
    into <prefix>/share/seedance/plugins of the environment seedance runs in; a wheel carries
    them as plugin archives in the package (setup.py).  None when neither was built (an
    install from source without a C compiler)."""
    for path in (Path(sys.prefix) / "share" / "seedance" / "plugins", Path(__file__).resolve().parent / "examples"):
        if path.is_dir():
            return path
    return None


def pick_version(dependent: str, name: str, range_text: str, installed: dict, available: dict) -> Pick:
    """installed/available: version -> path.  Installed wins a tie (no reinstall)."""
    spec = parse_range(range_text)
    known = {**available, **installed}
    ordered = sorted(known, key=version_key)
    matching = [v for v in ordered if spec.contains(version_key(v), prereleases=True)]
    newest = ordered[-1] if ordered else None
    where = _describe_known(installed, available)
    if not matching:
        return Pick(dependent, name, range_text, None, False, None, (), newest, False,
                    f"{name} {range_text}: nothing matches ({where or 'no versions installed or available'})")
    version = matching[-1]
    is_installed = version in installed
    fallback = newest is not None and version_key(version) < version_key(newest)
    text = (f"{name} {range_text} -> {version} ({'installed' if is_installed else 'to install'}): "
            f"newest of {len(matching)} matching ({', '.join(matching)})")
    if fallback:
        text += f"; {newest} is newer but outside the range (fallback)"
    return Pick(dependent, name, range_text, version, is_installed,
                None if is_installed else available.get(version), tuple(matching), newest, fallback, text)


def _describe_known(installed: dict, available: dict) -> str:
    parts = []
    if installed:
        parts.append("installed " + ", ".join(sorted(installed, key=version_key)))
    extra = [v for v in available if v not in installed]
    if extra:
        parts.append("available " + ", ".join(sorted(extra, key=version_key)))
    return "; ".join(parts)


def resolve_dependencies(manifest: Manifest, store: Store, sources) -> list:
    """Install-time picks: installed and available versions both count."""
    picks = []
    for name, range_text in sorted(manifest.depends.items()):
        installed = {p.version: str(p.path) for p in store.installed(name)}
        available = {s.version: s.path for s in sources if s.name == name}
        picks.append(pick_version(manifest.ident, name, range_text, installed, available))
    return picks


def active_picks(manifest: Manifest, store: Store, sources) -> list:
    """What the range picks *now*, among installed versions only (what would load), while
    the newest known version still counts installed and available ones."""
    picks = []
    for name, range_text in sorted(manifest.depends.items()):
        installed = {p.version: str(p.path) for p in store.installed(name)}
        available = {s.version: s.path for s in sources if s.name == name}
        pick = pick_version(manifest.ident, name, range_text, installed, {})
        newest_known = max([*installed, *available], key=version_key, default=None)
        fallback = (pick.version is not None and newest_known is not None
                    and version_key(pick.version) < version_key(newest_known))
        text = pick.explanation.split("; ")[0]
        if pick.version is None and available:
            text += f" (available, not installed: {', '.join(sorted(available, key=version_key))})"
        if fallback:
            text += f"; {newest_known} is newer but outside the range (fallback)"
        picks.append(Pick(pick.dependent, name, range_text, pick.version, pick.version is not None,
                          None, pick.matching, newest_known, fallback, text))
    return picks


def seedance_compatible(manifest: Manifest) -> tuple:
    """(ok, this seedance's version) for the manifest's seedance_version range."""
    from .. import __version__
    spec = parse_range(manifest.seedance_version)
    return spec.contains(version_key(__version__), prereleases=True), __version__
