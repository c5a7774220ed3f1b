"""Turn lock names into backend keys that are safe whatever the name.

A name is any Python string. Keys never contain the name itself, only a
fixed-length digest of it, so that no name can reach outside the key prefix,
two different names never share a key (no normalisation is applied: the
digest is of the exact code points), and keys stay small for any name length.
The full name is stored beside the lease for listing.
"""

import base64
import hashlib

__all__ = ["glob_escape", "name_digest"]


def name_digest(name: str) -> str:
    """Return the URL-safe base64 SHA-256 digest (43 chars) of ``name``.

    Lone surrogates are encoded as-is (``surrogatepass``) so that every str,
    even one that is not valid Unicode text, maps to its own digest.
    """
    raw = hashlib.sha256(name.encode("utf-8", "surrogatepass")).digest()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def encode_name(name: str) -> bytes:
    """Return ``name`` as bytes for storage, round-tripping any str."""
    return name.encode("utf-8", "surrogatepass")


def decode_name(raw: bytes | str) -> str:
    """Inverse of :func:`encode_name`."""
    if isinstance(raw, str):
        return raw
    return raw.decode("utf-8", "surrogatepass")


def glob_escape(text: str) -> str:
    """Escape ``text`` for a Redis MATCH pattern so it matches only itself."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
