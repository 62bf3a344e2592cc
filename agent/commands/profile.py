"""seedance profile: analyses that run a workload under measurement (notes chapter 2)."""
from __future__ import annotations

import argparse
import json

EPILOG = """\
examples:
  seedance profile calls --plugin ./build/feature-extractor-v1.0.0
  seedance profile calls --plugin feature-extractor --input 4 --svg calls.svg
  seedance profile calls --plugin feature-extractor --report-json - | jq '.findings[].evidence.merge'

calls: runs the plugin's bench callable once (on a batch of --input requests) under the
interpreter's profiling hook and builds its call graph: functions are nodes, calls are
edges, cost(v) = cpu_ms + 0.3 * mem_mb.  Calls on different paths that return equal
outputs are redundant (rule plugin-redundant-path); the merge and its saving are shown.
"""


def configure_parser(sub) -> None:
    parser = sub.add_parser("profile", help="Profile a workload: plugin call graphs",
                            description="Run a workload under measurement and judge what was measured.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=type(parser))
    calls = actions.add_parser("calls", help="a plugin's call graph and its redundant paths",
                               epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    calls.add_argument("--plugin", required=True, metavar="NAME",
                       help="installed plugin (NAME or NAME-vVERSION) or a plugin directory")
    calls.add_argument("--input", type=_count, default=1, metavar="N",
                       help="run the bench callable on a batch of N requests (default 1)")
    calls.add_argument("--svg", metavar="FILE", help="draw the call graph, redundant paths in red (graphviz)")
    calls.add_argument("--report-json", metavar="FILE", help="write seedance.report/v1 (- for stdout)")
    calls.add_argument("--json", action="store_true", help="the report on stdout (same as --report-json -)")
    calls.add_argument("--force", action="store_true", help="overwrite an output file that is not a seedance output")
    calls.set_defaults(execute=execute_calls)
    parser.set_defaults(execute=execute)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= 100000:
        raise argparse.ArgumentTypeError(f"must be between 1 and 100000: {text!r}")
    return value


def execute(args) -> int:
    from ..errors import UsageError
    raise UsageError("profile: give an action: calls (see seedance profile --help)")


def execute_calls(args) -> int:
    from ..engine import load_rules
    from ..errors import escape_path
    from ..model import Report
    from ..output import prepare_output
    from ..profile.calls_report import callgraph_facts, profile_plugin
    from ..render import table

    json_to = "-" if args.json else args.report_json
    report_target = prepare_output(json_to, force=args.force) if json_to else None
    svg_target = prepare_output(args.svg, force=args.force, what="svg") if args.svg else None
    manifest, graph = profile_plugin(args.plugin, args.input)
    facts = callgraph_facts(manifest, graph, args.input)
    report = Report(command="profile calls", stats={"calls": len(graph.calls), "input": args.input},
                    extra={"profile": {"callgraph": {"plugin": manifest.name, "version": manifest.version,
                                                     **graph.to_dict()}}})
    report.add(load_rules().evaluate(facts))
    if svg_target is not None:
        from ..profile.callgraph import to_dot
        dot = to_dot(graph, f"{manifest.name} {manifest.version}: call graph, redundant paths in red")
        svg_target.write_bytes(_svg(dot))
    if report_target is not None:
        report_target.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        if report_target.is_stdout:
            return report.exit_code(strict=True)
    functions = graph.functions()
    print(f"{manifest.name} {manifest.version}: {len(graph.calls)} calls of {len(functions['nodes'])} functions "
          f"on a batch of {args.input}")
    for node in sorted(functions["nodes"], key=lambda n: -n["cost"])[:10]:
        print(f"  {node['name']:<40} calls {node['calls']:>5}  cost {node['cost']:>9.3f}  "
              f"({node['cpu_ms']:.3f} ms, {node['mem_mb']:.2f} MiB)")
    print(table(report), end="")
    for redundancy in graph.redundancies:
        print(f"  merge: {redundancy.to_dict()['merge']}")
    if svg_target is not None:
        print(f"call graph: {escape_path(args.svg)}")
    return report.exit_code(strict=True)


def _svg(dot) -> bytes:
    import shutil
    from ..errors import NotAvailable
    if not shutil.which("dot"):
        raise NotAvailable("profile calls --svg: graphviz's `dot` is not installed (apt-get install graphviz)")
    svg = dot.pipe(format="svg")
    # mark the picture as ours so a rerun may replace it (seedance.output recognises this)
    return svg.replace(b"<svg ", b"<!-- seedance profile calls -->\n<svg ", 1)
