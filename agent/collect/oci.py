"""Reading a container image: an OCI image layout directory, an oci-archive tar or a
docker-archive tar, down to its config and its layers in order.

Every blob is checked against its digest before it is used: the index, the manifest, the
config and each layer (sha256 of the bytes as stored, as the OCI image spec's descriptors
say; a docker-archive names its config by digest and lists each layer's uncompressed
digest in the config's rootfs.diff_ids, which layers.py checks as it reads the layer).
Nothing here decompresses a layer: that is layers.py.

Reads only; never runs anything from the image.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tarfile

from ..model.errors import BadInput

# JSON documents (index, manifest, config, docker manifest.json) are small: a real config
# with its history is a few KiB.  A 4 MiB cap keeps a forged one from filling memory.
MAX_JSON_BYTES = 4 << 20
# members of an oci-archive / docker-archive tar (blobs and the few JSON files); a tar with
# more is not an image
MAX_ARCHIVE_MEMBERS = 100_000
_CHUNK = 1 << 20
_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")

INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")


class Layer:
    """One layer: its digest as the manifest names it, its media type, its expected
    uncompressed digest (diff_id, when the config lists one) and how to open its bytes."""

    def __init__(self, digest: str, media_type: str, size: int | None, diff_id: str | None, opener):
        self.digest = digest
        self.media_type = media_type
        self.size = size
        self.diff_id = diff_id
        self.open = opener


class Image:
    def __init__(self, where: str, config: dict, layers: list, platform: str, kind: str):
        self.where = where
        self.config = config
        self.layers = layers
        self.platform = platform
        self.kind = kind  # "oci-layout", "oci-archive" or "docker-archive"

    @property
    def env(self) -> dict:
        env = {}
        for item in (self.config.get("config") or {}).get("Env") or []:
            if isinstance(item, str) and "=" in item:
                name, _, value = item.partition("=")
                env[name] = value
        return env

    @property
    def command(self) -> list:
        """Entrypoint + Cmd, as the engine starts it (Cmd alone when there is no Entrypoint)."""
        config = self.config.get("config") or {}
        entry = config.get("Entrypoint") or []
        cmd = config.get("Cmd") or []
        words = [w for w in list(entry) + list(cmd) if isinstance(w, str)]
        return words


def _lines(text) -> str:
    return " ".join(str(text).split()) or "damaged"


# --- where the blobs are ---------------------------------------------------------------------
class _DirStore:
    """An OCI image layout directory; every file is opened without following a symlink in
    its last component and must be a regular file."""

    def __init__(self, root: str):
        self.root = root

    def open(self, name: str):
        parts = [p for p in name.split("/") if p]
        if not parts or ".." in parts:
            raise BadInput(f"{self.root}: refusing blob name {name!r}")
        path = os.path.join(self.root, *parts)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise BadInput(f"{self.root}: cannot read {name}: {(exc.strerror or str(exc)).lower()}") from None
        handle = os.fdopen(fd, "rb")
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            handle.close()
            raise BadInput(f"{self.root}: {name} is not a regular file")
        return handle

    def close(self):
        pass


class _TarStore:
    """An oci-archive or docker-archive: a plain tar whose members are blobs and JSON files.
    Only regular members are offered; the index of members is headers only."""

    def __init__(self, path: str):
        self.path = path
        try:
            self.tar = tarfile.open(path, "r:")  # uncompressed, as podman and skopeo write it
        except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
            raise BadInput(f"{path}: not a readable image archive: {_lines(exc)}") from None
        self.members = {}
        try:
            for count, member in enumerate(self.tar, 1):
                if count > MAX_ARCHIVE_MEMBERS:
                    raise BadInput(f"{path}: more than {MAX_ARCHIVE_MEMBERS} members in the image archive "
                                   "(cap: archive members)")
                if member.isfile():
                    self.members[os.path.normpath(member.name).lstrip("/")] = member
        except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
            raise BadInput(f"{path}: damaged image archive: {_lines(exc)}") from None

    def open(self, name: str):
        member = self.members.get(os.path.normpath(name).lstrip("/"))
        if member is None:
            return None
        return self.tar.extractfile(member)

    def close(self):
        self.tar.close()


# --- digests ---------------------------------------------------------------------------------
def _hex_of(digest, where: str) -> str:
    match = _DIGEST.match(digest) if isinstance(digest, str) else None
    if match is None:
        raise BadInput(f"{where}: unsupported or malformed digest {digest!r} (sha256 only)")
    return match.group(1)


def verify_stream(handle, digest: str, where: str, what: str, size: int | None = None) -> int:
    """Read ``handle`` to its end, check its sha256 against ``digest``; the byte count."""
    expected = _hex_of(digest, where)
    hasher = hashlib.sha256()
    total = 0
    try:
        while True:
            chunk = handle.read(_CHUNK)
            if not chunk:
                break
            total += len(chunk)
            hasher.update(chunk)
    except (OSError, EOFError, tarfile.TarError) as exc:
        raise BadInput(f"{where}: cannot read {what} {digest}: {_lines(exc)}") from None
    if hasher.hexdigest() != expected:
        raise BadInput(f"{where}: {what} {digest} does not match its digest (sha256 is "
                       f"sha256:{hasher.hexdigest()})")
    if size is not None and total != size:
        raise BadInput(f"{where}: {what} {digest} is {total} bytes, its descriptor says {size}")
    return total


def _read_json(store, name: str, where: str, what: str, digest: str | None = None):
    handle = store.open(name)
    if handle is None:
        raise BadInput(f"{where}: missing {what} ({name})")
    with handle:
        try:
            data = handle.read(MAX_JSON_BYTES + 1)
        except (OSError, EOFError, tarfile.TarError) as exc:
            raise BadInput(f"{where}: cannot read {what}: {_lines(exc)}") from None
    if len(data) > MAX_JSON_BYTES:
        raise BadInput(f"{where}: {what} is larger than {MAX_JSON_BYTES >> 20} MiB (cap: JSON document)")
    if digest is not None:
        actual = "sha256:" + hashlib.sha256(data).hexdigest()
        _hex_of(digest, where)
        if actual != digest:
            raise BadInput(f"{where}: {what} {digest} does not match its digest (sha256 is {actual})")
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadInput(f"{where}: {what} is not JSON: {_lines(exc)}") from None
    if not isinstance(value, dict):
        raise BadInput(f"{where}: {what} is not a JSON object")
    return value


def _blob_name(digest: str, where: str) -> str:
    return "blobs/sha256/" + _hex_of(digest, where)


# --- the three shapes ------------------------------------------------------------------------
def open_image(path: str, platform: str | None = None):
    """(Image, store): the store must be closed when the layers have been read."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise BadInput(f"{path}: {(exc.strerror or str(exc)).lower()}") from None
    if stat.S_ISDIR(st.st_mode):
        store, kind = _DirStore(path), "oci-layout"
    elif stat.S_ISREG(st.st_mode):
        store, kind = _TarStore(path), None
    else:
        raise BadInput(f"{path}: not an image layout directory or an image archive")
    try:
        if kind is None:
            if store.open("index.json") is not None:
                kind = "oci-archive"
            elif store.open("manifest.json") is not None:
                kind = "docker-archive"
            else:
                raise BadInput(f"{path}: neither an oci-archive (index.json) nor a docker-archive "
                               "(manifest.json)")
        if kind == "docker-archive":
            image = _docker_archive(store, path, platform)
        else:
            image = _oci(store, path, platform, kind)
    except BaseException:
        store.close()
        raise
    return image, store


def _want(platform: str | None, where: str) -> tuple:
    text = platform or "linux/amd64"
    parts = text.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise BadInput(f"--platform: expected os/arch or os/arch/variant, not {text!r}")
    return tuple(parts)


def _platform_of(descriptor: dict) -> tuple:
    platform = descriptor.get("platform") or {}
    return (platform.get("os"), platform.get("architecture"), platform.get("variant"))


def _oci(store, where: str, platform: str | None, kind: str) -> Image:
    layout = _read_json(store, "oci-layout", where, "oci-layout file")
    if layout.get("imageLayoutVersion") != "1.0.0":
        raise BadInput(f"{where}: unsupported imageLayoutVersion {layout.get('imageLayoutVersion')!r}")
    index = _read_json(store, "index.json", where, "index.json")
    want = _want(platform, where)
    manifest, chosen = _pick_manifest(store, index, where, want, depth=0)
    config_desc = manifest.get("config") or {}
    config = _read_json(store, _blob_name(config_desc.get("digest"), where), where,
                        "config blob", digest=config_desc.get("digest"))
    diff_ids = ((config.get("rootfs") or {}).get("diff_ids")) or []
    layers = []
    descs = manifest.get("layers")
    if not isinstance(descs, list):
        raise BadInput(f"{where}: the manifest lists no layers")
    if diff_ids and len(diff_ids) != len(descs):
        raise BadInput(f"{where}: the config lists {len(diff_ids)} diff_ids for {len(descs)} layers")
    for number, desc in enumerate(descs):
        if not isinstance(desc, dict):
            raise BadInput(f"{where}: layer {number} is not a descriptor")
        digest = desc.get("digest")
        name = _blob_name(digest, where)
        if store.open(name) is None:
            raise BadInput(f"{where}: missing blob {digest} (layer {number})")
        layers.append(Layer(digest, str(desc.get("mediaType", "")), desc.get("size"),
                            diff_ids[number] if diff_ids else None,
                            lambda name=name: store.open(name)))
    return Image(where, config, layers, chosen, kind)


def _pick_manifest(store, index: dict, where: str, want: tuple, depth: int):
    if depth > 4:
        raise BadInput(f"{where}: image indexes nested too deep")
    manifests = index.get("manifests")
    if not isinstance(manifests, list) or not manifests:
        raise BadInput(f"{where}: the index lists no manifests")
    candidates = [m for m in manifests if isinstance(m, dict)]
    chosen = None
    with_platform = [m for m in candidates if m.get("platform")]
    if with_platform:
        for m in with_platform:
            os_name, arch, variant = _platform_of(m)
            if (os_name, arch) == want[:2] and (len(want) < 3 or variant == want[2]):
                chosen = m
                break
        if chosen is None and len(candidates) > len(with_platform):
            chosen = next(m for m in candidates if not m.get("platform"))
        if chosen is None:
            offered = ", ".join(sorted({"/".join(p for p in _platform_of(m) if p) for m in with_platform}))
            raise BadInput(f"{where}: no manifest for platform {'/'.join(want)} (the index has {offered})")
    else:
        chosen = candidates[0]
    digest = chosen.get("digest")
    manifest = _read_json(store, _blob_name(digest, where), where, "manifest blob", digest=digest)
    media = manifest.get("mediaType") or chosen.get("mediaType")
    if media in INDEX_TYPES or "manifests" in manifest:
        return _pick_manifest(store, manifest, where, want, depth + 1)
    return manifest, "/".join(p for p in _platform_of(chosen) if p) or "/".join(want)


def _docker_archive(store, where: str, platform: str | None) -> Image:
    # docker save / podman save --format docker-archive: manifest.json lists each image's
    # config file (named by its digest) and its layer tars, uncompressed, whose digests are
    # the config's rootfs.diff_ids
    handle = store.open("manifest.json")
    if handle is None:
        raise BadInput(f"{where}: missing manifest.json")
    with handle:
        data = handle.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        raise BadInput(f"{where}: manifest.json is larger than {MAX_JSON_BYTES >> 20} MiB (cap: JSON document)")
    try:
        entries = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadInput(f"{where}: manifest.json is not JSON: {_lines(exc)}") from None
    if not isinstance(entries, list) or not entries or not isinstance(entries[0], dict):
        raise BadInput(f"{where}: manifest.json lists no image")
    entry = entries[0]
    config_name = entry.get("Config")
    if not isinstance(config_name, str):
        raise BadInput(f"{where}: manifest.json names no config")
    base = os.path.basename(config_name)
    hex_name = base[:-5] if base.endswith(".json") else base
    config_digest = "sha256:" + hex_name if re.fullmatch(r"[0-9a-f]{64}", hex_name) else None
    if config_digest is None:
        raise BadInput(f"{where}: the config {config_name!r} is not named by its digest")
    config = _read_json(store, config_name, where, "config", digest=config_digest)
    want = _want(platform, where)
    have = (config.get("os"), config.get("architecture"))
    if platform and have != want[:2]:
        raise BadInput(f"{where}: the image is {'/'.join(str(x) for x in have)}, not {'/'.join(want)}")
    diff_ids = ((config.get("rootfs") or {}).get("diff_ids")) or []
    names = entry.get("Layers")
    if not isinstance(names, list) or len(names) != len(diff_ids):
        raise BadInput(f"{where}: manifest.json lists {len(names or [])} layers, the config "
                       f"{len(diff_ids)} diff_ids")
    layers = []
    for number, (name, diff_id) in enumerate(zip(names, diff_ids)):
        if not isinstance(name, str) or store.open(name) is None:
            raise BadInput(f"{where}: missing blob {name!r} (layer {number})")
        _hex_of(diff_id, where)
        # the layer tar is stored uncompressed: its digest is its diff_id
        layers.append(Layer(diff_id, "application/vnd.docker.image.rootfs.diff.tar", None, diff_id,
                            lambda name=name: store.open(name)))
    return Image(where, config, layers, "/".join(str(x) for x in have), "docker-archive")
