"""Reading an evidence bundle back (check --from-bundle): bounded, verified, in memory.

A bundle comes from another machine and is input like any other, so the reader trusts
nothing it has not checked and stops at the first cap it meets:

  decompression  block by block, each block fed to the codec in small pieces, so one call
                 can never expand past a few MiB; every byte counted against the total cap,
                 every block against the clock; the zstd window is capped (a frame may ask
                 for 2 GiB of it);
  tar            read by this module, not tarfile: tarfile reads a pax or GNU long-name
                 header whole into memory, whatever size it claims (Lib/tarfile.py,
                 _proc_pax), so a 512-byte header could ask for gigabytes;
  members        manifest.json first; every later member must be listed in it with the same
                 size and sha256, nothing listed may be missing, and a declared size over a
                 cap is refused before one byte of it is decompressed;
  the end        the tar's end-of-archive, at most one record of zero padding, then the end
                 of the compressed stream: a complete zstd frame (whose checksum libzstd
                 verifies) or a gzip trailer (CRC-32 and length), and nothing after it;
  JSON           only the four members replay needs are kept, each at most CAPS.json_bytes,
                 ASCII as the writer makes them (json.dumps escapes the rest), their items
                 counted before parsing (a 15 KB bundle can hold 48 MiB of "{}," that would
                 parse into a gigabyte of dicts) and their depth after.

Every refusal is one BadInput line naming the cap or the check that failed (exit 2).
"""
from __future__ import annotations

import hashlib
import json
import time
import zlib
from dataclasses import dataclass

from ..model.errors import BadInput, escape_path


@dataclass(frozen=True)
class Caps:
    """The reader's caps; docs/bundle.md states each default.  Tests pass smaller ones to
    reach an edge cheaply: the defaults are what every command uses."""

    member_bytes: int = 512 << 20   # any one member: --with-binaries holds whole libraries
    json_bytes: int = 64 << 20      # a member replay parses (a real host's facts.json: ~4 MiB)
    total_bytes: int = 4 << 30      # the whole decompressed tar, headers and padding included
    members: int = 20_000           # a host of 2,000 processes holds ~6,000
    seconds: float = 60.0           # reading and parsing; a 4 GiB bundle reads in ~10 s
    json_items: int = 500_000       # all four JSON members together (a real host: ~240,000)
    json_depth: int = 32            # the deepest real fact nests 6 levels
    header_bytes: int = 64 << 10    # one pax or GNU long-name header
    zstd_window: int = 8 << 20      # bundles are written at level 10: a 4 MiB window


CAPS = Caps()
SCHEMA = "seedance.bundle/v1"
MANIFEST = "manifest.json"
NEEDED = ("manifest.json", "facts.json", "report.json", "runtime.json")
BLOCK = 512
RECORD = 20 * BLOCK  # tar pads its end to a whole record of 20 blocks (POSIX ustar)
PIECE = 512  # compressed bytes fed per codec call: zstd expands one byte to at most ~32 KiB
OUT_STEP = 1 << 20  # decompressed bytes asked of the codec (gzip) or of the tar per call
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD_SKIPPABLE = range(0x184D2A50, 0x184D2A60)


def _size(count: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift and count % (1 << shift) == 0:
            return f"{count >> shift} {unit}"
    return f"{count:,} bytes"


class _Budget:
    """What the whole read has spent: time, decompressed bytes, members, JSON items."""

    def __init__(self, shown: str, caps: Caps, clock):
        self.shown, self.caps, self.clock = shown, caps, clock
        self.deadline = clock() + caps.seconds
        self.total = self.members = self.items = 0

    def refuse(self, what: str, cap: str, value: str) -> BadInput:
        return BadInput(f"{self.shown}: {what}: over the {cap} cap of {value}; refusing it")

    def tick(self) -> None:
        if self.clock() > self.deadline:
            raise self.refuse("reading took too long", "time", f"{self.caps.seconds:g} s")

    def spend(self, count: int) -> None:
        self.total += count
        if self.total > self.caps.total_bytes:
            raise self.refuse(f"decompresses to more than {_size(self.caps.total_bytes)}", "total-size",
                              _size(self.caps.total_bytes))


class _Decompressed:
    """The tar stream of a bundle file, decompressed a piece at a time.  read(n) gives
    exactly n bytes unless the stream ends; finish() says whether it ended cleanly."""

    def __init__(self, handle, budget: _Budget):
        self.handle, self.budget = handle, budget
        head = handle.read(4)
        handle.seek(0)
        if head[:2] == b"\x1f\x8b":
            self.codec = "gzip"
        elif head == ZSTD_MAGIC or (len(head) == 4 and int.from_bytes(head, "little") in ZSTD_SKIPPABLE):
            self.codec = "zstd"
        else:
            raise BadInput(f"{budget.shown}: not a seedance bundle (neither zstd nor gzip)")
        self.pending = bytearray()
        self.input = b""  # compressed bytes read from the file, not yet fed
        self.decoder = None  # the decompressor of the current frame (zstd) or member (gzip)
        self.at_eof = False

    def read(self, count: int) -> bytes:
        while len(self.pending) < count and not self.at_eof:
            self._fill()
        data = bytes(self.pending[:count])
        del self.pending[:count]
        return data

    def finish(self) -> None:
        """After the tar's end: at most a record of zero padding, then the codec's end."""
        rest = self.read(RECORD + 1)
        if len(rest) > RECORD or rest.strip(b"\0"):
            raise BadInput(f"{self.budget.shown}: damaged bundle: data after the end of the tar archive")
        if self.decoder is not None and not self.decoder.eof:
            raise BadInput(f"{self.budget.shown}: damaged bundle: the {self.codec} stream is cut short")

    def _fill(self) -> None:
        self.budget.tick()
        if not self.input:
            self.input = self.handle.read(64 * PIECE)
            if not self.input:
                self._end_of_file()
                return
        if self.decoder is None or self.decoder.eof:
            self.decoder = self._new_decoder()
        if self.codec == "zstd":
            piece, self.input = self.input[:PIECE], self.input[PIECE:]
            out = self.decoder.decompress(piece)
        else:
            out = self.decoder.decompress(self.input, OUT_STEP)
            self.input = self.decoder.unconsumed_tail
        if self.decoder.eof:
            # the frame or member ended: what follows is the next one (a zstd file may hold
            # several frames, the first of ours a skippable one; gzip allows members too)
            self.input = self.decoder.unused_data + self.input
        self.budget.spend(len(out))
        self.pending += out

    def _new_decoder(self):
        if self.codec == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)  # the gzip wrapper: header, CRC-32, length
        import zstandard

        return zstandard.ZstdDecompressor(max_window_size=self.budget.caps.zstd_window).decompressobj()

    def _end_of_file(self) -> None:
        self.at_eof = True
        if self.decoder is None:
            raise BadInput(f"{self.budget.shown}: damaged bundle: empty file")
        if not self.decoder.eof:
            raise BadInput(f"{self.budget.shown}: damaged bundle: the {self.codec} stream is cut short")


@dataclass
class _Entry:
    name: str
    size: int


def _entries(stream: _Decompressed, budget: _Budget):
    """Each regular file of the tar as an _Entry; the caller reads its data with
    _member_data.  Pax and GNU long-name headers are capped and applied; any other kind
    (directory, link, device) is refused: a bundle of ours holds files only."""
    caps = budget.caps
    overrides: dict = {}
    while True:
        header = stream.read(BLOCK)
        if len(header) < BLOCK:
            raise BadInput(f"{budget.shown}: damaged bundle: the tar archive is cut short")
        if not header.strip(b"\0"):
            stream.finish()
            return
        kind, name, size = _parse_header(header, budget)
        # every header counts, pax and long-name ones too: else a stream of them, each under
        # the header cap, would never meet a cap but the total
        budget.members += 1
        if budget.members > caps.members:
            raise budget.refuse(f"more than {caps.members:,} tar entries", "member-count", f"{caps.members:,}")
        if kind in (b"x", b"g", b"L", b"K"):
            if size > caps.header_bytes:
                raise budget.refuse(f"a tar header of {size:,} bytes", "header-size", _size(caps.header_bytes))
            data = stream.read(_padded(size))[:size]
            if len(data) < size:
                raise BadInput(f"{budget.shown}: damaged bundle: the tar archive is cut short")
            if kind == b"x":
                overrides.update(_pax_records(data, budget))
            elif kind == b"L":
                overrides["path"] = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
            continue  # global headers and long link names change nothing a bundle uses
        if kind not in (b"0", b"\0"):
            raise BadInput(f"{budget.shown}: damaged bundle: member {escape_path(name)} is not a file")
        name = overrides.get("path", name)
        if "size" in overrides:
            try:
                size = int(overrides["size"])
            except ValueError:
                raise BadInput(f"{budget.shown}: damaged bundle: a pax size that is not a number") from None
        overrides = {}
        yield _Entry(name, size)


def _parse_header(header: bytes, budget: _Budget):
    """(type flag, name, size) of a ustar header whose checksum holds."""
    stored = _octal(header[148:156], budget)
    computed = sum(header[:148]) + 8 * 0x20 + sum(header[156:])
    if stored != computed:
        raise BadInput(f"{budget.shown}: damaged bundle: a tar header's checksum does not match")
    name = header[:100].split(b"\0", 1)[0]
    if header[257:263] in (b"ustar\0", b"ustar ") and header[345] != 0:
        name = header[345:500].split(b"\0", 1)[0] + b"/" + name
    raw_size = header[124:136]
    if raw_size[0] & 0x80:  # base-256, for sizes past 8 GiB (GNU and POSIX 2001)
        size = int.from_bytes(raw_size[1:], "big")
    else:
        size = _octal(raw_size, budget)
    return header[156:157], name.decode("utf-8", "surrogateescape"), size


def _octal(field: bytes, budget: _Budget) -> int:
    text = field.replace(b"\0", b" ").strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise BadInput(f"{budget.shown}: damaged bundle: a tar header field is not a number") from None


def _pax_records(data: bytes, budget: _Budget) -> dict:
    """'LENGTH key=value\\n' records (POSIX pax): the path and size a bundle needs."""
    records, index = {}, 0
    while index < len(data):
        space = data.find(b" ", index)
        try:
            length = int(data[index:space])
            key, _, value = data[space + 1:index + length - 1].partition(b"=")
        except ValueError:
            raise BadInput(f"{budget.shown}: damaged bundle: a pax header is malformed") from None
        if length <= 0 or space < 0 or index + length > len(data):
            raise BadInput(f"{budget.shown}: damaged bundle: a pax header is malformed")
        records[key.decode("ascii", "replace")] = value.decode("utf-8", "surrogateescape")
        index += length
    return records


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _member_data(stream: _Decompressed, entry: _Entry, keep: bool, budget: _Budget):
    """Reads a member to its end through sha256; returns (hex digest, bytearray or None).
    Only a member that is kept is held, in a buffer of its exact size."""
    digest = hashlib.sha256()
    kept = bytearray(entry.size) if keep else None
    done = 0
    while done < entry.size:
        chunk = stream.read(min(OUT_STEP, entry.size - done))
        if not chunk:
            raise BadInput(f"{budget.shown}: damaged bundle: member {escape_path(entry.name)} is cut short")
        digest.update(chunk)
        if kept is not None:
            kept[done:done + len(chunk)] = chunk
        done += len(chunk)
    padding = _padded(entry.size) - entry.size
    if padding and len(stream.read(padding)) < padding:
        raise BadInput(f"{budget.shown}: damaged bundle: the tar archive is cut short")
    return digest.hexdigest(), kept


def parse_json(data: bytearray, name: str, budget: _Budget):
    """A JSON member, bounded: ASCII only, items counted before parsing, depth after.
    Frees ``data`` as soon as the text is made, so raw and parsed never both stay."""
    caps = budget.caps
    if not data.isascii():
        raise BadInput(f"{budget.shown}: damaged bundle: {name} is not ASCII JSON (the writer escapes "
                       f"every other character)")
    # every value but the first follows a comma or opens a container: an upper bound on
    # the objects the parse would make, known without making them
    items = data.count(b",") + data.count(b"[") + data.count(b"{") + 1
    budget.items += items
    if budget.items > caps.json_items:
        raise budget.refuse(f"{name} holds more than {caps.json_items:,} JSON items (with the members "
                            f"before it)", "JSON items", f"{caps.json_items:,}")
    text = data.decode("ascii")
    data.clear()
    try:
        value = json.loads(text)
    except RecursionError:
        raise _too_deep(name, budget) from None
    except ValueError as exc:
        raise BadInput(f"{budget.shown}: damaged bundle: {str(exc).splitlines()[0]}") from None
    del text
    if _depth(value, caps.json_depth) > caps.json_depth:
        raise _too_deep(name, budget)
    budget.tick()
    return value


def _too_deep(name: str, budget: _Budget) -> BadInput:
    depth = budget.caps.json_depth
    return budget.refuse(f"{name} nests deeper than {depth} levels", "JSON depth", str(depth))


def _depth(value, cap: int) -> int:
    """The nesting depth of a parsed document (a scalar is 0), walked a level at a time
    without recursion, and given up past ``cap``."""
    level = [value] if type(value) in (dict, list) else []
    depth = 0
    while level and depth <= cap:
        depth += 1
        deeper = []
        for node in level:
            deeper += [child for child in (node.values() if type(node) is dict else node)
                       if type(child) in (dict, list)]
        level = deeper
    return depth


def _listing(manifest, budget: _Budget) -> dict:
    """The manifest's members as name -> (size, sha256), with the caps applied to what it
    declares, so an oversized bundle is refused before its members are read."""
    caps = budget.caps
    listed = manifest.get("members") if isinstance(manifest, dict) else None
    if not isinstance(listed, list):
        raise BadInput(f"{budget.shown}: damaged bundle: the manifest lists no members")
    if len(listed) + 1 > caps.members:
        raise budget.refuse(f"the manifest lists {len(listed):,} members", "member-count", f"{caps.members:,}")
    out, total = {}, 0
    for item in listed:
        try:
            name, size, sha = item["name"], item["size"], item["sha256"]
        except (KeyError, TypeError):
            raise BadInput(f"{budget.shown}: damaged bundle: a manifest entry without name, size or sha256") from None
        if not (isinstance(name, str) and type(size) is int and size >= 0 and isinstance(sha, str)
                and len(sha) == 64) or name in out or name == MANIFEST:
            raise BadInput(f"{budget.shown}: damaged bundle: a manifest entry is malformed or repeated")
        _check_size(name, size, budget)
        total += size
        out[name] = (size, sha)
    if total > caps.total_bytes:
        raise budget.refuse(f"the manifest declares {total:,} bytes of members", "total-size",
                            _size(caps.total_bytes))
    return out


def _check_size(name: str, size: int, budget: _Budget) -> None:
    caps = budget.caps
    shown = escape_path(name)
    if size > caps.member_bytes:
        raise budget.refuse(f"member {shown} is {size:,} bytes", "member-size", _size(caps.member_bytes))
    if name in NEEDED and size > caps.json_bytes:
        raise budget.refuse(f"member {shown} is {size:,} bytes", "JSON member-size", _size(caps.json_bytes))


def read_members(path: str, caps: Caps = CAPS, clock=None, keep=None) -> dict:
    """The parsed JSON of the members replay needs (``keep``: name -> function applied to
    the parsed value, so a large one can be cut down before the next is read), after
    verifying the whole bundle.  BadInput, one line, otherwise."""
    shown = escape_path(path)
    keep = keep or {}
    budget = _Budget(shown, caps, clock or time.monotonic)
    try:
        handle = open(path, "rb")
    except OSError as exc:
        from ..model.errors import describe_os_error

        raise BadInput(describe_os_error(exc)) from None
    with handle:
        try:
            return _read(_Decompressed(handle, budget), budget, keep)
        except BadInput:
            raise
        except MemoryError:
            raise BadInput(f"{shown}: not enough memory to read this bundle") from None
        except Exception as exc:  # zstd and zlib say "damaged" in their own words
            why = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
            raise BadInput(f"{shown}: damaged bundle: {why}") from None


def _read(stream: _Decompressed, budget: _Budget, keep: dict) -> dict:
    found: dict = {}
    listed = None
    seen: set = set()
    for entry in _entries(stream, budget):
        shown_name = escape_path(entry.name)
        _check_size(entry.name, entry.size, budget)  # a cap first: it says more than the rest
        if listed is None:
            if entry.name != MANIFEST:
                raise BadInput(f"{budget.shown}: not a seedance bundle (its first member is not {MANIFEST})")
            _digest, data = _member_data(stream, entry, True, budget)
            found[MANIFEST] = manifest = parse_json(data, MANIFEST, budget)
            if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
                raise BadInput(f"{budget.shown}: not a seedance bundle (manifest schema is not {SCHEMA})")
            listed = _listing(manifest, budget)
            continue
        if entry.name not in listed or entry.name in seen:
            why = "listed twice" if entry.name in seen else "not listed in the manifest"
            raise BadInput(f"{budget.shown}: damaged bundle: member {shown_name} is {why}")
        size, sha = listed[entry.name]
        if entry.size != size:
            raise BadInput(f"{budget.shown}: damaged bundle: member {shown_name} is {entry.size:,} bytes, "
                           f"the manifest says {size:,}")
        seen.add(entry.name)
        wanted = entry.name in NEEDED
        digest, data = _member_data(stream, entry, wanted, budget)
        if digest != sha:
            raise BadInput(f"{budget.shown}: damaged bundle: member {shown_name} does not match its "
                           f"sha256 in the manifest")
        if wanted:
            value = parse_json(data, entry.name, budget)
            found[entry.name] = keep.get(entry.name, _same)(value)
    if listed is None:
        raise BadInput(f"{budget.shown}: not a seedance bundle (an empty tar archive)")
    missing = [name for name in listed if name not in seen]
    if missing:
        raise BadInput(f"{budget.shown}: damaged bundle: member {escape_path(missing[0])} is listed in the "
                       f"manifest but missing" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return found


def _same(value):
    return value
