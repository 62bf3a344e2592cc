"""`seedance profile calls` on the feature-extractor example plugins (notes 2.1).

1.0.0 normalises each frame along two paths (zscore in the spectral path, standardize in
the energy path: same operations, same order, so the same floats); 1.1.0 normalises once.
standardize also fills an 8 MiB scratch buffer, so its own memory cost is known to the
test without asking seedance: at least 0.3 * 8 cost units.
"""
import json
import re

import pytest

from tests.conftest import load_example_builder, run_cli


@pytest.fixture(scope="module")
def plugins(tmp_path_factory):
    out = tmp_path_factory.mktemp("plugins")
    builder = load_example_builder()
    return {name: builder.build(name, out) for name in ("feature-extractor-v1.0.0", "feature-extractor-v1.1.0")}


def _profile(path, *extra):
    done = run_cli("profile", "calls", "--plugin", path, "--json", *extra, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_the_two_normalisations_are_one_redundant_path(plugins):
    code, report = _profile(plugins["feature-extractor-v1.0.0"])
    assert code == 1
    assert [f["rule"] for f in report["findings"]] == ["plugin-redundant-path"]
    evidence = report["findings"][0]["evidence"]
    assert evidence["path_a"][-1] != evidence["path_b"][-1]
    assert {evidence["path_a"][-1], evidence["path_b"][-1]} == {"features.zscore", "features.standardize"}
    assert evidence["shared_prefix"] == ["features.extract_batch"]
    assert evidence["remove"] == "features.standardize" and evidence["keep"] == "features.zscore"
    # the saving is the removed call's cost, which includes its 8 MiB scratch buffer
    assert evidence["saving_mem_mb"] >= 8.0
    assert evidence["saving_cost"] == pytest.approx(evidence["saving_cpu_ms"] + 0.3 * evidence["saving_mem_mb"], rel=1e-6)
    nodes = {n["name"]: n for n in report["profile"]["callgraph"]["nodes"]}
    assert nodes["features.standardize"]["calls"] == 1
    assert evidence["saving_cost"] == pytest.approx(nodes["features.standardize"]["cost"], rel=1e-3)
    assert nodes["native:libfeat.so:feat_band_energy"]["native"] is True
    edges = {(e["caller"], e["callee"]) for e in report["profile"]["callgraph"]["edges"]}
    assert ("features.band_energies", "native:libfeat.so:feat_band_energy") in edges


def test_a_batch_reports_each_redundant_path_once(plugins):
    _, report = _profile(plugins["feature-extractor-v1.0.0"], "--input", "3")
    assert len(report["findings"]) == 1
    nodes = {n["name"]: n for n in report["profile"]["callgraph"]["nodes"]}
    assert nodes["features.zscore"]["calls"] == 3 and nodes["features.standardize"]["calls"] == 3


def test_the_merged_release_raises_nothing(plugins):
    code, report = _profile(plugins["feature-extractor-v1.1.0"])
    assert code == 0 and report["findings"] == []
    assert report["profile"]["callgraph"]["redundant_paths"] == []


def test_svg_marks_the_redundant_edges_red(plugins, tmp_path):
    svg = tmp_path / "calls.svg"
    done = run_cli("profile", "calls", "--plugin", plugins["feature-extractor-v1.0.0"], "--svg", svg, timeout=300)
    assert done.returncode == 1, done.stderr
    text = svg.read_text()
    titles = dict(re.findall(r'<g id="(node\d+)" class="node">\s*<title>(n\d+)</title>', text))
    labels = {}
    for node_id, name in titles.items():
        block = text.split(f'<g id="{node_id}" class="node">', 1)[1].split("</g>", 1)[0]
        labels[name] = re.search(r">([^<]+)</text>", block).group(1)
    by_label = {label: name for name, label in labels.items()}
    red_edges = set()
    for block in text.split('class="edge">')[1:]:
        title = re.search(r"<title>(n\d+)&#45;&gt;(n\d+)</title>", block)
        if 'stroke="red"' in block.split("</g>", 1)[0]:
            red_edges.add((labels[title.group(1)], labels[title.group(2)]))
    assert ("features.energy_features", "features.standardize") in red_edges
    assert ("features.spectral_features", "features.zscore") in red_edges
    assert ("features.extract_batch", "features.synth") not in red_edges
    assert "features.synth" in by_label
