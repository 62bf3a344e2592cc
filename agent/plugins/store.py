"""The plugin store: $XDG_DATA_HOME/seedance/plugins/NAME/VERSION (default ~/.local/share).

Installs are atomic: the plugin is staged in a temporary directory inside the store (same
filesystem, so rename(2) is atomic), every file and directory is fsynced, and only then is
the staging directory renamed to NAME/VERSION.  A crash leaves either the old tree or the
new one, plus at worst a '.staging-*' directory that the next locked operation removes.
All mutations hold an exclusive flock on the store's '.lock' file, so two concurrent
`seedance plugin install` runs serialise instead of interleaving.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..model.errors import BadInput
from ..fix.atomic import fsync_dir
from .manifest import MANIFEST_NAME, Manifest, load_manifest

RECORD_NAME = ".seedance-install.json"
BENCH_NAME = ".seedance-bench.json"
LOCK_NAME = ".lock"
STAGING_PREFIX = ".staging-"
TRASH_PREFIX = ".trash-"


def default_root() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "seedance" / "plugins"


@dataclass(frozen=True)
class InstalledPlugin:
    name: str
    version: str
    path: Path
    manifest: Manifest
    record: dict

    def version_key(self):
        return version_key(self.version)


def version_key(text: str):
    from packaging.version import InvalidVersion, Version
    try:
        return Version(text)
    except InvalidVersion:
        return Version("0")


class Store:
    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root else default_root()

    # -- reading ---------------------------------------------------------------------------
    def installed(self, name: str | None = None) -> list:
        """Every installed plugin (oldest version first per name); unreadable entries skipped."""
        out = []
        if not self.root.is_dir():
            return out
        for name_dir in sorted(self.root.iterdir()):
            if name_dir.name.startswith(".") or not name_dir.is_dir():
                continue
            if name is not None and name_dir.name != name:
                continue
            for version_dir in name_dir.iterdir():
                if version_dir.name.startswith(".") or not version_dir.is_dir():
                    continue
                try:
                    manifest = load_manifest(version_dir / MANIFEST_NAME)
                except BadInput:
                    continue
                out.append(InstalledPlugin(manifest.name, manifest.version, version_dir, manifest,
                                           _read_json(version_dir / RECORD_NAME)))
        out.sort(key=lambda p: (p.name, p.version_key()))
        return out

    def newest(self, name: str):
        versions = self.installed(name)
        return versions[-1] if versions else None

    def get(self, name: str, version: str | None = None):
        versions = self.installed(name)
        if version is not None:
            versions = [p for p in versions if p.version == version]
        if not versions:
            what = f"{name} {version}" if version else name
            raise BadInput(f"plugin {what} is not installed (see `seedance plugin list`)")
        return versions[-1]

    # -- writing ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self):
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._sweep()
            yield self
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _sweep(self) -> None:
        """Leftovers of an interrupted install/uninstall (we hold the lock, so none is live)."""
        for entry in self.root.iterdir():
            if entry.name.startswith((STAGING_PREFIX, TRASH_PREFIX)):
                shutil.rmtree(entry, ignore_errors=True)

    def stage(self) -> Path:
        return Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self.root))

    def commit(self, staged: Path, name: str, version: str, replace: bool = False) -> Path:
        """fsync the staged tree and rename it into place as NAME/VERSION."""
        _fsync_tree(staged)
        name_dir = self.root / name
        name_dir.mkdir(exist_ok=True)
        final = name_dir / version
        trash = None
        if final.exists():
            if not replace:
                raise BadInput(f"plugin {name} {version} is already installed at {final} "
                               f"(use --force to reinstall)")
            trash = self.root / f"{TRASH_PREFIX}{name}-{version}-{os.getpid()}"
            os.rename(final, trash)
        os.rename(staged, final)
        fsync_dir(name_dir)
        fsync_dir(self.root)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
        return final

    def remove(self, name: str, version: str | None = None) -> list:
        targets = self.installed(name)
        if version is not None:
            targets = [p for p in targets if p.version == version]
        if not targets:
            what = f"{name} {version}" if version else name
            raise BadInput(f"plugin {what} is not installed (see `seedance plugin list`)")
        removed = []
        for plugin in targets:
            trash = self.root / f"{TRASH_PREFIX}{plugin.name}-{plugin.version}-{os.getpid()}"
            os.rename(plugin.path, trash)  # atomic disappearance, then the slow delete
            shutil.rmtree(trash, ignore_errors=True)
            removed.append(plugin)
        name_dir = self.root / name
        with contextlib.suppress(OSError):
            name_dir.rmdir()  # only when empty
        fsync_dir(self.root)
        return removed

    def write_bench(self, plugin: InstalledPlugin, result: dict) -> None:
        """Keep the last bench result beside the plugin: verify uses it as live evidence."""
        atomic_write(plugin.path / BENCH_NAME, json.dumps(result, indent=2, sort_keys=True))


def bench_result(path: Path) -> dict:
    return _read_json(Path(path) / BENCH_NAME)


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(tmp, path)
    fsync_dir(path.parent)


def write_record(staged_root: Path, record: dict) -> None:
    record = dict(record, installed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    (staged_root / RECORD_NAME).write_text(json.dumps(record, indent=2, sort_keys=True))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))
