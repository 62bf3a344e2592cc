"""Pictures and trees of a closure or of a modelled process: graphviz and text.

Only renders: it takes a ProcessModel (seedance.resolve.process) or a Closure and returns
text or bytes; command modules write them through seedance.render.output.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import zlib

# how an edge resolved -> graphviz colour (the legend is drawn with the graph)
EDGE_COLOURS = {
    "rpath": "darkgreen", "runpath": "blue", "ld_library_path": "orange", "ld.so.cache": "gray40",
    "default": "gray60", "direct": "black", "loaded": "purple", "not-found": "red",
}
FAIL_COLOUR = "red"


# libtree's exclude_list (libtree.c): the C and C++ runtimes and the loader, which nearly every
# object needs.  Its default tree leaves them out, matched on the soname with its version
# digits and dots stripped from the right, as is_in_exclude_list() does.
LIBTREE_FOLDED = ("ld-linux-aarch64.so", "ld-linux-armhf.so", "ld-linux-x86-64.so", "ld-linux.so", "ld64.so",
                  "libc.musl-aarch64.so", "libc.musl-armhf.so", "libc.musl-i386.so", "libc.musl-x86_64.so",
                  "libc.so", "libdl.so", "libgcc_s.so", "libm.so", "libstdc++.so")


def folded(name: str) -> bool:
    """A NEEDED name libtree's default tree does not show (LIBTREE_FOLDED)."""
    return name.rstrip("0123456789.").startswith(LIBTREE_FOLDED) if name.rstrip("0123456789.") else False


def tree_text(closure, show_loaded: bool = True, verbose: bool = True) -> str:
    """libtree's shape: each object expanded once, under the requester that first loaded it,
    with the reason per edge; a NEEDED satisfied by an object already listed is shown once
    more and not expanded again, as libtree does ('already loaded').  Not VERBOSE: libtree's
    default, the runtimes of LIBTREE_FOLDED left out (with what only they need), and a
    repeated object by its name alone."""
    by_requester: dict = {}
    for res in closure.resolutions:
        by_requester.setdefault(res.requester, []).append(res)
    lines = [closure.root]
    seen = {closure.root}
    # the reason shown is how the object was found when ld.so first mapped it (breadth
    # first), even where the depth-first tree meets it first under another requester
    first_source = {path: res.source for _name, path, res in closure.load_order
                    if path is not None and res is not None}
    if closure.interpreter:
        first_source[closure.interpreter] = "interpreter"

    def walk(path: str, prefix: str) -> None:
        children = [res for res in by_requester.get(path, []) if verbose or not folded(res.name)]
        for index, res in enumerate(children):
            last = index == len(children) - 1
            branch = "└── " if last else "├── "
            if res.path is None:
                lines.append(f"{prefix}{branch}{res.name} not found")
                continue
            if res.path in seen:
                if show_loaded:
                    lines.append(f"{prefix}{branch}{res.name} [already loaded: {res.path}]" if verbose
                                 else f"{prefix}{branch}{res.name} [already loaded]")
                continue
            seen.add(res.path)
            lines.append(f"{prefix}{branch}{res.name} => {res.path} [{first_source.get(res.path, res.source)}]")
            walk(res.path, prefix + ("    " if last else "│   "))

    walk(closure.root, "")
    return "\n".join(lines) + "\n"


def _edges(model):
    for step in model.steps:
        for edge in step.edges:
            yield step, edge


def to_dot(model, findings=()) -> str:
    """DOT source: nodes are objects, edges NEEDED coloured by how they resolved; a
    shadowed or failing edge is red and labelled with its finding."""
    red: dict = {}  # (requester, target) -> label
    for step in model.steps:
        for shadow in step.shadowed:
            what = ("undefined symbol: " + ", ".join(s for s, _v in shadow.missing)) if shadow.missing \
                else "binds to another copy"
            red[(shadow.requester, shadow.used)] = f"soname-shadowed: {shadow.name} ({what})"
    for finding in findings:  # a rule may name more than the model marks
        ev = getattr(finding, "evidence", {}) or {}
        if finding.rule == "soname-shadowed" and ev.get("used"):
            red.setdefault((finding.subject.get("path"), ev["used"]), f"{finding.rule}")
    lines = ["digraph closure {", '  rankdir=LR; node [shape=box, fontname="monospace", fontsize=10];',
             '  edge [fontname="monospace", fontsize=9];']
    nodes: dict = {}

    def node(path: str | None, name: str) -> str:
        key = path or f"missing:{name}"
        if key not in nodes:
            # the node id is the path itself: an SVG's <title> then names the object, and an
            # edge's title names both ends (tests read them)
            nodes[key] = f'"{_q(key)}"'
            label = f"{os.path.basename(path)}\n{_short_dir(path)}" if path else f"{name} (not found)"
            tip = path or name
            colour = ', color="red"' if path is None else ""
            lines.append(f'  {nodes[key]} [label="{_q(label)}", tooltip="{_q(tip)}"{colour}];')
        return nodes[key]

    drawn = set()
    for step in model.steps:
        if step.load.kind != "exec" and step.new_objects:
            root = node(step.new_objects[0], step.load.target)
            label = step.load.module or step.load.target
            if not step.ok:
                label += ": " + (step.error.split(": ", 1)[-1] if step.unbound else step.error)
            colour = FAIL_COLOUR if not step.ok else "black"
            lines.append(f'  {root} [peripheries=2, color="{colour}", xlabel="{_q(label)}"];')
    for step, edge in _edges(model):
        key = (edge.requester, edge.path, edge.name)
        if key in drawn:
            continue
        drawn.add(key)
        a = node(edge.requester, edge.requester)
        b = node(edge.path, edge.name)
        label = red.get((edge.requester, edge.path))
        if label is None and edge.path is None:
            label = f"{edge.name}: cannot open shared object file"
        if label is not None:
            lines.append(f'  {a} -> {b} [color="{FAIL_COLOUR}", fontcolor="{FAIL_COLOUR}", penwidth=2.5, '
                         f'label="{_q(label)}", class="finding"];')
        else:
            colour = EDGE_COLOURS.get(edge.source, "black")
            lines.append(f'  {a} -> {b} [color="{colour}", tooltip="{_q(edge.source)}"];')
    for step in model.steps:
        for shadow in step.shadowed:
            a, b = node(shadow.requester, shadow.requester), node(shadow.alone, shadow.name)
            lines.append(f'  {a} -> {b} [style=dashed, color="gray50", fontcolor="gray50", '
                         f'label="would load alone", class="alone"];')
    legend = " | ".join(f"{k}: {v}" for k, v in EDGE_COLOURS.items())
    lines.append(f'  labelloc=b; label="edges by how they resolved: {_q(legend)}; red: finding";')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _short_dir(path: str) -> str:
    """The last two directories: two copies of one SONAME differ there (a/libs, b/libs)."""
    parts = os.path.dirname(path).strip("/").split("/")
    return "/".join(parts[-2:])


def _q(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(dot_source: str, fmt: str, marker: str = "seedance check --graph"):
    """(bytes, None) from graphviz's dot, marked as our output; (None, why) when dot is
    missing, so the caller falls back to text."""
    dot = shutil.which("dot")
    if dot is None:
        return None, "graphviz's `dot` is not installed: showing the closure as a text tree"
    proc = subprocess.run([dot, f"-T{fmt}"], input=dot_source.encode(), capture_output=True, timeout=120)
    if proc.returncode != 0:
        return None, "dot failed: " + proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:][0] \
            if proc.stderr else "dot failed"
    data = proc.stdout
    if fmt == "svg":
        # the marker seedance.render.output recognises, so a rerun may replace the picture
        data = data.replace(b"<svg ", f"<!-- {marker} -->\n<svg ".encode(), 1)
    elif fmt == "png":
        data = _png_with_software(data, marker)
    return data, None


def _png_with_software(png: bytes, marker: str) -> bytes:
    """Insert a tEXt 'Software' chunk right after IHDR (seedance.render.output's PNG marker)."""
    payload = b"Software\x00" + marker.encode()
    chunk = len(payload).to_bytes(4, "big") + b"tEXt" + payload + \
        zlib.crc32(b"tEXt" + payload).to_bytes(4, "big")
    ihdr_end = 8 + 4 + 4 + 13 + 4
    return png[:ihdr_end] + chunk + png[ihdr_end:]


def model_tree_text(model) -> str:
    """The text fallback for --graph: each load and the tree of what it added."""
    out = []
    for step in model.steps:
        head = step.load.module or step.load.target
        verdict = "ok" if step.ok else f"FAILS: {step.error}"
        out.append(f"{step.load.kind} {head}: {verdict}")
        for edge in step.edges:
            mark = ""
            for shadow in step.shadowed:
                if shadow.requester == edge.requester and shadow.name == edge.name:
                    mark = f"  <- soname-shadowed (alone: {shadow.alone}; loaded by {shadow.loaded_by})"
            out.append(f"  {edge.requester} -> {edge.name} => {edge.path or 'not found'} [{edge.source}]{mark}")
    return "\n".join(out) + "\n"
