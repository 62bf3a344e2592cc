"""Every `seedance ... | jq` pipeline in README.md and docs/*.md, run for real (issue 10,
defect 7: `trace --json -- ./app | jq` broke as soon as the program printed to stdout).

Pipelines are taken from fenced code blocks.  Placeholders are given real things in a
scratch directory: ./app, ./prog and ./bench are a program that prints to stdout (a line of
text and a line of JSON that must never reach jq); ./libkernels.so and ./build a real
shared library; train.py a Python script that prints; r.json / report.json scratch paths.
An installed-plugin workflow gets the example plugins built and legacy-audio-encoder
installed in a store of its own.  A line that needs a GPU says so with `needs a GPU` on
the line or in the comment line above it, and is skipped here.  A pipeline that names
anything else fails this test until a fixture is added: every pipeline must run.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BIN, ROOT, load_example_builder

FORGED = "forged-by-the-program"
APP = f"""#!/bin/sh
echo "hello from the program on stdout"
echo '{{"event": "exec", "path": "{FORGED}", "schema": "{FORGED}"}}'
"""
TRAIN = f'print("training on stdout")\nprint(\'{{"stats": "{FORGED}"}}\')\n'


def doc_pipelines() -> list:
    """(file:line, command) for every `seedance ... | jq` line inside a fenced block."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        fenced, previous = False, ""
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            text = re.sub(r"^\s*(\$\s+)?(sudo\s+)?", "", line)
            if fenced and re.search(r"\|\s*jq\b", text) and text.startswith("seedance"):
                needs_gpu = "needs a GPU" in line or "needs a GPU" in previous
                found.append(pytest.param(text, needs_gpu, id=f"{doc.name}:{number}"))
            previous = line
    return found


PIPELINES = doc_pipelines()


def test_the_docs_have_pipelines():
    assert len(PIPELINES) >= 2  # the plugin headline and trace's program-that-prints


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    """A scratch working directory with every placeholder made real."""
    if not shutil.which("jq"):
        pytest.fail("jq is not installed (make install-deps installs it: Makefile APT_PACKAGES)")
    work = tmp_path_factory.mktemp("docs")
    for name in ("app", "prog", "bench"):
        (work / name).write_text(APP)
        (work / name).chmod(0o755)
    (work / "train.py").write_text(TRAIN)
    library = next(p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6",
                               "/lib64/libm.so.6", "/usr/lib64/libm.so.6") if os.path.exists(p))
    shutil.copy(library, work / "libkernels.so")
    (work / "build").mkdir()
    shutil.copy(library, work / "build" / "libkernels.so")
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHON"] = sys.executable
    for key in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        env[key] = str(work / ".xdg" / key.lower())
        os.makedirs(env[key])
    return work, env


@pytest.fixture(scope="module")
def plugin_store(scene):
    """legacy-audio-encoder installed, as in the headline workflow."""
    work, env = scene
    if not shutil.which("gcc"):
        pytest.skip("gcc not found: the example plugins cannot be built")
    built = work / "plugins"
    built.mkdir()
    load_example_builder().build("legacy-audio-encoder", built)
    proc = subprocess.run([str(BIN / "seedance"), "plugin", "install", str(built / "legacy-audio-encoder")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return built


def _trace_possible() -> str:
    try:
        from seedance import shim
        shim.library_path()
        shim.binding()
    except Exception as exc:  # noqa: BLE001 - any reason the shim cannot load is a skip
        return f"the LD_AUDIT shim is unavailable ({exc}) and so is the trace fallback"
    return ""


@pytest.mark.parametrize(("command", "needs_gpu"), PIPELINES)
def test_doc_pipeline_runs(command, needs_gpu, scene, request):
    if needs_gpu:
        pytest.skip("the docs mark this pipeline as needing a GPU")
    work, env = scene
    if re.search(r"seedance\s+plugin\s+verify", command):
        request.getfixturevalue("plugin_store")
    if re.search(r"seedance\s+(trace|run)\b", command):
        why = _trace_possible()
        if why:
            pytest.skip(why)
    line = command.replace("python train.py", f"{sys.executable} train.py")
    line = re.sub(r"\s+#\s.*$", "", line)  # a trailing comment
    # each stage's exit status, so seedance's 1 (findings) is told from jq's failure
    script = f'set -o pipefail; {line}; echo "status: ${{PIPESTATUS[*]}}" >&2'
    proc = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, timeout=600)
    out = proc.stdout.decode("utf-8", "replace")
    err = proc.stderr.decode("utf-8", "replace")
    statuses = [int(s) for s in re.findall(r"^status: ([\d ]+)$", err, re.M)[-1].split()]
    assert statuses[0] in (0, 1), f"seedance failed ({statuses}): {err}"
    assert all(s == 0 for s in statuses[1:]), f"jq failed ({statuses}): {err}"
    assert FORGED not in out, "the program's stdout reached jq"
    if not re.search(r"\bjq\b[^|]*\s-(r|-raw-output)\b", line):
        _json_values(out)  # jq writes JSON values unless told -r: all of it parses
    if "waste_traps[]" in line:
        # the headline: legacy-audio-encoder carries the three waste traps
        traps = _json_values(out)
        assert traps and all(t["trap"] for t in traps), out
    if "./app" in line or "./prog" in line:
        # it ran, and its stdout was moved aside, not lost (a filter such as
        # select(.kind == "init") may rightly print nothing for a program without CUDA)
        assert "hello from the program on stdout" in err, "the program's stdout was lost, not moved"
    if re.search(r"seedance\s+trace\b.*select\(\.event\s*==\s*\"exec\"\)", line):
        assert out.strip(), "trace streamed no exec event for the program it launched"


def _json_values(text: str) -> list:
    decoder, values, index = json.JSONDecoder(), [], 0
    text = text.strip()
    while index < len(text):
        value, index = decoder.raw_decode(text, index)
        values.append(value)
        while index < len(text) and text[index].isspace():
            index += 1
    return values
