"""seedance.batching: correctness, policies judged by the batcher's own dispatch records
(sizes, reasons, waits), never by wall-time thresholds."""
from __future__ import annotations

import threading
import time

import pytest

from seedance.batching import Batcher, BatcherClosed

MAX_WAIT_MS = 10.0
SPACING_S = 0.04  # 4x max_wait: low load


def echo(batch):
    return [item * 2 for item in batch]


def test_results_in_order_and_close_joins():
    with Batcher(echo, max_batch_size=4, max_wait_ms=1) as batcher:
        futures = [batcher.submit(i) for i in range(10)]
        assert [f.result(timeout=10) for f in futures] == [i * 2 for i in range(10)]
    assert not batcher._thread.is_alive()
    with pytest.raises(BatcherClosed):
        batcher.submit(1)


def test_handler_errors_reach_every_caller_and_worker_survives():
    calls = []

    def flaky(batch):
        calls.append(list(batch))
        if len(calls) == 1:
            raise RuntimeError("device lost")
        return batch

    with Batcher(flaky, max_batch_size=8, max_wait_ms=0) as batcher:
        with pytest.raises(RuntimeError, match="device lost"):
            batcher.submit(1).result(timeout=10)
        assert batcher.submit(2).result(timeout=10) == 2


def test_wrong_result_count_is_an_error():
    with Batcher(lambda batch: batch[:-1], max_batch_size=2, max_wait_ms=0) as batcher:
        with pytest.raises(ValueError, match="0 results for 1 requests"):
            batcher.submit(1).result(timeout=10)


def test_bad_arguments():
    with pytest.raises(ValueError):
        Batcher(echo, policy="dynamic")
    with pytest.raises(ValueError):
        Batcher(echo, max_batch_size=0)


def _low_load(policy, count=6):
    with Batcher(echo, max_batch_size=32, max_wait_ms=MAX_WAIT_MS, policy=policy) as batcher:
        for index in range(count):
            assert batcher.submit(index).result(timeout=10) == index * 2
            time.sleep(SPACING_S)
        return batcher.dispatches(), batcher.stats()


def test_static_waits_out_the_deadline_at_low_load():
    dispatches, stats = _low_load("static")
    assert [d.size for d in dispatches] == [1] * 6
    assert {d.reason for d in dispatches} == {"deadline"}
    # The code's guarantee, not a timing threshold: a static batch is only dispatched once
    # its deadline (first arrival + max_wait) has passed.
    assert all(d.wait_ms >= MAX_WAIT_MS for d in dispatches)
    assert stats["idle_waits"] >= 6  # the worker blocked for every single request


def test_adaptive_dispatches_at_once_at_low_load():
    dispatches, stats = _low_load("adaptive")
    assert [d.size for d in dispatches] == [1] * 6
    assert {d.reason for d in dispatches} == {"low-rate"}
    assert stats["idle_waits"] == 0
    assert stats["estimated_rate"] is not None and stats["estimated_rate"] < 1000.0 / MAX_WAIT_MS


def test_batches_form_under_load_and_respect_max_size():
    def slow(batch):
        time.sleep(0.005)  # the handler is the bottleneck, so requests queue up
        return batch

    results = []
    lock = threading.Lock()
    with Batcher(slow, max_batch_size=8, max_wait_ms=2, policy="adaptive") as batcher:
        def client(base):
            futures = [batcher.submit(base + i) for i in range(40)]
            with lock:
                results.extend(f.result(timeout=30) for f in futures)

        threads = [threading.Thread(target=client, args=(n * 1000,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        dispatches = batcher.dispatches()
    assert sorted(results) == sorted(n * 1000 + i for n in range(4) for i in range(40))
    sizes = [d.size for d in dispatches]
    assert sum(sizes) == 160
    assert max(sizes) <= 8
    assert max(sizes) > 1 and len(dispatches) < 160


def test_close_flushes_queued_requests():
    gate = threading.Event()

    def gated(batch):
        gate.wait(10)
        return batch

    batcher = Batcher(gated, max_batch_size=2, max_wait_ms=1000, policy="static")
    futures = [batcher.submit(i) for i in range(5)]
    closer = threading.Thread(target=batcher.close)
    closer.start()
    gate.set()
    closer.join(10)
    assert [f.result(timeout=10) for f in futures] == list(range(5))
    assert not batcher._thread.is_alive()
