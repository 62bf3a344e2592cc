"""The standing attack suite's ledger: which case drove memory highest.

Most attacks run the real CLI in a child process; the rest call a reader in this process.
The kernel keeps the peak resident set of both (getrusage: RUSAGE_CHILDREN is the largest
child waited for so far, RUSAGE_SELF this process), and each is a running maximum, so a
test that raises either one is the worst case so far.  With $SEEDANCE_ATTACK_LEDGER set,
every test's outcome and the peaks it set are written there as JSON lines for
bench/bench_attacks.py; without it nothing is written.
"""
from __future__ import annotations

import json
import os
import resource

import pytest

_LEDGER = os.environ.get("SEEDANCE_ATTACK_LEDGER")


def _peaks() -> tuple:
    return (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _LEDGER:
        yield
        return
    before = _peaks()
    item.user_properties.append(("peaks_before", before))
    yield


def pytest_runtest_logreport(report):
    if not _LEDGER or report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
        return
    before = dict(report.user_properties).get("peaks_before", (0, 0))
    after = _peaks()
    line = {"case": report.nodeid, "outcome": report.outcome,
            "child_peak_kib": after[0] if after[0] > before[0] else None,
            "self_peak_kib": after[1] if after[1] > before[1] else None}
    with open(_LEDGER, "a", encoding="utf-8") as ledger:
        ledger.write(json.dumps(line) + "\n")


# --- peak RSS of this process, from a point on ----------------------------------------------
# getrusage's ru_maxrss is the peak since the process began, so a fuzzer run late in the
# suite would inherit the peak of whatever test ran before it.  The kernel lets a process
# reset its own high-water mark (proc(5), /proc/PID/clear_refs: "5" resets VmHWM to the
# current RSS); the fuzzers measure their growth from that reset.

def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak_rss() -> int:
    """Reset this process's peak RSS to its current RSS; returns that RSS in KiB."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear:
            clear.write("5")
    except OSError:
        pass  # an older kernel: the peak then counts from the process's start, as before
    return _status_kib("VmRSS")


def peak_rss_kib() -> int:
    """This process's peak RSS (VmHWM) in KiB since the last reset_peak_rss()."""
    return _status_kib("VmHWM")
