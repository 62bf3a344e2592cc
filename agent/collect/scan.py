"""Orchestrate `seedance check`: targets -> facts -> rule engine -> Report.

One Resolver is shared by the whole scan (it caches every object it reads), and one
FactDedup, so a library loaded by a thousand roots is judged once.
"""
from __future__ import annotations

import errno
import gc
import os
import re
import stat
import time
from collections import Counter
from operator import attrgetter

from .. import telemetry
from ..elf.reader import ELF_MAGIC, read_elf
from ..judge.engine import load_rules
from ..model.errors import BadInput, ELFError, describe_os_error
from ..model.report import Fact, Report
from . import closure as closure_facts
from . import config as config_collect
from . import cuda, cxxabi, fatbin, helper, host, inputs, practice, treewalk
from . import options as _options
from .options import CheckOptions, gpu_context  # noqa: F401 (their home before the check cache)
# process (pids, the host scope) and torch_ext (--python, directories, torch extensions) are
# imported where used: their dataclasses compile their methods with exec() at import, a
# start-up cost that a `seedance fix` of one library, which needs neither, should not pay


_KIND_OF = attrgetter("kind")


class _Null:
    def start(self, total, label=None):
        pass

    def advance(self, step=1, note=""):
        pass

    def finish(self):
        pass


class Scanner:
    def __init__(self, options: CheckOptions, progress=None):
        self.options = options
        self.progress = progress or _Null()
        self.facts: list = []
        self.stats: Counter = Counter()
        self.errors: list = []
        self.dedup = closure_facts.FactDedup()
        self.torch_abi = cxxabi.TorchAbiCache(key=self.dedup.identity)
        self.fatbin_seen: set = set()
        self.static_runtime_seen: set = set()  # objects checked for a linked-in CUDA runtime
        self.objects_seen: set = set()
        self.explicit: set = set()  # files named on the command line: unreadable -> exit 2
        self.torch_preloads: dict = {}  # torch library -> its closure, loaded before extensions
        self.torch_builds: list = []  # cached torch extension builds found in target dirs
        self.tree_index: dict = {}  # file name -> [paths] of the ELF files scanned
        self.dir_configs: list = []  # seedance/plugin YAML configs found in target dirs
        self._hosts: dict = {}  # interpreter -> its closure's objects, read with symbols
        self._private: dict = {}  # (requester, name) -> (loader, reason) or None
        self._isa_cpu = None  # this CPU's x86 ISA_1 mask, once asked (0: no check on this glibc)
        self._isa_seen: set = set()  # objects whose ISA level was read
        # per path, across the closures of the scan (a path is one ElfInfo: the resolver
        # reads each file once): what is derived from an object alone is derived once, not
        # once per root that loads it
        self.resolver = None  # made by run(), before the targets are walked
        self._plain_files: set = set()  # ELF paths the walk saw as regular files, not links
        self._walk_sniffed: dict = {}  # (dev, inode) -> kind, for the pieces of walks this process takes
        self._isa_paths: set = set()  # paths whose object _isa_facts has looked at
        self._runtime_major: dict = {}  # path -> libcudart major or None (closure_runtimes)
        self._torch_lib: dict = {}  # path -> is one of torch's core libraries (torch_libs)
        # check --bundle (collect/bundle.py) records each closure and process as it is read
        self.on_closure = None  # (root, ClosureResult, runtimes) -> None
        self.on_process = None  # (ProcessView) -> None
        # the C++ ABI check's jobs, run beside the root loop by a forked helper (helper.py)
        self._abi_jobs = None  # helper.Helper, when this scan has enough roots for one
        self._abi_placed: list = []  # (index in self.facts, ticket): where each job's facts go
        # (root, the paths its closure maps) per root: which roots fail with a load failure
        # (closure.fails_with_facts); the paths only, as the resolver keeps a few closures whole
        self.closure_paths: list = []

    # --- entry point ------------------------------------------------------------------
    def run(self) -> Report:
        # A scan builds on the order of 10^5 objects (ElfInfos, resolutions, facts) that live
        # until it ends, and almost none form cycles: each pass of the cyclic collector
        # traverses all of them to free next to nothing, and allocation triggers pass after
        # pass as the scan grows.  It is paused for the scan and restored after; the few
        # cycles are collected then, as before, by the next pass.
        keep = _options.KEEP_UNTIL_EXIT
        if keep is not None:
            keep.append(self)
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if collecting:
                gc.enable()

    def _run(self) -> Report:
        started = time.monotonic()
        rules = load_rules(self.options.rules_dir)  # a bad rules dir fails before any work
        self.gpu = gpu_context(self.options)
        # a bad --python is bad input before any work (exit 2)
        self.python_torch = None
        if self.options.python:
            from . import torch_ext
            self.python_torch = torch_ext.torch_for_python(self.options.python)
        from ..resolve import Resolver

        env = self.options.env
        if env is None:
            # what a program started from this shell would see; LD_PRELOAD is left out on
            # purpose: it belongs to this session (a shim), not to the objects checked
            env = {k: v for k, v in os.environ.items() if k == "LD_LIBRARY_PATH"}
        self.resolver = Resolver(env=env)
        self.dedup.stat_of = self.resolver._stat_of
        roots, configs = [], []
        phases = telemetry.phases("check")  # walk, resolve, rules: spans when traced
        phases.next("walk")
        if self.options.host_scope:
            roots, configs = self._host_targets()
        else:
            for target in self.options.targets:
                found_roots, found_configs = self._expand(target)
                roots.extend(found_roots)
                configs.extend(found_configs)
        roots = _unique_roots(roots, self._plain_files)
        configs.extend(self.dir_configs)
        for path in roots:
            self.tree_index.setdefault(os.path.basename(path), []).append(path)
        for pid in self.options.pids:
            self._process(pid, explicit=True)
        for path in configs:
            self._config(path, explicit=not self.options.host_scope)
        if helper.wanted(len(roots), HELPER_MIN_ROOTS):
            torch_roots = [path for path in roots if os.path.basename(path).startswith(closure_facts.TORCH_CORE_NAMES)]
            if torch_roots:  # the tree holds a torch: its extensions and test programs follow
                self._abi_jobs = helper.Helper(self._cxx_abi_job, warm=lambda: self.torch_abi.warm(
                    torch_roots, self._torch_exports))
                self._abi_jobs.start()
        if len(roots) >= HELPER_MIN_ROOTS:
            practice.prefetch_dpkg()  # which package ships a file: read on a thread now
        phases.next("resolve", {"seedance.check.roots": len(roots)})
        self.progress.start(len(roots), "checking")
        try:
            for path in roots:
                self._root(path)
                self.progress.advance(note=path)
        except BaseException:  # (Ctrl-C included) the helper's jobs are not waited for
            if self._abi_jobs is not None:
                self._abi_jobs.abandon()
                self._abi_jobs = None
            raise
        finally:
            self.progress.finish()
        self._place_abi_facts()
        self.facts.extend(practice.driver_absent_once(closure_facts.needed_facts(self.dedup, self._explain_missing)))
        self.facts.extend(closure_facts.runtime_mix_facts(self.dedup))
        if self.options.host_scope:
            from . import torch_ext
            self.facts.extend(torch_ext.torch_ext_facts(torch=self.python_torch))
        elif self.torch_builds:
            from . import torch_ext
            self.facts.extend(torch_ext.torch_ext_facts(builds=self.torch_builds, torch=self.python_torch))
        self.facts = closure_facts.fails_with_facts(self.facts, self.closure_paths, self.dedup.identity)
        phases.next("rules", {"seedance.check.facts": len(self.facts)})
        findings = rules.evaluate(self.facts, strict=self.options.strict)
        phases.end()
        kinds = Counter(map(_KIND_OF, self.facts))  # counted in C: a check of /usr/lib makes thousands
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
            from . import torch_ext

            scope.update(ld_so_cache="/etc/ld.so.cache", cuda_dirs=host.cuda_library_dirs(),
                         config_dirs=host.config_dirs(), torch_ext_roots=torch_ext.cache_roots())
        return scope

    # --- targets ------------------------------------------------------------------------
    def _expand(self, target: str) -> tuple:
        """An explicit target: a file (ELF or YAML config) or a directory scanned recursively."""
        try:
            st = inputs.stat(target)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise BadInput(f"{target}: symbolic link loop") from None
            raise BadInput(describe_os_error(exc)) from None
        if stat.S_ISDIR(st.st_mode):
            from . import torch_ext

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
        """ELF files under a directory; symlinked directories are not followed (no loops).

        In C where it is built (elf/treewalk.c through collect/treewalk.py: the same walk,
        on two threads where a second core is free); what follows is the Python walk, the
        reference the tests compare it with (SEEDANCE_WALK=python).

        os.walk's order and choices (top-down, sorted, a symlink to a directory neither
        entered nor counted as a file), over scandir's entries: the entry type saves a stat
        for directories, and a file reached again through a link (libfoo.so.1 ->
        libfoo.so.1.2) is sniffed once (a site-packages tree holds tens of thousands of files,
        so the walk's per-entry cost is most of its check).

        A big tree is shared with a forked helper (helper.share): the directory and its
        subdirectories are listed here, and the pieces after them (chunks of a directory's
        files, the subtrees two levels down) are taken by whichever process is free; each
        piece's findings are put back in the walk's order, so the result, the counts and
        the errors are the one-process walk's."""
        shared = helper.available()
        walked = treewalk.walk(directory, NEVER_ELF_SUFFIXES, config_collect.CONFIG_SUFFIXES,
                               WALK_THREADS if shared else 1)
        if walked is not None:
            parts = [self._walked(*walked)]
        elif not shared:
            top = _WalkAcc({})
            self._walk_tree(directory, top)
            parts = [top]
        else:
            pieces = self._walk_pieces(directory)
            work = [piece for piece in pieces if piece[0] != "done"]
            # A tree with few subtrees two levels down is walked here, piece after piece: the
            # helper's fork, its copy-on-write faults and its answer cost more than sharing
            # saves on a tree of a few dozen subtrees (/usr/lib/x86_64-linux-gnu), less than
            # on one of hundreds (site-packages with torch); bench/bench_walk.py times both.
            if sum(1 for piece in work if piece[0] == "tree") >= WALK_SPLIT_MIN_SUBTREES:
                done = iter(helper.share(work, self._walk_piece, WALK_SPLIT_MIN_PIECES))
            else:
                done = map(self._walk_piece, work)
            parts = [piece[1] if piece[0] == "done" else next(done) for piece in pieces]
        found = []
        for part in parts:
            found.extend(part.found)
            self.stats.update(part.stats)
            self.errors.extend(part.errors)
            self.dir_configs.extend(part.configs)
            self._plain_files.update(part.plain)
        if self.resolver is not None:
            # the resolver's first read of a root stats it again: this stat serves
            note = self.resolver.note_stat
            for path, st in found:
                note(path, st)
        return found

    def _walked(self, counts: dict, records: list) -> "_WalkAcc":
        """The C walk's records (collect/treewalk.py) as the Python walk's _WalkAcc."""
        acc = _WalkAcc(None)
        acc.stats.update({key: value for key, value in counts.items() if value})  # (a Counter's, as += makes)
        found, plain, errors = acc.found, acc.plain, acc.errors
        for kind, path, err, st, is_plain, elf in records:
            if kind == "C":  # named like a config: ours, or looked at as any file
                if _is_seedance_config(path):
                    acc.configs.append(path)
                    continue
                if err:
                    acc.stats["unreadable"] += 1
                    kind = "U"
                elif elf:
                    kind = "E"
                else:
                    acc.stats["skipped"] += 1
                    continue
            if kind == "E":
                found.append((path, st))
                if is_plain:
                    plain.append(path)
            elif kind == "L":
                errors.append({"path": path, "error": "symbolic link loop"})
            else:  # 'U' a file, 'X' a directory that could not be read
                errors.append({"path": path, "error": describe_os_error(OSError(err, os.strerror(err), path))})
        return acc

    def _walk_pieces(self, directory: str) -> list:
        """The walk of ``directory`` cut in pieces, in walk order: ("done", acc) for what is
        done here (the listings of the directory and of its subdirectories), ("files",
        entries) for up to WALK_CHUNK files of one directory, ("tree", path) for a subtree."""
        top = _WalkAcc(None)  # (a listing sniffs nothing)
        listing = self._walk_list(directory, top)
        if listing is None:
            return [("done", top)]
        files, subdirs = listing
        self._walk_sniffed = {}  # one per walk, as a one-process walk's
        pieces = [("done", top)]
        pieces += [("files", files[at:at + WALK_CHUNK]) for at in range(0, len(files), WALK_CHUNK)]
        for name in subdirs:
            path = os.path.join(directory, name)
            acc = _WalkAcc(None)
            listed = self._walk_list(path, acc)
            pieces.append(("done", acc))
            if listed is None:
                continue
            pieces += [("files", listed[0][at:at + WALK_CHUNK]) for at in range(0, len(listed[0]), WALK_CHUNK)]
            pieces += [("tree", os.path.join(path, sub)) for sub in listed[1]]
        return pieces

    def _walk_piece(self, piece) -> "_WalkAcc":
        acc = _WalkAcc(self._walk_sniffed)
        if piece[0] == "files":
            self._walk_files(piece[1], acc)
        else:
            self._walk_tree(piece[1], acc)
        acc.sniffed = None  # (the process's own: not sent back)
        return acc

    def _walk_tree(self, directory: str, acc: "_WalkAcc") -> None:
        stack = [directory]
        while stack:
            base = stack.pop()
            listing = self._walk_list(base, acc)
            if listing is None:
                continue
            files, subdirs = listing
            self._walk_files(files, acc)
            # pushed in reverse so the sorted first is walked next: os.walk's top-down order
            stack.extend(os.path.join(base, name) for name in reversed(subdirs))

    def _walk_list(self, base: str, acc: "_WalkAcc"):
        """(files, subdirectory names) of one directory, each sorted by name; None when it
        cannot be listed (counted and named in ``acc``).  Files named like sources and
        headers are counted and skipped here."""
        try:
            with os.scandir(base) as listing:
                entries = list(listing)
        except OSError as exc:
            acc.stats["unreadable"] += 1
            acc.errors.append({"path": exc.filename or base, "error": describe_os_error(exc)})
            return None
        subdirs = []
        # The entries sorted out by comprehensions: a loop per entry would be most of a
        # site-packages walk (tens of thousands of entries, each a bytecode loop turn).
        # is_dir() answers from the entry's type; only where it must stat and that fails
        # does the walk take the entries one by one (an entry that cannot be stat'ed is no
        # directory).
        try:
            found_dirs = [entry for entry in entries if entry.is_dir()]
            others = [entry for entry in entries if not entry.is_dir()] if found_dirs else entries
        except OSError:
            found_dirs, others = [], []
            for entry in entries:
                try:
                    is_dir = entry.is_dir()
                except OSError:
                    is_dir = False
                (found_dirs if is_dir else others).append(entry)
        for entry in found_dirs:
            try:
                if not entry.is_symlink():
                    subdirs.append(entry.name)
            except OSError:
                pass
        # most of site-packages: counted, never stat'ed nor opened, nor sorted with the
        # files that are looked at; entry.path: joined in C
        files = [(entry.name, entry.path, entry) for entry in others
                 if not entry.name.endswith(NEVER_ELF_SUFFIXES)]
        never_elf = len(others) - len(files)
        acc.stats["files"] += never_elf
        acc.stats["skipped"] += never_elf
        files.sort(key=_first)
        subdirs.sort()
        return files, subdirs

    def _walk_files(self, files: list, acc: "_WalkAcc") -> None:
        stats, sniffed = acc.stats, acc.sniffed
        for name, path, entry in files:
            stats["files"] += 1
            st = None
            try:
                # scandir's d_type says "regular file" without a stat; the stat is then
                # needed only for what is kept (links are followed: stat them now)
                plain = entry.is_file(follow_symlinks=False)
            except OSError:
                plain = False
            if not plain:
                try:
                    st = inputs.stat(path)
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        stats["unreadable"] += 1
                        acc.errors.append({"path": path, "error": "symbolic link loop"})
                    else:
                        stats["skipped"] += 1  # a dangling link: nothing to check
                    continue
                if not stat.S_ISREG(st.st_mode) or st.st_size < 16:
                    stats["skipped"] += 1
                    continue
            if name.endswith(config_collect.CONFIG_SUFFIXES) and _is_seedance_config(path):
                acc.configs.append(path)
                continue
            # a file reached again through a link is sniffed once; plain files are not
            # looked up (an inode without its device could be another filesystem's)
            kind = sniffed.get((st.st_dev, st.st_ino)) if st is not None else None
            if kind is None:
                kind = _sniff(path)
                if isinstance(kind, str) and st is not None:
                    sniffed[(st.st_dev, st.st_ino)] = kind
            if kind == "elf" and st is None:
                try:
                    st = inputs.stat(path)
                except OSError as exc:
                    stats["unreadable"] += 1  # vanished or unreadable since it was listed
                    acc.errors.append({"path": path, "error": describe_os_error(exc)})
                    continue
                if st.st_size < 16:
                    kind = "other"
                else:
                    sniffed[(st.st_dev, st.st_ino)] = kind
            if kind == "elf":
                acc.found.append((path, st))
                if plain:
                    acc.plain.append(path)
            elif isinstance(kind, OSError):
                stats["unreadable"] += 1
                acc.errors.append({"path": path, "error": describe_os_error(kind)})
            else:
                stats["skipped"] += 1

    def _host_targets(self) -> tuple:
        self.dir_configs = []  # the host scope reads its own config dirs

        roots = []
        for path in host.ld_cache_paths():
            self.stats["files"] += 1
            try:
                st = inputs.stat(path)
            except OSError:
                self.stats["skipped"] += 1
                continue
            if _sniff(path) == "elf":
                roots.append((path, st))
        for directory in host.cuda_library_dirs():
            roots.extend(self._walk(directory))
        from . import process

        for pid in process.all_pids():
            self._process(pid, explicit=False)
        configs = []
        for directory in host.config_dirs():
            if inputs.isdir(directory):
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
            # (no symbols read into the closure: --strict asks resolver.undefined below,
            # which reads each file's symbol table once, without Symbol objects)
            result = self.resolver.closure(path)
            preload, preloaded_by = self._preloads(path, result)
            if preload:
                result = self.resolver.closure(path, preloaded=preload)
            if self.options.strict:
                # here, where a symbol table that does not parse makes the root unreadable
                # as the reads above do (a file found in a tree is skipped, a named one fails)
                host, scope = self._host_of(path)
                undefined = self.resolver.undefined(result, scope)
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
        self.closure_paths.append((path, tuple(result.objects)))
        add = self.facts.extend
        closure_facts.note_needed(result, self.dedup, skip_names=preload, preloaded_by=preloaded_by)
        add(closure_facts.version_facts(result, self.dedup))
        add(closure_facts.gap_facts(result, self.resolver.version_gaps(result), self.dedup,
                                    package_of=practice.package_of))
        if self.options.strict:
            # an object with a NEEDED that resolves nowhere: its symbols are that library's,
            # and the needed-* finding already names the cause (libsystemd-core would
            # otherwise add 1012 warnings for the libsystemd-shared that only systemd finds)
            incomplete = {r.requester for r in result.resolutions if r.path is None}
            undefined = [u for u in undefined if u[0] not in incomplete]
            add(closure_facts.undefined_facts(result, self.dedup, undefined, host=host or ""))
        runtimes = closure_facts.closure_runtimes(result, self._runtime_major)
        closure_facts.note_runtime_mix(result, runtimes, self.dedup)
        if self.on_closure is not None:
            self.on_closure(path, result, runtimes)
        add(closure_facts.driver_facts(runtimes, self.gpu, self.dedup))
        add(cuda.static_runtime_facts(result.objects, self.gpu, self.static_runtime_seen))
        if self.gpu.targets:
            for obj_path, info in result.objects.items():
                if obj_path not in self.fatbin_seen and fatbin.has_fatbin(info):
                    self.fatbin_seen.add(obj_path)
                    add(self._fatbin(obj_path))
        torch_paths = closure_facts.torch_libs(result, self._torch_lib)
        if torch_paths and path not in torch_paths:
            self._cxx_abi(path, result, torch_paths)
        if result.abi == "x86_64":
            add(self._isa_facts(path, result))

    def _isa_facts(self, root: str, result) -> list:
        """cpu_isa facts: objects of the closure marked as needing an x86-64 ISA level this
        CPU lacks, which glibc 2.33+ refuses after mapping them (elf/properties.py).  Read
        once per object per scan; only marked objects become facts."""
        from ..elf import fastread, properties
        from ..resolve import hwcaps

        if self._isa_cpu is None:
            # glibc < 2.33 has no ISA-level check (and no x86-64-vN levels to compare with)
            self._isa_cpu = properties.cpu_isa_mask(self.resolver.caps.hwcaps_subdirs) \
                if hwcaps.glibc_version() >= (2, 33) else 0
        if not self._isa_cpu or result.objects.keys() <= self._isa_paths:
            return []  # (the usual case: every object looked at from an earlier root)
        facts = []
        for obj_path in result.objects:
            if obj_path in self._isa_paths:
                continue  # looked at from an earlier root: its identity is in _isa_seen
            self._isa_paths.add(obj_path)
            key = self.dedup.identity(obj_path)
            if key in self._isa_seen:
                continue
            self._isa_seen.add(key)
            needed = fastread.x86_isa_needed(obj_path)  # from the read that parsed it
            if needed is None:
                needed = properties.x86_isa_needed(obj_path)
            if not needed & ~properties.BASELINE:
                continue
            named = properties.level_names(needed)
            cpu = properties.level_names(self._isa_cpu) or ["baseline"]
            facts.append(Fact("cpu_isa", {"path": obj_path},
                              {"needed": named, "highest_needed": named[-1],
                               "cpu_levels": cpu, "cpu_highest": cpu[-1],
                               "lacking": properties.level_names(needed & ~self._isa_cpu), "loaded_by": root,
                               "loader_message": "CPU ISA level is lower than required"},
                              source="collect.scan"))
        return facts

    def _preloads(self, path: str, result) -> tuple:
        """(paths to preload, {provider: (reason, package)}): what the packages around
        ``path`` load before it (collect/practice.py), and torch for its extensions."""
        torch = self._torch_preload(path, result)
        missing = {r.name for r in result.resolutions if r.path is None and "/" not in r.name}
        plan = practice.preload_plan(path, missing) if missing else {}
        preload = tuple(torch) + tuple(p for p in plan if p not in torch)
        return preload, plan

    def _host_of(self, path: str) -> tuple:
        """(interpreter, {path: ElfInfo}) when ``path`` is an extension module that an
        interpreter loads: its undefined symbols may be the interpreter's (the Python C API
        from python3.X or libpython; Perl's from libperl).  (None, {}) otherwise."""
        interpreter = _interpreter_for(path)
        if interpreter is None:
            return None, {}
        scope = self._hosts.get(interpreter)
        if scope is None:
            try:
                closure = self.resolver.closure(interpreter)
                scope = dict(closure.objects)
                for obj_path, info in scope.items():  # read now: one that does not parse leaves no scope
                    self.resolver.symbol_tables(obj_path, info)
            except (ELFError, OSError):
                scope = {}
            self._hosts[interpreter] = scope
        return interpreter, scope

    def _explain_missing(self, res) -> dict:
        """What is known about a NEEDED that nothing in the scan resolves."""
        why = practice.optional_plugin(res.requester)
        if why:
            return {"context": "optional-plugin", "reason": why}
        needed = self._needed_of(res.requester)
        known = practice.missing_context(res.requester, res.name, needed)
        if known:
            return known
        why = practice.driver_absent(res.name, self.resolver)
        if why:
            return {"context": "no-driver", "reason": why}
        private = self._private_loader(res.requester, res.name)
        if private is not None:
            return {"context": "private", "loader": private[0], "reason": private[1]}
        copies = practice.installed_copies(res.name, res.requester, self.tree_index)
        if not copies:
            hint = practice.preloader_hint(res.requester, res.name, needed)
            return {"where": hint} if hint else {}
        described = []
        for copy in copies:
            package = practice.package_of(copy)
            described.append(practice.short(copy) + (f" ({package})" if package else ""))
        return {"installed_at": copies, "package": practice.package_of(copies[0]) or "",
                "where": "; installed at " + ", ".join(described) + ", which is not on its loader path"}

    def _needed_of(self, path: str) -> tuple:
        """The NEEDED names of ``path`` (read before: the resolver keeps it), () if unreadable."""
        try:
            return tuple(self.resolver.read(path).needed)
        except (ELFError, OSError):
            return ()

    def _private_loader(self, requester: str, name: str):
        """(program, reason) when a program of the requester's Debian package, or of a
        package that depends on it, loads the requester and so resolves ``name``
        (systemd's /usr/lib/systemd/systemd and libsystemd-core, shipped by libsystemd-shared)."""
        key = (requester, name)
        if key in self._private:
            return self._private[key]
        self._private[key] = None
        package = practice.package_of(requester)
        try:
            soname = self.resolver.read(requester).soname or os.path.basename(requester)
        except (ELFError, OSError):
            return None
        if not package or practice.site_packages_of(requester):
            return None
        wanted = self.dedup.identity(requester)
        read = 0
        candidates = practice.dpkg_files_of(package)
        for dependent in practice.dpkg_dependents(package)[:20]:
            candidates += practice.dpkg_files_of(dependent)
        for candidate in candidates:
            if read >= 400 or not inputs.isfile(candidate) or candidate == requester:
                continue
            if candidate.startswith(("/usr/share/", "/etc/", "/usr/include/")):
                continue
            if _sniff(candidate) != "elf":
                continue
            read += 1
            try:
                info = self.resolver.read(candidate)
                if soname not in info.needed:
                    continue
                closure = self.resolver.closure(candidate)
            except (ELFError, OSError, RecursionError):
                continue
            for res in closure.resolutions:
                if res.name == name and res.path is not None and self.dedup.identity(res.requester) == wanted:
                    how = {"runpath": "its DT_RUNPATH", "rpath": "its DT_RPATH",
                           "loaded": "the copy it loads itself"}.get(res.source, res.source)
                    owner = practice.package_of(candidate) or package
                    reason = (f"{requester} is a private library of {candidate} (package {owner}), "
                              f"which finds {name} at {res.path} through {how}")
                    self._private[key] = (candidate, reason)
                    return self._private[key]
        return None

    def _torch_preload(self, path: str, result) -> tuple:
        """Torch's libraries, when a Python extension needs them and cannot find them itself.

        Extensions link -lc10 -ltorch without a RUNPATH: they only load in a Python that
        imported torch first, which put libtorch_python.so (and with it libtorch, libc10)
        in the process.  ld.so then satisfies the NEEDED by SONAME.  We model exactly that
        with the torch that imports it: --python's, else the one in its own environment,
        never the torch of seedance's own interpreter.  When there is
        none, the torch NEEDED names stand in as preloads that resolve nothing: whichever
        torch the user imports provides them, so they are no loader error, and a
        torch_env fact says the extension was not judged against a torch.
        """
        missing = {r.name for r in result.resolutions
                   if r.path is None and r.name.startswith(closure_facts.TORCH_LIB_PREFIXES)}
        if not missing:
            return ()
        torch_lib = self._torch_lib_near(path)
        if torch_lib is None:
            from . import torch_ext

            self.facts.append(torch_ext.torch_not_found_fact(path, missing))
            return tuple(sorted(missing))
        if not any(inputs.exists(os.path.join(torch_lib, n)) for n in missing):
            return ()
        for name in ("libtorch_python.so", "libtorch.so", "libc10.so"):
            candidate = os.path.join(torch_lib, name)
            if inputs.exists(candidate):
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
        torch = self._torch_for(path)
        return os.path.join(torch.path, "lib") if torch is not None else None

    def _torch_for(self, path: str):
        """The torch that imports the extension at ``path`` (--python's, else its own environment's)."""
        if self.python_torch is not None:
            return self.python_torch
        from . import torch_ext

        return torch_ext.torch_beside(path)

    def _fatbin(self, path: str) -> list:
        try:
            entries = read_elf(path, fatbin=True).fatbin
        except ELFError as exc:
            self.errors.append({"path": path, "error": str(exc)})
            return []
        return fatbin.fatbin_facts(path, entries, self.gpu.targets, driver=self.gpu.driver_version)

    def _cxx_abi(self, path: str, result, torch_paths) -> None:
        jobs = self._abi_jobs
        if jobs is None:
            self.facts.extend(self._cxx_abi_facts(path, result.objects, torch_paths))
            return
        job = (path, tuple(result.objects), tuple(torch_paths))
        self._abi_placed.append((len(self.facts), jobs.submit(job)))

    def _cxx_abi_job(self, job) -> list:
        """_cxx_abi_facts of one root sent to the helper as (root, its closure's paths in
        load order, torch's libraries among them): the objects are the resolver's reads of
        those paths, as the closure holds them, so the helper's answer is the loop's."""
        path, object_paths, torch_paths = job
        read, symbols = self.resolver.read, self.options.strict
        objects = {obj_path: read(obj_path, symbols=symbols) for obj_path in object_paths}
        return self._cxx_abi_facts(path, objects, list(torch_paths))

    def _cxx_abi_facts(self, path: str, objects: dict, torch_paths: list) -> list:
        """The cxx_abi and torch_symbols facts of one root, from its closure's objects."""
        torch = self._torch_for(path)
        torch_lib = os.path.join(torch.path, "lib") if torch is not None else None
        source = torch.source if torch_lib and any(os.path.dirname(p) == torch_lib for p in torch_paths) \
            else "found through its own library search path"
        return cxxabi.extension_facts(path, objects, torch_paths, self.torch_abi,
                                      self._torch_symbols, source, self._torch_exports)

    def _place_abi_facts(self) -> None:
        """The helper's facts, each job's where the loop would have added them (from the
        last, so the earlier places stay where they were)."""
        jobs, placed = self._abi_jobs, self._abi_placed
        if jobs is None:
            return
        self._abi_jobs, self._abi_placed = None, []
        results = jobs.finish()
        for index, ticket in reversed(placed):
            self.facts[index:index] = results[ticket]

    def _torch_symbols(self, path: str):
        """``path`` read with only its c10/at/torch/caffe2 symbols: building a Symbol for each
        of libtorch_cpu's and torch's test programs' other symbols (hundreds of thousands,
        none of which the C++ ABI check looks at) would be most of a site-packages check."""
        return self.resolver.read(path, symbols=cxxabi.TORCH_PREFIXES)

    def _torch_exports(self, path: str):
        """The c10/at/torch/caffe2 names ``path`` exports, from the C reader's raw symbols
        (None: the Python reader's Symbols are read instead)."""
        from ..elf import fastread

        if not fastread.enabled():
            return None
        return fastread.exported_names(path, cxxabi.TORCH_PREFIXES)

    def _process(self, pid: int, explicit: bool) -> None:
        from . import process

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
        if view.exe is None and not view.mappings:
            if explicit:
                raise BadInput(f"pid {pid}: a kernel thread: it maps no files to check")
            return  # a kernel thread: nothing to check, and it did not vanish
        self.stats["processes"] += 1
        if self.on_process is not None:
            self.on_process(view)
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


# A walk is shared with a helper (helper.share) when it has this many subtrees two levels
# down and cuts into this many pieces; a piece of files holds up to WALK_CHUNK of them.
WALK_SPLIT_MIN_SUBTREES = 128
# The C walk's threads (elf/treewalk.c) where a second core is free: the walk is system
# calls, and two threads halve it; more were not measured (2-core machines)
WALK_THREADS = 2
WALK_SPLIT_MIN_PIECES = 8
WALK_CHUNK = 256


class _WalkAcc:
    """What one piece of a walk found and counted, merged into the scan in walk order."""

    def __init__(self, sniffed):
        self.found: list = []  # (path, stat) of the ELF files
        self.stats: Counter = Counter()  # files, skipped, unreadable
        self.errors: list = []
        self.configs: list = []  # seedance/plugin YAML configs
        self.plain: list = []  # ELF paths the walk saw as regular files, not links
        self.sniffed = sniffed  # (dev, inode) -> 'elf' | 'other', shared by a process's pieces


# A check of a tree that holds a torch hands the C++ ABI check to a helper process
# (helper.py) from this many roots: fewer leave the helper little to overlap with.
HELPER_MIN_ROOTS = 64

# Python sources and bytecode and C/CUDA headers: files no loader maps, ~28,000 of the 33,500
# files of a site-packages with torch and /usr/local/cuda.  Opening each to read 4 bytes would
# be most of that walk (an open, a read and a close per file); they are counted as skipped
# without being opened.  Perl's sources (.pl, .pm, .ph), pkg-config, CMake and libtool files
# are text too: ~950 of the 2,736 files of /usr/lib/x86_64-linux-gnu (perl-base alone holds
# ~600).
NEVER_ELF_SUFFIXES = (".py", ".pyc", ".pyi", ".h", ".hpp", ".cuh", ".pl", ".pm", ".ph", ".pc",
                      ".cmake", ".la")


def _first(item):
    return item[0]


def _sniff(path: str):
    """'elf', 'other', or the OSError that stopped us reading it."""
    # os.open + os.read of 4 bytes: a buffered open() reads a whole buffer and builds a file
    # object per file.  O_NONBLOCK: a FIFO reached through a link must not block the walk.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        return exc
    try:
        return "elf" if os.read(fd, 4) == ELF_MAGIC else "other"
    except OSError as exc:
        return exc
    finally:
        os.close(fd)


# YAML files in a scanned directory that are seedance's or a plugin's own configs.  Other
# YAML (CI workflows, conda recipes) sets LD_LIBRARY_PATH from $PREFIX on purpose and is
# none of our business.
SEEDANCE_CONFIG_NAMES = {"agent.yaml", "shim.yaml", "manifest.yaml", "manifest.yml", "seedance.yaml",
                         "seedance.yml"}


def _is_seedance_config(path: str) -> bool:
    parts = os.path.abspath(path).split(os.sep)
    if "rules_data" in parts:  # seedance's own rule files, installed as package data
        return False
    if os.path.basename(path) in ("manifest.yaml", "manifest.yml") and "seedance" not in parts[:-1]:
        # a plugin manifest declares seedance_version; other projects' manifests are not ours
        try:
            with open(path, "rb") as handle:
                return b"seedance_version" in handle.read(1 << 16)
        except OSError:
            return False
    return os.path.basename(path) in SEEDANCE_CONFIG_NAMES or "seedance" in parts[:-1]


_PY_EXT = re.compile(r"\.cpython-3(\d+)[^/]*\.so$|\.abi3\.so$")


def _interpreter_for(path: str) -> str | None:
    """The interpreter that loads an extension module at ``path``, if it is one."""
    import sys

    match = _PY_EXT.search(path)
    if match:
        minor = match.group(1) or str(sys.version_info.minor)
        name = f"python3.{minor}"
        candidates = []
        site = practice.site_packages_of(path)
        if site is not None:  # <prefix>/lib/python3.X/site-packages -> <prefix>/bin
            candidates.append(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(site))), "bin", name))
        if f"3.{minor}" == f"{sys.version_info.major}.{sys.version_info.minor}":
            candidates.append(sys.executable)
        candidates += [f"/usr/bin/{name}", f"/usr/local/bin/{name}"]
        for candidate in candidates:
            real = inputs.realpath(candidate)
            if inputs.isfile(real) and _sniff(real) == "elf":
                return real
        return None
    site = practice.site_packages_of(path)
    if site is not None:
        # Everything under site-packages is loaded into that environment's Python: an
        # extension module without a tag (lief/_lief.so) and the libraries extensions link
        # (torch/lib/libtorch_python.so) alike.
        version = re.search(r"python3\.(\d+)", site)
        minor = version.group(1) if version else str(sys.version_info.minor)
        return _interpreter_for(os.path.join(site, f"_.cpython-3{minor}.so"))
    if os.sep + "auto" + os.sep in path and path.endswith(".so"):  # Perl XS: .../auto/Mod/Mod.so
        for candidate in ("/usr/bin/perl", "/usr/local/bin/perl"):
            if inputs.isfile(candidate):
                return inputs.realpath(candidate)
    return None


def _unique_roots(found, plain=frozenset()) -> list:
    """One path per file: a real file is preferred over the symlinks that point at it.
    ``plain``: paths the walk saw as regular files (their entry type said so), which are
    no links without asking lstat."""
    chosen: dict = {}
    for path, st in found:
        key = (st.st_dev, st.st_ino)
        current = chosen.get(key)
        if current is None or (current not in plain and inputs.islink(current)
                               and (path in plain or not inputs.islink(path))):
            chosen[key] = path
    return sorted(chosen.values())


def run_check(options: CheckOptions, progress=None) -> Report:
    return Scanner(options, progress).run()
