"""Tests written for the mutants of agent/collect/bundle.py, cuda.py and host.py (issue 17):
mutmut counts a function as untested unless a test calls it in this process, and
tests/integration/test_bundle.py captures through the CLI in a child.  So the capture, the
replay and the collectors are called here, in process, on real inputs, and the values a
mutant would change are compared with oracles from outside the code under test:

* bundles: real gcc builds (and nvcc builds when a toolkit is there, kept in
  ~/.cache/seedance-test-nvcc), a real child process holding secrets in its environment and
  libraries it dlopen()ed, the tar/zstd/gzip bytes read with tarfile, zstandard and gzip and
  the framing checked against RFC 8878 and RFC 1952, /proc/PID/maps and /proc/PID/exe, the
  files under /etc, os.uname(), importlib.metadata; replay is judged against a live check.
* cuda: NVIDIA's driver table written below (CUDA release notes), nvcc's own
  `--version`, pyelftools, the fake CUDA driver tests/fakecuda/fakecuda.c for the runtime's
  verdict.
* host: /proc/cpuinfo, socket, os.uname(), os.environ, the directories on disk.
"""
from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import io
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from seedance.collect import bundle, cuda, host

ROOT = Path(__file__).resolve().parents[2]
GCC = shutil.which("gcc")
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc not installed")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not installed")

# NVIDIA's "CUDA Toolkit and Minimum Required Driver Version for CUDA Minor Version
# Compatibility" table (CUDA release notes, Linux x86_64), written here, not read from
# seedance.collect.cuda; 10.x from the same notes' table 3 (CUDA 10.0.130: >= 410.48).
NVIDIA_FLOORS = {10: "410.48", 11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
# "CUDA Toolkit and Corresponding Driver Versions": the newest CUDA of a driver branch, what
# nvidia-smi prints as "CUDA Version" on it
NVIDIA_BRANCH_CUDA = {410: (10, 0), 418: (10, 1), 440: (10, 2), 450: (11, 0), 470: (11, 4), 525: (12, 0),
                      535: (12, 2), 550: (12, 4), 570: (12, 8), 575: (12, 9), 580: (13, 0), 590: (13, 1)}

SCHEMA_NAME = "seedance.bundle/v1"  # docs/bundle.md
SKIPPABLE_MAGIC = 0x184D2A5E  # RFC 8878, 3.1.2: skippable frames are 0x184D2A50..0x184D2A5F
ZSTD_MAGIC = 0xFD2FB528  # RFC 8878, 3.1.1
GZIP_FNAME = 0x08  # RFC 1952, 2.3.1: FLG.FNAME


def cc(*args):
    subprocess.run([GCC, *map(str, args)], check=True, capture_output=True)


def nvcc_build(source: str, flags: list, out: Path) -> Path:
    """An nvcc build, kept outside the repository keyed by nvcc's own version text, the
    source and the flags: each takes ~10 s, and the mutation run starts this file once per
    mutant."""
    version = subprocess.run([NVCC, "--version"], capture_output=True, text=True, errors="replace").stdout
    key = hashlib.sha256("\0".join([version, source, *flags]).encode()).hexdigest()[:24]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "seedance-test-nvcc"
    kept = cache / f"{key}.bin"
    if not kept.is_file():
        src = out.with_suffix(".cu")
        src.write_text(source)
        proc = subprocess.run([NVCC, *flags, str(src), "-o", str(out)], capture_output=True, text=True,
                              errors="replace")
        assert proc.returncode == 0, proc.stderr
        cache.mkdir(parents=True, exist_ok=True)
        partial = cache / f"{key}.{os.getpid()}.tmp"
        shutil.copyfile(out, partial)
        os.replace(partial, kept)  # whole or absent: a parallel run never reads half a file
    shutil.copyfile(kept, out)
    os.chmod(out, 0o755)
    return out


def nvcc_release() -> tuple:
    """(major, minor) of this nvcc, from its own `--version` ("Cuda compilation tools, release 13.0")."""
    text = subprocess.run([NVCC, "--version"], capture_output=True, text=True, errors="replace").stdout
    found = re.search(r"release (\d+)\.(\d+)", text)
    return int(found.group(1)), int(found.group(2))


def wheel_cudart(major: int) -> Path | None:
    try:
        import nvidia.cuda_runtime as rt
    except ImportError:
        return None
    name = {11: "libcudart.so.11.0", 12: "libcudart.so.12"}[major]
    lib = Path(list(rt.__path__)[0]) / "lib" / name
    return lib if lib.exists() else None


KERNEL = "__global__ void k(int *p) { p[0] = 1; }\nvoid launch(int *p) { k<<<1, 1>>>(p); }\n"
PROBE = ("#include <cstdio>\n#include <cuda_runtime.h>\n"
         "int main() { int n = -1; cudaError_t e = cudaGetDeviceCount(&n); printf(\"%d\\n\", (int)e); return 0; }\n")
HOLDER = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
/* dlopen every library named on the command line, say so, then wait to be killed */
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!dlopen(argv[i], RTLD_NOW)) { fprintf(stderr, "%s\n", dlerror()); return 3; }
    printf("ready\n");
    fflush(stdout);
    pause();
    return 0;
}
"""


def read_members(path: Path) -> list:
    """(name, TarInfo, bytes) of every member, in order, read with the standard library and
    zstandard (not with seedance)."""
    raw = path.read_bytes()
    if struct.unpack_from("<I", raw)[0] in (SKIPPABLE_MAGIC, ZSTD_MAGIC):
        import zstandard

        raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)).read()
    else:
        raw = gzip.decompress(raw)
    out = []
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        for member in tar:
            out.append((member.name, member, tar.extractfile(member).read()))
    return out


# --- one real capture, in process -------------------------------------------------------------
class Captured:
    pass


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    if GCC is None:
        pytest.skip("gcc not installed")
    from seedance.collect.scan import CheckOptions
    from seedance.output import prepare_output

    tmp = tmp_path_factory.mktemp("bundle")
    got = Captured()
    got.tmp = tmp
    got.token = "tok-" + os.urandom(6).hex()
    got.password = "pw-" + os.urandom(6).hex()
    got.cfg_token = "hf_" + os.urandom(6).hex()
    got.cfg_password = "cp" + os.urandom(6).hex()
    got.url_password = "up" + os.urandom(6).hex()
    tree = got.tree = tmp / "tree"
    tree.mkdir()
    (tree / "v.c").write_text("int foo(void) { return 7; }\n")
    (tree / "v.map").write_text("VER_2 { global: foo; local: *; };\n")
    build = tmp / "build"
    build.mkdir()
    (build / "v.map").write_text("VER_1 { global: foo; local: *; };\n")
    cc("-shared", "-fPIC", tree / "v.c", "-o", build / "libv.so", f"-Wl,--version-script={build / 'v.map'}",
       "-Wl,-soname,libv.so")
    cc("-shared", "-fPIC", tree / "v.c", "-o", tree / "libv.so", f"-Wl,--version-script={tree / 'v.map'}",
       "-Wl,-soname,libv.so", "-Wl,--build-id=sha1")
    # the app carries the process's secret in its .rodata: binaries/ are the files byte for
    # byte, never scrubbed, while every other member is
    (tree / "m.c").write_text(f'int foo(void);\nconst char *note = "{got.token}";\n'
                              "int main(void) { return foo() == 7 ? 0 : 3; }\n")
    cc(tree / "m.c", "-o", tree / "app", f"-L{build}", "-lv", "-Wl,-rpath,$ORIGIN")
    got.cu12 = wheel_cudart(12)
    if got.cu12 is not None:
        (tree / "a.c").write_text("int cudaRuntimeGetVersion(int *v);\n"
                                  "int a(void) { int v = 0; cudaRuntimeGetVersion(&v); return v; }\n")
        cc("-shared", "-fPIC", tree / "a.c", "-o", tree / "liba.so", f"-L{got.cu12.parent}", "-l:libcudart.so.12",
           f"-Wl,-rpath,{got.cu12.parent}")
    got.nvcc = NVCC is not None
    if got.nvcc:
        nvcc_build(KERNEL, ["-shared", "-Xcompiler", "-fPIC", "-gencode", "arch=compute_86,code=sm_86",
                            "-gencode", "arch=compute_86,code=compute_86"], tree / "libk.so")
        nvcc_build(PROBE, [], tree / "probe")  # nvcc's default: -cudart static
    config = got.config = tree / "seedance" / "agent.yaml"
    config.parent.mkdir()
    # the preload's URL password reaches a config_env fact and the report's finding too
    config.write_text(f"env:\n  LD_PRELOAD: https://carol:{got.url_password}@mirror.example/libx.so\n"
                      f"  HF_TOKEN: {got.cfg_token}\n"
                      f"otlp_endpoint: https://bob:{got.cfg_password}@otel.example/v1\n")
    # a process that maps a library outside the tree, and one whose file is deleted after
    side = tmp / "side"
    side.mkdir()
    (side / "s.c").write_text("int side(void) { return 1; }\n")
    cc("-shared", "-fPIC", side / "s.c", "-o", side / "libside.so")
    cc("-shared", "-fPIC", side / "s.c", "-o", side / "libgone.so")
    (side / "holder.c").write_text(HOLDER)
    cc(side / "holder.c", "-o", side / "holder", "-ldl")
    # a cuda-compat driver on the loader path (CUDA Compatibility guide: the package's
    # compat/ directory, libcuda.so.<driver version>)
    compat = tmp / "cuda-12.8" / "compat"
    compat.mkdir(parents=True)
    (compat / "libcuda.so.570.124.06").write_bytes(b"")
    got.compat = "570.124.06"
    env = {"PATH": "/usr/bin:/bin", "FOO_TOKEN": got.token, "PLAIN": "kept",
           "DATABASE_URL": f"postgres://alice:{got.password}@db.internal:5432/app"}
    child = subprocess.Popen([side / "holder", side / "libside.so", side / "libgone.so"], env=env,
                             stdout=subprocess.PIPE)
    saved = {k: os.environ.get(k) for k in ("LD_LIBRARY_PATH", "TZ")}
    try:
        assert child.stdout.readline() == b"ready\n"
        (side / "libgone.so").unlink()
        got.pid = child.pid
        got.maps = Path(f"/proc/{child.pid}/maps").read_bytes()
        got.exe = os.readlink(f"/proc/{child.pid}/exe")
        got.env = env
        got.side = side
        os.environ["LD_LIBRARY_PATH"] = str(compat)
        # a local time 7 hours ahead of UTC: "created" must still be UTC
        os.environ["TZ"] = "SDT-7"
        time.tzset()
        got.options = CheckOptions(targets=[str(tree)], pids=[child.pid], arch="sm_90",
                                   driver_version="535.104.05")
        got.path = tmp / "evidence.tar.zst"
        got.stderr = io.StringIO()
        got.before = time.time()
        got.report, got.summary = bundle.capture(got.options, prepare_output(str(got.path), what="bundle"),
                                                 None, with_binaries=True, stderr=got.stderr)
        got.after = time.time()
        # the same tree without a process, binaries or GPU options, as gzip
        got.plain_options = CheckOptions(targets=[str(tree)])
        got.plain_path = tmp / "plain.tar.gz"
        got.plain_stderr = io.StringIO()
        got.plain_report, got.plain_summary = bundle.capture(
            got.plain_options, prepare_output(str(got.plain_path), what="bundle"), None, stderr=got.plain_stderr)
    finally:
        child.kill()
        child.wait()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        time.tzset()
    got.members = read_members(got.path)
    got.held = {name: data for name, _info, data in got.members}
    got.plain_members = read_members(got.plain_path)
    got.plain_held = {name: data for name, _info, data in got.plain_members}
    return got


def _json(data: bytes):
    return json.loads(data.decode("utf-8", "surrogateescape"))


def test_capture_says_what_it_does_and_sums_it_up(captured):
    c = captured
    facts, objects = _json(c.held["facts.json"]), _json(c.held["objects.json"])
    size = c.path.stat().st_size
    assert c.stderr.getvalue().splitlines() == [
        f"seedance: bundle: {len(facts)} facts, {len(objects)} objects, 1 processes",
        "seedance: bundle: reading objects (sha256, dynamic sections, fatbin inventories)",
        "seedance: bundle: host facts, ld.so configuration, processes, configs",
        f"seedance: bundle: writing {size} bytes"]
    assert c.plain_stderr.getvalue().splitlines()[0].endswith(" objects, 0 processes")
    counts: dict = {}
    for name, _info, _data in c.members:
        section = name.split("/")[0]
        counts[section] = counts.get(section, 0) + 1
    manifest = _json(c.held["manifest.json"])
    assert c.summary == bundle.BundleSummary(path=str(c.path), size=size, members=counts,
                                             redactions=len(manifest["redacted"]), objects=len(objects),
                                             facts=len(facts))
    assert counts["processes"] == 3 and counts["binaries"] == len(objects) and counts["facts.json"] == 1
    held = ", ".join(f"{name} {count}" for name, count in sorted(counts.items()))
    assert bundle.describe(c.summary) == (
        f"bundle {c.path}: {size} bytes; {len(facts)} facts, {len(objects)} objects, "
        f"{len(manifest['redacted'])} redaction(s); members: {held}\n")
    # the report returned is the report written (its one secret redacted), and the facts are the scan's
    live = json.dumps(c.report.to_dict())
    assert c.url_password in live
    assert _json(c.held["report.json"]) == json.loads(live.replace(c.url_password, "<redacted>"))
    assert len(facts) == c.report.stats["facts"]
    assert "binaries" not in {n.split("/")[0] for n, _i, _d in c.plain_members}
    assert c.plain_summary.path == str(c.plain_path) and c.plain_summary.size == c.plain_path.stat().st_size


def test_the_manifest_lists_every_member_the_options_and_the_redactions(captured):
    import calendar

    c = captured
    text = c.held["manifest.json"].decode()
    manifest = json.loads(text)
    assert text == json.dumps(manifest, indent=1)  # written readable, one field a line
    assert c.members[0][0] == "manifest.json"
    assert manifest["members"] == [{"name": n, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                                   for n, _i, d in c.members[1:]]
    assert manifest["schema"] == SCHEMA_NAME
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", manifest["created"])
    created = calendar.timegm(time.strptime(manifest["created"], "%Y-%m-%dT%H:%M:%SZ"))
    assert int(c.before) - 1 <= created <= c.after + 1  # UTC, though local time was UTC+7
    assert manifest["seedance_version"] == importlib.metadata.version("seedance")
    assert manifest["host"] == socket.gethostname()
    assert manifest["options"] == {"targets": [str(c.tree)], "pids": [c.pid], "arch": "sm_90",
                                   "driver_version": "535.104.05", "strict": False, "with_binaries": True}
    plain = _json(c.plain_held["manifest.json"])
    assert plain["options"] == {"targets": [str(c.tree)], "pids": [], "arch": None, "driver_version": None,
                                "strict": False, "with_binaries": False}
    environ = f"processes/{c.pid}/environ.json"
    config = "configs" + str(c.config)
    for entries in (manifest["redacted"], plain["redacted"]):
        assert all(set(e) == {"where", "name"} for e in entries)
        assert len({json.dumps(e, sort_keys=True) for e in entries}) == len(entries)  # each once
        assert {"where": config, "name": "HF_TOKEN"} in entries
        assert {"where": config, "name": "otlp_endpoint"} in entries
    assert sorted(e["name"] for e in manifest["redacted"] if e["where"] == environ) == ["DATABASE_URL", "FOO_TOKEN"]
    assert not any(e["where"].startswith("processes/") for e in plain["redacted"])
    # the preload's URL password is quoted by a fact and a finding: redacted where it stands
    for where in ("facts.json", "report.json"):
        assert {"where": where, "name": "url"} in manifest["redacted"]
        assert {"where": where, "name": "url"} in plain["redacted"]
    assert {"where": config, "name": "LD_PRELOAD"} in manifest["redacted"]


def test_the_archive_framing_follows_the_rfcs(captured):
    c = captured
    raw = c.path.read_bytes()
    magic, size = struct.unpack_from("<II", raw)
    assert magic == SKIPPABLE_MAGIC and raw[8:8 + size] == SCHEMA_NAME.encode()
    assert struct.unpack_from("<I", raw, 8 + size)[0] == ZSTD_MAGIC
    descriptor = raw[12 + size]
    assert descriptor & 0x04  # Content_Checksum_flag (RFC 8878, 3.1.1.1.1.5): a flipped bit is caught
    import zstandard

    assert zstandard.ZstdDecompressor().decompress(raw[8 + size:], max_output_size=1 << 30)[:512]
    gz = c.plain_path.read_bytes()
    assert gz[:3] == b"\x1f\x8b\x08" and gz[3] & GZIP_FNAME
    assert struct.unpack_from("<I", gz, 4)[0] == 0  # MTIME 0: the same tar gives the same file
    assert gz[10:gz.index(b"\0", 10)] == b"seedance-bundle.tar"
    for members in (c.members, c.plain_members):
        for name, info, data in members:
            assert info.isfile() and info.mode == 0o644 and info.size == len(data), name
            assert int(c.before) - 1 <= info.mtime <= c.after + 1, name
    # the compact JSON members are written without whitespace (a host's facts are tens of MiB)
    for name in ("facts.json", "report.json", "runtime.json", "objects.json"):
        data = c.held[name]
        assert data == json.dumps(json.loads(data), separators=(",", ":")).encode(), name


def test_process_members_are_the_process_as_proc_shows_it(captured):
    c = captured
    where = f"processes/{c.pid}/"
    text = c.held[where + "environ.json"].decode()
    environ = json.loads(text)
    assert text == json.dumps(environ, indent=1, sort_keys=True)
    assert environ == {"PATH": c.env["PATH"], "PLAIN": "kept", "FOO_TOKEN": "<redacted>",
                       "DATABASE_URL": "postgres://alice:<redacted>@db.internal:5432/app"}
    assert c.held[where + "maps"] == c.maps
    assert json.loads(c.held[where + "process.json"]) == {"pid": c.pid, "exe": c.exe, "root": "/"}
    # no secret in any member, except inside the objects themselves (binaries/ are byte for byte)
    for name, data in c.held.items():
        for secret in (c.token, c.password, c.cfg_token, c.cfg_password, c.url_password):
            if name == "binaries" + str(c.tree / "app") and secret == c.token:
                assert secret.encode() in data
            else:
                assert secret.encode() not in data, (name, secret)


def test_config_members_are_the_configs_read_redacted(captured):
    c = captured
    configs = [n for n in c.held if n.startswith("configs/")]
    assert configs == ["configs" + str(c.config)]
    assert c.held[configs[0]].decode() == ("env:\n  LD_PRELOAD: https://carol:<redacted>@mirror.example/libx.so\n"
                                           "  HF_TOKEN: <redacted>\n"
                                           "otlp_endpoint: https://bob:<redacted>@otel.example/v1\n")
    assert c.plain_held[configs[0]] == c.held[configs[0]]


def _elf_oracle(path: str) -> dict:
    """The dynamic section, versions and sections of a file as pyelftools reads them."""
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as handle:
        elf = ELFFile(handle)
        raw = open(path, "rb").read(64)
        out = {"elf_class": elf.elfclass, "machine": struct.unpack_from("<H", raw, 18)[0],
               "e_type": struct.unpack_from("<H", raw, 16)[0], "interpreter": None, "soname": None,
               "needed": [], "rpath": [], "runpath": [], "flags": 0, "flags_1": 0, "build_id": None,
               "version_needs": [], "version_defs": [], "sections": [s.name for s in elf.iter_sections()]}
        for segment in elf.iter_segments():
            if segment["p_type"] == "PT_INTERP":
                out["interpreter"] = segment.get_interp_name()
        dynamic = elf.get_section_by_name(".dynamic")
        for tag in dynamic.iter_tags() if dynamic else ():
            kind = tag.entry.d_tag
            if kind == "DT_NEEDED":
                out["needed"].append(tag.needed)
            elif kind == "DT_SONAME":
                out["soname"] = tag.soname
            elif kind == "DT_RPATH":
                out["rpath"].extend(tag.rpath.split(":"))
            elif kind == "DT_RUNPATH":
                out["runpath"].extend(tag.runpath.split(":"))
            elif kind == "DT_FLAGS":
                out["flags"] = tag.entry.d_val
            elif kind == "DT_FLAGS_1":
                out["flags_1"] = tag.entry.d_val
        for section in elf.iter_sections():
            if section["sh_type"] == "SHT_NOTE":
                for note in section.iter_notes():
                    if note["n_type"] == "NT_GNU_BUILD_ID":
                        out["build_id"] = note["n_desc"]
            elif section["sh_type"] == "SHT_GNU_verneed":
                for verneed, auxes in section.iter_versions():
                    out["version_needs"].append({"file": verneed.name, "versions": [
                        [aux.name, bool(aux["vna_flags"] & 0x2)] for aux in auxes]})  # VER_FLG_WEAK
            elif section["sh_type"] == "SHT_GNU_verdef":
                for verdef, auxes in section.iter_versions():
                    if not verdef["vd_flags"] & 0x1:  # VER_FLG_BASE: the file's own name
                        out["version_defs"].append(next(iter(auxes)).name)
    return out


def test_objects_json_against_pyelftools_and_the_files(captured):
    c = captured
    objects = _json(c.held["objects.json"])
    gone = str(c.side / "libgone.so")
    assert f"{gone} (deleted)".encode() in c.maps and gone not in objects
    # every object a closure reached, and every file the process maps
    mapped = {line.split(None, 5)[5] for line in c.maps.decode("utf-8", "replace").splitlines()
              if len(line.split(None, 5)) == 6 and line.split(None, 5)[5].startswith("/")}
    for path in mapped - {f"{gone} (deleted)"}:
        with open(path, "rb") as handle:
            if handle.read(4) == b"\x7fELF":
                assert path in objects or os.path.realpath(path) in {os.path.realpath(p) for p in objects}, path
    for name in ("app", "libv.so"):
        assert str(c.tree / name) in objects
    assert str(c.side / "libside.so") in objects and str(c.side / "holder") in objects
    for path, entry in objects.items():
        st = os.stat(path)
        assert entry["path"] == path and entry["size"] == st.st_size and entry["mtime"] == st.st_mtime
        assert entry["sha256"] == hashlib.sha256(Path(path).read_bytes()).hexdigest()
        assert c.held["binaries" + path] == Path(path).read_bytes()
        assert "fatbin_error" not in entry and "error" not in entry
    for path in [str(c.tree / "app"), str(c.tree / "libv.so"), str(c.side / "libside.so"), str(c.side / "holder")]:
        entry = {k: v for k, v in objects[path].items() if k not in ("path", "size", "mtime", "sha256")}
        assert entry == _elf_oracle(path), path
    plain = _json(c.plain_held["objects.json"])
    assert str(c.tree / "app") in plain and str(c.side / "holder") not in plain


def test_runtime_json_holds_the_gpu_closures_fatbins_and_compat(captured):
    c = captured
    runtime = _json(c.held["runtime.json"])
    assert set(runtime) == {"gpu", "closures", "fatbins", "static_runtimes", "compat"}
    gpu = runtime["gpu"]
    assert json.loads(c.held["host/gpu.json"]) == gpu
    assert c.held["host/gpu.json"].decode() == json.dumps(gpu, indent=1)
    assert gpu["driver_version"] == "535.104.05" and gpu["driver_source"] == "--driver-version"
    assert gpu["targets"] == ["sm_90"] and [t[2] for t in gpu["target_tuples"]] == ["sm_90"]
    assert gpu["nvml"] is False and gpu["devices"] == []
    assert runtime["compat"] == c.compat
    if c.cu12 is not None:
        liba = str(c.tree / "liba.so")
        assert {"root": liba, "runtimes": {str(c.cu12): [12, liba]}} in runtime["closures"]
    if not c.nvcc:
        assert runtime["fatbins"] == {"entries": {}, "sha256": {}} and runtime["static_runtimes"] == {}
        return
    objects = _json(c.held["objects.json"])
    libk, probe = str(c.tree / "libk.so"), str(c.tree / "probe")
    assert set(runtime["fatbins"]["entries"]) == {libk, probe}
    for path in (libk, probe):
        entries = runtime["fatbins"]["entries"][path]
        assert objects[path]["fatbin"] == [("sm_" if e["kind"] == "sass" else "compute_") + str(e["arch"])
                                           for e in entries]
        assert runtime["fatbins"]["sha256"][path] == hashlib.sha256(Path(path).read_bytes()).hexdigest()
    assert {"sm_86", "compute_86"} <= set(objects[libk]["fatbin"])  # what nvcc was asked for
    major, minor = nvcc_release()
    for path in (libk, probe):
        assert runtime["static_runtimes"][path] == {"major": major, "release": f"{major}.{minor}",
                                                    "marker": "/cudart.shm.% in .rodata",
                                                    "version_source": "toolkit release string"}
    for path, entry in objects.items():
        assert ("fatbin" in entry) == (path in (libk, probe)), path


def test_host_and_ldso_members_are_the_hosts_files(captured):
    import glob
    import platform

    c = captured
    uname = os.uname()
    assert json.loads(c.held["host/uname.json"]) == {
        "system": uname.sysname, "node": uname.nodename, "release": uname.release, "version": uname.version,
        "machine": uname.machine, "processor": platform.uname().processor}
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = None
    versions = c.held["host/versions.json"].decode()
    assert json.loads(versions) == {"python": sys.version, "python_executable": sys.executable,
                                    "seedance": importlib.metadata.version("seedance"), "torch": torch,
                                    "glibc": os.confstr("CS_GNU_LIBC_VERSION")}
    assert versions == json.dumps(json.loads(versions), indent=1)
    assert c.held["host/proc/version"] == Path("/proc/version").read_bytes()
    assert ("host/proc/driver/nvidia/version" in c.held) == os.path.exists("/proc/driver/nvidia/version")
    smi = subprocess.run(["nvidia-smi", "-q"], capture_output=True) if shutil.which("nvidia-smi") else None
    assert ("host/nvidia-smi-q.txt" in c.held) == (smi is not None and smi.returncode == 0)
    # NVRM/Xid lines of the kernel log, as dmesg (else journalctl) shows them here
    expected = None
    for command in (["dmesg", "--notime"], ["journalctl", "-k", "-b", "--no-pager", "-q"]):
        try:
            done = subprocess.run(command, capture_output=True, stdin=subprocess.DEVNULL, timeout=20)
        except OSError:
            continue
        if done.returncode == 0:
            keep = [line for line in done.stdout.decode("utf-8", "replace").splitlines()
                    if "NVRM" in line or "Xid" in line]
            expected = ("\n".join(keep[-2000:]) + ("\n" if keep else "")).encode()
            break
    assert c.held.get("host/kernel-nvrm.txt") == expected
    wanted = [p for p in ["/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.preload",
                          *sorted(glob.glob("/etc/ld.so.conf.d/*"))] if os.path.isfile(p)]
    assert [n for n in c.held if n.startswith("ldso/")] == ["ldso" + p for p in wanted]
    for path in wanted:
        assert c.held["ldso" + path] == Path(path).read_bytes()
