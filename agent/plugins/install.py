"""Install and uninstall: validate first, resolve, check seven layers, stage, commit.

Order matters for "a bad manifest leaves the store untouched": the manifest (with the
--affinity/--batch-policy overrides applied) is read and validated straight from the
source before the store is created, locked or written.  Only then is the store locked,
dependencies installed, the plugin staged, checked (refusing on ERROR/FATAL unless --force)
and renamed into place.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..model.errors import BadInput, SeedanceError
from ..model.report import SEVERITY_RANK
from . import archive
from .manifest import MANIFEST_NAME, Manifest, apply_overrides, load_manifest
from .resolve import resolve_dependencies
from .store import Store, version_key, write_record


class InstallRefused(SeedanceError):
    """The seven-layer check found ERROR/FATAL problems: findings, so exit 1."""

    exit_code = 1

    def __init__(self, message: str, lines: list):
        super().__init__(message)
        self.lines = lines


@dataclass
class InstallOptions:
    affinity: str | None = None
    batch_policy: str | None = None
    force_arch: str | None = None
    no_deps: bool = False
    force: bool = False
    from_dir: str | None = None
    strict: bool = False  # refuse a plugin with waste traps (checked with verify --strict's rules)


@dataclass
class Installed:
    name: str
    version: str
    path: str
    as_dependency: bool
    lines: list
    waste_traps: list = field(default_factory=list)  # "rule: message", installed over


@dataclass
class InstallResult:
    installed: list = field(default_factory=list)  # of Installed, dependencies first
    picks: list = field(default_factory=list)  # of resolve.Pick
    skipped: list = field(default_factory=list)  # "dsp-kernels >=1.0,<3" under --no-deps
    forced: list = field(default_factory=list)  # findings installed over with --force


def locate(request: str, sources) -> Path:
    """A path (dir/.tar.gz/.whl), or NAME / NAME-vVERSION / NAME==VERSION from a source dir."""
    path = Path(request)
    if path.exists():
        return path
    name, version = archive.split_request(request)
    offered = [s for s in sources if s.name == name and (version is None or s.version == version)]
    if not offered:
        known = sorted({f"{s.name}-v{s.version}" for s in sources})
        where = ("; available: " + ", ".join(known[:12])) if known else \
            " (no source dirs with plugins: give --from DIR or set SEEDANCE_PLUGIN_PATH; the built-in examples come with a wheel, or with `make install` in a clone)"
        raise BadInput(f"{request}: no such file, and no plugin by that name in the source dirs{where}")
    return Path(max(offered, key=lambda s: version_key(s.version)).path)


def read_validated(path: Path, options: InstallOptions, overrides: bool) -> tuple:
    """(manifest, text) with overrides applied; raises BadInput naming field and line."""
    text = archive.manifest_text(path)
    where = str(path / MANIFEST_NAME) if path.is_dir() else f"{path}!{MANIFEST_NAME}"
    manifest = load_manifest(where, text=text)
    if overrides and (options.affinity is not None or options.batch_policy is not None):
        text = apply_overrides(text, where, options.affinity, options.batch_policy)
        manifest = load_manifest(where, text=text)
    return manifest, text


def install(request: str, options: InstallOptions, store: Store | None = None) -> InstallResult:
    store = store or Store()
    sources = archive.scan_sources(archive.source_dirs(options.from_dir))
    path = locate(request, sources)
    manifest, text = read_validated(path, options, overrides=True)  # before touching the store
    result = InstallResult()
    with store.locked():
        _install_one(path, manifest, text, options, store, sources, result, chain=(), dependency=False)
    return result


def _install_one(path: Path, manifest: Manifest, text: str, options: InstallOptions, store: Store,
                 sources, result: InstallResult, chain: tuple, dependency: bool) -> None:
    from .layers import check_root

    if manifest.name in chain:
        raise BadInput(f"dependency cycle: {' -> '.join([*chain, manifest.name])}")
    if options.no_deps:
        if not manifest.depends:
            result.skipped.append(f"{manifest.name} {manifest.version}: none declared, nothing skipped")
        result.skipped.extend(f"{manifest.name} {manifest.version} -> {name} {rng}"
                              for name, rng in sorted(manifest.depends.items()))
    else:
        for pick in resolve_dependencies(manifest, store, sources):
            result.picks.append(pick)
            if pick.version is None:
                if options.force:
                    result.forced.append(f"unresolved dependency: {pick.explanation}")
                    continue
                raise BadInput(f"cannot install {manifest.ident}: dependency {pick.explanation}")
            if not pick.installed:
                dep_path = Path(pick.source)
                dep_manifest, dep_text = read_validated(dep_path, options, overrides=False)
                _install_one(dep_path, dep_manifest, dep_text, options, store, sources, result,
                             (*chain, manifest.name), dependency=True)
    existing = [p for p in store.installed(manifest.name) if p.version == manifest.version]
    if existing and not options.force:
        if dependency:
            return
        raise BadInput(f"plugin {manifest.ident} is already installed at {existing[0].path} "
                       f"(use --force to reinstall)")
    staged = store.stage()
    try:
        root = archive.extract(path, staged)
        (root / MANIFEST_NAME).write_text(text)
        check = check_root(root, strict=options.strict, force_arch=options.force_arch, store=store,
                           sources=sources, check_deps=not options.no_deps)
        # Findings name files in the staging dir; the user knows them by the source path.
        shown = str(path.resolve()) if path.is_dir() else f"{path}!"
        lines = [line.replace(str(root), shown) for line in check.lines]
        blocking = [f for f in check.findings if f.rank >= SEVERITY_RANK["error"]]
        if blocking and not options.force:
            worst = max(blocking, key=lambda f: f.rank)
            raise InstallRefused(
                f"refusing to install {manifest.ident}: {len(blocking)} error/fatal finding(s), "
                f"first: {worst.severity.upper()} {worst.layer}: {worst.message.replace(str(root), shown)} "
                f"(use --force to install anyway)", lines)
        # the waste traps are printed on every install (an install that says nothing of them
        # hides what --force let in); --strict refuses them as verify --strict fails
        traps = [f"{f.rule}: {f.message.replace(str(root), shown)}" for f in check.findings
                 if f.is_waste_trap]
        if traps and options.strict and not options.force:
            raise InstallRefused(
                f"refusing to install {manifest.ident} (--strict): {len(traps)} waste trap(s): "
                f"{', '.join(sorted({t.split(':')[0] for t in traps}))} (use --force to install anyway)",
                [f"waste trap {t}" for t in traps])
        if traps and options.strict:
            result.forced.extend(f"waste trap {t}" for t in traps)
        result.forced.extend(f"{f.severity.upper()} {f.layer}: {f.message.replace(str(root), shown)}"
                             for f in blocking)
        write_record(root, {
            "source": str(path.resolve()),
            "requested_as": "dependency" if dependency else "direct",
            "affinity_override": None if dependency else options.affinity,
            "batch_policy_override": None if dependency else options.batch_policy,
            "force_arch": options.force_arch,
            "no_deps": options.no_deps,
            "forced": bool(blocking),
            "picks": [p.to_dict() for p in result.picks if p.dependent == manifest.ident],
            "skipped_dependencies": sorted(manifest.depends) if options.no_deps else [],
        })
        final = store.commit(root, manifest.name, manifest.version, replace=bool(existing))
        result.installed.append(Installed(manifest.name, manifest.version, str(final), dependency, lines,
                                          traps))
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def uninstall(name: str, version: str | None = None, store: Store | None = None,
              force: bool = False) -> tuple:
    """Returns (removed, dependents): installed plugins whose ranges named the removed one.

    Refuses (BadInput) when an installed plugin needs what would be removed, i.e. no
    remaining version of NAME satisfies its range, unless FORCE: removing both versions of a
    dependency with only a note would leave the plugins that need it broken."""
    store = store or Store()
    if not store.root.is_dir():
        raise BadInput(f"plugin {name} is not installed (the store {store.root} is empty)")
    with store.locked():
        broken = needed_by(name, version, store)
        if broken and not force:
            raise BadInput(f"refusing to uninstall {name}{' ' + version if version else ''}: needed by "
                           f"{', '.join(broken)} (no other installed version satisfies their range; "
                           f"uninstall them first, or use --force)")
        removed = store.remove(name, version)
        dependents = sorted({p.manifest.ident for p in store.installed() if name in p.manifest.depends})
    return removed, dependents


def needed_by(name: str, version: str | None, store: Store) -> list:
    """'dependent (range)' for each installed plugin that removing NAME [VERSION] would leave
    with no installed version in its range."""
    from .manifest import parse_range

    versions = store.installed(name)
    if version is None:
        remaining = []
    else:
        if not any(p.version == version for p in versions):
            return []  # store.remove says it is not installed
        remaining = [p.version for p in versions if p.version != version]
    needing = []
    for plugin in store.installed():
        if plugin.name == name or name not in plugin.manifest.depends:
            continue
        range_text = plugin.manifest.depends[name]
        spec = parse_range(range_text)
        if not any(spec.contains(version_key(v), prereleases=True) for v in remaining):
            needing.append(f"{plugin.manifest.ident} ({name} {range_text})")
    return sorted(needing)
