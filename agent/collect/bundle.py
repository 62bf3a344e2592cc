"""Evidence bundles: capture a check once, judge it anywhere.

`check --bundle out.tar.zst` runs the ordinary scan (collect/scan.py) with two observers
that record every closure and process as it is read, then writes one tar (zstd, or gzip
for .tar.gz) through seedance.render.output:

  manifest.json        schema seedance.bundle/v1: options, members, what was redacted
  facts.json           every Fact of the scan (Fact.to_dict), the rule engine's input
  report.json          the report of the same scan
  runtime.json         what the arch/driver-dependent facts are derived from: the fatbin
                       inventory of every object that has device code, the CUDA runtimes
                       of each closure, statically linked runtimes, the GPU context
  objects.json         per closure object: sha256, size, mtime, dynamic section, versions
  host/...             uname, glibc, versions, nvidia-smi -q, NVRM/Xid kernel lines
  ldso/...             /etc/ld.so.cache and the ld.so config files
  processes/PID/...    maps and the (redacted) environment of each scanned process; for a
                       process in a container or chroot, its identity (process.json) and
                       its own ld.so inputs under processes/PID/root/etc/, read inside
                       its root (collect/rootfs.py)
  configs/...          the (redacted) seedance and plugin configs that were read
  binaries/...         only with --with-binaries

`check --from-bundle` reads it back in memory (collect/bundle_reader.py: every member
capped and checked against the manifest's sha256, the compressed stream read to its clean
end, nothing extracted) and feeds facts.json to the same rule engine.  With
--arch/--driver-version the facts that depend on them (fatbin, fatbin_ptx, cuda_driver)
are dropped and derived again by the collectors' own functions (collect/fatbin.py,
collect/cuda.py, collect/closure.py) from runtime.json: one fact model, no second judge.

Secrets never enter the bundle (collect/redact.py): values under secret-like names in
environments and configs, every URL's userinfo and well-known token shapes are replaced by
<redacted>; every captured value found that way is also scrubbed from every other member
(facts and report included) before it is written.  The manifest names each redaction
(where, which name), never the value.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import platform
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass

from ..model.errors import BadInput, UsageError
from ..model.report import Fact, Report
from .bundle_reader import CAPS, SCHEMA, Caps, read_members
from .redact import REDACTED, Redactor  # noqa: F401  (REDACTED: what tests and docs look for)

BUNDLE_SUFFIXES = (".tar.zst", ".tar.gz", ".tgz")

# What marks a file as a bundle of ours (seedance.render.output.is_ours): a zstd skippable frame
# (magic 0x184D2A5E, little-endian) holding SCHEMA, or the gzip member name GZIP_NAME.
ZSTD_TAG = b"\x5e\x2a\x4d\x18" + len(SCHEMA).to_bytes(4, "little") + SCHEMA.encode()
GZIP_NAME = "seedance-bundle.tar"

# The largest file --with-binaries captures: the reader's cap on one member (bundle_reader.py).
MAX_MEMBER_BYTES = CAPS.member_bytes
MAX_DMESG_LINES = 2000

# Kinds whose facts depend on the GPU target or driver: derived again on --arch/--driver-version.
ARCH_DRIVER_KINDS = ("fatbin", "fatbin_ptx", "cuda_driver")


# --- capture --------------------------------------------------------------------------------
class Capture:
    """The Scanner's observers: what each closure and process was, as it was read."""

    def __init__(self, with_binaries: bool = False):
        self.with_binaries = with_binaries
        self.objects: dict = {}  # path -> ElfInfo
        self.closures: list = []  # {"root", "runtimes": {path: [major, requester]}}
        self.processes: dict = {}  # pid -> ProcessView

    def on_closure(self, root: str, result, runtimes: dict) -> None:
        self.objects.update(result.objects)
        if runtimes:
            self.closures.append({"root": root, "runtimes": {p: [m, r] for p, (m, r) in runtimes.items()}})

    def on_process(self, view) -> None:
        self.processes[view.pid] = view


@dataclass
class BundleSummary:
    path: str
    size: int
    members: dict  # section -> count
    redactions: int
    objects: int
    facts: int


def capture(options, target, progress=None, with_binaries: bool = False, stderr=None):
    """Run the check with capture; write the bundle to ``target`` (a prepared OutputTarget
    whose path ends in .tar.zst/.tar.gz).  Returns (report, BundleSummary)."""
    from .scan import Scanner

    stderr = stderr if stderr is not None else sys.stderr
    scanner = Scanner(options, progress)
    seen = Capture(with_binaries)
    scanner.on_closure, scanner.on_process = seen.on_closure, seen.on_process
    report = scanner.run()
    redactor = Redactor()
    members: list = []  # (name, bytes)

    def add(name: str, data) -> None:
        members.append((name, data if isinstance(data, bytes) else data.encode("utf-8", "surrogateescape")))

    def step(text: str) -> None:
        print(f"seedance: bundle: {text}", file=stderr, flush=True)

    _mapped_objects(seen, scanner)
    step(f"{len(scanner.facts)} facts, {len(seen.objects)} objects, {len(seen.processes)} processes")
    facts = [redactor.maybe_structure("facts.json", f.to_dict()) for f in scanner.facts]
    report_doc = redactor.maybe_structure("report.json", report.to_dict())
    step("reading objects (sha256, dynamic sections, fatbin inventories)")
    objects, fatbins, statics = _objects(seen.objects, scanner, with_binaries, add)
    step("host facts, ld.so configuration, processes, configs")
    runtime = {"gpu": _gpu(scanner.gpu), "closures": seen.closures, "fatbins": fatbins,
               "static_runtimes": statics, "compat": _compat()}
    for pid, view in sorted(seen.processes.items()):
        where = f"processes/{pid}/environ.json"
        add(where, json.dumps(redactor.environ(where, view.environ), indent=1, sort_keys=True))
        add(f"processes/{pid}/maps", _read_bytes(f"/proc/{pid}/maps") or b"")
        about = {"pid": pid, "exe": view.exe, "root": view.root}
        if view.foreign:
            about["container"] = view.container.subject() if view.container is not None else None
            _root_ldso_members(add, pid, view)
        add(f"processes/{pid}/process.json", json.dumps(about))
    for path in _config_paths(scanner):
        text = _read_text(path)
        if text is not None:
            where = "configs" + os.path.abspath(path)
            add(where, redactor.config_text(where, text))
    _host_members(add, redactor, scanner)
    _ldso_members(add)
    add("facts.json", json.dumps(facts, separators=(",", ":")))
    add("report.json", json.dumps(report_doc, separators=(",", ":")))
    add("runtime.json", json.dumps(runtime, separators=(",", ":")))
    add("objects.json", json.dumps(objects, separators=(",", ":")))
    # scrub every secret seen from every member (a fact or a config could quote one)
    members = [(name, data if name.startswith("binaries/") else redactor.scrub(data, name))
               for name, data in members]
    manifest = {"schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "seedance_version": _seedance_version(), "host": report.host.get("hostname"),
                "options": {"targets": list(options.targets), "pids": list(options.pids),
                            "arch": options.arch, "driver_version": options.driver_version,
                            "strict": options.strict, "with_binaries": with_binaries},
                "redacted": redactor.redactions,
                "members": [{"name": n, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                            for n, d in members]}
    members.insert(0, ("manifest.json", redactor.scrub(json.dumps(manifest, indent=1).encode(), "manifest.json")))
    data = _pack(members, target.path)
    step(f"writing {len(data)} bytes")
    target.write_bytes(data)
    counts: dict = {}
    for name, _data in members:
        section = name.split("/", 1)[0] if "/" in name else name
        counts[section] = counts.get(section, 0) + 1
    return report, BundleSummary(path=target.path, size=len(data), members=counts,
                                 redactions=len(redactor.redactions), objects=len(objects),
                                 facts=len(facts))


def _objects(infos: dict, scanner, with_binaries: bool, add) -> tuple:
    """objects.json entries, fatbin inventories and static runtimes of the closures' objects."""
    from ..elf.reader import read_elf
    from ..model.errors import ELFError
    from . import cuda
    from . import fatbin as fatbin_collect

    objects, fatbins, statics = {}, {}, {}
    fatbin_sha = {}
    for path, info in sorted(infos.items()):
        entry = {"path": path}
        try:
            fd = _open_captured(path)
            try:
                st = os.fstat(fd)
                entry.update(size=st.st_size, mtime=st.st_mtime, sha256=_sha256(path))
            finally:
                os.close(fd)
        except OSError as exc:
            entry["error"] = str(exc)
        if info is not None:
            entry.update(elf_class=info.elf_class, machine=info.machine, e_type=info.e_type,
                         interpreter=info.interpreter, soname=info.soname, needed=list(info.needed),
                         rpath=list(info.rpath), runpath=list(info.runpath), flags=info.flags,
                         flags_1=info.flags_1, build_id=info.build_id,
                         version_needs=[{"file": v.file, "versions": [list(x) for x in v.versions]}
                                        for v in info.version_needs],
                         version_defs=list(info.version_defs), sections=list(info.section_names))
            if fatbin_collect.has_fatbin(info):
                try:
                    entries = read_elf(path, fatbin=True).fatbin
                    fatbins[path] = [dataclasses.asdict(e) for e in entries]
                    fatbin_sha[path] = entry.get("sha256")
                    entry["fatbin"] = [e.name for e in entries]
                    found = cuda.static_runtime(path, info)
                    if found and found["major"] is not None:
                        statics[path] = found
                except (ELFError, OSError) as exc:
                    entry["fatbin_error"] = str(exc)
        if with_binaries and "sha256" in entry:
            data = _read_bytes(path)
            if data is not None:
                add("binaries" + os.path.abspath(path), data)
        objects[path] = entry
    return objects, {"entries": fatbins, "sha256": fatbin_sha}, statics


def _mapped_objects(seen: Capture, scanner) -> None:
    """A process's closure is what it has mapped: those objects join the closures' ones."""
    from ..model.errors import ELFError

    for view in seen.processes.values():
        for mapping in view.mappings:
            path = view.host_path(mapping.path)
            if mapping.deleted or path in seen.objects or not os.path.isfile(path):
                continue
            try:
                seen.objects[path] = scanner.resolver.read(path)
            except (ELFError, OSError):
                continue


def _gpu(gpu) -> dict:
    return {**gpu.to_dict(), "target_tuples": [list(t) for t in gpu.targets]}


def _compat() -> str | None:
    from . import cuda

    return cuda.compat_driver()


def _config_paths(scanner) -> list:
    """The configs the scan read (fact subjects of collect.config) and the dir configs."""
    paths = {f.subject.get("path") for f in scanner.facts if f.source == "collect.config"}
    paths.update(scanner.dir_configs)
    return sorted(p for p in paths if isinstance(p, str) and os.path.isfile(p))


def _host_members(add, redactor: Redactor, scanner) -> None:
    uname = platform.uname()
    versions = {"python": sys.version, "python_executable": sys.executable,
                "seedance": _seedance_version(), "torch": _torch_version(scanner)}
    try:
        versions["glibc"] = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        versions["glibc"] = None
    add("host/uname.json", json.dumps(uname._asdict(), indent=1))
    add("host/versions.json", json.dumps(versions, indent=1))
    add("host/gpu.json", json.dumps(_gpu(scanner.gpu), indent=1))
    smi = _run(["nvidia-smi", "-q"])
    if smi is not None:
        add("host/nvidia-smi-q.txt", redactor.urls("host/nvidia-smi-q.txt", "", smi))
    lines = _kernel_gpu_lines()
    if lines is not None:
        add("host/kernel-nvrm.txt", lines)
    for name in ("/proc/driver/nvidia/version", "/proc/version"):
        text = _read_text(name)
        if text is not None:
            add("host" + name, text)


def _kernel_gpu_lines() -> str | None:
    """NVRM and Xid lines from the kernel log (dmesg, else the journal), where readable."""
    for command in (["dmesg", "--notime"], ["journalctl", "-k", "-b", "--no-pager", "-q"]):
        text = _run(command)
        if text is not None:
            keep = [line for line in text.splitlines() if "NVRM" in line or "Xid" in line]
            return "\n".join(keep[-MAX_DMESG_LINES:]) + ("\n" if keep else "")
    return None


def _ldso_members(add) -> None:
    import glob

    paths = ["/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.preload"]
    paths += sorted(glob.glob("/etc/ld.so.conf.d/*"))
    for path in paths:
        data = _read_bytes(path)
        if data is not None:
            add("ldso" + path, data)


# What a process in another root loads by: its own ld.so inputs, captured from inside that
# root under processes/PID/root/...
_ROOT_LDSO = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.preload")


def _root_ldso_members(add, pid: int, view) -> None:
    """The ld.so inputs of a process in a container or chroot, read inside its root with
    collect/rootfs.py: a link there that points at an absolute path starts again at the
    container's /, so a planted `/etc/ld.so.conf -> /etc/shadow` captures the container's
    file of that name (or nothing), never the host's."""
    from .process import root_views

    root = root_views().root(view)
    if root is False:
        return
    try:
        paths = list(_ROOT_LDSO)
        try:
            paths += [f"/etc/ld.so.conf.d/{name}" for name in sorted(root.listdir("/etc/ld.so.conf.d"))]
        except OSError:
            pass
        for path in paths:
            try:
                data = root.read(path, limit=MAX_MEMBER_BYTES)
            except (OSError, ValueError):
                continue  # missing, a directory, a loop, or a link out of the root
            add(f"processes/{pid}/root{path}", data)
    finally:
        if not root_views().shared(root):
            root.close()


def _open_captured(path: str) -> int:
    """A fd on a file the scan read: a path under /proc/PID/root/ (a container's file) is
    opened inside that root, so a component swapped for a symlink since the scan resolved
    it is followed within the container, never out to a host file."""
    parts = path.split("/", 4)
    if len(parts) == 5 and parts[1] == "proc" and parts[2].isdigit() and parts[3] == "root":
        from . import rootfs
        return rootfs.open(f"/proc/{parts[2]}/root", "/" + parts[4])
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def _torch_version(scanner) -> str | None:
    torch = getattr(scanner, "python_torch", None)
    if torch is not None:
        return getattr(torch, "version", None)
    try:  # the distribution's metadata: never `import torch` (seconds, and it executes code)
        from importlib.metadata import version

        return version("torch")
    except Exception:
        return None


def _seedance_version() -> str:
    try:
        from importlib.metadata import version

        return version("seedance")
    except Exception:
        return "unknown"


def _run(command: list) -> str | None:
    try:
        done = subprocess.run(command, capture_output=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.decode("utf-8", "replace")


def _read_bytes(path: str, limit: int = MAX_MEMBER_BYTES) -> bytes | None:
    try:
        with open(_open_captured(path), "rb") as handle:
            data = handle.read(limit + 1)
    except OSError:
        return None
    return data if len(data) <= limit else None


def _read_text(path: str) -> str | None:
    data = _read_bytes(path, 4 << 20)
    return data.decode("utf-8", "replace") if data is not None else None


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(_open_captured(path), "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _pack(members: list, name: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        now = int(time.time())
        for member_name, data in members:
            info = tarfile.TarInfo(member_name)
            info.size, info.mtime, info.mode = len(data), now, 0o644
            tar.addfile(info, io.BytesIO(data))
    raw = buffer.getvalue()
    if _codec(name) == "zstd":
        import zstandard

        # with a content checksum, so a flipped bit is "damaged", as gzip's CRC makes it;
        # a skippable frame first (RFC 8878, 3.1.2: decoders skip it) names the file as a
        # seedance bundle, so seedance.render.output may replace it on the next --bundle
        return ZSTD_TAG + zstandard.ZstdCompressor(level=10, write_checksum=True).compress(raw)
    import gzip

    out = io.BytesIO()
    # the gzip header's FNAME field (RFC 1952, 2.3.1) carries the same mark
    with gzip.GzipFile(filename=GZIP_NAME, mode="wb", fileobj=out, mtime=0) as handle:
        handle.write(raw)
    return out.getvalue()


def _codec(name: str) -> str:
    if name.endswith(".tar.zst"):
        return "zstd"
    if name.endswith((".tar.gz", ".tgz")):
        return "gzip"
    raise UsageError(f"--bundle: {name}: name it .tar.zst or .tar.gz")


def check_name(name: str) -> None:
    """A bundle path must say how it is compressed (before any work: exit 2)."""
    if name == "-":
        raise UsageError("--bundle: give a file name ending in .tar.zst or .tar.gz")
    _codec(name)


# --- reading --------------------------------------------------------------------------------
@dataclass
class Bundle:
    path: str
    manifest: dict
    facts: list
    report: dict
    runtime: dict


def read_bundle(path: str, caps: Caps = CAPS, clock=None) -> Bundle:
    """The members replay needs, verified and bounded (bundle_reader.py).  BadInput (one
    line) otherwise."""
    from ..model.errors import escape_path

    shown = escape_path(path)
    # of report.json replay uses the host, stats and scope: the findings go at once
    keep = {"report.json": lambda report: {k: v for k, v in report.items() if k in ("host", "stats", "scope")}
            if isinstance(report, dict) else {}}
    found = read_members(path, caps, clock, keep)
    manifest = found["manifest.json"]
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        raise BadInput(f"{shown}: not a seedance bundle (manifest schema is not {SCHEMA})")
    missing = [name for name in ("facts.json", "report.json", "runtime.json") if name not in found]
    if missing:
        raise BadInput(f"{shown}: not a complete seedance bundle (missing {', '.join(missing)})")
    if not isinstance(found["facts.json"], list) or not isinstance(found["runtime.json"], dict):
        raise BadInput(f"{shown}: damaged bundle: facts.json or runtime.json has the wrong shape")
    return Bundle(path=path, manifest=manifest, facts=found["facts.json"], report=found["report.json"],
                  runtime=found["runtime.json"])


def _fact(item, shown: str) -> Fact:
    try:
        subject, data = item["subject"], item["data"]
        if item["kind"] == "mapped_lib" and type(data) is dict and "restart" not in data:
            # a bundle written before mapped_lib facts named the process's container: the
            # process was judged on the host, so the fix is restarting that pid
            data.setdefault("where", "")
            data["restart"] = f"restart pid {subject.get('pid', '?')}"
        # the parsed dicts themselves, not copies: a bundle's facts are most of replay's memory
        return Fact(kind=str(item["kind"]), subject=subject if type(subject) is dict else dict(subject),
                    data=data if type(data) is dict else dict(data), source=str(item.get("source", "")))
    except (AttributeError, KeyError, TypeError, ValueError):
        raise BadInput(f"{shown}: damaged bundle: a fact without kind, subject or data") from None


# --- replay ---------------------------------------------------------------------------------
def replay(path: str, arch: str | None = None, driver_version: str | None = None,
           strict: bool = False, rules_dir: str | None = None) -> Report:
    """The rules run on a bundle's facts, optionally judged for another GPU or driver."""
    from ..judge.engine import load_rules
    from ..model.errors import escape_path

    rules = load_rules(rules_dir)
    bundle = read_bundle(path)
    shown = escape_path(path)
    facts = [_fact(item, shown) for item in bundle.facts]
    bundle.facts = []  # held as Facts now
    rederived = arch is not None or driver_version is not None
    try:
        gpu = _gpu_for(bundle.runtime.get("gpu") or {}, arch, driver_version)
        if rederived:
            facts = [f for f in facts if f.kind not in ARCH_DRIVER_KINDS]
            facts.extend(_arch_driver_facts(bundle.runtime, gpu))
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        # runtime.json of the wrong shape (a bundle edited or damaged after it was written)
        raise BadInput(f"{shown}: damaged bundle: runtime.json: {exc.__class__.__name__}: {exc}") from None
    findings = rules.evaluate(facts, strict=strict)
    findings = [_mark_live(f, bundle, rederived) for f in findings]
    captured = bundle.report if isinstance(bundle.report, dict) else {}
    host = dict(captured.get("host") if isinstance(captured.get("host"), dict) else {})
    host["gpu"] = gpu.to_dict()
    captured_stats = captured.get("stats") if isinstance(captured.get("stats"), dict) else {}
    stats = {k: v for k, v in captured_stats.items() if k != "duration_s"}
    stats.update(facts=len(facts), facts_by_kind=_count(f.kind for f in facts), errors=[])
    report = Report(command="check", host=host, stats=stats,
                    extra={"scope": captured.get("scope", {}),
                           "replay": {"bundle": path, "captured": bundle.manifest.get("created"),
                                      "captured_on": bundle.manifest.get("host"),
                                      "rederived": list(ARCH_DRIVER_KINDS) if rederived else [],
                                      "gpu_targets": [t[2] for t in gpu.targets],
                                      "driver_version": gpu.driver_version}})
    report.add(findings)
    return report


def _gpu_for(captured: dict, arch, driver_version):
    from . import cuda
    from . import fatbin as fatbin_collect

    gpu = cuda.GpuInfo(driver_version=captured.get("driver_version"),
                       driver_source=captured.get("driver_source") or "",
                       devices=list(captured.get("devices") or []), nvml=bool(captured.get("nvml")))
    gpu.targets = [tuple(t) for t in captured.get("target_tuples") or [] if isinstance(t, list) and len(t) == 4]
    if arch:
        try:
            gpu.targets = [fatbin_collect.parse_target(arch)]
        except ValueError as exc:
            raise UsageError(f"--arch: {exc}") from None
    if driver_version:
        try:
            cuda.parse_driver_version(driver_version)
        except ValueError as exc:
            raise UsageError(f"--driver-version: {exc}") from None
        gpu.driver_version, gpu.driver_source = driver_version, "--driver-version"
    return gpu


def _arch_driver_facts(runtime: dict, gpu) -> list:
    """fatbin, fatbin_ptx and cuda_driver facts, by the same functions a live check calls."""
    from ..elf.fatbin import FatbinEntry
    from . import closure as closure_facts
    from . import cuda
    from . import fatbin as fatbin_collect

    facts = []
    fatbins = runtime.get("fatbins") or {}
    if gpu.targets:
        for path, raw_entries in sorted((fatbins.get("entries") or {}).items()):
            try:
                entries = [FatbinEntry(**{**e, "isa": tuple(e.get("isa") or ())}) for e in raw_entries]
            except TypeError:
                raise BadInput("damaged bundle: a fatbin entry of unknown shape") from None
            # kernel names are decoded from the images only where this host holds the very
            # same file (same sha256); any other file at that path is not the one captured,
            # so the collector is pointed at a path that cannot exist and judges every
            # module as holding kernels (collect/fatbin.py, _Kernels)
            same = _same_file(path, (fatbins.get("sha256") or {}).get(path))
            read_from = path if same else os.path.join(_ABSENT, path.lstrip("/"))
            for fact in fatbin_collect.fatbin_facts(read_from, entries, gpu.targets, driver=gpu.driver_version):
                facts.append(Fact(fact.kind, {**fact.subject, "path": path},
                                  {**fact.data, **({} if same else {"kernels_from": "not captured"})},
                                  fact.source))
    if gpu.driver_version:
        dedup = closure_facts.FactDedup()
        for closure in runtime.get("closures") or []:
            runtimes = {p: (int(m), r) for p, (m, r) in (closure.get("runtimes") or {}).items()}
            facts.extend(closure_facts.driver_facts(runtimes, gpu, dedup))
        compat = runtime.get("compat")
        for path, found in sorted((runtime.get("static_runtimes") or {}).items()):
            fact = cuda.driver_fact(path, path, int(found["major"]), gpu.driver_version, gpu.driver_source,
                                    linkage="static", compat=compat,
                                    extra={"static_marker": found.get("marker"),
                                           "toolkit_release": found.get("release"),
                                           "version_source": found.get("version_source")})
            if fact is not None:
                facts.append(fact)
    return facts


_ABSENT = "/nonexistent/seedance-bundle-replay"  # never created: see _arch_driver_facts


def _same_file(path: str, sha256) -> bool:
    if not isinstance(sha256, str) or not os.path.isfile(path):
        return False
    try:
        return _sha256(path) == sha256
    except OSError:
        return False


def _mark_live(finding, bundle: Bundle, rederived: bool):
    """Findings that needed live data say so in their evidence: a process's state
    is as captured, not re-observed; a re-derived fatbin verdict cannot name kernels whose
    images were not captured (they are judged as holding kernels)."""
    why = None
    if "pid" in finding.subject:
        why = f"process state as captured at {bundle.manifest.get('created')}"
    elif rederived and finding.rule.startswith(("cuda-arch", "cuda-ptx")) and \
            not os.path.isfile(str(finding.subject.get("path"))):
        why = "kernel images are not in the bundle: modules were judged as holding kernels"
    if why is None:
        return finding
    return finding._replace(evidence={**finding.evidence, "needed_live_data": why})


def _count(kinds) -> dict:
    counts: dict = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items()))


def describe(summary: BundleSummary) -> str:
    """The closing lines of check --bundle: where, how big, what it holds."""
    held = ", ".join(f"{name} {count}" for name, count in sorted(summary.members.items()))
    return (f"bundle {summary.path}: {summary.size} bytes; {summary.facts} facts, {summary.objects} objects, "
            f"{summary.redactions} redaction(s); members: {held}\n")
