"""The one writer for every path a user names for output: reports, event streams, plots,
bundles, SARIF.  Why not a plain temp-then-rename: that turns /dev/null into a regular
file, replaces symlinks, follows a planted symlink at a predictable temp name, overwrites
an ELF that `--report-json` has swallowed, and fails on a directory only after the whole
scan.

prepare_output() classifies the path *before* any work and raises UsageError (exit 2) for
what can never be written.  What is written where:

  "-"                         stdout (the caller keeps the wrapped program off it)
  /dev/stdout, /dev/fd/N,     written through the descriptor's file, never replaced
  /proc/self/fd/N ...         (a regular file behind it is appended to: the shell may share it)
  char device, FIFO           written through (open O_WRONLY, no O_CREAT, no O_TRUNC):
                              /dev/null stays a device, /dev/full says "no space" in one line
  regular file or new name    a temp file from mkstemp in the same directory (O_CREAT|O_EXCL|
                              O_NOFOLLOW, unpredictable name), fsync, rename(2) over the name,
                              fsync the directory; the temp is removed on any failure
  symlink                     followed: the link stays, its target gets the content (the
                              kernel's protected_symlinks rule is applied: a link in a sticky
                              world-writable directory owned by someone else is refused)
  directory, block device,    refused at prepare time
  socket, missing parent

Our own outputs may be replaced; anything else that is not empty needs --force, so a binary
named by mistake is never destroyed.  A file counts as a seedance output (see is_ours):
  - JSON whose top-level "schema" starts with "seedance." (seedance.report/v1, ldd/v1,
    bench/v1, ...), or JSON lines whose first object has one;
  - a JSON-lines event stream: the first line is an object with a string "event" field
    (trace --json), or the shim's event shape, "kind" with "seq" and "t_ns" (run --events);
  - a SARIF log whose tool driver is named seedance;
  - text whose first line starts with "# seedance" (trace -o FILE writes that header);
  - a PNG carrying a tEXt "Software" chunk that names seedance (bench --plot sets it);
  - an SVG carrying a `<!-- seedance ... -->` comment before its <svg> element;
  - a frag.bin memory profile (magic SEEDFRAG);
  - an evidence bundle: a zstd skippable frame holding seedance.bundle/v1, or a gzip
    member named seedance-bundle.tar (check --bundle).

Streams (open_stream) to a regular file are written in place, like strace -o, so a reader
can follow them with tail -f; they go through the same checks first.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import sys

from ..model.errors import SeedanceError, UsageError, escape_path

# /dev/stdout, /dev/fd/3, /proc/self/fd/3, /proc/4242/task/4242/fd/1: names of descriptors.
_FD_PATH = re.compile(r"^/(?:dev/(?:stdout|stderr|fd/\d+)|proc/(?:self|thread-self|\d+)(?:/task/\d+)?/fd/\d+)$")

_HEAD = 64 * 1024  # how much of an existing file is read to recognise it

STDOUT, THROUGH, REPLACE = "stdout", "through", "replace"


class OutputError(SeedanceError):
    """Writing a prepared output failed (/dev/full, a full disk): one line, exit 2."""


class OutputTarget:
    """A validated output path.  Build it with prepare_output()."""

    def __init__(self, path: str, mode: str, real: str | None = None, what: str = "report"):
        self.path = path          # as the user named it ("-" for stdout)
        self.mode = mode          # STDOUT, THROUGH or REPLACE
        self.real = real          # where the bytes land (symlinks resolved)
        self.what = what

    def __repr__(self) -> str:
        return f"OutputTarget({self.path!r}, {self.mode})"

    @property
    def is_stdout(self) -> bool:
        return self.mode == STDOUT

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode("utf-8", "surrogateescape"))

    def write_bytes(self, data: bytes) -> None:
        try:
            self._write(data)
        except BrokenPipeError:
            raise  # the reader of stdout went away: the CLI ends quietly
        except OSError as exc:
            raise OutputError(describe_write_error(exc, self)) from None

    def _write(self, data: bytes) -> None:
        if self.mode == STDOUT:
            sys.stdout.flush()
            buffer = getattr(sys.stdout, "buffer", None)
            if buffer is None:  # a replaced sys.stdout (tests, capture)
                sys.stdout.write(data.decode("utf-8", "surrogateescape"))
            else:
                buffer.write(data)
            sys.stdout.flush()
        elif self.mode == THROUGH:
            fd = _open_through(self.real)
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
        else:
            _replace_atomically(self.real, data)

    @contextlib.contextmanager
    def open_stream(self, *, binary: bool = False) -> "Iterator[IO]":
        """A file object for a long-lived stream (event lines); flushed and closed at exit
        (never stdout itself, which stays open)."""
        if self.mode == STDOUT:
            handle = sys.stdout.buffer if binary else sys.stdout
            try:
                yield handle
            finally:
                handle.flush()
            return
        try:
            if self.mode == THROUGH:
                fd = _open_through(self.real)
            else:
                # in place, so `tail -f` can follow it; O_NOFOLLOW: a link swapped in after
                # the check is refused, not followed
                fd = os.open(self.real, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o666)
        except OSError as exc:
            raise OutputError(describe_write_error(exc, self)) from None
        handle = os.fdopen(fd, "wb" if binary else "w",
                           **({} if binary else {"encoding": "utf-8", "errors": "surrogateescape"}))
        try:
            yield handle
        finally:
            try:
                handle.close()  # the last flush: /dev/full says so here
            except BrokenPipeError:
                raise
            except OSError as exc:
                raise OutputError(describe_write_error(exc, self)) from None


def prepare_output(path: str, *, force: bool = False, what: str = "report") -> OutputTarget:
    """Check PATH for writing before any work is done; UsageError (exit 2) if it cannot be."""
    if path == "-":
        return OutputTarget(path, STDOUT, None, what)
    if not path:
        raise UsageError(f"the {what} path is empty (use - for stdout)")
    shown = escape_path(path)
    absolute = os.path.abspath(path)
    if _FD_PATH.match(absolute):
        try:
            os.stat(absolute)
        except OSError as exc:
            raise UsageError(f"cannot write the {what} to {shown}: {_reason(exc)}") from None
        return OutputTarget(path, THROUGH, absolute, what)
    real = _follow(absolute, shown, what)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise UsageError(f"cannot write the {what} to {shown}: {_reason(exc)}") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"cannot write the {what} to {shown}: it is a directory")
        if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
            if not os.access(real, os.W_OK):
                raise UsageError(f"cannot write the {what} to {shown}: permission denied")
            return OutputTarget(path, THROUGH, real, what)
        if not stat.S_ISREG(st.st_mode):
            kind = "block device" if stat.S_ISBLK(st.st_mode) else "socket" if stat.S_ISSOCK(st.st_mode) \
                else "special file"
            raise UsageError(f"cannot write the {what} to {shown}: it is a {kind}")
        if st.st_size and not force and not is_ours(real):
            raise UsageError(f"refusing to overwrite {shown}: it is not empty and not a seedance output "
                             f"(give --force to replace it)")
    parent = os.path.dirname(real) or "/"
    try:
        pst = os.stat(parent)
    except OSError as exc:
        raise UsageError(f"cannot write the {what} to {shown}: {escape_path(parent)}: {_reason(exc)}") from None
    if not stat.S_ISDIR(pst.st_mode):
        raise UsageError(f"cannot write the {what} to {shown}: {escape_path(parent)} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write the {what} to {shown}: {escape_path(parent)}: permission denied")
    return OutputTarget(path, REPLACE, real, what)


def is_ours(path: str) -> bool:
    """Is the file at PATH empty or something seedance wrote?  (Markers: module docstring.)"""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_HEAD)
            complete = not handle.read(1)
    except OSError:
        return False
    if not head.strip():
        return True
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return bool(re.search(rb"tEXtSoftware\x00[^\x00]*seedance", head))
    if head.startswith(b"# seedance") or head.startswith(b"SEEDFRAG"):
        return True  # a text log of ours, or a frag.bin (seedance.profile.fragbin)
    if head.startswith(b"\x5e\x2a\x4d\x18") and head[8:8 + 18] == b"seedance.bundle/v1":
        return True  # check --bundle .tar.zst: a zstd skippable frame names it (collect/bundle.py)
    if head.startswith(b"\x1f\x8b\x08\x08") and head[10:30] == b"seedance-bundle.tar\x00":
        return True  # check --bundle .tar.gz: the gzip FNAME field names it
    if b"<svg" in head and re.search(rb"<!-- seedance[ a-z-]*-->", head):
        return True  # an SVG that seedance drew (profile calls --svg, check --graph)
    text = head.lstrip()
    if not text[:1] in (b"{", b"["):
        return False
    document = None
    if complete:
        try:
            document = json.loads(head.decode("utf-8", "surrogateescape"))
        except ValueError:
            document = None
    if document is None:  # JSON lines, or a document larger than the head
        first = text.split(b"\n", 1)[0]
        try:
            document = json.loads(first.decode("utf-8", "surrogateescape"))
        except ValueError:
            # a large pretty-printed report: its "schema" key comes first
            return bool(re.match(rb'\{\s*"schema"\s*:\s*"seedance\.', text))
    return _json_is_ours(document)


def _json_is_ours(document) -> bool:
    if not isinstance(document, dict):
        return False
    schema = document.get("schema")
    if isinstance(schema, str) and schema.startswith("seedance."):
        return True
    if isinstance(document.get("event"), str):
        return True
    if isinstance(document.get("kind"), str) and isinstance(document.get("seq"), int) and "t_ns" in document:
        return True  # shim/events.py event_to_dict
    if "sarif" in str(document.get("$schema", "")).lower():
        try:
            return any(run["tool"]["driver"]["name"] == "seedance" for run in document.get("runs", ()))
        except (KeyError, TypeError):
            return False
    return False


def _follow(absolute: str, shown: str, what: str) -> str:
    """Resolve symlinks in PATH (the link stays; its target gets the content).  Refuses, as
    the kernel's fs.protected_symlinks does for open(), a link in a sticky world-writable
    directory (/tmp) owned by neither us nor the directory's owner: another user planted it."""
    seen = 0
    current = absolute
    while True:
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            break
        except OSError as exc:
            raise UsageError(f"cannot write the {what} to {shown}: {_reason(exc)}") from None
        if not stat.S_ISLNK(st.st_mode):
            break
        seen += 1
        if seen > 40:  # MAXSYMLINKS in the kernel
            raise UsageError(f"cannot write the {what} to {shown}: too many levels of symbolic links")
        parent = os.path.dirname(current)
        try:
            pst = os.stat(parent)
        except OSError as exc:
            raise UsageError(f"cannot write the {what} to {shown}: {_reason(exc)}") from None
        if (pst.st_mode & stat.S_ISVTX and pst.st_mode & stat.S_IWOTH
                and st.st_uid not in (os.geteuid(), pst.st_uid)):
            raise UsageError(f"refusing to write the {what} through {escape_path(current)}: a symlink in a "
                             f"sticky world-writable directory owned by another user (uid {st.st_uid})")
        # no normpath: ".." after a linked directory is the kernel's to resolve, not ours
        current = os.path.join(parent, os.readlink(current))
    # resolve the directories above the final name too, so the temp file and rename(2)
    # happen where the content really lands
    return os.path.join(os.path.realpath(os.path.dirname(current)), os.path.basename(current))


def _reason(exc: OSError) -> str:
    return (exc.strerror or exc.__class__.__name__).lower()


def _open_through(path: str) -> int:
    """Open a device, FIFO or descriptor path for writing without creating or replacing it."""
    flags = os.O_WRONLY | os.O_CLOEXEC | os.O_NOCTTY
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode):
        flags |= os.O_APPEND  # /dev/stdout onto a file the shell opened: add, never clobber
    return os.open(path, flags)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _replace_atomically(path: str, data: bytes) -> None:
    directory = os.path.dirname(path) or "."
    owner = None
    try:
        old = os.stat(path)
        mode, owner = stat.S_IMODE(old.st_mode), (old.st_uid, old.st_gid)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    # mkstemp: O_RDWR|O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600, a random name: a link planted
    # at a guessed name is never followed
    import tempfile  # here: it imports shutil, random and weakref, which most commands never need

    fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(path)[:64]}.", suffix=".tmp", dir=directory)
    try:
        try:
            _write_all(fd, data)
            if owner is not None and os.geteuid() == 0 and owner != (0, 0):
                # root rewriting a user's report: it stays theirs (before the chmod, which
                # a chown would clear setgid bits of)
                with contextlib.suppress(OSError):
                    os.fchown(fd, *owner)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    with contextlib.suppress(OSError):
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def describe_write_error(exc: OSError, target: OutputTarget) -> str:
    """'cannot write the report to /dev/full: no space left on device'"""
    if exc.errno == errno.EPIPE:
        return f"cannot write the {target.what}: the reader went away"
    return f"cannot write the {target.what} to {escape_path(target.path)}: {_reason(exc)}"
