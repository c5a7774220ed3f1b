"""System checks of a database backend's ``LOCKS`` entry."""

from __future__ import annotations

import sqlite3
from typing import Any

from .connections import driver_without_notifies, transaction_pooled
from .dialects import DIALECTS

__all__ = ["DEFAULT_MAX_BACKOFF", "check_database"]

#: Longest sleep between two polls of a busy lock, seconds, by default.
DEFAULT_MAX_BACKOFF = 0.05


def check_database(alias: str, params: dict[str, Any]) -> list:
    """Return the check messages of ``LOCKS[alias]`` about its database.

    Whether the backend can use the database that ``OPTIONS["DATABASE"]``
    names, and ``WAIT = "notify"`` there; the values themselves are the
    OPTIONS schema's to check.
    """
    from django.conf import settings
    from django.core.checks import Error, Warning
    from django.db import connections

    where = f"LOCKS[{alias!r}]['OPTIONS']"
    options = params.get("OPTIONS") or {}
    errors: list = []
    wait = options.get("WAIT", "poll")
    database = options.get("DATABASE", "default")
    if not isinstance(database, str) or database not in settings.DATABASES:
        return errors  # the schema reports it (distlock.E012)
    vendor = connections[database].vendor
    if wait == "notify" and vendor != "postgresql":
        errors.append(
            Error(
                f"{where}['WAIT'] is 'notify' on {database!r}, a {vendor} database.",
                hint="LISTEN/NOTIFY exists on PostgreSQL only; leave WAIT out to poll.",
                obj="settings.LOCKS",
                id="distlock.E009",
            )
        )
    elif wait == "notify" and (
        driver := driver_without_notifies(connections[database])
    ):
        errors.append(
            Error(
                f"{where}['WAIT'] is 'notify' on {database!r}, which Django "
                f"reaches through {driver}.",
                hint="Waiting for a notification with a timeout needs psycopg "
                '3.2 or later: pip install "django-distlock[postgres]", or '
                "leave WAIT out to poll.",
                obj="settings.LOCKS",
                id="distlock.E009",
            )
        )
    elif wait == "notify" and transaction_pooled(vendor, settings.DATABASES[database]):
        errors.append(
            Warning(
                f"{where}['WAIT'] is 'notify' on {database!r}, which is reached "
                "through a transaction pooler (DISABLE_SERVER_SIDE_CURSORS = True).",
                hint="LISTEN needs a server session of its own, which a pooler in "
                "transaction mode does not keep: waiters on this alias poll "
                "instead. Leave WAIT out, or give the lock backend a DATABASES "
                "entry that reaches PostgreSQL directly.",
                obj="settings.LOCKS",
                id="distlock.W005",
            )
        )
    if vendor not in DIALECTS:
        errors.append(
            Error(
                f"{where}['DATABASE'] is {database!r}, a {vendor} database, "
                "which the database lock backend does not support.",
                hint="Use PostgreSQL, MySQL/MariaDB or SQLite, or another "
                "lock backend.",
                obj="settings.LOCKS",
                id="distlock.E014",
            )
        )
    elif vendor == "sqlite":
        if sqlite3.sqlite_version_info < (3, 35):
            errors.append(
                Error(
                    f"{where}['DATABASE'] is {database!r}, on SQLite "
                    f"{sqlite3.sqlite_version}; the lock backend needs 3.35+.",
                    hint="It uses UPDATE ... RETURNING; upgrade SQLite.",
                    obj="settings.LOCKS",
                    id="distlock.E014",
                )
            )
        if settings.DATABASES[database].get("ATOMIC_REQUESTS"):
            errors.append(
                Warning(
                    f"LOCKS[{alias!r}] keeps its locks in SQLite database "
                    f"{database!r}, which has ATOMIC_REQUESTS = True.",
                    hint="SQLite has one writer at a time: a lock taken or "
                    "released inside a request's write transaction waits for "
                    "that transaction. Keep the locks in a separate SQLite "
                    "file (another DATABASES alias) or use another backend.",
                    obj="settings.LOCKS",
                    id="distlock.W003",
                )
            )
    return errors
