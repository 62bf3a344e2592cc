"""Is a path safe to preload?  One answer for `run`, `trace`, `fix env-leak` and the check.

A preloaded library runs inside every wrapped program, so nobody but root and the user
who preloads it may be able to replace it: not the file, and not any directory above it
(whoever can write a directory can rename another file into its place).

The one exception is a sticky directory such as /tmp (mode 1777): there only an entry's
owner (or the directory's owner, or root) may rename or remove it, so an entry that
belongs to root or to the user cannot be swapped by others.  Refusing every path below
/tmp would refuse every fresh clone in /tmp without making anything safer.
"""
from __future__ import annotations

import os
import stat


def unsafe_reason(path: str, owners: tuple | None = None) -> str | None:
    """Why ``path`` must not be preloaded, or None when it is safe.

    ``owners``: uids allowed to own the file and its directories (default: any owner,
    only writability is judged, as when checking another user's config).
    """
    trusted = (0, os.geteuid()) if owners is None else tuple(owners)
    current = os.path.realpath(path)
    try:
        st = os.stat(current)
    except OSError as exc:
        return f"{path}: {(exc.strerror or 'cannot stat').lower()}"
    child_owner = None
    while True:
        mode = st.st_mode
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            sticky_safe = (stat.S_ISDIR(mode) and mode & stat.S_ISVTX and child_owner is not None
                           and child_owner in trusted)
            if not sticky_safe:
                who = "world" if mode & stat.S_IWOTH else "group"
                return f"{current} is {who}-writable"
        if owners is not None and st.st_uid not in owners:
            return f"{current} belongs to uid {st.st_uid}"
        parent = os.path.dirname(current)
        if parent == current:
            return None
        child_owner, current = st.st_uid, parent
        try:
            st = os.stat(current)
        except OSError as exc:
            return f"{current}: {(exc.strerror or 'cannot stat').lower()}"
