"""`seedance pareto RESULTS.csv` on the CSVs people and spreadsheets really write, and on
hostile ones: a byte-order mark, escape sequences and quoted newlines in names, files far
larger than a bench writes, and every cap at its edge."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from seedance.model.errors import BadInput
from seedance.profile import pareto

SEEDANCE = str(Path(sys.executable).parent / "seedance")
TABLE = "name,latency_ms,accuracy\nFP16,14.2,72.1\nW8A16,9.8,71.6\nINT8,7.1,69.3\nFP32,20.5,72.0\n"


def run(*args, timeout=300):
    proc = subprocess.run([SEEDANCE, "pareto", *map(str, args)], capture_output=True, timeout=timeout)
    stderr = proc.stderr.decode("utf-8", "replace")
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    return proc


def one_line_error(proc, needle: str) -> str:
    lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-300:], lines)
    assert len(lines) == 1 and lines[0].startswith("seedance: error:") and needle in lines[0], lines
    return lines[0]


def test_a_byte_order_mark_before_the_header_is_accepted(tmp_path):
    # what Excel's "CSV UTF-8" and LibreOffice write
    path = tmp_path / "results.csv"
    path.write_bytes(b"\xef\xbb\xbf" + TABLE.encode())
    proc = run(path, "--json")
    assert proc.returncode == 0, proc.stderr
    section = json.loads(proc.stdout)["profile"]["pareto"]
    assert [p["name"] for p in section["frontier"]] == ["INT8", "W8A16", "FP16"]
    assert run(path).returncode == 0
    assert [v.name for v in pareto.read_csv("\ufeff" + TABLE)][:1] == ["FP16"]


def test_escape_sequences_and_quoted_newlines_in_names_are_escaped_in_the_table(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text('name,latency_ms,accuracy\n'
                    '"\x1b[2J\x1b[31mred",7.1,69.3\n'
                    '"two\nforged-row 1 2 3",9.8,71.6\n'
                    '"bell\x07\x9b",20.5,60\n', newline="")
    proc = run(path, "--baseline-accuracy", "65")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode("utf-8", "surrogateescape")
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out
    assert "\\x1b[2J\\x1b[31mred" in out and "two\\nforged-row 1 2 3" in out and "bell\\x07\\x9b" in out
    assert not any(line.startswith("forged-row") for line in out.splitlines())
    # the JSON keeps the names as they are (json escapes the control characters)
    report = run(path, "--baseline-accuracy", "65", "--json")
    assert b"\x1b" not in report.stdout
    section = json.loads(report.stdout)["profile"]["pareto"]
    assert {p["name"] for p in section["frontier"]} == {"\x1b[2J\x1b[31mred", "two\nforged-row 1 2 3"}
    assert section["dominated"] == [{"name": "bell\x07\x9b", "dominated_by": "two\nforged-row 1 2 3"}]


def write_results(path: Path, size: int) -> int:
    """Random variants (most of them dominated, as a sweep's are) until SIZE bytes."""
    rnd = random.Random(7)
    rows = 0
    with open(path, "w") as handle:
        written = handle.write("name,latency_ms,accuracy,cost_per_ms\n")
        while written < size:
            written += handle.write(f"variant-{rows},{rnd.uniform(1, 100):.4f},{rnd.uniform(50, 90):.4f},1\n")
            rows += 1
    return rows


def peak_rss_kib(*args) -> int:
    """Peak RSS of one `seedance pareto` run, measured by a parent of its own (RUSAGE_CHILDREN
    is the largest child a process has waited for, so each run gets a fresh parent)."""
    probe = ("import resource, subprocess, sys\n"
             "done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
             "assert done.returncode == 0, done.stderr\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    done = subprocess.run([sys.executable, "-c", probe, SEEDANCE, "pareto", *map(str, args)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def test_peak_memory_does_not_grow_with_the_rows(tmp_path):
    small, large = tmp_path / "small.csv", tmp_path / "large.csv"
    small_rows = write_results(small, 3 << 20)
    large_rows = write_results(large, 30 << 20)
    assert large_rows > 9 * small_rows
    small_kib = peak_rss_kib(small, "--json")
    large_kib = peak_rss_kib(large, "--json")
    # ten times the rows, the same memory give or take the allocator (the whole file in
    # rows and dicts was ~17 times its size)
    assert large_kib < small_kib + 16 * 1024, (small_kib, large_kib)


def test_a_cell_of_the_longest_length_is_accepted_and_one_more_refused(tmp_path):
    path = tmp_path / "results.csv"
    name = "n" * pareto.MAX_FIELD_CHARS
    path.write_text(f"name,latency_ms,accuracy\n{name},1,2\n")
    proc = run(path, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["profile"]["pareto"]["frontier"][0]["name"] == name
    path.write_text(f"name,latency_ms,accuracy\n{name}n,1,2\n")
    one_line_error(run(path), f"row 2, column 'name': longer than {pareto.MAX_FIELD_CHARS} characters")


def test_a_row_longer_than_the_cap_is_refused(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text("name,latency_ms,accuracy\n" + "a," * (pareto.MAX_RECORD_CHARS // 2) + "\n")
    one_line_error(run(path), f"row 2: longer than {pareto.MAX_RECORD_CHARS} characters")
    # a quoted newline does not start a new row: the row is still too long
    path.write_text('name,latency_ms,accuracy\n"' + "x\n" * (pareto.MAX_RECORD_CHARS // 2) + '",1,2\n')
    one_line_error(run(path), f"row 2: longer than {pareto.MAX_RECORD_CHARS} characters")


def test_the_row_and_byte_caps_at_their_edges(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text(TABLE)
    size = path.stat().st_size
    assert pareto.analyse_file(str(path), max_rows=4, max_bytes=size).variants == 4
    with pytest.raises(BadInput, match="more than 3 rows"):
        pareto.analyse_file(str(path), max_rows=3)
    with pytest.raises(BadInput, match=f"more than the {size - 1} "):
        pareto.analyse_file(str(path), max_bytes=size - 1)


def test_a_file_over_the_byte_cap_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "results.csv"
    with open(path, "wb") as handle:
        handle.write(TABLE.encode())
        handle.truncate(pareto.MAX_CSV_BYTES + 1)  # sparse: takes no disk
    one_line_error(run(path, timeout=60), f"more than the {pareto.MAX_CSV_BYTES} a results CSV may have")


def test_the_frontier_cap_at_its_edge(tmp_path):
    # every row faster and less accurate than the next: all of them on the frontier
    path = tmp_path / "results.csv"
    rows = "".join(f"v{i},{i + 1},{i}\n" for i in range(pareto.MAX_FRONTIER))
    path.write_text("name,latency_ms,accuracy\n" + rows)
    proc = run(path, "--json")
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["profile"]["pareto"]["frontier"]) == pareto.MAX_FRONTIER
    path.write_text("name,latency_ms,accuracy\n" + rows + f"last,{pareto.MAX_FRONTIER + 1},{pareto.MAX_FRONTIER}\n")
    one_line_error(run(path), f"more than {pareto.MAX_FRONTIER} variants on the frontier")


def test_dominated_variants_past_the_listing_are_counted(tmp_path):
    path = tmp_path / "results.csv"
    extra = pareto.MAX_DOMINATED_LISTED + 5
    path.write_text("name,latency_ms,accuracy\nbest,1,99\n" + "".join(f"d{i},{i + 2},50\n" for i in range(extra)))
    section = json.loads(run(path, "--json").stdout)["profile"]["pareto"]
    assert len(section["dominated"]) == pareto.MAX_DOMINATED_LISTED and section["dominated_total"] == extra
    out = run(path).stdout.decode()
    assert "dominated: 5 more, not listed" in out
