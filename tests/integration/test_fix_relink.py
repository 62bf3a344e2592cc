"""seedance fix cuda-mismatch against real NVIDIA runtimes, real torch libraries and real ld.so.

Fixtures are built here with gcc against the nvidia-cuda-runtime-cu12 wheel's libcudart.so.12;
the CUDA 13 toolkit's libcudart.so.13 (/usr/local/cuda, in ld.so.cache) is the target.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import run_cli

SITE = Path(sysconfig.get_paths()["purelib"])
CU12 = SITE / "nvidia" / "cuda_runtime" / "lib"
CU13 = Path("/usr/local/cuda/lib64/libcudart.so.13")
TORCH_LIB = SITE / "torch" / "lib"

pytestmark = pytest.mark.skipif(not (CU12 / "libcudart.so.12").exists() or not CU13.exists(),
                                reason="needs the cu12 runtime wheel and the CUDA 13 toolkit")

MAPPED = ("import ctypes, os, sys; ctypes.CDLL(sys.argv[1], os.RTLD_NOW);"
          "print(*sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libcudart' in l}))")


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def gcc(out, source, *args):
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src), *args], check=True)
    return out


def build_mixed(d: Path) -> dict:
    """libapp.so uses CUDA 13 itself and loads libkern.so, which was linked against CUDA 12
    and also against torch's libc10.so: the closure mixes runtime majors 12 and 13."""
    kern = gcc(d / "libkern.so",
               "int cudaGetDeviceCount(int*); int cudaRuntimeGetVersion(int*);\n"
               "int kern_version(void){int v=0; cudaRuntimeGetVersion(&v); return v;}\n"
               "int kern_count(void){int n=0; cudaGetDeviceCount(&n); return n;}\n",
               f"-L{CU12}", "-l:libcudart.so.12", f"-L{TORCH_LIB}", "-Wl,--no-as-needed", "-lc10",
               f"-Wl,-rpath,{CU12}:{TORCH_LIB}")
    app = gcc(d / "libapp.so",
              "int cudaGetDeviceCount(int*); int kern_count(void);\n"
              "int app(void){int n; cudaGetDeviceCount(&n); return kern_count();}\n",
              "-L/usr/local/cuda/lib64", "-l:libcudart.so.13", f"-L{d}", "-lkern", f"-Wl,-rpath,{d}")
    return {"kern": kern, "app": app}


@pytest.fixture
def env(tmp_path):
    return {"XDG_STATE_HOME": str(tmp_path / "state"), "LD_LIBRARY_PATH": ""}


def test_mixed_closure_is_relinked_to_the_runtime_asked_for(tmp_path, env):
    libs = build_mixed(tmp_path)
    kern = libs["kern"]
    original = sha(kern)
    before = run_cli("check", "--report-json", "-", libs["app"], env=env)
    assert "cuda-runtime-mixed" in {f["rule"] for f in json.loads(before.stdout)["findings"]}

    dry = run_cli("fix", "cuda-mismatch", "--auto-relink", "--runtime", "13", "--dry-run", libs["app"], env=env)
    assert dry.returncode == 0, dry.stderr
    assert "- NEEDED libcudart.so.12" in dry.stdout and "+ NEEDED libcudart.so.13" in dry.stdout
    assert "zero growth" in dry.stdout
    assert sha(kern) == original and not (tmp_path / "state").exists()

    fix = run_cli("fix", "cuda-mismatch", "--auto-relink", "--runtime", "13", "--verbose", libs["app"], env=env)
    assert fix.returncode == 0, fix.stdout + fix.stderr
    assert "check again: 1 of 1 finding(s) gone, 0 remaining" in fix.stdout
    assert os.path.getsize(kern) == os.path.getsize(tmp_path / "libkern.so")  # same path, same size
    # ldd (the real loader) shows the intended resolution, torch's libc10 still from torch
    ldd = subprocess.run(["ldd", str(kern)], capture_output=True, text=True).stdout
    assert f"libcudart.so.13 => {os.path.realpath(CU13)}" in ldd or "libcudart.so.13 => /usr/local/cuda" in ldd
    assert "libcudart.so.12" not in ldd
    assert f"libc10.so => {TORCH_LIB}/libc10.so" in ldd
    # it loads in a fresh process and maps only the CUDA 13 runtime
    loaded = subprocess.run([sys.executable, "-c", MAPPED, str(libs["app"])], capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr
    assert [os.path.basename(p) for p in loaded.stdout.split()] == ["libcudart.so.13"]
    # the check's own API no longer raises it
    from seedance.collect.scan import CheckOptions, run_check
    report = run_check(CheckOptions(targets=[str(libs["app"])], env={}))
    assert not [f for f in report.findings if f.rule == "cuda-runtime-mixed"]
    # undo restores the sha256 exactly
    undo = run_cli("fix", "undo", env=env)
    assert undo.returncode == 0, undo.stderr
    assert sha(kern) == original
    history = json.loads(run_cli("fix", "history", "--json", env=env).stdout)
    assert [e["status"] for e in history] == ["undone"]
    assert history[0]["files"][0]["sha256_before"] == original


def refused_line(stdout: str) -> str:
    [line] = [x for x in stdout.splitlines() if x.startswith("refused ")]
    return line


def test_mixed_closure_is_not_moved_across_majors_unasked(tmp_path, env):
    """libkern.so was built for CUDA 12 (its verneed says so) and its root, libapp.so, loads
    CUDA 13 itself.  Unasked, neither side gives way: refused in one line that says what each
    side needs and the command that asks for the move; that command relinks it, and the
    result loads with RTLD_NOW in a fresh process, mapping only CUDA 13."""
    libs = build_mixed(tmp_path)
    kern, app = libs["kern"], libs["app"]
    original = sha(kern)
    for extra in (("--dry-run",), ()):
        fix = run_cli("fix", "cuda-mismatch", "--auto-relink", *extra, app, env=env)
        assert fix.returncode == 1, fix.stdout + fix.stderr
        line = refused_line(fix.stdout)
        assert line.startswith(f"refused {kern}: {app} needs CUDA 13 (it loads libcudart.so.13 => "), line
        assert f"{kern} needs CUDA 12 (it needs version libcudart.so.12 of libcudart.so.12)" in line
        assert "every symbol it takes from libcudart.so.12 exists in CUDA 13" in line
        assert line.endswith(f"run: seedance fix cuda-mismatch --auto-relink --runtime 13 {app}"), line
        assert "NEEDED libcudart.so.13" not in fix.stdout and "-> CUDA 13" not in fix.stdout
        assert sha(kern) == original
    assert json.loads(run_cli("fix", "history", "--json", env=env).stdout) == []
    command = line.rsplit("run: ", 1)[1].split()
    assert command[:5] == ["seedance", "fix", "cuda-mismatch", "--auto-relink", "--runtime"]
    fix = run_cli(*command[1:], env=env)
    assert fix.returncode == 0, fix.stdout + fix.stderr
    assert f"relinked {kern}" in fix.stdout and "check again: 1 of 1 finding(s) gone, 0 remaining" in fix.stdout
    loaded = subprocess.run([sys.executable, "-c", MAPPED, str(app)], capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr
    assert [os.path.basename(p) for p in loaded.stdout.split()] == ["libcudart.so.13"], loaded.stderr
    assert run_cli("fix", "undo", env=env).returncode == 0 and sha(kern) == original


def test_mixed_closure_unasked_names_the_symbol_the_other_major_lacks(tmp_path, env):
    # cudaGetDeviceProperties_v2 exists in CUDA 12 and is gone from CUDA 13: no command to suggest
    libs = build_mixed(tmp_path)
    kern = gcc(tmp_path / "libkern.so", "int cudaGetDeviceProperties_v2(void*, int);\n"
                                       "int props(void){char b[4096]; return cudaGetDeviceProperties_v2(b, 0);}\n",
               f"-L{CU12}", "-l:libcudart.so.12", f"-Wl,-rpath,{CU12}")
    original = sha(kern)
    fix = run_cli("fix", "cuda-mismatch", "--auto-relink", "--dry-run", libs["app"], env=env)
    assert fix.returncode == 1, fix.stdout + fix.stderr
    line = refused_line(fix.stdout)
    assert f"{kern} needs CUDA 12 (" in line and f"{libs['app']} needs CUDA 13 (" in line
    assert "--runtime 13" in line and "would be refused too" in line
    assert "cudaGetDeviceProperties_v2@libcudart.so.13" in line and "run: " not in line
    assert sha(kern) == original


def test_unresolved_cuda_needed_is_relinked_only_to_a_runtime_named(tmp_path, env):
    private = tmp_path / "private"
    private.mkdir()
    shutil.copy(CU12 / "libcudart.so.12", private / "libcudart.so.12")
    lib = gcc(tmp_path / "libgone.so", "int cudaGetDeviceCount(int*);\nint f(void){int n; return cudaGetDeviceCount(&n);}\n",
              f"-L{private}", "-l:libcudart.so.12")
    shutil.rmtree(private)  # built against a runtime that is no longer there: NEEDED does not resolve
    original = sha(lib)
    # built for CUDA 12, and no CUDA 12 runtime resolves from it: refused, saying where one comes from
    fix = run_cli("fix", "cuda-mismatch", "--auto-relink", lib, env=env)
    assert "needed-unresolved" in fix.stdout
    assert fix.returncode == 1, fix.stdout + fix.stderr
    assert f"refused {lib}" in fix.stdout and "nvidia-cuda-runtime-cu12" in fix.stdout
    assert "libcudart.so.13" not in fix.stdout and sha(lib) == original
    # asked for by --runtime 13, and every symbol it takes from libcudart is there: relinked
    fix = run_cli("fix", "cuda-mismatch", "--auto-relink", "--runtime", "13", lib, env=env)
    assert fix.returncode == 0, fix.stdout + fix.stderr
    assert "libcudart.so.13" in subprocess.run(["ldd", str(lib)], capture_output=True, text=True).stdout


def test_refuses_when_the_target_lacks_a_symbol_and_names_both(tmp_path, env):
    # cudaGetDeviceProperties_v2 exists in CUDA 12 and is gone from CUDA 13
    libs = build_mixed(tmp_path)
    old = gcc(tmp_path / "libkern.so",
              "int cudaGetDeviceProperties_v2(void*, int);\nint props(void){char b[4096]; return cudaGetDeviceProperties_v2(b, 0);}\n",
              f"-L{CU12}", "-l:libcudart.so.12", f"-Wl,-rpath,{CU12}")
    original = sha(old)
    fix = run_cli("fix", "cuda-mismatch", "--auto-relink", "--runtime", "13", libs["app"], env=env)
    assert fix.returncode == 1
    assert "refused" in fix.stdout
    assert "cudaGetDeviceProperties_v2@libcudart.so.13" in fix.stdout and "libcudart.so.13" in fix.stdout
    assert sha(old) == original


def test_a_rewrite_that_does_not_load_is_not_written(tmp_path, env):
    # the static checks all pass (every symbol it binds exists in CUDA 13), but its constructor
    # refuses a CUDA 13 runtime: only the dlopen in a child (the zygote's, issue 13) sees that
    libs = build_mixed(tmp_path)
    kern = gcc(tmp_path / "libkern.so",
               "#include <stdlib.h>\nint cudaRuntimeGetVersion(int*); int cudaGetDeviceCount(int*);\n"
               "__attribute__((constructor)) static void only12(void){int v=0; cudaRuntimeGetVersion(&v);"
               " if (v >= 13000) abort();}\n"
               "int kern_count(void){int n=0; cudaGetDeviceCount(&n); return n;}\n",
               f"-L{CU12}", "-l:libcudart.so.12", f"-Wl,-rpath,{CU12}")
    original = sha(kern)
    oracle = subprocess.run([sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1])", str(kern)],
                            capture_output=True)
    assert oracle.returncode == 0  # as built, it loads
    fix = run_cli("fix", "cuda-mismatch", "--auto-relink", "--runtime", "13", libs["app"], env=env)
    assert fix.returncode == 1, fix.stdout + fix.stderr
    assert "not relinked" in fix.stdout and "dlopen in a child process failed" in fix.stdout
    assert sha(kern) == original
    assert not [n for n in os.listdir(tmp_path) if ".seedance-tmp" in n]


def test_runtime_flag_overrides_the_choice(tmp_path, env):
    libs = build_mixed(tmp_path)
    app = str(libs["app"])
    # --runtime 12 moves the root itself to 12; the 12 runtime is on libkern's RUNPATH only,
    # not the root's, so from the root it would not resolve: refused, saying why
    fix = run_cli("fix", "cuda-mismatch", "--auto-relink", "--runtime", "12", "--dry-run", app, env=env)
    assert fix.returncode == 1
    assert f"refused {app}: libcudart for CUDA 12 (libcudart.so.12) does not resolve from {app}" in fix.stdout
    # where it does resolve, the root is the one retargeted, to 12
    fix = run_cli("fix", "cuda-mismatch", "--auto-relink", "--runtime", "12", "--dry-run", app,
                  env={**env, "LD_LIBRARY_PATH": str(CU12)})
    assert fix.returncode == 0, fix.stdout
    assert f"{app}: -> CUDA 12 (in-place, zero growth)" in fix.stdout
    assert "+ NEEDED libcudart.so.12" in fix.stdout and "- NEEDED libcudart.so.13" in fix.stdout


def test_check_again_looks_only_at_the_roots_that_load_the_rewritten_file(tmp_path, env):
    """The re-check after a fix (issue 13) checks the roots that load a rewritten file (and
    those that share what its findings were about) and keeps the first check's findings
    elsewhere.  Oracles: ldd (which roots really load libkern.so) and a full `seedance check`
    of the same tree after the fix."""
    d = tmp_path / "tree"
    d.mkdir()
    libs = build_mixed(d)
    # an unrelated library the fix must refuse: built against a CUDA 12 runtime that is gone
    # (NEEDED does not resolve) and calling cudaGetDeviceProperties_v2, which CUDA 13 lacks
    private = tmp_path / "private"
    private.mkdir()
    shutil.copy(CU12 / "libcudart.so.12", private / "libcudart.so.12")
    gone = gcc(d / "libgone.so", "int cudaGetDeviceProperties_v2(void*, int);\n"
                                 "int props(void){char b[4096]; return cudaGetDeviceProperties_v2(b, 0);}\n",
               f"-L{private}", "-l:libcudart.so.12")
    shutil.rmtree(private)
    fix = run_cli("fix", "cuda-mismatch", "--auto-relink", "--runtime", "13", "--verbose", str(d), env=env)
    assert fix.returncode == 1, fix.stdout + fix.stderr  # libgone.so refused
    assert f"relinked {libs['kern']}" in fix.stdout and f"refused {gone}" in fix.stdout
    line = next(x for x in fix.stdout.splitlines() if x.startswith("check again: ") and "root(s)" in x)
    rechecked = set(line.split(": ", 2)[2].split())
    loaders = {str(p) for p in d.glob("*.so")
               if str(libs["kern"]) in subprocess.run(["ldd", str(p)], capture_output=True, text=True).stdout}
    assert loaders == {str(libs["app"])}
    assert loaders | {str(libs["kern"])} <= rechecked and str(gone) not in rechecked
    # what it says remains is what a full check of the tree finds now
    still = {tuple(x.strip()[len("still: "):].split(": ", 1))
             for x in fix.stdout.splitlines() if x.strip().startswith("still: ")}
    full = json.loads(run_cli("check", "--report-json", "-", str(d), env=env).stdout)["findings"]
    from seedance.fix.relink import FAMILY, RELINK_RULES
    found = {(f["rule"], f["message"]) for f in full if f["rule"] in RELINK_RULES and (
        f["rule"] not in ("needed-unresolved", "needed-soname-mismatch") or FAMILY.match(f["evidence"]["name"]))}
    assert found and still == found
    assert all(str(gone) in message for _rule, message in found)


# --- bad input: one line, exit 2, nothing touched ----------------------------------------------

def one_line_exit_2(proc):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_read_only_library_is_refused(tmp_path, env):
    libs = build_mixed(tmp_path)
    os.chmod(libs["kern"], 0o444)
    original = sha(libs["kern"])
    proc = run_cli("fix", "cuda-mismatch", "--auto-relink", "--runtime", "13", libs["app"], env=env)
    one_line_exit_2(proc)
    assert "read-only" in proc.stderr
    assert sha(libs["kern"]) == original
    assert not (tmp_path / "state" / "seedance" / "journal").exists() or \
        not os.listdir(tmp_path / "state" / "seedance" / "journal")


def test_library_mapped_by_a_running_process_is_refused(tmp_path, env):
    libs = build_mixed(tmp_path)
    original = sha(libs["kern"])
    child = subprocess.Popen([sys.executable, "-c", "import ctypes, sys, time; ctypes.CDLL(sys.argv[1]);"
                              "print('up', flush=True); time.sleep(60)", str(libs["kern"])],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        proc = run_cli("fix", "cuda-mismatch", "--auto-relink", "--runtime", "13", libs["app"], env=env)
    finally:
        child.kill()
        child.wait()
    one_line_exit_2(proc)
    assert f"pid {child.pid}" in proc.stderr and "restart" in proc.stderr
    assert sha(libs["kern"]) == original


def test_non_elf_path_is_refused(tmp_path, env):
    text = tmp_path / "notes.txt"
    text.write_text("not a library\n")
    proc = run_cli("fix", "cuda-mismatch", "--auto-relink", text, env=env)
    one_line_exit_2(proc)
    assert "not an ELF file" in proc.stderr
    assert text.read_text() == "not a library\n"


def test_handle_leak_is_not_yet_available_or_provided(env):
    proc = run_cli("fix", "handle-leak", "--help", env=env)
    assert proc.returncode in (0, 2)
    if not (Path(__file__).resolve().parents[2] / "agent" / "fix" / "handle_leak.py").exists():
        proc = run_cli("fix", "handle-leak", env=env)
        one_line_exit_2(proc)
        assert "not available in this install" in proc.stderr


def test_fix_help_has_examples():
    for args in (("fix", "--help"), ("fix", "cuda-mismatch", "--help"), ("fix", "env-leak", "--help"),
                 ("fix", "torch-ext", "--help"), ("fix", "undo", "--help"), ("fix", "history", "--help")):
        proc = run_cli(*args)
        assert proc.returncode == 0 and "examples:" in proc.stdout, args


def lying_runtime(d: Path, source: str = "int cudaGetDeviceCount(int*);\n"
                                          "int f(void){int n; return cudaGetDeviceCount(&n);}\n") -> Path:
    """liblie.so, linked against the cu12 wheel's libcudart (NEEDED libcudart.so.12, verneed
    libcudart.so.12), whose RUNPATH holds a file named libcudart.so.12 that is really the
    CUDA 11 runtime (SONAME libcudart.so.11.0): CUDA 11 and 13 resolve from it, 12 does not."""
    rt = d / "rt"
    rt.mkdir()
    shutil.copy(CU12 / "libcudart.so.11.0", rt / "libcudart.so.12")
    return gcc(d / "liblie.so", source, f"-L{CU12}", "-l:libcudart.so.12", f"-Wl,-rpath,{rt}")


def test_needed_that_resolves_to_a_lying_soname_is_not_moved_to_another_major(tmp_path, env):
    """Built for CUDA 12, resolving to a CUDA 11 copy, with CUDA 13 in ld.so.cache: the relink
    may only target 12, which nothing here provides: refused, naming the wheel that ships it."""
    lib = lying_runtime(tmp_path)
    info = subprocess.run(["readelf", "-V", "-d", str(lib)], capture_output=True, text=True).stdout
    assert "[libcudart.so.12]" in info and "Name: libcudart.so.12" in info  # NEEDED and verneed: 12
    original = sha(lib)
    for extra in (("--dry-run",), ()):
        fix = run_cli("fix", "cuda-mismatch", "--auto-relink", *extra, lib, env=env)
        assert fix.returncode == 1, fix.stdout + fix.stderr
        assert "needed-soname-mismatch" in fix.stdout
        assert f"refused {lib}" in fix.stdout and "nvidia-cuda-runtime-cu12" in fix.stdout
        assert "built for CUDA 12" in fix.stdout
        assert "-> CUDA 13" not in fix.stdout and "NEEDED libcudart.so.13" not in fix.stdout
        assert "libcudart.so.13" not in fix.stdout
        assert sha(lib) == original


def test_a_lying_soname_crosses_majors_only_by_runtime_and_only_with_the_symbols(tmp_path, env):
    lib = lying_runtime(tmp_path)
    original = sha(lib)
    unasked = run_cli("fix", "cuda-mismatch", "--auto-relink", "--dry-run", lib, env=env)
    assert unasked.returncode == 1 and "would be relinked, 1 refused" in unasked.stdout, unasked.stdout
    fix = run_cli("fix", "cuda-mismatch", "--auto-relink", "--runtime", "13", lib, env=env)
    assert fix.returncode == 0, fix.stdout + fix.stderr
    assert "check again: 2 of 2 finding(s) gone, 0 remaining" in fix.stdout
    # the real loader, RTLD_NOW, in a fresh process: it loads and maps only CUDA 13
    loaded = subprocess.run([sys.executable, "-c", MAPPED, str(lib)], capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr
    assert [os.path.basename(p) for p in loaded.stdout.split()] == ["libcudart.so.13"], loaded.stderr
    assert run_cli("fix", "undo", env=env).returncode == 0
    assert sha(lib) == original
    # cudaGetDeviceProperties_v2 is in CUDA 12 and gone from 13 (nm -D of the target says so)
    dynsym = subprocess.run(["nm", "-D", "--defined-only", str(CU13)], capture_output=True, text=True).stdout
    assert " cudaGetDeviceProperties_v2@" not in dynsym
    other = tmp_path / "other"
    other.mkdir()
    old = lying_runtime(other, "int cudaGetDeviceProperties_v2(void*, int);\n"
                               "int props(void){char b[4096]; return cudaGetDeviceProperties_v2(b, 0);}\n")
    before = sha(old)
    fix = run_cli("fix", "cuda-mismatch", "--auto-relink", "--runtime", "13", old, env=env)
    assert fix.returncode == 1
    assert f"refused {old}" in fix.stdout and "cudaGetDeviceProperties_v2@libcudart.so.13" in fix.stdout
    assert sha(old) == before


def test_pid_aligns_with_the_runtime_a_running_process_maps(tmp_path, env):
    libs = build_mixed(tmp_path)
    # a process that really runs the CUDA 12 runtime
    child = subprocess.Popen([sys.executable, "-c", "import ctypes, sys, time; ctypes.CDLL(sys.argv[1]);"
                              "print('up', flush=True); time.sleep(60)", str(CU12 / "libcudart.so.12")],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        fix = run_cli("fix", "cuda-mismatch", "--auto-relink", "--pid", child.pid, "--dry-run", libs["app"],
                      env={**env, "LD_LIBRARY_PATH": str(CU12)})
    finally:
        child.kill()
        child.wait()
    assert f"pid {child.pid} uses the CUDA 12 runtime" in fix.stdout
    assert f"{libs['app']}: -> CUDA 12" in fix.stdout, fix.stdout
    gone = run_cli("fix", "cuda-mismatch", "--auto-relink", "--pid", child.pid, libs["app"], env=env)
    assert gone.returncode == 2 and "no such process" in gone.stderr


# --- symlinks and concurrent fixes (issue 10 item 5) ---------------------------------------------

def build_linked(d: Path) -> dict:
    """libapp.so (CUDA 13) needs libkern.so, a symlink to real/libkern.so.1.0 (CUDA 12)."""
    real = d / "real"
    real.mkdir()
    kern = gcc(real / "libkern.so.1.0", "int cudaGetDeviceCount(int*);\n"
                                         "int kern_count(void){int n=0; cudaGetDeviceCount(&n); return n;}\n",
               f"-L{CU12}", "-l:libcudart.so.12", f"-Wl,-rpath,{CU12}", "-Wl,-soname,libkern.so")
    (d / "libkern.so").symlink_to("real/libkern.so.1.0")
    app = gcc(d / "libapp.so", "int cudaGetDeviceCount(int*); int kern_count(void);\n"
                               "int app(void){int n; cudaGetDeviceCount(&n); return kern_count();}\n",
              "-L/usr/local/cuda/lib64", "-l:libcudart.so.13", f"-L{d}", "-lkern", f"-Wl,-rpath,{d}")
    return {"kern": kern, "link": d / "libkern.so", "app": app}


def test_a_symlinked_library_is_fixed_in_its_target_and_the_link_stays(tmp_path, env):
    libs = build_linked(tmp_path)
    original = sha(libs["kern"])
    fix = run_cli("fix", "cuda-mismatch", "--auto-relink", "--runtime", "13", libs["app"], env=env)
    assert fix.returncode == 0, fix.stdout + fix.stderr
    assert os.path.islink(libs["link"]) and os.readlink(libs["link"]) == "real/libkern.so.1.0"
    assert sha(libs["kern"]) != original
    ldd = subprocess.run(["ldd", str(libs["kern"])], capture_output=True, text=True).stdout
    assert "libcudart.so.13" in ldd and "libcudart.so.12" not in ldd
    loaded = subprocess.run([sys.executable, "-c", MAPPED, str(libs["app"])], capture_output=True, text=True)
    assert [os.path.basename(p) for p in loaded.stdout.split()] == ["libcudart.so.13"], loaded.stderr
    assert sorted(os.listdir(tmp_path / "real")) == ["libkern.so.1.0", "libkern.so.1.c"]  # no temp left
    undo = run_cli("fix", "undo", env=env)
    assert undo.returncode == 0, undo.stderr
    assert f"restored {libs['kern']}" in undo.stdout
    assert os.path.islink(libs["link"]) and sha(libs["kern"]) == original


def test_six_concurrent_fixes_of_one_library_commit_once(tmp_path, env):
    libs = build_mixed(tmp_path)
    original = sha(libs["kern"])
    cmd = [str(Path(sys.executable).with_name("seedance")), "fix", "cuda-mismatch", "--auto-relink", "--runtime", "13",
           str(libs["app"])]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, **env}) for _ in range(6)]
    outputs = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    for code, _out, err in outputs:
        assert "Traceback" not in err and code in (0, 2), (code, err)
    history = json.loads(run_cli("fix", "history", "--json", env=env).stdout)
    committed = [e for e in history if e["status"] == "committed"]
    assert len(committed) == 1, [(e["status"], e["note"]) for e in history]
    refused = [err for code, _out, err in outputs if code == 2]
    assert all("not touched" in err or "changed since this fix planned" in err or "not rewritten" in err
               for err in refused), refused
    assert run_cli("fix", "undo", env=env).returncode == 0
    assert sha(libs["kern"]) == original  # one undo gets back
    again = run_cli("fix", "undo", env=env)
    assert again.returncode == 2 and "nothing to undo" in again.stderr
