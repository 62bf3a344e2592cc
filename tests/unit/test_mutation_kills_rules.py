"""Tests written for rule-condition mutants the suite let through (bench/run_mutation.py
"rules", bench/mutation-survivors.md): each rule judged through the real engine on facts
from the real fact builders, on both sides of its condition."""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from seedance.judge.engine import load_rules
from seedance.plugins import host, layers
from seedance.plugins.manifest import load_manifest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plugins"
NO_GPU = host.GpuHost(False, "NVML Shared Library Not Found", 0, None, None, None, "no module")
DRIVER_12 = host.GpuHost(True, "", 1, "550.54.15", 12, "550.54.15", "/proc/driver/nvidia/version",
                         ({"index": 0, "name": "H100", "cc": "9.0", "arch": 90, "utilisation": 40},))


@pytest.fixture(scope="module")
def rules():
    return load_rules()


def fired(rules, facts, rule_id) -> bool:
    return rule_id in {f.rule for f in rules.evaluate(facts, strict=True)}


@pytest.mark.parametrize("runtime, gpu, too_old", [
    (13, DRIVER_12, True),    # a CUDA 13 runtime on a driver that supports CUDA 12 at most
    (12, DRIVER_12, False),   # the driver supports it
    (11, DRIVER_12, False),   # older runtimes run on newer drivers
    (13, NO_GPU, False),      # no driver observed: nothing to judge, no guess
])
def test_plugin_cuda_driver_too_old(rules, runtime, gpu, too_old):
    manifest = replace(load_manifest(EXAMPLES / "fatbin-kernels" / "manifest.yaml"), cuda_runtime=runtime)
    facts, _ = layers.cuda_runtime_facts(manifest, {}, gpu)
    assert fired(rules, facts, "plugin-cuda-driver-too-old") is too_old


@pytest.mark.parametrize("info, missing", [
    (None, True),          # the entry library is not there
    ("not-elf", True),     # there, but not an ELF object
    (object(), False),     # an ELF object (any parsed ElfInfo)
])
def test_plugin_entry_missing(rules, info, missing):
    manifest = load_manifest(EXAMPLES / "fatbin-kernels" / "manifest.yaml")
    fact = layers.entry_fact(manifest, str(manifest.root / "lib" / "libentry.so"), info)
    assert fired(rules, [fact], "plugin-entry-missing") is missing


@pytest.fixture(scope="module")
def linked_to_cudart12(tmp_path_factory):
    """A real library whose NEEDED names the CUDA 12 runtime (the nvidia-cuda-runtime-cu12 wheel)."""
    import shutil
    import subprocess
    import sysconfig

    from seedance.elf import read_elf

    cudart = Path(sysconfig.get_paths()["purelib"]) / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12"
    if shutil.which("gcc") is None or not cudart.exists():
        pytest.skip("needs gcc and the nvidia-cuda-runtime-cu12 wheel")
    tmp = tmp_path_factory.mktemp("cudart12")
    (tmp / "k.c").write_text("int cudaGetDeviceCount(int *); int k(void){int n; return cudaGetDeviceCount(&n);}\n")
    lib = tmp / "libk.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", lib, tmp / "k.c", str(cudart)], check=True)
    info = read_elf(str(lib))
    assert "libcudart.so.12" in info.needed
    return {str(lib): info}


@pytest.mark.parametrize("declared, mismatch", [
    (13, True),     # the manifest says 13, the library links 12
    (12, False),    # they agree
    (None, False),  # nothing declared: nothing to contradict
])
def test_plugin_cuda_runtime_declared(rules, linked_to_cudart12, declared, mismatch):
    manifest = replace(load_manifest(EXAMPLES / "fatbin-kernels" / "manifest.yaml"), cuda_runtime=declared)
    facts, _ = layers.cuda_runtime_facts(manifest, linked_to_cudart12, NO_GPU)
    assert fired(rules, facts, "plugin-cuda-runtime-declared") is mismatch


def _pick(name, version):
    from seedance.plugins.resolve import Pick

    return Pick(dependent="speech-pipeline 1.0.0", name=name, range=">=1.0,<2", version=version, installed=False,
                source=None, matching=(version,) if version else (), newest=version, fallback=False, explanation="")


@pytest.mark.parametrize("picks, unresolved", [
    ([_pick("dsp-kernels", None)], ["depends.dsp-kernels"]),   # checked, nothing satisfies the range
    ([_pick("dsp-kernels", "1.4.0")], []),                     # checked, a version was picked
    (None, []),                                                # dependencies not checked: no verdict
])
def test_plugin_dependency_unresolved(rules, picks, unresolved):
    from seedance.plugins import verify

    manifest = load_manifest(EXAMPLES / "speech-pipeline-v1.0.0" / "manifest.yaml")
    facts = verify.range_facts(manifest, picks)
    # only a dependency's range can be unresolved, never seedance_version or framework.torch
    hits = [f for f in rules.evaluate(facts, strict=True) if f.rule == "plugin-dependency-unresolved"]
    assert len(hits) == len(unresolved), [f.message for f in hits]


def test_plugin_cxxrt_version_missing_stays_quiet_when_the_runtime_has_every_node(rules, tmp_path):
    """A C++ library built here needs GLIBCXX_* nodes that this host's libstdc++ defines (the
    program loads: ld.so checks every node), so the rule must not fire."""
    import shutil
    import subprocess

    from seedance.elf import read_elf

    if shutil.which("g++") is None:
        pytest.skip("g++ not found")
    (tmp_path / "s.cc").write_text("#include <string>\nstd::string s(const char *p) { return std::string(p) + \"!\"; }\n")
    lib = tmp_path / "libs.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-o", lib, tmp_path / "s.cc"], check=True)
    loads = subprocess.run([sys.executable, "-c", "import ctypes, os, sys; ctypes.CDLL(sys.argv[1], os.RTLD_NOW)",
                            str(lib)], capture_output=True, text=True)
    assert loads.returncode == 0, loads.stderr
    manifest = load_manifest(EXAMPLES / "fatbin-kernels" / "manifest.yaml")
    facts = layers.symbol_version_facts(manifest, {str(lib): read_elf(str(lib))})
    assert any(f.data["family"] == "GLIBCXX" for f in facts)  # the library does need the C++ runtime's nodes
    assert not fired(rules, facts, "plugin-cxxrt-version-missing")
    # a node the provider lacks: the rule is about the C++ runtime's nodes; a missing GLIBC
    # node is another rule's finding, not this one's
    cxx = next(f for f in facts if f.data["family"] == "GLIBCXX")
    glibc = next(f for f in facts if f.data["family"] == "GLIBC")
    assert fired(rules, [cxx._replace(data={**cxx.data, "node": "GLIBCXX_9.9", "defined": False})],
                 "plugin-cxxrt-version-missing")
    assert not fired(rules, [glibc._replace(data={**glibc.data, "node": "GLIBC_9.9", "defined": False})],
                     "plugin-cxxrt-version-missing")


@pytest.fixture(scope="module")
def installed_torch():
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        pytest.skip("torch not installed")


@pytest.mark.parametrize("torch_range, fires", [("<1.0", True), (">=1.0", False)])
def test_plugin_torch_version(rules, installed_torch, torch_range, fires):
    """framework.torch against the torch distribution installed here (any release since 1.0
    is inside >=1.0 and outside <1.0)."""
    manifest = replace(load_manifest(EXAMPLES / "fatbin-kernels" / "manifest.yaml"), torch_range=torch_range)
    fact, _ = layers.framework_fact(manifest)
    assert fact is not None
    assert fired(rules, [fact], "plugin-torch-version") is fires


EXT = """\
#include <string>
namespace c10 { void seedance_not_in_torch(const std::string &); }
void call(void) { c10::seedance_not_in_torch("x"); }
"""


@pytest.mark.parametrize("abi, fires", [(1, True), (0, False)])
def test_torch_symbol_missing_is_left_to_the_abi_rule_when_the_abi_explains_it(rules, tmp_path, abi, fires):
    """An extension linked to the venv's libc10 calls a c10 function torch does not define
    (importing it in a child fails with "undefined symbol", the oracle that it is missing).
    Built with torch's std::string ABI (=1 since torch 2.x wheels), the missing symbol is the
    finding; built with the old ABI (-D_GLIBCXX_USE_CXX11_ABI=0) the mismatch explains it
    and torch-symbol-missing stays quiet."""
    import importlib.util
    import shutil
    import subprocess

    from seedance.collect.cxxabi import TorchAbiCache, extension_facts
    from seedance.elf import read_elf
    from seedance.resolve import Resolver

    spec = importlib.util.find_spec("torch")
    if spec is None or shutil.which("g++") is None:
        pytest.skip("needs the torch wheel and g++")
    torch_lib = Path(list(spec.submodule_search_locations)[0]) / "lib"
    (tmp_path / "e.cc").write_text(EXT)
    ext = tmp_path / "libext.so"
    # --no-as-needed: libc10 defines nothing the extension uses, and must stay its NEEDED
    subprocess.run(["g++", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-o", ext, tmp_path / "e.cc",
                    "-Wl,--no-as-needed", str(torch_lib / "libc10.so"), f"-Wl,-rpath,{torch_lib}"], check=True)
    loads = subprocess.run([sys.executable, "-c", "import ctypes, os, sys; ctypes.CDLL(sys.argv[1], os.RTLD_NOW)",
                            str(ext)], capture_output=True, text=True, errors="replace")
    assert loads.returncode != 0 and "undefined symbol: _ZN3c1021seedance_not_in_torch" in loads.stderr, loads.stderr
    closure = Resolver(env={}).closure(str(ext), symbols=True)
    torch_paths = [p for p in closure.objects if Path(p).parent == torch_lib]
    assert torch_paths
    facts = extension_facts(str(ext), dict(closure.objects), torch_paths, TorchAbiCache(),
                            lambda p: read_elf(p, symbols=True))
    symbols = [f for f in facts if f.kind == "torch_symbols"]
    assert [f.data["count"] for f in symbols] == [1]
    assert fired(rules, facts, "torch-symbol-missing") is fires


def test_plugin_glibc_version_missing_fires_only_for_a_glibc_node_the_host_lacks(rules, tmp_path):
    """A C library built here needs GLIBC_2.2.5 (puts, x86-64's first node): it loads, so
    the rule is quiet.  The same library with that node's name rewritten in .dynstr to
    GLIBC_9.2.5 does not load (ld.so: "version `GLIBC_9.2.5' not found"): the rule fires.
    A missing C++ runtime node is the other rule's finding, not this one's."""
    import shutil
    import subprocess

    from seedance.elf import read_elf

    if shutil.which("gcc") is None or not sys.platform.startswith("linux"):
        pytest.skip("gcc on Linux needed")
    (tmp_path / "p.c").write_text("#include <stdio.h>\nint p(const char *s) { return puts(s); }\n")
    lib = tmp_path / "libp.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-s", "-o", lib, tmp_path / "p.c"], check=True)  # -s: .dynstr only
    load = "import ctypes, os, sys; ctypes.CDLL(sys.argv[1], os.RTLD_NOW)"
    manifest = load_manifest(EXAMPLES / "fatbin-kernels" / "manifest.yaml")
    assert subprocess.run([sys.executable, "-c", load, str(lib)], capture_output=True).returncode == 0
    facts = layers.symbol_version_facts(manifest, {str(lib): read_elf(str(lib))})
    if not any(f.data["node"] == "GLIBC_2.2.5" for f in facts):
        pytest.skip("this libc does not give puts the GLIBC_2.2.5 node")
    assert not fired(rules, facts, "plugin-glibc-version-missing")
    data = lib.read_bytes()
    assert data.count(b"GLIBC_2.2.5\0") == 1
    bad = tmp_path / "libbad.so"
    bad.write_bytes(data.replace(b"GLIBC_2.2.5\0", b"GLIBC_9.2.5\0"))
    refused = subprocess.run([sys.executable, "-c", load, str(bad)], capture_output=True, text=True, errors="replace")
    assert "GLIBC_9.2.5' not found" in refused.stderr, refused.stderr
    facts = layers.symbol_version_facts(manifest, {str(bad): read_elf(str(bad))})
    assert fired(rules, facts, "plugin-glibc-version-missing")
    cxx = [f for f in facts if f.data["family"] != "GLIBC"]
    glibc = next(f for f in facts if f.data["family"] == "GLIBC")
    assert not fired(rules, [glibc._replace(data={**glibc.data, "family": "GLIBCXX", "node": "GLIBCXX_9.9",
                                                   "defined": False})] + cxx, "plugin-glibc-version-missing")


def libver_copies(tmp_path):
    """A gcc-built dlopen host and two copies of libver.so.1: v1/ defines VER_1 (ver), v2/ also
    VER_2 (ver2).  Returns the fixtures module, the root, the host and v1's path."""
    import os
    import shutil

    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
    import process_fixtures as F

    root = str(tmp_path)
    host_program = F.host_program(os.path.join(root, "host"))
    v1 = F.shared_lib(os.path.join(root, "v1", "libver.so.1"), "int ver(void){return 1;}\n", soname="libver.so.1",
                      version_script="VER_1 { global: ver; local: *; };\n")
    F.shared_lib(os.path.join(root, "v2", "libver.so.1"), "int ver(void){return 1;}\nint ver2(void){return 2;}\n",
                 soname="libver.so.1",
                 version_script="VER_1 { global: ver; local: *; };\nVER_2 { global: ver2; } VER_1;\n")
    return F, root, host_program, v1


def test_soname_shadowed_fires_for_a_shadowing_and_not_for_a_plain_failure(rules, tmp_path):
    """Two dlopen sequences run by a gcc-built host (the oracle) and predicted by the process
    model: libver.so.1 v1 loaded first shadows the v2 copy a later library needs (it fails:
    "VER_2 not found"), and a dlopen of a file that is not there (it fails: "cannot open").
    Only the first is a shadowing."""
    import os
    import subprocess

    from seedance.collect.python_env import predict_dlopens, shadowing_facts
    from seedance.resolve.process import RTLD_NOW

    F, root, host, v1 = libver_copies(tmp_path)
    needs = F.shared_lib(os.path.join(root, "v2", "libneeds.so"),
                         "extern int ver2(void);\nint n(void){return ver2();}\n",
                         soname="libneeds.so", links=(f"-L{root}/v2", "-l:libver.so.1"), rpath="$ORIGIN")
    gone = os.path.join(root, "nowhere", "libgone.so")
    for sequence, says, shadowed in (([v1, needs], b"VER_2", True), ([gone], b"cannot open", False)):
        real = subprocess.run([host, *sequence], capture_output=True, timeout=60, env={"PATH": os.environ["PATH"]})
        assert real.returncode != 0 and says in real.stdout, real.stdout
        facts = shadowing_facts(predict_dlopens(host, sequence, RTLD_NOW))
        assert facts  # a finding either way: the load fails
        assert fired(rules, facts, "soname-shadowed") is shadowed


def test_a_shadowing_dlopen_sequence_names_the_order_that_works(rules, tmp_path):
    """The failing order [v1, libneeds] is reversed by the model, and the reversed order really
    loads in the gcc-built host (the oracle); the finding's message and fix name that order and
    end in no empty clause (an empty hint left "...; " before)."""
    import os
    import subprocess

    from seedance.collect.python_env import predict_dlopens, shadowing_facts
    from seedance.resolve.process import RTLD_NOW

    F, root, host, v1 = libver_copies(tmp_path)
    needs = F.shared_lib(os.path.join(root, "v2", "libneeds.so"),
                         "extern int ver2(void);\nint n(void){return ver2();}\n",
                         soname="libneeds.so", links=(f"-L{root}/v2", "-l:libver.so.1"), rpath="$ORIGIN")
    prediction = predict_dlopens(host, [v1, needs], RTLD_NOW)
    assert not prediction.ok and prediction.working_order == (needs, v1)
    real = subprocess.run([host, needs, v1], capture_output=True, timeout=60, env={"PATH": os.environ["PATH"]})
    assert real.returncode == 0, real.stdout
    [finding] = [f for f in rules.evaluate(shadowing_facts(prediction)) if f.rule == "soname-shadowed"]
    assert f"order that works: {needs}, {v1}" in finding.message
    assert f"order that works: {needs}, {v1}; or make" in finding.fix
    for text in (finding.message, finding.fix):
        assert not text.rstrip().endswith(";") and "; ;" not in text and not text.startswith(";")
    alone = shadowing_facts(predict_dlopens(host, [v1, needs], RTLD_NOW, search_orders=False))
    [unsearched] = [f for f in rules.evaluate(alone) if f.rule == "soname-shadowed"]
    assert unsearched.message.endswith("; other orders not tried")


def test_plugin_cuda_runtime_declared_without_a_linked_runtime_is_no_contradiction(rules, tmp_path):
    """A manifest declaring CUDA 13 whose library links no CUDA runtime at all (its NEEDED,
    read from a gcc build, names no libcudart): nothing contradicts the declaration."""
    import shutil
    import subprocess

    from seedance.elf import read_elf

    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    (tmp_path / "n.c").write_text("int n(void){return 0;}\n")
    lib = tmp_path / "libn.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", lib, tmp_path / "n.c"], check=True)
    info = read_elf(str(lib))
    assert not [name for name in info.needed if "cudart" in name]
    manifest = replace(load_manifest(EXAMPLES / "fatbin-kernels" / "manifest.yaml"), cuda_runtime=13)
    facts, _ = layers.cuda_runtime_facts(manifest, {str(lib): info}, NO_GPU)
    declared = [(f.data["declared_major"], f.data["linked_major"]) for f in facts if "declared_major" in f.data]
    assert declared == [(13, 0)]
    assert not fired(rules, facts, "plugin-cuda-runtime-declared")


def test_driver_module_mismatch_on_this_hosts_driver(rules, tmp_path):
    """`driver-module-mismatch` on the plugin_driver fact check_root builds from the real probe
    (the loaded kernel module's version, /proc/driver/nvidia/version, against NVML's): it fires
    exactly when the two differ.  The fact is built inline from gpu_host.probe(), so only a host
    with the driver can show the versions-equal side (bench/mutation-survivors.md: the
    `module_version != nvml_version` operand dropped); without one the test skips there."""
    from seedance.plugins.store import Store

    gpu = host.probe()
    if not (gpu.module_version and gpu.driver_version):
        pytest.skip("no NVIDIA driver here: the kernel module and NVML must both be observed")
    check = layers.check_root(EXAMPLES / "fatbin-kernels", False, None, store=Store(tmp_path / "plugins"))
    [fact] = [f for f in check.facts if f.kind == "plugin_driver"]
    assert (fact.data["module_version"], fact.data["nvml_version"]) == (gpu.module_version, gpu.driver_version)
    assert fired(rules, [fact], "driver-module-mismatch") is (gpu.module_version != gpu.driver_version)


# NVIDIA's version strings as the driver prints them (/proc/driver/nvidia/version's "Kernel
# Module" line, nvmlSystemGetDriverVersion): 570.86.15 and 570.133.07 are two R570 releases, the
# second installed over the first without a reboot leaves the old module loaded.
MODULE_SOURCE = "/proc/driver/nvidia/version"


def probed(module_version, nvml_version):
    """What gpu_host.probe() returns on a host whose loaded module and NVML report these versions
    (None: that side was not observed)."""
    return host.GpuHost(nvml_version is not None, "" if nvml_version else "NVML Shared Library Not Found",
                        1 if nvml_version else 0, nvml_version, 12 if nvml_version else None, module_version,
                        MODULE_SOURCE if module_version else "no module")


@pytest.mark.parametrize("module_version, nvml_version, mismatch", [
    ("570.86.15", "570.133.07", True),   # upgraded without a reboot: the old module is still loaded
    ("570.133.07", "570.86.15", True),   # the other way round (a downgrade)
    ("570.133.07", "570.133.07", False),  # rebooted: both sides agree
    ("570.86.15", "570.86.15", False),
    ("570.86.15", None, False),          # NVML not observed: nothing to compare
    (None, "570.86.15", False),          # no kernel module observed
])
def test_driver_module_mismatch_on_the_fact_check_root_builds(rules, module_version, nvml_version, mismatch):
    """`driver-module-mismatch` through the real engine and the shipped rules, on the fact
    check_root appends for L1 (layers.driver_fact, built from gpu_host.probe()'s answer): it fires
    exactly when both versions are known and differ (bench/mutation-survivors.md: the
    `module_version != nvml_version` operand dropped made it fire on every host with a driver)."""
    manifest = load_manifest(EXAMPLES / "fatbin-kernels" / "manifest.yaml")
    fact = layers.driver_fact(manifest, probed(module_version, nvml_version))
    assert fact.kind == "plugin_driver"
    assert (fact.data["module_version"], fact.data["nvml_version"]) == (module_version or "", nvml_version or "")
    assert fired(rules, [fact], "driver-module-mismatch") is mismatch
    if mismatch:
        [finding] = [f for f in rules.evaluate([fact], strict=True) if f.rule == "driver-module-mismatch"]
        assert finding.message == (f"nvidia kernel module {module_version} ({MODULE_SOURCE}) "
                                   f"but user-space driver {nvml_version}")


def test_soname_shadowed_is_an_error_only_when_the_shadowing_copy_lacks_what_is_needed(rules, tmp_path):
    """soname-shadowed escalates to an error where the copy loaded first lacks a symbol the later
    library needs (`missing != ''`).  Two sequences run by a gcc-built host (the oracle): v1
    first, then a library needing VER_2's ver2 (ld.so refuses it: an error), or one needing
    only VER_1's ver, which v1 defines too (ld.so loads it: shadowed, but a warning)."""
    import os
    import subprocess

    from seedance.collect.python_env import predict_dlopens, shadowing_facts
    from seedance.resolve.process import RTLD_NOW

    F, root, host_program, v1 = libver_copies(tmp_path)
    links = (f"-L{root}/v2", "-l:libver.so.1")
    needs2 = F.shared_lib(os.path.join(root, "v2", "libneeds2.so"), "extern int ver2(void);\nint n(void){return ver2();}\n",
                          soname="libneeds2.so", links=links, rpath="$ORIGIN")
    needs1 = F.shared_lib(os.path.join(root, "v2", "libneeds1.so"), "extern int ver(void);\nint n(void){return ver();}\n",
                          soname="libneeds1.so", links=links, rpath="$ORIGIN")
    for later, loads, severity in ((needs2, False, "error"), (needs1, True, "warning")):
        real = subprocess.run([host_program, v1, later], capture_output=True, timeout=60,
                              env={"PATH": os.environ["PATH"]})
        assert (real.returncode == 0) is loads, real.stdout
        facts = shadowing_facts(predict_dlopens(host_program, [v1, later], RTLD_NOW))
        found = [f for f in rules.evaluate(facts, strict=True) if f.rule == "soname-shadowed"]
        assert [f.severity for f in found] == [severity], [(f.severity, f.message) for f in found]


def test_lib_deleted_fires_for_a_library_replaced_on_disk(rules, tmp_path):
    """A real process dlopens a library; an upgrade renames a new file over it.  maps marks the
    old inode "(deleted)" while a file is back under the name: state "replaced", and lib-deleted
    fires (`deleted || replaced`), as it does once the file is gone."""
    import os
    import shutil
    import subprocess

    from seedance.collect import process

    libz = "/usr/lib/x86_64-linux-gnu/libz.so.1"
    if not os.path.exists(libz):
        pytest.skip("libz.so.1 not installed")
    lib = tmp_path / "libzcopy.so.1"
    shutil.copy(os.path.realpath(libz), lib)
    child = subprocess.Popen([sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1]); print('up', "
                              "flush=True); sys.stdin.read()", str(lib)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"

        def judged():
            [fact] = [f for f in process.mapped_lib_facts(process.read_process(child.pid))
                      if f.subject["path"] == str(lib)]
            return fact.data["state"], fired(rules, [fact], "lib-deleted")

        assert judged() == ("ok", False)
        shutil.copy(lib, tmp_path / "new.so")
        os.replace(tmp_path / "new.so", lib)
        with open(f"/proc/{child.pid}/maps") as maps:  # the kernel's own view of the old mapping
            assert any(line.rstrip("\n").endswith(f"{lib} (deleted)") for line in maps)
        assert judged() == ("replaced", True)
        lib.unlink()
        assert judged() == ("deleted", True)
    finally:
        child.stdin.close()
        child.wait(timeout=10)


def test_plugin_manifest_invalid_exactly_when_the_schema_refuses_the_manifest(rules, tmp_path):
    """plugin-manifest-invalid fires for a manifest agent/schemas/manifest.schema.json refuses
    (jsonschema, not seedance, is the judge) and not for the shipped example it accepts."""
    import json
    import shutil

    import jsonschema
    import yaml

    from seedance.plugins.store import Store

    schema = json.loads((Path(__file__).resolve().parents[2] / "agent" / "schemas" /
                         "manifest.schema.json").read_text())
    good = tmp_path / "good"
    shutil.copytree(EXAMPLES / "fatbin-kernels", good)
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    text = (bad / "manifest.yaml").read_text()
    assert text.count("batch_policy: adaptive") == 1
    (bad / "manifest.yaml").write_text(text.replace("batch_policy: adaptive", "batch_policy: [adaptive]"))
    for root, valid in ((good, True), (bad, False)):
        try:
            jsonschema.validate(yaml.safe_load((root / "manifest.yaml").read_text()), schema)
            accepted = True
        except jsonschema.ValidationError:
            accepted = False
        assert accepted is valid
        check = layers.check_root(root, False, None, store=Store(tmp_path / "store"))
        assert ("plugin-manifest-invalid" in {f.rule for f in check.findings}) is (not valid)


def test_torch_not_found_fires_on_the_fact_for_an_extension_with_no_torch_to_judge_it(rules, tmp_path):
    """An extension whose NEEDED names libtorch_cpu.so (read from a gcc build by pyelftools, the
    reference reader), with no torch beside it: torch_ext's fact says so and torch-not-found
    fires (`!found`), as an info."""
    import shutil
    import subprocess

    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    from seedance.collect.torch_ext import torch_not_found_fact

    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    (tmp_path / "e.c").write_text("int e(void){return 0;}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", tmp_path / "libtorch_cpu.so", tmp_path / "e.c"], check=True)
    ext = tmp_path / "ext.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", ext, tmp_path / "e.c", "-Wl,--no-as-needed",
                    f"-L{tmp_path}", "-ltorch_cpu"], check=True)
    with open(ext, "rb") as handle:
        needed = [t.needed for s in ELFFile(handle).iter_sections() if isinstance(s, DynamicSection)
                  for t in s.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
    assert "libtorch_cpu.so" in needed
    found = [f for f in rules.evaluate([torch_not_found_fact(str(ext), [n for n in needed if "torch" in n])],
                                       strict=True)]
    assert [(f.rule, f.severity) for f in found] == [("torch-not-found", "info")]


def test_plugin_redundant_path_fires_for_the_two_normalisations(rules, tmp_path):
    """The feature-extractor 1.0.0 example normalises each frame along two paths; its
    standardize also fills an 8 MiB scratch buffer, so removing it saves at least 0.3 * 8 cost
    units (the example's own design, not seedance's figure): the rule fires on the profiled
    redundancy (`saving_cost > 0.0`).  One frame keeps the profile short."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.conftest import load_example_builder

    from seedance.profile.calls_report import callgraph_facts, profile_plugin

    plugin = load_example_builder().build("feature-extractor-v1.0.0", tmp_path)
    manifest, graph = profile_plugin(str(plugin), 1)
    facts = callgraph_facts(manifest, graph, 1)
    assert [(f.data["remove"], f.data["keep"]) for f in facts] == [("features.standardize", "features.zscore")]
    assert facts[0].data["saving_mem_mb"] >= 8.0
    assert fired(rules, facts, "plugin-redundant-path")
