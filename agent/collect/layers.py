"""A container image's root filesystem, built from its layers without following a link.

The layers are applied in order to a tree held in memory (``Tree``), with the OCI image
spec's whiteouts: ``.wh.NAME`` removes NAME from the layers below, ``.wh..wh..opq`` hides
everything the layers below put in its directory.  Each entry remembers the digest of the
layer that brought it in, and each removal the layer that removed it.

File contents go into a private staging directory (0700, under $TMPDIR): every ELF object,
every file under /etc, and the first bytes of the rest (enough for ld.so's header checks
and a script's #! line).  ``materialize`` then lays the tree out there, as the plugin
extractor (plugins/archive.py) unpacks: nothing written outside it, no device node or FIFO
made (they are counted and left out), setuid/setgid/sticky bits dropped, hard links only to
a file already in the tree.  Symlinks stay symlinks, but each is re-rooted: its target is
resolved inside the tree, as the kernel would inside the container's root (an absolute
target starts at the image's /, '..' stops there, 40 links at most: ELOOP), and written as
the relative path to that place.  Whatever later follows a link in the staging directory
(the resolver's stat, an open) therefore lands inside it and never on a host file.

``from_directory`` reads an unpacked root (check --root) into the same tree with lstat, and
its files are offered to the staging directory as links to the file itself: a regular file
lstat saw, never a link of the root followed out of it.

Caps (docs/containers.md, "Images"), each overridable by its environment variable so a test
can reach its edge cheaply; going over one is a BadInput naming the cap.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import stat
import tarfile
import tempfile
import zlib

from ..model.errors import BadInput

MAX_TOTAL_BYTES = 16 << 30   # all regular files of all layers, uncompressed
MAX_FILE_BYTES = 4 << 30     # one file
MAX_ENTRIES = 500_000        # tar members of all layers (whiteouts and directories included)
MAX_HEADER_BYTES = 8 << 20   # one pax/GNU long-name header (tarfile reads it whole)
MAX_LINK_FOLLOWS = 40        # the kernel's MAXSYMLINKS: ELOOP after 40 links in one lookup
KEEP_PREFIX = 4096           # bytes kept of a file that is neither ELF nor under /etc
_CHUNK = 1 << 20
ELF_MAGIC = b"\x7fELF"
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


def cap(name: str, default: int) -> int:
    """A cap, from SEEDANCE_IMAGE_<NAME> when set (tests put the edge where it is cheap)."""
    text = os.environ.get("SEEDANCE_IMAGE_" + name)
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadInput(f"SEEDANCE_IMAGE_{name}: not a number: {text!r}") from None
    if value <= 0:
        raise BadInput(f"SEEDANCE_IMAGE_{name}: must be positive")
    return value


class Caps:
    def __init__(self):
        self.total = cap("MAX_TOTAL_BYTES", MAX_TOTAL_BYTES)
        self.file = cap("MAX_FILE_BYTES", MAX_FILE_BYTES)
        self.entries = cap("MAX_ENTRIES", MAX_ENTRIES)


class SymlinkLoop(Exception):
    pass


# --- the tree --------------------------------------------------------------------------------
class Node:
    __slots__ = ("kind", "layer", "mode", "children", "target", "blob", "size")

    def __init__(self, kind: str, layer: str, mode: int = 0o755):
        self.kind = kind  # "dir", "file", "link"
        self.layer = layer  # digest of the layer that brought it in
        self.mode = mode
        self.children = {} if kind == "dir" else None
        self.target = None  # a link's target, as stored
        self.blob = None  # a file's _Blob
        self.size = 0


class _Blob:
    """A file's bytes in the staging directory, shared by its hard links."""
    __slots__ = ("path", "refs", "external")

    def __init__(self, path: str, external: bool = False):
        self.path = path
        self.refs = 1
        self.external = external  # check --root: the root's own file, never removed


def _parts(path: str) -> list:
    return [p for p in path.split("/") if p not in ("", ".")]


class Tree:
    def __init__(self, staging: str | None = None):
        self.root = Node("dir", "", 0o755)
        self.staging = staging  # where blobs are written (image) or None (check --root)
        self.removed: dict = {}  # image path -> digest of the layer whose whiteout removed it
        self.skipped_special = 0  # devices, FIFOs, sockets: never made
        self.order: dict = {}  # layer digest -> its place in the stack (an opaque whiteout hides lower ones)
        self._blobs = 0

    # lookups, inside the tree ------------------------------------------------------------
    def lookup(self, path: str, follow_last: bool = True) -> tuple:
        """(canonical path, node or None) of ``path`` resolved inside the tree as the kernel
        would resolve it in the container's root; a missing component ends the walk and the
        rest is kept as written.  SymlinkLoop past MAX_LINK_FOLLOWS links."""
        pending = _parts(path)
        pending.reverse()
        stack: list = []  # (name, node) from the root down
        node = self.root
        follows = 0
        while pending:
            name = pending.pop()
            if name == "..":
                if stack:
                    stack.pop()
                node = stack[-1][1] if stack else self.root
                continue
            child = node.children.get(name) if node is not None and node.kind == "dir" else None
            if child is not None and child.kind == "link" and (pending or follow_last):
                follows += 1
                if follows > MAX_LINK_FOLLOWS:
                    raise SymlinkLoop(path)
                target = child.target or ""
                if target.startswith("/"):
                    stack, node = [], self.root
                parts = _parts(target)
                parts.reverse()
                pending.extend(parts)
                continue
            if child is None or (child.kind != "dir" and pending):
                # missing, or a file used as a directory: the rest is lexical (ENOENT/ENOTDIR)
                rest = [name] + list(reversed(pending))
                names = [n for n, _ in stack]
                for part in rest:
                    if part == "..":
                        if names:
                            names.pop()
                    else:
                        names.append(part)
                return "/" + "/".join(names), None
            stack.append((name, child))
            node = child
        return "/" + "/".join(n for n, _ in stack), node

    def node_at(self, path: str):
        """The node at a canonical path (no link followed), or None."""
        node = self.root
        for name in _parts(path):
            if node is None or node.kind != "dir":
                return None
            node = node.children.get(name)
        return node

    def walk(self):
        """(canonical path, node) of every entry, parents before children."""
        pending = [("", self.root)]
        while pending:
            prefix, node = pending.pop()
            for name in sorted(node.children, reverse=True):
                child = node.children[name]
                path = f"{prefix}/{name}"
                yield path, child
                if child.kind == "dir":
                    pending.append((path, child))

    # changes ----------------------------------------------------------------------------
    def _parent(self, parts: list, layer: str, where: str, name: str) -> Node:
        """The directory that holds parts[-1], its own parents resolved inside the tree (a
        layer may write lib/x where /lib is a link to usr/lib), made as needed."""
        directory = "/" + "/".join(parts[:-1])
        try:
            canonical, node = self.lookup(directory)
        except SymlinkLoop:
            raise BadInput(f"{where}: symlink loop above layer entry {name!r}") from None
        if node is not None:
            if node.kind != "dir":
                raise BadInput(f"{where}: layer entry {name!r} is under a file, not a directory")
            return node
        node = self.root
        for part in _parts(canonical):
            child = node.children.get(part)
            if child is None:
                child = node.children[part] = Node("dir", layer)
            elif child.kind != "dir":
                raise BadInput(f"{where}: layer entry {name!r} is under a file, not a directory")
            node = child
        return node

    def _drop(self, node: Node) -> None:
        """Release the blobs under a removed node."""
        pending = [node]
        while pending:
            current = pending.pop()
            if current.kind == "dir":
                pending.extend(current.children.values())
            elif current.blob is not None:
                current.blob.refs -= 1
                if current.blob.refs == 0 and not current.blob.external:
                    try:
                        os.unlink(current.blob.path)
                    except OSError:
                        pass

    def put(self, parts: list, node: Node, where: str, name: str) -> None:
        parent = self._parent(parts, node.layer, where, name)
        old = parent.children.get(parts[-1])
        if old is not None:
            if old.kind == "dir" and node.kind == "dir":
                old.mode, old.layer = node.mode, node.layer  # a directory restated keeps its content
                return
            self._drop(old)
        parent.children[parts[-1]] = node

    def whiteout(self, parts: list, layer: str, where: str, name: str, index: int) -> None:
        base = parts[-1]
        parent = self._parent(parts, layer, where, name)
        prefix = "/" + "/".join(parts[:-1])
        if base == OPAQUE:
            for child_name in list(parent.children):
                child = parent.children[child_name]
                if self.order.get(child.layer, -1) < index:
                    self._note_removed(f"{prefix.rstrip('/')}/{child_name}", child, layer)
                    self._drop(child)
                    del parent.children[child_name]
            return
        victim = base[len(WHITEOUT):]
        if not victim or victim in (".", ".."):
            raise BadInput(f"{where}: malformed whiteout {name!r}")
        child = parent.children.pop(victim, None)
        if child is not None:
            self._note_removed(f"{prefix.rstrip('/')}/{victim}", child, layer)
            self._drop(child)

    def _note_removed(self, path: str, node: Node, layer: str) -> None:
        if node.kind == "dir":
            for sub, _child in _walk_from(path, node):
                self.removed[sub] = layer
        self.removed[path] = layer

    def new_blob(self) -> tuple:
        self._blobs += 1
        path = os.path.join(self.staging, "blobs", str(self._blobs))
        return path, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def _walk_from(prefix: str, node: Node):
    pending = [(prefix, node)]
    while pending:
        base, current = pending.pop()
        for name, child in current.children.items():
            path = f"{base}/{name}"
            yield path, child
            if child.kind == "dir":
                pending.append((path, child))


# --- reading one layer -----------------------------------------------------------------------
class _Budget:
    def __init__(self, caps: Caps, where: str):
        self.caps = caps
        self.where = where
        self.entries = 0
        self.total = 0

    def entry(self) -> None:
        self.entries += 1
        if self.entries > self.caps.entries:
            raise BadInput(f"{self.where}: more than {self.caps.entries} entries in the layers "
                           "(cap: entries)")

    def file(self, name: str, size: int) -> None:
        if size > self.caps.file:
            raise BadInput(f"{self.where}: layer entry {name!r} is {size} bytes, over {self.caps.file} "
                           "(cap: bytes per file)")
        self.total += size
        if self.total > self.caps.total:
            raise BadInput(f"{self.where}: the layers unpack to more than {self.caps.total} bytes "
                           "(cap: total bytes)")


class _Decoded:
    """The layer's uncompressed bytes, read forward only: hashed as they pass (its diff_id),
    a seek only forward (tarfile's skip over a member), and no single read larger than
    MAX_HEADER_BYTES + a chunk (tarfile reads a pax or GNU long-name header whole)."""

    def __init__(self, raw, media_type: str, where: str):
        self.raw = raw
        self.where = where
        self.position = 0
        self.hasher = hashlib.sha256()
        head = raw.read(4)
        self._pending = head
        if head[:2] == b"\x1f\x8b":
            self.codec = "gzip"
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif head == b"\x28\xb5\x2f\xfd":
            import zstandard

            self.codec = "zstd"
            # a frame may ask for a window up to 2 GiB; libzstd's default limit (128 MiB)
            # bounds the memory one layer can take
            self._decoder = zstandard.ZstdDecompressor().decompressobj()
        else:
            self.codec = "none"
            self._decoder = None
        # a bytearray: ld.so-sized reads taken off its front are O(1) (CPython moves the
        # start), where slicing a bytes buffer copied the rest of it on every read
        self._out = bytearray()
        self._eof = False

    def _fill(self, want: int) -> None:
        while len(self._out) < want and not self._eof:
            data = self._pending or self.raw.read(64 << 10)
            self._pending = b""
            if not data:
                self._eof = True
                if self._decoder is not None and self.codec == "gzip" and not self._decoder.eof:
                    raise EOFError("compressed layer ends early")
                break
            if self._decoder is None:
                self._out += data
                continue
            if self.codec == "gzip":
                if self._decoder.eof:  # a second gzip member (concatenated): tar ignores it
                    unused = self._decoder.unused_data + data
                    self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
                    data = unused
                # at most 4 MiB per call: a small piece of a bomb never expands at once
                out = self._decoder.decompress(data, 4 << 20)
                while self._decoder.unconsumed_tail and len(self._out) + len(out) < want + (4 << 20):
                    out += self._decoder.decompress(self._decoder.unconsumed_tail, 4 << 20)
                if self._decoder.unconsumed_tail:
                    self._pending = self._decoder.unconsumed_tail
                self._out += out
            else:
                self._out += self._decoder.decompress(data)

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > MAX_HEADER_BYTES:
            raise BadInput(f"{self.where}: a tar header of the layer is larger than "
                           f"{MAX_HEADER_BYTES} bytes (cap: header bytes)")
        self._fill(size)
        data = bytes(self._out[:size])
        del self._out[:size]
        self.position += len(data)
        self.hasher.update(data)
        return data

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 1:
            offset += self.position
        if offset < self.position:
            raise OSError("layer stream cannot seek back")
        while self.position < offset:
            if not self.read(min(offset - self.position, _CHUNK)):
                break
        return self.position

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass


def apply_layer(tree: Tree, layer, index: int, budget: _Budget, where: str) -> None:
    """Apply one layer's tar to the tree; check its uncompressed digest when known."""
    tree.order.setdefault(layer.digest, index)
    handle = layer.open()
    if handle is None:
        raise BadInput(f"{where}: missing blob {layer.digest}")
    shown = f"{where}: layer {layer.digest}"
    try:
        with handle:
            stream = _Decoded(handle, layer.media_type, shown)
            tar = tarfile.open(fileobj=stream, mode="r:")
            while True:
                member = tar.next()
                if member is None:
                    break
                tar.members.clear()  # one member in memory at a time
                budget.entry()
                _apply_member(tree, tar, member, layer.digest, index, budget, shown)
            stream.drain()  # tar's end blocks and padding: part of the digest
    except BadInput:
        raise
    except (tarfile.TarError, EOFError, zlib.error, OSError, ValueError, gzip.BadGzipFile) as exc:
        raise BadInput(f"{shown}: damaged layer ({_one_line(exc)})") from None
    except Exception as exc:  # zstandard.ZstdError and kin
        if type(exc).__module__.startswith("zstandard") or type(exc).__name__ == "ZstdError":
            raise BadInput(f"{shown}: damaged layer ({_one_line(exc)})") from None
        raise
    if layer.diff_id is not None:
        actual = "sha256:" + stream.hasher.hexdigest()
        if actual != layer.diff_id:
            raise BadInput(f"{shown}: uncompressed content does not match its diff_id {layer.diff_id} "
                           f"(sha256 is {actual})")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _member_parts(name: str, where: str) -> list:
    if "\0" in name:
        raise BadInput(f"{where}: refusing layer entry with a NUL in its name: {name!r}")
    parts = _parts(name)
    if ".." in parts:
        raise BadInput(f"{where}: refusing layer entry that climbs out with '..': {name!r}")
    return parts


def _apply_member(tree: Tree, tar, member, digest: str, index: int, budget: _Budget, where: str) -> None:
    # absolute names are taken as relative to the image root, as the engines apply them
    parts = _member_parts(member.name, where)
    if not parts:
        return  # the root directory itself
    base = parts[-1]
    if base.startswith(WHITEOUT):
        tree.whiteout(parts, digest, where, member.name, index)
        return
    if member.isdir():
        tree.put(parts, Node("dir", digest, member.mode & 0o755), where, member.name)
    elif member.issym():
        node = Node("link", digest, 0o777)
        node.target = member.linkname
        if "\0" in member.linkname:
            raise BadInput(f"{where}: refusing symlink with a NUL in its target: {member.name!r}")
        tree.put(parts, node, where, member.name)
    elif member.islnk():
        target_parts = _member_parts(member.linkname, where)
        try:
            _canonical, target = tree.lookup("/" + "/".join(target_parts), follow_last=False)
        except SymlinkLoop:
            target = None
        if target is None or target.kind != "file":
            raise BadInput(f"{where}: refusing hard link to a file not in the image: "
                           f"{member.name!r} -> {member.linkname!r}")
        node = Node("file", digest, target.mode)
        node.blob, node.size = target.blob, target.size
        target.blob.refs += 1
        tree.put(parts, node, where, member.name)
    elif member.isreg():
        budget.file(member.name, member.size)
        node = Node("file", digest, member.mode & 0o755)
        node.size = member.size
        path, fd = tree.new_blob()
        node.blob = _Blob(path)
        try:
            _copy(tar.extractfile(member), fd, keep_all=parts[0] == "etc", where=where, name=member.name)
        finally:
            os.close(fd)
        tree.put(parts, node, where, member.name)
    else:
        tree.skipped_special += 1  # a device node, FIFO or socket is never made


def _copy(source, fd: int, keep_all: bool, where: str, name: str) -> None:
    """An ELF object or a file under /etc whole; of the rest the first KEEP_PREFIX bytes
    (ld.so's header checks and a #! line need no more), the remainder read for the digest."""
    first = source.read(_CHUNK)
    keep = keep_all or first[:4] == ELF_MAGIC
    _write(fd, first if keep else first[:KEEP_PREFIX], where, name)
    while True:
        chunk = source.read(_CHUNK)
        if not chunk:
            break
        if keep:
            _write(fd, chunk, where, name)


def _write(fd: int, data: bytes, where: str, name: str) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        raise BadInput(f"{where}: cannot stage {name!r}: {(exc.strerror or str(exc)).lower()}") from None


# --- an unpacked root (check --root) ---------------------------------------------------------
def from_directory(root: str, caps: Caps) -> Tree:
    """The tree of an unpacked root, read with lstat: no link of it is followed."""
    tree = Tree()
    budget = _Budget(caps, root)
    pending = [("", tree.root)]
    while pending:
        rel, node = pending.pop()
        try:
            with os.scandir(os.path.join(root, rel) if rel else root) as entries:
                listed = list(entries)
        except OSError as exc:
            raise BadInput(f"{root}: cannot list /{rel}: {(exc.strerror or str(exc)).lower()}") from None
        for entry in listed:
            budget.entry()
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            path = f"{rel}/{entry.name}" if rel else entry.name
            if stat.S_ISDIR(info.st_mode):
                child = Node("dir", "", info.st_mode & 0o755)
                pending.append((path, child))
            elif stat.S_ISLNK(info.st_mode):
                child = Node("link", "", 0o777)
                try:
                    child.target = os.readlink(entry.path)
                except OSError:
                    continue
            elif stat.S_ISREG(info.st_mode):
                child = Node("file", "", info.st_mode & 0o755)
                child.size = info.st_size
                child.blob = _Blob(os.path.abspath(entry.path), external=True)
            else:
                tree.skipped_special += 1
                continue
            node.children[entry.name] = child
    return tree


# --- laying the tree out ---------------------------------------------------------------------
SHM = "/dev/shm"


def staging_parent(expected_bytes: int = 0) -> str | None:
    """Where to stage: SEEDANCE_IMAGE_STAGING when set; else /dev/shm when it is a tmpfs
    with room for four times ``expected_bytes`` (the stored layer sizes: the ELF objects
    an image unpacks to are rarely more than that) and 1 GiB to spare, since creating and
    removing tens of thousands of entries there costs microseconds each, on a busy disk
    milliseconds; else $TMPDIR (None)."""
    chosen = os.environ.get("SEEDANCE_IMAGE_STAGING")
    if chosen:
        return chosen
    try:
        st = os.statvfs(SHM)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if not os.access(SHM, os.W_OK) or free < 4 * expected_bytes + (1 << 30):
        return None
    return SHM


def make_staging(expected_bytes: int | None = None) -> str:
    """A private directory (mkdtemp makes it 0700): for an image's layers (``expected_bytes``
    their stored size) under /dev/shm when it fits, else $TMPDIR.  An unpacked root
    (None) stays under $TMPDIR: its staged files are links to the root's own files."""
    parent = staging_parent(expected_bytes) if expected_bytes is not None else None
    try:
        path = tempfile.mkdtemp(prefix="seedance-image-", dir=parent)
    except OSError as exc:
        raise BadInput(f"cannot make a staging directory under {parent or tempfile.gettempdir()}: "
                       f"{(exc.strerror or str(exc)).lower()}") from None
    os.mkdir(os.path.join(path, "blobs"), 0o700)
    return path


def remove_staging(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def materialize(tree: Tree, dest: str, where: str) -> None:
    """Lay the tree out under ``dest`` (made here): directories, files (hard links to their
    staged bytes, or links to an unpacked root's own file), and every symlink re-rooted as
    the relative path to where it resolves inside the tree."""
    os.mkdir(dest, 0o700)
    for path, node in tree.walk():
        host = dest + path
        try:
            if node.kind == "dir":
                os.mkdir(host, 0o700)
            elif node.kind == "file":
                if node.blob.external:
                    os.symlink(node.blob.path, host)
                else:
                    os.link(node.blob.path, host, follow_symlinks=False)
                    os.chmod(host, (node.mode & 0o755) | stat.S_IRUSR | stat.S_IWUSR)
            else:
                try:
                    canonical, _target = tree.lookup(path, follow_last=True)
                except SymlinkLoop:
                    raise BadInput(f"{where}: symlink loop at {path} -> {node.target} "
                                   f"(more than {MAX_LINK_FOLLOWS} links)") from None
                parent = path.rsplit("/", 1)[0] or "/"
                os.symlink(os.path.relpath(canonical, parent), host)
        except OSError as exc:
            raise BadInput(f"{where}: cannot lay out {path!r}: {(exc.strerror or str(exc)).lower()}") from None
