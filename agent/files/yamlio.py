"""The one bounded YAML loader: every YAML file seedance reads goes through here.

Why: YAML is a graph, not a tree.  A 340-byte file of nine lines, each a
list of nine aliases of the line before, is 9**9 = 387 million nodes to anything that walks
it (the config collector, a JSON dump, a schema check): an unbounded `check` hangs while
its memory grows past a gigabyte.  And YAML nested thousands deep makes the recursive
composers raise RecursionError tracebacks.  libyaml stops at 1000 levels (yaml/_yaml.pyx:
"exceeded maximum nesting depth"), the pure-Python parsers of PyYAML and ruamel.yaml never
do.

So before any composer or constructor sees a document, its event stream (the parsers are
iterative state machines: they never recurse, whatever the nesting) is walked once with
three caps: input size, nesting depth, and nodes *as expanded* (an alias counts the size
of the node it names, an alias inside the node it names is refused).  Each breach is one
BadInput line naming the file and the line.  The ruamel.yaml round-trip editors (fix
env-leak, fix handle-leak, plugin manifests) run the same walk over ruamel's own events
before ruamel parses, so both libraries accept exactly what the caps allow.
"""
from __future__ import annotations

from ..model.errors import BadInput

MAX_BYTES = 4 << 20     # seedance's YAML files are rules, configs and manifests: kilobytes
MAX_DEPTH = 64          # the deepest real file (rules/plugins.yaml) nests 6 levels
MAX_NODES = 100_000     # expanded; rules/*.yaml together are ~3,000

_OPEN = ("SequenceStartEvent", "MappingStartEvent")
_CLOSE = ("SequenceEndEvent", "MappingEndEvent")


def read_text(path, limit: int = MAX_BYTES) -> str:
    """The file's text, at most ``limit`` bytes of UTF-8; OSError is the caller's to word."""
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise BadInput(f"{path}: larger than {_size(limit)}; refusing to read it as YAML")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path}: not UTF-8 text (byte {exc.start})") from None


def check_events(events, where: str) -> None:
    """Walk a parser's events; BadInput when depth or expanded size passes the caps.

    Parser errors (yaml.YAMLError, ruamel's YAMLError) pass through unchanged: the caller
    already words them, and the real load would raise the same one at the same place.
    """
    stack: list = []     # per open collection: [anchor, expanded size, height of children]
    anchors: dict = {}   # anchor -> (expanded size, height)
    total = 0
    for event in events:
        kind = type(event).__name__
        if kind in _OPEN:
            if len(stack) >= MAX_DEPTH:
                raise BadInput(f"{where}:{_line(event)} YAML nested deeper than {MAX_DEPTH} levels; "
                               f"refusing it")
            stack.append([event.anchor, 1, 0])
            if event.anchor:
                anchors[event.anchor] = None  # open: an alias to it now would be a cycle
            grown, size, height = 1, None, None
        elif kind in _CLOSE:
            anchor, size, children = stack.pop()
            height = children + 1
            if anchor:
                anchors[anchor] = (size, height)
            grown = 0  # its nodes were counted as they came
        elif kind == "ScalarEvent":
            grown, size, height = 1, 1, 1
            if event.anchor:
                anchors[event.anchor] = (1, 1)
        elif kind == "AliasEvent":
            named = anchors.get(event.anchor, (1, 1))  # undefined: the composer words it
            if named is None:
                raise BadInput(f"{where}:{_line(event)} YAML alias *{event.anchor} refers to a node "
                               f"that contains it; refusing it")
            size, height = named
            grown = size
            if len(stack) + height > MAX_DEPTH:
                raise BadInput(f"{where}:{_line(event)} YAML nested deeper than {MAX_DEPTH} levels "
                               f"once alias *{event.anchor} is expanded; refusing it")
        else:
            if kind == "DocumentStartEvent":
                anchors.clear()  # anchors are local to a document (YAML 1.2, 3.2.2.2)
            continue
        total += grown
        if total > MAX_NODES:
            raise BadInput(f"{where}:{_line(event)} YAML expands to more than {MAX_NODES:,} nodes "
                           f"(aliases counted as what they name); refusing it")
        if stack and size is not None:
            stack[-1][1] += size
            stack[-1][2] = max(stack[-1][2], height)


def check(text: str, where: str) -> None:
    """The caps, checked with PyYAML's parser (libyaml's when present)."""
    import yaml

    if len(text) > MAX_BYTES:
        raise BadInput(f"{where}: larger than {_size(MAX_BYTES)}; refusing to read it as YAML")
    try:
        check_events(yaml.parse(text, Loader=_loader()), where)
    except yaml.YAMLError as exc:
        if "maximum nesting depth" in str(exc):  # libyaml's own cap (1000) met before ours
            raise BadInput(f"{where}:{_mark_line(exc)} YAML nested deeper than {MAX_DEPTH} levels; "
                           f"refusing it") from None
        raise


def load(text: str, where: str):
    """yaml.safe_load within the caps.  Raises BadInput, or yaml.YAMLError for bad syntax."""
    import yaml

    check(text, where)
    return yaml.load(text, Loader=_loader())


def load_file(path):
    """load(read_text(path)): BadInput, yaml.YAMLError or OSError."""
    return load(read_text(path), str(path))


def compose(text: str, where: str):
    """yaml.compose (nodes with line marks) within the caps."""
    import yaml

    check(text, where)
    return yaml.compose(text, Loader=_loader())


def roundtrip_load(yaml_rt, text: str, where: str):
    """ruamel.yaml round-trip load within the caps, checked on ruamel's own events (its
    parser is the one whose grammar applies); ruamel's YAMLError passes through."""
    import yaml

    if len(text) > MAX_BYTES:
        raise BadInput(f"{where}: larger than {_size(MAX_BYTES)}; refusing to read it as YAML")
    # libyaml first: ruamel's scanner re-checks every pending simple key on every token, so
    # deep flow nesting ('[' * 1000) costs it seconds before its first event; libyaml's
    # walk (C) stops such a file in microseconds.  Where the two grammars differ, libyaml's
    # syntax errors are left to ruamel, whose events are walked next in any case.
    try:
        check(text.decode("utf-8") if isinstance(text, bytes) else text, where)
    except (yaml.YAMLError, UnicodeDecodeError):
        pass
    check_events(yaml_rt.parse(text), where)
    return yaml_rt.load(text)


def _loader():
    import yaml

    # libyaml's loader when present: ~6x faster than the pure-Python one
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _line(event) -> str:
    mark = getattr(event, "start_mark", None)
    return f" line {mark.line + 1}:" if mark is not None else ""


def _mark_line(exc) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f" line {mark.line + 1}:" if mark is not None else ""


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"
