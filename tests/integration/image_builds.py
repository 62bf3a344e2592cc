"""What the podman-based integration tests share: Debian bases from mmdebstrap (cached by
deploy/mkbase.sh), this tree's wheels (cached by a content hash of the sources they are
built from), and `podman run` with the runtime and rlimits these machines need.

Each helper returns a reason string instead of raising when the machine cannot do it, so
a test skips saying exactly what is missing, never silently."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SEEDANCE_IMAGE_CACHE") or Path.home() / ".cache" / "seedance-images")
# crun refuses this machine's hybrid cgroup layout; runc runs, with rlimits under the host's
PODMAN_RUN = ["podman", "run", "--runtime", "/usr/sbin/runc", "--ulimit", "nofile=1024:1024",
              "--ulimit", "nproc=1024:1024"]
PODMAN_BUILD = ["podman", "build", "--runtime", "/usr/sbin/runc", "--ulimit", "nofile=1024:1024",
                "--ulimit", "nproc=1024:1024"]
# what a wheel is built from: a change anywhere here is a new wheel (and a new image)
WHEEL_INPUTS = ("agent", "shim", "rules", "probes", "examples", "setup.py", "pyproject.toml", "MANIFEST.in",
                "README.md", "LICENSE")
SKIP_PARTS = {"__pycache__", ".pytest_cache"}
SKIP_SUFFIXES = (".pyc", ".so", ".o")


def podman_missing() -> str | None:
    for tool in ("podman", "mmdebstrap"):
        if not shutil.which(tool):
            return f"{tool} is not installed (make system-deps installs it)"
    if not os.path.exists("/usr/sbin/runc"):
        return "runc is not installed at /usr/sbin/runc"
    if os.geteuid() != 0:
        return "needs root: mmdebstrap's root mode and podman's rootful store"
    return None


def run(argv, timeout=600, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)


def base_image(name: str, packages: list[str]) -> tuple[str | None, str]:
    """(image, "") or (None, why): a bookworm minbase with PACKAGES, imported into podman."""
    proc = run([str(REPO / "deploy" / "mkbase.sh"), name, *packages], timeout=1200)
    if proc.returncode != 0:
        return None, f"deploy/mkbase.sh {name} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
    return proc.stdout.strip().splitlines()[-1], ""


def source_key() -> str:
    """A content hash of every file a wheel is built from (tracked or not, minus build outputs)."""
    digest = hashlib.sha256()
    for top in WHEEL_INPUTS:
        path = REPO / top
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []
        for item in files:
            rel = item.relative_to(REPO)
            if SKIP_PARTS & set(rel.parts) or item.name.endswith(SKIP_SUFFIXES) or item.name.startswith("_") \
                    and item.name.endswith(("_cffi.c", "_cffi.py")):
                continue
            digest.update(str(rel).encode() + b"\0" + item.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def wheelhouse() -> tuple[Path | None, str]:
    """This tree's wheel and its dependencies' wheels, built once per source_key()."""
    target = CACHE / f"wheels-{source_key()}"
    if (target / ".complete").exists():
        return target, ""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    proc = run([sys.executable, "-m", "pip", "wheel", "-q", str(REPO), "-w", str(target)], timeout=900)
    if proc.returncode != 0 or not list(target.glob("seedance-*.whl")):
        return None, f"pip wheel . failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
    (target / ".complete").touch()
    return target, ""
