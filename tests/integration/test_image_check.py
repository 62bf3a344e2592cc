"""check --image / --root on images these tests build: OCI layouts written from host files
and gcc-built programs (layers as tar.gz and tar.zst with their digests), and, where podman
runs, the same rootfs imported and saved as oci-archive and docker-archive.  The oracle
where podman runs is the image's own entry program started by podman."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the image's programs")

RTLD = "/lib64/ld-linux-x86-64.so.2"
DRIVER = ["--driver-version", "580.65.06"]  # no NVML asked: the judgement is the same on any host


# --- building images -----------------------------------------------------------------------
def _gcc(tmp: Path, name: str, source: str, *args) -> bytes:
    src = tmp / f"{name}.c"
    src.write_text(source)
    out = tmp / name
    subprocess.run(["gcc", "-O1", "-o", str(out), str(src), *args], check=True, capture_output=True)
    return out.read_bytes()


def _host_file(path: str) -> bytes:
    return Path(os.path.realpath(path)).read_bytes()


def _libc_path() -> str:
    out = subprocess.run(["ldd", "/bin/sh"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if "libc.so.6 =>" in line:
            return line.split("=>")[1].split()[0]
    pytest.skip("no glibc /bin/sh here")


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> dict:
    """The files of the images: /bin/sh, glibc and ld.so from this host (where this host's
    ld.so looks without a cache), libgreet.so and the app that needs it, a fake libcuda."""
    tmp = tmp_path_factory.mktemp("image-parts")
    greet = _gcc(tmp, "libgreet.so", "int greet(void) { return 42; }\n", "-shared", "-fPIC",
                 "-Wl,-soname,libgreet.so")
    app = _gcc(tmp, "app", '#include <stdio.h>\nint greet(void);\n'
               'int main(void) { printf("greet=%d\\n", greet()); return 0; }\n',
               f"-L{tmp}", "-lgreet", f"-Wl,--dynamic-linker,{RTLD}")
    libcuda = _gcc(tmp, "libcuda.so.1", "int cuInit(unsigned f) { return 0; }\n", "-shared", "-fPIC",
                   "-Wl,-soname,libcuda.so.1")
    return {"sh": _host_file("/bin/sh"), "libc": _host_file(_libc_path()), "rtld": _host_file(RTLD),
            "greet": greet, "app": app, "libcuda": libcuda}


def _tar(entries) -> bytes:
    """entries: (name, kind, payload, mode); kind file|dir|link|hardlink|fifo."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, payload, mode in entries:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if kind == "file":
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "link": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE,
                         "fifo": tarfile.FIFOTYPE}[kind]
            if kind in ("link", "hardlink"):
                info.linkname = payload
            tar.addfile(info)
    return buffer.getvalue()


def _compress(data: bytes, how: str) -> tuple:
    if how == "gzip":
        return gzip.compress(data, mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip"
    if how == "zstd":
        import zstandard

        return zstandard.ZstdCompressor().compress(data), "application/vnd.oci.image.layer.v1.tar+zstd"
    return data, "application/vnd.oci.image.layer.v1.tar"


def _blob(root: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / "sha256" / digest).write_bytes(data)
    return "sha256:" + digest


def write_layout(root: Path, layer_entries: list, how=("gzip", "zstd", "gzip", "zstd"),
                 entrypoint=("/usr/bin/app",), raw_layers=None) -> list:
    """An OCI image layout at ``root``; the layers' digests, in order."""
    root.mkdir(parents=True)
    (root / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    descs, diff_ids = [], []
    for number, entries in enumerate(layer_entries):
        tar = _tar(entries) if raw_layers is None or raw_layers[number] is None else raw_layers[number]
        data, media = _compress(tar, how[number % len(how)])
        descs.append({"mediaType": media, "digest": _blob(root, data), "size": len(data)})
        diff_ids.append("sha256:" + hashlib.sha256(tar).hexdigest())
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"], "Entrypoint": list(entrypoint)},
              "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    config_bytes = json.dumps(config).encode()
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": _blob(root, config_bytes), "size": len(config_bytes)},
                "layers": descs}
    manifest_bytes = json.dumps(manifest).encode()
    index = {"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": _blob(root, manifest_bytes),
         "size": len(manifest_bytes), "platform": {"architecture": "amd64", "os": "linux"}}]}
    (root / "index.json").write_text(json.dumps(index))
    return [d["digest"] for d in descs]


def base_layer(parts) -> list:
    return [("bin", "dir", None, 0o755), ("bin/sh", "file", parts["sh"], 0o755),
            ("lib64", "dir", None, 0o755), ("lib64/ld-linux-x86-64.so.2", "file", parts["rtld"], 0o755),
            ("usr", "dir", None, 0o755), ("usr/bin", "dir", None, 0o755),
            ("usr/lib", "dir", None, 0o755), ("usr/lib/x86_64-linux-gnu", "dir", None, 0o755),
            ("usr/lib/x86_64-linux-gnu/libc.so.6", "file", parts["libc"], 0o755),
            # merged /usr: /lib/x86_64-linux-gnu (ld.so's first default directory) through a link
            ("lib", "link", "usr/lib", 0o777)]


def app_layer(parts) -> list:
    return [("usr/lib/x86_64-linux-gnu/libgreet.so", "file", parts["greet"], 0o755),
            ("usr/bin/app", "file", parts["app"], 0o4755),  # setuid: dropped when staged
            ("usr/bin/app-again", "hardlink", "usr/bin/app", 0o755),
            ("etc", "dir", None, 0o755), ("etc/motd", "file", b"hello\n", 0o644)]


def check(image, *extra, env=None):
    proc = run_cli("check", "--image", str(image), "--json", "--no-progress", *DRIVER, *extra, env=env)
    report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
    return proc, report


def _rules(report) -> list:
    return [f["rule"] for f in report["findings"]]


def _one_error_line(proc, *words):
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("seedance: error:"), lines[0]
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


# --- the healthy image, the whiteout, the baked libcuda -----------------------------------
def test_healthy_image_is_clean(tmp_path, parts):
    layout = tmp_path / "healthy"
    write_layout(layout, [base_layer(parts), app_layer(parts)])
    proc, report = check(layout)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert report["findings"] == []
    assert report["scope"]["entry_program"] == "/usr/bin/app"
    assert report["stats"]["elf_objects"] >= 5


def test_whiteout_of_a_needed_library_is_found_with_its_layers(tmp_path, parts):
    layout = tmp_path / "whiteout"
    digests = write_layout(layout, [base_layer(parts), app_layer(parts),
                                    [("usr/lib/x86_64-linux-gnu/.wh.libgreet.so", "file", b"", 0o644)]])
    proc, report = check(layout)
    assert proc.returncode == 1, proc.stderr + proc.stdout
    missing = [f for f in report["findings"] if f["rule"] == "needed-unresolved"]
    # app-again is a hard link to the same file: one object, one finding
    assert [f["subject"]["image_path"] for f in missing] == ["/usr/bin/app"]
    for finding in missing:
        assert finding["subject"]["layer"] == digests[1]  # the app came in with the second layer
        assert f"removed by a whiteout in layer {digests[2]}" in finding["message"]


def test_opaque_directory_hides_the_lower_layers(tmp_path, parts):
    layout = tmp_path / "opaque"
    write_layout(layout, [base_layer(parts), app_layer(parts),
                          [("usr/lib/x86_64-linux-gnu/.wh..wh..opq", "file", b"", 0o644),
                           ("usr/lib/x86_64-linux-gnu/other.txt", "file", b"x", 0o644)]])
    proc, report = check(layout)
    assert proc.returncode == 1
    assert "needed-unresolved" in _rules(report)


def test_baked_libcuda_is_found(tmp_path, parts):
    layout = tmp_path / "libcuda"
    digests = write_layout(layout, [base_layer(parts), app_layer(parts),
                                    [("usr/lib/x86_64-linux-gnu/libcuda.so.1", "file", parts["libcuda"], 0o755),
                                     ("usr/local", "dir", None, 0o755),
                                     ("usr/local/cuda", "dir", None, 0o755),
                                     ("usr/local/cuda/lib64", "dir", None, 0o755),
                                     ("usr/local/cuda/lib64/stubs", "dir", None, 0o755),
                                     ("usr/local/cuda/lib64/stubs/libcuda.so", "file", parts["libcuda"], 0o755)]])
    proc, report = check(layout)
    assert proc.returncode == 1, proc.stderr
    baked = [f for f in report["findings"] if f["rule"] == "image-libcuda-baked"]
    assert [f["subject"]["image_path"] for f in baked] == ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"]  # not the link stub
    assert baked[0]["severity"] == "error"  # a default directory of ld.so
    assert baked[0]["subject"]["layer"] == digests[2]
    assert "rm -f /usr/lib/x86_64-linux-gnu/libcuda.so*" in baked[0]["fix"]


def test_absolute_symlink_never_reaches_the_host(tmp_path, parts):
    marker_dir = tmp_path / "host-only"
    marker_dir.mkdir()
    marker = marker_dir / "libgreet.so"
    marker.write_bytes(parts["greet"])  # a loadable library, only on the host
    layout = tmp_path / "escape"
    app = [e for e in app_layer(parts) if e[0] != "usr/lib/x86_64-linux-gnu/libgreet.so"]
    write_layout(layout, [base_layer(parts), app + [("usr/lib/x86_64-linux-gnu/libgreet.so", "link", str(marker), 0o777)]])
    proc, report = check(layout)
    assert proc.returncode == 1, proc.stderr  # the link dangles inside the image
    assert str(marker_dir) not in proc.stdout and "host-only" not in proc.stdout
    assert "needed-unresolved" in _rules(report)


def test_root_directory_is_resolved_inside_it(tmp_path, parts):
    root = tmp_path / "rootfs"
    marker = tmp_path / "host-only-greet.so"
    marker.write_bytes(parts["greet"])
    for name, kind, payload, _mode in base_layer(parts) + app_layer(parts):
        path = root / name
        if kind == "dir":
            path.mkdir(parents=True, exist_ok=True)
        elif kind == "file":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(payload)
        elif kind == "link":
            path.symlink_to(payload)
    proc = run_cli("check", "--root", str(root), "--json", "--no-progress", *DRIVER)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (root / "usr/lib/x86_64-linux-gnu/libgreet.so").unlink()
    (root / "usr/lib/x86_64-linux-gnu/libgreet.so").symlink_to(marker)
    proc = run_cli("check", "--root", str(root), "--json", "--no-progress", *DRIVER)
    assert proc.returncode == 1, proc.stderr + proc.stdout
    assert "host-only" not in proc.stdout
    assert "needed-unresolved" in _rules(json.loads(proc.stdout))


# --- bad images: one line, exit 2 ------------------------------------------------------------
def test_digest_mismatch(tmp_path, parts):
    layout = tmp_path / "mismatch"
    digests = write_layout(layout, [base_layer(parts), app_layer(parts)])
    blob = layout / "blobs/sha256" / digests[1].split(":")[1]
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    _one_error_line(check(layout)[0], digests[1], "does not match its digest")


def test_missing_blob(tmp_path, parts):
    layout = tmp_path / "missing"
    digests = write_layout(layout, [base_layer(parts), app_layer(parts)])
    (layout / "blobs/sha256" / digests[0].split(":")[1]).unlink()
    _one_error_line(check(layout)[0], "missing blob", digests[0])


def test_truncated_layer(tmp_path, parts):
    tar = _tar(base_layer(parts))
    layout = tmp_path / "truncated"
    # the truncated tar is what the manifest's digest names: only reading it finds the damage
    write_layout(layout, [[]], how=("gzip",), raw_layers=[tar[: len(tar) // 2]])
    _one_error_line(check(layout)[0], "damaged layer")


def test_traversal_entry(tmp_path, parts):
    layout = tmp_path / "traversal"
    write_layout(layout, [base_layer(parts) + [("usr/../../../etc/evil", "file", b"x", 0o644)]])
    _one_error_line(check(layout)[0], "climbs out with '..'")


def test_symlink_loop(tmp_path, parts):
    layout = tmp_path / "loop"
    write_layout(layout, [base_layer(parts) + [("usr/lib/x86_64-linux-gnu/a", "link", "b", 0o777),
                                               ("usr/lib/x86_64-linux-gnu/b", "link", "/usr/lib/x86_64-linux-gnu/a", 0o777)]])
    _one_error_line(check(layout)[0], "symlink loop")


def test_bomb_gives_one_line_naming_the_cap(tmp_path, parts):
    layout = tmp_path / "bomb"
    write_layout(layout, [[("zeros", "file", bytes(64 << 20), 0o644)]])  # 64 MiB of zeros: ~64 KiB gzip
    assert sum(p.stat().st_size for p in (layout / "blobs/sha256").iterdir()) < 1 << 20
    _one_error_line(check(layout, env={"SEEDANCE_IMAGE_MAX_FILE_BYTES": str(32 << 20)})[0],
                    "cap: bytes per file")


@pytest.mark.parametrize("variable,cap_word", [("SEEDANCE_IMAGE_MAX_FILE_BYTES", "cap: bytes per file"),
                                               ("SEEDANCE_IMAGE_MAX_TOTAL_BYTES", "cap: total bytes"),
                                               ("SEEDANCE_IMAGE_MAX_ENTRIES", "cap: entries")])
def test_each_cap_at_its_edge(tmp_path, variable, cap_word):
    entries = [("a", "file", b"x" * 1000, 0o644), ("b", "file", b"y" * 1000, 0o644),
               ("c", "link", "a", 0o777)]
    layout = tmp_path / "edge"
    write_layout(layout, [entries], entrypoint=())
    edge = {"SEEDANCE_IMAGE_MAX_FILE_BYTES": 1000, "SEEDANCE_IMAGE_MAX_TOTAL_BYTES": 2000,
            "SEEDANCE_IMAGE_MAX_ENTRIES": 3}[variable]
    proc, _report = check(layout, env={variable: str(edge)})
    assert proc.returncode == 0, proc.stderr
    _one_error_line(check(layout, env={variable: str(edge - 1)})[0], cap_word)


# --- podman: oci-archive, docker-archive, and the oracle ---------------------------------------
def _podman_works() -> bool:
    if shutil.which("podman") is None:
        return False
    return subprocess.run(["podman", "info"], capture_output=True, timeout=60).returncode == 0


podman = pytest.mark.skipif(not _podman_works(), reason="podman does not run here")


def _podman_image(tmp_path, name, layer_entries) -> str:
    tar = tmp_path / f"{name}.tar"
    merged = []
    for entries in layer_entries:
        merged.extend(entries)
    removed = {e[0].replace(".wh.", "") for e in merged if ".wh." in e[0]}
    tar.write_bytes(_tar([e for e in merged if ".wh." not in e[0] and e[0] not in removed]))
    tag = f"localhost/seedance-test-{name}:latest"
    subprocess.run(["podman", "import", "--change", 'ENTRYPOINT ["/usr/bin/app"]', str(tar), tag],
                   check=True, capture_output=True, timeout=120)
    return tag


@podman
@pytest.mark.parametrize("fmt", ["oci-archive", "docker-archive"])
def test_podman_archives_agree_with_podman_run(tmp_path, parts, fmt):
    healthy = _podman_image(tmp_path, "healthy", [base_layer(parts), app_layer(parts)])
    broken = _podman_image(tmp_path, "whiteout", [base_layer(parts), app_layer(parts),
                                                  [("usr/lib/x86_64-linux-gnu/.wh.libgreet.so", "file", b"", 0o644)]])
    try:
        for tag, expect in ((healthy, 0), (broken, 1)):
            archive = tmp_path / f"{tag.split('/')[-1].replace(':', '-')}-{fmt}.tar"
            subprocess.run(["podman", "save", "--format", fmt, "-o", str(archive), tag],
                           check=True, capture_output=True, timeout=120)
            proc, report = check(archive)
            assert proc.returncode == expect, proc.stderr + proc.stdout
            run = subprocess.run(["podman", "run", "--rm", "--runtime", "/usr/sbin/runc", "--network=none",
                                  "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=512:512",  # lowering needs no privilege; raising may be refused
                                  tag], capture_output=True, text=True, timeout=120)
            if expect == 0:
                assert run.returncode == 0 and "greet=42" in run.stdout, run.stderr
                assert report["findings"] == []
            else:
                # the real loader refuses the program for the very library the check names
                assert run.returncode != 0 and "libgreet.so" in run.stderr, run.stderr
                assert any(f["rule"] == "needed-unresolved" and "libgreet.so" in f["message"]
                           for f in report["findings"])
    finally:
        subprocess.run(["podman", "rmi", "-f", healthy, broken], capture_output=True, timeout=120)
