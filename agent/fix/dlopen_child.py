"""verify()'s oracle: dlopen(path, RTLD_NOW) in a process of its own, one process per path.

Two ways to get that process, both loading exactly one path into a process that holds only
what a fresh interpreter holds:

  DlopenZygote   forked by the fix command first thing, before it imports the scan code,
                 the CEL binding, hashlib's libcrypto or the journal's compressors.  It
                 imports ctypes (what a fresh interpreter's check imports too) and then, for
                 each path, forks a child that dlopens it and exits: a fork of a process
                 that already has ctypes loaded, instead of a whole interpreter start-up
                 (Python's import system, site, ctypes) per check, which would be most of
                 a small library's fix.
  DlopenChild    a fresh `python -I -S` (the fallback, and the oracle the zygote is tested
                 against).

Why the zygote is as faithful as a fresh process.  ld.so satisfies a NEEDED entry from an
object already loaded under that name (its SONAME or a name it was loaded by:
elf/dl-load.c, _dl_map_object, before any search), so a process that already holds a
library can load a file that a fresh process cannot.  The zygote reports the objects it
holds; shadowed() names every NEEDED of the checked closure that one of them would answer
with another file (or where the loader finds none), and verify() then asks a fresh process
instead.  The environment ld.so read at start (LD_LIBRARY_PATH, GLIBC_TUNABLES, ...) is the
zygote's parent's: a check under another environment takes a fresh process too (usable_for).
Each path gets its own child, so nothing one check loaded can satisfy the next.
"""
from __future__ import annotations

import os
import sys

# The child's program (DlopenChild): the path on stdin, the loader's message on stdout.
CHILD_CODE = ("import ctypes, os, sys\n"
              "path = os.fsdecode(sys.stdin.buffer.read())\n"
              "if not path:\n"
              "    sys.exit(0)\n"
              "try:\n"
              "    ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)\n"
              "except OSError as exc:\n"
              "    print(exc); sys.exit(3)\n")

# ld.so reads these when the process starts (elf/rtld.c, process_envvars; the tunables);
# a zygote serves only checks whose environment gives them the values it started with.
def _loader_vars(env) -> dict:
    return {k: v for k, v in env.items() if k.startswith("LD_") or k == "GLIBC_TUNABLES"}


def dlopen_in_child(path: str, env: dict) -> str:
    """'' when ``path`` loads with RTLD_NOW in a fresh process, else the loader's message."""
    return DlopenChild(env).load(path)


class DlopenChild:
    """A fresh process that dlopens one path with RTLD_NOW: the oracle of verify().

    Started ahead (the fixer starts it before it writes), it has its interpreter up and
    ctypes imported while the temp file is written, and then waits for the path on stdin:
    its start-up would otherwise be most of a small library's verification.  One path per child,
    so nothing loaded for one check can satisfy the next; the environment (LD_LIBRARY_PATH,
    ...) is the one given, read by ld.so when the child starts."""

    CODE = CHILD_CODE

    def __init__(self, env: dict):
        import subprocess  # only here: the zygote's checks need no subprocess machinery

        self._subprocess = subprocess
        # -I -S: no site-packages, .pth hooks or PYTHON* variables: the child only needs ctypes,
        # and skipping site (its .pth files and imports) shortens its start-up; LD_* still
        # come from ``env``
        read, self._path_pipe = os.pipe()  # our own pipe: send() writes the path and closes it
        try:
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", self.CODE], stdin=read,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        except BaseException:
            os.close(self._path_pipe)
            raise
        finally:
            os.close(read)

    def send(self, path: str) -> None:
        """Give it the path to load (it starts at once; result() collects the verdict)."""
        if self._path_pipe is None:
            raise ValueError("this child was already given a path")
        try:
            data = os.fsencode(path)
            while data:  # a path fits in the pipe's buffer: this never blocks
                data = data[os.write(self._path_pipe, data):]
        except BrokenPipeError:
            pass  # it died before reading: result() reports its exit
        finally:
            self._end_input()

    def _end_input(self) -> None:
        if self._path_pipe is not None:
            os.close(self._path_pipe)
            self._path_pipe = None

    def result(self, timeout: float = 60) -> str:
        """'' when the path loaded, else the loader's message (one line)."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except self._subprocess.TimeoutExpired:
            self.kill()
            return f"dlopen did not return within {timeout:g} s"
        if self.proc.returncode == 0:
            return ""
        out = out.decode("utf-8", "replace").strip()
        err = err.decode("utf-8", "replace").strip()
        return out or (err.splitlines() or [f"exit {self.proc.returncode}"])[-1]

    def load(self, path: str, timeout: float = 60) -> str:
        """'' when ``path`` loads, else the loader's message (one line)."""
        self.send(path)
        return self.result(timeout)

    def kill(self) -> None:
        self._end_input()
        if self.proc.returncode is None:
            self.proc.kill()
        self.proc.communicate()

    def close(self) -> None:
        """End a child that was not given a path (EOF on stdin: it exits loading nothing)."""
        self._end_input()
        if self.proc.returncode is None:
            try:
                self.proc.communicate(timeout=5)
            except self._subprocess.TimeoutExpired:
                self.kill()


# --- the zygote ------------------------------------------------------------------------------
# Frames on both pipes: 4-byte little-endian length, then the bytes.  Requests: a path.
# Replies: first the zygote's mapped objects ("\0"-separated paths, or "!" + why it cannot
# serve), then per request the child's pid (decimal) and "<exit status> <message>".

def _write_frame(fd: int, data: bytes) -> None:
    data = len(data).to_bytes(4, "little") + data
    while data:
        data = data[os.write(fd, data):]


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks, got = [], 0
    while got < size:
        chunk = os.read(fd, size - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _read_frame(fd: int) -> bytes | None:
    head = _read_exact(fd, 4)
    if head is None:
        return None
    return _read_exact(fd, int.from_bytes(head, "little"))


def _mapped_objects() -> list:
    """The files this process maps (/proc/self/maps), each once."""
    seen = {}
    with open("/proc/self/maps", "rb") as handle:
        for line in handle:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith(b"/"):
                seen.setdefault(fields[5].rstrip(b"\n"), None)
    return list(seen)


def _serve(requests: int, replies: int) -> None:
    """The zygote's life: hold nothing new but ctypes; fork one child per path."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # a library's constructor output is no part of the fix's output
        os.dup2(null, fd)
    os.close(null)
    # nothing of the parent's but our two pipes: a caller waiting for EOF on a pipe the
    # parent holds must not wait for us
    keep = sorted((requests, replies))
    os.closerange(3, keep[0])
    os.closerange(keep[0] + 1, keep[1])
    os.closerange(keep[1] + 1, 65536)
    try:
        import ctypes  # the fresh interpreter's check imports it too: _ctypes, libffi

        mode = os.RTLD_NOW | os.RTLD_LOCAL
        _write_frame(replies, b"\0".join(_mapped_objects()))
    except Exception as exc:  # noqa: BLE001 - any failure: the parent takes a fresh process
        _write_frame(replies, b"!" + str(exc).encode("utf-8", "replace"))
        return
    while True:
        path = _read_frame(requests)
        if path is None:  # the parent closed its end, or died
            return
        out, into = os.pipe()
        pid = os.fork()
        if pid == 0:
            code, message = 0, b""
            try:
                os.close(out)
                ctypes.CDLL(os.fsdecode(path), mode=mode)
            except OSError as exc:
                code, message = 3, str(exc).encode("utf-8", "surrogateescape")
            except BaseException as exc:  # noqa: BLE001
                code, message = 4, f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")
            try:
                _write_frame(into, message)
            finally:
                os._exit(code)
        os.close(into)
        _write_frame(replies, str(pid).encode())
        message = _read_frame(out) or b""
        os.close(out)
        _pid, status = os.waitpid(pid, 0)
        _write_frame(replies, str(status).encode() + b" " + message)


class DlopenZygote:
    """A process forked before the fix loads anything an interpreter does not, which forks one
    dlopen child per path it is given (see the module docstring)."""

    def __init__(self):
        self.environ = dict(os.environ)
        self.objects: list | None = None  # what the zygote maps, once it said so
        self.error = ""  # why it cannot serve, once known
        self._child = None  # pid of the child loading the path given last
        self._names = None  # name -> the mapped objects ld.so would match it with
        requests, self._requests = os.pipe()
        self._replies, replies = os.pipe()
        try:
            self.pid = os.fork()
        except BaseException:
            for fd in (requests, self._requests, self._replies, replies):
                os.close(fd)
            raise
        if self.pid == 0:  # the zygote
            try:
                os.close(self._requests)
                os.close(self._replies)
                _serve(requests, replies)
            finally:
                os._exit(0)
        os.close(requests)
        os.close(replies)

    @staticmethod
    def safe_to_fork() -> bool:
        """Forking is sound only with one thread (another's locks would be held forever)."""
        threading = sys.modules.get("threading")
        return threading is None or threading.active_count() == 1

    def _reply(self, timeout: float) -> bytes | None:
        import select

        ready, _w, _x = select.select([self._replies], [], [], timeout)
        if not ready:
            return None
        return _read_frame(self._replies)

    def _ready(self, timeout: float = 60) -> bool:
        if self.objects is None and not self.error:
            if self._requests is None:
                self.error = "closed"
                return False
            reply = self._reply(timeout)
            if reply is None:
                self.error = "the dlopen zygote did not start"
                self.kill()
            elif reply.startswith(b"!"):
                self.error = reply[1:].decode("utf-8", "replace")
                self.close()
            else:
                self.objects = [os.fsdecode(p) for p in reply.split(b"\0") if p]
        return self.objects is not None and not self.error

    def usable_for(self, env: dict) -> bool:
        """Does a check under ``env`` see what a fresh process given ``env`` would?"""
        if env != self.environ or _loader_vars(env) != _loader_vars(_initial_environ()):
            return False
        return self._ready()

    def shadowed(self, resolutions) -> list:
        """NEEDED names of a closure that an object the zygote holds would answer otherwise
        than the search does: ``resolutions`` are (name, path or None) as the resolver found
        them.  Empty: the zygote's verdict is a fresh process's."""
        if self._names is None:
            from ..elf.reader import read_elf
            from ..model.errors import ELFError

            names: dict = {}
            for path in self.objects or ():  # as /proc/PID/maps names them: already real paths
                found = {os.path.basename(path)}
                try:
                    soname = read_elf(path).soname
                except (ELFError, OSError):
                    soname = None
                if soname:
                    found.add(soname)
                for name in found:
                    names.setdefault(name, set()).add(path)
            self._names = names
        out = set()
        for name, path in resolutions:
            held = self._names.get(name)
            if held and "/" not in name and (path is None or os.path.realpath(path) not in held):
                out.add(name)
        return sorted(out)

    def send(self, path: str) -> None:
        """Have a child of the zygote dlopen ``path`` now; result() collects the verdict."""
        if not self._ready():
            raise ValueError(f"the dlopen zygote cannot serve: {self.error}")
        if self._child is not None:
            raise ValueError("a path is already being loaded")
        _write_frame(self._requests, os.fsencode(path))
        self._child = -1  # its pid comes with the first reply

    def result(self, timeout: float = 60) -> str:
        """'' when the path loaded, else the loader's message (one line)."""
        reply = self._reply(timeout)
        if reply is not None and self._child == -1:
            self._child = int(reply)
            reply = self._reply(timeout)
        if reply is None:
            self.kill()
            return f"dlopen did not return within {timeout:g} s"
        self._child = None
        status, _sep, message = reply.partition(b" ")
        status = int(status)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            return ""
        text = message.decode("utf-8", "replace").strip().splitlines()
        if text:
            return text[-1]
        if os.WIFSIGNALED(status):
            return f"the dlopen child was killed by signal {os.WTERMSIG(status)}"
        return f"exit {os.WEXITSTATUS(status)}"

    def load(self, path: str, timeout: float = 60) -> str:
        self.send(path)
        return self.result(timeout)

    def kill(self) -> None:
        """End the zygote and a child mid-load (a constructor that never returns)."""
        import signal

        for pid in (self._child, self.pid):
            if pid and pid > 0:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self._child = None
        self.error = self.error or "killed"
        self.close()

    def close(self) -> None:
        """EOF on its requests: it exits (a child still at work is killed with it)."""
        if self._child is not None:
            self.kill()  # a path sent and its verdict never collected: do not wait for it
            return
        if self._requests is not None:
            os.close(self._requests)
            self._requests = None
        if self._replies is not None:
            os.close(self._replies)
            self._replies = None
        if self.pid:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = 0


def _initial_environ() -> dict:
    """The environment this process started with (what ld.so read), not os.environ now."""
    try:
        with open("/proc/self/environ", "rb") as handle:
            block = handle.read()
    except OSError:
        return dict(os.environ)
    out = {}
    for item in block.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[os.fsdecode(key)] = os.fsdecode(value)
    return out
