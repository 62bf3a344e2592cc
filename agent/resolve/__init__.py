"""An ld.so-faithful resolver: what glibc's dynamic loader would load, without running it.

Public API (seedance check and seedance ldd build on it):
    Resolver(env=None, secure=False, cache_path='/etc/ld.so.cache', root='/', platform=None)
        .closure(path, symbols=False, preloaded=()) -> Closure
        .explain(name, requester) -> Resolution
    Resolution, VersionCheck, Closure: frozen results with the explanation of each decision.
"""
from .ldcache import LdCache  # noqa: F401
from .resolver import ABIS, Abi, Closure, Resolution, Resolver, VersionCheck  # noqa: F401

__all__ = ["Resolver", "Resolution", "VersionCheck", "Closure", "LdCache", "Abi", "ABIS"]
