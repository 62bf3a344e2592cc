"""seedance.resolve.process against the real ld.so: every verdict and message is checked
against a real dlopen() sequence (a gcc-built host program, or ctypes in a subprocess)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import process_fixtures as F  # noqa: E402

from seedance.resolve import Resolver  # noqa: E402
from seedance.resolve.process import RTLD_GLOBAL, RTLD_NOW, Load, Simulator, why  # noqa: E402


def _real(host, *loads):
    proc = subprocess.run([host, *loads], capture_output=True, timeout=60, env={"PATH": os.environ["PATH"]})
    return proc.returncode == 0, proc.stdout.decode("utf-8", "replace").strip()


def _model(host, *loads):
    sim = Simulator(Resolver(), host)
    sim.start()
    step = None
    for item in loads:
        path, _, mode = item.partition(":")
        step = sim.dlopen(Load(path, "dlopen", RTLD_NOW | (RTLD_GLOBAL if mode == "GLOBAL" else 0)))
        if not step.ok:
            return False, step.error, sim
    return True, "ok", sim


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("procmodel"))
    host = F.host_program(os.path.join(root, "host"))
    # provider of `provided` and of an interposable `twice`
    prov = F.shared_lib(os.path.join(root, "g", "libprov.so"),
                        "int provided(void){return 5;}\nint twice(void){return 1;}\n", soname="libprov.so")
    # needs `provided` without a NEEDED on its provider: binds only through the global scope
    plugin = F.shared_lib(os.path.join(root, "p", "libplugin.so"),
                          "extern int provided(void);\nint plug(void){return provided();}\n", soname="libplugin.so")
    # its own `twice`, but a global provider loaded earlier interposes it
    own = F.shared_lib(os.path.join(root, "p", "libown.so"), "int twice(void){return 2;}\n", soname="libown.so")
    user = F.shared_lib(os.path.join(root, "p", "libuser.so"),
                        "extern int twice(void);\nint use(void){return twice();}\n", soname="libuser.so",
                        links=(f"-L{root}/p", "-l:libown.so"), rpath="$ORIGIN")
    # NEEDED libprov.so, which nothing on its search path holds (--no-as-needed: m() calls
    # nothing of it, and a toolchain defaulting to --as-needed would drop the entry)
    missing = F.shared_lib(os.path.join(root, "m", "libmissing.so"), "int m(void){return 0;}\n",
                           soname="libmissing.so", links=(f"-L{root}/g", "-l:libprov.so"),
                           extra=("-Wl,--no-as-needed",))
    # a version node the provider lacks
    v1 = F.shared_lib(os.path.join(root, "v1", "libver.so.1"), "int ver(void){return 1;}\n", soname="libver.so.1",
                      version_script="VER_1 { global: ver; local: *; };\n")
    v2 = F.shared_lib(os.path.join(root, "v2", "libver.so.1"),
                      "int ver(void){return 1;}\nint ver2(void){return 2;}\n", soname="libver.so.1",
                      version_script="VER_1 { global: ver; local: *; };\nVER_2 { global: ver2; } VER_1;\n")
    needs_v2 = F.shared_lib(os.path.join(root, "v2", "libneedsv2.so"),
                            "extern int ver2(void);\nint n(void){return ver2();}\n", soname="libneedsv2.so",
                            links=(f"-L{root}/v2", "-l:libver.so.1"), rpath="$ORIGIN")
    return dict(host=host, prov=prov, plugin=plugin, own=own, user=user, missing=missing, v1=v1, v2=v2,
                needs_v2=needs_v2, root=root)


@pytest.mark.parametrize("case", [
    "local_then_plugin", "global_then_plugin", "plugin_alone", "promote_to_global", "missing_needed",
    "version_shadowed", "version_ok", "interposed", "lazy_plugin",
])
def test_verdict_and_message_match_real_dlopen(libs, case):
    L = libs
    seq = {
        "local_then_plugin": [L["prov"], L["plugin"]],
        "global_then_plugin": [L["prov"] + ":GLOBAL", L["plugin"]],
        "plugin_alone": [L["plugin"]],
        "promote_to_global": [L["prov"], L["prov"] + ":GLOBAL", L["plugin"]],
        "missing_needed": [L["missing"]],
        "version_shadowed": [L["v1"], L["needs_v2"]],
        "version_ok": [L["needs_v2"], L["v1"]],
        "interposed": [L["prov"] + ":GLOBAL", L["user"]],
        "lazy_plugin": [L["plugin"] + ":LAZY"],
    }[case]
    real_ok, real_text = _real(L["host"], *seq)
    if case == "missing_needed":  # the case is what it says: ld.so cannot find the NEEDED
        assert not real_ok and "libprov.so: cannot open shared object file" in real_text, real_text
    model_ok, model_text, _sim = _model(L["host"], *[s.replace(":LAZY", "") for s in seq]) \
        if case != "lazy_plugin" else _lazy(L["host"], L["plugin"])
    assert (model_ok, model_text) == (real_ok, real_text)


def _lazy(host, plugin):
    sim = Simulator(Resolver(), host)
    sim.start()
    step = sim.dlopen(Load(plugin, "dlopen", 0x1))  # RTLD_LAZY: function symbols bind on first call
    return step.ok, step.error or "ok", sim


def test_shadowing_recorded_with_who_loaded_it(libs):
    ok, _text, sim = _model(libs["host"], libs["v1"], libs["needs_v2"])
    assert not ok
    step = sim.model.steps[-1]
    assert [(s.name, s.used, s.alone) for s in step.shadowed] == [("libver.so.1", libs["v1"], libs["v2"])]
    assert step.shadowed[0].loaded_by == libs["v1"]


def test_interposition_binds_to_the_global_provider(libs):
    """ld.so binds libuser's `twice` in the global scope first: libprov (RTLD_GLOBAL) wins
    over libuser's own NEEDED libown; the real program says which by calling it."""
    ok, _text, sim = _model(libs["host"], libs["prov"] + ":GLOBAL", libs["user"])
    assert ok
    step = sim.model.steps[-1]
    provider = next(p for p in step.scope if sim.symbols.defines(p, "twice", None))
    code = ("import ctypes,sys; ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL); "
            "print(ctypes.CDLL(sys.argv[2]).use())")
    real = subprocess.run([sys.executable, "-c", code, libs["prov"], libs["user"]], capture_output=True, text=True)
    assert real.stdout.strip() == {libs["prov"]: "1", libs["own"]: "2"}[provider]


def test_why_names_the_chain(libs):
    _ok, _text, sim = _model(libs["host"], libs["needs_v2"])
    chains = why(sim.model, "libver.so.1", sim.resolver)
    assert [c.path for c in chains] == [libs["v2"]]
    assert [(link.requester, link.source) for link in chains[0].links] == [(libs["needs_v2"], "rpath")]
