"""A progress bar for long scans: on a terminal's stderr only, never on a pipe.

Redraws are throttled (10 per second) so the bar costs nothing measurable on a scan of
thousands of files.
"""
from __future__ import annotations

import os
import sys
import time


class Progress:
    def __init__(self, stream=None, enabled: bool | None = None, label: str = "scanning"):
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = _is_tty(self.stream) and os.environ.get("TERM") != "dumb"
        self.enabled = enabled
        self.label = label
        self.total = 0
        self.done = 0
        self._last = 0.0
        self._drawn = False

    def start(self, total: int, label: str | None = None) -> None:
        self.total, self.done = total, 0
        if label:
            self.label = label
        self._draw(force=True)

    def advance(self, step: int = 1, note: str = "") -> None:
        self.done += step
        self._draw(note=note)

    def _draw(self, force: bool = False, note: str = "") -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1 and self.done < self.total:
            return
        self._last = now
        width = 30
        total = max(self.total, 1)
        filled = min(width, int(width * self.done / total))
        tail = os.path.basename(note)[:40]
        line = f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {tail}"
        self.stream.write(line.ljust(100)[:120])
        self.stream.flush()
        self._drawn = True

    def finish(self) -> None:
        if self.enabled and self._drawn:
            self.stream.write("\r" + " " * 120 + "\r")
            self.stream.flush()
            self._drawn = False


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
