"""Library file names as packagers rewrite them.

auditwheel (and delocate, and the NVIDIA/PyPA repair tools built on it) vendor a library
into a wheel under a hashed name so two wheels' copies cannot collide:
``libgomp.so.1`` becomes ``libgomp-a34b3233.so.1`` (auditwheel/repair.py copylib: the
first 8 hex digits of the file's sha256 inserted before the first '.so').  Some repair
runs patch the SONAME to the hashed name, some leave the original one; ld.so does not
care either way, because it opens a NEEDED by name and only uses DT_SONAME to match later
requests.
"""
from __future__ import annotations

import re

_HASHED = re.compile(r"^(?P<stem>.+?)-[0-9a-f]{8}(?P<tail>\.so(\..*)?)$")


def unhashed(name: str) -> str:
    """``libgomp-a34b3233.so.1`` -> ``libgomp.so.1``; any other name unchanged."""
    match = _HASHED.match(name or "")
    return match.group("stem") + match.group("tail") if match else (name or "")


def same_library(needed: str, soname: str) -> bool:
    """Whether a NEEDED entry and the DT_SONAME of the file it resolved to name the same
    library: a NEEDED that is a path counts by its file name (``$ORIGIN/../lib/libpython3.12
    .so.1.0``), and a vendored hashed name counts as its plain name."""
    base = needed.rsplit("/", 1)[-1]
    return base == soname or unhashed(base) == unhashed(soname)
