"""fatbin facts: can the device code in an object run on the target GPU architecture?

The target is --arch sm_XX, else every distinct architecture NVML reports.  Without either
there is no target, and no fatbin fact: we never guess a GPU.

Judged per module (one fatbin container = one translation unit or device-link step, each
registered on its own by the runtime), never per file (issue 11):
  - a module that holds no kernel (a device-link stub, device variables only, as cuFFT
    ships) can launch nothing: it is no evidence either way and is left out;
  - when no kernel-holding module has an image for the device, nothing can launch there:
    cuda-arch-missing (or cuda-ptx-unsupported when only too-new PTX stood in the way);
  - when some do and some do not, the object either dispatches by architecture (cuBLASLt
    carries ampere_*, turing_*, volta_* kernels in modules built for that GPU alone, next to
    sm_90a-only modules for Hopper) or has a translation unit built for the wrong GPU.
    The tell is in the object: a dispatching library carries modules specialised for the
    device's own generation (SASS of that major only, no PTX, or an 'a'/'f' image for it).
    With that evidence the other modules are taken as meant for other GPUs; without it,
    every kernel-holding module must run, and the ones that cannot are named.
"""
from __future__ import annotations

from ..elf import fatbin as elf_fatbin
from ..elf import fatbin_payload
from ..model import Fact

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


def _specialised_for(module_entries, target: int) -> bool:
    """Built for the device's own generation alone: per-architecture dispatch evidence."""
    images = [e for e in module_entries if e.kind in ("sass", "ptx")]
    if any(e.variant in ("a", "f") and elf_fatbin.sass_runs_on(e, target) for e in images if e.kind == "sass"):
        return True
    return bool(images) and all(e.kind == "sass" and e.arch // 10 == target // 10 for e in images)


def judge(path: str, entries, target: int, ptx_isa_max=None) -> dict:
    """The verdict for one object on one device capability, as fact data."""
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
               "kernels": [], "kernel_count": 0, "ptx_too_new": False, "dispatch": False}
    if not failing:
        verdict.update(runnable=True, why=_first_why(grouped, runnable, target, ptx_isa_max))
        return verdict
    launchable = next((n for n in runnable if kernels.holds_kernels(n)), None)
    if launchable is not None and any(_specialised_for(grouped[n], target) and kernels.holds_kernels(n)
                                      for n in runnable):
        verdict.update(runnable=True, dispatch=True,
                       why=f"{len(failing)} of {len(grouped)} modules have no code for this GPU; the "
                           f"object also carries modules built for this GPU's generation alone, "
                           f"so it picks kernels by architecture")
        return verdict
    broken = [n for n in failing if kernels.holds_kernels(n)]
    if not broken:
        verdict.update(runnable=True, why=f"the {len(failing)} module(s) without code for this GPU "
                                          f"hold no kernel (device-link stub or device variables)")
        return verdict
    names = sorted(set().union(*(kernels.of(n) or () for n in broken)))
    too_new = all(failing[n][1] for n in broken)
    why = failing[broken[0]][0]
    if kernels.undecodable:
        why += f" ({kernels.undecodable} module(s) could not be decoded and were judged as holding kernels)"
    verdict.update(runnable=False, why=why, ptx_too_new=too_new,
                   failing_modules=broken, kernel_count=len(names), kernels=names[:MAX_NAMED_KERNELS])
    return verdict


def _first_why(grouped, runnable, target, ptx_isa_max) -> str:
    reasons = sorted({elf_fatbin.choose_image(grouped[n], target, ptx_isa_max)[1] for n in runnable})
    return "; ".join(reasons[:4])


def fatbin_facts(path: str, entries, targets, driver=None) -> list:
    """One fact per (object, target); ``targets`` are (arch_num, variant, label, source).

    ``driver`` (a cuda.DriverSpec or a --driver-version string) bounds the PTX ISA the
    driver can JIT; without it PTX is judged by architecture alone.
    """
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
        verdict = judge(path, entries, arch, ptx_isa_max)
        data = {"target": label, "target_num": arch, "target_source": source,
                "sass": sass, "ptx": ptx, "ptx_isa": isas,
                "compressed": any(e.compressed for e in entries),
                "driver": spec.describe() if spec is not None else None,
                "ptx_isa_max": ".".join(map(str, ptx_isa_max)) if ptx_isa_max else None, **verdict}
        facts.append(Fact("fatbin", {"path": path}, data, source="collect.fatbin"))
    return facts


def parse_target(text: str) -> tuple:
    """--arch value -> (arch_num, variant, label, source); ValueError when malformed."""
    arch, variant = elf_fatbin.parse_arch(text)
    return arch, variant, f"sm_{arch}{variant}", "--arch"
