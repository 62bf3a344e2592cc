"""tools/fast_editable.py: the editable import hook make install puts in place of setuptools'.

Oracle: a fresh interpreter started without site (-S) that processes only the test's own
site directory (site.addsitedir) must import the mapped packages from the mapped
directories, and must not have imported pathlib to do it (the reason the tool exists)."""
import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "fast_editable.py")


def _setuptools_like_install(site, mapping):
    """What setuptools' editable install writes: a finder module and the .pth importing it."""
    os.makedirs(site)
    with open(os.path.join(site, "__editable___seedance_9_9_9_finder.py"), "w") as handle:
        handle.write(f"MAPPING = {mapping!r}\nNAMESPACES = {{}}\n"
                     "import pathlib\n"  # the real one imports it: the tool must not need it at start
                     "def install():\n    raise SystemExit('setuptools hook used')\n")
    with open(os.path.join(site, "__editable__.seedance-9.9.9.pth"), "w") as handle:
        handle.write("import __editable___seedance_9_9_9_finder; __editable___seedance_9_9_9_finder.install()\n")


def _probe(site, modules):
    code = textwrap.dedent(f"""
        import json, site, sys
        site.addsitedir({site!r})
        out = {{"pathlib_at_start": "pathlib" in sys.modules}}
        for name in {modules!r}:
            module = __import__(name, fromlist=["_"])
            out[name] = module.__file__
        print(json.dumps(out))
    """)
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                          errors="replace", timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_hook_maps_packages_without_pathlib(tmp_path):
    pkg = tmp_path / "src" / "agentdir"
    sub = tmp_path / "src" / "shimdir"
    for directory in (pkg, sub):
        directory.mkdir(parents=True)
        (directory / "__init__.py").write_text("")
    (pkg / "leaf.py").write_text("VALUE = 1\n")
    site = str(tmp_path / "site")
    _setuptools_like_install(site, {"fakeseed": str(pkg), "fakeseed.shim": str(sub)})
    done = subprocess.run([sys.executable, TOOL, "--site", site], capture_output=True, text=True,
                          errors="replace", timeout=60)
    assert done.returncode == 0, done.stderr
    assert "2 import names" in done.stdout, done.stdout
    seen = _probe(site, ["fakeseed", "fakeseed.leaf", "fakeseed.shim"])
    assert seen["pathlib_at_start"] is False
    assert seen["fakeseed"] == str(pkg / "__init__.py")
    assert seen["fakeseed.leaf"] == str(pkg / "leaf.py")  # submodules through the package's path
    assert seen["fakeseed.shim"] == str(sub / "__init__.py")  # a nested name mapped elsewhere


def test_namespace_installs_are_left_to_setuptools(tmp_path):
    site = tmp_path / "site"
    _setuptools_like_install(str(site), {"fakeseed": str(tmp_path)})
    finder = site / "__editable___seedance_9_9_9_finder.py"
    finder.write_text(finder.read_text().replace("NAMESPACES = {}", "NAMESPACES = {'fakeseed.ns': []}"))
    pth = (site / "__editable__.seedance-9.9.9.pth").read_text()
    done = subprocess.run([sys.executable, TOOL, "--site", str(site)], capture_output=True, text=True,
                          errors="replace", timeout=60)
    assert done.returncode == 0, done.stderr
    assert (site / "__editable__.seedance-9.9.9.pth").read_text() == pth
    assert not (site / "__seedance_editable.py").exists()


def test_the_hook_is_written_with_its_bytecode_even_when_python_writes_none(tmp_path):
    """Every interpreter start of the venv imports the hook: run again (make install does, on
    every change), the tool rewrites it, and with PYTHONDONTWRITEBYTECODE=1 (as on these
    machines) a stale .pyc would have it compiled at every start.  The .pyc the import
    system finds must match the new source."""
    import importlib.util

    site = str(tmp_path / "site")
    _setuptools_like_install(site, {"fakeseed": str(tmp_path)})
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    for _ in range(2):
        done = subprocess.run([sys.executable, TOOL, "--site", site], capture_output=True, text=True,
                              errors="replace", timeout=60, env=env)
        assert done.returncode == 0, done.stderr
    source = os.path.join(site, "__seedance_editable.py")
    cached = importlib.util.cache_from_source(source)
    assert os.path.exists(cached)
    with open(cached, "rb") as handle:
        header = handle.read(16)
    st = os.stat(source)
    # the pyc's header: flags 0 (timestamp-based), then the source's mtime and size
    assert int.from_bytes(header[4:8], "little") == 0
    assert int.from_bytes(header[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
    assert int.from_bytes(header[12:16], "little") == st.st_size & 0xFFFFFFFF
