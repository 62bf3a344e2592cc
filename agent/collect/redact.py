"""Redaction of evidence bundles: secrets never enter a bundle (collect/bundle.py).

Three nets, each catching what the others cannot:

  by name       a value under a secret-like name (FOO_TOKEN, GH_PAT, password, apiKey), in a
                process environment, a config (YAML/JSON/INI, any style, any depth) or a fact;
  by URL        the userinfo of every scheme://user:password@host URL, whatever the name;
  by shape      well-known token formats (GitHub, AWS, Slack, JWT, PEM private keys,
                Bearer), wherever they stand, whatever they are called.

Every value found by name or URL is also scrubbed from every other member before the tar
is written (a fact or a report can quote a secret).  The manifest names each redaction
(where, which name or which token shape), never the value.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

REDACTED = "<redacted>"
MIN_SCRUB = 4  # shorter captured secrets are not scrubbed elsewhere (they would hit "1", "yes")
# A lone userinfo (https://TOKEN@host) is usually a token, sometimes a login ("git", "alice");
# only a value this long is scrubbed from other members, so /home/alice paths survive.
MIN_SCRUB_LONE_USER = 20

# --- secret-like names -----------------------------------------------------------------------
# Glued anywhere in a name (GHTOKEN, DBPASSWORD, MYAPIKEY): long enough never to be innocent.
_SECRET_PART = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|APIKEY|ACCESSKEY|PRIVATEKEY|PASSPHRASE",
                          re.IGNORECASE)
# Whole words only: PAT must not match PATH, KEY not KEYBOARD, PASS not PASSTHROUGH.
_SECRET_WORDS = frozenset({"PAT", "PATS", "PASS", "PWD", "KEY", "KEYS", "CREDS", "AUTH",
                           "AUTHORIZATION", "COOKIE", "COOKIES"})
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")  # FOO_BAR, fooBar, HTTPAuth
# The shell's working directories and ssh-agent's socket: paths, not secrets.
_NOT_SECRET = frozenset({"PWD", "OLDPWD", "SSH_AUTH_SOCK"})


def secret_name(name: str) -> bool:
    """Does a value under this name (environment variable, config key) hold a secret?"""
    if not name or name.upper() in _NOT_SECRET:
        return False
    if _SECRET_PART.search(name):
        return True
    return any(word.upper() in _SECRET_WORDS for word in _WORD.findall(name))


def env_name(name: str) -> bool:
    """FOO_TOKEN, GH_PAT: a secret name as environments spell them.  Facts use lower-case
    field names of our own ("key", "build_id"), which are never secrets."""
    return bool(re.fullmatch(r"[A-Z][A-Z0-9_]*", name)) and secret_name(name)


# A quick test that a JSON text could hold an environment-style secret name at all (a host
# scan has thousands of facts and almost never one; walking them all cost 8 s of 22).  A
# superset of env_name: structure() decides exactly.
_SECRET_ENV_IN_JSON = re.compile(
    r'"[A-Z0-9_]*(?:TOKEN|SECRET|PASSW|CREDENTIAL|APIKEY|ACCESSKEY|PRIVATEKEY|PASSPHRASE)[A-Z0-9_]*"'
    r'|"(?:[A-Z0-9]+_)*(?:PATS?|PASS|PWD|KEYS?|CREDS|AUTH|AUTHORIZATION|COOKIES?)(?:_[A-Z0-9]+)*"')

# --- URLs ------------------------------------------------------------------------------------
# scheme://USERINFO@host: userinfo is whatever stands before the @ of the authority (RFC 3986,
# 3.2.1), which holds no / ? # and no space; the user may be empty (redis://:pw@host).
_URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^/?#\s@\"'<>]*)@")

# --- token shapes ----------------------------------------------------------------------------
# (label, pattern, group): the group of the match that is the secret (0: all of it).  Each
# has literal needles, so a member holding none of them costs one substring search.
_NOT_BEFORE = rb"(?<![A-Za-z0-9_])"
TOKEN_SHAPES = (
    # GitHub: personal, OAuth, user-to-server, server-to-server, refresh; fine-grained PATs
    # (docs.github.com, "About authentication to GitHub", token prefixes)
    ("github-token", re.compile(_NOT_BEFORE + rb"(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,255}"), 0,
     (b"ghp_", b"gho_", b"ghu_", b"ghs_", b"ghr_")),
    ("github-token", re.compile(_NOT_BEFORE + rb"github_pat_[A-Za-z0-9_]{20,255}"), 0, (b"github_pat_",)),
    # AWS access key ids: long-term AKIA, temporary ASIA, 16 more upper-case letters/digits
    ("aws-access-key-id", re.compile(_NOT_BEFORE + rb"(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"), 0,
     (b"AKIA", b"ASIA")),
    # an AWS secret access key is 40 base64 characters with no marker of its own: only
    # after a name that says what it is (aws_secret_access_key = ..., --aws-secret-key ...)
    ("aws-secret-access-key",
     re.compile(rb"(?i:aws[_.-]?secret[_.-]?(?:access[_.-]?)?key)[\"']?\s*[:=\s]\s*[\"']?"
                rb"([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])"), 1, (b"ecret", b"ECRET")),
    ("slack-token", re.compile(_NOT_BEFORE + rb"xox[baprs]-[A-Za-z0-9-]{10,}"), 0, (b"xox",)),
    # a JWT: base64url header and payload, both JSON objects, so both start eyJ ('{"')
    ("jwt", re.compile(_NOT_BEFORE + rb"eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"), 0,
     (b"eyJ",)),
    # a PEM private key, to its END line; with the END cut off, the base64 body that follows
    # (newlines raw, or \n as JSON writes them inside a string)
    ("private-key",
     re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?:[A-Za-z0-9+/=\s:,.-]|\\[nrt])*?"
                rb"(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|(?=[^A-Za-z0-9+/=\s:,.\\-])|\Z)"), 0,
     (b"PRIVATE KEY-----",)),
    # RFC 6750 bearer credentials, in a header line or a command line
    ("bearer-token", re.compile(rb"(?i:(?<![A-Za-z0-9])bearer)\s+([A-Za-z0-9._~+/-]{8,}=*)"), 1,
     (b"earer", b"EARER")),
)


# --- config text -----------------------------------------------------------------------------
# A key and its separator anywhere on a line: at its start (block YAML, INI, env files), after
# "- " (a mapping inside a sequence) or after { or , (a flow mapping, JSON).  A YAML colon
# is followed by a space (else it is part of a scalar: http://x); INI and env files use =.
_PAIR = re.compile(r"(?P<lead>^[ \t]*(?:-[ \t]+)*|[{,][ \t]*)(?:export[ \t]+)?(?P<q>[\"']?)"
                   r"(?P<key>[A-Za-z_][\w.-]*)(?P=q)[ \t]*(?P<sep>:(?=[ \t]|$|[\"'{\[])|=)[ \t]*")
_BLOCK_SCALAR = re.compile(r"[|>][0-9+-]*[ \t]*(#.*)?$")
_INI_SECTION = re.compile(r"^[ \t]*\[([\w. -]+)\][ \t]*$")


@dataclass
class Redactor:
    """Replaces secrets and remembers where (never what) for the manifest."""

    redactions: list = field(default_factory=list)  # {"where", "name"}
    values: set = field(default_factory=set)  # the secrets seen, to scrub from other members

    # -- values and environments --
    def value(self, where: str, name: str, value: str) -> str:
        if secret_name(name) and value:
            self._note(where, name, value)
            return REDACTED
        return self.urls(where, name, value)

    def urls(self, where: str, name: str, text: str) -> str:
        """Every URL's userinfo: the password (the user kept, empty or not), or a lone
        user, which in that place is a token (https://ghp_...@github.com)."""
        def hide(match):
            userinfo = match.group(2)
            if not userinfo:
                return match.group(0)
            user, colon, password = userinfo.partition(":")
            if colon:
                if not password:
                    return match.group(0)
                self._note(where, name or "url", password)
                return f"{match.group(1)}{user}:{REDACTED}@"
            self._note(where, name or "url", userinfo, scrub=len(userinfo) >= MIN_SCRUB_LONE_USER)
            return f"{match.group(1)}{REDACTED}@"

        return _URL_USERINFO.sub(hide, text) if "://" in text else text

    def environ(self, where: str, environ: dict) -> dict:
        return {k: self.value(where, k, v) for k, v in environ.items()}

    # -- config files --
    def config_text(self, where: str, text: str) -> str:
        """A config with every value under a secret-like key redacted, in any style: block
        or flow, in a sequence, a block scalar (|, >) or a nested mapping below the key.
        Lines are kept, so the evidence still reads as the file did.  The parsed document
        is walked as well, and whatever it holds under a secret key is scrubbed from every
        member: a style this line reader does not know still cannot carry a value out."""
        self._parsed_secrets(where, text)
        lines, block = [], None  # below a secret key: (its indent, "scalar" | "nested")
        ini_secret = False
        for line in text.splitlines(keepends=True):
            body = line.rstrip("\r\n")
            end = line[len(body):]
            indent = len(body) - len(body.lstrip(" \t"))
            if block is not None and _inside(body, indent, block):
                lines.append(self._hide_block_line(where, body, indent, block[1]) + end)
                continue
            block = None
            section = _INI_SECTION.match(body)
            if section:
                ini_secret = secret_name(section.group(1))
                lines.append(line)
                continue
            pair = _PAIR.match(body)  # a URL is named in the manifest by the key it stands under
            body, block = self._hide_pairs(where, body, ini_secret)
            lines.append(self.urls(where, pair.group("key") if pair else "", body) + end)
        return "".join(lines)

    def _hide_pairs(self, where: str, body: str, all_secret: bool):
        """Each key: value on one line; returns the line and the block a secret key opens
        (None, or (indent of the key, "scalar" | "nested"))."""
        out, at, block = [], 0, None
        for match in _PAIR.finditer(body):
            key = match.group("key")
            if match.start() < at or not (all_secret or secret_name(key)):
                continue  # a plain value is not consumed: a flow mapping in it is read too
            start = match.end()
            flow = match.group("lead").startswith(("{", ","))
            stop = _value_end(body, start, flow)
            bare = body[start:stop].strip()
            if not flow and (not bare or _BLOCK_SCALAR.match(bare)):
                # the value is on the lines below: a block scalar, or a mapping or sequence
                block = (match.start("key"), "nested" if not bare else "scalar")
                continue
            self._note(where, key, _unquote(bare))
            out.append(body[at:start] + REDACTED)
            at = stop
        out.append(body[at:])
        return "".join(out), block

    def _hide_block_line(self, where: str, body: str, indent: int, kind: str) -> str:
        """A line below a secret key.  In a block scalar every character is the secret; in
        a nested mapping or sequence a key keeps its name and every value goes."""
        content = body[indent:]
        item = re.match(r"(?:-[ \t]+)*", content).group() if kind == "nested" else ""
        pair = _PAIR.match(body) if kind == "nested" else None
        if pair and pair.end() < len(body.rstrip()):
            self._note(where, pair.group("key"), _unquote(body[pair.end():].strip()))
            return body[:pair.end()] + REDACTED
        if pair:
            return body  # a key that opens a deeper level
        if content[len(item):].strip():
            self._note(where, "block", content[len(item):].strip())
            return body[:indent] + item + REDACTED
        return body

    def _parsed_secrets(self, where: str, text: str) -> None:
        """Every scalar under a secret-like key of the parsed document, at any depth, noted
        for the scrub (each line of a multi-line one too: a block scalar's lines stand in
        the file one by one)."""
        from ..files import yamlio

        try:
            document = yamlio.load(text, where)
        except Exception:  # not YAML (an INI file, a damaged config): the line reader alone
            return
        stack = [(document, False)]
        while stack:
            node, secret = stack.pop()
            if isinstance(node, dict):
                stack.extend((v, secret or secret_name(str(k))) for k, v in node.items())
            elif isinstance(node, list):
                stack.extend((v, secret) for v in node)
            elif secret and node is not None and not isinstance(node, bool):
                value = str(node)
                for piece in {value.strip(), *(line.strip() for line in value.splitlines())}:
                    if len(piece) >= MIN_SCRUB:
                        self.values.add(piece)

    # -- facts and reports --
    def structure(self, where: str, value, name: str = ""):
        """Facts and report: URLs everywhere; a value under an environment-style name
        (FOO_TOKEN: ...) or in a {key/name: FOO_TOKEN, value: ...} pair."""
        if isinstance(value, dict):
            label = value.get("key", value.get("name"))
            out = {}
            for key, item in value.items():
                key = str(key)
                if key == "value" and isinstance(label, str) and isinstance(item, str) and env_name(label):
                    out[key] = self.value(where, label, item)
                else:
                    out[key] = self.structure(where, item, key if env_name(key) else "")
            return out
        if isinstance(value, list):
            return [self.structure(where, v, name) for v in value]
        if isinstance(value, str):
            return self.value(where, name, value) if name else self.urls(where, "", value)
        return value

    def maybe_structure(self, where: str, value):
        """structure(), walked only when the JSON text could hold a secret at all."""
        text = json.dumps(value)
        if "://" in text and _URL_USERINFO.search(text) or _SECRET_ENV_IN_JSON.search(text):
            return self.structure(where, value)
        return value

    # -- every member --
    def scrub(self, data: bytes, where: str = "") -> bytes:
        """A member's bytes with every secret seen elsewhere and every token shape gone."""
        for secret in sorted(self.values, key=len, reverse=True):
            for form in _forms(secret):
                if form in data:
                    data = data.replace(form, REDACTED.encode())
        for label, pattern, group, needles in TOKEN_SHAPES:
            if any(needle in data for needle in needles):
                data = self._hide_shape(where, label, pattern, group, data)
        return data

    def _hide_shape(self, where: str, label: str, pattern, group: int, data: bytes) -> bytes:
        def hide(match):
            self._note(where, label, "", scrub=False)
            start, end = match.span(group)
            return match.group(0)[:start - match.start()] + REDACTED.encode() + match.group(0)[end - match.start():]

        return pattern.sub(hide, data)

    def _note(self, where: str, name: str, value: str, scrub: bool = True) -> None:
        entry = {"where": where, "name": name}
        if entry not in self.redactions:
            self.redactions.append(entry)
        if scrub and len(value) >= MIN_SCRUB:
            self.values.add(value)


def _inside(body: str, indent: int, block) -> bool:
    """Is this line part of the value below a secret key (deeper, blank, or a sequence at
    the key's own indent, which YAML allows for a mapping's value)?"""
    key_indent, kind = block
    if not body.strip():
        return True
    if indent > key_indent:
        return True
    return kind == "nested" and indent == key_indent and body[indent:].startswith("- ")


def _value_end(body: str, start: int, flow: bool) -> int:
    """Where a value that starts at ``start`` ends: a quoted string at its closing quote, a
    bracketed one at its matching bracket; a plain value at a flow indicator in flow
    context, else at the end of the line (a block scalar may hold commas)."""
    if start >= len(body):
        return start
    first = body[start]
    if first in "\"'":
        index = start + 1
        while index < len(body):
            if body[index] == "\\" and first == '"':
                index += 2
                continue
            if body[index] == first:
                return index + 1
            index += 1
        return len(body)
    if first in "[{":
        depth = 0
        for index in range(start, len(body)):
            if body[index] in "[{":
                depth += 1
            elif body[index] in "]}":
                depth -= 1
                if depth == 0:
                    return index + 1
        return len(body)
    if flow:
        match = re.compile(r"[,}\]]").search(body, start)
        return match.start() if match else len(body)
    return len(body.rstrip())


def _unquote(value: str) -> str:
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'" else value


def _forms(secret: str) -> list:
    """The byte forms a secret takes in our members: raw, and inside JSON strings."""
    raw = secret.encode("utf-8", "surrogateescape")
    escaped = json.dumps(secret)[1:-1].encode("utf-8", "surrogateescape")
    ascii_escaped = json.dumps(secret, ensure_ascii=True)[1:-1].encode()
    return list(dict.fromkeys((raw, escaped, ascii_escaped)))
