"""System checks of a ZooKeeper ``LOCKS`` entry (``distlock.E016``).

Its OPTIONS are checked by the schema the backend declares.
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_location"]


def check_location(alias: str, params: dict[str, Any]) -> list:
    """Return the errors of the ZooKeeper ``LOCATION`` of ``LOCKS[alias]``."""
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
    return errors
