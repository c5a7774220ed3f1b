"""Lua scripts kept as ``.lua`` files in a backend package's ``lua/`` folder."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files

__all__ = ["LuaScript", "load_script"]


@dataclass(frozen=True)
class LuaScript:
    """A script's source and SHA1 (the SHA is what EVALSHA names it by)."""

    name: str
    source: str
    sha: str


def load_script(package: str, name: str) -> LuaScript:
    """Read ``lua/<name>.lua`` of ``package``; the SHA is computed locally."""
    source = (files(package) / "lua" / f"{name}.lua").read_text(encoding="utf-8")
    return LuaScript(name, source, hashlib.sha1(source.encode()).hexdigest())
