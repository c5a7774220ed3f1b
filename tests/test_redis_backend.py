"""The Redis single-instance backend against a real redis-server."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest
import redis
from django.test import override_settings
from redis.utils import HIREDIS_AVAILABLE

from django_distlock import LockBackendError, LockLost, backends, lock, locks
from django_distlock.backends.redis.keys import ACQUIRE, RELEASE

from . import workers
from .conftest import redis_locks
from .contract import LockBackendContract
from .procs import start_process
from .servers import RedisServer, free_port

pytestmark = pytest.mark.redis


class TestRedisContract(LockBackendContract):
    """The shared backend contract on Redis."""

    @pytest.fixture
    def locks_setting(self, redis_url):
        return redis_locks(redis_url)


# -- Redis-specific behaviour ---------------------------------------------


@pytest.fixture
def own_server():
    """A redis-server of this test alone (it gets killed, paused, restarted)."""
    server = RedisServer().start()
    yield server
    server.stop()


def _settings(url: str, **options) -> dict:
    return redis_locks(url, OPTIONS=options) if options else redis_locks(url)


def _elapsed(func) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        func()
    except BaseException as e:  # noqa: BLE001 - returned to the test
        return time.monotonic() - started, e
    return time.monotonic() - started, None


class TestUnreachable:
    """A dead or paused server raises LockBackendError, never hangs."""

    def test_closed_port(self):
        with override_settings(LOCKS=_settings(f"redis://127.0.0.1:{free_port()}/0")):
            took, error = _elapsed(lambda: lock("x", timeout=5).acquire())
            assert isinstance(error, LockBackendError), error
            assert isinstance(error.__cause__, redis.exceptions.RedisError)
            with pytest.raises(LockBackendError):
                with lock("x"):
                    pass  # pragma: no cover
        assert took < 1.0  # socket timeouts are 2 s + 1 s: refused is immediate

    def test_killed_server_on_acquire_and_release(self, own_server):
        with override_settings(LOCKS=_settings(own_server.url)):
            held = lock("x", auto_renew=False)
            assert held.acquire()
            own_server.kill()
            took, error = _elapsed(held.release)
            assert isinstance(error, LockBackendError), error
            assert took < 1.0
            took, error = _elapsed(lambda: lock("y", timeout=5).acquire())
            assert isinstance(error, LockBackendError), error
            assert took < 1.0

    def test_server_dies_under_a_waiter(self, own_server):
        with override_settings(LOCKS=_settings(own_server.url)):
            holder = lock("x", auto_renew=False)
            holder.acquire()
            errors = []

            def wait():
                try:
                    lock("x", timeout=20).acquire()
                except BaseException as e:  # noqa: BLE001 - checked below
                    errors.append(e)

            waiter = threading.Thread(target=wait)
            waiter.start()
            time.sleep(0.3)  # blocked in BLPOP by now
            own_server.kill()
            waiter.join(10)
            assert not waiter.is_alive()
            (error,) = errors
            assert isinstance(error, LockBackendError), error

    def test_paused_server_times_out(self, own_server):
        with override_settings(LOCKS=_settings(own_server.url, SOCKET_TIMEOUT=0.5)):
            assert lock("warm", timeout=0).acquire()  # a pooled connection exists
            own_server.pause()
            try:
                took, error = _elapsed(lambda: lock("x", timeout=5).acquire())
                assert isinstance(error, LockBackendError), error
                assert 0.4 <= took < 3.0
                # A fresh connection to a stopped server (the kernel accepts it).
                locks.reset()
                took, error = _elapsed(lambda: lock("x", timeout=0).acquire())
                assert isinstance(error, LockBackendError), error
                assert took < 3.0
            finally:
                own_server.resume()
            # The timed-out commands were still delivered when the server woke
            # up, so "x" may be held by those ghosts until their ttl: a timeout
            # does not say the command failed. Other names work at once.
            assert lock("z", timeout=0).acquire()

    def test_works_again_after_restart_without_new_client(self, own_server):
        with override_settings(LOCKS=_settings(own_server.url)):
            with lock("x") as first:
                first_token = first.fencing_token
            backend = locks["default"]
            own_server.restart()
            # The pooled connection is stale: it is replaced, no error surfaces.
            with lock("x", timeout=0) as second:
                assert second.fencing_token > first_token
            assert locks["default"] is backend

    def test_async_works_again_after_restart_and_a_stray_reply(self, own_server):
        """An idle async connection that closed, or holds a reply nobody asked
        for, is replaced before use: no error surfaces."""

        async def cycle():
            async with lock("x", timeout=1) as held:
                return held.fencing_token

        async def scenario():
            first = await cycle()
            own_server.restart()
            # The loop sees the server's close as soon as it polls again
            # (redis-py's pool then reconnects before use).
            await asyncio.sleep(0.1)
            second = await cycle()
            assert second > first
            # A stray reply on the idle connection (as after a command whose
            # reader went away): the stream is not in step any more.
            backend = locks["default"]
            pool = backend.aclient().connection_pool
            conn = await pool.get_connection()
            await conn.send_command("PING")
            await asyncio.sleep(0.2)
            await pool.release(conn)
            assert await cycle() > second

        with override_settings(LOCKS=_settings(own_server.url)):
            asyncio.run(scenario())

    def test_lease_lost_when_server_restarts_empty(self, own_server):
        with override_settings(LOCKS=_settings(own_server.url)):
            with pytest.raises(LockLost):
                with lock("x", auto_renew=False):
                    own_server.restart()

    def test_async_unreachable(self):
        async def scenario():
            with pytest.raises(LockBackendError):
                await lock("x", timeout=1).aacquire()

        with override_settings(LOCKS=_settings(f"redis://127.0.0.1:{free_port()}/0")):
            took, error = _elapsed(lambda: asyncio.run(scenario()))
        assert error is None
        assert took < 2.0


class TestScripts:
    """Scripts are loaded on demand and take values only through ARGV."""

    def test_recover_after_script_flush(self, redis_url, redis_server):
        with override_settings(LOCKS=_settings(redis_url)):
            held = lock("x", auto_renew=False)
            assert held.acquire()
            redis_server.client().script_flush()
            held.extend(5)
            held.release()
            redis_server.client().script_flush()
            with lock("x", timeout=0):
                pass

    def test_renewal_recovers_after_script_flush(self, redis_url, redis_server):
        with override_settings(LOCKS=_settings(redis_url)):
            with lock("x", ttl=0.6) as held:
                redis_server.client().script_flush()
                time.sleep(2.0)
                assert held.locked()
                assert lock("x", timeout=0).acquire() is False

    @pytest.mark.parametrize(
        "name",
        [
            "x') redis.call('flushall') --",
            "]] .. redis.call('flushall') .. [[",
            "%s %d \\0 {tag} * ? [a-z]",
            "KEYS[1]",
        ],
    )
    def test_names_with_lua_and_glob_syntax(self, redis_url, redis_server, name):
        client = redis_server.client()
        client.set("canary", "1")
        with override_settings(LOCKS=_settings(redis_url)):
            with lock(name) as held:
                assert [h.name for h in locks["default"].holders()] == [name]
                assert lock(name, timeout=0).acquire() is False
                assert lock(name + "x", timeout=0).acquire() is True
                held.extend(5)
        assert client.get("canary") == b"1"

    def test_scripts_read_values_only_from_argv(self):
        # No script builds Lua source or a command from data, and no value is
        # spliced into a script on the Python side: every .lua file is static.
        lua = Path(backends.__file__).parent.glob("*/lua/*.lua")
        for path in lua:
            source = path.read_text()
            assert "loadstring" not in source and "load(" not in source, path
            assert "redis.call('eval" not in source.lower(), path
        path = Path(backends.__file__).parent / "redis" / "lua" / "release.lua"
        assert RELEASE.source == path.read_text()


def _through_cache(redis_url: str, **cache_options) -> tuple[dict, dict]:
    """CACHES with a django-redis cache "locks", and LOCKS that use it."""
    caches_setting = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "locks": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": redis_url,
            "OPTIONS": cache_options,
        },
    }
    locks_setting = {
        "default": {
            "BACKEND": "django_distlock.backends.redis.RedisLockBackend",
            "OPTIONS": {"CACHE": "locks"},
        }
    }
    return caches_setting, locks_setting


class TestCacheOption:
    """OPTIONS["CACHE"] reuses a django-redis cache's connection pool."""

    def test_lock_through_django_redis_cache(self, redis_url):
        from django_redis import get_redis_connection

        caches_setting, locks_setting = _through_cache(redis_url)
        with override_settings(CACHES=caches_setting, LOCKS=locks_setting):
            pool = get_redis_connection("locks").connection_pool
            assert locks["default"].client.connection_pool is pool
            with lock("x") as held:
                assert held.locked()
                assert lock("x", timeout=0).acquire() is False
            assert lock("x", timeout=0).acquire()

            async def scenario():
                async with lock("y") as held:
                    assert await held.alocked()

            asyncio.run(scenario())

    @pytest.mark.parametrize("socket_timeout", [1.0, 0.3])
    def test_a_wait_outlasts_the_pools_socket_timeout(self, redis_url, socket_timeout):
        """A blocking wait is never cut by the cache pool's socket timeout:
        it waits in slices shorter than it (sync and async)."""
        caches_setting, locks_setting = _through_cache(
            redis_url, SOCKET_TIMEOUT=socket_timeout
        )
        with override_settings(CACHES=caches_setting, LOCKS=locks_setting):
            for name in ("sync", "async"):
                holder = lock(f"slow:{name}", timeout=0)
                assert holder.acquire()
                timer = threading.Timer(2.5, holder.release)
                timer.start()
                started = time.monotonic()
                try:
                    if name == "sync":
                        got = lock(f"slow:{name}", timeout=5).acquire()
                    else:
                        waiter = lock(f"slow:{name}", timeout=5)
                        got = asyncio.run(waiter.aacquire())
                finally:
                    timer.join()
                took = time.monotonic() - started
                assert got is True, name
                assert 2.3 < took < 3.5, (name, took)

    def test_connection_options_beside_cache_are_a_check_error(self, redis_url):
        from django_distlock.checks import check_locks_setting

        caches_setting, locks_setting = _through_cache(redis_url)
        options = locks_setting["default"]["OPTIONS"]
        options["SOCKET_TIMEOUT"] = 5
        options["CONNECTION_POOL_KWARGS"] = {}
        with override_settings(CACHES=caches_setting, LOCKS=locks_setting):
            errors = [e for e in check_locks_setting() if e.id == "distlock.E025"]
        assert len(errors) == 1
        assert "SOCKET_TIMEOUT" in errors[0].msg
        assert "CONNECTION_POOL_KWARGS" in errors[0].msg
        assert "CACHES['locks']" in errors[0].hint
        del options["SOCKET_TIMEOUT"], options["CONNECTION_POOL_KWARGS"]
        with override_settings(CACHES=caches_setting, LOCKS=locks_setting):
            assert check_locks_setting() == []


class TestLayout:
    """What a held lock costs and where it lives."""

    def test_keys_inside_prefix_and_one_hash_slot(self, redis_url, redis_server):
        with override_settings(LOCKS=_settings(redis_url)):
            with lock("report:daily"):
                keys = redis_server.client().keys("*")
        assert len(keys) == 1
        assert keys[0].startswith(b"distlock:{")

    def test_memory_per_held_lock(self, redis_url, redis_server):
        client = redis_server.client()
        with override_settings(LOCKS=_settings(redis_url)):
            with lock("report:daily"):
                (key,) = client.keys("*")
                usage = client.memory_usage(key, samples=0)
        assert usage < 400, usage

    def test_waiter_queue_cleans_up(self, redis_url, redis_server):
        with override_settings(LOCKS=_settings(redis_url)):
            with lock("x"):
                assert lock("x", timeout=0.2).acquire() is False
            client = redis_server.client()
            deadline = time.monotonic() + 5
            while client.keys("*") and time.monotonic() < deadline:
                time.sleep(0.1)
            assert client.keys("*") == []

    def test_a_waiter_that_takes_an_expired_lease_leaves_the_queue(
        self, redis_url, redis_server
    ):
        # Only a retry looks for the caller's place in the queue: the
        # waiter queued on its first attempt, then took the lease by a retry
        # once the holder's lease ran out (no release, so no handoff).
        client = redis_server.client()
        with override_settings(LOCKS=_settings(redis_url)):
            keys = locks["default"].keys_for("x")
            gone = lock("x", ttl=0.3, auto_renew=False)
            assert gone.acquire()
            waiter = lock("x", timeout=10, auto_renew=False)
            assert waiter.acquire()
            assert client.llen(keys.queue) == 0
            assert client.hlen(keys.records) == 0
            lease = client.hgetall(keys.lease)
            assert lease[b"t"] == waiter.lease.token.encode()
            # The time acquired (ms) is the fencing token (µs) to the ms.
            assert int(lease[b"a"]) == int(lease[b"f"]) // 1000
            waiter.release()
            assert client.keys("*") == []


class TestWaiters:
    """Queued waiters that go away never keep the lock."""

    def test_interrupted_waiter_leaves_the_queue(self, redis_url, redis_server):
        with override_settings(LOCKS=_settings(redis_url)):
            backend = locks["default"]
            holder = lock("x")
            holder.acquire()
            original = backend._execute

            def interrupt_blpop(command):
                if command[0] == "blpop":
                    raise KeyboardInterrupt
                return original(command)

            backend._execute = interrupt_blpop
            try:
                with pytest.raises(KeyboardInterrupt):
                    lock("x", timeout=10).acquire()
            finally:
                del backend._execute
            client = redis_server.client()
            assert sorted(client.keys("*")) == [holder_key(backend, "x")]
            holder.release()
            assert lock("x", timeout=0).acquire()

    def test_interrupted_after_taking_the_lock_gives_it_back(self, redis_url):
        with override_settings(LOCKS=_settings(redis_url)):
            backend = locks["default"]
            original = backend._execute

            def reply_lost(command):
                result = original(command)
                if command[1] is ACQUIRE:
                    raise KeyboardInterrupt  # after the server took the lock
                return result

            backend._execute = reply_lost
            try:
                with pytest.raises(KeyboardInterrupt):
                    lock("x", timeout=0).acquire()
            finally:
                del backend._execute
            assert lock("x", timeout=0).acquire()

    def test_cancelled_aacquire_gives_the_lock_back(self, redis_url):
        with override_settings(LOCKS=_settings(redis_url)):
            backend = locks["default"]
            original = backend._aexecute

            async def reply_lost(command):
                result = await original(command)
                if command[1] is ACQUIRE:
                    raise asyncio.CancelledError
                return result

            backend._aexecute = reply_lost

            async def scenario():
                with pytest.raises(asyncio.CancelledError):
                    await lock("x", timeout=0).aacquire()
                del backend._aexecute
                return await lock("x", timeout=0).aacquire()

            assert asyncio.run(scenario()) is True

    def test_killed_waiter_process_delays_others_at_most_its_ttl(
        self, redis_url, redis_server
    ):
        with override_settings(LOCKS=_settings(redis_url)):
            backend = locks["default"]
            holder = lock("x")
            holder.acquire()
            queue = backend.keys_for("x").queue
            client = redis_server.client()
            proc = start_process(workers.try_acquire, "x", 60.0, 1.0)
            try:
                deadline = time.monotonic() + 60
                while not client.llen(queue) and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert client.llen(queue) == 1, "the worker never queued"
            finally:
                proc.kill()
                proc.join(10)
            holder.release()  # may hand the lease to the dead waiter (ttl 1 s)
            started = time.monotonic()
            with lock("x", timeout=10):
                assert time.monotonic() - started < 5


def _reading_ahead() -> bool:
    return any(t.name == "distlock-list" for t in threading.enumerate())


def holder_key(backend, name) -> bytes:
    return backend.keys_for(name).lease.encode()


@pytest.mark.parametrize("reentrant", [False, True])
def test_holder_of_one_name_in_one_round_trip(redis_url, redis_server, reentrant):
    params = _settings(redis_url)
    if reentrant:
        params["default"]["BACKEND"] = (
            "django_distlock.backends.redis.ReentrantRedisLockBackend"
        )
    with override_settings(LOCKS=params):
        backend = locks["default"]
        name = "looked up \n*?[ ünïcode"
        with lock(name) as held:
            stats = redis_server.client().info("commandstats")
            holder = backend.holder_of(name)
            after = redis_server.client().info("commandstats")
            assert "cmdstat_scan" not in after or after.get(
                "cmdstat_scan"
            ) == stats.get("cmdstat_scan")
            assert holder.name == name
            assert holder.token == held.lease.token
            assert holder.fencing_token == held.fencing_token
            assert holder.pid == os.getpid()
            assert holder.thread == threading.current_thread().name
            assert holder.expires_at is not None
            again = asyncio.run(backend.aholder_of(name))
            assert (again.token, again.fencing_token) == (
                holder.token,
                holder.fencing_token,
            )
            assert backend.holder_of(name[:-1]) is None  # another name
        assert backend.holder_of(name) is None


def test_holders_ignore_a_longer_key_prefix_that_starts_with_ours(redis_url):
    """Two aliases on one server: "app" must not list "app:{x}"'s locks."""
    setting = {
        "default": {
            "BACKEND": "django_distlock.backends.redis.RedisLockBackend",
            "LOCATION": redis_url,
            "KEY_PREFIX": "app",
        },
        "other": {
            "BACKEND": "django_distlock.backends.redis.RedisLockBackend",
            "LOCATION": redis_url,
            "KEY_PREFIX": "app:{x}",
        },
    }
    with override_settings(LOCKS=setting):
        with lock("mine"), lock("theirs", using="other"):
            assert [h.name for h in locks["default"].holders()] == ["mine"]
            assert [h.name for h in locks["other"].holders()] == ["theirs"]


class TestListing:
    """holders(): pipelined reads for a full listing, the script for a prefix."""

    NAMES = ["a", "a*", "ab", "a\0b", "é", "\ud800", "x" * 1000, "b:{c}"]

    def _listed(self, backend, prefix=""):
        return sorted(
            (h.name, h.token, h.fencing_token, h.host, h.pid, h.thread)
            for h in backend.holders(prefix)
        )

    def test_both_paths_list_the_same_holders(self, redis_url):
        with override_settings(LOCKS=redis_locks(redis_url)):
            held = [lock(n, timeout=0) for n in self.NAMES]
            for handle in held:
                assert handle.acquire()
            backend = locks["default"]
            full = self._listed(backend)
            assert [row[0] for row in full] == sorted(self.NAMES)
            # The script path (a prefix) reads the same fields.
            assert self._listed(backend, "a") == [r for r in full if r[0][0] == "a"]
            assert self._listed(backend, "\ud800") == [
                r for r in full if r[0] == "\ud800"
            ]
            (holder,) = backend.holders("é")
            assert holder.acquired_at <= holder.expires_at
            assert holder.acquired_at.tzinfo is not None
            for handle in held:
                handle.release()
            assert list(backend.holders()) == []

    def test_skips_keys_that_are_not_leases(self, redis_url):
        with override_settings(LOCKS=redis_locks(redis_url)):
            backend = locks["default"]
            client = redis.Redis.from_url(redis_url)
            digest_like = "distlock:{" + "A" * 43 + "}"
            client.set(digest_like, "a string, not a lease")
            client.hset("distlock:{" + "B" * 43 + "}", "x", "a hash with no token")
            with lock("real"):
                assert [h.name for h in backend.holders()] == ["real"]
                assert [h.name for h in backend.holders("re")] == ["real"]

    def test_many_batches_and_an_abandoned_listing(self, redis_url):
        from django_distlock.backends.redis.listing import LIST_BATCH

        from .surface import fill_redis

        count = 3 * LIST_BATCH + 7
        fill_redis(redis_url, "many:", count)
        with override_settings(LOCKS=redis_locks(redis_url)):
            backend = locks["default"]
            listing = backend.holders()
            next(listing)
            listing.close()  # replies of the next step were in flight
            # ... and the thread reading ahead stops (at its next batch).
            deadline = time.monotonic() + 5
            while _reading_ahead() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not _reading_ahead()
            names = [h.name for h in backend.holders()]
            assert sorted(names) == sorted(f"many:{i}" for i in range(count))
            assert len(list(backend.holders("many:1"))) == len(
                [n for n in names if n.startswith("many:1")]
            )
            with lock("after", timeout=0):
                assert any(h.name == "after" for h in backend.holders("after"))

    def test_a_server_lost_mid_listing_is_an_error_not_a_short_list(self, own_server):
        # The next batch is read in a thread: its failure still reaches the
        # caller, where that batch would have.
        from django_distlock.backends.redis.listing import LIST_BATCH

        from .surface import fill_redis

        # More batches than the read-ahead holds (one handed over, one read):
        # the thread must ask the server again after the kill.
        fill_redis(own_server.url, "lost:", 10 * LIST_BATCH)
        with override_settings(LOCKS=redis_locks(own_server.url)):
            listing = locks["default"].holders()
            next(listing)
            own_server.kill()
            with pytest.raises(LockBackendError, match="list locks"):
                for _ in listing:
                    pass
            locks.reset()

    @pytest.mark.skipif(HIREDIS_AVAILABLE, reason="the no-hiredis matrix cell runs it")
    def test_without_hiredis(self, redis_url):
        with override_settings(LOCKS=_settings(redis_url)):
            with lock("plain parser"):
                client = redis.Redis.from_url(redis_url)
                client.set("distlock:{" + "A" * 43 + "}", "not a hash")
                (holder,) = locks["default"].holders()
                assert holder.name == "plain parser"
                # Commands go through redis-py's reads here: an error reply
                # (NOSCRIPT) still comes back as such, and is recovered from.
                client.script_flush()
            with lock("plain parser", timeout=0):
                pass

    def test_through_a_django_redis_cache(self, redis_url):
        caches_setting, locks_setting = _through_cache(redis_url)
        with override_settings(CACHES=caches_setting, LOCKS=locks_setting):
            with lock("cached"):
                listing = locks["default"].holders()
                assert next(listing).name == "cached"
                listing.close()
                assert [h.name for h in locks["default"].holders()] == ["cached"]
