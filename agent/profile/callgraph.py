"""A plugin's call graph and its redundant paths (product notes 2.1).

The plugin's bench callable runs once on one input under the interpreter's profiling hook
(sys.setprofile).  Every call of a function defined in the plugin's own files becomes a
node of the call tree; calls into the plugin's native libraries through ctypes become
nodes too (their cached foreign functions are wrapped for the run and restored after).

    cost(v) = cpu_ms + 0.3 * mem_mb        (notes 2.1)

cpu_ms is the call's inclusive thread CPU time; mem_mb is, for Python, the tracemalloc
peak above the call's starting point and, for native calls, the growth of the process's
peak RSS (ru_maxrss) across the call.

Redundancy: the return value of every call is hashed (pickle, capped at 4 MiB).  Two calls
whose outputs hash equal, whose call paths differ and neither of which is an ancestor of
the other computed the same thing twice.  A pair is reported at its highest point: when
the two callers are themselves such a pair, only theirs is.  The suggested merge computes
the value once at the paths' shared prefix and reuses it; its saving is the cost of the
dearer of the two calls, the one the merge removes.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import pickle
import resource
import sys
import time
import tracemalloc
from dataclasses import dataclass, field

MEM_WEIGHT = 0.3           # notes 2.1: cost(v) = cpu_ms + 0.3 * mem_mb
HASH_CAP = 4 << 20         # bytes of an output that are hashed (plus its length)
MIN_OUTPUT_BYTES = 16      # smaller outputs (flags, counts) match by coincidence, not redundancy


@dataclass
class Call:
    """One call in the call tree."""
    id: int
    function: str
    parent: int | None
    depth: int
    cpu_ns: int = 0
    mem_bytes: int = 0
    native: bool = False
    output_hash: str | None = None
    output_size: int = 0
    children: list = field(default_factory=list)

    @property
    def cost(self) -> float:
        return self.cpu_ns / 1e6 + MEM_WEIGHT * self.mem_bytes / (1 << 20)


@dataclass
class Redundancy:
    path_a: list
    path_b: list
    shared_prefix: list
    saving: float          # cost units: cpu_ms + 0.3 * mem_mb of the call the merge removes
    saving_cpu_ms: float
    saving_mem_mb: float
    keep: str              # the call whose result is computed once and reused
    remove: str
    output_hash: str

    def to_dict(self) -> dict:
        return {"path_a": self.path_a, "path_b": self.path_b, "shared_prefix": self.shared_prefix,
                "saving_cost": round(self.saving, 6), "saving_cpu_ms": round(self.saving_cpu_ms, 6),
                "saving_mem_mb": round(self.saving_mem_mb, 6), "keep": self.keep, "remove": self.remove,
                "merge": merge_text(self), "output_hash": self.output_hash}


@dataclass
class CallGraph:
    calls: list
    redundancies: list

    def path(self, call_id: int) -> list:
        names = []
        while call_id is not None:
            call = self.calls[call_id]
            names.append(call.function)
            call_id = call.parent
        return names[::-1]

    def functions(self) -> dict:
        """The graph G = (V, E): functions with their summed cost, and call edges with counts."""
        nodes: dict = {}
        edges: dict = {}
        for call in self.calls:
            node = nodes.setdefault(call.function, {"name": call.function, "calls": 0, "cpu_ms": 0.0,
                                                    "mem_mb": 0.0, "native": call.native})
            node["calls"] += 1
            node["cpu_ms"] += call.cpu_ns / 1e6
            node["mem_mb"] = max(node["mem_mb"], call.mem_bytes / (1 << 20))
            if call.parent is not None:
                key = (self.calls[call.parent].function, call.function)
                edges[key] = edges.get(key, 0) + 1
        for node in nodes.values():
            node["cost"] = node["cpu_ms"] + MEM_WEIGHT * node["mem_mb"]
        return {"nodes": sorted(nodes.values(), key=lambda n: n["name"]),
                "edges": [{"caller": a, "callee": b, "count": n} for (a, b), n in sorted(edges.items())]}

    def to_dict(self) -> dict:
        graph = self.functions()
        graph["redundant_paths"] = [r.to_dict() for r in self.redundancies]
        graph["calls"] = len(self.calls)
        return graph


def merge_text(r: Redundancy) -> str:
    where = r.shared_prefix[-1] if r.shared_prefix else "the caller"
    return (f"compute {r.keep} once in {where} and pass its result where {r.remove} "
            f"is called ({' -> '.join(r.path_b if r.remove == r.path_b[-1] else r.path_a)})")


def output_digest(value) -> tuple[str | None, int]:
    """(hash, size) of a call's output, or (None, size) when it is too small to mean anything."""
    if value is None or isinstance(value, (bool, int, float, complex)):
        return None, 0
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value[:HASH_CAP]) if not isinstance(value, memoryview) else value.tobytes()[:HASH_CAP]
        size = len(value) if not isinstance(value, memoryview) else value.nbytes
    else:
        try:
            data = pickle.dumps(value, protocol=4)
        except Exception:  # an unpicklable object (a handle, a lock): compare by repr
            data = repr(value).encode("utf-8", "replace")
        size = len(data)
        data = data[:HASH_CAP]
    if size < MIN_OUTPUT_BYTES:
        return None, size
    digest = hashlib.blake2b(data, digest_size=16)
    digest.update(str(size).encode())
    return digest.hexdigest(), size


def _native_wrapper(symbol: str, function):
    # every wrapper shares this code object, which is how the hook knows a native call;
    # the symbol rides in a keyword default so it shows in the frame's locals
    def native_call(*args, _seedance_symbol=symbol):
        return function(*args)
    return native_call


_NATIVE_CODE = _native_wrapper("", None).__code__


def _wrap_native(modules) -> list:
    """Wrap the foreign functions the plugin's modules already resolved; returns undo info."""
    undo = []
    for module in modules:
        for value in list(vars(module).values()):
            if not isinstance(value, ctypes.CDLL):
                continue
            library = os.path.basename(getattr(value, "_name", "") or "?")
            for name, function in list(vars(value).items()):
                if isinstance(function, ctypes._CFuncPtr):
                    wrapper = _native_wrapper(f"{library}:{name}", function)
                    value.__dict__[name] = wrapper
                    undo.append((value, name, function))
    return undo


def profile_call(function, argument, roots, modules=()) -> CallGraph:
    """Run function(argument) once and build its call tree over code under ``roots``."""
    roots = tuple(os.path.realpath(r) + os.sep for r in roots)
    calls: list[Call] = []
    stack: list[tuple] = []   # (frame, call, cpu_start, mem_start, rss_start)
    peaks: list[int] = []     # tracemalloc peak seen while each stacked call ran
    in_plugin: dict = {}

    def module_name(filename) -> str:
        # the plugin's own name for its module (features, pkg.sub), not the unique name
        # the bench loader registered it under
        real = os.path.realpath(filename)
        root = next((r for r in roots if real.startswith(r)), "")
        return os.path.splitext(real[len(root):])[0].replace(os.sep, ".") or "?"

    def plugin_code(code) -> bool:
        known = in_plugin.get(code)
        if known is None:
            known = in_plugin[code] = os.path.realpath(code.co_filename).startswith(roots)
        return known

    def hook(frame, event, arg):
        if stack:
            current = tracemalloc.get_traced_memory()[0]
            if current > peaks[-1]:
                peaks[-1] = current
        if event == "call":
            code = frame.f_code
            native = code is _NATIVE_CODE
            if not native and not plugin_code(code):
                return
            if native:
                name = frame.f_locals.get("_seedance_symbol") or "?"
                name = f"native:{name}"
            else:
                name = f"{module_name(code.co_filename)}.{getattr(code, 'co_qualname', code.co_name)}"
            parent = stack[-1][1].id if stack else None
            call = Call(len(calls), name, parent, len(stack), native=native)
            if parent is not None:
                calls[parent].children.append(call.id)
            calls.append(call)
            mem = tracemalloc.get_traced_memory()[0]
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss if native else 0
            stack.append((frame, call, time.thread_time_ns(), mem, rss))
            peaks.append(mem)
        elif event == "return" and stack and stack[-1][0] is frame:
            _, call, cpu_start, mem_start, rss_start = stack.pop()
            peak = peaks.pop()
            call.cpu_ns = time.thread_time_ns() - cpu_start
            if call.native:
                call.mem_bytes = max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_start) * 1024
            else:
                call.mem_bytes = max(0, peak - mem_start)
            if peaks and peak > peaks[-1]:
                peaks[-1] = peak
            call.output_hash, call.output_size = output_digest(arg)

    undo = _wrap_native(modules)
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        function(argument)
    finally:
        sys.setprofile(previous)
        if started:
            tracemalloc.stop()
        for library, name, original in undo:
            library.__dict__[name] = original
    graph = CallGraph(calls, [])
    graph.redundancies = find_redundancies(graph)
    return graph


def _ancestors(graph: CallGraph, call_id: int) -> set:
    out = set()
    parent = graph.calls[call_id].parent
    while parent is not None:
        out.add(parent)
        parent = graph.calls[parent].parent
    return out


def find_redundancies(graph: CallGraph) -> list[Redundancy]:
    groups: dict = {}
    for call in graph.calls:
        if call.output_hash:
            groups.setdefault(call.output_hash, []).append(call.id)
    pairs = set()
    for ids in groups.values():
        for i, a in enumerate(ids):
            for b in ids[i + 1:]:
                path_a, path_b = graph.path(a), graph.path(b)
                if path_a == path_b:
                    continue  # the same path run twice (a loop) is repetition, not a second path
                shorter = min(len(path_a), len(path_b))
                if path_a[:shorter] == path_b[:shorter]:
                    continue  # one path is a subpath of the other: a wrapper returning its callee's value
                pairs.add((a, b))

    def lifted(a, b) -> bool:
        """Another pair sits above this one: each of its calls is this pair's call or an
        ancestor of it (a caller returning the same value, or both callers duplicated)."""
        above_a = _ancestors(graph, a) | {a}
        above_b = _ancestors(graph, b) | {b}
        return any((x in above_a and y in above_b or x in above_b and y in above_a) and (x, y) != (a, b)
                   for x, y in pairs)

    found, seen = [], set()
    for a, b in sorted(pairs):
        if lifted(a, b):
            continue  # reported at the callers, where the merge saves more
        path_a, path_b = graph.path(a), graph.path(b)
        key = (tuple(path_a), tuple(path_b))
        if key in seen:
            continue
        seen.add(key)
        prefix = []
        for x, y in zip(path_a, path_b):
            if x != y:
                break
            prefix.append(x)
        call_a, call_b = graph.calls[a], graph.calls[b]
        dear, cheap = (call_a, call_b) if call_a.cost >= call_b.cost else (call_b, call_a)
        found.append(Redundancy(path_a, path_b, prefix, dear.cost, dear.cpu_ns / 1e6, dear.mem_bytes / (1 << 20),
                                keep=cheap.function, remove=dear.function, output_hash=call_a.output_hash))
    return sorted(found, key=lambda r: -r.saving)


def to_dot(graph: CallGraph, title: str):
    """A graphviz Digraph of G with the redundant paths' edges and nodes in red."""
    import graphviz

    functions = graph.functions()
    red_nodes, red_edges = set(), set()
    for r in graph.redundancies:
        for path in (r.path_a, r.path_b):
            red_nodes.update(path[len(r.shared_prefix):])
            red_edges.update(zip(path[max(0, len(r.shared_prefix) - 1):], path[len(r.shared_prefix):]))
    dot = graphviz.Digraph(name="callgraph", graph_attr={"label": title, "labelloc": "t", "rankdir": "TB"})
    # node ids are plain n0, n1, ...: a name such as native:libfeat.so:fn would read as a DOT port
    ids = {node["name"]: f"n{index}" for index, node in enumerate(functions["nodes"])}
    for node in functions["nodes"]:
        colour = "red" if node["name"] in red_nodes else "black"
        dot.node(ids[node["name"]], f"{node['name']}\\ncalls {node['calls']}, cost {node['cost']:.3f}",
                 shape="box" if node["native"] else "ellipse", color=colour, fontcolor=colour)
    for edge in functions["edges"]:
        key = (edge["caller"], edge["callee"])
        colour = "red" if key in red_edges else "black"
        dot.edge(ids[edge["caller"]], ids[edge["callee"]], label=str(edge["count"]), color=colour,
                 fontcolor=colour, penwidth="2.5" if colour == "red" else "1")
    return dot
