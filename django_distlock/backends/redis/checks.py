"""System checks of the Redis backends' LOCKS entries (read by ``checks.py``).

Every message names the entry, has a hint and an id (``docs/settings.md``).
"""

from __future__ import annotations

from typing import Any

from .client import CLUSTER_SCHEMES, WAIT_SHARE

__all__ = ["CONNECTION_KEYS", "OPTION_KEYS", "check_redis"]

OPTION_KEYS = frozenset(
    {
        "CACHE",
        "SOCKET_TIMEOUT",
        "SOCKET_CONNECT_TIMEOUT",
        "CONNECTION_POOL_KWARGS",
        "CLUSTER",
        "SENTINELS",
        "SERVICE_NAME",
        "SENTINEL_KWARGS",
        "WAIT_REPLICAS",
        "WAIT_REPLICAS_TIMEOUT",
    }
)
#: OPTIONS that set up a connection of the backend's own: with ``CACHE`` the
#: django-redis pool's settings apply, and these would be silently ignored.
CONNECTION_KEYS = OPTION_KEYS - {"CACHE", "WAIT_REPLICAS", "WAIT_REPLICAS_TIMEOUT"}
#: The part of the socket timeout that a blocking wait leaves: WAIT after a
#: waiter's BLPOP must fit in it.
WAIT_ROOM = round(1 - WAIT_SHARE, 6)


def _error(msg: str, hint: str, id: str):
    from django.core.checks import Error

    return Error(msg, hint=hint, obj="settings.LOCKS", id=id)


def check_redis(backend: str, alias: str, params: dict[str, Any]) -> list:
    """Return system check errors for one Redis backend LOCKS entry."""
    where = f"LOCKS[{alias!r}]"
    options = params.get("OPTIONS") or {}
    errors = []
    unknown = sorted(set(options) - OPTION_KEYS)
    if unknown:
        errors.append(
            _error(
                f"{where}['OPTIONS'] has unknown keys: {unknown}.",
                f"{backend} accepts {sorted(OPTION_KEYS)}.",
                "distlock.E009",
            )
        )
    for key in ("SOCKET_TIMEOUT", "SOCKET_CONNECT_TIMEOUT"):
        value = options.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            errors.append(
                _error(
                    f"{where}['OPTIONS'][{key!r}] must be a positive number "
                    "of seconds.",
                    "Without socket timeouts a paused server hangs callers.",
                    "distlock.E009",
                )
            )
    errors += _check_wait_replicas(where, options)
    if not isinstance(options.get("CONNECTION_POOL_KWARGS", {}), dict):
        errors.append(
            _error(
                f"{where}['OPTIONS']['CONNECTION_POOL_KWARGS'] must be a dict.",
                "It is passed to redis-py as keyword arguments.",
                "distlock.E009",
            )
        )
    cache = options.get("CACHE")
    if cache is not None:
        return errors + _check_cache(where, cache, options)
    location = params.get("LOCATION")
    scale_out = _check_scale_out(where, location, options)
    if scale_out is not None:
        return errors + scale_out
    if not location:
        errors.append(
            _error(
                f"{where} has no LOCATION.",
                "Set LOCATION to a redis URL such as 'redis://127.0.0.1:6379/0', "
                "or OPTIONS={'CACHE': '<django-redis cache alias>'}.",
                "distlock.E004",
            )
        )
    elif not isinstance(location, str) or not location.startswith(
        ("redis://", "rediss://", "unix://")
    ):
        errors.append(
            _error(
                f"{where}['LOCATION'] must be one redis URL, not {location!r}.",
                "Use redis://host:port/db, rediss:// for TLS or unix:///path.",
                "distlock.E004",
            )
        )
    return errors


def _check_cache(where: str, cache: Any, options: dict) -> list:
    """Check ``OPTIONS["CACHE"]``: a django-redis cache, and nothing beside it."""
    from django.conf import settings

    errors = []
    backend = (getattr(settings, "CACHES", {}).get(cache) or {}).get("BACKEND", "")
    if not backend.startswith("django_redis."):
        errors.append(
            _error(
                f"{where}['OPTIONS']['CACHE'] is {cache!r}, which is not a "
                "django-redis cache in CACHES.",
                "Name a CACHES alias whose BACKEND is "
                "'django_redis.cache.RedisCache', or set LOCATION instead.",
                "distlock.E010",
            )
        )
    beside = sorted(CONNECTION_KEYS & set(options))
    if beside:
        errors.append(
            _error(
                f"{where}['OPTIONS'] has {beside} beside CACHE: the cache's "
                "connection pool is reused with its own settings, so these "
                "would be ignored.",
                f"Set them in CACHES[{cache!r}]['OPTIONS'] (e.g. SOCKET_TIMEOUT), "
                "or drop CACHE and give the lock a LOCATION of its own.",
                "distlock.E025",
            )
        )
    return errors


def _check_scale_out(where: str, location: Any, options: dict) -> list | None:
    """Check the Cluster/Sentinel forms; None if the entry uses neither."""
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
        ok = isinstance(sentinels, (list, tuple)) and len(sentinels) > 0
        for entry in sentinels if ok else ():
            ok = ok and (
                isinstance(entry, (list, tuple))
                and len(entry) == 2
                and isinstance(entry[0], str)
                and isinstance(entry[1], int)
                and not isinstance(entry[1], bool)
                and 0 < entry[1] < 65536
            )
        if not ok:
            errors.append(
                error(
                    f"{where}['OPTIONS']['SENTINELS'] must be a non-empty "
                    f"list of (host, port) pairs, not {sentinels!r}.",
                    "For example [('10.0.0.1', 26379), ('10.0.0.2', 26379)].",
                )
            )
        name = options.get("SERVICE_NAME")
        if not isinstance(name, str) or not name:
            errors.append(
                error(
                    f"{where}['OPTIONS']['SERVICE_NAME'] must name the "
                    "monitored primary.",
                    "Use the name of the `sentinel monitor <name> ...` line.",
                )
            )
        if not isinstance(options.get("SENTINEL_KWARGS", {}), dict):
            errors.append(
                error(
                    f"{where}['OPTIONS']['SENTINEL_KWARGS'] must be a dict.",
                    "It is passed to redis-py's Sentinel as sentinel_kwargs.",
                )
            )
        return errors
    if "CLUSTER" in options and not isinstance(options["CLUSTER"], bool):
        errors.append(
            error(
                f"{where}['OPTIONS']['CLUSTER'] must be True or False.",
                "True treats LOCATION as one node of a Redis Cluster.",
            )
        )
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


def _check_wait_replicas(where: str, options: dict) -> list:
    """Check ``WAIT_REPLICAS`` and ``WAIT_REPLICAS_TIMEOUT`` (distlock.E029)."""
    errors = []
    replicas = options.get("WAIT_REPLICAS", 0)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        errors.append(
            _error(
                f"{where}['OPTIONS']['WAIT_REPLICAS'] must be a whole number "
                f"of replicas (0 or more), not {replicas!r}.",
                "A grant counts once that many replicas confirmed it (WAIT); "
                "0 (the default) does not wait.",
                "distlock.E029",
            )
        )
    if "WAIT_REPLICAS_TIMEOUT" not in options:
        return errors
    timeout = options["WAIT_REPLICAS_TIMEOUT"]
    socket_timeout = options.get("SOCKET_TIMEOUT", 2.0)
    number = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
    if not number or timeout <= 0:
        problem = "must be a positive number of seconds"
    elif (
        "CACHE" not in options
        and isinstance(socket_timeout, (int, float))
        and timeout >= socket_timeout * WAIT_ROOM
    ):
        problem = (
            f"must be shorter than {WAIT_ROOM:g} x SOCKET_TIMEOUT "
            f"({socket_timeout * WAIT_ROOM:g} s)"
        )
    else:
        return errors
    errors.append(
        _error(
            f"{where}['OPTIONS']['WAIT_REPLICAS_TIMEOUT'] {problem}, not {timeout!r}.",
            "It bounds how long an acquisition waits for its replicas "
            "(default 0.1 s); a waiter's blocking wait and WAIT share one "
            "socket timeout.",
            "distlock.E029",
        )
    )
    return errors
