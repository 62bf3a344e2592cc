"""The check cache: a check of the same targets, on files that have not changed, answers
from the report it gave last time, so the agent's periodic checks and CI's repeat runs of
an unchanged tree cost a stat of each input instead of a scan.

What a report depends on, and how each part is keyed:

- the files and directories the check read, listed, stat'ed or looked for: recorded as it
  ran (collect/inputs.py), each with (dev, inode, mode, size, mtime_ns, ctime_ns) or the
  errno it gave, and stat'ed again before a cached report is believed.  ctime is in the
  key because it changes with every write, chmod, rename and link, even when a tool
  restores mtime;
- the command line (targets, --strict, --arch, --driver-version, --rules, --python), the
  working directory, the user, and the environment a check reads (LD_*, CUDA*, TORCH*,
  XDG_*, HOME, PATH, PYTHONPATH, ...), compared whole;
- this host: the boot id (the CPU's ISA level and hwcaps do not change within a boot), the
  kernel and glibc, and the GPU context, which NVML is asked for on every run as before;
- seedance itself: every source, extension, rule and schema file of the package, by its stat.

A file changed within the file system's timestamp tick of being read could keep its
mtime and ctime ("racy git"): a report whose inputs include a file or directory changed
less than RACY_S before the check began is not stored.  Host-scope checks (they read
every process) and --pid are never cached; --bundle and --from-bundle neither.

Entries live in $XDG_CACHE_HOME/seedance/check/ (0700), one JSON file per key (0600,
written to a temp file and renamed); only a regular file of this user's that nobody else
can write is read.  At most MAX_ENTRIES are kept, the oldest dropped.  `--no-cache` or
SEEDANCE_CACHE=0 turns it off.  A cache that cannot be read or written costs time, never
a result.
"""
from __future__ import annotations

import json
import os
import time

from ..model.report import Finding, Report
from . import inputs

FORMAT = 2  # 2: directories stat'ed but not listed are weak inputs (inputs.weak_identity)
RACY_S = 2.0  # FAT and some network file systems keep 2 s timestamps; local ones a tick
MAX_ENTRIES = 64
MAX_BYTES = 64 << 20
ENV_PREFIXES = ("LD_", "CUDA", "NVIDIA", "TORCH", "XDG_", "CONDA", "SEEDANCE_ELF")
ENV_NAMES = ("HOME", "PATH", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")


def cache_dir() -> str | None:
    from ..files.private import cache_home

    base = cache_home()
    return os.path.join(base, "check") if base is not None else None


def eligible(options, disabled: bool = False) -> bool:
    """A check of named files or directories, with the cache not turned off."""
    return not disabled and os.environ.get("SEEDANCE_CACHE", "") != "0" and bool(options.targets) \
        and not options.pids and options.env is None


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _code_stamp() -> list:
    """Every source and extension file of the seedance package, by its stat: a changed
    seedance is another key.  All of them, not the modules loaded now: a check answered from
    the cache loads fewer than one that runs."""
    import seedance

    stamp, stack = [], list(seedance.__path__)
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        stack.append(entry.path)
                elif entry.name.endswith((".py", ".so", ".yaml", ".json")):
                    st = entry.stat()
                    stamp.append([entry.path, st.st_size, st.st_mtime_ns])
            except OSError:
                continue
    return stamp


def key_of(options, gpu) -> dict:
    uname = os.uname()
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        glibc = None
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}
    return {"format": FORMAT, "targets": list(options.targets), "strict": options.strict, "arch": options.arch,
            "driver_version": options.driver_version, "python": options.python, "rules": options.rules_dir,
            "cwd": os.getcwd(),
            "uid": os.geteuid(), "env": env, "boot": _boot_id(), "kernel": uname.release,
            "host": uname.nodename, "glibc": glibc, "gpu": gpu.to_dict(), "code": _code_stamp()}


def _entry_path(directory: str, key: dict) -> str:
    import zlib

    text = json.dumps(key, sort_keys=True, separators=(",", ":"))
    return os.path.join(directory, f"check-{zlib.crc32(text.encode('utf-8', 'surrogateescape')):08x}.json")


def _read_entry(path: str):
    """(header dict, inputs blob) of a cache entry, or None: a JSON line, then the blob
    (inputs.encode) whose length and CRC-32 the header gives."""
    import zlib

    from ..files.private import read_private

    data = read_private(path, MAX_BYTES)
    if data is None:
        return None
    line, sep, blob = data.partition(b"\n")
    try:
        header = json.loads(line.decode("utf-8", "surrogateescape")) if sep else None
    except (ValueError, UnicodeError):
        return None
    if not isinstance(header, dict) or header.get("blob") != [len(blob), zlib.crc32(blob)]:
        return None
    return header, blob


def lookup(options, gpu, directory: str | None):
    """(Report or None, entry path or None, key): the cached report in ``directory`` (the
    check cache's, cache_dir()) when every input is as it was."""
    key = key_of(options, gpu)
    if directory is None:
        return None, None, key
    path = _entry_path(directory, key)
    entry = _read_entry(path)
    if entry is None or entry[0].get("key") != key:
        return None, path, key
    header, blob = entry
    try:
        if inputs.changed(blob, header["inputs"]) is not None:
            return None, path, key
        report = _report_from(header["report"])
    except (KeyError, TypeError, ValueError):
        return None, path, key
    report.stats["cache"] = {"state": "hit", "inputs": header["inputs"]}
    return report, path, key


def _plain_report(report: Report) -> dict:
    from ..model.report import _plain

    return {"command": report.command, "stats": _plain(report.stats), "extra": _plain(report.extra),
            "findings": [_plain(f._asdict()) for f in report.findings]}


def _report_from(data: dict) -> Report:
    report = Report(command=data["command"], stats=dict(data["stats"]), extra=dict(data["extra"]))
    report.findings = [Finding(**finding) for finding in data["findings"]]
    return report


def store(path: str, key: dict, report: Report, records: dict, started_ns: int) -> str:
    """Write the entry (best effort); what was done: 'stored' or why not."""
    import zlib

    if inputs.opaque() is not None:
        return f"not stored: the check ran something whose reads are not recorded ({inputs.opaque()})"
    if inputs.newest_change(records) >= started_ns - int(RACY_S * 1e9):
        return "not stored: an input changed just before the check"
    plain = _plain_report(report)
    blob = inputs.encode(records)
    text = json.dumps({"key": key, "report": plain, "inputs": len(records), "blob": [len(blob), zlib.crc32(blob)]},
                      separators=(",", ":"))
    # the entry must give back this very report: what does not survive JSON (a value that
    # is not plain data) is not cached.  The report a hit rebuilds (_report_from) holds these
    # fields and no others, and to_dict() and the table are made from them (the host facts
    # are read afresh on a hit)
    if _plain_report(_report_from(json.loads(text)["report"])) != plain:
        return "not stored: the report does not round-trip through JSON"
    from ..files.private import write_private

    try:
        write_private(path, text.encode("utf-8", "surrogateescape") + b"\n" + blob)
        _prune(os.path.dirname(path))
    except (OSError, ValueError):
        return "not stored: the cache directory cannot be written"
    return "stored"


def _prune(directory: str) -> None:
    try:
        entries = [e for e in os.scandir(directory) if e.name.startswith("check-") and e.name.endswith(".json")]
        if len(entries) <= MAX_ENTRIES:
            return
        entries.sort(key=lambda e: e.stat(follow_symlinks=False).st_mtime_ns)
        for entry in entries[:len(entries) - MAX_ENTRIES]:
            os.unlink(entry.path)
    except OSError:
        pass


def run_cached(options, progress=None, disabled: bool = False) -> Report:
    """run_check(options), from the cache when it can answer, stored in it after."""
    from . import host
    from .options import gpu_context

    if not eligible(options, disabled):
        from .scan import Scanner

        return Scanner(options, progress).run()
    started = time.monotonic()
    if options.nvml is None:
        from . import cuda

        options.nvml = cuda.probe_nvml()  # once: the key's GPU context, then the scan's
    gpu = gpu_context(options)  # (a bad --arch or --driver-version fails here, as in the scan)
    directory = cache_dir()
    report, path, key = lookup(options, gpu, directory)
    if report is not None:
        report.host = host.host_facts(gpu)
        report.stats["duration_s"] = round(time.monotonic() - started, 3)
        return report
    # seedance's own cache files (this one, the rules' parse cache) are not inputs: each
    # checks itself against what it was made from, and the rules' files are recorded
    skip = (os.path.dirname(directory),) if directory else ()
    started_ns = time.time_ns()
    from .scan import Scanner

    inputs.start(skip=skip)
    try:
        report = Scanner(options, progress).run()
    finally:
        records = inputs.stop()
    state = store(path, key, report, records, started_ns) if path is not None else "not stored: no cache directory"
    report.stats["cache"] = {"state": state, "inputs": len(records)}
    return report
