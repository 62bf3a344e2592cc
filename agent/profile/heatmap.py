"""Pictures of a memory profile: a heat map PNG and a terminal view.

Both show time on x and address on y; each cell is the share of its pages in use.  The
PNG marks the danger intervals with a red band above the map; the terminal view prints a
verdict row under the map (. healthy, ! warning, X danger).
"""
from __future__ import annotations

from .memory import extent_pairs

MAX_ROWS_PNG, MAX_COLS_PNG = 256, 1000
SHADES = " ░▒▓█"
VERDICT_MARK = {"healthy": ".", "warning": "!", "danger": "X"}


def occupancy_grid(frag, rows: int, cols: int):
    """rows x cols list of used fractions (address bins x sample bins)."""
    pages = frag.pages
    rows = max(1, min(rows, pages))
    samples = frag.samples
    cols = max(1, min(cols, len(samples)))
    per_row = pages / rows
    grid = [[0.0] * cols for _ in range(rows)]
    counts = [0] * cols
    for index, (_t, extents) in enumerate(samples):
        col = index * cols // len(samples)
        counts[col] += 1
        for start, length in extent_pairs(extents):
            end = start + length
            row = int(start // per_row)
            while row < rows and row * per_row < end:
                low, high = max(start, row * per_row), min(end, (row + 1) * per_row)
                if high > low:
                    grid[row][col] += (high - low) / per_row
                row += 1
    for row in grid:
        for col in range(cols):
            if counts[col]:
                row[col] /= counts[col]
    return grid


def column_verdicts(verdicts: list, cols: int) -> list:
    """The worst verdict among the samples that fall in each column."""
    order = ("healthy", "warning", "danger")
    cols = max(1, min(cols, len(verdicts)))
    out = ["healthy"] * cols
    for index, verdict in enumerate(verdicts):
        col = index * cols // len(verdicts)
        if order.index(verdict) > order.index(out[col]):
            out[col] = verdict
    return out


def terminal_view(frag, verdicts: list, width: int = 80, height: int = 16) -> str:
    cols = max(1, min(width - 12, len(frag.samples)))
    grid = occupancy_grid(frag, height, cols)
    lines = []
    top = frag.base + frag.capacity
    for index, row in enumerate(reversed(grid)):  # high addresses on top, as on a plot
        label = f"{top - index * frag.capacity // len(grid):#012x}"[-10:] if index % 4 == 0 else ""
        cells = "".join(SHADES[min(len(SHADES) - 1, int(round(v * (len(SHADES) - 1))))] for v in row)
        lines.append(f"{label:>10} |{cells}|")
    marks = "".join(VERDICT_MARK[v] for v in column_verdicts(verdicts, cols))
    lines.append(f"{'verdict':>10} |{marks}|")
    t0, t1 = frag.samples[0][0], frag.samples[-1][0]
    lines.append(f"{'':>10}  t = {t0:.3f} s .. {t1:.3f} s, {len(frag.samples)} samples; "
                 f"{SHADES[-1]} used, {SHADES[0] or ' '}free; . healthy ! warning X danger")
    return "\n".join(lines) + "\n"


def heatmap_png(frag, verdicts: list, target, title: str) -> None:
    import io

    from ..model.extras import pyplot

    plt = pyplot("the heat map picture")
    from matplotlib.colors import ListedColormap

    grid = occupancy_grid(frag, MAX_ROWS_PNG, MAX_COLS_PNG)
    cols = len(grid[0])
    t0, t1 = frag.samples[0][0], frag.samples[-1][0]
    span = t1 - t0 + frag.interval  # each sample holds for one interval
    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
    cmap = ListedColormap(["#f7fbff", "#c6dbef", "#6baed6", "#2171b5", "#08306b"])
    mib = 1 << 20
    image = ax.imshow(grid, aspect="auto", origin="lower", cmap=cmap, vmin=0, vmax=1, interpolation="nearest",
                      extent=(t0, t0 + span, frag.base / mib, (frag.base + frag.capacity) / mib))
    top = (frag.base + frag.capacity) / mib
    band = frag.capacity / mib * 0.03
    marked = False
    for col, verdict in enumerate(column_verdicts(verdicts, cols)):
        if verdict == "danger":
            x0 = t0 + span * col / cols
            ax.axvspan(x0, x0 + span / cols, ymin=0.97, ymax=1.0, color="#d62728",
                       label=None if marked else "danger")
            marked = True
    ax.set_ylim(frag.base / mib, top + band * 0)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("address (MiB from 0)")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label="pages in use")
    if marked:
        ax.legend(loc="upper right", fontsize=8)
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", metadata={"Software": "seedance profile memory"})
    plt.close(fig)
    target.write_bytes(buffer.getvalue())
