"""System checks of the Redis backends' LOCKS entries, beyond their OPTIONS schema.

The schema itself is declared on :class:`~.plain.RedisLockBackend`; every
message names the entry, has a hint and an id (``docs/settings.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..options import Option
from .client import CLUSTER_SCHEMES

__all__ = ["CONNECTION_KEYS", "Sentinels", "check_redis"]

#: OPTIONS that set up a connection of the backend's own: with ``CACHE`` the
#: django-redis pool's settings apply, and these would be silently ignored.
CONNECTION_KEYS = frozenset(
    {
        "SOCKET_TIMEOUT",
        "SOCKET_CONNECT_TIMEOUT",
        "CONNECTION_POOL_KWARGS",
        "CLUSTER",
        "SENTINELS",
        "SERVICE_NAME",
        "SENTINEL_KWARGS",
    }
)


@dataclass(frozen=True)
class Sentinels(Option):
    """``OPTIONS["SENTINELS"]``: a non-empty list of ``(host, port)`` pairs."""

    def problem(self, value: Any) -> str | None:
        """Return what is wrong with ``value``, or None."""
        ok = isinstance(value, (list, tuple)) and len(value) > 0
        for entry in value if ok else ():
            ok = ok and (
                isinstance(entry, (list, tuple))
                and len(entry) == 2
                and isinstance(entry[0], str)
                and isinstance(entry[1], int)
                and not isinstance(entry[1], bool)
                and 0 < entry[1] < 65536
            )
        if ok:
            return None
        return f"must be a non-empty list of (host, port) pairs, not {value!r}"


def _error(msg: str, hint: str, id: str):
    from django.core.checks import Error

    return Error(msg, hint=hint, obj="settings.LOCKS", id=id)


def check_redis(alias: str, params: dict[str, Any]) -> list:
    """Return the check errors of a Redis LOCKS entry beyond its OPTIONS schema.

    The cache or LOCATION it reaches Redis through, and the Cluster and
    Sentinel forms.
    """
    where = f"LOCKS[{alias!r}]"
    options = params.get("OPTIONS") or {}
    if options.get("CACHE") is not None:
        return _check_cache(where, options)
    location = params.get("LOCATION")
    scale_out = _check_scale_out(where, location, options)
    if scale_out is not None:
        return scale_out
    if not location:
        return [
            _error(
                f"{where} has no LOCATION.",
                "Set LOCATION to a redis URL such as 'redis://127.0.0.1:6379/0', "
                "or OPTIONS={'CACHE': '<django-redis cache alias>'}.",
                "distlock.E004",
            )
        ]
    if not isinstance(location, str) or not location.startswith(
        ("redis://", "rediss://", "unix://")
    ):
        return [
            _error(
                f"{where}['LOCATION'] must be one redis URL, not {location!r}.",
                "Use redis://host:port/db, rediss:// for TLS or unix:///path.",
                "distlock.E004",
            )
        ]
    return []


def _check_cache(where: str, options: dict) -> list:
    """Check that nothing is set beside ``OPTIONS["CACHE"]``."""
    beside = sorted(CONNECTION_KEYS & set(options))
    if not beside:
        return []
    cache = options["CACHE"]
    return [
        _error(
            f"{where}['OPTIONS'] has {beside} beside CACHE: the cache's "
            "connection pool is reused with its own settings, so these "
            "would be ignored.",
            f"Set them in CACHES[{cache!r}]['OPTIONS'] (e.g. SOCKET_TIMEOUT), "
            "or drop CACHE and give the lock a LOCATION of its own.",
            "distlock.E025",
        )
    ]


def _check_scale_out(where: str, location: Any, options: dict) -> list | None:
    """Check the Cluster/Sentinel forms; None if the entry uses neither.

    The values of their OPTIONS are the schema's to check; this checks how
    they go together, and the cluster LOCATION.
    """
    from django.core.checks import Error

    def error(msg: str, hint: str) -> Error:
        return Error(msg, hint=hint, obj="settings.LOCKS", id="distlock.E015")

    sentinels = options.get("SENTINELS")
    cluster_url = isinstance(location, str) and location.startswith(CLUSTER_SCHEMES)
    if sentinels is None and not cluster_url and "CLUSTER" not in options:
        if "SERVICE_NAME" in options or "SENTINEL_KWARGS" in options:
            return [
                error(
                    f"{where}['OPTIONS'] has SERVICE_NAME/SENTINEL_KWARGS "
                    "but no SENTINELS.",
                    "Add OPTIONS['SENTINELS'] = [('host', 26379), ...].",
                )
            ]
        return None
    errors = []
    if sentinels is not None:
        if options.get("CLUSTER") or cluster_url:
            errors.append(
                error(
                    f"{where} names both a Redis Cluster and Sentinels.",
                    "Use either a cluster LOCATION or OPTIONS['SENTINELS'].",
                )
            )
        if location:
            errors.append(
                error(
                    f"{where} has a LOCATION and OPTIONS['SENTINELS'].",
                    "With Sentinel, remove LOCATION: the sentinels name the primary.",
                )
            )
        if "SERVICE_NAME" not in options:
            errors.append(
                error(
                    f"{where}['OPTIONS']['SERVICE_NAME'] must name the "
                    "monitored primary.",
                    "Use the name of the `sentinel monitor <name> ...` line.",
                )
            )
        return errors
    if not isinstance(location, str) or not location.startswith(
        ("redis://", "rediss://", *CLUSTER_SCHEMES)
    ):
        errors.append(
            error(
                f"{where}['LOCATION'] must be one redis URL of a cluster "
                f"node, not {location!r}.",
                "Use redis+cluster://host:port (rediss+cluster:// for TLS).",
            )
        )
    elif "/" in location.split("://", 1)[1].rstrip("/"):
        errors.append(
            error(
                f"{where}['LOCATION'] names a database; a Redis Cluster "
                "has only database 0.",
                "Remove the /<db> part of the URL.",
            )
        )
    return errors
