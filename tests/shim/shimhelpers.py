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


def seedance_run(env, *args, timeout=60):
    exe = Path(sys.executable).parent / "seedance"
    return subprocess.run([str(exe), "run", *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=timeout)
