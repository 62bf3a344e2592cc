"""Fuzz runs of the bundle reader (check --from-bundle), in the house style of
test_fuzz_yaml_archive.py.

Hypothesis feeds replay three kinds of input, each reaching a different layer:
  file      the compressed file mutated (bits flipped, cut, bytes inserted or dropped,
            garbage): the codec's framing and checksums must refuse it;
  tar       the plain tar mutated and compressed again with a fresh checksum: the tar reader
            and the manifest's sizes and sha256 must refuse it;
  forged    a consistent bundle (manifest and sha256 right) around random JSON for the facts,
            report and runtime: the JSON caps and replay's shape checks must hold.
For every input the test counts hangs (past PER_INPUT_S) and tracebacks (anything raised but
the one-line BadInput); both must stay 0.  A sample then runs through the real CLI, whose
peak RSS is measured: exit 0, 1 or 2, and 2 is one line.  `pytest -s` prints the counts
and the peak RSS; with SEEDANCE_FUZZ_RESULTS=FILE they are appended to FILE as a JSON line
(bench/ keeps figures beside what reproduces them).
"""
from __future__ import annotations

import gzip
import io
import json
import os
import signal
import tarfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seedance.collect import bundle
from seedance.model.errors import BadInput
from tests.security.test_bundle_attacks import FIXED_RSS, assert_refused, base_members, replay_measured, \
    tar_bytes, write_bundle

PER_INPUT_S = 30
EXAMPLES = int(os.environ.get("SEEDANCE_FUZZ_BUNDLE", "300"))
CLI_SAMPLE = int(os.environ.get("SEEDANCE_FUZZ_BUNDLE_CLI", "12"))
FUZZ = settings(deadline=None, database=None, derandomize=False, print_blob=True, max_examples=EXAMPLES,
                suppress_health_check=list(HealthCheck))

FACTS = [{"kind": "needed_unresolved", "subject": {"path": "/opt/app", "needed": "libgone.so"},
          "data": {"searched": ["/opt"]}, "source": "test"},
         {"kind": "fatbin", "subject": {"path": "/opt/libk.so"}, "data": {"archs": ["sm_86"]}, "source": "test"}]
RUNTIME = {"gpu": {"driver_version": "550.1", "target_tuples": [["sm", 8, 6, "sm_86"]]},
           "closures": [{"root": "/opt/app", "runtimes": {"/opt/libcudart.so.12": [12, "/opt/app"]}}],
           "fatbins": {"entries": {}, "sha256": {}}, "static_runtimes": {}, "compat": None}


class Hang(Exception):
    pass


@contextmanager
def _alarm(seconds: int):
    def ring(_sig, _frame):
        raise Hang()
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


COUNTS: dict = {}
SAMPLE: list = []  # (kind, bytes) kept for the CLI runs


def _members(facts=FACTS, runtime=RUNTIME, report=None) -> list:
    members = base_members(facts)
    members[2] = ("runtime.json", json.dumps(runtime).encode())
    if report is not None:
        members[1] = ("report.json", json.dumps(report).encode())
    return members


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """The good bundles mutated from: one zstd, one gzip, as the writer packs them."""
    where = tmp_path_factory.mktemp("corpus")
    out = {}
    for suffix in (".tar.zst", ".tar.gz"):
        path = write_bundle(where / f"good{suffix}", _members())
        out[suffix] = path.read_bytes()
    out["tar"] = tar_bytes(_members())
    return out


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    for kind, counts in sorted(COUNTS.items()):
        print(f"\nfuzz bundle {kind}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


def _count(kind: str, key: str) -> None:
    COUNTS.setdefault(kind, {"inputs": 0, "read": 0, "refused": 0, "hangs": 0, "tracebacks": 0})
    COUNTS[kind][key] += 1


def _replay(kind: str, data: bytes, suffix: str, tmp: Path, rederive: bool) -> None:
    path = tmp / f"fuzz{suffix}"
    path.write_bytes(data)
    _count(kind, "inputs")
    try:
        with _alarm(PER_INPUT_S):
            if rederive:
                bundle.replay(str(path), arch="sm_90", driver_version="470.82.01")
            else:
                bundle.replay(str(path))
        _count(kind, "read")
    except BadInput as exc:
        assert "\n" not in str(exc)
        _count(kind, "refused")
    except Hang:
        _count(kind, "hangs")
    except Exception:  # noqa: BLE001 -- a traceback a user would have seen
        _count(kind, "tracebacks")
        raise
    if len(SAMPLE) < CLI_SAMPLE * 4:
        SAMPLE.append((kind, suffix, data))


MUTATIONS = st.lists(st.tuples(st.sampled_from(["flip", "cut", "insert", "drop", "zero"]),
                               st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=4)


def _mutate(data: bytes, mutations) -> bytes:
    out = bytearray(data)
    for op, where, value in mutations:
        at = int(where * len(out)) if out else 0
        if op == "flip" and out:
            out[at] ^= 1 << (value % 8)
        elif op == "cut":
            del out[at:]
        elif op == "insert":
            out[at:at] = bytes([value]) * (1 + value % 7)
        elif op == "drop" and out:
            del out[at:at + 1 + value % 7]
        elif op == "zero" and out:
            out[at:at + 512] = bytes(len(out[at:at + 512]))
    return bytes(out)


@FUZZ
@given(suffix=st.sampled_from([".tar.zst", ".tar.gz"]), mutations=MUTATIONS, rederive=st.booleans(),
       garbage=st.one_of(st.none(), st.binary(max_size=2048)))
def test_a_mutated_file_is_refused_or_read(corpus, tmp_path_factory, suffix, mutations, rederive, garbage):
    data = garbage if garbage is not None else _mutate(corpus[suffix], mutations)
    _replay("file", data, suffix, tmp_path_factory.getbasetemp(), rederive)


@FUZZ
@given(suffix=st.sampled_from([".tar.zst", ".tar.gz"]), mutations=MUTATIONS, rederive=st.booleans())
def test_a_mutated_tar_is_refused_or_read(corpus, tmp_path_factory, suffix, mutations, rederive):
    plain = _mutate(corpus["tar"], mutations)
    data = zstandard.ZstdCompressor(write_checksum=True).compress(plain) if suffix == ".tar.zst" \
        else gzip.compress(plain)
    _replay("tar", data, suffix, tmp_path_factory.getbasetemp(), rederive)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
                    max_leaves=30)
FACT = st.fixed_dictionaries({"kind": st.sampled_from(["needed_unresolved", "fatbin", "cuda_driver", "x"]) | JSON,
                              "subject": st.dictionaries(st.sampled_from(["path", "pid", "needed"]), JSON) | JSON,
                              "data": st.dictionaries(st.text(max_size=8), JSON) | JSON})
RUNTIMES = st.fixed_dictionaries({"gpu": st.dictionaries(st.sampled_from(
    ["driver_version", "target_tuples", "devices", "nvml"]), JSON) | JSON,
    "closures": st.lists(st.dictionaries(st.sampled_from(["root", "runtimes"]), JSON)) | JSON,
    "fatbins": st.dictionaries(st.sampled_from(["entries", "sha256"]), JSON) | JSON,
    "static_runtimes": st.dictionaries(st.text(max_size=8), st.dictionaries(
        st.sampled_from(["major", "marker"]), JSON)) | JSON})


@FUZZ
@given(facts=st.lists(FACT, max_size=6) | JSON, runtime=RUNTIMES | JSON, report=JSON, rederive=st.booleans())
def test_a_forged_consistent_bundle_is_refused_or_read(tmp_path_factory, facts, runtime, report, rederive):
    path = tmp_path_factory.getbasetemp() / "forged.tar.zst"
    write_bundle(path, _members(facts, runtime, report))
    _replay("forged", path.read_bytes(), ".tar.zst", tmp_path_factory.getbasetemp(), rederive)


def test_no_hangs_or_tracebacks_and_the_cli_sample_is_one_line(tmp_path):
    """Runs last in this file: the counts of the runs above, then a sample through the CLI."""
    if not COUNTS:
        pytest.skip("run with the fuzz tests above")
    for kind, counts in COUNTS.items():
        assert counts["hangs"] == 0 and counts["tracebacks"] == 0, (kind, counts)
    peaks = []
    picked = SAMPLE[::max(1, len(SAMPLE) // CLI_SAMPLE)][:CLI_SAMPLE]
    for index, (kind, suffix, data) in enumerate(picked):
        path = tmp_path / f"s{index}{suffix}"
        path.write_bytes(data)
        rc, stderr, rss, wall = replay_measured(path, timeout=120)
        assert rc in (0, 1, 2) and "Traceback" not in stderr, (kind, rc, stderr[-2000:])
        if rc == 2:
            assert_refused(rc, stderr)
        assert rss <= FIXED_RSS, rss  # bundles of a few KB: twice their largest member is nothing beside it
        peaks.append(rss)
    figures = {"fuzz_bundle": COUNTS, "cli_runs": len(peaks), "cli_peak_rss_bytes": max(peaks, default=0)}
    print(f"\nfuzz bundle CLI sample: {len(peaks)} runs, peak RSS {max(peaks, default=0):,} bytes")
    results = os.environ.get("SEEDANCE_FUZZ_RESULTS")
    if results:
        with open(results, "a") as handle:
            handle.write(json.dumps(figures) + "\n")
