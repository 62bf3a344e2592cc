"""seedance profile: analyses that run a workload under measurement and judge what was measured.

The work is seedance.profile.reports'; this module parses, calls it and renders."""
from __future__ import annotations

import argparse
import json
import sys

from ._argtypes import add_report_flags, bounded_int

EPILOG = """\
examples:
  seedance profile memory --from-trace events.jsonl --output frag.bin --heatmap frag.png
  seedance profile memory --from-torch-snapshot snapshot.pickle --terminal
  seedance profile show frag.bin
  seedance profile launches --power-csv smi.csv --timeline launches.png -- python train.py
  seedance profile launches --from-trace events.jsonl --dcgm scrapes.prom --report-json -
  seedance profile calls --plugin ./build/feature-extractor-v1.0.0
  seedance profile calls --plugin feature-extractor --input 4 --svg calls.svg
  seedance profile calls --plugin feature-extractor --report-json - | jq '.findings[].evidence.merge'

memory: replays allocation events of one device (the JSON lines of `seedance run
--events`, docs/profile.md) and samples its address map: free blocks, largest-free ratio,
mean free block, verdict (healthy > 35% and > 64 MiB; danger < 12% or < 8 MiB); rule
gpu-memory-fragmented.  frag.bin keeps every sample's page-occupancy map.

launches: the shim timestamps cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel
and cuGraphLaunch per calling library; per library (and plugin): launches/s, the interval
distribution, coverage of the run, energy from power samples (NVML live, --power-csv,
--dcgm); rules launch-bound (median interval < 50 us) and sm-underused (SM activity < 30%,
DCGM only; otherwise "not observed").

calls: runs the plugin's bench callable once (on a batch of --input requests) under the
interpreter's profiling hook and builds its call graph: functions are nodes, calls are
edges, cost(v) = cpu_ms + 0.3 * mem_mb.  Calls on different paths that return equal
outputs are redundant (rule plugin-redundant-path); the merge and its saving are shown.
"""


def configure_parser(sub) -> None:
    parser = sub.add_parser("profile", help="Profile a workload: GPU memory maps, plugin call graphs",
                            description="Run a workload under measurement and judge what was measured.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=type(parser))
    calls = actions.add_parser("calls", help="a plugin's call graph and its redundant paths",
                               epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    calls.add_argument("--plugin", required=True, metavar="NAME",
                       help="installed plugin (NAME or NAME-vVERSION) or a plugin directory")
    calls.add_argument("--input", type=bounded_int(1, 100000), default=1, metavar="N",
                       help="run the bench callable on a batch of N requests (default 1)")
    calls.add_argument("--svg", metavar="FILE", help="draw the call graph, redundant paths in red (graphviz)")
    add_report_flags(calls)
    calls.set_defaults(execute=execute_calls)
    memory = actions.add_parser("memory", help="GPU memory fragmentation over time",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_memory_arguments(memory)
    launches = actions.add_parser("launches", help="kernel launches and energy per calling library",
                                  epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_launch_arguments(launches)
    show = actions.add_parser("show", help="print a frag.bin: metrics per sample and the terminal map")
    show.add_argument("file", metavar="FRAG.bin")
    show.add_argument("--json", action="store_true", help="metrics per sample as JSON")
    show.add_argument("--heatmap", metavar="FILE.png", help="also draw the heat map")
    show.add_argument("--force", action="store_true", help="overwrite an output file that is not a seedance output")
    show.set_defaults(execute=execute_show)
    parser.set_defaults(execute=execute)


def execute(args) -> int:
    from ..model.errors import UsageError
    raise UsageError("profile: give an action: memory, launches, show or calls (see seedance profile --help)")


def add_memory_arguments(parser) -> None:
    """The memory profiler's flags; the `seedance-profiler` alias (seedance.cli) shares them."""
    parser.add_argument("--gpu-id", type=int, default=0, metavar="N", help="device to profile (default 0)")
    from ..render.progress import add_progress_flags
    add_progress_flags(parser)
    parser.add_argument("--page-size", default="4Ki", metavar="SIZE",
                        help="page size: allocations round up to it (4Ki, 2Mi: sizes as in docs/units.md; default 4Ki)")
    parser.add_argument("--sample-interval", default="10ms", metavar="T", help="sample every T (10ms, 0.5s; default 10ms)")
    parser.add_argument("--output", metavar="FRAG.bin", help="write every sample's page map (docs/profile.md)")
    parser.add_argument("--heatmap", metavar="FILE.png", help="time x address heat map, danger intervals marked")
    parser.add_argument("--terminal", action="store_true", help="print the map with unicode blocks")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--from-trace", metavar="FILE", help="offline: event JSON lines (run --events format)")
    source.add_argument("--from-torch-snapshot", metavar="FILE",
                        help="offline: a torch.cuda.memory._dump_snapshot pickle")
    source.add_argument("--pid", type=int, metavar="PID", help="a program already wrapped by seedance run or the agent")
    parser.add_argument("--capacity", metavar="SIZE", help="device capacity when the trace has no device record")
    add_report_flags(parser)
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD", help="run CMD under the shim and profile it")
    parser.set_defaults(execute=execute_memory)


def add_launch_arguments(parser) -> None:
    parser.add_argument("--gpu-id", type=int, default=0, metavar="N", help="device whose power is read (default 0)")
    from ..render.progress import add_progress_flags
    add_progress_flags(parser)
    parser.add_argument("--from-trace", metavar="FILE", help="offline: event JSON lines (run --events format)")
    power = parser.add_mutually_exclusive_group()
    power.add_argument("--power-csv", metavar="FILE",
                       help="nvidia-smi --query-gpu=timestamp,index,power.draw,utilization.gpu --format=csv -lms N log")
    power.add_argument("--dcgm", metavar="FILE", help="dcgm-exporter scrapes (Prometheus text; docs/profile.md)")
    parser.add_argument("--sample-interval", default="100ms", metavar="T", help="live NVML power every T (default 100ms)")
    parser.add_argument("--bin", default="10ms", metavar="T", help="time bin of the coverage and the timeline (default 10ms)")
    parser.add_argument("--timeline", metavar="FILE.png", help="launches per library on top, power below")
    add_report_flags(parser)
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD", help="run CMD under the shim and profile it")
    parser.set_defaults(execute=execute_launches)


def _notice(line: str) -> None:
    print(line, file=sys.stderr)


def _stepper(args):
    """The progress line of each step of the profile, on a terminal's stderr only."""
    from ..render.progress import Step, wanted

    enabled = wanted(args)
    return lambda label: Step(label, enabled=enabled)


def _write_report(target, report) -> None:
    target.write_text(json.dumps(report.to_dict(), indent=2) + "\n")


def execute_launches(args) -> int:
    from ..model.errors import UsageError
    from ..profile.reports import parse_interval, profile_launches_report, read_power_log
    from ..render.output import prepare_output

    bin_s = parse_interval(args.bin, "--bin")
    interval = parse_interval(args.sample_interval)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if bool(cmd) == bool(args.from_trace):
        raise UsageError("profile launches: give -- CMD or --from-trace FILE (one of them)")
    json_to = "-" if args.json else args.report_json
    report_target = prepare_output(json_to, force=args.force, what="report") if json_to else None
    png_target = prepare_output(args.timeline, force=args.force, what="timeline") if args.timeline else None
    log = read_power_log(args.gpu_id, power_csv=args.power_csv, dcgm=args.dcgm)
    profiled = profile_launches_report(cmd, from_trace=args.from_trace, log=log, gpu_id=args.gpu_id, bin_s=bin_s,
                                       interval=interval, step=_stepper(args), notice=_notice)
    report = profiled.report
    if png_target is not None:
        from ..profile import launches as launch_profile
        launch_profile.timeline_png(profiled.profile, profiled.launches, png_target,
                                    "kernel launches per library, power below")
    if profiled.exit_code:
        print(f"seedance: note: the program exited with {profiled.exit_code}", file=sys.stderr)
    if report_target is not None:
        _write_report(report_target, report)
        if report_target.is_stdout:
            return report.exit_code()
    _render_launches(profiled.profile)
    from ..render.text import table
    print(table(report), end="")
    return report.exit_code()


def _render_launches(profile) -> None:
    from ..model.errors import escape_path   # library paths and plugin names come from the traced program

    print(f"{profile.launches} launches over {profile.span_s:.3f} s from {len(profile.libraries)} libraries")
    for lib in profile.libraries:
        name = escape_path(lib.library) + (f" (plugin {escape_path(lib.plugin)})" if lib.plugin else "")
        energy = f", {lib.energy_j:.3f} J ({lib.energy_share * 100:.1f}%)" if lib.energy_share is not None else ""
        print(f"  {name}: {lib.launches} launches, {lib.launches_per_s:.1f}/s, median gap "
              f"{lib.interval_us['p50']:.2f} us (p90 {lib.interval_us['p90']:.2f}), coverage "
              f"{lib.coverage * 100:.1f}%{energy}")
    if profile.energy_j is not None:
        print(f"  energy: {profile.energy_j:.3f} J from {escape_path(profile.power_source)}, "
              f"{profile.idle_energy_j:.3f} J "
              "with no launch (idle)")
    else:
        print(f"  energy: {escape_path(profile.power_note)}")
    if profile.sm_active is None:
        print(f"  {escape_path(profile.sm_note)}")
    else:
        print(f"  SM activity: {profile.sm_active * 100:.1f}% (mean, {profile.power_source})")


def execute_memory(args) -> int:
    from ..model.errors import UsageError
    from ..profile import memory
    from ..profile.reports import MemorySource, parse_interval, profile_memory_report
    from ..render.output import prepare_output

    page = memory.parse_size(args.page_size, "--page-size")
    interval = parse_interval(args.sample_interval)
    capacity = memory.parse_size(args.capacity, "--capacity") if args.capacity else None
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not (args.from_trace or args.from_torch_snapshot or args.pid or cmd):
        raise UsageError("profile memory: give -- CMD, --pid PID, --from-trace FILE or --from-torch-snapshot FILE")
    if cmd and (args.from_trace or args.from_torch_snapshot or args.pid):
        raise UsageError("profile memory: -- CMD cannot be combined with --pid or an offline source")
    json_to = "-" if args.json else args.report_json
    targets = {name: prepare_output(path, force=args.force, what=what) if path else None
               for name, path, what in (("report", json_to, "report"), ("bin", args.output, "frag.bin"),
                                        ("png", args.heatmap, "heat map"))}
    source = MemorySource(cmd=cmd, pid=args.pid, from_trace=args.from_trace,
                          from_torch_snapshot=args.from_torch_snapshot)
    profiled = profile_memory_report(source, device=args.gpu_id, page=page, interval=interval, capacity=capacity,
                                     step=_stepper(args), notice=_notice)
    code = _finish_memory(profiled, targets, args)
    if profiled.exit_code:
        print(f"seedance: note: the program exited with {profiled.exit_code}", file=sys.stderr)
    return code


def _finish_memory(profiled, targets, args) -> int:
    from ..profile import fragbin, heatmap

    profile, report = profiled.profile, profiled.report
    if targets["bin"] is not None:
        targets["bin"].write_bytes(profiled.encoded)
    frag = fragbin.decode(profiled.encoded) if (targets["png"] is not None or args.terminal) else None
    verdicts = [m.verdict for m in profile.samples]
    if targets["png"] is not None:
        heatmap.heatmap_png(frag, verdicts, targets["png"], f"device {profile.device}: pages in use over time")
    if targets["report"] is not None:
        _write_report(targets["report"], report)
        if targets["report"].is_stdout:
            return report.exit_code()
    _render_memory(profile)
    if args.terminal:
        import shutil
        print(heatmap.terminal_view(frag, verdicts, width=shutil.get_terminal_size((100, 24)).columns), end="")
    from ..render.text import table
    print(table(report), end="")
    return report.exit_code()


def _render_memory(profile) -> None:
    final = profile.final
    print(f"device {profile.device}: {profile.events} events, {len(profile.samples)} samples every "
          f"{profile.interval * 1000:g} ms, page {profile.page_size} B, capacity {profile.capacity} B")
    verdicts = {}
    for m in profile.samples:
        verdicts[m.verdict] = verdicts.get(m.verdict, 0) + 1
    print("  samples: " + ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items())))
    print(f"  final: {final.free_blocks} free blocks, {final.free_bytes} B free, largest "
          f"{final.largest_free_ratio * 100:.1f}%, mean {final.mean_free_block_bytes / (1 << 20):.2f} MiB: {final.verdict}")
    if profile.requested_interval and profile.interval > profile.requested_interval:
        print(f"  note: the trace spans more intervals of {profile.requested_interval * 1000:g} ms than the "
              f"samples kept; a sample every {profile.interval * 1000:g} ms instead (docs/profile.md)")
    if profile.unmatched_frees:
        print(f"  note: {profile.unmatched_frees} free(s) of addresses never seen allocated (events lost or before the trace)")


def execute_show(args) -> int:
    from ..model.errors import escape_path
    from ..render.output import prepare_output
    from ..profile import fragbin, heatmap

    png = prepare_output(args.heatmap, force=args.force, what="heat map") if args.heatmap else None
    frag = fragbin.read_file(args.file, escape_path(args.file))
    metrics = fragbin.metrics_of(frag)
    if args.json:
        print(json.dumps({"schema": "seedance.frag/v1", "device": frag.device, "base": frag.base,
                          "capacity": frag.capacity, "page_size": frag.page_size,
                          "sample_interval_s": frag.interval, "samples": [m.to_dict() for m in metrics]}, indent=2))
    else:
        import shutil
        print(f"{escape_path(args.file)}: device {frag.device}, {len(frag.samples)} samples every "
              f"{frag.interval * 1000:g} ms, page {frag.page_size} B, capacity {frag.capacity} B")
        print(heatmap.terminal_view(frag, [m.verdict for m in metrics],
                                    width=shutil.get_terminal_size((100, 24)).columns), end="")
        final = metrics[-1] if metrics else None
        if final:
            print(f"final: {final.free_blocks} free blocks, largest {final.largest_free_ratio * 100:.1f}%, "
                  f"mean {final.mean_free_block_bytes / (1 << 20):.2f} MiB: {final.verdict}")
    if png is not None:
        heatmap.heatmap_png(frag, [m.verdict for m in metrics], png, f"{args.file}: pages in use over time")
    return 0


def execute_calls(args) -> int:
    from ..model.errors import escape_path
    from ..profile.reports import call_graph_svg, profile_calls_report
    from ..render.output import prepare_output
    from ..render.text import table

    json_to = "-" if args.json else args.report_json
    report_target = prepare_output(json_to, force=args.force) if json_to else None
    svg_target = prepare_output(args.svg, force=args.force, what="svg") if args.svg else None
    profiled = profile_calls_report(args.plugin, args.input)
    manifest, graph, report = profiled.manifest, profiled.graph, profiled.report
    if svg_target is not None:
        svg_target.write_bytes(call_graph_svg(profiled))
    if report_target is not None:
        _write_report(report_target, report)
        if report_target.is_stdout:
            return report.exit_code(strict=True)
    functions = graph.functions()
    # names come from the plugin's manifest and code: one line each, whatever they hold
    print(f"{escape_path(manifest.name)} {escape_path(manifest.version)}: {len(graph.calls)} calls of "
          f"{len(functions['nodes'])} functions "
          f"on a batch of {args.input}")
    for node in sorted(functions["nodes"], key=lambda n: -n["cost"])[:10]:
        print(f"  {escape_path(node['name']):<40} calls {node['calls']:>5}  cost {node['cost']:>9.3f}  "
              f"({node['cpu_ms']:.3f} ms, {node['mem_mb']:.2f} MiB)")
    print(table(report), end="")
    for redundancy in graph.redundancies:
        print(f"  merge: {escape_path(redundancy.to_dict()['merge'])}")
    if svg_target is not None:
        print(f"call graph: {escape_path(args.svg)}")
    return report.exit_code(strict=True)
