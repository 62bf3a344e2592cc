"""The torch snapshot reader's time bound, on the inputs that once broke it.

Unpickling is linear in the opcodes but for hashing: dict keys and set members are hashed,
a tuple hashes its items again each time, and keys that are not strings hash alike in every
process.  Before the prescan counted them, 148 bytes of shared nested tuple ran for hours
and 1.5 MB of colliding integer keys for minutes.  Each hostile file here goes to the real
CLI in a child with a timeout, so the old code fails the test instead of hanging it.
"""
from __future__ import annotations

import pickle
import random
import time

import pytest

from seedance.model.errors import BadInput
from seedance.profile import torch_snapshot
from tests.conftest import run_cli

MIB = 1 << 20
P61 = (1 << 61) - 1   # hash(n) == hash(n + k * P61) for every int n (Python's numeric hash)


def _refused_fast(tmp_path, data: bytes, match: str, env=None) -> str:
    """Exit 2 with one line on stderr containing `match`, within seconds; the child is killed
    (and the test fails) at 30 s."""
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(data)
    start = time.monotonic()
    proc = run_cli("profile", "memory", "--from-torch-snapshot", path, env=env, timeout=30)
    elapsed = time.monotonic() - start
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-500:])
    assert proc.stderr.startswith("seedance: error:") and proc.stderr.count("\n") == 1, proc.stderr[-500:]
    assert match in proc.stderr, proc.stderr
    assert elapsed < 10, f"refused after {elapsed:.1f} s"
    return proc.stderr


def _snapshot(**extra) -> dict:
    return {"segments": [{"device": 0, "address": 1 << 40, "total_size": 4 * MIB,
                          "blocks": [{"address": 1 << 40, "size": 2 * MIB, "state": "active_allocated"}]}],
            **extra}


def _reads(data: bytes) -> None:
    snapshot = torch_snapshot.load_snapshot(data, "s")
    assert len(torch_snapshot.snapshot_records(snapshot, 0, "s")) == 2


def _refused(data: bytes, match: str) -> None:
    with pytest.raises(BadInput, match=match) as refused:
        torch_snapshot.load_snapshot(data, "s")
    assert "\n" not in str(refused.value)


# --- hashing -------------------------------------------------------------------------------------

def test_a_shared_nested_tuple_key_is_refused_in_one_line_at_once(tmp_path):
    """(), then a tuple of the tuple before it twice (DUP, TUPLE2: 2 bytes a level), 64 levels
    deep, as a dict key: hashing it visits 2^65 items.  148 bytes, once a hang of hours."""
    key = b")" + b"2\x86" * 64
    data = b"\x80\x04}(\x8c\x08segments]" + key + b"K\x00u."
    assert len(data) == 148
    message = _refused_fast(tmp_path, data, "more than the 4096 nodes")
    assert "keys and set members that are not strings" in message


def test_integer_keys_that_collide_are_refused_before_each_is_compared_with_all_the_others(tmp_path):
    """100,000 integer keys with one hash (k * (2^61 - 1)): each insertion compared the key with
    every one before it, 5e9 comparisons for 1.5 MB (minutes)."""
    keys = b"".join(b"\x8a\x0c" + (k * P61).to_bytes(12, "little", signed=True) + b"N"
                    for k in range(1, 100_001))
    data = b"\x80\x04}(\x8c\x08segments]" + keys + b"u."
    _refused_fast(tmp_path, data, "more than the 4096 nodes")


def test_a_decimal_integer_of_millions_of_digits_is_refused_unparsed(tmp_path):
    """Protocol 0 writes integers as decimal lines; with Python's digit limit off, int() of a
    3-million-digit one is quadratic (over a minute)."""
    data = b"(dp0\nVsegments\np1\n(lp2\nsVx\np3\nI" + b"9" * 3_000_000 + b"\ns."
    _refused_fast(tmp_path, data, "a number of more than 4300 digits", env={"PYTHONINTMAXSTRDIGITS": "0"})


def test_key_nodes_are_capped_at_the_edge():
    """4096 nodes of keys that are not strings are read, 4097 refused: integer keys count one
    each, a shared nested tuple every item each time it is reached, a string inside a tuple
    one node a 64 bytes."""
    assert torch_snapshot.MAX_KEY_NODES == 4096
    _reads(pickle.dumps(_snapshot(ids={n: n for n in range(4096)}), protocol=4))
    _refused(pickle.dumps(_snapshot(ids={n: n for n in range(4097)}), protocol=4), "more than the 4096 nodes")

    nested = ()
    for _ in range(11):   # 2^12 - 1 = 4095 nodes
        nested = (nested, nested)
    _reads(pickle.dumps(_snapshot(by_shape={nested: 0, 1: 0}), protocol=4))
    _refused(pickle.dumps(_snapshot(by_shape={nested: 0, 1: 0, 2: 0}), protocol=4), "more than the 4096")

    # 1 for the tuple, 1 + 4094 for a string of 4094 * 64 bytes
    _reads(pickle.dumps(_snapshot(by_name={("x" * (64 * 4094),): 0}), protocol=4))
    _refused(pickle.dumps(_snapshot(by_name={("x" * (64 * 4095),): 0}), protocol=4), "more than the 4096")


def test_members_of_sets_and_frozensets_count_as_keys():
    """ADDITEMS and FROZENSET hash their members as SETITEMS hashes keys."""
    _reads(pickle.dumps(_snapshot(seen=set(range(4096))), protocol=4))
    _refused(pickle.dumps(_snapshot(seen=set(range(4097))), protocol=4), "more than the 4096 nodes")
    _refused(pickle.dumps(_snapshot(seen=[frozenset(range(2049)), frozenset(range(2048))]), protocol=4),
             "more than the 4096 nodes")


# --- the clock -----------------------------------------------------------------------------------

class _Ticking:
    """A clock that moves one second each time it is read."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_the_walk_over_the_opcodes_is_capped_in_seconds_at_the_edge(monkeypatch):
    """MAX_SECONDS caps the prescan by the clock, read each _LOOK_BYTES of pickle: given the
    seconds its looks take it reads, one second fewer refuses it with the cap named."""
    assert torch_snapshot.MAX_SECONDS == 60
    data = pickle.dumps(_torch_like(segments=2, blocks=20, traces=50), protocol=4)
    monkeypatch.setattr(torch_snapshot, "_LOOK_BYTES", len(data) // 20)
    counting = _Ticking()
    torch_snapshot._prescan(data, "s", clock=counting)
    looks = int(counting.now) - 1   # seconds from the start to the last look
    assert 20 <= looks < 60
    monkeypatch.setattr(torch_snapshot, "MAX_SECONDS", looks)
    torch_snapshot._prescan(data, "s", clock=_Ticking())
    monkeypatch.setattr(torch_snapshot, "MAX_SECONDS", looks - 1)
    with pytest.raises(BadInput, match=f"took more than the {looks - 1} s a snapshot may") as refused:
        torch_snapshot._prescan(data, "s", clock=_Ticking())
    assert "\n" not in str(refused.value)


# --- what the bound must not refuse --------------------------------------------------------------

def _frames(rng: random.Random, depth: int) -> list:
    return [{"filename": f"/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module{rng.randrange(40)}.py",
             "line": rng.randrange(2000), "name": f"forward_{rng.randrange(300)}"} for _ in range(depth)]


def _torch_like(segments: int, blocks: int, traces: int) -> dict:
    """Shaped like torch.cuda.memory._snapshot(): segments of blocks with their stack frames,
    the allocator's trace, its settings (string keys throughout; a tuple as a value)."""
    rng = random.Random(7)
    result, base = [], 1 << 40
    for _ in range(segments):
        total = blocks * 2 * MIB
        result.append({"device": 0, "address": base, "total_size": total, "stream": 0, "segment_type": "large",
                       "segment_pool_id": (0, 0), "allocated_size": total // 2, "active_size": total // 2,
                       "requested_size": total // 2, "is_expandable": False, "frames": _frames(rng, 8),
                       "blocks": [{"address": base + i * 2 * MIB, "size": 2 * MIB,
                                   "requested_size": 2 * MIB - rng.randrange(512),
                                   "state": rng.choice(["active_allocated", "inactive", "active_pending_free"]),
                                   "frames": _frames(rng, rng.randrange(4, 24))} for i in range(blocks)]})
        base += total + (1 << 30)
    trace = [{"action": rng.choice(["alloc", "free_requested", "free_completed", "segment_alloc"]),
              "addr": (1 << 40) + rng.randrange(1 << 30), "size": rng.randrange(1 << 24), "stream": 0,
              "time_us": 1_700_000_000_000_000 + i, "frames": _frames(rng, rng.randrange(4, 24)),
              "compile_context": "N/A", "user_metadata": ""} for i in range(traces)]
    return {"segments": result, "device_traces": [trace],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "max_split_size": -1,
                                   "roundup_power2_divisions": {"1": 0, "2": 0, "4": 0}},
            "external_annotations": []}


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_a_torch_shaped_snapshot_reads_under_every_cap(protocol):
    """Every key a string: no key nodes at all, whatever the protocol."""
    snapshot = _torch_like(segments=8, blocks=64, traces=2000)
    data = pickle.dumps(snapshot, protocol=protocol)
    restored = torch_snapshot.load_snapshot(data, "s")
    assert restored == snapshot
    records = torch_snapshot.snapshot_records(restored, 0, "s")
    assert len(records) == 1 + sum(block["state"].startswith("active")
                                   for segment in snapshot["segments"] for block in segment["blocks"])


def test_a_number_too_long_to_print_is_refused_naming_its_field(tmp_path):
    """str() of an int over 4300 digits raises (the digit limit): the refusal names its bits."""
    data = pickle.dumps({"segments": [{"device": 0, "address": 2 ** 20000, "total_size": 1}]}, protocol=4)
    _refused_fast(tmp_path, data, "'address' (a number of 20001 bits) is outside 0 .. 2^64 - 1")
