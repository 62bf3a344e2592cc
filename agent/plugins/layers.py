"""The seven-layer install-time check of the notes (chapter 3), reinterpreted for GPU plugins.

  L1 kernel/driver  nvidia kernel module against NVML's user-space driver
  L2 libc           GLIBC_* version nodes the plugin's libraries need against this glibc
  L3 C++ runtime    GLIBCXX_*/CXXABI_* nodes against this libstdc++; the cxx11 string ABI
  L4 CUDA           runtime major (manifest and NEEDED libcudart) against the driver
  L5 GPU arch       fatbin SASS/PTX against the device (NVML), --force-arch, or cuda.archs
  L6 framework      torch version against framework.torch; extension ABI against torch
  L7 manifest       schema, ranges, affinity, batch policy, dependencies, entry libraries

Collectors here only observe and emit Facts (existing kinds where one exists: fatbin,
cuda_runtimes, cxx_abi); rules/*.yaml judge, exactly as for `seedance check`.  Output lines
read `ERROR L5: ...` / `FATAL L7: ...`, with an INFO line for each layer that found nothing.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from ..model.errors import BadInput, ELFError
from ..model.report import Fact, Report
from . import archive, host as gpu_host
from .manifest import MANIFEST_NAME, Manifest, load_manifest, parse_range
from .store import Store, version_key
from .verify import manifest_facts, subject

LAYERS = ("L1", "L2", "L3", "L4", "L5", "L6", "L7")
SOURCE = "seedance.plugins.layers"
LIB_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")
CXX_FAMILIES = ("GLIBCXX", "CXXABI")


@dataclass
class PluginCheck:
    manifest: Manifest | None
    facts: list = field(default_factory=list)
    findings: list = field(default_factory=list)
    lines: list = field(default_factory=list)
    notes: dict = field(default_factory=dict)  # layer -> INFO text when the layer is clean


def run_layers(name_or_path, strict: bool, force_arch: str | None = None, *, store: Store | None = None,
               sources=None, check_deps: bool = True, command: str = "check --plugin"):
    """Seven-layer check of an installed plugin (NAME, NAME-vVERSION) or a plugin source
    (directory, .tar.gz, wheel).  Returns (Report, lines)."""
    store = store or Store()
    report = Report(command=command, host=host_summary())
    result = check_target(str(name_or_path), strict, force_arch, store=store, sources=sources,
                          check_deps=check_deps)
    report.add(result.findings)
    report.stats = {"plugins": 1, "facts": len(result.facts), "findings": len(report.findings)}
    report.extra = {"plugins": [plugin_summary(result)]}
    return report, result.lines


def plugin_summary(result: PluginCheck) -> dict:
    manifest = result.manifest
    return {"name": manifest.name if manifest else None,
            "version": manifest.version if manifest else None,
            "path": str(manifest.root) if manifest else None,
            "layers": result.lines}


def host_summary() -> dict:
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        glibc = None
    gpu = gpu_host.probe()
    return {"hostname": socket.gethostname(), "glibc": glibc, "gpus": gpu.device_count,
            "gpu_source": gpu.device_source, "driver": gpu.driver_version}


def check_target(target: str, strict: bool, force_arch: str | None, *, store: Store,
                 sources=None, check_deps: bool = True) -> PluginCheck:
    path = Path(target)
    if archive.kind_of(path) in ("tar", "wheel", "zip"):
        with tempfile.TemporaryDirectory(prefix="seedance-check-") as tmp:
            try:
                root = archive.extract(path, Path(tmp))
            except BadInput as exc:
                return _invalid(str(exc), target)
            return check_root(root, strict, force_arch, store=store, sources=sources, check_deps=check_deps)
    if path.is_dir():
        return check_root(path, strict, force_arch, store=store, sources=sources, check_deps=check_deps)
    name, version = archive.split_request(target)
    plugin = store.get(name, version)  # BadInput when not installed: one line, exit 2
    force_arch = force_arch or plugin.record.get("force_arch")  # pinned at install time
    return check_root(plugin.path, strict, force_arch, store=store, sources=sources,
                      check_deps=check_deps, installed=True)


def check_root(root: Path, strict: bool, force_arch: str | None, *, store: Store, sources=None,
               check_deps: bool = True, installed: bool = False) -> PluginCheck:
    """All seven layers over the plugin directory ``root``."""
    from ..judge.engine import load_rules
    from .resolve import active_picks, resolve_dependencies

    try:
        manifest = load_manifest(Path(root) / MANIFEST_NAME)
    except BadInput as exc:
        return _invalid(str(exc), str(root))
    sources = archive.scan_sources(archive.source_dirs()) if sources is None else sources
    gpu = gpu_host.probe()
    result = PluginCheck(manifest)
    libraries = plugin_libraries(manifest)
    elves = {}
    for lib in libraries:
        elves[lib] = _read(lib)

    # L1 kernel/driver
    result.facts.append(driver_fact(manifest, gpu))
    result.notes["L1"] = (f"nvidia kernel module {gpu.module_version} ({gpu.module_source}), "
                          f"NVML driver {gpu.driver_version or 'not observed: ' + gpu.nvml_error}"
                          if gpu.module_version or gpu.nvml_ok else
                          f"no GPU driver observed: {gpu.module_source}; {gpu.device_source}")

    # L2 libc / L3 C++ runtime
    needs = symbol_version_facts(manifest, elves)
    result.facts.extend(needs)
    glibc = [f for f in needs if f.data["family"] == "GLIBC"]
    cxx = [f for f in needs if f.data["family"] != "GLIBC"]
    result.notes["L2"] = (f"{len(glibc)} GLIBC version node(s) needed, all defined by "
                          f"{_providers(glibc) or 'the host libc'}" if glibc else
                          "no GLIBC version nodes needed" if elves else "no shared libraries")
    abi_facts, abi_note = cxx_abi_facts(manifest, elves)
    result.facts.extend(abi_facts)
    result.notes["L3"] = ((f"{len(cxx)} GLIBCXX/CXXABI node(s) needed, all defined by {_providers(cxx)}"
                           if cxx else "no C++ runtime version nodes needed") + f"; {abi_note}")

    # L4 CUDA
    cuda_facts, cuda_note = cuda_runtime_facts(manifest, elves, gpu)
    result.facts.extend(cuda_facts)
    result.notes["L4"] = cuda_note

    # L5 GPU arch
    arch_facts, arch_note = fatbin_facts(manifest, elves, gpu, force_arch)
    result.facts.extend(arch_facts)
    result.notes["L5"] = arch_note

    # L6 framework
    fw_fact, fw_note = framework_fact(manifest)
    if fw_fact is not None:
        result.facts.append(fw_fact)
    result.notes["L6"] = fw_note

    # L7 manifest
    for lib, info in elves.items():
        result.facts.append(entry_fact(manifest, lib, info))
    if check_deps and manifest.depends:
        picks = (active_picks(manifest, store, sources) if installed
                 else resolve_dependencies(manifest, store, sources))
    else:
        picks = [] if check_deps else None
    result.facts.extend(manifest_facts(manifest, gpu, strict, picks))
    ranges = ", ".join(f"{k} {v}" for k, v in [("seedance", manifest.seedance_version),
                                                  *sorted(manifest.depends.items())])
    result.notes["L7"] = (f"manifest valid; ranges {ranges}; affinity {manifest.device_affinity or 'unset'}; "
                          f"batch_policy {manifest.batch.policy or 'missing'}"
                          + ("" if check_deps or not manifest.depends else "; dependencies not checked (--no-deps)"))
    for pick in [p for p in picks or () if p.version]:  # unresolved ones are L7 errors
        result.notes.setdefault("picks", []).append(pick.explanation)

    result.findings = load_rules().evaluate(result.facts, strict=strict)
    result.lines = render_lines(result)
    return result


def _invalid(error: str, where: str) -> PluginCheck:
    from ..judge.engine import load_rules

    fact = Fact("plugin_manifest", {"plugin": Path(where).name, "path": where},
                {"valid": False, "error": error}, SOURCE)
    result = PluginCheck(None, [fact])
    result.findings = load_rules().evaluate([fact])
    result.lines = [f"{f.severity.upper()} {f.layer}: {f.message}" for f in result.findings]
    return result


def render_lines(result: PluginCheck) -> list:
    lines = []
    for layer in LAYERS:
        found = sorted((f for f in result.findings if f.layer == layer), key=lambda f: -f.rank)
        for finding in found:
            lines.append(f"{finding.severity.upper()} {layer}: {finding.message}")
        if not found:
            lines.append(f"INFO {layer}: {result.notes.get(layer, 'nothing to check')}")
    for text in result.notes.get("picks", []):
        lines.append(f"INFO L7: pick {text}")
    return lines


# -- libraries ------------------------------------------------------------------------------
def plugin_libraries(manifest: Manifest) -> list:
    """entry.libraries first, then any other shared object shipped in the plugin."""
    root = manifest.root
    libs = [str(root / rel) for rel in manifest.libraries]
    for dirpath, _dirs, files in os.walk(root):
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            if re.search(r"\.so(\.\d+)*$", name) and path not in libs and not os.path.islink(path):
                libs.append(path)
    return libs


def _read(path: str):
    from ..elf.reader import is_elf, read_elf

    if not os.path.exists(path):
        return None
    if not is_elf(path):
        return "not-elf"
    try:
        return read_elf(path, symbols=True, fatbin=True)
    except ELFError as exc:
        return f"malformed: {exc}"


def driver_fact(manifest: Manifest, gpu) -> Fact:
    """L1: the loaded kernel module's version against NVML's, as ``gpu_host.probe()`` saw them
    ('' for a side not observed: the rule judges only when both are known)."""
    return Fact("plugin_driver", subject(manifest), {
        "module_version": gpu.module_version or "", "module_source": gpu.module_source,
        "nvml_version": gpu.driver_version or "", "nvml_error": gpu.nvml_error}, SOURCE)


def entry_fact(manifest: Manifest, lib: str, info) -> Fact:
    rel = os.path.relpath(lib, manifest.root)
    problem = ("is missing" if info is None else "is not an ELF object" if info == "not-elf"
               else f"is {info}" if isinstance(info, str) else "")
    return Fact("plugin_entry", {**subject(manifest), "path": lib}, {
        "library": rel, "exists": info is not None,
        "is_elf": info is not None and not isinstance(info, str), "problem": problem}, SOURCE)


def _good(elves: dict) -> dict:
    return {lib: info for lib, info in elves.items() if info is not None and not isinstance(info, str)}


# -- L2 / L3 --------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _ldconfig_cache() -> dict:
    """soname -> path from the ld.so cache (x86-64 entries), the loader's first stop after
    RPATH/LD_LIBRARY_PATH/RUNPATH for system libraries like libc and libstdc++."""
    out: dict = {}
    for exe in ("/sbin/ldconfig", "/usr/sbin/ldconfig"):
        if not os.path.exists(exe):
            continue
        try:
            text = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        for line in text.splitlines():
            match = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)", line)
            if match and ("x86-64" in match.group(2) or "64" in match.group(2)):
                out.setdefault(match.group(1), match.group(3))
        break
    return out


def provider_path(soname: str, lib_path: str, info) -> str | None:
    """Where ld.so would find ``soname`` for this library: the check's resolver
    (seedance.resolve) when it imports, else RPATH/RUNPATH, the ld.so cache and default dirs."""
    resolver = _check_resolver()
    if resolver is not None:
        try:
            resolution = resolver.explain(soname, lib_path)
            if resolution.path:
                return resolution.path
        except Exception:  # noqa: BLE001 - a young resolver must not break install
            pass  # fall through to what ld.so does for system libraries
    origin = os.path.dirname(lib_path)
    for entry in (*info.rpath, *info.runpath):
        for part in str(entry).split(":"):
            candidate = os.path.join(part.replace("$ORIGIN", origin).replace("${ORIGIN}", origin), soname)
            if part and os.path.exists(candidate):
                return candidate
    if soname in _ldconfig_cache():
        return _ldconfig_cache()[soname]
    for directory in LIB_DIRS:
        candidate = os.path.join(directory, soname)
        if os.path.exists(candidate):
            return candidate
    return None


@lru_cache(maxsize=1)
def _check_resolver():
    """The check's ld.so-faithful resolver (seedance.resolve), when it is installed."""
    try:
        from ..resolve import Resolver
        return Resolver()
    except Exception:  # ImportError while it is being built, or any start-up failure
        return None


@lru_cache(maxsize=64)
def _version_defs(path: str) -> tuple:
    from ..elf.reader import read_elf
    try:
        return tuple(read_elf(path).version_defs)
    except (ELFError, OSError):
        return ()


def _family(version: str) -> str:
    return version.split("_", 1)[0]


def _version_tuple(version: str) -> tuple:
    return tuple(int(p) for p in re.findall(r"\d+", version.split("_", 1)[-1]))


def symbol_version_facts(manifest: Manifest, elves: dict) -> list:
    facts = []
    for lib, info in _good(elves).items():
        for need in info.version_needs:
            for version, _weak in need.versions:
                family = _family(version)
                if family not in ("GLIBC", *CXX_FAMILIES):
                    continue  # other libraries' nodes (libcudart's ...) are the check's business
                provider = provider_path(need.file, lib, info)
                defs = _version_defs(provider) if provider else ()
                same = sorted((d for d in defs if _family(d) == family), key=_version_tuple)
                facts.append(Fact("plugin_symver", {**subject(manifest), "path": lib}, {
                    "file": need.file, "node": version, "family": family,
                    "provider": provider or f"{need.file} (not found)", "defined": version in defs,
                    "provider_versions": len(defs), "newest_here": same[-1] if same else "none"}, SOURCE))
    return facts


def _providers(facts) -> str:
    return ", ".join(sorted({f.data["provider"] for f in facts}))


# cxx11 ABI: std::string mangles as NSt7__cxx1112basic_string... with the new ABI and as Ss
# (or NSs) with the old; a symbol from one never binds to an import from the other.
def cxx_abi_facts(manifest: Manifest, elves: dict) -> tuple:
    # The same std::string mangling test and torch lookup as `seedance check` (collect/).
    from ..collect.cxxabi import abi_of
    from ..collect.torch_ext import find_torch
    from ..elf.reader import read_elf

    facts, notes = [], []
    torch = None
    for lib, info in _good(elves).items():
        uses_torch = [n for n in info.needed if n.startswith(("libc10", "libtorch"))]
        ext_abi, example = abi_of(s.name for s in info.symbols if not s.defined)
        if not uses_torch:
            if ext_abi:
                notes.append(f"{os.path.basename(lib)} uses the {ext_abi} std::string ABI")
            continue
        if ext_abi is None:
            notes.append(f"{os.path.basename(lib)} links torch without std::string in its interface")
            continue
        torch = torch or find_torch()
        torch_path = os.path.join(torch.path, "lib", "libc10.so") if torch else None
        if not torch_path or not os.path.exists(torch_path):
            notes.append(f"{os.path.basename(lib)} links torch, which is not installed here")
            continue
        torch_abi, _ = abi_of(s.name for s in read_elf(torch_path, symbols=True).symbols if s.defined)
        if torch_abi is None:
            notes.append(f"{os.path.basename(lib)}: torch's ABI could not be read from {torch_path}")
            continue
        facts.append(Fact("cxx_abi", {**subject(manifest), "path": lib}, {
            "ext_abi": ext_abi, "torch_abi": torch_abi, "torch_path": torch_path,
            "example_symbol": example}, SOURCE))
        notes.append(f"{os.path.basename(lib)} {ext_abi} ABI against torch {torch_abi}")
    return facts, ("; ".join(notes) if notes else "no std::string ABI dependence observed")


# -- L4 -------------------------------------------------------------------------------------
def cuda_runtime_facts(manifest: Manifest, elves: dict, gpu) -> tuple:
    linked = {}
    for lib, info in _good(elves).items():
        for name in info.needed:
            match = re.match(r"libcudart\.so\.(\d+)", name)
            if match:
                linked.setdefault(int(match.group(1)), lib)
    declared = manifest.cuda_runtime or 0
    if not declared and not linked:
        return [], "no CUDA runtime declared or linked"
    facts = []
    if len(linked) > 1:
        facts.append(Fact("cuda_runtimes", {**subject(manifest), "path": str(manifest.root)},
                          {"majors": sorted(linked), "paths": [linked[m] for m in sorted(linked)],
                           "via": "NEEDED"}, SOURCE))
    linked_major = min(linked) if linked else 0
    linked_path = linked.get(linked_major, "")
    for major, path in sorted(linked.items()):
        if declared and major != declared:
            linked_major, linked_path = major, path
    runtime = declared or max(linked)
    driver_max = gpu.cuda_driver_major
    facts.append(Fact("plugin_cuda", subject(manifest), {
        "runtime_major": runtime, "runtime_source": "manifest cuda.runtime" if declared else "NEEDED",
        "declared_major": declared, "linked_major": linked_major, "linked_path": linked_path,
        "driver_observed": driver_max is not None, "driver_max_major": driver_max or 0,
        "driver_version": gpu.driver_version or "", "driver_ok": driver_max is None or runtime <= driver_max,
    }, SOURCE))
    driver = (f"driver supports CUDA {driver_max}.x" if driver_max is not None
              else f"driver not observed ({gpu.device_source})")
    return facts, f"CUDA runtime {runtime}.x ({'manifest' if declared else 'NEEDED'}); {driver}"


# -- L5 -------------------------------------------------------------------------------------
def arch_targets(manifest: Manifest, gpu, force_arch: str | None) -> list:
    """(target_num, variant, source): --force-arch pins; else the devices; else cuda.archs."""
    from ..elf.fatbin import parse_arch

    if force_arch:
        try:
            num, variant = parse_arch(force_arch)
        except ValueError as exc:
            raise BadInput(f"--force-arch: {exc}") from None
        return [(num, variant, "--force-arch")]
    if gpu.nvml_ok and gpu.devices:
        return sorted({(d["arch"], "", f"NVML device {d['index']}") for d in gpu.devices})
    out = []
    for arch in manifest.cuda_archs:
        num, variant = parse_arch(arch)
        out.append((num, variant, "manifest cuda.archs"))
    return out


def fatbin_facts(manifest: Manifest, elves: dict, gpu, force_arch: str | None) -> tuple:
    from ..elf.fatbin import runnable_on

    targets = arch_targets(manifest, gpu, force_arch)
    with_code = {lib: info for lib, info in _good(elves).items() if info.fatbin}
    if not with_code:
        return [], "no fatbin (no device code) in the plugin's libraries"
    if not targets:
        return [], "device code present but no target: no GPU observed, no --force-arch, no cuda.archs"
    facts = []
    for lib, info in with_code.items():
        sass = sorted({e.name for e in info.fatbin if e.kind == "sass"})
        ptx = sorted({e.name for e in info.fatbin if e.kind == "ptx"})
        for num, variant, source in targets:
            ok, _why = runnable_on(info.fatbin, num, variant)
            facts.append(Fact("fatbin", {**subject(manifest), "path": lib}, {
                "target": f"sm_{num}{variant}", "target_num": num, "target_source": source,
                "sass": sass, "ptx": ptx, "runnable": ok}, SOURCE))
    names = ", ".join(sorted({f.data["target"] + " (" + f.data["target_source"] + ")" for f in facts}))
    return facts, f"fatbins checked against {names}"


# -- L6 -------------------------------------------------------------------------------------
def framework_fact(manifest: Manifest) -> tuple:
    from importlib import metadata

    try:
        torch_version = metadata.version("torch")
        source = "installed distribution"
    except metadata.PackageNotFoundError:
        torch_version, source = "", "torch not installed"
    if not manifest.torch_range:
        note = f"torch {torch_version or 'not installed'}; no framework.torch range declared"
        return None, note
    ok = bool(torch_version) and parse_range(manifest.torch_range).contains(
        version_key(torch_version.split("+")[0]), prereleases=True)
    fact = Fact("plugin_framework", subject(manifest), {
        "torch_range": manifest.torch_range, "torch_version": torch_version or "not installed",
        "torch_ok": ok, "torch_source": source}, SOURCE)
    return fact, f"torch {torch_version or 'not installed'} within framework.torch {manifest.torch_range}"


# -- the entry the check command calls ---------------------------------------------------------
def main_for_check(args) -> int:
    """`seedance check --plugin NAME [--strict] [--arch sm_86] [--json | --report-json FILE]`.

    The check command owns its parser and calls this with its args namespace.  Attributes
    read (all optional but ``plugin``): plugin, strict, arch or force_arch, json,
    report_json ('-' = stdout) or report_target (a prepared seedance.render.output target), force,
    targets/pid (must be empty).  Prints the layer lines (or the
    JSON) and returns the exit code; bad input raises BadInput/UsageError (exit 2 at the CLI)."""
    import json
    import sys

    from ..model.errors import UsageError

    if getattr(args, "targets", None) or getattr(args, "pid", None):
        raise UsageError("seedance check: --plugin takes no other targets")
    strict = bool(getattr(args, "strict", False))
    force_arch = getattr(args, "force_arch", None) or getattr(args, "arch", None)
    report, lines = run_layers(args.plugin, strict, force_arch)
    target = getattr(args, "report_target", None)
    if target is None:
        from ..render.output import prepare_output
        report_json = "-" if getattr(args, "json", False) else getattr(args, "report_json", None)
        target = prepare_output(report_json, force=bool(getattr(args, "force", False))) if report_json else None
    text = json.dumps(report.to_dict(), indent=2) + "\n"
    if target is not None:
        target.write_text(text)  # seedance.render.output: atomic, devices written through
        if target.is_stdout:
            return report.exit_code(strict)
    for line in lines:
        print(line, file=sys.stdout)
    return report.exit_code(strict)
