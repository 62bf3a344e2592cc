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
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import BadInput

MAGIC = b"SEEDFRAG"
VERSION = 1
HEADER = struct.Struct("<8sHHIiIQQd")
SAMPLE = struct.Struct("<dI")
EXTENT = struct.Struct("<QQ")
MAX_BODY = 1 << 32  # 4 GiB decompressed: far beyond any real profile, short of a zip bomb


@dataclass
class FragFile:
    page_size: int
    device: int
    base: int
    capacity: int
    interval: float
    samples: list  # (t, [(start_page, pages), ...])

    @property
    def pages(self) -> int:
        return -(-self.capacity // self.page_size)


def encode(profile) -> bytes:
    import zstandard

    body = bytearray()
    for metrics, extents in zip(profile.samples, profile.extents):
        body += SAMPLE.pack(metrics.t, len(extents))
        for start, pages in extents:
            body += EXTENT.pack(start, pages)
    header = HEADER.pack(MAGIC, VERSION, 0, profile.page_size, profile.device, len(profile.samples),
                         profile.base, profile.capacity, profile.interval)
    return header + zstandard.ZstdCompressor(level=10).compress(bytes(body))


def decode(data: bytes, source: str = "frag.bin") -> FragFile:
    import zstandard

    if len(data) < HEADER.size or data[:8] != MAGIC:
        raise BadInput(f"{source}: not a seedance frag.bin (no SEEDFRAG header)")
    magic, version, _flags, page, device, count, base, capacity, interval = HEADER.unpack_from(data)
    if version != VERSION:
        raise BadInput(f"{source}: frag.bin format version {version}; this seedance reads version {VERSION}")
    if page == 0 or capacity == 0:
        raise BadInput(f"{source}: damaged header (page size {page}, capacity {capacity})")
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(data[HEADER.size:])
        body = reader.read(MAX_BODY + 1)
    except zstandard.ZstdError as exc:
        raise BadInput(f"{source}: damaged body ({exc})") from None
    if len(body) > MAX_BODY:
        raise BadInput(f"{source}: body larger than 4 GiB decompressed; refusing it")
    samples, offset = [], 0
    pages_total = -(-capacity // page)
    for index in range(count):
        if offset + SAMPLE.size > len(body):
            raise BadInput(f"{source}: truncated at sample {index + 1} of {count}")
        t, n = SAMPLE.unpack_from(body, offset)
        offset += SAMPLE.size
        if offset + n * EXTENT.size > len(body):
            raise BadInput(f"{source}: truncated in sample {index + 1} of {count}")
        extents = [EXTENT.unpack_from(body, offset + i * EXTENT.size) for i in range(n)]
        offset += n * EXTENT.size
        if any(start + length > pages_total for start, length in extents):
            raise BadInput(f"{source}: sample {index + 1} has an extent outside the device")
        samples.append((t, extents))
    if offset != len(body):
        raise BadInput(f"{source}: {len(body) - offset} bytes after the last of {count} samples")
    return FragFile(page, device, base, capacity, interval, samples)


def metrics_of(frag: FragFile):
    """Recompute each sample's metrics from its occupancy map (what `profile show` prints)."""
    from .memory import AddressMap

    out = []
    for t, extents in frag.samples:
        amap = AddressMap(frag.base, frag.capacity, frag.page_size)
        for start, pages in extents:
            amap.alloc(frag.base + start * frag.page_size, pages * frag.page_size)
        out.append(amap.metrics(t))
    return out
