"""Accuracy of `seedance check` against reality: the corpus size, false errors and
missed errors, per class and over all cases.

Reality is the real loader: each object is loaded in a child process with RTLD_NOW as it is
loaded in practice, or its module imported (tests/accuracy/*: the loader corpus of real
NVIDIA/cupy/scipy/onnxruntime/opencv wheels and gcc-built planted cases; the CUDA and torch
corpora where those modules are present; the GPU-ecosystem corpus of torch extensions,
quantisation, onnxruntime-gpu, JAX, faiss, triton, NVIDIA library and vendored ML wheels,
where the truth is RTLD_NOW after the package's own preloads or the import itself).  Wheels
are cached under ~/.cache/seedance-corpus ($SEEDANCE_CORPUS); a corpus or environment that
cannot be had here is listed with the reason, never counted as passed, and a known limit
(a distribution PyPI has no wheel of) is listed and counted with its reason.

    .venv/bin/python bench/bench_accuracy.py [--verbose] [--check] [--corpus loader|cuda|torch|gpu ...]
        [--results bench/accuracy-results.md]
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
    ("tests.accuracy.test_corpus_gpu", "gpu"),
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
    parser.add_argument("--results", metavar="FILE.md",
                        help="also write the table, every false and missed error and what was not run to FILE.md")
    args = parser.parse_args()
    started = time.monotonic()
    per_class: dict = defaultdict(lambda: {"cases": 0, "broken": 0, "false": 0, "missed": 0})
    unavailable = []
    limits = []  # (corpus, what, why): counted, never passed
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
            unavailable += [(corpus, why) for why in getattr(module, "UNAVAILABLE", [])]
            limits += [(corpus, what, why) for what, why in getattr(module, "KNOWN_LIMITS", [])]
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
    total = {"cases": 0, "broken": 0, "false": 0, "missed": 0}
    table = [f"{'class':<34} {'cases':>6} {'broken':>7} {'false errors':>13} {'missed errors':>14}"]
    for name in sorted(per_class):
        stats = per_class[name]
        for key in total:
            total[key] += stats[key]
        table.append(f"{name:<34} {stats['cases']:>6} {stats['broken']:>7} {stats['false']:>13} {stats['missed']:>14}")
    table.append(f"{'all':<34} {total['cases']:>6} {total['broken']:>7} {total['false']:>13} {total['missed']:>14}")
    table.append(f"{'known limits':<34} {len(limits):>6}")
    notes = [f"not run: {corpus}: {why}" for corpus, why in unavailable]
    notes += [f"known limit: {corpus}: {what}: {why}" for corpus, what, why in limits]
    notes += [f"{label}: {row['case']}: seedance {row.get('rules') or 'no error'}; really: {row.get('how', '')}"
              for label, row in wrong]
    elapsed = time.monotonic() - started
    print("\n".join(table + notes))
    print(f"({elapsed:.0f} s, corpus cache {os.environ.get('SEEDANCE_CORPUS', '~/.cache/seedance-corpus')})")
    if args.results:
        _write_results(Path(args.results), table, unavailable, limits, wrong, elapsed, args.corpus)
    return 1 if args.check and (total["false"] or total["missed"]) else 0


def _write_results(path: Path, table: list, unavailable: list, limits: list, wrong: list, elapsed: float,
                   corpora) -> None:
    """The committed record of one run: the table as printed, then every wrong verdict with
    what the loader did, what was not run and the known limits, each with its reason."""
    lines = ["# Accuracy of `seedance check` against the real loader", "",
             f"Written by `bench/bench_accuracy.py --results {path.name}`"
             f"{' --corpus ' + ' --corpus '.join(corpora) if corpora else ''} ({elapsed:.0f} s, "
             f"{os.uname().machine}, Python {sys.version.split()[0]}).  A case is one ELF object of an "
             "environment (really broken: RTLD_NOW fails after what its package loads first) or one "
             "import (really broken: the import raises).", "", "```", *table, "```", ""]
    lines += ["## Wrong verdicts", ""] + ([f"- {label}: `{row['case']}`: seedance "
                                          f"{', '.join(row.get('rules') or []) or 'no error'}; really: "
                                          f"{row.get('how', '')}" for label, row in wrong] or ["None."]) + [""]
    lines += ["## Known limits (counted)", ""] + ([f"- {what}: {why}" for _c, what, why in limits] or ["None."])
    lines += ["", "## Not run here", ""] + ([f"- {corpus}: {why}" for corpus, why in unavailable] or ["None."])
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
