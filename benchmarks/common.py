"""Pieces shared by the scenarios: the compare-and-delete floor, names."""

from __future__ import annotations

import secrets
import warnings

#: The release half of the floor: delete the key only if it holds our token.
CAD_SCRIPT = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""

TTL_MS = 30_000


def token() -> str:
    """A fresh 32-character lock token, as a safe lock needs per acquisition."""
    return secrets.token_hex(16)


def quiet_imports() -> None:
    """Silence peers' import-time deprecation warnings in the output."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", module="pottery")


def floor_cycle(client, key: str):
    """Return the raw floor: SET NX PX + EVALSHA compare-and-delete."""
    sha = client.script_load(CAD_SCRIPT)

    def cycle():
        tok = token()
        if not client.set(key, tok, nx=True, px=TTL_MS):
            raise RuntimeError(f"floor: {key} unexpectedly held")
        if client.evalsha(sha, 1, key, tok) != 1:
            raise RuntimeError(f"floor: {key} release found it gone")

    return cycle
