"""check --bundle / --from-bundle (issue 16, section 1) on real fixtures built with gcc and
nvcc: the live check of the tree is the oracle, and the replay happens after the planted
files are deleted, so only the bundle can answer."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import ROOT, run_cli

SCHEMA = json.loads((ROOT / "agent" / "schemas" / "report.schema.json").read_text())
GCC = shutil.which("gcc")
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc not installed")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not installed")


def _cu12() -> Path | None:
    try:
        import nvidia.cuda_runtime as rt
    except ImportError:
        return None
    lib = Path(list(rt.__path__)[0]) / "lib" / "libcudart.so.12"
    return lib if lib.exists() else None


CU12 = _cu12()


def cc(*args):
    subprocess.run([GCC, *map(str, args)], check=True, capture_output=True)


def plant_traps(tmp: Path) -> Path:
    """A tree with three traps: a missing version node, a NEEDED that resolves nowhere and
    (when the cu12 wheel is there) a CUDA 12 runtime user, judged against drivers later."""
    tree = tmp / "tree"
    tree.mkdir()
    (tree / "v.map").write_text("VER_2 { global: foo; local: *; };\n")
    (tree / "v.c").write_text("int foo(void) { return 7; }\n")
    cc("-shared", "-fPIC", tree / "v.c", "-o", tree / "libv.so", f"-Wl,--version-script={tree / 'v.map'}",
       "-Wl,-soname,libv.so")
    build = tmp / "build"  # the app is linked against VER_1, then sees only the VER_2 provider
    build.mkdir()
    (build / "v.map").write_text("VER_1 { global: foo; local: *; };\n")
    cc("-shared", "-fPIC", tree / "v.c", "-o", build / "libv.so", f"-Wl,--version-script={build / 'v.map'}",
       "-Wl,-soname,libv.so")
    (tree / "m.c").write_text("int foo(void);\nint main(void) { return foo() == 7 ? 0 : 3; }\n")
    cc(tree / "m.c", "-o", tree / "app", f"-L{build}", "-lv", "-Wl,-rpath,$ORIGIN")
    (build / "g.c").write_text("int gone(void) { return 1; }\n")
    cc("-shared", "-fPIC", build / "g.c", "-o", build / "libgone.so", "-Wl,-soname,libgone.so")
    (tree / "m2.c").write_text("int gone(void);\nint main(void) { return gone(); }\n")
    cc(tree / "m2.c", "-o", tree / "app2", f"-L{build}", "-lgone", "-Wl,-rpath,$ORIGIN/sub")
    if CU12 is not None:
        (tree / "a.c").write_text("int cudaRuntimeGetVersion(int *v);\n"
                                  "int a(void) { int v = 0; cudaRuntimeGetVersion(&v); return v; }\n")
        cc("-shared", "-fPIC", tree / "a.c", "-o", tree / "liba.so", f"-L{CU12.parent}", "-l:libcudart.so.12",
           f"-Wl,-rpath,{CU12.parent}")
    shutil.rmtree(build)
    return tree


def check_json(*args, code=(0, 1)):
    proc = run_cli("check", "--json", "--no-progress", *args)
    assert proc.returncode in code, proc.stderr
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    jsonschema.validate(report, SCHEMA)
    return proc, report


def finding_set(report) -> set:
    return {(f["rule"], json.dumps(f["subject"], sort_keys=True), f["message"], f["fingerprint"])
            for f in report["findings"]}


def members(bundle: Path) -> dict:
    raw = bundle.read_bytes()
    if raw[:4] in (b"\x28\xb5\x2f\xfd", b"\x5e\x2a\x4d\x18"):
        import zstandard

        raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)).read()
    else:
        raw = gzip.decompress(raw)
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def decompressed(bundle: Path) -> bytes:
    raw = bundle.read_bytes()
    if raw[:4] in (b"\x28\xb5\x2f\xfd", b"\x5e\x2a\x4d\x18"):
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)).read()
    return gzip.decompress(raw)


@needs_gcc
@pytest.mark.parametrize("suffix", [".tar.zst", ".tar.gz"])
def test_replay_reproduces_the_findings_with_the_planted_files_gone(tmp_path, suffix):
    tree = plant_traps(tmp_path)
    bundle = tmp_path / f"evidence{suffix}"
    proc, live = check_json(tree, "--bundle", bundle)
    rules = {f["rule"] for f in live["findings"]}
    assert {"symbol-version-missing", "needed-unresolved"} <= rules
    # the end of the capture says where, how big and what it holds
    assert f"{bundle.stat().st_size} bytes" in proc.stderr and "facts" in proc.stderr
    shutil.rmtree(tree)
    _, replayed = check_json("--from-bundle", bundle)
    assert finding_set(replayed) == finding_set(live)
    assert replayed["replay"]["bundle"] == str(bundle)
    held = members(bundle)
    assert {"manifest.json", "facts.json", "report.json", "runtime.json", "objects.json",
            "ldso/etc/ld.so.cache"} <= set(held)
    objects = json.loads(held["objects.json"])
    assert str(tree / "app") in objects
    app = objects[str(tree / "app")]
    assert app["needed"] == ["libv.so", "libc.so.6"] and app["sha256"] and app["size"] > 0
    assert not any(name.startswith("binaries/") for name in held)  # never without --with-binaries


@needs_gcc
def test_with_binaries_holds_the_objects_byte_for_byte(tmp_path):
    tree = plant_traps(tmp_path)
    bundle = tmp_path / "b.tar.zst"
    app_bytes = (tree / "app").read_bytes()
    check_json(tree, "--bundle", bundle, "--with-binaries")
    held = members(bundle)
    assert held["binaries" + str(tree / "app")] == app_bytes
    objects = json.loads(held["objects.json"])
    assert objects[str(tree / "app")]["sha256"] == hashlib.sha256(app_bytes).hexdigest()


@needs_gcc
@pytest.mark.skipif(CU12 is None, reason="nvidia-cuda-runtime-cu12 wheel not installed")
@pytest.mark.parametrize("driver", ["470.82.01", "550"])
def test_driver_version_on_a_bundle_matches_a_live_check_against_that_driver(tmp_path, driver):
    tree = plant_traps(tmp_path)
    bundle = tmp_path / "b.tar.zst"
    check_json(tree, "--bundle", bundle)  # taken with no driver known (no NVML here)
    _, live = check_json(tree, "--driver-version", driver)
    shutil.rmtree(tree)
    _, replayed = check_json("--from-bundle", bundle, "--driver-version", driver)
    assert finding_set(replayed) == finding_set(live)
    assert replayed["host"]["gpu"]["driver_version"] == driver


KERNEL = "__global__ void k(int *p) { p[0] = 1; }\nvoid launch(int *p) { k<<<1, 1>>>(p); }\n"


@needs_nvcc
def test_arch_on_a_bundle_rederives_fatbin_verdicts(tmp_path):
    tree = tmp_path / "k"
    tree.mkdir()
    (tree / "k.cu").write_text(KERNEL)
    lib = tree / "libk.so"
    subprocess.run([NVCC, "-shared", "-Xcompiler", "-fPIC", "-gencode", "arch=compute_86,code=sm_86",
                    str(tree / "k.cu"), "-o", str(lib)], check=True, capture_output=True)
    bundle = tmp_path / "k.tar.zst"
    check_json(tree, "--bundle", bundle)
    live = {arch: check_json(tree, "--arch", arch)[1] for arch in ("sm_90", "sm_86")}
    assert "cuda-arch-missing" in {f["rule"] for f in live["sm_90"]["findings"]}
    shutil.rmtree(tree)
    for arch in ("sm_90", "sm_86"):
        _, replayed = check_json("--from-bundle", bundle, "--arch", arch)
        key = {(f["rule"], f["subject"]["path"]) for f in replayed["findings"]}
        assert key == {(f["rule"], f["subject"]["path"]) for f in live[arch]["findings"]}
        for finding in replayed["findings"]:
            if finding["rule"] == "cuda-arch-missing":  # the images are gone: said, not hidden
                assert "needed_live_data" in finding["evidence"]


def test_a_secret_in_a_scanned_process_environment_is_nowhere_in_the_bundle(tmp_path):
    token = "s3cr3t-" + hashlib.sha256(str(time.time()).encode()).hexdigest()[:20]
    password = "pw-" + token[::-1]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "FOO_TOKEN": token,
           "DATABASE_URL": f"postgres://alice:{password}@db.internal:5432/app", "PLAIN": "kept"}
    child = subprocess.Popen(["sleep", "60"], env=env)
    try:
        bundle = tmp_path / "pid.tar.zst"
        proc = run_cli("check", "--no-progress", "--pid", child.pid, "--bundle", bundle)
        assert proc.returncode in (0, 1), proc.stderr
    finally:
        child.kill()
        child.wait()
    raw = decompressed(bundle)
    for secret in (token, password):
        assert secret.encode() not in raw
        assert secret[:12].encode() not in raw
    held = members(bundle)
    environ = json.loads(held[f"processes/{child.pid}/environ.json"])
    assert environ["FOO_TOKEN"] == "<redacted>" and environ["PLAIN"] == "kept"
    assert environ["DATABASE_URL"] == "postgres://alice:<redacted>@db.internal:5432/app"
    manifest = json.loads(held["manifest.json"])
    where = f"processes/{child.pid}/environ.json"
    assert {"where": where, "name": "FOO_TOKEN"} in manifest["redacted"]
    assert {"where": where, "name": "DATABASE_URL"} in manifest["redacted"]
    assert f"processes/{child.pid}/maps" in held


def test_redaction_of_config_text():
    from seedance.collect.bundle import Redactor

    redactor = Redactor()
    text = ("api_token: abcd1234efgh\nexport AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI\n"
            "endpoint: https://user:hunter22@example.org/x\nname: keep-me\n")
    out = redactor.config_text("configs/x.yaml", text)
    for secret in ("abcd1234efgh", "wJalrXUtnFEMI", "hunter22"):
        assert secret not in out
    assert "name: keep-me" in out and "https://user:<redacted>@example.org/x" in out
    assert [r["name"] for r in redactor.redactions] == ["api_token", "AWS_SECRET_ACCESS_KEY", "endpoint"]
    # and any other member quoting a captured secret is scrubbed
    assert b"abcd1234efgh" not in redactor.scrub(b'{"value": "abcd1234efgh"}')


def _damaged(tmp_path: Path, good: Path) -> dict:
    data = good.read_bytes()
    flipped = bytearray(data)
    for index in range(len(flipped) // 3, len(flipped) // 3 + 64):
        flipped[index] ^= 0xFF
    raw = decompressed(good)
    no_facts = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(raw)) as src, tarfile.open(fileobj=no_facts, mode="w") as dst:
        for member in src:
            if member.name != "facts.json":
                dst.addfile(member, src.extractfile(member))
    bad_json = io.BytesIO()
    with tarfile.open(fileobj=bad_json, mode="w") as dst:
        for name in ("manifest.json", "facts.json", "report.json", "runtime.json"):
            body = b'{"schema": "seedance.bundle/v1"' if name == "facts.json" else \
                json.dumps({"schema": "seedance.bundle/v1"}).encode()
            info = tarfile.TarInfo(name)
            info.size = len(body)
            dst.addfile(info, io.BytesIO(body))
    cases = {"truncated": data[: len(data) // 2], "flipped": bytes(flipped), "garbage": os.urandom(4096),
             "empty": b"", "gzip-not-tar": gzip.compress(b"hello" * 100),
             "missing-facts": gzip.compress(no_facts.getvalue()), "bad-json": gzip.compress(bad_json.getvalue())}
    paths = {}
    for name, body in cases.items():
        path = tmp_path / f"{name}.tar.gz"
        path.write_bytes(body)
        paths[name] = path
    return paths


@needs_gcc
def test_a_damaged_bundle_is_one_line_and_exit_2(tmp_path):
    tree = plant_traps(tmp_path)
    good = tmp_path / "good.tar.zst"
    check_json(tree, "--bundle", good)
    for name, path in _damaged(tmp_path, good).items():
        proc = run_cli("check", "--from-bundle", path)
        assert proc.returncode == 2, (name, proc.stderr)
        assert "Traceback" not in proc.stderr, name
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("seedance: error:"), (name, proc.stderr)
    proc = run_cli("check", "--from-bundle", tmp_path / "absent.tar.zst")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_bad_bundle_names_fail_before_the_scan(tmp_path):
    for args in (["--bundle", tmp_path / "out.zip"], ["--bundle", "-"], ["--with-binaries"],
                 ["--bundle", tmp_path / "b.tar.zst", "--from-bundle", tmp_path / "b.tar.zst"]):
        proc = run_cli("check", "--no-progress", "/nonexistent-target", *args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert "nonexistent-target" not in proc.stderr, proc.stderr  # refused before the target is read


@needs_gcc
@pytest.mark.parametrize("suffix", [".tar.zst", ".tar.gz"])
def test_a_bundle_is_replaced_on_rerun_and_other_files_are_not(tmp_path, suffix):
    tree = plant_traps(tmp_path)
    bundle = tmp_path / f"b{suffix}"
    check_json(tree, "--bundle", bundle)
    first = tmp_path / f"first{suffix}"
    first.write_bytes(bundle.read_bytes())
    os.utime(bundle, (0, 0))
    check_json(tree, "--bundle", bundle)  # seedance.render.output knows it as ours: replaced, no --force
    assert bundle.stat().st_mtime > 0
    assert json.loads(members(bundle)["facts.json"]) == json.loads(members(first)["facts.json"])
    other = tmp_path / f"notes{suffix}"
    other.write_bytes(b"someone else's archive")
    proc = run_cli("check", "--no-progress", tree, "--bundle", other)
    assert proc.returncode == 2 and "--force" in proc.stderr
    assert other.read_bytes() == b"someone else's archive"


def test_secrets_in_a_scanned_config_are_redacted_everywhere(tmp_path):
    token, password = "hf_" + os.urandom(8).hex(), "pw" + os.urandom(8).hex()
    config = tmp_path / "seedance" / "agent.yaml"
    config.parent.mkdir()
    config.write_text(f"env:\n  LD_PRELOAD: ${{HOME}}/lib/libx.so\n  HF_TOKEN: {token}\n"
                      f"otlp_endpoint: https://bob:{password}@otel.example/v1\n")
    bundle = tmp_path / "cfg.tar.gz"
    proc = run_cli("check", "--no-progress", tmp_path, "--bundle", bundle)
    assert proc.returncode in (0, 1), proc.stderr
    raw = decompressed(bundle)
    assert token.encode() not in raw and password.encode() not in raw
    held = members(bundle)
    text = held["configs" + str(config)].decode()
    assert "HF_TOKEN: <redacted>" in text and "https://bob:<redacted>@otel.example/v1" in text
    assert "LD_PRELOAD: ${HOME}/lib/libx.so" in text  # evidence that is no secret stays
    names = {r["name"] for r in json.loads(held["manifest.json"])["redacted"]}
    assert {"HF_TOKEN", "otlp_endpoint"} <= names


def test_fact_structures_redact_secret_pairs_but_not_our_field_names():
    from seedance.collect.bundle import Redactor

    redactor = Redactor()
    fact = {"kind": "config_env", "subject": {"path": "/x"},
            "data": {"key": "AWS_SECRET_ACCESS_KEY", "value": "abcdEFGH1234", "build_id": "deadbeef",
                     "url": "https://u:p4ssw0rd@h/x"}}
    out = redactor.structure("facts.json", fact)
    assert out["data"]["value"] == "<redacted>" and out["data"]["key"] == "AWS_SECRET_ACCESS_KEY"
    assert out["data"]["build_id"] == "deadbeef" and out["data"]["url"] == "https://u:<redacted>@h/x"
    assert redactor.maybe_structure("facts.json", {"data": {"key": "PATH", "value": "/bin"}}) == \
        {"data": {"key": "PATH", "value": "/bin"}}


@needs_gcc
def test_any_flipped_byte_is_bad_input_or_a_readable_bundle(tmp_path):
    """In process, so hundreds of damaged copies are cheap: a replay (re-deriving for another
    GPU and driver) either works or raises BadInput (one line), never anything else."""
    import random

    from seedance.collect.bundle import replay
    from seedance.model.errors import BadInput

    tree = plant_traps(tmp_path)
    outcomes = {"read": 0, "refused": 0}
    for suffix in (".tar.zst", ".tar.gz"):
        good = tmp_path / f"good{suffix}"
        check_json(tree, "--bundle", good)
        data = good.read_bytes()
        rng = random.Random(16)
        for _ in range(150):
            damaged = bytearray(data)
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
            path = tmp_path / f"d{suffix}"
            path.write_bytes(bytes(damaged))
            try:
                replay(str(path), arch="sm_90", driver_version="470")
                outcomes["read"] += 1
            except BadInput as exc:
                assert "\n" not in str(exc)
                outcomes["refused"] += 1
    assert outcomes["refused"] > 0


def test_a_bundle_from_before_containers_replays_its_lib_deleted_with_a_working_fix(tmp_path):
    """mapped_lib facts written before findings named the process's container carry no
    `where` and no `restart`: the finding and its fix still read as they did ("restart pid N"),
    not with "?" in their place."""
    import json as _json
    from tests.security.test_bundle_attacks import base_members, write_bundle

    old_fact = {"kind": "mapped_lib", "subject": {"pid": 4242, "path": "/usr/lib/libold.so"},
                "data": {"deleted": True, "replaced": False, "state": "deleted", "mapped_inode": 7,
                         "disk_inode": None, "exe": "/usr/bin/app"}, "source": "collect.process"}
    path = write_bundle(tmp_path / "old.tar.zst", base_members(facts=[old_fact]))
    ran = run_cli("check", "--from-bundle", path, "--json")
    assert ran.returncode in (0, 1) and not ran.stderr.strip(), ran.stderr  # lib-deleted is a warning
    findings = [f for f in _json.loads(ran.stdout)["findings"] if f["rule"] == "lib-deleted"]
    assert len(findings) == 1, ran.stdout[-2000:]
    assert findings[0]["fix"] == "restart pid 4242"
    assert "?" not in findings[0]["message"] and "pid 4242 maps /usr/lib/libold.so" in findings[0]["message"]
