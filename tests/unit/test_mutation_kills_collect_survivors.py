"""Kill tests for two survivors of the collect sample of seed 2027 that were explained but not
killed (issue 17, bench/mutation-survivors.md "agent/collect, third session"):

- python_env._Finder._meta_path 32: the error handler of the decode of the child interpreter's
  output.  The child prints a repr() on its last line, but everything the interpreter printed
  before it (a sitecustomize's banner) comes back too, in the encoding PYTHONIOENCODING names.
- scan.Scanner._root 50: the error record of a root the scan reads but cannot judge for an
  OSError.  Both ELF readers turn open(2)'s refusals into ELFError (the other branch, also
  tested here: a root made private after the walk, read as nobody); an OSError comes from
  the loader model itself, as getcwd's ENOENT for a relative root checked from a directory
  removed meanwhile.

Oracles, never the module itself: the real interpreter (its own import of the module, and the
raw bytes it writes), the real kernel (open(2) as nobody, getcwd(2) in a removed directory), gcc
for the ELF file.
"""
from __future__ import annotations

import ast
import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from seedance.collect import python_env
from seedance.collect.scan import CheckOptions, run_check

NOBODY = 65534

# --- python_env: the meta-path lookup's child under a non-UTF-8 PYTHONIOENCODING ---------------

# What a site's start-up code does (setuptools' editable installs, a cluster's module system):
# install a meta-path finder for a name no sys.path directory holds, and say hello on stdout.
SITECUSTOMIZE = '''\
import importlib.util, sys

class _SiteTools:
    def find_spec(self, name, path=None, target=None):
        if name == "seedance_site_tool":
            return importlib.util.spec_from_file_location(name, {impl!r})
        return None

sys.meta_path.append(_SiteTools())
print("Environnement de calcul charg\\u00e9")
'''


def test_a_meta_path_module_found_past_a_banner_in_latin_1(tmp_path):
    """PYTHONIOENCODING=latin-1 (a legacy host's setting, inherited by the interpreter asked)
    turns the banner's é into the single byte 0xe9, which is not UTF-8.  The spec on the last
    line is still read: the module the real interpreter imports from the finder's file."""
    site, impl = tmp_path / "site", tmp_path / "impl" / "seedance_site_tool.py"
    site.mkdir()
    impl.parent.mkdir()
    impl.write_text("VALUE = 1\n")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(impl=str(impl)))
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONIOENCODING": "latin-1", "PYTHONDONTWRITEBYTECODE": "1"}

    # the real interpreter in this environment: the banner's bytes, and where the import lands
    proc = subprocess.run([sys.executable, "-c", "import seedance_site_tool as m\n"
                           "print(ascii((m.__file__, hasattr(m, '__path__'))))"],
                          capture_output=True, env=env, stdin=subprocess.DEVNULL, check=True)
    banner, last = proc.stdout.rstrip(b"\n").split(b"\n")
    assert banner == b"Environnement de calcul charg\xe9"
    with pytest.raises(UnicodeDecodeError):
        proc.stdout.decode("utf-8")  # what the product must read without a strict decode
    origin, is_package = ast.literal_eval(last.decode("ascii"))
    assert (origin, is_package) == (str(impl), False)

    interp = python_env.ask_interpreter(sys.executable, env=env)
    assert str(impl.parent) not in interp.path  # only the finder knows the name
    finder = python_env._Finder(interp)
    assert finder.find("seedance_site_tool", None) == python_env._Spec("seedance_site_tool", "source", origin, ())
    assert finder._meta_path("seedance_site_tool") == python_env._Spec("seedance_site_tool", "source", origin, ())


# --- scan: the error records of roots that cannot be judged -----------------------------------

def _forked(work, *, as_nobody=False, then=None) -> str:
    """``work(signal)`` in a forked copy of this test (dropped to nobody when asked), so that
    what it changes (its identity, its working directory) stays there; ``signal()`` hands over
    to ``then()`` in this process and waits for it to finish.  Returns ``work``'s answer, or
    the exception it raised as text.  (The practice tests' as_nobody() has no hand-over.)"""
    to_parent, from_child = os.pipe()
    to_child, from_parent = os.pipe()
    pid = os.fork()
    if pid == 0:
        answer = ""
        try:
            os.close(to_parent)
            os.close(from_parent)
            if as_nobody:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)

            def signal():
                os.write(from_child, b"go\n")
                os.read(to_child, 3)

            answer = work(signal)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            answer = "raised " + type(exc).__name__ + ": " + str(exc)
        try:
            os.write(from_child, b"=" + answer.encode(errors="replace"))
        finally:
            os._exit(0)
    os.close(from_child)
    os.close(to_child)
    try:
        with os.fdopen(to_parent, "rb") as pipe:
            head = pipe.read(3)
            if head == b"go\n":
                try:
                    if then is not None:
                        then()
                finally:
                    os.write(from_parent, b"ok\n")
                head = pipe.read(1)
            answer = head[1:] + pipe.read()
    finally:
        os.close(from_parent)
        os.waitpid(pid, 0)
    return answer.decode(errors="replace")


class _HandOver:
    """check's progress: its start() comes after the walk listed the roots, before any is read."""

    def __init__(self, signal):
        self.signal = signal

    def start(self, total, label=None):
        self.signal()

    def advance(self, step=1, note=""):
        pass

    def finish(self):
        pass


def _scan_answer(stats) -> str:
    return json.dumps([stats["elf_objects"], stats["unreadable"], stats["errors"]])


@pytest.fixture
def lib_tree():
    """A directory anyone may enter (pytest's tmp_path lies under a 0700 directory of root's)
    holding one gcc-built shared library, mode 0644, and an empty directory beside it."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not installed")
    top = Path(tempfile.mkdtemp(prefix="seedance-roots-"))
    try:
        os.chmod(top, 0o755)
        (top / "lib").mkdir()
        (top / "work").mkdir()
        (top / "p.c").write_text("int private_answer(void) { return 42; }\n")
        lib = top / "lib" / "libanswer.so"
        subprocess.run([gcc, "-shared", "-fPIC", "-o", str(lib), str(top / "p.c")], check=True, capture_output=True)
        os.chmod(lib, 0o644)
        yield top, lib
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_root_checked_from_a_removed_directory_is_an_error_record(lib_tree):
    """`seedance check ../lib` from a directory removed meanwhile (a build tree cleaned under the
    shell): the walk lists ../lib/libanswer.so and the reader reads it (".." still leads out of
    a removed directory), but the loader's origin of a relative name needs the working
    directory (dl-object.c: getcwd), which the kernel no longer has.  The root becomes an error
    record with the kernel's own refusal (getcwd: ENOENT), not a traceback and not a clean
    check.  The text names no path: getcwd's error has none."""
    top, lib = lib_tree
    report = run_check(CheckOptions(targets=[str(lib.parent)]))  # from here: a root it reads
    assert (report.stats["elf_objects"], report.stats["unreadable"], report.stats["errors"]) == (1, 0, [])

    def scan(_signal):
        os.chdir(top / "work")
        os.rmdir(top / "work")
        try:
            os.getcwd()
            refusal = "getcwd worked"
        except OSError as exc:  # the oracle: the kernel's answer in this very state
            refusal = f"{exc.errno} {exc.strerror}"
        with open("../lib/libanswer.so", "rb") as handle:  # and the library is still there
            magic = handle.read(4).hex()
        stats = run_check(CheckOptions(targets=["../lib"])).stats
        return json.dumps([refusal, magic, json.loads(_scan_answer(stats))])

    answer = _forked(scan)
    refusal, magic, found = json.loads(answer)
    number, _, reason = refusal.partition(" ")
    assert (number, magic) == (str(errno.ENOENT), "7f454c46"), answer
    assert found == [0, 1, [{"path": "../lib/libanswer.so", "error": reason.lower()}]], answer


def test_a_root_made_private_after_the_walk_is_an_error_record(lib_tree):
    """A root its owner makes private (0600) after the walk listed it, as a package upgrade
    replacing it would: for nobody the read is refused, and the root is an error record with
    the kernel's refusal (open(2) as nobody), "PATH: reason" as every record is written."""
    if os.geteuid() != 0:
        pytest.skip("needs root: to drop to nobody and to own the library")
    top, lib = lib_tree
    os.chown(lib, 0, 0)
    report = run_check(CheckOptions(targets=[str(lib.parent)]))  # as root, in this process: it reads it
    assert (report.stats["elf_objects"], report.stats["unreadable"], report.stats["errors"]) == (1, 0, [])

    def scan(signal):
        return _scan_answer(run_check(CheckOptions(targets=[str(top / "lib")]), progress=_HandOver(signal)).stats)

    answer = _forked(scan, as_nobody=True, then=lambda: os.chmod(lib, 0o600))
    assert oct(os.stat(lib).st_mode & 0o777) == "0o600"

    def opened(_signal):
        try:
            os.close(os.open(lib, os.O_RDONLY))
            return "ok"
        except OSError as exc:
            return f"{exc.errno} {exc.strerror}"

    refused = _forked(opened, as_nobody=True)
    number, _, reason = refused.partition(" ")
    assert number == str(errno.EACCES), refused
    assert json.loads(answer) == [0, 1, [{"path": str(lib), "error": f"{lib}: {reason.lower()}"}]], answer


def test_a_meta_path_module_under_a_non_ascii_directory_in_latin_1(tmp_path):
    """A meta-path module under a directory named with é, asked of an interpreter whose
    environment sets PYTHONIOENCODING=latin-1: found where the real interpreter imports it from.
    (The child printed repr() once: é came back as the byte 0xe9, and the module was reported
    missing.)"""
    site, impl = tmp_path / "site", tmp_path / "implé" / "seedance_site_tool.py"
    site.mkdir()
    impl.parent.mkdir()
    impl.write_text("VALUE = 1\n")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(impl=str(impl)))
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONIOENCODING": "latin-1", "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-c", "import seedance_site_tool as m\nprint(ascii(m.__file__))"],
                          capture_output=True, env=env, stdin=subprocess.DEVNULL, check=True)
    origin = ast.literal_eval(proc.stdout.rstrip(b"\n").split(b"\n")[-1].decode("ascii"))
    assert origin == str(impl)  # the real interpreter imports it from there

    finder = python_env._Finder(python_env.ask_interpreter(sys.executable, env=env))
    assert finder._meta_path("seedance_site_tool") == python_env._Spec("seedance_site_tool", "source", origin, ())
