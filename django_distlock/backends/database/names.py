"""Lock names as stored in the lock table, and the row key of a name."""

from __future__ import annotations

import hashlib
import re

__all__ = ["decode_name", "encode_name", "record_digest"]

_ESCAPE = re.compile("[\\\\\x00\ud800-\udfff]")
_UNESCAPE = re.compile(r"\\(\\|0|u[0-9a-f]{4})")


def encode_name(name: str) -> str:
    """Return ``name`` as storable text: ``\\``, NUL, lone surrogates escaped.

    PostgreSQL text cannot hold NUL and no driver sends lone surrogates; the
    escaping is per character, so ``encode_name`` keeps prefixes.
    """

    def escape(match: re.Match) -> str:
        ch = match.group()
        if ch == "\\":
            return "\\\\"
        if ch == "\x00":
            return "\\0"
        return f"\\u{ord(ch):04x}"

    return _ESCAPE.sub(escape, name)


def decode_name(stored: str) -> str:
    """Inverse of :func:`encode_name`."""
    if "\\" not in stored:
        return stored

    def unescape(match: re.Match) -> str:
        code = match.group(1)
        if code == "\\":
            return "\\"
        if code == "0":
            return "\x00"
        return chr(int(code[1:], 16))

    return _UNESCAPE.sub(unescape, stored)


def record_digest(namespace: str, name: str) -> str:
    """Return the row key of ``name`` under ``namespace`` (64 hex digits).

    Hex, not base64: MySQL's default collations compare case-insensitively.
    """
    raw = f"{len(namespace)}:{namespace}:{name}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(raw).hexdigest()
