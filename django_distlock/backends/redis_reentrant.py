"""Reentrant Redis locks, importable from ``django_distlock.backends.redis``."""

from __future__ import annotations

from .redis import RedisLockBackend

__all__ = ["ReentrantRedisLockBackend"]


class ReentrantRedisLockBackend(RedisLockBackend):
    """Reentrant Redis locks: the owning thread (or task) may nest acquisitions."""

    reentrant = True
