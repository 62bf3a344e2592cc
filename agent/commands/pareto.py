"""seedance pareto: the cost-accuracy Pareto frontier of precision variants (notes 2.5)."""
from __future__ import annotations

import argparse
import json

from ._argtypes import add_report_flags, finite_float, positive_float

EPILOG = """\
examples:
  seedance pareto results.csv
  seedance pareto results.csv --baseline-accuracy 65 --cost-per-ms 0.002 --plot pareto.png
  seedance pareto results.csv --report-json - | jq '.profile.pareto.frontier[].name'

The CSV has a header with the columns name,latency_ms,accuracy and optionally
cost_per_ms (per row; --cost-per-ms is the default for rows without it, 1.0 if unset);
a byte-order mark before it (as spreadsheets write) is fine.  The file is streamed: at
most 1 GiB, 20 million rows, 1024 characters a cell, 10000 variants on the frontier;
the first 1000 dominated variants are listed and the rest counted.
A row is dominated when another is at least as fast and as accurate and better in one.
ROI = (accuracy - baseline) / (latency_ms * cost_per_ms); the baseline defaults to the
lowest accuracy in the file.  The decay point is the first frontier point, by latency,
after which dROI/dlatency < -0.035.
"""


def configure_parser(sub) -> None:
    parser = sub.add_parser("pareto", help="Cost-accuracy Pareto frontier of precision variants",
                            description="Find the non-dominated precision variants, their ROI and the decay point.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", metavar="RESULTS.csv", help="name,latency_ms,accuracy[,cost_per_ms]")
    parser.add_argument("--baseline-accuracy", type=finite_float, metavar="A",
                        help="accuracy that earns no return (default: the lowest in the file)")
    parser.add_argument("--cost-per-ms", type=positive_float, default=1.0, metavar="C",
                        help="cost of one millisecond, for rows without a cost_per_ms column (default 1.0)")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the frontier, dominated and decay points")
    add_report_flags(parser)
    parser.set_defaults(execute=execute)


def execute(args) -> int:
    from ..model.errors import escape_path
    from ..model.report import Report
    from ..render.output import prepare_output
    from ..profile import pareto

    json_to = "-" if args.json else args.report_json
    report_target = prepare_output(json_to, force=args.force) if json_to else None
    plot_target = prepare_output(args.plot, force=args.force, what="plot") if args.plot else None
    result = pareto.analyse_file(args.csv, default_cost_per_ms=args.cost_per_ms,
                                 baseline_accuracy=args.baseline_accuracy)
    if plot_target is not None:
        pareto.plot(result, plot_target)
    if report_target is not None:
        report = Report(command="pareto", stats={"variants": result.variants},
                        extra={"profile": {"pareto": result.to_dict()}})
        report_target.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        if report_target.is_stdout:
            return 0
    _render(result)
    if plot_target is not None:
        print(f"plot: {escape_path(args.plot)}")
    return 0


def _render(result) -> None:
    # variant names come from a file someone else may have written: an escape sequence or a
    # quoted newline in one must not paint the terminal or forge a row (check's escaping)
    from ..model.errors import escape_path

    for note in result.notes:
        print(f"note: {note}")
    print(f"{result.variants} variants, {len(result.frontier)} on the frontier "
          f"(baseline accuracy {result.baseline_accuracy:g})")
    print(f"  {'variant':<16} {'latency ms':>10} {'accuracy':>9} {'ROI':>10} {'dROI/dlat':>10}")
    for point in result.frontier:
        v = point.variant
        slope = "" if point.slope_to_next is None else f"{point.slope_to_next:.4f}"
        mark = "  <- decay point" if v.name == result.decay_point else ""
        print(f"  {escape_path(v.name):<16} {v.latency_ms:>10g} {v.accuracy:>9g} {point.roi:>10.4f} {slope:>10}{mark}")
    for name, by in sorted(result.dominated.items()):
        print(f"  dominated: {escape_path(name)} (by {escape_path(by)})")
    unlisted = result.dominated_total - len(result.dominated)
    if unlisted:
        print(f"  dominated: {unlisted} more, not listed")
    if result.decay_point is None:
        print(f"no decay point: dROI/dlatency stays >= {result.decay_slope} along the frontier")
