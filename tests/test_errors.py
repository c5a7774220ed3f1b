"""What a caller reads when something goes wrong: who holds a busy lock, and
one clear sentence for every invalid argument of a public entry point."""

from __future__ import annotations

import gc
import os
import re
import socket
import threading
import weakref

import pytest
from asgiref.sync import async_to_sync
from django.test import Client

from django_distlock import LockNotAcquired, lock, lock_for
from django_distlock.exceptions import InvalidLockBackendError

from .procs import start_process
from .surface import hold_lock, is_listed, wait_until
from .testapp.models import Product

# -- LockNotAcquired names the holder -----------------------------------------


def test_not_acquired_names_the_holder(backend_kind):
    with lock("who:1", ttl=20, timeout=0, auto_renew=False):
        with pytest.raises(LockNotAcquired) as info, lock("who:1", timeout=0):
            pass
    error = info.value
    holder = error.holder
    assert holder.name == "who:1"
    assert (holder.host, holder.pid) == (socket.gethostname(), os.getpid())
    assert holder.thread == threading.current_thread().name
    assert 15 < error.expires_in <= 20.5  # clocks read a few ms apart
    message = str(error)
    assert message.startswith(
        "Lock 'who:1' was not acquired within 0 s: it is held by "
    )
    assert f"{socket.gethostname()}:{os.getpid()}/{holder.thread} since 20" in message
    assert re.search(r", its lease expiring in (1\d|20)\.\d s\.", message)


def test_async_not_acquired_names_the_holder(backend_kind):
    async def attempt():
        async with lock("who:2", ttl=20, timeout=0):
            with pytest.raises(LockNotAcquired) as info:
                async with lock("who:2", timeout=0):
                    pass
        return info.value

    error = async_to_sync(attempt)()
    assert error.holder.name == "who:2"
    assert error.holder.pid == os.getpid()
    assert 15 < error.expires_in <= 20.5  # clocks read a few ms apart
    assert "it is held by" in str(error)


def test_holder_in_another_process_is_named(cross_process_kind):
    proc = start_process(hold_lock, "who:remote", 30)
    try:
        wait_until(lambda: is_listed("who:remote"), what="the other holder")
        with pytest.raises(LockNotAcquired) as info, lock("who:remote", timeout=0):
            pass
        assert info.value.holder.pid == proc.pid
        assert f":{proc.pid}/MainThread" in str(info.value)
        # hold_lock's lease is 1 s, renewed.
        assert 0 <= info.value.expires_in <= 1.5
    finally:
        proc.kill()
        proc.join()


def test_unknown_holder_is_none(backend_kind, monkeypatch):
    from django_distlock import locks

    def fails(name):
        raise OSError("lookup failed")

    with lock("who:3", timeout=0):
        monkeypatch.setattr(locks["default"], "holder_of", fails)
        with pytest.raises(LockNotAcquired) as info, lock("who:3", timeout=0):
            pass
    assert info.value.holder is None and info.value.expires_in is None
    assert str(info.value).startswith("Lock 'who:3' was not acquired within 0 s. ")


def test_a_second_handle_of_the_holding_thread_is_told_it_does_not_nest(
    backend_kind,
):
    with lock("who:4", timeout=0):
        with pytest.raises(LockNotAcquired) as info, lock("who:4", timeout=0):
            pass
    assert "This thread (or task) already holds it through another handle" in str(
        info.value
    )


def test_a_dropped_handle_leaves_no_lease_behind(backend_kind):
    # The table of current holders holds its leases weakly: a handle dropped
    # while holding frees its lease, so that the watchdog stops renewing it.
    from django_distlock.busy import held_by

    handle = lock("who:5", ttl=20)
    handle.acquire()
    lease = weakref.ref(handle.lease)
    del handle
    gc.collect()
    assert lease() is None
    assert all(e[0]() is None for e in held_by.values() if e[2] == "who:5")


def test_entries_of_collected_leases_are_pruned(monkeypatch):
    from django_distlock.backends.base import Lease
    from django_distlock.busy import HeldLeases

    held = HeldLeases()
    monkeypatch.setattr(HeldLeases, "limit", 4)
    live = [Lease("a", f"live{i}", "t", 1, 30.0, 0.0) for i in range(2)]
    for lease in [*live, Lease("a", "gone0", "t", 1, 1.0, 0.0)]:
        held[id(lease)] = (weakref.ref(lease), "a", lease.name, 1, 0)
    del lease  # the last one, "gone0", is referenced nowhere else
    gc.collect()
    held.prune()
    assert sorted(entry[2] for entry in held.values()) == ["live0", "live1"]
    assert held.limit == 4  # twice what remains, at least the class's limit


def test_423_retry_after_is_the_holders_remaining_lease(backend_kind):
    with lock("inventory:r1", ttl=20, timeout=0):
        response = Client().get("/buy-now/r1/")
    assert response.status_code == 423
    assert 16 <= int(response["Retry-After"]) <= 21


# -- one clear sentence for every invalid argument ----------------------------

NAN = float("nan")

BAD_LOCK_ARGUMENTS = [
    (
        dict(ttl="30"),
        TypeError,
        "Lock 'job': ttl must be a number of seconds, not '30' (str).",
    ),
    (
        dict(ttl=0),
        ValueError,
        "Lock 'job': ttl must be a positive number of seconds, not 0.",
    ),
    (
        dict(ttl=-1),
        ValueError,
        "Lock 'job': ttl must be a positive number of seconds, not -1.",
    ),
    (
        dict(ttl=NAN),
        ValueError,
        "Lock 'job': ttl must be a positive number of seconds, not nan.",
    ),
    (
        dict(ttl=True),
        TypeError,
        "Lock 'job': ttl must be a number of seconds, not True (bool).",
    ),
    (
        dict(timeout=-3),
        ValueError,
        "Lock 'job': timeout must be None or a number >= 0 (seconds), not -3.",
    ),
    (
        dict(timeout=NAN),
        ValueError,
        "Lock 'job': timeout must be None or a number >= 0 (seconds), not nan.",
    ),
    (
        dict(timeout="5"),
        TypeError,
        "Lock 'job': timeout must be None or a number >= 0 (seconds), not '5' (str).",
    ),
    (
        dict(auto_renew="yes"),
        TypeError,
        "Lock 'job': auto_renew must be True, False or None, not 'yes'.",
    ),
    (
        dict(using=None),
        TypeError,
        "Lock 'job': using must be a LOCKS alias (str), not None.",
    ),
]


@pytest.mark.parametrize(
    "options, error, message", BAD_LOCK_ARGUMENTS, ids=lambda v: repr(v)[:30]
)
def test_lock_arguments(options, error, message):
    with pytest.raises(error) as info:
        lock("job", **options)
    assert str(info.value) == message
    # lock_for() takes the same keywords, and names its lock the same way.
    with pytest.raises(error) as info:
        lock_for(Product, pk=42, **options)
    assert str(info.value) == message.replace("'job'", "'testapp.product:42'")


def test_lock_name():
    with pytest.raises(TypeError, match=r"^A lock name must be a str, not None"):
        lock(None)
    with pytest.raises(TypeError, match=r"not b'x' \(bytes\)\.$"):
        lock(b"x")


def test_unknown_alias_names_the_lock():
    with pytest.raises(InvalidLockBackendError) as info:
        lock("job", using="nope").acquire()
    assert str(info.value) == (
        "Lock 'job': using='nope' is not an alias of settings.LOCKS "
        "(configured: 'default')."
    )
    with pytest.raises(InvalidLockBackendError, match="using='nope'"):
        async_to_sync(lock("job", using="nope").aacquire)()
    with pytest.raises(InvalidLockBackendError, match="using='nope'"):
        async_to_sync(lock("job", using="nope").__aenter__)()


@pytest.mark.parametrize(
    "timeout, error, text",
    [
        ("5", TypeError, "not '5' (str)"),
        (-2, ValueError, "not -2"),
        (NAN, ValueError, "not nan"),
    ],
)
def test_acquire_timeouts(timeout, error, text):
    expected = (
        f"Lock 'job': timeout must be None, -1 or a number >= 0 (seconds), {text}."
    )
    handle = lock("job")
    with pytest.raises(error) as info:
        handle.acquire(timeout=timeout)
    assert str(info.value) == expected
    with pytest.raises(error) as info:
        async_to_sync(handle.aacquire)(timeout=timeout)
    assert str(info.value) == expected


def test_extend_seconds():
    with lock("job", timeout=0) as held:
        with pytest.raises(TypeError) as info:
            held.extend("30")
        assert str(info.value) == (
            "Lock 'job': seconds must be a number of seconds, not '30' (str)."
        )
        with pytest.raises(
            ValueError, match=r"^Lock 'job': seconds must be a positive"
        ):
            async_to_sync(held.aextend)(-1)


def test_lock_for_what():
    with pytest.raises(TypeError) as info:
        lock_for(None)
    assert str(info.value) == (
        "lock_for() takes a model instance or a model class (and pk=), "
        "not None (NoneType)."
    )
    with pytest.raises(TypeError, match=r"not 'testapp.Product' \(str\)"):
        lock_for("testapp.Product", pk=1)
    with pytest.raises(ValueError, match=r"lock_for\(Product, pk=\.\.\.\)"):
        lock_for(Product)
    with pytest.raises(ValueError) as info:
        lock_for(Product, pk=1, release="later")
    assert str(info.value) == (
        "Lock 'testapp.product:1': release must be 'on_exit' or 'on_commit', "
        "not 'later'."
    )
    with pytest.raises(ValueError, match=r"^Cannot lock an unsaved Product"):
        lock_for(Product(sku="new"))
