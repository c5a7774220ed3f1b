"""Acquisitions whose outcome is unknown leave no grant behind.

The request reached the server, which granted the lock, but the reply never
came back (a reset, a timeout, a failover): the caller gets
``LockBackendError`` and holds nothing, so nobody would ever release the
grant. The backend cancels it with the attempt's own token as soon as the
server answers again, instead of leaving the name blocked for a whole TTL.
"""

from __future__ import annotations

import asyncio
import struct
import time
from unittest import mock

import pytest
from django.db import connections
from django.test import override_settings

from django_distlock import LockBackendError, lock, locks

from .faultproxy import DropReplyProxy
from .test_database_backend import BACKEND

TTL = 30.0
#: Generous against the TTL the grant would otherwise block the name for.
PROMPTLY = 5.0


def is_free(name: str, using: str) -> bool:
    """Return True if ``name`` can be taken right now (and give it back)."""
    probe = lock(name, using=using, timeout=0, auto_renew=False)
    if not probe.acquire():
        return False
    probe.release()
    return True


def free_after(name: str, using: str, limit: float) -> float | None:
    """Return the seconds until ``name`` is free on ``using`` (None: not
    within ``limit``)."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if is_free(name, using):
            return time.monotonic() - started
        time.sleep(0.01)
    return None


@pytest.fixture
def proxied_postgres(postgres_available):
    """A DropReplyProxy in front of the test PostgreSQL; the ``proxied``
    DATABASES alias goes through it."""
    postgres = connections["postgres"].settings_dict
    proxy = DropReplyProxy(postgres["HOST"] or "127.0.0.1", int(postgres["PORT"]))
    entry = connections["proxied"].settings_dict
    saved = entry["PORT"]
    entry["PORT"] = str(proxy.port)
    yield proxy
    entry["PORT"] = saved
    proxy.close()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres", "proxied"])
def test_database_grant_whose_reply_was_lost_is_cancelled(proxied_postgres):
    proxy = proxied_postgres
    setting = {
        "default": {"BACKEND": BACKEND, "OPTIONS": {"DATABASE": "proxied"}},
        "direct": {"BACKEND": BACKEND, "OPTIONS": {"DATABASE": "postgres"}},
    }
    with override_settings(LOCKS=setting):
        try:
            # This thread's lock connection is open (and its statements
            # prepared): the next request is the acquisition itself.
            assert is_free("in-doubt", "default")
            proxy.drop_next_reply()
            with pytest.raises(LockBackendError):
                lock("in-doubt", ttl=TTL, timeout=0).acquire()
            assert proxy.dropped.is_set()
            # The server granted it to nobody; while it cannot be reached,
            # the grant stays.
            assert not is_free("in-doubt", "direct")
            time.sleep(0.3)
            assert not is_free("in-doubt", "direct")
            proxy.accept()  # the server answers again
            seconds = free_after("in-doubt", "direct", PROMPTLY)
            assert seconds is not None, "the grant was left to expire"
            print(f"free again {seconds:.3f} s after the server answered")
        finally:
            locks.reset()


def is_acquire(data: bytes) -> bool:
    """Match the acquiring UPDATE, sent unprepared (its SQL text included)."""
    return b"SET token = " in data and b"UPDATE" in data


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "postgres", "proxied"])
def test_database_async_grant_whose_reply_was_lost_is_cancelled(proxied_postgres):
    """The same through aacquire(), whose attempts run in worker threads."""
    proxy = proxied_postgres
    setting = {
        "default": {"BACKEND": BACKEND, "OPTIONS": {"DATABASE": "proxied"}},
        "direct": {"BACKEND": BACKEND, "OPTIONS": {"DATABASE": "postgres"}},
    }
    unprepared = {"DISABLE_SERVER_SIDE_CURSORS": True}
    with mock.patch.dict(connections["proxied"].settings_dict, unprepared):
        with override_settings(LOCKS=setting):
            try:
                assert is_free("in-doubt-async", "direct")  # its row exists
                proxy.drop_next_reply(is_acquire)

                async def attempt() -> None:
                    await lock("in-doubt-async", ttl=TTL, timeout=0).aacquire()

                with pytest.raises(LockBackendError):
                    asyncio.run(attempt())
                assert proxy.dropped.is_set()
                assert not is_free("in-doubt-async", "direct")
                proxy.accept()
                seconds = free_after("in-doubt-async", "direct", PROMPTLY)
                assert seconds is not None, "the grant was left to expire"
            finally:
                locks.reset()


# -- ZooKeeper ----------------------------------------------------------------

ZK_BACKEND = "django_distlock.backends.zookeeper.ZooKeeperLockBackend"
#: ZooKeeper request types (the int after a request's length and xid).
ZK_CREATE2, ZK_SET_DATA = 15, 5
#: Left alone, a lost create's node blocks the name for its waiter window
#: (5 s), a lost holder write's for the TTL: generous, but well under both.
PROMPTLY_ZK = 2.5


def zk_request(kind: int):
    """Return a predicate matching a client packet that is a ``kind`` request."""

    def match(data: bytes) -> bool:
        return len(data) >= 12 and struct.unpack(">i", data[8:12])[0] == kind

    return match


@pytest.fixture(scope="module")
def zookeeper():
    from .cluster_servers import ZooKeeperServer

    server = ZooKeeperServer().start()
    yield server
    server.stop()


@pytest.mark.parametrize(
    "request_kind",
    [
        pytest.param(ZK_CREATE2, id="create-lost"),
        pytest.param(ZK_SET_DATA, id="holder-write-lost"),
    ],
)
def test_zookeeper_node_whose_reply_was_lost_is_deleted(zookeeper, request_kind):
    """The contender node created (or made the holder) by a request whose
    reply was lost is found by its token and deleted once ZooKeeper answers:
    not left to its waiter window, or to the lease's TTL."""
    proxy = DropReplyProxy("127.0.0.1", zookeeper.port)
    options = {"SESSION_TIMEOUT": 10}
    setting = {
        "default": {
            "BACKEND": ZK_BACKEND,
            "LOCATION": f"127.0.0.1:{proxy.port}",
            "OPTIONS": options,
        },
        "direct": {
            "BACKEND": ZK_BACKEND,
            "LOCATION": zookeeper.hosts,
            "OPTIONS": options,
        },
    }
    try:
        with override_settings(LOCKS=setting):
            try:
                assert is_free("zk-in-doubt", "default")  # session and node dir
                proxy.drop_next_reply(zk_request(request_kind))
                with pytest.raises(LockBackendError):
                    lock("zk-in-doubt", ttl=TTL, timeout=0).acquire()
                assert proxy.dropped.is_set()
                assert not is_free("zk-in-doubt", "direct")
                time.sleep(0.3)
                proxy.accept()  # ZooKeeper can be reached again
                seconds = free_after("zk-in-doubt", "direct", PROMPTLY_ZK)
                assert seconds is not None, "the node was left behind"
                print(f"free again {seconds:.3f} s after ZooKeeper was reachable")
            finally:
                locks.reset()
    finally:
        proxy.close()
