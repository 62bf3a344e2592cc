"""WorkloadQuotaPolicy on this machine's real cgroups, with CPU-burning children.

The CPU share is measured by the test itself from the burners' /proc/PID/stat (utime +
stime), not from anything seedance reports.  Other work on this 2-core machine must not
starve the burners below their quota and fake a pass (or a fail): the test raises the
workload cgroup's scheduling weight (v1 cpu.shares, v2 cpu.weight), the group-level twin of
nice, which changes who wins contention but never the quota's cap.
"""
import json
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="cgroup quotas need root here (no delegated subtree)")

TICK = os.sysconf("SC_CLK_TCK")
BURN = "import os\nos.nice(-10)\nwhile True: pass\n"


def _policy(name, cpu, burst=None, below=None, label="app=encoder"):
    key, value = label.split("=")
    text = (f"apiVersion: seedance/v1\nkind: WorkloadQuotaPolicy\nmetadata: {{name: {name}}}\nspec:\n"
            f"  workloadSelector: {{matchLabels: {{{key}: {value}}}}}\n  quota: {{cpu: \"{cpu}\", memory: \"256Mi\"}}\n")
    if burst:
        text += f"  burstable: true\n  burst: {{cpu: \"{burst}\", whenPressureBelow: {{cpu_some_avg10: {below}}}}}\n"
    return text


def _host_cpu_pressure():
    """/proc/pressure/cpu "some avg10" (percent), read independently of seedance's psi module."""
    try:
        with open("/proc/pressure/cpu", encoding="ascii", errors="replace") as handle:
            first = handle.readline().split()
    except OSError:
        return None
    fields = dict(item.split("=", 1) for item in first[1:] if "=" in item)
    try:
        return float(fields["avg10"])
    except (KeyError, ValueError):
        return None


@pytest.fixture
def env(tmp_path):
    environ = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "cfg"), XDG_STATE_HOME=str(tmp_path / "state"))
    try:
        from seedance.quota import cgroups
        cgroups.detect()
    except Exception as exc:  # noqa: BLE001 - any reason cgroups are unusable here
        pytest.skip(f"no usable cgroup controllers: {exc}")
    yield environ
    subprocess.run([sys.executable, "-m", "seedance", "quota", "remove", "encoders"], env=environ,
                   capture_output=True, timeout=60)


@pytest.fixture
def burners():
    """start(n): one labelled workload, as `seedance run --label` makes it: a shell whose
    n children burn CPU.  Returns the burners' pids."""
    started = []

    def start(count, labels="app=encoder"):
        script = " ".join(f'"{sys.executable}" -c "$BURN" &' for _ in range(count)) + " wait"
        shell = subprocess.Popen(["sh", "-c", script], start_new_session=True,
                                 env=dict(os.environ, SEEDANCE_LABELS=labels, BURN=BURN))
        started.append(shell)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            children = _children(shell.pid)
            if len(children) == count:
                return children
            time.sleep(0.05)
        raise AssertionError("burners did not start")
    yield start
    for shell in started:
        try:
            os.killpg(shell.pid, 9)
        except ProcessLookupError:
            pass
        shell.wait()


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(p) for p in handle.read().split()]
    except OSError:
        return []


def _seedance(env, *args):
    return subprocess.run([sys.executable, "-m", "seedance", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def _cpu_seconds(pids):
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (stat fields 14 and 15)
    return total / TICK


def _share(pids, seconds=3.0):
    before, start = _cpu_seconds(pids), time.monotonic()
    time.sleep(seconds)
    return (_cpu_seconds(pids) - before) / (time.monotonic() - start)


def _outweigh_contention(groups):
    cpu = groups["cpu"]
    for name, value in (("cpu.shares", 102400), ("cpu.weight", 10000)):
        if os.path.exists(os.path.join(cpu, name)):
            with open(os.path.join(cpu, name), "w") as handle:
                handle.write(f"{value}\n")
            return


def _groups(env):
    listing = json.loads(_seedance(env, "quota", "list", "--json").stdout)
    return listing[0]["workloads"][0]["groups"]


def _cgroups(pid):
    with open(f"/proc/{pid}/cgroup") as handle:
        return handle.read()


def test_quota_holds_half_a_core_and_remove_restores(env, burners, tmp_path):
    pids = burners(2)
    before = {pid: _cgroups(pid) for pid in pids}
    free = _share(pids, 1.5)
    policy = tmp_path / "p.yaml"
    policy.write_text(_policy("encoders", "500m"))
    done = _seedance(env, "quota", "apply", str(policy), "--json")
    assert done.returncode == 0, done.stderr
    applied = json.loads(done.stdout)
    placed = [e for e in applied["events"] if e["event"] == "placed"]
    assert len(placed) == 1 and set(pids) <= set(placed[0]["pids"])  # one workload: the shell and its children
    _outweigh_contention(_groups(env))
    time.sleep(0.5)
    limited = _share(pids)
    assert 0.4 <= limited <= 0.6, f"2 burners under a 500m quota used {limited:.2f} cores (before: {free:.2f})"
    listing = json.loads(_seedance(env, "quota", "list", "--json").stdout)
    assert set(pids) <= set(listing[0]["workloads"][0]["pids"])
    groups = listing[0]["workloads"][0]["groups"]
    done = _seedance(env, "quota", "remove", "encoders")
    assert done.returncode == 0, done.stderr
    assert {pid: _cgroups(pid) for pid in pids} == before
    assert not any(os.path.exists(d) for d in groups.values())
    assert _seedance(env, "quota", "list", "--json").stdout.strip() == "[]"


def test_burst_raises_the_share_while_pressure_is_low(env, burners, tmp_path):
    pids = burners(2)
    policy = tmp_path / "p.yaml"
    # The highest threshold (100) bursts while pressure is below 95 (the hysteresis band).
    # The host-wide cpu "some" pressure (what a v1 host offers) can itself sit above that
    # on a host busy with other work (88-97 was seen under load 8 on two cores): then the
    # precondition cannot be set up here, which is not a verdict on the controller.
    host = _host_cpu_pressure()
    if host is not None and host >= 70:
        pytest.skip(f"host CPU pressure some avg10 is {host:.0f}%: too busy to set up 'pressure is low'")
    policy.write_text(_policy("encoders", "500m", burst="1500m", below=100))
    done = _seedance(env, "quota", "apply", str(policy), "--json")
    assert done.returncode == 0, done.stderr
    events = [e["event"] for e in json.loads(done.stdout)["events"]]
    assert events == ["placed", "burst"], events
    _outweigh_contention(_groups(env))
    time.sleep(0.5)
    bursting = _share(pids)
    assert bursting > 0.8, f"bursting to 1500m, 2 burners used only {bursting:.2f} cores"
    listing = json.loads(_seedance(env, "quota", "list", "--json").stdout)
    member = listing[0]["workloads"][0]
    assert member["bursting"] and member["limits"].get("cpu.cfs_quota_us", member["limits"].get("cpu.max", "")).split()[0] == "150000"


def test_bad_policy_applies_nothing(env, burners, tmp_path):
    pids = burners(1)
    before = _cgroups(pids[0])
    policy = tmp_path / "p.yaml"
    policy.write_text(_policy("encoders", "500m").replace('memory: "256Mi"', 'memory: "lots"'))
    done = _seedance(env, "quota", "apply", str(policy))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "spec.quota.memory" in done.stderr and "Traceback" not in done.stderr
    assert _cgroups(pids[0]) == before
    assert not (tmp_path / "cfg" / "seedance" / "quota" / "encoders.yaml").exists()


def test_ended_workload_is_released_and_its_cgroup_removed(env, burners, tmp_path):
    pids = burners(1)
    policy = tmp_path / "p.yaml"
    policy.write_text(_policy("encoders", "500m"))
    assert _seedance(env, "quota", "apply", str(policy)).returncode == 0
    groups = json.loads(_seedance(env, "quota", "list", "--json").stdout)[0]["workloads"][0]["groups"]
    assert all(os.path.isdir(d) for d in groups.values())
    shell = int(open(f"/proc/{pids[0]}/stat").read().rsplit(")", 1)[1].split()[1])
    os.killpg(shell, 9)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{shell}") and time.monotonic() < deadline:
        time.sleep(0.05)  # the fixture's Popen reaps the shell; its children go to init
    done = _seedance(env, "quota", "watch", "--duration", "0.5", "--json")
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["event"] for line in done.stdout.splitlines()] == ["released"]
    assert not any(os.path.exists(d) for d in groups.values())


def test_hysteresis_with_a_scripted_pressure(env, burners, tmp_path):
    """The controller's decisions on a scripted pressure series (threshold 20, band 5)."""
    from seedance.quota.controller import QuotaController, QuotaStore

    pids = burners(1)
    store = QuotaStore(tmp_path / "cfg" / "seedance" / "quota", tmp_path / "state" / "seedance" / "quota")
    from seedance.quota.controller import load_policy_text
    text = _policy("encoders", "500m", burst="1500m", below=20)
    store.save_policy(load_policy_text(text, "p"), text)
    series = iter([17.0, 14.0, 16.0, 19.9, 20.0, 17.0, 14.9])
    current = {}

    def read(resource):
        return {"some": {"avg10": current["v"]}, "full": {"avg10": 0.0}}

    controller = QuotaController(store, read_pressure=read)
    seen = []
    for value in series:
        current["v"] = value
        seen.append([e["event"] for e in controller.tick() if e["event"] != "placed"])
    # 17: inside the band, stays at quota; 14 < 15: burst; 16, 19.9: keep bursting; 20: lower;
    # 17: inside the band, stays lowered; 14.9: burst again
    assert seen == [[], ["burst"], [], [], ["unburst"], [], ["burst"]]
    controller.remove("encoders")
    assert os.path.exists(f"/proc/{pids[0]}")


def test_seedance_run_label_is_limited_from_the_start(env, tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text(_policy("encoders", "500m"))
    assert _seedance(env, "quota", "apply", str(policy)).returncode == 0
    # the program reports its own cgroup and then burns CPU for 3 s, measuring itself
    program = ("import os, time\n"
               "print(open('/proc/self/cgroup').read(), flush=True)\n"
               "start = time.monotonic(); cpu = time.process_time()\n"
               "while time.monotonic() - start < 3: pass\n"
               "print('share', (time.process_time() - cpu) / (time.monotonic() - start))\n")
    done = subprocess.run([sys.executable, "-m", "seedance", "run", "--label", "app=encoder", "--",
                           sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    cpu_line = next(line for line in done.stdout.splitlines() if ":cpu:" in line or ":cpu," in line)
    assert "seedance-encoders-run" in cpu_line
    share = float(done.stdout.rsplit("share", 1)[1])
    assert share <= 0.6, f"a 500m workload used {share:.2f} of a core"
    # the run left no cgroup and no workload behind
    state = json.loads((tmp_path / "state" / "seedance" / "quota" / "state.json").read_text())
    assert state["workloads"] == {}
    from seedance.quota.cgroups import _mounts
    v1, v2 = _mounts()
    relative = cpu_line.split(":", 2)[2].lstrip("/")
    mount = v1.get("cpu") if ":cpu" in cpu_line else v2
    assert not os.path.exists(os.path.join(mount, relative)), "the run's cgroup was left behind"


def test_the_agent_places_workloads_as_they_come_and_go(tmp_path, burners):
    import urllib.request

    from tests.integration.test_agent_lifecycle import RunningAgent

    agent_root = tmp_path / "a"
    agent_root.mkdir()
    agent = RunningAgent(agent_root).start()
    try:
        policy = tmp_path / "p.yaml"
        policy.write_text(_policy("encoders", "500m"))
        done = _seedance(agent.env, "quota", "apply", str(policy))
        assert done.returncode == 0, done.stderr
        pids = burners(1)  # started after the policy: only the agent's loop can place it
        deadline = time.monotonic() + 30
        while "seedance-encoders-" not in _cgroups(pids[0]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "seedance-encoders-" in _cgroups(pids[0]), agent.log_text()
        # the agent moves the pids inside its quota pass and logs the event after the pass
        # (state saved): the move can be seen before the line is written
        while not any(e.get("event") == "quota-placed" for e in agent.events()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert any(e.get("event") == "quota-placed" for e in agent.events()), agent.log_text()
        status = agent.status()
        body = urllib.request.urlopen(f"http://{status['agent']['metrics']}/metrics", timeout=5).read().decode()
        assert "seedance_quota_placed_total 1.0" in body
        shell = int(open(f"/proc/{pids[0]}/stat").read().rsplit(")", 1)[1].split()[1])
        os.killpg(shell, 9)
        deadline = time.monotonic() + 30
        while not any(e.get("event") == "quota-released" for e in agent.events()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert any(e.get("event") == "quota-released" for e in agent.events()), agent.log_text()
    finally:
        agent.close()
        _seedance(agent.env, "quota", "remove", "encoders")


def test_plugin_manifest_labels_label_the_workload(env):
    from tests.conftest import ROOT
    plugin = ROOT / "examples" / "plugins" / "feature-extractor-v1.1.0"
    done = subprocess.run([sys.executable, "-m", "seedance", "run", "--plugin", str(plugin), "--label", "tier=gold",
                           "--", sys.executable, "-c", "import os; print(os.environ['SEEDANCE_LABELS'])"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # the manifest says labels: {app: feature-extractor}; --label adds tier=gold
    assert done.stdout.strip() == "app=feature-extractor,tier=gold"
