"""The LOCKS handler: one backend per alias and process, settings-driven."""

from __future__ import annotations

import threading

import pytest
from django.test import override_settings

from django_distlock import lock, locks
from django_distlock.backends.locmem import LocMemLockBackend
from django_distlock.backends.redis import RedisLockBackend
from django_distlock.exceptions import InvalidLockBackendError
from django_distlock.handler import LockHandler

LOCMEM = "django_distlock.backends.locmem.LocMemLockBackend"
REDIS = "django_distlock.backends.redis.RedisLockBackend"


def test_one_backend_per_alias_shared_by_threads():
    with override_settings(LOCKS={"default": {"BACKEND": LOCMEM}}):
        barrier = threading.Barrier(8)
        seen = []

        def get():
            barrier.wait()
            seen.append(locks["default"])

        threads = [threading.Thread(target=get) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(seen) == 8
        assert all(b is seen[0] for b in seen)
        assert locks["default"] is seen[0]


def test_aliases_are_separate_backends():
    setting = {
        "default": {"BACKEND": LOCMEM, "LOCATION": "a"},
        "other": {"BACKEND": LOCMEM, "LOCATION": "b", "TTL": 7, "TIMEOUT": None},
    }
    with override_settings(LOCKS=setting):
        assert locks["default"] is not locks["other"]
        assert locks["other"].alias == "other"
        assert locks["other"].default_ttl == 7.0
        assert locks["other"].default_timeout is None
        assert sorted(b.alias for b in locks.all()) == ["default", "other"]
        with lock("x"):
            with lock("x", using="other", timeout=0):
                pass  # different tables: no contention


def test_override_settings_takes_effect_and_is_undone():
    with override_settings(LOCKS={"default": {"BACKEND": LOCMEM}}):
        before = locks["default"]
        assert isinstance(before, LocMemLockBackend)
        with override_settings(
            LOCKS={"default": {"BACKEND": REDIS, "LOCATION": "redis://127.0.0.1:1/0"}}
        ):
            inner = locks["default"]
            assert isinstance(inner, RedisLockBackend)
            assert inner.location == "redis://127.0.0.1:1/0"
        after = locks["default"]
        assert isinstance(after, LocMemLockBackend)
        assert after is not before  # rebuilt from the restored setting


def test_reset_closes_backends(monkeypatch):
    closed = []
    monkeypatch.setattr(LocMemLockBackend, "close", lambda self: closed.append(self))
    with override_settings(LOCKS={"default": {"BACKEND": LOCMEM}}):
        backend = locks["default"]
    assert closed == [backend]


def test_unknown_alias():
    with override_settings(LOCKS={"default": {"BACKEND": LOCMEM}}):
        with pytest.raises(InvalidLockBackendError, match="'nope'"):
            locks["nope"]
        with pytest.raises(InvalidLockBackendError):
            lock("x", using="nope").acquire()
        with pytest.raises(InvalidLockBackendError):
            with lock("x", using="nope"):
                pass  # pragma: no cover


def test_backend_that_cannot_be_imported():
    with override_settings(LOCKS={"default": {"BACKEND": "nowhere.Backend"}}):
        with pytest.raises(InvalidLockBackendError) as info:
            locks["default"]
        assert isinstance(info.value.__cause__, ImportError)


def test_default_without_locks_setting_is_the_database_backend():
    handler = LockHandler()
    with override_settings():
        from django.conf import settings

        del settings.LOCKS
        assert handler.settings["default"]["BACKEND"].endswith(
            "database.DatabaseLockBackend"
        )
        assert handler.settings["default"]["OPTIONS"] == {"DATABASE": "default"}


def test_explicit_settings_dict():
    handler = LockHandler({"mine": {"BACKEND": LOCMEM, "LOCATION": "explicit"}})
    backend = handler["mine"]
    assert isinstance(backend, LocMemLockBackend)
    assert handler["mine"] is backend
    handler.close_all()


def test_a_lease_is_released_by_the_backend_that_granted_it():
    # LOCKS changed while the lock was held: the release still reaches the
    # table that holds the lease, not the new setting's.
    table_a = {"default": {"BACKEND": LOCMEM, "LOCATION": "granted-here"}}
    table_b = {"default": {"BACKEND": LOCMEM, "LOCATION": "elsewhere"}}
    with override_settings(LOCKS=table_a):
        held = lock("x")
        assert held.acquire(timeout=0)
    with override_settings(LOCKS=table_b):
        held.release()  # no LockLost: the lease was found where it was granted
    with override_settings(LOCKS=table_a):
        with lock("x", timeout=0):
            pass  # free again
