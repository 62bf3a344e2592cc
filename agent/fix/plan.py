"""Findings -> fix plan: what a fixer intends to change, and the dry-run diff of it.

A plan is data: the command module renders it, the fixer executes it.  Every action names
the findings it answers, so after the fix the check can be re-run and each one shown gone.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# Findings each fixer acts on.  A fixer acts only on findings the check raises.
RELINK_RULES = ("needed-unresolved", "needed-soname-mismatch", "symbol-version-missing",
                "cuda-runtime-mixed", "cuda-driver-too-old")
ENV_LEAK_RULES = ("env-leak",)
TORCH_EXT_RULES = ("torch-ext-stale", "cxx-abi-mismatch")


@dataclass
class RelinkAction:
    """One library's NEEDED/.gnu.version_r renames, or why they must not be made."""

    path: str
    renames: dict  # old NEEDED -> new NEEDED
    version_renames: dict  # old version node -> new (only under the renamed files)
    target_major: int
    targets: dict  # new NEEDED -> the file it is meant to resolve to
    findings: list = field(default_factory=list)  # messages of the findings it answers
    refusal: str | None = None  # why it must not be done, when it must not
    strategy: str = ""  # in-place, reuse, moved-dynstr, lief (filled by the dry run / fixer)
    growth: int = 0
    changes: list = field(default_factory=list)
    identity: tuple | None = None  # atomic.file_identity() when planned; the fixer checks it again


@dataclass
class FixPlan:
    """What a fixer intends to change, and the findings it answers."""

    kind: str
    actions: list = field(default_factory=list)
    skipped: list = field(default_factory=list)  # (path, why) for findings it will not act on
    findings: list = field(default_factory=list)  # the findings the plan was made from
    target_major: int | None = None
    target_source: str = ""


def dynamic_diff(before, after) -> list:
    """Unified-diff-like lines of the dynamic entries two ElfInfo objects differ in."""
    def entries(info) -> list:
        out = [f"NEEDED {n}" for n in info.needed]
        for need in info.version_needs:
            for version, weak in need.versions:
                out.append(f"VERNEED {need.file} {version}{' (weak)' if weak else ''}")
        if info.soname:
            out.append(f"SONAME {info.soname}")
        out.extend(f"RPATH {p}" for p in info.rpath)
        out.extend(f"RUNPATH {p}" for p in info.runpath)
        return out

    old, new = entries(before), entries(after)
    lines = []
    for line in old:
        if line not in new:
            lines.append(f"- {line}")
    for line in new:
        if line not in old:
            lines.append(f"+ {line}")
    return lines
