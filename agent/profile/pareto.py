"""The cost-accuracy Pareto frontier of a plugin's precision variants (product notes 2.5).

Input rows are (name, latency_ms, accuracy[, cost_per_ms]).  A row is *dominated* when
another row is at least as fast and at least as accurate, and strictly better in one of
the two; the frontier is the rest.  Along the frontier, ordered by latency, each point has

    ROI = (accuracy - baseline) / (latency_ms * cost_per_ms)

and the *decay point* is the first frontier point after which ROI falls faster than the
notes' threshold per millisecond of extra latency: dROI/dlatency < -0.035.  Past it,
paying more latency buys accuracy at a rapidly worsening return.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field

from ..errors import BadInput

DECAY_SLOPE = -0.035  # product notes 2.5: dROI/dlatency below this marks the decay
REQUIRED_COLUMNS = ("name", "latency_ms", "accuracy")


@dataclass(frozen=True)
class Variant:
    name: str
    latency_ms: float
    accuracy: float
    cost_per_ms: float
    row: int  # 1-based line number in the CSV (the header is line 1)


@dataclass(frozen=True)
class FrontierPoint:
    variant: Variant
    roi: float
    slope_to_next: float | None  # dROI/dlatency towards the next frontier point


@dataclass
class ParetoResult:
    baseline_accuracy: float
    frontier: list[FrontierPoint]
    dominated: dict[str, str]  # dominated variant -> a variant that dominates it
    decay_point: str | None
    decay_slope: float = DECAY_SLOPE
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "baseline_accuracy": self.baseline_accuracy,
            "decay_slope_threshold": self.decay_slope,
            "frontier": [{"name": p.variant.name, "latency_ms": p.variant.latency_ms,
                          "accuracy": p.variant.accuracy, "cost_per_ms": p.variant.cost_per_ms,
                          "roi": p.roi, "droi_dlatency_to_next": p.slope_to_next}
                         for p in self.frontier],
            "dominated": [{"name": name, "dominated_by": by} for name, by in sorted(self.dominated.items())],
            "decay_point": self.decay_point,
            "notes": list(self.notes),
        }


def read_csv(text: str, *, default_cost_per_ms: float = 1.0, source: str = "CSV") -> list[Variant]:
    """Parse the results CSV; any defect is one BadInput naming the row and column."""
    if not text.strip():
        raise BadInput(f"{source}: empty file (expected columns {','.join(REQUIRED_COLUMNS)})")
    reader = csv.DictReader(io.StringIO(text))
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise BadInput(f"{source}: row 1: missing column {missing[0]!r} (have {','.join(header) or 'none'})")
    reader.fieldnames = header
    variants: list[Variant] = []
    seen: set[str] = set()
    for offset, raw in enumerate(reader):
        row = offset + 2
        if None in raw:  # more cells than header columns
            raise BadInput(f"{source}: row {row}: more values than the header's {len(header)} columns")
        name = (raw.get("name") or "").strip()
        if not name:
            raise BadInput(f"{source}: row {row}, column 'name': empty")
        if name in seen:
            raise BadInput(f"{source}: row {row}, column 'name': duplicate variant {name!r}")
        seen.add(name)
        latency = _number(raw, "latency_ms", row, source)
        accuracy = _number(raw, "accuracy", row, source)
        cost = _number(raw, "cost_per_ms", row, source) if (raw.get("cost_per_ms") or "").strip() else default_cost_per_ms
        if latency <= 0:
            raise BadInput(f"{source}: row {row}, column 'latency_ms': must be > 0, got {latency:g}")
        if cost <= 0:
            raise BadInput(f"{source}: row {row}, column 'cost_per_ms': must be > 0, got {cost:g}")
        variants.append(Variant(name, latency, accuracy, cost, row))
    if not variants:
        raise BadInput(f"{source}: no data rows after the header")
    return variants


def _number(raw: dict, column: str, row: int, source: str) -> float:
    text = (raw.get(column) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise BadInput(f"{source}: row {row}, column {column!r}: not a number: {text!r}") from None
    if not math.isfinite(value):
        raise BadInput(f"{source}: row {row}, column {column!r}: not a finite number: {text!r}")
    return value


def dominates(a: Variant, b: Variant) -> bool:
    """a is at least as fast and as accurate as b, and strictly better in one."""
    return (a.latency_ms <= b.latency_ms and a.accuracy >= b.accuracy
            and (a.latency_ms < b.latency_ms or a.accuracy > b.accuracy))


def analyse(variants: list[Variant], *, baseline_accuracy: float | None = None) -> ParetoResult:
    notes = []
    if baseline_accuracy is None:
        # With no baseline given, ROI is measured above the least accurate variant: every
        # variant must beat "do the cheapest thing" to earn a return at all.
        baseline_accuracy = min(v.accuracy for v in variants)
        notes.append(f"baseline accuracy not given: using the lowest accuracy in the file ({baseline_accuracy:g})")
    dominated: dict[str, str] = {}
    for candidate in variants:
        for other in variants:
            if other is not candidate and dominates(other, candidate):
                dominated[candidate.name] = other.name
                break
    front = sorted((v for v in variants if v.name not in dominated), key=lambda v: (v.latency_ms, -v.accuracy))
    rois = [(v.accuracy - baseline_accuracy) / (v.latency_ms * v.cost_per_ms) for v in front]
    points: list[FrontierPoint] = []
    decay_point = None
    for index, variant in enumerate(front):
        slope = None
        # equal latencies (equal points) have no slope between them
        if index + 1 < len(front) and front[index + 1].latency_ms > variant.latency_ms:
            slope = (rois[index + 1] - rois[index]) / (front[index + 1].latency_ms - variant.latency_ms)
            if decay_point is None and slope < DECAY_SLOPE:
                decay_point = variant.name
        points.append(FrontierPoint(variant, rois[index], slope))
    return ParetoResult(baseline_accuracy, points, dominated, decay_point, notes=notes)


def plot(result: ParetoResult, variants: list[Variant], target) -> None:
    """Draw latency against accuracy: frontier line, dominated points, decay point.

    ``target`` is a seedance.output OutputTarget; matplotlib is imported only here.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    front = [p.variant for p in result.frontier]
    ax.plot([v.latency_ms for v in front], [v.accuracy for v in front], "-o", color="#1f77b4", label="frontier")
    dom = [v for v in variants if v.name in result.dominated]
    if dom:
        ax.scatter([v.latency_ms for v in dom], [v.accuracy for v in dom], marker="x", color="#7f7f7f",
                   label="dominated")
    for v in variants:
        ax.annotate(v.name, (v.latency_ms, v.accuracy), textcoords="offset points", xytext=(4, 4), fontsize=8)
    if result.decay_point:
        decay = next(p.variant for p in result.frontier if p.variant.name == result.decay_point)
        ax.scatter([decay.latency_ms], [decay.accuracy], s=160, facecolors="none", edgecolors="#d62728",
                   linewidths=2, label=f"decay point (dROI/dlatency < {DECAY_SLOPE})")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("accuracy")
    ax.set_title("cost-accuracy Pareto frontier")
    ax.legend(fontsize=8)
    buffer = io.BytesIO()
    fig.tight_layout()
    # the Software chunk marks the PNG as ours, so a rerun may replace it (seedance.output)
    fig.savefig(buffer, format="png", metadata={"Software": "seedance pareto"})
    plt.close(fig)
    target.write_bytes(buffer.getvalue())
