"""Device limits for `seedance run`: which devices the program may see (--affinity) and how
much device memory it may hold on each (--mem-limit).

Returns the values the shim reads (SEEDANCE_AFFINITY, SEEDANCE_MEM_LIMIT) and what the run
report says about them.  gpu:N names NVML's index N (nvidia-smi's order); it is turned into
the device's UUID so that CUDA_DEVICE_ORDER cannot make it another device.
"""
from __future__ import annotations

import os
import re

from ..model.errors import BadInput, NotAvailable, UsageError


def parse_size(text: str) -> int:
    """A --mem-limit size: a Kubernetes quantity (seedance.model.units: 8Gi, 1.5G, 512Mi, or
    bytes), more than 0.  The launcher's parse_size (shim/src/launcher.c) reads the same."""
    from ..model.units import parse_size as parse

    try:
        return parse(text, "--mem-limit", minimum=1)
    except BadInput as exc:
        raise UsageError(f"seedance run: {exc.message}") from None


def parse_mem_limit(text: str) -> tuple[str, dict]:
    """'8Gi,1:4Gi' -> ('8589934592,1:4294967296', {'default': ..., 'per_device': {...}})"""
    default, per_device, parts = None, {}, []
    # C's isspace() set, as the launcher strips: str.strip() would take more
    for item in filter(None, (s.strip(" \t\n\v\f\r") for s in text.split(","))):
        if ":" in item:
            dev, size = item.split(":", 1)
            # [0-9] and not isdigit(), which is true of '²' and other digits int() refuses
            if not re.fullmatch(r"[ \t\n\v\f\r]*[0-9]+[ \t\n\v\f\r]*", dev) or int(dev) >= 16:
                raise UsageError(f"seedance run: --mem-limit: {item!r}: the device must be 0..15")
            per_device[int(dev)] = parse_size(size)
            parts.append(f"{int(dev)}:{per_device[int(dev)]}")
        else:
            if default is not None:
                raise UsageError("seedance run: --mem-limit: give one default size at most")
            default = parse_size(item)
            parts.insert(0, str(default))
    if default is None and not per_device:
        raise UsageError("seedance run: --mem-limit needs a size")
    return ",".join(parts), {"default_bytes": default, "per_device_bytes": per_device}


def resolve_affinity(spec: str) -> tuple[str, dict]:
    """The SEEDANCE_AFFINITY value for the shim, and what the report says about it."""
    info = {"requested": spec}
    if spec == "auto":
        value, why = pick_least_loaded()
        info.update(resolved=value, how=why)
        return value, info
    items = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        low = item.lower()
        if low.startswith("gpu:"):
            item = item[4:]
        elif low.startswith("npu") and item[3:].isdigit():
            item = item[3:]
        if item.isdigit():
            uuid = nvml_uuid(int(item))
            items.append(uuid or item)
        elif low.startswith(("gpu-", "mig-")):
            items.append(item)
        else:
            raise UsageError(f"seedance run: --affinity: {item!r} is not gpu:N, N, npuN, GPU-<uuid>, MIG-<uuid> or auto")
    value = ",".join(items)
    info.update(resolved=value, how="NVML index -> UUID" if value != spec and "GPU-" in value
                else "CUDA ordinals (CUDA_DEVICE_ORDER=%s)" % os.environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST"))
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        info["cuda_visible_devices"] = os.environ["CUDA_VISIBLE_DEVICES"]
    return value, info


def check_affinity_devices(spec: str, strict: bool) -> str:
    """The warning for device indices in ``spec`` (gpu:N, N, npuN) this host does not have;
    '' when all exist.  Under --strict a missing device is refused (exit 2).  The count is
    NVML's (gpu:N is the NVML index), else the CUDA driver's; with neither answering it
    cannot be known, and the warning says so (refused by --strict only when known)."""
    indices = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        low = item.lower()
        digits = item[4:] if low.startswith("gpu:") else item[3:] if low.startswith("npu") else item
        if digits.isdigit():
            indices.append((item, int(digits)))
    if not indices:
        return ""
    count, source = device_count()
    if count is None:
        return (f"seedance: warning: --affinity {spec}: cannot check that device "
                f"{', '.join(str(i) for _item, i in indices)} exists: {source}")
    absent = [item for item, index in indices if index >= count]
    if not absent:
        return ""
    text = (f"--affinity {spec}: no device {', '.join(absent)} on this host ({source} reports "
            f"{count} device{'s' if count != 1 else ''}): the program would see none")
    if strict:
        raise UsageError(f"seedance run: {text}")
    return f"seedance: warning: {text}"


def device_count() -> tuple:
    """(number of devices, who said so) or (None, why nobody can): NVML first, as gpu:N
    names NVML indices, then the CUDA driver (cuDeviceGetCount after cuInit)."""
    nvml, why = _nvml()
    if nvml:
        try:
            return int(nvml.nvmlDeviceGetCount()), "NVML"
        except Exception as exc:  # noqa: BLE001 - a driver that answers init but not this
            why = f"NVML unavailable ({exc})"
    import ctypes
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None, f"{why}, and there is no CUDA driver (libcuda.so.1 does not load)"
    n = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(n)) != 0:
        return None, f"{why}, and the CUDA driver does not answer (cuInit failed)"
    return n.value, "the CUDA driver"


def _nvml():
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml, ""
    except Exception as exc:  # pynvml missing, or no libnvidia-ml / no driver
        return None, f"NVML unavailable ({' '.join(str(exc).split()) or type(exc).__name__})"


def nvml_uuid(index: int) -> str | None:
    """gpu:N means NVML/nvidia-smi index N; its UUID makes it independent of CUDA's order."""
    nvml, _ = _nvml()
    if not nvml:
        return None
    try:
        uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))
        return uuid.decode() if isinstance(uuid, bytes) else uuid
    except Exception:
        return None


def pick_least_loaded() -> tuple[str, str]:
    nvml, why = _nvml()
    if nvml:
        best = None
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            used = nvml.nvmlDeviceGetMemoryInfo(h).used
            try:
                util = nvml.nvmlDeviceGetUtilizationRates(h).gpu
            except Exception:
                util = 0
            key = (util, used, i)
            if best is None or key < best[0]:
                uuid = nvml.nvmlDeviceGetUUID(h)
                best = (key, uuid.decode() if isinstance(uuid, bytes) else uuid)
        if best:
            return best[1], f"NVML: least utilised, then least memory used (util {best[0][0]}%, {best[0][1]} bytes)"
    count = driver_device_count()
    if not count:
        raise NotAvailable(f"seedance run: --affinity auto: {why}, and no CUDA driver answers either")
    load = {d: 0 for d in range(count)}
    try:
        from ..shim import Registry
        reg = Registry.open()
        for inst in reg.instances():
            if inst.alive and inst.state == "live":
                for d, held in inst.current.items():
                    if d in load:
                        load[d] += held
        reg.close()
    except Exception:
        pass
    device = min(load, key=lambda d: (load[d], d))
    return str(device), f"{why}; chose the device with the least memory held by live seedance instances ({load[device]} bytes of {count} devices)"


def driver_device_count() -> int:
    import ctypes
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        n = ctypes.c_int(0)
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(n)) != 0:
            return 0
        return n.value
    except OSError:
        return 0


