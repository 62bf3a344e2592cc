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
        ours = run_cli("ldd", "--tree", path)
        assert ours.returncode == 0, ours.stderr
        theirs = subprocess.run(["libtree", "-p", "-vv", path], capture_output=True, timeout=60)
        if _objects(ours.stdout, False) != _objects(theirs.stdout.decode("utf-8", "surrogateescape"), True):
            differ.append(path)
    assert differ == []


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
