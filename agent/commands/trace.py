"""seedance trace: what a process really loads, the loader's own errors, and the CUDA
memory it still holds when it exits, live, with eBPF (bcc).

usage: seedance trace [--pid PID ... | -- CMD ARGS] [--backend auto|ebpf|audit]
                      [--json] [-o FILE] [--duration DURATION] [--report-json FILE] [--strict]

Events stream as lines (or JSONL with --json) to stdout or, as strace and bpftrace have
it, to -o FILE; findings come from the same rules as `seedance check` and print as they
are raised.  While the stream (or --report-json -) owns stdout, the traced command's
stdout goes to stderr, so `seedance trace --json -- ./app | jq` never sees the program's
own lines.  Without eBPF (no bcc, not root, no
kernel headers, lockdown), --backend auto says why in one line and traces a launched
command through the shim's LD_AUDIT module instead.  Ctrl-C detaches every probe.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from ..model.errors import NotAvailable, UsageError, escape_path
from ..model.units import duration_type

EPILOG = """\
examples:
  seedance trace -- python train.py           trace a command from its first library
  seedance trace --pid 4242 --duration 30s    attach to a running process for 30 s
  seedance trace --json -- ./app | jq 'select(.event=="finding")'
  seedance trace --json -o events.jsonl -- ./app   the stream to a file, the program's stdout kept
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
    parser.add_argument("-o", "--output", metavar="FILE", default="-",
                        help="write the stream to FILE instead of stdout (then the traced command "
                             "keeps its stdout)")
    parser.add_argument("--duration", type=duration_type("--duration"), metavar="DURATION",
                        help="stop tracing after DURATION (10s, 1m30s; a bare number is seconds)")
    from ..render.progress import add_progress_flags
    add_progress_flags(parser)
    parser.add_argument("--report-json", metavar="FILE",
                        help="write the seedance.report/v1 JSON to FILE ('-': stdout, after the stream)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite -o/--report-json FILE even if it is not a seedance output")
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

    # every output path is checked before a probe is compiled or a command launched
    from ..render.output import prepare_output
    args.stream_target = prepare_output(args.output, force=args.force, what="trace stream")
    args.report_target = (prepare_output(args.report_json, force=args.force)
                          if args.report_json else None)
    if (args.report_target and not args.report_target.is_stdout and not args.stream_target.is_stdout
            and args.report_target.real == args.stream_target.real):
        raise UsageError("seedance trace: -o and --report-json name the same file")

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
    """Renders the stream into one handle: a line per event (or a JSON object), findings
    as raised.  Notices go to stderr, never into the stream."""

    def __init__(self, handle, as_json: bool, quiet: bool, target=None):
        self.handle = handle
        self.target = target
        self.as_json = as_json
        self.quiet = quiet

    def _line(self, text: str) -> None:
        try:
            self.handle.write(text + "\n")
            self.handle.flush()
        except BrokenPipeError:
            raise  # the reader went away (| head): the CLI ends quietly
        except OSError as exc:  # -o /dev/full, a full disk: one line naming the path
            from ..render.output import OutputError, describe_write_error
            raise OutputError(describe_write_error(exc, self.target)) from None

    def event(self, event) -> None:
        if self.quiet:
            return
        if self.as_json:
            self._line(json.dumps(event.to_dict(), default=str))
        else:
            self._line(escape_path(event.line()))

    def finding(self, finding) -> None:
        if self.as_json:
            self._line(json.dumps({"event": "finding", **finding.to_dict()}, default=str))
        else:
            self._line(escape_path(f"{finding.severity.upper():<7} {finding.layer} {finding.rule}: {finding.message}"))
            if finding.evidence.get("loader_message"):
                self._line(f"        loader: {escape_path(finding.evidence['loader_message'])}")

    @staticmethod
    def notice(text: str) -> None:
        print(f"seedance trace: {escape_path(text)}", file=sys.stderr, flush=True)


def _trace(args, command: list, backend: str) -> int:
    from ..judge.engine import load_rules

    rules = load_rules()
    with args.stream_target.open_stream() as handle:
        if not args.stream_target.is_stdout and not args.json:
            # a header, so a rerun may replace the file (seedance.render.output.is_ours)
            what = " ".join(command) if command else \
                ("pid " + " ".join(map(str, args.pid)) if args.pid else "every process")
            handle.write(escape_path(f"# seedance trace: {what}") + "\n")
        return _trace_into(args, command, backend, rules,
                           _Output(handle, args.json, args.quiet, args.stream_target))


def _trace_into(args, command: list, backend: str, rules, out) -> int:
    from ..model.report import Report
    from ..trace.facts import LiveFacts, mapped_lib_facts

    report = Report(command="trace")
    live = LiveFacts()
    # the stream (or the report) owns stdout: the traced command writes its own to stderr
    child_stdout = 2 if args.stream_target.is_stdout or (args.report_target and args.report_target.is_stdout) \
        else None

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
                               buffer_pages=args.buffer_pages, child_stdout=child_stdout,
                               on_tick=lambda: judge(mapped_lib_facts(live.live_pids())))
        from ..render.progress import wanted
        session.progress = wanted(args)
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

        summary = run_audit(command, on_event, on_notice=out.notice, duration=args.duration,
                            child_stdout=child_stdout)
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
    if args.report_target is not None:
        from ..render.text import report_json
        out.handle.flush()
        args.report_target.write_text(report_json(report))
    return report.exit_code(args.strict)
