"""The ``LOCKS`` setting, read like ``CACHES``: ``locks["alias"]`` is a backend."""

from __future__ import annotations

import os
import threading
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.utils.connection import BaseConnectionHandler
from django.utils.module_loading import import_string

from .backends.base import BaseLockBackend
from .exceptions import InvalidLockBackendError

__all__ = ["DEFAULT_LOCK_ALIAS", "DEFAULT_LOCKS", "LockHandler", "locks"]

DEFAULT_LOCK_ALIAS = "default"
DEFAULT_LOCKS = {
    DEFAULT_LOCK_ALIAS: {
        "BACKEND": "django_distlock.backends.database.DatabaseLockBackend",
        "OPTIONS": {"DATABASE": "default"},
    }
}


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
        params = dict(self.settings[alias])
        backend = params.get("BACKEND")
        try:
            backend_cls = import_string(backend)
        except (ImportError, TypeError) as e:
            raise InvalidLockBackendError(
                f"Could not find lock backend {backend!r} for LOCKS[{alias!r}]: {e}"
            ) from e
        return backend_cls(alias, params)

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


def _reset_locks(*, setting: str, **kwargs: Any) -> None:
    if setting == "LOCKS":
        locks.reset()


setting_changed.connect(_reset_locks)
os.register_at_fork(after_in_child=locks.forget_after_fork)
