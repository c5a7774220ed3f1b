"""asyncio: tasks are distinct holders, renewal runs as a task of the loop."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import pytest
from django.test import override_settings

from django_distlock import LockBackendError, LockLost, LockNotAcquired, lock, locks
from django_distlock.watchdog import IDLE_TICK, get_watchdog

from .conftest import redis_locks, stalled_alias_locks

pytestmark = pytest.mark.redis

TTL = 1.0


@pytest.fixture(autouse=True)
def _redis(redis_url):
    with override_settings(LOCKS=redis_locks(redis_url)):
        yield


def watchdog_tasks():
    return [
        t
        for t in asyncio.all_tasks()
        if t.get_name().startswith("django_distlock-watchdog:")
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


def test_sync_lock_inside_a_coroutine_names_the_task_and_a_worker_thread_none():
    # The synchronous path looks the task up only where a loop runs.
    def take():
        with lock("x"):
            (holder,) = list(locks["default"].holders())
            return holder.thread

    async def scenario():
        return take(), await asyncio.to_thread(take)

    in_task, in_thread = asyncio.run(scenario())
    assert in_task.startswith(threading.current_thread().name + "/")
    assert "/" not in in_thread
    assert "/" not in take()


def test_async_renewal_runs_as_a_task_of_the_loop():
    async def scenario():
        async with lock("x", ttl=TTL) as held:
            assert len(watchdog_tasks()) == 1
            # Not the renewal thread's job:
            assert not get_watchdog().renewing(held.lease)
            await asyncio.sleep(TTL * 3)
            assert await held.alocked()
            assert not await lock("x", timeout=0).aacquire()
        # With nothing left to renew, the task ends (within two ticks).
        deadline = time.monotonic() + IDLE_TICK * 2 + 1
        while watchdog_tasks() and time.monotonic() < deadline:
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


# -- the native asyncio executor: connections, timeouts, scripts, loops ------


@pytest.fixture
def own_server():
    from .servers import RedisServer

    server = RedisServer().start()
    yield server
    server.stop()


def _own_locks(url: str, **options) -> dict:
    return redis_locks(url, AUTO_RENEW=False, OPTIONS=options)


def test_cancelled_mid_reply_never_returns_its_connection(redis_url):
    """A task cancelled while its reply is on the way leaves no connection
    holding that reply: the next commands read their own replies."""
    backend = locks["default"]

    async def scenario():
        client = backend.aclient()
        # The reply (nil) comes 1 s after the send; cancel before it.
        task = asyncio.create_task(client.blpop(["nothing"], 1))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(1.1)  # the stale reply would have arrived by now
        replies = []
        for i in range(5):
            replies.append(await client.set(f"k{i}", str(i)))
            replies.append(await client.get(f"k{i}"))
        async with lock("x") as held:
            token = held.fencing_token
        async with lock("x") as held:
            assert held.fencing_token > token
        return replies

    expected = [r for i in range(5) for r in (True, str(i).encode())]
    assert asyncio.run(scenario()) == expected


def test_cancelled_tasks_storm_keeps_connections_sound(redis_url):
    backend = locks["default"]

    async def scenario():
        async def cycle(i):
            async with lock(f"storm:{i % 3}", timeout=5):
                await asyncio.sleep(0)

        for round_ in range(20):
            tasks = [asyncio.create_task(cycle(i)) for i in range(6)]
            await asyncio.sleep(0.0005 * (round_ % 4))
            for task in tasks[::2]:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        client = backend.aclient()
        for i in range(10):
            assert await client.set("after", str(i))
            assert await client.get("after") == str(i).encode()
        for i in range(3):
            async with lock(f"storm:{i}", timeout=5):
                pass

    asyncio.run(scenario())


def test_killed_server_raises_backend_error_quickly(own_server):
    async def scenario():
        held = lock("x")
        assert await held.aacquire()
        own_server.kill()
        started = time.monotonic()
        with pytest.raises(LockBackendError):
            await held.arelease()
        with pytest.raises(LockBackendError):
            async with lock("y", timeout=5):
                pass  # pragma: no cover
        return time.monotonic() - started

    with override_settings(LOCKS=_own_locks(own_server.url)):
        assert asyncio.run(scenario()) < 1.0


def test_server_restarted_between_commands_is_reconnected(own_server):
    """An idle connection closed by the server is replaced, not reported."""

    async def scenario():
        async with lock("x"):
            pass
        own_server.restart()
        # The loop sees the server's close as soon as it polls again.
        await asyncio.sleep(0.1)
        async with lock("x") as held:
            return held.fencing_token

    with override_settings(LOCKS=_own_locks(own_server.url)):
        assert asyncio.run(scenario()) >= 1


def test_reconnecting_a_stale_connection_gets_the_connect_timeout(
    own_server, monkeypatch
):
    """An idle connection gone stale is reconnected within the command's
    deadline plus the connect timeout, as a brand-new one would be."""

    async def scenario():
        backend = locks["default"]
        async with lock("x"):
            pass
        own_server.restart()
        await asyncio.sleep(0.1)
        conn_class = backend.aclient().connection_pool.connection_class
        connect = conn_class.connect

        async def slow_connect(self):
            if not self.is_connected:
                await asyncio.sleep(0.4)  # longer than SOCKET_TIMEOUT alone
            await connect(self)

        monkeypatch.setattr(conn_class, "connect", slow_connect)
        async with lock("x") as held:
            return held.fencing_token

    with override_settings(
        LOCKS=_own_locks(own_server.url, SOCKET_TIMEOUT=0.3, SOCKET_CONNECT_TIMEOUT=1.0)
    ):
        assert asyncio.run(scenario()) >= 1


def test_paused_server_times_out_within_the_socket_timeout(own_server):
    async def scenario():
        async with lock("warm", timeout=0):
            pass  # a pooled connection exists
        own_server.pause()
        started = time.monotonic()
        try:
            with pytest.raises(LockBackendError) as caught:
                await lock("x", timeout=5).aacquire()
        finally:
            own_server.resume()
        took = time.monotonic() - started
        if sys.version_info >= (3, 11):
            # The timeout was ours: no cancellation is left on the task.
            assert asyncio.current_task().cancelling() == 0
        # The server answers again: a new connection works. ("x" itself
        # may be held now: the server ran the acquisition sent before.)
        async with lock("y", timeout=5):
            pass
        return took, caught.value

    with override_settings(LOCKS=_own_locks(own_server.url, SOCKET_TIMEOUT=0.5)):
        took, error = asyncio.run(scenario())
    assert 0.4 < took < 2.0, took
    assert "Timeout" in str(error)


def test_outer_cancellation_of_a_waiting_command_is_a_cancellation(redis_url):
    """A task cancelled from elsewhere while its command waits is cancelled
    (not turned into a backend error), and the next commands work."""
    backend = locks["default"]

    async def scenario():
        task = asyncio.create_task(backend._aexecute(("blpop", "nothing", 1)))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await backend.aclient().set("after", "1")
        assert await backend.aclient().get("after") == b"1"

    asyncio.run(scenario())


def test_command_timeout_is_a_backend_error_not_a_cancellation(own_server):
    async def scenario():
        backend = locks["default"]
        assert await backend.aclient().set("warm", "1")
        own_server.pause()
        try:
            task = asyncio.create_task(backend._aexecute(("hget", "k", "t")))
            with pytest.raises(LockBackendError, match="Timeout"):
                await task
        finally:
            own_server.resume()
        if sys.version_info >= (3, 11):
            assert task.cancelling() == 0
            assert asyncio.current_task().cancelling() == 0
        assert await backend.aclient().set("after", "1")

    with override_settings(LOCKS=_own_locks(own_server.url, SOCKET_TIMEOUT=0.3)):
        asyncio.run(scenario())


def test_noscript_recovery(redis_server, redis_url):
    async def scenario():
        async with lock("x") as held:
            first = held.fencing_token
        redis_server.client().script_flush()
        async with lock("x") as held:
            assert held.fencing_token > first
            redis_server.client().script_flush()
            assert await held.alocked()
            await held.aextend(5)
        # The renewal pipeline recovers too.
        async with lock("y", ttl=TTL, auto_renew=True) as held:
            redis_server.client().script_flush()
            await asyncio.sleep(TTL)
            assert not held.lease.lost

    asyncio.run(scenario())


def test_several_event_loops_in_sequence(redis_url):
    backend = locks["default"]
    tokens = []

    async def scenario(i):
        async with lock("x") as held:
            tokens.append(held.fencing_token)
        async with lock(f"renewed:{i}", ttl=TTL, auto_renew=True) as held:
            await asyncio.sleep(TTL * 0.5)
            assert not held.lease.lost
        return backend.aclient()

    seen = [asyncio.run(scenario(i)) for i in range(4)]
    # Each loop had connections of its own; none crossed to the next loop.
    assert len({id(c) for c in seen}) == 4
    assert tokens == sorted(set(tokens))  # strictly increasing
    # Back on a loop again, and in a thread's loop at the same time.
    results = []
    thread = threading.Thread(target=lambda: results.append(asyncio.run(scenario(9))))
    thread.start()
    asyncio.run(scenario(8))
    thread.join(30)
    assert results and tokens[-2:] == sorted(tokens[-2:])


def test_async_renewal_does_not_wake_the_task_per_acquisition(redis_url):
    """Registering a lease due after the task's next tick costs no wake-up."""
    from django_distlock.watchdog import async_watchdog

    async def scenario():
        async with lock("first", ttl=30) as first:
            assert first.lease is not None
            await asyncio.sleep(0.01)  # the renewal task is asleep now
            dog = async_watchdog().lane("default")
            waiter = dog._waiter
            assert waiter is not None and not waiter.done()
            for i in range(20):
                async with lock(f"more:{i}", ttl=30):
                    pass
            assert dog._waiter is waiter and not waiter.done()
            # A lease due sooner than the next tick wakes it at once.
            async with lock("short", ttl=0.3) as short:
                assert waiter.done()
                await asyncio.sleep(0.6)
                assert await short.alocked()

    asyncio.run(scenario())


def test_async_renewal_task_outlives_an_empty_schedule(redis_url):
    """Acquiring and releasing in a loop keeps one renewal task, not one each."""
    from django_distlock import watchdog

    async def scenario():
        dog = watchdog.async_watchdog().lane("default")
        async with lock("loop:0", ttl=30):
            pass
        task = dog._task
        assert task is not None
        for i in range(1, 20):
            async with lock(f"loop:{i}", ttl=30):
                await asyncio.sleep(0)  # the renewal task runs in between
            await asyncio.sleep(0)
        assert dog._task is task and not task.done()
        return task

    async def ends_after_idle_ticks():
        task = await scenario()
        # Nothing left to renew: it ends within two ticks.
        await asyncio.wait_for(task, watchdog.IDLE_TICK * 2 + 1)

    asyncio.run(ends_after_idle_ticks())


def test_cache_option_keeps_the_cache_connection_settings(redis_server, redis_url):
    """With OPTIONS["CACHE"], async commands go to the cache's database."""
    caches_setting = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "locks": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": redis_url.rsplit("/", 1)[0] + "/3",
            "OPTIONS": {"SOCKET_TIMEOUT": 0.7},
        },
    }
    locks_setting = {
        "default": {
            "BACKEND": "django_distlock.backends.redis.RedisLockBackend",
            "OPTIONS": {"CACHE": "locks"},
        }
    }

    async def scenario():
        async with lock("in-db-3") as held:
            assert await held.alocked()
            import redis

            db3 = redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/3")
            return db3.keys("*"), locks["default"].redis.timeouts[0]

    with override_settings(CACHES=caches_setting, LOCKS=locks_setting):
        keys, timeout = asyncio.run(scenario())
    assert len(keys) == 1 and keys[0].startswith(b"distlock:{")
    assert timeout == 0.7
    assert redis_server.client().keys("*") == []  # nothing in db 0


def test_a_stalled_backend_does_not_delay_another_backends_async_renewals(
    redis_url, own_server
):
    """On an event loop too, each alias renews in its own task: a paused
    server holds up its own renewals only."""

    async def scenario():
        other = lock("x", using="stalled", ttl=1.0)
        assert await other.aacquire()
        async with lock("x", ttl=1.0) as held:
            own_server.pause()
            try:
                # Each renewal on "stalled" now waits its 2 s socket timeout;
                # the 1 s lease on "default" needs one every third of a second.
                await asyncio.sleep(3.0)
                assert not held.lease.lost
                return await held.alocked()
            finally:
                own_server.resume()

    with override_settings(LOCKS=stalled_alias_locks(redis_url, own_server.url)):
        assert asyncio.run(scenario())
