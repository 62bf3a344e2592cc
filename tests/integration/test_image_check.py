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


# --- the image's Python, read statically (collect/python_static.py) -----------------------------
VENV_NVIDIA = Path(__file__).resolve().parents[2] / ".venv/lib/python3.11/site-packages/nvidia"
SITE = "usr/local/lib/python3.11/site-packages"
EXT = ".cpython-311-x86_64-linux-gnu.so"


@pytest.fixture(scope="module")
def python_parts(tmp_path_factory, parts) -> dict:
    """A Python installation's files: an interpreter that would leave a marker if it were ever
    run, NVIDIA's real CUDA runtime wheel library, a torch (libc10, libtorch_python and a
    libtorch_cuda that needs the wheel's libcudart with no search path, as torch relies on
    _load_global_deps), an extension that needs torch's libc10, one that needs a library
    nowhere in the image."""
    cudart = VENV_NVIDIA / "cuda_runtime/lib/libcudart.so.12"
    if not cudart.is_file():
        pytest.skip("the venv has no nvidia-cuda-runtime-cu12 wheel")
    tmp = tmp_path_factory.mktemp("python-parts")
    marker = tmp / "interpreter-was-run"
    shlib = ("-shared", "-fPIC")
    c10 = _gcc(tmp, "libc10.so", "int c10_answer(void) { return 42; }\n", *shlib, "-Wl,-soname,libc10.so")
    torch_python = _gcc(tmp, "libtorch_python.so", "int c10_answer(void);\nint tp(void) { return c10_answer(); }\n",
                        *shlib, "-Wl,-soname,libtorch_python.so", f"-L{tmp}", "-lc10", "-Wl,-rpath,$ORIGIN")
    torch_cuda = _gcc(tmp, "libtorch_cuda.so", "int tc(void) { return 1; }\n", *shlib,
                      "-Wl,-soname,libtorch_cuda.so", "-Wl,--no-as-needed", str(cudart))
    ext_ok = _gcc(tmp, "ok.so", "int c10_answer(void);\nint ok(void) { return c10_answer(); }\n", *shlib,
                  f"-L{tmp}", "-lc10")
    missing_lib = _gcc(tmp, "libmissing.so.1", "int gone(void) { return 0; }\n", *shlib, "-Wl,-soname,libmissing.so.1")
    (tmp / "libmissing.so").write_bytes(missing_lib)
    ext_broken = _gcc(tmp, "broken.so", "int gone(void);\nint broken(void) { return gone(); }\n", *shlib,
                      f"-L{tmp}", "-lmissing")
    python = _gcc(tmp, "python3.11", "#include <stdio.h>\nint main(void) { FILE *f = fopen(\"%s\", \"w\"); "
                  "if (f) fclose(f); return 0; }\n" % marker, f"-Wl,--dynamic-linker,{RTLD}")
    # the wheel's libcudart still names glibc's compatibility stubs (libdl, libpthread, librt)
    libc_dir = Path(_libc_path()).parent
    stubs = {name: _host_file(str(libc_dir / name)) for name in ("libdl.so.2", "libpthread.so.0", "librt.so.1")
             if (libc_dir / name).exists()}
    if len(stubs) < 3:
        pytest.skip("this host's glibc has no libdl/libpthread/librt to put in the image")
    return {"marker": marker, "cudart": cudart.read_bytes(), "stubs": stubs, "c10": c10, "torch_python": torch_python,
            "torch_cuda": torch_cuda, "ext_ok": ext_ok, "ext_broken": ext_broken, "python": python}


def python_layer(pp, site=SITE, broken=True) -> list:
    dirs = ["usr/local", "usr/local/bin", "usr/local/lib", "usr/local/lib/python3.11", site,
            f"{site}/nvidia", f"{site}/nvidia/cuda_runtime", f"{site}/nvidia/cuda_runtime/lib",
            f"{site}/torch", f"{site}/torch/lib", f"{site}/mypkg"]
    entries = [(d, "dir", None, 0o755) for d in dirs]
    entries += [(f"usr/lib/x86_64-linux-gnu/{name}", "file", data, 0o755) for name, data in pp["stubs"].items()]
    entries += [("usr/local/bin/python3.11", "file", pp["python"], 0o755),
                ("usr/local/bin/python3", "link", "python3.11", 0o777),
                (f"{site}/nvidia/cuda_runtime/lib/libcudart.so.12", "file", pp["cudart"], 0o755),
                (f"{site}/torch/__init__.py", "file", b"", 0o644),
                (f"{site}/torch/version.py", "file", b"__version__ = '2.5.1+cu124'\ncuda = '12.4'\n", 0o644),
                (f"{site}/torch/lib/libc10.so", "file", pp["c10"], 0o755),
                (f"{site}/torch/lib/libtorch_python.so", "file", pp["torch_python"], 0o755),
                (f"{site}/torch/lib/libtorch_cuda.so", "file", pp["torch_cuda"], 0o755),
                (f"{site}/mypkg/__init__.py", "file", b"", 0o644),
                (f"{site}/mypkg/_ok{EXT}", "file", pp["ext_ok"], 0o755)]
    if broken:
        entries.append((f"{site}/mypkg/_broken{EXT}", "file", pp["ext_broken"], 0o755))
    return entries


def test_image_python_site_packages_are_judged_statically(tmp_path, parts, python_parts):
    layout = tmp_path / "python"
    digests = write_layout(layout, [base_layer(parts), python_layer(python_parts)], entrypoint=())
    proc, report = check(layout)
    assert proc.returncode == 1, proc.stderr + proc.stdout
    python = report["scope"]["python"]
    assert python["interpreter"] == "/usr/local/bin/python3" and python["found_by"] == "PATH"
    assert python["canonical"] == "/usr/local/bin/python3.11"
    assert python["version"] == "3.11" and python["version_from"] == "the file name python3.11"
    assert python["site_dirs"] == ["/" + SITE]
    # torch's libtorch_cuda finds the wheel's libcudart only because torch loads it first, and
    # _ok finds libc10 only after `import torch`: neither is a loader error; _broken is
    missing = [f for f in report["findings"] if f["rule"] == "needed-unresolved"]
    assert [f["subject"]["image_path"] for f in missing] == [f"/{SITE}/mypkg/_broken{EXT}"], missing
    assert missing[0]["subject"]["layer"] == digests[1]
    assert "`import mypkg._broken` in the image's /usr/local/bin/python3 (Python 3.11)" in missing[0]["message"]
    assert "libmissing.so" in missing[0]["message"]
    assert not python_parts["marker"].exists()  # the image's interpreter was never started


def test_image_python_named_with_python_flag(tmp_path, parts, python_parts):
    layout = tmp_path / "python-flag"
    write_layout(layout, [base_layer(parts), python_layer(python_parts, broken=False)], entrypoint=())
    proc, report = check(layout, "--python", "/usr/local/bin/python3.11")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    # only the note that torch loads the wheel's libcudart for its libtorch_cuda
    assert [(f["rule"], f["subject"]["image_path"]) for f in report["findings"]] == [
        ("needed-via-loader", f"/{SITE}/torch/lib/libtorch_cuda.so")]
    assert "_load_global_deps" in report["findings"][0]["message"]
    assert report["scope"]["python"]["found_by"] == "--python"
    assert not python_parts["marker"].exists()
    _one_error_line(check(layout, "--python", "/usr/bin/python9")[0], "--python /usr/bin/python9",
                    "no such file in the image")


def test_image_venv_python_reads_pyvenv_cfg(tmp_path, parts, python_parts):
    """A venv on the Env's PATH: its version from pyvenv.cfg, its own site-packages only."""
    venv_site = "opt/venv/lib/python3.11/site-packages"
    layer = python_layer(python_parts, site=venv_site, broken=False)
    layer = [e for e in layer if e[0] != "usr/local/bin/python3"] + [
        ("opt", "dir", None, 0o755), ("opt/venv", "dir", None, 0o755), ("opt/venv/bin", "dir", None, 0o755),
        ("opt/venv/lib", "dir", None, 0o755),
        ("opt/venv/bin/python", "link", "/usr/local/bin/python3.11", 0o777),
        ("opt/venv/pyvenv.cfg", "file", b"home = /usr/local/bin\ninclude-system-site-packages = false\n"
                                        b"version = 3.11.9\n", 0o644)]
    layout = tmp_path / "venv"
    write_layout(layout, [base_layer(parts), layer], entrypoint=())
    config = json.loads(next(p for p in (layout / "blobs/sha256").iterdir()
                             if b'"rootfs"' in p.read_bytes()[:4096]).read_bytes())
    assert config["config"]["Env"] == ["PATH=/usr/local/bin:/usr/bin:/bin"]
    proc, report = check(layout, "--python", "/opt/venv/bin/python")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    python = report["scope"]["python"]
    assert python["venv"] is True and python["version_from"] == "pyvenv.cfg"
    assert python["site_dirs"] == ["/" + venv_site]


# --- CUDA forward compatibility: the image's cuda-compat against the host's driver -------------
@pytest.fixture(scope="module")
def cuda_parts(tmp_path_factory, parts, python_parts) -> dict:
    tmp = tmp_path_factory.mktemp("cuda-parts")
    cudart = tmp / "libcudart.so.12"
    cudart.write_bytes(python_parts["cudart"])
    app = _gcc(tmp, "cuda-app", "int main(void) { return 0; }\n", "-Wl,--no-as-needed", str(cudart),
               f"-Wl,--dynamic-linker,{RTLD}")
    compat = _gcc(tmp, "libcuda.so.550.54.15", "int cuInit(unsigned f) { return 0; }\n", "-shared", "-fPIC",
                  "-Wl,-soname,libcuda.so.1")
    return {"app": app, "cudart": python_parts["cudart"], "compat": compat, "stubs": python_parts["stubs"]}


def cuda_layer(cp, compat=True, toolkit_link=True) -> list:
    entries = [("usr/local", "dir", None, 0o755), ("usr/local/cuda-12.4", "dir", None, 0o755),
               ("usr/local/cuda-12.4/lib64", "dir", None, 0o755),
               ("usr/local/cuda-12.4/lib64/libcudart.so.12", "file", cp["cudart"], 0o755),
               ("usr/bin/cuda-app", "file", cp["app"], 0o755),
               ("etc", "dir", None, 0o755), ("etc/ld.so.conf.d", "dir", None, 0o755)]
    entries += [(f"usr/lib/x86_64-linux-gnu/{name}", "file", data, 0o755) for name, data in cp["stubs"].items()]
    if toolkit_link:
        entries.append(("usr/local/cuda", "link", "cuda-12.4", 0o777))
    if compat:  # as NVIDIA's cuda-compat-12-4 package installs it
        entries += [("usr/local/cuda-12.4/compat", "dir", None, 0o755),
                    ("usr/local/cuda-12.4/compat/libcuda.so.550.54.15", "file", cp["compat"], 0o755),
                    ("usr/local/cuda-12.4/compat/libcuda.so.1", "link", "libcuda.so.550.54.15", 0o777)]
    return entries


def _cuda_image(tmp_path, parts, cp, name, **kw) -> Path:
    layout = tmp_path / name
    write_layout(layout, [base_layer(parts), cuda_layer(cp, **kw)], entrypoint=("/usr/bin/cuda-app",))
    return layout


def _check_cuda(layout, driver, *extra):
    # the runtime is found in the image through LD_LIBRARY_PATH as the CUDA images set it
    config_env = ["PATH=/usr/local/bin:/usr/bin:/bin", "LD_LIBRARY_PATH=/usr/local/cuda/lib64"]
    _set_env(layout, config_env)
    return check(layout, "--driver-version", driver, *extra)


def _set_env(layout: Path, env: list) -> None:
    """Rewrite the layout's config with another Env (and the manifest and index that name it)."""
    index = json.loads((layout / "index.json").read_text())
    manifest_path = layout / "blobs/sha256" / index["manifests"][0]["digest"].split(":")[1]
    manifest = json.loads(manifest_path.read_bytes())
    config = json.loads((layout / "blobs/sha256" / manifest["config"]["digest"].split(":")[1]).read_bytes())
    config["config"]["Env"] = env
    data = json.dumps(config).encode()
    manifest["config"] = dict(manifest["config"], digest=_blob(layout, data), size=len(data))
    data = json.dumps(manifest).encode()
    index["manifests"][0] = dict(index["manifests"][0], digest=_blob(layout, data), size=len(data))
    (layout / "index.json").write_text(json.dumps(index))


def _by_rule(report, rule) -> list:
    return [f for f in report["findings"] if f["rule"] == rule]


def test_forward_compat_bridges_an_ltsb_driver_on_datacenter_gpus_only(tmp_path, parts, cuda_parts):
    layout = _cuda_image(tmp_path, parts, cuda_parts, "compat")
    proc, report = _check_cuda(layout, "470.82.01")  # R470, a Long Term Support Branch, CUDA 11.4
    assert not _by_rule(report, "cuda-driver-too-old"), report["findings"]
    bridged = _by_rule(report, "image-cuda-forward-compat")
    assert len(bridged) == 1 and bridged[0]["severity"] == "warning"
    assert bridged[0]["subject"]["image_path"] == "/usr/bin/cuda-app"
    assert "only on data center GPUs" in bridged[0]["message"]
    evidence = bridged[0]["evidence"]
    assert evidence["compat_version"] == "550.54.15" and evidence["loaded_by"] == "toolkit hook"
    assert evidence["compat_dir"] == "/usr/local/cuda-12.4/compat" and evidence["host_branch"] == 470
    assert "525.60.13" in bridged[0]["fix"]
    assert report["scope"]["cuda_compat"]["version"] == "550.54.15"
    # a host driver that meets the floor itself: the compat library plays no part
    proc, report = _check_cuda(layout, "550.54.15")
    assert not _by_rule(report, "image-cuda-forward-compat") and not _by_rule(report, "cuda-driver-too-old")


def test_forward_compat_on_a_new_feature_branch_does_not_help(tmp_path, parts, cuda_parts):
    layout = _cuda_image(tmp_path, parts, cuda_parts, "compat-nfb")
    proc, report = _check_cuda(layout, "495.29.05")  # R495: a New Feature Branch
    assert proc.returncode == 1
    assert _by_rule(report, "cuda-driver-too-old")
    unusable = _by_rule(report, "image-cuda-compat-unusable")
    assert len(unusable) == 1 and "branch 495 is not a Long Term Support or Production branch" in unusable[0]["message"]
    assert not _by_rule(report, "image-cuda-forward-compat")


def test_without_compat_libs_the_driver_floor_stands(tmp_path, parts, cuda_parts):
    layout = _cuda_image(tmp_path, parts, cuda_parts, "no-compat", compat=False)
    proc, report = _check_cuda(layout, "470.82.01")
    assert proc.returncode == 1
    too_old = _by_rule(report, "cuda-driver-too-old")
    assert [f["subject"]["image_path"] for f in too_old] == ["/usr/bin/cuda-app"]
    assert not _by_rule(report, "image-cuda-forward-compat") and not _by_rule(report, "image-cuda-compat-unusable")
    assert report["scope"]["cuda_compat"] is None


def test_compat_libs_nothing_loads_do_not_help(tmp_path, parts, cuda_parts):
    """cuda-12.4/compat with no /usr/local/cuda link and not on LD_LIBRARY_PATH: ld.so never sees it."""
    layout = _cuda_image(tmp_path, parts, cuda_parts, "compat-unreached", toolkit_link=False)
    _set_env(layout, ["PATH=/usr/bin:/bin", "LD_LIBRARY_PATH=/usr/local/cuda-12.4/lib64"])
    proc, report = check(layout, "--driver-version", "470.82.01")
    assert proc.returncode == 1
    assert _by_rule(report, "cuda-driver-too-old")
    unusable = _by_rule(report, "image-cuda-compat-unusable")
    assert unusable and "nothing puts /usr/local/cuda-12.4/compat on the loader's path" in unusable[0]["message"]


# --- a multi-platform index ------------------------------------------------------------------
def write_index(root: Path, images: dict) -> dict:
    """An OCI layout whose index lists one manifest per platform ("linux/amd64": layers);
    platform -> the digests of its layers."""
    root.mkdir(parents=True)
    (root / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    manifests, layers_of = [], {}
    for platform, layer_entries in images.items():
        os_name, arch = platform.split("/")
        descs, diff_ids = [], []
        for entries in layer_entries:
            tar = _tar(entries)
            data, media = _compress(tar, "gzip")
            descs.append({"mediaType": media, "digest": _blob(root, data), "size": len(data)})
            diff_ids.append("sha256:" + hashlib.sha256(tar).hexdigest())
        config = json.dumps({"architecture": arch, "os": os_name, "config": {"Env": ["PATH=/usr/bin:/bin"]},
                             "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
        manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                          "digest": _blob(root, config), "size": len(config)},
                               "layers": descs}).encode()
        manifests.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": _blob(root, manifest),
                          "size": len(manifest), "platform": {"architecture": arch, "os": os_name}})
        layers_of[platform] = [d["digest"] for d in descs]
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": manifests}))
    return layers_of


def test_platform_picks_the_manifest_of_a_multi_platform_index(tmp_path, parts):
    layout = tmp_path / "multi"
    # arm64 listed first: the default must still pick amd64, not the first entry
    layers_of = write_index(layout, {"linux/arm64": [[("etc", "dir", None, 0o755),
                                                     ("etc/arm64", "file", b"arm64\n", 0o644)]],
                                     "linux/amd64": [base_layer(parts), app_layer(parts)]})
    proc, report = check(layout)
    assert proc.returncode == 0, proc.stderr
    assert report["scope"]["platform"] == "linux/amd64" and report["scope"]["layers"] == layers_of["linux/amd64"]
    proc, report = check(layout, "--platform", "linux/arm64")
    assert proc.returncode == 0, proc.stderr
    assert report["scope"]["platform"] == "linux/arm64" and report["scope"]["layers"] == layers_of["linux/arm64"]
    line = _one_error_line(check(layout, "--platform", "linux/s390x")[0], "no manifest for platform linux/s390x")
    assert "linux/amd64" in line and "linux/arm64" in line
