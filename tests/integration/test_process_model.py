"""Issue 12 acceptance: real conflicts inside one Python process, built with gcc, imported
for real, and predicted by seedance without importing anything.

Every oracle is the real interpreter: `python -c 'import ...'` (its exit status and the
ImportError line it prints) and glibc's LD_DEBUG=files trace of what it mapped."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import process_fixtures as F  # noqa: E402

from seedance.collect.python_env import ask_interpreter, observe, predict_imports  # noqa: E402

PYTHON = sys.executable
SITE_PACKAGES = __import__("sysconfig").get_paths()["purelib"]


def _env(site):
    env = dict(os.environ, PYTHONPATH=site)
    env.pop("LD_LIBRARY_PATH", None)
    env.pop("LD_PRELOAD", None)
    return env


def _predict(site, names):
    interp = ask_interpreter(PYTHON, env=_env(site))
    return predict_imports(interp, names)


def _real(site, names):
    proc = F.run_python(site, "import " + ", ".join(names), PYTHON)
    last = proc.stderr.decode("utf-8", "replace").strip().splitlines()
    return proc.returncode == 0, (last[-1] if last and proc.returncode else None)


def _agree(site, names):
    """The prediction against reality: verdict, the exact line Python prints, and the
    objects ld.so mapped in order (LD_DEBUG=files)."""
    prediction = _predict(site, names)
    real_ok, real_line = _real(site, names)
    assert (prediction.ok, prediction.error) == (real_ok, real_line)
    seen = observe(PYTHON, "import " + ", ".join(names), env=_env(site))
    assert prediction.loaded_names() == [name for name, _who in seen.loaded]
    return prediction


@pytest.fixture(scope="module")
def libfoo_site(tmp_path_factory):
    site = str(tmp_path_factory.mktemp("libfoo-site"))
    F.libfoo_pair(site)
    return site


def test_libfoo_pair_import_a_b_fails_as_predicted(libfoo_site):
    prediction = _agree(libfoo_site, ["a", "b"])
    assert not prediction.ok
    assert prediction.error.endswith("undefined symbol: foo_b")  # what Python really printed, checked above
    assert prediction.working_order == ("b", "a")


def test_libfoo_pair_import_b_a_works_as_predicted(libfoo_site):
    prediction = _agree(libfoo_site, ["b", "a"])
    assert prediction.ok
    shadow = [s for step in prediction.model.steps for s in step.shadowed]
    assert [(s.requester.split(os.sep)[-2], s.used.split(os.sep)[-3], s.alone.split(os.sep)[-3]) for s in shadow] \
        == [("a", "b", "a")]
    assert shadow[0].other_copy and shadow[0].other_copy[0][0] == "foo_a"


def test_check_imports_cli_names_module_copy_symbol_and_order(libfoo_site, tmp_path):
    from tests.conftest import run_cli
    report = tmp_path / "r.json"
    proc = run_cli("check", "--python", PYTHON, "--imports", "a,b", "--report-json", str(report),
                   env=_env(libfoo_site))
    assert proc.returncode == 1, proc.stderr
    import json
    findings = json.loads(report.read_text())["findings"]
    shadowed = [f for f in findings if f["rule"] == "soname-shadowed"]
    assert len(shadowed) == 1 and shadowed[0]["severity"] == "error"
    ev = shadowed[0]["evidence"]
    assert ev["module"] == "b._ext" and ev["importer"] == "b" and ev["loaded_by"] == "a._ext"
    assert ev["missing"] == "foo_b"
    assert ev["used"] == os.path.join(libfoo_site, "a", "libs", "libfoo.so.1")
    assert ev["alone"] == os.path.join(libfoo_site, "b", "libs", "libfoo.so.1")
    assert ev["order_hint"] == "import order that works: b, a"
    real_ok, real_line = _real(libfoo_site, ["a", "b"])
    assert ev["error"] == real_line.removeprefix("ImportError: ")
    ok = run_cli("check", "--python", PYTHON, "--imports", "b,a", env=_env(libfoo_site))
    assert ok.returncode == 0 and "soname-shadowed" in ok.stdout  # a warning: a's foo_a binds to b's copy


def test_observe_says_it_executed_code(libfoo_site):
    from tests.conftest import run_cli
    proc = run_cli("check", "--python", PYTHON, "--imports", "a,b", "--observe", env=_env(libfoo_site))
    assert "executed the packages' code" in proc.stdout
    assert "the same, in the same order" in proc.stdout


def test_graph_svg_has_the_red_edge_on_the_shadowed_pair(libfoo_site, tmp_path):
    from tests.conftest import run_cli
    if not shutil.which("dot"):
        pytest.skip("graphviz's dot is not installed")
    svg = tmp_path / "closure.svg"
    proc = run_cli("check", "--python", PYTHON, "--imports", "a,b", "--graph", str(svg), env=_env(libfoo_site))
    assert proc.returncode == 1, proc.stderr
    text = svg.read_text()
    assert "<!-- seedance check --graph -->" in text
    root = ET.fromstring(text[text.index("<svg"):])
    ns = {"s": "http://www.w3.org/2000/svg"}
    red = []
    for group in root.iter("{http://www.w3.org/2000/svg}g"):
        if "edge" not in (group.get("class") or "").split():
            continue
        path = group.find("s:path", ns)
        if path is not None and path.get("stroke") == "red":
            title = group.find("s:title", ns).text
            label = " ".join(t.text or "" for t in group.iter("{http://www.w3.org/2000/svg}text"))
            red.append((tuple(title.split("->")), label))
    b_ext = os.path.join(libfoo_site, "b", "_ext" + F.EXT_SUFFIX)
    a_foo = os.path.join(libfoo_site, "a", "libs", "libfoo.so.1")
    assert red == [((b_ext, a_foo), "soname-shadowed: libfoo.so.1 (undefined symbol: foo_b)")]
    # rerun replaces our own picture (it carries the marker)
    again = run_cli("check", "--python", PYTHON, "--imports", "a,b", "--graph", str(svg), env=_env(libfoo_site))
    assert again.returncode == 1, again.stderr


@pytest.fixture(scope="module")
def libstdcxx_site(tmp_path_factory):
    """`old` bundles an older libstdc++.so.6 (nodes up to GLIBCXX_3.4.21); `new` needs
    GLIBCXX_3.4.30 from the system libstdc++.so.6."""
    system = "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"
    if not os.path.exists(system):
        pytest.skip("no system libstdc++.so.6")
    site = str(tmp_path_factory.mktemp("libstdcxx-site"))
    old = F.package(site, "old", "from ._ext import value\n")
    new = F.package(site, "new", "from ._ext import value\n")
    legacy = "_ZNSt7__cxx1112basic_stringIwSt11char_traitsIwESaIwEE10_M_disposeEv"
    recent = "_ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE"
    F.shared_lib(os.path.join(old, "libs", "libstdc++.so.6"), f"void {legacy}(void){{}}\nvoid old_marker(void){{}}\n",
                 soname="libstdc++.so.6",
                 version_script=f"GLIBCXX_3.4 {{ global: old_marker; local: *; }};\n"
                                f"GLIBCXX_3.4.21 {{ global: {legacy}; }} GLIBCXX_3.4;\n")
    F.extension(old, "_ext", [], refs=[legacy], links=(f"-L{old}/libs", "-l:libstdc++.so.6"))
    F.extension(new, "_ext", [], refs=[recent], links=("-l:libstdc++.so.6",), rpath=None)
    return site


def test_libstdcxx_older_copy_loaded_first(libstdcxx_site):
    prediction = _agree(libstdcxx_site, ["old", "new"])
    assert not prediction.ok and "version `GLIBCXX_3.4.30' not found" in prediction.error
    assert prediction.working_order == ("new", "old")


def test_libstdcxx_system_copy_loaded_first(libstdcxx_site):
    assert _agree(libstdcxx_site, ["new", "old"]).ok


@pytest.fixture(scope="module")
def cudart_site(tmp_path_factory):
    """Two majors of the CUDA runtime from the nvidia-cuda-runtime-cu11/-cu12 wheels, one per
    package, plus a package bundling its own copy of libcudart.so.12."""
    wheel_lib = os.path.join(SITE_PACKAGES, "nvidia", "cuda_runtime", "lib")
    if not (os.path.exists(os.path.join(wheel_lib, "libcudart.so.11.0"))
            and os.path.exists(os.path.join(wheel_lib, "libcudart.so.12"))):
        pytest.skip("nvidia-cuda-runtime-cu11 and -cu12 wheels are not both installed in this environment")
    site = str(tmp_path_factory.mktemp("cudart-site"))
    for name, soname in (("cu11", "libcudart.so.11.0"), ("cu12", "libcudart.so.12")):
        pkg = F.package(site, name, "from ._ext import value\n")
        F.extension(pkg, "_ext", [], refs=["cudaRuntimeGetVersion"], links=(f"-L{wheel_lib}", f"-l:{soname}"),
                    rpath=wheel_lib)
    bundled = F.package(site, "bundled", "from ._ext import value\n")
    os.makedirs(os.path.join(bundled, "libs"))
    shutil.copy2(os.path.join(wheel_lib, "libcudart.so.12"), os.path.join(bundled, "libs", "libcudart.so.12"))
    F.extension(bundled, "_ext", [], refs=["cudaRuntimeGetVersion"], links=(f"-L{bundled}/libs", "-l:libcudart.so.12"))
    return site


def test_two_cudart_majors_both_load(cudart_site):
    prediction = _agree(cudart_site, ["cu11", "cu12"])
    assert prediction.ok
    loaded = [os.path.basename(p) for p in prediction.model.link_map]
    assert "libcudart.so.11.0" in loaded and "libcudart.so.12" in loaded


def test_bundled_cudart_copy_shadows_the_wheel(cudart_site):
    prediction = _agree(cudart_site, ["bundled", "cu12"])
    assert prediction.ok
    shadow = [s for step in prediction.model.steps for s in step.shadowed]
    assert [(os.path.basename(s.used), s.used.split(os.sep)[-3]) for s in shadow] == [("libcudart.so.12", "bundled")]
    assert ("cudaRuntimeGetVersion", "libcudart.so.12") in [(n, v) for n, v, _p in shadow[0].other_copy]


@pytest.fixture(scope="module")
def global_site(tmp_path_factory):
    """`g` switches to RTLD_GLOBAL around its extension import (sys.setdlopenflags); `p`'s
    extension uses `provided` without a NEEDED on its provider, and has its own `twice`
    that g's global provider interposes."""
    site = str(tmp_path_factory.mktemp("global-site"))
    g = F.package(site, "g", "import os, sys\nsys.setdlopenflags(os.RTLD_NOW | os.RTLD_GLOBAL)\n"
                             "from ._ext import value\nsys.setdlopenflags(os.RTLD_NOW)\n")
    p = F.package(site, "p", "from ._ext import value\n")
    F.shared_lib(os.path.join(g, "libs", "libprov.so"), "int provided(void){return 5;}\nint twice(void){return 1;}\n",
                 soname="libprov.so")
    F.extension(g, "_ext", ["provided"], links=(f"-L{g}/libs", "-l:libprov.so"))
    F.shared_lib(os.path.join(p, "libs", "libown.so"), "int twice(void){return 2;}\n", soname="libown.so")
    F.extension(p, "_ext", ["provided", "twice"], links=(f"-L{p}/libs", "-l:libown.so"),
                extra=("-Wl,--unresolved-symbols=ignore-all",), expr="twice() * 10 + provided()")
    return site


def test_rtld_global_provider_first_works_and_interposes(global_site):
    prediction = _agree(global_site, ["g", "p"])
    assert prediction.ok
    step = prediction.model.steps[-1]
    sim_symbols = __import__("seedance.resolve.process", fromlist=["_Symbols"])._Symbols(
        __import__("seedance.resolve", fromlist=["Resolver"]).Resolver())
    provider = next(p for p in step.scope if sim_symbols.defines(p, "twice", None))
    real = F.run_python(global_site, "import g, p; print(p.value)", PYTHON)
    # the value says which `twice` ld.so bound: 1 from g's global libprov, 2 from p's libown
    assert real.stdout.decode().strip() == {"libprov.so": "15", "libown.so": "25"}[os.path.basename(provider)]


def test_rtld_global_provider_later_is_too_late(global_site):
    prediction = _agree(global_site, ["p", "g"])
    assert not prediction.ok and prediction.error.endswith("undefined symbol: provided")
    assert prediction.working_order == ("g", "p")


def test_dlopen_cli_for_a_non_python_host(global_site, tmp_path):
    from tests.conftest import run_cli
    host = F.host_program(str(tmp_path / "host"))
    prov = os.path.join(global_site, "g", "libs", "libprov.so")
    plugin = F.shared_lib(str(tmp_path / "libplugin.so"), "extern int provided(void);\nint f(void){return provided();}\n")
    for loads, flags in (([prov + ":GLOBAL", plugin], "GLOBAL"), ([prov, plugin], "")):
        real = subprocess.run([host, *loads], capture_output=True, text=True)
        proc = run_cli("check", host, "--dlopen", ",".join(loads))
        assert (proc.returncode == 0) == (real.returncode == 0), (flags, proc.stdout, real.stdout)
        expected = "predicted: loads" if real.returncode == 0 else f"predicted: {real.stdout.strip()}"
        assert expected in proc.stdout


def test_pid_then_dlopen_predicts_what_the_process_would_do(libfoo_site, tmp_path):
    """A live process that imported `a`: a later dlopen of b's extension fails in it; the
    oracle is the same process doing that dlopen after seedance answered."""
    from tests.conftest import run_cli
    b_ext = os.path.join(libfoo_site, "b", "_ext" + F.EXT_SUFFIX)
    code = ("import a, sys, ctypes\nprint('ready', flush=True)\nsys.stdin.readline()\n"
            "try:\n    ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_LOCAL)\n    print('ok')\n"
            "except OSError as exc:\n    print(exc)\n")
    proc = subprocess.Popen([PYTHON, "-c", code, b_ext], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=_env(libfoo_site), text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        result = run_cli("check", "--pid", str(proc.pid), "--then-dlopen", b_ext)
        out, _ = proc.communicate("go\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    real = out.strip()
    assert real.endswith("undefined symbol: foo_b")
    assert f"then dlopen({b_ext}): fails: {real}" in result.stdout
    assert "soname-shadowed" in result.stdout and result.returncode == 1


def test_why_imports_names_the_chain(libfoo_site):
    from tests.conftest import run_cli
    proc = run_cli("why", "libfoo.so.1", "--imports", "a,b", "--python", PYTHON, env=_env(libfoo_site))
    assert proc.returncode == 0, proc.stderr
    a_ext = os.path.join(libfoo_site, "a", "_ext" + F.EXT_SUFFIX)
    b_ext = os.path.join(libfoo_site, "b", "_ext" + F.EXT_SUFFIX)
    assert f"{a_ext} NEEDED libfoo.so.1 => {os.path.join(libfoo_site, 'a', 'libs', 'libfoo.so.1')} [rpath]" \
        in proc.stdout
    assert f"also answers libfoo.so.1 of {b_ext} [already loaded]" in proc.stdout
    missing = run_cli("why", "libnothere.so.9", "--imports", "a", "--python", PYTHON, env=_env(libfoo_site))
    assert missing.returncode == 1


@pytest.mark.parametrize("argv", [
    ["check", "--imports", "a", "--python", "/nonexistent/python"],
    ["check", "--imports", ",", "--python", PYTHON],
    ["check", "--imports", "a;rm", "--python", PYTHON],
    ["check", "--observe"],
    ["check", "--then-dlopen", "libz.so.1"],
    ["check", "--imports", "a", "--graph", "/tmp/x.txt"],
    ["why", "libz.so.1", "--in", "/nonexistent"],
    ["check", "/bin/true", "--dlopen", ","],
])
def test_bad_input_is_one_line_exit_2(argv):
    from tests.conftest import run_cli
    proc = run_cli(*argv)
    assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
    assert re.fullmatch(r"seedance: error: [^\n]+\n", proc.stderr), proc.stderr


# Real import sets from the wheels installed in this venv (the bench adds torch and
# matplotlib, slower to parse): each prediction against `python -c 'import ...'` under
# LD_DEBUG=files.
REAL_IMPORT_SETS = [
    "yaml", "numpy", "PIL.Image", "cffi", "lief", "kiwisolver", "contourpy", "lz4.frame", "zstandard",
    "pydantic_core", "rpds", "setproctitle", "markupsafe", "charset_normalizer", "numpy, PIL.Image",
    "PIL.Image, numpy", "yaml, numpy, lief", "sqlite3", "ctypes", "json, decimal", "ssl",
    "PIL._imaging, kiwisolver", "cffi, yaml", "hashlib, lzma, bz2",
]


def test_predictions_agree_with_real_imports():
    interp = ask_interpreter(PYTHON)
    from seedance.resolve import Resolver
    resolver = Resolver()
    rows = []
    for text in REAL_IMPORT_SETS:
        names = [n.strip() for n in text.split(",")]
        module = names[0].split(".")[0]
        if F.run_python("", f"import importlib.util as u; raise SystemExit(u.find_spec({module!r}) is None)",
                        PYTHON).returncode:
            continue  # not installed here
        prediction = predict_imports(interp, names, resolver=resolver, search_orders=False)
        seen = observe(PYTHON, "import " + ", ".join(names))
        actual = [name for name, _who in seen.loaded]
        rows.append((text, prediction.ok == (seen.returncode == 0), prediction.loaded_names() == actual,
                     bool(prediction.plan.notes)))
    if len(rows) < 20:
        pytest.skip(f"only {len(rows)} of the import sets are installed here")
    print("\nagreement: verdict %d/%d, loaded objects and order %d/%d" % (
        sum(r[1] for r in rows), len(rows), sum(r[2] for r in rows), len(rows)))
    assert all(verdict for _t, verdict, _o, _n in rows), [r for r in rows if not r[1]]
    # where static analysis met nothing it cannot follow, the prediction must be exact
    assert [t for t, _v, order, notes in rows if not notes and not order] == []


def test_plain_pid_reports_a_copy_already_shadowed(libfoo_site):
    """`import b, a` in a live process: a's extension got b's libfoo.so.1 (loads, foo_a
    binds to b's copy); check --pid sees it from /proc/PID/maps, the oracle is the maps file
    itself (one libfoo mapped, b's)."""
    from tests.conftest import run_cli
    proc = subprocess.Popen([PYTHON, "-c", "import b, a, sys\nprint('ready', flush=True)\nsys.stdin.readline()\n"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_env(libfoo_site), text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        with open(f"/proc/{proc.pid}/maps") as handle:
            mapped = {line.split()[-1] for line in handle if line.rstrip().endswith("libfoo.so.1")}
        result = run_cli("check", "--pid", str(proc.pid), "--json")
    finally:
        proc.communicate("go\n", timeout=60)
    assert mapped == {os.path.join(libfoo_site, "b", "libs", "libfoo.so.1")}
    import json
    shadowed = [f for f in json.loads(result.stdout)["findings"] if f["rule"] == "soname-shadowed"]
    assert [(f["severity"], f["evidence"]["used"], f["evidence"]["alone"]) for f in shadowed] == [
        ("warning", os.path.join(libfoo_site, "b", "libs", "libfoo.so.1"),
         os.path.join(libfoo_site, "a", "libs", "libfoo.so.1"))]


def test_graph_png_is_marked_and_text_tree_without_dot(libfoo_site, tmp_path):
    from tests.conftest import run_cli
    if shutil.which("dot"):
        png = tmp_path / "closure.png"
        proc = run_cli("check", "--python", PYTHON, "--imports", "a,b", "--graph", str(png), env=_env(libfoo_site))
        assert proc.returncode == 1, proc.stderr
        from seedance.render.output import is_ours
        data = png.read_bytes()
        assert data.startswith(b"\x89PNG") and is_ours(str(png))
        # graphviz itself must accept the file we wrote (the inserted chunk's CRC is right)
        check = subprocess.run(["python3", "-c", "import sys,zlib\nd=open(sys.argv[1],'rb').read()[8:]\n"
                                "while d:\n n=int.from_bytes(d[:4],'big'); t=d[4:8]; body=d[8:8+n]\n"
                                " assert zlib.crc32(t+body)==int.from_bytes(d[8+n:12+n],'big'), t\n d=d[12+n:]\n",
                                str(png)])
        assert check.returncode == 0
    svg = tmp_path / "none.svg"
    env = dict(_env(libfoo_site), PATH="/nonexistent")
    proc = run_cli("check", "--python", PYTHON, "--imports", "a,b", "--graph", str(svg), env=env)
    assert proc.returncode == 1, proc.stderr
    assert "graphviz's `dot` is not installed: showing the closure as a text tree" in proc.stdout
    assert "<- soname-shadowed" in proc.stdout and not svg.exists()


def test_no_import_order_works_when_each_copy_lacks_the_others_symbol(tmp_path):
    """c's libbar.so.1 has only bar_c, d's only bar_d: whichever is imported first, the other
    fails; both orders really fail, and the finding says no order works."""
    from tests.conftest import run_cli
    site = str(tmp_path)
    for name in ("c", "d"):
        pkg = F.package(site, name, "from ._ext import value\n")
        F.shared_lib(os.path.join(pkg, "libs", "libbar.so.1"), f"int bar_{name}(void){{return 1;}}\n",
                     soname="libbar.so.1")
        F.extension(pkg, "_ext", [f"bar_{name}"], links=(f"-L{pkg}/libs", "-l:libbar.so.1"))
    for order in (["c", "d"], ["d", "c"]):
        prediction = _agree(site, order)
        assert not prediction.ok and prediction.working_order is None and prediction.searched_orders
    proc = run_cli("check", "--python", PYTHON, "--imports", "c,d", env=_env(site))
    assert proc.returncode == 1 and "no import order works" in proc.stdout


def test_report_json_carries_the_model_and_validates(libfoo_site):
    import json

    import jsonschema
    from tests.conftest import ROOT, run_cli
    proc = run_cli("check", "--python", PYTHON, "--imports", "a,b", "--json", env=_env(libfoo_site))
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, json.loads((ROOT / "agent" / "schemas" / "report.schema.json").read_text()))
    real_ok, real_line = _real(libfoo_site, ["a", "b"])
    assert (doc["process"]["ok"], doc["process"]["error"]) == (real_ok, real_line)
    failing = [load for load in doc["process"]["loads"] if not load["ok"]]
    assert [(load["module"], load["flags"], load["shadowed"][0]["missing"]) for load in failing] == \
        [("b._ext", "RTLD_NOW|RTLD_LOCAL", ["foo_b"])]
