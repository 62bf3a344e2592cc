"""Launch attribution and power sources (issue 14): known answers computed by hand."""
from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime

import pytest

from seedance.judge.engine import load_rules
from seedance.model.errors import BadInput
from seedance.profile import launches as lp
from seedance.profile import power


def _launch(t, lib):
    return {"t": t, "ev": "launch", "api": "cuLaunchKernel", "result": 0, "library": lib}


def _trace():
    """libA: 5 launches 10 us apart from t=1.0; libB: 3 launches 100 ms apart from t=1.2."""
    records = [{"kind": "start", "t": 0.0, "wall": 1000.0}]
    records += [_launch(1.0 + i * 10e-6, "/x/libA.so") for i in range(5)]
    records += [_launch(1.2 + i * 0.1, "/x/libB.so") for i in range(3)]
    return records


def test_per_library_figures_by_hand():
    launches, offset = lp.launch_events(_trace())
    assert offset == 1000.0 and len(launches) == 8
    profile = lp.profile_launches(launches, bin_s=0.01, owners=[])
    by = {lib.library: lib for lib in profile.libraries}
    a, b = by["/x/libA.so"], by["/x/libB.so"]
    assert a.launches == 5 and b.launches == 3
    assert a.interval_us["p50"] == pytest.approx(10.0, rel=1e-6)
    assert b.interval_us["p50"] == pytest.approx(100000.0, rel=1e-6)
    assert a.launches_per_s == pytest.approx(4 / 40e-6, rel=1e-6)
    assert b.launches_per_s == pytest.approx(2 / 0.2, rel=1e-6)
    # span 1.0 .. 1.4 s in 10 ms bins: 41 bins; A fills 1, B fills 3
    assert a.coverage == pytest.approx(1 / 41) and b.coverage == pytest.approx(3 / 41)
    assert sum(h["count"] for h in a.histogram) == 4


def test_launch_bound_fires_for_the_storm_only():
    launches, _ = lp.launch_events(_trace())
    profile = lp.profile_launches(launches, owners=[])
    findings = load_rules().evaluate(lp.launch_facts(profile, {"trace": "t"}))
    bound = [f for f in findings if f.rule == "launch-bound"]
    assert [f.evidence["library"] for f in bound] == ["/x/libA.so"]
    assert not any(f.rule == "sm-underused" for f in findings)   # nothing observed: not judged


def test_energy_split_steps_by_hand():
    launches, offset = lp.launch_events(_trace())
    # wall = monotonic + 1000.  300 W from 1000.99 to 1001.01 (A's burst), 100 W from
    # 1001.01 to 1001.5 (B's three launches), then the last sample ends the log.
    log = power.PowerLog(source="fixture", samples=[power.PowerSample(1000.99, 300.0),
                                                    power.PowerSample(1001.01, 100.0),
                                                    power.PowerSample(1001.5, 50.0)])
    profile = lp.profile_launches(launches, power=log, offset=offset, owners=[])
    by = {lib.library: lib for lib in profile.libraries}
    assert by["/x/libA.so"].energy_j == pytest.approx(300 * 0.02)
    assert by["/x/libB.so"].energy_j == pytest.approx(100 * 0.49)
    assert profile.idle_energy_j == pytest.approx(0.0, abs=1e-9)
    assert by["/x/libA.so"].energy_share == pytest.approx(6.0 / (6.0 + 49.0))


def test_a_step_shared_by_launch_count_and_idle_steps():
    records = [{"kind": "start", "t": 0.0, "wall": 0.0}, _launch(1.0, "a"), _launch(1.1, "a"), _launch(1.2, "b"),
               _launch(3.5, "b")]
    launches, offset = lp.launch_events(records)
    log = power.PowerLog(source="f", samples=[power.PowerSample(0.5, 90.0), power.PowerSample(2.0, 10.0),
                                              power.PowerSample(3.0, 40.0), power.PowerSample(4.0, 0.0)])
    profile = lp.profile_launches(launches, power=log, offset=offset, owners=[])
    by = {lib.library: lib for lib in profile.libraries}
    # step [0.5, 2): 135 J, launches a, a, b -> a 90, b 45; [2, 3): 10 J idle; [3, 4): 40 J -> b
    assert by["a"].energy_j == pytest.approx(90.0)
    assert by["b"].energy_j == pytest.approx(85.0)
    assert profile.idle_energy_j == pytest.approx(10.0) and profile.energy_j == pytest.approx(185.0)


def test_energy_counter_preferred_over_power():
    records = [{"kind": "start", "t": 0.0, "wall": 0.0}, _launch(1.0, "a")]
    launches, offset = lp.launch_events(records)
    log = power.PowerLog(source="nvml", samples=[power.PowerSample(0.5, 100.0, 1000.0),
                                                 power.PowerSample(1.5, 100.0, 1042.5)])
    profile = lp.profile_launches(launches, power=log, offset=offset, owners=[])
    assert profile.libraries[0].energy_j == pytest.approx(42.5)


def test_no_anchor_says_power_not_aligned():
    launches, offset = lp.launch_events([_launch(1.0, "a"), _launch(2.0, "a")])
    log = power.PowerLog(source="f", samples=[power.PowerSample(0.0, 1.0), power.PowerSample(3.0, 1.0)])
    profile = lp.profile_launches(launches, power=log, offset=offset, owners=[])
    assert offset is None and profile.energy_j is None and "no clock anchor" in profile.power_note


def test_plugin_owns_library():
    launches, _ = lp.launch_events([_launch(1.0, "/plugins/fx/1.0/lib/libfx.so"), _launch(1.5, "/usr/lib/libz.so")])
    profile = lp.profile_launches(launches, owners=[("/plugins/fx/1.0/", "fx 1.0")])
    assert {lib.library: lib.plugin for lib in profile.libraries} == \
        {"/plugins/fx/1.0/lib/libfx.so": "fx 1.0", "/usr/lib/libz.so": None}


def _local(text):
    return datetime.strptime(text, "%Y/%m/%d %H:%M:%S.%f").timestamp()


def test_nvidia_smi_csv():
    text = ("timestamp, index, power.draw [W], utilization.gpu [%]\n"
            "2026/11/30 14:00:00.000, 0, 250.50 W, 97 %\n"
            "2026/11/30 14:00:00.000, 1, 70.00 W, 0 %\n"
            "2026/11/30 14:00:00.100, 0, [N/A], 90 %\n"
            "2026/11/30 14:00:00.200, 0, 120.25 W, 40 %\n")
    log = power.read_nvidia_smi_csv(text, 0)
    assert [(s.t, s.watts) for s in log.samples] == [(_local("2026/11/30 14:00:00.000"), 250.5),
                                                     (_local("2026/11/30 14:00:00.200"), 120.25)]
    assert [u for _, u in log.utilization] == [0.97, 0.9, 0.4]
    assert not log.sm_active and "utilization.gpu" in log.why_no_sm
    assert [s.watts for s in power.read_nvidia_smi_csv(text, 1).samples] == [70.0]


@pytest.mark.parametrize("text", ["0, 100 W\n", "timestamp, index, power.draw [W]\nyesterday, 0, 1 W\n",
                                  "timestamp, index, power.draw [W]\n"])
def test_nvidia_smi_csv_bad(text):
    with pytest.raises(BadInput):
        power.read_nvidia_smi_csv(text, 0)


def test_dcgm_scrapes_and_sm_underused():
    text = ("# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).\n# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n"
            "# TIME 1000.0\n"
            'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-1",modelName="NVIDIA H200"} 300.0\n'
            'DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-2"} 99.0\n'
            'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-1"} 0.2\n'
            "# TIME 1001.0\n"
            'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-1"} 100.0\n'
            'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-1"} 0.3 1001500\n')
    log = power.read_dcgm_scrapes(text, 0)
    assert [(s.t, s.watts) for s in log.samples] == [(1000.0, 300.0), (1001.0, 100.0)]
    assert log.sm_active == [(1000.0, 0.2), (1001.5, 0.3)]
    launches, offset = lp.launch_events([{"kind": "start", "t": 0.0, "wall": 1000.0}, _launch(0.5, "a")])
    profile = lp.profile_launches(launches, power=log, offset=offset, owners=[])
    assert profile.sm_active == pytest.approx(0.25)
    findings = load_rules().evaluate(lp.launch_facts(profile, {}))
    assert [f.rule for f in findings] == ["sm-underused"]
    busy = power.read_dcgm_scrapes(text.replace(" 0.2\n", " 0.9\n"), 0)
    assert lp.profile_launches(launches, power=busy, offset=offset, owners=[]).sm_active == pytest.approx(0.6)
    assert not load_rules().evaluate(lp.launch_facts(lp.profile_launches(launches, power=busy, offset=offset,
                                                                          owners=[]), {}))


@pytest.mark.parametrize("text", ['DCGM_FI_DEV_POWER_USAGE{gpu="0"} 1.0\n', "not prometheus at all {\n",
                                  "# TIME x\n"])
def test_dcgm_bad(text):
    with pytest.raises(BadInput):
        power.read_dcgm_scrapes(text, 0)


def test_cli_from_trace_bad_input_one_line(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"t": "soon", "ev": "launch", "library": "a"}) + "\n")
    p = subprocess.run([sys.executable, "-m", "seedance", "profile", "launches", "--from-trace", str(trace)],
                       capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.startswith("seedance: error:") and len(p.stderr.splitlines()) == 1


def test_cli_from_trace_report(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in _trace()))
    csv = tmp_path / "smi.csv"
    stamp = lambda wall: datetime.fromtimestamp(wall).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]  # noqa: E731
    csv.write_text("timestamp, index, power.draw [W], utilization.gpu [%]\n"
                   f"{stamp(1000.99)}, 0, 300.00 W, 90 %\n{stamp(1001.01)}, 0, 100.00 W, 10 %\n"
                   f"{stamp(1001.5)}, 0, 50.00 W, 0 %\n")
    p = subprocess.run([sys.executable, "-m", "seedance", "profile", "launches", "--from-trace", str(trace),
                        "--power-csv", str(csv), "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    section = report["profile"]["launches"]
    energy = {lib["library"]: lib["energy_j"] for lib in section["libraries"]}
    assert energy["/x/libA.so"] == pytest.approx(6.0, rel=1e-3) and energy["/x/libB.so"] == pytest.approx(49.0, rel=1e-3)
    assert section["sm_activity"]["observed"] is False and "not observed" in section["sm_activity"]["note"]
    assert [f["rule"] for f in report["findings"]] == ["launch-bound"]
