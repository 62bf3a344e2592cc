"""The bench's noise handling (issue 16): a bench on a machine too busy to judge says so
("inconclusive: machine too noisy", exit 3) instead of a bare FAIL; it pins itself and
restores its CPU mask; the run-queue wait it reports is the kernel's, measured under real
contention from busy child processes."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from seedance.plugins import bench


def _handler(batch):
    # real work proportional to the batch, as the example plugins' bench callables do
    total = 0
    for item in batch:
        for k in range(2000):
            total += (item * k) & 7
    return [total] * len(batch)


@pytest.fixture
def contention():
    """Twice as many busy processes as CPUs: our threads must queue for a CPU."""
    count = 2 * (os.cpu_count() or 1)
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    time.sleep(0.5)
    yield
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()


def test_runqueue_wait_is_measured_under_contention(contention):
    config = bench.BenchConfig(warmup=0, rounds=2, extra_attempts=0)
    phase = bench.judged_phase(_handler, "adaptive", 8, 5.0, 200.0, 60, config)
    # the kernel's schedstat says our threads waited for a CPU while the hogs ran
    assert phase["max_runqueue_share"] > bench.NOISY_RUNQUEUE_SHARE
    assert bench.is_noisy(phase)
    # a noisy machine never yields a bare fail
    assert phase["verdict"] in (bench.VERDICT_PASS, bench.VERDICT_NOISY)
    assert phase["verdict"] == (bench.VERDICT_PASS if phase["pass"] else bench.VERDICT_NOISY)


def test_failing_phase_is_retried_and_the_steadiest_attempt_kept(contention):
    config = bench.BenchConfig(warmup=0, rounds=3, extra_attempts=1)

    import random
    chance = random.Random(16)

    def jittery(batch):
        # a rare 60 ms stall: some rounds see one and some do not, so P99 swings between
        # rounds far beyond 8% (every round seeing one with p < 0.1 per round)
        time.sleep(0.06 if chance.random() < 0.05 else 0.0005)
        return list(batch)

    phase = bench.judged_phase(jittery, "adaptive", 4, 2.0, 100.0, 30, config)
    if phase["pass"]:
        pytest.skip("the jittery handler happened to be steady in every round")
    assert phase["attempts"] == 2
    assert phase["verdict"] == bench.VERDICT_NOISY


def test_idlest_cpu_is_allowed_and_pinning_is_undone(tmp_path):
    allowed = os.sched_getaffinity(0)
    assert bench.idlest_cpu(0.05) in allowed
    from seedance.plugins.manifest import load_manifest
    manifest_path = tmp_path / "manifest.yaml"
    manifest_path.write_text("name: tiny\nversion: 1.0.0\nseedance_version: '>=0.1,<1'\n"
                             "entry:\n  module: tiny\nbatch_policy:\n  policy: adaptive\n  max_batch_size: 4\n"
                             "  max_wait_ms: 2\n")
    manifest = load_manifest(manifest_path)
    result = bench.run_bench(manifest, bench.BenchConfig(warmup=0, rounds=2, low_requests=5, high_requests=10,
                                                          high_rate=500.0, extra_attempts=0), handler=_handler)
    assert result["machine"]["pinned_cpu"] in allowed
    assert os.sched_getaffinity(0) == allowed
    assert result["verdict"] in (bench.VERDICT_PASS, bench.VERDICT_FAIL, bench.VERDICT_NOISY)
    assert (result["verdict"] == bench.VERDICT_PASS) == result["pass"]
