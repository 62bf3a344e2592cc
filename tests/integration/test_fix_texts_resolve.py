"""Every pip requirement a fix can print resolves on PyPI, and the wheel it resolves to
really ships the library the fix is for.

The requirements: rules/context/pip_distributions.yaml (what needed-unresolved,
needed-optional-provider and the preload hints print) and fix/relink.py's runtime wheels.
The oracle is pip itself (`pip install --dry-run --no-deps --ignore-installed --report -`,
which reads the wheel's metadata without downloading it where the index serves PEP 658
metadata, as PyPI does) and the wheel's own file list, read from the end of the remote zip
by HTTP range requests (the central directory), not the hundreds of MB of the NVIDIA wheels.

Skips with the reason where PyPI cannot be reached.  The requirements are resolved on a
few threads.  Resolving all of them is network-bound (minutes): `make test` resolves a
subset (the CUDA runtime wheels relink prints, one library requirement per CUDA major, the
extension releases paired with the installed torch) and `make bench-accuracy` all of them
(SEEDANCE_FIX_TEXTS=all).
"""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from seedance.collect import package_context
from seedance.fix import relink

pytestmark = pytest.mark.timeout(600)
ALL = os.environ.get("SEEDANCE_FIX_TEXTS") == "all"


def _reachable() -> str:
    try:
        urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=10).close()
        return ""
    except OSError as exc:
        return f"PyPI is not reachable from here: {exc}"


class RemoteFile(io.RawIOBase):
    """A remote file read by HTTP range requests, for zipfile's seeks to the central directory."""

    def __init__(self, url: str):
        self.url, self.pos = url, 0
        head = urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=60)
        self.size = int(head.headers["Content-Length"])

    def seekable(self):
        return True

    def readable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=0):
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def read(self, n=-1):
        if n is None or n < 0:
            n = self.size - self.pos
        if n == 0 or self.pos >= self.size:
            return b""
        end = min(self.size, self.pos + n) - 1
        request = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end}"})
        data = urllib.request.urlopen(request, timeout=120).read()
        self.pos += len(data)
        return data

    def readinto(self, buffer):
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def resolve(requirement: str) -> dict:
    """pip's report of the one wheel ``requirement`` resolves to (Linux x86-64, this Python)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
                           "--disable-pip-version-check", "--quiet", "--report", "-", requirement],
                          capture_output=True, text=True, errors="replace", timeout=300)
    assert proc.returncode == 0, f"pip cannot resolve {requirement}: {proc.stderr.strip().splitlines()[-1:]}"
    report = json.loads(proc.stdout)
    assert len(report["install"]) == 1, report
    return report["install"][0]


def printed_requirements() -> dict:
    """requirement -> [library regex it must ship] for every requirement a fix can print."""
    wanted: dict = {}
    for entry in package_context.libraries():
        wanted.setdefault(entry["requirement"], []).append(entry["soname"])
    for major, wheel in relink.RUNTIME_WHEELS.items():
        wanted.setdefault(wheel, []).append(re.compile(rf"libcudart\.so\.{major}(\.0)?"))
    return wanted


def check(requirement: str, patterns: list) -> str:
    """'' when ``requirement`` resolves to a wheel that ships a file for each pattern, else why not."""
    try:
        item = resolve(requirement)
    except AssertionError as exc:
        return str(exc)
    url = item["download_info"]["url"]
    if not url.endswith(".whl"):
        return f"{requirement} resolves to a source release ({url}), which ships no library"
    names = [name.rsplit("/", 1)[-1] for name in zipfile.ZipFile(RemoteFile(url)).namelist()]
    missing = [p.pattern for p in patterns if not any(p.fullmatch(n) for n in names)]
    if missing:
        return f"{requirement} ({url.rsplit('/', 1)[-1]}) ships no file matching {', '.join(missing)}"
    return ""


def _subset(wanted: dict) -> dict:
    """What `make test` resolves: relink's runtime wheels and the first library requirement
    of each CUDA major (each major's wheels come from another project on the index)."""
    keep = set(relink.RUNTIME_WHEELS.values())
    firsts: dict = {}
    for entry in package_context.libraries():
        firsts.setdefault(entry["cuda"], entry["requirement"])
    keep.update(firsts.values())
    return {requirement: patterns for requirement, patterns in wanted.items() if requirement in keep}


def test_every_printed_pip_requirement_resolves_and_ships_its_library():
    why = _reachable()
    if why:
        pytest.skip(why)
    wanted = printed_requirements()
    assert len(wanted) >= 20  # the CUDA 12 and 13 wheels of each library
    if not ALL:
        wanted = _subset(wanted)
        assert len(wanted) >= 3
    with ThreadPoolExecutor(max_workers=6) as pool:
        problems = [p for p in pool.map(lambda item: check(*item), sorted(wanted.items())) if p]
    assert problems == []


def test_cuda_12_and_13_builds_are_told_apart():
    """The same file name in two CUDA majors' wheels: the requester's major picks the pin."""
    assert package_context.requirement_for("libcudnn.so.9", 13) == "nvidia-cudnn-cu13==9.*"
    assert package_context.requirement_for("libcudnn.so.9", 12) == "nvidia-cudnn-cu12==9.*"
    assert package_context.requirement_for("libcudnn.so.9", None) is None  # unknown major: no guess
    assert package_context.requirement_for("libcudart.so.13", None) == "nvidia-cuda-runtime==13.*"
    assert package_context.cuda_major_of(["libc.so.6", "libcublas.so.13", "libcudnn.so.9"]) == 13


# --- torch extensions' releases: the pin a fix prints for the installed torch -------------

def _release_pins() -> list:
    """(distribution, release, torch) for every pair rules/context/release_pairs.yaml holds."""
    return sorted((dist, release, torch) for dist, table in package_context.release_pairs().items()
                  for torch, (release, _source) in table.items())


def _pins_torch(item: dict, torch: str) -> bool:
    wanted = re.compile(rf"^torch\s*\(?\s*=={re.escape(torch)}\s*\)?(\s*;.*)?$")
    return any(wanted.match(line.strip()) for line in item["metadata"].get("requires_dist") or [])


def check_pair(dist: str, release: str, torch: str) -> str:
    """'' when ``dist==release`` resolves to a wheel whose Requires-Dist pins torch==``torch``."""
    requirement = f"{dist}=={release}"
    try:
        item = resolve(requirement)
    except AssertionError as exc:
        return str(exc)
    if not item["download_info"]["url"].endswith(".whl"):
        return f"{requirement} resolves to a source release"
    if not _pins_torch(item, torch):
        return f"{requirement} does not pin torch=={torch}: {item['metadata'].get('requires_dist')}"
    return ""


def _installed_torch_pins() -> list:
    """The pairs a fix prints in this environment: the installed torch's."""
    from seedance.collect import torch_ext

    install = torch_ext.find_torch()
    public = (install.version or "").split("+", 1)[0] if install else ""
    return [pin for pin in _release_pins() if pin[2] == public]


def test_the_extension_releases_paired_with_the_installed_torch_resolve_and_pin_it():
    """The subset `make test` runs: what a fix prints here, resolved with pip."""
    why = _reachable()
    if why:
        pytest.skip(why)
    pins = _installed_torch_pins()
    if not pins:
        pytest.skip("release_pairs.yaml pairs nothing with the torch installed here")
    assert [p for p in (check_pair(*pin) for pin in pins) if p] == []


@pytest.mark.skipif(not ALL, reason="one pip run per pair: make bench-accuracy (SEEDANCE_FIX_TEXTS=all)")
def test_every_extension_release_paired_with_torch_resolves_and_pins_it():
    """Every pair of release_pairs.yaml: the release resolves on the index and its own
    Requires-Dist pins that torch."""
    why = _reachable()
    if why:
        pytest.skip(why)
    pins = _release_pins()
    assert len(pins) >= 40
    with ThreadPoolExecutor(max_workers=6) as pool:
        problems = [p for p in pool.map(lambda pin: check_pair(*pin), pins) if p]
    assert problems == []
