"""Tests written for the mutants of agent/collect/practice.py and agent/collect/process.py
(issue 17: mutmut counts a mutant as killed only by a test that calls the function in-process).

Oracles, never the module itself:
- dpkg's own answers: ``dpkg-query -S`` / ``-L`` (also on a private admin directory, --admindir),
  ``apt-cache rdepends --installed``, the Depends fields as ``dpkg-query -W`` prints them;
- pip's records as importlib.metadata reads them, and the JDK as Debian installs it;
- the kernel: /proc/<pid>/map_files of a child this test starts, the environment and the root
  it was given, os.stat of the files it mapped;
- file layouts the test builds itself (site-packages/nvidia/*/lib, $CUDA_PATH/lib64, a JDK 8
  jre/lib/amd64 tree), whose meaning is the documented search of torch, cuda-pathfinder and
  the java launcher (cited in practice.py's docstring).
"""
import contextlib
import importlib.metadata
import os
import re
import shutil
import signal  # noqa: F811 (also at the top; here for the reader)
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from seedance.collect import practice, process
from seedance.model.report import Fact
from tests.conftest import write_ld_so_cache

SITE = sysconfig.get_paths()["purelib"]
LIBZ = "/usr/lib/x86_64-linux-gnu/libz.so.1"
JDK = "/usr/lib/jvm/java-17-openjdk-amd64"


@pytest.fixture(autouse=True)
def fresh_tables(monkeypatch):
    """practice.py reads RECORD files and dpkg's database once per process; each test starts clean."""
    monkeypatch.setattr(practice, "_RECORDS", {})
    monkeypatch.setattr(practice, "_DPKG", {})
    monkeypatch.setattr(practice, "_REAL_DIRS", {})


def touch(path, data=b"\x7fELF"):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


def dpkg_owner(path):
    """dpkg-query -S PATH -> package name without its architecture, or None."""
    proc = subprocess.run(["dpkg-query", "-S", path], capture_output=True, text=True, errors="replace")
    if proc.returncode != 0:
        return None
    return proc.stdout.splitlines()[0].split(": ", 1)[0].split(":", 1)[0]


_PIP_OWNERS: dict = {}


def pip_owner(path, site=SITE):
    """The distribution whose RECORD lists ``path``, as importlib.metadata reads it."""
    if site not in _PIP_OWNERS:
        owners = {}
        for dist in importlib.metadata.distributions(path=[site]):
            # PEP 503 normalisation of the distribution's own Name field
            name = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
            if name == "torch" or name.startswith("nvidia-"):  # the ones these tests ask about
                for item in dist.files or ():
                    owners[os.path.normpath(os.path.join(site, str(item)))] = name
        _PIP_OWNERS[site] = owners
    return _PIP_OWNERS[site].get(os.path.normpath(path))


# --- paths under site-packages ---------------------------------------------------------------

def test_site_packages_of_is_the_innermost_site_directory(monkeypatch, tmp_path):
    assert practice.site_packages_of("/a/site-packages/c.so") == "/a/site-packages"
    assert practice.site_packages_of("/site-packages/c.so") == "/site-packages"
    assert practice.site_packages_of("/v/site-packages/pkg/dist-packages/x/y.so") == \
        "/v/site-packages/pkg/dist-packages"
    assert practice.site_packages_of("/v/lib/site-packages") == "/v/lib/site-packages"
    assert practice.site_packages_of("/usr/lib/x86_64-linux-gnu/libz.so.1") is None
    monkeypatch.chdir(tmp_path)
    assert practice.site_packages_of("dist-packages/m/x.so") == str(tmp_path / "dist-packages")


def test_top_package_and_short_names():
    assert practice._top_package("/v/site-packages/torch/lib/libc10.so", "/v/site-packages") == "torch"
    assert practice._top_package("/v/site-packages/cupy", "/v/site-packages") == "cupy"
    assert practice.short("/home/u/.venv/lib/python3.11/site-packages/nvidia/cublas/lib/libcublas.so.12") == \
        "site-packages/nvidia/cublas/lib/libcublas.so.12"
    assert practice.short("/usr/lib/python3/dist-packages/numpy/core/x.so") == "dist-packages/numpy/core/x.so"
    assert practice.short("/usr/lib/libz.so.1") == "/usr/lib/libz.so.1"


def test_nvidia_wheel_libs_first_package_wins_and_skips_packages_without_lib(tmp_path):
    site = tmp_path / "site-packages"
    first = touch(site / "nvidia/a_first/lib/libshared.so.1")
    touch(site / "nvidia/b_second/lib/libshared.so.1")
    only = touch(site / "nvidia/b_second/lib/libonly.so.2")
    (site / "nvidia/aa_no_lib").mkdir(parents=True)
    assert practice.nvidia_wheel_libs(str(site)) == {"libshared.so.1": first, "libonly.so.2": only}
    assert practice.nvidia_wheel_libs(str(tmp_path / "nothing")) == {}


def test_nvidia_wheel_libs_of_the_venv_against_pips_records():
    lib = os.path.join(SITE, "nvidia", "cuda_runtime", "lib", "libcudart.so.12")
    if not os.path.isfile(lib) or pip_owner(lib) is None:
        pytest.skip("the nvidia-cuda-runtime-cu12 wheel is not installed here")
    found = practice.nvidia_wheel_libs(SITE)
    pip_owner(lib)
    for path in _PIP_OWNERS[SITE]:
        parts = Path(os.path.relpath(path, SITE)).parts
        if len(parts) == 4 and parts[0] == "nvidia" and parts[2] == "lib":
            assert found[parts[3]] == path


# --- which package ships a file ----------------------------------------------------------------

def test_package_of_a_pip_file_is_the_distribution_recorded_for_it():
    targets = [os.path.join(SITE, "torch", "lib", "libtorch_cpu.so"),
               os.path.join(SITE, "nvidia", "cuda_runtime", "lib", "libcudart.so.12"),
               os.path.join(SITE, "nvidia", "cuda_runtime", "lib", "libcudart.so.11.0")]
    checked = 0
    for path in targets:
        owner = pip_owner(path)
        if owner is None:
            continue
        assert practice.package_of(path) == owner
        checked += 1
    if not checked:
        pytest.skip("neither torch nor an NVIDIA wheel is installed in this interpreter")


def test_records_skip_a_dist_info_without_record_and_read_bytes_that_are_not_utf8(tmp_path):
    site = tmp_path / "site-packages"
    (site / "aaa-1.0.dist-info").mkdir(parents=True)  # no RECORD: a broken install
    (site / "Zed_Pkg-2.0.dist-info").mkdir()
    (site / "Zed_Pkg-2.0.dist-info" / "RECORD").write_bytes(
        b"zed/caf\xe9.so,sha256=abc,12\nzed/_core.so,sha256=def,34\n")
    (site / "zz-not-a-dist").mkdir()
    path = touch(site / "zed" / "_core.so")
    # the name as pip normalises it (PEP 503), whatever case and separator the directory uses
    assert practice.package_of(path) == "zed-pkg"
    assert practice.package_of(str(site / "zed" / "other.so")) is None


def test_records_are_read_once_per_site(tmp_path):
    site = tmp_path / "site-packages"
    (site / "one-1.dist-info").mkdir(parents=True)
    (site / "one-1.dist-info" / "RECORD").write_text("one/a.so,,\n")
    assert practice.package_of(str(site / "one" / "a.so")) == "one"
    (site / "two-1.dist-info").mkdir()
    (site / "two-1.dist-info" / "RECORD").write_text("two/b.so,,\n")
    assert practice.package_of(str(site / "two" / "b.so")) is None  # the table of the first read


def test_package_of_a_debian_file_matches_dpkg_query():
    if shutil.which("dpkg-query") is None or not os.path.exists(LIBZ):
        pytest.skip("no dpkg or no libz here")
    listed = subprocess.run(["dpkg-query", "-S", "*/libz.so.1"], capture_output=True, text=True,
                            errors="replace").stdout.splitlines()
    assert listed, "dpkg-query knows no libz.so.1"
    for line in listed:
        owner, path = line.split(": ", 1)
        assert practice.package_of(path) == owner.split(":", 1)[0]
        # the same file through the other half of the usrmerge (/lib -> usr/lib)
        other = path.replace("/usr/lib/", "/lib/", 1) if path.startswith("/usr/") else "/usr" + path
        if os.path.exists(other) and os.path.samefile(other, path):
            assert practice.package_of(other) == owner.split(":", 1)[0]
    assert practice.package_of("/usr/lib/x86_64-linux-gnu/no-such-library.so.9") is None


def test_dpkg_by_name_lists_every_package_and_path_dpkg_query_finds():
    if shutil.which("dpkg-query") is None:
        pytest.skip("no dpkg here")
    for name in ("__init__.py", "libz.so.1"):
        out = subprocess.run(["dpkg-query", "-S", "*/" + name], capture_output=True, text=True,
                             errors="replace").stdout
        expected = set()
        for line in out.splitlines():
            if line.startswith("diversion by"):
                continue
            owners, path = line.split(": ", 1)
            if os.path.basename(path) != name:
                continue
            for owner in owners.split(", "):
                expected.add((owner.split(":", 1)[0], path))
        assert set(practice._dpkg_by_name(name)) == expected, name


def test_dpkg_lists_are_read_once(monkeypatch, tmp_path):
    if shutil.which("dpkg-query") is None or not os.path.exists(LIBZ):
        pytest.skip("no dpkg or no libz here")
    first = practice._dpkg_by_name("libz.so.1")
    assert first
    monkeypatch.setattr(practice, "DPKG_INFO", str(tmp_path / "empty"))
    assert practice._dpkg_by_name("libc.so.6")  # from the lists read by the first call


@pytest.fixture
def admindir(tmp_path, monkeypatch):
    """A private dpkg database: dpkg-query --admindir reads it as it reads /var/lib/dpkg."""
    if shutil.which("dpkg-query") is None:
        pytest.skip("no dpkg here")
    root = tmp_path / "dpkg"
    info = root / "info"
    info.mkdir(parents=True)
    (root / "updates").mkdir()
    (info / "format").write_text("1\n")
    (root / "status").write_text(
        "Package: foo\nStatus: install ok installed\nArchitecture: amd64\nMulti-Arch: same\n"
        "Maintainer: t <t@t>\nVersion: 1.0\nDescription: t\n\n"
        "Package: bar\nStatus: install ok installed\nArchitecture: all\nMaintainer: t <t@t>\n"
        "Version: 2\nDepends: foo (>= 1.0), baz | quux:any\nPre-Depends: qux\nDescription: t\n\n")
    (info / "foo:amd64.list").write_bytes(b"/.\n/usr\n/usr/share/foo/caf\xe9.txt\n/usr/share/foo/READMEX\n"
                                          b"/usr/share/foo/trailing \n/usr/lib/libfoo.so.1\n")
    (info / "bar.list").write_bytes(b"/.\n/usr/bin/bar\n")
    monkeypatch.setattr(practice, "DPKG_INFO", str(info))
    return root


def dpkg_query_files(root, package):
    out = subprocess.run(["dpkg-query", "--admindir", str(root), "-L", package], capture_output=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.decode("utf-8", "replace").splitlines()


def test_dpkg_files_of_matches_dpkg_query_on_a_private_database(admindir):
    for package in ("foo", "bar"):
        assert practice.dpkg_files_of(package) == dpkg_query_files(admindir, package)
    assert practice.dpkg_files_of("nothing") == []


def test_dpkg_files_of_the_system_matches_dpkg_query():
    if shutil.which("dpkg-query") is None:
        pytest.skip("no dpkg here")
    for package in ("zlib1g", "dpkg"):
        out = subprocess.run(["dpkg-query", "-L", package], capture_output=True)
        if out.returncode != 0:
            continue
        assert practice.dpkg_files_of(package) == out.stdout.decode("utf-8", "replace").splitlines()


def test_dpkg_files_of_without_a_database(monkeypatch, tmp_path):
    monkeypatch.setattr(practice, "DPKG_INFO", str(tmp_path / "no-dpkg" / "info"))
    assert practice.dpkg_files_of("zlib1g") == []
    assert practice.dpkg_dependents("zlib1g") == []


def test_package_of_on_a_private_database_matches_dpkg_query(admindir, tmp_path):
    out = subprocess.run(["dpkg-query", "--admindir", str(admindir), "-S", "*/libfoo.so.1"],
                         capture_output=True, text=True)
    owner, path = out.stdout.splitlines()[0].split(": ", 1)
    assert practice._dpkg_by_name("libfoo.so.1") == [(owner.split(":", 1)[0], path)]


def apt_rdepends(package):
    """Installed packages that Depend or Pre-Depend on ``package``, as apt reads dpkg's status."""
    out = subprocess.run(["apt-cache", "rdepends", "--installed", "--no-recommends", "--no-suggests",
                          "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", package],
                         capture_output=True, text=True, errors="replace").stdout.splitlines()
    start = out.index("Reverse Depends:")
    return {line.strip().lstrip("|").split(":", 1)[0] for line in out[start + 1:] if line.strip()}


def test_dpkg_dependents_match_apt():
    if shutil.which("apt-cache") is None or shutil.which("dpkg-query") is None:
        pytest.skip("no apt here")
    if subprocess.run(["dpkg-query", "-W", "zlib1g"], capture_output=True).returncode != 0:
        pytest.skip("zlib1g is not installed here")
    # dpkg itself Pre-Depends on zlib1g, dozens of packages Depend on it
    assert set(practice.dpkg_dependents("zlib1g")) == apt_rdepends("zlib1g")
    assert practice.dpkg_dependents("zlib1g") == sorted(practice.dpkg_dependents("zlib1g"))


def test_dpkg_dependents_through_an_architecture_qualifier():
    """`Depends: python3:any` names python3 (deb-control(5): an arch-qualified dependency)."""
    if shutil.which("dpkg-query") is None:
        pytest.skip("no dpkg here")
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${Depends}, ${Pre-Depends}\n"],
                         capture_output=True, text=True, errors="replace").stdout
    qualified = {line.split("\t", 1)[0] for line in out.splitlines()
                 if re.search(r"(^|[\t ,|])python3:any([ ,]|$)", line.split("\t", 1)[1])}
    if not qualified:
        pytest.skip("no installed package depends on python3:any")
    assert qualified <= set(practice.dpkg_dependents("python3"))


def test_dpkg_dependents_of_a_private_database(admindir):
    assert practice.dpkg_dependents("foo") == ["bar"]
    assert practice.dpkg_dependents("baz") == ["bar"]
    assert practice.dpkg_dependents("quux") == ["bar"]
    assert practice.dpkg_dependents("qux") == ["bar"]  # Pre-Depends
    assert practice.dpkg_dependents("bar") == []
    # dpkg itself refuses to remove foo because of bar
    out = subprocess.run(["dpkg", "--admindir", str(admindir), "--no-act", "-r", "foo"],
                         capture_output=True, text=True)
    assert " bar depends on foo" in out.stdout + out.stderr


# --- what a package loads first ----------------------------------------------------------------

def test_preload_plan_of_torch_names_the_wheel_and_its_distribution():
    lib = os.path.join(SITE, "torch", "lib", "libtorch_cpu.so")
    provider = os.path.join(SITE, "nvidia", "cuda_runtime", "lib", "libcudart.so.12")
    if not (os.path.isfile(lib) and os.path.isfile(provider)):
        pytest.skip("torch and nvidia-cuda-runtime-cu12 are not both installed here")
    plan = practice.preload_plan(lib, {"libcudart.so.12", "libnothing-here.so.7"})
    assert plan == {provider: (
        "torch/__init__.py _load_global_deps() loads site-packages/nvidia/cuda_runtime/lib/libcudart.so.12 "
        "RTLD_GLOBAL before its own libraries", pip_owner(provider))}
    assert pip_owner(provider) == "nvidia-cuda-runtime-cu12"
    assert practice.preload_plan(lib, set()) == {}


def test_preload_plan_per_package(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    site = tmp_path / "site-packages"
    wheel = touch(site / "nvidia/cublas/lib/libcublas.so.13")
    toolkit = tmp_path / "cuda"
    touch(toolkit / "lib64/libcublas.so.13")
    touch(toolkit / "lib64/libcufft.so.12")
    monkeypatch.setenv("CUDA_PATH", str(toolkit))
    # a sibling NVIDIA wheel: provided by the wheel
    plan = practice.preload_plan(str(site / "nvidia/cusolver/lib/libcusolver.so.12"), {"libcublas.so.13"})
    assert plan == {wheel: ("the NVIDIA wheels are loaded after their siblings: torch (torch/__init__.py "
                            "_load_global_deps) and cupy (cuda-pathfinder) load "
                            "site-packages/nvidia/cublas/lib/libcublas.so.13 first", "")}
    # cupy: the wheel first, then the CUDA Toolkit (cuda-pathfinder's order)
    plan = practice.preload_plan(str(site / "cupy/_core/core.so"), {"libcublas.so.13", "libcufft.so.12"})
    assert list(plan) == [wheel, str(toolkit / "lib64/libcufft.so.12")]
    assert plan[wheel][0] == ("cupy loads site-packages/nvidia/cublas/lib/libcublas.so.13 through "
                              "cuda-pathfinder before the module that needs it")
    # torch does not look in the toolkit, and a package that loads nothing first gets nothing
    assert practice.preload_plan(str(site / "torch/lib/libtorch.so"), {"libcufft.so.12"}) == {}
    assert practice.preload_plan(str(site / "numpy/core/x.so"), {"libcublas.so.13"}) == {}
    assert practice.preload_plan(str(tmp_path / "elsewhere/x.so"), {"libcublas.so.13"}) == {}


def test_cuda_toolkit_lib_follows_cuda_path_then_cuda_home_then_usr_local(tmp_path, monkeypatch):
    first, second = tmp_path / "path", tmp_path / "home"
    touch(first / "lib64/libboth.so.1")
    touch(second / "lib64/libboth.so.1")
    touch(second / "targets/x86_64-linux/lib/libtargets.so.1")
    monkeypatch.setenv("CUDA_PATH", str(first))
    monkeypatch.setenv("CUDA_HOME", str(second))
    assert practice._cuda_toolkit_lib("libboth.so.1") == str(first / "lib64/libboth.so.1")
    assert practice._cuda_toolkit_lib("libtargets.so.1") == str(second / "targets/x86_64-linux/lib/libtargets.so.1")
    assert practice._cuda_toolkit_lib("libnone.so.1") is None
    (first / "lib64/libdir.so.1").mkdir()
    assert practice._cuda_toolkit_lib("libdir.so.1") is None  # a directory is not a library
    monkeypatch.delenv("CUDA_PATH")
    monkeypatch.delenv("CUDA_HOME")
    real = "/usr/local/cuda/lib64/libcudart.so.13"
    if os.path.isfile(real):
        assert practice._cuda_toolkit_lib("libcudart.so.13") == real


def test_preload_plan_of_a_debian_jdk_library():
    lib, jvm = os.path.join(JDK, "lib", "libjava.so"), os.path.join(JDK, "lib", "server", "libjvm.so")
    if not (os.path.isfile(lib) and os.path.isfile(jvm)):
        pytest.skip("OpenJDK 17 is not installed here")
    owner = dpkg_owner(jvm)
    assert practice.preload_plan(lib, {"libjvm.so", "libz.so.1"}) == {jvm: (
        f"the java launcher (libjli, LoadJavaVM) loads {jvm} RTLD_GLOBAL before any JDK library", owner or "")}
    assert owner  # Debian ships it
    assert practice.preload_plan(lib, {"libz.so.1"}) == {}


def test_preload_plan_of_a_jdk8_layout(tmp_path):
    home = tmp_path / "jdk8"
    jvm = touch(home / "jre/lib/amd64/server/libjvm.so")
    lib = touch(home / "jre/lib/amd64/libjava.so")
    assert practice._jdk_home(lib) == str(home)
    assert practice.preload_plan(lib, {"libjvm.so"}) == {jvm: (
        f"the java launcher (libjli, LoadJavaVM) loads {jvm} RTLD_GLOBAL before any JDK library", "")}
    # a library deeper than JDK 8's jre/lib/amd64 is no JDK library
    assert practice._jdk_home(touch(home / "a/b/c/d/libdeep.so")) is None
    assert practice._jdk_home("/libtop.so") is None


def test_preloader_hint_per_package(tmp_path):
    site = tmp_path / "site-packages"
    (site / "cupy_cuda13x-13.6.0.dist-info").mkdir(parents=True)
    (site / "cupy_cuda13x-13.6.0.dist-info" / "RECORD").write_text("cupy/_core/core.so,,\n")
    assert practice.preloader_hint(str(site / "cupy/_core/core.so")) == (
        "; cupy loads it (cuda-pathfinder) from an NVIDIA wheel or the CUDA Toolkit when this module is "
        "first used, and none is installed: pip install \"cupy-cuda13x[ctk]\"")
    assert practice.preloader_hint(str(site / "cupy_backends/x.so")).endswith('pip install "cupy-cuda12x[ctk]"')
    torch_hint = "; torch loads it from site-packages/nvidia/*/lib, and no NVIDIA wheel there has it"
    assert practice.preloader_hint(str(site / "torch/lib/libtorch.so")) == torch_hint
    assert practice.preloader_hint(str(site / "nvidia/cublas/lib/libcublas.so.13")) == torch_hint
    assert practice.preloader_hint(str(site / "numpy/x.so")) == ""
    assert practice.preloader_hint("/usr/lib/x86_64-linux-gnu/libz.so.1") == ""


def test_optional_plugins():
    assert practice.optional_plugin("/opt/nccl/lib/libnccl-net-ofi.so") == \
        "NCCL loads a network plugin only when NCCL_NET_PLUGIN names it"
    assert practice.optional_plugin("/usr/lib/x86_64-linux-gnu/libz.so.1") is None


# --- libraries of the NVIDIA driver ------------------------------------------------------------

def host_has_driver():
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, errors="replace").stdout
    return "libcuda.so.1 " in out or any(
        os.path.exists(os.path.join(d, "libcuda.so.1"))
        for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/lib/wsl/lib"))


@pytest.fixture
def cache_with_libcuda(tmp_path):
    """An ld.so.cache (written by ldconfig) that lists a gcc-built libcuda.so.1."""
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    libdir = tmp_path / "drv"
    libdir.mkdir()
    (tmp_path / "c.c").write_text("int cuInit(unsigned f) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(libdir / "libcuda.so.1"),
                    str(tmp_path / "c.c")], check=True)
    (tmp_path / "ld.conf").write_text(f"{libdir}\n")
    cache = tmp_path / "ld.so.cache"
    write_ld_so_cache(cache, tmp_path / "ld.conf")
    listed = subprocess.run(["ldconfig", "-p", "-C", str(cache)], capture_output=True, text=True).stdout
    assert "libcuda.so.1 " in listed
    return str(cache)


def test_driver_library_on_a_host_without_the_driver(monkeypatch, tmp_path):
    if host_has_driver():
        pytest.skip("this host has the NVIDIA driver")
    from seedance.resolve.resolver import Resolver
    monkeypatch.chdir(tmp_path)
    touch(tmp_path / "libcuda.so.1")  # a file of that name in the working directory is no driver
    assert practice.driver_absent("libcuda.so.1", Resolver()) == (
        "libcuda.so.1 is installed by the NVIDIA driver, and this host has none (no GPU); "
        "it loads where the driver is")
    assert practice.driver_absent("libz.so.1") is None
    monkeypatch.setattr(practice, "_DPKG", {})  # ask again, with a cache that cannot be read
    assert practice.driver_absent("libnvidia-ml.so.1", Resolver(cache_path=str(tmp_path / "no-cache"))) \
        .startswith("libnvidia-ml.so.1 is installed by the NVIDIA driver")


def test_driver_found_in_the_ld_cache_and_remembered(cache_with_libcuda):
    from seedance.resolve.resolver import Resolver
    assert practice.driver_absent("libcuda.so.1", Resolver(cache_path=cache_with_libcuda)) is None
    # read once: later questions without a resolver get the same answer
    assert practice.driver_absent("libnvidia-ml.so.1") is None


# --- copies the loader does not see ---------------------------------------------------------

def test_installed_copies(tmp_path):
    site = tmp_path / "site-packages"
    wheel = touch(site / "nvidia/cuda_runtime/lib/libcudart.so.12")
    requester = str(site / "torch/lib/libtorch_cuda.so")
    mine = touch(tmp_path / "tree/libcudart.so.12")
    assert practice.installed_copies("libcudart.so.12", requester, {"libcudart.so.12": [mine, mine]}) == \
        [mine, wheel]
    assert practice.installed_copies("libcudart.so.12", requester, {"libcudart.so.12": [wheel]}) == [wheel]
    assert practice.installed_copies("lib/libcudart.so.12", requester, {"lib/libcudart.so.12": [mine]}) == []
    many = [touch(tmp_path / f"t{i}/libmany.so") for i in range(7)]
    assert practice.installed_copies("libmany.so", "/x/y.so", {"libmany.so": many}) == many[:5]


def test_installed_copies_from_debian_packages(tmp_path):
    if shutil.which("dpkg-query") is None or not os.path.exists(LIBZ):
        pytest.skip("no dpkg or no libz here")
    listed = [line.split(": ", 1)[1] for line in subprocess.run(
        ["dpkg-query", "-S", "*/libz.so.1"], capture_output=True, text=True).stdout.splitlines()]
    existing = [p for p in listed if os.path.exists(p)]
    assert practice.installed_copies("libz.so.1", "/x/y.so", {}) == existing
    # the same file already found under another name is not repeated
    other = "/usr" + existing[0] if not existing[0].startswith("/usr/") else existing[0].replace("/usr", "", 1)
    if os.path.exists(other) and os.path.samefile(other, existing[0]) and other not in existing:
        assert practice.installed_copies("libz.so.1", "/x/y.so", {"libz.so.1": [other]}) == [other]


# --- a running process, read from /proc ---------------------------------------------------------

CHILD = r"""
import ctypes, mmap, os, sys
lib = ctypes.CDLL(sys.argv[1])
data = open(sys.argv[2], "rb")
keep = [mmap.mmap(data.fileno(), 0, prot=mmap.PROT_READ)]
zero = open("/dev/zero", "r+b")
keep.append(mmap.mmap(zero.fileno(), 4096, flags=mmap.MAP_SHARED))
fd = os.memfd_create("seedance-test")
os.ftruncate(fd, 4096)
keep.append(mmap.mmap(fd, 4096))
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shmid = libc.shmget(0, 4096, 0o1600)
if shmid >= 0:
    libc.shmat(shmid, None, 0)
    libc.shmctl(shmid, 0, None)  # IPC_RMID once detached
print("up", flush=True)
for line in sys.stdin:
    if line.startswith("chroot "):
        os.chroot(line.split(" ", 1)[1].strip())
    print("ok", flush=True)
"""


@pytest.fixture
def child(tmp_path):
    """A python that has dlopened a private copy of libz (its name holds a space), mapped a data
    file, /dev/zero, a memfd and a SysV segment, with an environment the test wrote."""
    if not os.path.exists(LIBZ):
        pytest.skip("libz.so.1 not installed")
    lib = tmp_path / "lib z copy.so.1"
    shutil.copy(os.path.realpath(LIBZ), lib)
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(8192))
    env = {b"PATH": os.environb.get(b"PATH", b"/usr/bin"), b"PLAIN": b"one two",
           b"EQUALS": b"a=b=c", b"BYTES": b"caf\xe9", b"K\xffEY": b"v", b"EMPTY": b""}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(lib), str(data)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "up"
    yield proc, lib, data, env
    proc.stdin.close()
    proc.wait(timeout=10)


def kernel_ranges(pid):
    """path -> the lowest address range the kernel lists for it in /proc/PID/map_files."""
    ranges = {}
    base = f"/proc/{pid}/map_files"
    for entry in sorted(os.listdir(base), key=lambda r: int(r.split("-")[0], 16)):
        try:
            target = os.readlink(os.path.join(base, entry))
        except OSError:
            continue
        ranges.setdefault(target, entry)
    return ranges


def test_read_process_of_a_child(child):
    proc, lib, data, env = child
    view = process.read_process(proc.pid)
    assert view.pid == proc.pid
    assert view.exe == os.path.realpath(sys.executable)
    assert view.root == "/"
    assert view.environ == {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in env.items()}
    ranges = kernel_ranges(proc.pid)
    paths = [m.path for m in view.mappings]
    assert len(paths) == len(set(paths))
    for path in (str(lib), str(data), view.exe):
        [mapping] = [m for m in view.mappings if m.path == path]
        st = os.stat(path)
        assert (mapping.inode, mapping.range, mapping.deleted) == (st.st_ino, ranges[path], False)
        assert mapping.dev == f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    # file-backed only: no /dev, memfd or SysV segment, no anonymous mapping
    assert not [p for p in paths if p.startswith(("/dev/", "/memfd:", "/SYSV")) or not p.startswith("/")]
    # every regular file the kernel lists is there, in address order
    files = [p for p in ranges if p.startswith("/") and not p.startswith(("/dev/", "/memfd:", "/SYSV"))
             and os.path.isfile(p)]
    assert [p for p in paths if p in files] == sorted(files, key=lambda p: int(ranges[p].split("-")[0], 16))


def test_mapped_lib_facts_of_a_child(child):
    proc, lib, data, _env = child
    view = process.read_process(proc.pid)
    facts = {f.subject["path"]: f for f in process.mapped_lib_facts(view)}
    st = os.stat(lib)
    assert facts[str(lib)] == Fact("mapped_lib", {"pid": proc.pid, "path": str(lib)},
                                   {"deleted": False, "replaced": False, "state": "ok", "mapped_inode": st.st_ino,
                                    "disk_inode": st.st_ino, "exe": view.exe, "where": "",
                                    "restart": f"restart pid {proc.pid} ({view.comm})"},
                                   source="collect.process")
    assert view.comm  # a host process is named by its comm in the fix
    assert facts[view.exe].data["state"] == "ok"  # the executable, though its name has no ".so"
    assert str(data) not in facts  # a mapped data file is no library
    assert os.path.realpath(LIBZ) not in facts or facts[os.path.realpath(LIBZ)].data["state"] == "ok"
    assert set(facts) == {m.path for m in view.mappings if ".so" in os.path.basename(m.path) or m.path == view.exe}


def test_a_library_replaced_under_a_name_that_was_never_unlinked(child, tmp_path):
    """A file bind-mounted over the mapped path (what a container runtime does): the mapped
    dentry is not unlinked, so maps shows no "(deleted)"; only /proc/PID/map_files tells the
    two files apart."""
    proc, lib, _data, _env = child
    other = tmp_path / "other.so"
    shutil.copy(lib, other)
    if subprocess.run(["mount", "--bind", str(other), str(lib)], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount here")
    try:
        view = process.read_process(proc.pid)
        [mapping] = [m for m in view.mappings if m.path == str(lib)]
        assert not mapping.deleted
        [fact] = [f for f in process.mapped_lib_facts(view) if f.subject["path"] == str(lib)]
    finally:
        subprocess.run(["umount", str(lib)], check=True)
    assert (fact.data["state"], fact.data["replaced"], fact.data["deleted"]) == ("replaced", True, False)
    assert fact.data["disk_inode"] == os.stat(other).st_ino != fact.data["mapped_inode"]


def as_nobody(work) -> str:
    """``work()`` (returning a str) in a forked copy of this test dropped to nobody, its answer
    (or the exception it raised, as text) read back through a pipe: root passes every permission
    check the product must handle."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(reader)
        try:
            os.setgid(65534)
            os.setuid(65534)
            answer = work()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            answer = type(exc).__name__ + ": " + str(exc)
        try:
            os.write(writer, answer.encode(errors="replace"))
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        answer = pipe.read()
    os.waitpid(pid, 0)
    return answer.decode(errors="replace")


def test_disk_state_of_a_library_the_reader_cannot_look_at(child):
    """stat() fails with EACCES for a reader who may not enter the directory: "unknown", unless
    the kernel marked the mapping deleted.  The reader is a forked copy of this test dropped to
    nobody (root can enter every directory)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another user")
    proc, lib, _data, _env = child
    view = process.read_process(proc.pid)
    [mapping] = [m for m in view.mappings if m.path == str(lib)]
    os.chmod(lib.parent, 0o700)

    def both_states():
        root = process._open_root(view)
        answers = [process._disk_state(view, mapping, root)]
        mapping.deleted = True
        answers.append(process._disk_state(view, mapping, root))
        return repr(answers)

    assert as_nobody(both_states) == repr([("unknown", None), ("deleted", None)])


def test_a_deleted_library_whose_directory_became_a_file(child, tmp_path):
    """stat() of the old path fails with ENOTDIR, not ENOENT: still "deleted"."""
    proc, lib, _data, _env = child
    view = process.read_process(proc.pid)
    [mapping] = [m for m in view.mappings if m.path == str(lib)]
    inner = tmp_path / "sub"
    inner.mkdir()
    moved = inner / lib.name
    os.rename(lib, moved)  # the kernel follows the rename: maps names the new path
    view = process.read_process(proc.pid)
    [mapping] = [m for m in view.mappings if m.path == str(moved)]
    moved.unlink()
    inner.rmdir()
    inner.write_bytes(b"")
    view = process.read_process(proc.pid)
    [mapping] = [m for m in view.mappings if m.path == str(moved)]
    assert mapping.deleted
    with pytest.raises(NotADirectoryError):
        os.stat(moved)
    [fact] = [f for f in process.mapped_lib_facts(view) if f.subject["path"] == str(moved)]
    assert (fact.data["state"], fact.data["deleted"], fact.data["disk_inode"]) == ("deleted", True, None)


def test_deleted_executable_and_its_fact(tmp_path):
    exe = tmp_path / "sleeper"
    shutil.copy(shutil.which("sleep"), exe)
    proc = subprocess.Popen([str(exe), "30"])
    try:
        for _ in range(500):  # until the kernel has mapped the new program (execve done)
            with open(f"/proc/{proc.pid}/maps", "rb") as handle:
                if os.fsencode(str(exe)) in handle.read():
                    break
            time.sleep(0.01)
        exe.unlink()
        view = process.read_process(proc.pid)
        assert os.readlink(f"/proc/{proc.pid}/exe") == f"{exe} (deleted)"  # what the kernel says
        assert view.exe == str(exe)
        facts = [f for f in process.mapped_lib_facts(view) if f.subject["path"] == str(exe)]
        assert [(f.data["state"], f.data["deleted"], f.data["disk_inode"]) for f in facts] == [("deleted", True, None)]
    finally:
        proc.kill()
        proc.wait()


def test_root_of_a_chrooted_child(child, tmp_path):
    proc, _lib, _data, _env = child
    jail = tmp_path / "jail"
    jail.mkdir()
    proc.stdin.write(f"chroot {jail}\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "ok"
    view = process.read_process(proc.pid)
    assert view.root == str(jail)
    assert view.host_path("/usr/lib/x.so") == f"/proc/{proc.pid}/root/usr/lib/x.so"


def test_vanished_process_names_its_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(process.ProcessGone) as info:
        process.read_process(proc.pid)
    assert info.value.args == (proc.pid,)


def test_a_process_of_another_user_is_a_permission_error():
    """Not ours: maps needs ptrace read access (proc(5)); that is PermissionError, not ProcessGone."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another user")
    target = os.getpid()

    def read_it():
        try:
            process.read_process(target)
            return "read"
        except PermissionError:
            return "PermissionError"
        except process.ProcessGone:
            return "ProcessGone"

    assert as_nobody(read_it) == "PermissionError"


def test_all_pids_lists_this_process_and_its_child():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        pids = process.all_pids()
        assert os.getpid() in pids and proc.pid in pids
        assert pids == sorted(pids) and all(isinstance(p, int) for p in pids)
    finally:
        proc.stdin.close()
        proc.wait()


# --- the CUDA runtimes a process maps ---------------------------------------------------------

def soname(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, errors="replace").stdout
    match = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", out)
    return match.group(1) if match else None


@contextlib.contextmanager
def python_child(setup: str, *args, env=None):
    """A python child that runs ``setup`` (with ``args`` in sys.argv), says "up" and waits:
    (the Popen, process.read_process of it) while it runs; it is stopped after."""
    proc = subprocess.Popen([sys.executable, "-c", setup + "print('up', flush=True); sys.stdin.read()", *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "up"
        yield proc, process.read_process(proc.pid)
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


def test_runtime_facts_of_a_process_that_loaded_libcudart(tmp_path):
    wheel = os.path.join(SITE, "nvidia", "cuda_runtime", "lib", "libcudart.so.12")
    if not os.path.isfile(wheel) or shutil.which("readelf") is None:
        pytest.skip("the nvidia-cuda-runtime-cu12 wheel is not installed here")
    # an unversioned file name: only the SONAME says which major it is
    renamed = tmp_path / "libcudart.so"
    shutil.copy(wheel, renamed)
    major = int(re.match(r"libcudart\.so\.(\d+)", soname(str(renamed))).group(1))
    others = [os.path.realpath(p) for p in ("/usr/local/cuda/lib64/libcudart.so.13",) if os.path.isfile(p)]
    with python_child("import ctypes, sys\nfor p in sys.argv[1:]: ctypes.CDLL(p)\n", str(renamed), *others) \
            as (proc, view):
        facts = process.runtime_facts(view)
    mapped = {str(renamed): major}
    for path in others:
        mapped[path] = int(re.match(r"libcudart\.so\.(\d+)", soname(path)).group(1))
    assert facts == [Fact("cuda_runtimes", {"pid": proc.pid, "path": view.exe},
                          {"majors": sorted(set(mapped.values())), "paths": sorted(mapped), "via": "process"},
                          source="collect.process")]


def test_runtime_facts_of_a_process_without_libcudart(child):
    proc, _lib, _data, _env = child
    assert process.runtime_facts(process.read_process(proc.pid)) == []


# --- the LD_PRELOAD a process started with ------------------------------------------------------

def test_preload_facts_of_a_child(tmp_path):
    if not os.path.exists(LIBZ):
        pytest.skip("libz.so.1 not installed")
    open_dir = tmp_path / "drop"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    inject = open_dir / "libinject.so"
    shutil.copy(os.path.realpath(LIBZ), inject)
    gone = tmp_path / "gone.so"
    gone2 = tmp_path / "gone2.so"
    value = f"libz.so.1 {gone}:{gone2} {inject}"
    with python_child("import sys\n", env=dict(os.environ, LD_PRELOAD=value)) as (proc, view):
        facts = process.preload_facts(view)
    assert len(facts) == 1
    fact = facts[0]
    assert (fact.kind, fact.subject, fact.source) == ("config_env", {"pid": proc.pid, "path": view.exe},
                                                      "collect.process")
    problem = fact.data["problem"]
    missing = f"preload {gone} does not exist; preload {gone2} does not exist; preload from an unsafe path: "
    assert problem.startswith(missing) and str(open_dir) in problem[len(missing):]
    assert {k: v for k, v in fact.data.items() if k != "problem"} == {
        "key": "LD_PRELOAD", "value": value, "line": None, "expands_early": False, "variables": [],
        "preload_missing": True, "preload_writable": True, "use": "preload"}


def test_preload_facts_without_a_preload(child):
    proc, _lib, _data, _env = child
    view = process.read_process(proc.pid)
    assert "LD_PRELOAD" not in view.environ and process.preload_facts(view) == []
    view.environ["LD_PRELOAD"] = "  "
    assert process.preload_facts(view) == []
    view.environ["LD_PRELOAD"] = "libz.so.1"
    view.exe = None
    [fact] = process.preload_facts(view)
    assert fact.subject == {"pid": proc.pid, "path": f"/proc/{proc.pid}"}
    assert (fact.data["problem"], fact.data["preload_missing"], fact.data["preload_writable"]) == ("", False, False)


def test_host_path_through_the_root(tmp_path):
    """A process of our own root: its paths are the host's.  One in another root (a container,
    a chroot): the path is resolved inside /proc/PID/root, so an absolute link there never
    leads to a host file, and a name that resolves nowhere opens nothing."""
    view = process.ProcessView(pid=4242, exe=None, root="/")
    assert view.host_path("/usr/lib/libz.so.1") == "/usr/lib/libz.so.1"
    view.root = ""
    assert view.host_path("/usr/lib/libz.so.1") == "/usr/lib/libz.so.1"
    me = os.getpid()
    view = process.ProcessView(pid=me, exe=None, root="/", foreign=True)
    inside = view.host_path("/usr/lib/x86_64-linux-gnu/libc.so.6")
    assert inside.startswith(f"/proc/{me}/root/") and os.path.exists(inside)
    view = process.ProcessView(pid=999_999_999, exe=None, root="/srv/jail", foreign=True)
    assert not os.path.exists(view.host_path("/usr/lib/libz.so.1"))


DRIVER_CHILD = "from seedance.collect import practice; import sys; " \
               "print(sys.argv[1], __import__('os').path.exists(sys.argv[1]), practice.driver_absent('libcuda.so.1'))"


@pytest.mark.parametrize("where", ["/usr/lib64", "/usr/lib", "/usr/lib/wsl/lib"])
def test_driver_installed_in_each_directory_the_driver_uses(tmp_path, where):
    """A libcuda.so.1 in one of the directories NVIDIA's installers use (the distribution's
    libdirs, WSL's /usr/lib/wsl/lib): a child in a private mount namespace sees it there,
    through an overlay on the existing directory, and takes the driver as installed."""
    if host_has_driver():
        pytest.skip("this host has the NVIDIA driver")
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare(1) and root for a private mount namespace")
    base = where if os.path.isdir(where) else "/usr/lib"
    if not os.path.isdir(base) or os.path.islink(base):
        pytest.skip(f"{base} is not a directory here")
    upper, work = tmp_path / "upper", tmp_path / "work"
    work.mkdir()
    touch(upper / os.path.relpath(where, base) / "libcuda.so.1")
    script = (f"mount -t overlay overlay -o lowerdir={base},upperdir={upper},workdir={work} {base} && "
              f'exec "$0" -c "$1" "$2"')
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, sys.executable,
                           DRIVER_CHILD, os.path.join(where, "libcuda.so.1")],
                          capture_output=True, text=True, errors="replace", timeout=60)
    if "mount" in proc.stderr and proc.returncode != 0:
        pytest.skip(f"cannot mount an overlay here: {proc.stderr.strip()}")
    assert proc.stdout.split() == [os.path.join(where, "libcuda.so.1"), "True", "None"], proc.stderr


def test_a_fifo_among_the_dpkg_lists_reads_as_empty_and_never_blocks(tmp_path, monkeypatch):

    info = tmp_path / "info"
    info.mkdir()
    (info / "foo.list").write_bytes(b"/.\n/usr/lib/libfoo.so.1\n")
    os.mkfifo(info / "stuck.list")  # no writer: a blocking open would wait for ever
    monkeypatch.setattr(practice, "DPKG_INFO", str(info))
    monkeypatch.setattr(practice, "_DPKG", {})

    def hung(*_):
        raise AssertionError("reading the dpkg lists blocked on a FIFO")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        lists = practice._dpkg_lists()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert lists == [("foo", b"/.\n/usr/lib/libfoo.so.1\n"), ("stuck", b"")]
    assert practice._dpkg_by_name("libfoo.so.1") == [("foo", "/usr/lib/libfoo.so.1")]
