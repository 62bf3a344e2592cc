import pytest

from seedance.collect import fatbin
from seedance.elf.fatbin import FatbinEntry
from seedance.judge.engine import load_rules

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


# --- per module: hand-built entries with known kernels (no file: kernels unknown = judged) ---

def entry(kind, arch, variant="", module=0, isa=()):
    return FatbinEntry(kind, arch, variant, False, 100, module=module, isa=isa)


@pytest.mark.parametrize("entries, target, runnable", [
    # two translation units: one for sm_90 + PTX, one for sm_80 only -> the second fails on sm_90
    ([entry("sass", 90, module=0), entry("ptx", 90, module=0), entry("sass", 80, module=1)], "sm_90", False),
    ([entry("sass", 90, module=0), entry("sass", 80, module=1), entry("ptx", 80, module=1)], "sm_90", True),
    # family PTX JITs within its family only (sm_103 yes, sm_120 no); 'a' PTX only on its arch
    ([entry("ptx", 100, "f")], "sm_103", True),
    ([entry("ptx", 100, "f")], "sm_120", False),
    ([entry("ptx", 100, "f")], "sm_90", False),
    ([entry("ptx", 90, "a")], "sm_90", True),
    ([entry("ptx", 90, "a")], "sm_100", False),
    ([entry("sass", 100, "f")], "sm_103", True),
    ([entry("sass", 103, "f")], "sm_100", False),
])
def test_modules_judged_one_by_one(entries, target, runnable):
    facts = fatbin.fatbin_facts("/nonexistent/k.so", entries, [fatbin.parse_target(target)])
    assert [f.data["runnable"] for f in facts] == [runnable]


@pytest.mark.parametrize("driver, runnable, rule", [
    ("12.4", False, "cuda-ptx-unsupported"),       # ISA 9.0 comes from CUDA 13.0
    ("575.57.08", False, "cuda-ptx-unsupported"),  # a 12.9 driver JITs up to ISA 8.8
    ("580", True, None),
    ("13.0", True, None),
    (None, True, None),                            # no driver known: judged by arch alone
])
def test_ptx_judged_against_the_driver(driver, runnable, rule):
    ptx13 = [entry("ptx", 80, isa=(9, 0))]
    facts = fatbin.fatbin_facts("/nonexistent/k.so", ptx13, [fatbin.parse_target("sm_90")], driver=driver)
    assert facts[0].data["runnable"]  # by architecture, compute_80 PTX JITs to sm_90
    assert [f.data["jit_ok"] for f in facts if f.kind == "fatbin_ptx"] == ([runnable] if driver else [])
    assert [f.rule for f in load_rules().evaluate(facts)] == ([rule] if rule else [])
    # SASS for the device needs no JIT: the same PTX beside sm_90 SASS is fine on any driver
    both = ptx13 + [entry("sass", 90)]
    facts = fatbin.fatbin_facts("/nonexistent/k.so", both, [fatbin.parse_target("sm_90")], driver=driver)
    assert load_rules().evaluate(facts) == []


def test_per_architecture_dispatch_is_not_an_error():
    """cuBLAS's shape: modules for every architecture, beside modules for one GPU each."""
    generic = [entry("sass", arch, module=0) for arch in (50, 60, 70, 75, 80, 90, 100, 120)]
    generic.append(entry("ptx", 120, module=0))
    lib = generic + [entry("sass", 80, module=1), entry("sass", 90, "a", module=2),
                     entry("sass", 50, module=3), entry("sass", 61, module=3), entry("sass", 75, module=3)]
    for target in ("sm_50", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "sm_121"):
        fact = fatbin.fatbin_facts("/nonexistent/k.so", lib, [fatbin.parse_target(target)])[0]
        assert fact.data["runnable"] and fact.data["dispatch"], target
    # one GPU each, and nothing that runs here also serves the others: not dispatch
    disjoint = [entry("sass", 80, module=0), entry("sass", 90, "a", module=1), entry("sass", 100, module=2)]
    for target in ("sm_80", "sm_90", "sm_100", "sm_120"):
        fact = fatbin.fatbin_facts("/nonexistent/k.so", disjoint, [fatbin.parse_target(target)])[0]
        assert not fact.data["runnable"], target


def test_two_translation_units_fail_on_either_gpu():
    two = [entry("sass", 90, module=0), entry("ptx", 90, module=0), entry("sass", 80, module=1)]
    for target in ("sm_80", "sm_90"):
        assert not fatbin.fatbin_facts("/nonexistent/k.so", two, [fatbin.parse_target(target)])[0].data["runnable"]


def test_no_entry_cap():
    many = [entry("sass", 80, module=n) for n in range(6000)]
    assert fatbin.fatbin_facts("/nonexistent/k.so", many, [fatbin.parse_target("sm_86")])[0].data["modules"] == 6000
