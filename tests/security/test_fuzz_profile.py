"""Fuzz runs of the profile readers: event traces, torch snapshots and frag.bin.

Hypothesis mutates valid inputs (field values swapped for hostile ones, bytes flipped,
lines cut) and each goes through the whole offline pipeline the CLI runs: read, replay,
frag.bin encode and decode, metrics, the terminal map.  For every input the test counts:
  tracebacks anything raised that is not the one-line BadInput (the CLI's exit 2),
  lines      a BadInput whose message holds a line break.
Both must stay 0, and the process's peak RSS must stay under RSS_GROWTH_KB above where
that input began (the peak is reset before each): a reader that allocates by a forged
count fails here, on the input that did it.  `pytest -s` prints the counts and the
largest growth.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import struct

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from seedance.model.errors import BadInput
from tests.security.conftest import peak_rss_kib, reset_peak_rss
from seedance.profile import fragbin, heatmap, memory, torch_snapshot

TRACE_EXAMPLES = int(os.environ.get("SEEDANCE_FUZZ_TRACE", "300"))
SNAPSHOT_EXAMPLES = int(os.environ.get("SEEDANCE_FUZZ_SNAPSHOT", "300"))
FRAG_EXAMPLES = int(os.environ.get("SEEDANCE_FUZZ_FRAG", "300"))
RSS_GROWTH_KB = 300 * 1024
FUZZ = settings(deadline=None, database=None, derandomize=False, print_blob=True,
                suppress_health_check=list(HealthCheck))
MIB = 1 << 20

COUNTS: dict = {}
GROWN_KB = [0]  # the largest peak-RSS growth over one input so far


def _count(kind: str, key: str) -> None:
    COUNTS.setdefault(kind, {"inputs": 0, "clean": 0, "refused": 0, "tracebacks": 0, "lines": 0})
    COUNTS[kind][key] += 1


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    for kind, counts in sorted(COUNTS.items()):
        print(f"\nfuzz {kind}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    print(f"peak RSS at most {GROWN_KB[0] / 1024:.1f} MB above where its input began")


def _pipeline(records, source: str) -> None:
    """What `profile memory --output f.bin --terminal` and `profile show f.bin` do with them."""
    profile = memory.profile_events(records, page_size=4096, interval=0.01, source=source)
    memory.memory_facts(profile, {"trace": source})
    frag = fragbin.decode(fragbin.encode(profile), source)
    verdicts = [m.verdict for m in fragbin.metrics_of(frag)]
    heatmap.terminal_view(frag, verdicts, width=100)


def _judge(kind: str, call, shown) -> None:
    # the peak counts from this input's start: one input's blow-up must not be charged to
    # every input (and every reader's fuzzer) after it
    start = reset_peak_rss()
    _count(kind, "inputs")
    try:
        call()
        _count(kind, "clean")
    except BadInput as exc:
        _count(kind, "refused")
        if "\n" in str(exc):
            _count(kind, "lines")
            raise AssertionError(f"a refusal of two lines: {str(exc)!r} on {shown!r}")
    except BaseException as exc:
        _count(kind, "tracebacks")
        raise AssertionError(f"{type(exc).__name__}: {exc} on {shown!r}") from exc
    grown = peak_rss_kib() - start
    GROWN_KB[0] = max(GROWN_KB[0], grown)
    assert grown < RSS_GROWTH_KB, f"peak RSS {grown} KB above the start after {shown!r}"


# --- event traces -------------------------------------------------------------------------------

HOSTILE_NUMBERS = st.sampled_from([0, -1, 1, 4096, 2 ** 63, 2 ** 64 - 1, 2 ** 64, 2 ** 200, 1e15, 1e300, -0.0,
                                   0.5, float("nan"), float("inf"), True, None, "1", [], {}, "\x1b[2J\n"])
FIELDS = st.sampled_from(["t", "addr", "size", "capacity", "base", "dev", "ev", "library"])


def _valid_trace() -> list:
    records = [{"ev": "device", "dev": 0, "base": 0, "capacity": 256 * MIB}]
    for i in range(24):
        records.append({"t": i * 0.004, "ev": "alloc", "dev": 0, "addr": i * 8 * MIB, "size": 3 * MIB,
                        "library": f"/lib/lib{i % 3}.so"})
        if i % 3 == 2:
            records.append({"t": i * 0.004 + 0.001, "ev": "free", "dev": 0, "addr": (i - 1) * 8 * MIB})
    return records


def _text(records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


@st.composite
def traces(draw) -> bytes:
    records = _valid_trace()
    for _ in range(draw(st.integers(1, 6))):
        index = draw(st.integers(0, len(records) - 1))
        records[index] = dict(records[index], **{draw(FIELDS): draw(HOSTILE_NUMBERS)})
    data = bytearray(_text(records))
    for _ in range(draw(st.integers(0, 4))):      # flipped bytes, a cut line
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


@settings(FUZZ, max_examples=TRACE_EXAMPLES)
@given(data=traces())
def test_fuzz_trace_reader(data):
    _judge("trace", lambda: _pipeline(memory.iter_event_lines(io.BytesIO(data), "t.jsonl"), "t.jsonl"), data[:300])


# --- torch snapshots ----------------------------------------------------------------------------

def _valid_snapshot() -> dict:
    base = 1 << 40
    return {"segments": [
        {"device": 0, "address": base, "total_size": 20 * MIB, "blocks": [
            {"address": base, "size": 2 * MIB, "state": "active_allocated"},
            {"address": base + 2 * MIB, "size": 6 * MIB, "state": "inactive"},
            {"address": base + 8 * MIB, "size": 12 * MIB, "state": "active_allocated"}]},
        {"device": 0, "address": base * 2, "total_size": 2 * MIB, "blocks": []}],
        "device_traces": []}


@st.composite
def snapshots(draw) -> bytes:
    snapshot = _valid_snapshot()
    for _ in range(draw(st.integers(0, 4))):
        segment = snapshot["segments"][draw(st.integers(0, 1))]
        if draw(st.booleans()) and isinstance(segment["blocks"], list) and segment["blocks"]:
            block = segment["blocks"][draw(st.integers(0, len(segment["blocks"]) - 1))]
            block[draw(st.sampled_from(["address", "size", "state"]))] = draw(HOSTILE_NUMBERS)
        else:
            segment[draw(st.sampled_from(["address", "total_size", "device", "blocks"]))] = draw(HOSTILE_NUMBERS)
    data = bytearray(pickle.dumps(snapshot, protocol=draw(st.integers(2, 5))))
    for _ in range(draw(st.integers(0, 4))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


def _snapshot_pipeline(data: bytes) -> None:
    snapshot = torch_snapshot.load_snapshot(data, "s.pickle")
    _pipeline(torch_snapshot.snapshot_records(snapshot, 0, "s.pickle"), "s.pickle")


# one byte of the seed flipped to LONG_BINPUT, whose next four bytes become a memo index of
# 137 million: the C unpickler sized and zeroed its memo by it (2 GiB)
FORGED_MEMO = pickle.dumps(_valid_snapshot(), protocol=2).replace(b"q\x00", b"r\x00\x00\x30\x08", 1)


@settings(FUZZ, max_examples=SNAPSHOT_EXAMPLES)
@given(data=snapshots())
@example(data=FORGED_MEMO)
def test_fuzz_torch_snapshot_reader(data):
    _judge("snapshot", lambda: _snapshot_pipeline(data), data[:300])


# --- frag.bin -----------------------------------------------------------------------------------

VALID_FRAG = fragbin.encode(memory.profile_events(_valid_trace()))
HEADER_FIELDS = ["page", "device", "count", "base", "capacity", "interval"]
HEADER_VALUES = {"page": st.sampled_from([0, 1, 4096, 1 << 30, (1 << 30) + 1, (1 << 32) - 1]),
                 "device": st.sampled_from([0, -1, (1 << 31) - 1]),
                 "count": st.sampled_from([0, 1, 5, 4096, 4097, (1 << 32) - 1]),
                 "base": st.sampled_from([0, 1 << 63, (1 << 64) - 1]),
                 "capacity": st.sampled_from([0, 1, 1 << 30, (1 << 64) - 1]),
                 "interval": st.sampled_from([0.01, 0.0, -1.0, float("nan"), float("inf"), 1e-300])}


@st.composite
def frags(draw) -> bytes:
    fields = dict(zip(["magic", "version", "flags", *HEADER_FIELDS], fragbin.HEADER.unpack_from(VALID_FRAG)))
    for name in draw(st.lists(st.sampled_from(HEADER_FIELDS), max_size=3)):
        fields[name] = draw(HEADER_VALUES[name])
    header = fragbin.HEADER.pack(*fields.values())
    body = VALID_FRAG[fragbin.HEADER.size:]
    kind = draw(st.sampled_from(["flip", "rebody", "keep"]))
    if kind == "rebody":   # a well-formed frame around a mutated body: the sizes inside it are what is tested
        import zstandard
        raw = bytearray(zstandard.ZstdDecompressor().decompress(body))
        for _ in range(draw(st.integers(1, 6))):
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        body = zstandard.ZstdCompressor().compress(bytes(raw))
    data = bytearray(header + body)
    if kind == "flip":
        for _ in range(draw(st.integers(1, 6))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


def _frag_pipeline(data: bytes) -> None:
    """What `profile show FRAG.bin` does."""
    frag = fragbin.decode(data, "frag.bin")
    verdicts = [m.verdict for m in fragbin.metrics_of(frag)]
    heatmap.terminal_view(frag, verdicts, width=100)
    json.dumps([m.to_dict() for m in fragbin.metrics_of(frag)])


@settings(FUZZ, max_examples=FRAG_EXAMPLES)
@given(data=frags())
def test_fuzz_frag_bin_reader(data):
    _judge("frag.bin", lambda: _frag_pipeline(data), data[:120])


def test_the_valid_inputs_read_clean():
    """The fuzzers' seeds are themselves accepted: mutations start from a working input."""
    _pipeline(_valid_trace(), "t")
    _snapshot_pipeline(pickle.dumps(_valid_snapshot()))
    _frag_pipeline(VALID_FRAG)
    assert struct.unpack_from("<I", VALID_FRAG, 20)[0] > 1
