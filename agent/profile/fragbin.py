"""frag.bin: a memory profile's page-occupancy maps, versioned and compressed.

Layout (all integers little-endian):

  header, 48 bytes, uncompressed so `file`/`xxd` can tell what it is:
    0   8s  magic  b"SEEDFRAG"
    8   H   format version (1)
    10  H   flags (0)
    12  I   page size in bytes
    16  i   device index
    20  I   sample count
    24  Q   base address of the modelled range
    32  Q   capacity in bytes
    40  d   sample interval in seconds
  body: one zstandard frame holding, per sample:
    d   t (seconds, trace time)
    I   n, the number of used extents
    n * (Q start page, Q page count)  the page-occupancy map, run-length encoded: pages
                                      not in any extent are free

Run-length extents keep an 80 GiB device at 4 KiB pages (20 M pages) to a few bytes per
live allocation instead of 2.5 MB of bitmap per sample; zstd then folds the repetition
between consecutive samples.

A reader trusts none of the sizes above: the sample count is at most memory.Limits.samples
(4096), the frame must declare its decompressed size, and that size must lie between what
the count needs and what a writer with the same limits can produce (max_body) before the
decompressor allocates it; a sample's extent count is at most Limits.live, and its extents
are in address order without overlap, as a writer makes them.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from ..model.errors import BadInput
from .memory import ADDRESS_SPACE, EXTENT, LIMITS, MAX_PAGE, Limits, extent_pairs

MAGIC = b"SEEDFRAG"
VERSION = 1
HEADER = struct.Struct("<8sHHIiIQQd")
SAMPLE = struct.Struct("<dI")


def max_body(count: int, limits: Limits = LIMITS) -> int:
    """The largest body a writer with these limits makes for `count` samples: their
    headers plus the extent budget of all kept maps (64 MiB by default)."""
    return count * SAMPLE.size + limits.map_extents * EXTENT.size


@dataclass
class FragFile:
    page_size: int
    device: int
    base: int
    capacity: int
    interval: float
    samples: list  # (t, packed extents: memory.extent_pairs reads them)

    @property
    def pages(self) -> int:
        return -(-self.capacity // self.page_size)


def encode(profile) -> bytes:
    import zstandard

    body = bytearray()
    for metrics, packed in zip(profile.samples, profile.extents):
        body += SAMPLE.pack(metrics.t, len(packed) // EXTENT.size)
        body += packed
    header = HEADER.pack(MAGIC, VERSION, 0, profile.page_size, profile.device, len(profile.samples),
                         profile.base, profile.capacity, profile.interval)
    return header + zstandard.ZstdCompressor(level=10).compress(bytes(body))


def max_file(limits: Limits = LIMITS) -> int:
    """The largest frag.bin a writer with these limits makes: the header and a zstd frame
    of the largest body (zstd's worst case adds under 1/128 to incompressible data)."""
    body = max_body(limits.samples, limits)
    return HEADER.size + body + (body >> 7) + (1 << 16)


def read_file(path, source: str, limits: Limits = LIMITS) -> FragFile:
    """Read and decode a frag.bin, reading no more than the largest one can be."""
    with open(path, "rb") as handle:
        data = handle.read(max_file(limits) + 1)
    if len(data) > max_file(limits):
        raise BadInput(f"{source}: larger than the {max_file(limits)} bytes a frag.bin can be")
    return decode(data, source, limits)


def decode(data: bytes, source: str = "frag.bin", limits: Limits = LIMITS) -> FragFile:
    """Every size the header and the zstd frame declare is checked against the file and the
    limits before anything is allocated from it: a few bytes must not buy gigabytes."""
    page, device, count, base, capacity, interval = _header(data, source, limits)
    body = _body(data[HEADER.size:], count, source, limits)
    pages_total = -(-capacity // page)
    samples, offset = [], 0
    for index in range(count):
        if offset + SAMPLE.size > len(body):
            raise BadInput(f"{source}: truncated at sample {index + 1} of {count}")
        t, n = SAMPLE.unpack_from(body, offset)
        offset += SAMPLE.size
        if not math.isfinite(t):
            raise BadInput(f"{source}: sample {index + 1}: its time is not a finite number")
        if n > limits.live:
            raise BadInput(f"{source}: sample {index + 1}: {n} extents, more than the {limits.live} "
                           "live allocations a map may hold")
        if offset + n * EXTENT.size > len(body):
            raise BadInput(f"{source}: truncated in sample {index + 1} of {count}")
        packed = body[offset: offset + n * EXTENT.size]
        offset += n * EXTENT.size
        _check_extents(packed, pages_total, index, source)
        samples.append((t, packed))
    if offset != len(body):
        raise BadInput(f"{source}: {len(body) - offset} bytes after the last of {count} samples")
    return FragFile(page, device, base, capacity, interval, samples)


def _check_extents(packed: bytes, pages_total: int, index: int, source: str) -> None:
    """A writer stores a map's extents in address order without overlap (memory.AddressMap
    merges them), and metrics_of rebuilds the map in that order: extents backwards would
    make each insertion shift every one before it, quadratic in the map's size."""
    cursor = 0
    for start, length in extent_pairs(packed):
        if start < cursor:
            raise BadInput(f"{source}: sample {index + 1} has an extent at page {start}, before the end of the one "
                           f"before it (page {cursor}): extents are stored in address order")
        cursor = start + length
        if cursor > pages_total:
            raise BadInput(f"{source}: sample {index + 1} has an extent outside the device")


def _header(data: bytes, source: str, limits: Limits) -> tuple:
    if len(data) < HEADER.size or data[:8] != MAGIC:
        raise BadInput(f"{source}: not a seedance frag.bin (no SEEDFRAG header)")
    _magic, version, _flags, page, device, count, base, capacity, interval = HEADER.unpack_from(data)
    if version != VERSION:
        raise BadInput(f"{source}: frag.bin format version {version}; this seedance reads version {VERSION}")
    if not 0 < page <= MAX_PAGE:
        raise BadInput(f"{source}: damaged header: page size {page} (1 B to {MAX_PAGE} B)")
    if capacity == 0 or base + capacity > ADDRESS_SPACE:
        raise BadInput(f"{source}: damaged header: capacity {capacity} from base {base:#x} "
                       "(positive, within the 64-bit address space)")
    if not (math.isfinite(interval) and interval > 0):
        raise BadInput(f"{source}: damaged header: sample interval {interval!r} (a positive number of seconds)")
    if not 0 < count <= limits.samples:
        raise BadInput(f"{source}: damaged header: sample count {count} (1 to {limits.samples})")
    return page, device, count, base, capacity, interval


def _body(frame: bytes, count: int, source: str, limits: Limits) -> bytes:
    """The decompressed body, its size taken from the zstd frame header and bounded by the
    sample count before the decompressor allocates it."""
    import zstandard

    try:
        declared = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as exc:
        raise BadInput(f"{source}: damaged body ({exc})") from None
    if declared < 0:
        raise BadInput(f"{source}: damaged body (its zstd frame does not declare its size)")
    low, high = count * SAMPLE.size, max_body(count, limits)
    if not low <= declared <= high:
        raise BadInput(f"{source}: damaged body: it declares {declared} bytes; {count} samples take "
                       f"{low} to {high}")
    try:
        body = zstandard.ZstdDecompressor().decompress(frame, max_output_size=declared)
    except zstandard.ZstdError as exc:
        raise BadInput(f"{source}: damaged body ({exc})") from None
    if len(body) != declared:
        raise BadInput(f"{source}: damaged body ({len(body)} bytes where its frame declares {declared})")
    return body


def metrics_of(frag: FragFile):
    """Recompute each sample's metrics from its occupancy map (what `profile show` prints)."""
    from .memory import AddressMap

    out = []
    for t, packed in frag.samples:
        amap = AddressMap(frag.base, frag.capacity, frag.page_size)
        for start, pages in extent_pairs(packed):
            amap.alloc(frag.base + start * frag.page_size, pages * frag.page_size)
        out.append(amap.metrics(t))
    return out
