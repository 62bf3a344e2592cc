"""seedance plugin: install, uninstall, list and verify GPU plugins (alias seedance-plugin)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

EPILOG = """\
examples:
  seedance plugin install ./examples/build/audio-encoder-v2.0.5
  seedance plugin install audio-encoder-v2.0.5 --from ./plugins --affinity=npu0 --batch-policy=adaptive
  seedance plugin install fatbin-kernels.tar.gz --no-deps --force-arch=sm_86
  seedance plugin list                     (fallback) marks a pick older than the newest known
  seedance plugin list --json
  seedance plugin verify --strict --report-json - | jq '.waste_traps[]'
  seedance plugin verify legacy-audio-encoder --report-json report.json
  seedance plugin uninstall legacy-audio-encoder
  seedance plugin install legacy-audio-encoder --strict     refuses: it has waste traps
  seedance plugin uninstall dsp-kernels --force             even though others need it

Plugins are stored under $XDG_DATA_HOME/seedance/plugins/NAME/VERSION (default
~/.local/share).  Names are looked up in --from DIR, then in SEEDANCE_PLUGIN_PATH
(colon-separated); when that is unset, in the built-in examples `make install` built
(<venv>/share/seedance/plugins).
"""

AFFINITY_HELP = "record device_affinity in the installed manifest: gpu:N, auto, any or npuN"


def configure_parser(sub) -> None:
    parser = sub.add_parser("plugin", help="Install, list and verify GPU plugins",
                            description="Install, uninstall, list and verify GPU plugins.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=type(parser))

    install = actions.add_parser("install", help="check seven layers, resolve dependencies, install",
                                 epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    install.add_argument("source", metavar="SRC",
                         help="directory, .tar.gz, wheel, or NAME / NAME-vVERSION from a source dir")
    install.add_argument("--affinity", help=AFFINITY_HELP)
    install.add_argument("--batch-policy", choices=("adaptive", "static"),
                         help="record batch_policy in the installed manifest")
    install.add_argument("--force-arch", metavar="SM_XX",
                         help="check fatbins against this architecture (e.g. sm_86) instead of the device")
    install.add_argument("--no-deps", action="store_true", help="skip dependency resolution (says what was skipped)")
    install.add_argument("--force", action="store_true",
                         help="install despite ERROR/FATAL findings, or reinstall the same version")
    install.add_argument("--from", dest="from_dir", metavar="DIR", help="source directory of plugins to install by name")
    install.add_argument("--strict", action="store_true",
                         help="refuse a plugin with waste traps (judged as `plugin verify --strict` does)")
    install.add_argument("--json", action="store_true", help="machine-readable result")
    install.set_defaults(execute=execute_install)

    uninstall = actions.add_parser("uninstall", help="remove an installed plugin",
                                   epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    uninstall.add_argument("name", metavar="NAME", help="plugin name (or NAME-vVERSION)")
    uninstall.add_argument("--version", dest="plugin_version", metavar="V", help="only this version")
    uninstall.add_argument("--force", action="store_true",
                           help="uninstall even when installed plugins need it (they stop resolving)")
    uninstall.set_defaults(execute=execute_uninstall)

    listing = actions.add_parser("list", help="installed plugins; (fallback) marks fallback picks",
                                 epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    listing.add_argument("--json", action="store_true", help="machine-readable list")
    listing.add_argument("--from", dest="from_dir", metavar="DIR", help="also count versions available here")
    listing.set_defaults(execute=execute_list)

    verify = actions.add_parser("verify", help="seven-layer check and the three waste traps",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    verify.add_argument("name", metavar="NAME", nargs="?",
                        help="installed plugin (default: all), or a plugin directory/archive")
    verify.add_argument("--strict", action="store_true",
                        help="warnings count as failures; affinity-unset for any manifest without device_affinity")
    # a required argument ('-' for stdout): an optional one swallows the next word
    verify.add_argument("--report-json", metavar="FILE",
                        help="write the seedance.report/v1 JSON to FILE ('-': stdout)")
    verify.add_argument("--json", action="store_true", help="the report on stdout (same as --report-json -)")
    verify.add_argument("--force", action="store_true",
                        help="let --report-json replace a file that is not a seedance output")
    verify.add_argument("--force-arch", metavar="SM_XX", help="check fatbins against this architecture")
    verify.add_argument("--from", dest="from_dir", metavar="DIR", help="also count versions available here")
    verify.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                        help="colour severities: auto (a terminal, unless NO_COLOR is set), always, never")
    verify.set_defaults(execute=execute_verify)

    def no_action(args) -> int:
        from ..model.errors import UsageError
        raise UsageError("seedance plugin: give an action: install, uninstall, list or verify")

    parser.set_defaults(execute=no_action)


def execute_install(args) -> int:
    from ..plugins.install import InstallOptions, InstallRefused, install

    options = InstallOptions(affinity=args.affinity, batch_policy=args.batch_policy, force_arch=args.force_arch,
                             no_deps=args.no_deps, force=args.force, from_dir=args.from_dir,
                             strict=args.strict)
    _check_affinity(args.affinity)
    try:
        result = install(args.source, options)
    except InstallRefused as exc:
        for line in exc.lines:
            print(line)
        raise
    if args.json:
        print(json.dumps({
            "installed": [vars(i) for i in result.installed],
            "picks": [p.to_dict() for p in result.picks],
            "skipped_dependencies": result.skipped,
            "forced": result.forced}, indent=2))
        return 0
    for pick in result.picks:
        print(f"pick: {pick.explanation}")
    for entry in result.skipped:
        print(f"--no-deps: skipped dependency {entry}")
    for text in result.forced:
        print(f"--force: installed despite {text}")
    for item in result.installed:
        what = "dependency" if item.as_dependency else "plugin"
        print(f"installed {what} {item.name} {item.version} -> {item.path}")
        for trap in item.waste_traps:
            print(f"  waste trap {trap}")
        if item.waste_traps and not args.strict:
            print(f"  ({len(item.waste_traps)} waste trap(s): `seedance plugin verify {item.name}` explains; "
                  f"--strict refuses them)")
    return 0


def _check_affinity(value) -> None:
    import re
    from ..model.errors import UsageError
    if value is not None and not re.fullmatch(r"gpu:[0-9]+|npu[0-9]+|auto|any", value):
        raise UsageError(f"--affinity {value!r}: expected gpu:N, auto, any or npuN")


def execute_uninstall(args) -> int:
    from ..plugins.archive import split_request
    from ..plugins.install import uninstall

    name, version = args.name, args.plugin_version
    if version is None:
        name, version = split_request(args.name)
    removed, dependents = uninstall(name, version, force=args.force)
    from ..model.errors import escape_path

    for plugin in removed:
        print(escape_path(f"uninstalled {plugin.name} {plugin.version} ({plugin.path})"))
    if dependents:
        print(escape_path(f"warning: still installed and depending on {name}: {', '.join(dependents)} "
                          f"(`seedance plugin verify` reports unresolved ranges)"))
    return 0


def list_rows(from_dir=None) -> list:
    from ..plugins import archive
    from ..plugins.resolve import active_picks
    from ..plugins.store import Store

    store = Store()
    sources = archive.scan_sources(archive.source_dirs(from_dir))
    plugins = store.installed()
    newest = {}
    for plugin in plugins:
        newest[plugin.name] = plugin  # installed() is sorted oldest first
    picked_by: dict = {}
    picks_of: dict = {}
    for plugin in newest.values():
        picks = active_picks(plugin.manifest, store, sources)
        picks_of[plugin.name] = picks
        for pick in picks:
            if pick.version:
                picked_by.setdefault((pick.name, pick.version), []).append(pick)
    rows = []
    for plugin in plugins:
        by = picked_by.get((plugin.name, plugin.version), [])
        fallback = [p for p in by if p.fallback]
        manifest = plugin.manifest
        rows.append({
            "name": plugin.name, "version": plugin.version,
            "active": newest[plugin.name] is plugin,
            "fallback": bool(fallback),
            "fallback_reason": "; ".join(f"{p.dependent} picked it with {p.range}; newest is {p.newest}"
                                         for p in fallback),
            "picked_by": [f"{p.dependent} ({p.range})" for p in by],
            "affinity": manifest.device_affinity or "",
            "batch_policy": manifest.batch.policy or "missing",
            "depends": manifest.depends,
            "picks": [p.to_dict() for p in picks_of.get(plugin.name, [])] if newest[plugin.name] is plugin else [],
            "path": str(plugin.path),
        })
    return rows


def execute_list(args) -> int:
    rows = list_rows(args.from_dir)
    if args.json:
        print(json.dumps({"plugins": rows}, indent=2))
        return 0
    if not rows:
        print("no plugins installed")
        return 0
    from ..model.errors import escape_path

    # names, versions, affinities and ranges come from manifests on disk, which a schema
    # pattern ending in `$` lets end in a newline: escaped as check escapes paths, so a
    # manifest cannot forge a row
    table = [("NAME", "VERSION", "AFFINITY", "BATCH", "PICKED BY")]
    for row in rows:
        version = escape_path(row["version"]) + (" (fallback)" if row["fallback"] else "")
        table.append((escape_path(row["name"]), version, escape_path(row["affinity"] or "-"),
                      escape_path(row["batch_policy"]), escape_path(", ".join(row["picked_by"]) or "-")))
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    for row in table:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4])
    for row in rows:
        if row["fallback"]:
            print(escape_path(f"(fallback) {row['name']} {row['version']}: {row['fallback_reason']}"))
    return 0


def _paint(line: str, color: bool) -> str:
    """Colour the leading severity of a layer line ("ERROR L2: ...") as check's table does."""
    from ..render.text import SEVERITY_COLOR
    head, _, rest = line.partition(" ")
    severity = {"FATAL": "fatal", "ERROR": "error", "WARNING": "warning", "WARN": "warning",
                "INFO": "info"}.get(head)
    if not color or severity is None:
        return line
    return f"\033[{SEVERITY_COLOR[severity]}m{head}\033[0m {rest}"


def execute_verify(args) -> int:
    from ..model.report import Report
    from ..plugins import archive
    from ..plugins.layers import check_root, check_target, host_summary, plugin_summary
    from ..plugins.store import Store

    from ..render.output import prepare_output

    json_to = "-" if args.json else args.report_json
    target = prepare_output(json_to, force=args.force) if json_to else None  # before any work
    store = Store()
    sources = archive.scan_sources(archive.source_dirs(args.from_dir))
    results = []
    if args.name and (Path(args.name).exists()):
        results.append(check_target(args.name, args.strict, args.force_arch, store=store, sources=sources))
    else:
        if args.name:
            name, version = archive.split_request(args.name)
            targets = [store.get(name, version)]
        else:
            newest = {}
            for plugin in store.installed():
                newest[plugin.name] = plugin
            targets = list(newest.values())
        for plugin in targets:
            force_arch = args.force_arch or plugin.record.get("force_arch")
            results.append(check_root(plugin.path, args.strict, force_arch, store=store, sources=sources,
                                      check_deps=True, installed=True))
    report = Report(command="plugin verify", host=host_summary())
    for result in results:
        report.add(result.findings)
    report.stats = {"plugins": len(results), "facts": sum(len(r.facts) for r in results),
                    "findings": len(report.findings), "waste_traps": sum(f.is_waste_trap for f in report.findings)}
    report.extra = {"plugins": [plugin_summary(r) for r in results]}
    if target is not None:
        target.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        if target.is_stdout:
            return report.exit_code(args.strict)
    from ..render.text import use_color
    color = use_color(args.color)
    if not results:
        print("no plugins installed")
    for result in results:
        manifest = result.manifest
        print(f"{manifest.name} {manifest.version} ({manifest.root})" if manifest else "invalid plugin")
        for line in result.lines:
            print(f"  {_paint(line, color)}")
    traps = [f for f in report.sorted_findings() if f.is_waste_trap]
    print(f"{len(results)} plugin(s), {len(report.findings)} finding(s), {len(traps)} waste trap(s)"
          + (f": {', '.join(sorted({f.rule for f in traps}))}" if traps else ""))
    return report.exit_code(args.strict)
