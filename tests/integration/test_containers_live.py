"""seedance check and ldd against a live process in its own root: a real podman container,
else a private mount + PID namespace with chroot (unshare), which is what a container's
root looks like to /proc.  The engine that ran is printed and added to the report.

The container's rootfs is made from host files: /bin/sh and its libraries, and gcc-built
programs.  It holds traps a host-side reading would miss or invent:
  - /app/libtrap.so needs libz.so.1, which the host has and the container lacks: a dlopen
    of it fails inside (the program in the container is the oracle);
  - /etc/ld.so.cache is an absolute symlink to a copy of the host's cache, /etc/ld.so.conf
    and /etc/evil-link point at a host file, /app/libevil.so at a host library whose
    SONAME carries a marker: followed on the host, each would put the marker in the
    report or make libz.so.1 resolve.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from process_fixtures import gcc

SEEDANCE = [sys.executable, "-m", "seedance"]
PODMAN_RUN = ["podman", "run", "-d", "--runtime", "/usr/sbin/runc", "--ulimit", "nofile=1024:1024",
              "--ulimit", "nproc=1024:1024"]
LIBZ = "/usr/lib/x86_64-linux-gnu/libz.so.1"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="reads other processes' roots: needs root")


def _run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=kw.pop("timeout", 120), **kw)


def _copy_in(root, path):
    """A host file at the same path in the rootfs (its symlink chain too, as real files)."""
    real = os.path.realpath(path)
    for name in {path, real}:
        dest = os.path.join(root, name.lstrip("/"))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if not os.path.exists(dest):
            shutil.copy2(real, dest)


def _ldd_paths(binary):
    out = _run(["ldd", binary]).stdout
    return [part for line in out.splitlines() for part in line.split() if part.startswith("/")]


def build_rootfs(base, marker):
    root = str(base / "rootfs")
    src = base / "src"
    src.mkdir()
    for path in ["/bin/sh", *_ldd_paths("/bin/sh")]:
        _copy_in(root, path)
    app = os.path.join(root, "app")
    os.makedirs(app)
    (src / "two.c").write_text(
        "#include <unistd.h>\nint two_value(void);\n"
        "int main(void) { if (two_value() != 2) return 1; for (;;) pause(); }\n")
    (src / "libtwo.c").write_text("int two_value(void) { return 2; }\n")
    (src / "trap.c").write_text("#include <zlib.h>\nconst char *trap(void) { return zlibVersion(); }\n")
    (src / "dlopener.c").write_text(
        "#include <dlfcn.h>\n#include <stdio.h>\n"
        "int main(int c, char **v) { void *h = dlopen(v[1], RTLD_NOW);"
        " if (!h) { printf(\"FAIL %s\\n\", dlerror()); return 1; } printf(\"OK\\n\"); return 0; }\n")
    gcc("-shared", "-fPIC", "-o", f"{app}/libtwo.so", str(src / "libtwo.c"), "-Wl,-soname,libtwo.so")
    gcc("-o", f"{app}/two", str(src / "two.c"), f"-L{app}", "-ltwo", "-Wl,-rpath,/app")
    gcc("-shared", "-fPIC", "-o", f"{app}/libtrap.so", str(src / "trap.c"), "-lz")
    gcc("-o", f"{app}/dlopener", str(src / "dlopener.c"), "-ldl")
    for needed in _ldd_paths(f"{app}/dlopener"):
        if "libz" not in needed:
            _copy_in(root, needed)
    # the host side of the hostile links: a secret, a host cache that knows libz, a host
    # library whose SONAME carries the marker
    secret = f"/tmp/hostsecret-{marker}"
    with open(secret, "w") as handle:
        handle.write(f"{marker}\n")
    host_cache = f"/tmp/hostcache-{marker}"
    shutil.copy("/etc/ld.so.cache", host_cache)
    host_lib = f"/tmp/hostlib-{marker}.so"
    gcc("-shared", "-fPIC", "-o", host_lib, str(src / "libtwo.c"), f"-Wl,-soname,lib{marker}.so")
    etc = os.path.join(root, "etc")
    os.makedirs(etc, exist_ok=True)
    os.symlink(secret, os.path.join(etc, "evil-link"))
    os.symlink(secret, os.path.join(etc, "ld.so.conf"))
    os.symlink(host_cache, os.path.join(etc, "ld.so.cache"))
    os.symlink(host_lib, os.path.join(app, "libevil.so"))
    return root, [secret, host_cache, host_lib]


class Engine:
    """A running /app/two in its own root; .name is podman or unshare+chroot."""

    def __init__(self, base, marker):
        self.marker = marker
        self.root, self.host_files = build_rootfs(base, marker)
        self.name = None
        self.container = None
        self.image = None
        self.proc = None
        self.pid = None

    def start(self):
        # SEEDANCE_CONTAINER_ENGINE=unshare runs the namespace + chroot case where podman works too
        wanted = os.environ.get("SEEDANCE_CONTAINER_ENGINE", "podman")
        if wanted == "podman" and shutil.which("podman") and self._podman():
            self.name = "podman"
        else:
            self._unshare()
            self.name = "unshare+chroot"

    def _podman(self) -> bool:
        tag = f"localhost/sd-containers-{self.marker.lower()}:1"
        tar = _run(["tar", "-C", self.root, "-cf", f"{self.root}.tar", "."])
        if tar.returncode or _run(["podman", "import", f"{self.root}.tar", tag]).returncode:
            return False
        self.image = tag
        self.container = f"sd-ct-{self.marker.lower()}"
        started = _run(PODMAN_RUN + ["--name", self.container, tag, "/app/two"])
        if started.returncode:
            print("podman run failed:", started.stderr.strip()[-300:])
            return False
        for _ in range(50):
            pid = _run(["podman", "inspect", "--format", "{{.State.Pid}}", self.container]).stdout.strip()
            if pid.isdigit() and int(pid) > 0 and _maps_lib(int(pid)):
                self.pid = int(pid)
                self.id = _run(["podman", "inspect", "--format", "{{.Id}}", self.container]).stdout.strip()
                return True
            time.sleep(0.2)
        return False

    def _unshare(self):
        self.proc = subprocess.Popen(["unshare", "-m", "-p", "-f", "--mount-proc", "chroot", self.root, "/app/two"])
        for _ in range(50):
            children = _children(self.proc.pid)
            if children and _maps_lib(children[0]):
                self.pid = children[0]
                return
            time.sleep(0.2)
        raise AssertionError("the chrooted /app/two did not start")

    def run_inside(self, *argv):
        """The oracle: run a program in the same root, as its processes see it."""
        if self.name == "podman":
            return _run(["podman", "exec", self.container, *argv])
        return _run(["chroot", self.root, *argv])

    def stop(self):
        if self.container:
            _run(["podman", "rm", "-f", self.container])
        if self.image:
            _run(["podman", "rmi", "-f", self.image])
        if self.proc is not None:
            if self.pid is not None:  # the namespace's init: unshare's death does not end it
                os.kill(self.pid, signal.SIGKILL)
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        for path in self.host_files:
            if os.path.exists(path):
                os.unlink(path)


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(x) for x in handle.read().split()]
    except OSError:
        return []


def _maps_lib(pid):
    try:
        with open(f"/proc/{pid}/maps") as handle:
            return "libtwo.so" in handle.read()
    except OSError:
        return False


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    marker = "MARK" + uuid.uuid4().hex[:10].upper()
    live = Engine(tmp_path_factory.mktemp("ct"), marker)
    try:
        live.start()
        print(f"\ncontainer engine: {live.name} (pid {live.pid})")
        yield live
    finally:
        live.stop()


def seedance(*args):
    done = _run(SEEDANCE + list(args), timeout=300)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def _no_marker(engine, *texts):
    for text in texts:
        assert engine.marker not in text


def test_no_false_lib_deleted_and_the_container_is_named(engine, record_property):
    record_property("container_engine", engine.name)
    done = seedance("check", "--pid", str(engine.pid), "--json", "--no-cache")
    report = json.loads(done.stdout)
    mine = [f for f in report["findings"] if f["subject"].get("pid") == engine.pid]
    assert [f for f in mine if f["rule"] == "lib-deleted"] == [], mine
    assert "no such file" not in done.stderr
    _no_marker(engine, done.stdout, done.stderr)


def test_a_library_really_deleted_inside_is_flagged_with_its_restart(engine):
    # the library goes away inside the container's root (the host deletes it through
    # /proc/PID/root): the mapping is now "(deleted)" and nothing stands under its name
    victim = f"/proc/{engine.pid}/root/app/libtwo.so"
    saved = open(victim, "rb").read()
    os.unlink(victim)
    try:
        done = seedance("check", "--pid", str(engine.pid), "--json", "--no-cache")
        text = seedance("check", "--pid", str(engine.pid), "--no-cache").stdout
    finally:
        with open(victim, "wb") as handle:
            handle.write(saved)
        os.chmod(victim, 0o755)
    found = [f for f in json.loads(done.stdout)["findings"] if f["rule"] == "lib-deleted"]
    assert [f["subject"]["path"].rsplit("/", 1)[-1] for f in found] == ["libtwo.so"]
    assert "seedance-agent" not in found[0]["fix"]
    if engine.name == "podman":
        assert found[0]["subject"]["container"]["runtime"] == "podman"
        assert found[0]["subject"]["container"]["id"] == engine.id
        assert found[0]["fix"] == f"podman restart {engine.container}"
        assert engine.id[:12] in text
    else:
        assert found[0]["fix"] == f"restart pid {engine.pid} (two)"


def test_the_trap_inside_is_found_as_the_container_sees_it(engine):
    oracle = engine.run_inside("/app/dlopener", "/app/libtrap.so")
    assert oracle.returncode == 1 and "libz.so.1" in oracle.stdout, (oracle.stdout, oracle.stderr)
    done = seedance("check", "--pid", str(engine.pid), "--then-dlopen", "/app/libtrap.so", "--json")
    report = json.loads(done.stdout)
    failed = [f for f in report["findings"] if f["rule"] == "process-load-fails"]
    assert failed and "libz.so.1" in failed[0]["message"], report["findings"]
    text = seedance("check", "--pid", str(engine.pid), "--then-dlopen", "/app/libtrap.so").stdout
    assert "then dlopen(/app/libtrap.so): fails: libz.so.1" in text
    if engine.name == "podman":
        assert failed[0]["subject"]["container"]["id"] == engine.id
        assert f"podman container {engine.id[:12]}" in text
    # and libtwo.so, which it does load, loads
    ok = seedance("check", "--pid", str(engine.pid), "--then-dlopen", "/app/libtwo.so").stdout
    assert "then dlopen(/app/libtwo.so): already loaded" in ok
    _no_marker(engine, done.stdout, text, ok)


def test_ldd_inside_the_root(engine):
    inside = seedance("ldd", f"/proc/{engine.pid}/root/app/libtrap.so")
    assert inside.returncode == 0, inside.stderr
    assert "libz.so.1 => not found" in inside.stdout
    host_copy = os.path.join(engine.root, "app", "libtrap.so")
    on_host = seedance("ldd", host_copy).stdout  # the same file read as a host file finds the host's libz
    assert "libz.so.1 => /" in on_host
    two = seedance("ldd", "--json", f"/proc/{engine.pid}/root/app/two")
    libs = {lib["name"]: lib["path"] for lib in json.loads(two.stdout)["libraries"]}
    assert libs["libtwo.so"] == "/app/libtwo.so"
    evil = seedance("ldd", "--json", f"/proc/{engine.pid}/root/app/libevil.so")
    assert evil.returncode == 2 and "no such file" in evil.stderr
    _no_marker(engine, inside.stdout, two.stdout, evil.stdout, evil.stderr)


def test_container_by_name(engine):
    if engine.name != "podman":
        print("check --container needs podman: the unshare+chroot engine ran, this case checks the refusal only")
    else:
        done = seedance("check", "--container", engine.container, "--json", "--no-cache")
        assert done.returncode in (0, 1), done.stderr
        report = json.loads(done.stdout)
        assert report["scope"]["pids"] == [engine.pid]
        assert report["stats"]["processes"] == 1
    missing = seedance("check", "--container", f"no-such-{engine.marker.lower()}")
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1 and missing.stderr.startswith("seedance: error: --container")


def test_hostile_links_are_read_inside_the_root(engine):
    from seedance.collect import rootfs

    root = f"/proc/{engine.pid}/root"
    for path in ("/etc/evil-link", "/etc/ld.so.conf", "/etc/ld.so.cache", "/app/libevil.so"):
        with pytest.raises(FileNotFoundError):
            rootfs.read(root, path)
    assert rootfs.read(root, "/app/libtwo.so").startswith(b"\x7fELF")


# --- why, then-dlopen, trace and the bundle, inside the container ---------------------------

def _where_text(engine):
    return f"podman container {engine.id[:12]}" if engine.name == "podman" else "chrooted in"


def test_why_follows_the_chain_inside_the_root(engine):
    # the oracle: the running program mapped /app/libtwo.so (its RUNPATH /app), a file the host lacks
    with open(f"/proc/{engine.pid}/maps") as handle:
        assert "/app/libtwo.so" in handle.read()
    assert not os.path.exists("/app/libtwo.so")
    done = seedance("why", "libtwo.so", "--pid", str(engine.pid))
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "/app/two NEEDED libtwo.so => /app/libtwo.so [runpath]" in done.stdout, done.stdout
    assert _where_text(engine) in done.stdout.splitlines()[0]
    # libz.so.1, which the host has, is not in the container's process
    gone = seedance("why", "libz.so.1", "--pid", str(engine.pid))
    assert gone.returncode == 1 and "is not loaded by process" in gone.stdout
    _no_marker(engine, done.stdout, done.stderr, gone.stdout)


def test_then_dlopen_of_a_relative_path_opens_it_from_the_process_cwd_in_its_root(engine, tmp_path):
    # dlopen("app/libtrap.so") opens the name from the process's working directory (/ in
    # the container): the oracle fails on libz.so.1.  A host file of the same relative
    # name beside seedance's own cwd, which loads, must not stand in for it.
    oracle = engine.run_inside("/app/dlopener", "app/libtrap.so")
    assert oracle.returncode == 1 and "libz.so.1" in oracle.stdout, (oracle.stdout, oracle.stderr)
    decoy = tmp_path / "app"
    decoy.mkdir()
    source = tmp_path / "decoy.c"
    source.write_text("int decoy(void) { return 1; }\n")
    gcc("-shared", "-fPIC", "-o", str(decoy / "libtrap.so"), str(source), f"-Wl,-soname,lib{engine.marker}.so")
    done = _run(SEEDANCE + ["check", "--pid", str(engine.pid), "--then-dlopen", "app/libtrap.so"],
                cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=300)
    assert "Traceback" not in done.stderr, done.stderr
    assert "then dlopen(app/libtrap.so): fails: libz.so.1" in done.stdout, done.stdout
    _no_marker(engine, done.stdout, done.stderr)


def test_then_dlopen_searches_the_process_own_ld_library_path(engine):
    # a second process in the same root, started with LD_LIBRARY_PATH=/opt/extra: its
    # dlopen("libextra.so") finds /opt/extra/libextra.so, the first process's does not
    extra = f"/proc/{engine.pid}/root/opt/extra"
    os.makedirs(extra, exist_ok=True)
    src = f"{extra}/extra.c"
    with open(src, "w") as handle:
        handle.write("int extra(void) { return 3; }\n")
    gcc("-shared", "-fPIC", "-o", f"{extra}/libextra.so", src, "-Wl,-soname,libextra.so")
    os.unlink(src)
    env_argv = ["env", "LD_LIBRARY_PATH=/opt/extra"]
    if engine.name == "podman":
        with_env = _run(["podman", "exec", "-e", "LD_LIBRARY_PATH=/opt/extra", engine.container,
                         "/app/dlopener", "libextra.so"])
        second = _run(["podman", "exec", "-d", "-e", "LD_LIBRARY_PATH=/opt/extra", engine.container, "/app/two"])
        assert second.returncode == 0, second.stderr
        pid = None
        for _ in range(50):
            pids = [p for p in _pids_in(engine) if p != engine.pid and _maps_lib(p)]
            if pids:
                pid = pids[0]
                break
            time.sleep(0.2)
        proc = None
    else:
        with_env = _run([*env_argv, "chroot", engine.root, "/app/dlopener", "libextra.so"])
        proc = subprocess.Popen([*env_argv, "chroot", engine.root, "/app/two"])
        pid = None
        for _ in range(50):
            if _maps_lib(proc.pid):
                pid = proc.pid
                break
            time.sleep(0.2)
    try:
        assert pid is not None, "the second /app/two did not start"
        without_env = engine.run_inside("/app/dlopener", "libextra.so")
        assert with_env.returncode == 0 and "OK" in with_env.stdout, (with_env.stdout, with_env.stderr)
        assert without_env.returncode == 1, without_env.stdout
        loads = seedance("check", "--pid", str(pid), "--then-dlopen", "libextra.so").stdout
        assert "then dlopen(libextra.so): loads" in loads, loads
        fails = seedance("check", "--pid", str(engine.pid), "--then-dlopen", "libextra.so").stdout
        assert "then dlopen(libextra.so): fails" in fails, fails
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        if proc is not None:
            proc.wait(timeout=10)


def _pids_in(engine):
    """Host pids of the processes in the podman container (podman top's hpid column)."""
    out = _run(["podman", "top", engine.container, "hpid"]).stdout.split()
    return [int(x) for x in out if x.isdigit()]


def _start_inside(engine, program):
    """A second process in the container (podman exec, or nsenter into the unshare
    engine's namespaces and root): (host pid, Popen or None) once it runs ``program``."""
    name = os.path.basename(program)
    if engine.name == "podman":
        started = _run(["podman", "exec", "-d", engine.container, program])
        assert started.returncode == 0, started.stderr
        proc = None
    else:  # into the namespace's mounts, pids and root, as podman exec does
        proc = subprocess.Popen(["nsenter", "-t", str(engine.pid), "-m", "-p", "-r", "-w", program])
    for _ in range(50):
        candidates = _pids_in(engine) if proc is None else _children(proc.pid)
        for pid in candidates:
            if pid == engine.pid:
                continue  # the container's own /app/two
            try:
                with open(f"/proc/{pid}/comm") as handle:
                    if handle.read().strip() == name[:15]:
                        return pid, proc
            except OSError:
                continue
        time.sleep(0.2)
    raise AssertionError(f"{program} did not start in the container")


def test_trace_tags_a_container_process_events_and_findings(engine, tmp_path):
    from seedance.trace import env as trace_env

    problem = trace_env.ebpf_problem()
    if problem:
        pytest.skip(f"eBPF unavailable: {problem}")
    # a program in the container that maps two CUDA runtime majors (cuda-runtime-mixed)
    app = f"/proc/{engine.pid}/root/app"
    source = tmp_path / "rt.c"
    source.write_text("int cudart_marker(void) { return 0; }\n")
    for major in (11, 12):
        gcc("-shared", "-fPIC", "-o", f"{app}/libcudart.so.{major}", str(source), f"-Wl,-soname,libcudart.so.{major}")
    main = tmp_path / "mixed.c"
    main.write_text("#include <unistd.h>\nint main(void) { for (;;) pause(); }\n")
    gcc("-o", f"{app}/mixed", str(main), f"-L{app}", "-Wl,--no-as-needed", "-l:libcudart.so.11",
        "-l:libcudart.so.12", "-Wl,-rpath,/app")
    pid, proc = _start_inside(engine, "/app/mixed")
    with open(f"/proc/{pid}/maps") as handle:  # the oracle: the program mapped both majors
        maps = handle.read()
    assert "/app/libcudart.so.11" in maps and "/app/libcudart.so.12" in maps
    stream = tmp_path / "events.jsonl"
    trace = subprocess.Popen(SEEDANCE + ["trace", "--json", "-o", str(stream), "--pid", str(pid), "--duration", "120"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        attached = ""
        while "probes attached" not in attached:
            line = trace.stderr.readline()
            assert line, f"trace ended before attaching: {attached}"
            attached += line
        os.kill(pid, signal.SIGKILL)  # its exit event ends the trace
        _out, rest = trace.communicate(timeout=120)
    finally:
        if trace.poll() is None:
            trace.kill()
            trace.wait()
        if proc is not None:
            proc.wait(timeout=10)
    assert "Traceback" not in rest, rest
    lines = [json.loads(line) for line in stream.read_text().splitlines() if line.startswith("{")]
    exits = [e for e in lines if e.get("event") == "exit" and e.get("pid") == pid]
    mixed = [e for e in lines if e.get("event") == "finding" and e.get("rule") == "cuda-runtime-mixed"]
    assert exits and mixed, lines
    if engine.name == "podman":
        assert exits[0]["container"]["id"] == engine.id
        assert exits[0]["container"]["name"] == engine.container
        assert mixed[0]["subject"]["container"]["id"] == engine.id
    else:  # a chroot without a container's cgroup: nothing invented
        assert "container" not in exits[0] and "container" not in mixed[0]["subject"]


def _bundle_bytes(path):
    import tarfile

    import zstandard

    with open(path, "rb") as handle:
        raw = zstandard.ZstdDecompressor().stream_reader(handle).read()
    with tarfile.open(fileobj=__import__("io").BytesIO(raw)) as tar:
        names = tar.getnames()
    return raw, names


def _keys(findings):
    return sorted((f["rule"], json.dumps(f["subject"], sort_keys=True)) for f in findings)


def test_bundle_captures_the_container_view_and_replays_the_same_findings(engine, tmp_path):
    root = f"/proc/{engine.pid}/root"
    inside = "INSIDE" + uuid.uuid4().hex[:10].upper()
    confd = f"{root}/etc/ld.so.conf.d"
    os.makedirs(confd, exist_ok=True)
    with open(f"{confd}/app.conf", "w") as handle:
        handle.write(f"/app\n# {inside}\n")
    # a config of the container that is an absolute link to a host-only file (the marker):
    # inside the root it names /tmp/hostsecret-..., which the container does not have
    os.symlink(engine.host_files[0], f"{confd}/zz-evil.conf")
    victim = f"{root}/app/libtwo.so"  # a finding to replay: a library deleted inside
    saved = open(victim, "rb").read()
    os.unlink(victim)
    bundle = tmp_path / "ct.tar.zst"
    try:
        live = seedance("check", "--pid", str(engine.pid), "--bundle", str(bundle), "--json", "--no-cache")
    finally:
        with open(victim, "wb") as handle:
            handle.write(saved)
        os.chmod(victim, 0o755)
        os.unlink(f"{confd}/zz-evil.conf")
        os.unlink(f"{confd}/app.conf")
    assert live.returncode == 0, live.stderr  # lib-deleted is a warning
    raw, names = _bundle_bytes(bundle)
    assert engine.marker.encode() not in raw  # no host file came in through a link
    assert inside.encode() in raw  # the container's own config did
    mine = f"processes/{engine.pid}/root/etc"
    assert f"{mine}/ld.so.conf.d/app.conf" in names, names
    # /etc/ld.so.conf, ld.so.cache and zz-evil.conf are links out of the root: not captured
    assert not [n for n in names if n in (f"{mine}/ld.so.conf", f"{mine}/ld.so.cache")
                or n.endswith("zz-evil.conf")], names
    about = json.loads(__import__("tarfile").open(fileobj=__import__("io").BytesIO(raw))
                       .extractfile(f"processes/{engine.pid}/process.json").read())
    if engine.name == "podman":
        assert about["container"]["id"] == engine.id
    replayed = seedance("check", "--from-bundle", str(bundle), "--json")
    assert replayed.returncode == live.returncode, replayed.stderr
    live_findings = json.loads(live.stdout)["findings"]
    assert [f for f in live_findings if f["rule"] == "lib-deleted"]
    assert _keys(json.loads(replayed.stdout)["findings"]) == _keys(live_findings)
    _no_marker(engine, live.stdout, live.stderr, replayed.stdout, replayed.stderr)


def test_one_view_per_container_outlives_the_process_it_was_read_through(engine):
    # two processes of one container share its root handle and identity (read once); the
    # handle stays usable after the process it was opened through has exited
    from seedance.collect import process

    pid, proc = _start_inside(engine, "/app/two")
    try:
        second = process.read_process(pid)
        views = process.root_views()
        handle = views.root(second)
    finally:
        os.kill(pid, signal.SIGKILL)
        if proc is not None:
            proc.wait(timeout=10)
    for _ in range(50):
        if not os.path.exists(f"/proc/{pid}/root/app"):
            break
        time.sleep(0.1)
    first = process.read_process(engine.pid)
    assert first.root_key == second.root_key is not None
    assert first.container is second.container
    assert views.root(first) is handle
    assert handle.stat("/app/libtwo.so").st_ino == os.stat(f"/proc/{engine.pid}/root/app/libtwo.so").st_ino
    assert views.resolver(first) is views.resolver(second)


def test_then_dlopen_of_a_link_to_a_host_only_library_fails_as_inside(engine):
    # /app/libevil.so -> /tmp/hostlib-MARK.so: a host file, nothing inside the root; the
    # program in the container cannot open it, and the model must not open the host's
    oracle = engine.run_inside("/app/dlopener", "/app/libevil.so")
    assert oracle.returncode == 1 and "cannot open shared object file" in oracle.stdout, oracle.stdout
    done = seedance("check", "--pid", str(engine.pid), "--then-dlopen", "/app/libevil.so")
    assert "then dlopen(/app/libevil.so): fails: /app/libevil.so: cannot open shared object file" in done.stdout, \
        done.stdout
    _no_marker(engine, done.stdout, done.stderr)
