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

from ..errors import BadInput

MAX_BYTES = 1 << 30


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise BadInput(f"torch snapshot refers to {module}.{name}: only plain data is read from a pickle")


def load_snapshot(data: bytes, source: str = "snapshot") -> dict:
    if len(data) > MAX_BYTES:
        raise BadInput(f"{source}: larger than 1 GiB")
    try:
        snapshot = _PlainUnpickler(io.BytesIO(data)).load()
    except BadInput:
        raise
    except Exception as exc:  # truncated or not a pickle at all
        raise BadInput(f"{source}: not a readable snapshot pickle ({exc.__class__.__name__}: {exc})") from None
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("segments"), list):
        raise BadInput(f"{source}: not a caching-allocator snapshot (no 'segments' list)")
    return snapshot


def snapshot_records(snapshot: dict, device: int, source: str = "snapshot") -> list[dict]:
    """Event records (the --from-trace format) that rebuild the snapshot's final state."""
    segments = []
    for index, segment in enumerate(snapshot["segments"]):
        if not isinstance(segment, dict):
            raise BadInput(f"{source}: segment {index} is not a mapping")
        if segment.get("device", 0) != device:
            continue
        try:
            address, total = int(segment["address"]), int(segment["total_size"])
        except (KeyError, TypeError, ValueError):
            raise BadInput(f"{source}: segment {index} lacks address/total_size") from None
        segments.append((address, total, segment.get("blocks") or [], index))
    if not segments:
        raise BadInput(f"{source}: no segment on device {device}")
    segments.sort()
    capacity = sum(total for _, total, _, _ in segments)
    records = [{"ev": "device", "dev": device, "base": 0, "capacity": capacity, "_line": 0}]
    offset = 0
    for address, total, blocks, index in segments:
        cursor = address
        for block in blocks:
            try:
                size, state = int(block["size"]), str(block.get("state", ""))
                start = int(block.get("address", cursor))
            except (KeyError, TypeError, ValueError):
                raise BadInput(f"{source}: a block of segment {index} lacks its size") from None
            if state.startswith("active"):
                # laid end to end: the segment's offset within the modelled range
                records.append({"t": 0.0, "ev": "alloc", "dev": device, "addr": offset + (start - address),
                                "size": size, "library": f"segment {index}", "_line": 0})
            cursor = start + size
        offset += total
    return records
