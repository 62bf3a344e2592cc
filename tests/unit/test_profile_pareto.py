"""Pareto frontier: the notes' table (2.5) with answers worked out by hand, and bad CSVs."""
import json
import subprocess
import sys

import pytest

from seedance.model.errors import BadInput
from seedance.profile import pareto

NOTES_TABLE = "name,latency_ms,accuracy\nFP16,14.2,72.1\nW8A16,9.8,71.6\nINT8,7.1,69.3\n"
# FP32 is slower than FP16 and less accurate: dominated by FP16.
WITH_DOMINATED = NOTES_TABLE + "FP32,20.5,72.0\n"


def test_frontier_is_exactly_the_three_of_the_notes():
    result = pareto.analyse(pareto.read_csv(WITH_DOMINATED), baseline_accuracy=65.0)
    assert [p.variant.name for p in result.frontier] == ["INT8", "W8A16", "FP16"]
    assert result.dominated == {"FP32": "FP16"}


def test_roi_and_decay_by_hand():
    # By hand, baseline 65, cost 1 per ms:
    #   ROI(INT8)  = (69.3-65)/7.1  = 4.3/7.1  = 0.605634
    #   ROI(W8A16) = (71.6-65)/9.8  = 6.6/9.8  = 0.673469
    #   ROI(FP16)  = (72.1-65)/14.2 = 7.1/14.2 = 0.5
    #   slope INT8->W8A16  = (0.673469-0.605634)/2.7 = +0.025124
    #   slope W8A16->FP16  = (0.5-0.673469)/4.4     = -0.039425  < -0.035: decay at W8A16
    result = pareto.analyse(pareto.read_csv(WITH_DOMINATED), baseline_accuracy=65.0)
    rois = {p.variant.name: p.roi for p in result.frontier}
    assert rois["INT8"] == pytest.approx(0.605634, abs=1e-6)
    assert rois["W8A16"] == pytest.approx(0.673469, abs=1e-6)
    assert rois["FP16"] == pytest.approx(0.5, abs=1e-9)
    slopes = [p.slope_to_next for p in result.frontier]
    assert slopes[0] == pytest.approx(0.025124, abs=1e-6)
    assert slopes[1] == pytest.approx(-0.039425, abs=1e-6)
    assert slopes[2] is None
    assert result.decay_point == "W8A16"


def test_no_decay_when_roi_falls_slowly():
    # baseline 60, cost 1: ROI 1.309859, 1.183673, 0.852113; slopes -0.046735 then -0.075355.
    # Both fall faster than -0.035, so the decay point is the first frontier point.
    result = pareto.analyse(pareto.read_csv(NOTES_TABLE), baseline_accuracy=60.0)
    assert result.decay_point == "INT8"
    # a cost of 10 per ms divides every ROI and slope by 10: -0.0046735 > -0.035, no decay
    costly = pareto.read_csv(NOTES_TABLE, default_cost_per_ms=10.0)
    assert pareto.analyse(costly, baseline_accuracy=60.0).decay_point is None


def test_per_row_cost_column():
    rows = pareto.read_csv("name,latency_ms,accuracy,cost_per_ms\nA,10,80,2\nB,5,70,\n", default_cost_per_ms=4.0)
    assert [(v.name, v.cost_per_ms) for v in rows] == [("A", 2.0), ("B", 4.0)]
    result = pareto.analyse(rows, baseline_accuracy=60.0)
    assert {p.variant.name: p.roi for p in result.frontier} == {"A": pytest.approx(20 / 20), "B": pytest.approx(10 / 20)}


def test_equal_points_do_not_dominate_each_other():
    result = pareto.analyse(pareto.read_csv("name,latency_ms,accuracy\nA,5,70\nB,5,70\n"), baseline_accuracy=0)
    assert result.dominated == {}
    assert len(result.frontier) == 2


@pytest.mark.parametrize("text, where", [
    ("", "empty file"),
    ("name,latency_ms\nA,3\n", "missing column 'accuracy'"),
    ("name,latency_ms,accuracy\nA,3,70\nB,fast,71\n", "row 3, column 'latency_ms'"),
    ("name,latency_ms,accuracy\nA,3,nan\n", "row 2, column 'accuracy'"),
    ("name,latency_ms,accuracy\n", "no data rows"),
    ("name,latency_ms,accuracy\nA,0,70\n", "row 2, column 'latency_ms'"),
])
def test_bad_csv_names_row_and_column(text, where):
    with pytest.raises(BadInput) as err:
        pareto.read_csv(text)
    assert where in str(err.value)


def _seedance(*args):
    return subprocess.run([sys.executable, "-m", "seedance", *args], capture_output=True, text=True, timeout=120)


def test_cli_report_and_bad_csv(tmp_path):
    good = tmp_path / "r.csv"
    good.write_text(WITH_DOMINATED)
    done = _seedance("pareto", str(good), "--baseline-accuracy", "65", "--json")
    assert done.returncode == 0, done.stderr
    section = json.loads(done.stdout)["profile"]["pareto"]
    assert [p["name"] for p in section["frontier"]] == ["INT8", "W8A16", "FP16"]
    assert section["dominated"] == [{"name": "FP32", "dominated_by": "FP16"}]
    assert section["decay_point"] == "W8A16"
    bad = tmp_path / "bad.csv"
    bad.write_text("name,latency_ms,accuracy\nA,3,high\n")
    done = _seedance("pareto", str(bad))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("seedance: error:") and "row 2, column 'accuracy'" in lines[0]


def test_cli_plot_is_a_png(tmp_path):
    csv_path = tmp_path / "r.csv"
    csv_path.write_text(WITH_DOMINATED)
    out = tmp_path / "p.png"
    done = _seedance("pareto", str(csv_path), "--plot", str(out))
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a second run may replace its own plot without --force
    assert _seedance("pareto", str(csv_path), "--plot", str(out)).returncode == 0
