#!/usr/bin/env python3
"""Static against adaptive batching at low and high load, measured in one run.

The plugins' acceptance target: at low load the static policy's P99 is worse
than the adaptive one's.  Both policies drive the same plugin (the audio-encoder example,
built here from its C source) through seedance.plugins.batching with the same open-loop schedule,
3 warm-up + 5 measured rounds each, and this prints both P99 figures and their ratio, plus
the batching behaviour that explains them (mean batch size, idle waits, voluntary context
switches of the batcher's worker thread: the notes' "idle context switches").

    .venv/bin/python bench/bench_batching.py [--low-rate 100] [--requests 100] [--json]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _builder():
    spec = importlib.util.spec_from_file_location("seedance_examples_build", ROOT / "examples/plugins/build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    from seedance.plugins.bench import load_bench_callable, measure_capacity, run_phase
    from seedance.plugins.manifest import load_manifest

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--low-rate", type=float, default=100.0)
    parser.add_argument("--requests", type=int, default=100, help="requests per low-load round")
    parser.add_argument("--high-requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="seedance-bench-") as tmp:
        plugin = _builder().build("audio-encoder-v2.0.5", Path(tmp))
        manifest = load_manifest(plugin / "manifest.yaml")
        handler = load_bench_callable(manifest)
        max_batch, max_wait = manifest.batch.max_batch_size, manifest.batch.max_wait_ms
        capacity = measure_capacity(handler, max_batch)
        high_rate = capacity * 0.25
        results = {}
        for label, rate, count in (("low", args.low_rate, args.requests), ("high", high_rate, args.high_requests)):
            for policy in ("static", "adaptive"):
                results[f"{label}/{policy}"] = run_phase(handler, policy, max_batch, max_wait, rate, count,
                                                         args.warmup, args.rounds)
    summary = {
        "plugin": f"{manifest.name} {manifest.version}", "max_batch_size": max_batch, "max_wait_ms": max_wait,
        "capacity_rps": capacity,
        "phases": {key: {k: v for k, v in phase.items() if k != "rounds"} for key, phase in results.items()},
    }
    low_static, low_adaptive = results["low/static"]["p99_ms"], results["low/adaptive"]["p99_ms"]
    summary["low_load_p99_ratio_static_over_adaptive"] = low_static / low_adaptive if low_adaptive else None
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{summary['plugin']}: max_batch_size {max_batch}, max_wait_ms {max_wait}, "
              f"full-batch capacity {capacity:.0f} req/s")
        print(f"{'phase':<16} {'rate':>8} {'P50 ms':>8} {'P99 ms':>8} {'req/s':>8} {'batch':>6} "
              f"{'idle waits':>10} {'vol. csw':>9} {'P99 cv':>7} {'drift':>6}")
        for key, phase in results.items():
            print(f"{key:<16} {phase['rate_rps']:>8.0f} {phase['p50_ms']:>8.3f} {phase['p99_ms']:>8.3f} "
                  f"{phase['throughput_rps']:>8.1f} {phase['mean_batch_size']:>6.2f} {phase['idle_waits']:>10} "
                  f"{phase['ctx_switches_voluntary']:>9} {phase['p99_cv'] * 100:>6.1f}% "
                  f"{phase['throughput_drift'] * 100:>5.2f}%")
        print(f"low load P99: static {low_static:.3f} ms, adaptive {low_adaptive:.3f} ms, "
              f"static/adaptive = {summary['low_load_p99_ratio_static_over_adaptive']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
