"""Read a PyTorch caching-allocator snapshot (torch.cuda.memory._dump_snapshot's pickle).

The snapshot lists `segments` (what the allocator reserved from the driver with
cudaMalloc) and, inside each, `blocks` with a `state` (active_allocated,
active_pending_free, inactive).  The address space modelled is the segments of one
device, laid end to end; used pages are active blocks, free blocks are the inactive ones.
So the metrics describe the caching allocator's own fragmentation, which is what
memory_viz users look at: memory reserved but unusable for the next large tensor.

A pickle can run code when loaded, so only plain containers and scalars are accepted: any
class reference in the file is refused (no torch needed to read it).
"""
from __future__ import annotations

import io
import pickle

from ..model.errors import BadInput
from .memory import ADDRESS_SPACE, MAX_U64

# A real snapshot with its allocation traces is tens of MB; the counts bound what a crafted
# one makes the replay build.  The unpickled objects themselves can outweigh the file
# (an empty dict is one opcode byte), so the byte cap is the guard on them.
MAX_BYTES = 256 << 20
MAX_SEGMENTS = 1 << 16
MAX_BLOCKS = 1 << 20


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise BadInput(f"torch snapshot refers to {module}.{name}: only plain data is read from a pickle")


def read_snapshot(path, source: str) -> dict:
    """Read at most MAX_BYTES + 1 bytes of the file (a bigger one is refused unread) and load it."""
    with open(path, "rb") as handle:
        return load_snapshot(handle.read(MAX_BYTES + 1), source)


def load_snapshot(data: bytes, source: str = "snapshot") -> dict:
    if len(data) > MAX_BYTES:
        raise BadInput(f"{source}: {len(data)} bytes, larger than the {MAX_BYTES} a snapshot may be")
    try:
        snapshot = _PlainUnpickler(io.BytesIO(data)).load()
    except BadInput:
        raise
    except RecursionError:   # nested containers deeper than the interpreter's stack
        raise BadInput(f"{source}: not a readable snapshot pickle (nested too deeply)") from None
    except Exception as exc:  # truncated or not a pickle at all
        raise BadInput(f"{source}: not a readable snapshot pickle ({exc.__class__.__name__}: {exc})") from None
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("segments"), list):
        raise BadInput(f"{source}: not a caching-allocator snapshot (no 'segments' list)")
    return snapshot


def snapshot_records(snapshot: dict, device: int, source: str = "snapshot"):
    """Event records (the --from-trace format) that rebuild the snapshot's final state.

    Every number is checked where it is read, naming its segment or block: the modelled
    range (the segments end to end) must fit the 64-bit address space, as the driver's does."""
    segments = _device_segments(snapshot, device, source)
    capacity = sum(total for _, total, _, _ in segments)
    if capacity > MAX_U64:
        raise BadInput(f"{source}: the segments of device {device} add up to {capacity} bytes "
                       "('total_size'), past the 64-bit address space")
    records = [{"ev": "device", "dev": device, "base": 0, "capacity": capacity, "_line": 0}]
    offset, blocks_seen = 0, 0
    for address, total, blocks, index in segments:
        cursor = address
        blocks_seen += len(blocks)
        if blocks_seen > MAX_BLOCKS:
            raise BadInput(f"{source}: more than {MAX_BLOCKS} blocks ('blocks'); refusing the snapshot")
        for block in blocks:
            size, state, start = _block(block, cursor, index, source)
            if not address <= start <= start + size <= address + total:
                raise BadInput(f"{source}: a block of segment {index} ('address' {start:#x}, 'size' {size}) "
                               "lies outside its segment")
            if state.startswith("active"):
                # laid end to end: the segment's offset within the modelled range
                records.append({"t": 0.0, "ev": "alloc", "dev": device, "addr": offset + (start - address),
                                "size": size, "library": f"segment {index}", "_line": 0})
            cursor = start + size
        offset += total
    return records


def _number(value, what: str) -> int:
    """A non-negative integer no larger than 2^64 - 1, or BadInput naming `what`."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise BadInput(f"{what} is not a number")
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        raise BadInput(f"{what} is not a number") from None
    if not 0 <= number <= MAX_U64:
        raise BadInput(f"{what} {number} is outside 0 .. 2^64 - 1")
    return number


def _device_segments(snapshot: dict, device: int, source: str) -> list:
    if len(snapshot["segments"]) > MAX_SEGMENTS:
        raise BadInput(f"{source}: {len(snapshot['segments'])} segments ('segments'), more than {MAX_SEGMENTS}")
    segments = []
    for index, segment in enumerate(snapshot["segments"]):
        if not isinstance(segment, dict):
            raise BadInput(f"{source}: segment {index} is not a mapping")
        if segment.get("device", 0) != device:
            continue
        if "address" not in segment or "total_size" not in segment:
            raise BadInput(f"{source}: segment {index} lacks address/total_size")
        address = _number(segment["address"], f"{source}: segment {index}: 'address'")
        total = _number(segment["total_size"], f"{source}: segment {index}: 'total_size'")
        if address + total > ADDRESS_SPACE:
            raise BadInput(f"{source}: segment {index}: 'total_size' {total} from 'address' {address:#x} runs "
                           "past the 64-bit address space")
        blocks = segment.get("blocks") or []
        if not isinstance(blocks, list):
            raise BadInput(f"{source}: segment {index}: 'blocks' is not a list")
        segments.append((address, total, blocks, index))
    if not segments:
        raise BadInput(f"{source}: no segment on device {device}")
    segments.sort(key=lambda s: (s[0], s[3]))
    return segments


def _block(block, cursor: int, index: int, source: str) -> tuple:
    if not isinstance(block, dict) or "size" not in block:
        raise BadInput(f"{source}: a block of segment {index} lacks its size")
    size = _number(block["size"], f"{source}: a block of segment {index}: 'size'")
    start = _number(block.get("address", cursor), f"{source}: a block of segment {index}: 'address'")
    return size, str(block.get("state", ""))[:64], start
