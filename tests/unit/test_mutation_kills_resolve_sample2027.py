"""Tests written for the survivors of the seed-2027 mutation sample of agent/resolve/
(bench/run_mutation.py, issue 17).

Every expectation comes from outside the code under test: the real ld.so (a dlopen with
RTLD_NOW in a child, LD_DEBUG=scopes), the real /proc/PID/maps of a child that we start, a
cache file written by the real ldconfig, pyelftools, and the GNU_PROPERTY_X86_ISA_1_* values
of the system's <elf.h>."""
from __future__ import annotations

import os
import re
import shutil
import signal
import struct
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import process_fixtures as F  # noqa: E402

from seedance.model.errors import BadInput  # noqa: E402
from seedance.resolve import Resolver  # noqa: E402
from seedance.resolve.process import RTLD_NOW, Load, Simulator, live, why  # noqa: E402

CLEAN = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not found")


def _file_key(path):
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _real_dlopen(host, *paths, env=None):
    """(ok, dlerror text or 'ok') of a real RTLD_NOW dlopen sequence in a child."""
    proc = subprocess.run([host, *paths], capture_output=True, timeout=60, env={**CLEAN, **(env or {})})
    return proc.returncode == 0, proc.stdout.decode("utf-8", "replace").strip()


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("sample2027"))


@pytest.fixture(scope="module")
def host(root):
    return F.host_program(os.path.join(root, "host"))


# --- ldcache.py ------------------------------------------------------------------------------

def test_old_format_cache_with_a_string_offset_past_the_end_is_refused(tmp_path):
    """_string: an old-format ("ld.so-1.7.0") cache written by the real ldconfig, its first
    entry's key pointed past the end of the file: one BadInput line naming the fault."""
    from seedance.resolve.ldcache import OLD_ENTRY, OLD_HEADER, parse

    ldconfig = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
    if ldconfig is None:
        pytest.skip("ldconfig not found")
    conf = tmp_path / "ld.conf"
    conf.write_text(f"{tmp_path}\n")
    cache = tmp_path / "old.cache"
    made = subprocess.run([ldconfig, "-c", "old", "-C", str(cache), "-f", str(conf)], capture_output=True)
    if made.returncode != 0 or not cache.exists() or not cache.read_bytes().startswith(b"ld.so-1.7.0"):
        pytest.skip("this ldconfig does not write the old format")
    data = bytearray(cache.read_bytes())
    _magic, nlibs = OLD_HEADER.unpack_from(data, 0)
    entries, fmt = parse(bytes(data))
    assert fmt == "old" and len(entries) == nlibs > 0  # the untouched file parses
    flags, _key, value = OLD_ENTRY.unpack_from(data, OLD_HEADER.size)
    OLD_ENTRY.pack_into(data, OLD_HEADER.size, flags, len(data), value)
    with pytest.raises(BadInput) as raised:
        parse(bytes(data))
    assert str(raised.value) == "ld.so.cache: string offset out of range"


def _elf_h_isa_bits():
    """GNU_PROPERTY_X86_ISA_1_{BASELINE,V2,V3,V4} from the system's <elf.h>."""
    try:
        text = open("/usr/include/elf.h", encoding="utf-8", errors="replace").read()
    except OSError:
        pytest.skip("/usr/include/elf.h not found")
    bits = {}
    for name in ("BASELINE", "V2", "V3", "V4"):
        match = re.search(rf"#define\s+GNU_PROPERTY_X86_ISA_1_{name}\s+\(1U\s*<<\s*(\d+)\)", text)
        if match is None:
            pytest.skip(f"<elf.h> has no GNU_PROPERTY_X86_ISA_1_{name}")
        bits[name] = 1 << int(match.group(1))
    return [bits["BASELINE"], bits["V2"], bits["V3"], bits["V4"]]


def test_isa_level_compatible_follows_the_elf_h_bits():
    """dl_cache_hwcap_isa_level_compatible: ldconfig stores the index of the highest
    GNU_PROPERTY_X86_ISA_1 bit in hwcap bits 32..; an entry loads on a CPU whose isa_1 has
    that bit.  A CPU of level k has every bit up to k (<elf.h>: each level includes the one
    below)."""
    from seedance.resolve.ldcache import isa_level_compatible

    bits = _elf_h_isa_bits()
    for cpu_level in range(len(bits)):
        isa_1 = 0
        for bit in bits[:cpu_level + 1]:
            isa_1 |= bit
        for lib_level, bit in enumerate(bits):
            index = bit.bit_length() - 1
            assert isa_level_compatible(index << 32, isa_1) is (lib_level <= cpu_level), (cpu_level, lib_level)


# --- process.py: live ------------------------------------------------------------------------

PAUSING_HOST = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!dlopen(argv[i], RTLD_NOW)) { printf("%s\n", dlerror()); fflush(stdout); return 1; }
    printf("ok\n");
    fflush(stdout);
    char c;
    return read(0, &c, 1) < 0;  /* stay mapped until the test closes stdin */
}
"""


def _mapped_files(pid):
    """The files of /proc/PID/maps in first-mapped order (what `seedance live` reads)."""
    seen = []
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="surrogateescape") as handle:
        for line in handle:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                path = parts[5].rstrip("\n")
                if path not in seen:
                    seen.append(path)
    return seen


def test_live_reports_a_needed_answered_by_another_mapped_copy(root):
    """libuser.so NEEDs libgone.so (found in the child through LD_LIBRARY_PATH, which the
    resolver below is not given) and then libfoo.so.1, which its RPATH would find in own/;
    the child maps other/libfoo.so.1 first, so ld.so answers libuser's NEEDED with it (the
    SONAME is already in the namespace).  live() must report that shadowing, even though
    libuser's first NEEDED is not found on its own."""
    base = os.path.join(root, "live")
    src = os.path.join(base, "host.c")
    os.makedirs(base, exist_ok=True)
    with open(src, "w") as handle:
        handle.write(PAUSING_HOST)
    exe = os.path.join(base, "host")
    F.gcc("-o", exe, src, "-ldl")
    other = F.shared_lib(os.path.join(base, "other", "libfoo.so.1"), "int foo(void){return 2;}\n",
                         soname="libfoo.so.1")
    own = F.shared_lib(os.path.join(base, "lib", "own", "libfoo.so.1"), "int foo(void){return 1;}\n",
                       soname="libfoo.so.1")
    F.shared_lib(os.path.join(base, "gone", "libgone.so"), "int gone(void){return 3;}\n", soname="libgone.so")
    user = F.shared_lib(os.path.join(base, "lib", "libuser.so"),
                        "extern int gone(void); extern int foo(void);\nint use(void){return gone() + foo();}\n",
                        soname="libuser.so", rpath="$ORIGIN/own",
                        links=("-Wl,--no-as-needed", f"-L{base}/gone", "-l:libgone.so",
                               f"-L{base}/lib/own", "-l:libfoo.so.1"))
    child = subprocess.Popen([exe, other, user], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env={**CLEAN, "LD_LIBRARY_PATH": os.path.join(base, "gone")})
    try:
        assert child.stdout.readline().decode("utf-8", "replace").strip() == "ok"
        mapped = _mapped_files(child.pid)
    finally:
        child.stdin.close()
        child.wait(timeout=60)
    keys = {_file_key(p) for p in mapped}
    # the real process: libuser mapped, its NEEDED libfoo.so.1 answered by other/, not own/
    assert _file_key(user) in keys and _file_key(other) in keys and _file_key(own) not in keys
    resolver = Resolver(env={})
    sim, shadowed = live(resolver, exe, mapped)
    assert [(s.requester, s.name, _file_key(s.used), _file_key(s.alone)) for s in shadowed] == \
        [(user, "libfoo.so.1", _file_key(other), _file_key(own))]
    assert shadowed[0].loaded_by == sim.model.loaded_by[shadowed[0].used][0]


# --- process.py: why, Simulator ----------------------------------------------------------------

@pytest.fixture(scope="module")
def ver_libs(root):
    base = os.path.join(root, "why")
    ver = F.shared_lib(os.path.join(base, "libver.so.1"), "int ver(void){return 1;}\n", soname="libver.so.1")
    first = F.shared_lib(os.path.join(base, "libfirst.so"), "extern int ver(void);\nint f1(void){return ver();}\n",
                         soname="libfirst.so", links=(f"-L{base}", "-l:libver.so.1"), rpath="$ORIGIN")
    second = F.shared_lib(os.path.join(base, "libsecond.so"),
                          "extern int ver(void);\nint f2(void){return ver();}\n",
                          soname="libsecond.so", links=(f"-L{base}", "-l:libver.so.1"), rpath="$ORIGIN")
    return dict(ver=ver, first=first, second=second)


def test_why_lists_the_later_requesters_an_object_answered(host, ver_libs):
    """dlopen libfirst (maps libver.so.1), then libsecond, whose NEEDED libver.so.1 ld.so
    answers with the object already loaded (one libver in the real process)."""
    assert _real_dlopen(host, ver_libs["first"], ver_libs["second"]) == (True, "ok")
    sim = Simulator(Resolver(env={}), host)
    sim.start()
    assert sim.dlopen(Load(ver_libs["first"], "dlopen", RTLD_NOW)).ok
    assert sim.dlopen(Load(ver_libs["second"], "dlopen", RTLD_NOW)).ok
    chains = why(sim.model, "libver.so.1", sim.resolver)
    assert [c.path for c in chains] == [ver_libs["ver"]]
    assert [(link.requester, link.name, link.path) for link in chains[0].links] == \
        [(ver_libs["first"], "libver.so.1", ver_libs["ver"])]
    assert [(link.requester, link.name, link.path, link.source) for link in chains[0].also] == \
        [(ver_libs["second"], "libver.so.1", ver_libs["ver"], "loaded")]


def test_why_stops_on_a_needed_that_finds_the_dlopened_root_again(host, root):
    """libr.so (no SONAME, dlopened by path) NEEDs libd.so, which NEEDs "libr.so" back: ld.so
    finds /x/libr.so by RPATH, the same inode as the root, and maps nothing new.  The NEEDED
    links then form a cycle; why() must still end (a guard turns a loop into a failure)."""
    base = os.path.join(root, "cycle")
    libr = F.shared_lib(os.path.join(base, "libr.so"), "int r0(void){return 0;}\n")  # stub to link against
    libd = F.shared_lib(os.path.join(base, "libd.so"), "extern int r0(void);\nint d(void){return r0();}\n",
                        soname="libd.so", rpath="$ORIGIN", links=("-Wl,--no-as-needed", f"-L{base}", "-l:libr.so"))
    F.shared_lib(libr, "extern int d(void);\nint r0(void){return 0;}\nint r(void){return d();}\n",
                 rpath="$ORIGIN", links=("-Wl,--no-as-needed", f"-L{base}", "-l:libd.so"))
    assert _real_dlopen(host, libr) == (True, "ok")
    sim = Simulator(Resolver(env={}), host)
    sim.start()
    step = sim.dlopen(Load(libr, "dlopen", RTLD_NOW))
    assert step.ok and list(step.new_objects) == [libr, libd]

    def _stuck(_signum, _frame):
        raise TimeoutError("why() did not end on a NEEDED cycle")

    previous = signal.signal(signal.SIGALRM, _stuck)
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        chains = why(sim.model, "libd.so", sim.resolver)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert [c.path for c in chains] == [libd]
    assert (chains[0].links[-1].requester, chains[0].links[-1].name, chains[0].links[-1].path) == \
        (libr, "libd.so", libd)


def test_dlopen_through_a_symlink_is_the_object_already_loaded(host, ver_libs, tmp_path):
    """ld.so compares (st_dev, st_ino) (_dl_map_object_from_fd): a second dlopen of the same
    file under another path returns the same handle and maps nothing."""
    alias = str(tmp_path / "alias.so")
    os.symlink(ver_libs["ver"], alias)
    code = ("import ctypes,sys; a=ctypes.CDLL(sys.argv[1]); b=ctypes.CDLL(sys.argv[2]); "
            "print(a._handle == b._handle)")
    real = subprocess.run([sys.executable, "-c", code, ver_libs["ver"], alias], capture_output=True, timeout=60,
                          env=CLEAN)
    assert real.stdout.decode("utf-8", "replace").strip() == "True"
    sim = Simulator(Resolver(env={}), host)
    sim.start()
    assert sim.dlopen(Load(ver_libs["ver"], "dlopen", RTLD_NOW)).new_objects == (ver_libs["ver"],)
    again = sim.dlopen(Load(alias, "dlopen", RTLD_NOW))
    assert again.ok and again.already_loaded and again.new_objects == ()


def test_dlopen_of_a_library_whose_needed_is_missing_fails_as_ld_so_says(host, root):
    base = os.path.join(root, "missing")
    F.shared_lib(os.path.join(base, "gone", "libgone.so"), "int gone(void){return 3;}\n", soname="libgone.so")
    user = F.shared_lib(os.path.join(base, "libneedsgone.so"), "extern int gone(void);\nint n(void){return gone();}\n",
                        soname="libneedsgone.so", links=(f"-L{base}/gone", "-l:libgone.so"))
    real_ok, real_text = _real_dlopen(host, user)
    assert not real_ok
    sim = Simulator(Resolver(env={}), host)
    sim.start()
    step = sim.dlopen(Load(user, "dlopen", RTLD_NOW))
    assert (step.ok, step.error) == (real_ok, real_text)


def test_start_scope_is_ld_sos_main_search_list(host):
    """LD_DEBUG=scopes: 'scope 0' of the main program is the global scope at start."""
    proc = subprocess.run([host], capture_output=True, timeout=60, env={**CLEAN, "LD_DEBUG": "scopes"})
    text = proc.stderr.decode("utf-8", "replace")
    match = re.search(r"object=\S+ \[0\]\n\s*\d+:\s*scope 0: (.*)\n", text)
    assert match, text
    real = [_file_key(p) for p in match.group(1).split()]
    assert len(real) >= 3  # the program, libc, ld.so
    sim = Simulator(Resolver(env={}), host)
    step = sim.start()
    assert step.ok
    assert [_file_key(p) for p in step.scope] == real


# --- resolver.py ---------------------------------------------------------------------------

def test_read_elf_falls_back_when_the_c_reader_declines(monkeypatch):
    """fastread.read answers None for a path with a NUL (it cannot be passed to C): the
    Python reader then decides, and refuses it like open() does."""
    from seedance.elf import fastread
    from seedance.resolve.resolver import _read_elf

    if not fastread.available():
        pytest.skip("the C ELF reader is not built here")
    monkeypatch.delenv("SEEDANCE_ELF_READER", raising=False)
    assert fastread.enabled()
    path = sys.executable + "\0x"
    assert fastread.read(path) is None
    with pytest.raises(ValueError):
        open(path, "rb")
    with pytest.raises(ValueError):
        _read_elf(path)


def test_closures_of_the_same_file_compare_equal(ver_libs):
    one = Resolver(env={}).closure(ver_libs["first"])
    two = Resolver(env={}).closure(ver_libs["first"])
    assert one is not two and one == two
    assert one != Resolver(env={}).closure(ver_libs["second"])
    assert one != "not a closure"


def _set_dynsym_binding(path, name, binding):
    """Rewrite the st_info binding of dynamic symbol ``name`` in place (pyelftools finds it)."""
    elftools = pytest.importorskip("elftools.elf.elffile")
    with open(path, "rb") as handle:
        elf = elftools.ELFFile(handle)
        dynsym = elf.get_section_by_name(".dynsym")
        index = next(i for i, s in enumerate(dynsym.iter_symbols()) if s.name == name)
        offset = dynsym["sh_offset"] + index * dynsym["sh_entsize"] + 4  # Elf64_Sym.st_info
    with open(path, "r+b") as handle:
        handle.seek(offset)
        info = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([(binding << 4) | (info & 0xF)]))


def test_a_local_dynamic_symbol_defines_nothing(host, root):
    """dl-lookup.c do_lookup_x ignores STB_LOCAL definitions: libprov's `provided`, turned
    LOCAL in .dynsym, no longer satisfies libneeds' reference (ld.so says so).  (Both ELF
    readers already drop STB_LOCAL symbols, so _symbol_tables' own LOCAL test is a second
    guard; this pins the behaviour, whichever layer keeps it.)"""
    base = os.path.join(root, "local")
    prov = F.shared_lib(os.path.join(base, "libprov.so"), "int provided(void){return 5;}\nint other(void){return 1;}\n",
                        soname="libprov.so")
    needs = F.shared_lib(os.path.join(base, "libneeds.so"),
                         "extern int provided(void);\nint n(void){return provided();}\n",
                         soname="libneeds.so", links=(f"-L{base}", "-l:libprov.so"), rpath="$ORIGIN")
    assert _real_dlopen(host, needs) == (True, "ok")
    _set_dynsym_binding(prov, "provided", 0)  # STB_LOCAL
    real_ok, real_text = _real_dlopen(host, needs)
    assert not real_ok and "undefined symbol: provided" in real_text, real_text
    resolver = Resolver(env={})
    closure = resolver.closure(needs, symbols=True)
    assert [(r, s) for r, s, _v in resolver.undefined(closure) if s == "provided"] == [(needs, "provided")]


def _gap_layout(base):
    """libuser.so built against a libprov.so.1 that defines foo@@VER_2, installed next to an
    older libprov.so.1 that has both nodes but foo at VER_1 only: (user, old provider)."""
    script = "VER_1 { global: %s; local: *; };\nVER_2 { global: %s; } VER_1;\n"
    F.shared_lib(os.path.join(base, "new", "libprov.so.1"), "int foo(void){return 2;}\nint bar(void){return 1;}\n",
                 soname="libprov.so.1", version_script=script % ("bar", "foo"))
    old = F.shared_lib(os.path.join(base, "libprov.so.1"), "int foo(void){return 1;}\nint bar(void){return 1;}\n",
                       soname="libprov.so.1", version_script=script % ("foo", "bar"))
    user = F.shared_lib(os.path.join(base, "libuser.so"), "extern int foo(void);\nint u(void){return foo();}\n",
                        soname="libuser.so", links=(f"-L{base}/new", "-l:libprov.so.1"), rpath="$ORIGIN")
    return user, old


def test_version_gap_when_the_symbol_sits_at_another_node(host, root):
    """The version check passes (node VER_2 exists), relocation does not."""
    user, old = _gap_layout(os.path.join(root, "gap"))
    real_ok, real_text = _real_dlopen(host, user)
    assert not real_ok and real_text.endswith("undefined symbol: foo, version VER_2"), real_text
    resolver = Resolver(env={})
    gaps = resolver.version_gaps(resolver.closure(user))
    assert [(g.requester, g.symbol, g.version, g.provider) for g in gaps] == [(user, "foo", "VER_2", old)]


VER_FLG_WEAK = 0x2  # <elf.h>


def _set_vernaux_flags(path, version, flags):
    """Rewrite vna_flags of the verneed entry for ``version`` in place (pyelftools finds the
    section; Elf64_Verneed / Elf64_Vernaux are laid out as <elf.h> declares them)."""
    elftools = pytest.importorskip("elftools.elf.elffile")
    with open(path, "rb") as handle:
        elf = elftools.ELFFile(handle)
        section = elf.get_section_by_name(".gnu.version_r")
        start, data = section["sh_offset"], section.data()
        names = [aux.name for _need, auxes in section.iter_versions() for aux in auxes]
    offsets, need = [], 0
    while True:
        _ver, cnt, _file, aux_off, next_need = struct.unpack_from("<HHIII", data, need)
        aux = need + aux_off
        for _ in range(cnt):
            offsets.append(aux)
            aux += struct.unpack_from("<I", data, aux + 12)[0]
        if not next_need:
            break
        need += next_need
    offset = start + offsets[names.index(version)] + 4  # Elf64_Vernaux.vna_flags
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(struct.pack("<H", flags))


def test_version_gap_behind_a_weak_verneed_entry(host, root):
    """A weak verneed entry only excuses a missing node (dl-version.c); a strong X@V whose node
    exists but lacks X still fails relocation, and ld.so says so (found by mutant version_gaps
    3 of the seed-2027 sample: version_gaps skipped weak entries)."""
    user, old = _gap_layout(os.path.join(root, "weakgap"))
    _set_vernaux_flags(user, "VER_2", VER_FLG_WEAK)
    real_ok, real_text = _real_dlopen(host, user)
    assert not real_ok and real_text.endswith("undefined symbol: foo, version VER_2"), real_text
    resolver = Resolver(env={})
    closure = resolver.closure(user)
    assert [c.weak for c in closure.version_checks if c.version == "VER_2"] == [True]  # the patch took
    gaps = resolver.version_gaps(closure)
    assert [(g.requester, g.symbol, g.version, g.provider) for g in gaps] == [(user, "foo", "VER_2", old)]
