"""Orchestrate `seedance check`: targets -> facts -> rule engine -> Report.

One Resolver is shared by the whole scan (it caches every object it reads), and one
FactDedup, so a library loaded by a thousand roots is judged once.
"""
from __future__ import annotations

import errno
import os
import stat
import time
from collections import Counter
from dataclasses import dataclass, field

from ..elf.reader import ELF_MAGIC, read_elf
from ..engine import load_rules
from ..errors import BadInput, ELFError, UsageError, describe_os_error
from ..model import Report
from . import closure as closure_facts
from . import config as config_collect
from . import cuda, cxxabi, fatbin, host, process, torch_ext


@dataclass
class CheckOptions:
    targets: list = field(default_factory=list)
    pids: list = field(default_factory=list)
    arch: str | None = None
    driver_version: str | None = None
    strict: bool = False
    rules_dir: str | None = None
    env: dict | None = None  # the environment the resolver assumes (LD_LIBRARY_PATH, ...)

    @property
    def host_scope(self) -> bool:
        return not self.targets and not self.pids


class _Null:
    def start(self, total, label=None):
        pass

    def advance(self, step=1, note=""):
        pass

    def finish(self):
        pass


def gpu_context(options: CheckOptions) -> cuda.GpuInfo:
    """Target archs and driver: the command line wins; NVML fills what it does not give."""
    gpu = cuda.probe_nvml()
    if options.arch:
        try:
            gpu.targets = [fatbin.parse_target(options.arch)]
        except ValueError as exc:
            raise UsageError(f"--arch: {exc}") from None
    if options.driver_version:
        try:
            cuda.parse_driver_version(options.driver_version)
        except ValueError as exc:
            raise UsageError(f"--driver-version: {exc}") from None
        gpu.driver_version, gpu.driver_source = options.driver_version, "--driver-version"
    return gpu


class Scanner:
    def __init__(self, options: CheckOptions, progress=None):
        self.options = options
        self.progress = progress or _Null()
        self.facts: list = []
        self.stats: Counter = Counter()
        self.errors: list = []
        self.dedup = closure_facts.FactDedup()
        self.torch_abi = cxxabi.TorchAbiCache()
        self.fatbin_seen: set = set()
        self.static_runtime_seen: set = set()  # objects checked for a linked-in CUDA runtime
        self.objects_seen: set = set()
        self.explicit: set = set()  # files named on the command line: unreadable -> exit 2
        self.torch_preloads: dict = {}  # torch library -> its closure, loaded before extensions
        self.torch_builds: list = []  # cached torch extension builds found in target dirs

    # --- entry point ------------------------------------------------------------------
    def run(self) -> Report:
        started = time.monotonic()
        rules = load_rules(self.options.rules_dir)  # a bad rules dir fails before any work
        self.gpu = gpu_context(self.options)
        from ..resolve import Resolver

        env = self.options.env
        if env is None:
            # what a program started from this shell would see; LD_PRELOAD is left out on
            # purpose: it belongs to this session (a shim), not to the objects checked
            env = {k: v for k, v in os.environ.items() if k == "LD_LIBRARY_PATH"}
        self.resolver = Resolver(env=env)
        roots, configs = [], []
        if self.options.host_scope:
            roots, configs = self._host_targets()
        else:
            for target in self.options.targets:
                found_roots, found_configs = self._expand(target)
                roots.extend(found_roots)
                configs.extend(found_configs)
        roots = _unique_roots(roots)
        for pid in self.options.pids:
            self._process(pid, explicit=True)
        for path in configs:
            self._config(path, explicit=not self.options.host_scope)
        self.progress.start(len(roots), "checking")
        try:
            for path in roots:
                self._root(path)
                self.progress.advance(note=path)
        finally:
            self.progress.finish()
        self.facts.extend(closure_facts.runtime_mix_facts(self.dedup))
        if self.options.host_scope:
            self.facts.extend(torch_ext.torch_ext_facts())
        elif self.torch_builds:
            self.facts.extend(torch_ext.torch_ext_facts(builds=self.torch_builds))
        findings = rules.evaluate(self.facts, strict=self.options.strict)
        kinds = Counter(f.kind for f in self.facts)
        stats = {"files_scanned": self.stats["files"], "elf_objects": self.stats["elf"],
                 "closure_objects": len(self.objects_seen), "skipped": self.stats["skipped"],
                 "unreadable": self.stats["unreadable"], "processes": self.stats["processes"],
                 "processes_vanished": self.stats["vanished"], "configs": self.stats["configs"],
                 "facts": len(self.facts), "facts_by_kind": dict(sorted(kinds.items())),
                 "errors": self.errors, "duration_s": round(time.monotonic() - started, 3)}
        report = Report(command="check", host=host.host_facts(self.gpu), stats=stats,
                        extra={"scope": self._scope()})
        report.add(findings)
        return report

    def _scope(self) -> dict:
        """What this check covered, so a report says what it did not look at."""
        scope = {"host": self.options.host_scope, "targets": list(self.options.targets),
                 "pids": list(self.options.pids), "strict": self.options.strict,
                 "gpu_targets": [label for _n, _v, label, _s in self.gpu.targets],
                 "driver_version": self.gpu.driver_version}
        if self.options.host_scope:
            scope.update(ld_so_cache="/etc/ld.so.cache", cuda_dirs=host.cuda_library_dirs(),
                         config_dirs=host.config_dirs(), torch_ext_roots=torch_ext.cache_roots())
        return scope

    # --- targets ------------------------------------------------------------------------
    def _expand(self, target: str) -> tuple:
        """An explicit target: a file (ELF or YAML config) or a directory scanned recursively."""
        try:
            st = os.stat(target)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise BadInput(f"{target}: symbolic link loop") from None
            raise BadInput(describe_os_error(exc)) from None
        if stat.S_ISDIR(st.st_mode):
            self.torch_builds.extend(torch_ext.builds_in(target))  # a torch extension cache?
            return self._walk(target), []
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or never end
            raise BadInput(f"{target}: not a regular file or directory")
        self.stats["files"] += 1
        if target.endswith(config_collect.CONFIG_SUFFIXES):
            return [], [target]
        kind = _sniff(target)
        if kind == "elf":
            self.explicit.add(target)
            return [(target, st)], []
        if isinstance(kind, OSError):
            raise BadInput(describe_os_error(kind)) from None
        raise BadInput(f"{target}: not an ELF file or a seedance YAML config")

    def _walk(self, directory: str) -> list:
        """ELF files under a directory; symlinked directories are not followed (no loops)."""
        found = []

        def onerror(exc: OSError):
            self.stats["unreadable"] += 1
            self.errors.append({"path": exc.filename or directory, "error": describe_os_error(exc)})

        for base, dirs, files in os.walk(directory, onerror=onerror, followlinks=False):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(base, name)
                self.stats["files"] += 1
                try:
                    st = os.stat(path)
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        self.stats["unreadable"] += 1
                        self.errors.append({"path": path, "error": "symbolic link loop"})
                    else:
                        self.stats["skipped"] += 1  # a dangling link: nothing to check
                    continue
                if not stat.S_ISREG(st.st_mode) or st.st_size < 16:
                    self.stats["skipped"] += 1
                    continue
                kind = _sniff(path)
                if kind == "elf":
                    found.append((path, st))
                elif isinstance(kind, OSError):
                    self.stats["unreadable"] += 1
                    self.errors.append({"path": path, "error": describe_os_error(kind)})
                else:
                    self.stats["skipped"] += 1
        return found

    def _host_targets(self) -> tuple:
        roots = []
        for path in host.ld_cache_paths():
            self.stats["files"] += 1
            try:
                st = os.stat(path)
            except OSError:
                self.stats["skipped"] += 1
                continue
            if _sniff(path) == "elf":
                roots.append((path, st))
        for directory in host.cuda_library_dirs():
            roots.extend(self._walk(directory))
        for pid in process.all_pids():
            self._process(pid, explicit=False)
        configs = []
        for directory in host.config_dirs():
            if os.path.isdir(directory):
                configs.extend(config_collect.config_files(directory))
        return roots, configs

    # --- collectors -----------------------------------------------------------------------
    def _root(self, path: str) -> None:
        from ..resolve import ABIS

        try:
            info = self.resolver.read(path)
            if (info.elf_class, info.machine) not in ABIS:
                self.stats["skipped"] += 1  # another machine's object (firmware, BPF): no loader
                return
            result = self.resolver.closure(path, symbols=self.options.strict)
            preload = self._torch_preload(path, result)
            if preload:
                result = self.resolver.closure(path, symbols=self.options.strict, preloaded=preload)
        except ELFError as exc:
            if path in self.explicit:
                raise
            self.stats["unreadable"] += 1
            self.errors.append({"path": path, "error": str(exc)})
            return
        except OSError as exc:
            if path in self.explicit:
                raise BadInput(describe_os_error(exc)) from None
            self.stats["unreadable"] += 1
            self.errors.append({"path": path, "error": describe_os_error(exc)})
            return
        except RecursionError:
            self.stats["unreadable"] += 1
            self.errors.append({"path": path, "error": "dependency chain too deep"})
            return
        self.stats["elf"] += 1
        self.objects_seen.update(result.objects)
        add = self.facts.extend
        add(closure_facts.needed_facts(result, self.dedup, skip_names=preload))
        add(closure_facts.version_facts(result, self.dedup))
        if self.options.strict:
            add(closure_facts.undefined_facts(result, self.dedup))
        runtimes = closure_facts.closure_runtimes(result)
        closure_facts.note_runtime_mix(result, runtimes, self.dedup)
        add(closure_facts.driver_facts(runtimes, self.gpu, self.dedup))
        add(cuda.static_runtime_facts(result.objects, self.gpu, self.static_runtime_seen))
        if self.gpu.targets:
            for obj_path, info in result.objects.items():
                if obj_path not in self.fatbin_seen and fatbin.has_fatbin(info):
                    self.fatbin_seen.add(obj_path)
                    add(self._fatbin(obj_path))
        torch_paths = closure_facts.torch_libs(result)
        if torch_paths and path not in torch_paths:
            self._cxx_abi(path, result, torch_paths)

    def _torch_preload(self, path: str, result) -> tuple:
        """Torch's libraries, when a Python extension needs them and cannot find them itself.

        Extensions link -lc10 -ltorch without a RUNPATH: they only load in a Python that
        imported torch first, which put libtorch_python.so (and with it libtorch, libc10)
        in the process.  ld.so then satisfies the NEEDED by SONAME.  We model exactly that
        with the torch beside the extension (same site-packages), else the current one.
        """
        missing = {r.name for r in result.resolutions
                   if r.path is None and r.name.startswith(closure_facts.TORCH_LIB_PREFIXES)}
        if not missing:
            return ()
        torch_lib = self._torch_lib_near(path)
        if torch_lib is None or not any(os.path.exists(os.path.join(torch_lib, n)) for n in missing):
            return ()
        for name in ("libtorch_python.so", "libtorch.so", "libc10.so"):
            candidate = os.path.join(torch_lib, name)
            if os.path.exists(candidate):
                # `import torch` finished loading all of it before the extension: the whole
                # closure is in the namespace, not just the one library (LD_PRELOAD semantics
                # would search the extension's NEEDED before the preload's own dependencies)
                if candidate not in self.torch_preloads:
                    try:
                        self.torch_preloads[candidate] = tuple(self.resolver.closure(candidate).objects)
                    except (ELFError, OSError):
                        self.torch_preloads[candidate] = ()
                return self.torch_preloads[candidate]
        return ()

    def _torch_lib_near(self, path: str) -> str | None:
        directory = os.path.dirname(os.path.abspath(path))
        for _ in range(6):  # site-packages/pkg/sub/ext.so -> site-packages/torch/lib
            candidate = os.path.join(directory, "torch", "lib")
            if os.path.isdir(candidate):
                return candidate
            parent = os.path.dirname(directory)
            if parent == directory:
                break
            directory = parent
        if not hasattr(self, "_current_torch"):
            self._current_torch = torch_ext.find_torch()
        return os.path.join(self._current_torch.path, "lib") if self._current_torch else None

    def _fatbin(self, path: str) -> list:
        try:
            entries = read_elf(path, fatbin=True).fatbin
        except ELFError as exc:
            self.errors.append({"path": path, "error": str(exc)})
            return []
        return fatbin.fatbin_facts(path, entries, self.gpu.targets, driver=self.gpu.driver_version)

    def _cxx_abi(self, path: str, result, torch_paths) -> None:
        info = next(iter(result.objects.values()), None)
        if info is None or not info.symbols:
            try:
                info = read_elf(path, symbols=True)
            except ELFError:
                return
        fact = cxxabi.cxx_abi_fact(path, info, torch_paths, self.torch_abi)
        if fact is not None:
            self.facts.append(fact)

    def _process(self, pid: int, explicit: bool) -> None:
        try:
            view = process.read_process(pid)
        except process.ProcessGone:
            if explicit:
                raise BadInput(f"pid {pid}: no such process") from None
            self.stats["vanished"] += 1
            return
        except PermissionError:
            if explicit:
                raise BadInput(f"pid {pid}: permission denied reading /proc/{pid}") from None
            self.stats["unreadable"] += 1
            return
        self.stats["processes"] += 1
        self.facts.extend(process.mapped_lib_facts(view))
        self.facts.extend(process.runtime_facts(view))
        self.facts.extend(process.preload_facts(view))

    def _config(self, path: str, explicit: bool) -> None:
        try:
            self.facts.extend(config_collect.config_facts(path))
            self.stats["configs"] += 1
        except config_collect.BadYaml as exc:
            if explicit:
                raise BadInput(str(exc)) from None
            self.errors.append({"path": path, "error": str(exc)})
        except OSError as exc:
            if explicit:
                raise BadInput(describe_os_error(exc)) from None
            self.stats["unreadable"] += 1
            self.errors.append({"path": path, "error": describe_os_error(exc)})


def _sniff(path: str):
    """'elf', 'other', or the OSError that stopped us reading it."""
    try:
        with open(path, "rb") as handle:
            return "elf" if handle.read(4) == ELF_MAGIC else "other"
    except OSError as exc:
        return exc


def _unique_roots(found) -> list:
    """One path per file: a real file is preferred over the symlinks that point at it."""
    chosen: dict = {}
    for path, st in found:
        key = (st.st_dev, st.st_ino)
        current = chosen.get(key)
        if current is None or (os.path.islink(current) and not os.path.islink(path)):
            chosen[key] = path
    return sorted(chosen.values())


def run_check(options: CheckOptions, progress=None) -> Report:
    return Scanner(options, progress).run()
