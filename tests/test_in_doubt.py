"""Acquisitions whose outcome is unknown leave no grant behind.

The request reached the server, which granted the lock, but the reply never
came back (a reset, a timeout, a failover): the caller gets
``LockBackendError`` and holds nothing, so nobody would ever release the
grant. The backend cancels it with the attempt's own token as soon as the
server answers again, instead of leaving the name blocked for a whole TTL.
"""

from __future__ import annotations

import time

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
