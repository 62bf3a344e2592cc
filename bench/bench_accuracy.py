"""Accuracy of `seedance check` against reality: the corpus size, false errors and
missed errors, per class and over all cases.

Reality is the real loader: each object is loaded in a child process with RTLD_NOW as it is
loaded in practice, or its module imported (tests/accuracy/*: the loader corpus of real
NVIDIA/cupy/scipy/onnxruntime/opencv wheels and gcc-built planted cases; the CUDA and torch
corpora where those modules are present).  Wheels are cached under ~/.cache/seedance-corpus
($SEEDANCE_CORPUS); a corpus that cannot be had here is listed with the reason, never
counted as passed.

    .venv/bin/python bench/bench_accuracy.py [--verbose] [--check] [--corpus loader|cuda|torch ...]
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# module -> what it covers; each exposes cases(workdir) and evaluate(case) -> row with
# predicted_broken and broken, and raises its Unavailable when its corpus cannot be had
CORPORA = (
    ("tests.accuracy.test_loader_accuracy", "loader"),
    ("tests.accuracy.test_cuda_accuracy", "cuda"),
    ("tests.accuracy.test_torch_accuracy", "torch"),
)


def _class_of(case, row: dict, corpus: str) -> str:
    kind = row.get("kind") or getattr(case, "kind", None) or getattr(case, "cls", None)
    if not kind and getattr(case, "rules", None):  # the CUDA corpus names the rules it judges
        kind = "+".join(case.rules)
    return f"{corpus}/{kind or '-'}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="one line per case")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when any false or missed error is found (default: print only)")
    parser.add_argument("--corpus", action="append", choices=[c for _m, c in CORPORA],
                        help="only this corpus (repeatable; default: all)")
    args = parser.parse_args()
    started = time.monotonic()
    per_class: dict = defaultdict(lambda: {"cases": 0, "broken": 0, "false": 0, "missed": 0})
    unavailable = []
    wrong = []
    with tempfile.TemporaryDirectory(prefix="seedance-accuracy-") as work:
        for module_name, corpus in CORPORA:
            if args.corpus and corpus not in args.corpus:
                continue
            if not (ROOT / (module_name.replace(".", "/") + ".py")).is_file():
                unavailable.append((corpus, "not in this checkout"))
                continue
            module = importlib.import_module(module_name)
            try:
                cases = module.cases(Path(work) / corpus)
            except Exception as exc:  # the module's Unavailable, or a corpus that broke
                unavailable.append((corpus, f"{type(exc).__name__}: {exc}"))
                continue
            for case in cases:
                row = module.evaluate(case)
                stats = per_class[_class_of(case, row, corpus)]
                stats["cases"] += 1
                stats["broken"] += bool(row["broken"])
                if row["predicted_broken"] and not row["broken"]:
                    stats["false"] += 1
                    wrong.append(("FALSE ERROR", row))
                elif row["broken"] and not row["predicted_broken"]:
                    stats["missed"] += 1
                    wrong.append(("MISSED", row))
                if args.verbose:
                    print(f"  {'BROKEN' if row['broken'] else 'ok':6} seedance "
                          f"{'BROKEN' if row['predicted_broken'] else 'ok':6} {row['case']}")
    print(f"{'class':<34} {'cases':>6} {'broken':>7} {'false errors':>13} {'missed errors':>14}")
    total = {"cases": 0, "broken": 0, "false": 0, "missed": 0}
    for name in sorted(per_class):
        stats = per_class[name]
        for key in total:
            total[key] += stats[key]
        print(f"{name:<34} {stats['cases']:>6} {stats['broken']:>7} {stats['false']:>13} {stats['missed']:>14}")
    print(f"{'all':<34} {total['cases']:>6} {total['broken']:>7} {total['false']:>13} {total['missed']:>14}")
    for corpus, why in unavailable:
        print(f"not run: {corpus}: {why}")
    for label, row in wrong:
        print(f"{label}: {row['case']}: {row.get('how', '')}")
    print(f"({time.monotonic() - started:.0f} s, corpus cache {os.environ.get('SEEDANCE_CORPUS', '~/.cache/seedance-corpus')})")
    return 1 if args.check and (total["false"] or total["missed"]) else 0


if __name__ == "__main__":
    sys.exit(main())
