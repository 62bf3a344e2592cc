"""Shared fixtures: paths and helpers for running the real CLI."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def run_cli(*args, env=None, check=False, timeout=120, input=None):
    """Run the installed console script as a user would; returns CompletedProcess."""
    exe = BIN / "seedance"
    cmd = [str(exe), *map(str, args)] if exe.exists() else [sys.executable, "-m", "seedance", *map(str, args)]
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout, input=input)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def load_example_builder():
    """examples/plugins/build.py, which builds the example plugins' C libraries."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("seedance_examples_build", ROOT / "examples/plugins/build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def cli():
    return run_cli
