"""Where a plugin comes from: a directory, a .tar.gz, a wheel or .zip, or a name in a source dir.

A plugin is a directory with a manifest.yaml at its top (or one level down, as archives
usually wrap their content in NAME-VERSION/).  Everything is unpacked by one extractor
(_Staging) that can only create things inside the staging root:

- names are checked first: no absolute paths, no '..' component, no NUL;
- every parent directory is opened from the root's descriptor one component at a time
  with O_NOFOLLOW (openat), and files are created O_CREAT|O_EXCL|O_NOFOLLOW, so no write
  ever goes through a symlink or over an existing entry (a duplicate member is refused);
- symlinks are created as given, and once everything is unpacked each one is resolved
  (realpath) against the final tree and must land inside the root.  Checking each link
  lexically when it is made is not enough: `l1 -> ..`, then `lK -> l(K-1)/..` each look
  harmless but together climb to /, and a member under l15/... would be written outside
  the store;
- hard links, devices, FIFOs and sockets are refused; setuid, setgid and sticky bits are
  dropped (modes are masked to 0755);
- member count and bytes actually written are capped.

A plugin *directory* goes through the same extractor, read with lstat, so a device, FIFO or
an escaping link in it is refused the same way instead of being copied or followed.
"""
from __future__ import annotations

import errno
import os
import posixpath
import stat
import struct
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from ..model.errors import BadInput, describe_os_error
from .manifest import MANIFEST_NAME

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".whl", ".zip")
MAX_MEMBERS = 10000
MAX_TOTAL_BYTES = 2 << 30
MAX_MANIFEST_BYTES = 4 << 20
IGNORED_IN_DIRS = ("__pycache__", ".git")   # copied from a source directory: never
_CHUNK = 1 << 20

# What a broken archive raises from tarfile/zipfile/gzip/zlib, beside their own errors: an
# unsupported zip compression is NotImplementedError, an encrypted member RuntimeError, and
# a damaged zip central directory IndexError or struct.error (found by
# tests/security/test_fuzz_yaml_archive.py: one flipped byte in a wheel was a traceback).
_DAMAGED = (zlib.error, EOFError, ValueError, OSError, LookupError, struct.error, OverflowError)
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError, *_DAMAGED)
_TAR_ERRORS = (tarfile.TarError, *_DAMAGED)


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
    if name.endswith(".zip"):
        return "zip"
    return ""


def _member_parts(name: str, where: str) -> list:
    """The path components of a member name, or BadInput when it could leave the root."""
    if "\0" in name:
        raise BadInput(f"{where}: refusing archive member with a NUL in its name: {name!r}")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise BadInput(f"{where}: refusing archive member with an absolute path: {name!r}")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise BadInput(f"{where}: refusing archive member that climbs out with '..': {name!r}")
    return parts


def _link_escapes(member_name: str, target: str) -> bool:
    """The lexical test, done when the link is made (the final realpath test is the real one)."""
    if target.startswith("/") or "\0" in target or not target:
        return True
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(member_name), target))
    return joined == ".." or joined.startswith("../")


class _Staging:
    """Creates directories, files and symlinks strictly inside ``root`` (see the module doc)."""

    def __init__(self, root: Path, where: str):
        self.root = root
        self.where = where
        os.mkdir(root, 0o700)
        self.root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self.members = 0
        self.total = 0
        self.links: list = []

    def close(self) -> None:
        if self.root_fd >= 0:
            os.close(self.root_fd)
            self.root_fd = -1

    def _count(self, name: str) -> None:
        self.members += 1
        if self.members > MAX_MEMBERS:
            raise BadInput(f"{self.where}: more than {MAX_MEMBERS} members")

    def _cannot(self, name: str, exc: OSError) -> BadInput:
        # ENAMETOOLONG, ENOSPC, EMLINK...: one line, never a traceback
        return BadInput(f"{self.where}: cannot unpack {name!r}: {(exc.strerror or str(exc)).lower()}")

    def _parent(self, parts: list, name: str) -> int:
        """A descriptor of the directory that will hold parts[-1], made as needed, never
        reached through a symlink."""
        fd = os.dup(self.root_fd)
        try:
            for part in parts[:-1]:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                try:
                    child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                    dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise BadInput(f"{self.where}: refusing archive member under a symlink or a "
                                       f"file ({part!r}): {name!r}") from None
                    raise
                os.close(fd)
                fd = child
            return fd
        except OSError as exc:
            os.close(fd)
            raise self._cannot(name, exc) from None
        except BaseException:
            os.close(fd)
            raise

    def directory(self, name: str) -> None:
        parts = _member_parts(name, self.where)
        self._count(name)
        if not parts:
            return
        fd = self._parent(parts + ["."], name)
        os.close(fd)

    def file(self, name: str, source, mode: int) -> None:
        parts = _member_parts(name, self.where)
        self._count(name)
        if not parts:
            raise BadInput(f"{self.where}: refusing file member that names the top directory: {name!r}")
        parent = self._parent(parts, name)
        try:
            try:
                fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o600, dir_fd=parent)
            except FileExistsError:
                raise BadInput(f"{self.where}: refusing duplicate archive member: {name!r}") from None
            except OSError as exc:
                raise self._cannot(name, exc) from None
        finally:
            os.close(parent)
        try:
            while True:
                chunk = source.read(_CHUNK)  # a damaged archive raises here: the caller words it
                if not chunk:
                    break
                self.total += len(chunk)
                if self.total > MAX_TOTAL_BYTES:
                    raise BadInput(f"{self.where}: unpacks to more than {MAX_TOTAL_BYTES >> 30} GiB")
                try:
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view):]
                except OSError as exc:
                    raise self._cannot(name, exc) from None
            # No setuid, setgid or sticky bit, nothing writable by others: 0755 at most.
            os.fchmod(fd, (mode & 0o755) | stat.S_IRUSR | stat.S_IWUSR)
        finally:
            os.close(fd)

    def symlink(self, name: str, target: str) -> None:
        parts = _member_parts(name, self.where)
        self._count(name)
        if not parts or _link_escapes("/".join(parts), target):
            raise BadInput(f"{self.where}: refusing symlink that escapes the plugin: {name} -> {target}")
        parent = self._parent(parts, name)
        try:
            os.symlink(target, parts[-1], dir_fd=parent)
        except FileExistsError:
            raise BadInput(f"{self.where}: refusing duplicate archive member: {name!r}") from None
        except OSError as exc:
            raise self._cannot(name, exc) from None
        finally:
            os.close(parent)
        self.links.append(("/".join(parts), target))

    def finish(self) -> None:
        """Every link resolved against the finished tree must stay inside the root."""
        real_root = os.path.realpath(self.root)
        for rel, target in self.links:
            real = os.path.realpath(os.path.join(self.root, rel))
            if real != real_root and not real.startswith(real_root + os.sep):
                raise BadInput(f"{self.where}: refusing symlink that escapes the plugin: {rel} -> {target} "
                               f"(resolves outside it)")


def _unpack(src: Path, root: Path, fill) -> None:
    where = str(src)
    try:
        staging = _Staging(root, where)
    except OSError as exc:
        raise BadInput(f"{where}: cannot unpack: {describe_os_error(exc)}") from None
    try:
        fill(staging)
        staging.finish()
    finally:
        staging.close()


def manifest_text(src: Path) -> str:
    """Read manifest.yaml out of a source without unpacking it (validation comes first,
    before anything touches the store)."""
    kind = kind_of(src)
    where = str(src)
    if kind == "dir":
        return _read_dir_manifest(src)
    try:
        if kind == "tar":
            try:
                with tarfile.open(src, "r:gz") as tar:
                    names = [m for m in tar.getmembers() if m.isfile()]
                    member = _pick_manifest([m.name for m in names], where)
                    info = next(m for m in names if m.name == member)
                    _manifest_size(info.size, where)
                    return tar.extractfile(info).read().decode("utf-8")
            except _TAR_ERRORS as exc:
                raise BadInput(f"{where}: not a readable .tar.gz: {_one_line(exc)}") from None
        if kind in ("wheel", "zip"):
            try:
                with zipfile.ZipFile(src) as zf:
                    member = _pick_manifest(zf.namelist(), where)
                    _manifest_size(zf.getinfo(member).file_size, where)
                    return zf.read(member).decode("utf-8")
            except _ZIP_ERRORS as exc:
                raise BadInput(f"{where}: not a readable {'wheel' if kind == 'wheel' else 'zip'}: "
                               f"{_one_line(exc)}") from None
    except UnicodeDecodeError:
        raise BadInput(f"{where}: manifest.yaml is not UTF-8 text") from None
    raise BadInput(f"{where}: not a plugin (expected a directory, .tar.gz, .whl or .zip with a manifest.yaml)")


def _manifest_size(size: int, where: str) -> None:
    if size > MAX_MANIFEST_BYTES:
        raise BadInput(f"{where}: manifest.yaml is larger than {MAX_MANIFEST_BYTES >> 20} MiB")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _read_dir_manifest(src: Path) -> str:
    from ..files import yamlio

    path = src / MANIFEST_NAME
    try:
        return yamlio.read_text(path)
    except FileNotFoundError:
        raise BadInput(f"{src}: no manifest.yaml in this directory") from None
    except OSError as exc:
        raise BadInput(describe_os_error(exc)) from None


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
    root = dest / "p"
    if kind == "dir":
        _unpack(src, root, lambda staging: _fill_from_dir(src, staging))
        return root
    if kind == "tar":
        _unpack(src, root, lambda staging: _fill_from_tar(src, staging))
    elif kind in ("wheel", "zip"):
        _unpack(src, root, lambda staging: _fill_from_zip(src, staging, kind))
    else:
        raise BadInput(f"{src}: not a plugin (expected a directory, .tar.gz, .whl or .zip)")
    if (root / MANIFEST_NAME).is_file():
        return root
    subdirs = [p for p in root.iterdir() if p.is_dir() and not p.is_symlink()
               and (p / MANIFEST_NAME).is_file()]
    if len(subdirs) == 1:
        return subdirs[0]
    raise BadInput(f"{src}: no manifest.yaml at the top of the archive")


def _fill_from_dir(src: Path, staging: _Staging) -> None:
    """A source directory, read with lstat: regular files, directories and symlinks only."""
    try:
        _walk_dir(src, staging)
    except OSError as exc:  # an unreadable file or directory in the source
        raise BadInput(f"{src}: {describe_os_error(exc)}") from None


def _walk_dir(src: Path, staging: _Staging) -> None:
    pending = [""]
    while pending:
        rel = pending.pop()
        with os.scandir(src / rel if rel else src) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                name = f"{rel}/{entry.name}" if rel else entry.name
                if entry.name in IGNORED_IN_DIRS or entry.name.endswith(".pyc"):
                    continue
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(info.st_mode):
                    staging.symlink(name, os.readlink(entry.path))
                elif stat.S_ISDIR(info.st_mode):
                    staging.directory(name)
                    pending.append(name)
                elif stat.S_ISREG(info.st_mode):
                    fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
                    with os.fdopen(fd, "rb") as source:
                        if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
                            raise BadInput(f"{src}: refusing {name}: it changed into a non-regular file")
                        staging.file(name, source, info.st_mode)
                else:
                    raise BadInput(f"{src}: refusing {_type_name(info.st_mode)} in the plugin directory: {name}")


def _fill_from_tar(src: Path, staging: _Staging) -> None:
    where = str(src)
    try:
        with tarfile.open(src, "r:gz") as tar:
            for member in tar:
                if member.isdir():
                    staging.directory(member.name)
                elif member.isfile():
                    with tar.extractfile(member) as source:
                        staging.file(member.name, source, member.mode)
                elif member.issym():
                    staging.symlink(member.name, member.linkname)
                else:
                    # Hard links, devices and FIFOs have no business in a plugin.
                    _member_parts(member.name, where)
                    raise BadInput(f"{where}: refusing archive member of unsupported type "
                                   f"({_tar_type(member)}): {member.name!r}")
    except _TAR_ERRORS as exc:
        raise BadInput(f"{where}: not a readable .tar.gz: {_one_line(exc)}") from None


def _fill_from_zip(src: Path, staging: _Staging, kind: str) -> None:
    where = str(src)
    try:
        with zipfile.ZipFile(src) as zf:
            infos = zf.infolist()
            if len(infos) > MAX_MEMBERS:
                raise BadInput(f"{where}: more than {MAX_MEMBERS} members")
            for info in infos:
                mode = info.external_attr >> 16
                kind_bits = stat.S_IFMT(mode)
                if stat.S_ISLNK(mode):
                    _member_parts(info.filename, where)
                    raise BadInput(f"{where}: refusing symlink in a {kind}: {info.filename!r}")
                if info.is_dir() or stat.S_ISDIR(mode):
                    staging.directory(info.filename)
                elif kind_bits in (0, stat.S_IFREG):
                    with zf.open(info) as source:
                        staging.file(info.filename, source, 0o755 if mode & 0o111 else 0o644)
                else:
                    _member_parts(info.filename, where)
                    raise BadInput(f"{where}: refusing archive member of unsupported type "
                                   f"({_type_name(mode)}): {info.filename!r}")
    except _ZIP_ERRORS as exc:
        raise BadInput(f"{where}: not a readable {kind}: {_one_line(exc)}") from None


def _tar_type(member) -> str:
    if member.islnk():
        return "hard link"
    if member.ischr() or member.isblk():
        return "device"
    if member.isfifo():
        return "fifo"
    return f"type {member.type!r}"


def _type_name(mode: int) -> str:
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    return f"file type {stat.S_IFMT(mode):o}"


def source_dirs(extra: str | None = None) -> list:
    """--from DIR first, then SEEDANCE_PLUGIN_PATH (colon-separated).  When that variable
    is unset, the built-in examples `make install` built (seedance.plugins.resolve) are the
    default source, so the README's workflow runs from a fresh clone; setting
    it, even empty, replaces them."""
    dirs = []
    if extra:
        dirs.append(Path(extra))
    if "SEEDANCE_PLUGIN_PATH" not in os.environ:
        from .resolve import builtin_source_dir
        builtin = builtin_source_dir()
        return dirs + ([builtin] if builtin is not None else [])
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
