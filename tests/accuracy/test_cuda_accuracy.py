"""Accuracy of the CUDA verdicts (issue 11, items 1-3) on nvcc builds and real NVIDIA wheels.

Every verdict of `seedance check` is compared with an oracle that does not use seedance:
  - GPU architecture (no GPU here): each translation unit is compiled to its own object and
    read with NVIDIA's cuobjdump (--list-elf/--list-ptx for its images, -res-usage for its
    kernels, -xptx for its PTX); a kernel-holding unit can run on sm_XY when cuobjdump lists
    SASS that NVIDIA's binary-compatibility rule lets run there, or when ptxas (the JIT's
    compiler) compiles its PTX for that device.  PTX against an older driver: ptxas of that
    driver's CUDA (12.9, from NVIDIA's nvidia-cuda-nvcc-cu12 wheel).
  - A statically linked runtime: the real static runtime, run on the fake CUDA driver
    (tests/fakecuda) reporting the driver's CUDA version: cudaErrorInsufficientDriver or not.
  - Real wheels (cuBLAS, cuBLASLt, cuFFT, cupy): cuobjdump's listing of the whole library
    under NVIDIA's rules (these libraries pick kernels by architecture at run time), and
    NVIDIA's minimum-driver table for their static runtime.

cases(workdir) builds the corpus and returns Case objects (each also unpacks as
(name, path, check_args, expected_verdict, oracle)); evaluate(case) gives one row, as in
tests/accuracy/test_torch_accuracy.py, so bench/bench_accuracy.py can print the table.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.accuracy.conftest import Unavailable, install
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(os.environ.get("SEEDANCE_CORPUS", Path.home() / ".cache" / "seedance-corpus"))
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
PTXAS = shutil.which("ptxas") or ("/usr/local/cuda/bin/ptxas" if os.path.exists("/usr/local/cuda/bin/ptxas") else None)
ARCH_RULES = ("cuda-arch-missing", "cuda-ptx-unsupported")
DRIVER_RULES = ("cuda-driver-too-old",)
INSUFFICIENT_DRIVER = 35  # cudaErrorInsufficientDriver

KERNEL_A = "__global__ void kern_a(float *x) { x[threadIdx.x] *= 2.0f; }\n" \
           "extern \"C\" void launch_a(float *x) { kern_a<<<1, 32>>>(x); }\n"
KERNEL_B = "__global__ void kern_b(float *x) { x[threadIdx.x] += 1.0f; }\n" \
           "extern \"C\" void launch_b(float *x) { kern_b<<<1, 32>>>(x); }\n"
VARIABLE = "__device__ float lookup_table[64];\n"  # a unit with no kernel, as cuFFT's cubin
PROBE = "#include <cstdio>\n#include <cuda_runtime.h>\n" \
        "int main() { int n = -1; cudaError_t e = cudaGetDeviceCount(&n); printf(\"%d\\n\", (int)e); return 0; }\n"


@dataclass
class Case:
    name: str
    path: Path
    check_args: list
    rules: tuple  # the rules whose findings make up this class's verdict
    oracle: str  # how reality is known
    reality_fn: object = field(repr=False, default=None)  # () -> (broken, how)
    known_limit: str = ""  # a disagreement seedance cannot avoid statically, and why
    kind: str = ""  # the class of issue 11 it plants, for the bench's table
    _reality: tuple | None = field(default=None, repr=False)

    def reality(self) -> tuple:
        if self._reality is None:
            self._reality = self.reality_fn()
        return self._reality

    @property
    def expected_verdict(self) -> str:
        return "broken" if self.reality()[0] else "ok"

    def __iter__(self):
        return iter((self.name, self.path, self.check_args, self.expected_verdict, self.oracle))


# --- tools -----------------------------------------------------------------------------------------

def find_cuobjdump() -> str | None:
    for candidate in ("/usr/local/cuda/bin/cuobjdump", shutil.which("cuobjdump")):
        if candidate and os.path.exists(candidate):
            return candidate
    for base in sys.path:
        if os.path.isdir(base):
            for found in Path(base).glob("nvidia/cu*/bin/cuobjdump"):
                return str(found)
    return None


def _run(cmd, cwd=None, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, errors="replace", cwd=cwd,
                          env=env, timeout=timeout)


def _ok(cmd, cwd=None) -> str:
    proc = _run(cmd, cwd=cwd)
    assert proc.returncode == 0, f"{cmd[0]}: {proc.stderr.strip()[-2000:]}"
    return proc.stdout


def corpus_wheel(package: str, relative: str) -> Path:
    """A file of an NVIDIA wheel, installed --no-deps under ~/.cache/seedance-corpus (cached)."""
    path = install(package, package, marker=relative) / relative
    if not path.exists():
        raise Unavailable(f"{package} installed without {relative}")
    return path


def older_ptxas() -> Path:
    """ptxas of CUDA 12.9 (the JIT of a 575-branch driver), from NVIDIA's wheel."""
    return corpus_wheel("nvidia-cuda-nvcc-cu12", "nvidia/cuda_nvcc/bin/ptxas")


# --- the oracle for architectures -------------------------------------------------------------------

def listed_images(cuobjdump: str, path) -> tuple:
    out = _ok([cuobjdump, "--list-elf", "--list-ptx", path])
    return (re.findall(r"^ELF file\s+\d+: .*\.(sm_\w+)\.cubin$", out, re.M),
            re.findall(r"^PTX file\s+\d+: .*\.(sm_\w+)\.ptx$", out, re.M))


def sass_runs(cubin_arch: str, device: int) -> bool:
    """NVIDIA's rule: sm_XY SASS runs on X.Z, Z >= Y; sm_XYa only on X.Y (cuobjdump prints
    family cubins by their plain arch)."""
    match = re.fullmatch(r"sm_(\d+)([af]?)", cubin_arch)
    arch, variant = int(match.group(1)), match.group(2)
    if variant == "a":
        return arch == device
    return arch // 10 == device // 10 and arch <= device


def ptx_jits(ptxas: str, ptx_file: Path, device: int) -> tuple:
    """Does ptxas compile this PTX for the device (as sm_XY, or its a/f feature set)?"""
    errors = []
    for target in (f"sm_{device}", f"sm_{device}a", f"sm_{device}f"):
        proc = _run([ptxas, f"-arch={target}", ptx_file, "-o", os.devnull])
        if proc.returncode == 0:
            return True, f"ptxas -arch={target} ok"
        errors.append(proc.stderr.strip().splitlines()[0] if proc.stderr.strip() else f"exit {proc.returncode}")
    return False, errors[0][:160]


@dataclass
class Unit:
    """One translation unit as built into the library: its own object, read by cuobjdump."""
    source: str
    flags: list
    obj: Path = None


def unit_reality(cuobjdump: str, ptxas: str, units: list, device: int, workdir: Path) -> tuple:
    for unit in units:
        usage = _ok([cuobjdump, "-res-usage", unit.obj]) if listed_images(cuobjdump, unit.obj)[0] else ""
        kernels = set(re.findall(r"Function (\S+):", usage))
        elves, ptxs = listed_images(cuobjdump, unit.obj)
        if not kernels and not ptxs:
            continue  # no kernel: nothing can fail to launch
        if any(sass_runs(arch, device) for arch in elves):
            continue
        extract = workdir / f"ptx-{unit.obj.parent.name}-{unit.obj.stem}"
        extract.mkdir(exist_ok=True)
        _ok([cuobjdump, "-xptx", "all", unit.obj], cwd=extract)
        if ptxs and not kernels:  # a PTX-only unit: its kernels are its .entry directives
            kernels = {m for p in extract.glob("*.ptx") for m in re.findall(r"\.entry\s+(\w+)", p.read_text(errors="replace"))}
            if not kernels:
                continue
        verdicts = [ptx_jits(ptxas, p, device) for p in sorted(extract.glob("*.ptx"))]
        if not any(ok for ok, _ in verdicts):
            why = verdicts[0][1] if verdicts else "no PTX"
            return True, f"{unit.obj.name}: SASS {elves or 'none'} cannot run on sm_{device}; {why}"
    return False, f"every kernel-holding unit has SASS or PTX for sm_{device} (cuobjdump, ptxas)"


def build_library(workdir: Path, name: str, units: list, link_flags=()) -> Path:
    """nvcc -c each unit with its own flags, then nvcc -shared: as a project's build does."""
    lib_dir = workdir / name
    lib_dir.mkdir(exist_ok=True)
    for index, unit in enumerate(units):
        src = lib_dir / f"unit{index}.cu"
        src.write_text(unit.source)
        unit.obj = lib_dir / f"unit{index}.o"
        _ok([NVCC, "-c", "-Xcompiler", "-fPIC", *unit.flags, src, "-o", unit.obj])
    lib = lib_dir / f"lib{name}.so"
    _ok([NVCC, "-shared", *link_flags, *[u.obj for u in units], "-o", lib])
    return lib


def gencode(*pairs) -> list:
    return [flag for arch, code in pairs for flag in ("-gencode", f"arch={arch},code={code}")]


# --- the corpus --------------------------------------------------------------------------------------

def cases(workdir: Path) -> list:
    if NVCC is None or PTXAS is None:
        raise Unavailable("nvcc/ptxas (CUDA toolkit) not installed")
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        raise Unavailable("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    workdir.mkdir(parents=True, exist_ok=True)
    found = []

    def arch_case(name, lib, units, device, extra=(), ptxas=PTXAS, oracle="cuobjdump per unit + NVIDIA's SASS rule + ptxas",
                  known_limit=""):
        args = ["--arch", f"sm_{device}", *extra]
        found.append(Case(f"{name} @ sm_{device}{' ' + ' '.join(extra) if extra else ''}", lib, args, ARCH_RULES,
                          oracle, lambda: unit_reality(cuobjdump, str(ptxas), units, device, workdir),
                          known_limit=known_limit, kind="ptx vs driver (nvcc)" if extra else "arch per module (nvcc)"))

    # item 1: two translation units, one sm_90 + PTX, one sm_80 only
    two = [Unit(KERNEL_A, gencode(("compute_90", "sm_90"), ("compute_90", "compute_90"))),
           Unit(KERNEL_B, gencode(("compute_80", "sm_80")))]
    lib = build_library(workdir, "two_units", two)
    for device in (80, 90, 100):
        arch_case("two units (sm_90+PTX, sm_80 only)", lib, two, device)
    both = [Unit(KERNEL_A, gencode(("compute_90", "sm_90"), ("compute_90", "compute_90"))),
            Unit(KERNEL_B, gencode(("compute_80", "sm_80"), ("compute_80", "compute_80")))]
    lib = build_library(workdir, "two_units_ptx", both)
    for device in (90, 120):
        arch_case("two units, both with PTX", lib, both, device)
    # On the older GPU the sm_90 unit cannot run, but the sm_80 + PTX unit that runs there
    # also serves every GPU the sm_90 unit serves: the shape of a library that picks kernels
    # by architecture (cuBLASLt keeps compute_120-only modules beside generic ones).  Without
    # running the host code the two cannot be told apart; seedance takes the library's side.
    arch_case("two units, both with PTX", lib, both, 80,
              known_limit="indistinguishable from per-architecture dispatch without running the host code")
    # the two-step build: nvcc -c for sm_90, nvcc -shared adds a device-link stub for its default arch
    step = [Unit(KERNEL_A, gencode(("compute_90", "sm_90")))]
    lib = build_library(workdir, "two_step", step)
    default_arch = listed_images(cuobjdump, lib)[0][0]  # the stub: nvcc's default arch
    for device in sorted({int(default_arch[3:].rstrip("af")), 90}):
        arch_case(f"two-step build (stub {default_arch})", lib, step, device)
    # a unit holding no kernel at all (device variable only)
    var = [Unit(VARIABLE, gencode(("compute_80", "sm_80")))]
    lib = build_library(workdir, "variable_only", var)
    for device in (75, 90, 120):
        arch_case("device variable only (sm_80)", lib, var, device)
    # arch-specific and family targets
    a90 = [Unit(KERNEL_A, gencode(("compute_90a", "sm_90a"), ("compute_90a", "compute_90a")))]
    lib = build_library(workdir, "sm90a", a90)
    for device in (90, 100):
        arch_case("sm_90a + compute_90a", lib, a90, device)
    f100 = [Unit(KERNEL_A, gencode(("compute_100f", "sm_100f"), ("compute_100f", "compute_100f")))]
    lib = build_library(workdir, "f100", f100)
    for device in (100, 103, 110, 120):
        arch_case("sm_100f + compute_100f", lib, f100, device)
    ptx_family = [Unit(KERNEL_A, gencode(("compute_100f", "compute_100f")))]
    lib = build_library(workdir, "ptx100f", ptx_family)
    for device in (103, 120):
        arch_case("compute_100f PTX only", lib, ptx_family, device)
    compressed = [Unit(KERNEL_A, ["-Xfatbin", "-compress-all", *gencode(("compute_80", "sm_80"), ("compute_90a", "sm_90a"))])]
    lib = build_library(workdir, "compressed", compressed)
    for device in (86, 90, 100):
        arch_case("-compress-all sm_80 + sm_90a", lib, compressed, device)
    # PTX against the driver: PTX from this toolkit, JIT by a 12.9 driver (ptxas 12.9) or a 13.0 one
    ptx_only = [Unit(KERNEL_A, gencode(("compute_80", "compute_80")))]
    lib = build_library(workdir, "ptx_only", ptx_only)
    try:
        arch_case("compute_80 PTX only, 12.9 driver", lib, ptx_only, 90, extra=("--driver-version", "575.57.08"),
                  ptxas=older_ptxas(), oracle="ptxas of CUDA 12.9 (the 575 driver's JIT) on cuobjdump's PTX")
    except Unavailable:
        pass  # the wheel with the older ptxas is not installable here: that case is left out
    arch_case("compute_80 PTX only, 13.0 driver", lib, ptx_only, 90, extra=("--driver-version", "580.65.06"))
    arch_case("compute_80 PTX only, sm_75", lib, ptx_only, 75)

    found.extend(_static_runtime_cases(workdir))
    found.extend(_wheel_cases(workdir, cuobjdump))
    return found


def _static_runtime_cases(workdir: Path) -> list:
    """nvcc's default -cudart static, judged by the real static runtime on the fake driver."""
    tmp = workdir / "static_runtime"
    tmp.mkdir(exist_ok=True)
    (tmp / "probe.cu").write_text(PROBE)
    _ok([NVCC, "-o", tmp / "probe", tmp / "probe.cu"])
    fake = tmp / "fake"
    fake.mkdir(exist_ok=True)
    inc = ["-I/usr/local/cuda/include"] if os.path.isdir("/usr/local/cuda/include") else ["-DFAKE_NO_CUDA_H"]
    _ok(["gcc", "-O2", "-fPIC", "-shared", *inc, "-Wl,-soname,libcuda.so.1", "-Wl,-Bsymbolic",
         ROOT / "tests/fakecuda/fakecuda.c", "-o", fake / "libcuda.so.1", "-pthread"])

    def reality(reports: int):
        def run():
            env = dict(os.environ, LD_LIBRARY_PATH=str(fake), FAKECUDA_DRIVER_VERSION=str(reports))
            proc = _run([tmp / "probe"], env=env, timeout=60)
            code = int(proc.stdout.strip() or -1)
            return code == INSUFFICIENT_DRIVER, f"static runtime on a driver reporting {reports}: cudaGetDeviceCount -> {code}"
        return run

    made = []
    # what cuDriverGetVersion returns on each driver (1000*major + 10*minor), as nvidia-smi shows it
    for driver, reports in (("535.104.05", 12020), ("12.4", 12040), ("560", 12060), ("575.57.08", 12090),
                            ("580.65.06", 13000), ("13.0", 13000), ("590", 13010)):
        made.append(Case(f"static runtime (nvcc default) with --driver-version {driver}", tmp / "probe",
                         ["--driver-version", driver], DRIVER_RULES,
                         "the real static runtime on the fake driver", reality(reports), kind="static runtime (nvcc)"))
    return made


NVIDIA_FLOORS = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}  # CUDA release notes


def _wheel_cases(workdir: Path, cuobjdump: str) -> list:
    made = []
    wheels = [("nvidia-cublas-cu12", "nvidia/cublas/lib/libcublasLt.so.12", 12),
              ("nvidia-cublas-cu12", "nvidia/cublas/lib/libcublas.so.12", 12),
              ("nvidia-cufft-cu12", "nvidia/cufft/lib/libcufft.so.11", None)]
    for package, relative, runtime_major in wheels:
        try:
            path = corpus_wheel(package, relative)
        except Unavailable:
            continue
        listing = {}

        def library_reality(device, path=path, listing=listing):
            def run():
                if "images" not in listing:
                    listing["images"] = listed_images(cuobjdump, path)
                elves, ptxs = listing["images"]
                if not elves and not ptxs:
                    return False, "cuobjdump lists no device code"
                sass = sorted({a for a in elves if sass_runs(a, device)})
                ptx = sorted({a for a in ptxs if _ptx_arch_jits(a, device)})
                if sass or ptx:
                    return False, f"cuobjdump: {len(elves)} cubins, {len(sass)} kinds for sm_{device}: {sass[:3]}{ptx[:2]}"
                if "functions" not in listing:
                    listing["functions"] = re.findall(r"Function (\S+):", _ok([cuobjdump, "-res-usage", path]))
                if not listing["functions"]:  # cuFFT: one kernel-less cubin; its kernels load another way
                    return False, f"cuobjdump -res-usage: the fatbin of {path.name} holds no kernel"
                return True, f"cuobjdump: no cubin or PTX of {path.name} runs on sm_{device}"
            return run

        # sm_110 is left out: CUDA 12.9 named that GPU sm_101, so what "runs" there is unknowable
        for device in (60, 70, 75, 80, 86, 89, 90, 100, 103, 120):
            made.append(Case(f"{path.name} ({package}) @ sm_{device}", path, ["--arch", f"sm_{device}"], ARCH_RULES,
                             "cuobjdump of the whole library + NVIDIA's rules (it dispatches by arch)",
                             library_reality(device), kind="arch (NVIDIA wheels)"))
        if runtime_major:
            for driver in ("470.82.01", "525.60.13", "550.54.15", "12.4", "580"):
                floor = NVIDIA_FLOORS[runtime_major]
                broken = tuple(int(p) for p in driver.split(".")) < floor if int(driver.split(".")[0]) >= 100 \
                    else int(driver.split(".")[0]) < runtime_major
                made.append(Case(f"{path.name} static CUDA {runtime_major} runtime, driver {driver}", path,
                                 ["--driver-version", driver], DRIVER_RULES,
                                 "NVIDIA's minimum-driver table (CUDA 12.x: 525.60.13)",
                                 (lambda b=broken, d=driver: (b, f"driver {d} {'below' if b else 'meets'} the 12.x floor")),
                                 kind="static runtime (wheels)"))
    cupy = CORPUS / "cupy-cuda12x" / "cupy" / "cuda"
    for module in sorted(cupy.glob("cub.cpython-*.so"))[:1]:
        for driver, broken in (("470.82.01", True), ("12.4", False)):
            made.append(Case(f"cupy {module.name} (static CUDA 12 runtime), driver {driver}", module,
                             ["--driver-version", driver], DRIVER_RULES, "NVIDIA's minimum-driver table",
                             (lambda b=broken, d=driver: (b, f"driver {d} {'below' if b else 'meets'} the 12.x floor")),
                             kind="static runtime (wheels)"))
    return made


def _ptx_arch_jits(ptx_arch: str, device: int) -> bool:
    """NVIDIA's PTX rule on a cuobjdump name: compute_XY JITs to >= X.Y; 'a' only to X.Y;
    'f' within its family (checked with ptxas on our own builds above)."""
    match = re.fullmatch(r"sm_(\d+)([af]?)", ptx_arch)
    arch, variant = int(match.group(1)), match.group(2)
    if variant == "a":
        return arch == device
    if variant == "f":
        return arch // 10 == device // 10 and arch <= device
    return arch <= device


def evaluate(case: Case) -> dict:
    """One row: what seedance says, what really happens, and whether they agree."""
    proc = run_cli("check", "--json", "--no-progress", *case.check_args, case.path, timeout=900)
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    subject = os.path.realpath(case.path)
    mine = [f for f in report["findings"] if f["rule"] in case.rules
            and os.path.realpath(f["subject"].get("path", "")) == subject]
    predicted = any(f["severity"] in ("error", "fatal") for f in mine)
    broken, how = case.reality()
    return {"case": case.name, "predicted_broken": predicted, "broken": broken, "how": how,
            "known_limit": case.known_limit, "kind": case.kind,
            "rules": sorted({f["rule"] for f in mine}), "oracle": case.oracle,
            "messages": [f["message"] for f in mine], "skipped": report["stats"].get("errors", [])}


# --- the test ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    try:
        return cases(tmp_path_factory.mktemp("cuda-accuracy"))
    except Unavailable as exc:
        pytest.skip(str(exc))


def test_every_cuda_verdict_matches_the_oracle(corpus):
    rows = [evaluate(case) for case in corpus]
    table = "\n".join(f"{r['case']}: seedance {'BROKEN' if r['predicted_broken'] else 'ok'} {r['rules']}, "
                      f"really {'BROKEN' if r['broken'] else 'ok'} ({r['how']})" for r in rows)
    false_errors = [r for r in rows if r["predicted_broken"] and not r["broken"] and not r["known_limit"]]
    missed = [r for r in rows if r["broken"] and not r["predicted_broken"] and not r["known_limit"]]
    assert not false_errors and not missed, table
    # a known limit that no longer disagrees has been fixed: drop its note
    assert all(r["predicted_broken"] != r["broken"] for r in rows if r["known_limit"]), table
    assert not [r for r in rows if r["skipped"]], table  # nothing skipped with exit 0
    assert any(r["broken"] for r in rows) and any(not r["broken"] for r in rows), table


def test_fix_texts_never_say_none(corpus):
    for case in corpus:
        if case.rules == DRIVER_RULES:
            row = evaluate(case)
            assert not any("None" in message for message in row["messages"]), row
