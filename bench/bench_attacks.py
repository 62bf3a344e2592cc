"""The standing attack suite in totals: held, broke, and the case that drove memory highest.

Each test of tests/security/ is one attack (a hostile bundle, trace, CSV, YAML, archive,
socket peer, ...): it holds when seedance answers as it must (one line and exit 2, a
refused write, a bounded reader), it breaks otherwise.  The suite's conftest writes a ledger
line per case with the peak resident set it set, of the seedance child or of the test
process (tests/security/conftest.py).

    .venv/bin/python bench/bench_attacks.py [--json] [-k EXPR]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(select: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="seedance-attacks-") as work:
        ledger = os.path.join(work, "ledger.jsonl")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/security"]
        if select:
            cmd += ["-k", select]
        started = time.monotonic()
        done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "SEEDANCE_ATTACK_LEDGER": ledger},
                              capture_output=True, text=True, errors="replace")
        elapsed = time.monotonic() - started
        lines = []
        if os.path.exists(ledger):
            with open(ledger, encoding="utf-8") as handle:
                lines = [json.loads(line) for line in handle if line.strip()]
    outcomes = Counter(line["outcome"] for line in lines)
    worst_child = max((l for l in lines if l["child_peak_kib"]), key=lambda l: l["child_peak_kib"], default=None)
    worst_self = max((l for l in lines if l["self_peak_kib"]), key=lambda l: l["self_peak_kib"], default=None)
    return {
        "cases": len(lines), "held": outcomes.get("passed", 0), "broke": outcomes.get("failed", 0),
        "skipped": outcomes.get("skipped", 0), "seconds": round(elapsed, 1), "pytest_exit": done.returncode,
        "worst_child": worst_child and {"case": worst_child["case"], "peak_mib": round(worst_child["child_peak_kib"] / 1024, 1)},
        "worst_in_process": worst_self and {"case": worst_self["case"], "peak_mib": round(worst_self["self_peak_kib"] / 1024, 1)},
        "broken_cases": [l["case"] for l in lines if l["outcome"] == "failed"],
        "tail": done.stdout.strip().splitlines()[-1:] if done.stdout else [],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="example: .venv/bin/python bench/bench_attacks.py --json")
    parser.add_argument("--json", action="store_true", help="print the totals as JSON")
    parser.add_argument("-k", dest="select", help="only the cases pytest -k selects")
    args = parser.parse_args()
    result = run(args.select)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"attack cases: {result['cases']}  held: {result['held']}  broke: {result['broke']}  "
              f"skipped: {result['skipped']}  ({result['seconds']} s)")
        for label, key in (("worst case, seedance process", "worst_child"), ("worst case, in process", "worst_in_process")):
            if result[key]:
                print(f"{label}: {result[key]['peak_mib']} MiB peak RSS  ({result[key]['case']})")
        for case in result["broken_cases"]:
            print(f"broke: {case}")
    return 0 if result["broke"] == 0 and result["cases"] else 1


if __name__ == "__main__":
    sys.exit(main())
