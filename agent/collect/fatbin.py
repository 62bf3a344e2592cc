"""fatbin facts: can the device code in an object run on the target GPU architecture?

The target is --arch sm_XX, else every distinct architecture NVML reports.  Without either
there is no target, and no fatbin fact: we never guess a GPU.

Judged per module (one fatbin container = one translation unit or device-link step, each
registered on its own by the runtime), never per file:
  - a module that holds no kernel (a device-link stub, device variables only, as cuFFT
    ships) can launch nothing: it is no evidence either way and is left out;
  - when no kernel-holding module has an image for the device, nothing can launch there:
    cuda-arch-missing (or cuda-ptx-unsupported when only too-new PTX stood in the way);
  - when some do and some do not, the object either dispatches by architecture or has a
    translation unit built for the wrong GPU.  cuBLAS keeps fermiPlus* kernels for
    sm_50-sm_75 and cuBLASLt ampere_*/turing_*/volta_* and sm_90a-only kernels beside modules
    built for every architecture: a module without code for this GPU is taken as an
    alternative for other GPUs only when a kernel-holding module that runs here also runs
    on every GPU that module serves.  Two translation units built for disjoint GPUs (one
    sm_90 + PTX, one sm_80 only) have no such cover: the kernels of the one that cannot
    run are named.
"""
from __future__ import annotations

from ..model.report import Fact

# ..elf.fatbin and ..elf.fatbin_payload (a dataclass, whose methods are compiled with exec()
# at import, and regular expressions compiled at import) are imported by the functions that
# decode a fatbin: most checks meet none, and a `seedance fix` of one library none at all.

FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
MAX_NAMED_KERNELS = 8  # kernels named in a finding; the count is always given


def has_fatbin(info) -> bool:
    """Cheap test on an ElfInfo read without fatbin=True (section names are always read)."""
    return any(name in info.section_names for name in FATBIN_SECTIONS)


class _Kernels:
    """Kernel names per module, decoded lazily (most verdicts need none decoded)."""

    def __init__(self, path: str, grouped: dict):
        self.path, self.grouped, self.cache = path, grouped, {}
        self.undecodable = 0

    def of(self, module: int):
        """frozenset of kernel names; None when no image of the module could be decoded."""
        if module not in self.cache:
            from ..elf import fatbin as elf_fatbin
            from ..elf import fatbin_payload

            names, decoded = set(), False
            for entry in sorted(self.grouped[module], key=lambda e: e.usize):
                if entry.kind == "damaged":
                    continue
                try:
                    names |= fatbin_payload.kernels(elf_fatbin.read_image(self.path, entry), entry.kind)
                    decoded = True
                except (fatbin_payload.PayloadError, OSError):
                    continue
                if names:
                    break  # the images of one module are one translation unit's kernels
            if not decoded:
                self.undecodable += 1
            self.cache[module] = frozenset(names) if decoded else None
        return self.cache[module]

    def holds_kernels(self, module: int) -> bool:
        kernels = self.of(module)
        return kernels is None or bool(kernels)  # undecodable: judged, not waved through


# Compute capabilities of shipped GPUs (CUDA C++ Programming Guide, "Compute Capabilities");
# the devices a module can run on are counted over these.
KNOWN_DEVICES = (50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 88, 89, 90, 100, 101, 103, 110, 120, 121)


def _devices(module_entries, ptx_isa_max, devices) -> int:
    """Bit mask over ``devices``: where this module has an image the driver can load."""
    from ..elf import fatbin as elf_fatbin

    mask = 0
    for bit, device in enumerate(devices):
        if elf_fatbin.choose_image(module_entries, device, ptx_isa_max)[0] is not None:
            mask |= 1 << bit
    return mask


def judge(path: str, entries, target: int, ptx_isa_max=None) -> dict:
    """The verdict for one object on one device capability, as fact data."""
    from ..elf import fatbin as elf_fatbin

    grouped = elf_fatbin.modules(entries)
    kernels = _Kernels(path, grouped)
    runnable, failing = [], {}
    for number, module in grouped.items():
        image, why, too_new = elf_fatbin.choose_image(module, target, ptx_isa_max)
        if image is None:
            failing[number] = (why, too_new)
        else:
            runnable.append(number)
    verdict = {"modules": len(grouped), "modules_without_code": len(failing), "failing_modules": [],
               "kernels": [], "kernel_count": 0, "ptx_too_new": False, "dispatch": 0}
    if not failing:
        verdict.update(runnable=True, why=_first_why(grouped, runnable, target, ptx_isa_max))
        return verdict
    # Per-architecture dispatch: a module with no code for this GPU is an alternative for
    # other GPUs when a kernel-holding module that runs here also runs on every GPU that
    # module serves (cuBLAS keeps fermiPlus* kernels for sm_50-sm_75 beside modules for all
    # architectures).  Two translation units built for disjoint GPUs have no such cover.
    devices = tuple(sorted(set(KNOWN_DEVICES) | {target}))
    covers: dict = {}  # device mask -> [runnable modules with that mask]
    for number in runnable:
        covers.setdefault(_devices(grouped[number], ptx_isa_max, devices), []).append(number)
    kernel_covers: dict = {}

    def covering_mask_holds_kernels(mask: int) -> bool:
        if mask not in kernel_covers:
            kernel_covers[mask] = any(kernels.holds_kernels(n) for n in covers[mask])
        return kernel_covers[mask]

    broken, dispatched = [], 0
    for number in failing:
        served = _devices(grouped[number], ptx_isa_max, devices)
        if served and any(served & ~mask == 0 and covering_mask_holds_kernels(mask) for mask in covers):
            dispatched += 1
        elif kernels.holds_kernels(number):
            broken.append(number)
    if not broken:
        why = (f"{dispatched} module(s) without code for this GPU serve other GPUs that modules "
               f"which run here also serve (per-architecture dispatch)" if dispatched else
               f"the {len(failing)} module(s) without code for this GPU hold no kernel "
               f"(device-link stub or device variables)")
        verdict.update(runnable=True, why=why, dispatch=dispatched)
        return verdict
    names = sorted(set().union(*(kernels.of(n) or () for n in broken)))
    too_new = all(failing[n][1] for n in broken)
    why = failing[broken[0]][0]
    if kernels.undecodable:
        why += f" ({kernels.undecodable} module(s) could not be decoded and were judged as holding kernels)"
    verdict.update(runnable=False, why=why, ptx_too_new=too_new, dispatch=dispatched,
                   failing_modules=broken, kernel_count=len(names), kernels=names[:MAX_NAMED_KERNELS])
    return verdict


def _first_why(grouped, runnable, target, ptx_isa_max) -> str:
    from ..elf import fatbin as elf_fatbin

    reasons = sorted({elf_fatbin.choose_image(grouped[n], target, ptx_isa_max)[1] for n in runnable})
    return "; ".join(reasons[:4])


def fatbin_facts(path: str, entries, targets, driver=None) -> list:
    """One fact per (object, target); ``targets`` are (arch_num, variant, label, source).

    ``driver`` (a cuda.DriverSpec or a --driver-version string) bounds the PTX ISA the
    driver can JIT; without it PTX is judged by architecture alone.
    """
    from ..elf import fatbin as elf_fatbin

    if not entries:
        return []
    from . import cuda

    spec = cuda.parse_driver_version(driver) if isinstance(driver, str) else driver
    ptx_isa_max = elf_fatbin.ptx_isa_for_cuda(spec.cuda) if spec is not None and spec.cuda else None
    sass = sorted({e.name for e in entries if e.kind == "sass"})
    ptx = sorted({e.name for e in entries if e.kind == "ptx"})
    isas = sorted({e.isa_text for e in entries if e.kind == "ptx" and e.isa})
    facts = []
    for arch, _variant, label, source in targets:
        # first by architecture alone, then, where that passes, what this driver can JIT:
        # two facts, so `cuda-arch-missing` and `cuda-ptx-unsupported` never both fire
        verdict = judge(path, entries, arch, None)
        common = {"target": label, "target_num": arch, "target_source": source,
                  "sass": sass, "ptx": ptx, "ptx_isa": isas,
                  "compressed": any(e.compressed for e in entries)}
        facts.append(Fact("fatbin", {"path": path}, {**common, **verdict}, source="collect.fatbin"))
        if verdict["runnable"] and ptx_isa_max is not None and isas:
            jit = judge(path, entries, arch, ptx_isa_max)
            facts.append(Fact("fatbin_ptx", {"path": path},
                              {**common, "jit_ok": jit["runnable"], "why": jit["why"],
                               "kernels": jit["kernels"], "kernel_count": jit["kernel_count"],
                               "driver": spec.describe(), "ptx_isa_max": ".".join(map(str, ptx_isa_max))},
                              source="collect.fatbin"))
    return facts


def parse_target(text: str) -> tuple:
    """--arch value -> (arch_num, variant, label, source); ValueError when malformed."""
    from ..elf import fatbin as elf_fatbin

    arch, variant = elf_fatbin.parse_arch(text)
    return arch, variant, f"sm_{arch}{variant}", "--arch"
