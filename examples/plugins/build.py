#!/usr/bin/env python3
"""Build the example plugins into a directory: copy each one, compile src/*.c (gcc) and
src/*.cu (nvcc) into lib/lib<stem>.so.  Binaries are never committed; tests and benches
build what they use.

    python3 examples/plugins/build.py OUT_DIR [NAME ...]

Conventions:
  * src/<stem>.c  -> lib/lib<stem>.so, compiled with -D<STEM>_VERSION="<manifest version>"
  * src/<stem>.cu -> lib/lib<stem>.so with nvcc; flags from a '// seedance-build: ...' line
  * stubs/<soname>.c + stubs/<soname>.map -> a build-time-only library with that soname and
    version script that src libraries link against; it is not shipped (future-toolchain)
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
NVCC = os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc")
# the C compiler, as setuptools takes it (CC may carry flags): the package build and the
# shim's use the same one


def _cc() -> list:
    import shlex

    return shlex.split(os.environ.get("CC") or "gcc")


def examples() -> list:
    return sorted(p.name for p in HERE.iterdir() if (p / "manifest.yaml").is_file())


def needs_nvcc(name: str) -> bool:
    return any((HERE / name / "src").glob("*.cu"))


def have_nvcc() -> bool:
    return bool(shutil.which("nvcc") or os.path.exists(NVCC))


def _version(manifest: Path) -> str:
    match = re.search(r"^version:\s*['\"]?([^'\"\s]+)", manifest.read_text(), re.M)
    return match.group(1) if match else "0"


def build(name: str, out_dir: Path) -> Path:
    """Copy example ``name`` into out_dir/name and build its libraries; returns the copy."""
    src_root = HERE / name
    dest = Path(out_dir) / name
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src_root, dest, ignore=shutil.ignore_patterns("__pycache__", "lib", "stubs"))
    version = _version(dest / "manifest.yaml")
    lib_dir = dest / "lib"
    lib_dir.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="seedance-stubs-") as stub_dir:
        stubs = _build_stubs(src_root / "stubs", Path(stub_dir))
        for source in sorted((dest / "src").glob("*.c")):
            target = lib_dir / f"lib{source.stem}.so"
            macro = f"-D{source.stem.upper()}_VERSION=\"{version}\""
            _run([*_cc(), "-shared", "-fPIC", "-O2", macro, "-o", str(target), str(source),
                  *map(str, stubs), "-lm"])
    for source in sorted((dest / "src").glob("*.cu")):
        target = lib_dir / f"lib{source.stem}.so"
        flags = re.search(r"//\s*seedance-build:(.*)", source.read_text())
        extra = flags.group(1).split() if flags else []
        nvcc = shutil.which("nvcc") or NVCC
        _run([nvcc, "-shared", "-Xcompiler", "-fPIC", *extra, "-o", str(target), str(source)])
    return dest


def _build_stubs(stub_src: Path, out: Path) -> list:
    built = []
    if not stub_src.is_dir():
        return built
    for source in sorted(stub_src.glob("*.c")):
        soname = source.name[:-2]
        version_script = stub_src / f"{soname}.map"
        target = out / soname
        _run([*_cc(), "-shared", "-fPIC", "-o", str(target), str(source), f"-Wl,-soname,{soname}",
              f"-Wl,--version-script={version_script}"])
        built.append(target)
    return built


def _run(cmd) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr}")


def build_archives(out_dir) -> tuple:
    """Every example as OUT_DIR/NAME.tar.gz (manifest.yaml in its one top-level directory,
    the layout `seedance plugin install` reads), for the package build (setup.py): returns
    (archives written, [(name, why not built)]).  Members are sorted and their owners and
    times fixed: what a build machine's clock or user was says nothing about a plugin."""
    import tarfile

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written, skipped = [], []

    def normalise(info):
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = 0
        return info

    with tempfile.TemporaryDirectory(prefix="seedance-examples-") as tmp:
        for name in examples():
            if needs_nvcc(name) and not have_nvcc():
                skipped.append((name, "nvcc not found"))
                continue
            root = build(name, Path(tmp))
            archive = out / f"{name}.tar.gz"
            with tarfile.open(archive, "w:gz") as tar:
                for path in [root, *sorted(root.rglob("*"))]:
                    tar.add(path, arcname=str(Path(name) / path.relative_to(root)), recursive=False,
                            filter=normalise)
            written.append(archive)
    return written, skipped


def main(argv) -> int:
    if not argv:
        print(__doc__)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for name in argv[1:] or examples():
        if needs_nvcc(name) and not have_nvcc():
            print(f"skip {name}: nvcc not found")
            continue
        print(build(name, out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
