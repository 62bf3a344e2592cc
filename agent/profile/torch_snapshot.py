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
import time

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

# --- how long unpickling takes, bounded before it starts ---------------------------------------
#
# Almost everything the unpickler does is linear in the opcodes: each value is pushed once and
# popped once.  Hashing is the exception: SETITEM(S) and DICT hash their keys, ADDITEMS and
# FROZENSET their members, and a tuple hashes (and compares) its items again every time,
# caching nothing.  A tuple of two references to the tuple before it, repeated, is 2 bytes a
# level (DUP, TUPLE2) and 2^depth items to hash: 150 bytes took hours.  And keys that are not
# strings hash the same in every process (only str and bytes hashes are salted, PEP 456), so a
# crafted pickle can make thousands collide (n, n + 2^61 - 1, ...) and each insertion compare
# against all those before it.  So the prescan follows the stack, tracking each value's nodes
# as a hash or a compare would visit them, and caps the nodes of all keys and members that are
# not strings, over the whole pickle (a torch snapshot's keys are all strings).  A tuple or
# frozenset counts 1 + its items' nodes, each time one is reached; a number, None or an
# unhashable container 1; a string inside a tuple 1 + one a 64 bytes (two equal strings
# compare byte by byte).  On the stack a string is -(its length // 64), so 0 or less: as a key
# on its own it costs nothing here, its salted hash computed once and cached.
MAX_KEY_NODES = 4096   # at most MAX_KEY_NODES^2 / 2 colliding comparisons: well under a second
# The walk itself is linear in the file but runs in Python: a wall-clock cap as the other
# readers have, looked at each _LOOK_BYTES of pickle.  A 160 MB torch-shaped snapshot walks in
# about 10 s on a busy two-core machine.
MAX_SECONDS = 60.0
_LOOK_BYTES = 1 << 20
# INT and LONG in protocol 0 are decimal lines; int() of one is quadratic in its length where
# Python's own digit limit (sys.int_info.default_max_str_digits) is off or absent.
_MAX_DIGITS = 4300

# What the prescan does for each opcode, the commonest in a snapshot first.
(_GET1, _MEMOIZE, _COUNTED1, _MARK, _PUSH, _TO_MARK, _GET4, _COUNTED, _SETITEM, _APPEND, _TUPLE_N, _POP,
 _DUP, _PUT, _GET_LINE, _LINE, _FRAME, _STOP, _NOTHING, _REFUSE, _UNMODELLED, _NO_OPCODE) = range(22)
_TEXTS = frozenset({"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
                    "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8"})
_ACTIONS = {"BINGET": _GET1, "LONG_BINGET": _GET4, "GET": _GET_LINE, "MEMOIZE": _MEMOIZE, "MARK": _MARK,
            "SETITEM": _SETITEM, "APPEND": _APPEND, "TUPLE1": _TUPLE_N, "TUPLE2": _TUPLE_N, "TUPLE3": _TUPLE_N,
            "POP": _POP, "DUP": _DUP, "PUT": _PUT, "BINPUT": _PUT, "LONG_BINPUT": _PUT, "FRAME": _FRAME,
            "STOP": _STOP, "PROTO": _NOTHING,
            **dict.fromkeys(("APPENDS", "SETITEMS", "ADDITEMS", "LIST", "DICT", "TUPLE", "FROZENSET", "POP_MARK"),
                            _TO_MARK),
            **dict.fromkeys(("NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "BINFLOAT",
                             "EMPTY_DICT", "EMPTY_LIST", "EMPTY_SET", "EMPTY_TUPLE"), _PUSH),
            **dict.fromkeys(_REFUSED, _REFUSE)}


@functools.lru_cache(maxsize=None)
def _opcode_table() -> tuple:
    """(actions, steps, charges, nodes, widths, names), indexed by opcode byte: what the prescan
    does for it, 1 + its fixed argument size (0 where the argument says its own size), what it
    builds, the nodes of the value it pushes (0 for a string: see MAX_KEY_NODES), the width of
    its length or memo index (< 0: signed, or a line), its name.  pickletools describes every
    opcode, so the table follows the pickle module's own definitions; an opcode this reader
    does not model is refused."""
    import pickletools

    lengths = {pickletools.TAKEN_FROM_ARGUMENT1: 1, pickletools.TAKEN_FROM_ARGUMENT4: -4,  # signed
               pickletools.TAKEN_FROM_ARGUMENT4U: 4, pickletools.TAKEN_FROM_ARGUMENT8U: 8,
               pickletools.UP_TO_NEWLINE: -1}
    actions, steps, charges = [_NO_OPCODE] * 256, [0] * 256, [0] * 256
    nodes, widths, names = [1] * 256, [0] * 256, [""] * 256
    for op in pickletools.opcodes:
        code, name, arg = ord(op.code), op.name, op.arg
        pushes = (not op.stack_before and op.stack_after and name != "MARK") or name == "DUP"
        charges[code] = (_SLOT if pushes else 0) + _OBJECT.get(name, 0)
        names[code], nodes[code] = name, 0 if name in _TEXTS else 1
        steps[code] = 1 + (arg.n if arg and arg.n > 0 else 0)
        widths[code] = lengths.get(arg.n, arg.n) if arg else 0
        action = _ACTIONS.get(name)
        if action is None and arg is not None and arg.n < 0:   # a value whose argument says its size
            action = _LINE if arg.n == pickletools.UP_TO_NEWLINE else (_COUNTED1 if widths[code] == 1
                                                                       else _COUNTED)
        actions[code] = _UNMODELLED if action is None else action
        if action in (_COUNTED1, _COUNTED, _LINE, _PUT, _GET_LINE):
            steps[code] = 0     # their branch moves past the argument
        elif action == _TUPLE_N:
            widths[code] = int(name[-1])   # the items TUPLE1, TUPLE2, TUPLE3 take
    return actions, steps, charges, nodes, widths, names


def _prescan(data: bytes, source: str, clock=time.monotonic) -> int:
    """Walk the pickle's opcodes as the unpickler reads them, up to STOP, building nothing,
    and refuse it if it reaches for a class, declares a length past its end, would build
    more than MAX_BUILT bytes, or hash more than MAX_KEY_NODES nodes of keys that are not
    strings; or if the walk takes more than MAX_SECONDS.  Only a pickle that passes goes to
    the (C) unpickler.  Returns the estimate of the bytes built."""
    actions, steps, charges, nodes, widths, names = _opcode_table()
    end, pos, built, key_nodes = len(data), 0, 0, 0
    limit = end   # STOP ends the walk here
    # The stack and memo as the unpickler will hold them, each value as its nodes (above), and
    # where each MARK stands.  Where the unpickler would stop on a stack too short (an opcode
    # popping below its MARK, a GET of nothing), this walk may go on, a little off: harmless,
    # as nothing after that opcode is unpickled, and a pop of nothing is refused here too.
    stack: list = []
    marks: list = []
    memo: list = []
    saturated = MAX_KEY_NODES + 1   # past the cap, the count need not grow
    deadline = clock() + MAX_SECONDS
    push, remember = stack.append, memo.append
    try:
        while pos < limit:
            # the clock and the estimate, each _LOOK_BYTES of pickle
            if built > MAX_BUILT:
                break
            if clock() > deadline:
                raise BadInput(f"{source}: reading the pickle's opcodes took more than the {MAX_SECONDS:g} s a "
                               f"snapshot may (by byte {pos} of {end})")
            look = min(limit, pos + _LOOK_BYTES)
            while pos < look:
                op = data[pos]
                action = actions[op]
                if action == _GET1:
                    push(memo[data[pos + 1]])
                    pos += 2
                    built += charges[op]
                elif action == _MEMOIZE:
                    remember(stack[-1])
                    pos += 1
                    built += charges[op]
                elif action == _COUNTED1:   # short strings and longs: a length byte, then the payload
                    size = data[pos + 1]
                    if size > end - pos - 2:
                        _check_within(data, pos + 2, size, names[op], source)
                    push(nodes[op] or -(size >> 6))
                    pos += 2 + size
                    built += charges[op] + _PAYLOAD_OBJECT + _PAYLOAD_FACTOR * size
                elif action == _MARK:
                    marks.append(len(stack))
                    pos += 1
                    built += charges[op]
                elif action == _PUSH:
                    push(1)
                    pos += steps[op]
                    built += charges[op]
                elif action == _TO_MARK:
                    mark = marks.pop()
                    items = stack[mark:]
                    del stack[mark:]
                    name = names[op]
                    if name in ("SETITEMS", "DICT", "ADDITEMS", "FROZENSET"):
                        key_nodes += _key_nodes(items[::2] if name in ("SETITEMS", "DICT") else items)
                        if key_nodes > MAX_KEY_NODES:
                            _too_many_key_nodes(source, pos)
                    if name in ("TUPLE", "FROZENSET"):
                        push(_compound_nodes(items, saturated))
                    elif name in ("LIST", "DICT"):
                        push(1)
                    pos += 1
                    built += charges[op]
                elif action == _GET4:
                    push(memo[_argument(data, pos, 4, source)])
                    pos += 5
                    built += charges[op]
                elif action == _COUNTED:   # strings, bytes, longs: a length, then the payload
                    width = widths[op]
                    start = pos + 1 + abs(width)
                    size = _argument(data, pos, width, source)
                    if size > end - start:
                        _check_within(data, start, size, names[op], source)
                    push(nodes[op] or -(size >> 6))
                    pos = start + size
                    built += charges[op] + _PAYLOAD_OBJECT + _PAYLOAD_FACTOR * size
                elif action == _SETITEM:
                    key_nodes += max(stack[-2], 0)
                    if key_nodes > MAX_KEY_NODES:
                        _too_many_key_nodes(source, pos)
                    del stack[-2:]
                    pos += 1
                elif action == _APPEND:
                    stack.pop()
                    pos += 1
                elif action == _TUPLE_N:
                    count = widths[op]
                    items = stack[-count:]
                    if len(items) < count:
                        raise IndexError
                    del stack[-count:]
                    push(_compound_nodes(items, saturated))
                    pos += 1
                    built += charges[op]
                elif action == _POP:   # a MARK on top is what POP takes
                    if marks and marks[-1] == len(stack):
                        marks.pop()
                    else:
                        stack.pop()
                    pos += 1
                elif action == _DUP:
                    push(stack[-1])
                    pos += 1
                    built += charges[op]
                elif action == _PUT:
                    # The C unpickler sizes its memo array by the largest index put and zeroes it: a
                    # 4-byte index alone would cost gigabytes.  Picklers number the memo in order
                    # (0, 1, 2, ...), so an index past the next one is a forged pickle.
                    index, following = _memo_index(data, pos, widths[op], source)
                    if index > len(memo):
                        raise BadInput(f"{source}: not a readable snapshot pickle ({names[op]} at byte {pos}: "
                                       f"memo index {index} where pickle numbers them in order and the next is "
                                       f"{len(memo)})")
                    if index == len(memo):
                        remember(stack[-1])
                        built += _MEMO_SLOT
                    else:
                        memo[index] = stack[-1]
                    pos = following
                elif action == _GET_LINE:
                    index, following = _memo_index(data, pos, -1, source)
                    push(memo[index])
                    pos = following
                    built += charges[op]
                elif action == _LINE:
                    newline = data.find(b"\n", pos + 1)
                    if newline < 0:
                        raise BadInput(f"{source}: not a readable snapshot pickle ({names[op]} at byte {pos} has "
                                       "no line end)")
                    if names[op] in ("INT", "LONG") and newline - pos > _MAX_DIGITS + 2:   # a sign, LONG's L
                        raise BadInput(f"{source}: not a readable snapshot pickle ({names[op]} at byte {pos}: a "
                                       f"number of more than {_MAX_DIGITS} digits)")
                    push(nodes[op] or -((newline - pos) >> 6))
                    built += charges[op] + _PAYLOAD_OBJECT + _PAYLOAD_FACTOR * (newline - pos)
                    pos = newline + 1
                elif action == _FRAME:   # the unpickler copies the frame into its buffer
                    size = _argument(data, pos, 8, source)
                    _check_within(data, pos + 9, size, names[op], source)
                    pos += 9
                    built += size
                elif action == _NOTHING:
                    pos += steps[op]
                elif action == _STOP:
                    limit = pos
                    break
                elif action == _REFUSE:
                    raise BadInput(f"{source}: the pickle {_reaches_for(data, pos, names[op])}: only plain data "
                                   "is read from a pickle")
                elif action == _UNMODELLED:
                    raise BadInput(f"{source}: not a readable snapshot pickle ({names[op]} at byte {pos} is not "
                                   "read from a snapshot)")
                else:
                    raise BadInput(f"{source}: not a readable snapshot pickle (byte {pos}: {op:#04x} is no pickle "
                                   "opcode)")
    except IndexError:   # a memo index never put, a pop of nothing, or the file ends inside an opcode
        raise BadInput(f"{source}: not a readable snapshot pickle ({names[data[pos]]} at byte {pos} takes what "
                       "is not there: a value the stack or memo lacks, or bytes past the end)") from None
    if built > MAX_BUILT:
        raise BadInput(f"{source}: unpickling it would build more than the {MAX_BUILT} bytes of objects a "
                       f"snapshot may (an upper estimate, passed by byte {min(pos, end)} of {end})")
    return built


def _key_nodes(keys: list) -> int:
    """The nodes hashing these keys visits, a string on its own counting none."""
    return sum(key for key in keys if key > 0) if any(keys) else 0


def _compound_nodes(items: list, saturated: int) -> int:
    """The nodes of a tuple or frozenset of these items: 1 + each item's, a string's by its
    length (a compare reads equal strings through), stopping at `saturated`."""
    nodes = 1
    for item in items:
        nodes += item if item > 0 else 1 - item
    return min(nodes, saturated)


def _too_many_key_nodes(source: str, pos: int) -> None:
    raise BadInput(f"{source}: dict keys and set members that are not strings add up to more than the "
                   f"{MAX_KEY_NODES} nodes a snapshot may (a tuple counts 1 + its items, each time one is "
                   f"reached), by byte {pos}")


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
    # int() of a long digit string is quadratic where Python's digit limit is off, and str() of
    # a long int raises where it is on: 2^64 - 1 is 20 digits, so longer text is no number here
    if isinstance(value, bool) or not isinstance(value, (int, float, str)) or (
            isinstance(value, str) and len(value) > 64):
        raise BadInput(f"{what} is not a number")
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        raise BadInput(f"{what} is not a number") from None
    if not 0 <= number <= MAX_U64:
        shown = number if number.bit_length() <= 128 else f"(a number of {number.bit_length()} bits)"
        raise BadInput(f"{what} {shown} is outside 0 .. 2^64 - 1")
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
