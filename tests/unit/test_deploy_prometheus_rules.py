"""deploy/prometheus-rules.yaml under Prometheus' own tools: promtool checks the rules and
runs their unit tests (deploy/prometheus-rules.test.yaml), which show each alert firing
for the host in its state and silent for the host beside it."""
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus-rules.yaml"
TESTS = DEPLOY / "prometheus-rules.test.yaml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)")


@needs_promtool
def test_promtool_accepts_the_rules():
    proc = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_promtool
def test_every_rule_passes_its_promtool_unit_tests():
    proc = subprocess.run([PROMTOOL, "test", "rules", str(TESTS)], capture_output=True, text=True, timeout=120,
                          cwd=DEPLOY)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


def test_every_alert_and_every_drift_label_is_unit_tested():
    rules = yaml.safe_load(RULES.read_text())
    tests = yaml.safe_load(TESTS.read_text())
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"] if "alert" in rule}
    tested = {case["alertname"] for test in tests["tests"] for case in test.get("alert_rule_test", [])
              if case.get("exp_alerts")}
    assert alerts - tested == set(), "alerts never shown firing in deploy/prometheus-rules.test.yaml"
    from seedance.telemetry.stack import LABELS

    drift = [rule["labels"]["drift_label"] for group in rules["groups"] for rule in group["rules"]
             if rule.get("alert") == "SeedanceStackDrift"]
    assert sorted(drift) == sorted(LABELS)  # one drift rule per label of seedance_gpu_stack_info


def test_the_generated_dashboard_queries_only_rules_and_metrics_that_exist():
    pytest.importorskip("grafana_foundation_sdk", reason="grafana-foundation-sdk not installed (requirements-test.txt)")
    import importlib.util
    import re

    spec = importlib.util.spec_from_file_location("grafana_dashboard", DEPLOY.parent / "tools" / "grafana_dashboard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    board = module.build()
    exprs = [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]
    assert len(exprs) >= 10 and board["uid"] == "seedance-fleet"
    rules = yaml.safe_load(RULES.read_text())
    recorded = {rule["record"] for group in rules["groups"] for rule in group["rules"] if "record" in rule}
    used = {name for expr in exprs for name in re.findall(r"\bseedance:[a-z0-9_:]+", expr)}
    assert used and used <= recorded, used - recorded
    metrics_source = (DEPLOY.parent / "agent" / "service" / "metrics.py").read_text()
    for name in {n for expr in exprs for n in re.findall(r"\bseedance_[a-z0-9_]+", expr)}:
        family = re.sub(r"_(info|total)$", "", name)
        assert f'"{family}"' in metrics_source or f'"{family[len("seedance_"):]}"' in metrics_source, name
