"""seedance run: wrap a command with the CUDA shim (affinity, quotas, per-instance handles).

The program runs unchanged under LD_PRELOAD=libseedance_shim.so (and LD_AUDIT with
--audit).  seedance and the program never share a descriptor: notes go to stderr, the
report to -o/--report-json FILE, events to --events FILE; when either goes to stdout
(`-`), the program's stdout goes to stderr, so `seedance run -o - -- prog | jq` always
reads one clean document.  The exit code is the program's (128+N when killed by signal N).
"""
from __future__ import annotations

import argparse
import sys

from ..model.errors import UsageError

EXAMPLES = """\
examples:
  seedance run --affinity gpu:1 -- python train.py          only physical GPU 1, seen as device 0
  seedance run --affinity GPU-5eedface -- ./infer           by UUID prefix (MIG-... too)
  seedance run --affinity auto --mem-limit 8Gi -- python serve.py
  seedance run --mem-limit 8Gi,1:4Gi --report-json run.json -- ./bench
  seedance run --events ev.jsonl --audit -- python -c 'import torch'
  seedance run -o - --mem-limit 1Gi -- ./app | jq .stats      the report on stdout; the app's stdout on stderr
  SEEDANCE_DISABLE=1 seedance run -- ./app                  shim loaded but bypassed (said on stderr)
"""


def configure_parser(sub):
    parser = sub.add_parser(
        "run", help="Wrap a command with the CUDA shim (affinity, quotas, per-instance handles)",
        description=__doc__.split("\n\n")[0], epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--affinity", metavar="DEV",
                        help="devices the program may see: gpu:N, N, npuN, GPU-<uuid>, MIG-<uuid>, "
                             "a comma list of those, or auto (least-loaded device)")
    parser.add_argument("--mem-limit", metavar="SIZE",
                        help="device memory quota: 8Gi for every device, 1:4Gi for device 1, or both (8Gi,1:4Gi); "
                             "Kubernetes quantities: Gi is 1024^3, G is 1000^3, a bare number is bytes")
    parser.add_argument("--events", metavar="FILE",
                        help="write the shim's events as JSON lines (- for stdout: the program's stdout "
                             "then goes to stderr)")
    parser.add_argument("-o", "--report-json", metavar="FILE", dest="report_json",
                        help="write the run report (seedance.report/v1) to FILE; - for stdout once the "
                             "program has ended (the program's stdout then goes to stderr)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite an output file that is not empty and not a seedance output")
    parser.add_argument("--audit", action="store_true",
                        help="also load the shim as LD_AUDIT: record library searches, loads and CUDA bindings")
    parser.add_argument("--follow-children", action="store_true",
                        help="wrap the programs it starts too (default: they run unwrapped)")
    parser.add_argument("--handles", choices=("per-instance", "shared"),
                        help="per-instance: the process gets a CUDA context of its own instead of the "
                             "device's shared primary context (default: what `seedance fix handle-leak` "
                             "set in ~/.config/seedance/shim.yaml, else shared)")
    parser.add_argument("--label", action="append", metavar="KEY=VALUE",
                        help="label the workload (repeat or comma-separate); a matching `seedance quota` "
                             "policy limits it from its first instruction")
    parser.add_argument("--strict", action="store_true",
                        help="refuse (exit 2) an --affinity device the driver does not have, instead of a warning")
    parser.add_argument("--plugin", metavar="NAME",
                        help="the program hosts this installed plugin: its manifest's labels label the workload")
    # the end of a run started by seedance-run, the C launcher (shim/src/launcher.c)
    parser.add_argument("--finish-group", metavar="KEY", help=argparse.SUPPRESS)
    parser.add_argument("--exit-code", type=int, help=argparse.SUPPRESS)
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS")
    parser.set_defaults(execute=execute)
    return parser


def _notice(text: str) -> None:
    print(text, file=sys.stderr)


def execute(args) -> int:
    from ..render.output import prepare_output
    from ..run.launch import RunRequest, find_command, run_program

    if args.finish_group:
        from ..run.finish import finish_launcher_group
        return finish_launcher_group(args.finish_group, args.exit_code, args.affinity, _notice)
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("seedance run: give the command after --, e.g. seedance run -- python train.py")
    exe = find_command(cmd[0])
    # every output path is checked before any work (seedance.render.output never destroys a file)
    report_out = prepare_output(args.report_json, force=args.force, what="report") if args.report_json else None
    events_out = prepare_output(args.events, force=args.force, what="event stream") if args.events else None
    # a stream on stdout: the program's stdout goes to stderr, never into the stream
    stream_on_stdout = any(t is not None and t.is_stdout for t in (report_out, events_out))
    request = RunRequest(cmd=cmd, exe=exe, affinity=args.affinity, mem_limit=args.mem_limit, strict=args.strict,
                         audit=args.audit, follow_children=args.follow_children, handles=args.handles,
                         labels=args.label or [], plugin=args.plugin, events=args.events, events_out=events_out,
                         program_stdout=2 if stream_on_stdout else None)
    result, report = run_program(request, _notice)
    if report_out is not None:
        import json

        report_out.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return result.exit_code
