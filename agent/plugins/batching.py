"""Adaptive request batching for plugin authors (`seedance.plugins.batching`).

    from seedance.plugins.batching import Batcher
    with Batcher(encode_batch, max_batch_size=32, max_wait_ms=5) as batcher:
        result = batcher.submit(frame).result()

A single worker thread hands lists of requests to ``handler(batch) -> results`` (same
length, same order).  A batch is dispatched when it is full or when its wait budget runs
out.  The two policies differ only in that budget:

  static    every batch waits up to max_wait_ms for more requests.  At low load a batch
            never fills, so every request pays the full wait and the worker blocks and wakes
            for nothing (the notes' batch-static trap: idle context switches, high P99).
  adaptive  the budget follows the observed request rate (an EWMA of inter-arrival gaps):
            it waits only as long as it takes to fill the batch, and only when at least a few
            more requests are expected within max_wait_ms.  At low load it dispatches at once;
            at high load requests queue while the handler runs, so batches grow by themselves.

Every dispatch is recorded (size, wait, reason) so tests and `seedance bench` can assert on
batching behaviour rather than on wall time.
"""
from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

POLICIES = ("adaptive", "static")
# Adaptive waits only when at least this many more requests are expected within max_wait_ms;
# below that the wait costs every request latency and buys almost no batching.
MIN_EXPECTED_ARRIVALS = 4
EWMA_ALPHA = 0.2
HISTORY = 100_000


@dataclass(frozen=True)
class Dispatch:
    size: int
    wait_ms: float  # first request's arrival -> dispatch
    reason: str  # "full", "deadline" (waited the budget), "low-rate" (adaptive: no wait), "close"
    service_ms: float


class BatcherClosed(RuntimeError):
    pass


class Batcher:
    def __init__(self, handler, max_batch_size: int = 32, max_wait_ms: float = 5.0,
                 policy: str = "adaptive", name: str = "seedance-batcher"):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        if int(max_batch_size) < 1 or float(max_wait_ms) < 0:
            raise ValueError("max_batch_size must be >= 1 and max_wait_ms >= 0")
        self.handler = handler
        self.max_batch_size = int(max_batch_size)
        self.max_wait = float(max_wait_ms) / 1000.0
        self.policy = policy
        self._cond = threading.Condition()
        self._queue: collections.deque = collections.deque()  # (arrival, item, future)
        self._closed = False
        self._gap: float | None = None  # EWMA of inter-arrival time, seconds
        self._last_arrival: float | None = None
        self._dispatches: collections.deque = collections.deque(maxlen=HISTORY)
        self._latencies: collections.deque = collections.deque(maxlen=HISTORY)
        self._idle_waits = 0  # times the worker blocked holding a partial batch
        self.worker_tid: int | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = threading.Event()
        self._thread.start()
        self._started.wait()

    # -- client side -------------------------------------------------------------------------
    def submit(self, item) -> Future:
        future: Future = Future()
        now = time.perf_counter()
        with self._cond:
            if self._closed:
                raise BatcherClosed("batcher is closed")
            if self._last_arrival is not None:
                gap = now - self._last_arrival
                self._gap = gap if self._gap is None else (1 - EWMA_ALPHA) * self._gap + EWMA_ALPHA * gap
            self._last_arrival = now
            self._queue.append((now, item, future))
            self._cond.notify()
        return future

    def __call__(self, item):
        return self.submit(item).result()

    def close(self, timeout: float | None = None) -> None:
        """Stop accepting requests, finish the queued ones, join the worker."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- observation -------------------------------------------------------------------------
    @property
    def estimated_rate(self) -> float | None:
        """Requests per second as the adaptive policy sees them."""
        gap = self._gap
        return None if not gap else 1.0 / gap

    def dispatches(self) -> list:
        with self._cond:
            return list(self._dispatches)

    def latencies_ms(self) -> list:
        with self._cond:
            return list(self._latencies)

    def reset_stats(self) -> None:
        with self._cond:
            self._dispatches.clear()
            self._latencies.clear()
            self._idle_waits = 0

    def stats(self) -> dict:
        with self._cond:
            dispatches = list(self._dispatches)
            idle_waits = self._idle_waits
        reasons = collections.Counter(d.reason for d in dispatches)
        sizes = [d.size for d in dispatches]
        return {"policy": self.policy, "batches": len(dispatches), "requests": sum(sizes),
                "mean_batch_size": (sum(sizes) / len(sizes)) if sizes else 0.0,
                "max_batch_size_seen": max(sizes, default=0),
                "mean_wait_ms": (sum(d.wait_ms for d in dispatches) / len(dispatches)) if dispatches else 0.0,
                "reasons": dict(reasons), "idle_waits": idle_waits,
                "estimated_rate": self.estimated_rate}

    # -- worker ------------------------------------------------------------------------------
    def _budget(self, queued: int) -> float:
        if self.policy == "static":
            return self.max_wait
        gap = self._gap
        if gap is None or gap <= 0:
            return 0.0  # no rate observed yet: never make the first request wait
        if gap * MIN_EXPECTED_ARRIVALS > self.max_wait:
            return 0.0
        return min(self.max_wait, (self.max_batch_size - queued) * gap)

    def _run(self) -> None:
        self.worker_tid = threading.get_native_id()
        self._started.set()
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return  # closed and drained
                first_arrival = self._queue[0][0]
                deadline = first_arrival + self._budget(len(self._queue))
                reason = "low-rate" if self.policy == "adaptive" and deadline <= first_arrival else "deadline"
                while len(self._queue) < self.max_batch_size and not self._closed:
                    remaining = deadline - time.perf_counter()
                    if remaining <= 0:
                        break
                    self._idle_waits += 1
                    self._cond.wait(remaining)
                if len(self._queue) >= self.max_batch_size:
                    reason = "full"
                elif self._closed:
                    reason = "close"
                count = min(self.max_batch_size, len(self._queue))
                batch = [self._queue.popleft() for _ in range(count)]
            self._dispatch(batch, first_arrival, reason)

    def _dispatch(self, batch, first_arrival: float, reason: str) -> None:
        start = time.perf_counter()
        items = [item for _arrival, item, _future in batch]
        try:
            results = self.handler(items)
            results = list(results)
            if len(results) != len(items):
                raise ValueError(f"batch handler returned {len(results)} results for {len(items)} requests")
            error = None
        except BaseException as exc:  # the caller of submit() gets it, the worker lives on
            results, error = None, exc
        done = time.perf_counter()
        for index, (arrival, _item, future) in enumerate(batch):
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(results[index])
        with self._cond:
            self._dispatches.append(Dispatch(len(batch), (start - first_arrival) * 1000.0, reason,
                                             (done - start) * 1000.0))
            self._latencies.extend((done - arrival) * 1000.0 for arrival, _i, _f in batch)
