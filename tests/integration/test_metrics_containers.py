"""The agent's per-process series name the container a wrapped program runs in.

Real parts: the shim preloaded into a program (tests/shim/sdtest, through the fake driver
of test_registry_pidns) as pid 1 of a podman container that shares the registry directory,
as a pod shares it with the DaemonSet; the real agent with --metrics on loopback; its
/metrics read over HTTP and linted by promtool.  podman keeps its containers' names in
containers.json, which is where the `container` label comes from outside a pod.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from image_builds import PODMAN_RUN
from test_containers_live import _copy_in, _ldd_paths
from test_registry_pidns import HELD, env, fake_driver, shim_library, wait_until  # noqa: F401  (fixtures)

BIN = Path(sys.executable).parent
POD_RUNTIME_DIR = "/run/seedance"
POD_SHIM = "/opt/seedance/libseedance_shim.so"
POD_DRIVER = "/opt/fakecuda"

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("podman") is None
                                or not os.path.exists("/usr/sbin/runc"),
                                reason="needs root, podman and runc at /usr/sbin/runc")


def _podman(*argv) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *argv], capture_output=True, text=True, timeout=120)


@pytest.fixture
def workload(env, fake_driver, tmp_path):
    """(container name, host pid) of sdtest holding HELD bytes through the shim, as the
    container's command, with the agent's runtime directory mounted where the pod's is."""
    runtime_dir = Path(env["SEEDANCE_RUNTIME_DIR"])
    runtime_dir.mkdir(mode=0o700, parents=True)
    root = tmp_path / "rootfs"
    loaded = set()
    for binary in (shim_library(), fake_driver / "libcuda.so.1", fake_driver / "sdtest"):
        loaded.update(_ldd_paths(str(binary)))
    for path in sorted(loaded):
        _copy_in(str(root), path)
    for mountpoint in (POD_RUNTIME_DIR, str(Path(POD_SHIM).parent), POD_DRIVER, "/tmp"):
        (root / mountpoint.lstrip("/")).mkdir(parents=True, exist_ok=True)
    with tarfile.open(tmp_path / "rootfs.tar", "w") as out:
        out.add(root, arcname=".")
    tag = f"localhost/sd-metrics-{os.getpid()}-{time.monotonic_ns()}:1"
    name = f"sd-metrics-{os.getpid()}-{time.monotonic_ns()}"
    imported = _podman("import", str(tmp_path / "rootfs.tar"), tag)
    if imported.returncode:
        pytest.skip(f"podman import failed: {imported.stderr.strip()[-200:]}")
    try:
        started = _podman(*PODMAN_RUN[1:], "-d", "--name", name, "-v", f"{runtime_dir}:{POD_RUNTIME_DIR}",
                          "-v", f"{shim_library()}:{POD_SHIM}:ro", "-v", f"{fake_driver}:{POD_DRIVER}:ro",
                          "-e", f"SEEDANCE_RUNTIME_DIR={POD_RUNTIME_DIR}", "-e", f"LD_PRELOAD={POD_SHIM}",
                          "-e", f"LD_LIBRARY_PATH={POD_DRIVER}", "-e", "FAKECUDA_DEVICES=2",
                          "-e", "FAKECUDA_LEDGER=/tmp/ledger", tag,
                          f"{POD_DRIVER}/sdtest", "--via", "dlsym", "init", "ctx:0", f"alloc:{HELD}", "sleep:120000")
        if started.returncode:
            pytest.skip(f"podman cannot run a container here: {started.stderr.strip()[-200:]}")
        pid = wait_until(lambda: (p := _podman("inspect", "--format", "{{.State.Pid}}", name).stdout.strip())
                         .isdigit() and int(p) > 0 and int(p), "the container's pid")
        yield name, pid
    finally:
        _podman("rm", "-f", "-t", "0", name)
        _podman("rmi", "-f", tag)


def start_agent(env, log: Path, *flags):
    return subprocess.Popen([str(BIN / "seedance"), "agent", "run", "--gc-interval", "200ms", "--no-scan",
                             "--probes", "off", "--metrics", "127.0.0.1:0", *flags],
                            env=env, stdout=subprocess.DEVNULL, stderr=open(log, "a"))


def metrics_address(log: Path):
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("event") == "started" or event.get("msg") == "started":
                return event.get("metrics")
    return None


def allocated(address: str) -> tuple:
    body = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    return body, [(s.labels, s.value) for fam in text_string_to_metric_families(body) for s in fam.samples
                  if s.name == "seedance_instance_allocated_bytes"]


@pytest.mark.parametrize("per_pid", [False, True], ids=["by-workload", "per-pid"])
def test_a_wrapped_program_in_a_podman_container_is_labelled_with_its_container(env, workload, tmp_path, per_pid):
    name, host_pid = workload
    log = tmp_path / "agent.log"
    agent = start_agent(env, log, *(["--metrics-per-pid"] if per_pid else []))
    try:
        address = wait_until(lambda: metrics_address(log), "the agent's metrics address")
        body, samples = wait_until(lambda: (got := allocated(address))[1] and got, "the program's series")
        expected = {"Hostname": socket.gethostname(), "namespace": "", "pod": "", "container": name,
                    "command": f"{POD_DRIVER}/sdtest"}
        if per_pid:
            expected["pid"] = str(host_pid)  # the node's number for it, not the container's 1
        assert samples == [(expected, float(HELD))]
        if shutil.which("promtool"):
            lint = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, text=True,
                                  timeout=60)
            assert lint.returncode == 0 and lint.stdout + lint.stderr == "", lint.stdout + lint.stderr
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
