"""env-leak rewriting: the lazy form, preload vetting, the environment.d drop-in."""
import os

import pytest

from seedance.collect.config import early_references
from seedance.model.errors import BadInput
from seedance.fix import envleak


@pytest.mark.parametrize("value, lazy", [
    ("${HOME}/lib/x.so", "$${HOME}/lib/x.so"),
    ("$HOME/lib:$CUDA_HOME/lib64", "$${HOME}/lib:$${CUDA_HOME}/lib64"),
    ("$${HOME}/already/lazy.so", "$${HOME}/already/lazy.so"),
    ("$$HOME/escaped", "$$HOME/escaped"),
    ("/no/vars/libx.so", "/no/vars/libx.so"),
    ("price $5 and ${} and $", "price $5 and ${} and $"),
])
def test_lazy_form(value, lazy):
    assert envleak.lazy_form(value) == lazy
    # the check's own reader agrees: nothing in the lazy form is expanded early
    assert early_references(envleak.lazy_form(value)) == []


def test_unsafe_preload_checks_the_file_and_every_parent(tmp_path):
    safe = tmp_path / "a" / "b"
    safe.mkdir(parents=True)
    lib = safe / "libshim.so"
    lib.write_bytes(b"x")
    for p in (tmp_path / "a", safe):
        os.chmod(p, 0o755)
    os.chmod(tmp_path / "a", 0o777)  # world-writable and not sticky: anyone may swap b
    assert "world-writable" in envleak.unsafe_preload(str(lib))
    os.chmod(tmp_path / "a", 0o755)
    assert "does not exist" in envleak.unsafe_preload(str(safe / "missing.so"))
    home_dir = os.path.expanduser("~")
    if not os.stat(home_dir).st_mode & 0o022 and not os.stat("/").st_mode & 0o022:
        assert envleak.unsafe_preload(home_dir) is None


def test_group_writable_parent_is_named(tmp_path):
    d = tmp_path / "g"
    d.mkdir()
    os.chmod(d, 0o775)
    (d / "l.so").write_bytes(b"x")
    assert envleak.unsafe_preload(str(d / "l.so")) == f"preload {d / 'l.so'}: {d} is group-writable (another user could replace it)"


def test_drop_in_merges_and_unescapes():
    text = envleak.drop_in_content("# mine\nFOO=1\nLD_PRELOAD=/opt/a.so\n", "LD_PRELOAD",
                                   ["$${HOME}/b.so", "/opt/a.so"], "ID")
    assert text == "# mine\nFOO=1\nLD_PRELOAD=/opt/a.so:${HOME}/b.so\n"
    fresh = envleak.drop_in_content(None, "LD_PRELOAD", ["${HOME}/b.so"], "ID")
    assert fresh.splitlines()[-1] == "LD_PRELOAD=${HOME}/b.so" and "seedance fix undo ID" in fresh


def test_paths_honour_xdg_config_home(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    assert envleak.drop_in_path(env) == str(tmp_path / "environment.d" / "60-seedance.conf")
    (tmp_path / "seedance" / "plugins").mkdir(parents=True)
    (tmp_path / "seedance" / "plugins" / "p.yaml").write_text("a: 1\n")
    (tmp_path / "seedance" / "notes.txt").write_text("x")
    assert envleak.scope_paths("user", env) == [str(tmp_path / "seedance" / "plugins" / "p.yaml")]
    with pytest.raises(BadInput, match="not a YAML config"):
        envleak.scope_paths(str(tmp_path / "seedance" / "notes.txt"), env)


def test_bad_yaml_is_one_line_bad_input(tmp_path):
    bad = tmp_path / "b.yaml"
    bad.write_text("a: [1, 2\nb: c\n")
    with pytest.raises(BadInput, match=r"b.yaml:.*not valid YAML"):
        envleak.parse_or_refuse(str(bad), bad.read_text())
