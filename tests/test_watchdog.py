"""The renewal loop: one thread per alias for all its leases, weakly held."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest
from django.test import override_settings

from django_distlock import LockLost, lock, locks
from django_distlock.backends.redis import RedisLockBackend
from django_distlock.signals import lock_lost
from django_distlock.watchdog import get_watchdog, renewal_due

from .conftest import redis_locks, stalled_alias_locks
from .contract import Recorder
from .servers import RedisServer

pytestmark = pytest.mark.redis

TTL = 1.0


@pytest.fixture(autouse=True)
def _redis(redis_url):
    with override_settings(LOCKS=redis_locks(redis_url)):
        yield


def watchdog_threads():
    """The renewal threads of the default alias (other tests' aliases have
    their own)."""
    return [
        t for t in threading.enumerate() if t.name == "django_distlock-watchdog:default"
    ]


@pytest.fixture
def renew_calls(monkeypatch):
    """Record the batch size of every renew() call."""
    calls: list[int] = []
    original = RedisLockBackend.renew

    def spy(self, leases):
        leases = list(leases)
        calls.append(len(leases))
        return original(self, leases)

    monkeypatch.setattr(RedisLockBackend, "renew", spy)
    return calls


def test_renewal_is_due_after_a_third_of_the_ttl():
    held = lock("x", ttl=3, auto_renew=False)
    held.acquire()
    lease = held.lease
    assert renewal_due(lease) == pytest.approx(lease.deadline - 2.0)
    held.release()


def scheduled(lease) -> bool:
    """Return True if the thread watchdog is renewing ``lease``."""
    return get_watchdog().renewing(lease)


def test_one_thread_renews_many_leases(renew_calls):
    handles = [lock(f"many:{i}", ttl=TTL) for i in range(20)]
    for h in handles:
        assert h.acquire()
    leases = [h.lease for h in handles]
    try:
        assert all(scheduled(lease) for lease in leases)
        time.sleep(TTL * 3)
        assert len(watchdog_threads()) == 1
        for h in handles:
            assert h.locked()
        assert sum(renew_calls) >= 20 * 3  # every lease renewed several times
        # ... in batches: far fewer round trips than renewals.
        assert len(renew_calls) < sum(renew_calls) / 2
    finally:
        for h in handles:
            h.release()
    assert not any(scheduled(lease) for lease in leases)


def test_released_lease_is_no_longer_renewed(renew_calls):
    with lock("x", ttl=TTL):
        pass
    renew_calls.clear()
    time.sleep(TTL)
    assert renew_calls == []


def test_garbage_collected_handle_is_not_renewed_forever():
    held = lock("gc", ttl=TTL)
    held.acquire()
    lease = weakref.ref(held.lease)
    assert scheduled(lease())
    del held
    gc.collect()
    assert lease() is None  # the watchdog kept no strong reference
    # Its entry is dropped at the next pass, and the lease expires.
    started = time.monotonic()
    with lock("gc", timeout=10):
        assert time.monotonic() - started < 5


def test_an_entry_left_by_a_collected_lease_is_not_another_lease_with_its_id():
    """A collected lease's entry stays until the next pass, and Python may
    give its id to a new object: only the lease itself is renewing."""
    first = lock("stale-first", ttl=TTL)
    second = lock("stale-second", ttl=TTL, auto_renew=False)
    first.acquire()
    second.acquire()
    schedule = get_watchdog().lane("default")._schedule
    try:
        # As if the second lease had been given the id of the first's entry.
        schedule.entries[id(second.lease)] = schedule.entries[id(first.lease)]
        assert scheduled(first.lease)
        assert not scheduled(second.lease)
    finally:
        schedule.entries.pop(id(second.lease), None)
        first.release()
        second.release()


def test_loss_detected_by_renewal_is_signalled_once():
    with Recorder(lock_lost) as rec:
        held = lock("x", ttl=TTL)
        held.acquire()
        assert locks["default"].force_release("x", held.lease.token)
        (event,) = rec.wait_for(lock_lost, timeout=TTL * 10)
        assert event["reason"] == "renewal found the lease gone"
        assert event["lease"] is held.lease
        with pytest.raises(LockLost):
            held.extend()
        with pytest.raises(LockLost):
            held.release()
        assert len(rec.of(lock_lost)) == 1


def test_unreachable_backend_loses_the_lease_at_its_deadline(renew_calls):
    server = RedisServer().start()
    try:
        with override_settings(LOCKS=redis_locks(server.url)):
            with Recorder(lock_lost) as rec:
                held = lock("x", ttl=1.0)
                held.acquire()
                server.kill()
                (event,) = rec.wait_for(lock_lost, timeout=10)
                assert "unreachable" in event["reason"]
                # Retried every RETRY_AFTER_ERROR, not in a tight loop.
                assert len(renew_calls) <= 6, renew_calls
                assert held.lease.remaining() <= 0.05
                with pytest.raises(LockLost):
                    held.release()
    finally:
        server.stop()


def test_renewal_survives_a_short_outage(redis_server):
    with lock("x", ttl=2.0) as held:
        redis_server.pause()
        try:
            time.sleep(0.9)  # past a renewal; the lease has 2 s on the server
        finally:
            redis_server.resume()
        time.sleep(1.5)
        assert held.locked()
        assert not held.lease.lost


def test_a_stalled_backend_does_not_delay_another_backends_renewals(redis_url):
    """Each backend renews on its own: a paused server holds up the renewals
    of its own alias only, never a short lease on another alias."""
    stalled = RedisServer().start()
    try:
        with override_settings(LOCKS=stalled_alias_locks(redis_url, stalled.url)):
            with Recorder(lock_lost) as rec:
                other = lock("x", using="stalled", ttl=1.0)
                assert other.acquire()
                held = lock("x", ttl=1.0)
                assert held.acquire()
                stalled.pause()
                try:
                    # Each renewal on "stalled" now hangs for its 2 s socket
                    # timeout; the 1 s lease on "default" needs one every
                    # third of a second.
                    time.sleep(3.0)
                    assert held.locked()
                    assert not held.lease.lost
                    assert "default" not in [e["alias"] for e in rec.of(lock_lost)]
                finally:
                    stalled.resume()
                held.release()
    finally:
        stalled.stop()
