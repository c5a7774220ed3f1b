"""What a caller reads when something goes wrong: who holds a busy lock, and
one clear sentence for every invalid argument of a public entry point."""

from __future__ import annotations

import os
import re
import socket
import threading

import pytest
from asgiref.sync import async_to_sync
from django.test import Client

from django_distlock import LockNotAcquired, lock

from .procs import start_process
from .surface import hold_lock, is_listed, wait_until

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
    assert 15 < error.expires_in <= 20
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
    assert 15 < error.expires_in <= 20
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
        assert 0 <= info.value.expires_in <= 1
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


def test_423_retry_after_is_the_holders_remaining_lease(backend_kind):
    with lock("inventory:r1", ttl=20, timeout=0):
        response = Client().get("/buy-now/r1/")
    assert response.status_code == 423
    assert 16 <= int(response["Retry-After"]) <= 20
