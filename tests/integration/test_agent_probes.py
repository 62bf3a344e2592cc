"""The agent with the real eBPF trace probes (root, bcc): attached while it runs, detached
on SIGTERM before it exits.  Skips with the reason when eBPF cannot run here."""
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.test_agent_lifecycle import RunningAgent, agent_root  # noqa: F401  (fixture)


def _ebpf_problem():
    if os.geteuid() != 0:
        return "the eBPF probes need root"
    try:
        from seedance.trace import env
    except ImportError:
        return "seedance.trace is not installed"
    return env.ebpf_problem()


def _bpf_fds(pid):
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        count += target.startswith(("anon_inode:bpf", "anon_inode:[perf_event]"))
    return count


def test_probes_attach_and_sigterm_detaches_them(agent_root):  # noqa: F811
    problem = _ebpf_problem()
    if problem:
        pytest.skip(f"eBPF unavailable: {problem}")
    agent = RunningAgent(agent_root, args=(), watchdog_usec=0)
    agent.args = [a if a != "off" else "on" for a in agent.args]  # --probes on: attach or fail
    agent.start()  # READY=1 only after the probes are up
    try:
        status = agent.status()
        probes = status["agent"]["probes"]
        assert probes["state"] == "attached", probes
        child = probes["pid"]
        assert _bpf_fds(child) > 0  # programs loaded and perf events open in the probe child
        # host-wide: a process started now is seen (exec, its libraries, exit)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and agent.status()["counters"]["probe_events"] == 0:
            subprocess.run(["/bin/true"])
            time.sleep(1)
        assert agent.status()["counters"]["probe_events"] > 0
        assert agent.stop(signal.SIGTERM) == 0
        assert not Path(f"/proc/{child}").exists()  # gone: every probe fd closed with it
        names = [e["event"] for e in agent.events()]
        assert names.index("probes-detached") < names.index("state-flushed") < names.index("stopped")
        notices = [e.get("text", "") for e in agent.events() if e["event"] == "probes-notice"]
        assert any("probes detached" in text for text in notices), notices
    finally:
        agent.close()


def test_probes_on_without_ebpf_is_one_line_exit_2(agent_root):  # noqa: F811
    if os.geteuid() == 0 and not _ebpf_problem():
        # hide the kernel headers the way seedance.trace.env documents, so eBPF is unavailable
        env_extra = {"SEEDANCE_KERNEL_HEADERS": str(agent_root / "no-headers")}
    else:
        env_extra = {}
    agent = RunningAgent(agent_root, watchdog_usec=0)
    agent.env.update(env_extra)
    args = [a if a != "off" else "on" for a in agent.args]
    proc = subprocess.run([str(Path(os.sys.executable).parent / "seedance"), *args], env=agent.env,
                          capture_output=True, text=True, timeout=120)
    agent.notify.close()
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("{")]
    assert len(lines) == 1 and "--probes on:" in lines[0] and "Traceback" not in proc.stderr
