"""Accuracy of `seedance check` on the Python GPU ecosystem's real wheels, with the real
loader as the oracle.

Each environment is a site-packages laid out from real PyPI wheels (cached once under
~/.cache/seedance-corpus, $SEEDANCE_CORPUS; tests/accuracy/conftest.py) the way pip installs
them side by side: a torch extension beside the torch it is paired with (the venv's torch
2.13 CPU wheel, or torch 2.4.1 from PyPI with its nvidia-* wheels), a CUDA library wheel with
or without the wheels it needs.  Every ELF object of the package under test is a case:

- seedance's verdict: an error or fatal finding on the object in `seedance check --json SITE`;
- the truth: the object loaded with RTLD_NOW in a child of this venv's interpreter with the
  site first on sys.path, after what the package itself loads first (``first``: `import
  torch` for a torch extension), and, for a package that loads the NVIDIA wheels RTLD_GLOBAL
  before its modules (torch, the JAX CUDA plugin, cupy, onnxruntime's preload_dlls()), after
  the site-packages/nvidia/*/lib file ld.so says it cannot open.  An object that fails on its
  own but is mapped by another object of the package that loads is loaded that way.  An
  object the package never loads in this environment (a build for another backend or CUDA
  version, an optional provider) is healthy when its package imports: ``unused`` names it
  with the reason, taken from the package's own loading code.  A library of the NVIDIA
  driver (libcuda.so.1) cannot load on a host without the driver whatever the environment
  holds: an object that needs only that is healthy, as in the loader corpus.

Where the import is the truth (``imports``), the module's import is a case of its own:
`python -c "import M"` with the site on PYTHONPATH, against `seedance check --python PY
--imports M` with the same PYTHONPATH (a prediction that the import fails is an error).

cases(workdir) and evaluate(case) are the interface bench/bench_accuracy.py shares with the
other corpora; SMALL cases (a few MB of wheels per family) run in `make test`, the whole
corpus in `make bench-accuracy`.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.accuracy.conftest import CORPUS, PY, Unavailable, install, merged
from tests.conftest import run_cli

pytestmark = pytest.mark.timeout(1800)

PURELIB = Path(sysconfig.get_paths()["purelib"])


@dataclass
class Env:
    label: str
    family: str
    installs: list  # [(cache name, pip requirement)] or ("torch", "2.13" | "2.4.1")
    subjects: list  # top-level entries of site-packages whose ELF objects are the cases
    first: list = field(default_factory=list)  # modules imported before the objects load
    nvidia_preload: bool = False  # the package loads site-packages/nvidia/*/lib first
    imports: list = field(default_factory=list)  # modules whose import is a case
    unused: dict = field(default_factory=dict)  # glob on the file name -> why it is never loaded
    small: bool = False  # part of `make test`
    site: Path | None = None


@dataclass
class Case:
    name: str
    kind: str  # the family (the bench's rows)
    env: Env
    subject: Path | None = None  # an object, or None for an import case
    module: str = ""


T13 = ("torch", "2.13")
T24 = ("torch", "2.4.1")
CU12_RUNTIME = ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu12")
CUBLAS12 = ("cublas-cu12", "nvidia-cublas-cu12")
NVJIT129 = ("nvjitlink-cu12-12.9", "nvidia-nvjitlink-cu12==12.9.86")
CUDNN12 = ("nvidia-cudnn-cu12", "nvidia-cudnn-cu12")
SCIPY = ("scipy", "scipy")  # the loader corpus's install

# bitsandbytes/cextension.py picks one libbitsandbytes_<backend><version>.so by the torch
# beside it (torch.version.cuda / hip); the others are never loaded
BNB_UNUSED = {"libbitsandbytes_cuda*.so": "a CUDA build; bitsandbytes loads the CPU build beside a CPU torch",
              "libbitsandbytes_xpu*.so": "an Intel XPU build; bitsandbytes loads the CPU build beside a CPU torch",
              "libbitsandbytes_rocm*.so": "a ROCm build; bitsandbytes loads the CPU build beside a CPU torch"}
ORT_OPTIONAL = {"libonnxruntime_providers_tensorrt.so":
                "the TensorRT execution provider, loaded only when a session asks for it"}

ENVS = [
    # --- vision, audio and codec extensions of torch, at matching and mismatching releases
    Env("torchvision 0.28.0 (PyPI, a CUDA 13 build) + torch 2.13.0+cpu", "torch-extension",
        [("torchvision-0.28.0", "torchvision==0.28.0"), T13], ["torchvision", "torchvision.libs"],
        first=["torch"], imports=["torchvision"], small=True),
    Env("torchvision 0.19.1 (for torch 2.4) + torch 2.13.0+cpu", "torch-extension",
        [("torchvision-0.19.1", "torchvision==0.19.1"), T13], ["torchvision", "torchvision.libs"],
        first=["torch"], imports=["torchvision"], small=True),
    Env("torchvision 0.19.1 + torch 2.4.1 and its nvidia wheels (matched)", "torch-extension",
        [("torchvision-0.19.1", "torchvision==0.19.1"), T24], ["torchvision", "torchvision.libs"],
        first=["torch"], nvidia_preload=True, imports=["torchvision"]),
    Env("torchvision 0.28.0 (for torch 2.13) + torch 2.4.1", "torch-extension",
        [("torchvision-0.28.0", "torchvision==0.28.0"), T24], ["torchvision", "torchvision.libs"],
        first=["torch"], nvidia_preload=True, imports=["torchvision"]),
    Env("torchaudio 2.11.1 + torch 2.13.0+cpu", "torch-extension",
        [("torchaudio-2.11.1", "torchaudio==2.11.1"), T13], ["torchaudio"], first=["torch"],
        imports=["torchaudio"], small=True),
    Env("torchaudio 2.4.1 (for torch 2.4) + torch 2.13.0+cpu", "torch-extension",
        [("torchaudio-2.4.1", "torchaudio==2.4.1"), T13], ["torchaudio"], first=["torch"],
        imports=["torchaudio"]),
    Env("torchaudio 2.4.1 + torch 2.4.1 and its nvidia wheels (matched)", "torch-extension",
        [("torchaudio-2.4.1", "torchaudio==2.4.1"), T24], ["torchaudio"], first=["torch"], nvidia_preload=True,
        imports=["torchaudio"]),
    Env("torchcodec 0.17.0 + torch 2.13.0+cpu (FFmpeg 4-8 builds)", "torch-extension",
        [("torchcodec-0.17.0", "torchcodec==0.17.0"), T13], ["torchcodec"], first=["torch"],
        imports=["torchcodec"]),
    Env("xformers 0.0.35 + torch 2.13.0+cpu", "torch-extension",
        [("xformers", "xformers"), T13], ["xformers"], first=["torch"], imports=["xformers"]),
    # --- quantisation
    Env("bitsandbytes 0.50.2 + torch 2.13.0+cpu", "quantisation",
        [("bitsandbytes", "bitsandbytes==0.50.2"), T13], ["bitsandbytes"], first=["torch"],
        imports=["bitsandbytes"], unused=BNB_UNUSED),
    Env("torchao 0.18.0 + torch 2.13.0+cpu", "quantisation",
        [("torchao-0.18.0", "torchao==0.18.0"), T13], ["torchao"], first=["torch"], imports=["torchao"], small=True),
    Env("torchao 0.7.0 (for torch 2.5) + torch 2.13.0+cpu", "quantisation",
        [("torchao-0.7.0", "torchao==0.7.0"), T13], ["torchao"], first=["torch"], imports=["torchao"]),
    Env("auto-gptq 0.7.1 (kernels built for torch 2.2, CUDA 12.1) + torch 2.4.1 and its nvidia wheels",
        "quantisation", [("auto-gptq", "auto-gptq==0.7.1"), T24], ["autogptq_*.so", "exllama*.so"],
        first=["torch"], nvidia_preload=True),
    Env("auto-gptq 0.7.1 + torch 2.13.0+cpu", "quantisation", [("auto-gptq", "auto-gptq==0.7.1"), T13],
        ["autogptq_*.so", "exllama*.so"], first=["torch"]),
    # --- onnxruntime-gpu on CUDA 12 and 13
    Env("onnxruntime-gpu 1.31.1 alone", "onnxruntime-gpu",
        [("onnxruntime-gpu", "onnxruntime-gpu==1.31.1")], ["onnxruntime"], imports=["onnxruntime"],
        unused=ORT_OPTIONAL),
    Env("onnxruntime-gpu 1.22.0 (CUDA 12) + cudart, cuBLAS, cuDNN, cuFFT, cuRAND 12", "onnxruntime-gpu",
        [("onnxruntime-gpu-1.22.0", "onnxruntime-gpu==1.22.0"), CU12_RUNTIME, CUBLAS12, CUDNN12,
         ("nvidia-cufft-cu12", "nvidia-cufft-cu12"), ("nvidia-curand-cu12", "nvidia-curand-cu12")],
        ["onnxruntime"], nvidia_preload=True, imports=["onnxruntime"], unused=ORT_OPTIONAL),
    Env("onnxruntime-gpu 1.22.0 (CUDA 12) alone", "onnxruntime-gpu",
        [("onnxruntime-gpu-1.22.0", "onnxruntime-gpu==1.22.0")], ["onnxruntime"], imports=["onnxruntime"],
        unused=ORT_OPTIONAL),
    # --- JAX with its CUDA plugin
    Env("jaxlib 0.10.2 + jax-cuda12-plugin/pjrt + their CUDA 12 wheels", "jax",
        [("jax-0.10.2", "jax==0.10.2"), ("jaxlib-0.10.2", "jaxlib==0.10.2"), ("ml-dtypes", "ml_dtypes"),
         ("jax-cuda12-plugin-0.10.2", "jax-cuda12-plugin==0.10.2"), ("jax-cuda12-pjrt-0.10.2", "jax-cuda12-pjrt==0.10.2"),
         CU12_RUNTIME, CUBLAS12, CUDNN12, ("nvidia-cufft-cu12", "nvidia-cufft-cu12"),
         ("nvidia-cusolver-cu12", "nvidia-cusolver-cu12"), ("cusparse-cu12", "nvidia-cusparse-cu12==12.5.10.65"),
         NVJIT129, ("nvidia-nccl-cu12", "nvidia-nccl-cu12"), ("nvidia-cuda-nvrtc-cu12", "nvidia-cuda-nvrtc-cu12"),
         ("nvidia-cuda-cupti-cu12", "nvidia-cuda-cupti-cu12"),
         SCIPY, ("opt-einsum", "opt_einsum")],
        ["jaxlib", "jax_plugins", "jax_cuda12_plugin"], nvidia_preload=True, imports=["jax"]),
    Env("jaxlib 0.10.2 + jax-cuda12-plugin/pjrt without the CUDA wheels", "jax",
        [("jax-0.10.2", "jax==0.10.2"), ("jaxlib-0.10.2", "jaxlib==0.10.2"), ("ml-dtypes", "ml_dtypes"),
         ("jax-cuda12-plugin-0.10.2", "jax-cuda12-plugin==0.10.2"), ("jax-cuda12-pjrt-0.10.2", "jax-cuda12-pjrt==0.10.2"),
         SCIPY, ("opt-einsum", "opt_einsum")],
        ["jax_plugins", "jax_cuda12_plugin"], nvidia_preload=True, imports=["jax"]),
    Env("jax-cuda13-plugin/pjrt 0.10.2 without the CUDA wheels", "jax",
        [("jax-cuda13-plugin-0.10.2", "jax-cuda13-plugin==0.10.2"), ("jax-cuda13-pjrt-0.10.2", "jax-cuda13-pjrt==0.10.2")],
        ["jax_plugins", "jax_cuda13_plugin"], nvidia_preload=True, small=True),
    # --- GPU search
    Env("faiss-cpu", "faiss", [("faiss-cpu", "faiss-cpu")], ["faiss", "faiss_cpu.libs"], imports=["faiss"],
        small=True),
    Env("faiss-gpu-cu12 + cudart and cuBLAS 12", "faiss",
        [("faiss-gpu-cu12", "faiss-gpu-cu12"), CU12_RUNTIME, CUBLAS12], ["faiss", "faiss_gpu_cu12.libs"],
        nvidia_preload=True, imports=["faiss"]),
    Env("faiss-gpu-cu12 without cudart and cuBLAS", "faiss", [("faiss-gpu-cu12", "faiss-gpu-cu12")],
        ["faiss", "faiss_gpu_cu12.libs"], imports=["faiss"]),
    # --- triton
    Env("triton", "triton", [("triton", "triton")], ["triton"], imports=["triton"]),
    # --- NVIDIA library wheels: NCCL, cuDNN, cuTENSOR, cuSOLVER, cuFFT, cuRAND, NVRTC
    Env("nvidia-nccl-cu12", "nvidia-libraries", [("nvidia-nccl-cu12", "nvidia-nccl-cu12")], ["nvidia"]),
    Env("nvidia-cudnn-cu12 + cuBLAS 12", "nvidia-libraries", [CUDNN12, CUBLAS12], ["nvidia/cudnn"],
        nvidia_preload=True),
    Env("nvidia-cudnn-cu12 without cuBLAS", "nvidia-libraries", [CUDNN12], ["nvidia/cudnn"], nvidia_preload=True),
    Env("cutensor-cu12 + cuBLAS 12", "nvidia-libraries", [("cutensor-cu12", "cutensor-cu12"), CUBLAS12],
        ["cutensor"], nvidia_preload=True),
    Env("cutensor-cu12 without cuBLAS", "nvidia-libraries", [("cutensor-cu12", "cutensor-cu12")], ["cutensor"]),
    Env("nvidia-cusolver-cu12 + cuBLAS, cuSPARSE, nvJitLink 12.9", "nvidia-libraries",
        [("nvidia-cusolver-cu12", "nvidia-cusolver-cu12"), CUBLAS12, ("cusparse-cu12", "nvidia-cusparse-cu12==12.5.10.65"),
         NVJIT129], ["nvidia/cusolver"], nvidia_preload=True),
    Env("nvidia-cusolver-cu12 without cuBLAS/cuSPARSE", "nvidia-libraries",
        [("nvidia-cusolver-cu12", "nvidia-cusolver-cu12"), NVJIT129], ["nvidia/cusolver"], nvidia_preload=True),
    Env("nvidia-cufft-cu12, nvidia-curand-cu12, nvidia-cuda-runtime-cu12, nvidia-cuda-nvrtc-cu12", "nvidia-libraries",
        [("nvidia-cufft-cu12", "nvidia-cufft-cu12"), ("nvidia-curand-cu12", "nvidia-curand-cu12"), CU12_RUNTIME,
         ("nvidia-cuda-nvrtc-cu12", "nvidia-cuda-nvrtc-cu12")], ["nvidia"], nvidia_preload=True),
    Env("nvidia-cuda-runtime-cu12", "nvidia-libraries", [CU12_RUNTIME], ["nvidia"], small=True),
    Env("cupy-cuda12x + cudart, cuBLAS, cuSPARSE, cuRAND, cuFFT, cuSOLVER, NVRTC, nvJitLink", "nvidia-libraries",
        [("cupy-cuda12x", "cupy-cuda12x"), CU12_RUNTIME, CUBLAS12, ("cusparse-cu12", "nvidia-cusparse-cu12==12.5.10.65"),
         ("nvidia-curand-cu12", "nvidia-curand-cu12"), ("nvidia-cufft-cu12", "nvidia-cufft-cu12"),
         ("nvidia-cusolver-cu12", "nvidia-cusolver-cu12"), ("nvidia-cuda-nvrtc-cu12", "nvidia-cuda-nvrtc-cu12"),
         NVJIT129, ("fastrlock", "fastrlock"), ("cuda-pathfinder", "cuda-pathfinder")], ["cupy", "cupy_backends", "cupyx"], nvidia_preload=True,
        imports=["cupy"]),
    # --- machine-learning wheels with vendored native libraries
    Env("xgboost (+ nvidia-nccl-cu12 it dlopens)", "ml-native",
        [("xgboost", "xgboost"), ("nvidia-nccl-cu12", "nvidia-nccl-cu12"), SCIPY], ["xgboost"], imports=["xgboost"]),
    Env("lightgbm", "ml-native", [("lightgbm", "lightgbm"), SCIPY, ("narwhals", "narwhals")], ["lightgbm"], imports=["lightgbm"]),
    Env("scikit-learn", "ml-native", [("scikit-learn", "scikit-learn"), SCIPY, ("joblib", "joblib"),
                                      ("threadpoolctl", "threadpoolctl")], ["sklearn", "scikit_learn.libs"],
        imports=["sklearn"]),
    Env("pyarrow", "ml-native", [("pyarrow", "pyarrow")], ["pyarrow", "pyarrow.libs"], imports=["pyarrow"]),
    Env("pillow", "ml-native", [("pillow", "pillow")], ["PIL", "pillow.libs"], imports=["PIL.Image"], small=True),
    Env("h5py", "ml-native", [("h5py", "h5py")], ["h5py", "h5py.libs"], imports=["h5py"]),
    Env("soundfile", "ml-native", [("soundfile", "soundfile")], ["_soundfile_data"], imports=["soundfile"]),
    Env("ml_dtypes, tokenizers, safetensors, sentencepiece", "ml-native",
        [("ml-dtypes", "ml_dtypes"), ("tokenizers", "tokenizers"), ("safetensors", "safetensors"),
         ("sentencepiece", "sentencepiece")], ["ml_dtypes", "tokenizers", "safetensors", "sentencepiece"],
        imports=["ml_dtypes", "safetensors", "sentencepiece"]),
    Env("llvmlite + numba", "ml-native", [("llvmlite", "llvmlite"), ("numba", "numba")],
        ["llvmlite", "numba"], imports=["numba"]),
    Env("av (PyAV, vendored FFmpeg)", "ml-native", [("av", "av")], ["av", "av.libs"], imports=["av"]),
    Env("tensorflow 2.21.0", "tensorflow", [("tensorflow", "tensorflow==2.21.0")],
        ["tensorflow", "tensorflow.libs"],
        # no Python file of the wheel names it (gen_xla_ops.py holds the op wrappers, whose
        # kernels _pywrap_tensorflow_internal registers); loaded beside libtensorflow_framework
        # its static initialisers register XLA's flags a second time and abort the process
        unused={"_xla_ops.so": "tensorflow's Python code loads no _xla_ops.so: the XLA ops live in "
                               "_pywrap_tensorflow_internal.so"}),
]

# wheels PyPI has no binary of: listed, counted, with the reason (never silently passed)
KNOWN_LIMITS = [
    ("tensorrt", "PyPI holds only source releases of tensorrt / tensorrt-cu12 that fetch the wheels from "
                 "NVIDIA's own index at install time, which this machine cannot reach"),
    ("llama-cpp-python", "PyPI holds only the source release (prebuilt CUDA wheels are on the project's own index)"),
]


# --- laying out an environment -------------------------------------------------------------------

def _torch_install(version: str) -> Path:
    """An install dir holding one torch: the venv's own (2.13 CPU, linked) or torch 2.4.1 with
    its nvidia-* wheels (test_torch_accuracy's PyPI install)."""
    if version == "2.4.1":
        from tests.accuracy.test_torch_accuracy import Unavailable as TorchUnavailable, old_torch_env

        try:
            return old_torch_env().site
        except TorchUnavailable as exc:
            raise Unavailable(str(exc)) from exc
    if not (PURELIB / "torch" / "version.py").is_file():
        raise Unavailable("this venv has no torch")
    infos = sorted(p.name for p in PURELIB.glob("torch-*.dist-info"))
    target = CORPUS / f"venv-torch-{infos[0] if infos else 'unknown'}"
    if not (target / ".seedance-complete").is_file():
        from tests.accuracy.conftest import _link

        import shutil

        shutil.rmtree(target, ignore_errors=True)
        for entry in ["torch", *infos]:
            shutil.copytree(PURELIB / entry, target / entry, copy_function=_link, symlinks=True)
        (target / ".seedance-complete").write_text("the venv's torch\n")
    return target


def build(env: Env) -> Path:
    installs = []
    for name, requirement in env.installs:
        installs.append(_torch_install(requirement) if name == "torch" else install(name, requirement))
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", env.label).strip("-")[:80]
    # the layout's name carries what it is made of: adding a wheel lays out a new environment
    digest = hashlib.sha256("\n".join(map(str, installs)).encode()).hexdigest()[:8]
    env.site = merged(f"gpu-{slug}-{digest}", installs)
    return env.site


def elf_files(top: Path) -> list:
    found = []
    for base, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(base, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as handle:
                if handle.read(4) == b"\x7fELF":
                    found.append(path)
    return found


def objects_of(env: Env) -> list:
    """The ELF objects of the package under test: its subjects are site-packages entries or
    globs (auto-gptq's kernels are top-level extension modules)."""
    found = []
    for subject in env.subjects:
        for entry in sorted(env.site.glob(subject)):
            if entry.is_dir():
                found += elf_files(entry)
            elif entry.is_file() and not entry.is_symlink() and entry.read_bytes()[:4] == b"\x7fELF":
                found.append(str(entry))
    return found


# --- the oracle -----------------------------------------------------------------------------------

_LOADER = r"""
import ctypes, glob, importlib, json, os, re, sys
job = json.load(sys.stdin)
sys.path.insert(0, job["site"])
first_error = ""
for module in job["first"]:
    try:
        importlib.import_module(module)
    except Exception as exc:
        first_error = f"import {module}: {type(exc).__name__}: {exc}"
cannot_open = re.compile(r"(?:^|: )([^:\s]+): cannot open shared object file")
results = []
for path in job["objects"]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        out = {"ok": False, "error": first_error, "preloaded": [], "mapped": []}

        def candidate(of, missing):
            # a library in a repair tool's <dist>.libs directory is loaded as a NEEDED of the
            # package's module, after the sibling that module also names
            sibling = os.path.join(os.path.dirname(of), missing)
            if of.split(os.sep)[-2].endswith(".libs") and os.path.isfile(sibling):
                return sibling
            if job["nvidia"]:
                found = sorted(glob.glob(os.path.join(job["site"], "nvidia", "*", "lib", missing)))
                return found[0] if found else None
            return None

        def load(target, mode, depth=0):
            while True:
                try:
                    ctypes.CDLL(target, mode)
                    return None
                except OSError as exc:
                    match = cannot_open.search(str(exc))
                    first = candidate(target, match.group(1)) if match else None
                    if first is None or first in out["preloaded"] or depth > 12:
                        return str(exc)
                    error = load(first, os.RTLD_NOW | os.RTLD_GLOBAL, depth + 1)
                    if error is not None:
                        return f"preloading {first}: {error}"
                    out["preloaded"].append(first)

        if not first_error:
            error = load(path, os.RTLD_NOW)
            if error is None:
                out["ok"], out["error"] = True, ""
                with open("/proc/self/maps") as maps:
                    out["mapped"] = sorted({l.split(None, 5)[5].strip() for l in maps
                                            if l.count(" ") >= 5 and "/" in l})
            else:
                out["error"] = error
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while True:
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    data = b"".join(chunks)
    results.append(json.loads(data) if data else {"ok": False, "error": "the loader aborted", "preloaded": [],
                                                  "mapped": []})
print(json.dumps(results))
"""

_CANNOT_OPEN = re.compile(r"(?:^|: )([^:\s]+): cannot open shared object file")


def _clean_env(site: Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "PYTHON"))}
    env["LC_ALL"] = "C"
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return env


def _driver_on_host() -> bool:
    ldconfig = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True, errors="replace")
    return "libcuda.so.1 " in ldconfig.stdout


def truths(env: Env) -> dict:
    """path -> (loads in practice, how) for every object of the package under test."""
    objects = objects_of(env)
    if not objects:
        return {}
    proc = subprocess.run([sys.executable, "-c", _LOADER], input=json.dumps(
        {"site": str(env.site), "first": env.first, "objects": objects, "nvidia": env.nvidia_preload}),
        capture_output=True, text=True, errors="replace", timeout=1200, env=_clean_env(), cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = dict(zip(objects, json.loads(proc.stdout.strip().splitlines()[-1])))
    mapped = {}
    for path, result in results.items():
        for real in result["mapped"]:
            mapped.setdefault(real, path)
    driver = _driver_on_host()
    for path, result in results.items():
        # a program cannot be dlopened: ld.so loads its closure when it runs (ldd -r relocates
        # every library and symbol in trace mode)
        if not result["ok"] and "cannot dynamically load" in result["error"]:
            ldd = subprocess.run(["ldd", "-r", path], capture_output=True, text=True, errors="replace",
                                 env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"})
            text = ldd.stdout + ldd.stderr
            if ldd.returncode == 0 and "not found" not in text and "undefined symbol" not in text:
                result["ok"], result["preloaded"] = True, []
            else:
                result["error"] = "a program: " + " ".join(l.strip() for l in text.splitlines()
                                                           if "not found" in l or "undefined symbol" in l)
    verdicts = {}
    for path, result in results.items():
        name = os.path.basename(path)
        missing = _CANNOT_OPEN.search(result["error"])
        if result["ok"]:
            how = ("loads after " + ", ".join(os.path.relpath(p, env.site) for p in result["preloaded"])
                   if result["preloaded"] else "loads" + (f" after import {', '.join(env.first)}" if env.first else ""))
            verdicts[path] = (True, how)
        elif os.path.realpath(path) in mapped:
            verdicts[path] = (True, f"loaded by {os.path.relpath(mapped[os.path.realpath(path)], env.site)}")
        elif not driver and missing and missing.group(1).startswith(("libcuda.so", "libnvidia-ml.so")):
            verdicts[path] = (True, f"needs {missing.group(1)}, which only the NVIDIA driver installs")
        elif any(fnmatch.fnmatch(name, glob) for glob in env.unused):
            why = next(why for glob, why in env.unused.items() if fnmatch.fnmatch(name, glob))
            verdicts[path] = (True, f"never loaded here: {why} ({result['error'][:160]})")
        else:
            verdicts[path] = (False, result["error"][:400])
    return verdicts


def import_truth(env: Env, module: str) -> tuple:
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True,
                          errors="replace", timeout=600, env=_clean_env(env.site), cwd="/")
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    return proc.returncode == 0, ("imports" if proc.returncode == 0 else last[:400])


# --- seedance's verdicts ---------------------------------------------------------------------------

_REPORTS: dict = {}
_TRUTHS: dict = {}


def report_for(env: Env) -> dict:
    key = str(env.site)
    if key not in _REPORTS:
        proc = run_cli("check", "--json", "--no-progress", env.site, timeout=1200)
        assert proc.returncode in (0, 1), proc.stderr[-2000:]
        _REPORTS[key] = json.loads(proc.stdout)
    return _REPORTS[key]


def import_report(env: Env, module: str) -> tuple:
    """(exit code, findings) of `seedance check --python PY --imports MODULE` with the site on
    PYTHONPATH, as the user's interpreter would see it."""
    command = [sys.executable, "-m", "seedance", "check", "--json", "--no-progress",
               "--python", sys.executable, "--imports", module]
    proc = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=1200,
                          env=_clean_env(env.site), cwd="/")
    if proc.returncode not in (0, 1):
        return proc.returncode, [{"rule": "exit", "severity": "fatal", "message": proc.stderr.strip()[-300:],
                                  "subject": {}}]
    return proc.returncode, json.loads(proc.stdout)["findings"]


def evaluate(case: Case) -> dict:
    env = case.env
    if case.subject is None:
        loads, how = import_truth(env, case.module)
        code, findings = import_report(env, case.module)
        bad = [f for f in findings if f["severity"] in ("error", "fatal")]
        return {"case": case.name, "kind": case.kind, "predicted_broken": bool(bad), "broken": not loads,
                "how": how, "rules": sorted({f["rule"] for f in bad}),
                "messages": [f["message"] for f in bad][:3]}
    report = report_for(env)
    if str(env.site) not in _TRUTHS:
        _TRUTHS[str(env.site)] = truths(env)
    real = os.path.realpath(case.subject)
    # the object's own findings, and the load failures it fails with (their also_fails: the
    # objects of the tree whose closure maps the failing object)
    mine = [f for f in report["findings"] if os.path.realpath(f["subject"].get("path", "") or "/") == real
            or any(os.path.realpath(p) == real for p in f["evidence"].get("also_fails", ()))]
    bad = [f for f in mine if f["severity"] in ("error", "fatal")]
    loads, how = _TRUTHS[str(env.site)][str(case.subject)]
    return {"case": case.name, "kind": case.kind, "predicted_broken": bool(bad), "broken": not loads,
            "how": how, "rules": sorted({f["rule"] for f in bad}),
            "messages": [f["message"] for f in bad][:3]}


UNAVAILABLE: list = []


def cases(workdir: Path | None = None, small_only: bool = False, families=None) -> list:
    """Every case of the corpus; with small_only the SMALL environments' objects (their import
    cases, a --imports prediction each, are left to the bench: each takes the interpreter's
    whole import closure).  A part whose wheel cannot be had is listed in UNAVAILABLE with
    pip's reason, KNOWN_LIMITS beside it."""
    UNAVAILABLE[:] = []
    found = []
    for env in ENVS:
        if (small_only and not env.small) or (families and env.family not in families):
            continue
        try:
            build(env)
        except Unavailable as exc:
            UNAVAILABLE.append(f"{env.label}: {exc}")
            continue
        for path in objects_of(env):
            found.append(Case(f"{env.label}: {os.path.relpath(path, env.site)}", env.family, env, Path(path)))
        for module in () if small_only else env.imports:
            found.append(Case(f"{env.label}: import {module}", env.family, env, None, module))
    if not found:
        raise Unavailable("; ".join(UNAVAILABLE) or "no environment could be built")
    return found


# --- the tests (the SMALL subset; `make bench-accuracy` runs the whole corpus) ---------------------

@pytest.fixture(scope="module")
def small_rows():
    try:
        corpus = cases(small_only=True)
    except Unavailable as exc:
        pytest.skip(str(exc))
    return [evaluate(case) for case in corpus]


def _table(rows) -> str:
    return "\n".join(f"{r['case']}: seedance {'BROKEN' if r['predicted_broken'] else 'ok'} {r['rules']}, "
                     f"really {'BROKEN' if r['broken'] else 'ok'} ({r['how']})" for r in rows)


def test_small_gpu_corpus_verdicts_match_the_loader(small_rows):
    wrong = [r for r in small_rows if r["predicted_broken"] != r["broken"]]
    assert not wrong, _table(wrong)
    # both kinds of case are really there: objects that fail to load and objects that load
    assert any(r["broken"] for r in small_rows) and sum(not r["broken"] for r in small_rows) > 10, _table(small_rows)


def test_small_gpu_corpus_was_available(small_rows):
    if UNAVAILABLE:
        pytest.skip("; ".join(UNAVAILABLE))


if __name__ == "__main__":
    rows = [evaluate(case) for case in cases(small_only="--small" in sys.argv)]
    print(_table(rows))
