"""asyncio: tasks are distinct holders, renewal runs as a task of the loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from django.test import override_settings

from django_distlock import LockLost, LockNotAcquired, lock, locks
from django_distlock.watchdog import get_watchdog

from .conftest import redis_locks

pytestmark = pytest.mark.redis

TTL = 1.0


@pytest.fixture(autouse=True)
def _redis(redis_url):
    with override_settings(LOCKS=redis_locks(redis_url)):
        yield


def watchdog_tasks():
    return [
        t for t in asyncio.all_tasks() if t.get_name() == "django_distlock-watchdog"
    ]


def test_tasks_are_distinct_holders():
    async def scenario():
        held = asyncio.Event()
        done = asyncio.Event()

        async def first():
            async with lock("x"):
                held.set()
                await done.wait()

        async def second():
            await held.wait()
            other = lock("x", timeout=0)
            got = await other.aacquire()
            done.set()
            return got

        task = asyncio.create_task(first(), name="first-task")
        got = await second()
        await task
        return got

    assert asyncio.run(scenario()) is False


def test_holder_names_the_task():
    async def scenario():
        async with lock("x"):
            (holder,) = list(locks["default"].holders())
            return holder.thread

    thread = asyncio.run(scenario())
    assert thread.startswith(threading.current_thread().name + "/")


def test_async_renewal_runs_as_a_task_of_the_loop():
    async def scenario():
        async with lock("x", ttl=TTL) as held:
            assert len(watchdog_tasks()) == 1
            # Not the renewal thread's job:
            assert id(held.lease) not in get_watchdog()._schedule.entries
            await asyncio.sleep(TTL * 3)
            assert await held.alocked()
            assert not await lock("x", timeout=0).aacquire()
        # With nothing left to renew, the task ends.
        for _ in range(100):
            if not watchdog_tasks():
                break
            await asyncio.sleep(0.01)
        return watchdog_tasks()

    assert asyncio.run(scenario()) == []


def test_one_renewal_task_for_many_locks():
    async def scenario():
        handles = [lock(f"many:{i}", ttl=TTL) for i in range(10)]
        for h in handles:
            assert await h.aacquire()
        assert len(watchdog_tasks()) == 1
        await asyncio.sleep(TTL * 3)
        held = [await h.alocked() for h in handles]
        for h in handles:
            await h.arelease()
        return held

    assert asyncio.run(scenario()) == [True] * 10


def test_async_waiter_woken_by_release_from_another_task():
    async def scenario():
        loop = asyncio.get_running_loop()
        holder = lock("x")
        await holder.aacquire()

        async def waiter():
            async with lock("x", timeout=10):
                return loop.time()

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0.3)
        assert not task.done()
        released = loop.time()
        await holder.arelease()
        return await task - released

    assert asyncio.run(scenario()) < 1.0


def test_async_loss_detected_by_renewal():
    async def scenario():
        with pytest.raises(LockLost):
            async with lock("x", ttl=TTL) as held:
                assert locks["default"].force_release("x", held.lease.token)
                for _ in range(100):
                    if held.lease.lost:
                        break
                    await asyncio.sleep(0.05)
                assert held.lease.lost

    asyncio.run(scenario())


def test_async_contention_raises():
    async def scenario():
        async with lock("x"):
            with pytest.raises(LockNotAcquired):
                async with lock("x", timeout=0.2):
                    pass  # pragma: no cover

    asyncio.run(scenario())


def test_cancelled_waiter_leaves_no_trace(redis_server):
    async def scenario():
        holder = lock("x")
        await holder.aacquire()
        task = asyncio.create_task(lock("x", timeout=10).aacquire())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await holder.arelease()
        # The cancelled waiter must not have been handed the lock for good.
        other = lock("x", timeout=5)
        got = await other.aacquire()
        if got:
            await other.arelease()
        return got

    assert asyncio.run(scenario()) is True


def test_async_renewal_does_not_queue_behind_sync_work():
    from asgiref.sync import sync_to_async

    async def scenario():
        async with lock("x", ttl=TTL) as held:
            # Occupy the thread-sensitive executor (where sync views run)
            # for three ttls; the renewal must not wait for it.
            await sync_to_async(time.sleep, thread_sensitive=True)(TTL * 3)
            assert not held.lease.lost
            assert await held.alocked()

    asyncio.run(scenario())


def test_async_renewal_recovers_after_script_flush(redis_server):
    async def scenario():
        async with lock("x", ttl=TTL) as held:
            redis_server.client().script_flush()
            await asyncio.sleep(TTL * 2)
            assert not held.lease.lost
            assert await held.alocked()

    asyncio.run(scenario())


_LOOP_EXIT_SCRIPT = """
import asyncio, os, sys
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
import django
django.setup()
from django.conf import settings
settings.LOCKS = {"default": {
    "BACKEND": "django_distlock.backends.redis.RedisLockBackend",
    "LOCATION": sys.argv[1]}}
from django_distlock import lock

async def scenario():
    holder = lock("exit")
    await holder.aacquire()
    waiter = asyncio.create_task(lock("exit", timeout=10).aacquire())
    await asyncio.sleep(0.2)
    waiter.cancel()
    try:
        await waiter
    except asyncio.CancelledError:
        pass
    await holder.arelease()
    # Still held when the loop ends: asyncio.run() must cancel the renewal task.
    return await lock("exit", timeout=5).aacquire()

print(asyncio.run(scenario()))
"""


def test_asyncio_run_returns_with_a_lease_still_held(redis_url):
    """The renewal task obeys cancellation at loop exit (no wait_for swallowing)."""
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run(
        [sys.executable, "-c", _LOOP_EXIT_SCRIPT, redis_url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
