"""fatbin facts: can the device code in an object run on the target GPU architecture?

The target is --arch sm_XX, else every distinct architecture NVML reports.  Without either
there is no target, and no fatbin fact: we never guess a GPU.
"""
from __future__ import annotations

from ..elf import fatbin as elf_fatbin
from ..model import Fact

FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")


def has_fatbin(info) -> bool:
    """Cheap test on an ElfInfo read without fatbin=True (section names are always read)."""
    return any(name in info.section_names for name in FATBIN_SECTIONS)


def fatbin_facts(path: str, entries, targets) -> list:
    """One fact per (object, target); ``targets`` are (arch_num, variant, label, source)."""
    if not entries:
        return []
    sass = sorted({e.name for e in entries if e.kind == "sass"})
    ptx = sorted({e.name for e in entries if e.kind == "ptx"})
    facts = []
    for arch, variant, label, source in targets:
        ok, why = elf_fatbin.runnable_on(entries, arch, variant)
        facts.append(Fact("fatbin", {"path": path},
                          {"target": label, "target_num": arch, "target_source": source,
                           "sass": sass, "ptx": ptx, "runnable": ok, "why": why,
                           "compressed": any(e.compressed for e in entries)},
                          source="collect.fatbin"))
    return facts


def parse_target(text: str) -> tuple:
    """--arch value -> (arch_num, variant, label, source); ValueError when malformed."""
    arch, variant = elf_fatbin.parse_arch(text)
    return arch, variant, f"sm_{arch}{variant}", "--arch"
