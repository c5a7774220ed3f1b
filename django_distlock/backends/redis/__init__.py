"""The Redis backends: plain (:class:`RedisLockBackend`) and reentrant.

``django_distlock.backends.redis.RedisLockBackend`` and
``django_distlock.backends.redis.ReentrantRedisLockBackend`` are the dotted
paths that ``LOCKS`` settings name.
"""

from .keys import LockKeys
from .plain import RedisLockBackend
from .reentrant import ReentrantLease, ReentrantRedisLockBackend, current_owner

__all__ = [
    "LockKeys",
    "ReentrantLease",
    "ReentrantRedisLockBackend",
    "RedisLockBackend",
    "current_owner",
]
