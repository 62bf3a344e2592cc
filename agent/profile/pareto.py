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

import bisect
import csv
import io
import math
import os
import stat
from dataclasses import dataclass, field

from ..model.errors import BadInput, escape_path

DECAY_SLOPE = -0.035  # product notes 2.5: dROI/dlatency below this marks the decay
REQUIRED_COLUMNS = ("name", "latency_ms", "accuracy")
# The file is read as a stream and only the frontier is kept, so memory does not grow with
# the rows; these caps bound what one row, the frontier and the listing can hold, and how
# long a run can take.  docs/profile.md states them.
MAX_CSV_BYTES = 1 << 30          # the file; a bench of every precision variant is kilobytes
MAX_ROWS = 20_000_000            # data rows
MAX_FIELD_CHARS = 1024           # one cell (a variant's name included)
MAX_RECORD_CHARS = 64 * 1024     # one row, the newlines inside quotes included
MAX_FRONTIER = 10_000            # variants on the frontier: each is a line of the table
MAX_DOMINATED_LISTED = 1000      # dominated variants named one by one; the rest are counted


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
    dominated: dict[str, str]  # dominated variant -> a variant that dominates it (the first listed)
    decay_point: str | None
    decay_slope: float = DECAY_SLOPE
    notes: list[str] = field(default_factory=list)
    variants: int = 0  # rows read
    dominated_total: int = 0  # dominated rows, listed or not
    dominated_variants: list[Variant] = field(default_factory=list)  # the listed ones, for the plot

    def to_dict(self) -> dict:
        return {
            "baseline_accuracy": self.baseline_accuracy,
            "decay_slope_threshold": self.decay_slope,
            "frontier": [{"name": p.variant.name, "latency_ms": p.variant.latency_ms,
                          "accuracy": p.variant.accuracy, "cost_per_ms": p.variant.cost_per_ms,
                          "roi": p.roi, "droi_dlatency_to_next": p.slope_to_next}
                         for p in self.frontier],
            "dominated": [{"name": name, "dominated_by": by} for name, by in sorted(self.dominated.items())],
            "dominated_total": self.dominated_total,
            "decay_point": self.decay_point,
            "notes": list(self.notes),
        }


def read_csv(text: str, *, default_cost_per_ms: float = 1.0, source: str = "CSV") -> list[Variant]:
    """Parse the results CSV held in TEXT; any defect is one BadInput naming the row and column."""
    return list(iter_variants(io.StringIO(text), default_cost_per_ms=default_cost_per_ms, source=source))


def analyse_file(path: str, *, default_cost_per_ms: float = 1.0, baseline_accuracy: float | None = None,
                 max_bytes: int = MAX_CSV_BYTES, max_rows: int = MAX_ROWS) -> ParetoResult:
    """Stream the CSV at PATH through analyse(): memory holds the frontier, not the file."""
    source = escape_path(path)
    try:
        # utf-8-sig: spreadsheets write a byte-order mark before the header
        handle = open(path, encoding="utf-8-sig", errors="surrogateescape", newline="")
    except OSError as exc:
        from ..model.errors import describe_os_error

        raise BadInput(describe_os_error(exc)) from None
    with handle:
        try:
            info = os.fstat(handle.fileno())
        except OSError:
            info = None
        if info is not None and stat.S_ISREG(info.st_mode) and info.st_size > max_bytes:
            raise BadInput(f"{source}: {info.st_size} bytes, more than the {max_bytes} a results CSV may have")
        try:
            rows = iter_variants(handle, default_cost_per_ms=default_cost_per_ms, source=source,
                                 max_chars=max_bytes, max_rows=max_rows)
            return analyse(rows, baseline_accuracy=baseline_accuracy, source=source)
        except OSError as exc:  # EIO, EISDIR from the first read of a directory
            from ..model.errors import describe_os_error

            raise BadInput(f"{source}: {describe_os_error(exc)}") from None


def iter_variants(handle, *, default_cost_per_ms: float = 1.0, source: str = "CSV",
                  max_chars: int = MAX_CSV_BYTES, max_rows: int = MAX_ROWS):
    """The rows of a results CSV read from HANDLE (text), one Variant at a time."""
    pending = [0, 1]  # characters of the row being parsed (newlines inside quotes included), its line
    total = [0]

    def lines():
        while True:
            line = handle.readline(MAX_RECORD_CHARS + 1)
            if not line:
                return
            pending[0] += len(line)
            total[0] += len(line)
            if pending[0] > MAX_RECORD_CHARS:
                raise BadInput(f"{source}: row {pending[1]}: longer than {MAX_RECORD_CHARS} characters")
            if total[0] > max_chars:  # a pipe, or a file that grew while it was read
                raise BadInput(f"{source}: more than the {max_chars} bytes a results CSV may have")
            yield line.lstrip("\ufeff") if total[0] == len(line) else line

    reader = csv.reader(lines())
    try:
        header = [h.strip() for h in next(reader, [])]
    except csv.Error as exc:
        raise BadInput(f"{source}: row 1: {exc}") from None
    if not any(header):
        raise BadInput(f"{source}: empty file (expected columns {','.join(REQUIRED_COLUMNS)})")
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        shown = escape_path(",".join(header))[:200]
        raise BadInput(f"{source}: row 1: missing column {missing[0]!r} (have {shown or 'none'})")
    name_at, latency_at, accuracy_at = (header.index(column) for column in REQUIRED_COLUMNS)
    cost_at = header.index("cost_per_ms") if "cost_per_ms" in header else None
    needed = max(name_at, latency_at, accuracy_at, -1 if cost_at is None else cost_at) + 1
    count = 0
    while True:
        row = reader.line_num + 1
        pending[:] = [0, row]
        try:
            cells = next(reader, None)
        except csv.Error as exc:
            raise BadInput(f"{source}: row {row}: {exc}") from None
        if cells is None:
            break
        if not cells:
            continue  # a blank line, as DictReader skips it
        count += 1
        if count > max_rows:
            raise BadInput(f"{source}: more than {max_rows} rows")
        width = len(cells)
        if width > len(header):
            raise BadInput(f"{source}: row {row}: more values than the header's {len(header)} columns")
        if max(map(len, cells)) > MAX_FIELD_CHARS:
            column = next(h for h, c in zip(header, cells) if len(c) > MAX_FIELD_CHARS)
            raise BadInput(f"{source}: row {row}, column {escape_path(column)[:40]!r}: "
                           f"longer than {MAX_FIELD_CHARS} characters")
        if width < needed:
            cells = cells + [""] * (needed - width)
        name = cells[name_at].strip()
        if not name:
            raise BadInput(f"{source}: row {row}, column 'name': empty")
        latency = _number(cells[latency_at], "latency_ms", row, source)
        accuracy = _number(cells[accuracy_at], "accuracy", row, source)
        cost_text = cells[cost_at].strip() if cost_at is not None else ""
        cost = _number(cost_text, "cost_per_ms", row, source) if cost_text else default_cost_per_ms
        if latency <= 0:
            raise BadInput(f"{source}: row {row}, column 'latency_ms': must be > 0, got {latency:g}")
        if cost <= 0:
            raise BadInput(f"{source}: row {row}, column 'cost_per_ms': must be > 0, got {cost:g}")
        yield Variant(name, latency, accuracy, cost, row)
    if count == 0:
        raise BadInput(f"{source}: no data rows after the header")


def _number(text: str, column: str, row: int, source: str) -> float:
    try:
        value = float(text)  # float() ignores the spaces around a number
    except ValueError:
        text = text.strip()
        raise BadInput(f"{source}: row {row}, column {column!r}: not a number: {escape_path(text)[:80]!r}") from None
    if not math.isfinite(value):
        raise BadInput(f"{source}: row {row}, column {column!r}: not a finite number: {text!r}")
    return value


def dominates(a: Variant, b: Variant) -> bool:
    """a is at least as fast and as accurate as b, and strictly better in one."""
    return (a.latency_ms <= b.latency_ms and a.accuracy >= b.accuracy
            and (a.latency_ms < b.latency_ms or a.accuracy > b.accuracy))


def _latency(variant: Variant) -> float:
    return variant.latency_ms


class _Front:
    """The non-dominated variants seen so far, by latency.  Along a Pareto front accuracy
    rises with latency (a slower, no more accurate point would be dominated), so the point
    that could dominate a newcomer is the last one no slower than it, and the points a
    newcomer dominates are a run starting at the first one no faster than it: two binary
    searches a row instead of a scan of the front."""

    def __init__(self, source: str):
        self.points: list[Variant] = []
        self.dominated: dict[str, str] = {}
        self.dominated_variants: list[Variant] = []
        self.dominated_total = 0
        self.names: set[str] = set()  # of the variants the output names: they must be unique
        self.source = source

    def add(self, variant: Variant) -> None:
        if variant.name in self.names:
            raise BadInput(f"{self.source}: row {variant.row}, column 'name': duplicate variant "
                           f"{escape_path(variant.name)!r}")
        points = self.points
        faster = bisect.bisect_right(points, variant.latency_ms, key=_latency)
        if faster:
            best = points[faster - 1]  # the most accurate of those no slower than the newcomer
            if dominates(best, variant):
                self._dominated(variant, best)
                return
        first = bisect.bisect_left(points, variant.latency_ms, key=_latency)
        end = first
        while end < len(points) and dominates(variant, points[end]):
            end += 1
        for loser in points[first:end]:
            self.names.discard(loser.name)
            self._dominated(loser, variant)
        # equal points do not dominate each other: a newcomer goes after its equals
        at = bisect.bisect_right(points, variant.latency_ms, lo=first, key=_latency) if end == first else first
        points[first:end] = []
        points.insert(at, variant)
        self.names.add(variant.name)
        if len(points) > MAX_FRONTIER:
            raise BadInput(f"{self.source}: more than {MAX_FRONTIER} variants on the frontier (row {variant.row})")

    def _dominated(self, variant: Variant, by: Variant) -> None:
        self.dominated_total += 1
        if len(self.dominated) < MAX_DOMINATED_LISTED:
            self.dominated[variant.name] = by.name
            self.dominated_variants.append(variant)
            self.names.add(variant.name)


def analyse(variants, *, baseline_accuracy: float | None = None, source: str = "CSV") -> ParetoResult:
    """The frontier, ROI and decay point of VARIANTS (any iterable, read once)."""
    front = _Front(source)
    count = 0
    lowest = math.inf
    for variant in variants:
        count += 1
        lowest = min(lowest, variant.accuracy)
        front.add(variant)
    if count == 0:
        raise BadInput(f"{source}: no data rows after the header")
    notes = []
    if baseline_accuracy is None:
        # With no baseline given, ROI is measured above the least accurate variant: every
        # variant must beat "do the cheapest thing" to earn a return at all.
        baseline_accuracy = lowest
        notes.append(f"baseline accuracy not given: using the lowest accuracy in the file ({baseline_accuracy:g})")
    if front.dominated_total > len(front.dominated):
        notes.append(f"{front.dominated_total} dominated variants: the first {len(front.dominated)} "
                     f"are listed")
    points_in = front.points  # sorted by latency; equal latencies have equal accuracy
    rois = [(v.accuracy - baseline_accuracy) / (v.latency_ms * v.cost_per_ms) for v in points_in]
    points: list[FrontierPoint] = []
    decay_point = None
    for index, variant in enumerate(points_in):
        slope = None
        # equal latencies (equal points) have no slope between them
        if index + 1 < len(points_in) and points_in[index + 1].latency_ms > variant.latency_ms:
            slope = (rois[index + 1] - rois[index]) / (points_in[index + 1].latency_ms - variant.latency_ms)
            if decay_point is None and slope < DECAY_SLOPE:
                decay_point = variant.name
        points.append(FrontierPoint(variant, rois[index], slope))
    return ParetoResult(baseline_accuracy, points, front.dominated, decay_point, notes=notes, variants=count,
                        dominated_total=front.dominated_total, dominated_variants=front.dominated_variants)


def plot(result: ParetoResult, target) -> None:
    """Draw latency against accuracy: frontier line, dominated points, decay point.

    ``target`` is a seedance.render.output OutputTarget; matplotlib is imported only here.
    """
    from ..model.extras import pyplot

    plt = pyplot("pareto --plot")
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    front = [p.variant for p in result.frontier]
    ax.plot([v.latency_ms for v in front], [v.accuracy for v in front], "-o", color="#1f77b4", label="frontier")
    dom = result.dominated_variants
    if dom:
        ax.scatter([v.latency_ms for v in dom], [v.accuracy for v in dom], marker="x", color="#7f7f7f",
                   label="dominated")
    for v in front + dom:
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
    # the Software chunk marks the PNG as ours, so a rerun may replace it (seedance.render.output)
    fig.savefig(buffer, format="png", metadata={"Software": "seedance pareto"})
    plt.close(fig)
    target.write_bytes(buffer.getvalue())
