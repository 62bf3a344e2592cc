"""What `import a, b, c` would do in an interpreter, decided without importing: the
interpreter's own facts, the import plan run through the process model, and the facts the
rules judge.

The interpreter is asked once (``python -c``, no package imported) for what only it knows:
sys.path (PYTHONPATH and site-packages included), its extension suffixes, its dlopen flags,
the modules already imported at start-up and the executable.  import_plan.py then follows
each import statically to the extension modules and libraries it dlopens, in order; here
those loads run through the process model (resolve/process.py) and Python's verdict is
predicted: ImportError with dlerror()'s text, ModuleNotFoundError, the OSError of a load by
path, the RuntimeError of an operator a failed library would have registered.  observe()
runs the import for real under LD_DEBUG=files, and says that it executed code.
dist_metadata.py reads the distributions' RECORD and Requires-Dist as evidence.
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field

from ..model.errors import BadInput
# The import planner, the values it knows statically and the distributions' metadata live
# in their own modules; their names are this module's too, where callers and tests took them.
from .dist_metadata import (UnmetRequirement, distributions_providing, import_failure_fix,  # noqa: F401
                            installed_distributions, requirement_facts, unmet_requirements)
from .import_plan import (ExtensionLoad, ImportPlan, _Finder, _Planner, _plan_names, _Spec,  # noqa: F401
                          meta_path_answers, plan_imports)
from .static_values import (_UNKNOWN, _absolute, _bind, _dl_flags, _known_value, _literal,  # noqa: F401
                            _static_test)

# Printed with ascii() and read back with ast.literal_eval: json would import _json, an
# extension module of some builds, and change the very start-up state we ask about.  ascii(),
# not repr(): a non-ASCII path then reaches us as escapes whatever PYTHONIOENCODING the
# interpreter's environment sets (repr() under latin-1 printed a byte literal_eval refused).
_FACTS_SCRIPT = r"""
import sys, importlib.machinery as m
mods = []
for name, mod in list(sys.modules.items()):
    f = getattr(mod, '__file__', None)
    if isinstance(f, str) and f.endswith(tuple(m.EXTENSION_SUFFIXES)):
        mods.append((name, f))
facts = {'executable': sys.executable, 'path': list(sys.path),
 'builtins': list(sys.builtin_module_names), 'suffixes': list(m.EXTENSION_SUFFIXES),
 'dlopenflags': sys.getdlopenflags(), 'modules': list(sys.modules), 'extensions': mods,
 'platform': sys.platform, 'version': tuple(sys.version_info[:3]), 'impl': sys.implementation.name, 'exe': __import__('os').readlink('/proc/self/exe')}
import os, platform
v = sys.implementation.version
facts['markers'] = {'implementation_name': sys.implementation.name,
 'implementation_version': '%d.%d.%d' % (v.major, v.minor, v.micro) + ('' if v.releaselevel == 'final' else v.releaselevel[0] + str(v.serial)),
 'os_name': os.name, 'platform_machine': platform.machine(), 'platform_release': platform.release(),
 'platform_system': platform.system(), 'platform_version': platform.version(),
 'python_full_version': platform.python_version(), 'platform_python_implementation': platform.python_implementation(),
 'python_version': '.'.join(platform.python_version_tuple()[:2]), 'sys_platform': sys.platform}
print(ascii(facts))
"""


@dataclass(frozen=True)
class Interpreter:
    python: str
    executable: str  # the running binary (/proc/self/exe): the main program of the process
    path: tuple
    builtins: frozenset
    suffixes: tuple
    dlopenflags: int
    modules: frozenset  # imported at start-up
    startup_extensions: tuple  # ((module, path), ...) dlopened at start-up, in order
    platform: str
    version: tuple
    implementation: str = "cpython"
    env: dict | None = field(default=None, compare=False, repr=False)  # the environment it was asked in
    markers: dict | None = field(default=None, compare=False, repr=False)  # PEP 508 marker values


def ask_interpreter(python: str = "python3", env: dict | None = None, timeout: float = 30) -> Interpreter:
    """Start ``python`` once without importing any package; BadInput when it cannot run."""
    import shutil
    exe = python if "/" in python else shutil.which(python)
    if not exe or not os.path.exists(exe):
        raise BadInput(f"{python}: no such interpreter")
    try:
        proc = subprocess.run([exe, "-c", _FACTS_SCRIPT], capture_output=True, timeout=timeout,
                              env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BadInput(f"{python}: cannot run it as a Python interpreter ({exc.__class__.__name__})") from None
    text = proc.stdout.decode("utf-8", "surrogateescape").strip().splitlines()
    try:
        facts = ast.literal_eval(text[-1]) if proc.returncode == 0 and text else None
    except (ValueError, SyntaxError):
        facts = None
    if not isinstance(facts, dict):
        raise BadInput(f"{python}: not a Python interpreter seedance can ask (exit {proc.returncode})")
    return Interpreter(python=exe, executable=facts["exe"], path=tuple(facts["path"]),
                       builtins=frozenset(facts["builtins"]), suffixes=tuple(facts["suffixes"]),
                       dlopenflags=int(facts["dlopenflags"]), modules=frozenset(facts["modules"]),
                       startup_extensions=tuple(tuple(x) for x in facts["extensions"]),
                       platform=facts["platform"], version=tuple(facts["version"]),
                       implementation=str(facts.get("impl", "cpython")), env=env,
                       markers=facts.get("markers") if isinstance(facts.get("markers"), dict) else None)


@dataclass(frozen=True)
class Observation:
    """What really happened: the files ld.so mapped, in order, and how Python ended."""
    loaded: tuple  # (name as ld.so was asked for it, requester or '') in mapping order
    returncode: int
    error_line: str  # the last line Python wrote on stderr ('' when it exited 0)
    executed: bool = True


def observe(python: str, statement: str, env: dict | None = None, timeout: float = 300) -> Observation:
    """Run ``python -c statement`` under LD_DEBUG=files (glibc's own trace, written to a
    private directory through LD_DEBUG_OUTPUT): this EXECUTES the imported packages' code."""
    import re
    run_env = dict(os.environ if env is None else env)
    with tempfile.TemporaryDirectory(prefix="seedance-observe-") as tmp:
        run_env["LD_DEBUG"] = "files"
        run_env["LD_DEBUG_OUTPUT"] = os.path.join(tmp, "ld")
        try:
            proc = subprocess.run([python, "-c", statement], capture_output=True, timeout=timeout,
                                  env=run_env, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise BadInput(f"{python} -c {statement!r} did not finish in {timeout:.0f} s") from None
        text = ""
        for entry in sorted(os.listdir(tmp)):
            with open(os.path.join(tmp, entry), "rb") as handle:
                text += handle.read().decode("utf-8", "surrogateescape")
    loaded = []
    pattern = re.compile(r"file=(.*?) \[\d+\];  (?:needed by (.*?) \[\d+\]|dynamically loaded by (.*?) \[\d+\])$")
    for line in text.splitlines():
        body = line.split(":", 1)[1].strip() if ":" in line else line
        match = pattern.match(body)
        if match:
            loaded.append((match.group(1), match.group(2) or match.group(3) or ""))
    err = proc.stderr.decode("utf-8", "surrogateescape").strip().splitlines()
    return Observation(tuple(loaded), proc.returncode, err[-1] if err and proc.returncode else "")


# --- predictions: the plan run through the process model -----------------------------------


@dataclass
class Prediction:
    """What `import <names>` (or a sequence of dlopens) would do, decided without running it."""
    names: tuple
    model: object  # seedance.resolve.process.ProcessModel
    plan: ImportPlan | None
    interpreter: Interpreter | None
    ok: bool
    error: str | None  # dlerror() text / Python's exception line
    failed_module: str | None = None
    orders: list = field(default_factory=list)  # (order, ok) tried when it fails
    working_order: tuple | None = None
    searched_orders: bool = False
    guarded: set = field(default_factory=set)  # model.steps indexes of failures the module catches
    causes: dict = field(default_factory=dict)  # index of a caught failure -> the operator use it fails

    def loaded_names(self) -> list:
        """The names ld.so maps, in order, as LD_DEBUG=files prints them (file=NAME)."""
        out = []
        for step in self.model.steps:
            for obj in step.new_objects:
                if step.load.kind != "exec" and obj == step.load.target:
                    out.append(obj)
                    continue
                edge = next((e for e in step.edges if e.path == obj), None)
                # an object found 'loaded' was in the process already (ld.so itself): no
                # file is mapped for it, so LD_DEBUG=files prints no file= line
                if edge is not None and edge.source != "loaded":
                    out.append(edge.name)
        return out


def predict_imports(interp: Interpreter, names, resolver=None, search_orders: bool = True,
                    dlopenflags: int | None = None) -> Prediction:
    """`import a, b, c` in this interpreter: the extension modules it dlopens, in order,
    through the process model; Python stops at the first ImportError."""
    from ..resolve import Resolver
    resolver = resolver or Resolver(env=_loader_env())
    names = tuple(names)
    prediction = _run_imports(interp, names, resolver, dlopenflags)
    # a module no finder knows is missing in every order: no other order is worth its run
    not_found = prediction.plan is not None and prediction.failed_module in dict(prediction.plan.missing)
    if search_orders and not not_found:
        _search_orders(prediction, names, lambda order: _run_imports(interp, order, resolver, dlopenflags))
    return prediction


def _search_orders(prediction: Prediction, items: tuple, run) -> None:
    """When the loads fail in their order, the other orders (all of them up to 4 loads, else
    the rotations) through ``run``, until one loads: prediction.orders, .working_order."""
    if prediction.ok or len(items) < 2:
        return
    import itertools
    candidates = list(itertools.permutations(items)) if len(items) <= 4 else \
        [items[i:] + items[:i] for i in range(1, len(items))]
    for order in candidates:
        if order == items:
            continue
        ok = run(order).ok
        named = tuple(x[0] if isinstance(x, tuple) else x for x in order)
        prediction.orders.append((named, ok))
        if ok:
            prediction.working_order = named
            break
    prediction.searched_orders = True


def _loader_env() -> dict:
    """The loader variables of this environment (the interpreter runs with them too)."""
    return {k: v for k, v in os.environ.items() if k in ("LD_LIBRARY_PATH", "LD_PRELOAD")}


def _run_imports(interp: Interpreter, names: tuple, resolver, dlopenflags) -> Prediction:
    from ..resolve.process import Load, Simulator
    flags = interp.dlopenflags if dlopenflags is None else dlopenflags
    sim = Simulator(resolver, interp.executable)
    sim.start()
    for module, path in interp.startup_extensions:
        sim.dlopen(Load(path, "import", flags, module, "<startup>"))
    plan = plan_imports(interp, names)
    ok, error, failed = True, None, None
    guarded: set = set()  # indexes of failed steps whose OSError the module catches
    causes: dict = {}  # index of a caught failure -> the operator use it makes fail
    missing = dict(plan.missing)
    for name in names:
        for load in plan.per_name.get(name, ()):
            if load.how == "operator":
                cause = _operator_missing(sim, guarded, load.path)
                if cause is not None:
                    # the library that registers the operator failed (its OSError caught):
                    # torch.library raises when asked for a kernel of an operator it lacks
                    guarded.discard(cause)
                    ok, error, failed = False, f"RuntimeError: operator {load.path} does not exist", load.module
                    plan.notes.append(f"{load.module} needs the operator {load.path}, which "
                                      f"{sim.model.steps[cause].load.target} registers and which failed to load")
                    causes[cause] = load
                    break
                continue
            step = sim.dlopen(Load(load.path, "import" if load.how == "import" else "dlopen",
                                   flags if load.flags is None else load.flags, load.module, name))
            if load.how == "import" and not step.ok:
                step = _after_package_preloads(sim, step, load, name)
            if load.how != "import":
                if not step.ok and load.guarded:
                    guarded.add(len(sim.model.steps) - 1)
                    plan.notes.append(f"{load.module}: {load.path} fails to load ({step.error}); the module "
                                      "catches the OSError and goes on")
                elif not step.ok:
                    ok, error, failed = False, _python_load_error(load, step.error), load.module
                    break
                continue
            if any(sym.startswith("PyImport_Import") for sym, _v in sim.symbols.undefined(load.path)):
                # numpy's _multiarray_umath imports datetime, contextvars, ... from its C init
                plan.notes.append(f"{load.path}: imports modules from C when initialised "
                                  "(PyImport_Import*); which ones is not known statically (use --observe)")
            if not step.ok:
                ok, error, failed = False, step.python_error, load.module
                break
        if not ok:
            break
        if name in missing:
            ok, error, failed = False, f"ModuleNotFoundError: No module named '{missing[name]}'", name
            break
    return Prediction(names, sim.model, plan, interp, ok, error, failed, guarded=guarded, causes=causes)


_CANNOT_OPEN = re.compile(r"^([^:/\s]+): cannot open shared object file")


def _after_package_preloads(sim, step, load: ExtensionLoad, name: str):
    """The extension's load once the package's own loader has run: faiss/loader.py (and
    the other packages rules/context/packages.yaml says load the NVIDIA wheels' libraries
    themselves, RTLD_GLOBAL, before their modules) maps site-packages/nvidia/*/lib/NAME
    for each NAME the module's closure cannot otherwise open."""
    from ..resolve.process import RTLD_GLOBAL, RTLD_NOW, Load
    from . import practice

    top = (load.module or "").split(".")[0]
    reason = practice.preload_reason(top) if top else None
    site = practice.site_packages_of(load.path)
    if reason is None or reason[1] != "preloaded" or "nvidia-wheels" not in reason[2] or site is None:
        return step
    wheel_libs = practice.nvidia_wheel_libs(site)
    tried: set = set()
    while not step.ok:
        match = _CANNOT_OPEN.match(step.error or "")
        found = wheel_libs.get(match.group(1)) if match else None
        if found is None or found in tried or len(tried) > 16:
            return step
        tried.add(found)
        sim.model.steps.pop()  # the attempt without the preload: the loader runs first
        preload = sim.dlopen(Load(found, "dlopen", RTLD_NOW | RTLD_GLOBAL, f"{top}: its loader", name))
        if not preload.ok:
            sim.model.steps.pop()
            return sim.dlopen(Load(load.path, "import", step.load.flags, load.module, name))
        step = sim.dlopen(Load(load.path, "import", step.load.flags, load.module, name))
    return step


def _operator_missing(sim, guarded: set, qualname: str):
    """The index of the caught failed load whose file registers ``qualname`` (the schema
    text "ns::op(" that TORCH_LIBRARY's m.def() keeps in the library), or None: an operator
    no failed library names may come from anywhere else."""
    import mmap

    needle = qualname.encode("utf-8", "surrogateescape") + b"("
    for index in sorted(guarded):
        target = sim.model.steps[index].load.target
        try:
            with open(target, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                if data.find(needle) >= 0:
                    return index
        except (OSError, ValueError):
            continue
    return None


def _python_load_error(load: ExtensionLoad, error: str) -> str:
    """The exception a failed load by path ends the import with: ctypes raises OSError with
    dlerror()'s text (Modules/_ctypes/callproc.c); torch.ops.load_library catches that and
    raises OSError("Could not load this library: PATH") from it (torch/_ops.py)."""
    if load.how == "torch.ops":
        return f"OSError: Could not load this library: {load.path}"
    return f"OSError: {error}"


def predict_dlopens(executable: str, libraries, flags: int, resolver=None,
                    search_orders: bool = True) -> Prediction:
    """A non-Python host: ``executable`` starts, then dlopens each library in order; when
    that fails, the other orders are tried (the order that works is the fix to suggest)."""
    from ..resolve import Resolver
    resolver = resolver or Resolver(env=_loader_env())
    libraries = tuple(libraries)
    prediction = _run_dlopens(executable, libraries, flags, resolver)
    if search_orders:
        _search_orders(prediction, libraries, lambda order: _run_dlopens(executable, order, flags, resolver))
    return prediction


def _run_dlopens(executable: str, libraries: tuple, flags: int, resolver) -> Prediction:
    from ..resolve.process import Load, Simulator
    sim = Simulator(resolver, executable)
    sim.start()
    ok, error, failed = True, None, None
    for item in libraries:
        lib, lib_flags = item if isinstance(item, tuple) else (item, flags)
        step = sim.dlopen(Load(lib, "dlopen", lib_flags, None, lib))
        if not step.ok:
            ok, error, failed = False, step.error, lib
            break
    return Prediction(tuple(x[0] if isinstance(x, tuple) else x for x in libraries), sim.model, None, None,
                      ok, error, failed)


def shadowing_facts(prediction: Prediction) -> list:
    """One `process-load` fact per shadowed NEEDED, per failed load and per import that
    fails because a module is not found (rules/process.yaml)."""
    from ..model.report import Fact
    if prediction.ok:
        hint = "this order loads: the copy loaded first serves both here"
    elif prediction.working_order:
        hint = "import order that works: " + ", ".join(prediction.working_order) \
            if prediction.plan is not None else "order that works: " + ", ".join(prediction.working_order)
    elif prediction.searched_orders:
        hint = "no import order works" if prediction.plan is not None else "no order works"
    else:
        hint = ""
    # a shadowing's message and fix always say something of the order (never "...; ")
    shadow_hint = hint or ("a single load: no order to change" if len(prediction.names) < 2
                           else "other orders not tried")
    facts = []
    python = prediction.plan is not None
    why_args = (f"--imports {','.join(prediction.names)}" if python
                else f"--in {prediction.model.executable}")
    for index, step in enumerate(prediction.model.steps):
        if index in prediction.guarded:
            continue  # a load the module tries and does without (a note says so)
        module = step.load.module or step.load.target
        how = f"import {step.load.importer}" if python else f"dlopen {step.load.target}"
        for shadow in step.shadowed:
            missing = ", ".join(s + (f"@{v}" if v else "") for s, v in shadow.missing)
            copies = ", ".join(s + (f"@{v}" if v else "") for s, v, _p in shadow.other_copy[:5])
            facts.append(Fact("process-load", {"path": shadow.requester}, {
                "event": "shadowed", "importer": step.load.importer or "", "module": module,
                "how": how, "why_args": why_args,
                "name": shadow.name, "used": shadow.used, "alone": shadow.alone,
                "loaded_by": shadow.loaded_by, "loaded_for": shadow.loaded_for,
                "missing": missing, "other_copy": copies, "order_hint": shadow_hint,
                "consequence": (step.shadow_consequence(missing) if missing else
                                f"{len(shadow.other_copy)} of its symbols bind to that copy"
                                + (f" ({copies})" if copies else "")),
                "error": step.error or ""}, source="python_env"))
        if not step.ok and not step.shadowed and step.load.kind != "exec":
            then = f"; {hint}" if hint else ""
            if python and step.load.kind == "dlopen":
                # a library the module loads by path (ctypes, torch.ops.load_library): Python
                # raises what ctypes or torch raises, not ImportError
                how = f"loaded by path when {how} runs"
                then = f"; the import raises {prediction.error}{then}" if prediction.failed_module == module \
                    else then
                use = prediction.causes.get(index)
                if use is not None:
                    then = (f"; the module catches the OSError, then {use.module.partition(':')[0]} asks torch.library "
                            f"for the operator {use.path}, which this library registers: the import raises "
                            f"{prediction.error}{'; ' + hint if hint else ''}")
            facts.append(Fact("process-load", {"path": step.load.target}, {
                "event": "failed", "importer": step.load.importer or "", "module": module,
                "how": how, "why_args": why_args, "then": then,
                "error": step.error or "", "order_hint": hint}, source="python_env"))
    if python and not prediction.ok and prediction.failed_module in dict(prediction.plan.missing):
        # no load fails: Python's own finder does (ModuleNotFoundError, before any dlopen)
        interp = prediction.interpreter
        module = dict(prediction.plan.missing)[prediction.failed_module]
        distribution, fix = import_failure_fix(interp, module)
        exception, _sep, _text = (prediction.error or "").partition(":")
        facts.append(Fact("process-load", {"path": interp.executable}, {
            "event": "import-fails", "importer": prediction.failed_module, "module": module,
            "python": interp.python, "exception": exception, "error": prediction.error or "",
            "distribution": distribution, "fix": fix}, source="python_env"))
    return facts
