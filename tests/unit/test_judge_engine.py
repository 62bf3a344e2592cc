from pathlib import Path

import pytest

from seedance.judge.engine import load_rules
from seedance.model.errors import RuleError
from seedance.model.report import Fact, Report

RULE = """
rules:
  - id: demo-rule
    title: demo
    severity: error
    trap: needed-wrong-file
    layer: L2
    fact: needed
    condition: "!resolved && name.startsWith('libcuda')"
    message: "{name} needed by {path} missing"
    explain: x
    metric: y
    evidence: [name]
    fix: "seedance check --explain {name} {path}"
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "r.yaml").write_text(text)
    return tmp_path


def test_rule_matches_and_formats(tmp_path):
    rules = load_rules(write(tmp_path, RULE))
    facts = [Fact("needed", {"path": "/x.so"}, {"name": "libcudart.so.12", "resolved": False}),
             Fact("needed", {"path": "/x.so"}, {"name": "libcudart.so.12", "resolved": True}),
             Fact("needed", {"path": "/x.so"}, {"name": "libz.so.1", "resolved": False}),
             Fact("other", {"path": "/x.so"}, {"name": "libcudart.so.12", "resolved": False})]
    findings = rules.evaluate(facts)
    assert [f.message for f in findings] == ["libcudart.so.12 needed by /x.so missing"]
    assert findings[0].fix == "seedance check --explain libcudart.so.12 /x.so"
    assert findings[0].evidence == {"name": "libcudart.so.12"}


def test_missing_attribute_is_no_match(tmp_path):
    rules = load_rules(write(tmp_path, RULE))
    assert rules.evaluate([Fact("needed", {"path": "/x"}, {"name": "libcuda.so.1"})]) == []


@pytest.mark.parametrize("bad, words", [
    ("rules: [", "not valid YAML"),
    ("rules: 3", "'rules:' list"),
    (RULE.replace("severity: error", "severity: loud"), "severity"),
    (RULE.replace("!resolved &&", "!resolved &&&"), "does not compile"),
    (RULE.replace("    metric: y\n", ""), "missing field"),
    (RULE + RULE.split("rules:\n", 1)[1], "duplicate rule id"),
])
def test_bad_rules_are_one_line_errors(tmp_path, bad, words):
    with pytest.raises(RuleError) as err:
        load_rules(write(tmp_path, bad))
    assert words in str(err.value)
    assert "\n" not in str(err.value)


def test_shipped_rules_load_and_ids_are_unique():
    rules = load_rules()
    ids = [r.id for r in rules.rules]
    assert len(ids) == len(set(ids))
    for wanted in ("needed-unresolved", "needed-soname-mismatch", "symbol-version-missing",
                   "symbol-undefined", "cuda-runtime-mixed", "cuda-arch-missing",
                   "cuda-driver-too-old", "cxx-abi-mismatch", "torch-ext-stale", "lib-deleted",
                   "env-leak"):
        assert wanted in rules.by_id


def test_report_exit_codes_and_waste_traps(tmp_path):
    rules = load_rules(write(tmp_path, RULE.replace("severity: error", "severity: warning")))
    report = Report("check")
    report.add(rules.evaluate([Fact("needed", {"path": "/x"}, {"name": "libcuda.so.1", "resolved": False})]))
    assert report.exit_code() == 0
    assert report.exit_code(strict=True) == 1
    assert report.to_dict()["waste_traps"] == []


def test_loaded_rules_are_reread_when_a_file_changes(tmp_path):
    # load_rules keeps the last directory's rules (fix checks twice); a rule file rewritten
    # in place, replaced by a new inode, or added must be read again.
    directory = write(tmp_path, RULE)
    first = load_rules(directory)
    assert load_rules(directory) is first
    fact = Fact("needed", {"path": "/x.so"}, {"name": "libcudart.so.12", "resolved": False})
    assert [f.severity for f in first.evaluate([fact])] == ["error"]
    path = directory / "r.yaml"
    with open(path, "r+") as handle:  # in place: same inode
        handle.write(RULE.replace("severity: error", "severity: info "))
    in_place = load_rules(directory)
    assert [f.severity for f in in_place.evaluate([fact])] == ["info"]
    replacement = directory / "new.tmp"
    replacement.write_text(RULE.replace("severity: error", "severity: warning"))
    replacement.rename(path)  # a new inode at the same name
    assert [f.severity for f in load_rules(directory).evaluate([fact])] == ["warning"]
    (directory / "z.yaml").write_text("rules: [{id: x}]\n")
    with pytest.raises(RuleError):
        load_rules(directory)
