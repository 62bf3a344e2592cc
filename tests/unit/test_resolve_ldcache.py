"""ld.so.cache parsing and lookup, against caches written by the real ldconfig."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from seedance.resolve import hwcaps
from seedance.resolve.ldcache import LdCache, libcmp, parse
from seedance.model.errors import BadInput
from tests.conftest import write_ld_so_cache

LDCONFIG = shutil.which("ldconfig") or "/sbin/ldconfig"
RTLD = "/lib64/ld-linux-x86-64.so.2"
LINE = re.compile(r"^\t(\S+) \(([^)]*)\) => (\S+)$")

needs_ldconfig = pytest.mark.skipif(not Path(LDCONFIG).exists(), reason="needs ldconfig")


def ldconfig_p(cache: str | None = None) -> list:
    """[(name, flags text, hwcap name or None, path)] in cache order, from `ldconfig -p`."""
    cmd = [LDCONFIG, "-p"] + (["-C", cache] if cache else [])
    # never strict UTF-8: ldconfig -p prints whatever bytes the cache holds
    out = subprocess.run(cmd, capture_output=True, check=True).stdout.decode("utf-8", "surrogateescape")
    rows = []
    for line in out.splitlines():
        match = LINE.match(line)
        if match:
            name, flags, path = match.groups()
            hw = re.search(r'hwcap: "([^"]*)"', flags)
            rows.append((name, flags, hw.group(1) if hw else None, path))
    return rows


def supported_hwcaps() -> list:
    """glibc-hwcaps subdirectories the real ld.so says it searches here, best first."""
    out = subprocess.run([RTLD, "--help"], capture_output=True, text=True).stdout
    section = out.split("Subdirectories of glibc-hwcaps directories", 1)[-1]
    section = section.split("\n\n", 1)[0]
    return [line.split()[0] for line in section.splitlines()[1:] if "supported" in line and line.strip()]


def expected_lookup(rows: list, name: str, usable: list):
    """What search_cache() picks: the best usable hwcaps entry, else the first plain x86-64 one."""
    best, best_rank = None, None
    for row_name, flags, hw, path in rows:
        if row_name != name or "x86-64" not in flags:
            continue
        if hw is not None:
            if hw in usable and (best_rank is None or usable.index(hw) < best_rank):
                best, best_rank = path, usable.index(hw)
            continue
        return best or path
    return best


@needs_ldconfig
def test_system_cache_matches_ldconfig_listing():
    cache = LdCache.load("/etc/ld.so.cache")
    rows = ldconfig_p()
    assert cache.format in ("new", "old+new", "old")
    assert len(cache.entries) == len(rows)
    usable = supported_hwcaps()
    caps = hwcaps.detect()
    for name in {row[0] for row in rows}:
        assert cache.lookup(name, "x86_64", caps.priorities) == expected_lookup(rows, name, usable), name


@pytest.fixture(scope="module")
def library_dir(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    base = tmp_path_factory.mktemp("ldcache")
    lib_dir = base / "d"
    (lib_dir / "glibc-hwcaps" / "x86-64-v2").mkdir(parents=True)
    (lib_dir / "glibc-hwcaps" / "x86-64-v4").mkdir(parents=True)
    src = base / "f.c"
    src.write_text("int f(void){return 1;}\n")

    def build(path, soname):
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(path), str(src), f"-Wl,-soname,{soname}"],
                       check=True)
    for version in ("1", "2", "10", "02a"):
        build(lib_dir / f"libnum.so.{version}", f"libnum.so.{version}")
    build(lib_dir / "libhw.so.1", "libhw.so.1")
    build(lib_dir / "glibc-hwcaps" / "x86-64-v2" / "libhw.so.1", "libhw.so.1")
    build(lib_dir / "glibc-hwcaps" / "x86-64-v4" / "libhw.so.1", "libhw.so.1")
    build(lib_dir / "glibc-hwcaps" / "x86-64-v4" / "libonlyv4.so.1", "libonlyv4.so.1")
    conf = base / "ld.so.conf"
    conf.write_text(f"{lib_dir}\n")
    return base, conf


@needs_ldconfig
@pytest.mark.parametrize("fmt", ["new", "old", "compat"])
def test_ldconfig_written_cache_formats(library_dir, fmt):
    base, conf = library_dir
    cache_file = base / f"cache.{fmt}"
    write_ld_so_cache(cache_file, conf, "-c", fmt)
    cache = LdCache.load(str(cache_file))
    assert cache.format == {"new": "new", "old": "old", "compat": "old+new"}[fmt]
    rows = ldconfig_p(str(cache_file))
    if fmt == "compat":
        # `ldconfig -p` on a compat cache prints garbage for glibc-hwcaps entries on some glibc
        # builds (Debian 2.36-9+deb12u14: it reads their strings from the wrong table), so its
        # hwcaps rows are no oracle: only names without hwcaps rows are compared there.
        rows = [row for row in rows if not any(other[0] == row[0] and "hwcap" in other[1] for other in rows)]
    usable = supported_hwcaps()
    caps = hwcaps.detect()
    names = {row[0] for row in rows}
    assert {"libnum.so.1", "libnum.so.2", "libnum.so.10"} <= names
    assert fmt == "compat" or "libhw.so.1" in names
    for name in names:
        assert cache.lookup(name, "x86_64", caps.priorities) == expected_lookup(rows, name, usable), name
    assert cache.lookup("libnot-there.so.1") is None
    assert cache.lookup("libnum.so.1", abi="i386") is None  # 64-bit entries only


@needs_ldconfig
@pytest.mark.parametrize("fmt", ["new", "old", "compat"])
def test_lists_answers_as_a_scan_of_every_entry(library_dir, fmt):
    """LdCache.lists (a binary search over the names) against the names of every decoded
    entry: for each listed name, near misses of it, and names listed nowhere; on the host's
    cache too."""
    base, conf = library_dir
    cache_file = base / f"lists.{fmt}"
    write_ld_so_cache(cache_file, conf, "-c", fmt)
    from seedance.resolve import ldcache
    for path in (str(cache_file), "/etc/ld.so.cache"):
        listed = {entry.name for entry in parse(Path(path).read_bytes())[0]}  # the whole table decoded
        probes = listed | {name + "x" for name in listed} | {"a" + name for name in listed} | {"libnot-there.so.1", ""}
        for decoded in (False, True):  # the search over the raw table, then over decoded entries
            ldcache._LOADED.clear()
            cache = LdCache.load(path)
            if decoded:
                assert len(cache.entries) == len(parse(Path(path).read_bytes())[0])
            for name in probes:  # none of them differs from a listed name only by a leading zero
                assert cache.lists(name) is (name in listed), (path, decoded, name)
        assert listed  # the oracle compared something
    # a digit run with a leading zero is the same name to ld.so's comparison (_dl_cache_libcmp)
    assert LdCache.load(str(cache_file)).lists("libnum.so.01") and not LdCache.load(str(cache_file)).lists("libnum.so.3")


@needs_ldconfig
def test_libcmp_agrees_with_ldconfig_sort_order(library_dir):
    """ldconfig writes entries sorted by the same comparator, descending; binary search needs it."""
    base, conf = library_dir
    cache_file = base / "cache.order"
    write_ld_so_cache(cache_file, conf)
    for path in (str(cache_file), "/etc/ld.so.cache"):
        names = [e.name for e in LdCache.load(path).entries]
        assert all(libcmp(a, b) >= 0 for a, b in zip(names, names[1:])), path
    names = [e.name for e in LdCache.load(str(cache_file)).entries]
    # plain string order would put .so.10 between .so.1 and .so.2
    assert names.index("libnum.so.10") < names.index("libnum.so.2") < names.index("libnum.so.1")


@pytest.mark.parametrize("blob", [
    b"", b"glibc-ld.so.cache1.1", b"ld.so-1.7.0\0\xff\xff\xff\x7f",
    b"glibc-ld.so.cache1.1" + b"\xff\xff\xff\x7f" + b"\0" * 40,
    b"not a cache at all" * 10,
])
def test_corrupt_caches_are_empty_not_crashes(tmp_path, blob):
    path = tmp_path / "cache"
    path.write_bytes(blob)
    cache = LdCache.load(str(path))
    assert cache.entries == [] and cache.lookup("libc.so.6") is None
    with pytest.raises(BadInput):
        parse(blob)


def test_truncated_system_cache_raises_bad_input_only():
    data = Path("/etc/ld.so.cache").read_bytes()
    for cut in range(0, min(len(data), 4096), 97):
        try:
            parse(data[:cut])
        except BadInput:
            pass


def test_missing_cache_is_empty(tmp_path):
    cache = LdCache.load(str(tmp_path / "none"))
    assert cache.format == "missing" and cache.lookup("libc.so.6") is None


def test_fuzzed_caches_raise_only_bad_input():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    data = Path("/etc/ld.so.cache").read_bytes()[:8192]

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(st.lists(st.tuples(st.integers(0, len(data) - 1), st.integers(0, 255)), max_size=30),
           st.integers(16, len(data)))
    def fuzz(flips, cut):
        blob = bytearray(data[:cut])
        for where, value in flips:
            if where < len(blob):
                blob[where] = value
        try:
            entries, _fmt = parse(bytes(blob))
        except BadInput:
            return
        cache = LdCache(entries, "new", "fuzz")
        for entry in entries[:20]:
            cache.lookup(entry.name, "x86_64", {"x86-64-v2": 1})

    fuzz()


@needs_ldconfig
@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_one_resolver_sees_ld_so_cache_rewritten_between_closures(tmp_path):
    """ld.so.cache is stamped once per closure and the searches remembered per requester
    are dropped with it: ldconfig rewriting the cache between two closures of one Resolver
    moves the answer to the new entry (as a new ld.so process would see it)."""
    from seedance.resolve import Resolver

    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "foo.c").write_text(f"int foo_{side}(void) {{ return 1; }}\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libseedfoo.so.1", "-o",
                        str(tmp_path / side / "libseedfoo.so.1"), str(tmp_path / side / "foo.c")], check=True)
    (tmp_path / "user.c").write_text("int user(void) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "libuser.so"), str(tmp_path / "user.c"),
                    "-Wl,--no-as-needed", str(tmp_path / "a" / "libseedfoo.so.1")], check=True)
    cache, conf = tmp_path / "ld.so.cache", tmp_path / "ld.so.conf"
    resolver = Resolver(env={}, cache_path=str(cache))
    seen = []
    for side in ("a", "b", "a"):
        conf.write_text(str(tmp_path / side) + "\n")
        write_ld_so_cache(cache, conf)
        closure = resolver.closure(str(tmp_path / "libuser.so"))
        found = [r for r in closure.resolutions if r.name == "libseedfoo.so.1"][0]
        seen.append((found.source, found.path))
    assert seen == [("ld.so.cache", str(tmp_path / side / "libseedfoo.so.1")) for side in ("a", "b", "a")]
