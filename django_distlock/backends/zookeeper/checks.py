"""System checks of a ZooKeeper ``LOCKS`` entry (``distlock.E016``)."""

from __future__ import annotations

from typing import Any

__all__ = ["check_entry"]


def check_entry(
    alias: str, params: dict[str, Any], option_keys: set[str], backend: str
) -> list:
    """Return the errors of ``LOCKS[alias]`` for the ZooKeeper backend."""
    from django.core.checks import Error

    where = f"LOCKS[{alias!r}]"
    errors = []

    def error(msg: str, hint: str) -> None:
        errors.append(Error(msg, hint=hint, obj="settings.LOCKS", id="distlock.E016"))

    location = params.get("LOCATION")
    hosts = location if isinstance(location, (list, tuple)) else None
    if isinstance(location, str):
        hosts = location.split("/", 1)[0].split(",")
    ok = bool(hosts)
    for host in hosts or ():
        h, _, port = str(host).rpartition(":") if ":" in str(host) else (host, "", "")
        ok = ok and isinstance(host, str) and bool(h or port)
        ok = ok and (port == "" or (port.isdigit() and 0 < int(port) < 65536))
    if not ok:
        error(
            f"{where}['LOCATION'] must be 'host:port[,host:port...]' or a list "
            f"of 'host:port', not {location!r}.",
            "For example '10.0.0.1:2181,10.0.0.2:2181,10.0.0.3:2181'.",
        )
    options = params.get("OPTIONS") or {}
    unknown = sorted(set(options) - option_keys)
    if unknown:
        error(
            f"{where}['OPTIONS'] has unknown keys: {unknown}.",
            f"{backend} accepts {sorted(option_keys)}.",
        )
    for key in ("SESSION_TIMEOUT", "CONNECT_TIMEOUT"):
        value = options.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            error(
                f"{where}['OPTIONS'][{key!r}] must be a positive number of seconds.",
                "SESSION_TIMEOUT bounds how long a dead process keeps its locks.",
            )
    if not isinstance(options.get("KAZOO_KWARGS", {}), dict):
        error(
            f"{where}['OPTIONS']['KAZOO_KWARGS'] must be a dict.",
            "It is passed to kazoo's KazooClient as keyword arguments.",
        )
    return errors
