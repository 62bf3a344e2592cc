"""The check's helper process (collect/helper.py): its answers are the inline ones, and a
helper that cannot answer (no fork, dead, an answer that does not pickle) loses no job.

The last test runs a check of the venv's torch (its ~120 test programs and libraries) and of
two extensions built here, with the helper and with SEEDANCE_JOBS=1, and compares every fact
and error in order."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess

import pytest

from seedance.collect import helper as helper_mod
from seedance.collect.helper import Helper
from seedance.collect.scan import CheckOptions, Scanner
from tests.conftest import seedance_jobs

PARENT = os.getpid()
_COLLECT = Helper._collect


def _jobs():
    # an object twice in one job (as a closure's path among torch's libraries): the pickle
    # refers to its memo for the second; one Unpickler over many pickles misreads that
    paths = [f"/x/{index}" for index in range(40)]
    return [(index, (path, "libc10.so"), path) for index, path in enumerate(paths)]


def _work(job):
    index, names, path = job
    return {"index": index, "names": list(names), "path": path, "same": names[0] == path}


def _run_all(helper, jobs):
    tickets = [helper.submit(job) for job in jobs]
    results = helper.finish()
    return [results[t] for t in tickets]


def test_helper_answers_each_job_as_inline():
    answered_in = []

    def work(job):
        answered_in.append(os.getpid())
        return _work(job)

    helper = Helper(work)
    assert helper.start()
    got = _run_all(helper, _jobs())
    assert got == [_work(job) for job in _jobs()]
    # every job was answered by the helper: none ran here
    assert answered_in == []
    assert not helper.running


def test_helper_warms_before_its_jobs():
    seen = []

    def work(job):
        return (job, tuple(seen))

    helper = Helper(work, warm=lambda: seen.append("warm"))
    helper.start()
    assert _run_all(helper, [1, 2]) == [(1, ("warm",)), (2, ("warm",))]
    assert seen == []  # warmed in the helper only


def test_a_helper_that_dies_loses_no_job():
    def work(job):
        if os.getpid() != PARENT and job[0] == 17:
            os._exit(3)  # the helper dies in the middle of its jobs
        return _work(job)

    helper = Helper(work)
    assert helper.start()
    assert _run_all(helper, _jobs()) == [_work(job) for job in _jobs()]
    assert not helper.running


def test_no_fork_runs_every_job_inline(monkeypatch):
    def refuse():
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", refuse)
    helper = Helper(_work)
    assert helper.start() is False
    assert _run_all(helper, _jobs()) == [_work(job) for job in _jobs()]


def test_an_answer_that_does_not_pickle_is_computed_here():
    def work(job):
        if os.getpid() != PARENT:
            return lambda: job  # a lambda does not pickle
        return job * 2

    helper = Helper(work)
    helper.start()
    assert _run_all(helper, [1, 2, 3]) == [2, 4, 6]


def test_a_job_that_fails_fails_here_as_inline():
    def work(job):
        if job == 2:
            raise ValueError("bad job")
        return job

    helper = Helper(work)
    helper.start()
    helper.submit(1)
    helper.submit(2)
    with pytest.raises(ValueError, match="bad job"):
        helper.finish()


def test_jobs_setting_and_cores(monkeypatch):
    monkeypatch.setenv("SEEDANCE_JOBS", "1")
    assert not helper_mod.wanted(1000, 64)
    monkeypatch.delenv("SEEDANCE_JOBS")
    monkeypatch.setattr(helper_mod, "cores", lambda: 1)
    assert not helper_mod.wanted(1000, 64)
    monkeypatch.setattr(helper_mod, "cores", lambda: 2)
    assert helper_mod.wanted(64, 64) and not helper_mod.wanted(63, 64)


# --- a whole check, with and without the helper ------------------------------------------

EXT = """\
extern "C" void present(void) __asm__("PRESENT");
extern "C" void absent(void) __asm__("_ZN3c1019seedance_not_in_c10Ev");
extern "C" void probe(void) { present(); absent(); }
"""


def _nm_c10_function(torch_dir) -> str:
    proc = subprocess.run(["nm", "-D", "--defined-only", os.path.join(torch_dir, "lib", "libc10.so")],
                          capture_output=True, check=True)
    for line in proc.stdout.decode("utf-8", "replace").splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1] == "T" and fields[2].startswith("_ZN3c10"):
            return fields[2]
    pytest.skip("nm lists no c10 function")


def _facts(targets, monkeypatch, jobs):
    seedance_jobs(monkeypatch, jobs)
    answered = []

    def counting(self):
        answers = _COLLECT(self)
        answered.append(len(answers))
        return answers

    monkeypatch.setattr(Helper, "_collect", counting)
    scanner = Scanner(CheckOptions(targets=targets, env={}))
    scanner.run()
    facts = [(f.kind, dict(f.subject), repr(f.data), f.source) for f in scanner.facts]
    return facts, list(scanner.errors), dict(scanner.stats), answered


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("nm") is None, reason="needs g++ and nm")
def test_check_with_the_helper_equals_the_check_without(torch_dir, tmp_path, monkeypatch):
    lib = os.path.join(torch_dir, "lib")
    present = _nm_c10_function(torch_dir)
    ext_dir = tmp_path / "ext"
    ext_dir.mkdir()
    for name, flags in (("good_ext.so", []), ("old_abi_ext.so", ["-D_GLIBCXX_USE_CXX11_ABI=0"])):
        source = tmp_path / (name + ".cpp")
        source.write_text(EXT.replace("PRESENT", present))
        subprocess.run(["g++", "-shared", "-fPIC", *flags, "-o", str(ext_dir / name), str(source),
                        f"-L{lib}", "-lc10", f"-Wl,-rpath,{lib}"], check=True, capture_output=True)
    targets = [str(ext_dir), torch_dir]
    alone = _facts(targets, monkeypatch, "1")
    helped = _facts(targets, monkeypatch, None)
    assert alone[3] == []  # no helper with SEEDANCE_JOBS=1
    assert helped[3] and helped[3][0] > 0, "the helper answered no job"
    kinds = [fact[0] for fact in alone[0]]
    assert "torch_symbols" in kinds and "cxx_abi" in kinds
    assert helped[:3] == alone[:3]


# --- share(): one queue, two processes ----------------------------------------------------

def _slow_here(item):
    import time

    # every item takes a while in either process: neither drains the queue before the
    # other starts, however busy the machine is
    time.sleep(0.005)
    return (item, item * item, os.getpid())


def test_share_gives_every_result_in_order_and_both_take_items(monkeypatch):
    monkeypatch.delenv("SEEDANCE_JOBS", raising=False)
    if helper_mod.cores() < 2:
        pytest.skip("one core: nothing is shared")
    items = list(range(60))
    results = helper_mod.share(items, _slow_here, 8)
    assert [r[:2] for r in results] == [(i, i * i) for i in items]
    assert len({r[2] for r in results}) == 2, "the helper took no item"


def test_share_below_the_minimum_or_with_jobs_1_forks_nothing(monkeypatch):
    def no_fork():
        raise AssertionError("forked")

    monkeypatch.setattr(os, "fork", no_fork)
    assert helper_mod.share([1, 2, 3], lambda x: -x, 8) == [-1, -2, -3]
    monkeypatch.setenv("SEEDANCE_JOBS", "1")
    assert helper_mod.share(list(range(20)), lambda x: -x, 8) == [-x for x in range(20)]
    monkeypatch.delenv("SEEDANCE_JOBS")
    many = list(range(helper_mod.MAX_SHARED + 1))  # more than the queue pipe holds
    assert helper_mod.share(many, lambda x: x, 8) == many


def test_share_survives_a_helper_that_dies_and_a_failed_fork(monkeypatch):
    monkeypatch.delenv("SEEDANCE_JOBS", raising=False)
    if helper_mod.cores() < 2:
        pytest.skip("one core: nothing is shared")

    def dies(item):
        if os.getpid() != PARENT:
            os._exit(5)
        return _slow_here(item)

    assert [r[:2] for r in helper_mod.share(list(range(30)), dies, 8)] == [(i, i * i) for i in range(30)]

    def refuse():
        raise OSError(errno.EAGAIN, "no more processes")

    monkeypatch.setattr(os, "fork", refuse)
    assert [r[:2] for r in helper_mod.share(list(range(30)), _slow_here, 8)] == [(i, i * i) for i in range(30)]


def test_share_raises_what_an_item_raises(monkeypatch):
    monkeypatch.delenv("SEEDANCE_JOBS", raising=False)

    def fails(item):
        if item == 7:
            raise KeyError("item 7")
        return _slow_here(item)

    with pytest.raises(KeyError):
        helper_mod.share(list(range(30)), fails, 8)
    with pytest.raises(ChildProcessError):  # the helper was reaped
        os.waitpid(-1, os.WNOHANG)


def test_abandon_kills_the_helper_without_waiting_for_its_jobs(tmp_path):
    marker = tmp_path / "job-finished"

    def slow(job):
        import time

        time.sleep(30)
        marker.write_text("the helper ran its job to the end\n")
        return job

    helper = Helper(slow)
    assert helper.start()
    pid = helper._pid
    helper.submit(1)
    helper.abandon()
    assert not helper.running and not marker.exists()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # killed and reaped


def test_a_failing_root_loop_abandons_the_abi_helper(monkeypatch, torch_dir, tmp_path):
    """An error (or Ctrl-C) in the root loop propagates at once: the helper is killed and
    no ABI job is run again here."""
    from seedance.collect import scan

    started, inline = [], []
    start, root = Helper.start, scan.Scanner._root

    def recording_start(self):
        started.append(self)
        return start(self)

    calls = []

    def failing_root(self, path):
        calls.append(path)
        if len(calls) == 40:
            raise KeyboardInterrupt
        return root(self, path)

    job = scan.Scanner._cxx_abi_job
    marker = tmp_path / "helper-job-finished"

    def counting_job(self, item):
        if os.getpid() == PARENT:
            inline.append(item)
        elif not marker.exists():  # the helper's first job takes long: waiting for it shows
            import time

            time.sleep(20)
            marker.write_text("a job ran to its end\n")
        return job(self, item)

    monkeypatch.delenv("SEEDANCE_JOBS", raising=False)
    monkeypatch.setattr(helper_mod, "cores", lambda: 2)
    monkeypatch.setattr(Helper, "start", recording_start)
    monkeypatch.setattr(scan.Scanner, "_root", failing_root)
    monkeypatch.setattr(scan.Scanner, "_cxx_abi_job", counting_job)
    submitted = []
    submit = Helper.submit
    monkeypatch.setattr(Helper, "submit", lambda self, item: submitted.append(item) or submit(self, item))
    scanner = Scanner(CheckOptions(targets=[torch_dir], env={}))
    with pytest.raises(KeyboardInterrupt):
        scanner.run()
    assert started and not started[0].running
    assert submitted, "no ABI job before the failure"
    assert inline == [] and not marker.exists()
