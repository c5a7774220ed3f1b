"""Kinds on Redlock: shared locks on a quorum, and no semaphores.

Shared locks carry Redlock's quorum argument over; semaphores do not (see
"Shared locks and semaphores" in docs/backends/redlock.md). Five real
redis-server processes; the backend is driven directly
(``acquire(name, ttl, timeout, kind)``).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest
from django.test import override_settings

from django_distlock import locks
from django_distlock.backends.kinds import EXCLUSIVE, SHARED, permit
from django_distlock.backends.redlock.steps import reader_keys
from tests import zookeeper_kinds_workers as kw
from tests.cluster_servers import wait_until
from tests.procs import run_in_processes
from tests.servers import RedisServer
from tests.test_redlock import backend_for, redlock_locks


def start_nodes():
    return [RedisServer().start() for _ in range(5)]


@pytest.fixture(scope="module")
def nodes():
    servers = start_nodes()
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
def fresh_nodes():
    """Five nodes of this test alone (it kills one)."""
    servers = start_nodes()
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
def backend(nodes):
    backend = backend_for(nodes)
    yield backend
    backend.close()


def unique(what: str) -> str:
    return f"{what}:{uuid.uuid4().hex}"


def in_thread(func, *args):
    results: list = []
    thread = threading.Thread(target=lambda: results.append(func(*args)))
    thread.start()
    return thread, results


def test_declares_exclusive_and_shared(backend):
    assert backend.kinds == {"exclusive", "shared"}


def test_no_semaphores(backend):
    name = unique("sem")
    with pytest.raises(ValueError, match="offers no semaphores"):
        backend.acquire(name, 30, 0, permit(2))
    lease = backend.acquire(name, 30, 0)
    assert backend.holder_of(name, permit(2)) is None
    assert backend.force_release(name, lease.token, permit(2)) is False
    assert backend.is_held(lease)
    backend.release(lease)


def test_shared_leases_coexist_and_exclude_exclusive(backend):
    name = unique("rw")
    a = backend.acquire(name, 30, 0, SHARED)
    b = backend.acquire(name, 30, 0, SHARED)
    assert a is not None and b is not None
    assert a.kind == SHARED and a.token != b.token
    assert backend.acquire(name, 30, 0) is None
    assert backend.release(a)
    assert not backend.is_held(a)
    assert backend.is_held(b)
    assert backend.acquire(name, 30, 0) is None
    assert backend.release(b)
    writer = backend.acquire(name, 30, 0)
    assert writer is not None
    assert backend.acquire(name, 30, 0, SHARED) is None
    assert backend.release(writer)
    assert not backend.release(b)  # released already


def registered(nodes, key: str) -> int:
    """How many nodes have a waiter registered under ``key``."""
    count = 0
    for node in nodes:
        client = node.client()
        count += client.zcard(key) > 0
        client.close()
    return count


def test_writer_preference_and_prompt_handover(backend, nodes):
    name = unique("pref")
    reader = backend.acquire(name, 30, 0, SHARED)
    writer_thread, writer = in_thread(backend.acquire, name, 30, 30)
    waiters = backend.keys_for(name)[2]
    wait_until(lambda: registered(nodes, waiters) == 5, 30, "the writer to queue")
    assert backend.acquire(name, 30, 0.3, SHARED) is None
    late_thread, late = in_thread(backend.acquire, name, 30, 30, SHARED)
    assert backend.release(reader)
    writer_thread.join(30)
    assert writer[0] is not None
    assert backend.is_held(writer[0])
    assert backend.release(writer[0])
    late_thread.join(30)
    assert late[0] is not None and late[0].kind == SHARED
    assert late[0].fencing_token <= writer[0].fencing_token
    backend.release(late[0])


def test_dead_writers_registration_expires(backend, nodes):
    """A writer registered as waiting that never comes back stops blocking."""
    name = unique("deadwriter")
    waiters = backend.keys_for(name)[2]
    for node in nodes:
        client = node.client()
        seconds, micros = client.time()
        client.zadd(waiters, {"ghost": seconds * 1000 + micros // 1000 + 500})
        client.close()
    assert backend.acquire(name, 30, 0, SHARED) is None
    reader = backend.acquire(name, 30, 10, SHARED)
    assert reader is not None
    backend.release(reader)


def test_each_reader_has_its_own_lease(backend):
    name = unique("own")
    a = backend.acquire(name, 30, 0, SHARED)
    b = backend.acquire(name, 0.5, 0, SHARED)
    c = backend.acquire(name, 30, 0, SHARED)
    assert backend.extend(a, 60)
    assert backend.renew([a, c]) == [True, True]
    assert backend.force_release(name, c.token, SHARED)
    assert not backend.is_held(c)
    time.sleep(0.6)  # b's ttl ends
    assert not backend.is_held(b)
    assert not backend.extend(b, 30)
    assert backend.is_held(a)
    assert backend.acquire(name, 30, 0) is None
    assert backend.release(a)
    writer = backend.acquire(name, 30, 0)  # b and c are gone
    assert writer is not None
    backend.release(writer)


def test_last_reader_expiring_frees_the_lock(backend, nodes):
    name = unique("expire")
    backend.acquire(name, 0.3, 0, SHARED)  # never renewed, never released
    writer = backend.acquire(name, 30, 10)
    assert writer is not None
    # The readers' records expire with their lease: nothing is left behind.
    keys = reader_keys(backend.keys_for(name)[0])

    def left() -> int:
        count = 0
        for node in nodes:
            client = node.client()
            count += client.exists(*keys)
            client.close()
        return count

    wait_until(lambda: left() == 0, 10, "the readers' records to expire")
    backend.release(writer)


def test_fencing(backend):
    name = unique("fence")
    w1 = backend.acquire(name, 30, 0)
    backend.release(w1)
    r1 = backend.acquire(name, 30, 0, SHARED)
    r2 = backend.acquire(name, 30, 0, SHARED)
    assert w1.fencing_token <= r1.fencing_token <= r2.fencing_token
    backend.release(r1)
    backend.release(r2)
    w2 = backend.acquire(name, 30, 0)
    assert w2.fencing_token > max(w1.fencing_token, r2.fencing_token)
    backend.release(w2)


def test_listing_and_holder_of(backend):
    name = unique("list")
    a = backend.acquire(name, 60, 0, SHARED)
    b = backend.acquire(name, 20, 0, SHARED)
    listed = [h for h in backend.holders(name) if h.name == name]
    assert {h.token for h in listed} == {a.token, b.token}
    assert {h.kind for h in listed} == {SHARED}
    assert backend.holder_of(name, SHARED) is None
    first = backend.holder_of(name, EXCLUSIVE)
    assert first.token == b.token and first.kind == SHARED
    assert backend.force_release_many([(name, h.token, h.kind) for h in listed]) == [
        True,
        True,
    ]
    writer = backend.acquire(name, 30, 0)
    assert backend.holder_of(name, SHARED).token == writer.token
    assert [h.kind for h in backend.holders(name) if h.name == name] == [EXCLUSIVE]
    backend.release(writer)
    assert backend.holder_of(name) is None


def test_async(backend):
    name = unique("async")

    async def main():
        a = await backend.aacquire(name, 30, 0, SHARED)
        b = await backend.aacquire(name, 30, 0, SHARED)
        busy = await backend.aacquire(name, 30, 0)
        shared_holder = await backend.aholder_of(name, EXCLUSIVE)
        assert await backend.ais_held(a)
        assert await backend.arelease(a)
        assert await backend.arelease(b)
        return a, b, busy, shared_holder

    a, b, busy, holder = asyncio.run(main())
    assert a.kind == SHARED and b.kind == SHARED and busy is None
    assert holder.kind == SHARED


def test_one_node_killed(fresh_nodes):
    backend = backend_for(fresh_nodes)
    try:
        name = unique("killed")
        a = backend.acquire(name, 30, 0, SHARED)
        fresh_nodes[0].kill()  # a's lease there is gone; 4 of 5 keep it
        assert backend.is_held(a)
        b = backend.acquire(name, 30, 0, SHARED)
        assert b is not None
        assert backend.acquire(name, 30, 0.3) is None
        assert backend.release(a) and backend.release(b)
        writer = backend.acquire(name, 30, 5)
        assert writer is not None
        assert backend.acquire(name, 30, 0.2, SHARED) is None
        backend.release(writer)
    finally:
        backend.close()


def _overlaps(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_readers_overlap_writers_alone_in_8_processes(fresh_nodes, tmp_path):
    """2 writers and 6 readers in 8 processes, on 5 nodes of which one is dead."""
    name = unique("procs-rw")
    fresh_nodes[4].kill()
    roles = ["exclusive"] * 2 + ["shared"] * 6
    with override_settings(LOCKS=redlock_locks(fresh_nodes)):
        try:
            results = run_in_processes(
                kw.hold_repeatedly,
                [(name, mode, None, 4, 0.05, str(tmp_path), 8) for mode in roles],
                timeout=300,
            )
        finally:
            locks.reset()
    intervals = [i for worker in results for i in worker]
    assert len(intervals) == 32
    for w in (i for i in intervals if i[3] == "exclusive"):
        assert not [o for o in intervals if o is not w and _overlaps(w, o)], w
    reads = [i for i in intervals if i[3] == "shared"]
    assert any(
        _overlaps(a, b) for a in reads for b in reads if a is not b and a[2] != b[2]
    )
