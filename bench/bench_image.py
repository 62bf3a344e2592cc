"""`seedance check --image` of a ~1 GB image against tar streaming its layers to /dev/null.

    .venv/bin/python bench/bench_image.py [--rounds 3] [--cache ~/.cache/seedance-bench]

The image: a Debian bookworm rootfs (`mmdebstrap --variant=minbase bookworm DIR`, fetched
from Debian's mirror once) and the torch CPU wheel unpacked into
/usr/local/lib/python3.11/site-packages, written as an OCI image layout with two gzip
layers.  Both are built once and cached outside the repository (--cache).

Target: the whole command `seedance check --image LAYOUT --no-cache` within 1.5x of the
peer, with a peak RSS under 300 MB.  The peer reads every layer as tar reads it: for each
layer blob `tar -xzOf LAYER > /dev/null`, all layers in one shell run.  Rounds interleave
(seedance, peer, seedance, ...), so a machine that slows down mid-run slows both sides;
best and median of each side, their ratio, and each side's peak RSS (getrusage of the
child, descendants included, from wait4) are printed.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEEL = Path("/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
SITE = "usr/local/lib/python3.11/site-packages"
GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"


def _blob_writer(layout: Path):
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)

    def write(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        (layout / "blobs" / "sha256" / digest).write_bytes(data)
        return "sha256:" + digest
    return write


class _Hashing:
    """A file object that hashes what passes through it (the layer's digests as it is written)."""

    def __init__(self, raw):
        self.raw, self.hasher, self.size = raw, hashlib.sha256(), 0

    def write(self, data):
        self.hasher.update(data)
        self.size += len(data)
        return self.raw.write(data)

    def flush(self):
        self.raw.flush()


def _layer(layout: Path, fill) -> dict:
    """Stream a gzip tar layer into the layout: fill(tar) adds the members."""
    part = layout / "blobs" / "layer.part"
    with open(part, "wb") as raw:
        stored = _Hashing(raw)
        with gzip.GzipFile(fileobj=stored, mode="wb", compresslevel=6, mtime=0) as gz:
            plain = _Hashing(gz)
            with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                fill(tar)
    digest = stored.hasher.hexdigest()
    part.rename(layout / "blobs" / "sha256" / digest)
    return {"mediaType": GZIP, "digest": "sha256:" + digest, "size": stored.size,
            "diff_id": "sha256:" + plain.hasher.hexdigest()}


def _rootfs(cache: Path) -> Path:
    rootfs = cache / "bookworm-minbase"
    if not (rootfs / "usr").is_dir():
        part = cache / "bookworm-minbase.part"
        shutil.rmtree(part, ignore_errors=True)
        print("building the Debian rootfs with mmdebstrap (once)...", file=sys.stderr)
        subprocess.run(["mmdebstrap", "--variant=minbase", "bookworm", str(part)], check=True)
        part.rename(rootfs)
    return rootfs


def _add_rootfs(rootfs: Path):
    def fill(tar):
        for name in sorted(os.listdir(rootfs)):
            tar.add(str(rootfs / name), arcname=name, recursive=True)
    return fill


def _add_wheel(wheel: Path):
    def fill(tar):
        made = set()
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                if info.is_dir():
                    continue
                name = f"{SITE}/{info.filename}"
                parts = name.split("/")
                for depth in range(1, len(parts)):
                    directory = "/".join(parts[:depth])
                    if directory not in made:
                        made.add(directory)
                        entry = tarfile.TarInfo(directory)
                        entry.type, entry.mode = tarfile.DIRTYPE, 0o755
                        tar.addfile(entry)
                entry = tarfile.TarInfo(name)
                entry.size = info.file_size
                entry.mode = 0o755 if info.filename.endswith(".so") or ".so." in info.filename else 0o644
                with archive.open(info) as body:
                    tar.addfile(entry, body)
    return fill


def build(cache: Path) -> Path:
    layout = cache / "image-bookworm-torch-cpu"
    if (layout / "index.json").exists():
        return layout
    if not WHEEL.exists():
        sys.exit(f"bench_image: the torch wheel is not at {WHEEL}")
    rootfs = _rootfs(cache)
    part = cache / "image.part"
    shutil.rmtree(part, ignore_errors=True)
    write = _blob_writer(part)
    print("writing the OCI layout (once)...", file=sys.stderr)
    layers = [_layer(part, _add_rootfs(rootfs)), _layer(part, _add_wheel(WHEEL))]
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Env": ["PATH=/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin"],
                                    "Cmd": ["/bin/bash"]},
                         "rootfs": {"type": "layers", "diff_ids": [layer["diff_id"] for layer in layers]}}).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": write(config), "size": len(config)},
                           "layers": [{k: v for k, v in layer.items() if k != "diff_id"} for layer in layers]}).encode()
    (part / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    (part / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": write(manifest),
         "size": len(manifest), "platform": {"architecture": "amd64", "os": "linux"}}]}))
    part.rename(layout)
    return layout


def _layer_blobs(layout: Path) -> list:
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads((layout / "blobs/sha256" / index["manifests"][0]["digest"][7:]).read_bytes())
    return [layout / "blobs/sha256" / d["digest"][7:] for d in manifest["layers"]]


def timed(argv: list, stdout=subprocess.DEVNULL) -> tuple:
    """(wall seconds, peak RSS in MB of the child and its descendants, exit status)."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode("utf-8", "replace")
    proc.stderr.close()
    return wall, usage.ru_maxrss / 1024, proc.returncode, err


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/seedance-bench"))
    parser.add_argument("--seedance", default=str(ROOT / ".venv/bin/seedance"))
    args = parser.parse_args()
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    layout = build(cache)
    blobs = _layer_blobs(layout)
    stored = sum(b.stat().st_size for b in blobs)
    print(f"image: {layout} ({len(blobs)} gzip layers, {stored / 1e6:.0f} MB stored)")
    peer = ["sh", "-c", " && ".join(f"tar -xzOf '{b}' > /dev/null" for b in blobs)]
    check = [args.seedance, "check", "--image", str(layout), "--no-cache", "--no-progress", "--json",
             "--driver-version", "580.65.06"]
    ours, theirs = [], []
    for number in range(args.rounds):
        wall, rss, code, err = timed(check)
        if code not in (0, 1):
            sys.exit(f"bench_image: seedance exited {code}: {err.strip()}")
        ours.append((wall, rss))
        wall, rss, code, err = timed(peer)
        if code != 0:
            sys.exit(f"bench_image: the peer exited {code}: {err.strip()}")
        theirs.append((wall, rss))
        print(f"round {number + 1}: seedance {ours[-1][0]:.2f} s {ours[-1][1]:.0f} MB, "
              f"tar {theirs[-1][0]:.2f} s {theirs[-1][1]:.0f} MB", flush=True)
    best = (min(w for w, _ in ours), min(w for w, _ in theirs))
    median = (statistics.median(w for w, _ in ours), statistics.median(w for w, _ in theirs))
    peak = max(r for _, r in ours)
    print(f"seedance check --image: best {best[0]:.2f} s, median {median[0]:.2f} s, peak RSS {peak:.0f} MB")
    print(f"tar -xzOf each layer:   best {best[1]:.2f} s, median {median[1]:.2f} s")
    print(f"ratio: best {best[0] / best[1]:.2f}x, median {median[0] / median[1]:.2f}x "
          f"(target 1.5x; peak RSS target 300 MB)")
    met = best[0] / best[1] <= 1.5 and median[0] / median[1] <= 1.5 and peak < 300
    print("met" if met else "NOT met")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
