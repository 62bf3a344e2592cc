"""Facts from one resolver Closure: NEEDED resolutions, version needs, undefined symbols,
and the CUDA runtimes the closure pulls in; after every closure of a check, which of its
roots fail with a load failure (fails_with_facts).

A directory scan computes one closure per ELF root, and the same library shows up in many
of them.  ``FactDedup`` keeps one fact per (requester, name) so a broken NEEDED in a shared
library is reported once, not once per object that loads it.
"""
from __future__ import annotations

import os

from ..model.report import Fact
from ..model.record import Record
from ..resolve.names import same_library
from . import cuda, inputs


def _stat_or_none(path: str):
    try:
        return inputs.stat(path)
    except OSError:
        return None


class FactDedup:
    """Remembers which facts were already emitted during one scan.

    Objects are keyed by inode, not path: the same library reached through two aliases
    (``functorch/../torch/lib``, a symlinked directory) is one object and is reported once,
    as ld.so maps it once (it matches a file by device and inode)."""

    def __init__(self):
        self.needed: dict = {}  # (identity of requester, name) -> NeededSeen
        self.versions: set = set()
        self.undefined: set = set()
        self.drivers: set = set()
        self._ids: dict = {}
        # frozenset of libcudart paths -> (closure size, root): the mix is reported at the
        # smallest closure that contains it, i.e. where the second runtime comes in.
        self.runtime_mixes: dict = {}
        # id(VersionCheck) -> the check, for checks version_facts() has judged.  The resolver
        # hands out one VersionCheck per (requester, verneed, provider) and the same object
        # again in every closure that maps both (resolver._checked): a check judged once
        # has its key in ``versions`` already (identities are remembered per path), so it
        # is skipped without building the key again.  The value keeps the object alive, so
        # its id is not reused.  The closures of a tree share most of their (requester,
        # provider) pairs, so most checks a scan hands out are ones already judged.
        self.checks_done: dict = {}
        # id(Resolution) -> (it, identity of its requester), for resolutions note_needed()
        # has seen where their requester was not the root.  The resolver shares one
        # Resolution per (name, requester) wherever the answer cannot differ (an object
        # already loaded, a search in the requester's own order), and noting it again
        # where its requester is not the root changes nothing: the entry's via_loader is
        # set the first time (or it resolved nowhere).  Every closure of a tree hands its
        # shared resolutions over again, so most are ones already seen.
        self.passive: dict = {}

    def first(self, bucket: set, key) -> bool:
        if key in bucket:
            return False
        bucket.add(key)
        return True

    # path -> os.stat result or None.  A scan lends its resolver's stat cache: the identity
    # is then the file the closure was computed from, at no second stat(2) per path
    stat_of = staticmethod(_stat_or_none)

    def identity(self, path: str):
        """(dev, inode) of a file, or its normalised path when it cannot be stat'ed."""
        known = self._ids.get(path)
        if known is None:
            st = self.stat_of(path)
            known = (st.st_dev, st.st_ino) if st is not None else os.path.normpath(path)
            self._ids[path] = known
        return known


class NeededSeen(Record):
    """Every way one NEEDED entry of one object was resolved during a scan."""
    _fields = ("standalone", "via_loader", "loader", "first", "context", "reason", "package")

    def __init__(self, standalone=None, via_loader=None, loader: str | None = None, first=None,
                 context: str = "", reason: str = "", package: str = ""):
        self.standalone = standalone  # Resolution with the requester loaded as the main program
        self.via_loader = via_loader  # a Resolution that found it in another root's closure
        self.loader = loader  # that root
        self.first = first
        self.context = context  # 'preloaded' when the scan modelled a package's preload
        self.reason = reason
        self.package = package


def note_needed(closure, dedup: FactDedup, skip_names=(), preloaded_by: dict | None = None) -> None:
    """Remember how each NEEDED of the closure resolved; facts come from needed_facts().

    ``skip_names``: objects the scan preloaded itself (not NEEDED entries of anyone).
    ``preloaded_by``: provider path -> (reason, package) for the providers that a package
    loads before this object (collect/practice.py)."""
    root = closure.root
    root_id = dedup.identity(root)
    # dedup.identity() inlined: this loop runs for every NEEDED of every closure of a scan,
    # and a Python call per NEEDED would be a large part of it
    ids, identity, needed = dedup._ids, dedup.identity, dedup.needed
    passive = dedup.passive
    for res in closure.resolutions:
        known = passive.get(id(res))
        if known is not None and known[1] != root_id:
            continue  # noted before where its requester was not the root: a no-op again
        requester = res.requester
        if skip_names and res.name in skip_names and requester == root:
            continue
        requester_id = ids.get(requester)
        if requester_id is None:
            requester_id = identity(requester)
        if known is None and requester_id != root_id:
            passive[id(res)] = (res, requester_id)
        key = (requester_id, res.name)
        seen = needed.get(key)
        if seen is None:
            seen = needed[key] = NeededSeen(first=res)
        if requester_id == root_id:
            if seen.standalone is None or (seen.standalone.path is None and res.path is not None):
                seen.standalone = res
                hint = (preloaded_by or {}).get(res.path) if res.source == "loaded" else None
                if hint:
                    # a third item: 'preload-step', found only after a call the user makes
                    seen.context = hint[2] if len(hint) > 2 else "preloaded"
                    seen.reason, seen.package = hint[0], hint[1]
        elif res.path is not None and seen.via_loader is None:
            seen.via_loader, seen.loader = res, closure.root


def needed_facts(dedup: FactDedup, explain_missing=None) -> list:
    """One needed fact per (object, NEEDED name), after every closure of the scan is seen.

    An object is judged as it is loaded in practice: a NEEDED that fails
    when the object is loaded on its own, but that its loader in the scanned tree resolves
    (an inherited DT_RPATH, a SONAME already loaded) or that a package preloads, is
    resolved, with the reason in ``context``.  ``explain_missing(resolution)`` -> dict adds
    what is known about a NEEDED that nothing resolves (collect/practice.py)."""
    facts = []
    for seen in dedup.needed.values():
        res = seen.standalone or seen.first
        subject = res.requester  # the object's own path (a root's), not an alias it was reached by
        context, reason, package, loader = seen.context, seen.reason, seen.package, None
        if res.path is None and seen.via_loader is not None:
            res, loader = seen.via_loader, seen.loader
            context = "loader"
            how = {"rpath": "through the DT_RPATH it inherits from", "loaded": "already loaded by"}
            reason = f"found {how.get(res.source, 'via ' + res.source + ' when loaded by')} {loader}"
        data = {"name": res.name, "resolved": res.path is not None,
                "resolved_path": res.path, "has_soname": bool(res.soname),
                "soname": res.soname, "same_library": same_library(res.name, res.soname or ""),
                "source": res.source, "tried": list(res.tried),
                "search_order": list(res.search_order), "context": context, "reason": reason,
                "package": package, "loader": loader or "", "installed_at": [], "where": ""}
        if res.path is None and explain_missing is not None:
            data.update(explain_missing(res))
        facts.append(Fact("needed", {"path": subject}, data, source="collect.closure"))
    return facts


def version_facts(closure, dedup: FactDedup) -> list:
    facts = []
    done = dedup.checks_done
    groups = getattr(closure, "version_groups", None)
    if groups is None:
        checks = [check for check in closure.version_checks if id(check) not in done]
    else:
        # the resolver's shared tuples (Closure.version_groups): a tuple judged in an
        # earlier closure is skipped whole, its checks with it
        checks = []
        for group in groups:
            if id(group) not in done:
                done[id(group)] = group
                checks.extend(group)
    versions = dedup.versions
    identity = dedup.identity
    for check in checks:
        if id(check) in done:
            continue  # this very check was judged in an earlier closure (FactDedup.checks_done)
        done[id(check)] = check
        if check.provider is None:
            continue  # the NEEDED itself is unresolved: needed-unresolved already says so
        key = (identity(check.requester), check.file, check.version)
        if key in versions:
            continue
        versions.add(key)
        # the Fact as its __init__ makes it, without the call: one per version a library
        # needs, thousands in a check of a system library directory
        fact = Fact._build({
            "kind": "version_need", "subject": {"path": check.requester},
            "data": {"file": check.file, "version": check.version, "weak": bool(check.weak),
                     "provider": check.provider, "defined": bool(check.defined),
                     "provider_versions": list(check.provider_versions)},
            "source": "collect.closure"})
        facts.append(fact)
    return facts


# ``cause`` of an undefined_symbol fact
NODE_LACKS_SYMBOL = "node-lacks-symbol"  # X@V, the provider defines V but not X: load fails
NO_DEFINITION = "no-definition"  # nothing in the closure (nor its host) defines it


def gap_facts(closure, gaps, dedup: FactDedup, package_of=None) -> list:
    """undefined_symbol facts for references X@V whose provider defines node V but not X.
    ``package_of(path)``: the pip distribution or Debian package shipping the provider."""
    facts = []
    size = len(closure.objects)
    for gap in gaps:
        key = (dedup.identity(gap.requester), gap.symbol, gap.version)
        if not dedup.first(dedup.undefined, key):
            continue
        facts.append(Fact("undefined_symbol", {"path": gap.requester},
                          {"symbol": gap.symbol, "version": gap.version, "provided": False,
                           "closure_size": size, "cause": NODE_LACKS_SYMBOL,
                           "provider": gap.provider, "host": "",
                           "upgrade": _upgrade(gap.provider, package_of)},
                          source="collect.closure"))
    return facts


def _upgrade(provider: str, package_of) -> str:
    """The command that brings a newer provider: from its package manager when known."""
    package = package_of(provider) if package_of is not None else None
    # /usr/lib/python3/dist-packages holds Debian's own modules, installed by dpkg (Debian
    # Python Policy, 1.5); pip writes a venv's site-packages or /usr/local/lib/python3.X/dist-packages
    debian_module = provider.startswith(("/usr/lib/python3/", "/lib/python3/"))
    if package and not debian_module and ("site-packages" in provider or "dist-packages" in provider):
        return f"pip install -U {package}"
    if package:
        return f"apt-get install --only-upgrade {package}"
    return f"install a newer {os.path.basename(provider)}"


def undefined_facts(closure, dedup: FactDedup, undefined=None, host: str = "") -> list:
    """``undefined``: (requester, symbol, version) to report, default closure.undefined;
    ``host``: the program whose symbols were also in scope (an interpreter), for the text."""
    facts = []
    size = len(closure.objects)
    for requester, symbol, version in (closure.undefined if undefined is None else undefined):
        if not dedup.first(dedup.undefined, (dedup.identity(requester), symbol, version)):
            continue
        facts.append(Fact("undefined_symbol", {"path": requester},
                          {"symbol": symbol, "version": version, "provided": False,
                           "closure_size": size, "cause": NO_DEFINITION, "provider": "",
                           "host": host},
                          source="collect.closure"))
    return facts


def closure_runtimes(closure, memo: dict | None = None) -> dict:
    """libcudart path -> (major, requester) for every runtime in the closure.

    ``memo``: path -> its runtime major (None: not a runtime) across the closures of one
    scan, where a path is one ElfInfo (the resolver reads each file once): a library in a
    thousand closures is looked at once, and closures without a runtime (all of /usr/lib)
    cost a lookup per object."""
    majors = {}
    objects = closure.objects
    if memo is None:
        memo = {}
    for path, info in objects.items():
        if path not in memo:
            memo[path] = cuda.runtime_major(path, info) if cuda.is_cudart(path, info) else None
    for path in objects:
        major = memo[path]
        if major is not None:
            majors[path] = major
    if not majors:
        return {}
    requesters = {}
    for res in closure.resolutions:
        if res.path is not None and res.path not in requesters:
            requesters[res.path] = res.requester
    return {path: (major, requesters.get(path, closure.root)) for path, major in majors.items()}


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


# the file names of torch's own core libraries (scan.py starts the C++ ABI check's helper
# when a tree holds one)
TORCH_CORE_NAMES = ("libc10.so", "libtorch_cpu.so", "libtorch.so")


def torch_libs(closure, memo: dict | None = None) -> list:
    """Paths of torch's own core libraries (libc10, libtorch*) in the closure.
    ``memo``: path -> whether it is one, across the closures of one scan."""
    if memo is None:
        memo = {}
    for path in closure.objects:
        if path not in memo:
            memo[path] = os.path.basename(path).startswith(TORCH_CORE_NAMES)
    return [path for path in closure.objects if memo[path]]


# how many of the objects that fail with a load failure its fact lists (also_fails), and how
# many its message names; also_fails_count is always the whole number
ALSO_FAILS_LISTED = 200
ALSO_FAILS_NAMED = 3


def _fails_to_load(fact) -> bool:
    """Whether ``fact`` says ld.so refuses to load its subject, whatever loads it.

    Only what fails where the object really runs: a NEEDED that resolves nowhere and that no
    practice explains (needed-unresolved), a version node its provider lacks
    (symbol-version-missing: dl-version.c), a versioned symbol the node lacks
    (symbol-version-lacks-symbol: relocation fails under RTLD_NOW), an x86 ISA level this
    CPU lacks (dl-prop.h).  A miss with a ``context`` does not count: a driver library on a
    host without the driver (the package runs where the driver is, and there it loads), a
    variant the package does not pick, an optional provider or plugin loaded only on
    request, a step the user calls first, a private library its program loads: the
    object loads, or is never loaded, where the package is used, so what loads it does
    not fail with it.  A DT_SONAME mismatch loads (ld.so opens a NEEDED by file name), and a
    plain undefined symbol fails only at its first call under lazy binding."""
    data = fact.data
    kind = fact.kind
    if kind == "needed":
        return not data.get("resolved", True) and not data.get("context")
    if kind == "version_need":
        return not data.get("defined", True) and not data.get("weak", False)
    if kind == "undefined_symbol":
        return not data.get("provided", True) and data.get("cause") == NODE_LACKS_SYMBOL
    if kind == "cpu_isa":
        return bool(data.get("lacking"))
    return False


_FAILURE_KINDS = frozenset(("needed", "version_need", "undefined_symbol", "cpu_isa"))


def fails_with_facts(facts: list, closures: list, identity) -> list:
    """``facts`` with each load failure (_fails_to_load) naming the objects of the checked
    tree that fail with it: the roots whose closure, as ld.so resolves it for them (their
    own DT_RUNPATH, DT_RPATH, preloads), maps the failing object.  ld.so refuses the whole
    dlopen, or the program's start, when one object of it cannot be loaded, so one cause
    stays one finding that counts its consequences (a broken libtorch_cuda.so is one error
    naming every extension that loads it, not an error per extension).

    ``closures``: (root, paths of its closure's objects) for every root of the check;
    ``identity``: path -> the file's identity (FactDedup.identity), as ld.so matches a file
    by device and inode, so an alias of the failing object is that object.  The failure's
    data gains ``also_fails`` (the first ALSO_FAILS_LISTED paths, sorted),
    ``also_fails_count`` and ``also_fails_note`` (the end of its message)."""
    from ..model.report import fails_with_note

    causes: dict = {}  # identity of a failing object -> indices of its failures in facts
    for index, fact in enumerate(facts):
        if fact.kind in _FAILURE_KINDS and _fails_to_load(fact):
            path = fact.subject.get("path")
            if isinstance(path, str):
                causes.setdefault(identity(path), []).append(index)
    if not causes or not closures:
        return facts
    mapped: set = set()
    for _root, objects in closures:
        mapped.update(objects)
    failing = {}  # path in some closure -> identity, for the paths that are failing objects
    for path in mapped:
        key = identity(path)
        if key in causes:
            failing[path] = key
    if not failing:
        return facts
    dependents: dict = {}  # index of a failure -> roots that fail with it
    for root, objects in closures:
        if failing.keys().isdisjoint(objects):
            continue  # (nearly every root)
        root_key = identity(root)
        for path in objects:
            key = failing.get(path)
            if key is None or key == root_key:
                continue  # the failing object checked as a root is the failure itself
            for index in causes[key]:
                provider = facts[index].data.get("provider")
                if provider and provider not in objects:
                    # a version check against another provider than the one this root's
                    # closure maps under that name (a DT_RPATH it passes on): not this failure
                    continue
                dependents.setdefault(index, []).append(root)
    if not dependents:
        return facts
    facts = list(facts)
    for index, roots in dependents.items():
        fact = facts[index]
        roots = sorted(set(roots))
        note = fails_with_note(len(roots), [os.path.basename(p) for p in roots[:ALSO_FAILS_NAMED]])
        facts[index] = Fact(fact.kind, fact.subject,
                            {**fact.data, "also_fails": roots[:ALSO_FAILS_LISTED],
                             "also_fails_count": len(roots), "also_fails_note": note},
                            source=fact.source)
    return facts
