"""Hostile input to the profile readers: event traces, torch snapshots, frag.bin.

Each attack runs the real command in a child whose address space is capped (RLIMIT_AS) and
whose peak RSS is read back from wait4: a reader that allocates per time unit, per header
count or per decompressed byte fails by the cap or the RSS bound, not by hanging the suite.
Every cap in docs/profile.md is tested at its edge: just under accepted, just over refused.
"""
from __future__ import annotations

import json
import os
import pickle
import re
import resource
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from seedance.model.errors import BadInput
from seedance.profile import fragbin, torch_snapshot
from seedance.profile.memory import LIMITS, MAX_U64, Limits, iter_event_lines, profile_events
from tests.conftest import BIN, ROOT

MIB = 1 << 20
AS_CAP = 3 << 30          # a child's address space: far above a bounded reader's, far below an unbounded one
RSS_BOUND_KB = 400 * 1024  # what any of these attacks may cost, in kilobytes (ru_maxrss)


def run_measured(*args, cap: int = AS_CAP):
    """(returncode, stdout, stderr, peak RSS in KB) of `seedance ARGS` under an address-space cap."""
    exe = BIN / "seedance"
    cmd = [str(exe), *map(str, args)] if exe.exists() else [sys.executable, "-m", "seedance", *map(str, args)]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen(cmd, stdout=out, stderr=err,
                                 preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)))
        _pid, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (child.returncode, out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace"),
                usage.ru_maxrss)


def refused(result, field: str) -> None:
    """Exit 2, one line on stderr naming the field, within the RSS bound."""
    code, _out, err, rss = result
    assert code == 2, (code, err[-500:])
    assert err.startswith("seedance: error:") and err.count("\n") == 1, err[-500:]
    assert field in err, err
    assert rss < RSS_BOUND_KB, rss


def accepted(result) -> None:
    code, _out, err, rss = result
    assert code in (0, 1), (code, err[-500:])
    assert rss < RSS_BOUND_KB, rss


def write_lines(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


DEVICE = {"ev": "device", "dev": 0, "base": 0, "capacity": 1 << 30}


def alloc(t, addr, size=4096, **extra):
    return {"t": t, "ev": "alloc", "dev": 0, "addr": addr, "size": size, **extra}


# --- the event trace ---------------------------------------------------------------------------

def test_a_far_future_time_is_refused_in_bounded_memory(tmp_path):
    # one sample per 10 ms up to t = 1e15 s is 1e17 samples: the reader used to try
    trace = write_lines(tmp_path / "t.jsonl", [DEVICE, alloc(0, 0), alloc(1e15, 8192)])
    refused(run_measured("profile", "memory", "--from-trace", trace), "'t'")


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "-1", '"soon"', "true"])
def test_a_time_that_is_not_finite_or_negative_is_refused(tmp_path, token):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(DEVICE) + "\n" + '{"t":%s,"ev":"alloc","dev":0,"addr":0,"size":1}\n' % token)
    refused(run_measured("profile", "memory", "--from-trace", trace), "'t'")


def test_time_span_edge():
    span = LIMITS.span_s
    assert span == 1e7
    # just under (at) the span: accepted, the timeline folded to the sample cap
    profile = profile_events([DEVICE, alloc(0.0, 0), alloc(span, 8192)])
    assert len(profile.samples) <= LIMITS.samples and profile.final.live_allocations == 2
    assert profile.interval > profile.requested_interval
    with pytest.raises(BadInput, match="'t'.*at most 1e\\+07 s"):
        profile_events([DEVICE, alloc(0.0, 0), alloc(span + 1, 8192)])


def test_sample_cap_folds_the_timeline():
    limits = Limits(samples=8)
    # 6 boundaries passed + the final sample: 7 samples, the interval as asked
    under = profile_events([DEVICE, alloc(0.0, 0), alloc(0.06, 8192)], interval=0.01, limits=limits)
    assert len(under.samples) == 7 and under.interval == 0.01
    # 8 boundaries + the final would be 9: folded once, every other sample kept
    over = profile_events([DEVICE, alloc(0.0, 0), alloc(0.08, 8192)], interval=0.01, limits=limits)
    assert over.interval == 0.02 and len(over.samples) <= 8
    assert [round(m.t, 3) for m in over.samples] == [0.0, 0.02, 0.04, 0.06, 0.08]
    assert LIMITS.samples == 4096


def test_map_extent_budget_folds_the_timeline():
    # four separate allocations: each sample's map holds 4 extents
    records = [DEVICE] + [alloc(0.0, i * 3 * 4096) for i in range(4)] + [alloc(0.05, 100 * 4096)]
    under = profile_events(records, interval=0.01, limits=Limits(map_extents=4 * 5 + 5))
    assert under.interval == 0.01 and under.map_extents <= 25
    over = profile_events(records, interval=0.01, limits=Limits(map_extents=4 * 5 + 4))
    assert over.interval > 0.01 and over.map_extents <= 24
    assert LIMITS.map_extents == 1 << 22


def test_live_set_edge():
    limits = Limits(live=3)
    profile_events([DEVICE] + [alloc(0.0, i * 4096) for i in range(3)], limits=limits)
    with pytest.raises(BadInput, match="more than 3 live allocations"):
        profile_events([DEVICE] + [alloc(0.0, i * 4096) for i in range(4)], limits=limits)
    # frees make room: the cap is on the live set, not on the allocations ever made
    frees = [{"t": 0.0, "ev": "free", "dev": 0, "addr": 0}]
    profile_events([DEVICE] + [alloc(0.0, i * 4096) for i in range(3)] + frees + [alloc(0.0, 0)], limits=limits)
    assert LIMITS.live == 1 << 18


def test_event_and_line_caps_edge():
    lines = [json.dumps(DEVICE)] + [json.dumps(alloc(0.0, i * 4096)) for i in range(4)]
    assert len(list(iter_event_lines(lines, limits=Limits(events=5)))) == 5
    with pytest.raises(BadInput, match="more than 4 records"):
        list(iter_event_lines(lines, limits=Limits(events=4)))
    line = json.dumps(alloc(0.0, 0, library="x" * 50))
    import io
    assert len(list(iter_event_lines(io.BytesIO(line.encode() + b"\n"), limits=Limits(line_bytes=len(line))))) == 1
    with pytest.raises(BadInput, match="line 1: longer than"):
        list(iter_event_lines(io.BytesIO(line.encode() + b"\n"), limits=Limits(line_bytes=len(line) - 1)))
    assert (LIMITS.events, LIMITS.line_bytes) == (1_000_000_000, 1 << 20)


def test_a_line_without_newline_is_refused_unread(tmp_path):
    trace = tmp_path / "t.jsonl"
    with open(trace, "wb") as handle:
        handle.write(b'{"ev":"device","dev":0,"base":0,"capacity":4096,"pad":"')
        handle.write(b"x" * (LIMITS.line_bytes * 64))   # 64 MiB on one line
    refused(run_measured("profile", "memory", "--from-trace", trace), "line 1: longer than")


def test_deep_nesting_is_one_line(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("[" * 100000 + "]" * 100000 + "\n")
    refused(run_measured("profile", "memory", "--from-trace", trace), "line 1")


def test_many_library_names_share_a_bounded_table():
    records = [DEVICE] + [alloc(0.0, i * 8192, library=f"/lib{i}.so" + "x" * 5000) for i in range(5)]
    profile = profile_events(records, limits=Limits(sites=3))
    names = {s["site"] for s in profile.sites}
    assert "other" in names and all(len(n) <= LIMITS.site_chars for n in names)


@pytest.mark.parametrize("capacity, ok", [(MAX_U64, True), (MAX_U64 + 1, False), (0, False)])
def test_device_capacity_edge(tmp_path, capacity, ok):
    device = dict(DEVICE, capacity=capacity)
    trace = write_lines(tmp_path / "t.jsonl", [device, alloc(0.0, 0)])
    result = run_measured("profile", "memory", "--from-trace", trace, "--output", tmp_path / "f.bin")
    if ok:   # the largest 64-bit range still writes a frag.bin that reads back
        accepted(result)
        assert fragbin.read_file(tmp_path / "f.bin", "f.bin").capacity == MAX_U64
    else:
        refused(result, "'capacity'")


def test_a_range_past_the_address_space_is_refused(tmp_path):
    trace = write_lines(tmp_path / "t.jsonl", [dict(DEVICE, base=1 << 63, capacity=(1 << 63) + 1), alloc(0.0, 1 << 63)])
    refused(run_measured("profile", "memory", "--from-trace", trace), "'capacity'")
    refused(run_measured("profile", "memory", "--from-trace", trace, "--capacity", "1e999"), "--capacity")


@pytest.mark.parametrize("flag, value, field", [("--page-size", "2G", "--page-size"),
                                                ("--gpu-id", str(1 << 40), "--gpu-id"),
                                                ("--sample-interval", "1e-9s", "--sample-interval")])
def test_settings_frag_bin_cannot_hold_are_refused(tmp_path, flag, value, field):
    trace = write_lines(tmp_path / "t.jsonl", [DEVICE, alloc(0.0, 0)])
    refused(run_measured("profile", "memory", "--from-trace", trace, flag, value), field)


def test_an_address_past_64_bits_is_refused(tmp_path):
    trace = write_lines(tmp_path / "t.jsonl", [DEVICE, alloc(0.0, 1 << 64)])
    refused(run_measured("profile", "memory", "--from-trace", trace), "'addr'")


def _bounded_trace(path: Path, events: int, live: int = 256, step: float = 1e-3) -> None:
    """`events` alloc/free records cycling over `live` slots: the live set never passes
    `live`, and the trace spans events/2 ms, past the sample cap's 4096 intervals."""
    with open(path, "w") as out:
        out.write(json.dumps(dict(DEVICE, capacity=live * 2 * MIB)) + "\n")
        lines = []
        for i in range(events // 2):
            slot, t = i % live, i * step
            if i >= live:
                lines.append('{"t":%.6f,"ev":"free","dev":0,"addr":%d}\n' % (t, slot * 2 * MIB))
            lines.append('{"t":%.6f,"ev":"alloc","dev":0,"addr":%d,"size":%d,"library":"libx.so"}\n'
                         % (t, slot * 2 * MIB, MIB + (i % 7) * 4096))
            if len(lines) >= 10000:
                out.writelines(lines)
                lines.clear()
        out.writelines(lines)


def test_peak_rss_does_not_grow_with_the_trace(tmp_path):
    small_events = int(os.environ.get("SEEDANCE_RSS_SMALL_EVENTS", "200000"))
    large_events = int(os.environ.get("SEEDANCE_RSS_LARGE_EVENTS", "2000000"))
    rss = {}
    for events in (small_events, large_events):
        trace = tmp_path / f"t{events}.jsonl"
        _bounded_trace(trace, events)
        code, _out, err, rss[events] = run_measured("profile", "memory", "--from-trace", trace, "--json")
        assert code in (0, 1), err
        trace.unlink()
    print(f"\npeak RSS: {small_events} events {rss[small_events] / 1024:.1f} MB, "
          f"{large_events} events {rss[large_events] / 1024:.1f} MB")
    assert rss[large_events] < 1.2 * rss[small_events] + 20 * 1024, rss


# --- torch snapshots ---------------------------------------------------------------------------

def _snapshot_file(tmp_path, segments) -> Path:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps({"segments": segments, "device_traces": []}))
    return path


def _segment(address, total, blocks=()):
    return {"device": 0, "address": address, "total_size": total, "blocks": list(blocks)}


def test_huge_segments_are_refused_naming_total_size(tmp_path):
    half = 1 << 63
    over = _snapshot_file(tmp_path, [_segment(0, half), _segment(half, half)])   # end to end: 2^64
    refused(run_measured("profile", "memory", "--from-torch-snapshot", over), "'total_size'")
    under = _snapshot_file(tmp_path, [_segment(0, half), _segment(half, half - 1,
                                                                  [{"size": 4096, "state": "active_allocated"}])])
    accepted(run_measured("profile", "memory", "--from-torch-snapshot", under, "--output", tmp_path / "f.bin"))


@pytest.mark.parametrize("segment, field", [(_segment(-1, 4096), "'address'"), (_segment(0, float("inf")), "'total_size'"),
                                            (_segment(0, 4096, [{"size": 8192, "state": "active"}]), "outside"),
                                            (_segment(0, 4096, [{"size": -5}]), "'size'"),
                                            (dict(_segment(0, 4096), blocks="blocks"), "'blocks'")])
def test_bad_segment_numbers_are_one_line(tmp_path, segment, field):
    refused(run_measured("profile", "memory", "--from-torch-snapshot", _snapshot_file(tmp_path, [segment])), field)


def test_segment_and_block_caps_edge(monkeypatch):
    segments = [_segment(i * 4096, 4096) for i in range(torch_snapshot.MAX_SEGMENTS)]
    assert len(torch_snapshot.snapshot_records({"segments": segments}, 0)) == 1
    with pytest.raises(BadInput, match="'segments'"):
        torch_snapshot.snapshot_records({"segments": segments + [_segment(1 << 40, 4096)]}, 0)
    assert (torch_snapshot.MAX_SEGMENTS, torch_snapshot.MAX_BLOCKS) == (1 << 16, 1 << 20)
    monkeypatch.setattr(torch_snapshot, "MAX_BLOCKS", 4)
    blocks = [{"address": i * 1024, "size": 1024, "state": "active_allocated"} for i in range(4)]
    assert len(torch_snapshot.snapshot_records({"segments": [_segment(0, 4096, blocks)]}, 0)) == 5
    with pytest.raises(BadInput, match="more than 4 blocks"):
        torch_snapshot.snapshot_records({"segments": [_segment(0, 4096, blocks), _segment(4096, 4096, blocks[:1])]}, 0)


def test_snapshot_byte_cap_edge(tmp_path, monkeypatch):
    data = pickle.dumps({"segments": [_segment(0, 4096)]})
    assert torch_snapshot.MAX_BYTES == 256 << 20
    monkeypatch.setattr(torch_snapshot, "MAX_BYTES", len(data))
    path = tmp_path / "s.pickle"
    path.write_bytes(data)
    assert torch_snapshot.read_snapshot(path, "s")["segments"]
    path.write_bytes(data + b".")
    with pytest.raises(BadInput, match="larger than"):
        torch_snapshot.read_snapshot(path, "s")


# --- frag.bin ----------------------------------------------------------------------------------

def _frag(count=1, body=b"", page=4096, capacity=1 << 30, interval=0.01, content_size=True) -> bytes:
    import zstandard
    header = fragbin.HEADER.pack(fragbin.MAGIC, fragbin.VERSION, 0, page, 0, count, 0, capacity, interval)
    return header + zstandard.ZstdCompressor(write_content_size=content_size).compress(body)


def _bomb(declared: int) -> bytes:
    """A frag.bin whose frame inflates to `declared` zero bytes from a few kilobytes."""
    import io

    import zstandard
    sink = io.BytesIO()
    writer = zstandard.ZstdCompressor(level=1).stream_writer(sink, size=declared, closefd=False)
    chunk = bytes(MIB)
    for _ in range(declared // MIB):
        writer.write(chunk)
    writer.write(bytes(declared % MIB))
    writer.close()
    header = fragbin.HEADER.pack(fragbin.MAGIC, fragbin.VERSION, 0, 4096, 0, 1, 0, 1 << 30, 0.01)
    return header + sink.getvalue()


def test_a_decompression_bomb_is_refused_before_it_inflates(tmp_path):
    bomb = tmp_path / "frag.bin"
    bomb.write_bytes(_bomb(1 << 30))   # 1 GiB of zeros in a few tens of kilobytes
    assert bomb.stat().st_size < 200 * 1024
    refused(run_measured("profile", "show", bomb), "declares")


def test_a_forged_sample_count_is_refused_before_any_allocation(tmp_path):
    forged = tmp_path / "frag.bin"
    forged.write_bytes(_frag(count=(1 << 32) - 1, body=b"\0" * 2048))
    refused(run_measured("profile", "show", forged), "sample count")


def test_frag_sample_count_edge():
    empty = struct.pack("<dI", 0.0, 0)
    assert len(fragbin.decode(_frag(LIMITS.samples, empty * LIMITS.samples)).samples) == 4096
    with pytest.raises(BadInput, match="sample count 4097"):
        fragbin.decode(_frag(LIMITS.samples + 1, empty * (LIMITS.samples + 1)))
    with pytest.raises(BadInput, match="sample count 0"):
        fragbin.decode(_frag(0, b""))


def test_frag_body_size_edge():
    limits = Limits(map_extents=4, live=4)
    extents = b"".join(struct.pack("<QQ", i * 2, 1) for i in range(4))
    body = struct.pack("<dI", 0.0, 4) + extents
    assert len(body) == fragbin.max_body(1, limits)
    assert len(fragbin.decode(_frag(1, body), limits=limits).samples) == 1
    with pytest.raises(BadInput, match="declares 77 bytes"):
        fragbin.decode(_frag(1, body + b"\0"), limits=limits)
    with pytest.raises(BadInput, match="does not declare its size"):
        fragbin.decode(_frag(1, body, content_size=False), limits=limits)
    # a sample's extents: at most the live-set cap
    five = struct.pack("<dI", 0.0, 5) + extents + struct.pack("<QQ", 20, 1)
    with pytest.raises(BadInput, match="5 extents"):
        fragbin.decode(_frag(1, five), limits=Limits(map_extents=5, live=4))
    assert fragbin.max_body(LIMITS.samples) == 4096 * 12 + (1 << 22) * 16


def test_frag_file_size_edge(tmp_path):
    limits = Limits(map_extents=4, live=4, samples=1)
    path = tmp_path / "f.bin"
    path.write_bytes(b"\0" * fragbin.max_file(limits))
    with pytest.raises(BadInput, match="not a seedance frag.bin"):   # read whole, then judged
        fragbin.read_file(path, "f.bin", limits)
    path.write_bytes(b"\0" * (fragbin.max_file(limits) + 1))
    with pytest.raises(BadInput, match="larger than"):
        fragbin.read_file(path, "f.bin", limits)


@pytest.mark.parametrize("field, value, words", [("page", 0, "page size"), ("page", (1 << 30) + 1, "page size"),
                                                ("capacity", 0, "capacity"), ("interval", float("nan"), "interval")])
def test_frag_header_fields_are_checked(field, value, words):
    args = {"page": 4096, "capacity": 1 << 30, "interval": 0.01, field: value}
    with pytest.raises(BadInput, match=words):
        fragbin.decode(_frag(1, struct.pack("<dI", 0.0, 0), **args))


# --- output escaping ---------------------------------------------------------------------------

def test_names_from_a_trace_are_escaped_in_text_output(tmp_path):
    evil = "/x/lib\x1b[2J\x1b[31mevil.so\nseedance: error: forged"
    start = {"schema": "seedance.run-events/v1", "kind": "start", "t": 1.0, "wall": 1000.0}
    launches = [{"t": 1.0 + i * 1e-5, "ev": "launch", "api": "cuLaunchKernel", "library": evil} for i in range(3)]
    trace = write_lines(tmp_path / "t.jsonl", [start, *launches])
    code, out, err, _rss = run_measured("profile", "launches", "--from-trace", trace)
    assert code in (0, 1), err
    assert "\x1b" not in out and "\nseedance: error: forged" not in out
    assert "lib\\x1b[2J\\x1b[31mevil.so\\nseedance: error: forged" in out


# --- the documented caps are the code's --------------------------------------------------------

def test_docs_state_every_cap_with_its_value():
    docs = (ROOT / "docs" / "profile.md").read_text()
    expected = {"line_bytes": "1 MiB", "events": "1,000,000,000", "live": "262,144", "span_s": "10,000,000 s",
                "samples": "4,096", "map_extents": "4,194,304", "sites": "1,024", "min_interval_s": "1 µs"}
    for field, words in expected.items():
        row = re.search(rf"^\| `{field}` \|[^\n]*\|", docs, re.M)
        assert row and words in row.group(0), (field, words)
    assert (LIMITS.line_bytes, LIMITS.events, LIMITS.live, LIMITS.span_s, LIMITS.samples, LIMITS.map_extents,
            LIMITS.sites, LIMITS.min_interval_s) == (1 << 20, 10 ** 9, 262144, 1e7, 4096, 1 << 22, 1024, 1e-6)
    for words in ("256 MiB", "65,536 segments", "1,048,576 blocks", "2^64 - 1", "64 MiB"):
        assert words in docs, words
