"""Lua scripts kept as ``.lua`` files beside their backend, loaded once."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

__all__ = ["LuaScript", "load_script"]

_HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class LuaScript:
    """A script's source and SHA1, called with EVALSHA (EVAL-loaded on a miss)."""

    name: str
    source: str
    sha: str


@cache
def load_script(filename: str) -> LuaScript:
    """Read ``filename`` from the backends package; the SHA is computed locally."""
    source = (_HERE / filename).read_text(encoding="utf-8")
    return LuaScript(filename, source, hashlib.sha1(source.encode()).hexdigest())
