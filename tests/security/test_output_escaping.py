"""`plugin list`, `quota list`, `seedance status` and `agent status` print what comes from
disk and from other processes (manifests, policy and state files, the state directory, the
agent's own answers) as `check` prints paths: an escape sequence, a newline or another
control character never reaches the terminal raw, so none can paint it or forge a row; and
--json stays valid JSON holding the values as they are."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

SEEDANCE = str(Path(sys.executable).parent / "seedance")
# C0 but newline, DEL, C1: what must never reach stdout raw in text mode
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def run(*args, env, timeout=60):
    proc = subprocess.run([SEEDANCE, *args], env={**os.environ, **env}, capture_output=True, timeout=timeout)
    stderr = proc.stderr.decode("utf-8", "replace")
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    return proc, proc.stdout.decode("utf-8", "surrogateescape")


def assert_clean(text: str) -> None:
    assert "\x1b" not in text, text
    assert not CONTROL.search(text), text


# -- plugin list --------------------------------------------------------------------------

MANIFEST = """\
name: "evil\\n"
version: "1.0.0\\n"
seedance_version: ">=0.1,<1"
entry:
  libraries: [lib/libx.so]
device_affinity: "any\\n"
batch_policy:
  policy: adaptive
"""


def test_plugin_list_neither_lists_nor_prints_a_manifest_whose_names_end_in_a_newline(tmp_path):
    # the manifest schema's patterns end in `$`, which Python's re lets match before a final
    # newline: such a name, version and affinity loaded and split the table's row.  Now a
    # pattern is the whole string (plugins/manifest.py), so the manifest is not a plugin, and
    # nothing of it reaches the terminal raw
    root = tmp_path / "data" / "seedance" / "plugins" / "evil" / "1.0.0"
    root.mkdir(parents=True)
    (root / "manifest.yaml").write_text(MANIFEST)
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "SEEDANCE_PLUGIN_PATH": str(tmp_path / "none")}
    proc, out = run("plugin", "list", env=env)
    assert proc.returncode == 0, proc.stderr
    assert_clean(out)
    assert "evil" not in out, out
    proc, out = run("plugin", "list", "--json", env=env)
    assert json.loads(out)["plugins"] == []


# -- quota list ---------------------------------------------------------------------------

POLICY = """\
apiVersion: seedance/v1
kind: WorkloadQuotaPolicy
metadata: {name: enc}
spec:
  workloadSelector:
    matchLabels: {app: encoder}
  quota: {cpu: 500m}
"""
WORKLOAD = "\x1b[2J\x1b[31m4242-1\nforged"


def test_quota_list_escapes_policy_names_labels_and_workloads(tmp_path):
    (tmp_path / "cfg" / "seedance" / "quota").mkdir(parents=True)
    (tmp_path / "cfg" / "seedance" / "quota" / "enc.yaml").write_text(POLICY)
    state = tmp_path / "state" / "seedance" / "quota"
    state.mkdir(parents=True)
    # the state file names the workloads; one with escape sequences, as a damaged or
    # hand-edited file may
    (state / "state.json").write_text(json.dumps({"workloads": {WORKLOAD: {
        "policy": "enc", "bursting": False, "cpu_millicores": 500,
        "placement": {"backend": "cgroup-v2", "groups": {"cpu": "/sys/fs/cgroup/x\x1b[0m"}, "original": {}}}}}))
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "XDG_STATE_HOME": str(tmp_path / "state")}
    proc, out = run("quota", "list", env=env)
    assert proc.returncode == 0, proc.stderr
    assert_clean(out)
    # the policy's names are validated as whole strings on load; the state file is not ours to
    # trust, and its workload id is escaped
    assert out.splitlines()[0].startswith("enc: selects app=encoder")
    assert "  \\x1b[2J\\x1b[31m4242-1\\nforged  " in out and len(out.splitlines()) == 3
    proc, out = run("quota", "list", "--json", env=env)
    entries = json.loads(out)
    assert entries[0]["name"] == "enc" and entries[0]["workloads"][0]["workload"] == WORKLOAD


# -- seedance status, agent status ----------------------------------------------------------

def wait_running(env, deadline_s=30.0) -> dict:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        proc, out = run("agent", "status", "--json", env=env)
        doc = json.loads(out)
        if doc["running"]:
            return doc
        time.sleep(0.3)
    raise AssertionError("the agent did not answer")


def test_status_and_agent_status_escape_paths_and_what_the_agent_says():
    # a short root: a unix socket's path must fit in 108 bytes
    root = Path(tempfile.mkdtemp(prefix="sd-esc-"))
    hostile = "\x1b[31mx\nforged"  # a directory name with an escape sequence and a newline
    runtime, state_home = root / f"rt{hostile}", root / f"st{hostile}"
    runtime.mkdir(mode=0o700)
    state_home.mkdir()
    env = {"HOME": str(root / "home"), "XDG_RUNTIME_DIR": str(runtime), "XDG_STATE_HOME": str(state_home),
           "XDG_CONFIG_HOME": str(root / "cfg")}
    # the agent's history, as a previous run left it: a leaked instance whose command line
    # holds escape sequences (what a process may call itself)
    from seedance.service.config import state_dir
    from seedance.service.state import StateStore

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        store = StateStore.open(state_dir())
        store.instance_ended(4242, 1, 0, "\x1b[2Jpython\nforged-row", 1 << 20)
        store.close()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    agent = subprocess.Popen([SEEDANCE, "agent", "run", "--no-scan", "--probes", "off", "--metrics", "off"],
                             env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        doc = wait_running(env)
        assert hostile in doc["socket"]
        proc, out = run("agent", "status", env=env)
        assert proc.returncode == 0
        assert_clean(out)
        assert len(out.splitlines()) == 2 and "\\x1b[31mx\\nforged" in out
        proc, out = run("status", env=env)
        assert proc.returncode == 0, proc.stderr
        assert_clean(out)
        assert "\\x1b[31mx\\nforged" in out and not any(line.startswith("forged") for line in out.splitlines())
        proc, out = run("status", "--json", env=env)
        status = json.loads(out)
        assert hostile in status["agent"]["state_db"]
    finally:
        agent.terminate()
        try:
            agent.wait(timeout=30)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        shutil.rmtree(root, ignore_errors=True)
