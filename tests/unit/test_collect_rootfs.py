"""Paths resolved inside a foreign root never reach a host file through a symlink.

Each test runs twice: with openat2(RESOLVE_IN_ROOT) where this kernel has it, and with the
component-by-component walk that stands in for it on older kernels.
"""
import errno
import os

import pytest

from seedance.collect import rootfs


@pytest.fixture(params=["kernel", "walk"])
def mode(request, monkeypatch):
    if request.param == "walk":
        monkeypatch.setattr(rootfs, "_openat2", False)
    elif not rootfs.kernel_resolves():
        pytest.skip("openat2(RESOLVE_IN_ROOT) is not available on this kernel (the walk case runs)")
    return request.param


@pytest.fixture
def tree(tmp_path):
    """A root holding hostile links, and a host secret beside it that must stay unread."""
    secret = tmp_path / "hostsecret"
    secret.write_text("HOST-ONLY-MARKER\n")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "etc" / "hostsecret").write_text("in-root copy\n")
    (root / "lib" / "libreal.so.1").write_bytes(b"\x7fELF in root")
    (root / "lib" / "libz.so.1").symlink_to("libreal.so.1")
    (root / "lib" / "abs.so").symlink_to("/lib/libreal.so.1")
    # an absolute link to the host file's real host path: inside the root it names nothing
    (root / "etc" / "evil-link").symlink_to(str(secret))
    (root / "etc" / "climb").symlink_to("../../../../../../" + str(secret).lstrip("/"))
    (root / "etc" / "to-etc").symlink_to("/etc/hostsecret")
    (root / "usr").symlink_to("/")  # a usrmerge-style link to the root itself
    (root / "loop").symlink_to("loop")
    return root, secret


def test_absolute_link_is_rerooted(mode, tree):
    root, secret = tree
    with pytest.raises(FileNotFoundError):
        rootfs.read(str(root), "/etc/evil-link")
    assert rootfs.read(str(root), "/etc/to-etc") == b"in-root copy\n"
    assert rootfs.read(str(root), "/lib/abs.so") == b"\x7fELF in root"
    assert rootfs.read(str(root), "/usr/lib/libz.so.1") == b"\x7fELF in root"


def test_dotdot_stops_at_the_root(mode, tree):
    root, _secret = tree
    with pytest.raises(FileNotFoundError):
        rootfs.read(str(root), "/etc/climb")
    assert rootfs.read(str(root), "/../../../etc/hostsecret") == b"in-root copy\n"


def test_realpath_and_host_path(mode, tree):
    root, _secret = tree
    assert rootfs.realpath(str(root), "/usr/lib/libz.so.1") == "/lib/libreal.so.1"
    assert rootfs.realpath(str(root), "/etc/to-etc") == "/etc/hostsecret"
    assert rootfs.realpath(str(root), "/lib/missing/x.so") == "/lib/missing/x.so"
    with pytest.raises(FileNotFoundError):
        rootfs.realpath(str(root), "/lib/missing.so", strict=True)
    assert rootfs.host_path(str(root), "/usr/lib/abs.so") == f"{root}/lib/libreal.so.1"
    # the escaping link names a path inside the root, never the host file
    assert rootfs.host_path(str(root), "/etc/evil-link").startswith(f"{root}/")


def test_link_hops_are_capped_as_the_kernel_does(mode, tmp_path):
    root = tmp_path / "r"
    root.mkdir()
    (root / "target").write_text("end")
    # a chain of exactly 40 links resolves; 41 is ELOOP (MAXSYMLINKS)
    for n in range(1, 42):
        (root / f"l{n}").symlink_to("target" if n == 1 else f"l{n - 1}")
    assert rootfs.read(str(root), "/l40") == b"end"
    with pytest.raises(OSError) as caught:
        rootfs.read(str(root), "/l41")
    assert caught.value.errno == errno.ELOOP


def test_loop_and_stat_and_listdir(mode, tree):
    root, _secret = tree
    with pytest.raises(OSError) as caught:
        rootfs.stat(str(root), "/loop")
    assert caught.value.errno == errno.ELOOP
    assert rootfs.stat(str(root), "/loop", follow=False).st_mode & 0o170000 == 0o120000
    assert sorted(rootfs.listdir(str(root), "/usr/lib")) == ["abs.so", "libreal.so.1", "libz.so.1"]
    assert rootfs.readlink(str(root), "/usr/lib/abs.so") == "/lib/libreal.so.1"
    assert rootfs.exists(str(root), "/usr/usr/usr/lib/libz.so.1")
    assert not rootfs.exists(str(root), "/etc/evil-link")


def test_caps(mode, tree):
    root, _secret = tree
    (root / "big").write_bytes(b"x" * 100)
    assert rootfs.read(str(root), "/big", limit=100) == b"x" * 100
    with pytest.raises(OSError) as caught:
        rootfs.read(str(root), "/big", limit=99)
    assert caught.value.errno == errno.EFBIG
    with pytest.raises(OSError) as caught:
        rootfs.listdir(str(root), "/lib", limit=2)
    assert caught.value.errno == errno.E2BIG


def test_root_given_as_fd(mode, tree):
    root, _secret = tree
    fd = os.open(str(root), os.O_PATH | os.O_DIRECTORY)
    try:
        with rootfs.Root(fd) as handle:
            assert handle.read("/etc/to-etc") == b"in-root copy\n"
        os.fstat(fd)  # a root given as a fd stays the caller's
    finally:
        os.close(fd)


def test_proc_pid_root_of_ourselves(mode):
    """/proc/PID/root is followed as the root itself (it is a magic link)."""
    assert rootfs.read(f"/proc/{os.getpid()}/root", "/proc/self/../self/comm")
