"""RelinkAction and FixPlan behave as the @dataclass they were (issue 13 wrote them out).

Oracle: the same fields declared with dataclasses here, compared on construction
(positional, keyword, defaults), repr, ==, hash() and mutation."""
import dataclasses

import pytest

from seedance.fix.plan import FixPlan, RelinkAction


@dataclasses.dataclass
class RelinkActionDC:
    path: str
    renames: dict
    version_renames: dict
    target_major: int
    targets: dict
    findings: list = dataclasses.field(default_factory=list)
    refusal: str | None = None
    strategy: str = ""
    growth: int = 0
    changes: list = dataclasses.field(default_factory=list)
    identity: tuple | None = None


@dataclasses.dataclass
class FixPlanDC:
    kind: str
    actions: list = dataclasses.field(default_factory=list)
    skipped: list = dataclasses.field(default_factory=list)
    findings: list = dataclasses.field(default_factory=list)
    target_major: int | None = None
    target_source: str = ""


def as_oracle(record, oracle):
    return oracle(**vars(record))


def repr_body(obj) -> str:
    return repr(obj).split("(", 1)[1]


CASES = [
    (RelinkAction, RelinkActionDC, ("/l/libk.so", {"a.so.12": "a.so.13"}, {}, 13, {"a.so.13": "/x/a.so.13"}), {}),
    (RelinkAction, RelinkActionDC, ("/l/libk.so", {}, {}, 12, {}),
     {"findings": ["m"], "refusal": "no", "strategy": "in-place", "growth": 3, "changes": ["c"], "identity": (1, 2)}),
    (FixPlan, FixPlanDC, ("cuda-mismatch",), {}),
    (FixPlan, FixPlanDC, ("cuda-mismatch", [1], [("p", "why")]), {"findings": ["f"], "target_major": 13,
                                                                   "target_source": "--runtime"}),
]


@pytest.mark.parametrize("cls, oracle, args, kwargs", CASES)
def test_fields_defaults_repr_and_equality_are_the_dataclass_ones(cls, oracle, args, kwargs):
    ours, theirs = cls(*args, **kwargs), oracle(*args, **kwargs)
    assert vars(ours) == vars(theirs)
    assert list(vars(ours)) == [f.name for f in dataclasses.fields(oracle)]
    assert repr_body(ours) == repr_body(theirs) and repr(ours).startswith(f"{cls.__name__}(")
    assert ours == cls(*args, **kwargs) and as_oracle(ours, oracle) == theirs
    assert ours != theirs and theirs != ours  # another class: never equal, as between dataclasses
    with pytest.raises(TypeError):
        hash(ours)
    with pytest.raises(TypeError):
        hash(theirs)
    other = cls(*args, **kwargs)
    setattr(other, "findings", ["changed"])
    assert (other == ours) == (as_oracle(other, oracle) == theirs)


def test_each_default_list_is_a_new_one():
    one, two = RelinkAction("/a", {}, {}, 13, {}), RelinkAction("/a", {}, {}, 13, {})
    one.changes.append("x")
    one.findings.append("y")
    assert two.changes == [] and two.findings == []
    plan = FixPlan("cuda-mismatch")
    plan.actions.append(one)
    assert FixPlan("cuda-mismatch").actions == []


def test_missing_or_unknown_arguments_fail_as_they_did():
    for call in (lambda c: c("/a", {}, {}, 13), lambda c: c("/a", {}, {}, 13, {}, nope=1)):
        with pytest.raises(TypeError):
            call(RelinkActionDC)
        with pytest.raises(TypeError):
            call(RelinkAction)
