"""The backend contract, as one test class that every backend runs.

Modelled on Django's ``tests/cache/tests.py`` (``BaseCacheTests`` plus one
subclass per backend). :class:`LockBackendContract` is not collected by
itself (its name does not start with ``Test``); a backend's test module
subclasses it and provides a ``locks_setting`` fixture: a complete ``LOCKS``
dict whose ``"default"`` entry is the backend under test. Every test runs
under ``override_settings(LOCKS=locks_setting)`` and uses the default alias.

Redis (a real server started by the session fixture in ``conftest.py``)::

    import pytest
    from tests.conftest import redis_locks
    from tests.contract import LockBackendContract

    class TestRedisContract(LockBackendContract):
        @pytest.fixture
        def locks_setting(self, redis_url):
            return redis_locks(redis_url)

A database backend also needs database access for the test *and* for the
worker processes of the cross-process tests, which only see committed rows,
so it marks the class with ``transaction=True``; a class-level ``pytestmark``
is inherited by every test of the contract::

    @pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
    class TestPostgresContract(LockBackendContract):
        @pytest.fixture
        def locks_setting(self, postgres_available):
            return {"default": {
                "BACKEND": "django_distlock.backends.database.DatabaseLockBackend",
                "OPTIONS": {"DATABASE": "postgres"},
            }}

Class attributes tune the contract to what a backend can promise:

- ``cross_process = False`` skips the tests that need several processes to
  share locks (an in-process backend such as locmem).
- ``ttl = 0.3`` is the short lease used by expiry tests; raise it for a
  backend whose clock resolution is coarser. ``renew_ttl`` is the lease of
  the auto-renewal tests: renewal runs every third of it, so a renewal
  thread starved of CPU for two thirds of it loses the lease.

Cross-process tests run :mod:`tests.workers` functions in spawned processes
(:mod:`tests.procs`), which set Django up with the same settings, test
databases and ``LOCKS``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
import uuid

import pytest
from django.test import override_settings

from django_distlock import (
    LockLost,
    LockNotAcquired,
    LockNotHeld,
    lock,
    locks,
)
from django_distlock.locking import Lock
from django_distlock.signals import (
    lock_acquired,
    lock_contended,
    lock_lost,
    lock_released,
)

from . import workers
from .procs import run_in_processes, start_process

__all__ = ["LockBackendContract", "Recorder"]


class Recorder:
    """Collect the keyword arguments of every send of some signals."""

    def __init__(self, *signals):
        self.signals = signals
        self.calls: list[tuple[object, dict]] = []
        self.event = threading.Event()

    def __call__(self, signal, sender, **kwargs):
        self.calls.append((signal, kwargs))
        self.event.set()

    def __enter__(self):
        for s in self.signals:
            s.connect(self, weak=False)
        return self

    def __exit__(self, *exc):
        for s in self.signals:
            s.disconnect(self)

    def of(self, signal) -> list[dict]:
        return [kw for s, kw in self.calls if s is signal]

    def wait_for(self, signal, timeout: float = 10.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while not self.of(signal) and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.of(signal)


def _in_thread(func, *args):
    """Run ``func(*args)`` in a new thread; return (thread, result list)."""
    result: list = []

    def target():
        try:
            result.append(func(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            result.append(e)

    t = threading.Thread(target=target)
    t.start()
    return t, result


class LockBackendContract:
    """What every lock backend must do; subclass with a ``locks_setting`` fixture."""

    cross_process = True
    ttl = 0.3
    renew_ttl = 1.0

    @pytest.fixture(autouse=True)
    def _contract_locks(self, locks_setting):
        with override_settings(LOCKS=locks_setting):
            yield
        locks.reset()

    @pytest.fixture
    def name(self, request):
        """A lock name of this test alone (with characters that need care)."""
        return f"contract:{request.node.name} [*?] {uuid.uuid4().hex[:8]}"

    @property
    def backend(self):
        return locks["default"]

    def _need_processes(self):
        if not self.cross_process:
            pytest.skip("this backend does not share locks between processes")

    # -- acquire / release ------------------------------------------------

    def test_acquire_release(self, name):
        held = lock(name, timeout=0)
        assert held.fencing_token is None
        assert held.acquire() is True
        assert isinstance(held.fencing_token, int)
        assert held.locked()
        held.release()
        assert held.fencing_token is None
        assert not held.locked()
        assert lock(name, timeout=0).acquire() is True

    def test_context_manager(self, name):
        with lock(name) as held:
            assert isinstance(held, Lock)
            assert held.locked()
            assert lock(name, timeout=0).acquire() is False
        assert not held.locked()
        with lock(name, timeout=0):
            pass

    def test_context_manager_releases_when_the_block_raises(self, name):
        with pytest.raises(ZeroDivisionError):
            with lock(name):
                raise ZeroDivisionError
        with lock(name, timeout=0):
            pass

    def test_release_of_unheld_handle(self, name):
        with pytest.raises(LockNotHeld):
            lock(name).release()
        with pytest.raises(LockNotHeld):
            lock(name).extend(5)

    def test_decorator_sync(self, name):
        calls = []

        @lock(name, timeout=0)
        def job(x):
            calls.append(lock(name, timeout=0).acquire())
            return x * 2

        assert job(2) == 4
        assert job(3) == 6
        assert calls == [False, False]  # held inside, free again between calls
        with lock(name, timeout=0):
            with pytest.raises(LockNotAcquired):
                job(1)

    def test_decorator_fresh_handle_per_call(self, name, monkeypatch):
        entered = []
        original = Lock.__enter__

        def spy(self):
            entered.append(self)
            return original(self)

        monkeypatch.setattr(Lock, "__enter__", spy)
        decorator = lock(name, timeout=5)

        @decorator
        def job():
            time.sleep(0.05)

        threads = [threading.Thread(target=job) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(entered) == 3
        assert len({id(h) for h in entered}) == 3
        assert decorator not in entered
        assert decorator.lease is None

    def test_decorator_async(self, name):
        @lock(name, timeout=0)
        async def job(x):
            inner = lock(name, timeout=0)
            got = await inner.aacquire()
            return x, got

        assert asyncio.run(job(1)) == (1, False)
        assert asyncio.run(job(2)) == (2, False)

    def test_nonblocking_and_timeout_zero_when_busy(self, name):
        with lock(name):
            assert lock(name).acquire(blocking=False) is False
            assert lock(name, timeout=0).acquire() is False
            assert lock(name).acquire(timeout=0) is False

    def test_not_reentrant(self, name):
        if self.backend.reentrant:
            pytest.skip("reentrant backend")
        with lock(name):
            # Same thread, another handle: it waits like any other owner.
            assert lock(name).acquire(timeout=0.1) is False

    def test_contention_timeout_raises_on_with(self, name):
        with lock(name):
            started = time.monotonic()
            with pytest.raises(LockNotAcquired) as info:
                with lock(name, timeout=0.3):
                    pass  # pragma: no cover
            assert time.monotonic() - started >= 0.25
            assert info.value.name == name

    # -- fencing ----------------------------------------------------------

    def test_fencing_tokens_strictly_increase(self, name):
        tokens = []
        for _ in range(5):
            with lock(name) as held:
                tokens.append(held.fencing_token)
        # After expiry and takeover:
        old = lock(name, ttl=self.ttl, auto_renew=False)
        assert old.acquire()
        tokens.append(old.fencing_token)
        with lock(name, timeout=10) as new:
            tokens.append(new.fencing_token)
        with pytest.raises(LockLost):
            old.release()
        # After a force release:
        held = lock(name, auto_renew=False)
        held.acquire()
        tokens.append(held.fencing_token)
        assert self.backend.force_release(name, held.lease.token) is True
        with lock(name, timeout=0) as again:
            tokens.append(again.fencing_token)
        assert all(a < b for a, b in zip(tokens, tokens[1:])), tokens

    def test_fencing_tokens_per_name_independent(self, name):
        with lock(name) as a, lock(name + "-other") as b:
            assert a.fencing_token is not None and b.fencing_token is not None

    # -- expiry, takeover, loss -------------------------------------------

    def test_expiry_and_takeover(self, name):
        old = lock(name, ttl=self.ttl, auto_renew=False)
        started = time.monotonic()
        assert old.acquire()
        new = lock(name, timeout=10)
        assert new.acquire()
        assert time.monotonic() - started >= self.ttl * 0.9
        assert new.fencing_token > old.fencing_token
        assert not old.locked()
        assert new.locked()
        with pytest.raises(LockLost):
            old.extend(5)
        with pytest.raises(LockLost):
            old.release()
        with pytest.raises(LockNotHeld):
            old.release()  # a lost lease is dropped by its failed release
        new.release()

    def test_lock_lost_on_exit_after_takeover(self, name):
        with Recorder(lock_lost) as rec:
            with pytest.raises(LockLost) as info:
                with lock(name, ttl=self.ttl, auto_renew=False):
                    with lock(name, timeout=10):
                        pass
            assert info.value.name == name
            assert len(rec.of(lock_lost)) == 1
            assert rec.of(lock_lost)[0]["name"] == name

    def test_block_exception_propagates_and_loss_is_signalled(self, name):
        class Boom(Exception):
            pass

        with Recorder(lock_lost) as rec:
            with pytest.raises(Boom):
                with lock(name, ttl=self.ttl, auto_renew=False):
                    with lock(name, timeout=10):
                        pass
                    raise Boom
            assert [kw["name"] for kw in rec.of(lock_lost)] == [name]

    def test_release_by_non_owner_refused(self, name):
        with lock(name) as held:
            other = lock(name, timeout=0)
            with pytest.raises(LockNotHeld):
                other.release()
            assert self.backend.force_release(name, "not-the-token") is False
            assert held.locked()
        # The owner's release worked and left nothing behind.
        assert lock(name, timeout=0).acquire()

    def test_extend(self, name):
        with lock(name, ttl=1.0, auto_renew=False) as held:
            held.extend(3)
            time.sleep(1.5)  # past the original ttl
            assert held.locked()
            assert lock(name, timeout=0).acquire() is False
            held.extend()  # back to the handle's ttl

    def test_locked(self, name):
        held = lock(name, ttl=5, auto_renew=False)
        assert not held.locked()
        held.acquire()
        assert held.locked()
        held.release()
        assert not held.locked()
        short = lock(name, ttl=self.ttl, auto_renew=False)
        short.acquire()
        time.sleep(self.ttl * 2)
        assert not short.locked()
        with pytest.raises(LockLost):
            short.release()

    # -- renewal ----------------------------------------------------------

    def test_auto_renew_keeps_the_lock(self, name):
        with lock(name, ttl=self.renew_ttl, auto_renew=True) as held:
            time.sleep(self.renew_ttl * 3)
            assert held.locked()
            assert lock(name, timeout=0).acquire() is False
        assert lock(name, timeout=0).acquire()

    def test_watchdog_detects_loss(self, name):
        with Recorder(lock_lost) as rec:
            with pytest.raises(LockLost):
                with lock(name, ttl=self.renew_ttl, auto_renew=True) as held:
                    assert self.backend.force_release(name, held.lease.token)
                    lost = rec.wait_for(lock_lost, timeout=self.renew_ttl * 10)
                    assert [kw["name"] for kw in lost] == [name]
                    assert held.lease.lost
                    assert not held.locked()
            assert len(rec.of(lock_lost)) == 1  # reported once

    # -- signals ----------------------------------------------------------

    def test_signals(self, name):
        with Recorder(lock_acquired, lock_released, lock_contended) as rec:
            with lock(name) as held:
                token = held.fencing_token
                lock(name, timeout=0).acquire()
        (acq,) = rec.of(lock_acquired)
        assert acq["alias"] == "default" and acq["name"] == name
        assert acq["lease"].fencing_token == token and acq["wait"] >= 0
        (rel,) = rec.of(lock_released)
        assert rel["name"] == name and rel["held"] >= 0
        (con,) = rec.of(lock_contended)
        assert con["name"] == name and con["lease"] is None and con["timeout"] == 0

    # -- waiting ----------------------------------------------------------

    def test_waiter_woken_promptly_by_release(self, name):
        holder = lock(name, ttl=30)
        holder.acquire()
        got = []

        def wait():
            with lock(name, timeout=30, ttl=30):
                got.append(time.monotonic())

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.3)  # the waiter is blocked by now
        assert not got
        released = time.monotonic()
        holder.release()
        t.join(30)
        assert got, "the waiter never got the lock"
        # The API promises well under 100 ms; a loaded CI box gets slack.
        assert got[0] - released < 1.0

    def test_threads_exclude_each_other(self, name):
        state = {"inside": 0, "max": 0, "count": 0}

        def work():
            for _ in range(5):
                with lock(name, timeout=30):
                    state["inside"] += 1
                    state["max"] = max(state["max"], state["inside"])
                    time.sleep(0.002)
                    state["count"] += 1
                    state["inside"] -= 1

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert state == {"inside": 0, "max": 1, "count": 20}

    # -- listing and clearing ---------------------------------------------

    def test_holders(self, name):
        with lock(name) as held:
            (h,) = [h for h in self.backend.holders() if h.name == name]
            assert h.backend == "default"
            assert h.host == socket.gethostname()
            assert h.pid == os.getpid()
            assert threading.current_thread().name in h.thread
            assert h.fencing_token == held.fencing_token
            assert h.token == held.lease.token
            assert (
                h.expires_at is None
                or h.acquired_at is None
                or (h.expires_at >= h.acquired_at)
            )
        assert [h for h in self.backend.holders() if h.name == name] == []

    def test_holders_prefix_is_literal(self, name):
        base = f"{name}/p"
        names = [base + "*a", base + "Xa", base + "?", base + "[x]", base + "\\"]
        held = [lock(n) for n in names]
        for h in held:
            assert h.acquire()
        try:

            def listed(prefix):
                return sorted(h.name for h in self.backend.holders(prefix))

            assert listed(base + "*") == [base + "*a"]
            assert listed(base + "?") == [base + "?"]
            assert listed(base + "[") == [base + "[x]"]
            assert listed(base + "\\") == [base + "\\"]
            assert listed(base) == sorted(names)
        finally:
            for h in held:
                h.release()

    def test_clear_stale_never_removes_a_live_lease(self, name):
        expired = lock(name + "-expired", ttl=self.ttl, auto_renew=False)
        expired.acquire()
        with lock(name, ttl=30) as live:
            time.sleep(self.ttl * 2)
            removed = self.backend.clear_stale()
            assert isinstance(removed, int) and removed >= 0
            assert live.locked()
            assert lock(name, timeout=0).acquire() is False
            assert [h.name for h in self.backend.holders(name)] == [name]

    # -- asyncio ----------------------------------------------------------

    def test_async_twins(self, name):
        async def scenario():
            async with lock(name) as held:
                assert await held.alocked()
                assert not await lock(name, timeout=0).aacquire()
                await held.aextend(10)
                token = held.fencing_token
            assert not await held.alocked()
            other = lock(name, timeout=0)
            assert await other.aacquire()
            assert other.fencing_token > token
            await other.arelease()
            with pytest.raises(LockNotHeld):
                await other.arelease()

        asyncio.run(scenario())

    def test_async_contention_and_loss(self, name):
        async def scenario():
            async with lock(name):
                with pytest.raises(LockNotAcquired):
                    async with lock(name, timeout=0.2):
                        pass  # pragma: no cover
            with pytest.raises(LockLost):
                async with lock(name, ttl=self.ttl, auto_renew=False):
                    await asyncio.sleep(self.ttl * 2)
                    newer = lock(name, timeout=10)
                    assert await newer.aacquire()
                    await newer.arelease()

        asyncio.run(scenario())

    def test_async_waiter_woken_by_release_from_another_task(self, name):
        async def scenario():
            loop = asyncio.get_running_loop()
            holder = lock(name)
            assert await holder.aacquire()

            async def waiter():
                async with lock(name, timeout=20):
                    return loop.time()

            task = asyncio.create_task(waiter())
            await asyncio.sleep(0.3)
            assert not task.done()
            released = loop.time()
            await holder.arelease()  # must not queue behind the waiter
            return await task - released

        assert asyncio.run(scenario()) < 2.0

    def test_async_auto_renew(self, name):
        async def scenario():
            async with lock(name, ttl=self.renew_ttl) as held:
                await asyncio.sleep(self.renew_ttl * 3)
                assert await held.alocked()

        asyncio.run(scenario())

    # -- across processes -------------------------------------------------

    def test_processes_exclude_each_other(self, name, tmp_path):
        self._need_processes()
        counter = tmp_path / "counter"
        counter.write_text("0")
        per_process = 15
        results = run_in_processes(
            workers.counter_worker,
            [(name, str(counter), per_process, 10.0) for _ in range(4)],
        )
        intervals = sorted(iv for r in results for iv in r)
        assert int(counter.read_text()) == 4 * per_process
        assert len(intervals) == 4 * per_process
        assert len({pid for _, _, pid in intervals}) == 4
        overlaps = sum(1 for a, b in zip(intervals, intervals[1:]) if b[0] < a[1])
        assert overlaps == 0

    def test_other_process_excluded_while_held(self, name):
        self._need_processes()
        with lock(name, ttl=30) as held:
            mine = held.fencing_token
            (result,) = run_in_processes(workers.try_acquire, [(name, 0.3)])
            assert result is None
            assert held.locked()
        (result,) = run_in_processes(workers.try_acquire, [(name, 5.0)])
        assert result is not None and result > mine

    def test_process_waits_for_another_process(self, name, tmp_path):
        self._need_processes()
        ready = tmp_path / "ready"
        proc = start_process(workers.hold_for, name, 1.0, str(ready))
        try:
            deadline = time.monotonic() + 60
            while not ready.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert ready.exists(), "the worker never took the lock"
            theirs = int(ready.read_text())
            assert lock(name, timeout=0).acquire() is False
            with lock(name, timeout=30) as mine:
                assert mine.fencing_token > theirs
        finally:
            proc.join(30)
        assert proc.exitcode == 0

    def test_takeover_by_another_process_after_expiry(self, name):
        self._need_processes()
        old = lock(name, ttl=self.ttl, auto_renew=False)
        assert old.acquire()
        (token,) = run_in_processes(workers.try_acquire, [(name, 10.0)])
        assert token is not None and token > old.fencing_token
        with pytest.raises(LockLost):
            old.release()


class DatabaseContract(LockBackendContract):
    """The contract, with renewal given the slack a commit needs.

    A renewal is a durable commit, and the matrix runs three cells at once on
    two cores, each committing to the same disk: a renewal every third of a
    1 s lease (the default ``renew_ttl``) was once late by two thirds of it.
    """

    renew_ttl = 2.0
