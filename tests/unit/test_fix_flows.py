"""seedance.fix.flows: a fixer hands each step to its caller the moment it happens, and the
command's fallback for a missing handle-leak fixer tells the user something they can act on.

Oracles outside the code under test: the config's bytes on disk (read by the test when the
step arrives) and the journal's own undo, which must restore them byte for byte.
"""
import os
import subprocess
import sys

from seedance.fix.flows import FixOutcome, fix_env_leak, undo_fix

CONFIG = """\
# seedance plugin config
plugins:
  - name: audio-encoder
    version: "2.0.5"
    env:
      LD_LIBRARY_PATH: "$HOME/lib:/opt/x/lib"
    args:
      - "LD_LIBRARY_PATH=${CUDA_HOME}/lib64"
"""


def test_env_leak_shows_the_rewrite_when_the_file_has_changed_and_before_the_journal_line(tmp_path,
                                                                                             monkeypatch):
    config = tmp_path / "config" / "seedance" / "plugins.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(CONFIG)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    on_disk_when_shown = {}
    shown = []

    def show(step):
        shown.append(step)
        if step.kind == "rewrote":
            on_disk_when_shown[step.path] = open(step.path).read()

    outcome = fix_env_leak("user", None, False, ["seedance", "fix", "env-leak"], show)

    assert isinstance(outcome, FixOutcome) and outcome.exit_code == 0
    assert outcome.steps == shown  # what was shown is what is returned, in the same order
    assert [s.kind for s in shown] == ["planned", "rewrote", "journaled", "rechecked"]
    assert on_disk_when_shown == {str(config): config.read_text()}  # already rewritten when said
    assert "$${CUDA_HOME}" in config.read_text()
    assert shown[2].path == outcome.entry_id
    assert undo_fix(outcome.entry_id).restored == [str(config)]
    assert config.read_text() == CONFIG


def test_env_leak_dry_run_shows_the_plan_and_journals_nothing(tmp_path, monkeypatch):
    config = tmp_path / "config" / "seedance" / "plugins.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(CONFIG)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    shown = []
    outcome = fix_env_leak("user", None, True, [], shown.append)
    assert [s.kind for s in shown] == ["planned", "dry-run"]
    assert outcome.entry_id is None and outcome.exit_code == 0
    assert config.read_text() == CONFIG and not (tmp_path / "state").exists()


def test_handle_leak_fallback_names_what_it_does_and_where_to_read(tmp_path):
    """An install without seedance.fix.handle_leak: `fix handle-leak` is one line, exit 2, that
    says what the fixer does where installed and names the documents, not a plan."""
    script = ("import sys\n"
              "sys.modules['seedance.fix.handle_leak'] = None  # its import fails as a missing module's\n"
              "from seedance.cli import main\n"
              "sys.exit(main(['fix', 'handle-leak']))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "XDG_STATE_HOME": str(tmp_path)})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("seedance: error: ")
    assert "docs/fix.md" in proc.stderr and "docs/agent.md" in proc.stderr
    assert "per-instance" in proc.stderr and "issue" not in proc.stderr
