"""The shim against the fake driver: affinity, quotas, the three ways to reach the
driver, threads, fork, SIGKILL, audit, and the safety rules of `seedance run`.

Allocations are checked from the driver's side through the fake driver's ledger.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shimhelpers import parse_lines, seedance_run

VIAS = [("linked", "direct"), ("linked", "procaddr"), ("dlsym", "dlsym")]


def steps(built, binary, via, *rest):
    return ["--", str(built[binary]), "--via", via, *rest]


@pytest.mark.parametrize("binary,via", VIAS)
def test_affinity_gpu1_lands_on_physical_1(built, env, ledger, binary, via, tmp_path, front):
    report = tmp_path / "r.json"
    p = seedance_run(env, "--affinity", "gpu:1", "--report-json", report,
                     *steps(built, binary, via, "init", "count", "uuid:0", "uuid:1", "ctx:0",
                            "alloc:1000", "managed:3000", "pitch:100", "vmm:0:4096", "free:all"))
    assert p.returncode == 0, p.stderr
    rows = {r["step"] + str(i): r for i, r in enumerate(parse_lines(p.stdout))}
    lines = parse_lines(p.stdout)
    assert lines[1] == {"step": "count", "result": 0, "count": 1}
    assert lines[2]["last"] == 1 and lines[2]["bus"] == "00000000:20:00.0"   # logical 0 is physical 1
    assert lines[3]["result"] == 101                                        # CUDA_ERROR_INVALID_DEVICE
    assert all(r.get("result", 0) == 0 for r in lines[4:9]), rows
    seen = ledger.read()
    assert seen["allocs"][0] == 0 and seen["allocs"][1] == 4      # alloc, managed, pitch, vmm
    assert seen["outstanding"][1] == 0
    data = json.loads(report.read_text())
    assert data["schema"] == "seedance.report/v1"
    assert data["remap"][0]["logical_to_physical"] == {"0": 1}
    assert [d["device"] for d in data["devices"]] == [1]


def test_affinity_by_uuid_prefix_and_hidden_handles(built, env, ledger, front):
    p = seedance_run(env, "--affinity", "GPU-5eedface-0000-4000-8000-000000000001",
                     *steps(built, "linked", "direct", "init", "count", "uuid:0", "pci:00000000:10:00.0",
                            "pci:00000000:20:00.0", "ctxraw:0", "ctx:0", "alloc:64"))
    lines = parse_lines(p.stdout)
    assert lines[1]["count"] == 1 and lines[2]["last"] == 1
    assert lines[3]["result"] == 101            # physical 0 by bus id: not visible
    assert lines[4] == {"step": "pci", "result": 0, "device": 1}
    assert lines[5]["result"] == 101            # a made-up handle of a hidden device
    assert ledger.read()["allocs"][:2] == [0, 1]


def test_affinity_naming_no_device_hides_all(built, env):
    env["SEEDANCE_AFFINITY"] = "MIG-00000000"
    env["LD_PRELOAD"] = str(built["shim"])
    p = subprocess.run([str(built["linked"]), "init", "count"], env=env, capture_output=True, text=True)
    lines = parse_lines(p.stdout)
    assert lines[0]["result"] == 100            # CUDA_ERROR_NO_DEVICE, as for an empty CUDA_VISIBLE_DEVICES
    assert lines[1]["count"] == 0


@pytest.mark.parametrize("binary,via", VIAS)
def test_quota_refuses_on_every_path_and_never_reaches_driver(built, env, ledger, binary, via, tmp_path, front):
    report = tmp_path / "r.json"
    p = seedance_run(env, "--mem-limit", "4096", "--report-json", report,
                     *steps(built, binary, via, "init", "ctx:0", "alloc:1000", "alloc:4000", "meminfo",
                            "totalmem:0", "vmm:0:8192", "vmmhost:8192", "free:all", "alloc:4096", "free:all"))
    assert p.returncode == 0, p.stderr
    lines = parse_lines(p.stdout)
    assert lines[2]["result"] == 0
    assert lines[3]["result"] == 2              # CUDA_ERROR_OUT_OF_MEMORY
    assert lines[4]["total"] == 4096 and lines[4]["free"] == 3096
    assert lines[5]["total"] == 4096
    assert lines[6]["result"] == 2              # VMM on the device counts
    assert lines[7]["result"] == 0              # VMM in host memory does not
    assert lines[9]["result"] == 0              # everything freed: the whole quota is back
    seen = ledger.read()
    assert seen["high_water"][0] <= 4096 and seen["allocs"][0] == 2
    data = json.loads(report.read_text())
    assert data["stats"]["quota_refusals"] == 2
    assert any(f["rule"] == "quota-refused" for f in data["findings"])


def test_procaddr_chooses_by_name_and_version(built, env):
    env["LD_PRELOAD"] = str(built["shim"])
    p = subprocess.run([str(built["linked"]), "gpa:cuMemAlloc:12000:0", "gpa:cuMemAlloc:2000:0",
                        "gpa:cuGetProcAddress:12000:0", "gpa:cuGetProcAddress:11030:0",
                        "gpa:cuCtxCreate:12050:0", "gpa:cuCtxCreate:11040:0",
                        "gpa:cuMemAllocAsync:12000:2", "gpa:cuMemAllocAsync:12000:0",
                        "gpa:cuCtxGetCurrent:12000:0", "gpa:cuNoSuchThing:12000:0", "gpa:cuMemCreate:10000:0"],
                       env=env, capture_output=True, text=True)
    got = [(r["result"], r["status"], r["lib"], r["sym"]) for r in parse_lines(p.stdout)]
    shim = built["shim"].name
    assert got == [
        (0, 0, shim, "cuMemAlloc_v2"),
        (0, 0, "libcuda.so.1", "cuMemAlloc"),          # the 32-bit v1 entry: passed through
        (0, 0, shim, "cuGetProcAddress_v2"),            # asked for itself: itself
        (0, 0, shim, "cuGetProcAddress"),
        (0, 0, shim, "cuCtxCreate_v4"),
        (0, 0, shim, "cuCtxCreate_v3"),
        (0, 0, shim, "cuMemAllocAsync_ptsz"),           # per-thread default stream
        (0, 0, shim, "cuMemAllocAsync"),
        (0, 0, "libcuda.so.1", "cuCtxGetCurrent"),      # not hooked: the driver's own
        (500, 1, "-", "-"),                             # CUDA_ERROR_NOT_FOUND, SYMBOL_NOT_FOUND
        (500, 2, "-", "-"),                             # VERSION_NOT_SUFFICIENT
    ]


def test_threads_and_processes_never_overcommit(built, env, ledger, tmp_path, front):
    report = tmp_path / "r.json"
    limit = 8 << 20
    p = seedance_run(env, "--mem-limit", str(limit), "--follow-children", "--report-json", report,
                     "--", built["linked"], "procs:4:64:10:1048576:12", timeout=120)
    assert p.returncode == 0, p.stderr
    rows = [r for r in parse_lines(p.stdout) if r["step"] == "threads"]
    assert len(rows) == 4 and all(r["other"] == 0 for r in rows)
    # every thread wants 12 MiB at once against an 8 MiB quota: each one is refused sometimes
    assert sum(r["ok"] for r in rows) > 0 and sum(r["oom"] for r in rows) >= 4 * 64 * 10 * 4
    seen = ledger.read()
    assert seen["high_water"][0] <= limit        # the driver never saw more than the quota
    assert seen["outstanding"][0] == 0
    data = json.loads(report.read_text())
    assert data["stats"]["instances"] == 4       # the 4 forked children (the parent made no CUDA call)
    assert data["stats"]["leaked_bytes"] == 0
    # 64 threads a process: 16 count in blocks of their own, the rest in the shared
    # counters; none of the counts may be lost
    granted = sum(r["ok"] for r in rows)
    assert data["calls_by_api"]["cuMemAlloc_v2"] == granted
    assert sum(data["allocations_by_library"].values()) == granted


def test_sigkill_leak_is_reported(built, env, tmp_path, front):
    report = tmp_path / "r.json"
    p = seedance_run(env, "--affinity", "1", "--report-json", report,
                     *steps(built, "linked", "direct", "init", "ctx:0", "alloc:5000", "alloc:3000", "kill"))
    assert p.returncode == 128 + signal.SIGKILL
    data = json.loads(report.read_text())
    leaks = [f for f in data["findings"] if f["rule"] == "handle-leak"]
    assert len(leaks) == 1
    ev = leaks[0]["evidence"]
    assert ev["bytes"] == 8000 and isinstance(ev["bytes"], int)
    assert ev["device"] == 1 and ev["exit"] == "killed" and ev["library"].endswith("sdtest_linked")
    assert "handle-leak" in p.stderr
    assert p.stdout.count("alloc result=0") == 2


def test_registry_api_dead_instance_and_reclaim(built, env):
    from seedance.shim import Registry

    env.update(LD_PRELOAD=str(built["shim"]), SEEDANCE_GROUP="1234", SEEDANCE_MEM_LIMIT="1M",
               SEEDANCE_GROUP_OWNER=str(os.getpid()))      # the group outlives its member, as under `seedance run`
    p = subprocess.Popen([str(built["linked"]), "init", "ctx:1", "alloc:4096", "kill"], env=env,
                         stdout=subprocess.DEVNULL)
    assert p.wait(timeout=30) == -signal.SIGKILL
    os.environ["SEEDANCE_RUNTIME_DIR"] = env["SEEDANCE_RUNTIME_DIR"]
    try:
        reg = Registry.open()
    finally:
        del os.environ["SEEDANCE_RUNTIME_DIR"]
    dead = [i for i in reg.instances() if i.pid == p.pid]
    assert len(dead) == 1 and not dead[0].alive and dead[0].state == "live"
    allocs = reg.allocations(dead[0].slot)
    assert [(a.size, a.device, a.api) for a in allocs] == [(4096, 1, "cuMemAlloc_v2")]
    group = reg.find_group(0x1234)
    assert group.used == {1: 4096} and group.limits[1] == 1 << 20
    kinds = [e["kind"] for e in reg.drain_events(dead[0].slot)]
    assert kinds[0] == "init"
    assert reg.reclaim(dead[0].slot)
    assert reg.find_group(0x1234).used == {}          # the dead instance's bytes went back to the quota
    assert reg.instance(dead[0].slot) is None
    assert reg.release_group(group.index) and reg.find_group(0x1234) is None


def test_group_of_a_dead_owner_goes_with_its_last_member(built, env):
    from seedance.shim import Registry

    env.update(LD_PRELOAD=str(built["shim"]), SEEDANCE_GROUP="4321", SEEDANCE_MEM_LIMIT="1M")
    p = subprocess.Popen([str(built["linked"]), "init", "ctx:0", "alloc:4096", "kill"], env=env,
                         stdout=subprocess.DEVNULL)
    p.wait(timeout=30)
    os.environ["SEEDANCE_RUNTIME_DIR"] = env["SEEDANCE_RUNTIME_DIR"]
    try:
        reg = Registry.open()
    finally:
        del os.environ["SEEDANCE_RUNTIME_DIR"]
    assert reg.find_group(0x4321).used == {0: 4096}
    slot = next(i.slot for i in reg.instances() if i.pid == p.pid)
    assert reg.reclaim(slot) and reg.find_group(0x4321) is None


def test_sigkill_while_holding_registry_lock_does_not_deadlock(built, env):
    env.update(LD_PRELOAD=str(built["test_shim"]), SEEDANCE_MEM_LIMIT="1M")
    holder_env = dict(env, SEEDANCE_GROUP="aaaa", SEEDANCE_TEST_HOLD_LOCK_MS="60000")
    holder = subprocess.Popen([str(built["linked"]), "init", "sleep:60000"], env=holder_env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # wait until the holder sits inside the lock (it has claimed its slot by then)
        from seedance.shim.binding import header_constant
        rt = os.path.join(env["SEEDANCE_RUNTIME_DIR"], f"registry.v{header_constant('SD_ABI_VERSION')}")
        for _ in range(200):
            if os.path.exists(rt):
                break
            time.sleep(0.01)
        time.sleep(0.3)
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        p = subprocess.run([str(built["linked"]), "init", "ctx:0", "alloc:1000"], env=dict(env, SEEDANCE_GROUP="bbbb"),
                           capture_output=True, text=True, timeout=20)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert parse_lines(p.stdout)[-1]["result"] == 0


def test_fork_children_followed_only_when_asked(built, env, tmp_path, front):
    for follow, expected in ((False, 1), (True, 2)):
        report = tmp_path / f"r{follow}.json"
        extra = ["--follow-children"] if follow else []
        p = seedance_run(env, *extra, "--report-json", report,
                         *steps(built, "linked", "direct", "init", "ctx:0", "fork:2048"))
        assert "child result=0" in p.stdout
        assert json.loads(report.read_text())["stats"]["instances"] == expected


def test_exec_children_run_unwrapped_unless_followed(built, env, front):
    script = 'printf "%s|%s" "$LD_PRELOAD" "$LD_AUDIT"'
    p = seedance_run(env, "--audit", "--", "sh", "-c", script)
    assert "libseedance_shim" not in p.stdout
    p = seedance_run(env, "--follow-children", "--", "sh", "-c", script)
    assert "libseedance_shim" in p.stdout


def test_program_stdout_is_untouched(built, env, tmp_path, front):
    p = seedance_run(env, "--events", tmp_path / "e.jsonl", "--report-json", tmp_path / "r.json", "--audit",
                     "--mem-limit", "1G", *steps(built, "linked", "direct", "stdout"))
    assert p.stdout == "stdout marker\n"


def test_events_and_audit(built, env, tmp_path):
    events = tmp_path / "e.jsonl"
    p = seedance_run(env, "--events", events, "--audit", "--mem-limit", "2048",
                     *steps(built, "linked", "direct", "init", "ctx:0", "alloc:1000", "alloc:2000", "free:all"))
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in events.read_text().splitlines()]
    kinds = [r["kind"] for r in rows]
    assert kinds.count("alloc") == 1 and kinds.count("free") == 1 and kinds.count("quota_refused") == 1
    opened = [r for r in rows if r["kind"] == "objopen"]
    assert any(r["path"].endswith("/libcuda.so.1") for r in opened)
    searches = [r for r in rows if r["kind"] == "objsearch" and r["name"].endswith("libcuda.so.1")]
    assert any(r["source"] == "LA_SER_LIBPATH" for r in searches)
    binds = {r["symbol"] for r in rows if r["kind"] == "symbind"}
    assert "cuInit" in binds


def test_disable_bypasses(built, env, front):
    env["SEEDANCE_DISABLE"] = "1"
    p = seedance_run(env, "--mem-limit", "100", "--affinity", "1",
                     *steps(built, "linked", "direct", "init", "count", "ctx:0", "alloc:1000"))
    lines = parse_lines(p.stdout)
    assert lines[1]["count"] == 2 and lines[3]["result"] == 0


def test_version_mismatch_passes_through(built, env):
    env.update(LD_PRELOAD=str(built["shim"]), SEEDANCE_MEM_LIMIT="100", SEEDANCE_SHIM_VERSION="0.0.0+abi0")
    p = subprocess.run([str(built["linked"]), "init", "ctx:0", "alloc:1000"], env=env, capture_output=True, text=True)
    assert parse_lines(p.stdout)[-1]["result"] == 0
    assert "passing through" in p.stderr


def test_missing_driver_passes_through(built, env):
    env["LD_PRELOAD"] = str(built["shim"])
    code = f"import ctypes; print(ctypes.CDLL({str(built['shim'])!r}).cuInit(0))"
    p = subprocess.run(["python3", "-c", code], env=dict(env, LD_LIBRARY_PATH=""), capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "3"     # CUDA_ERROR_NOT_INITIALIZED, no crash


def test_refuses_writable_preload_path(built, env, tmp_path):
    unsafe = tmp_path / "unsafe"
    unsafe.mkdir()
    os.chmod(unsafe, 0o777)
    shutil.copy(built["shim"], unsafe / "libseedance_shim.so")
    env["SEEDANCE_SHIM_LIB"] = str(unsafe / "libseedance_shim.so")
    p = seedance_run(env, "--", "true")
    assert p.returncode == 2 and "refusing to preload" in p.stderr and "Traceback" not in p.stderr


def test_setuid_target_is_named(built, env, tmp_path, front):
    target = tmp_path / "suid-true"
    shutil.copy(shutil.which("true"), target)
    os.chmod(target, 0o4755)
    p = seedance_run(env, "--", target)
    assert p.returncode == 0 and "setuid" not in p.stdout
    assert "set-user/group-ID" in p.stderr and "glibc ignores LD_PRELOAD" in p.stderr


@pytest.mark.parametrize("args,text", [
    ([], "give the command"),
    (["--mem-limit", "lots", "--", "true"], "not a size"),
    (["--mem-limit", "99:1G", "--", "true"], "device must be"),
    (["--affinity", "tpu7", "--", "true"], "--affinity"),
])
def test_bad_input_is_one_line_exit_2(env, args, text, front):
    p = seedance_run(env, *args)
    assert p.returncode == 2 and text in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_many_processes_get_their_own_slots(built, env):
    env["LD_PRELOAD"] = str(built["shim"])
    procs = [subprocess.Popen([str(built["linked"]), "init", "ctx:0", "alloc:4096"], env=env,
                              stdout=subprocess.DEVNULL) for _ in range(24)]
    assert all(p.wait(timeout=30) == 0 for p in procs)
    from seedance.shim import Registry
    os.environ["SEEDANCE_RUNTIME_DIR"] = env["SEEDANCE_RUNTIME_DIR"]
    try:
        reg = Registry.open()
    finally:
        del os.environ["SEEDANCE_RUNTIME_DIR"]
    pids = {p.pid for p in procs}
    mine = [i for i in reg.instances() if i.pid in pids]
    assert len(mine) == 24 and len({i.slot for i in mine}) == 24
    assert all(i.state == "exited" and i.current == {0: 4096} for i in mine)


def test_run_report_follows_the_report_schema(built, env, tmp_path):
    import jsonschema
    from pathlib import Path

    schema = json.loads((Path(__file__).resolve().parents[2] / "agent/schemas/report.schema.json").read_text())
    p = seedance_run(env, "--affinity", "1", "--mem-limit", "1000", "--report-json", "-",
                     *steps(built, "linked", "direct", "init", "ctx:0", "alloc:600", "alloc:600", "kill"))
    doc = json.loads(p.stdout)          # the program's lines went to stderr (issue 10, defect 7)
    jsonschema.validate(doc, schema)
    assert {f["rule"] for f in doc["findings"]} == {"handle-leak", "quota-refused"}


def test_auto_affinity_without_nvml_uses_the_registry(built, env, tmp_path):
    env_holder = dict(env, LD_PRELOAD=str(built["shim"]))
    holder = subprocess.Popen([str(built["linked"]), "init", "ctx:0", "alloc:1000000", "sleep:20000"],
                              env=env_holder, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().startswith("init")
        holder.stdout.readline(), holder.stdout.readline()          # ctx, alloc: now held on device 0
        report = tmp_path / "r.json"
        p = seedance_run(env, "--affinity", "auto", "--report-json", report,
                         *steps(built, "linked", "direct", "init", "uuid:0", "ctx:0", "alloc:10"))
    finally:
        holder.kill()
        holder.wait()
    assert parse_lines(p.stdout)[1]["last"] == 1                      # device 1: the idle one
    how = json.loads(report.read_text())["affinity"]["how"]
    assert "NVML" in how and "least memory held" in how


def test_runtime_entry_points_remap_quota_and_name_the_caller(built, env, ledger, tmp_path, front):
    """cudaMalloc through a runtime that reaches the driver only via cuGetProcAddress."""
    report = tmp_path / "r.json"
    p = seedance_run(env, "--affinity", "gpu:1", "--mem-limit", "1:10000", "--report-json", report,
                     "--", built["runtime"], "4000", "k5000", "6000")
    lines = parse_lines(p.stdout)
    assert lines[0]["count"] == 1 and lines[1]["result"] == 0
    assert [r["result"] for r in lines[2:] if r["step"] == "malloc"] == [0, 0, 2]   # cudaErrorMemoryAllocation
    seen = ledger.read()
    assert seen["allocs"][:2] == [0, 2] and seen["high_water"][1] <= 10000
    data = json.loads(report.read_text())
    calls = data["calls_by_api"]
    assert calls["cudaMalloc"] == 3 and calls["cudaFree"] == 1 and calls["cudaGetDeviceCount"] == 1
    assert calls["cuMemAlloc_v2"] == 2
    # attributed to the program that called cudaMalloc, not to libcudart
    assert list(data["allocations_by_library"]) == [str(built["runtime"])]
    leak = next(f for f in data["findings"] if f["rule"] == "handle-leak")
    assert leak["evidence"]["bytes"] == 5000 and leak["evidence"]["device"] == 1


def test_sigterm_to_seedance_reaches_the_program(built, env):
    import sys
    from pathlib import Path

    exe = Path(sys.executable).parent / "seedance"
    p = subprocess.Popen([str(exe), "run", "--", str(built["linked"]), "init", "stdout", "sleep:20000"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "init result=0\n" and p.stdout.readline() == "stdout marker\n"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 128 + signal.SIGTERM


@pytest.mark.parametrize("spec,count,lasts", [
    ("npu1", 1, [1]),                 # the product notes' spelling
    ("1,0", 2, [1, 0]),               # order given is the order seen
    ("0,0", 1, [0]),                  # a repeat ends the list, as in CUDA_VISIBLE_DEVICES
    ("GPU-5eedface,1", 0, []),        # an ambiguous UUID prefix names no device
])
def test_affinity_grammar(built, env, spec, count, lasts):
    env.update(LD_PRELOAD=str(built["shim"]), SEEDANCE_AFFINITY=spec)
    p = subprocess.run([str(built["linked"]), "init", "count", *[f"uuid:{i}" for i in range(count)]], env=env,
                       capture_output=True, text=True)
    lines = parse_lines(p.stdout)
    assert lines[1]["count"] == count
    assert [r["last"] for r in lines[2:]] == lasts


def test_affinity_ordinals_follow_the_drivers_order(built, env):
    """CUDA_DEVICE_ORDER and CUDA_VISIBLE_DEVICES are the driver's; affinity ordinals are its ordinals."""
    env.update(LD_PRELOAD=str(built["shim"]), FAKECUDA_MEM="4G,8G", SEEDANCE_AFFINITY="0")
    fastest = parse_lines(subprocess.run([str(built["linked"]), "init", "uuid:0"], env=env,
                                         capture_output=True, text=True).stdout)
    pci = parse_lines(subprocess.run([str(built["linked"]), "init", "uuid:0"], env=dict(env, CUDA_DEVICE_ORDER="PCI_BUS_ID"),
                                     capture_output=True, text=True).stdout)
    visible = parse_lines(subprocess.run([str(built["linked"]), "init", "uuid:0"],
                                         env=dict(env, CUDA_VISIBLE_DEVICES="GPU-5eedface-0000-4000-8000-000000000000"),
                                         capture_output=True, text=True).stdout)
    assert (fastest[1]["last"], pci[1]["last"], visible[1]["last"]) == (1, 0, 0)


@pytest.mark.parametrize("binary,via", VIAS)
def test_per_instance_handles_give_the_instance_a_context_of_its_own(built, env, binary, via, front):
    def ownctx(*flags):
        p = seedance_run(env, *flags, *steps(built, binary, via, "init", "ownctx:0"))
        assert p.returncode == 0, p.stderr
        return parse_lines(p.stdout)[1]

    # shared: the device's primary context, which the driver refuses to destroy
    assert ownctx() == {"step": "ownctx", "result": 0, "same": 1, "destroy": 201}
    # per-instance: one context of the instance's own, retained twice, destroyable
    assert ownctx("--handles", "per-instance") == {"step": "ownctx", "result": 0, "same": 1, "destroy": 0}
    # and `seedance fix handle-leak` makes that the default of `seedance run`
    fixed = subprocess.run([str(Path(sys.executable).parent / "seedance"), "fix", "handle-leak",
                            "--mode", "per-instance"], env=env, capture_output=True, text=True, timeout=60)
    assert fixed.returncode == 0, fixed.stderr
    assert ownctx()["destroy"] == 0
    assert ownctx("--handles", "shared")["destroy"] == 201


# -- issue 10, defect 6: the quota cannot be escaped ----------------------------------------

@pytest.mark.parametrize("change", [["unsetenv:SEEDANCE_MEM_LIMIT"], ["setenv:SEEDANCE_DISABLE=1"],
                                    ["unsetenv:SEEDANCE_GROUP", "setenv:SEEDANCE_MEM_LIMIT=1G"],
                                    ["setenv:SEEDANCE_AFFINITY=0"]])
def test_environment_changed_before_the_first_cuda_call_changes_nothing(built, env, ledger, change):
    """The configuration is read by the constructor, before main (the program's own
    setenv/unsetenv run after it)."""
    env.update(LD_PRELOAD=str(built["shim"]), SEEDANCE_GROUP="e5c", SEEDANCE_MEM_LIMIT="1000",
               SEEDANCE_AFFINITY="1")
    p = subprocess.run([str(built["linked"]), *change, "init", "ctx:0", "alloc:5000", "alloc:900"], env=env,
                       capture_output=True, text=True, timeout=30)
    lines = parse_lines(p.stdout)
    assert all(r["result"] == 0 for r in lines[:len(change)]), p.stdout
    assert [r["result"] for r in lines[-2:]] == [2, 0], p.stdout        # over the quota: refused
    seen = ledger.read()
    assert seen["allocs"][:2] == [0, 1] and seen["high_water"][1] == 900    # on physical 1 only


def test_escape_through_seedance_run_is_refused_too(built, env, ledger, tmp_path, front):
    report = tmp_path / "r.json"
    p = seedance_run(env, "--mem-limit", "1000", "--report-json", report, "--", built["linked"],
                     "unsetenv:SEEDANCE_MEM_LIMIT", "setenv:SEEDANCE_DISABLE=1", "init", "ctx:0", "alloc:5000")
    assert parse_lines(p.stdout)[-1]["result"] == 2
    assert ledger.read()["allocs"][0] == 0
    data = json.loads(report.read_text())
    assert data["stats"]["quota_refusals"] == 1 and data["run"]["wrapped"] is True


def test_inherited_disable_is_said_on_stderr(built, env, ledger, front):
    env.update(LD_PRELOAD=str(built["shim"]), SEEDANCE_DISABLE="1", SEEDANCE_MEM_LIMIT="100")
    p = subprocess.run([str(built["linked"]), "init", "ctx:0", "alloc:1000"], env=env, capture_output=True,
                       text=True, timeout=30)
    assert parse_lines(p.stdout)[-1]["result"] == 0 and ledger.read()["allocs"][0] == 1   # bypassed ...
    assert "SEEDANCE_DISABLE=1" in p.stderr and "NOT enforced" in p.stderr               # ... but said
    assert "SEEDANCE_DISABLE" not in p.stdout
    # through seedance run: said once, by seedance run, and the report says unwrapped
    del env["LD_PRELOAD"]
    p = seedance_run(env, "--mem-limit", "100", "--", built["linked"], "init", "ctx:0", "alloc:1000")
    assert p.stderr.count("SEEDANCE_DISABLE=1") == 1, p.stderr


def test_full_registry_shares_the_quota_and_says_so(built, env, ledger, tmp_path):
    """256 live instances hold every slot; the processes of a new run still share one
    quota (before: each got a private one, --mem-limit 1000 let 5400 bytes out and the
    report said peak 1000)."""
    from seedance.shim.binding import header_constant

    slots = header_constant("SD_MAX_SLOTS")
    holder_env = dict(env, LD_PRELOAD=str(built["shim"]))
    holders = []
    try:
        for _ in range(slots):
            holders.append(subprocess.Popen([str(built["linked"]), "init", "sleep:120000"], env=holder_env,
                                            stdout=subprocess.PIPE, text=True))
        assert all(h.stdout.readline() == "init result=0\n" for h in holders)   # each holds a slot now
        report = tmp_path / "r.json"
        script = f"for i in 1 2 3 4 5 6; do {built['linked']} init ctx:0 alloc:900 sleep:1500 & done; wait"
        p = seedance_run(env, "--mem-limit", "1000", "--follow-children", "--report-json", report,
                         "--", "sh", "-c", script, timeout=120)
    finally:
        for h in holders:
            h.kill()
        for h in holders:
            h.wait()
    results = [r["result"] for r in parse_lines(p.stdout) if r["step"] == "alloc"]
    assert sorted(results) == [0, 2, 2, 2, 2, 2], p.stdout + p.stderr    # the six share 1000 bytes
    seen = ledger.read()
    assert seen["allocs"][0] == 1 and seen["high_water"][0] == 900
    data = json.loads(report.read_text())
    assert data["devices"][0]["peak_bytes"] == seen["high_water"][0]
    assert data["run"]["instances_without_slot"] == 6
    assert "registry full" in p.stderr


# -- issue 10, defect 7: streams never share a descriptor with the program ------------------

def test_report_on_stdout_is_one_clean_document(built, env):
    p = seedance_run(env, "-o", "-", "--mem-limit", "1G", *steps(built, "linked", "direct", "stdout", "init"))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)                    # nothing but the report on stdout
    assert doc["schema"] == "seedance.report/v1" and doc["command"] == "run"
    assert "stdout marker" in p.stderr and "init result=0" in p.stderr


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed")
def test_report_pipeline_through_jq(built, env):
    """The pipeline of the docs, run by a real shell and a real jq."""
    seedance = Path(sys.executable).parent / "seedance"
    line = f"{seedance} run --report-json - -- {built['linked']} stdout init | jq -c .stats.instances"
    p = subprocess.run(["sh", "-c", line], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == "1\n", p.stdout + p.stderr


def test_events_on_stdout_are_json_lines_only(built, env):
    p = seedance_run(env, "--events", "-", *steps(built, "linked", "direct", "stdout", "init", "ctx:0", "alloc:64",
                                                    "free:all"))
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert rows[0]["schema"] == "seedance.run-events/v1"
    assert [r["kind"] for r in rows].count("alloc") == 1 and "stdout marker" in p.stderr


def test_report_never_overwrites_a_file_that_is_not_ours(built, env, tmp_path):
    victim = tmp_path / "prog"
    shutil.copy(built["linked"], victim)
    before = victim.read_bytes()
    p = seedance_run(env, "-o", victim, "--", built["linked"], "init")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "init result" not in p.stdout          # refused before the program ran
    assert victim.read_bytes() == before
    # a report of ours is replaced; --force replaces anything
    p = seedance_run(env, "-o", victim, "--force", "--", built["linked"], "init")
    assert p.returncode == 0 and json.loads(victim.read_text())["command"] == "run"
    events = tmp_path / "ev.jsonl"
    for _ in range(2):                            # a stream of ours may be written again
        p = seedance_run(env, "--events", events, "--", built["linked"], "init")
        assert p.returncode == 0, p.stderr


def test_report_json_needs_its_argument(env):
    p = seedance_run(env, "--report-json")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1


def test_static_binary_is_reported_unwrapped(built, env, tmp_path, front):
    src = tmp_path / "static.c"
    src.write_text("#include <stdio.h>\nint main(void) { puts(\"static\"); return 0; }\n")
    exe = tmp_path / "static"
    c = subprocess.run(["cc", "-static", str(src), "-o", str(exe)], capture_output=True, text=True)
    if c.returncode != 0:
        pytest.skip(f"cannot link statically here: {c.stderr.strip()[:200]}")
    # the oracle: ld.so itself says it is not a dynamic executable
    ldd = subprocess.run(["ldd", str(exe)], capture_output=True, text=True, errors="replace")
    assert "not a dynamic executable" in ldd.stdout + ldd.stderr
    report = tmp_path / "r.json"
    p = seedance_run(env, "--mem-limit", "1G", "-o", report, "--", exe)
    assert p.returncode == 0 and p.stdout == "static\n"
    run = json.loads(report.read_text())["run"]
    assert run["wrapped"] is False and "statically linked" in run["why_unwrapped"]
    assert "statically linked" in p.stderr
    # and a dynamic one is not
    p = seedance_run(env, "-o", report, "--", built["linked"], "init")
    assert json.loads(report.read_text())["run"]["wrapped"] is True


def test_launcher_reclaims_its_run_and_hands_leaks_to_the_rule_engine(built, env):
    """seedance-run does the clean case in C and gives what needs the rule engine
    (memory held at exit) to `seedance run --finish-group`; either way the run's slots
    and its group are given back."""
    from seedance import shim

    try:
        launcher = shim.launcher_path()
    except shim.NotAvailable as exc:
        pytest.skip(str(exc))

    def registry():
        os.environ["SEEDANCE_RUNTIME_DIR"] = env["SEEDANCE_RUNTIME_DIR"]
        try:
            return shim.Registry.open()
        finally:
            del os.environ["SEEDANCE_RUNTIME_DIR"]

    clean = subprocess.run([str(launcher), "--mem-limit", "1M", "--", str(built["linked"]), "init", "ctx:0",
                            "alloc:100", "free:all"], env=env, capture_output=True, text=True, timeout=60)
    assert clean.returncode == 0 and clean.stderr == "", clean.stderr
    leak = subprocess.run([str(launcher), "--affinity", "1", "--", str(built["linked"]), "init", "ctx:0",
                           "alloc:5000", "kill"], env=env, capture_output=True, text=True, timeout=60)
    assert leak.returncode == 128 + signal.SIGKILL
    assert "handle-leak" in leak.stderr and "5000 bytes on device 1" in leak.stderr, leak.stderr
    reg = registry()
    assert reg.instances() == []                                    # every slot given back
    assert all(reg.group(i) is None for i in range(reg.lib.SD_MAX_GROUPS))   # and every group


def test_groups_of_finished_runs_are_given_back_when_the_table_is_full(built, env, ledger):
    """Plain LD_PRELOAD processes with SEEDANCE_MEM_LIMIT make a group each; more of them
    than the table holds must still get their quota (not a refusal, not a private one)."""
    from seedance.shim.binding import header_constant

    env.update(LD_PRELOAD=str(built["shim"]), SEEDANCE_MEM_LIMIT="1000")
    results = []
    for _ in range(header_constant("SD_MAX_GROUPS") + 6):
        p = subprocess.run([str(built["linked"]), "init", "ctx:0", "alloc:900", "alloc:900"], env=env,
                           capture_output=True, text=True, timeout=30)
        results.append([r["result"] for r in parse_lines(p.stdout)[2:]])
        assert "table full" not in p.stderr, p.stderr
    assert all(r == [0, 2] for r in results)          # each one: its own 1000 bytes, held to them
    assert ledger.read()["allocs"][0] == len(results)  # the driver saw one allocation from each


def test_many_processes_with_their_own_quota_at_once(built, env):
    """Without SEEDANCE_GROUP each process's quota is its own: more such processes alive at
    once than the group table holds still get theirs (no refusal)."""
    from seedance.shim.binding import header_constant

    env.update(LD_PRELOAD=str(built["shim"]), SEEDANCE_MEM_LIMIT="1000")
    n = header_constant("SD_MAX_GROUPS") + 8
    procs = [subprocess.Popen([str(built["linked"]), "init", "ctx:0", "alloc:900", "alloc:900", "sleep:8000"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    outs = [p.communicate(timeout=120) for p in procs]
    results = [[r["result"] for r in parse_lines(out)[2:4]] for out, _ in outs]
    assert results == [[0, 2]] * n, [err for _, err in outs if err][:3]


def test_console_script_hands_run_to_the_c_launcher_and_python_m_does_not(built, env):
    """`seedance run` runs in seedance-run, the C launcher: the venv's `seedance` is the
    launcher itself (Makefile), or pip's console script, which execs it before importing
    the CLI (cli._launch, issue 13); `python -m seedance run` is the Python command itself,
    which the launcher execs for what it leaves to Python.  The wrapped program's parent's
    executable says which process ran it."""
    from seedance import shim

    try:
        launcher = shim.launcher_path()
    except shim.NotAvailable as exc:
        pytest.skip(str(exc))
    parent = "readlink /proc/$PPID/exe"
    console = Path(sys.executable).parent / "seedance"
    p = subprocess.run([str(console), "run", "--", "sh", "-c", parent], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(launcher.resolve())
    p = subprocess.run([sys.executable, "-m", "seedance", "run", "--", "sh", "-c", parent], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == os.path.realpath(sys.executable)
    # what the launcher leaves to Python still works through the console script
    p = subprocess.run([str(console), "run", "--bogus", "--", "true"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr


def test_launcher_named_seedance_is_the_whole_cli_and_keeps_the_cwd_off_sys_path(built, env, tmp_path):
    """The launcher under the name `seedance` (as the Makefile installs it) runs `seedance
    run` itself and hands every other command to the Python CLI (`python -P -c ...`, what
    `python -m seedance` runs), with the working directory kept off sys.path, so a seedance
    package planted there is never imported (launcher.c, front_end)."""
    from seedance import shim

    try:
        launcher = shim.launcher_path()
    except shim.NotAvailable as exc:
        pytest.skip(str(exc))
    front = tmp_path / "bin" / "seedance"
    front.parent.mkdir()
    front.symlink_to(launcher)
    planted = tmp_path / "cwd" / "seedance"
    planted.mkdir(parents=True)
    (planted / "__init__.py").write_text("")
    (planted / "__main__.py").write_text("print('PLANTED')\n")
    cwd = str(planted.parent)
    p = subprocess.run([str(front), "--version"], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    q = subprocess.run([sys.executable, "-m", "seedance", "--version"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and "PLANTED" not in p.stdout, (p.stdout, p.stderr)
    assert p.stdout == q.stdout and p.stdout.startswith("seedance ")
    # a bad command: the Python CLI's one-line error and exit 2
    p = subprocess.run([str(front), "chekc"], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "PLANTED" not in p.stdout, p.stderr
    # `run`: the launcher itself is the wrapped program's parent, which set up its group
    p = subprocess.run([str(front), "run", "--", "sh", "-c", 'readlink /proc/$PPID/exe; echo "$SEEDANCE_GROUP"'],
                       env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    exe, group = p.stdout.splitlines()
    assert exe == str(launcher.resolve()) and int(group, 16) > 0
    # what the launcher leaves to Python (-o needs the report) goes to the Python `seedance run`
    out = tmp_path / "report.json"
    p = subprocess.run([str(front), "run", "-o", str(out), "--", "true"], env=env, cwd=cwd, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and "PLANTED" not in p.stdout, p.stderr
    assert json.loads(out.read_text())["command"] == "run"
