"""check --image / check --root: a container image judged as its own ld.so would load it,
without running anything in it.

The image's layers become a tree (collect/layers.py) laid out in a private staging
directory with every symlink re-rooted, and the resolver reads it with ``root=`` set: the
image's /etc/ld.so.cache, its default directories, and the config's Env (LD_LIBRARY_PATH;
PATH to find the Entrypoint/Cmd program).  Every ELF object of the image is a root of the
check, the entry program first.  The facts are the scan's (collect/closure.py, cuda.py)
with the paths of the image, and every fact's subject carries ``image_path`` and the
``layer`` that brought the file in.  The CUDA runtime is judged against the driver the
NVIDIA container toolkit mounts from the host (--driver-version, else this host's NVML);
the driver libraries themselves (libcuda.so.1, libnvidia-ml.so.1) are the toolkit's to
bring, so the image lacking them is no finding, and a libcuda.so baked into the image is
(rule image-libcuda-baked).
"""
from __future__ import annotations

import os
import posixpath
import re
import time

from ..model.errors import BadInput, ELFError
from ..model.report import Fact, Report
from . import cuda, layers, oci, python_static
from . import closure as closure_facts

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# what the NVIDIA container toolkit mounts from the host (CUDA-FACTS "Containers"): a NEEDED
# of one of these that the image lacks resolves once the container starts with GPUs
INJECTED = ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so", "libnvidia-nvvm.so",
            "libcudadebugger.so", "libnvidia-opencl.so", "libnvidia-gpucomp.so")
_COMPAT = re.compile(r"^libcuda\.so\.(\d+\.\d+(?:\.\d+)?)$")


class _Source:
    """What was checked: the tree, its staging directory, the environment and command."""

    def __init__(self, tree, shadow: str, env: dict, command: list, scope: dict):
        self.tree = tree
        self.shadow = shadow
        self.env = env
        self.command = command
        self.scope = scope
        self.python = None  # python_static.RootPython of the image, when it has one


def check_image(path: str, options, platform: str | None = None) -> Report:
    """Read, verify and apply the image's layers, then judge it."""
    started = time.monotonic()
    caps = layers.Caps()
    image, store = oci.open_image(path, platform)
    stored = sum(layer.size for layer in image.layers if isinstance(layer.size, int))
    if image.kind == "docker-archive" and isinstance(store, oci._TarStore):
        stored = sum(m.size for m in store.members.values())
    staging = layers.make_staging(stored)
    try:
        try:
            tree = layers.Tree(staging)
            budget = layers._Budget(caps, path)
            for index, layer in enumerate(image.layers):
                if image.kind != "docker-archive":
                    # the stored (compressed) bytes against the manifest's digest, before
                    # anything of the layer is used
                    handle = layer.open()
                    if handle is None:
                        raise BadInput(f"{path}: missing blob {layer.digest}")
                    with handle:
                        oci.verify_stream(handle, layer.digest, path, "layer",
                                          layer.size if isinstance(layer.size, int) else None)
                layers.apply_layer(tree, layer, index, budget, path)
        finally:
            store.close()
        shadow = os.path.join(staging, "root")
        layers.materialize(tree, shadow, path)
        scope = {"image": path, "image_kind": image.kind, "platform": image.platform,
                 "layers": [layer.digest for layer in image.layers],
                 "entrypoint": image.command, "env_path": image.env.get("PATH", DEFAULT_PATH),
                 "ld_library_path": image.env.get("LD_LIBRARY_PATH", "")}
        source = _Source(tree, shadow, image.env, image.command, scope)
        return _judge(source, options, started)
    finally:
        layers.remove_staging(staging)


def check_root(directory: str, options) -> Report:
    """An unpacked root filesystem: the same check, with no layers and no image config
    (the environment is taken as empty: PATH the default, no LD_LIBRARY_PATH)."""
    started = time.monotonic()
    if not os.path.isdir(directory):
        raise BadInput(f"{directory}: not a directory")
    tree = layers.from_directory(directory, layers.Caps())
    # The directory is read in place: the tree lists its files as the walk found them (no
    # link followed), and the resolver opens every other name through rootfs, inside the
    # root, so an absolute link in it is re-rooted as the root's own ld.so would see it and
    # never reaches a host file.
    scope = {"root": directory, "env_path": DEFAULT_PATH, "ld_library_path": ""}
    return _judge(_Source(tree, os.path.realpath(directory), {}, [], scope), options, started)


# --- the judgement ---------------------------------------------------------------------------
def _judge(source: _Source, options, started: float) -> Report:
    from ..judge.engine import load_rules
    from ..resolve import ABIS, Resolver
    from . import host
    from .options import gpu_context

    rules = load_rules(options.rules_dir)
    gpu = gpu_context(options)
    env = {"LD_LIBRARY_PATH": source.env["LD_LIBRARY_PATH"]} if source.env.get("LD_LIBRARY_PATH") else {}
    resolver = Resolver(env=env, root=source.shadow)
    dedup = closure_facts.FactDedup()
    dedup.stat_of = resolver._stat_of  # identities of the image's files, not the host's
    try:
        source.python = python_static.find_python(source.tree, source.env, options.python, DEFAULT_PATH)
    except python_static.NotAnInterpreter as exc:
        raise BadInput(str(exc)) from None
    entry = _entry_program(source)
    roots = ([entry] if entry else []) + [p for p in _elf_files(source) if p != entry]
    facts, errors = [], []
    runtime_memo: dict = {}
    static_seen: set = set()
    compat = _compat_libs(source, gpu)
    counts = {"elf": 0, "skipped": 0, "unreadable": 0}
    objects_seen: set = set()
    closure_paths: list = []  # (root, the paths its closure maps): closure.fails_with_facts
    packages = _Packages(source, resolver, facts, explicit=bool(options.python))
    for path in roots:
        try:
            info = resolver.read(path)
            if (info.elf_class, info.machine) not in ABIS:
                counts["skipped"] += 1
                continue
            result = resolver.closure(path)
            preload, preloaded_by = packages.preloads(path, result)
            if preload:
                result = resolver.closure(path, preloaded=preload)
            gaps = resolver.version_gaps(result)
        except (ELFError, OSError) as exc:
            counts["unreadable"] += 1
            errors.append({"path": path, "error": str(exc).replace(source.shadow, "")})
            continue
        except RecursionError:
            counts["unreadable"] += 1
            errors.append({"path": path, "error": "dependency chain too deep"})
            continue
        counts["elf"] += 1
        objects_seen.update(result.objects)
        closure_paths.append((path, tuple(result.objects)))
        closure_facts.note_needed(result, dedup, skip_names=preload, preloaded_by=preloaded_by)
        facts.extend(closure_facts.version_facts(result, dedup))
        facts.extend(closure_facts.gap_facts(result, gaps, dedup))
        runtimes = closure_facts.closure_runtimes(result, runtime_memo)
        closure_facts.note_runtime_mix(result, runtimes, dedup)
        facts.extend(_driver_facts(runtimes, gpu, dedup, compat))
        facts.extend(_static_runtime_facts(result.objects, gpu, static_seen, source, compat))
    facts.extend(closure_facts.needed_facts(dedup, lambda res: _explain_missing(res, source)))
    facts.extend(closure_facts.runtime_mix_facts(dedup))
    facts.extend(_libcuda_facts(source, resolver))
    facts = closure_facts.fails_with_facts(facts, closure_paths, dedup.identity)
    facts = [_with_image_subject(fact, source.tree) for fact in facts]
    findings = rules.evaluate(facts, strict=options.strict)
    scope = dict(source.scope, entry_program=entry, driver_version=gpu.driver_version,
                 gpu_targets=[label for _n, _v, label, _s in gpu.targets],
                 python=source.python.as_scope() if source.python is not None else None,
                 cuda_compat=compat.as_scope() if compat is not None else None)
    stats = {"files_scanned": len(roots), "elf_objects": counts["elf"], "closure_objects": len(objects_seen),
             "skipped": counts["skipped"], "unreadable": counts["unreadable"],
             "special_files_left_out": source.tree.skipped_special, "facts": len(facts),
             "errors": errors, "duration_s": round(time.monotonic() - started, 3)}
    report = Report(command="check", host=host.host_facts(gpu), stats=stats, extra={"scope": scope})
    report.add(findings)
    return report


def _staged(source: _Source, path: str) -> str:
    return source.shadow + path


def _elf_files(source: _Source) -> list:
    """Image paths of every regular file that starts with the ELF magic."""
    found = []
    for path, node in source.tree.walk():
        if node.kind != "file" or node.size < 4:
            continue
        try:
            with open(node.blob.path, "rb") as handle:
                if handle.read(4) == layers.ELF_MAGIC:
                    found.append(path)
        except OSError:
            continue
    return sorted(found)


def _entry_program(source: _Source) -> str | None:
    """The image path of the program the container starts (Entrypoint, else Cmd), found on
    the image's PATH as execvp would; a #! script's interpreter.  Never run."""
    if not source.command:
        return None
    word = source.command[0]
    candidates = [word] if "/" in word else [
        posixpath.join(d or ".", word) for d in source.env.get("PATH", DEFAULT_PATH).split(":")]
    for candidate in candidates:
        if not candidate.startswith("/"):
            candidate = "/" + candidate
        try:
            canonical, node = source.tree.lookup(candidate)
        except layers.SymlinkLoop:
            continue
        if node is None or node.kind != "file":
            continue
        try:
            with open(node.blob.path, "rb") as handle:
                head = handle.read(256)
        except OSError:
            continue
        if head.startswith(b"#!"):
            interpreter = head[2:].split(b"\n", 1)[0].strip().split(b" ", 1)[0]
            try:
                canonical, node = source.tree.lookup(interpreter.decode("utf-8", "replace"))
            except layers.SymlinkLoop:
                return None
            return canonical if node is not None else None
        return canonical
    return None


def _explain_missing(res, source: _Source) -> dict:
    name = res.name
    found: dict = {}
    python = source.python
    site = python_static.site_of(res.requester)
    if python is not None and site is not None and site in python.site_dirs and \
            python_static.is_extension_module(res.requester):
        # an extension module (or a library one loads) of the image's Python: the import fails
        module = python_static.module_name(res.requester, site)
        found = {"python": python.interpreter, "python_version": python.version, "module": module,
                 "where": f"; `import {module}` in the image's {python.interpreter} (Python {python.version}) "
                          f"fails with ImportError: {name}: cannot open shared object file"}
    if name.startswith(INJECTED):
        return dict(found, context="injected",
                    reason=f"{name} is mounted from the host by the NVIDIA container toolkit")
    removed = [(path, layer) for path, layer in source.tree.removed.items()
               if posixpath.basename(path) == name]
    if removed:
        path, layer = sorted(removed)[0]
        return dict(found, removed_by_layer=layer, removed_path=path,
                    where=f"; {path} was removed by a whiteout in layer {layer}" + found.get("where", ""))
    return found


class _Packages:
    """What the image's Python packages load before their own libraries (python_static.py):
    the NVIDIA wheels' libraries that torch and cupy load first, and torch's libraries for an
    extension that `import torch` precedes.  The torch is the image's Python's (--python, or
    the interpreter found on the image's PATH) for what lies in its site directories, else
    the one in the extension's own environment, as the host check does."""

    def __init__(self, source: _Source, resolver, facts: list, explicit: bool):
        self.source = source
        self.resolver = resolver
        self.facts = facts
        self.explicit = explicit
        python = source.python
        self.python_torch = python_static.torch_dir_in(source.tree, python.site_dirs) if python else None
        self.torch_closures: dict = {}

    def preloads(self, path: str, result) -> tuple:
        missing = {r.name for r in result.resolutions if r.path is None and "/" not in r.name}
        if not missing:
            return (), {}
        torch = self._torch(path, missing)
        plan = python_static.preload_plan(self.source.tree, path, missing)
        return tuple(torch) + tuple(p for p in plan if p not in torch), plan

    def _torch_dir(self, path: str) -> str | None:
        python = self.source.python
        if python is not None and (self.explicit or python_static.site_of(path) in python.site_dirs):
            return self.python_torch
        return python_static.torch_beside_in(self.source.tree, path)

    def _torch(self, path: str, missing: set) -> tuple:
        wanted = {n for n in missing if n.startswith(closure_facts.TORCH_LIB_PREFIXES)}
        if not wanted:
            return ()
        torch_dir = self._torch_dir(path)
        if torch_dir is None:
            from .torch_ext import torch_not_found_fact

            self.facts.append(torch_not_found_fact(path, wanted))
            return tuple(sorted(wanted))  # whichever torch is imported first provides them
        tree = self.source.tree
        if not any(python_static._file_at(tree, f"{torch_dir}/lib/{n}")[1] is not None for n in wanted):
            return ()
        for name in python_static.TORCH_PRELOAD_ORDER:
            candidate = f"{torch_dir}/lib/{name}"
            if python_static._file_at(tree, candidate)[1] is None:
                continue
            if candidate not in self.torch_closures:
                # `import torch` loaded all of it before the extension
                try:
                    self.torch_closures[candidate] = tuple(self.resolver.closure(candidate).objects)
                except (ELFError, OSError, RecursionError):
                    self.torch_closures[candidate] = ()
            return self.torch_closures[candidate]
        return ()


# --- CUDA forward compatibility (cuda-compat in the image) --------------------------------------
# Where NVIDIA's cuda-compat-X-Y package puts its libcuda (/usr/local/cuda-X.Y/compat, reached
# as /usr/local/cuda/compat), and the one directory the container toolkit's cuda-compat hook
# (nvidia-container-toolkit cmd/nvidia-cdi-hook/cudacompat) adds to the container's ld.so
# cache, before the host's mounted libcuda, when the compat library's major (branch) is
# greater than the host driver's.
TOOLKIT_COMPAT_DIR = "/usr/local/cuda/compat"
# Data center driver branches that are Long Term Support or Production branches (NVIDIA Data
# Center Drivers, "Supported Drivers and CUDA Toolkit Versions" and the CUDA Compatibility
# guide, "Forward Compatibility"): the forward-compatible upgrade is supported on these, not
# on a New Feature Branch, and only with data center GPUs (elsewhere cuInit fails with
# CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, 804).
FORWARD_COMPAT_BRANCHES = {
    418: "LTSB", 450: "LTSB", 460: "PB", 470: "LTSB", 510: "PB", 515: "PB", 525: "PB",
    535: "LTSB", 550: "PB", 570: "PB", 580: "LTSB", 595: "PB", 620: "LTSB",
}


class _Compat:
    """The image's cuda-compat libcuda and whether it replaces the host driver."""

    def __init__(self, directory: str, version: str, how: str, layer: str):
        self.directory = directory
        self.version = version
        self.how = how  # "LD_LIBRARY_PATH" or "toolkit hook" or "" (never loaded)
        self.layer = layer

    @property
    def branch(self) -> int:
        return cuda.version_tuple(self.version)[0]

    def as_scope(self) -> dict:
        return {"directory": self.directory, "version": self.version, "loaded_by": self.how or None,
                "layer": self.layer}


def _compat_libs(source: _Source, gpu) -> _Compat | None:
    """The image's cuda-compat libcuda: one on its LD_LIBRARY_PATH (ld.so takes it first,
    whatever the host), else /usr/local/cuda/compat (the toolkit's hook puts it in the ld.so
    cache when it is of a newer branch than the host's driver), else one in a
    /usr/local/cuda-X.Y/compat that nothing puts on the loader's path."""
    places = []
    for directory in (d for d in source.env.get("LD_LIBRARY_PATH", "").split(":") if d):
        if posixpath.basename(posixpath.normpath(directory)) == "compat":
            places.append((directory, "LD_LIBRARY_PATH"))
    places.append((TOOLKIT_COMPAT_DIR, "toolkit hook"))
    _c, local = python_static._dir_at(source.tree, "/usr/local")
    for name in sorted(local.children if local is not None else ()):
        if name.startswith("cuda-"):
            places.append((f"/usr/local/{name}/compat", ""))
    seen = set()
    for directory, how in places:
        canonical, node = python_static._dir_at(source.tree, directory)
        if node is None or canonical in seen:
            continue
        seen.add(canonical)
        versions = [(m.group(1), child) for child, m in ((c, _COMPAT.match(c)) for c in node.children) if m]
        versions = [(v, c) for v, c in versions if v.count(".") >= 1]
        if not versions:
            continue
        version, child = max(versions, key=lambda item: cuda.version_tuple(item[0]))
        layer = node.children[child].layer
        if how == "toolkit hook":
            spec = _driver_spec(gpu)
            if spec is None or spec.kind not in ("driver", "branch") or \
                    spec.version[0] >= cuda.version_tuple(version)[0]:
                how = ""  # the hook leaves it out: the host's branch is as new
        return _Compat(canonical, version, how, layer)
    return None


def _driver_spec(gpu):
    if not gpu.driver_version:
        return None
    try:
        return cuda._spec(gpu.driver_version)
    except ValueError:
        return None


def _compat_judgement(compat: _Compat | None, gpu, major: int) -> tuple:
    """(compat version the driver floor is judged with or None, image_cuda_compat data or
    None) for a runtime of ``major`` whose floor the host driver misses."""
    if compat is None:
        return None, None
    spec = _driver_spec(gpu)
    needed = cuda.MIN_DRIVER.get(major)
    if spec is None or needed is None or spec.meets(needed):
        return None, None
    data = {"compat_version": compat.version, "compat_dir": compat.directory, "compat_layer": compat.layer,
            "loaded_by": compat.how or "nothing", "runtime_major": major, "required_driver": needed,
            "driver_desc": spec.describe(), "host_branch": None, "branch_kind": None}
    if spec.kind not in ("driver", "branch"):
        data.update(applies=False, why=f"{spec.describe()} names no driver branch; forward compatibility "
                                       "depends on the host's branch: give --driver-version as a driver version")
        return None, data
    branch = spec.version[0]
    data["host_branch"] = branch
    data["branch_kind"] = FORWARD_COMPAT_BRANCHES.get(branch, "NFB or unknown")
    if not compat.how:
        why = (f"nothing puts {compat.directory} on the loader's path (it is neither on LD_LIBRARY_PATH nor "
               f"{TOOLKIT_COMPAT_DIR})" if compat.directory != TOOLKIT_COMPAT_DIR else
               f"the container toolkit uses it only when its branch ({compat.branch}) is newer than the host's")
        data.update(applies=False, why=why)
    elif cuda.version_tuple(compat.version) < cuda.version_tuple(needed):
        data.update(applies=False, why=f"the compat libcuda {compat.version} is itself older than {needed}")
    elif branch not in FORWARD_COMPAT_BRANCHES:
        data.update(applies=False, why=f"driver branch {branch} is not a Long Term Support or Production "
                                       "branch, on which forward compatibility is supported")
    else:
        data.update(applies=True, why=f"branch {branch} ({FORWARD_COMPAT_BRANCHES[branch]}) supports the "
                                      "forward-compatible upgrade on data center GPUs")
        return compat.version, data
    return None, data


def _driver_facts(runtimes: dict, gpu, dedup, compat) -> list:
    """cuda_driver facts for the image's shared runtimes, against the host's driver (the
    one the toolkit injects) or the image's own cuda-compat where it applies."""
    if not gpu.driver_version:
        return []
    facts = []
    for path, (major, requester) in runtimes.items():
        if requester == path or not dedup.first(dedup.drivers, (requester, path)):
            continue
        used, judgement = _compat_judgement(compat, gpu, major)
        fact = cuda.driver_fact(requester, path, major, gpu.driver_version, gpu.driver_source, compat=used)
        if fact is not None:
            facts.append(fact)
            if judgement is not None:
                facts.append(Fact("image_cuda_compat", {"path": requester},
                                  dict(judgement, runtime_path=path), source="collect.image"))
    return facts


def _static_runtime_facts(objects: dict, gpu, seen: set, source: _Source, compat) -> list:
    if not gpu.driver_version:
        return []
    facts = []
    for path, info in objects.items():
        if path in seen:
            continue
        seen.add(path)
        if info is not None and not any(n in info.section_names for n in (".nv_fatbin", "__nv_relfatbin")):
            continue
        try:
            found = cuda.static_runtime(_staged(source, path), info)
        except OSError:
            continue
        if not found or found["major"] is None:
            continue
        used, judgement = _compat_judgement(compat, gpu, found["major"])
        fact = cuda.driver_fact(path, path, found["major"], gpu.driver_version, gpu.driver_source,
                                linkage="static", compat=used,
                                extra={"static_marker": found["marker"], "toolkit_release": found["release"],
                                       "version_source": found["version_source"]})
        if fact is not None:
            facts.append(fact)
            if judgement is not None:
                facts.append(Fact("image_cuda_compat", {"path": path},
                                  dict(judgement, runtime_path=path), source="collect.image"))
    return facts


def _libcuda_facts(source: _Source, resolver) -> list:
    """image_libcuda facts: each regular libcuda.so* file in the image.  On the loader's
    path (the image's ld.so.cache, LD_LIBRARY_PATH or a default directory) ld.so takes it
    before the copy the toolkit mounts, and a version other than the host kernel module's
    fails cuInit with CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (803).  The toolkit's link-time
    stubs (…/stubs/libcuda.so) are for the linker only and are left alone unless the
    loader's path reaches them."""
    from ..resolve import ABIS

    searched = set()
    for directory in source.env.get("LD_LIBRARY_PATH", "").split(":"):
        if directory:
            searched.add(_canonical_dir(source, directory))
    for abi in ABIS.values():
        for directory in abi.system_dirs:
            searched.add(_canonical_dir(source, directory))
    try:
        cached = {_canonical_dir(source, posixpath.dirname(e.path)) for e in resolver.ldcache().entries
                  if e.name.startswith("libcuda.so")}
    except (OSError, ValueError, BadInput):
        cached = set()
    facts = []
    for path, node in source.tree.walk():
        name = posixpath.basename(path)
        if node.kind != "file" or not name.startswith("libcuda.so"):
            continue
        directory = posixpath.dirname(path)
        on_path = directory in searched or directory in cached
        stub = posixpath.basename(directory) == "stubs"
        if stub and not on_path:
            continue
        compat = posixpath.basename(directory) == "compat"
        facts.append(Fact("image_libcuda", {"path": path},
                          {"name": name, "on_loader_path": on_path, "in_ld_cache": directory in cached,
                           "compat": compat, "layer": node.layer,
                           "remove": f"RUN rm -f {directory}/libcuda.so*"},
                          source="collect.image"))
    return facts


def _canonical_dir(source: _Source, directory: str) -> str:
    try:
        canonical, _node = source.tree.lookup(directory)
    except layers.SymlinkLoop:
        return posixpath.normpath(directory)
    return canonical


def _with_image_subject(fact: Fact, tree) -> Fact:
    """The fact's subject with image_path and the digest of the layer that brought it in."""
    path = fact.subject.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        return fact
    try:
        _canonical, node = tree.lookup(path)
    except layers.SymlinkLoop:
        node = None
    subject = dict(fact.subject, image_path=path)
    if node is not None and node.layer:
        subject["layer"] = node.layer
    return Fact(fact.kind, subject, fact.data, fact.source)
