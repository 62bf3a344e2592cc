"""deploy/ examples stay consistent with the agent they deploy."""
from pathlib import Path

import yaml

from seedance.cli import build_parser
from seedance.service.config import build_config, read_config_file
from seedance.service.metrics import parse_listen, require_loopback

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _docs(name):
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def test_daemonset_runs_a_valid_agent_command_on_gpu_nodes(tmp_path):
    docs = _docs("daemonset.yaml")
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["hostPID"] is True
    agent = next(c for c in spec["containers"] if c["name"] == "agent")
    argv = agent["command"][1:] + agent["args"]
    args = build_parser().parse_args(argv)  # the flags must be ones `seedance agent run` accepts
    assert args.execute.__name__ == "execute_run"
    host, port = parse_listen(args.metrics)
    require_loopback(host)  # the agent would refuse anything else at start
    proxy = next(c for c in spec["containers"] if c["name"] == "metrics-proxy")
    assert f"--upstream=http://{host}:{port}/" in proxy["args"]
    # the shipped agent.yaml loads
    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    path = tmp_path / "agent.yaml"
    path.write_text(configmap["data"]["agent.yaml"])
    assert build_config(read_config_file(path), {}, env={}).handle_mode == "per-instance"


def test_scrape_config_targets_the_proxy_port():
    daemonset = next(d for d in _docs("daemonset.yaml") if d["kind"] == "DaemonSet")
    proxy = next(c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "metrics-proxy")
    port_name = proxy["ports"][0]["name"]
    scrape = yaml.safe_load((DEPLOY / "prometheus-scrape.yaml").read_text())["scrape_configs"]
    job = next(j for j in scrape if j["job_name"] == "seedance-agent")
    keeps = {tuple(r["source_labels"]): r["regex"] for r in job["relabel_configs"] if r.get("action") == "keep"}
    assert keeps[("__meta_kubernetes_pod_container_port_name",)] == port_name
    assert keeps[("__meta_kubernetes_pod_label_app_kubernetes_io_name",)] == \
        daemonset["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
