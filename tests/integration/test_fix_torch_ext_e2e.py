"""seedance fix torch-ext against the real CPU torch in .venv and a real C++ extension.

The stale build is what an upgrade leaves behind: a cached build of `tiny_ext` whose
build.ninja compiled against another torch (a torch tree whose version.py says 2.1.0).  The
fixer moves it into the journal and rebuilds tiny_ext with torch.utils.cpp_extension for
the torch installed now.  That rebuild is the one real extension compile of the suite
(~30-60 s); it runs once, in a session-scoped fixture under tmp, and the tests read its outcome.
"""
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli

torch_spec = pytest.importorskip("importlib.util").find_spec("torch")
pytestmark = pytest.mark.skipif(torch_spec is None, reason="torch is not installed")

SOURCE = """\
#include <torch/extension.h>
torch::Tensor twice(torch::Tensor x) { return x * 2; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice", &twice, "x * 2"); }
"""

NINJA = """\
ninja_required_version = 1.3
cxx = c++

cflags = -DTORCH_EXTENSION_NAME={name} -DTORCH_API_INCLUDE_EXTENSION_H -isystem {torch}/include -isystem {torch}/include/torch/csrc/api/include -isystem {pyinc} -fPIC -std=c++17 -O2
post_cflags =
ldflags = -shared -L{torch}/lib -lc10 -ltorch_cpu -ltorch -ltorch_python

rule compile
  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags
  depfile = $out.d
  deps = gcc

rule link
  command = $cxx $in $ldflags -o $out

build tiny.o: compile {source}

build {name}.so: link tiny.o

default {name}.so
"""


def tree_digest(path: Path) -> str:
    digest = hashlib.sha256()
    for item in sorted(path.rglob("*")):
        digest.update(str(item.relative_to(path)).encode())
        if item.is_file():
            digest.update(item.read_bytes())
    return digest.hexdigest()


def make_stale(root: Path, name: str, source: Path, old_torch: Path) -> Path:
    build = root / name
    build.mkdir(parents=True)
    import sysconfig
    (build / "build.ninja").write_text(NINJA.format(name=name, torch=old_torch, source=source,
                                                     pyinc=sysconfig.get_paths()["include"]))
    return build


@pytest.fixture(scope="session")
def rebuilt(tmp_path_factory):
    d = tmp_path_factory.mktemp("torchext")
    source = d / "src" / "tiny.cpp"
    source.parent.mkdir()
    source.write_text(SOURCE)
    old_torch = d / "old-site" / "torch"
    (old_torch / "include").mkdir(parents=True)
    (old_torch / "version.py").write_text("__version__ = '2.1.0+cpu'\ncuda = None\n")
    cache = d / "torch_extensions"
    stale = make_stale(cache, "tiny_ext", source, old_torch)
    env = {"TORCH_EXTENSIONS_DIR": str(cache), "XDG_STATE_HOME": str(d / "state"), "HOME": str(d / "home")}
    stale_digest = tree_digest(stale)
    before = run_cli("fix", "torch-ext", "--clean-cache", "--rebuild", "tiny_ext", "--dry-run", env=env)
    proc = run_cli("fix", "torch-ext", "--clean-cache", "--rebuild", "tiny_ext", env=env, timeout=900)
    return {"dir": d, "cache": cache, "env": env, "proc": proc, "dry": before, "stale_digest": stale_digest}


def test_dry_run_names_the_stale_build_and_changes_nothing(rebuilt):
    dry = rebuilt["dry"]
    assert dry.returncode == 0, dry.stderr
    assert "torch: built against 2.1.0+cpu, loaded by 2.13.0" in dry.stdout
    assert "would rebuild tiny_ext" in dry.stdout


def test_stale_build_is_moved_and_rebuilt_for_the_current_torch(rebuilt):
    proc = rebuilt["proc"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rebuilt tiny_ext for torch 2.13.0" in proc.stdout
    assert "TORCH_CUDA_ARCH_LIST none (CPU-only torch or no GPU)" in proc.stdout
    assert "check again: 1 of 1 stale build(s) gone, 0 remaining" in proc.stdout
    built = rebuilt["cache"] / "tiny_ext" / "tiny_ext.so"
    assert built.is_file()
    # the new build loads with the current torch and works
    code = ("import sys, importlib.util, torch; spec = importlib.util.spec_from_file_location('tiny_ext', sys.argv[1]);"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); print(m.twice(torch.ones(3)).tolist())")
    run = subprocess.run([sys.executable, "-c", code, str(built)], capture_output=True, text=True, timeout=300)
    assert run.stdout.strip() == "[2.0, 2.0, 2.0]", run.stderr
    # the check's collector and rules see a fresh build now
    from seedance.fix.torchext import check_caches
    findings, facts = check_caches([str(rebuilt["cache"])])
    assert findings == [] and [f.data["name"] for f in facts] == ["tiny_ext"]


def test_history_then_undo_restores_the_stale_build_exactly(rebuilt):
    env = rebuilt["env"]
    proc = run_cli("fix", "history", "--json", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    history = json.loads(proc.stdout)
    [entry] = [e for e in history if e["command"] == "fix torch-ext"]
    assert [f["action"] for f in entry["files"]] == ["move", "create-dir"]
    undo = run_cli("fix", "undo", entry["id"], env=env)
    assert undo.returncode == 0, undo.stderr
    assert tree_digest(rebuilt["cache"] / "tiny_ext") == rebuilt["stale_digest"]
    # and the fresh build was kept in the journal, not deleted
    state = Path(env["XDG_STATE_HOME"]) / "seedance" / "journal" / entry["id"] / "files"
    assert (state / "1" / "tiny_ext.so").is_file()


def test_unknown_rebuild_name_is_refused_before_anything_moves(tmp_path):
    source = tmp_path / "tiny.cpp"
    source.write_text(SOURCE)
    old_torch = tmp_path / "old" / "torch"
    (old_torch / "include").mkdir(parents=True)
    (old_torch / "version.py").write_text("__version__ = '1.13.1'\n")
    cache = tmp_path / "cache"
    stale = make_stale(cache, "other_ext", source, old_torch)
    env = {"TORCH_EXTENSIONS_DIR": str(cache), "XDG_STATE_HOME": str(tmp_path / "state"), "HOME": str(tmp_path)}
    proc = run_cli("fix", "torch-ext", "--clean-cache", "--rebuild", "no_such_ext", env=env)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "no stale extension build of that name (stale: other_ext)" in proc.stderr
    assert stale.is_dir()
    # --clean-cache alone moves it; undo brings it back
    proc = run_cli("fix", "torch-ext", "--clean-cache", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not stale.exists()
    assert run_cli("fix", "undo", env=env).returncode == 0
    assert (stale / "build.ninja").is_file()


def test_torch_ext_needs_an_action():
    proc = run_cli("fix", "torch-ext")
    assert proc.returncode == 2 and "--clean-cache" in proc.stderr
