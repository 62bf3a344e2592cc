"""Facts from one resolver Closure: NEEDED resolutions, version needs, undefined symbols,
and the CUDA runtimes the closure pulls in.

A directory scan computes one closure per ELF root, and the same library shows up in many
of them.  ``FactDedup`` keeps one fact per (requester, name) so a broken NEEDED in a shared
library is reported once, not once per object that loads it.
"""
from __future__ import annotations

import os

from ..model import Fact
from . import cuda


class FactDedup:
    """Remembers which facts were already emitted during one scan."""

    def __init__(self):
        self.needed: set = set()
        self.versions: set = set()
        self.undefined: set = set()
        self.drivers: set = set()
        # frozenset of libcudart paths -> (closure size, root): the mix is reported at the
        # smallest closure that contains it, i.e. where the second runtime comes in.
        self.runtime_mixes: dict = {}

    def first(self, bucket: set, key) -> bool:
        if key in bucket:
            return False
        bucket.add(key)
        return True


def needed_facts(closure, dedup: FactDedup, skip_names=()) -> list:
    """``skip_names``: objects the scan preloaded itself (not NEEDED entries of anyone)."""
    facts = []
    for res in closure.resolutions:
        if res.name in skip_names and res.requester == closure.root:
            continue
        if not dedup.first(dedup.needed, (res.requester, res.name)):
            continue
        facts.append(Fact("needed", {"path": res.requester},
                          {"name": res.name, "resolved": res.path is not None,
                           "resolved_path": res.path, "has_soname": bool(res.soname),
                           "soname": res.soname, "source": res.source,
                           "tried": list(res.tried), "search_order": list(res.search_order)},
                          source="collect.closure"))
    return facts


def version_facts(closure, dedup: FactDedup) -> list:
    facts = []
    for check in closure.version_checks:
        if check.provider is None:
            continue  # the NEEDED itself is unresolved: needed-unresolved already says so
        if not dedup.first(dedup.versions, (check.requester, check.file, check.version)):
            continue
        facts.append(Fact("version_need", {"path": check.requester},
                          {"file": check.file, "version": check.version, "weak": bool(check.weak),
                           "provider": check.provider, "defined": bool(check.defined),
                           "provider_versions": list(check.provider_versions)},
                          source="collect.closure"))
    return facts


def undefined_facts(closure, dedup: FactDedup) -> list:
    facts = []
    size = len(closure.objects)
    for requester, symbol, version in closure.undefined:
        if not dedup.first(dedup.undefined, (requester, symbol, version)):
            continue
        facts.append(Fact("undefined_symbol", {"path": requester},
                          {"symbol": symbol, "version": version, "provided": False,
                           "closure_size": size},
                          source="collect.closure"))
    return facts


def closure_runtimes(closure) -> dict:
    """libcudart path -> (major, requester) for every runtime in the closure."""
    requesters = {}
    for res in closure.resolutions:
        if res.path is not None and res.path not in requesters:
            requesters[res.path] = res.requester
    runtimes = {}
    for path, info in closure.objects.items():
        if cuda.is_cudart(path, info):
            major = cuda.runtime_major(path, info)
            if major is not None:
                runtimes[path] = (major, requesters.get(path, closure.root))
    return runtimes


def note_runtime_mix(closure, runtimes: dict, dedup: FactDedup) -> None:
    if not runtimes:
        return
    key = frozenset(runtimes)
    size = len(closure.objects)
    best = dedup.runtime_mixes.get(key)
    if best is None or size < best[0] or (size == best[0] and closure.root < best[1]):
        dedup.runtime_mixes[key] = (size, closure.root, {p: m for p, (m, _r) in runtimes.items()})


def runtime_mix_facts(dedup: FactDedup) -> list:
    """cuda_runtimes facts, one per distinct set of runtimes, after every closure is seen."""
    facts = []
    for _key, (_size, root, runtimes) in sorted(dedup.runtime_mixes.items(), key=lambda kv: kv[1][1]):
        facts.append(Fact("cuda_runtimes", {"path": root},
                          {"majors": sorted(set(runtimes.values())), "paths": sorted(runtimes),
                           "via": "closure"},
                          source="collect.closure"))
    return facts


def driver_facts(runtimes: dict, gpu, dedup: FactDedup) -> list:
    if not gpu.driver_version:
        return []
    facts = []
    for path, (major, requester) in runtimes.items():
        if requester == path:
            continue  # the runtime checked as a root: an installed runtime fails no one by itself
        if not dedup.first(dedup.drivers, (requester, path)):
            continue
        fact = cuda.driver_fact(requester, path, major, gpu.driver_version, gpu.driver_source)
        if fact is not None:
            facts.append(fact)
    return facts


TORCH_LIB_PREFIXES = ("libc10", "libtorch", "libshm")


def torch_libs(closure) -> list:
    """Paths of torch's own core libraries (libc10, libtorch*) in the closure."""
    out = []
    for path in closure.objects:
        base = os.path.basename(path)
        if base.startswith(("libc10.so", "libtorch_cpu.so", "libtorch.so")):
            out.append(path)
    return out
