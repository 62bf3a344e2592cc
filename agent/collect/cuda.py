"""CUDA runtime majors, the driver each needs, and the GPU facts NVML can tell us.

The runtime major of a libcudart is read from what the file declares (DT_SONAME, then its
version definitions) before its file name: a file *named* libcudart.so.12 whose SONAME is
libcudart.so.11.0 is the 11.x runtime, whatever its name says.
"""
from __future__ import annotations

import os
import re
from ..model.record import NEW, FrozenRecord, Record, set_fields

from ..model.report import Fact

_CUDART = re.compile(r"^libcudart\.so\.(\d+)")

# Minimum Linux driver for each runtime major under CUDA minor-version compatibility:
# the "CUDA Toolkit and Minimum Required Driver Version" table of the CUDA release notes
# (11.x: 450.80.02, 12.x: 525.60.13, 13.x: 580.65.06).  A runtime newer than this fails
# every call with cudaErrorInsufficientDriver.
MIN_DRIVER = {
    10: "410.48",
    11: "450.80.02",
    12: "525.60.13",
    13: "580.65.06",
}


# Newest CUDA each driver branch supports, i.e. what nvidia-smi prints as "CUDA Version"
# (CUDA release notes, "CUDA Toolkit and Corresponding Driver Versions"; 565 is the 12.7
# branch that shipped no toolkit).  A driver branch is the first field of its version.
BRANCH_CUDA = (
    (410, (10, 0)), (418, (10, 1)), (440, (10, 2)),
    (450, (11, 0)), (455, (11, 1)), (460, (11, 2)), (465, (11, 3)), (470, (11, 4)),
    (495, (11, 5)), (510, (11, 6)), (515, (11, 7)), (520, (11, 8)),
    (525, (12, 0)), (530, (12, 1)), (535, (12, 2)), (545, (12, 3)), (550, (12, 4)),
    (555, (12, 5)), (560, (12, 6)), (565, (12, 7)), (570, (12, 8)), (575, (12, 9)),
    (580, (13, 0)), (590, (13, 1)),
)


def version_tuple(text: str) -> tuple:
    parts = []
    for piece in str(text).strip().split("."):
        if not piece.isdigit():
            raise ValueError(f"not a driver version: {text!r} (expected e.g. 550.54.15)")
        parts.append(int(piece))
    if not parts:
        raise ValueError(f"not a driver version: {text!r}")
    return tuple(parts)


class DriverSpec(FrozenRecord):
    """What --driver-version (or NVML) says about the driver (frozen, as the
    @dataclass(frozen=True) it was: record.py).

    kind "driver": a full version (535.104.05); "branch": a branch (535), taken as its
    newest release; "cuda": a CUDA version (12.4, what nvidia-smi prints as "CUDA
    Version"), the newest CUDA the driver supports, NOT a driver version.
    version: the driver version, or (branch,) for a branch; () for a CUDA version.
    cuda: the newest CUDA (major, minor) it supports; None when older than our table.
    """
    _fields = ("text", "kind", "version", "cuda")

    def __init__(self, text: str, kind: str, version: tuple, cuda: tuple | None):
        set_fields(self, {"text": text, "kind": kind, "version": version, "cuda": cuda})

    def meets(self, required: str) -> bool:
        """Is this driver at least ``required`` (a full driver version from NVIDIA's table)?"""
        need = version_tuple(required)
        if self.kind == "driver":
            return self.version >= need
        if self.kind == "branch":
            return self.version[0] >= need[0]  # every release of a newer branch; ours at its newest
        # a CUDA version X.Y: each floor is the first driver of its major, so a driver for
        # CUDA X.Y meets the floors of majors <= X (minor-version compatibility)
        return self.cuda[0] >= _major_of(need)

    def describe(self) -> str:
        cuda = f"CUDA {self.cuda[0]}.{self.cuda[1]}" if self.cuda else "CUDA < 10.0"
        if self.kind == "driver":
            return f"driver {self.text} ({cuda})"
        if self.kind == "branch":
            return f"driver branch {self.text} ({cuda})"
        return f"a driver for {cuda}"


def _major_of(required: tuple) -> int:
    """The runtime major whose floor is ``required`` (else the newest major below it)."""
    best = 0
    for major, floor in MIN_DRIVER.items():
        if version_tuple(floor) <= required:
            best = max(best, major)
    return best


def parse_driver_version(text: str) -> DriverSpec:
    """'535.104.05' (driver), '535' (branch) or '12.4' (CUDA version); ValueError otherwise.

    Driver versions and branches start at 100 or above (every driver since the 100 series);
    CUDA versions at 1-99.  So the first field decides which one was meant.
    """
    value = str(text).strip()
    parts = version_tuple(value)  # raises on anything but dotted digits
    if parts[0] < 100:
        if len(parts) > 3:
            raise ValueError(f"not a CUDA version: {text!r} (expected e.g. 12.4)")
        cuda = (parts[0], parts[1] if len(parts) > 1 else 0)
        if cuda < BRANCH_CUDA[0][1]:
            raise ValueError(f"CUDA {value} is older than any driver seedance knows (10.0)")
        return DriverSpec(value, "cuda", (), cuda)
    if len(parts) > 3:
        raise ValueError(f"not a driver version: {text!r} (expected e.g. 550.54.15)")
    kind = "branch" if len(parts) == 1 else "driver"
    return DriverSpec(value, kind, parts, branch_cuda(parts[0]))


def is_cudart(path: str, info=None) -> bool:
    names = [os.path.basename(path)]
    if info is not None and info.soname:
        names.append(info.soname)
    return any(n.startswith("libcudart.so") for n in names)


def runtime_major(path: str, info=None) -> int | None:
    """Major of a libcudart: SONAME, then version nodes, then the file name."""
    candidates = []
    if info is not None:
        candidates.append(info.soname or "")
        candidates.extend(info.version_defs)
    candidates.append(os.path.basename(path))
    for name in candidates:
        match = _CUDART.match(name or "")
        if match:
            return int(match.group(1))
    return None


def branch_cuda(branch: int) -> tuple | None:
    best = None
    for first, cuda in BRANCH_CUDA:
        if branch >= first:
            best = cuda
    return best


def _spec(driver) -> DriverSpec:
    return driver if isinstance(driver, DriverSpec) else parse_driver_version(driver)


def driver_max_major(driver_version) -> int | None:
    """Highest runtime major this driver supports, or None when it supports none we know."""
    spec = _spec(driver_version)
    best = None
    for major, needed in MIN_DRIVER.items():
        if spec.meets(needed):
            best = major if best is None else max(best, major)
    return best


def driver_fact(requester: str, runtime_path: str, major: int, driver_version, driver_source: str,
                linkage: str = "shared", compat: str | None = "auto", extra: dict | None = None) -> Fact | None:
    """cuda_driver fact for one object that loads (or links in) a runtime of ``major``.

    ``compat``: the version of a cuda-compat libcuda on the loader path ("auto": look on
    LD_LIBRARY_PATH); where present it replaces the driver for this floor (forward
    compatibility, CUDA Compatibility guide).
    """
    needed = MIN_DRIVER.get(major)
    if needed is None:
        return None  # a future major we have no table entry for: say nothing rather than guess
    spec = _spec(driver_version)
    ok = spec.meets(needed)
    if compat == "auto":
        compat = compat_driver()
    if not ok and compat:
        ok = version_tuple(compat) >= version_tuple(needed)
    best = driver_max_major(spec)
    # `fix cuda-mismatch --runtime` relinks to 11, 12 or 13; a static runtime cannot be relinked
    fix = (f"seedance fix cuda-mismatch --auto-relink --runtime {best} {requester}"
           if best is not None and best >= 11 and linkage == "shared"
           else f"install an NVIDIA driver >= {needed} (or the cuda-compat package for CUDA {major}.x)")
    return Fact("cuda_driver", {"path": requester},
                {"runtime_major": major, "runtime_path": runtime_path, "required_driver": needed,
                 "driver_version": spec.text, "driver_desc": spec.describe(), "driver_kind": spec.kind,
                 "driver_source": driver_source, "driver_ok": ok, "driver_max_major": best,
                 "linkage": linkage, "compat": compat, "fix": fix, **(extra or {})},
                source="collect.cuda")


# --- a statically linked runtime (nvcc's default -cudart static) -----------------------------
# Markers read off our own nvcc 13.0 builds, CUDA 12.9's libcudart_static.a linked by g++,
# and NVIDIA's cuBLAS 12.9 wheel (tests/unit/test_collect_cuda.py): the static runtime keeps
# its shared-memory name template in .rodata and, unstripped, its hashed local symbols.
STATIC_MARKERS = (b"/cudart.shm.%", b"libcudart_static_")
_SCAN_SECTIONS = (".rodata", ".strtab")


def static_runtime(path: str, info, entries=None) -> dict | None:
    """{"major": M or None, "evidence": ...} when ``path`` links the CUDA runtime in, else None.

    The major comes from the toolkit that built the object: the "Cuda compilation tools,
    release X.Y" strings ptxas and nvlink leave in its fatbin, else the PTX ISA version of
    its PTX images (8.x -> 12, 9.x -> 13), else one decompressed image.  None when the
    object carries no device code to tell (we never guess a runtime).
    """
    from ..elf import fatbin as elf_fatbin
    from ..elf import fatbin_payload

    if is_cudart(path, info):
        return None  # the shared runtime itself, judged through its requesters
    if info is not None and not info.section_names:
        return None  # no section table: nothing to read markers from (ld.so needs none)
    sections = _sections(path)
    marker = _find_marker(path, sections)
    if marker is None:
        return None
    releases: set = set()
    with open(path, "rb") as handle:
        for name in (".nv_fatbin", "__nv_relfatbin"):
            section = sections.get(name)
            if section is not None:
                handle.seek(section[0])
                releases |= fatbin_payload.toolkit_releases(handle.read(section[1]))
    source = "toolkit release string"
    if not releases and entries is None and any(sections.get(n) for n in (".nv_fatbin", "__nv_relfatbin")):
        from ..elf.reader import read_elf
        from ..model.errors import ELFError

        try:
            entries = read_elf(path, fatbin=True).fatbin
        except ELFError:
            entries = ()
    if not releases and entries:
        isas = {elf_fatbin.PTX_ISA_CUDA.get(e.isa) for e in entries if e.kind == "ptx" and e.isa}
        releases = {r for r in isas if r}
        source = "PTX ISA version"
        if not releases:
            for entry in sorted((e for e in entries if e.kind in ("sass", "ptx")), key=lambda e: e.usize)[:4]:
                try:
                    releases |= fatbin_payload.toolkit_releases(elf_fatbin.read_image(path, entry))
                except (fatbin_payload.PayloadError, OSError):
                    continue
                if releases:
                    source = "toolkit release string (decompressed image)"
                    break
    newest = max(releases) if releases else None
    return {"major": newest[0] if newest else None,
            "release": f"{newest[0]}.{newest[1]}" if newest else None,
            "marker": marker, "version_source": source if newest else None}


def _sections(path: str) -> dict:
    """name -> (file offset, size) of the sections that hold bytes (pyelftools, headers only)."""
    from elftools.common.exceptions import ELFError as PyELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as handle:
            elf = ELFFile(handle)
            return {s.name: (s["sh_offset"], s["sh_size"]) for s in elf.iter_sections()
                    if s["sh_type"] != "SHT_NOBITS"}
    except (PyELFError, ValueError, OSError):
        return {}


def _find_marker(path: str, sections: dict) -> str | None:
    with open(path, "rb") as handle:
        for name in _SCAN_SECTIONS:
            section = sections.get(name)
            if section is None:
                continue
            handle.seek(section[0])
            blob = handle.read(section[1])
            for marker in STATIC_MARKERS:
                if marker in blob:
                    return f"{marker.decode()!s} in {name}"
    return None


# --- cuda-compat (forward compatibility) ----------------------------------------------------
_COMPAT_LIBCUDA = re.compile(r"^libcuda\.so\.(\d+\.\d+(?:\.\d+)?)$")


def compat_driver(env: dict | None = None) -> str | None:
    """Version of a cuda-compat libcuda on the loader path (LD_LIBRARY_PATH), else None.

    The package installs /usr/local/cuda-X/compat/libcuda.so.<driver version>; it only
    takes effect when that directory is searched before the system driver.
    """
    env = os.environ if env is None else env
    for directory in (d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d):
        if os.path.basename(os.path.normpath(directory)) != "compat":
            continue
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        versions = [m.group(1) for m in map(_COMPAT_LIBCUDA.match, names) if m]
        if versions:
            return max(versions, key=version_tuple)
    return None


class GpuInfo(Record):
    """What is known about this host's GPUs: from NVML, or from the command line."""
    _fields = ("driver_version", "driver_source", "targets", "devices", "nvml", "nvml_error")

    def __init__(self, driver_version: str | None = None, driver_source: str = "", targets: list = NEW,
                 devices: list = NEW, nvml: bool = False, nvml_error: str = ""):
        self.driver_version = driver_version
        self.driver_source = driver_source
        self.targets = [] if targets is NEW else targets  # of (arch_num, variant, label, source)
        self.devices = [] if devices is NEW else devices  # of {index, name, arch}
        self.nvml = nvml
        self.nvml_error = nvml_error

    def to_dict(self) -> dict:
        return {"nvml": self.nvml, "nvml_error": self.nvml_error or None,
                "driver_version": self.driver_version, "driver_source": self.driver_source or None,
                "devices": self.devices,
                "targets": [label for _n, _v, label, _s in self.targets]}


NVML_LIBRARY = "libnvidia-ml.so.1"


def nvml_library_present() -> bool:
    """Would dlopen("libnvidia-ml.so.1") find a file: LD_LIBRARY_PATH, ld.so.cache, defaults."""
    from ..resolve.ldcache import LdCache

    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"]
    if any(os.path.exists(os.path.join(d, NVML_LIBRARY)) for d in dirs):
        return True
    try:
        return LdCache.load().lists(NVML_LIBRARY)
    except Exception:
        return True  # cannot tell: let pynvml try


def probe_nvml() -> GpuInfo:
    """Driver version and device architectures from NVML; an empty GpuInfo without it."""
    info = GpuInfo()
    if not nvml_library_present():
        # importing pynvml is a whole module load for nothing: without the library it could only fail
        info.nvml_error = "NVML library (libnvidia-ml.so.1) not found"
        return info
    try:
        import pynvml  # nvidia-ml-py; loads libnvidia-ml.so.1 only when initialised
    except ImportError:
        info.nvml_error = "nvidia-ml-py not installed"
        return info
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        info.nvml_error = str(exc) or exc.__class__.__name__
        return info
    try:
        info.nvml = True
        version = pynvml.nvmlSystemGetDriverVersion()
        info.driver_version = version.decode() if isinstance(version, bytes) else str(version)
        info.driver_source = "nvml"
        seen = set()
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            arch = major * 10 + minor
            info.devices.append({"index": index, "name": name, "arch": f"sm_{arch}"})
            if arch not in seen:
                seen.add(arch)
                info.targets.append((arch, "", f"sm_{arch}", "nvml"))
    except Exception as exc:
        info.nvml_error = str(exc) or exc.__class__.__name__
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return info


def static_runtime_facts(objects: dict, gpu, seen: set) -> list:
    """cuda_driver facts for the objects of a closure that link the runtime in statically.

    ``objects`` maps path -> ElfInfo (a closure's objects); ``seen`` holds the paths judged
    already (a library in a thousand closures is read once).  Without a driver version
    there is nothing to judge against.
    """
    if not gpu.driver_version:
        return []
    facts = []
    compat = None
    for path, info in objects.items():
        if path in seen:
            continue
        seen.add(path)
        if info is not None and not any(n in info.section_names for n in (".nv_fatbin", "__nv_relfatbin")):
            continue  # without device code the runtime's version cannot be told: not judged
        try:
            found = static_runtime(path, info)
        except OSError:
            continue
        if not found or found["major"] is None:
            continue
        if compat is None:
            compat = compat_driver() or ""
        fact = driver_fact(path, path, found["major"], gpu.driver_version, gpu.driver_source,
                           linkage="static", compat=compat or None,
                           extra={"static_marker": found["marker"], "toolkit_release": found["release"],
                                  "version_source": found["version_source"]})
        if fact is not None:
            facts.append(fact)
    return facts
