"""Dynamic string tokens ($ORIGIN, $LIB, $PLATFORM) as glibc's _dl_dst_substitute expands them.

Rules taken from elf/dl-load.c (glibc 2.36):
- a token is ``$NAME`` or ``${NAME}``; ``$NAME`` only counts when the next character is not
  an identifier character ([A-Za-z0-9_]), so ``$ORIGINAL`` is literal text;
- an unknown ``$FOO`` stays literal;
- a known token that cannot be replaced (no origin) empties the whole path element, and an
  empty element is dropped by the caller;
- in secure mode (AT_SECURE) ``$ORIGIN`` is allowed only as the very start of an element,
  followed by end or '/'; elsewhere the element is dropped.  For the main executable the
  expanded path must also lie in a trusted (system) directory.
"""
from __future__ import annotations

_IDENT = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
TOKENS = ("ORIGIN", "PLATFORM", "LIB")


def _token_at(text: str, pos: int, name: str) -> int:
    """Length of token ``name`` at text[pos:] (just after '$'), braces included; 0 if none."""
    curly = pos < len(text) and text[pos] == "{"
    start = pos + 1 if curly else pos
    if not text.startswith(name, start):
        return 0
    after = start + len(name)
    nxt = text[after] if after < len(text) else ""
    if curly:
        return len(name) + 2 if nxt == "}" else 0
    if nxt and nxt in _IDENT:
        return 0
    return len(name)


def has_tokens(text: str) -> bool:
    pos = text.find("$")
    while pos >= 0:
        if any(_token_at(text, pos + 1, name) for name in TOKENS):
            return True
        pos = text.find("$", pos + 1)
    return False


def expand(text: str, origin: str | None, lib: str, platform: str, secure: bool = False,
           is_main: bool = False, trusted_dirs: tuple = ()) -> str:
    """One path element with tokens replaced; '' when ld.so would discard the element."""
    if "$" not in text:
        return text
    out = []
    pos = 0
    used_origin = False
    while pos < len(text):
        char = text[pos]
        if char != "$":
            out.append(char)
            pos += 1
            continue
        after = pos + 1
        length = _token_at(text, after, "ORIGIN")
        if length:
            if secure and not (after == 1 and (after + length == len(text) or text[after + length] == "/")):
                return ""
            if origin is None:
                return ""
            out.append(origin)
            used_origin = True
            pos = after + length
            continue
        length = _token_at(text, after, "PLATFORM")
        if length:
            out.append(platform)
            pos = after + length
            continue
        length = _token_at(text, after, "LIB")
        if length:
            out.append(lib)
            pos = after + length
            continue
        out.append("$")
        pos = after
    result = "".join(out)
    if secure and used_origin and is_main and not is_trusted(result, trusted_dirs):
        return ""
    return result


def is_trusted(path: str, trusted_dirs: tuple) -> bool:
    """is_trusted_path_normalize: collapse '.', '..' and '//' then prefix-match a system dir."""
    if not path:
        return False
    parts: list = []
    for piece in path.split("/"):
        if piece in ("", "."):
            continue
        if piece == "..":
            if parts:
                parts.pop()
            continue
        parts.append(piece)
    norm = "/" + "/".join(parts) + "/" if parts else "/"
    if not path.startswith("/"):
        norm = norm[1:]
    return any(norm.startswith(d if d.endswith("/") else d + "/") for d in trusted_dirs)


def split_path_list(value: str, separators: str = ":") -> list:
    """strsep over ``separators``: empty elements are kept (they mean the current directory)."""
    items = [value]
    for sep in separators:
        items = [piece for item in items for piece in item.split(sep)]
    return items
