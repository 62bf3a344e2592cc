"""cuda-mismatch: retarget CUDA-family NEEDED entries to the runtime a closure really uses.

Flow (one way for data to travel): run the check over the roots -> take the findings about
CUDA-family NEEDED entries (unresolved, a lying SONAME, a missing version node, mixed
runtime majors) -> plan one RelinkAction per library -> refuse what the target cannot
satisfy -> rename NEEDED + .gnu.version_r (dynedit) -> verify the temp file (re-parse, the
intended edit, the resolver, dlopen in a child) -> rename into place -> check again.

Why a NEEDED rename is enough: CUDA libraries of one major share their ABI under the new
SONAME only for the entry points both majors define; that is exactly what the refusal check
verifies before anything is written (every symbol and version node the library binds to the
old runtime must be defined by the new one).
"""
from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field

from ..elf.reader import is_elf, read_elf
from ..model.errors import BadInput, ELFError, SeedanceError
from . import atomic, dynedit
from .dlopen_child import DlopenChild, dlopen_in_child  # noqa: F401 (verify's oracles, re-exported)
from .plan import RELINK_RULES, FixPlan, RelinkAction, dynamic_diff

FAMILY = re.compile(r"^lib(cudart|cublasLt|cublas|curand|cufftw|cufft|cusparse|cusolverMg|cusolver|"
                    r"nvrtc-builtins|nvrtc|nvJitLink|nvjpeg|npp[a-z]*|cupti)\.so(?:\.(\d+)[\d.]*)?$")
CUDART_NAMES = {11: "libcudart.so.11.0"}  # 11.x kept the minor in its SONAME; 12+ do not
KNOWN_MAJORS = (13, 12, 11)


# Where a CUDA runtime of each major comes from, for a refusal to name: the pip wheel (CUDA
# 13's is published without a -cuXX suffix, as nvidia-cuda-runtime 13.x) and NVIDIA's
# Debian/Ubuntu package (cuda-cudart-MAJOR-MINOR from its CUDA repository).
RUNTIME_WHEELS = {11: "nvidia-cuda-runtime-cu11", 12: "nvidia-cuda-runtime-cu12", 13: "nvidia-cuda-runtime==13.*"}

# families whose SONAME major is the CUDA major (libcufft.so.11 ships with CUDA 12: not these)
_MAJOR_IN_SONAME = ("cudart", "cublas", "cublasLt", "nvrtc", "nvJitLink")


def built_for_major(info) -> tuple:
    """(CUDA major, why) the library was built for, or (None, '') when it names none: the
    version nodes it needs from libcudart (libcudart.so.12, libcudart.so.11.0: the linker
    records the runtime's node of every symbol bound to it), else the runtime's NEEDED name,
    else a NEEDED of a library whose SONAME carries the CUDA major (libcublas.so.12)."""
    for need in info.version_needs:
        if family_of(need.file) != "cudart":
            continue
        for version, _weak in need.versions:
            match = FAMILY.match(version)
            if match and match.group(1) == "cudart" and match.group(2):
                return int(match.group(2)), f"it needs version {version} of {need.file}"
    for name in info.needed:
        match = FAMILY.match(name)
        if match and match.group(1) in _MAJOR_IN_SONAME and match.group(2):
            return int(match.group(2)), f"it needs {name}"
    return None, ""


def runtime_source(major: int) -> str:
    """Where to get a CUDA ``major`` runtime: the wheel and NVIDIA's Debian package."""
    wheel = RUNTIME_WHEELS.get(major, f"nvidia-cuda-runtime-cu{major}")
    pip = f"pip install '{wheel}'" if "=" in wheel else f"pip install {wheel}"
    return f"{pip}, or NVIDIA's package cuda-cudart-{major}-<minor> (apt)"


def family_of(name: str) -> str | None:
    match = FAMILY.match(os.path.basename(name or ""))
    return match.group(1) if match else None


def cudart_name(major: int) -> str:
    return CUDART_NAMES.get(major, f"libcudart.so.{major}")


def default_roots(environ=None, cwd=None) -> list:
    """/usr/lib, $CONDA_PREFIX/lib, ./build and the active Python's site-packages."""
    from ..collect.host import _site_dirs

    environ = os.environ if environ is None else environ
    roots = ["/usr/lib"]
    if environ.get("CONDA_PREFIX"):
        roots.append(os.path.join(environ["CONDA_PREFIX"], "lib"))
    roots.append(os.path.join(cwd or os.getcwd(), "build"))
    roots.extend(_site_dirs())
    return [r for r in dict.fromkeys(roots) if os.path.isdir(r)]


def process_major(pid: int) -> int:
    """The CUDA runtime major a running process really uses (the libcudart it maps)."""
    from ..collect import process

    try:
        view = process.read_process(pid)
    except process.ProcessGone:
        raise BadInput(f"pid {pid}: no such process (it may have exited)") from None
    facts = process.runtime_facts(view)
    majors = sorted({m for fact in facts for m in fact.data["majors"]})
    if not majors:
        raise BadInput(f"pid {pid}: maps no libcudart, so it names no runtime to align with; use --runtime")
    if len(majors) > 1:
        raise BadInput(f"pid {pid}: maps CUDA runtime majors {majors} at once; pick one with --runtime")
    return majors[0]


def cuda_major_of(path: str, info=None) -> int | None:
    """CUDA major of a CUDA-family library: what it declares first, then its neighbours."""
    from ..collect import cuda

    try:
        info = info or read_elf(path)
    except ELFError:
        return None
    family = family_of(info.soname or "") or family_of(path)
    if family == "cudart":
        return cuda.runtime_major(path, info)
    # libcublas.so.12 and libnvrtc.so.12 carry the CUDA major; libcurand.so.10 does not,
    # so ask the runtime shipped beside it (toolkit lib64/, or the wheel's lib/).
    if family in ("cublas", "cublasLt", "cusparse", "nvrtc", "nvJitLink") and info.soname:
        match = FAMILY.match(info.soname)
        if match and match.group(2):
            return int(match.group(2))
    directory = os.path.dirname(os.path.realpath(path))
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        if name.startswith("libcudart.so."):
            return cuda.runtime_major(os.path.join(directory, name))
    return None


class Relinker:
    """Plans and applies cuda-mismatch relinks over ``roots``."""

    def __init__(self, roots, runtime: str = "auto", env: dict | None = None, zygote=None):
        """``zygote``: a dlopen_child.DlopenZygote forked early by the command, which verify()
        uses where it is as faithful as a fresh process (else a DlopenChild is started)."""
        self.roots = list(roots)
        self.zygote = zygote
        self.runtime = None if runtime in (None, "auto") else int(runtime)
        self.env = dict(os.environ if env is None else env)
        from ..resolve import Resolver
        self._resolver = None  # the check's own, once check() ran (see resolver)
        self._Resolver = Resolver
        self._edits: dict = {}  # (path, renames, version renames) -> dynedit.FileEdit
        # root -> real paths of every object in its closure, as the check saw them (None
        # until a check ran): what the re-check after a fix needs to look at again
        self.closures: dict | None = None
        self._verifier = None  # a DlopenChild started ahead of the next verify()
        self._layouts: dict = {}  # path -> dynedit.MappedLayout, parsed once for plan and edit
        self.rechecked: list | None = None  # the roots recheck() checked again (None: all)
        self._identities: dict = {}  # real path -> atomic.file_identity() when the check read it
        # what NVML said at the first check: the checks after it reuse it (one probe a command)
        self.nvml = None

    # --- check ---------------------------------------------------------------------------------
    def check(self, progress=None):
        """The check over the roots; remembers each root's closure for recheck(), and plans
        with the check's own resolver afterwards (its reads and searches are cached: the
        plan walks the same closures again)."""
        from ..collect.scan import CheckOptions, Scanner

        real: dict = {}
        closures: dict = {}

        def seen(root, result, _runtimes) -> None:
            paths = set()
            for path in result.objects:
                if path not in real:
                    real[path] = os.path.realpath(path)
                    try:
                        self._identities[real[path]] = atomic.file_identity(os.stat(real[path]))
                    except OSError:
                        pass
                paths.add(real[path])
            closures[root] = frozenset(paths)

        scanner = Scanner(CheckOptions(targets=list(self.roots), env=self.env, nvml=self.nvml), progress)
        scanner.on_closure = seen
        report = scanner.run()
        if self.nvml is None:
            self.nvml = scanner.gpu
        self.closures = closures
        self._resolver = scanner.resolver
        return report

    @property
    def resolver(self):
        """The resolver plans are made with: the check's (its reads and searches cached), or
        a fresh one when no check ran in this Relinker."""
        if self._resolver is None:
            self._resolver = self._Resolver(env=self.env)
        return self._resolver

    def recheck(self, before: list, written) -> list:
        """The relevant findings once ``written`` (real paths) were rewritten: a check of the
        roots that load a rewritten file, or an object a finding of ``before`` is about that
        such a root loads (a finding about a shared object is judged from the first root that
        loads it, as in the full check), and ``before``'s findings about everything else,
        which nothing rewritten can change (a second full check of every root would double
        the fix for a one-library change).  Without a recorded check: a full check."""
        from ..collect.scan import CheckOptions, run_check

        self.rechecked = None
        if self.closures is None:
            return self.relevant(self._fresh().check().findings)
        # what each finding is about: its subject, and the files its evidence names (a
        # cuda-runtime-mixed finding stands for every root that mixes the same runtimes)
        about = [(os.path.realpath(f.subject["path"]), _evidence_paths(f.evidence))
                 for f in before if f.subject.get("path")]
        watch = {os.path.realpath(p) for p in written}
        roots: set = set()
        while True:
            more = {root for root, objects in self.closures.items() if root not in roots and objects & watch}
            if not more:
                break
            roots |= more
            touched = frozenset().union(*(self.closures[r] for r in roots))
            for subject, paths in about:
                if subject in touched:
                    watch.add(subject)
                    watch |= paths
        touched = frozenset().union(*(self.closures[r] for r in roots)) if roots else frozenset()
        kept = [f for f in before if not f.subject.get("path")
                or os.path.realpath(f.subject["path"]) not in touched]
        self.rechecked = sorted(roots)
        if not roots:
            return kept
        try:
            report = run_check(CheckOptions(targets=sorted(roots), env=self.env, nvml=self.nvml))
        except SeedanceError:  # a root gone or unreadable since: judge the roots as given
            self.rechecked = None
            return self.relevant(self._fresh().check().findings)
        return kept + self.relevant(report.findings)

    def _fresh(self) -> "Relinker":
        """A Relinker over the same roots with no check recorded (NVML's answer kept)."""
        fresh = Relinker(self.roots, runtime=str(self.runtime or "auto"), env=self.env)
        fresh.nvml = self.nvml
        return fresh

    @staticmethod
    def relevant(findings) -> list:
        """Findings about CUDA-family NEEDED entries, the only ones this fixer acts on."""
        out = []
        for finding in findings:
            if finding.rule not in RELINK_RULES:
                continue
            ev = finding.evidence
            if finding.rule in ("needed-unresolved", "needed-soname-mismatch") and not family_of(ev.get("name", "")):
                continue
            if finding.rule == "symbol-version-missing" and not family_of(ev.get("file", "")):
                continue
            out.append(finding)
        return out

    # --- plan ----------------------------------------------------------------------------------
    def plan(self, report) -> FixPlan:
        findings = self.relevant(report.findings)
        plan = FixPlan("cuda-mismatch", findings=findings, target_major=self.runtime,
                       target_source="--runtime" if self.runtime else "auto")
        wanted: dict = {}  # lib path -> {needed name: [finding messages]}
        majors: dict = {}  # lib path -> target major chosen for its closure
        crossings: dict = {}  # lib path -> MixedCrossing: a mixed closure's move it may not make unasked
        for finding in findings:
            subject = finding.subject.get("path")
            if not subject:
                continue
            if finding.rule == "cuda-runtime-mixed":
                self._plan_mixed(subject, finding, wanted, majors, crossings)
            elif finding.rule == "cuda-driver-too-old":
                if self.runtime is None:
                    plan.skipped.append((subject, "cuda-driver-too-old: give --runtime to pick the major "
                                                  "the driver supports"))
                    continue
                for name in self._cuda_needed(subject):
                    wanted.setdefault(subject, {}).setdefault(name, []).append(finding.message)
            else:
                name = finding.evidence.get("name") or finding.evidence.get("file")
                wanted.setdefault(subject, {}).setdefault(name, []).append(finding.message)
        for path in sorted(wanted):
            major = self.runtime or majors.get(path)
            built = None
            if major is None:
                # Unasked, a relink never leaves the major the library was built for: CUDA
                # runtimes are not ABI compatible across majors, and "the newest runtime that
                # resolves" is a guess about a library built against another.  --runtime N
                # (or --pid) crosses, when every symbol it binds exists in that runtime
                # (_missing).  A mixed closure is no exception (_plan_mixed): ``majors``
                # holds only moves onto the major the library was built for.
                try:
                    built, _why = built_for_major(read_elf(path))
                except ELFError:
                    built = None
                major = built or self._auto_major(path, set(wanted[path]))
            if major is None:
                plan.skipped.append((path, "no CUDA runtime major to retarget to: none resolves from it"))
                continue
            action = self._action(path, wanted[path], major, built_for=built)
            if action is not None:
                plan.actions.append(action)
        for path in sorted(crossings):
            plan.actions.append(self._crossing_refusal(crossings[path]))
        if plan.target_major is None and plan.actions:
            chosen = sorted({a.target_major for a in plan.actions})
            plan.target_major = chosen[0] if len(chosen) == 1 else None
            plan.target_source = "the runtime the closure uses"
        return plan

    def _cuda_needed(self, path: str) -> list:
        try:
            return [n for n in read_elf(path).needed if family_of(n)]
        except ELFError:
            return []

    def _plan_mixed(self, root: str, finding, wanted: dict, majors: dict, crossings: dict) -> None:
        """The libraries of ``root``'s closure that bind a runtime of another major than the
        target: --runtime's, else the one the root loads itself (else the most used one).
        Unasked, a library moves only when the target is the major it was built for; the
        others go to ``crossings``, to be refused with the command that would ask for it."""
        from ..collect.closure import closure_runtimes

        closure = self.resolver.closure(root)
        runtimes = closure_runtimes(closure)  # path -> (major, requester)
        by_path = {path: major for path, (major, _req) in runtimes.items()}
        major = self.runtime
        root_side = ""
        if major is None:
            direct = [(by_path[r.path], r) for r in closure.resolutions
                      if r.requester == root and r.path in by_path]
            if direct:
                major, res = direct[0]  # the root loads this runtime itself: the process uses it
                root_side = f"{root} needs CUDA {major} (it loads {res.name} => {res.path} itself)"
            else:
                users = Counter(by_path[r.path] for r in closure.resolutions if r.path in by_path)
                major = max(users, key=lambda m: (users[m], m))
                root_side = f"{root} needs CUDA {major} (most of its closure uses that runtime)"
        for res in closure.resolutions:
            if not family_of(res.name) or res.path is None:
                continue
            have = cuda_major_of(res.path, closure.objects.get(res.path))
            if have is None or have == major:
                continue
            if self.runtime is None:
                try:
                    built, why = built_for_major(closure.objects.get(res.requester) or read_elf(res.requester))
                except ELFError:
                    built, why = None, ""
                if built != major:
                    # CUDA runtimes are not ABI compatible across majors: which side of a
                    # mixed closure gives way is the user's call, made with --runtime
                    crossing = crossings.setdefault(res.requester, MixedCrossing(
                        res.requester, root, major, root_side, built, why))
                    if crossing.root == root:
                        crossing.uses.setdefault(res.name, (have, res.path))
                        crossing.names.setdefault(res.name, []).append(finding.message)
                    continue
            wanted.setdefault(res.requester, {}).setdefault(res.name, []).append(finding.message)
            majors[res.requester] = major

    def _crossing_refusal(self, crossing: "MixedCrossing") -> RelinkAction:
        """The refusal of a move across majors that only --runtime may ask for, in one line:
        what each side of the mixed closure needs, and the command that asks for the move
        when every symbol the library takes from its runtime exists in the other major
        (else the symbol or version that is missing there)."""
        import shlex

        path, major = crossing.path, crossing.major
        if crossing.built is not None:
            side = f"{path} needs CUDA {crossing.built} ({crossing.why})"
        else:
            loads = ", ".join(f"{name} => {where} (CUDA {have})" for name, (have, where) in crossing.uses.items())
            side = f"{path} loads {loads} and nothing in it says which CUDA major it was built for"
        reason = (f"{crossing.root_side}, {side}; unasked, a library is relinked only to the CUDA major "
                  f"it was built for")
        command = f"seedance fix cuda-mismatch --auto-relink --runtime {major} {shlex.quote(crossing.root)}"
        probe = self._action(path, crossing.names, major)
        if probe is not None and probe.refusal:
            reason += f"; `{command}` would be refused too: {probe.refusal}"
        elif probe is not None:
            targets = ", ".join(f"{name} => {target}" for name, target in probe.targets.items())
            reason += (f"; every symbol it takes from {', '.join(probe.renames)} exists in CUDA {major} "
                       f"({targets}): to move it there, run: {command}")
        return RelinkAction(path=path, renames={}, version_renames={}, target_major=major, targets={},
                            findings=sorted({m for msgs in crossing.names.values() for m in msgs}),
                            refusal=reason)

    def _auto_major(self, path: str, broken: set) -> int | None:
        """The runtime the rest of the closure uses; else the newest that resolves genuinely."""
        from ..collect.closure import closure_runtimes

        try:
            closure = self.resolver.closure(path)
        except SeedanceError:
            return None
        via_broken = {r.path for r in closure.resolutions if r.requester == path and r.name in broken}
        others = Counter(major for p, (major, _r) in closure_runtimes(closure).items() if p not in via_broken)
        if others:
            return max(others, key=lambda m: (others[m], m))
        for major in KNOWN_MAJORS:
            res = self.resolver.explain(cudart_name(major), path)
            if res.path is not None and res.soname == cudart_name(major):
                return major
        return None

    def _action(self, path: str, names: dict, major: int, built_for: int | None = None) -> RelinkAction | None:
        """``built_for``: the major the library was built for when that chose ``major`` (no
        --runtime): a refusal then says where a runtime of that major comes from."""
        action = RelinkAction(path=path, renames={}, version_renames={}, target_major=major, targets={},
                              findings=sorted({m for msgs in names.values() for m in msgs}))
        try:
            # the file as planned from: the fix refuses to write if another run replaced it since
            action.identity = atomic.file_identity(os.stat(path))
            info = read_elf(path)
            undefined = None  # read on first need: (name, version, weak) of what it binds elsewhere
        except (ELFError, OSError) as exc:
            action.refusal = str(exc) if isinstance(exc, ELFError) else f"{path}: {exc.strerror}"
            return action
        # the plan walks the check's cached closures: a file rewritten since (by a concurrent
        # fix) would be planned from what it was.  Its identity then differs from the one
        # seen after the check, or (rewritten while the check ran) what the check read of it
        # (the resolver's cached parse) differs from the file now
        seen = self._identities.get(os.path.realpath(path))
        try:
            checked = self.resolver.read(path)
        except ELFError:
            checked = info
        if (seen is not None and seen != action.identity) or \
                (checked.needed, checked.version_needs) != (info.needed, info.version_needs):
            raise BadInput(f"{path}: changed since this fix planned its edit (another fix ran?); not rewritten")
        problems = []
        for name in names:
            family = family_of(name)
            if name not in info.needed:
                continue
            target_name, target_path, why = self._target_for(path, family, major)
            if target_path is None:
                problems.append(why + self._built_for_note(path, info, major, built_for))
                continue
            if target_name == name:
                res = self.resolver.explain(name, path)
                if res.path is not None and os.path.realpath(res.path) == os.path.realpath(target_path):
                    continue  # already right
                problems.append(f"{name} already names the CUDA {major} runtime but resolves to "
                                f"{res.path or 'nothing'}; a rename cannot fix that"
                                + self._built_for_note(path, info, major, built_for))
                continue
            action.renames[name] = target_name
            action.targets[target_name] = target_path
            action.version_renames.update(self._version_map(info, name, family, target_path))
            if undefined is None:
                try:
                    undefined = dynedit.undefined_symbols(path, self._mapped(path))
                except ELFError as exc:
                    problems.append(str(exc))
                    continue
            missing = self._missing(info, name, action.version_renames, target_path, undefined)
            if missing:
                problems.append(missing)
        if problems:
            action.refusal = "; ".join(problems)
        if not action.renames and not action.refusal:
            return None
        return action

    def _built_for_note(self, path: str, info, major: int, built_for: int | None) -> str:
        """What a refusal adds when the library's own major chose the target: why that major,
        a copy of that runtime on this host that does not resolve from it, where to get one,
        and that crossing to another major is --runtime's to ask."""
        if built_for is None or built_for != major:
            return ""
        _major, why = built_for_major(info)
        note = f"; it was built for CUDA {major} ({why})"
        from ..collect.host import cuda_library_dirs

        name = cudart_name(major)
        for directory in cuda_library_dirs():
            candidate = os.path.join(directory, name)
            try:
                if os.path.isfile(candidate) and read_elf(candidate).soname == name:
                    note += (f"; {candidate} is one, not on its search path (add {directory} to its "
                             f"RUNPATH or to LD_LIBRARY_PATH)")
                    break
            except ELFError:
                continue
        return (note + f"; install a CUDA {major} runtime where it resolves ({runtime_source(major)}), or "
                f"relink to another major with --runtime N, which checks that every symbol it takes from "
                f"libcudart exists there")

    def _target_for(self, requester: str, family: str, major: int) -> tuple:
        """(new NEEDED name, the file it resolves to, why not) for ``family`` at ``major``."""
        from ..collect.host import cuda_library_dirs

        if family == "cudart":
            names = [cudart_name(major)]
        else:
            names = []
            cudart = self.resolver.explain(cudart_name(major), requester)
            dirs = ([os.path.dirname(cudart.path)] if cudart.path else []) + cuda_library_dirs()
            for directory in dict.fromkeys(dirs):
                for entry in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
                    if family_of(entry) == family and not entry.endswith(".so"):
                        full = os.path.join(directory, entry)
                        try:
                            info = read_elf(full)
                        except ELFError:
                            continue
                        if info.soname and family_of(info.soname) == family and \
                                cuda_major_of(full, info) == major and info.soname not in names:
                            names.append(info.soname)
        for name in names:
            res = self.resolver.explain(name, requester)
            if res.path is not None and res.soname in (name, None):
                return name, res.path, ""
        if names:
            return None, None, (f"lib{family} for CUDA {major} ({names[0]}) does not resolve from {requester} "
                                f"(not on its RPATH/RUNPATH, LD_LIBRARY_PATH or in ld.so.cache)")
        return None, None, f"no lib{family} for CUDA {major} found on this host"

    def _version_map(self, info, old_name: str, family: str, target_path: str) -> dict:
        """Version nodes named after the old library (libcudart.so.12) -> the target's own."""
        try:
            target = self.resolver.read(target_path)  # the check's parse, cached by identity
        except (ELFError, OSError):
            return {}
        mapping = {}
        own = [v for v in target.version_defs if family_of(v) == family]
        for need in info.version_needs:
            if need.file != old_name:
                continue
            for version, _weak in need.versions:
                if version in target.version_defs or not own:
                    continue
                if family_of(version) == family:
                    mapping[version] = own[0] if len(own) == 1 else (
                        target.soname if target.soname in own else own[0])
        return mapping

    def _missing(self, info, old_name: str, version_renames: dict, target_path: str, undefined: list) -> str:
        """The symbol or version the library needs and the target lacks, naming both.

        ``undefined``: dynedit.undefined_symbols() of the library, (name, version, weak)."""
        try:
            # the check's own parse (its version checks read the runtimes' symbols), cached by
            # (dev, inode, mtime, size): libcudart's symbols are not read a second time
            target = self.resolver.read(target_path, symbols=True)
        except ELFError as exc:
            return str(exc)
        except OSError as exc:
            return f"{target_path}: {exc.strerror}"
        versions = set()
        for need in info.version_needs:
            if need.file == old_name:
                for version, weak in need.versions:
                    new = version_renames.get(version, version)
                    versions.add(version)
                    if target.version_defs and new not in target.version_defs and not weak:
                        return (f"{info.path} requires version {new} ({old_name} {version}), "
                                f"which {target_path} does not define")
        defined = target.defined_symbols()
        old_provider = self.resolver.explain(old_name, info.path).path
        old_defined = {}
        if old_provider:
            try:
                old_defined = self.resolver.read(old_provider, symbols=True).defined_symbols()
            except (ELFError, OSError):
                old_defined = {}
        prefixes = {"cudart": ("cuda", "__cuda")}.get(family_of(old_name), (f"{family_of(old_name)}",))
        for name, version, weak in undefined:
            if weak:
                continue
            bound_here = (version in versions) or (
                version is None and (name in old_defined or
                                     (not old_provider and name.startswith(prefixes))))
            if not bound_here:
                continue
            want = version_renames.get(version, version)
            have = defined.get(name)
            if have is None or (want is not None and target.version_defs and want not in have
                                and None not in have):
                label = f"{name}@{want}" if want else name
                return f"{info.path} needs symbol {label}, which {target_path} does not define"
        return ""

    # --- apply ---------------------------------------------------------------------------------
    def start_verifier(self) -> None:
        """Start the dlopen child of the next verify() now, so its start-up overlaps the write
        (a zygote that serves this environment needs no start)."""
        if self._verifier is None and not (self.zygote is not None and self.zygote.usable_for(self.env)):
            self._verifier = DlopenChild(self.env)

    def _mapped(self, path: str):
        if path not in self._layouts:
            self._layouts[path] = dynedit.MappedLayout(path)
        return self._layouts[path]

    def drop_mappings(self) -> None:
        """Unmap the libraries the plan read.  Before any pre-flight check: a library mapped
        by a process is refused as busy by every other fixer (atomic.MappedIndex), so a
        mapping kept through the fix made concurrent fixes of one library all refuse."""
        for mapped in self._layouts.values():
            mapped.close()
        self._layouts.clear()

    def close(self) -> None:
        """End the waiting dlopen child and the zygote, and drop the mappings."""
        if self._verifier is not None:
            self._verifier.close()
            self._verifier = None
        if self.zygote is not None:
            self.zygote.close()
        self.drop_mappings()

    def edit(self, action: RelinkAction) -> dynedit.FileEdit:
        """Plan the byte edit (in place when it fits, LIEF otherwise); fills strategy/growth.

        The preview and the fix share one plan while the file is the one planned from
        (a large library's dynamic symbol table is parsed once, not once for each)."""
        key = (action.path, tuple(sorted(action.renames.items())), tuple(sorted(action.version_renames.items())))
        cached = self._edits.get(key)
        try:
            current = atomic.file_identity(os.stat(action.path))
        except OSError:
            current = None
        if cached is not None and cached.identity == current:
            edit = cached
        else:
            edit = dynedit.plan_file(action.path, action.renames, action.version_renames,
                                     mapped=self._layouts.get(action.path))
            self._edits[key] = edit
        action.strategy, action.growth, action.changes = edit.strategy, edit.growth, edit.changes
        return edit

    def preview(self, action: RelinkAction) -> list:
        """The dynamic-entry diff of the edit, parsed from a private copy-on-write mapping with
        the patches applied: nothing is written (a scratch copy of a CUDA library of hundreds
        of MB would cost more than patchelf's whole run)."""
        edit = self.edit(action)
        return dynamic_diff(read_elf(action.path), edit.result_info())

    def verify(self, action: RelinkAction, temp: str) -> None:
        """Re-parse, check the intended edit, resolve again, dlopen in a child process.  The
        child has the path first and loads it while the rest is checked here."""
        zygote = self.zygote if self.zygote is not None and self.zygote.usable_for(self.env) else None
        if zygote is not None:
            child = zygote
        else:
            child, self._verifier = self._verifier, None
            child = child or DlopenChild(self.env)
        child.send(temp)
        try:
            closure = self._verify_static(action, temp)
        except BaseException:
            child.kill()
            raise
        error = child.result()
        if zygote is not None:
            shadowed = zygote.shadowed((r.name, r.path) for r in closure.resolutions)
            if shadowed:  # the zygote holds a library under a name the file needs: ask a fresh process
                error = dlopen_in_child(temp, self.env)
        if error:
            original_error = dlopen_in_child(action.path, self.env)
            names = set(action.renames) | set(action.renames.values()) | set(action.version_renames.values())
            if not original_error or any(n in error for n in names):
                raise BadInput(f"dlopen in a child process failed: {error}")

    def _verify_static(self, action: RelinkAction, temp: str):
        """The static checks of verify(); returns the temp file's closure."""
        info = read_elf(temp)
        for old, new in action.renames.items():
            if new not in info.needed or old in info.needed:
                raise BadInput(f"NEEDED is {list(info.needed)}, expected {new} instead of {old}")
            files = {n.file: n for n in info.version_needs}
            if old in files:
                raise BadInput(f".gnu.version_r still names {old}")
            for version, _weak in files.get(new, type("N", (), {"versions": ()})).versions:
                if version in action.version_renames:
                    raise BadInput(f".gnu.version_r still requires {version}")
        resolver = self._Resolver(env=self.env)
        closure = resolver.closure(temp)
        for res in closure.resolutions:
            if res.requester != temp or res.name not in action.targets:
                continue
            if res.path is None:
                raise BadInput(f"{res.name} does not resolve after the edit")
            if os.path.realpath(res.path) != os.path.realpath(action.targets[res.name]):
                raise BadInput(f"{res.name} resolves to {res.path}, not {action.targets[res.name]}")
        for check in closure.version_checks:
            if check.requester == temp and not check.defined and not check.weak:
                raise BadInput(f"version {check.version} is not defined by {check.provider}")
        return closure


@dataclass
class MixedCrossing:
    """A library in a mixed closure (``root``'s) that only --runtime may move to ``major``:
    ``root_side`` says why the root needs that major, ``built``/``why`` the major the library
    was built for and what says so (None, '': nothing), ``uses`` its NEEDED -> (major, path)
    of the runtime it loads now, ``names`` its NEEDED -> the messages of the findings."""

    path: str
    root: str
    major: int
    root_side: str
    built: int | None
    why: str
    uses: dict = field(default_factory=dict)
    names: dict = field(default_factory=dict)


def _evidence_paths(evidence) -> set:
    """Real paths of the absolute file names in a finding's evidence (strings and lists)."""
    found = set()
    for value in (evidence or {}).values():
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, str) and item.startswith("/"):
                found.add(os.path.realpath(item))
    return found


def require_elf(paths) -> None:
    """An explicit file that is not ELF is bad input: refuse it before scanning anything."""
    for path in paths:
        if os.path.isfile(path) and not is_elf(path):
            raise BadInput(f"{path}: not an ELF file; cuda-mismatch relinks shared libraries only")
        if not os.path.exists(path):
            raise BadInput(f"{path}: no such file or directory")
