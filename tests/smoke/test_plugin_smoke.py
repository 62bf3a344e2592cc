"""Every plugin command end to end: help, aliases, a short bench with JSON and a plot."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import load_example_builder

BIN = Path(sys.executable).parent


@pytest.mark.parametrize("args", [("plugin", "--help"), ("plugin", "install", "--help"), ("plugin", "list", "--help"),
                                  ("plugin", "verify", "--help"), ("plugin", "uninstall", "--help"),
                                  ("bench", "--help")])
def test_help_has_examples(cli, args):
    proc = cli(*args)
    assert proc.returncode == 0 and "examples:" in proc.stdout


def test_aliases(tmp_path):
    import subprocess
    env = {"XDG_DATA_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([str(BIN / "seedance-plugin"), "list"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and "no plugins installed" in proc.stdout
    proc = subprocess.run([str(BIN / "seedance-bench"), "--plugin=nothing-here"], capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_plugin_without_action_and_bad_affinity(cli, tmp_path):
    assert cli("plugin", env={"XDG_DATA_HOME": str(tmp_path)}).returncode == 2
    proc = cli("plugin", "install", ".", "--affinity", "gpu1", env={"XDG_DATA_HOME": str(tmp_path)})
    assert proc.returncode == 2 and "--affinity" in proc.stderr


def test_bench_json_and_plot(cli, tmp_path):
    if not shutil.which("gcc"):
        pytest.skip("gcc not found")
    builder = load_example_builder()
    plugin = builder.build("legacy-audio-encoder", tmp_path)
    plot = tmp_path / "latency.png"
    env = {"XDG_DATA_HOME": str(tmp_path / "data")}
    proc = cli("bench", "--plugin", plugin, "--profile", "latency-throughput", "--warmup", "1", "--rounds", "3",
               "--low-rate", "400", "--low-requests", "8", "--high-rate", "2000", "--high-requests", "40",
               "--batch-policy", "adaptive", "--json", "--plot", plot, env=env)
    # 1: the criteria failed; 3: they failed while this busy host was too noisy to judge
    assert proc.returncode in (0, 1, 3), proc.stderr
    result = json.loads(proc.stdout)
    assert result["policy"] == "adaptive" and result["policy_source"] == "--batch-policy"
    for label in ("low", "high"):
        phase = result["rates"][label]
        assert len(phase["rounds"]) == 3
        assert sum(r["requests"] for r in phase["rounds"]) == 3 * phase["requests_per_round"]
        assert all(r["p50_ms"] <= r["p99_ms"] for r in phase["rounds"])
        assert phase["pass"] == (phase["p99_cv"] < 0.08 and phase["throughput_drift"] < 0.025)
    assert (proc.returncode == 0) == result["pass"]
    assert (proc.returncode == 3) == (result["verdict"] == "inconclusive: machine too noisy")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_of_installed_plugin_feeds_verify(cli, tmp_path):
    if not shutil.which("gcc"):
        pytest.skip("gcc not found")
    builder = load_example_builder()
    plugin = builder.build("legacy-audio-encoder", tmp_path)
    env = {"XDG_DATA_HOME": str(tmp_path / "data")}
    cli("plugin", "install", plugin, env=env, check=True)
    proc = cli("bench", "--plugin", "legacy-audio-encoder", "--warmup", "0", "--rounds", "2", "--low-rate", "400",
               "--low-requests", "4", "--high-rate", "1000", "--high-requests", "10", env=env)
    assert proc.returncode in (0, 1, 3) and "low load" in proc.stdout
    report = json.loads(cli("plugin", "verify", "--report-json", "-", env=env).stdout)
    evidence = next(f["evidence"] for f in report["waste_traps"] if f["rule"] == "batch-static")
    assert evidence["metric_observed"] is True and "measured by seedance bench (static)" in evidence["metric_value"]


def test_bench_without_bench_callable(cli, tmp_path):
    plugin = tmp_path / "nobench"
    plugin.mkdir()
    (plugin / "manifest.yaml").write_text("name: nobench\nversion: 1.0.0\nseedance_version: '>=0.1,<1'\n"
                                          "entry:\n  module: nobench\n")
    proc = cli("bench", "--plugin", plugin)
    assert proc.returncode == 2 and "no `bench: module:function`" in proc.stderr
