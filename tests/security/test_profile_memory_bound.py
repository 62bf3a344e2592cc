"""The profile readers' memory bound, on the inputs that once broke it.

Each crafted input is a few hundred bytes or a few megabytes; before the readers bounded
what they build from it, each cost hundreds of MB to gigabytes (or a hang).  Each test
asserts the one-line refusal and that this process's peak RSS (reset just before the
call: conftest.reset_peak_rss) grew by less than GROWTH_KB.
"""
from __future__ import annotations

import pickle

import pytest
import zstandard

from seedance.model.errors import BadInput
from seedance.profile import fragbin, torch_snapshot
from tests.security.conftest import peak_rss_kib, reset_peak_rss

GROWTH_KB = 64 * 1024
MIB = 1 << 20


def _snapshot(blocks=None, **extra) -> dict:
    return {"segments": [{"device": 0, "address": 1 << 40, "total_size": 4 * MIB,
                          "blocks": blocks if blocks is not None else
                          [{"address": 1 << 40, "size": 2 * MIB, "state": "active_allocated"}]}], **extra}


def _refused_within_bound(data: bytes, match: str) -> str:
    start = reset_peak_rss()
    with pytest.raises(BadInput, match=match) as refused:
        torch_snapshot.snapshot_records(torch_snapshot.load_snapshot(data, "s.pickle"), 0, "s.pickle")
    grown = peak_rss_kib() - start
    message = str(refused.value)
    assert "\n" not in message and message.startswith("s.pickle: ")
    assert grown < GROWTH_KB, f"peak RSS grew {grown} KiB on the way to: {message}"
    return message


# --- the pickle ---------------------------------------------------------------------------------

def test_a_forged_memo_index_is_refused_before_the_unpickler_sizes_its_memo_by_it():
    """LONG_BINPUT's four bytes are a memo index; the C unpickler grows its memo array to
    twice the index and zeroes it, so nine bytes once cost 2 GiB."""
    data = pickle.dumps(_snapshot(), protocol=2).replace(b"q\x00", b"r\x00\x00\x30\x08", 1)
    _refused_within_bound(data, r"memo index 137363456 .* the next is 0")


def test_memo_indices_in_order_are_read_and_one_past_the_next_is_refused():
    """The edge: protocol 2 numbers the memo 0, 1, 2, ... and past 255 writes LONG_BINPUT;
    an index one past the next one is refused."""
    blocks = [{"address": (1 << 40) + i * 4096, "size": 4096, "state": f"active_allocated {i}"}
              for i in range(300)]
    data = pickle.dumps(_snapshot(blocks), protocol=2)
    assert b"r\x2c\x01\x00\x00" in data   # LONG_BINPUT 300: indices past 255 are read
    records = torch_snapshot.snapshot_records(torch_snapshot.load_snapshot(data, "s"), 0, "s")
    assert len(records) == 301
    # BINPUT 0 after the top dict: index 0 is the next one; 1 is one past it
    assert torch_snapshot.load_snapshot(data.replace(b"}q\x00", b"}r\x00\x00\x00\x00", 1), "s")
    _refused_within_bound(data.replace(b"}q\x00", b"}q\x01", 1), "memo index 1 .* the next is 0")


def test_what_unpickling_builds_is_capped_at_the_edge(monkeypatch):
    """MAX_BUILT caps the prescan's estimate of the objects: at the estimate the snapshot
    is read, one byte under it is refused with the cap named."""
    data = pickle.dumps(_snapshot(), protocol=4)
    estimate = torch_snapshot._prescan(data, "s")
    assert torch_snapshot.MAX_BUILT == 4 << 30
    monkeypatch.setattr(torch_snapshot, "MAX_BUILT", estimate)
    assert torch_snapshot.load_snapshot(data, "s")["segments"]
    monkeypatch.setattr(torch_snapshot, "MAX_BUILT", estimate - 1)
    _refused_within_bound(data, f"more than the {estimate - 1} bytes of objects")


@pytest.mark.parametrize("opcode", [b"\x8f", b"}", b"]\x94"], ids=["empty sets", "empty dicts", "memoized lists"])
def test_objects_that_outweigh_their_bytes_are_refused_before_they_are_built(monkeypatch, opcode):
    """An empty set is one opcode byte and over 200 bytes of memory: 2 MB of them once built
    hundreds of MB before the shape check refused the result."""
    data = b"\x80\x04(" + opcode * (2 * MIB // len(opcode)) + b"l."
    monkeypatch.setattr(torch_snapshot, "MAX_BUILT", 32 * MIB)
    _refused_within_bound(data, f"more than the {32 * MIB} bytes of objects")


def test_a_length_past_the_end_is_refused_before_anything_is_allocated_for_it(capfd):
    """BYTEARRAY8 with a length of 2^40: the C unpickler allocated it first, and its error
    path printed a SystemError to stderr beside the refusal."""
    data = b"\x80\x05\x96" + (1 << 40).to_bytes(8, "little") + b"x" * 64 + b"."
    _refused_within_bound(data, "declares 1099511627776 bytes")
    assert capfd.readouterr().err == ""


def test_a_class_named_with_a_line_break_is_refused_in_one_line():
    """STACK_GLOBAL takes the module and name from strings, which may hold a newline."""
    data = (b"\x80\x04\x8c\x0aos\nsystem\x94\x8c\x06system\x94\x93\x94)\x81.")
    message = _refused_within_bound(data, "only plain data")
    assert "STACK_GLOBAL" in message


def test_a_state_that_is_no_string_is_refused_without_spelling_it_out():
    """A block's state made of a list nested 26 deep, each level holding the one below
    twice: 300 bytes of pickle whose str() is hundreds of MB (and at depth 40, more than
    any memory)."""
    state: list = [0]
    for _ in range(26):
        state = [state, state]
    data = pickle.dumps(_snapshot([{"address": 1 << 40, "size": 4096, "state": state}]), protocol=4)
    assert len(data) < 400
    _refused_within_bound(data, "'state' is not a string")


# --- frag.bin -----------------------------------------------------------------------------------

def _frag(extents) -> bytes:
    body = fragbin.SAMPLE.pack(0.0, len(extents)) + b"".join(fragbin.EXTENT.pack(*e) for e in extents)
    header = fragbin.HEADER.pack(fragbin.MAGIC, fragbin.VERSION, 0, 4096, 0, 1, 0, 1 << 30, 0.01)
    return header + zstandard.ZstdCompressor().compress(body)


def test_frag_bin_extents_out_of_order_are_refused():
    """metrics_of rebuilds each map in the stored order; 262,144 extents stored backwards
    took 15 s a sample (each insertion shifts the ones before it), 16 such samples fit the
    extent budget."""
    with pytest.raises(BadInput, match="extent at page 0, before the end of the one before it") as refused:
        fragbin.decode(_frag([(4, 2), (0, 1)]))
    assert "\n" not in str(refused.value)
    with pytest.raises(BadInput, match="extent at page 1, before the end"):
        fragbin.decode(_frag([(0, 2), (1, 4)]))     # overlapping


def test_frag_bin_extents_that_touch_are_read():
    """The edge: an extent starting on the page where the one before it ends is read, as
    page-rounding can write it."""
    frag = fragbin.decode(_frag([(0, 2), (2, 3), (9, 1)]))
    assert fragbin.metrics_of(frag)[0].used_bytes == 6 * 4096
