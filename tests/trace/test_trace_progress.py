"""The trace's BPF compile (3-10 s) shows progress (issue 16): on a pipe only with
--progress, as plain lines on stderr; the JSON stream on stdout is untouched."""
from __future__ import annotations

import json

from tests.conftest import run_cli


def test_compile_progress_only_when_asked(ebpf):
    shown = run_cli("trace", "--json", "--progress", "--duration", "5", "--", "true", timeout=300)
    assert shown.returncode in (0, 1), shown.stderr
    assert "compiling the eBPF probes (bcc) ...\n" in shown.stderr
    assert "compiling the eBPF probes (bcc): done in " in shown.stderr
    for line in shown.stdout.splitlines():
        json.loads(line)  # every stdout line is still the JSON stream
    quiet = run_cli("trace", "--json", "--duration", "5", "--", "true", timeout=300)
    assert "compiling the eBPF probes" not in quiet.stderr
