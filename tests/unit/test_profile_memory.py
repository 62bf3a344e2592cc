"""Memory fragmentation: known answers computed by hand, frag.bin, torch snapshots, the CLI."""
import json
import pickle

import pytest

from seedance.model.errors import BadInput
from seedance.profile import fragbin
from seedance.profile.memory import AddressMap, profile_events, read_event_lines, verdict
from seedance.profile.torch_snapshot import load_snapshot, snapshot_records
from tests.conftest import run_cli

MIB = 1 << 20


def _trace(allocs, capacity=1024 * MIB, frees=()):
    records = [{"ev": "device", "dev": 0, "base": 0, "capacity": capacity}]
    t = 0.0
    for addr, size in allocs:
        records.append({"t": t, "ev": "alloc", "dev": 0, "addr": addr, "size": size, "library": "libx.so"})
        t += 0.01
    for addr in frees:
        records.append({"t": t, "ev": "free", "dev": 0, "addr": addr})
        t += 0.01
    return records


def test_the_issue_known_answer():
    # ten 64 MiB blocks spaced 96 MiB apart in 1 GiB: nine 32 MiB gaps + a 96 MiB tail
    # = 10 free blocks, 384 MiB free, largest 96/384 = 25%, mean 38.4 MiB -> warning
    profile = profile_events(_trace([(i * 96 * MIB, 64 * MIB) for i in range(10)]))
    final = profile.final
    assert final.free_blocks == 10
    assert final.free_bytes == 384 * MIB
    assert final.largest_free_block == 96 * MIB
    assert final.largest_free_ratio == 0.25
    assert final.mean_free_block_bytes == 38.4 * MIB
    assert final.verdict == "warning"


def test_danger_and_healthy_by_hand():
    # 1 MiB used every 2 MiB over 64 MiB, in a 64 MiB device: 32 holes of 1 MiB -> mean 1 MiB: danger
    danger = profile_events(_trace([(i * 2 * MIB, MIB) for i in range(32)], capacity=64 * MIB)).final
    assert (danger.free_blocks, danger.free_bytes, danger.verdict) == (32, 32 * MIB, "danger")
    # one 100 MiB allocation at the start of 1 GiB: one 924 MiB hole, ratio 100% -> healthy
    healthy = profile_events(_trace([(0, 100 * MIB)])).final
    assert (healthy.free_blocks, healthy.largest_free_ratio, healthy.verdict) == (1, 1.0, "healthy")
    # the thresholds are strict inequalities: exactly 35% is not healthy, exactly 12% not danger
    assert verdict(0.35, 100 * MIB) == "warning" and verdict(0.36, 100 * MIB) == "healthy"
    assert verdict(0.12, 100 * MIB) == "warning" and verdict(0.119, 100 * MIB) == "danger"
    assert verdict(0.5, 8 * MIB) == "warning" and verdict(0.5, 8 * MIB - 1) == "danger"


def test_pages_round_up_and_frees_merge_holes():
    amap = AddressMap(0, 16 * 4096, 4096)
    amap.alloc(0, 1)             # one byte takes a page
    amap.alloc(2 * 4096, 4097)   # two pages
    assert [(a, b) for a, b in amap.free_blocks()] == [(4096, 8192), (16384, 65536)]
    assert amap.free(2 * 4096)
    assert amap.free_blocks() == [(4096, 65536)]
    assert not amap.free(12345)


def test_samples_at_each_interval():
    records = _trace([(0, MIB), (2 * MIB, MIB), (4 * MIB, MIB)], capacity=64 * MIB)  # t = 0, .01, .02
    profile = profile_events(records, interval=0.005)
    # boundaries 0, .005, .010, .015 passed before the last event, then the final sample
    assert [round(m.t, 3) for m in profile.samples] == [0.0, 0.005, 0.01, 0.015, 0.02]
    assert [m.live_allocations for m in profile.samples] == [1, 1, 2, 2, 3]


def test_fragbin_round_trip_and_damage(tmp_path):
    profile = profile_events(_trace([(i * 96 * MIB, 64 * MIB) for i in range(10)], frees=[0, 96 * MIB]))
    data = fragbin.encode(profile)
    frag = fragbin.decode(data)
    assert (frag.page_size, frag.capacity, len(frag.samples)) == (4096, 1024 * MIB, len(profile.samples))
    assert [m.to_dict() for m in fragbin.metrics_of(frag)] == [m.to_dict() for m in profile.samples]
    with pytest.raises(BadInput, match="not a seedance frag.bin"):
        fragbin.decode(b"PK\x03\x04" + data[4:])
    with pytest.raises(BadInput):
        fragbin.decode(data[:-7])
    with pytest.raises(BadInput, match="format version"):
        fragbin.decode(data[:8] + b"\x09\x00" + data[10:])


def test_torch_snapshot_segments_and_blocks():
    snapshot = {"segments": [
        {"device": 0, "address": 1 << 40, "total_size": 20 * MIB, "blocks": [
            {"address": 1 << 40, "size": 2 * MIB, "state": "active_allocated"},
            {"address": (1 << 40) + 2 * MIB, "size": 6 * MIB, "state": "inactive"},
            {"address": (1 << 40) + 8 * MIB, "size": 2 * MIB, "state": "active_allocated"},
            {"address": (1 << 40) + 10 * MIB, "size": 10 * MIB, "state": "inactive"}]},
        {"device": 1, "address": 1 << 41, "total_size": 2 * MIB, "blocks": []}],
        "device_traces": []}
    restored = load_snapshot(pickle.dumps(snapshot))
    final = profile_events(snapshot_records(restored, 0)).final
    # device 0's one segment: holes of 6 and 10 MiB -> ratio 10/16, mean 8 MiB (not < 8): warning
    assert (final.free_blocks, final.free_bytes, final.largest_free_ratio) == (2, 16 * MIB, 10 / 16)
    assert final.verdict == "warning"


def test_snapshot_pickle_with_code_is_refused():
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))
    with pytest.raises(BadInput, match="only plain data"):
        load_snapshot(pickle.dumps({"segments": [Evil()]}))


def test_bad_trace_line_is_named():
    with pytest.raises(BadInput, match="line 2"):
        read_event_lines(['{"ev":"device","capacity":1}', "{oops"])


def _write(tmp_path, records, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def test_cli_warning_error_and_pictures(tmp_path):
    warn = _write(tmp_path, _trace([(i * 96 * MIB, 64 * MIB) for i in range(10)]))
    done = run_cli("profile", "memory", "--from-trace", warn, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [(f["rule"], f["severity"]) for f in report["findings"]] == [("gpu-memory-fragmented", "warning")]
    assert report["profile"]["memory"]["final"]["largest_free_ratio"] == 0.25
    danger = _write(tmp_path, _trace([(i * 2 * MIB, MIB) for i in range(32)], capacity=64 * MIB), "d.jsonl")
    out, png = tmp_path / "frag.bin", tmp_path / "frag.png"
    done = run_cli("profile", "memory", "--from-trace", danger, "--output", out, "--heatmap", png, "--terminal")
    assert done.returncode == 1, done.stderr
    assert "ERROR" in done.stdout and "gpu-memory-fragmented" in done.stdout and "X" in done.stdout
    assert out.read_bytes()[:8] == b"SEEDFRAG" and png.read_bytes()[:4] == b"\x89PNG"
    shown = run_cli("profile", "show", out, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["samples"][-1]["verdict"] == "danger"
    # a rerun may replace its own outputs; a bad line is one line, exit 2
    assert run_cli("profile", "memory", "--from-trace", danger, "--output", out).returncode == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"ev":"device","dev":0,"base":0,"capacity":4096}\n{"t":0,"ev":"alloc","dev":0,"addr":-1,"size":1}\n')
    done = run_cli("profile", "memory", "--from-trace", bad)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "line 2" in done.stderr


def test_hole_sites_come_from_the_worst_moment_not_the_end():
    # fragment (danger), then free everything: the end is healthy, the blame stays
    allocs = [(i * 2 * MIB, MIB) for i in range(32)]
    profile = profile_events(_trace(allocs, capacity=128 * MIB, frees=[a for a, _ in allocs]))
    assert profile.final.verdict == "healthy"
    worst = min((m for m in profile.samples if m.verdict == "danger"), key=lambda m: m.largest_free_ratio)
    # at the worst moment every free block but the one above the last allocation (the tail
    # of the 128 MiB range is never allocated) is bounded by an allocation of libx.so
    assert [s["site"] for s in profile.sites] == ["libx.so"]
    assert profile.sites[0]["holes"] == worst.free_blocks - 1 > 0
