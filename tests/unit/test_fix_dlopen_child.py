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
