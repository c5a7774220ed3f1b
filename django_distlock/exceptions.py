"""The whole error hierarchy of django_distlock.

Every error a caller can meet derives from :class:`LockError`, so
``except LockError`` is always enough. Driver errors (redis-py, database
drivers) never leak: backends re-raise them as :class:`LockBackendError`
with the original chained as ``__cause__``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from .backends.base import Holder

__all__ = [
    "InvalidLockBackendError",
    "LockBackendError",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "LockNotHeld",
    "StaleFencingToken",
]


class LockError(Exception):
    """Base class of every django_distlock error."""

    def __init__(self, message: str = "", *, name: str | None = None):
        super().__init__(message)
        self.name = name


class LockNotAcquired(LockError):
    """The lock was not acquired within the wait timeout (contention).

    ``holder`` is the :class:`~django_distlock.backends.base.Holder` that
    held it when the wait ended, and ``expires_in`` the seconds left on that
    holder's lease then; each is None when the backend could not tell (or
    the lock was freed in between). A renewed lease lasts longer than
    ``expires_in``: it says when to try again, not when the lock is free.
    """

    def __init__(
        self,
        message: str = "",
        *,
        name: str | None = None,
        holder: Holder | None = None,
        expires_in: float | None = None,
    ):
        super().__init__(message, name=name)
        self.holder = holder
        self.expires_in = expires_in


class LockBackendError(LockError):
    """The backend could not be reached, answered with an error, or had no quorum."""


class LockNotHeld(LockError):
    """Release or extend of a lock that this holder does not hold (any more)."""


class LockLost(LockNotHeld):
    """A held lease expired or was taken over while its holder still ran.

    It is a :class:`LockNotHeld` too: a lost lease is one this holder no
    longer holds.
    """


class StaleFencingToken(LockError):
    """A fenced write came from a holder whose token is no longer the newest."""


class InvalidLockBackendError(ImproperlyConfigured):
    """A configuration mistake found at run time.

    ``LOCKS`` names an alias that does not exist or a backend that cannot
    load, the app is not in ``INSTALLED_APPS``, or the database backend's
    table is missing (``migrate`` was not run).
    """
