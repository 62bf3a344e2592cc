"""The generated user unit must pass `systemd-analyze verify --user` (systemd 252 here)."""
import shutil

import pytest

from seedance.service import unit

needs_systemd = pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")


def _write(tmp_path, text):
    path = tmp_path / unit.UNIT_NAME
    unit.write_unit(path, text)
    return path


@needs_systemd
def test_generated_unit_verifies(tmp_path):
    text = unit.render_unit(["--gc-interval", "2s", "--metrics", "127.0.0.1:9464"], watchdog_sec=30)
    result = unit.verify_unit(_write(tmp_path, text))
    assert result.ok, result.output
    for line in ("Type=notify", "WatchdogSec=30s", "Restart=on-failure", "NoNewPrivileges=yes",
                 "SystemCallFilter=@system-service", "WantedBy=default.target"):
        assert line in text.splitlines()


@needs_systemd
def test_unit_that_allows_the_probes_verifies(tmp_path):
    text = unit.render_unit(["--probes", "on"], allow_probes=True)
    assert "SystemCallFilter=bpf perf_event_open" in text.splitlines()
    result = unit.verify_unit(_write(tmp_path, text))
    assert result.ok, result.output


@needs_systemd
@pytest.mark.parametrize("breakage", [("Restart=on-failure", "Restart=sometimes"),
                                      ("Type=notify", "Type=notify\nProtectFlux=yes"),
                                      ("ExecStart=", "ExecStart=/nonexistent/seedance-agent ")])
def test_verifier_catches_broken_units(tmp_path, breakage):
    # The check above is only worth something if the same verifier rejects a bad unit,
    # including a warning-only one (systemd-analyze exits 0 after "ignoring").
    text = unit.render_unit([]).replace(*breakage, 1)
    assert not unit.verify_unit(_write(tmp_path, text)).ok


@needs_systemd
def test_odd_paths_are_quoted_so_the_unit_still_verifies(tmp_path):
    odd = tmp_path / "dir with space%and$dollar"
    odd.mkdir()
    script = odd / "seedance"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    text = unit.render_unit(["--rules", str(odd)], command=[str(script)])
    assert unit.verify_unit(_write(tmp_path, text)).ok


def test_rewrite_keeps_a_backup_and_is_idempotent(tmp_path):
    path = tmp_path / unit.UNIT_NAME
    assert unit.write_unit(path, "one\n") is None
    assert unit.write_unit(path, "one\n") is None  # unchanged: nothing to back up
    backup = unit.write_unit(path, "two\n")
    assert backup is not None and backup.read_text() == "one\n"
    assert path.read_text() == "two\n"
