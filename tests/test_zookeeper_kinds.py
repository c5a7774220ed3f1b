"""Shared locks and semaphore permits on the ZooKeeper backend (real server).

The backend is driven directly (``acquire(name, ttl, timeout, kind)``): these
tests pin the backend's half of the kinds contract, whatever the lock
handle above it does.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest
from django.test import override_settings

from django_distlock import locks
from django_distlock.backends.kinds import EXCLUSIVE, SHARED, Kind, permit
from django_distlock.backends.zookeeper.nodes import node_data
from tests import zookeeper_kinds_workers as kw
from tests.cluster_servers import ZooKeeperServer, wait_until
from tests.procs import run_in_processes, start_process
from tests.test_zookeeper import zk_locks


@pytest.fixture(scope="module")
def zookeeper():
    server = ZooKeeperServer().start()
    yield server
    server.stop()


@pytest.fixture
def backend(zookeeper):
    with override_settings(LOCKS=zk_locks(zookeeper.hosts)):
        yield locks["default"]
    locks.reset()


def unique(what: str) -> str:
    return f"{what}:{uuid.uuid4().hex}"


def in_thread(func, *args):
    """Run ``func(*args)`` in a thread; return (thread, results list)."""
    results: list = []
    thread = threading.Thread(target=lambda: results.append(func(*args)))
    thread.start()
    return thread, results


def queue_length(backend, directory: str) -> int:
    return len(backend.client.get_children(directory))


class TestShared:
    def test_declared(self, backend):
        assert backend.kinds == {"exclusive", "shared", "permit"}

    def test_shared_leases_coexist_and_exclude_exclusive(self, backend):
        name = unique("rw")
        first = backend.acquire(name, 30, 0, SHARED)
        second = backend.acquire(name, 30, 0, SHARED)
        assert first is not None and second is not None
        assert first.kind == SHARED and second.kind == SHARED
        assert first.token != second.token
        assert backend.acquire(name, 30, 0) is None
        assert backend.release(first)
        assert backend.acquire(name, 30, 0.2) is None  # the second still reads
        assert backend.release(second)
        writer = backend.acquire(name, 30, 0)
        assert writer is not None and writer.kind == EXCLUSIVE
        assert backend.acquire(name, 30, 0, SHARED) is None
        assert backend.release(writer)

    def test_writer_preference(self, backend):
        name = unique("pref")
        reader = backend.acquire(name, 30, 0, SHARED)
        writer_thread, writer = in_thread(backend.acquire, name, 30, 60)
        wait_until(lambda: queue_length(backend, backend._dir(name)) == 2, 30, "queue")
        # A reader arriving after the queued writer waits behind it.
        assert backend.acquire(name, 30, 0.3, SHARED) is None
        late_thread, late = in_thread(backend.acquire, name, 30, 60, SHARED)
        wait_until(lambda: queue_length(backend, backend._dir(name)) == 3, 30, "queue")
        assert backend.release(reader)
        writer_thread.join(60)
        assert writer[0] is not None
        assert late == []  # still behind the writer
        assert backend.is_held(writer[0])
        assert backend.release(writer[0])
        late_thread.join(60)
        assert late[0] is not None and late[0].kind == SHARED
        assert late[0].fencing_token > writer[0].fencing_token
        assert backend.release(late[0])

    def test_dead_waiter_cannot_block_readers(self, backend):
        """A queued writer that stops rewriting its node is passed after its window."""
        name = unique("deadwaiter")
        reader = backend.acquire(name, 30, 0, SHARED)
        # A writer's node whose owner will never touch it again (its session
        # lives on: only the node's window can end it).
        directory = backend._dir(name)
        backend.client.create(
            f"{directory}/ghost-", node_data("w", 500), ephemeral=True, sequence=True
        )
        second = backend.acquire(name, 30, 30, SHARED)
        assert second is not None
        assert sorted(c.split("-")[0] for c in backend.client.get_children(directory))
        assert not any(
            c.startswith("ghost-") for c in backend.client.get_children(directory)
        )
        backend.release(reader)
        backend.release(second)

    def test_each_shared_holder_has_its_own_lease(self, backend):
        name = unique("own")
        a = backend.acquire(name, 30, 0, SHARED)
        b = backend.acquire(name, 0.5, 0, SHARED)
        c = backend.acquire(name, 30, 0, SHARED)
        assert backend.extend(a, 60)
        assert a.remaining() > 50
        assert backend.force_release(name, c.token, SHARED)
        assert not backend.is_held(c)
        assert backend.is_held(a)
        time.sleep(0.6)  # b's ttl ends; nobody renewed it
        assert not backend.is_held(b)
        assert not backend.extend(b, 30)
        assert backend.is_held(a)
        assert backend.renew([a]) == [True]
        # A writer is let in once a alone is released: b and c are gone.
        assert backend.release(a)
        writer = backend.acquire(name, 30, 5)
        assert writer is not None
        assert backend.release(writer)

    def test_expired_shared_holder_lets_a_writer_in(self, backend):
        name = unique("ttl")
        backend.acquire(name, 0.5, 0, SHARED)  # never renewed, never released
        writer = backend.acquire(name, 30, 30)
        assert writer is not None
        backend.release(writer)

    def test_fencing(self, backend):
        name = unique("fence")
        w1 = backend.acquire(name, 30, 0)
        backend.release(w1)
        r1 = backend.acquire(name, 30, 0, SHARED)
        r2 = backend.acquire(name, 30, 0, SHARED)
        assert w1.fencing_token < r1.fencing_token
        backend.release(r1)
        backend.release(r2)
        w2 = backend.acquire(name, 30, 0)
        assert w2.fencing_token > max(
            w1.fencing_token, r1.fencing_token, r2.fencing_token
        )
        backend.release(w2)

    def test_listing_and_holder_of(self, backend):
        name = unique("list")
        a = backend.acquire(name, 30, 0, SHARED)
        b = backend.acquire(name, 60, 0, SHARED)
        listed = [h for h in backend.holders(name) if h.name == name]
        assert {h.token for h in listed} == {a.token, b.token}
        assert {h.kind for h in listed} == {SHARED}
        assert {h.fencing_token for h in listed} == {a.fencing_token, b.fencing_token}
        assert backend.holder_of(name, SHARED) is None  # nothing keeps readers out
        assert backend.holder_of(name, EXCLUSIVE).token == a.token  # expires first
        backend.release(a)
        backend.release(b)
        w = backend.acquire(name, 30, 0)
        assert backend.holder_of(name, SHARED).token == w.token
        assert backend.holder_of(name, SHARED).kind == EXCLUSIVE
        backend.release(w)
        assert backend.holder_of(name) is None

    def test_async_through_the_thread_path(self, backend):
        name = unique("async")

        async def main():
            a = await backend.aacquire(name, 30, 0, SHARED)
            b = await backend.aacquire(name, 30, 0, SHARED)
            busy = await backend.aacquire(name, 30, 0)
            assert await backend.arelease(a)
            assert await backend.arelease(b)
            return a, b, busy

        a, b, busy = asyncio.run(main())
        assert a.kind == SHARED and b.kind == SHARED and busy is None


class TestPermits:
    def test_limit_and_release(self, backend):
        name = unique("sem")
        three = [backend.acquire(name, 30, 0, permit(3)) for _ in range(3)]
        assert all(p is not None and p.kind == permit(3) for p in three)
        assert len({p.fencing_token for p in three}) == 3
        assert backend.acquire(name, 30, 0, permit(3)) is None
        assert backend.release(three[0])
        fourth = backend.acquire(name, 30, 0, permit(3))
        assert fourth is not None
        assert fourth.fencing_token > max(p.fencing_token for p in three)
        for p in [*three[1:], fourth]:
            assert backend.release(p)

    def test_apart_from_locks(self, backend):
        name = unique("apart")
        p = backend.acquire(name, 30, 0, permit(1))
        lock = backend.acquire(name, 30, 0)
        assert p is not None and lock is not None
        assert backend.acquire(name, 30, 0, permit(1)) is None
        assert backend.acquire(name, 30, 0, SHARED) is None
        listed = {h.kind for h in backend.holders(name) if h.name == name}
        assert listed == {permit(1), EXCLUSIVE}
        assert backend.holder_of(name, permit(1)).token == p.token
        assert backend.holder_of(name).token == lock.token
        # force_release of the lock's token as a permit touches nothing.
        assert not backend.force_release(name, lock.token, permit(1))
        assert backend.force_release(name, p.token, permit(1))
        assert backend.is_held(lock)
        assert backend.acquire(name, 30, 0, permit(1)) is not None
        backend.release(lock)

    def test_limit_mismatch(self, backend):
        name = unique("mismatch")
        p = backend.acquire(name, 30, 0, permit(2))
        same = "limit of 2 permits, not 3: every holder must pass the same limit"
        with pytest.raises(ValueError, match=f"Semaphore .*mismatch.* {same}"):
            backend.acquire(name, 30, 0, permit(3))
        with pytest.raises(ValueError):
            backend.acquire(name, 30, 5, permit(1))
        # The refused attempts left nothing in the queue.
        assert queue_length(backend, backend._sem_dir(name)) == 1
        assert backend.acquire(name, 30, 0, permit(2)) is not None  # same limit: fine
        backend.force_release_many(
            [(name, h.token, h.kind) for h in backend.holders(name)]
        )
        # Nothing live any more: a new limit is taken.
        assert not backend.is_held(p)
        q = backend.acquire(name, 30, 0, permit(5))
        assert q is not None and q.kind == permit(5)
        backend.release(q)

    def test_limit_below_one(self, backend):
        with pytest.raises(ValueError, match="at least 1"):
            backend.acquire(unique("zero"), 30, 0, permit(0))

    def test_fifo_and_woken(self, backend):
        name = unique("fifo")
        directory = backend._sem_dir(name)
        held = [backend.acquire(name, 30, 0, permit(2)) for _ in range(2)]
        order: list[int] = []
        leases: list = []

        def wait(i: int) -> None:
            lease = backend.acquire(name, 30, 60, permit(2))
            leases.append(lease)
            order.append(i)

        threads = []
        for i in range(4):
            t = threading.Thread(target=wait, args=(i,))
            t.start()
            threads.append(t)
            wait_until(lambda i=i: queue_length(backend, directory) == 3 + i, 30, "q")
        # One permit given back at a time: exactly the oldest waiter gets it
        # (two released together would wake two waiters at once, and their
        # threads would then record them in either order).
        for i, lease in enumerate([*held, None, None]):
            if lease is None:
                lease = leases[i - 2]
            backend.release(lease)
            wait_until(lambda i=i: len(order) == i + 1, 30, f"waiter {i}")
            assert order == list(range(i + 1))
        for t in threads:
            t.join(60)
        for lease in leases[2:]:
            backend.release(lease)

    def test_expired_permit_comes_back(self, backend):
        name = unique("ttl")
        backend.acquire(name, 0.5, 0, permit(1))  # never renewed, never released
        again = backend.acquire(name, 30, 30, permit(1))
        assert again is not None
        listed = [h for h in backend.holders(name) if h.name == name]
        assert [h.token for h in listed] == [again.token]
        backend.release(again)

    def test_holder_of_is_the_first_to_expire(self, backend):
        name = unique("first")
        late = backend.acquire(name, 60, 0, permit(2))
        soon = backend.acquire(name, 20, 0, permit(2))
        holder = backend.holder_of(name, permit(2))
        assert holder.token == soon.token
        assert holder.kind == permit(2)
        assert holder.kind == Kind("permit", 2)
        backend.release(late)
        backend.release(soon)


# -- the proof with real processes -------------------------------------------


def _overlaps(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_readers_overlap_writers_alone_in_8_processes(zookeeper, tmp_path):
    name = unique("procs-rw")
    roles = ["exclusive"] * 2 + ["shared"] * 6
    with override_settings(LOCKS=zk_locks(zookeeper.hosts)):
        results = run_in_processes(
            kw.hold_repeatedly,
            [(name, mode, None, 4, 0.05, str(tmp_path), 8) for mode in roles],
            timeout=300,
        )
    intervals = [i for worker in results for i in worker]
    assert len(intervals) == 32
    writes = [i for i in intervals if i[3] == "exclusive"]
    reads = [i for i in intervals if i[3] == "shared"]
    for w in writes:
        assert not [o for o in intervals if o is not w and _overlaps(w, o)], w
    assert any(
        _overlaps(a, b) for a in reads for b in reads if a is not b and a[2] != b[2]
    )


def test_limit_3_never_exceeded_in_8_processes(zookeeper, tmp_path):
    name = unique("procs-sem")
    with override_settings(LOCKS=zk_locks(zookeeper.hosts)):
        results = run_in_processes(
            kw.hold_repeatedly,
            [(name, "permit", 3, 4, 0.05, str(tmp_path), 8) for _ in range(8)],
            timeout=300,
        )
    intervals = [i for worker in results for i in worker]
    assert len(intervals) == 32
    events = sorted(
        [(start, 1) for start, *_ in intervals]
        + [(end, -1) for _, end, *_ in intervals],
        key=lambda e: (e[0], e[1]),  # an end before a start at the same instant
    )
    live = most = 0
    for _, step in events:
        live += step
        most = max(most, live)
    assert 2 <= most <= 3


@pytest.mark.parametrize("mode", ["permit", "shared"])
def test_sigkilled_holder_comes_back(zookeeper, tmp_path, mode):
    """A SIGKILLed holder with a long ttl: its session ends, its share returns."""
    name = unique(f"kill-{mode}")
    ready = tmp_path / "ready"
    limit = 2 if mode == "permit" else None
    setting = zk_locks(zookeeper.hosts, SESSION_TIMEOUT=1.5)
    with override_settings(LOCKS=setting):
        proc = start_process(kw.hold_kind, name, mode, limit, 300.0, str(ready), 300.0)
        try:
            backend = locks["default"]
            wait_until(ready.exists, 120, "the worker to take its share")
            theirs = int(ready.read_text())
            if mode == "permit":
                mine = backend.acquire(name, 30, 0, permit(2))
                assert backend.acquire(name, 30, 0, permit(2)) is None
                want = permit(2)
            else:
                mine = None
                want = EXCLUSIVE
            assert backend.acquire(name, 30, 0, want) is None
            proc.kill()
            proc.join(30)
            back = backend.acquire(name, 300, 60, want)
            assert back is not None
            assert back.fencing_token > theirs
            for lease in (mine, back):
                if lease is not None:
                    backend.release(lease)
        finally:
            if proc.is_alive():
                proc.kill()
                proc.join(30)
            locks.reset()
