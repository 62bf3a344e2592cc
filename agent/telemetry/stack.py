"""A host's GPU software stack, as labels of one Prometheus info metric.

seedance_gpu_stack_info{driver, cuda_runtime, torch, torch_cuda, torch_cxx11_abi, nccl,
cudnn, images} 1: one series per host, so a fleet's rules can count the hosts of a group
by any label and name the host whose value is not the group's majority (the drift rules
in deploy/prometheus-rules.yaml).

Where the values come from follows what the agent checks:
- with scan paths (agent.yaml scan_paths), the libraries and torch installs under them:
  what those trees ship is what their jobs will load;
- on the whole host, the libraries mapped by running processes (/proc/PID/maps): what is
  in use now, not what merely lies on disk;
- the driver, from the check's own GPU context (NVML, else the kernel module's version);
- the images, of the docker and podman containers whose processes map the CUDA driver or
  torch now (their cgroup names the container, the engine's state file its image), in
  both cases: what a tree ships says nothing of which image runs it.  A CRI container's
  image is not named in any file of the kubelet's that a node agent can read simply (it
  lives in containerd's or CRI-O's own databases), so those are left out.

Cardinality stays bounded however a host looks: versions are cut to major.minor (a patch
release is not drift worth a page), a label holds at most MAX_VALUES distinct values
(sorted, joined by ','), each at most MAX_VALUE_LEN characters, and the walk and the
process scan stop at fixed limits.
"""
from __future__ import annotations

import os
import re

LABELS = ("driver", "cuda_runtime", "torch", "torch_cuda", "torch_cxx11_abi", "nccl", "cudnn", "images")
MAX_VALUES = 3
MAX_VALUE_LEN = 48
MAX_WALK_ENTRIES = 100_000   # directory entries looked at under the scan paths
MAX_PROCESSES = 4096         # /proc/PID/maps files read on the host scope
MAX_MAPS_BYTES = 4 << 20     # of one process's maps
NONE = "none"                # a component not found: a value of its own, so drift sees it

_LIBRARIES = {"cuda_runtime": re.compile(r"^libcudart\.so\.(\d+)(?:\.(\d+))?"),
              "nccl": re.compile(r"^libnccl\.so\.(\d+)(?:\.(\d+))?"),
              "cudnn": re.compile(r"^libcudnn\.so\.(\d+)(?:\.(\d+))?")}
_TORCH_VERSION = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.M)
_TORCH_CUDA = re.compile(r"""^cuda\s*(?::[^=]*)?=\s*['"]([^'"]+)['"]""", re.M)


def _major_minor(text: str) -> str:
    """'12.4.127' -> '12.4'; '2.3.1+cu121' -> '2.3'; '535.104.05' -> '535.104'."""
    parts = re.findall(r"\d+", text.split("+", 1)[0])
    return ".".join(parts[:2]) if parts else NONE


def _library_version(name: str, real: str | None = None) -> tuple | None:
    for label, pattern in _LIBRARIES.items():
        match = pattern.match(name)
        if match:
            # libcudart.so.12 is a link to libcudart.so.12.4.127: the file's own name is the
            # exact release, the link's only its major
            if real and not match.group(2):
                again = pattern.match(os.path.basename(real))
                if again:
                    match = again
            return label, ".".join(g for g in match.groups() if g)
    return None


def _torch_install(directory: str, found: dict) -> None:
    """A torch package directory (torch/version.py): its version, CUDA and C++ ABI."""
    try:
        with open(os.path.join(directory, "version.py"), encoding="utf-8", errors="replace") as f:
            text = f.read(16384)
    except OSError:
        return
    version = _TORCH_VERSION.search(text)
    if not version:
        return
    found["torch"].add(_major_minor(version.group(1)))
    cuda = _TORCH_CUDA.search(text)
    found["torch_cuda"].add(_major_minor(cuda.group(1)) if cuda else NONE)
    c10 = os.path.join(directory, "lib", "libc10.so")
    if os.path.exists(c10):
        from ..collect.cxxabi import TorchAbiCache

        abi = TorchAbiCache().abi(c10)  # how std::string mangles in torch's own exports
        if abi:
            found["torch_cxx11_abi"].add("1" if abi == "cxx11" else "0")


def _walk(paths, found: dict) -> None:
    budget = MAX_WALK_ENTRIES
    for top in paths:
        for directory, dirs, files in os.walk(top):  # links to directories are not followed
            budget -= len(dirs) + len(files)
            if budget < 0:
                return
            if os.path.basename(directory) == "torch" and "version.py" in files:
                _torch_install(directory, found)
            for name in files:
                if name.startswith("lib"):
                    hit = _library_version(name, os.path.realpath(os.path.join(directory, name)))
                    if hit:
                        found[hit[0]].add(_major_minor(hit[1]))


def _engine_container(pid: str, proc: str):
    """(runtime, id) of the docker or podman container PID runs in; None otherwise (a host
    process, an engine's monitor, a CRI container)."""
    from ..collect.container import CGROUP_CAP, parse_cgroup

    try:
        with open(f"{proc}/{pid}/cgroup", "rb") as f:
            found = parse_cgroup(f.read(CGROUP_CAP).decode("utf-8", "replace"))
    except OSError:
        return None
    if found is None or found[0] not in ("docker", "podman") or found[3]:
        return None
    return found[0], found[1]


def _image_value(reference: str) -> str:
    """An image reference as a label value: a digest cut to 12 hex (as the engines print
    ids), and a long name kept by its end, where the repository's own name and tag are."""
    name, at, digest = reference.partition("@")
    if at:
        reference = f"{name}@{digest.split(':', 1)[-1][:12]}"
    return reference if len(reference) <= MAX_VALUE_LEN else reference[-MAX_VALUE_LEN:]


def _processes(found: dict, proc: str = "/proc", libraries: bool = True, state_roots: dict | None = None) -> None:
    """The libraries (LIBRARIES false: only the images) of the processes that map the CUDA
    driver or torch."""
    from ..collect.container import engine_image

    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()][:MAX_PROCESSES]
    except OSError:
        return
    torch_dirs = set()
    containers = set()
    for pid in pids:
        # images only: a host process's maps are not read at all
        container = None if libraries else _engine_container(pid, proc)
        if not libraries and container is None:
            continue
        try:
            with open(f"{proc}/{pid}/maps", "rb") as f:
                text = f.read(MAX_MAPS_BYTES).decode("utf-8", "replace")
        except OSError:
            continue  # gone, or another user's: what can be read is what is reported
        if "libcuda" not in text and "libtorch" not in text:
            continue
        container = container or _engine_container(pid, proc)
        if container is not None:
            containers.add(container)
        if not libraries:
            continue
        for line in text.splitlines():
            path = line.split(None, 5)[5] if line.count(" ") >= 5 else ""
            name = os.path.basename(path)
            hit = _library_version(name) if name.startswith("lib") else None
            if hit:
                found[hit[0]].add(_major_minor(hit[1]))
            elif name.startswith("libc10.so") and os.path.basename(os.path.dirname(os.path.dirname(path))) == "torch":
                torch_dirs.add(os.path.dirname(os.path.dirname(path)))
    for directory in sorted(torch_dirs)[:MAX_VALUES]:
        _torch_install(directory, found)
    for runtime, cid in sorted(containers):
        image = engine_image(runtime, cid, state_roots)
        if image:
            found["images"].add(_image_value(image))


def _label(values) -> str:
    values = sorted(v[:MAX_VALUE_LEN] for v in values if v)
    if not values:
        return NONE
    more = len(values) > MAX_VALUES
    return ",".join(values[:MAX_VALUES]) + (",+" if more else "")


def gpu_stack(paths, driver_version: str | None, proc: str = "/proc", state_roots: dict | None = None) -> dict:
    """The info metric's labels for this host: every label in LABELS, each a bounded string.
    PROC and STATE_ROOTS (the engines' state, seedance.collect.container) are where they
    are read from."""
    found = {label: set() for label in LABELS}
    if paths:
        _walk(paths, found)
    _processes(found, proc, libraries=not paths, state_roots=state_roots)
    found["driver"] = {_major_minor(str(driver_version))} if driver_version else set()
    return {label: _label(found[label]) for label in LABELS}
