"""check --format sarif against SARIF 2.1.0's object model.

The choice (issue 16): no PyPI package ships the OASIS schema JSON, so the log is checked
against Microsoft's sarif-om, the SARIF 2.1.0 object model as Python classes: every object
seedance writes must map onto its class (every property a SARIF property of that class,
every required property present), and must construct that class.  Plus the spec's enums
(result.level) and the invariants code-scanning UIs rely on (ruleIndex points at its rule).
"""
from __future__ import annotations

import json
import shutil
import subprocess

import attr
import pytest

from tests.conftest import BIN, ROOT, run_cli

sarif_om = pytest.importorskip("sarif_om", reason="sarif-om not installed (requirements-test.txt)")
GCC = shutil.which("gcc")

# SARIF property -> the sarif_om class of its value (an array's items), for what we write
CLASSES = {
    "runs": "Run", "tool": "Tool", "driver": "ToolComponent", "rules": "ReportingDescriptor",
    "results": "Result", "message": "Message", "locations": "Location",
    "physicalLocation": "PhysicalLocation", "artifactLocation": "ArtifactLocation",
    "shortDescription": "MultiformatMessageString", "fullDescription": "MultiformatMessageString",
    "help": "MultiformatMessageString", "defaultConfiguration": "ReportingConfiguration",
}
MAPS = {"originalUriBaseIds": "ArtifactLocation"}  # name -> object: each value is of that class
FREE = {"properties", "partialFingerprints"}  # property bags and string maps: any keys


def conform(value: dict, class_name: str, where: str = "$") -> None:
    cls = getattr(sarif_om, class_name)
    fields = {f.metadata["schema_property_name"]: f for f in attr.fields(cls)}
    unknown = set(value) - set(fields)
    assert not unknown, f"{where}: not {class_name} properties: {sorted(unknown)}"
    required = {name for name, f in fields.items() if f.default is attr.NOTHING}
    assert required <= set(value), f"{where}: {class_name} lacks {sorted(required - set(value))}"
    kwargs = {}
    for name, item in value.items():
        kwargs[fields[name].name] = item
        if name in FREE:
            assert isinstance(item, dict), f"{where}.{name}"
            continue
        if name in MAPS:
            assert isinstance(item, dict), f"{where}.{name}"
            for key, element in item.items():
                conform(element, MAPS[name], f"{where}.{name}.{key}")
            continue
        child = CLASSES.get(name)
        if child is None:
            continue
        for index, element in enumerate(item if isinstance(item, list) else [item]):
            assert isinstance(element, dict), f"{where}.{name}[{index}]"
            conform(element, child, f"{where}.{name}[{index}]")
    cls(**kwargs)


def sarif_for(*args):
    proc = run_cli("check", "--no-progress", "--format", "sarif", *args)
    assert proc.returncode in (0, 1), proc.stderr
    return proc, json.loads(proc.stdout)


@pytest.mark.skipif(GCC is None, reason="gcc not installed")
def test_findings_of_a_real_check_are_a_valid_sarif_log(tmp_path):
    lib = tmp_path / "libgone.c"
    lib.write_text("int gone(void) { return 1; }\n")
    subprocess.run([GCC, "-shared", "-fPIC", lib, "-o", tmp_path / "libgone.so", "-Wl,-soname,libgone.so"],
                   check=True)
    main = tmp_path / "app.c"
    main.write_text("int gone(void);\nint main(void) { return gone(); }\n")
    subprocess.run([GCC, main, "-o", tmp_path / "app", f"-L{tmp_path}", "-lgone"], check=True)
    (tmp_path / "libgone.so").unlink()
    proc, log = sarif_for(tmp_path)
    report = json.loads(run_cli("check", "--json", "--no-progress", tmp_path).stdout)
    assert proc.returncode == 1
    conform({k: v for k, v in log.items() if k != "$schema"}, "SarifLog")
    assert log["version"] == "2.1.0" and "sarif" in log["$schema"]
    run = log["runs"][0]
    assert run["tool"]["driver"]["name"] == "seedance"
    results = run["results"]
    assert len(results) == len(report["findings"]) >= 1
    rules = run["tool"]["driver"]["rules"]
    for result, finding in zip(results, report["findings"]):
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"] == finding["rule"]
        assert result["level"] in ("none", "note", "warning", "error")
        assert result["partialFingerprints"]["seedance/v1"] == finding["fingerprint"]
        uri = result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        assert uri == "file://" + finding["subject"]["path"]


def test_severity_levels_and_an_empty_run():
    from seedance.model.report import Finding, Report
    from seedance.render.sarif import sarif_log

    findings = [Finding(rule=f"r-{s}", severity=s, trap="t", layer="L2", subject={"pid": 7}, message=f"m {s}")
                for s in ("info", "warning", "error", "fatal")]
    log = sarif_log(Report(command="check", findings=findings))
    conform({k: v for k, v in log.items() if k != "$schema"}, "SarifLog")
    levels = {r["ruleId"]: r["level"] for r in log["runs"][0]["results"]}
    assert levels == {"r-info": "note", "r-warning": "warning", "r-error": "error", "r-fatal": "error"}
    assert all("locations" not in r for r in log["runs"][0]["results"])  # a pid is not a file
    empty = sarif_log(Report(command="check"))
    conform({k: v for k, v in empty.items() if k != "$schema"}, "SarifLog")
    assert empty["runs"][0]["results"] == []


def test_the_writer_recognises_its_sarif_as_its_own(tmp_path):
    from seedance.model.report import Report
    from seedance.render.output import is_ours
    from seedance.render.sarif import sarif_text

    path = tmp_path / "out.sarif"
    path.write_text(sarif_text(Report(command="check")))
    assert is_ours(str(path))


@pytest.mark.skipif(GCC is None, reason="gcc not installed")
def test_uris_are_relative_to_the_source_root_and_each_rule_has_help(tmp_path):
    """A log made in a CI checkout names files relative to SRCROOT, which originalUriBaseIds
    resolves; each rule's help is its explain and fix, and its helpUri is its anchor in the
    rules/README.md installed with the rules."""
    from urllib.parse import unquote, urlsplit

    tree = tmp_path / "src dir"
    (tree / "bin").mkdir(parents=True)
    lib = tmp_path / "libgone.c"
    lib.write_text("int gone(void) { return 1; }\n")
    subprocess.run([GCC, "-shared", "-fPIC", lib, "-o", tmp_path / "libgone.so", "-Wl,-soname,libgone.so"],
                   check=True)
    main = tmp_path / "app.c"
    main.write_text("int gone(void);\nint main(void) { return gone(); }\n")
    subprocess.run([GCC, main, "-o", tree / "bin" / "app", f"-L{tmp_path}", "-lgone"], check=True)
    (tmp_path / "libgone.so").unlink()
    for extra, cwd in ((["--source-root", str(tree)], None), ([], tree)):
        proc = subprocess.run([str(BIN / "seedance"), "check", "--no-progress", "--format", "sarif", *extra,
                               str(tree)], capture_output=True, text=True, cwd=cwd, timeout=120)
        assert proc.returncode == 1, proc.stderr
        log = json.loads(proc.stdout)
        conform({k: v for k, v in log.items() if k != "$schema"}, "SarifLog")
        run = log["runs"][0]
        base = run["originalUriBaseIds"]["SRCROOT"]["uri"]
        assert base == "file://" + str(tree).replace(" ", "%20") + "/"
        locations = [r["locations"][0]["physicalLocation"]["artifactLocation"] for r in run["results"]]
        assert {"uri": "bin/app", "uriBaseId": "SRCROOT"} in locations
        assert all(not loc["uri"].startswith("/") and "uriBaseId" in loc
                   for loc in locations if unquote(loc["uri"]).startswith("bin/"))
        rules = run["tool"]["driver"]["rules"]
        readme = (ROOT / "rules" / "README.md").read_text()
        for rule in rules:
            assert len(rule["help"]["text"]) > len(rule["shortDescription"]["text"])
            uri = urlsplit(rule["helpUri"])
            assert uri.scheme == "file" and unquote(uri.path).endswith("README.md") and uri.fragment == rule["id"]
            assert f'<a id="{rule["id"]}"></a>' in readme
            assert f'<a id="{rule["id"]}"></a>' in open(unquote(uri.path)).read()
        unresolved = next(r for r in rules if r["id"] == "needed-unresolved")
        assert "ld.so searched every directory" in unresolved["help"]["text"]
        assert "Fix: seedance check --explain" in unresolved["help"]["text"]


def test_a_path_outside_the_source_root_keeps_its_absolute_uri(tmp_path):
    from seedance.model.report import Finding, Report
    from seedance.render.sarif import sarif_log

    findings = [Finding(rule="r", severity="error", trap="t", layer="L2", subject={"path": p}, message="m")
                for p in (str(tmp_path / "in" / "a b.so"), "/usr/lib/x.so", str(tmp_path / "inner.so"))]
    log = sarif_log(Report(command="check", findings=findings), source_root=str(tmp_path / "in"))
    conform({k: v for k, v in log.items() if k != "$schema"}, "SarifLog")
    uris = sorted(json.dumps(r["locations"][0]["physicalLocation"]["artifactLocation"], sort_keys=True)
                  for r in log["runs"][0]["results"])
    assert uris == sorted([json.dumps({"uri": "a%20b.so", "uriBaseId": "SRCROOT"}, sort_keys=True),
                           json.dumps({"uri": "file:///usr/lib/x.so"}),
                           json.dumps({"uri": "file://" + str(tmp_path / "inner.so")})])
