"""The classes written out with record.py (issue 13: no dataclasses import, no exec() per
class on a command's start) against the @dataclass each was.

The oracle is a real dataclass per class, declared here from the fields the class had as a
dataclass at 7104be9 (listed here, not read from the code under test): construction with
defaults, repr, ==, hash() or its absence, frozenness, a new default container per
instance, _replace against dataclasses.replace, and the JSON form (model._plain)."""
from __future__ import annotations

import copy
import dataclasses
import sys

import pytest

from seedance.collect.closure import NeededSeen
from seedance.collect.cuda import DriverSpec, GpuInfo
from seedance.collect.process import Mapping, ProcessView
from seedance.collect.scan import CheckOptions
from seedance.collect.torch_ext import CachedBuild, TorchInstall
from seedance.judge.engine import Rule
from seedance.judge.filters import FindingFilter, Ignore
from seedance.fix.atomic import MappedIndex
from seedance.fix.dynedit import EditPlan, FileEdit, Patch, StrRef
from seedance.fix.handle_leak import HandleLeakResult
from seedance.fix.journal import UndoResult
from seedance.model.report import Fact, Finding, Report, _plain

REQ = dataclasses.MISSING
PY_TAG = f"py{sys.version_info[0]}{sys.version_info[1]}{getattr(sys, 'abiflags', '')}"


def f(name, default=REQ, factory=REQ, compare=True, shown=True):
    return (name, default, factory, compare, shown)


# (class, frozen, fields as the dataclass declared them, positional values for the required ones)
SPECS = [
    (Fact, True, [f("kind"), f("subject"), f("data"), f("source", "")], ("needed", {"path": "/a"}, {"n": 1})),
    (Finding, True, [f("rule"), f("severity"), f("trap"), f("layer"), f("subject"), f("message"),
                     f("evidence", factory=dict), f("fix", ""), f("title", "")],
     ("r", "error", "t", "L2", {"path": "/a"}, "m")),
    (Report, False, [f("command"), f("host", factory=dict), f("stats", factory=dict), f("findings", factory=list),
                     f("extra", factory=dict)], ("check",)),
    (Rule, True, [f("id"), f("title"), f("severity"), f("trap"), f("layer"), f("fact"), f("condition"),
                  f("message"), f("explain"), f("metric"), f("fix"), f("evidence", ()), f("strict_only", False),
                  f("maturity", "stable"), f("source", ""), f("program", None, compare=False, shown=False),
                  f("names", (), compare=False, shown=False), f("memo", factory=dict, compare=False, shown=False),
                  f("escalate", None), f("escalate_program", None, compare=False, shown=False),
                  f("defaults", None)],
     ("id", "title", "warning", "trap", "L1", "needed", "true", "msg", "why", "metric", "fix")),
    (DriverSpec, True, [f("text"), f("kind"), f("version"), f("cuda")], ("535", "branch", (535,), (12, 2))),
    (GpuInfo, False, [f("driver_version", None), f("driver_source", ""), f("targets", factory=list),
                      f("devices", factory=list), f("nvml", False), f("nvml_error", "")], ()),
    (NeededSeen, False, [f("standalone", None), f("via_loader", None), f("loader", None), f("first", None),
                         f("context", ""), f("reason", ""), f("package", "")], ()),
    (CheckOptions, False, [f("targets", factory=list), f("pids", factory=list), f("arch", None),
                           f("driver_version", None), f("strict", False), f("rules_dir", None), f("env", None),
                           f("python", None), f("nvml", None)], ()),
    (StrRef, False, [f("field_off"), f("size"), f("value"), f("role"), f("hash_off", None), f("owner", None)],
     (100, 4, 7, "needed")),
    (Patch, True, [f("offset"), f("data")], (8, b"ab")),
    (EditPlan, False, [f("patches"), f("changes"), f("strategy")], ([], ["c"], "none")),
    (FileEdit, False, [f("path"), f("strategy"), f("changes"), f("size_before"), f("patches", None),
                       f("data", None), f("identity", None)], ("/a", "in-place", [], 10)),
    (HandleLeakResult, False, [f("mode"), f("gc_interval"), f("changed", factory=list),
                               f("unchanged", factory=list), f("journal_id", None), f("agent", "")],
     ("per-instance", "2s")),
    (MappedIndex, False, [f("maps", factory=list)], ()),
    (UndoResult, False, [f("id"), f("restored", factory=list), f("notes", factory=list),
                         f("unchanged", factory=list), f("refused", "")], ("20260101-000000-000000",)),
    (Ignore, False, [f("rule", None), f("glob", None), f("fingerprint", None)], ()),
    (FindingFilter, False, [f("select", None), f("ignore", factory=list), f("min_severity", None),
                            f("baseline", None), f("baseline_path", None), f("config_path", None)], ()),
    (Mapping, False, [f("path"), f("inode"), f("dev"), f("range"), f("deleted")],
     ("/usr/lib/libc.so.6", 12, "08:01", "7f00-7f10", False)),
    (ProcessView, False, [f("pid"), f("exe"), f("root"), f("environ", factory=dict), f("mappings", factory=list),
                          f("foreign", False), f("container", None), f("comm", ""), f("root_key", None)],
     (42, "/bin/x", "/")),
    (TorchInstall, False, [f("path"), f("version"), f("cuda"), f("hip", None),
                           f("python_tag", factory=lambda: PY_TAG), f("source", "")],
     ("/site/torch", "2.13.0", None)),
    (CachedBuild, False, [f("path"), f("name"), f("tag"), f("ninja", factory=dict), f("library", None),
                          f("kind", "load")], ("/c/ext", "ext", "py311_cpu")),
]
IDS = [spec[0].__name__ for spec in SPECS]


def oracle_of(cls, frozen, fields):
    declared = []
    for name, default, factory, compare, shown in fields:
        options = {"compare": compare, "repr": shown}
        if factory is not REQ:
            options["default_factory"] = factory
        elif default is not REQ:
            options["default"] = default
        declared.append((name, object, dataclasses.field(**options)))
    made = dataclasses.make_dataclass(cls.__name__, declared, frozen=frozen)
    made.__qualname__ = cls.__qualname__
    return made


def full_values(fields, required):
    """A value for every field, each different from its default."""
    values = list(required)
    for name, default, factory, _c, _s in fields[len(required):]:
        values.append({"list": ["v"], "dict": {"k": name}}.get(
            type(factory()).__name__ if factory is not REQ else "", f"set-{name}"))
    return values


@pytest.mark.parametrize("cls, frozen, fields, required", SPECS, ids=IDS)
def test_construction_repr_and_equality_are_the_dataclass_ones(cls, frozen, fields, required):
    oracle = oracle_of(cls, frozen, fields)
    for args in (list(required), full_values(fields, required)):
        ours, theirs = cls(*args), oracle(*args)
        assert vars(ours) == vars(theirs) and list(vars(ours)) == [name for name, *_ in fields]
        assert repr(ours) == repr(theirs)
        assert _plain(ours) == _plain(theirs)
        assert ours == cls(*args) and not (ours != cls(*args))
        assert ours != theirs and theirs != ours  # another class: never equal, as between dataclasses
        keywords = dict(zip([name for name, *_ in fields], args))
        assert cls(**keywords) == ours
        for name, _d, _f, compare, _s in fields:
            changed = cls(**{**keywords, name: ("changed",)})
            assert (changed == ours) == (oracle(**{**keywords, name: ("changed",)}) == theirs) == (not compare)
            assert ours._replace(**{name: ("changed",)}) == changed
            assert repr(ours._replace(**{name: ("changed",)})) == repr(dataclasses.replace(theirs, **{name: ("changed",)}))
        with pytest.raises(TypeError):
            ours._replace(no_such_field=1)
        assert copy.copy(ours) == ours


@pytest.mark.parametrize("cls, frozen, fields, required", SPECS, ids=IDS)
def test_hash_and_frozenness_are_the_dataclass_ones(cls, frozen, fields, required):
    oracle = oracle_of(cls, frozen, fields)
    hashable = [("h", i) for i in range(len(fields))]  # tuples: hash() works on every field
    ours, theirs = cls(*hashable), oracle(*hashable)
    if frozen:
        assert hash(ours) == hash(theirs)
        with pytest.raises(AttributeError):
            setattr(ours, fields[0][0], 1)
        with pytest.raises(AttributeError):
            delattr(ours, fields[0][0])
    else:
        for one in (ours, theirs):
            with pytest.raises(TypeError):
                hash(one)
        setattr(ours, fields[0][0], 1)
        setattr(theirs, fields[0][0], 1)
        assert vars(ours) == vars(theirs)


@pytest.mark.parametrize("cls, frozen, fields, required", SPECS, ids=IDS)
def test_each_default_container_is_a_new_one(cls, frozen, fields, required):
    one, two = cls(*required), cls(*required)
    for name, _d, factory, _c, _s in fields:
        if factory is not REQ and isinstance(factory(), (list, dict)):
            assert getattr(one, name) == factory() and getattr(one, name) is not getattr(two, name)
    explicit_none = cls(*required, *[None] * (len(fields) - len(required)))
    assert all(getattr(explicit_none, name) is None for name, *_ in fields[len(required):])


def test_the_commands_import_no_dataclasses():
    """`check PATH`, `check` of the host and `fix` reach no @dataclass (each cost ~3M
    instructions and the import ~47M): run in a fresh interpreter."""
    import subprocess
    probe = ("import sys, io, contextlib\nfrom seedance import cli\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    for argv in (['check', sys.executable], ['fix', 'cuda-mismatch', '--dry-run', sys.executable]):\n"
             "        try:\n            cli.main(argv)\n        except SystemExit:\n            pass\n"
             "print(sorted(m for m in ('dataclasses', 'inspect') if m in sys.modules))\n")
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, errors="replace", timeout=300)
    assert ran.stdout.strip().splitlines()[-1] == "[]", (ran.stdout, ran.stderr)
