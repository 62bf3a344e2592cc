"""Read a PyTorch caching-allocator snapshot (torch.cuda.memory._dump_snapshot's pickle).

The snapshot lists `segments` (what the allocator reserved from the driver with
cudaMalloc) and, inside each, `blocks` with a `state` (active_allocated,
active_pending_free, inactive).  The address space modelled is the segments of one
device, laid end to end; used pages are active blocks, free blocks are the inactive ones.
So the metrics describe the caching allocator's own fragmentation, which is what
memory_viz users look at: memory reserved but unusable for the next large tensor.

A pickle can run code when loaded, so only plain containers and scalars are accepted: any
class reference in the file is refused (no torch needed to read it).  And what unpickling
builds is not bounded by the file's size, so the opcodes are walked first (_prescan): a
pickle that would build more than MAX_BUILT bytes, or whose lengths and memo indices no
pickler writes, is refused before the C unpickler builds anything.
"""
from __future__ import annotations

import functools
import io
import pickle

from ..model.errors import BadInput
from .memory import ADDRESS_SPACE, MAX_U64

# A real snapshot with its allocation traces is tens of MB; the counts bound what a crafted
# one makes the replay build.
MAX_BYTES = 256 << 20
MAX_SEGMENTS = 1 << 16
MAX_BLOCKS = 1 << 20
# What unpickling may build, by an upper estimate made before anything is built (_prescan),
# since the C unpickler counts nothing itself and its objects can outweigh the file many
# times over (an empty set is one opcode byte and 216 bytes of memory).  The estimate runs
# about twice what a snapshot shaped like torch's really takes, and the cap leaves room for
# snapshots of many tens of MB.
MAX_BUILT = 4 << 30


class _PlainUnpickler(pickle.Unpickler):
    # _prescan refuses every opcode that reaches for a class; this is the second lock
    def find_class(self, module, name):
        raise BadInput(f"torch snapshot refers to {_shown(module)}.{_shown(name)}: only plain data is read "
                       "from a pickle")


def _shown(text) -> str:
    """A name from the file, as one short line."""
    text = repr(str(text))[1:-1]
    return text if len(text) <= 80 else text[:77] + "..."


def read_snapshot(path, source: str) -> dict:
    """Read at most MAX_BYTES + 1 bytes of the file (a bigger one is refused unread) and load it."""
    with open(path, "rb") as handle:
        return load_snapshot(handle.read(MAX_BYTES + 1), source)


def load_snapshot(data: bytes, source: str = "snapshot") -> dict:
    if len(data) > MAX_BYTES:
        raise BadInput(f"{source}: {len(data)} bytes, larger than the {MAX_BYTES} a snapshot may be")
    _prescan(data, source)
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


# --- what unpickling would build, estimated before it builds anything -----------------------

# Upper bounds in bytes for CPython on 64 bits (sys.getsizeof).  Every opcode that pushes a
# value pays _SLOT: its reference on the unpickler's stack and the entry it may become in a
# list, dict or set (a dict or a set keeps room for up to about three times its entries, and
# both tables while it resizes).  _OBJECT is what the opcode's own object adds.
_SLOT = 120
_OBJECT = {"EMPTY_DICT": 64, "DICT": 64, "EMPTY_LIST": 56, "LIST": 56, "EMPTY_SET": 216, "FROZENSET": 216,
           "TUPLE": 48, "TUPLE1": 48, "TUPLE2": 48, "TUPLE3": 48,
           "BININT": 32, "BININT1": 32, "BININT2": 32, "BINFLOAT": 32,
           "MARK": 16,      # an entry of the mark stack, which doubles as it grows
           "MEMOIZE": 16}   # a memo slot, likewise
# A payload (string, bytes, long, text argument, memo index) of n bytes becomes at most an
# object header and 4n bytes: UTF-8 read into a str of 4-byte characters.
_PAYLOAD_OBJECT, _PAYLOAD_FACTOR = 80, 4
_MEMO_SLOT = 16      # a memo slot: the C unpickler's memo array doubles as it grows
# opcodes that name a class, call something or need out-of-band data: never in a snapshot
_REFUSED = frozenset({"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "BUILD", "NEWOBJ", "NEWOBJ_EX",
                      "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID", "NEXT_BUFFER", "READONLY_BUFFER"})


@functools.lru_cache(maxsize=None)
def _opcode_table() -> tuple:
    """(steps, charges, special), indexed by opcode byte.  steps[op] is 1 + its fixed argument
    size, or 0 for an opcode that needs a look at its argument; special[op] then says how
    (kind, width, name), or is None for a byte that is no opcode.  pickletools describes
    every opcode, so the table follows the pickle module's own definitions."""
    import pickletools

    widths = {pickletools.TAKEN_FROM_ARGUMENT1: 1, pickletools.TAKEN_FROM_ARGUMENT4: -4,  # signed
              pickletools.TAKEN_FROM_ARGUMENT4U: 4, pickletools.TAKEN_FROM_ARGUMENT8U: 8}
    steps, charges, special = [0] * 256, [0] * 256, [None] * 256
    for op in pickletools.opcodes:
        code, name, arg = ord(op.code), op.name, op.arg
        pushes = (not op.stack_before and op.stack_after and name != "MARK") or name == "DUP"
        charges[code] = (_SLOT if pushes else 0) + _OBJECT.get(name, 0)
        if name in _REFUSED:
            special[code] = ("refused", 0, name)
        elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
            special[code] = ("put", arg.n, name)    # PUT's index is a line (n < 0)
        elif name in ("FRAME", "STOP"):
            special[code] = (name.lower(), 8, name)
        elif arg is None or arg.n >= 0:
            steps[code] = 1 + (arg.n if arg else 0)
        elif arg.n == pickletools.UP_TO_NEWLINE:
            special[code] = ("line", 0, name)
        else:
            special[code] = ("counted", widths[arg.n], name)
    return steps, charges, special


def _prescan(data: bytes, source: str) -> int:
    """Walk the pickle's opcodes as the unpickler reads them, up to STOP, building nothing,
    and refuse it if it reaches for a class, declares a length past its end, or would build
    more than MAX_BUILT bytes.  Only a pickle that passes goes to the (C) unpickler.
    Returns the estimate."""
    steps, charges, special = _opcode_table()
    end, pos, built, memo = len(data), 0, 0, 0
    while pos < end:
        op = data[pos]
        step = steps[op]
        if step:   # most opcodes: a fixed-size argument and a known charge
            pos += step
            built += charges[op]
            continue
        if special[op] is None:
            raise BadInput(f"{source}: not a readable snapshot pickle (byte {pos}: {op:#04x} is no pickle opcode)")
        kind, width, name = special[op]
        if kind == "counted":   # strings, bytes, longs: a length, then the payload
            start = pos + 1 + abs(width)
            size = data[pos + 1] if width == 1 and start <= end else _argument(data, pos, width, source)
            if size > end - start:
                _check_within(data, start, size, name, source)
            built += charges[op] + _PAYLOAD_OBJECT + _PAYLOAD_FACTOR * size
            pos = start + size
        elif kind == "line":
            newline = data.find(b"\n", pos + 1)
            if newline < 0:
                raise BadInput(f"{source}: not a readable snapshot pickle ({name} at byte {pos} has no line end)")
            built += charges[op] + _PAYLOAD_OBJECT + _PAYLOAD_FACTOR * (newline - pos)
            pos = newline + 1
        elif kind == "put":
            # The C unpickler sizes its memo array by the largest index put and zeroes it: a
            # 4-byte index alone would cost gigabytes.  Picklers number the memo in order
            # (0, 1, 2, ...), so an index past the next one is a forged pickle.
            index, following = _memo_index(data, pos, width, source)
            if index > memo:
                raise BadInput(f"{source}: not a readable snapshot pickle ({name} at byte {pos}: memo index "
                               f"{index} where pickle numbers them in order and the next is {memo})")
            if index == memo:
                built += _MEMO_SLOT
                memo += 1
            pos = following
        elif kind == "frame":   # the unpickler copies the frame into its buffer
            size = _argument(data, pos, 8, source)
            _check_within(data, pos + 9, size, name, source)
            built += size
            pos += 9
        elif kind == "stop":
            break
        else:
            raise BadInput(f"{source}: the pickle {_reaches_for(data, pos, name)}: only plain data is read "
                           "from a pickle")
        if built > MAX_BUILT:
            break
    if built > MAX_BUILT:
        raise BadInput(f"{source}: unpickling it would build more than the {MAX_BUILT} bytes of objects a "
                       f"snapshot may (an upper estimate, passed by byte {min(pos, end)} of {end})")
    return built


def _argument(data: bytes, pos: int, width: int, source: str) -> int:
    """The little-endian length or size after the opcode at `pos` (width < 0: signed)."""
    raw = data[pos + 1: pos + 1 + abs(width)]
    if len(raw) < abs(width):
        raise BadInput(f"{source}: not a readable snapshot pickle (truncated at byte {pos})")
    value = int.from_bytes(raw, "little", signed=width < 0)
    if value < 0:
        raise BadInput(f"{source}: not a readable snapshot pickle (a negative length at byte {pos})")
    return value


def _check_within(data: bytes, start: int, size: int, name: str, source: str) -> None:
    if size > len(data) - start:
        raise BadInput(f"{source}: not a readable snapshot pickle ({name} at byte {start} declares {size} bytes; "
                       f"{max(0, len(data) - start)} remain)")


def _memo_index(data: bytes, pos: int, width: int, source: str) -> tuple:
    """(index, next position) of a BINPUT, LONG_BINPUT or PUT at `pos`."""
    if width > 0:
        return _argument(data, pos, width, source), pos + 1 + width
    newline = data.find(b"\n", pos + 1)
    digits = data[pos + 1: newline] if newline >= 0 else b""
    if not digits.isdigit() or len(digits) > 20:
        raise BadInput(f"{source}: not a readable snapshot pickle (PUT at byte {pos} has no memo index)")
    return int(digits), newline + 1


def _reaches_for(data: bytes, pos: int, name: str) -> str:
    """What a refused opcode asks for, as the message says it: the module.name GLOBAL and INST
    spell out, or the opcode itself."""
    if name in ("GLOBAL", "INST"):
        lines = data[pos + 1: pos + 1 + 2 * 4096].split(b"\n", 2)
        if len(lines) == 3:
            module, attribute = (_shown(part.decode("utf-8", "replace")) for part in lines[:2])
            return f"refers to {module}.{attribute}"
    return f"calls or names a class ({name} at byte {pos})"


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
    state = block.get("state", "")
    if not isinstance(state, str):   # str() of a crafted nested list can be larger than memory
        raise BadInput(f"{source}: a block of segment {index}: 'state' is not a string")
    return size, state[:64], start
