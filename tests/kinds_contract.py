"""Shared locks and semaphores, as one test class every backend runs.

Like :mod:`tests.contract`: a backend's test class subclasses
:class:`LockKindsContract` and provides a ``locks_setting`` fixture whose
``"default"`` alias is the backend under test. ``permits = False`` marks a
backend that offers shared locks but no semaphores (Redlock): the tests
check that it refuses them instead.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest
from django.test import override_settings

from django_distlock import LockNotAcquired, lock, locks, semaphore

from . import kinds_workers
from .procs import run_in_processes

__all__ = ["LockKindsContract", "max_overlap"]


def max_overlap(intervals) -> int:
    """Return the largest number of intervals open at one instant."""
    events = sorted(
        [(start, 1) for start, _, *_ in intervals]
        + [(end, -1) for _, end, *_ in intervals],
        key=lambda e: (e[0], e[1]),
    )
    inside = most = 0
    for _, step in events:
        inside += step
        most = max(most, inside)
    return most


def _overlaps(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


class LockKindsContract:
    """What shared locks and semaphores promise; subclass with ``locks_setting``."""

    cross_process = True
    permits = True
    ttl = 0.5

    @pytest.fixture(autouse=True)
    def _kinds_locks(self, locks_setting):
        with override_settings(LOCKS=locks_setting):
            yield
        locks.reset()

    @pytest.fixture
    def name(self, request):
        return f"kinds:{request.node.name} [*?] {uuid.uuid4().hex[:8]}"

    @property
    def backend(self):
        return locks["default"]

    def _need_permits(self):
        if not self.permits:
            pytest.skip("this backend offers no semaphores")

    # -- shared locks -----------------------------------------------------

    def test_shared_holders_coexist_and_exclude_a_writer(self, name):
        a = lock(name, shared=True, timeout=0)
        b = lock(name, shared=True, timeout=0)
        assert a.acquire() and b.acquire()
        assert lock(name, timeout=0).acquire() is False
        a.release()
        assert lock(name, timeout=0).acquire() is False
        b.release()
        with lock(name, timeout=0):
            assert lock(name, shared=True, timeout=0).acquire() is False

    def test_writer_waiting_queues_new_readers(self, name):
        reader = lock(name, shared=True, timeout=0)
        assert reader.acquire()
        got = []
        writer = threading.Thread(
            target=lambda: got.append(lock(name, timeout=20, ttl=5).acquire())
        )
        writer.start()
        try:
            # Until the writer's request is queued, a reader may still get in.
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                late = lock(name, shared=True, timeout=0)
                if not late.acquire():
                    break
                late.release()
                time.sleep(0.05)
            else:
                pytest.fail("new readers kept getting in past a queued writer")
        finally:
            reader.release()
            writer.join(30)
        assert got == [True]

    def test_fencing_tokens_order_readers_and_writers(self, name):
        with lock(name) as first:
            before = first.fencing_token
        with lock(name, shared=True) as reader:
            shared_token = reader.fencing_token
            assert isinstance(shared_token, int)
            assert shared_token >= before
        with lock(name) as writer:
            assert writer.fencing_token > before
            assert writer.fencing_token >= shared_token

    def test_each_reader_has_its_own_lease(self, name):
        a = lock(name, shared=True, timeout=0)
        b = lock(name, shared=True, timeout=0)
        assert a.acquire() and b.acquire()
        try:
            a.extend(5)
            listed = [h for h in self.backend.holders(prefix=name) if h.name == name]
            assert sorted(h.kind.mode for h in listed) == ["shared", "shared"]
            assert {h.token for h in listed} == {a.lease.token, b.lease.token}
            assert self.backend.force_release(name, a.lease.token, a.lease.kind)
            assert not a.locked()
            assert b.locked()
        finally:
            b.release()

    def test_async_readers(self, name):
        async def main():
            async with lock(name, shared=True, timeout=0) as a:
                async with lock(name, shared=True, timeout=0) as b:
                    assert a.lease.token != b.lease.token
                    assert await lock(name, timeout=0).aacquire() is False
            async with lock(name, timeout=0):
                pass

        asyncio.run(main())

    # -- semaphores -------------------------------------------------------

    def test_semaphore_admits_limit_holders(self, name):
        self._need_permits()
        a, b = semaphore(name, 2, timeout=0), semaphore(name, 2, timeout=0)
        assert a.acquire() and b.acquire()
        third = semaphore(name, 2, timeout=0)
        assert third.acquire() is False
        with pytest.raises(LockNotAcquired):
            with semaphore(name, 2, timeout=0):
                pass  # pragma: no cover
        a.release()
        assert third.acquire()
        listed = [h for h in self.backend.holders(prefix=name) if h.name == name]
        assert sorted(h.kind.mode for h in listed) == ["permit", "permit"]
        assert {h.kind.limit for h in listed} == {2}
        third.release()
        b.release()

    def test_semaphore_limit_mismatch_is_an_error(self, name):
        self._need_permits()
        with semaphore(name, 2, timeout=0):
            with pytest.raises(ValueError) as info:
                semaphore(name, 3, timeout=0).acquire()
        # Every backend says it the same way.
        assert str(info.value) == (
            f"Semaphore {name!r} is held with a limit of 2 permits, not 3: "
            "every holder must pass the same limit."
        )

    def test_semaphore_lives_apart_from_the_lock(self, name):
        self._need_permits()
        with semaphore(name, 1, timeout=0):
            with lock(name, timeout=0):
                pass

    def test_release_wakes_a_waiting_permit(self, name):
        self._need_permits()
        first = semaphore(name, 1, timeout=0)
        assert first.acquire()
        got = []
        waiter = threading.Thread(
            target=lambda: got.append(semaphore(name, 1, timeout=20).acquire())
        )
        waiter.start()
        time.sleep(0.2)
        first.release()
        waiter.join(30)
        assert got == [True]

    def test_a_dead_holders_permit_comes_back_after_its_ttl(self, name):
        self._need_permits()
        abandoned = semaphore(name, 1, ttl=self.ttl, auto_renew=False, timeout=0)
        assert abandoned.acquire()
        # Never released: as if its process had died.
        with semaphore(name, 1, timeout=self.ttl * 20):
            pass

    def test_async_semaphore(self, name):
        self._need_permits()

        async def main():
            async with semaphore(name, 1, timeout=0):
                assert await semaphore(name, 1, timeout=0).aacquire() is False
            async with semaphore(name, 1, timeout=0):
                pass

        asyncio.run(main())

    def test_semaphore_refused_where_not_offered(self, name):
        if self.permits:
            pytest.skip("this backend offers semaphores")
        with pytest.raises(Exception, match="(?i)semaphore|permit"):
            semaphore(name, 2, timeout=0).acquire()

    # -- across processes -------------------------------------------------

    def _run(self, name, plan, hold=0.05, rounds=4):
        if not self.cross_process:
            pytest.skip("this backend does not share locks between processes")
        start_at = time.monotonic() + 3.0
        results = run_in_processes(
            kinds_workers.hold_kind,
            [(name, mode, limit, rounds, hold, start_at) for mode, limit in plan],
            timeout=240,
        )
        return [i for r in results for i in r]

    def test_readers_overlap_and_never_meet_a_writer_across_processes(self, name):
        plan = [("shared", 0)] * 6 + [("exclusive", 0)] * 2
        intervals = self._run(name, plan, hold=0.1, rounds=3)
        readers = [i for i in intervals if i[2] == "shared"]
        writers = [i for i in intervals if i[2] == "exclusive"]
        assert len(readers) == 18 and len(writers) == 6
        assert max_overlap(readers) >= 2  # readers really shared the lock
        for w in writers:
            assert not any(_overlaps(w, other) for other in intervals if other is not w)

    def test_limit_three_never_has_four_inside_across_processes(self, name):
        self._need_permits()
        intervals = self._run(name, [("permit", 3)] * 8, hold=0.05, rounds=4)
        assert len(intervals) == 32
        assert 2 <= max_overlap(intervals) <= 3
