"""seedance check --imports / --dlopen / --pid --then-dlopen / --graph: the process model.

Parses nothing itself (check.py does): builds the prediction from the core
(seedance.collect.python_env, seedance.resolve.process), runs the rules over its facts and
renders.  Imports, dlopens and the live process are read, never executed, except with
--observe, which runs the import and says so.
"""
from __future__ import annotations

import os
import sys

from ..model.errors import UsageError, escape_path

_FLAGS = {0x1: "RTLD_LAZY", 0x2: "RTLD_NOW", 0x100: "RTLD_GLOBAL", 0x4: "RTLD_NOLOAD", 0x8: "RTLD_DEEPBIND",
          0x1000: "RTLD_NODELETE"}


def flag_names(flags: int) -> str:
    names = [n for bit, n in _FLAGS.items() if flags & bit]
    if not flags & 0x100:
        names.append("RTLD_LOCAL")
    return "|".join(names)


def _split(text: str, what: str) -> list:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise UsageError(f"seedance check: {what} needs at least one name")
    return items


def execute_process(args) -> int:
    from ..judge.engine import load_rules
    from ..model.report import Report
    from ..render.output import prepare_output

    if args.observe and args.imports is None:
        raise UsageError("seedance check: --observe goes with --imports")
    if args.then_dlopen and not args.pid:
        raise UsageError("seedance check: --then-dlopen goes with --pid")
    if args.imports is not None and args.dlopen is not None:
        raise UsageError("seedance check: give --imports or --dlopen, not both")
    if args.graph and args.imports is None and args.dlopen is None and not args.pid:
        raise UsageError("seedance check: --graph draws --imports, --dlopen or --pid")
    graph_target, fmt = None, None
    if args.graph:
        fmt = os.path.splitext(args.graph)[1].lower().lstrip(".")
        if fmt not in ("svg", "png"):
            raise UsageError(f"seedance check: --graph writes .svg or .png, not {escape_path(args.graph)}")
        graph_target = prepare_output(args.graph, force=args.force, what="graph")
    rules = load_rules(args.rules)
    report = Report(command="check")
    lines: list = []
    prediction = None
    if args.imports is not None:
        prediction, facts, cache_state = _imports(args, lines)
        model = prediction.model
        report.stats["cache"] = cache_state
    elif args.dlopen is not None:
        prediction = _dlopens(args, lines)
        model = prediction.model
        facts = _facts(prediction)
    else:
        model, facts = _pid(args, lines)
    report.extra["process"] = _process_json(model, prediction)
    report.add(rules.evaluate(facts, strict=args.strict))
    report.stats["process_model"] = {"loads": len(model.steps), "objects": len(model.link_map)}
    if graph_target is not None:
        from ..render import graph as render_graph
        data, why = render_graph.render(render_graph.to_dot(model, report.findings), fmt)
        if data is None:
            lines.append(why)
            lines.append(render_graph.model_tree_text(model).rstrip("\n"))
        else:
            graph_target.write_bytes(data)
            lines.append(f"graph: {escape_path(args.graph)}")
    from ..render import text as render
    target = args.report_target
    if target is None or not target.is_stdout:
        sys.stdout.write("".join(escape_path(line) + "\n" for line in lines))
        sys.stdout.write(render.table(report))
    if target is not None:
        render.write_json(report, target)
    return report.exit_code(args.strict)


def _facts(prediction) -> list:
    from ..collect.python_env import requirement_facts, shadowing_facts
    return shadowing_facts(prediction) + requirement_facts(prediction)


def _predicted_facts(prediction) -> tuple:
    """(prediction, its facts): the facts read METADATA and RECORD files, inputs of the
    prediction cache's entry as much as the sources and libraries are."""
    return prediction, _facts(prediction)


def _describe(model, lines: list) -> None:
    for step in model.steps[1:]:
        label = step.load.module or step.load.target
        if step.already_loaded:
            lines.append(f"  {label}: already loaded")
            continue
        head = f"  {label}: {step.load.target}"
        extra = len(step.new_objects) - 1
        head += f" (+{extra} object{'s' if extra != 1 else ''})" if extra > 0 else ""
        lines.append(head + ("" if step.ok else "  FAILS"))
        for shadow in step.shadowed:
            lines.append(f"    {shadow.name} => {shadow.used} (already loaded by {shadow.loaded_by}; "
                         f"alone it finds {shadow.alone})")


def _imports(args, lines: list):
    from ..collect.python_env import ask_interpreter, observe, predict_imports
    names = _split(args.imports, "--imports")
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise UsageError(f"seedance check: --imports: not a module name: {escape_path(name)}")
    from ..collect import prediction_cache
    interp = ask_interpreter(args.python or "python3")
    prediction, facts, cache_state = prediction_cache.predict(
        interp, names, lambda: _predicted_facts(predict_imports(interp, names)),
        disabled=getattr(args, "no_cache", False))
    # the interpreter as given (a venv's bin/python), not the base binary it runs: the venv
    # is what decides sys.path, and the one the user knows it by
    lines.append(f"import {', '.join(names)} in {interp.python} "
                 f"(extensions dlopened {flag_names(interp.dlopenflags)}); predicted without importing:")
    _describe(prediction.model, lines)
    lines.append("predicted: " + ("imports" if prediction.ok else prediction.error))
    if prediction.working_order:
        lines.append("an import order that works: " + ", ".join(prediction.working_order))
    elif prediction.searched_orders:
        lines.append("no import order works")
    notes = list(dict.fromkeys(prediction.plan.notes))  # a loop's body is read once per item
    if getattr(args, "verbose", False):
        lines.extend("not known statically: " + note for note in notes)
    elif notes:
        # a package as large as torch calls dozens of functions at import time: their count
        # says how much of the prediction rests on what was read, each one is under -v
        lines.append(f"not known statically: {len(notes)} place{'s' if len(notes) != 1 else ''} "
                     "(dynamic loads, imports under conditions not followed); -v lists them")
    if args.observe:
        statement = "import " + ", ".join(names)
        seen = observe(interp.python, statement)
        lines.append(f"observed: ran `{interp.python} -c '{statement}'` under LD_DEBUG=files "
                     f"(this executed the packages' code): " +
                     ("imports" if seen.returncode == 0 else seen.error_line or f"exit {seen.returncode}"))
        predicted = prediction.loaded_names()
        actual = [name for name, _who in seen.loaded]
        same = predicted == actual and prediction.ok == (seen.returncode == 0)
        lines.append(f"observed {len(actual)} objects mapped, predicted {len(predicted)}: "
                     + ("the same, in the same order" if same else "they differ"))
        if not same:
            for name in [n for n in actual if n not in predicted][:10]:
                lines.append(f"  loaded but not predicted: {name}")
            for name in [n for n in predicted if n not in actual][:10]:
                lines.append(f"  predicted but not loaded: {name}")
    return prediction, facts, cache_state


def _dlopens(args, lines: list):
    from ..collect.python_env import predict_dlopens
    libs = _split(args.dlopen, "--dlopen")
    if len(args.targets) > 1:
        raise UsageError("seedance check: --dlopen takes one program TARGET")
    program = args.targets[0] if args.targets else None
    if program is None:
        from ..collect.python_env import ask_interpreter
        program = ask_interpreter(args.python or "python3").executable
    if not os.path.isfile(program):
        from ..model.errors import BadInput
        raise BadInput(f"{program}: no such file")
    loads = [_lib_and_flags(item) for item in libs]
    prediction = predict_dlopens(program, loads, 0x2)
    lines.append(f"{program} dlopens " + ", ".join(f"{lib} ({flag_names(flags)})" for lib, flags in loads)
                 + ", predicted:")
    _describe(prediction.model, lines)
    lines.append("predicted: " + ("loads" if prediction.ok else prediction.error))
    if prediction.working_order:
        lines.append("a dlopen order that works: " + ", ".join(prediction.working_order))
    return prediction


def _lib_and_flags(item: str) -> tuple:
    """LIB, LIB:GLOBAL, LIB:LAZY:GLOBAL -> (LIB, flags); RTLD_NOW|RTLD_LOCAL by default."""
    parts = item.split(":")
    flags, words = 0, []
    while len(parts) > 1 and parts[-1].upper().removeprefix("RTLD_") in ("GLOBAL", "LOCAL", "LAZY", "NOW"):
        words.append(parts.pop().upper().removeprefix("RTLD_"))
    flags |= 0x100 if "GLOBAL" in words else 0
    flags |= 0x1 if "LAZY" in words and "NOW" not in words else 0x2
    return ":".join(parts), flags


def live_findings(pid: int, rules, strict: bool = False) -> list:
    """Plain `check --pid`: NEEDED entries already answered by another copy in the running
    process (soname-shadowed); nothing when the process is gone or not ours to read."""
    from ..collect.process import ProcessGone, read_process
    try:
        view = read_process(pid)
    except (ProcessGone, PermissionError, OSError):
        return []
    if view.exe is None:
        return []
    _model, facts = _live(pid, view, [], [])
    return rules.evaluate(facts, strict=strict)


def _pid(args, lines: list):
    from ..collect.process import ProcessGone, read_process
    from ..model.errors import BadInput

    if len(args.pid) != 1:
        raise UsageError("seedance check: --then-dlopen and --graph take one --pid")
    pid = args.pid[0]
    try:
        view = read_process(pid)
    except ProcessGone:
        raise BadInput(f"process {pid}: no such process") from None
    except PermissionError:
        raise BadInput(f"process {pid}: permission denied") from None
    if view.exe is None:
        raise BadInput(f"process {pid}: no executable to model (a kernel thread)")
    return _live(pid, view, args.then_dlopen, lines)


def _live(pid: int, view, then_dlopen, lines: list):
    from ..collect.process import root_views
    from ..model.errors import BadInput, ELFError
    from ..model.report import Fact
    from ..resolve.process import Load, live

    # The process's own loader environment and root: a container's or chroot's ld.so reads
    # its /etc/ld.so.cache and its libraries, so the model resolves inside /proc/PID/root
    # (an absolute symlink there starts again at that root, never at the host's /), with
    # the LD_LIBRARY_PATH and LD_PRELOAD of its environ, which a later dlopen searches too.
    resolver = root_views().resolver(view)
    exe = view.in_root(view.exe)
    try:
        sim, shadowed = live(resolver, exe, [view.in_root(m.path) for m in view.mappings if not m.deleted])
    except ELFError as exc:
        raise BadInput(f"process {pid}{view.where()}: {exc.message}") from None
    lines.append(f"process {pid} ({exe}){view.where()}: {len(sim.model.link_map)} objects in its link map")
    where = {"container": view.container.subject()} if view.container is not None else {}
    facts = []
    for shadow in shadowed:
        lines.append(f"  already shadowed: {shadow.name} needed by {shadow.requester} is {shadow.used}; "
                     f"alone it finds {shadow.alone}")
        facts.append(Fact("process-load", {"pid": pid, "path": shadow.requester, **where}, {
            "event": "shadowed", "importer": "", "module": shadow.requester, "name": shadow.name,
            "how": f"mapped in process {pid}", "why_args": f"--pid {pid}",
            "used": shadow.used, "alone": shadow.alone, "loaded_by": shadow.loaded_by,
            "loaded_for": shadow.loaded_for, "missing": "", "other_copy": "",
            "order_hint": "the copy mapped first serves it",
            "consequence": "already mapped in the running process", "error": ""}, source="process"))
    for item in then_dlopen:
        lib, flags = _lib_and_flags(item)
        step = sim.dlopen(Load(_dlopen_target(view, lib), "dlopen", flags, None, lib))
        verdict = "already loaded" if step.already_loaded else ("loads" if step.ok else f"fails: {step.error}")
        lines.append(f"then dlopen({lib}): {verdict}")
        for shadow in step.shadowed:
            lines.append(f"    {shadow.name} => {shadow.used} (already loaded; alone it finds {shadow.alone})")
        for shadow in step.shadowed:
            missing = ", ".join(s or f"@{v}" for s, v in shadow.missing)  # a version node alone: "@VER"
            facts.append(Fact("process-load", {"pid": pid, "path": shadow.requester, **where}, {
                "event": "shadowed", "importer": lib, "module": lib, "name": shadow.name,
                "how": f"dlopen in process {pid}", "why_args": f"--pid {pid}",
                "used": shadow.used, "alone": shadow.alone, "loaded_by": shadow.loaded_by,
                "loaded_for": shadow.loaded_for, "missing": missing, "other_copy": "",
                "order_hint": "dlopen it before the library that shadows it" if missing else
                "the copy already loaded serves it", "consequence": step.shadow_consequence(missing) if missing
                else "binds to the loaded copy", "error": step.error or ""}, source="process"))
        if not step.ok and not step.shadowed:
            facts.append(Fact("process-load", {"pid": pid, "path": lib, **where}, {
                "event": "failed", "importer": lib, "module": lib, "error": step.error or "",
                "how": f"dlopen in process {pid}", "why_args": f"--pid {pid}", "then": "",
                "order_hint": ""}, source="process"))
    return sim.model, facts



def _dlopen_target(view, lib: str) -> str:
    """What ld.so opens for dlopen(lib) in the process: a name with a '/' that is not
    absolute is opened as given (elf/dl-load.c _dl_map_object: no search), so relative to
    the process's working directory, inside its root; never relative to ours, where a
    host file of that name would stand in for the container's."""
    if "/" not in lib or lib.startswith("/"):
        return lib
    try:
        cwd = view.in_root(os.readlink(f"/proc/{view.pid}/cwd").removesuffix(" (deleted)"))
    except OSError:
        cwd = "/"
    return os.path.normpath(os.path.join(cwd if cwd.startswith("/") else "/", lib))


def _process_json(model, prediction) -> dict:
    """The model in the JSON report: each load, what it mapped, what it shadowed, its verdict."""
    loads = []
    for step in model.steps:
        loads.append({
            "kind": step.load.kind, "target": step.load.target, "module": step.load.module,
            "importer": step.load.importer, "flags": flag_names(step.load.flags) if step.load.kind != "exec" else None,
            "ok": step.ok, "error": step.error, "already_loaded": step.already_loaded,
            "new_objects": list(step.new_objects),
            "shadowed": [{"requester": s.requester, "name": s.name, "used": s.used, "alone": s.alone,
                          "loaded_by": s.loaded_by, "missing": [n for n, _v in s.missing]} for s in step.shadowed],
        })
    out = {"executable": model.executable, "loads": loads, "link_map": list(model.link_map)}
    if prediction is not None:
        out.update({"ok": prediction.ok, "error": prediction.error,
                    "working_order": list(prediction.working_order) if prediction.working_order else None,
                    "not_known_statically": list(prediction.plan.notes) if prediction.plan is not None else []})
    return out
