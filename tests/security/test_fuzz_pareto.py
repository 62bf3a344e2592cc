"""Fuzz runs of the results-CSV reader of `seedance pareto`.

Hypothesis mutates a valid results table (bytes flipped, inserted and cut, hostile cells:
NaN, infinities, huge numbers, quotes left open, NULs, escape sequences, byte-order marks)
and each goes through what the command runs: analyse_file() on the bytes on disk, then the
table renderer.  For every input the test counts
  tracebacks anything raised that is not the one-line BadInput (the CLI's exit 2),
  lines      a BadInput whose message holds a line break,
  raw        an escape or other control byte that reaches the rendered table,
each must stay 0, and the process's peak RSS must stay under RSS_GROWTH_KB above where the
run began.  `pytest -s` prints the counts and the peak RSS.
"""
from __future__ import annotations

import os

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seedance.model.errors import BadInput
from seedance.profile import pareto
from tests.security.conftest import peak_rss_kib, reset_peak_rss

EXAMPLES = int(os.environ.get("SEEDANCE_FUZZ_CSV", "300"))
RSS_GROWTH_KB = 200 * 1024
FUZZ = settings(deadline=None, database=None, print_blob=True, suppress_health_check=list(HealthCheck),
                max_examples=EXAMPLES)
TABLE = ("name,latency_ms,accuracy,cost_per_ms\n"
         "FP16,14.2,72.1,0.002\nW8A16,9.8,71.6,0.002\nINT8,7.1,69.3,0.001\nFP32,20.5,72.0,0.004\n").encode()
HOSTILE_CELLS = [b"nan", b"inf", b"-inf", b"1e308", b"1e309", b"-0", b'"open', b"\x00", b"\x1b[31mred",
                 b"\xef\xbb\xbf", b"\r", b'"a\nb"', b"9" * 400, b"", b",,,,", b"\xff\xfe"]
COUNTS = {"inputs": 0, "refused": 0, "read": 0, "tracebacks": 0, "lines": 0, "raw": 0}
START_RSS_KB = [0]  # this process's RSS when the fuzz run begins (reset_peak_rss)


@pytest.fixture(scope="module", autouse=True)
def _peak_from_here():
    # the peak counts from here, not from whatever test of the suite ran before
    START_RSS_KB[0] = reset_peak_rss()
    yield


def _mutate(data: bytes, edits: list) -> bytes:
    buffer = bytearray(data)
    for kind, position, value in edits:
        at = position % (len(buffer) + 1)
        if kind == "flip" and buffer:
            buffer[at % len(buffer)] ^= 1 << (value % 8)
        elif kind == "cut":
            del buffer[at:at + value % 16]
        else:
            buffer[at:at] = HOSTILE_CELLS[value % len(HOSTILE_CELLS)]
    return bytes(buffer)


def _rendered(result) -> str:
    """What `seedance pareto` prints for RESULT (its text renderer, stdout captured)."""
    import contextlib
    import io

    from seedance.commands import pareto as command

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        command._render(result)
    return out.getvalue()


EDITS = st.lists(st.tuples(st.sampled_from(["flip", "cut", "insert"]), st.integers(0, 10_000),
                           st.integers(0, 255)), max_size=8)


@FUZZ
@given(edits=EDITS)
def test_mutated_results_tables_are_read_or_refused_in_one_line(tmp_path_factory, edits):
    path = tmp_path_factory.mktemp("csv") / "results.csv"
    path.write_bytes(_mutate(TABLE, edits))
    COUNTS["inputs"] += 1
    try:
        result = pareto.analyse_file(str(path), baseline_accuracy=65.0)
    except BadInput as exc:
        COUNTS["refused"] += 1
        if "\n" in str(exc):
            COUNTS["lines"] += 1
        assert "\n" not in str(exc), str(exc)
        return
    except Exception as exc:  # noqa: BLE001 - the count is the point
        COUNTS["tracebacks"] += 1
        raise AssertionError(f"traceback: {exc!r}") from exc
    COUNTS["read"] += 1
    text = _rendered(result)
    raw = [ch for ch in text if (ord(ch) < 32 and ch not in "\n\t") or ord(ch) == 0x7f]
    if raw:
        COUNTS["raw"] += 1
    assert not raw, text[-500:]


def test_the_fuzz_run_stayed_in_bounded_memory():
    peak = peak_rss_kib()
    print(f"\ncsv fuzz: {COUNTS}, peak RSS {peak // 1024} MiB (start {START_RSS_KB[0] // 1024} MiB)")
    assert COUNTS["tracebacks"] == 0 and COUNTS["lines"] == 0 and COUNTS["raw"] == 0
    assert peak - START_RSS_KB[0] < RSS_GROWTH_KB
