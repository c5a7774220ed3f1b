"""The reentrant Redis backend's former module path, kept for old imports.

Use ``django_distlock.backends.redis.ReentrantRedisLockBackend``.
"""

from .redis.reentrant import ReentrantLease, ReentrantRedisLockBackend, current_owner

__all__ = ["ReentrantLease", "ReentrantRedisLockBackend", "current_owner"]
