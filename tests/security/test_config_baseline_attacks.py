"""A checked tree cannot hide its own findings, and a malformed --baseline is one line.

A root user runs `seedance check /srv/upload` on a tree someone else wrote.  That tree's
.seedance.yaml (at its git root) saying `ignore: [needed-unresolved]` must not turn its
broken library into "0 findings", exit 0: it applies only with --config-from-target, and
whichever config applies, the text and the JSON say which file dropped how many findings.
A --baseline of the wrong shape (a list where SARIF has an object, a number where a report
has a fingerprint) is `seedance: error: --baseline: ...`, exit 2, never an internal error.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from seedance.judge.filters import MAX_BASELINE_BYTES
from tests.conftest import ROOT

GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc not installed")
SCHEMA = json.loads((ROOT / "agent" / "schemas" / "report.schema.json").read_text())


def broken_tree(tree: Path) -> Path:
    """A git checkout holding an app whose NEEDED libone.so resolves nowhere (linked against
    a real libone.so, which is then deleted), and a .seedance.yaml that hides exactly that."""
    (tree / ".git").mkdir(parents=True)
    (tree / "one.c").write_text("int one(void) { return 1; }\n")
    subprocess.run([GCC, "-shared", "-fPIC", tree / "one.c", "-o", tree / "libone.so", "-Wl,-soname,libone.so"],
                   check=True, capture_output=True)
    (tree / "main.c").write_text("int one(void);\nint main(void) { return one(); }\n")
    subprocess.run([GCC, tree / "main.c", "-o", tree / "app", f"-L{tree}", "-lone"], check=True, capture_output=True)
    for name in ("libone.so", "one.c", "main.c"):
        (tree / name).unlink()
    config = tree / ".seedance.yaml"
    config.write_text("ignore: [needed-unresolved]\n")
    return config


def cli(*args, cwd=None):
    proc = subprocess.run([str(Path(sys.executable).parent / "seedance"), *map(str, args)], capture_output=True,
                          text=True, errors="replace", cwd=cwd, timeout=120)
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    return proc


@needs_gcc
def test_a_checked_trees_own_config_does_not_hide_its_findings(tmp_path):
    tree = tmp_path / "upload"
    config = broken_tree(tree)
    elsewhere = tmp_path / "home"
    elsewhere.mkdir()
    proc = cli("check", "--no-progress", "--no-cache", tree, cwd=elsewhere)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "needed-unresolved" in proc.stdout and "libone.so" in proc.stdout
    # ... and the user is told a config was there and was not applied
    assert f"not applied: {config}" in proc.stdout and "--config-from-target" in proc.stdout
    document = json.loads(cli("check", "--no-progress", "--no-cache", "--json", tree, cwd=elsewhere).stdout)
    assert [f["rule"] for f in document["findings"]] == ["needed-unresolved"]
    assert document["stats"]["filtered"]["ignored_config"] == str(config)
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(document, SCHEMA)


@needs_gcc
def test_with_config_from_target_it_applies_and_says_which_file_dropped_how_many(tmp_path):
    tree = tmp_path / "upload"
    config = broken_tree(tree)
    elsewhere = tmp_path / "home"
    elsewhere.mkdir()
    proc = cli("check", "--no-progress", "--no-cache", "--config-from-target", tree, cwd=elsewhere)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "needed-unresolved" not in proc.stdout
    assert f"filtered: 1 finding by {config}" in proc.stdout
    document = json.loads(cli("check", "--no-progress", "--no-cache", "--json", "--config-from-target", tree,
                              cwd=elsewhere).stdout)
    assert document["findings"] == []
    assert document["stats"]["filtered"]["by"] == [{"source": "config", "path": str(config), "filtered": 1}]
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(document, SCHEMA)


@needs_gcc
def test_the_current_directorys_config_applies_but_is_named(tmp_path):
    # as flake8 or ruff read the config of the directory they run in; the table still says it
    tree = tmp_path / "project"
    config = broken_tree(tree)
    proc = cli("check", "--no-progress", "--no-cache", ".", cwd=tree)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"filtered: 1 finding by {config}" in proc.stdout
    # the command line's own filters are counted apart from the file's
    proc = cli("check", "--no-progress", "--no-cache", "--config-from-target", "--min-severity", "fatal", tree,
               cwd=tmp_path)
    assert f"filtered: 1 finding by {config}" in proc.stdout
    assert "filtered: 0 findings by the command line" in proc.stdout


# -- --baseline of the wrong shape ------------------------------------------------------

REPORT = {"schema": "seedance.report/v1", "command": "check", "host": {}, "stats": {}, "waste_traps": []}
SARIF = {"version": "2.1.0", "$schema": "https://json.schemastore.org/sarif-2.1.0.json"}


def sarif_result(result):
    return {**SARIF, "runs": [{"tool": {"driver": {"name": "seedance"}}, "results": [result]}]}


MALFORMED = {
    "sarif-partial-fingerprints-a-list": sarif_result({"partialFingerprints": ["29a78bb14088511d"]}),
    "sarif-partial-fingerprints-a-string": sarif_result({"partialFingerprints": "29a78bb14088511d"}),
    "sarif-fingerprint-a-number": sarif_result({"partialFingerprints": {"seedance/v1": 7}}),
    "sarif-fingerprint-not-hex": sarif_result({"partialFingerprints": {"seedance/v1": "not a fingerprint"}}),
    "sarif-other-fingerprint-an-object": sarif_result({"partialFingerprints": {"other/v1": {"a": 1}}}),
    "sarif-result-a-string": sarif_result("29a78bb14088511d"),
    "sarif-result-null": sarif_result(None),
    "sarif-results-an-object": {**SARIF, "runs": [{"results": {"0": {}}}]},
    "sarif-results-a-string": {**SARIF, "runs": [{"results": "none"}]},
    "sarif-run-a-list": {**SARIF, "runs": [[{"results": []}]]},
    "sarif-run-null": {**SARIF, "runs": [None]},
    "sarif-runs-an-object": {**SARIF, "runs": {"results": []}},
    "sarif-runs-null": {**SARIF, "runs": None},
    "report-findings-an-object": {**REPORT, "findings": {"fingerprint": "29a78bb14088511d"}},
    "report-findings-null": {**REPORT, "findings": None},
    "report-findings-missing": dict(REPORT),
    "report-finding-a-string": {**REPORT, "findings": ["29a78bb14088511d"]},
    "report-finding-a-number": {**REPORT, "findings": [1]},
    "report-fingerprint-a-list": {**REPORT, "findings": [{"fingerprint": ["29a78bb14088511d"]}]},
    "report-fingerprint-a-number": {**REPORT, "findings": [{"fingerprint": 29}]},
    "report-fingerprint-short": {**REPORT, "findings": [{"fingerprint": "29a78bb1"}]},
    "report-fingerprint-and-a-newline": {**REPORT, "findings": [{"fingerprint": "29a78bb14088511d\n"}]},
    "report-old-finding-subject-a-list": {**REPORT, "findings": [{"rule": "r", "subject": ["/x"], "message": "m"}]},
    "report-old-finding-subject-nested": {**REPORT, "findings": [{"rule": "r", "subject": {"path": [[["/x"]]]},
                                                                  "message": "m"}]},
    "report-old-finding-rule-a-number": {**REPORT, "findings": [{"rule": 5, "subject": {"path": "/x"},
                                                                 "message": "m"}]},
    "report-old-finding-message-an-object": {**REPORT, "findings": [{"rule": "r", "subject": {"path": "/x"},
                                                                     "message": {"a": 1}}]},
    "report-old-finding-nothing": {**REPORT, "findings": [{}]},
}


def one_line_error(proc, *needles):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("seedance: error: --baseline:"), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_baseline_of_the_wrong_shape_is_one_line_exit_2(tmp_path, name):
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps(MALFORMED[name]))
    empty = tmp_path / "tree"
    empty.mkdir()
    line = one_line_error(cli("check", "--no-progress", "--no-cache", "--baseline", baseline, empty))
    assert "expected" in line, line


def test_the_error_names_where_the_defect_is(tmp_path):
    baseline = tmp_path / "baseline.json"
    good = {"partialFingerprints": {"seedance/v1": "29a78bb14088511d"}}
    baseline.write_text(json.dumps({**SARIF, "runs": [{"results": [good, good, {"partialFingerprints": [1]}]}]}))
    empty = tmp_path / "tree"
    empty.mkdir()
    one_line_error(cli("check", "--no-progress", "--baseline", baseline, empty),
                   "runs[0].results[2].partialFingerprints: expected an object, got an array")


def test_well_formed_baselines_still_load_and_only_they(tmp_path):
    empty = tmp_path / "tree"
    empty.mkdir()
    for document in ({**REPORT, "findings": [{"fingerprint": "29a78bb14088511d"},
                                             {"rule": "r", "subject": {"path": "/x", "pid": 4}, "message": "m"}]},
                     {**SARIF, "runs": [{"results": None}, {"results": []},
                                        {"results": [{"partialFingerprints": {"seedance/v1": "29a78bb14088511d",
                                                                              "other/v1": "x"}}, {}]}]}):
        baseline = tmp_path / "baseline.json"
        baseline.write_text(json.dumps(document))
        proc = cli("check", "--no-progress", "--no-cache", "--baseline", baseline, empty)
        assert proc.returncode == 0, proc.stderr
    # the strings of another tool's partialFingerprints are SARIF's; an array there is not
    baseline.write_text(json.dumps(sarif_result({"partialFingerprints": {"other/v1": ["x"]}})))
    one_line_error(cli("check", "--no-progress", "--no-cache", "--baseline", baseline, empty),
                   "runs[0].results[0].partialFingerprints.other/v1: expected a string, got an array")


def padded_report(size: int) -> bytes:
    """A valid, empty seedance report of exactly SIZE bytes (a long string pads it)."""
    head = json.dumps({**REPORT, "findings": [], "pad": ""}).encode()
    return head[:-2] + b"x" * (size - len(head)) + head[-2:]


def test_a_baseline_at_the_cap_loads_and_one_byte_more_is_refused(tmp_path):
    empty = tmp_path / "tree"
    empty.mkdir()
    baseline = tmp_path / "baseline.json"
    baseline.write_bytes(padded_report(MAX_BASELINE_BYTES))
    assert cli("check", "--no-progress", "--no-cache", "--baseline", baseline, empty).returncode == 0
    baseline.write_bytes(padded_report(MAX_BASELINE_BYTES + 1))
    one_line_error(cli("check", "--no-progress", "--no-cache", "--baseline", baseline, empty), "MiB")


def test_a_huge_sparse_baseline_is_refused_before_it_is_read(tmp_path):
    empty = tmp_path / "tree"
    empty.mkdir()
    baseline = tmp_path / "baseline.json"
    with open(baseline, "wb") as handle:
        handle.write(b'{"schema": "seedance.report/v1", "findings": []}')
        handle.truncate(8 << 30)  # 8 GiB that take no disk: the size alone refuses it
    one_line_error(cli("check", "--no-progress", "--baseline", baseline, empty), "MiB")


def test_a_deeply_nested_baseline_is_one_line(tmp_path):
    empty = tmp_path / "tree"
    empty.mkdir()
    baseline = tmp_path / "baseline.json"
    baseline.write_text('{"runs": ' + "[" * 200_000 + "]" * 200_000 + "}")
    one_line_error(cli("check", "--no-progress", "--baseline", baseline, empty), "not JSON")
