"""The live affinity trap: NVML-shaped samples -> plugin_affinity facts -> the real rule engine."""
import ctypes
import os
import subprocess
import sys

import pytest

from seedance.judge.engine import load_rules
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


def _nvml_oracle():
    """This host's NVML through its C API (ctypes), independent of pynvml and seedance:
    ({index: (name, memory total)}, None) when it initialises, (None, why) when it does not."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as exc:
        return None, f"no libnvidia-ml.so.1: {exc}"
    rc = lib.nvmlInit_v2()
    if rc != 0:  # NVML_SUCCESS
        return None, f"nvmlInit_v2 returned {rc}"

    class Memory(ctypes.Structure):  # nvmlMemory_t (nvml.h): total, free, used
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    try:
        count = ctypes.c_uint()
        assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0
        devices = {}
        for index in range(count.value):
            handle = ctypes.c_void_p()
            assert lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == 0
            name = ctypes.create_string_buffer(96)
            assert lib.nvmlDeviceGetName(handle, name, 96) == 0
            memory = Memory()
            assert lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) == 0
            devices[index] = (name.value.decode(), memory.total)
        return devices, None
    finally:
        lib.nvmlShutdown()


def test_sampler_reports_what_this_hosts_nvml_says():
    devices, why = _nvml_oracle()
    sampler = NvmlSampler()
    started = sampler.start()
    try:
        if devices is None:
            assert not started, f"the sampler started, but NVML does not initialise here: {why}"
            assert sampler.sample() == []
            assert sampler.reason.startswith("NVML unavailable: ")
            if why.startswith("no libnvidia-ml"):
                assert "Not Found" in sampler.reason  # pynvml's NVMLError_LibraryNotFound, said as such
        else:
            assert started, sampler.reason
            samples = sampler.sample()
            assert {s.index: (s.name, s.memory_total) for s in samples} == devices
    finally:
        sampler.stop()
