"""The shipped rules' parse cache (engine._load_shipped, issue 13): the cached documents give
the rules the YAML gives, a rewritten file is read again even where its size and mtime are
unchanged, a cache others could write is not believed, nothing invalid is ever cached, and
a condition compiled on first use still fails as one RuleError line."""
import json
import os
import shutil
import stat

import pytest

from seedance.judge import engine
from seedance.files import yamlio
from seedance.judge.engine import load_rules
from seedance.model.errors import RuleError
from seedance.model.report import Fact

SHIPPED = engine.default_rules_dir()


@pytest.fixture
def rules_copy(tmp_path, monkeypatch):
    """A copy of the shipped rules standing in as the shipped directory, and a private cache."""
    directory = tmp_path / "rules"
    directory.mkdir()
    for name in os.listdir(SHIPPED):
        if name.endswith(".yaml"):
            shutil.copy2(os.path.join(SHIPPED, name), directory / name)
    monkeypatch.setattr(engine, "RULES_DIR", str(directory))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(engine, "_LOADED", {})
    return directory


def cache_files(tmp_path) -> list:
    where = tmp_path / "cache" / "seedance"
    return sorted(where.iterdir()) if where.is_dir() else []


def fields(ruleset) -> list:
    keys = [k for k in engine.Rule._fields if k not in ("program", "escalate_program", "memo")]
    return [tuple(getattr(rule, k) for k in keys) for rule in ruleset.rules]


FACTS = [Fact("needed", {"path": "/x.so"}, {"name": "libcudart.so.12", "resolved": False, "same_library": True}),
         Fact("needed", {"path": "/x.so"}, {"name": "libz.so.1", "resolved": True, "same_library": False,
                                            "soname": "libzz.so.1"}),
         Fact("cuda_runtimes", {"path": "/app"}, {"majors": [12, 13], "libraries": ["/a", "/b"]})]


def forbid_yaml(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("the YAML was parsed although the cache is current")
    monkeypatch.setattr(yamlio, "load_file", refuse)


def test_cached_rules_are_the_yaml_rules(rules_copy, tmp_path, monkeypatch):
    parsed = load_rules()
    (cache,) = cache_files(tmp_path)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    engine._LOADED.clear()
    forbid_yaml(monkeypatch)
    cached = load_rules()
    assert cached is not parsed
    assert fields(cached) == fields(parsed)
    assert len(cached) == len(parsed) > 20
    as_found = lambda rs: [(f.rule, f.severity, f.message) for f in rs.evaluate(FACTS)]  # noqa: E731
    assert as_found(cached) == as_found(parsed)
    assert as_found(parsed)  # the facts do raise findings: the comparison says something


def test_a_file_rewritten_with_the_same_size_and_mtime_is_read_again(rules_copy, tmp_path, monkeypatch):
    assert load_rules()["needed-unresolved"].severity == "error"
    path = rules_copy / "loader.yaml"
    st = path.stat()
    text = path.read_text()
    at = text.index("severity: error", text.index("id: needed-unresolved"))
    changed = text[:at] + "severity: info " + text[at + len("severity: error"):]
    assert len(changed) == len(text)
    path.write_text(changed)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    engine._LOADED.clear()
    assert load_rules()["needed-unresolved"].severity == "info"


def test_a_cache_others_can_write_is_not_believed(rules_copy, tmp_path):
    load_rules()
    (cache,) = cache_files(tmp_path)
    data = json.loads(cache.read_text())
    for name, doc in data["docs"]:
        for rule in doc["rules"]:
            rule["severity"] = "info"
    cache.write_text(json.dumps(data))
    os.chmod(cache, 0o666)
    engine._LOADED.clear()
    assert load_rules()["needed-unresolved"].severity == "error"
    os.chmod(cache, 0o600)  # the same file, private again: then it is what loads
    engine._LOADED.clear()
    cache.write_text(json.dumps(data))
    assert load_rules()["needed-unresolved"].severity == "info"


def test_invalid_rules_are_never_cached(rules_copy, tmp_path):
    (rules_copy / "zz.yaml").write_text("rules: [{id: x}]\n")
    with pytest.raises(RuleError):
        load_rules()
    assert cache_files(tmp_path) == []


def test_a_cached_condition_that_no_longer_compiles_is_one_rule_error(rules_copy, tmp_path):
    load_rules()
    (cache,) = cache_files(tmp_path)
    data = json.loads(cache.read_text())
    for name, doc in data["docs"]:
        for rule in doc["rules"]:
            if rule["id"] == "needed-unresolved":
                rule["condition"] = "!resolved &&& true"
    cache.write_text(json.dumps(data))
    engine._LOADED.clear()
    rules = load_rules()  # validated from the cache, compiled on first use
    with pytest.raises(RuleError) as err:
        rules.evaluate(FACTS[:1])
    assert "needed-unresolved" in str(err.value) and "\n" not in str(err.value)


def test_only_the_shipped_directory_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(engine, "_LOADED", {})
    other = tmp_path / "mine"
    other.mkdir()
    shutil.copy2(os.path.join(SHIPPED, "loader.yaml"), other / "loader.yaml")
    assert load_rules(other)["needed-unresolved"]
    assert cache_files(tmp_path) == []
