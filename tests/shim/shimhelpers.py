"""Helpers shared by the shim tests (a module of its own: `conftest` is not importable by name)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def parse_lines(stdout: str) -> list[dict]:
    """'alloc result=0' lines -> [{'step': 'alloc', 'result': 0}, ...]"""
    out = []
    for line in stdout.splitlines():
        name, *pairs = line.split()
        row = {"step": name}
        for pair in pairs:
            if "=" in pair:
                k, v = pair.split("=", 1)
                row[k] = int(v) if v.lstrip("-").isdigit() else v
        out.append(row)
    return out


# which front end seedance_run() drives: "python" (`python -m seedance run`) or "launcher"
# (seedance-run, the C launcher of issue 13); the `front` fixture of conftest switches it
FRONT = {"name": "python"}


def seedance_run(env, *args, timeout=60):
    if FRONT["name"] == "launcher":
        from seedance import shim
        cmd = [str(shim.launcher_path())]
    else:
        # `python -m seedance run`: the Python command itself (the console script's
        # `seedance run` execs seedance-run at once, cli._launch)
        cmd = [sys.executable, "-m", "seedance", "run"]
    return subprocess.run([*cmd, *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout)
