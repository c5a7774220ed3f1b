"""System checks of a Redlock ``LOCKS`` entry's LOCATION (its nodes).

Its OPTIONS are checked by the schema the backend declares.
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_location"]


def check_location(alias: str, params: dict[str, Any]) -> list:
    """Return the check messages of the Redlock nodes of ``LOCKS[alias]``."""
    from django.core.checks import Error, Warning

    where = f"LOCKS[{alias!r}]"
    location = params.get("LOCATION")
    if not isinstance(location, (list, tuple)) or not all(
        isinstance(url, str) and url.startswith(("redis://", "rediss://", "unix://"))
        for url in location
    ):
        return [
            Error(
                f"{where}['LOCATION'] must be a list of redis URLs, not {location!r}.",
                hint="List one URL per independent Redis master, e.g. "
                "['redis://10.0.0.1:6379', 'redis://10.0.0.2:6379', "
                "'redis://10.0.0.3:6379'].",
                obj="settings.LOCKS",
                id="distlock.E004",
            )
        ]
    messages = []
    if len(location) < 3:
        messages.append(
            Error(
                f"{where} lists {len(location)} Redis node(s); Redlock "
                "needs at least 3.",
                hint="With fewer than 3 independent masters a single "
                "failure loses the quorum; use RedisLockBackend for one "
                "server, or list 3 or 5 masters.",
                obj="settings.LOCKS",
                id="distlock.E011",
            )
        )
    elif len(location) % 2 == 0:
        messages.append(
            Warning(
                f"{where} lists an even number of Redis nodes ({len(location)}).",
                hint=f"{len(location)} nodes tolerate no more failures than "
                f"{len(location) - 1}; use an odd number.",
                obj="settings.LOCKS",
                id="distlock.W001",
            )
        )
    if len(set(location)) != len(location):
        messages.append(
            Error(
                f"{where}['LOCATION'] lists the same node twice.",
                hint="Every URL must be a different, independent master.",
                obj="settings.LOCKS",
                id="distlock.E004",
            )
        )
    return messages
