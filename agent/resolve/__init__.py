"""An ld.so-faithful resolver: what glibc's dynamic loader would load, without running it.

Public API (seedance check and seedance ldd build on it):
    Resolver(env=None, secure=False, cache_path='/etc/ld.so.cache', root='/', platform=None)
        .closure(path, symbols=False, preloaded=()) -> Closure
        .explain(name, requester) -> Resolution
        .version_gaps(closure, scope=None) -> [SymbolGap]   X@NODE whose provider lacks X
        .undefined(closure, scope=None) -> [(requester, symbol, version)]
    Resolution, VersionCheck, Closure: frozen results with the explanation of each decision.
"""
from .ldcache import LdCache  # noqa: F401
from .resolver import ABIS, Abi, Closure, Resolution, Resolver, SymbolGap, VersionCheck  # noqa: F401

__all__ = ["Resolver", "Resolution", "VersionCheck", "Closure", "SymbolGap", "LdCache", "Abi", "ABIS"]
