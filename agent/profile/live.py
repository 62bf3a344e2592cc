"""Live profiling: a program under the shim, its allocations sampled from the registry.

`seedance run`'s machinery starts the program (shim.wrap_env, the registry group, the
event drain, the judging and release of its slots: seedance.run); the profiler reads each instance's allocation records
(struct sd_record in seedance_shim.h) from the shared registry every sample interval.
Reading shared memory costs the program nothing: its hot path is unchanged, and the
sampler runs in this process (bench/bench_profiler.py measures the whole cost).

Each sample's difference from the last becomes alloc/free records stamped with the
sample's time, so the live map and an offline trace go through the same replay
(profile.memory.profile_events).
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field

from ..model.errors import BadInput, NotAvailable

try:  # optional: the sampler's fast path (torch brings it); the pure-Python path is exact too
    import numpy as _np
except ImportError:
    _np = None


@dataclass
class Sampled:
    records: list = field(default_factory=list)   # device/alloc/free records (docs/profile.md)
    samples: int = 0
    exit_code: int = 0
    wall_s: float = 0.0
    events_written: int = 0


class MapSampler:
    """Turns successive snapshots of the live allocations of one device into records.

    A tick must cost the program nothing it can notice (bench/bench_profiler.py: < 2% at
    10 ms): the record table (SD_MAX_RECORDS entries of struct sd_record, 24 bytes: ptr,
    size, then device/api/lib in one little-endian word) is copied in one piece and
    compared with the last copy; only a changed table is decoded, through strided
    memoryviews (C loops), and library names are read only for new allocations."""

    def __init__(self, device: int):
        from .devices import DriverDevices

        self.device = device
        self.devices = DriverDevices()
        self.live: dict[int, tuple[int, str | None]] = {}
        self.raw: dict[int, bytes] = {}
        self.held: dict[int, dict] = {}          # slot -> {ptr: (size, lib index)}
        self.out = Sampled()

    def _slot_allocations(self, registry, slot: int) -> dict:
        raw = bytes(registry.ffi.buffer(registry._slot(slot).records))
        if self.raw.get(slot) == raw:
            return self.held[slot]
        device = self.device & 0xFFFFFFFF
        if _np is not None:   # vectorised: ~20x cheaper than the loop below on 8192 records
            words = _np.frombuffer(raw, dtype="<u8").reshape(-1, 3)
            mine = words[(words[:, 0] > 1) & (words[:, 0] >> 63 == 0) & (words[:, 2] & 0xFFFFFFFF == device)]
            held = dict(zip(mine[:, 0].tolist(), zip(mine[:, 1].tolist(), (mine[:, 2] >> 48).tolist())))
        else:
            words = memoryview(raw).cast("Q")
            held = {ptr: (size, meta >> 48)
                    for ptr, size, meta in zip(words[0::3].tolist(), words[1::3].tolist(), words[2::3].tolist())
                    if ptr > 1 and not ptr >> 63 and meta & 0xFFFFFFFF == device}
        self.raw[slot], self.held[slot] = raw, held
        return held

    def take(self, registry, slots, t: float) -> None:
        now = {}
        for slot in slots:
            libs = None
            for ptr, (size, lib) in self._slot_allocations(registry, slot).items():
                if ptr in self.live and self.live[ptr][0] == size:
                    now[ptr] = self.live[ptr]
                    continue
                if libs is None:
                    libs = registry.libraries(slot)
                now[ptr] = (size, libs[lib] if lib < len(libs) else None)
        if now and not self.out.records:
            self.out.records.append(self.devices.record(self.device, min(now)))
        for addr in [a for a in self.live if a not in now or now[a][0] != self.live[a][0]]:
            self.out.records.append({"t": t, "ev": "free", "dev": self.device, "addr": addr})
            del self.live[addr]
        for addr in sorted(a for a in now if a not in self.live):
            size, library = now[addr]
            self.out.records.append({"t": t, "ev": "alloc", "dev": self.device, "addr": addr, "size": size,
                                     "library": library})
            self.live[addr] = now[addr]
        self.out.samples += 1


def _open_registry():
    from .. import shim
    try:
        return shim.Registry.open()
    except NotAvailable:
        return None


def run_wrapped(cmd: list[str], *, interval: float, on_tick=None, events_stream=None,
                drain_interval: float = 0.05, notice=None) -> tuple[int, float]:
    """Run CMD under the shim as `seedance run` does; call on_tick(registry, slots, t)
    every interval while it runs and once after.  What the end of the run must say (a
    handle leak, a full registry) goes to notice(line).  Returns (exit code, wall seconds)."""
    import shutil

    from ..run.events import start_drain
    from ..run.finish import judge_and_release
    from ..run.launch import exit_status, preload_library
    from ..run.report import RunResult
    from ..shim.wrap import wrap_env

    if not cmd:
        raise BadInput("give the command after --")
    if shutil.which(cmd[0]) is None:
        raise BadInput(f"{cmd[0]}: command not found")
    preload_library()
    env, group_key = wrap_env(dict(os.environ), events=events_stream is not None)
    registry = _open_registry()
    drain = start_drain(registry, group_key, events_stream, drain_interval) if events_stream is not None else None
    started = time.monotonic()
    try:
        child = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        raise BadInput(f"{cmd[0]}: {exc.strerror or exc}") from None
    forwarded = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN)}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        forwarded[sig] = signal.signal(sig, lambda s, f: child.send_signal(s))
    try:
        # one wake-up per tick (Popen.wait(timeout) polls with its own, shorter sleeps:
        # on a loaded machine each wake-up is a context switch the program may pay for)
        next_tick = started
        while True:
            rc = child.poll()
            if rc is not None:
                break
            next_tick += interval
            pause = next_tick - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                next_tick = time.monotonic()   # behind (a slow tick): skip, never catch up in a burst
            rc = child.poll()
            if rc is not None:
                break
            if on_tick is not None:
                registry = registry or _open_registry()
                if registry is not None:
                    group = registry.find_group(group_key)
                    on_tick(registry, registry.slots_of_group(group.index) if group else [], time.monotonic())
    finally:
        for sig, old in forwarded.items():
            signal.signal(sig, old)
    wall = time.monotonic() - started
    if on_tick is not None and registry is not None:
        on_tick(registry, [], time.monotonic())   # the driver freed what was left at exit
    if drain is not None:
        drain.finish()
        registry = registry or getattr(drain, "registry", None)
    exit_code, killed_by = exit_status(rc)
    result = RunResult(argv=cmd, exit_code=exit_code, signal=killed_by, wrapped=True)
    judge_and_release(registry, group_key, result, None, notice or (lambda line: None))
    return result.exit_code, wall


def sample_pid(pid: int, *, device: int, interval: float, max_seconds: float | None = None,
               notice=None) -> Sampled:
    """Attach to a program already wrapped (`seedance run`, the agent): its registry slot.
    Ctrl-C stops the sampling, not the program; notice(line) says so."""
    registry = _open_registry()
    if registry is None:
        raise BadInput(f"--pid {pid}: no seedance registry on this host: the program is not wrapped "
                       "(start it with `seedance run -- CMD`)")
    slots = [i.slot for i in registry.instances() if i.pid == pid and i.state == "live" and i.alive]
    if not slots:
        raise BadInput(f"--pid {pid}: no live seedance instance has this pid (wrap it with `seedance run`)")
    sampler = MapSampler(device)
    started = time.monotonic()
    try:
        while True:
            inst = registry.instance(slots[0])
            if inst is None or inst.pid != pid or not inst.alive or inst.state != "live":
                break
            sampler.take(registry, slots, time.monotonic())
            if max_seconds is not None and time.monotonic() - started >= max_seconds:
                break
            time.sleep(interval)
    except KeyboardInterrupt:
        if notice is not None:
            notice("seedance: stopped sampling (Ctrl-C); the program runs on")
    sampler.out.wall_s = time.monotonic() - started
    return sampler.out


def sample_command(cmd: list[str], *, device: int, interval: float, notice=None) -> Sampled:
    sampler = MapSampler(device)
    code, wall = run_wrapped(cmd, interval=interval, on_tick=lambda reg, slots, t: sampler.take(reg, slots, t),
                             notice=notice)
    sampler.out.exit_code, sampler.out.wall_s = code, wall
    return sampler.out
