"""The asyncio commands of the Redis backend keep their deadline.

The ``redis.asyncio`` connections have no socket timeout of their own (redis-py
would start a task per write under one): each command runs under one
deadline instead: an ``asyncio.timeout(None)`` that the loop's ``Watch``
reschedules to now once the deadline has passed, one timer per loop for all
the commands in flight (on 3.10, ``async_timeout(seconds)`` of the package
redis-py depends on there, a timer per command). Against a paused (SIGSTOP)
redis-server every kind of command must still end as a LockBackendError
within that deadline, leave no cancellation on the task, and leave the
client usable once the server runs again.
"""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
from django.test import override_settings

from django_distlock import LockBackendError, lock, locks
from django_distlock.backends.redis.client import async_timeout
from django_distlock.backends.redis.deadlines import SHARED_TIMER, Watch

from .conftest import redis_locks
from .servers import RedisServer

pytestmark = pytest.mark.redis

SOCKET_TIMEOUT = 0.3
CONNECT_TIMEOUT = 0.2
#: The deadline of one command: the socket timeout plus the connect timeout.
DEADLINE = SOCKET_TIMEOUT + CONNECT_TIMEOUT
#: What "promptly" allows beyond the deadline on a loaded machine.
SLACK = 1.0


@pytest.fixture
def server():
    """A redis-server of this test alone (it is paused and resumed)."""
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def settings_on(server):
    options = {
        "SOCKET_TIMEOUT": SOCKET_TIMEOUT,
        "SOCKET_CONNECT_TIMEOUT": CONNECT_TIMEOUT,
    }
    with override_settings(
        LOCKS=redis_locks(server.url, AUTO_RENEW=False, OPTIONS=options)
    ):
        try:
            yield
        finally:
            locks.reset()


def test_the_deadline_is_asyncio_timeout_or_the_async_timeout_package():
    if sys.version_info >= (3, 11):
        assert async_timeout is asyncio.timeout
    else:
        import async_timeout as package

        assert async_timeout is package.timeout


class CountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts the timers scheduled on it."""

    timers = 0

    def call_at(self, *args, **kwargs):
        self.timers += 1
        return super().call_at(*args, **kwargs)


def _on_counting_loop(scenario):
    loop = CountingLoop()
    try:
        return loop.run_until_complete(scenario(loop)), loop.timers
    finally:
        loop.close()


async def _answered(seconds: float | None = None):
    """Stand in for a command: answered in the next loop iteration, or
    after ``seconds``."""
    if seconds is not None:
        await asyncio.sleep(seconds)
        return
    future = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(future.set_result, None)
    await future


async def _under(watch: Watch, seconds: float | None, command) -> None:
    timeout = watch.start(seconds)
    try:
        async with timeout:
            await command
    finally:
        watch.end(timeout)


def test_commands_answered_in_time_share_one_timer():
    async def scenario(loop):
        watch = Watch()
        for _ in range(1000):
            await _under(watch, 30.0, _answered())

    _, timers = _on_counting_loop(scenario)
    if SHARED_TIMER:
        assert timers == 1  # asyncio.timeout(30) would have scheduled 1,000
    else:
        assert timers == 1000  # Python 3.10: a timer per command, as before


def test_a_command_past_its_deadline_fails_with_timeout_error():
    async def scenario(loop):
        watch = Watch()
        started = loop.time()
        with pytest.raises(asyncio.TimeoutError):
            await _under(watch, 0.05, _answered(10))
        took = loop.time() - started
        if sys.version_info >= (3, 11):
            assert asyncio.current_task().cancelling() == 0
        await _under(watch, 0.05, _answered())  # the watch goes on
        return took

    took, _ = _on_counting_loop(scenario)
    assert 0.05 <= took < 0.05 + SLACK


def test_each_command_in_flight_expires_at_its_own_deadline():
    """A shorter deadline that comes in after a longer one is kept too."""

    async def scenario(loop):
        watch = Watch()
        started = loop.time()
        ended: dict[str, float] = {}

        async def command(name, seconds, runs):
            try:
                await _under(watch, seconds, _answered(runs))
                ended[name] = -1.0  # answered
            except asyncio.TimeoutError:
                ended[name] = loop.time() - started

        await asyncio.gather(
            command("long", 0.6, 10),
            command("short", 0.1, 10),
            command("answered", 0.3, 0.05),
        )
        return ended

    ended, _ = _on_counting_loop(scenario)
    assert ended["answered"] == -1.0
    assert 0.1 <= ended["short"] < 0.1 + SLACK / 2
    assert 0.6 <= ended["long"] < 0.6 + SLACK
    assert ended["short"] < ended["long"]


def test_a_callers_cancellation_stays_a_cancellation():
    async def scenario(loop):
        watch = Watch()
        task = asyncio.create_task(_under(watch, 5.0, _answered(10)))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Nothing left in flight: the timer, when due, does nothing.
        await _under(watch, 0.05, _answered())

    _on_counting_loop(scenario)


def test_a_timeout_never_entered_does_not_stop_the_others():
    async def scenario(loop):
        watch = Watch()
        watch.start(0.01)  # a misuse: never entered, never ended
        with pytest.raises(asyncio.TimeoutError):
            await _under(watch, 0.05, _answered(10))

    _on_counting_loop(scenario)


def test_no_deadline_schedules_nothing():
    async def scenario(loop):
        watch = Watch()
        for _ in range(10):
            await _under(watch, None, _answered())

    _, timers = _on_counting_loop(scenario)
    assert timers == 0


async def _paused(server, call, *, wait: float = 0.0) -> float:
    """Pause ``server``, await ``call()`` (which must fail with a
    LockBackendError naming a timeout) and return the seconds it took."""
    server.pause()
    started = time.monotonic()
    try:
        with pytest.raises(LockBackendError, match="Timeout"):
            await call()
    finally:
        server.resume()
    took = time.monotonic() - started
    assert took < DEADLINE + wait + SLACK, took
    if sys.version_info >= (3, 11):
        # The deadline was the command's own: no cancellation is left.
        assert asyncio.current_task().cancelling() == 0
    return took


async def _usable_again() -> None:
    async with lock("after", timeout=5):
        pass


def test_acquire_script(server, settings_on):
    async def scenario():
        await _usable_again()  # a pooled connection exists
        took = await _paused(server, lambda: lock("x", timeout=5).aacquire())
        assert took >= SOCKET_TIMEOUT * 0.8
        await _usable_again()

    asyncio.run(scenario())


def test_release_script(server, settings_on):
    async def scenario():
        held = lock("x", ttl=30)
        assert await held.aacquire(timeout=0)
        await _paused(server, held.arelease)
        await _usable_again()

    asyncio.run(scenario())


def test_extend_script_and_hget(server, settings_on):
    async def scenario():
        async with lock("x", ttl=30) as held:
            await _paused(server, lambda: held.aextend(30))
            await _paused(server, held.alocked)
            assert await held.alocked()

    asyncio.run(scenario())


def test_many_commands_in_flight_each_fail_within_their_deadline(server, settings_on):
    """Twenty tasks' acquisitions on a paused server share the loop's timer:
    each still fails within its own deadline, none keeps a cancellation, and
    the names are usable once the server runs again."""

    async def one(i):
        started = time.monotonic()
        with pytest.raises(LockBackendError, match="Timeout"):
            await lock(f"x{i}", timeout=5).aacquire()
        if sys.version_info >= (3, 11):
            assert asyncio.current_task().cancelling() == 0
        return time.monotonic() - started

    async def scenario():
        await _usable_again()
        server.pause()
        try:
            took = await asyncio.gather(*(one(i) for i in range(20)))
        finally:
            server.resume()
        assert max(took) < DEADLINE + SLACK, took
        assert min(took) >= SOCKET_TIMEOUT * 0.8, took
        for i in range(20):
            async with lock(f"after{i}", timeout=5):
                pass

    asyncio.run(scenario())


def test_blocking_wait_gets_its_wait_on_top_of_the_deadline(server, settings_on):
    """A waiter's BLPOP may take its wait and the deadline, no more."""

    async def scenario():
        holder = lock("x", ttl=30)
        assert await holder.aacquire(timeout=0)
        waiter = lock("x", ttl=30, timeout=10)
        task = asyncio.create_task(waiter.aacquire())
        await asyncio.sleep(0.1)  # in BLPOP by now
        server.pause()
        started = time.monotonic()
        try:
            with pytest.raises(LockBackendError, match="Timeout"):
                await task
        finally:
            server.resume()
        took = time.monotonic() - started
        # The wait slice under a 0.3 s socket timeout is 0.18 s.
        assert took < DEADLINE + SOCKET_TIMEOUT + SLACK, took
        await holder.arelease()
        await _usable_again()

    asyncio.run(scenario())


def test_renewal_pipeline(server, settings_on):
    backend = locks["default"]

    async def scenario():
        held = lock("x", ttl=30)
        assert await held.aacquire(timeout=0)
        server.pause()
        started = time.monotonic()
        try:
            results = await backend.arenew([held.lease])
        finally:
            server.resume()
        took = time.monotonic() - started
        assert results == [None]  # unreachable: retried, not lost
        assert took < DEADLINE + SLACK, took
        assert await backend.arenew([held.lease]) == [True]
        await held.arelease()

    asyncio.run(scenario())


def test_async_commands_keep_their_deadline_under_a_running_timeout(
    server, settings_on
):
    """A caller's own (longer) timeout around the lock does not replace the
    command's deadline, and the command's does not fire the caller's."""

    async def scenario():
        await _usable_again()

        async def guarded():
            async with async_timeout(30):
                await lock("x", timeout=5).aacquire()

        await _paused(server, guarded)
        await _usable_again()

    asyncio.run(scenario())
