"""Library file names as packagers rewrite them.

Wheel repair tools vendor a library into a wheel under a renamed file so two wheels'
copies cannot collide, and rewrite the dependent's NEEDED to the new file name:

- auditwheel (repair.py copylib): the first 8 hex digits of the file's sha256 after the
  first dot's stem, ``libgomp.so.1`` -> ``libgomp-a34b3233.so.1``; a library vendored twice
  (numpy's ``libgfortran-040039e1-0352e75f.so.5.0.0``) carries two;
- other repair runs put the hash as a dotted part in the middle, ``libz.2fd3c0b3.so.1``,
  ``libpng16.7f72a3c5.so.16``;
- some keep the full version of the file name, ``libjpeg-6dc8d115.so.62.4.0``.

Some runs patch the SONAME to the new name, some leave the original one.  ld.so does not
care either way: it opens a NEEDED by file name along the search path (elf/dl-load.c
open_path) and uses DT_SONAME only to match later requests (_dl_map_object compares a
request with each loaded object's SONAME).  What matters is whether the file found is the
library, and the major, that the dependent was linked against: the same stem once hashes
are set aside, and the same first number after ``.so``.
"""
from __future__ import annotations

import re

_HASHED = re.compile(r"^(?P<stem>.+?)-[0-9a-f]{8}(?P<tail>\.so(\..*)?)$")
# a hash token a repair tool inserts: 8 (auditwheel) to 64 hex digits, after '-' or '.'
_HASH_TOKEN = re.compile(r"[-.](?=[0-9a-f]*[a-f])[0-9a-f]{8,64}$|[-.][0-9]{8}$")
_SO = re.compile(r"^(?P<stem>.+?)\.so(?P<versions>(\.[^.]+)*)$")


def unhashed(name: str) -> str:
    """``libgomp-a34b3233.so.1`` -> ``libgomp.so.1``; any other name unchanged."""
    match = _HASHED.match(name or "")
    return match.group("stem") + match.group("tail") if match else (name or "")


def _parts(name: str):
    """(stem without repair hashes, (version parts)) of ``lib<x>[hashes].so[.v...]``, or None
    for a name that is no shared-object name."""
    match = _SO.match(name)
    if match is None:
        return None
    stem = match.group("stem")
    while True:
        hashed = _HASH_TOKEN.search(stem)
        if hashed is None or hashed.start() == 0:
            break
        stem = stem[:hashed.start()]
    versions = tuple(v for v in match.group("versions").split(".") if v)
    return stem, versions


def same_library(needed: str, soname: str) -> bool:
    """Whether a NEEDED entry and the DT_SONAME of the file it resolved to name the same
    library at the same major: a NEEDED that is a path counts by its file name
    (``$ORIGIN/../lib/libpython3.12.so.1.0``); a vendored name counts without the repair
    tool's hashes (``libz.2fd3c0b3.so.1``, ``libgomp-a34b3233.so.1`` are ``libz.so.1``,
    ``libgomp.so.1``); a fuller version of the same major counts as that major
    (``libjpeg-6dc8d115.so.62.4.0`` is ``libjpeg.so.62``).  ``libcudart.so.12`` whose SONAME
    is ``libcudart.so.11.0`` is another major, and ``libfoo.so`` vs ``libfoo.so.1`` stays a
    mismatch: no repair tool drops a version."""
    base = needed.rsplit("/", 1)[-1]
    if base == soname or unhashed(base) == unhashed(soname):
        return True
    mine, theirs = _parts(base), _parts(soname)
    if mine is None or theirs is None or mine[0] != theirs[0]:
        return False
    if mine[1] == theirs[1]:
        return True
    if not mine[1] or not theirs[1]:
        return False
    shorter = min(len(mine[1]), len(theirs[1]))
    return mine[1][:shorter] == theirs[1][:shorter]
