"""seedance ldd --tree against libtree (the peer it mimics): the same objects, on a spread
sample of real system libraries, plus a gcc-built RPATH/RUNPATH fixture where the reason
per edge is checked against LD_DEBUG=libs of the real loader."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import process_fixtures as F  # noqa: E402

LIBDIR = "/usr/lib/x86_64-linux-gnu"


def _objects(text: str, libtree: bool) -> set:
    out = set()
    for line in text.splitlines()[1:]:
        body = line.lstrip("│├└─ ")
        if libtree:
            body = body.split(" [", 1)[0].strip()
            if body.startswith("/"):
                out.add(os.path.realpath(body))
        elif " => " in body:
            out.add(os.path.realpath(body.split(" => ", 1)[1].split(" [", 1)[0]))
    return out


def _sample(count: int) -> list:
    files = []
    for name in sorted(os.listdir(LIBDIR)):
        path = os.path.join(LIBDIR, name)
        if ".so" in name and os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as handle:
                if handle.read(4) == b"\x7fELF":
                    files.append(path)
    step = max(1, len(files) // count)
    return files[::step][:count]


@pytest.mark.skipif(not shutil.which("libtree"), reason="libtree is not installed")
def test_tree_shows_the_same_objects_as_libtree():
    from tests.conftest import run_cli
    differ = []
    for path in _sample(15):
        ours = run_cli("ldd", "--tree", "-v", path)        # every library, as libtree -vv
        assert ours.returncode == 0, ours.stderr
        theirs = subprocess.run(["libtree", "-p", "-vv", path], capture_output=True, timeout=60)
        if _objects(ours.stdout, False) != _objects(theirs.stdout.decode("utf-8", "surrogateescape"), True):
            differ.append(path)
    assert differ == []


def _edges(text: str, libtree: bool):
    """(parent, child) pairs of a printed tree, by real path, and the objects shown.  The depth
    is the prefix's width: four columns a level in both trees.  A line of ours repeating an
    object names it only: its path is the one it was first listed with."""
    edges, path_of = set(), {}
    lines = text.splitlines()
    root = os.path.realpath(lines[0].strip())
    stack = [root]
    for line in lines[1:]:
        body = line.lstrip("│├└─ ")
        depth = (len(line) - len(body)) // 4
        if libtree:
            name = body.split(" [", 1)[0].strip()
            path = os.path.realpath(name) if name.startswith("/") else f"missing:{name.split()[0]}"
        elif " => " in body:
            name, rest = body.split(" => ", 1)
            path = os.path.realpath(rest.split(" [", 1)[0])
            path_of.setdefault(name, path)
        else:
            name = body.split(" [", 1)[0].split(" not found", 1)[0].strip()
            path = path_of.get(name, f"missing:{name}")
        del stack[depth:]
        parent = stack[-1]
        edges.add((parent, path))
        stack.append(path)
    return edges, {node for _parent, node in edges}


def _expansions(text: str) -> dict:
    """object line -> how many of its lines have children (a deeper line right after)."""
    lines = text.splitlines()[1:]
    counts: dict = {}
    for here, after in zip(lines, lines[1:] + [""]):
        body = here.lstrip("│├└─ ")
        deeper = len(after) - len(after.lstrip("│├└─ ")) > len(here) - len(body)
        key = body.split(" => ", 1)[0].split(" [", 1)[0].strip()
        counts[key] = counts.get(key, 0) + deeper
    return counts


@pytest.mark.skipif(not shutil.which("libtree"), reason="libtree is not installed")
def test_default_tree_is_libtrees_default():
    """`ldd --tree` draws what `libtree` draws by default: the same parent -> child edges (so
    the same libraries, each expanded once, the rest repeated as leaves) with libc, libm,
    libdl, libstdc++, libgcc_s and the loader left out; the sibling order is libtree's own
    (it searches all NEEDED entries a step at a time), so edges are compared as sets."""
    from tests.conftest import run_cli
    from seedance.render.graph import folded

    differ = []
    samples = [p for p in ("/usr/bin/curl", sys.executable, "/usr/bin/gpg") if os.path.exists(p)] + _sample(8)
    for path in samples:
        ours = run_cli("ldd", "--tree", path)
        assert ours.returncode == 0, ours.stderr
        theirs = subprocess.run(["libtree", "-p", path], capture_output=True, timeout=60)
        theirs_text = theirs.stdout.decode("utf-8", errors="replace")
        our_edges, our_nodes = _edges(ours.stdout, False)
        their_edges, their_nodes = _edges(theirs_text, True)
        if our_edges != their_edges:
            differ.append((path, sorted(our_edges ^ their_edges)[:6]))
        assert not any(folded(os.path.basename(node)) for node in our_nodes), ours.stdout
        assert all(count <= 1 for count in _expansions(ours.stdout).values()), ours.stdout
        assert len(ours.stdout.splitlines()) == len(theirs_text.splitlines()), (path, ours.stdout, theirs_text)
    assert differ == []
    # -v: every library, the C runtime and its loader too
    full = run_cli("ldd", "--tree", "-v", "/usr/bin/curl" if os.path.exists("/usr/bin/curl") else sys.executable)
    assert "libc.so.6 => " in full.stdout and "[already loaded: /" in full.stdout


def test_tree_reason_per_edge_matches_the_loader(tmp_path):
    """rpath, runpath and ld.so.cache, each checked against LD_DEBUG=libs of a real run."""
    from tests.conftest import run_cli
    root = str(tmp_path)
    F.shared_lib(os.path.join(root, "r", "libr.so"), "int r(void){return 1;}\n", soname="libr.so")
    F.shared_lib(os.path.join(root, "n", "libn.so"), "int n(void){return 1;}\n", soname="libn.so")
    top = F.shared_lib(os.path.join(root, "libtop.so"), "int r(void);\nint top(void){return r();}\n",
                       soname="libtop.so", links=(f"-L{root}/r", "-l:libr.so", "-lz"), rpath="$ORIGIN/r",
                       extra=("-Wl,--no-as-needed",))
    mid = F.shared_lib(os.path.join(root, "libmid.so"), "int n(void);\nint mid(void){return n();}\n",
                       soname="libmid.so", links=(f"-L{root}/n", "-l:libn.so"),
                       extra=("-Wl,--enable-new-dtags", f"-Wl,-rpath,{root}/n"))
    prog = os.path.join(root, "prog")
    with open(prog + ".c", "w") as handle:
        handle.write("int top(void); int mid(void);\nint main(void){return top() + mid() - 2;}\n")
    F.gcc("-o", prog, prog + ".c", f"-L{root}", "-l:libtop.so", "-l:libmid.so", "-Wl,--disable-new-dtags",
          f"-Wl,-rpath,{root}")
    tree = run_cli("ldd", "--tree", prog)
    assert tree.returncode == 0, tree.stderr
    reasons = {}
    for line in tree.stdout.splitlines()[1:]:
        body = line.lstrip("│├└─ ")
        if " => " in body:
            name = body.split(" => ", 1)[0]
            reasons[name] = body.rsplit("[", 1)[1].rstrip("]")
    debug = subprocess.run([prog], env={"LD_DEBUG": "libs"}, capture_output=True, text=True, errors="replace")
    assert debug.returncode == 0
    # LD_DEBUG=libs prints, per name, "find library=NAME", then each step it searches
    # ("search path=... (RPATH from file X)", "(RUNPATH ...)", "search cache=...") and the
    # "trying file=" candidates: the step of the first candidate that exists is the reason
    found = {}
    current = None
    step = None
    for line in debug.stderr.splitlines():
        text = line.split(":", 1)[1].strip() if ":" in line else line
        if text.startswith("find library="):
            current, step = text.split("=", 1)[1].split(" ", 1)[0], None
        elif text.startswith("search path="):
            step = "rpath" if "(RPATH" in text else "runpath" if "(RUNPATH" in text else "?"
        elif text.startswith("search cache="):
            step = "ld.so.cache"
        elif text.startswith("trying file=") and current and current not in found:
            candidate = text.split("=", 1)[1]
            if os.path.exists(candidate):
                found[current] = step
    for name in ("libtop.so", "libmid.so", "libr.so", "libn.so", "libz.so.1"):
        assert reasons[name] == found[name], (name, reasons, found)
