import pytest

from seedance.collect import fatbin
from seedance.elf.fatbin import FatbinEntry
from seedance.engine import load_rules

SASS86 = FatbinEntry("sass", 86, "", False, 100)
SASS80 = FatbinEntry("sass", 80, "", True, 100)
PTX90 = FatbinEntry("ptx", 90, "", False, 100)
SASS90A = FatbinEntry("sass", 90, "a", False, 100)
PTX90A = FatbinEntry("ptx", 90, "a", False, 100)


@pytest.mark.parametrize("entries, target, runnable", [
    ([SASS86], "sm_90", False),
    ([SASS86], "sm_86", True),
    ([SASS80], "sm_86", True),          # same major, newer minor: binary compatible
    ([SASS80, PTX90], "sm_90", True),   # compute_90 PTX JITs to sm_90
    ([SASS80, PTX90], "sm_100", True),  # ... and forward
    ([SASS90A], "sm_90", True),
    ([SASS90A], "sm_100", False),       # arch-specific SASS runs on exactly sm_90a
    ([PTX90A], "sm_100", False),        # arch-specific PTX does not JIT forward
])
def test_runnable_on_target(entries, target, runnable):
    facts = fatbin.fatbin_facts("/k.so", entries, [fatbin.parse_target(target)])
    assert [f.data["runnable"] for f in facts] == [runnable]
    rules = [f.rule for f in load_rules().evaluate(facts)]
    assert rules == ([] if runnable else ["cuda-arch-missing"])


def test_no_entries_or_no_target_means_no_fact():
    assert fatbin.fatbin_facts("/k.so", [], [fatbin.parse_target("sm_90")]) == []
    assert fatbin.fatbin_facts("/k.so", [SASS86], []) == []


def test_fact_lists_images_and_fix():
    fact = fatbin.fatbin_facts("/k.so", [SASS86, SASS80], [fatbin.parse_target("sm_90")])[0]
    assert (fact.data["sass"], fact.data["ptx"], fact.data["compressed"]) == (["sm_80", "sm_86"], [], True)
    finding = load_rules().evaluate([fact])[0]
    assert finding.fix == "rebuild /k.so with -gencode arch=compute_90,code=sm_90"


def test_bad_arch():
    with pytest.raises(ValueError):
        fatbin.parse_target("gfx90a")
