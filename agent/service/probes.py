"""The trace probes (seedance.trace, issue 5) as the agent runs them: attach, poll, detach.

The probes need root, bcc and kernel headers; when any is missing the agent says why in
one log line and runs without them (`--probes on` makes that an error instead).
"""
from __future__ import annotations

import os


class AgentProbes:
    def __init__(self, rules):
        self.rules = rules
        self.session = None

    def unavailable_reason(self) -> str:
        if os.geteuid() != 0:
            return "the eBPF probes need root"
        try:
            import bcc  # noqa: F401
        except ImportError:
            return "bcc (python3-bpfcc) is not importable"
        try:
            import seedance.trace  # noqa: F401
        except ImportError:
            return "the trace probes (seedance.trace) are not installed"
        return "the trace probes are not wired into the agent yet"

    def attach(self) -> None:
        raise NotImplementedError

    def poll(self):
        return 0, 0, []

    def describe(self) -> dict:
        return {}

    def detach(self) -> None:
        self.session = None
