"""Find a registry slot's process from another pid namespace.

A wrapped process records its pid as it sees it: inside a container that is the pid in
the container's pid namespace, a number that means some other process (or none) to the
host agent.  So a slot also names its namespace (st_dev and st_ino of /proc/self/ns/pid)
and its start time (/proc/self/stat field 22: clock ticks since boot, the same number
through any namespace's /proc).  A reader in another namespace finds the process through
/proc/PID/status, whose NSpid line lists the process's pid in every namespace from the
reader's down to its own: the last number is the pid the slot holds, and PID (the first)
is the reader's.

One walk of /proc answers every slot of a pass (``ProcessTable.scan``).  The rules are
those of the shim's own check (foreign_pid_alive in shim/src/registry.c), so the agent and
a reclaiming shim never disagree about who is alive.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

# PROC_PID_INIT_INO (include/linux/proc_ns.h): the initial pid namespace, whose /proc
# shows every process of every pid namespace on the host
INITIAL_PID_NS_INO = 0xEFFFFFFC


def own_pid_namespace(proc: str = "/proc") -> tuple[int, int] | None:
    """(st_dev, st_ino) of this process's pid namespace; None without /proc."""
    try:
        st = os.stat(f"{proc}/self/ns/pid")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _innermost_pid(proc: str, pid: str) -> int | None:
    try:
        with open(f"{proc}/{pid}/status", "rb") as handle:
            text = handle.read(8192)
    except OSError:
        return None
    for line in text.split(b"\n"):
        if line.startswith(b"NSpid:"):
            numbers = line.split()[1:]
            return int(numbers[-1]) if numbers else None
    return None


def _start_time(proc: str, pid: str) -> int | None:
    try:
        with open(f"{proc}/{pid}/stat", "rb") as handle:
            text = handle.read(4096)
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: count from the last ')'
    fields = text[text.rfind(b")") + 2:].split()
    return int(fields[19]) if len(fields) > 19 else None


@dataclass
class ProcessTable:
    """The processes of some pid namespaces, as this reader's /proc shows them."""

    own: tuple[int, int] | None
    # (ns_dev, ns_ino) -> {pid in that namespace: (pid here, start time)}
    namespaces: dict[tuple[int, int], dict[int, tuple[int, int]]] = field(default_factory=dict)
    # (innermost pid, start time) of the processes whose namespace we may not read
    hidden: set[tuple[int, int]] = field(default_factory=set)
    wanted: frozenset = frozenset()  # the namespaces this walk looked for
    unreadable: bool = False

    @classmethod
    def scan(cls, wanted: set[tuple[int, int]], proc: str = "/proc") -> "ProcessTable":
        """One walk of /proc; only processes of the ``wanted`` namespaces are read further."""
        table = cls(own=own_pid_namespace(proc), wanted=frozenset(wanted))
        try:
            entries = [name for name in os.listdir(proc) if name.isdigit()]
        except OSError:
            table.unreadable = True  # no /proc to look in: nobody may be declared ended
            return table
        for name in entries:
            try:
                st = os.stat(f"{proc}/{name}/ns/pid")
            except PermissionError:
                # following the ns link needs ptrace access (proc(5)): a process that is not
                # dumpable hides its namespace, not its innermost pid or its start time
                inner, start = _innermost_pid(proc, name), _start_time(proc, name)
                if inner is not None and start is not None:
                    table.hidden.add((inner, start))
                continue
            except OSError:
                continue  # exited during the walk
            ns = (st.st_dev, st.st_ino)
            if ns not in wanted:
                continue
            members = table.namespaces.setdefault(ns, {})
            inner = _innermost_pid(proc, name)
            start = _start_time(proc, name)
            if inner is not None and start is not None:
                members[inner] = (int(name), start)
        return table

    def find(self, ns: tuple[int, int], pid: int, start: int) -> int | None:
        """The pid here of process ``pid`` (in namespace ``ns``) started at ``start``."""
        here = self.namespaces.get(ns, {}).get(pid)
        return here[0] if here is not None and here[1] == start else None

    def translate(self, ns: tuple[int, int], pid: int) -> int | None:
        """The pid here of whatever has ``pid`` in namespace ``ns`` now (a parent, say)."""
        here = self.namespaces.get(ns, {}).get(pid)
        return here[0] if here is not None else None

    def alive(self, ns: tuple[int, int], pid: int, start: int) -> bool:
        """Whether the process still runs.  Not found: ended when its namespace is visible
        here (another of its processes is) or this reader is in the initial pid namespace
        (a namespace with no process left has ended); otherwise the reader cannot see that
        namespace at all and never declares the process ended; nor when a process with that
        innermost pid and start time hid its namespace from us."""
        if self.find(ns, pid, start) is not None or self.unreadable or (pid, start) in self.hidden:
            return True
        if ns in self.namespaces:
            return False
        return not (self.own is not None and self.own[1] == INITIAL_PID_NS_INO)
