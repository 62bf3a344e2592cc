"""How libraries are loaded in practice, not only on their own.

A library checked alone is loaded as the main program would load it.  Inside a real tree
many libraries are never loaded that way:

- a package loads some libraries before others (``preload_plan``): torch's
  ``_load_global_deps()`` (torch/__init__.py) and cupy's cuda-pathfinder
  (cupy_backends/cuda/libs/__init__.py) load the NVIDIA wheels' libraries from
  site-packages/nvidia/*/lib with RTLD_GLOBAL, so a sibling library's NEEDED is satisfied by
  SONAME; the java launcher (libjli, java_md.c LoadJavaVM) dlopens lib/server/libjvm.so
  RTLD_GLOBAL before any JDK library that NEEDs libjvm.so;
- optional transport plugins are dlopened only when that transport is configured
  (``optional_plugin``);
- a private library is loaded only by one program that finds its siblings through its own
  RUNPATH (``private_loader``: systemd's libsystemd-core);
- a library installed where the loader does not look is still worth pointing at
  (``installed_copies`` and ``package_of``).

Everything here reads files; nothing is loaded or executed.
"""
from __future__ import annotations

import fnmatch
import os
import re

from . import inputs, package_context

_SITE_DIRS = ("site-packages", "dist-packages")

# What each package loads before its native modules, which variant of a library it picks
# and which providers are optional is data: rules/context/packages.yaml, with the source of
# each entry (collect/package_context.py reads and validates it).

# Optional plugins: (file name pattern, who loads it and when)
OPTIONAL_PLUGINS = (
    ("nvshmem_transport_*", "NVSHMEM dlopens a transport only when NVSHMEM_REMOTE_TRANSPORT selects it"),
    ("nvshmem_bootstrap_*", "NVSHMEM dlopens a bootstrap only when NVSHMEM_BOOTSTRAP selects it"),
    ("libnvshmem_transport_*", "NVSHMEM dlopens a transport only when NVSHMEM_REMOTE_TRANSPORT selects it"),
    ("libcufile_rdma*", "cuFile loads its RDMA library only when cufile.json enables RDMA"),
    ("libuct_*", "UCX loads a transport module from lib/ucx only when that transport is available"),
    ("libucm_*", "UCX loads a memory hook module from lib/ucx only when that memory type is used"),
    ("libucx_*", "UCX loads a module from lib/ucx only when that transport is used"),
    ("mca_*", "Open MPI loads an MCA component only when that component is selected"),
    ("libnccl-net*", "NCCL loads a network plugin only when NCCL_NET_PLUGIN names it"),
    ("libmpi_*", "an MPI transport is loaded only when MPI is the chosen launcher"),
)


def site_packages_of(path: str) -> str | None:
    """The site-packages (or dist-packages) directory that holds ``path``, if any."""
    parts = os.path.abspath(path).split(os.sep)
    for index in range(len(parts) - 1, 0, -1):
        if parts[index] in _SITE_DIRS:
            return os.sep.join(parts[:index + 1])
    return None


def _top_package(path: str, site: str) -> str:
    rel = os.path.relpath(os.path.abspath(path), site)
    return rel.split(os.sep, 1)[0]


def nvidia_wheel_libs(site: str) -> dict:
    """NAME -> path for every file in site-packages/nvidia/*/lib."""
    found: dict = {}
    base = os.path.join(site, "nvidia")
    try:
        packages = sorted(os.listdir(base))
    except OSError:
        return found
    for package in packages:
        lib = os.path.join(base, package, "lib")
        try:
            names = sorted(os.listdir(lib))
        except OSError:
            continue
        for name in names:
            found.setdefault(name, os.path.join(lib, name))
    return found


def _cuda_toolkit_lib(name: str) -> str | None:
    """cuda-pathfinder's other places: $CUDA_PATH, $CUDA_HOME, /usr/local/cuda."""
    for root in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root:
            for sub in ("lib64", "targets/x86_64-linux/lib"):
                candidate = os.path.join(root, sub, name)
                if inputs.isfile(candidate):
                    return candidate
    return None


def _jdk_home(path: str) -> str | None:
    """JAVA_HOME of a library under <home>/lib (JDK 9+) or <home>/jre/lib/<arch> (JDK 8)."""
    directory = os.path.dirname(os.path.abspath(path))
    for _ in range(4):
        for server in ("lib/server/libjvm.so", "jre/lib/amd64/server/libjvm.so"):
            if inputs.isfile(os.path.join(directory, server)):
                return directory
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    return None


def preload_reason(top: str) -> tuple | None:
    """(reason template with {provider}, context, loads_first) of what the package whose
    top-level name is ``top`` loads before its native modules, or None.  context is
    'preloaded' when the package's own import does it, 'preload-step' when the user must
    call a step first (onnxruntime.preload_dlls()); a package that imports another first
    (torchvision imports torch) gets that package's loads, with both reasons."""
    entry = package_context.entry_for(top)
    if entry is None:
        return None
    if entry["preload_step"] and entry["loads_first"]:
        return (entry["preload_step"] + " loads {provider}", "preload-step", entry["loads_first"])
    if entry["loads_first"]:
        return entry["how"], "preloaded", entry["loads_first"]
    if entry["imports_first"]:
        first = package_context.entry_for(entry["imports_first"])
        if first is not None and first["loads_first"] and not first["preload_step"]:
            how = (f"{top} imports {entry['imports_first']} first ({entry['source']}), and " +
                   first["how"].replace("{provider}", "{provider}", 1))
            return how, "preloaded", first["loads_first"]
    return None


def preload_plan(path: str, missing: set) -> dict:
    """provider path -> (reason, package, context) that a package loads before ``path`` and
    that provide some of its ``missing`` NEEDED names (context: 'preloaded', or
    'preload-step' when only a step the user calls loads it, see preload_reason)."""
    plan: dict = {}
    site = site_packages_of(path)
    if site is not None:
        top = _top_package(path, site)
        known = preload_reason(top)
        if known is not None:
            template, context, loads = known
            wheel_libs = nvidia_wheel_libs(site) if "nvidia-wheels" in loads else {}
            for name in sorted(missing):
                provider = wheel_libs.get(name)
                if provider is None and "cuda-toolkit" in loads:
                    provider = _cuda_toolkit_lib(name)
                if provider is not None and provider not in plan:
                    rel = os.path.relpath(provider, site)
                    reason = template.format(provider="site-packages/" + rel) \
                        if provider.startswith(site + os.sep) else template.format(provider=provider)
                    # (a 2-tuple where the package's own import loads it: the common case)
                    plan[provider] = (reason, package_of(provider) or "") if context == "preloaded" \
                        else (reason, package_of(provider) or "", context)
    if "libjvm.so" in missing:
        home = _jdk_home(path)
        if home is not None:
            for server in ("lib/server/libjvm.so", "jre/lib/amd64/server/libjvm.so"):
                jvm = os.path.join(home, server)
                if inputs.isfile(jvm):
                    plan[jvm] = ("the java launcher (libjli, LoadJavaVM) loads " + jvm +
                                 " RTLD_GLOBAL before any JDK library", package_of(jvm) or "")
                    break
    return plan


def preloader_hint(path: str, name: str = "", needed=()) -> str:
    """For a library of a package that loads NVIDIA's libraries before its own, what would
    provide a missing one (``name``, needed by ``path`` whose NEEDED list is ``needed``):
    the pip requirement that ships it for the CUDA major ``path`` was built for
    (rules/context/pip_distributions.yaml); cupy's [ctk] extra installs them all."""
    site = site_packages_of(path)
    if site is None:
        return ""
    top = _top_package(path, site)
    entry = package_context.entry_for(top)
    if entry is None:
        return ""
    if entry["imports_first"] and not entry["loads_first"]:
        first = package_context.entry_for(entry["imports_first"])
        if first is None:
            return ""
        top, entry = entry["imports_first"], first
    if "nvidia-wheels" not in entry["loads_first"]:
        return ""
    requirement = package_context.requirement_for(name, package_context.cuda_major_of(needed)) if name else None
    if entry["extra"]:
        dist = package_of(path) or entry["distribution"]
        return f"; {entry['missing_hint']}: pip install \"{dist}[{entry['extra']}]\""
    who = entry["preload_step"] or top
    text = "; " + (entry["missing_hint"] or
                   f"{who} loads it from site-packages/nvidia/*/lib, and no NVIDIA wheel there has it")
    if requirement:
        text += f": pip install '{requirement}' ships it"
    return text


def missing_context(path: str, name: str, needed=()) -> dict | None:
    """What the package around ``path`` says about a NEEDED ``name`` nothing resolves:
    {'context', 'reason'[, 'where']} for an optional provider (loaded only when asked for)
    or a variant of a library the package does not pick in this environment; None
    otherwise (judge it as any library)."""
    site = site_packages_of(path)
    if site is None:
        return None
    top = _top_package(path, site)
    entry = package_context.entry_for(top)
    if entry is None:
        return None
    base = os.path.basename(path)
    for optional in entry["optional"]:
        if fnmatch.fnmatch(base, optional["files"]):
            requirement = package_context.requirement_for(name, package_context.cuda_major_of(needed))
            where = f"; pip install '{requirement}' ships it" if requirement else ""
            return {"context": "optional-provider", "reason": optional["what"], "where": where}
    variants = entry["variants"]
    if variants is not None:
        picked = picked_variant(site, os.path.dirname(path), variants)
        if picked is not None and variants["files"].match(base) and picked[0] != base:
            return {"context": "variant", "reason": f"{top} loads {picked[0]} here ({picked[1]}; "
                                                    f"{variants['source']})"}
    return None


_TORCH_VERSION = re.compile(r"^(__version__|cuda|hip)\b[^=]*=\s*['\"]?([^'\"\s]*)['\"]?\s*$", re.M)


def torch_build(site: str) -> dict | None:
    """{'version', 'cuda', 'hip'} of the torch installed in ``site`` (torch/version.py, as
    torch.version reads it), or None where there is none."""
    try:
        with open(os.path.join(site, "torch", "version.py"), encoding="utf-8", errors="replace") as handle:
            text = handle.read(65536)
    except OSError:
        return None
    found = {key: (value if value not in ("None", "") else None) for key, value in _TORCH_VERSION.findall(text)}
    return {"version": found.get("__version__") or "?", "cuda": found.get("cuda"), "hip": found.get("hip")}


def picked_variant(site: str, directory: str, variants: dict):
    """(file name, why) of the variant the package loads with the torch of ``site``: the
    build for torch's backend (CUDA, ROCm, else the CPU one) at torch's version, else the
    nearest of the same major, lower first; None where there is no torch to pick by."""
    torch = torch_build(site)
    if torch is None:
        return None
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return None
    builds = {}
    for name in names:
        match = variants["files"].match(name)
        if match:
            builds.setdefault(match.group("backend"), {})[match.group("version")] = name
    backend, version = ("rocm", torch["hip"]) if torch["hip"] else ("cuda", torch["cuda"]) if torch["cuda"] \
        else ("cpu", None)
    label = f"torch {torch['version']}" + (f", {backend.upper() if backend == 'cuda' else 'ROCm'} {version}"
                                           if version else ", no CUDA")
    if backend == "cpu" or not version:
        name = builds.get("cpu", {}).get("")
        return (name, label) if name else None
    parts = version.split(".")
    wanted = "".join(parts[:2])
    available = builds.get(backend, {})
    if wanted in available:
        return available[wanted], label
    same = sorted((v for v in available if v.startswith(parts[0]) and v[len(parts[0]):len(parts[0]) + 1] != ""),
                  key=lambda v: int(v))
    lower = [v for v in same if int(v) < int(wanted)]
    higher = [v for v in same if int(v) > int(wanted)]
    chosen = lower[-1] if lower else (higher[0] if higher else None)
    return (available[chosen], label) if chosen else None


# Libraries the NVIDIA driver installs (not the CUDA toolkit, not a wheel): a host without
# the driver has none of them, and CUDA code cannot run there whatever the environment holds.
DRIVER_LIBS = ("libcuda.so", "libnvidia-ml.so", "libnvcuvid.so", "libnvidia-encode.so",
               "libnvidia-opticalflow.so", "libnvidia-ptxjitcompiler.so", "libcudadebugger.so")


def driver_absent(name: str, resolver=None) -> str | None:
    """Why ``name`` is missing because this host has no NVIDIA driver, or None (it is not a
    driver library, or the driver is installed: then the miss is real)."""
    if not name.startswith(DRIVER_LIBS):
        return None
    if _driver_installed(resolver):
        return None
    return (f"{name} is installed by the NVIDIA driver, and this host has none (no GPU); "
            "it loads where the driver is")


def driver_absent_once(facts: list) -> list:
    """``facts`` with the NEEDED misses that the absent driver explains said once per check:
    the first keeps its finding, its reason naming how many more objects need a driver
    library; the rest are dropped (on a host without the driver every CUDA library of every
    environment links libcuda.so.1, and one line says all there is to say)."""
    from ..model.report import Fact

    absent = [i for i, fact in enumerate(facts) if fact.kind == "needed" and fact.data.get("context") == "no-driver"]
    if len(absent) < 2:
        return facts
    first = facts[absent[0]]
    names = sorted({facts[i].data.get("name", "") for i in absent})
    reason = (f"{first.data.get('reason', '')}; {len(absent) - 1} more object"
              f"{'s' if len(absent) > 2 else ''} need{'' if len(absent) > 2 else 's'} "
              f"{', '.join(names)} (--json lists each)")
    kept = Fact(first.kind, first.subject, {**first.data, "reason": reason,
                                            "also_needed_by": [facts[i].subject.get("path") for i in absent[1:]]},
                source=first.source)
    drop = set(absent[1:])
    return [kept if i == absent[0] else fact for i, fact in enumerate(facts) if i not in drop]


def _driver_installed(resolver=None) -> bool:
    known = _DPKG.get("driver")
    if known is None:
        known = False
        for directory in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib",
                          "/usr/lib/wsl/lib"):
            if inputs.exists(os.path.join(directory, "libcuda.so.1")):
                known = True
        if not known and resolver is not None:
            try:
                known = any(e.name == "libcuda.so.1" for e in resolver.ldcache().entries)
            except Exception:
                known = False
        _DPKG["driver"] = known
    return known


def optional_plugin(path: str) -> str | None:
    """Why ``path`` is an optional plugin that is only loaded on demand, or None."""
    base = os.path.basename(path)
    for pattern, why in OPTIONAL_PLUGINS:
        if fnmatch.fnmatch(base, pattern):
            return why
    return None


# --- which package ships a file ------------------------------------------------------------
_RECORDS: dict = {}  # site-packages -> {relative path: distribution name}
_DPKG: dict = {}  # 'files' -> {real path: package}, 'names' -> {basename: [paths]}
DPKG_INFO = "/var/lib/dpkg/info"


def _dist_name(dist_info: str) -> str:
    name = dist_info[: -len(".dist-info")].split("-", 1)[0]
    return name.replace("_", "-").lower()


def _records(site: str) -> dict:
    known = _RECORDS.get(site)
    if known is not None:
        return known
    table: dict = {}
    try:
        entries = sorted(os.listdir(site))
    except OSError:
        entries = []
    for entry in entries:
        if not entry.endswith(".dist-info"):
            continue
        dist = _dist_name(entry)
        try:
            with open(os.path.join(site, entry, "RECORD"), encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    rel = line.split(",", 1)[0]
                    if rel and not rel.startswith(".."):
                        table[os.path.normpath(rel)] = dist
        except OSError:
            continue
    _RECORDS[site] = table
    return table


def _read_bytes(path: str) -> bytes:
    """A whole file, through os.open/os.read: the dpkg lists are hundreds of files and several
    MB, and opening each as a text file builds a buffered file object and a decoder and
    decodes every byte, where a lookup decodes only the lines it finds."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # (a FIFO reads as empty, never blocks)
    try:
        # the first read asks for the size it has and one byte more (os.read allocates a
        # buffer of the size asked, so a fixed 1 MB request made a 1 MB buffer per small
        # file); a read of a regular file is short only at its end, so a short read is the
        # whole file, without the read that returns nothing (one system call saved per list)
        want = os.fstat(fd).st_size + 1
        chunks = []
        while True:
            try:
                chunk = os.read(fd, want)
            except BlockingIOError:  # a FIFO with nothing in it
                chunk = b""
            if chunk:
                chunks.append(chunk)
            if len(chunk) < want:
                return b"".join(chunks)
            want = 1 << 20
    finally:
        os.close(fd)


def _info_names() -> list:
    """os.listdir(DPKG_INFO), once per directory (an OSError is raised each time, as
    listdir's): thousands of names, listed by _dpkg_lists and again by dpkg_files_of for
    each multi-arch package (pkg:amd64.list) it is asked about."""
    cache = _DPKG.setdefault("info_names", {})
    names = cache.get(DPKG_INFO)
    if names is None:
        names = cache[DPKG_INFO] = os.listdir(DPKG_INFO)
    return names


def _dpkg_lists() -> list:
    """[(package, bytes of its .list)], read once: ~1000 small files, a few MB.  Kept as
    bytes: only the lines a lookup finds are decoded (_dpkg_by_name)."""
    lists = _DPKG.get("lists")
    if lists is None:
        lists = []
        try:
            names = sorted(n for n in _info_names() if n.endswith(".list"))
        except OSError:
            names = []
        for listing in names:
            try:
                lists.append((listing[: -len(".list")].split(":", 1)[0],
                              _read_bytes(os.path.join(DPKG_INFO, listing))))
            except OSError:
                continue
        _DPKG["lists"] = lists
    return lists


def prefetch_dpkg() -> None:
    """Have the dpkg lists read and indexed on a thread now (elf/dpkgindex.c), for the
    lookups a check makes after its root loop: a scan of many roots calls this as the loop
    starts, so the lists' several MB are read on a core the loop leaves idle."""
    _dpkg_index()


def _dpkg_index():
    """(ffi, lib, handle) of the C index of DPKG_INFO's lists, started on first use and
    kept for the process (as _dpkg_lists reads the lists once); None where the C extension
    is not built, SEEDANCE_DPKG=python, or in a forked child (the thread that builds it is
    not there: the child reads the lists in Python)."""
    pid = os.getpid()
    known = _DPKG.get("c")
    if known is not None and known[0] == pid:
        return known[1]  # (read once per process, as _dpkg_lists)
    index = None
    if os.environ.get("SEEDANCE_DPKG") != "python" and known is None:
        from ..elf import fastread

        loaded = fastread._lib if fastread._lib is not None else fastread._load()
        if loaded and hasattr(loaded[1], "sd_dpkg_start"):
            ffi, lib = loaded
            try:
                where = os.fsencode(DPKG_INFO)
            except UnicodeError:
                where = None
            if where is not None and b"\0" not in where:
                handle = lib.sd_dpkg_start(where)
                if handle != ffi.NULL:
                    index = (ffi, lib, ffi.gc(handle, lib.sd_dpkg_free))
    _DPKG["c"] = (pid, index)
    return index


def _dpkg_by_name_c(name: str):
    """_dpkg_by_name from the C index, or None: ask the lists in Python.  The first answer
    notes what the index read (the directory, each list's stat) for the check cache, as
    reading the lists in Python would have."""
    index = _dpkg_index()
    if index is None or "/" in name or "\n" in name:
        return None
    ffi, lib, handle = index
    if lib.sd_dpkg_wait(handle) != lib.SD_DPKG_OK:
        return None
    count = lib.sd_dpkg_count(handle)
    packages = _DPKG.get("c_packages")
    if packages is None or packages[0] is not handle:
        names = [ffi.string(lib.sd_dpkg_name(handle, i)).decode("ascii") for i in range(count)]
        packages = _DPKG["c_packages"] = (handle, [n[: -len(".list")].split(":", 1)[0] for n in names])
        if inputs.recording():
            seen = []
            for i, path in enumerate([DPKG_INFO] + [os.path.join(DPKG_INFO, n) for n in names]):
                rec = lib.sd_dpkg_input(handle, i)
                seen.append((path, rec.err if rec.err else
                             (rec.dev, rec.ino, rec.mode, rec.size, rec.mtime_ns, rec.ctime_ns), False))
            inputs.note_walk(seen)
    encoded = name.encode("utf-8")
    cap = 64
    while True:
        lists, lines, lens = ffi.new("int[]", cap), ffi.new("const char *[]", cap), ffi.new("size_t[]", cap)
        found = lib.sd_dpkg_find(handle, encoded, len(encoded), lists, lines, lens, cap)
        if found <= cap:
            break
        cap = found
    names = packages[1]
    return [(names[lists[i]], ffi.buffer(lines[i], lens[i])[:].decode("utf-8", "replace")) for i in range(found)]


def _dpkg_by_name(name: str) -> list:
    """[(package, listed path)] for every Debian file whose name is ``name``.

    A list's lines are its bytes decoded as UTF-8 with errors replaced, line by line (a
    newline is never part of a multi-byte sequence, so that is the whole text decoded and
    split).  The search is on the bytes: a name that is valid UTF-8 without U+FFFD matches
    the same lines in the bytes as in the decoded text.  A name with U+FFFD (which could
    match a replaced byte) is searched in the decoded text; one with a lone surrogate
    (os.fsdecode of a non-UTF-8 name) is in no decoded text."""
    memo = _DPKG.setdefault("by_name", {})
    if name not in memo:
        try:
            needle = ("/" + name + "\n").encode("utf-8")
        except UnicodeEncodeError:
            needle = None  # a lone surrogate: no decoded line holds one
        found = _dpkg_by_name_c(name) if needle is not None and "\ufffd" not in name else None
        if found is None:
            found = _dpkg_search(name, needle) if needle is not None else []
        memo[name] = found
    return memo[name]


def _dpkg_search(name: str, needle: bytes) -> list:
    """_dpkg_by_name's answer from the lists read in Python (``needle``: "/NAME\\n" in UTF-8)."""
    found = []
    in_text = "\ufffd" in name
    if in_text:
        needle = "/" + name + "\n"
    newline = needle[-1:]
    for package, data in _dpkg_lists():
        haystack = data.decode("utf-8", "replace") if in_text else data
        start = haystack.find(needle)
        while start >= 0:
            line_start = haystack.rfind(newline, 0, start) + 1
            line = haystack[line_start:start + len(needle) - 1]
            found.append((package, line if in_text else line.decode("utf-8", "replace")))
            start = haystack.find(needle, start + 1)
    return found


_REAL_DIRS: dict = {}


def _canonical(path: str) -> str:
    """The path with its directory realpath'd (usrmerge: /lib -> /usr/lib); one realpath
    per directory, not per file (the dpkg lists name ~50,000 files in ~5,000 directories)."""
    head, tail = os.path.split(path)
    real = _REAL_DIRS.get(head)
    if real is None:
        real = _REAL_DIRS[head] = inputs.realpath(head)
    return os.path.join(real, tail)


def package_of(path: str) -> str | None:
    """The pip distribution or Debian package that ships ``path``, if known."""
    site = site_packages_of(path)
    if site is not None:
        rel = os.path.normpath(os.path.relpath(os.path.abspath(path), site))
        dist = _records(site).get(rel)
        if dist:
            return dist
    wanted = _canonical(path)
    for package, listed in _dpkg_by_name(os.path.basename(path)):
        if _canonical(listed) == wanted:
            return package
    return None


def dpkg_files_of(package: str) -> list:
    try:
        with open(os.path.join(DPKG_INFO, package + ".list"), encoding="utf-8", errors="replace") as handle:
            return [line.rstrip("\n") for line in handle if line.strip()]
    except OSError:
        for name in _info_names() if inputs.isdir(DPKG_INFO) else ():
            if name.startswith(package + ":") and name.endswith(".list"):
                with open(os.path.join(DPKG_INFO, name), encoding="utf-8", errors="replace") as handle:
                    return [line.rstrip("\n") for line in handle if line.strip()]
    return []


def dpkg_dependents(package: str) -> list:
    """Installed Debian packages whose Depends/Pre-Depends name ``package`` (from
    /var/lib/dpkg/status): the programs that use a library package live there.

    For the first few packages asked about, only the stanzas that hold ``package`` at all
    are parsed: a stanza depending on it holds its name.  Parsing every stanza of the status
    file (one per installed package) for the one package a check asks about is work a check
    of /usr/lib would pay for nothing.  A stanza is what status.split("\\n\\n") gives,
    found around each occurrence (its bounds differ at most by a leading newline where
    three newlines meet, which no line of the parse sees)."""
    memo = _DPKG.setdefault("dependents", {})
    known = memo.get(package)
    if known is not None:
        return list(known)
    text = _DPKG.get("status_text")
    if text is None:
        try:
            with open(os.path.join(os.path.dirname(DPKG_INFO), "status"), encoding="utf-8",
                      errors="replace") as handle:
                text = handle.read()
        except OSError:
            text = ""
        _DPKG["status_text"] = text
    index = _DPKG.get("status")
    if index is None and len(memo) >= 8:
        # a check asking about many packages (a broken tree): index every stanza once
        index = _DPKG["status"] = {}
        for stanza in text.split("\n\n"):
            name, depends = _status_stanza(stanza)
            if name:
                for dep in depends:
                    index.setdefault(dep, []).append(name)
    if index is not None:
        memo[package] = sorted(set(index.get(package, ())))
        return list(memo[package])
    found = set()
    # a dependency is a non-empty piece of one line: an empty name or one with a line break
    # is nobody's
    at = text.find(package) if package and "\n" not in package and "\r" not in package else -1
    while at >= 0:
        start = text.rfind("\n\n", 0, at)
        start = 0 if start < 0 else start + 2
        end = text.find("\n\n", at)
        end = len(text) if end < 0 else end
        name, depends = _status_stanza(text[start:end])
        if name and package in depends:
            found.add(name)
        if end >= len(text):
            break
        at = text.find(package, end + 1)
    memo[package] = sorted(found)
    return list(memo[package])


def _status_stanza(stanza: str) -> tuple:
    """(Package, [names in Depends and Pre-Depends]) of one stanza of dpkg's status."""
    name, depends = None, []
    for line in stanza.splitlines():
        if line.startswith("Package: "):
            name = line[9:].strip()
        elif line.startswith(("Depends: ", "Pre-Depends: ")):
            for item in line.split(":", 1)[1].split(","):
                for alternative in item.split("|"):
                    dep = alternative.strip().split(" ", 1)[0].split(":", 1)[0]
                    if dep:
                        depends.append(dep)
    return name, depends


def installed_copies(name: str, requester: str, tree_index: dict) -> list:
    """Files named ``name`` that exist where the loader does not look: the scanned tree,
    site-packages/nvidia/*/lib beside the requester, and the Debian packages' files."""
    if "/" in name:
        return []
    found = []
    for path in tree_index.get(name, ()):
        if path not in found:
            found.append(path)
    site = site_packages_of(requester)
    if site is not None:
        path = nvidia_wheel_libs(site).get(name)
        if path is not None and path not in found:
            found.append(path)
    for _package, path in _dpkg_by_name(name):
        if inputs.exists(path) and not any(inputs.samefile(path, p) for p in found if inputs.exists(p)):
            found.append(path)
    return found[:5]


_HOME_SITE = re.compile(r".*/(site-packages|dist-packages)/")


def short(path: str) -> str:
    """site-packages/nvidia/cublas/lib/... instead of the whole venv path."""
    return _HOME_SITE.sub(lambda m: m.group(1) + "/", path)
