"""One process, many loads: what ld.so does when a program dlopens (or Python imports) in order.

The resolver answers for one file at a time.  Real breakage happens inside one process:
ld.so reuses an already-loaded object whenever a later NEEDED matches its name or DT_SONAME
(_dl_map_object in elf/dl-load.c, _dl_name_match_p), whatever directory the later requester
would have searched, and binds symbols in scope order (elf/dl-lookup.c).  So the order of
imports and dlopens decides which copy everyone gets.  This module runs the resolver over a
sequence of loads and keeps, per load:

- the objects it adds to the link map, in the breadth-first order of _dl_map_object_deps;
- shadowing: a NEEDED satisfied by an already-loaded object that is not the file the
  requester would have found on its own;
- where each strong undefined symbol of a new object binds, in the scope ld.so uses
  (dl-open.c: the global scope -- the main program's search list, then objects opened
  RTLD_GLOBAL in order -- followed by the new object's own local search list);
- the verdict: loaded, or the text dlerror() would return (which is what Python prints
  after "ImportError: ").

Only public Resolver calls are used: a dlopen is modelled as a closure of the opened file
with everything already loaded passed as ``preloaded`` (so every NEEDED that matches a loaded
name or SONAME resolves as 'loaded', exactly as _dl_map_object checks the namespace first).

Known approximations (docs/resolver.md, "Process model"):
- a dlopen's RPATH inheritance starts at the opened object (the caller's and main program's
  DT_RPATH are not searched); a name without '/' is searched as the main program would;
- when several symbols are missing, ld.so names the first in relocation order (dynamic
  relocations are not read); this model names the first in the dynamic symbol table, of the
  object relocated first (dependencies before dependents, dl-open.c);
- copy relocations, IFUNC, RTLD_DEEPBIND, dlmopen namespaces and LD_AUDIT are not modelled.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

RTLD_LAZY, RTLD_NOW, RTLD_GLOBAL = 0x1, 0x2, 0x100


@dataclass(frozen=True)
class Load:
    """One request: the program itself, a dlopen, or a Python import's extension module."""
    target: str  # a path, or a name without '/' searched as dlopen does
    kind: str = "dlopen"  # exec | dlopen | import
    flags: int = RTLD_NOW  # dlopen mode; Python uses sys.getdlopenflags() (RTLD_NOW)
    module: str | None = None  # the Python module whose import dlopens it
    importer: str | None = None  # the top-level import that led here (`import a` -> 'a')


@dataclass(frozen=True)
class Edge:
    """One NEEDED of one object, and how it resolved in this process."""
    requester: str
    name: str
    path: str | None
    source: str  # the resolver's source; 'loaded' when an object in the process matched


@dataclass(frozen=True)
class Shadowing:
    """A NEEDED of ``requester`` satisfied by ``used`` (already loaded, by ``loaded_by``)
    instead of ``alone``, the file the requester finds when it is loaded on its own."""
    requester: str
    name: str
    used: str
    alone: str
    loaded_by: str  # the load (module, or file opened) that brought ``used`` in first
    loaded_for: str  # the object whose NEEDED mapped ``used`` first
    missing: tuple = ()  # (symbol, version) of requester that fail to bind because of it
    other_copy: tuple = ()  # (symbol, version, provider) bound to ``used`` that ``alone`` defines too


@dataclass(frozen=True)
class Binding:
    requester: str
    symbol: str
    version: str | None
    provider: str | None  # None: undefined symbol


@dataclass(frozen=True)
class LoadStep:
    load: Load
    ok: bool
    error: str | None  # dlerror() text, exactly; None when it loads
    new_objects: tuple  # paths added to the link map, load order
    edges: tuple  # Edge per NEEDED of the new objects
    shadowed: tuple  # Shadowing
    unbound: tuple  # Binding with provider None (only the first one is what ld.so reports)
    scope: tuple  # the lookup order the new objects' symbols were bound in
    already_loaded: bool = False  # the target was already in the link map: nothing happens
    notes: tuple = ()

    def shadow_consequence(self, missing: str) -> str:
        """What a shadowing that leaves ``missing`` (its text, not empty) unsatisfied does to
        this load: ld.so's own words where it stopped at the version check (dl-version.c),
        before relocation left any symbol unbound; else the undefined symbols."""
        return f"undefined symbol: {missing}" if self.unbound or not self.error else self.error

    @property
    def python_error(self) -> str | None:
        """What Python prints for a failed extension import (Python/dynload_shlib.c raises
        ImportError with dlerror()'s text)."""
        return f"ImportError: {self.error}" if self.error is not None else None


@dataclass
class ProcessModel:
    executable: str
    steps: list = field(default_factory=list)
    link_map: list = field(default_factory=list)  # paths, in load order
    global_scope: list = field(default_factory=list)
    loaded_by: dict = field(default_factory=dict)  # path -> (load label, NEEDED requester)

    @property
    def failed(self) -> LoadStep | None:
        return next((s for s in self.steps if not s.ok), None)


class _Symbols:
    """Definitions per object, with the matching rules of check_match() in dl-lookup.c
    (the same rules Resolver uses: a versioned reference binds to its version, hidden or
    not, or to a non-hidden unversioned definition; an unversioned one to a non-hidden
    definition)."""

    def __init__(self, resolver):
        self.resolver = resolver
        self._defs: dict = {}
        self._undefs: dict = {}

    def _read(self, path: str):
        if path in self._defs:
            return
        try:
            # the same binding tags (check_match in dl-lookup.c) and cache the resolver keeps,
            # from the C reader's raw table where it reads the file (no Symbol objects)
            defs, undefs = self.resolver.symbol_tables(path, self.resolver.read(path))
        except Exception:  # noqa: BLE001 - an unreadable object defines nothing here
            defs, undefs = {}, ()
        self._defs[path] = defs
        self._undefs[path] = undefs

    def defines(self, path: str, name: str, version: str | None) -> bool:
        self._read(path)
        return _binds(self._defs[path].get(name), version)

    def table(self, path: str) -> dict:
        """name -> the binding tags of the definitions in ``path`` (see _binds)."""
        self._read(path)
        return self._defs[path]

    def unbound_in(self, path: str, scope) -> list:
        """The (name, version) references of ``path`` that no object of ``scope`` defines:
        each table looked up directly, in scope order (dl-lookup.c's do_lookup_x walks
        the scope the same way; a C++ library asks tens of thousands of names)."""
        tables = [self.table(p) for p in scope]
        unbound = []
        for name, version in self.undefined(path):
            for table in tables:
                if _binds(table.get(name), version):
                    break
            else:
                unbound.append((name, version))
        return unbound

    def undefined(self, path: str) -> tuple:
        self._read(path)
        return self._undefs[path]


def _binds(tags, version: str | None) -> bool:
    """check_match() in dl-lookup.c over a name's definitions in one object."""
    if tags is None:
        return False
    if version is not None:
        return version in tags or "*" in tags
    return "default" in tags or None in tags


class Simulator:
    """Builds a ProcessModel one load at a time; ``resolver`` is a seedance.resolve.Resolver."""

    def __init__(self, resolver, executable: str):
        self.resolver = resolver
        self.symbols = _Symbols(resolver)
        self.model = ProcessModel(executable=executable)
        self._files: dict = {}  # (dev, ino) -> path in the link map

    # --- the program -------------------------------------------------------------------
    def start(self, preloaded: tuple = ()) -> LoadStep:
        """The executable and its NEEDED closure: the main search list, the global scope."""
        exe = self.model.executable
        closure = self.resolver.closure(exe, preloaded=tuple(preloaded))
        new = [p for p in closure.objects]
        if closure.interpreter and closure.interpreter not in new:
            new.append(closure.interpreter)  # ld.so is always in the link map
        edges = tuple(Edge(r.requester, r.name, r.path, r.source) for r in closure.resolutions)
        for path in new:
            self._add(path, exe, _first_requester(edges, path, exe))
        self.model.global_scope = list(new)
        missing = [e for e in edges if e.path is None]
        error = None
        if missing:
            error = f"{missing[0].name}: cannot open shared object file: No such file or directory"
        step = LoadStep(Load(exe, "exec"), error is None, error, tuple(new), edges, (), (), tuple(new))
        self.model.steps.append(step)
        return step

    def adopt(self, paths: list, label: str = "startup") -> None:
        """Objects already in the process (a live link map, the modules an interpreter loads
        at start-up) in order; they join the link map without being judged again."""
        for path in paths:
            if self._known(path) is None and os.path.exists(self.resolver._host(path)):  # inside its root
                self._add(path, label, label)

    # --- one dlopen ----------------------------------------------------------------------
    def dlopen(self, load: Load) -> LoadStep:
        target = load.target
        label = load.module or target
        path = target
        if "/" not in target:
            path = self._find_loaded_name(target)
            if path is None:
                res = self.resolver.explain(target, self.model.executable)
                path = res.path
                if path is None:
                    return self._record(LoadStep(load, False, f"{target}: cannot open shared object file: "
                                                                "No such file or directory", (), (), (), (), ()))
        elif not os.path.exists(self.resolver._host(path)):
            return self._record(LoadStep(load, False, f"{target}: cannot open shared object file: "
                                                      "No such file or directory", (), (), (), (), ()))
        known = self._known(path)
        if known is not None:
            if load.flags & RTLD_GLOBAL and known not in self.model.global_scope:
                self.model.global_scope.append(known)  # dlopen promotes a local object
            return self._record(LoadStep(load, True, None, (), (), (), (), tuple(self.model.global_scope),
                                         already_loaded=True))

        prior = tuple(p for p in self.model.link_map if p != self.model.executable and _loadable(self.resolver, p))
        closure = self.resolver.closure(path, preloaded=prior)
        new = [p for p in closure.objects if self._known(p) is None]
        new_set = set(new)
        # the closure maps `prior` (and LD_PRELOAD) as if the root needed them: those are not
        # NEEDED edges of the root
        injected = set(prior) | set(_preload_names(self.resolver))
        edges = tuple(Edge(r.requester, r.name, r.path, r.source) for r in closure.resolutions
                      if r.requester in new_set and not (r.requester == path and r.name in injected))
        local = _search_list(path, edges)
        scope = list(self.model.global_scope) + [p for p in local if p not in self.model.global_scope]

        # the verdict, in the order dl-open.c meets the failures: a NEEDED not found while
        # mapping, then version checks, then relocation
        error = None
        failed_check = None
        missing = [e for e in edges if e.path is None]
        if missing:
            error = f"{missing[0].name}: cannot open shared object file: No such file or directory"
        if error is None:
            for check in closure.version_checks:
                if (check.requester in new_set and not check.defined and not check.weak
                        and check.provider is not None):
                    error = (f"{check.provider}: version `{check.version}' not found "
                             f"(required by {check.requester})")
                    failed_check = check
                    break
        unbound = []
        if error is None and load.flags & RTLD_NOW:
            # relocation runs over the new objects in reverse init order: dependencies first
            for obj in reversed(new):
                unbound.extend(Binding(obj, name, version, None)
                               for name, version in self.symbols.unbound_in(obj, scope))
            if unbound:
                first = unbound[0]
                error = f"{first.requester}: undefined symbol: {first.symbol}" + (
                    f", version {first.version}" if first.version else "")

        shadowed = tuple(self._shadowing(path, edges, new_set, scope, unbound, failed_check))
        step = LoadStep(load, error is None, error, tuple(new), edges, shadowed, tuple(unbound), tuple(scope))
        if error is None:  # a failed dlopen is rolled back (dl-open.c _dl_close_worker)
            for obj in new:
                self._add(obj, label, _first_requester(edges, obj, path))
            if load.flags & RTLD_GLOBAL:
                self.model.global_scope.extend(p for p in local if p not in self.model.global_scope)
        return self._record(step)

    # --- shadowing -----------------------------------------------------------------------
    def _shadowing(self, root: str, edges, new_set, scope, unbound, failed_check=None):
        alone = {(r.requester, r.name): r.path for r in self.resolver.closure(root).resolutions}
        for edge in edges:
            if edge.source != "loaded" or edge.path is None or edge.path in new_set:
                continue
            own = alone.get((edge.requester, edge.name))
            if own is None or _same_file(own, edge.path):
                continue
            label, first_for = self.model.loaded_by.get(edge.path, ("?", "?"))
            missing = tuple((b.symbol, b.version) for b in unbound
                            if b.requester == edge.requester or b.requester in new_set)
            missing = tuple(m for m in missing if self.symbols.defines(own, *m))
            if (failed_check is not None and failed_check.requester == edge.requester
                    and _same_file(failed_check.provider, edge.path)):
                # ld.so stopped at the version check (dl-version.c), before relocation left
                # any symbol unbound: what fails is every symbol the requester wants at the
                # version node the copy loaded first lacks and its own copy defines
                missing = tuple((name, version) for name, version in self.symbols.undefined(edge.requester)
                                if version == failed_check.version and self.symbols.defines(own, name, version)) \
                    or (("", failed_check.version),)
            copies = []
            for name, version in self.symbols.undefined(edge.requester):
                if self.symbols.defines(edge.path, name, version) and self.symbols.defines(own, name, version):
                    provider = next((p for p in scope if self.symbols.defines(p, name, version)), None)
                    if provider == edge.path:
                        copies.append((name, version, provider))
            yield Shadowing(edge.requester, edge.name, edge.path, own, label, first_for, missing, tuple(copies))

    # --- helpers -------------------------------------------------------------------------
    def _record(self, step: LoadStep) -> LoadStep:
        self.model.steps.append(step)
        return step

    def _add(self, path: str, label: str, requester: str) -> None:
        self.model.link_map.append(path)
        self.model.loaded_by.setdefault(path, (label, requester))
        key = _file_key(path)
        if key is not None:
            self._files.setdefault(key, path)

    def _known(self, path: str) -> str | None:
        if path in self.model.link_map:
            return path
        key = _file_key(path)
        return self._files.get(key) if key is not None else None

    def _find_loaded_name(self, name: str) -> str | None:
        """_dl_map_object: a name without '/' matches a loaded object's DT_SONAME or the
        last component of the name it was opened under."""
        for path in self.model.link_map:
            try:
                info = self.resolver.read(path)
            except Exception:  # noqa: BLE001
                continue
            if info.soname == name:
                return path
        return None


def simulate(resolver, executable: str, loads, startup: tuple = ()) -> ProcessModel:
    """Run ``executable``'s start, adopt ``startup`` objects, then every Load in order;
    later loads still run after a failure (each failed dlopen is rolled back, and Python's
    `import a, b` stops at the first ImportError: callers decide)."""
    sim = Simulator(resolver, executable)
    sim.start()
    sim.adopt(list(startup))
    for load in loads:
        sim.dlopen(load)
    return sim.model


def _preload_names(resolver) -> list:
    env = getattr(resolver, "env", {}) or {}
    return [p for item in env.get("LD_PRELOAD", "").split(" ") for p in item.split(":") if p]


def _search_list(root: str, edges) -> list:
    """The breadth-first search list of ``root`` (its l_searchlist): root, then its NEEDED,
    then theirs, each object once."""
    by_requester: dict = {}
    for edge in edges:
        by_requester.setdefault(edge.requester, []).append(edge.path)
    order = [root]
    index = 0
    while index < len(order):
        for path in by_requester.get(order[index], ()):
            if path is not None and path not in order:
                order.append(path)
        index += 1
    return order


def _first_requester(edges, path: str, default: str) -> str:
    return next((e.requester for e in edges if e.path == path), default)


def _file_key(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _same_file(a: str, b: str) -> bool:
    return a == b or (_file_key(a) is not None and _file_key(a) == _file_key(b))


def _loadable(resolver, path: str) -> bool:
    """Only shared objects can be passed to a closure as preloaded (an executable cannot be
    dlopened: the main program stays out of the namespace list given to the resolver)."""
    try:
        info = resolver.read(path)
    except Exception:  # noqa: BLE001
        return False
    return info.e_type == 3 and not (info.flags_1 & 0x08000000)


def live(resolver, executable: str, mapped: list) -> tuple:
    """A running process from its mapped objects (/proc/PID/maps order): (Simulator, [Shadowing]).

    A mapped object answers a NEEDED by its DT_SONAME (the namespace check of
    _dl_map_object); a NEEDED whose requester would find another file on its own, while an
    object with that SONAME is mapped, is shadowed already."""
    sim = Simulator(resolver, executable)
    sim.start()
    sim.adopt([p for p in mapped if _loadable(resolver, p)], label="already mapped")
    by_soname: dict = {}
    for path in sim.model.link_map:
        try:
            info = resolver.read(path)
        except Exception:  # noqa: BLE001
            continue
        if info.soname:
            by_soname.setdefault(info.soname, path)
    shadowed = []
    for path in list(sim.model.link_map):
        if path == executable or not _loadable(resolver, path):
            continue
        try:
            alone = resolver.closure(path)
        except Exception:  # noqa: BLE001 - an object we cannot read is judged elsewhere
            continue
        for res in alone.resolutions:
            if res.requester != path or res.path is None:
                continue
            used = by_soname.get(res.name)
            if used is not None and not _same_file(used, res.path):
                label, first_for = sim.model.loaded_by.get(used, ("already mapped", "?"))
                shadowed.append(Shadowing(path, res.name, used, res.path, label, first_for))
    return sim, shadowed


@dataclass(frozen=True)
class Link:
    requester: str
    name: str
    path: str | None
    source: str


@dataclass(frozen=True)
class Chain:
    """Why ``path`` is in the process: the load that brought it in and the NEEDED links
    from that load's root down to it; ``also`` lists other requesters it satisfies."""
    path: str
    load: str  # the import/dlopen/program whose load mapped it
    links: tuple  # Link from the root down
    also: tuple  # Link of later NEEDED answered by this object (source 'loaded')


def matches(path: str | None, name: str, resolver=None) -> bool:
    """``name`` designates ``path``: the same path, base name, or DT_SONAME."""
    if path is None:
        return False
    if name == path or os.path.basename(path) == name:
        return True
    if resolver is not None and "/" not in name:
        try:
            return resolver.read(path).soname == name
        except Exception:  # noqa: BLE001
            return False
    return False


def why(model: ProcessModel, name: str, resolver=None) -> list:
    """Every object in ``model`` that ``name`` designates, with the chain that pulled it in."""
    chains = []
    for step in model.steps:
        first: dict = {}
        for edge in step.edges:
            if edge.path is not None and edge.source != "loaded":
                first.setdefault(edge.path, edge)
        for obj in step.new_objects:
            if not matches(obj, name, resolver):
                continue
            links = []
            cursor = obj
            seen = set()
            while cursor in first and cursor not in seen:
                seen.add(cursor)
                edge = first[cursor]
                links.append(Link(edge.requester, edge.name, edge.path, edge.source))
                cursor = edge.requester
            also = tuple(Link(e.requester, e.name, e.path, e.source)
                         for s in model.steps for e in s.edges if e.path == obj and e.source == "loaded")
            label = step.load.module or step.load.target
            chains.append(Chain(obj, f"{step.load.kind} {label}", tuple(reversed(links)), also))
    return chains
