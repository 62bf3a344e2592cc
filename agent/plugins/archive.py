"""Where a plugin comes from: a directory, a .tar.gz, a wheel, or a name in a source dir.

A plugin is a directory with a manifest.yaml at its top (or one level down, as archives
usually wrap their content in NAME-VERSION/).  Archives are extracted member by member
after checking each name: no absolute paths, no '..', no links that point outside the
extraction root, nothing but regular files, directories and safe symlinks.  This is the
check tarfile's 'data' filter does on 3.12+; it is spelled out so 3.9-3.11 behave the same.
"""
from __future__ import annotations

import os
import posixpath
import shutil
import stat
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput
from .manifest import MANIFEST_NAME

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".whl")
MAX_MEMBERS = 10000
MAX_TOTAL_BYTES = 2 << 30


@dataclass(frozen=True)
class SourceEntry:
    """A plugin offered by a source directory (not yet installed)."""
    name: str
    version: str
    path: str


def kind_of(src: Path) -> str:
    if src.is_dir():
        return "dir"
    name = src.name.lower()
    if name.endswith((".tar.gz", ".tgz")):
        return "tar"
    if name.endswith(".whl"):
        return "wheel"
    return ""


def _check_member_name(name: str, where: str) -> str:
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise BadInput(f"{where}: refusing archive member with an absolute path: {name}")
    norm = posixpath.normpath(name)
    if norm == ".." or norm.startswith("../") or "/../" in f"/{name}/":
        raise BadInput(f"{where}: refusing archive member that climbs out with '..': {name}")
    return norm


def _link_escapes(member_name: str, target: str) -> bool:
    if target.startswith("/"):
        return True
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(member_name), target))
    return joined == ".." or joined.startswith("../")


def manifest_text(src: Path) -> str:
    """Read manifest.yaml out of a source without unpacking it (validation comes first,
    before anything touches the store)."""
    kind = kind_of(src)
    where = str(src)
    if kind == "dir":
        return _read_dir_manifest(src)
    if kind == "tar":
        try:
            with tarfile.open(src, "r:gz") as tar:
                names = [m for m in tar.getmembers() if m.isfile()]
                member = _pick_manifest([m.name for m in names], where)
                handle = tar.extractfile(member)
                return handle.read().decode("utf-8")
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise BadInput(f"{where}: not a readable .tar.gz: {exc}") from None
        except UnicodeDecodeError:
            raise BadInput(f"{where}: manifest.yaml is not UTF-8 text") from None
    if kind == "wheel":
        try:
            with zipfile.ZipFile(src) as zf:
                member = _pick_manifest(zf.namelist(), where)
                return zf.read(member).decode("utf-8")
        except (zipfile.BadZipFile, OSError) as exc:
            raise BadInput(f"{where}: not a readable wheel: {exc}") from None
        except UnicodeDecodeError:
            raise BadInput(f"{where}: manifest.yaml is not UTF-8 text") from None
    raise BadInput(f"{where}: not a plugin (expected a directory, .tar.gz or .whl with a manifest.yaml)")


def _read_dir_manifest(src: Path) -> str:
    path = src / MANIFEST_NAME
    try:
        return path.read_text()
    except FileNotFoundError:
        raise BadInput(f"{src}: no manifest.yaml in this directory") from None
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not UTF-8 text") from None


def _pick_manifest(names, where: str) -> str:
    """manifest.yaml at the top, or in the single top-level directory."""
    candidates = [n for n in names if posixpath.basename(n.rstrip("/")) == MANIFEST_NAME
                  and posixpath.normpath(n).count("/") <= 1]
    if not candidates:
        raise BadInput(f"{where}: no manifest.yaml at the top of the archive")
    candidates.sort(key=lambda n: posixpath.normpath(n).count("/"))
    return candidates[0]


def extract(src: Path, dest: Path) -> Path:
    """Copy or safely extract ``src`` into the empty directory ``dest``; return the plugin root."""
    kind = kind_of(src)
    if kind == "dir":
        shutil.copytree(src, dest / "p", symlinks=True, ignore=shutil.ignore_patterns(
            "__pycache__", "*.pyc", ".git"))
        _check_tree_links(dest / "p", str(src))
        return dest / "p"
    if kind == "tar":
        _extract_tar(src, dest / "p")
    elif kind == "wheel":
        _extract_wheel(src, dest / "p")
    else:
        raise BadInput(f"{src}: not a plugin (expected a directory, .tar.gz or .whl)")
    root = dest / "p"
    if (root / MANIFEST_NAME).is_file():
        return root
    subdirs = [p for p in root.iterdir() if p.is_dir() and (p / MANIFEST_NAME).is_file()]
    if len(subdirs) == 1:
        return subdirs[0]
    raise BadInput(f"{src}: no manifest.yaml at the top of the archive")


def _check_tree_links(root: Path, where: str) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if path.is_symlink():
                rel = path.relative_to(root).as_posix()
                if _link_escapes(rel, os.readlink(path)):
                    raise BadInput(f"{where}: refusing symlink that escapes the plugin: {rel} -> "
                                   f"{os.readlink(path)}")


def _extract_tar(src: Path, dest: Path) -> None:
    where = str(src)
    dest.mkdir()
    total = 0
    try:
        with tarfile.open(src, "r:gz") as tar:
            members = tar.getmembers()
            if len(members) > MAX_MEMBERS:
                raise BadInput(f"{where}: more than {MAX_MEMBERS} members")
            for member in members:
                name = _check_member_name(member.name, where)
                if name == ".":
                    continue
                target = dest / name
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                elif member.isfile():
                    total += member.size
                    if total > MAX_TOTAL_BYTES:
                        raise BadInput(f"{where}: unpacks to more than {MAX_TOTAL_BYTES >> 30} GiB")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with tar.extractfile(member) as source, open(target, "wb") as out:
                        shutil.copyfileobj(source, out)
                    os.chmod(target, (member.mode & 0o755) | stat.S_IRUSR | stat.S_IWUSR)
                elif member.issym():
                    if _link_escapes(name, member.linkname):
                        raise BadInput(f"{where}: refusing symlink that escapes the plugin: "
                                       f"{member.name} -> {member.linkname}")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.symlink(member.linkname, target)
                else:
                    # Hard links, devices and FIFOs have no business in a plugin.
                    raise BadInput(f"{where}: refusing archive member of unsupported type: {member.name}")
    except (tarfile.TarError, EOFError) as exc:
        raise BadInput(f"{where}: not a readable .tar.gz: {exc}") from None


def _extract_wheel(src: Path, dest: Path) -> None:
    where = str(src)
    dest.mkdir()
    total = 0
    try:
        with zipfile.ZipFile(src) as zf:
            infos = zf.infolist()
            if len(infos) > MAX_MEMBERS:
                raise BadInput(f"{where}: more than {MAX_MEMBERS} members")
            for info in infos:
                name = _check_member_name(info.filename, where)
                mode = info.external_attr >> 16
                if stat.S_ISLNK(mode):
                    raise BadInput(f"{where}: refusing symlink in a wheel: {info.filename}")
                target = dest / name
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                total += info.file_size
                if total > MAX_TOTAL_BYTES:
                    raise BadInput(f"{where}: unpacks to more than {MAX_TOTAL_BYTES >> 30} GiB")
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as source, open(target, "wb") as out:
                    shutil.copyfileobj(source, out)
                if mode & 0o111:
                    os.chmod(target, 0o755)
    except zipfile.BadZipFile as exc:
        raise BadInput(f"{where}: not a readable wheel: {exc}") from None


def source_dirs(extra: str | None = None) -> list:
    """--from DIR first, then SEEDANCE_PLUGIN_PATH (colon-separated)."""
    dirs = []
    if extra:
        dirs.append(Path(extra))
    for part in os.environ.get("SEEDANCE_PLUGIN_PATH", "").split(os.pathsep):
        if part:
            dirs.append(Path(part))
    return dirs


def scan_sources(dirs) -> list:
    """Every plugin offered by the source dirs, read from its manifest (bad ones skipped:
    a broken neighbour must not block installing a good plugin)."""
    from .manifest import load_manifest

    found = []
    for directory in dirs:
        if not directory.is_dir():
            continue
        for entry in sorted(directory.iterdir()):
            if not kind_of(entry):
                continue
            try:
                manifest = load_manifest(entry / MANIFEST_NAME if entry.is_dir() else entry,
                                         text=manifest_text(entry))
            except BadInput:
                continue
            found.append(SourceEntry(manifest.name, manifest.version, str(entry)))
    return found


def split_request(text: str):
    """'audio-encoder-v2.0.5' / 'audio-encoder==2.0.5' / 'audio-encoder' -> (name, version|None)."""
    if "==" in text:
        name, _, version = text.partition("==")
        return name.strip(), version.strip()
    head, sep, tail = text.rpartition("-v")
    if sep and head and tail[:1].isdigit():
        return head, tail
    return text, None
