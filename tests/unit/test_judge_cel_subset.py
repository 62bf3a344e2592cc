"""cel_subset (agent/judge/cel_subset.py) against the real CEL binding: on every condition of
rules/*.yaml (and escalate conditions), over generated contexts, an answer from the subset
is the binding's answer; where it defers, the engine asks the binding.  The subset must
also answer the plain cases itself, or it saves nothing."""
from __future__ import annotations

import itertools
import random
import subprocess
import sys

import pytest
import yaml

from seedance.judge import cel_subset
from seedance.judge.engine import _cel_core, default_rules_dir, load_rules
from seedance.model.report import Fact

VALUES = [None, True, False, 0, 1, 2, -1, 0.0, 1.5, -2.5, "", "x", "GLIBC", "danger", "healthy", "shadowed",
          "private", "node-lacks-symbol", "depends.x", "adaptive", [], [1], [12, 13], {"k": 1},
          "\u00e9", "d\u00e9pends.\U0001F600", 1 << 63, -(1 << 63) - 1]


def conditions() -> list:
    import glob
    import os
    found = []
    for path in sorted(glob.glob(os.path.join(default_rules_dir(), "*.yaml"))):
        with open(path, encoding="utf-8") as handle:
            for rule in (yaml.safe_load(handle) or {}).get("rules", []):
                found.append(rule["condition"])
                if "escalate" in rule:
                    found.append(rule["escalate"]["condition"])
    return found


def names_of(text: str) -> list:
    from seedance.judge.engine import _condition_names
    return list(_condition_names(text))


def cel_answer(program, context):
    try:
        return program.execute(context)
    except Exception as exc:
        return ("error", str(exc).split(":")[0])


@pytest.mark.parametrize("text", conditions())
def test_every_rule_condition_is_in_the_subset_and_agrees_with_cel(text):
    tree = cel_subset.compile(text)
    assert tree is not None, f"not in the subset: {text}"
    program = _cel_core().compile(text)
    names = names_of(text)
    rng = random.Random(f"cel-subset {text}")
    contexts = []
    for _ in range(400):
        context = {}
        for name in names:
            if rng.random() < 0.9:
                context[name] = rng.choice(VALUES)
        contexts.append(context)
    answered = 0
    for context in contexts:
        try:
            ours = cel_subset.evaluate(tree, context)
        except cel_subset.Defer:
            continue
        answered += 1
        assert ours == cel_answer(program, context), (text, context)
    assert answered > 0, f"the subset never answered {text}"


@pytest.mark.parametrize("text", conditions())
def test_the_subset_answers_well_typed_contexts(text):
    """With each name given a value of a type the condition can use, the subset answers at
    least one of them: plain rules never need the binding."""
    tree = cel_subset.compile(text)
    program = _cel_core().compile(text)
    names = names_of(text)
    typed = [True, False, 0, 2, 3, 2.5, "", "GLIBC", "depends.a", [1, 2]]
    answered = 0
    for combo in itertools.islice(itertools.product(typed, repeat=len(names)), 3000):
        context = dict(zip(names, combo))
        if not isinstance(cel_answer(program, context), bool):
            continue
        try:
            ours = cel_subset.evaluate(tree, context)
        except cel_subset.Defer:
            continue
        answered += 1
        assert ours == program.execute(context)
    assert answered > 0


@pytest.mark.parametrize("op", ["==", "!=", "<", "<=", ">", ">="])
def test_each_relation_on_each_plain_type_is_cels(op):
    """Every relation over equal, smaller and larger values of each plain type (and bools for
    == and !=), the subset against the binding."""
    program, tree = _cel_core().compile(f"a {op} b"), cel_subset.compile(f"a {op} b")
    pairs = [(a, b) for kind in ([-1, 0, 2, 3], [-0.5, 0.0, 2.0, 2.5], ["", "a", "ab", "b", "\u00e9"])
             for a in kind for b in kind]
    pairs += [(a, b) for a in (True, False) for b in (True, False)] if op in ("==", "!=") else []
    for a, b in pairs:
        assert cel_subset.evaluate(tree, {"a": a, "b": b}) == program.execute({"a": a, "b": b}), (a, op, b)


@pytest.mark.parametrize("text, context, expected", [
    ("a && b || c", {"a": True, "b": False, "c": True}, True),
    ("a || b && c", {"a": False, "b": True, "c": False}, False),
    ("!(a == 'x') && size(l) > 1", {"a": "y", "l": [1, 2]}, True),
    ("l.size() >= 2 && s.startsWith('ab')", {"l": (1, 2), "s": "abc"}, True),
    ("n < 2 && f > 0.5", {"n": 1, "f": 0.75}, True),
    ("false && missing", {}, False),
    ("true || missing", {}, True),
])
def test_precedence_and_short_circuit_as_cel(text, context, expected):
    tree = cel_subset.compile(text)
    assert cel_subset.evaluate(tree, context) is expected
    plain = {k: list(v) if isinstance(v, tuple) else v for k, v in context.items()}
    assert _cel_core().compile(text).execute(plain) is expected


@pytest.mark.parametrize("text, context", [
    ("missing", {}),  # no such variable
    ("a == 1", {"a": 1.0}),  # int against float: CEL's cross-type rules
    ("a > 0.0", {"a": 1}),
    ("a && true", {"a": 1}),  # a non-bool operand
    ("a == ''", {"a": None}),
    ("size(a) > 0", {"a": {"k": 1}}),
    ("size(a) == 1", {"a": "\u00e9"}),  # the binding counts UTF-8 bytes (2), not code points (1)
    ("a > 1", {"a": 1 << 63}),  # past int64
])
def test_what_the_subset_leaves_to_cel(text, context):
    with pytest.raises(cel_subset.Defer):
        cel_subset.evaluate(cel_subset.compile(text), context)


@pytest.mark.parametrize("text", ["a in [1, 2]", "a + 1 > 2", "a == null", "f(a)", "a.b == 1", "'x\\'y' == a",
                                  "a == b == c", "a ? b : c", "a[0] == 1", "a =="])
def test_outside_the_subset_is_none(text):
    assert cel_subset.compile(text) is None


def test_a_non_utf8_name_is_judged_not_a_crash(tmp_path):
    """A NEEDED holding a byte that is not UTF-8 (os.fsdecode gives a lone surrogate): the CEL
    binding cannot convert it, and `check` stopped with "rule needed-soname-mismatch: condition
    failed" (exit 2).  Now the library is judged: needed-unresolved, exit 1."""
    import os
    import shutil
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    odd = os.fsencode(str(tmp_path)) + b"/lib\xff.so"
    (tmp_path / "f.c").write_text("int f(void){return 1;}\n")
    (tmp_path / "g.c").write_text("int g(void){return 2;}\n")
    subprocess.run([b"gcc", b"-shared", b"-fPIC", b"-o", odd, os.fsencode(str(tmp_path / "f.c"))], check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "libg.so"), str(tmp_path / "g.c"),
                    "-Wl,--no-as-needed", f"-L{tmp_path}", "-l:" + os.fsdecode(b"lib\xff.so")], check=True)
    os.unlink(odd)
    ran = subprocess.run([sys.executable, "-m", "seedance", "check", "--json", str(tmp_path / "libg.so")],
                         capture_output=True, timeout=120)
    assert ran.returncode == 1, ran.stderr
    import json
    rules = [f["rule"] for f in json.loads(ran.stdout)["findings"]]
    assert rules == ["needed-unresolved"]


def test_a_condition_outside_the_subset_still_takes_a_non_utf8_string():
    """The binding's fallback: a string with a lone surrogate reaches CEL with its bytes as
    \\xNN, so a condition the subset leaves to CEL judges it instead of failing."""
    from seedance.judge.engine import _LazyProgram
    program = _LazyProgram("name in ['lib\\\\xff.so']", "test")
    assert cel_subset.compile(program.text) is None
    assert program.execute({"name": "lib\udcff.so"}) is True
    assert program.execute({"name": "libz.so"}) is False


def test_the_engine_judges_a_scan_without_loading_the_binding(tmp_path):
    """A check of a plain library evaluates its rules in the subset: the CEL binding (with the
    logging and datetime it imports) is not loaded."""
    probe = ("import sys, io, contextlib\nfrom seedance import cli\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    try:\n        cli.main(['check', '/bin/true' if len(sys.argv) < 2 else sys.argv[1]])\n"
             "    except SystemExit:\n        pass\n"
             "print(sorted(m for m in ('cel.cel', 'logging') if m in sys.modules))\n")
    ran = subprocess.run([sys.executable, "-c", probe, sys.executable], capture_output=True, text=True,
                         errors="replace", timeout=300)
    assert ran.stdout.strip().splitlines()[-1] == "[]", (ran.stdout, ran.stderr)


def test_rules_load_the_same_facts_to_the_same_findings_either_way(monkeypatch):
    """Findings of a rule set over facts of several kinds are the same with the subset as with
    the binding alone (the subset switched off)."""
    facts = [Fact("needed", {"path": "/x.so"}, {"name": "libcudart.so.12", "resolved": False, "context": ""}),
             Fact("needed", {"path": "/x.so"}, {"name": "libz.so.1", "resolved": True, "same_library": False,
                                                "has_soname": True, "soname": "libzz.so.1", "context": ""}),
             Fact("cuda_runtimes", {"path": "/app"}, {"majors": [12, 13], "libraries": ["/a", "/b"]})]
    with_subset = [f.to_dict() for f in load_rules(None).evaluate(facts)]
    monkeypatch.setattr(cel_subset, "compile", lambda text: None)
    import seedance.judge.engine as engine
    monkeypatch.setattr(engine, "_LOADED", {})
    alone = [f.to_dict() for f in load_rules(None).evaluate(facts)]
    assert with_subset == alone and with_subset
