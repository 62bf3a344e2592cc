"""Helpers shared by the trace tests (imported by name; pytest puts this directory on sys.path)."""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
CUDA_INCLUDE = Path("/usr/local/cuda/include")
BIN = Path(sys.executable).parent


def _cc(*args):
    proc = subprocess.run(["cc", *map(str, args)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"cc {' '.join(map(str, args))}\n{proc.stderr}")


def wheel_runtime(major: str) -> Path | None:
    import site
    for base in site.getsitepackages():
        for path in glob.glob(os.path.join(base, "nvidia", "cuda_runtime", "lib", f"libcudart.so.{major}*")):
            return Path(path)
    return None


def trace(*args, env=None, timeout=120, prefix=(), cli=None):
    """Run `seedance trace` for real; returns (CompletedProcess, report dict or None).
    ``cli``: the seedance command (the venv's `seedance` unless given)."""
    report = Path(tempfile.mkdtemp(prefix="seedance-trace-report-"))
    os.chmod(report, 0o777)
    target = report / "report.json"
    cmd = [*prefix, *(cli or [str(BIN / "seedance")]), "trace", "--report-json", str(target), *map(str, args)]
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)
    data = json.loads(target.read_text()) if target.exists() else None
    shutil.rmtree(report, ignore_errors=True)
    return proc, data


def findings(report: dict, rule: str) -> list:
    return [f for f in report["findings"] if f["rule"] == rule]


def validate(report: dict) -> None:
    """The trace report is the check's report: the shipped seedance.report/v1 schema."""
    import jsonschema

    schema = json.loads((ROOT / "agent" / "schemas" / "report.schema.json").read_text())
    jsonschema.validate(report, schema)
