"""seedance check: forensic check of files, directories, processes or this host.

Reads; never executes what it checks.  Exit 0 clean, 1 findings at or above error (warning
with --strict), 2 usage error or unreadable input.
"""
from __future__ import annotations

import argparse
import json
import sys

from ..model.errors import UsageError, escape_path

EPILOG = """\
examples:
  seedance check                                  this host: processes, ld.so.cache, configs, caches
  seedance check ./build --arch sm_90             a tree of binaries, for an H100/H200
  seedance check --pid 4242                       what a running process really loaded
  seedance check --pid 4242 4243                  several processes, as trace --pid takes them
  seedance check --container web                  a running container (podman, docker or crictl names it)
  seedance check --strict --report-json r.json /opt/app
  seedance check --json ./libkernels.so | jq '.findings[].rule'
  seedance check --explain libcudart.so.12 ./libkernels.so
  seedance check --driver-version 535.104.05 ./build
  seedance check --python ~/venv/bin/python ./build/lib.linux-x86_64-cpython-311
  seedance check --python ~/venv/bin/python --imports torch,tensorflow --graph closure.svg
  seedance check --pid 4242 --then-dlopen libcudart.so.11.0
  seedance check --bundle evidence.tar.zst        capture this check (secrets redacted), docs/bundle.md
  seedance check --from-bundle evidence.tar.zst --arch sm_90 --driver-version 580
  seedance check --format sarif --baseline previous.json ./build > new.sarif
  seedance check --select cuda-arch-missing --ignore 'needed-unresolved:/opt/vendor/*' ./build
  SEEDANCE_JOBS=1 seedance check ./venv           in one process (no helper on a second core)
  seedance check --no-cache ./build               check again even if nothing changed since the last check
  seedance check --image app.oci.tar --driver-version 550   an image, never run (docs/containers.md)
  seedance check --root /srv/rootfs               an unpacked root, resolved inside it
"""


def configure_parser(sub):
    parser = sub.add_parser(
        "check", help="Check files, processes or this host for GPU traps",
        description="Check files, directories (recursively), running processes or, with no "
                    "target, this host for loader, CUDA, C++ ABI and config traps.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help="ELF file, directory (scanned recursively) or seedance YAML config")
    # several PIDs after one --pid, as `trace --pid A B` takes them; repeatable too
    parser.add_argument("--pid", type=_pid, nargs="+", action="extend", default=[], metavar="PID",
                        help="check running processes: --pid A B, or --pid A --pid B")
    parser.add_argument("--container", action="append", default=[], metavar="NAME",
                        help="check a running container's first process, as --pid of the pid podman, "
                             "docker or crictl gives for NAME (repeatable; docs/containers.md)")
    parser.add_argument("--arch", metavar="sm_XX", help="GPU architecture to check fatbins against (default: NVML)")
    parser.add_argument("--driver-version", metavar="VERSION",
                        help="the driver to judge against: a driver version (535.104.05), a branch (535) or "
                             "the CUDA version nvidia-smi prints (12.4) (default: NVML)")
    parser.add_argument("--strict", action="store_true",
                        help="also report strict-only rules; exit 1 on warnings too")
    # a required argument: an optional one swallows the next word, so
    # `check --report-json ./py` would overwrite the target ./py
    parser.add_argument("--report-json", metavar="FILE",
                        help="write the seedance.report/v1 JSON to FILE ('-': stdout)")
    parser.add_argument("--force", action="store_true",
                        help="let --report-json replace a file that is not a seedance output")
    parser.add_argument("--json", action="store_true", help="JSON report on stdout (same as --report-json -)")
    parser.add_argument("--explain", nargs=2, metavar=("NAME", "FILE"),
                        help="show how the loader would search for library NAME needed by FILE")
    parser.add_argument("--python", metavar="PATH",
                        help="judge torch extensions against the torch this interpreter imports "
                             "(default: the torch in each extension's own environment)")
    # the process model (seedance.resolve.process): loads in order, in one process
    parser.add_argument("--imports", metavar="A,B,C",
                        help="predict what `import A, B, C` loads in --python's interpreter (default python3) "
                             "and whether it fails, without importing anything")
    parser.add_argument("--dlopen", metavar="LIB1,LIB2",
                        help="predict a program (TARGET, default --python's interpreter) dlopening these in order")
    parser.add_argument("--observe", action="store_true",
                        help="with --imports: also run the import for real under LD_DEBUG=files (executes code)")
    parser.add_argument("--then-dlopen", metavar="LIB", action="append", default=[],
                        help="with --pid: what a later dlopen of LIB would do in that process (repeatable)")
    parser.add_argument("--graph", metavar="FILE.svg|FILE.png",
                        help="with --imports/--dlopen/--pid: draw the closure (graphviz); red edges carry findings")
    parser.add_argument("--rules", metavar="DIR", help="load rules from DIR instead of the built-in rules")
    parser.add_argument("--no-cache", action="store_true",
                        help="neither answer from nor write the check cache (also SEEDANCE_CACHE=0; "
                             "docs/check.md)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar, even on a terminal")
    parser.add_argument("--progress", action="store_true", default=None,
                        help="progress on stderr even when it is not a terminal")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="one row per finding (default: repeated causes grouped and counted)")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                        help="colour severities: auto (a terminal, unless NO_COLOR is set), always, never")
    parser.add_argument("--plugin", metavar="NAME", help="seven-layer check of an installed plugin (L1 kernel/driver .. L7 manifest)")
    # evidence bundles and CI formats (collect/bundle.py, judge/filters.py, render/sarif.py)
    parser.add_argument("--bundle", metavar="FILE.tar.zst",
                        help="also capture the evidence of this check into a bundle (.tar.zst or .tar.gz; "
                             "secrets redacted); see docs/bundle.md")
    parser.add_argument("--with-binaries", action="store_true",
                        help="with --bundle: include the closures' object files themselves")
    parser.add_argument("--from-bundle", metavar="FILE",
                        help="rerun the rules on a bundle's captured facts (with --arch/--driver-version: "
                             "judge that host's software for another GPU or driver)")
    parser.add_argument("--format", choices=("text", "json", "sarif"), default=None,
                        help="what goes to stdout: the table (default), the JSON report, or SARIF 2.1.0")
    parser.add_argument("--source-root", metavar="DIR",
                        help="SARIF: file URIs relative to DIR, named SRCROOT in originalUriBaseIds "
                             "(default: the working directory)")
    parser.add_argument("--select", metavar="RULE,...", help="report only these rules")
    parser.add_argument("--ignore", metavar="RULE[:GLOB]|FINGERPRINT", action="append", default=[],
                        help="drop a rule (under paths matching GLOB), or one finding by fingerprint (repeatable)")
    parser.add_argument("--min-severity", metavar="LEVEL", help="drop findings below info|warning|error|fatal")
    parser.add_argument("--baseline", metavar="PREVIOUS.json",
                        help="report only findings whose fingerprint is not in this earlier report (or SARIF)")
    parser.add_argument("--image", metavar="PATH",
                        help="check a container image without running it: an OCI layout directory, an "
                             "oci-archive or a docker-archive tar (docs/containers.md, Images)")
    parser.add_argument("--root", metavar="DIR",
                        help="check an unpacked root filesystem as its own ld.so would load it")
    parser.add_argument("--platform", metavar="OS/ARCH",
                        help="with --image: the manifest of a multi-platform index (default linux/amd64)")
    parser.add_argument("--config-from-target", action="store_true",
                        help="apply a .seedance.yaml found in the checked tree (its git root); by default only "
                             "the current directory's applies, as the tree's author wrote the other")
    parser.set_defaults(execute=execute)
    return parser


def _pid(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}")
    return int(text)


def execute(args) -> int:
    from ..render.output import prepare_output

    # the report path is checked before any work: a directory or an ELF fails in a second,
    # not after the scan
    json_to = "-" if args.json or args.format == "json" else args.report_json
    if args.format == "sarif" and json_to == "-":
        raise UsageError("--format sarif: stdout carries the SARIF log; give --report-json FILE for the JSON")
    if args.with_binaries and args.bundle is None:
        raise UsageError("--with-binaries: only with --bundle FILE")
    if args.bundle is not None and args.from_bundle is not None:
        raise UsageError("--bundle and --from-bundle: capture or replay, not both")
    args.report_target = prepare_output(json_to, force=args.force) if json_to is not None else None
    for name in args.container:  # a container is checked as its first process, in its own root
        from ..collect.container import pid_of
        from ..model.errors import BadInput
        pid, why = pid_of(name)
        if pid is None:
            raise BadInput(f"--container {name}: {why}")
        args.pid.append(pid)
    _only_for_the_scan(args)
    if args.plugin:
        from ..plugins.layers import main_for_check
        return main_for_check(args)
    if args.imports is not None or args.dlopen is not None or args.then_dlopen or args.graph or args.observe:
        from .process_check import execute_process
        return execute_process(args)
    if args.explain:
        if args.targets or args.pid:
            raise UsageError("seedance check: --explain takes no other targets")
        return _explain(*args.explain, target=args.report_target)

    from ..judge import filters
    from ..render import text as render
    from ..collect.options import CheckOptions
    from ..render.progress import Progress, wanted

    options = CheckOptions(targets=list(args.targets), pids=list(args.pid), arch=args.arch,
                           driver_version=args.driver_version, strict=args.strict,
                           rules_dir=args.rules, python=args.python)
    progress = Progress(enabled=wanted(args))
    finding_filter = _finding_filter(args)  # a bad --select/--baseline/.seedance.yaml fails first
    if args.image is not None or args.root is not None:
        report = _image(args, options)
    elif args.from_bundle is not None or args.bundle is not None:
        report = _bundle(args, options, progress)
    else:
        from ..collect.check_cache import run_cached
        report = run_cached(options, progress, disabled=args.no_cache)
    if args.pid:
        # the process model on each live link map (copies already shadowed)
        from ..judge.engine import load_rules
        from .process_check import live_findings
        rules = load_rules(args.rules)
        for pid in args.pid:
            report.add(live_findings(pid, rules, args.strict))
    if finding_filter.active:
        report.stats["filtered"] = finding_filter.apply(report)
    from .. import telemetry
    telemetry.note_report(report)
    telemetry.phases("check").next("render")  # ends with the command's span
    unreadable = _named_unreadable(args.targets, report.stats.get("errors", ()))
    for problem in report.stats.get("errors", ()):
        text = escape_path(problem["error"])  # a SeedanceError's text is escaped already
        if not text.startswith(escape_path(problem["path"])):
            text = f"{escape_path(problem['path'])}: {text}"
        # a target the user named that cannot be read is an error (exit 2); one found
        # beneath it is skipped and counted
        label = "error:" if problem in unreadable else "skipped"
        print(f"seedance: {label} {text}", file=sys.stderr)
    target = args.report_target
    if args.format == "sarif":
        from ..render.sarif import sarif_text
        sys.stdout.write(sarif_text(report, source_root=args.source_root, rules_dir=args.rules))
    elif target is None or not target.is_stdout:
        sys.stdout.write(render.table(report, color=render.use_color(args.color), verbose=args.verbose))
        sys.stdout.write(filters.describe(report.stats.get("filtered")))
    if target is not None:
        render.write_json(report, target)
    if unreadable:
        return 2  # a target named on the command line could not be read: bad input, not clean
    return report.exit_code(args.strict)


def _only_for_the_scan(args) -> None:
    """Bundles, SARIF and the filters work on the file/process/host check's report; the
    other modes (--plugin, --explain, the process model) would silently ignore them."""
    other = "--plugin" if args.plugin else "--explain" if args.explain else \
        "--imports/--dlopen/--then-dlopen/--graph/--observe" if (
            args.imports is not None or args.dlopen is not None or args.then_dlopen or args.graph or args.observe) \
        else None
    given = [flag for flag, value in (("--bundle", args.bundle), ("--from-bundle", args.from_bundle),
                                      ("--format sarif", args.format == "sarif" or None), ("--select", args.select),
                                      ("--ignore", args.ignore or None), ("--min-severity", args.min_severity),
                                      ("--baseline", args.baseline)) if value is not None]
    if other and given:
        raise UsageError(f"{given[0]} does not apply to {other}")


def _finding_filter(args):
    """--select/--ignore/--min-severity/--baseline over the project's .seedance.yaml."""
    from ..judge import filters

    return filters.build(select=args.select, ignore=args.ignore, min_severity=args.min_severity,
                         baseline=args.baseline, targets=list(args.targets), known=_RuleIds(args.rules),
                         config_from_target=args.config_from_target)


class _RuleIds:
    """The ids of the rules, loaded when a filter names one: loading the rules to check names
    nobody gave would parse every rules/*.yaml file in a check answered from the cache."""

    def __init__(self, rules_dir):
        self._rules_dir, self._ids = rules_dir, None

    def __contains__(self, rule) -> bool:
        if self._ids is None:
            from ..judge.engine import load_rules

            self._ids = {rule.id for rule in load_rules(self._rules_dir).rules}
        return rule in self._ids


def _bundle(args, options, progress):
    """check --bundle (capture with the scan) or --from-bundle (replay the captured facts)."""
    from ..collect import bundle
    from ..render.output import prepare_output

    if args.from_bundle is not None:
        if args.targets or args.pid:
            raise UsageError("--from-bundle takes no TARGET or --pid: the bundle holds what was checked")
        return bundle.replay(args.from_bundle, arch=args.arch, driver_version=args.driver_version,
                             strict=args.strict, rules_dir=args.rules)
    bundle.check_name(args.bundle)
    target = prepare_output(args.bundle, force=args.force, what="bundle")
    report, summary = bundle.capture(options, target, progress, with_binaries=args.with_binaries)
    sys.stderr.write(bundle.describe(summary))
    return report


def _image(args, options):
    """check --image / --root: the image's own view, never the host's (collect/image.py)."""
    from ..collect import image

    if args.image is not None and args.root is not None:
        raise UsageError("--image and --root: one at a time")
    if args.targets or args.pid or args.bundle or args.from_bundle:
        raise UsageError("--image/--root take no TARGET, --pid or bundle")
    if args.image is not None:
        return image.check_image(args.image, options, platform=args.platform)
    if args.platform:
        raise UsageError("--platform: only with --image")
    return image.check_root(args.root, options)


def _named_unreadable(targets, problems) -> list:
    """The read errors of files or directories the user named (not of ones beneath them)."""
    import os

    named = {os.path.normpath(os.path.abspath(t)) for t in targets}
    return [p for p in problems if os.path.normpath(os.path.abspath(str(p.get("path", "")))) in named]


def _explain(name: str, requester: str, target=None) -> int:
    import os

    from ..model.errors import BadInput
    from ..resolve import Resolver

    if not os.path.exists(requester):
        raise BadInput(f"{requester}: no such file or directory")
    resolution = Resolver().explain(name, requester)
    if target is not None:
        from ..model.report import _plain
        # the schema marks it as ours, so a rerun may replace the file (seedance.render.output)
        document = {"schema": "seedance.explain/v1", **_plain(resolution)}
        target.write_text(json.dumps(document, indent=2) + "\n")
    if target is None or not target.is_stdout:
        sys.stdout.write(format_explanation(resolution))
    return 0 if resolution.path is not None else 1


def format_explanation(res) -> str:
    lines = [f"{res.name} needed by {res.requester}"]
    if res.search_order:
        lines.append("search order (as ld.so searches):")
        for index, step in enumerate(res.search_order, 1):
            if isinstance(step, (list, tuple)) and len(step) == 2:
                lines.append(f"  {index:2}. {step[0]:<16} {step[1]}")
            else:
                lines.append(f"  {index:2}. {step}")
    if res.tried:
        lines.append("candidates tried:")
    for attempt in res.tried:
        lines.append("  " + _attempt(attempt))
    if res.path is not None:
        soname = f" (SONAME {res.soname})" if res.soname else " (no SONAME)"
        lines.append(f"=> {res.path} via {res.source}{soname}")
        if res.soname and res.soname != res.name:
            lines.append(f"warning: {res.path} declares SONAME {res.soname}, not {res.name}")
    else:
        lines.append("=> not found")
    # the name and the paths come from files on disk: a NEEDED holding a newline or an
    # escape sequence must not forge a line of this output
    from ..model.errors import escape_path

    return "".join(escape_path(line) + "\n" for line in lines)


def _attempt(attempt) -> str:
    if isinstance(attempt, dict):
        path = attempt.get("path") or attempt.get("candidate") or ""
        why = attempt.get("why") or attempt.get("reason") or attempt.get("result") or ""
        source = attempt.get("source")
        return " ".join(x for x in (path, f"[{source}]" if source else "", f"- {why}" if why else "") if x)
    if isinstance(attempt, (list, tuple)) and len(attempt) == 2:
        return f"{attempt[0]}: {attempt[1]}"
    if isinstance(attempt, (list, tuple)):
        return " - ".join(str(x) for x in attempt)
    if hasattr(attempt, "__dataclass_fields__") or hasattr(attempt, "_asdict"):  # a record (record.py)
        from ..model.report import _plain
        return _attempt(_plain(attempt))
    return str(attempt)
