"""Dependency picks: newest compatible, explained, fallback when a newer one is known."""
from __future__ import annotations

from seedance.plugins.resolve import pick_version


def test_newest_compatible_is_picked_and_explained():
    pick = pick_version("app 1.0", "dsp", ">=1.0,<3", {}, {"1.0.0": "/s/a", "2.0.4": "/s/c", "1.1.0": "/s/b"})
    assert pick.version == "2.0.4" and pick.source == "/s/c" and not pick.installed
    assert not pick.fallback
    assert "newest of 3 matching (1.0.0, 1.1.0, 2.0.4)" in pick.explanation


def test_pick_below_newest_known_is_a_fallback():
    pick = pick_version("app 1.0", "dsp", ">=1.0,<2", {"1.0.0": "/st/1.0.0"}, {"1.1.0": "/s/b", "2.0.4": "/s/c"})
    assert pick.version == "1.1.0" and pick.newest == "2.0.4" and pick.fallback
    assert "2.0.4 is newer but outside the range (fallback)" in pick.explanation


def test_installed_version_wins_a_tie_without_reinstall():
    pick = pick_version("app 1.0", "dsp", "~=2.0", {"2.0.4": "/store/dsp/2.0.4"}, {"2.0.4": "/src/dsp"})
    assert pick.installed and pick.source is None


def test_nothing_matches_lists_what_is_known():
    pick = pick_version("app 1.0", "dsp", ">=3", {"1.0.0": "/st"}, {"2.0.4": "/s"})
    assert pick.version is None and not pick.fallback
    assert "installed 1.0.0" in pick.explanation and "available 2.0.4" in pick.explanation


def test_bare_version_range_picks_newest():
    pick = pick_version("app 1.0", "dsp", "1.0", {}, {"1.0.0": "a", "10.0.0": "b", "9.1": "c"})
    assert pick.version == "10.0.0"  # version order, not string order
