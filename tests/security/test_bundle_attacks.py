"""Hostile evidence bundles against `check --from-bundle`, and secrets against `check --bundle`.

Bombs are built cheaply and never materialised: a zstd frame written block by block (an
RLE block is 4 bytes for 128 KiB of zeros: 16 GiB in ~512 KB, the size of the bomb that
was read to its end before), and gzip as concatenated members of 1 MiB of zeros.  Each
replay runs as the real CLI in a child whose own peak RSS is read with os.wait4, so the
memory bound is asserted, not guessed.  The caps' edges are read in process with smaller
Caps, so that "just under passes, just over refused" costs milliseconds.
"""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
import zstandard

from seedance.collect import bundle
from seedance.collect.bundle_reader import CAPS, NEEDED, Caps
from seedance.model.errors import BadInput
from tests.conftest import BIN

MiB = 1 << 20
SCHEMA = bundle.SCHEMA
# the replay's peak RSS may be twice its largest held member plus this (docs/bundle.md)
FIXED_RSS = 100 * 1000 * 1000


# --- building bundles --------------------------------------------------------------------------
def base_members(facts=None) -> list:
    """The four members replay needs, as a real capture writes them (compact JSON)."""
    dumps = lambda value: json.dumps(value, separators=(",", ":")).encode()  # noqa: E731
    return [("facts.json", dumps(facts if facts is not None else [])),
            ("report.json", dumps({"host": {"hostname": "h"}, "stats": {}, "scope": {}})),
            ("runtime.json", dumps({"gpu": {}, "closures": [], "fatbins": {}, "static_runtimes": {}})),
            ("host/uname.json", b'{"system": "Linux"}')]


def manifest_for(listing: list) -> bytes:
    """listing: (name, size, sha256 hex)."""
    return json.dumps({"schema": SCHEMA, "created": "2026-01-01T00:00:00Z", "host": "h",
                       "members": [{"name": n, "size": s, "sha256": h} for n, s, h in listing]},
                      indent=1).encode()


def listed(members: list) -> list:
    return [(name, len(data), hashlib.sha256(data).hexdigest()) for name, data in members]


def tar_bytes(members: list, with_manifest=True, end=True) -> bytes:
    """A plain tar as the writer makes it: the manifest first, then the members; with
    end=False, without its end-of-archive blocks (for a bomb to go on from)."""
    if with_manifest:
        members = [("manifest.json", manifest_for(listed(members)))] + members
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        body = buffer.getvalue()  # each member is written whole as it is added
    return buffer.getvalue() if end else body


def write_bundle(path: Path, members: list) -> Path:
    """A real bundle through the writer's own packer (collect/bundle._pack)."""
    members = [("manifest.json", manifest_for(listed(members)))] + members
    path.write_bytes(bundle._pack(members, str(path)))
    return path


def zstd_frame(parts: list) -> bytes:
    """One zstd frame (RFC 8878, 3.1.1) from ("raw", bytes) and ("zeros", count) parts:
    raw blocks for the bytes, RLE blocks for the zeros; no content size, no checksum."""
    out = [b"\x28\xb5\x2f\xfd", b"\x00", bytes([(20 - 10) << 3])]  # FHD 0; a 1 MiB window
    blocks = []
    step = 128 << 10
    for kind, value in parts:
        if kind == "raw":
            blocks += [(0, value[i:i + step], len(value[i:i + step])) for i in range(0, len(value), step)]
        else:
            full, rest = divmod(value, step)
            blocks += [(1, b"\0", step)] * full + ([(1, b"\0", rest)] if rest else [])
    for index, (kind, body, size) in enumerate(blocks):
        last = index == len(blocks) - 1
        out.append((int(last) | kind << 1 | size << 3).to_bytes(3, "little") + body)
    return b"".join(out)


GZIP_ZEROS = gzip.compress(bytes(MiB), compresslevel=9)  # ~1 KB


def gzip_with_zeros(prefix: bytes, zero_mib: int, suffix: bytes = b"") -> bytes:
    """prefix, then zero_mib MiB of zeros, then suffix: gzip members end to end (RFC 1952,
    2.2: a gzip file is a series of members), so 2 GiB cost 2,048 copies of one."""
    return gzip.compress(prefix) + GZIP_ZEROS * zero_mib + (gzip.compress(suffix) if suffix else b"")


def header(name: str, size: int) -> bytes:
    """A tar header (with a pax header first where the size needs one) for `size` bytes."""
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(format=tarfile.PAX_FORMAT)


def tar_end() -> bytes:
    return bytes(2 * 512)


# --- running the CLI, measured ------------------------------------------------------------------
# A small launcher between pytest and seedance: Linux starts a child's peak RSS at its
# parent's (a forked mm is a copy, and exec records the old mm's high-water mark:
# fs/exec.c, exec_mmap), so a child of pytest would report pytest's peak.  The launcher is a
# bare Python, smaller than any seedance run, and reports the grandchild's own peak.
LAUNCHER = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[2:])
_pid, status, usage = os.wait4(child.pid, 0)
open(sys.argv[1], "w").write(str(usage.ru_maxrss * 1024))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def seedance_cmd(*args) -> list:
    exe = BIN / "seedance"
    return ([str(exe)] if exe.exists() else [sys.executable, "-m", "seedance"]) + [str(a) for a in args]


def run_measured(args: list, timeout: float = 120):
    """(exit code, stderr, peak RSS of seedance in bytes, wall seconds) of one CLI run; one
    past `timeout` is killed (exit -9) so the test fails rather than hangs."""
    with tempfile.TemporaryDirectory() as scratch:
        peak_file = Path(scratch) / "peak"
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(peak_file), *seedance_cmd(*args)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            _out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _out, err = proc.communicate()
        wall = time.monotonic() - start
        peak = int(peak_file.read_text()) if peak_file.exists() else 0
    return proc.returncode, err.decode("utf-8", "replace"), peak, wall


def replay_measured(path: Path, *extra, timeout: float = 120):
    return run_measured(["check", "--from-bundle", path, "--json", "--no-progress", *extra], timeout)


def assert_refused(rc: int, stderr: str, *words: str) -> str:
    assert rc == 2, (rc, stderr[-2000:])
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("seedance: error:"), stderr[-2000:]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


# --- 1. bombs ------------------------------------------------------------------------------------
def test_a_16_gib_zstd_member_is_refused_at_its_header(tmp_path):
    """535 KB on disk, 16 GiB of zeros in one member, in one frame."""
    head = tar_bytes(base_members(), end=False)
    size = 16 << 30
    frame = zstd_frame([("raw", head + header("binaries/usr/lib/bomb.so", size)), ("zeros", size),
                        ("raw", tar_end())])
    path = tmp_path / "bomb.tar.zst"
    path.write_bytes(frame)
    assert len(frame) < 600_000
    rc, stderr, rss, wall = replay_measured(path, timeout=60)
    assert_refused(rc, stderr, "binaries/usr/lib/bomb.so", "member-size cap of 512 MiB")
    assert wall < 20 and rss < FIXED_RSS, (wall, rss)


def test_a_gzip_bomb_over_the_total_is_refused_from_its_manifest(tmp_path):
    """~4.5 MB of gzip for 4.4 GiB of members, each under the member cap."""
    chunk = 400 * MiB
    zeros_sha = hashlib.sha256()
    for _ in range(400):
        zeros_sha.update(bytes(MiB))
    names = [f"binaries/lib{i}.so" for i in range(11)]
    members = base_members()
    listing = listed(members) + [(n, chunk, zeros_sha.hexdigest()) for n in names]
    body = tar_bytes([("manifest.json", manifest_for(listing))] + members, with_manifest=False, end=False)
    data = gzip.compress(body)
    for name in names:
        data += gzip.compress(header(name, chunk)) + GZIP_ZEROS * 400
    data += gzip.compress(tar_end())
    path = tmp_path / "bomb.tar.gz"
    path.write_bytes(data)
    assert len(data) < 6 * MiB
    rc, stderr, rss, wall = replay_measured(path, timeout=60)
    assert_refused(rc, stderr, "total-size cap of 4 GiB")
    assert wall < 20 and rss < FIXED_RSS, (wall, rss)


def test_zeros_after_the_end_of_the_tar_are_not_read_on(tmp_path):
    """A valid bundle followed, inside the same frame, by 16 GiB of zeros."""
    plain = tar_bytes(base_members())
    path = tmp_path / "tail.tar.zst"
    path.write_bytes(zstd_frame([("raw", plain), ("zeros", 16 << 30)]))
    rc, stderr, rss, wall = replay_measured(path, timeout=60)
    assert_refused(rc, stderr, "after the end of the tar archive")
    assert wall < 20 and rss < FIXED_RSS, (wall, rss)


def test_a_bundle_of_too_many_members_is_refused_from_its_manifest(tmp_path):
    empty = [(f"host/m{i}", b"") for i in range(CAPS.members + 5)]
    path = tmp_path / "many.tar.gz"
    path.write_bytes(gzip.compress(tar_bytes(base_members() + empty), compresslevel=1))
    rc, stderr, rss, wall = replay_measured(path, timeout=60)
    assert_refused(rc, stderr, "member-count cap of 20,000")
    assert wall < 20


# --- 2. memory ----------------------------------------------------------------------------------
def test_a_small_bundle_of_48_mib_of_empty_objects_is_refused_in_bounded_memory(tmp_path):
    facts = b"[" + b"{}," * (16 * MiB) + b"{}]"  # 48 MiB: sixteen million dicts if parsed
    members = [("facts.json", facts)] + base_members()[1:]
    path = write_bundle(tmp_path / "objects.tar.zst", members)
    assert path.stat().st_size < 64_000
    rc, stderr, rss, wall = replay_measured(path, timeout=120)
    assert_refused(rc, stderr, "facts.json", "JSON items cap of 500,000")
    assert rss <= 2 * len(facts) + FIXED_RSS, rss


@pytest.mark.parametrize("shape", ["small-dicts", "one-long-string"])
def test_an_accepted_bundle_stays_within_twice_its_largest_member(tmp_path, shape):
    """The costliest shapes the caps let through: the most dicts of short strings under
    the items cap, and one 48 MiB string (few items, many bytes)."""
    if shape == "small-dicts":
        data = {"v": [{"ab": "cd", "ef": "gh"}] * 160_000}
    else:
        data = {"blob": "A" * (48 * MiB)}
    facts = [{"kind": "attack_probe", "subject": {"path": "/x"}, "data": data, "source": "test"}]
    members = base_members(facts)
    path = write_bundle(tmp_path / f"{shape}.tar.zst", members)
    rc, stderr, rss, wall = replay_measured(path, timeout=120)
    assert rc == 0, stderr[-2000:]
    largest = max(len(data) for _name, data in members)
    print(f"\n{shape}: largest member {largest:,} bytes, peak RSS {rss:,} bytes, {wall:.2f} s")
    assert rss <= 2 * largest + FIXED_RSS, (rss, largest)


# --- 3. integrity -------------------------------------------------------------------------------
@pytest.fixture
def good(tmp_path) -> dict:
    facts = [{"kind": "needed_unresolved", "subject": {"path": "/opt/app", "needed": "libgone.so"},
              "data": {"searched": ["/opt"]}, "source": "test"}]
    return {suffix: write_bundle(tmp_path / f"good{suffix}", base_members(facts))
            for suffix in (".tar.zst", ".tar.gz")}


@pytest.mark.parametrize("suffix", [".tar.zst", ".tar.gz"])
def test_a_bundle_cut_short_by_one_byte_is_refused(tmp_path, good, suffix):
    whole = good[suffix]
    rc, stderr, _rss, _wall = replay_measured(whole)
    assert rc in (0, 1), stderr
    cut = tmp_path / f"cut{suffix}"
    cut.write_bytes(whole.read_bytes()[:-1])
    assert_refused(*replay_measured(cut)[:2], "cut short")


def _recompressed(tmp_path: Path, suffix: str, plain: bytes) -> Path:
    """A tar put back through the codec with a fresh checksum: only the manifest can tell."""
    path = tmp_path / f"forged{suffix}"
    if suffix == ".tar.zst":
        path.write_bytes(zstandard.ZstdCompressor(write_checksum=True).compress(plain))
    else:
        path.write_bytes(gzip.compress(plain))
    return path


@pytest.mark.parametrize("suffix", [".tar.zst", ".tar.gz"])
def test_one_flipped_bit_in_facts_is_refused_though_the_codec_checksum_holds(tmp_path, good, suffix):
    plain = bytearray(tar_bytes(base_members(
        [{"kind": "needed_unresolved", "subject": {"path": "/opt/app", "needed": "libgone.so"},
          "data": {"searched": ["/opt"]}, "source": "test"}])))
    at = plain.index(b"needed_unresolved")
    plain[at] ^= 0x01  # "oeeded_unresolved": still JSON, a kind no rule knows: 0 findings
    rc, stderr, _rss, _wall = replay_measured(_recompressed(tmp_path, suffix, bytes(plain)))
    assert_refused(rc, stderr, "facts.json", "sha256")


def _members_of(path: Path) -> list:
    with tarfile.open(fileobj=io.BytesIO(_raw_bundle(path))) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar]


@pytest.mark.parametrize("change,words", [
    ("unlisted", ("host/extra.txt", "not listed")),
    ("missing", ("runtime.json", "missing")),
    ("manifest-not-first", ("first member",)),
    ("trailing-garbage", ("damaged",)),
    ("a-directory", ("not a file",)),
])
def test_members_the_manifest_does_not_vouch_for_are_refused(tmp_path, good, change, words):
    held = _members_of(good[".tar.zst"])
    if change == "unlisted":
        held.append(("host/extra.txt", b"hello"))
    elif change == "missing":
        held = [(n, d) for n, d in held if n != "runtime.json"]
    elif change == "manifest-not-first":
        held = held[1:] + held[:1]
    if change == "trailing-garbage":
        path = tmp_path / "g.tar.zst"
        path.write_bytes(good[".tar.zst"].read_bytes() + b"\x00junk")
    elif change == "a-directory":
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for name, data in held:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            info = tarfile.TarInfo("host/dir")
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        path = _recompressed(tmp_path, ".tar.zst", buffer.getvalue())
    else:
        path = _recompressed(tmp_path, ".tar.zst", tar_bytes(held, with_manifest=False))
    assert_refused(*replay_measured(path)[:2], *words)


# --- 6. every cap at its edge (in process, smaller caps) -----------------------------------------
def _read(path: Path, **caps):
    return bundle.read_bundle(str(path), dataclasses.replace(CAPS, **caps))


def _refused(path: Path, cap_words: str, **caps) -> None:
    with pytest.raises(BadInput) as raised:
        _read(path, **caps)
    assert cap_words in str(raised.value) and "\n" not in str(raised.value), str(raised.value)


@pytest.fixture
def edge(tmp_path):
    """A bundle whose sizes and counts the test knows: a long member name (so a pax header),
    nested facts (depth 6: the list, a fact, its data and three dicts in it)."""
    facts = [{"kind": "k", "subject": {}, "data": {"a": {"b": {"c": {"d": 1}}}}, "source": ""}]
    members = base_members(facts) + [("host/" + "n" * 120, b"x" * 3000)]
    path = write_bundle(tmp_path / "edge.tar.zst", members)
    plain = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(path.read_bytes()),
                                                       read_across_frames=True).read()
    held = dict(_members_of(path))
    return {"path": path, "plain": plain, "held": held}


def test_member_size_cap_edge(edge):
    largest = max(len(d) for d in edge["held"].values())
    _read(edge["path"], member_bytes=largest)
    _refused(edge["path"], "member-size cap", member_bytes=largest - 1)


def test_json_member_size_cap_edge(edge):
    largest = max(len(d) for n, d in edge["held"].items() if n in NEEDED)
    _read(edge["path"], json_bytes=largest)
    _refused(edge["path"], "JSON member-size cap", json_bytes=largest - 1)


def test_total_size_cap_edge(edge):
    total = len(edge["plain"])  # every decompressed byte: headers, data, padding
    _read(edge["path"], total_bytes=total)
    _refused(edge["path"], "total-size cap", total_bytes=total - 1)


def test_member_count_cap_edge(edge):
    with tarfile.open(fileobj=io.BytesIO(edge["plain"])) as tar:
        files = len(tar.getmembers())
    entries = files + 1  # the long name's pax header is an entry of its own
    _read(edge["path"], members=entries)
    _refused(edge["path"], "member-count cap", members=entries - 1)


def test_json_items_cap_edge(edge):
    # the documented count: commas and opening brackets, plus one, over the four members
    items = sum(d.count(b",") + d.count(b"[") + d.count(b"{") + 1
                for n, d in edge["held"].items() if n in NEEDED)
    _read(edge["path"], json_items=items)
    _refused(edge["path"], "JSON items cap", json_items=items - 1)


def test_json_depth_cap_edge(edge):
    _read(edge["path"], json_depth=6)
    _refused(edge["path"], "JSON depth cap", json_depth=5)


def test_header_size_cap_edge(edge):
    size = int(re.search(rb"(\d+) path=", edge["plain"]).group(1))  # the one pax record
    _read(edge["path"], header_bytes=size)
    _refused(edge["path"], "header-size cap", header_bytes=size - 1)


def test_time_cap_edge(edge):
    """A clock that moves one second per look: the read needs `ticks` looks."""
    def counting():
        counting.now += 1
        return counting.now
    counting.now = 0
    bundle.read_bundle(str(edge["path"]), CAPS, clock=counting)
    ticks = counting.now - 1  # seconds between the start and the last look
    counting.now = 0
    bundle.read_bundle(str(edge["path"]), dataclasses.replace(CAPS, seconds=ticks), clock=counting)
    counting.now = 0
    with pytest.raises(BadInput, match="time cap"):
        bundle.read_bundle(str(edge["path"]), dataclasses.replace(CAPS, seconds=ticks - 1), clock=counting)


def test_the_defaults_are_the_documented_caps():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "bundle.md").read_text()
    assert CAPS == Caps(member_bytes=512 * MiB, json_bytes=64 * MiB, total_bytes=4 << 30, members=20_000,
                        seconds=60, json_items=500_000, json_depth=32, header_bytes=64 << 10,
                        zstd_window=8 * MiB)
    for text in ("512 MiB", "64 MiB", "4 GiB", "20,000", "60 s", "500,000", "32 levels", "64 KiB", "8 MiB"):
        assert text in docs, text


# --- 4. redaction: secrets planted where --bundle captures them -----------------------------------
def _secrets() -> dict:
    tag = os.urandom(6).hex()
    return {
        "empty_user_url": f"pwEmptyUser{tag}",
        "gh_pat": "ghp_" + (tag * 6)[:36],
        "github_pat": "github_pat_11A" + (tag * 5)[:40],
        "aws_id": "AKIA" + tag.upper()[:12] + "QXZW",
        "aws_secret": ("wJalrXUtnFEMI/K7MDENG/" + tag + "abcdefghijklmnop")[:40],
        "slack": "xoxb-123456789012-" + tag,
        "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI" + tag + "In0.sig" + tag,
        "pem_body": "MIIEow" + tag + "PEMBODYLINE",
        "bearer": "bearer" + tag + "tokenvalue",
        "list_pw": f"listpw{tag}",
        "flow_pw": f"flowpw{tag}",
        "block_1": f"blockone{tag}",
        "block_2": f"blocktwo{tag}",
        "nested": f"nested{tag}",
    }


def _pem(secret: str) -> str:
    return f"-----BEGIN RSA PRIVATE KEY-----\n{secret}\nAAAABBBBCCCC==\n-----END RSA PRIVATE KEY-----\n"


def _raw_bundle(path: Path) -> bytes:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        return gzip.decompress(raw)
    return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw), read_across_frames=True).read()


def _assert_absent(raw: bytes, secrets: dict) -> None:
    for label, secret in secrets.items():
        for form in {secret, secret[:16], json.dumps(secret)[1:-1]}:
            assert form.encode() not in raw, (label, form)


def test_secrets_in_a_process_environment_never_reach_the_bundle(tmp_path):
    secrets = _secrets()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "LD_LIBRARY_PATH": "/opt/plain/lib:/usr/local/cuda/lib64", "PLAIN": "kept-value",
           "REDIS_URL": f"redis://:{secrets['empty_user_url']}@cache.internal:6379/0",
           "GH_PAT": secrets["gh_pat"], "NOTES": f"see {secrets['github_pat']}",
           "AWS_ID": secrets["aws_id"], "DEPLOY_ARGS": f"--aws-secret-access-key {secrets['aws_secret']}",
           "HOOK": secrets["slack"], "SESSION_BLOB": secrets["jwt"], "TLS_MATERIAL": _pem(secrets["pem_body"]),
           "CURL_HEADER": f"Authorization: Bearer {secrets['bearer']}"}
    child = subprocess.Popen(["sleep", "60"], env=env)
    try:
        path = tmp_path / "env.tar.zst"
        proc = subprocess.run(seedance_cmd("check", "--no-progress", "--pid", child.pid, "--bundle", path),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode in (0, 1), proc.stderr
    finally:
        child.kill()
        child.wait()
    raw = _raw_bundle(path)
    _assert_absent(raw, {k: v for k, v in secrets.items() if k in (
        "empty_user_url", "gh_pat", "github_pat", "aws_id", "aws_secret", "slack", "jwt", "pem_body", "bearer")})
    environ = json.loads(dict(_members_of(path))[f"processes/{child.pid}/environ.json"])
    # what is no secret survives: the evidence is still evidence
    assert environ["LD_LIBRARY_PATH"] == "/opt/plain/lib:/usr/local/cuda/lib64"
    assert environ["PLAIN"] == "kept-value" and environ["PATH"] == env["PATH"]
    assert environ["REDIS_URL"] == "redis://:<redacted>@cache.internal:6379/0"
    assert environ["GH_PAT"] == "<redacted>"
    assert environ["CURL_HEADER"] == "Authorization: Bearer <redacted>"
    assert bundle.read_bundle(str(path)).manifest["schema"] == SCHEMA  # and it still replays


def test_secrets_in_a_captured_config_never_reach_the_bundle(tmp_path):
    secrets = _secrets()
    config = tmp_path / "seedance" / "agent.yaml"
    config.parent.mkdir()
    config.write_text(
        "env:\n"
        "  LD_LIBRARY_PATH: /opt/plain/lib\n"
        f"  GH_PAT: {secrets['gh_pat']}\n"
        f"  CACHE: redis://:{secrets['empty_user_url']}@cache.internal:6379\n"
        "users:\n"
        "  - name: deploy\n"
        f"  - password: {secrets['list_pw']}\n"
        f"db: {{host: db.internal, password: {secrets['flow_pw']}}}\n"
        "signing:\n"
        "  password: |\n"
        f"    {secrets['block_1']}\n"
        f"    {secrets['block_2']}\n"
        "  algorithm: ed25519\n"
        "credentials:\n"
        f"  deep: {{inner: {secrets['nested']}}}\n"
        f"note: github {secrets['github_pat']} aws {secrets['aws_id']}\n"
        f"aws_secret_access_key: {secrets['aws_secret']}\n"
        f"slack: {secrets['slack']}\n"
        f"session: {secrets['jwt']}\n"
        f"header: 'Authorization: Bearer {secrets['bearer']}'\n"
        "tls: |\n" + "".join(f"  {line}\n" for line in _pem(secrets["pem_body"]).splitlines()))
    path = tmp_path / "cfg.tar.gz"
    proc = subprocess.run(seedance_cmd("check", "--no-progress", tmp_path, "--bundle", path),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    raw = _raw_bundle(path)
    held = dict(_members_of(path))
    assert "configs" + str(config) in held  # the config was captured: the test looks where it lies
    _assert_absent(raw, secrets)
    text = held["configs" + str(config)].decode()
    for kept in ("LD_LIBRARY_PATH: /opt/plain/lib", "- name: deploy", "host: db.internal", "algorithm: ed25519"):
        assert kept in text, kept
