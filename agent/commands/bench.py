"""seedance bench: latency/throughput of a plugin through seedance.plugins.batching (alias seedance-bench)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

EPILOG = """\
examples:
  seedance bench --plugin audio-encoder --profile latency-throughput --warmup 3
  seedance-bench --plugin=audio-encoder --profile=latency-throughput --warmup=3 --json
  seedance bench --plugin ./build/legacy-audio-encoder --batch-policy adaptive --plot latency.png

3 warm-up rounds, then 5 measured rounds, at a low and a high request rate.  Passes when
P99 std/mean over the measured rounds < 8% and throughput drift (round 5 vs 1) < 2.5%.
The bench pins itself to the idlest CPU (--no-pin: not), repeats a failing phase up to
twice, and reports the machine's load.  Exit 0 pass; 1 fail; 3 "inconclusive: machine too
noisy" (it still failed while the load per CPU was >= 1 or its threads waited on a run
queue > 2% of a round: rerun on a quieter machine); 2 bad input.  The result of an installed plugin is kept beside it, where
`seedance plugin verify` uses it as the batch-static trap's measured metric.
"""


def configure_parser(sub) -> None:
    parser = sub.add_parser("bench", help="Benchmark a plugin (latency/throughput)",
                            description="Benchmark a plugin's bench callable through seedance.plugins.batching.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--plugin", metavar="NAME",
                       help="installed plugin (NAME or NAME-vVERSION) or a plugin directory")
    which.add_argument("--variants", metavar="NAME,NAME,...",
                       help="bench each precision variant (a plugin whose manifest declares `accuracy:`) "
                            "and write name,latency_ms,accuracy for `seedance pareto`")
    parser.add_argument("--csv", metavar="FILE", default="-",
                        help="with --variants: where the CSV goes (default - for stdout)")
    parser.add_argument("--profile", default="latency-throughput", choices=("latency-throughput",))
    parser.add_argument("--warmup", type=int, default=3, help="warm-up rounds (default 3)")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (default 5)")
    parser.add_argument("--batch-policy", choices=("adaptive", "static"),
                        help="override the manifest's batch_policy for this run")
    parser.add_argument("--low-rate", type=float, default=100.0, metavar="RPS", help="low request rate (default 100/s)")
    parser.add_argument("--high-rate", type=float, metavar="RPS",
                        help="high request rate (default: a quarter of the measured full-batch capacity)")
    parser.add_argument("--low-requests", type=int, default=100, metavar="N", help="requests per low-rate round")
    parser.add_argument("--high-requests", type=int, default=1000, metavar="N", help="requests per high-rate round")
    parser.add_argument("--no-pin", dest="pin", action="store_false",
                        help="do not pin the bench to the idlest CPU")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="write a PNG of latency over rounds")
    parser.add_argument("--force", action="store_true",
                        help="let --plot replace a file that is not a seedance output")
    parser.set_defaults(execute=execute)


def execute(args) -> int:
    from ..model.errors import BadInput
    from ..plugins import archive
    from ..plugins.bench import BenchConfig, plot, run_bench
    from ..plugins.manifest import MANIFEST_NAME, load_manifest
    from ..plugins.store import Store

    if args.low_requests < 1 or args.high_requests < 1:
        raise BadInput("bench: --low-requests and --high-requests must be >= 1")
    from ..render.output import prepare_output
    plot_target = prepare_output(args.plot, force=args.force, what="plot") if args.plot else None
    store = Store()
    if args.variants:
        return _variants(args, store)
    installed = None
    if Path(args.plugin).is_dir():
        manifest = load_manifest(Path(args.plugin) / MANIFEST_NAME)
    else:
        name, version = archive.split_request(args.plugin)
        installed = store.get(name, version)
        manifest = installed.manifest
    config = BenchConfig(warmup=args.warmup, rounds=args.rounds, low_rate=args.low_rate,
                         high_rate=args.high_rate, low_requests=args.low_requests,
                         high_requests=args.high_requests, policy=args.batch_policy, pin=args.pin)
    result = run_bench(manifest, config)
    result["plot"] = None
    if plot_target is not None:
        import io
        image = io.BytesIO()
        plot(result, image)
        plot_target.write_bytes(image.getvalue())
        result["plot"] = args.plot
    if installed is not None:
        with store.locked():
            store.write_bench(installed, result)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _render(result)
    return exit_code(result)


def _variants(args, store) -> int:
    """Bench each variant; its latency is the median P50 of the low-rate rounds (the
    per-request latency a lightly loaded service sees), its accuracy what its manifest
    declares (measured by whoever built the variant: seedance cannot know the task)."""
    import csv
    import io
    import math
    import sys

    from ..model.errors import BadInput, escape_path
    from ..render.output import prepare_output
    from ..plugins import archive
    from ..plugins.bench import BenchConfig, run_bench
    from ..plugins.manifest import MANIFEST_NAME, load_manifest

    target = prepare_output(args.csv, force=args.force, what="CSV")
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    if len(names) < 2:
        raise BadInput("bench --variants: give at least two variants, comma-separated")
    manifests = []
    for name in names:
        if Path(name).is_dir():
            manifest = load_manifest(Path(name) / MANIFEST_NAME)
        else:
            plugin, version = archive.split_request(name)
            manifest = store.get(plugin, version).manifest
        accuracy = manifest.raw.get("accuracy")
        if isinstance(accuracy, bool) or not isinstance(accuracy, (int, float)) or not math.isfinite(accuracy):
            raise BadInput(f"bench --variants: {escape_path(manifest.path)}: no numeric `accuracy:` in the manifest")
        manifests.append((name, manifest, float(accuracy)))
    config = BenchConfig(warmup=args.warmup, rounds=args.rounds, low_rate=args.low_rate,
                         high_rate=args.high_rate, low_requests=args.low_requests,
                         high_requests=args.high_requests, policy=args.batch_policy, pin=args.pin)
    rows = io.StringIO()
    writer = csv.writer(rows, lineterminator="\n")
    writer.writerow(["name", "latency_ms", "accuracy"])
    for index, (name, manifest, accuracy) in enumerate(manifests, 1):
        print(f"seedance: bench {index}/{len(manifests)}: {manifest.ident}", file=sys.stderr, flush=True)
        result = run_bench(manifest, config)
        low = next(iter(result["rates"].values()))
        writer.writerow([f"{manifest.name}-{manifest.version}" if name == str(manifest.root) else name,
                         f"{low['p50_ms']:.4f}", f"{accuracy:g}"])
    target.write_text(rows.getvalue())
    return 0


EXIT_INCONCLUSIVE = 3  # neither a pass nor a failure of the plugin: the machine was too noisy


def exit_code(result: dict) -> int:
    from ..plugins.bench import VERDICT_NOISY, VERDICT_PASS
    return {VERDICT_PASS: 0, VERDICT_NOISY: EXIT_INCONCLUSIVE}.get(result["verdict"], 1)


def _render(result: dict) -> None:
    print(f"{result['plugin']} {result['version']}: {result['policy']} batching "
          f"(max_batch_size {result['max_batch_size']}, max_wait_ms {result['max_wait_ms']}), "
          f"{result['warmup']} warm-up + {result['rounds']} measured rounds")
    for label, phase in result["rates"].items():
        print(f"{label} load, {phase['rate_rps']:.0f} req/s x {phase['requests_per_round']} requests:")
        print("  round    P50 ms    P99 ms   req/s   batch  idle-waits")
        for entry in phase["rounds"]:
            print(f"  {entry['round']:>5} {entry['p50_ms']:>9.3f} {entry['p99_ms']:>9.3f} "
                  f"{entry['throughput_rps']:>7.1f} {entry['mean_batch_size']:>7.2f} {entry['idle_waits']:>11}")
        print(f"  {phase['verdict'].upper()}: P99 std/mean {phase['p99_cv'] * 100:.2f}% (< 8%), throughput drift "
              f"{phase['throughput_drift'] * 100:.2f}% (< 2.5%); attempt(s) {phase['attempts']}, "
              f"load/CPU up to {phase['max_load_per_cpu']:.2f}, run-queue wait up to "
              f"{phase['max_runqueue_share'] * 100:.1f}% of a round")
    if result.get("plot"):
        print(f"plot: {result['plot']}")
    machine = result["machine"]
    pinned = f"pinned to CPU {machine['pinned_cpu']}" if machine["pinned_cpu"] is not None else "not pinned"
    print(f"machine: {machine['cpus']} CPU(s), load/CPU {machine['load_per_cpu_before']:.2f} before, "
          f"{machine['load_per_cpu_after']:.2f} after; {pinned}")
    print(result["verdict"].upper() if result["verdict"] != "inconclusive: machine too noisy"
          else "INCONCLUSIVE: machine too noisy to judge (exit 3); rerun on a quieter machine")
