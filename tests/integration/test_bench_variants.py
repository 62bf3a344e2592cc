"""`seedance bench --variants` writes the CSV that `seedance pareto` reads (notes 2.5)."""
import csv
import io
import json
import textwrap

from tests.conftest import run_cli


def _variant(root, name, delay_ms, accuracy):
    path = root / name
    path.mkdir()
    (path / "manifest.yaml").write_text(textwrap.dedent(f"""\
        name: enc-{name.lower()}
        version: 1.0.0
        seedance_version: ">=0.1,<1"
        entry: {{module: work}}
        batch_policy: {{policy: adaptive, max_batch_size: 4, max_wait_ms: 1}}
        accuracy: {accuracy}
        bench: work:run
        """))
    (path / "work.py").write_text(f"import time\n\ndef run(batch):\n    time.sleep({delay_ms} / 1000)\n"
                                  "    return [x for x in batch]\n")
    return path


def test_variants_csv_feeds_pareto(tmp_path):
    slow = _variant(tmp_path, "FP16", 12, 72.1)
    fast = _variant(tmp_path, "INT8", 3, 69.3)
    out = tmp_path / "variants.csv"
    done = run_cli("bench", "--variants", f"{slow},{fast}", "--csv", out, "--warmup", "1", "--rounds", "2",
                   "--low-requests", "20", "--high-requests", "20", "--high-rate", "200", "--no-pin", timeout=300)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    # a plugin directory is named by its manifest (name-version), an installed plugin as given
    assert [r["name"] for r in rows] == ["enc-fp16-1.0.0", "enc-int8-1.0.0"]
    latency = {r["name"]: float(r["latency_ms"]) for r in rows}
    # each batch sleeps 12 ms vs 3 ms: the latencies the bench measured keep that order
    assert latency["enc-fp16-1.0.0"] > latency["enc-int8-1.0.0"] >= 3.0
    assert [float(r["accuracy"]) for r in rows] == [72.1, 69.3]
    report = run_cli("pareto", out, "--json")
    assert report.returncode == 0, report.stderr
    assert len(json.loads(report.stdout)["profile"]["pareto"]["frontier"]) == 2


def test_a_variant_without_accuracy_is_one_line(tmp_path):
    good = _variant(tmp_path, "A", 1, 70)
    bad = _variant(tmp_path, "B", 1, 70)
    (bad / "manifest.yaml").write_text((bad / "manifest.yaml").read_text().replace("accuracy: 70\n", ""))
    done = run_cli("bench", "--variants", f"{good},{bad}", timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "accuracy" in done.stderr
