"""Distributed locks for Django.

>>> from django_distlock import lock
>>> with lock("report:daily", ttl=60) as held:  # doctest: +SKIP
...     held.fencing_token
"""

from .exceptions import (
    LockBackendError,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotHeld,
    StaleFencingToken,
)
from .handler import locks
from .instances import lock_for
from .locking import Lock, lock
from .semaphores import Semaphore, semaphore

__all__ = [
    "Lock",
    "LockBackendError",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "LockNotHeld",
    "Semaphore",
    "StaleFencingToken",
    "distributed_lock",
    "lock",
    "lock_for",
    "locks",
    "semaphore",
]


def __getattr__(name: str):
    # The view decorator pulls in django.http; import it only when asked.
    if name == "distributed_lock":
        from .decorators import distributed_lock

        return distributed_lock
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
