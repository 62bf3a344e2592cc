"""seedance.shim: the Python side of libseedance_shim.so.

The C library (shim/src/, built at install time into ``libseedance_shim.so`` next to
this file) is preloaded into wrapped programs; this package reads what it shares.
Other parts of seedance build on these calls (stable API):

    from seedance import shim

    shim.library_path()            -> Path of libseedance_shim.so (raises NotAvailable)
    shim.binding()                 -> (ffi, lib): cffi ABI binding; the version compiled
                                      into the .so is checked on first use
    reg = shim.Registry.open()     -> the registry ($XDG_RUNTIME_DIR/seedance/registry.v2;
                                      SEEDANCE_RUNTIME_DIR overrides); None-safe: raises
                                      NotAvailable when there is none yet
    reg.instances()                -> [Instance(slot, pid, start_time, state, alive, exe,
                                       group, devices, visible, ...)]
    reg.slots_of_group(index)      -> [slot]: cheap, for polling
    reg.allocations(slot)          -> [Allocation(ptr, size, device, api, library)]: what
                                      the instance still holds (for a dead one: its leaks)
    reg.leaks(slot)                -> {(device, library): bytes}
    reg.reclaim(slot)              -> True when the slot was freed (dead or exited only)
    reg.drain_events(slot)         -> [dict]: events since the last drain (see EVENT FORMAT)
    reg.group(index)               -> Group(key, limits, used, refused, members, peak)
    env, key = shim.wrap_env(audit=True, events=True)
                                   -> the environment that starts a child under the shim;
                                      its instances are the slots of reg.find_group(key)

EVENT FORMAT (one JSON object per line in ``seedance run --events FILE``):
    {"seq": n, "t_ns": monotonic ns, "pid": ..., "kind": "alloc"|"free"|"quota_refused"|
     "init"|"remap"|"note"|"context"|"exit"|"objsearch"|"objopen"|"symbind", ...}
    alloc/free/quota_refused: api, device (physical), ptr, bytes, library
    objsearch: name (the path tried), source ("LA_SER_ORIG"|"LA_SER_LIBPATH"|
               "LA_SER_RUNPATH"|"LA_SER_CONFIG"|"LA_SER_DEFAULT"|"LA_SER_SECURE"),
               requester (object number)
    objopen:   obj (number), path, lmid
    symbind:   symbol, from_obj, to_obj (object numbers from objopen events)
"""
from .binding import NotAvailable, binding, header_path, launcher_path, library_path  # noqa: F401
from .registry import (  # noqa: F401
    Allocation,
    Group,
    Instance,
    Registry,
    registry_path,
)
from .events import event_to_dict, EVENT_KINDS, SEARCH_SOURCES  # noqa: F401
from .wrap import wrap_env  # noqa: F401
