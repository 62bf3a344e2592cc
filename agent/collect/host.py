"""The default scope of `seedance check` with no target: this host.

Running processes, the libraries in ld.so.cache, ~/.config/seedance, the torch extension
caches and the CUDA installs (/usr/local/cuda*, site-packages nvidia/*/lib).
"""
from __future__ import annotations

import glob
import os
import sys


def host_facts(gpu=None) -> dict:
    """hostname, kernel, glibc, cpu and (when known) GPU/driver facts for the report.

    os.uname(), not platform.uname() and socket.gethostname(): platform and socket are large
    modules (socket imports selectors and enum types) that every check would import only to
    get what os.uname() already has.  platform.uname() is os.uname() with
    'unknown' read as '', and glibc's gethostname() copies uname's nodename."""
    uname = os.uname()
    release, machine = (value if value != "unknown" else "" for value in (uname.release, uname.machine))
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        glibc = None
    model = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    facts = {"hostname": uname.nodename, "kernel": release, "machine": machine,
             "glibc": glibc, "cpu": {"model": model, "count": os.cpu_count()}}
    facts["gpu"] = gpu.to_dict() if gpu is not None else None
    return facts


def ld_cache_paths(cache_path: str = "/etc/ld.so.cache") -> list:
    """Every library path listed in ld.so.cache, read by the resolver's own cache parser.

    Only the list of files is taken from here; how each resolves is the resolver's job.
    """
    from ..model.errors import SeedanceError
    from ..resolve.ldcache import LdCache

    try:
        cache = LdCache.load(cache_path)
    except (SeedanceError, OSError):
        return []
    return sorted({entry.path for entry in cache.entries})


def cuda_library_dirs() -> list:
    """Library directories of the CUDA installs on this host."""
    dirs = []
    for root in sorted(glob.glob("/usr/local/cuda*")) + sorted(glob.glob("/opt/cuda*")):
        for sub in ("lib64", "lib", "targets/*/lib", "extras/CUPTI/lib64"):
            dirs.extend(sorted(glob.glob(os.path.join(root, sub))))
    for site in _site_dirs():
        dirs.extend(sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib"))))
    unique, seen = [], set()
    for directory in dirs:
        real = os.path.realpath(directory)
        if real not in seen and os.path.isdir(real):
            seen.add(real)
            unique.append(directory)
    return unique


def _site_dirs() -> list:
    import site

    dirs = []
    try:
        dirs.extend(site.getsitepackages())
    except AttributeError:
        pass
    dirs.extend(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    return list(dict.fromkeys(d for d in dirs if os.path.isdir(d)))


def config_dirs() -> list:
    """Where seedance and plugin YAML configs live: the user's, the system's, the plugin store."""
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return [config_dir(), "/etc/seedance", os.path.join(data, "seedance", "plugins")]


def config_dir(home: str | None = None) -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home or os.path.expanduser("~"), ".config")
    return os.path.join(base, "seedance")
