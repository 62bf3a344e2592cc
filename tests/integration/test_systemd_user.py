"""The agent as a systemd user service, under a real user manager.

The host's PID 1 is not systemd, so a Debian bookworm root (systemd, dbus, libpam-systemd;
deploy/mkbase.sh) boots its own systemd in a podman container; a user with lingering gets
user@1000.service, and this tree's wheel is installed into a venv of that user.  Then, as
the user would: `seedance agent install --user`, and each promise of the unit is checked
against the manager itself (systemctl show, journalctl), never against seedance's own word.
"""
from __future__ import annotations

import json
import shlex
import time

import pytest

from tests.integration import image_builds

SYSTEMD_PACKAGES = ["systemd", "systemd-sysv", "dbus", "dbus-user-session", "libpam-systemd", "python3",
                    "python3-venv"]
UID = 1000
USER_ENV = {"HOME": "/home/seed", "XDG_RUNTIME_DIR": f"/run/user/{UID}",
            "DBUS_SESSION_BUS_ADDRESS": f"unix:path=/run/user/{UID}/bus", "PATH": "/home/seed/venv/bin:/usr/bin:/bin"}
UNIT = "seedance-agent.service"
WATCHDOG_S = 4
ABORT_S = 5     # the unit's TimeoutAbortSec
RESTART_S = 2   # the unit's RestartSec
METRICS = "127.0.0.1:9464"


class Machine:
    def __init__(self, container: str):
        self.container = container

    def root(self, script: str, timeout=120):
        return image_builds.run(["podman", "exec", self.container, "sh", "-c", script], timeout=timeout)

    def user(self, script: str, timeout=120):
        env = [f"--env={k}={v}" for k, v in USER_ENV.items()]
        return image_builds.run(["podman", "exec", "--user", str(UID), "--workdir", "/home/seed", *env,
                                 self.container, "sh", "-c", script], timeout=timeout)

    def show(self, *props: str) -> dict:
        out = self.user(f"systemctl --user show {UNIT} " + " ".join(f"-p {p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def wait(self, predicate, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.25)
        raise AssertionError(f"{what}: not within {timeout:.0f} s")


def _boot() -> tuple[Machine | None, str]:
    missing = image_builds.podman_missing()
    if missing:
        return None, missing
    image, why = image_builds.base_image("seedance-systemd-base", SYSTEMD_PACKAGES)
    if not image:
        return None, why
    wheels, why = image_builds.wheelhouse()
    if not wheels:
        return None, why
    started = image_builds.run([*image_builds.PODMAN_RUN, "-d", "--systemd=always",
                                "-v", f"{wheels}:/wheels:ro", image, "/lib/systemd/systemd"])
    if started.returncode != 0:
        return None, f"podman run --systemd=always failed: {started.stderr.strip()[-300:]}"
    machine = Machine(started.stdout.strip())
    try:
        machine.wait(lambda: machine.root("systemctl is-system-running").stdout.strip() in ("running", "degraded"),
                     60, "the container's systemd reaching running")
    except AssertionError as exc:
        state = machine.root("systemctl is-system-running; systemctl --failed --no-legend").stdout
        image_builds.run(["podman", "rm", "-f", machine.container])
        return None, f"{exc} (state: {' '.join(state.split())})"
    # persistent journal: journald splits it per user only there, so `journalctl --user` works
    setup = machine.root(f"mkdir -p /var/log/journal && systemctl restart systemd-journald && "
                         f"useradd -m -u {UID} seed && loginctl enable-linger seed")
    if setup.returncode != 0:
        image_builds.run(["podman", "rm", "-f", machine.container])
        return None, f"setting up the user failed: {setup.stderr.strip()}"
    machine.wait(lambda: machine.user("systemctl --user is-system-running").stdout.strip() in ("running", "degraded"),
                 60, "user@1000.service")
    installed = machine.user("python3 -m venv venv && venv/bin/pip install -q --no-index --find-links /wheels seedance",
                             timeout=600)
    assert installed.returncode == 0, installed.stderr
    return machine, ""


@pytest.fixture(scope="module")
def machine():
    booted, why = _boot()
    if booted is None:
        pytest.skip(f"no systemd user manager to test against: {why}")
    yield booted
    image_builds.run(["podman", "rm", "-f", "-t", "0", booted.container])


@pytest.fixture(scope="module")
def installed(machine):
    proc = machine.user(f"seedance agent install --user --watchdog {WATCHDOG_S}s --metrics {METRICS} "
                        "--no-scan --probes off", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"enabled and started {UNIT}" in proc.stdout
    return machine


# what "serving" means: the status socket answers a status request and /metrics answers
SERVING = (
    "python3 - <<'EOF'\n"
    "import json, os, socket, sys, urllib.request\n"
    "s = socket.socket(socket.AF_UNIX); s.settimeout(5)\n"
    "s.connect(os.environ['XDG_RUNTIME_DIR'] + '/seedance/agent.sock')\n"
    "s.sendall(b'{\"op\": \"status\"}\\n'); answer = s.recv(65536)\n"
    f"body = urllib.request.urlopen('http://{METRICS}/metrics', timeout=5).read()\n"
    "print(json.dumps({'socket': bool(answer), 'metrics': b'seedance_' in body}))\n"
    "EOF")


def test_start_returns_only_once_socket_and_metrics_answer(installed):
    machine = installed
    assert machine.user(f"systemctl --user stop {UNIT}").returncode == 0
    # no wait between the two: under Type=simple `start` returns at fork, long before the
    # agent has imported its modules and bound either socket, and the probe fails
    proc = machine.user(f"systemctl --user start {UNIT} && {SERVING}")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"socket": True, "metrics": True}
    assert machine.show("Type")["Type"] == "notify"


def test_a_stopped_agent_is_restarted_by_the_watchdog(installed):
    machine = installed
    before = machine.show("MainPID", "NRestarts")
    stopped_at = time.monotonic()
    assert machine.root(f"kill -STOP {before['MainPID']}").returncode == 0
    limit = WATCHDOG_S + ABORT_S + RESTART_S + 15  # + the new agent's start, on a shared 2-core box
    after = machine.wait(lambda: (lambda s: s if s.get("ActiveState") == "active" and s["MainPID"] not in
                                  ("0", before["MainPID"]) else None)(machine.show("MainPID", "NRestarts",
                                                                                   "ActiveState")),
                         limit, "a new agent after kill -STOP")
    took = time.monotonic() - stopped_at
    assert int(after["NRestarts"]) == int(before["NRestarts"]) + 1
    journal = machine.user(f"journalctl --user -u {UNIT} --no-pager -o cat").stdout
    assert "Watchdog timeout" in journal, journal[-2000:]
    print(f"kill -STOP to a new active agent: {took:.1f} s (WatchdogSec={WATCHDOG_S}s)")


def test_restart_on_failure_but_not_after_agent_stop(installed):
    machine = installed
    before = machine.show("MainPID", "NRestarts")
    machine.root(f"kill -KILL {before['MainPID']}")
    machine.wait(lambda: (lambda s: s.get("ActiveState") == "active" and s["MainPID"] not in ("0", before["MainPID"]))(
        machine.show("MainPID", "ActiveState")), RESTART_S + 30, "a restart after SIGKILL")
    stop = machine.user("seedance agent stop")
    assert stop.returncode == 0 and "systemctl --user stop" in stop.stdout, stop.stdout + stop.stderr
    time.sleep(RESTART_S * 3)
    assert machine.show("ActiveState")["ActiveState"] == "inactive"
    status = machine.user("seedance agent status")
    assert status.returncode == 3, status.stdout
    assert machine.user(f"systemctl --user start {UNIT}").returncode == 0


def _journal(machine) -> list[dict]:
    out = machine.user(f"journalctl --user -u {UNIT} --no-pager -o json").stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _event(entry: dict) -> str | None:
    """The agent's event name in a journal entry's MESSAGE (None for the manager's own lines)."""
    try:
        message = json.loads(entry.get("MESSAGE") or "")
    except (TypeError, ValueError):
        return None
    return message.get("event") if isinstance(message, dict) else None


def test_the_journal_holds_structured_lines_with_priorities(installed):
    machine = installed
    # a broken agent.yaml makes the reload fail: an error-priority line, beside the info ones
    machine.user("mkdir -p .config/seedance && printf 'agent: [\\n' > .config/seedance/agent.yaml")
    try:
        assert machine.user("seedance agent reload").returncode == 0
        entries = machine.wait(lambda: [e for e in _journal(machine) if _event(e) == "reload-failed"], 20,
                               "the reload-failed entry in the journal")
    finally:
        machine.user("rm -f .config/seedance/agent.yaml")
    entry = entries[-1]
    assert entry["PRIORITY"] == "3"  # the "<3>" prefix became the entry's priority, not text
    message = json.loads(entry["MESSAGE"])
    assert message["event"] == "reload-failed" and message["level"] == "error"
    assert any(_event(e) == "started" and e["PRIORITY"] == "6" for e in _journal(machine))
    errors_only = machine.user(f"journalctl --user -u {UNIT} --no-pager -o cat -p err").stdout
    assert "reload-failed" in errors_only and '"event":"started"' not in errors_only


def test_agent_verbs_go_through_systemctl(installed):
    machine = installed
    if machine.show("ActiveState")["ActiveState"] != "active":
        assert machine.user(f"systemctl --user start {UNIT}").returncode == 0
    status = machine.user("seedance agent status")
    assert status.returncode == 0 and f"unit {UNIT} active" in status.stdout, status.stdout
    pid = machine.show("MainPID")["MainPID"]
    restart = machine.user("seedance agent restart")
    assert restart.returncode == 0 and "systemctl --user restart" in restart.stdout, restart.stdout + restart.stderr
    assert machine.show("MainPID")["MainPID"] not in ("0", pid)
    reload_ = machine.user("seedance agent reload")
    assert reload_.returncode == 0 and "systemctl --user reload" in reload_.stdout, reload_.stdout
    machine.wait(lambda: "Reloaded" in machine.user(f"journalctl --user -u {UNIT} --no-pager -o cat -n 20").stdout
                 or "Reloading" in machine.user(f"journalctl --user -u {UNIT} --no-pager -o cat -n 20").stdout,
                 20, "the manager's Reloading line")
    logs = machine.user("seedance agent logs -n 5")
    journal = machine.user(f"journalctl --user -u {UNIT} --no-pager -n 5")
    assert logs.returncode == 0 and logs.stdout.strip(), logs.stderr
    assert logs.stdout.splitlines()[-1] == journal.stdout.splitlines()[-1]
    start = machine.user("seedance agent stop && seedance agent start && " + SERVING)
    assert start.returncode == 0 and "systemctl --user start" in start.stdout, start.stdout + start.stderr
    assert '{"socket": true, "metrics": true}' in start.stdout


def test_quota_uses_a_transient_scope_of_the_user_manager(installed):
    machine = installed
    policy = ("apiVersion: seedance/v1\nkind: WorkloadQuotaPolicy\nmetadata: {name: enc}\n"
              "spec:\n  workloadSelector: {matchLabels: {app: enc}}\n  quota: {cpu: 500m, memory: 64Mi}\n")
    machine.user(f"printf %s {shlex.quote(policy)} > enc.yaml")
    dry = machine.user("seedance quota apply --dry-run enc.yaml")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    # a labelled workload the user started in their manager (as a login shell's job would be)
    machine.user("systemd-run --user --unit=enc-job --setenv=SEEDANCE_LABELS=app=enc sleep 600")
    job_pid = machine.wait(lambda: (lambda p: p if p not in ("", "0") else None)(
        machine.user("systemctl --user show -P MainPID enc-job.service").stdout.strip()), 20, "the job")
    try:
        applied = machine.user("seedance quota apply --json enc.yaml")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        doc = json.loads(applied.stdout)
        assert doc["backend"] == "systemd-scope"
        placed = [e for e in doc["events"] if e["event"] == "placed"]
        assert len(placed) == 1 and int(job_pid) in placed[0]["pids"]
        scopes = machine.user("systemctl --user list-units --type=scope --no-legend --plain 'seedance-enc-*'").stdout
        scope = scopes.split()[0]
        props = dict(line.split("=", 1) for line in machine.user(
            f"systemctl --user show {scope} -p CPUQuotaPerSecUSec -p MemoryMax -p ControlGroup").stdout.splitlines())
        assert props["CPUQuotaPerSecUSec"] == "500ms" and props["MemoryMax"] == str(64 << 20)
        procs = machine.root(f"cat /sys/fs/cgroup/unified{props['ControlGroup']}/cgroup.procs 2>/dev/null || "
                             f"cat /sys/fs/cgroup/systemd{props['ControlGroup']}/cgroup.procs").stdout.split()
        assert job_pid in procs
        text = machine.user("seedance quota list").stdout
        assert "enc: selects app=enc" in text
        # whether the kernel enforces it is read from its files, and said when it does not
        enforced = placed[0]["enforced"]
        print(f"kernel enforcement of the scope's limits: {enforced}: {placed[0]['enforcement']}")
        removed = machine.user("seedance quota remove enc")
        assert removed.returncode == 0, removed.stderr
        after = machine.user(f"systemctl --user show {scope} -p CPUQuotaPerSecUSec -p MemoryMax").stdout
        assert "CPUQuotaPerSecUSec=infinity" in after and "MemoryMax=infinity" in after
        assert machine.user("systemctl --user is-active enc-job.service").stdout.strip() == "active" or \
            job_pid in machine.root(f"cat /sys/fs/cgroup/systemd{props['ControlGroup']}/cgroup.procs").stdout
    finally:
        machine.user("systemctl --user stop enc-job.service")


def test_uninstall_leaves_nothing_unless_the_state_is_kept(installed):
    machine = installed
    if machine.show("ActiveState")["ActiveState"] != "active":
        assert machine.user(f"systemctl --user start {UNIT}").returncode == 0
    kept = machine.user("seedance agent uninstall --user --keep-state")
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert machine.user("test -e .local/state/seedance/agent.db").returncode == 0
    assert machine.user("seedance agent install --user --no-scan --probes off").returncode == 0
    gone = machine.user("seedance agent uninstall --user")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    leftovers = machine.user("ls -A .config/systemd/user/ .local/state/seedance/ 2>/dev/null; "
                             f"ls -A $XDG_RUNTIME_DIR/seedance/ 2>/dev/null; "
                             f"systemctl --user list-unit-files {UNIT} --no-legend; "
                             f"systemctl --user list-units --all {UNIT} --no-legend").stdout
    assert [line for line in leftovers.splitlines()
            if "seedance-agent" in line or line.startswith("agent.")] == [], leftovers
    assert machine.user("seedance agent status").returncode == 3
