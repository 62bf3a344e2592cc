"""torch-ext: move stale torch extension builds into the journal and rebuild them for today.

Which builds are stale is the check's decision (collect.torch_ext facts -> rule
torch-ext-stale); this module only acts on those findings.  A stale build directory is
moved, whole, into the journal (undo moves it back).  A rebuild runs
torch.utils.cpp_extension.load in a child process, from the sources the old build.ninja
names, for the torch the current Python imports, with TORCH_CUDA_ARCH_LIST set to the
architectures of the GPUs present (torch.cuda device capabilities; NVML sees the same
devices) so the new build carries SASS for exactly those GPUs.  The child imports the
module it built, which is the verification.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field

from ..model.errors import BadInput
from .plan import TORCH_EXT_RULES

_BUILD_LINE = re.compile(r"^build\s+\S+:\s+(compile|cuda_compile)\s+(.+?)\s*$")
# flags torch.utils.cpp_extension adds itself; passing them again would duplicate them
_TORCH_OWNED = ("-DTORCH_EXTENSION_NAME", "-DTORCH_API_INCLUDE_EXTENSION_H", "-DPYBIND11_",
                "-D_GLIBCXX_USE_CXX11_ABI")


@dataclass
class StaleBuild:
    path: str
    name: str
    reasons: list
    message: str
    sources: list = field(default_factory=list)
    extra_cflags: list = field(default_factory=list)
    cuda: bool = False


def check_caches(roots=None) -> tuple:
    """(findings, facts) from the check's own collector and rules for the extension caches."""
    from ..collect import torch_ext
    from ..judge.engine import load_rules

    # judged against the torch of this interpreter: it is the one rebuild() builds with
    facts = torch_ext.torch_ext_facts(roots if roots is not None else torch_ext.cache_roots(),
                                      torch=torch_ext.find_torch())
    findings = [f for f in load_rules().evaluate(facts) if f.rule in TORCH_EXT_RULES]
    return findings, facts


def stale_builds(findings) -> list:
    builds = []
    for finding in findings:
        if finding.rule != "torch-ext-stale":
            continue
        path = finding.subject.get("path")
        name = os.path.basename(path)
        sources, cflags, cuda = read_ninja_sources(path)
        builds.append(StaleBuild(path=path, name=name, reasons=list(finding.evidence.get("reasons", [])),
                                 message=finding.message, sources=sources, extra_cflags=cflags, cuda=cuda))
    return builds


def read_ninja_sources(build_dir: str) -> tuple:
    """(sources, the user's own -O/-D/-I flags, has CUDA sources) from build.ninja."""
    sources, cflags, cuda = [], [], False
    try:
        with open(os.path.join(build_dir, "build.ninja"), encoding="utf-8", errors="replace") as handle:
            text = handle.read(1 << 20)
    except OSError:
        return sources, cflags, cuda
    for line in text.splitlines():
        match = _BUILD_LINE.match(line)
        if match:
            source = match.group(2).replace("$ ", " ").replace("$:", ":").replace("$$", "$")
            sources.append(source)
            cuda = cuda or match.group(1) == "cuda_compile" or source.endswith(".cu")
        key, sep, value = line.partition(" = ")
        if sep and key.strip() == "cflags":
            for token in value.split():
                if token.startswith(("-O", "-D")) and not token.startswith(_TORCH_OWNED):
                    cflags.append(token)
                elif token.startswith("-I") and "/torch/include" not in token and "/include/python" not in token:
                    cflags.append(token)
    return sources, cflags, cuda


def select(builds, rebuild: str | None) -> list:
    """Which builds to rebuild: one NAME, custom_kernels (the CUDA kernel modules), or all."""
    if not rebuild:
        return []
    if rebuild == "all":
        return builds
    if rebuild == "custom_kernels":
        return [b for b in builds if b.cuda or b.name == "custom_kernels"]
    chosen = [b for b in builds if b.name == rebuild]
    if not chosen:
        names = ", ".join(sorted({b.name for b in builds})) or "none"
        raise BadInput(f"--rebuild {rebuild}: no stale extension build of that name (stale: {names})")
    return chosen


_CHILD = r"""
import json, os, sys
spec = json.loads(sys.argv[1])
import torch
from torch.utils import cpp_extension
archs = []
if torch.cuda.is_available():
    for index in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(index)
        archs.append(f"{major}.{minor}")
    archs = sorted(set(archs))
    os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(archs)
module = cpp_extension.load(name=spec["name"], sources=spec["sources"],
                            extra_cflags=spec["extra_cflags"] or None, verbose=False)
print(json.dumps({"module": module.__file__, "archs": archs,
                  "cuda": bool(torch.version.cuda), "torch": torch.__version__,
                  "build_dir": os.path.dirname(module.__file__)}))
"""


def rebuild(build: StaleBuild, environ=None, timeout: int = 900) -> dict:
    """Build ``build`` for the current torch in a child; returns what the child reports."""
    missing = [s for s in build.sources if not os.path.isfile(s)]
    if not build.sources:
        raise BadInput(f"{build.path}: build.ninja names no sources; cannot rebuild {build.name}")
    if missing:
        raise BadInput(f"{build.name}: source {missing[0]} no longer exists; cannot rebuild")
    spec = {"name": build.name, "sources": build.sources, "extra_cflags": build.extra_cflags}
    env = dict(os.environ if environ is None else environ)
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec)], capture_output=True,
                              text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BadInput(f"rebuild of {build.name} did not finish within {timeout} s") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise BadInput(f"rebuild of {build.name} failed: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def expected_build_dir(name: str, environ=None) -> str | None:
    """Where cpp_extension.load will put ``name`` (torch's _get_build_directory), or None."""
    environ = os.environ if environ is None else environ
    if environ.get("TORCH_EXTENSIONS_DIR"):
        return os.path.join(environ["TORCH_EXTENSIONS_DIR"], name)
    from ..collect.torch_ext import find_torch

    torch = find_torch()
    if torch is None:
        return None
    xdg = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "torch_extensions", f"{torch.python_tag}_{torch.accelerator}", name)
