"""Generate deploy/grafana-dashboard.json: the seedance fleet dashboard for Grafana.

Written with grafana-foundation-sdk (Grafana's own typed builders, from PyPI) rather than
as hand-kept JSON: the panels' queries use the recording rules of
deploy/prometheus-rules.yaml by name, and a renamed rule or metric fails here, at build
time, in review, not silently in a dashboard nobody looks at until the night it is needed.

    python tools/grafana_dashboard.py [OUT.json]      (default deploy/grafana-dashboard.json)

`make install` runs it (make dashboard); the JSON is a build output, not kept in git.
Import it in Grafana (Dashboards > New > Import) and pick the Prometheus data source.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

ROOT = Path(__file__).resolve().parents[1]
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
GROUP = 'group=~"$group"'


def query(expr: str, legend: str = "", instant: bool = False) -> prometheus.Dataquery:
    q = prometheus.Dataquery().ref_id("A").expr(expr).datasource(DATASOURCE)
    if legend:
        q = q.legend_format(legend)
    if instant:
        q = q.instant().format("table")
    return q


def build() -> dict:
    board = (dashboard.Dashboard("seedance fleet")
             .uid("seedance-fleet")
             .tags(["seedance", "gpu"])
             .description("GPU software traps across the fleet: findings, drift of the GPU software stack, "
                          "GPU memory and leaks (seedance agent, deploy/prometheus-rules.yaml)")
             .refresh("1m")
             .time("now-6h", "now")
             .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
             .with_variable(dashboard.QueryVariable("group").label("group").datasource(DATASOURCE)
                            .query("label_values(seedance_gpu_stack_info, group)").include_all(True).multi(True)))

    board = board.with_row(dashboard.Row("Findings"))
    board = board.with_panel(
        stat.Panel().title("Hosts with error findings").height(5).span(6)
        .with_target(query("sum(seedance:hosts_with_error_findings:count_by_rule) or vector(0)")))
    board = board.with_panel(
        stat.Panel().title("Agents up").height(5).span(6)
        .with_target(query("sum(seedance:agents_up:count_by_group) or vector(0)")))
    board = board.with_panel(
        timeseries.Panel().title("Findings by rule and severity").height(8).span(12)
        .with_target(query("seedance:findings:sum_by_rule_severity", "{{rule}} ({{severity}})")))
    board = board.with_panel(
        table.Panel().title("Error findings by host").height(8).span(24)
        .with_target(query('max by (instance, rule) (seedance_findings{severity=~"error|fatal"}) > 0', instant=True)))

    board = board.with_row(dashboard.Row("GPU software stack drift"))
    board = board.with_panel(
        table.Panel().title("Stack per host (seedance_gpu_stack_info)").height(8).span(24)
        .with_target(query(f"seedance_gpu_stack_info{{{GROUP}}}", instant=True)))
    board = board.with_panel(
        table.Panel().title("Hosts drifting from their group's majority").height(6).span(12)
        .with_target(query('ALERTS{alertname="SeedanceStackDrift", alertstate="firing"}', instant=True)))
    board = board.with_panel(
        timeseries.Panel().title("Hosts by CUDA runtime").height(6).span(12)
        .with_target(query(f"seedance:gpu_stack:hosts_by_cuda_runtime{{{GROUP}}}", "{{group}}: {{cuda_runtime}}")))

    board = board.with_row(dashboard.Row("GPU memory and leaks"))
    board = board.with_panel(
        timeseries.Panel().title("GPU memory used").unit("percentunit").min(0).max(1).height(8).span(12)
        .with_target(query("seedance:gpu_memory_used:ratio", "{{instance}}")))
    board = board.with_panel(
        timeseries.Panel().title("GPU utilisation per GPU").unit("percentunit").min(0).max(1).height(8).span(12)
        .with_target(query("seedance_gpu_utilization_ratio", "{{Hostname}} {{device}}")))
    board = board.with_panel(
        timeseries.Panel().title("GPU memory used by pod").unit("bytes").height(8).span(12)
        .with_target(query("seedance:gpu_process_memory_used_bytes:sum_by_pod",
                           "{{Hostname}} {{namespace}}/{{pod}}")))
    board = board.with_panel(
        timeseries.Panel().title("GPU memory leaked by ended processes (1h)").unit("bytes").height(8).span(12)
        .with_target(query("seedance:leaked_bytes:increase1h > 0", "{{instance}}")))
    board = board.with_panel(
        timeseries.Panel().title("Live wrapped instances").height(6).span(12)
        .with_target(query('sum by (instance) (seedance_instances{state="alive"})', "{{instance}}")))
    board = board.with_panel(
        timeseries.Panel().title("Periodic checks: age of the latest").unit("s").height(6).span(12)
        .with_target(query("time() - (seedance_last_scan_timestamp_seconds > 0)", "{{instance}}")))
    return json.loads(JSONEncoder(sort_keys=True, indent=2).encode(board.build()))


def main(argv: list) -> int:
    out = Path(argv[1]) if len(argv) > 1 else ROOT / "deploy" / "grafana-dashboard.json"
    text = json.dumps(build(), indent=2, sort_keys=True) + "\n"
    out.write_text(text)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
