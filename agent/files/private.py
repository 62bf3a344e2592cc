"""Files seedance keeps for itself under the user's cache directory (the rules' parse cache,
engine.py; the check cache, collect/check_cache.py): read only when they are plainly ours,
written so that no reader ever sees half of one.

Both decide findings, so a file is believed only when it is a regular file (not followed
through a link) of this user's that nobody else can write, and not larger than asked.
"""
from __future__ import annotations

import os
import stat


def cache_home() -> str | None:
    """$XDG_CACHE_HOME/seedance (default ~/.cache/seedance); None without an absolute home."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG spec: a relative value is ignored
        home = os.path.expanduser("~")
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    return os.path.join(base, "seedance")


def read_private(path: str, max_bytes: int) -> bytes | None:
    """The file's bytes, or None: missing, a link, not ours, writable by others, too big."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022 \
                or st.st_size > max_bytes:
            return None
        chunks, size = [], 0
        while size <= st.st_size:  # (one byte more than it said: a file that grew is read whole or refused)
            chunk = os.read(fd, st.st_size + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
        return data if len(data) <= max_bytes else None
    except OSError:
        return None
    finally:
        os.close(fd)


def write_private(path: str, data: bytes) -> None:
    """``data`` at ``path``, 0600, its directory made 0700: a temp file beside it (O_EXCL,
    never through a link), then a rename.  OSError when it cannot be written; no temp file
    is left behind.  Not an input of a check being recorded for the check cache
    (collect/inputs.py): making ~/.cache/seedance would record ~/.cache as one, which the
    next run finds changed."""
    from ..collect import inputs

    with inputs.paused():
        _write(path, data)


def _write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    temp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
