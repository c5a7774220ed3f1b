"""Helpers shared by the Django-surface tests (views, command, admin, lock_for).

``SURFACE_BACKENDS`` are the backends those tests run on: Redis (a real
redis-server), locmem, and the database backend once it is implemented.
Workers here are module-level so spawned processes can import them.
"""

from __future__ import annotations

import os
import time

import pytest

from django_distlock.backends.base import BaseLockBackend

from .conftest import SURFACE_BACKENDS, redis_locks  # noqa: F401 (re-exported)
from .servers import free_port


def database_backend_ready() -> bool:
    try:
        from django_distlock.backends.database import DatabaseLockBackend
    except ImportError:
        return False
    return DatabaseLockBackend.holders is not BaseLockBackend.holders


def locks_setting(kind: str, request) -> dict:
    """Return a LOCKS setting whose default alias is backend ``kind``."""
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        return redis_locks(url)
    if kind == "locmem":
        return {
            "default": {
                "BACKEND": "django_distlock.backends.locmem.LocMemLockBackend",
                "LOCATION": f"surface-{time.monotonic_ns()}",
            }
        }
    if kind == "database":
        if not database_backend_ready():
            pytest.skip("the database backend is not implemented yet")
        return {
            "default": {
                "BACKEND": "django_distlock.backends.database.DatabaseLockBackend",
                "OPTIONS": {"DATABASE": "default"},
            }
        }
    raise AssertionError(kind)


def down_locks() -> dict:
    """A LOCKS setting pointing at a Redis port where nothing listens."""
    return {
        "default": {
            "BACKEND": "django_distlock.backends.redis.RedisLockBackend",
            "LOCATION": f"redis://127.0.0.1:{free_port()}/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.3},
        }
    }


def wait_until(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def hold_lock(name: str, seconds: float, using: str = "default") -> None:
    """Worker: hold ``name`` for ``seconds`` in this (spawned) process."""
    from django_distlock import lock

    # A short lease, auto-renewed: a killed holder frees the lock within 1 s.
    with lock(name, using=using, ttl=1.0, timeout=10):
        time.sleep(seconds)


def is_listed(name: str, using: str = "default") -> bool:
    from django_distlock import locks

    return any(h.name == name for h in locks[using].holders(name))


def buyer(sku: str, attempts: int, view: str = "buy") -> tuple[int, int]:
    """Worker: buy through the decorated view until sold out."""
    from django.test import Client

    client = Client()
    sold = busy = 0
    for _ in range(attempts):
        response = client.get(f"/{view}/{sku}/?pause=0.005")
        if response.status_code == 200:
            sold += 1
        elif response.status_code == 423:
            busy += 1
        elif response.status_code == 410:
            break
        else:
            raise AssertionError(response.status_code)
    return sold, busy


def increment_under_row_lock(pk: int, times: int) -> int:
    """Worker: read-modify-write a row's stock in atomic() under its row lock."""
    from django.db import transaction

    from django_distlock import lock_for

    from .testapp.models import Product

    done = 0
    for _ in range(times):
        with transaction.atomic():
            with lock_for(Product, pk=pk, release="on_commit", timeout=30):
                product = Product.objects.get(pk=pk)
                stock = product.stock
            # The lock is released at commit, after this write: the next
            # holder reads the committed value.
            time.sleep(0.002)
            Product.objects.filter(pk=pk).update(stock=stock + 1)
        done += 1
    return done


def try_lock(name: str) -> bool:
    """Worker: True if ``name`` can be taken right now (then released)."""
    from django_distlock import lock

    handle = lock(name, timeout=0)
    if handle.acquire():
        handle.release()
        return True
    return False


def hold_until_lost(name: str, result_path: str, seconds: float = 30) -> None:
    """Worker: hold ``name`` until it is taken away; record what ``__exit__`` did."""
    from django_distlock import LockLost, lock

    outcome = "released"
    try:
        with lock(name, ttl=5, timeout=10) as held:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and held.locked():
                time.sleep(0.05)
    except LockLost:
        outcome = "LockLost"
    # Written aside and renamed: the test reads the file as soon as it exists.
    with open(result_path + ".tmp", "w") as f:
        f.write(outcome)
    os.replace(result_path + ".tmp", result_path)


def fill_redis(url: str, prefix: str, count: int, key_prefix: str = "distlock") -> None:
    """Create ``count`` held locks named ``prefix<i>`` fast (pipelined ACQUIRE)."""
    import redis

    from django_distlock.backends.redis.keys import ACQUIRE, LockKeys
    from django_distlock.keys import encode_name

    client = redis.Redis.from_url(url)
    client.script_load(ACQUIRE.source)
    for start in range(0, count, 5000):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(count, start + 5000)):
            name = f"{prefix}{i}"
            keys = LockKeys(key_prefix, name)
            pipe.evalsha(
                ACQUIRE.sha,
                3,
                *keys.triple,
                f"tok{i}",
                600_000,
                encode_name(name),
                "bench-host",
                4242,
                "MainThread",
                0,
            )
        pipe.execute()
    client.close()
