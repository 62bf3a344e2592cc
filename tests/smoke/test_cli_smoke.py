import pytest


def test_help_has_examples(cli):
    proc = cli("--help")
    assert proc.returncode == 0
    assert "examples:" in proc.stdout


def test_usage_error_is_one_line_exit_2(cli):
    proc = cli("no-such-command")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
