"""Labelled workloads among the running processes.

`seedance run --label app=encoder -- CMD` puts SEEDANCE_LABELS=app=encoder in the program's
environment.  /proc/PID/environ shows the environment a process was *started* with, so a
later setenv() inside the program cannot relabel it.  A workload is a labelled process
together with its labelled descendants: its id is the topmost ancestor that carries the
same labels, with that process's start time so a reused PID is never mistaken for it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from .policy import parse_labels

LABELS_ENV = "SEEDANCE_LABELS"


@dataclass(frozen=True)
class Workload:
    id: str               # "<root pid>-<root start time in clock ticks>"
    labels: dict
    pids: tuple


def _stat(pid: int, proc: str) -> tuple[int, int] | None:
    """(ppid, starttime) from /proc/PID/stat; the comm field may hold spaces and ')'."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as handle:
            text = handle.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return int(fields[1]), int(fields[19])  # state is fields[0]; ppid 4th, starttime 22nd field of stat


def _labels_env(pid: int, proc: str) -> str | None:
    try:
        with open(f"{proc}/{pid}/environ", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    prefix = LABELS_ENV.encode() + b"="
    for item in data.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode("utf-8", "replace")
    return None


def find_workloads(proc: str = "/proc") -> list[Workload]:
    labelled: dict[int, str] = {}
    stats: dict[int, tuple[int, int]] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        pid = int(entry)
        text = _labels_env(pid, proc)
        if text is None:
            continue
        stat = _stat(pid, proc)
        if stat is None:
            continue
        labelled[pid], stats[pid] = text, stat
    groups: dict[int, list[int]] = {}
    for pid, text in labelled.items():
        root = pid
        while True:  # climb while the parent carries the same labels
            parent = stats[root][0]
            if parent in labelled and labelled[parent] == text and parent != root:
                root = parent
            else:
                break
        groups.setdefault(root, []).append(pid)
    workloads = []
    for root, pids in sorted(groups.items()):
        try:
            labels = parse_labels([labelled[root]])
        except Exception:  # a malformed label string is no workload of ours
            continue
        workloads.append(Workload(f"{root}-{stats[root][1]}", labels, tuple(sorted(pids))))
    return workloads
