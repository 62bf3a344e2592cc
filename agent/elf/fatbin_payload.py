"""What one fatbin image holds: its bytes (decompressed), its kernels, its toolkit.

Compressed images (fatbin entry flags, checked against `cuobjdump -xelf/-xptx` output in
tests/unit/test_elf_fatbin_oracle.py):
  0x2000  LZ4 block (nvcc/fatbinary <= 12.x, and -compress-mode=speed): a raw LZ4 block,
          no frame; the entry header gives the compressed and the decompressed size.
  0x8000  Zstandard frame (CUDA 12.8+ `--compress-mode=size|balance|default`, CUDA 13's
          default for PTX).
A kernel is what the driver can launch: in a cubin a defined STT_FUNC symbol whose st_other
carries STO_CUDA_ENTRY (0x10, as `cuobjdump -elf`/readelf show `[<other>: 10]`); in PTX an
`.entry` directive.  A cubin without one (a device-link stub, device variables only) is no
evidence about whether the library's kernels can run.
"""
from __future__ import annotations

import re
import struct

CODEC_LZ4, CODEC_ZSTD = "lz4", "zstd"
STT_FUNC = 2
STO_CUDA_ENTRY = 0x10
SHT_SYMTAB = 2

_PTX_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$%][\w$%.]*)")
_RELEASE = re.compile(rb"Cuda compilation tools, release (\d+)\.(\d+)")


class PayloadError(ValueError):
    """An image that cannot be decoded (truncated, unknown codec, corrupt stream)."""


def lz4_block(src: bytes, size: int) -> bytes:
    """Decode one raw LZ4 block (https://github.com/lz4/lz4/blob/dev/doc/lz4_Block_format.md)."""
    out = bytearray()
    i, n = 0, len(src)
    try:
        while i < n:
            token = src[i]
            i += 1
            literals = token >> 4
            if literals == 15:
                while True:
                    extra = src[i]
                    i += 1
                    literals += extra
                    if extra != 255:
                        break
            out += src[i:i + literals]
            i += literals
            if i >= n or len(out) >= size:
                break  # the last sequence holds literals only
            offset = src[i] | (src[i + 1] << 8)
            i += 2
            length = token & 15
            if length == 15:
                while True:
                    extra = src[i]
                    i += 1
                    length += extra
                    if extra != 255:
                        break
            length += 4
            start = len(out) - offset
            if offset == 0 or start < 0:
                raise PayloadError("LZ4 match before the start of the output")
            if offset >= length:
                out += out[start:start + length]
            else:  # overlapping copy: repeats the last `offset` bytes
                for k in range(length):
                    out.append(out[start + k])
    except IndexError:
        raise PayloadError("truncated LZ4 block") from None
    if len(out) < size:
        raise PayloadError(f"LZ4 block gave {len(out)} of {size} bytes")
    return bytes(out[:size])


def zstd_frame(src: bytes, size: int) -> bytes:
    try:
        import zstandard  # C extension; imported only when a zstd image must be read
    except ImportError:
        raise PayloadError("zstd image and the zstandard module is not installed") from None
    try:
        return zstandard.ZstdDecompressor().decompress(src, max_output_size=max(size, 1))
    except zstandard.ZstdError as exc:
        raise PayloadError(f"zstd: {exc}") from None


def decode(stored: bytes, codec: str, size: int) -> bytes:
    if codec == CODEC_LZ4:
        try:
            import lz4.block  # the C decoder when installed; the pure-Python one loops per token
        except ImportError:
            return lz4_block(stored, size)
        try:
            return lz4.block.decompress(stored, uncompressed_size=size)
        except lz4.block.LZ4BlockError as exc:
            raise PayloadError(f"LZ4: {exc}") from None
    if codec == CODEC_ZSTD:
        return zstd_frame(stored, size)
    return stored


def cubin_kernels(image: bytes) -> frozenset:
    """Names of the entry functions a cubin defines."""
    if image[:4] != b"\x7fELF" or len(image) < 64:
        raise PayloadError("cubin is not an ELF image")
    if image[4] != 2:
        raise PayloadError("32-bit cubin")  # sm_20 and older; no toolkit we judge writes one
    try:
        shoff, = struct.unpack_from("<Q", image, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", image, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", image, shoff + k * shentsize) for k in range(shnum)]
        kernels = set()
        for _name, sh_type, _f, _a, offset, size, link, _info, _al, entsize in sections:
            if sh_type != SHT_SYMTAB or entsize < 24:
                continue
            str_off, str_size = sections[link][4], sections[link][5]
            for pos in range(offset, offset + size - 23, entsize):
                st_name, st_info, st_other, st_shndx = struct.unpack_from("<IBBH", image, pos)
                if (st_info & 0xF) == STT_FUNC and st_other & STO_CUDA_ENTRY and st_shndx != 0:
                    end = image.find(b"\0", str_off + st_name, str_off + str_size)
                    kernels.add(image[str_off + st_name:end].decode("utf-8", "replace"))
        return frozenset(kernels)
    except (struct.error, IndexError):
        raise PayloadError("truncated cubin") from None


def ptx_kernels(image: bytes) -> frozenset:
    text = image.split(b"\0", 1)[0]
    return frozenset(m.decode("utf-8", "replace") for m in _PTX_ENTRY.findall(text))


def kernels(image: bytes, kind: str) -> frozenset:
    return cubin_kernels(image) if kind == "sass" else ptx_kernels(image)


def toolkit_releases(blob: bytes) -> set:
    """(major, minor) of every "Cuda compilation tools, release X.Y" string in blob.

    ptxas/nvlink write it into each cubin's .note.nv.tkinfo and into the PTX header; in an
    uncompressed fatbin it is readable in place.
    """
    return {(int(a), int(b)) for a, b in _RELEASE.findall(blob)}
