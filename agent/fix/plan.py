"""Findings -> fix plan: what a fixer intends to change, and the dry-run diff of it.

A plan is data: the command module renders it, the fixer executes it.  Every action names
the findings it answers, so after the fix the check can be re-run and each one shown gone.
"""
from __future__ import annotations

# Findings each fixer acts on.  A fixer acts only on findings the check raises.
RELINK_RULES = ("needed-unresolved", "needed-soname-mismatch", "symbol-version-missing",
                "cuda-runtime-mixed", "cuda-driver-too-old")
ENV_LEAK_RULES = ("env-leak",)
TORCH_EXT_RULES = ("torch-ext-stale", "cxx-abi-mismatch")

from ..model.record import NEW, Record

# RelinkAction and FixPlan are written-out records (model/record.py), not @dataclass
# classes: @dataclass imports inspect and compiles each method with exec() at import, a
# cost every `seedance fix` would pay before it reads a single file.


class RelinkAction(Record):
    """One library's NEEDED/.gnu.version_r renames, or why they must not be made.

    path            the library
    renames         old NEEDED -> new NEEDED
    version_renames old version node -> new (only under the renamed files)
    target_major    the CUDA major it is retargeted to
    targets         new NEEDED -> the file it is meant to resolve to
    findings        messages of the findings it answers
    refusal         why it must not be done, when it must not
    strategy        in-place, reuse, moved-dynstr, lief (filled by the dry run / fixer)
    growth          bytes the file grows by
    changes         the edits, in words
    identity        atomic.file_identity() when planned; the fixer checks it again
    """

    _fields = ("path", "renames", "version_renames", "target_major", "targets", "findings", "refusal",
               "strategy", "growth", "changes", "identity")

    def __init__(self, path: str, renames: dict, version_renames: dict, target_major: int, targets: dict,
                 findings: list = NEW, refusal: str | None = None, strategy: str = "", growth: int = 0,
                 changes: list = NEW, identity: tuple | None = None):
        self.path = path
        self.renames = renames
        self.version_renames = version_renames
        self.target_major = target_major
        self.targets = targets
        self.findings = [] if findings is NEW else findings
        self.refusal = refusal
        self.strategy = strategy
        self.growth = growth
        self.changes = [] if changes is NEW else changes
        self.identity = identity


class FixPlan(Record):
    """What a fixer intends to change, and the findings it answers.

    kind            the fixer (cuda-mismatch)
    actions         RelinkAction, one per library
    skipped         (path, why) for findings it will not act on
    findings        the findings the plan was made from
    target_major    the CUDA major asked for (None: the closure's own)
    target_source   where the target major came from
    """

    _fields = ("kind", "actions", "skipped", "findings", "target_major", "target_source")

    def __init__(self, kind: str, actions: list = NEW, skipped: list = NEW,
                 findings: list = NEW, target_major: int | None = None, target_source: str = ""):
        self.kind = kind
        self.actions = [] if actions is NEW else actions
        self.skipped = [] if skipped is NEW else skipped
        self.findings = [] if findings is NEW else findings
        self.target_major = target_major
        self.target_source = target_source


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
