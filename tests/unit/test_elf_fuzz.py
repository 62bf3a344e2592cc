"""Fuzzing read_elf with hypothesis: truncated, garbage and hostile ELF files.

Real small objects are mutated where it hurts (header fields, program headers, the dynamic
section, string tables, version and hash tables, huge counts).  read_elf must either
succeed or raise ELFError: never another exception, never a hang (each example runs
under an alarm).
"""
from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seedance.elf import read_elf
from seedance.model.errors import ELFError, SeedanceError

EXAMPLE_SECONDS = 5


class Hang(Exception):
    pass


def _alarm(_signum, _frame):
    raise Hang("read_elf did not finish")


def seeds() -> dict:
    """name -> bytes of small real ELF objects (64-bit, with versions, rpath, symbols)."""
    out = {}
    for path in ("/usr/bin/true", "/usr/lib/x86_64-linux-gnu/libdl.so.2"):
        if os.path.exists(path):
            out[os.path.basename(path)] = open(os.path.realpath(path), "rb").read()
    if shutil.which("gcc"):
        work = tempfile.mkdtemp(prefix="seedance-fuzz-")
        src = os.path.join(work, "v.c")
        mapf = os.path.join(work, "v.map")
        with open(src, "w") as handle:
            handle.write("int f1(void){return 1;} int f2(void){return 2;} extern int ext(void);"
                         "int g(void){return ext();}\n")
        with open(mapf, "w") as handle:
            handle.write("V1 { global: f1; g; local: *; };\nV2 { global: f2; } V1;\n")
        lib = os.path.join(work, "libv.so")
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", lib, src, "-Wl,-soname,libv.so.1",
                        f"-Wl,--version-script,{mapf}", "-Wl,-rpath,$ORIGIN/x"], check=True)
        out["libv.so"] = open(lib, "rb").read()
        shutil.rmtree(work, ignore_errors=True)
    return out


SEEDS = seeds()
pytestmark = pytest.mark.skipif(not SEEDS, reason="no seed ELF files on this host")


def interesting_offsets(data: bytes) -> list:
    """Offsets of the fields a hostile file would attack: header, phdrs, PT_DYNAMIC entries."""
    offsets = list(range(0, 64, 2))
    try:
        phoff, = struct.unpack_from("<Q", data, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
        for index in range(min(phnum, 32)):
            base = phoff + index * phentsize
            offsets += [base + k for k in range(0, 56, 8)]
            p_type, = struct.unpack_from("<I", data, base)
            if p_type == 2:  # PT_DYNAMIC: every d_tag/d_val
                p_offset, = struct.unpack_from("<Q", data, base + 8)
                p_filesz, = struct.unpack_from("<Q", data, base + 32)
                offsets += [p_offset + k for k in range(0, min(p_filesz, 800), 8)]
    except struct.error:
        pass
    return [o for o in offsets if 0 <= o < len(data)]


def check(data: bytes, workdir: str) -> None:
    path = os.path.join(workdir, "fuzzed.so")
    with open(path, "wb") as handle:
        handle.write(data)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(EXAMPLE_SECONDS)
    try:
        read_elf(path, symbols=True, fatbin=True)
    except ELFError:
        pass
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def workdir():
    path = tempfile.mkdtemp(prefix="seedance-fuzz-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

seed_names = st.sampled_from(sorted(SEEDS)) if SEEDS else st.nothing()


@FUZZ
@given(name=seed_names, fraction=st.floats(0, 1))
def test_truncated(workdir, name, fraction):
    data = SEEDS[name]
    check(data[:int(len(data) * fraction)], workdir)


@FUZZ
@given(name=seed_names, data=st.data())
def test_hostile_fields(workdir, name, data):
    blob = bytearray(SEEDS[name])
    offsets = interesting_offsets(bytes(blob))
    for _ in range(data.draw(st.integers(1, 6))):
        where = data.draw(st.sampled_from(offsets))
        value = data.draw(st.sampled_from([0, 1, 0x7F, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF,
                                           (1 << 63) - 1, (1 << 64) - 1, len(blob), len(blob) - 1]) |
                          st.integers(0, (1 << 64) - 1))
        width = data.draw(st.sampled_from([1, 2, 4, 8]))
        value &= (1 << (8 * width)) - 1
        if where + width <= len(blob):
            blob[where:where + width] = value.to_bytes(width, "little")
    check(bytes(blob), workdir)


@FUZZ
@given(name=seed_names, data=st.data())
def test_random_bytes_and_unterminated_strings(workdir, name, data):
    blob = bytearray(SEEDS[name])
    if data.draw(st.booleans()):
        # wipe NULs over a stretch: string tables lose their terminators
        start = data.draw(st.integers(0, len(blob) - 1))
        length = data.draw(st.integers(1, 4096))
        blob[start:start + length] = b"A" * len(blob[start:start + length])
    for _ in range(data.draw(st.integers(0, 20))):
        where = data.draw(st.integers(0, len(blob) - 1))
        blob[where] = data.draw(st.integers(0, 255))
    check(bytes(blob), workdir)


@FUZZ
@given(prefix=st.sampled_from([b"\x7fELF", b"\x7fELF\x02\x01\x01", b"\x7fELF\x01\x01\x01",
                               b"\x7fELF\x02\x02\x01"]),
       tail=st.binary(min_size=0, max_size=512))
def test_garbage_after_magic(workdir, prefix, tail):
    check(prefix + tail, workdir)


def test_resolver_on_hostile_root_raises_only_seedance_errors(workdir):
    """The resolver must turn a hostile root into one SeedanceError as well."""
    from seedance.resolve import Resolver
    name = sorted(SEEDS)[0]
    blob = bytearray(SEEDS[name])
    path = os.path.join(workdir, "root.so")
    for where in interesting_offsets(bytes(blob))[::3]:
        mutated = bytearray(blob)
        mutated[where:where + 4] = b"\xff\xff\xff\x7f"
        with open(path, "wb") as handle:
            handle.write(mutated)
        try:
            Resolver().closure(path, symbols=True)
        except SeedanceError:
            pass


def test_fifo_and_devices_do_not_hang(workdir):
    fifo = os.path.join(workdir, "fifo.so")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    for path in (fifo, "/dev/null", "/dev/zero"):
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(EXAMPLE_SECONDS)
        try:
            with pytest.raises(ELFError):
                read_elf(path)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
