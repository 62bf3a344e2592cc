"""verify()'s oracle: a fresh process that dlopens one path with RTLD_NOW (issue 13: started
ahead, it waits for the path).  Oracles: ctypes in this process for a library that loads,
the loader's own message for one that does not."""
import ctypes
import os
import sysconfig
from pathlib import Path

import pytest

from seedance.fix.relink import DlopenChild, dlopen_in_child

LIBZ = next((p for p in (Path("/usr/lib/x86_64-linux-gnu/libz.so.1"), Path("/lib/x86_64-linux-gnu/libz.so.1"))
             if p.exists()), None)


@pytest.mark.skipif(LIBZ is None, reason="needs libz.so.1")
def test_a_child_started_ahead_loads_the_path_it_is_given_later():
    ctypes.CDLL(str(LIBZ), mode=os.RTLD_NOW)  # the oracle: it loads here too
    child = DlopenChild(dict(os.environ))
    assert child.load(str(LIBZ)) == ""
    assert child.proc.returncode == 0


def test_a_path_that_does_not_load_gives_the_loaders_message(tmp_path):
    missing = tmp_path / "libnothere.so"
    with pytest.raises(OSError) as oracle:
        ctypes.CDLL(str(missing), mode=os.RTLD_NOW)
    message = dlopen_in_child(str(missing), dict(os.environ))
    assert message and str(missing) in message and str(missing) in str(oracle.value)
    not_elf = tmp_path / "libtext.so"
    not_elf.write_text("not a library\n")
    assert "libtext.so" in dlopen_in_child(str(not_elf), dict(os.environ))


def test_an_unused_child_ends_on_close_and_a_second_path_is_refused():
    child = DlopenChild(dict(os.environ))
    child.close()
    assert child.proc.returncode == 0  # EOF on its input: it loaded nothing and exited
    with pytest.raises(ValueError):
        child.send("/nonexistent")


def test_kill_ends_a_child_mid_load():
    lib = Path(sysconfig.get_paths()["purelib"]) / "torch" / "lib" / "libtorch_cpu.so"
    child = DlopenChild(dict(os.environ))
    child.send(str(lib if lib.exists() else "/nonexistent"))
    child.kill()
    assert child.proc.returncode is not None


# --- the zygote: forked early, one forked child per path ------------------------------------

from seedance.fix.dlopen_child import DlopenZygote  # noqa: E402


def gcc(out: Path, source: str, *args) -> Path:
    src = out.parent / (out.name + ".c")
    src.write_text(source)
    import subprocess
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src), *args], check=True)
    return out


@pytest.fixture
def dep_and_user(tmp_path):
    """libdep.so in its own directory, and libuser.so that needs it with no path to find it."""
    (tmp_path / "dep").mkdir()
    dep = gcc(tmp_path / "dep" / "libdep.so", "int dep(void){return 7;}\n", "-Wl,-soname,libdep.so")
    user = gcc(tmp_path / "libuser.so", "int dep(void);\nint user(void){return dep();}\n",
               f"-L{tmp_path / 'dep'}", "-l:libdep.so")
    return dep, user


@pytest.fixture
def zygote():
    z = DlopenZygote()
    yield z
    z.close()


@pytest.mark.skipif(LIBZ is None, reason="needs libz.so.1")
def test_the_zygote_gives_a_fresh_processs_verdicts(zygote, tmp_path):
    assert zygote.load(str(LIBZ)) == "" == dlopen_in_child(str(LIBZ), dict(os.environ))
    missing = tmp_path / "libnothere.so"
    with pytest.raises(OSError) as oracle:
        ctypes.CDLL(str(missing), mode=os.RTLD_NOW)
    assert zygote.load(str(missing)) == dlopen_in_child(str(missing), dict(os.environ)) == str(oracle.value)


def test_each_path_is_loaded_in_a_child_of_its_own(zygote, dep_and_user):
    dep, user = dep_and_user
    assert zygote.load(str(dep)) == ""
    # had the first check's child stayed, libdep.so would be loaded and libuser.so would load
    message = zygote.load(str(user))
    assert "libdep.so" in message and "cannot open shared object file" in message
    assert message == dlopen_in_child(str(user), dict(os.environ))


def test_a_library_the_zygote_holds_is_named_as_shadowing(dep_and_user):
    dep, user = dep_and_user
    ctypes.CDLL(str(dep), mode=os.RTLD_NOW)  # this process holds it: a zygote forked now inherits it
    z = DlopenZygote()
    try:
        assert z.load(str(user)) == ""  # masked: a fresh process cannot load it
        assert "cannot open shared object file" in dlopen_in_child(str(user), dict(os.environ))
        assert z.shadowed([("libdep.so", None)]) == ["libdep.so"]  # what verify() asks before trusting it
        assert z.shadowed([("libdep.so", str(dep))]) == []  # the same file a search finds: no difference
        assert z.shadowed([("libother.so.1", None)]) == []
    finally:
        z.close()


def test_the_zygote_serves_only_its_own_environment():
    zygote = DlopenZygote()  # here, not in a fixture: pytest sets PYTEST_CURRENT_TEST per phase
    try:
        env = dict(os.environ)
        assert zygote.usable_for(env)
        # ld.so read LD_LIBRARY_PATH when this process started: the zygote cannot take another
        assert not zygote.usable_for({**env, "LD_LIBRARY_PATH": "/elsewhere"})
        assert not zygote.usable_for({**env, "CUDA_VISIBLE_DEVICES": "7"})  # a constructor may read it
    finally:
        zygote.close()


def test_a_load_that_never_returns_is_killed_with_the_zygote(zygote, tmp_path):
    stuck = gcc(tmp_path / "libstuck.so", "#include <unistd.h>\n"
                "__attribute__((constructor)) static void hang(void){ for(;;) pause(); }\n")
    zygote.send(str(stuck))
    assert "did not return within" in zygote.result(timeout=1)
    assert zygote.pid == 0 and zygote.error  # reaped, and it serves no more
    with pytest.raises(ValueError):
        zygote.send(str(stuck))


def test_a_constructor_that_crashes_is_a_failed_load(zygote, tmp_path):
    crash = gcc(tmp_path / "libcrash.so", "#include <signal.h>\n"
                "__attribute__((constructor)) static void die(void){ raise(SIGSEGV); }\n")
    assert "signal 11" in zygote.load(str(crash))
    assert dlopen_in_child(str(crash), dict(os.environ)) != ""  # the fresh process fails too
    if LIBZ is not None:
        assert zygote.load(str(LIBZ)) == ""  # the zygote itself lives on
