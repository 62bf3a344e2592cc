"""The shim's registry across pid namespaces: a wrapped program in a container, the agent on the host.

Real parts: libseedance_shim.so preloaded into a program that allocates through the fake
driver (tests/fakecuda) and stays alive, run as root in a new pid namespace (`unshare
--pid --fork --mount-proc`, and in a podman container when podman can run one here); the
real registry; the real agent (`seedance agent run`) and its GC; SQLite.

The program's pid in its namespace is chosen (ns_last_pid) so that on the host the same
number is either a live unrelated process (a `sleep` started by the test) or no process
at all: the two ways a pid judged in the wrong namespace goes wrong (the slot's process
taken for dead while it runs).  Once it is killed, the agent must find it ended and report
its 4096 bytes as leaked.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
from test_agent_restart import fake_driver  # noqa: F401  (a fixture: the fake driver and sdtest)

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HELD = 4096

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="a new pid namespace needs root and unshare(1)")


@pytest.fixture
def env(fake_driver):
    root = Path(tempfile.mkdtemp(prefix="sd-pn-", dir="/tmp"))
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("SEEDANCE_", "FAKECUDA_", "CUDA_", "OTEL_")) and k not in ("LD_PRELOAD", "NOTIFY_SOCKET")}
    e.update(HOME=str(root / "home"), XDG_CONFIG_HOME=str(root / "cfg"), XDG_STATE_HOME=str(root / "state"),
             XDG_RUNTIME_DIR=str(root / "xdg"), SEEDANCE_RUNTIME_DIR=str(root / "rt"), FAKECUDA_DEVICES="2",
             FAKECUDA_LEDGER=str(root / "ledger"))
    yield e
    shutil.rmtree(root, ignore_errors=True)


def wait_until(predicate, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def registry(env):
    """The agent's own registry reader (seedance.service.registry), in a fresh process."""
    code = ("import json; from seedance.service.registry import open_registry; r = open_registry(); "
            "print(json.dumps([[i.slot, i.pid, i.alive, i.allocated_bytes, getattr(i, 'host_pid', None)] "
            "for i in r.scan()]))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout)


def reclaim(env, slot: int) -> bool:
    """The shim's own reclaim (C, under the registry lock): it refuses a slot whose process runs."""
    code = f"from seedance import shim; print(shim.Registry.open().reclaim({slot}))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    return proc.stdout.strip() == "True"


def status(env):
    proc = subprocess.run([str(BIN / "seedance"), "status", "--json"], env=env, capture_output=True, text=True,
                          timeout=30)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def ended_rows(env):
    db = Path(env["XDG_STATE_HOME"]) / "seedance" / "agent.db"
    if not db.exists():
        return []
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT pid, outcome, leaked_bytes, reclaimed FROM instances "
                            "WHERE ended IS NOT NULL").fetchall()
    finally:
        conn.close()


def free_host_pid() -> int:
    """A pid number no host process has now (and, short of a wrap-around, in the next seconds)."""
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    for candidate in range(pid_max - 50, 300, -1):
        if abs(candidate - last) > 2000 and not Path(f"/proc/{candidate}").exists():
            return candidate
    pytest.skip("no free pid number on this host")


def host_pids_in(ns_inode: int, ns_pid: int) -> list[int]:
    """Host pids of processes whose innermost pid is ns_pid in pid namespace ns_inode."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}/ns/pid").st_ino != ns_inode:
                continue
            nspid = next(line for line in Path(f"/proc/{name}/status").read_text().splitlines()
                         if line.startswith("NSpid:")).split()[1:]
        except (OSError, StopIteration):
            continue
        if int(nspid[-1]) == ns_pid:
            out.append(int(name))
    return out


def start_in_pid_namespace(env, fake_driver, ns_pid: int):
    """`unshare --pid --fork --mount-proc`: a shell as the namespace's pid 1 forks the wrapped
    program as pid ns_pid (ns_last_pid is per pid namespace, writable by its root)."""
    # `a && b & c` would fork the whole and-list first: the write must come before the fork
    program = (f"echo {ns_pid - 1} > /proc/sys/kernel/ns_last_pid || exit 3; "
               f"LD_PRELOAD={shim_library()} LD_LIBRARY_PATH={fake_driver} "
               f"{fake_driver / 'sdtest'} --via dlsym init ctx:0 alloc:{HELD} sleep:120000 & wait")
    return subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", program],
                            env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def shim_library() -> Path:
    from seedance import shim

    return shim.library_path()


def start_agent(env, log: Path):
    return subprocess.Popen([str(BIN / "seedance"), "agent", "run", "--gc-interval", "200ms", "--no-scan",
                             "--probes", "off"], env=env, stdout=subprocess.DEVNULL, stderr=open(log, "a"))


def assert_alive_through_gc_passes(env, ns_pid: int, passes: int = 5):
    """Several GC passes of the agent while the program runs: never ended, never reclaimed."""
    first = wait_until(lambda: (s := status(env)) and s["counters"]["gc_passes"], "the agent's first GC pass")
    wait_until(lambda: status(env)["counters"]["gc_passes"] >= first + passes, f"{passes} more GC passes")
    snap = status(env)
    assert [row for row in ended_rows(env) if row[0] == ns_pid] == [], "a live instance was recorded as ended"
    assert snap["counters"]["slots_reclaimed"] == 0 and snap["counters"]["leaks_reported"] == 0
    listed = [i for i in snap["instances"] if i["pid"] == ns_pid]
    assert len(listed) == 1 and listed[0]["allocated_bytes"] == HELD
    return listed[0]


@pytest.mark.parametrize("host_side", ["collides", "absent"])
def test_agent_keeps_a_live_namespaced_instance_and_finds_it_ended(env, fake_driver, tmp_path, host_side):
    unrelated = None
    if host_side == "collides":
        # a live host process, unrelated to the workload, with the number the program gets
        unrelated = subprocess.Popen(["sleep", "300"])
        ns_pid = unrelated.pid
    else:
        ns_pid = free_host_pid()
    container = start_in_pid_namespace(env, fake_driver, ns_pid)
    agent = start_agent(env, tmp_path / "agent.log")
    try:
        slots = wait_until(lambda: (r := registry(env)) and [i for i in r if i[1] == ns_pid and i[3] == HELD],
                           "the namespaced program's slot with its allocation")
        assert slots[0][2] is True, "the reader took the running program for ended"
        ns_inode = os.stat(f"/proc/{container.pid}/ns/pid_for_children").st_ino
        host_pid = wait_until(lambda: host_pids_in(ns_inode, ns_pid), "the program seen from the host")[0]
        assert host_pid != ns_pid
        # the reader the agent uses: alive, and which host process it is
        assert slots == [[slots[0][0], ns_pid, True, HELD, host_pid]]
        listed = assert_alive_through_gc_passes(env, ns_pid)
        assert listed["host_pid"] == host_pid
        assert not reclaim(env, slots[0][0]), "the shim reclaimed the slot of a running program"
        assert (unrelated is None) == (not Path(f"/proc/{ns_pid}").exists())  # the host side is as chosen

        if host_side == "collides":
            # the whole container goes (its pid 1 killed): no process of the namespace is left
            os.kill(host_pids_in(ns_inode, 1)[0], signal.SIGKILL)
            container.wait(timeout=30)
            assert host_pids_in(ns_inode, ns_pid) == []
        else:
            # only the program dies; the namespace's pid 1 still runs
            os.kill(host_pid, signal.SIGKILL)
        rows = wait_until(lambda: [r for r in ended_rows(env) if r[0] == ns_pid and r[3] is not None],
                          "the agent to record the end and reclaim the slot")
        assert rows == [(ns_pid, "leaked", HELD, rows[0][3])]
        assert [i for i in registry(env) if i[1] == ns_pid] == []
        assert unrelated is None or unrelated.poll() is None  # the unrelated process was left alone
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
        if container.poll() is None:
            os.killpg(container.pid, signal.SIGKILL)
            container.wait()
        if unrelated is not None:
            unrelated.kill()
            unrelated.wait()


def test_processes_of_the_agents_own_namespace_are_judged_as_before(env, fake_driver, tmp_path):
    """No namespace in between: the same pid on both sides, alive while it runs, ended after."""
    wrapped = dict(env, LD_PRELOAD=str(shim_library()), LD_LIBRARY_PATH=str(fake_driver))
    program = subprocess.Popen([str(fake_driver / "sdtest"), "--via", "dlsym", "init", "ctx:0", f"alloc:{HELD}",
                                "sleep:120000"], env=wrapped, stdout=subprocess.DEVNULL)
    try:
        slots = wait_until(lambda: (r := registry(env)) and [i for i in r if i[1] == program.pid and i[3] == HELD],
                           "the program's slot")
        assert slots == [[slots[0][0], program.pid, True, HELD, program.pid]]
        program.kill()
        program.wait()
        assert [i[2] for i in registry(env) if i[1] == program.pid] == [False]
    finally:
        if program.poll() is None:
            program.kill()
            program.wait()


def test_registry_of_another_layout_is_refused_with_one_line(tmp_path):
    """A registry file whose header names another ABI (the slot grew by the namespace
    fields) is refused, with the ABI it was written by, not misread."""
    from seedance.shim import NotAvailable, Registry, binding

    ffi, lib = binding()
    path = tmp_path / f"registry.v{lib.SD_ABI_VERSION}"
    header = bytearray(lib.seedance_registry_size())
    view = ffi.cast("struct sd_header *", ffi.from_buffer(header))
    view.magic, view.abi_version, view.ready = lib.SD_MAGIC, lib.SD_ABI_VERSION - 1, 1
    view.slot_size, view.group_size = ffi.sizeof("struct sd_slot") - 16, ffi.sizeof("struct sd_group")
    path.write_bytes(bytes(header))
    with pytest.raises(NotAvailable) as refused:
        Registry.open(path)
    assert f"ABI {lib.SD_ABI_VERSION - 1}" in str(refused.value) and "\n" not in str(refused.value)


# --- a real podman container: the workload of a pod, the agent on the node -------------
#
# As the DaemonSet shares the registry (deploy/daemonset.yaml, docs/containers.md "The
# shim registry in pods"): the node's runtime directory is bind-mounted at /run/seedance in
# the workload's container, which sets SEEDANCE_RUNTIME_DIR=/run/seedance; the agent runs
# on the host with the same directory under its own path.  The shim, the fake driver and
# the program come from the host read-only; the image holds only what they load (libc and
# ld.so, from ldd) and /bin/sh, imported with `podman import` (no registry is reachable).

POD_RUNTIME_DIR = "/run/seedance"
POD_SHIM = "/opt/seedance/libseedance_shim.so"
POD_DRIVER = "/opt/fakecuda"


def podman_unusable() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed (make system-deps installs it)"
    if not os.path.exists("/usr/sbin/runc"):
        return "runc is not installed at /usr/sbin/runc"
    return None


class PodWorkload:
    """sdtest under the shim in a podman container: pid 1 of its pid namespace (the program
    is the container's command; on the host pid 1 is always a live process, init), or a
    child of /bin/sh as the container's init, with whatever small pid runc leaves it (on a
    host the low numbers are kernel threads)."""

    def __init__(self, base: Path, fake_driver: Path, runtime_dir: Path):
        from image_builds import PODMAN_RUN
        from test_containers_live import _copy_in, _ldd_paths

        self.podman_run = PODMAN_RUN
        self.fake_driver, self.runtime_dir = fake_driver, runtime_dir
        self.tag = f"localhost/sd-pidns-{os.getpid()}-{time.monotonic_ns()}:1"
        self.name = f"sd-pidns-{os.getpid()}-{time.monotonic_ns()}"
        self.started = False
        root = base / "rootfs"
        loaded = {"/bin/sh"}  # the image's shell; the rest is what ld.so loads for each
        for binary in ("/bin/sh", shim_library(), fake_driver / "libcuda.so.1", fake_driver / "sdtest"):
            loaded.update(_ldd_paths(str(binary)))
        for path in sorted(loaded):
            _copy_in(str(root), path)
        for mountpoint in (POD_RUNTIME_DIR, str(Path(POD_SHIM).parent), POD_DRIVER, "/tmp"):
            (root / mountpoint.lstrip("/")).mkdir(parents=True, exist_ok=True)
        tar = base / "rootfs.tar"
        with tarfile.open(tar, "w") as out:
            out.add(root, arcname=".")
        self.image_error = self._podman("import", str(tar), self.tag)

    @staticmethod
    def _podman(*argv) -> str | None:
        proc = subprocess.run(["podman", *argv], capture_output=True, text=True, timeout=120)
        if proc.returncode:
            return " ".join((proc.stderr.strip().splitlines() or ["?"])[-1:])
        return None

    def cannot_run(self) -> str | None:
        """Why podman cannot run a container here (image, runtime, cgroups), else None: a
        trivial container with the same runtime and limits, before the one under test."""
        if self.image_error:
            return f"podman import failed: {self.image_error}"
        proc = subprocess.run([*self.podman_run, "--rm", self.tag, "/bin/sh", "-c", "exit 0"],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode:
            return f"podman run failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
        return None

    def start(self, as_init: bool) -> tuple[int, int]:
        """Start the wrapped program: (its pid in the container, its host pid)."""
        program = [f"{POD_DRIVER}/sdtest", "--via", "dlsym", "init", "ctx:0", f"alloc:{HELD}", "sleep:120000"]
        if as_init:
            preload, command = ["-e", f"LD_PRELOAD={POD_SHIM}"], program
        else:
            # the shim takes itself out of LD_PRELOAD for what a wrapped shell starts: the
            # shell preloads it for the program alone
            preload = []
            command = ["/bin/sh", "-c", f"LD_PRELOAD={POD_SHIM} {' '.join(program)} & wait"]
        error = self._podman(
            *self.podman_run[1:], "-d", "--name", self.name,
            "-v", f"{self.runtime_dir}:{POD_RUNTIME_DIR}",
            "-v", f"{shim_library()}:{POD_SHIM}:ro",
            "-v", f"{self.fake_driver}:{POD_DRIVER}:ro",
            "-e", f"SEEDANCE_RUNTIME_DIR={POD_RUNTIME_DIR}", *preload,
            "-e", f"LD_LIBRARY_PATH={POD_DRIVER}", "-e", "FAKECUDA_DEVICES=2",
            "-e", "FAKECUDA_LEDGER=/tmp/ledger", self.tag, *command)
        assert error is None, f"podman run of the workload failed (a trivial container ran): {error}"
        self.started = True
        init = wait_until(lambda: (p := subprocess.run(
            ["podman", "inspect", "--format", "{{.State.Pid}}", self.name], capture_output=True, text=True,
            timeout=60).stdout.strip()).isdigit() and int(p) > 0 and int(p), "the container's init")
        self.ns_inode = os.stat(f"/proc/{init}/ns/pid").st_ino
        try:
            return wait_until(lambda: self._program(), "sdtest running in the container")
        except AssertionError as exc:
            logs = subprocess.run(["podman", "logs", self.name], capture_output=True, text=True, timeout=60)
            raise AssertionError(f"{exc}; the container's output: {(logs.stdout + logs.stderr)[-500:]!r}") from None

    def _program(self) -> tuple[int, int] | None:
        """(pid in the container, host pid) of sdtest, found the way the agent finds it: NSpid."""
        for name in os.listdir("/proc"):
            try:
                if not name.isdigit() or os.stat(f"/proc/{name}/ns/pid").st_ino != self.ns_inode:
                    continue
                if Path(f"/proc/{name}/comm").read_text().strip() != "sdtest":
                    continue
                nspid = next(line for line in Path(f"/proc/{name}/status").read_text().splitlines()
                             if line.startswith("NSpid:")).split()[1:]
            except (OSError, StopIteration):
                continue
            return int(nspid[-1]), int(name)
        return None

    def remove(self):
        if self.started:
            assert self._podman("rm", "-f", "-t", "0", self.name) is None
            self.started = False

    def close(self):
        self._podman("rm", "-f", "-t", "0", "--ignore", self.name)
        self._podman("rmi", "-f", self.tag)


@pytest.fixture
def pod_workload(env, fake_driver, tmp_path):
    reason = podman_unusable()
    if reason:
        pytest.skip(f"podman cannot run a container here: {reason}")
    runtime_dir = Path(env["SEEDANCE_RUNTIME_DIR"])
    runtime_dir.mkdir(mode=0o700, parents=True)  # the hostPath: there before any pod mounts it
    workload = PodWorkload(tmp_path, fake_driver, runtime_dir)
    try:
        reason = workload.cannot_run()
        if reason:
            pytest.skip(f"podman cannot run a container here: {reason}")
        yield workload
    finally:
        workload.close()


@pytest.mark.parametrize("as_init", [True, False], ids=["program-is-pid1", "program-under-sh"])
def test_agent_keeps_a_live_podman_workload_and_reclaims_it_after_rm(env, pod_workload, tmp_path, as_init):
    ns_pid, host_pid = pod_workload.start(as_init)
    assert host_pid != ns_pid and (ns_pid == 1) == as_init
    # what the host's process of the same number is: for pid 1 always a live one (init),
    # whose start time is not the slot's; the check at the end says it was left as it was
    host_side = Path(f"/proc/{ns_pid}").exists()
    print(f"\nthe program is pid {ns_pid} in its container, {host_pid} on the host; "
          f"host pid {ns_pid} {'is a live process' if host_side else 'is free'}")
    agent = start_agent(env, tmp_path / "agent.log")
    try:
        slots = wait_until(lambda: (r := registry(env)) and [i for i in r if i[1] == ns_pid and i[3] == HELD],
                           "the container's program's slot with its allocation")
        assert slots == [[slots[0][0], ns_pid, True, HELD, host_pid]], "the reader misjudged the running program"
        listed = assert_alive_through_gc_passes(env, ns_pid)
        assert listed["host_pid"] == host_pid and listed["pid_namespace"] == pod_workload.ns_inode
        assert not reclaim(env, slots[0][0]), "the shim reclaimed the slot of a running program"
        assert host_pids_in(pod_workload.ns_inode, ns_pid) == [host_pid]  # it still runs, after all that

        pod_workload.remove()
        assert host_pids_in(pod_workload.ns_inode, ns_pid) == []
        rows = wait_until(lambda: [r for r in ended_rows(env) if r[0] == ns_pid and r[3] is not None],
                          "the agent to record the end and reclaim the slot")
        assert rows == [(ns_pid, "leaked", HELD, rows[0][3])]
        assert [i for i in registry(env) if i[1] == ns_pid] == []
        assert Path(f"/proc/{ns_pid}").exists() == host_side  # the host's process of that number was left alone
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
