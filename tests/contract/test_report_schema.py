"""The seedance.report/v1 contract: the shipped JSON Schema and what check emits."""
from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from seedance.judge.engine import load_rules
from seedance.model.report import Fact, Finding, Report
from tests.conftest import ROOT, run_cli

SCHEMA_PATH = ROOT / "agent" / "schemas" / "report.schema.json"
SCHEMA = json.loads(SCHEMA_PATH.read_text())


def test_schema_is_a_valid_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_schema_is_installed_with_the_package():
    from importlib.resources import files
    installed = files("seedance") / "schemas" / "report.schema.json"
    assert json.loads(installed.read_text()) == SCHEMA


def sample_report() -> dict:
    rules = load_rules()
    facts = [Fact("needed", {"path": "/x.so"}, {"name": "libcudart.so.12", "resolved": False,
                                                 "tried": [["/a/libcudart.so.12", "no such file"]],
                                                 "search_order": [["runpath", "/a"]]}),
             Fact("mapped_lib", {"pid": 42, "path": "/y.so"}, {"deleted": True, "replaced": False,
                                                               "state": "deleted", "exe": "/bin/x"})]
    report = Report(command="check", host={"hostname": "h", "kernel": "6", "glibc": "glibc 2.36",
                                           "cpu": {"model": "x", "count": 2}, "gpu": None},
                    stats={"files_scanned": 1, "elf_objects": 1, "duration_s": 0.1, "facts": 2, "errors": []})
    report.add(rules.evaluate(facts))
    report.add([Finding("batch-x", "warning", "batch-static", "L7", {"plugin": "enc"}, "static batching")])
    return report.to_dict()


def test_model_report_validates_and_waste_traps_are_findings():
    doc = sample_report()
    jsonschema.validate(doc, SCHEMA)
    assert [f["rule"] for f in doc["waste_traps"]] == ["batch-x"]


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(schema="seedance.report/v2"),
    lambda d: d["findings"][0].update(severity="loud"),
    lambda d: d["findings"][0].update(layer="L9"),
    lambda d: d["findings"][0].update(subject={}),
    lambda d: d["findings"][0].pop("fix"),
    lambda d: d["findings"][0].update(evidence=[]),
    lambda d: d.pop("waste_traps"),
    lambda d: d["waste_traps"].append(dict(d["findings"][0], trap="needed-wrong-file")),
    lambda d: d["stats"].update(duration_s=-1),
])
def test_schema_rejects_broken_reports(mutate):
    doc = copy.deepcopy(sample_report())
    mutate(doc)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMA)


def test_check_json_on_a_config_validates(tmp_path):
    cfg = tmp_path / "plugins.yaml"
    cfg.write_text("LD_PRELOAD: ${HOME}/libshim.so\n")
    proc = run_cli("check", "--report-json", "-", cfg)
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["schema"] == "seedance.report/v1"
    finding = doc["findings"][0]
    assert set(finding) == {"rule", "severity", "trap", "layer", "subject", "message", "evidence", "fix", "fingerprint"}
    assert finding["subject"] == {"path": str(cfg)}


def test_every_rule_is_documented_in_rules_readme():
    readme = (ROOT / "rules" / "README.md").read_text()
    missing = [rule.id for rule in load_rules().rules if f"`{rule.id}`" not in readme]
    assert missing == []
