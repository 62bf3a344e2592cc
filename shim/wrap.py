"""The environment that wraps a program with the shim: one place for its variables.

``seedance run`` uses it; so can other commands that need to start a program under the
shim (e.g. `seedance trace` using the LD_AUDIT events as its fallback).
"""
from __future__ import annotations

import os

from .binding import expected_version, library_path


def wrap_env(base: dict | None = None, *, preload: bool = True, audit: bool = False, events: bool = False,
             follow_children: bool = False, affinity: str | None = None, mem_limit: str | None = None,
             group_key: int | None = None, handles: str | None = None) -> tuple[dict, int]:
    """(env, group_key) for a child process.  Instances of that child (and of its
    followed children) are the registry slots whose group has this key:
    ``Registry.find_group(group_key)``.  ``mem_limit`` is the shim's syntax, in bytes
    ("8589934592,1:4294967296"); ``affinity`` is SEEDANCE_AFFINITY's."""
    env = dict(os.environ if base is None else base)
    library = str(library_path())
    # os.urandom, not secrets: importing secrets pulls in hmac and hashlib (start-up time)
    key = group_key or ((int.from_bytes(os.urandom(8), "little") >> 1) | 1)
    env.update(SEEDANCE_GROUP=f"{key:x}", SEEDANCE_GROUP_OWNER=str(os.getpid()),
               SEEDANCE_SHIM_VERSION=expected_version())
    if preload:
        env["LD_PRELOAD"] = ":".join(filter(None, [library, env.get("LD_PRELOAD", "")]))
    if audit:
        env["LD_AUDIT"] = ":".join(filter(None, [library, env.get("LD_AUDIT", "")]))
    for name, on in (("SEEDANCE_FOLLOW", follow_children), ("SEEDANCE_EVENTS", events)):
        if on:
            env[name] = "1"
        else:
            env.pop(name, None)
    if affinity:
        env["SEEDANCE_AFFINITY"] = affinity
    if mem_limit:
        env["SEEDANCE_MEM_LIMIT"] = mem_limit
    if handles == "per-instance":  # a context of its own instead of the shared primary one
        env["SEEDANCE_HANDLES"] = handles
    else:
        env.pop("SEEDANCE_HANDLES", None)
    return env, key
