"""Structured log lines: one JSON object per line on stderr, which journald stores as is.

Under systemd (JOURNAL_STREAM names our stderr) each line gets an sd-daemon "<N>" priority
prefix, which journald strips and turns into the entry's PRIORITY, so `journalctl -p warning`
works; anywhere else the line is pure JSON for jq.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

_PRIORITY = {"debug": 7, "info": 6, "notice": 5, "warning": 4, "error": 3, "critical": 2}


def _stderr_is_journal() -> bool:
    stream = os.environ.get("JOURNAL_STREAM", "")
    if ":" not in stream:
        return False
    try:
        info = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    dev, _, ino = stream.partition(":")
    return f"{info.st_dev}:{info.st_ino}" == f"{dev}:{ino}"


class JsonLog:
    def __init__(self, stream=None, journal: bool | None = None):
        self.stream = stream or sys.stderr
        self.journal = _stderr_is_journal() if journal is None else journal
        self._lock = threading.Lock()

    def __call__(self, event: str, level: str = "info", **fields) -> None:
        record = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}Z",
                  "level": level, "event": event, **fields}
        line = json.dumps(record, default=str, separators=(",", ":"))
        if self.journal:
            line = f"<{_PRIORITY.get(level, 6)}>{line}"
        with self._lock:
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass  # stderr closed: logging must never take the agent down
