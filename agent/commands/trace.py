"""seedance trace: what a process really loads, the loader's own errors, and the CUDA
memory it still holds when it exits, live, with eBPF (bcc).

usage: seedance trace [--pid PID ... | -- CMD ARGS] [--backend auto|ebpf|audit]
                      [--json] [--duration S] [--report-json FILE] [--strict]

Events stream as lines (or JSONL with --json); findings come from the same rules as
`seedance check` and print as they are raised.  Without eBPF (no bcc, not root, no
kernel headers, lockdown), --backend auto says why in one line and traces a launched
command through the shim's LD_AUDIT module instead.  Ctrl-C detaches every probe.
"""
from __future__ import annotations

import argparse
import json
import sys

from ..errors import NotAvailable, UsageError

EPILOG = """\
examples:
  seedance trace -- python train.py           trace a command from its first library
  seedance trace --pid 4242 --duration 30     attach to a running process for 30 s
  seedance trace --json -- ./app | jq 'select(.event=="finding")'
  seedance trace --report-json r.json -- ./app   findings in the check's report schema
  seedance trace --backend audit -- ./app     no eBPF: LD_AUDIT only (no root needed)
  seedance trace                              every process on this host, until Ctrl-C
  seedance trace --ebpf                       print the BPF program and exit
"""


def configure_parser(sub):
    parser = sub.add_parser(
        "trace", help="Trace library loads, loader errors and CUDA memory live (eBPF)",
        description="Trace dlopen, the link map, the loader's errors and CUDA allocations of "
                    "a launched command, of running processes (--pid) or of the whole host, "
                    "and raise findings live through the rules of `seedance check`.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pid", type=_pid, nargs="+", action="extend", default=[], metavar="PID",
                        help="trace running processes (eBPF only)")
    parser.add_argument("--backend", choices=("auto", "ebpf", "audit"), default="auto",
                        help="auto: eBPF, else LD_AUDIT for a launched command (default)")
    parser.add_argument("--json", action="store_true", help="stream events and findings as JSON lines")
    parser.add_argument("--duration", type=_seconds, metavar="S", help="stop tracing after S seconds")
    parser.add_argument("--report-json", metavar="FILE",
                        help="write the seedance.report/v1 JSON to FILE ('-': stdout, after the stream)")
    parser.add_argument("--strict", action="store_true",
                        help="also report strict-only rules; exit 1 on warnings too")
    parser.add_argument("--quiet", "-q", action="store_true", help="print findings only, not every event")
    parser.add_argument("--buffer-pages", type=_pages, default=256, metavar="N",
                        help="eBPF ring buffer size in pages, a power of two (default 256); "
                             "events that do not fit are counted as lost")
    parser.add_argument("--ebpf", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS",
                        help="command to launch and trace")
    parser.set_defaults(execute=execute)
    return parser


def _pid(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}")
    return int(text)


def _pages(text: str) -> int:
    if not text.isdigit() or int(text) < 1 or int(text) & (int(text) - 1):
        raise argparse.ArgumentTypeError(f"not a power of two: {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1
    if value <= 0:
        raise argparse.ArgumentTypeError(f"not a positive number of seconds: {text!r}")
    return value


def execute(args) -> int:
    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if args.ebpf:
        from ..probes import loader
        sys.stdout.write(loader.program_text())
        return 0
    if command and args.pid:
        raise UsageError("seedance trace: give --pid or a command, not both")
    if args.cmd and not command:
        raise UsageError("seedance trace: no command after --")

    from ..trace import env

    backend = args.backend
    if backend == "audit" and not command:
        raise UsageError("seedance trace: --backend audit traces a launched command (-- CMD); "
                         "LD_AUDIT cannot attach to running processes")
    if backend in ("auto", "ebpf"):
        problem = env.ebpf_problem()
        if problem and backend == "ebpf":
            raise NotAvailable(f"eBPF unavailable: {problem}")
        if problem and not command:
            raise NotAvailable(f"eBPF unavailable: {problem}; --pid and host-wide tracing need eBPF "
                               "(LD_AUDIT only covers a launched command)")
        if problem:
            print(f"seedance trace: eBPF unavailable ({problem}); falling back to LD_AUDIT",
                  file=sys.stderr, flush=True)
            backend = "audit"
        else:
            backend = "ebpf"
    return _trace(args, command, backend)


class _Output:
    """Renders the stream: one line per event (or a JSON object), findings as raised."""

    def __init__(self, as_json: bool, quiet: bool):
        self.as_json = as_json
        self.quiet = quiet

    def event(self, event) -> None:
        if self.quiet:
            return
        if self.as_json:
            print(json.dumps(event.to_dict(), default=str), flush=True)
        else:
            print(event.line(), flush=True)

    def finding(self, finding) -> None:
        if self.as_json:
            print(json.dumps({"event": "finding", **finding.to_dict()}, default=str), flush=True)
        else:
            print(f"{finding.severity.upper():<7} {finding.layer} {finding.rule}: {finding.message}", flush=True)
            if finding.evidence.get("loader_message"):
                print(f"        loader: {finding.evidence['loader_message']}", flush=True)

    @staticmethod
    def notice(text: str) -> None:
        print(f"seedance trace: {text}", file=sys.stderr, flush=True)


def _trace(args, command: list, backend: str) -> int:
    from ..engine import load_rules
    from ..model import Report
    from ..trace.facts import LiveFacts, mapped_lib_facts

    rules = load_rules()
    report = Report(command="trace")
    out = _Output(args.json, args.quiet)
    live = LiveFacts()

    def judge(facts) -> None:
        for fact in facts:
            # The loader's own error is not a static guess: strict-only rules (kept for
            # scans, where a host may provide the symbol) apply to what it reported.
            strict = args.strict or bool(fact.data.get("loader_message"))
            new = [f for f in rules.evaluate([fact], strict=strict)
                   if f.key() not in {seen.key() for seen in report.findings}]
            report.add(new)
            for finding in new:
                out.finding(finding)

    def on_event(event) -> None:
        facts = live.feed(event)  # first: it adds what the line shows (inode, library)
        out.event(event)
        judge(facts)

    summary = None
    if backend == "ebpf":
        from ..trace.session import EbpfUnavailable, TraceSession

        session = TraceSession(pids=args.pid, command=command, duration=args.duration,
                               on_notice=out.notice, files=live.files, cuda_events=not args.quiet,
                               buffer_pages=args.buffer_pages,
                               on_tick=lambda: judge(mapped_lib_facts(live.live_pids())))
        for pid in args.pid:
            judge(live.seed(pid))
        judge(mapped_lib_facts(args.pid))
        try:
            summary = session.run(on_event)
        except EbpfUnavailable as exc:
            # the checks passed but bcc could not compile or attach: same fallback, same
            # one line, as long as nothing was launched yet (it never is before attach)
            if args.backend != "auto" or not command:
                raise
            out.notice(f"eBPF unavailable ({exc}); falling back to LD_AUDIT")
    if summary is None:
        from ..trace.audit import run_audit

        summary = run_audit(command, on_event, on_notice=out.notice, duration=args.duration)
    judge(mapped_lib_facts(live.live_pids()))

    report.stats = {"events": summary.events, "lost_events": summary.lost, "backend": summary.backend,
                    "findings": len(report.findings)}
    report.extra = {"trace": summary.to_dict()}
    try:
        from ..collect.host import host_facts
        report.host = host_facts()
    except ImportError:  # pragma: no cover
        pass
    out.notice(f"{summary.events} events, {summary.lost} lost, {len(report.findings)} findings "
               f"({summary.backend}; {summary.stop_reason or 'done'})")
    if args.report_json:
        from ..render import write_json
        write_json(report, args.report_json)
    return report.exit_code(args.strict)
