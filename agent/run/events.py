"""The shim's events of one run, drained from the registry's per-instance rings into a
JSON-lines stream (`seedance run --events`, `seedance profile launches`).

The rings are small and the program never waits on them, so a thread empties them every
interval while the program runs, and once more after it ended.
"""
from __future__ import annotations

import json
import os
import threading
import time

from ..model.errors import NotAvailable


def start_record(argv: list) -> dict:
    """The first line of an event stream: it names the stream, so a later --events to the same
    file knows it is ours.  t (CLOCK_MONOTONIC, the events' clock) beside wall (epoch time) is
    the anchor that aligns power logs (nvidia-smi, DCGM: wall clock) with the launches."""
    return {"schema": "seedance.run-events/v1", "kind": "start", "pid": os.getpid(),
            "argv": argv, "t": time.monotonic(), "wall": time.time()}


class EventDrain:
    """Drains the event rings of this run's instances into a JSONL file, off the hot path."""

    def __init__(self, registry, group_key: int, out, interval: float = 0.05):
        self.registry, self.group_key, self.interval = registry, group_key, interval
        self.out = out            # an open text stream (OutputTarget.open_stream); closed by its owner
        self.written = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def slots(self):
        group = self.registry.find_group(self.group_key)
        return self.registry.slots_of_group(group.index) if group else []

    def drain(self):
        for slot in self.slots():
            for event in self.registry.drain_events(slot):
                if event.get("ev") in ("alloc", "free"):
                    self.device_record(event)
                self.out.write(json.dumps(event) + "\n")
                self.written += 1
        self.out.flush()

    def device_record(self, event: dict) -> None:
        """Before a device's first alloc/free: its {"ev":"device"} record (docs/profile.md)."""
        devices = self.__dict__.setdefault("devices", None)
        if devices is None:
            from ..profile.devices import DriverDevices
            devices = self.devices = DriverDevices()
        if event["dev"] >= 0 and event["dev"] not in devices.known:
            self.out.write(json.dumps(devices.record(event["dev"], event.get("addr"))) + "\n")
            self.written += 1

    def loop(self):
        while not self.stop.wait(self.interval):
            try:
                self.drain()
            except Exception:
                pass

    def finish(self):
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()
        self.drain()


class LateDrain(EventDrain):
    """An EventDrain that opens the registry once the first wrapped process made it."""

    def __init__(self, group_key: int, out, interval: float = 0.05):
        self.registry = None
        self.group_key, self.interval = group_key, interval
        self.out = out
        self.written = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def drain(self):
        if self.registry is None:
            from ..shim import Registry
            try:
                self.registry = Registry.open()
            except NotAvailable:
                return
        super().drain()


def start_drain(registry, group_key: int, out, interval: float = 0.05) -> EventDrain:
    """A started drain of this run's events into OUT; without a registry yet (the first
    wrapped process creates it), one that waits for it in its loop."""
    drain = EventDrain(registry, group_key, out, interval) if registry is not None else \
        LateDrain(group_key, out, interval)
    drain.thread.start()
    return drain
