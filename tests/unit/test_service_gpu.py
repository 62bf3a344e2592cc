"""The live affinity trap: NVML-shaped samples -> plugin_affinity facts -> the real rule engine."""
import os
import subprocess
import sys

import pytest

from seedance.engine import load_rules
from seedance.service.gpu import DeviceSample, GpuProcess, NvmlSampler, affinity_facts, process_affinity

JOB, STRAY = 1001, 1002


def host(util0=0.95, other_util=0.02, procs0=((JOB, 30 << 30), (STRAY, 2 << 30)), other_procs=()):
    return [DeviceSample(0, "GPU-0", "H200", util0, 32 << 30, 141 << 30, 600.0,
                         tuple(GpuProcess(p, m) for p, m in procs0)),
            DeviceSample(1, "GPU-1", "H200", other_util, 0, 141 << 30, 70.0,
                         tuple(GpuProcess(p, 1 << 30) for p in other_procs))]


def no_affinity(pid):
    return False


@pytest.fixture(scope="module")
def rules():
    rules = load_rules()
    if "affinity-unset" not in rules.by_id:
        pytest.skip("rules/plugins.yaml (affinity-unset) not present")
    return rules


def test_stray_process_on_busy_device0_raises_affinity_unset(rules):
    facts = affinity_facts(host(), affinity=no_affinity)
    assert [f.subject["pid"] for f in facts] == [STRAY]  # the job that owns device 0 is not blamed
    findings = rules.evaluate(facts)
    assert [f.rule for f in findings] == ["affinity-unset"]
    assert findings[0].trap == "affinity-unset"
    assert findings[0].evidence["metric_value"]["idle_devices"] == [1]
    assert findings[0].evidence["metric_value"]["job_pid"] == JOB


@pytest.mark.parametrize("samples", [
    host(other_util=0.9),                      # the other device is busy: no idle accelerator
    host(other_procs=(2000,)),                 # the other device has a process on it
    host(procs0=((JOB, 30 << 30),)),           # device 0 holds only its own job
    host()[:1],                                # a single-device host
])
def test_no_trap_without_all_of_its_conditions(samples):
    assert affinity_facts(samples, affinity=no_affinity) == []


def test_processes_that_chose_a_device_or_are_unreadable_are_not_judged():
    assert affinity_facts(host(), affinity=lambda pid: True) == []
    assert affinity_facts(host(), affinity=lambda pid: None) == []


def test_process_affinity_reads_the_real_environment():
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    code = "import time; print('ready', flush=True); time.sleep(30)"
    plain = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    chosen = subprocess.Popen([sys.executable, "-c", code], env={**env, "CUDA_VISIBLE_DEVICES": "1"},
                              stdout=subprocess.PIPE, text=True)
    try:
        # until exec, /proc/PID/environ is still the parent's: wait for the child to speak
        assert plain.stdout.readline() == "ready\n" and chosen.stdout.readline() == "ready\n"
        assert process_affinity(plain.pid) is False
        assert process_affinity(chosen.pid) is True
        assert process_affinity(plain.pid, shim_remapped={plain.pid}) is True
        assert process_affinity(2 ** 22 + 12345) is None  # no such process
    finally:
        plain.kill()
        chosen.kill()
        plain.wait()
        chosen.wait()


def test_sampler_without_nvml_says_why():
    sampler = NvmlSampler()
    started = sampler.start()
    if started:  # a GPU host: the samples must be real devices
        try:
            assert all(s.memory_total for s in sampler.sample())
        finally:
            sampler.stop()
    else:
        assert "NVML" in sampler.reason or "pynvml" in sampler.reason
        assert sampler.sample() == []
