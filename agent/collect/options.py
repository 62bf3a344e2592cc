"""What a check covers and assumes (CheckOptions), and the GPU it judges against.

Apart from scan.py so that a check answered from the cache (check_cache.py) imports
neither the scan nor its collectors: their imports (the ELF reader, the resolver, every
collector) would be most of what such a command does.
"""
from __future__ import annotations

from ..model.errors import UsageError

# A scan appends itself here when this is a list (cli.console, for a `seedance check` that
# ends the process right after): a scan of /usr/lib holds on the order of 10^5 objects, and
# deallocating them one by one would delay the command's end for nothing, where the process
# exit frees the memory at once.  None (tests, the
# agent: processes that go on) keeps nothing.
KEEP_UNTIL_EXIT = None
from ..model.record import NEW, Record
from . import cuda


class CheckOptions(Record):
    """What a check covers and assumes."""
    _fields = ("targets", "pids", "arch", "driver_version", "strict", "rules_dir", "env", "python", "nvml")

    def __init__(self, targets: list = NEW, pids: list = NEW, arch: str | None = None,
                 driver_version: str | None = None, strict: bool = False, rules_dir: str | None = None,
                 env: dict | None = None, python: str | None = None, nvml: cuda.GpuInfo | None = None):
        self.targets = [] if targets is NEW else targets
        self.pids = [] if pids is NEW else pids
        self.arch = arch
        self.driver_version = driver_version
        self.strict = strict
        self.rules_dir = rules_dir
        self.env = env  # the environment the resolver assumes (LD_LIBRARY_PATH, ...)
        self.python = python  # check --python: the interpreter whose torch imports extensions
        # a GpuInfo cuda.probe_nvml() gave earlier in this command: fix checks, then checks
        # again, and NVML would otherwise be probed (pynvml imported, nvmlInit, nvmlShutdown)
        # for each
        self.nvml = nvml

    @property
    def host_scope(self) -> bool:
        return not self.targets and not self.pids


def gpu_context(options: CheckOptions) -> cuda.GpuInfo:
    """Target archs and driver: the command line wins; NVML fills what it does not give."""
    if options.nvml is None:
        gpu = cuda.probe_nvml()
    else:  # a copy: this one gets the command line's values
        gpu = options.nvml._replace(targets=list(options.nvml.targets), devices=list(options.nvml.devices))
    if options.arch:
        try:
            from . import fatbin  # (paid only with --arch)

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
