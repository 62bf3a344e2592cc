"""seedance's traces, received by a real OTLP/HTTP receiver on loopback.

The receiver is a small http.server that decodes each POST /v1/traces body as an
ExportTraceServiceRequest with opentelemetry-proto (the protobuf classes collectors use),
so what is asserted is what a collector would store: the spans, their parent links, their
attributes and events, and the TRACEPARENT a wrapped program sees.
"""
from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2",
                    reason="opentelemetry-proto is not installed (requirements-test.txt)")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc not installed")
TIMEOUT = 90
PARENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN = "b7ad6b7169203331"


class Receiver:
    """An OTLP/HTTP traces endpoint on 127.0.0.1: every request decoded and kept."""

    def __init__(self, port: int = 0):
        self.requests: list = []
        self.connections = 0
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                message = ExportTraceServiceRequest()
                message.ParseFromString(body)
                receiver.requests.append((self.path, message))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def verify_request(self, request, client_address):
                receiver.connections += 1
                return True

        self.server = Server(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spans(self) -> list:
        """(resource attributes, span) for every span received."""
        out = []
        for path, message in self.requests:
            assert path == "/v1/traces"
            for resource_spans in message.resource_spans:
                resource = attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    out.extend((resource, span) for span in scope_spans.spans)
        return out

    def named(self, name: str):
        found = [span for _r, span in self.spans() if span.name == name]
        assert found, f"no span {name!r} among {[s.name for _r, s in self.spans()]}"
        return found


def attributes(kvs) -> dict:
    out = {}
    for kv in kvs:
        value = kv.value
        kind = value.WhichOneof("value")
        if kind == "array_value":
            out[kv.key] = [getattr(v, v.WhichOneof("value")) for v in value.array_value.values]
        else:
            out[kv.key] = getattr(value, kind) if kind else None
    return out


def clean_env(tmp_path: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "SEEDANCE_", "FAKECUDA_")) and k not in ("TRACEPARENT", "TRACESTATE",
                                                                                 "LD_PRELOAD", "LD_AUDIT")}
    env.update(HOME=str(tmp_path / "home"), XDG_CONFIG_HOME=str(tmp_path / "cfg"),
               XDG_STATE_HOME=str(tmp_path / "state"), SEEDANCE_RUNTIME_DIR=str(tmp_path / "rt"),
               SEEDANCE_CACHE="0")
    env.update(extra)
    return env


def traced(receiver: Receiver, tmp_path: Path, **extra) -> dict:
    return clean_env(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_SERVICE_NAME="seedance-test",
                     OTEL_RESOURCE_ATTRIBUTES="k8s.node.name=gpu-node-7,k8s.namespace.name=train", **extra)


def seedance(env, *args, cwd=None):
    """The installed console script, as a user runs it (for `run`: through the C launcher)."""
    return subprocess.run([str(BIN / "seedance"), *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=cwd)


def planted_trap(tmp: Path) -> Path:
    """A tree whose program needs a library that is gone: needed-unresolved, an error."""
    tree = tmp / "tree"
    tree.mkdir()
    (tmp / "gone.c").write_text("int gone(void) { return 1; }\n")
    subprocess.run([GCC, "-shared", "-fPIC", tmp / "gone.c", "-o", tmp / "libgone.so"], check=True)
    (tmp / "app.c").write_text("int gone(void);\nint main(void) { return gone(); }\n")
    subprocess.run([GCC, tmp / "app.c", "-o", tree / "app", f"-L{tmp}", "-lgone"], check=True)
    (tmp / "libgone.so").unlink()
    return tree


def hexid(raw: bytes) -> str:
    return raw.hex()


@needs_gcc
def test_check_is_one_trace_with_its_phases_findings_and_resource(tmp_path):
    tree = planted_trap(tmp_path)
    with Receiver() as receiver:
        proc = seedance(traced(receiver, tmp_path), "check", "--no-progress", tree)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    root, = receiver.named("seedance check")
    resource = next(r for r, s in receiver.spans() if s.name == "seedance check")
    assert resource["service.name"] == "seedance-test"          # OTEL_SERVICE_NAME
    assert resource["k8s.node.name"] == "gpu-node-7"            # OTEL_RESOURCE_ATTRIBUTES
    assert resource["host.name"] and resource["process.pid"] > 0
    assert root.parent_span_id == b""                           # no TRACEPARENT: a new trace
    attrs = attributes(root.attributes)
    assert attrs["process.exit.code"] == 1
    assert attrs["seedance.findings.error"] >= 1
    assert "needed-unresolved" in attrs["seedance.rule_ids"]
    for phase in ("walk", "resolve", "rules", "render"):
        span, = receiver.named(f"check.{phase}")
        assert span.trace_id == root.trace_id and span.parent_span_id == root.span_id, phase
        assert root.start_time_unix_nano <= span.start_time_unix_nano <= span.end_time_unix_nano \
            <= root.end_time_unix_nano
    walk, resolve, rules = (receiver.named(f"check.{p}")[0] for p in ("walk", "resolve", "rules"))
    assert walk.end_time_unix_nano <= resolve.start_time_unix_nano <= resolve.end_time_unix_nano \
        <= rules.start_time_unix_nano  # in the order the check runs them
    assert attributes(resolve.attributes)["seedance.check.roots"] == 1


def test_run_passes_its_context_to_the_program_and_continues_the_callers_trace(tmp_path):
    program = tmp_path / "show-env"
    program.write_text("#!/bin/sh\necho \"TRACEPARENT=$TRACEPARENT\"\nexit 3\n")
    program.chmod(0o755)
    env = {"TRACEPARENT": f"00-{PARENT_TRACE}-{PARENT_SPAN}-01", "TRACESTATE": "vendor=abc"}
    with Receiver() as receiver:
        proc = seedance(traced(receiver, tmp_path, **env), "run", "--", program)
    assert proc.returncode == 3, proc.stderr  # the program's exit code, as always
    seen = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    version, trace_id, span_id, flags = seen["TRACEPARENT"].split("-")
    assert (version, trace_id, flags) == ("00", PARENT_TRACE, "01")
    command, = receiver.named("seedance run")
    run, = receiver.named("run.program")
    # the caller's span -> seedance run -> run.program -> the program's TRACEPARENT
    assert hexid(command.trace_id) == PARENT_TRACE and hexid(command.parent_span_id) == PARENT_SPAN
    assert run.parent_span_id == command.span_id and run.trace_id == command.trace_id
    assert span_id == hexid(run.span_id)
    assert command.trace_state == "vendor=abc"
    attrs = attributes(run.attributes)
    assert attrs["process.exit.code"] == 3 and attrs["process.executable.path"] == str(program)
    assert attrs["process.pid"] > 0
    assert attributes(command.attributes)["process.exit.code"] == 3


@pytest.fixture(scope="module")
def fake_cuda(tmp_path_factory):
    """The fake driver and a client that calls it (as tests/shim builds them)."""
    if GCC is None:
        pytest.skip("gcc not installed")
    out = tmp_path_factory.mktemp("fakecuda")
    inc = ["-I", "/usr/local/cuda/include"] if Path("/usr/local/cuda/include/cuda.h").exists() else \
        ["-I", str(ROOT / "tests/shim/include")]
    subprocess.run([GCC, "-O2", "-fPIC", "-shared", "-fvisibility=hidden", *inc, "-Wl,-soname,libcuda.so.1",
                    "-Wl,-Bsymbolic", ROOT / "tests/fakecuda/fakecuda.c", "-o", out / "libcuda.so.1", "-pthread"],
                   check=True)
    subprocess.run([GCC, "-O2", "-DLINKED", *inc, ROOT / "tests/shim/sdtest.c", "-o", out / "sdtest_linked",
                    f"-L{out}", "-l:libcuda.so.1", "-pthread", "-ldl"], check=True)
    return out


def test_shim_events_become_events_of_the_run_span(tmp_path, fake_cuda):
    with Receiver() as receiver:
        env = traced(receiver, tmp_path, LD_LIBRARY_PATH=str(fake_cuda), FAKECUDA_LEDGER=str(tmp_path / "ledger"),
                     FAKECUDA_DEVICES="1")
        proc = seedance(env, "run", "--mem-limit", "2048", "--", fake_cuda / "sdtest_linked", "init", "ctx:0",
                        "alloc:1000", "alloc:4000", "free:all")
    assert proc.returncode == 0, proc.stderr
    run, = receiver.named("run.program")
    names = [event.name for event in run.events]
    assert "cuda.init" in names
    refused = [e for e in run.events if e.name == "seedance.allocation.refused"]
    assert len(refused) == 1 and attributes(refused[0].attributes)["seedance.allocation.bytes"] == 4000
    attrs = attributes(run.attributes)
    assert attrs["seedance.shim.events.alloc"] == 1 and attrs["seedance.shim.events.quota_refused"] == 1


@needs_gcc
def test_tail_sampling_keeps_failures_at_ratio_zero_and_follows_a_sampled_parent(tmp_path):
    tree = planted_trap(tmp_path)
    clean = tmp_path / "clean"
    clean.mkdir()
    shutil.copy("/bin/true", clean / "true")
    ratio_zero = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}
    with Receiver() as receiver:
        env = traced(receiver, tmp_path, **ratio_zero)
        assert seedance(env, "check", "--no-progress", clean).returncode == 0
        assert receiver.spans() == [] and receiver.connections == 0  # clean, not sampled: dropped
        assert seedance(env, "check", "--no-progress", tree).returncode == 1
        kept = {span.name for _r, span in receiver.spans()}
        assert "seedance check" in kept and "check.rules" in kept  # an error finding: the whole trace kept
        before = len(receiver.spans())
        assert seedance(env, "check", "--no-progress", "--bogus-flag").returncode == 2
        assert len(receiver.spans()) == before + 1  # a usage error is a failed command: kept
        sampled_parent = dict(env, TRACEPARENT=f"00-{PARENT_TRACE}-{PARENT_SPAN}-01")
        assert seedance(sampled_parent, "check", "--no-progress", clean).returncode == 0
        root = receiver.named("seedance check")[-1]
        assert hexid(root.trace_id) == PARENT_TRACE  # parent-based: the caller sampled it


@needs_gcc
def test_nothing_is_sent_and_no_sdk_is_loaded_without_the_variables(tmp_path):
    tree = planted_trap(tmp_path)
    try:  # the default OTLP/HTTP port: where an SDK with no endpoint configured would send
        receiver = Receiver(4318)
    except OSError:
        pytest.skip("127.0.0.1:4318 is in use here")
    with receiver:
        env = clean_env(tmp_path)
        assert seedance(env, "check", "--no-progress", tree).returncode == 1
        proc = seedance(env, "run", "--", "sh", "-c", "echo TRACEPARENT=${TRACEPARENT-unset}")
        assert proc.returncode == 0 and "TRACEPARENT=unset" in proc.stdout
        probe = ("import sys; from seedance.cli import main; code = main(['check', '--no-progress', sys.argv[1]]);"
                 "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
        loaded = subprocess.run([sys.executable, "-c", probe, str(tree)], env=env, capture_output=True, text=True,
                                timeout=TIMEOUT)
    assert receiver.connections == 0 and receiver.requests == []
    assert "opentelemetry" not in loaded.stdout, loaded.stdout


LEAKY_CONFIG = """\
plugins:
  - name: audio-encoder
    env:
      LD_LIBRARY_PATH: "$HOME/lib:/opt/x/lib"
    args:
      - "LD_LIBRARY_PATH=${CUDA_HOME}/lib64"
"""


def test_fix_is_plan_apply_verify_under_the_command_span(tmp_path):
    config = tmp_path / "cfg" / "seedance" / "plugins.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(LEAKY_CONFIG)
    with Receiver() as receiver:
        proc = seedance(traced(receiver, tmp_path), "fix", "env-leak", "--scope", "user")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "$${HOME}/lib" in config.read_text()  # the fix did its work
    command, = receiver.named("seedance fix")
    assert attributes(command.attributes)["seedance.subcommand"] == "env-leak"
    plan, apply, verify = (receiver.named(f"fix.{stage}")[0] for stage in ("plan", "apply", "verify"))
    for span in (plan, apply, verify):
        assert span.trace_id == command.trace_id and span.parent_span_id == command.span_id, span.name
        assert attributes(span.attributes)["seedance.fix.fixer"] == "env-leak"
        assert command.start_time_unix_nano <= span.start_time_unix_nano <= span.end_time_unix_nano \
            <= command.end_time_unix_nano
    assert plan.end_time_unix_nano <= apply.start_time_unix_nano and \
        apply.end_time_unix_nano <= verify.start_time_unix_nano  # in the order the fix runs them
    assert attributes(plan.attributes)["seedance.fix.files.planned"] == 1
    applied = attributes(apply.attributes)
    assert applied["seedance.fix.files.changed"] == 1
    history = seedance(clean_env(tmp_path), "fix", "history", "--json")
    assert applied["seedance.fix.journal.id"] in history.stdout
    verified = attributes(verify.attributes)
    assert verified["seedance.fix.verify.result"] == "clean" and verified["seedance.fix.findings.remaining"] == 0
    # the check the plan runs, and the one verify runs, nest under their stage
    walks = receiver.named("check.walk")
    assert {w.parent_span_id for w in walks} == {plan.span_id, verify.span_id}


class TracedAgent:
    """`seedance agent run` checking TREE every second, its traces sent to RECEIVER."""

    def __init__(self, receiver: Receiver, base: Path, service: str, tree: Path, **extra):
        base.mkdir()
        (base / "rt").mkdir(mode=0o700)
        env = dict(traced(receiver, base, **extra), OTEL_SERVICE_NAME=service)
        self.log_path = base / "agent.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([str(BIN / "seedance"), "agent", "run", "--probes", "off", "--scan-interval", "1s",
                                      "--gc-interval", "1s", "--scan-path", str(tree)],
                                     env=env, stdout=subprocess.DEVNULL, stderr=self.log)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.log_path.read_text()


def _spans_of(receiver: Receiver, service: str, name: str) -> list:
    return [(resource, span) for resource, span in receiver.spans()
            if resource.get("service.name") == service and span.name == name]


@needs_gcc
def test_the_agent_sends_each_scan_and_gc_pass_as_a_trace_and_keeps_failed_scans_at_ratio_zero(tmp_path):
    import socket
    import time

    trap = planted_trap(tmp_path)
    clean = tmp_path / "clean"
    clean.mkdir()
    shutil.copy("/bin/true", clean / "true")
    ratio_zero = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}
    with Receiver() as receiver:
        agents = [TracedAgent(receiver, tmp_path / "all", "agent-all", clean),
                  TracedAgent(receiver, tmp_path / "none", "agent-sampled-out", trap, **ratio_zero)]
        try:
            deadline = time.monotonic() + TIMEOUT
            while time.monotonic() < deadline and not (
                    _spans_of(receiver, "agent-all", "agent.scan") and _spans_of(receiver, "agent-all", "agent.gc")
                    and len(_spans_of(receiver, "agent-sampled-out", "agent.scan")) >= 2):
                assert all(agent.proc.poll() is None for agent in agents), [a.log_path.read_text() for a in agents]
                time.sleep(0.3)
        finally:
            logs = [agent.stop() for agent in agents]
    assert "Traceback" not in "".join(logs), logs
    for name in ("agent.scan", "agent.gc"):
        found = _spans_of(receiver, "agent-all", name)
        assert found, (name, [s.name for _r, s in receiver.spans()], logs)
        resource, span = found[0]
        assert resource["host.name"] == socket.gethostname() and resource["k8s.node.name"] == "gpu-node-7"
        assert span.parent_span_id == b""  # each pass is a trace of its own
    scan = attributes(_spans_of(receiver, "agent-all", "agent.scan")[0][1].attributes)
    assert scan["seedance.findings.error"] == 0 and scan["seedance.check.duration_s"] >= 0
    # sampled at ratio 0: the healthy GC passes are dropped, every scan with an error finding kept
    assert _spans_of(receiver, "agent-sampled-out", "agent.gc") == []
    kept = _spans_of(receiver, "agent-sampled-out", "agent.scan")
    assert len(kept) >= 2 and len({span.trace_id for _r, span in kept}) == len(kept)
    for resource, span in kept:
        attrs = attributes(span.attributes)
        assert attrs["seedance.findings.error"] >= 1 and "needed-unresolved" in attrs["seedance.rule_ids"]
        assert resource["host.name"] == socket.gethostname()
