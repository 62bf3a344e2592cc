"""Answers seedance gave that the real tools contradict, each checked against its oracle:
`check --imports` against the real interpreter importing the module.
"""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import run_cli


def _python_says(statement: str) -> tuple:
    """The oracle: the real interpreter runs the import; (exit code, its last stderr line)."""
    proc = subprocess.run([sys.executable, "-c", statement], capture_output=True)
    lines = proc.stderr.decode("utf-8", errors="replace").strip().splitlines()
    return proc.returncode, lines[-1] if lines else ""


def test_a_predicted_import_failure_is_a_finding_and_exits_1():
    code, last = _python_says("import ssl, nosuchmod")
    assert code == 1 and last == "ModuleNotFoundError: No module named 'nosuchmod'"
    proc = run_cli("check", "--python", sys.executable, "--imports", "ssl,nosuchmod", "--report-json", "-")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    findings = json.loads(proc.stdout)["findings"]
    assert [f["rule"] for f in findings] == ["import-fails"]
    finding = findings[0]
    assert "nosuchmod" in finding["message"] and last in finding["message"]
    assert finding["evidence"]["module"] == "nosuchmod"
    assert finding["evidence"]["exception"] == "ModuleNotFoundError"
    assert finding["evidence"]["error"] == last
    # no distribution ships it: the fix says what to check, and names no made-up package
    assert finding["evidence"]["distribution"] == ""
    assert "pip install nosuchmod" not in finding["fix"] and "spelling" in finding["fix"]
    text = run_cli("check", "--python", sys.executable, "--imports", "ssl,nosuchmod")
    assert text.returncode == 1 and "import-fails" in text.stdout and "0 findings" not in text.stdout
    # and the import that works alone is clean, as Python finds it
    assert _python_says("import ssl")[0] == 0
    alone = run_cli("check", "--python", sys.executable, "--imports", "ssl")
    assert alone.returncode == 0 and "0 findings" in alone.stdout, alone.stdout + alone.stderr


def test_the_module_python_names_for_a_dotted_import():
    code, last = _python_says("import nosuchmod.sub")
    assert code == 1
    proc = run_cli("check", "--python", sys.executable, "--imports", "nosuchmod.sub", "--report-json", "-")
    assert proc.returncode == 1
    finding = json.loads(proc.stdout)["findings"][0]
    assert finding["evidence"]["error"] == last and finding["evidence"]["module"] == "nosuchmod"


def test_a_module_deleted_from_its_distribution_names_the_reinstall(tmp_path):
    """An installed distribution whose RECORD lists the module: the reinstall is known to work."""
    site = tmp_path / "site"
    (site / "gonepkg-1.0.dist-info").mkdir(parents=True)
    (site / "gonepkg-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: gone-pkg\nVersion: 1.0\n\n")
    (site / "gonepkg-1.0.dist-info" / "RECORD").write_text(
        "gonepkg/__init__.py,,\ngonepkg/core.py,,\ngonepkg-1.0.dist-info/RECORD,,\n")
    (site / "gonepkg").mkdir()
    (site / "gonepkg" / "__init__.py").write_text("")
    env = {"PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, "-c", "import gonepkg.core"], capture_output=True, env=env)
    assert proc.returncode == 1  # the oracle: core.py is gone
    check = run_cli("check", "--python", sys.executable, "--imports", "gonepkg.core", "--report-json", "-", env=env)
    assert check.returncode == 1
    finding = json.loads(check.stdout)["findings"][0]
    assert finding["rule"] == "import-fails" and finding["evidence"]["distribution"] == "gone-pkg"
    assert finding["fix"].endswith("(its RECORD lists gonepkg.core, which is gone)")
    assert f"{sys.executable} -m pip install --force-reinstall gone-pkg" in finding["fix"]
