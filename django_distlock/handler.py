"""The ``LOCKS`` setting, read like ``CACHES``: ``locks["alias"]`` is a backend."""

from __future__ import annotations

import os
import threading
from typing import Any

from django.apps import apps as django_apps
from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, register
from django.core.signals import setting_changed
from django.utils.connection import BaseConnectionHandler
from django.utils.module_loading import import_string

from .backends.base import BaseLockBackend
from .exceptions import InvalidLockBackendError

__all__ = [
    "DEFAULT_LOCK_ALIAS",
    "DEFAULT_LOCKS",
    "LockHandler",
    "amissing_table",
    "locks",
    "missing_table",
]

DEFAULT_LOCK_ALIAS = "default"
DEFAULT_LOCKS = {
    DEFAULT_LOCK_ALIAS: {
        "BACKEND": "django_distlock.backends.database.DatabaseLockBackend",
        "OPTIONS": {"DATABASE": "default"},
    }
}


APP = "django_distlock"
NOT_INSTALLED = (
    f"{APP!r} is not in INSTALLED_APPS: add it there. Its system checks, "
    "its lock table (migrations) and its admin page need it."
)


@register("distlock")
def check_app_installed(app_configs=None, **kwargs) -> list[CheckMessage]:
    """Report django_distlock used but missing from ``INSTALLED_APPS``.

    Registered when the package is imported, so that it runs even then (the
    app's own checks are registered by its AppConfig).
    """
    if django_apps.is_installed(APP):
        return []
    return [
        Error(
            f"{APP} is imported, but {APP!r} is not in INSTALLED_APPS.",
            hint=f"Add {APP!r} to INSTALLED_APPS: its system checks, its lock "
            "table (migrations) and its admin page need it.",
            obj="settings.INSTALLED_APPS",
            id="distlock.E018",
        )
    ]


class _ProcessWide:
    """Attribute storage shared by every thread (unlike Django's thread Local).

    A lock backend owns thread-safe connection pools and is meant to be one
    per alias and process, so the handler does not make one per thread.
    """


class LockHandler(BaseConnectionHandler):
    """Create and hold one lock backend per ``LOCKS`` alias and process."""

    settings_name = "LOCKS"
    exception_class = InvalidLockBackendError

    def __init__(self, settings: dict[str, Any] | None = None):
        super().__init__(settings)
        self._connections = _ProcessWide()
        self._create_lock = threading.Lock()

    def configure_settings(self, settings):
        if settings is None:
            settings = getattr(django_settings, self.settings_name, None)
        if settings is None:
            settings = DEFAULT_LOCKS
        return settings

    def __getitem__(self, alias: str) -> BaseLockBackend:
        try:
            return getattr(self._connections, alias)
        except AttributeError:
            pass
        with self._create_lock:
            try:
                return getattr(self._connections, alias)
            except AttributeError:
                if alias not in self.settings:
                    raise self.exception_class(
                        f"The lock backend {alias!r} is not in settings.LOCKS."
                    ) from None
                backend = self.create_connection(alias)
                setattr(self._connections, alias, backend)
                return backend

    def create_connection(self, alias: str) -> BaseLockBackend:
        if django_apps.ready and not django_apps.is_installed(APP):
            raise InvalidLockBackendError(NOT_INSTALLED)
        params = dict(self.settings[alias])
        backend = params.get("BACKEND")
        try:
            backend_cls = import_string(backend)
        except (ImportError, TypeError) as e:
            raise InvalidLockBackendError(
                f"Could not find lock backend {backend!r} for LOCKS[{alias!r}]: {e}"
            ) from e
        instance = backend_cls(alias, params)
        # What the backend needs from above reaches it through the contract:
        # a loss it finds on its own (a ZooKeeper session ending) is reported
        # like the watchdog's own findings.
        from .watchdog import report_lost

        instance.loss_reporter = report_lost
        return instance

    def reset(self) -> None:
        """Close every backend and forget the settings (settings changed)."""
        self.close_all()
        self._connections = _ProcessWide()
        self._settings = None
        self.__dict__.pop("settings", None)

    def forget_after_fork(self) -> None:
        """Drop the parent's backends in a forked child without closing them.

        Their sockets belong to the parent; the child makes its own.
        """
        self._connections = _ProcessWide()
        self._create_lock = threading.Lock()

    def close_all(self) -> None:
        for alias in list(vars(self._connections)):
            getattr(self._connections, alias).close()


locks = LockHandler()


def missing_table(backend: BaseLockBackend, error: Exception) -> None:
    """Raise InvalidLockBackendError if ``error`` means a forgotten migrate.

    A database backend whose lock table does not exist fails every call with
    a LockBackendError, which a view answers ``503 Service Unavailable``:
    it looks like an outage, and waiting will not mend it. Called with that
    error; asks the database for its tables only if the driver's error names
    the backend's tables (not when the server could not be reached: the
    probe, on Django's own connection, would wait for it without the lock
    connections' timeouts). Returns if the table is there.
    """
    from .backends.database import DatabaseLockBackend
    from .backends.database.connections import names_lock_tables

    if not isinstance(backend, DatabaseLockBackend):
        return
    if error.__cause__ is None or not names_lock_tables(str(error.__cause__)):
        return
    from django.db import connections

    from .models import LockRecord

    table = LockRecord._meta.db_table
    try:
        with connections[backend.database].cursor() as cursor:
            tables = connections[backend.database].introspection.table_names(cursor)
    except Exception:
        return  # the database itself is down: the LockBackendError stands
    if table in tables:
        return
    raise InvalidLockBackendError(
        f"The lock table {table!r} of LOCKS[{backend.alias!r}] does not exist "
        f"on database {backend.database!r}: run "
        f"'python manage.py migrate django_distlock --database {backend.database}'."
    ) from error


async def amissing_table(backend: BaseLockBackend, error: Exception) -> None:
    """Async twin of :func:`missing_table`."""
    from asgiref.sync import sync_to_async

    await sync_to_async(missing_table)(backend, error)


def _reset_locks(*, setting: str, **kwargs: Any) -> None:
    if setting == "LOCKS":
        locks.reset()


setting_changed.connect(_reset_locks)
os.register_at_fork(after_in_child=locks.forget_after_fork)
