"""The device records of an event trace: {"ev":"device","dev":D,"base":B,"capacity":C}.

The memory profiler models one device's address range [base, base + capacity).  The
capacity is the driver's cuDeviceTotalMem.  The base is the driver's address range where
it can be known: the fake driver (tests/fakecuda/fakecuda.c) says its fixed range through
fakecuda_va_range(); a real driver publishes no range for its unified address space, so
the base is then the first allocation's address rounded down to 2 MiB (the driver's
allocation granularity for cuMemAlloc, CUDA programming guide, "Virtual Memory
Management"), and the record says so ("base_from": "first-allocation").
"""
from __future__ import annotations

import ctypes

GRANULE = 2 << 20


class DriverDevices:
    """Asks libcuda.so.1 (loaded in this process, never under the shim) once per device."""

    def __init__(self):
        self.cuda = None
        self.known: dict[int, dict] = {}
        try:
            cuda = ctypes.CDLL("libcuda.so.1")
            if cuda.cuInit(0) == 0:
                self.cuda = cuda
        except OSError:
            pass

    def record(self, dev: int, first_addr: int | None = None) -> dict:
        if dev in self.known:
            return self.known[dev]
        out = {"kind": "device", "ev": "device", "dev": dev}   # kind: what run --events readers key on
        if self.cuda is not None:
            handle, total = ctypes.c_int(0), ctypes.c_size_t(0)
            if self.cuda.cuDeviceGet(ctypes.byref(handle), dev) == 0 and \
                    self.cuda.cuDeviceTotalMem_v2(ctypes.byref(total), handle) == 0:
                out["capacity"] = total.value
            va_range = getattr(self.cuda, "fakecuda_va_range", None)
            base, size = ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)
            if va_range is not None and va_range(dev, ctypes.byref(base), ctypes.byref(size)) == 0:
                out.update(base=base.value, capacity=size.value, base_from="driver")
        if "base" not in out and first_addr is not None:
            out.update(base=first_addr - first_addr % GRANULE, base_from="first-allocation")
        self.known[dev] = out
        return out
