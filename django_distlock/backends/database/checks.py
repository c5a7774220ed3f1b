"""System checks of a database backend's ``LOCKS`` entry."""

from __future__ import annotations

import sqlite3
from typing import Any

from .connections import transaction_pooled
from .dialects import DIALECTS

__all__ = ["DEFAULT_MAX_BACKOFF", "OPTION_KEYS", "check_entry"]

#: The keys of ``OPTIONS`` the backend reads.
OPTION_KEYS = {"DATABASE", "MAX_BACKOFF", "WAIT"}
#: Longest sleep between two polls of a busy lock, seconds, by default.
DEFAULT_MAX_BACKOFF = 0.05


def check_entry(backend_cls: type, alias: str, params: dict[str, Any]) -> list:
    """Return system check messages for the ``LOCKS[alias]`` entry ``params``."""
    from django.conf import settings
    from django.core.checks import Error, Warning
    from django.db import connections

    where = f"LOCKS[{alias!r}]['OPTIONS']"
    options = params.get("OPTIONS") or {}
    errors: list = []
    keys = backend_cls.OPTION_KEYS
    unknown = sorted(set(options) - keys)
    if unknown:
        errors.append(
            Error(
                f"{where} has unknown keys: {unknown}.",
                hint=f"{backend_cls.__name__} accepts {sorted(keys)}.",
                obj="settings.LOCKS",
                id="distlock.E009",
            )
        )
    backoff = options.get("MAX_BACKOFF", DEFAULT_MAX_BACKOFF)
    if (
        isinstance(backoff, bool)
        or not isinstance(backoff, (int, float))
        or (not backoff > 0)
    ):
        errors.append(
            Error(
                f"{where}['MAX_BACKOFF'] must be a positive number of seconds.",
                hint="The default, 0.05, makes a waiter notice a release "
                "within about 50 ms.",
                obj="settings.LOCKS",
                id="distlock.E009",
            )
        )
    wait = options.get("WAIT", "poll")
    if wait not in ("poll", "notify"):
        errors.append(
            Error(
                f"{where}['WAIT'] must be 'poll' or 'notify', not {wait!r}.",
                hint="'notify' (PostgreSQL only) wakes waiters with "
                "LISTEN/NOTIFY instead of polling.",
                obj="settings.LOCKS",
                id="distlock.E009",
            )
        )
    database = options.get("DATABASE", "default")
    if not isinstance(database, str) or database not in settings.DATABASES:
        errors.append(
            Error(
                f"{where}['DATABASE'] is {database!r}, which is not in "
                "settings.DATABASES.",
                hint="Name a DATABASES alias (default 'default') whose "
                "database has the django_distlock migrations applied.",
                obj="settings.LOCKS",
                id="distlock.E012",
            )
        )
        return errors
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
