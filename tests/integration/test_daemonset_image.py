"""The DaemonSet's image, built by `make image` and run as deploy/daemonset.yaml runs it.

The image is built once per content hash of what goes into it (the wheel's sources, the
Containerfile, the base recipe, the Makefile): a second run of this file reuses it.  The
first build takes minutes (mmdebstrap, then `pip wheel .`, then podman build).

Then, against this host, as the DaemonSet would: the host's pid namespace (hostPID), a
read-only root filesystem, every capability dropped but the ones docs/agent.md lists, the
host's /lib/modules and /usr/src read-only.  A process of another user with a library
deleted under it is checked from inside the image and from the host, and both must name
the same findings; without CAP_SYS_PTRACE the image cannot give the host's answer (the
capability is there for a reason).  Last, seedance checks its own image with `check --image`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time

import pytest

from tests.conftest import run_cli
from tests.integration import image_builds
from tests.integration.process_fixtures import gcc, shared_lib

REPO = image_builds.REPO
# the DaemonSet's securityContext, capability for capability
CAPS = ["SYS_PTRACE", "DAC_READ_SEARCH", "BPF", "PERFMON", "SYS_RESOURCE"]
NOBODY = 65534


def _version() -> str:
    return re.search(r'__version__ = "([^"]+)"', (REPO / "agent" / "__init__.py").read_text()).group(1)


def _image_key() -> str:
    digest = hashlib.sha256(image_builds.source_key().encode())
    for name in ("deploy/Containerfile", "deploy/mkbase.sh", "Makefile"):
        digest.update((REPO / name).read_bytes())
    return digest.hexdigest()[:12]


@pytest.fixture(scope="module")
def image():
    missing = image_builds.podman_missing() or (None if shutil.which("make") else "make is not installed")
    if missing:
        pytest.skip(f"cannot build the image: {missing}")
    tag = f"localhost/seedance-test:{_image_key()}"
    if image_builds.run(["podman", "image", "exists", tag]).returncode != 0:
        started = time.monotonic()
        built = image_builds.run(["make", "--no-print-directory", "image", f"IMAGE_TAG={tag}"], cwd=REPO,
                                 timeout=1800)
        assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
        print(f"make image: {time.monotonic() - started:.0f} s; {built.stdout.strip().splitlines()[-1]}")
    return tag


def test_daemonset_names_the_package_version():
    text = (REPO / "deploy" / "daemonset.yaml").read_text()
    assert re.findall(r"image: (seedance:\S+)", text) == [f"seedance:{_version()}"]
    for cap in CAPS:
        assert f'"{cap}"' in text


@pytest.fixture(scope="module")
def deleted_lib_process():
    """A program of another user (nobody) whose library was deleted after it was mapped."""
    work = tempfile.mkdtemp(prefix="sd-dsimg-", dir="/tmp")
    os.chmod(work, 0o755)
    lib = shared_lib(os.path.join(work, "libgone.so"), "int gone(void) { return 7; }\n", soname="libgone.so")
    main = os.path.join(work, "main.c")
    with open(main, "w") as handle:
        handle.write("#include <unistd.h>\nextern int gone(void);\nint main(void) { gone(); pause(); return 0; }\n")
    program = os.path.join(work, "holds-gone")
    gcc("-o", program, main, f"-L{work}", "-lgone", f"-Wl,-rpath,{work}")
    for path in (lib, program):
        os.chmod(path, 0o755)
    proc = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", program])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if lib in open(f"/proc/{proc.pid}/maps").read():
                    break
            except OSError:
                pass
            time.sleep(0.05)
        os.unlink(lib)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def _in_image(image, *args, caps=CAPS):
    return image_builds.run([
        *image_builds.PODMAN_RUN, "--rm", "--pid=host", "--user=0", "--read-only", "--tmpfs=/tmp",
        "--security-opt=no-new-privileges", "--cap-drop=all", *(f"--cap-add={c}" for c in caps),
        "-v", "/lib/modules:/lib/modules:ro", "-v", "/usr/src:/usr/src:ro", image, *args], timeout=300)


def _findings(stdout: str) -> set:
    report = json.loads(stdout)
    return {(f["rule"], json.dumps(f["subject"], sort_keys=True)) for f in report["findings"]}


def test_check_from_the_image_sees_what_the_host_sees(image, deleted_lib_process):
    pid = str(deleted_lib_process)
    inside = _in_image(image, "check", "--pid", pid, "--json", "--no-progress", "--no-cache")
    assert inside.returncode in (0, 1), inside.stderr
    host = run_cli("check", "--pid", pid, "--json", "--no-progress", "--no-cache", timeout=300)
    assert host.returncode in (0, 1), host.stderr
    found_inside, found_host = _findings(inside.stdout), _findings(host.stdout)
    assert found_inside == found_host
    assert any(rule == "lib-deleted" and "libgone.so" in subject for rule, subject in found_inside), found_inside


def test_without_sys_ptrace_the_image_cannot_judge_another_users_process(image, deleted_lib_process):
    # CAP_SYS_PTRACE is what opens /proc/PID/root of another user's process, where its mapped
    # files are stat'ed to tell a replaced library from a present one.  (CAP_PERFMON alone
    # already opens /proc/PID/maps and environ on this kernel, so the process is still listed.)
    # Without it the image's own files must never stand in for the process's: the library the
    # kernel marks "(deleted)" in maps is still found, and nothing else is claimed (before,
    # libc and ld.so, stat'ed in the image's root, were reported replaced).
    pid = str(deleted_lib_process)
    host = _findings(run_cli("check", "--pid", pid, "--json", "--no-progress", "--no-cache", timeout=300).stdout)
    inside = _in_image(image, "check", "--pid", pid, "--json", "--no-progress", "--no-cache",
                       caps=[c for c in CAPS if c != "SYS_PTRACE"])
    if inside.returncode == 2:
        assert "permission denied" in inside.stderr, inside.stderr
    else:
        assert _findings(inside.stdout) == host, inside.stdout[-1000:]


def test_the_agent_serves_from_the_image(image):
    # the DaemonSet's command, read-only root and capabilities: status answers, probes (auto)
    # either attach or say why in one log line, and the agent exits cleanly on SIGTERM
    name = f"sd-dsimg-agent-{os.getpid()}"
    runtime = tempfile.mkdtemp(prefix="sd-dsimg-run-", dir="/tmp")
    started = image_builds.run([
        *image_builds.PODMAN_RUN, "-d", "--name", name, "--pid=host", "--user=0", "--read-only", "--tmpfs=/tmp",
        "--security-opt=no-new-privileges", "--cap-drop=all", *(f"--cap-add={c}" for c in CAPS),
        "-v", "/lib/modules:/lib/modules:ro", "-v", "/usr/src:/usr/src:ro", "-v", f"{runtime}:/run/seedance",
        "--tmpfs=/var/lib/seedance", image, "agent", "run", "--no-scan", "--gc-interval", "2s"])
    assert started.returncode == 0, started.stderr
    try:
        deadline = time.monotonic() + 90
        status = None
        while time.monotonic() < deadline:
            status = image_builds.run(["podman", "exec", name, "seedance", "status", "--json"])
            if status.returncode == 0:
                break
            time.sleep(1)
        assert status is not None and status.returncode == 0, (status.stdout, status.stderr)
        assert image_builds.run(["podman", "stop", "-t", "30", name]).returncode == 0
        logs = image_builds.run(["podman", "logs", name]).stderr + image_builds.run(["podman", "logs", name]).stdout
        events = [json.loads(line)["event"] for line in logs.splitlines() if line.startswith("{")]
        assert "started" in events and events[-1] == "stopped", events
        assert "Traceback" not in logs
    finally:
        image_builds.run(["podman", "rm", "-f", name])
        shutil.rmtree(runtime, ignore_errors=True)


def test_seedance_checks_its_own_image(image, tmp_path):
    archive = tmp_path / "seedance.oci.tar"
    saved = image_builds.run(["podman", "save", "--format", "oci-archive", "-o", str(archive), image])
    assert saved.returncode == 0, saved.stderr
    size_mb = archive.stat().st_size / 1e6
    proc = run_cli("check", "--image", str(archive), "--json", "--no-progress", timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    serious = [f for f in report["findings"] if f.get("severity") in ("error", "fatal")]
    print(f"image archive {size_mb:.0f} MB; check --image: {len(report['findings'])} findings "
          f"({sorted({f['rule'] for f in report['findings']})})")
    assert serious == [], [(f["rule"], f["subject"]) for f in serious][:10]
