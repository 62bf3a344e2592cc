"""Pieces of `seedance trace` that need no root: the shared event layout, the facts the
events establish, and the command line."""
from __future__ import annotations

import ctypes
import subprocess

import pytest

from trace_helpers import _cc


def test_ctypes_layout_matches_what_the_compiler_lays_out(tmp_path):
    """events.h is the one definition: the parsed ctypes mirror must agree with gcc on
    every offset and on the size, so the two sides cannot drift."""
    from seedance.probes import PROBES_DIR, layout

    struct = layout.event_struct()
    fields = [name for name, _ in struct._fields_]
    source = tmp_path / "offsets.c"
    source.write_text(
        "#include <stddef.h>\n#include <stdio.h>\n#include <stdint.h>\n"
        "typedef uint8_t u8; typedef uint16_t u16; typedef uint32_t u32; typedef uint64_t u64;\n"
        "typedef int32_t s32; typedef int64_t s64;\n"
        '#include "events.h"\nint main(void) {\n'
        '  printf("size %zu\\n", sizeof(struct sd_event));\n'
        + "".join(f'  printf("{f} %zu\\n", offsetof(struct sd_event, {f}));\n' for f in fields)
        + "  return 0;\n}\n")
    _cc("-I", PROBES_DIR, source, "-o", tmp_path / "offsets")
    out = subprocess.run([str(tmp_path / "offsets")], capture_output=True, text=True, check=True).stdout
    compiled = dict(line.split() for line in out.splitlines())
    assert int(compiled["size"]) == ctypes.sizeof(struct)
    for name in fields:
        assert int(compiled[name]) == getattr(struct, name).offset, name


def test_every_api_constant_has_a_name():
    from seedance.probes import layout
    from seedance.trace.session import API_NAMES

    declared = {name for name in layout.constants() if name.startswith("SD_API_")}
    assert declared == set(API_NAMES)


def _event(kind, pid=10, tid=10, **data):
    from seedance.trace.events import TraceEvent
    return TraceEvent(kind=kind, pid=pid, tid=tid, data=data)


def test_leak_accounting_groups_by_device_and_library():
    from seedance.trace.facts import LiveFacts

    live = LiveFacts()
    live.process(10).exe = "/opt/app"
    live.process(10).objects["lm1"] = __import__("seedance.trace.facts", fromlist=["_Object"])._Object(
        path="/opt/libkern.so", base=0x7000, namespace=0, info=live.files.get("/nonexistent"))
    assert live.feed(_event("cuda_alloc", ptr="0x1", bytes=100, device=0, api="cuMemAlloc_v2", caller=0x7100)) == []
    live.feed(_event("cuda_alloc", ptr="0x2", bytes=50, device=0, api="cuMemAlloc_v2", caller=0x7200))
    live.feed(_event("cuda_alloc", ptr="0x3", bytes=7, device=1, api="cudaMalloc", caller=0x7300))
    live.feed(_event("cuda_free", ptr="0x2"))
    facts = live.feed(_event("exit"))
    leaks = sorted((f.data["device"], f.data["bytes"], f.data["library"], f.data["allocations"]) for f in facts)
    assert leaks == [(0, 100, "/opt/libkern.so", 1), (1, 7, "/opt/libkern.so", 1)]
    assert all(f.kind == "instance_leak" for f in facts)


def test_failed_dlopen_rolls_back_what_it_mapped(tmp_path):
    """glibc unloads every object of a failed dlopen: a runtime it mapped is not mixed in."""
    from seedance.trace.facts import LiveFacts

    a = tmp_path / "libcudart.so.12"
    b = tmp_path / "libcudart.so.13"
    a.write_bytes(b"not elf")
    b.write_bytes(b"not elf")
    live = LiveFacts()
    live.feed(_event("object", path=str(a), link_map="0x1", base=1, namespace=0))
    live.feed(_event("dlopen", path=str(b), caller=0))
    assert live.feed(_event("object", path=str(b), link_map="0x2", base=2, namespace=0))  # mixed now
    live.feed(_event("dlopen_ret", path=str(b), ok=False, loaded=None))
    assert set(live.processes[10].runtimes) == {str(a)}


def test_dlsym_misses_are_not_load_failures():
    from seedance.trace.facts import LiveFacts

    live = LiveFacts()
    miss = live.feed(_event("loader_error", object="/lib/libz.so.1", message="undefined symbol: nope",
                            context="dlsym"))
    assert miss == []
    fatal = live.feed(_event("loader_error", object="/opt/libx.so", message="undefined symbol: nope",
                             context="startup"))
    assert fatal[0].kind == "undefined_symbol" and fatal[0].data["loader_message"] == \
        "/opt/libx.so: undefined symbol: nope"


def test_ebpf_flag_prints_the_one_program(cli):
    proc = cli("trace", "--ebpf")
    assert proc.returncode == 0
    for marker in ("proc.bpf.c", "dlopen.bpf.c", "loader_errors.bpf.c", "linkmap.bpf.c", "cudamem.bpf.c"):
        assert f"---- {marker} ----" in proc.stdout
    assert proc.stdout.count("struct sd_event {") == 1  # the header is included once


def test_help_has_examples(cli):
    proc = cli("trace", "--help")
    assert proc.returncode == 0 and "examples:" in proc.stdout


@pytest.mark.parametrize("args", [["--pid", "1", "--", "true"], ["--duration", "0", "--", "true"],
                                  ["--backend", "audit"], ["--"]])
def test_usage_errors_are_one_line_exit_2(cli, args):
    proc = cli("trace", *args)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
