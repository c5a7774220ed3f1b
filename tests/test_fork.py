"""Fork safety: a forked child neither uses nor releases its parent's locks."""

from __future__ import annotations

import json
import os
import time

import pytest
from django.test import override_settings

from django_distlock import LockNotHeld, lock, locks
from django_distlock.watchdog import get_watchdog

from .conftest import redis_locks

pytestmark = pytest.mark.redis


@pytest.fixture(autouse=True)
def _redis(redis_url):
    with override_settings(LOCKS=redis_locks(redis_url)):
        yield


def in_child(func) -> dict:
    """Fork, run ``func()`` in the child, return the dict it returned."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running any cleanup
        code = 0
        try:
            os.close(read_end)
            result = func()
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            result, code = {"error": repr(e)}, 1
        with os.fdopen(write_end, "w") as out:
            json.dump(result, out)
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as inp:
        data = inp.read()
    _, status = os.waitpid(pid, 0)
    result = json.loads(data)
    assert os.waitstatus_to_exitcode(status) == 0, result
    return result


def test_child_cannot_release_or_extend_the_parents_lock():
    parent_backend = locks["default"]
    with lock("shared", ttl=1.0) as held:

        def child():
            outcome = {}
            for what, call in (("release", held.release), ("extend", held.extend)):
                try:
                    call()
                    outcome[what] = "no error"
                except LockNotHeld as e:
                    outcome[what] = type(e).__name__
            outcome["renewing"] = len(get_watchdog())
            outcome["own backend"] = locks["default"] is not parent_backend
            outcome["busy"] = lock("shared", timeout=0).acquire() is False
            with lock("other", timeout=0) as other:
                outcome["other"] = other.locked()
            return outcome

        outcome = in_child(child)
        assert outcome == {
            "release": "LockNotHeld",
            "extend": "LockNotHeld",
            "renewing": 0,
            "own backend": True,
            "busy": True,
            "other": True,
        }
        # The parent's lease is untouched and its renewal keeps it alive.
        time.sleep(1.0 * 3)
        assert held.locked()
        assert lock("shared", timeout=0).acquire() is False
    assert lock("shared", timeout=0).acquire()


def test_child_using_the_parents_backend_object_gets_its_own_connections():
    backend = locks["default"]
    with lock("warm"):
        pass  # the parent has pooled connections now

    def child():
        lease = backend.acquire("child-lock", 5, 0)
        ok = backend.release(lease)
        return {"ok": ok}

    for _ in range(3):
        assert in_child(child) == {"ok": True}
    # The parent's connections were not disturbed by the children.
    for _ in range(20):
        with lock("warm", timeout=0):
            pass


def test_child_can_wait_for_a_lock_the_parent_releases():
    held = lock("handoff", ttl=5)
    held.acquire()

    def child():
        started = time.monotonic()
        with lock("handoff", timeout=10) as mine:
            return {"token": mine.fencing_token, "waited": time.monotonic() - started}

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            result = child()
            code = 0
        except BaseException as e:  # noqa: BLE001
            result, code = {"error": repr(e)}, 1
        with os.fdopen(write_end, "w") as out:
            json.dump(result, out)
        os._exit(code)
    os.close(write_end)
    time.sleep(0.5)
    token = held.fencing_token
    held.release()
    with os.fdopen(read_end) as inp:
        result = json.loads(inp.read())
    os.waitpid(pid, 0)
    assert result["token"] > token
    assert result["waited"] >= 0.3


def test_child_runs_its_waits_in_a_pool_of_its_own():
    # An asyncio wait that a release ends runs in a thread pool of its own
    # (Handoff.await_wait); the parent's, inherited with no thread behind
    # it, would never run the child's.
    import asyncio

    from django_distlock.backends.handoff import Handoff

    async def wait() -> int:
        return await asyncio.wait_for(Handoff(lambda _: None).await_wait(int, "7"), 20)

    assert asyncio.run(wait()) == 7  # the parent's pool, a thread now idle
    assert in_child(lambda: {"got": asyncio.run(wait())}) == {"got": 7}
