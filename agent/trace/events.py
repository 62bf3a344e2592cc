"""TraceEvent: one thing the probes saw, decoded from struct sd_event (events.h), or
reported by the LD_AUDIT fallback.  Rendering (a human line, a JSON object) lives here
so the command only chooses which.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

# dlopen mode bits (<bits/dlfcn.h>)
_RTLD_BITS = ((0x00001, "RTLD_LAZY"), (0x00002, "RTLD_NOW"), (0x00004, "RTLD_NOLOAD"),
              (0x00008, "RTLD_DEEPBIND"), (0x00100, "RTLD_GLOBAL"), (0x01000, "RTLD_NODELETE"))
CONTEXTS = {0: "startup", 1: "dlopen", 2: "dlsym"}


def rtld_flags(mode: int) -> str:
    names = [name for bit, name in _RTLD_BITS if mode & bit]
    if not mode & 0x100:
        names.append("RTLD_LOCAL")
    return "|".join(names) or hex(mode)


@dataclass
class TraceEvent:
    kind: str  # exec exit dlopen dlopen_ret loader_error object cuda_alloc cuda_free (+ audit kinds)
    pid: int
    tid: int = 0
    comm: str = ""
    ts_ns: int = 0
    data: dict = field(default_factory=dict)
    stopped: bool = False  # the probe stopped the process until its probes are attached

    def to_dict(self) -> dict:
        return {"event": self.kind, "pid": self.pid, "tid": self.tid, "comm": self.comm,
                "ts_ns": self.ts_ns, **self.data}

    def line(self) -> str:
        d = self.data
        head = f"{self.pid:>7} {self.comm[:15]:<15} {self.kind:<12}"
        if self.kind == "exec":
            return f"{head} {d.get('path')}"
        if self.kind == "exit":
            return f"{head} process exited"
        if self.kind == "dlopen":
            ns = f" lmid={d['lmid']}" if d.get("api") == "dlmopen" else ""
            return f"{head} {d.get('api')}({d.get('path') or 'NULL'!s}, {d.get('flags_text')}){ns}"
        if self.kind == "dlopen_ret":
            if d.get("ok"):
                return f"{head} {d.get('path')} -> {d.get('loaded') or '(main program)'} handle={d.get('handle')}"
            return f"{head} {d.get('path')} -> NULL"
        if self.kind == "loader_error":
            return f"{head} [{d.get('context')}] {d.get('message')}"
        if self.kind == "object":
            extra = f" soname={d['soname']}" if d.get("soname") else ""
            inode = f" inode={d['inode']}" if d.get("inode") else ""
            return f"{head} {d.get('path')} ns={d.get('namespace')}{inode}{extra}"
        if self.kind == "cuda_alloc":
            return (f"{head} {d.get('api')} {d.get('bytes')} bytes at {d.get('ptr')} "
                    f"device={_device(d.get('device'))} from {os.path.basename(d.get('library') or '?')}")
        if self.kind == "cuda_free":
            return f"{head} {d.get('api')} {d.get('ptr')}"
        if self.kind == "search":
            return f"{head} {d.get('name')} [{d.get('source')}] for {d.get('requester') or '?'}"
        if self.kind == "bind":
            return f"{head} {d.get('symbol')}: {d.get('from') or '?'} -> {d.get('to') or '?'}"
        return f"{head} " + " ".join(f"{k}={v}" for k, v in d.items())


def _device(device) -> str:
    return "?" if device is None or device < 0 else str(device)


def decode(raw, names: dict, apis: dict) -> TraceEvent:
    """A TraceEvent from the ctypes mirror of struct sd_event."""
    kind = names.get(raw.type, f"type{raw.type}")
    path = raw.path.decode("utf-8", "surrogateescape")
    text = raw.text.decode("utf-8", "surrogateescape")
    api = apis.get(raw.api, "")
    data: dict = {}
    if kind == "exec":
        data = {"path": path, "old_pid": raw.aux, "held_count": raw.bytes}
    elif kind == "exit":
        data = {"held_count": raw.bytes}
    elif kind == "dlopen":
        # an empty read of a non-NULL pointer: the string was not paged in yet
        data = {"api": api, "path": path or (None if not raw.ptr else "<not paged in>"),
                "flags": raw.bytes, "flags_text": rtld_flags(raw.bytes),
                "lmid": raw.ns, "caller": hex(raw.caller)}
    elif kind == "dlopen_ret":
        data = {"api": api, "path": path or None, "flags": raw.bytes, "ok": bool(raw.ptr),
                "handle": hex(raw.ptr) if raw.ptr else None, "loaded": text or None}
    elif kind == "loader_error":
        data = {"object": path, "message": text, "context": CONTEXTS.get(raw.context, str(raw.context))}
    elif kind == "object":
        data = {"path": path, "base": raw.base, "link_map": hex(raw.ptr), "namespace": raw.ns}
    elif kind == "cuda_alloc":
        data = {"api": api, "ptr": hex(raw.ptr), "bytes": raw.bytes, "device": raw.device, "caller": hex(raw.caller)}
    elif kind == "cuda_free":
        data = {"api": api, "ptr": hex(raw.ptr), "caller": hex(raw.caller)}
    return TraceEvent(kind=kind, pid=raw.pid, tid=raw.tid,
                      comm=raw.comm.decode("utf-8", "replace"), ts_ns=raw.ts_ns, data=data,
                      stopped=bool(raw.flags & 1))
