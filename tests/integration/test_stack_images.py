"""The `images` label of seedance_gpu_stack_info: the images of the containers whose
processes map the CUDA driver, read from the engines' state files.

Two layers: a real podman container (its image made with `podman import` from host files,
its program mapping a gcc-built libcuda.so.1) seen on a real agent's /metrics; and a
/proc and engine state laid out in files, for docker's config.v2.json and the caps.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from process_fixtures import gcc
from seedance.telemetry.stack import MAX_VALUE_LEN, gpu_stack

BIN = Path(sys.executable).parent
PODMAN_RUN = ["podman", "run", "-d", "--runtime", "/usr/sbin/runc", "--ulimit", "nofile=1024:1024",
              "--ulimit", "nproc=1024:1024"]
DEADLINE_S = 90


def _run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=kw.pop("timeout", 120), **kw)


def _copy_in(root: Path, path: str) -> None:
    real = os.path.realpath(path)
    for name in {path, real}:
        dest = root / name.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            shutil.copy2(real, dest)


def _gpu_image(base: Path, tag: str) -> None:
    """An image whose /app/gpu maps /app/libcuda.so.1 (a stand-in driver) and waits."""
    root = base / "rootfs"
    app = root / "app"
    app.mkdir(parents=True)
    (base / "cuda.c").write_text("int cuInit(unsigned flags) { return (int)flags; }\n")
    (base / "gpu.c").write_text("#include <unistd.h>\nint cuInit(unsigned);\n"
                                "int main(void) { if (cuInit(0)) return 1; for (;;) pause(); }\n")
    gcc("-shared", "-fPIC", "-o", str(app / "libcuda.so.1"), str(base / "cuda.c"), "-Wl,-soname,libcuda.so.1")
    gcc("-o", str(app / "gpu"), str(base / "gpu.c"), f"-L{app}", "-l:libcuda.so.1", "-Wl,-rpath,/app")
    ldd = _run(["ldd", str(app / "gpu")]).stdout
    for path in [p for line in ldd.splitlines() for p in line.split() if p.startswith("/")]:
        if not path.startswith(str(app)):
            _copy_in(root, path)
    tar = base / "rootfs.tar"
    assert _run(["tar", "-C", str(root), "-cf", str(tar), "."]).returncode == 0
    imported = _run(["podman", "import", str(tar), tag])
    if imported.returncode:
        pytest.skip(f"podman import failed: {imported.stderr.strip()[-300:]}")


def _maps_cuda(pid: int) -> bool:
    try:
        return "libcuda.so.1" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.fixture
def gpu_container(tmp_path):
    if os.geteuid() != 0 or shutil.which("podman") is None or not os.path.exists("/usr/sbin/runc"):
        pytest.skip("needs root, podman and /usr/sbin/runc")
    marker = uuid.uuid4().hex[:10]
    tag, name = f"localhost/sd-stack-{marker}:1", f"sd-stack-{marker}"
    _gpu_image(tmp_path, tag)
    try:
        started = _run(PODMAN_RUN + ["--name", name, tag, "/app/gpu"])
        if started.returncode:
            pytest.skip(f"podman run failed: {started.stderr.strip()[-300:]}")
        for _ in range(50):
            pid = _run(["podman", "inspect", "--format", "{{.State.Pid}}", name]).stdout.strip()
            if pid.isdigit() and int(pid) > 0 and _maps_cuda(int(pid)):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the container's /app/gpu did not map libcuda.so.1")
        yield tag
    finally:
        _run(["podman", "rm", "-f", "-t", "0", name])
        _run(["podman", "rmi", "-f", tag])


def _stack_info(address: str) -> str | None:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        text = response.read().decode()
    return next((line for line in text.splitlines() if line.startswith("seedance_gpu_stack_info{")), None)


def test_the_agent_names_the_image_of_a_running_gpu_container(gpu_container, tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    shutil.copy("/bin/true", tree / "true")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SEEDANCE_", "NOTIFY_", "WATCHDOG_"))}
    (tmp_path / "rt").mkdir(mode=0o700)
    env.update(HOME=str(tmp_path / "home"), XDG_CONFIG_HOME=str(tmp_path / "cfg"),
               XDG_STATE_HOME=str(tmp_path / "state"), SEEDANCE_RUNTIME_DIR=str(tmp_path / "rt"))
    log_path = tmp_path / "agent.log"
    with open(log_path, "w") as log:
        agent = subprocess.Popen([str(BIN / "seedance"), "agent", "run", "--probes", "off", "--metrics",
                                  "127.0.0.1:0", "--scan-interval", "1s", "--scan-path", str(tree)],
                                 env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            address, info, deadline = None, None, time.monotonic() + DEADLINE_S
            while time.monotonic() < deadline and (info is None or 'images="none"' in info):
                assert agent.poll() is None, log_path.read_text()
                for line in log_path.read_text().splitlines():
                    if line.startswith("{") and json.loads(line).get("metrics"):
                        address = json.loads(line)["metrics"]
                if address:
                    info = _stack_info(address)
                time.sleep(0.5)
        finally:
            agent.terminate()
            agent.wait(timeout=30)
    assert info is not None, log_path.read_text()
    assert f'images="{gpu_container}"' in info, info


CUDA_MAP = "7f0000000000-7f0000001000 r-xp 00000000 08:01 42 /usr/lib/x86_64-linux-gnu/libcuda.so.1\n"
REFERENCES = {1: "nvcr.io/nvidia/pytorch:24.05-py3",
              2: "registry.example.com/" + "deep/" * 12 + "trainer:2.3",      # longer than a label value
              3: "ghcr.io/acme/infer@sha256:" + "ab" * 32,
              4: "docker.io/library/busybox:1.36"}                            # runs no GPU process
IDS = {n: f"{n:x}" * 64 for n in range(1, 6)}


@pytest.fixture
def engines(tmp_path):
    """The state files of docker (containers 1-4) and podman (container 5)."""
    docker = tmp_path / "docker"
    for n, reference in REFERENCES.items():
        (docker / IDS[n]).mkdir(parents=True)
        (docker / IDS[n] / "config.v2.json").write_text(json.dumps(
            {"Name": f"/c{n}", "Image": "sha256:" + "0" * 64, "Config": {"Image": reference}}))
    podman = tmp_path / "containers.json"
    podman.write_text(json.dumps([{"id": IDS[5], "names": ["job"], "image": "f" * 64,
                                   "metadata": json.dumps({"image-name": "localhost/job:7", "name": "job"})}]))
    return {"docker": str(docker), "podman": str(podman)}


def _proc(base: Path, containers) -> str:
    """A /proc with one process per container (and a host process), each mapping libcuda
    but container 4's."""
    proc = base / f"proc-{'-'.join(map(str, containers))}"
    entries = {106: "0::/user.slice/session-1.scope\n"}
    for n in containers:
        entries[100 + n] = (f"0::/machine.slice/libpod-{IDS[n]}.scope\n" if n == 5
                            else f"0::/system.slice/docker-{IDS[n]}.scope\n")
    for pid, cgroup in entries.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(cgroup)
        (proc / str(pid) / "maps").write_text("" if pid == 104 else CUDA_MAP)
    return str(proc)


@pytest.mark.parametrize("n, expected", [(1, REFERENCES[1]), (2, REFERENCES[2][-MAX_VALUE_LEN:]),
                                         (3, "ghcr.io/acme/infer@abababababab"), (4, "none"),
                                         (5, "localhost/job:7")])
def test_the_image_of_each_engine_as_a_bounded_value(tmp_path, engines, n, expected):
    assert gpu_stack([], None, proc=_proc(tmp_path, [n]), state_roots=engines)["images"] == expected


def test_images_are_sorted_capped_and_also_read_with_scan_paths(tmp_path, engines):
    proc = _proc(tmp_path, [1, 2, 3, 4, 5])
    images = gpu_stack([], None, proc=proc, state_roots=engines)["images"].split(",")
    # four images of GPU processes in use: three named, sorted, and the rest said to exist
    assert len(images) == 4 and images[3] == "+" and images[:3] == sorted(images[:3])
    # with scan paths the libraries come from the trees, the images still from the processes
    (tmp_path / "empty").mkdir()
    assert gpu_stack([str(tmp_path / "empty")], None, proc=proc, state_roots=engines)["images"] == ",".join(images)
