"""Semaphores: ``semaphore(name, limit)``, one of ``limit`` permits at a time.

A :class:`Semaphore` is a :class:`~django_distlock.locking.Lock` handle that
asks its backend for a permit instead of the name alone; everything else
(context manager, decorator, ``acquire``/``release``/``extend``/``locked``,
their ``a``-twins, auto-renewal, ``on_lost``, ``max_hold``) is the lock's.
Semaphore names live apart from lock names: ``semaphore("x", 3)`` and
``lock("x")`` never meet.
"""

from __future__ import annotations

from typing import Any

from .backends.base import Holder, permit
from .busy import permits_taken
from .exceptions import LockNotAcquired
from .handler import DEFAULT_LOCK_ALIAS
from .locking import DEFAULT, Lock

__all__ = ["Semaphore", "semaphore"]


def check_limit(name: Any, limit: Any) -> int:
    """Return ``limit`` if it is an int >= 1; raise TypeError or ValueError."""
    if type(limit) is not int:
        raise TypeError(
            f"Semaphore {name!r}: limit must be an int >= 1, not {limit!r} "
            f"({type(limit).__name__})."
        )
    if limit < 1:
        raise ValueError(f"Semaphore {name!r}: limit must be >= 1, not {limit}.")
    return limit


class Semaphore(Lock):
    """A handle on one permit of the semaphore ``name`` of ``limit`` permits.

    Used like a lock (``with semaphore("export", 3):``, ``@semaphore(...)``,
    ``acquire()``/``release()``); each permit is a lease of its own, renewed
    while held and expiring by its ttl if its holder dies. Every holder of a
    name passes the same ``limit``: acquiring with another one while a permit
    of the name is live raises ValueError.
    """

    def __init__(self, name: str, limit: int, **options: Any):
        check_limit(name, limit)
        if options.get("shared"):
            raise TypeError(f"Semaphore {name!r}: a permit cannot be shared.")
        options.pop("shared", None)
        super().__init__(name, **options)
        self.limit = limit
        self.kind = permit(limit)

    def __repr__(self) -> str:
        state = "held" if self._leases else "unheld"
        return (
            f"<Semaphore {self.name!r} limit={self.limit} using={self.using!r} {state}>"
        )

    def _recreate_cm(self) -> Semaphore:
        return Semaphore(self.name, self.limit, **self._options())

    def _not_acquired(self, holder: Holder | None) -> LockNotAcquired:
        """Return the LockNotAcquired to raise: all permits are held."""
        return permits_taken(self, holder)


def semaphore(
    name: str,
    limit: int,
    *,
    using: str = DEFAULT_LOCK_ALIAS,
    ttl: float | None = None,
    timeout: float | None = DEFAULT,
    auto_renew: bool | None = None,
    on_lost: str = "raise",
    max_hold: float | None = DEFAULT,
) -> Semaphore:
    """Return a :class:`Semaphore` handle: one of ``limit`` permits of ``name``.

    ``limit`` is an int >= 1 (else TypeError or ValueError); ``using``,
    ``ttl``, ``timeout``, ``auto_renew``, ``on_lost`` and ``max_hold`` are
    those of :func:`~django_distlock.lock`. When all permits are held for the
    whole wait, entering the block raises LockNotAcquired naming the permit
    that expires first. A backend that does not offer semaphores raises
    InvalidLockBackendError (an ImproperlyConfigured) before any round trip.
    """
    handle = object.__new__(Semaphore)  # as lock(): no dict of keywords
    handle.__init__(
        name,
        limit,
        using=using,
        ttl=ttl,
        timeout=timeout,
        auto_renew=auto_renew,
        on_lost=on_lost,
        max_hold=max_hold,
    )
    return handle
