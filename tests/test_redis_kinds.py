"""Shared locks and semaphore permits on the Redis backend (real servers).

The semantics run on one redis-server, on a Redis Cluster and through Redis
Sentinel (:class:`KindsContract`, one subclass per set-up); the asyncio
twins and the cross-process proofs (8 spawned processes) run on one server.
The backend is called directly: ``backend.acquire(name, ttl, timeout, kind)``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid

import pytest
from django.test import override_settings

from django_distlock import locks
from django_distlock.backends.base import EXCLUSIVE, SHARED, Kind, permit
from django_distlock.backends.redis import (
    LockKeys,
    RedisLockBackend,
    ReentrantRedisLockBackend,
)
from django_distlock.backends.redis.keys import ACQUIRE
from django_distlock.backends.redis.sharing import (
    MARK,
    SHARED_RELEASE,
    SemaphoreKeys,
    SharedKeys,
    holder_keys,
)

from . import kinds_workers
from .cluster_servers import RedisCluster
from .conftest import redis_locks
from .procs import run_in_processes, start_process

pytestmark = pytest.mark.redis

TTL = 30.0


def _thread(func, *args):
    """Run ``func(*args)`` in a thread; return it and a list for the result."""
    result: list = []

    def target():
        try:
            result.append(func(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            result.append(e)

    t = threading.Thread(target=target)
    t.start()
    return t, result


def _wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.01)


def _queued(backend: RedisLockBackend, name: str, semaphore: bool = False) -> int:
    """Return how many waiters are queued for ``name`` (lock or semaphore)."""
    keys = LockKeys(backend.key_prefix, name)
    queue = SemaphoreKeys(keys).five[1] if semaphore else keys.queue
    return backend.client.llen(queue)


class KindsContract:
    """Shared leases and permits; subclasses provide ``backend``."""

    @pytest.fixture
    def name(self, request):
        return f"kinds:{request.node.name} [*?] {uuid.uuid4().hex[:8]}"

    # -- shared ---------------------------------------------------------------

    def test_declared_kinds(self, backend, name):
        assert backend.kinds == {"exclusive", "shared", "permit"}
        assert ReentrantRedisLockBackend.kinds == {"exclusive"}
        reentrant = ReentrantRedisLockBackend("r", backend.params)
        try:
            with pytest.raises(ValueError, match="does not offer shared"):
                reentrant.acquire(name, TTL, 0, SHARED)
        finally:
            reentrant.close()
        with pytest.raises(ValueError, match="positive int"):
            backend.acquire(name, TTL, 0, permit(0))

    def test_shared_holders_coexist_and_exclude_exclusive(self, backend, name):
        a = backend.acquire(name, TTL, 0, SHARED)
        b = backend.acquire(name, TTL, 0, SHARED)
        assert a is not None and b is not None
        assert a.kind == SHARED and a.token != b.token
        assert backend.acquire(name, TTL, 0) is None
        assert backend.release(a)
        assert backend.acquire(name, TTL, 0) is None
        assert backend.release(b)
        x = backend.acquire(name, TTL, 0)
        assert x is not None and x.fencing_token > b.fencing_token
        assert backend.acquire(name, TTL, 0, SHARED) is None
        assert backend.holder_of(name, SHARED).token == x.token
        assert backend.release(x)

    def test_exclusive_waiter_gets_lock_when_last_reader_leaves(self, backend, name):
        a = backend.acquire(name, TTL, 0, SHARED)
        t, got = _thread(backend.acquire, name, TTL, 10)
        _wait_until(lambda: _queued(backend, name) == 1)
        assert backend.holder_of(name).kind == SHARED
        assert backend.release(a)
        t.join()
        assert got[0] is not None and got[0].fencing_token > a.fencing_token
        assert backend.release(got[0])

    def test_writer_preference(self, backend, name):
        reader = backend.acquire(name, TTL, 0, SHARED)
        writer_thread, writer = _thread(backend.acquire, name, TTL, 10)
        _wait_until(lambda: _queued(backend, name) == 1)
        # A queued writer holds new readers back, even with a reader inside.
        assert backend.acquire(name, TTL, 0, SHARED) is None
        assert backend.holder_of(name, SHARED) is None
        late_thread, late = _thread(backend.acquire, name, TTL, 10, SHARED)
        _wait_until(lambda: _queued(backend, name) == 2)
        assert backend.release(reader)
        writer_thread.join()
        assert writer[0] is not None
        time.sleep(0.1)
        assert late == []  # still behind the writer
        assert backend.release(writer[0])
        late_thread.join()
        assert late[0] is not None and late[0].kind == SHARED
        assert late[0].fencing_token >= writer[0].fencing_token
        assert backend.is_held(late[0])
        assert backend.release(late[0])

    def test_readers_queued_behind_a_writer_enter_together(self, backend, name):
        writer = backend.acquire(name, TTL, 0)
        threads = []
        for n in (1, 2, 3):
            threads.append(_thread(backend.acquire, name, TTL, 10, SHARED))
            _wait_until(lambda n=n: _queued(backend, name) == n)
        assert backend.release(writer)
        for t, _ in threads:
            t.join()
        readers = [got[0] for _, got in threads]
        assert all(r is not None and backend.is_held(r) for r in readers)
        assert len({r.fencing_token for r in readers}) == 1
        assert readers[0].fencing_token > writer.fencing_token
        assert _queued(backend, name) == 0
        listed = {h.token for h in backend.holders(name)}
        assert listed == {r.token for r in readers}
        for r in readers:
            assert backend.release(r)
        assert backend.acquire(name, TTL, 0) is not None

    def test_dead_writer_does_not_block_readers(self, backend, name):
        reader = backend.acquire(name, TTL, 0, SHARED)
        # A writer queued with a 200 ms record that never comes back.
        keys = backend.keys_for(name)
        args = ["deadwriter", 5000, name, "h", 1, "t", 200]
        assert backend._execute(("eval", ACQUIRE, keys.triple, args))[0] == 0
        assert backend.acquire(name, TTL, 0, SHARED) is None
        later = backend.acquire(name, TTL, 5, SHARED)
        assert later is not None
        assert backend.release(reader) and backend.release(later)

    def test_last_reader_admits_readers_left_behind_a_dead_writer(self, backend, name):
        reader = backend.acquire(name, TTL, 0, SHARED)
        keys = backend.keys_for(name)
        args = ["deadwriter", 5000, name, "h", 1, "t", 200]
        assert backend._execute(("eval", ACQUIRE, keys.triple, args))[0] == 0
        t, late = _thread(backend.acquire, name, TTL, 10, SHARED)
        _wait_until(lambda: _queued(backend, name) == 2)
        time.sleep(0.3)  # the writer's record lapses
        assert backend.release(reader)
        t.join()
        assert late[0] is not None and backend.is_held(late[0])
        assert backend.holder_of(name).token == late[0].token
        assert backend.release(late[0])

    def test_writer_first_after_the_readers_died(self, backend, name):
        backend.acquire(name, 0.3, 0, SHARED)  # never released: it dies
        # A queued writer (live for 10 s) that has not noticed the expiry yet.
        keys = backend.keys_for(name)
        args = ["writer", 5000, name, "h", 1, "t", 10_000]
        assert backend._execute(("eval", ACQUIRE, keys.triple, args))[0] == 0
        time.sleep(0.35)
        # A reader asking first hands the free lock to the writer.
        assert backend.acquire(name, TTL, 0, SHARED) is None
        assert backend.holder_of(name).token == "writer"
        assert backend.client.lrange(keys.wake_prefix + "writer", 0, -1) != []

    def test_listing_ignores_a_longer_key_prefix(self, backend, name):
        from django_distlock.keys import name_digest

        other = type(backend)(
            "other",
            {**backend.params, "KEY_PREFIX": f"distlock:{{{name_digest('x')}}}"},
        )
        try:
            s = other.acquire(name, TTL, 0, SHARED)
            p = other.acquire(name, TTL, 0, permit(2))
            assert {h.token for h in other.holders()} >= {s.token, p.token}
            mine = {h.token for h in backend.holders()}
            assert s.token not in mine and p.token not in mine
            assert other.release(s) and other.release(p)
        finally:
            other.close()

    def test_per_holder_release_extend_force_release(self, backend, name):
        a = backend.acquire(name, TTL, 0, SHARED)
        b = backend.acquire(name, TTL, 0, SHARED)
        c = backend.acquire(name, TTL, 0, SHARED)
        before = b.deadline
        assert backend.extend(b, 60)
        assert b.deadline > before
        assert backend.release(a)
        assert not backend.is_held(a) and backend.is_held(b)
        assert not backend.release(a) and not backend.extend(a, 5)
        assert not backend.force_release(name, c.token)  # not an exclusive lease
        assert backend.force_release(name, c.token, SHARED)
        assert not backend.is_held(c) and backend.is_held(b)
        listed = [h.token for h in backend.holders(name)]
        assert listed == [b.token]
        assert backend.release(b)
        assert list(backend.holders(name)) == []

    def test_dead_readers_lease_expires(self, backend, name):
        a = backend.acquire(name, 0.3, 0, SHARED)
        assert backend.acquire(name, TTL, 0) is None
        x = backend.acquire(name, TTL, 5)
        assert x is not None and x.fencing_token > a.fencing_token
        assert not backend.is_held(a) and not backend.extend(a, 5)
        assert backend.release(x)

    def test_fencing_order(self, backend, name):
        tokens = []
        for kind in (SHARED, EXCLUSIVE, SHARED, SHARED, EXCLUSIVE, EXCLUSIVE):
            lease = backend.acquire(name, TTL, 0, kind)
            tokens.append((kind, lease.fencing_token))
            assert backend.release(lease)
        for i, (kind, token) in enumerate(tokens):
            before = [t for _, t in tokens[:i]]
            if kind == EXCLUSIVE:
                assert all(token > t for t in before)
            later = [t for k, t in tokens[i + 1 :] if k == EXCLUSIVE]
            assert all(token < t for t in later)

    def test_renew_batches_every_kind(self, backend, name):
        leases = [
            backend.acquire(name, 5, 0),
            backend.acquire(name, 5, 0, permit(2)),
            backend.acquire(name + "!", 5, 0, SHARED),
        ]
        before = [le.deadline for le in leases]
        assert backend.renew(leases) == [True, True, True]
        assert all(le.deadline > d for le, d in zip(leases, before))
        for le in leases:
            assert backend.release(le)
        assert backend.renew(leases) == [False, False, False]

    # -- permits ------------------------------------------------------------

    def test_permits_up_to_the_limit(self, backend, name):
        held = [backend.acquire(name, TTL, 0, permit(3)) for _ in range(3)]
        assert all(h is not None and h.kind == permit(3) for h in held)
        assert len({h.token for h in held}) == 3
        fences = [h.fencing_token for h in held]
        assert fences == sorted(fences) and len(set(fences)) == 3
        assert backend.acquire(name, TTL, 0, permit(3)) is None
        first = backend.holder_of(name, permit(3))
        assert first.token in {h.token for h in held}
        assert first.kind == permit(3)
        assert backend.release(held[1])
        again = backend.acquire(name, TTL, 0, permit(3))
        assert again is not None and again.fencing_token > max(fences)
        for h in (held[0], held[2], again):
            assert backend.release(h)

    def test_limit_mismatch_raises(self, backend, name):
        held = backend.acquire(name, TTL, 0, permit(2))
        mismatch = "Semaphore .* limit of 2 permits, not 5"
        with pytest.raises(ValueError, match=mismatch) as e:
            backend.acquire(name, TTL, 0, permit(5))
        assert repr(name) in str(e.value)
        assert backend.release(held)
        other = backend.acquire(name, TTL, 0, permit(5))  # none live: new limit
        assert other is not None
        assert backend.release(other)

    def test_semaphore_and_lock_of_one_name_never_meet(self, backend, name):
        p = backend.acquire(name, TTL, 0, permit(1))
        x = backend.acquire(name, TTL, 0)
        assert p is not None and x is not None
        assert backend.acquire(name, TTL, 0, permit(1)) is None
        assert backend.holder_of(name).token == x.token
        assert backend.holder_of(name, permit(1)).token == p.token
        assert not backend.force_release(name, p.token)
        assert not backend.force_release(name, x.token, permit(1))
        assert backend.release(x)
        s = backend.acquire(name, TTL, 0, SHARED)
        assert s is not None and backend.is_held(p)
        assert backend.release(s) and backend.release(p)

    def test_fifo_wakeup(self, backend, name):
        first = backend.acquire(name, TTL, 0, permit(1))
        order: list[int] = []

        def waiter(i):
            lease = backend.acquire(name, TTL, 20, permit(1))
            order.append(i)
            time.sleep(0.02)
            backend.release(lease)

        threads = []
        for i in range(4):
            threads.append(threading.Thread(target=waiter, args=(i,)))
            threads[-1].start()
            _wait_until(lambda n=i + 1: _queued(backend, name, True) == n)
        assert backend.release(first)
        for t in threads:
            t.join()
        assert order == [0, 1, 2, 3]

    def test_dead_holders_permit_expires(self, backend, name):
        dead = backend.acquire(name, 0.3, 0, permit(1))
        lease = backend.acquire(name, TTL, 5, permit(1))
        assert lease is not None and not backend.is_held(dead)
        assert not backend.release(dead)
        assert backend.release(lease)

    @pytest.mark.parametrize("kind", [SHARED, permit(3)], ids=["shared", "permit"])
    def test_an_expired_holder_beside_the_last_live_one(self, backend, name, kind):
        # The release of the last live holder counts the live ones only,
        # and removes the expired one's entries with the keys; an expired
        # holder cannot release, and a new first holder is not held up.
        keys = holder_keys(LockKeys(backend.key_prefix, name), kind)
        dead = backend.acquire(name, 0.2, 0, kind)
        live = backend.acquire(name, TTL, 0, kind)
        time.sleep(0.3)
        assert [h.token for h in backend.holders(name)] == [live.token]
        assert backend.release(live)
        assert not backend.release(dead)
        assert backend.client.exists(*keys.five) == 0
        again = backend.acquire(name, TTL, 0, kind)
        assert again.fencing_token > live.fencing_token
        assert not backend.release(dead)
        assert backend.release(again)
        assert backend.client.exists(*keys.five) == 0

    def test_listing_and_clearing_kinds(self, backend, name):
        x = backend.acquire(name, TTL, 0)
        s1 = backend.acquire(name + ":r", TTL, 0, SHARED)
        s2 = backend.acquire(name + ":r", TTL, 0, SHARED)
        p = backend.acquire(name, TTL, 0, permit(4))
        listed = {h.token: h for h in backend.holders(name)}
        assert set(listed) == {x.token, s1.token, s2.token, p.token}
        assert MARK not in listed
        assert listed[x.token].kind == EXCLUSIVE
        assert listed[s1.token].kind == Kind("shared")
        assert listed[p.token].kind == permit(4)
        assert listed[p.token].fencing_token == p.fencing_token
        assert listed[s2.token].fencing_token == s2.fencing_token
        assert listed[s1.token].name == name + ":r"
        assert listed[p.token].expires_at is not None and listed[p.token].pid
        assert [h.token for h in backend.holders(name + ":r")] != []
        assert list(backend.holders(name + "#")) == []
        results = backend.force_release_many(
            [(name, x.token), (name + ":r", s1.token, SHARED), (name, p.token, p.kind)]
        )
        assert results == [True, True, True]
        assert {h.token for h in backend.holders(name)} == {s2.token}
        assert backend.release(s2)

    def test_clear_stale_removes_only_expired_holders(self, backend, name):
        live = backend.acquire(name, TTL, 0, permit(3))
        backend.acquire(name, 0.2, 0, permit(3))
        reader = backend.acquire(name, TTL, 0, SHARED)
        backend.acquire(name, 0.2, 0, SHARED)
        time.sleep(0.3)
        assert backend.clear_stale() >= 2
        assert backend.is_held(live) and backend.is_held(reader)
        assert {h.token for h in backend.holders(name)} == {live.token, reader.token}
        assert backend.release(live) and backend.release(reader)

    def test_key_layout_one_slot_per_name(self, backend, name):
        from redis.crc import key_slot

        keys = LockKeys(backend.key_prefix, name)
        shared, sem = SharedKeys(keys), SemaphoreKeys(keys)
        every = (*shared.five, shared.wake + "t", *sem.five, sem.wake + "t")
        assert len({key_slot(k.encode()) for k in every}) == 1
        assert not set(sem.five) & set(shared.five)

    def test_async_twins(self, backend, name):
        async def scenario():
            a = await backend.aacquire(name, TTL, 0, SHARED)
            b = await backend.aacquire(name, TTL, 0, SHARED)
            assert await backend.aacquire(name, TTL, 0) is None
            waiting = asyncio.ensure_future(backend.aacquire(name, TTL, 10))
            while _queued(backend, name) != 1:
                await asyncio.sleep(0.01)
            assert (await backend.aholder_of(name)).kind == SHARED
            assert await backend.aextend(a, 20) and await backend.ais_held(b)
            assert await backend.arenew([a, b]) == [True, True]
            assert await backend.arelease(a) and await backend.arelease(b)
            x = await waiting
            assert x is not None and x.fencing_token > a.fencing_token
            assert await backend.arelease(x)

            p = await backend.aacquire(name, TTL, 0, permit(1))
            assert (await backend.aholder_of(name, permit(1))).token == p.token
            assert await backend.aholder_of(name) is None
            assert await backend.aholder_of(name + "?", permit(1)) is None
            with pytest.raises(ValueError):
                await backend.aacquire(name, TTL, 0, permit(2))
            # A cancelled waiter leaves the queue: the permit is not handed
            # to a task that is gone.
            task = asyncio.ensure_future(backend.aacquire(name, TTL, 10, permit(1)))
            while _queued(backend, name, True) != 1:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert _queued(backend, name, True) == 0
            assert await backend.arelease(p)
            q = await backend.aacquire(name, TTL, 0, permit(1))
            assert q is not None
            assert await backend.arelease(q)

        asyncio.run(scenario())


# -- the set-ups ----------------------------------------------------------------


def _backend(params: dict):
    backend = RedisLockBackend("default", params)
    yield backend
    backend.close()


class TestSingleServer(KindsContract):
    """One redis-server."""

    @pytest.fixture
    def backend(self, redis_url):
        yield from _backend({"LOCATION": redis_url})

    def test_force_release_many_after_the_server_forgot_a_script(self, backend, name):
        # A pipeline whose calls partly meet NOSCRIPT makes only those calls
        # again: the others already ran, and a second release would find
        # nothing and report the holder gone.
        readers = [backend.acquire(name, TTL, 0, SHARED) for _ in range(2)]
        permits = [backend.acquire(name, TTL, 0, permit(2)) for _ in range(2)]
        backend.release(backend.acquire(name, TTL, 0, SHARED))
        backend.client.script_flush()
        backend.client.script_load(SHARED_RELEASE.source)
        items = [(name, lease.token, lease.kind) for lease in readers + permits]
        assert backend.force_release_many(items) == [True] * 4
        assert [h for h in backend.holders(name) if h.name == name] == []


@pytest.fixture(scope="module")
def redis_cluster():
    cluster = RedisCluster().start()
    yield cluster
    cluster.stop()


class TestCluster(KindsContract):
    """A Redis Cluster (3 primaries, 3 replicas): one slot per name."""

    @pytest.fixture
    def backend(self, redis_cluster):
        yield from _backend({"LOCATION": redis_cluster.url})


class TestSentinel(KindsContract):
    """The primary that Redis Sentinel names."""

    @pytest.fixture
    def backend(self, sentinel_setup):
        options = {"SENTINELS": sentinel_setup.sentinels}
        options["SERVICE_NAME"] = sentinel_setup.SERVICE
        yield from _backend({"OPTIONS": options})


# -- across processes -------------------------------------------------------


@pytest.fixture
def process_locks(redis_url):
    with override_settings(LOCKS=redis_locks(redis_url)):
        yield locks["default"]
    locks.reset()


def _max_inside(intervals) -> int:
    """Return the most critical sections that were ever open at once."""
    events = sorted(
        [(s, 1) for s, *_ in intervals] + [(e, -1) for _, e, *_ in intervals]
    )
    inside = most = 0
    for _, step in events:  # at equal instants an exit sorts first
        inside += step
        most = max(most, inside)
    return most


class TestAcrossProcesses:
    """Eight spawned processes on one redis-server."""

    def test_readers_overlap_and_never_meet_a_writer(self, process_locks, tmp_path):
        name = f"kinds:rw:{uuid.uuid4().hex[:8]}"
        barrier = tmp_path / "barrier"
        barrier.mkdir()
        jobs = [(name, "shared", None, 12, 0.02, str(barrier), 8)] * 6
        jobs += [(name, "exclusive", None, 6, 0.005, str(barrier), 8)] * 2
        results = run_in_processes(kinds_workers.kind_worker, jobs, timeout=300)
        intervals = sorted(iv for r in results for iv in r)
        assert len(intervals) == 6 * 12 + 2 * 6
        assert len({iv[2] for iv in intervals}) == 8
        writers = [iv for iv in intervals if iv[3] == "exclusive"]
        for w in writers:
            others = [iv for iv in intervals if iv is not w]
            assert not [o for o in others if o[0] < w[1] and w[0] < o[1]], w
        readers = [iv for iv in intervals if iv[3] == "shared"]
        overlapping = sum(
            1
            for i, a in enumerate(readers)
            for b in readers[i + 1 :]
            if b[0] < a[1] and a[2] != b[2]
        )
        assert overlapping > 0
        assert _max_inside(readers) >= 2

    def test_semaphore_never_admits_more_than_its_limit(self, process_locks, tmp_path):
        name = f"kinds:sem:{uuid.uuid4().hex[:8]}"
        barrier = tmp_path / "barrier"
        barrier.mkdir()
        jobs = [(name, "permit", 3, 10, 0.01, str(barrier), 8)] * 8
        results = run_in_processes(kinds_workers.kind_worker, jobs, timeout=300)
        intervals = [iv for r in results for iv in r]
        assert len(intervals) == 80
        most = _max_inside(intervals)
        assert 2 <= most <= 3

    def test_killed_holders_permit_comes_back_after_its_ttl(
        self, process_locks, tmp_path
    ):
        name = f"kinds:kill:{uuid.uuid4().hex[:8]}"
        ready = tmp_path / "ready"
        proc = start_process(
            kinds_workers.hold_permit_forever, name, 1, 1.5, str(ready)
        )
        try:
            _wait_until(ready.exists, 60)
            token = ready.read_text()
            backend = process_locks
            assert backend.holder_of(name, permit(1)).token == token
            assert backend.acquire(name, TTL, 0, permit(1)) is None
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(10)
            lease = backend.acquire(name, TTL, 10, permit(1))
            assert lease is not None
            assert [h.token for h in backend.holders(name)] == [lease.token]
            assert backend.release(lease)
        finally:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
                proc.join(10)


def test_clear_stale_command_removes_expired_permits(process_locks):
    """``manage.py locks clear --stale`` reaches the expired permits."""
    from io import StringIO

    from django.core.management import call_command

    backend = process_locks
    name = f"kinds:stale:{uuid.uuid4().hex[:8]}"
    live = backend.acquire(name, TTL, 0, permit(2))
    backend.acquire(name, 0.2, 0, permit(2))
    time.sleep(0.3)
    out = StringIO()
    call_command("locks", "clear", "--stale", "--noinput", stdout=out)
    assert "Cleared 1 stale lock(s)." in out.getvalue()
    assert [h.token for h in backend.holders(name)] == [live.token]
    assert backend.release(live)
