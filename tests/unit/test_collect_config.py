import os

import pytest

from seedance.collect import config
from seedance.judge.engine import load_rules


def facts_of(tmp_path, text, name="plugins.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return config.config_facts(str(path))


@pytest.mark.parametrize("value, names", [
    ("${HOME}/lib/x.so", ["HOME"]),
    ("$HOME/lib/x.so", ["HOME"]),
    ("$${HOME}/lib/x.so", []),          # the lazy form survives until the session expands it
    ("$$HOME/x.so:$${USER}", []),
    ("/opt/$${A}/${B}", ["B"]),
    ("cost is 5$", []),
    ("${not a name}", []),
])
def test_early_references(value, names):
    assert config.early_references(value) == names


def test_home_in_ld_preload_is_a_leak_and_lazy_form_is_not(tmp_path):
    facts = facts_of(tmp_path, "env:\n  LD_PRELOAD: ${HOME}/.local/lib/libshim.so\n"
                               "  LD_LIBRARY_PATH: $${HOME}/.local/lib\n  OTHER: ${HOME}\n")
    by_key = {f.data["key"]: f for f in facts}
    assert set(by_key) == {"LD_PRELOAD", "LD_LIBRARY_PATH"}
    assert by_key["LD_PRELOAD"].data["expands_early"] is True
    assert by_key["LD_PRELOAD"].data["line"] == 2
    assert by_key["LD_LIBRARY_PATH"].data["expands_early"] is False
    findings = load_rules().evaluate(facts)
    assert [(f.rule, f.evidence["key"]) for f in findings] == [("env-leak", "LD_PRELOAD")]


def test_env_list_items_and_library_paths(tmp_path):
    facts = facts_of(tmp_path, "plugins:\n  - name: enc\n    library: ${PLUGIN_ROOT}/libenc.so\n"
                               "    env: [\"LD_PRELOAD=$HOME/x.so\", \"FOO=$HOME\"]\n")
    assert sorted((f.data["key"], f.data["expands_early"]) for f in facts) == [
        ("LD_PRELOAD", True), ("library", True)]


def test_missing_and_writable_preloads(tmp_path):
    good = tmp_path / "safe"
    good.mkdir(mode=0o755)
    os.chmod(good, 0o755)
    lib = good / "libok.so"
    lib.write_bytes(b"x")
    os.chmod(lib, 0o644)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    bad = open_dir / "libbad.so"
    bad.write_bytes(b"x")
    os.chmod(bad, 0o644)
    facts = facts_of(tmp_path, f"LD_PRELOAD: {lib}\npreload: {tmp_path}/nope.so\nld_preload: {bad}\n")
    data = {f.data["key"]: f.data for f in facts}
    assert (data["LD_PRELOAD"]["preload_missing"], data["LD_PRELOAD"]["preload_writable"]) == (False, False)
    assert data["preload"]["preload_missing"] is True
    assert data["ld_preload"]["preload_writable"] is True
    assert "world-writable" in data["ld_preload"]["problem"]
    rules = load_rules()
    assert sorted(f.evidence["key"] for f in rules.evaluate(facts)) == ["ld_preload", "preload"]


def test_bad_yaml_is_one_line(tmp_path):
    with pytest.raises(config.BadYaml) as err:
        facts_of(tmp_path, "env: [unclosed\n")
    assert "line" in str(err.value) and "\n" not in str(err.value)
