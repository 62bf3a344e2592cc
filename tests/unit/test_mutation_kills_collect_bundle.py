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

from seedance.collect import bundle, cuda, host, redact

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
    from seedance.render.output import prepare_output

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
        got.plain_after = time.time()
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
            assert int(c.before) - 1 <= info.mtime <= c.plain_after + 1, name
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
    text = c.held["host/uname.json"].decode()
    assert text == json.dumps(json.loads(text), indent=1)
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


# --- replay, in process ---------------------------------------------------------------------
def _by_kind(facts) -> dict:
    counts: dict = {}
    for fact in facts:
        counts[fact["kind"]] = counts.get(fact["kind"], 0) + 1
    return counts


def _key(finding) -> tuple:
    evidence = {k: v for k, v in finding["evidence"].items() if k != "needed_live_data"}
    return (finding["rule"], json.dumps(finding["subject"], sort_keys=True), finding["message"], finding["fix"],
            json.dumps(evidence, sort_keys=True))


def test_replay_without_options_is_the_captured_report(captured):
    c = captured
    report = bundle.replay(str(c.plain_path)).to_dict()
    written = _json(c.plain_held["report.json"])
    manifest = _json(c.plain_held["manifest.json"])
    facts = _json(c.plain_held["facts.json"])
    gpu = {k: v for k, v in _json(c.plain_held["runtime.json"])["gpu"].items() if k != "target_tuples"}
    assert report["command"] == "check" and report["schema"] == written["schema"]
    # the same rules on the same facts; the one finding that quoted a secret is judged on the
    # redacted text (its URL password is not in the bundle), so it is compared by its rule only
    quoted = [f for f in written["findings"] if "<redacted>" in json.dumps(f)]
    assert [f["rule"] for f in quoted] == ["env-leak"]
    assert [f for f in report["findings"] if f not in quoted and f["rule"] != "env-leak"] == \
        [f for f in written["findings"] if f not in quoted]
    assert [f["rule"] for f in report["findings"]] == [f["rule"] for f in written["findings"]]
    assert report["host"] == {**written["host"], "gpu": {**gpu, "nvml_error": None}}
    stats = {k: v for k, v in written["stats"].items() if k != "duration_s"}
    assert "duration_s" in written["stats"] and "duration_s" not in report["stats"]
    assert report["stats"] == {**stats, "facts": len(facts), "facts_by_kind": dict(sorted(_by_kind(facts).items())),
                               "errors": []}
    assert list(report["stats"]["facts_by_kind"]) == sorted(report["stats"]["facts_by_kind"])
    assert report["scope"] == written["scope"] and report["scope"]["targets"] == [str(c.tree)]
    assert report["replay"] == {"bundle": str(c.plain_path), "captured": manifest["created"],
                                "captured_on": socket.gethostname(), "rederived": [], "gpu_targets": [],
                                "driver_version": None}


@pytest.mark.parametrize("arch, driver", [("sm_90", "470.82.01"), ("sm_86", None), (None, "580.65.06"),
                                          ("sm_80", "12.4")])
def test_replay_for_another_gpu_or_driver_matches_a_live_check(captured, monkeypatch, arch, driver):
    from seedance.collect.scan import CheckOptions, run_check

    c = captured
    # the compat driver stays on the loader path, for the live check and the replay alike
    monkeypatch.setenv("LD_LIBRARY_PATH", str(c.tmp / "cuda-12.8" / "compat"))
    manifest = _json(c.held["manifest.json"])
    report = bundle.replay(str(c.path), arch=arch, driver_version=driver).to_dict()
    live = run_check(CheckOptions(targets=[str(c.tree)], arch=arch or "sm_90",
                                  driver_version=driver or "535.104.05")).to_dict()
    replayed = [f for f in report["findings"] if "pid" not in f["subject"] and f["rule"] != "env-leak"]
    assert sorted(map(_key, replayed)) == sorted(map(_key, [f for f in live["findings"] if f["rule"] != "env-leak"]))
    assert [f["rule"] for f in report["findings"]].count("env-leak") == 1  # the redacted preload (see above)
    for finding in report["findings"]:
        if "pid" in finding["subject"]:  # a process is as it was captured
            assert finding["evidence"]["needed_live_data"] == f"process state as captured at {manifest['created']}"
        else:  # the tree is here, same files: nothing rested on data the bundle lacks
            assert "needed_live_data" not in finding["evidence"], finding
    assert [f["rule"] for f in report["findings"] if "pid" in f["subject"]] == ["lib-deleted"]
    assert report["replay"]["rederived"] == ["fatbin", "fatbin_ptx", "cuda_driver"]  # docs/bundle.md
    assert report["replay"]["gpu_targets"] == [arch or "sm_90"]
    assert report["replay"]["driver_version"] == (driver or "535.104.05")
    gpu = report["host"]["gpu"]
    assert gpu["driver_version"] == (driver or "535.104.05") and gpu["targets"] == [arch or "sm_90"]
    assert gpu["driver_source"] == "--driver-version"
    kinds = _by_kind(json.loads(json.dumps([{"kind": f} for f in report["stats"]["facts_by_kind"]
                                            for _ in range(report["stats"]["facts_by_kind"][f])])))
    assert sum(kinds.values()) == report["stats"]["facts"]
    live_kinds = live["stats"]["facts_by_kind"]
    for kind in ("fatbin", "fatbin_ptx", "cuda_driver"):  # derived again, as many as live
        assert report["stats"]["facts_by_kind"].get(kind) == live_kinds.get(kind), kind
    if c.nvcc and c.cu12 is not None and driver == "470.82.01":
        # the 12.x runtime passes on the compat driver (570); the static 13.x ones do not
        too_old = {f["subject"]["path"] for f in report["findings"] if f["rule"] == "cuda-driver-too-old"}
        assert too_old == {str(c.tree / "libk.so"), str(c.tree / "probe")}


@needs_nvcc
def test_replay_without_the_files_says_the_kernels_were_not_read(captured):
    c = captured
    away = c.tmp / "tree-away"
    os.rename(c.tree, away)
    try:
        report = bundle.replay(str(c.path), arch="sm_90", driver_version="470.82.01").to_dict()
        # the same path, another file: not the file captured either
        c.tree.mkdir()
        shutil.copyfile(away / "probe", c.tree / "libk.so")
        other = bundle.replay(str(c.path), arch="sm_90", driver_version="470.82.01").to_dict()
    finally:
        shutil.rmtree(c.tree, ignore_errors=True)
        os.rename(away, c.tree)
    here = bundle.replay(str(c.path), arch="sm_90", driver_version="470.82.01").to_dict()
    libk = str(c.tree / "libk.so")
    gpu_rules = [f for f in report["findings"] if f["rule"].startswith(("cuda-arch", "cuda-ptx"))]
    assert gpu_rules and {f["subject"]["path"] for f in gpu_rules} <= {libk, str(c.tree / "probe")}
    for finding in gpu_rules:
        assert finding["evidence"]["needed_live_data"] == \
            "kernel images are not in the bundle: modules were judged as holding kernels"
    other_libk = [f for f in other["findings"] if f["rule"].startswith(("cuda-arch", "cuda-ptx"))
                  and f["subject"]["path"] == libk]
    assert other_libk
    for finding in other_libk:
        assert "needed_live_data" not in finding["evidence"]  # a file is there (not the same one)
    here_ptx = [f for f in here["findings"] if f["rule"].startswith(("cuda-arch", "cuda-ptx"))]
    assert here_ptx and all("needed_live_data" not in f["evidence"] for f in here_ptx)
    # the kernel named in the source is read from the images only where the very file is
    assert any("_Z1kPi" in json.dumps(f["evidence"]) for f in here_ptx)
    assert not any("_Z1kPi" in json.dumps(f["evidence"]) for f in gpu_rules)
    assert not any("_Z1kPi" in json.dumps(f["evidence"]) for f in other["findings"])


# --- read_bundle on archives built here -----------------------------------------------------
def _tar(entries: list) -> bytes:
    """A tar of (name, bytes or None for a directory, size claimed or None)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, body, claimed in entries:
            info = tarfile.TarInfo(name)
            if body is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
                continue
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
            if claimed is not None:  # rewrite the size field of this header (ustar: octal, offset 124)
                raw = out.getvalue()
                header = len(raw) - 512 * ((len(body) + 511) // 512) - 512
                field = f"{claimed:011o}\0".encode()
                data = bytearray(raw)
                data[header + 124:header + 136] = field
                data[header + 148:header + 156] = b"        "
                data[header + 148:header + 155] = f"{sum(data[header:header + 512]):06o}\0".encode()
                out = io.BytesIO(bytes(data))
                out.seek(0, 2)
                tar.fileobj = out
    return out.getvalue()


def _good_members(**override) -> list:
    docs = {"manifest.json": {"schema": SCHEMA_NAME, "created": "2026-01-02T03:04:05Z", "host": "elsewhere"},
            "facts.json": [], "report.json": {"host": {"hostname": "elsewhere"}}, "runtime.json": {}}
    docs.update(override)
    members = [(name, json.dumps(doc).encode(), None) for name, doc in docs.items() if doc is not None]
    if isinstance(docs["manifest.json"], dict) and "members" not in docs["manifest.json"]:
        # the reader checks every member against the manifest's list (size, sha256)
        listing = [{"name": n, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b, _ in members[1:]]
        members[0] = ("manifest.json", json.dumps({**docs["manifest.json"], "members": listing}).encode(), None)
    return members


def _write(tmp_path, name, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def _refused(path) -> str:
    from seedance.model.errors import BadInput

    with pytest.raises(BadInput) as caught:
        bundle.read_bundle(path)
    text = str(caught.value)
    assert "\n" not in text
    return text


def test_read_bundle_reads_plain_zstd_and_gzip_and_refuses_what_is_not_one(tmp_path):
    import zstandard

    tar = _tar(_good_members())
    for name, data in (("plain.tar.zst", zstandard.ZstdCompressor().compress(tar)),  # no skippable frame first
                       ("b.tar.gz", gzip.compress(tar))):
        path = _write(tmp_path, name, data)
        found = bundle.read_bundle(path)
        assert found == bundle.Bundle(path=path, manifest=json.loads(_good_members()[0][1]), facts=[],
                                      report={"host": {"hostname": "elsewhere"}}, runtime={})
    path = _write(tmp_path, "raw.tar", tar)
    assert _refused(path) == f"{path}: not a seedance bundle (neither zstd nor gzip)"
    absent = str(tmp_path / "absent.tar.zst")
    assert _refused(absent) == f"{absent}: {os.strerror(2).lower()}"


def test_read_bundle_says_what_is_missing_or_wrong(tmp_path):
    cases = {
        "missing": (_tar(_good_members(**{"facts.json": None, "runtime.json": None})),
                    "not a complete seedance bundle (missing facts.json, runtime.json)"),
        "schema": (_tar(_good_members(**{"manifest.json": {"schema": "seedance.bundle/v0"}})),
                   f"not a seedance bundle (manifest schema is not {SCHEMA_NAME})"),
        "manifest-list": (_tar(_good_members(**{"manifest.json": [SCHEMA_NAME]})),
                          f"not a seedance bundle (manifest schema is not {SCHEMA_NAME})"),
        "facts-shape": (_tar(_good_members(**{"facts.json": {"kind": "needed"}})),
                        "damaged bundle: facts.json or runtime.json has the wrong shape"),
        "runtime-shape": (_tar(_good_members(**{"runtime.json": []})),
                          "damaged bundle: facts.json or runtime.json has the wrong shape"),
        "huge": (_tar([("facts.json", b"[]", (512 << 20) + 1)]),
                 "member facts.json is 536,870,913 bytes: over the member-size cap of 512 MiB; refusing it"),
    }
    for name, (tar, why) in cases.items():
        path = _write(tmp_path, f"{name}.tar.gz", gzip.compress(tar))
        assert _refused(path) == f"{path}: {why}", name
    # exactly the member cap is not refused for it; a JSON member meets its own cap first
    path = _write(tmp_path, "cap.tar.gz", gzip.compress(_tar([("facts.json", b"[]", 512 << 20)])))
    assert _refused(path).endswith("over the JSON member-size cap of 64 MiB; refusing it")
    bad = b'{"schema": '
    try:
        json.loads(bad)
    except ValueError as exc:
        why = str(exc).splitlines()[0]
    path = _write(tmp_path, "json.tar.gz", gzip.compress(_tar([("manifest.json", bad, None)])))
    assert _refused(path) == f"{path}: damaged bundle: {why}"
    path = _write(tmp_path, "cut.tar.gz", gzip.compress(_tar(_good_members()))[:-30])
    assert _refused(path).startswith(f"{path}: damaged bundle: ")


def test_replay_refuses_damaged_facts_and_runtime(tmp_path):
    from seedance.model.errors import BadInput, UsageError

    def replayed(name, **override):
        path = _write(tmp_path, f"{name}.tar.gz", gzip.compress(_tar(_good_members(**override))))
        return path

    path = replayed("fact", **{"facts.json": [{"kind": "needed", "data": {}}]})
    with pytest.raises(BadInput) as caught:
        bundle.replay(path)
    assert str(caught.value) == f"{path}: damaged bundle: a fact without kind, subject or data"
    path = replayed("closures", **{"runtime.json": {"closures": [{"runtimes": {"/x.so": 5}}]}})
    assert bundle.replay(path).to_dict()["replay"]["rederived"] == []  # not read without a driver
    with pytest.raises(BadInput) as caught:
        bundle.replay(path, driver_version="550")
    assert str(caught.value).startswith(f"{path}: damaged bundle: runtime.json: TypeError: ")
    path = replayed("entry", **{"runtime.json": {"fatbins": {"entries": {"/x.so": [{"colour": "red"}]}}}})
    with pytest.raises(BadInput) as caught:
        bundle.replay(path, arch="sm_90")
    assert str(caught.value) == "damaged bundle: a fatbin entry of unknown shape"
    path = replayed("ok")
    with pytest.raises(UsageError) as caught:
        bundle.replay(path, driver_version="12.x")
    assert str(caught.value) == "--driver-version: not a driver version: '12.x' (expected e.g. 550.54.15)"
    with pytest.raises(UsageError) as caught:
        bundle.replay(path, arch="sm_x")
    assert str(caught.value).startswith("--arch: ") and "sm_x" in str(caught.value)
    # a captured GPU context fills what is not given; one of another shape is left out
    path = replayed("gpu", **{"runtime.json": {"gpu": {"driver_version": "550.54.15", "driver_source": "nvml",
                                                       "devices": [{"index": 0, "name": "H100", "arch": "sm_90"}],
                                                       "nvml": True, "target_tuples": [[90, "", "sm_90", "nvml"],
                                                                                       [80, "sm_80"]]}}})
    report = bundle.replay(path).to_dict()
    assert report["host"] == {"hostname": "elsewhere", "gpu": {
        "nvml": True, "nvml_error": None, "driver_version": "550.54.15", "driver_source": "nvml",
        "devices": [{"index": 0, "name": "H100", "arch": "sm_90"}], "targets": ["sm_90"]}}
    assert report["replay"]["gpu_targets"] == ["sm_90"] and report["replay"]["driver_version"] == "550.54.15"
    assert report["replay"]["captured"] == "2026-01-02T03:04:05Z" and report["replay"]["captured_on"] == "elsewhere"
    report = bundle.replay(path, driver_version="580").to_dict()
    assert report["host"]["gpu"]["driver_source"] == "--driver-version"
    assert report["replay"]["rederived"] == ["fatbin", "fatbin_ptx", "cuda_driver"]


def test_bundle_names_say_how_they_are_compressed():
    from seedance.model.errors import UsageError

    for name in ("a.tar.zst", "a.tar.gz", "a.tgz"):
        assert bundle.check_name(name) is None
    for name, why in (("-", "--bundle: give a file name ending in .tar.zst or .tar.gz"),
                      ("a.zip", "--bundle: a.zip: name it .tar.zst or .tar.gz"),
                      ("a.zst", "--bundle: a.zst: name it .tar.zst or .tar.gz")):
        with pytest.raises(UsageError) as caught:
            bundle.check_name(name)
        assert str(caught.value) == why


# --- cuda.py ----------------------------------------------------------------------------------
def vt(text: str) -> tuple:
    return tuple(int(p) for p in text.split("."))


def nvidia_meets(driver: str, major: int) -> bool:
    """NVIDIA's rule, written here: a driver version meets a floor at or above it; a branch
    at its newest release meets the floors of its branch and older; a driver for CUDA X.Y
    (minor-version compatibility) runs every runtime of majors <= X."""
    parts = vt(driver)
    if parts[0] < 100:
        return parts[0] >= major
    if len(parts) == 1:
        return parts[0] >= vt(NVIDIA_FLOORS[major])[0]
    return parts >= vt(NVIDIA_FLOORS[major])


def nvidia_cuda_of(driver: str) -> tuple | None:
    parts = vt(driver)
    if parts[0] < 100:
        return (parts[0], parts[1] if len(parts) > 1 else 0)
    known = [cuda for branch, cuda in sorted(NVIDIA_BRANCH_CUDA.items()) if branch <= parts[0]]
    return known[-1] if known else None


@pytest.mark.parametrize("driver, kind", [
    ("535.104.05", "driver"), ("418.87", "driver"), ("300.1", "driver"), ("580.65.06", "driver"),
    ("470", "branch"), ("590", "branch"), ("12.4", "cuda"), ("13", "cuda"), ("11.8.0", "cuda"), (" 550.54.15 ", "driver"),
])
@pytest.mark.parametrize("major", [10, 11, 12, 13])
@pytest.mark.parametrize("linkage", ["shared", "static"])
def test_driver_fact_holds_every_field_from_nvidias_table(driver, kind, major, linkage):
    fact = cuda.driver_fact("/app/x.so", "/rt/libcudart.so", major, driver, "--driver-version", linkage=linkage,
                            compat=None, extra={"static_marker": "m"})
    text = driver.strip()
    ok = nvidia_meets(text, major)
    fits = [m for m in NVIDIA_FLOORS if nvidia_meets(text, m)]
    best = max(fits) if fits else None
    version = nvidia_cuda_of(text)
    cuda_text = f"CUDA {version[0]}.{version[1]}" if version else "CUDA < 10.0"
    desc = {"driver": f"driver {text} ({cuda_text})", "branch": f"driver branch {text} ({cuda_text})",
            "cuda": f"a driver for {cuda_text}"}[kind]
    fix = (f"seedance fix cuda-mismatch --auto-relink --runtime {best} /app/x.so"
           if best is not None and best >= 11 and linkage == "shared"
           else f"install an NVIDIA driver >= {NVIDIA_FLOORS[major]} (or the cuda-compat package for CUDA {major}.x)")
    assert fact.kind == "cuda_driver" and fact.subject == {"path": "/app/x.so"} and fact.source == "collect.cuda"
    assert fact.data == {"runtime_major": major, "runtime_path": "/rt/libcudart.so",
                         "required_driver": NVIDIA_FLOORS[major], "driver_version": text, "driver_desc": desc,
                         "driver_kind": kind, "driver_source": "--driver-version", "driver_ok": ok,
                         "driver_max_major": best, "linkage": linkage, "compat": None, "fix": fix,
                         "static_marker": "m"}
    assert cuda.driver_max_major(text) == best
    spec = cuda.parse_driver_version(driver)
    assert (spec.text, spec.kind, spec.cuda) == (text, kind, version)
    assert spec.version == (() if kind == "cuda" else vt(text))
    assert spec.describe() == desc and spec.meets(NVIDIA_FLOORS[major]) is ok


def test_driver_fact_defaults_compat_and_future_majors(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "")
    fact = cuda.driver_fact("/x.so", "/rt", 12, "470.82.01", "nvml")
    assert fact.data["linkage"] == "shared" and fact.data["compat"] is None and fact.data["driver_ok"] is False
    assert set(fact.data) == {"runtime_major", "runtime_path", "required_driver", "driver_version", "driver_desc",
                              "driver_kind", "driver_source", "driver_ok", "driver_max_major", "linkage",
                              "compat", "fix"}
    compat = tmp_path / "compat"
    compat.mkdir()
    (compat / "libcuda.so.525.60.13").write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{tmp_path}::{compat}/")
    # exactly the floor is enough (">="); the compat driver only helps a driver that fails
    fact = cuda.driver_fact("/x.so", "/rt", 12, "470.82.01", "nvml")
    assert fact.data["compat"] == "525.60.13" and fact.data["driver_ok"] is True
    assert cuda.driver_fact("/x.so", "/rt", 13, "470.82.01", "nvml").data["driver_ok"] is False
    assert cuda.driver_fact("/x.so", "/rt", 11, "470.82.01", "nvml", compat="400.1").data["driver_ok"] is True
    for major in (9, 14, 99):  # no row in NVIDIA's table: nothing said
        assert cuda.driver_fact("/x.so", "/rt", major, "580.65.06", "nvml") is None
    spec = cuda.parse_driver_version("550.54.15")
    assert cuda.driver_fact("/x.so", "/rt", 12, spec, "nvml", compat=None).data["driver_version"] == "550.54.15"


@pytest.mark.parametrize("bad, why", [
    ("12.4.1.1", "not a CUDA version: '12.4.1.1' (expected e.g. 12.4)"),
    ("550.54.15.1", "not a driver version: '550.54.15.1' (expected e.g. 550.54.15)"),
    ("9.2", "CUDA 9.2 is older than any driver seedance knows (10.0)"),
    ("5x5", "not a driver version: '5x5' (expected e.g. 550.54.15)"),
    ("", "not a driver version: '' (expected e.g. 550.54.15)"),
    ("550.", "not a driver version: '550.' (expected e.g. 550.54.15)"),
])
def test_bad_driver_versions_say_why(bad, why):
    with pytest.raises(ValueError) as caught:
        cuda.parse_driver_version(bad)
    assert str(caught.value) == why


def test_driver_versions_at_the_edges_of_the_forms():
    assert cuda.parse_driver_version("99.1").kind == "cuda" and cuda.parse_driver_version("100").kind == "branch"
    assert cuda.parse_driver_version("10.0").cuda == (10, 0) and cuda.parse_driver_version("10").cuda == (10, 0)
    assert cuda.parse_driver_version("12.4.1").cuda == (12, 4)
    assert cuda.parse_driver_version("100.1.2").version == (100, 1, 2)
    assert cuda.parse_driver_version("410").cuda == (10, 0) and cuda.parse_driver_version("409").cuda is None
    assert cuda.version_tuple(" 1.20.3 ") == (1, 20, 3)


def test_runtime_major_reads_soname_then_versions_then_name(tmp_path):
    assert cuda.runtime_major("/x/libcudart.so.13.0.48") == 13
    assert cuda.runtime_major("/x/libfoo.so.12") is None and cuda.runtime_major("/x/libcudart.so") is None
    assert not cuda.is_cudart("/x/libfoo.so") and cuda.is_cudart("/x/libcudart.so")
    for major in (11, 12):
        lib = wheel_cudart(major)
        if lib is None:
            continue
        from seedance.elf.reader import read_elf

        renamed = tmp_path / "libwhatever.so"
        shutil.copyfile(lib, renamed)
        info = read_elf(str(renamed))
        # the wheel's own SONAME (pyelftools) is the oracle for the major
        from elftools.elf.elffile import ELFFile

        with open(renamed, "rb") as handle:
            soname = next(t.soname for t in ELFFile(handle).get_section_by_name(".dynamic").iter_tags()
                          if t.entry.d_tag == "DT_SONAME")
        assert int(soname.split(".")[2]) == major
        assert cuda.is_cudart(str(renamed), info) and not cuda.is_cudart(str(renamed))
        assert cuda.runtime_major(str(renamed), info) == major
        assert cuda.static_runtime(str(renamed), info) is None  # the shared runtime itself


def test_compat_driver_on_ld_library_path(tmp_path, monkeypatch):
    first, second = tmp_path / "a" / "compat", tmp_path / "b" / "compat"
    for directory, names in ((first, ["libcuda.so.570.9", "libcuda.so.1", "libcudadebugger.so.1"]),
                             (second, ["libcuda.so.570.9", "libcuda.so.570.124.06", "libcuda.so.575.51.03.1"])):
        directory.mkdir(parents=True)
        for name in names:
            (directory / name).write_bytes(b"")
    # the first compat directory searched wins; within it the newest version (570.124 > 570.9)
    assert cuda.compat_driver({"LD_LIBRARY_PATH": f"{tmp_path}/none/compat::{second}/:{first}"}) == "570.124.06"
    assert cuda.compat_driver({"LD_LIBRARY_PATH": f"{first}:{second}"}) == "570.9"
    (first / "libcuda.so.580.65.06").write_bytes(b"")
    assert cuda.compat_driver({"LD_LIBRARY_PATH": str(first)}) == "580.65.06"
    assert cuda.compat_driver({"LD_LIBRARY_PATH": str(tmp_path / "a")}) is None  # not a compat directory
    assert cuda.compat_driver({}) is None
    monkeypatch.setenv("LD_LIBRARY_PATH", str(second))
    assert cuda.compat_driver() == "570.124.06"


def test_nvml_absent_and_present_as_the_loader_would_see_it(tmp_path, monkeypatch):
    """Where libnvidia-ml.so.1 is (ldconfig -p, the default directories) decides; a file
    of that name that does not load is NVML's own error, in pynvml's words."""
    monkeypatch.setenv("LD_LIBRARY_PATH", "")
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    listed = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, errors="replace").stdout
    present = " libnvidia-ml.so.1 " in listed or any(
        os.path.exists(os.path.join(d, "libnvidia-ml.so.1"))
        for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"))
    assert cuda.nvml_library_present() is present
    if present:
        pytest.skip("this host has NVML")
    gpu = cuda.probe_nvml()
    assert gpu == cuda.GpuInfo(nvml_error="NVML library (libnvidia-ml.so.1) not found")
    assert gpu.to_dict() == {"nvml": False, "nvml_error": "NVML library (libnvidia-ml.so.1) not found",
                             "driver_version": None, "driver_source": None, "devices": [], "targets": []}
    broken = tmp_path / "nvml"
    broken.mkdir()
    (broken / "libnvidia-ml.so.1").write_bytes(b"not a library")
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{tmp_path}:{broken}")
    assert cuda.nvml_library_present() is True
    pynvml = pytest.importorskip("pynvml")
    gpu = cuda.probe_nvml()
    assert gpu.nvml is False and gpu.driver_version is None and gpu.targets == []
    assert gpu.nvml_error == str(pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))


def test_gpu_info_to_dict():
    gpu = cuda.GpuInfo(driver_version="550.54.15", driver_source="nvml",
                       targets=[(90, "", "sm_90", "nvml"), (100, "a", "sm_100a", "--arch")],
                       devices=[{"index": 0, "name": "H100", "arch": "sm_90"}], nvml=True)
    assert gpu.to_dict() == {"nvml": True, "nvml_error": None, "driver_version": "550.54.15",
                             "driver_source": "nvml", "devices": [{"index": 0, "name": "H100", "arch": "sm_90"}],
                             "targets": ["sm_90", "sm_100a"]}


# --- a statically linked runtime: nvcc builds ------------------------------------------------
@pytest.fixture(scope="module")
def static_builds(tmp_path_factory):
    if NVCC is None or GCC is None:
        pytest.skip("nvcc (CUDA toolkit) not installed")
    tmp = tmp_path_factory.mktemp("static")
    builds = {
        "plain": nvcc_build(PROBE, [], tmp / "plain"),
        # only compressed PTX: the toolkit strings are inside the images; the PTX ISA tells
        "ptx": nvcc_build(PROBE, ["-gencode", "arch=compute_90,code=compute_90", "--compress-mode=size"],
                          tmp / "ptx"),
        # only compressed SASS: one image decompressed tells
        "sass": nvcc_build(PROBE, ["-gencode", "arch=compute_90,code=sm_90", "--compress-mode=size"], tmp / "sass"),
    }
    # the same program with its section header table removed (e_shoff = e_shnum = 0): ld.so
    # needs none, and without it there is nothing to read markers from
    data = bytearray(builds["plain"].read_bytes())
    struct.pack_into("<Q", data, 0x28, 0)
    struct.pack_into("<HHH", data, 0x3A, 0, 0, 0)
    builds["noshdr"] = tmp / "noshdr"
    builds["noshdr"].write_bytes(bytes(data))
    fake = tmp / "fake"
    fake.mkdir()
    inc = ["-I/usr/local/cuda/include"] if os.path.isdir("/usr/local/cuda/include") else ["-DFAKE_NO_CUDA_H"]
    subprocess.run([GCC, "-O2", "-fPIC", "-shared", *inc, "-Wl,-soname,libcuda.so.1", "-Wl,-Bsymbolic",
                    ROOT / "tests/fakecuda/fakecuda.c", "-o", fake / "libcuda.so.1", "-pthread"],
                   check=True, capture_output=True)
    builds["fake"] = fake
    return builds


def _rodata_has(path, needle: bytes) -> bool:
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as handle:
        section = ELFFile(handle).get_section_by_name(".rodata")
        return section is not None and needle in section.data()


def test_static_runtime_major_release_and_how_it_was_told(static_builds):
    from seedance.elf.reader import read_elf

    major, minor = nvcc_release()
    sources = {"plain": "toolkit release string", "ptx": "PTX ISA version",
               "sass": "toolkit release string (decompressed image)"}
    for name, source in sources.items():
        path = str(static_builds[name])
        assert _rodata_has(path, b"/cudart.shm.%")  # the static runtime's shm name template
        with open(path, "rb") as handle:
            raw = handle.read()
        assert (f"release {major}.{minor}".encode() in raw) is (name == "plain"), name
        found = cuda.static_runtime(path, read_elf(path))
        assert found == {"major": major, "release": f"{major}.{minor}", "marker": "/cudart.shm.% in .rodata",
                         "version_source": source}, name
        assert cuda.static_runtime(path, None) == found
    # given no entries to read, the compressed builds cannot tell their toolkit
    assert cuda.static_runtime(str(static_builds["sass"]), None, entries=()) == {
        "major": None, "release": None, "marker": "/cudart.shm.% in .rodata", "version_source": None}
    plain = read_elf(str(static_builds["plain"]))
    assert plain.section_names
    noshdr = read_elf(str(static_builds["noshdr"]))
    assert noshdr.section_names == () and cuda.static_runtime(str(static_builds["noshdr"]), noshdr) is None


def _refuses(build: Path, fake: Path, reports: int) -> bool:
    """Reality: does the static runtime return cudaErrorInsufficientDriver (35) on a driver
    reporting ``reports`` (cuDriverGetVersion: 1000*major + 10*minor)?"""
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake), FAKECUDA_DRIVER_VERSION=str(reports))
    out = subprocess.run([str(build)], env=env, capture_output=True, text=True, errors="replace", timeout=60)
    return int(out.stdout.strip()) == 35


def test_static_runtime_facts_judge_each_object_once(static_builds, tmp_path, monkeypatch):
    from seedance.elf.reader import read_elf

    monkeypatch.setenv("LD_LIBRARY_PATH", "")
    major, minor = nvcc_release()
    plain, ptx, sass = (str(static_builds[n]) for n in ("plain", "ptx", "sass"))
    libc = "/lib/x86_64-linux-gnu/libc.so.6"
    notes = tmp_path / "notes.txt"
    notes.write_text("no object\n")
    # first a file that is no static runtime and one that is gone: each skipped, the rest judged
    objects = {str(notes): None, str(tmp_path / "gone"): None, plain: read_elf(plain), ptx: read_elf(ptx), sass: None}
    if os.path.exists(libc):
        objects[libc] = read_elf(libc)
    seen: set = set()
    assert cuda.static_runtime_facts(objects, cuda.GpuInfo(), seen) == [] and seen == set()
    gpu = cuda.GpuInfo(driver_version="535.104.05", driver_source="nvml")
    facts = cuda.static_runtime_facts(objects, gpu, seen)
    assert seen == set(objects)
    assert [f.subject["path"] for f in facts] == [plain, ptx, sass]
    sources = ["toolkit release string", "PTX ISA version", "toolkit release string (decompressed image)"]
    for fact, source in zip(facts, sources):
        path = fact.subject["path"]
        assert fact.data["runtime_path"] == path and fact.data["runtime_major"] == major
        assert fact.data["linkage"] == "static" and fact.data["compat"] is None
        assert fact.data["driver_ok"] is nvidia_meets("535.104.05", major)
        assert fact.data["driver_source"] == "nvml" and fact.data["driver_version"] == "535.104.05"
        assert fact.data["static_marker"] == "/cudart.shm.% in .rodata"
        assert fact.data["toolkit_release"] == f"{major}.{minor}" and fact.data["version_source"] == source
        assert fact.data["fix"].startswith("install an NVIDIA driver >= ")  # a static runtime is not relinked
    assert cuda.static_runtime_facts(objects, gpu, seen) == []  # judged already
    compat = tmp_path / "compat"
    compat.mkdir()
    (compat / f"libcuda.so.{NVIDIA_FLOORS[major]}").write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(compat))
    again = cuda.static_runtime_facts({plain: objects[plain]}, gpu, set())
    assert [f.data["compat"] for f in again] == [NVIDIA_FLOORS[major]] and again[0].data["driver_ok"] is True
    # the verdict is the static runtime's own, on the fake driver reporting each CUDA version
    for driver, reports in (("535.104.05", 12020), ("580.65.06", 13000), ("12.9", 12090), ("590", 13010)):
        monkeypatch.setenv("LD_LIBRARY_PATH", "")
        [fact] = cuda.static_runtime_facts({plain: objects[plain]},
                                           cuda.GpuInfo(driver_version=driver, driver_source="--driver-version"), set())
        assert fact.data["driver_ok"] is not _refuses(static_builds["plain"], static_builds["fake"], reports), driver


# --- host.py: facts from the real /proc, /sys, os.environ -------------------------------------
def test_host_facts_are_this_hosts():
    uname = os.uname()
    model = None
    for line in Path("/proc/cpuinfo").read_bytes().decode("utf-8", "replace").splitlines():
        if line.startswith("model name"):
            model = line.partition(":")[2].strip()
            break
    expected = {"hostname": socket.gethostname(), "kernel": uname.release, "machine": uname.machine,
                "glibc": os.confstr("CS_GNU_LIBC_VERSION"), "cpu": {"model": model, "count": os.cpu_count()}}
    assert host.host_facts() == {**expected, "gpu": None}
    gpu = cuda.GpuInfo(driver_version="550", driver_source="--driver-version")
    assert host.host_facts(gpu) == {**expected, "gpu": {"nvml": False, "nvml_error": None, "driver_version": "550",
                                                        "driver_source": "--driver-version", "devices": [],
                                                        "targets": []}}


def _toolkit_dirs() -> list:
    """NVIDIA's layouts, written here: a toolkit under /usr/local/cuda* or /opt/cuda* keeps
    its libraries in lib64, lib, targets/<triple>/lib and extras/CUPTI/lib64; a pip wheel in
    site-packages/nvidia/<package>/lib."""
    found = []
    for parent in ("/usr/local", "/opt"):
        roots = sorted(n for n in (os.listdir(parent) if os.path.isdir(parent) else []) if n.startswith("cuda"))
        for root in (os.path.join(parent, n) for n in roots):
            for sub in ("lib64", "lib"):
                found.append(os.path.join(root, sub))
            targets = os.path.join(root, "targets")
            for triple in sorted(os.listdir(targets)) if os.path.isdir(targets) else []:
                found.append(os.path.join(targets, triple, "lib"))
            found.append(os.path.join(root, "extras", "CUPTI", "lib64"))
    return found


def test_cuda_library_dirs_are_the_installs_on_disk_each_once(tmp_path, monkeypatch):
    import site

    # a second site directory of the Debian spelling, holding two wheels' lib dirs, one a link
    dist = tmp_path / "dist-packages"
    (dist / "nvidia" / "cublas" / "lib").mkdir(parents=True)
    (dist / "nvidia" / "nccl").mkdir(parents=True)
    (dist / "nvidia" / "nccl" / "lib").symlink_to(dist / "nvidia" / "cublas" / "lib")
    (dist / "nvidia" / "notes.txt").write_text("not a package")
    extra = tmp_path / "extra" / "site-packages"  # on sys.path only, not a site directory
    (extra / "nvidia" / "cufft" / "lib").mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [*sys.path, str(dist), str(tmp_path / "gone" / "site-packages"), str(extra)])
    sites = [d for d in site.getsitepackages() if os.path.isdir(d)]
    sites += [d for d in sys.path if d.endswith(("site-packages", "dist-packages")) and os.path.isdir(d)]
    sites = list(dict.fromkeys(sites))
    assert host._site_dirs() == sites and str(dist) in sites and str(extra) in sites
    wheels = []
    for site_dir in sites:
        nvidia = os.path.join(site_dir, "nvidia")
        for package in sorted(os.listdir(nvidia)) if os.path.isdir(nvidia) else []:
            wheels.append(os.path.join(nvidia, package, "lib"))
    expected, seen = [], set()
    for directory in _toolkit_dirs() + wheels:
        real = os.path.realpath(directory)
        if os.path.isdir(real) and real not in seen:
            seen.add(real)
            expected.append(directory)
    got = host.cuda_library_dirs()
    assert got == expected
    assert str(dist / "nvidia" / "cublas" / "lib") in got and str(dist / "nvidia" / "nccl" / "lib") not in got
    assert str(extra / "nvidia" / "cufft" / "lib") in got
    if wheel_cudart(12) is not None:
        assert str(wheel_cudart(12).parent) in got


def test_config_dirs_follow_the_xdg_base_directory_spec(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    home = tmp_path / "home"
    assert host.config_dirs() == [str(home / ".config" / "seedance"), "/etc/seedance",
                                  str(home / ".local" / "share" / "seedance" / "plugins")]
    # "If $XDG_DATA_HOME is either not set or empty, a default equal to $HOME/.local/share should be used."
    monkeypatch.setenv("XDG_DATA_HOME", "")
    monkeypatch.setenv("XDG_CONFIG_HOME", "")
    assert host.config_dirs()[2] == str(home / ".local" / "share" / "seedance" / "plugins")
    assert host.config_dir() == str(home / ".config" / "seedance")
    assert host.config_dir(str(tmp_path / "other")) == str(tmp_path / "other" / ".config" / "seedance")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert host.config_dirs() == [str(tmp_path / "cfg" / "seedance"), "/etc/seedance",
                                  str(tmp_path / "data" / "seedance" / "plugins")]


def test_a_damaged_ld_so_cache_lists_nothing(tmp_path):
    if os.path.isfile("/etc/ld.so.cache"):  # the default is the system's cache (ld.so(8))
        assert host.ld_cache_paths() == host.ld_cache_paths("/etc/ld.so.cache") != []
    bad = tmp_path / "ld.so.cache"
    bad.write_bytes(b"glibc-ld.so.cache1.1" + b"\xff" * 40)
    assert host.ld_cache_paths(str(bad)) == []
    assert host.ld_cache_paths(str(tmp_path)) == []  # a directory: OSError


# --- redaction: the rules of docs/bundle.md, case by case -------------------------------------
def test_structures_redact_secret_names_pairs_and_url_passwords_only():
    redactor = bundle.Redactor()
    doc = {"kind": "config_env", "n": 3, "ok": True, "none": None,
           "data": {"key": "AWS_SECRET_ACCESS_KEY", "value": "abcdEFGH1234", "build_id": "deadbeef"},
           "env": [{"name": "HF_TOKEN", "value": "hf_zzzz"}, {"name": "hf_token", "value": "lowercase"},
                   {"name": "PATH", "value": "/bin"}, {"name": "GH_TOKEN", "value": 7}],
           "FOO_PASSWORD": "pw12", "api_key": "kept: our own field name", "MY_KEY": "",
           "urls": ["https://u:p4ss@h/x", "plain"], 5: "int key"}
    out = redactor.structure("facts.json", doc)
    assert out == {"kind": "config_env", "n": 3, "ok": True, "none": None,
                   "data": {"key": "AWS_SECRET_ACCESS_KEY", "value": "<redacted>", "build_id": "deadbeef"},
                   "env": [{"name": "HF_TOKEN", "value": "<redacted>"}, {"name": "hf_token", "value": "lowercase"},
                           {"name": "PATH", "value": "/bin"}, {"name": "GH_TOKEN", "value": 7}],
                   "FOO_PASSWORD": "<redacted>", "api_key": "kept: our own field name", "MY_KEY": "",
                   "urls": ["https://u:<redacted>@h/x", "plain"], "5": "int key"}
    assert redactor.redactions == [{"where": "facts.json", "name": n}
                                   for n in ("AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "FOO_PASSWORD", "url")]
    # four characters or more are scrubbed from other members; shorter ones would hit "1", "yes"
    assert redactor.values == {"abcdEFGH1234", "hf_zzzz", "pw12", "p4ss"}
    again = bundle.Redactor()
    again.value("w", "A_TOKEN", "abc")
    assert again.values == set() and again.redactions == [{"where": "w", "name": "A_TOKEN"}]
    again.value("w", "A_TOKEN", "abcd")
    assert again.redactions == [{"where": "w", "name": "A_TOKEN"}]  # each (where, name) once
    assert again.value("w", "PASSWD_FILE", "") == ""  # nothing to hide
    # maybe_structure walks only where the JSON text could hold a secret
    plain = {"data": {"key": "PATH", "value": "/bin"}}
    assert bundle.Redactor().maybe_structure("f", plain) is plain
    hit = bundle.Redactor()
    assert hit.maybe_structure("f", {"X_CREDENTIAL": "zzzz"}) == {"X_CREDENTIAL": "<redacted>"}
    assert hit.maybe_structure("f", {"u": "ftp://a:bbbb@c"}) == {"u": "ftp://a:<redacted>@c"}


def test_config_text_redaction_keeps_every_line_and_its_ending():
    redactor = bundle.Redactor()
    text = ("# comment: https://x:commentpw@h\r\n"
            "export DB_PASSWORD='s3cr3t-value'\r\n"
            '"GITHUB_TOKEN": "ghp_abcdef"\n'
            "  api-key = k3yk3y  \n"
            "EMPTY_SECRET=\n"
            "plain: value\n"
            "endpoint: https://me:pw99@host")
    out = redactor.config_text("configs/x", text)
    assert out == ("# comment: https://x:<redacted>@h\r\n"
                   "export DB_PASSWORD=<redacted>\r\n"
                   '"GITHUB_TOKEN": <redacted>\n'
                   "  api-key = <redacted>  \n"
                   "EMPTY_SECRET=\n"
                   "plain: value\n"
                   "endpoint: https://me:<redacted>@host")
    assert redactor.redactions == [{"where": "configs/x", "name": n} for n in
                                   ("url", "DB_PASSWORD", "GITHUB_TOKEN", "api-key", "endpoint")]
    assert redactor.values == {"commentpw", "s3cr3t-value", "ghp_abcdef", "k3yk3y", "pw99"}
    env = bundle.Redactor().environ("e", {"SESSION_KEY": "kkkk", "HOME": "/root", "URL": "s3://a:bbbbb@c"})
    assert env == {"SESSION_KEY": "<redacted>", "HOME": "/root", "URL": "s3://a:<redacted>@c"}


def test_scrub_finds_a_secret_in_every_form_a_member_holds_it():
    redactor = bundle.Redactor()
    secret = 'pä"ss\\wd\udcff'  # a quote, a backslash, non-ASCII, an undecodable byte (surrogateescape)
    short = "pä"
    redactor.value("e", "X_TOKEN", secret)
    redactor.value("e", "Y_TOKEN", secret + "-longer")
    raw = secret.encode("utf-8", "surrogateescape")
    as_json = json.dumps({"v": secret}).encode()  # how facts.json and environ.json write it
    assert raw in b"<" + raw + b">" and b"\\u00e4" in as_json
    assert redactor.scrub(b"<" + raw + b">") == b"<<redacted>>"
    assert redactor.scrub(as_json) == b'{"v": "<redacted>"}'
    # the longer secret first, or its tail would be left behind
    longer = json.dumps({"v": secret + "-longer"}).encode()
    assert redactor.scrub(longer) == b'{"v": "<redacted>"}'
    assert redactor.scrub(short.encode()) == short.encode()


def test_env_names_as_environments_spell_them():
    for name in ("FOO_TOKEN", "AWS_SECRET_ACCESS_KEY", "A1_PASSWD", "X_CREDENTIALS"):
        assert redact.env_name(name), name
    for name in ("foo_token", "Foo_TOKEN", "_TOKEN", "PATH", "1_TOKEN", "FOO-TOKEN", ""):
        assert not redact.env_name(name), name


def test_a_small_capture_with_python_and_a_config_that_is_not_utf8(tmp_path):
    """.tgz, --python (torch's version from that interpreter's wheel, never imported) and a
    config whose comment is not UTF-8: kept, with U+FFFD where the bytes were."""
    from seedance.collect.scan import CheckOptions, Scanner
    from seedance.render.output import prepare_output

    tree = tmp_path / "t"
    (tree / "seedance").mkdir(parents=True)
    raw = b"# caf\xe9 \xff\nenv:\n  LD_LIBRARY_PATH: /opt/x\n"
    (tree / "seedance" / "agent.yaml").write_bytes(raw)
    # a config is kept up to 4 MiB (what the YAML reader itself accepts); one byte more is not
    (tree / "seedance" / "at-cap.yaml").write_bytes(b"#" * ((4 << 20) - 1) + b"\n")
    (tree / "seedance" / "over-cap.yaml").write_bytes(b"#" * (4 << 20) + b"\n")
    path = tmp_path / "small.tgz"
    err = io.StringIO()
    options = CheckOptions(targets=[str(tree)], python=sys.executable, strict=True)
    _report, summary = bundle.capture(options, prepare_output(str(path), what="bundle"), stderr=err)
    held = {name: data for name, _info, data in read_members(path)}
    assert held["configs" + str(tree / "seedance" / "agent.yaml")] == raw.decode("utf-8", "replace").encode()
    assert len(held["configs" + str(tree / "seedance" / "at-cap.yaml")]) == 4 << 20
    assert "configs" + str(tree / "seedance" / "over-cap.yaml") not in held
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = None
    assert json.loads(held["host/versions.json"])["torch"] == torch
    assert json.loads(held["manifest.json"])["options"]["strict"] is True
    assert summary.size == path.stat().st_size and path.read_bytes()[:2] == b"\x1f\x8b"
    scanner = Scanner(CheckOptions(targets=[str(tree)], python=sys.executable))
    scanner.run()
    assert scanner.python_torch is not None or torch is None
    assert bundle._torch_version(scanner) == torch


def _fact_keys(facts) -> list:
    return sorted(json.dumps(f.to_dict(), sort_keys=True) for f in facts)


def test_rederived_facts_are_the_facts_a_live_check_collects(captured, monkeypatch):
    """fatbin, fatbin_ptx and cuda_driver facts from runtime.json, field for field the facts
    the live scan of the same tree collects for that GPU and driver."""
    from seedance.collect.scan import CheckOptions, Scanner

    c = captured
    monkeypatch.setenv("LD_LIBRARY_PATH", str(c.tmp / "cuda-12.8" / "compat"))
    runtime = _json(c.held["runtime.json"])
    for arch, driver in (("sm_90", "470.82.01"), ("sm_86", "580.65.06")):
        gpu = bundle._gpu_for(runtime["gpu"], arch, driver)
        derived = bundle._arch_driver_facts(runtime, gpu)
        scanner = Scanner(CheckOptions(targets=[str(c.tree)], arch=arch, driver_version=driver))
        scanner.run()
        live = [f for f in scanner.facts if f.kind in ("fatbin", "fatbin_ptx", "cuda_driver")]
        assert _fact_keys(derived) == _fact_keys(live), (arch, driver)
        if c.nvcc:
            static = [f for f in derived if f.kind == "cuda_driver" and f.data["linkage"] == "static"]
            assert {f.subject["path"] for f in static} == {str(c.tree / "libk.so"), str(c.tree / "probe")}
            assert all(f.data["compat"] == c.compat and f.data["version_source"] == "toolkit release string"
                       for f in static)
    # no driver known and none given: nothing about drivers; no target: nothing about fatbins
    assert bundle._arch_driver_facts(runtime, cuda.GpuInfo()) == []
    if c.nvcc:
        away = c.tmp / "tree-away2"
        os.rename(c.tree, away)
        try:
            gone = bundle._arch_driver_facts(runtime, bundle._gpu_for(runtime["gpu"], "sm_90", None))
        finally:
            os.rename(away, c.tree)
        fatbin_facts = [f for f in gone if f.kind in ("fatbin", "fatbin_ptx")]
        assert fatbin_facts and all(f.data["kernels_from"] == "not captured" for f in fatbin_facts)
        assert {f.subject["path"] for f in fatbin_facts} <= {str(c.tree / "libk.so"), str(c.tree / "probe")}


@needs_gcc
def test_runtime_major_and_static_markers_of_gcc_built_libraries(tmp_path):
    """What a file declares decides: DT_SONAME, then its version definitions, then its name
    (pyelftools reads back what the linker wrote); and an unstripped static runtime's symbol
    names mark it even without its .rodata template."""
    from elftools.elf.elffile import ELFFile

    from seedance.elf.reader import read_elf

    (tmp_path / "r.c").write_text("int cudaRuntimeGetVersion(int *v) { *v = 1; return 0; }\n")
    (tmp_path / "v.map").write_text("libcudart.so.13 { global: cudaRuntimeGetVersion; local: *; };\n")
    by_soname = tmp_path / "a" / "libcudart.so.12"
    by_version = tmp_path / "b" / "libcudart.so.12"
    by_name = tmp_path / "c" / "libcudart.so.12"
    for lib in (by_soname, by_version, by_name):
        lib.parent.mkdir()
    cc("-shared", "-fPIC", tmp_path / "r.c", "-o", by_soname, "-Wl,-soname,libcudart.so.11.0")
    cc("-shared", "-fPIC", tmp_path / "r.c", "-o", by_version, "-Wl,-soname,libother.so.1",
       f"-Wl,--version-script={tmp_path / 'v.map'}")
    cc("-shared", "-fPIC", tmp_path / "r.c", "-o", by_name)
    for lib, major in ((by_soname, 11), (by_version, 13), (by_name, 12)):
        with open(lib, "rb") as handle:
            elf = ELFFile(handle)
            tags = {t.entry.d_tag: t for t in elf.get_section_by_name(".dynamic").iter_tags()}
            soname = tags["DT_SONAME"].soname if "DT_SONAME" in tags else None
            verdef = elf.get_section_by_name(".gnu.version_d")
            defs = [next(iter(a)).name for d, a in verdef.iter_versions()] if verdef else []
        info = read_elf(str(lib))
        assert cuda.runtime_major(str(lib), info) == major, (lib, soname, defs)
        assert cuda.runtime_major(str(lib)) == 12  # the name alone
    renamed = tmp_path / "a" / "libwhatever.so"
    shutil.copyfile(by_soname, renamed)
    assert cuda.is_cudart(str(renamed), read_elf(str(renamed))) and not cuda.is_cudart(str(renamed), None)
    assert cuda.runtime_major(str(renamed), read_elf(str(renamed))) == 11
    # libcudart_static_* symbol names, a .rodata without the template, no device code: marked
    # in .strtab (where the bytes are, not in whatever follows .rodata in the file), major unknown
    (tmp_path / "s.c").write_text('const char *libcudart_static_note(void) { return "a note"; }\n')
    marked = tmp_path / "libmarked.so"
    cc("-shared", "-fPIC", tmp_path / "s.c", "-o", marked)
    with open(marked, "rb") as handle:
        elf = ELFFile(handle)
        assert b"libcudart_static_" in elf.get_section_by_name(".strtab").data()
        rodata = elf.get_section_by_name(".rodata")
        assert b"a note" in rodata.data() and b"libcudart_static_" not in rodata.data()
        assert rodata["sh_offset"] < elf.get_section_by_name(".strtab")["sh_offset"]
    assert cuda.static_runtime(str(marked), read_elf(str(marked))) == {
        "major": None, "release": None, "marker": "libcudart_static_ in .strtab", "version_source": None}
    stripped = tmp_path / "libstripped.so"
    subprocess.run(["strip", "-o", str(stripped), str(marked)], check=True, capture_output=True)
    assert cuda.static_runtime(str(stripped), read_elf(str(stripped))) is None
    text = tmp_path / "notes.txt"
    text.write_text("libcudart_static_ /cudart.shm.% in a text file is no object\n")
    assert cuda.static_runtime(str(text), None) is None
    # judged only with device code: a marked object without any is not a cuda_driver fact
    gpu = cuda.GpuInfo(driver_version="535.104.05", driver_source="nvml")
    seen: set = set()
    assert cuda.static_runtime_facts({str(marked): read_elf(str(marked)), str(text): None}, gpu, seen) == []
    assert seen == {str(marked), str(text)}


def test_a_fact_read_back_from_a_bundle(tmp_path):
    from seedance.model.errors import BadInput
    from seedance.model.report import Fact

    item = {"kind": "needed", "subject": {"path": "/a"}, "data": {"name": "libx.so"}}
    assert bundle._fact(item, "b.tar.zst") == Fact("needed", {"path": "/a"}, {"name": "libx.so"}, "")
    assert bundle._fact({**item, "source": "collect.closure"}, "b").source == "collect.closure"
    assert bundle._fact({**item, "kind": 7}, "b").kind == "7"
    for bad in ({"subject": {}, "data": {}}, {**item, "subject": 5}, {**item, "data": ["abc"]}, "needed"):
        with pytest.raises(BadInput) as caught:
            bundle._fact(bad, "b.tar.zst")
        assert str(caught.value) == "b.tar.zst: damaged bundle: a fact without kind, subject or data"
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"\x7fELF" + os.urandom(60))
    digest = hashlib.sha256(lib.read_bytes()).hexdigest()
    assert bundle._same_file(str(lib), digest) is True
    assert bundle._same_file(str(lib), "0" * 64) is False
    assert bundle._same_file(str(lib), None) is False
    assert bundle._same_file(str(tmp_path), digest) is False  # a directory is not that file
    assert bundle._same_file(str(tmp_path / "absent"), digest) is False
    # files bigger than one read block hash like sha256sum
    big = tmp_path / "big"
    big.write_bytes(os.urandom((1 << 20) * 2 + 17))
    assert bundle._sha256(str(big)) == subprocess.run(["sha256sum", str(big)], capture_output=True,
                                                      text=True).stdout.split()[0]
    assert bundle._count(["b", "a", "b", "c"]) == {"a": 1, "b": 2, "c": 1}
    assert list(bundle._count(["b", "a"])) == ["a", "b"]


def test_static_runtimes_are_judged_by_their_device_code(tmp_path):
    """Static runtimes are judged when they hold device code: the runtime's release is told
    from it (the toolkit string inside the fatbin images, or their PTX ISA).  A separately
    compiled program (-rdc=true) holds __nv_relfatbin beside .nv_fatbin and is judged too; a
    program that links libcudart_static.a without any kernel gets no fact (seed-2027 sample:
    static_runtime_facts 11 skipped the objects holding both sections)."""
    from elftools.elf.elffile import ELFFile

    from seedance.elf.reader import read_elf

    static = Path("/usr/local/cuda/lib64/libcudart_static.a")
    if GCC is None or NVCC is None or not static.exists():
        pytest.skip("gcc and the CUDA toolkit's libcudart_static.a are needed")
    (tmp_path / "host.c").write_text("int cudaRuntimeGetVersion(int *v);\n"
                                     "int main(void) { int v = 0; return cudaRuntimeGetVersion(&v); }\n")
    host = tmp_path / "host"
    cc(tmp_path / "host.c", "-o", host, static, "-lpthread", "-ldl", "-lrt", "-lstdc++")
    whole = nvcc_build(PROBE, [], tmp_path / "whole")  # nvcc's default: -cudart static
    separate = nvcc_build(PROBE.replace("int main", "__global__ void k(int *p) { p[0] = 1; }\nint main"),
                          ["-rdc=true"], tmp_path / "separate")

    def device_sections(path):  # the oracle: pyelftools' section table
        with open(path, "rb") as handle:
            return {".nv_fatbin", "__nv_relfatbin"} & {s.name for s in ELFFile(handle).iter_sections()}

    assert (device_sections(host), device_sections(whole)) == (set(), {".nv_fatbin"})
    assert device_sections(separate) == {".nv_fatbin", "__nv_relfatbin"}
    assert all(_rodata_has(p, b"/cudart.shm.") for p in (host, whole, separate))  # all three are static runtimes
    gpu = cuda.GpuInfo(driver_version="535.104.05", driver_source="--driver-version")
    objects = {str(p): read_elf(str(p)) for p in (host, whole, separate)}
    facts = cuda.static_runtime_facts(objects, gpu, set())
    assert [f.subject["path"] for f in facts] == [str(whole), str(separate)]
