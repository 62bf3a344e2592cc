"""FrozenRecord (agent/model/record.py) against the dataclasses it replaced (issue 13).

The oracle is a real @dataclass(frozen=True) per class, with the fields the classes had as
dataclasses (listed here, not read from the code under test), filled with the values of
real records from a closure of a system library: repr, ==, hash(), frozenness and the
JSON form (model._plain) must be the same."""
from __future__ import annotations

import copy
import dataclasses
import functools
import os
import pickle

import pytest

from seedance.elf.info import ElfInfo, Symbol, VersionNeed
from seedance.model.report import _plain
from seedance.resolve.hwcaps import CpuCaps
from seedance.resolve.ldcache import CacheEntry
from seedance.resolve.resolver import ABIS, Abi, Closure, Resolution, Resolver, SymbolGap, VersionCheck

# the fields of each class as it was declared with @dataclass (8e23c5d)
DATACLASS_FIELDS = {
    VersionNeed: ["file", "versions"],
    Symbol: ["name", "defined", "binding", "type", "version", "hidden"],
    ElfInfo: ["path", "elf_class", "little_endian", "machine", "osabi", "e_type", "interpreter", "needed", "soname",
              "rpath", "runpath", "flags", "flags_1", "version_needs", "version_defs", "build_id", "has_sections",
              "has_dynamic", "symbols", "fatbin", ("section_names", False)],
    Abi: ["name", "elf_class", "machine", "system_dirs", "lib", "rtld"],
    Resolution: ["name", "requester", "path", "source", "tried", "search_order", "soname"],
    VersionCheck: ["requester", "file", "version", "weak", "provider", "defined", "provider_versions"],
    SymbolGap: ["requester", "symbol", "version", "provider"],
    CacheEntry: ["name", "path", "flags", "hwcap", "hwcaps_subdir"],
    CpuCaps: ["hwcaps_subdirs", "legacy_subdirs", "platform", "hwcap_bits"],
}

LIBRARY = next((p for p in ("/usr/lib/x86_64-linux-gnu/libcurl.so.4", "/lib/x86_64-linux-gnu/libc.so.6")
                if os.path.exists(p)), None)


@functools.lru_cache(maxsize=None)
def oracle_class(cls):
    fields = [(f, object) if isinstance(f, str) else (f[0], object, dataclasses.field(compare=f[1]))
              for f in DATACLASS_FIELDS[cls]]
    made = dataclasses.make_dataclass(cls.__name__, fields, frozen=True)
    made.__qualname__ = cls.__qualname__
    return made


def as_oracle(record):
    made = oracle_class(type(record))
    names = [f if isinstance(f, str) else f[0] for f in DATACLASS_FIELDS[type(record)]]
    return made(**{name: getattr(record, name) for name in names})


@pytest.fixture(scope="module")
def records():
    if LIBRARY is None:
        pytest.skip("no system library to resolve")
    resolver = Resolver()
    closure = resolver.closure(LIBRARY, symbols=True)
    infos = list(closure.objects.values())
    out = infos + list(closure.resolutions) + list(closure.version_checks) + [resolver.caps]
    out += list(resolver.ldcache().entries[:50]) + list(ABIS.values())
    out += [need for info in infos for need in info.version_needs][:50]
    out += [sym for info in infos for sym in info.symbols][:200]
    out.append(SymbolGap("/a/libx.so", "f", "V_1", "/a/liby.so"))
    assert {type(r) for r in out} == set(DATACLASS_FIELDS)
    return out


def test_repr_eq_hash_and_json_form_are_the_dataclass_ones(records):
    for record in records:
        oracle = as_oracle(record)
        assert repr(record) == repr(oracle)
        assert hash(record) == hash(oracle)
        assert _plain(record) == _plain(oracle)
        twin = copy.copy(record)
        assert twin == record and not (twin != record) and twin is not record
        assert record != oracle  # like a dataclass: equal only to its own class
        assert pickle.loads(pickle.dumps(record)) == record


def test_equality_follows_the_compared_fields(records):
    info = next(r for r in records if isinstance(r, ElfInfo))
    other_sections = info._replace(section_names=("x",))
    assert other_sections == info and hash(other_sections) == hash(info)  # compare=False
    moved = info._replace(path=info.path + "x")
    assert moved != info and moved.path == info.path + "x" and info.path != moved.path
    assert as_oracle(moved) == dataclasses.replace(as_oracle(info), path=info.path + "x")
    with pytest.raises(TypeError):
        info._replace(no_such_field=1)


def test_frozen_like_a_dataclass(records):
    for record in records[:20] + records[-5:]:
        field = DATACLASS_FIELDS[type(record)][0]
        with pytest.raises(AttributeError):
            setattr(record, field, None)
        with pytest.raises(AttributeError):
            delattr(record, field)


def test_closure_compares_by_fields_and_is_unhashable():
    one = Closure("r", {}, [], [], [])
    assert one == Closure("r", {}, [], [], []) and one != Closure("s", {}, [], [], [])
    assert one.load_names == {} and one.load_order == [] and one.load_order is not Closure("r", {}, [], [], []).load_order
    with pytest.raises(TypeError):
        hash(one)


def test_elfinfo_defaults_and_keywords():
    info = ElfInfo("p", 64, True, 62, 0, 3, None, soname="libp.so")
    oracle = oracle_class(ElfInfo)
    defaults = {"needed": (), "soname": "libp.so", "rpath": (), "runpath": (), "flags": 0, "flags_1": 0,
                "version_needs": (), "version_defs": (), "build_id": None, "has_sections": False,
                "has_dynamic": False, "symbols": (), "fatbin": (), "section_names": ()}
    assert repr(info) == repr(oracle("p", 64, True, 62, 0, 3, None, **defaults))
    with pytest.raises(TypeError):
        ElfInfo("p", 64, True, 62, 0, 3, None, sonam="typo")
