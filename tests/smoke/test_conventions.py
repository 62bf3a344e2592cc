"""The conventions users expect (issue 16, section 3), each run as a user would: alias usage
lines and --version, completion scripts exercised by a real bash, man pages rendered by
man(1), check --pid A B, colour and NO_COLOR, grouped findings and --verbose, human sizes,
progress on stderr only, the agent's lifecycle without a user manager, and plugin store
safety on the real example plugins."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, load_example_builder, run_cli

ALIASES = {"seedance-check": "check", "seedance-fix": "fix", "seedance-plugin": "plugin",
           "seedance-bench": "bench", "seedance-profiler": "profiler"}


def _run(argv, env=None, **kw):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, errors="replace",
                          env=full, timeout=kw.pop("timeout", 120), **kw)


# -- aliases -------------------------------------------------------------------------------------
@pytest.mark.parametrize("alias,command", sorted(ALIASES.items()))
def test_alias_usage_line_names_the_alias_alone_and_version_works(alias, command):
    proc = _run([BIN / alias, "--help"])
    assert proc.returncode == 0, proc.stderr
    usage = proc.stdout.splitlines()[0]
    assert usage.startswith(f"usage: {alias} "), usage
    assert not usage.startswith(f"usage: {alias} {command}"), usage
    version = _run([BIN / alias, "--version"])
    assert version.returncode == 0 and version.stdout == _run([BIN / "seedance", "--version"]).stdout


def test_alias_usage_copied_runs(tmp_path):
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "SEEDANCE_PLUGIN_PATH": ""}
    nested = _run([BIN / "seedance-plugin", "list", "--help"], env=env).stdout.splitlines()[0]
    assert nested.startswith("usage: seedance-plugin list"), nested
    # what the usage line says runs; the old doubled spelling is a usage error
    assert _run([BIN / "seedance-plugin", "list"], env=env).returncode == 0
    assert _run([BIN / "seedance-plugin", "plugin", "list"], env=env).returncode == 2


# -- completion and man pages ------------------------------------------------------------------
def _bash_complete(script: str, words: list, function: str) -> list:
    probe = (f"{script}\nCOMP_WORDS=({' '.join(words)}); COMP_CWORD={len(words) - 1}; "
             f"COMP_LINE='{' '.join(words)}'; COMP_POINT=${{#COMP_LINE}}; {function}; "
             "printf '%s\\n' \"${COMPREPLY[@]}\"")
    proc = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_bash_completion_completes_commands_and_flags():
    script = _run([BIN / "seedance", "completion", "bash"]).stdout
    assert "check" in _bash_complete(script, ["seedance", "ch"], "_shtab_seedance")
    assert "--pid" in _bash_complete(script, ["seedance", "check", "--pi"], "_shtab_seedance")
    alias = _run([BIN / "seedance", "completion", "bash", "--prog", "seedance-plugin"]).stdout
    assert {"install", "uninstall"} <= set(_bash_complete(alias, ["seedance-plugin", ""], "_shtab_seedance_plugin"))


def test_installed_completion_and_man_pages(tmp_path):
    proc = _run([BIN / "python", "-m", "seedance.commands.completion_files", "install", tmp_path])
    assert proc.returncode == 0, proc.stderr
    share = tmp_path / "share"
    bash = share / "bash-completion" / "completions" / "seedance-check"
    assert "--pid" in _bash_complete(bash.read_text(), ["seedance-check", "--pi"], "_shtab_seedance_check")
    zsh = share / "zsh" / "site-functions" / "_seedance"
    assert zsh.read_text().startswith("#compdef seedance")
    if shutil.which("zsh"):
        assert _run(["zsh", "-n", zsh]).returncode == 0
    page = share / "man" / "man1" / "seedance-check.1"
    if not shutil.which("man"):
        pytest.skip("man(1) is not installed (Makefile APT_PACKAGES has man-db)")
    rendered = _run(["man", "-l", page], env={"MANPAGER": "cat", "PAGER": "cat", "MANWIDTH": "100"})
    assert rendered.returncode == 0, rendered.stderr
    text = re.sub(r".\x08", "", rendered.stdout)
    assert "seedance-check" in text and "--pid" in text and "--color" in text


# -- check ---------------------------------------------------------------------------------------
def test_check_takes_several_pids_after_one_flag():
    children = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    try:
        proc = run_cli("check", "--json", "--no-progress", "--pid", children[0].pid, children[1].pid)
        assert proc.returncode in (0, 1), proc.stderr
        assert json.loads(proc.stdout)["stats"]["processes"] == 2
    finally:
        for child in children:
            child.kill()
            child.wait()


@pytest.fixture(scope="module")
def undefined_tree(tmp_path_factory):
    """Seven real libraries, each needing symbols nothing defines: seven symbol-undefined
    rows under --strict (one per library), 14 findings in all."""
    if not shutil.which("gcc"):
        pytest.skip("gcc not found")
    root = tmp_path_factory.mktemp("undefined")
    for index in range(7):
        source = root / f"u{index}.c"
        source.write_text(f"extern int absent_a{index}(void); extern int absent_b{index}(void);\n"
                          f"int use{index}(void) {{ return absent_a{index}() + absent_b{index}(); }}\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(root / f"libu{index}.so"), str(source)], check=True)
        source.unlink()
    return root


def test_grouped_summary_and_verbose(undefined_tree):
    summary = run_cli("check", "--strict", "--no-progress", "--color=never", undefined_tree)
    verbose = run_cli("check", "--strict", "--no-progress", "--color=never", "--verbose", undefined_tree)
    full = json.loads(run_cli("check", "--strict", "--json", undefined_tree).stdout)
    undefined = [f for f in full["findings"] if f["rule"] == "symbol-undefined"]
    assert len(undefined) == 14  # the JSON keeps every finding
    rows = [line for line in summary.stdout.splitlines() if "symbol-undefined" in line]
    assert len(rows) == 4 and "4 more symbol-undefined" in rows[-1]  # 3 shown, 4 counted
    verbose_rows = [line for line in verbose.stdout.splitlines() if "symbol-undefined" in line]
    assert len(verbose_rows) == 14
    for index in range(7):
        assert f"absent_a{index}" in verbose.stdout


def test_colour_follows_flag_terminal_and_no_color(undefined_tree):
    always = run_cli("check", "--strict", "--no-progress", "--color=always", undefined_tree, env={"NO_COLOR": "1"})
    assert "\x1b[33mWARN" in always.stdout  # a command-line choice beats NO_COLOR (no-color.org)
    auto_pipe = run_cli("check", "--strict", "--no-progress", undefined_tree)
    assert "\x1b[" not in auto_pipe.stdout  # auto on a pipe: plain
    never = run_cli("check", "--strict", "--no-progress", "--color=never", undefined_tree)
    assert "\x1b[" not in never.stdout
    from seedance.render.text import use_color

    class Terminal:
        def isatty(self):
            return True
    saved = {k: os.environ.get(k) for k in ("NO_COLOR", "TERM")}
    try:
        os.environ["TERM"] = "xterm"
        os.environ.pop("NO_COLOR", None)
        assert use_color("auto", Terminal())
        os.environ["NO_COLOR"] = "1"
        assert not use_color("auto", Terminal())
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_sizes_human_in_the_table_exact_in_json():
    from seedance.model.report import Finding, Report
    from seedance.render.text import report_json, table

    report = Report(command="check")
    held = 3 * 1024 * 1024 * 1024 + 512 * 1024 * 1024
    report.add([Finding("handle-leak", "error", "handle-leak", "L4", {"pid": 7},
                        f"pid 7 ended holding {held} bytes on device 0", {"bytes": held})])
    text = table(report)
    assert "3.5 GiB" in text and str(held) not in text
    document = json.loads(report_json(report))
    assert document["findings"][0]["evidence"]["bytes"] == held
    assert str(held) in document["findings"][0]["message"]


def test_progress_on_stderr_only_when_asked_on_a_pipe(undefined_tree):
    quiet = run_cli("check", "--json", undefined_tree)
    assert "checking" not in quiet.stderr
    shown = run_cli("check", "--json", "--progress", undefined_tree)
    assert re.search(r"^checking: 7/7$", shown.stderr, re.M), shown.stderr
    assert "\r" not in shown.stderr  # plain lines on a pipe
    json.loads(shown.stdout)  # stdout stays the JSON alone


# -- agent lifecycle ----------------------------------------------------------------------------
def test_agent_status_reload_stop_uninstall_without_a_user_manager(tmp_path):
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    env = {"HOME": str(tmp_path / "home"), "XDG_RUNTIME_DIR": str(runtime),
           "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "XDG_STATE_HOME": str(tmp_path / "state")}
    down = run_cli("agent", "status", env=env)
    assert down.returncode == 3 and "inactive" in down.stdout
    log = open(tmp_path / "agent.log", "w")
    agent = subprocess.Popen([str(BIN / "seedance"), "agent", "run", "--no-scan", "--probes", "off"],
                             env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while run_cli("agent", "status", env=env).returncode != 0:
            assert agent.poll() is None and time.monotonic() < deadline, (tmp_path / "agent.log").read_text()
            time.sleep(0.3)
        status = json.loads(run_cli("agent", "status", "--json", env=env).stdout)
        assert status["running"] and status["pid"] == agent.pid
        assert run_cli("agent", "reload", env=env).returncode == 0
        deadline = time.monotonic() + 30
        while '"event":"reloaded"' not in (tmp_path / "agent.log").read_text():
            assert time.monotonic() < deadline, "no reloaded event after agent reload"
            time.sleep(0.2)
        stop = run_cli("agent", "stop", env=env)
        assert stop.returncode == 0 and f"pid {agent.pid}" in stop.stdout
        assert agent.wait(timeout=5) == 0  # a clean stop, not a kill
        assert run_cli("agent", "status", env=env).returncode == 3
        assert run_cli("agent", "stop", env=env).returncode == 0  # as systemctl stop: already stopped
    finally:
        if agent.poll() is None:
            agent.send_signal(signal.SIGKILL)
            agent.wait()
        log.close()
    assert run_cli("agent", "install", "--user", "--no-enable", env=env).returncode == 0
    unit = tmp_path / "cfg" / "systemd" / "user" / "seedance-agent.service"
    assert unit.exists()
    removed = run_cli("agent", "uninstall", "--user", env=env)
    assert removed.returncode == 0 and not unit.exists()
    # the help must not advise a command that finds nothing (the agent is a python process)
    help_text = run_cli("agent", "--help").stdout
    assert "$(pidof seedance)" not in help_text and "seedance agent reload" in help_text


# -- plugin store safety ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built_plugins(tmp_path_factory):
    if not shutil.which("gcc"):
        pytest.skip("gcc not found: the example plugins are built from C")
    out = tmp_path_factory.mktemp("examples")
    builder = load_example_builder()
    for name in ("legacy-audio-encoder", "audio-encoder-v2.0.5", "dsp-kernels-v1.1.0", "dsp-kernels-v2.0.4",
                 "speech-pipeline-v1.0.0"):
        builder.build(name, out)
    return out


def test_uninstall_of_a_needed_dependency_refuses_naming_dependents(built_plugins, tmp_path):
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "SEEDANCE_PLUGIN_PATH": str(built_plugins)}
    assert run_cli("plugin", "install", "audio-encoder-v2.0.5", env=env).returncode == 0  # dsp-kernels 2.0.4
    assert run_cli("plugin", "install", "speech-pipeline-v1.0.0", env=env).returncode == 0  # dsp-kernels 1.1.0
    store = tmp_path / "data" / "seedance" / "plugins" / "dsp-kernels"
    assert sorted(p.name for p in store.iterdir()) == ["1.1.0", "2.0.4"]
    refused = run_cli("plugin", "uninstall", "dsp-kernels", env=env)
    assert refused.returncode == 2
    assert "audio-encoder 2.0.5" in refused.stderr and "speech-pipeline 1.0.0" in refused.stderr
    assert sorted(p.name for p in store.iterdir()) == ["1.1.0", "2.0.4"]  # nothing removed
    # removing 2.0.4 alone: speech-pipeline (<2) keeps 1.1.0, but audio-encoder (<3) also still
    # resolves to 1.1.0, so nothing breaks and it goes through
    assert run_cli("plugin", "uninstall", "dsp-kernels", "--version", "2.0.4", env=env).returncode == 0
    forced = run_cli("plugin", "uninstall", "dsp-kernels", "--force", env=env)
    assert forced.returncode == 0 and "warning: still installed and depending on dsp-kernels" in forced.stdout
    assert not store.exists()


def test_install_prints_waste_traps_and_strict_refuses(built_plugins, tmp_path):
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "SEEDANCE_PLUGIN_PATH": str(built_plugins)}
    strict = run_cli("plugin", "install", "legacy-audio-encoder", "--strict", env=env)
    assert strict.returncode == 1 and "waste trap" in strict.stderr
    assert not (tmp_path / "data" / "seedance" / "plugins" / "legacy-audio-encoder").exists()
    plain = run_cli("plugin", "install", "legacy-audio-encoder", env=env)
    assert plain.returncode == 0
    verify = json.loads(run_cli("plugin", "verify", "legacy-audio-encoder", "--report-json", "-", env=env).stdout)
    rules = {f["rule"] for f in verify["waste_traps"]}
    assert rules and all(f"waste trap {rule}:" in plain.stdout for rule in rules)
    clean = run_cli("plugin", "install", "audio-encoder-v2.0.5", "--strict", env=env)
    assert clean.returncode == 0 and "waste trap" not in clean.stdout


def test_builtin_examples_are_the_default_source(tmp_path):
    builtin = Path(sys.prefix) / "share" / "seedance" / "plugins"
    if not builtin.is_dir():
        pytest.fail("the built-in example plugins are missing: run `make install`")
    env = {"XDG_DATA_HOME": str(tmp_path / "data")}
    full = {k: v for k, v in os.environ.items() if k != "SEEDANCE_PLUGIN_PATH"}
    full.update(env)
    proc = subprocess.run([str(BIN / "seedance"), "plugin", "install", "audio-encoder-v2.0.5",
                           "--affinity=npu0", "--batch-policy=adaptive"], capture_output=True, text=True, env=full)
    assert proc.returncode == 0, proc.stderr
    assert f"installed plugin audio-encoder 2.0.5" in proc.stdout
    record = json.loads((tmp_path / "data" / "seedance" / "plugins" / "audio-encoder" / "2.0.5"
                         / ".seedance-install.json").read_text())
    assert record["source"].startswith(str(builtin))
    # set, even empty, the variable replaces the built-in source
    empty = subprocess.run([str(BIN / "seedance"), "plugin", "install", "dsp-kernels"], capture_output=True,
                           text=True, env={**full, "SEEDANCE_PLUGIN_PATH": ""})
    assert empty.returncode == 2 and "no plugin by that name" in empty.stderr


def test_fix_scan_and_profiler_show_progress_when_asked(undefined_tree, tmp_path):
    relink = run_cli("fix", "cuda-mismatch", "--auto-relink", "--dry-run", "--progress", undefined_tree)
    assert relink.returncode == 0, relink.stderr
    assert re.search(r"^checking: 7/7$", relink.stderr, re.M), relink.stderr
    assert "checking" not in run_cli("fix", "cuda-mismatch", "--auto-relink", "--dry-run", undefined_tree).stderr
    events = tmp_path / "ev.jsonl"
    events.write_text('{"ev":"device","dev":0,"base":0,"capacity":1048576}\n'
                      '{"t":0.001,"ev":"alloc","dev":0,"addr":0,"size":4096,"library":"libfoo.so"}\n'
                      '{"t":0.002,"ev":"free","dev":0,"addr":0}\n')
    profiled = run_cli("profile", "memory", "--from-trace", events, "--progress", "--json")
    assert profiled.returncode in (0, 1), profiled.stderr
    assert re.search(r"^profiling .*ev\.jsonl: done in [0-9.]+ s$", profiled.stderr, re.M), profiled.stderr
    json.loads(profiled.stdout)


# -- sizes and durations: one grammar --------------------------------------------------------------
# The same words through both entry points of `seedance run --mem-limit`: Python's
# (seedance.run.limits, which reads sizes with seedance.model.units) and the C launcher's own
# parse_size.  Each value or error line must be the same, byte for byte.  (An empty
# --mem-limit is no limit in both, before any size is read.)
MEM_LIMITS = [
    "8Gi", "512Mi", "4Ki", "1Ti", "1Ei", "15Ei", "16Ei", "1G", "1.5G", "500M", "64k", "1.5Gi", "4096", "1",
    "8GiB", "500MB", "100B", "1.5", "0.1", ".5Ki", "5.", "0.0000001Gi", " 8Gi ", "18446744073709551615",
    "18446744073709551616", "99999999999999999999999Ki", "1.000000000000000001Ei", "1.0000000000000000001",
    "8Gi,1:4Gi", "1:1.5G", "1: 2Mi", " 3 :1Ki,0:1", "8G,4G", "16:1G", "x:1G", "²:1G", "1:",
    ",", "G", ".", "-1G", "+1G", "8X", "1K", "8g", "2t", "8 Gi", "1e9", "1_000", "inf",
    "512m", "512mB", "1.5m", "0", "0Gi", "0.0", "１２", "8Gi8", "1.2.3",
]


def test_mem_limit_sizes_read_the_same_in_python_and_in_the_launcher():
    from seedance import shim
    from seedance.cli import error_text
    from seedance.model.errors import UsageError
    from seedance.run.limits import parse_mem_limit

    try:
        launcher = shim.launcher_path()
    except shim.NotAvailable as exc:
        pytest.skip(str(exc))
    printenv = shutil.which("printenv")
    for text in MEM_LIMITS:
        try:
            expected, code = parse_mem_limit(text)[0] + "\n", 0
        except UsageError as exc:
            expected, code = error_text(str(exc)) + "\n", 2
        proc = subprocess.run([str(launcher), "--mem-limit", text, "--", printenv, "SEEDANCE_MEM_LIMIT"],
                              capture_output=True, text=True, timeout=30)
        got = proc.stdout if proc.returncode == 0 else proc.stderr
        assert (proc.returncode, got) == (code, expected), text


def test_a_bad_duration_or_size_is_one_line_naming_the_grammar(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "XDG_STATE_HOME": str(tmp_path / "state")}
    for argv, words in ((["trace", "--duration", "1m30", "--", "true"], "--duration: '1m30' is not a duration"),
                        (["quota", "watch", "--interval", "2x"], "--interval: '2x' is not a duration"),
                        (["profile", "memory", "--page-size", "4K", "--from-trace", "/dev/null"],
                         "--page-size: '4K' is not a size"),
                        (["run", "--mem-limit", "512m", "--", "true"], "m is milli")):
        proc = _run([BIN / "python", "-m", "seedance", *argv], env=env)
        assert proc.returncode == 2 and words in proc.stderr, (argv, proc.stderr)
        assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("seedance: error: "), proc.stderr


# -- exit codes as systemctl's ---------------------------------------------------------------------
def test_status_exits_3_when_no_agent_runs(tmp_path):
    """`systemctl status` of an inactive unit exits 3 (LSB "program is not running"): so does
    `seedance status` with no socket and with a socket nobody listens on; the line says so."""
    import socket

    runtime = tmp_path / "rt"
    (runtime / "seedance").mkdir(parents=True)
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    for args in (["status"], ["status", "--json"]):
        proc = _run([BIN / "seedance", *args], env=env)
        assert proc.returncode == 3, proc.stderr
        assert proc.stdout == "" and proc.stderr.startswith("seedance: no agent running"), proc.stderr
        assert len(proc.stderr.splitlines()) == 1
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(runtime / "seedance" / "agent.sock"))   # bound, never listening: an agent that died
    try:
        proc = _run([BIN / "seedance", "status"], env=env)
    finally:
        stale.close()
    assert proc.returncode == 3 and "stale status socket" in proc.stderr, proc.stderr


# -- typos -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,suggestion", [
    (["seedance", "chek"], "did you mean 'check'?"),
    (["seedance", "quota", "lst"], "did you mean 'list'?"),
    (["seedance", "trace", "--backend", "ebfp"], "did you mean 'ebpf'?"),
    (["seedance", "check", "--jsno"], "did you mean --json?"),
    (["seedance", "quota", "watch", "--intervall", "2s"], "did you mean --interval?"),
    (["seedance-check", "--jsno"], "did you mean --json?"),
])
def test_a_mistyped_command_or_flag_names_the_closest(argv, suggestion):
    proc = _run([BIN / argv[0], *argv[1:]])
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.startswith("seedance: error: ") and proc.stderr.rstrip().endswith(suggestion), proc.stderr
    assert len(proc.stderr.splitlines()) == 1


def test_a_word_like_no_command_keeps_the_list():
    proc = _run([BIN / "seedance", "zzz"])
    assert proc.returncode == 2 and "choose from 'check'" in proc.stderr and "did you mean" not in proc.stderr


# -- man pages: the sections man-pages(7) names, read by man -l and lexgrog ------------------------
def test_every_man_page_has_name_exit_status_environment_and_files(tmp_path):
    from seedance.commands.completion_files import ALIASES

    if not (shutil.which("man") and shutil.which("lexgrog")):
        pytest.skip("man-db (man, lexgrog) is not installed (Makefile APT_PACKAGES has man-db)")
    proc = _run([BIN / "python", "-m", "seedance.commands.completion_files", "install", tmp_path])
    assert proc.returncode == 0, proc.stderr
    pages = tmp_path / "share" / "man" / "man1"
    for prog in ("seedance", *ALIASES):
        page = pages / f"{prog}.1"
        rendered = _run(["man", "-P", "cat", "-l", page], env={"MANWIDTH": "80", "MAN_KEEP_FORMATTING": ""})
        assert rendered.returncode == 0 and rendered.stderr == "", (prog, rendered.stderr)
        text = re.sub(r".\x08", "", rendered.stdout)
        headings = [line for line in text.splitlines() if re.fullmatch(r"[A-Z][A-Z ]+", line)]
        for heading in ("NAME", "SYNOPSIS", "EXIT STATUS", "ENVIRONMENT", "FILES"):
            assert heading in headings, (prog, headings)
        assert headings.index("EXIT STATUS") < headings.index("ENVIRONMENT") < headings.index("FILES")
        exit_status = text.split("\nEXIT STATUS\n", 1)[1].split("\nENVIRONMENT\n", 1)[0]
        assert re.search(r"^ +2 +Usage +error", exit_status, re.M), exit_status
        assert "NO_COLOR" in text and "XDG_CONFIG_HOME" in text and "agent.yaml" in text
        assert all(len(line) <= 80 for line in text.splitlines() if "http" not in line), prog
        whatis = _run(["lexgrog", page])
        assert whatis.returncode == 0, whatis.stderr
        assert re.search(rf'"{re.escape(prog)} - \S.+"', whatis.stdout), whatis.stdout
    main = re.sub(r".\x08", "", _run(["man", "-P", "cat", "-l", pages / "seedance.1"], env={"MANWIDTH": "80"}).stdout)
    assert re.search(r"^ +3 +seedance +status", main, re.M)       # as systemctl status


# -- tables, not Python reprs ----------------------------------------------------------------------
QUOTA_POLICY = """\
apiVersion: seedance/v1
kind: WorkloadQuotaPolicy
metadata: {name: enc}
spec:
  workloadSelector:
    matchLabels: {app: encoder}
  quota: {memory: 1.5Gi}
"""


def test_quota_list_is_a_table_and_watch_says_what_it_watches(tmp_path):
    (tmp_path / "cfg" / "seedance" / "quota").mkdir(parents=True)
    (tmp_path / "cfg" / "seedance" / "quota" / "enc.yaml").write_text(QUOTA_POLICY)
    state = tmp_path / "state" / "seedance" / "quota"
    state.mkdir(parents=True)
    # a workload whose cgroup is gone: its pids and limits are empty, and read as such
    (state / "state.json").write_text(json.dumps({"workloads": {"4242-1": {
        "policy": "enc", "bursting": False, "cpu_millicores": None,
        "placement": {"backend": "cgroup-v2", "groups": {"cpu": str(tmp_path / "gone")}, "original": {}}}}}))
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "XDG_STATE_HOME": str(tmp_path / "state")}
    listing = _run([BIN / "seedance", "quota", "list"], env=env)
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0] == "enc: selects app=encoder; memory 1536Mi", lines
    assert lines[1].split() == ["WORKLOAD", "PIDS", "STATE", "CPU", "LIMITS"], lines
    assert lines[2].split() == ["4242-1", "-", "at", "quota", "-", "-"], lines
    assert not re.search(r"[\[\]{}]|None", listing.stdout), listing.stdout
    watch = _run([BIN / "seedance", "quota", "watch", "--interval", "100ms", "--duration", "300ms"], env=env)
    assert watch.returncode == 0, watch.stderr
    said = watch.stderr.splitlines()[0]
    assert said.startswith("seedance quota watch: 1 policy (enc), every 100ms, for 300ms, enforced with "), said
    assert re.search(r"enforced with (cgroup-v1|cgroup-v2|systemd-scope)$", said), said
