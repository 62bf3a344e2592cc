"""Bounded YAML everywhere (issue 10 item 3): alias bombs, nesting thousands deep, non-UTF-8.

Every command that reads YAML is run for real on each hostile file, under an address-space
limit (RLIMIT_AS) far below what expanding the bomb needs and a subprocess timeout: it must
end with exactly one `seedance: error:` line and exit 2 (a host `check`, which reads the
config directory on its own, notes the file as skipped and carries on).  A hang, a
traceback or memory growth fails the test.
"""
from __future__ import annotations

import os
import resource
import string
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from seedance.files import yamlio
from seedance.model.errors import BadInput
from tests.conftest import BIN

AS_LIMIT = 768 << 20   # a whole host check runs in 512 MiB of address space on this machine
TIMEOUT = 90


def alias_bomb() -> str:
    """340 bytes: a list of nine scalars, then nine lines each a list of nine aliases of the
    line before: 9**10 scalars to anything that walks it."""
    names = string.ascii_lowercase[:10]
    lines = [f"{names[0]}: &{names[0]} [" + ",".join(["x"] * 9) + "]"]
    lines += [f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]" for prev, cur in zip(names, names[1:])]
    return "\n".join(lines)


def deep_block(depth: int = 3000) -> str:
    return "".join("  " * i + "- \n" for i in range(depth))


def deep_flow(depth: int = 5000) -> str:
    return "[" * depth + "]" * depth


PAYLOADS = {
    "alias-bomb": alias_bomb().encode(),
    "deep-block": deep_block().encode(),
    "deep-flow": deep_flow().encode(),
    "deep-mapping": "".join("  " * i + f"k{i}:\n" for i in range(3000)).encode(),
    "not-utf8": b"rules:\n  - id: caf\xe9\n    title: \xff\xfe\n",
}


def test_the_bomb_is_the_one_the_issue_describes():
    text = alias_bomb()
    assert len(text.encode()) == 340
    # PyYAML itself builds it by sharing (cheap); what hangs is everything that walks it.
    assert text.count("*") == 81


@pytest.mark.parametrize("name", ["alias-bomb", "deep-block", "deep-mapping"])
def test_loader_refuses_with_one_line(name):
    text = PAYLOADS[name].decode()
    with pytest.raises(BadInput) as info:
        yamlio.load(text, "x.yaml")
    assert "\n" not in str(info.value) and str(info.value).startswith("x.yaml:")
    with pytest.raises(BadInput):
        yamlio.roundtrip_load(YAML(typ="rt"), text, "x.yaml")
    with pytest.raises(BadInput):
        yamlio.compose(text, "x.yaml")


def test_recursive_alias_and_oversized_input_are_refused(tmp_path):
    with pytest.raises(BadInput, match="contains it"):
        yamlio.load("a: &a [1, *a]\n", "r.yaml")
    with pytest.raises(BadInput, match="contains it"):
        yamlio.roundtrip_load(YAML(typ="rt"), "a: &a [1, *a]\n", "r.yaml")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# pad\n" * ((yamlio.MAX_BYTES // 6) + 1))
    with pytest.raises(BadInput, match="larger than"):
        yamlio.read_text(big)


def test_an_alias_into_deep_nesting_counts_its_depth():
    inner = "[" * 40 + "1" + "]" * 40
    text = f"a: &a {inner}\nb: " + "[" * 40 + "*a" + "]" * 40 + "\n"
    yamlio.load(f"a: &a {inner}\n", "ok.yaml")  # 41 levels: fine on its own
    with pytest.raises(BadInput, match="alias"):
        yamlio.load(text, "deep.yaml")


def test_real_aliases_within_the_caps_still_load():
    # Four levels of nine aliases: 9**4 leaves, well inside the caps, and built as written.
    names = "abcde"
    lines = ["a: &a [" + ",".join(str(i) for i in range(9)) + "]"]
    lines += [f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]" for prev, cur in zip(names, names[1:])]
    doc = yamlio.load("\n".join(lines), "ok.yaml")

    def leaves(node):
        return sum(leaves(n) for n in node) if isinstance(node, list) else 1
    assert leaves(doc["e"]) == 9 ** 5 and doc["e"][3][2][1][0] == list(range(9))
    rt = yamlio.roundtrip_load(YAML(typ="rt"), "base: &b {x: 1}\nuse: *b\n", "rt.yaml")
    assert rt["use"]["x"] == 1


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def _run(args, env, cwd=None):
    exe = BIN / "seedance"
    cmd = [str(exe), *map(str, args)] if exe.exists() else [sys.executable, "-m", "seedance", *map(str, args)]
    full = {**os.environ, **env}
    return subprocess.run(cmd, capture_output=True, env=full, timeout=TIMEOUT, preexec_fn=_limited, cwd=cwd)


def _one_error_line(proc):
    err = proc.stderr.decode("utf-8", "replace")
    lines = err.strip().splitlines()
    assert proc.returncode == 2, err
    assert len(lines) == 1 and lines[0].startswith("seedance: error:"), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def home(tmp_path):
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
           "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_STATE_HOME": str(tmp_path / "state"),
           "XDG_RUNTIME_DIR": str(tmp_path / "run"), "SEEDANCE_PLUGIN_PATH": ""}
    for value in env.values():
        if value:
            Path(value).mkdir(parents=True, exist_ok=True)
    return tmp_path, env


def _site_args(site: str, tmp_path: Path, env: dict, payload: bytes) -> list:
    cfg = Path(env["XDG_CONFIG_HOME"]) / "seedance"
    cfg.mkdir(parents=True, exist_ok=True)
    if site == "check FILE":
        (tmp_path / "conf.yaml").write_bytes(payload)
        return ["check", tmp_path / "conf.yaml"]
    if site == "fix env-leak":
        (tmp_path / "conf.yaml").write_bytes(payload)
        return ["fix", "env-leak", "--scope", tmp_path / "conf.yaml", "--dry-run"]
    if site == "plugin install":
        (tmp_path / "plug").mkdir()
        (tmp_path / "plug" / "manifest.yaml").write_bytes(payload)
        return ["plugin", "install", tmp_path / "plug"]
    if site == "check --rules":
        (tmp_path / "rules").mkdir()
        (tmp_path / "rules" / "bad.yaml").write_bytes(payload)
        return ["check", "--rules", tmp_path / "rules", "/bin/true"]
    if site == "agent run":
        (cfg / "agent.yaml").write_bytes(payload)
        return ["agent", "run", "--probes", "off", "--no-scan"]
    if site == "fix handle-leak":
        (cfg / "shim.yaml").write_bytes(payload)
        return ["fix", "handle-leak", "--mode", "per-instance", "--dry-run"]
    if site == "run (shim.yaml)":
        (cfg / "shim.yaml").write_bytes(payload)
        return ["run", "--", "/bin/true"]
    raise AssertionError(site)


SITES = ["check FILE", "fix env-leak", "plugin install", "check --rules", "agent run", "fix handle-leak",
         "run (shim.yaml)"]


@pytest.mark.parametrize("payload", ["alias-bomb", "deep-block", "deep-flow", "not-utf8"])
@pytest.mark.parametrize("site", SITES)
def test_every_yaml_reader_gives_one_line_and_exit_2(home, site, payload):
    tmp_path, env = home
    proc = _run(_site_args(site, tmp_path, env, PAYLOADS[payload]), env)
    if site in ("check FILE", "fix env-leak") and payload == "not-utf8":
        # The config collector reads configs leniently (bytes decoded with replacement: a
        # Latin-1 comment must not hide an env leak), so this one is read, not refused; it
        # has no leak, so env-leak has nothing to rewrite.
        assert proc.returncode == 0 and proc.stderr == b"", proc.stderr
        return
    _one_error_line(proc)


def test_plain_host_check_skips_hostile_configs_and_finishes(home):
    tmp_path, env = home
    cfg = Path(env["XDG_CONFIG_HOME"]) / "seedance"
    cfg.mkdir(parents=True)
    (cfg / "bomb.yaml").write_text(alias_bomb())
    (cfg / "deep.yaml").write_text(deep_block())
    (cfg / "latin1.yml").write_bytes(PAYLOADS["not-utf8"])
    # A real env-leak next to them: the check still reads the good config.
    (cfg / "good.yaml").write_text("env:\n  LD_PRELOAD: ${HOME}/.local/lib/libx.so\n")
    proc = _run(["check", "--json"], env)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode in (0, 1), err
    assert "Traceback" not in err
    skipped = [line for line in err.splitlines() if "skipped" in line]
    assert any("bomb.yaml" in line and "expands" in line for line in skipped), err
    assert any("deep.yaml" in line and "nested" in line for line in skipped), err
    import json
    report = json.loads(proc.stdout)
    leaks = [f for f in report["findings"] if f["rule"] == "env-leak"]
    assert any("good.yaml" in json.dumps(f["subject"]) for f in leaks), leaks
