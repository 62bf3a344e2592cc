"""The scan's shortcuts over work shared between closures give what the work itself gives.

A check judges each root's closure, and most of a closure was judged in earlier ones: the
resolver hands out the same VersionCheck tuples (Closure.version_groups) and the same
Resolution objects wherever the answer cannot differ, and the facts code skips what it has
seen (issue 13).  Each test runs the same closures of this host's libraries through the
shortcut and through the long way (no groups, nothing remembered as passive) and compares
the facts."""
from __future__ import annotations

import glob
import json

import pytest

from seedance.collect import closure as closure_facts
from seedance.model.errors import ELFError
from seedance.resolve import Resolver

LIBDIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")


def _roots(limit=160):
    for directory in LIBDIRS:
        found = sorted(glob.glob(directory + "/*.so*"))
        if len(found) >= 20:
            return found[:limit]
    pytest.skip("no directory of shared libraries on this host")


def _closures():
    resolver = Resolver(env={})
    closures = []
    for path in _roots():
        try:
            closures.append(resolver.closure(path))
        except (ELFError, OSError):
            continue
    return resolver, closures


def _plain(facts) -> list:
    return [json.dumps([f.kind, f.subject, f.data], sort_keys=True, default=repr) for f in facts]


class _Forgetful(dict):
    """A FactDedup.passive that remembers nothing: every resolution is noted again."""

    def __setitem__(self, key, value):
        pass




def test_closures_share_version_groups_and_the_checks_are_theirs():
    _resolver, closures = _closures()
    shared = 0
    seen = set()
    for closure in closures:
        flat = [check for group in closure.version_groups for check in group]
        assert flat == closure.version_checks  # the same checks, the same order
        shared += sum(1 for group in closure.version_groups if id(group) in seen)
        seen.update(id(group) for group in closure.version_groups)
    assert shared > 0  # the shortcut is taken on this host's libraries


def test_version_facts_through_groups_equal_the_check_by_check_facts():
    _resolver, closures = _closures()
    fast, slow = closure_facts.FactDedup(), closure_facts.FactDedup()
    fast_facts, slow_facts = [], []
    for closure in closures:
        fast_facts += closure_facts.version_facts(closure, fast)
        groups = closure.version_groups
        del closure.version_groups
        try:
            slow_facts += closure_facts.version_facts(closure, slow)
        finally:
            closure.version_groups = groups
    assert fast_facts and _plain(fast_facts) == _plain(slow_facts)


def test_version_gaps_through_groups_equal_the_check_by_check_gaps():
    resolver, closures = _closures()
    other = Resolver(env={})
    for closure in closures:
        groups = closure.version_groups
        del closure.version_groups
        try:
            slow = other.version_gaps(closure)
        finally:
            closure.version_groups = groups
        assert resolver.version_gaps(closure) == slow


def test_needed_facts_with_passive_resolutions_equal_noting_every_resolution():
    _resolver, closures = _closures()
    fast, slow = closure_facts.FactDedup(), closure_facts.FactDedup()
    slow.passive = _Forgetful()
    for closure in closures:
        closure_facts.note_needed(closure, fast)
        closure_facts.note_needed(closure, slow)
    assert len(fast.passive) > 0
    assert _plain(closure_facts.needed_facts(fast)) == _plain(closure_facts.needed_facts(slow))
