"""Event records of the shim's per-process ring, as plain dicts (one JSONL line each)."""
from __future__ import annotations

import struct

# struct sd_event (seedance_shim.h); checked against ffi.sizeof at first use
EVENT_STRUCT = struct.Struct("<QQIIiiQQIIII192s")

EVENT_KINDS = {1: "init", 2: "alloc", 3: "free", 4: "quota_refused", 5: "remap", 6: "note",
               7: "context", 8: "launch", 16: "objsearch", 17: "objopen", 18: "symbind", 19: "exit"}

# <link.h> LA_SER_*: where ld.so found the name it is trying (la_objsearch's flag)
SEARCH_SOURCES = {0x01: "LA_SER_ORIG", 0x02: "LA_SER_LIBPATH", 0x04: "LA_SER_RUNPATH",
                  0x08: "LA_SER_CONFIG", 0x40: "LA_SER_DEFAULT", 0x80: "LA_SER_SECURE"}


def event_to_dict(raw: bytes, pid: int, api_names: list[str], libs: list[str]) -> dict:
    """One ring event as a dict.  Alloc, free and launch events also carry the profiler's
    keys (docs/profile.md): t (seconds, CLOCK_MONOTONIC), ev, dev, addr, size."""
    (seq, t_ns, kind, api, device, result, ptr, nbytes, lib, obj, obj2, flag,
     text) = EVENT_STRUCT.unpack(raw)
    text = text.split(b"\0", 1)[0].decode("utf-8", "replace")
    name = EVENT_KINDS.get(kind, f"kind{kind}")
    out = {"seq": seq, "t_ns": t_ns, "pid": pid, "kind": name}
    if name in ("alloc", "free", "quota_refused", "context"):
        out.update(api=api_names[api] if api < len(api_names) else api, device=device, result=result)
        if name != "context":
            out.update(ptr=ptr, bytes=nbytes)
        if name == "alloc":
            out["library"] = libs[lib] if lib < len(libs) else None
        if name in ("alloc", "free"):
            out.update(t=t_ns / 1e9, ev=name, dev=device, addr=ptr)
            if name == "alloc":
                out["size"] = nbytes
    elif name == "launch":
        out.update(t=t_ns / 1e9, ev="launch", api=api_names[api] if api < len(api_names) else api,
                   result=result, library=libs[lib] if lib < len(libs) else None)
    elif name == "objsearch":
        out.update(name=text, source=SEARCH_SOURCES.get(flag, hex(flag)), requester=obj)
    elif name == "objopen":
        out.update(obj=obj, path=text, lmid=flag)
    elif name == "symbind":
        out.update(symbol=text, from_obj=obj, to_obj=obj2)
    else:
        out["text"] = text
        if name == "remap":
            out["visible"] = result
    return out
