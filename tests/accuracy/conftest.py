"""The accuracy corpus's real wheels: installed once, reused by every run.

``install(name, requirement)`` runs ``pip install --no-deps --target
~/.cache/seedance-corpus/<name>`` (``$SEEDANCE_CORPUS`` moves the cache) the first time and
returns that directory; a wheel pip cannot fetch raises Unavailable with pip's reason, and
the tests skip with it.  Nothing is cached inside the repository.

``site(name, parts)`` lays out one environment, ``<cache>/envs/<name>/lib/pythonX.Y/
site-packages``, from installed wheels by hard links (a copy where links cannot cross
file systems), so two environments can pair one cuSPARSE with two nvJitLinks without a
second download.  The directory scan does not follow symlinked directories, so links to
directories would hide the files.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

CORPUS = Path(os.environ.get("SEEDANCE_CORPUS", Path.home() / ".cache" / "seedance-corpus"))
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"


class Unavailable(Exception):
    """A part of the corpus cannot be had on this machine; the message says why."""


def _locked(name: str):
    CORPUS.mkdir(parents=True, exist_ok=True)
    handle = open(CORPUS / f".{name}.lock", "w")
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def install(name: str, requirement: str, marker: str = "") -> Path:
    """CORPUS/<name>, holding ``requirement`` installed with --no-deps; once per machine.

    ``marker``: a path inside the install that proves it complete (another session may have
    installed the same name with the same requirement)."""
    target = CORPUS / name
    done = target / ".seedance-complete"
    if done.is_file() or (marker and (target / marker).exists()):
        return target
    with _locked(name):
        if done.is_file() or (marker and (target / marker).exists()):
            return target
        partial = CORPUS / f"{name}.part"
        shutil.rmtree(partial, ignore_errors=True)
        # wheels only: a source release would compile here, or fetch a binary from an index
        # this machine cannot reach (TensorRT's), and neither is what a GPU user installs
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary", ":all:",
                               "--disable-pip-version-check", "--target", str(partial), requirement],
                              capture_output=True, text=True, errors="replace", timeout=1800)
        if proc.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            lines = [line for line in proc.stderr.splitlines() if line.strip() and "WARNING" not in line]
            raise Unavailable(f"pip cannot install {requirement}: {(lines or ['?'])[-1].strip()}")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(partial, target)
        done.write_text(requirement + "\n")
    return target


def site(name: str, parts: list) -> Path:
    """CORPUS/envs/<name>/lib/pythonX.Y/site-packages made of ``parts``: (install dir, path
    inside it) pairs, each linked into the same relative place, with each install's
    .dist-info (so the package that ships a file is known, as in a real environment)."""
    root = CORPUS / "envs" / name
    packages = root / "lib" / f"python{PY}" / "site-packages"
    done = root / ".seedance-complete-v2"  # v2: the wheels' .dist-info come along
    if done.is_file():
        return packages
    with _locked(f"env-{name}"):
        if done.is_file():
            return packages
        shutil.rmtree(root, ignore_errors=True)
        sources = sorted({str(source) for source, _relative in parts})
        parts = list(parts) + [(source, info.name) for source in sources
                               for info in sorted(Path(source).glob("*.dist-info"))]
        for source, relative in parts:
            src = Path(source) / relative
            if not src.exists():
                raise Unavailable(f"{src} is not installed")
            dest = packages / relative
            dest.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dest, copy_function=_link, symlinks=True)
            else:
                _link(src, dest)
        done.write_text("\n".join(f"{s} {r}" for s, r in parts) + "\n")
    return packages


def _link(src, dest):
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)
    return dest


def merged(name: str, installs: list) -> Path:
    """CORPUS/envs/<name>/lib/pythonX.Y/site-packages holding every file of each install
    dir in ``installs`` (pip's --target trees, or a real site-packages), merged by hard links
    as pip would install them side by side: several NVIDIA wheels share site-packages/nvidia/.
    A file two installs both ship (nvidia/__init__.py) comes from the first."""
    root = CORPUS / "envs" / name
    packages = root / "lib" / f"python{PY}" / "site-packages"
    done = root / ".seedance-complete-merged"
    if done.is_file():
        return packages
    with _locked(f"env-{name}"):
        if done.is_file():
            return packages
        shutil.rmtree(root, ignore_errors=True)
        for install_dir in installs:
            install_dir = Path(install_dir)
            if not install_dir.is_dir():
                raise Unavailable(f"{install_dir} is not installed")
            for base, dirs, files in os.walk(install_dir):
                dirs.sort()
                relative = Path(base).relative_to(install_dir)
                (packages / relative).mkdir(parents=True, exist_ok=True)
                for file_name in files:
                    if relative == Path(".") and file_name.startswith(".seedance"):
                        continue
                    src, dest = Path(base) / file_name, packages / relative / file_name
                    if dest.exists() or dest.is_symlink():
                        continue
                    if src.is_symlink():
                        os.symlink(os.readlink(src), dest)
                    else:
                        _link(src, dest)
        done.write_text("\n".join(map(str, installs)) + "\n")
    return packages
