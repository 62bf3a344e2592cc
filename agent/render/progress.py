"""Progress for long steps, on stderr: a bar for counted work (Progress), a ticking line for
one long step (Step: a BPF compile, a bundle capture).

Shown when stderr is a terminal (not TERM=dumb), or when the user asks with --progress
(then on a pipe too, as plain lines: no carriage returns in a log file); --no-progress
silences it.  stdout is never touched, so `--json | jq` stays clean.  Redraws are
throttled (10 per second) so the bar costs nothing measurable on a scan of thousands of
files.
"""
from __future__ import annotations

import os
import sys
import time


def add_progress_flags(parser, no_progress: bool = True) -> None:
    """--progress (force, even on a pipe) and, unless the command has it already,
    --no-progress; read them back with wanted(args)."""
    parser.add_argument("--progress", action="store_true", default=None,
                        help="show progress on stderr even when it is not a terminal")
    if no_progress:
        parser.add_argument("--no-progress", action="store_true", help="no progress, even on a terminal")


def wanted(args) -> bool | None:
    """True (--progress), False (--no-progress) or None: decide by the terminal."""
    if getattr(args, "no_progress", False):
        return False
    if getattr(args, "progress", None):
        return True
    return None


def on_terminal(stream=None) -> bool:
    stream = stream if stream is not None else sys.stderr
    return _is_tty(stream) and os.environ.get("TERM") != "dumb"


class Progress:
    def __init__(self, stream=None, enabled: bool | None = None, label: str = "scanning"):
        self.stream = stream if stream is not None else sys.stderr
        self.lines = enabled is True and not on_terminal(self.stream)  # forced onto a pipe
        if enabled is None:
            enabled = on_terminal(self.stream)
        self.enabled = enabled
        self._tenth = -1
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
        if self.lines:
            # a pipe or a log: one line per tenth of the work, never a carriage return
            tenth = 10 * self.done // max(self.total, 1)
            if force or tenth != self._tenth:
                self._tenth = tenth
                self.stream.write(f"{self.label}: {self.done}/{self.total}\n")
                self.stream.flush()
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
        if self.enabled and self.lines:
            if self._tenth != 10:
                self.stream.write(f"{self.label}: {self.done}/{self.total}\n")
                self.stream.flush()
            return
        if self.enabled and self._drawn:
            self.stream.write("\r" + " " * 120 + "\r")
            self.stream.flush()
            self._drawn = False


class Step:
    """One long step without a count: `with Step("compiling the eBPF probes"):`.

    On a terminal a line ticks the elapsed seconds (from a daemon thread, twice a second)
    and is erased at the end; forced onto a pipe it writes "LABEL ..." and "LABEL: done in
    N.N s".  Nothing at all when disabled."""

    def __init__(self, label: str, enabled: bool | None = None, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.label = label
        self.lines = enabled is True and not on_terminal(self.stream)
        self.enabled = on_terminal(self.stream) if enabled is None else enabled
        self.elapsed_s = 0.0
        self._stop = None  # a threading.Event once the ticking thread runs
        self._thread = None
        self._started = 0.0

    def __enter__(self):
        self._started = time.monotonic()
        if not self.enabled:
            return self
        if self.lines:
            self._write(f"{self.label} ...\n")
        else:
            import threading  # only for a ticking line: a start-up cost every other command would pay

            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._tick, name="seedance-progress", daemon=True)
            self._thread.start()
        return self

    def _tick(self) -> None:
        while True:
            seconds = time.monotonic() - self._started
            self._write(f"\r{self.label} ... {seconds:.0f} s".ljust(60))
            if self._stop.wait(0.5):
                return

    def __exit__(self, exc_type, exc, tb) -> None:
        self.elapsed_s = time.monotonic() - self._started
        if not self.enabled:
            return
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._write("\r" + " " * 60 + "\r")
        elif self.lines:
            outcome = "done" if exc_type is None else "failed"
            self._write(f"{self.label}: {outcome} in {self.elapsed_s:.1f} s\n")

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            pass  # stderr gone: progress is never worth an error


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
