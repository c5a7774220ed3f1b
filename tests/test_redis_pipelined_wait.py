"""A waiter's attempt and its wait in one round trip (Redis backend).

A process whose last attempt on a name found it taken sends its next attempt
and the BLPOP of its wake list together. These tests take the lock under a
second alias of the same server (its own cache of keys, so its own idea of
which names are busy), so that the first alias's waits are the pipelined
ones, and count the server's commands.
"""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from pathlib import Path

import pytest
from django.test import override_settings

from django_distlock import LockBackendError, lock, locks
from django_distlock.backends.redis.keys import RELEASE

from .conftest import redis_locks

pytestmark = pytest.mark.redis

#: A socket timeout whose wait slice (0.6 of it) is far longer than any
#: wait these tests allow: a wait that ran a whole slice shows.
SLOW_SLICE = {"SOCKET_TIMEOUT": 10.0}
#: acquire.lua as it was before the pipelined wait (main at d72e0f5).
EARLIER_ACQUIRE = (
    Path(__file__).parent / "earlier" / "acquire_before_pipelined_wait.lua"
)


def _two_aliases(url: str, **options) -> dict:
    setting = redis_locks(url, OPTIONS=options) if options else redis_locks(url)
    setting["other"] = dict(setting["default"])
    return setting


def _calls(client) -> dict[str, int]:
    stats = client.info("commandstats")
    return {
        name: stats.get(f"cmdstat_{name}", {}).get("calls", 0)
        for name in ("evalsha", "eval", "blpop")
    }


def _record_steps(backend) -> list[str]:
    """Record the kind of every step ``backend`` carries out from now on."""
    kinds: list[str] = []
    execute, aexecute = backend._execute, backend._aexecute

    def recorded(step):
        kinds.append(step[0])
        return execute(step)

    async def arecorded(step):
        kinds.append(step[0])
        return await aexecute(step)

    backend._execute, backend._aexecute = recorded, arecorded
    return kinds


def _queued(client, name: str) -> int:
    keys = locks["default"].keys_for(name)
    return client.llen(keys.queue)


def _until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _wait_in_thread(name: str, **kwargs):
    """Start a thread that acquires ``name`` on the default alias."""
    got: list = []

    def run():
        held = lock(name, **kwargs)
        try:
            got.append(held if held.acquire() else None)
        except BaseException as e:  # noqa: BLE001 - checked by the test
            got.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, got


def _make_busy(client, name: str) -> None:
    """Make the default alias find ``name`` taken once, then be handed it."""
    holder = lock(name, using="other", auto_renew=False)
    assert holder.acquire()
    thread, got = _wait_in_thread(name, timeout=10, auto_renew=False)
    _until(lambda: _queued(client, name) == 1)
    holder.release()
    thread.join(10)
    (held,) = got
    held.release()
    assert locks["default"].keys_for(name).busy


class TestPipelinedWait:
    def test_queue_and_wait_share_a_round_trip(self, redis_url, redis_server):
        client = redis_server.client()
        with override_settings(LOCKS=_two_aliases(redis_url)):
            _make_busy(client, "x")
            holder = lock("x", using="other", auto_renew=False)
            assert holder.acquire()
            fence = holder.fencing_token
            before = _calls(client)
            steps = _record_steps(locks["default"])
            thread, got = _wait_in_thread("x", timeout=10, auto_renew=False)
            _until(lambda: _queued(client, "x") == 1)
            holder.release()
            thread.join(10)
            (held,) = got
            after = _calls(client)
            # The waiter's one attempt and one BLPOP; the holder's release.
            assert after["evalsha"] - before["evalsha"] == 2
            assert after["blpop"] - before["blpop"] == 1
            assert steps == ["evalpop"]
            assert held.locked()
            assert held.fencing_token > fence
            held.release()

    def test_a_free_name_is_granted_by_the_pipelined_attempt(
        self, redis_url, redis_server
    ):
        client = redis_server.client()
        with override_settings(LOCKS=_two_aliases(redis_url)):
            _make_busy(client, "x")
            before = _calls(client)
            held = lock("x", timeout=10, auto_renew=False)
            assert held.acquire()
            assert held.locked()
            held.release()
            middle = _calls(client)
            assert middle["blpop"] - before["blpop"] == 1  # popped its own grant
            assert not locks["default"].keys_for("x").busy
            with lock("x", timeout=10, auto_renew=False):
                pass
            # Free at the last attempt: back to the attempt alone.
            assert _calls(client)["blpop"] == middle["blpop"]
            assert client.keys("*:w:*") == []  # no wake list left behind

    def test_a_lease_about_to_end_is_not_waited_for_a_whole_slice(
        self, redis_url, redis_server
    ):
        client = redis_server.client()
        with override_settings(LOCKS=_two_aliases(redis_url, **SLOW_SLICE)):
            _make_busy(client, "x")
            # A holder that dies: its lease ends in 0.5 s, nobody releases it.
            dead = lock("x", using="other", ttl=0.5, auto_renew=False)
            assert dead.acquire()
            fence = dead.fencing_token
            started = time.monotonic()
            held = lock("x", timeout=8, auto_renew=False)
            assert held.acquire()
            took = time.monotonic() - started
            assert took < 3.0  # the lease's end, not the 6 s slice
            assert held.fencing_token > fence
            held.release()

    def test_a_forgotten_script_costs_no_wait(self, redis_url, redis_server):
        client = redis_server.client()
        with override_settings(LOCKS=_two_aliases(redis_url, **SLOW_SLICE)):
            _make_busy(client, "x")
            client.script_flush()
            started = time.monotonic()
            held = lock("x", timeout=8, auto_renew=False)
            assert held.acquire()
            assert time.monotonic() - started < 3.0  # not the 6 s slice
            held.release()
            # The dropped connection's BLPOP is gone with it.
            _until(lambda: client.info("clients")["blocked_clients"] == 0)

    def test_async_queue_and_wait_share_a_round_trip(self, redis_url, redis_server):
        client = redis_server.client()

        async def handed_over(holder):
            """Wait on the default alias until ``holder`` releases."""
            held = lock("x", timeout=10, auto_renew=False)
            waiter = asyncio.ensure_future(held.aacquire())
            while _queued(client, "x") != 1:
                await asyncio.sleep(0.005)
            holder.release()
            assert await asyncio.wait_for(waiter, 10)
            return held

        async def scenario():
            holder = lock("x", using="other", auto_renew=False)
            assert holder.acquire()
            await (await handed_over(holder)).arelease()
            assert locks["default"].keys_for("x").busy
            # Busy now: the next wait is pipelined.
            assert holder.acquire()
            fence = holder.fencing_token
            before = _calls(client)
            steps = _record_steps(locks["default"])
            held = await handed_over(holder)
            after = _calls(client)
            assert after["blpop"] - before["blpop"] == 1
            assert after["evalsha"] - before["evalsha"] == 2
            assert steps == ["evalpop"]
            assert held.fencing_token > fence
            await held.arelease()
            # A forgotten script: no whole-slice wait either.
            client.script_flush()
            started = time.monotonic()
            again = lock("x", timeout=8, auto_renew=False)
            assert await again.aacquire()
            assert time.monotonic() - started < 3.0
            await again.arelease()

        with override_settings(LOCKS=_two_aliases(redis_url, **SLOW_SLICE)):
            asyncio.run(scenario())

    def test_a_paused_server_under_a_pipelined_wait(self, redis_url):
        from .servers import RedisServer

        server = RedisServer().start()
        try:
            client = server.client()
            with override_settings(LOCKS=_two_aliases(server.url, SOCKET_TIMEOUT=0.5)):
                _make_busy(client, "x")
                holder = lock("x", using="other", auto_renew=False)
                assert holder.acquire()
                thread, got = _wait_in_thread("x", timeout=10, auto_renew=False)
                _until(lambda: _queued(client, "x") == 1)
                server.pause()
                try:
                    thread.join(10)
                    (error,) = got
                    assert isinstance(error, LockBackendError), error
                finally:
                    server.resume()
                # The in-doubt attempt is cancelled once the server answers:
                # a release does not hand the lease to a waiter that left.
                _until(lambda: _queued(client, "x") == 0)
                holder.release()
                with lock("x", using="other", timeout=0):
                    pass
        finally:
            server.stop()


def test_a_pool_that_needs_a_command_name_is_given_one(redis_url):
    """redis-py before 5.3 needs a command name for ``get_connection``; from
    5.3 on it warns about any argument."""
    import redis

    from django_distlock.backends.redis.client import RedisClients

    class NamedPool(redis.ConnectionPool):
        def get_connection(self, command_name, *keys, **options):
            assert command_name == ""
            return super().get_connection()

    clients = RedisClients(redis_url, {})
    clients.__dict__["client"] = redis.Redis(
        connection_pool=NamedPool.from_url(redis_url)
    )
    assert clients.command("PING") in (b"PONG", "PONG", True)
    # The pool of the redis-py this cell runs takes none.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert RedisClients(redis_url, {}).command("PING") in (b"PONG", True)


class TestRollingUpgrade:
    """Processes from before the pipelined wait share names with current ones.

    The earlier ``acquire.lua`` (``tests/earlier``) is run as such a process
    runs it: its own script (its own SHA), three keys and eight arguments.
    """

    @staticmethod
    def _earlier_acquire(client, keys, token: str, live_ms: int):
        """Acquire (or queue, for ``live_ms``) as an earlier process does."""
        earlier = client.register_script(EARLIER_ACQUIRE.read_text())
        args = [token, 30_000, keys.stored_name, "h", 1, "t", live_ms, 0]
        return earlier(keys=keys.triple, args=args)

    @staticmethod
    def _release(client, keys, token: str):
        release = client.register_script(RELEASE.source)
        return release(keys=keys.triple, args=[token, keys.wake_prefix])

    def test_a_pipelined_waiter_is_handed_an_earlier_holders_lease(
        self, redis_url, redis_server
    ):
        client = redis_server.client()
        with override_settings(LOCKS=_two_aliases(redis_url, **SLOW_SLICE)):
            _make_busy(client, "x")
            keys = locks["default"].keys_for("x")
            got, fence = self._earlier_acquire(client, keys, "earlier-holder", 0)
            assert got == 1
            steps = _record_steps(locks["default"])
            started = time.monotonic()
            thread, waited = _wait_in_thread("x", timeout=8, auto_renew=False)
            _until(lambda: _queued(client, "x") == 1)
            assert self._release(client, keys, "earlier-holder") == 2  # handed on
            thread.join(10)
            (held,) = waited
            assert time.monotonic() - started < 3.0  # woken, not the 6 s slice
            assert steps == ["evalpop"]
            assert held.locked()
            assert held.fencing_token > int(fence)
            held.release()

    def test_an_earlier_waiter_is_handed_a_current_holders_lease(
        self, redis_url, redis_server
    ):
        client = redis_server.client()
        with override_settings(LOCKS=_two_aliases(redis_url)):
            _make_busy(client, "x")
            keys = locks["default"].keys_for("x")
            holder = lock("x", timeout=10, auto_renew=False)
            assert holder.acquire()  # the pipelined attempt, granted at once
            fence = holder.fencing_token
            got, _ = self._earlier_acquire(client, keys, "earlier-waiter", 5000)
            assert got == 0 and _queued(client, "x") == 1
            holder.release()
            popped = client.blpop([keys.wake_prefix + "earlier-waiter"], 5)
            assert popped is not None
            assert int(popped[1]) > fence
            assert client.hget(keys.lease, "t") == b"earlier-waiter"
            assert self._release(client, keys, "earlier-waiter") == 1
            assert client.keys("*:w:*") == []  # no wake list left behind
